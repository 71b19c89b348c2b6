// Connect-back: the listener and the tag line (callback_listener.hpp).
#include "net/callback_listener.hpp"

#include "common/log.hpp"

#include <boost/asio.hpp>

#include <fmt/format.h>

#include <stdexcept>

namespace ddp::net {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {
constexpr std::size_t kMaxTagLine = 128;
constexpr auto kTagTimeout = std::chrono::seconds(10);
}  // namespace

struct CallbackListener::Caller {
  explicit Caller(tcp::socket s) : sock(std::move(s)), timer(sock.get_executor()), buf(kMaxTagLine) {}
  tcp::socket sock;
  asio::steady_timer timer;
  asio::streambuf buf;
  std::string peer;
  std::shared_ptr<void> slot;  // among the callers whose tag has not come yet
};

CallbackListener::CallbackListener(asio::io_context& io, std::uint16_t port) : io_(io), acceptor_(io) {
  boost::system::error_code ec;
  tcp::endpoint ep(asio::ip::address_v6::any(), port);
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::ip::v6_only(false), ec);
  if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    throw std::runtime_error(
        fmt::format("cannot listen on port {} for agents to connect back: {}", port, ec.message()));
  port_ = acceptor_.local_endpoint(ec).port();
  accept();
}

CallbackListener::~CallbackListener() {
  boost::system::error_code ignored;
  if (accept_loop_) accept_loop_->stop();
  acceptor_.close(ignored);
  for (const auto& c : callers_) c->sock.close(ignored);
}

void CallbackListener::expect(const std::string& tag, std::function<void(tcp::socket)> on_connect) {
  std::lock_guard lock(mu_);
  expected_[tag] = std::move(on_connect);
}

bool CallbackListener::forget(const std::string& tag) {
  std::lock_guard lock(mu_);
  return expected_.erase(tag) == 1;
}

// Out of descriptors: back off; callers that have not sent their tag yet are capped
// (acceptor.hpp): the oldest goes.
void CallbackListener::accept() {
  accept_loop_ =
      std::make_unique<Acceptor<tcp>>(acceptor_, "connect-back listener", log::get("coord"), [this](tcp::socket s) {
        auto c = std::make_shared<Caller>(std::move(s));
        boost::system::error_code e2;
        const auto remote = c->sock.remote_endpoint(e2);
        c->peer = e2 ? "?" : fmt::format("{}:{}", remote.address().to_string(), remote.port());
        callers_.insert(c);
        c->slot = accept_loop_->admit([this, w = std::weak_ptr<Caller>(c)] {
          if (auto cl = w.lock())
            drop(cl, "too many callers that have not sent their tag: the oldest is closed", /*quiet=*/true);
        });
        read_tag(c);
      });
  accept_loop_->start();
}

void CallbackListener::read_tag(const std::shared_ptr<Caller>& c) {
  c->timer.expires_after(kTagTimeout);
  c->timer.async_wait([this, c](boost::system::error_code ec) {
    if (!ec) drop(c, "no tag line within 10 s");
  });
  asio::async_read_until(c->sock, c->buf, '\n', [this, c](boost::system::error_code ec, std::size_t n) {
    c->timer.cancel();
    if (!callers_.count(c)) return;
    if (ec) return drop(c, ec == asio::error::not_found ? "tag line too long" : ec.message());
    if (c->buf.size() != n) return drop(c, "bytes after the tag line");
    std::string tag(asio::buffers_begin(c->buf.data()),
                    asio::buffers_begin(c->buf.data()) + static_cast<std::ptrdiff_t>(n) - 1);
    std::function<void(tcp::socket)> on_connect;
    {
      std::lock_guard lock(mu_);
      if (auto it = expected_.find(tag); it != expected_.end()) {
        on_connect = std::move(it->second);
        expected_.erase(it);
      }
    }
    if (!on_connect) return drop(c, "a tag nobody expects");
    callers_.erase(c);
    c->slot.reset();
    on_connect(std::move(c->sock));
  });
}

void CallbackListener::drop(const std::shared_ptr<Caller>& c, const std::string& why, bool quiet) {
  if (!callers_.erase(c)) return;
  c->slot.reset();
  // quiet: the accept loop has warned once for the episode.
  log::get("coord")->log(quiet ? spdlog::level::debug : spdlog::level::warn,
                         "connection from {} to the connect-back port closed: {}", c->peer, why);
  boost::system::error_code ignored;
  c->sock.close(ignored);
}

}  // namespace ddp::net

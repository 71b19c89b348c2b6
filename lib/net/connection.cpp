// The Asio edge of one protocol connection (see connection.hpp).
#include "net/connection.hpp"

#include "common/log.hpp"
#include "common/text.hpp"

#include <fmt/format.h>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/udp.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/write.hpp>

#include <netinet/tcp.h>
#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <string_view>

namespace ddp::net {

namespace asio = boost::asio;

namespace {
// After a drop, how long queued frames (the error that explains it) may take to leave.
constexpr auto kLinger = std::chrono::seconds(2);
// The most of a close's reason that is logged and handed on: a peer's 'error' frame (message
// and hint of 4 KiB each, proto/messages.json) with our words around it fits.
constexpr std::size_t kMaxReasonBytes = 16 * 1024;

std::string describe_read_error(const boost::system::error_code& ec) {
  // A TLS peer that closes without close_notify is, for us, a peer that closed.
  if (ec == asio::error::eof || ec == asio::ssl::error::stream_truncated) return "the peer closed the connection";
  return "connection lost: " + ec.message();
}
}  // namespace

struct Connection::TlsStream {
  TlsStream(stream_socket& socket, asio::ssl::context& ctx) : stream(socket, ctx) {}
  asio::ssl::stream<stream_socket&> stream;
};

std::shared_ptr<Connection> Connection::make(tcp::socket socket, proto::Session session, std::string label,
                                             std::string log_subsystem, Millis handshake_timeout) {
  boost::system::error_code ec;
  std::optional<tcp::endpoint> remote, local;
  if (auto r = socket.remote_endpoint(ec); !ec) remote = r;
  if (auto l = socket.local_endpoint(ec); !ec) local = l;
  socket.set_option(tcp::no_delay(true), ec);
  // The protocol is request and reply: with quick ACKs off, the kernel's ACK of a frame rides on
  // our reply instead of a segment of its own (18.4 segments per node at 4096 nodes instead of
  // 21.4). Linux may turn them back on by itself; no Nagle (no_delay) means nothing waits on them.
  const int zero = 0;
  ::setsockopt(socket.native_handle(), IPPROTO_TCP, TCP_QUICKACK, &zero, sizeof zero);
  // The same descriptor as a generic stream (one read/write path for TCP and socketpairs),
  // moved with its reactor registration: no deregister, re-register and FIONBIO per connection.
  stream_socket generic(std::move(socket));
  auto c = make(std::move(generic), std::move(session), std::move(label), std::move(log_subsystem), handshake_timeout);
  c->remote_ = remote;
  c->local_ = local;
  return c;
}

std::shared_ptr<Connection> Connection::make(stream_socket socket, proto::Session session, std::string label,
                                             std::string log_subsystem, Millis handshake_timeout) {
  return std::shared_ptr<Connection>(new Connection(std::move(socket), std::move(session), std::move(label),
                                                    std::move(log_subsystem), handshake_timeout));
}

Connection::Connection(stream_socket socket, proto::Session session, std::string label, std::string log_subsystem,
                       Millis handshake_timeout)
    : socket_(std::move(socket)),
      session_(std::move(session)),
      label_(std::move(label)),
      log_subsystem_(std::move(log_subsystem)),
      handshake_timeout_(handshake_timeout),
      timer_(socket_.get_executor()) {}

Connection::~Connection() {
  boost::system::error_code ignored;
  socket_.close(ignored);
}

void Connection::start(ConnectionHandlers handlers) {
  handlers_ = std::move(handlers);
  timer_.expires_after(handshake_timeout_);
  timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (ec || self->closing_ || self->closed_ || self->session_.established()) return;
    // Before the protocol's handshake started the session has nothing to say: the peer sent
    // nothing at all, or did not finish TLS's handshake.
    if (!self->started_) {
      return self->closed(self->tls_ ? "no TLS handshake within the deadline"
                                     : "handshake timed out waiting for the peer's first bytes");
    }
    self->apply(self->session_.on_handshake_timeout());
  });
  if (!tls_setup_ || !tls_setup_->context) return begin();
  if (tls_setup_->server) return detect_tls();
  tls_handshake();
}

void Connection::begin() {
  started_ = true;
  read();
  apply(session_.start());
}

void Connection::detect_tls() {
  socket_.async_wait(stream_socket::wait_read, [self = shared_from_this()](boost::system::error_code ec) {
    if (self->closed_ || self->closing_) return;
    if (ec) return self->closed("connection lost during the handshake: " + ec.message());
    unsigned char first = 0;
    const auto n = ::recv(self->socket_.native_handle(), &first, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return self->detect_tls();
    if (n <= 0) return self->closed("the peer closed the connection during the handshake");
    if (looks_like_tls(first)) return self->tls_handshake();
    self->begin();
    // Read the plaintext hello, then say why, so the launcher can tell its user what to do.
    if (self->tls_setup_->mode == TlsMode::required) {
      self->refuse(proto::ErrorCode::auth, "this agent takes only TLS connections (tls: required)",
                   "launch with --tls");
    }
  });
}

void Connection::tls_handshake() {
  tls_ = std::make_unique<TlsStream>(socket_, *tls_setup_->context);
  const auto role = tls_setup_->server ? asio::ssl::stream_base::server : asio::ssl::stream_base::client;
  tls_->stream.async_handshake(role, [self = shared_from_this()](boost::system::error_code ec) {
    if (self->closed_ || self->closing_) return;
    if (ec) {
      // The usual cause: the two ends hold different secrets for the key id (or none at all).
      return self->closed(
          fmt::format("TLS handshake failed: {} (does the agent allow TLS, and do both ends hold the "
                      "same secret for the key id?)",
                      ec.message()));
    }
    self->begin();
  });
}

namespace {
thread_local std::uint64_t t_full_reads = 0;
}  // namespace

std::uint64_t Connection::full_reads_on_this_thread() {
  return t_full_reads;
}

void Connection::read() {
  auto on_read = [self = shared_from_this()](boost::system::error_code ec, std::size_t n) {
    if (self->closed_ || self->closing_) return;
    if (ec) {
      std::string why = describe_read_error(ec);
      if (!self->session_.established()) why += " during the handshake";
      self->closed(why);
      return;
    }
    if (n == self->buf_size_) ++t_full_reads;
    {
      // Uncorked however the handling ends (a handler may throw to the io_context's caller);
      // what it queued leaves then, in one write.
      Cork cork(*self);
      self->apply(self->session_.on_bytes(std::string_view(self->buf_.get(), n)));
    }
    // A full buffer: the peer streams; read more at a time from now on.
    if (n == self->buf_size_ && self->buf_size_ < kReadMax) self->buf_.reset();
    if (!self->closed_ && !self->closing_) self->read();
  };
  if (!buf_) {
    buf_size_ = buf_size_ ? std::min(buf_size_ * 4, kReadMax) : kReadStart;
    buf_.reset(new char[buf_size_]);
  }
  if (tls_) {
    tls_->stream.async_read_some(asio::buffer(buf_.get(), buf_size_), std::move(on_read));
  } else {
    socket_.async_read_some(asio::buffer(buf_.get(), buf_size_), std::move(on_read));
  }
}

void Connection::apply(proto::Effects effects) {
  for (auto& e : effects) {
    if (closed_) return;
    if (auto* s = std::get_if<proto::Send>(&e)) {
      queue(std::move(s->bytes));
    } else if (auto* est = std::get_if<proto::Established>(&e)) {
      timer_.cancel();
      was_established_ = true;
      pending_slot_.reset();
      if (handlers_.on_established && !guarded(std::nullopt, [&] { handlers_.on_established(est->peer); })) return;
    } else if (auto* d = std::get_if<proto::Deliver>(&e)) {
      if (!closing_ && handlers_.on_message) {
        // Its type kept for a failure's words (the handler takes the message): on the stack,
        // not a string per message; a schema type is a short name.
        std::array<char, 64> type{};
        const std::size_t n = std::min(d->message.type.size(), type.size());
        std::copy_n(d->message.type.data(), n, type.data());
        if (!guarded(std::string_view(type.data(), n), [&] { handlers_.on_message(std::move(d->message)); })) return;
      }
    } else if (auto* drop = std::get_if<proto::Drop>(&e)) {
      if (closing_) continue;
      closing_ = true;
      close_reason_ = drop->reason;
      timer_.cancel();
      if (out_.empty() && !writing_) {
        finish_close();
      } else {
        timer_.expires_after(kLinger);
        timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
          if (!ec) self->finish_close();
        });
      }
    }
  }
}

// The exception boundary of every loop that serves peers (agent, coordinator, standing
// coordinator, ddpctl's client): a handler that throws (a bug on this side, memory) ends this
// link only, with an error frame that tells the peer why, instead of unwinding through
// io_context::run() and taking every other peer and job of the process with it.
bool Connection::guarded(std::optional<std::string_view> type, const std::function<void()>& handler) {
  try {
    handler();
    return true;
  } catch (const std::exception& e) {
    const std::string what = type ? fmt::format("its '{}'", *type) : std::string("its authentication");
    log::get(log_subsystem_)
        ->error("{}: handling {} failed: {}; closing this link (other links go on)", label_, what, e.what());
    if (!closed_ && !closing_) refuse(proto::ErrorCode::unexpected, "the receiver failed while handling " + what);
    return false;
  }
}

bool Connection::send(const nlohmann::json& message) {
  if (!established()) return false;
  try {
    queue(session_.seal(message));
  } catch (const std::exception& e) {
    // A message our own schema refuses is a bug on this side; the peer must not pay for it.
    log::get(log_subsystem_)->error("{}: not sent: {}", label_, e.what());
    return false;
  }
  return !overflowed_;  // the frame that did not fit was not queued
}

bool Connection::send_heartbeat(std::int64_t now_us, std::optional<proto::Session::Echo> echo) {
  if (!established()) return false;
  queue(session_.seal_heartbeat(now_us, echo));
  return !overflowed_;
}

bool Connection::send_with(nlohmann::json message, std::string_view key, std::string_view object_json) {
  if (!established()) return false;
  try {
    queue(session_.seal_with(std::move(message), key, object_json));
  } catch (const std::exception& e) {
    log::get(log_subsystem_)->error("{}: not sent: {}", label_, e.what());
    return false;
  }
  return !overflowed_;
}

void Connection::refuse(proto::ErrorCode code, const std::string& message, const std::string& hint) {
  if (closed_ || closing_) return;
  apply(session_.refuse(code, message, hint));
}

void Connection::close(const std::string& reason, bool routine) {
  if (closed_) return;
  routine_close_ = routine;
  // What a handler queued before closing goes out as it would have uncorked (the first write
  // on an idle socket is attempted at once), then the connection closes as before.
  if (corked_ && !writing_ && !out_.empty()) write();
  closed(reason);
}

void Connection::uncork() {
  if (corked_ > 0 && --corked_ == 0 && !writing_ && !closed_ && !out_.empty()) write();
}

void Connection::queue(std::string frame) {
  if (closed_ || overflowed_) return;
  if (queued_bytes_ + frame.size() > max_queued_bytes_) {
    // Not from here: queue() runs inside an owner's send(), which may be walking its own
    // connections; the close (and the owner's on_closed) comes from the loop, after it.
    // A drop already under way (its error frame is what did not fit) keeps its own reason.
    if (!closing_) {
      close_reason_ = fmt::format("it does not read what we send: {} bytes queued for it, and the limit is {}",
                                  queued_bytes_, max_queued_bytes_);
    }
    overflowed_ = closing_ = true;
    asio::post(socket_.get_executor(), [self = shared_from_this()] {
      if (self->closed_) return;
      self->warn_close_ = true;
      self->closed(self->close_reason_);
    });
    return;
  }
  queued_bytes_ += frame.size();
  out_.push_back(std::move(frame));
  // At once when the socket is idle: a peer on another core starts on it while we build the
  // next (4096 assignments in one handler pipeline this way). Frames queued behind a write in
  // flight, or while this connection's own bytes are handled (corked_), leave together.
  if (!writing_ && !corked_) write();
}

void Connection::write() {
  if (out_.empty() || closed_) {
    writing_ = false;
    if (closing_ && !closed_) finish_close();
    return;
  }
  writing_ = true;
  gather_.clear();
  for (const auto& f : out_) {
    if (gather_.size() == kMaxGather) break;
    gather_.emplace_back(f.data(), f.size());
  }
  auto on_written = [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
    if (self->closed_) return;
    for (std::size_t i = 0; i < self->gather_.size(); ++i) {
      self->queued_bytes_ -= self->out_.front().size();
      self->out_.pop_front();
    }
    if (ec) {
      self->writing_ = false;
      self->closed(self->closing_ ? self->close_reason_ : "connection lost while writing: " + ec.message());
      return;
    }
    self->write();
  };
  if (tls_) {
    asio::async_write(tls_->stream, gather_, std::move(on_written));  // a TLS record per frame
  } else {
    asio::async_write(socket_, gather_, std::move(on_written));
  }
}

void Connection::finish_close() {
  if (closed_) return;
  closed(close_reason_);
}

void Connection::closed(const std::string& raw_reason) {
  // A reason may carry a peer's words (its 'error' frame, a schema error quoting its message),
  // and goes to our log and to the owner, which may print it on a user's terminal. The session
  // cleans what it quotes; this is the last line, whatever built the reason.
  const auto reason = clean_text(raw_reason, kMaxReasonBytes);
  closed_ = true;
  closing_ = true;
  timer_.cancel();
  boost::system::error_code ignored;
  socket_.shutdown(stream_socket::shutdown_both, ignored);
  socket_.close(ignored);
  out_.clear();
  queued_bytes_ = 0;
  pending_slot_.reset();
  // A peer that never authenticated is worth a warning (a wrong token, a scanner, a stray);
  // except a failed authentication on the dialling side, whose owner (the coordinator, doctor,
  // a ctl client) stops and says so in its own words: the same reason twice helps nobody.
  const bool owner_reports =
      session_.is_client() && (reason.starts_with("auth: ") || reason.starts_with("peer refused: auth: "));
  const auto level = warn_close_                       ? spdlog::level::warn
                     : owner_reports || routine_close_ ? spdlog::level::debug
                     : !was_established_               ? spdlog::level::warn
                                                       : spdlog::level::info;
  log::get(log_subsystem_)->log(level, "{}: connection closed: {}", label_, reason);
  if (auto cb = std::move(handlers_.on_closed)) {
    handlers_ = {};
    cb(reason);
  } else {
    handlers_ = {};
  }
}

void dial(asio::io_context& io, const std::string& host, std::uint16_t port, Millis timeout,
          std::function<void(boost::system::error_code, tcp::socket)> done) {
  struct State {
    explicit State(asio::io_context& io) : resolver(io), socket(io), timer(io) {}
    tcp::resolver resolver;
    tcp::socket socket;
    asio::steady_timer timer;
    bool timed_out = false;
    std::function<void(boost::system::error_code, tcp::socket)> done;
  };
  auto st = std::make_shared<State>(io);
  st->done = std::move(done);
  st->timer.expires_after(timeout);
  st->timer.async_wait([st](boost::system::error_code ec) {
    if (ec) return;
    st->timed_out = true;
    st->resolver.cancel();
    boost::system::error_code ignored;
    st->socket.close(ignored);
  });
  // An address needs no resolver: Asio's runs getaddrinfo on one thread, one call after another,
  // and with AI_ADDRCONFIG each call asks the kernel for the host's addresses (about 2 ms here),
  // which serialised thousands of dials into seconds.
  boost::system::error_code literal;
  const auto addr = asio::ip::make_address(host, literal);
  if (!literal) {
    st->socket.async_connect(tcp::endpoint(addr, port), [st](boost::system::error_code ec) {
      st->timer.cancel();
      if (st->timed_out) ec = asio::error::timed_out;
      st->done(ec, std::move(st->socket));
    });
    return;
  }
  const auto flags = tcp::resolver::numeric_service;  // and no AI_ADDRCONFIG, for the same reason
  st->resolver.async_resolve(
      host, std::to_string(port), flags, [st](boost::system::error_code ec, tcp::resolver::results_type r) {
        if (ec) {
          st->timer.cancel();
          return st->done(st->timed_out ? asio::error::timed_out : ec, tcp::socket(st->socket.get_executor()));
        }
        asio::async_connect(st->socket, r, [st](boost::system::error_code ec, const tcp::endpoint&) {
          st->timer.cancel();
          if (st->timed_out) ec = asio::error::timed_out;
          st->done(ec, std::move(st->socket));
        });
      });
}

std::string local_user() {
  const uid_t uid = ::geteuid();
  struct passwd pw {};
  struct passwd* res = nullptr;
  char buf[4096];
  if (::getpwuid_r(uid, &pw, buf, sizeof buf, &res) == 0 && res && res->pw_name) return res->pw_name;
  return fmt::format("uid {}", uid);
}

std::string route_source(const std::string& address) {
  boost::system::error_code ec;
  const auto addr = asio::ip::make_address(address, ec);
  if (ec) return {};
  asio::io_context io;
  asio::ip::udp::socket s(io);
  s.open(addr.is_v6() ? asio::ip::udp::v6() : asio::ip::udp::v4(), ec);
  if (!ec) s.connect({addr, 9}, ec);
  if (ec) return {};
  auto local = s.local_endpoint(ec).address();
  if (ec) return {};
  if (local.is_v6() && local.to_v6().is_v4_mapped())
    local = asio::ip::make_address_v4(asio::ip::v4_mapped, local.to_v6());
  return local.to_string();
}

}  // namespace ddp::net

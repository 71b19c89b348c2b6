// The store's Asio edge: accept, allow-list, read -> decode -> apply -> write, close bad clients.
// See server.hpp for the policy.
#include "store/server.hpp"

#include "common/log.hpp"
#include "store/state.hpp"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/steady_timer.hpp>

#include <fmt/format.h>
#include <sys/socket.h>

#include <algorithm>
#include <unordered_map>

namespace ddp::store {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;

namespace {

constexpr std::size_t kReadChunk = 256 * 1024;
constexpr std::size_t kPauseReadingAt = 4 * 1024 * 1024;  // queued output that stops our reads
constexpr int kBacklog = std::max(SOMAXCONN, 4096);
constexpr int kMaxReadsPerWakeup = 16;  // fairness between busy connections

}  // namespace

struct Connection;

struct Server::Impl : std::enable_shared_from_this<Server::Impl> {
  Impl(asio::io_context& io, ServerOptions o)
      : io(io), opts(std::move(o)), acceptor(io), accept_retry(io), read_buf(kReadChunk),
        log(ddp::log::get("store")) {}

  void do_accept();
  void on_accept(tcp::socket sock);
  void close_all();
  std::string describe(ClientId id) const;

  asio::io_context& io;
  ServerOptions opts;
  std::vector<asio::ip::address> allowed;
  tcp::acceptor acceptor;
  asio::steady_timer accept_retry;
  State state;
  Effects fx;
  Request req;
  std::unordered_map<ClientId, std::shared_ptr<Connection>> conns;
  ClientId next_id = 1;
  std::vector<uint8_t> read_buf;
  RankResolver resolver;
  ServerStats stats;
  bool running = false;
  uint16_t bound_port = 0;
  std::string bound_host;
  std::shared_ptr<spdlog::logger> log;
};

struct Connection : std::enable_shared_from_this<Connection> {
  Connection(std::shared_ptr<Server::Impl> srv, tcp::socket s, ClientId id)
      : srv(std::move(srv)), sock(std::move(s)), id(id), dec(this->srv->opts.limits) {}

  std::size_t queued() const { return out.size() - out_off; }
  std::string name() const;
  void arm_read();
  void arm_write();
  void on_readable();
  void feed(std::span<const uint8_t> in);
  void handle(Server::Impl& s);
  bool append(std::string_view bytes);
  void flush();
  void close(const std::string& reason, bool bad);
  void close_quietly();

  std::shared_ptr<Server::Impl> srv;
  tcp::socket sock;
  ClientId id;
  tcp::endpoint peer, local;
  std::string peer_text;
  Decoder dec;
  std::string out;
  std::size_t out_off = 0;
  bool reading = false, writing = false, paused = false, closed = false;
  std::optional<int> proc_pid;  // found through /proc (loopback 1.13 clients)
  uint64_t requests = 0;
};

std::string Connection::name() const {
  std::string s = fmt::format("client {} ({}", id, peer_text);
  if (auto pid = srv->state.client_pid(id)) {
    s += fmt::format(", pid {}", *pid);
  } else if (proc_pid) {
    s += fmt::format(", pid {}", *proc_pid);
  }
  if (dec.protocol() != Protocol::unknown) s += fmt::format(", PyTorch {}", to_string(dec.protocol()));
  return s + ")";
}

void Connection::arm_read() {
  if (closed || reading) return;
  reading = true;
  sock.async_wait(tcp::socket::wait_read, [self = shared_from_this()](const error_code& ec) {
    self->reading = false;
    if (self->closed) return;
    if (ec) {
      if (ec != asio::error::operation_aborted) self->close("read wait failed: " + ec.message(), false);
      return;
    }
    self->on_readable();
  });
}

void Connection::on_readable() {
  auto keep = shared_from_this();
  auto& buf = srv->read_buf;
  for (int i = 0; i < kMaxReadsPerWakeup; ++i) {
    error_code ec;
    std::size_t n = sock.read_some(asio::buffer(buf), ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) break;
    if (ec) {
      if (ec == asio::error::eof || ec == asio::error::connection_reset) {
        close("disconnected", false);
      } else {
        close("read failed: " + ec.message(), false);
      }
      return;
    }
    feed(std::span<const uint8_t>(buf.data(), n));
    if (closed) return;
    if (n < buf.size()) break;
  }
  flush();
  if (closed) return;
  if (queued() > kPauseReadingAt) {
    paused = true;  // resumed by flush() once the client has read its replies
  } else {
    arm_read();
  }
}

void Connection::feed(std::span<const uint8_t> in) {
  Server::Impl& s = *srv;
  while (!closed) {
    std::size_t cap = s.opts.limits.max_connection_bytes;
    dec.set_budget(queued() < cap ? cap - queued() : 0);
    switch (dec.next(in, s.req)) {
      case Decoder::Status::need_more: return;
      case Decoder::Status::error: close(dec.error(), true); return;
      case Decoder::Status::request: handle(s); break;
    }
  }
}

void Connection::handle(Server::Impl& s) {
  ++requests;
  ++s.stats.requests;
  s.fx.clear();
  const bool was_waiting = s.state.is_waiting(id);
  try {
    s.state.apply(id, s.req, Clock::now(), s.fx);
  } catch (const std::exception& e) {
    close(fmt::format("failed to serve its {}: {}", to_string(s.req.op), e.what()), true);
    return;
  }
  if (s.fx.gave_up_wait && was_waiting) {
    s.log->debug("{} gave up its wait (client-side timeout) and sent {}", name(), to_string(s.req.op));
  }
  if (!s.fx.reply.empty() && !append(s.fx.reply)) return;
  for (auto& [to, bytes] : s.fx.pushes) {
    auto it = s.conns.find(to);
    if (it == s.conns.end()) continue;
    std::shared_ptr<Connection> other = it->second;
    if (other.get() == this) {
      if (!append(bytes)) return;
      continue;
    }
    if (other->append(bytes)) other->flush();
  }
  if (!s.fx.close_reason.empty()) close(s.fx.close_reason, true);
}

bool Connection::append(std::string_view bytes) {
  if (closed) return false;
  const std::size_t cap = srv->opts.limits.max_connection_bytes;
  if (queued() + bytes.size() + dec.pending_bytes() > cap) {
    close(fmt::format("it is not reading its replies ({} bytes queued, cap {})", queued() + bytes.size(), cap), true);
    return false;
  }
  out.append(bytes);
  return true;
}

void Connection::flush() {
  if (closed || writing) return;
  while (out_off < out.size()) {
    error_code ec;
    std::size_t n = sock.write_some(asio::buffer(out.data() + out_off, out.size() - out_off), ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) {
      if (out_off > out.size() / 2) {
        out.erase(0, out_off);
        out_off = 0;
      }
      arm_write();
      return;
    }
    if (ec) {
      close("write failed: " + ec.message(), false);
      return;
    }
    out_off += n;
  }
  out.clear();
  out_off = 0;
  if (out.capacity() > kReadChunk) out.shrink_to_fit();
  if (paused) {
    paused = false;
    arm_read();
  }
}

void Connection::arm_write() {
  if (closed || writing) return;
  writing = true;
  sock.async_wait(tcp::socket::wait_write, [self = shared_from_this()](const error_code& ec) {
    self->writing = false;
    if (self->closed) return;
    if (ec) {
      if (ec != asio::error::operation_aborted) self->close("write wait failed: " + ec.message(), false);
      return;
    }
    self->flush();
  });
}

void Connection::close_quietly() {
  if (closed) return;
  closed = true;
  error_code ec;
  sock.close(ec);
}

void Connection::close(const std::string& reason, bool bad) {
  if (closed) return;
  auto keep = shared_from_this();
  Server::Impl& s = *srv;
  const bool was_waiting = s.state.is_waiting(id);
  if (bad) {
    ++s.stats.closed_bad;
    s.log->warn("closing {}: {}", name(), reason);
  } else if (was_waiting) {
    s.log->debug("{} went away while waiting ({})", name(), reason);
  } else {
    s.log->debug("{} closed after {} requests: {}", name(), requests, reason);
  }
  close_quietly();
  s.state.disconnect(id);
  s.conns.erase(id);
}

// ---------------------------------------------------------------------------------------------

void Server::Impl::do_accept() {
  acceptor.async_accept([self = shared_from_this()](const error_code& ec, tcp::socket sock) {
    if (!self->running || ec == asio::error::operation_aborted) return;
    if (ec) {
      // Out of descriptors: the connection stays in the backlog; try again shortly rather than
      // spin on a listener that stays readable.
      self->log->warn("store accept failed: {} ({} connections open)", ec.message(), self->conns.size());
      self->accept_retry.expires_after(std::chrono::milliseconds(100));
      self->accept_retry.async_wait([self](const error_code& e) {
        if (!e && self->running) self->do_accept();
      });
      return;
    }
    self->on_accept(std::move(sock));
    self->do_accept();
  });
}

void Server::Impl::on_accept(tcp::socket sock) {
  error_code ec;
  tcp::endpoint peer = sock.remote_endpoint(ec);
  if (ec) return;  // already gone
  tcp::endpoint local = sock.local_endpoint(ec);
  if (!peer_allowed(peer.address(), allowed)) {
    ++stats.refused;
    std::string list = "loopback";
    for (const auto& a : allowed) list += ", " + a.to_string();
    log->warn("refused a store connection from {}: not one of this job's nodes (allowed: {})",
              format_endpoint(peer), list);
    sock.close(ec);
    return;
  }
  sock.set_option(tcp::no_delay(true), ec);
  sock.non_blocking(true, ec);
  if (ec) {
    log->warn("cannot serve {}: {}", format_endpoint(peer), ec.message());
    return;
  }
  ClientId id = next_id++;
  auto conn = std::make_shared<Connection>(shared_from_this(), std::move(sock), id);
  conn->peer = peer;
  conn->local = local;
  conn->peer_text = format_endpoint(peer);
  conns.emplace(id, conn);
  ++stats.accepted;
  log->debug("client {} connected from {}", id, conn->peer_text);
  conn->arm_read();
}

void Server::Impl::close_all() {
  auto all = std::move(conns);
  conns.clear();
  for (auto& [id, c] : all) c->close_quietly();
}

// ---------------------------------------------------------------------------------------------

Server::Server(asio::io_context& io, ServerOptions options) : impl_(std::make_shared<Impl>(io, std::move(options))) {
  set_allowed_peers(impl_->opts.allowed_peers);
}

Server::~Server() { stop(); }

void Server::set_allowed_peers(const std::vector<std::string>& peers) {
  std::vector<asio::ip::address> parsed;
  for (const auto& p : peers) {
    error_code ec;
    auto a = asio::ip::make_address(p, ec);
    if (ec) throw StoreError(fmt::format("store allow-list: `{}` is not an IP address", p));
    parsed.push_back(normalize(a));
  }
  impl_->allowed = std::move(parsed);
  impl_->opts.allowed_peers = peers;
}

void Server::set_rank_resolver(RankResolver resolver) { impl_->resolver = std::move(resolver); }

void Server::start() {
  Impl& s = *impl_;
  if (s.running) throw StoreError("store server already started");
  const std::string& host = s.opts.host;
  error_code ec;
  asio::ip::address addr = asio::ip::make_address(host, ec);
  if (ec) {
    tcp::resolver resolver(s.io);
    auto results = resolver.resolve(host, std::to_string(s.opts.port), ec);
    if (ec || results.empty()) {
      throw StoreError(fmt::format("store host `{}` does not resolve: {}", host, ec ? ec.message() : "no address"));
    }
    addr = results.begin()->endpoint().address();
  }
  tcp::endpoint ep(addr, s.opts.port);
  auto fail = [&](const char* what) {
    error_code ignored;
    s.acceptor.close(ignored);
    if (ec == asio::error::address_in_use) {
      throw StoreError(fmt::format(
          "store port {} on {} is already in use (another job or torchrun?); choose store.port or --master-port",
          s.opts.port, host));
    }
    throw StoreError(fmt::format("store cannot {} {}:{}: {}", what, host, s.opts.port, ec.message()));
  };
  s.acceptor.open(ep.protocol(), ec);
  if (ec) fail("open a socket for");
  s.acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (addr.is_v6() && addr.to_v6().is_unspecified()) {
    s.acceptor.set_option(asio::ip::v6_only(false), ec);  // "::" serves IPv4 clients too
  }
  s.acceptor.bind(ep, ec);
  if (ec) fail("bind");
  s.acceptor.listen(kBacklog, ec);
  if (ec) fail("listen on");
  s.bound_port = s.acceptor.local_endpoint(ec).port();
  s.bound_host = addr.is_v6() ? fmt::format("[{}]", addr.to_string()) : addr.to_string();
  s.running = true;
  s.do_accept();
  s.log->debug("store listening on {} (PyTorch 1.13 and 2.x clients)", address());
}

uint16_t Server::port() const { return impl_->bound_port; }

std::string Server::address() const { return impl_->bound_host + ":" + std::to_string(impl_->bound_port); }

void Server::reset() {
  Impl& s = *impl_;
  const std::size_t keys = s.state.num_keys(), clients = s.conns.size();
  s.close_all();
  s.state.reset();
  s.log->debug("store reset for a new attempt: dropped {} keys and {} connections", keys, clients);
}

void Server::stop() {
  Impl& s = *impl_;
  if (!s.running && s.conns.empty()) return;
  s.running = false;
  error_code ec;
  s.acceptor.close(ec);
  s.accept_retry.cancel();
  s.close_all();
  s.state.reset();
}

ServerStats Server::stats() const {
  ServerStats st = impl_->stats;
  st.connections = impl_->conns.size();
  return st;
}

WaitReport Server::waiters() const {
  Impl& s = *impl_;
  WaitReport report;
  report.connections = s.conns.size();
  report.keys = s.state.num_keys();
  auto waited = s.state.waiters();
  if (waited.empty()) return report;

  // Clients on this host (loopback, or our own address: node rank 0's workers reach its agent's
  // store at MASTER_ADDR) that sent no PING: find their pids through /proc, once per connection.
  std::vector<std::shared_ptr<Connection>> unknown;
  for (const auto& kw : waited) {
    for (const auto& [id, since] : kw.clients) {
      auto it = s.conns.find(id);
      if (it == s.conns.end()) continue;
      auto& c = it->second;
      const bool same_host = is_loopback(c->peer.address()) || normalize(c->peer.address()) == normalize(c->local.address());
      if (!s.state.client_pid(id) && !c->proc_pid && same_host &&
          std::find(unknown.begin(), unknown.end(), c) == unknown.end()) {
        unknown.push_back(c);
      }
    }
  }
  if (!unknown.empty() && s.resolver.candidate_pids) {
    std::vector<pid_t> candidates = s.resolver.candidate_pids();
    std::vector<std::pair<tcp::endpoint, tcp::endpoint>> pairs;
    for (const auto& c : unknown) pairs.emplace_back(c->peer, c->local);
    auto found = pids_owning_connections(pairs, candidates);
    for (std::size_t i = 0; i < unknown.size(); ++i) {
      if (found[i].empty()) continue;
      pid_t chosen = found[i].front();  // lowest pid: usually the parent of any fork()ed holder
      if (s.resolver.rank_of_pid) {
        for (pid_t p : found[i]) {
          if (s.resolver.rank_of_pid(p)) {
            chosen = p;
            break;
          }
        }
      }
      unknown[i]->proc_pid = chosen;
    }
  }

  for (auto& kw : waited) {
    WaitedKey wk;
    wk.key = std::move(kw.key);
    wk.barrier = kw.barrier;
    wk.deleted = kw.deleted;
    for (const auto& [id, since] : kw.clients) {
      WaitingClient w;
      w.connection = id;
      w.since = since;
      auto it = s.conns.find(id);
      if (it != s.conns.end()) {
        w.peer = it->second->peer_text;
        if (auto pid = s.state.client_pid(id)) {
          w.pid = static_cast<int>(*pid);
        } else {
          w.pid = it->second->proc_pid;
        }
      }
      if (w.pid && s.resolver.rank_of_pid) w.rank = s.resolver.rank_of_pid(*w.pid);
      wk.waiters.push_back(std::move(w));
    }
    report.waited.push_back(std::move(wk));
  }
  return report;
}

}  // namespace ddp::store

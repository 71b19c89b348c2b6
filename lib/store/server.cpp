// The store's I/O edge: accept (Asio, on the caller's io_context), allow-list, then read ->
// decode -> apply -> write on the loops' reactors (reactor.hpp), close bad clients. See
// server.hpp for the policy.
#include "store/server.hpp"

#include "common/adaptive_mutex.hpp"
#include "common/host.hpp"
#include "common/log.hpp"
#include "store/access.hpp"
#include "store/reactor.hpp"
#include "store/state.hpp"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <fmt/format.h>
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <unordered_set>

namespace ddp::store {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;

namespace {

constexpr std::size_t kReadChunk = 256 * 1024;
constexpr std::size_t kPauseReadingAt = 4 * 1024 * 1024;  // queued output that stops our reads
constexpr int kBacklog = std::max(SOMAXCONN, 4096);
constexpr int kMaxReadsPerWakeup = 16;  // fairness between busy connections
// A requester's own replies queued and not yet counted in the store's in-flight total while its
// thread reads it (see Connection::handle): small enough not to matter to the bound, large
// enough for any reply to a key or a number.
constexpr std::size_t kUncountedReplies = 64 * 1024;
// Connections taken off the kernel's accept queue in one wakeup before any is looked at: as
// large as the queue (somaxconn, 4096 by default), so a storm's queue is emptied at the speed of
// accept4() alone and the per-connection work (the owner lookup, registration) runs after it;
// one at a time, 4096 clients' 8192 connections overflowed it (SYNs dropped, retried 1 s later).
constexpr int kAcceptBatch = 4096;

}  // namespace

// The CPUs this process may use (a container's cpuset, taskset), not the machine's.
unsigned auto_threads() {
  return std::clamp(static_cast<unsigned>(std::max(ddp::usable_cpus(), 1)) / 4, 1u, 8u);
}

struct Connection;

// One thread's share of the connections: a reactor run by a thread of the server's own, or
// (threads == 0) one nested in the caller's io_context, polled when its descriptor is readable.
// Its read buffer and the effects of the request being served are used only on its thread.
struct Loop {
  // Whether the calling thread may touch this loop's connections: its own thread, or any once
  // that thread has been joined; a nested loop is the caller's, whose thread makes every call.
  bool here() const { return !owned || joined || std::this_thread::get_id() == thread_id; }

  Reactor reactor;
  std::thread thread;  // none when nested
  bool owned = false;  // has a thread; set with thread_id before any connection enters
  std::thread::id thread_id;
  std::atomic<bool> joined{false};
  std::optional<asio::posix::stream_descriptor> nest;  // the reactor's epoll fd, on the caller's io_context
  // Not zeroed: a fresh 256 KiB is its own mapping, whose pages the kernel supplies only as
  // reads fill them (zeroing it cost every launch 64 page faults, bench/launch).
  std::unique_ptr<uint8_t[]> read_buf{new uint8_t[kReadChunk]};
  Effects fx;  // what the request being served produced (filled under the keyspace's lock)
};

struct Server::Impl : std::enable_shared_from_this<Server::Impl> {
  Impl(asio::io_context& io, ServerOptions o)
      : io(io),
        opts(std::move(o)),
        job_uid(opts.job_uid.value_or(::geteuid())),
        acceptor(io),
        accept_retry(io),
        log(ddp::log::get("store")),
        state(opts.limits, opts.totals),
        max_connections(connection_cap(opts.totals.max_connections)) {}

  // Totals::max_connections, within half of this process's descriptors: the rest are the
  // workers' pipes and log files (an agent started over SSH keeps the login's soft limit).
  static std::size_t connection_cap(std::size_t configured) {
    rlimit rl{};
    if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return configured;
    return std::min<std::size_t>(configured, std::max<std::size_t>(16, rl.rlim_cur / 2));
  }
  // This host's addresses, read at most once a second (getifaddrs is a netlink dump: not one
  // per connection of a storm, or of a refused host's flood). The accepting thread's.
  const std::vector<asio::ip::address>& host_addrs_now();
  // A refused connection's warning: at most one a second per source address, the others
  // counted into the next one from that address.
  void warn_refused(const asio::ip::address& from, const std::string& text);

  // Waits for a new connection. epoll wakes the wait on an arrival, not for a backlog already
  // queued: it is entered only once accept_now() has seen the queue empty.
  void do_accept();
  // Drains the queue now; then waits (queue empty), drains again (a full batch: more may be
  // queued), or retries after a pause (out of descriptors).
  void accept_now();
  enum class Drained { empty, more, failed };
  // Takes up to kAcceptBatch connections off the accept queue.
  Drained drain_accept_queue();
  void on_accept(Loop& target, int fd, const tcp::endpoint& peer);
  // Drops every connection: they leave the map and the state now; their sockets close on
  // their own threads. Under no lock.
  void drop_all();
  void start_threads();
  // Polls a nested loop (threads == 0) whenever its reactor has something.
  void watch_nested(Loop& loop);
  void join_threads();
  // Under mu: while the in-flight total is over its bound, closes the connection that holds the
  // most. Rare (an attack or a store far past what a job needs), so it may scan every connection.
  void shed_locked();

  asio::io_context& io;
  ServerOptions opts;
  uid_t job_uid;
  std::vector<asio::ip::address> allowed;  // caller's thread only
  tcp::acceptor acceptor;
  asio::steady_timer accept_retry;
  std::optional<tcp::endpoint> listen_local;  // the listener's address when not a wildcard
  SockDiag diag;                              // the accepting thread's, for every lookup
  std::vector<asio::ip::address> host_addrs;  // the accepting thread's (host_addrs_now)
  std::chrono::steady_clock::time_point host_addrs_read{};
  struct Refusals {
    std::chrono::steady_clock::time_point warned{};
    std::size_t unwarned = 0;
  };
  std::unordered_map<std::string, Refusals> refused;    // the accepting thread's (warn_refused); bounded
  std::vector<std::pair<int, tcp::endpoint>> accepted;  // one drain's, reused
  std::vector<std::unique_ptr<Loop>> loops;
  std::size_t next_loop = 0;
  RankResolver resolver;
  bool running = false;
  uint16_t bound_port = 0;
  std::string bound_host;
  std::shared_ptr<spdlog::logger> log;

  // Guards what follows, and each Connection's `closed` transitions and `proc_pid`. Taken once
  // per request by every I/O thread, held briefly: a thread that finds it taken spins a little
  // before it sleeps (common/adaptive_mutex.hpp).
  mutable AdaptiveMutex mu;
  State state;
  std::size_t max_connections;
  std::unordered_map<ClientId, std::shared_ptr<Connection>> conns;
  ClientId next_id = 1;
  ServerStats stats;

  // Bytes in flight over all connections: each connection's `counted`, summed. Changed under
  // that connection's out_mu (never under a store-wide lock), read anywhere.
  std::atomic<std::size_t> inflight{0};
};

struct Connection final : Reactor::Handler, std::enable_shared_from_this<Connection> {
  Connection(std::shared_ptr<Server::Impl> srv, Loop& loop, int fd, ClientId id)
      : srv(std::move(srv)), loop(loop), fd(fd), id(id), dec(this->srv->opts.limits, this->srv->opts.legacy) {}
  ~Connection() {
    if (fd >= 0) ::close(fd);  // never registered (closing removes it from any epoll set)
  }

  std::size_t queued() const { return out.size() - out_off; }  // under out_mu
  // Under out_mu, after `out` or `out_off` changed: publishes queued() for reading anywhere.
  void queued_changed_locked() { queued_now.store(queued(), std::memory_order_relaxed); }
  // Under out_mu: brings this connection's share of the store's in-flight total to held_in +
  // queued(). True when it grew and the total is now over Totals::max_inflight_bytes.
  bool recount_locked();
  // Under out_mu, once closed: gives back its share and frees its queued replies.
  void release_locked();
  std::string name_locked() const;  // under srv->mu
  // On loop's thread: joins its reactor (the first events come at once: writable, and readable
  // when the client has already sent).
  void enter_loop();
  void on_events(uint32_t events) noexcept override;
  // Reads while the kernel has bytes (up to kMaxReadsPerWakeup reads, then it comes back by a
  // post), serves what they complete, writes the replies.
  void read_now();
  // Runs fn, one of this connection's steps on its loop; an exception (std::bad_alloc) closes
  // this connection only: nothing escapes into the loop, which serves the others.
  template <class F>
  void guarded(F&& fn) noexcept;
  // Posts read_now() to loop, once until it has run.
  void post_read();
  void feed(std::span<const uint8_t> in);
  void handle(Server::Impl& s);
  // Under srv->mu: queues a reply. `count` false (the requester's own, see handle()): counted in
  // the store's in-flight total only once more than kUncountedReplies of them are queued, or
  // when flush() cannot send them all.
  bool append_locked(std::string_view bytes, bool count = true);
  // Writes what is queued, on loop's thread. `locked_look`: look at the queue under out_mu even
  // when queued_now says it is empty (a flush posted by another thread, see flush_from()).
  void flush(bool locked_look = false);
  void flush_from(const Loop& from);
  void close(const std::string& reason, bool bad);
  // Under srv->mu. `quiet`: logged at debug only (the caller logs a line for many at once).
  void close_locked(const std::string& reason, bool bad, bool quiet = false);
  // Under srv->mu: closes the watchers the request's change dropped (Effects::dropped_watchers),
  // with one warning for them all.
  void close_dropped_watchers_locked(const Effects& fx);
  void close_socket();  // on any thread

  std::shared_ptr<Server::Impl> srv;
  Loop& loop;
  int fd;  // non-blocking; read, written and closed on loop's thread only
  ClientId id;
  tcp::endpoint peer, local;
  std::string peer_text;
  Decoder dec;  // loop's thread only
  std::atomic<Protocol> protocol{Protocol::unknown};
  std::atomic<bool> closed{false};  // set under srv->mu
  std::atomic<bool> flush_posted{false};
  // loop's thread only:
  bool registered = false;            // in loop.reactor
  bool readable = false;              // an edge came and recv() has not yet come up short or empty
  bool read_posted = false;           // a read_now() is posted
  bool peer_done = false;             // its end of input or an error is queued: read to it, short reads too
  bool ended = false;                 // its input ended: closed once its replies are written
  bool writing = false;               // a send() came up short: EPOLLOUT resumes it
  bool paused = false;                // reads stopped until the queued replies drain
  std::atomic<uint64_t> requests{0};  // written on loop's thread only
  std::optional<int> proc_pid;        // under srv->mu: found through /proc (loopback 1.13 clients)

  std::mutex out_mu;  // guards what follows (other threads queue replies to this client)
  std::string out;
  std::size_t out_off = 0;
  std::size_t held_in = 0;  // dec.pending_bytes() as last seen on loop's thread (which reads it unlocked)
  std::atomic<std::size_t> queued_now{0};  // queued(), written under out_mu, read anywhere
  bool released = false;                   // closed and no longer counted
  std::atomic<std::size_t> counted{0};     // this connection's share of srv->inflight (written under out_mu)
};

bool Connection::recount_locked() {
  if (released) return false;
  const std::size_t now = held_in + queued();
  const std::size_t before = counted.load(std::memory_order_relaxed);
  if (now == before) return false;
  counted.store(now, std::memory_order_relaxed);
  if (now < before) {
    srv->inflight.fetch_sub(before - now, std::memory_order_relaxed);
    return false;
  }
  const std::size_t total = srv->inflight.fetch_add(now - before, std::memory_order_relaxed) + (now - before);
  return total > srv->opts.totals.max_inflight_bytes;
}

void Connection::release_locked() {
  if (released) return;
  released = true;
  srv->inflight.fetch_sub(counted.exchange(0, std::memory_order_relaxed), std::memory_order_relaxed);
  std::string().swap(out);  // its thread writes no more: `closed` is set
  out_off = 0;
  queued_changed_locked();
}

std::string Connection::name_locked() const {
  std::string s = fmt::format("client {} ({}", id, peer_text);
  if (auto pid = srv->state.client_pid(id)) {
    s += fmt::format(", pid {}", *pid);
  } else if (proc_pid) {
    s += fmt::format(", pid {}", *proc_pid);
  }
  if (const Protocol p = protocol.load(std::memory_order_relaxed); p != Protocol::unknown) {
    s += fmt::format(", PyTorch {}", to_string(p));
  }
  return s + ")";
}

template <class F>
void Connection::guarded(F&& fn) noexcept {
  auto keep = shared_from_this();
  if (closed) return;
  try {
    fn();
  } catch (const std::exception& e) {  // std::bad_alloc
    try {
      close(fmt::format("failed while serving it: {}", e.what()), true);
    } catch (...) {  // out of memory for the message too: close it all the same
      std::lock_guard lk(srv->mu);
      close_locked("failed while serving it", true);
    }
  }
}

void Connection::post_read() {
  if (std::exchange(read_posted, true)) return;
  loop.reactor.post([self = shared_from_this()] {
    self->read_posted = false;
    self->guarded([&] { self->read_now(); });
  });
}

void Connection::enter_loop() {
  guarded([&] {
    if (registered) return;
    try {
      loop.reactor.add(fd, *this);
      registered = true;
    } catch (const std::system_error& e) {  // ENOMEM, or the user's epoll watch limit
      close(fmt::format("cannot serve it: {}", e.what()), false);
    }
  });
}

void Connection::on_events(uint32_t events) noexcept {
  guarded([&] {
    // Urgent data (MSG_OOB): no PyTorch client sends it, and recv() stops short at its mark with
    // more queued behind it, which an edge-triggered reader would never be woken for.
    if (events & EPOLLPRI) return close("it sent TCP urgent (out-of-band) data", true);
    if (events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) {
      if (std::exchange(writing, false)) flush();
      if (closed) return;
    }
    if (events & (EPOLLIN | EPOLLRDHUP | EPOLLERR | EPOLLHUP)) {
      // A FIN queued behind the data raises no edge of its own after it: this event is its edge,
      // and a read that comes up short before it does not mean there is nothing left.
      if (events & (EPOLLRDHUP | EPOLLERR | EPOLLHUP)) peer_done = true;
      readable = true;
      read_now();
    }
  });
}

void Connection::read_now() {
  auto keep = shared_from_this();
  if (closed || paused) return;  // flush() resumes
  auto& buf = loop.read_buf;
  for (int i = 0; i < kMaxReadsPerWakeup && readable; ++i) {
    const ssize_t n = ::recv(fd, buf.get(), kReadChunk, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        readable = false;
        break;
      }
      if (errno == ECONNRESET) {
        close("disconnected", false);
      } else {
        close(fmt::format("read failed: {}", std::strerror(errno)), false);
      }
      return;
    }
    if (n == 0) {
      // The replies to what it sent before it shut down its side are written first; what the
      // kernel does not take now, flush() writes on EPOLLOUT and then closes.
      ended = true;
      readable = false;
      flush();
      return;
    }
    // Short: the kernel had no more, and what arrives from now on raises a new edge (but for an
    // end of input already queued: read on until recv() says 0).
    if (static_cast<std::size_t>(n) < kReadChunk && !peer_done) readable = false;
    feed(std::span<const uint8_t>(buf.get(), static_cast<std::size_t>(n)));
    if (closed) return;
  }
  flush();
  if (closed) return;
  if (queued_now.load(std::memory_order_relaxed) > kPauseReadingAt) paused = true;  // resumed by flush() once drained
  if (paused) return;
  // Still readable after a fair share: the rest after the other connections' events.
  if (readable) post_read();
}

// Locks only what changed: a whole request in one read takes the keyspace's lock to be served
// and out_mu to queue its reply (in handle()), and out_mu once more to write it (flush()).
void Connection::feed(std::span<const uint8_t> in) {
  Server::Impl& s = *srv;
  const std::size_t cap = s.opts.limits.max_connection_bytes;
  while (!closed) {
    const std::size_t q = queued_now.load(std::memory_order_relaxed);
    dec.set_budget(q < cap ? cap - q : 0);
    const auto status = dec.next(in);
    if (const std::size_t pending = dec.pending_bytes(); pending != held_in) {
      bool over;
      {
        std::lock_guard lk(out_mu);
        held_in = pending;
        over = recount_locked();
      }
      if (over) {
        std::lock_guard lk(s.mu);
        s.shed_locked();
      }
    }
    if (closed) return;
    if (protocol.load(std::memory_order_relaxed) != dec.protocol()) protocol.store(dec.protocol());
    switch (status) {
      case Decoder::Status::need_more:
        return;
      case Decoder::Status::error:
        close(dec.error(), true);
        return;
      case Decoder::Status::request:
        handle(s);
        break;
    }
  }
}

void Connection::handle(Server::Impl& s) {
  requests.store(requests.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);  // no locked add
  Effects& fx = loop.fx;
  fx.clear();
  const Clock::time_point now = Clock::now();  // before the lock: less time under it
  // Other clients whose replies this request produced, to be written after the lock: always,
  // however the request ends (their waits are already released in the state), and then let go.
  thread_local std::vector<std::shared_ptr<Connection>> woken;
  woken.clear();
  struct FlushWoken {
    Loop& from;
    ~FlushWoken() {
      for (auto& other : woken) other->guarded([&] { other->flush_from(from); });
      woken.clear();
    }
  } flush_woken{loop};
  // However the request ends, after the lock: a large reply (GET of a big value, MULTI_GET) is in
  // the connection's queue by then, counted, and the loop's Effects does not keep its capacity,
  // nor the pushed replies (freed here, not under the lock, when this was their last holder).
  struct TrimEffects {
    Effects& fx;
    ~TrimEffects() {
      if (fx.reply.capacity() > kReadChunk) std::string().swap(fx.reply);
      fx.pushes.clear();
    }
  } trim_effects{fx};
  {
    std::lock_guard lk(s.mu);
    if (closed) return;  // dropped by reset() or another thread meanwhile
    ++s.stats.requests;
    const bool was_waiting = s.state.is_waiting(id);
    try {
      s.state.apply(id, dec.request(), now, fx);
    } catch (const std::exception& e) {
      if (!fx.dropped_watchers.empty()) close_dropped_watchers_locked(fx);  // their watches are gone
      close_locked(fmt::format("failed to serve its {}: {}", to_string(dec.request().op), e.what()), true);
      return;
    }
    if (fx.gave_up_wait && was_waiting) {
      s.log->debug("{} gave up its wait (client-side timeout) and sent {}", name_locked(), to_string(dec.request().op));
    }
    // Before the pushes: a dropped watcher (closed) is sent nothing more, as a closed one is not.
    if (!fx.dropped_watchers.empty()) close_dropped_watchers_locked(fx);
    // A requester over its output cap is closed, but the others' pushes still go: the state
    // has released their waits. The requester's own replies join the store's in-flight total
    // (one atomic shared by every thread) once they pass kUncountedReplies or flush(), at the
    // end of this read, cannot send them all; most often it sends them, and the total is not
    // touched at all. A requester whose writes already wait for room has its replies counted at
    // once: they stay queued past this read. Memory past the bound: at most kUncountedReplies
    // per I/O thread (the connection it is reading).
    const bool count_own = writing;
    bool self_ok = fx.reply.empty() || append_locked(fx.reply, count_own);
    for (auto& push : fx.pushes) {
      auto it = s.conns.find(push.to);
      if (it == s.conns.end()) continue;
      std::shared_ptr<Connection> other = it->second;
      if (other.get() == this) {
        self_ok = self_ok && append_locked(*push.bytes, count_own);
        continue;
      }
      // Out of memory for one recipient's reply closes that recipient; the others' go on.
      try {
        if (other->append_locked(*push.bytes)) woken.push_back(other);
      } catch (const std::bad_alloc&) {
        other->close_locked("out of memory for a reply to it", true);
      }
    }
    self_ok = self_ok && !closed;  // shed meanwhile for the store's in-flight bound
    if (self_ok && !fx.close_reason.empty()) close_locked(fx.close_reason, true);
  }
}

bool Connection::append_locked(std::string_view bytes, bool count) {
  if (closed) return false;
  const Limits& lim = srv->opts.limits;
  std::string refused;
  bool over = false;
  {
    std::lock_guard lk(out_mu);
    const std::size_t q = queued(), total = q + bytes.size();
    if (total + held_in > lim.max_connection_bytes) {
      refused = fmt::format("it is not reading its replies ({} bytes queued, cap {})", total, lim.max_connection_bytes);
    } else if (q > 0 && total > lim.max_unread_bytes) {
      refused = fmt::format("it is not reading its replies ({} bytes queued, over the cap of {} on unread replies)",
                            total, lim.max_unread_bytes);
    } else {
      out.append(bytes);
      queued_changed_locked();
      if (count || held_in + queued() > counted.load(std::memory_order_relaxed) + kUncountedReplies) {
        over = recount_locked();
      }
    }
  }
  if (!refused.empty()) {
    close_locked(refused, true);
    return false;
  }
  if (over) srv->shed_locked();
  return !closed;
}

// Writes what is queued for a client whose reply another client's request produced: at once
// on this thread if the client lives here, else on its own thread (one post at a time).
void Connection::flush_from(const Loop& from) {
  if (&from == &loop) return flush();
  if (flush_posted.exchange(true)) return;
  loop.reactor.post([self = shared_from_this()] {
    self->flush_posted = false;
    // Under the lock: queued_now, read unsynchronised, might not yet show what the poster queued
    // (its exchange above may have seen the flag before this store cleared it).
    self->guarded([&] { self->flush(true); });
  });
}

void Connection::flush(bool locked_look) {
  if (closed || writing) return;  // writing: waiting for room, EPOLLOUT flushes
  bool wait = false, resume = false, raise = false;
  std::string failed;
  // Nothing queued: nothing to write or count (a reply another thread queues after this look
  // comes with a flush of its own, flush_from()).
  if (locked_look || paused || queued_now.load(std::memory_order_relaxed) != 0) {
    std::lock_guard lk(out_mu);
    while (out_off < out.size()) {
      const ssize_t n = ::send(fd, out.data() + out_off, out.size() - out_off, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          if (out_off > out.size() / 2) {
            out.erase(0, out_off);
            out_off = 0;
          }
          wait = writing = true;
          break;
        }
        failed = std::strerror(errno);
        break;
      }
      out_off += static_cast<std::size_t>(n);
    }
    if (!wait && failed.empty()) {
      out.clear();
      out_off = 0;
      if (out.capacity() > kReadChunk) out.shrink_to_fit();
      resume = std::exchange(paused, false);
    }
    queued_changed_locked();
    // Sent: the count can only go down. Not all sent: the requester's own replies, not yet
    // counted (append_locked), are counted below under the store's lock, as replies to others
    // are, so that no one sees the total over its bound before the shedding.
    if (wait && held_in + queued() > counted.load(std::memory_order_relaxed)) {
      raise = true;
    } else {
      recount_locked();
    }
  }
  if (raise) {
    std::lock_guard lk(srv->mu);
    bool over;
    {
      std::lock_guard olk(out_mu);
      over = recount_locked();
    }
    if (over) srv->shed_locked();
  }
  if (closed) return;
  if (!failed.empty()) return close("write failed: " + failed, false);
  if (ended && !wait) return close("disconnected", false);
  // What came while paused raised its edge then. Posted, not read here: flush() may run inside
  // another connection's request (a push to this one), whose bytes are in the loop's buffer.
  if (resume && readable) post_read();
}

void Connection::close_socket() {
  auto shut = [self = shared_from_this()] {
    if (self->fd < 0) return;
    if (self->registered) {
      self->loop.reactor.remove(self->fd);
      self->registered = false;
      // Events of this batch may still name it: alive until the batch ends.
      self->loop.reactor.retire(self);
    }
    ::close(self->fd);
    self->fd = -1;
  };
  if (loop.here()) {
    shut();
  } else {
    loop.reactor.post(std::move(shut));
  }
}

void Connection::close(const std::string& reason, bool bad) {
  auto keep = shared_from_this();
  std::lock_guard lk(srv->mu);
  close_locked(reason, bad);
}

void Connection::close_locked(const std::string& reason, bool bad, bool quiet) {
  if (closed) return;
  auto keep = shared_from_this();
  Server::Impl& s = *srv;
  const bool was_waiting = s.state.is_waiting(id);
  if (bad) {
    ++s.stats.closed_bad;
    if (quiet) {
      s.log->debug("closing {}: {}", name_locked(), reason);
    } else {
      s.log->warn("closing {}: {}", name_locked(), reason);
    }
  } else if (was_waiting) {
    s.log->debug("{} went away while waiting ({})", name_locked(), reason);
  } else {
    s.log->debug("{} closed after {} requests: {}", name_locked(), requests, reason);
  }
  closed = true;
  {
    std::lock_guard lk(out_mu);
    release_locked();
  }
  s.state.disconnect(id);
  s.conns.erase(id);
  close_socket();
}

void Connection::close_dropped_watchers_locked(const Effects& fx) {
  constexpr std::size_t kNamed = 4;  // clients named in the warning; the rest counted
  Server::Impl& s = *srv;
  const std::string requester = name_locked();  // before it may be closed below
  std::string named;
  std::size_t closing = 0;
  for (ClientId dropped : fx.dropped_watchers) {
    auto it = s.conns.find(dropped);
    if (it == s.conns.end()) continue;
    const std::shared_ptr<Connection> other = it->second;  // close_locked erases it from conns
    if (closing++ < kNamed) named += (named.empty() ? "" : ", ") + other->name_locked();
    other->close_locked(fmt::format("its WATCH_KEY callback was dropped: {}", fx.dropped_reason), true, true);
  }
  if (closing == 0) return;
  s.log->warn("{}: {}{}; closing {}{}", requester, fx.dropped_reason,
              fx.dropped_keys > 1 ? fmt::format(" (and the watchers of {} more keys of it)", fx.dropped_keys - 1) : "",
              named, closing > kNamed ? fmt::format(" and {} more", closing - kNamed) : "");
}

void Server::Impl::shed_locked() {
  const std::size_t bound = opts.totals.max_inflight_bytes;
  for (;;) {
    const std::size_t total = inflight.load(std::memory_order_relaxed);
    if (total <= bound) return;
    Connection* most = nullptr;
    std::size_t most_bytes = 0;
    for (auto& [id, c] : conns) {
      const std::size_t b = c->counted.load(std::memory_order_relaxed);
      if (b > most_bytes) {
        most = c.get();
        most_bytes = b;
      }
    }
    if (!most) return;  // what is over is being released by its own thread
    std::size_t unread;
    {
      std::lock_guard lk(most->out_mu);
      unread = most->queued();
    }
    most->close_locked(
        fmt::format("store in flight: {} bytes of requests being read and replies not yet written over all "
                    "connections, over the store's limit of {}; this client held the most, {} ({} of replies it has "
                    "not read)",
                    total, bound, most_bytes, unread),
        true);
  }
}

// ---------------------------------------------------------------------------------------------

void Server::Impl::do_accept() {
  // Readiness, then accept4() in a loop on the caller's thread: the connections leave the
  // kernel's queue before any is looked at (kAcceptBatch).
  acceptor.async_wait(tcp::acceptor::wait_read, [self = shared_from_this()](const error_code& ec) {
    if (!self->running || ec == asio::error::operation_aborted) return;
    if (ec) {
      self->log->warn("store accept wait failed: {}", ec.message());
      self->accept_retry.expires_after(std::chrono::milliseconds(100));
      self->accept_retry.async_wait([self](const error_code& e) {
        if (!e && self->running) self->accept_now();
      });
      return;
    }
    self->accept_now();
  });
}

void Server::Impl::accept_now() {
  switch (drain_accept_queue()) {
    case Drained::empty:
      return do_accept();
    case Drained::more:  // a whole batch: others may wait in the queue, and no arrival wakes us
      asio::post(acceptor.get_executor(), [self = shared_from_this()] {
        if (self->running) self->accept_now();
      });
      return;
    case Drained::failed:
      break;
  }
  // Out of descriptors: the connections stay in the backlog; try again shortly (accepting,
  // not waiting: the backlog is already there) rather than spin on a listener that stays
  // readable.
  std::size_t open;
  {
    std::lock_guard lk(mu);
    open = conns.size();
  }
  log->warn("store accept failed: {} ({} connections open)", std::strerror(errno), open);
  accept_retry.expires_after(std::chrono::milliseconds(100));
  accept_retry.async_wait([self = shared_from_this()](const error_code& e) {
    if (!e && self->running) self->accept_now();
  });
}

Server::Impl::Drained Server::Impl::drain_accept_queue() {
  accepted.clear();
  Drained result = Drained::more;
  while (accepted.size() < static_cast<std::size_t>(kAcceptBatch)) {
    sockaddr_storage sa{};
    socklen_t len = sizeof sa;
    const int fd =
        ::accept4(acceptor.native_handle(), reinterpret_cast<sockaddr*>(&sa), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;  // a client that gave up while queued
      result = errno == EAGAIN || errno == EWOULDBLOCK ? Drained::empty : Drained::failed;
      break;
    }
    tcp::endpoint peer;
    if (len <= peer.capacity()) {
      std::memcpy(peer.data(), &sa, len);
      peer.resize(len);
    }
    accepted.emplace_back(fd, peer);
  }
  const int saved = errno;
  for (auto& [fd, peer] : accepted) on_accept(*loops[next_loop], fd, peer);
  errno = saved;
  return result;
}

const std::vector<asio::ip::address>& Server::Impl::host_addrs_now() {
  const auto now = std::chrono::steady_clock::now();
  if (host_addrs_read == std::chrono::steady_clock::time_point{} || now - host_addrs_read >= std::chrono::seconds(1)) {
    host_addrs = host_addresses();
    host_addrs_read = now;
  }
  return host_addrs;
}

void Server::Impl::warn_refused(const asio::ip::address& from, const std::string& text) {
  const auto now = std::chrono::steady_clock::now();
  if (refused.size() >= 4096 && !refused.contains(from.to_string())) refused.clear();  // a flood of sources
  auto& r = refused[from.to_string()];
  if (r.warned != std::chrono::steady_clock::time_point{} && now - r.warned < std::chrono::seconds(1)) {
    ++r.unwarned;
    return;
  }
  if (r.unwarned > 0) {
    log->warn("{} (and {} more from there refused in the second before)", text, r.unwarned);
  } else {
    log->warn("{}", text);
  }
  r.warned = now;
  r.unwarned = 0;
}

// On the caller's thread; the socket is in no reactor yet, so its loop's thread does not touch
// it until it enters one there. Owns fd (closes it when refused).
void Server::Impl::on_accept(Loop& target, int fd, const tcp::endpoint& peer) {
  // The listener's own address when it has one (no getsockname() per connection).
  tcp::endpoint local;
  if (listen_local) {
    local = *listen_local;
  } else {
    socklen_t len = static_cast<socklen_t>(local.capacity());
    if (::getsockname(fd, local.data(), &len) != 0 || len > local.capacity()) {
      ::close(fd);  // already gone
      return;
    }
    local.resize(len);
  }
  // Who it is, once per connection: this host's addresses (not for loopback) and the kernel's
  // owner of the client socket (found only when the client is on this host).
  const auto peer_addr = normalize(peer.address());
  static const std::vector<asio::ip::address> none;
  const auto& addrs = peer_addr.is_loopback() ? none : host_addrs_now();
  const auto owner = client_socket_owner(diag, peer, local);
  const AccessDecision access = decide_access(peer_addr, addrs, owner, job_uid, allowed);
  std::size_t open;
  {
    std::lock_guard lk(mu);
    open = conns.size();
    if (!access.allowed || open >= max_connections) ++stats.refused;
  }
  if (!access.allowed) {
    std::string list;
    for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a.to_string();
    warn_refused(
        peer_addr,
        fmt::format(
            "refused a store connection from {}: {} (this host: the job's user, uid {}, and root; other hosts: {})",
            format_endpoint(peer), access.why, job_uid, list.empty() ? "none" : list));
    ::close(fd);
    return;
  }
  if (open >= max_connections) {
    warn_refused(peer_addr,
                 fmt::format("refused a store connection from {}: the job's store has {} connections open, its limit",
                             format_endpoint(peer), open));
    ::close(fd);
    return;
  }
  const int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) {
    log->warn("cannot serve {}: {}", format_endpoint(peer), std::strerror(errno));
    ::close(fd);
    return;
  }
  std::shared_ptr<Connection> conn;
  {
    std::lock_guard lk(mu);
    ClientId id = next_id++;
    conn = std::make_shared<Connection>(shared_from_this(), target, fd, id);
    conn->peer = peer;
    conn->local = local;
    conn->peer_text = format_endpoint(peer);
    conns.emplace(id, conn);
    ++stats.accepted;
  }
  log->debug("client {} connected from {} ({})", conn->id, conn->peer_text, access.why);
  next_loop = (next_loop + 1) % loops.size();
  if (target.here()) {
    conn->enter_loop();
  } else {
    target.reactor.post([conn] { conn->enter_loop(); });
  }
}

void Server::Impl::drop_all() {
  std::unordered_map<ClientId, std::shared_ptr<Connection>> all;
  {
    std::lock_guard lk(mu);
    all = std::move(conns);
    conns.clear();
    for (auto& [id, c] : all) {
      c->closed = true;
      std::lock_guard olk(c->out_mu);
      c->release_locked();
    }
    state.reset();
  }
  for (auto& [id, c] : all) c->close_socket();
}

void Server::Impl::start_threads() {
  loops.clear();
  if (opts.threads == 0) {
    auto loop = std::make_unique<Loop>();
    loop->nest.emplace(io, loop->reactor.fd());
    watch_nested(*loop);
    loops.push_back(std::move(loop));
    return;
  }
  for (unsigned i = 0; i < opts.threads; ++i) {
    auto loop = std::make_unique<Loop>();
    Loop* raw = loop.get();
    loop->thread = std::thread([raw, log = log] {
      for (;;) {
        try {
          return raw->reactor.run();
        } catch (const std::exception& e) {  // a connection's own are caught in it: logged, served on
          log->error("store I/O thread: {}", e.what());
        }
      }
    });
    loop->owned = true;
    loop->thread_id = loop->thread.get_id();
    loops.push_back(std::move(loop));
  }
}

void Server::Impl::watch_nested(Loop& loop) {
  loop.nest->async_wait(asio::posix::descriptor_base::wait_read,
                        [self = shared_from_this(), l = &loop](const error_code& ec) {
                          if (ec) return;  // stop() released it
                          try {
                            l->reactor.poll();
                          } catch (const std::exception& e) {  // not the store's own: logged, served on
                            self->log->error("store loop: {}", e.what());
                          }
                          self->watch_nested(*l);
                        });
}

// After drop_all(): each loop runs the socket closes posted to it, then stops.
void Server::Impl::join_threads() {
  for (auto& l : loops) {
    if (l->thread.joinable()) l->reactor.stop();
  }
  for (auto& l : loops) {
    if (l->thread.joinable()) l->thread.join();
    l->joined = true;
    // The reactor keeps its epoll fd; the pending wait ends with operation_aborted.
    if (l->nest) l->nest->release();
  }
  // Work posted to a loop after its thread left run() (a flush another thread queued just
  // before the drop), a nested loop's closes, and the connections retired last would hold
  // their connections, and so this Impl, forever: run it here (every connection is closed by
  // now, so it only lets go).
  for (auto& l : loops) l->reactor.drain();
}

// ---------------------------------------------------------------------------------------------

Server::Server(asio::io_context& io, ServerOptions options) : impl_(std::make_shared<Impl>(io, std::move(options))) {
  set_allowed_peers(impl_->opts.allowed_peers);
}

Server::~Server() {
  stop();
}

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

void Server::set_rank_resolver(RankResolver resolver) {
  impl_->resolver = std::move(resolver);
}

void Server::start() {
  Impl& s = *impl_;
  if (s.running) throw StoreError("store server already started");
  // Large values, requests being read and replies queued (1 MiB and up) get pages of their own
  // (glibc: mmap), given back when freed. glibc's default raises that threshold each time such
  // a block is freed, after which they come from the heap, whose high-water mark stays: a store
  // bounded to 64 MiB in flight then peaked 16 MiB higher (tests/integration/store/
  // test_store_inflight.py). The process's other allocations are far smaller; tcmalloc (the
  // daemons') ignores this.
  static std::once_flag malloc_tuned;
  std::call_once(malloc_tuned, [] { ::mallopt(M_MMAP_THRESHOLD, 1 << 20); });
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
      throw PortInUse(fmt::format(
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
  if (ec == asio::error::address_in_use && s.opts.any_port_if_taken && ep.port() != 0) {
    ep.port(0);
    s.acceptor.bind(ep, ec);
  }
  if (ec) fail("bind");
  s.acceptor.listen(kBacklog, ec);
  if (ec) fail("listen on");
  const auto local = s.acceptor.local_endpoint(ec);
  s.bound_port = local.port();
  if (!local.address().is_unspecified()) s.listen_local = local;
  s.acceptor.non_blocking(true, ec);  // drain_accept_queue's accept4() loop ends at EAGAIN
  if (ec) fail("set non-blocking");
  s.bound_host = addr.is_v6() ? fmt::format("[{}]", addr.to_string()) : addr.to_string();
  s.start_threads();
  s.running = true;
  s.do_accept();
  s.log->debug("store listening on {} (PyTorch 1.13 to 2.11 clients; {})", address(),
               s.opts.threads == 0 ? std::string("on the caller's loop")
                                   : fmt::format("{} I/O thread{}", s.opts.threads, s.opts.threads == 1 ? "" : "s"));
}

uint16_t Server::port() const {
  return impl_->bound_port;
}

std::string Server::address() const {
  return impl_->bound_host + ":" + std::to_string(impl_->bound_port);
}

unsigned Server::threads() const {
  return impl_->opts.threads;
}

void Server::reset() {
  Impl& s = *impl_;
  std::size_t keys, clients;
  {
    std::lock_guard lk(s.mu);
    keys = s.state.num_keys();
    clients = s.conns.size();
  }
  s.drop_all();
  s.log->debug("store reset for a new attempt: dropped {} keys and {} connections", keys, clients);
}

void Server::stop() {
  Impl& s = *impl_;
  if (s.running) {
    s.running = false;
    error_code ec;
    s.acceptor.close(ec);
    s.accept_retry.cancel();
  }
  s.drop_all();
  s.join_threads();
}

ServerStats Server::stats() const {
  std::lock_guard lk(impl_->mu);
  ServerStats st = impl_->stats;
  st.connections = impl_->conns.size();
  st.inflight_bytes = impl_->inflight.load(std::memory_order_relaxed);
  return st;
}

WaitReport Server::waiters() const {
  Impl& s = *impl_;
  WaitReport report;
  std::vector<KeyWaiters> waited;
  // Clients on this host (loopback, or our own address: node rank 0's workers reach its agent's
  // store at MASTER_ADDR) that sent no PING: their pids are looked up through /proc, once per
  // connection, outside the lock (the store keeps serving meanwhile).
  std::vector<std::shared_ptr<Connection>> unknown;
  {
    std::lock_guard lk(s.mu);
    report.connections = s.conns.size();
    report.keys = s.state.num_keys();
    report.waited_keys = s.state.waited_keys();
    waited = s.state.waiters();
    if (waited.empty()) return report;
    std::unordered_set<const Connection*> seen;
    for (const auto& kw : waited) {
      for (const auto& [id, since] : kw.clients) {
        auto it = s.conns.find(id);
        if (it == s.conns.end()) continue;
        auto& c = it->second;
        const bool same_host =
            is_loopback(c->peer.address()) || normalize(c->peer.address()) == normalize(c->local.address());
        if (!s.state.client_pid(id) && !c->proc_pid && same_host && seen.insert(c.get()).second) {
          unknown.push_back(c);
        }
      }
    }
  }
  std::vector<std::optional<int>> found_pid(unknown.size());
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
      found_pid[i] = chosen;
    }
  }

  {
    std::lock_guard lk(s.mu);
    for (std::size_t i = 0; i < unknown.size(); ++i) {
      if (found_pid[i]) unknown[i]->proc_pid = found_pid[i];
    }
    for (auto& kw : waited) {
      WaitedKey wk;
      wk.key = std::move(kw.key);
      wk.barrier = kw.barrier;
      wk.deleted = kw.deleted;
      wk.total = kw.total;
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
        wk.waiters.push_back(std::move(w));
      }
      report.waited.push_back(std::move(wk));
    }
  }
  if (s.resolver.rank_of_pid) {
    for (auto& wk : report.waited) {
      for (auto& w : wk.waiters) {
        if (w.pid) w.rank = s.resolver.rank_of_pid(*w.pid);
      }
    }
  }
  return report;
}

}  // namespace ddp::store

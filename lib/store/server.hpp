// The c10d TCPStore-compatible server: an I/O edge (Asio's acceptor, then an epoll loop of its
// own per thread, reactor.hpp) over the pure decoder (protocol.hpp) and store semantics
// (state.hpp). Unmodified PyTorch workers of every release from 1.13 on are its clients
// (docs/store-protocol.md).
//
// Use (all calls on the io_context's thread; the server never blocks it):
//
//   boost::asio::io_context io;
//   ddp::store::Server store(io, {.host = "127.0.0.1", .port = 29500, .allowed_peers = {"10.0.0.2"}});
//   store.start();                       // binds + listens now; throws StoreError (port in use, ...)
//   store.set_rank_resolver({.candidate_pids = ..., .rank_of_pid = ...});   // optional
//   ... io.run() ...                     // the launcher's own loop
//   store.reset();                       // between attempts: fresh keyspace, clients dropped
//   log(format_wait_report(store.waiters(), world_size, Clock::now()));      // on a timeout
//   store.stop();                        // or just destroy it
//
// Policy:
//  - Every operation is atomic with respect to the others, as in PyTorch's servers: the store's
//    state is applied under one lock. Waits are event-driven: a client's WAIT is answered from
//    inside the SET that completes it; nothing polls.
//  - Threads: with `threads` 0 the connections are served on the caller's thread (the
//    launcher's loop: the reactor's epoll descriptor is watched by its io_context). With N >= 1
//    the server runs N I/O threads of its own, each a reactor, and deals each accepted
//    connection to one of them (round robin); accepting stays on the caller's io_context. Only
//    the state's update is serialised: reading, decoding and writing run in parallel, so
//    throughput grows with cores where PyTorch's server (one thread) stops. A reply to another
//    client (a WAIT released by a SET) is queued under the lock, in the order the state
//    produced it, and written by that client's own thread.
//  - Sockets are non-blocking and registered once, edge-triggered: a request costs one recv and
//    one send, no epoll_ctl. Reads go into one buffer per thread when the socket is readable,
//    so an idle connection (every 1.13 client keeps one) costs no buffer. Replies are written at
//    once when the kernel takes them, else queued. A connection whose queued replies pass 4 MiB
//    is not read from until they drain (TCP pushes back on that client only); one whose request
//    plus queued output would pass Limits::max_connection_bytes, or that is sent a reply while
//    its unwritten ones pass Limits::max_unread_bytes, is closed.
//  - In flight: the bytes of requests being decoded (as their lengths announce them) plus
//    replies not yet written are summed over all connections, and bounded by
//    Totals::max_inflight_bytes. Each connection keeps its share under its own output mutex and
//    adds the change to one atomic total, so the accounting takes no store-wide lock; a
//    requester's own small replies are counted only if they are not written at once (up to
//    64 KiB per I/O thread, for the connection it is reading, may be queued uncounted), so most
//    requests never touch it. When the
//    total passes the bound, the connection holding the most is closed (logged with its peer,
//    pid, PyTorch version and the limit); the others are served as before.
//  - A bad client (undecodable bytes, a limit exceeded, ADD on a non-number, a wrong VALIDATE)
//    is closed and logged with its peer address and pid; no other client notices. An exception
//    while serving one connection (std::bad_alloc) closes that connection only.
//  - Accepts dual-stack when host is "::"; SO_REUSEADDR; backlog 4096 (the kernel caps it at
//    net.core.somaxconn); TCP_NODELAY on every client.
//  - Access (access.hpp): from this host (loopback, any of its addresses) only when the kernel
//    says the client socket is the job's user's (job_uid) or root's, looked up once per accepted
//    connection; from other hosts only when their address is in allowed_peers (the job's nodes).
//    Refusals are logged with the peer's address and why.
//  - Totals (state.hpp): what the whole store holds is bounded (bytes, keys, queue items,
//    wait/watch registrations), and so are its open connections (Totals::max_connections; more
//    are refused at accept). A client whose request would pass a total is closed; the log names
//    the limit and the client. A change whose WATCH_KEY callbacks would pass
//    Totals::max_notify_bytes_per_request stands; the watchers past it are closed (one warning
//    names the key, the requester and the first few of them) before the others are sent it.
//  - The public calls (reset, stop, waiters, stats, set_allowed_peers, set_rank_resolver) are
//    made from the caller's io_context thread, as start() is; with threads >= 1 they are safe
//    against the I/O threads, and stop() joins them.
#pragma once

#include "store/peers.hpp"
#include "store/protocol.hpp"
#include "store/report.hpp"
#include "store/state.hpp"

#include <boost/asio/io_context.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::store {

class StoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// start(): the port asked for is taken (EADDRINUSE) and ServerOptions::any_port_if_taken is off.
class PortInUse : public StoreError {
 public:
  using StoreError::StoreError;
};

struct ServerOptions {
  std::string host = "127.0.0.1";  // an address or name; "::" = all, dual-stack
  uint16_t port = 29500;           // 0: any free port (see port())
  // port taken (EADDRINUSE): a free one instead of PortInUse, for a port the job preferred but
  // did not name (the default 29500 with another job on it); port() says which.
  bool any_port_if_taken = false;
  std::vector<std::string> allowed_peers;  // other hosts' addresses that may connect (the job's nodes)
  std::optional<uid_t> job_uid;            // the job's user; nullopt: this process's effective uid
  Limits limits;
  Totals totals;
  unsigned threads = 0;  // I/O threads of its own; 0: the caller's io_context
  // How clients without VALIDATE (PyTorch 1.13–2.1) read the opcodes their releases number
  // differently (protocol.hpp): from the job's PyTorch or store.protocol (legacy_hint()).
  LegacyHint legacy;
};

// The I/O threads a store gets for "auto" (the default of launches and `store serve`): a quarter
// of the CPUs this process may use, at least 1 and at most 8, leaving the rest to the clients (on
// node rank 0, the job's own ranks). Each thread more serves more clients at once but sleeps
// more often between their requests, and a sleep costs more CPU than a request. On 16 cores, six
// rounds each since requests got cheaper (2026-12-06): 4 threads served 3.4-4.8x PyTorch 2.11's
// server at 16 clients and 4.4-5.2x at 256, at a median 1.03 and 0.85 of its CPU per request;
// 3 threads 2.8-3.2x and 3.1-3.8x at the same CPU (docs/performance-gpu.md).
unsigned auto_threads();
// A job's or command line's request: a count, or negative for auto_threads().
inline unsigned threads_for(int asked) {
  return asked < 0 ? auto_threads() : static_cast<unsigned>(asked);
}

struct ServerStats {
  std::size_t connections = 0;  // open now
  uint64_t accepted = 0;        // since start
  uint64_t refused = 0;         // not allowed (another user of this host, not a job's node, too many)
  uint64_t closed_bad = 0;      // closed for a protocol or limit violation
  uint64_t requests = 0;
  std::size_t inflight_bytes = 0;  // now: requests being read + replies not yet written, all connections
};

class Server {
 public:
  // Does not bind. Throws StoreError when an allowed_peers entry is not an IP address.
  Server(boost::asio::io_context& io, ServerOptions options);
  // Closes everything (stop()). Destroy the Server before its io_context.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and listens. Throws StoreError with what to do, e.g. "store port 29500 on 127.0.0.1
  // is already in use (another job or torchrun?); choose store.port or --master-port".
  void start();
  uint16_t port() const;        // the bound port (after start)
  std::string address() const;  // "127.0.0.1:29500", "[::]:29500"
  unsigned threads() const;     // ServerOptions::threads

  // A new attempt: drops every key, queue, waiter and client connection. Keeps listening.
  void reset();
  // Stops listening and closes every connection. Idempotent; the destructor calls it.
  void stop();

  // Replaces the allow-list (addresses; throws StoreError on one that does not parse).
  void set_allowed_peers(const std::vector<std::string>& peers);
  void set_rank_resolver(RankResolver resolver);

  // Who waits for what, since when; ranks named through the resolver where possible (this may
  // read /proc for loopback clients that sent no PING). Cheap when nobody waits.
  WaitReport waiters() const;
  ServerStats stats() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace ddp::store

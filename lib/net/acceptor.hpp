// Every listener's accept loop (agent, standing coordinator, control socket, connect-back): one
// policy for peers that have not proved anything yet, not four copies.
//
// Two ways such peers could hurt a root daemon:
//  - Running it out of descriptors (EMFILE/ENFILE) or kernel memory (ENOBUFS/ENOMEM). accept()
//    then fails, the connection stays in the kernel's backlog and the listener stays readable:
//    re-arming at once spins a whole core. We wait instead (50 ms, doubling up to 2 s, back to
//    50 ms after a success) and warn once per episode, then once more when it is over.
//    Out of descriptors with unauthenticated connections held, the oldest of them is closed
//    first and the accept tried again at once: the descriptors go to whoever may be honest.
//  - Holding unauthenticated connections (each a descriptor, a buffer and a timer until its
//    handshake deadline). At most `max_pending` are kept; a new one evicts the OLDEST. Why the
//    oldest, not the newest: an honest peer finishes its handshake within a round trip or two,
//    so the connections that have waited longest are the least likely to be honest. Refusing
//    the newest instead would let whoever fills the table first lock every honest peer out for
//    as long as it keeps reconnecting; evicting the oldest makes a flooder need a new
//    connection per slot faster than an honest handshake completes.
//
// The pieces that decide (PendingSet, AcceptBackoff, classify_accept_error, pending_cap) are
// pure and unit-tested; Acceptor<Protocol> is the thin Asio edge around them.
#pragma once

#include "common/duration.hpp"

#include <spdlog/spdlog.h>
#include <boost/asio/basic_socket_acceptor.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/steady_timer.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace ddp::net {

// ---- pure ----------------------------------------------------------------------------------

// Unauthenticated connections held, oldest first. Ids grow, so the smallest is the oldest.
class PendingSet {
 public:
  using Id = std::uint64_t;
  explicit PendingSet(std::size_t cap) : cap_(cap < 1 ? 1 : cap) {}
  struct Admitted {
    Id id;
    std::optional<Id> evicted;  // the oldest, removed to make room: the caller closes it
  };
  Admitted admit();
  // The connection authenticated or closed; false when it was not held (already evicted).
  bool release(Id id);
  // Removes and returns the oldest (out of descriptors: close it to make room).
  std::optional<Id> pop_oldest();
  std::size_t size() const { return held_.size(); }
  std::size_t cap() const { return cap_; }

 private:
  std::size_t cap_;
  Id next_ = 1;
  std::map<Id, bool> held_;
};

// What an accept() error means for the loop.
enum class AcceptError {
  aborted,         // the listener was closed: stop
  per_connection,  // that one connection failed (ECONNABORTED, EPERM from a firewall, ...): go on
  resources,       // EMFILE, ENFILE, ENOBUFS, ENOMEM, or anything not known to be harmless: wait
};
AcceptError classify_accept_error(const boost::system::error_code& ec);
// Whether closing one of our descriptors lets the next accept succeed.
bool out_of_descriptors(const boost::system::error_code& ec);

// The wait between tries while accept() keeps failing for want of resources.
class AcceptBackoff {
 public:
  AcceptBackoff(Millis first, Millis max) : first_(first), max_(max) {}
  struct Step {
    Millis delay;
    bool starts_episode;  // the first failure since the last success: warn now
  };
  Step failed();
  // An accept succeeded: how many failed in the episode it ends (0: none was going on).
  std::uint64_t succeeded();
  bool in_episode() const { return failures_ > 0; }

 private:
  Millis first_, max_, next_{0};
  std::uint64_t failures_ = 0;
};

// The cap on unauthenticated connections for a process allowed `nofile_soft` descriptors: the
// configured number, but never more than a quarter of them (the rest are for jobs, established
// peers and files), and at least 4.
std::size_t pending_cap(std::size_t configured, std::uint64_t nofile_soft);
// This process's soft and hard RLIMIT_NOFILE (a large number when unlimited).
std::uint64_t nofile_soft_limit();
std::uint64_t nofile_hard_limit();

struct AcceptorLimits {
  // Unauthenticated connections kept at once (then capped by pending_cap()). A launch makes one
  // connection per agent and a standing coordinator's clients come a few at a time: 128 waiting
  // to authenticate at once is far beyond honest use.
  std::size_t max_pending = 128;
  Millis backoff_first{50};
  Millis backoff_max{2000};
};

// ---- the Asio edge -------------------------------------------------------------------------

// Shared between the Acceptor and the slots it hands out (a slot may outlive the Acceptor).
class AcceptGate : public std::enable_shared_from_this<AcceptGate> {
 public:
  AcceptGate(std::string what, std::shared_ptr<spdlog::logger> log, AcceptorLimits limits);
  // A pending connection's place; `evict` closes that connection. The returned handle releases
  // the place when destroyed (hold it until the peer has authenticated, or the connection ends).
  std::shared_ptr<void> admit(std::function<void()> evict);
  // Out of descriptors: closes the oldest pending connection; false when none is held.
  bool evict_oldest(const char* why);
  // After a failed accept: the delay before the next (nullopt: try again now).
  std::optional<Millis> on_error(const boost::system::error_code& ec);
  void on_success();
  std::size_t pending() const { return set_.size(); }
  std::size_t cap() const { return set_.cap(); }
  std::uint64_t failures() const { return failures_; }
  std::uint64_t evicted() const { return evicted_; }
  void release(PendingSet::Id id);

 private:
  std::string what_;
  std::shared_ptr<spdlog::logger> log_;
  PendingSet set_;
  AcceptBackoff backoff_;
  Millis backoff_max_;
  std::map<PendingSet::Id, std::function<void()>> evict_;
  std::uint64_t failures_ = 0, evicted_ = 0;
  bool warned_cap_ = false;
};

// The accept loop of one listener. `what` names it in log lines ("agent listener"). The owner
// keeps the acceptor (opened, bound, listening), calls start() once, and stop() before closing
// the acceptor or going away; `on_socket` gets each accepted socket on the io_context's thread.
template <class Protocol>
class Acceptor {
 public:
  using Socket = typename Protocol::socket;
  Acceptor(boost::asio::basic_socket_acceptor<Protocol>& acceptor, std::string what,
           std::shared_ptr<spdlog::logger> log, std::function<void(Socket)> on_socket, AcceptorLimits limits = {})
      : acceptor_(acceptor),
        retry_(acceptor.get_executor()),
        gate_(std::make_shared<AcceptGate>(std::move(what), std::move(log), limits)),
        on_socket_(std::move(on_socket)) {}
  ~Acceptor() { stop(); }
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  void start() {
    stopped_ = false;
    arm();
  }
  void stop() {
    stopped_ = true;
    retry_.cancel();
  }
  // See AcceptGate::admit.
  std::shared_ptr<void> admit(std::function<void()> evict) { return gate_->admit(std::move(evict)); }
  const AcceptGate& gate() const { return *gate_; }

 private:
  void arm() {
    // `alive` outlives us: a handler that runs after the owner is gone touches nothing.
    acceptor_.async_accept([this, alive = std::weak_ptr<AcceptGate>(gate_)](boost::system::error_code ec, Socket s) {
      if (ec == boost::asio::error::operation_aborted || alive.expired() || stopped_) return;
      if (!ec) {
        gate_->on_success();
        on_socket_(std::move(s));
        if (!stopped_) arm();
        return;
      }
      if (out_of_descriptors(ec) && gate_->evict_oldest("out of file descriptors")) {
        return arm();
      }
      const auto delay = gate_->on_error(ec);
      if (!delay) return arm();
      retry_.expires_after(*delay);
      retry_.async_wait([this, alive = std::weak_ptr<AcceptGate>(gate_)](boost::system::error_code e) {
        if (!e && !alive.expired() && !stopped_) arm();
      });
    });
  }

  boost::asio::basic_socket_acceptor<Protocol>& acceptor_;
  boost::asio::steady_timer retry_;
  std::shared_ptr<AcceptGate> gate_;
  std::function<void(Socket)> on_socket_;
  bool stopped_ = true;
};

}  // namespace ddp::net

// The accept policy (acceptor.hpp): the pending set, the backoff, and the gate that logs them.
#include "net/acceptor.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>

namespace ddp::net {

PendingSet::Admitted PendingSet::admit() {
  Admitted a{next_++, std::nullopt};
  if (held_.size() >= cap_) a.evicted = pop_oldest();
  held_.emplace(a.id, true);
  return a;
}

bool PendingSet::release(Id id) {
  return held_.erase(id) == 1;
}

std::optional<PendingSet::Id> PendingSet::pop_oldest() {
  if (held_.empty()) return std::nullopt;
  const Id id = held_.begin()->first;
  held_.erase(held_.begin());
  return id;
}

AcceptError classify_accept_error(const boost::system::error_code& ec) {
  if (ec == boost::asio::error::operation_aborted) return AcceptError::aborted;
  if (ec.category() != boost::system::system_category()) return AcceptError::resources;
  switch (ec.value()) {
    // accept(2): Linux passes the new connection's own network errors on; the listener is fine.
    case ECONNABORTED:
    case EPROTO:
    case EPERM:  // a firewall rule
    case ENETDOWN:
    case ENOPROTOOPT:
    case EHOSTDOWN:
    case ENONET:
    case EHOSTUNREACH:
    case EOPNOTSUPP:
    case ENETUNREACH:
    case EINTR:
    case EAGAIN:
      return AcceptError::per_connection;
    default:
      // EMFILE, ENFILE, ENOBUFS, ENOMEM, and whatever else: waiting costs an honest peer a
      // moment, retrying at once on an error that stays costs a core.
      return AcceptError::resources;
  }
}

bool out_of_descriptors(const boost::system::error_code& ec) {
  return ec.category() == boost::system::system_category() && (ec.value() == EMFILE || ec.value() == ENFILE);
}

AcceptBackoff::Step AcceptBackoff::failed() {
  const bool first = failures_++ == 0;
  next_ = first ? first_ : std::min(next_ * 2, max_);
  return {next_, first};
}

std::uint64_t AcceptBackoff::succeeded() {
  const auto n = failures_;
  failures_ = 0;
  next_ = Millis{0};
  return n;
}

std::size_t pending_cap(std::size_t configured, std::uint64_t nofile_soft) {
  const std::uint64_t quarter = std::max<std::uint64_t>(nofile_soft / 4, 4);
  return static_cast<std::size_t>(std::clamp<std::uint64_t>(configured, 1, quarter));
}

std::uint64_t nofile_soft_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return UINT64_MAX;
  return rl.rlim_cur;
}

std::uint64_t nofile_hard_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_max == RLIM_INFINITY) return UINT64_MAX;
  return rl.rlim_max;
}

// ---------------------------------------------------------------------------------------------

namespace {
// A pending connection's place; gives it back when the owner lets go of it.
struct Slot {
  std::weak_ptr<AcceptGate> gate;
  PendingSet::Id id;
  ~Slot() {
    if (auto g = gate.lock()) g->release(id);
  }
};
}  // namespace

AcceptGate::AcceptGate(std::string what, std::shared_ptr<spdlog::logger> log, AcceptorLimits limits)
    : what_(std::move(what)),
      log_(std::move(log)),
      set_(pending_cap(limits.max_pending, nofile_soft_limit())),
      backoff_(limits.backoff_first, limits.backoff_max),
      backoff_max_(limits.backoff_max) {}

std::shared_ptr<void> AcceptGate::admit(std::function<void()> evict) {
  auto a = set_.admit();
  std::function<void()> victim;
  if (a.evicted) {
    ++evicted_;
    if (auto it = evict_.find(*a.evicted); it != evict_.end()) {
      victim = std::move(it->second);
      evict_.erase(it);
    }
    if (!warned_cap_) {
      warned_cap_ = true;
      log_->warn(
          "{}: {} connections have not authenticated yet, the most kept at once: closing the oldest to "
          "make room for each new one (said once, until they are gone)",
          what_, set_.cap());
    }
  }
  evict_.emplace(a.id, std::move(evict));
  auto slot = std::make_shared<Slot>();
  slot->gate = weak_from_this();
  slot->id = a.id;
  if (victim) victim();  // last: it may re-enter release() through its own slot
  return slot;
}

void AcceptGate::release(PendingSet::Id id) {
  set_.release(id);
  evict_.erase(id);
  if (set_.size() == 0) warned_cap_ = false;
}

bool AcceptGate::evict_oldest(const char* why) {
  auto id = set_.pop_oldest();
  if (!id) return false;
  ++evicted_;
  std::function<void()> victim;
  if (auto it = evict_.find(*id); it != evict_.end()) {
    victim = std::move(it->second);
    evict_.erase(it);
  }
  if (!backoff_.in_episode() && !warned_cap_) {
    warned_cap_ = true;
    log_->warn(
        "{}: {}: closing the oldest of {} unauthenticated connections to make room (said once, until they "
        "are gone)",
        what_, why, set_.size() + 1);
  }
  if (victim) victim();
  return true;
}

std::optional<Millis> AcceptGate::on_error(const boost::system::error_code& ec) {
  if (classify_accept_error(ec) == AcceptError::per_connection) {
    log_->debug("{}: a connection failed before it was accepted: {}", what_, ec.message());
    return std::nullopt;
  }
  ++failures_;
  const auto step = backoff_.failed();
  if (step.starts_episode) {
    log_->warn(
        "{}: accept failed: {} ({} unauthenticated connections held); trying again every {} ms up to {} ms "
        "until it works (said once, until it recovers){}",
        what_, ec.message(), set_.size(), step.delay.count(), backoff_max_.count(),
        out_of_descriptors(ec) ? ": raise the descriptor limit (LimitNOFILE= in the unit, ulimit -n)" : "");
  }
  return step.delay;
}

void AcceptGate::on_success() {
  if (const auto n = backoff_.succeeded()) {
    log_->warn("{}: accepting again, after {} failed tries", what_, n);
  }
}

}  // namespace ddp::net

#include "attempt/attempt.hpp"

#include <fmt/format.h>
#include <string.h>
#include <algorithm>
#include <stdexcept>

namespace ddp::launch {

std::string WorkerExit::describe() const {
  if (!started) return "was not started";
  if (signal != 0) {
    const char* abbrev = ::sigabbrev_np(signal);
    auto out = abbrev ? fmt::format("was killed by SIG{}", abbrev) : fmt::format("was killed by signal {}", signal);
    if (forwarded) out += ", which ddpctl forwarded (it has no handler for it)";
    return out;
  }
  return fmt::format("exited with code {}", exit_code);
}

AttemptTracker::AttemptTracker(int nranks) : exits_(static_cast<std::size_t>(nranks)), live_(nranks) {
  if (nranks <= 0) throw std::invalid_argument("an attempt needs at least one rank");
}

void AttemptTracker::on_forwarded(int signal) {
  if (std::find(forwarded_.begin(), forwarded_.end(), signal) == forwarded_.end()) forwarded_.push_back(signal);
}

Decision AttemptTracker::on_exit(const WorkerExit& in) {
  auto e = in;
  if (e.signal && std::find(forwarded_.begin(), forwarded_.end(), e.signal) != forwarded_.end()) e.forwarded = true;
  if (signals_sent_) e.after_stop = true;
  // Indexed by local rank: on a node whose first global rank is not 0, global ranks do not
  // start at 0, but local ranks always do.
  const auto slot = static_cast<std::size_t>(e.local_rank);
  if (e.local_rank < 0 || slot >= exits_.size() || exits_[slot] || finished()) {
    return Decision::none;  // not ours, or reported twice: ignore
  }
  exits_[slot] = e;
  --live_;
  if (phase_ == Phase::running && e.failed()) {
    if (!e.forwarded) first_failure_ = e;
    phase_ = Phase::stopping;
    if (live_ == 0) {
      phase_ = Phase::failed;
      return Decision::finished;
    }
    return Decision::stop_all;
  }
  // Stopping only for a forwarded signal's death, before any signal of ours: a rank failing by
  // itself now is the first failure all the same.
  const bool own_failure_while_forwarding =
      phase_ == Phase::stopping && !stop_requested_ && !first_failure_ && !signals_sent_ && e.failed() && !e.forwarded;
  if (own_failure_while_forwarding) first_failure_ = e;
  if (live_ == 0) {
    if (phase_ == Phase::running)
      phase_ = Phase::succeeded;
    else
      phase_ = stop_requested_ && !first_failure_ ? Phase::stopped : Phase::failed;
    return Decision::finished;
  }
  return own_failure_while_forwarding ? Decision::first_failure : Decision::none;
}

Decision AttemptTracker::on_stop_requested(int signal) {
  if (finished()) return Decision::none;
  if (!stop_requested_) stop_signal_ = signal;
  stop_requested_ = true;
  if (phase_ == Phase::stopping) return Decision::none;
  phase_ = Phase::stopping;
  return Decision::stop_all;
}

}  // namespace ddp::launch

// One attempt's bookkeeping, as a pure state machine: worker exits and stop requests in,
// decisions out. No clocks (times are given), no processes, no I/O.
//
//   running --first non-zero exit--> stopping(failed)   (caller: SIGTERM all, grace, SIGKILL)
//   running --stop requested------> stopping(stopped)
//   running --killed by a forwarded signal--> stopping(failed, no first failure)
//   running --all exited 0--------> succeeded
//   stopping --all exited---------> failed | stopped
// Exits while stopping are consequences, never "the failure"; the first failure is by time.
// A rank killed by a signal the launcher forwarded (SIGUSR1/2, on_forwarded) did not fail by
// itself: it ends the attempt, but it is never the first failure.
#pragma once

#include "common/duration.hpp"

#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace ddp::launch {

// A Ctrl-C's first step: SIGINT, so that a Python rank raises KeyboardInterrupt and can save a
// checkpoint; SIGTERM follows this long after (then SIGKILL stop_grace after that). 10 s is room
// for a typical torch.save to local disk, short enough that a rank stuck in a collective (which
// does not see KeyboardInterrupt until it returns) is not waited for long; never longer than the
// job's stop.grace, so a job that asks for a quick stop gets one. A second Ctrl-C kills at once.
inline constexpr Millis kInterruptGrace{10'000};
inline Millis interrupt_grace(Millis stop_grace) {
  return std::min(stop_grace, kInterruptGrace);
}

using SysTime = std::chrono::system_clock::time_point;

struct WorkerExit {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;
  int exit_code = 0;  // valid when signal == 0
  int signal = 0;     // the signal that killed it, 0 if it exited
  SysTime when{};
  bool started = true;  // false: never started because another rank failed first
  // Killed by `signal`, which the launcher forwarded to it (SIGUSR1/2 sent to ddpctl or an agent).
  bool forwarded = false;
  // Ended after this launcher's or agent's stop signals went out (on_signals_sent): a consequence
  // of the stop, whatever it died of, never the first failure across nodes.
  bool after_stop = false;
  bool failed() const { return started && (signal != 0 || exit_code != 0); }
  // "exited with code 1" / "was killed by SIGSEGV" / "was killed by SIGUSR1, which ddpctl forwarded (...)"
  std::string describe() const;
};

enum class Phase { running, stopping, succeeded, failed, stopped };

enum class Decision {
  none,      // keep going
  stop_all,  // a first failure: stop every other worker now
  finished,  // the attempt is over; see phase()
  // A rank failed by itself while the attempt was already stopping for a forwarded signal's
  // death, before any stop signal went out: it is the first failure (the stop already runs).
  first_failure,
};

class AttemptTracker {
 public:
  explicit AttemptTracker(int nranks);  // exits are matched by local rank, 0..nranks-1

  Decision on_exit(const WorkerExit& e);
  // A stop from outside (Ctrl-C, SIGTERM). Returns stop_all unless already stopping/finished.
  Decision on_stop_requested(int signal);
  // The launcher passed `signal` on to every worker: a rank it kills from now on is marked
  // forwarded (WorkerExit::forwarded) rather than failed by itself.
  void on_forwarded(int signal);
  // The stop's first signal has gone out (after the stacks read). Until then, an attempt that
  // stops only because a forwarded signal killed a rank still takes a rank's own failure as the
  // first failure: it happened before anything of ours could have caused it.
  void on_signals_sent() { signals_sent_ = true; }

  Phase phase() const { return phase_; }
  bool finished() const { return phase_ == Phase::succeeded || phase_ == Phase::failed || phase_ == Phase::stopped; }
  int live() const { return live_; }
  const std::optional<WorkerExit>& first_failure() const { return first_failure_; }
  const std::vector<std::optional<WorkerExit>>& exits() const { return exits_; }
  int stop_signal() const { return stop_signal_; }
  bool signals_sent() const { return signals_sent_; }

 private:
  std::vector<std::optional<WorkerExit>> exits_;
  int live_;
  Phase phase_ = Phase::running;
  bool stop_requested_ = false;
  bool signals_sent_ = false;  // on_signals_sent()
  int stop_signal_ = 0;
  std::vector<int> forwarded_;  // signals passed on to the workers, in order
  std::optional<WorkerExit> first_failure_;
};

}  // namespace ddp::launch

// The hang watchdog's sampling edge, owned by a WorkerGroup (next to the ranks, so the local
// launcher and the agent's shepherd share it): every sample_interval(timeout) on the owner's
// io_context timer (no thread, no sleep), each live rank's main-thread Python stack (a
// Python-only read: process_vm_readv, nothing opened in the job's files) and main-thread CPU
// time are read and fed, with "output seen", to lib/hang's pure core. The owner decides what a
// round means (the local launcher: hung or not; the shepherd: what to tell the coordinator).
#pragma once

#include "common/duration.hpp"
#include "hang/progress.hpp"
#include "stacks/merge.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <sys/types.h>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ddp::launch {

// The watchdog reads ranks with the failure report's read_rank_stacks (failure_stacks.hpp):
// Python only, in-process, bounded.

class HangSampler {
 public:
  struct Rank {
    int rank = 0, local_rank = 0;
    std::string node;
    pid_t pid = -1;
  };
  // After every round: the node's progress; the owner calls progress().watch().check(now).
  using OnRound = std::function<void(hang::RankProgress&, hang::TimePoint now)>;

  HangSampler(boost::asio::io_context& io, Millis timeout, std::vector<Rank> ranks, OnRound on_round);
  HangSampler(const HangSampler&) = delete;
  HangSampler& operator=(const HangSampler&) = delete;

  void start();
  void stop();
  void on_output(int local_rank);
  void on_exit(int local_rank);  // not sampled any more
  // Every rank's stacks from the latest round (a rank not read says why), merged and rendered
  // as `ddpctl stacks` prints them. world_size: for "(k of N)".
  std::string stacks_text(int world_size) const;
  const std::vector<stacks::RankStacks>& last_stacks() const { return last_; }
  hang::RankProgress& progress() { return progress_; }
  const hang::RankProgress& progress() const { return progress_; }

 private:
  struct State {
    Rank rank;
    pid_t python_pid = -1;  // the rank's Python process: itself, or a descendant (uv run, sh -c)
    std::optional<unsigned long long> python_started;  // its start time when found: the same process
    bool output = false, exited = false;
  };
  void round();
  void schedule();
  hang::Sample sample(State& s, hang::TimePoint now, stacks::ProcessStacks& read);

  boost::asio::steady_timer timer_;
  Millis interval_;
  std::vector<State> ranks_;
  OnRound on_round_;
  hang::RankProgress progress_;
  std::vector<stacks::RankStacks> last_;
  bool stopped_ = true;
};

}  // namespace ddp::launch

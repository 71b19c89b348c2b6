// The hang watchdog's pure core: what counts as progress, and when a job is hung. Samples in,
// verdicts out; time is injected (steady time points), nothing here reads a clock, a process or
// a socket. The edges are lib/launch/worker_group.cpp (sampling next to the ranks), the local
// launcher and the coordinator (the decision and the action).
//
// Progress (docs/architecture.md, "The hang watchdog", says why): a rank makes progress when
//   - it wrote output since its previous sample, or
//   - its main thread's Python stack (file, line, function of every frame) differs from the
//     previous sample's, or
//   - its main thread's CPU time advanced while that stack is not inside torch.distributed (a
//     long silent computation in C: numpy, a big tensor op, hashlib), or while it has no Python
//     stack we could read (a worker that is not Python: CPU is all we know).
// A rank blocked in a collective spins a core under NCCL and PyTorch's NCCL monitor touches the
// store every second, so neither CPU time inside torch.distributed nor store traffic counts.
// Only the main thread is read: the training loop runs there, and a helper thread's stack
// (a data loader's, tqdm's monitor) would otherwise hide a stuck main thread.
//
// The job (or one node's share of it) is hung when no rank has made progress for `timeout`
// (every rank's last progress starts at the attempt's start). One hang is one episode: it is
// reported once, and a new episode begins only after some rank progressed again.
#pragma once

#include "stacks/model.hpp"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddp::hang {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;
using Millis = std::chrono::milliseconds;

// How often a rank is sampled: timeout/8, clamped to [1 s, 60 s]: at most 1/8 of the timeout
// lost to sampling, and never more than one read a second per rank.
Millis sample_interval(Millis timeout);

// A fingerprint of a Python stack: function, file and line of every frame (FNV-1a, stable
// across runs). Pure.
std::uint64_t fingerprint(const std::vector<stacks::Frame>& python);
// Whether a Python stack (innermost first) is inside torch.distributed: a collective, a
// barrier, a store wait. torch/distributed/checkpoint is not (it computes and writes). Not
// torch.cuda.synchronize(): a healthy GPU-bound loop waits there most of the time, and a host
// cannot tell that wait from one for a hung NCCL collective (docs/architecture.md). Pure.
bool inside_torch_distributed(const std::vector<stacks::Frame>& python);

struct Sample {
  int rank = 0;
  TimePoint when{};
  // The main thread's Python stack: its fingerprint and whether it is inside
  // torch.distributed; nullopt when it could not be read (not Python, gone, refused).
  std::optional<std::uint64_t> stack;
  bool in_torch_distributed = false;
  // The main thread's utime + stime in clock ticks; nullopt when it could not be read.
  std::optional<std::uint64_t> cpu_ticks;
  bool output = false;  // output since this rank's previous sample
};

// Why a sample counted (or did not): for the log and the tests.
enum class Why { none, output, stack_changed, cpu_outside_collective, cpu_no_stack };
std::string_view why_name(Why w);

// Progress of a set of units (the ranks of one node; or, at the coordinator, the nodes of a job)
// against a timeout, with hang episodes.
class Watch {
 public:
  Watch(Millis timeout, TimePoint start) : timeout_(timeout), last_(start) {}

  void progressed(TimePoint when);  // progress at `when` (ignored if older than what is known)
  TimePoint last_progress() const { return last_; }
  Millis idle(TimePoint now) const;  // 0 when `now` is not after the last progress

  enum class Verdict { progressing, hung_now, still_hung };
  // hung_now: a new episode starts (act on it once); still_hung: the same episode goes on.
  Verdict check(TimePoint now);
  bool hung() const { return hung_; }
  Millis timeout() const { return timeout_; }
  // When check() would next say hung_now if nothing progressed (for the owner's timer).
  TimePoint deadline() const { return last_ + timeout_; }

 private:
  Millis timeout_;
  TimePoint last_;
  bool hung_ = false;
};

// One node's ranks: samples in, a Watch over their union.
class RankProgress {
 public:
  RankProgress(Millis timeout, int nranks, TimePoint start);

  // Classifies one sample against the rank's previous one; progress moves the watch.
  Why on_sample(const Sample& s);
  Watch& watch() { return watch_; }
  const Watch& watch() const { return watch_; }
  // The rank's last progress (its start if none since).
  TimePoint last_progress(int rank) const;

 private:
  struct Rank {
    TimePoint last_progress{};
    std::optional<Sample> previous;
  };
  std::vector<Rank> ranks_;
  Watch watch_;
};

// What a node tells the coordinator (the 'progress' message): its idle time, only when it
// changes meaningfully, so that a job of 1000 nodes costs a few messages per hang, not a stream.
// A node is `idle` once no rank of it has progressed for half the timeout; it says so once
// (with the exact age of its last progress) and again when it progresses ("idle_ms 0").
// The coordinator treats a node as progressing until it says otherwise, so a message that comes
// late can only make a hang verdict later, never earlier.
class NodeReporter {
 public:
  explicit NodeReporter(Millis timeout) : threshold_(timeout / 2) {}
  // After each round of samples: the idle time to send now, if any.
  std::optional<Millis> update(const Watch& w, TimePoint now);
  bool idle() const { return idle_; }

 private:
  Millis threshold_;
  bool idle_ = false;
};

// The coordinator's view of a job's nodes, from their reports. Pure.
class NodeProgress {
 public:
  NodeProgress(Millis timeout, TimePoint start) : timeout_(timeout), start_(start) {}
  // A node's report received at `now`: idle_ms 0 means progressing.
  void on_report(const std::string& node, Millis idle, TimePoint now);
  void forget(const std::string& node);  // it left the job
  void reset(TimePoint start);           // a new attempt: every node progressing
  // hung when every known node (at least one) has said it is idle and the youngest last
  // progress is `timeout` old.
  Watch::Verdict check(const std::vector<std::string>& nodes, TimePoint now);
  std::optional<TimePoint> last_progress(const std::vector<std::string>& nodes, TimePoint now) const;

 private:
  struct Node {
    bool idle = false;
    TimePoint last_progress{};
  };
  Millis timeout_;
  TimePoint start_;
  std::vector<std::pair<std::string, Node>> nodes_;
  bool hung_ = false;
};

}  // namespace ddp::hang

// The hang watchdog's core: what counts as progress (output, a changing Python stack, CPU time
// outside torch.distributed), when a node and a job are hung, one report per episode; and random
// sample streams against the invariants (a verdict is never early, never missed, never repeated).
#include "hang/progress.hpp"

#include <gtest/gtest.h>

#include <random>

using namespace ddp::hang;
using namespace std::chrono_literals;
using ddp::stacks::Frame;

namespace {

Frame py(const std::string& fn, const std::string& file, int line) {
  return {Frame::Kind::python, fn, file, line, 0};
}

const std::vector<Frame> kAllReduce{
    py("all_reduce", "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py", 1555),
    py("step", "/w/train.py", 42), py("<module>", "/w/train.py", 60)};
const std::vector<Frame> kSleep{py("stuck_here", "/w/train.py", 12), py("<module>", "/w/train.py", 60)};
const std::vector<Frame> kMatmul{py("step", "/w/train.py", 30), py("<module>", "/w/train.py", 60)};

const TimePoint t0 = TimePoint{} + 1000s;

Sample sample(int rank, TimePoint when, const std::vector<Frame>& stack, std::uint64_t cpu, bool output = false) {
  return {rank, when, fingerprint(stack), inside_torch_distributed(stack), cpu, output};
}

}  // namespace

TEST(Interval, IsAnEighthOfTheTimeoutClampedToOneSecondAndOneMinute) {
  EXPECT_EQ(sample_interval(5s), 1s);
  EXPECT_EQ(sample_interval(16s), 2s);
  EXPECT_EQ(sample_interval(10min), 60s);
  EXPECT_EQ(sample_interval(4min), 30s);
  EXPECT_EQ(sample_interval(0s), 1s);
}

TEST(Fingerprint, IsTheFramesPlacesLinesIncluded) {
  EXPECT_EQ(fingerprint(kSleep), fingerprint(kSleep));
  auto moved = kSleep;
  moved[0].line = 13;
  EXPECT_NE(fingerprint(kSleep), fingerprint(moved));
  EXPECT_NE(fingerprint({py("ab", "c", 1)}), fingerprint({py("a", "bc", 1)}));
  EXPECT_NE(fingerprint({}), fingerprint(kSleep));
  auto offset = kSleep;
  offset[0].offset = 99;  // native offsets are no part of a place
  EXPECT_EQ(fingerprint(kSleep), fingerprint(offset));
}

TEST(Collective, TorchDistributedButNotItsCheckpointNorDdpsForward) {
  EXPECT_TRUE(inside_torch_distributed(kAllReduce));
  EXPECT_TRUE(
      inside_torch_distributed({py("wait", "/venv/lib/python3.12/site-packages/torch/distributed/c10d_logger.py", 3)}));
  EXPECT_FALSE(inside_torch_distributed(kSleep));
  EXPECT_FALSE(inside_torch_distributed({py("forward", "/venv/site-packages/torch/nn/parallel/distributed.py", 1600)}));
  EXPECT_FALSE(inside_torch_distributed(
      {py("save", "/venv/site-packages/torch/distributed/checkpoint/state_dict_saver.py", 50)}));
  EXPECT_FALSE(inside_torch_distributed({}));
  // A CUDA synchronisation is where a healthy GPU-bound loop waits too: its CPU time counts.
  EXPECT_FALSE(inside_torch_distributed(
      {py("synchronize", "/venv/site-packages/torch/cuda/__init__.py", 801), py("step", "/w/train.py", 9)}));
}

// The scenario: rank 1 sleeps in Python, the others wait in all_reduce spinning a core
// (as under NCCL). Nothing counts: hung exactly at the timeout, not a sample before.
TEST(RankProgress, SleeperAndSpinningCollectiveIsAHangAtTheTimeout) {
  RankProgress p(10s, 4, t0);
  for (int s = 0; s <= 20; ++s) {
    const TimePoint now = t0 + s * 1s;
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(p.on_sample(sample(r, now, r == 1 ? kSleep : kAllReduce, r == 1 ? 7 : 100u * s)), Why::none);
    }
    const auto v = p.watch().check(now);
    if (s < 10)
      EXPECT_EQ(v, Watch::Verdict::progressing) << s;
    else if (s == 10)
      EXPECT_EQ(v, Watch::Verdict::hung_now);
    else
      EXPECT_EQ(v, Watch::Verdict::still_hung) << s;
  }
  EXPECT_EQ(p.watch().idle(t0 + 20s), 20s);
}

TEST(RankProgress, SilentPythonComputationChangesTheStack) {
  RankProgress p(5s, 2, t0);
  for (int s = 1; s <= 60; ++s) {
    const TimePoint now = t0 + s * 1s;
    auto busy = kMatmul;
    busy[0].line = 30 + s % 3;
    EXPECT_EQ(p.on_sample(sample(0, now, busy, 0)), s == 1 ? Why::none : Why::stack_changed);
    p.on_sample(sample(1, now, kAllReduce, 0));
    EXPECT_EQ(p.watch().check(now), Watch::Verdict::progressing) << s;
  }
}

TEST(RankProgress, OneLongCallInCIsCpuOutsideTheCollective) {
  RankProgress p(5s, 2, t0);
  for (int s = 1; s <= 60; ++s) {
    const TimePoint now = t0 + s * 1s;
    EXPECT_EQ(p.on_sample(sample(0, now, kMatmul, 100u * s)), s == 1 ? Why::none : Why::cpu_outside_collective);
    p.on_sample(sample(1, now, kAllReduce, 100u * s));  // spins, but inside a collective
    EXPECT_EQ(p.watch().check(now), Watch::Verdict::progressing) << s;
  }
  EXPECT_EQ(p.last_progress(1), t0);
  EXPECT_EQ(p.last_progress(0), t0 + 60s);
}

TEST(RankProgress, OutputAndUnreadableStacks) {
  RankProgress p(5s, 1, t0);
  EXPECT_EQ(p.on_sample(sample(0, t0 + 1s, kSleep, 1, true)), Why::output);
  EXPECT_EQ(p.watch().last_progress(), t0 + 1s);
  // Not Python (nothing readable): CPU is all we know, and it counts.
  Sample native{0, t0 + 2s, std::nullopt, false, 5, false};
  EXPECT_EQ(p.on_sample(native), Why::stack_changed);  // readable -> not: the process changed
  native.when = t0 + 3s;
  native.cpu_ticks = 9;
  EXPECT_EQ(p.on_sample(native), Why::cpu_no_stack);
  native.when = t0 + 4s;
  EXPECT_EQ(p.on_sample(native), Why::none);  // no CPU either
  native.when = t0 + 5s;
  native.cpu_ticks.reset();  // gone
  EXPECT_EQ(p.on_sample(native), Why::none);
  // A rank outside the node and a sample from the past say nothing.
  EXPECT_EQ(p.on_sample(sample(3, t0 + 6s, kSleep, 1, true)), Why::none);
  EXPECT_EQ(p.on_sample(sample(0, t0 + 1s, kMatmul, 99, true)), Why::none);
  EXPECT_EQ(p.watch().last_progress(), t0 + 3s);
}

TEST(Watch, OneVerdictPerEpisode) {
  Watch w(5s, t0);
  EXPECT_EQ(w.deadline(), t0 + 5s);
  EXPECT_EQ(w.check(t0 + 4999ms), Watch::Verdict::progressing);
  EXPECT_EQ(w.check(t0 + 5s), Watch::Verdict::hung_now);
  EXPECT_TRUE(w.hung());
  EXPECT_EQ(w.check(t0 + 50s), Watch::Verdict::still_hung);
  w.progressed(t0 + 51s);
  EXPECT_FALSE(w.hung());
  EXPECT_EQ(w.check(t0 + 52s), Watch::Verdict::progressing);
  EXPECT_EQ(w.check(t0 + 56s), Watch::Verdict::hung_now);
  w.progressed(t0 + 40s);  // older than known: nothing changes
  EXPECT_EQ(w.last_progress(), t0 + 51s);
  EXPECT_EQ(w.check(t0 + 57s), Watch::Verdict::still_hung);
}

TEST(NodeReporter, SaysIdleOnceAtHalfTheTimeoutAndOnceWhenItProgresses) {
  Watch w(10s, t0);
  NodeReporter r(10s);
  EXPECT_EQ(r.update(w, t0 + 4s), std::nullopt);
  EXPECT_EQ(r.update(w, t0 + 5s), 5s);
  EXPECT_EQ(r.update(w, t0 + 6s), std::nullopt);
  EXPECT_EQ(r.update(w, t0 + 60s), std::nullopt);
  w.progressed(t0 + 61s);
  EXPECT_EQ(r.update(w, t0 + 61s), 0s);
  EXPECT_EQ(r.update(w, t0 + 62s), std::nullopt);
}

TEST(NodeProgress, HungOnlyWhenEveryNodeIsIdleForTheTimeout) {
  NodeProgress np(10s, t0);
  const std::vector<std::string> nodes{"a", "b", "c"};
  EXPECT_EQ(np.check(nodes, t0 + 100s), Watch::Verdict::progressing);  // nobody said idle
  np.on_report("a", 5s, t0 + 5s);
  np.on_report("b", 6s, t0 + 8s);                                     // last progress t0+2s
  EXPECT_EQ(np.check(nodes, t0 + 30s), Watch::Verdict::progressing);  // c progresses
  np.on_report("c", 5s, t0 + 9s);                                     // last progress t0+4s: the youngest
  EXPECT_EQ(np.check(nodes, t0 + 13999ms), Watch::Verdict::progressing);
  EXPECT_EQ(np.check(nodes, t0 + 14s), Watch::Verdict::hung_now);
  EXPECT_EQ(np.check(nodes, t0 + 15s), Watch::Verdict::still_hung);
  np.on_report("b", 0s, t0 + 16s);  // progress ends the episode
  EXPECT_EQ(np.check(nodes, t0 + 17s), Watch::Verdict::progressing);
  np.on_report("b", 5s, t0 + 21s);
  EXPECT_EQ(np.check(nodes, t0 + 26s), Watch::Verdict::hung_now);  // b's last: t0+16s
  // A node that left no longer holds the job up; a new attempt starts from scratch.
  np.reset(t0 + 30s);
  EXPECT_EQ(np.check(nodes, t0 + 100s), Watch::Verdict::progressing);
  np.on_report("a", 5s, t0 + 35s);
  np.on_report("b", 5s, t0 + 35s);
  EXPECT_EQ(np.check(nodes, t0 + 100s), Watch::Verdict::progressing);
  np.forget("c");
  EXPECT_EQ(np.check({"a", "b"}, t0 + 100s), Watch::Verdict::hung_now);
  EXPECT_EQ(np.check({}, t0 + 100s), Watch::Verdict::progressing);
}

TEST(NodeProgress, ReportsFromBeforeTheAttemptDoNotAgeIt) {
  NodeProgress np(10s, t0);
  np.on_report("a", 100s, t0 + 1s);  // idle longer than the attempt ran: it started at t0
  EXPECT_EQ(np.last_progress({"a"}, t0 + 2s), t0);
  EXPECT_EQ(np.check({"a"}, t0 + 9s), Watch::Verdict::progressing);
  EXPECT_EQ(np.check({"a"}, t0 + 10s), Watch::Verdict::hung_now);
}

// Random sample streams on several nodes of several ranks, every node reporting through its
// NodeReporter to one NodeProgress (delivered at once). Against the invariants:
//  - a rank's sample with output, or with a stack other than its previous one, is progress;
//    one with the same stack inside torch.distributed and no output never is;
//  - the node's and the job's verdict is hung exactly when their true idle time (from the
//    progress the samples showed) reaches the timeout: never early, never missed;
//  - hung_now once per episode; an episode ends only with progress.
TEST(Invariants, RandomSampleStreams) {
  std::mt19937 rng(24);
  const std::vector<std::vector<Frame>> stacks{kAllReduce, kSleep, kMatmul, {}};
  int job_hangs = 0, job_resumes = 0;  // the streams must reach both sides of every invariant
  for (int trial = 0; trial < 300; ++trial) {
    const Millis timeout = Millis(8000 + rng() % 20'000);
    const Millis interval = sample_interval(timeout);
    const int nnodes = 1 + static_cast<int>(rng() % 3), nranks = 1 + static_cast<int>(rng() % 4);
    const int busy_percent = static_cast<int>(rng() % 30);  // how often a rank progresses
    std::vector<std::string> names;
    std::vector<RankProgress> node;
    std::vector<NodeReporter> reporter;
    for (int n = 0; n < nnodes; ++n) {
      names.push_back("n" + std::to_string(n));
      node.emplace_back(timeout, nranks, t0);
      reporter.emplace_back(timeout);
    }
    NodeProgress job(timeout, t0);
    std::vector<std::vector<Sample>> previous(static_cast<std::size_t>(nnodes),
                                              std::vector<Sample>(static_cast<std::size_t>(nranks)));
    std::vector<std::vector<bool>> has_previous(static_cast<std::size_t>(nnodes),
                                                std::vector<bool>(static_cast<std::size_t>(nranks)));
    std::vector<TimePoint> node_truth(static_cast<std::size_t>(nnodes), t0);
    TimePoint truth = t0;
    bool job_hung = false;
    std::vector<bool> node_hung(static_cast<std::size_t>(nnodes), false);
    for (int step = 1; step <= 120; ++step) {
      const TimePoint now = t0 + step * interval;
      for (int n = 0; n < nnodes; ++n) {
        const auto ni = static_cast<std::size_t>(n);
        for (int r = 0; r < nranks; ++r) {
          const auto ri = static_cast<std::size_t>(r);
          Sample s;
          if (has_previous[ni][ri] && static_cast<int>(rng() % 100) >= busy_percent) {
            s = previous[ni][ri];  // the same place, CPU spinning only inside a collective
            s.when = now;
            s.output = false;
            if (s.in_torch_distributed && s.cpu_ticks) *s.cpu_ticks += rng() % 200;
          } else {
            const auto& st = stacks[rng() % stacks.size()];
            s = sample(r, now, st, rng() % 1000, rng() % 4 == 0);
            if (st.empty() && rng() % 2) s.stack.reset();
          }
          const Why why = node[ni].on_sample(s);
          if (s.output) EXPECT_EQ(why, Why::output);
          if (has_previous[ni][ri]) {
            const auto& p = previous[ni][ri];
            if (!s.output && s.stack && p.stack && *s.stack != *p.stack) EXPECT_EQ(why, Why::stack_changed);
            if (!s.output && s.stack == p.stack && s.in_torch_distributed) EXPECT_EQ(why, Why::none);
          }
          if (why != Why::none) node_truth[ni] = truth = std::max(truth, now);
          previous[ni][ri] = s;
          has_previous[ni][ri] = true;
        }
        EXPECT_EQ(node[ni].watch().last_progress(), node_truth[ni]);
        const auto v = node[ni].watch().check(now);
        const bool should = now - node_truth[ni] >= timeout;
        EXPECT_EQ(v != Watch::Verdict::progressing, should);
        if (v == Watch::Verdict::hung_now) EXPECT_FALSE(node_hung[ni]);
        if (v == Watch::Verdict::still_hung) EXPECT_TRUE(node_hung[ni]);
        node_hung[ni] = should;
        if (auto idle = reporter[ni].update(node[ni].watch(), now)) job.on_report(names[ni], *idle, now);
        EXPECT_EQ(reporter[ni].idle(), now - node_truth[ni] >= timeout / 2);
      }
      const auto v = job.check(names, now);
      const bool should = now - truth >= timeout;
      EXPECT_EQ(v != Watch::Verdict::progressing, should) << "trial " << trial << " step " << step;
      if (v == Watch::Verdict::hung_now) EXPECT_FALSE(job_hung);
      if (v == Watch::Verdict::still_hung) EXPECT_TRUE(job_hung);
      job_hangs += v == Watch::Verdict::hung_now;
      job_resumes += job_hung && !should;
      job_hung = should;
    }
  }
  EXPECT_GT(job_hangs, 100);
  EXPECT_GT(job_resumes, 50);
}

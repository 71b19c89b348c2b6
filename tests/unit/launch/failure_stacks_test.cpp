// The stacks of a failure report: bounds on what a job's memory can make us carry and print, the
// wire form between shepherd, agent and coordinator, the report's lines, and the snapshot's
// time budget and skip (a reader that blocks stands for a target whose memory is slow to read).
#include "attempt/failure_stacks.hpp"
#include "attempt/report.hpp"
#include "launch/stack_snapshot.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <boost/asio/io_context.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <stop_token>

using namespace ddp::launch;
namespace stacks = ddp::stacks;

namespace {

stacks::Frame py(std::string fn, std::string file, int line) {
  return {stacks::Frame::Kind::python, fn, file, line, 0};
}

stacks::RankStacks rank_in(int rank, std::vector<stacks::Frame> frames, std::string node = "") {
  stacks::RankStacks r;
  r.rank = rank;
  r.node = std::move(node);
  r.stacks.pid = 1000 + rank;
  r.stacks.python = "3.11.2";
  r.stacks.python_ok = true;
  stacks::ThreadStack t;
  t.tid = r.stacks.pid;
  t.name = "python3";
  t.main = true;
  t.python = std::move(frames);
  r.stacks.threads.push_back(std::move(t));
  return r;
}

const std::string kC10d = "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py";

std::vector<stacks::Frame> in_all_reduce() {
  return {py("all_reduce", kC10d, 1320), py("step", "/w/train.py", 42), py("<module>", "/w/train.py", 60)};
}

}  // namespace

TEST(FailureStacks, SummaryNamesTheCollectiveAndTheJobsOwnFrame) {
  FailureStacks s;
  s.ranks = {rank_in(0, in_all_reduce()), rank_in(2, in_all_reduce()), rank_in(3, in_all_reduce())};
  const auto lines = summary_lines(s);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "ranks 0,2,3 were in all_reduce (distributed_c10d.py:1320) <- step (train.py:42)");
}

TEST(FailureStacks, TheOddRankComesFirstAndARankWithoutStacksSaysWhy) {
  FailureStacks s;
  s.ranks = {rank_in(0, in_all_reduce()),
             rank_in(1, {py("load_batch", "/w/train.py", 12), py("step", "/w/train.py", 40)}),
             rank_in(2, in_all_reduce())};
  stacks::RankStacks shell;
  shell.rank = 3;
  shell.stacks.python = "not a Python process: only native stacks are available (--native)";
  s.ranks.push_back(shell);
  s.notes.push_back("rank 4: not read within the 2s given to the stacks");
  const auto lines = summary_lines(s);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0], "rank 1 was in load_batch (train.py:12) <- step (train.py:40)");
  EXPECT_EQ(lines[1], "rank 3: no stack (not a Python process: only native stacks are available (--native))");
  EXPECT_EQ(lines[2], "ranks 0,2 were in all_reduce (distributed_c10d.py:1320) <- step (train.py:42)");
  EXPECT_EQ(lines[3], "rank 4: not read within the 2s given to the stacks");
}

TEST(FailureStacks, TheTerminalGetsAFewGroupsAndTheFileGetsEveryThread) {
  FailureStacks s;
  for (int r = 0; r < 20; ++r) s.ranks.push_back(rank_in(r, {py("f" + std::to_string(r), "/w/t.py", r + 1)}));
  const auto lines = summary_lines(s);
  ASSERT_EQ(lines.size(), kSummaryGroups + 1);
  EXPECT_EQ(lines.back(), "... and 14 more groups");
  const auto text = full_text(s, 20);
  for (int r = 0; r < 20; ++r) EXPECT_NE(text.find("f" + std::to_string(r) + " (/w/t.py:"), std::string::npos) << r;
}

TEST(FailureStacks, WhatTheJobsMemorySaysIsBounded) {
  stacks::ProcessStacks p;
  p.python = "3.11.2";
  for (int t = 0; t < 40; ++t) {
    stacks::ThreadStack th;
    th.tid = t + 1;
    th.main = t == 0;
    th.name = "\x1b[31mred";
    for (int f = 0; f < 100; ++f) th.python.push_back(py(std::string(1000, 'x') + "\xff\xfe", "/f.py", f));
    p.threads.push_back(std::move(th));
  }
  p.threads.push_back({});  // no frames: dropped
  bound_stacks(p);
  ASSERT_EQ(p.threads.size(), kMaxStackThreads);
  EXPECT_EQ(p.threads[0].python.size(), kMaxStackFrames);
  EXPECT_TRUE(p.threads[0].truncated);
  EXPECT_LE(p.threads[0].python[0].function.size(), kMaxStackString);
  EXPECT_EQ(p.threads[0].name, "?[31mred");                                       // no escape reaches a terminal
  EXPECT_NO_THROW((void)nlohmann::json(p.threads[0].python[0].function).dump());  // valid UTF-8

  // And on the wire: one node's stacks stay under kMaxWireBytes, the rest named.
  FailureStacks s;
  for (int r = 0; r < 12; ++r) s.ranks.push_back({r, "", p});
  const auto wire = to_wire(s);
  EXPECT_LE(wire.dump().size(), kMaxWireBytes + 4096);
  const auto back = from_wire(wire, "n2");
  EXPECT_LT(back.ranks.size(), 12u);
  ASSERT_FALSE(back.ranks.empty());  // a large rank keeps its main thread rather than nothing
  EXPECT_EQ(back.ranks[0].stacks.threads.size(), 1u);
  EXPECT_TRUE(back.ranks[0].stacks.threads[0].main);
  ASSERT_FALSE(back.notes.empty());
  EXPECT_NE(back.notes.back().find("left out"), std::string::npos);
}

TEST(FailureStacks, ANegativeLineIsBoundedToZero) {
  stacks::ProcessStacks p;
  stacks::ThreadStack t;
  t.main = true;
  t.python = {py("wait", "/w/t.py", -1)};
  p.threads.push_back(t);
  bound_stacks(p);
  EXPECT_EQ(p.threads.at(0).python.at(0).line, 0);
}

TEST(FailureStacks, WireRoundTripNamesTheSendersNodeAndIsStrict) {
  FailureStacks s;
  s.ranks = {rank_in(2, in_all_reduce(), "liar")};
  s.notes = {"rank 3: not read"};
  s.file = "/logs/j/attempt-0/stacks.txt";
  const auto back = from_wire(nlohmann::json::parse(to_wire(s).dump()), "n2");
  ASSERT_EQ(back.ranks.size(), 1u);
  EXPECT_EQ(back.ranks[0].node, "n2");  // the receiver's name for the sender, not the sender's word
  EXPECT_EQ(back.ranks[0].rank, 2);
  EXPECT_EQ(back.ranks[0].stacks.threads.at(0).python, in_all_reduce());
  EXPECT_EQ(back.notes, s.notes);
  EXPECT_EQ(back.file, s.file);
  EXPECT_EQ(from_wire(to_wire(s)).ranks[0].node, "liar");  // our own shepherd's: kept

  auto bad = to_wire(s);
  bad["ranks"][0]["threads"][0]["python"][0]["line"] = "42";
  EXPECT_THROW(from_wire(bad, "n2"), std::invalid_argument);
  bad = to_wire(s);
  bad["ranks"][0]["rank"] = -1;
  EXPECT_THROW(from_wire(bad, "n2"), std::invalid_argument);
  bad = to_wire(s);
  bad.erase("notes");
  EXPECT_THROW(from_wire(bad, "n2"), std::invalid_argument);
}

TEST(FailureStacks, TheReportSaysWhereTheOthersWereWhenARankFailed) {
  AttemptReport a;
  a.phase = Phase::failed;
  WorkerExit e{1, 1, 4242, 3, 0, SysTime{}};
  a.first_failure = RankFailure{e, "vm", {}, std::nullopt, "/l/rank-1.log"};
  a.stacks = FailureStacks{{rank_in(0, in_all_reduce()), rank_in(2, in_all_reduce())}, {}, "/l/stacks.txt"};
  const auto text = format_attempt(a, 0);
  EXPECT_NE(text.find("while rank 1 exited with code 3, the ranks still running were:\n"
                      "    ranks 0,2 were in all_reduce (distributed_c10d.py:1320) <- step (train.py:42)\n"
                      "  every thread's stack: /l/stacks.txt\n"),
            std::string::npos)
      << text;
  JobReport r{"job", "failed", 1, 0, {a}};
  const auto j = to_json(r);
  EXPECT_EQ(j["attempts"][0]["stacks"]["groups"][0]["ranks"], nlohmann::json({0, 2}));
  EXPECT_EQ(j["attempts"][0]["stacks"]["file"], "/l/stacks.txt");

  a.first_failure.reset();
  a.phase = Phase::stopped;
  EXPECT_NE(format_attempt(a, 0).find("when the attempt was stopped, its ranks were:\n"), std::string::npos);
  a.stacks.reset();
  EXPECT_TRUE(to_json(JobReport{"job", "stopped", 130, 0, {a}})["attempts"][0]["stacks"].is_null());
}

// The standing coordinator sends the whole report in one job_result frame (1 MiB): each
// attempt's full stacks (up to 256 KiB per node) would make it too large to send at all.
TEST(FailureStacks, AJobResultMessageCarriesTheLinesNotTheGroups) {
  stacks::ProcessStacks p;
  p.python = "3.11.2";
  p.python_ok = true;
  for (int t = 0; t < 8; ++t) {
    stacks::ThreadStack th;
    th.tid = t + 1;
    th.main = t == 0;
    for (int f = 0; f < 64; ++f)
      th.python.push_back(py("f" + std::to_string(t * 100 + f) + std::string(200, 'x'), "/w/t.py", f));
    p.threads.push_back(std::move(th));
  }
  JobReport r{"job", "failed", 1, 5, {}};
  for (int at = 0; at < 40; ++at) {
    AttemptReport a;
    a.attempt = at;
    a.phase = Phase::failed;
    FailureStacks s;
    for (int rank = 0; rank < 64; ++rank) {
      s.ranks.push_back({rank, "n" + std::to_string(rank / 8), p});
      s.ranks.back().stacks.threads[0].python[0].function = "odd" + std::to_string(rank) + std::string(600, 'y');
    }
    for (int n = 0; n < 30; ++n)
      s.notes.push_back(fmt::format("n{}: rank {}: not read within the 2s given to the stacks", n, n));
    s.file = fmt::format("/l/attempt-{}/stacks.txt", at);
    a.stacks = std::move(s);
    r.attempts.push_back(std::move(a));
  }
  const auto full = to_json(r).dump();
  EXPECT_GT(full.size(), 1u << 20);  // what --result-json keeps (a file), too large for a frame
  const auto msg = to_json(r, StacksDetail::kSummary);
  EXPECT_LT(msg.dump().size(), 512u << 10);
  const auto& last = msg["attempts"][39]["stacks"];
  EXPECT_FALSE(last.contains("groups"));
  EXPECT_EQ(last["file"], "/l/attempt-39/stacks.txt");
  ASSERT_EQ(last["summary"].size(), kSummaryMessageLines);
  EXPECT_EQ(last["summary"].back(), "... and 22 more lines (the file has them)");
  for (const auto& l : last["summary"]) EXPECT_LE(l.get<std::string>().size(), kMaxStackString);
  EXPECT_TRUE(msg["attempts"][0]["stacks"]["summary"].empty());  // the oldest: the file only
  EXPECT_EQ(msg["attempts"][0]["stacks"]["file"], "/l/attempt-0/stacks.txt");
}

// A node's stacks name only the ranks it holds: another node's rank (or one twice) is dropped.
TEST(FailureStacks, ANodeSpeaksOnlyForItsOwnRanks) {
  FailureStacks s;
  s.ranks = {rank_in(3, in_all_reduce()), rank_in(4, in_all_reduce()), rank_in(4, in_all_reduce()),
             rank_in(0, in_all_reduce()), rank_in(8, in_all_reduce())};
  keep_own_ranks(s, 4, 4);
  ASSERT_EQ(s.ranks.size(), 1u);
  EXPECT_EQ(s.ranks[0].rank, 4);
  ASSERT_EQ(s.notes.size(), 1u);
  EXPECT_EQ(s.notes[0], "4 ranks it does not hold (ranks 4-7 are its) were left out");
  // One rank on the node, one foreign rank: said in the singular, not "ranks 2-2".
  FailureStacks one;
  one.ranks = {rank_in(2, in_all_reduce()), rank_in(5, in_all_reduce())};
  keep_own_ranks(one, 2, 1);
  ASSERT_EQ(one.notes.size(), 1u);
  EXPECT_EQ(one.notes[0], "1 rank it does not hold (rank 2 is its) was left out");
}

// A reader that blocks until released: a target whose memory cannot be read quickly.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  void release() {
    std::lock_guard l(mu);
    open = true;
    cv.notify_all();
  }
};

// The fake pids below are nobody's: their start time is said to stay the same.
std::optional<unsigned long long> same_start(pid_t) {
  return 1;
}

TEST(StackSnapshot, ReadsEveryTargetAndSaysSoOnTheLoop) {
  boost::asio::io_context io;
  std::optional<FailureStacks> got;
  StackSnapshot snap(
      io, {{0, "", 10}, {2, "", 12}}, std::chrono::seconds(30), [&](FailureStacks s) { got = std::move(s); },
      [](pid_t pid, std::stop_token) {
        stacks::ProcessStacks p;
        p.pid = pid;
        return p;
      },
      same_start);
  EXPECT_FALSE(got);  // never from inside the constructor
  io.run();
  ASSERT_TRUE(got);
  ASSERT_EQ(got->ranks.size(), 2u);
  EXPECT_EQ(got->ranks[1].stacks.pid, 12);
  EXPECT_TRUE(got->notes.empty());
}

TEST(StackSnapshot, ABlockedReadCostsTheBudgetAndNoMore) {
  boost::asio::io_context io;
  auto gate = std::make_shared<Gate>();
  std::optional<FailureStacks> got;
  const auto t0 = std::chrono::steady_clock::now();
  StackSnapshot snap(
      io, {{0, "", 10}, {1, "", 11}, {2, "", 12}}, std::chrono::milliseconds(200),
      [&](FailureStacks s) { got = std::move(s); },
      [gate](pid_t pid, std::stop_token) {
        stacks::ProcessStacks p;
        p.pid = pid;
        if (pid == 11) {
          std::unique_lock l(gate->mu);
          gate->cv.wait(l, [&] { return gate->open; });
        }
        return p;
      },
      same_start);
  io.run();
  const auto took = std::chrono::steady_clock::now() - t0;
  gate->release();  // the detached reader ends (it holds its own state, not ours)
  ASSERT_TRUE(got);
  EXPECT_GE(took, std::chrono::milliseconds(200));
  EXPECT_LT(took, std::chrono::seconds(5));
  ASSERT_EQ(got->ranks.size(), 1u);
  EXPECT_EQ(got->ranks[0].rank, 0);
  ASSERT_EQ(got->notes.size(), 1u);
  EXPECT_EQ(got->notes[0], "ranks 1,2: not read within the 200ms given to the stacks");
}

// The end of the wait reaches a read still going: the reader is asked to stop (the walk checks
// once per frame), so a slow target does not keep root's thread reading on unseen.
TEST(StackSnapshot, TheEndOfTheWaitStopsTheReadItself) {
  struct Seen {
    std::mutex mu;
    std::condition_variable_any cv;
    bool stopped = false;
  };
  boost::asio::io_context io;
  auto seen = std::make_shared<Seen>();
  std::optional<FailureStacks> got;
  StackSnapshot snap(
      io, {{0, "", 10}}, std::chrono::milliseconds(50), [&](FailureStacks s) { got = std::move(s); },
      [seen](pid_t pid, std::stop_token stop) {
        std::unique_lock l(seen->mu);
        seen->cv.wait_for(l, stop, std::chrono::seconds(10), [] { return false; });  // reads until asked to stop
        seen->stopped = stop.stop_requested();
        seen->cv.notify_all();
        stacks::ProcessStacks p;
        p.pid = pid;
        return p;
      },
      same_start);
  io.run();
  ASSERT_TRUE(got);
  EXPECT_EQ(got->notes.size(), 1u);
  std::unique_lock l(seen->mu);
  EXPECT_TRUE(seen->cv.wait_for(l, std::chrono::seconds(5), [&] { return seen->stopped; }));
}

TEST(StackSnapshot, SkipEndsTheWaitAtOnce) {
  boost::asio::io_context io;
  auto gate = std::make_shared<Gate>();
  std::optional<FailureStacks> got;
  auto snap = std::make_unique<StackSnapshot>(
      io, std::vector<StackSnapshot::Target>{{0, "", 10}}, std::chrono::hours(1),
      [&](FailureStacks s) { got = std::move(s); },
      [gate](pid_t pid, std::stop_token) {
        std::unique_lock l(gate->mu);
        gate->cv.wait(l, [&] { return gate->open; });
        stacks::ProcessStacks p;
        p.pid = pid;
        return p;
      },
      same_start);
  EXPECT_TRUE(snap->pending());
  snap->skip("skipped: a second Ctrl-C");
  ASSERT_TRUE(got);  // at once, from skip() itself
  EXPECT_FALSE(snap->pending());
  EXPECT_EQ(got->notes.at(0), "rank 0: skipped: a second Ctrl-C");
  snap.reset();  // destroyed while its reader still blocks
  io.run();      // nothing left to wait for: the loop does not wait on the reader
  gate->release();
}

// The reader reads /proc/<pid> by number while the loop reaps: a rank whose start time changed
// (its pid is someone else's now) or vanished during the read is not kept, and is named.
TEST(StackSnapshot, ARankThatExitedDuringTheReadIsNotKept) {
  boost::asio::io_context io;
  std::optional<FailureStacks> got;
  auto calls = std::make_shared<std::atomic<int>>(0);
  StackSnapshot snap(
      io, {{0, "", 10}, {1, "", 11}, {2, "", 12}}, std::chrono::seconds(30),
      [&](FailureStacks s) { got = std::move(s); },
      [](pid_t pid, std::stop_token) {
        stacks::ProcessStacks p;
        p.pid = pid;
        return p;
      },
      [calls](pid_t pid) -> std::optional<unsigned long long> {
        if (pid == 11) return (*calls)++ == 0 ? 100 : 200;  // reused: another process's start time after the read
        if (pid == 12) return std::nullopt;                 // gone before the read began
        return 1;
      });
  io.run();
  ASSERT_TRUE(got);
  ASSERT_EQ(got->ranks.size(), 1u);
  EXPECT_EQ(got->ranks[0].rank, 0);
  ASSERT_EQ(got->notes.size(), 1u);
  EXPECT_EQ(got->notes[0], "ranks 1,2: exited during the read (what was read is not kept)");
}

TEST(StackSnapshot, TheStartTimeIsThePidsOwn) {
  const auto mine = process_start_time(::getpid());
  ASSERT_TRUE(mine);
  EXPECT_EQ(process_start_time(::getpid()), mine);
  EXPECT_FALSE(process_start_time(0));
}

// A completion already queued when the snapshot goes (cancel() cannot take it back) must not
// reach the object now at its address: here a new snapshot, which it would end at once.
TEST(StackSnapshot, ACompletionQueuedBeforeItWentDoesNothing) {
  boost::asio::io_context io;
  auto gate = std::make_shared<Gate>();
  auto blocked = [gate](pid_t pid, std::stop_token) {
    std::unique_lock l(gate->mu);
    gate->cv.wait(l, [&] { return gate->open; });
    stacks::ProcessStacks p;
    p.pid = pid;
    return p;
  };
  std::optional<StackSnapshot> snap;
  int first_done = 0, second_done = 0;
  boost::asio::steady_timer before(io);
  before.expires_at(std::chrono::steady_clock::now() - std::chrono::seconds(1));  // ready ahead of the snapshot's
  snap.emplace(
      io, std::vector<StackSnapshot::Target>{{0, "", 10}}, std::chrono::milliseconds(0),
      [&](FailureStacks) { ++first_done; }, blocked, same_start);
  before.async_wait([&](boost::system::error_code) {
    // The snapshot's zero budget has run out too: its completion is queued behind this one.
    snap.reset();
    snap.emplace(
        io, std::vector<StackSnapshot::Target>{{1, "", 11}}, std::chrono::hours(1),
        [&](FailureStacks) { ++second_done; }, blocked, same_start);
  });
  io.poll();
  EXPECT_EQ(first_done, 0);
  EXPECT_EQ(second_done, 0);
  EXPECT_TRUE(snap->pending());
  snap.reset();
  gate->release();
}

// No thread to read on (EAGAIN: RLIMIT_NPROC) must not throw out of a stop: the stop goes on,
// the report says why there are no stacks. Root ignores RLIMIT_NPROC, so a child drops to nobody.
TEST(StackSnapshot, NoThreadToReadOnIsSaidNotThrown) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to become another user";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int code = 0;
    try {
      const rlimit none{0, 0};
      if (::setgid(65534) != 0 || ::setuid(65534) != 0 || ::setrlimit(RLIMIT_NPROC, &none) != 0) ::_exit(10);
      boost::asio::io_context io;
      std::optional<FailureStacks> got;
      StackSnapshot snap(
          io, {{0, "", 10}}, std::chrono::hours(1), [&](FailureStacks s) { got = std::move(s); },
          [](pid_t, std::stop_token) { return stacks::ProcessStacks{}; }, same_start);
      io.run();
      code = got && got->notes.size() == 1 && got->notes[0] == "rank 0: not read: cannot start a thread" ? 0 : 11;
    } catch (...) {
      code = 12;  // the old code: std::system_error out of the constructor
    }
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: could not drop to nobody; 11: wrong note; 12: threw";
}

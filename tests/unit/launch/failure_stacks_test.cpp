// The stacks of a failure report: bounds on what a job's memory can make us carry and print, the
// wire form between shepherd, agent and coordinator, the report's lines, and the snapshot's
// time budget and skip (a reader that blocks stands for a target whose memory is slow to read).
#include "launch/failure_stacks.hpp"
#include "launch/report.hpp"
#include "launch/stack_snapshot.hpp"

#include <boost/asio/io_context.hpp>
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>

using namespace ddp::launch;
namespace stacks = ddp::stacks;

namespace {

stacks::Frame py(std::string fn, std::string file, int line) { return {stacks::Frame::Kind::python, fn, file, line, 0}; }

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
  s.ranks = {rank_in(0, in_all_reduce()), rank_in(1, {py("load_batch", "/w/train.py", 12), py("step", "/w/train.py", 40)}),
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
  EXPECT_EQ(p.threads[0].name, "?[31mred");  // no escape reaches a terminal
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

TEST(StackSnapshot, ReadsEveryTargetAndSaysSoOnTheLoop) {
  boost::asio::io_context io;
  std::optional<FailureStacks> got;
  StackSnapshot snap(io, {{0, "", 10}, {2, "", 12}}, std::chrono::seconds(30), [&](FailureStacks s) { got = std::move(s); },
                     [](pid_t pid) {
                       stacks::ProcessStacks p;
                       p.pid = pid;
                       return p;
                     });
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
  StackSnapshot snap(io, {{0, "", 10}, {1, "", 11}, {2, "", 12}}, std::chrono::milliseconds(200),
                     [&](FailureStacks s) { got = std::move(s); },
                     [gate](pid_t pid) {
                       stacks::ProcessStacks p;
                       p.pid = pid;
                       if (pid == 11) {
                         std::unique_lock l(gate->mu);
                         gate->cv.wait(l, [&] { return gate->open; });
                       }
                       return p;
                     });
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

TEST(StackSnapshot, SkipEndsTheWaitAtOnce) {
  boost::asio::io_context io;
  auto gate = std::make_shared<Gate>();
  std::optional<FailureStacks> got;
  auto snap = std::make_unique<StackSnapshot>(io, std::vector<StackSnapshot::Target>{{0, "", 10}}, std::chrono::hours(1),
                                              [&](FailureStacks s) { got = std::move(s); },
                                              [gate](pid_t pid) {
                                                std::unique_lock l(gate->mu);
                                                gate->cv.wait(l, [&] { return gate->open; });
                                                stacks::ProcessStacks p;
                                                p.pid = pid;
                                                return p;
                                              });
  EXPECT_TRUE(snap->pending());
  snap->skip("skipped: a second Ctrl-C");
  ASSERT_TRUE(got);  // at once, from skip() itself
  EXPECT_FALSE(snap->pending());
  EXPECT_EQ(got->notes.at(0), "rank 0: skipped: a second Ctrl-C");
  snap.reset();   // destroyed while its reader still blocks
  io.run();       // nothing left to wait for: the loop does not wait on the reader
  gate->release();
}

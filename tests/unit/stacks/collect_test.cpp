// The privilege-separated reader's caller (lib/stacks/collect.hpp) against hostile readers: a
// reply that is not JSON, nests without end, has the wrong shape, answers for another process,
// never ends, or never comes. Each costs one "not read" entry within the budget, and the reader
// process is gone afterwards. The reader here is a shell script standing in for the real one
// (CollectOptions::reader); the real one is exercised by tests/integration/stacks.
#include "stacks/collect.hpp"
#include "stacks/merge.hpp"
#include "stacks/reader.hpp"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

using namespace ddp::stacks;
using Clock = std::chrono::steady_clock;

namespace {

CollectOptions shell_reader(const std::string& script, std::chrono::milliseconds budget = std::chrono::seconds(10)) {
  CollectOptions o;
  o.native = true;
  o.budget = budget;
  o.reader = {"/bin/sh", "-c", script, "sh"};  // "--pid N ..." become $1...
  return o;
}

// Read by pid alone, as `ddpctl stacks --pid` reads: no start time to check.
std::vector<Target> by_pid(std::initializer_list<pid_t> pids) {
  std::vector<Target> out;
  for (pid_t p : pids) out.push_back({p, std::nullopt});
  return out;
}

std::string errors_of(const ProcessStacks& p) {
  std::string out;
  for (const auto& e : p.errors) out += e + "\n";
  return out;
}

ProcessStacks sample() {
  ProcessStacks p;
  p.pid = ::getpid();
  p.python = "3.11.2";
  p.python_ok = true;
  ThreadStack t;
  t.tid = ::getpid();
  t.main = true;
  t.name = "python3";
  t.python = {{Frame::Kind::python, "stuck_here", "/w/train.py", 12, 0}};
  t.native = {{Frame::Kind::native, "stuck_in_native_leaf", "target", 0, 17}};
  p.threads.push_back(t);
  p.errors = {"one"};
  p.timing.read_ms = 1.5;
  return p;
}

}  // namespace

TEST(Collect, ProcessJsonRoundTrips) {
  const auto p = sample();
  std::string error;
  auto back = process_from_json(to_json(p), error);
  ASSERT_TRUE(back) << error;
  EXPECT_EQ(back->pid, p.pid);
  ASSERT_EQ(back->threads.size(), 1u);
  EXPECT_EQ(back->threads[0].python, p.threads[0].python);
  EXPECT_EQ(back->threads[0].native, p.threads[0].native);
  EXPECT_EQ(back->errors, p.errors);
}

// A Python frame without a location (CPython's -1: a frozen module's frames while the
// interpreter starts) is a line 0, not a refused reply: refusing it cost the agent its shepherd
// and the job its processes (found by tests/integration/multinode/test_stacks_nodes.py).
TEST(Collect, AFrameWithoutALineIsLineZeroNotARefusal) {
  std::string error;
  auto j = to_json(sample());
  j["threads"][0]["python"][0]["line"] = -1;
  auto back = process_from_json(j, error);
  ASSERT_TRUE(back) << error;
  EXPECT_EQ(back->threads[0].python[0].line, 0);
  j["threads"][0]["python"][0]["line"] = 1LL << 40;
  back = process_from_json(j, error);
  ASSERT_TRUE(back) << error;
  EXPECT_EQ(back->threads[0].python[0].line, 1 << 30);
  j["threads"][0]["python"][0]["line"] = "7";
  EXPECT_FALSE(process_from_json(j, error));
}

TEST(Collect, ProcessJsonRejectsWrongShapes) {
  std::string error;
  auto j = to_json(sample());
  auto bad = j;
  bad["threads"][0]["python"][0]["function"] = 7;
  EXPECT_FALSE(process_from_json(bad, error));
  EXPECT_NE(error.find("function"), std::string::npos) << error;
  bad = j;
  bad["threads"][0]["tid"] = -1;
  EXPECT_FALSE(process_from_json(bad, error));
  bad = j;
  bad["errors"] = nlohmann::json::array({std::string(5000, 'x')});
  EXPECT_FALSE(process_from_json(bad, error));
  bad = j;
  bad["threads"][0]["python"] = nlohmann::json::array();
  for (int i = 0; i < 2000; ++i) bad["threads"][0]["python"].push_back(j["threads"][0]["python"][0]);
  EXPECT_FALSE(process_from_json(bad, error));
  EXPECT_NE(error.find("at most"), std::string::npos) << error;
  EXPECT_FALSE(process_from_text(std::string(100000, '[') + std::string(100000, ']'), error));
  EXPECT_NE(error.find("nests"), std::string::npos) << error;
}

TEST(Collect, ShrinkToFitCutsNativeThenThreads) {
  auto p = sample();
  for (int i = 0; i < 200; ++i) p.threads[0].native.push_back(p.threads[0].native[0]);
  ThreadStack other = p.threads[0];
  other.main = false;
  other.tid += 1;
  p.threads.push_back(other);
  const auto full = to_json(p).dump().size();
  shrink_to_fit(p, full - 1);
  EXPECT_TRUE(p.threads[0].native.empty());
  EXPECT_EQ(p.threads.size(), 2u);
  EXPECT_LE(to_json(p).dump().size(), full - 1);
  const auto without_native = to_json(p).dump().size();
  shrink_to_fit(p, without_native - 1);
  ASSERT_EQ(p.threads.size(), 1u);
  EXPECT_TRUE(p.threads[0].main);
  EXPECT_LE(to_json(p).dump().size(), without_native - 1);
}

TEST(Collect, GarbageReplyIsNotRead) {
  auto got = collect(by_pid({::getpid()}), shell_reader("printf 'not json at all'"));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].pid, ::getpid());
  EXPECT_TRUE(got[0].threads.empty());
  EXPECT_NE(errors_of(got[0]).find("no usable reply: it is not JSON"), std::string::npos) << errors_of(got[0]);
}

TEST(Collect, DeepNestingIsRefusedBeforeParsing) {
  auto got =
      collect(by_pid({::getpid()}), shell_reader("i=0; while [ $i -lt 20000 ]; do printf '['; i=$((i+1)); done"));
  EXPECT_NE(errors_of(got[0]).find("nests deeper"), std::string::npos) << errors_of(got[0]);
}

TEST(Collect, ReplyForAnotherProcessIsRefused) {
  auto other = to_json(sample());
  other["pid"] = 1;
  auto got = collect(by_pid({::getpid()}), shell_reader("printf '%s' '" + other.dump() + "'"));
  EXPECT_NE(errors_of(got[0]).find("another process"), std::string::npos) << errors_of(got[0]);
}

TEST(Collect, WellFormedReplyIsTaken) {
  auto got = collect(by_pid({::getpid()}), shell_reader("printf '%s' '" + to_json(sample()).dump() + "'"));
  ASSERT_EQ(got[0].threads.size(), 1u) << errors_of(got[0]);
  EXPECT_EQ(got[0].threads[0].native[0].function, "stuck_in_native_leaf");
}

TEST(Collect, EndlessReplyIsCutAtItsBound) {
  auto o = shell_reader("exec cat /dev/zero");
  o.max_reply_bytes = 1u << 20;
  const auto t0 = Clock::now();
  auto got = collect(by_pid({::getpid()}), o);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  EXPECT_NE(errors_of(got[0]).find("exceeded"), std::string::npos) << errors_of(got[0]);
}

// A reader that never answers is killed at the deadline, and reaped: no orphan is left.
TEST(Collect, HangingReaderIsKilledAtTheDeadline) {
  char path[] = "/tmp/collect_test_pid_XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  const auto t0 = Clock::now();
  // Two targets, two readers at once: both are stopped.
  auto got =
      collect(by_pid({::getpid(), ::getpid()}),
              shell_reader(std::string("echo $$ >> ") + path + "; exec sleep 1000", std::chrono::milliseconds(500)));
  const auto took = Clock::now() - t0;
  EXPECT_GE(took, std::chrono::milliseconds(500));
  EXPECT_LT(took, std::chrono::seconds(5));
  ASSERT_EQ(got.size(), 2u);
  for (const auto& p : got) EXPECT_NE(errors_of(p).find("time budget of 500 ms"), std::string::npos) << errors_of(p);
  std::ifstream in(path);
  int pid = 0, seen = 0;
  while (in >> pid) {
    ++seen;
    errno = 0;
    EXPECT_EQ(::kill(pid, 0), -1) << "reader " << pid << " still exists";
    EXPECT_EQ(errno, ESRCH);
  }
  EXPECT_EQ(seen, 2) << "the readers did not start (or wrote no pid) within the budget";
  std::remove(path);
}

TEST(Collect, PythonOnlyReadsInProcess) {
  CollectOptions o;
  o.reader = {"/bin/false"};  // never started for a Python-only read
  auto got = collect(by_pid({::getpid()}), o);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_FALSE(got[0].threads.empty()) << errors_of(got[0]);
  EXPECT_NE(got[0].python.find("not a Python process"), std::string::npos) << got[0].python;
}

// A pid is checked by its start time: the same process keeps it; a process that ended and was
// reaped does not (its pid may be another's by now); no start time checks nothing.
TEST(Collect, SameProcessIsTheStartTimeUnchanged) {
  const auto mine = process_start_time(::getpid());
  ASSERT_TRUE(mine);
  EXPECT_TRUE(same_process({::getpid(), mine}));
  EXPECT_FALSE(same_process({::getpid(), *mine + 1}));
  EXPECT_TRUE(same_process({::getpid(), std::nullopt}));
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  const auto started = process_start_time(child);  // a zombie until reaped: still its own
  ASSERT_TRUE(started);
  EXPECT_TRUE(same_process({child, started}));
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_FALSE(same_process({child, started}));
}

// A target whose start time is not its pid's any more is not read, by either way of reading,
// and says why; one whose start time holds is read as before.
TEST(Collect, APidThatChangedHandsIsNotRead) {
  const auto mine = process_start_time(::getpid());
  ASSERT_TRUE(mine);
  const std::vector<Target> other{{::getpid(), *mine + 1}};
  CollectOptions python;
  python.reader = {"/bin/false"};
  for (const auto& o : {python, shell_reader("printf '%s' '" + to_json(sample()).dump() + "'")}) {
    auto got = collect(other, o);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].pid, ::getpid());
    EXPECT_TRUE(got[0].threads.empty());
    EXPECT_EQ(got[0].python, "not read");
    EXPECT_EQ(errors_of(got[0]), "the process ended before it was read (its pid may be another process's now)\n");
  }
  auto same = collect({{::getpid(), mine}}, python);
  ASSERT_EQ(same.size(), 1u);
  EXPECT_FALSE(same[0].threads.empty()) << errors_of(same[0]);
}

// The native reader is given the start time, and its "not the process asked for" (exit 4) is
// said as the process having ended.
TEST(Collect, TheReaderIsGivenTheStartTimeToCheck) {
  const auto mine = process_start_time(::getpid());
  ASSERT_TRUE(mine);
  const std::string reply = to_json(sample()).dump();
  auto got =
      collect({{::getpid(), mine}}, shell_reader("[ \"$3\" = --start-time ] && [ \"$4\" = " + std::to_string(*mine) +
                                                 " ] && printf '%s' '" + reply + "'"));
  ASSERT_EQ(got[0].threads.size(), 1u) << errors_of(got[0]);
  got = collect({{::getpid(), mine}}, shell_reader("exit 4"));
  EXPECT_EQ(errors_of(got[0]), "the process ended before it was read (its pid may be another process's now)\n");
}

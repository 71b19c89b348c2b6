#include "shepherd/messages.hpp"

#include <gtest/gtest.h>

using namespace ddp;
using namespace ddp::shepherd;
using nlohmann::json;

namespace {

StartAttempt sample_start() {
  StartAttempt s;
  s.attempt_dir = "/logs/j/attempt-2";
  s.options.attempt = 2;
  s.options.workdir = "/work";
  s.options.stop_grace = Millis(1500);
  s.options.log_max_bytes = 1u << 20;
  s.plan.job_id = "j";
  s.plan.world_size = 4;
  for (int i = 0; i < 2; ++i) {
    contract::RankPlan r;
    r.rank = 2 + i;
    r.local_rank = i;
    r.node = "n2";
    r.argv = {"python3", "train.py", "--x"};
    r.env = {{"RANK", std::to_string(2 + i)}, {"PATH", "/usr/bin"}};
    r.log_file = "/logs/j/attempt-2/rank-" + std::to_string(2 + i) + ".log";
    r.error_file = "/logs/j/attempt-2/rank-" + std::to_string(2 + i) + ".error.json";
    r.binding = {{"gpu", i}};
    if (i == 1) {
      r.cpus = {0, 1};
      r.mem_node = 0;
    }
    s.plan.ranks.push_back(r);
  }
  return s;
}

// A message through its text form, as the peer reads it.
json wire(const json& m) {
  return json::parse(dump(m));
}

}  // namespace

TEST(ShepherdMessages, StartRoundTrips) {
  const auto s = sample_start();
  const auto m = wire(encode_start(s));
  EXPECT_EQ(message_type(m, Sender::agent), "start");
  const auto d = decode_start(m);
  EXPECT_EQ(d.attempt_dir, s.attempt_dir);
  EXPECT_EQ(d.options.attempt, 2);
  EXPECT_EQ(d.options.workdir, "/work");
  EXPECT_EQ(d.options.stop_grace, Millis(1500));
  EXPECT_EQ(d.options.log_max_bytes, 1u << 20);
  EXPECT_EQ(d.plan.job_id, "j");
  EXPECT_EQ(d.plan.world_size, 4);
  ASSERT_EQ(d.plan.ranks.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    const auto &a = s.plan.ranks[i], &b = d.plan.ranks[i];
    EXPECT_EQ(a.rank, b.rank);
    EXPECT_EQ(a.local_rank, b.local_rank);
    EXPECT_EQ(a.node, b.node);
    EXPECT_EQ(a.argv, b.argv);
    EXPECT_EQ(a.env, b.env);
    EXPECT_EQ(a.log_file, b.log_file);
    EXPECT_EQ(a.error_file, b.error_file);
    EXPECT_EQ(a.binding, b.binding);
    EXPECT_EQ(a.cpus, b.cpus);
    EXPECT_EQ(a.mem_node, b.mem_node);
  }
}

TEST(ShepherdMessages, ContainerRunRoundTrips) {
  auto s = sample_start();
  s.plan.ranks[1].container = ddp::contract::ContainerRun{
      "podman", "img:1", "ddpctl-j-a2-r1", "/logs/rank-1.env", {{"RANK", "1"}, {"HF_HOME", "/data"}}};
  const auto d = decode_start(wire(encode_start(s)));
  EXPECT_FALSE(d.plan.ranks[0].container);
  ASSERT_TRUE(d.plan.ranks[1].container);
  const auto& c = *d.plan.ranks[1].container;
  EXPECT_EQ(c.runtime, "podman");
  EXPECT_EQ(c.image, "img:1");
  EXPECT_EQ(c.name, "ddpctl-j-a2-r1");
  EXPECT_EQ(c.env_file, "/logs/rank-1.env");
  EXPECT_EQ(c.env, s.plan.ranks[1].container->env);
  auto bad = encode_start(s);
  bad["plan"]["ranks"][1]["container"]["runtime"] = "lxc";
  EXPECT_THROW(decode_start(bad), MessageError);
}

TEST(ShepherdMessages, RunAsRoundTripsAndIsAbsentByDefault) {
  auto s = sample_start();
  EXPECT_FALSE(decode_start(wire(encode_start(s))).options.run_as);
  s.options.run_as = supervisor::RunAs{1001, 1002, {1002, 27, 44}};
  const auto d = decode_start(wire(encode_start(s)));
  ASSERT_TRUE(d.options.run_as);
  EXPECT_EQ(d.options.run_as->uid, 1001u);
  EXPECT_EQ(d.options.run_as->gid, 1002u);
  EXPECT_EQ(d.options.run_as->groups, (std::vector<gid_t>{1002, 27, 44}));
  auto bad = encode_start(s);
  bad["options"]["run_as"]["uid"] = -1;
  EXPECT_THROW(decode_start(bad), MessageError);
  bad = encode_start(s);
  bad["options"]["run_as"]["uid"] = 4294967295ll;  // (uid_t)-1: "leave unchanged" to setuid
  EXPECT_THROW(decode_start(bad), MessageError);
  bad = encode_start(s);
  bad["options"]["run_as"]["groups"] = {"wheel"};
  EXPECT_THROW(decode_start(bad), MessageError);
}

TEST(ShepherdMessages, LogRootRoundTripsAndIsEmptyByDefault) {
  auto s = sample_start();
  EXPECT_EQ(decode_start(wire(encode_start(s))).options.log_root, "");
  s.options.log_root = "/logs";
  EXPECT_EQ(decode_start(wire(encode_start(s))).options.log_root, "/logs");
  auto bad = encode_start(s);
  bad["options"]["log_root"] = 7;
  EXPECT_THROW(decode_start(bad), MessageError);
}

TEST(ShepherdMessages, BadStartsAreRefusedNamingTheField) {
  auto base = encode_start(sample_start());
  auto expect_error = [](json m, const std::string& needle) {
    try {
      decode_start(m);
      FAIL() << "accepted: " << m.dump();
    } catch (const MessageError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto m = base;
  m.erase("plan");
  expect_error(m, "missing field 'plan'");
  m = base;
  m["options"]["stop_grace_ms"] = "30s";
  expect_error(m, "field 'stop_grace_ms': expected an integer");
  m = base;
  m["options"]["stop_grace_ms"] = -1;
  expect_error(m, "out of range");
  m = base;
  m["plan"]["ranks"][0]["argv"] = json::array();
  expect_error(m, "empty command");
  m = base;
  m["plan"]["ranks"][0]["env"]["X"] = 3;
  expect_error(m, "X is not a string");
  m = base;
  m["plan"]["ranks"][1]["local_rank"] = 5;
  expect_error(m, "local ranks must count up from 0");
  m = base;
  m["plan"]["ranks"] = json::array();
  expect_error(m, "no rank to run");
  m = base;
  m["plan"]["ranks"][0]["cpus"] = {-1};
  expect_error(m, "CPU numbers");
}

TEST(ShepherdMessages, TypesAreCheckedBySender) {
  EXPECT_EQ(message_type(json{{"type", "stop"}, {"signal", 15}}, Sender::agent), "stop");
  EXPECT_THROW(message_type(json{{"type", "finished"}}, Sender::agent), MessageError);
  EXPECT_THROW(message_type(json{{"type", "start"}}, Sender::shepherd), MessageError);
  EXPECT_THROW(message_type(json::array(), Sender::agent), MessageError);
  EXPECT_THROW(message_type(json{{"type", 3}}, Sender::agent), MessageError);
  EXPECT_THROW(message_type(json{{"kind", "stop"}}, Sender::agent), MessageError);
}

TEST(ShepherdMessages, SignalsAreBounded) {
  EXPECT_EQ(decode_signal(wire(encode_signal("stop", 15))), 15);
  EXPECT_THROW(decode_signal(encode_signal("stop", 0)), MessageError);
  EXPECT_THROW(decode_signal(encode_signal("forward", 65)), MessageError);
}

TEST(ShepherdMessages, LinesKeepTheirStreamAndSurviveInvalidUtf8) {
  auto l = decode_line(wire(encode_line({3, supervisor::Stream::err, "loss 0.5"})));
  EXPECT_EQ(l.rank, 3);
  EXPECT_EQ(l.stream, supervisor::Stream::err);
  EXPECT_EQ(l.data, "loss 0.5");
  // A worker may print any bytes; the message must still be valid JSON.
  auto bad = decode_line(wire(encode_line({0, supervisor::Stream::out,
                                           std::string("a\xff"
                                                       "b")})));
  EXPECT_EQ(bad.data.front(), 'a');
  EXPECT_EQ(bad.data.back(), 'b');
  auto m = encode_line({0, supervisor::Stream::out, "x"});
  m["stream"] = "both";
  EXPECT_THROW(decode_line(m), MessageError);
  m["stream"] = "out";
  m["data"] = std::string(supervisor::kMaxLine + 1, 'x');
  EXPECT_THROW(decode_line(m), MessageError);
}

TEST(ShepherdMessages, StartedPids) {
  EXPECT_EQ(decode_started(wire(encode_started({10, 11}))), (std::vector<pid_t>{10, 11}));
  EXPECT_EQ(decode_started(wire(encode_started({0, 12}))), (std::vector<pid_t>{0, 12}));  // 0: did not start
  EXPECT_THROW(decode_started(encode_started({-1})), MessageError);
}

TEST(ShepherdMessages, FinishedReportRoundTrips) {
  launch::AttemptReport r;
  r.attempt = 1;
  r.started = launch::SysTime(std::chrono::microseconds(1'700'000'000'000'001));
  r.ended = launch::SysTime(std::chrono::microseconds(1'700'000'005'000'000));
  r.phase = launch::Phase::failed;
  launch::WorkerExit bad{3, 1, 4242, 7, 0, r.ended};
  launch::WorkerExit killed{2, 0, 4241, 0, 15, r.ended};
  launch::WorkerExit never{4, 2, -1, 0, 0, r.ended};
  never.started = false;
  r.exits = {killed, bad, never};
  r.notes = {"a note"};
  r.log_dir = "/l";
  r.first_failure =
      launch::RankFailure{bad, "n2", {"x", "y"}, launch::ErrorFile{"/l/e.json", "ValueError", "tb", ""}, "/l/r.log"};
  const auto m = wire(encode_finished(r));
  EXPECT_EQ(message_type(m, Sender::shepherd), "finished");
  const auto d = decode_finished(m);
  EXPECT_EQ(d.attempt, 1);
  EXPECT_EQ(d.started, r.started);
  EXPECT_EQ(d.ended, r.ended);
  EXPECT_EQ(d.phase, launch::Phase::failed);
  ASSERT_EQ(d.exits.size(), 3u);
  EXPECT_EQ(d.exits[0].signal, 15);
  EXPECT_EQ(d.exits[1].exit_code, 7);
  EXPECT_EQ(d.exits[1].pid, 4242);
  EXPECT_FALSE(d.exits[2].started);
  EXPECT_EQ(d.notes, r.notes);
  ASSERT_TRUE(d.first_failure);
  EXPECT_EQ(d.first_failure->exit.rank, 3);
  EXPECT_EQ(d.first_failure->node, "n2");
  EXPECT_EQ(d.first_failure->last_lines, (std::vector<std::string>{"x", "y"}));
  ASSERT_TRUE(d.first_failure->error_file);
  EXPECT_EQ(d.first_failure->error_file->message, "ValueError");
  EXPECT_EQ(d.first_failure->log_file, "/l/r.log");

  auto no_ff = r;
  no_ff.first_failure.reset();
  no_ff.phase = launch::Phase::succeeded;
  const auto d2 = decode_finished(wire(encode_finished(no_ff)));
  EXPECT_FALSE(d2.first_failure);
  EXPECT_EQ(d2.phase, launch::Phase::succeeded);

  EXPECT_FALSE(d.stacks);  // none taken: none sent
  auto with_stacks = r;
  stacks::RankStacks in_barrier{0, "n2", {}};
  in_barrier.stacks.python = "3.11.2";
  in_barrier.stacks.python_ok = true;
  in_barrier.stacks.threads.push_back(
      {101, "python3", true, {{stacks::Frame::Kind::python, "barrier", "/c10d.py", 7, 0}}, {}});
  with_stacks.stacks = launch::FailureStacks{{in_barrier}, {"rank 1: not read"}, "/l/stacks.txt"};
  const auto d3 = decode_finished(wire(encode_finished(with_stacks)));
  ASSERT_TRUE(d3.stacks);
  ASSERT_EQ(d3.stacks->ranks.size(), 1u);
  EXPECT_EQ(d3.stacks->ranks[0].stacks.threads.at(0).python.at(0).function, "barrier");
  EXPECT_EQ(d3.stacks->notes, with_stacks.stacks->notes);
  auto bad_stacks = encode_finished(with_stacks);
  bad_stacks["report"]["stacks"]["ranks"] = "all of them";
  EXPECT_THROW(decode_finished(bad_stacks), MessageError);

  auto m2 = encode_finished(r);
  m2["report"]["phase"] = 9;
  EXPECT_THROW(decode_finished(m2), MessageError);
  m2 = encode_finished(r);
  m2["report"]["exits"][0]["signal"] = 99;
  EXPECT_THROW(decode_finished(m2), MessageError);
}

// A frame without a location (the CPython reader's -1, or a co_firstlineno the job wrote) must
// not cost the attempt's report: it was refused, and the agent said "lost the shepherd" instead.
TEST(ShepherdMessages, FinishedReportKeepsAFrameWithoutALine) {
  launch::AttemptReport r;
  r.attempt = 0;
  r.phase = launch::Phase::failed;
  stacks::RankStacks nowhere{0, "", {}};
  nowhere.stacks.python = "3.11.2";
  nowhere.stacks.python_ok = true;
  nowhere.stacks.threads.push_back(
      {101, "python3", true, {{stacks::Frame::Kind::python, "wait", "/w/t.py", -1, 0}}, {}});
  r.stacks = launch::FailureStacks{{nowhere}, {}, ""};
  launch::AttemptReport d;
  ASSERT_NO_THROW(d = decode_finished(wire(encode_finished(r))));
  ASSERT_TRUE(d.stacks);
  EXPECT_EQ(d.stacks->ranks.at(0).stacks.threads.at(0).python.at(0).line, 0);

  auto m = encode_finished(r);  // an older sender's -1, or a line past the bound: clamped, not refused
  m["report"]["stacks"]["ranks"][0]["threads"][0]["python"][0]["line"] = -1;
  ASSERT_NO_THROW(d = decode_finished(wire(m)));
  EXPECT_EQ(d.stacks->ranks.at(0).stacks.threads.at(0).python.at(0).line, 0);
  m["report"]["stacks"]["ranks"][0]["threads"][0]["python"][0]["line"] = 1ull << 40;
  ASSERT_NO_THROW(d = decode_finished(wire(m)));
  EXPECT_EQ(d.stacks->ranks.at(0).stacks.threads.at(0).python.at(0).line, 1 << 30);
}

TEST(ShepherdMessages, StacksRequestAndReadRoundTrip) {
  StacksRequest q{7, {{0, 1}, true, Millis(2500)}};
  auto m = encode_stacks(q);
  EXPECT_EQ(message_type(m, Sender::agent), "stacks");
  auto d = decode_stacks(m);
  EXPECT_EQ(d.id, 7u);
  EXPECT_EQ(d.query.local_ranks, (std::vector<int>{0, 1}));
  EXPECT_TRUE(d.query.native);
  EXPECT_EQ(d.query.budget, Millis(2500));
  m["budget_ms"] = 0;
  EXPECT_THROW(decode_stacks(m), MessageError);

  StacksRead r;
  r.id = 7;
  stacks::RankStacks rs;
  rs.rank = 3;
  rs.stacks.pid = 42;
  rs.stacks.python = "3.11.2";
  stacks::ThreadStack t;
  t.tid = 42;
  t.main = true;
  t.python = {{stacks::Frame::Kind::python, "stuck_here", "/w/t.py", 9, 0}};
  rs.stacks.threads.push_back(t);
  r.ranks.push_back(rs);
  auto rm = encode_stacks_read(r);
  EXPECT_EQ(message_type(rm, Sender::shepherd), "stacks_read");
  auto back = decode_stacks_read(rm);
  ASSERT_EQ(back.ranks.size(), 1u);
  EXPECT_EQ(back.ranks[0].rank, 3);
  EXPECT_EQ(back.ranks[0].stacks.threads[0].python, t.python);
  // A process that is not of the reader's shape ends the conversation, naming the rank.
  rm["ranks"][0]["process"]["threads"][0]["tid"] = "x";
  try {
    decode_stacks_read(rm);
    FAIL() << "accepted";
  } catch (const MessageError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 3"), std::string::npos) << e.what();
  }
}

TEST(ShepherdMessages, HangTimeoutRoundTripsAndIsOffByDefault) {
  auto s = sample_start();
  EXPECT_EQ(decode_start(wire(encode_start(s))).options.hang_timeout, Millis(0));
  s.options.hang_timeout = Millis(5000);
  EXPECT_EQ(decode_start(wire(encode_start(s))).options.hang_timeout, Millis(5000));
  auto bad = encode_start(s);
  bad["options"]["hang_timeout_ms"] = 10;
  EXPECT_THROW(decode_start(bad), MessageError);
}

TEST(ShepherdMessages, ProgressRoundTripsBounded) {
  EXPECT_EQ(message_type(json{{"type", "progress"}}, Sender::shepherd), "progress");
  auto p = decode_progress(wire(encode_progress({Millis(2500), "rank 1 (1 of 4)\n  stuck (t.py:3)\n"})));
  EXPECT_EQ(p.idle, Millis(2500));
  EXPECT_EQ(p.stacks, "rank 1 (1 of 4)\n  stuck (t.py:3)\n");
  EXPECT_EQ(decode_progress(wire(encode_progress({Millis(0), ""}))).idle, Millis(0));
  EXPECT_THROW(decode_progress(encode_progress({Millis(-1), ""})), MessageError);
  EXPECT_THROW(decode_progress(encode_progress({Millis(1), std::string(kMaxProgressStacks + 1, 'x')})), MessageError);
  EXPECT_THROW(decode_progress(json{{"type", "progress"}, {"idle_ms", 5}}), MessageError);
}

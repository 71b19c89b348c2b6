// The coordinator's gathering of every node's stacks (stacks_gather.hpp) with fake agents: every
// rank asked for is in the answer; a node that does not answer by the deadline, one that is not
// asked (lost, older protocol), and one that answers for a rank it does not hold are said so.
#include "coordinator/stacks_gather.hpp"

#include "stacks/merge.hpp"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>

#include <chrono>

using namespace ddp;
using nlohmann::json;

namespace {

json process(int pid, const std::string& fn) {
  stacks::ProcessStacks p;
  p.pid = pid;
  p.python = "3.11.2";
  p.python_ok = true;
  stacks::ThreadStack t;
  t.tid = pid;
  t.main = true;
  t.python = {{stacks::Frame::Kind::python, fn, "/w/train.py", 3, 0}};
  p.threads.push_back(t);
  return stacks::to_json(p);
}

std::string errors(const json& rank) {
  std::string out;
  for (const auto& e : rank["process"]["errors"]) out += e.get<std::string>() + "\n";
  return out;
}

}  // namespace

TEST(StacksGather, EveryRankIsAnsweredAndASilentNodeIsNamed) {
  boost::asio::io_context io;
  coordinator::StacksGather g(io);
  std::vector<json> to_a, to_b;
  std::vector<coordinator::StacksGather::NodeAsk> asks(3);
  asks[0] = {"a", {0, 1}, {0, 1}, "", [&](json r) { to_a.push_back(r); }};
  asks[1] = {"b", {2, 3}, {0, 1}, "", [&](json r) { to_b.push_back(r); }};  // never answers
  asks[2] = {"c", {4}, {0}, "node c's agent speaks protocol 5 and cannot read stacks (version 6 can)", {}};
  std::optional<json> reply;
  const auto t0 = std::chrono::steady_clock::now();
  g.start(std::move(asks), false, Millis(50), 5, [&](json r) { reply = std::move(r); });
  ASSERT_EQ(to_a.size(), 1u);
  ASSERT_EQ(to_b.size(), 1u);
  EXPECT_EQ(to_a[0]["local_ranks"], json::array({0, 1}));
  EXPECT_EQ(to_a[0]["budget_ms"], 50);
  const auto id = to_a[0]["id"];
  g.on_stacks("a", {{"id", id}, {"rank", 0}, {"process", process(100, "stuck_here")}});
  g.on_stacks("a", {{"id", id}, {"rank", 7}, {"process", process(101, "not_yours")}});  // not a's: dropped
  g.on_stacks("a", {{"id", id}, {"rank", 1}, {"process", json{{"pid", "x"}}}});         // malformed
  g.on_done("a", {{"id", id}});
  EXPECT_FALSE(reply);  // b has not answered yet
  io.run();             // until the deadline
  ASSERT_TRUE(reply);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(50) + coordinator::StacksGather::kMargin);
  EXPECT_EQ((*reply)["world_size"], 5);
  const auto& ranks = (*reply)["ranks"];
  ASSERT_EQ(ranks.size(), 5u);
  for (int r = 0; r < 5; ++r) EXPECT_EQ(ranks[r]["rank"], r);
  EXPECT_EQ(ranks[0]["node"], "a");
  EXPECT_EQ(ranks[0]["process"]["threads"][0]["python"][0]["function"], "stuck_here");
  EXPECT_NE(errors(ranks[1]).find("node a sent a malformed answer"), std::string::npos) << ranks[1];
  EXPECT_NE(errors(ranks[2]).find("node b did not answer within 3050 ms"), std::string::npos) << ranks[2];
  EXPECT_EQ(ranks[3]["node"], "b");
  EXPECT_NE(errors(ranks[4]).find("protocol 5"), std::string::npos) << ranks[4];
}

TEST(StacksGather, AnswersAtOnceWhenEveryNodeIsDone) {
  boost::asio::io_context io;
  coordinator::StacksGather g(io);
  json sent;
  std::vector<coordinator::StacksGather::NodeAsk> asks(1);
  asks[0] = {"a", {0}, {0}, "", [&](json r) { sent = r; }};
  std::optional<json> reply;
  g.start(std::move(asks), true, Millis(60'000), 1, [&](json r) { reply = std::move(r); });
  EXPECT_EQ(sent["native"], true);
  g.on_done("a", {{"id", sent["id"]}, {"error", "no worker of job j runs on node a"}});
  ASSERT_TRUE(reply);  // no wait for the minute's deadline
  EXPECT_NE(errors((*reply)["ranks"][0]).find("no worker of job j runs"), std::string::npos);
  g.on_done("a", {{"id", sent["id"]}});  // late, twice: ignored
}

TEST(StacksGather, ARelayedAnswerIsCutToItsBound) {
  json reply{{"world_size", 8}, {"ranks", json::array()}};
  for (int r = 0; r < 8; ++r) {
    stacks::ProcessStacks p;
    p.pid = 100 + r;
    for (int t = 0; t < 50; ++t) {
      stacks::ThreadStack th;
      th.tid = 100 + r + t * 1000;
      th.main = t == 0;
      for (int f = 0; f < 100; ++f)
        th.native.push_back({stacks::Frame::Kind::native, std::string(100, 'f'), "libx.so", 0, 1});
      p.threads.push_back(th);
    }
    reply["ranks"].push_back({{"rank", r}, {"node", "a"}, {"process", stacks::to_json(p)}});
  }
  ASSERT_GT(reply.dump().size(), 760u << 10);
  coordinator::fit_stacks_reply(reply, 760u << 10);
  EXPECT_LE(reply.dump().size(), 760u << 10);
  ASSERT_EQ(reply["ranks"].size(), 8u);
  EXPECT_NE(errors(reply["ranks"][0]).find("native frames left out"), std::string::npos);
}

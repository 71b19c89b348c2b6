// The merger: identical stacks become one group naming its ranks and nodes, smallest groups
// first, every rank named once per thread, and the result independent of the input order.
#include "stacks/merge.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

using namespace ddp::stacks;

namespace {

Frame py(const std::string& fn, const std::string& file, int line) {
  return {Frame::Kind::python, fn, file, line, 0};
}
Frame nat(const std::string& fn, const std::string& mod, std::uint64_t off) {
  return {Frame::Kind::native, fn, mod, 0, off};
}

const std::vector<Frame> kAllReduce{py("all_reduce", "/torch/distributed/distributed_c10d.py", 1555),
                                    py("step", "/w/train.py", 42), py("<module>", "/w/train.py", 60)};
const std::vector<Frame> kStuck{py("stuck_here", "/w/train.py", 12), py("step", "/w/train.py", 40),
                                py("<module>", "/w/train.py", 60)};
const std::vector<Frame> kLoader{py("_worker_loop", "/torch/utils/data/_utils/worker.py", 300)};

RankStacks rank(int r, const std::string& node, std::vector<Frame> main, std::vector<Frame> other = {}) {
  RankStacks rs;
  rs.rank = r;
  rs.node = node;
  rs.stacks.pid = 1000 + r;
  rs.stacks.python = "3.11.2";
  rs.stacks.python_ok = true;
  ThreadStack t;
  t.tid = 1000 + r;
  t.main = true;
  t.name = "python3";
  t.python = std::move(main);
  rs.stacks.threads.push_back(t);
  if (!other.empty()) {
    ThreadStack u;
    u.tid = 5000 + r;
    u.name = "pt_data_worker";
    u.python = std::move(other);
    rs.stacks.threads.push_back(u);
  }
  return rs;
}

std::vector<RankStacks> hang(int world, int odd, int per_node) {
  std::vector<RankStacks> v;
  for (int r = 0; r < world; ++r)
    v.push_back(rank(r, "node" + std::to_string(r / per_node), r == odd ? kStuck : kAllReduce));
  return v;
}

}  // namespace

TEST(StacksMergeRanks, FoldsRuns) {
  EXPECT_EQ(format_ranks({}), "");
  EXPECT_EQ(format_ranks({3}), "3");
  EXPECT_EQ(format_ranks({0, 1}), "0,1");
  EXPECT_EQ(format_ranks({0, 1, 2}), "0-2");
  EXPECT_EQ(format_ranks({0, 2, 3, 4, 7, 9, 10}), "0,2-4,7,9,10");
  std::vector<int> big;
  for (int r = 0; r < 4096; ++r)
    if (r != 1) big.push_back(r);
  EXPECT_EQ(format_ranks(big), "0,2-4095");
}

TEST(StacksMerge, OddRankFirstAt8AsAt4096) {
  for (auto [world, odd, per_node] :
       {std::tuple{8, 1, 4}, std::tuple{4096, 1, 8}, std::tuple{4096, 4095, 8}, std::tuple{2, 0, 1}}) {
    const auto groups = merge(hang(world, odd, per_node));
    ASSERT_EQ(groups.size(), 2u) << world;
    EXPECT_EQ(groups[0].ranks, std::vector<int>{odd});
    EXPECT_EQ(groups[0].python[0].function, "stuck_here");
    EXPECT_EQ(groups[0].nodes, std::vector<std::string>{"node" + std::to_string(odd / per_node)});
    EXPECT_EQ(int(groups[1].ranks.size()), world - 1);
    EXPECT_EQ(groups[1].python[0].function, "all_reduce");
    std::set<int> other_nodes;
    for (int r = 0; r < world; ++r)
      if (r != odd) other_nodes.insert(r / per_node);
    EXPECT_EQ(groups[1].nodes.size(), other_nodes.size());
    const std::string text = render_text(groups, world);
    const std::string first = text.substr(0, text.find('\n'));
    EXPECT_EQ(first, "rank " + std::to_string(odd) + " (1 of " + std::to_string(world) + ") on node" +
                         std::to_string(odd / per_node) + ", thread python3 (tid " + std::to_string(1000 + odd) + "):");
    EXPECT_EQ(text.substr(text.find('\n') + 1, text.find('\n', text.find('\n') + 1) - text.find('\n') - 1),
              "    stuck_here (/w/train.py:12)");
  }
}

TEST(StacksMerge, NodesListIsCappedInText) {
  const auto groups = merge(hang(4096, 7, 8));
  const std::string text = render_text(groups, 4096);
  EXPECT_NE(
      text.find(
          "ranks 0-6,8-4095 (4095 of 4096) on node0,node1,node10,node100,node101,node102,node103,node104 +504 more, "),
      std::string::npos)
      << text.substr(0, 400);
}

TEST(StacksMerge, SameLineSameGroupOtherLineOtherGroup) {
  auto a = rank(0, "n", {py("f", "/a.py", 10)});
  auto b = rank(1, "n", {py("f", "/a.py", 10)});
  auto c = rank(2, "n", {py("f", "/a.py", 11)});
  auto d = rank(3, "n", {py("f", "/b.py", 10)});
  auto e = rank(4, "n", {py("g", "/a.py", 10)});
  const auto groups = merge({a, b, c, d, e});
  ASSERT_EQ(groups.size(), 4u);
  EXPECT_EQ(groups.back().ranks, (std::vector<int>{0, 1}));
}

TEST(StacksMerge, NativeOffsetsDoNotSplitButSymbolsDo) {
  auto a = rank(0, "", {});
  auto b = rank(1, "", {});
  auto c = rank(2, "", {});
  a.stacks.threads[0].native = {nat("ncclGroupEnd", "libnccl.so.2", 0x10), nat("main", "trainer", 0x40)};
  b.stacks.threads[0].native = {nat("ncclGroupEnd", "libnccl.so.2", 0x24), nat("main", "trainer", 0x40)};
  c.stacks.threads[0].native = {nat("poll", "libc.so.6", 0x10), nat("main", "trainer", 0x40)};
  const auto groups = merge({a, b, c});
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].ranks, std::vector<int>{2});
  EXPECT_EQ(groups[1].ranks, (std::vector<int>{0, 1}));
  EXPECT_TRUE(groups[1].nodes.empty());  // local: no node names
  const std::string text = render_text(groups, 3);
  EXPECT_EQ(text.substr(0, text.find('\n')), "rank 2 (1 of 3), thread python3 (tid 1002):");
  EXPECT_NE(text.find("    poll+0x10 (libc.so.6)\n"), std::string::npos) << text;
}

TEST(StacksMerge, UnreadableAndFramelessRanksAreNamed) {
  auto ok0 = rank(0, "a", kAllReduce);
  auto ok1 = rank(1, "a", kAllReduce);
  RankStacks gone;
  gone.rank = 2, gone.node = "b", gone.stacks.pid = 77;
  gone.stacks.errors.push_back("cannot read /proc/77/maps: No such process (the process is gone)");
  RankStacks cxx = rank(3, "b", {});
  cxx.stacks.python = "not a Python process: only native stacks are available (--native)";
  cxx.stacks.python_ok = false;
  RankStacks idle = rank(4, "b", {});
  const auto groups = merge({ok0, ok1, gone, cxx, idle});
  ASSERT_EQ(groups.size(), 4u);
  EXPECT_EQ(groups[0].ranks, std::vector<int>{2});
  EXPECT_EQ(groups[0].note, "cannot read /proc/77/maps: No such process (the process is gone)");
  EXPECT_EQ(groups[1].ranks, std::vector<int>{3});
  EXPECT_EQ(groups[1].note, "not a Python process: only native stacks are available (--native)");
  EXPECT_EQ(groups[2].ranks, std::vector<int>{4});
  EXPECT_NE(groups[2].note.find("no Python frames"), std::string::npos);
  EXPECT_EQ(groups[3].ranks, (std::vector<int>{0, 1}));
  const std::string text = render_text(groups, 5);
  EXPECT_EQ(text.substr(0, text.find('\n')), "rank 2 (1 of 5) on b:");
}

TEST(StacksMerge, ThreadsMergeAcrossRanksAndMainThreadOnly) {
  std::vector<RankStacks> v;
  for (int r = 0; r < 4; ++r) v.push_back(rank(r, "n", r == 3 ? kStuck : kAllReduce, kLoader));
  auto groups = merge(v);
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[0].ranks, std::vector<int>{3});
  EXPECT_EQ(groups[1].ranks, (std::vector<int>{0, 1, 2}));  // equal sizes: the main thread's group first
  EXPECT_EQ(groups[1].python, kAllReduce);
  EXPECT_EQ(groups[2].python, kLoader);
  EXPECT_EQ(groups[2].members.size(), 4u);
  EXPECT_NE(render_text(groups, 4).find("ranks 0-3 (4 of 4) on n, 4 threads pt_data_worker:"), std::string::npos);
  groups = merge(v, {.main_thread_only = true});
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[1].python, kAllReduce);
}

TEST(StacksMerge, TwoThreadsOfOneRankInOneGroupCountTheRankOnce) {
  auto r0 = rank(0, "n", kLoader, kLoader);
  auto r1 = rank(1, "n", kStuck);
  const auto groups = merge({r0, r1});
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].ranks, std::vector<int>{0});  // tie on size 1: lowest rank first
  EXPECT_EQ(groups[0].members.size(), 2u);
  EXPECT_TRUE(groups[0].members[0].main);  // the main thread listed first
}

// Random worlds: every (rank, thread) lands in exactly one group, groups are non-decreasing in
// size, members of a group share one stack, and shuffling the input changes nothing.
TEST(StacksMerge, RandomWorldsKeepTheInvariants) {
  std::mt19937 rng(24);
  const std::vector<std::vector<Frame>> places{kAllReduce, kStuck, kLoader, {py("barrier", "/t.py", 9)}, {}};
  for (int round = 0; round < 200; ++round) {
    const int world = 1 + int(rng() % 64);
    std::vector<RankStacks> v;
    std::size_t threads = 0;
    for (int r = 0; r < world; ++r) {
      auto rs =
          rank(r, "node" + std::to_string(rng() % 5), places[rng() % places.size()], places[rng() % places.size()]);
      if (rng() % 13 == 0) {
        rs.stacks.threads.clear();
        rs.stacks.errors.push_back("gone");
      }
      std::size_t with_frames = 0;
      for (auto& t : rs.stacks.threads) with_frames += !t.python.empty();
      threads += std::max<std::size_t>(with_frames, 1);
      v.push_back(std::move(rs));
    }
    const auto groups = merge(v);
    std::size_t members = 0;
    std::set<int> seen;
    for (std::size_t i = 0; i < groups.size(); ++i) {
      members += groups[i].members.size();
      for (int r : groups[i].ranks) seen.insert(r);
      if (i) {
        EXPECT_LE(groups[i - 1].ranks.size(), groups[i].ranks.size());
      }
      EXPECT_TRUE(std::is_sorted(groups[i].ranks.begin(), groups[i].ranks.end()));
    }
    EXPECT_EQ(members, threads);
    EXPECT_EQ(int(seen.size()), world);
    auto shuffled = v;
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    EXPECT_EQ(to_json(merge(shuffled)), to_json(groups));
  }
}

TEST(StacksMerge, JsonNamesRanksNodesAndFrames) {
  const auto j = to_json(merge(hang(4, 1, 2)));
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["ranks"], nlohmann::json::array({1}));
  EXPECT_EQ(j[0]["ranks_text"], "1");
  EXPECT_EQ(j[0]["nodes"], nlohmann::json::array({"node0"}));
  EXPECT_EQ(j[0]["python"][0]["function"], "stuck_here");
  EXPECT_EQ(j[0]["python"][0]["line"], 12);
  EXPECT_EQ(j[1]["ranks_text"], "0,2,3");
  EXPECT_EQ(j[1]["members"][0]["pid"], 1000);
}

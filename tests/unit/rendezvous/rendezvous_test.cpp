// The rendezvous state machine with a fake clock: every transition, timeouts that name what they
// waited for, restarts and backoff, elastic MIN:MAX, heartbeats, first failure across skewed clocks.
#include "rendezvous/rendezvous.hpp"

#include <gtest/gtest.h>

#include <limits>

#include <csignal>
#include <random>

using namespace ddp::rendezvous;
using namespace std::chrono_literals;

static_assert(!std::is_convertible_v<NodeRank, GlobalRank>);
static_assert(!std::is_convertible_v<GlobalRank, NodeRank>);
static_assert(!std::is_convertible_v<Round, NodeRank>);
static_assert(!std::is_convertible_v<std::uint32_t, Round>);

namespace {

template <class T>
std::vector<T> all(const Effects& effects) {
  std::vector<T> out;
  for (const auto& e : effects) {
    if (auto* x = std::get_if<T>(&e)) out.push_back(*x);
  }
  return out;
}
template <class T>
std::optional<T> one(const Effects& effects) {
  auto v = all<T>(effects);
  EXPECT_LE(v.size(), 1u);
  if (v.empty()) return std::nullopt;
  return v.front();
}

// A coordinator under a fake clock. Nodes in `alive` heartbeat every second while time advances.
struct Sim {
  Config config;
  TimePoint now{0};
  std::unique_ptr<Rendezvous> r;
  std::set<std::string> alive;
  Effects log;  // everything emitted, in order

  explicit Sim(Config c) : config(std::move(c)), r(std::make_unique<Rendezvous>(config, now)) {}

  Effects on(const Event& e) {
    auto out = r->handle(e, now);
    log.insert(log.end(), out.begin(), out.end());
    return out;
  }
  Effects join(const std::string& n, std::uint32_t nproc = 2, Micros offset = 0us) {
    alive.insert(n);
    return on(NodeJoined{n, nproc, offset});
  }
  // Advance by `d` in steps of at most 1 s, heartbeating live nodes and ticking.
  Effects advance(Micros d) {
    Effects out;
    const auto end = now + d;
    while (now < end) {
      now = std::min(end, now + Micros(1s));
      for (const auto& n : alive) {
        auto e = on(Heartbeat{n});
        out.insert(out.end(), e.begin(), e.end());
      }
      auto e = on(Tick{});
      out.insert(out.end(), e.begin(), e.end());
    }
    return out;
  }
  Effects exit(const std::string& n, std::uint32_t local, std::optional<int> code, std::optional<int> sig,
               Micros agent_time, Round round = Round{0}) {
    return on(WorkerExited{n, round.value ? round : r->round(), LocalRank{local}, code, sig, agent_time, 1000 + local});
  }
  Effects finished(const std::string& n, bool ok, Round round = Round{0}) {
    return on(AttemptFinished{n, round.value ? round : r->round(), ok});
  }
  Effects ack_all() {
    Effects out;
    const auto members = r->members();  // a copy: acks can open the next round
    for (const auto& m : members) {
      if (!alive.count(m)) continue;
      auto e = finished(m, false);
      out.insert(out.end(), e.begin(), e.end());
    }
    return out;
  }
};

Config three_hosts() {
  Config c;
  c.job_id = "j1";
  c.hosts = {"n1", "n2", "n3"};
  return c;
}

Config elastic(std::uint32_t min, std::uint32_t max, std::size_t hosts) {
  Config c;
  c.job_id = "j1";
  for (std::size_t i = 1; i <= hosts; ++i) {
    std::string name = "n";  // += (not +): GCC 12 -Wrestrict false positive
    name += std::to_string(i);
    c.hosts.push_back(name);
  }
  c.min_nodes = min;
  c.max_nodes = max;
  return c;
}

}  // namespace

// ---------------------------------------------------------------- joining

TEST(Joining, RanksFollowTheHostListAndEachNodesOwnCount) {
  Sim s(three_hosts());
  EXPECT_EQ(one<Progress>(s.join("n3", 1))->message, "round 1: waiting for nodes: 1/3 nodes joined; missing: n1, n2");
  EXPECT_EQ(one<Progress>(s.join("n1", 2))->message, "round 1: waiting for nodes: 2/3 nodes joined; missing: n2");
  auto e = s.join("n2", 4);
  auto a = one<AssignRanks>(e);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->round, Round{1});
  EXPECT_EQ(a->restart_count, 0u);
  EXPECT_EQ(a->world_size, 7u);
  ASSERT_EQ(a->nodes.size(), 3u);
  EXPECT_EQ(a->nodes[0].node, "n1");
  EXPECT_EQ(a->nodes[0].node_rank, NodeRank{0});
  EXPECT_EQ(a->nodes[0].rank_base, GlobalRank{0});
  EXPECT_EQ(a->nodes[1].node, "n2");
  EXPECT_EQ(a->nodes[1].rank_base, GlobalRank{2});
  EXPECT_EQ(a->nodes[1].local_world_size, 4u);
  EXPECT_EQ(a->nodes[2].node, "n3");
  EXPECT_EQ(a->nodes[2].node_rank, NodeRank{2});
  EXPECT_EQ(a->nodes[2].rank_base, GlobalRank{6});
  auto st = one<StartAttempt>(e);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->round, Round{1});
  // Assign comes before start, so the edge can prepare (store, NCCL id) first.
  EXPECT_TRUE(std::holds_alternative<AssignRanks>(e[0]));
  EXPECT_TRUE(std::holds_alternative<StartAttempt>(e[1]));
  EXPECT_EQ(s.r->state(), State::running);
  EXPECT_EQ(s.r->members(), (std::vector<std::string>{"n1", "n2", "n3"}));
}

TEST(Joining, JoinTimeoutSaysWhoIsMissing) {
  Sim s(three_hosts());
  s.join("n1");
  s.join("n2");
  EXPECT_EQ(s.r->next_deadline(), TimePoint(6s));  // the heartbeat check comes first
  auto before = s.advance(10min - 1s);
  EXPECT_TRUE(all<JobFailed>(before).empty());
  auto e = s.advance(1s);
  auto f = one<JobFailed>(e);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->kind, JobFailed::Kind::rendezvous_timeout);
  EXPECT_EQ(f->message, "rendezvous timed out after 10m: 2/3 nodes joined; missing: n3");
  EXPECT_EQ(s.r->state(), State::failed);
  EXPECT_EQ(s.r->next_deadline(), std::nullopt);
}

TEST(Joining, JoinTimeoutWithNobody) {
  Config c = three_hosts();
  c.join_timeout = 30s;
  Sim s(c);
  EXPECT_EQ(s.r->next_deadline(), TimePoint(30s));
  auto f = one<JobFailed>(s.advance(30s));
  ASSERT_TRUE(f);
  EXPECT_EQ(f->message, "rendezvous timed out after 30s: 0/3 nodes joined; missing: n1, n2, n3");
}

TEST(Joining, RejectsStrangersDuplicatesAndEmptyNodes) {
  Sim s(three_hosts());
  EXPECT_EQ(one<RejectNode>(s.join("n9"))->reason, "n9 is not one of this job's hosts (n1, n2, n3)");
  s.join("n1");
  EXPECT_EQ(one<RejectNode>(s.join("n1"))->reason, "n1 has already joined; is a second agent running for it?");
  EXPECT_EQ(one<RejectNode>(s.on(NodeJoined{"n2", 0, 0us}))->reason, "n2 offers no workers (nproc 0)");
  EXPECT_EQ(s.r->present(), std::vector<std::string>{"n1"});
}

TEST(Joining, NodeLeavingIsForgotten) {
  Sim s(three_hosts());
  s.join("n1");
  s.join("n2");
  auto p = one<Progress>(s.on(NodeLeft{"n2", "connection closed"}));
  ASSERT_TRUE(p);
  EXPECT_EQ(p->message, "n2 left (connection closed); 1/3 nodes joined; missing: n2, n3");
  s.alive.erase("n2");
  s.join("n2");
  EXPECT_TRUE(one<AssignRanks>(s.join("n3")));
}

TEST(Joining, SilentNodeIsDroppedBeforeTheRoundCompletes) {
  Sim s(three_hosts());
  s.join("n1");
  s.join("n2");
  s.alive.erase("n2");  // stops heartbeating
  auto e = s.advance(6s);
  auto d = one<DropNode>(e);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->node, "n2");
  EXPECT_EQ(d->reason, "no heartbeat for 6s");
  EXPECT_EQ(s.r->present(), std::vector<std::string>{"n1"});
}

TEST(Joining, MoreHostsThanNodesTakesTheFirstInHostOrder) {
  Config c = three_hosts();
  c.min_nodes = c.max_nodes = 2;  // nnodes: 2 with three hosts
  Sim s(c);
  s.join("n3");
  auto a = one<AssignRanks>(s.join("n2"));
  ASSERT_TRUE(a);
  EXPECT_EQ(a->nodes[0].node, "n2");
  EXPECT_EQ(a->nodes[1].node, "n3");
  auto p = one<Progress>(s.join("n1"));
  ASSERT_TRUE(p);
  EXPECT_EQ(p->message, "n1 stands by for the next round");
  EXPECT_EQ(s.r->state(), State::running);
}

// ---------------------------------------------------------------- elastic MIN:MAX

TEST(Elastic, LastCallStartsAtMinAndEndsTheRound) {
  Sim s(elastic(2, 4, 4));
  s.join("n1");
  auto e = s.join("n3");
  auto p = all<Progress>(e);
  ASSERT_FALSE(p.empty());
  EXPECT_EQ(p[0].message, "2/4 nodes joined (need 2-4); missing: n2, n4; last call: waiting 5s for more");
  EXPECT_EQ(s.r->next_deadline(), TimePoint(5s));
  EXPECT_TRUE(all<AssignRanks>(s.advance(4s)).empty());
  s.join("n2");
  auto a = one<AssignRanks>(s.advance(1s));
  ASSERT_TRUE(a);
  EXPECT_EQ(a->nodes.size(), 3u);
  EXPECT_EQ(a->nodes[2].node, "n3");
  EXPECT_EQ(a->nodes[2].node_rank, NodeRank{2});
}

TEST(Elastic, MaxCompletesWithoutWaiting) {
  Sim s(elastic(1, 2, 3));
  s.join("n2");
  auto a = one<AssignRanks>(s.join("n3"));
  ASSERT_TRUE(a);
  EXPECT_EQ(a->nodes.size(), 2u);
}

TEST(Elastic, BelowMinDisarmsTheLastCall) {
  Sim s(elastic(2, 3, 3));
  s.join("n1");
  s.join("n2");
  EXPECT_EQ(s.r->next_deadline(), TimePoint(5s));
  s.alive.erase("n2");
  s.on(NodeLeft{"n2", "connection closed"});
  EXPECT_TRUE(all<AssignRanks>(s.advance(10s)).empty());
  EXPECT_EQ(s.r->state(), State::joining);
}

TEST(Elastic, JoinTimeoutBelowMin) {
  Config c = elastic(2, 4, 4);
  c.join_timeout = 20s;
  Sim s(c);
  s.join("n4");
  auto f = one<JobFailed>(s.advance(20s));
  ASSERT_TRUE(f);
  EXPECT_EQ(f->message, "rendezvous timed out after 20s: 1/4 nodes joined (need 2-4); missing: n1, n2, n3");
}

TEST(Elastic, JoinTimeoutAtOrAboveMinStarts) {
  Config c = elastic(2, 4, 4);
  c.join_timeout = 3s;  // shorter than the last call
  Sim s(c);
  s.join("n1");
  s.join("n2");
  auto a = one<AssignRanks>(s.advance(3s));
  ASSERT_TRUE(a);
  EXPECT_EQ(a->nodes.size(), 2u);
}

TEST(Elastic, LostNodeReformsWithSurvivorsWithoutSpendingARestart) {
  Config c = elastic(2, 3, 3);
  c.max_restarts = 1;
  Sim s(c);
  s.join("n1", 2);
  s.join("n2", 2);
  s.join("n3", 2);
  s.alive.erase("n2");
  auto e = s.advance(6s);
  ASSERT_TRUE(one<DropNode>(e));
  auto stop = one<StopAll>(e);
  ASSERT_TRUE(stop);
  EXPECT_EQ(stop->reason, "node n2 lost: no heartbeat for 6s");
  EXPECT_EQ(s.r->state(), State::stopping);
  e = s.ack_all();
  auto progress = all<Progress>(e);
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress[0].message, "re-forming with 2 nodes (membership changed; no restart spent)");
  EXPECT_EQ(s.r->state(), State::joining);
  EXPECT_EQ(s.r->round(), Round{2});
  auto a = one<AssignRanks>(s.advance(5s));  // last call: 2 < MAX
  ASSERT_TRUE(a);
  EXPECT_EQ(a->restart_count, 0u);
  EXPECT_EQ(a->world_size, 4u);
  EXPECT_EQ(a->nodes[1].node, "n3");
  EXPECT_EQ(a->nodes[1].node_rank, NodeRank{1});
  EXPECT_EQ(s.r->restart_count(), 0u);
}

TEST(Elastic, WorkerFailuresCausedByALostNodeSpendNoRestart) {
  Config c = elastic(2, 3, 3);
  c.max_restarts = 0;  // a spent restart would fail the job
  Sim s(c);
  s.join("n1");
  s.join("n2");
  s.join("n3");
  // NCCL notices before the coordinator does: n1's rank fails first, then n3's agent vanishes.
  auto e = s.exit("n1", 0, 1, std::nullopt, s.now);
  ASSERT_TRUE(one<StopAll>(e));
  s.alive.erase("n3");
  s.on(NodeLeft{"n3", "connection reset"});
  e = s.ack_all();
  EXPECT_TRUE(all<JobFailed>(e).empty());
  EXPECT_EQ(s.r->state(), State::joining);
  EXPECT_TRUE(one<AssignRanks>(s.advance(5s)));
}

TEST(Elastic, LostNodeBelowMinWaitsThenFails) {
  Config c = elastic(2, 2, 2);
  c.min_nodes = 2;
  c.max_nodes = 3;
  c.hosts.push_back("n3");
  c.join_timeout = 30s;
  Sim s(c);
  s.join("n1");
  s.join("n2");
  s.advance(5s);
  ASSERT_EQ(s.r->state(), State::running);
  s.alive.erase("n2");
  s.on(NodeLeft{"n2", "connection closed"});
  s.ack_all();
  ASSERT_EQ(s.r->state(), State::joining);
  auto f = one<JobFailed>(s.advance(30s));
  ASSERT_TRUE(f);
  EXPECT_EQ(f->message, "rendezvous timed out after 30s: 1/3 nodes joined (need 2-3); missing: n2, n3");
}

TEST(Elastic, LateJoinerBelowMaxReformsTheJob) {
  Sim s(elastic(2, 3, 3));
  s.join("n1");
  s.join("n2");
  s.advance(5s);
  ASSERT_EQ(s.r->members().size(), 2u);
  auto e = s.join("n3");
  auto stop = one<StopAll>(e);
  ASSERT_TRUE(stop);
  EXPECT_EQ(stop->reason, "n3 joined; re-forming with 3 nodes");
  e = s.ack_all();
  auto a = one<AssignRanks>(e);  // all three present = MAX: immediate
  ASSERT_TRUE(a);
  EXPECT_EQ(a->round, Round{2});
  EXPECT_EQ(a->restart_count, 0u);
  EXPECT_EQ(a->nodes.size(), 3u);
}

// ---------------------------------------------------------------- failures and restarts

TEST(Restarts, FailureStopsAllThenRestartsAfterBackoff) {
  Config c = three_hosts();
  c.max_restarts = 3;
  Sim s(c);
  s.join("n1", 2);
  s.join("n2", 2);
  s.join("n3", 2);
  auto e = s.exit("n2", 1, 1, std::nullopt, s.now);
  auto stop = one<StopAll>(e);
  ASSERT_TRUE(stop);
  EXPECT_EQ(stop->round, Round{1});
  EXPECT_EQ(stop->reason, "rank 3 (n2, local rank 1, pid 1001) exited with code 1");
  EXPECT_EQ(s.r->next_deadline(), TimePoint(6s));  // heartbeat expiry comes before the 35 s stop timeout
  s.finished("n1", false);
  s.finished("n2", false);
  EXPECT_EQ(s.r->state(), State::stopping);
  EXPECT_EQ(s.r->status(), "round 1: stopping: waiting for n3 to report their workers gone");
  e = s.finished("n3", false);
  auto rs = one<RestartScheduled>(e);
  ASSERT_TRUE(rs);
  EXPECT_EQ(rs->next_round, Round{2});
  EXPECT_EQ(rs->restart_count, 1u);
  EXPECT_EQ(rs->backoff, Micros(1s));
  EXPECT_EQ(rs->reason, "rank 3 (n2, local rank 1, pid 1001) exited with code 1; restart 1/3 in 1s");
  EXPECT_EQ(s.r->state(), State::backoff);
  EXPECT_EQ(s.r->status(), "restart 1/3 in 1s");
  EXPECT_EQ(s.r->next_deadline(), s.now + Micros(1s));
  e = s.advance(1s);
  auto a = one<AssignRanks>(e);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->round, Round{2});
  EXPECT_EQ(a->restart_count, 1u);
  EXPECT_EQ(one<StartAttempt>(e)->restart_count, 1u);
  // A straggler from round 1 changes nothing.
  EXPECT_TRUE(s.exit("n1", 0, 1, std::nullopt, s.now, Round{1}).empty());
  EXPECT_TRUE(s.finished("n1", false, Round{1}).empty());
  EXPECT_EQ(s.r->state(), State::running);
}

TEST(Restarts, ExhaustedRestartsFailWithTheFirstFailure) {
  Config c = three_hosts();
  c.max_restarts = 2;
  Sim s(c);
  for (auto n : {"n1", "n2", "n3"}) s.join(n);
  for (int attempt = 0; attempt < 3; ++attempt) {
    ASSERT_EQ(s.r->state(), State::running) << attempt;
    s.exit("n3", 0, std::nullopt, SIGSEGV, s.now);
    auto e = s.ack_all();
    if (attempt < 2) {
      ASSERT_TRUE(one<RestartScheduled>(e)) << attempt;
      s.advance(10s);
      continue;
    }
    auto f = one<JobFailed>(e);
    ASSERT_TRUE(f);
    EXPECT_EQ(f->kind, JobFailed::Kind::worker_failed);
    EXPECT_EQ(f->restart_count, 2u);
    EXPECT_EQ(f->message,
              "rank 4 (n3, local rank 0, pid 1000) was killed by signal 11 (SIGSEGV); no restarts left (2/2 used)");
    ASSERT_TRUE(f->first_failure);
    EXPECT_EQ(f->first_failure->node, "n3");
    EXPECT_EQ(f->first_failure->rank, GlobalRank{4});
    EXPECT_EQ(f->first_failure->node_rank, NodeRank{2});
    EXPECT_EQ(f->first_failure->signal, SIGSEGV);
    EXPECT_EQ(f->first_failure->round, Round{3});
  }
  EXPECT_EQ(s.r->state(), State::failed);
}

TEST(Restarts, NoRestartsConfiguredFailsAtOnce) {
  Sim s(three_hosts());
  for (auto n : {"n1", "n2", "n3"}) s.join(n);
  s.exit("n1", 1, 2, std::nullopt, s.now);
  auto f = one<JobFailed>(s.ack_all());
  ASSERT_TRUE(f);
  EXPECT_EQ(f->message, "rank 1 (n1, local rank 1, pid 1001) exited with code 2");
}

TEST(Restarts, BackoffDoublesAndIsCapped) {
  Config c = three_hosts();
  c.hosts = {"n1"};
  c.max_restarts = 7;
  Sim s(c);
  s.join("n1");
  std::vector<Micros> seen;
  for (int i = 0; i < 7; ++i) {
    s.exit("n1", 0, 1, std::nullopt, s.now);
    auto rs = one<RestartScheduled>(s.ack_all());
    ASSERT_TRUE(rs);
    seen.push_back(rs->backoff);
    EXPECT_TRUE(all<AssignRanks>(s.advance(rs->backoff - 1s)).empty());
    ASSERT_TRUE(one<AssignRanks>(s.advance(1s)));
  }
  EXPECT_EQ(seen, (std::vector<Micros>{1s, 2s, 4s, 8s, 16s, 30s, 30s}));
}

TEST(Restarts, FixedNodeCountLosingANodeSpendsARestartAndWaitsForItsReturn) {
  Config c = three_hosts();
  c.max_restarts = 1;
  Sim s(c);
  for (auto n : {"n1", "n2", "n3"}) s.join(n);
  s.alive.erase("n3");
  auto e = s.on(NodeLeft{"n3", "connection closed"});
  ASSERT_EQ(one<StopAll>(e)->reason, "node n3 lost: connection closed");
  e = s.ack_all();
  auto rs = one<RestartScheduled>(e);
  ASSERT_TRUE(rs);
  EXPECT_EQ(rs->reason, "node n3 was lost: connection closed; restart 1/1 in 1s");
  e = s.advance(1s);
  EXPECT_EQ(one<Progress>(e)->message, "round 2: waiting for nodes: 2/3 nodes joined; missing: n3");
  auto a = one<AssignRanks>(s.join("n3"));  // systemd restarted the agent
  ASSERT_TRUE(a);
  EXPECT_EQ(a->restart_count, 1u);
}

TEST(Restarts, StopTimeoutDropsTheSilentAndMovesOn) {
  Config c = three_hosts();
  c.max_restarts = 1;
  c.stop_timeout = 10s;
  Sim s(c);
  for (auto n : {"n1", "n2", "n3"}) s.join(n);
  s.exit("n1", 0, 1, std::nullopt, s.now);
  s.finished("n1", false);
  s.finished("n2", false);
  // n3 keeps heartbeating but never reports its workers gone.
  auto e = s.advance(9s);
  EXPECT_TRUE(all<DropNode>(e).empty());
  e = s.advance(1s);
  auto d = one<DropNode>(e);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->node, "n3");
  EXPECT_EQ(d->reason, "did not report its workers stopped within 10s");
  EXPECT_TRUE(one<RestartScheduled>(e));
}

TEST(Restarts, AttemptFinishedNotOkWithoutAnExitIsAFailure) {
  Sim s(three_hosts());
  for (auto n : {"n1", "n2", "n3"}) s.join(n);
  auto e = s.finished("n2", false);
  EXPECT_EQ(one<StopAll>(e)->reason, "node n2 reported a failed attempt");
  auto f = one<JobFailed>(s.ack_all());
  ASSERT_TRUE(f);
  EXPECT_EQ(f->first_failure->kind, Failure::Kind::node_reported);
}

TEST(Restarts, SignalNamesInDescriptions) {
  Failure f;
  f.node = "n1";
  f.rank = GlobalRank{0};
  f.local_rank = LocalRank{0};
  f.signal = SIGKILL;
  EXPECT_EQ(f.describe(), "rank 0 (n1, local rank 0) was killed by signal 9 (SIGKILL)");
  f.signal = 64;
  EXPECT_EQ(f.describe(), "rank 0 (n1, local rank 0) was killed by signal 64");
  f.signal = SIGUSR1;
  f.forwarded = true;  // an agent passed it on, and the rank had no handler
  EXPECT_EQ(
      f.describe(),
      "rank 0 (n1, local rank 0) was killed by signal 10 (SIGUSR1), which ddpctl forwarded (it has no handler for it)");
  Failure lost;
  lost.kind = Failure::Kind::node_lost;
  lost.node = "n2";
  EXPECT_EQ(lost.describe(), "node n2 was lost");
  lost.reason = "no heartbeat for 10s";
  EXPECT_EQ(lost.describe(), "node n2 was lost: no heartbeat for 10s");
}

// ---------------------------------------------------------------- first failure across clocks

TEST(FirstFailure, EarliestByMappedTimeNotByArrival) {
  Config c = three_hosts();
  Sim s(c);
  s.now = Micros(100s);
  s.join("n1", 1, Micros(5s));  // n1's clock runs 5 s ahead of ours
  s.join("n2", 1, Micros(0s));
  s.join("n3", 1, Micros(-10s));  // n3's clock runs 10 s behind
  s.now = Micros(200s);
  // Arrives first: n2's rank failed at 200.0 s (our clock).
  s.exit("n2", 0, 1, std::nullopt, Micros(200s));
  // Arrives second, but happened earlier: n1 stamped 204.5 s on its clock = 199.5 s on ours.
  s.exit("n1", 0, 7, std::nullopt, Micros(204'500'000));
  // A consequence of our stop: n3 stamped 191 s = 201 s on ours, after the stop at 200 s.
  // Its raw stamp is the smallest of all; the mapping is what puts it last.
  s.exit("n3", 0, std::nullopt, SIGTERM, Micros(191s));
  auto f = one<JobFailed>(s.ack_all());
  ASSERT_TRUE(f);
  ASSERT_TRUE(f->first_failure);
  EXPECT_EQ(f->first_failure->node, "n1");
  EXPECT_EQ(f->first_failure->exit_code, 7);
  EXPECT_EQ(f->first_failure->time, Micros(199'500'000));
  EXPECT_EQ(f->message, "rank 0 (n1, local rank 0, pid 1000) exited with code 7");
}

TEST(FirstFailure, ExitsAfterTheStopAreConsequences) {
  Sim s(three_hosts());
  for (auto n : {"n1", "n2", "n3"}) s.join(n, 1);
  s.now = Micros(50s);
  s.exit("n2", 0, 1, std::nullopt, Micros(50s));
  s.now = Micros(51s);
  s.exit("n1", 0, std::nullopt, SIGTERM, Micros(50'500'000));
  auto f = one<JobFailed>(s.ack_all());
  EXPECT_EQ(f->first_failure->node, "n2");
}

TEST(FirstFailure, InjectedSkewDoesNotChangeTheAnswer) {
  // The same true timeline seen through random clock skews (each compensated by the offset the
  // handshake measured) always names the same first failure.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    Sim s(three_hosts());
    std::map<std::string, Micros> skew;
    for (auto n : {"n1", "n2", "n3"}) {
      skew[n] = Micros(static_cast<long long>(rng() % 2'000'000'000) - 1'000'000'000);  // +-1000 s
      s.join(n, 2, skew[n]);
    }
    // True times: n3 local 1 fails at 10.000 s, n1 at 10.001 s, n2 at 10.002 s; arrival order random.
    std::vector<std::tuple<std::string, std::uint32_t, Micros>> fails{
        {"n3", 1, Micros(10'000'000)}, {"n1", 0, Micros(10'001'000)}, {"n2", 1, Micros(10'002'000)}};
    std::shuffle(fails.begin(), fails.end(), rng);
    s.now = Micros(10'003'000);
    for (auto& [n, local, t] : fails) s.exit(n, local, 1, std::nullopt, t + skew[n]);
    auto f = one<JobFailed>(s.ack_all());
    ASSERT_TRUE(f);
    EXPECT_EQ(f->first_failure->node, "n3") << trial;
    EXPECT_EQ(f->first_failure->rank, GlobalRank{5});
  }
}

TEST(FirstFailure, AnAgentsTimeAtTheRangesEndIsHeldThereNotWrapped) {
  // An agent's time and its clock offset are its numbers: any 64-bit counts. A failure stamped at
  // the far end of the range stays the latest (it does not wrap to the earliest and win).
  constexpr auto lo = std::numeric_limits<std::int64_t>::min(), hi = std::numeric_limits<std::int64_t>::max();
  Sim s(three_hosts());
  s.join("n1", 2, Micros(lo / 2));  // its clock far behind ours
  s.join("n2");
  s.join("n3");
  s.now = Micros(10'003'000);
  s.exit("n1", 0, 1, std::nullopt, Micros(hi));  // hi - lo / 2 would wrap below zero
  s.exit("n2", 0, 1, std::nullopt, Micros(10'000'000));
  auto f = one<JobFailed>(s.ack_all());
  ASSERT_TRUE(f);
  EXPECT_EQ(f->first_failure->node, "n2");
}

// ---------------------------------------------------------------- success, stop, heartbeats

TEST(Success, AllNodesOkSucceeds) {
  Sim s(three_hosts());
  for (auto n : {"n1", "n2", "n3"}) s.join(n);
  EXPECT_TRUE(s.exit("n1", 0, 0, std::nullopt, s.now).empty());  // an early clean exit is fine
  EXPECT_TRUE(s.finished("n1", true).empty());
  EXPECT_TRUE(s.finished("n1", true).empty());  // a duplicate report counts once
  EXPECT_TRUE(s.finished("n2", true).empty());
  auto ok = one<JobSucceeded>(s.finished("n3", true));
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->round, Round{1});
  EXPECT_EQ(s.r->state(), State::succeeded);
  EXPECT_EQ(s.r->next_deadline(), std::nullopt);
  // Final: nothing moves it.
  EXPECT_TRUE(s.on(StopRequested{"late"}).empty());
  EXPECT_TRUE(s.join("n1").empty());
  EXPECT_TRUE(s.advance(1h).empty());
  EXPECT_EQ(s.r->status(), "round 1: succeeded");
}

TEST(Stop, UserStopWhileRunningSpendsNoRestart) {
  Config c = three_hosts();
  c.max_restarts = 5;
  Sim s(c);
  for (auto n : {"n1", "n2", "n3"}) s.join(n);
  auto e = s.on(StopRequested{"SIGINT"});
  EXPECT_EQ(one<StopAll>(e)->reason, "stop requested: SIGINT");
  // The exits our stop causes are not failures.
  s.exit("n1", 0, std::nullopt, SIGTERM, s.now);
  auto f = one<JobFailed>(s.ack_all());
  ASSERT_TRUE(f);
  EXPECT_EQ(f->kind, JobFailed::Kind::stopped);
  EXPECT_EQ(f->message, "job stopped: SIGINT");
  EXPECT_EQ(f->restart_count, 0u);
}

TEST(Stop, WhileJoiningOrInBackoffEndsAtOnce) {
  Sim a(three_hosts());
  a.join("n1");
  auto f = one<JobFailed>(a.on(StopRequested{"ddpctl stop by alice"}));
  ASSERT_TRUE(f);
  EXPECT_EQ(f->kind, JobFailed::Kind::stopped);
  EXPECT_EQ(f->message, "job stopped: ddpctl stop by alice");

  Config c = three_hosts();
  c.max_restarts = 1;
  Sim b(c);
  for (auto n : {"n1", "n2", "n3"}) b.join(n);
  b.exit("n1", 0, 1, std::nullopt, b.now);
  b.ack_all();
  ASSERT_EQ(b.r->state(), State::backoff);
  EXPECT_EQ(one<JobFailed>(b.on(StopRequested{"SIGTERM"}))->kind, JobFailed::Kind::stopped);
}

TEST(Stop, DuringAFailureStopPreventsTheRestart) {
  Config c = three_hosts();
  c.max_restarts = 3;
  Sim s(c);
  for (auto n : {"n1", "n2", "n3"}) s.join(n);
  s.exit("n1", 0, 1, std::nullopt, s.now);
  EXPECT_TRUE(s.on(StopRequested{"SIGINT"}).empty());
  auto f = one<JobFailed>(s.ack_all());
  ASSERT_TRUE(f);
  EXPECT_EQ(f->kind, JobFailed::Kind::stopped);
}

TEST(Heartbeats, AnyMessageCountsAsALifeSign) {
  Sim s(three_hosts());
  for (auto n : {"n1", "n2", "n3"}) s.join(n);
  s.alive.clear();  // nobody heartbeats explicitly
  for (int i = 0; i < 10; ++i) {
    s.now += Micros(1s);
    for (auto n : {"n1", "n2", "n3"}) s.exit(n, 0, 0, std::nullopt, s.now);  // clean exits, still alive
    EXPECT_TRUE(all<DropNode>(s.on(Tick{})).empty());
  }
}

TEST(Heartbeats, NextDeadlineTracksTheOldestLifeSign) {
  Sim s(three_hosts());
  for (auto n : {"n1", "n2", "n3"}) s.join(n);
  s.alive.clear();
  s.now = Micros(2s);
  s.on(Heartbeat{"n1"});
  s.on(Heartbeat{"n2"});
  EXPECT_EQ(s.r->next_deadline(), TimePoint(6s));  // n3, last seen at 0
  s.now = Micros(6s);
  auto e = s.on(Tick{});
  auto d = one<DropNode>(e);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->node, "n3");
  EXPECT_TRUE(one<StopAll>(e));
}

TEST(Heartbeats, LostDuringBackoffIsForgotten) {
  Config c = elastic(1, 2, 2);
  c.max_restarts = 1;
  c.backoff_initial = 10s;
  Sim s(c);
  s.join("n1");
  s.join("n2");
  s.exit("n1", 0, 1, std::nullopt, s.now);
  s.ack_all();
  ASSERT_EQ(s.r->state(), State::backoff);
  s.alive.erase("n2");
  auto e = s.advance(10s);
  EXPECT_TRUE(one<DropNode>(e));
  EXPECT_EQ(s.r->present(), std::vector<std::string>{"n1"});
}

TEST(Clock, TimeNeverRunsBackwards) {
  Config c = three_hosts();
  c.join_timeout = 10s;
  Sim s(c);
  s.now = Micros(20s);
  s.on(Tick{});  // fails the rendezvous at 20 s
  ASSERT_EQ(s.r->state(), State::failed);
  Sim t(c);
  t.now = Micros(5s);
  t.on(Tick{});
  t.now = Micros(1s);  // an edge bug: earlier than before
  t.on(Tick{});
  EXPECT_EQ(t.r->state(), State::joining);
}

TEST(Status, SaysWhatItWaitsFor) {
  Config c = elastic(2, 3, 3);
  c.max_restarts = 2;
  Sim s(c);
  s.join("n1");
  s.join("n2");
  EXPECT_EQ(s.r->status(),
            "round 1: waiting for nodes: 2/3 nodes joined (need 2-3); missing: n3; last call ends in 5s");
  s.advance(5s);
  EXPECT_EQ(s.r->status(), "round 1: running on 2 nodes, world size 4");
}

// ---------------------------------------------------------------- the hang watchdog's verdict

TEST(Hang, StopFailsTheJobAsHungEvenWithRestartsLeft) {
  Config c = three_hosts();
  c.max_restarts = 3;
  Sim s(c);
  for (auto n : {"n1", "n2", "n3"}) s.join(n);
  auto e = s.on(HangDetected{"hung: no rank made progress for 5s", false});
  EXPECT_EQ(one<StopAll>(e)->reason, "hung: no rank made progress for 5s");
  s.exit("n2", 1, std::nullopt, SIGTERM, s.now + 1ms);  // our stop's consequence
  auto f = one<JobFailed>(s.ack_all());
  ASSERT_TRUE(f);
  EXPECT_EQ(f->kind, JobFailed::Kind::hung);
  EXPECT_EQ(f->message, "hung: no rank made progress for 5s");
  EXPECT_EQ(f->restart_count, 0u);
}

TEST(Hang, RestartSpendsARestartAsAFailureDoes) {
  Config c = three_hosts();
  c.max_restarts = 1;
  Sim s(c);
  for (auto n : {"n1", "n2", "n3"}) s.join(n);
  s.on(HangDetected{"hung: no rank made progress for 5s", true});
  s.exit("n2", 1, std::nullopt, SIGTERM, s.now + 1ms);
  auto r = one<RestartScheduled>(s.ack_all());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->restart_count, 1u);
  EXPECT_EQ(r->reason.rfind("hung: no rank made progress for 5s; restart 1/1", 0), 0u) << r->reason;
  s.advance(5s);
  ASSERT_EQ(s.r->state(), State::running);
  // No restart left: the job fails with the hang as its first failure.
  s.on(HangDetected{"hung: no rank made progress for 5s", true});
  auto f = one<JobFailed>(s.ack_all());
  ASSERT_TRUE(f);
  EXPECT_EQ(f->kind, JobFailed::Kind::worker_failed);
  ASSERT_TRUE(f->first_failure);
  EXPECT_EQ(f->first_failure->kind, Failure::Kind::hung);
  EXPECT_EQ(f->first_failure->describe(), "hung: no rank made progress for 5s");
}

TEST(Hang, OutsideARunningAttemptItIsStale) {
  Config c = three_hosts();
  c.max_restarts = 1;
  Sim s(c);
  s.join("n1");
  EXPECT_TRUE(s.on(HangDetected{"hung", false}).empty());
  for (auto n : {"n2", "n3"}) s.join(n);
  s.exit("n1", 0, 1, std::nullopt, s.now);  // a real failure first: the hang changes nothing
  EXPECT_TRUE(s.on(HangDetected{"hung", false}).empty());
  EXPECT_TRUE(one<RestartScheduled>(s.ack_all()));
  EXPECT_TRUE(s.on(HangDetected{"hung", false}).empty());
}

// ---------------------------------------------------------------- whole-machine invariants

TEST(Invariants, RandomEventStreamsKeepTheMachineSane) {
  std::mt19937 rng(2024);
  for (int trial = 0; trial < 300; ++trial) {
    Config c = elastic(1 + rng() % 2, 3, 4);
    c.max_restarts = rng() % 3;
    c.join_timeout = 60s;
    Sim s(c);
    bool terminal = false;
    for (int step = 0; step < 200; ++step) {
      std::string n = "n";  // n5 is a stranger
      n += std::to_string(1 + rng() % 5);
      Effects e;
      switch (rng() % 9) {
        case 0:
          e = s.join(n, 1 + rng() % 4, Micros(static_cast<long long>(rng() % 1000)));
          break;
        case 1:
          s.alive.erase(n);
          e = s.on(NodeLeft{n, "closed"});
          break;
        case 2:
          e = s.on(Heartbeat{n});
          break;
        case 3:
          e = s.advance(Micros(static_cast<long long>(rng() % 8'000'000)));
          break;
        case 4:
          e = s.exit(n, rng() % 4, static_cast<int>(rng() % 3), std::nullopt, s.now);
          break;
        case 5:
          e = s.finished(n, rng() % 2);
          break;
        case 6:
          e = s.ack_all();
          break;
        case 7:
          if (rng() % 20 == 0)
            e = s.on(StopRequested{"fuzz"});
          else if (rng() % 10 == 0)
            e = s.on(HangDetected{"hung", rng() % 2 == 0});
          break;
        default:
          e = s.on(Tick{});
          break;
      }
      for (const auto& a : all<AssignRanks>(e)) {
        std::uint32_t base = 0;
        ASSERT_GE(a.nodes.size(), c.min_nodes);
        ASSERT_LE(a.nodes.size(), c.max_nodes);
        for (std::size_t i = 0; i < a.nodes.size(); ++i) {
          EXPECT_EQ(a.nodes[i].node_rank, NodeRank{static_cast<std::uint32_t>(i)});
          EXPECT_EQ(a.nodes[i].rank_base, GlobalRank{base});
          base += a.nodes[i].local_world_size;
          if (i) {
            EXPECT_LT(std::stoi(a.nodes[i - 1].node.substr(1)), std::stoi(a.nodes[i].node.substr(1)));
          }
        }
        EXPECT_EQ(a.world_size, base);
      }
      EXPECT_LE(s.r->restart_count(), c.max_restarts);
      const bool now_terminal = s.r->state() == State::succeeded || s.r->state() == State::failed;
      if (terminal) {
        EXPECT_TRUE(now_terminal);
        EXPECT_TRUE(e.empty());
      }
      terminal = now_terminal;
      if (!terminal) {
        auto d = s.r->next_deadline();
        ASSERT_TRUE(d || s.r->present().empty());
      }
      EXPECT_LE(all<JobFailed>(e).size() + all<JobSucceeded>(e).size(), 1u);
    }
  }
}

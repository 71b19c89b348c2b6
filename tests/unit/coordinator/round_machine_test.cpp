// The coordinator's round machine (coordinator/round_machine.hpp): one test per row of its
// table, then random event streams against the invariants the header states.
#include "coordinator/round_machine.hpp"

#include <gtest/gtest.h>

#include <csignal>
#include <map>
#include <random>
#include <set>

using namespace ddp::coordinator::round;
using namespace std::chrono_literals;
namespace rdzv = ddp::rendezvous;
using rdzv::LocalRank;
using rdzv::Micros;
using rdzv::Round;

namespace {

template <class T>
std::vector<T> all(const Effects& e) {
  std::vector<T> out;
  for (const auto& x : e) {
    if (auto* p = std::get_if<T>(&x)) out.push_back(*p);
  }
  return out;
}

// Round `round` on these nodes (node rank = position), each with nproc workers.
rdzv::AssignRanks assignment(std::uint32_t round, const std::vector<std::pair<std::string, std::uint32_t>>& nodes) {
  rdzv::AssignRanks a{Round{round}, round - 1, 0, {}};
  std::uint32_t base = 0;
  for (std::uint32_t i = 0; i < nodes.size(); ++i) {
    a.nodes.push_back({nodes[i].first, rdzv::NodeRank{i}, rdzv::GlobalRank{base}, nodes[i].second});
    base += nodes[i].second;
  }
  a.world_size = base;
  return a;
}

Ready ready(const std::string& node, std::uint32_t round, std::uint16_t port = 29500,
            std::optional<std::string> id = "ab12") {
  return Ready{node, Round{round}, port, std::move(id), std::nullopt};
}

WorkerExited exit_of(const std::string& node, std::uint32_t round, std::uint32_t lr, int code, Micros when,
                     std::optional<int> signal = std::nullopt) {
  WorkerExited x{node, Round{round}, LocalRank{lr}, std::nullopt, signal, when + 7s, when, 100 + lr, false};
  if (!signal) x.exit_code = code;
  return x;
}

// Three nodes, n1 and n3 with two workers, n2 with one: world size 5.
RoundMachine three_nodes(Effects* first = nullptr) {
  RoundMachine m;
  auto e = m.handle(Assigned{assignment(1, {{"n1", 2}, {"n2", 1}, {"n3", 2}})});
  if (first) *first = e;
  return m;
}

}  // namespace

// ---------------------------------------------------------------- assign, ready, start

TEST(Release, NodeRankZerosAssignGoesOutAloneFirst) {
  Effects e;
  auto m = three_nodes(&e);
  ASSERT_EQ(e.size(), 1u);
  auto a = std::get<SendAssign>(e[0]);
  EXPECT_EQ(a.node, "n1");
  EXPECT_EQ(a.index, 0u);
  EXPECT_FALSE(a.release);
  EXPECT_FALSE(a.start);
  EXPECT_EQ(m.state(), State::awaiting_ready);
  EXPECT_TRUE(m.attempt_open());
  EXPECT_EQ(m.master_port(), 0);
  EXPECT_EQ(m.world_size(), 5u);
}

TEST(Release, AStartDueBeforeTheReadyWaitsForIt) {
  auto m = three_nodes();
  EXPECT_TRUE(m.handle(StartDue{Round{1}}).empty());
  EXPECT_EQ(m.state(), State::awaiting_ready_start_due);
  EXPECT_TRUE(m.handle(StartDue{Round{7}}).empty());  // another round's: nothing
}

TEST(Release, TheReadyAssignsAndStartsTheOthersThenStartsNodeRankZero) {
  auto m = three_nodes();
  m.handle(StartDue{Round{1}});
  auto e = m.handle(ready("n1", 1, 40001, "cafe"));
  ASSERT_EQ(e.size(), 4u);
  for (std::size_t i = 0; i < 2; ++i) {
    auto a = std::get<SendAssign>(e[i]);
    EXPECT_EQ(a.node, i == 0 ? "n2" : "n3");
    EXPECT_EQ(a.index, i + 1);
    ASSERT_TRUE(a.release);
    EXPECT_EQ(a.release->master_port, 40001);
    EXPECT_EQ(a.release->nccl_id, "cafe");
    EXPECT_TRUE(a.start);
  }
  auto up = std::get<StoreUp>(e[2]);
  EXPECT_EQ(up.master_port, 40001);
  EXPECT_TRUE(up.has_nccl_id);
  EXPECT_EQ(std::get<SendStart>(e[3]).node, "n1");
  EXPECT_EQ(m.state(), State::running);
  EXPECT_EQ(m.master_port(), 40001);
}

TEST(Release, AReadyBeforeTheStartIsDueAssignsOnlyThenTheStartGoesToAll) {
  auto m = three_nodes();
  auto e = m.handle(ready("n1", 1, 29500, std::nullopt));
  EXPECT_EQ(all<SendAssign>(e).size(), 2u);
  for (const auto& a : all<SendAssign>(e)) EXPECT_FALSE(a.start);
  EXPECT_TRUE(all<SendStart>(e).empty());
  EXPECT_FALSE(all<StoreUp>(e).at(0).has_nccl_id);
  EXPECT_EQ(m.state(), State::released);
  e = m.handle(StartDue{Round{1}});
  auto starts = all<SendStart>(e);
  ASSERT_EQ(starts.size(), 3u);
  EXPECT_EQ(starts[0].node, "n1");
  EXPECT_EQ(starts[2].node, "n3");
  EXPECT_EQ(m.state(), State::running);
  EXPECT_TRUE(m.handle(StartDue{Round{1}}).empty());  // started once
}

TEST(Release, AReadyNobodyAwaitsIsIgnored) {
  auto m = three_nodes();
  for (const auto& r :
       {ready("n2", 1), ready("n1", 2), ready("n9", 1)}) {  // not node rank 0; another round; a stranger
    auto e = m.handle(r);
    ASSERT_EQ(e.size(), 1u);
    EXPECT_EQ(std::get<ReadyIgnored>(e[0]).node, r.node);
  }
  EXPECT_EQ(m.state(), State::awaiting_ready);
  m.handle(ready("n1", 1));
  auto e = m.handle(ready("n1", 1));  // twice
  ASSERT_EQ(e.size(), 1u);
  EXPECT_TRUE(std::holds_alternative<ReadyIgnored>(e[0]));
  RoundMachine idle;
  EXPECT_TRUE(std::holds_alternative<ReadyIgnored>(idle.handle(ready("n1", 1)).at(0)));
}

TEST(Release, AReadyWithAnErrorFailsTheLaunchAndReleasesNothing) {
  auto m = three_nodes();
  m.handle(StartDue{Round{1}});
  auto e = m.handle(Ready{"n1", Round{1}, 0, std::nullopt, "nccl.unique_id: on, but libnccl is not there"});
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(std::get<ReadyFailed>(e[0]).message, "nccl.unique_id: on, but libnccl is not there");
  EXPECT_EQ(m.state(), State::stopping);
  EXPECT_TRUE(all<SendAssign>(m.handle(ready("n1", 1))).empty());
}

TEST(Release, ARoundStoppedBeforeItsReadySendsNothingMore) {
  auto m = three_nodes();
  m.handle(StartDue{Round{1}});
  EXPECT_TRUE(m.handle(StopIssued{Round{1}, Micros(5s)}).empty());
  EXPECT_EQ(m.state(), State::stopping);
  auto e = m.handle(ready("n1", 1));
  EXPECT_TRUE(all<SendAssign>(e).empty());
  EXPECT_TRUE(all<SendStart>(e).empty());
  EXPECT_EQ(m.master_port(), 0);
}

TEST(Release, TheStopForgetsTheStoresPort) {
  auto m = three_nodes();
  m.handle(ready("n1", 1, 41000));
  EXPECT_EQ(m.master_port(), 41000);
  m.handle(StopIssued{Round{1}, Micros(5s)});
  EXPECT_EQ(m.master_port(), 0);
  EXPECT_TRUE(m.handle(StartDue{Round{1}}).empty());
}

// ---------------------------------------------------------------- workers

TEST(Workers, EveryRankStartedIsSaidOnce) {
  auto m = three_nodes();
  m.handle(StartDue{Round{1}});
  m.handle(ready("n1", 1));
  const std::vector<std::pair<std::string, std::uint32_t>> ranks{{"n1", 0}, {"n1", 1}, {"n2", 0}, {"n3", 0}};
  for (const auto& [n, lr] : ranks) EXPECT_TRUE(m.handle(WorkerStarted{n, Round{1}, LocalRank{lr}, 10}).empty());
  EXPECT_TRUE(m.handle(WorkerStarted{"n2", Round{1}, LocalRank{1}, 10}).empty());  // n2 has one worker
  EXPECT_TRUE(m.handle(WorkerStarted{"n3", Round{2}, LocalRank{1}, 10}).empty());  // another round
  auto e = m.handle(WorkerStarted{"n3", Round{1}, LocalRank{1}, 42});
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(std::get<AllStarted>(e[0]).world_size, 5u);
  EXPECT_EQ(m.pid({"n3", 1}), 42u);
  EXPECT_TRUE(m.handle(WorkerStarted{"n3", Round{1}, LocalRank{1}, 43}).empty());  // a restarted report: not again
  EXPECT_EQ(m.pid({"n3", 1}), 43u);
  EXPECT_FALSE(m.pid({"n2", 1}));
}

TEST(Workers, GlobalRanksFollowThePlacement) {
  auto m = three_nodes();
  EXPECT_EQ(m.global_rank("n1", Round{1}, 1), 1);
  EXPECT_EQ(m.global_rank("n2", Round{1}, 0), 2);
  EXPECT_EQ(m.global_rank("n3", Round{1}, 1), 4);
  EXPECT_FALSE(m.global_rank("n2", Round{1}, 1));
  EXPECT_FALSE(m.global_rank("n3", Round{2}, 0));
  EXPECT_FALSE(m.global_rank("n4", Round{1}, 0));
}

TEST(Workers, OnlyTheFirstExitOfARankReachesTheRendezvous) {
  auto m = three_nodes();
  auto e = m.handle(exit_of("n2", 1, 0, 3, Micros(10s)));
  auto f = all<ForwardExit>(e);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].exit.node, "n2");
  EXPECT_EQ(f[0].exit.exit_code, 3);
  EXPECT_FALSE(f[0].exit.signal);
  EXPECT_EQ(f[0].exit.agent_time, Micros(17s));  // the agent's own stamp: the rendezvous maps it
  EXPECT_EQ(f[0].exit.pid, 100u);
  EXPECT_TRUE(m.handle(exit_of("n2", 1, 0, 3, Micros(11s))).empty());
  EXPECT_TRUE(m.handle(exit_of("n2", 2, 0, 3, Micros(11s))).empty());  // another round
  auto k = m.handle(exit_of("n1", 1, 0, 0, Micros(12s), SIGKILL));
  ASSERT_EQ(all<ForwardExit>(k).size(), 1u);
  EXPECT_EQ(all<ForwardExit>(k)[0].exit.signal, SIGKILL);
  EXPECT_FALSE(all<ForwardExit>(k)[0].exit.exit_code);
}

TEST(Workers, ALeavingNodesExitsAreFiledButNeverACause) {
  auto m = three_nodes();
  auto x = exit_of("n3", 1, 0, 1, Micros(10s));
  x.node_leaving = true;
  EXPECT_TRUE(m.handle(x).empty());
  m.handle(StopIssued{Round{1}, Micros(20s)});
  auto c = all<AttemptClosed>(m.handle(Close{Outcome::failed, std::nullopt}));
  ASSERT_EQ(c.size(), 1u);
  EXPECT_FALSE(c[0].first_failure);
}

// ---------------------------------------------------------------- closing the attempt

// An agent's SIGUSR1, forwarded to a rank with no handler for it (version 6's `forwarded`): the
// round ends, but neither the rendezvous's failure nor the order of exits makes it the cause.
TEST(Close, ARankKilledByAForwardedSignalIsNeverTheFirstFailure) {
  auto m = three_nodes();
  auto x = exit_of("n2", 1, 0, 0, Micros(10s), SIGUSR1);
  x.forwarded = true;
  auto fwd = all<ForwardExit>(m.handle(x));
  ASSERT_EQ(fwd.size(), 1u);
  EXPECT_TRUE(fwd[0].exit.forwarded);  // the rendezvous's message says so too
  m.handle(StopIssued{Round{1}, Micros(11s)});
  m.handle(exit_of("n1", 1, 0, 0, Micros(12s), SIGTERM));
  rdzv::Failure f;  // the rendezvous filed the forwarded exit as its failure
  f.node = "n2";
  f.local_rank = LocalRank{0};
  auto c = all<AttemptClosed>(m.handle(Close{Outcome::failed, f}));
  ASSERT_EQ(c.size(), 1u);
  EXPECT_FALSE(c[0].first_failure);
  EXPECT_FALSE(c[0].node_failure);
}

// Two ranks on n1: a forwarded SIGUSR1 kills local rank 0, so n1's agent stops local rank 1
// with its own SIGTERM, before the coordinator's stop, and says so (version 6's `after_stop`).
// That SIGTERM is the stop's doing: no rank is the first failure. (It was, on the old machine:
// stamped before the coordinator's stop, the sibling looked like a failure of its own.)
TEST(Close, ARankStoppedByItsOwnNodeAfterAForwardedDeathIsNeverTheFirstFailure) {
  auto m = three_nodes();
  auto x = exit_of("n1", 1, 0, 0, Micros(10s), SIGUSR1);
  x.forwarded = true;
  m.handle(x);
  auto sibling = exit_of("n1", 1, 1, 0, Micros(10500ms), SIGTERM);
  sibling.after_stop = true;
  m.handle(sibling);
  m.handle(StopIssued{Round{1}, Micros(11s)});
  auto later = exit_of("n3", 1, 0, 0, Micros(12s), SIGTERM);
  later.after_stop = true;
  m.handle(later);
  rdzv::Failure f;  // even were the sibling the rendezvous's failure
  f.node = "n1";
  f.local_rank = LocalRank{1};
  auto c = all<AttemptClosed>(m.handle(Close{Outcome::failed, f}));
  ASSERT_EQ(c.size(), 1u);
  EXPECT_FALSE(c[0].first_failure);
}

// A rank that fails by itself on another node, before anything was stopped there, stays first.
TEST(Close, AnOwnFailureElsewhereStaysFirstBesideExitsAfterANodesStop) {
  auto m = three_nodes();
  auto x = exit_of("n1", 1, 0, 0, Micros(10s), SIGUSR1);
  x.forwarded = true;
  m.handle(x);
  auto sibling = exit_of("n1", 1, 1, 0, Micros(10500ms), SIGTERM);
  sibling.after_stop = true;
  m.handle(sibling);
  m.handle(exit_of("n3", 1, 1, 3, Micros(10700ms)));
  m.handle(StopIssued{Round{1}, Micros(11s)});
  auto c = all<AttemptClosed>(m.handle(Close{Outcome::failed, std::nullopt}));
  EXPECT_EQ(c.at(0).first_failure, (WorkerKey{"n3", 1}));
}

TEST(Close, ARealFailureBeforeAForwardedSignalIsStillFirst) {
  auto m = three_nodes();
  auto x = exit_of("n2", 1, 0, 0, Micros(11s), SIGUSR1);
  x.forwarded = true;
  m.handle(x);
  m.handle(exit_of("n3", 1, 1, 3, Micros(10s)));  // happened first, arrived later
  m.handle(StopIssued{Round{1}, Micros(12s)});
  auto c = all<AttemptClosed>(m.handle(Close{Outcome::failed, std::nullopt}));
  EXPECT_EQ(c.at(0).first_failure, (WorkerKey{"n3", 1}));
}

TEST(Close, TheEarliestFailureBeforeTheStopIsFirst) {
  auto m = three_nodes();
  m.handle(exit_of("n3", 1, 1, 9, Micros(12s)));  // arrives first, happened later
  m.handle(exit_of("n1", 1, 0, 7, Micros(10s)));
  m.handle(StopIssued{Round{1}, Micros(13s)});
  m.handle(exit_of("n2", 1, 0, 0, Micros(9s), SIGTERM));  // mapped earlier, but its clock said so: before the stop
  auto c = all<AttemptClosed>(m.handle(Close{Outcome::failed, std::nullopt}));
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].first_failure, (WorkerKey{"n2", 0}));
  EXPECT_EQ(m.state(), State::closed);
  EXPECT_FALSE(m.attempt_open());
  EXPECT_TRUE(m.handle(Close{Outcome::failed, std::nullopt}).empty());  // once
}

TEST(Close, ExitsAfterTheStopAreItsEffectUnlessNothingCameBefore) {
  auto m = three_nodes();
  m.handle(StopIssued{Round{1}, Micros(10s)});
  m.handle(exit_of("n1", 1, 0, 0, Micros(12s), SIGTERM));
  m.handle(
      exit_of("n2", 1, 0, 0, Micros(11s), SIGTERM));  // later to arrive, earlier stamped: still not the first arrival
  auto c = all<AttemptClosed>(m.handle(Close{Outcome::failed, std::nullopt}));
  EXPECT_EQ(c.at(0).first_failure, (WorkerKey{"n1", 0}));
}

TEST(Close, StoppedByTheUserNoExitAfterTheStopIsAFailure) {
  auto m = three_nodes();
  m.handle(StopIssued{Round{1}, Micros(10s)});
  m.handle(exit_of("n1", 1, 0, 0, Micros(12s), SIGTERM));
  auto c = all<AttemptClosed>(m.handle(Close{Outcome::stopped, std::nullopt}));
  EXPECT_FALSE(c.at(0).first_failure);
  EXPECT_EQ(c.at(0).outcome, Outcome::stopped);
}

TEST(Close, TheRendezvousesRankFailureWinsWhenItWasFiled) {
  auto m = three_nodes();
  m.handle(exit_of("n1", 1, 0, 7, Micros(10s)));
  m.handle(exit_of("n3", 1, 1, 9, Micros(12s)));
  rdzv::Failure f;
  f.node = "n3";
  f.local_rank = LocalRank{1};
  auto c = all<AttemptClosed>(m.handle(Close{Outcome::failed, f}));
  EXPECT_EQ(c.at(0).first_failure, (WorkerKey{"n3", 1}));
  EXPECT_FALSE(c.at(0).node_failure);
}

TEST(Close, ANodeLostIsTheCauseUnlessARankFailedBeforeIt) {
  rdzv::Failure lost;
  lost.kind = rdzv::Failure::Kind::node_lost;
  lost.node = "n2";
  lost.time = Micros(10s);
  {
    auto m = three_nodes();
    m.handle(StopIssued{Round{1}, Micros(11s)});
    m.handle(exit_of("n1", 1, 0, 0, Micros(10500ms), SIGTERM));  // after the loss, before the stop: its fallout
    auto c = all<AttemptClosed>(m.handle(Close{Outcome::failed, lost}));
    EXPECT_FALSE(c.at(0).first_failure);
    ASSERT_TRUE(c.at(0).node_failure);
    EXPECT_EQ(c.at(0).node_failure->node, "n2");
  }
  {
    auto m = three_nodes();
    m.handle(exit_of("n1", 1, 0, 4, Micros(9s)));
    m.handle(StopIssued{Round{1}, Micros(11s)});
    auto c = all<AttemptClosed>(m.handle(Close{Outcome::failed, lost}));
    EXPECT_EQ(c.at(0).first_failure, (WorkerKey{"n1", 0}));
  }
}

TEST(Close, SucceededNamesNoFailure) {
  auto m = three_nodes();
  m.handle(exit_of("n1", 1, 0, 4, Micros(9s)));
  auto c = all<AttemptClosed>(m.handle(Close{Outcome::succeeded, std::nullopt}));
  EXPECT_FALSE(c.at(0).first_failure);
}

TEST(Close, CountsTheSigkillsAfterTheStop) {
  auto m = three_nodes();
  m.handle(exit_of("n1", 1, 0, 0, Micros(9s), SIGKILL));  // before the stop: not the grace's
  m.handle(StopIssued{Round{1}, Micros(10s)});
  m.handle(exit_of("n1", 1, 1, 0, Micros(40s), SIGKILL));
  m.handle(exit_of("n3", 1, 0, 0, Micros(41s), SIGKILL));
  m.handle(exit_of("n2", 1, 0, 0, Micros(12s), SIGTERM));
  EXPECT_EQ(all<AttemptClosed>(m.handle(Close{Outcome::failed, std::nullopt})).at(0).killed_after_stop, 2u);
}

TEST(Close, NoAttemptNoClose) {
  RoundMachine m;
  EXPECT_TRUE(m.handle(Close{Outcome::failed, std::nullopt}).empty());
  EXPECT_TRUE(m.handle(StopIssued{Round{1}, Micros(1s)}).empty());
  EXPECT_EQ(m.state(), State::idle);
}

TEST(Rounds, ANewRoundForgetsTheLastOne) {
  auto m = three_nodes();
  m.handle(StartDue{Round{1}});
  m.handle(ready("n1", 1, 40000));
  m.handle(WorkerStarted{"n1", Round{1}, LocalRank{0}, 10});
  m.handle(exit_of("n1", 1, 0, 1, Micros(9s)));
  m.handle(StopIssued{Round{1}, Micros(10s)});
  m.handle(Close{Outcome::failed, std::nullopt});
  auto e = m.handle(Assigned{assignment(2, {{"n2", 1}, {"n3", 1}})});
  EXPECT_EQ(std::get<SendAssign>(e.at(0)).node, "n2");
  EXPECT_EQ(m.state(), State::awaiting_ready);
  EXPECT_EQ(m.round(), Round{2});
  EXPECT_FALSE(m.pid({"n1", 0}));
  EXPECT_FALSE(m.global_rank("n1", Round{2}, 0));
  EXPECT_EQ(m.global_rank("n3", Round{2}, 0), 1);
  // The old round's stragglers are nobody's business now.
  EXPECT_TRUE(m.handle(exit_of("n1", 1, 0, 1, Micros(11s))).empty());
  EXPECT_TRUE(std::holds_alternative<ReadyIgnored>(m.handle(ready("n1", 1)).at(0)));
  m.handle(StopIssued{Round{2}, Micros(20s)});
  auto c = all<AttemptClosed>(m.handle(Close{Outcome::failed, std::nullopt}));
  EXPECT_FALSE(c.at(0).first_failure);
}

// ---------------------------------------------------------------- whole-machine invariants

TEST(Invariants, RandomEventStreamsKeepTheRoundsPromises) {
  std::mt19937 rng(23);
  const std::vector<std::string> hosts{"n1", "n2", "n3", "n4", "n5"};
  for (int trial = 0; trial < 400; ++trial) {
    RoundMachine m;
    // The model: what the stream said and what went out, for the current round.
    std::uint32_t round = 0;
    rdzv::AssignRanks a;
    bool open = false, released = false, due = false, halted = false, closed = false;
    Release rel;
    std::map<std::string, int> assigns, starts;
    std::set<WorkerKey> started, failed_exits, exited;
    int all_started = 0;
    for (int step = 0; step < 120; ++step) {
      const auto& node = hosts[rng() % hosts.size()];
      const auto some_round = Round{rng() % 4 == 0 ? round + 1 - rng() % 3 : round};
      const auto lr = static_cast<std::uint32_t>(rng() % 4);
      Event ev;
      switch (rng() % 12) {
        case 0: {
          std::vector<std::pair<std::string, std::uint32_t>> nodes;
          for (const auto& h : hosts) {
            if (rng() % 2) nodes.emplace_back(h, 1 + rng() % 3);
          }
          if (nodes.empty()) nodes.emplace_back("n1", 1);
          a = assignment(++round, nodes);
          ev = Assigned{a};
          open = true;
          released = due = halted = closed = false;
          assigns.clear();
          starts.clear();
          started.clear();
          failed_exits.clear();
          exited.clear();
          all_started = 0;
          break;
        }
        case 1:
          ev = StartDue{some_round};
          break;
        case 2:
        case 3: {
          Ready r{rng() % 3 ? (a.nodes.empty() ? node : a.nodes.front().node) : node, some_round,
                  static_cast<std::uint16_t>(1024 + rng() % 60000), std::nullopt, std::nullopt};
          if (rng() % 2) r.nccl_id = std::to_string(rng());
          if (rng() % 25 == 0) r.error = "no libnccl";
          ev = r;
          break;
        }
        case 4:
        case 5:
          ev = WorkerStarted{node, some_round, LocalRank{lr}, static_cast<std::uint32_t>(rng())};
          break;
        case 6:
        case 7: {
          auto x = exit_of(node, some_round.value, lr, static_cast<int>(rng() % 3),
                           Micros(static_cast<long long>(rng() % 100'000'000)),
                           rng() % 4 == 0 ? std::optional<int>(SIGKILL) : std::nullopt);
          x.node_leaving = rng() % 10 == 0;
          ev = x;
          break;
        }
        case 8:
        case 9:
          ev = StopIssued{Round{round}, Micros(static_cast<long long>(rng() % 100'000'000))};
          break;
        default: {
          Close c{static_cast<Outcome>(rng() % 3), std::nullopt};
          if (rng() % 2) {
            rdzv::Failure f;
            f.node = node;
            if (rng() % 2) f.local_rank = LocalRank{lr};
            f.time = Micros(static_cast<long long>(rng() % 100'000'000));
            c.failure = f;
          }
          ev = c;
          break;
        }
      }
      const auto e = m.handle(ev);

      // The model follows the stream.
      const bool in_round = open && !halted && !closed;
      if (auto* s = std::get_if<StartDue>(&ev); s && s->round == a.round && in_round) due = true;
      bool refused = false;
      if (auto* r = std::get_if<Ready>(&ev);
          r && in_round && !released && r->round == a.round && !a.nodes.empty() && r->node == a.nodes.front().node) {
        if (r->error) {
          refused = true;
          halted = true;
        } else {
          released = true;
          rel = Release{r->master_port, r->nccl_id};
        }
      }
      if (std::holds_alternative<StopIssued>(ev) && open && !closed) halted = true;

      for (const auto& x : all<SendAssign>(e)) {
        // I1, I2: node rank 0's alone before the release; the others carry its port and id.
        if (x.index == 0) {
          EXPECT_FALSE(x.release);
        } else {
          ASSERT_TRUE(released);
          ASSERT_TRUE(x.release);
          EXPECT_EQ(x.release->master_port, rel.master_port);
          EXPECT_EQ(x.release->nccl_id, rel.nccl_id);
        }
        EXPECT_EQ(x.node, a.nodes.at(x.index).node);
        EXPECT_FALSE(halted && !std::holds_alternative<Assigned>(ev));  // I4
        EXPECT_EQ(++assigns[x.node], 1);                                // I3
        if (x.start) EXPECT_EQ(++starts[x.node], 1);
      }
      for (const auto& x : all<SendStart>(e)) {
        EXPECT_TRUE(released);           // I1
        EXPECT_FALSE(halted);            // I4
        EXPECT_EQ(++starts[x.node], 1);  // I3
        EXPECT_EQ(x.round, a.round);
      }
      // I3: released and due (before any stop): every member has its one start.
      if (released && due) {
        for (const auto& na : a.nodes) EXPECT_EQ(starts[na.node], 1) << na.node;
      } else {
        EXPECT_TRUE(starts.empty());
      }
      EXPECT_EQ(all<ReadyFailed>(e).size(), refused ? 1u : 0u);
      // I5
      if (auto* s = std::get_if<WorkerStarted>(&ev); s && m.global_rank(s->node, s->round, s->local_rank.value)) {
        started.insert({s->node, s->local_rank.value});
      }
      for (const auto& x : all<AllStarted>(e)) {
        EXPECT_EQ(++all_started, 1);
        EXPECT_EQ(started.size(), a.world_size);
        EXPECT_EQ(x.round, a.round);
      }
      // Exits: the first per worker reaches the rendezvous, none of a leaving node.
      if (auto* x = std::get_if<WorkerExited>(&ev)) {
        const bool counts = open && m.global_rank(x->node, x->round, x->local_rank.value).has_value();
        const bool first = counts && exited.insert({x->node, x->local_rank.value}).second;
        EXPECT_EQ(all<ForwardExit>(e).size(), first && !x->node_leaving ? 1u : 0u);
        if (first && !x->node_leaving && (x->signal || x->exit_code.value_or(0) != 0)) {
          failed_exits.insert({x->node, x->local_rank.value});
        }
      } else {
        EXPECT_TRUE(all<ForwardExit>(e).empty());
      }
      // I6
      const auto closes = all<AttemptClosed>(e);
      if (std::holds_alternative<Close>(ev) && open && !closed) {
        ASSERT_EQ(closes.size(), 1u);
        closed = true;
        const auto& c = closes[0];
        if (c.first_failure) {
          EXPECT_NE(c.outcome, Outcome::succeeded);
          const auto& cf = std::get<Close>(ev).failure;
          EXPECT_TRUE(failed_exits.contains(*c.first_failure) ||
                      (cf && cf->local_rank && *c.first_failure == WorkerKey{cf->node, cf->local_rank->value}));
        }
      } else {
        EXPECT_TRUE(closes.empty());
      }
      // I7
      EXPECT_EQ(m.master_port(), released && !halted && !closed ? rel.master_port : 0);
      EXPECT_EQ(m.attempt_open(), open && !closed);
    }
  }
}

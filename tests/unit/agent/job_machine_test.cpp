// The agent's job lifecycle (lib/agent/job_machine) without root, sockets or processes: every
// row of the table, the 02d0419 hang replayed, and random event streams against the header's
// invariants.
#include "agent/job_machine.hpp"

#include <gtest/gtest.h>

#include <csignal>
#include <map>
#include <random>
#include <set>

using namespace ddp::agent::job;

namespace {

template <class T>
std::vector<T> all(const std::vector<Effect>& effects) {
  std::vector<T> out;
  for (const auto& e : effects) {
    if (auto* x = std::get_if<T>(&e)) out.push_back(*x);
  }
  return out;
}
template <class T>
bool has(const std::vector<Effect>& effects) {
  return !all<T>(effects).empty();
}
template <class T>
T one(const std::vector<Effect>& effects) {
  auto v = all<T>(effects);
  EXPECT_EQ(v.size(), 1u);
  return v.empty() ? T{} : v.front();
}

constexpr LinkId kA = 1, kB = 2;

// A job held by link kA, joined.
JobMachine joined(Config c = {"n1"}) {
  JobMachine m(std::move(c));
  EXPECT_EQ(m.busy(kA), JobMachine::Busy::no);
  m.handle(Offer{kA, "j1"});
  EXPECT_EQ(m.phase(), Phase::preflight);
  m.handle(Joined{});
  EXPECT_EQ(m.phase(), Phase::joined);
  return m;
}

// ... and running round `round` on node rank 1.
JobMachine running(std::uint32_t round = 1, Config c = {"n1"}) {
  auto m = joined(std::move(c));
  auto out = m.handle(Assign{kA, round, 1, true});
  EXPECT_EQ(one<PrepareRound>(out).serve, false);
  EXPECT_EQ(one<StartWorkers>(out).round, round);
  EXPECT_EQ(m.phase(), Phase::running);
  return m;
}

}  // namespace

TEST(JobMachine, EveryPhaseHasARowForEveryEvent) {
  for (int p = 0; p <= static_cast<int>(Phase::done); ++p) {
    for (std::size_t e = 0; e < std::variant_size_v<Event>; ++e) {
      EXPECT_NE(JobMachine::why(static_cast<Phase>(p), e), nullptr)
          << phase_name(static_cast<Phase>(p)) << " event " << e;
    }
  }
}

TEST(JobMachine, OneJobAtATime) {
  auto m = joined();
  EXPECT_EQ(m.busy(kB), JobMachine::Busy::other_link);
  EXPECT_EQ(m.busy(kA), JobMachine::Busy::no);  // its own link may offer again (a re-offer)
  ASSERT_TRUE(m.addressed(kB, std::nullopt, "assign"));
  EXPECT_EQ(m.addressed(kB, std::nullopt, "assign")->message, "'assign' for a job this agent does not hold for you");
  EXPECT_EQ(m.addressed(kA, std::string("j2"), "stop")->message,
            "'stop' names job j2, but this connection's job is j1");
  EXPECT_EQ(m.addressed(kA, std::string("j2"), "stop")->code, RefuseCode::bad_value);
  EXPECT_FALSE(m.addressed(kA, std::string("j1"), "stop"));
  m = running();
  EXPECT_EQ(m.busy(kA), JobMachine::Busy::workers_running);
}

TEST(JobMachine, NodeRankOneRunsAndReportsEachExitOnce) {
  auto m = running(3);
  auto out = m.handle(FirstFailure{1, 9, "exited with code 1"});
  EXPECT_EQ(one<ReportExit>(out).local_rank, 1);
  EXPECT_FALSE(one<ReportExit>(out).detail);
  out = m.handle(WorkersDone{false, {0, 1}, 1, 0});
  auto exits = all<ReportExit>(out);
  ASSERT_EQ(exits.size(), 2u);  // rank 0's, and the first failure again with its detail
  EXPECT_EQ(exits[0].local_rank, 0);
  EXPECT_FALSE(exits[0].detail);
  EXPECT_EQ(exits[1].local_rank, 1);
  EXPECT_TRUE(exits[1].detail);
  auto fin = one<ReportFinished>(out);
  EXPECT_EQ(fin.round, 3u);
  EXPECT_FALSE(fin.ok);
  EXPECT_EQ(m.phase(), Phase::done);
  // The link's close after the result is how a job normally ends.
  out = m.handle(LinkClosed{kA, "closed"});
  EXPECT_TRUE(has<Forget>(out));
  for (const auto& l : all<Log>(out)) EXPECT_EQ(l.level, Log::Level::info) << l.text;
  EXPECT_FALSE(has<Exit>(out));  // a daemon keeps serving
  EXPECT_EQ(m.phase(), Phase::idle);
}

TEST(JobMachine, NodeRankZeroIsStartedOnlyAfterItsReady) {
  auto m = joined();
  auto out = m.handle(Assign{kA, 1, 0, false});
  EXPECT_TRUE(one<PrepareRound>(out).serve);
  EXPECT_EQ(m.phase(), Phase::readying);
  out = m.handle(Ready{1});
  EXPECT_EQ(m.phase(), Phase::assigned);
  out = m.handle(Start{kA, 1});
  EXPECT_EQ(one<StartWorkers>(out).round, 1u);
}

TEST(JobMachine, AStartWhileTheIdIsOnItsWayIsRefusedWithTheRoundsResult) {
  auto m = joined();
  m.handle(Assign{kA, 1, 0, false});
  auto out = m.handle(Start{kA, 1});
  EXPECT_FALSE(has<StartWorkers>(out));
  EXPECT_EQ(one<ReportFinished>(out).error, "start without an assignment");
  out = m.handle(Start{kA, 1});  // said once
  EXPECT_TRUE(out.empty());
}

TEST(JobMachine, AStartWithoutAnAssignmentOrTwiceIsRefusedOnce) {
  auto m = joined();
  auto out = m.handle(Start{kA, 4});
  EXPECT_EQ(one<ReportFinished>(out).round, 4u);
  m = running(2);
  out = m.handle(Start{kA, 2});  // running already: the old agent's answer too
  EXPECT_FALSE(has<StartWorkers>(out));
  EXPECT_EQ(one<ReportFinished>(out).error, "start without an assignment");
}

TEST(JobMachine, AssignBeforeTheJoinOrWhileWorkersRunIsRefused) {
  JobMachine m({"n1"});
  m.handle(Offer{kA, "j1"});
  auto out = m.handle(Assign{kA, 1, 1, false});
  EXPECT_EQ(one<Refuse>(out).message, "assign for round 1 before this node's join");
  m = running(1);
  out = m.handle(Assign{kA, 2, 1, false});
  EXPECT_EQ(one<Refuse>(out).message, "assign for round 2 while round 1's workers still run");
  EXPECT_EQ(m.phase(), Phase::running);
}

// A Ctrl-C's stop (version 6's interrupt_grace_ms): the workers get SIGINT first.
TEST(JobMachine, ACtrlCsStopCarriesItsInterruptGraceToTheWorkers) {
  auto m = running(1);
  auto out = m.handle(Stop{kA, 1, false, "stopped by the user", 10'000});
  EXPECT_FALSE(one<StopWorkers>(out).now);
  EXPECT_EQ(one<StopWorkers>(out).interrupt_ms, 10'000u);
  m = running(1);
  out = m.handle(Stop{kA, 1, false, "node n2 lost"});
  EXPECT_EQ(one<StopWorkers>(out).interrupt_ms, 0u);
}

TEST(JobMachine, StopStopsTheRoundsWorkersOrAnswersAtOnce) {
  auto m = running(1);
  auto out = m.handle(Stop{kA, 1, false, "node n2 lost"});
  EXPECT_TRUE(has<DropIdHolder>(out));
  EXPECT_FALSE(one<StopWorkers>(out).now);
  out = m.handle(Stop{kA, 1, true, "again"});
  EXPECT_TRUE(one<StopWorkers>(out).now);
  m.handle(WorkersDone{false, {0}, std::nullopt, 0});
  out = m.handle(Stop{kA, 1, false, "late"});  // its result went up already
  EXPECT_FALSE(has<ReportFinished>(out));
  // A round stopped before its start: its result at once, and no start after it.
  m = joined();
  m.handle(Assign{kA, 5, 0, false});
  out = m.handle(Stop{kA, 5, false, "n2 lost"});
  EXPECT_TRUE(has<DropIdHolder>(out));
  EXPECT_EQ(one<ReportFinished>(out).round, 5u);
  EXPECT_EQ(m.phase(), Phase::done);
  EXPECT_TRUE(m.handle(Ready{5}).empty());
  EXPECT_EQ(m.phase(), Phase::done);
}

TEST(JobMachine, TheRoundFailsWhenTheEdgeCannotServeIt) {
  auto m = joined();
  m.handle(Assign{kA, 1, 0, false});
  auto out = m.handle(RoundFailed{1, "n1 cannot serve the job's store: port taken"});
  EXPECT_EQ(one<ReportFinished>(out).error, "n1 cannot serve the job's store: port taken");
  EXPECT_TRUE(m.handle(Start{kA, 1}).empty());  // its result went up: the start is not answered again
  m = running(2);
  out = m.handle(RoundFailed{2, "n1: cannot start the shepherd"});  // StartWorkers failed
  EXPECT_FALSE(one<ReportFinished>(out).ok);
  EXPECT_FALSE(m.workers_running());
}

TEST(JobMachine, SignalsReachTheRunningRoundOnly) {
  auto m = running(2);
  EXPECT_EQ(one<ForwardSignal>(m.handle(Signal{2u, SIGUSR1, "SIGUSR1"})).sig, SIGUSR1);
  EXPECT_FALSE(has<ForwardSignal>(m.handle(Signal{1u, SIGUSR1, "SIGUSR1"})));
  EXPECT_EQ(one<ForwardSignal>(m.handle(Signal{std::nullopt, SIGUSR2, "SIGUSR2"})).sig, SIGUSR2);
  m = joined();
  EXPECT_TRUE(m.handle(Signal{std::nullopt, SIGUSR1, "SIGUSR1"}).empty());
}

TEST(JobMachine, ALostCoordinatorsWorkersAreStoppedThenTheJobForgotten) {
  auto m = running(1);
  auto out = m.handle(LinkClosed{kA, "no heartbeat"});
  EXPECT_FALSE(one<StopWorkers>(out).now);
  EXPECT_EQ(m.phase(), Phase::draining);
  EXPECT_EQ(m.busy(kB), JobMachine::Busy::other_link);  // its workers still run
  out = m.handle(WorkersDone{false, {0, 1}, std::nullopt, 0});
  EXPECT_FALSE(has<ReportExit>(out));  // nobody to tell
  EXPECT_FALSE(has<ReportFinished>(out));
  EXPECT_TRUE(has<Forget>(out));
  EXPECT_FALSE(has<Exit>(out));
  EXPECT_EQ(m.busy(kB), JobMachine::Busy::no);
}

TEST(JobMachine, AOneShotAgentExitsAfterItsJob) {
  auto m = running(1, {"n1", true, false});
  m.handle(WorkersDone{true, {0}, std::nullopt, 0});
  auto out = m.handle(LinkClosed{kA, "closed"});
  EXPECT_TRUE(has<Forget>(out));
  EXPECT_TRUE(has<Exit>(out));
  // --stdio: the only link closing before any job ends it too; a listener's stray link does not.
  JobMachine stdio({"n1", true, true});
  EXPECT_TRUE(has<Exit>(stdio.handle(LinkClosed{kA, "EOF"})));
  JobMachine listener({"n1", true, false});
  EXPECT_FALSE(has<Exit>(listener.handle(LinkClosed{kA, "EOF"})));
}

TEST(JobMachine, ShutdownLeavesStopsThenExitsOnce) {
  auto m = running(1);
  auto out = m.handle(Shutdown{"SIGTERM"});
  EXPECT_EQ(one<SendLeaving>(out).reason, "its agent is shutting down (SIGTERM)");
  EXPECT_FALSE(one<StopWorkers>(out).now);
  EXPECT_FALSE(has<Exit>(out));
  out = m.handle(Shutdown{"SIGTERM"});
  EXPECT_TRUE(one<StopWorkers>(out).now);  // again: kill now
  out = m.handle(WorkersDone{false, {0}, std::nullopt, 0});
  EXPECT_TRUE(has<ReportFinished>(out));  // the link is still open: the result goes up
  EXPECT_TRUE(has<Forget>(out));
  EXPECT_TRUE(has<Exit>(out));
  EXPECT_FALSE(has<Exit>(m.handle(LinkClosed{kA, "closed"})));
  // Idle, or holding a job with nothing running: exit at once.
  JobMachine idle({"n1"});
  EXPECT_TRUE(has<Exit>(idle.handle(Shutdown{"SIGINT"})));
  auto held = joined();
  out = held.handle(Shutdown{"SIGTERM"});
  EXPECT_TRUE(has<Forget>(out));
  EXPECT_FALSE(has<SendLeaving>(out));
  EXPECT_EQ(all<Exit>(out).size(), 1u);
}

// 02d0419: SIGTERM while the job ran; the workers ended, and the coordinator's link closed
// before the shepherd's report came. The old agent forgot the job from the link's close
// (abandon_job: nothing ran any more) without finishing the shutdown, and the report, which
// would have, found no job: the agent hung. Here every way a job ends goes through one place.
TEST(JobMachine, Replay02d0419ASigtermdAgentExitsWhateverComesFirst) {
  {
    auto m = running(1);
    m.handle(Shutdown{"SIGTERM"});
    auto out = m.handle(LinkClosed{kA, "connection closed"});  // before the report
    EXPECT_FALSE(has<Exit>(out));                              // its workers are still reported as running
    out = m.handle(WorkersDone{false, {0, 1}, std::nullopt, 0});
    EXPECT_TRUE(has<Forget>(out));
    EXPECT_EQ(all<Exit>(out).size(), 1u);
    EXPECT_TRUE(m.exited());
  }
  {
    auto m = running(1);
    m.handle(Shutdown{"SIGTERM"});
    auto out = m.handle(WorkersDone{false, {0, 1}, std::nullopt, 0});  // the report first
    EXPECT_EQ(all<Exit>(out).size(), 1u);
    EXPECT_TRUE(m.handle(LinkClosed{kA, "connection closed"}).empty());
  }
  {  // the link's close before the SIGTERM: draining already
    auto m = running(1);
    m.handle(LinkClosed{kA, "connection closed"});
    auto out = m.handle(Shutdown{"SIGTERM"});
    EXPECT_FALSE(has<SendLeaving>(out));  // nobody to tell
    out = m.handle(WorkersDone{false, {0}, std::nullopt, 0});
    EXPECT_EQ(all<Exit>(out).size(), 1u);
  }
}

// Random event streams, fed as agent.cpp feeds them (an offer only when busy() says no, a job
// message only when addressed() lets it through), against the header's invariants.
TEST(JobMachine, RandomEventStreamsKeepTheInvariants) {
  std::mt19937 rng(2026);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  for (int run = 0; run < 3000; ++run) {
    const bool oneshot = pick(3) == 0, stdio = oneshot && pick(2) == 0;
    JobMachine m({"n1", oneshot, stdio});
    // What the observer knows of the current job.
    int jobs = 0;
    bool joined_ = false, owner_closed = false;
    std::optional<std::uint32_t> assigned;
    bool serve = false;
    std::set<std::uint32_t> ready, reported, started;
    std::set<std::pair<std::uint32_t, int>> exit_plain, exit_detail;
    std::size_t exits_emitted = 0;
    for (int step = 0; step < 60 && !m.exited(); ++step) {
      const LinkId link = pick(4) == 0 ? kB : kA;
      const std::uint32_t round = 1 + pick(3);
      Event e;
      switch (pick(14)) {
        case 0:
          if (m.busy(link) != JobMachine::Busy::no) continue;
          e = Offer{link, "j" + std::to_string(++jobs)};
          break;
        case 1:
          e = Joined{};
          break;
        case 2:
          e = Assign{link, round, static_cast<std::uint32_t>(pick(2)), pick(2) == 0};
          break;
        case 3:
          e = Ready{round};
          break;
        case 4:
          e = RoundFailed{round, "x"};
          break;
        case 5:
          e = Start{link, round};
          break;
        case 6:
          e = Stop{link, round, pick(2) == 0, "r"};
          break;
        case 7:
          e = Signal{pick(2) ? std::optional<std::uint32_t>(round) : std::nullopt, SIGUSR1, "SIGUSR1"};
          break;
        case 8:
          e = FirstFailure{pick(2), 0, "exited with code 1"};
          break;
        case 9:
          e = WorkersDone{pick(2) == 0, {0, 1}, pick(2) ? std::optional<int>(pick(2)) : std::nullopt, 0};
          break;
        case 10:
          e = LinkClosed{link, "closed"};
          break;
        case 11:
          e = Shutdown{"SIGTERM"};
          break;
        case 12:
          e = LauncherGone{pick(2) == 0};
          break;
        default:
          e = Stop{link, round, false, "r"};
          break;
      }
      // The edge refuses job messages that are not addressed to the held job.
      if (std::holds_alternative<Assign>(e) || std::holds_alternative<Start>(e) || std::holds_alternative<Stop>(e)) {
        if (m.addressed(link, std::nullopt, "msg")) continue;
      }
      const bool was_running = m.workers_running();
      const auto was_round = m.group_round();
      const bool was_held = m.has_job();
      const LinkId was_owner = m.owner();
      if (std::holds_alternative<Offer>(e)) {
        joined_ = owner_closed = false;
        assigned.reset();
        ready.clear(), reported.clear(), started.clear(), exit_plain.clear(), exit_detail.clear();
      }
      if (auto* c = std::get_if<LinkClosed>(&e); c && was_held && c->link == was_owner) owner_closed = true;
      if (std::holds_alternative<Joined>(e) && m.phase() == Phase::preflight) joined_ = true;
      const auto out = m.handle(e);
      SCOPED_TRACE(::testing::Message() << "run " << run << " step " << step << " event " << e.index() << " phase "
                                        << phase_name(m.phase()));
      for (const auto& x : out) {
        if (auto* p = std::get_if<PrepareRound>(&x)) assigned = p->round, serve = p->serve;
        if (auto* r = std::get_if<Ready>(&e); r && m.phase() == Phase::assigned) ready.insert(r->round);
        if (auto* s = std::get_if<StartWorkers>(&x)) {
          // I2: only the assigned round, after the join, on node rank 0 after its ready; I5.
          EXPECT_TRUE(joined_);
          ASSERT_TRUE(assigned);
          EXPECT_EQ(s->round, *assigned);
          if (serve) {
            EXPECT_TRUE(ready.count(s->round));
          }
          EXPECT_FALSE(owner_closed);
          EXPECT_FALSE(m.shutting_down());
          EXPECT_FALSE(was_running);
          started.insert(s->round);
        }
        if (auto* f = std::get_if<ReportFinished>(&x)) {
          EXPECT_TRUE(reported.insert(f->round).second) << "I3: round " << f->round << " reported twice";
          EXPECT_FALSE(owner_closed);
        }
        if (auto* r = std::get_if<ReportExit>(&x)) {
          auto& seen = r->detail ? exit_detail : exit_plain;
          EXPECT_TRUE(seen.insert({m.group_round(), r->local_rank}).second) << "I4";
          EXPECT_TRUE(was_running);
        }
        if (std::holds_alternative<Forget>(x)) {
          EXPECT_FALSE(m.workers_running());  // I5: forgotten only once nothing runs
          // I3: every started round's result went up, unless its link is gone.
          if (!owner_closed) {
            for (auto r : started) EXPECT_TRUE(reported.count(r)) << "round " << r << " never reported";
          }
        }
        if (std::holds_alternative<Exit>(x)) ++exits_emitted;
        if (std::holds_alternative<StopWorkers>(x) || std::holds_alternative<ForwardSignal>(x)) {
          EXPECT_TRUE(m.workers_running());
        }
      }
      if (auto* r = std::get_if<Ready>(&e); r && m.phase() == Phase::assigned) ready.insert(r->round);
      // I1
      EXPECT_EQ(m.has_job(), m.phase() != Phase::idle);
      if (m.phase() == Phase::idle) {
        EXPECT_EQ(m.owner(), 0u);
      }
      if (m.has_job() && m.phase() != Phase::draining) {
        EXPECT_NE(m.owner(), 0u);
      }
      // I2: workers run only for the round they were started for
      if (m.workers_running() && was_running) {
        EXPECT_EQ(m.group_round(), was_round);
      }
      // I5: an orphaned or shut-down job is forgotten as soon as nothing runs
      if ((owner_closed || m.shutting_down()) && !m.workers_running()) {
        EXPECT_FALSE(m.has_job());
      }
      // I6: shutting down with no job: exited, once
      if (m.shutting_down() && !m.has_job()) {
        EXPECT_TRUE(m.exited());
      }
      EXPECT_LE(exits_emitted, 1u);
      EXPECT_EQ(exits_emitted == 1, m.exited());
      // I7: a one-shot agent that held a job and holds none no more has exited
      if (oneshot && was_held && !m.has_job()) {
        EXPECT_TRUE(m.exited());
      }
      if (::testing::Test::HasFailure()) return;
    }
  }
}

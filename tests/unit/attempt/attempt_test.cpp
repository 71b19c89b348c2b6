#include "attempt/attempt.hpp"

#include <gtest/gtest.h>
#include <signal.h>

using namespace ddp::launch;
using namespace std::chrono_literals;

namespace {
SysTime t(int ms) {
  return SysTime(std::chrono::milliseconds(1'000'000 + ms));
}
WorkerExit ok(int rank, int ms) {
  return {rank, rank, 100 + rank, 0, 0, t(ms)};
}
WorkerExit code(int rank, int c, int ms) {
  return {rank, rank, 100 + rank, c, 0, t(ms)};
}
WorkerExit sig(int rank, int s, int ms) {
  return {rank, rank, 100 + rank, 0, s, t(ms)};
}
}  // namespace

TEST(Attempt, AllSucceed) {
  AttemptTracker a(3);
  EXPECT_EQ(a.on_exit(ok(0, 1)), Decision::none);
  EXPECT_EQ(a.on_exit(ok(2, 2)), Decision::none);
  EXPECT_EQ(a.on_exit(ok(1, 3)), Decision::finished);
  EXPECT_EQ(a.phase(), Phase::succeeded);
  EXPECT_FALSE(a.first_failure());
}

TEST(Attempt, FirstFailureStopsEveryoneAndIsRemembered) {
  AttemptTracker a(3);
  EXPECT_EQ(a.on_exit(code(1, 3, 10)), Decision::stop_all);
  EXPECT_EQ(a.phase(), Phase::stopping);
  // the others die of our SIGTERM: consequences, not the failure
  EXPECT_EQ(a.on_exit(sig(0, SIGTERM, 20)), Decision::none);
  EXPECT_EQ(a.on_exit(sig(2, SIGTERM, 21)), Decision::finished);
  EXPECT_EQ(a.phase(), Phase::failed);
  ASSERT_TRUE(a.first_failure());
  EXPECT_EQ(a.first_failure()->rank, 1);
  EXPECT_EQ(a.first_failure()->exit_code, 3);
}

TEST(Attempt, SuccessAfterAFailureStillFails) {
  AttemptTracker a(2);
  a.on_exit(sig(0, SIGSEGV, 1));
  EXPECT_EQ(a.on_exit(ok(1, 2)), Decision::finished);
  EXPECT_EQ(a.phase(), Phase::failed);
  EXPECT_EQ(a.first_failure()->signal, SIGSEGV);
}

TEST(Attempt, LastRankFailingFinishesAtOnce) {
  AttemptTracker a(2);
  a.on_exit(ok(0, 1));
  EXPECT_EQ(a.on_exit(code(1, 1, 2)), Decision::finished);
  EXPECT_EQ(a.phase(), Phase::failed);
}

TEST(Attempt, StopRequestedGivesStopped) {
  AttemptTracker a(2);
  EXPECT_EQ(a.on_stop_requested(SIGINT), Decision::stop_all);
  EXPECT_EQ(a.on_stop_requested(SIGINT), Decision::none);  // a second Ctrl-C is the caller's business
  a.on_exit(sig(0, SIGTERM, 1));
  EXPECT_EQ(a.on_exit(code(1, 143, 2)), Decision::finished);
  EXPECT_EQ(a.phase(), Phase::stopped);
  EXPECT_FALSE(a.first_failure());
  EXPECT_EQ(a.stop_signal(), SIGINT);
}

TEST(Attempt, StopAfterFailureKeepsTheFailure) {
  AttemptTracker a(2);
  a.on_exit(code(0, 2, 1));
  EXPECT_EQ(a.on_stop_requested(SIGTERM), Decision::none);
  a.on_exit(sig(1, SIGTERM, 2));
  EXPECT_EQ(a.phase(), Phase::failed);
  EXPECT_EQ(a.first_failure()->rank, 0);
}

TEST(Attempt, DuplicateAndForeignExitsIgnored) {
  AttemptTracker a(2);
  a.on_exit(ok(0, 1));
  EXPECT_EQ(a.on_exit(code(0, 1, 2)), Decision::none);  // rank 0 again
  EXPECT_EQ(a.on_exit(code(7, 1, 2)), Decision::none);  // not a rank of ours
  EXPECT_EQ(a.live(), 1);
  EXPECT_EQ(a.phase(), Phase::running);
}

TEST(Attempt, NeverStartedRanksAreNotFailures) {
  AttemptTracker a(3);
  EXPECT_EQ(a.on_exit(code(0, 127, 1)), Decision::stop_all);
  WorkerExit ns{2, 2, -1, 0, 0, t(2)};
  ns.started = false;
  EXPECT_EQ(a.on_exit(ns), Decision::none);
  EXPECT_EQ(ns.describe(), "was not started");
  EXPECT_EQ(a.on_exit(sig(1, SIGTERM, 3)), Decision::finished);
  EXPECT_EQ(a.first_failure()->rank, 0);
}

TEST(Attempt, SecondNodeRanksAreMatchedByLocalRank) {
  // node rank 1 of a 2x2 job: global ranks 2 and 3, local ranks 0 and 1
  AttemptTracker a(2);
  EXPECT_EQ(a.on_exit(WorkerExit{2, 0, 10, 0, 0, t(1)}), Decision::none);
  EXPECT_EQ(a.on_exit(WorkerExit{3, 1, 11, 0, 0, t(2)}), Decision::finished);
  EXPECT_EQ(a.phase(), Phase::succeeded);
}

TEST(Attempt, Describe) {
  EXPECT_EQ(code(0, 3, 0).describe(), "exited with code 3");
  EXPECT_EQ(sig(0, SIGKILL, 0).describe(), "was killed by SIGKILL");
}

// SIGUSR1 that ddpctl passed on (a scheduler's preemption warning) kills a rank with no handler
// for it: the attempt ends, but that rank did not fail by itself.
TEST(Attempt, ARankKilledByAForwardedSignalIsNeverTheFirstFailure) {
  AttemptTracker a(3);
  a.on_forwarded(SIGUSR1);
  EXPECT_EQ(a.on_exit(sig(2, SIGUSR1, 10)), Decision::stop_all);  // a rank is gone: stop the others
  EXPECT_FALSE(a.first_failure());
  ASSERT_TRUE(a.exits()[2]);
  EXPECT_TRUE(a.exits()[2]->forwarded);
  EXPECT_EQ(a.exits()[2]->describe(), "was killed by SIGUSR1, which ddpctl forwarded (it has no handler for it)");
  // what the stop then ends (after its signals went out) is its consequence, not a failure either
  a.on_signals_sent();
  EXPECT_EQ(a.on_exit(code(0, 1, 11)), Decision::none);
  EXPECT_EQ(a.on_exit(sig(1, SIGTERM, 12)), Decision::finished);
  EXPECT_EQ(a.phase(), Phase::failed);
  EXPECT_FALSE(a.first_failure());
  EXPECT_FALSE(a.exits()[0]->forwarded);
  // and each says so, for the coordinator, which sees exits from many nodes (worker_exited's
  // after_stop): the forwarded death came before any stop signal, the others after
  EXPECT_FALSE(a.exits()[2]->after_stop);
  EXPECT_TRUE(a.exits()[0]->after_stop);
  EXPECT_TRUE(a.exits()[1]->after_stop);
}

TEST(Attempt, OnlyTheSignalsForwardedAreMarked) {
  AttemptTracker a(2);
  a.on_forwarded(SIGUSR2);
  EXPECT_EQ(a.on_exit(sig(0, SIGUSR1, 10)), Decision::stop_all);  // sent by someone else
  ASSERT_TRUE(a.first_failure());
  EXPECT_FALSE(a.first_failure()->forwarded);
  EXPECT_EQ(a.first_failure()->describe(), "was killed by SIGUSR1");
}

TEST(Attempt, AFailureBeforeTheForwardedSignalStaysTheFirst) {
  AttemptTracker a(2);
  EXPECT_EQ(a.on_exit(code(0, 3, 10)), Decision::stop_all);
  a.on_forwarded(SIGUSR1);
  EXPECT_EQ(a.on_exit(sig(1, SIGUSR1, 11)), Decision::finished);
  EXPECT_EQ(a.first_failure()->rank, 0);
  EXPECT_TRUE(a.exits()[1]->forwarded);
}

TEST(Attempt, TheLastRankKilledByAForwardedSignalFailsWithoutAFirstFailure) {
  AttemptTracker a(1);
  a.on_forwarded(SIGUSR1);
  EXPECT_EQ(a.on_exit(sig(0, SIGUSR1, 10)), Decision::finished);
  EXPECT_EQ(a.phase(), Phase::failed);
  EXPECT_FALSE(a.first_failure());
}

// Review finding: rank 0 dies of a forwarded SIGUSR1; rank 1 crashes by itself before any stop
// signal of ours went out (the stacks read): rank 1 is the first failure. After the signals,
// an exit is a consequence again.
TEST(Attempt, AnOwnFailureBeforeOurSignalsIsTheFirstFailureAfterAForwardedDeath) {
  AttemptTracker a(3);
  a.on_forwarded(SIGUSR1);
  EXPECT_EQ(a.on_exit(sig(0, SIGUSR1, 10)), Decision::stop_all);
  EXPECT_FALSE(a.first_failure());
  EXPECT_EQ(a.on_exit(sig(1, SIGSEGV, 20)), Decision::first_failure);
  ASSERT_TRUE(a.first_failure());
  EXPECT_EQ(a.first_failure()->rank, 1);
  a.on_signals_sent();
  EXPECT_EQ(a.on_exit(sig(2, SIGTERM, 30)), Decision::finished);
  EXPECT_EQ(a.first_failure()->rank, 1);
  EXPECT_EQ(a.phase(), Phase::failed);

  AttemptTracker b(2);
  b.on_forwarded(SIGUSR1);
  EXPECT_EQ(b.on_exit(sig(0, SIGUSR1, 10)), Decision::stop_all);
  b.on_signals_sent();
  EXPECT_EQ(b.on_exit(sig(1, SIGTERM, 20)), Decision::finished);
  EXPECT_FALSE(b.first_failure());
}

TEST(Attempt, ZeroRanksIsAnError) {
  EXPECT_THROW(AttemptTracker(0), std::invalid_argument);
}

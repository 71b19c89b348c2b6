// The coordinator's job clock (coordinator/job_clock.hpp): wall time as of its anchor, advancing
// with the steady clock only, so a later step of the wall clock moves none of its readings.
#include "coordinator/job_clock.hpp"

#include <gtest/gtest.h>

using namespace ddp::coordinator;
using namespace std::chrono_literals;

TEST(JobClock, ReadsWallTimeAsOfTheAnchorPlusSteadyTime) {
  const JobClock::Mono::time_point mono{100s};
  const JobClock::Wall::time_point wall{1'700'000'000s};
  const JobClock c(mono, wall);
  EXPECT_EQ(c.at(mono), JobClock::Micros(1'700'000'000'000'000));
  EXPECT_EQ(c.at(mono + 1500ms), JobClock::Micros(1'700'000'001'500'000));
  EXPECT_EQ(JobClock::to_wall(c.at(mono + 2s)), wall + 2s);
}

TEST(JobClock, NowIsMonotonicAndNearTheWallClockAtStart) {
  const JobClock c;
  const auto a = c.now();
  const auto b = c.now();
  EXPECT_LE(a, b);
  const auto wall = std::chrono::duration_cast<JobClock::Micros>(JobClock::Wall::now().time_since_epoch());
  EXPECT_LT(std::chrono::abs(wall - b), JobClock::Micros(5s));  // nothing stepped this clock within the test
}

// A peer's time may be any 64-bit count of microseconds: as a wall time it is held at the end of
// what the wall clock's nanoseconds can say, not wrapped (the multiplication overflowed).
TEST(JobClock, AWallTimeBeyondTheClocksRangeIsHeldAtItsEnd) {
  using ddp::coordinator::JobClock;
  const auto top = JobClock::to_wall(std::chrono::microseconds::max());
  const auto bottom = JobClock::to_wall(std::chrono::microseconds::min());
  EXPECT_GT(top.time_since_epoch().count(), 0);
  EXPECT_LT(bottom.time_since_epoch().count(), 0);
  EXPECT_EQ(top, JobClock::to_wall(std::chrono::duration_cast<std::chrono::microseconds>(
                     std::chrono::system_clock::duration::max())));
  EXPECT_LT(JobClock::to_wall(std::chrono::microseconds(1)), top);
}

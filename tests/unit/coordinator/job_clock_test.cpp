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

// Clock-offset estimation from ping/pong samples.
#include "proto/clock_sync.hpp"

#include <gtest/gtest.h>

using namespace ddp::proto;
using std::chrono::microseconds;

TEST(ClockSync, SymmetricPathRecoversTheOffset) {
  // Agent clock is 5 s ahead; 200 us each way.
  auto o = offset_from({microseconds(1000), microseconds(1200 + 5'000'000), microseconds(1400)});
  ASSERT_TRUE(o);
  EXPECT_EQ(o->offset, microseconds(5'000'000));
  EXPECT_EQ(o->rtt, microseconds(400));
  EXPECT_EQ(o->uncertainty, microseconds(200));
}

TEST(ClockSync, AgentBehindGivesNegativeOffset) {
  auto o = offset_from({microseconds(10'000), microseconds(10'050 - 3'000'000), microseconds(10'100)});
  EXPECT_EQ(o->offset, microseconds(-3'000'000));
}

TEST(ClockSync, AsymmetricPathErrorStaysWithinTheBound) {
  // True offset 0; 100 us out, 900 us back: the estimate is off by 400 us, inside rtt/2 = 500.
  auto o = offset_from({microseconds(0), microseconds(100), microseconds(1000)});
  EXPECT_EQ(o->offset, microseconds(-400));
  EXPECT_LE(std::chrono::abs(o->offset), o->uncertainty);
}

TEST(ClockSync, ImpossibleSampleRefused) {
  EXPECT_FALSE(offset_from({microseconds(10), microseconds(5), microseconds(9)}));
  ClockSync s;
  EXPECT_FALSE(s.add({microseconds(10), microseconds(5), microseconds(9)}));
  EXPECT_EQ(s.samples(), 0);
  EXPECT_FALSE(s.best());
}

TEST(ClockSync, ShortestRoundTripWins) {
  ClockSync s;
  EXPECT_TRUE(s.add({microseconds(0), microseconds(1'000'900), microseconds(1000)}));   // rtt 1000, est 1000400
  EXPECT_TRUE(s.add({microseconds(2000), microseconds(1'002'050), microseconds(2100)}));  // rtt 100, est 1000000
  EXPECT_TRUE(s.add({microseconds(3000), microseconds(1'003'000), microseconds(8000)}));  // rtt 5000
  EXPECT_EQ(s.samples(), 3);
  EXPECT_EQ(s.best()->offset, microseconds(1'000'000));
  EXPECT_EQ(s.best()->rtt, microseconds(100));
  EXPECT_EQ(s.to_local(microseconds(1'500'000)), microseconds(500'000));
}

TEST(ClockSync, IdentityBeforeAnySample) {
  ClockSync s;
  EXPECT_EQ(s.to_local(microseconds(42)), microseconds(42));
}

TEST(ClockSync, UnixEpochMicrosecondsDoNotOverflow) {
  const microseconds now(1'760'000'000'000'000LL);  // 2025 in us since 1970
  auto o = offset_from({now, now + microseconds(250), now + microseconds(500)});
  EXPECT_EQ(o->offset, microseconds(0));
}

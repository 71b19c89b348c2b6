// Clock-offset estimation from exchange samples (offer/join, heartbeat pairs).
#include "proto/clock_sync.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

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
  EXPECT_TRUE(s.add({microseconds(0), microseconds(1'000'900), microseconds(1000)}));     // rtt 1000, est 1000400
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

TEST(ClockSync, TheAgentsHoldIsTakenOutOfTheRoundTrip) {
  // Agent 2 s behind; 300 us each way; the agent held the answer 50 ms (preflight checks).
  const microseconds t0(1'000'000), hold(50'000);
  const auto t1 = t0 + microseconds(300) - microseconds(2'000'000);
  const auto t2 = t0 + microseconds(300) + hold + microseconds(300);
  auto o = offset_from({t0, t1, t2, hold});
  ASSERT_TRUE(o);
  EXPECT_EQ(o->offset, microseconds(-2'000'000));
  EXPECT_EQ(o->rtt, microseconds(600));
  EXPECT_EQ(o->uncertainty, microseconds(300));
  // Read as if it answered at once, the hold would skew the estimate by half of it.
  EXPECT_EQ(offset_from({t0, t1, t2})->offset, microseconds(-2'000'000 - 25'000));
}

TEST(ClockSync, ImpossibleHoldRefused) {
  EXPECT_FALSE(offset_from({microseconds(0), microseconds(10), microseconds(100), microseconds(-1)}));
  EXPECT_FALSE(offset_from({microseconds(0), microseconds(10), microseconds(100), microseconds(101)}));
  EXPECT_TRUE(offset_from({microseconds(0), microseconds(10), microseconds(100), microseconds(100)}));
}

// A peer's stamps are any 64-bit values: a sample whose arithmetic would overflow is refused
// like any impossible one, and a time mapped through a far-out offset stops at the range's end.
TEST(ClockSync, StampsAtTheEndsOfTheRangeAreRefusedNotWrapped) {
  constexpr auto lo = std::numeric_limits<std::int64_t>::min(), hi = std::numeric_limits<std::int64_t>::max();
  const microseconds now(1'760'000'000'000'000LL);
  EXPECT_FALSE(offset_from({microseconds(lo), now, now}));  // t2 - t0 past the range
  EXPECT_FALSE(offset_from({now, microseconds(hi), now + microseconds(500), microseconds(100)}));  // t1 + hold / 2
  EXPECT_FALSE(offset_from({microseconds(hi - 10), microseconds(lo), microseconds(hi)}));          // t1 - midpoint
  ClockSync s;
  EXPECT_FALSE(s.add({microseconds(lo), microseconds(hi), now, microseconds(0)}));
  EXPECT_EQ(s.samples(), 0);
  // An offset near the range's end, then a time on the other side of it.
  ASSERT_TRUE(s.add({microseconds(0), microseconds(lo / 2), microseconds(2)}));
  EXPECT_LT(s.best()->offset, microseconds(0));
  EXPECT_EQ(s.to_local(microseconds(hi)), microseconds(hi));
  ClockSync ahead;
  ASSERT_TRUE(ahead.add({microseconds(0), microseconds(hi / 2), microseconds(2)}));
  EXPECT_EQ(ahead.to_local(microseconds(lo)), microseconds(lo));
  EXPECT_EQ(ahead.to_local(microseconds(hi / 2 - 1)), microseconds(0));  // in range: exact
}

#include "proto/heartbeat.hpp"

#include <gtest/gtest.h>

using namespace ddp::proto;
using namespace std::chrono_literals;

TEST(BeatInterval, TheOfferIsAThirdOfTheJobsTimeoutFromOneToTenSeconds) {
  EXPECT_EQ(offered_beat_interval(6000ms), 2000ms);  // the default timeout: beats half as often as before
  EXPECT_EQ(offered_beat_interval(15000ms), 5000ms);
  EXPECT_EQ(offered_beat_interval(2000ms), 1000ms);  // the smallest timeout a job file takes: as before
  EXPECT_EQ(offered_beat_interval(2999ms), 1000ms);
  EXPECT_EQ(offered_beat_interval(3300ms), 1100ms);
  EXPECT_EQ(offered_beat_interval(30000ms), 10000ms);
  EXPECT_EQ(offered_beat_interval(3600000ms), 10000ms);  // an hour's timeout still beats every 10 s
  EXPECT_EQ(offered_beat_interval(0ms), 1000ms);
}

TEST(BeatInterval, TheAgentTakesTheOfferOrAThirdOfItsOwnTimeoutWhicheverIsShorter) {
  EXPECT_EQ(agent_beat_interval(std::nullopt, 60000ms), 1000ms);  // an older coordinator: every second
  EXPECT_EQ(agent_beat_interval(2000ms, 6000ms), 2000ms);         // both defaults
  EXPECT_EQ(agent_beat_interval(5000ms, 6000ms), 2000ms);         // a long job timeout, the agent's default: its own
  EXPECT_EQ(agent_beat_interval(5000ms, 15000ms), 5000ms);
  EXPECT_EQ(agent_beat_interval(5000ms, 2000ms), 1000ms);  // never faster than every second
  EXPECT_EQ(agent_beat_interval(10000ms, 3600000ms), 10000ms);
  EXPECT_EQ(agent_beat_interval(0ms, 6000ms), 1000ms);  // a hostile offer: the floor
  // Whole seconds, rounded down: the agent's timer ticks every second.
  EXPECT_EQ(agent_beat_interval(1666ms, 6000ms), 1000ms);
  EXPECT_EQ(agent_beat_interval(5000ms, 8000ms), 2000ms);
  EXPECT_EQ(agent_beat_interval(3300ms, 60000ms), 3000ms);
}

TEST(BeatInterval, TheCoordinatorTakesTheJoinsWithinTheFloorAndItsOffer) {
  EXPECT_EQ(joined_beat_interval(std::nullopt, 5000ms), 1000ms);  // an older agent beats every second
  EXPECT_EQ(joined_beat_interval(2000ms, 2000ms), 2000ms);
  EXPECT_EQ(joined_beat_interval(2000ms, 5000ms), 2000ms);   // the agent's own timeout was shorter
  EXPECT_EQ(joined_beat_interval(10000ms, 2000ms), 2000ms);  // slower than offered: not believed
  EXPECT_EQ(joined_beat_interval(1ms, 2000ms), 1000ms);
  EXPECT_EQ(joined_beat_interval(5000ms, 500ms), 1000ms);
}

TEST(BeatInterval, EachSideHearsTheOtherWellWithinItsTimeout) {
  // Every pair of timeouts a job file (at least 2 s) and an agent's config (2 s to 1 h) allow:
  // the agent beats at least three times per job timeout (or every second at the smallest), and
  // the coordinator's own beats come at least twice per agent timeout.
  for (long t : {2000L, 2500L, 3000L, 6000L, 9000L, 15000L, 31000L, 600000L, 3600000L}) {
    for (long l : {2000L, 3000L, 6000L, 15000L, 60000L, 3600000L}) {
      const Millis job{t}, agent{l};
      const auto offer = offered_beat_interval(job);
      const auto beats = agent_beat_interval(offer, agent);
      const auto node = joined_beat_interval(beats, offer);
      EXPECT_EQ(node, beats) << t << " " << l;  // the coordinator believes an honest join
      EXPECT_EQ(beats % 1000ms, 0ms) << t << " " << l;
      EXPECT_LE(beats * 2, job) << t << " " << l;
      EXPECT_TRUE(beats * 3 <= job || beats == kBeatFloor) << t << " " << l;
      EXPECT_LE(coordinator_beat_due(node) * 2, std::max(agent, Millis(2500))) << t << " " << l;
    }
  }
}

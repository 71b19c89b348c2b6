#include "sdnotify/sdnotify.hpp"

#include <gtest/gtest.h>

using namespace ddp::sdnotify;
using namespace std::chrono_literals;

TEST(SdNotify, PingsAtHalfTheWatchdogTimeout) {
  EXPECT_EQ(ping_interval(10'000'000), 5s);
  EXPECT_EQ(ping_interval(3), 1us);  // rounded down: never later than half
  EXPECT_EQ(ping_interval(0), std::nullopt);
}

TEST(SdNotify, StatusIsOneLine) {
  EXPECT_EQ(status_line("running job a\nREADY=1"), "running job a READY=1");
  EXPECT_EQ(status_line("idle"), "idle");
}

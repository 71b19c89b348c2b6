// The coordinator's stop timeout: a node that read its stacks and converted its flight recorder
// dumps before answering must still be within it, or the round reports it lost.
#include "coordinator/coordinator.hpp"

#include "attempt/failure_stacks.hpp"
#include "hang/flight.hpp"

#include <gtest/gtest.h>

using namespace std::chrono_literals;

TEST(CoordinatorStopTimeout, AllowsTheStacksReadAndTheConverter) {
  // (a Ctrl-C's SIGINT step, 10 s at most, comes before the grace)
  EXPECT_EQ(ddp::coordinator::round_stop_timeout(30s),
            30s + 10s + 5s + ddp::launch::kStacksBudget + ddp::hang::kConvertLimit);
  EXPECT_EQ(ddp::coordinator::round_stop_timeout(2s),
            2s + 2s + 5s + ddp::launch::kStacksBudget + ddp::hang::kConvertLimit);
  EXPECT_GE(ddp::coordinator::round_stop_timeout(0s), 5s + ddp::launch::kStacksBudget + ddp::hang::kConvertLimit);
  EXPECT_LE(ddp::hang::kConvertLimit, 3s);
}

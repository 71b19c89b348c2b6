// interface_of: the loopback address is on lo; addresses nobody holds, and garbage, give nothing.
#include "agent/interfaces.hpp"

#include <gtest/gtest.h>

using ddp::agent::interface_of;

TEST(Interfaces, LoopbackIsLo) {
  EXPECT_EQ(interface_of("127.0.0.1"), "lo");
  EXPECT_EQ(interface_of("::ffff:127.0.0.1"), "lo");  // as a dual-stack socket reports it
}

TEST(Interfaces, UnknownAndMalformed) {
  EXPECT_EQ(interface_of("192.0.2.77"), std::nullopt);  // TEST-NET-1: held by no interface here
  EXPECT_EQ(interface_of("not-an-address"), std::nullopt);
}

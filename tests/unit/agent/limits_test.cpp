// How many links one key may hold to an agent: enough for a standing coordinator many times over,
// never more than an eighth of the agent's descriptors, never fewer than 4.
#include "agent/agent.hpp"

#include <gtest/gtest.h>

#include <cstdint>

using ddp::agent::links_per_key_cap;

TEST(LinksPerKey, AnEighthOfTheDescriptorsBetweenFourAndSixtyFour) {
  EXPECT_EQ(links_per_key_cap(64), 8u);  // a daemon started with few descriptors
  EXPECT_EQ(links_per_key_cap(256), 32u);
  EXPECT_EQ(links_per_key_cap(1024), 64u);  // a login shell's default: the most
  EXPECT_EQ(links_per_key_cap(1u << 20), 64u);
  EXPECT_EQ(links_per_key_cap(UINT64_MAX), 64u);  // unlimited
  EXPECT_EQ(links_per_key_cap(16), 4u);           // the least, whatever the descriptors
  EXPECT_EQ(links_per_key_cap(0), 4u);
}

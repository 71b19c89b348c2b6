// The standing coordinator's relay bounds (coordinator/relay_limits.hpp): per user and in all,
// scaled down with the descriptors the daemon may hold, and refusals that say how to get under them.
#include "coordinator/relay_limits.hpp"

#include <gtest/gtest.h>

using namespace ddp::coordinator;

TEST(RelayLimits, ThePackagedUnitGetsTheDefaults) {
  const auto l = relay_limits(1048576);  // LimitNOFILE of packaging/systemd/ddp-coordinator.service
  EXPECT_EQ(l.relays, 256u);
  EXPECT_EQ(l.relays_per_user, 16u);
  EXPECT_EQ(l.files, 16384u);
  EXPECT_EQ(l.files_per_user, 4096u);
  EXPECT_EQ(l.jobs, 1024u);
  EXPECT_EQ(l.jobs_per_user, 64u);
  EXPECT_EQ(l.clients, 4096u);
  EXPECT_EQ(l.clients_per_user, 96u);                 // 16 relays, 64 attached submitters, 16 more
  EXPECT_EQ(relay_limits(UINT64_MAX).files, 16384u);  // unlimited
  EXPECT_EQ(relay_limits(UINT64_MAX).jobs, 1024u);
  EXPECT_EQ(relay_limits(UINT64_MAX).clients, 4096u);
}

TEST(RelayLimits, FewDescriptorsScaleThemDown) {
  const auto l = relay_limits(128);
  EXPECT_EQ(l.relays, 16u);
  EXPECT_EQ(l.relays_per_user, 16u);
  EXPECT_EQ(l.files, 32u);
  EXPECT_EQ(l.files_per_user, 8u);
  const auto tiny = relay_limits(8);
  EXPECT_EQ(tiny.relays, 4u);
  EXPECT_EQ(tiny.relays_per_user, 4u);
  EXPECT_EQ(tiny.files, 4u);
  EXPECT_EQ(tiny.files_per_user, 1u);
  // Jobs: a sixteenth of the descriptors, a quarter of that per user; connections: a quarter, and
  // per user what its relays and jobs need, never more than all.
  EXPECT_EQ(l.jobs, 8u);
  EXPECT_EQ(l.jobs_per_user, 2u);
  EXPECT_EQ(l.clients, 32u);
  EXPECT_EQ(l.clients_per_user, 32u);
  EXPECT_EQ(tiny.jobs, 2u);
  EXPECT_EQ(tiny.jobs_per_user, 1u);
  EXPECT_EQ(tiny.clients, 16u);
  EXPECT_EQ(tiny.clients_per_user, 16u);
  const auto some = relay_limits(4096);
  EXPECT_EQ(some.jobs, 256u);
  EXPECT_EQ(some.jobs_per_user, 64u);
  EXPECT_EQ(some.clients, 1024u);
  EXPECT_EQ(some.clients_per_user, 96u);
}

TEST(RelayLimits, RelaysPerUserThenInAll) {
  const RelayLimits l{/*relays=*/4, /*relays_per_user=*/2, /*files=*/100, /*files_per_user=*/10};
  EXPECT_FALSE(refuse_relay(l, {1, 0}, {1, 0}, "alice"));
  auto why = refuse_relay(l, {2, 0}, {2, 0}, "alice");
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("user alice has 2 status/logs/stop/stacks requests open"), std::string::npos) << *why;
  EXPECT_NE(why->find("`ddpctl logs -f` left running?"), std::string::npos) << *why;
  // bob has none, but the daemon is full.
  why = refuse_relay(l, {4, 0}, {0, 0}, "bob");
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("serves 4 status/logs/stop/stacks requests at once, its limit"), std::string::npos) << *why;
  EXPECT_FALSE(refuse_relay(l, {3, 0}, {0, 0}, "bob"));
}

TEST(RelayLimits, BacklogFilesPerUserThenInAll) {
  const RelayLimits l{4, 2, /*files=*/20, /*files_per_user=*/10};
  EXPECT_FALSE(refuse_backlog(l, {1, 0}, {1, 0}, "alice", "j", 10));  // exactly the user's share
  auto why = refuse_backlog(l, {1, 0}, {1, 0}, "alice", "j", 11);
  ASSERT_TRUE(why);
  EXPECT_EQ(*why,
            "job j's logs are 11 rank files, and this coordinator reads at most 10 at once for user alice (0 open for "
            "other requests): name fewer ranks with --ranks");
  why = refuse_backlog(l, {2, 6}, {2, 6}, "alice", "j", 5);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("(6 open for other requests): name fewer ranks with --ranks, or let your other `ddpctl logs` "
                      "finish"),
            std::string::npos)
      << *why;
  why = refuse_backlog(l, {3, 16}, {0, 0}, "bob", "k", 5);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("has 16 log files open for other requests, and reads at most 20 at once"), std::string::npos)
      << *why;
  EXPECT_FALSE(refuse_backlog(l, {3, 15}, {0, 0}, "bob", "k", 5));
}

TEST(RelayLimits, JobsPerUserThenInAll) {
  RelayLimits l;
  l.jobs = 4;
  l.jobs_per_user = 2;
  EXPECT_FALSE(refuse_job(l, 1, 1, "alice"));
  auto why = refuse_job(l, 2, 2, "alice");
  ASSERT_TRUE(why);
  EXPECT_EQ(*why,
            "user alice has 2 jobs running on this coordinator, its limit per user: wait for one to end, or stop one "
            "(`ddpctl stop --coordinator ... JOB`)");
  l.jobs_per_user = 1;
  why = refuse_job(l, 1, 1, "carol");
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("user carol has 1 job running on this coordinator"), std::string::npos) << *why;
  l.jobs_per_user = 2;
  EXPECT_FALSE(refuse_job(l, 3, 0, "bob"));
  why = refuse_job(l, 4, 0, "bob");  // bob has none, but the daemon is full
  ASSERT_TRUE(why);
  EXPECT_EQ(*why, "this coordinator runs 4 jobs, its limit: try again once one has ended");
}

TEST(RelayLimits, NodesPerUserThenInAll) {
  // One user's jobs on many silent nodes held a connection each until the daemon had no
  // descriptor left for anyone's job or request.
  const auto l = relay_limits(1024);
  EXPECT_EQ(l.nodes, 256u);
  EXPECT_EQ(l.nodes_per_user, 64u);
  EXPECT_FALSE(refuse_nodes(l, 0, 0, "alice", 64));
  auto why = refuse_nodes(l, 100, 60, "alice", 5);
  ASSERT_TRUE(why);
  EXPECT_EQ(*why,
            "this job's 5 nodes and the 60 of user alice's running jobs would pass the 64 nodes one user's jobs may "
            "hold on this coordinator at once (a connection each): wait for a job to end, or stop one");
  EXPECT_FALSE(refuse_nodes(l, 200, 0, "bob", 56));
  why = refuse_nodes(l, 200, 0, "bob", 57);  // bob has none, but the daemon's share is spent
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("would pass the 256 nodes this coordinator's jobs may hold at once (200 now)"), std::string::npos)
      << *why;
  // The packaged unit's limit: the largest job a submit may name still fits one user's share.
  EXPECT_EQ(relay_limits(1048576).nodes_per_user, 65536u);
  // Started by hand under a login's soft 1024: the nodes follow the hard limit, which a job of
  // many nodes raises the soft one to; the other bounds stay the soft limit's.
  const auto by_hand = relay_limits(1024, 1048576);
  EXPECT_EQ(by_hand.nodes_per_user, 65536u);
  EXPECT_EQ(by_hand.jobs, 64u);
}

TEST(RelayLimits, ConnectionsPerUserThenInAll) {
  RelayLimits l;
  l.clients = 10;
  l.clients_per_user = 3;
  EXPECT_FALSE(refuse_client(l, 2, 2, "alice", false));
  auto why = refuse_client(l, 3, 3, "alice", true);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("user alice has 3 connections open to this coordinator, its limit per user"), std::string::npos)
      << *why;
  EXPECT_FALSE(refuse_client(l, 9, 0, "bob", false));
  why = refuse_client(l, 10, 0, "bob", false);
  ASSERT_TRUE(why);
  EXPECT_EQ(*why, "this coordinator has 10 client connections open, its limit: try again shortly");
}

// With key_users root is the admin's key: never refused a connection, so that a full daemon can
// still be stopped; without key_users anyone may claim root, and root is bounded as anyone.
TEST(RelayLimits, AKeyedRootAlwaysGetsAConnection) {
  RelayLimits l;
  l.clients = 10;
  l.clients_per_user = 3;
  EXPECT_FALSE(refuse_client(l, 10, 3, "root", /*keyed=*/true));
  EXPECT_TRUE(refuse_client(l, 10, 3, "root", /*keyed=*/false));
  EXPECT_TRUE(refuse_client(l, 5, 3, "root", /*keyed=*/false));
  EXPECT_TRUE(refuse_client(l, 10, 0, "alice", /*keyed=*/true));
}

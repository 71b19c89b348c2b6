// The standing coordinator's client identity (coordinator/identity.hpp): with key_users the key
// decides, and a declared name that differs is refused; root only through a root-mapped key.
#include "coordinator/identity.hpp"

#include <gtest/gtest.h>

using namespace ddp::coordinator;

TEST(ClientIdentity, WithoutKeyUsersTheDeclaredNameStands) {
  auto id = client_identity({}, "default", "alice");
  EXPECT_EQ(id.user, "alice");
  EXPECT_TRUE(id.refusal.empty());
}

TEST(ClientIdentity, WithKeyUsersTheKeyDecides) {
  const CoordinatorKeyUsers m{{"alice-key", "alice"}, {"bob-key", "bob"}, {"ops", "root"}};
  EXPECT_EQ(client_identity(m, "bob-key", "bob").user, "bob");
  auto id = client_identity(m, "bob-key", "alice");  // bob's key, claiming alice
  EXPECT_EQ(id.user, "");
  EXPECT_EQ(id.refusal, "key 'bob-key' belongs to user 'bob', but this client says it is 'alice'");
  EXPECT_NE(id.hint.find("run ddpctl as 'bob'"), std::string::npos);
  id = client_identity(m, "bob-key", "root");  // ... or root
  EXPECT_EQ(id.user, "");
  EXPECT_FALSE(id.refusal.empty());
  id = client_identity(m, "stray", "alice");  // a key of the token file nobody was given
  EXPECT_NE(id.refusal.find("key 'stray' is not mapped"), std::string::npos);
  EXPECT_NE(id.hint.find("--key-user"), std::string::npos);
  EXPECT_EQ(client_identity(m, "ops", "root").user, "root");
}

TEST(ClientIdentity, OnlyTheSubmitterOrRootTouchesAJob) {
  EXPECT_TRUE(may_touch("alice", "alice"));
  EXPECT_TRUE(may_touch("alice", "root"));
  EXPECT_FALSE(may_touch("alice", "bob"));
  EXPECT_FALSE(may_touch("alice", ""));
}

#include "agentconfig/users.hpp"
#include "proto/delegation.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

using namespace ddp::agentconfig;

namespace {

LocalUser user(const std::string& name, uid_t uid) {
  return {name, uid, static_cast<gid_t>(uid), {static_cast<gid_t>(uid), 100}, "/home/" + name, "/bin/bash"};
}

// A user database of three: alice (1001), bob (1002), and toor, a second name for uid 0.
std::optional<LocalUser> fake_lookup(const std::string& name) {
  if (name == "alice") return user("alice", 1001);
  if (name == "bob") return user("bob", 1002);
  if (name == "toor") return user("toor", 0);
  if (name == "root") return user("root", 0);
  return std::nullopt;
}

AgentConfig config(const std::string& yaml) {
  return parse_agent_config(yaml, "/etc/ddpctl/agent.yaml");
}

std::vector<Diagnostic> resolve_errors(const std::string& yaml, const std::vector<std::string>& keys, uid_t agent_uid) {
  try {
    resolve_key_users(config(yaml), keys, agent_uid, fake_lookup);
  } catch (const ConfigError& e) {
    return e.diagnostics();
  }
  ADD_FAILURE() << "expected an error for:\n" << yaml;
  return {};
}

void expect_resolve_error(const std::string& yaml, const std::vector<std::string>& keys, uid_t agent_uid, int line,
                          int column, const std::string& fragment) {
  auto d = resolve_errors(yaml, keys, agent_uid);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].file, "/etc/ddpctl/agent.yaml");
  EXPECT_EQ(d[0].line, line);
  EXPECT_EQ(d[0].column, column);
  EXPECT_NE(d[0].message.find(fragment), std::string::npos) << d[0].to_string();
}

}  // namespace

TEST(KeyUsers, NotConfiguredRunsEverythingAsTheAgent) {
  const KeyUserMap none;
  auto d = decide_run_as(none, "default", "anyone");
  EXPECT_EQ(d.user, nullptr);
  EXPECT_TRUE(d.refusal.empty());
}

TEST(KeyUsers, AMappedKeyRunsAsItsUserOnlyForThatUser) {
  const KeyUserMap m{{"alice-laptop", user("alice", 1001)}, {"bob", user("bob", 1002)}};
  auto d = decide_run_as(m, "alice-laptop", "alice");
  ASSERT_NE(d.user, nullptr);
  EXPECT_EQ(d.user->uid, 1001u);
  EXPECT_TRUE(d.refusal.empty());

  d = decide_run_as(m, "alice-laptop", "bob");
  EXPECT_EQ(d.user, nullptr);
  EXPECT_EQ(d.refusal, "key 'alice-laptop' runs jobs only as user 'alice', but this job's user is 'bob'");
  EXPECT_NE(d.hint.find("token file provisioned for 'bob'"), std::string::npos) << d.hint;

  d = decide_run_as(m, "alice-laptop", "root");
  EXPECT_EQ(d.user, nullptr);
  EXPECT_FALSE(d.refusal.empty());
}

TEST(KeyUsers, AnUnmappedKeyRunsNothingOnceKeyUsersIsConfigured) {
  const KeyUserMap m{{"bob", user("bob", 1002)}};
  auto d = decide_run_as(m, "default", "bob");
  EXPECT_EQ(d.user, nullptr);
  EXPECT_NE(d.refusal.find("key 'default' is not mapped to a local user"), std::string::npos) << d.refusal;
  EXPECT_NE(d.hint.find("key_users"), std::string::npos);
}

TEST(KeyUsers, UserEnvironmentNamesTheUser) {
  auto env = user_environment(user("alice", 1001));
  EXPECT_EQ(env.at("HOME"), "/home/alice");
  EXPECT_EQ(env.at("USER"), "alice");
  EXPECT_EQ(env.at("LOGNAME"), "alice");
  EXPECT_EQ(env.at("SHELL"), "/bin/bash");
  auto no_shell = user("bob", 1002);
  no_shell.shell.clear();
  EXPECT_EQ(user_environment(no_shell).at("SHELL"), "/bin/sh");
}

TEST(KeyUsers, ResolveLooksUpEveryUser) {
  auto m =
      resolve_key_users(config("key_users: {k1: alice, k2: bob, k3: alice}\n"), {"k1", "k2", "k3"}, 0, fake_lookup);
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m.at("k1").uid, 1001u);
  EXPECT_EQ(m.at("k2").home, "/home/bob");
  EXPECT_EQ(m.at("k3").groups, (std::vector<gid_t>{1001, 100}));
  EXPECT_TRUE(resolve_key_users(config("name: n1\n"), {"default"}, 0, fake_lookup).empty());
}

TEST(KeyUsers, ResolveErrorsPointAtTheUser) {
  expect_resolve_error("key_users:\n  k1: carol\n", {"k1"}, 0, 2, 7, "key 'k1': no local user 'carol' on this node");
  expect_resolve_error("key_users:\n  k9: alice\n", {"k1", "k2"}, 0, 2, 7,
                       "key 'k9' is not in the token file (its keys: k1, k2)");
  // uid 0 under another name is still root.
  expect_resolve_error("key_users:\n  ops: toor\n", {"ops"}, 0, 2, 8,
                       "user 'toor' has uid 0; jobs run as root only with allow_root: true");
  // An agent that is not root cannot switch users.
  expect_resolve_error("key_users:\n  k1: alice\n  k2: bob\n", {"k1", "k2"}, 1001, 3, 7,
                       "ddp-agentd runs as uid 1001, not root, so it cannot run jobs as 'bob'");
  // Every problem at once.
  EXPECT_EQ(resolve_errors("key_users: {k1: carol, k2: dave}\n", {"k1", "k2"}, 0).size(), 2u);
}

TEST(KeyUsers, RootWithAllowRoot) {
  auto m = resolve_key_users(config("allow_root: true\nkey_users: {ops: toor, adm: root}\n"), {"ops", "adm"}, 0,
                             fake_lookup);
  EXPECT_EQ(m.at("ops").uid, 0u);
  EXPECT_EQ(m.at("adm").uid, 0u);
}

// The real user database: root is always there, with uid 0, and a name that is not is not.
TEST(KeyUsers, SystemLookup) {
  auto root = lookup_system_user("root");
  ASSERT_TRUE(root);
  EXPECT_EQ(root->uid, 0u);
  EXPECT_EQ(root->gid, 0u);
  EXPECT_FALSE(root->home.empty());
  EXPECT_NE(std::find(root->groups.begin(), root->groups.end(), 0u), root->groups.end());
  EXPECT_FALSE(lookup_system_user("ddp-no-such-user-x"));
}

TEST(StorePort, AMappedUserGetsOnlyPortsItCouldBindItself) {
  LocalUser alice{"alice", 1001, 1001, {1001}, "/home/alice", "/bin/sh"};
  LocalUser root{"root", 0, 0, {0}, "/root", "/bin/sh"};
  EXPECT_EQ(store_port_refusal(0, alice, 1024), "");  // any free port
  EXPECT_EQ(store_port_refusal(1024, alice, 1024), "");
  EXPECT_EQ(store_port_refusal(29500, alice, 1024), "");
  EXPECT_EQ(store_port_refusal(81, alice, 1024),
            "store port 81 is a privileged port (below 1024), which user alice could not bind: pick a port of 1024 or "
            "more, or 0 for any free one (store.port in the job file)");
  EXPECT_NE(store_port_refusal(1023, alice, 1024), "");
  // The admin's sysctl moves the line.
  EXPECT_EQ(store_port_refusal(81, alice, 80), "");
  EXPECT_NE(store_port_refusal(2000, alice, 4096), "");
  // root's jobs may (root could bind it anyway).
  EXPECT_EQ(store_port_refusal(81, root, 1024), "");
  EXPECT_GT(unprivileged_port_start(), 0u);
}

// ---- decide_offer: whose job an offer is (a delegation's key, else the link's) ----

namespace {

const ddp::proto::Key kAliceKey{"alice-key", std::string(40, 'a')};
const ddp::proto::Key kBobKey{"bob-key", std::string(40, 'b')};
const ddp::proto::Keyring kKeys({kAliceKey, kBobKey, ddp::proto::Key{"coord", std::string(40, 'c')}});
constexpr std::uint64_t kNow = 1'800'000'000;

nlohmann::json offer(const std::string& user, const std::optional<ddp::proto::Key>& signer = std::nullopt,
                     const std::string& delegated_user = "") {
  nlohmann::json o{
      {"job_id", "j1"}, {"user", user}, {"node", "n1"}, {"spec", {{"command", {"/bin/true"}}, {"log_dir", "/l"}}}};
  if (signer) {
    ddp::proto::Delegation d;
    d.user = delegated_user.empty() ? user : delegated_user;
    d.coordinator_key = "coord";
    d.job_id = "j1";
    d.expires_s = kNow + 600;
    d.nonce = std::string(32, '1');
    d.spec_sha256 = ddp::proto::payload_digest(o["spec"]);
    o["delegation"] = ddp::proto::to_json(ddp::proto::sign_delegation(d, *signer));
  }
  return o;
}

}  // namespace

TEST(DecideOffer, AStandingCoordinatorsOfferRunsAsTheDelegatingKeysUser) {
  const KeyUserMap m{{"alice-key", user("alice", 1001)}, {"bob-key", user("bob", 1002)}};
  // The coordinator's key is mapped to nobody; alice's delegation makes it alice's job.
  auto d = decide_offer(m, {}, kKeys, "coord", offer("alice", kAliceKey), kNow);
  ASSERT_TRUE(d.refusal.empty()) << d.refusal;
  ASSERT_NE(d.user, nullptr);
  EXPECT_EQ(d.user->name, "alice");
  // Without one, the coordinator's own key decides, as before version 6: unmapped, refused.
  d = decide_offer(m, {}, kKeys, "coord", offer("alice"), kNow);
  EXPECT_NE(d.refusal.find("key 'coord' is not mapped"), std::string::npos) << d.refusal;
  // Bob's delegation for a job that names alice.
  d = decide_offer(m, {}, kKeys, "coord", offer("alice", kBobKey, "alice"), kNow);
  EXPECT_NE(d.refusal.find("key 'bob-key' runs jobs only as user 'bob'"), std::string::npos) << d.refusal;
  // A delegation for bob attached to an offer naming alice.
  d = decide_offer(m, {}, kKeys, "coord", offer("alice", kBobKey, "bob"), kNow);
  EXPECT_NE(d.refusal.find("for user 'bob', not 'alice'"), std::string::npos) << d.refusal;
}

TEST(DecideOffer, ABadDelegationIsRefusedWhateverTheMap) {
  for (const KeyUserMap& m : {KeyUserMap{}, KeyUserMap{{"alice-key", user("alice", 1001)}}}) {
    auto o = offer("alice", kAliceKey);
    o["delegation"]["mac"] = std::string(64, '0');
    EXPECT_NE(decide_offer(m, {}, kKeys, "coord", o, kNow).refusal.find("does not verify"), std::string::npos);
    EXPECT_NE(decide_offer(m, {}, kKeys, "coord", offer("alice", kAliceKey), kNow + 601).refusal.find("expired"),
              std::string::npos);
    o = offer("alice", kAliceKey);
    o["job_id"] = "j2";  // replayed for another job
    EXPECT_NE(decide_offer(m, {}, kKeys, "coord", o, kNow).refusal.find("for job j1, not j2"), std::string::npos);
    // Copied off the wire and offered over a link that proved bob's key.
    EXPECT_NE(decide_offer(m, {}, kKeys, "bob-key", offer("alice", kAliceKey), kNow).refusal.find("not 'bob-key'"),
              std::string::npos);
  }
}

TEST(DecideOffer, AllowedUsersIsTheAuthenticatedUser) {
  const KeyUserMap m{{"alice-key", user("alice", 1001)}, {"bob-key", user("bob", 1002)}};
  // Bob's key on the link, the offer claiming alice (who is allowed): the key's user decides first.
  auto d = decide_offer(m, {"alice"}, kKeys, "bob-key", offer("alice"), kNow);
  EXPECT_NE(d.refusal.find("runs jobs only as user 'bob'"), std::string::npos) << d.refusal;
  // Bob as himself: not in the list.
  d = decide_offer(m, {"alice"}, kKeys, "bob-key", offer("bob"), kNow);
  EXPECT_EQ(d.refusal, "does not accept jobs from user 'bob': not in allowed_users");
  // Through a coordinator with bob's delegation: still bob, still refused.
  d = decide_offer(m, {"alice"}, kKeys, "coord", offer("bob", kBobKey), kNow);
  EXPECT_EQ(d.refusal, "does not accept jobs from user 'bob': not in allowed_users");
  d = decide_offer(m, {"alice"}, kKeys, "coord", offer("alice", kAliceKey), kNow);
  EXPECT_TRUE(d.refusal.empty()) << d.refusal;
  // Without key_users: the declared name (one shared token cannot tell users apart).
  EXPECT_TRUE(decide_offer({}, {"alice"}, kKeys, "coord", offer("alice"), kNow).refusal.empty());
  EXPECT_FALSE(decide_offer({}, {"alice"}, kKeys, "coord", offer("bob"), kNow).refusal.empty());
}

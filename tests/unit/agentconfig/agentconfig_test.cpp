#include "agentconfig/agentconfig.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

using namespace ddp::agentconfig;
using namespace std::chrono_literals;

namespace {

std::vector<Diagnostic> errors_of(const std::string& yaml) {
  try {
    parse_agent_config(yaml, "agent.yaml");
  } catch (const ConfigError& e) {
    return e.diagnostics();
  }
  ADD_FAILURE() << "expected an error for:\n" << yaml;
  return {};
}

void expect_error(const std::string& yaml, int line, int column, const std::string& fragment) {
  auto d = errors_of(yaml);
  bool found = false;
  std::string all;
  for (const auto& x : d) {
    if (x.line == line && x.column == column && x.message.find(fragment) != std::string::npos) found = true;
    all += x.to_string() + "\n";
  }
  EXPECT_TRUE(found) << "wanted " << line << ":" << column << " '" << fragment << "' in:\n" << all;
}

}  // namespace

TEST(AgentConfig, EveryKeyParses) {
  auto c = parse_agent_config(R"(
listen: "[::]:29420"
token_file: /etc/ddpctl/other-token
log_dir: /srv/ddp/logs
name: gpu-01
heartbeat_timeout: 10s
allowed_users: [alice, bob]
container_runtime: podman
gpus: [0, GPU-5c1f7e2a-0000-0000-0000-000000000001, "0000:3b:00.0"]
cpus: 0-3,8
)",
                              "agent.yaml");
  EXPECT_EQ(c.listen, "[::]:29420");
  EXPECT_EQ(c.token_file, "/etc/ddpctl/other-token");
  EXPECT_EQ(c.log_dir, "/srv/ddp/logs");
  EXPECT_EQ(c.name, "gpu-01");
  EXPECT_EQ(c.heartbeat_timeout, 10s);
  EXPECT_EQ(c.allowed_users, (std::vector<std::string>{"alice", "bob"}));
  EXPECT_EQ(c.container_runtime, ContainerRuntime::podman);
  EXPECT_EQ(c.gpus, (std::vector<std::string>{"0", "GPU-5c1f7e2a-0000-0000-0000-000000000001", "0000:3b:00.0"}));
  EXPECT_EQ(c.cpus, (std::vector<int>{0, 1, 2, 3, 8}));
}

TEST(AgentConfig, EmptyFileKeepsEveryDefault) {
  for (const char* text : {"", "# only a comment\n", "~\n"}) {
    auto c = parse_agent_config(text, "agent.yaml");
    EXPECT_FALSE(c.listen || c.token_file || c.log_dir || c.name || c.heartbeat_timeout || c.container_runtime ||
                 c.gpus || c.cpus)
        << text;
    EXPECT_TRUE(c.allowed_users.empty());
  }
}

TEST(AgentConfig, GpusAllMeansUnrestricted) {
  EXPECT_FALSE(parse_agent_config("gpus: all\n", "agent.yaml").gpus.has_value());
}

TEST(AgentConfig, UnknownKeyGetsAHint) {
  expect_error("listen: \"[::]:1\"\nlog_dri: /x\n", 2, 1, "unknown key 'log_dri' (did you mean 'log_dir'?)");
}

TEST(AgentConfig, EveryBadValueIsReportedAtItsPosition) {
  const std::string yaml =
      "listen: nothere:99999\n"          // 1
      "token_file: relative/token\n"     // 2
      "heartbeat_timeout: 100ms\n"       // 3
      "allowed_users: [alice, Root!]\n"  // 4
      "container_runtime: lxc\n"         // 5
      "gpus: [0, [1], 0]\n"              // 6
      "cpus: 3-1\n"                      // 7
      "name: 'has space'\n"              // 8
      "log_dir: [a]\n";                  // 9
  auto d = errors_of(yaml);
  EXPECT_EQ(d.size(), 10u);
  expect_error(yaml, 1, 9, "listen: expected HOST:PORT");
  expect_error(yaml, 2, 13, "token_file: expected an absolute path, got 'relative/token'");
  expect_error(yaml, 3, 20, "heartbeat_timeout: expected a duration from 2s to 1h");
  expect_error(yaml, 4, 24, "allowed_users: expected a user name, got 'Root!'");
  expect_error(yaml, 5, 20, "container_runtime: expected podman, docker or none, got 'lxc'");
  expect_error(yaml, 6, 11, "gpus: expected a GPU index, UUID or PCI bus id, got a list");
  expect_error(yaml, 6, 16, "gpus: GPU 0 is listed twice");
  expect_error(yaml, 7, 7, "cpus: expected a CPU list");
  expect_error(yaml, 8, 7, "name: expected 1-64 letters");
  expect_error(yaml, 9, 10, "log_dir: expected a string, got a list");
}

TEST(AgentConfig, DuplicateKeyAndWrongShapes) {
  expect_error("name: a\nname: b\n", 2, 1, "duplicate key 'name'");
  expect_error("- listen\n", 1, 1, "expected a mapping with keys listen");
  expect_error("allowed_users: alice\n", 1, 16, "allowed_users: expected a list of user names");
  expect_error("gpus: 0\n", 1, 7, "gpus: expected 'all' or a list");
  expect_error("listen: [\n", 2, 1, "not valid YAML");
}

TEST(AgentConfig, UnreadableFileNamesIt) {
  try {
    load_agent_config("/nonexistent/agent.yaml");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/agent.yaml: error: cannot read the agent config"),
              std::string::npos)
        << e.what();
  }
}

// The default config the ddp-agentd package installs must stay valid, and must not change any
// default by being present.
TEST(AgentConfig, ShippedDefaultIsValidAndChangesNothing) {
  const char* src = std::getenv("DDP_SOURCE_DIR");
  ASSERT_NE(src, nullptr);
  auto c = load_agent_config(std::string(src) + "/packaging/agent.yaml");
  EXPECT_FALSE(c.listen || c.token_file || c.log_dir || c.name || c.heartbeat_timeout || c.container_runtime ||
               c.gpus || c.cpus);
}

TEST(AgentConfig, KeyUsersMapKeysToUsersWithTheirPositions) {
  auto c = parse_agent_config("key_users:\n  alice-laptop: alice\n  alice-ci: alice\n  bob: bob\n", "agent.yaml");
  ASSERT_EQ(c.key_users.size(), 3u);
  EXPECT_EQ(c.key_users[0].key_id, "alice-laptop");
  EXPECT_EQ(c.key_users[0].user, "alice");
  EXPECT_EQ(c.key_users[0].line, 2);
  EXPECT_EQ(c.key_users[0].column, 17);
  EXPECT_EQ(c.key_users[2].key_id, "bob");
  EXPECT_FALSE(c.allow_root);
  EXPECT_TRUE(parse_agent_config("allow_root: true\n", "agent.yaml").allow_root);
}

TEST(AgentConfig, KeyUsersErrorsAtTheirPositions) {
  expect_error("key_users: [alice]\n", 1, 12, "key_users: expected a mapping from token key ids to local user names");
  expect_error("key_users:\n  'bad key': alice\n", 2, 3, "key_users: expected a key id");
  expect_error("key_users:\n  k1: Alice!\n", 2, 7, "key_users: key 'k1': expected a local user name, got 'Alice!'");
  expect_error("key_users:\n  k1: [alice]\n", 2, 7, "expected a local user name, got a list");
  expect_error("key_users:\n  k1: alice\n  k1: bob\n", 3, 3, "key_users: key 'k1' is mapped twice");
  expect_error("allow_root: yes please\n", 1, 13, "allow_root: expected true or false");
}

TEST(AgentConfig, RootOnlyWithAllowRootWhereverAllowRootIsWritten) {
  expect_error("key_users:\n  ops: root\n", 2, 8,
               "key 'ops' maps to root; jobs run as root only with allow_root: true");
  expect_error("allow_root: false\nkey_users: {ops: root}\n", 2, 18, "maps to root");
  auto c = parse_agent_config("key_users: {ops: root}\nallow_root: true\n", "agent.yaml");
  ASSERT_EQ(c.key_users.size(), 1u);
  EXPECT_EQ(c.key_users[0].user, "root");
}

// The store and the rank logs are the root agent's memory and writes: a job asks within limits
// the admin sets, whatever its own job file says.
TEST(AgentConfig, LimitsBoundWhatAJobMayAsk) {
  const auto d = parse_agent_config("", "agent.yaml");
  EXPECT_EQ(d.limits.store_max_size, 1ull << 30);
  EXPECT_EQ(d.limits.store_max_keys, 1ull << 20);
  EXPECT_EQ(d.limits.log_max_size, 1ull << 30);
  const auto c = parse_agent_config("limits: {store_max_size: 4GiB, store_max_keys: 4194304, log_max_size: 10GiB}\n",
                                    "agent.yaml");
  EXPECT_EQ(c.limits.store_max_size, 4ull << 30);
  EXPECT_EQ(c.limits.store_max_keys, 4194304u);
  EXPECT_EQ(c.limits.log_max_size, 10ull << 30);
  expect_error("limits: {store_max_size: lots}\n", 1, 26, "limits.store_max_size: expected a size of at least 1MiB");
  expect_error("limits: {store_max_keys: 10}\n", 1, 26,
               "limits.store_max_keys: expected a number of keys of at least 1024");
  expect_error("limits: {log_size: 1GiB}\n", 1, 10, "limits: unknown key 'log_size'");
  expect_error("limits: 5\n", 1, 9, "limits: expected a mapping");

  ddp::jobspec::JobSpec spec;  // the job file's defaults fit the agent's
  EXPECT_EQ(over_limits(spec, d.limits), "");
  spec.store_max_bytes = (1ull << 30) + 1;
  EXPECT_NE(over_limits(spec, d.limits)
                .find("the job's store.max_size (1073741825) is above this node's limit of "
                      "1073741824 (limits.store_max_size"),
            std::string::npos);
  EXPECT_EQ(over_limits(spec, c.limits), "");
  spec = {};
  spec.store_max_keys = ~0ull;
  EXPECT_NE(over_limits(spec, d.limits).find("store.max_keys"), std::string::npos);
  spec = {};
  spec.log_max_bytes = 1ull << 50;
  EXPECT_NE(over_limits(spec, c.limits).find("logs.max_size"), std::string::npos);
}

// The job payload codec and --nodes entries.
#include "net/wire.hpp"

#include <gtest/gtest.h>

using namespace ddp::net;

TEST(Wire, PayloadRoundTrips) {
  JobPayload p;
  p.spec = ddp::jobspec::parse_job_yaml(
      "name: t\nnnodes: 2\nnproc_per_node: 3\ncommand: [python3, a.py, --x]\nworkdir: /w\nenv: {A: '1', B: two}\n"
      "restart: {max_restarts: 2, backoff: 3s}\nstore: {port: 29555, threads: 3, max_size: 2MiB, max_keys: "
      "5000}\nstop: {grace: 4s}\n"
      "binding: {gpu: isolate, numa: exclusive, nic: rank}\n",
      "t.yaml");
  p.forward_env = {{"PATH", "/usr/bin"}};
  auto back = payload_from_json(nlohmann::json::parse(to_json(p).dump()));
  EXPECT_EQ(back.spec.name, "t");
  EXPECT_EQ(back.spec.nnodes_max, 2);
  EXPECT_EQ(back.spec.nproc.count, 3);
  EXPECT_EQ(back.spec.command, p.spec.command);
  EXPECT_EQ(back.spec.workdir, "/w");
  EXPECT_EQ(back.spec.env, p.spec.env);
  EXPECT_EQ(back.spec.max_restarts, 2);
  EXPECT_EQ(back.spec.restart_backoff, ddp::Millis(3000));
  EXPECT_EQ(back.spec.store_port, 29555);
  EXPECT_EQ(back.spec.store_threads, 3);
  EXPECT_EQ(back.spec.store_max_bytes, 2u << 20);
  EXPECT_EQ(back.spec.store_max_keys, 5000u);
  EXPECT_EQ(back.spec.stop_grace, ddp::Millis(4000));
  EXPECT_EQ(back.forward_env, p.forward_env);
  EXPECT_EQ(back.spec.binding.gpu, ddp::jobspec::GpuBinding::isolate);
  EXPECT_EQ(back.spec.binding.numa, ddp::jobspec::NumaBinding::exclusive);
  EXPECT_EQ(back.spec.binding.nic, ddp::jobspec::NicBinding::rank);
}

TEST(Wire, StoreThreadsAutoTravelsAndAnOlderLauncherMeansTheAgentsLoop) {
  JobPayload p;
  p.spec = ddp::jobspec::parse_job_yaml("command: [x]\nstore: {threads: auto}\n", "t.yaml");
  auto j = to_json(p);
  EXPECT_EQ(payload_from_json(j).spec.store_threads, ddp::jobspec::kAutoThreads);
  j.erase("store_threads");
  EXPECT_EQ(payload_from_json(j).spec.store_threads, 0);
  j.erase("store_max_bytes");
  j.erase("store_max_keys");
  EXPECT_EQ(payload_from_json(j).spec.store_max_bytes, ddp::jobspec::JobSpec{}.store_max_bytes);
  EXPECT_EQ(payload_from_json(j).spec.store_max_keys, ddp::jobspec::JobSpec{}.store_max_keys);
  j["store_threads"] = 1000;
  EXPECT_THROW(payload_from_json(j), WireError);
  j["store_threads"] = 4294967299ull;  // 3 if truncated to 32 bits
  EXPECT_THROW(payload_from_json(j), WireError);
}

// Whether store.port was named travels: node rank 0's agent takes a free port for a default one
// that is taken, never for a named one; a launcher that predates the flag meant "that port".
TEST(Wire, WhetherTheStorePortWasNamedTravelsAndAnOlderLauncherMeantNamed) {
  JobPayload p;
  p.spec = ddp::jobspec::parse_job_yaml("command: [x]\n", "t.yaml");
  ASSERT_FALSE(p.spec.store_port_explicit);
  auto j = to_json(p);
  EXPECT_FALSE(payload_from_json(j).spec.store_port_explicit);
  EXPECT_EQ(j["store_port_explicit"], false);
  p.spec = ddp::jobspec::parse_job_yaml("command: [x]\nstore: {port: 29500}\n", "t.yaml");
  ASSERT_TRUE(p.spec.store_port_explicit);
  j = to_json(p);
  EXPECT_FALSE(j.contains("store_port_explicit"));  // what every older build wrote
  EXPECT_TRUE(payload_from_json(j).spec.store_port_explicit);
  // A spec from an older launcher passes through this build unchanged, byte for byte: a standing
  // coordinator re-writes the spec it forwards, and the agents check the submitter's digest of it.
  EXPECT_EQ(to_json(payload_from_json(j)).dump(), j.dump());
  j["store_port_explicit"] = "yes";
  EXPECT_THROW(payload_from_json(j), WireError);
}

TEST(Wire, ContainerRoundTrips) {
  JobPayload p;
  p.spec = ddp::jobspec::parse_job_yaml(
      "command: [x]\ncontainer: {runtime: enroot, image: /img/pt.sqsh, mounts: ['/a:/b:ro'], workdir: /b, pull: "
      "always,\n"
      "  extra_args: [--rw], env: {K: v}}\n",
      "t.yaml");
  auto back = payload_from_json(nlohmann::json::parse(to_json(p).dump()));
  ASSERT_TRUE(back.spec.container);
  const auto& c = *back.spec.container;
  EXPECT_EQ(c.runtime, ddp::jobspec::ContainerRuntime::enroot);
  EXPECT_EQ(c.image, "/img/pt.sqsh");
  ASSERT_EQ(c.mounts.size(), 1u);
  EXPECT_EQ(c.mounts[0].source, "/a");
  EXPECT_TRUE(c.mounts[0].read_only);
  EXPECT_EQ(c.workdir, "/b");
  EXPECT_EQ(c.pull, ddp::jobspec::PullPolicy::always);
  EXPECT_EQ(c.extra_args, std::vector<std::string>{"--rw"});
  EXPECT_EQ(c.env, p.spec.container->env);
  auto j = to_json(p);
  j["container"]["mounts"][0]["source"] = "rel";  // the launcher sends them absolute
  EXPECT_THROW(payload_from_json(j), WireError);
  j = to_json(p);
  j["container"]["runtime"] = "lxc";
  EXPECT_THROW(payload_from_json(j), WireError);
}

TEST(Wire, BadPayloadNamesTheField) {
  JobPayload p;
  p.spec.command = {"x"};
  auto j = to_json(p);
  j.erase("command");
  try {
    payload_from_json(j);
    FAIL();
  } catch (const WireError& e) {
    EXPECT_NE(std::string(e.what()).find("'command'"), std::string::npos);
  }
  j = to_json(p);
  j["nproc"]["kind"] = "tpu";
  EXPECT_THROW(payload_from_json(j), WireError);
  j = to_json(p);
  j["env"] = nlohmann::json::array({nlohmann::json::array({"A"})});
  EXPECT_THROW(payload_from_json(j), WireError);
  EXPECT_THROW(payload_from_json(nlohmann::json::array()), WireError);
  j = to_json(p);
  j["binding"]["numa"] = "far";
  try {
    payload_from_json(j);
    FAIL();
  } catch (const WireError& e) {
    EXPECT_STREQ(e.what(), "job spec: binding.numa 'far' is not one of auto, none, node, exclusive");
  }
}

TEST(Wire, ForwardedEnvMatchesNamesAndPrefixes) {
  auto f = forwarded_env({{"PATH", "p"}, {"NCCL_DEBUG", "INFO"}, {"HOME", "h"}, {"PATHX", "no"}, {"NCCL_A-B", "odd"}},
                         {"PATH", "NCCL_*"});
  EXPECT_EQ(f, (std::map<std::string, std::string>{{"PATH", "p"}, {"NCCL_DEBUG", "INFO"}}));
}

// A name the job file could not hold never reaches an agent's filters: "GCONV_PATH=/x" would
// become GCONV_PATH in a root process's environment, "X\nY" a line of a container's env file.
TEST(Wire, AVariableNameIsAName) {
  JobPayload p;
  p.spec.command = {"x"};
  p.spec.env = {{"OK_1", "v=w"}};
  p.forward_env = {{"NCCL_DEBUG", "INFO"}};
  EXPECT_NO_THROW(payload_from_json(to_json(p)));
  for (const char* bad : {"GCONV_PATH=/home/u/g", "X\nHTTPS_PROXY", "", "1A", "A B"}) {
    auto j = to_json(p);
    j["env"] = nlohmann::json::array({nlohmann::json::array({bad, "x"})});
    EXPECT_THROW(payload_from_json(j), WireError) << bad;
    j = to_json(p);
    j["forward_env"] = {{bad, "x"}};
    EXPECT_THROW(payload_from_json(j), WireError) << bad;
  }
  auto j = to_json(p);
  j["env"] = nlohmann::json::array({nlohmann::json::array({"A", std::string("x\0y", 3)})});
  EXPECT_THROW(payload_from_json(j), WireError);
  j = to_json(p);
  j["env_forward"] = {"LD_*", "GCONV_PATH=*"};
  EXPECT_THROW(payload_from_json(j), WireError);
  j["env_forward"] = {"LD_*", "NCCL_*", "PATH"};
  EXPECT_NO_THROW(payload_from_json(j));
}

TEST(Wire, NodeEntries) {
  auto e = node_entries({"n1", "n2:30000", "[fe80::1]:5"}, 29410);
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0].name, "n1");
  EXPECT_EQ(e[0].port, 29410);
  EXPECT_EQ(e[1].name, "n2");
  EXPECT_EQ(e[1].port, 30000);
  EXPECT_EQ(e[2].host, "fe80::1");
  // Two agents on one host: names carry the port so they stay apart.
  auto same = node_entries({"127.0.0.1:1", "127.0.0.1:2"}, 29410);
  EXPECT_EQ(same[0].name, "127.0.0.1:1");
  EXPECT_EQ(same[1].name, "127.0.0.1:2");
  EXPECT_THROW(node_entries({"a", "a:29410"}, 29410), WireError);
}

TEST(Wire, NodeEntriesTakeALoginUserOnlyForSsh) {
  auto e = node_entries({"alice@n1", "n2:2222"}, 0, /*allow_user=*/true);
  EXPECT_EQ(e[0].user, "alice");
  EXPECT_EQ(e[0].host, "n1");
  EXPECT_EQ(e[0].name, "n1");  // the node is the host, whoever logs in
  EXPECT_EQ(e[1].user, "");
  // The same host twice is a typo whatever the login.
  EXPECT_THROW(node_entries({"alice@n1", "bob@n1"}, 0, true), WireError);
  try {
    node_entries({"alice@n1"}, 29410);
    FAIL() << "a user name without --ssh must be refused";
  } catch (const WireError& err) {
    EXPECT_NE(std::string(err.what()).find("only for --ssh"), std::string::npos) << err.what();
  }
}

TEST(Wire, PythonTravelsAndIsChecked) {
  JobPayload p;
  p.spec = ddp::jobspec::parse_job_yaml("command: [sh, run.sh]\npython: [uv, run, python]\n", "t.yaml");
  auto j = to_json(p);
  EXPECT_EQ(payload_from_json(j).spec.python, (std::vector<std::string>{"uv", "run", "python"}));
  j.erase("python");  // an older launcher: the agent decides from the command
  EXPECT_TRUE(payload_from_json(j).spec.python.empty());
  j["python"] = nlohmann::json::array();
  EXPECT_THROW(payload_from_json(j), WireError);
  j["python"] = {""};
  EXPECT_THROW(payload_from_json(j), WireError);
}

TEST(Wire, HangTravelsAndIsChecked) {
  JobPayload p;
  p.spec.command = {"python3", "train.py"};
  EXPECT_FALSE(payload_from_json(to_json(p)).spec.hang.has_value());
  p.spec.hang = ddp::jobspec::HangSpec{ddp::Millis(5000), ddp::jobspec::HangAction::restart};
  auto back = payload_from_json(nlohmann::json::parse(to_json(p).dump()));
  ASSERT_TRUE(back.spec.hang.has_value());
  EXPECT_EQ(back.spec.hang->timeout, ddp::Millis(5000));
  EXPECT_EQ(back.spec.hang->action, ddp::jobspec::HangAction::restart);
  auto j = to_json(p);
  j["hang"]["timeout_ms"] = 10;
  EXPECT_THROW(payload_from_json(j), WireError);
  j = to_json(p);
  j["hang"]["action"] = "kill";
  EXPECT_THROW(payload_from_json(j), WireError);
  j = to_json(p);
  j["hang"] = 5;
  EXPECT_THROW(payload_from_json(j), WireError);
}

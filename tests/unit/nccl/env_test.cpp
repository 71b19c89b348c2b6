// The worker env contract: a full torchrun/ddpctl environment, and every kind of bad one.
#include "worker/env.hpp"
#include "nccl/unique_id.hpp"
#include "worker/comm.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

using namespace ddp::worker;
using ::testing::HasSubstr;
using ::testing::Not;

namespace {

using Env = std::map<std::string, std::string, std::less<>>;

EnvLookup lookup(const Env& env) {
  return [&env](std::string_view name) -> std::optional<std::string> {
    auto it = env.find(name);
    return it == env.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}

Env full_env() {
  return {{"RANK", "5"},
          {"WORLD_SIZE", "8"},
          {"LOCAL_RANK", "1"},
          {"LOCAL_WORLD_SIZE", "4"},
          {"GROUP_RANK", "1"},
          {"GROUP_WORLD_SIZE", "2"},
          {"MASTER_ADDR", "node1"},
          {"MASTER_PORT", "29500"},
          {"TORCHELASTIC_RESTART_COUNT", "2"},
          {"TORCHELASTIC_MAX_RESTARTS", "3"},
          {"TORCHELASTIC_RUN_ID", "run-7"},
          {"DDP_JOB_ID", "job-42"},
          {"DDP_NODE", "node2"},
          {"DDP_NCCL_UNIQUE_ID", std::string(254, '0') + "ff"}};
}

std::string error_of(const Env& env, const EnvOptions& options = {}) {
  try {
    parse_worker_env(lookup(env), options);
  } catch (const EnvError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(WorkerEnv, ParsesAFullContract) {
  Env env = full_env();
  WorkerEnv w = parse_worker_env(lookup(env), {.require_nccl_id = true});
  EXPECT_EQ(w.rank, 5);
  EXPECT_EQ(w.world_size, 8);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_world_size, 4);
  EXPECT_EQ(w.group_rank, 1);
  EXPECT_EQ(w.group_world_size, 2);
  EXPECT_EQ(w.master_addr, "node1");
  EXPECT_EQ(w.master_port, 29500);
  EXPECT_EQ(w.restart_count, 2);
  EXPECT_EQ(w.max_restarts, 3);
  EXPECT_EQ(w.run_id, "run-7");
  EXPECT_EQ(w.job_id, "job-42");
  EXPECT_EQ(w.node_name, "node2");
  ASSERT_TRUE(w.nccl_unique_id.has_value());
  EXPECT_EQ(w.nccl_unique_id->bytes[127], 0xff);
  EXPECT_EQ(w.nccl_unique_id->bytes[0], 0);
}

TEST(WorkerEnv, OptionalPartsDefault) {
  Env env = {{"RANK", "0"},
             {"WORLD_SIZE", "1"},
             {"LOCAL_RANK", "0"},
             {"LOCAL_WORLD_SIZE", "1"},
             {"MASTER_ADDR", "127.0.0.1"},
             {"MASTER_PORT", "1"}};
  WorkerEnv w = parse_worker_env(lookup(env));
  EXPECT_EQ(w.group_rank, 0);
  EXPECT_EQ(w.group_world_size, 1);
  EXPECT_EQ(w.restart_count, 0);
  EXPECT_FALSE(w.nccl_unique_id.has_value());
  EXPECT_TRUE(w.job_id.empty());
}

TEST(WorkerEnv, ReportsEveryMissingVariableAtOnce) {
  std::string msg = error_of({});
  EXPECT_THAT(msg, HasSubstr("start this program with ddpctl or torchrun"));
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    EXPECT_THAT(msg, HasSubstr(std::string("\n  ") + name + " is not set")) << msg;
  }
  EXPECT_THAT(msg, Not(HasSubstr("DDP_NCCL_UNIQUE_ID")));
}

TEST(WorkerEnv, EmptyIsUnset) {
  Env env = full_env();
  env["MASTER_ADDR"] = "";
  EXPECT_THAT(error_of(env), HasSubstr("MASTER_ADDR is not set"));
}

TEST(WorkerEnv, RejectsNonIntegers) {
  for (const char* bad : {"abc", "1.0", " 1", "1 ", "+1", "0x10", "99999999999999999999"}) {
    Env env = full_env();
    env["WORLD_SIZE"] = bad;
    std::string msg = error_of(env);
    EXPECT_THAT(msg, HasSubstr("WORLD_SIZE=")) << bad;
    EXPECT_THAT(msg, ::testing::AnyOf(HasSubstr("is not a decimal integer"), HasSubstr("out of range"))) << msg;
  }
}

TEST(WorkerEnv, RejectsOutOfRange) {
  Env env = full_env();
  env["RANK"] = "-1";
  env["MASTER_PORT"] = "65536";
  env["WORLD_SIZE"] = "0";
  std::string msg = error_of(env);
  EXPECT_THAT(msg, HasSubstr("RANK=-1 is out of range"));
  EXPECT_THAT(msg, HasSubstr("MASTER_PORT=65536 is out of range [1, 65535]"));
  EXPECT_THAT(msg, HasSubstr("WORLD_SIZE=0 is out of range"));
}

TEST(WorkerEnv, CrossChecksRanks) {
  Env env = full_env();
  env["RANK"] = "8";
  EXPECT_THAT(error_of(env), HasSubstr("RANK=8 is not below WORLD_SIZE=8"));
  env = full_env();
  env["LOCAL_RANK"] = "4";
  EXPECT_THAT(error_of(env), HasSubstr("LOCAL_RANK=4 is not below LOCAL_WORLD_SIZE=4"));
  env = full_env();
  env["LOCAL_WORLD_SIZE"] = "16";
  EXPECT_THAT(error_of(env), HasSubstr("LOCAL_WORLD_SIZE=16 exceeds WORLD_SIZE=8"));
  env = full_env();
  env["GROUP_RANK"] = "2";
  EXPECT_THAT(error_of(env), HasSubstr("GROUP_RANK=2 is not below GROUP_WORLD_SIZE=2"));
}

TEST(WorkerEnv, NcclIdRequiredOrStrict) {
  Env env = full_env();
  env.erase("DDP_NCCL_UNIQUE_ID");
  EXPECT_NO_THROW(parse_worker_env(lookup(env)));
  EXPECT_THAT(error_of(env, {.require_nccl_id = true}),
              HasSubstr("DDP_NCCL_UNIQUE_ID is not set (this program needs an NCCL unique id"));

  env = full_env();
  env["DDP_NCCL_UNIQUE_ID"] = "abc";
  EXPECT_THAT(error_of(env), HasSubstr("DDP_NCCL_UNIQUE_ID: an NCCL unique id is 256 lowercase hex characters"));
  env["DDP_NCCL_UNIQUE_ID"] = std::string(255, '0') + "G";
  EXPECT_THAT(error_of(env), HasSubstr("invalid character 'G' at position 255"));
}

TEST(WorkerEnv, ByHandModeDefaultsLocalRanks) {
  Env env = {{"RANK", "3"}, {"WORLD_SIZE", "4"}};
  WorkerEnv w = parse_worker_env(lookup(env), {.require_rendezvous = false, .require_local = false});
  EXPECT_EQ(w.local_rank, 3);
  EXPECT_EQ(w.local_world_size, 4);
  EXPECT_TRUE(w.master_addr.empty());
  EXPECT_EQ(w.master_port, 0);
}

TEST(WorkerEnv, InvalidValuesAreReportedEvenWhenOptional) {
  Env env = {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "http"}, {"TORCHELASTIC_RESTART_COUNT", "x"}};
  std::string msg = error_of(env, {.require_rendezvous = false, .require_local = false});
  EXPECT_THAT(msg, HasSubstr("MASTER_PORT=http is not a decimal integer"));
  EXPECT_THAT(msg, HasSubstr("TORCHELASTIC_RESTART_COUNT=x is not a decimal integer"));
}

TEST(WorkerComm, RefusesAnEnvWithoutId) {
  // No NCCL call is made: the missing id is found first.
  WorkerEnv env;
  try {
    auto lib = ddp::nccl::Library::load();
    init_comm(lib, env);
    FAIL() << "init_comm without an id";
  } catch (const EnvError& e) {
    EXPECT_THAT(e.what(), HasSubstr("DDP_NCCL_UNIQUE_ID is not set"));
  } catch (const ddp::nccl::LoadError&) {
    GTEST_SKIP() << "no libnccl.so.2 on this machine";
  }
}

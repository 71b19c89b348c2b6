// The NCCL flight recorder's variables in the worker contract (contract/flight_recorder.hpp).
#include "contract/flight_recorder.hpp"

#include <gtest/gtest.h>

using namespace ddp;
using namespace ddp::contract;

namespace {
jobspec::JobSpec spec_of(const std::string& yaml) {
  return jobspec::parse_job_yaml(yaml, "t.yaml");
}

NodeContext node2(std::optional<std::string> torch) {
  NodeContext n;
  n.job_id = "job-1";
  n.local_world_size = 2;
  n.world_size = 2;
  n.attempt_dir = "/logs/job-1/attempt-0";
  n.torch_version = std::move(torch);
  return n;
}

std::map<std::string, std::string> fr_vars(const Env& env) {
  std::map<std::string, std::string> out;
  for (const auto& n : flight_recorder_variables())
    if (env.count(n)) out[n] = env.at(n);
  return out;
}
}  // namespace

TEST(FlightRecorderEnv, OnFromTwoThreeWithDumpsAndPipeInTheAttemptFolder) {
  auto spec = spec_of("command: [x]\n");
  for (const auto* v : {"2.3.0", "2.5.1+cu124", "2.11.0+cu128", "3.0.0"}) {
    auto env = worker_env(spec, node2(v), {}, 1);
    EXPECT_EQ(fr_vars(env), (std::map<std::string, std::string>{
                                {"TORCH_NCCL_TRACE_BUFFER_SIZE", "2000"},
                                {"TORCH_NCCL_DUMP_ON_TIMEOUT", "1"},
                                {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "/logs/job-1/attempt-0/nccl-flight-rank-"},
                                {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "/logs/job-1/attempt-0/nccl-flight-rank-"}}))
        << v;
  }
}

TEST(FlightRecorderEnv, OffWhereThePyTorchHasNoneOrIsNotKnown) {
  auto spec = spec_of("command: [x]\n");
  for (std::optional<std::string> v : {std::optional<std::string>{}, std::optional<std::string>{"1.13.1"},
                                       std::optional<std::string>{"2.2.2"}, std::optional<std::string>{"nightly"}}) {
    EXPECT_TRUE(fr_vars(worker_env(spec, node2(v), {}, 0)).empty()) << v.value_or("(none)");
    EXPECT_FALSE(flight_recorder(v, "/a", {}).why.empty());
  }
  EXPECT_NE(flight_recorder("2.2.2", "/a", {}).why.find("2.3"), std::string::npos);
}

TEST(FlightRecorderEnv, TheJobsOwnSettingLeavesEverythingToIt) {
  // One variable of the job's (any of the names, old or new) and ddpctl adds none beside it: a
  // mix would put the dumps in one place and the pipe in another, or override the job's size.
  for (const auto& name : flight_recorder_variables()) {
    auto spec = spec_of("command: [x]\nenv: {" + name + ": '7'}\n");
    EXPECT_EQ(fr_vars(worker_env(spec, node2("2.11.0"), {}, 0)), (std::map<std::string, std::string>{{name, "7"}}))
        << name;
    // Inherited (env_forward, or the launcher's own environment) likewise.
    auto plain = spec_of("command: [x]\n");
    EXPECT_EQ(fr_vars(worker_env(plain, node2("2.11.0"), {{name, "9"}}, 0)),
              (std::map<std::string, std::string>{{name, "9"}}))
        << name;
    EXPECT_NE(flight_recorder("2.11.0", "/a", {{name, "1"}}).why.find(name), std::string::npos);
  }
}

TEST(FlightRecorderEnv, DumpNames) {
  EXPECT_EQ(flight_dump_name(3), "nccl-flight-rank-3");
  EXPECT_EQ(flight_pipe_name(3), "nccl-flight-rank-3.pipe");
  EXPECT_EQ(flight_dump_rank("nccl-flight-rank-12"), 12);
  EXPECT_EQ(flight_dump_rank("nccl-flight-rank-12.pipe"), std::nullopt);
  EXPECT_EQ(flight_dump_rank("nccl-flight-rank-"), std::nullopt);
  EXPECT_EQ(flight_dump_rank("nccl-flight-rank-1x"), std::nullopt);
  EXPECT_EQ(flight_dump_rank("rank-1.log"), std::nullopt);
  EXPECT_EQ(flight_dump_rank("nccl-flight-rank-123456789"), std::nullopt);  // more digits than a rank has
}

TEST(FlightRecorderEnv, OffForAContainerJob) {
  // The attempt folder is not mounted into the container: the ranks' dumps and pipes would be
  // inside it, where nothing reads them.
  jobspec::JobSpec spec = spec_of("command: [x]\n");
  spec.container = jobspec::ContainerSpec{};
  spec.container->image = "example/train:1";
  EXPECT_TRUE(fr_vars(worker_env(spec, node2("2.11.0"), {}, 0)).empty());
  const auto plan = flight_recorder(spec, node2("2.11.0"), {});
  EXPECT_TRUE(plan.env.empty());
  EXPECT_NE(plan.why.find("container"), std::string::npos) << plan.why;
  spec.container.reset();
  EXPECT_FALSE(flight_recorder(spec, node2("2.11.0"), {}).env.empty());
}

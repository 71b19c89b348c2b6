#include "contract/contract.hpp"

#include <gtest/gtest.h>

using namespace ddp;
using namespace ddp::contract;

namespace {
jobspec::JobSpec spec_of(const std::string& yaml) {
  return jobspec::parse_job_yaml(yaml, "t.yaml");
}

NodeContext node4() {
  NodeContext n;
  n.job_id = "job-1";
  n.node_name = "vm";
  n.local_world_size = 4;
  n.world_size = 4;
  n.master_port = 29511;
  n.restart_count = 2;
  n.attempt_dir = "/logs/job-1/attempt-2";
  return n;
}
}  // namespace

TEST(Contract, TorchrunVariables) {
  auto spec = spec_of("command: [python3, t.py]\nrestart: {max_restarts: 3}\n");
  auto env = worker_env(spec, node4(), {{"PATH", "/usr/bin"}}, 3);
  EXPECT_EQ(env["RANK"], "3");
  EXPECT_EQ(env["LOCAL_RANK"], "3");
  EXPECT_EQ(env["WORLD_SIZE"], "4");
  EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "4");
  EXPECT_EQ(env["GROUP_RANK"], "0");
  EXPECT_EQ(env["GROUP_WORLD_SIZE"], "1");
  EXPECT_EQ(env["ROLE_NAME"], "default");
  EXPECT_EQ(env["ROLE_RANK"], "3");
  EXPECT_EQ(env["ROLE_WORLD_SIZE"], "4");
  EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
  EXPECT_EQ(env["MASTER_PORT"], "29511");
  EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "2");
  EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "3");
  EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "job-1");
  EXPECT_EQ(env["TORCHELASTIC_USE_AGENT_STORE"], "True");
  EXPECT_EQ(env["TORCHELASTIC_ERROR_FILE"], "/logs/job-1/attempt-2/rank-3.error.json");
  // torchrun 2.x's default, which every worker it starts inherits (found on the H200 against 2.11).
  EXPECT_EQ(env["TORCHELASTIC_SIGNALS_TO_HANDLE"], "SIGTERM,SIGINT,SIGHUP,SIGQUIT");
  EXPECT_EQ(env["DDP_JOB_ID"], "job-1");
  EXPECT_EQ(env["DDP_NODE"], "vm");
  EXPECT_EQ(env["PATH"], "/usr/bin");
  EXPECT_EQ(env.count("DDP_NCCL_UNIQUE_ID"), 0u);
}

TEST(Contract, GlobalRanksFromBase) {
  auto spec = spec_of("command: [x]\n");
  auto n = node4();
  n.node_rank = 1;
  n.nnodes = 2;
  n.rank_base = 4;
  n.world_size = 8;
  auto env = worker_env(spec, n, {}, 2);
  EXPECT_EQ(env["RANK"], "6");
  EXPECT_EQ(env["LOCAL_RANK"], "2");
  EXPECT_EQ(env["GROUP_RANK"], "1");
  EXPECT_EQ(env["GROUP_WORLD_SIZE"], "2");
  EXPECT_EQ(env["WORLD_SIZE"], "8");
}

TEST(Contract, DefaultsAndWhoWins) {
  auto spec = spec_of("command: [x]\n");
  auto env = worker_env(spec, node4(), {}, 0);
  EXPECT_EQ(env["OMP_NUM_THREADS"], "1");
  EXPECT_EQ(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1");  // release not known: both names
  EXPECT_EQ(env["NCCL_ASYNC_ERROR_HANDLING"], "1");
  EXPECT_EQ(env["NCCL_SOCKET_IFNAME"], "lo");
  EXPECT_EQ(env["GLOO_SOCKET_IFNAME"], "lo");

  // inherited values win over our defaults
  env = worker_env(spec, node4(), {{"OMP_NUM_THREADS", "8"}, {"NCCL_SOCKET_IFNAME", "eth0"}}, 0);
  EXPECT_EQ(env["OMP_NUM_THREADS"], "8");
  EXPECT_EQ(env["NCCL_SOCKET_IFNAME"], "eth0");

  // the job's env wins over both
  auto spec2 = spec_of("command: [x]\nenv: {OMP_NUM_THREADS: '4', TORCH_NCCL_ASYNC_ERROR_HANDLING: '0'}\n");
  env = worker_env(spec2, node4(), {{"OMP_NUM_THREADS", "8"}}, 0);
  EXPECT_EQ(env["OMP_NUM_THREADS"], "4");
  EXPECT_EQ(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "0");
}

TEST(Contract, OmpThreadsOnlyWithSeveralRanks) {
  auto spec = spec_of("command: [x]\n");
  auto n = node4();
  n.local_world_size = 1;
  n.world_size = 1;
  EXPECT_EQ(worker_env(spec, n, {}, 0).count("OMP_NUM_THREADS"), 0u);
}

TEST(Contract, NoLoopbackDefaultsOffLocalMode) {
  auto spec = spec_of("command: [x]\n");
  auto n = node4();
  n.local_mode = false;
  auto env = worker_env(spec, n, {}, 0);
  EXPECT_EQ(env.count("NCCL_SOCKET_IFNAME"), 0u);
  EXPECT_EQ(env.count("GLOO_SOCKET_IFNAME"), 0u);
}

TEST(Contract, ScrubsOtherLaunchers) {
  auto spec = spec_of("command: [x]\n");
  Env inherited{{"SLURM_PROCID", "5"},
                {"SLURM_JOB_ID", "77"},
                {"PET_NPROC_PER_NODE", "8"},
                {"RANK", "9"},
                {"LOCAL_RANK", "9"},
                {"NCCL_COMM_ID", "1.2.3.4:5"},
                {"OMPI_COMM_WORLD_RANK", "3"},
                {"PMI_RANK", "2"},
                {"TORCHELASTIC_RUN_ID", "old"},
                {"DDP_NCCL_UNIQUE_ID", "00"},
                {"HOME", "/root"},
                {"NCCL_DEBUG", "INFO"},
                {"MASTER_ADDR", "10.0.0.1"}};
  auto env = worker_env(spec, node4(), inherited, 1);
  for (const char* gone : {"SLURM_PROCID", "SLURM_JOB_ID", "PET_NPROC_PER_NODE", "NCCL_COMM_ID", "OMPI_COMM_WORLD_RANK",
                           "PMI_RANK", "DDP_NCCL_UNIQUE_ID"}) {
    EXPECT_EQ(env.count(gone), 0u) << gone;
  }
  EXPECT_EQ(env["RANK"], "1");
  EXPECT_EQ(env["LOCAL_RANK"], "1");
  EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "job-1");
  EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
  EXPECT_EQ(env["HOME"], "/root");
  EXPECT_EQ(env["NCCL_DEBUG"], "INFO");
}

TEST(Contract, ScrubListIsNotEmptyAndMatchesPrefixes) {
  EXPECT_TRUE(is_scrubbed("SLURM_ANYTHING"));
  EXPECT_TRUE(is_scrubbed("RANK"));
  EXPECT_FALSE(is_scrubbed("RANKING"));
  EXPECT_FALSE(is_scrubbed("PATH"));
  EXPECT_FALSE(is_scrubbed("CUDA_VISIBLE_DEVICES"));
  // An MPI launcher's identity goes; the image's MPI settings stay, as under torchrun.
  EXPECT_TRUE(is_scrubbed("OMPI_COMM_WORLD_RANK"));
  EXPECT_TRUE(is_scrubbed("PMIX_RANK"));
  EXPECT_FALSE(is_scrubbed("OMPI_MCA_btl_vader_single_copy_mechanism"));
  EXPECT_FALSE(is_scrubbed("PMIX_MCA_gds"));
  // mpirun hands each process its rank and job through MCA variables too: those go.
  for (const char* identity : {"OMPI_MCA_ess_base_vpid", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_hnp_uri",
                               "OMPI_MCA_orte_ess_num_procs", "OMPI_MCA_prte_local_rank", "OMPI_MCA_pmix_server_uri"})
    EXPECT_TRUE(is_scrubbed(identity)) << identity;
}

TEST(Contract, ForwardPatterns) {
  std::vector<std::string> p{"PATH", "NCCL_*"};
  EXPECT_TRUE(matches_forward("PATH", p));
  EXPECT_TRUE(matches_forward("NCCL_DEBUG", p));
  EXPECT_FALSE(matches_forward("PATHS", p));
  EXPECT_FALSE(matches_forward("HOME", p));
}

TEST(Contract, NcclIdWhenGiven) {
  auto n = node4();
  n.nccl_unique_id_hex = std::string(256, 'a');
  auto env = worker_env(spec_of("command: [x]\n"), n, {}, 0);
  EXPECT_EQ(env["DDP_NCCL_UNIQUE_ID"], std::string(256, 'a'));
}

// The local launcher plans while its id holder starts, then sets the id: the same plan as one
// made with the id known.
TEST(Contract, NcclIdSetAfterPlanningIsTheSamePlan) {
  const auto spec = spec_of("command: [x]\n");
  auto with = node4();
  with.nccl_unique_id_hex = std::string(256, 'b');
  auto later = make_plan(spec, node4(), {{"PATH", "/bin"}});
  EXPECT_FALSE(later.ranks[0].env.contains("DDP_NCCL_UNIQUE_ID"));
  set_nccl_unique_id(later, std::string(256, 'b'));
  EXPECT_EQ(to_json(later), to_json(make_plan(spec, with, {{"PATH", "/bin"}})));
}

TEST(Contract, PlanHasEveryRank) {
  auto plan = make_plan(spec_of("command: [python3, t.py, --x]\n"), node4(), {});
  ASSERT_EQ(plan.ranks.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(plan.ranks[i].rank, i);
    EXPECT_EQ(plan.ranks[i].argv, (std::vector<std::string>{"python3", "t.py", "--x"}));
    EXPECT_EQ(plan.ranks[i].log_file, "/logs/job-1/attempt-2/rank-" + std::to_string(i) + ".log");
  }
  auto j = to_json(plan);
  EXPECT_EQ(j["ranks"].size(), 4u);
  EXPECT_EQ(j["ranks"][2]["env"]["RANK"], "2");
  EXPECT_EQ(j["ranks"][2]["local_rank"], 2);
  EXPECT_EQ(j["ranks"][2]["node"], "vm");
  EXPECT_TRUE(j["ranks"][2].contains("binding"));
}

TEST(Contract, ShellCommand) {
  auto plan = make_plan(spec_of("command: echo hi && exit 3\n"), node4(), {});
  EXPECT_EQ(plan.ranks[0].argv, (std::vector<std::string>{"/bin/sh", "-c", "echo hi && exit 3"}));
}

TEST(Forwarding, TheAgentKeepsOnlyWhatEnvForwardSelects) {
  // A launcher (or anything holding a key) may send more than the job's env_forward selects.
  const std::map<std::string, std::string> sent{
      {"PATH", "/usr/bin"}, {"NCCL_DEBUG", "INFO"}, {"LD_PRELOAD", "/tmp/evil.so"}, {"NCCLX", "no"}};
  const auto kept = filter_forwarded(sent, {"PATH", "NCCL_*"});
  EXPECT_EQ(kept, (Env{{"PATH", "/usr/bin"}, {"NCCL_DEBUG", "INFO"}}));
}

TEST(Forwarding, LoaderVariablesNeverReachRootsProcesses) {
  for (const char* v : {"LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "LD_ANYTHING", "GCONV_PATH", "GLIBC_TUNABLES",
                        "LOCPATH", "NLSPATH", "HOSTALIASES", "RES_OPTIONS", "TMPDIR", "MALLOC_TRACE"}) {
    EXPECT_TRUE(is_loader_variable(v)) << v;
  }
  for (const char* v : {"PATH", "HOME", "NCCL_DEBUG", "OLD_LD_PRELOAD", "CONTAINERS_CONF"})
    EXPECT_FALSE(is_loader_variable(v)) << v;
  EXPECT_EQ(without_loader_variables({{"PATH", "/bin"}, {"LD_PRELOAD", "x"}, {"GCONV_PATH", "y"}}),
            (Env{{"PATH", "/bin"}}));
}

// ---- NCCL async error handling: the name each PyTorch release reads, and nothing it warns about

TEST(Contract, TorchReleaseParses) {
  EXPECT_EQ(parse_torch_release("2.11.0+cu128"), (TorchRelease{2, 11}));
  EXPECT_EQ(parse_torch_release("1.13.1"), (TorchRelease{1, 13}));
  EXPECT_EQ(parse_torch_release("2.2.0a0+git8f8722e"), (TorchRelease{2, 2}));
  EXPECT_EQ(parse_torch_release("2.2"), (TorchRelease{2, 2}));
  EXPECT_FALSE(parse_torch_release(""));
  EXPECT_FALSE(parse_torch_release("2"));
  EXPECT_FALSE(parse_torch_release("2."));
  EXPECT_FALSE(parse_torch_release("v2.1.0"));
  EXPECT_FALSE(parse_torch_release("99999.1"));  // bounded: no overflow from a hostile string
  EXPECT_TRUE(TorchRelease({2, 1}) < kTorchNccl);
  EXPECT_TRUE(TorchRelease({10, 0}) > kTorchNccl);
}

namespace {
std::vector<std::string> async_names(const Env& env) {
  std::vector<std::string> out;
  for (const auto* n : {"NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING"})
    if (env.count(n)) out.push_back(n + std::string("=") + env.at(n));
  return out;
}
using Names = std::vector<std::string>;
}  // namespace

TEST(Contract, AsyncErrorHandlingNewReleaseGetsOnlyTheTorchName) {
  auto spec = spec_of("command: [x]\n");
  for (const auto* v : {"2.2.0", "2.11.0+cu128", "3.0.0"}) {
    auto n = node4();
    n.torch_version = v;
    EXPECT_EQ(async_names(worker_env(spec, n, {}, 0)), (Names{"TORCH_NCCL_ASYNC_ERROR_HANDLING=1"})) << v;
    EXPECT_EQ(async_error_handling(n.torch_version).names, (Names{"TORCH_NCCL_ASYNC_ERROR_HANDLING"}));
  }
}

TEST(Contract, AsyncErrorHandlingOldReleaseGetsOnlyTheOldName) {
  auto spec = spec_of("command: [x]\n");
  for (const auto* v : {"1.13.1", "2.0.1", "2.1.2+cu121"}) {
    auto n = node4();
    n.torch_version = v;
    EXPECT_EQ(async_names(worker_env(spec, n, {}, 0)), (Names{"NCCL_ASYNC_ERROR_HANDLING=1"})) << v;
  }
}

TEST(Contract, AsyncErrorHandlingUnknownReleaseGetsBothAndSaysWhy) {
  auto spec = spec_of("command: [x]\n");
  auto n = node4();  // no torch_version
  EXPECT_EQ(async_names(worker_env(spec, n, {}, 0)),
            (Names{"NCCL_ASYNC_ERROR_HANDLING=1", "TORCH_NCCL_ASYNC_ERROR_HANDLING=1"}));
  EXPECT_NE(async_error_handling(std::nullopt).why.find("not known"), std::string::npos);
  n.torch_version = "nightly";
  EXPECT_EQ(async_names(worker_env(spec, n, {}, 0)).size(), 2u);
  EXPECT_NE(async_error_handling(n.torch_version).why.find("nightly"), std::string::npos);
}

TEST(Contract, AsyncErrorHandlingTheUsersChoiceStandsAlone) {
  auto n = node4();
  n.torch_version = "1.13.1";
  // The job file chose the new name: we add no old name beside it (it would override on 1.13).
  auto spec = spec_of("command: [x]\nenv: {TORCH_NCCL_ASYNC_ERROR_HANDLING: '3'}\n");
  EXPECT_EQ(async_names(worker_env(spec, n, {}, 0)), (Names{"TORCH_NCCL_ASYNC_ERROR_HANDLING=3"}));
  // Inherited (env_forward): likewise, on a new release the inherited old name stays alone.
  n.torch_version = "2.11.0";
  auto plain = spec_of("command: [x]\n");
  EXPECT_EQ(async_names(worker_env(plain, n, {{"NCCL_ASYNC_ERROR_HANDLING", "0"}}, 0)),
            (Names{"NCCL_ASYNC_ERROR_HANDLING=0"}));
}

// Two lists name the contract's variables for different ends: jobspec's reserved set (what `env:`
// may not set) and the scrub list (what an inherited environment may not bring in). Each variable
// worker_env sets for ddpctl's own reasons must be in both, or a job file (reserved) or a
// surrounding launcher (scrubbed) could give a worker a false identity.
TEST(Contract, EveryVariableTheContractOwnsIsReservedAndScrubbed) {
  auto spec = spec_of("command: [python3, t.py]\nrestart: {max_restarts: 3}\n");
  auto n = node4();
  n.nccl_unique_id_hex = std::string(256, 'a');
  n.node_rank = 1;
  const auto env = worker_env(spec, n, {}, 2);
  const auto& reserved = jobspec::reserved_env();
  for (const auto& name : reserved) {
    EXPECT_TRUE(is_scrubbed(name)) << name << " is reserved but an inherited value would reach workers";
    EXPECT_TRUE(env.contains(name)) << name << " is reserved but worker_env does not set it";
  }
  // What worker_env sets beyond the reserved set is a default the job may change (env: wins),
  // never an identity: none of it may be on the scrub list.
  for (const auto& [name, value] : env) {
    if (reserved.contains(name)) continue;
    EXPECT_FALSE(is_scrubbed(name)) << name << "=" << value << " is set by the contract and scrubbed from the "
                                    << "inherited environment, but a job file may set it: add it to jobspec's "
                                    << "reserved set";
  }
}

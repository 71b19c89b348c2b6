// ddpctl launch's multi-node policy, out of apps/ (issue 23): which nodes, nnodes against them,
// the flags on the spec, paths made absolute, the job id, how the nodes are reached, and every
// refusal with what to do. No I/O: cwd, environment, clock and randomness are injected. Also the
// dry run's view of a rank's environment (contract/dry_run.hpp) and node rank 0's address.
#include "multinode/launch_plan.hpp"
#include "contract/dry_run.hpp"
#include "multinode/reach.hpp"

#include <gtest/gtest.h>

namespace mn = ddp::multinode;

namespace {

ddp::jobspec::JobSpec job(int nnodes = 1) {
  ddp::jobspec::JobSpec s;
  s.file = "job.yaml";
  s.name = "train";
  s.nnodes_min = s.nnodes_max = nnodes;
  s.command = {"python3", "train.py"};
  return s;
}

mn::LaunchContext context() {
  mn::LaunchContext c;
  c.cwd = "/home/ada/proj";
  c.env = {{"USER", "ada"}, {"PATH", "/usr/bin"}};
  c.user = "ada";
  c.local_time.tm_year = 126;
  c.local_time.tm_mon = 11;
  c.local_time.tm_mday = 4;
  c.local_time.tm_hour = 21;
  c.local_time.tm_min = 5;
  c.local_time.tm_sec = 9;
  c.random = 0xbeef;
  return c;
}

mn::LaunchFlags nodes(const std::string& list) {
  mn::LaunchFlags f;
  f.nodes = list;
  return f;
}

std::string refusal(const mn::LaunchFlags& f, const ddp::jobspec::JobSpec& s = job(),
                    const mn::LaunchContext& c = context()) {
  auto out = mn::plan_multi_node(f, s, c);
  EXPECT_FALSE(out.plan.has_value());
  return out.error;
}

}  // namespace

TEST(LaunchPlan, NoNodesIsALocalLaunch) {
  auto out = mn::plan_multi_node({}, job(), context());
  EXPECT_TRUE(out.local());
}

TEST(LaunchPlan, NnodesWithoutNodesSaysWhereToNameThem) {
  auto e = refusal({}, job(4));
  EXPECT_NE(e.find("job.yaml: nnodes 4 needs nodes to run on: pass --nodes (e.g. --nodes node[1-4])"),
            std::string::npos)
      << e;
  mn::LaunchFlags ssh;
  ssh.ssh = true;
  EXPECT_NE(refusal(ssh).find("--ssh needs nodes"), std::string::npos);
}

TEST(LaunchPlan, ExpandsNodesAndTakesNnodesFromThemWhenTheFileHasNone) {
  auto out = mn::plan_multi_node(nodes("n[1-3]"), job(), context());
  ASSERT_TRUE(out.plan) << out.error;
  const auto& o = out.plan->options;
  EXPECT_EQ(o.nodes, (std::vector<std::string>{"n1", "n2", "n3"}));
  EXPECT_EQ(o.spec.nnodes_min, 3);
  EXPECT_EQ(o.spec.nnodes_max, 3);
  EXPECT_EQ(out.plan->reach, mn::Reach::tcp);
  EXPECT_EQ(o.user, "ada");
  EXPECT_EQ(o.launcher_env.at("USER"), "ada");
}

TEST(LaunchPlan, TooFewNodesForNnodes) {
  auto e = refusal(nodes("n1,n2"), job(4));
  EXPECT_EQ(e, "nnodes 4 in job.yaml needs at least 4 nodes, but 2 were given");
  auto s = job(4);
  s.nnodes_min = 3;
  EXPECT_EQ(refusal(nodes("n1"), s), "nnodes 3:4 in job.yaml needs at least 3 nodes, but 1 were given");
  EXPECT_NE(refusal(nodes("n[1-")).find("--nodes 'n[1-':"), std::string::npos);
}

TEST(LaunchPlan, HostsInTheJobFileWhenNoNodesFlag) {
  auto s = job();
  s.hosts = {"a", "b"};
  auto out = mn::plan_multi_node({}, s, context());
  ASSERT_TRUE(out.plan) << out.error;
  EXPECT_EQ(out.plan->options.nodes, (std::vector<std::string>{"a", "b"}));
  auto f = nodes("c");  // --nodes wins
  out = mn::plan_multi_node(f, s, context());
  ASSERT_TRUE(out.plan);
  EXPECT_EQ(out.plan->options.nodes, (std::vector<std::string>{"c"}));
}

TEST(LaunchPlan, FlagsOverrideTheSpecAndPathsBecomeAbsolute) {
  auto f = nodes("n1,n2");
  f.nproc = ddp::jobspec::Nproc{ddp::jobspec::Nproc::Kind::count, 4};
  f.max_restarts = 2;
  f.log_dir = "out/../logs2";
  f.master_port = 0;
  auto s = job();
  s.workdir = "sub/./dir";
  ddp::jobspec::ContainerSpec cs;
  cs.image = "img";
  cs.mounts = {{"data/", "/data", false}, {"/abs/./x", "/x", true}};
  s.container = cs;
  auto out = mn::plan_multi_node(f, s, context());
  ASSERT_TRUE(out.plan) << out.error;
  const auto& spec = out.plan->options.spec;
  EXPECT_EQ(spec.nproc.kind, ddp::jobspec::Nproc::Kind::count);
  EXPECT_EQ(spec.nproc.count, 4);
  EXPECT_EQ(spec.max_restarts, 2);
  EXPECT_EQ(spec.log_dir, "/home/ada/proj/logs2");
  EXPECT_EQ(spec.workdir, "/home/ada/proj/sub/dir");
  EXPECT_EQ(spec.store_port, 0);
  EXPECT_FALSE(spec.store_port_explicit);
  EXPECT_EQ(spec.container->mounts[0].source, "/home/ada/proj/data");
  EXPECT_EQ(spec.container->mounts[1].source, "/abs/./x");  // an absolute one is left as written
  EXPECT_EQ(out.plan->launcher_cwd, "/home/ada/proj");

  f.master_port = 29600;
  out = mn::plan_multi_node(f, job(), context());
  ASSERT_TRUE(out.plan);
  EXPECT_EQ(out.plan->options.spec.store_port, 29600);
  EXPECT_TRUE(out.plan->options.spec.store_port_explicit);
  EXPECT_EQ(out.plan->options.spec.workdir, "/home/ada/proj");  // none in the file: the launcher's
}

TEST(LaunchPlan, JobIdFromNameTimeAndRandomUnlessGiven) {
  auto out = mn::plan_multi_node(nodes("n1"), job(), context());
  ASSERT_TRUE(out.plan);
  EXPECT_EQ(out.plan->options.job_id, "train-20261204-210509-beef");
  auto f = nodes("n1");
  f.job_id = "mine";
  out = mn::plan_multi_node(f, job(), context());
  ASSERT_TRUE(out.plan);
  EXPECT_EQ(out.plan->options.job_id, "mine");
}

TEST(LaunchPlan, RanksFilter) {
  auto f = nodes("n1");
  f.ranks = "0, 3,";
  auto out = mn::plan_multi_node(f, job(), context());
  ASSERT_TRUE(out.plan);
  EXPECT_EQ(out.plan->options.show_ranks, (std::set<int>{0, 3}));
  f.ranks = "1-2,5";  // ranges, as `ddpctl logs --ranks` takes them
  out = mn::plan_multi_node(f, job(), context());
  ASSERT_TRUE(out.plan);
  EXPECT_EQ(out.plan->options.show_ranks, (std::set<int>{1, 2, 5}));
  f.ranks = "0,x";
  EXPECT_EQ(refusal(f), "--ranks: expected rank numbers such as 0,3 or 4-7, got 'x'");
}

TEST(LaunchPlan, SlurmTakesTheAllocationsNodesFromTheEnvironment) {
  mn::LaunchFlags f;
  f.slurm = true;
  f.srun_args = {"--partition=gpu"};
  auto c = context();
  EXPECT_NE(refusal(f, job(), c).find("not inside a SLURM allocation"), std::string::npos);
  c.env["SLURM_JOB_NODELIST"] = "gpu[01-03]";
  auto s = job(2);
  auto out = mn::plan_multi_node(f, s, c);
  ASSERT_TRUE(out.plan) << out.error;
  EXPECT_EQ(out.plan->reach, mn::Reach::slurm);
  EXPECT_EQ(out.plan->options.nodes, (std::vector<std::string>{"gpu01", "gpu02"}));  // nnodes 2: the first two

  auto both = f;
  both.nodes = "n1";
  EXPECT_EQ(refusal(both, s, c), "--slurm takes its nodes from the allocation: drop --nodes");
  both = f;
  both.ssh = true;
  EXPECT_EQ(refusal(both, s, c), "--slurm and --ssh are two ways to reach the nodes: pick one");
  both = f;
  both.detach = true;
  EXPECT_NE(refusal(both, s, c).find("--detach is not supported with --slurm"), std::string::npos);
  mn::LaunchFlags srun_alone = nodes("n1");
  srun_alone.srun_args = {"-p"};
  EXPECT_EQ(refusal(srun_alone), "--srun-arg needs --slurm");
}

TEST(LaunchPlan, FactsAreForDryRunsAndSshDryRunsNeedThem) {
  auto f = nodes("n1");
  f.facts = "a.json";
  EXPECT_NE(refusal(f).find("--facts with --nodes is for --dry-run"), std::string::npos);
  f.facts.clear();
  f.dry_run = true;
  f.ssh = true;
  EXPECT_NE(refusal(f).find("--dry-run with --ssh or --slurm needs --facts"), std::string::npos);
  f.facts = "a.json";
  auto out = mn::plan_multi_node(f, job(), context());
  ASSERT_TRUE(out.plan) << out.error;
  EXPECT_EQ(out.plan->reach, mn::Reach::ssh);
}

TEST(LaunchPlan, DryRunIsPlannedBeforeTheRunsOwnChecks) {
  // --advertise-addr without --ssh is refused for a run; a dry run plans without it.
  auto f = nodes("n1");
  f.advertise_addr = "auto";
  EXPECT_NE(refusal(f).find("--advertise-addr is for --ssh"), std::string::npos);
  f.dry_run = true;
  EXPECT_TRUE(mn::plan_multi_node(f, job(), context()).plan);
}

TEST(LaunchPlan, StandingCoordinator) {
  auto f = nodes("n1,n2");
  f.coordinator = "head:4000";
  auto out = mn::plan_multi_node(f, job(), context());
  ASSERT_TRUE(out.plan) << out.error;
  EXPECT_EQ(out.plan->reach, mn::Reach::standing);
  EXPECT_EQ(out.plan->coordinator_host, "head");
  EXPECT_EQ(out.plan->coordinator_port, 4000);
  f.coordinator = "head";
  out = mn::plan_multi_node(f, job(), context());
  ASSERT_TRUE(out.plan);
  EXPECT_EQ(out.plan->coordinator_port, 29411);
  f.ssh = true;
  EXPECT_NE(refusal(f).find("--coordinator with --ssh"), std::string::npos);
  f.ssh = false;
  f.coordinator = "head:notaport";
  EXPECT_NE(refusal(f).find("--coordinator 'head:notaport':"), std::string::npos);
}

TEST(LaunchPlan, SshRefusesTokenFilesAndPlainTls) {
  auto f = nodes("n1");
  f.ssh = true;
  f.token_file = "/etc/ddpctl/token";
  EXPECT_EQ(refusal(f), "--token-file is not used with --ssh: each run makes its own secret");
  f.token_file.clear();
  f.tls = true;
  EXPECT_NE(refusal(f).find("--tls is not used with --ssh"), std::string::npos);
  f.advertise_addr = ":5000";  // the agents connect back over TCP: TLS fits
  auto out = mn::plan_multi_node(f, job(), context());
  ASSERT_TRUE(out.plan) << out.error;
  ASSERT_TRUE(out.plan->connect_back);
  EXPECT_EQ(out.plan->connect_back->port, 5000);
  EXPECT_TRUE(out.plan->options.tls);
  f.advertise_addr = "host:99999";
  EXPECT_NE(refusal(f).find("--advertise-addr 'host:99999':"), std::string::npos);
}

TEST(DryRunEnv, ShowsWhatDdpctlSetsAndTheJobNamesOnly) {
  auto s = job();
  s.env = {{"MY_SETTING", "on"}, {"HOME", "/job/home"}};
  s.env_forward = {"WANDB_*"};
  const ddp::contract::Env inherited{
      {"AWS_SECRET_ACCESS_KEY", "k"}, {"HOME", "/home/ada"}, {"WANDB_PROJECT", "p"}, {"OMP_NUM_THREADS", "8"}};
  const ddp::contract::Env rank{{"AWS_SECRET_ACCESS_KEY", "k"}, {"HOME", "/job/home"}, {"WANDB_PROJECT", "p"},
                                {"OMP_NUM_THREADS", "8"},       {"MY_SETTING", "on"},  {"RANK", "0"},
                                {"CUDA_VISIBLE_DEVICES", "0"}};
  const auto shown = ddp::contract::shown_env(rank, inherited, s);
  EXPECT_EQ(shown, (ddp::contract::Env{{"HOME", "/job/home"},
                                       {"WANDB_PROJECT", "p"},
                                       {"MY_SETTING", "on"},
                                       {"RANK", "0"},
                                       {"CUDA_VISIBLE_DEVICES", "0"}}));
}

TEST(DryRunAddress, WhatTheRunUses) {
  const ddp::net::NodeEntry n1{"n1", "n1", 29410, ""};
  int lookups = 0;
  auto resolver = [&lookups](mn::Resolved r) {
    return [&lookups, r](const std::string&) {
      ++lookups;
      return r;
    };
  };
  // Live facts: the address the agent was reached at; nothing looked up.
  EXPECT_EQ(mn::master_address(n1, mn::Reach::tcp, std::string("10.0.0.7"), resolver({{"10.9.9.9"}, ""})), "10.0.0.7");
  EXPECT_EQ(lookups, 0);
  // Over TCP, as the coordinator resolves the name when it dials.
  EXPECT_EQ(mn::master_address(n1, mn::Reach::tcp, std::nullopt, resolver({{"10.0.0.8"}, ""})), "10.0.0.8");
  // Several addresses: the run takes the first that answers, so the dry run cannot say which.
  EXPECT_EQ(mn::master_address(n1, mn::Reach::tcp, std::nullopt, resolver({{"10.0.0.8", "fd00::8"}, ""})),
            "<known at run time: the first of 10.0.0.8, fd00::8 (n1 here) that n1's agent answers on>");
  EXPECT_EQ(mn::master_address(n1, mn::Reach::tcp, std::nullopt, resolver({{}, "Name or service not known"})),
            "<known at run time: n1 does not resolve here (Name or service not known); the coordinator gives the "
            "address it reaches n1's agent at>");
  // Over SSH and srun only the run can tell: said so, not guessed, and nothing looked up.
  lookups = 0;
  EXPECT_EQ(mn::master_address(n1, mn::Reach::ssh, std::nullopt, resolver({{"10.0.0.8"}, ""}))
                .rfind("<known at run time: n1's address as its sshd sees the SSH connection", 0),
            0u);
  EXPECT_EQ(mn::master_address(n1, mn::Reach::slurm, std::nullopt, resolver({{"10.0.0.8"}, ""}))
                .rfind("<known at run time: the address n1's agent connects back", 0),
            0u);
  EXPECT_EQ(lookups, 0);
}

TEST(DryRunAddress, LiteralsAreThemselvesAsTheCoordinatorWritesThem) {
  EXPECT_EQ(mn::resolve_here("192.0.2.5").addresses, (std::vector<std::string>{"192.0.2.5"}));
  EXPECT_EQ(mn::resolve_here("::ffff:192.0.2.5").addresses, (std::vector<std::string>{"192.0.2.5"}));
  EXPECT_EQ(mn::resolve_here("fd00::1").addresses, (std::vector<std::string>{"fd00::1"}));
}

// --slurm's pure half: the allocation from SLURM's environment, the nodes a job takes, the
// agents' srun line, and srun's labelled lines.
#include "slurm/slurm.hpp"

#include <gtest/gtest.h>

#include <algorithm>

using namespace ddp::slurm;
using V = std::vector<std::string>;
using Env = std::map<std::string, std::string>;

namespace {
std::string error_of(const Env& env) {
  try {
    allocation_from_env(env);
  } catch (const SlurmError& e) {
    return e.what();
  }
  return "";
}
bool has(const V& argv, const std::string& word) {
  return std::find(argv.begin(), argv.end(), word) != argv.end();
}
}  // namespace

TEST(SlurmAllocation, ExpandsSlurmNodeListSyntax) {
  auto a = allocation_from_env(
      {{"SLURM_JOB_NODELIST", "gpu[01-04,07],cpu3"}, {"SLURM_JOB_ID", "4242"}, {"SLURM_JOB_NUM_NODES", "6"}});
  EXPECT_EQ(a.nodes, (V{"gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu3"}));
  EXPECT_EQ(a.job_id, "4242");
  EXPECT_EQ(allocation_from_env({{"SLURM_JOB_NODELIST", "n[1-2]-ib[0-1]"}}).nodes,
            (V{"n1-ib0", "n1-ib1", "n2-ib0", "n2-ib1"}));
  EXPECT_EQ(allocation_from_env({{"SLURM_JOB_NODELIST", "node[001-003]"}}).nodes, (V{"node001", "node002", "node003"}));
}

TEST(SlurmAllocation, OlderVariableNames) {
  auto a = allocation_from_env({{"SLURM_NODELIST", "a,b"}, {"SLURM_JOBID", "7"}, {"SLURM_NNODES", "2"}});
  EXPECT_EQ(a.nodes, (V{"a", "b"}));
  EXPECT_EQ(a.job_id, "7");
}

TEST(SlurmAllocation, ErrorsSayWhatIsWrong) {
  EXPECT_NE(error_of({}).find("not inside a SLURM allocation"), std::string::npos);
  EXPECT_NE(error_of({{"SLURM_JOB_NODELIST", ""}}).find("not inside a SLURM allocation"), std::string::npos);
  const auto bad = error_of({{"SLURM_JOB_NODELIST", "n[1-"}});
  EXPECT_NE(bad.find("SLURM_JOB_NODELIST 'n[1-'"), std::string::npos) << bad;
  EXPECT_NE(bad.find("column"), std::string::npos) << bad;
  const auto count = error_of({{"SLURM_JOB_NODELIST", "n[1-3]"}, {"SLURM_JOB_NUM_NODES", "4"}});
  EXPECT_NE(count.find("names 3 nodes, but SLURM_JOB_NUM_NODES is '4'"), std::string::npos) << count;
}

TEST(SlurmPickNodes, TheJobsNnodesCapsAndMustFit) {
  Allocation a{"9", {"n1", "n2", "n3", "n4"}};
  EXPECT_EQ(pick_nodes(a, 1, 1, false), a.nodes);         // no nnodes: the whole allocation
  EXPECT_EQ(pick_nodes(a, 2, 2, true), (V{"n1", "n2"}));  // the first ones, in SLURM's order
  EXPECT_EQ(pick_nodes(a, 2, 8, true), a.nodes);          // MIN:MAX takes what there is
  try {
    pick_nodes(a, 6, 6, true);
    FAIL() << "6 nodes from 4";
  } catch (const SlurmError& e) {
    EXPECT_NE(std::string(e.what()).find("needs 6 nodes, but the allocation 9 has 4 (n[1-4])"), std::string::npos)
        << e.what();
  }
}

TEST(SlurmSrunArgv, OneAgentPerNodeWithTheFlagsThatMatter) {
  StepOptions o;
  o.nodes = {"gpu01", "gpu02", "gpu03"};
  o.agent = "/opt/ddpctl/bin/ddp-agentd";
  o.job_name = "ddpctl-train";
  const auto argv = srun_argv(o);
  ASSERT_FALSE(argv.empty());
  EXPECT_EQ(argv[0], "srun");
  for (const char* f : {"--nodes=3", "--ntasks=3", "--ntasks-per-node=1", "--nodelist=gpu[01-03]", "--overlap",
                        "--whole", "--mem=0", "--cpu-bind=none", "--kill-on-bad-exit=1", "--export=ALL", "--input=none",
                        "--label", "--unbuffered", "--mpi=none", "--job-name=ddpctl-train"}) {
    EXPECT_TRUE(has(argv, f)) << f;
  }
  // The agent's command comes last, after every srun flag; it carries no secret, only the
  // variable's name.
  const auto agent = std::find(argv.begin(), argv.end(), o.agent);
  ASSERT_NE(agent, argv.end());
  EXPECT_EQ(V(agent, argv.end()),
            (V{o.agent, "--oneshot", "--listen", "[::]:0", "--secret-env", kSecretEnv, "--announce"}));
  EXPECT_TRUE(std::all_of(argv.begin(), agent, [](const std::string& w) { return w.starts_with("-") || w == "srun"; }));
}

TEST(SlurmSrunArgv, ExtraArgumentsGoBeforeTheAgentAndVerbosePassesOn) {
  StepOptions o;
  o.srun = "/usr/local/bin/srun";
  o.nodes = {"n1"};
  o.agent = "ddp-agentd";
  o.extra = {"--gres=gpu:8", "--partition=big"};
  o.verbose_agent = true;
  const auto argv = srun_argv(o);
  EXPECT_EQ(argv.front(), "/usr/local/bin/srun");
  EXPECT_EQ(argv.back(), "-v");
  const auto gres = std::find(argv.begin(), argv.end(), "--gres=gpu:8");
  const auto agent = std::find(argv.begin(), argv.end(), "ddp-agentd");
  ASSERT_NE(gres, argv.end());
  EXPECT_LT(gres, agent);
  EXPECT_EQ(*(gres + 1), "--partition=big");
}

TEST(SlurmAnnounce, LabelledLinesNameTheTask) {
  EXPECT_EQ(parse_announce("0: " + announce_line(41234)), (Announcement{0, 41234}));
  EXPECT_EQ(parse_announce(" 7: ddp-agentd listening 29410"), (Announcement{7, 29410}));  // srun pads the label
  EXPECT_EQ(parse_announce("12: ddp-agentd listening 1\r"), (Announcement{12, 1}));
  EXPECT_FALSE(parse_announce(announce_line(41234)));  // no label: whose?
  EXPECT_FALSE(parse_announce("0: ddp-agentd listening 0"));
  EXPECT_FALSE(parse_announce("0: ddp-agentd listening 70000"));
  EXPECT_FALSE(parse_announce("0: ddp-agentd listening"));
  EXPECT_FALSE(parse_announce("0: some output"));
  EXPECT_FALSE(parse_announce("x: ddp-agentd listening 5"));
  EXPECT_FALSE(parse_announce("-1: ddp-agentd listening 5"));
}

TEST(SlurmLabel, SplitsAgentLinesFromSrunsOwn) {
  auto a = split_label("3: ddpctl warning [agent] something");
  ASSERT_TRUE(a.task);
  EXPECT_EQ(*a.task, 3);
  EXPECT_EQ(a.text, "ddpctl warning [agent] something");
  auto s = split_label("srun: error: Unable to create step for job 42: Requested node configuration is not available");
  EXPECT_FALSE(s.task);
  EXPECT_EQ(s.text, "srun: error: Unable to create step for job 42: Requested node configuration is not available");
}

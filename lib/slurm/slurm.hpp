// `ddpctl launch --slurm`: the pure half. Inside a SLURM allocation (sbatch, salloc) the nodes
// come from SLURM's environment, and one job step started with srun runs a one-shot ddp-agentd
// on each of them; everything after that is the multi-node launch of `--nodes`.
//
//   SLURM_JOB_NODELIST ─▶ allocation_from_env ─▶ the nodes (node rank order = SLURM's order)
//   srun_argv ─▶ `srun ... ddp-agentd --oneshot --listen [::]:0 --secret-env ... --announce`
//   each agent's stdout, labelled by srun with its task id ─▶ parse_announce ─▶ (task, port)
//
// With --ntasks-per-node=1 the step's task i runs on the step's node i (srun numbers tasks in
// node order), which is how a labelled announcement names its node.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::slurm {

// The environment variable that carries the run's secret from ddpctl through srun to the agents
// (srun's --export=ALL passes srun's environment to every task); never a command-line word.
inline constexpr const char* kSecretEnv = "DDP_AGENT_SECRET";

class SlurmError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Allocation {
  std::string job_id;              // SLURM_JOB_ID
  std::vector<std::string> nodes;  // SLURM_JOB_NODELIST expanded, in SLURM's order
};

// Throws SlurmError saying what is missing or wrong (not inside an allocation, a node list that
// does not parse, a node count that disagrees with SLURM_JOB_NUM_NODES).
Allocation allocation_from_env(const std::map<std::string, std::string>& env);

// The nodes a job uses out of the allocation: its nnodes maximum when the file sets one (the
// first nodes, in SLURM's order), else all of them. Throws SlurmError when the allocation has
// fewer than the job's minimum.
std::vector<std::string> pick_nodes(const Allocation& alloc, int nnodes_min, int nnodes_max, bool nnodes_given);

struct StepOptions {
  std::string srun = "srun";
  std::vector<std::string> nodes;  // where the agents run (one each)
  std::string agent;               // ddp-agentd to run there (a path valid on every node)
  std::string job_name = "ddpctl-agents";
  bool verbose_agent = false;
  std::vector<std::string> extra;  // --srun-arg values, put before the agent's command
};

// The srun command line for the agents' step. Why each flag is there: slurm.cpp.
std::vector<std::string> srun_argv(const StepOptions& options);

// A line of srun's stdout with --label ("3: ddp-agentd listening 41234"), as (task, port);
// nullopt for any other line.
struct Announcement {
  int task = 0;
  std::uint16_t port = 0;
  bool operator==(const Announcement&) const = default;
};
std::optional<Announcement> parse_announce(std::string_view line);

// What a ready agent prints on stdout with --announce (without srun's label).
std::string announce_line(std::uint16_t port);

// A labelled line of srun's stderr split into the task it came from (nullopt: srun's own line)
// and the text.
struct LabelledLine {
  std::optional<int> task;
  std::string text;
};
LabelledLine split_label(std::string_view line);

}  // namespace ddp::slurm

// The pure half of `ddpctl launch --slurm`: the allocation, the agents' srun line, and the lines
// srun gives back. See slurm.hpp.
#include "slurm/slurm.hpp"

#include "common/strings.hpp"
#include "hostlist/hostlist.hpp"

#include <fmt/format.h>

namespace ddp::slurm {

namespace {

const std::string* find(const std::map<std::string, std::string>& env, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (auto it = env.find(n); it != env.end() && !it->second.empty()) return &it->second;
  }
  return nullptr;
}

}  // namespace

Allocation allocation_from_env(const std::map<std::string, std::string>& env) {
  // SLURM_NODELIST and SLURM_JOBID are the older names; sbatch and salloc still set both.
  const auto* list = find(env, {"SLURM_JOB_NODELIST", "SLURM_NODELIST"});
  if (!list) {
    throw SlurmError(
        "--slurm: not inside a SLURM allocation (SLURM_JOB_NODELIST is not set); run it from an sbatch "
        "script or an salloc shell");
  }
  Allocation a;
  if (const auto* id = find(env, {"SLURM_JOB_ID", "SLURM_JOBID"})) a.job_id = *id;
  auto hosts = hostlist::expand(*list);
  if (!hosts.ok())
    throw SlurmError(fmt::format("--slurm: SLURM_JOB_NODELIST '{}': {}", *list, hosts.error->to_string()));
  a.nodes = std::move(hosts.hosts);
  if (const auto* n = find(env, {"SLURM_JOB_NUM_NODES", "SLURM_NNODES"})) {
    const auto count = parse_int(*n);
    if (!count || *count != static_cast<long long>(a.nodes.size())) {
      throw SlurmError(fmt::format("--slurm: SLURM_JOB_NODELIST '{}' names {} nodes, but SLURM_JOB_NUM_NODES is '{}'",
                                   *list, a.nodes.size(), *n));
    }
  }
  return a;
}

std::vector<std::string> pick_nodes(const Allocation& alloc, int nnodes_min, int nnodes_max, bool nnodes_given) {
  const auto have = static_cast<int>(alloc.nodes.size());
  if (!nnodes_given) return alloc.nodes;
  if (have < nnodes_min) {
    throw SlurmError(
        fmt::format("--slurm: the job needs {} nodes{}, but the allocation{} has {} ({}); ask sbatch/salloc "
                    "for more with --nodes",
                    nnodes_min, nnodes_min == nnodes_max ? "" : " at least",
                    alloc.job_id.empty() ? "" : " " + alloc.job_id, have, hostlist::compress(alloc.nodes)));
  }
  return {alloc.nodes.begin(), alloc.nodes.begin() + std::min(have, nnodes_max)};
}

std::vector<std::string> srun_argv(const StepOptions& o) {
  // Flags from srun(1) (https://slurm.schedmd.com/srun.html); each one is here because:
  //  --nodes/--ntasks/--ntasks-per-node=1/--nodelist: one agent on each chosen node, task i on
  //      node i of the list (tasks are numbered in node order).
  //  --overlap (Slurm 20.11+): steps no longer share CPUs by default, so the agents' step would
  //      wait behind a step that holds them (salloc's interactive step); the agents themselves
  //      use almost nothing, their workers are the job.
  //  --whole: the step gets every CPU the allocation has on each node, not one per task, and
  //      --mem=0 all of the job's memory there ("a memory limit of zero for a job step will
  //      restrict the step to the job's memory"); the workers inherit the step's limits. GPUs:
  //      a step gets all of the job's generic resources unless it asks for some.
  //  --cpu-bind=none: no task binding; each agent binds its own workers (binding:).
  //  --kill-on-bad-exit=1: an agent that fails (it could not start, or was killed) ends the
  //      whole step, so srun ends and the launch learns of it at once, instead of waiting out the
  //      join timeout for a node whose task is gone. One-shot agents exit 0 whatever their job
  //      did, so this never fires for a failed job. The price: under --slurm a lost node ends
  //      every node's agent, so nnodes MIN:MAX does not shrink (the allocation would not give
  //      the node back anyway).
  //  --export=ALL: the tasks get srun's environment (whatever SLURM_EXPORT_ENV says), which is
  //      how the run's secret (kSecretEnv) reaches the agents without a command-line word.
  //  --input=none: nobody reads the agents' stdin; --label: "task: " before every output line,
  //      which names the node of an agent's announcement; --unbuffered: lines as they come.
  //  --mpi=none: no PMI set-up for a program that is not MPI.
  std::vector<std::string> argv{o.srun,
                                fmt::format("--nodes={}", o.nodes.size()),
                                fmt::format("--ntasks={}", o.nodes.size()),
                                "--ntasks-per-node=1",
                                "--nodelist=" + hostlist::compress(o.nodes),
                                "--overlap",
                                "--whole",
                                "--mem=0",
                                "--cpu-bind=none",
                                "--kill-on-bad-exit=1",
                                "--export=ALL",
                                "--input=none",
                                "--label",
                                "--unbuffered",
                                "--mpi=none",
                                "--job-name=" + o.job_name};
  argv.insert(argv.end(), o.extra.begin(), o.extra.end());
  argv.insert(argv.end(), {o.agent, "--oneshot", "--listen", "[::]:0", "--secret-env", kSecretEnv, "--announce"});
  if (o.verbose_agent) argv.push_back("-v");
  return argv;
}

std::string announce_line(std::uint16_t port) {
  return fmt::format("ddp-agentd listening {}", port);
}

LabelledLine split_label(std::string_view line) {
  // srun --label right-aligns the task id to the width of the largest one: " 3: text".
  const auto colon = line.find(": ");
  if (colon == std::string_view::npos) return {std::nullopt, std::string(line)};
  const auto id = parse_int(trim(line.substr(0, colon)));
  if (!id || *id < 0 || *id > 1'000'000) return {std::nullopt, std::string(line)};
  return {static_cast<int>(*id), std::string(line.substr(colon + 2))};
}

std::optional<Announcement> parse_announce(std::string_view line) {
  auto l = split_label(line);
  if (!l.task) return std::nullopt;
  constexpr std::string_view prefix = "ddp-agentd listening ";
  std::string_view text = trim(l.text);
  if (!text.starts_with(prefix)) return std::nullopt;
  const auto port = parse_int(text.substr(prefix.size()));
  if (!port || *port < 1 || *port > 65535) return std::nullopt;
  return Announcement{*l.task, static_cast<std::uint16_t>(*port)};
}

}  // namespace ddp::slurm

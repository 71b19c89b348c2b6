// The multi-node launch's policy (see launch_plan.hpp).
#include "multinode/launch_plan.hpp"

#include "common/strings.hpp"
#include "control/paths.hpp"
#include "control/protocol.hpp"
#include "coordinator/standing.hpp"
#include "hostlist/hostlist.hpp"
#include "slurm/slurm.hpp"

#include <fmt/format.h>

#include <filesystem>

namespace ddp::multinode {

namespace {

namespace fs = std::filesystem;

PlanOutcome refuse(std::string why) {
  PlanOutcome out;
  out.error = std::move(why);
  return out;
}

// --slurm: the nodes of the allocation we run in (SLURM_JOB_NODELIST), as a host list.
std::string slurm_node_list(const LaunchFlags& flags, const jobspec::JobSpec& spec,
                            const std::map<std::string, std::string>& env) {
  if (!flags.nodes.empty()) throw slurm::SlurmError("--slurm takes its nodes from the allocation: drop --nodes");
  if (flags.ssh) throw slurm::SlurmError("--slurm and --ssh are two ways to reach the nodes: pick one");
  if (!flags.token_file.empty())
    throw slurm::SlurmError("--token-file is not used with --slurm: each run makes its own secret");
  if (!flags.coordinator.empty())
    throw slurm::SlurmError("--slurm runs the job's coordinator here, inside the allocation: drop --coordinator");
  if (flags.detach)
    throw slurm::SlurmError(
        "--detach is not supported with --slurm yet (the batch script's end ends the allocation anyway)");
  const auto alloc = slurm::allocation_from_env(env);
  const auto nodes = slurm::pick_nodes(alloc, spec.nnodes_min, spec.nnodes_max, spec.nnodes_max > 1);
  return hostlist::compress(nodes);
}

std::string absolute(const fs::path& cwd, const std::string& path) {
  fs::path p(path);
  if (p.is_relative()) p = cwd / p;
  return p.lexically_normal().string();
}

}  // namespace

std::string default_job_id(const std::string& name, const std::tm& tm, std::uint16_t random) {
  return fmt::format("{}-{:04}{:02}{:02}-{:02}{:02}{:02}-{:04x}", name, tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                     tm.tm_hour, tm.tm_min, tm.tm_sec, random);
}

PlanOutcome plan_multi_node(const LaunchFlags& flags, jobspec::JobSpec spec, const LaunchContext& context) {
  std::string list = !flags.nodes.empty() ? flags.nodes : join(spec.hosts, ",");
  if (flags.slurm) {
    try {
      list = slurm_node_list(flags, spec, context.env);
    } catch (const slurm::SlurmError& e) {
      return refuse(e.what());
    }
  } else if (!flags.srun_args.empty()) {
    return refuse("--srun-arg needs --slurm");
  }
  if (list.empty()) {
    if (flags.ssh) {
      return refuse(
          fmt::format("--ssh needs nodes: pass --nodes (e.g. --nodes node[1-2]) or list hosts: in {}", spec.file));
    }
    if (spec.nnodes_max > 1) {
      return refuse(fmt::format(
          "{}: nnodes {} needs nodes to run on: pass --nodes (e.g. --nodes node[1-{}]) or list hosts: in the job "
          "file; each node runs ddp-agentd",
          spec.file, spec.nnodes_max, spec.nnodes_max));
    }
    return {};  // a local launch
  }
  if (!flags.facts.empty() && !flags.dry_run)
    return refuse("--facts with --nodes is for --dry-run (a launch uses each agent's live facts)");
  if (flags.dry_run && flags.facts.empty() && (flags.ssh || flags.slurm)) {
    return refuse(
        "--dry-run with --ssh or --slurm needs --facts: one facts file per node (comma-separated, in --nodes order) or "
        "one for every node, e.g. from `ddpctl doctor --json` on each node (live facts come from standing agents "
        "only)");
  }
  auto hosts = hostlist::expand(list);
  if (!hosts.ok()) return refuse(fmt::format("--nodes '{}': {}", list, hosts.error->to_string()));
  if (spec.nnodes_max > 1 && hosts.hosts.size() < static_cast<std::size_t>(spec.nnodes_min)) {
    return refuse(fmt::format("nnodes {} in {} needs at least {} nodes, but {} were given",
                              spec.nnodes_min == spec.nnodes_max
                                  ? std::to_string(spec.nnodes_max)
                                  : fmt::format("{}:{}", spec.nnodes_min, spec.nnodes_max),
                              spec.file, spec.nnodes_min, hosts.hosts.size()));
  }
  if (spec.nnodes_max == 1 && hosts.hosts.size() > 1) {
    // No nnodes in the file: the host list decides.
    spec.nnodes_min = spec.nnodes_max = static_cast<int>(hosts.hosts.size());
  }
  if (flags.nproc) spec.nproc = *flags.nproc;
  if (flags.max_restarts) spec.max_restarts = *flags.max_restarts;
  if (flags.log_dir) spec.log_dir = *flags.log_dir;
  if (flags.master_port) {
    spec.store_port = static_cast<std::uint16_t>(*flags.master_port);
    spec.store_port_explicit = *flags.master_port != 0;
  }
  // Relative paths mean the launcher's working directory; agents get them absolute.
  const fs::path cwd = context.cwd;
  spec.workdir = absolute(cwd, spec.workdir.value_or(context.cwd));
  spec.log_dir = absolute(cwd, spec.log_dir);
  if (spec.container) {
    for (auto& m : spec.container->mounts) {
      if (fs::path(m.source).is_relative()) m.source = absolute(cwd, m.source);
      if (m.source.size() > 1 && m.source.back() == '/') m.source.pop_back();
    }
  }

  MultiNodePlan plan;
  plan.reach = flags.slurm ? Reach::slurm : flags.ssh ? Reach::ssh : Reach::tcp;
  plan.launcher_cwd = context.cwd;
  auto& opts = plan.options;
  opts.spec = spec;
  opts.nodes = hosts.hosts;
  opts.quiet = flags.quiet;
  opts.tls = flags.tls;
  if (!flags.result_json.empty()) opts.result_json = flags.result_json;
  if (!trim(flags.ranks).empty()) {
    try {
      opts.show_ranks = ddp::control::parse_rank_list(flags.ranks);
    } catch (const ddp::control::ControlError& e) {
      return refuse(e.what());
    }
  }
  opts.user = context.user;
  opts.launcher_env = context.env;
  opts.job_id = flags.job_id.empty() ? default_job_id(spec.name, context.local_time, context.random) : flags.job_id;
  if (flags.dry_run) return {std::move(plan), {}};

  if (!flags.advertise_addr.empty() && !flags.ssh) {
    return refuse(
        "--advertise-addr is for --ssh (agents connecting back); with --nodes the coordinator dials the agents and "
        "nothing connects to it");
  }
  if (!flags.coordinator.empty()) {
    if (flags.ssh)
      return refuse(
          "--coordinator with --ssh: a standing coordinator reaches its agents over TCP (SSH mode starts its own)");
    auto ep = hostlist::parse_endpoint(flags.coordinator);
    if (!ep.ok()) return refuse(fmt::format("--coordinator '{}': {}", flags.coordinator, ep.error->to_string()));
    plan.reach = Reach::standing;
    plan.coordinator_host = ep.endpoint.host;
    plan.coordinator_port = ep.endpoint.port.value_or(coordinator::kStandingPort);
    return {std::move(plan), {}};
  }
  if (flags.ssh) {
    if (!flags.token_file.empty()) return refuse("--token-file is not used with --ssh: each run makes its own secret");
    if (!flags.advertise_addr.empty()) {
      try {
        plan.connect_back = net::parse_advertise_addr(flags.advertise_addr);
      } catch (const std::invalid_argument& e) {
        return refuse(fmt::format("--advertise-addr '{}': {}", flags.advertise_addr, e.what()));
      }
    }
    if (flags.tls && flags.advertise_addr.empty()) {
      return refuse(
          "--tls is not used with --ssh: SSH already encrypts the link to each agent (with --advertise-addr, "
          "where the agents connect back over TCP, it is)");
    }
  }
  return {std::move(plan), {}};
}

}  // namespace ddp::multinode

#include "coordinator/dry_run.hpp"

#include "attempt/bind.hpp"
#include "binding/binding.hpp"
#include "container/container.hpp"
#include "contract/contract.hpp"
#include "contract/dry_run.hpp"
#include "contract/flight_recorder.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace ddp::coordinator {

namespace {

int workers_on(const jobspec::JobSpec& spec, const facts::NodeFacts& f, const std::string& node) {
  switch (spec.nproc.kind) {
    case jobspec::Nproc::Kind::count:
      return spec.nproc.count;
    case jobspec::Nproc::Kind::gpu:
      if (f.gpus.empty())
        throw std::invalid_argument(fmt::format("nproc_per_node: gpu, but {} has no GPU in its facts", node));
      return static_cast<int>(f.gpus.size());
    case jobspec::Nproc::Kind::cpu: {
      std::size_t cpus = 0;
      for (const auto& n : f.numa_nodes) cpus += facts::parse_cpulist(n.cpus).value_or(std::vector<int>{}).size();
      if (cpus == 0) throw std::invalid_argument(fmt::format("nproc_per_node: cpu, but {}'s facts list no CPUs", node));
      return static_cast<int>(cpus);
    }
  }
  return 0;
}

}  // namespace

nlohmann::json dry_run_plan(const jobspec::JobSpec& spec, const std::vector<net::NodeEntry>& nodes,
                            const std::vector<facts::NodeFacts>& facts, const std::string& job_id,
                            const std::map<std::string, std::string>& launcher_env, const std::string& master_addr,
                            bool show_env) {
  if (facts.size() != nodes.size()) {
    throw std::invalid_argument(fmt::format("{} facts for {} nodes", facts.size(), nodes.size()));
  }
  std::vector<int> nproc;
  int world = 0;
  std::vector<std::vector<std::string>> hcas;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    nproc.push_back(workers_on(spec, facts[i], nodes[i].name));
    world += nproc.back();
    hcas.push_back(binding::ib_hcas(facts[i]));
  }
  const auto job_ib_hca = binding::common_ib_hca(hcas);
  contract::Env forwarded;
  for (const auto& [k, v] : launcher_env) {
    if (contract::matches_forward(k, spec.env_forward)) forwarded[k] = v;
  }
  // A container's worker gets only what enters the container (lib/container's policy).
  const contract::Env inherited = spec.container ? container::forwarded_into_container(forwarded, spec) : forwarded;

  contract::DryRun run;
  run.job_id = job_id;
  run.world_size = world;
  run.master_addr = master_addr;
  run.master_port = spec.store_port;
  if (spec.store_port == 0)
    run.master_port = contract::run_time_value("the port node rank 0's agent picks for the store when the job starts");
  if (job_ib_hca) run.nccl_ib_hca = *job_ib_hca;
  run.notes = {
      "the agent sets NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME to the interface that carries "
      "the rendezvous on each node, unless the job sets them",
      "each node adds its own environment; only the launcher's forwarded variables are shown",
      "MASTER_ADDR is node rank 0's address as the coordinator reaches it",
      "log and error files are shown under the agents' default --log-dir, /var/log/ddpctl"};
  if (spec.store_port == 0)
    run.notes.push_back("store.port 0: node rank 0's agent picks MASTER_PORT when the job starts");
  else if (!spec.store_port_explicit)
    run.notes.push_back(fmt::format(
        "MASTER_PORT is {} unless that port is taken on node rank 0's node; then its "
        "agent picks a free one for every rank (a port named in store.port or --master-port is used or the job fails)",
        spec.store_port));
  if (spec.nccl_unique_id != jobspec::NcclUniqueId::off) {
    run.notes.push_back(
        "DDP_NCCL_UNIQUE_ID is made for every attempt by node rank 0's agent when it starts (where "
        "libnccl.so.2 loads there)");
  }
  if (spec.container) {
    run.notes.push_back(
        "container jobs: each agent adds its node's /dev/infiniband devices (not in facts files), "
        "labels ddpctl.owner with its own pid and start time (shown as 0-0), and gives the runtime "
        "client its own environment (only the launcher's forwarded variables are shown)");
  }
  int base = 0;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    contract::NodeContext node;
    node.job_id = job_id;
    node.node_name = nodes[i].name;
    node.node_rank = static_cast<int>(i);
    node.nnodes = static_cast<int>(nodes.size());
    node.local_world_size = nproc[i];
    node.rank_base = base;
    node.world_size = world;
    node.master_addr = master_addr;
    node.master_port = spec.store_port;
    node.local_mode = false;
    // The agent's default --log-dir, in the folder of the job's user (lib/agent: <log_dir>/<user>/<job>).
    const auto user = launcher_env.count("USER") ? launcher_env.at("USER") : std::string("<user>");
    node.attempt_dir = fmt::format("/var/log/ddpctl/{}/{}/attempt-0", user, job_id);
    // The job's PyTorch as the node's facts found it (ddpctl doctor --job FILE --json); the
    // system Python's versions.torch is not the job's and is not used.
    if (facts[i].python) node.torch_version = facts[i].python->torch;
    contract::DryRunNode n;
    n.name = nodes[i].name;
    n.hostname = facts[i].hostname;
    n.node_rank = static_cast<int>(i);
    n.rank_base = base;
    n.python = facts[i].python ? facts::to_json(*facts[i].python) : nlohmann::json(nullptr);
    n.async_error_handling = contract::async_error_handling(node.torch_version);
    auto chosen = contract::scrub(inherited);
    for (const auto& [k, v] : spec.env) chosen[k] = v;
    n.flight_recorder = contract::flight_recorder(spec, node, chosen);
    n.planned_from = inherited;
    auto plan = contract::make_plan(spec, node, inherited);
    if (!spec.binding.all_none()) {
      auto b = binding::plan_binding(facts[i], nproc[i], spec.binding);
      b.nccl_ib_hca = spec.binding.nic == jobspec::NicBinding::none ? std::nullopt : job_ib_hca;
      launch::lay_binding(plan, b);
    }
    if (spec.container) {
      // As the agent wraps its ranks (lib/agent), from what the facts say of the node.
      container::HostLayout host;
      if (facts[i].limits.memlock) host.memlock_hard = facts[i].limits.memlock->hard;
      container::wrap_plan(plan, spec, forwarded, host, 0, container::Owner{}, spec.workdir.value_or("/"));
    }
    n.plan = std::move(plan);
    run.nodes.push_back(std::move(n));
    base += nproc[i];
  }
  return contract::to_json(run, spec, show_env);
}

}  // namespace ddp::coordinator

// The plan of a multi-node launch without starting anything (`ddpctl launch --nodes ... --dry-run
// --facts FILE[,FILE...]`): what every node's workers would get, planned from recorded facts.
//
// Pure: the same rank assignment the rendezvous makes when every listed node joins (node ranks in
// --nodes order, rank bases from each node's own worker count), the same environment contract
// and the same binding an agent lays on its ranks (attempt/bind.hpp), with the job-wide
// NCCL_IB_HCA of every node's IB devices. What only the live node knows is said, not guessed:
// the socket interface (the agent picks the one that carries the rendezvous) and the node's own
// environment (only the launcher's forwarded variables are shown). The JSON has the local dry
// run's shape (contract/dry_run.hpp, proto/dry-run.schema.json).
#pragma once

#include "facts/model.hpp"
#include "jobspec/jobspec.hpp"
#include "net/wire.hpp"

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

namespace ddp::coordinator {

// `facts` has one entry per node, in the nodes' order. `master_addr`: node rank 0's address as
// the run will give it (as the coordinator reaches that node), or contract::run_time_value(why)
// where only the run can know it. show_env: as --show-env. Throws std::invalid_argument when a
// node cannot run the job as planned (nproc_per_node: gpu on a node without GPUs).
nlohmann::json dry_run_plan(const jobspec::JobSpec& spec, const std::vector<net::NodeEntry>& nodes,
                            const std::vector<facts::NodeFacts>& facts, const std::string& job_id,
                            const std::map<std::string, std::string>& launcher_env, const std::string& master_addr,
                            bool show_env = false);

}  // namespace ddp::coordinator

// The edge of a multi-node launch (launch_plan.hpp has its policy): what acts on a plan.
//
// Reaching the nodes: the token file (--nodes, --coordinator), a fresh secret per run and a
// dialer (--ssh, --slurm), our own ddp-agentd to upload or start. The dry run of a plan: every
// node's facts (recorded, --facts, or the agents' live ones) and node rank 0's address as the
// run would use it (the address the coordinator reaches it at, as it resolves here, or said to be
// known at run time only).
#pragma once

#include "coordinator/client.hpp"
#include "multinode/launch_plan.hpp"
#include "net/wire.hpp"

#include <nlohmann/json.hpp>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ddp::multinode {

// Our own ddp-agentd, the one SSH mode uploads and srun starts: beside this program.
std::string own_agent_binary();

// Sets the plan's keys and, for --ssh and --slurm, its dialer. Throws std::runtime_error (a token
// file that cannot be read, our ddp-agentd missing) with what to do.
void prepare_reach(MultiNodePlan& plan, const LaunchFlags& flags);

// Reach::standing: the submission to the standing coordinator. Throws net::TokenError.
coordinator::SubmitOptions submit_options(const MultiNodePlan& plan, const LaunchFlags& flags);

// What a host name resolves to here, in getaddrinfo's order (the order net::dial tries them),
// each once, as the coordinator writes a peer's address; a literal address is itself. No
// addresses: `error` says why.
struct Resolved {
  std::vector<std::string> addresses;
  std::string error;
};
Resolved resolve_here(const std::string& host);

// Node rank 0's address as the run would give it (MASTER_ADDR). `dialed`: the address the dry run
// reached its agent at (live facts); else, over TCP, the one address `first.host` resolves to, as
// the coordinator's dial resolves it; where only the run can tell (SSH, srun, a name with several
// addresses or none here), contract::run_time_value saying why.
std::string master_address(const net::NodeEntry& first, Reach reach, const std::optional<std::string>& dialed,
                           const std::function<Resolved(const std::string&)>& resolve = resolve_here);

struct DryRunResult {
  std::optional<nlohmann::json> plan;  // the dry run's JSON (contract/dry_run.hpp)
  std::vector<std::string> errors;     // else why not, one line each ("n3: cannot reach its agent ...")
};
DryRunResult dry_run(const MultiNodePlan& plan, const LaunchFlags& flags, bool show_env);

}  // namespace ddp::multinode

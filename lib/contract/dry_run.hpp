// The dry run's one JSON shape (`ddpctl launch --dry-run`, local and `--nodes` alike; schema:
// proto/dry-run.schema.json): the job, its nodes, and every rank's command and environment.
//
// Policy: pure. A rank's environment is shown as ddpctl would set it, but only the variables
// ddpctl sets (the contract, its defaults, the binding, a container's) and those the job names
// (`env:`, `env_forward:`); what passes unchanged from the launcher's own environment is left
// out (it holds credentials, and dry runs get pasted into bug reports), counted, and shown with
// --show-env. A value that only the run can know (node rank 0's address over SSH, a store port
// picked when the job starts) is said as such in the value's place ("<known at run time: ...>"),
// never guessed.
#pragma once

#include "contract/contract.hpp"
#include "contract/flight_recorder.hpp"
#include "jobspec/jobspec.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace ddp::contract {

struct DryRunNode {
  std::string name;      // as the launcher names it (--nodes entry; the hostname locally)
  std::string hostname;  // as its facts say
  int node_rank = 0;
  int rank_base = 0;
  nlohmann::json python = nullptr;  // the job's Python there (facts::to_json), null: unknown
  AsyncErrorHandling async_error_handling;
  FlightRecorderPlan flight_recorder;
  Plan plan;
  Env planned_from;  // the environment the plan was made from: what ddpctl inherited or forwards
};

struct DryRun {
  std::string job_id;
  int world_size = 0;
  std::string master_addr;               // an address, or run_time_value(why)
  nlohmann::json master_port = 0;        // a number, or run_time_value(why)
  nlohmann::json nccl_ib_hca = nullptr;  // the job-wide NCCL_IB_HCA, null: none
  std::vector<std::string> notes;
  std::vector<DryRunNode> nodes;
};

// "<known at run time: WHY>": the value in the place of one the dry run cannot know.
std::string run_time_value(std::string_view why);

// The variables of a rank's `env` the dry run shows without --show-env (see above).
Env shown_env(const Env& env, const Env& planned_from, const jobspec::JobSpec& spec);

// show_env: every variable, inherited ones included (--show-env).
nlohmann::json to_json(const DryRun& run, const jobspec::JobSpec& spec, bool show_env);

}  // namespace ddp::contract

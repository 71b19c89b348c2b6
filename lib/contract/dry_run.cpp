// The dry run's JSON (policy in dry_run.hpp).
#include "contract/dry_run.hpp"

#include <fmt/format.h>

#include <set>

namespace ddp::contract {

std::string run_time_value(std::string_view why) {
  return fmt::format("<known at run time: {}>", why);
}

namespace {
bool in_job_env(const jobspec::JobSpec& spec, const std::string& name) {
  for (const auto& kv : spec.env)
    if (kv.first == name) return true;
  return false;
}
}  // namespace

Env shown_env(const Env& env, const Env& planned_from, const jobspec::JobSpec& spec) {
  Env out;
  for (const auto& [k, v] : env) {
    const auto it = planned_from.find(k);
    const bool passed_through = it != planned_from.end() && it->second == v;
    if (!passed_through || in_job_env(spec, k) || matches_forward(k, spec.env_forward)) out.emplace(k, v);
  }
  return out;
}

nlohmann::json to_json(const DryRun& run, const jobspec::JobSpec& spec, bool show_env) {
  nlohmann::json nodes = nlohmann::json::array();
  nlohmann::json ranks = nlohmann::json::array();
  std::set<std::string> left_out_names;
  for (const auto& n : run.nodes) {
    nodes.push_back(
        {{"node", n.name},
         {"node_rank", n.node_rank},
         {"hostname", n.hostname},
         {"rank_base", n.rank_base},
         {"local_world_size", n.plan.ranks.size()},
         {"python", n.python},
         {"async_error_handling", {{"names", n.async_error_handling.names}, {"why", n.async_error_handling.why}}},
         {"flight_recorder", {{"on", !n.flight_recorder.env.empty()}, {"why", n.flight_recorder.why}}}});
    auto planned = contract::to_json(n.plan);  // kept: the loop below walks into it
    for (auto& r : planned["ranks"]) {
      auto env = r["env"].get<Env>();
      if (!show_env) {
        auto shown = shown_env(env, n.planned_from, spec);
        for (const auto& kv : env)
          if (!shown.count(kv.first)) left_out_names.insert(kv.first);
        env = std::move(shown);
      }
      if (run.master_port.is_string() && env.count("MASTER_PORT")) env["MASTER_PORT"] = run.master_port;
      r["env"] = env;
      ranks.push_back(std::move(r));
    }
  }
  nlohmann::json shown{{"all", show_env}, {"left_out", left_out_names.size()}};
  auto notes = run.notes;
  if (!show_env) {
    notes.insert(notes.begin(),
                 left_out_names.empty()
                     ? std::string("env shows the variables ddpctl sets and those the job names (env:, env_forward:)")
                     : fmt::format("env shows the variables ddpctl sets and those the job names (env:, env_forward:); "
                                   "{} more that pass unchanged from ddpctl's own environment are left out (they "
                                   "may hold credentials): --show-env shows them",
                                   left_out_names.size()));
  }
  return {{"job_id", run.job_id},
          {"world_size", run.world_size},
          {"nnodes", run.nodes.size()},
          {"master_addr", run.master_addr},
          {"master_port", run.master_port},
          {"nccl_ib_hca", run.nccl_ib_hca},
          {"env", shown},
          {"notes", notes},
          {"nodes", nodes},
          {"ranks", ranks}};
}

}  // namespace ddp::contract

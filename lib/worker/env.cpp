// Env contract parser (policy in env.hpp).
#include "worker/env.hpp"

#include "common/strings.hpp"
#include "nccl/holder_protocol.hpp"

#include <climits>
#include <cstdlib>
#include <string>
#include <vector>

namespace ddp::worker {
namespace {

class Reader {
 public:
  explicit Reader(const EnvLookup& lookup) : lookup_(lookup) {}

  std::optional<std::string> text(std::string_view name, bool required, const std::string& why_required = {}) {
    auto v = lookup_(name);
    if (v && v->empty()) v.reset();  // "VAR=" is as good as unset, and says so the same way
    if (!v && required) problem(std::string(name) + " is not set" + why_required);
    return v;
  }

  std::optional<int> integer(std::string_view name, bool required, long long min, long long max = INT_MAX) {
    auto v = text(name, required);
    if (!v) return std::nullopt;
    auto n = ddp::parse_int(*v);
    if (!n) {
      problem(std::string(name) + "=" + quote(*v) + " is not a decimal integer");
      return std::nullopt;
    }
    if (*n < min || *n > max) {
      problem(std::string(name) + "=" + *v + " is out of range [" + std::to_string(min) + ", " + std::to_string(max) +
              "]");
      return std::nullopt;
    }
    return static_cast<int>(*n);
  }

  void problem(std::string p) { problems_.push_back(std::move(p)); }
  const std::vector<std::string>& problems() const { return problems_; }

 private:
  static std::string quote(const std::string& v) {
    constexpr std::size_t kShow = 40;  // a garbage value can be long; the start identifies it
    return ddp::shell_quote(v.size() > kShow ? v.substr(0, kShow) + "..." : v);
  }
  const EnvLookup& lookup_;
  std::vector<std::string> problems_;
};

}  // namespace

WorkerEnv parse_worker_env(const EnvLookup& lookup, const EnvOptions& options) {
  Reader r(lookup);
  WorkerEnv env;

  auto rank = r.integer("RANK", true, 0);
  auto world = r.integer("WORLD_SIZE", true, 1);
  auto local_rank = r.integer("LOCAL_RANK", options.require_local, 0);
  auto local_world = r.integer("LOCAL_WORLD_SIZE", options.require_local, 1);
  auto group_rank = r.integer("GROUP_RANK", false, 0);
  auto group_world = r.integer("GROUP_WORLD_SIZE", false, 1);
  auto master_addr = r.text("MASTER_ADDR", options.require_rendezvous);
  auto master_port = r.integer("MASTER_PORT", options.require_rendezvous, 1, 65535);
  auto restarts = r.integer("TORCHELASTIC_RESTART_COUNT", false, 0);
  auto max_restarts = r.integer("TORCHELASTIC_MAX_RESTARTS", false, 0);
  auto id_hex = r.text(nccl::holder::kEnvVar, options.require_nccl_id,
                       " (this program needs an NCCL unique id: set nccl.unique_id: on in the job file)");

  if (rank) env.rank = *rank;
  if (world) env.world_size = *world;
  env.local_rank = local_rank ? *local_rank : (options.require_local ? 0 : env.rank);
  env.local_world_size = local_world ? *local_world : (options.require_local ? 1 : env.world_size);
  if (group_rank) env.group_rank = *group_rank;
  if (group_world) env.group_world_size = *group_world;
  if (master_addr) env.master_addr = *master_addr;
  if (master_port) env.master_port = *master_port;
  if (restarts) env.restart_count = *restarts;
  if (max_restarts) env.max_restarts = *max_restarts;
  env.run_id = r.text("TORCHELASTIC_RUN_ID", false).value_or("");
  env.job_id = r.text("DDP_JOB_ID", false).value_or("");
  env.node_name = r.text("DDP_NODE", false).value_or("");

  if (id_hex) {
    auto id = nccl::unique_id_from_hex(*id_hex);
    if (id) {
      env.nccl_unique_id = *id.value;
    } else {
      r.problem(std::string(nccl::holder::kEnvVar) + ": " + id.error);
    }
  }

  // Cross-checks only between values that parsed, so one bad variable is reported once.
  if (rank && world && *rank >= *world) {
    r.problem("RANK=" + std::to_string(*rank) + " is not below WORLD_SIZE=" + std::to_string(*world));
  }
  if (local_rank && local_world && *local_rank >= *local_world) {
    r.problem("LOCAL_RANK=" + std::to_string(*local_rank) +
              " is not below LOCAL_WORLD_SIZE=" + std::to_string(*local_world));
  }
  if (local_world && world && *local_world > *world) {
    r.problem("LOCAL_WORLD_SIZE=" + std::to_string(*local_world) + " exceeds WORLD_SIZE=" + std::to_string(*world));
  }
  if (group_rank && group_world && *group_rank >= *group_world) {
    r.problem("GROUP_RANK=" + std::to_string(*group_rank) +
              " is not below GROUP_WORLD_SIZE=" + std::to_string(*group_world));
  }

  if (!r.problems().empty()) {
    std::string msg = "the worker environment is not usable (start this program with ddpctl or torchrun):";
    for (const auto& p : r.problems()) msg += "\n  " + p;
    throw EnvError(msg);
  }
  return env;
}

WorkerEnv worker_env_from_process(const EnvOptions& options) {
  return parse_worker_env(
      [](std::string_view name) -> std::optional<std::string> {
        const char* v = std::getenv(std::string(name).c_str());
        return v ? std::optional<std::string>(v) : std::nullopt;
      },
      options);
}

}  // namespace ddp::worker

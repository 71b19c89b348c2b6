#include "contract/contract.hpp"
#include "contract/flight_recorder.hpp"

#include "common/strings.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace ddp::contract {

namespace {
constexpr const char* kNcclUniqueIdVar = "DDP_NCCL_UNIQUE_ID";
}  // namespace

const std::vector<std::string>& scrubbed_variables() {
  // Why each: a worker reading these would take another launcher's or another job's identity.
  static const std::vector<std::string> v{
      // torchrun / torch.distributed contract, set fresh by us
      "RANK",
      "LOCAL_RANK",
      "WORLD_SIZE",
      "LOCAL_WORLD_SIZE",
      "GROUP_RANK",
      "GROUP_WORLD_SIZE",
      "ROLE_NAME",
      "ROLE_RANK",
      "ROLE_WORLD_SIZE",
      "MASTER_ADDR",
      "MASTER_PORT",
      "TORCHELASTIC_*",
      "PET_*",         // torchrun's flag variables (PET_NPROC_PER_NODE, ...)
      "NCCL_COMM_ID",  // would make NCCL bootstrap against a stale root
      "DDP_*",         // ours, from an enclosing ddpctl job
      "SLURM_*",
      "SLURMD_*",  // SLURM's step identity
      "OMPI_*",
      "PMI_*",
      "PMIX_*",
      "MV2_*",
      "MPI_LOCALRANKID",
      "MPI_LOCALNRANKS",  // MPI launchers
      "LOCAL_SIZE",
      "NODE_RANK",
      "GLOBAL_RANK",  // Lightning / DeepSpeed style identities
      "CROSS_RANK",
      "CROSS_SIZE",  // horovod
      "NOTIFY_SOCKET",
      "WATCHDOG_USEC",
      "WATCHDOG_PID",  // systemd's, for the agent's service alone
  };
  return v;
}

static bool matches(const std::string& name, const std::string& pattern) {
  if (!pattern.empty() && pattern.back() == '*')
    return starts_with(name, std::string_view(pattern).substr(0, pattern.size() - 1));
  return name == pattern;
}

bool is_scrubbed(const std::string& name) {
  // MCA parameters are settings, not a launcher's identity: images set them for MPI inside
  // containers (OMPI_MCA_btl_vader_single_copy_mechanism=none, PMIX_MCA_gds=hash), and torchrun
  // passes them on. Except the ones through which Open MPI's launcher hands each process its
  // place in its job (ess: vpid, jobid, number of processes; orte/prte: the launcher's address).
  if (starts_with(name, "OMPI_MCA_") && !starts_with(name, "OMPI_MCA_ess_") && !starts_with(name, "OMPI_MCA_orte_") &&
      !starts_with(name, "OMPI_MCA_prte_") && !starts_with(name, "OMPI_MCA_pmix_"))
    return false;
  if (starts_with(name, "PMIX_MCA_")) return false;
  for (const auto& p : scrubbed_variables()) {
    if (matches(name, p)) return true;
  }
  return false;
}

Env filter_forwarded(const std::map<std::string, std::string>& forwarded, const std::vector<std::string>& patterns) {
  Env out;
  for (const auto& [k, v] : forwarded) {
    if (matches_forward(k, patterns)) out.emplace(k, v);
  }
  return out;
}

bool is_loader_variable(const std::string& name) {
  // glibc's UNSECURE_ENVVARS (sysdeps/generic/unsecvars.h), and every LD_* besides.
  static const char* const kNames[] = {"GCONV_PATH",  "GETCONF_DIR",      "GLIBC_TUNABLES", "HOSTALIASES",
                                       "LOCALDOMAIN", "LOCPATH",          "MALLOC_TRACE",   "NIS_PATH",
                                       "NLSPATH",     "RESOLV_HOST_CONF", "RES_OPTIONS",    "TMPDIR",
                                       "TZDIR",       "MALLOC_CHECK_",    "MALLOC_PERTURB_"};
  if (name.starts_with("LD_")) return true;
  for (const char* n : kNames) {
    if (name == n) return true;
  }
  return false;
}

Env without_loader_variables(const Env& env) {
  Env out;
  for (const auto& [k, v] : env) {
    if (!is_loader_variable(k)) out.emplace(k, v);
  }
  return out;
}

Env scrub(const Env& inherited) {
  Env out;
  for (const auto& [k, v] : inherited) {
    if (!is_scrubbed(k)) out.emplace(k, v);
  }
  return out;
}

bool matches_forward(const std::string& name, const std::vector<std::string>& patterns) {
  for (const auto& p : patterns) {
    if (matches(name, p)) return true;
  }
  return false;
}

std::string rank_log_file(const std::string& attempt_dir, int rank) {
  return fmt::format("{}/rank-{}.log", attempt_dir, rank);
}
std::string rank_error_file(const std::string& attempt_dir, int rank) {
  return fmt::format("{}/rank-{}.error.json", attempt_dir, rank);
}

std::optional<TorchRelease> parse_torch_release(std::string_view v) {
  auto number = [&v]() -> std::optional<int> {
    std::size_t n = 0;
    int out = 0;
    while (n < v.size() && n < 4 && v[n] >= '0' && v[n] <= '9') out = out * 10 + (v[n++] - '0');
    if (n == 0 || (n < v.size() && v[n] >= '0' && v[n] <= '9')) return std::nullopt;
    v.remove_prefix(n);
    return out;
  };
  auto major = number();
  if (!major || v.empty() || v.front() != '.') return std::nullopt;
  v.remove_prefix(1);
  auto minor = number();
  if (!minor) return std::nullopt;
  return TorchRelease{*major, *minor};
}

AsyncErrorHandling async_error_handling(const std::optional<std::string>& torch_version) {
  const auto release = torch_version ? parse_torch_release(*torch_version) : std::nullopt;
  if (!release) {
    return {{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"},
            torch_version ? fmt::format("PyTorch {} is not a release ddpctl can read: both names, which every release "
                                        "understands (2.2 and later warn about the old one)",
                                        *torch_version)
                          : std::string("PyTorch's release is not known on this node: both names, which every release "
                                        "understands (2.2 and later warn about the old one); set python: in the job "
                                        "file if the command is not the interpreter")};
  }
  if (*release >= kTorchNccl)
    return {
        {"TORCH_NCCL_ASYNC_ERROR_HANDLING"},
        fmt::format("PyTorch {} reads TORCH_NCCL_ASYNC_ERROR_HANDLING and warns about the old name", *torch_version)};
  return {{"NCCL_ASYNC_ERROR_HANDLING"},
          fmt::format("PyTorch {} reads only NCCL_ASYNC_ERROR_HANDLING (the TORCH_ name came in 2.2)", *torch_version)};
}

Env worker_env(const jobspec::JobSpec& spec, const NodeContext& node, const Env& inherited, int local_rank) {
  Env env = scrub(inherited);

  // Defaults, which the inherited environment or the job may already have chosen.
  auto set_default = [&env](const std::string& k, const std::string& v) { env.try_emplace(k, v); };
  if (node.local_world_size > 1) set_default("OMP_NUM_THREADS", "1");  // as torchrun: N ranks x all cores thrash
  // A rank writes into a pipe, not a terminal: Python would hold its output in blocks until it
  // exits, and lose it when the rank is killed (torchrun runs a script under `python -u`).
  set_default("PYTHONUNBUFFERED", "1");
  // One name per release (see async_error_handling); none where the user chose already.
  const bool chosen = env.count("TORCH_NCCL_ASYNC_ERROR_HANDLING") || env.count("NCCL_ASYNC_ERROR_HANDLING") ||
                      std::any_of(spec.env.begin(), spec.env.end(), [](const auto& kv) {
                        return kv.first == "TORCH_NCCL_ASYNC_ERROR_HANDLING" || kv.first == "NCCL_ASYNC_ERROR_HANDLING";
                      });
  if (!chosen)
    for (const auto& name : async_error_handling(node.torch_version).names) set_default(name, "1");
  // The NCCL flight recorder (flight_recorder.hpp), unless the job configures it itself.
  Env configured = env;
  for (const auto& [k, v] : spec.env) configured[k] = v;
  for (const auto& [k, v] : flight_recorder(spec, node, configured).env) set_default(k, v);
  if (node.local_mode) {
    set_default("NCCL_SOCKET_IFNAME", "lo");
    set_default("GLOO_SOCKET_IFNAME", "lo");
  }
  for (const auto& [k, v] : spec.env) env[k] = v;  // the job's own choice wins over defaults

  const int rank = node.rank_base + local_rank;
  env["RANK"] = std::to_string(rank);
  env["LOCAL_RANK"] = std::to_string(local_rank);
  env["WORLD_SIZE"] = std::to_string(node.world_size);
  env["LOCAL_WORLD_SIZE"] = std::to_string(node.local_world_size);
  env["GROUP_RANK"] = std::to_string(node.node_rank);
  env["GROUP_WORLD_SIZE"] = std::to_string(node.nnodes);
  env["ROLE_NAME"] = "default";
  env["ROLE_RANK"] = std::to_string(rank);
  env["ROLE_WORLD_SIZE"] = std::to_string(node.world_size);
  env["MASTER_ADDR"] = node.master_addr;
  env["MASTER_PORT"] = std::to_string(node.master_port);
  env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(node.restart_count);
  env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(spec.max_restarts);
  env["TORCHELASTIC_RUN_ID"] = node.job_id;
  env["TORCHELASTIC_USE_AGENT_STORE"] = node.use_agent_store ? "True" : "False";
  env["TORCHELASTIC_ERROR_FILE"] = rank_error_file(node.attempt_dir, rank);
  env["TORCHELASTIC_SIGNALS_TO_HANDLE"] = kSignalsToHandle;
  env["DDP_JOB_ID"] = node.job_id;
  env["DDP_NODE"] = node.node_name;
  env["DDP_NODE_RANK"] = std::to_string(node.node_rank);
  env["DDP_ATTEMPT"] = std::to_string(node.restart_count);
  if (node.nccl_unique_id_hex) env[kNcclUniqueIdVar] = *node.nccl_unique_id_hex;
  return env;
}

void set_nccl_unique_id(Plan& plan, const std::string& hex) {
  for (auto& r : plan.ranks) r.env[kNcclUniqueIdVar] = hex;
}

std::vector<std::string> worker_argv(const jobspec::JobSpec& spec) {
  if (spec.shell) return {"/bin/sh", "-c", spec.command.at(0)};
  return spec.command;
}

Plan make_plan(const jobspec::JobSpec& spec, const NodeContext& node, const Env& inherited) {
  Plan plan;
  plan.job_id = node.job_id;
  plan.world_size = node.world_size;
  const auto argv = worker_argv(spec);
  for (int lr = 0; lr < node.local_world_size; ++lr) {
    RankPlan r;
    r.rank = node.rank_base + lr;
    r.local_rank = lr;
    r.node = node.node_name;
    r.argv = argv;
    r.env = worker_env(spec, node, inherited, lr);
    r.log_file = rank_log_file(node.attempt_dir, r.rank);
    r.error_file = rank_error_file(node.attempt_dir, r.rank);
    plan.ranks.push_back(std::move(r));
  }
  return plan;
}

nlohmann::json to_json(const Plan& plan) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : plan.ranks) {
    nlohmann::json j{{"rank", r.rank},         {"local_rank", r.local_rank}, {"node", r.node},      {"argv", r.argv},
                     {"log_file", r.log_file}, {"error_file", r.error_file}, {"binding", r.binding}};
    if (r.container) {
      // The worker's environment is what it sees inside; the client's is ddpctl's, scrubbed.
      j["env"] = r.container->env;
      j["container"] = {{"runtime", r.container->runtime},
                        {"image", r.container->image},
                        {"name", r.container->name},
                        {"env_file", r.container->env_file}};
    } else {
      j["env"] = r.env;
    }
    ranks.push_back(std::move(j));
  }
  return {{"job_id", plan.job_id}, {"world_size", plan.world_size}, {"ranks", ranks}};
}

}  // namespace ddp::contract

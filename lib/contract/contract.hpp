// The worker environment contract (torchrun-compatible) and the per-rank launch plan.
//
// Pure: inputs are the job spec, what the node knows (NodeContext) and the environment the
// launcher inherited; the output is each rank's argv and complete environment. No I/O.
//
// Precedence, lowest first: the inherited environment (scrubbed of other launchers' variables),
// our defaults (OMP_NUM_THREADS, *_SOCKET_IFNAME, async error handling), the job's `env:`,
// then the contract variables themselves, which nobody overrides (the job file may not set them).
// Async error handling is set under the name the node's PyTorch reads (NodeContext::torch_version),
// and not at all when the inherited environment or the job already set either name: a second
// name would override the user's choice on one release and make the other warn.
#pragma once

#include "jobspec/jobspec.hpp"

#include <nlohmann/json.hpp>

#include <compare>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::contract {

using Env = std::map<std::string, std::string>;

struct NodeContext {
  std::string job_id;
  std::string node_name;
  int node_rank = 0;
  int nnodes = 1;
  int local_world_size = 1;
  int rank_base = 0;  // global rank of this node's local rank 0
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  std::uint16_t master_port = 29500;
  int restart_count = 0;
  bool use_agent_store = true;
  bool local_mode = true;  // single node on loopback: socket interfaces default to lo
  std::optional<std::string> nccl_unique_id_hex;
  std::string attempt_dir;  // <logs>/<job-id>/attempt-<n>
  // The PyTorch release of the job's interpreter on this node ("2.11.0+cu128"), as lib/pyenv
  // found it; nullopt: not known (no probe, no torch, or the probe failed).
  std::optional<std::string> torch_version;
};

// TORCHELASTIC_SIGNALS_TO_HANDLE: the signals on which the launcher stops the job. torchrun
// (2.x's `--signals-to-handle`) sets it in its own environment, so every worker inherits it; its
// default is these four, and ddpctl stops on the same four (SIGUSR1/SIGUSR2 it passes on).
inline constexpr const char* kSignalsToHandle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";

// PyTorch's release as {major, minor} from a version string ("2.2.0a0+git", "1.13.1"); nullopt
// when it does not start with two dotted numbers.
struct TorchRelease {
  int major = 0, minor = 0;
  friend auto operator<=>(const TorchRelease&, const TorchRelease&) = default;
};
std::optional<TorchRelease> parse_torch_release(std::string_view version);

// The first release that reads TORCH_NCCL_ASYNC_ERROR_HANDLING (pytorch#114077, commit 8f8722e,
// in 2.2.0); from then on the old NCCL_ASYNC_ERROR_HANDLING is a deprecated alias that makes
// every process group print "Warning: Environment variable NCCL_ASYNC_ERROR_HANDLING is
// deprecated". Releases before it read only the old name.
inline constexpr TorchRelease kTorchNccl{2, 2};

// The names of NCCL async error handling that ddpctl sets for this release, and why (for the
// dry-run). Unknown release: both, because a release that reads only the old name would
// otherwise hang on an NCCL error where it should stop, while a newer one only prints a warning.
struct AsyncErrorHandling {
  std::vector<std::string> names;
  std::string why;
};
AsyncErrorHandling async_error_handling(const std::optional<std::string>& torch_version);

// Variables of other launchers (or stale ones of ours) that would mislead a worker.
// Exact names, and prefixes written with a trailing '*'.
const std::vector<std::string>& scrubbed_variables();
bool is_scrubbed(const std::string& name);
Env scrub(const Env& inherited);

// Whether `name` matches an env_forward entry (exact, or NAME_* prefix pattern).
bool matches_forward(const std::string& name, const std::vector<std::string>& patterns);
// The launcher's forwarded variables that the job's env_forward selects: an agent applies the
// filter itself rather than trust the launcher to have done it.
Env filter_forwarded(const std::map<std::string, std::string>& forwarded, const std::vector<std::string>& patterns);

// Variables that change what a program loads or trusts: the dynamic loader's LD_*, and the rest
// of glibc's "unsecure" list that ld.so drops for setuid programs (GCONV_PATH, LOCPATH,
// GLIBC_TUNABLES, ...). Never given to a process that runs as root on a job's behalf (the
// container preflight, a container runtime's client); a job's own workers, which run as the
// job's user, still get them.
bool is_loader_variable(const std::string& name);
Env without_loader_variables(const Env& env);

std::string rank_log_file(const std::string& attempt_dir, int rank);
std::string rank_error_file(const std::string& attempt_dir, int rank);

// The complete environment of one worker.
Env worker_env(const jobspec::JobSpec& spec, const NodeContext& node, const Env& inherited, int local_rank);

// A rank that runs inside a container (lib/container): the spawned process is the runtime's
// client, `env` below is the worker's environment inside, written to `env_file` (0600).
struct ContainerRun {
  std::string runtime;
  std::string image;
  std::string name;      // unique per job, attempt and rank; empty where the runtime has no names
  std::string env_file;  // empty where the runtime takes the variables another way (enroot)
  Env env;
};

struct RankPlan {
  int rank = 0;
  int local_rank = 0;
  std::string node;
  std::vector<std::string> argv;
  Env env;
  std::string log_file;
  std::string error_file;
  nlohmann::json binding = nlohmann::json::object();  // lib/binding's plan of this rank, as shown
  std::vector<int> cpus;                              // applied before exec (sched_setaffinity); empty: not bound
  std::optional<int> mem_node;                        // preferred memory node before exec; nullopt: not set
  std::optional<ContainerRun> container;              // set: argv/env above are the runtime client's
};

struct Plan {
  std::string job_id;
  int world_size = 0;
  std::vector<RankPlan> ranks;
};

// argv of the job's command ("/bin/sh -c STRING" when the job gave a string).
std::vector<std::string> worker_argv(const jobspec::JobSpec& spec);

Plan make_plan(const jobspec::JobSpec& spec, const NodeContext& node, const Env& inherited);
// What make_plan gives every rank when node.nccl_unique_id_hex is set, for a plan made before
// the id was known (the local launcher plans while its id holder starts). Not for container
// ranks, whose environment is the runtime client's: they get no id.
void set_nccl_unique_id(Plan& plan, const std::string& hex);
nlohmann::json to_json(const Plan& plan);

}  // namespace ddp::contract

// The job file (train.yaml): its model and its strict parser.
//
// Policy: every problem is a Diagnostic with file, line, column (1-based) and what was
// expected; all problems of a file are collected before failing, so a user fixes them in one
// go. Unknown keys are errors with the nearest known key as a hint; keys of features that are
// not built yet are recognised and refused with "not supported yet", never ignored.
// Relative paths (workdir, logs.dir) are kept as written; the launcher resolves them against
// its own working directory.
#pragma once

#include "common/duration.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::jobspec {

struct Diagnostic {
  std::string file;
  int line = 0;    // 1-based; 0 when the problem has no position (e.g. an unreadable file)
  int column = 0;  // 1-based
  std::string message;

  std::string to_string() const;  // "train.yaml:3:5: error: ..."
};

class JobSpecError : public std::runtime_error {
 public:
  explicit JobSpecError(std::vector<Diagnostic> diagnostics);
  const std::vector<Diagnostic>& diagnostics() const { return diagnostics_; }

 private:
  std::vector<Diagnostic> diagnostics_;
};

// nproc_per_node: an integer, "cpu" (one per CPU the launcher may use) or "gpu" (one per GPU
// that discovery found).
struct Nproc {
  enum class Kind { count, cpu, gpu };
  Kind kind = Kind::count;
  int count = 1;
};

enum class NcclUniqueId { automatic, on, off };

// binding: how each rank is placed on the node (planned by lib/binding from the node's facts).
// `automatic` is the default of each; `none` turns that part off.
enum class GpuBinding { automatic, none, isolate };           // isolate: one visible GPU per rank
enum class NumaBinding { automatic, none, node, exclusive };  // exclusive: split a node's CPUs
enum class NicBinding { automatic, none, rank };              // rank: NCCL_IB_HCA per rank (opt-in)
struct BindingSpec {
  GpuBinding gpu = GpuBinding::automatic;
  NumaBinding numa = NumaBinding::automatic;
  NicBinding nic = NicBinding::automatic;
  bool all_none() const { return gpu == GpuBinding::none && numa == NumaBinding::none && nic == NicBinding::none; }
};

// container: every rank runs inside a container of `image` (lib/container builds the runtime's
// command line). Mount sources and `workdir` inside the container are kept as written.
enum class ContainerRuntime { docker, podman, apptainer, enroot };
enum class PullPolicy { never, missing, always };
struct Mount {
  std::string source;  // on the host; relative: to the launcher's working directory
  std::string target;  // inside the container, absolute
  bool read_only = false;
};
struct ContainerSpec {
  ContainerRuntime runtime = ContainerRuntime::podman;
  std::string image;
  std::vector<Mount> mounts;
  std::optional<std::string> workdir;  // inside; nullopt: the image's own
  PullPolicy pull = PullPolicy::missing;
  std::vector<std::string> extra_args;                   // before the image, as written
  std::vector<std::pair<std::string, std::string>> env;  // inside only, in file order
};
std::string_view runtime_name(ContainerRuntime r);
std::optional<ContainerRuntime> runtime_from_name(std::string_view name);

// hang: the hang watchdog (lib/hang). The job is hung when no rank on any node made progress
// (output, a changing Python stack, CPU time outside torch.distributed) for `timeout`; then every
// rank's stacks are printed and logged, and `action` follows: report (the job goes on; once per
// hang), stop (the job fails: "hung"), restart (the attempt fails, as a rank's failure would).
enum class HangAction { report, stop, restart };
struct HangSpec {
  Millis timeout{600'000};
  HangAction action = HangAction::report;
};
std::string_view hang_action_name(HangAction a);
std::optional<HangAction> hang_action_from_name(std::string_view name);
inline constexpr Millis kMinHangTimeout{2000};  // ranks are sampled once a second at most

// store.threads: auto (the store picks from the CPUs it may use), or 0 to kMaxStoreThreads.
inline constexpr int kAutoThreads = -1;
inline constexpr int kMaxStoreThreads = 64;

struct JobSpec {
  std::string file;  // where it came from, for messages
  std::string name = "job";
  int nnodes_min = 1;
  int nnodes_max = 1;
  Nproc nproc;
  std::vector<std::string> command;  // argv; run directly, no shell
  bool shell = false;                // command was a string: run as /bin/sh -c '<string>'
  // python: the interpreter the command runs, where the command is not one (a shell script,
  // uv run, conda run): a program ("python3", "/venv/bin/python") or the argv of a command that
  // acts as one ([uv, run, python]). Empty: lib/pyenv decides from the command.
  std::vector<std::string> python;
  std::optional<std::string> workdir;
  std::vector<std::pair<std::string, std::string>> env;  // in file order
  std::vector<std::string> env_forward{"PATH", "VIRTUAL_ENV", "PYTHONPATH", "LD_LIBRARY_PATH", "NCCL_*"};
  int max_restarts = 0;
  Millis restart_backoff{1000};
  std::string log_dir = "./logs";
  std::uint64_t log_max_bytes = 100ull << 20;  // per rank file, then rotated once
  std::uint16_t store_port = 29500;
  // store.port or --master-port named a port: a local launch then takes that one or fails. Not
  // named: a local launch prefers 29500 and, when it is taken (another job), picks a free one,
  // as torchrun --standalone does.
  bool store_port_explicit = false;
  int store_threads = kAutoThreads;  // the store's own I/O threads; 0: the launcher's (agent's) loop
  // The store's totals for the whole job (docs/jobfile.md "The job's store": far above what initialisation
  // stores); the other totals (queue items, waiters, connections) are store::Totals' defaults.
  std::uint64_t store_max_bytes = 1ull << 30;  // store.max_size: keys + values + queue items
  std::uint64_t store_max_keys = 1ull << 20;   // store.max_keys
  // store.protocol: the job's PyTorch release ("1.13", "2.1", ...) for the store's clients that
  // send no VALIDATE (1.13–2.1), whose opcodes 7 and 8 differ; "auto": the probed PyTorch.
  std::string store_protocol = "auto";
  NcclUniqueId nccl_unique_id = NcclUniqueId::automatic;
  BindingSpec binding;
  std::optional<ContainerSpec> container;
  Millis stop_grace{30'000};
  std::optional<HangSpec> hang;  // nullopt: no watchdog
  // Multi-node (--nodes / ddp-agentd): the job file's hosts (--nodes wins) and rendezvous timing.
  std::vector<std::string> hosts;
  Millis join_timeout{600'000};
  Millis last_call{5'000};
  Millis heartbeat_timeout{6'000};  // a node silent this long is lost (its agent's heartbeats)
};

// Parses YAML text; `file` names it in diagnostics. Throws JobSpecError.
JobSpec parse_job_yaml(const std::string& text, const std::string& file);
// nproc_per_node's forms: a count from 1 to 4096, "cpu" or "gpu"; nullopt for anything else.
std::optional<Nproc> parse_nproc(std::string_view text);
std::string to_string(const Nproc& n);
// Reads and parses a file. Throws JobSpecError (also for an unreadable file).
JobSpec load_job_file(const std::string& path);

// The variables ddpctl sets for every worker, which `env:` may not name (the value would be a
// lie). contract_test checks this list against what contract::worker_env sets and scrubs.
const std::set<std::string>& reserved_env();

// A job id names folders (<log_dir>/<id>), sockets and containers, and it comes from the command line
// and from the network: [A-Za-z0-9][A-Za-z0-9_.-]*, at most 128 characters (so never '..' or '/').
bool valid_job_id(std::string_view id);
inline constexpr std::string_view kJobIdRule =
    "1-128 letters, digits, '.', '_' or '-', starting with a letter or digit";

// The keys the parser knows at the top level (for hints and docs).
const std::vector<std::string>& known_top_level_keys();

}  // namespace ddp::jobspec

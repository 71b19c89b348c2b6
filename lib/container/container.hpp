// Workers inside containers: each rank's plan turned into its container runtime's command line.
//
// Pure: the job's `container:` spec, a rank's plan (argv, environment, binding) and what the node
// offers (HostLayout, read by the I/O edge in runtime.hpp or taken from a fixture) in; argv and
// file contents out. No I/O, no clock.
//
// Policy, for every runtime:
//  - The worker's environment reaches the container through a 0600 file (docker, podman,
//    apptainer) or by name from the client's environment (enroot's `--env KEY`), never as a
//    value on a command line that `ps` shows to every user.
//  - What the worker sees inside: the contract, ddpctl's defaults, the job's `env:`, the binding's
//    variables, host variables matching `env_forward` (except the four that name host paths:
//    PATH, VIRTUAL_ENV, PYTHONPATH, LD_LIBRARY_PATH, which would break the image), then
//    `container.env`, which wins. The rest of the host's environment stays outside.
//  - The GPUs of CUDA_VISIBLE_DEVICES (binding: UUIDs in local-rank order) are the ones passed
//    through, so `set_device(LOCAL_RANK)` picks the rank's GPU inside as it does outside.
//  - docker and podman: `--rm --init` (a pid 1 that forwards SIGTERM, so the worker gets it),
//    host network and IPC (NCCL's sockets and shared memory), memlock unlimited where the node
//    allows it, the binding's cpuset, every /dev/infiniband device, a unique name and labels
//    naming the job, rank and owning launcher (for teardown and the next launch's sweep).
#pragma once

#include "contract/contract.hpp"
#include "jobspec/jobspec.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddp::container {

using Env = contract::Env;
using jobspec::ContainerRuntime;

// What the node offers a container.
struct HostLayout {
  std::vector<std::string> rdma_devices;      // character devices under /dev/infiniband
  std::optional<std::uint64_t> memlock_hard;  // bytes; nullopt: unlimited
};

// Who owns a job's containers: the launcher's pid and its start time (clock ticks since boot),
// so that a reused pid is never taken for a live owner.
struct Owner {
  long long pid = 0;
  unsigned long long start_time = 0;
  std::string label() const;  // "<pid>-<start time>"
};
std::optional<Owner> parse_owner(std::string_view label);

inline constexpr std::string_view kJobLabel = "ddpctl.job";
inline constexpr std::string_view kRankLabel = "ddpctl.rank";
inline constexpr std::string_view kOwnerLabel = "ddpctl.owner";

// "ddpctl-<job id>-a<attempt>-r<rank>", with characters a runtime refuses in names replaced.
std::string container_name(const std::string& job_id, int attempt, int rank);
// "ddpctl-<job id>-check-<pid>": the preflight's throwaway container (the pid keeps two agents
// on one node apart).
std::string check_container_name(const std::string& job_id, long long pid);

// Why `image` may not reach a runtime's command line: empty, a leading '-' (it would read as an
// option: `--privileged`), whitespace or control characters (no image reference has them);
// nullopt: fine. The builders below throw std::invalid_argument for such an image, and put `--`
// before it where the runtime takes one (image inspect, pull).
std::optional<std::string> image_problem(std::string_view image);

// The part of ddpctl's environment that enters the container (see the policy above): the
// launcher plans a container job's ranks from this instead of everything it inherited.
Env forwarded_into_container(const Env& inherited, const jobspec::JobSpec& spec);

// The env file's text for `runtime`: docker and podman read `KEY=value` lines as they are;
// apptainer evaluates the file as shell, so values are single-quoted there. Throws
// std::invalid_argument for a value with a newline (no env file format can carry it).
std::string env_file_text(ContainerRuntime runtime, const Env& env);

// A container for a user other than root (agent.yaml key_users). The model: the runtime (docker
// or podman) still runs as root, so what the job may ask of it is narrowed to what the user
// could do without it: the container's processes run as the user's uid, gid and groups
// (`--user`, `--group-add`), with every capability dropped (`--cap-drop all`) and no way to gain
// one back (`--security-opt no-new-privileges`: setuid files in the image do nothing); no
// `extra_args` (`--privileged`, `--device`, `--volume`, `--pid host` would be root's power);
// only the GPUs the node gave the job and the node's RDMA devices; and mounts only of paths
// the user can read, checked as the user by the agent before anything runs
// (confinement_problem() is the pure part). apptainer and enroot would run as root in this
// setup: refused.
struct Confinement {
  unsigned uid = 0, gid = 0;
  std::vector<unsigned> groups;  // supplementary groups (the primary one may be among them)
  // Where the ranks' env files go: a folder only root may write. Not beside the rank's log, in
  // the user's attempt folder, where the user could swap the file for a link to a root-only
  // file between its writing and root's runtime reading it into the container.
  std::string env_dir;
};
// Why this container spec cannot run confined; nullopt: it may (its mounts still need checking
// as the user).
std::optional<std::string> confinement_problem(const jobspec::ContainerSpec& spec);
// The flags that confine a docker or podman container (see Confinement).
std::vector<std::string> confinement_flags(const Confinement& c);

// One rank's container run.
struct RankRun {
  std::optional<Confinement> confine;  // a mapped user's job
  std::string name;
  std::string env_file;           // where the launcher writes env_file_text(); unused by enroot
  std::vector<std::string> argv;  // the worker's command, run inside
  Env env;                        // the worker's environment inside
  std::vector<std::string> gpus;  // UUIDs (or indices) of CUDA_VISIBLE_DEVICES, in order
  std::vector<int> cpus;          // the binding's CPUs; empty: unbound
  std::optional<int> mem_node;
  std::string owner_label, job_id;
  int rank = 0;
};

// The runtime client's argv for one rank (argv[0] is the runtime's name, resolved on PATH by
// the spawn). Mount sources must already be absolute.
std::vector<std::string> run_argv(const jobspec::ContainerSpec& spec, const RankRun& run, const HostLayout& host);

// Variables the client itself needs (enroot reads the worker's variables from its own
// environment; its NVIDIA and Mellanox hooks read *_VISIBLE_DEVICES); empty for the others.
Env client_env(const jobspec::ContainerSpec& spec, const RankRun& run, const HostLayout& host);

// Stops and removes the named containers at once (teardown, the watchdog, the sweep); empty for
// runtimes without named containers (apptainer, enroot: their processes are the client's
// children and die with it).
std::vector<std::string> remove_argv(ContainerRuntime runtime, const std::vector<std::string>& names);
// Lists "<name> <owner label>" lines of every container that carries an owner label.
std::vector<std::string> list_owned_argv(ContainerRuntime runtime);
// Prints "<id> <repo digest>" if the image is present locally (exit 0), fails otherwise.
std::vector<std::string> image_identity_argv(ContainerRuntime runtime, const std::string& image);

// An image as one node has it. `digest` is what nodes must agree on: for docker and podman the
// image id, "sha256:" and the digest of the image's config, which names its layers (by content)
// and its settings, so two nodes with the same id run the same bits, however each got the image
// (pulled, loaded, or pulled through another mirror); for apptainer and enroot the sha256 of the
// image file. `repo_digest` (docker and podman) is the registry's manifest digest when the image
// came from one, shown for the user to match against the registry; it is not compared, since one
// image may have several (recompressed layers, a multi-arch list and its entries).
struct ImageIdentity {
  std::string digest;
  std::string repo_digest;
};
// Parses image_identity_argv()'s output; nullopt when it is not an id.
std::optional<ImageIdentity> parse_image_identity(ContainerRuntime runtime, std::string_view out);

// The `command[0]`/`workdir` check, run inside the image: a throwaway container of the job's
// image, with the job's mounts and extra_args (the command may live on a mount), whose shell
// changes to `workdir` (when the job sets one) and resolves `argv0` on the worker's PATH
// (`path`; empty: the image's). Exit 0: both fine; see CommandCheck for the rest.
// docker and podman label it with `owner` (Owner::label()), so that a check whose preflight was
// killed midway is swept like a rank's container.
std::vector<std::string> command_check_argv(const jobspec::ContainerSpec& spec, const std::string& argv0,
                                            const std::string& path, const std::string& name, const std::string& owner,
                                            const std::optional<Confinement>& confine = std::nullopt);
enum class CommandCheck { ok, no_workdir, no_command, no_shell, runtime_error };
// What the check's exit code means: the script exits 3 (workdir) or 4 (command) itself; 126 and
// 127 come from the runtime when the image has no /bin/sh to run it (a distroless image: the
// check cannot run there, which is not the job's fault); anything else is the runtime refusing
// (a bad extra_args, no such image, no permission).
CommandCheck classify_command_check(ContainerRuntime runtime, int exit_code);
std::vector<std::string> pull_argv(ContainerRuntime runtime, const std::string& image);
// Whether the runtime keeps images in a store it can be asked about (docker, podman); apptainer
// and enroot run image files (or pull by URI themselves).
bool has_image_store(ContainerRuntime runtime);

// Rewrites every rank of `plan` (planned from forwarded_into_container(), binding applied) to
// run inside the job's container: argv becomes the runtime client's, env the client's (ddpctl's
// scrubbed environment plus client_env()), and `container` holds the name, the env file and
// the worker's environment inside (the planned one, then `container.env`). Relative mount
// sources are made absolute against `host_cwd`.
void wrap_plan(contract::Plan& plan, const jobspec::JobSpec& spec, const Env& inherited, const HostLayout& host,
               int attempt, const Owner& owner, const std::string& host_cwd,
               const std::optional<Confinement>& confine = std::nullopt);

// The spec with relative mount sources made absolute against `host_cwd` (and no trailing '/').
jobspec::ContainerSpec with_absolute_mounts(jobspec::ContainerSpec spec, const std::string& host_cwd);

// The PATH the worker sees inside (container.env's, else the job's env:), on which its
// command[0] is resolved; empty: the image's own.
std::string worker_path(const jobspec::JobSpec& spec);

// "0-3,8" for {0,1,2,3,8}.
std::string cpu_list(const std::vector<int>& cpus);

}  // namespace ddp::container

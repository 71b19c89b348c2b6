// The I/O edge of containers: what the node offers, the image preflight, env files on disk,
// teardown by name, the sweep by owner label, and the watchdog.
//
// Teardown policy (docker and podman; apptainer's and enroot's processes are the client's own
// children and die with the worker's tree):
//  - A stop signals the runtime client, which passes it to the container (`--sig-proxy`, on by
//    default), whose `--init` passes it to the worker. A podman container's conmon and processes
//    re-parent to the launcher (it is child subreaper), so the group's SIGKILL reaches them too;
//    docker's live under its daemon, out of our reach.
//  - So when an attempt's ranks are gone, or at SIGKILL time, the launcher removes every
//    container of the attempt by name (`rm --force`): nothing of it survives a stop, a failure
//    or a runtime client killed on its own.
//  - A launcher that is itself SIGKILLed cannot do that. The watchdog can: a small process per
//    attempt, forked before the ranks, outside their process group and cgroup and without a
//    parent-death signal, that blocks on a pipe from the launcher. A launcher that ends says
//    "done" first; if the pipe closes without it, the launcher died, and the watchdog execs
//    `rm --force` of the attempt's names.
//  - Should the watchdog die too, the next launch on the node sweeps containers whose owner label
//    names a launcher that no longer runs.
#pragma once

#include "container/container.hpp"

#include <sys/types.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::container {

class ContainerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// The launcher was asked to stop while a runtime command ran (set_interrupt_fd).
class Interrupted : public ContainerError {
 public:
  using ContainerError::ContainerError;
};
// A descriptor that becomes readable when the launcher is asked to stop (its signalfd for Ctrl-C
// and the like), for this thread's run_command() calls: the command it waits for is killed and
// Interrupted thrown. A pull may take half an hour; -1 (the default): none.
void set_interrupt_fd(int fd);

// /dev/infiniband's character devices and this process's hard memlock limit.
HostLayout read_host_layout();
// This process as the owner of the containers it starts.
Owner own_owner();

struct CommandResult {
  int exit_code = -1;    // 128+signal when killed; -1 when it could not run
  std::string out, err;  // each capped at 64 KiB
  bool timed_out = false;
};
// Runs a runtime command to its end (killed after `timeout`), its output captured. `env` is the
// complete environment; argv[0] is resolved on its PATH.
CommandResult run_command(const std::vector<std::string>& argv, const Env& env, std::chrono::milliseconds timeout);

// Before any rank starts: the runtime is installed, and the image is here (pulled per
// `container.pull`: `missing` pulls only when `image inspect` finds none, `always` pulls every
// time, `never` never). Returns what the node has (see ImageIdentity; for apptainer and enroot
// the sha256 of the image file, empty for a URI that the runtime fetches when it runs). Throws
// ContainerError saying what is missing and how to fix it. `may_pull` false only looks
// (`ddpctl doctor`).
ImageIdentity prepare_image(const jobspec::ContainerSpec& spec, const Env& client_env, const std::string& cwd,
                            bool may_pull = true);

// Runs command_check_argv() (see there) in a container named `name`. Throws ContainerError for a
// missing working directory or command (naming them, and the image) or a runtime that refuses;
// returns a warning when the image has no /bin/sh to check with (the job may still be fine).
std::optional<std::string> check_command_in_image(const jobspec::ContainerSpec& spec, const std::string& argv0,
                                                  const std::string& path, const Env& client_env,
                                                  const std::string& name,
                                                  const std::optional<Confinement>& confine = std::nullopt);

// "sha256:<hex>" of a file's contents. Throws ContainerError when it cannot be read.
std::string sha256_of_file(const std::string& path);

// The plan's env files, mode 0600 (created so: never readable by others, not even briefly).
void write_env_files(const contract::Plan& plan, ContainerRuntime runtime);
void remove_env_files(const contract::Plan& plan);

// The names of the plan's containers (empty for runtimes without names).
std::vector<std::string> container_names(const contract::Plan& plan);

// Removes the named containers now (bounded wait); failures are logged, not thrown.
void remove_containers(ContainerRuntime runtime, const std::vector<std::string>& names, const Env& client_env);

// Removes containers whose owner label names a launcher that no longer runs.
void sweep_stale(ContainerRuntime runtime, const Env& client_env);

// See the policy above. Moving transfers the duty; the destructor says "done".
class Watchdog {
 public:
  // nullopt when `remove` is empty (nothing to remove for this runtime). Throws ContainerError.
  static std::optional<Watchdog> start(const std::vector<std::string>& remove, const Env& env);
  Watchdog(Watchdog&& o) noexcept;
  Watchdog& operator=(Watchdog&&) = delete;
  ~Watchdog();
  pid_t pid() const { return pid_; }

 private:
  Watchdog(pid_t pid, int fd) : pid_(pid), fd_(fd) {}
  pid_t pid_ = -1;
  int fd_ = -1;  // write end; the watchdog holds the read end
};

}  // namespace ddp::container

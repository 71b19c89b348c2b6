// Starting workers and finding every process they left behind.
//
// Policy: a worker runs in its own process group (so a terminal's Ctrl-C reaches ddpctl, which
// then stops workers in order), with stdin on /dev/null, stdout/stderr on pipes, every inherited
// signal disposition and mask reset, PR_SET_PDEATHSIG(SIGKILL) as a second belt if ddpctl dies,
// and every descriptor beyond 0-2 closed at exec. Everything the child needs is prepared before
// fork(), so the child only makes async-signal-safe calls. An exec failure is reported back
// through a close-on-exec pipe, so "No such file" or "Permission denied" is known at once.
#pragma once

#include <sys/types.h>

#include <csignal>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::supervisor {

class SpawnError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The user a child runs as (ddp-agentd's per-user tokens): set in the child after it joined its
// cgroup and before it enters the working directory, so that both the directory and the
// program are reached with the user's rights. `groups` are the supplementary groups, looked up
// before fork (initgroups reads /etc/group through NSS, which is not async-signal-safe).
struct RunAs {
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;
};

struct SpawnSpec {
  std::vector<std::string> argv;           // argv[0] is resolved against PATH of `env`
  std::map<std::string, std::string> env;  // the complete environment
  std::string workdir;                     // chdir before exec
  int cgroup_procs_fd = -1;                // if >= 0, the child moves itself into this cgroup
  // The same cgroup's directory: where the kernel can (clone3's CLONE_INTO_CGROUP, Linux 5.7),
  // the child is started inside it instead of moving there (cheaper: no migration), and
  // cgroup_procs_fd is the fallback: set both (with this alone, a child the kernel would not
  // start inside stays where we are).
  int cgroup_dir_fd = -1;
  bool capture_output = true;  // false: inherit ddpctl's stdout/stderr
  bool stdin_pipe = false;     // true: stdin is a pipe (write end returned), else /dev/null
  int stdin_fd = -1;           // if >= 0 (and no stdin_pipe): the child's stdin, e.g. a socket
  // PR_SET_PDEATHSIG(SIGKILL). Off only for a child that must outlive us long enough to clean up
  // after itself (the shepherd, which watches its parent through a pidfd instead).
  bool die_with_parent = true;
  // The signal that death sends: SIGKILL for workers; SIGTERM for a child that must pass it on
  // before it goes (srun, which ends its job step's tasks on SIGTERM).
  int parent_death_signal = SIGKILL;
  bool own_process_group = true;  // false: stay in ddpctl's group (helpers)
  // Placement, applied in the child before exec. Best effort: the planner already limits `cpus`
  // to what the launcher may use, and if the kernel still refuses, the worker runs unbound
  // rather than not at all.
  std::vector<int> cpus;        // sched_setaffinity; empty: inherit
  std::optional<int> mem_node;  // set_mempolicy(MPOL_PREFERRED, node); nullopt: inherit
  std::optional<RunAs> run_as;  // nullopt: our own user
};

struct Spawned {
  pid_t pid = -1;
  int stdout_fd = -1;  // read ends (O_CLOEXEC), owned by the caller; -1 if not captured
  int stderr_fd = -1;
  int stdin_fd = -1;  // write end (O_CLOEXEC) when stdin_pipe
};

// Finds argv0 the way execvp would, using `path_var` (the worker's PATH) and `workdir` for
// relative names with a slash. Returns nullopt if nothing executable is found.
std::optional<std::string> resolve_executable(const std::string& argv0, const std::string& path_var,
                                              const std::string& workdir);

// Why resolve_executable found nothing for `argv0`, and what to do, in one sentence for a user:
// "./train.py is not executable; run it with its interpreter: command: [python3, ./train.py] (or
// chmod +x it)", "train.py is not on PATH; ...", "'trian' is not on PATH (/usr/local/bin, /usr/bin,
// /bin)". `write(argv)` spells a command the way the user gives one (a job file's `command: [...]`
// by default). Reads nothing but stat() (root may call it on a job's paths); PATH is named by
// its first directories, not dumped.
std::string explain_not_runnable(const std::string& argv0, const std::string& path_var, const std::string& workdir,
                                 const std::function<std::string(const std::vector<std::string>&)>& write = {});

// Forks and execs. Throws SpawnError naming the program and the reason on failure.
Spawned spawn(const SpawnSpec& spec);

// The same in two halves, so that N workers are forked back to back and their exec()s overlap
// instead of each waiting for the last: start() forks (throws only if it cannot), finish()
// learns whether exec succeeded (throws SpawnError if not; the child then exits 127).
struct PendingSpawn {
  Spawned spawned;
  int status_fd = -1;  // read end of the exec-report pipe
  std::string program, exe, workdir, user;

  PendingSpawn() = default;
  PendingSpawn(PendingSpawn&& o) noexcept;
  PendingSpawn& operator=(PendingSpawn&&) = delete;
  PendingSpawn(const PendingSpawn&) = delete;
  PendingSpawn& operator=(const PendingSpawn&) = delete;
  ~PendingSpawn();  // closes whatever spawn_finish() did not hand over (the child exits on EPIPE/EOF)
};
PendingSpawn spawn_start(const SpawnSpec& spec);
Spawned spawn_finish(PendingSpawn& pending);

// Whether `user` may access `path` (access(2) with `mode`, e.g. X_OK), checked in a child that
// took the user's ids, so permissions, ACLs and every directory on the way count. Blocks for
// the child (a fork and one system call).
bool accessible_as(const RunAs& user, const std::string& path, int mode);

// All live descendants of `root` (children, grandchildren, ...) by walking /proc. Processes that
// re-parented to `root` as subreaper count. Zombies are included (they still need reaping).
std::vector<pid_t> descendants_of(pid_t root);

// The children of `pid`, every thread's (a child belongs to the thread that forked it, and an
// orphan to the subreaper thread it was given to), from /proc/PID/task/TID/children: one small
// read per thread of `pid`, not one per process of the machine. Empty when `pid` is gone;
// nullopt when it cannot say: the kernel offers no such file (built without
// CONFIG_PROC_CHILDREN), or reading one failed (a security policy, hidepid, no descriptors).
std::optional<std::vector<pid_t>> children_of(pid_t pid);

// Makes this process a child subreaper: orphaned descendants re-parent to it, not to init.
void become_subreaper();

// "SIGTERM" for 15, etc.
std::string signal_name(int sig);

}  // namespace ddp::supervisor

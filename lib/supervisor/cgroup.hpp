// A cgroup v2 per attempt, when one is writable: the one reliable way to find and kill every
// process of a job, including grandchildren that called setsid() and double-forked.
//
// Policy: the cgroup2 mount is found from /proc/self/mountinfo (never a hard-coded path), our
// own cgroup from /proc/self/cgroup; the attempt's cgroup is created beside ddpctl as
// "ddpctl-<launcher pid>-<its start time>-<tag>", so that a reused pid is never taken for the owner. No controllers are
// enabled (we only need membership and cgroup.kill). If anything is missing or read-only the caller falls back to the
// subreaper walk, which works everywhere. Stale cgroups of a launcher that was SIGKILLed are swept by the next launch.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ddp::supervisor {

// Pure parsers, exposed for tests.
std::optional<std::string> cgroup2_mount_from_mountinfo(std::string_view mountinfo);
std::optional<std::string> own_cgroup2_path(std::string_view proc_self_cgroup);
// Field 22 of /proc/<pid>/stat (start time in clock ticks since boot).
std::optional<unsigned long long> start_time_from_stat(std::string_view stat_line);

class Cgroup {
 public:
  // What a cgroup holds, for its log lines: an attempt's workers (the fallback is the subreaper
  // walk), or a helper program run_bounded() runs (the fallback is its process group).
  enum class Use { workers, helper };
  // Creates the cgroup, or returns nullopt with a log line saying why (warning as root).
  static std::optional<Cgroup> create(const std::string& tag, Use use = Use::workers);

  Cgroup(Cgroup&& other) noexcept;
  Cgroup& operator=(Cgroup&&) = delete;
  Cgroup(const Cgroup&) = delete;
  ~Cgroup();  // kills what is left and removes the directory

  const std::string& path() const { return path_; }
  int procs_fd() const { return procs_fd_; }  // a child writes "0" here to join
  int dir_fd() const { return dir_fd_; }      // or is started inside it (SpawnSpec::cgroup_dir_fd)
  std::vector<pid_t> pids() const;
  void signal_all(int sig) const;
  void kill_all() const;  // cgroup.kill where the kernel has it, else SIGKILL to each pid
  bool empty() const { return pids().empty(); }
  // Waits (on cgroup.events, no polling loop) until no process is left, at most `limit`.
  bool wait_unpopulated(std::chrono::milliseconds limit) const;

  // Kills and removes cgroups of launchers that no longer exist.
  static void sweep_stale();

 private:
  Cgroup(std::string path, int procs_fd, int dir_fd) : path_(std::move(path)), procs_fd_(procs_fd), dir_fd_(dir_fd) {}
  std::string path_;
  int procs_fd_ = -1;
  int dir_fd_ = -1;
};

}  // namespace ddp::supervisor

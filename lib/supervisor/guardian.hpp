// An attempt's guardian: a small process that outlives the launcher that started the attempt.
//
// A launcher (ddpctl, or an agent's shepherd) that is SIGKILLed cannot stop its workers. The
// kernel's parent-death signal reaches only its own children (it is cleared in theirs), so a
// rank's data loaders, a `sh -c` command's program or a `uv run` wrapper's Python lived on,
// holding their GPU, until the next launch swept the cgroup (and with no cgroup, for ever).
// The guardian holds one end of a socket pair from the launcher. Without a cgroup the launcher
// tells it each worker's process group as it starts, and forgets one once it is reaped and
// empty (its id may then be another's); when the attempt ends the launcher says so and the
// guardian exits. Reading end-of-file without that, the launcher is gone: the guardian kills
// the attempt's cgroup (cgroup.kill, else each process listed) and every process group it was
// told of, then exits.
//
// What it cannot reach: without a cgroup, a descendant that left its rank's process group
// (setsid).
//
// It can also leave the launcher's last word: a file (the job's end record, so that `ddpctl
// status|logs JOB` still know the job) written after the kills, the time of death filled in.
// A launcher that keeps it past the attempt's end (stand_down) gets the word alone: a launcher
// killed in a restart's backoff leaves its record too.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <optional>
#include <string>

namespace ddp::supervisor {

// A file the guardian leaves in `dir` when the launcher is gone: `before_time`, the time of
// death in milliseconds since the epoch, `after_time`; 0600, written whole or not at all (a
// temporary file renamed), following no link, and never replacing a file of that name.
struct LastWord {
  std::string dir;
  std::string name;
  std::string before_time, after_time;
};

class Guardian {
 public:
  // Forks the guardian, which keeps `cgroup_dir_fd` (-1: none) and watches at most `max_groups`
  // process groups at once; nullopt, with a log line, where it cannot fork. `last_word`: left
  // after the kills (a folder that cannot be opened now: none, with a log line).
  static std::optional<Guardian> start(int cgroup_dir_fd, std::size_t max_groups,
                                       const std::optional<LastWord>& last_word = std::nullopt);

  Guardian(Guardian&& o) noexcept;
  Guardian& operator=(Guardian&&) = delete;
  Guardian(const Guardian&) = delete;
  // Without done(), closing the socket is the launcher going away: the guardian kills.
  ~Guardian();

  void watch_group(pid_t pgid);   // a worker started, leading its own process group
  void forget_group(pid_t pgid);  // it was reaped: its id may be reused
  // The attempt ended and nothing of it runs, but the launcher has not yet written its own
  // record (a restart's backoff, the end report): the guardian forgets its cgroup and groups,
  // and if the launcher is gone before done(), leaves only the last word.
  void stand_down();
  void done();  // the attempt ended and nothing of it runs: the guardian exits
  pid_t pid() const { return pid_; }

 private:
  Guardian(pid_t pid, int fd) : pid_(pid), fd_(fd) {}
  void send(char kind, pid_t value);
  pid_t pid_ = -1;
  int fd_ = -1;
};

}  // namespace ddp::supervisor

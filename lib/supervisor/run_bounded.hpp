// A helper program run to its end within a deadline, its output captured up to a bound
// (supervisor/run_bounded.cpp): the job's Python probed as the user (lib/pyenv), the flight
// recorder's converter (lib/hang). Blocking: for a thread of its own or a short synchronous step.
//
// Policy: the child runs in a process group of its own (spawn()), and in a cgroup of its own
// where one can be made (supervisor/cgroup.hpp: root, cgroup v2). Its stdout and stderr are read
// until both close or the deadline passes, whichever is first, keeping at most the caps (the rest
// is read and dropped, so the child never blocks on a full pipe). Then everything in its cgroup
// and its whole group gets SIGKILL (a wrapper's children too, and with the cgroup a grandchild
// that called setsid() and left the group), the child is reaped and the cgroup removed: nothing
// of it outlives the call. Without a cgroup such a grandchild escapes (docs/security.md).
#pragma once

#include "supervisor/process.hpp"

#include <chrono>
#include <cstddef>
#include <string>

namespace ddp::supervisor {

struct Bounded {
  std::string out, err;        // at most the caps
  int status = -1;             // the exit code; -1 when a signal ended it (our SIGKILL included)
  bool timed_out = false;      // the deadline passed before both pipes closed
  bool out_truncated = false;  // stdout had more than its cap
};

// Throws SpawnError when the child cannot be started (spawn()).
Bounded run_bounded(const SpawnSpec& spec, std::chrono::milliseconds timeout, std::size_t max_out, std::size_t max_err);

}  // namespace ddp::supervisor

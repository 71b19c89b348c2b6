// One process's stacks, read from outside: every thread's Python frames (CPython 3.11/3.12,
// read with process_vm_readv while it runs: the target is never stopped for them) and, when
// asked, every thread's native frames (libdw; each thread stopped briefly by ptrace).
#pragma once

#include "stacks/model.hpp"
#include "stacks/native.hpp"

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <stop_token>

namespace ddp::stacks {

struct ReadOptions {
  bool python = true;
  bool native = false;
  // The Python walk stops at its first frame past the deadline, or once `stop` is asked, and says
  // so in `errors` ("Python frames: truncated: out of time"); its totals (cpython.hpp's
  // WalkLimits) bound it anyway. A native read is bounded by its caller (collect.hpp kills the
  // reader process at the deadline).
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  std::stop_token stop;
};

// Never throws for a process that cannot be read: what failed is in `errors`, with what to do.
ProcessStacks read_process(pid_t pid, const ReadOptions& options = {});

// Field 22 of /proc/PID/stat: when the process started (clock ticks since boot); none when it is
// gone. A pid names another process once its own has ended and been reaped: a caller that took a
// pid while it was surely its process's (an unreaped child) compares this before and after a
// read, and keeps the read only when it is unchanged (collect.hpp, launch/stack_snapshot.hpp).
std::optional<unsigned long long> process_start_time(pid_t pid);

// Adds a native read's frames, errors and stop times to `out` (read_process with native, in two
// steps: collect.hpp reads the native part with other rights).
void add_native(ProcessStacks& out, NativeRead n);

}  // namespace ddp::stacks

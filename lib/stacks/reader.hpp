// One process's stacks, read from outside: every thread's Python frames (CPython 3.11/3.12,
// read with process_vm_readv while it runs: the target is never stopped for them) and, when
// asked, every thread's native frames (libdw; each thread stopped briefly by ptrace).
#pragma once

#include "stacks/model.hpp"
#include "stacks/native.hpp"

#include <sys/types.h>

namespace ddp::stacks {

struct ReadOptions {
  bool python = true;
  bool native = false;
};

// Never throws for a process that cannot be read: what failed is in `errors`, with what to do.
ProcessStacks read_process(pid_t pid, const ReadOptions& options = {});

// Adds a native read's frames, errors and stop times to `out` (read_process with native, in two
// steps: collect.hpp reads the native part with other rights).
void add_native(ProcessStacks& out, NativeRead n);

}  // namespace ddp::stacks

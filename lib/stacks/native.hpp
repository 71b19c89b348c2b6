// Native stacks through elfutils' libdwfl: every thread is ptrace-attached in turn, unwound
// (CFI from .eh_frame/.debug_frame), and detached; symbols are looked up after the detach, so
// the target thread is stopped only while its registers and stack are read. Modules and their
// CFI are loaded before the first attach for the same reason.
//
// Needs the right to ptrace the target: root, or the same uid with Yama's ptrace_scope at 0 (at
// 1, only a parent may; see docs/architecture.md). Built only with libdw (DDP_HAVE_LIBDW);
// without it, read_native says so.
#pragma once

#include "stacks/model.hpp"

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ddp::stacks {

struct NativeRead {
  std::map<int, std::vector<Frame>> threads;  // tid -> frames, innermost first
  std::map<int, bool> truncated;
  std::vector<std::string> errors;
  std::map<int, double> stop_ms;  // tid -> how long it was stopped (attach or interrupt to detach)
  double stop_max_ms = 0, stop_total_ms = 0;
};

struct NativeLimits {
  int max_depth = 256;
  int max_threads = 4096;
};

bool native_available();
NativeRead read_native(pid_t pid, const NativeLimits& limits = {});

// The same read in two steps, so that they can run with different rights (collect.hpp): the
// capture needs ptrace and opens no file of the target's; the unwind opens the target's ELF files
// (libdw) and reads nothing live but the part of a stack beyond the copy. On x86-64 the capture
// stops each thread, copies its registers and the top of its stack, and lets it go; elsewhere it
// takes nothing and the unwind attaches (so it needs the right to ptrace too).
struct NativeCapture {
  NativeCapture();
  ~NativeCapture();
  NativeCapture(NativeCapture&&) noexcept;
  NativeCapture& operator=(NativeCapture&&) noexcept;
  struct Impl;
  std::unique_ptr<Impl> impl;
};
NativeCapture capture_native(pid_t pid, const NativeLimits& limits = {});
NativeRead unwind_native(pid_t pid, NativeCapture capture, const NativeLimits& limits = {});

}  // namespace ddp::stacks

// What a stack read yields: frames, threads, one process; shared by the reader (reader.hpp), the
// Python frame walker (cpython.hpp), the native unwinder (native.hpp) and the merger (merge.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::stacks {

struct Frame {
  enum class Kind { python, native };
  Kind kind = Kind::python;
  std::string function;      // Python: co_qualname; native: the (demangled) symbol, or "??"
  std::string file;          // Python: co_filename; native: the module's file name
  int line = 0;              // Python only (0: unknown)
  std::uint64_t offset = 0;  // native only: pc - symbol start (not part of a frame's identity)

  // Field-wise (offset included); the merger compares places without the offset (merge.cpp).
  bool operator==(const Frame&) const = default;
};

struct ThreadStack {
  int tid = 0;
  std::string name;           // /proc/PID/task/TID/comm
  bool main = false;          // tid == pid
  std::vector<Frame> python;  // innermost first; empty: no Python frame on this thread (or not Python)
  std::vector<Frame> native;  // innermost first; only with --native
  bool truncated = false;     // a limit cut it: its depth, or the whole read's (cpython.hpp)
  double native_stop_ms = 0;  // how long --native kept this thread stopped
};

struct Timing {
  double read_ms = 0;             // the reader's wall time for this process
  double native_stop_max_ms = 0;  // longest any one thread was stopped (ptrace), 0 without --native
  double native_stop_total_ms = 0;
  int memory_reads = 0;  // process_vm_readv calls for the Python walk
};

struct ProcessStacks {
  int pid = 0;
  // "3.11.2": Python frames read; otherwise a sentence on why there are none (not Python, a
  // version whose layout we do not know: only native stacks, ...).
  std::string python;
  bool python_ok = false;
  std::vector<ThreadStack> threads;  // sorted: main thread first, then by tid
  std::vector<std::string> errors;   // what failed, each with what to do
  Timing timing;
};

}  // namespace ddp::stacks

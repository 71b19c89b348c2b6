// CPython's thread and frame structures, read from outside the process: the version-keyed
// layout table, the line-number table decoder, and the walk
//   _PyRuntime.interpreters.head -> interpreter.threads.head -> thread state -> cframe
//   -> current_frame (_PyInterpreterFrame) -> previous -> ...
// for every interpreter and thread. Pure over Memory: synthetic images test it (tests/unit/stacks).
//
// Versions: 3.11 and 3.12 (the offsets below). 3.13+ publishes _Py_DebugOffsets inside
// _PyRuntime and 3.10- keeps PyFrameObject chains: neither is read here, and the reader says so
// (only native stacks) instead of guessing.
#pragma once

#include "stacks/memory.hpp"
#include "stacks/model.hpp"

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace ddp::stacks {

// Byte offsets in a 64-bit build (x86-64 and aarch64 lay these out alike). Every number is
// offsetof()/sizeof() over CPython's own headers of that version; the table in cpython.cpp names
// the header of each, and tests/unit/stacks/offsets_probe.c re-derives them from installed
// headers (a unit test compares the table against Debian's python3.11-dev).
struct PyLayout {
  int major = 0, minor = 0;
  // pycore_runtime.h: _PyRuntimeState
  std::uint64_t runtime_interpreters_head = 0;
  // pycore_interp.h: struct _is (PyInterpreterState)
  std::uint64_t interp_next = 0, interp_threads_head = 0;
  // cpython/pystate.h: struct _ts (PyThreadState)
  std::uint64_t tstate_next = 0, tstate_thread_id = 0, tstate_native_thread_id = 0, tstate_cframe = 0;
  // cpython/pystate.h: _PyCFrame
  std::uint64_t cframe_current_frame = 0;
  // pycore_frame.h: _PyInterpreterFrame
  std::uint64_t frame_code = 0, frame_previous = 0, frame_prev_instr = 0, frame_owner = 0;
  int owner_generator = 1;
  int owner_cstack = -1;  // 3.12's shim frames (FRAME_OWNED_BY_CSTACK): not Python code
  // cpython/code.h: PyCodeObject
  std::uint64_t code_filename = 0, code_name = 0, code_qualname = 0, code_firstlineno = 0, code_linetable = 0,
                code_firsttraceable = 0, code_adaptive = 0;
  // cpython/bytesobject.h, cpython/unicodeobject.h
  std::uint64_t bytes_size = 16, bytes_sval = 32;
  std::uint64_t unicode_length = 16, unicode_state = 32, unicode_ascii_size = 0, unicode_compact_size = 0;
};

// The layout for a PY_VERSION_HEX (Py_Version), or nullopt for a version we do not know.
std::optional<PyLayout> layout_for(std::uint32_t py_version_hex);
// "3.11.2" from PY_VERSION_HEX.
std::string format_version(std::uint32_t py_version_hex);

// PyCode_Addr2Line for 3.11/3.12's location table (Objects/locations.md): the line of the code
// unit at byte offset `addr`; -1 where the table says "no line"; first_line when addr < 0.
int addr_to_line(std::span<const std::uint8_t> linetable, int first_line, int addr);

struct PyThread {
  std::uint64_t thread_id = 0;  // pthread_t
  int native_tid = 0;
  std::vector<Frame> frames;  // innermost first
  bool truncated = false;
};

// Per string, per thread, and for the whole walk. The totals are what bound one read: the
// per-thread and per-string limits alone let a process whose thread and frame lists loop, every
// frame naming one code object with 4096-character names, make the reader hold 4096 threads x
// 512 frames x 32 KiB of names (64 GiB). A real training process has a few hundred frames
// (bench/stacks' target: 293 in 10 threads) of a few hundred bytes of names each, so the totals
// cut only a loop or a forgery. Root reads with these defaults (reader.cpp).
struct WalkLimits {
  int max_interpreters = 64;
  int max_threads = 4096;
  int max_depth = 512;                         // frames of one thread
  int max_frames = 4096;                       // frames read in all, kept or not (each may add a code object)
  std::size_t max_string = 4096;               // characters of a file or function name
  std::size_t max_string_bytes = 4u << 20;     // names read (once per code object) and copied into frames
  std::size_t max_linetable = 1 << 20;         // bytes of one code object's line table
  std::size_t max_linetable_bytes = 4u << 20;  // every code object's line table together
  // Line-table bytes looked through for the frames' lines, all frames together: a lookup decodes
  // its table from the start, so 4096 frames of one code object with a 1 MiB table took 5 s of
  // CPU. 64 MiB is about 80 ms; a real stack looks through a few MiB at most.
  std::size_t max_linetable_scan = 64u << 20;
  // Asked once per thread and once per frame: true ends the walk where it is (a deadline passed,
  // the caller gave up). Empty: never.
  std::function<bool()> out_of_time;
};

struct PyWalk {
  std::vector<PyThread> threads;
  // Non-empty: the walk stopped early (threads holds what was read). "truncated: ..." when a
  // limit above or the time ran out: walking again would only reach it again.
  std::string error;
  bool limit_reached = false;
};

// Thread states are walked from the oldest (the main thread: CPython adds a new thread at the
// head of the list) to the newest, so a walk cut short keeps the main thread's stack and leaves
// out the newest threads; `threads` is in the list's order all the same.
PyWalk walk_python(Memory& mem, std::uint64_t runtime_addr, const PyLayout& layout, const WalkLimits& limits = {});

}  // namespace ddp::stacks

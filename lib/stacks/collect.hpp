// Reading the stacks of many processes within a time budget, with the rights each part needs.
//
// Python frames are read in-process (process_vm_readv: every value read is hostile data, no file
// of the target's is opened). A native read is privilege-separated: libdw parses the ELF and
// DWARF of every file the target has mapped, files its user can write, so a root caller never
// parses them itself. It starts a reader process (this binary again, `kReaderArg`: a fresh
// image, none of the caller's memory or descriptors) that
//   1. as the caller (root): reads the Python frames and, with ptrace, copies each thread's
//      registers and the top of its stack (native.hpp's capture; no file of the target's opened),
//      each only while the pid is still the process asked for (Target's start time);
//   2. drops to the job's user for good (setgroups, setresgid, setresuid, PR_SET_NO_NEW_PRIVS);
//   3. only then lets libdw open the target's files and unwind from the copies;
//   4. writes one JSON object (to_json(ProcessStacks)) to its stdout, a pipe.
// The caller reads at most `max_reply_bytes`, parses the reply as hostile input
// (process_from_json), and kills the reader at the deadline: a reader that hangs or babbles costs
// a "not read" entry, nothing more. Readers run in parallel, a few at a time.
//
// Every main() of a binary that calls collect() with native reads starts with
// run_reader_if_asked(), which turns the process into the reader when argv[1] is kReaderArg.
#pragma once

#include "stacks/model.hpp"

#include <nlohmann/json.hpp>

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace ddp::stacks {

inline constexpr const char* kReaderArg = "__ddp-stacks-reader";

struct Credentials {
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;
};

struct CollectOptions {
  bool native = false;
  std::chrono::milliseconds budget{10'000};  // for all of them together
  // The user a native reader drops to; nullopt: each target's real uid and gid (/proc/PID/status),
  // no supplementary groups. Ignored when the caller is not root (it has nothing to drop).
  std::optional<Credentials> as;
  // The reader's argv before "--pid ...": this binary again, as the reader.
  std::vector<std::string> reader{"/proc/self/exe", kReaderArg};
  int parallel = 8;                         // native readers at once
  std::size_t max_reply_bytes = 32u << 20;  // 4096 threads of 256 frames fit
};

// A process to read. `start_time`: its start time (reader.hpp's process_start_time), taken while
// its pid was surely its own (an unreaped child of the caller's). A pid is only a number: once its
// process ends and is reaped, it may name another process, another user's, which root would read
// and hand to whoever asked. With a start time the read is kept only if the pid still has it
// afterwards, and a native reader checks it again before its root read and before it stops any
// thread. None: the pid is read as it is (`ddpctl stacks --pid`, whose user names the processes).
struct Target {
  pid_t pid = 0;
  std::optional<unsigned long long> start_time;
};

// Whether `t.pid` is still the process it was (its start time unchanged; true without one).
bool same_process(const Target& t);

// One entry per target, in order. Never throws for a process that cannot be read: what failed (no
// right, gone, the deadline, a broken reply) is in its `errors`; a target whose process ended
// before or during its read says so, and nothing read from its pid is kept.
std::vector<ProcessStacks> collect(const std::vector<Target>& targets, const CollectOptions& options = {});

// The reader's side: nullopt unless argv[1] is kReaderArg; else the exit code.
std::optional<int> run_reader_if_asked(int argc, char** argv);

// Cuts `p` until to_json(p) is at most `max_bytes` long (a protocol frame): native frames go
// first, then every thread but the main one, then the main thread's outer frames; each cut is said
// in `errors`.
void shrink_to_fit(ProcessStacks& p, std::size_t max_bytes);

// A ProcessStacks from to_json(ProcessStacks)'s shape, checked field by field with bounds
// (threads, frames, string lengths, nesting): nullopt and `error` when anything is off.
std::optional<ProcessStacks> process_from_json(const nlohmann::json& j, std::string& error);
// The same from text: also bounded in nesting as it is parsed (common/json_parse.hpp).
std::optional<ProcessStacks> process_from_text(const std::string& text, std::string& error);

}  // namespace ddp::stacks

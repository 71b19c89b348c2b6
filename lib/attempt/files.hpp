// The attempt report's edge: what it reads (a rank's error file, a rank's stacks and start time
// from /proc) and what it writes (stacks.txt and stacks.json, --result-json). The pure report is
// report.hpp and failure_stacks.hpp.
#pragma once

#include "attempt/failure_stacks.hpp"
#include "attempt/report.hpp"
#include "common/safe_fs.hpp"

#include <nlohmann/json.hpp>

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <stop_token>
#include <string>

namespace ddp::launch {

// A rank's TORCHELASTIC_ERROR_FILE, `name` in the attempt's folder: read only if it is a regular
// file (not a link) of `owner_uid` (the job's user), at most kMaxErrorFileBytes; one that is not
// is named in `raw`, unread. nullopt: there is none.
inline constexpr std::size_t kMaxErrorFileBytes = 1u << 20;
std::optional<ErrorFile> read_error_file(const safefs::Dir& dir, const std::string& name, uid_t owner_uid);
// The same for a file of ours, in a folder of ours.
std::optional<ErrorFile> read_error_file(const std::string& path);

// --result-json: whether `path` can be written, checked before anything starts (its folder
// exists and is writable, or the file is); the reason when not.
std::optional<std::string> result_file_problem(const std::string& path);
// Writes `report` (indented JSON) to `path`; the reason when it could not.
std::optional<std::string> write_result_file(const std::string& path, const nlohmann::json& report);
// The same as `name` in `dir`, through its descriptor: written new under a temporary name (never
// through a link), 0600, then renamed into place.
std::optional<std::string> write_result_file(const safefs::Dir& dir, const std::string& name,
                                             const nlohmann::json& report);

// THE read of one rank for a failure report and for the hang watchdog: Python frames only (no
// ptrace, nothing opened in the target's name), bounded in what it holds (lib/stacks' walk
// totals, then bound_stacks) and in time: at most kStackReadTime, less once `stop` is asked. A
// real rank reads in about a millisecond (docs/gpu.md: 293 frames in 0.67 ms); the watchdog
// reads its ranks one after another on its owner's event loop, so a rank that makes its memory
// slow to read must not hold that loop for long. Never throws.
inline constexpr std::chrono::milliseconds kStackReadTime{500};
stacks::ProcessStacks read_rank_stacks(pid_t pid, std::stop_token stop = {});

// Field 22 of /proc/<pid>/stat: when the process started (clock ticks since boot), none when it
// is gone. A pid's owner is checked by it around a read (stack_snapshot.hpp). It is lib/stacks'
// process_start_time (reader.hpp), which `ddpctl stacks` checks its reads with.
std::optional<unsigned long long> process_start_time(pid_t pid);

// stacks.txt and stacks.json in the attempt's folder (written new, then renamed into place, never
// through a link, given to `owner`). Returns the path of stacks.txt, or why it was not written.
struct Written {
  std::string path;
  std::string error;
};
Written write_stacks_files(const safefs::Dir& dir, const std::optional<safefs::Owner>& owner, const FailureStacks& s,
                           int world_size);

}  // namespace ddp::launch

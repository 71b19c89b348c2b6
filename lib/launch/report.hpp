// What a user reads when a job ends: the first failure named, its last output and error file,
// as text for the terminal and as JSON for --result-json.
#pragma once

#include "common/safe_fs.hpp"

#include "control/paths.hpp"
#include "launch/attempt.hpp"
#include "launch/failure_stacks.hpp"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace ddp::launch {

// A worker's TORCHELASTIC_ERROR_FILE, as torch.distributed.elastic's @record writes it:
// {"message": {"message": "<Type>: <msg>", "extraInfo": {"py_callstack": "...", "timestamp": "..."}}}
// Other JSON shapes are kept raw; a file over 1 MiB is not read.
struct ErrorFile {
  std::string path;
  std::string message;
  std::string traceback;
  std::string raw;  // when the shape is unknown
};
// A rank's TORCHELASTIC_ERROR_FILE, `name` in the attempt's folder: read only if it is a regular
// file (not a link) of `owner_uid` (the job's user), at most kMaxErrorFileBytes; one that is not
// is named in `raw`, unread. nullopt: there is none.
inline constexpr std::size_t kMaxErrorFileBytes = 1u << 20;
std::optional<ErrorFile> read_error_file(const safefs::Dir& dir, const std::string& name, uid_t owner_uid);
// The same for a file of ours, in a folder of ours.
std::optional<ErrorFile> read_error_file(const std::string& path);
std::optional<ErrorFile> parse_error_file(const std::string& path, const std::string& content);

struct RankFailure {
  WorkerExit exit;
  std::string node;
  std::vector<std::string> last_lines;
  std::optional<ErrorFile> error_file;
  std::string log_file;
};

struct AttemptReport {
  int attempt = 0;
  SysTime started{};
  SysTime ended{};
  Phase phase = Phase::running;
  std::optional<RankFailure> first_failure;
  std::vector<WorkerExit> exits;   // every rank's exit, rank order
  std::vector<std::string> notes;  // e.g. the store's "who waits for what"
  std::string log_dir;
  // Where the ranks still running were when it failed or was stopped (failure_stacks.hpp).
  std::optional<FailureStacks> stacks;
};

// ddpctl's exit status when the hang watchdog stopped the job (hang.action: stop), as timeout(1)'s.
inline constexpr int kHungExitCode = 124;

struct JobReport {
  std::string job_id;
  std::string status;  // "succeeded" | "failed" | "stopped"
  int exit_code = 0;   // ddpctl's own exit status
  int restarts = 0;
  std::vector<AttemptReport> attempts;
  std::string message;  // why it failed, when that is not an attempt's (preflight, authentication)
};

std::string format_attempt(const AttemptReport& a, int max_restarts);
// kFull: each attempt's stacks in full (report_json: every group; --result-json, up to 256 KiB per
// node per attempt). kSummary: the summary lines and the file only (stacks_summary_json), for a
// message, which a frame bounds (1 MiB): the standing coordinator's job_result.
enum class StacksDetail { kFull, kSummary };
nlohmann::json to_json(const JobReport& r, StacksDetail stacks = StacksDetail::kFull);

// --result-json: whether `path` can be written, checked before anything starts (its folder
// exists and is writable, or the file is); the reason when not.
std::optional<std::string> result_file_problem(const std::string& path);
// Writes `report` (indented JSON) to `path`; the reason when it could not.
std::optional<std::string> write_result_file(const std::string& path, const nlohmann::json& report);

// What the job's control socket leaves when the job is over (control/paths.hpp): `ddpctl status|logs JOB` read it.
control::Ended end_record(const JobReport& report, const std::string& job_log_dir,
                          const std::optional<std::string>& result_json);

std::string format_time(SysTime t);  // "10:30:05.123" local time

}  // namespace ddp::launch

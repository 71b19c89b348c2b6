// What a user reads when a job ends: the first failure named, its last output and error file,
// as text for the terminal and as JSON for --result-json. Pure: reports in, text and JSON out
// (reading error files and writing the result file: attempt/files.hpp).
#pragma once

#include "attempt/attempt.hpp"
#include "attempt/failure_stacks.hpp"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace ddp::launch {

// A worker's TORCHELASTIC_ERROR_FILE, as torch.distributed.elastic's @record writes it:
// {"message": {"message": "<Type>: <msg>", "extraInfo": {"py_callstack": "...", "timestamp": "..."}}}
// Other JSON shapes are kept raw. Reading one is the edge's (attempt/files.hpp).
struct ErrorFile {
  std::string path;
  std::string message;
  std::string traceback;
  std::string raw;  // when the shape is unknown
};
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

std::string format_time(SysTime t);  // "10:30:05.123" local time

}  // namespace ddp::launch

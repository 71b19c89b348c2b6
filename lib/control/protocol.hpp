// The control socket's conversation, pure: requests, the status document as text, log lines.
//
//   client: one JSON line  {"op": "status"} | {"op": "stop"} | {"op": "logs", "ranks": [..], "follow": bool}
//                          | {"op": "stacks", "ranks": [..], "native": bool}
//   server: status  {"ok": true, "status": {...}}                       then closes
//           stop    {"ok": true, "stopping": true}                      then closes when the job has ended
//           logs    {"ok": true, "files": [{"rank", "path", "size"}]}   the client reads each file up to
//                   size; with follow, every later line {"rank", "stream", "line", "time"} (time: UTC, as
//                   the files write it; absent from older launchers), {"dropped": n} when
//                   the client fell behind, and {"end": "<job result>"} before the close
//           stacks  {"ok": true, "world_size": n, "ranks": [{"rank", "node", "process"}]}  then closes;
//                   process: stacks::to_json(ProcessStacks); a rank (or node) that could not be read is
//                   there too, its process's errors saying why
//           error   {"ok": false, "error": "..."}
//   a standing coordinator, for a job that ended there (any op): {"ok": false, "error", "job_id",
//           "ended": its end record less the files, "last": true when no job was named}, then for
//           logs the files' lines {"rank", "stream", "line", "time"}, then closes ("ok" false: a
//           client that knows no "ended" says the error). After a coordinator's inlined files,
//           running job or ended: {"unreadable": "rank R: cannot read PATH: why"} for each file
//           it skipped
//
// The size in "files" is taken in the same event-loop turn as the subscription, after the
// launcher flushed the log files, so a follower sees every line exactly once.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>

namespace ddp::control {

inline constexpr std::size_t kMaxRequestBytes = 4096;

enum class Op { status, stop, logs, stacks };

// `logs --attempt all` in a request's "attempt" (one attempt is its number, 0 the first).
inline constexpr int kEveryAttempt = -1;
inline constexpr int kMaxAttempt = 1'000'000;

struct Request {
  Op op = Op::status;
  std::set<int> ranks;  // logs, stacks: empty means every rank
  bool follow = false;
  bool native = false;  // stacks
  // logs: an earlier attempt's lines (kEveryAttempt: every attempt's, in order), read where the
  // files are (a standing coordinator's); none: the current attempt's. Sent only when set, so
  // that a peer that knows no "attempt" is asked what it knows.
  std::optional<int> attempt;
};

// Throws ControlError naming what is wrong.
Request parse_request(std::string_view line);
std::string encode_request(const Request& r);  // one line, '\n' included

// "0,3,5-7" (as `--ranks` takes it); throws ControlError.
std::set<int> parse_rank_list(std::string_view text);
// The ranks of `wanted` that a job of `world_size` ranks (0..world_size-1) does not have, said
// as "the job has no rank 9 (it has ranks 0-3)"; nullopt when it has them all.
std::optional<std::string> ranks_outside(const std::set<int>& wanted, int world_size);

// The status document (see LocalLauncher / Coordinator) as a user reads it.
std::string format_status(const nlohmann::json& status, std::int64_t now_unix_ms);

// A rank log file's line "<UTC time> out| text": the stream and text; nullopt for ddpctl's own
// "ddp|" notes and for anything else.
struct LogLine {
  std::string stream;  // "out" | "err"
  std::string text;
};
std::optional<LogLine> parse_log_line(std::string_view line);

}  // namespace ddp::control

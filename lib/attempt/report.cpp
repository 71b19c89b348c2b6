#include "attempt/report.hpp"

#include "common/strings.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <ctime>
#include <sstream>

namespace ddp::launch {

std::optional<ErrorFile> parse_error_file(const std::string& path, const std::string& content) {
  ErrorFile ef;
  ef.path = path;
  auto j = nlohmann::json::parse(content, nullptr, false);
  if (!j.is_discarded() && j.is_object() && j.contains("message")) {
    const auto& m = j["message"];
    if (m.is_object()) {
      if (m.contains("message") && m["message"].is_string()) ef.message = m["message"].get<std::string>();
      if (m.contains("extraInfo") && m["extraInfo"].is_object()) {
        const auto& x = m["extraInfo"];
        if (x.contains("py_callstack") && x["py_callstack"].is_string())
          ef.traceback = x["py_callstack"].get<std::string>();
      }
    } else if (m.is_string()) {
      ef.message = m.get<std::string>();
    }
  }
  if (ef.message.empty() && ef.traceback.empty()) ef.raw = content;
  return ef;
}

std::string format_time(SysTime t) {
  auto secs = std::chrono::system_clock::to_time_t(t);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count() % 1000;
  std::tm tm{};
  ::localtime_r(&secs, &tm);
  return fmt::format("{:02}:{:02}:{:02}.{:03}", tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
}

static std::string phase_name(Phase p) {
  switch (p) {
    case Phase::succeeded:
      return "succeeded";
    case Phase::failed:
      return "failed";
    case Phase::stopped:
      return "stopped";
    case Phase::stopping:
      return "stopping";
    default:
      return "running";
  }
}

static void indent_block(std::string& out, const std::string& text, std::size_t max_lines) {
  std::istringstream in(text);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  std::size_t start = lines.size() > max_lines ? lines.size() - max_lines : 0;
  if (start) out += fmt::format("    | ... ({} lines above)\n", start);
  for (std::size_t i = start; i < lines.size(); ++i) out += "    | " + lines[i] + "\n";
}

std::string format_attempt(const AttemptReport& a, int max_restarts) {
  std::string out;
  out += fmt::format("ddpctl: attempt {} (of at most {}) {}\n", a.attempt, max_restarts + 1, phase_name(a.phase));
  if (a.first_failure) {
    const auto& f = *a.first_failure;
    out += fmt::format("  first failure: rank {} (local rank {}, node {}, pid {}) {} at {}\n", f.exit.rank,
                       f.exit.local_rank, f.node, f.exit.pid, f.exit.describe(), format_time(f.exit.when));
    if (f.error_file) {
      out += fmt::format("  error file {}:\n", f.error_file->path);
      if (!f.error_file->message.empty()) indent_block(out, f.error_file->message, 10);
      if (!f.error_file->traceback.empty()) indent_block(out, f.error_file->traceback, 30);
      if (!f.error_file->raw.empty()) indent_block(out, f.error_file->raw, 30);
    }
    if (!f.last_lines.empty()) {
      out += fmt::format("  last output of rank {}:\n", f.exit.rank);
      for (const auto& l : f.last_lines) out += "    | " + l + "\n";
    }
    std::vector<std::string> others;
    for (const auto& e : a.exits) {
      if (e.rank != f.exit.rank) others.push_back(fmt::format("rank {} {}", e.rank, e.describe()));
    }
    if (!others.empty()) {
      out += "  then:";
      for (std::size_t i = 0; i < others.size(); ++i) out += (i ? ", " : " ") + others[i];
      out += "\n";
    }
  } else if (std::any_of(a.exits.begin(), a.exits.end(), [](const WorkerExit& e) { return e.forwarded; })) {
    // Killed by a signal the launcher forwarded (SIGUSR1/2): not a failure of the rank's own.
    std::vector<std::string> exits;
    for (const auto& e : a.exits) exits.push_back(fmt::format("rank {} {}", e.rank, e.describe()));
    out += "  no rank failed by itself: " + join_first(exits, ", ", 16) + "\n";
  }
  if (a.stacks) {
    // Said before the grace period's signals: where each rank was, not how it died.
    if (a.first_failure) {
      out += fmt::format("  while rank {} {}, the ranks still running were:\n", a.first_failure->exit.rank,
                         a.first_failure->exit.describe());
    } else {
      out += "  when the attempt was stopped, its ranks were:\n";
    }
    const auto lines = summary_lines(*a.stacks);
    for (const auto& l : lines) out += "    " + l + "\n";
    if (lines.empty()) out += "    (no rank was running)\n";
    if (!a.stacks->file.empty()) out += fmt::format("  every thread's stack: {}\n", a.stacks->file);
  }
  for (const auto& n : a.notes) out += "  " + n + "\n";
  if (!a.log_dir.empty()) out += fmt::format("  logs: {}\n", a.log_dir);
  return out;
}

static nlohmann::json exit_json(const WorkerExit& e) {
  nlohmann::json j{
      {"rank", e.rank},
      {"local_rank", e.local_rank},
      {"pid", e.pid},
      {"time", format_time(e.when)},
      {"time_unix_ms", std::chrono::duration_cast<std::chrono::milliseconds>(e.when.time_since_epoch()).count()}};
  if (e.signal) {
    j["signal"] = e.signal;
    j["exit_code"] = nullptr;
  } else {
    j["exit_code"] = e.exit_code;
    j["signal"] = nullptr;
  }
  j["forwarded"] = e.forwarded;
  j["description"] = e.describe();
  return j;
}

nlohmann::json to_json(const JobReport& r, StacksDetail detail) {
  nlohmann::json attempts = nlohmann::json::array();
  for (std::size_t i = 0; i < r.attempts.size(); ++i) {
    const auto& a = r.attempts[i];
    nlohmann::json aj{
        {"attempt", a.attempt}, {"result", phase_name(a.phase)}, {"log_dir", a.log_dir}, {"notes", a.notes}};
    nlohmann::json exits = nlohmann::json::array();
    for (const auto& e : a.exits) exits.push_back(exit_json(e));
    aj["exits"] = exits;
    if (a.first_failure) {
      const auto& f = *a.first_failure;
      auto fj = exit_json(f.exit);
      fj["node"] = f.node;
      fj["last_lines"] = f.last_lines;
      fj["log_file"] = f.log_file;
      if (f.error_file) {
        fj["error_file"] = {{"path", f.error_file->path},
                            {"message", f.error_file->message},
                            {"traceback", f.error_file->traceback},
                            {"raw", f.error_file->raw}};
      } else {
        fj["error_file"] = nullptr;
      }
      aj["first_failure"] = fj;
    } else {
      aj["first_failure"] = nullptr;
    }
    if (!a.stacks) {
      aj["stacks"] = nullptr;
    } else if (detail == StacksDetail::kFull) {
      aj["stacks"] = report_json(*a.stacks);
    } else {
      // The last few attempts' lines (each attempt's at most about 8 KiB); the older ones' file.
      aj["stacks"] = stacks_summary_json(*a.stacks, r.attempts.size() - i <= kSummaryAttempts);
    }
    attempts.push_back(aj);
  }
  nlohmann::json out{{"job_id", r.job_id},
                     {"status", r.status},
                     {"exit_code", r.exit_code},
                     {"restarts", r.restarts},
                     {"attempts", attempts}};
  if (!r.message.empty()) out["message"] = r.message;
  return out;
}

}  // namespace ddp::launch

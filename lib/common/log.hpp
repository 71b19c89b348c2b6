// One logger for the whole project, with levels and subsystems.
//
// DDP_LOG_LEVEL  = trace|debug|info|warn|error|off (default info)
// DDP_LOG_SUBSYS = comma list of subsystems to show below warn (default: all),
//                  e.g. "store,launch". Warnings and errors are never filtered out.
// Lines go to stderr so that a job's own output (stdout) stays clean.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <string>
#include <string_view>

namespace ddp::log {

// The logger of one subsystem ("launch", "store", "supervisor", ...). Cheap to call
// repeatedly; loggers are created once and cached.
std::shared_ptr<spdlog::logger> get(std::string_view subsystem);

// Re-reads DDP_LOG_LEVEL / DDP_LOG_SUBSYS (tests and CLI --verbose use this).
void configure_from_env();
void set_level(spdlog::level::level_enum level);

// A line of another of our processes' stderr (a remote agent over SSH or srun) as our log shows
// it: at that process's own level when it is one of our log lines ("ddpctl warning [agent] ..."),
// else (a crash, the shell) at warning. Its text is made safe for a terminal (clean_text, tabs
// kept, at most kMaxRelayedLineBytes): the other end may not be ours, and its line is printed on
// the user's. Pure.
constexpr std::size_t kMaxRelayedLineBytes = 64 * 1024;
struct RelayedLine {
  enum class Level { debug, info, warn, error } level = Level::warn;
  std::string text;
};
RelayedLine relay_line(std::string_view line);

}  // namespace ddp::log

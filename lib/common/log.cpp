#include "common/log.hpp"

#include "common/strings.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>

namespace ddp::log {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<spdlog::logger>, std::less<>> loggers;
  std::shared_ptr<spdlog::sinks::sink> sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  spdlog::level::level_enum level = spdlog::level::info;
  std::set<std::string, std::less<>> subsystems;  // empty: all

  spdlog::level::level_enum level_for(std::string_view name) const {
    if (!subsystems.empty() && !subsystems.contains(name) && level < spdlog::level::warn) {
      return spdlog::level::warn;
    }
    return level;
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void configure_from_env() {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  if (const char* lv = std::getenv("DDP_LOG_LEVEL")) {
    r.level = spdlog::level::from_str(lv);
  }
  r.subsystems.clear();
  if (const char* ss = std::getenv("DDP_LOG_SUBSYS")) {
    for (auto& s : split(ss, ',')) {
      if (!s.empty()) r.subsystems.insert(std::string(s));
    }
  }
  for (auto& [name, logger] : r.loggers) logger->set_level(r.level_for(name));
}

void set_level(spdlog::level::level_enum level) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  r.level = level;
  for (auto& [name, logger] : r.loggers) logger->set_level(r.level_for(name));
}

std::shared_ptr<spdlog::logger> get(std::string_view subsystem) {
  auto& r = registry();
  static std::once_flag once;
  std::call_once(once, [] { configure_from_env(); });
  std::lock_guard lock(r.mu);
  if (auto it = r.loggers.find(subsystem); it != r.loggers.end()) return it->second;
  auto logger = std::make_shared<spdlog::logger>(std::string(subsystem), r.sink);
  logger->set_pattern("ddpctl %^%l%$ [%n] %v");
  logger->set_level(r.level_for(subsystem));
  r.loggers.emplace(std::string(subsystem), logger);
  return logger;
}

RelayedLine relay_line(std::string_view line) {
  using L = RelayedLine::Level;
  static constexpr std::pair<std::string_view, L> kLevels[] = {
      {"ddpctl trace ", L::debug},  {"ddpctl debug ", L::debug}, {"ddpctl info ", L::info},
      {"ddpctl warning ", L::warn}, {"ddpctl error ", L::error}, {"ddpctl critical ", L::error}};
  for (const auto& [prefix, level] : kLevels) {
    if (line.starts_with(prefix)) return {level, std::string(line.substr(prefix.size()))};
  }
  return {L::warn, std::string(line)};
}

}  // namespace ddp::log

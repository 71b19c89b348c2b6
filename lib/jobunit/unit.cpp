// The shepherd's transient unit as data (see unit.hpp for the reasoning).
#include "jobunit/unit.hpp"

#include <fmt/format.h>

#include <set>

namespace ddp::jobunit {

const Value* UnitRequest::find(const std::string& property) const {
  for (const auto& p : properties) {
    if (p.name == property) return &p.value;
  }
  return nullptr;
}

std::string unit_name(const std::string& job_id, pid_t agent_pid, unsigned sequence) {
  // systemd allows 255 characters: the id (escaped up to 4x) is cut to keep the name valid.
  constexpr std::size_t kMaxIdChars = 160;
  std::string id;
  for (unsigned char c : job_id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '.' || c == '-' || c == ':';
    std::string piece = ok ? std::string(1, static_cast<char>(c)) : fmt::format("\\x{:02x}", c);
    if (id.size() + piece.size() > kMaxIdChars) break;
    id += piece;
  }
  return fmt::format("ddp-job-{}-{}-{}.service", id, agent_pid, sequence);
}

UnitRequest shepherd_unit(const ShepherdUnit& u) {
  UnitRequest r;
  r.name = unit_name(u.job_id, u.agent_pid, u.sequence);
  auto add = [&](std::string name, Value v) { r.properties.push_back({std::move(name), std::move(v)}); };
  add("Description", fmt::format("ddpctl job {} (shepherd for ddp-agentd pid {})", u.job_id, u.agent_pid));
  add("Type", std::string("exec"));  // started once exec() succeeded: a missing binary fails the start
  add("ExecStart", std::vector<Exec>{{u.argv.at(0), u.argv, false}});
  add("Delegate", true);
  add("KillMode", std::string("control-group"));
  // Neither restarted nor kept once over: the job's result goes up the shepherd's channel.
  add("Restart", std::string("no"));
  add("CollectMode", std::string("inactive-or-failed"));
  // What systemd set for the agent's own unit speaks for that unit, not the job's (systemd sets
  // the job unit's own where it has them).
  static const std::set<std::string> kUnitOwn{"INVOCATION_ID",
                                              "NOTIFY_SOCKET",
                                              "WATCHDOG_USEC",
                                              "WATCHDOG_PID",
                                              "JOURNAL_STREAM",
                                              "LISTEN_FDS",
                                              "LISTEN_PID",
                                              "LISTEN_FDNAMES",
                                              "MAINPID",
                                              "MANAGERPID",
                                              "SYSTEMD_EXEC_PID",
                                              "RUNTIME_DIRECTORY",
                                              "STATE_DIRECTORY",
                                              "CACHE_DIRECTORY",
                                              "LOGS_DIRECTORY",
                                              "CONFIGURATION_DIRECTORY",
                                              "CREDENTIALS_DIRECTORY",
                                              "TRIGGER_UNIT",
                                              "TRIGGER_TIMER_REALTIME_USEC",
                                              "TRIGGER_TIMER_MONOTONIC_USEC"};
  std::vector<std::string> env;
  for (const auto& [k, v] : u.env) {
    if (!kUnitOwn.count(k)) env.push_back(k + "=" + v);
  }
  add("Environment", std::move(env));
  add("StandardInputFileDescriptor", Fd{u.stdin_fd});
  add("StandardOutputFileDescriptor", Fd{u.stderr_fd});
  add("StandardErrorFileDescriptor", Fd{u.stderr_fd});
  for (const auto& l : u.limits) {
    add("Limit" + l.name, l.hard);
    add("Limit" + l.name + "Soft", l.soft);
  }
  return r;
}

}  // namespace ddp::jobunit

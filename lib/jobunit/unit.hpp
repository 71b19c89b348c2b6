// Jobs in transient systemd units: what the agent asks systemd for, as data (pure).
//
// Why: under systemd the agent's own unit is hardened (ProtectHome, PrivateTmp, NoNewPrivileges,
// ...), and a child inherits its parent's namespaces and no_new_privs. A job's shepherd started
// as a transient *service* (not a scope, which would keep the agent's mount namespace and
// no_new_privs, since a scope only adopts running processes) begins from PID 1's view of the
// system instead, with only what these properties set. The reasoning behind each property is in
// docs/architecture.md ("Running under systemd"); in short:
//   Delegate=yes            the shepherd owns its unit's cgroup and makes the attempts' cgroups
//                           below it, as it does under the agent's cgroup without systemd
//   KillMode=control-group  when the shepherd exits (or the unit is stopped) every process left
//                           in the job's cgroup is killed: nothing outlives the job
//   no BindsTo= the agent's unit: stopping the agent must let it stop its jobs in order (the
//                           shepherd watches the agent through a pidfd and its channel)
//   no User=                the shepherd stays root, as under the fork: it owns the cgroups and
//                           the containers, and drops each worker to the job's user itself
//                           (supervisor::RunAs), so both paths run workers the same way
//   LimitMEMLOCK/LimitNOFILE the agent's own limits, which a child of the agent would inherit
//                           and a unit started by PID 1 would not
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace ddp::jobunit {

// D-Bus types of the properties we set: b, s, as, t, h (a descriptor, duplicated into the
// message) and a(sasb) (ExecStart: path, argv, ignore-failure).
struct Fd {
  int fd = -1;
  bool operator==(const Fd&) const = default;
};
struct Exec {
  std::string path;
  std::vector<std::string> argv;
  bool ignore_failure = false;
  bool operator==(const Exec&) const = default;
};
using Value = std::variant<bool, std::string, std::vector<std::string>, std::uint64_t, Fd, std::vector<Exec>>;

struct Property {
  std::string name;
  Value value;
};

struct UnitRequest {
  std::string name;  // "ddp-job-....service"
  std::vector<Property> properties;
  const Value* find(const std::string& property) const;
};

struct ResourceLimit {
  std::string name;                  // "MEMLOCK", "NOFILE" (systemd's Limit<NAME>)
  std::uint64_t soft = 0, hard = 0;  // UINT64_MAX: infinity, as RLIM_INFINITY
};

struct ShepherdUnit {
  std::string job_id;
  pid_t agent_pid = 0;
  unsigned sequence = 0;                   // the agent's count of units started, for unique names
  std::vector<std::string> argv;           // argv[0]: the shepherd's executable, absolute
  std::map<std::string, std::string> env;  // the shepherd's environment (the agent's, less what
                                           // systemd set for the agent's unit)
  int stdin_fd = -1;                       // the shepherd's end of the channel, its stdin
  int stderr_fd = -1;                      // where the shepherd's log lines go (the agent's)
  std::vector<ResourceLimit> limits;
};

// A valid unit name for the job: "ddp-job-<job id, escaped>-<agent pid>-<sequence>.service".
// Characters systemd does not allow in unit names become \xHH (as systemd-escape writes them).
std::string unit_name(const std::string& job_id, pid_t agent_pid, unsigned sequence);

UnitRequest shepherd_unit(const ShepherdUnit& u);

}  // namespace ddp::jobunit

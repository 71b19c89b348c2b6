// Jobs in transient systemd units: the I/O edge (libsystemd's sd-bus).
//
// Policy: `auto` puts jobs in transient units only when the agent is itself a systemd service
// ($INVOCATION_ID, set by systemd for every unit it starts), systemd is the init system
// (sd_booted) and the system bus answers; anything else (no systemd, a test, SSH's one-shot
// agent) keeps the shepherd a child of the agent. `systemd` requires the bus and fails the
// agent's start when there is none, saying why.
#pragma once

#include "jobunit/unit.hpp"

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

struct sd_bus;

namespace ddp::jobunit {

enum class Mode { automatic, systemd, fork };

class UnitError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Manager {
 public:
  // Connects to the system bus (DBUS_SYSTEM_BUS_ADDRESS, else systemd's socket). Throws UnitError.
  Manager();
  ~Manager();
  Manager(const Manager&) = delete;
  Manager& operator=(const Manager&) = delete;

  // StartTransientUnit(name, "fail", properties, []); returns systemd's job object path.
  // Throws UnitError with the bus's error name and message.
  std::string start(const UnitRequest& r);

 private:
  sd_bus* bus_ = nullptr;
};

// The Manager to start jobs' units with, or nullptr for the fork; `why` says which and why.
// Throws UnitError when `mode` is systemd and there is no usable bus.
std::unique_ptr<Manager> choose(Mode mode, std::string& why);

// The unit this process runs in ("ddp-agentd.service"), if any.
std::optional<std::string> own_unit();

// This process's RLIMIT_MEMLOCK and RLIMIT_NOFILE, for the job units to keep.
std::vector<ResourceLimit> own_limits();

}  // namespace ddp::jobunit

// Jobs in transient systemd units: the I/O edge (libsystemd's sd-bus).
//
// Policy: `auto` puts jobs in transient units when the agent is itself a systemd service
// ($INVOCATION_ID, set by systemd for every unit it starts) and systemd is the init system
// (sd_booted); anything else (no systemd, a test, SSH's one-shot agent) keeps the shepherd a
// child of the agent. Under systemd the system bus must then answer: a job forked instead would
// silently inherit the agent unit's sandbox, so the agent does not start, and says why.
// `systemd` requires the bus whatever the environment; `fork` never uses it.
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
  // Connects to systemd: DBUS_SYSTEM_BUS_ADDRESS when set (that bus only); else, as root,
  // systemd's own socket /run/systemd/private (no dbus-daemon needed, as systemctl does), then
  // the system bus. Throws UnitError.
  Manager();
  ~Manager();
  Manager(const Manager&) = delete;
  Manager& operator=(const Manager&) = delete;

  // StartTransientUnit(name, "fail", properties, []); returns systemd's job object path.
  // Throws UnitError with the bus's error name and message.
  // Connects again once if the connection was lost (PID 1 re-executed).
  std::string start(const UnitRequest& r);

 private:
  struct Disconnected : std::runtime_error {
    using std::runtime_error::runtime_error;
  };
  void connect();
  std::string call(const UnitRequest& r);
  sd_bus* bus_ = nullptr;
};

// The Manager to start jobs' units with, or nullptr for the fork; `why` says why. Throws
// UnitError when units are called for and the bus does not answer.
std::unique_ptr<Manager> choose(Mode mode, std::string& why);

// This process's RLIMIT_MEMLOCK and RLIMIT_NOFILE, for the job units to keep.
std::vector<ResourceLimit> own_limits();

}  // namespace ddp::jobunit

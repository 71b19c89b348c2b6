// Telling systemd how a Type=notify service is doing (sd_notify(3)): READY=1 once the daemon
// serves, STATUS= lines for `systemctl status`, STOPPING=1 when it shuts down, and WATCHDOG=1
// pings when the unit sets WatchdogSec=.
//
// Policy: outside systemd (no NOTIFY_SOCKET) every call does nothing, so the daemon behaves the
// same when run by hand. The watchdog is pinged at half of WATCHDOG_USEC, as sd_watchdog_enabled(3)
// recommends, from the daemon's own event loop: a loop that is stuck stops the pings, and
// systemd then restarts the service.
#pragma once

#include "common/systemd.hpp"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ddp::sdnotify {

// Pure: the ping interval for a WATCHDOG_USEC value (half of it; none for 0).
std::optional<std::chrono::microseconds> ping_interval(std::uint64_t watchdog_usec);

// One line of STATUS= text: newlines would end the assignment early, so they become spaces.
std::string status_line(std::string_view text);

class Notifier {
 public:
  // Reads NOTIFY_SOCKET / WATCHDOG_USEC / WATCHDOG_PID once (sd_watchdog_enabled).
  Notifier();

  bool active() const { return active_; }
  std::optional<std::chrono::microseconds> watchdog_interval() const { return watchdog_; }

  void ready(std::string_view status);
  void status(std::string_view status);
  void stopping(std::string_view status);
  void watchdog();

 private:
  void send(const std::string& state);

  bool active_ = false;
  const systemd::Api* sd_ = nullptr;  // loaded only when NOTIFY_SOCKET is set
  std::optional<std::chrono::microseconds> watchdog_;
};

}  // namespace ddp::sdnotify

#include "sdnotify/sdnotify.hpp"

#include "common/log.hpp"
#include "common/systemd.hpp"

#include <cstdlib>
#include <cstring>

namespace ddp::sdnotify {

std::optional<std::chrono::microseconds> ping_interval(std::uint64_t watchdog_usec) {
  if (watchdog_usec == 0) return std::nullopt;
  return std::chrono::microseconds(watchdog_usec / 2);
}

std::string status_line(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return out;
}

Notifier::Notifier() {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  active_ = socket != nullptr && *socket != '\0';
  if (!active_) return;  // not under a service manager: libsystemd stays unloaded
  sd_ = systemd::api();
  if (!sd_) {
    log::get("sdnotify")
        ->warn("$NOTIFY_SOCKET is set but {}: no readiness or watchdog notifications", systemd::load_error());
    active_ = false;
    return;
  }
  std::uint64_t usec = 0;
  // > 0 only when WATCHDOG_USEC is set and WATCHDOG_PID (if set) is this process.
  if (sd_->watchdog_enabled(0, &usec) > 0) watchdog_ = ping_interval(usec);
}

void Notifier::ready(std::string_view status) {
  send("READY=1\nSTATUS=" + status_line(status));
}
void Notifier::status(std::string_view status) {
  send("STATUS=" + status_line(status));
}
void Notifier::stopping(std::string_view status) {
  send("STOPPING=1\nSTATUS=" + status_line(status));
}
void Notifier::watchdog() {
  send("WATCHDOG=1");
}

void Notifier::send(const std::string& state) {
  if (!active_) return;
  // A lost notification must not take the daemon down: systemd's own timeouts report it.
  if (int r = sd_->notify(0, state.c_str()); r < 0) {
    log::get("sdnotify")->warn("sd_notify to $NOTIFY_SOCKET failed: {}", std::strerror(-r));
  }
}

}  // namespace ddp::sdnotify

// libsystemd loaded on first use (policy in systemd.hpp).
#include "common/systemd.hpp"

#include "common/dynlib.hpp"

namespace ddp::systemd {
namespace {

constexpr const char* kSoname = "libsystemd.so.0";

struct Loaded {
  Api api;
  bool ok = false;
  std::string error;

  Loaded() {
    void* h = dynlib::open(kSoname, error);
    if (!h) {
      error = std::string("cannot load ") + kSoname + ": " + error + " (Debian's package libsystemd0 provides it)";
      return;
    }
    std::string missing;
    dynlib::resolve(h, "sd_journal_sendv", api.journal_sendv, missing);
    dynlib::resolve(h, "sd_notify", api.notify, missing);
    dynlib::resolve(h, "sd_watchdog_enabled", api.watchdog_enabled, missing);
    if (!missing.empty()) {
      error = std::string(kSoname) + " has no " + missing;
      return;
    }
    ok = true;
  }
};

const Loaded& loaded() {
  static const Loaded l;
  return l;
}

}  // namespace

const Api* api() {
  return loaded().ok ? &loaded().api : nullptr;
}

const std::string& load_error() {
  return loaded().error;
}

}  // namespace ddp::systemd

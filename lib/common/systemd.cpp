// libsystemd loaded on first use (policy in systemd.hpp).
#include "common/systemd.hpp"

#include <dlfcn.h>

namespace ddp::systemd {
namespace {

constexpr const char* kSoname = "libsystemd.so.0";

struct Loaded {
  Api api;
  bool ok = false;
  std::string error;

  Loaded() {
    // Never closed: the journal and notify functions keep state (sockets) inside the library.
    void* h = ::dlopen(kSoname, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* e = ::dlerror();
      error = std::string("cannot load ") + kSoname + ": " + (e ? e : "unknown error") +
              " (Debian's package libsystemd0 provides it)";
      return;
    }
    ok = resolve(h, "sd_journal_sendv", api.journal_sendv) && resolve(h, "sd_notify", api.notify) &&
         resolve(h, "sd_watchdog_enabled", api.watchdog_enabled);
  }

  template <class Fn>
  bool resolve(void* h, const char* name, Fn& out) {
    void* sym = ::dlsym(h, name);
    if (!sym) {
      error = std::string(kSoname) + " has no " + name;
      return false;
    }
    out = reinterpret_cast<Fn>(sym);
    return true;
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

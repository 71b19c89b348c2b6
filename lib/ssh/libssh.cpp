// libssh loaded on first use (policy in libssh.hpp).
#include "ssh/libssh.hpp"

#include "common/dynlib.hpp"

#include <stdexcept>
#include <string>

namespace ddp::ssh {
namespace {

constexpr const char* kSoname = "libssh.so.4";

struct Loaded {
  Libssh api;
  std::string error;

  Loaded() {
    // Never closed: sessions, channels and libssh's own threads' state live inside it.
    void* h = dynlib::open(kSoname, error);
    if (!h) {
      error = std::string("SSH mode needs ") + kSoname + ", which cannot be loaded: " + error +
              " (install Debian's libssh-4)";
      return;
    }
    std::string missing;
#define DDP_LIBSSH_RESOLVE(name) dynlib::resolve(h, #name, api.name, missing);
    DDP_LIBSSH_FUNCTIONS(DDP_LIBSSH_RESOLVE)
#undef DDP_LIBSSH_RESOLVE
    if (!missing.empty()) error = std::string(kSoname) + " lacks " + missing + " (libssh 0.10 or later is needed)";
  }
};

}  // namespace

const Libssh& libssh() {
  static const Loaded l;
  if (!l.error.empty()) throw std::runtime_error(l.error);
  return l.api;
}

}  // namespace ddp::ssh

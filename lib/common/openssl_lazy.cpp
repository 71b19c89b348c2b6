#include "common/openssl_lazy.hpp"

#include "common/dynlib.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

extern "C" {
// openssl_lazy.S: one slot per function, the names one after another (each ending in NUL, an
// empty name after the last), and their count.
extern void* ddp_openssl_slots[];
extern const char ddp_openssl_names[];
extern const unsigned ddp_openssl_count;
}

namespace {

constexpr const char* kSoname = "libssl.so.3";

[[noreturn]] void cannot(const std::string& why) {
  // No logger: this may run on any thread, before or after ours are set up.
  std::fprintf(stderr, "ddpctl: %s; TLS and the multi-node protocol need OpenSSL 3 (Debian: apt-get install libssl3)\n",
               why.c_str());
  std::fflush(stderr);
  std::_Exit(2);
}

}  // namespace

void ddp_openssl_lazy_resolve() {
  static std::once_flag once;
  std::call_once(once, [] {
    std::string error;
    void* lib = ddp::dynlib::open(kSoname, error);
    if (!lib) cannot(std::string("cannot load ") + kSoname + ": " + error);
    std::string missing;
    const char* name = ddp_openssl_names;
    for (unsigned i = 0; i < ddp_openssl_count && *name; ++i, name += std::strlen(name) + 1) {
      // dlsym through libssl's handle also finds libcrypto's functions: it is loaded as its
      // dependency, and a handle's lookups cover its dependencies.
      if (void* fn = ::dlsym(lib, name)) {
        ddp_openssl_slots[i] = fn;
      } else {
        missing += missing.empty() ? name : std::string(", ") + name;
      }
    }
    if (!missing.empty()) cannot(std::string(kSoname) + " lacks " + missing);
  });
}

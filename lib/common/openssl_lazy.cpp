#include "common/openssl_lazy.hpp"

#include "common/dynlib.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

extern "C" {
// openssl_lazy.S: one slot per function, and their names one after another in the same order
// (each ending in NUL, an empty name after the last).
extern void* ddp_openssl_slots[];
extern const char ddp_openssl_names[];
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
    // dlsym through libssl's handle also finds libcrypto's functions: it is loaded as its
    // dependency, and a handle's lookups cover its dependencies.
    std::string missing;
    std::size_t i = 0;
    for (const char* name = ddp_openssl_names; *name; name += std::strlen(name) + 1) {
      ddp::dynlib::resolve(lib, name, ddp_openssl_slots[i++], missing);
    }
    if (!missing.empty()) cannot(std::string(kSoname) + " lacks " + missing);
  });
}

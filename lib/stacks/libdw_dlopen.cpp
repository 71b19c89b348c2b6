// libdw loaded on first use (policy in libdw.hpp).
#include "stacks/libdw.hpp"

#include "common/dynlib.hpp"

namespace ddp::stacks {
namespace {

constexpr const char* kSoname = "libdw.so.1";

struct Loaded {
  Libdw api;
  bool ok = false;
  std::string error;

  Loaded() {
    // Never closed: a Dwfl and the ELF files it opened live inside it.
    void* h = dynlib::open(kSoname, error);
    if (!h) {
      error = std::string("native stacks need ") + kSoname + ", which cannot be loaded: " + error +
              " (install Debian's libdw1)";
      return;
    }
    std::string missing;
#define DDP_LIBDW_RESOLVE(name) dynlib::resolve(h, #name, api.name, missing);
    DDP_LIBDW_FUNCTIONS(DDP_LIBDW_RESOLVE)
#undef DDP_LIBDW_RESOLVE
    if (!missing.empty()) {
      error = std::string("native stacks: ") + kSoname + " lacks " + missing + " (install Debian's libdw1)";
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

const Libdw* libdw() {
  return loaded().ok ? &loaded().api : nullptr;
}

const std::string& libdw_error() {
  return loaded().error;
}

}  // namespace ddp::stacks

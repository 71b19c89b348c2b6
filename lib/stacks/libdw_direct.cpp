// libdw linked into the program (policy in libdw.hpp): the agent's.
#include "stacks/libdw.hpp"

namespace ddp::stacks {

const Libdw* libdw() {
  static const Libdw api = [] {
    Libdw a;
#define DDP_LIBDW_LINKED(name) a.name = &::name;
    DDP_LIBDW_FUNCTIONS(DDP_LIBDW_LINKED)
#undef DDP_LIBDW_LINKED
    return a;
  }();
  return &api;
}

const std::string& libdw_error() {
  static const std::string none;
  return none;
}

}  // namespace ddp::stacks

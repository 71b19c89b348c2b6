// See dynlib.hpp.
#include "common/dynlib.hpp"

namespace ddp::dynlib {

void* open(const char* soname, std::string& error) {
  void* h = ::dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = ::dlerror();
    error = e ? e : "unknown error";
  }
  return h;
}

}  // namespace ddp::dynlib

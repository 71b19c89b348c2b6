// A library loaded with dlopen when first needed, not linked: libsystemd (common/systemd.cpp),
// libssh (ssh/libssh.cpp) and libdw (stacks/libdw_dlopen.cpp), each behind a table of function
// pointers whose types are its headers' declarations, and OpenSSL (common/openssl_lazy.cpp),
// behind trampolines. What their loaders share; each says in its own words what to install.
#pragma once

#include <dlfcn.h>

#include <string>

namespace ddp::dynlib {

// dlopen(soname, RTLD_NOW | RTLD_LOCAL), never closed (the libraries keep state inside). Null
// when it cannot be loaded; `error` then holds dlerror()'s text.
void* open(const char* soname, std::string& error);

// Looks `name` up in `handle` into `out`; when it is missing, adds it to `missing` ("a, b").
template <class Fn>
void resolve(void* handle, const char* name, Fn& out, std::string& missing) {
  if (void* sym = ::dlsym(handle, name)) {
    out = reinterpret_cast<Fn>(sym);
  } else {
    missing += missing.empty() ? name : std::string(", ") + name;
  }
}

}  // namespace ddp::dynlib

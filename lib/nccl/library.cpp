// The NCCL run-time loader (policy in library.hpp).
#include "nccl/library.hpp"

#include "common/log.hpp"

#include <dlfcn.h>
#include <link.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace ddp::nccl {
namespace {

constexpr const char* kSoname = "libnccl.so.2";

std::string ld_library_path() {
  const char* v = std::getenv("LD_LIBRARY_PATH");
  return v ? (*v ? v : "empty") : "unset";
}

std::string dl_error() {
  const char* e = dlerror();
  return e ? e : "unknown dlopen error";
}

template <class Fn>
bool resolve(void* handle, const char* name, Fn& out, bool required, std::string& missing) {
  dlerror();
  void* sym = dlsym(handle, name);
  if (!sym) {
    if (required) missing += missing.empty() ? name : std::string(", ") + name;
    return false;
  }
  out = reinterpret_cast<Fn>(sym);
  return true;
}

std::string loaded_path(void* handle, const std::string& fallback) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && *map->l_name) return map->l_name;
  return fallback;
}

std::string describe(const Api& api, int code, const std::string& what, RawComm comm) {
  std::string msg = what + " failed: ";
  const char* s = api.get_error_string ? api.get_error_string(code) : nullptr;
  msg += s ? s : "NCCL error " + std::to_string(code);
  if (api.get_last_error) {
    const char* last = api.get_last_error(comm);
    if (last && *last) msg += std::string(": ") + last;
  }
  return msg;
}

void check_api(const Api& api, int code, const std::string& what, RawComm comm) {
  if (code != static_cast<int>(Result::success))
    throw Error(static_cast<Result>(code), describe(api, code, what, comm));
}

}  // namespace

std::string version_string(int code) {
  int major, minor, patch;
  if (code >= 20900) {  // NCCL >= 2.9: major*10000 + minor*100 + patch
    major = code / 10000;
    minor = code % 10000 / 100;
    patch = code % 100;
  } else {  // before: major*1000 + minor*100 + patch
    major = code / 1000;
    minor = code % 1000 / 100;
    patch = code % 100;
  }
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

Library Library::load(const LoadOptions& options) {
  auto log = ddp::log::get("nccl");
  const bool by_search = options.path.empty();
  const char* target = by_search ? kSoname : options.path.c_str();
  void* handle = dlopen(target, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    std::string why = dl_error();
    std::string msg = by_search
                          ? std::string(kSoname) + " not found on this node (LD_LIBRARY_PATH=" + ld_library_path() + ")"
                          : "cannot load NCCL from " + options.path;
    msg += ": " + why;
    if (!options.hint.empty()) msg += "; " + options.hint;
    throw LoadError(msg);
  }

  auto api = std::make_shared<Api>();
  std::string missing;
  resolve(handle, "ncclGetVersion", api->get_version, true, missing);
  resolve(handle, "ncclGetUniqueId", api->get_unique_id, true, missing);
  resolve(handle, "ncclGetErrorString", api->get_error_string, true, missing);
  resolve(handle, "ncclCommInitRank", api->comm_init_rank, true, missing);
  resolve(handle, "ncclCommDestroy", api->comm_destroy, true, missing);
  resolve(handle, "ncclCommAbort", api->comm_abort, true, missing);
  resolve(handle, "ncclCommGetAsyncError", api->comm_get_async_error, true, missing);
  resolve(handle, "ncclCommCount", api->comm_count, true, missing);
  resolve(handle, "ncclCommUserRank", api->comm_user_rank, true, missing);
  resolve(handle, "ncclAllReduce", api->all_reduce, true, missing);
  resolve(handle, "ncclGroupStart", api->group_start, true, missing);
  resolve(handle, "ncclGroupEnd", api->group_end, true, missing);
  resolve(handle, "ncclGetLastError", api->get_last_error, false, missing);

  std::string path = loaded_path(handle, target);
  if (!missing.empty()) {
    dlclose(handle);  // no NCCL code has run yet, so nothing can be left behind
    throw LoadError(path + " is not a usable NCCL 2 library: missing " + missing);
  }

  Library lib;
  int version = 0;
  check_api(*api, api->get_version(&version), "ncclGetVersion", nullptr);
  lib.api_ = std::move(api);
  lib.path_ = std::move(path);
  lib.version_ = version;
  log->debug("loaded NCCL {} from {}", lib.version(), lib.path_);
  return lib;
}

UniqueId Library::get_unique_id() const {
  RawUniqueId raw{};
  check(api_->get_unique_id(&raw), "ncclGetUniqueId");
  UniqueId id;
  std::memcpy(id.bytes.data(), raw.internal, kUniqueIdBytes);
  return id;
}

Comm Library::init_rank(int nranks, const UniqueId& id, int rank) const {
  RawUniqueId raw{};
  std::memcpy(raw.internal, id.bytes.data(), kUniqueIdBytes);
  RawComm comm = nullptr;
  check(api_->comm_init_rank(&comm, nranks, raw, rank),
        "ncclCommInitRank(rank " + std::to_string(rank) + " of " + std::to_string(nranks) + ")");
  return Comm(api_, comm);
}

std::string Library::error_string(Result code) const {
  const char* s = api_->get_error_string(static_cast<int>(code));
  return s ? s : "NCCL error " + std::to_string(static_cast<int>(code));
}

void Library::check(int code, const std::string& what, RawComm comm) const {
  check_api(*api_, code, what, comm);
}

Comm::Comm(Comm&& other) noexcept : api_(std::move(other.api_)), comm_(other.comm_) {
  other.comm_ = nullptr;
}

Comm& Comm::operator=(Comm&& other) noexcept {
  if (this != &other) {
    release(false);
    api_ = std::move(other.api_);
    comm_ = other.comm_;
    other.comm_ = nullptr;
  }
  return *this;
}

Comm::~Comm() {
  release(false);
}

int Comm::rank() const {
  int r = -1;
  check_api(*api_, api_->comm_user_rank(comm_, &r), "ncclCommUserRank", comm_);
  return r;
}

int Comm::count() const {
  int n = 0;
  check_api(*api_, api_->comm_count(comm_, &n), "ncclCommCount", comm_);
  return n;
}

Result Comm::async_error() const {
  int e = 0;
  check_api(*api_, api_->comm_get_async_error(comm_, &e), "ncclCommGetAsyncError", comm_);
  return static_cast<Result>(e);
}

void Comm::abort() {
  release(true);
}

void Comm::destroy() {
  if (!comm_) return;
  RawComm c = comm_;
  comm_ = nullptr;
  check_api(*api_, api_->comm_destroy(c), "ncclCommDestroy", nullptr);
}

void Comm::release(bool abort) noexcept {
  if (!comm_) return;
  RawComm c = comm_;
  comm_ = nullptr;
  int pending = 0;
  // Destroy waits for outstanding work with the peers; after an error that may never finish.
  if (!abort && api_->comm_get_async_error(c, &pending) == 0 && pending != 0) abort = true;
  int rc = abort ? api_->comm_abort(c) : api_->comm_destroy(c);
  if (rc != 0) {
    ddp::log::get("nccl")->warn("{} failed: {}", abort ? "ncclCommAbort" : "ncclCommDestroy",
                                describe(*api_, rc, "", nullptr));
  }
}

}  // namespace ddp::nccl

// NCCL loaded at run time. Owns: finding libnccl.so.2, resolving the entry points we use, and
// turning NCCL result codes into exceptions with NCCL's own words.
//
// Policy:
// - Never linked. dlopen("libnccl.so.2") searches as the dynamic loader would for a worker
//   (LD_LIBRARY_PATH of *this* process, then ld.so.cache, then the default dirs), so a process
//   started with the workers' environment finds the workers' NCCL. An explicit path overrides.
// - Our own declarations of the few types and prototypes (checked against nccl.h at compile
//   time where the header exists, abi_check.cpp), so the code is the same with or without it.
// - The handle is never dlclose'd: NCCL starts threads (bootstrap root, proxies) that run its
//   code until the process ends.
// - Missing library or symbol: LoadError, whose message says where we looked and how to fix it.
//   A failing NCCL call: Error with NCCL's code, its error string and ncclGetLastError's detail.
#pragma once

#include "nccl/unique_id.hpp"

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>

// The same incomplete tag nccl.h uses (`typedef struct ncclComm* ncclComm_t`), so a program that
// includes nccl.h can pass Comm::get() straight to NCCL functions it links itself.
struct ncclComm;

namespace ddp::nccl {

using RawComm = ::ncclComm*;  // ncclComm_t
using RawStream = void*;      // cudaStream_t

// ncclResult_t
enum class Result : int {
  success = 0,
  unhandled_cuda_error = 1,
  system_error = 2,
  internal_error = 3,
  invalid_argument = 4,
  invalid_usage = 5,
  remote_error = 6,
  in_progress = 7,
};
// The subset of ncclDataType_t / ncclRedOp_t the examples use.
enum class DataType : int { int32 = 2, float32 = 7 };
enum class RedOp : int { sum = 0 };

// ncclUniqueId as NCCL passes it (by value, 128 bytes).
struct RawUniqueId {
  char internal[kUniqueIdBytes];
};

// The C entry points, as resolved. Optional ones are null when this NCCL lacks them.
struct Api {
  int (*get_version)(int* version) = nullptr;
  int (*get_unique_id)(RawUniqueId* id) = nullptr;
  const char* (*get_error_string)(int result) = nullptr;
  int (*comm_init_rank)(RawComm* comm, int nranks, RawUniqueId id, int rank) = nullptr;
  int (*comm_destroy)(RawComm comm) = nullptr;
  int (*comm_abort)(RawComm comm) = nullptr;
  int (*comm_get_async_error)(RawComm comm, int* async_error) = nullptr;
  int (*comm_count)(RawComm comm, int* count) = nullptr;
  int (*comm_user_rank)(RawComm comm, int* rank) = nullptr;
  int (*all_reduce)(const void* send, void* recv, std::size_t count, int datatype, int op, RawComm comm,
                    RawStream stream) = nullptr;
  int (*group_start)() = nullptr;
  int (*group_end)() = nullptr;
  const char* (*get_last_error)(RawComm comm) = nullptr;  // optional (NCCL >= 2.13)
};

class LoadError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Error : public std::runtime_error {
 public:
  Error(Result code, const std::string& message) : std::runtime_error(message), code_(code) {}
  Result code() const { return code_; }

 private:
  Result code_;
};

struct LoadOptions {
  // Empty: dlopen("libnccl.so.2") through the loader's search. Else this file.
  std::string path;
  // Appended to a "not found" message: why this program needed NCCL and what to do about it.
  std::string hint = "install NCCL on this node, or put its lib directory on LD_LIBRARY_PATH";
};

// "2.28.9" from ncclGetVersion's code (both encodings: 2.8.4 = 2804, 2.28.9 = 22809).
std::string version_string(int code);

class Comm;

class Library {
 public:
  static Library load(const LoadOptions& options = {});  // throws LoadError

  int version_code() const { return version_; }
  std::string version() const { return version_string(version_); }
  const std::string& path() const { return path_; }  // the file the loader actually opened
  const Api& api() const { return *api_; }

  UniqueId get_unique_id() const;
  // Blocks until all nranks ranks have joined through the id's bootstrap root. The caller must
  // have selected its CUDA device first (cudaSetDevice(LOCAL_RANK)): NCCL binds the comm to it.
  Comm init_rank(int nranks, const UniqueId& id, int rank) const;
  std::string error_string(Result code) const;
  // Throws Error("<what> failed: <NCCL's string>[: <last error>]") unless code is success.
  void check(int code, const std::string& what, RawComm comm = nullptr) const;

 private:
  std::shared_ptr<const Api> api_;
  std::string path_;
  int version_ = 0;
  friend class Comm;
};

// An initialised communicator. Dropping it destroys it (ncclCommDestroy), or aborts it if
// abort() was called or an asynchronous error is pending, so a failed peer cannot hang us here.
class Comm {
 public:
  Comm() = default;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  Comm(Comm&& other) noexcept;
  Comm& operator=(Comm&& other) noexcept;
  ~Comm();

  RawComm get() const { return comm_; }
  explicit operator bool() const { return comm_ != nullptr; }
  int rank() const;
  int count() const;
  Result async_error() const;  // success when none
  void abort();
  void destroy();

 private:
  friend class Library;
  Comm(std::shared_ptr<const Api> api, RawComm comm) : api_(std::move(api)), comm_(comm) {}
  void release(bool abort) noexcept;

  std::shared_ptr<const Api> api_;
  RawComm comm_ = nullptr;
};

}  // namespace ddp::nccl

// The CUDA runtime loaded at run time, for workers that must pick their GPU (and the examples'
// buffers, streams and events) without linking CUDA, so they build on machines without it.
//
// Policy: tries libcudart.so.13, .so.12, then libcudart.so (the loader's search, like NCCL's).
// Only the handful of calls below; each failing call throws CudaError naming the call and
// CUDA's own error string. Never dlclose'd (the runtime keeps threads and device state).
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

namespace ddp::worker {

class CudaError : public std::runtime_error {
 public:
  CudaError(int code, const std::string& message) : std::runtime_error(message), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

class CudaRuntime {
 public:
  using Stream = void*;  // cudaStream_t
  using Event = void*;   // cudaEvent_t

  // nullopt with *why set when no CUDA runtime can be loaded.
  static std::optional<CudaRuntime> load(std::string* why = nullptr);

  const std::string& path() const { return path_; }
  int runtime_version() const;  // e.g. 13000
  int device_count() const;
  void set_device(int device) const;
  void* malloc(std::size_t bytes) const;
  void free(void* ptr) const noexcept;
  void copy_to_device(void* dst, const void* src, std::size_t bytes) const;
  void copy_to_host(void* dst, const void* src, std::size_t bytes) const;
  Stream stream_create() const;
  void stream_synchronize(Stream s) const;
  void stream_destroy(Stream s) const noexcept;
  Event event_create() const;
  void event_record(Event e, Stream s) const;
  void event_synchronize(Event e) const;
  float event_elapsed_ms(Event start, Event end) const;
  void event_destroy(Event e) const noexcept;
  void device_synchronize() const;

  struct Api;

 private:
  void check(int code, const char* what) const;
  std::shared_ptr<const Api> api_;
  std::string path_;
};

}  // namespace ddp::worker

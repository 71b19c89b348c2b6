// CUDA runtime loader (policy in cuda_runtime.hpp). The prototypes below are the C API's, with
// enums as int and handles as void*; cudaMemcpyKind values are CUDA's (1 host->device, 2 back).
#include "worker/cuda_runtime.hpp"

#include <dlfcn.h>
#include <link.h>

namespace ddp::worker {

struct CudaRuntime::Api {
  int (*runtime_get_version)(int*) = nullptr;
  int (*get_device_count)(int*) = nullptr;
  int (*set_device)(int) = nullptr;
  int (*malloc)(void**, std::size_t) = nullptr;
  int (*free)(void*) = nullptr;
  int (*memcpy)(void*, const void*, std::size_t, int) = nullptr;
  int (*stream_create)(void**) = nullptr;
  int (*stream_synchronize)(void*) = nullptr;
  int (*stream_destroy)(void*) = nullptr;
  int (*event_create)(void**) = nullptr;
  int (*event_record)(void*, void*) = nullptr;
  int (*event_synchronize)(void*) = nullptr;
  int (*event_elapsed_time)(float*, void*, void*) = nullptr;
  int (*event_destroy)(void*) = nullptr;
  int (*device_synchronize)() = nullptr;
  const char* (*get_error_string)(int) = nullptr;
};

namespace {

constexpr int kMemcpyHostToDevice = 1;
constexpr int kMemcpyDeviceToHost = 2;

template <class Fn>
void resolve(void* handle, const char* name, Fn& out, std::string& missing) {
  void* sym = dlsym(handle, name);
  if (!sym) missing += missing.empty() ? name : std::string(", ") + name;
  out = reinterpret_cast<Fn>(sym);
}

}  // namespace

std::optional<CudaRuntime> CudaRuntime::load(std::string* why) {
  std::string tried;
  for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
    void* handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* e = dlerror();
      tried += std::string(tried.empty() ? "" : "; ") + (e ? e : name);
      continue;
    }
    auto api = std::make_shared<Api>();
    std::string missing;
    resolve(handle, "cudaRuntimeGetVersion", api->runtime_get_version, missing);
    resolve(handle, "cudaGetDeviceCount", api->get_device_count, missing);
    resolve(handle, "cudaSetDevice", api->set_device, missing);
    resolve(handle, "cudaMalloc", api->malloc, missing);
    resolve(handle, "cudaFree", api->free, missing);
    resolve(handle, "cudaMemcpy", api->memcpy, missing);
    resolve(handle, "cudaStreamCreate", api->stream_create, missing);
    resolve(handle, "cudaStreamSynchronize", api->stream_synchronize, missing);
    resolve(handle, "cudaStreamDestroy", api->stream_destroy, missing);
    resolve(handle, "cudaEventCreate", api->event_create, missing);
    resolve(handle, "cudaEventRecord", api->event_record, missing);
    resolve(handle, "cudaEventSynchronize", api->event_synchronize, missing);
    resolve(handle, "cudaEventElapsedTime", api->event_elapsed_time, missing);
    resolve(handle, "cudaEventDestroy", api->event_destroy, missing);
    resolve(handle, "cudaDeviceSynchronize", api->device_synchronize, missing);
    resolve(handle, "cudaGetErrorString", api->get_error_string, missing);
    if (!missing.empty()) {
      tried += std::string(tried.empty() ? "" : "; ") + name + " lacks " + missing;
      dlclose(handle);
      continue;
    }
    CudaRuntime rt;
    link_map* map = nullptr;
    rt.path_ = dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && *map->l_name ? map->l_name : name;
    rt.api_ = std::move(api);
    return rt;
  }
  if (why) *why = "no CUDA runtime (libcudart.so.13/.12) on this node: " + tried;
  return std::nullopt;
}

void CudaRuntime::check(int code, const char* what) const {
  if (code == 0) return;
  const char* s = api_->get_error_string ? api_->get_error_string(code) : nullptr;
  throw CudaError(code, std::string(what) + " failed: " + (s ? s : "CUDA error " + std::to_string(code)));
}

int CudaRuntime::runtime_version() const {
  int v = 0;
  check(api_->runtime_get_version(&v), "cudaRuntimeGetVersion");
  return v;
}

int CudaRuntime::device_count() const {
  int n = 0;
  check(api_->get_device_count(&n), "cudaGetDeviceCount");
  return n;
}

void CudaRuntime::set_device(int device) const {
  check(api_->set_device(device), ("cudaSetDevice(" + std::to_string(device) + ")").c_str());
}

void* CudaRuntime::malloc(std::size_t bytes) const {
  void* p = nullptr;
  check(api_->malloc(&p, bytes), ("cudaMalloc(" + std::to_string(bytes) + " bytes)").c_str());
  return p;
}

void CudaRuntime::free(void* ptr) const noexcept {
  if (ptr) api_->free(ptr);
}

void CudaRuntime::copy_to_device(void* dst, const void* src, std::size_t bytes) const {
  check(api_->memcpy(dst, src, bytes, kMemcpyHostToDevice), "cudaMemcpy(host to device)");
}

void CudaRuntime::copy_to_host(void* dst, const void* src, std::size_t bytes) const {
  check(api_->memcpy(dst, src, bytes, kMemcpyDeviceToHost), "cudaMemcpy(device to host)");
}

CudaRuntime::Stream CudaRuntime::stream_create() const {
  Stream s = nullptr;
  check(api_->stream_create(&s), "cudaStreamCreate");
  return s;
}

void CudaRuntime::stream_synchronize(Stream s) const {
  check(api_->stream_synchronize(s), "cudaStreamSynchronize");
}

void CudaRuntime::stream_destroy(Stream s) const noexcept {
  if (s) api_->stream_destroy(s);
}

CudaRuntime::Event CudaRuntime::event_create() const {
  Event e = nullptr;
  check(api_->event_create(&e), "cudaEventCreate");
  return e;
}

void CudaRuntime::event_record(Event e, Stream s) const {
  check(api_->event_record(e, s), "cudaEventRecord");
}

void CudaRuntime::event_synchronize(Event e) const {
  check(api_->event_synchronize(e), "cudaEventSynchronize");
}

float CudaRuntime::event_elapsed_ms(Event start, Event end) const {
  float ms = 0;
  check(api_->event_elapsed_time(&ms, start, end), "cudaEventElapsedTime");
  return ms;
}

void CudaRuntime::event_destroy(Event e) const noexcept {
  if (e) api_->event_destroy(e);
}

void CudaRuntime::device_synchronize() const {
  check(api_->device_synchronize(), "cudaDeviceSynchronize");
}

}  // namespace ddp::worker

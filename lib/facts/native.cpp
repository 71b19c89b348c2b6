#include "facts/native.hpp"

#include "common/log.hpp"
#include "facts/model.hpp"

#include <dlfcn.h>

namespace ddp::facts::native {

namespace {

// NVML ABI (nvml.h): return codes are ints, 0 = success; handles are opaque pointers.
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
struct nvmlPciInfo_t {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};
struct nvmlMemory_t {
  unsigned long long total, free, used;
};

template <class F>
F sym(void* lib, const char* name) {
  return reinterpret_cast<F>(dlsym(lib, name));
}

std::string cstr(const char* buf, std::size_t n) {
  std::size_t len = 0;
  while (len < n && buf[len]) ++len;
  return std::string(buf, len);
}

}  // namespace

std::string format_nccl_version(int code) {
  int major, minor, patch;
  if (code >= 10000) {
    major = code / 10000;
    minor = (code % 10000) / 100;
    patch = code % 100;
  } else {
    major = code / 1000;
    minor = (code % 1000) / 100;
    patch = code % 100;
  }
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

std::string format_cuda_version(int code) {
  return std::to_string(code / 1000) + "." + std::to_string((code % 1000) / 10);
}

std::optional<NvmlReport> query_nvml() {
  auto log = ddp::log::get("facts");
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    log->debug("NVML not loaded ({}); using sysfs/procfs", dlerror());
    return std::nullopt;
  }
  auto init = sym<nvmlReturn_t (*)()>(lib, "nvmlInit_v2");
  auto shutdown = sym<nvmlReturn_t (*)()>(lib, "nvmlShutdown");
  auto get_count = sym<nvmlReturn_t (*)(unsigned*)>(lib, "nvmlDeviceGetCount_v2");
  auto by_index = sym<nvmlReturn_t (*)(unsigned, nvmlDevice_t*)>(lib, "nvmlDeviceGetHandleByIndex_v2");
  auto get_name = sym<nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned)>(lib, "nvmlDeviceGetName");
  auto get_uuid = sym<nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned)>(lib, "nvmlDeviceGetUUID");
  auto get_pci = sym<nvmlReturn_t (*)(nvmlDevice_t, nvmlPciInfo_t*)>(lib, "nvmlDeviceGetPciInfo_v3");
  auto get_mem = sym<nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*)>(lib, "nvmlDeviceGetMemoryInfo");
  auto get_driver = sym<nvmlReturn_t (*)(char*, unsigned)>(lib, "nvmlSystemGetDriverVersion");
  auto get_cuda = sym<nvmlReturn_t (*)(int*)>(lib, "nvmlSystemGetCudaDriverVersion_v2");
  if (!init || !shutdown || !get_count || !by_index || !get_pci) {
    log->debug("NVML lacks a needed symbol; using sysfs/procfs");
    dlclose(lib);
    return std::nullopt;
  }
  if (int rc = init(); rc != 0) {
    log->debug("nvmlInit failed ({}); using sysfs/procfs", rc);
    dlclose(lib);
    return std::nullopt;
  }
  NvmlReport out;
  char buf[96];
  if (get_driver && get_driver(buf, sizeof buf) == 0) out.driver = cstr(buf, sizeof buf);
  int cuda = 0;
  if (get_cuda && get_cuda(&cuda) == 0 && cuda > 0) out.cuda_driver = format_cuda_version(cuda);
  unsigned n = 0;
  if (get_count(&n) == 0) {
    for (unsigned i = 0; i < n && i < 4096; ++i) {
      nvmlDevice_t dev = nullptr;
      if (by_index(i, &dev) != 0) continue;
      NvmlGpu g;
      g.index = static_cast<int>(i);
      nvmlPciInfo_t pci{};
      if (get_pci(dev, &pci) != 0) continue;
      auto bus = normalize_pci_bus_id(cstr(pci.busId, sizeof pci.busId));
      if (!bus) continue;
      g.pci_bus_id = *bus;
      if (get_name && get_name(dev, buf, sizeof buf) == 0) g.name = cstr(buf, sizeof buf);
      if (get_uuid && get_uuid(dev, buf, sizeof buf) == 0) g.uuid = cstr(buf, sizeof buf);
      nvmlMemory_t mem{};
      if (get_mem && get_mem(dev, &mem) == 0) g.memory_mib = mem.total / (1024 * 1024);
      out.gpus.push_back(std::move(g));
    }
  }
  shutdown();
  dlclose(lib);
  log->debug("NVML: {} GPU(s), driver {}", out.gpus.size(), out.driver.value_or("?"));
  return out;
}

std::optional<NcclReport> query_nccl(const std::string& soname) {
  auto log = ddp::log::get("facts");
  // Kept loaded (no dlclose): unloading NCCL or CUDA libraries is not reliably safe, and this is
  // the library the NCCL helper loads anyway.
  void* lib = dlopen(soname.c_str(), RTLD_LAZY | RTLD_LOCAL);
  if (!lib) {
    log->debug("{} not loaded: {}", soname, dlerror());
    return std::nullopt;
  }
  auto get_version = sym<int (*)(int*)>(lib, "ncclGetVersion");
  int code = 0;
  if (!get_version || get_version(&code) != 0 || code <= 0) return std::nullopt;
  NcclReport r{format_nccl_version(code), std::nullopt};
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(get_version), &info) && info.dli_fname) r.library = info.dli_fname;
  return r;
}

std::optional<std::string> query_cuda_driver() {
  void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (!lib) return std::nullopt;
  auto get = sym<int (*)(int*)>(lib, "cuDriverGetVersion");
  int v = 0;
  if (!get || get(&v) != 0 || v <= 0) return std::nullopt;
  return format_cuda_version(v);
}

}  // namespace ddp::facts::native

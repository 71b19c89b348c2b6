// Run-time loaded NVIDIA libraries: NVML (libnvidia-ml.so.1), NCCL (libnccl.so.2) and the CUDA
// driver (libcuda.so.1). Never linked, no headers needed: the few prototypes are declared here
// from NVIDIA's stable C ABIs. Every function returns nullopt when the library or a symbol is
// missing or a call fails, so a CPU-only node simply reports fewer facts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddp::facts::native {

struct NvmlGpu {
  int index = 0;
  std::string uuid, name, pci_bus_id;  // bus id already normalised
  std::optional<std::uint64_t> memory_mib;
};

struct NvmlReport {
  std::vector<NvmlGpu> gpus;
  std::optional<std::string> driver;
  std::optional<std::string> cuda_driver;  // "12.4"
};

std::optional<NvmlReport> query_nvml();

struct NcclReport {
  std::string version;                 // "2.28.9"
  std::optional<std::string> library;  // the file the loader picked
};
std::optional<NcclReport> query_nccl(const std::string& soname);

// cuDriverGetVersion (needs no cuInit, hence no GPU): "13.0".
std::optional<std::string> query_cuda_driver();

// NCCL's integer version code -> "major.minor.patch" (2.9+ uses major*10000+minor*100+patch,
// older ones major*1000+minor*100+patch). Pure; exposed for tests.
std::string format_nccl_version(int code);
// CUDA's integer version (12040) -> "12.4".
std::string format_cuda_version(int code);

}  // namespace ddp::facts::native

// Discovery: this node's facts, from sysfs/procfs under one root directory, plus NVML and
// libnccl loaded at run time when the root is the live "/".
//
// Sources, by field (first that answers wins):
//  - GPUs: NVML (its list and index order) > /proc/driver/nvidia/gpus/*/information > PCI scan
//    (vendor 0x10de, class 0x0300/0x0302). NUMA node, local CPUs and the PCI chain always from
//    sysfs (/sys/bus/pci/devices/<bdf>). Without NVML, index = position in PCI bus order, which
//    is NVML's and nvidia-smi's default order.
//  - NICs: every /sys/class/infiniband HCA port (kind ib, RoCE included: NCCL drives it through
//    verbs) and every physical Ethernet interface of /sys/class/net (one with a `device` link
//    and type 1) that is not an HCA's own netdev. Virtual interfaces (bridges, veth, bonds) are
//    not NICs here.
//  - driver: NVML > /proc/driver/nvidia/version > /sys/module/nvidia/version.
//    cuda_driver: NVML > libcuda's cuDriverGetVersion (live only).
//  - nccl: ncclGetVersion of `nccl_library` as the dynamic loader finds it (live only): the
//    library that workers started by ddpctl load, unless their container or Python wheel
//    brings its own.
//  - torch: `__version__` from torch/version.py under the system Python's dist-packages or
//    site-packages (reading a file costs microseconds; starting Python to import torch costs
//    seconds). A virtualenv's or container's torch is not seen.
//  - limits: /proc/self/limits (memlock, nofile: this process's, which workers inherit);
//    /dev/shm: statvfs when live, else the tmpfs size= in /proc/mounts.
//  - addresses: getifaddrs (live only).
// A missing or unreadable file makes a field absent; discovery never throws for the layout.
#pragma once

#include "facts/model.hpp"

#include <filesystem>
#include <string>

namespace ddp::facts {

struct DiscoverOptions {
  std::filesystem::path root = "/";  // sysfs/procfs root; "/" is the live machine
  bool use_nvml = true;              // try libnvidia-ml.so.1 (only when root is "/")
  bool load_libraries = true;        // try libnccl.so.2 / libcuda.so.1 (only when root is "/")
  std::string nccl_library = "libnccl.so.2";
  // Only what placement needs (NUMA nodes, GPUs, NICs): no versions, limits, runtimes or torch.
  // The launcher plans bindings on every launch; this keeps that off its start-up path.
  bool topology_only = false;
};

// Defaults, with root from DDP_SYSFS_ROOT when set.
DiscoverOptions discover_options_from_env();

NodeFacts discover(const DiscoverOptions& options);

}  // namespace ddp::facts

// Pure parsers of the files discovery reads, exposed for tests.
namespace ddp::facts::parse {

struct NvidiaInformation {
  std::optional<std::string> model, uuid, bus_location;
};
// /proc/driver/nvidia/gpus/<bdf>/information: "Model: \t\t NVIDIA H100 80GB HBM3" lines.
NvidiaInformation nvidia_information(std::string_view text);
// /proc/driver/nvidia/version: "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  ..."
std::optional<std::string> nvidia_driver_version(std::string_view text);
// /proc/self/limits row by its name ("Max locked memory"); values "unlimited" or a number.
std::optional<Limit> proc_limit(std::string_view text, std::string_view row);
// ports/N/rate: "400 Gb/sec (4X NDR)" -> 400000 Mb/s.
std::optional<std::uint64_t> ib_rate_mbps(std::string_view text);
// ports/N/state: "4: ACTIVE" -> "active".
std::string ib_state(std::string_view text);
// tmpfs size of a mount point from /proc/mounts ("size=65536k"); nullopt if not given.
std::optional<std::uint64_t> tmpfs_size(std::string_view mounts, std::string_view mount_point);
// torch/version.py: __version__ = '2.3.0+cu121'
std::optional<std::string> torch_version(std::string_view text);
// The last PCI bus id in a sysfs path ("/sys/devices/pci0000:00/0000:00:03.0/virtio2" -> 0000:00:03.0).
std::optional<std::string> last_pci_bus_id(std::string_view sysfs_path);

}  // namespace ddp::facts::parse

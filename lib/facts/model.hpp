// The node-facts model: what one node is, as discovery finds it and as facts files carry it.
//
// Pure: plain structs, JSON (de)serialisation, cpulist and PCI bus id helpers. No I/O except
// load_facts_file(). The JSON shape is proto/node-facts.schema.json; keep the two in step.
//
// Reading policy (files come from other ddpctl versions and from hand-edits):
//  - `hostname`, `numa_nodes`, `gpus` and `nics` are required; everything else may be absent.
//  - unknown fields are ignored and reported as notes, never as errors.
//  - a wrong type or a malformed value (cpulist, PCI bus id) is an error naming the file and
//    the JSON path ("node2.json: gpus[3].pci_bus_id: ...").
//  - NUMA node -1 (what sysfs says on single-node machines) is read as 0.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::facts {

inline constexpr int kFactsVersion = 1;

struct NumaNode {
  int id = 0;
  std::string cpus;  // kernel cpulist, e.g. "0-55,112-167"
};

struct Gpu {
  int index = 0;                      // NVML index, else position in PCI bus order
  std::optional<std::string> uuid;    // "GPU-xxxxxxxx-...", what CUDA_VISIBLE_DEVICES takes
  std::optional<std::string> name;    // "NVIDIA H100 80GB HBM3"
  std::optional<std::string> pci_id;  // "10de:2330" (vendor:device), the model when no name is known
  std::string pci_bus_id;             // "0000:18:00.0", always lowercase, 4-digit domain
  std::optional<std::uint64_t> memory_mib;
  int numa_node = 0;
  std::optional<std::string> local_cpus;  // cpulist of the CPUs near the device (sysfs local_cpulist)
  std::optional<std::string> sysfs_path;  // "/sys/devices/pci0000:15/.../0000:18:00.0": the PCI
                                          // chain, which shows the switch a GPU shares with a NIC
};

enum class NicKind { ib, eth };

struct Nic {
  std::string name;  // HCA ("mlx5_0") for ib, interface ("eno1") for eth
  NicKind kind = NicKind::eth;
  std::optional<int> port;                // HCA port (ib only), for NCCL_IB_HCA=mlx5_0:1
  std::optional<std::string> link_layer;  // "infiniband" | "ethernet" (RoCE) for ib
  std::optional<std::string> netdev;      // the IP interface (for eth, = name; for ib, IPoIB/RoCE netdev)
  std::optional<std::string> pci_bus_id;
  int numa_node = 0;
  std::optional<std::uint64_t> speed_mbps;
  std::optional<std::string> state;    // eth: operstate ("up", "down", ...); ib: port state ("active", "down", ...)
  std::vector<std::string> addresses;  // IP addresses of netdev ("10.0.0.1/24"); live discovery only
  std::optional<std::string> local_cpus;
  std::optional<std::string> sysfs_path;
};

struct Versions {
  std::optional<std::string> driver;        // NVIDIA kernel driver, "550.54.15"
  std::optional<std::string> cuda_driver;   // CUDA version the driver supports, "12.4"
  std::optional<std::string> nccl;          // as libnccl.so.2 (the workers' one) reports it, "2.28.9"
  std::optional<std::string> nccl_library;  // which file that was
  std::optional<std::string> torch;         // the job's interpreter's (python.torch) when probed,
                                            // else torch/version.py of the system Python, if any
                                            // (torch_shown says which a reader is looking at)
  std::optional<std::string> kernel;        // "6.1.0-18-amd64"
};

// An rlimit value: nullopt bytes/count means unlimited.
struct Limit {
  std::optional<std::uint64_t> soft;  // nullopt: unlimited
  std::optional<std::uint64_t> hard;  // nullopt: unlimited
  bool soft_unlimited() const { return !soft.has_value(); }
};

struct Limits {
  std::optional<Limit> memlock;            // bytes
  std::optional<Limit> nofile;             // count
  std::optional<std::uint64_t> shm_bytes;  // size of /dev/shm
};

// A container image as this node has it (`ddpctl doctor --image`/`--job`): see
// lib/container's ImageIdentity for what `digest` is and why it is what nodes compare.
struct ContainerImage {
  std::string runtime, image;
  std::optional<std::string> digest;       // absent: not resolved (see error)
  std::optional<std::string> repo_digest;  // the registry's manifest digest, for information
  std::optional<std::string> error;        // why there is no digest ("not present on this node")
};
// How an agent's `error` begins when it did not look (its policy, or its lookups all busy):
// `doctor` then warns that the node went unchecked instead of calling the image missing.
inline constexpr const char* kImageNotChecked = "not checked: ";

// The Python a job runs on this node and its PyTorch, as lib/pyenv's probe found them: the
// interpreter run as the job's user, with the job's environment, in its workdir (or image).
struct PythonFacts {
  std::string interpreter;                // what was run: a resolved path, or a wrapper's argv joined
  std::string source;                     // why that one ("command", "python: key", a guess)
  std::optional<std::string> executable;  // sys.executable's real path, as the interpreter said
  std::optional<std::string> version;     // "3.11.2"
  std::optional<std::string> torch;       // "2.11.0+cu128"; absent: no torch there (or see error)
  std::optional<std::string> error;       // why nothing is known (not found, timed out, ...)
  bool guessed = false;                   // a guess (python3 on PATH), maybe not what the job runs
};

// How a guess's `source` begins: one made for a job whose command is not a Python (lib/pyenv),
// and doctor's without --job. Facts written before `guessed` existed are read as a guess by
// these, not as the job's own interpreter.
inline constexpr std::string_view kGuessedSourcePrefix = "a guess:";
inline constexpr std::string_view kNoJobSourcePrefix = "python3 on PATH (";

struct NodeFacts {
  std::string hostname;
  std::vector<NumaNode> numa_nodes;
  std::vector<Gpu> gpus;
  std::vector<Nic> nics;
  Versions versions;
  Limits limits;
  std::optional<std::vector<std::string>> container_runtimes;  // nullopt: not looked at
  std::optional<ContainerImage> container_image;               // nullopt: none asked about
  std::optional<PythonFacts> python;                           // nullopt: not probed
  std::vector<std::string> sources;  // how facts were found ("nvml", "procfs", "sysfs", "file:...")
};

class FactsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::string_view to_string(NicKind k);

nlohmann::json to_json(const NodeFacts& facts);
nlohmann::json to_json(const PythonFacts& python);

// The probed interpreter's answer becomes the node's: versions.torch is then python.torch (absent
// for an interpreter without torch or one that did not answer), never the system Python's beside it.
void set_python(NodeFacts& node, PythonFacts python);

// The node's torch as doctor shows it, and whose it is: the probed interpreter's ("none" without
// one, "-" when it did not answer), else the system Python's torch/version.py ("-" without one).
struct TorchShown {
  std::string value;
  bool of_system_python = false;  // no interpreter was asked: maybe not the job's
};
TorchShown torch_shown(const NodeFacts& node);
// `source` names the input in errors and notes (a file name, "node2's report").
NodeFacts from_json(const nlohmann::json& j, std::string_view source, std::vector<std::string>* notes = nullptr);
// Reads and parses a facts file; errors (FactsError) name the file and what is wrong.
NodeFacts load_facts_file(const std::filesystem::path& path, std::vector<std::string>* notes = nullptr);

// cpulists: "0-3,8,10-11" <-> sorted unique CPU ids. Rejects garbage, descending ranges and ids
// above kMaxCpuId (a bound so that a hostile "0-4000000000" cannot allocate gigabytes).
inline constexpr int kMaxCpuId = 65535;
std::optional<std::vector<int>> parse_cpulist(std::string_view s);
std::string format_cpulist(const std::vector<int>& cpus);

// "0000:18:00.0", "00000000:18:00.0" (NVML), "18:00.0" or upper case -> "0000:18:00.0"; nullopt if malformed.
std::optional<std::string> normalize_pci_bus_id(std::string_view s);

// Total NVIDIA GPUs, for `nproc_per_node: gpu`.
inline std::size_t gpu_count(const NodeFacts& f) {
  return f.gpus.size();
}

}  // namespace ddp::facts

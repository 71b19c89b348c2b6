// Topology-aware binding: where each local rank of a node runs, planned from the node's facts.
//
// Pure: facts, the number of local ranks, the job's `binding:` and the CPUs the launcher may use
// in; one RankBinding per local rank out. Nothing here touches the machine; the launcher puts
// the variables into each rank's environment and applies `cpus` (sched_setaffinity) and
// `mem_node` (a preferred memory policy) in the child before exec.
//
// Policy:
//  - GPUs: rank r gets the r-th GPU in PCI bus id order (stable, unlike CUDA's default order).
//    CUDA_VISIBLE_DEVICES lists every GPU of the job by UUID in local-rank order, so an unchanged
//    `torch.cuda.set_device(LOCAL_RANK)` opens the rank's own GPU; `isolate` lists only its own.
//    Ranks beyond the GPU count get no GPU binding (said in `reason`).
//  - CPUs: the CPUs of the GPU's NUMA node (GPU-less ranks: NUMA nodes round-robin), intersected
//    with `allowed`, so that applying them cannot fail for lack of permission. `exclusive` splits
//    a node's CPUs evenly among the ranks that share it.
//  - Memory: a rank bound to CPUs prefers its NUMA node's memory, on a machine of more than one
//    NUMA node. On a machine of one there is nothing to prefer, and the rank keeps the default
//    policy, as a process started by hand has it.
//  - NIC: the nearest NIC (longest common PCI path, i.e. the same switch, else the same NUMA
//    node), spread so that no two ranks share one while another on their node is idle. It is
//    informational; NCCL_IB_HCA is job-wide: "=" and every IB device (with its port) of the node,
//    so NCCL still sees every rail and chooses per GPU itself. `nic: rank` (opt-in, until a
//    multi-GPU measurement shows it helps) restricts each rank to its own nearest IB device.
#pragma once

#include "facts/model.hpp"
#include "jobspec/jobspec.hpp"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace ddp::binding {

using BindingSpec = jobspec::BindingSpec;

struct RankBinding {
  int local_rank = 0;
  std::optional<int> gpu;                           // facts index of the rank's GPU
  std::optional<std::string> cuda_visible_devices;  // nullopt: leave the variable alone
  std::optional<int> numa_node;                     // nullopt: no NUMA binding
  std::vector<int> cpus;                            // empty: no CPU binding
  std::optional<int> mem_node;                      // the memory node to prefer; nullopt: the default policy
  std::optional<std::string> nic;
  std::optional<std::string> nccl_ib_hca;  // nic: rank only: "=mlx5_3:1", the rank's own HCA
  std::vector<std::string> reasons;        // why, one short clause each

  std::string reason() const;  // reasons joined with "; "
};

struct Plan {
  std::vector<RankBinding> ranks;
  std::optional<std::string> nccl_ib_hca;  // "=mlx5_0:1,mlx5_1:1"; nullopt: no IB device or nic: none
};

// `allowed`: the CPUs the launcher may use (its affinity mask); nullopt when planning for
// recorded facts of another node, where this machine's mask means nothing.
Plan plan_binding(const facts::NodeFacts& facts, int nproc, const BindingSpec& spec,
                  const std::optional<std::vector<int>>& allowed = std::nullopt);

// NCCL_IB_HCA entries of a node: each InfiniBand/RoCE device with its port ("mlx5_0:1"), sorted.
std::vector<std::string> ib_hcas(const facts::NodeFacts& facts);

// The job-wide NCCL_IB_HCA of a multi-node job: "=" and the entries every node has, in sorted
// order; nullopt when the nodes share none (NCCL then picks per node, or uses sockets where a
// node has no IB device). An entry one node lacks is left out: NCCL would try it on every node.
std::optional<std::string> common_ib_hca(const std::vector<std::vector<std::string>>& per_node);

// The node's facts narrowed to the GPUs an agent manages (`ddp-agentd --gpus`). A selector is
// an index in PCI bus id order ("0"), a UUID ("GPU-8a1f...") or a PCI bus id ("0000:18:00.0",
// "18:00.0"); the kept GPUs stay in PCI order. Throws std::invalid_argument naming a selector
// that matches no GPU, or one GPU named twice.
facts::NodeFacts restrict_gpus(facts::NodeFacts facts, const std::vector<std::string>& selectors);

// {"gpu", "cuda_visible_devices", "numa_node", "cpus" (cpulist), "mem_node", "nic", "nccl_ib_hca" (nic: rank),
// "reason"}; null
// where unset.
nlohmann::json to_json(const RankBinding& rank);

}  // namespace ddp::binding

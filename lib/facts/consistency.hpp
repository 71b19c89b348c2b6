// Consistency: several nodes' facts + what the job needs in, findings out. Pure (no I/O).
//
// What is checked, and why it is an error or a warning (a preflight exists to fail before a
// job burns an allocation, so "would make NCCL fail or hang" is an error):
//  GPU jobs
//   - every node has a GPU (error); same GPU count on every node (error: nproc_per_node: gpu
//     would give nodes different local world sizes); same GPU model (warning: it runs, at the
//     slowest GPU's pace).
//   - same NCCL version (error: NCCL refuses peers of another version at init); same driver
//     version and CUDA driver version (error: mixed drivers are the classic cause of NCCL's
//     "unhandled cuda error"/hangs); a node whose version is unknown (warning).
//   - NICs: RDMA (ib) on some nodes only (error: NCCL picks IB where it finds it and sockets
//     elsewhere, and the two cannot connect; set NCCL_IB_DISABLE=1 or fix the node); RDMA
//     expected by the job but missing (error); IB ports that are not active (warning);
//     a different number of active IB ports (warning: rails differ).
//   - memlock (soft) where RDMA is used: unlimited is right; below 1 GiB is an error (NCCL's
//     IB transport registers buffers and ibv_reg_mr fails), finite above that a warning.
//   - /dev/shm on nodes with 2+ GPUs: below 256 MiB an error (Docker's 64 MiB default breaks
//     NCCL's shared-memory transport), below 1 GiB a warning.
//  Every job
//   - nofile (soft) below 2*world_size + 256 is an error (the store on node rank 0 holds a
//     connection per rank, gloo and NCCL hold sockets per peer, plus the libraries' own), below
//     4096 a warning (DataLoader workers passing tensors by fd exhaust 1024 quickly).
//   - /dev/shm below 1 GiB (warning: DataLoader workers share batches through it).
//   - the job's PyTorch (facts' python.torch, else versions.torch): another release (major.minor)
//     on a node is an error (collectives, the store's wire and pickles differ between releases)
//     when every node's job interpreter was asked, a warning where some torch is only the system
//     Python's; another build of one release a warning. The job's Python minor version differs: an
//     error (pickles and extension modules).
//   - an interpreter that answered without torch, on any node (python-no-torch): an error where
//     it is the job's own (its python: key or its command's program: the job would stop at
//     `import torch`), a warning where it is a guess (python3 on PATH). One that did not answer
//     (python-unknown): a warning, as what the job imports is not known.
//   - kernel versions differ (info); the same hostname twice,
//     or a GPU UUID on two nodes (error: the same node was described twice).
//   - CPU jobs: GPU, driver and NCCL differences are info only.
// Versions are compared as strings; "unknown" (absent) never equals anything.
#pragma once

#include "facts/model.hpp"

#include <optional>
#include <string>
#include <vector>

namespace ddp::facts {

enum class Severity { info, warning, error };
std::string_view to_string(Severity s);

struct Finding {
  Severity severity = Severity::info;
  std::string code;                // stable, e.g. "nccl-version-mismatch"
  std::string message;             // names the nodes and the values
  std::vector<std::string> nodes;  // nodes concerned (empty: all)
};

struct JobNeeds {
  bool gpu = true;                // the job runs one rank per GPU (NCCL)
  std::optional<bool> rdma;       // nullopt: use RDMA if all nodes have it
  std::optional<int> world_size;  // nullopt: GPUs (GPU job) or one per node (CPU job)
};

// Default for `ddpctl doctor`: the job needs GPUs iff any node has one.
JobNeeds default_job_needs(const std::vector<NodeFacts>& nodes);

std::vector<Finding> check_consistency(const std::vector<NodeFacts>& nodes, const JobNeeds& job);

bool has_errors(const std::vector<Finding>& findings);

// The nodes' digests of a job's container image ({node, digest} in the nodes' order; an empty
// digest is not known and not compared). nullopt when every known digest is the same; else a
// message naming each digest and the nodes that have it, biggest group first.
std::optional<std::string> image_disagreement(const std::string& image,
                                              const std::vector<std::pair<std::string, std::string>>& node_digests);

nlohmann::json to_json(const Finding& f);

}  // namespace ddp::facts

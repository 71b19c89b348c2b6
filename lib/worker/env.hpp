// The worker side of the env contract (DESIGN.md "Worker environment contract"): what ddpctl,
// like torchrun, tells each worker, read into one struct.
//
// Policy: pure (the environment comes through a lookup function; worker_env_from_process reads
// the real one). Integers are strict decimals; every problem is collected and reported at once,
// naming the variable and its value, so one run shows everything that is wrong. Ranges are
// checked against each other (RANK < WORLD_SIZE, LOCAL_RANK < LOCAL_WORLD_SIZE <= WORLD_SIZE).
#pragma once

#include "nccl/unique_id.hpp"

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace ddp::worker {

struct WorkerEnv {
  int rank = 0;                                  // RANK: global rank
  int world_size = 1;                            // WORLD_SIZE
  int local_rank = 0;                            // LOCAL_RANK: rank on this node; also the CUDA device index
  int local_world_size = 1;                      // LOCAL_WORLD_SIZE
  int group_rank = 0;                            // GROUP_RANK: node rank (0 when absent)
  int group_world_size = 1;                      // GROUP_WORLD_SIZE: nodes (1 when absent)
  std::string master_addr;                       // MASTER_ADDR (empty when not required and absent)
  int master_port = 0;                           // MASTER_PORT (0 when not required and absent)
  int restart_count = 0;                         // TORCHELASTIC_RESTART_COUNT: > 0 means resume from a checkpoint
  int max_restarts = 0;                          // TORCHELASTIC_MAX_RESTARTS
  std::string run_id;                            // TORCHELASTIC_RUN_ID
  std::string job_id;                            // DDP_JOB_ID (ddpctl only)
  std::string node_name;                         // DDP_NODE (ddpctl only)
  std::optional<nccl::UniqueId> nccl_unique_id;  // DDP_NCCL_UNIQUE_ID (job asked for one)
};

struct EnvOptions {
  bool require_rendezvous = true;  // MASTER_ADDR / MASTER_PORT must be set
  bool require_nccl_id = false;    // DDP_NCCL_UNIQUE_ID must be set
  // When false, a program started by hand on one node may leave out LOCAL_RANK (defaults to
  // RANK) and LOCAL_WORLD_SIZE (defaults to WORLD_SIZE).
  bool require_local = true;
};

// Thrown with every problem found, one per line after a headline.
class EnvError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

using EnvLookup = std::function<std::optional<std::string>(std::string_view name)>;

WorkerEnv parse_worker_env(const EnvLookup& lookup, const EnvOptions& options = {});
WorkerEnv worker_env_from_process(const EnvOptions& options = {});

}  // namespace ddp::worker

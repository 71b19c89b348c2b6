// Communicator set-up from the broadcast id (order of calls in comm.hpp).
#include "worker/comm.hpp"

#include "common/log.hpp"
#include "nccl/holder_protocol.hpp"

#include <chrono>
#include <string>

namespace ddp::worker {

nccl::Comm init_comm(const nccl::Library& nccl, const WorkerEnv& env) {
  if (!env.nccl_unique_id) {
    throw EnvError(std::string(nccl::holder::kEnvVar) +
                   " is not set: this program needs an NCCL unique id (set nccl.unique_id: on in the job file)");
  }
  return init_comm(nccl, *env.nccl_unique_id, env.world_size, env.rank);
}

nccl::Comm init_comm(const nccl::Library& nccl, const nccl::UniqueId& id, int world_size, int rank) {
  auto log = ddp::log::get("nccl");
  auto root = nccl::decode_bootstrap_address(id);
  std::string where = root ? root.value->endpoint() : "unknown (" + root.error + ")";
  log->debug("rank {} of {}: ncclCommInitRank through bootstrap root {}", rank, world_size, where);
  auto start = std::chrono::steady_clock::now();
  try {
    auto comm = nccl.init_rank(world_size, id, rank);
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    log->debug("rank {} of {}: communicator ready in {} ms", rank, world_size, ms.count());
    return comm;
  } catch (const nccl::Error& e) {
    throw nccl::Error(e.code(), std::string(e.what()) + " (bootstrap root " + where +
                                    "; is the id holder of this attempt still alive and reachable on the "
                                    "workers' NCCL_SOCKET_IFNAME?)");
  }
}

}  // namespace ddp::worker

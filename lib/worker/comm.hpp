// An NCCL communicator for this worker, from the id the launcher broadcast (DDP_NCCL_UNIQUE_ID).
//
// Order of calls in a worker (NCCL binds a communicator to the device current at init):
//   auto env  = ddp::worker::worker_env_from_process({.require_nccl_id = true});
//   auto cuda = ddp::worker::CudaRuntime::load();   cuda.set_device(env.local_rank);
//   auto nccl = ddp::nccl::Library::load();
//   auto comm = ddp::worker::init_comm(nccl, env);  // blocks until every rank has joined
// A program that links the CUDA runtime itself calls cudaSetDevice(LOCAL_RANK) instead.
// Every GPU of the node is visible, in local-rank order, so LOCAL_RANK is the device index.
#pragma once

#include "nccl/library.hpp"
#include "worker/env.hpp"

namespace ddp::worker {

// ncclCommInitRank(world_size, DDP_NCCL_UNIQUE_ID, rank). Throws EnvError when the env carries
// no id, nccl::Error (naming rank, world and the id's bootstrap root) when NCCL fails.
nccl::Comm init_comm(const nccl::Library& nccl, const WorkerEnv& env);
nccl::Comm init_comm(const nccl::Library& nccl, const nccl::UniqueId& id, int world_size, int rank);

}  // namespace ddp::worker

// A node's binding plan (lib/binding) laid onto its workers' plan (lib/contract), the same for a
// local launch and for an agent's share of a multi-node job.
//
// Policy: each rank's CUDA_VISIBLE_DEVICES and the node's NCCL_IB_HCA go into its environment
// unless the rank already has a value (the job's env: or a forwarded variable wins, and the
// plan's reason says so); the CPUs and memory node go to the child, which applies them before
// exec; the plan shows the whole binding per rank.
#pragma once

#include "binding/binding.hpp"
#include "contract/contract.hpp"

namespace ddp::launch {

void lay_binding(contract::Plan& plan, const binding::Plan& b);

}  // namespace ddp::launch

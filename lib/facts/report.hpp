// Human-readable rendering of facts and findings (what `ddpctl doctor` prints). Pure.
#pragma once

#include "facts/consistency.hpp"
#include "facts/model.hpp"

#include <string>
#include <vector>

namespace ddp::facts {

// One node, as sections of aligned tables.
std::string format_node(const NodeFacts& facts);
// Several nodes, one row each (GPUs, NICs, versions) for side-by-side comparison.
std::string format_nodes_summary(const std::vector<NodeFacts>& nodes);
// Findings, errors first, then a one-line verdict.
std::string format_findings(const std::vector<Finding>& findings);
// "80 GiB", "512 MiB", "unlimited".
std::string format_bytes(std::uint64_t bytes);

}  // namespace ddp::facts

// Sizes as job and config files write them (logs.max_size, store.max_size, agent.yaml's limits).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace ddp {

// Digits, optional spaces, and a unit of B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB,
// TB (of 1000). nullopt if malformed or above 1 PiB (a typo, and no overflow).
std::optional<std::uint64_t> parse_size(std::string_view s);

}  // namespace ddp

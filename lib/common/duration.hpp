// Durations as people write them in job files and flags: "30s", "10m", "1h30m", "250ms", or a
// bare number of seconds.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

namespace ddp {

using Millis = std::chrono::milliseconds;

std::optional<Millis> parse_duration(std::string_view text);
std::string format_duration(Millis d);

}  // namespace ddp

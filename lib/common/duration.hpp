// Durations as people write them in job files and flags: "30s", "10m", "1h30m", "250ms", "1.5s",
// or a bare number of seconds ("90", "0.5"); to the millisecond.
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

namespace ddp {

using Millis = std::chrono::milliseconds;

std::optional<Millis> parse_duration(std::string_view text);
std::string format_duration(Millis d);

// a - b for times a peer sent (any 64-bit count of microseconds): held at the nearer end of the
// range where the difference would overflow.
inline std::chrono::microseconds saturating_minus(std::chrono::microseconds a, std::chrono::microseconds b) {
  std::int64_t d = 0;
  if (__builtin_sub_overflow(a.count(), b.count(), &d)) {
    d = b.count() > 0 ? std::numeric_limits<std::int64_t>::min() : std::numeric_limits<std::int64_t>::max();
  }
  return std::chrono::microseconds(d);
}

}  // namespace ddp

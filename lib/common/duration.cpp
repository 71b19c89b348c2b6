#include "common/duration.hpp"

#include <fmt/format.h>
#include <cctype>

namespace ddp {

// 1000 days: far beyond any timeout, far below what steady_clock arithmetic can overflow.
constexpr long long kMaxMillis = 1000LL * 24 * 3600 * 1000;

std::optional<Millis> parse_duration(std::string_view text) {
  if (text.empty()) return std::nullopt;
  long long total_ms = 0;
  std::size_t i = 0;
  bool any_unit = false;
  while (i < text.size()) {
    std::size_t start = i;
    long long value = 0;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      value = value * 10 + (text[i] - '0');
      if (value > 1'000'000'000LL) return std::nullopt;  // far beyond any sane timeout
      ++i;
    }
    if (i == start) return std::nullopt;
    // A fraction ("1.5s", "0.25"): kept exact, so it must come to whole milliseconds.
    long long frac = 0, scale = 1;
    if (i < text.size() && text[i] == '.') {
      const std::size_t fstart = ++i;
      while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
        if (i - fstart >= 9) return std::nullopt;
        frac = frac * 10 + (text[i] - '0');
        scale *= 10;
        ++i;
      }
      if (i == fstart) return std::nullopt;  // "1.s"
    }
    std::size_t ustart = i;
    while (i < text.size() && std::isalpha(static_cast<unsigned char>(text[i]))) ++i;
    std::string_view unit = text.substr(ustart, i - ustart);
    long long mult;
    if (unit.empty()) {
      if (any_unit || i != text.size()) return std::nullopt;  // "5" alone means seconds
      mult = 1000;
    } else if (unit == "ms") {
      mult = 1;
    } else if (unit == "s") {
      mult = 1000;
    } else if (unit == "m") {
      mult = 60'000;
    } else if (unit == "h") {
      mult = 3'600'000;
    } else {
      return std::nullopt;
    }
    any_unit = any_unit || !unit.empty();
    if ((frac * mult) % scale != 0) return std::nullopt;  // finer than a millisecond
    total_ms += value * mult + frac * mult / scale;
    if (total_ms > kMaxMillis) return std::nullopt;
  }
  return Millis(total_ms);
}

std::string format_duration(Millis d) {
  auto ms = d.count();
  if (ms % 1000 != 0) return fmt::format("{}ms", ms);
  auto s = ms / 1000;
  if (s % 3600 == 0 && s) return fmt::format("{}h", s / 3600);
  if (s % 60 == 0 && s) return fmt::format("{}m", s / 60);
  return fmt::format("{}s", s);
}

}  // namespace ddp

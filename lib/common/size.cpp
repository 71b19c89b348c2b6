#include "common/size.hpp"

#include <charconv>

namespace ddp {

std::optional<std::uint64_t> parse_size(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size() && i < 15 && s[i] >= '0' && s[i] <= '9') ++i;
  if (i == 0 || (i < s.size() && s[i] >= '0' && s[i] <= '9')) return std::nullopt;
  std::uint64_t n = 0;
  std::from_chars(s.data(), s.data() + i, n);
  auto unit = s.substr(i);
  while (!unit.empty() && (unit.front() == ' ' || unit.front() == '\t')) unit.remove_prefix(1);
  struct Unit {
    std::string_view name;
    std::uint64_t mult;
  };
  static constexpr Unit kUnits[] = {{"", 1},
                                    {"B", 1},
                                    {"KiB", 1ull << 10},
                                    {"MiB", 1ull << 20},
                                    {"GiB", 1ull << 30},
                                    {"TiB", 1ull << 40},
                                    {"KB", 1000ull},
                                    {"MB", 1000'000ull},
                                    {"GB", 1000'000'000ull},
                                    {"TB", 1000'000'000'000ull}};
  for (const auto& u : kUnits) {
    if (unit == u.name) return n <= (1ull << 50) / u.mult ? std::optional<std::uint64_t>(n * u.mult) : std::nullopt;
  }
  return std::nullopt;
}

}  // namespace ddp

// SLURM-style host lists, as typed after `--nodes` and written in job files' `hosts:`.
//
// Grammar (one item per comma at bracket depth 0; spaces around items are ignored):
//   list  := item (',' item)*
//   item  := (text | '[' range (',' range)* ']')+        e.g. node[01-04,07]-ib[0-1]:29410
//   range := digits | digits '-' digits                  zero padding = width of the low end
// Several brackets in one item expand as a cartesian product, leftmost bracket slowest
// (SLURM's order: n[1-2]-ib[0-1] -> n1-ib0 n1-ib1 n2-ib0 n2-ib1). A bracket holding a ':' is
// an IPv6 literal ("[fe80::1]:29410") and is kept verbatim, never expanded.
//
// Policy: errors are values with a 1-based column; the expanded size is computed and checked
// against a bound before any name is built, so "n[1-999999999]" costs nothing. Order is
// preserved (node ranks follow it), so compress() never sorts: expand(compress(x)) == x.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::hostlist {

// 65536 hosts: well above any cluster a launcher drives from one list, low enough that a
// typo like n[1-10000000] is refused instead of allocating gigabytes.
inline constexpr std::size_t kDefaultMaxHosts = 65536;

struct Error {
  std::size_t column = 0;  // 1-based position in the input; 0 when not tied to a position
  std::string message;
  std::string to_string() const;  // "column 7: expected ']'"
};

struct Options {
  std::size_t max_hosts = kDefaultMaxHosts;
  bool allow_duplicates = false;  // a host listed twice is almost always a typo in --nodes
};

// Either hosts or an error; `ok()` says which.
struct Expansion {
  std::vector<std::string> hosts;
  std::optional<Error> error;
  bool ok() const { return !error.has_value(); }
};

Expansion expand(std::string_view list, const Options& options = {});

// How many hosts `list` expands to, without building them (same errors as expand, minus
// duplicates and the size bound).
std::optional<std::size_t> count(std::string_view list);

// The shortest order-preserving form: runs of consecutive numbers that share prefix, suffix
// and zero padding fold into brackets ("n1,n2,n3,n5" -> "n[1-3,5]"). Names that hold '[', ']'
// or ',' are emitted as they are.
std::string compress(const std::vector<std::string>& hosts);

// "host", "host:port", "[v6addr]:port", "[v6addr]", each optionally after "user@" (an SSH login
// name) -> user, host and port.
struct Endpoint {
  std::string user;  // empty when not given
  std::string host;  // without the IPv6 brackets
  std::optional<std::uint16_t> port;
  bool operator==(const Endpoint&) const = default;
};
struct EndpointParse {
  Endpoint endpoint;
  std::optional<Error> error;
  bool ok() const { return !error.has_value(); }
};
EndpointParse parse_endpoint(std::string_view text);

}  // namespace ddp::hostlist

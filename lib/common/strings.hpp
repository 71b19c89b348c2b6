// Small string helpers shared by the parsers (job file, cpulists, hostlists, env).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp {

std::vector<std::string_view> split(std::string_view s, char sep);
std::string_view trim(std::string_view s);
std::string join(const std::vector<std::string>& parts, std::string_view sep);
// join() of the first `limit` parts, then "and N more": a list for a log line that stays a line
// at 4096 nodes.
std::string join_first(const std::vector<std::string>& parts, std::string_view sep, std::size_t limit);
bool starts_with(std::string_view s, std::string_view prefix);
// "0-3,5,7-8": sorted, de-duplicated, runs collapsed (a run of two is "7,8").
std::string format_rank_list(std::vector<int> ranks);

// Levenshtein distance, for "did you mean" hints.
std::size_t edit_distance(std::string_view a, std::string_view b);
// The candidate nearest to `word` if it is plausibly a typo of it (distance <= max(2, len/3)).
std::optional<std::string> nearest(std::string_view word, const std::vector<std::string>& candidates);

// Strict decimal integer parse of the whole string (no sign for unsigned callers to misuse).
std::optional<long long> parse_int(std::string_view s);

// Shell-style quoting for showing argv to humans (never used to build a command).
std::string shell_quote(std::string_view s);

// `count` ranks from `first`, for a log line: "rank 4", "ranks 4-7", "no ranks".
std::string rank_range(long long first, long long count);

}  // namespace ddp

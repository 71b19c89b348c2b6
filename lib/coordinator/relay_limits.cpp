#include "coordinator/relay_limits.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace ddp::coordinator {

RelayLimits relay_limits(std::uint64_t nofile_soft) {
  RelayLimits l;
  l.relays = static_cast<std::size_t>(std::clamp<std::uint64_t>(nofile_soft / 8, 4, l.relays));
  l.relays_per_user = std::min(l.relays_per_user, l.relays);
  l.files = static_cast<std::size_t>(std::clamp<std::uint64_t>(nofile_soft / 4, 4, l.files));
  l.files_per_user = std::max<std::size_t>(l.files / 4, 1);
  return l;
}

std::optional<std::string> refuse_relay(const RelayLimits& limits, RelayUse all, RelayUse mine, std::string_view user) {
  if (mine.relays >= limits.relays_per_user) {
    return fmt::format(
        "user {} has {} status/logs/stop/stacks requests open on this coordinator, its limit per user: end one "
        "(a `ddpctl logs -f` left running?) and try again",
        user, mine.relays);
  }
  if (all.relays >= limits.relays) {
    return fmt::format("this coordinator serves {} status/logs/stop/stacks requests at once, its limit: try again",
                       all.relays);
  }
  return std::nullopt;
}

std::optional<std::string> refuse_backlog(const RelayLimits& limits, RelayUse all, RelayUse mine, std::string_view user,
                                          std::string_view job_id, std::size_t files) {
  if (mine.files + files > limits.files_per_user) {
    return fmt::format(
        "job {}'s logs are {} rank files, and this coordinator reads at most {} at once for user {} ({} open for "
        "other requests): name fewer ranks with --ranks{}",
        job_id, files, limits.files_per_user, user, mine.files,
        mine.files ? ", or let your other `ddpctl logs` finish" : "");
  }
  if (all.files + files > limits.files) {
    return fmt::format(
        "this coordinator has {} log files open for other requests, and reads at most {} at once: try again shortly, "
        "or name fewer ranks with --ranks",
        all.files, limits.files);
  }
  return std::nullopt;
}

}  // namespace ddp::coordinator

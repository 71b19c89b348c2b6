#include "coordinator/relay_limits.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace ddp::coordinator {

RelayLimits relay_limits(std::uint64_t nofile_soft, std::uint64_t nofile_hard) {
  if (nofile_hard < nofile_soft) nofile_hard = nofile_soft;
  RelayLimits l;
  l.relays = static_cast<std::size_t>(std::clamp<std::uint64_t>(nofile_soft / 8, 4, l.relays));
  l.relays_per_user = std::min(l.relays_per_user, l.relays);
  l.files = static_cast<std::size_t>(std::clamp<std::uint64_t>(nofile_soft / 4, 4, l.files));
  l.files_per_user = std::max<std::size_t>(l.files / 4, 1);
  l.jobs = static_cast<std::size_t>(std::clamp<std::uint64_t>(nofile_soft / 16, 2, l.jobs));
  l.jobs_per_user = std::clamp<std::size_t>(l.jobs / 4, 1, l.jobs_per_user);
  l.nodes = static_cast<std::size_t>(std::clamp<std::uint64_t>(nofile_hard / 4, 4, l.nodes));
  l.nodes_per_user = std::max<std::size_t>(l.nodes / 4, 1);
  l.clients = static_cast<std::size_t>(std::clamp<std::uint64_t>(nofile_soft / 4, 16, l.clients));
  l.clients_per_user = std::min(l.clients, l.relays_per_user + l.jobs_per_user + 16);
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

std::optional<std::string> refuse_job(const RelayLimits& limits, std::size_t all, std::size_t mine,
                                      std::string_view user) {
  if (mine >= limits.jobs_per_user) {
    return fmt::format(
        "user {} has {} job{} running on this coordinator, its limit per user: wait for one to end, or "
        "stop one (`ddpctl stop --coordinator ... JOB`)",
        user, mine, mine == 1 ? "" : "s");
  }
  if (all >= limits.jobs) {
    return fmt::format("this coordinator runs {} jobs, its limit: try again once one has ended", all);
  }
  return std::nullopt;
}

std::optional<std::string> refuse_nodes(const RelayLimits& limits, std::size_t all, std::size_t mine,
                                        std::string_view user, std::size_t job_nodes) {
  if (mine + job_nodes > limits.nodes_per_user) {
    return fmt::format(
        "this job's {} node{} and the {} of user {}'s running jobs would pass the {} nodes one user's jobs may hold on "
        "this coordinator at once (a connection each): wait for a job to end, or stop one",
        job_nodes, job_nodes == 1 ? "" : "s", mine, user, limits.nodes_per_user);
  }
  if (all + job_nodes > limits.nodes) {
    return fmt::format(
        "this job's {} node{} would pass the {} nodes this coordinator's jobs may hold at once ({} now): "
        "try again once a job has ended",
        job_nodes, job_nodes == 1 ? "" : "s", limits.nodes, all);
  }
  return std::nullopt;
}

std::optional<std::string> refuse_client(const RelayLimits& limits, std::size_t all, std::size_t mine,
                                         std::string_view user, bool keyed) {
  if (keyed && user == "root") return std::nullopt;
  if (mine >= limits.clients_per_user) {
    return fmt::format(
        "user {} has {} connections open to this coordinator, its limit per user: end some (`ddpctl logs -f` left "
        "running, jobs submitted without --detach?) and try again",
        user, mine);
  }
  if (all >= limits.clients) {
    return fmt::format("this coordinator has {} client connections open, its limit: try again shortly", all);
  }
  return std::nullopt;
}

}  // namespace ddp::coordinator

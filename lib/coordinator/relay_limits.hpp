// The standing coordinator's bounds on `ddpctl status|logs|stop|stacks --coordinator`: the
// decisions, pure (standing.cpp counts, these decide).
//
// Each such request is a relay: the client's connection, one connection to the job's control
// socket (whose server queues up to 8 MiB for it) and, while a `logs` backlog is sent, one open
// file per rank it names (control/log_merge.hpp). Without bounds one key holder could open
// relays until the daemon runs out of descriptors or memory, and every user's jobs with it.
//
// Policy: at most 16 relays per user at once (a terminal or two of `logs -f` each, with room),
// at most 256 in all (about 3 GiB of queues at worst), and never more than an eighth of the
// daemon's descriptors. Backlog files: at most 16384 open at once in all, never more than a
// quarter of the descriptors, and one user at most a quarter of that (4096 under the packaged
// unit's LimitNOFILE: a 4096-rank job's logs in one request); a larger job's logs are read with
// --ranks. A request past a bound is refused with the bound and how to get under it, and only
// its connection is dropped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ddp::coordinator {

struct RelayLimits {
  std::size_t relays = 256;
  std::size_t relays_per_user = 16;
  std::size_t files = 16384;
  std::size_t files_per_user = 4096;
};
// The bounds for a process allowed `nofile_soft` descriptors (net::nofile_soft_limit()).
RelayLimits relay_limits(std::uint64_t nofile_soft);

// What relays hold now: all of them, and the asking user's.
struct RelayUse {
  std::size_t relays = 0;
  std::size_t files = 0;
};

// Why `user` may not start another relay; nullopt: it may.
std::optional<std::string> refuse_relay(const RelayLimits& limits, RelayUse all, RelayUse mine, std::string_view user);
// Why a `logs` backlog of `files` files of job `job_id` may not be opened now; nullopt: it may.
std::optional<std::string> refuse_backlog(const RelayLimits& limits, RelayUse all, RelayUse mine, std::string_view user,
                                          std::string_view job_id, std::size_t files);

}  // namespace ddp::coordinator

// The standing coordinator's bounds on what its clients hold: `ddpctl status|logs|stop|stacks
// --coordinator` requests (relays), jobs, and connections. The decisions, pure (standing.cpp
// counts, these decide).
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
//
// Jobs: each holds a thread, a connection to each of its nodes and its log files, so at most 1024
// run at once and never more than a sixteenth of the descriptors; one user at most a quarter of
// that, and never more than 64 (a sweep of one-node jobs, with room). Their nodes (a connection
// each, kept for the job's life) at most a quarter of the hard descriptor limit in all and one
// user a quarter of that (65536 under the packaged unit's limit: the largest job a submit may name), so
// that one user's jobs on many silent nodes cannot take the descriptors every job and request
// needs. Connections (authenticated;
// net/acceptor.hpp caps the others): at most 4096 and a quarter of the descriptors; one user as
// many as its relays and jobs need, and 16 more. A submit or a connection past a bound is refused
// the same way.
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
  std::size_t jobs = 1024;
  std::size_t jobs_per_user = 64;
  std::size_t nodes = 262144;  // of the running jobs, all told
  std::size_t nodes_per_user = 65536;
  std::size_t clients = 4096;
  std::size_t clients_per_user = 96;
};
// The bounds for a process allowed `nofile_soft` descriptors (net::nofile_soft_limit()); the
// jobs' nodes from `nofile_hard` (0: the soft limit), which a job of many nodes raises it to.
RelayLimits relay_limits(std::uint64_t nofile_soft, std::uint64_t nofile_hard = 0);

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
// Why `user` may not submit another job, with `all` jobs running and `mine` of them its own.
std::optional<std::string> refuse_job(const RelayLimits& limits, std::size_t all, std::size_t mine,
                                      std::string_view user);
// Why a job of `job_nodes` nodes may not start, with `all` nodes in the running jobs and `mine` in
// the asking user's.
std::optional<std::string> refuse_nodes(const RelayLimits& limits, std::size_t all, std::size_t mine,
                                        std::string_view user, std::size_t job_nodes);
// Why a newly authenticated connection of `user` may not stay, with `all` others open and `mine`
// of them its user's. `keyed`: the user is what the client's key maps to (key_users); then root
// is never refused, so that an admin can always stop or inspect jobs (without key_users anyone
// may claim to be root).
std::optional<std::string> refuse_client(const RelayLimits& limits, std::size_t all, std::size_t mine,
                                         std::string_view user, bool keyed);

}  // namespace ddp::coordinator

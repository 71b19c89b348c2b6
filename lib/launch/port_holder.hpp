// Who holds a local TCP port, for the message of a launch whose store port is taken: the
// listening socket's inode from /proc/net/tcp{,6}, the process that has it open from
// /proc/<pid>/fd (only those we may read: our own user's, or all for root), and, when that
// process is a ddpctl launcher, its job from its control socket's name in /proc/net/unix.
// Read only on that error path; bounded (kMaxProcesses, kMaxFds).
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::launch {

struct PortHolder {
  int pid = 0;
  std::string command;                // its argv, joined, at most 120 characters
  std::optional<std::string> job_id;  // a ddpctl launcher's job
};

// The inodes of sockets listening on `port` in a /proc/net/tcp or tcp6 text.
std::set<unsigned long> listening_inodes(std::string_view proc_net_tcp, std::uint16_t port);
// The job ids of control sockets (`<dir>/<job>.sock`) among `inodes`, from a /proc/net/unix text.
std::vector<std::string> control_jobs(std::string_view proc_net_unix, const std::set<unsigned long>& inodes,
                                      const std::string& control_dir);

// The holder of `port` on this machine, if this process may see it.
std::optional<PortHolder> find_port_holder(std::uint16_t port, const std::string& control_dir);

// "job X (pid P: ddpctl launch ...)", "pid P (torchrun ...)".
std::string describe(const PortHolder& h);

}  // namespace ddp::launch

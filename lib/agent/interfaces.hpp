// Which network interface holds an address (getifaddrs): the agent's rendezvous address names
// the interface NCCL and gloo should use (NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME).
#pragma once

#include <optional>
#include <string>

namespace ddp::agent {

// "eth0" for "10.0.0.2"; an IPv4-mapped IPv6 address is looked up as IPv4. nullopt when no
// interface holds it (then workers keep NCCL's and gloo's own choice).
std::optional<std::string> interface_of(const std::string& address);

}  // namespace ddp::agent

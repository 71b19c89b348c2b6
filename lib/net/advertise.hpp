// Where agents connect back to the launcher's coordinator (`launch --ssh --advertise-addr`). Pure.
//
// `--advertise-addr` is HOST, HOST:PORT, [V6]:PORT, :PORT or `auto`. HOST is what every agent
// dials; without one, each node is given the launcher's source address on its route to that node
// (what the kernel picks when sending there), which is right for a launcher on several networks
// and needs no flag on a simple one. PORT 0 (the default) is any free port, as the listener
// reports it. The listener itself binds every address: behind NAT or a port forward the address
// agents dial is not one this machine has.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ddp::net {

struct AdvertiseAddr {
  std::optional<std::string> host;  // nullopt: per node, from the route to it
  std::uint16_t port = 0;           // 0: any free port
  bool operator==(const AdvertiseAddr&) const = default;
};

// Throws std::invalid_argument saying what is wrong with `text`.
AdvertiseAddr parse_advertise_addr(std::string_view text);

// "host:port", "[v6]:port".
std::string format_host_port(std::string_view host, std::uint16_t port);

// What node `node_address`'s agent dials: the given host, else `route_source` (the launcher's
// source address towards that node; empty: no route). Throws std::invalid_argument naming the
// node when that is nothing an agent could reach (no route, or an unspecified or loopback
// source for a node that is not on loopback).
std::string advertised_endpoint(const AdvertiseAddr& advertise, std::string_view route_source,
                                std::string_view node_address, std::uint16_t listen_port);

}  // namespace ddp::net

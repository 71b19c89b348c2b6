// --advertise-addr: parsing and the per-node choice (advertise.hpp).
#include "net/advertise.hpp"

#include "hostlist/hostlist.hpp"

#include <fmt/format.h>

#include <arpa/inet.h>

#include <stdexcept>

namespace ddp::net {

namespace {

bool is_loopback(std::string_view addr) {
  const std::string a(addr);
  in_addr v4{};
  if (::inet_pton(AF_INET, a.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, a.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    if (IN6_IS_ADDR_V4MAPPED(&v6)) return v6.s6_addr[12] == 127;
  }
  return false;
}

bool is_unspecified(std::string_view addr) {
  return addr == "0.0.0.0" || addr == "::" || addr == "::ffff:0.0.0.0";
}

}  // namespace

AdvertiseAddr parse_advertise_addr(std::string_view text) {
  if (text == "auto") return {};
  if (text.empty()) throw std::invalid_argument("expected HOST, HOST:PORT, [V6]:PORT, :PORT or auto");
  AdvertiseAddr a;
  if (text.front() == ':') {
    auto ep = hostlist::parse_endpoint(fmt::format("auto{}", text));
    if (!ep.ok() || !ep.endpoint.port)
      throw std::invalid_argument(fmt::format("'{}': expected :PORT, e.g. :29412", text));
    a.port = *ep.endpoint.port;
    return a;
  }
  auto ep = hostlist::parse_endpoint(text);
  if (!ep.ok()) throw std::invalid_argument(ep.error->to_string());
  if (ep.endpoint.host == "auto")
    throw std::invalid_argument("'auto' takes no port: use :PORT for a port with the automatic address");
  a.host = ep.endpoint.host;
  a.port = ep.endpoint.port.value_or(0);
  return a;
}

std::string format_host_port(std::string_view host, std::uint16_t port) {
  return host.find(':') != std::string_view::npos ? fmt::format("[{}]:{}", host, port)
                                                  : fmt::format("{}:{}", host, port);
}

std::string advertised_endpoint(const AdvertiseAddr& advertise, std::string_view route_source,
                                std::string_view node_address, std::uint16_t listen_port) {
  if (advertise.host) return format_host_port(*advertise.host, listen_port);
  if (route_source.empty()) {
    throw std::invalid_argument(
        fmt::format("no route from here to {}: give --advertise-addr HOST, the address its "
                    "agent can reach this machine at",
                    node_address));
  }
  if (is_unspecified(route_source) || (is_loopback(route_source) && !is_loopback(node_address))) {
    throw std::invalid_argument(
        fmt::format("this machine reaches {} from {}, which its agent cannot dial back (a jump "
                    "host or a tunnel?): give --advertise-addr HOST",
                    node_address, route_source));
  }
  return format_host_port(route_source, listen_port);
}

}  // namespace ddp::net

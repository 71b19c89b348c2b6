// interface_of: getifaddrs walk (see interfaces.hpp).
#include "agent/interfaces.hpp"

#include <boost/asio/ip/address.hpp>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <cstring>

namespace ddp::agent {

std::optional<std::string> interface_of(const std::string& address) {
  boost::system::error_code ec;
  auto want = boost::asio::ip::make_address(address, ec);
  if (ec) return std::nullopt;
  if (want.is_v6() && want.to_v6().is_v4_mapped())
    want = boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped, want.to_v6());
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return std::nullopt;
  std::optional<std::string> found;
  for (ifaddrs* i = list; i && !found; i = i->ifa_next) {
    if (!i->ifa_addr || !i->ifa_name) continue;
    if (i->ifa_addr->sa_family == AF_INET && want.is_v4()) {
      auto* sin = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
      boost::asio::ip::address_v4::bytes_type b;
      std::memcpy(b.data(), &sin->sin_addr, 4);
      if (boost::asio::ip::address_v4(b) == want.to_v4()) found = i->ifa_name;
    } else if (i->ifa_addr->sa_family == AF_INET6 && want.is_v6()) {
      auto* sin6 = reinterpret_cast<sockaddr_in6*>(i->ifa_addr);
      boost::asio::ip::address_v6::bytes_type b;
      std::memcpy(b.data(), &sin6->sin6_addr, 16);
      if (boost::asio::ip::address_v6(b) == want.to_v6()) found = i->ifa_name;
    }
  }
  ::freeifaddrs(list);
  return found;
}

}  // namespace ddp::agent

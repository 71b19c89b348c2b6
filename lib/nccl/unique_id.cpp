// Hex codec and bootstrap-address decode of the NCCL unique id (see unique_id.hpp for the
// layout and the strictness policy).
#include "nccl/unique_id.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace ddp::nccl {
namespace {

// Offsets inside ncclBootstrapHandle { uint64_t magic; union ncclSocketAddress addr; }.
constexpr std::size_t kMagicOffset = 0;
constexpr std::size_t kAddrOffset = 8;
static_assert(kAddrOffset + sizeof(sockaddr_in6) <= kUniqueIdBytes);

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

std::string printable(char c) {
  auto u = static_cast<unsigned char>(c);
  if (u >= 0x21 && u < 0x7f) return std::string("'") + c + "'";
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", u);
  return buf;
}

}  // namespace

std::string to_hex(const UniqueId& id) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(kUniqueIdHexChars);
  for (std::uint8_t b : id.bytes) {
    out.push_back(digits[b >> 4]);
    out.push_back(digits[b & 0xf]);
  }
  return out;
}

Parsed<UniqueId> unique_id_from_hex(std::string_view hex) {
  if (hex.size() != kUniqueIdHexChars) {
    return Parsed<UniqueId>::fail("an NCCL unique id is " + std::to_string(kUniqueIdHexChars) +
                                  " lowercase hex characters (128 bytes), got " + std::to_string(hex.size()) +
                                  " characters");
  }
  UniqueId id;
  for (std::size_t i = 0; i < kUniqueIdBytes; ++i) {
    int hi = hex_value(hex[2 * i]);
    int lo = hex_value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      std::size_t at = hi < 0 ? 2 * i : 2 * i + 1;
      return Parsed<UniqueId>::fail("invalid character " + printable(hex[at]) + " at position " + std::to_string(at) +
                                    " of the NCCL unique id (expected 0-9a-f)");
    }
    id.bytes[i] = static_cast<std::uint8_t>(hi << 4 | lo);
  }
  return Parsed<UniqueId>::ok(id);
}

std::string_view to_string(AddressFamily f) {
  return f == AddressFamily::ipv4 ? "ipv4" : "ipv6";
}

std::string BootstrapAddress::endpoint() const {
  if (family == AddressFamily::ipv4) return ip + ":" + std::to_string(port);
  std::string out = "[";  // appends, not +: GCC 12 -Wrestrict false positive on "[" + s
  out += ip;
  if (scope_id != 0) {
    out += '%';
    out += std::to_string(scope_id);
  }
  out += "]:";
  out += std::to_string(port);
  return out;
}

Parsed<BootstrapAddress> decode_bootstrap_address(const UniqueId& id) {
  BootstrapAddress out;
  std::memcpy(&out.magic, id.bytes.data() + kMagicOffset, sizeof out.magic);
  sa_family_t family = 0;
  std::memcpy(&family, id.bytes.data() + kAddrOffset, sizeof family);

  char text[INET6_ADDRSTRLEN] = {};
  if (family == AF_INET) {
    sockaddr_in sin{};
    std::memcpy(&sin, id.bytes.data() + kAddrOffset, sizeof sin);
    out.family = AddressFamily::ipv4;
    out.port = ntohs(sin.sin_port);
    inet_ntop(AF_INET, &sin.sin_addr, text, sizeof text);
  } else if (family == AF_INET6) {
    sockaddr_in6 sin6{};
    std::memcpy(&sin6, id.bytes.data() + kAddrOffset, sizeof sin6);
    out.family = AddressFamily::ipv6;
    out.port = ntohs(sin6.sin6_port);
    out.scope_id = sin6.sin6_scope_id;
    inet_ntop(AF_INET6, &sin6.sin6_addr, text, sizeof text);
  } else {
    return Parsed<BootstrapAddress>::fail("no bootstrap address in the NCCL unique id (address family " +
                                          std::to_string(family) +
                                          " is neither IPv4 nor IPv6): not an id made by ncclGetUniqueId of NCCL 2.x");
  }
  out.ip = text;
  if (out.port == 0) {
    return Parsed<BootstrapAddress>::fail("the NCCL unique id's bootstrap address " + out.ip +
                                          " has port 0: not an id made by ncclGetUniqueId");
  }
  return Parsed<BootstrapAddress>::ok(std::move(out));
}

}  // namespace ddp::nccl

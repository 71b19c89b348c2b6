// The 128-byte ncclUniqueId as plain data: its hex form (how DDP_NCCL_UNIQUE_ID and the id
// holder carry it) and the bootstrap root address NCCL writes inside it.
//
// Policy: pure, no NCCL needed. Hex is exactly 256 lowercase characters, decoded strictly (no
// whitespace, no upper case, no prefix): an id that differs by one byte is a different job, so
// nothing is "repaired". The address layout is NCCL 2.x's ncclBootstrapHandle (bootstrap.h):
// a u64 magic in host byte order at offset 0, then a `union ncclSocketAddress` (sockaddr_in /
// sockaddr_in6, family in host order, port and address in network order) at offset 8; the rest
// is zero. Ids are only exchanged between Linux hosts of one byte order (x86-64, aarch64).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ddp::nccl {

inline constexpr std::size_t kUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
inline constexpr std::size_t kUniqueIdHexChars = 2 * kUniqueIdBytes;

struct UniqueId {
  std::array<std::uint8_t, kUniqueIdBytes> bytes{};
  friend bool operator==(const UniqueId&, const UniqueId&) = default;
};

// A value or the reason there is none. Used where bad input is expected (env, pipes, flags).
template <class T>
struct Parsed {
  std::optional<T> value;
  std::string error;  // set iff !value
  explicit operator bool() const { return value.has_value(); }
  static Parsed ok(T v) { return Parsed{std::move(v), {}}; }
  static Parsed fail(std::string why) { return Parsed{std::nullopt, std::move(why)}; }
};

std::string to_hex(const UniqueId& id);
Parsed<UniqueId> unique_id_from_hex(std::string_view hex);

enum class AddressFamily { ipv4, ipv6 };

// Where the job's bootstrap root (the process that called ncclGetUniqueId) listens.
struct BootstrapAddress {
  std::uint64_t magic = 0;  // random per id; NCCL checks it on every bootstrap connection
  AddressFamily family = AddressFamily::ipv4;
  std::string ip;  // numeric, as inet_ntop writes it
  std::uint16_t port = 0;
  std::uint32_t scope_id = 0;  // IPv6 link-local only

  // "127.0.0.1:41234" or "[fe80::1%2]:41234"
  std::string endpoint() const;
};

std::string_view to_string(AddressFamily f);

// Fails on an id with no IPv4/IPv6 family or port 0 (not made by ncclGetUniqueId of NCCL 2.x).
Parsed<BootstrapAddress> decode_bootstrap_address(const UniqueId& id);

}  // namespace ddp::nccl

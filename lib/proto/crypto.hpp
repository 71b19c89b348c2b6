// The few cryptographic primitives the protocol needs, over OpenSSL's libcrypto: HMAC-SHA256,
// SHA-256, constant-time comparison, hex, and fresh nonces (the one impure helper, for edges).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::proto {

inline constexpr std::size_t kDigestBytes = 32;
inline constexpr std::size_t kNonceBytes = 32;
using Digest = std::array<std::uint8_t, kDigestBytes>;
using Nonce = std::array<std::uint8_t, kNonceBytes>;

Digest hmac_sha256(std::string_view key, std::string_view data);
Digest sha256(std::string_view data);

// HMAC-SHA256 under one key, many messages (a session's frames): the keyed state is set up once
// and copied per message, and a message may come in parts (no concatenated copy). The same
// digest as hmac_sha256(key, concatenation of the parts). Copies share the immutable keyed state.
class HmacKey {
 public:
  HmacKey() = default;
  explicit HmacKey(std::string_view key);
  Digest mac(std::initializer_list<std::string_view> parts) const;
  explicit operator bool() const { return static_cast<bool>(state_); }

 private:
  struct State;
  std::shared_ptr<const State> state_;  // SHA-256 after the inner and the outer padded key
};

// What is MACed is built of big-endian integers and length-prefixed strings (put_lp: a u32
// length, then the bytes), so that no two different field lists give the same input.
inline void put_u32(std::string& out, std::uint32_t n) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((n >> shift) & 0xff));
}
inline void put_u64(std::string& out, std::uint64_t n) {
  for (int shift = 56; shift >= 0; shift -= 8) out.push_back(static_cast<char>((n >> shift) & 0xff));
}
inline void put_lp(std::string& out, std::string_view s) {
  put_u32(out, static_cast<std::uint32_t>(s.size()));
  out.append(s);
}

// Constant-time for equal lengths (CRYPTO_memcmp); different lengths are simply unequal.
bool equal_ct(std::string_view a, std::string_view b);

std::string to_hex(std::string_view bytes);
std::optional<std::string> from_hex(std::string_view hex);
inline std::string_view as_bytes(const Digest& d) {
  return {reinterpret_cast<const char*>(d.data()), d.size()};
}

// 32 bytes from the OS CSPRNG (RAND_bytes). Session state machines take nonces as input; this is
// for the edge that builds them. Throws if the CSPRNG fails, which must never be papered over.
Nonce random_nonce();

}  // namespace ddp::proto

// OpenSSL wrappers; see crypto.hpp.
#include "proto/crypto.hpp"

// SHA256_Init/Update/Final: see HmacKey::State below.
#define OPENSSL_SUPPRESS_DEPRECATED

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include <algorithm>
#include <stdexcept>

namespace ddp::proto {

// HMAC (RFC 2104) over SHA-256's own state: after hashing key^ipad and key^opad once, a message
// costs copying two plain structs and hashing. OpenSSL 3's EVP_MAC duplicated its provider
// contexts for every frame (allocations and a lock each), and one-shot HMAC() looks its
// algorithms up by name every call: together 8% of the coordinator's CPU at 4096 nodes. The
// SHA256_* functions are deprecated in OpenSSL 3 in favour of EVP, but kept, and are exactly the
// compression function we need; the RFC 4231 vectors in crypto_test hold this to the standard.
struct HmacKey::State {
  SHA256_CTX inner, outer;
  ~State() { OPENSSL_cleanse(this, sizeof *this); }
};

HmacKey::HmacKey(std::string_view key) {
  constexpr std::size_t kBlock = 64;
  std::array<unsigned char, kBlock> k{};
  if (key.size() > kBlock) {
    SHA256(reinterpret_cast<const unsigned char*>(key.data()), key.size(), k.data());
  } else {
    std::copy(key.begin(), key.end(), k.begin());
  }
  auto st = std::make_shared<State>();
  std::array<unsigned char, kBlock> pad{};
  for (std::size_t i = 0; i < kBlock; ++i) pad[i] = k[i] ^ 0x36;
  SHA256_Init(&st->inner);
  SHA256_Update(&st->inner, pad.data(), pad.size());
  for (std::size_t i = 0; i < kBlock; ++i) pad[i] = k[i] ^ 0x5c;
  SHA256_Init(&st->outer);
  SHA256_Update(&st->outer, pad.data(), pad.size());
  OPENSSL_cleanse(k.data(), k.size());
  OPENSSL_cleanse(pad.data(), pad.size());
  state_ = std::move(st);
}

Digest HmacKey::mac(std::initializer_list<std::string_view> parts) const {
  if (!state_) throw std::logic_error("HmacKey::mac without a key");
  SHA256_CTX c = state_->inner;
  for (auto p : parts) SHA256_Update(&c, p.data(), p.size());
  Digest inner{};
  SHA256_Final(inner.data(), &c);
  c = state_->outer;
  SHA256_Update(&c, inner.data(), inner.size());
  Digest out{};
  SHA256_Final(out.data(), &c);
  OPENSSL_cleanse(&c, sizeof c);
  return out;
}

Digest hmac_sha256(std::string_view key, std::string_view data) {
  return HmacKey(key).mac({data});
}

Digest sha256(std::string_view data) {
  Digest out{};
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), out.data());
  return out;
}

bool equal_ct(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string to_hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 0xf]);
  }
  return out;
}

std::optional<std::string> from_hex(std::string_view hex) {
  if (hex.size() % 2) return std::nullopt;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(hex.size() / 2);
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    int hi = nibble(hex[i]), lo = nibble(hex[i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  return out;
}

Nonce random_nonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) throw std::runtime_error("RAND_bytes failed: no entropy");
  return n;
}

}  // namespace ddp::proto

// OpenSSL wrappers; see crypto.hpp.
#include "proto/crypto.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/core_names.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include <stdexcept>

namespace ddp::proto {

Digest hmac_sha256(std::string_view key, std::string_view data) {
  Digest out{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
       data.size(), out.data(), &len);
  return out;
}

HmacKey::HmacKey(std::string_view key) {
  static EVP_MAC* const mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);  // fetched once, never freed
  if (!mac) throw std::runtime_error("OpenSSL has no HMAC");
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(mac);
  if (!ctx) throw std::runtime_error("EVP_MAC_CTX_new failed");
  ctx_.reset(ctx, [](void* c) { EVP_MAC_CTX_free(static_cast<EVP_MAC_CTX*>(c)); });
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0), OSSL_PARAM_construct_end()};
  if (EVP_MAC_init(ctx, reinterpret_cast<const unsigned char*>(key.data()), key.size(), params) != 1) {
    throw std::runtime_error("EVP_MAC_init(HMAC-SHA256) failed");
  }
}

Digest HmacKey::mac(std::initializer_list<std::string_view> parts) const {
  if (!ctx_) throw std::logic_error("HmacKey::mac without a key");
  std::unique_ptr<EVP_MAC_CTX, decltype(&EVP_MAC_CTX_free)> c(EVP_MAC_CTX_dup(static_cast<EVP_MAC_CTX*>(ctx_.get())),
                                                               &EVP_MAC_CTX_free);
  Digest out{};
  std::size_t len = 0;
  bool ok = static_cast<bool>(c);
  for (auto p : parts) ok = ok && EVP_MAC_update(c.get(), reinterpret_cast<const unsigned char*>(p.data()), p.size()) == 1;
  ok = ok && EVP_MAC_final(c.get(), out.data(), &len, out.size()) == 1 && len == out.size();
  if (!ok) throw std::runtime_error("HMAC-SHA256 failed");
  return out;
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

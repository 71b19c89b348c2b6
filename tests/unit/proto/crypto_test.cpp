// HMAC-SHA256, one-shot and with a keyed state reused across messages (a session's frames).
#include "proto/crypto.hpp"

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <random>

using namespace ddp::proto;

TEST(Crypto, HmacMatchesRfc4231TestCase2) {
  const auto expect = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
  EXPECT_EQ(to_hex(as_bytes(hmac_sha256("Jefe", "what do ya want for nothing?"))), expect);
  EXPECT_EQ(to_hex(as_bytes(HmacKey("Jefe").mac({"what do ya want ", "", "for nothing?"}))), expect);
}

TEST(Crypto, HmacMatchesRfc4231KeysShorterAndLongerThanABlock) {
  EXPECT_EQ(to_hex(as_bytes(hmac_sha256(std::string(20, '\x0b'), "Hi There"))),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");  // case 1
  const std::string long_key(131, '\xaa');
  EXPECT_EQ(to_hex(as_bytes(hmac_sha256(long_key, "Test Using Larger Than Block-Size Key - Hash Key First"))),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");  // case 6
  EXPECT_EQ(to_hex(as_bytes(hmac_sha256(
                long_key,
                "This is a test using a larger than block-size key and a larger than block-size data. The key "
                "needs to be hashed before being used by the HMAC algorithm."))),
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");  // case 7
}

// Against OpenSSL's own HMAC, for keys and messages around the 64-byte block and SHA-256's
// 55/56-byte padding boundary, split into parts anywhere.
TEST(Crypto, HmacAgreesWithOpenSslsForManySizes) {
  std::mt19937 rng(7);
  for (std::size_t klen : {0, 1, 31, 32, 63, 64, 65, 127, 128, 200}) {
    for (std::size_t dlen : {0, 1, 55, 56, 63, 64, 65, 119, 120, 1000}) {
      std::string key(klen, '\0'), data(dlen, '\0');
      for (auto& c : key) c = static_cast<char>(rng());
      for (auto& c : data) c = static_cast<char>(rng());
      Digest want{};
      unsigned int len = 0;
      HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
           data.size(), want.data(), &len);
      ASSERT_EQ(len, want.size());
      EXPECT_EQ(hmac_sha256(key, data), want) << klen << "/" << dlen;
      const std::size_t cut = dlen / 3;
      EXPECT_EQ(HmacKey(key).mac({std::string_view(data).substr(0, cut), std::string_view(data).substr(cut)}), want)
          << klen << "/" << dlen;
    }
  }
}

TEST(Crypto, KeyedStateGivesTheOneShotDigestEveryTime) {
  const std::string key(32, '\x07');
  const HmacKey k(key);
  const HmacKey copy = k;  // shares the keyed state, which no message changes
  for (int i = 0; i < 3; ++i) {
    std::string head(8, '\0');  // built in place: GCC 12 flags "C" + std::string(...) with a bogus -Wrestrict
    head[0] = 'C';
    head.push_back(static_cast<char>(i));
    const std::string body = R"({"type":"heartbeat","v":2})";
    EXPECT_EQ(k.mac({head, body}), hmac_sha256(key, head + body)) << i;
    EXPECT_EQ(copy.mac({head + body}), hmac_sha256(key, head + body)) << i;
  }
  EXPECT_NE(HmacKey(std::string(32, '\x08')).mac({"x"}), k.mac({"x"}));
  EXPECT_FALSE(HmacKey());
  EXPECT_THROW(HmacKey().mac({"x"}), std::logic_error);
}

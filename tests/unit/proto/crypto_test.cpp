// HMAC-SHA256, one-shot and with a keyed state reused across messages (a session's frames).
#include "proto/crypto.hpp"

#include <gtest/gtest.h>

using namespace ddp::proto;

TEST(Crypto, HmacMatchesRfc4231TestCase2) {
  const auto expect = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
  EXPECT_EQ(to_hex(as_bytes(hmac_sha256("Jefe", "what do ya want for nothing?"))), expect);
  EXPECT_EQ(to_hex(as_bytes(HmacKey("Jefe").mac({"what do ya want ", "", "for nothing?"}))), expect);
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

// Token file parsing: both forms, every error with its line.
#include "proto/keyring.hpp"

#include <gtest/gtest.h>

using namespace ddp::proto;

namespace {
const std::string kS1(64, 'a');
const std::string kS2 = "0123456789abcdef0123456789abcdef";
}  // namespace

TEST(Keyring, KeyIdSecretLines) {
  auto r = parse_keyring("# ddpctl token\n\ndefault: " + kS1 + "\nops-team.2: \"" + kS2 + "\"\n");
  ASSERT_TRUE(r.ok()) << r.error->to_string();
  ASSERT_EQ(r.keyring.keys().size(), 2u);
  EXPECT_EQ(r.keyring.first()->id, "default");
  EXPECT_EQ(r.keyring.find("ops-team.2")->secret, kS2);
  EXPECT_EQ(r.keyring.find("nope"), nullptr);
}

TEST(Keyring, BareSecretIsTheDefaultKey) {
  auto r = parse_keyring(kS1 + "\n");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.keyring.first()->id, "default");
  EXPECT_EQ(r.keyring.first()->secret, kS1);
}

TEST(Keyring, SecretMayHoldColonsAndQuotes) {
  auto r = parse_keyring("k: 'a:b:" + kS2 + "'\n");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.keyring.find("k")->secret, "a:b:" + kS2);
}

TEST(Keyring, Errors) {
  struct Case {
    std::string text;
    std::size_t line;
    const char* needle;
  };
  for (const auto& c : std::vector<Case>{
           {"", 0, "no keys"},
           {"# only a comment\n", 0, "no keys"},
           {"short\n", 1, "at least 32 needed"},
           {"k: short", 1, "at least 32"},
           {"a: " + kS1 + "\nnonsense line\n", 2, "expected 'key_id: secret'"},
           {"a: " + kS1 + "\na: " + kS2, 2, "appears twice"},
           {"bad id: " + kS1, 1, "must be 1-64"},
           {": " + kS1, 1, "must be 1-64"},
           {std::string(65, 'k') + ": " + kS1, 1, "must be 1-64"},
           {"k: " + std::string(1025, 'x'), 1, "longer than 1024"},
           {"k: " + kS1 + "\x01", 1, "control character"},
       }) {
    auto r = parse_keyring(c.text);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_TRUE(r.keyring.empty());
    EXPECT_EQ(r.error->line, c.line) << r.error->to_string();
    EXPECT_NE(r.error->message.find(c.needle), std::string::npos) << r.error->to_string();
  }
}

TEST(Keyring, ErrorText) {
  EXPECT_EQ((KeyringError{3, "x"}).to_string(), "line 3: x");
  EXPECT_EQ((KeyringError{0, "x"}).to_string(), "x");
}

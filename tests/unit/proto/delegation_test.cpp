// Delegations (proto/delegation.hpp): signed with fixed keys, verified with the time injected;
// every binding refused when it does not hold.
#include "proto/delegation.hpp"

#include "proto/crypto.hpp"

#include <gtest/gtest.h>

#include <functional>

using namespace ddp::proto;
using nlohmann::json;

namespace {

const Key kAlice{"alice-key", std::string(40, 'a')};
const Key kBob{"bob-key", std::string(40, 'b')};
const Keyring kAgentKeys({kAlice, kBob, Key{"coord", std::string(40, 'c')}});
constexpr std::uint64_t kNow = 1'800'000'000;

json spec() {
  return {{"command", {"python", "train.py"}}, {"log_dir", "/home/alice/logs"}, {"forward_env", json::object()}};
}

Delegation alice_delegation(std::uint64_t expires = kNow + kDelegationSeconds) {
  Delegation d;
  d.user = "alice";
  d.coordinator_key = "coord";
  d.job_id = "train-1";
  d.expires_s = expires;
  d.nonce = std::string(32, '7');
  d.spec_sha256 = payload_digest(spec());
  return sign_delegation(d, kAlice);
}

DelegationExpect at_agent() {
  return {"train-1", "alice", "coord", "", payload_digest(spec()), kNow};
}

std::string refusal(const Delegation& d, DelegationExpect e = at_agent(), const Keyring& keys = kAgentKeys) {
  auto why = verify_delegation(d, keys, e);
  return why.value_or("");
}

}  // namespace

TEST(Delegation, AGoodOneVerifies) {
  auto d = alice_delegation();
  EXPECT_EQ(d.key_id, "alice-key");
  EXPECT_EQ(d.mac.size(), 64u);
  EXPECT_EQ(refusal(d), "");
}

// The construction as delegation.hpp writes it, computed here from its description.
TEST(Delegation, TheMacIsTheDocumentedConstruction) {
  auto d = alice_delegation();
  auto lp = [](const std::string& s) {
    std::string out;
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((s.size() >> shift) & 0xff));
    return out + s;
  };
  std::string in("ddpctl delegation v1");
  in.push_back('\0');
  in += lp("alice") + lp("alice-key") + lp("coord") + lp("train-1");
  for (int shift = 56; shift >= 0; shift -= 8) in.push_back(static_cast<char>((d.expires_s >> shift) & 0xff));
  in += lp(d.nonce) + lp(d.spec_sha256);
  EXPECT_EQ(d.mac, to_hex(as_bytes(hmac_sha256(kAlice.secret, in))));
}

TEST(Delegation, TheLaunchersLogFolderIsNotBound) {
  auto other = spec();
  other["log_dir"] = "/var/log/ddpctl/coordinator";
  EXPECT_EQ(payload_digest(other), payload_digest(spec()));
  other["command"] = {"sh", "-c", "id"};
  EXPECT_NE(payload_digest(other), payload_digest(spec()));
}

TEST(Delegation, ARoundTripThroughJsonKeepsItGood) {
  std::string error;
  auto back = delegation_from_json(to_json(alice_delegation()), &error);
  ASSERT_TRUE(back) << error;
  EXPECT_EQ(refusal(*back), "");
}

TEST(Delegation, ForgedOrAlteredIsRefused) {
  // Bob signs a delegation naming alice with his own key, claiming to be alice's.
  auto forged = alice_delegation();
  forged.mac = sign_delegation(forged, kBob).mac;
  EXPECT_NE(refusal(forged).find("does not verify with key 'alice-key'"), std::string::npos) << refusal(forged);
  // Alice's signature, a field changed afterwards.
  for (auto change :
       {+[](Delegation& d) { d.user = "root"; }, +[](Delegation& d) { d.job_id = "train-2"; },
        +[](Delegation& d) { d.expires_s += 3600; }, +[](Delegation& d) { d.coordinator_key = "bob-key"; },
        +[](Delegation& d) { d.spec_sha256 = std::string(64, '0'); },
        +[](Delegation& d) { d.nonce = std::string(32, '8'); }}) {
    auto d = alice_delegation();
    change(d);
    EXPECT_NE(refusal(d).find("does not verify"), std::string::npos) << refusal(d);
  }
  // A key the verifier does not hold.
  EXPECT_NE(refusal(alice_delegation(), at_agent(), Keyring({kBob})).find("does not hold"), std::string::npos);
}

TEST(Delegation, EachBindingIsChecked) {
  auto d = alice_delegation();
  auto e = at_agent();
  e.job_id = "train-2";  // used for another job
  EXPECT_EQ(refusal(d, e), "the job's delegation is for job train-1, not train-2");
  e = at_agent();
  e.user = "bob";  // the offer names another user
  EXPECT_EQ(refusal(d, e), "the job's delegation is for user 'alice', not 'bob'");
  e = at_agent();
  e.coordinator_key = "bob-key";  // copied off the wire, offered with another key
  EXPECT_EQ(refusal(d, e), "the job's delegation is for a coordinator with key 'coord', not 'bob-key'");
  e = at_agent();
  auto other = spec();
  other["command"] = {"sh", "-c", "id"};
  e.spec_sha256 = payload_digest(other);  // the coordinator changed the command
  EXPECT_NE(refusal(d, e).find("another job spec"), std::string::npos);
  e = at_agent();
  e.signer_key = "bob-key";  // the coordinator: signed by a key other than the link's
  EXPECT_NE(refusal(d, e).find("this connection proved key 'bob-key'"), std::string::npos);
  // Names that differ are quoted clean, whoever wrote them.
  e = at_agent();
  e.user = "bob\x1b]0;x\x07";
  EXPECT_EQ(refusal(d, e), "the job's delegation is for user 'alice', not 'bob?]0;x?'");
}

TEST(Delegation, ExpiryIsOnTheVerifiersClock) {
  EXPECT_EQ(refusal(alice_delegation(kNow + 1)), "");
  EXPECT_NE(refusal(alice_delegation(kNow)).find("expired 0 s ago"), std::string::npos);
  EXPECT_NE(refusal(alice_delegation(kNow - 90)).find("expired 90 s ago"), std::string::npos);
  EXPECT_NE(refusal(alice_delegation(kNow + kMaxDelegationSeconds + 1)).find("longer than"), std::string::npos);
}

TEST(Delegation, DecodingIsStrict) {
  std::string error;
  auto j = to_json(alice_delegation());
  auto bad = [&](const std::function<void(json&)>& f) {
    auto x = j;
    f(x);
    error.clear();
    EXPECT_FALSE(delegation_from_json(x, &error)) << x.dump();
    return error;
  };
  EXPECT_NE(bad([](json& x) { x["extra"] = 1; }).find("unknown field 'extra'"), std::string::npos);
  // The sender's own words, quoted: no escape sequence or line break reaches a log from here.
  EXPECT_EQ(bad([](json& x) { x["\x1b[2J\nforged"] = 1; }), "delegation: unknown field '?[2J?forged'");
  EXPECT_NE(bad([](json& x) { x.erase("mac"); }).find("'mac'"), std::string::npos);
  EXPECT_NE(bad([](json& x) { x["mac"] = std::string(64, 'G'); }).find("'mac'"), std::string::npos);
  EXPECT_NE(bad([](json& x) { x["expires_s"] = -5; }).find("'expires_s'"), std::string::npos);
  EXPECT_NE(bad([](json& x) { x["key_id"] = "a b"; }).find("'key_id'"), std::string::npos);
  EXPECT_NE(bad([](json& x) { x["user"] = std::string(300, 'u'); }).find("'user'"), std::string::npos);
  EXPECT_NE(bad([](json& x) { x = json::array(); }).find("expected an object"), std::string::npos);
}

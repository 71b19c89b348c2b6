// Delegations: encode, sign, decode strictly, verify (see delegation.hpp for the construction).
#include "proto/delegation.hpp"

#include "common/text.hpp"
#include "proto/crypto.hpp"
#include "proto/schema.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace ddp::proto {
namespace {

constexpr std::string_view kLabel = "ddpctl delegation v1";
constexpr std::size_t kNonceHex = 32;
constexpr std::size_t kMaxUser = 256;
constexpr std::size_t kMaxJobId = 256;

std::string mac_input(const Delegation& d) {
  std::string in(kLabel);
  in.push_back('\0');
  put_lp(in, d.user);
  put_lp(in, d.key_id);
  put_lp(in, d.coordinator_key);
  put_lp(in, d.job_id);
  put_u64(in, d.expires_s);
  put_lp(in, d.nonce);
  put_lp(in, d.spec_sha256);
  return in;
}

std::string mac_of(const Delegation& d, const Key& key) {
  return to_hex(as_bytes(hmac_sha256(key.secret, mac_input(d))));
}

bool lower_hex(const std::string& s, std::size_t digits) {
  if (s.size() != digits) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

std::string payload_digest(const nlohmann::json& payload) {
  auto j = payload;
  if (j.is_object()) j.erase("log_dir");
  return to_hex(as_bytes(sha256(dump(j))));
}

Delegation sign_delegation(Delegation d, const Key& key) {
  d.key_id = key.id;
  d.mac = mac_of(d, key);
  return d;
}

nlohmann::json to_json(const Delegation& d) {
  return {
      {"user", d.user},           {"key_id", d.key_id}, {"coordinator_key", d.coordinator_key}, {"job_id", d.job_id},
      {"expires_s", d.expires_s}, {"nonce", d.nonce},   {"spec_sha256", d.spec_sha256},         {"mac", d.mac}};
}

std::optional<Delegation> delegation_from_json(const nlohmann::json& j, std::string* error) {
  auto bad = [&](std::string why) -> std::optional<Delegation> {
    if (error) *error = "delegation: " + std::move(why);
    return std::nullopt;
  };
  if (!j.is_object()) return bad("expected an object");
  static const char* kFields[] = {"user",      "key_id", "coordinator_key", "job_id",
                                  "expires_s", "nonce",  "spec_sha256",     "mac"};
  for (const auto& [k, v] : j.items()) {
    if (std::find(std::begin(kFields), std::end(kFields), k) == std::end(kFields)) {
      // The sender's words, which go into logs and back to it: made safe to show.
      return bad(fmt::format("unknown field '{}'", clean_text(k, 64)));
    }
  }
  Delegation d;
  auto text = [&](const char* name, std::string& out, std::size_t max) -> bool {
    auto it = j.find(name);
    if (it == j.end() || !it->is_string()) return false;
    out = it->get<std::string>();
    return !out.empty() && out.size() <= max;
  };
  if (!text("user", d.user, kMaxUser)) return bad("'user' must be a user name of 1-256 bytes");
  if (!text("key_id", d.key_id, kMaxKeyIdChars) || !valid_key_id(d.key_id)) return bad("'key_id' must be a key id");
  if (!text("coordinator_key", d.coordinator_key, kMaxKeyIdChars) || !valid_key_id(d.coordinator_key)) {
    return bad("'coordinator_key' must be a key id");
  }
  if (!text("job_id", d.job_id, kMaxJobId)) return bad("'job_id' must be a job id of 1-256 bytes");
  auto exp = j.find("expires_s");
  if (exp == j.end() || !exp->is_number_unsigned())
    return bad("'expires_s' must be an unsigned integer (Unix seconds)");
  d.expires_s = exp->get<std::uint64_t>();
  if (!text("nonce", d.nonce, kNonceHex) || !lower_hex(d.nonce, kNonceHex))
    return bad("'nonce' must be 32 lower-case hex digits");
  if (!text("spec_sha256", d.spec_sha256, 64) || !lower_hex(d.spec_sha256, 64)) {
    return bad("'spec_sha256' must be 64 lower-case hex digits");
  }
  if (!text("mac", d.mac, 64) || !lower_hex(d.mac, 64)) return bad("'mac' must be 64 lower-case hex digits");
  return d;
}

std::optional<std::string> verify_delegation(const Delegation& d, const Keyring& keys, const DelegationExpect& e) {
  const Key* key = keys.find(d.key_id);
  if (!key) {
    return fmt::format("the job's delegation is signed with key '{}', which this token file does not hold", d.key_id);
  }
  // The signature first: nothing else of an unsigned delegation is worth a word.
  if (!equal_ct(d.mac, mac_of(d, *key))) {
    return fmt::format(
        "the job's delegation does not verify with key '{}' (forged, altered, or that key's secret differs here)",
        d.key_id);
  }
  if (!e.signer_key.empty() && d.key_id != e.signer_key) {
    return fmt::format("the job's delegation is signed with key '{}', but this connection proved key '{}'", d.key_id,
                       e.signer_key);
  }
  if (d.coordinator_key != e.coordinator_key) {
    return fmt::format("the job's delegation is for a coordinator with key '{}', not '{}'", d.coordinator_key,
                       e.coordinator_key);
  }
  // Signed, but by whoever holds a key, and the other side is the submitter's: both shown clean.
  if (d.job_id != e.job_id) {
    return fmt::format("the job's delegation is for job {}, not {}", clean_text(d.job_id, kMaxJobId),
                       clean_text(e.job_id, kMaxJobId));
  }
  if (d.user != e.user) {
    return fmt::format("the job's delegation is for user '{}', not '{}'", clean_text(d.user, kMaxUser),
                       clean_text(e.user, kMaxUser));
  }
  if (d.spec_sha256 != e.spec_sha256) {
    return std::string(
        "the job's delegation was signed for another job spec (the spec changed after ddpctl signed it)");
  }
  if (e.now_s >= d.expires_s) {
    return fmt::format(
        "the job's delegation expired {} s ago (submit the job again; check the clocks if it was just signed)",
        e.now_s - d.expires_s);
  }
  if (d.expires_s - e.now_s > kMaxDelegationSeconds) {
    return fmt::format(
        "the job's delegation is good for {} s more, longer than the {} s allowed (check the submitting host's clock)",
        d.expires_s - e.now_s, kMaxDelegationSeconds);
  }
  return std::nullopt;
}

}  // namespace ddp::proto

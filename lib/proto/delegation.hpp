// A delegation: a user's signed permission for one standing coordinator to run one job as them.
//
// Why: a standing coordinator (ddp-coordinator) dials the agents with a key of its own; the
// submitting user's secret never crosses the wire, so it cannot forward it. Instead the
// submitting ddpctl, which holds the user's key, signs a short-lived delegation and submits it
// with the job; the coordinator puts it in every job_offer; an agent that holds the same key
// (its token file) checks it and runs the job as the user that key maps to (key_users), while the
// link itself is authenticated with the coordinator's key. Protocol version 6.
//
//   mac = HMAC-SHA256(user key's secret, "ddpctl delegation v1" 0 ‖ lp(user) ‖ lp(key_id) ‖
//           lp(coordinator_key) ‖ lp(job_id) ‖ u64(expires_s) ‖ lp(nonce) ‖ lp(spec_sha256))
//   lp(s) = 4-byte big-endian length ‖ s;  u64 = 8 bytes big-endian
//
// What it binds: the user and the key that signs (an agent maps that key, never the name); the
// key the coordinator must have proved on the link that carries it (someone who copies a
// delegation off a plaintext link cannot use it with another key); the job id (not reusable for
// another job); the job's spec and forwarded environment, less the launcher's log folder
// (spec_sha256: the coordinator cannot change the command); and an expiry, on the verifier's
// clock (a copy is worthless after it). Not bound: which nodes; a coordinator may redial a node
// and offer the same job again before the expiry, which is legitimate (a node that came back).
// A replay inside those bounds runs the same job, as the same user, through the same
// coordinator key; an agent runs one job at a time and refuses another offer while one runs.
//
// Pure: time comes in as a parameter; no clock, no randomness (the nonce is given).
#pragma once

#include "proto/keyring.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace ddp::proto {

// How long a delegation ddpctl signs stays good: it must outlast the rendezvous (join_timeout,
// 10 minutes by default) and a node's redial after a restart; a verifier refuses one that claims
// to last longer than kMaxDelegationSeconds from its own clock's now.
inline constexpr std::uint64_t kDelegationSeconds = 3600;
inline constexpr std::uint64_t kMaxDelegationSeconds = 24 * 3600;

struct Delegation {
  std::string user;             // the user the job runs as
  std::string key_id;           // the user's key: it signs, and agents map it (key_users)
  std::string coordinator_key;  // the key the coordinator dials agents with
  std::string job_id;
  std::uint64_t expires_s = 0;  // Unix seconds
  std::string nonce;            // 32 lower-case hex digits
  std::string spec_sha256;      // payload_digest() of the job's spec
  std::string mac;              // 64 lower-case hex digits
};

// The digest a delegation binds: SHA-256 over the job payload (job_offer.spec, submit.spec) as
// proto::dump() writes it, without "log_dir" (the standing coordinator puts its own there).
std::string payload_digest(const nlohmann::json& payload);

// Fills d.mac with `key` (whose id must be d.key_id).
Delegation sign_delegation(Delegation d, const Key& key);

nlohmann::json to_json(const Delegation& d);
// Strict: every field, of its type and size, nothing else. nullopt with *error set otherwise.
std::optional<Delegation> delegation_from_json(const nlohmann::json& j, std::string* error);

// What the verifier knows of the offer the delegation came with.
struct DelegationExpect {
  std::string job_id;
  std::string user;             // the offer's (or submit's) user
  std::string coordinator_key;  // agent: the key the coordinator proved on the link; coordinator: its own
  std::string signer_key;       // non-empty: d.key_id must be this (the coordinator: the key ddpctl proved)
  std::string spec_sha256;      // payload_digest() of the spec that came with it
  std::uint64_t now_s = 0;      // the verifier's clock
};

// nullopt: good, and the job runs as d.key_id's user. Else why not, in words for the refusal.
std::optional<std::string> verify_delegation(const Delegation& d, const Keyring& keys, const DelegationExpect& expect);

}  // namespace ddp::proto

// Per-user tokens: who a job runs as on this node.
//
// Policy: the admin gives each user a token file holding a key of their own, and maps that
// key's id to the user in agent.yaml (key_users). When key_users is configured, a job runs as
// the user its coordinator's key maps to, and only if the job's submitting user is that same
// user; a key that is not mapped runs nothing. root only with allow_root: true (checked on the
// name by the parser, and on uid 0 whatever its name when the users are looked up here). When
// key_users is absent, nothing changes: any key of the token file may run jobs, as the agent's
// own user (allowed_users still filters the submitting users). A standing coordinator's offer
// carries the submitter's delegation (version 6): the key that signed it is the job's key, not
// the coordinator's (decide_offer).
#pragma once

#include "agentconfig/agentconfig.hpp"
#include "proto/keyring.hpp"

#include <nlohmann/json.hpp>

#include <sys/types.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::agentconfig {

struct LocalUser {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups, the primary one included (as initgroups)
  std::string home;
  std::string shell;
};

// Key id → the user its jobs run as. Empty: key_users is not configured.
using KeyUserMap = std::map<std::string, LocalUser>;

// What to do with a job offer. Pure.
struct RunAsDecision {
  const LocalUser* user = nullptr;  // run as this user; nullptr: as the agent itself
  std::string refusal;              // non-empty: refuse the job, saying this
  std::string hint;
};
RunAsDecision decide_run_as(const KeyUserMap& users, std::string_view key_id, std::string_view claimed_user);

// The whole decision on a job_offer (its JSON, checked by the schema), pure, time injected:
// 1. whose key: the offer's delegation's (protocol version 6, from a standing coordinator;
//    proto/delegation.hpp), which must verify with `keys` for this job, user, spec and the key the
//    link proved (`link_key`), unexpired at `now_s`; else the link's own key;
// 2. decide_run_as with that key and the offer's user;
// 3. allowed_users on the authenticated user: with key_users, the user that key maps to (step 2
//    made the offer's user equal it); without, the name the authenticated peer (or the
//    delegation's signer) declares, since a shared token cannot tell users apart.
RunAsDecision decide_offer(const KeyUserMap& users, const std::vector<std::string>& allowed_users,
                           const proto::Keyring& keys, std::string_view link_key, const nlohmann::json& offer,
                           std::uint64_t now_s);

// The environment a job's workers get for their user (HOME, USER, LOGNAME, SHELL).
std::map<std::string, std::string> user_environment(const LocalUser& u);

// Looks a user up in the system's user database; nullopt when there is none by that name.
using UserLookup = std::function<std::optional<LocalUser>(const std::string& name)>;
std::optional<LocalUser> lookup_system_user(const std::string& name);

// Resolves cfg.key_users at the agent's start. Every problem is a Diagnostic at the user's
// position in the file: no such user; uid 0 without allow_root; a key id the token file does
// not hold (`key_ids`); a user other than the agent's own while the agent is not root
// (`agent_uid`), which could not switch to it. Throws ConfigError.
KeyUserMap resolve_key_users(const AgentConfig& cfg, const std::vector<std::string>& key_ids, uid_t agent_uid,
                             const UserLookup& lookup = lookup_system_user);

// The store port a job asks for (the assign's master_port; the root agent binds it), when the job
// runs as a user other than root: a port that user could bind itself, at or above
// `unprivileged_start` (the kernel's net.ipv4.ip_unprivileged_port_start, 1024 unless the admin
// changed it), or 0 (any free port). Empty: allowed; else why not. Pure.
std::string store_port_refusal(unsigned port, const LocalUser& user, unsigned unprivileged_start);
// net.ipv4.ip_unprivileged_port_start; 1024 when it cannot be read.
unsigned unprivileged_port_start();

}  // namespace ddp::agentconfig

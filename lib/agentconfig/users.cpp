// Per-user tokens: the decision (pure) and the user database look-ups (see users.hpp).
#include "agentconfig/users.hpp"

#include "common/strings.hpp"
#include "common/text.hpp"
#include "proto/delegation.hpp"

#include <fmt/format.h>

#include <grp.h>
#include <pwd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

namespace ddp::agentconfig {

RunAsDecision decide_run_as(const KeyUserMap& users, std::string_view key_id, std::string_view claimed_user) {
  RunAsDecision d;
  if (users.empty()) return d;
  const auto it = users.find(std::string(key_id));
  if (it == users.end()) {
    d.refusal = fmt::format("key '{}' is not mapped to a local user here, and this node runs jobs only for mapped keys",
                            key_id);
    d.hint = "the node's /etc/ddpctl/agent.yaml maps token key ids to the users their jobs run as (key_users)";
    return d;
  }
  if (it->second.name != claimed_user) {
    // The offer's words, for our log and the refusal back: shown clean.
    const auto claimed = clean_text(claimed_user, 256);
    d.refusal = fmt::format("key '{}' runs jobs only as user '{}', but this job's user is '{}'", key_id,
                            it->second.name, claimed);
    d.hint = fmt::format("submit as '{}', or with the token file provisioned for '{}'", it->second.name, claimed);
    return d;
  }
  d.user = &it->second;
  return d;
}

RunAsDecision decide_offer(const KeyUserMap& users, const std::vector<std::string>& allowed_users,
                           const proto::Keyring& keys, std::string_view link_key, const nlohmann::json& offer,
                           std::uint64_t now_s) {
  const auto claimed = offer.at("user").get<std::string>();
  std::string key_id(link_key);
  if (offer.contains("delegation")) {
    RunAsDecision d;
    std::string error;
    auto del = proto::delegation_from_json(offer["delegation"], &error);
    if (del) {
      if (auto why = proto::verify_delegation(*del, keys,
                                              {offer.at("job_id").get<std::string>(), claimed, std::string(link_key),
                                               "", proto::payload_digest(offer.at("spec")), now_s})) {
        error = *why;
      }
    }
    if (!error.empty()) {
      d.refusal = error;
      d.hint =
          "a standing coordinator's job carries the delegation its submitter's ddpctl signed: submit the job again";
      return d;
    }
    key_id = del->key_id;
  }
  auto d = decide_run_as(users, key_id, claimed);
  if (!d.refusal.empty()) return d;
  const std::string& user = d.user ? d.user->name : claimed;
  if (!allowed_users.empty() && std::find(allowed_users.begin(), allowed_users.end(), user) == allowed_users.end()) {
    RunAsDecision r;
    r.refusal = fmt::format("does not accept jobs from user '{}': not in allowed_users", clean_text(user, 256));
    r.hint = "the node's /etc/ddpctl/agent.yaml lists the users it accepts (allowed_users)";
    return r;
  }
  return d;
}

std::map<std::string, std::string> user_environment(const LocalUser& u) {
  return {{"HOME", u.home}, {"USER", u.name}, {"LOGNAME", u.name}, {"SHELL", u.shell.empty() ? "/bin/sh" : u.shell}};
}

std::optional<LocalUser> lookup_system_user(const std::string& name) {
  struct passwd pw {};
  struct passwd* res = nullptr;
  std::vector<char> buf(16384);
  while (true) {
    const int rc = ::getpwnam_r(name.c_str(), &pw, buf.data(), buf.size(), &res);
    if (rc == ERANGE && buf.size() < (1u << 20)) {
      buf.resize(buf.size() * 2);
      continue;
    }
    if (rc != 0 || !res) return std::nullopt;
    break;
  }
  LocalUser u{pw.pw_name, pw.pw_uid, pw.pw_gid, {}, pw.pw_dir ? pw.pw_dir : "/", pw.pw_shell ? pw.pw_shell : ""};
  int n = 32;
  for (int tries = 0; tries < 8; ++tries) {
    std::vector<gid_t> groups(static_cast<std::size_t>(n));
    const int want = n;
    if (::getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &n) >= 0) {
      groups.resize(static_cast<std::size_t>(n));
      u.groups = std::move(groups);
      return u;
    }
    n = std::max(n, want * 2);  // n now holds the count needed (glibc), or grow
  }
  u.groups = {pw.pw_gid};
  return u;
}

KeyUserMap resolve_key_users(const AgentConfig& cfg, const std::vector<std::string>& key_ids, uid_t agent_uid,
                             const UserLookup& lookup) {
  KeyUserMap out;
  std::vector<Diagnostic> diags;
  for (const auto& ku : cfg.key_users) {
    auto error = [&](std::string msg) { diags.push_back({cfg.file, ku.line, ku.column, std::move(msg)}); };
    if (std::find(key_ids.begin(), key_ids.end(), ku.key_id) == key_ids.end()) {
      error(fmt::format("key_users: key '{}' is not in the token file (its keys: {})", ku.key_id, join(key_ids, ", ")));
      continue;
    }
    auto u = lookup(ku.user);
    if (!u) {
      error(fmt::format("key_users: key '{}': no local user '{}' on this node", ku.key_id, ku.user));
      continue;
    }
    if (u->uid == 0 && !cfg.allow_root) {
      error(fmt::format("key_users: key '{}': user '{}' has uid 0; jobs run as root only with allow_root: true",
                        ku.key_id, ku.user));
      continue;
    }
    if (agent_uid != 0 && u->uid != agent_uid) {
      error(fmt::format("key_users: key '{}': ddp-agentd runs as uid {}, not root, so it cannot run jobs as '{}'",
                        ku.key_id, agent_uid, ku.user));
      continue;
    }
    out.emplace(ku.key_id, std::move(*u));
  }
  if (!diags.empty()) throw ConfigError(std::move(diags));
  return out;
}

std::string store_port_refusal(unsigned port, const LocalUser& user, unsigned unprivileged_start) {
  if (port == 0 || user.uid == 0 || port >= unprivileged_start) return {};
  return fmt::format(
      "store port {} is a privileged port (below {}), which user {} could not bind: pick a port of "
      "{} or more, or 0 for any free one (store.port in the job file)",
      port, unprivileged_start, user.name, unprivileged_start);
}

unsigned unprivileged_port_start() {
  std::ifstream f("/proc/sys/net/ipv4/ip_unprivileged_port_start");
  unsigned v = 0;
  if (f >> v && v <= 65536) return v;
  return 1024;
}

}  // namespace ddp::agentconfig

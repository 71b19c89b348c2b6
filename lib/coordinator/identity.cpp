// The standing coordinator's client identity decisions (identity.hpp).
#include "coordinator/identity.hpp"

#include "common/text.hpp"

#include <fmt/format.h>

namespace ddp::coordinator {

ClientIdentity client_identity(const CoordinatorKeyUsers& key_users, std::string_view key_id,
                               std::string_view declared_user) {
  ClientIdentity id;
  if (key_users.empty()) {
    id.user = declared_user;
    return id;
  }
  const auto it = key_users.find(key_id);
  if (it == key_users.end()) {
    id.refusal =
        fmt::format("key '{}' is not mapped to a user on this coordinator, which serves only mapped keys", key_id);
    id.hint = "the coordinator's admin maps each user's key with ddp-coordinator --key-user KEY=USER";
    return id;
  }
  if (it->second != declared_user) {
    // What the client declared goes into our log and back to it: shown clean.
    id.refusal = fmt::format("key '{}' belongs to user '{}', but this client says it is '{}'", key_id, it->second,
                             clean_text(declared_user, 256));
    id.hint = fmt::format("run ddpctl as '{}', or with the token file of the user you are", it->second);
    return id;
  }
  id.user = it->second;
  return id;
}

bool may_touch(std::string_view job_user, std::string_view user) {
  return user == job_user || user == "root";
}

}  // namespace ddp::coordinator

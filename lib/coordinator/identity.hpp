// Who a ddpctl client of the standing coordinator is: the decisions, pure (no sockets, no clock).
//
// Policy: with key_users (ddp-coordinator --key-user KEY=USER), a client acts only as the user
// its key maps to: the name its hello declares must be that user, or the connection is refused;
// a key that is not mapped is refused. root only through a key mapped to root. Without
// key_users the coordinator has no way to tell users apart (one shared token: whoever holds a
// key may name any user, and could as well dial the agents directly), so the declared name is
// taken as it is, as before protocol version 6.
#pragma once

#include <map>
#include <string>
#include <string_view>

namespace ddp::coordinator {

// Key id → user name. Empty: not configured.
using CoordinatorKeyUsers = std::map<std::string, std::string, std::less<>>;

struct ClientIdentity {
  std::string user;     // the user this connection acts as (empty when refused)
  std::string refusal;  // non-empty: refuse the connection, saying this
  std::string hint;
};
ClientIdentity client_identity(const CoordinatorKeyUsers& key_users, std::string_view key_id,
                               std::string_view declared_user);

// Whether `user` (authenticated, as above) may stop, inspect or read the logs of a job of `job_user`.
bool may_touch(std::string_view job_user, std::string_view user);

}  // namespace ddp::coordinator

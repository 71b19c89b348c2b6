// Token files on disk: where they are looked for, and the checks before a secret is trusted.
//
// Policy: a token file owned by another user than us (root aside), or readable or writable by
// group or others, is refused (its secret may already be known, or be changed), as ssh refuses
// a private key; every error names the file and says what to do. The format is proto/keyring.hpp's.
#pragma once

#include "proto/keyring.hpp"

#include <sys/types.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::net {

class TokenError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Reads, checks (regular file, ours or root's, mode 0600 or stricter) and parses. Throws TokenError.
proto::Keyring load_token_file(const std::string& path);
// Why a token file owned by `file_uid` is not trusted by a process running as `self`
// (nullopt: it is). Its owner can read and rewrite it, whatever its mode says.
std::optional<std::string> token_owner_problem(const std::string& path, uid_t file_uid, uid_t self);

// Where a client (ddpctl) looks, in order: $DDP_TOKEN_FILE, $XDG_CONFIG_HOME/ddpctl/token
// (else ~/.config/ddpctl/token), /etc/ddpctl/token.
std::vector<std::string> client_token_candidates();
// The first candidate that exists; throws TokenError listing where it looked.
std::string find_client_token_file();

inline constexpr const char* kAgentTokenFile = "/etc/ddpctl/token";

}  // namespace ddp::net

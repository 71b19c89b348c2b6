// The libssh edge: one SSH session to one node (RAII over ssh_session), used by one thread.
//
// connect() reads ~/.ssh/config (and /etc/ssh/ssh_config) for the node, so User, Port,
// IdentityFile, ProxyJump/ProxyCommand and the like apply as with `ssh`; a port given in
// --nodes wins. The host key is checked against known_hosts (policy.hpp decides); then public
// key authentication (ssh-agent, then the configured and default identity files). Every
// blocking step is bounded by the session's timeout.
#pragma once

#include "common/duration.hpp"
#include "ssh/policy.hpp"

#include <libssh/libssh.h>

#include <cstdint>
#include <iosfwd>
#include <string>

namespace ddp::ssh {

struct SessionOptions {
  std::string node;  // as listed (for messages)
  std::string host;
  std::uint16_t port = 0;  // 0: from the config, else 22
  std::string user;        // empty: from the config, else the local user
  Millis timeout{15000};
  bool accept_new = false;
};

struct ExecResult {
  int exit_status = -1;
  std::string out, err;
};

class Session {
 public:
  Session();
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // TCP connect and key exchange. Empty on success, else libssh's error.
  std::string connect(const SessionOptions& options);
  // known_hosts; accept_new may add the key. Empty on success, else the refusal (with fingerprint).
  std::string verify_host_key(const SessionOptions& options, std::string* added);
  // Empty on success.
  std::string authenticate();
  // Runs a command to its end (bounded by the timeout); throws std::runtime_error.
  ExecResult exec(const std::string& command);
  // Writes a local file to `remote_dir/name` (relative to the home; mode 0700, directories 0700)
  // through a temporary name and a rename, so a half-written file is never run. Over SFTP when the
  // node's sshd has the subsystem, else through an exec channel running exec_upload_command()
  // (policy.hpp) with the file on its stdin. Throws std::runtime_error.
  enum class UploadVia { sftp, exec };
  // `sha256`: the file's, checked on the node before an exec-channel upload is renamed into place.
  UploadVia upload(const std::string& local_path, const std::string& remote_dir, const std::string& name,
                   const std::string& sha256);
  // Starts a command and returns its open channel (owned by the caller: close_channel()).
  ssh_channel start(const std::string& command);
  static void close_channel(ssh_channel channel);

  ssh_session raw() const { return s_; }
  std::string error() const;
  std::string host() const;  // after ~/.ssh/config
  int port() const;
  std::string peer_address() const;  // of the TCP connection; empty through a proxy command

 private:
  ssh_session s_ = nullptr;
  void upload_exec(std::istream& in, std::uint64_t bytes, const std::string& remote_dir, const std::string& name,
                   const std::string& sha256);
  Millis timeout_{15000};
};

}  // namespace ddp::ssh

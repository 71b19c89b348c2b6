// The pure decisions of SSH mode (no libssh, no I/O, no clock): what to do with a host key, when
// to retry a connection, which agent binary to run, and the remote command lines.
//
// Host keys are checked as OpenSSH's StrictHostKeyChecking does: strictly by default (an
// unknown or changed key stops the launch, with its SHA256 fingerprint and how to trust it);
// `accept_new` adds an unknown key on first contact but still refuses a changed one.
//
// Connection retries: sshd's MaxStartups (default 10:30:100) drops unauthenticated connections
// at random once more than 10 are in progress, which a wide fan-out meets; a connection closed
// or reset before authentication is retried with exponential backoff and jitter. Timeouts,
// refusals, name errors and authentication failures are not: they do not fix themselves.
#pragma once

#include "common/duration.hpp"
#include "common/log.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddp::ssh {

// ---- host keys ----

enum class KnownHost { ok, changed, other_type, unknown, no_file, error };

struct HostKeyDecision {
  bool accept = false;
  bool remember = false;  // write the key to known_hosts
  std::string message;    // why it was refused (with the fingerprint and the fix), or what was added
};

struct HostKeyFacts {
  std::string node;  // as listed in --nodes
  std::string host;  // the host name libssh connected to (after ~/.ssh/config)
  int port = 22;
  std::string fingerprint;  // "SHA256:..."
  std::string key_type;     // "ssh-ed25519"
  std::string known_hosts;  // the file checked
};

HostKeyDecision decide_host_key(KnownHost state, bool accept_new, const HostKeyFacts& facts);

// ---- connection retries ----

enum class ConnectFailure { dropped, timeout, refused, unreachable, auth, host_key, other };

// Classifies libssh's error text for a failed connect.
ConnectFailure classify_connect_error(const std::string& libssh_error);

// What to check after a connect that failed for good, as "; ..." to follow the error (empty when
// the error says it already): a refused connection means no sshd listens at host:port.
std::string connect_hint(ConnectFailure failure, const std::string& host, std::uint16_t port, const std::string& user);

struct RetryPolicy {
  int max_attempts = 5;
  Millis initial{200};
  Millis max{3000};
};

// The wait before attempt `attempt + 1` (attempt counts from 1) after `failure`, or nullopt to
// give up. `jitter` in [0, 1) spreads nodes that were dropped together.
std::optional<Millis> retry_after(ConnectFailure failure, int attempt, double jitter, const RetryPolicy& policy = {});

// ---- remote commands and the agent binary ----

// Single-quotes for a POSIX shell (the remote login shell runs exec requests through `sh -c`).
std::string shell_quote(const std::string& s);

// One exec request that tells us what we need to choose the agent: the architecture, the
// version of `ddp-agentd` on the remote PATH, the address the node was reached at (from
// $SSH_CONNECTION: the SSH server's own address, right also through a ProxyJump) and whether
// our cached upload (by hash) is already there and runs (a library the node lacks shows here).
std::string probe_command(const std::string& our_sha256);

struct Probe {
  std::string arch;          // uname -m
  std::string path_version;  // `ddp-agentd --version` on PATH, empty when none
  std::string server_address;
  std::string cached_sha256;  // sha256 of ~/.cache/ddpctl/<sha>/ddp-agentd, empty when absent
  std::string cached_runs;    // what it prints for --version there (the loader's error when it cannot run)
};
// Throws std::runtime_error on output that does not have the probe's shape.
Probe parse_probe(const std::string& output);

// Where our binary goes: ~/.cache/ddpctl/<sha256>/ddp-agentd (relative to the home directory,
// which is where SFTP and exec requests start).
std::string cache_dir(const std::string& sha256);
// The shell command that receives a file on its stdin into ~/remote_dir/name when the node's sshd
// has no SFTP subsystem: directories made 0700 (umask), written under a temporary name, then
// renamed over the destination, so a half-written file is never run. POSIX sh.
// The file is renamed into place only when it has `bytes` bytes and the SHA-256 `sha256` (an
// interrupted transfer, whose stdin simply ends, leaves a short file that must never run).
std::string exec_upload_command(const std::string& remote_dir, const std::string& name, std::uint64_t bytes,
                                const std::string& sha256);
std::string cached_agent(const std::string& sha256);

struct AgentChoice {
  enum class Kind { on_path, cached, upload, impossible } kind = Kind::impossible;
  std::string command;  // the program to run (for on_path and cached)
  std::string reason;   // for logs and for the error when impossible
};
AgentChoice choose_agent(const Probe& probe, const std::string& our_version, const std::string& our_arch,
                         const std::string& our_sha256);

// The remote command line of the one-shot agent (its secret travels on stdin, never here).
std::string agent_command(const std::string& program, const std::string& node_name, bool verbose,
                          const std::string& connect_back = "");

// A line of the remote agent's stderr as our log shows it (common/log.hpp).
using log::relay_line;
using log::RelayedLine;

// Splits a byte stream into lines (the remote agent's stderr, relayed to our log). Bounded: a
// line longer than `max_line` is emitted in pieces.
class LineSplitter {
 public:
  explicit LineSplitter(std::size_t max_line = 16 * 1024) : max_(max_line) {}
  std::vector<std::string> feed(std::string_view bytes);
  std::optional<std::string> flush();

 private:
  std::size_t max_;
  std::string partial_;
};

}  // namespace ddp::ssh

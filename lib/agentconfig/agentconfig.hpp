// The agent's config file (/etc/ddpctl/agent.yaml): its model and its strict parser.
//
// Policy: the same as the job file's (lib/jobspec): every problem is a Diagnostic with file,
// line and column and what was expected, all problems are reported at once, an unknown key is
// an error with the nearest known key as a hint. Every field is optional: what the file leaves
// out keeps ddp-agentd's default, and a flag given on the command line wins over the file
// (ddp-agentd's main merges them).
#pragma once

#include "common/duration.hpp"
#include "jobspec/jobspec.hpp"

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::agentconfig {

using jobspec::Diagnostic;

class ConfigError : public std::runtime_error {
 public:
  explicit ConfigError(std::vector<Diagnostic> diagnostics);
  const std::vector<Diagnostic>& diagnostics() const { return diagnostics_; }

 private:
  std::vector<Diagnostic> diagnostics_;
};

inline constexpr const char* kDefaultPath = "/etc/ddpctl/agent.yaml";

enum class ContainerRuntime { podman, docker, none };
// Where jobs' shepherds run (lib/jobunit): auto (a transient systemd unit when the agent is a
// systemd service and the system bus answers, else a child), systemd (always a unit; the agent
// does not start without a bus), fork (always a child).
enum class JobUnits { automatic, systemd, fork };

// One entry of key_users: a token file key id and the local user that key's jobs run as, with
// where the user was written (for the errors found when the agent looks the user up).
struct KeyUser {
  std::string key_id;
  std::string user;
  int line = 0, column = 0;
};

// What one job may ask of this root agent's own resources (agent.yaml's `limits:`). The store
// and the rank logs are the agent's (root's memory, root's writes to log_dir: no user quota
// applies), so the job file's store.max_size, store.max_keys and logs.max_size may not pass them.
struct JobLimits {
  std::uint64_t store_max_size = 1ull << 30;  // the job file's default
  std::uint64_t store_max_keys = 1ull << 20;  // the job file's default
  std::uint64_t log_max_size = 1ull << 30;    // per rank file (kept twice: rotated once)
};

// Empty when the job's own limits fit within the agent's, else why not and what to change.
std::string over_limits(const jobspec::JobSpec& spec, const JobLimits& limits);

struct AgentConfig {
  std::string file;
  std::optional<std::string> listen;  // HOST:PORT, checked with lib/hostlist's endpoint syntax
  std::optional<std::string> token_file;
  std::optional<std::string> log_dir;
  std::optional<std::string> name;
  std::optional<Millis> heartbeat_timeout;  // 500ms .. 1h, as --heartbeat-timeout
  // Users this agent accepts jobs from; empty: everyone the token admits. The authenticated user
  // (users.hpp, decide_offer): with key_users the job's key's user; without, the declared name.
  std::vector<std::string> allowed_users;
  // Per-user tokens: each key id of the token file mapped to the local user its jobs run as
  // (agentconfig/users.hpp). Empty: not configured, and jobs run as the agent's own user.
  std::vector<KeyUser> key_users;
  // Whether a key may be mapped to root (uid 0). Off: no job ever runs as root through key_users.
  bool allow_root = false;
  std::optional<ContainerRuntime> container_runtime;
  std::optional<JobUnits> job_units;
  // The GPUs (indices in PCI bus order, UUIDs or PCI bus ids, as --gpus) and CPUs (a kernel
  // cpulist, as --cpus) this agent manages; absent: all of the node's.
  std::optional<std::vector<std::string>> gpus;
  std::optional<std::vector<int>> cpus;
  // TLS under the protocol (net/tls.hpp): "allowed" (either, told apart per connection),
  // "required" (plaintext coordinators are refused) or "off"; absent: allowed.
  std::optional<std::string> tls;
  JobLimits limits;
};

// Parses YAML text; `file` names it in diagnostics. Throws ConfigError.
AgentConfig parse_agent_config(const std::string& text, const std::string& file);
// Reads and parses a file. Throws ConfigError (also for an unreadable file).
AgentConfig load_agent_config(const std::string& path);

const char* to_string(ContainerRuntime r);

}  // namespace ddp::agentconfig

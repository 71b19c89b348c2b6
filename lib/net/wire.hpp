// What travels with a job between the coordinator and the agents, besides the schema's own
// fields: the validated job spec and the launcher's forwarded environment, as one JSON object
// (job_offer.spec and assign.spec). Pure; the agent re-checks what it receives, since a spec off
// the wire is input like any other.
#pragma once

#include "jobspec/jobspec.hpp"

#include <nlohmann/json.hpp>

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::net {

struct JobPayload {
  jobspec::JobSpec spec;
  std::map<std::string, std::string> forward_env;  // the launcher's values for spec.env_forward
};

class WireError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

nlohmann::json to_json(const JobPayload& p);
// Throws WireError naming the field.
JobPayload payload_from_json(const nlohmann::json& j);

// The launcher's variables that env_forward selects (names matching its entries).
std::map<std::string, std::string> forwarded_env(const std::map<std::string, std::string>& launcher_env,
                                                 const std::vector<std::string>& patterns);

// Names of --nodes entries for logs, prefixes and the rendezvous: the host, or host:port where
// two entries share a host (two agents on one machine).
struct NodeEntry {
  std::string name;
  std::string host;
  std::uint16_t port = 0;
  std::string user;  // SSH login name from "user@host" (only when allow_user); empty: ~/.ssh/config's
};
// Throws WireError with the entry and column of a bad one. allow_user: entries may name an SSH
// login user ("alice@n1"); agents reached over TCP have no such thing, so elsewhere it is an error.
std::vector<NodeEntry> node_entries(const std::vector<std::string>& hosts, std::uint16_t default_port,
                                    bool allow_user = false);

}  // namespace ddp::net

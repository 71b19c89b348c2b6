// Live facts from the agents (`ddpctl doctor --nodes`): dial every node, authenticate as a
// coordinator, ask for its facts ('facts_request'), and return what each node said, or why it
// said nothing, within one deadline for all.
#pragma once

#include "common/duration.hpp"
#include "proto/keyring.hpp"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace ddp::coordinator {

struct GatheredFacts {
  std::string node;                     // the --nodes entry's name
  std::optional<nlohmann::json> facts;  // the agent's answer, in the facts model
  std::string error;                    // why there is none: unreachable, refused, timed out
  std::string address;                  // the address its agent was reached at, as the coordinator names it
};

// Connecting to an agent and the handshake get at most this long (less when `timeout` is shorter):
// a node whose firewall drops the connection is named as unreachable then, not at the deadline.
inline constexpr Millis kReachTimeout{10000};

// Entries as for --nodes (host, host:port, [v6]:port). One result per entry, in order.
// tls: inside TLS 1.3 keyed by the token, as launch --tls.
// `image` ({runtime, image}, or null): each node also looks that container image up (its facts'
// container_image).
std::vector<GatheredFacts> gather_facts(const std::vector<std::string>& nodes, const proto::Keyring& keys,
                                        const std::string& user, Millis timeout, const nlohmann::json& image = nullptr,
                                        bool tls = false);

}  // namespace ddp::coordinator

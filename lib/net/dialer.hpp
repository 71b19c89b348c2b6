// How the coordinator reaches a node's agent when it does not dial TCP itself: a Dialer hands
// back one end of a byte stream (a socketpair) that leads to an agent speaking the protocol
// (SSH mode: an `ddp-agentd --oneshot --stdio` started through libssh, see lib/ssh).
#pragma once

#include "net/connection.hpp"
#include "net/wire.hpp"

#include <functional>
#include <optional>
#include <string>

namespace ddp::net {

struct Dialed {
  std::string error;                    // empty on success: what failed, for the node's error line
  std::optional<stream_socket> socket;  // on success: the stream to the agent
  std::string address;                  // the node's address for its peers (MASTER_ADDR, store allow-list)
};

class Dialer {
 public:
  virtual ~Dialer() = default;
  // Starts reaching `node`; `done` runs once on the io_context's thread.
  virtual void dial(const NodeEntry& node, std::function<void(Dialed)> done) = 0;
  // What a node is called in logs ("n1 over ssh").
  virtual std::string describe(const NodeEntry& node) const = 0;
};

}  // namespace ddp::net

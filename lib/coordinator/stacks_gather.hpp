// `ddpctl stacks` for a multi-node job: the coordinator asks every node's agent for its ranks'
// stacks (stacks_request, protocol version 6), gathers the answers (one 'stacks' per rank, then
// 'stacks_done'), and answers the control client once every node is done or the deadline (the
// budget plus a margin for the network) has passed. Every rank asked for is in the answer: a node
// that did not answer in time, was lost, or speaks an older protocol appears with its ranks'
// errors saying so, which the merger makes a group of its own.
//
// An agent's answer is checked before use: a rank it does not hold, a process that is not of
// stacks::process_from_json's shape, or an answer to no request in flight is dropped.
#pragma once

#include "common/duration.hpp"
#include "stacks/merge.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ddp::coordinator {

class StacksGather {
 public:
  explicit StacksGather(boost::asio::io_context& io) : io_(io) {}

  struct NodeAsk {
    std::string node;
    std::vector<int> ranks;        // global ranks of this node asked for
    std::vector<int> local_ranks;  // the same, as local ranks
    std::string unavailable;       // non-empty: not asked; its ranks' error
    // Sends the node its stacks_request (the id filled in by start()).
    std::function<void(nlohmann::json request)> send;
  };
  using Reply = std::function<void(nlohmann::json)>;  // {"world_size", "ranks": [{rank, node, process}]}

  void start(std::vector<NodeAsk> nodes, bool native, Millis budget, int world_size, Reply reply);
  // An agent's 'stacks' / 'stacks_done' (already schema-checked), from node `node`.
  void on_stacks(const std::string& node, const nlohmann::json& body);
  void on_done(const std::string& node, const nlohmann::json& body);

  static constexpr Millis kMargin{3000};  // the network's share of the deadline
  static constexpr std::size_t kMaxInFlight = 4;

 private:
  struct Pending;
  void finish(std::uint64_t id);

  boost::asio::io_context& io_;
  std::uint64_t next_id_ = 1;
  std::map<std::uint64_t, std::shared_ptr<Pending>> pending_;
};

// A stacks answer ({"ranks": [{rank, node, process}]}) cut so that its JSON text fits in
// `max_bytes` (the standing coordinator relays it in one 'control' message, 768 KiB): each
// process gets an equal share (stacks::shrink_to_fit, which says what it left out). Pure.
void fit_stacks_reply(nlohmann::json& reply, std::size_t max_bytes);

}  // namespace ddp::coordinator

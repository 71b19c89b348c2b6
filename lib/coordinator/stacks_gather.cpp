// See stacks_gather.hpp.
#include "coordinator/stacks_gather.hpp"

#include "stacks/collect.hpp"

#include <fmt/format.h>
#include <boost/asio/post.hpp>

#include <algorithm>

namespace ddp::coordinator {

using nlohmann::json;

struct StacksGather::Pending {
  explicit Pending(boost::asio::io_context& io) : timer(io) {}
  struct NodeState {
    std::vector<int> ranks;
    std::map<int, stacks::ProcessStacks> got;
    bool done = false;
    std::string error;  // the node's own (stacks_done's), or why it was not asked
  };
  std::map<std::string, NodeState> nodes;
  int world_size = 0;
  Millis budget{0};
  Reply reply;
  boost::asio::steady_timer timer;
};

namespace {
stacks::ProcessStacks not_read(std::string why) {
  stacks::ProcessStacks p;
  p.python = "not read";
  p.errors.push_back(std::move(why));
  return p;
}
}  // namespace

void StacksGather::start(std::vector<NodeAsk> nodes, bool native, Millis budget, int world_size, Reply reply) {
  if (pending_.size() >= kMaxInFlight) {
    boost::asio::post(io_, [reply = std::move(reply), world_size] {
      json ranks = json::array();
      reply(
          {{"world_size", world_size}, {"ranks", ranks}, {"error", "four stack reads are running already; try again"}});
    });
    return;
  }
  const auto id = next_id_++;
  auto p = std::make_shared<Pending>(io_);
  p->world_size = world_size;
  p->budget = budget;
  p->reply = std::move(reply);
  pending_[id] = p;
  for (auto& n : nodes) {
    auto& s = p->nodes[n.node];
    s.ranks = n.ranks;
    if (!n.unavailable.empty()) {
      s.done = true;
      s.error = n.unavailable;
      continue;
    }
    n.send({{"id", id}, {"local_ranks", n.local_ranks}, {"native", native}, {"budget_ms", budget.count()}});
  }
  p->timer.expires_after(budget + kMargin);
  p->timer.async_wait([this, id](boost::system::error_code ec) {
    if (!ec) finish(id);
  });
  if (std::all_of(p->nodes.begin(), p->nodes.end(), [](const auto& kv) { return kv.second.done; })) {
    boost::asio::post(io_, [this, id] { finish(id); });
  }
}

void StacksGather::on_stacks(const std::string& node, const json& body) {
  auto it = pending_.find(body["id"].get<std::uint64_t>());
  if (it == pending_.end()) return;  // after its deadline
  auto n = it->second->nodes.find(node);
  if (n == it->second->nodes.end() || n->second.done) return;
  const auto rank = static_cast<int>(body["rank"].get<std::uint64_t>());
  if (std::find(n->second.ranks.begin(), n->second.ranks.end(), rank) == n->second.ranks.end()) return;
  std::string error;
  auto p = stacks::process_from_json(body["process"], error);
  n->second.got[rank] = p ? std::move(*p) : not_read(fmt::format("node {} sent a malformed answer: {}", node, error));
}

void StacksGather::on_done(const std::string& node, const json& body) {
  const auto id = body["id"].get<std::uint64_t>();
  auto it = pending_.find(id);
  if (it == pending_.end()) return;
  auto n = it->second->nodes.find(node);
  if (n == it->second->nodes.end() || n->second.done) return;
  n->second.done = true;
  if (body.contains("error")) n->second.error = body["error"].get<std::string>();
  const auto& nodes = it->second->nodes;
  if (std::all_of(nodes.begin(), nodes.end(), [](const auto& kv) { return kv.second.done; })) finish(id);
}

void StacksGather::finish(std::uint64_t id) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return;
  auto p = it->second;
  pending_.erase(it);
  p->timer.cancel();
  std::vector<std::pair<int, json>> out;
  for (auto& [node, s] : p->nodes) {
    for (int rank : s.ranks) {
      stacks::ProcessStacks ps;
      if (auto g = s.got.find(rank); g != s.got.end())
        ps = std::move(g->second);
      else if (!s.error.empty())
        ps = not_read(s.error);
      else if (s.done)
        ps = not_read(fmt::format("node {} sent nothing for this rank", node));
      else
        ps = not_read(fmt::format("node {} did not answer within {} ms", node, (p->budget + kMargin).count()));
      out.emplace_back(rank, json{{"rank", rank}, {"node", node}, {"process", stacks::to_json(ps)}});
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  json ranks = json::array();
  for (auto& [rank, j] : out) ranks.push_back(std::move(j));
  p->reply({{"world_size", p->world_size}, {"ranks", std::move(ranks)}});
}

void fit_stacks_reply(json& reply, std::size_t max_bytes) {
  auto size = [&] { return reply.dump(-1, ' ', false, json::error_handler_t::replace).size(); };
  if (size() <= max_bytes || !reply.contains("ranks") || !reply["ranks"].is_array() || reply["ranks"].empty()) return;
  // Room for the envelope of every rank (rank, node, keys): 256 bytes each.
  const std::size_t n = reply["ranks"].size();
  const std::size_t share = max_bytes > 256 * n ? (max_bytes - 256 * n) / n : 0;
  for (auto& r : reply["ranks"]) {
    std::string error;
    auto p = r.contains("process") ? stacks::process_from_json(r["process"], error) : std::nullopt;
    if (!p) continue;
    stacks::shrink_to_fit(*p, share);
    r["process"] = stacks::to_json(*p);
  }
}

}  // namespace ddp::coordinator

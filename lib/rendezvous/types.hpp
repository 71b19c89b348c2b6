// Strong ids for the rendezvous: a node rank, a global rank, a local rank and a round are all
// small integers, and mixing them up is the classic launcher bug, so each is its own type.
#pragma once

#include <chrono>
#include <compare>
#include <cstdint>
#include <ostream>

namespace ddp::rendezvous {

template <class Tag>
struct Id {
  std::uint32_t value = 0;
  constexpr Id() = default;
  constexpr explicit Id(std::uint32_t v) : value(v) {}
  constexpr auto operator<=>(const Id&) const = default;
  friend std::ostream& operator<<(std::ostream& os, Id id) { return os << Tag::kName << id.value; }
};

struct NodeRankTag {
  static constexpr const char* kName = "node_rank=";
};
struct GlobalRankTag {
  static constexpr const char* kName = "rank=";
};
struct LocalRankTag {
  static constexpr const char* kName = "local_rank=";
};
struct RoundTag {
  static constexpr const char* kName = "round=";
};

using NodeRank = Id<NodeRankTag>;
using GlobalRank = Id<GlobalRankTag>;
using LocalRank = Id<LocalRankTag>;
using Round = Id<RoundTag>;

// Time as the edge injects it: microseconds on the coordinator's clock (the same clock it used
// for the handshake's t0/t2, so agents' exit times map onto it through their offsets).
using Micros = std::chrono::microseconds;
using TimePoint = Micros;

}  // namespace ddp::rendezvous

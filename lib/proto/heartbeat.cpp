#include "proto/heartbeat.hpp"

#include <algorithm>

namespace ddp::proto {

namespace {
Millis bounded(Millis m) {
  return std::clamp(m, kBeatFloor, kBeatCeiling);
}
}  // namespace

Millis offered_beat_interval(Millis job_heartbeat_timeout) {
  return bounded(job_heartbeat_timeout / 3);
}

Millis agent_beat_interval(std::optional<Millis> offered, Millis agent_heartbeat_timeout) {
  if (!offered) return kBeatFloor;
  // Whole seconds: the agent's timer ticks every second, so what it says is what it does.
  const auto beats = bounded(std::min(*offered, agent_heartbeat_timeout / 3));
  return std::chrono::duration_cast<std::chrono::seconds>(beats);
}

Millis joined_beat_interval(std::optional<Millis> said, Millis offered) {
  if (!said) return kBeatFloor;
  return std::clamp(*said, kBeatFloor, std::max(kBeatFloor, offered));
}

Millis coordinator_beat_due(Millis node_interval) {
  return node_interval + node_interval / 4;
}

}  // namespace ddp::proto

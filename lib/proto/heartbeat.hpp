// How often the two ends of a job's link beat (protocol version 7), from the two silences each
// side tolerates: the job's rendezvous.heartbeat_timeout (T: a node silent that long is lost) and
// the agent's own heartbeat_timeout (L: a coordinator silent that long stops its workers).
//
// Before version 7 both ends beat every second whatever T and L were: at 4096 nodes 8192 frames a
// second, most of a coordinator's idle CPU (docs/performance.md, heartbeats). Now:
// - the coordinator offers a third of T (offered_beat_interval): two beats in a row may be late
//   before a node is lost;
// - the agent beats at that or a third of L, whichever is shorter, in whole seconds (its timer
//   ticks every second), and says so in its join (agent_beat_interval);
// - the coordinator answers each beat (its reply carries the ACK) and beats on its own to a node
//   not answered for 1.25 of that node's interval (coordinator_beat_due), so the agent hears
//   from it well within L.
// Every interval is 1 to 10 s: never faster than before, and never so slow that the clock-offset
// samples that ride on beats go stale. A peer of version 6 or older beats, and is beaten, every
// second.
#pragma once

#include <chrono>
#include <optional>

namespace ddp::proto {

using Millis = std::chrono::milliseconds;

inline constexpr Millis kBeatFloor{1000};     // the old fixed interval, the fastest
inline constexpr Millis kBeatCeiling{10000};  // the slowest (messages.json: heartbeat_ms max)

// The interval the coordinator offers a job's agents, from the job's heartbeat_timeout.
Millis offered_beat_interval(Millis job_heartbeat_timeout);

// The interval an agent beats its coordinator at: the offer's (absent: an older coordinator,
// every second) or a third of the agent's own heartbeat_timeout, whichever is shorter, rounded
// down to whole seconds.
Millis agent_beat_interval(std::optional<Millis> offered, Millis agent_heartbeat_timeout);

// What the coordinator takes from a join's heartbeat_ms (absent: an older agent, every second):
// never slower than it offered, never faster than the floor (a hostile value changes nothing
// but that node's own beats).
Millis joined_beat_interval(std::optional<Millis> said, Millis offered);

// The coordinator beats to a node on its own once this long has passed without a beat to it
// (its answers to the node's beats count).
Millis coordinator_beat_due(Millis node_interval);

}  // namespace ddp::proto

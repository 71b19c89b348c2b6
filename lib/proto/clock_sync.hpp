// Clock offset between the coordinator and an agent, from exchanges the protocol makes anyway
// (the job offer and its join, then every heartbeat pair): no probes of their own.
//
// The coordinator stamps t0 and sends it; the agent stamps t1 on arrival (its clock), holds the
// answer for `hold` (measured on its own clock: preflight checks, or until its next heartbeat)
// and echoes t0 and t1 with it; the coordinator stamps t2 on receipt. Assuming symmetric paths,
// the agent's clock read t1 + hold / 2 when ours read (t0 + t2) / 2, so
// offset = t1 + hold / 2 - (t0 + t2) / 2, within +/- rtt / 2 where rtt = t2 - t0 - hold.
// Of several samples the one with the shortest round trip has the tightest bound and wins.
// Agent times are mapped into the coordinator's clock as t_agent - offset.
#pragma once

#include <chrono>
#include <optional>

namespace ddp::proto {

using Micros = std::chrono::microseconds;

struct ClockSample {
  Micros t0, t1, t2;
  Micros hold{0};  // agent time between t1 and its answer
};

struct ClockOffset {
  Micros offset{0};       // agent clock minus coordinator clock
  Micros uncertainty{0};  // half the round trip
  Micros rtt{0};
};

// nullopt for a sample that cannot be right (t2 before t0, a negative hold, a hold longer than
// the whole round trip, or stamps so far apart that the arithmetic would overflow).
std::optional<ClockOffset> offset_from(const ClockSample& s);

class ClockSync {
 public:
  // False (and ignored) for an impossible sample.
  bool add(const ClockSample& s);
  std::optional<ClockOffset> best() const { return best_; }
  int samples() const { return samples_; }
  // An agent time in the coordinator's clock (identity until a sample arrived); a peer's time so
  // far out that it would overflow is held at the nearest end of the range.
  Micros to_local(Micros agent_time) const;

 private:
  std::optional<ClockOffset> best_;
  int samples_ = 0;
};

}  // namespace ddp::proto

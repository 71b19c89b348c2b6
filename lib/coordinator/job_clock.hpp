// The coordinator's one clock for a job: every deadline (heartbeats, join, last call, stop,
// restart backoff), every stamp the clock offsets are measured with, and every time the first
// failure is chosen by.
//
// Monotonic, so that a step of the system clock (NTP's, an operator's `date -s`) moves no
// deadline: on the system clock a step of more than the heartbeat timeout made every node look
// lost at once. Anchored to the wall clock once, when the job starts, so its readings are wall
// times as of that anchor (microseconds since the epoch): the stamps it sends agents stay near
// theirs (the offsets the join measures are the nodes' real skew, not the machine's uptime), and
// an exit mapped through an offset is a time a report can print. A later step changes none of
// it: exits stamped before and after the step keep their order against our stop and losses.
#pragma once

#include <algorithm>
#include <chrono>

namespace ddp::coordinator {

class JobClock {
 public:
  using Micros = std::chrono::microseconds;
  using Mono = std::chrono::steady_clock;
  using Wall = std::chrono::system_clock;

  JobClock() : JobClock(Mono::now(), Wall::now()) {}
  // The anchor: the steady clock's `mono` was the wall clock's `wall`.
  JobClock(Mono::time_point mono, Wall::time_point wall) : mono_(mono), wall_(wall) {}

  // Now, in microseconds since the epoch as of the anchor.
  Micros now() const { return at(Mono::now()); }
  Micros at(Mono::time_point t) const {
    return std::chrono::duration_cast<Micros>(wall_.time_since_epoch()) + std::chrono::duration_cast<Micros>(t - mono_);
  }
  // A reading of this clock as a wall time, for reports. A time a peer sent may be any 64-bit
  // count: held within what the wall clock's nanoseconds can say (about 292 years either way).
  static Wall::time_point to_wall(Micros t) {
    constexpr auto limit = std::chrono::duration_cast<Micros>(Wall::duration::max());
    return Wall::time_point(std::chrono::duration_cast<Wall::duration>(std::clamp(t, -limit, limit)));
  }
  Wall::time_point wall_now() const { return to_wall(now()); }

 private:
  Mono::time_point mono_;
  Wall::time_point wall_;
};

}  // namespace ddp::coordinator

// Clock-offset math; see clock_sync.hpp.
#include "proto/clock_sync.hpp"

#include "common/duration.hpp"

#include <cstdint>

namespace ddp::proto {

std::optional<ClockOffset> offset_from(const ClockSample& s) {
  // t1 and hold are the agent's, t0 its echo of ours: whatever 64-bit values a peer sends. A
  // sample whose arithmetic would overflow is as impossible as one out of order.
  const std::int64_t t0 = s.t0.count(), t1 = s.t1.count(), t2 = s.t2.count(), hold = s.hold.count();
  std::int64_t span = 0, offset = 0;
  if (t2 < t0 || hold < 0 || __builtin_sub_overflow(t2, t0, &span) || hold > span) return std::nullopt;
  const std::int64_t rtt = span - hold;
  // (t1 + hold / 2) - (t0 + t2) / 2, the midpoint as t0 + span / 2 (it lies between t0 and t2).
  if (__builtin_add_overflow(t1, hold / 2, &offset) || __builtin_sub_overflow(offset, t0 + span / 2, &offset)) {
    return std::nullopt;
  }
  return ClockOffset{Micros(offset), Micros(rtt / 2), Micros(rtt)};
}

Micros ClockSync::to_local(Micros agent_time) const {
  return saturating_minus(agent_time, best_ ? best_->offset : Micros{0});
}

bool ClockSync::add(const ClockSample& s) {
  auto o = offset_from(s);
  if (!o) return false;
  ++samples_;
  if (!best_ || o->rtt < best_->rtt) best_ = o;
  return true;
}

}  // namespace ddp::proto

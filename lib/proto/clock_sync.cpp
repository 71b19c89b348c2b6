// Clock-offset math; see clock_sync.hpp.
#include "proto/clock_sync.hpp"

namespace ddp::proto {

std::optional<ClockOffset> offset_from(const ClockSample& s) {
  if (s.t2 < s.t0 || s.hold < Micros{0} || s.hold > s.t2 - s.t0) return std::nullopt;
  const auto rtt = s.t2 - s.t0 - s.hold;
  // (t1 + hold / 2) - (t0 + t2) / 2 without overflowing on large epoch values.
  const auto midpoint = s.t0 + (s.t2 - s.t0) / 2;
  return ClockOffset{s.t1 + s.hold / 2 - midpoint, rtt / 2, rtt};
}

bool ClockSync::add(const ClockSample& s) {
  auto o = offset_from(s);
  if (!o) return false;
  ++samples_;
  if (!best_ || o->rtt < best_->rtt) best_ = o;
  return true;
}

}  // namespace ddp::proto

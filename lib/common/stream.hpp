// Which of a worker's two output streams a line came from: said by the supervisor (which reads
// the pipes), the control socket (which relays lines) and the coordinator (which receives them).
#pragma once

#include <string>

namespace ddp {

enum class Stream { out, err };

// Now as a rank log line begins: "2026-12-04T20:44:11.123Z" (UTC, milliseconds; fixed width, so
// lines sort by it as text). Rank log files, the control socket's live lines and `ddpctl logs
// --timestamps` share it.
std::string utc_timestamp();

}  // namespace ddp

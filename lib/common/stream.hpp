// Which of a worker's two output streams a line came from: said by the supervisor (which reads
// the pipes), the control socket (which relays lines) and the coordinator (which receives them).
#pragma once

namespace ddp {

enum class Stream { out, err };

}  // namespace ddp

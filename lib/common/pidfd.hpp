// Waiting on a process through its pidfd (Linux 5.3+: pidfd_open).
#pragma once

#include <chrono>

namespace ddp {

// Whether the process behind `pidfd` has exited within `limit` (its pidfd turns readable). A
// signal to this process (launchers' loops catch several: SIGCHLD, SIGINT, SIGUSR1, ...) ends
// poll early and is not restarted: the wait goes on for what is left of the limit.
bool pidfd_exited_within(int pidfd, std::chrono::milliseconds limit);

}  // namespace ddp

// libsystemd, loaded the first time a process needs it (dlopen of Debian's libsystemd.so.0):
// the journal sink of the logger (only when stderr is the journal) and sd_notify (only under a
// service manager). A command run from a terminal, `ddpctl launch` and ddp-ncclid among them,
// never maps it and the six libraries it needs (about 120 page faults and 2 ms at each start on a
// paravirtualised VM; docs/performance.md).
//
// The pointers' types are the declarations in Debian's headers (decltype), so a changed signature
// fails the build; systemd_test links the library as well and checks that the functions loaded
// here are that library's own.
#pragma once

#include <systemd/sd-daemon.h>
#include <systemd/sd-journal.h>

#include <string>

namespace ddp::systemd {

struct Api {
  decltype(&::sd_journal_sendv) journal_sendv = nullptr;
  decltype(&::sd_notify) notify = nullptr;
  decltype(&::sd_watchdog_enabled) watchdog_enabled = nullptr;
};

// Loads libsystemd.so.0 once (thread-safe). Null when it cannot be loaded or lacks a function;
// then load_error() says why.
const Api* api();
const std::string& load_error();

}  // namespace ddp::systemd

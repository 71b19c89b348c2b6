// Who waits for what: the store's waiters as data, and the one-line-per-key text that timeout
// and failure reports quote ("12/16 ranks waiting on `/default_pg/0//cuda//0` for 300 s; set
// by nobody").
//
// Policy: pure (no sockets, no clock reads; `now` is passed in). Waiters are grouped by the key
// they still miss; the longest-waiting keys come first. Ranks are named where the server could
// tie a connection to a rank, pids where it could only tie it to a process.
#pragma once

#include "common/strings.hpp"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::store {

using Clock = std::chrono::steady_clock;

struct WaitingClient {
  uint64_t connection = 0;    // the server's connection id
  std::string peer;           // "127.0.0.1:41234"
  std::optional<int> pid;     // from the 2.x PING nonce, or found through /proc (loopback)
  std::optional<int> rank;    // from the rank resolver, when it knew the pid
  Clock::time_point since{};  // when its WAIT (or BARRIER) arrived
};

struct WaitedKey {
  std::string key;        // as on the wire, PrefixStore prefixes included
  bool barrier = false;   // BARRIER waiters (counter at `key` below world size)
  bool deleted = false;   // the key existed earlier in this attempt, then was deleted
  std::size_t total = 0;  // how many wait; `waiters` lists the first of them (0: as many as listed)
  std::vector<WaitingClient> waiters;
};

struct WaitReport {
  std::size_t connections = 0;    // open client connections
  std::size_t keys = 0;           // keys in the store
  std::vector<WaitedKey> waited;  // one entry per key that somebody still waits for (the longest-waited ones)
  std::size_t waited_keys = 0;    // how many keys somebody waits for (0: as many as `waited` has)
};

// One line per waited key, '\n'-separated, no trailing newline; "" when nobody waits.
// world_size <= 0: the counts are given without a total ("3 clients waiting on ...").
// Keys are shown as printable_key() shows them; at most kMaxReportLines keys, the oldest waits
// first, then a line that counts the rest.
std::string format_wait_report(const WaitReport& report, int world_size, Clock::time_point now);
constexpr std::size_t kMaxReportLines = 20;

// A client's key as a log line or a report may show it: at most 80 characters, anything but
// printable ASCII (a terminal's escape sequences, newlines), backslashes and backticks (which
// quote keys in messages) as \xNN.
std::string printable_key(std::string_view key);

using ddp::format_rank_list;

}  // namespace ddp::store

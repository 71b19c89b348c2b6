// Worker output: line splitting, per-rank log files, the live terminal stream, last lines.
//
// Policy: a worker must never block on its output. ddpctl drains every pipe as data arrives;
// log files are plain appends; the terminal is fed by its own thread through a bounded queue,
// so a stuck terminal (a paused `less`, a full ssh window) costs dropped terminal lines, counted
// and announced, never a blocked worker. Lines longer than kMaxLine are cut into pieces.
#pragma once

#include "common/safe_fs.hpp"
#include "common/stream.hpp"

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace ddp::supervisor {

inline constexpr std::size_t kMaxLine = 64 * 1024;

class LineSplitter {
 public:
  // Appends data; returns the complete lines (without '\n'), cutting any line at kMaxLine.
  std::vector<std::string> feed(std::string_view data);
  // The unterminated rest, if any (at EOF).
  std::vector<std::string> finish();

 private:
  std::string partial_;
};

// Keeps the last N lines (for failure reports).
class LastLines {
 public:
  explicit LastLines(std::size_t n = 20) : max_(n) {}
  void add(std::string line);
  std::vector<std::string> lines() const { return {lines_.begin(), lines_.end()}; }

 private:
  std::size_t max_;
  std::deque<std::string> lines_;
};

using Stream = ddp::Stream;  // common/stream.hpp

// One rank's log file: "2026-12-02T10:30:00.123Z out| text". Rotated once (to .1) at the cap,
// so the newest output (the part that explains a failure) is always kept.
//
// The folder may be writable by the job (a root agent's attempt folder belongs to the job's
// user): the file is opened through the folder's fd without following a link, checked before
// the first byte (common/safe_fs.hpp), given to its owner through the fd, and rotation renames
// within the folder and creates the new file with O_EXCL. A file that cannot be opened so is
// not written at all (error() says why).
using ddp::utc_timestamp;  // common/stream.hpp: the stamp a rank log line begins with

class RankLogFile {
 public:
  // `owner`: the (uid, gid) the file (and each rotated successor) is given, for workers that
  // run as another user than us; nullopt: ours. A null `dir`: not written (`name` is its path).
  RankLogFile(std::shared_ptr<const safefs::Dir> dir, std::string name, std::uint64_t max_bytes,
              std::optional<std::pair<uid_t, gid_t>> owner = std::nullopt);
  // A file in a folder of our own (the launcher's copy of the logs): its folder is trusted.
  RankLogFile(const std::string& path, std::uint64_t max_bytes);
  ~RankLogFile();
  RankLogFile(const RankLogFile&) = delete;
  RankLogFile& operator=(const RankLogFile&) = delete;

  void write(Stream s, std::string_view line);
  void note(std::string_view text);  // a line of ddpctl's own, e.g. "exited with code 1"
  // To disk, so that `ddpctl logs` and `tail -f` see what arrived (once per read, not per line).
  void flush();
  const std::string& path() const { return path_; }
  // Why the file is not written (empty: it is).
  const std::string& error() const { return error_; }

 private:
  void open_first();
  void append(std::string_view text);
  void rotate_if_needed(std::size_t next);
  std::shared_ptr<const safefs::Dir> dir_;
  std::string name_, path_;
  std::uint64_t max_bytes_;
  std::uint64_t written_ = 0;
  safefs::Fd rotated_;  // the file the last rotation made .1, emptied at the next (rotate_if_needed)
  std::optional<safefs::Owner> owner_;
  safefs::Fd fd_;
  std::string buf_;  // written out by flush(), or when it grows past 64 KiB
  std::string error_;
};

class TerminalSink {
 public:
  explicit TerminalSink(std::size_t max_queued_bytes = 8u << 20);
  ~TerminalSink();  // drains what is queued, then joins
  TerminalSink(const TerminalSink&) = delete;
  TerminalSink& operator=(const TerminalSink&) = delete;

  void write(Stream s, std::string line);  // line includes its prefix, no newline
  // Waits until the queue is written, at most `limit` (a paused terminal must not hold up the
  // launcher's event loop); returns false if it gave up.
  bool flush(std::chrono::milliseconds limit = std::chrono::milliseconds(2000));

 private:
  void run();
  std::mutex mu_;
  std::condition_variable cv_, drained_;
  std::deque<std::pair<Stream, std::string>> queue_;
  std::size_t queued_bytes_ = 0;
  std::size_t max_queued_bytes_;
  std::uint64_t dropped_ = 0;
  bool busy_ = false;
  bool stop_ = false;
  bool inline_ = false;  // the thread could not be made: write() writes
  std::thread thread_;
};

}  // namespace ddp::supervisor

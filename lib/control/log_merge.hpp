// `ddpctl logs`: the ranks' log files merged into one stream by the time each line was written
// (the "<UTC time> out| text" prefix of lib/supervisor's RankLogFile, fixed width, so ordered as
// text). Streams, not loads: one pending line per file is held at a time, each cut at kMaxLine,
// so memory grows with the number of ranks, never with the files' size. The files may be in a
// job's folder and the reader root: each is opened as safe_fs.hpp's open_in_folder_to_read
// (no link followed, no FIFO opened, a regular file of its folder's owner only). A rank's own lines keep
// their order whatever their times say (a clock stepped back); equal times go lowest rank first.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace ddp::control {

struct MergedLine {
  int rank = -1;
  std::string time;    // as the file has it, e.g. "2026-12-04T20:44:11.123Z"
  std::string stream;  // "out" | "err"
  std::string text;
};

class LogMerge {
 public:
  // A file read up to `limit` bytes (what it held when a running job was asked).
  struct File {
    std::string path;
    std::uint64_t limit = UINT64_MAX;
  };
  // One rank's files, oldest first (a rotated rank-<r>.log.1, then rank-<r>.log).
  struct Source {
    int rank = -1;
    std::vector<File> files;
  };
  static constexpr std::size_t kMaxLine = 256 * 1024;
  // An ended job's files as its end record lists them (rank, path), each after its rotated
  // <file>.1 where there is one (logs.max_size); only `ranks` (every rank when empty). A file
  // in `limits` is read up to the size given there (a running job's, as it answered).
  static std::vector<Source> of_files(const std::vector<std::pair<int, std::string>>& files, const std::set<int>& ranks,
                                      const std::map<std::string, std::uint64_t>& limits = {});

  explicit LogMerge(std::vector<Source> sources);
  ~LogMerge();
  LogMerge(const LogMerge&) = delete;
  LogMerge& operator=(const LogMerge&) = delete;

  // The next line in time order; nullopt once every file is read. ddpctl's own "ddp|" notes and
  // lines of another shape are skipped.
  std::optional<MergedLine> next();
  // The files that could not be opened, as "rank R: cannot read PATH".
  const std::vector<std::string>& unreadable() const { return unreadable_; }

 private:
  struct Reader;
  bool advance(Reader& r);  // r's next line into r.pending; false when r is done
  std::vector<std::unique_ptr<Reader>> readers_;
  std::vector<std::size_t> heap_;  // indices into readers_, earliest pending line on top
  std::vector<std::string> unreadable_;
};

// Earlier attempts (`ddpctl logs --attempt N|all`). A job's files lie in its folder as
// <logs.dir>/<job-id>/attempt-<n>/rank-<r>.log: the folder and n of the files a launcher or an
// end record names (all in one attempt-<n> folder), nullopt otherwise.
struct AttemptFolder {
  std::string job_dir;
  int attempt = 0;
};
std::optional<AttemptFolder> attempt_folder_of(const std::vector<std::pair<int, std::string>>& files);
// The rank files of attempt `n` in `job_dir` (rank-<r>.log, by rank; an attempt of another
// world size has its own), nothing followed; empty when there is no such folder.
std::vector<std::pair<int, std::string>> rank_files_of_attempt(const std::string& job_dir, int n);

// `ddpctl logs --attempt`, wherever the files are (here, or a standing coordinator's): the
// attempts asked for, in order, each with its files and the line said before its lines ("job
// J, attempt 1 (the last)"), for a job whose current (or, `ended`, last) attempt's files are
// `files`. `which`: an attempt's number, or kEveryAttempt. Throws ControlError saying what is
// wrong (the files are not in attempt folders; no such attempt; a rank an attempt lacks)
// before anything is read.
struct AttemptLogs {
  int attempt = 0;
  std::vector<std::pair<int, std::string>> files;
  std::string header;
};
std::vector<AttemptLogs> attempt_logs(const std::string& job_id, const std::vector<std::pair<int, std::string>>& files,
                                      int which, const std::set<int>& ranks, bool ended);

}  // namespace ddp::control

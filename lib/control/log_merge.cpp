#include "control/log_merge.hpp"

#include "common/safe_fs.hpp"
#include "common/strings.hpp"
#include "control/paths.hpp"
#include "control/protocol.hpp"

#include <fmt/format.h>

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <filesystem>
#include <tuple>

namespace ddp::control {

struct LogMerge::Reader {
  int rank = -1;
  std::size_t order = 0;  // the source's place: equal times go in this order
  std::vector<File> files;
  std::size_t next_file = 0;
  safefs::Fd in;  // the file being read (none: the next one is opened)
  std::uint64_t left = 0;
  std::array<char, 8192> buf;  // as much as std::ifstream kept per file
  std::size_t pos = 0, len = 0;
  MergedLine pending;

  // The next byte, or -1 at the end of the file (or a read error).
  int get() {
    if (pos == len) {
      ssize_t n;
      do {
        n = ::read(in.get(), buf.data(), buf.size());
      } while (n < 0 && errno == EINTR);
      if (n <= 0) return -1;
      pos = 0;
      len = static_cast<std::size_t>(n);
    }
    return static_cast<unsigned char>(buf[pos++]);
  }

  // One line (without '\n') of at most `cap` bytes kept, the rest of a longer one skipped;
  // false at the end of the file or of `left`.
  bool read_line(std::string& out, std::size_t cap) {
    out.clear();
    bool any = false;
    while (left > 0) {
      const int c = get();
      if (c < 0) break;
      --left;
      any = true;
      if (c == '\n') return true;
      if (out.size() < cap) out.push_back(static_cast<char>(c));
    }
    return any;
  }
};

std::vector<LogMerge::Source> LogMerge::of_files(const std::vector<std::pair<int, std::string>>& files,
                                                 const std::set<int>& ranks,
                                                 const std::map<std::string, std::uint64_t>& limits) {
  std::vector<Source> sources;
  for (const auto& [rank, path] : files) {
    if (!ranks.empty() && !ranks.contains(rank)) continue;
    std::vector<File> chain;
    std::error_code ec;
    // Not followed if it is a link (opening it would refuse one anyway, and whether a link's
    // target exists is not ours to tell).
    if (std::filesystem::symlink_status(path + ".1", ec).type() == std::filesystem::file_type::regular)
      chain.push_back({path + ".1"});
    const auto limit = limits.find(path);
    chain.push_back({path, limit == limits.end() ? UINT64_MAX : limit->second});
    sources.push_back({rank, std::move(chain)});
  }
  return sources;
}

LogMerge::LogMerge(std::vector<Source> sources) {
  for (std::size_t i = 0; i < sources.size(); ++i) {
    auto r = std::make_unique<Reader>();
    r->rank = sources[i].rank;
    r->order = i;
    r->files = std::move(sources[i].files);
    readers_.push_back(std::move(r));
  }
  for (std::size_t i = 0; i < readers_.size(); ++i) {
    if (advance(*readers_[i])) heap_.push_back(i);
  }
  std::make_heap(heap_.begin(), heap_.end(), [this](std::size_t a, std::size_t b) {
    const auto& x = *readers_[a];
    const auto& y = *readers_[b];
    return std::tie(x.pending.time, x.order) > std::tie(y.pending.time, y.order);
  });
}

LogMerge::~LogMerge() = default;

bool LogMerge::advance(Reader& r) {
  std::string line;
  while (true) {
    if (!r.in) {
      if (r.next_file >= r.files.size()) return false;
      const auto& f = r.files[r.next_file++];
      // The folder may be the job's (ddpctl logs as root): no link followed, no FIFO opened.
      auto o = safefs::open_in_folder_to_read(f.path);
      if (!o.fd) {
        unreadable_.push_back(o.missing ? fmt::format("rank {}: cannot read {}", r.rank, f.path)
                                        : fmt::format("rank {}: cannot read {}: {}", r.rank, f.path, o.reason));
        continue;
      }
      r.in = std::move(o.fd);
      r.left = f.limit;
      r.pos = r.len = 0;
    }
    if (!r.read_line(line, kMaxLine)) {
      r.in = safefs::Fd();
      continue;
    }
    auto parsed = parse_log_line(line);
    if (!parsed) continue;
    r.pending.rank = r.rank;
    r.pending.time = line.substr(0, line.find(' '));
    r.pending.stream = std::move(parsed->stream);
    r.pending.text = std::move(parsed->text);
    return true;
  }
}

std::optional<MergedLine> LogMerge::next() {
  if (heap_.empty()) return std::nullopt;
  auto later = [this](std::size_t a, std::size_t b) {
    const auto& x = *readers_[a];
    const auto& y = *readers_[b];
    return std::tie(x.pending.time, x.order) > std::tie(y.pending.time, y.order);
  };
  std::pop_heap(heap_.begin(), heap_.end(), later);
  const auto i = heap_.back();
  MergedLine out = std::move(readers_[i]->pending);
  if (advance(*readers_[i])) {
    std::push_heap(heap_.begin(), heap_.end(), later);
  } else {
    heap_.pop_back();
  }
  return out;
}

std::optional<AttemptFolder> attempt_folder_of(const std::vector<std::pair<int, std::string>>& files) {
  std::optional<AttemptFolder> found;
  for (const auto& [rank, path] : files) {
    const std::filesystem::path p(path);
    const auto folder = p.parent_path().filename().string();
    constexpr std::string_view kPrefix = "attempt-";
    if (!folder.starts_with(kPrefix)) return std::nullopt;
    const auto n = parse_int(std::string_view(folder).substr(kPrefix.size()));
    if (!n || *n < 0 || *n > kMaxAttempt) return std::nullopt;
    AttemptFolder here{p.parent_path().parent_path().string(), static_cast<int>(*n)};
    if (found && (found->job_dir != here.job_dir || found->attempt != here.attempt)) return std::nullopt;
    found = std::move(here);
  }
  return found;
}

std::vector<AttemptLogs> attempt_logs(const std::string& job_id, const std::vector<std::pair<int, std::string>>& files,
                                      int which, const std::set<int>& ranks, bool ended) {
  if (files.empty())  // no rank has started (a rendezvous still gathering)
    throw ControlError(fmt::format("job {} has no log files yet", job_id));
  const auto folder = attempt_folder_of(files);
  if (!folder)
    throw ControlError(fmt::format(
        "job {}'s log files are not in its attempt folders, so its other attempts cannot be found", job_id));
  int first = 0, last = folder->attempt;
  if (which != kEveryAttempt) {
    if (which < 0 || which > last)
      throw ControlError(fmt::format("job {} has no attempt {} (it has {})", job_id, which,
                                     last == 0 ? std::string("attempt 0") : fmt::format("attempts 0-{}", last)));
    first = last = which;
  }
  std::vector<AttemptLogs> out;
  for (int k = first; k <= last; ++k) {
    auto ks = rank_files_of_attempt(folder->job_dir, k);
    // A rank asked for that has no file there: said (attempts may differ in size, and a
    // multi-node launcher's copy of a rank's lines begins with its first line).
    std::vector<int> missing, present;
    for (const auto& f : ks) present.push_back(f.first);
    for (int r : ranks) {
      if (!std::binary_search(present.begin(), present.end(), r)) missing.push_back(r);
    }
    if (!missing.empty() && !ks.empty())
      throw ControlError(fmt::format("attempt {}: no log file{} of rank{} {} (there {} rank{} {})", k,
                                     missing.size() == 1 ? "" : "s", missing.size() == 1 ? "" : "s",
                                     format_rank_list(missing), present.size() == 1 ? "is" : "are",
                                     present.size() == 1 ? "" : "s", format_rank_list(present)));
    auto header = fmt::format("job {}, attempt {}{}{}", job_id, k,
                              k == folder->attempt ? (ended ? " (the last)" : " (the latest)") : "",
                              ks.empty() ? fmt::format(": no log files in {}/attempt-{}", folder->job_dir, k) : "");
    out.push_back({k, std::move(ks), std::move(header)});
  }
  return out;
}

std::vector<std::pair<int, std::string>> rank_files_of_attempt(const std::string& job_dir, int n) {
  std::vector<std::pair<int, std::string>> out;
  const auto dir = fmt::format("{}/attempt-{}", job_dir, n);
  // Listed through the folder opened without following a link (the files themselves are opened
  // as of_files' are, each on its own).
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return out;
  DIR* d = ::fdopendir(fd);
  if (!d) {
    ::close(fd);
    return out;
  }
  while (const dirent* e = ::readdir(d)) {
    const std::string_view name = e->d_name;
    if (!name.starts_with("rank-") || !name.ends_with(".log")) continue;  // not rank-<r>.log.1: of_files adds it
    const auto digits = name.substr(5, name.size() - 9);
    const auto r = parse_int(digits);
    if (!r || *r < 0 || *r > (1 << 20) || std::to_string(*r) != digits) continue;  // rank-01.log is no rank's
    out.emplace_back(static_cast<int>(*r), fmt::format("{}/{}", dir, name));
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace ddp::control

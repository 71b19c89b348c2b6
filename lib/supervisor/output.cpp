#include "supervisor/output.hpp"

#include <unistd.h>

#include <fmt/format.h>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <system_error>
#include <utility>

namespace ddp::supervisor {

std::vector<std::string> LineSplitter::feed(std::string_view data) {
  std::vector<std::string> lines;
  while (!data.empty()) {
    auto nl = data.find('\n');
    std::string_view chunk = nl == std::string_view::npos ? data : data.substr(0, nl);
    // Cut before growing past the limit, so memory per stream stays bounded.
    while (partial_.size() + chunk.size() >= kMaxLine) {
      std::size_t take = kMaxLine - partial_.size();
      partial_.append(chunk.substr(0, take));
      lines.push_back(std::move(partial_));
      partial_.clear();
      chunk.remove_prefix(take);
    }
    partial_.append(chunk);
    if (nl == std::string_view::npos) break;
    if (!partial_.empty() && partial_.back() == '\r') partial_.pop_back();
    lines.push_back(std::move(partial_));
    partial_.clear();
    data.remove_prefix(nl + 1);
  }
  return lines;
}

std::vector<std::string> LineSplitter::finish() {
  if (partial_.empty()) return {};
  std::vector<std::string> out{std::move(partial_)};
  partial_.clear();
  return out;
}

void LastLines::add(std::string line) {
  lines_.push_back(std::move(line));
  while (lines_.size() > max_) lines_.pop_front();
}

RankLogFile::RankLogFile(std::shared_ptr<const safefs::Dir> dir, std::string name, std::uint64_t max_bytes,
                         std::optional<std::pair<uid_t, gid_t>> owner)
    : dir_(std::move(dir)), name_(std::move(name)), path_(dir_ ? dir_->path_of(name_) : name_), max_bytes_(max_bytes) {
  if (owner) owner_ = safefs::Owner{owner->first, owner->second};
  if (!dir_) {
    error_ = "its folder could not be opened";
    return;
  }
  open_first();
}

RankLogFile::RankLogFile(const std::string& path, std::uint64_t max_bytes) : path_(path), max_bytes_(max_bytes) {
  const auto slash = path.rfind('/');
  name_ = slash == std::string::npos ? path : path.substr(slash + 1);
  try {
    dir_ = std::make_shared<const safefs::Dir>(safefs::Dir::open(slash == std::string::npos ? "."
                                                                 : slash == 0               ? "/"
                                                                                            : path.substr(0, slash)));
  } catch (const safefs::FsError& e) {
    error_ = e.what();
    return;
  }
  open_first();
}

RankLogFile::~RankLogFile() {
  flush();
}

void RankLogFile::open_first() {
  try {
    fd_ = safefs::open_append(*dir_, name_, owner_);
  } catch (const safefs::FsError& e) {
    error_ = e.what();
  }
}

void RankLogFile::flush() {
  if (fd_ && !buf_.empty()) safefs::write_all(fd_.get(), buf_);
  buf_.clear();
}

void RankLogFile::append(std::string_view text) {
  if (!fd_) return;
  buf_.append(text);
  if (buf_.size() >= 64 * 1024) flush();
}

void RankLogFile::rotate_if_needed(std::size_t next) {
  if (written_ + next <= max_bytes_ || !fd_) return;
  flush();
  // What the last rotation made .1 goes now, whatever the job did with it (moved it away, linked
  // it, holds it open): truncated through our own descriptor, so that a rank's log never holds
  // more than its file and one .1 (root's writes pass the user's quota).
  if (rotated_) (void)::ftruncate(rotated_.get(), 0);
  written_ = 0;
  // Within the folder's fd: a name the job swapped for a link is moved, never followed, and the
  // new file is created fresh (O_EXCL, no link); whatever the job put in its place is removed
  // first. A file that cannot be made fresh ends this log, said in the old one.
  try {
    safefs::rename_in(*dir_, name_, name_ + ".1");
    safefs::Fd fresh;
    for (int attempt = 0; attempt < 3 && !fresh; ++attempt) {
      try {
        fresh = safefs::create_new(*dir_, name_, owner_);
      } catch (const safefs::FsError& e) {
        if (e.error() != EEXIST || attempt == 2) throw;
        safefs::remove_in(*dir_, name_);
      }
    }
    rotated_ = std::exchange(fd_, std::move(fresh));  // the file now .1
  } catch (const safefs::FsError& e) {
    error_ = e.what();
    safefs::write_all(fd_.get(),
                      fmt::format("{} ddp| log rotation failed, no more output here: {}\n", utc_timestamp(), error_));
    fd_ = safefs::Fd();
    return;
  }
  append(fmt::format("{} ddp| (older output rotated to {}.1)\n", utc_timestamp(), path_));
}

void RankLogFile::write(Stream s, std::string_view line) {
  auto ts = utc_timestamp();
  rotate_if_needed(ts.size() + line.size() + 6);
  append(fmt::format("{}{}{}\n", ts, s == Stream::out ? " out| " : " err| ", line));
  written_ += ts.size() + line.size() + 6;
}

void RankLogFile::note(std::string_view text) {
  auto ts = utc_timestamp();
  rotate_if_needed(ts.size() + text.size() + 6);
  append(fmt::format("{} ddp| {}\n", ts, text));
  flush();
  written_ += ts.size() + text.size() + 6;
}

// The writing thread starts with the first line: a quiet launch (-q, or workers that print
// nothing) never makes it.
TerminalSink::TerminalSink(std::size_t max_queued_bytes) : max_queued_bytes_(max_queued_bytes) {}

TerminalSink::~TerminalSink() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

static void write_fd(int fd, const std::string& s);

void TerminalSink::write(Stream s, std::string line) {
  bool here = false;
  {
    std::lock_guard lock(mu_);
    if (!thread_.joinable() && !inline_) {
      try {
        thread_ = std::thread([this] { run(); });  // it waits for the lock
      } catch (const std::system_error&) {
        // No thread to be had (the job's own threads used up the user's process limit, say): the
        // lines are written here as they come, which a paused terminal can hold up; a job is
        // never ended for its output.
        inline_ = true;
      }
    }
    here = inline_;
    if (!here) {
      if (queued_bytes_ + line.size() > max_queued_bytes_) {
        ++dropped_;
        return;
      }
      queued_bytes_ += line.size();
      queue_.emplace_back(s, std::move(line));
    }
  }
  if (here) {
    line += '\n';
    write_fd(s == Stream::out ? 1 : 2, line);
    return;
  }
  cv_.notify_one();
}

bool TerminalSink::flush(std::chrono::milliseconds limit) {
  std::unique_lock lock(mu_);
  return drained_.wait_for(lock, limit, [this] { return queue_.empty() && !busy_; });
}

static void write_fd(int fd, const std::string& s) {
  std::size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a closed terminal: nothing more to do
    off += static_cast<std::size_t>(n);
  }
}

void TerminalSink::run() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty() && stop_) return;
    // Take a batch, write it without the lock; group by stream to keep writes few.
    auto batch = std::move(queue_);
    queue_.clear();
    queued_bytes_ = 0;
    auto dropped = std::exchange(dropped_, 0);
    busy_ = true;
    lock.unlock();
    std::string out_buf, err_buf;
    if (dropped)
      err_buf += fmt::format("ddpctl: {} lines not shown (terminal too slow); they are in the log files\n", dropped);
    for (auto& [s, line] : batch) {
      auto& buf = s == Stream::out ? out_buf : err_buf;
      buf += line;
      buf += '\n';
    }
    if (!err_buf.empty()) write_fd(2, err_buf);
    if (!out_buf.empty()) write_fd(1, out_buf);
    lock.lock();
    busy_ = false;
    if (queue_.empty()) drained_.notify_all();
  }
}

}  // namespace ddp::supervisor

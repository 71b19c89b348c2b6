// See stack_snapshot.hpp.
#include "launch/stack_snapshot.hpp"

#include "common/log.hpp"

#include <fmt/format.h>
#include <boost/asio/buffer.hpp>

#include <fcntl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>
#include <stop_token>
#include <system_error>
#include <thread>

namespace ddp::launch {

namespace asio = boost::asio;

// What the reading thread and the loop share; the last of them to let go closes the eventfd.
struct StackSnapshot::Shared {
  explicit Shared(int fd) : efd(fd) {}
  ~Shared() { ::close(efd); }
  const int efd;
  std::mutex mu;
  std::vector<stacks::RankStacks> read;  // guarded by mu
  std::vector<int> gone;                 // guarded by mu: exited (or the pid reused) during the read
  std::stop_source stop;
};

StackSnapshot::StackSnapshot(asio::io_context& io, std::vector<Target> targets, Millis budget, Done done, Reader reader,
                             StartTime start_time)
    : targets_(std::move(targets)), budget_(budget), done_(std::move(done)), wake_(io), deadline_(io) {
  // Said on the loop, as promised, not from inside the constructor.
  auto fail_soon = [this](std::string why) {
    deadline_.expires_after(Millis(0));
    deadline_.async_wait([this, alive = alive_, why](boost::system::error_code ec) {
      if (*alive && !ec) complete(why);
    });
  };
  const int efd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  const int mine = efd < 0 ? -1 : ::fcntl(efd, F_DUPFD_CLOEXEC, 0);
  if (efd < 0 || mine < 0) {
    auto why = fmt::format("not read: eventfd: {}", std::strerror(errno));
    if (efd >= 0) ::close(efd);
    fail_soon(std::move(why));
    return;
  }
  shared_ = std::make_shared<Shared>(efd);
  wake_.assign(mine);
  // Each target's start time, taken here, while the loop has not reaped it (so its pid is still
  // its own): the reader reads /proc/<pid> by number, and a pid reused meanwhile would be someone
  // else's process, read as root into the report. Checked again after the read.
  std::vector<std::optional<unsigned long long>> started;
  for (const auto& t : targets_) started.push_back(start_time(t.pid));
  try {
    std::thread([shared = shared_, targets = targets_, started = std::move(started), reader = std::move(reader),
                 start_time = std::move(start_time)] {
      for (std::size_t i = 0; i < targets.size(); ++i) {
        const auto& t = targets[i];
        if (shared->stop.stop_requested()) break;
        stacks::RankStacks r{t.rank, t.node,
                             started[i] ? reader(t.pid, shared->stop.get_token()) : stacks::ProcessStacks{}};
        const bool same = started[i] && start_time(t.pid) == started[i];
        std::lock_guard lock(shared->mu);
        if (same) {
          shared->read.push_back(std::move(r));
        } else {
          shared->gone.push_back(t.rank);
        }
      }
      const std::uint64_t one = 1;
      [[maybe_unused]] auto n = ::write(shared->efd, &one, sizeof one);
    }).detach();
  } catch (const std::system_error& e) {  // EAGAIN: RLIMIT_NPROC, or out of memory for a stack
    log::get("launch")->warn("the ranks' stacks are not read: cannot start a thread: {}", e.what());
    fail_soon("not read: cannot start a thread");
    return;
  }
  wait_woken();
  deadline_.expires_after(budget_);
  deadline_.async_wait([this, alive = alive_](boost::system::error_code ec) {
    if (*alive && !ec) complete(fmt::format("not read within the {} given to the stacks", format_duration(budget_)));
  });
}

StackSnapshot::~StackSnapshot() {
  *alive_ = false;  // a completion already queued (the cancels below cannot take it back) does nothing
  if (shared_) shared_->stop.request_stop();
  finished_ = true;
  boost::system::error_code ignored;
  deadline_.cancel();
  wake_.close(ignored);
}

void StackSnapshot::wait_woken() {
  wake_.async_read_some(asio::buffer(&wake_value_, sizeof wake_value_),
                        [this, alive = alive_](boost::system::error_code ec, std::size_t) {
                          if (!*alive || ec == asio::error::operation_aborted || finished_) return;
                          if (ec == asio::error::would_block || ec == asio::error::try_again) return wait_woken();
                          complete(ec ? fmt::format("not read: {}", ec.message()) : "");
                        });
}

void StackSnapshot::skip(const std::string& why) {
  if (!finished_) complete(why);
}

void StackSnapshot::complete(const std::string& unread_why) {
  if (finished_) return;
  finished_ = true;
  boost::system::error_code ignored;
  deadline_.cancel();
  wake_.close(ignored);
  FailureStacks out;
  std::vector<int> gone;
  if (shared_) {
    shared_->stop.request_stop();
    std::lock_guard lock(shared_->mu);
    out.ranks = shared_->read;
    gone = shared_->gone;
  }
  std::set<int> seen(gone.begin(), gone.end());
  for (const auto& r : out.ranks) seen.insert(r.rank);
  std::vector<int> unread;
  for (const auto& t : targets_) {
    if (!seen.contains(t.rank)) unread.push_back(t.rank);
  }
  std::sort(unread.begin(), unread.end());
  std::sort(gone.begin(), gone.end());
  if (!gone.empty()) {
    out.notes.push_back(fmt::format("{} {}: exited during the read (what was read is not kept)",
                                    gone.size() == 1 ? "rank" : "ranks", stacks::format_ranks(gone)));
  }
  if (!unread.empty()) {
    out.notes.push_back(fmt::format("{} {}: {}", unread.size() == 1 ? "rank" : "ranks", stacks::format_ranks(unread),
                                    unread_why.empty() ? "not read" : unread_why));
  }
  std::sort(out.ranks.begin(), out.ranks.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  if (auto done = std::move(done_)) done(std::move(out));
}

}  // namespace ddp::launch

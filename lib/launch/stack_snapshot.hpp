// Taking the stacks of an attempt's running ranks before they are signalled, without holding up
// the event loop: the reads run on a thread of their own (a target's memory may be slow, or made
// slow on purpose: userfaultfd), the loop waits for them at most `budget` (2 s for the whole
// node by default), and skip() (a second Ctrl-C, a kill) ends the wait at once. Whatever was read
// by then is the result; every rank not read is named, with why.
//
// The reading thread is never joined: the end of the wait asks it to stop, which the read
// (read_rank_stacks) sees once per frame; one stuck in a single read of the target's memory
// ends when its target dies (the stop that follows kills it). It shares only its own state with
// the loop, and wakes the loop through an eventfd, so it may outlive this object and the
// io_context.
#pragma once

#include "attempt/files.hpp"
#include "common/duration.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

namespace ddp::launch {

class StackSnapshot {
 public:
  struct Target {
    int rank = 0;
    std::string node;
    pid_t pid = 0;
  };
  // Reads one target; `stop` is asked once the wait is over (the budget, skip()), and the read
  // ends at its next frame instead of running on unseen.
  using Reader = std::function<stacks::ProcessStacks(pid_t, std::stop_token stop)>;
  using Done = std::function<void(FailureStacks)>;
  // A process's start time (field 22 of /proc/<pid>/stat), none when it is gone.
  using StartTime = std::function<std::optional<unsigned long long>(pid_t)>;

  // Starts the reads at once. `done` is called exactly once, on the loop (from skip() itself when
  // that ends it), unless this object is destroyed first. A target whose start time changed or
  // vanished between the constructor and the end of its read (it exited, its pid may be another
  // process's now) is not kept: a note says it exited during the read. No thread to read on
  // (RLIMIT_NPROC): done says so, on the loop, at once.
  StackSnapshot(boost::asio::io_context& io, std::vector<Target> targets, Millis budget, Done done,
                Reader reader = read_rank_stacks, StartTime start_time = process_start_time);
  ~StackSnapshot();
  StackSnapshot(const StackSnapshot&) = delete;
  StackSnapshot& operator=(const StackSnapshot&) = delete;

  // Ends the wait now with what was read; `why` names the ranks left unread.
  void skip(const std::string& why);
  bool pending() const { return !finished_; }

 private:
  struct Shared;
  void wait_woken();
  void complete(const std::string& unread_why);

  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);  // false once destroyed: for handlers already queued
  std::shared_ptr<Shared> shared_;
  std::vector<Target> targets_;
  Millis budget_;
  Done done_;
  boost::asio::posix::stream_descriptor wake_;
  boost::asio::steady_timer deadline_;
  std::uint64_t wake_value_ = 0;
  bool finished_ = false;
};

}  // namespace ddp::launch

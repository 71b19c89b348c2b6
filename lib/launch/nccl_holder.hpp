// The NCCL id holder of one attempt, as its launcher sees it (apps/ddp-ncclid; protocol in
// nccl/holder_protocol.hpp): started with rank 0's environment so that it loads the same libnccl
// and binds the same NCCL_SOCKET_IFNAME as the workers; it prints the id, then keeps NCCL's
// bootstrap root alive until its stdin closes. Used by the local launcher and, for a
// multi-node job, by node rank 0's agent.
//
// Policy: `nccl.unique_id: off`, and container jobs (the host's libnccl may not be the image's),
// get no holder. `auto` gets none, quietly (a debug line), when the holder cannot be found or
// libnccl cannot be loaded; `on` then fails with the holder's own message.
// The wait for the id line is asynchronous, on the owner's loop (NCCL scans interfaces first:
// well under a second here, at most 30 s): that loop also carries heartbeats and the systemd
// watchdog, which a blocking read would starve (issue 23). The owner's SIGCHLD handling reaps
// the holder after stop().
#pragma once

#include "contract/contract.hpp"
#include "jobspec/jobspec.hpp"
#include "supervisor/process.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>

#include <sys/types.h>

#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::launch {

class NcclHolder;

// What a holder's start ends with, on the owner's loop:
//   holder set:           the id is in holder->hex(); the holder keeps NCCL's root alive;
//   no holder, no error:  no id for this job (the policy above);
//   no holder, an error:  `on`, and no id could be made: why (the holder's own message).
using NcclHolderDone = std::function<void(std::optional<NcclHolder> holder, std::string error)>;

// A start in progress. Dropping it cancels the wait: the holder is stopped and `done` is never
// called. After `done` it holds nothing.
class NcclHolderWait {
 public:
  struct State;
  explicit NcclHolderWait(std::shared_ptr<State> s) : s_(std::move(s)) {}
  NcclHolderWait(const NcclHolderWait&) = delete;
  NcclHolderWait& operator=(const NcclHolderWait&) = delete;
  ~NcclHolderWait();

 private:
  std::shared_ptr<State> s_;
};

class NcclHolder {
 public:
  // Starts the attempt's holder and waits, on `io`'s loop, for its id line (at most `deadline`);
  // `done` is called there, once, never from inside start(). `run_as`: the job's user, when its
  // workers run as another one.
  static std::unique_ptr<NcclHolderWait> start(boost::asio::io_context& io, contract::Env env,
                                               const std::string& workdir, const std::string& attempt_dir,
                                               jobspec::NcclUniqueId mode, bool in_container,
                                               std::optional<supervisor::RunAs> run_as, NcclHolderDone done,
                                               std::chrono::milliseconds deadline = std::chrono::seconds(30));

  NcclHolder(NcclHolder&& o) noexcept;
  NcclHolder& operator=(NcclHolder&&) = delete;
  ~NcclHolder() { stop(); }

  pid_t pid() const { return pid_; }
  const std::string& hex() const { return hex_; }

  // Closing stdin is the holder's stop; SIGTERM as well, in case it is stuck (through a pidfd:
  // the owner's loop may have reaped the holder already, and its pid be another's now). Returns
  // once the holder has exited (SIGKILL after a second); it is reaped here if still a zombie.
  void stop();

 private:
  struct Drain {
    explicit Drain(boost::asio::io_context& io, int fd) : sd(io, fd) {}
    boost::asio::posix::stream_descriptor sd;
    std::array<char, 4096> buf{};
  };

  friend struct NcclHolderWait::State;
  NcclHolder(pid_t pid, int in);
  static std::optional<std::string> holder_binary();
  static void discard(const std::shared_ptr<Drain>& d);

  pid_t pid_ = -1;
  int pidfd_ = -1;  // what stop() signals: never another process that got the pid after it
  int in_ = -1;
  std::string hex_;
  // stdout and stderr, read (and, once the id is in, discarded) on the owner's loop: the holder
  // must never block on a full pipe.
  std::vector<std::shared_ptr<Drain>> drains_;
};

}  // namespace ddp::launch

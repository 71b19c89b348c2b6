// The NCCL id holder of one attempt, as its launcher sees it (apps/ddp-ncclid; protocol in
// nccl/holder_protocol.hpp): started with rank 0's environment so that it loads the same libnccl
// and binds the same NCCL_SOCKET_IFNAME as the workers; it prints the id, then keeps NCCL's
// bootstrap root alive until its stdin closes. Used by the local launcher and, for a
// multi-node job, by node rank 0's agent.
//
// Policy: `nccl.unique_id: off`, and container jobs (the host's libnccl may not be the image's),
// get no holder. `auto` gets none, quietly (a debug line), when the holder cannot be found or
// libnccl cannot be loaded; `on` then throws NcclIdError with the holder's own message.
// start() blocks until the id line (NCCL scans interfaces first: well under a second here; at
// most 30 s). The owner's SIGCHLD handling reaps the holder after stop().
#pragma once

#include "contract/contract.hpp"
#include "jobspec/jobspec.hpp"
#include "supervisor/process.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>

#include <sys/types.h>

#include <array>
#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::launch {

class NcclIdError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class NcclHolder {
 public:
  // nullopt: no id for this job (see the policy above). Throws NcclIdError when `mode` is on
  // and no id can be made. `run_as`: the job's user, when its workers run as another one.
  static std::optional<NcclHolder> start(boost::asio::io_context& io, contract::Env env, const std::string& workdir,
                                         const std::string& attempt_dir, jobspec::NcclUniqueId mode, bool in_container,
                                         std::optional<supervisor::RunAs> run_as = std::nullopt);

  NcclHolder(NcclHolder&& o) noexcept;
  NcclHolder& operator=(NcclHolder&&) = delete;
  ~NcclHolder() { stop(); }

  pid_t pid() const { return pid_; }
  const std::string& hex() const { return hex_; }

  // Closing stdin is the holder's stop; SIGTERM as well, in case it is stuck.
  void stop();

 private:
  struct Drain {
    explicit Drain(boost::asio::io_context& io, int fd) : sd(io, fd) {}
    boost::asio::posix::stream_descriptor sd;
    std::array<char, 4096> buf{};
  };

  NcclHolder(pid_t pid, int in, int out, int err) : pid_(pid), in_(in), out_(out), err_(err) {}
  static std::optional<std::string> holder_binary();
  std::string read_line(std::chrono::milliseconds deadline);
  static void discard(const std::shared_ptr<Drain>& d);
  void drain(boost::asio::io_context& io);

  pid_t pid_ = -1;
  int in_ = -1, out_ = -1, err_ = -1;
  std::string hex_;
  std::string pending_;  // read from stdout, not yet returned as a line
  std::vector<std::shared_ptr<Drain>> drains_;
};

}  // namespace ddp::launch

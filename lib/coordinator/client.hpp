// ddpctl's side of a standing coordinator (ddp-coordinator, standing.hpp).
//
// submit_job: `ddpctl launch --coordinator HOST:PORT`: authenticate (role ctl, the token file's
// key), submit, then show the job as a foreground launch would: `[node:rank] line` on the
// terminal, the coordinator's job-wide lines in our log, the failure report, --result-json, and
// the job's result as the exit status. Ctrl-C / SIGTERM stop the job (a second one kills it
// now). When this process goes away by any other way (kill -9, a lost link, a closed terminal)
// the job keeps running on the coordinator. With `detach` it returns once the job is accepted.
//
// ControlRelay: `ddpctl status/logs/stop --coordinator`: a local stream socket whose far end a
// thread joins to one `control` conversation with the coordinator, so the CLI reads and writes
// it exactly as it does a job's local control socket.
#pragma once

#include "common/duration.hpp"
#include "net/wire.hpp"
#include "proto/keyring.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace ddp::coordinator {

struct SubmitOptions {
  std::string host;
  std::uint16_t port = 0;
  proto::Keyring keys;
  std::string job_id;
  std::string user;
  net::JobPayload payload;  // the resolved spec and the forwarded environment
  std::vector<std::string> nodes;
  bool detach = false;
  bool quiet = false;
  std::set<int> show_ranks;
  std::optional<std::string> result_json;
  Millis dial_timeout{10000};
  // --tls: the link to the coordinator inside TLS 1.3 keyed by our key (net/tls.hpp), and the
  // coordinator asked to reach this job's agents inside TLS too (submit.tls, version 6).
  bool tls = false;
};

// ddpctl's exit status: the job's (0, 1, 128+signal), 0 with detach once every rank has started
// (128+signal when Ctrl-C or SIGTERM ended the waiting: the job goes on), 2 when it was
// refused or the coordinator could not be reached or was lost (the message says which).
int submit_job(SubmitOptions options);

class ControlRelay {
 public:
  // Starts connecting; the request line written to fd() goes to job `job_id` (empty: the only
  // one of ours). Errors (unreachable, refused) come back as a control error line.
  ControlRelay(std::string host, std::uint16_t port, proto::Keyring keys, std::string user, std::string job_id,
               bool tls = false);
  ~ControlRelay();  // stops the thread and joins it (close the fd first)
  ControlRelay(const ControlRelay&) = delete;
  ControlRelay& operator=(const ControlRelay&) = delete;

  // The caller's end; the caller closes it.
  int fd() const { return fd_; }

  struct Impl;

 private:
  int fd_ = -1;
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
};

}  // namespace ddp::coordinator

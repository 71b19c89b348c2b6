// The agent's handle on one job's shepherd process (shepherd.hpp): starts it, gives it attempts,
// stops and signals them, and turns its messages back into launch::GroupCallbacks, so that the
// agent drives a shepherd the way it drove an in-process WorkerGroup.
//
// Policy: if the shepherd dies or says something malformed, the running attempt ends at once as
// failed (every rank not yet reported counts as killed, and a note says why); closing the
// channel (on error, or when this handle is destroyed at the job's end) makes the shepherd kill
// whatever still runs and exit. The shepherd's exit is reaped by the agent's SIGCHLD handler,
// which hands it to on_reaped().
#pragma once

#include "shepherd/channel.hpp"
#include "shepherd/messages.hpp"

#include <boost/asio/io_context.hpp>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::shepherd {

class ShepherdError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Starts the shepherd some other way than as our child (ddp-agentd under systemd: in a transient
// unit, lib/jobunit): gets its argv and the channel end that must be its stdin; throws
// ShepherdError when it cannot. The shepherd is then not ours to reap: its channel's EOF is
// what says it is gone.
using Starter = std::function<void(const std::vector<std::string>& argv, int stdin_fd)>;

class Client {
 public:
  // Starts `exe shepherd --agent-pid <ours> --job <job_id>` (exe: usually this agent's own
  // binary): forked as our child, or with `starter` (which adds --in-unit). Throws
  // ShepherdError when it cannot.
  Client(boost::asio::io_context& io, const std::string& exe, std::string job_id, const Starter& starter = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Runs one attempt; callbacks arrive on the io_context (on_finished posted, so the owner may
  // destroy this client from inside it). Throws ShepherdError if an attempt runs or the
  // shepherd is gone.
  void start(StartAttempt attempt, launch::GroupCallbacks cb);
  // SIGTERM, or (SIGINT with an interrupt grace: a Ctrl-C) SIGINT first: WorkerGroup::request_stop.
  void request_stop(int signal, Millis interrupt_grace = Millis(0));
  void kill_now();
  void forward(int signal);

  // The running ranks' stacks (`ddpctl stacks`): `done` gets them, or an error ("" when none),
  // always once, on the io_context, at the latest a few seconds after the query's budget.
  using StacksDone = std::function<void(std::vector<stacks::RankStacks>, std::string error)>;
  void read_stacks(const launch::WorkerGroup::StacksQuery& q, StacksDone done);
  // The hang watchdog's node reports ('progress'), while an attempt runs.
  void on_progress(std::function<void(const Progress&)> f) { on_progress_ = std::move(f); }

  bool running() const { return running_; }
  pid_t pid() const { return pid_; }
  // The running attempt's worker pids by local rank (0: did not start), from 'started'.
  const std::vector<pid_t>& worker_pids() const { return workers_; }
  // The agent reaped `pid`: true when it was this shepherd (the attempt, if any, is lost).
  bool on_reaped(pid_t pid, int status);

 private:
  void on_message(const std::string& type, const nlohmann::json& m);
  void lost(const std::string& why);
  void finish(launch::AttemptReport r);

  boost::asio::io_context& io_;
  std::string job_id_;
  pid_t pid_ = -1;
  bool reaped_ = false;
  std::shared_ptr<Channel> channel_;
  // The attempt in progress.
  bool running_ = false;
  StartAttempt attempt_;
  launch::GroupCallbacks cb_;
  std::vector<pid_t> workers_;
  std::optional<launch::WorkerExit> first_failure_;
  struct PendingStacks;
  std::map<std::uint64_t, std::shared_ptr<PendingStacks>> pending_stacks_;
  std::uint64_t next_stacks_id_ = 1;
  void answer_stacks(std::uint64_t id, std::vector<stacks::RankStacks> ranks, std::string error);
  std::function<void(const Progress&)> on_progress_;
};

}  // namespace ddp::shepherd

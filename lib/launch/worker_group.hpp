// One attempt's workers on one node (the worker group). Spawns every rank of a plan, files and
// forwards their output, tracks exits, stops the whole tree (process groups, the attempt's
// cgroup, and every descendant the launcher is subreaper of), and says when the attempt is over:
// every rank reaped, nothing left running, every pipe drained.
//
// Used by the local launcher (ddpctl) and, per node, by the shepherd process (lib/shepherd). It
// owns no signals: the owner reaps children (SIGCHLD) and hands each reaped pid to on_reaped().
#pragma once

#include "attempt/attempt.hpp"
#include "attempt/files.hpp"
#include "attempt/report.hpp"
#include "contract/contract.hpp"
#include "launch/hang_sampler.hpp"
#include "launch/stack_snapshot.hpp"
#include "stacks/merge.hpp"
#include "supervisor/cgroup.hpp"
#include "supervisor/guardian.hpp"
#include "supervisor/output.hpp"
#include "supervisor/process.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace ddp::launch {

struct GroupOptions {
  int attempt = 0;
  std::string workdir;
  Millis stop_grace{30'000};
  std::uint64_t log_max_bytes = 100ull << 20;
  // Removes what the workers' runtime keeps outside this process tree (containers under a
  // daemon, or whose client was killed): called at SIGKILL time, once every rank is reaped, and
  // when a running group is dropped. Must be idempotent; may block briefly.
  std::function<void()> teardown;
  // The user the workers run as (ddp-agentd's per-user tokens; their log files are given to
  // it too); nullopt: ours.
  std::optional<supervisor::RunAs> run_as;
  // The folder the attempt folder lies in that the job cannot write (a root agent's log_dir):
  // below it each folder is opened without following a link and must belong to the workers'
  // user. Empty: the attempt folder itself is ours (a launcher's own logs).
  std::string log_root;
  // How long the ranks still running may take to have their stacks read before the first
  // signal of a stop (the whole node's; 0: not read). A SIGKILL stop or kill_now() skips it.
  Millis stacks_budget = kStacksBudget;
  // The hang watchdog (job file `hang:`): every live rank sampled on this loop (hang_sampler.hpp),
  // its owner told after each round (GroupCallbacks::on_hang_round). 0: off.
  Millis hang_timeout{0};
  // What the attempt's guardian leaves if this process dies before the attempt ends (the job's
  // end record: a local launcher's); nullopt: nothing. With one, the guardian stands down at
  // the attempt's end and its owner may keep it (take_guardian) until its own record is written.
  std::optional<supervisor::LastWord> last_word;
};

struct GroupCallbacks {
  // Every output line of every rank (already written to the rank's log file).
  std::function<void(int rank, supervisor::Stream, const std::string& line)> on_line;
  // Called once when a rank fails first (the group is already stopping the others).
  std::function<void(const WorkerExit&)> on_first_failure;
  // The shepherd client only (a WorkerGroup's owner asks rank_status()): every rank's pid by
  // local rank, 0 for one that did not start, once all were forked.
  std::function<void(const std::vector<pid_t>&)> on_started;
  // The hang watchdog, after every round of samples while the attempt runs (not while it stops).
  std::function<void(hang::RankProgress&, hang::TimePoint now)> on_hang_round;
  // Called once, when the attempt is completely over.
  std::function<void(AttemptReport)> on_finished;
};

class WorkerGroup {
 public:
  WorkerGroup(boost::asio::io_context& io, contract::Plan plan, std::string attempt_dir, GroupOptions opts,
              GroupCallbacks cb);
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  void start();
  // A stop from outside (a coordinator's stop, `ddpctl stop`): SIGTERM, stop_grace, SIGKILL.
  // With a Ctrl-C's `interrupt_grace` (signal SIGINT): SIGINT first, so that Python raises
  // KeyboardInterrupt and a script can save its checkpoint; SIGTERM to what is left after
  // interrupt_grace; SIGKILL stop_grace after that.
  void request_stop(int signal, Millis interrupt_grace = Millis(0));
  void kill_now();  // a second Ctrl-C
  // SIGUSR1/SIGUSR2: to every live worker, as it is; a rank it kills is no failure of its own.
  void forward(int signal);
  // The owner reaped `pid` with wait status `status`; returns false if it is not a worker.
  bool on_reaped(pid_t pid, int status, SysTime when);
  // After the owner reaped a batch (workers or strays): re-check whether the attempt is over.
  void check_finished();

  std::vector<pid_t> worker_pids() const;
  struct RankStatus {
    int rank = 0, local_rank = 0;
    pid_t pid = -1;  // -1: never started
    bool running = false;
    std::optional<WorkerExit> exit;
  };
  std::vector<RankStatus> rank_status() const;  // plan order (`ddpctl status`)
  // A helper of the attempt (the NCCL id holder) that the descendant walk must leave alone;
  // its owner stops it after the group has finished.
  void keep(pid_t pid) { keep_.push_back(pid); }
  bool finished() const { return finished_; }
  // Once finished, with a last word: the guardian, stood down (it kills nothing), for an owner
  // that tells it done once its own record is written (a restart's backoff, the end report);
  // nullopt otherwise.
  std::optional<supervisor::Guardian> take_guardian();
  // Before start(): the last attempt's guardian (take_guardian), told done once this group's
  // own has started, so that a launcher killed at any moment leaves one record.
  void succeed(supervisor::Guardian predecessor);
  bool stopping() const { return stopping_; }  // its stop began (a failure's, or one asked for)
  // Every running rank's stacks as the watchdog's latest round read them, merged ("" without
  // a watchdog).
  std::string hang_stacks_text() const { return hang_ ? hang_->stacks_text(plan_.world_size) : std::string(); }
  const hang::Watch* hang_watch() const { return hang_ ? &hang_->progress().watch() : nullptr; }
  // Appends `text` to the attempt folder's hang-stacks.txt (as the workers' log files are kept).
  void write_hang_stacks(const std::string& text);

  // The stacks of the running ranks (group_stacks.cpp), read off the event loop (collect.hpp:
  // native frames through the reader that drops to run_as). `done` is posted to the io_context
  // with one entry per asked rank, in plan order; a rank not running is an entry saying so.
  struct StacksQuery {
    std::vector<int> local_ranks;  // empty: every rank
    bool native = false;
    Millis budget{10'000};
  };
  void read_stacks(const StacksQuery& q, std::function<void(std::vector<stacks::RankStacks>)> done);

 private:
  struct Worker;
  struct PipeReader;
  supervisor::SpawnSpec spawn_spec(const Worker& w) const;
  void started(Worker& w, const supervisor::Spawned& sp);
  void spawn_failed(Worker& w, const std::string& why);
  void read_pipe(Worker& w, const std::shared_ptr<PipeReader>& p);
  void close_pipe(PipeReader& p);
  void on_exit(Worker& w, const WorkerExit& ex);
  void stop_all();
  bool take_stacks_first();  // false: nothing to read, go on at once
  void stacks_taken(FailureStacks s);
  void terminate(bool polite);  // the polite signal(s) (or not), then SIGKILL after the grace
  void kill_after_grace();
  void signal_everything(int sig);
  bool pipes_open() const;
  void finish();
  std::vector<pid_t> strays() const;
  void open_attempt_dir();
  // `path`'s name if it is directly in the attempt folder.
  std::optional<std::string> name_in_attempt_dir(const std::string& path) const;
  std::optional<ErrorFile> error_file_of(const Worker& w) const;  // descendants of ours that are not kept helpers

  boost::asio::io_context& io_;
  contract::Plan plan_;
  std::string attempt_dir_;
  std::shared_ptr<const safefs::Dir> dir_;  // the attempt folder, opened once at start
  std::string dir_error_;                   // why it could not be
  GroupOptions opts_;
  GroupCallbacks cb_;
  AttemptTracker tracker_;
  std::optional<supervisor::Cgroup> cgroup_;
  // Kills the cgroup and the ranks' process groups if this process dies without ending the
  // attempt (a SIGKILLed ddpctl or shepherd); told done once nothing of the attempt runs.
  std::optional<supervisor::Guardian> guardian_;
  std::optional<supervisor::Guardian> predecessor_;  // succeed()
  std::vector<pid_t> lingering_groups_;              // reaped ranks' process groups the guardian still watches
  std::vector<std::unique_ptr<Worker>> workers_;
  boost::asio::steady_timer grace_timer_, drain_timer_;
  AttemptReport report_;
  bool stopping_ = false;
  bool cleanup_started_ = false;
  bool drain_started_ = false;
  bool torn_down_ = false;  // teardown ran after the last rank was reaped
  bool finished_ = false;
  bool killing_now_ = false;
  bool killed_now_ = false;    // kill_now() ran: no polite step after it
  Millis interrupt_grace_{0};  // a Ctrl-C's stop: SIGINT, this long, then SIGTERM
  std::unique_ptr<StackSnapshot> snapshot_;
  std::vector<pid_t> keep_;
  std::unique_ptr<HangSampler> hang_;
  void start_hang_sampler();
  struct StackReads;  // the reads in flight (threads), joined when the group goes: declared last
  std::shared_ptr<StackReads> stack_reads_;
};

// The owner's SIGCHLD handler: reaps every exited child of this process (as subreaper, workers
// and orphaned strays alike), hands each to `group` (may be null), then lets it re-check
// whether its attempt is over.
void reap_children(WorkerGroup* group);

}  // namespace ddp::launch

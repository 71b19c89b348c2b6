// The multi-node launch's coordinator, embedded in `ddpctl launch --nodes`: the I/O edge around
// the pure rendezvous machine (lib/rendezvous) and the pure round machine that follows its
// assign (round_machine.hpp: node rank 0's ready, the others' assigns and starts, the close).
//
//   per node: dial ─▶ handshake (role coordinator) ─▶ job_offer{t0}
//             ◀─ join{nproc, preflight, t0 rx tx: the clock offset} ─▶ NodeJoined ... rendezvous effects:
//   AssignRanks ─▶ assign to every member (MASTER_ADDR = node rank 0's address as we reached it)
//   StartAttempt ─▶ start;  StopAll ─▶ stop;  DropNode ─▶ close;  job result ─▶ exit status
//   ◀─ output (printed "[node:rank] line", filed per rank), worker_exited, attempt_finished
//
// Policy: agents are redialled while the job lives (a lost agent may come back for a later
// round); a refused token is fatal at once (it will not fix itself). With a dialer (SSH mode) a
// node that cannot be started before the job runs is fatal too: its error names it, and the
// nodes that did start are stopped (their links close, their one-shot agents exit). Ctrl-C / SIGTERM stop every
// node's workers and end with 128+signal; a second one kills them now. SIGUSR1/SIGUSR2 go to
// every node's workers as they are (a `signal` message), and the job goes on. A standing
// coordinator's job gets its submitter's signals through JobEvents::started's handle. Every timeout says what
// it waited for (the rendezvous machine's messages).
#pragma once

#include "attempt/report.hpp"
#include "common/duration.hpp"
#include "common/log.hpp"
#include "common/safe_fs.hpp"
#include "jobspec/jobspec.hpp"
#include "net/dialer.hpp"
#include "proto/keyring.hpp"
#include "supervisor/output.hpp"

#include <nlohmann/json.hpp>

#include <boost/asio/io_context.hpp>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::coordinator {

// What a standing coordinator (ddp-coordinator) needs from a job it runs on a thread of its own,
// to relay it to the submitting ddpctl: every callback runs on the job's thread.
struct JobEvents {
  // Every worker line, as the embedded coordinator's terminal shows it.
  std::function<void(const std::string& node, int rank, supervisor::Stream stream, const std::string& line)> output;
  // The job-wide lines ddpctl's own log shows (rounds, stops, restarts, the result) and the
  // failure reports.
  std::function<void(spdlog::level::level_enum level, const std::string& text)> notice;
  // The job's loop is about to run: `signal` may be called from any thread until `done` has
  // returned, as if the launcher got `sig`: SIGTERM stops the job (as `ddpctl stop`), SIGINT
  // stops it as a Ctrl-C does (SIGINT to the ranks first), SIGUSR1/SIGUSR2 go to the workers.
  std::function<void(std::function<void(int sig, const std::string& who)> signal)> started;
  // The job is over (its loop has stopped); the report carries the exit status.
  std::function<void(const launch::JobReport& report)> done;
};

struct CoordinatorOptions {
  jobspec::JobSpec spec;           // resolved: workdir and log_dir absolute
  std::vector<std::string> nodes;  // expanded --nodes entries (host, host:port, [v6]:port)
  proto::Keyring keys;
  std::string job_id;
  std::string user;
  // A standing coordinator's: the submitting user's delegation (proto/delegation.hpp), sent in
  // every job_offer to agents that speak protocol version 6; absent: none (the link's key is the user's).
  std::optional<nlohmann::json> delegation;
  std::set<int> show_ranks;  // terminal filter; empty: all
  bool quiet = false;
  std::optional<std::string> result_json;
  // Set: result_json is the file of that name in this opened folder, written below its
  // descriptor (a detached launch's <log_dir>/<job id>/result.json); unset: by its path.
  std::shared_ptr<const safefs::Dir> result_folder;
  // Set: the job's own folder, opened (a detached launch's <log_dir>/<job id>): each attempt's
  // folder is made directly below it; unset: the job's folder is made (or found) below
  // log_folder at the first attempt and kept open for the later ones.
  std::shared_ptr<const safefs::Dir> job_folder;
  // Set: the opened folder the launcher's copy of the logs goes in (a standing coordinator's
  // <log_dir>/<user>, made through its own descriptors); unset: spec.log_dir, made and opened by
  // its path (ddpctl's, a folder of the user who runs it).
  std::shared_ptr<const safefs::Dir> log_folder;
  bool log_folder_only = false;  // a standing coordinator's: without log_folder, no copy (never by path)
  std::map<std::string, std::string> launcher_env;
  Millis heartbeat_interval{1000};  // the heartbeat timer's period is a quarter of it
  // While a round runs and the joined nodes' heartbeats come at least two to this period (at 10 ms,
  // 200 beats a second: more than 400 nodes at a beat every 2 s), the loop wakes once a period
  // (zero: at every event): what arrives in between waits in its socket and is handled together.
  // Thousands of nodes' heartbeats, each a wake-up of its own otherwise, then cost one wake-up a
  // period (docs/performance.md, "Heartbeats in batches"). A message waits up to two periods
  // more. Not paced: the rendezvous, a stop, a smaller job, and a period in which 64 messages or
  // more arrived or a connection had more to read than one read takes (a burst or a stream is
  // handled at full speed).
  Millis steady_batch{10};
  Millis dial_timeout{5000};
  // Set: nodes are reached through this dialer (SSH mode, SLURM's srun step) instead of TCP to
  // their agents' port; a node it cannot start before the job started fails the launch (exit 2), naming it.
  std::function<std::unique_ptr<net::Dialer>(boost::asio::io_context&)> make_dialer;
  // ddpctl's coordinator stops the job on SIGINT/SIGTERM/SIGHUP; a standing one's jobs leave
  // signals to the daemon.
  bool own_signals = true;
  JobEvents events;
  // Set (a standing coordinator's jobs): the folder of the job's control socket and its end
  // record (control::coordinator_jobs_dir()); empty: the user's (runtime_dir(), records_dir()).
  std::string control_dir;
  bool control_socket = true;  // false: none (a standing coordinator that has no folder for it)
  // The job's control socket listens (or could not be opened): `launch --detach` returns then.
  std::function<void()> on_listening;
  // Every rank of a round has started, the first time this happens (once per job): `launch
  // --detach` returns then. A job that ends before never calls it.
  std::function<void()> on_running;
  // TCP to the agents inside TLS 1.3 keyed by the token (net/tls.hpp), also over the TCP links a
  // make_dialer makes (srun's agents, SSH's connect-back); never set for SSH's own channels.
  bool tls = false;
};

// How long a node may take to report its workers stopped: the job's stop grace, what a node
// spends before it answers (the stacks read before the first signal, launch::kStacksBudget; a
// failed round's flight recorder dumps converted, hang::kConvertLimit) and 5 s for the message.
// Shorter, and a node that read dumps would be dropped as lost.
std::chrono::microseconds round_stop_timeout(std::chrono::milliseconds stop_grace);

class CoordinatorError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Runs the job to its end; returns ddpctl's exit status (0 all ranks 0; 1 failed; 128+sig when
// stopped by a signal; 2 when it could not start, e.g. a refused token or a failed preflight).
int run_coordinator(CoordinatorOptions options);

}  // namespace ddp::coordinator

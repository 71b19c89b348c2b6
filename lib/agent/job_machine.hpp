// The agent's job lifecycle as a pure state machine: events in, effects out. No sockets, no
// processes, no clock: the edge (agent.cpp) turns messages, the shepherd's callbacks, closed
// links and signals into events, and effects into frames, process calls and its own exit. The
// lifecycle has no deadline of its own: a silent coordinator is the edge's heartbeat deadline,
// which closes the link, which arrives here as LinkClosed.
//
//   idle ─offer─▶ preflight ─joined─▶ joined ─assign─▶ readying (node rank 0: store, NCCL id)
//                                        │                 │ ready
//                                        └──assign────────▶ assigned ─start─▶ running
//   running ─workers done─▶ done ─assign─▶ ... (next round) ;  any ─link closed─▶ forgotten
//   running ─link closed / shutdown─▶ draining ─workers done─▶ forgotten (and exit, if shutting down)
//
// The table in job_machine.cpp is the authority. Invariants (checked by tests/unit/agent's
// random event streams after every event):
//   I1  At most one job, owned by one link; messages about it from other links are refused.
//   I2  Workers run only in `running` or `draining`, and only for the round that was assigned
//       and started; never before this node's join, never on node rank 0 before its ready.
//   I3  Each round's attempt_finished goes up at most once; every started round gets one before
//       its job is forgotten while its link is open (the link's close excepted: nobody to tell).
//   I4  A rank's exit goes up at most once per round, except the first failure, which is sent
//       again with its detail (tail, error file) when the round's report comes.
//   I5  A job whose link is gone, or whose agent is shutting down, never starts workers again;
//       it is forgotten as soon as no worker of it runs.
//   I6  Once shutting down, the agent exits (Exit, exactly once) as soon as it holds no job
//       (the bug of 02d0419: a job forgotten through another path left the agent hanging).
//   I7  A one-shot agent exits after its one job, or when its only link closes before one.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

namespace ddp::agent::job {

using LinkId = std::uint64_t;  // the edge's name for one coordinator connection; never 0

struct Config {
  std::string node;      // this agent's name, for messages
  bool oneshot = false;  // serve one job, then exit
  bool stdio = false;    // the one link is stdin/stdout (or the connect-back): its close ends the agent
};

// ---- events ----
struct Offer {  // a job offer that passed the edge's checks (id, user, spec); busy() said yes
  LinkId link = 0;
  std::string job_id;
};
struct Joined {};  // the join went up (the preflight's answer in it)
struct Assign {
  LinkId link = 0;
  std::uint32_t round = 0;
  std::uint32_t node_rank = 0;
  bool start = false;  // protocol version 4: the assign is also the start
};
struct Ready {  // node rank 0: the ready went up (with the store port and the id, or an error)
  std::uint32_t round = 0;
};
struct RoundFailed {  // the edge could not serve, prepare or start the round here
  std::uint32_t round = 0;
  std::string error;
};
struct Start {
  LinkId link = 0;
  std::uint32_t round = 0;
};
struct Stop {
  LinkId link = 0;
  std::uint32_t round = 0;
  bool now = false;  // grace 0: SIGKILL at once
  std::string reason;
  std::uint64_t interrupt_ms = 0;  // version 6, a Ctrl-C: SIGINT first, SIGTERM this long after
};
struct Signal {  // SIGUSR1/2 for the round's workers (from the coordinator, or sent to the agent: round nullopt)
  std::optional<std::uint32_t> round;
  int sig = 0;
  std::string name;  // "SIGUSR1"
};
struct FirstFailure {  // the group's first failing rank, before the others are stopped
  int local_rank = 0;
  int rank = 0;      // global, for the log
  std::string what;  // "exited with code 1"
};
struct WorkersDone {  // the shepherd's report of the running round
  bool ok = false;
  std::vector<int> started_ranks;    // local ranks that started, in report order
  std::optional<int> first_failure;  // its local rank
  std::uint64_t dropped_lines = 0;   // output lines that did not go up
};
struct LinkClosed {
  LinkId link = 0;
  std::string reason;
};
struct Shutdown {  // SIGTERM, SIGINT, SIGHUP: the first stops the workers, the next kills them
  std::string signal;
};
struct LauncherGone {       // --connect: stdin's EOF; the edge closed every link already (LinkClosed each)
  bool links_left = false;  // a link still open (not yet closed by its peer)
};
struct DialFailed {  // --connect: the launcher could not be reached
};
using Event = std::variant<Offer, Joined, Assign, Ready, RoundFailed, Start, Stop, Signal, FirstFailure, WorkersDone,
                           LinkClosed, Shutdown, LauncherGone, DialFailed>;

// ---- effects ----
enum class RefuseCode { unexpected, bad_value };
struct Refuse {  // an error frame, then the link closes
  LinkId link = 0;
  RefuseCode code = RefuseCode::unexpected;
  std::string message;
  std::string hint;
};
struct PrepareRound {  // drop the last round's NCCL id; node rank 0: serve the store, make the id, then Ready
  std::uint32_t round = 0;
  bool serve = false;  // node rank 0
};
struct StartWorkers {  // the attempt folder, the plan, the shepherd; RoundFailed if that fails
  std::uint32_t round = 0;
};
struct StopWorkers {
  bool now = false;                // kill now (SIGKILL); else SIGTERM, then the grace
  std::uint64_t interrupt_ms = 0;  // not 0: SIGINT first, SIGTERM this long after (a Ctrl-C)
};
struct ForwardSignal {
  int sig = 0;
};
struct DropIdHolder {};  // the round is over everywhere: NCCL's bootstrap root goes
struct ReportExit {      // worker_exited for this local rank of the current report
  int local_rank = 0;
  bool detail = false;  // the first failure's tail and error file
};
struct ReportFinished {  // attempt_finished
  std::uint32_t round = 0;
  bool ok = false;
  std::string error;
};
struct SendLeaving {  // protocol version 5: this node is leaving, before its workers' exits
  std::string reason;
};
struct Forget {};  // the job's data, store and id go; the agent is idle
struct Exit {};    // close every link and end the loop
struct Log {
  enum class Level { info, warn, error } level = Level::info;
  std::string text;
};
using Effect = std::variant<Refuse, PrepareRound, StartWorkers, StopWorkers, ForwardSignal, DropIdHolder, ReportExit,
                            ReportFinished, SendLeaving, Forget, Exit, Log>;

enum class Phase {
  idle,       // no job
  preflight,  // offered; this node checks the command, image, Python; no join yet
  joined,     // join sent; waiting for an assign
  readying,   // node rank 0 assigned: store and NCCL id on their way; no ready yet
  assigned,   // assigned (and, on node rank 0, ready sent); waiting for the start
  running,    // the round's workers run
  draining,   // the workers are being stopped for good (link gone, or shutting down)
  done,       // the round's workers are over; waiting for the next assign or the link's close
};
const char* phase_name(Phase p);

class JobMachine {
 public:
  explicit JobMachine(Config c) : cfg_(std::move(c)) {}

  std::vector<Effect> handle(const Event& e);

  // The table's row for (phase, event index), or nullptr: for the test that every pair has one.
  static const char* why(Phase p, std::size_t event);

  // Whether an offer from `link` can be taken now (the edge words the refusal: it knows the links).
  enum class Busy { no, other_link, workers_running };
  Busy busy(LinkId link) const;
  // Why a job message (assign, start, stop, signal) from `link` naming `job_id` is refused.
  std::optional<Refuse> addressed(LinkId link, const std::optional<std::string>& job_id, const std::string& type) const;

  Phase phase() const { return phase_; }
  bool has_job() const { return phase_ != Phase::idle; }
  bool workers_running() const { return phase_ == Phase::running || phase_ == Phase::draining; }
  LinkId owner() const { return owner_; }
  const std::string& job_id() const { return job_id_; }
  std::uint32_t round() const { return round_; }              // the last assigned round
  std::uint32_t group_round() const { return group_round_; }  // the round whose workers run (ran) here
  bool shutting_down() const { return shutting_down_; }
  bool exited() const { return exited_; }
  bool reported(std::uint32_t round) const { return reported_.count(round) != 0; }

 private:
  using Out = std::vector<Effect>;
  using Handler = void (JobMachine::*)(const Event&, Out&);
  struct Transition;
  static const Transition kTable[];

  // Rows are searched in order; `phases` is a mask of Phase bits.
  static constexpr unsigned bit(Phase p) { return 1u << static_cast<unsigned>(p); }

  void take_offer(const Event&, Out&);
  void joined(const Event&, Out&);
  void assign(const Event&, Out&);
  void assign_early(const Event&, Out&);
  void assign_busy(const Event&, Out&);
  void ready(const Event&, Out&);
  void round_failed(const Event&, Out&);
  void start(const Event&, Out&);
  void stop_idle(const Event&, Out&);
  void stop_running(const Event&, Out&);
  void signal(const Event&, Out&);
  void first_failure(const Event&, Out&);
  void workers_done(const Event&, Out&);
  void closed_idle(const Event&, Out&);
  void closed_held(const Event&, Out&);
  void closed_running(const Event&, Out&);
  void shutdown(const Event&, Out&);
  void launcher_gone(const Event&, Out&);
  void dial_failed(const Event&, Out&);
  void ignore(const Event&, Out&) {}

  void finish(std::uint32_t round, bool ok, std::string error, Out& out);
  void forget(Out& out);
  void exit(Out& out);

  Config cfg_;
  Phase phase_ = Phase::idle;
  LinkId owner_ = 0;  // 0: none (idle, or draining after its link closed)
  std::string job_id_;
  std::uint32_t round_ = 0, group_round_ = 0;
  std::set<std::uint32_t> reported_;  // rounds whose attempt_finished went up
  std::set<int> exits_sent_;          // local ranks whose exit went up this round
  bool shutting_down_ = false;
  bool exited_ = false;
};

}  // namespace ddp::agent::job

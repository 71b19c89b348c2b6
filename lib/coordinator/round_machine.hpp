// The coordinator's round lifecycle after the rendezvous machine's AssignRanks, as a pure state
// machine: events in, effects out. No sockets, no processes, no clock reads; the times it
// compares (exit stamps mapped onto the job's clock, the stop's time) arrive with the events.
// The coordinator edge (coordinator.cpp) turns protocol messages and rendezvous effects into
// events and carries out the effects (frames, log lines, the report).
//
//   Assigned ─▶ awaiting_ready ──(node rank 0's ready: store port, NCCL id)──▶ released ──(StartDue)──▶ running
//                 │ StartDue                                                        ▲
//                 ▼                                                                 │
//               awaiting_ready_start_due ──(ready: assign+start the others)─────────┘
//   any open state ──StopIssued──▶ stopping ──Close──▶ closed        (Close from any open state too)
//
// Why node rank 0 first: it hosts the round's store (store.port 0: a port it picks) and makes
// the attempt's NCCL unique id; every other node's assign carries both, so none can go out
// before its `ready`. The rendezvous machine emits AssignRanks and StartAttempt together, so the
// start is normally due while the ready is awaited, and then each other node's assign is also
// its start (protocol version 4 folds them into one frame; the edge decides the framing).
//
// Invariants (tests/unit/coordinator/round_machine_test.cpp checks them over random streams):
//  I1 Before node rank 0's ready for a round, nothing of that round goes out but node rank 0's
//     assign: no other assign, no start.
//  I2 Every other node's assign carries that ready's store port and NCCL id.
//  I3 Per round, each member gets at most one assign and at most one start (a start folded into
//     an assign counts); once released and due, every member gets exactly one start.
//  I4 After StopIssued or Close, nothing more of the round goes out (until the next Assigned).
//  I5 AllStarted at most once per round, and only when every rank of the round has a pid.
//  I6 One AttemptClosed per Assigned at most; its first failure is a failed exit of that round.
//  I7 master_port() is the ready's port from the release until the stop or close, else 0.
// Only the first exit of a (node, local rank) per round reaches the rendezvous, and none of a
// node that said `leaving` (its ranks were stopped with it: no cause).
#pragma once

#include "rendezvous/rendezvous.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace ddp::coordinator::round {

namespace rdzv = ddp::rendezvous;
using rdzv::TimePoint;

enum class State { idle, awaiting_ready, awaiting_ready_start_due, released, running, stopping, closed };
const char* to_string(State s);

enum class Outcome { succeeded, failed, stopped };

// (node, local rank): one worker of a round.
using WorkerKey = std::pair<std::string, std::uint32_t>;

// ---- events ----
struct Assigned {  // the rendezvous machine's AssignRanks
  rdzv::AssignRanks assign;
};
struct StartDue {  // the rendezvous machine's StartAttempt
  rdzv::Round round;
};
struct Ready {  // node rank 0's agent: the round's store listens, its NCCL id is made
  std::string node;
  rdzv::Round round;
  std::uint16_t master_port = 0;
  std::optional<std::string> nccl_id;  // hex; absent: no id for this job
  std::optional<std::string> error;    // node rank 0 cannot host the round: the launch fails
};
struct WorkerStarted {
  std::string node;
  rdzv::Round round;
  rdzv::LocalRank local_rank;
  std::uint32_t pid = 0;
};
struct WorkerExited {
  std::string node;
  rdzv::Round round;
  rdzv::LocalRank local_rank;
  std::optional<int> exit_code;  // exactly one of exit_code / signal
  std::optional<int> signal;
  TimePoint agent_time{0};  // on the agent's clock (for the rendezvous, which maps it itself)
  TimePoint when{0};        // mapped onto the job's clock
  std::uint32_t pid = 0;
  bool node_leaving = false;  // its node said `leaving`: the stop of its ranks is no failure of theirs
  bool forwarded = false;     // killed by a signal its agent forwarded (version 6): never the first failure
  bool after_stop = false;    // ended after its node's own stop signals (version 6): never the first failure
};
struct StopIssued {  // the rendezvous machine's StopAll went out
  rdzv::Round round;
  TimePoint at{0};
};
struct Close {  // the rendezvous machine's RestartScheduled / JobFailed / JobSucceeded
  Outcome outcome = Outcome::failed;
  std::optional<rdzv::Failure> failure;  // the rendezvous's first failure
};
using Event = std::variant<Assigned, StartDue, Ready, WorkerStarted, WorkerExited, StopIssued, Close>;

// ---- effects ----
struct Release {  // what node rank 0's ready brought
  std::uint16_t master_port = 0;
  std::optional<std::string> nccl_id;
};
struct SendAssign {
  std::string node;
  std::size_t index = 0;           // in the round's assignment (= node rank)
  std::optional<Release> release;  // absent only for node rank 0
  bool start = false;              // also the round's start for this node
};
struct SendStart {
  std::string node;
  rdzv::Round round;
};
struct StoreUp {  // the round is released: its store and NCCL id are known
  rdzv::Round round;
  std::uint16_t master_port = 0;
  bool has_nccl_id = false;
};
struct ReadyFailed {  // node rank 0 cannot host the round: the launch fails (exit 2)
  std::string message;
};
struct ReadyIgnored {  // a ready nobody awaits (another round's, a stopped round's, not node rank 0's)
  std::string node;
  rdzv::Round round;
};
struct AllStarted {  // every rank of the round has started
  rdzv::Round round;
  std::uint32_t world_size = 0;
};
struct ForwardExit {  // the rendezvous machine must hear of this exit
  rdzv::WorkerExited exit;
};
struct AttemptClosed {
  Outcome outcome = Outcome::failed;
  std::optional<WorkerKey> first_failure;     // the exit the report names; only when not succeeded
  std::optional<rdzv::Failure> node_failure;  // the rendezvous's failure when it was a node's, not a rank's
  std::size_t killed_after_stop = 0;          // exits by SIGKILL stamped after the stop: its grace ran out
};
using Effect =
    std::variant<SendAssign, SendStart, StoreUp, ReadyFailed, ReadyIgnored, AllStarted, ForwardExit, AttemptClosed>;
using Effects = std::vector<Effect>;

struct Placement {  // a member's share of the round
  std::uint32_t node_rank = 0, rank_base = 0, local_world_size = 0;
};

class RoundMachine {
 public:
  Effects handle(const Event& event);

  State state() const { return state_; }
  bool attempt_open() const { return state_ != State::idle && state_ != State::closed; }
  rdzv::Round round() const { return round_; }
  std::uint32_t world_size() const { return assign_.world_size; }
  const rdzv::AssignRanks& assignment() const { return assign_; }
  const std::map<std::string, Placement>& placement() const { return placement_; }
  // The store's port from the release until the stop or close; 0 otherwise.
  std::uint16_t master_port() const { return master_port_; }
  // A worker's global rank in the current round; nullopt for another round's or a non-member's.
  std::optional<int> global_rank(const std::string& node, rdzv::Round round, std::uint32_t local_rank) const;
  std::optional<std::uint32_t> pid(const WorkerKey& w) const;

 private:
  using Handler = void (RoundMachine::*)(const Event&);
  struct Transition;
  static const Transition kTable[];
  struct ExitMark {
    TimePoint when{0};
    std::optional<int> signal;
    bool failed = false;
    bool forwarded = false;  // killed by a forwarded signal: ends the round, is never its cause
    // Ended after its node's own stop signals went out: the stop's effect on that node, which
    // its agent knows without any clock (a sibling of a rank killed by a forwarded signal).
    bool after_stop = false;
    bool never_first() const { return forwarded || after_stop; }
  };

  void open(const Event&);
  void defer_start(const Event&);
  void start_all(const Event&);
  void release(const Event&);
  void ignore_ready(const Event&);
  void note_started(const Event&);
  void note_exit(const Event&);
  void stop(const Event&);
  void close(const Event&);
  void ignore(const Event&);

  State state_ = State::idle;
  Effects out_;
  rdzv::Round round_{0};
  rdzv::AssignRanks assign_;
  std::map<std::string, Placement> placement_;
  std::uint16_t master_port_ = 0;
  std::map<WorkerKey, std::uint32_t> pids_;  // this round's started workers
  bool all_started_said_ = false;
  std::map<WorkerKey, ExitMark> exits_;  // this round's, the latest word per worker
  std::vector<WorkerKey> failures_;      // failed first exits, in arrival order
  std::optional<TimePoint> stop_at_;
};

}  // namespace ddp::coordinator::round

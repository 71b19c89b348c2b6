// The round machine: the transition table first, then one handler per row. See
// round_machine.hpp for the lifecycle, the policy and the invariants.
#include "coordinator/round_machine.hpp"

#include "common/variant_index.hpp"

#include <csignal>
#include <limits>

namespace ddp::coordinator::round {
namespace {

template <class T>
constexpr std::size_t ev = variant_index_v<T, Event>;

}  // namespace

// One row per (state, event); rows are searched in order, std::nullopt matches any state.
struct RoundMachine::Transition {
  std::optional<State> state;
  std::size_t event;
  Handler handler;
  const char* why;
};

// clang-format off
const RoundMachine::Transition RoundMachine::kTable[] = {
  // state                            event               handler                      why
  {std::nullopt,                      ev<Assigned>,       &RoundMachine::open,         "a new round: node rank 0's assign first, its ready releases the rest"},
  {State::awaiting_ready,             ev<StartDue>,       &RoundMachine::defer_start,  "the others have no store port yet: start them with the release"},
  {State::released,                   ev<StartDue>,       &RoundMachine::start_all,    "released already: start every member now"},
  {std::nullopt,                      ev<StartDue>,       &RoundMachine::ignore,       "no released round waits for its start (stopped, closed, started)"},
  {State::awaiting_ready,             ev<Ready>,          &RoundMachine::release,      "store and NCCL id known: assign the others; the start waits"},
  {State::awaiting_ready_start_due,   ev<Ready>,          &RoundMachine::release,      "store and NCCL id known: assign and start the others, start node rank 0"},
  {std::nullopt,                      ev<Ready>,          &RoundMachine::ignore_ready, "not awaited: released, stopped, or no round"},
  {std::nullopt,                      ev<WorkerStarted>,  &RoundMachine::note_started, "a pid for status; every rank up: say so, once"},
  {std::nullopt,                      ev<WorkerExited>,   &RoundMachine::note_exit,    "first exit per rank to the rendezvous; failures kept in order"},
  {State::idle,                       ev<StopIssued>,     &RoundMachine::ignore,       "no attempt to stop"},
  {State::closed,                     ev<StopIssued>,     &RoundMachine::ignore,       "the attempt is reported already"},
  {std::nullopt,                      ev<StopIssued>,     &RoundMachine::stop,         "nothing more of the round goes out; exits after now are its effect"},
  {State::idle,                       ev<Close>,          &RoundMachine::ignore,       "no attempt open"},
  {State::closed,                     ev<Close>,          &RoundMachine::ignore,       "closed once"},
  {std::nullopt,                      ev<Close>,          &RoundMachine::close,        "report: the first failure by time, the grace's SIGKILLs"},
};
// clang-format on

const char* to_string(State s) {
  switch (s) {
    case State::idle:
      return "idle";
    case State::awaiting_ready:
      return "awaiting_ready";
    case State::awaiting_ready_start_due:
      return "awaiting_ready_start_due";
    case State::released:
      return "released";
    case State::running:
      return "running";
    case State::stopping:
      return "stopping";
    case State::closed:
      return "closed";
  }
  return "?";
}

Effects RoundMachine::handle(const Event& event) {
  out_.clear();
  for (const auto& row : kTable) {
    if ((row.state && *row.state != state_) || row.event != event.index()) continue;
    (this->*row.handler)(event);
    break;
  }
  return std::move(out_);
}

std::optional<int> RoundMachine::global_rank(const std::string& node, rdzv::Round round,
                                             std::uint32_t local_rank) const {
  if (round != round_) return std::nullopt;
  auto it = placement_.find(node);
  if (it == placement_.end() || local_rank >= it->second.local_world_size) return std::nullopt;
  return static_cast<int>(it->second.rank_base + local_rank);
}

std::optional<std::uint32_t> RoundMachine::pid(const WorkerKey& w) const {
  auto it = pids_.find(w);
  if (it == pids_.end()) return std::nullopt;
  return it->second;
}

// ---- handlers ----

void RoundMachine::open(const Event& e) {
  assign_ = std::get<Assigned>(e).assign;
  round_ = assign_.round;
  placement_.clear();
  for (const auto& na : assign_.nodes) {
    placement_[na.node] = Placement{na.node_rank.value, na.rank_base.value, na.local_world_size};
  }
  master_port_ = 0;
  pids_.clear();
  all_started_said_ = false;
  exits_.clear();
  failures_.clear();
  stop_at_.reset();
  state_ = State::awaiting_ready;
  if (!assign_.nodes.empty()) out_.push_back(SendAssign{assign_.nodes.front().node, 0, std::nullopt, false});
}

void RoundMachine::defer_start(const Event& e) {
  if (std::get<StartDue>(e).round != round_) return;
  state_ = State::awaiting_ready_start_due;
}

void RoundMachine::start_all(const Event& e) {
  if (std::get<StartDue>(e).round != round_) return;
  for (const auto& na : assign_.nodes) out_.push_back(SendStart{na.node, round_});
  state_ = State::running;
}

void RoundMachine::release(const Event& e) {
  const auto& r = std::get<Ready>(e);
  auto it = placement_.find(r.node);
  if (r.round != round_ || it == placement_.end() || it->second.node_rank != 0) return ignore_ready(e);
  if (r.error) {
    out_.push_back(ReadyFailed{*r.error});
    state_ = State::stopping;
    return;
  }
  const bool start = state_ == State::awaiting_ready_start_due;
  master_port_ = r.master_port;
  const Release rel{r.master_port, r.nccl_id};
  // Node by node, so that the first are on their way while the last are built.
  for (std::size_t i = 1; i < assign_.nodes.size(); ++i)
    out_.push_back(SendAssign{assign_.nodes[i].node, i, rel, start});
  out_.push_back(StoreUp{round_, master_port_, r.nccl_id.has_value()});
  if (start) out_.push_back(SendStart{assign_.nodes.front().node, round_});
  state_ = start ? State::running : State::released;
}

void RoundMachine::ignore_ready(const Event& e) {
  const auto& r = std::get<Ready>(e);
  out_.push_back(ReadyIgnored{r.node, r.round});
}

void RoundMachine::note_started(const Event& e) {
  const auto& s = std::get<WorkerStarted>(e);
  if (!global_rank(s.node, s.round, s.local_rank.value)) return;
  pids_[{s.node, s.local_rank.value}] = s.pid;
  if (pids_.size() == assign_.world_size && !all_started_said_) {
    all_started_said_ = true;
    out_.push_back(AllStarted{round_, assign_.world_size});
  }
}

void RoundMachine::note_exit(const Event& e) {
  const auto& x = std::get<WorkerExited>(e);
  if (!global_rank(x.node, x.round, x.local_rank.value)) return;
  const WorkerKey key{x.node, x.local_rank.value};
  const bool first = !exits_.contains(key);
  const bool failed = x.signal.has_value() || x.exit_code.value_or(0) != 0;
  exits_[key] = ExitMark{x.when, x.signal, failed, x.signal && x.forwarded, x.after_stop};
  if (!first || x.node_leaving) return;  // a leaving node's ranks were stopped with it: no cause, no event
  if (failed) failures_.push_back(key);
  out_.push_back(ForwardExit{rdzv::WorkerExited{x.node, x.round, x.local_rank, x.signal ? std::nullopt : x.exit_code,
                                                x.signal, x.agent_time, x.pid, x.signal && x.forwarded}});
}

void RoundMachine::stop(const Event& e) {
  stop_at_ = std::get<StopIssued>(e).at;
  master_port_ = 0;
  state_ = State::stopping;
}

// The first failure by mapped time: exits stamped after the stop went out are its consequences,
// unless nothing came before them; a node lost (or failing as a whole) is the cause unless a rank
// failed before it.
void RoundMachine::close(const Event& e) {
  const auto& c = std::get<Close>(e);
  AttemptClosed out;
  out.outcome = c.outcome;
  const bool stopped = c.outcome == Outcome::stopped;
  std::optional<WorkerKey> first;
  if (c.failure && c.failure->local_rank) {
    WorkerKey k{c.failure->node, c.failure->local_rank->value};
    if (exits_.contains(k) && !exits_.at(k).never_first()) first = k;
  }
  const bool node_level = c.failure && !c.failure->local_rank;
  if (node_level) out.node_failure = c.failure;
  if (!first) {
    for (std::size_t i = 0; i < failures_.size(); ++i) {
      const auto& mark = exits_.at(failures_[i]);
      if (mark.never_first()) continue;  // a forwarded signal, or its node's stop, ended it
      // Stopped by the user (Ctrl-C, `ddpctl stop`), an exit after the stop is no failure at all.
      const bool before_stop = !stop_at_ || mark.when <= *stop_at_;
      bool cause = stopped ? before_stop : (i == 0 || before_stop);
      if (node_level && !stopped) cause = before_stop && mark.when < c.failure->time;
      if (cause && (!first || mark.when < exits_.at(*first).when)) first = failures_[i];
    }
  }
  if (c.outcome != Outcome::succeeded) out.first_failure = first;
  if (stop_at_) {
    for (const auto& [k, mark] : exits_) out.killed_after_stop += mark.signal == SIGKILL && mark.when > *stop_at_;
  }
  out_.push_back(std::move(out));
  master_port_ = 0;
  state_ = State::closed;
}

void RoundMachine::ignore(const Event&) {}

}  // namespace ddp::coordinator::round

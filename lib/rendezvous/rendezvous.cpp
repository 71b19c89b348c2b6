// The rendezvous state machine: the transition table first, then one handler per row.
// See rendezvous.hpp for the lifecycle and policy.
#include "rendezvous/rendezvous.hpp"

#include "common/variant_index.hpp"

#include <algorithm>
#include <csignal>

#include "common/duration.hpp"
#include "common/strings.hpp"

namespace ddp::rendezvous {
namespace {

template <class T>
constexpr std::size_t ev = variant_index_v<T, Event>;
constexpr std::size_t kAnyEvent = std::numeric_limits<std::size_t>::max();

std::string dur(Micros d) {
  return format_duration(std::chrono::duration_cast<Millis>(d));
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGILL:
      return "SIGILL";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGUSR2:
      return "SIGUSR2";
    default:
      return nullptr;
  }
}

const std::string& node_of(const Event& e) {
  static const std::string kNone;
  return std::visit(
      [](const auto& x) -> const std::string& {
        if constexpr (requires { x.node; })
          return x.node;
        else
          return kNone;
      },
      e);
}

}  // namespace

// One row per (state, event). Rows are searched in order; a state with no row for an event
// would be a bug, so every live state lists all eight events.
struct Rendezvous::Transition {
  std::optional<State> state;  // nullopt: any state
  std::size_t event;
  Handler handler;
  const char* why;
};

// clang-format off
const Rendezvous::Transition Rendezvous::kTable[] = {
  // state            event                         handler                          why
  {State::joining,  ev<NodeJoined>,      &Rendezvous::admit,              "add; complete at MAX, or arm last call at MIN"},
  {State::joining,  ev<NodeLeft>,        &Rendezvous::leave,              "forget it; disarm last call below MIN"},
  {State::joining,  ev<Heartbeat>,       &Rendezvous::touch,              "liveness"},
  {State::joining,  ev<Tick>,            &Rendezvous::tick_joining,       "lost nodes, last call, join timeout"},
  {State::joining,  ev<WorkerExited>,    &Rendezvous::ignore,             "stale: from an earlier round"},
  {State::joining,  ev<AttemptFinished>, &Rendezvous::ignore,             "stale: from an earlier round"},
  {State::joining,  ev<StopRequested>,   &Rendezvous::stop_now,           "nothing runs: fail as stopped"},
  {State::joining,  ev<HangDetected>,    &Rendezvous::ignore,             "stale: nothing runs"},

  {State::running,  ev<NodeJoined>,      &Rendezvous::admit_during_run,   "elastic below MAX: re-form; else stand by"},
  {State::running,  ev<NodeLeft>,        &Rendezvous::lose_running,       "a member gone: failure, stop all"},
  {State::running,  ev<Heartbeat>,       &Rendezvous::touch,              "liveness"},
  {State::running,  ev<Tick>,            &Rendezvous::tick_running,       "lost nodes"},
  {State::running,  ev<WorkerExited>,    &Rendezvous::exit_running,       "non-zero or signal: failure, stop all"},
  {State::running,  ev<AttemptFinished>, &Rendezvous::finished_running,   "all ok: success; not ok: failure"},
  {State::running,  ev<StopRequested>,   &Rendezvous::stop_running,       "stop all, then fail as stopped"},
  {State::running,  ev<HangDetected>,    &Rendezvous::hang_running,       "a failure: stop all; restart or fail as hung"},

  {State::stopping, ev<NodeJoined>,      &Rendezvous::admit_for_next_round, "joins the next round"},
  {State::stopping, ev<NodeLeft>,        &Rendezvous::lose_stopping,      "counts as stopped; a lost member"},
  {State::stopping, ev<Heartbeat>,       &Rendezvous::touch,              "liveness"},
  {State::stopping, ev<Tick>,            &Rendezvous::tick_stopping,      "lost nodes, stop timeout"},
  {State::stopping, ev<WorkerExited>,    &Rendezvous::exit_stopping,      "candidate for first failure"},
  {State::stopping, ev<AttemptFinished>, &Rendezvous::finished_stopping,  "ack; all acked: restart or fail"},
  {State::stopping, ev<StopRequested>,   &Rendezvous::stop_stopping,      "no restart after this stop"},
  {State::stopping, ev<HangDetected>,    &Rendezvous::ignore,             "already stopping: the stop decides"},

  {State::backoff,  ev<NodeJoined>,      &Rendezvous::admit_for_next_round, "joins the next round"},
  {State::backoff,  ev<NodeLeft>,        &Rendezvous::leave,              "forget it"},
  {State::backoff,  ev<Heartbeat>,       &Rendezvous::touch,              "liveness"},
  {State::backoff,  ev<Tick>,            &Rendezvous::tick_backoff,       "lost nodes; backoff over: open the round"},
  {State::backoff,  ev<WorkerExited>,    &Rendezvous::ignore,             "stale"},
  {State::backoff,  ev<AttemptFinished>, &Rendezvous::ignore,             "stale"},
  {State::backoff,  ev<StopRequested>,   &Rendezvous::stop_now,           "nothing runs: fail as stopped"},
  {State::backoff,  ev<HangDetected>,    &Rendezvous::ignore,             "stale: nothing runs"},

  {std::nullopt,    kAnyEvent,           &Rendezvous::ignore,             "succeeded / failed are final"},
};
// clang-format on

const char* to_string(State s) {
  switch (s) {
    case State::joining:
      return "joining";
    case State::running:
      return "running";
    case State::stopping:
      return "stopping";
    case State::backoff:
      return "backoff";
    case State::succeeded:
      return "succeeded";
    case State::failed:
      return "failed";
  }
  return "?";
}

std::string Failure::describe() const {
  std::string who;
  if (rank) {
    who = "rank " + std::to_string(rank->value) + " (" + node;
    if (local_rank) who += ", local rank " + std::to_string(local_rank->value);
    if (pid) who += ", pid " + std::to_string(pid);
    who += ")";
  } else {
    who = "node " + node;
  }
  switch (kind) {
    case Kind::worker_exit:
      if (signal) {
        const char* name = signal_name(*signal);
        return who + " was killed by signal " + std::to_string(*signal) + (name ? std::string(" (") + name + ")" : "") +
               (forwarded ? ", which ddpctl forwarded (it has no handler for it)" : "");
      }
      return who + " exited with code " + std::to_string(exit_code.value_or(-1));
    case Kind::node_lost:
      return who + " was lost" + (reason.empty() ? "" : ": " + reason);
    case Kind::node_reported:
      return who + " reported a failed attempt";
    case Kind::hung:
      return reason;
  }
  return who;
}

Rendezvous::Rendezvous(Config config, TimePoint now) : config_(std::move(config)), now_(now) {
  const auto n = static_cast<std::uint32_t>(config_.hosts.size());
  if (config_.max_nodes == 0) config_.max_nodes = n;
  if (config_.min_nodes == 0) config_.min_nodes = std::min(config_.max_nodes, n);
  // A round can never have more nodes than there are hosts to run them.
  config_.max_nodes = std::min(config_.max_nodes, n);
  config_.min_nodes = std::min(config_.min_nodes, config_.max_nodes);
  round_ = Round{1};
  join_deadline_ = now + config_.join_timeout;
  for (std::size_t i = 0; i < config_.hosts.size(); ++i) {
    host_index_.emplace(config_.hosts[i], i);
    absent_.insert(i);
  }
}

Effects Rendezvous::handle(const Event& event, TimePoint now) {
  now_ = std::max(now_, now);  // an edge's clock never makes us go back in time
  out_.clear();
  if (state_ != State::succeeded && state_ != State::failed) {
    if (auto it = nodes_.find(node_of(event)); it != nodes_.end() && it->second.last_seen != now_) {
      // The index's entry moves to the end (now_ is the latest time there is) as it is: its tree
      // node is reused, not freed and allocated again (the key that finds it is still a copy of
      // the name); a node seen again in the same instant stays put. Every joined node has an
      // entry (admit, lose); the else is a guard, not a path.
      auto entry = seen_.extract({it->second.last_seen, it->first});
      it->second.last_seen = now_;
      if (entry) {
        entry.value().first = now_;
        seen_.insert(seen_.end(), std::move(entry));
      } else {
        seen_.emplace_hint(seen_.end(), now_, it->first);
      }
    }
  }
  for (const auto& row : kTable) {
    if ((row.state && *row.state != state_) || (row.event != kAnyEvent && row.event != event.index())) continue;
    (this->*row.handler)(event);
    break;
  }
  return std::move(out_);
}

// ---- helpers ----

bool Rendezvous::is_member(const std::string& node) const {
  return member_set_.count(node) > 0;
}

std::vector<std::string> Rendezvous::present() const {
  std::vector<const Node*> v;
  for (const auto& [name, n] : nodes_) v.push_back(&n);
  std::sort(v.begin(), v.end(), [](auto* a, auto* b) { return a->host_index < b->host_index; });
  std::vector<std::string> out;
  for (auto* n : v) out.push_back(n->name);
  return out;
}

std::string Rendezvous::joined_summary() const {
  std::vector<std::string> missing;
  for (auto it = absent_.begin(); it != absent_.end() && missing.size() < 8; ++it)
    missing.push_back(config_.hosts[*it]);
  const bool exact = config_.min_nodes == config_.max_nodes && config_.max_nodes == config_.hosts.size();
  std::string s = std::to_string(nodes_.size()) + "/" +
                  std::to_string(exact ? config_.max_nodes : config_.hosts.size()) + " nodes joined";
  if (!exact) s += " (need " + std::to_string(config_.min_nodes) + "-" + std::to_string(config_.max_nodes) + ")";
  if (!missing.empty()) {
    if (absent_.size() > 8) missing.push_back("and " + std::to_string(absent_.size() - 8) + " more");
    s += "; missing: " + join(missing, ", ");
  }
  return s;
}

std::string Rendezvous::status() const {
  const std::string r = "round " + std::to_string(round_.value);
  switch (state_) {
    case State::joining: {
      std::string s = r + ": waiting for nodes: " + joined_summary();
      if (last_call_deadline_) s += "; last call ends in " + dur(*last_call_deadline_ - now_);
      return s;
    }
    case State::running: {
      std::uint32_t world = 0;
      for (const auto& m : members_) world += nodes_.at(m).nproc;
      // The restart count is the status line's own field (ddpctl status), not repeated here.
      return r + ": running on " + std::to_string(members_.size()) + " nodes, world size " + std::to_string(world);
    }
    case State::stopping: {
      std::vector<std::string> waiting;
      for (const auto& m : members_) {
        if (nodes_.count(m) && !finished_.count(m)) waiting.push_back(m);
      }
      return r + ": stopping: waiting for " + join(waiting, ", ") + " to report their workers gone";
    }
    case State::backoff:
      return "restart " + std::to_string(restart_count_) + "/" + std::to_string(config_.max_restarts) + " in " +
             dur(restart_at_.value_or(now_) - now_);
    case State::succeeded:
      return r + ": succeeded";
    case State::failed:
      return r + ": failed";
  }
  return r;
}

std::optional<TimePoint> Rendezvous::next_deadline() const {
  if (state_ == State::succeeded || state_ == State::failed) return std::nullopt;
  std::optional<TimePoint> d;
  auto consider = [&](std::optional<TimePoint> t) {
    if (t && (!d || *t < *d)) d = t;
  };
  if (!seen_.empty()) consider(seen_.begin()->first + config_.heartbeat_timeout);
  if (state_ == State::joining) {
    consider(join_deadline_);
    consider(last_call_deadline_);
  }
  if (state_ == State::stopping) consider(stop_deadline_);
  if (state_ == State::backoff) consider(restart_at_);
  return d;
}

Micros Rendezvous::backoff_for(std::uint32_t restart) const {
  Micros b = config_.backoff_initial;
  for (std::uint32_t i = 1; i < restart && b < config_.backoff_max; ++i) b *= 2;
  return std::min(b, config_.backoff_max);
}

void Rendezvous::open_round() {
  round_ = Round{round_.value + 1};
  state_ = State::joining;
  members_.clear();
  member_set_.clear();
  finished_.clear();
  finished_ok_.clear();
  failures_.clear();
  lost_member_this_round_ = false;
  membership_change_ = false;
  last_call_deadline_.reset();
  stop_deadline_.reset();
  restart_at_.reset();
  join_deadline_ = now_ + config_.join_timeout;
  for (auto& [name, n] : nodes_) n.node_rank.reset();
  maybe_complete();
  if (state_ == State::joining) out_.push_back(Progress{status()});
}

void Rendezvous::maybe_complete() {
  const auto n = nodes_.size();
  if (n >= config_.max_nodes && n > 0) return complete_round();
  if (n >= config_.min_nodes && n > 0) {
    if (!last_call_deadline_) {
      last_call_deadline_ = now_ + config_.last_call;
      out_.push_back(Progress{joined_summary() + "; last call: waiting " + dur(config_.last_call) + " for more"});
    }
    if (now_ >= *last_call_deadline_) complete_round();
    return;
  }
  last_call_deadline_.reset();
}

void Rendezvous::complete_round() {
  // Node ranks follow the host list; beyond MAX, the later hosts stand by.
  const auto all = present();
  auto order = all;
  if (order.size() > config_.max_nodes) order.resize(config_.max_nodes);
  members_ = order;
  member_set_ = {members_.begin(), members_.end()};
  AssignRanks a{round_, restart_count_, 0, {}};
  std::uint32_t base = 0;
  for (std::uint32_t i = 0; i < members_.size(); ++i) {
    auto& n = nodes_.at(members_[i]);
    n.node_rank = NodeRank{i};
    n.rank_base = GlobalRank{base};
    a.nodes.push_back(NodeAssignment{n.name, NodeRank{i}, GlobalRank{base}, n.nproc});
    base += n.nproc;
  }
  a.world_size = base;
  state_ = State::running;
  last_call_deadline_.reset();
  finished_.clear();
  finished_ok_.clear();
  failures_.clear();
  lost_member_this_round_ = false;
  membership_change_ = false;
  out_.push_back(std::move(a));
  out_.push_back(StartAttempt{round_, restart_count_});
  for (std::size_t i = members_.size(); i < all.size(); ++i) {
    out_.push_back(Progress{all[i] + " stands by: round " + std::to_string(round_.value) + " is full"});
  }
}

void Rendezvous::begin_stop(const std::string& reason) {
  state_ = State::stopping;
  stop_issued_at_ = now_;
  stop_deadline_ = now_ + config_.stop_timeout;
  out_.push_back(StopAll{round_, reason});
  // Nodes that already reported their workers gone need not ack again.
  bool all = true;
  for (const auto& m : members_) all = all && (!nodes_.count(m) || finished_.count(m));
  if (all) after_stop();
}

void Rendezvous::record_failure(Failure f) {
  f.round = round_;
  failures_.push_back(std::move(f));
}

void Rendezvous::lose(const std::string& node, const std::string& reason, bool drop) {
  if (drop) out_.push_back(DropNode{node, reason});
  auto it = nodes_.find(node);
  if (it == nodes_.end()) return;
  Node n = it->second;
  seen_.erase({n.last_seen, node});
  absent_.insert(n.host_index);
  nodes_.erase(it);
  const bool member = is_member(node) && (state_ == State::running || state_ == State::stopping);
  if (!member) {
    if (state_ == State::joining) {
      out_.push_back(Progress{node + " left (" + reason + "); " + joined_summary()});
      maybe_complete();
    }
    return;
  }
  lost_member_this_round_ = true;
  Failure f;
  f.kind = Failure::Kind::node_lost;
  f.node = node;
  f.reason = reason;
  f.node_rank = n.node_rank;
  f.time = now_;
  if (state_ == State::running) {
    record_failure(f);
    begin_stop("node " + node + " lost: " + reason);
    return;
  }
  // Stopping: the loss is late news, not a cause; it still counts as acknowledged.
  record_failure(f);
  bool all = true;
  for (const auto& m : members_) all = all && (!nodes_.count(m) || finished_.count(m));
  if (all) after_stop();
}

void Rendezvous::check_heartbeats() {
  std::vector<std::pair<std::string, Micros>> silent;
  for (const auto& [seen, name] : seen_) {
    if (now_ - seen < config_.heartbeat_timeout) break;
    silent.emplace_back(name, now_ - seen);
  }
  for (const auto& [name, quiet] : silent) {
    if (state_ == State::succeeded || state_ == State::failed) return;
    lose(name, "no heartbeat for " + dur(quiet), /*drop=*/true);
  }
}

void Rendezvous::after_stop() {
  stop_deadline_.reset();
  if (user_stop_) return fail_job(JobFailed::Kind::stopped, "job stopped: " + *user_stop_);
  if (hang_stop_) {
    state_ = State::failed;
    JobFailed f{JobFailed::Kind::hung, std::nullopt, restart_count_, *hang_stop_};
    for (const auto& x : failures_) {
      if (x.kind == Failure::Kind::hung) f.first_failure = x;
    }
    out_.push_back(std::move(f));
    return;
  }
  if (membership_change_ || (elastic() && lost_member_this_round_)) {
    // Re-form without spending a restart: the failures were the membership change's fallout.
    out_.push_back(Progress{"re-forming with " + std::to_string(nodes_.size()) +
                            (nodes_.size() == 1 ? " node" : " nodes") + " (membership changed; no restart spent)"});
    return open_round();
  }
  const Failure* first = nullptr;
  for (const auto& f : failures_) {
    const bool cause = &f == &failures_.front() || f.time <= stop_issued_at_;
    if (cause && (!first || f.time < first->time)) first = &f;
  }
  const std::string what = first ? first->describe() : "the attempt failed";
  if (restart_count_ < config_.max_restarts) {
    ++restart_count_;
    const auto b = backoff_for(restart_count_);
    restart_at_ = now_ + b;
    state_ = State::backoff;
    out_.push_back(RestartScheduled{Round{round_.value + 1}, restart_count_, b,
                                    what + "; restart " + std::to_string(restart_count_) + "/" +
                                        std::to_string(config_.max_restarts) + " in " + dur(b)});
    return;
  }
  JobFailed f{JobFailed::Kind::worker_failed, first ? std::optional<Failure>(*first) : std::nullopt, restart_count_,
              what};
  if (config_.max_restarts > 0)
    f.message +=
        "; no restarts left (" + std::to_string(restart_count_) + "/" + std::to_string(config_.max_restarts) + " used)";
  state_ = State::failed;
  out_.push_back(std::move(f));
}

void Rendezvous::fail_job(JobFailed::Kind kind, std::string message) {
  state_ = State::failed;
  out_.push_back(JobFailed{kind, std::nullopt, restart_count_, std::move(message)});
}

// ---- handlers ----

void Rendezvous::admit(const Event& e) {
  const auto& j = std::get<NodeJoined>(e);
  auto host = host_index_.find(j.node);
  if (host == host_index_.end()) {
    std::vector<std::string> shown(
        config_.hosts.begin(),
        config_.hosts.begin() + static_cast<long>(std::min<std::size_t>(8, config_.hosts.size())));
    if (config_.hosts.size() > 8) shown.push_back("...");
    out_.push_back(RejectNode{j.node, j.node + " is not one of this job's hosts (" + join(shown, ", ") + ")"});
    return;
  }
  if (nodes_.count(j.node)) {
    out_.push_back(RejectNode{j.node, j.node + " has already joined; is a second agent running for it?"});
    return;
  }
  if (j.nproc == 0) {
    out_.push_back(RejectNode{j.node, j.node + " offers no workers (nproc 0)"});
    return;
  }
  nodes_.emplace(j.node, Node{j.node, host->second, j.nproc, j.clock_offset, now_, std::nullopt, GlobalRank{0}});
  seen_.emplace(now_, j.node);
  absent_.erase(host->second);
  if (state_ == State::joining) {
    const auto before = out_.size();
    maybe_complete();
    if (state_ == State::joining && out_.size() == before) out_.push_back(Progress{status()});
  }
}

void Rendezvous::admit_for_next_round(const Event& e) {
  admit(e);
}

void Rendezvous::admit_during_run(const Event& e) {
  const auto before = nodes_.size();
  admit(e);
  if (nodes_.size() == before) return;  // rejected
  const auto& node = std::get<NodeJoined>(e).node;
  if (elastic() && members_.size() < config_.max_nodes) {
    membership_change_ = true;
    begin_stop(node + " joined; re-forming with " +
               std::to_string(std::min<std::size_t>(nodes_.size(), config_.max_nodes)) + " nodes");
    return;
  }
  out_.push_back(Progress{node + " stands by for the next round"});
}

void Rendezvous::leave(const Event& e) {
  const auto& l = std::get<NodeLeft>(e);
  lose(l.node, l.reason, /*drop=*/false);
}

void Rendezvous::lose_running(const Event& e) {
  leave(e);
}
void Rendezvous::lose_stopping(const Event& e) {
  leave(e);
}

void Rendezvous::touch(const Event&) {}  // handle() already refreshed last_seen

void Rendezvous::ignore(const Event&) {}

void Rendezvous::tick_joining(const Event&) {
  check_heartbeats();
  if (state_ != State::joining) return;
  if (last_call_deadline_ && now_ >= *last_call_deadline_ && nodes_.size() >= config_.min_nodes) {
    return complete_round();
  }
  if (now_ >= join_deadline_) {
    if (nodes_.size() >= config_.min_nodes && !nodes_.empty()) return complete_round();
    fail_job(JobFailed::Kind::rendezvous_timeout,
             "rendezvous timed out after " + dur(config_.join_timeout) + ": " + joined_summary());
  }
}

void Rendezvous::tick_running(const Event&) {
  check_heartbeats();
}

void Rendezvous::tick_stopping(const Event&) {
  check_heartbeats();
  if (state_ != State::stopping || !stop_deadline_ || now_ < *stop_deadline_) return;
  std::vector<std::string> late;
  for (const auto& m : members_) {
    if (nodes_.count(m) && !finished_.count(m)) late.push_back(m);
  }
  for (const auto& m : late) {
    if (state_ != State::stopping) break;
    lose(m, "did not report its workers stopped within " + dur(config_.stop_timeout), /*drop=*/true);
  }
}

void Rendezvous::tick_backoff(const Event&) {
  check_heartbeats();
  if (state_ == State::backoff && restart_at_ && now_ >= *restart_at_) open_round();
}

// A failing worker exit of this round as a Failure, its time mapped to the coordinator's clock;
// nullopt for exits of other rounds, of non-members, and clean exits (a rank finishing early).
std::optional<Failure> Rendezvous::failure_of(const WorkerExited& x) const {
  if (x.round != round_ || !is_member(x.node) || !nodes_.count(x.node)) return std::nullopt;
  if (!x.signal && x.exit_code.value_or(0) == 0) return std::nullopt;
  const auto& n = nodes_.at(x.node);
  Failure f;
  f.kind = Failure::Kind::worker_exit;
  f.node = x.node;
  f.node_rank = n.node_rank;
  f.local_rank = x.local_rank;
  f.rank = GlobalRank{n.rank_base.value + x.local_rank.value};
  f.exit_code = x.exit_code;
  f.signal = x.signal;
  f.pid = x.pid;
  f.forwarded = x.signal && x.forwarded;
  f.time = saturating_minus(x.agent_time, n.offset);  // both a peer's numbers
  return f;
}

void Rendezvous::exit_running(const Event& e) {
  auto f = failure_of(std::get<WorkerExited>(e));
  if (!f) return;
  const auto reason = f->describe();
  record_failure(std::move(*f));
  begin_stop(reason);
}

void Rendezvous::exit_stopping(const Event& e) {
  if (auto f = failure_of(std::get<WorkerExited>(e))) record_failure(std::move(*f));
}

void Rendezvous::finished_running(const Event& e) {
  const auto& a = std::get<AttemptFinished>(e);
  if (a.round != round_ || !is_member(a.node)) return;
  finished_.insert(a.node);
  if (a.ok) {
    finished_ok_.insert(a.node);
    if (finished_ok_.size() == members_.size()) {
      state_ = State::succeeded;
      out_.push_back(JobSucceeded{round_, restart_count_});
    }
    return;
  }
  // Not ok without a failing exit reported (the agent lost track, or its shepherd died).
  Failure f;
  f.kind = Failure::Kind::node_reported;
  f.node = a.node;
  f.node_rank = nodes_.count(a.node) ? nodes_.at(a.node).node_rank : std::nullopt;
  f.time = now_;
  record_failure(f);
  begin_stop(f.describe());
}

void Rendezvous::finished_stopping(const Event& e) {
  const auto& a = std::get<AttemptFinished>(e);
  if (a.round != round_ || !is_member(a.node)) return;
  finished_.insert(a.node);
  for (const auto& m : members_) {
    if (nodes_.count(m) && !finished_.count(m)) return;
  }
  after_stop();
}

void Rendezvous::stop_now(const Event& e) {
  fail_job(JobFailed::Kind::stopped, "job stopped: " + std::get<StopRequested>(e).reason);
}

void Rendezvous::stop_running(const Event& e) {
  user_stop_ = std::get<StopRequested>(e).reason;
  begin_stop("stop requested: " + *user_stop_);
}

void Rendezvous::hang_running(const Event& e) {
  const auto& h = std::get<HangDetected>(e);
  Failure f;
  f.kind = Failure::Kind::hung;
  f.node = "all";
  f.time = now_;
  f.reason = h.reason;
  record_failure(f);
  if (!h.restart) hang_stop_ = h.reason;
  begin_stop(h.reason);
}

void Rendezvous::stop_stopping(const Event& e) {
  if (!user_stop_) user_stop_ = std::get<StopRequested>(e).reason;
}

}  // namespace ddp::rendezvous

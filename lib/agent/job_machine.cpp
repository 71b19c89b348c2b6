// The agent's job lifecycle: the transition table first, then one handler per row. See
// job_machine.hpp for the lifecycle, the invariants and what the edge does with each effect.
#include "agent/job_machine.hpp"

#include "common/variant_index.hpp"

#include <fmt/format.h>

#include <limits>
#include <type_traits>

namespace ddp::agent::job {
namespace {

template <class T>
constexpr std::size_t ev = variant_index_v<T, Event>;

Log warn(std::string text) {
  return Log{Log::Level::warn, std::move(text)};
}
Log info(std::string text) {
  return Log{Log::Level::info, std::move(text)};
}

}  // namespace

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::idle:
      return "idle";
    case Phase::preflight:
      return "preflight";
    case Phase::joined:
      return "joined";
    case Phase::readying:
      return "readying";
    case Phase::assigned:
      return "assigned";
    case Phase::running:
      return "running";
    case Phase::draining:
      return "draining";
    case Phase::done:
      return "done";
  }
  return "?";
}

struct JobMachine::Transition {
  unsigned phases;  // a mask of bit(Phase)
  std::size_t event;
  Handler handler;
  const char* why;
};

namespace {
using P = Phase;
constexpr unsigned b(P p) {
  return 1u << static_cast<unsigned>(p);
}
constexpr unsigned kAny = 0xffu;
constexpr unsigned kHeld = kAny & ~b(P::idle);
constexpr unsigned kWorkers = b(P::running) | b(P::draining);
constexpr unsigned kNoWorkers = kHeld & ~kWorkers;
constexpr unsigned kAssignable = b(P::joined) | b(P::readying) | b(P::assigned) | b(P::done);
}  // namespace

// One row per (phases, event); the first row that matches handles it. Every (phase, event) pair
// has a row (tests/unit/agent checks), so nothing falls through unhandled.
// clang-format off
const JobMachine::Transition JobMachine::kTable[] = {
  // phases                      event                handler                       why
  {kAny,                         ev<Offer>,           &JobMachine::take_offer,      "busy() said yes: hold it (a re-offer by its link replaces it)"},
  {b(P::preflight),              ev<Joined>,          &JobMachine::joined,          "the join went up: wait for an assign"},
  {kAny,                         ev<Joined>,          &JobMachine::ignore,          "a preflight of a job no longer held"},
  {b(P::preflight),              ev<Assign>,          &JobMachine::assign_early,    "no ranks before this node's join: refuse"},
  {kAssignable,                  ev<Assign>,          &JobMachine::assign,          "take the round; node rank 0 prepares store and id first"},
  {kWorkers,                     ev<Assign>,          &JobMachine::assign_busy,     "a new round while this one's workers run: refuse"},
  {kAny,                         ev<Assign>,          &JobMachine::ignore,          "no job: addressed() refused it at the edge"},
  {b(P::readying),               ev<Ready>,           &JobMachine::ready,           "node rank 0's ready went up: it may be started"},
  {kAny,                         ev<Ready>,           &JobMachine::ignore,          "a ready of a round no longer current"},
  {b(P::readying) | b(P::assigned) | b(P::running),
                                 ev<RoundFailed>,     &JobMachine::round_failed,    "store, folder or shepherd failed: the round fails here"},
  {kAny,                         ev<RoundFailed>,     &JobMachine::ignore,          "a failure of a round no longer current"},
  {kHeld,                        ev<Start>,           &JobMachine::start,           "start the assigned round once; else say it failed"},
  {kAny,                         ev<Start>,           &JobMachine::ignore,          "no job: addressed() refused it at the edge"},
  {kWorkers,                     ev<Stop>,            &JobMachine::stop_running,    "the round's workers: [SIGINT,] SIGTERM (grace) or SIGKILL"},
  {kNoWorkers,                   ev<Stop>,            &JobMachine::stop_idle,       "nothing of it runs: its result at once"},
  {kAny,                         ev<Stop>,            &JobMachine::ignore,          "no job: addressed() refused it at the edge"},
  {kWorkers,                     ev<Signal>,          &JobMachine::signal,          "SIGUSR1/2 to the workers of that round, as they are"},
  {kAny,                         ev<Signal>,          &JobMachine::ignore,          "nobody runs to tell"},
  {kWorkers,                     ev<FirstFailure>,    &JobMachine::first_failure,   "its exit goes up now; the group stops the others"},
  {kAny,                         ev<FirstFailure>,    &JobMachine::ignore,          "stale: no round runs"},
  {kWorkers,                     ev<WorkersDone>,     &JobMachine::workers_done,    "exits and result up; a drained job is forgotten"},
  {kAny,                         ev<WorkersDone>,     &JobMachine::ignore,          "stale: a report of no running round"},
  {b(P::idle),                   ev<LinkClosed>,      &JobMachine::closed_idle,     "a link without our job; --stdio: the only one"},
  {kWorkers,                     ev<LinkClosed>,      &JobMachine::closed_running,  "the owner's: stop the workers, forget when they end"},
  {kNoWorkers,                   ev<LinkClosed>,      &JobMachine::closed_held,     "the owner's: nothing runs, forget the job now"},
  {kAny,                         ev<Shutdown>,        &JobMachine::shutdown,        "leave, stop the workers, exit once none runs"},
  {kAny,                         ev<LauncherGone>,    &JobMachine::launcher_gone,   "--connect: no launcher, no job: exit"},
  {kAny,                         ev<DialFailed>,      &JobMachine::dial_failed,     "--connect: nobody to serve: exit"},
};
// clang-format on

std::vector<Effect> JobMachine::handle(const Event& e) {
  Out out;
  for (const auto& t : kTable) {
    if ((t.phases & bit(phase_)) && t.event == e.index()) {
      (this->*t.handler)(e, out);
      return out;
    }
  }
  return out;  // (unreachable: every pair has a row)
}

const char* JobMachine::why(Phase p, std::size_t event) {
  for (const auto& t : kTable) {
    if ((t.phases & bit(p)) && t.event == event) return t.why;
  }
  return nullptr;
}

JobMachine::Busy JobMachine::busy(LinkId link) const {
  if (!has_job()) return Busy::no;
  if (owner_ != link) return Busy::other_link;
  if (workers_running()) return Busy::workers_running;
  return Busy::no;
}

std::optional<Refuse> JobMachine::addressed(LinkId link, const std::optional<std::string>& job_id,
                                            const std::string& type) const {
  if (!has_job() || owner_ != link) {
    return Refuse{
        link, RefuseCode::unexpected, fmt::format("'{}' for a job this agent does not hold for you", type), {}};
  }
  if (job_id && *job_id != job_id_) {
    return Refuse{link,
                  RefuseCode::bad_value,
                  fmt::format("'{}' names job {}, but this connection's job is {}", type, *job_id, job_id_),
                  {}};
  }
  return std::nullopt;
}

// ---- handlers ----

void JobMachine::take_offer(const Event& e, Out& out) {
  const auto& o = std::get<Offer>(e);
  if (has_job()) out.push_back(DropIdHolder{});  // a re-offer: the last one's round is over
  phase_ = Phase::preflight;
  owner_ = o.link;
  job_id_ = o.job_id;
  round_ = group_round_ = 0;
  reported_.clear();
  exits_sent_.clear();
}

void JobMachine::joined(const Event&, Out&) {
  phase_ = Phase::joined;
}

void JobMachine::assign_early(const Event& e, Out& out) {
  const auto& a = std::get<Assign>(e);
  out.push_back(
      Refuse{a.link, RefuseCode::unexpected, fmt::format("assign for round {} before this node's join", a.round), {}});
}

void JobMachine::assign_busy(const Event& e, Out& out) {
  const auto& a = std::get<Assign>(e);
  out.push_back(Refuse{a.link,
                       RefuseCode::unexpected,
                       fmt::format("assign for round {} while round {}'s workers still run", a.round, group_round_),
                       {}});
}

void JobMachine::assign(const Event& e, Out& out) {
  const auto& a = std::get<Assign>(e);
  round_ = a.round;
  const bool serve = a.node_rank == 0;
  phase_ = serve ? Phase::readying : Phase::assigned;
  out.push_back(PrepareRound{a.round, serve});
  // Version 4: an assign sent once the round is complete is also its start.
  if (a.start) start(Start{a.link, a.round}, out);
}

void JobMachine::ready(const Event& e, Out&) {
  if (std::get<Ready>(e).round == round_) phase_ = Phase::assigned;
}

void JobMachine::round_failed(const Event& e, Out& out) {
  const auto& f = std::get<RoundFailed>(e);
  if (f.round != round_ || (phase_ == Phase::running && group_round_ != f.round)) return;
  phase_ = Phase::done;
  if (!reported(f.round)) finish(f.round, false, f.error, out);
}

// Node rank 0 is started only after its ready (I2): a start while its id is on its way finds
// nothing assigned yet. Neither a round twice, nor one whose result went up.
void JobMachine::start(const Event& e, Out& out) {
  const auto round = std::get<Start>(e).round;
  if (phase_ != Phase::assigned || round != round_ || reported(round)) {
    if (!reported(round)) {
      out.push_back(warn(fmt::format("job {}: start for round {} without its assignment; refusing", job_id_, round)));
      finish(round, false, "start without an assignment", out);
    }
    return;
  }
  phase_ = Phase::running;
  group_round_ = round;
  exits_sent_.clear();
  out.push_back(StartWorkers{round});
}

void JobMachine::stop_running(const Event& e, Out& out) {
  const auto& s = std::get<Stop>(e);
  // The round is over for every node: NCCL's bootstrap root goes with it. (A round that ends
  // well keeps it until the job is forgotten: ranks elsewhere may still be joining it.)
  out.push_back(DropIdHolder{});
  if (s.round != group_round_) {
    if (!reported(s.round)) finish(s.round, false, {}, out);
    return;
  }
  out.push_back(warn(fmt::format("job {} round {}: stop: {}", job_id_, s.round, s.reason)));
  out.push_back(StopWorkers{s.now, s.interrupt_ms});
}

void JobMachine::stop_idle(const Event& e, Out& out) {
  const auto& s = std::get<Stop>(e);
  out.push_back(DropIdHolder{});
  // A round stopped before its start: no ready, no workers will come of it.
  if (s.round == round_ && (phase_ == Phase::readying || phase_ == Phase::assigned)) phase_ = Phase::done;
  if (!reported(s.round)) finish(s.round, false, {}, out);
}

void JobMachine::signal(const Event& e, Out& out) {
  const auto& s = std::get<Signal>(e);
  if (s.round && *s.round != group_round_) return;
  out.push_back(info(s.round ? fmt::format("job {} round {}: {} from the coordinator: passing it to the workers",
                                           job_id_, group_round_, s.name)
                             : fmt::format("{}: passing it to job {}'s workers", s.name, job_id_)));
  out.push_back(ForwardSignal{s.sig});
}

void JobMachine::first_failure(const Event& e, Out& out) {
  const auto& f = std::get<FirstFailure>(e);
  out.push_back(warn(fmt::format("job {} round {}: rank {} {}; stopping this node's other workers", job_id_,
                                 group_round_, f.rank, f.what)));
  exits_sent_.insert(f.local_rank);
  if (owner_) out.push_back(ReportExit{f.local_rank, false});
}

void JobMachine::workers_done(const Event& e, Out& out) {
  const auto& d = std::get<WorkersDone>(e);
  const auto round = group_round_;
  if (d.dropped_lines) {
    out.push_back(
        warn(fmt::format("job {} round {}: {} output line(s) were not sent to the coordinator (still in the "
                         "log files)",
                         job_id_, round, d.dropped_lines)));
  }
  for (int r : d.started_ranks) {
    const bool first = d.first_failure == r;
    if (exits_sent_.count(r) && !first) continue;
    exits_sent_.insert(r);
    if (owner_) out.push_back(ReportExit{r, first});
  }
  out.push_back(
      info(fmt::format("job {} round {}: workers done ({})", job_id_, round, d.ok ? "all exited 0" : "not all ok")));
  if (!reported(round)) finish(round, d.ok, {}, out);
  if (phase_ == Phase::draining) return forget(out);
  phase_ = Phase::done;
}

void JobMachine::closed_idle(const Event&, Out& out) {
  if (cfg_.stdio) exit(out);  // our only coordinator left before offering a job
}

void JobMachine::closed_held(const Event& e, Out& out) {
  const auto& c = std::get<LinkClosed>(e);
  if (c.link != owner_) return;
  // After the round's result went up and no worker runs, this is how a job normally ends.
  if (reported(round_)) {
    out.push_back(info(
        fmt::format("job {}: its coordinator closed the connection after the round's result ({})", job_id_, c.reason)));
  } else {
    out.push_back(warn(fmt::format("job {}: its coordinator is gone ({}); stopping its workers", job_id_, c.reason)));
  }
  forget(out);
}

void JobMachine::closed_running(const Event& e, Out& out) {
  const auto& c = std::get<LinkClosed>(e);
  if (c.link != owner_) return;
  out.push_back(warn(fmt::format("job {}: its coordinator is gone ({}); stopping its workers", job_id_, c.reason)));
  owner_ = 0;
  phase_ = Phase::draining;
  out.push_back(StopWorkers{false});
}

void JobMachine::shutdown(const Event& e, Out& out) {
  const auto& s = std::get<Shutdown>(e);
  if (shutting_down_) {
    out.push_back(warn(fmt::format("{} again: killing the workers now", s.signal)));
    if (workers_running()) out.push_back(StopWorkers{true});
    return;
  }
  shutting_down_ = true;
  out.push_back(warn(fmt::format("{}: shutting down (stopping this node's workers first)", s.signal)));
  if (workers_running()) {
    // Said first, so that the launcher reports this node's leaving, not its workers' SIGTERM
    // exits that follow, as the job's failure.
    if (owner_) out.push_back(SendLeaving{fmt::format("its agent is shutting down ({})", s.signal)});
    phase_ = Phase::draining;
    out.push_back(StopWorkers{false});
    return;
  }
  if (has_job()) return forget(out);  // which exits: we are shutting down
  exit(out);
}

void JobMachine::launcher_gone(const Event& e, Out& out) {
  if (!std::get<LauncherGone>(e).links_left && !has_job() && !shutting_down_) exit(out);
}

void JobMachine::dial_failed(const Event&, Out& out) {
  exit(out);
}

// ---- the three ways out ----

void JobMachine::finish(std::uint32_t round, bool ok, std::string error, Out& out) {
  reported_.insert(round);
  if (owner_) out.push_back(ReportFinished{round, ok, std::move(error)});
}

// The one place a job ends (I5, I6): whoever calls it, a shutdown waiting for it ends here too.
void JobMachine::forget(Out& out) {
  out.push_back(info(fmt::format("job {}: done on this node", job_id_)));
  out.push_back(Forget{});
  phase_ = Phase::idle;
  owner_ = 0;
  job_id_.clear();
  reported_.clear();
  exits_sent_.clear();
  if (shutting_down_) return exit(out);
  if (cfg_.oneshot || cfg_.stdio) {
    out.push_back(info("one-shot: exiting after the job"));
    exit(out);
  }
}

void JobMachine::exit(Out& out) {
  shutting_down_ = true;
  if (exited_) return;
  exited_ = true;
  out.push_back(Exit{});
}

}  // namespace ddp::agent::job

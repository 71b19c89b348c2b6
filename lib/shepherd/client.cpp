#include "shepherd/client.hpp"

#include "common/host.hpp"
#include "common/log.hpp"
#include "supervisor/process.hpp"

#include <fmt/format.h>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ddp::shepherd {

namespace asio = boost::asio;

namespace {
// Frames we queue for the shepherd are small (a start, a stop); this only bounds a stuck one.
constexpr std::size_t kMaxQueued = 64u << 20;
// The shepherd's readers are killed at the budget (and reaped within a second); a coordinator
// waits 3 s past it (stacks_gather.hpp), so the agent's own word on a silent shepherd arrives first.
constexpr std::chrono::milliseconds kShepherdMargin{1500};
}  // namespace

Client::Client(asio::io_context& io, const std::string& exe, std::string job_id, const Starter& starter)
    : io_(io), job_id_(std::move(job_id)) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    throw ShepherdError(fmt::format("socketpair: {}", std::strerror(errno)));
  }
  supervisor::SpawnSpec spec;
  spec.argv = {exe, "shepherd", "--agent-pid", fmt::format("{}", ::getpid()), "--job", job_id_};
  spec.env = own_environment();
  spec.workdir = std::string(1, '/');  // (a plain "/" trips GCC 12 bug 105329, -Wrestrict)
  spec.capture_output = false;         // its log lines go where ours go
  spec.stdin_fd = sv[1];
  spec.die_with_parent = false;  // it outlives us long enough to kill the job's tree
  try {
    if (starter) {
      spec.argv.push_back("--in-unit");
      starter(spec.argv, sv[1]);
    } else {
      pid_ = supervisor::spawn(spec).pid;
    }
  } catch (const supervisor::SpawnError& e) {
    ::close(sv[0]);
    ::close(sv[1]);
    throw ShepherdError(fmt::format("cannot start the shepherd of job {}: {}", job_id_, e.what()));
  } catch (const ShepherdError&) {
    ::close(sv[0]);
    ::close(sv[1]);
    throw;
  }
  ::close(sv[1]);
  channel_ = Channel::make(io_, sv[0], Sender::shepherd, kMaxQueued);
  channel_->start({[this](const std::string& type, const nlohmann::json& m) { on_message(type, m); },
                   [this](const std::string& why) { lost(why); }});
  if (pid_ > 0) log::get("agent")->debug("job {}: shepherd pid {}", job_id_, pid_);
}

Client::~Client() {
  // The shepherd sees EOF, kills whatever of the job still runs, and exits; we reap it later.
  if (channel_) channel_->close("the job is over on this node");
  std::vector<std::uint64_t> ids;
  for (const auto& [id, p] : pending_stacks_) ids.push_back(id);
  for (auto id : ids) answer_stacks(id, {}, "the job is over on this node");
}

void Client::start(StartAttempt attempt, launch::GroupCallbacks cb) {
  if (running_) throw ShepherdError(fmt::format("job {}: attempt {} still runs", job_id_, attempt_.options.attempt));
  if (!channel_->open()) throw ShepherdError(fmt::format("job {}: the shepherd (pid {}) is gone", job_id_, pid_));
  if (!channel_->send(encode_start(attempt))) {
    throw ShepherdError(fmt::format("job {}: the attempt's plan is too large to hand to the shepherd", job_id_));
  }
  running_ = true;
  attempt_ = std::move(attempt);
  cb_ = std::move(cb);
  workers_.clear();
  first_failure_.reset();
}

void Client::request_stop(int signal, Millis interrupt_grace) {
  if (!running_) return;
  auto m = encode_signal("stop", signal);
  if (interrupt_grace.count() > 0) m["interrupt_ms"] = interrupt_grace.count();
  channel_->send(std::move(m));
}

void Client::kill_now() {
  if (running_) channel_->send(nlohmann::json{{"type", "kill"}});
}

void Client::forward(int signal) {
  if (running_) channel_->send(encode_signal("forward", signal));
}

struct Client::PendingStacks {
  explicit PendingStacks(asio::io_context& io) : timer(io) {}
  asio::steady_timer timer;
  StacksDone done;
};

// The shepherd answers within the budget (its readers are killed then); the margin covers the
// reply's way here. A shepherd that does not answer by then is said to, and its late answer dropped.
void Client::read_stacks(const launch::WorkerGroup::StacksQuery& q, StacksDone done) {
  if (!channel_->open()) {
    asio::post(io_, [done = std::move(done)] { done({}, "the node's shepherd is gone"); });
    return;
  }
  const auto id = next_stacks_id_++;
  auto p = std::make_shared<PendingStacks>(io_);
  p->done = std::move(done);
  pending_stacks_[id] = p;
  p->timer.expires_after(q.budget + kShepherdMargin);
  p->timer.async_wait([this, id, budget = q.budget](boost::system::error_code ec) {
    if (!ec)
      answer_stacks(id, {},
                    fmt::format("the shepherd did not answer within {} ms", (budget + kShepherdMargin).count()));
  });
  channel_->send(encode_stacks({id, q}));
}

void Client::answer_stacks(std::uint64_t id, std::vector<stacks::RankStacks> ranks, std::string error) {
  auto it = pending_stacks_.find(id);
  if (it == pending_stacks_.end()) return;  // late, after its deadline
  auto p = it->second;
  pending_stacks_.erase(it);
  p->timer.cancel();
  asio::post(io_, [p, ranks = std::move(ranks), error = std::move(error)]() mutable {
    p->done(std::move(ranks), std::move(error));
  });
}

void Client::on_message(const std::string& type, const nlohmann::json& m) {
  try {
    if (type == "stacks_read") {  // may come after the attempt ended
      auto r = decode_stacks_read(m);
      return answer_stacks(r.id, std::move(r.ranks), "");
    }
    if (!running_) throw MessageError(fmt::format("'{}' while no attempt runs", type));
    if (type == "started") {
      workers_ = decode_started(m);
      if (cb_.on_started) cb_.on_started(workers_);
    } else if (type == "line") {
      auto l = decode_line(m);
      if (cb_.on_line) cb_.on_line(l.rank, l.stream, l.data);
    } else if (type == "first_failure") {
      first_failure_ = decode_first_failure(m);
      if (cb_.on_first_failure) cb_.on_first_failure(*first_failure_);
    } else if (type == "finished") {
      finish(decode_finished(m));
    } else if (type == "progress") {
      auto p = decode_progress(m);
      if (on_progress_) on_progress_(p);
    }
  } catch (const MessageError& e) {
    channel_->close(fmt::format("bad '{}' from the shepherd: {}", type, e.what()));
  }
}

bool Client::on_reaped(pid_t pid, int status) {
  if (pid != pid_ || reaped_) return false;
  reaped_ = true;
  const auto how = WIFSIGNALED(status) ? fmt::format("killed by {}", supervisor::signal_name(WTERMSIG(status)))
                                       : fmt::format("exited with code {}", WEXITSTATUS(status));
  if (channel_->open())
    channel_->close(fmt::format("the shepherd (pid {}) {}", pid_, how));
  else
    log::get("agent")->debug("job {}: shepherd pid {} {}", job_id_, pid_, how);
  return true;
}

// The channel is closed: whatever the shepherd ran is being killed by it (or died with it).
void Client::lost(const std::string& why) {
  std::vector<std::uint64_t> ids;
  for (const auto& [id, p] : pending_stacks_) ids.push_back(id);
  for (auto id : ids) answer_stacks(id, {}, fmt::format("the node's shepherd was lost ({})", why));
  if (!running_) return;
  log::get("agent")->error("job {} attempt {}: lost the shepherd: {}", job_id_, attempt_.options.attempt, why);
  launch::AttemptReport r;
  r.attempt = attempt_.options.attempt;
  r.started = r.ended = std::chrono::system_clock::now();
  r.phase = launch::Phase::failed;
  r.log_dir = attempt_.attempt_dir;
  r.notes.push_back(fmt::format("the node's shepherd process was lost ({}); its workers were killed", why));
  for (const auto& rp : attempt_.plan.ranks) {
    launch::WorkerExit ex;
    if (first_failure_ && first_failure_->local_rank == rp.local_rank) {
      ex = *first_failure_;
    } else {
      ex.rank = rp.rank;
      ex.local_rank = rp.local_rank;
      const auto i = static_cast<std::size_t>(rp.local_rank);
      ex.pid = i < workers_.size() && workers_[i] > 0 ? workers_[i] : -1;
      ex.signal = SIGKILL;
      ex.when = r.ended;
    }
    r.exits.push_back(ex);
  }
  finish(std::move(r));
}

void Client::finish(launch::AttemptReport r) {
  running_ = false;
  workers_.clear();
  asio::post(io_, [cb = std::move(cb_.on_finished), r = std::move(r)] {
    if (cb) cb(r);
  });
  cb_ = {};
}

}  // namespace ddp::shepherd

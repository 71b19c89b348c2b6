// The shepherd process's loop. See shepherd.hpp for why it exists and messages.hpp for what it says.
#include "shepherd/shepherd.hpp"

#include "common/log.hpp"
#include "common/strings.hpp"
#include "container/runtime.hpp"
#include "hang/progress.hpp"
#include "launch/worker_group.hpp"
#include "shepherd/channel.hpp"
#include "supervisor/process.hpp"

#include <fmt/format.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>

#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ddp::shepherd {

namespace asio = boost::asio;

namespace {

// Output waiting for a slow agent beyond this is dropped (counted; the log files keep it).
constexpr std::size_t kMaxQueued = 64u << 20;
// After the agent is gone: the time the killed tree gets to be reaped and its pipes drained.
constexpr auto kAbandonDeadline = std::chrono::seconds(10);
// After a stop signal while the agent lives: what the agent's stop sequence gets beyond its own
// length before this process kills the job itself.
constexpr Millis kSignalMargin{5'000};

class Shepherd {
 public:
  explicit Shepherd(const ShepherdArgs& a)
      : args_(a),
        signals_(io_, SIGTERM, SIGINT, SIGHUP),
        sigchld_(io_, SIGCHLD),
        agent_(io_),
        deadline_(io_),
        signal_deadline_(io_),
        log_(log::get("shepherd")) {}

  int run() {
    supervisor::become_subreaper();
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, args_.agent_pid, 0));
    if (pidfd < 0) {
      log_->error("job {}: cannot watch the agent (pid {}): {}", args_.job_id, args_.agent_pid, std::strerror(errno));
      return 1;
    }
    agent_.assign(pidfd);
    // Opened after a possible exit of the agent: then our parent is no longer the agent. (In a
    // unit our parent is systemd; an agent gone already makes the pidfd readable at once, and
    // its end of the channel is closed.)
    if (!args_.in_unit && ::getppid() != args_.agent_pid) {
      log_->error("job {}: the agent (pid {}) is already gone", args_.job_id, args_.agent_pid);
      return 1;
    }
    agent_.async_wait(asio::posix::descriptor_base::wait_read, [this](boost::system::error_code ec) {
      if (!ec) abandon(fmt::format("the agent (pid {}) is gone", args_.agent_pid));
    });
    wait_signals();
    wait_sigchld();
    channel_ = Channel::make(io_, args_.fd, Sender::agent, kMaxQueued);
    channel_->start({[this](const std::string& type, const nlohmann::json& m) { on_message(type, m); },
                     [this](const std::string& why) { abandon(fmt::format("the agent's channel closed ({})", why)); }});
    io_.run();
    return exit_code_;
  }

 private:
  void on_message(const std::string& type, const nlohmann::json& m) {
    if (abandoning_) return;
    try {
      if (type == "start") return on_start(decode_start(m));
      if (type == "stacks") return on_stacks(decode_stacks(m));
      if (!group_) return;  // a stop or signal for an attempt that already ended
      if (type == "stop")
        group_->request_stop(decode_signal(m), decode_interrupt(m));
      else if (type == "kill")
        group_->kill_now();
      else if (type == "forward")
        group_->forward(decode_signal(m));
    } catch (const MessageError& e) {
      channel_->close(fmt::format("bad '{}' from the agent: {}", type, e.what()));
    }
  }

  void on_start(StartAttempt s) {
    // A stop signal reached this process during an earlier attempt (wait_signals): it was meant
    // for the whole job (systemd stopping the job's unit, SLURM cancelling the step).
    if (signalled_) throw MessageError("a stop signal reached the job's shepherd; it starts no further attempt");
    if (group_)
      throw MessageError(fmt::format("start of attempt {} while attempt {} runs", s.options.attempt, attempt_));
    attempt_ = s.options.attempt;
    dropped_ = 0;
    launch::GroupCallbacks cb;
    cb.on_line = [this](int rank, supervisor::Stream stream, const std::string& line) {
      if (!channel_->send(encode_line({rank, stream, line})) && dropped_++ == 0 && channel_->open()) {
        log_->warn("job {}: the agent reads too slowly; dropping output lines (the log files keep them)", args_.job_id);
      }
    };
    cb.on_first_failure = [this](const launch::WorkerExit& ex) { channel_->send(encode_first_failure(ex)); };
    cb.on_finished = [this](launch::AttemptReport r) { on_finished(std::move(r)); };
    reporter_.reset();
    if (s.options.hang_timeout.count() > 0) {
      reporter_.emplace(s.options.hang_timeout);
      cb.on_hang_round = [this](hang::RankProgress& p, hang::TimePoint now) { report_progress(p, now); };
    }
    if (!prepare_containers(s)) return;
    group_ = std::make_unique<launch::WorkerGroup>(io_, std::move(s.plan), s.attempt_dir, s.options, std::move(cb));
    stop_grace_ = s.options.stop_grace;
    if (watchdog_) group_->keep(watchdog_->pid());
    group_->start();
    std::vector<pid_t> pids;  // by local rank
    for (const auto& r : group_->rank_status()) pids.push_back(r.pid > 0 ? r.pid : 0);
    channel_->send(encode_started(pids));
  }

  // Read on a thread of the group's (collect.hpp); answered even when no attempt runs, so the
  // agent never waits for its deadline without need.
  void on_stacks(StacksRequest r) {
    auto reply = [ch = channel_, id = r.id](std::vector<stacks::RankStacks> ranks) {
      if (ch->open()) ch->send(encode_stacks_read({id, std::move(ranks)}));
    };
    if (!group_) return reply({});
    group_->read_stacks(r.query, reply);
  }

  // The hang watchdog on this node: the coordinator decides (it alone sees every node); it hears
  // when this node goes idle for half the timeout, with the node's stacks, and when it resumes.
  void report_progress(hang::RankProgress& p, hang::TimePoint now) {
    const auto idle = reporter_->update(p.watch(), now);
    if (!idle || !group_) return;
    Progress msg{*idle, {}};
    if (idle->count() > 0) {
      auto text = group_->hang_stacks_text();
      if (text.size() > kMaxProgressStacks) {
        text.resize(text.rfind('\n', kMaxProgressStacks - 32) + 1);
        text += "... (cut)\n";
      }
      msg.stacks = std::move(text);
    }
    log_->debug("job {}: no rank of this node progressed for {}", args_.job_id, format_duration(*idle));
    channel_->send(encode_progress(msg));
  }

  // A container attempt (the agent wrapped the plan, lib/container): env files, the watchdog and
  // the group's teardown are this process's, as the owner of the attempt's tree. False when the
  // attempt cannot start (reported to the agent as a finished, failed attempt).
  bool prepare_containers(StartAttempt& s) {
    const auto& r0 = s.plan.ranks.front();
    if (!r0.container) return true;
    const auto runtime = *jobspec::runtime_from_name(r0.container->runtime);
    const auto client_env = r0.env;
    try {
      container::write_env_files(s.plan, runtime);
      env_files_ = s.plan;
      container_names_ = container::container_names(s.plan);
      if (auto w = container::Watchdog::start(container::remove_argv(runtime, container_names_), client_env)) {
        watchdog_.emplace(std::move(*w));
      }
    } catch (const container::ContainerError& e) {
      log_->error("job {}: {}", args_.job_id, e.what());
      release_containers();
      launch::AttemptReport r;
      r.attempt = s.options.attempt;
      r.phase = launch::Phase::failed;
      r.notes.push_back(e.what());
      channel_->send(encode_finished(r));
      return false;
    }
    s.options.teardown = [this, runtime, client_env] {
      container::remove_containers(runtime, container_names_, client_env);
    };
    return true;
  }

  void release_containers() {
    if (env_files_) container::remove_env_files(*env_files_);
    env_files_.reset();
    watchdog_.reset();  // says "done": the group's teardown removed the containers
    container_names_.clear();
  }

  void on_finished(launch::AttemptReport r) {
    group_.reset();
    release_containers();
    if (dropped_)
      r.notes.push_back(fmt::format("{} output line(s) did not reach the agent (see the log files)", dropped_));
    channel_->send(encode_finished(r));
    signal_deadline_.cancel();  // the attempt ended in order after a stop signal (wait_signals)
    if (abandoning_) done();
  }

  // The agent is gone (or told us to go): nothing of the job may outlive us.
  void abandon(const std::string& why) {
    if (abandoning_) return;
    abandoning_ = true;
    boost::system::error_code ignored;
    agent_.close(ignored);
    if (!group_) return done();
    log_->warn("job {}: {}; killing the job's processes", args_.job_id, why);
    exit_code_ = 1;
    group_->request_stop(SIGKILL);  // what follows is a consequence, not a failure
    group_->kill_now();
    deadline_.expires_after(kAbandonDeadline);
    deadline_.async_wait([this](boost::system::error_code ec) {
      if (ec) return;
      log_->error("job {}: processes still not reaped after {} s; exiting anyway", args_.job_id,
                  kAbandonDeadline.count());
      done();
    });
  }

  // The last sweep (anything of ours, however it got here), then out.
  void done() {
    for (int round = 0; round < 50; ++round) {
      auto left = supervisor::descendants_of(::getpid());
      if (left.empty()) break;
      for (pid_t p : left) ::kill(p, SIGKILL);
      while (::waitpid(-1, nullptr, 0) > 0) {
      }
    }
    if (channel_) channel_->close("the shepherd is done");
    io_.stop();
  }

  // SLURM's scancel and time limit, and systemd's control-group kill, signal every process of
  // the job at once: the agent (which then stops the job in order, with the job's stop grace),
  // the ranks themselves, and this process. Abandoning here would SIGKILL the ranks while their
  // SIGTERM handlers write a checkpoint. So while the agent lives and an attempt runs, the stop
  // is the agent's; only if it has not ended the attempt within the whole stop sequence
  // (the stacks read, a Ctrl-C's SIGINT step, stop.grace, and a margin) do we kill the job here.
  void wait_signals() {
    signals_.async_wait([this](boost::system::error_code ec, int sig) {
      if (ec) return;
      const auto what = fmt::format("{} received", supervisor::signal_name(sig));
      if (group_ && channel_ && channel_->open() && !abandoning_ && !signalled_) {
        signalled_ = true;
        const auto wait = stop_grace_ + launch::interrupt_grace(stop_grace_) + launch::kStacksBudget + kSignalMargin;
        log_->warn(
            "job {}: {}; the agent (pid {}) stops the job; killing its processes here if the attempt has not "
            "ended within {}",
            args_.job_id, what, args_.agent_pid, format_duration(wait));
        signal_deadline_.expires_after(wait);
        signal_deadline_.async_wait([this, what](boost::system::error_code e) {
          if (!e && group_) abandon(fmt::format("{}, and the attempt has not ended", what));
        });
      } else {
        abandon(what);  // no attempt, the agent's link gone, or a second signal: kill now
      }
      wait_signals();
    });
  }

  void wait_sigchld() {
    sigchld_.async_wait([this](boost::system::error_code ec, int) {
      if (ec) return;
      launch::reap_children(group_.get());
      wait_sigchld();
    });
  }

  ShepherdArgs args_;
  asio::io_context io_;
  asio::signal_set signals_, sigchld_;
  asio::posix::stream_descriptor agent_;  // the agent's pidfd: readable once the agent has exited
  asio::steady_timer deadline_;
  asio::steady_timer signal_deadline_;  // a signal received while the agent lives (wait_signals)
  std::shared_ptr<spdlog::logger> log_;
  std::shared_ptr<Channel> channel_;
  std::optional<contract::Plan> env_files_;  // the attempt's plan, for its env files
  std::vector<std::string> container_names_;
  std::optional<container::Watchdog> watchdog_;
  std::unique_ptr<launch::WorkerGroup> group_;
  std::optional<hang::NodeReporter> reporter_;  // the attempt's, with a hang watchdog
  int attempt_ = 0;
  std::uint64_t dropped_ = 0;
  bool abandoning_ = false;
  bool signalled_ = false;     // a stop signal came while the agent lived (wait_signals)
  Millis stop_grace_{30'000};  // the running attempt's
  int exit_code_ = 0;
};

}  // namespace

std::optional<ShepherdArgs> parse_args(const std::vector<std::string>& args, std::string& error) {
  ShepherdArgs a;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const auto& k = args[i];
    if (k == "--in-unit") {
      a.in_unit = true;
      continue;
    }
    if (i + 1 >= args.size()) {
      error = fmt::format("'{}' needs a value", k);
      return std::nullopt;
    }
    const auto& v = args[++i];
    if (k == "--agent-pid") {
      auto n = parse_int(v);
      if (!n || *n < 1) {
        error = fmt::format("--agent-pid: '{}' is not a process id", v);
        return std::nullopt;
      }
      a.agent_pid = static_cast<pid_t>(*n);
    } else if (k == "--job") {
      a.job_id = v;
    } else {
      error = fmt::format("unknown option '{}'", k);
      return std::nullopt;
    }
  }
  if (a.agent_pid == 0 || a.job_id.empty()) {
    error = "--agent-pid and --job are required";
    return std::nullopt;
  }
  return a;
}

int run_shepherd(const ShepherdArgs& args) {
  // Our stdout is the agent's, which may be its protocol link (`ddp-agentd --stdio` under SSH):
  // nothing of ours may ever write there, and holding it must not keep that link open.
  ::dup2(STDERR_FILENO, STDOUT_FILENO);
  // What no handler expects (a thread that cannot start: std::system_error) ends the job here,
  // said, rather than aborting: unwinding drops the running group, which kills its tree.
  try {
    Shepherd s(args);
    return s.run();
  } catch (const std::exception& e) {
    log::get("shepherd")->error("job {}: the shepherd failed, so its workers were killed: {}", args.job_id, e.what());
    return 1;
  }
}

}  // namespace ddp::shepherd

#include "launch/local_launcher.hpp"

#include "common/log.hpp"
#include "common/strings.hpp"
#include "launch/attempt.hpp"
#include "launch/report.hpp"
#include "supervisor/cgroup.hpp"
#include "supervisor/output.hpp"
#include "supervisor/process.hpp"

#include <boost/asio.hpp>
#include <fmt/format.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

extern char** environ;

namespace ddp::launch {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using supervisor::LastLines;
using supervisor::LineSplitter;
using supervisor::RankLogFile;
using supervisor::Stream;

namespace {

contract::Env current_environment() {
  contract::Env env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string_view::npos) env.emplace(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
  }
  return env;
}

std::string make_job_id(const std::string& name) {
  auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  ::localtime_r(&now, &tm);
  std::random_device rd;
  return fmt::format("{}-{:04}{:02}{:02}-{:02}{:02}{:02}-{:04x}", name, tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                     tm.tm_hour, tm.tm_min, tm.tm_sec, rd() & 0xffff);
}

std::string hostname() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
}

// MASTER_PORT must be free before any worker starts: a clash found by rank 0 minutes later,
// inside init_process_group, is the classic 3 a.m. puzzle. Port 0 asks for a free port.
std::uint16_t check_port(const std::string& addr, std::uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw LaunchError(fmt::format("socket: {}", std::strerror(errno)));
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  ::inet_pton(AF_INET, addr.c_str(), &sa.sin_addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || ::listen(fd, 1) != 0) {
    int e = errno;
    ::close(fd);
    throw LaunchError(fmt::format(
        "MASTER_PORT {} on {} is not available ({}): another job, a leftover worker or torchrun holds it. "
        "Set store.port in the job file (0 picks a free port) or pass --master-port",
        port, addr, std::strerror(e)));
  }
  socklen_t len = sizeof sa;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  ::close(fd);
  return ntohs(sa.sin_port);
}

}  // namespace

contract::NodeContext resolve_node_context(LaunchOptions& opts, int attempt) {
  auto& spec = opts.spec;
  if (spec.nproc.kind == jobspec::Nproc::Kind::cpu) {
    spec.nproc = {jobspec::Nproc::Kind::count, usable_cpus()};
  } else if (spec.nproc.kind == jobspec::Nproc::Kind::gpu) {
    throw LaunchError("nproc_per_node: gpu is not supported yet (it arrives with node facts discovery)");
  }
  std::error_code ec;
  const fs::path cwd = fs::current_path();
  fs::path workdir = spec.workdir ? fs::path(*spec.workdir) : cwd;
  if (workdir.is_relative()) workdir = cwd / workdir;
  workdir = workdir.lexically_normal();
  if (!fs::is_directory(workdir, ec)) {
    throw LaunchError(fmt::format("workdir {} is not a directory{}", workdir.string(),
                                  spec.workdir ? fmt::format(" (from {})", spec.file) : ""));
  }
  spec.workdir = workdir.string();
  fs::path logs = spec.log_dir;
  if (logs.is_relative()) logs = cwd / logs;
  spec.log_dir = logs.lexically_normal().string();
  if (opts.job_id.empty()) opts.job_id = make_job_id(spec.name);

  contract::NodeContext node;
  node.job_id = opts.job_id;
  node.node_name = hostname();
  node.local_world_size = spec.nproc.count;
  node.world_size = spec.nproc.count;
  node.master_addr = "127.0.0.1";
  node.master_port = spec.store_port;
  node.restart_count = attempt;
  node.use_agent_store = false;  // until ddpctl serves the store itself, rank 0 hosts it
  node.attempt_dir = fmt::format("{}/{}/attempt-{}", spec.log_dir, opts.job_id, attempt);
  return node;
}

nlohmann::json dry_run(LaunchOptions opts) {
  auto node = resolve_node_context(opts, 0);
  return contract::to_json(contract::make_plan(opts.spec, node, current_environment()));
}

namespace {

// One captured pipe of one worker. Shared with its pending read, so an attempt can end (and
// its workers be dropped) while a cancelled read is still on its way back.
struct PipeReader : std::enable_shared_from_this<PipeReader> {
  PipeReader(asio::io_context& io, int fd, Stream s) : sd(io, fd), stream(s) {}
  asio::posix::stream_descriptor sd;
  Stream stream;
  LineSplitter splitter;
  std::array<char, 64 * 1024> buf{};
  bool open = true;
};

struct Worker {
  contract::RankPlan plan;
  pid_t pid = -1;
  bool reaped = false;
  std::shared_ptr<PipeReader> out, err;
  LastLines last{20};
  std::unique_ptr<RankLogFile> log;
};

class LocalLauncher {
 public:
  explicit LocalLauncher(LaunchOptions opts)
      : opts_(std::move(opts)),
        signals_(io_, SIGINT, SIGTERM, SIGHUP),
        user_signals_(io_, SIGUSR1, SIGUSR2),
        sigchld_(io_, SIGCHLD),
        grace_timer_(io_),
        backoff_timer_(io_),
        drain_timer_(io_),
        log_(log::get("launch")) {}

  int run() {
    // Resolve everything that can be wrong before a single worker starts.
    contract::NodeContext node = resolve_node_context(opts_, 0);
    node.master_port = check_port(node.master_addr, node.master_port);
    opts_.spec.store_port = node.master_port;
    auto first = contract::make_plan(opts_.spec, node, inherited_);
    const auto& r0 = first.ranks.at(0);
    auto path = r0.env.count("PATH") ? r0.env.at("PATH") : "";
    if (!supervisor::resolve_executable(r0.argv.at(0), path, *opts_.spec.workdir)) {
      throw LaunchError(fmt::format("cannot run '{}': no such executable (PATH={}, workdir={})", r0.argv.at(0), path,
                                    *opts_.spec.workdir));
    }
    report_.job_id = opts_.job_id;
    supervisor::become_subreaper();
    supervisor::Cgroup::sweep_stale();

    wait_signals();
    wait_user_signals();
    wait_sigchld();
    log_->info("job {}: {} worker{} of '{}', logs in {}/{}", opts_.job_id, first.ranks.size(),
               first.ranks.size() == 1 ? "" : "s", join(r0.argv, " "), opts_.spec.log_dir, opts_.job_id);
    start_attempt(0);
    io_.run();
    terminal_.flush();

    if (opts_.result_json) {
      std::ofstream out(*opts_.result_json);
      out << to_json(report_).dump(2) << "\n";
      if (!out) log_->error("cannot write the result file {}", *opts_.result_json);
    }
    return report_.exit_code;
  }

 private:
  // ---- attempts -------------------------------------------------------------------------
  void start_attempt(int attempt) {
    attempt_ = attempt;
    auto node = resolve_node_context(opts_, attempt);
    node.master_port = opts_.spec.store_port;
    auto plan = contract::make_plan(opts_.spec, node, inherited_);
    attempt_report_ = AttemptReport{};
    attempt_report_.attempt = attempt;
    attempt_report_.started = std::chrono::system_clock::now();
    attempt_report_.log_dir = node.attempt_dir;
    std::error_code ec;
    fs::create_directories(node.attempt_dir, ec);
    if (ec) throw LaunchError(fmt::format("cannot create the log directory {}: {}", node.attempt_dir, ec.message()));

    tracker_.emplace(static_cast<int>(plan.ranks.size()));
    cgroup_.reset();
    if (auto cg = supervisor::Cgroup::create(fmt::format("a{}", attempt))) cgroup_.emplace(std::move(*cg));
    cleanup_started_ = false;
    drain_started_ = false;
    workers_.clear();
    for (auto& rp : plan.ranks) {
      auto w = std::make_unique<Worker>();
      w->log = std::make_unique<RankLogFile>(rp.log_file, opts_.spec.log_max_bytes);
      w->plan = std::move(rp);
      workers_.push_back(std::move(w));
    }
    for (auto& w : workers_) {
      if (tracker_->phase() == Phase::running) {
        spawn_worker(*w);
        continue;
      }
      // An earlier rank could not start (or a stop came in): this one never runs.
      w->reaped = true;
      WorkerExit ex{w->plan.rank, w->plan.local_rank, -1, 0, 0, std::chrono::system_clock::now()};
      ex.started = false;
      tracker_->on_exit(ex);
    }
    maybe_finish_attempt();
  }

  void spawn_worker(Worker& w) {
    supervisor::SpawnSpec s;
    s.argv = w.plan.argv;
    s.env = w.plan.env;
    s.workdir = *opts_.spec.workdir;
    s.cgroup_procs_fd = cgroup_ ? cgroup_->procs_fd() : -1;
    try {
      auto sp = supervisor::spawn(s);
      w.pid = sp.pid;
      w.out = std::make_shared<PipeReader>(io_, sp.stdout_fd, Stream::out);
      w.err = std::make_shared<PipeReader>(io_, sp.stderr_fd, Stream::err);
      read_pipe(w, w.out);
      read_pipe(w, w.err);
      w.log->note(fmt::format("started pid {} (attempt {}): {}", sp.pid, attempt_, join(w.plan.argv, " ")));
      log_->debug("rank {} started as pid {}", w.plan.rank, sp.pid);
    } catch (const supervisor::SpawnError& e) {
      // The child (if any) exits 127 and is reaped as a stranger; the rank counts as failed.
      w.reaped = true;
      w.last.add(e.what());
      w.log->note(e.what());
      WorkerExit ex{w.plan.rank, w.plan.local_rank, -1, 127, 0, std::chrono::system_clock::now()};
      on_worker_exit(w, ex);
    }
  }

  void read_pipe(Worker& w, const std::shared_ptr<PipeReader>& p) {
    Worker* wp = &w;
    p->sd.async_read_some(asio::buffer(p->buf), [this, wp, p](boost::system::error_code ec, std::size_t n) {
      if (!p->open) return;
      if (!ec) {
        for (auto& line : p->splitter.feed(std::string_view(p->buf.data(), n))) emit_line(*wp, p->stream, std::move(line));
        read_pipe(*wp, p);
        return;
      }
      for (auto& line : p->splitter.finish()) emit_line(*wp, p->stream, std::move(line));
      close_pipe(*p);
      maybe_finish_attempt();
    });
  }

  void close_pipe(PipeReader& p) {
    if (!p.open) return;
    p.open = false;
    boost::system::error_code ignored;
    p.sd.close(ignored);
  }

  void emit_line(Worker& w, Stream s, std::string line) {
    w.log->write(s, line);
    if (!opts_.quiet && (opts_.show_ranks.empty() || opts_.show_ranks.contains(w.plan.rank))) {
      terminal_.write(s, fmt::format("[{}] {}", w.plan.rank, line));
    }
    w.last.add(std::move(line));
  }

  bool pipes_open() const {
    for (const auto& w : workers_) {
      if ((w->out && w->out->open) || (w->err && w->err->open)) return true;
    }
    return false;
  }

  // ---- exits and stops --------------------------------------------------------------------
  void wait_sigchld() {
    sigchld_.async_wait([this](boost::system::error_code ec, int) {
      if (ec || done_) return;
      reap();
      if (!done_) wait_sigchld();
    });
  }

  void reap() {
    while (true) {
      int status = 0;
      pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      auto now = std::chrono::system_clock::now();
      for (auto& w : workers_) {
        if (w->pid != pid || w->reaped) continue;
        w->reaped = true;
        WorkerExit ex{w->plan.rank, w->plan.local_rank, pid, 0, 0, now};
        if (WIFSIGNALED(status)) ex.signal = WTERMSIG(status);
        else ex.exit_code = WEXITSTATUS(status);
        w->log->note(ex.describe());
        on_worker_exit(*w, ex);
      }
      // Anything else was an orphan that re-parented to us (we are its subreaper): reaped, done.
    }
    maybe_finish_attempt();
  }

  void on_worker_exit(Worker& w, const WorkerExit& ex) {
    log_->debug("rank {} (pid {}) {}", w.plan.rank, ex.pid, ex.describe());
    if (tracker_->on_exit(ex) == Decision::stop_all) {
      log_->error("rank {} {}; stopping the other ranks", ex.rank, ex.describe());
      stop_workers();
    }
  }

  void stop_workers() {
    signal_everything(SIGTERM);
    grace_timer_.expires_after(opts_.spec.stop_grace);
    grace_timer_.async_wait([this](boost::system::error_code ec) {
      if (ec) return;
      auto left = live_processes();
      if (!left.empty()) log_->warn("{} process(es) still running after the {} grace period: SIGKILL", left.size(),
                                    format_duration(opts_.spec.stop_grace));
      signal_everything(SIGKILL);
    });
  }

  std::vector<pid_t> live_processes() const {
    auto d = supervisor::descendants_of(::getpid());
    return d;
  }

  // The worker itself, its process group, its cgroup and every descendant we are subreaper of:
  // a grandchild that called setsid() escapes the group but not the other two.
  void signal_everything(int sig) {
    for (const auto& w : workers_) {
      if (w->pid > 0 && !w->reaped) {
        ::kill(-w->pid, sig);
        ::kill(w->pid, sig);
      }
    }
    if (cgroup_) {
      if (sig == SIGKILL) cgroup_->kill_all();
      else cgroup_->signal_all(sig);
    }
    for (pid_t p : supervisor::descendants_of(::getpid())) ::kill(p, sig);
  }

  void maybe_finish_attempt() {
    if (!tracker_ || !tracker_->finished()) return;
    for (const auto& w : workers_) {
      if (w->pid > 0 && !w->reaped) return;
    }
    // Every rank is gone. Anything still running (an orphaned grandchild, a daemonized helper)
    // is stopped the same way, so that nothing outlives the attempt.
    if (!supervisor::descendants_of(::getpid()).empty()) {
      if (!cleanup_started_) {
        cleanup_started_ = true;
        log_->info("stopping processes the workers left behind");
        stop_workers();
      }
      return;
    }
    // Every writer is gone, so the pipes are at EOF; give the reads a moment to drain.
    if (pipes_open()) {
      if (!drain_started_) {
        drain_started_ = true;
        drain_timer_.expires_after(std::chrono::seconds(2));
        drain_timer_.async_wait([this](boost::system::error_code ec) {
          if (ec) return;
          for (auto& w : workers_) {
            if (w->out) close_pipe(*w->out);
            if (w->err) close_pipe(*w->err);
          }
          maybe_finish_attempt();
        });
      }
      return;
    }
    finish_attempt();
  }

  void finish_attempt() {
    grace_timer_.cancel();
    drain_timer_.cancel();
    cgroup_.reset();
    auto phase = tracker_->phase();
    attempt_report_.ended = std::chrono::system_clock::now();
    attempt_report_.phase = phase;
    for (const auto& e : tracker_->exits()) {
      if (e) attempt_report_.exits.push_back(*e);
    }
    if (const auto& ff = tracker_->first_failure()) {
      auto& w = *workers_.at(static_cast<std::size_t>(ff->rank));
      RankFailure f{*ff, w.plan.node, w.last.lines(), read_error_file(w.plan.error_file), w.plan.log_file};
      attempt_report_.first_failure = f;
    }
    report_.attempts.push_back(attempt_report_);
    tracker_.reset();
    terminal_.flush();

    if (phase == Phase::succeeded) {
      report_.status = "succeeded";
      report_.exit_code = 0;
      log_->info("job {} succeeded{}", opts_.job_id,
                 attempt_ ? fmt::format(" after {} restart{}", attempt_, attempt_ == 1 ? "" : "s") : "");
      return done();
    }
    std::fputs(format_attempt(attempt_report_, opts_.spec.max_restarts).c_str(), stderr);
    if (stop_signal_) {
      report_.status = "stopped";
      report_.exit_code = 128 + stop_signal_;
      log_->warn("job {} stopped by {}", opts_.job_id, supervisor::signal_name(stop_signal_));
      return done();
    }
    if (attempt_ < opts_.spec.max_restarts) {
      report_.restarts = attempt_ + 1;
      log_->warn("restarting the job in {} (restart {} of {})", format_duration(opts_.spec.restart_backoff), attempt_ + 1,
                 opts_.spec.max_restarts);
      backoff_timer_.expires_after(opts_.spec.restart_backoff);
      backoff_timer_.async_wait([this](boost::system::error_code ec) {
        if (ec || stop_signal_) return;
        start_attempt(attempt_ + 1);
      });
      return;
    }
    report_.status = "failed";
    report_.exit_code = 1;
    log_->error("job {} failed{}", opts_.job_id,
                opts_.spec.max_restarts ? fmt::format(" after {} restarts", opts_.spec.max_restarts) : "");
    done();
  }

  void done() {
    done_ = true;
    boost::system::error_code ignored;
    signals_.cancel(ignored);
    user_signals_.cancel(ignored);
    sigchld_.cancel(ignored);
    backoff_timer_.cancel();
  }

  // ---- signals to ddpctl -------------------------------------------------------------------
  void wait_signals() {
    signals_.async_wait([this](boost::system::error_code ec, int sig) {
      if (ec) return;
      if (stop_signal_) {
        log_->warn("{} again: killing every worker now", supervisor::signal_name(sig));
        signal_everything(SIGKILL);
      } else {
        stop_signal_ = sig;
        log_->warn("{}: stopping the job (SIGTERM, then SIGKILL after {}; again to kill now)",
                   supervisor::signal_name(sig), format_duration(opts_.spec.stop_grace));
        if (tracker_) {
          if (tracker_->on_stop_requested(sig) == Decision::stop_all) stop_workers();
        } else {
          // Between attempts (backoff): nothing runs; end here.
          backoff_timer_.cancel();
          report_.status = "stopped";
          report_.exit_code = 128 + sig;
          done();
          return;
        }
      }
      if (!done_) wait_signals();
    });
  }

  void wait_user_signals() {
    user_signals_.async_wait([this](boost::system::error_code ec, int sig) {
      if (ec) return;
      // Schedulers warn of preemption with SIGUSR1/2: pass it on as it is, to every worker.
      log_->info("{}: passing it to the workers", supervisor::signal_name(sig));
      for (const auto& w : workers_) {
        if (w->pid > 0 && !w->reaped) ::kill(w->pid, sig);
      }
      if (!done_) wait_user_signals();
    });
  }

  LaunchOptions opts_;
  contract::Env inherited_ = current_environment();
  asio::io_context io_;
  asio::signal_set signals_, user_signals_, sigchld_;
  asio::steady_timer grace_timer_, backoff_timer_, drain_timer_;
  supervisor::TerminalSink terminal_;
  std::shared_ptr<spdlog::logger> log_;

  int attempt_ = 0;
  std::optional<AttemptTracker> tracker_;
  std::optional<supervisor::Cgroup> cgroup_;
  std::vector<std::unique_ptr<Worker>> workers_;
  bool cleanup_started_ = false;
  bool drain_started_ = false;
  int stop_signal_ = 0;
  bool done_ = false;
  AttemptReport attempt_report_;
  JobReport report_;
};

}  // namespace

int run_local(LaunchOptions opts) {
  LocalLauncher launcher(std::move(opts));
  return launcher.run();
}

}  // namespace ddp::launch

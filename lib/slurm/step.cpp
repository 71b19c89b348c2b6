// The srun job step behind `ddpctl launch --slurm`. See step.hpp.
#include "slurm/step.hpp"

#include "common/log.hpp"
#include "common/strings.hpp"
#include "common/text.hpp"
#include "hostlist/hostlist.hpp"
#include "net/connection.hpp"
#include "supervisor/process.hpp"

#include <fmt/format.h>
#include <boost/asio.hpp>

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace ddp::slurm {

namespace asio = boost::asio;

namespace {

std::shared_ptr<spdlog::logger> logger() {
  static const auto log = log::get("slurm");
  return log;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exit status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("killed by signal {}", WTERMSIG(status));
  return "ended";
}

std::string plain_address(const asio::ip::address& addr) {
  auto a = addr;
  if (a.is_v6() && a.to_v6().is_v4_mapped()) a = asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6());
  return a.to_string();
}

}  // namespace

StepDialer::StepDialer(asio::io_context& io, StepDialerOptions options)
    : io_(io), opts_(std::move(options)), out_(io), err_(io) {
  const auto& nodes = opts_.step.nodes;
  for (std::size_t i = 0; i < nodes.size(); ++i) task_of_.emplace(nodes[i], static_cast<int>(i));
  ports_.resize(nodes.size());
  pending_.resize(nodes.size());
  dialled_.resize(nodes.size());

  supervisor::SpawnSpec spec;
  spec.argv = srun_argv(opts_.step);
  spec.env = opts_.env;
  spec.env[kSecretEnv] = opts_.secret;
  spec.workdir = opts_.workdir;
  spec.parent_death_signal = SIGTERM;  // srun passes it on to the agents (see step.hpp)
  logger()->info("starting the agents: {}", join(spec.argv, " "));
  supervisor::Spawned s;
  try {
    s = supervisor::spawn(spec);
  } catch (const supervisor::SpawnError& e) {
    throw SlurmError(fmt::format("--slurm: cannot start the agents' job step: {}", e.what()));
  }
  pid_ = s.pid;
  out_.assign(s.stdout_fd);
  err_.assign(s.stderr_fd);
  read_stdout();
  read_stderr();
}

StepDialer::~StepDialer() {
  boost::system::error_code ignored;
  out_.close(ignored);
  err_.close(ignored);
  if (status_) return;
  // The coordinator has closed every link: one-shot agents with nothing running exit at once.
  if (wait_exit(Millis(5000))) return;
  logger()->warn("the agents' step (srun pid {}) is still running; sending it SIGTERM", pid_);
  ::kill(pid_, SIGTERM);
  if (wait_exit(opts_.stop_grace + Millis(5000))) return;
  logger()->warn("srun pid {} ignored SIGTERM; killing it", pid_);
  ::kill(pid_, SIGKILL);
  wait_exit(Millis(60000));
}

bool StepDialer::wait_exit(Millis timeout) {
  auto reaped = [this] {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r != pid_ && !(r < 0 && errno == ECHILD)) return false;
    status_ = r == pid_ ? status : 0;
    logger()->debug("srun ended: {}", describe_status(*status_));
    return true;
  };
  if (reaped()) return true;
  // Woken by srun's exit itself: a pidfd is readable once the process ends (Linux 5.3+).
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const auto left = std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
    if (pidfd >= 0) {
      pollfd p{pidfd, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(std::max<Millis::rep>(left.count(), 0))) < 0 && errno == EINTR) continue;
    } else {
      std::this_thread::sleep_for(std::min<Millis>(std::max(left, Millis(0)), Millis(20)));  // an old kernel
    }
    if (reaped()) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      if (pidfd >= 0) ::close(pidfd);
      return false;
    }
  }
  if (pidfd >= 0) ::close(pidfd);
  return true;
}

std::string StepDialer::node_of(int task) const {
  return task >= 0 && static_cast<std::size_t>(task) < opts_.step.nodes.size() ? opts_.step.nodes[task]
                                                                               : fmt::format("task {}", task);
}

void StepDialer::read_stdout() {
  asio::async_read_until(out_, out_buf_, '\n', [this](boost::system::error_code ec, std::size_t n) {
    if (ec == asio::error::operation_aborted) return;
    if (ec && ec != asio::error::not_found) return on_srun_gone();
    // not_found: the buffer is full without a newline; take what it holds as one piece.
    const std::size_t len = ec ? out_buf_.size() : n - 1;
    std::string line(asio::buffers_begin(out_buf_.data()), asio::buffers_begin(out_buf_.data()) + len);
    out_buf_.consume(ec ? len : n);
    if (auto a = parse_announce(line); a && static_cast<std::size_t>(a->task) < ports_.size()) {
      if (!ports_[a->task]) {
        logger()->debug("{}: agent listening on port {}", node_of(a->task), a->port);
        ports_[a->task] = a->port;
        if (auto done = std::exchange(pending_[a->task], nullptr)) connect(a->task, std::move(done));
      }
    } else {
      // The agents write nothing else on stdout (their logs go to stderr): show it, do not parse it.
      logger()->info("srun stdout| {}", clean_text(line, kMaxLine, "\t"));
    }
    read_stdout();
  });
}

void StepDialer::read_stderr() {
  asio::async_read_until(err_, err_buf_, '\n', [this](boost::system::error_code ec, std::size_t n) {
    if (ec && ec != asio::error::not_found) return;
    const std::size_t len = ec ? err_buf_.size() : n - 1;  // as in read_stdout
    std::string line(asio::buffers_begin(err_buf_.data()), asio::buffers_begin(err_buf_.data()) + len);
    err_buf_.consume(ec ? len : n);
    auto l = split_label(line);
    // What the step writes reaches the user's terminal: shown clean (an agent's text by
    // relay_line), so no process of the step, or anyone who can write to it, puts escape
    // sequences or forged log lines there.
    if (!l.task) {
      logger()->warn("srun| {}", clean_text(line, kMaxLine, "\t"));  // srun's own message ("srun: error: ...")
    } else {
      // An agent's log line, at its own level (info and debug only with -v / DDP_LOG_LEVEL=debug).
      const auto r = log::relay_line(l.text);
      using L = log::RelayedLine::Level;
      const auto level = r.level == L::debug || r.level == L::info ? spdlog::level::debug
                         : r.level == L::warn                      ? spdlog::level::warn
                                                                   : spdlog::level::err;
      logger()->log(level, "{}| {}", node_of(*l.task), r.text);
    }
    read_stderr();
  });
}

void StepDialer::on_srun_gone() {
  stdout_open_ = false;
  // stdout closes when srun exits; give it a moment to be reapable, for its status.
  wait_exit(Millis(1000));
  gone_ = status_ ? fmt::format("srun ended ({})", describe_status(*status_)) : "srun closed its output";
  logger()->log(status_ && *status_ == 0 ? spdlog::level::debug : spdlog::level::warn, "the agents' step: {}", gone_);
  std::vector<std::string> silent;
  for (std::size_t t = 0; t < ports_.size(); ++t) {
    if (!ports_[t]) silent.push_back(node_of(static_cast<int>(t)));
  }
  if (!silent.empty()) {
    gone_ = fmt::format("{} before the agent{} on {} announced {} (srun's messages are above)", gone_,
                        silent.size() == 1 ? "" : "s", hostlist::compress(silent),
                        silent.size() == 1 ? "itself" : "themselves");
  }
  for (std::size_t t = 0; t < pending_.size(); ++t) {
    if (auto done = std::exchange(pending_[t], nullptr)) {
      net::Dialed d;
      d.error = fmt::format("{}: {}", node_of(static_cast<int>(t)), gone_);
      done(std::move(d));
    }
  }
}

void StepDialer::dial(const net::NodeEntry& node, std::function<void(net::Dialed)> done) {
  auto fail = [&](std::string why) {
    net::Dialed d;
    d.error = std::move(why);
    asio::post(io_, [done = std::move(done), d = std::move(d)]() mutable { done(std::move(d)); });
  };
  auto it = task_of_.find(node.name);
  if (it == task_of_.end()) return fail(fmt::format("{}: not a node of the agents' step", node.name));
  const int task = it->second;
  if (dialled_[task]) {
    // A one-shot agent serves one connection; srun does not start another one.
    return fail(fmt::format("{}: its one-shot agent's connection is over; it is not started again", node.name));
  }
  if (ports_[task]) return connect(task, std::move(done));
  if (!stdout_open_) return fail(fmt::format("{}: {}", node.name, gone_));
  pending_[task] = std::move(done);
}

void StepDialer::connect(int task, std::function<void(net::Dialed)> done) {
  dialled_[task] = true;
  const auto node = node_of(task);
  const auto port = *ports_[task];
  net::dial(io_, node, port, opts_.dial_timeout,
            [node, port, done = std::move(done)](boost::system::error_code ec, net::tcp::socket s) {
              net::Dialed d;
              if (ec) {
                d.error = fmt::format("{}: cannot reach its agent on port {}: {}", node, port, ec.message());
                return done(std::move(d));
              }
              boost::system::error_code ignored;
              d.address = plain_address(s.remote_endpoint(ignored).address());
              d.socket.emplace(std::move(s));
              done(std::move(d));
            });
}

std::string StepDialer::describe(const net::NodeEntry& node) const {
  auto it = task_of_.find(node.name);
  return it == task_of_.end() ? node.name : fmt::format("{} (srun task {})", node.name, it->second);
}

}  // namespace ddp::slurm

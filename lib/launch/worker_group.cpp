#include "launch/worker_group.hpp"

#include "common/log.hpp"
#include "common/strings.hpp"
#include "supervisor/process.hpp"

#include <fmt/format.h>
#include <algorithm>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

namespace ddp::launch {

namespace asio = boost::asio;
using supervisor::Stream;

// One captured pipe of one worker. Shared with its pending read, so the group can end while a
// cancelled read is still on its way back.
struct WorkerGroup::PipeReader {
  PipeReader(asio::io_context& io, int fd, Stream s) : sd(io, fd), stream(s) {}
  asio::posix::stream_descriptor sd;
  Stream stream;
  supervisor::LineSplitter splitter;
  // Left unzeroed: a zeroed 64 KiB per pipe was a memset and 16 page faults for each of a
  // launch's 2N pipes, where a read touches only the pages it fills.
  std::array<char, 64 * 1024> buf;
  bool open = true;
};

struct WorkerGroup::Worker {
  contract::RankPlan plan;
  pid_t pid = -1;
  bool reaped = false;
  std::shared_ptr<PipeReader> out, err;
  supervisor::LastLines last{20};
  std::unique_ptr<supervisor::RankLogFile> log;
};

WorkerGroup::WorkerGroup(asio::io_context& io, contract::Plan plan, std::string attempt_dir, GroupOptions opts,
                         GroupCallbacks cb)
    : io_(io),
      plan_(std::move(plan)),
      attempt_dir_(std::move(attempt_dir)),
      opts_(std::move(opts)),
      cb_(std::move(cb)),
      tracker_(static_cast<int>(plan_.ranks.size())),
      grace_timer_(io),
      drain_timer_(io) {}

WorkerGroup::~WorkerGroup() {
  // An owner that drops a running group (an exception, a lost coordinator) still kills the tree.
  if (!finished_) signal_everything(SIGKILL);  // (teardown included)
  // This process is not gone: it killed the tree itself, and leaves no guardian's record of a
  // launcher that died.
  if (guardian_) guardian_->done();
  if (predecessor_) predecessor_->done();
  for (auto& w : workers_) {
    if (w->out) close_pipe(*w->out);
    if (w->err) close_pipe(*w->err);
  }
}

void WorkerGroup::succeed(supervisor::Guardian predecessor) {
  keep(predecessor.pid());  // not a stray of the workers' until it has exited
  predecessor_.emplace(std::move(predecessor));
}

std::optional<supervisor::Guardian> WorkerGroup::take_guardian() {
  std::optional<supervisor::Guardian> out;
  auto& g = guardian_ ? guardian_ : predecessor_;  // the word's holder
  if (!finished_ || !opts_.last_word || !g) return out;
  out.emplace(std::move(*g));
  g.reset();
  return out;
}

std::vector<WorkerGroup::RankStatus> WorkerGroup::rank_status() const {
  std::vector<RankStatus> out;
  const auto& exits = tracker_.exits();
  for (const auto& w : workers_) {
    RankStatus s{w->plan.rank, w->plan.local_rank, w->pid, w->pid > 0 && !w->reaped, std::nullopt};
    const auto i = static_cast<std::size_t>(w->plan.local_rank);
    if (i < exits.size()) s.exit = exits[i];
    out.push_back(s);
  }
  return out;
}

std::vector<pid_t> WorkerGroup::worker_pids() const {
  std::vector<pid_t> out;
  for (const auto& w : workers_) {
    if (w->pid > 0 && !w->reaped) out.push_back(w->pid);
  }
  return out;
}

void WorkerGroup::start() {
  report_.attempt = opts_.attempt;
  report_.started = std::chrono::system_clock::now();
  report_.log_dir = attempt_dir_;
  if (auto cg = supervisor::Cgroup::create(fmt::format("a{}", opts_.attempt))) cgroup_.emplace(std::move(*cg));
  open_attempt_dir();
  std::optional<std::pair<uid_t, gid_t>> owner;
  if (opts_.run_as) owner.emplace(opts_.run_as->uid, opts_.run_as->gid);
  for (auto& rp : plan_.ranks) {
    auto w = std::make_unique<Worker>();
    w->plan = rp;
    if (dir_) {
      // An earlier run's error file (same --job-id, in a launcher's own folder) must not explain this one.
      if (auto name = name_in_attempt_dir(rp.error_file)) safefs::remove_in(*dir_, *name);
      if (auto name = name_in_attempt_dir(rp.log_file)) {
        w->log = std::make_unique<supervisor::RankLogFile>(dir_, *name, opts_.log_max_bytes, owner);
      }
    }
    if (!w->log) w->log = std::make_unique<supervisor::RankLogFile>(nullptr, rp.log_file, opts_.log_max_bytes, owner);
    workers_.push_back(std::move(w));
  }
  // Fork every rank first, then collect their exec reports: the execs overlap.
  std::vector<std::optional<supervisor::PendingSpawn>> pending(workers_.size());
  for (std::size_t i = 0; i < workers_.size(); ++i) {
    auto& w = *workers_[i];
    if (!w.log->error().empty()) {
      // No rank runs without its log: its output would go nowhere, and a log that cannot be
      // opened safely is a job tampering with its folder.
      spawn_failed(w, fmt::format("rank {} not started: cannot write its log file {}: {}", w.plan.rank, w.log->path(),
                                  dir_error_.empty() ? w.log->error() : dir_error_));
      continue;
    }
    try {
      pending[i].emplace(supervisor::spawn_start(spawn_spec(w)));
    } catch (const supervisor::SpawnError& e) {
      spawn_failed(w, e.what());
      break;  // cannot fork: the machine is out of something; stop here
    }
  }
  for (std::size_t i = 0; i < workers_.size(); ++i) {
    auto& w = *workers_[i];
    if (!pending[i]) {
      if (w.reaped) continue;
      // Never forked because an earlier rank could not be: this one never runs.
      w.reaped = true;
      WorkerExit ex{w.plan.rank, w.plan.local_rank, -1, 0, 0, std::chrono::system_clock::now()};
      ex.started = false;
      tracker_.on_exit(ex);
      continue;
    }
    try {
      started(w, supervisor::spawn_finish(*pending[i]));
    } catch (const supervisor::SpawnError& e) {
      spawn_failed(w, e.what());
    }
  }
  // The guardian comes once the ranks have started, off their way: a fork copies this process's
  // page tables, and every page this process writes afterwards costs it a fault.
  if (auto g = supervisor::Guardian::start(cgroup_ ? cgroup_->dir_fd() : -1, plan_.ranks.size(), opts_.last_word)) {
    guardian_.emplace(std::move(*g));
    keep(guardian_->pid());  // not a stray of the workers'
  }
  // The last attempt's guardian, standing down, hands over the word at once (both writing it
  // would be a race the first to finish wins, with the last attempt's files).
  // (One that could not start leaves the word with the last one, naming its files: better than none.)
  if (guardian_ || !opts_.last_word) {
    if (predecessor_) predecessor_->done();
    predecessor_.reset();
  }
  if (guardian_) {
    // Without a cgroup, each rank's process group is what it can kill (each rank leads its
    // own); with one, cgroup.kill reaches everything and no group id is at risk of reuse.
    for (const auto& w : workers_) {
      if (!cgroup_ && w->pid > 0) guardian_->watch_group(w->pid);
    }
  }
  start_hang_sampler();
  check_finished();
}

void WorkerGroup::start_hang_sampler() {
  if (opts_.hang_timeout <= Millis(0)) return;
  std::vector<HangSampler::Rank> ranks;
  for (const auto& w : workers_) ranks.push_back({w->plan.rank, w->plan.local_rank, w->plan.node, w->pid});
  hang_ = std::make_unique<HangSampler>(io_, opts_.hang_timeout, std::move(ranks),
                                        [this](hang::RankProgress& p, hang::TimePoint now) {
                                          if (!stopping_ && cb_.on_hang_round) cb_.on_hang_round(p, now);
                                        });
  hang_->start();
}

void WorkerGroup::write_hang_stacks(const std::string& text) {
  if (!dir_) return;
  std::optional<safefs::Owner> owner;
  if (opts_.run_as) owner = safefs::Owner{opts_.run_as->uid, opts_.run_as->gid};
  try {
    auto fd = safefs::open_append(*dir_, "hang-stacks.txt", owner);
    if (!safefs::write_all(fd.get(), text + "\n")) throw safefs::FsError(errno, std::strerror(errno));
  } catch (const safefs::FsError& e) {
    log::get("hang")->warn("attempt {}: cannot write {}: {}", opts_.attempt, dir_->path_of("hang-stacks.txt"),
                           e.what());
  }
}

void WorkerGroup::open_attempt_dir() {
  try {
    if (opts_.log_root.empty()) {
      dir_ = std::make_shared<const safefs::Dir>(safefs::Dir::open(attempt_dir_));
      return;
    }
    const auto& root = opts_.log_root;
    if (attempt_dir_.size() <= root.size() || attempt_dir_.compare(0, root.size(), root) != 0 ||
        (root.back() != '/' && attempt_dir_[root.size()] != '/')) {
      throw safefs::FsError(EINVAL, fmt::format("the attempt folder {} is not below {}", attempt_dir_, root));
    }
    const uid_t uid = opts_.run_as ? opts_.run_as->uid : ::geteuid();
    dir_ = std::make_shared<const safefs::Dir>(
        safefs::Dir::open_beneath(safefs::Dir::open(root), std::string_view(attempt_dir_).substr(root.size()), uid));
  } catch (const safefs::FsError& e) {
    dir_error_ = e.what();
    log::get("launch")->error("attempt {}: {}", opts_.attempt, dir_error_);
  }
}

std::optional<std::string> WorkerGroup::name_in_attempt_dir(const std::string& path) const {
  if (path.size() <= attempt_dir_.size() + 1 || path.compare(0, attempt_dir_.size(), attempt_dir_) != 0 ||
      path[attempt_dir_.size()] != '/') {
    return std::nullopt;
  }
  auto name = path.substr(attempt_dir_.size() + 1);
  if (name.find('/') != std::string::npos || name == "." || name == "..") return std::nullopt;
  return name;
}

supervisor::SpawnSpec WorkerGroup::spawn_spec(const Worker& w) const {
  supervisor::SpawnSpec s;
  s.argv = w.plan.argv;
  s.env = w.plan.env;
  s.workdir = opts_.workdir;
  s.cgroup_procs_fd = cgroup_ ? cgroup_->procs_fd() : -1;
  s.cgroup_dir_fd = cgroup_ ? cgroup_->dir_fd() : -1;
  s.cpus = w.plan.cpus;
  s.mem_node = w.plan.mem_node;
  // A container rank's process is the client of root's docker or podman, which runs the
  // container itself as the job's user (container.hpp's Confinement): started as that user it
  // would be another, rootless runtime that has none of root's images.
  s.run_as = w.plan.container ? std::nullopt : opts_.run_as;
  return s;
}

void WorkerGroup::started(Worker& w, const supervisor::Spawned& sp) {
  w.pid = sp.pid;
  w.out = std::make_shared<PipeReader>(io_, sp.stdout_fd, Stream::out);
  w.err = std::make_shared<PipeReader>(io_, sp.stderr_fd, Stream::err);
  read_pipe(w, w.out);
  read_pipe(w, w.err);
  w.log->note(fmt::format("started pid {} (attempt {}): {}", sp.pid, opts_.attempt, join(w.plan.argv, " ")));
}

// The rank counts as failed with 127, as a shell reports a command it cannot run. A child that
// was forked exits 127 by itself and is reaped as a stranger.
void WorkerGroup::spawn_failed(Worker& w, const std::string& why) {
  w.reaped = true;
  w.last.add(why);
  w.log->note(why);
  on_exit(w, WorkerExit{w.plan.rank, w.plan.local_rank, -1, 127, 0, std::chrono::system_clock::now()});
}

void WorkerGroup::read_pipe(Worker& w, const std::shared_ptr<PipeReader>& p) {
  Worker* wp = &w;
  p->sd.async_read_some(asio::buffer(p->buf), [this, wp, p](boost::system::error_code ec, std::size_t n) {
    if (!p->open) return;
    auto lines = ec ? p->splitter.finish() : p->splitter.feed(std::string_view(p->buf.data(), n));
    for (const auto& line : lines) {
      wp->log->write(p->stream, line);
      if (hang_) hang_->on_output(wp->plan.local_rank);
    }
    // On disk before anyone is shown them: a line the terminal printed is one `ddpctl logs`
    // has, even if the launcher is killed the moment it is shown.
    wp->log->flush();
    for (auto& line : lines) {
      if (cb_.on_line) cb_.on_line(wp->plan.rank, p->stream, line);
      wp->last.add(std::move(line));
    }
    if (!ec) {
      read_pipe(*wp, p);
      return;
    }
    close_pipe(*p);
    check_finished();
  });
}

void WorkerGroup::close_pipe(PipeReader& p) {
  if (!p.open) return;
  p.open = false;
  boost::system::error_code ignored;
  p.sd.close(ignored);
}

bool WorkerGroup::pipes_open() const {
  for (const auto& w : workers_) {
    if ((w->out && w->out->open) || (w->err && w->err->open)) return true;
  }
  return false;
}

bool WorkerGroup::on_reaped(pid_t pid, int status, SysTime when) {
  for (auto& w : workers_) {
    if (w->pid != pid || w->reaped) continue;
    w->reaped = true;
    if (guardian_ && !cgroup_) lingering_groups_.push_back(pid);  // forgotten once empty (check_finished)
    WorkerExit ex{w->plan.rank, w->plan.local_rank, pid, 0, 0, when};
    if (WIFSIGNALED(status))
      ex.signal = WTERMSIG(status);
    else
      ex.exit_code = WEXITSTATUS(status);
    w->log->note(ex.describe());
    on_exit(*w, ex);
    return true;
  }
  return false;
}

void WorkerGroup::on_exit(Worker& w, const WorkerExit& ex) {
  if (hang_) hang_->on_exit(w.plan.local_rank);
  log::get("launch")->debug("rank {} (pid {}) {}", w.plan.rank, ex.pid, ex.describe());
  const auto decision = tracker_.on_exit(ex);
  if (decision == Decision::first_failure) {
    if (const auto& ff = tracker_.first_failure(); ff && cb_.on_first_failure) cb_.on_first_failure(*ff);
    return;
  }
  if (decision == Decision::stop_all) {
    if (const auto& ff = tracker_.first_failure(); ff && cb_.on_first_failure) {
      cb_.on_first_failure(*ff);
    } else if (!ff) {
      const auto& marked = tracker_.exits().at(static_cast<std::size_t>(w.plan.local_rank));
      log::get("launch")->warn("rank {} {}; stopping the other ranks", w.plan.rank, marked->describe());
    }
    stop_all();
  }
}

void WorkerGroup::request_stop(int signal, Millis interrupt_grace) {
  if (tracker_.on_stop_requested(signal) != Decision::stop_all) return;
  if (signal == SIGINT) interrupt_grace_ = interrupt_grace;
  stop_all();
}

void WorkerGroup::kill_now() {
  tracker_.on_signals_sent();
  killed_now_ = true;
  if (snapshot_ && snapshot_->pending()) {
    killing_now_ = true;
    snapshot_->skip("skipped: the stop was made immediate (a second Ctrl-C, or a kill)");
  }
  signal_everything(SIGKILL);
}

void WorkerGroup::forward(int signal) {
  tracker_.on_forwarded(signal);
  for (pid_t p : worker_pids()) ::kill(p, signal);
}

void WorkerGroup::stop_all() {
  // Once: a second stop (the coordinator's, then its link closing) must not be a second SIGTERM;
  // the grace period that already runs ends in SIGKILL for whatever is left, latecomers too.
  if (stopping_) return;
  if (hang_) hang_->stop();  // a stopping attempt is no hang
  stopping_ = true;
  if (!take_stacks_first()) terminate(true);
}

// One step before the first signal: where every rank still running is (issue 24), read while
// nothing has disturbed it yet; the signals follow when the reads are done or their time is up.
bool WorkerGroup::take_stacks_first() {
  if (opts_.stacks_budget.count() <= 0 || tracker_.stop_signal() == SIGKILL) return false;
  std::vector<StackSnapshot::Target> targets;
  for (const auto& w : workers_) {
    if (w->pid > 0 && !w->reaped) targets.push_back({w->plan.rank, w->plan.node, w->pid});
  }
  if (targets.empty()) return false;
  snapshot_ = std::make_unique<StackSnapshot>(io_, std::move(targets), opts_.stacks_budget, [this](FailureStacks s) {
    stacks_taken(std::move(s));
    terminate(!killing_now_);
  });
  return true;
}

void WorkerGroup::stacks_taken(FailureStacks s) {
  if (dir_) {
    std::optional<safefs::Owner> owner;
    if (opts_.run_as) owner = safefs::Owner{opts_.run_as->uid, opts_.run_as->gid};
    auto w = write_stacks_files(*dir_, owner, s, plan_.world_size);
    if (!w.error.empty()) log::get("launch")->warn("attempt {}: the stacks were not kept: {}", opts_.attempt, w.error);
    s.file = w.path;
  }
  report_.stacks = std::move(s);
}

// A Ctrl-C's stop: SIGINT first (Python's KeyboardInterrupt), SIGTERM to whatever is left after
// the interrupt grace, each step said once; any other stop starts at SIGTERM.
void WorkerGroup::terminate(bool polite) {
  tracker_.on_signals_sent();
  if (!polite) return kill_after_grace();
  if (interrupt_grace_.count() <= 0 || tracker_.stop_signal() != SIGINT) {
    signal_everything(SIGTERM);
    return kill_after_grace();
  }
  signal_everything(SIGINT);
  grace_timer_.expires_after(interrupt_grace_);
  grace_timer_.async_wait([this](boost::system::error_code ec) {
    if (ec) return;
    if (killed_now_) return kill_after_grace();  // a second Ctrl-C came meanwhile: only the SIGKILLs are left
    const auto ranks = worker_pids().size();
    const auto left = ranks ? fmt::format("{} rank{} still running", ranks, ranks == 1 ? "" : "s")
                            : std::string("processes the ranks left behind still running");
    log::get("launch")->warn("{} {} after SIGINT: sending SIGTERM; SIGKILL {} after that", left,
                             format_duration(interrupt_grace_), format_duration(opts_.stop_grace));
    signal_everything(SIGTERM);
    kill_after_grace();
  });
}

void WorkerGroup::kill_after_grace() {
  grace_timer_.expires_after(opts_.stop_grace);
  grace_timer_.async_wait([this](boost::system::error_code ec) {
    if (ec) return;
    auto left = strays().size();
    if (left) {
      log::get("launch")->warn("{} process(es) still running after the {} grace period: SIGKILL", left,
                               format_duration(opts_.stop_grace));
    }
    signal_everything(SIGKILL);
  });
}

// The worker, its process group, its cgroup and every descendant we are subreaper of: a
// grandchild that called setsid() escapes the group but not the other two. SIGKILL goes every
// way; any other signal reaches each process once, as torchrun's does: a script that takes a
// second SIGTERM as "abort now" would otherwise drop its own graceful checkpoint a few
// milliseconds into it.
void WorkerGroup::signal_everything(int sig) {
  std::vector<pid_t> groups;  // process groups signalled as a whole
  for (pid_t p : worker_pids()) {
    if (::kill(-p, sig) == 0) {
      groups.push_back(p);
      if (sig == SIGKILL) ::kill(p, sig);
    } else {
      ::kill(p, sig);  // not a group leader (any more): the worker itself
    }
  }
  if (sig == SIGKILL) {
    if (cgroup_) cgroup_->kill_all();
    for (pid_t p : strays()) ::kill(p, sig);
  } else {
    std::set<pid_t> rest;  // what left those groups: in the cgroup, or below us
    if (cgroup_) {
      for (pid_t p : cgroup_->pids()) rest.insert(p);
    }
    for (pid_t p : strays()) rest.insert(p);
    for (pid_t p : rest) {
      const pid_t g = ::getpgid(p);
      if (g > 0 && std::find(groups.begin(), groups.end(), g) != groups.end()) continue;
      ::kill(p, sig);
    }
  }
  if (sig == SIGKILL && opts_.teardown) opts_.teardown();
}

std::vector<pid_t> WorkerGroup::strays() const {
  const auto kept = [this](pid_t p) { return std::find(keep_.begin(), keep_.end(), p) != keep_.end(); };
  // Most often there are none: ask the few processes whose children they would be (this
  // subreaper, every orphan's parent, and the helpers it keeps) before walking all of /proc;
  // one that cannot say (children_of's nullopt) means walking.
  const auto only_kept_below = [&](pid_t p) {
    const auto children = supervisor::children_of(p);
    return children && std::all_of(children->begin(), children->end(), kept);
  };
  if (only_kept_below(::getpid()) && std::all_of(keep_.begin(), keep_.end(), only_kept_below)) return {};
  std::vector<pid_t> out;
  for (pid_t p : supervisor::descendants_of(::getpid())) {
    if (!kept(p)) out.push_back(p);
  }
  return out;
}

void WorkerGroup::check_finished() {
  // A reaped rank's process group, once nothing is left in it, is an id the kernel may give to
  // another process group: the guardian must not kill that one.
  std::erase_if(lingering_groups_, [this](pid_t g) {
    if (::kill(-g, 0) == 0 || errno == EPERM) return false;
    if (guardian_) guardian_->forget_group(g);
    return true;
  });
  if (finished_ || !tracker_.finished()) return;
  if (!worker_pids().empty()) return;
  // Every rank's client is gone; what its runtime keeps elsewhere goes now, before the strays
  // (a container's conmon among them) are judged.
  if (!torn_down_ && opts_.teardown) {
    torn_down_ = true;
    opts_.teardown();
  }
  // Every rank is gone. Anything still running (an orphaned grandchild, a daemonized helper)
  // is stopped the same way, so that nothing outlives the attempt.
  if (!strays().empty()) {
    if (!cleanup_started_) {
      cleanup_started_ = true;
      // A container runtime's helpers (podman's conmon) end just after their client: expected.
      log::get("launch")->log(opts_.teardown ? spdlog::level::debug : spdlog::level::info,
                              "stopping processes the workers left behind");
      stop_all();
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
        check_finished();
      });
    }
    return;
  }
  finish();
}

std::optional<ErrorFile> WorkerGroup::error_file_of(const Worker& w) const {
  const auto name = name_in_attempt_dir(w.plan.error_file);
  if (!dir_ || !name) return std::nullopt;
  return read_error_file(*dir_, *name, opts_.run_as ? opts_.run_as->uid : ::geteuid());
}

void WorkerGroup::finish() {
  // Every rank ended while their stacks were being read: what was read is the report's.
  if (snapshot_ && snapshot_->pending()) snapshot_->skip("ended before it was read");
  finished_ = true;
  if (hang_) hang_->stop();
  grace_timer_.cancel();
  drain_timer_.cancel();
  if (guardian_) {
    // Nothing of the attempt runs. Its last word stays the owner's to end (take_guardian).
    if (opts_.last_word)
      guardian_->stand_down();
    else
      guardian_->done();
  }
  cgroup_.reset();
  report_.ended = std::chrono::system_clock::now();
  report_.phase = tracker_.phase();
  for (const auto& e : tracker_.exits()) {
    if (e) report_.exits.push_back(*e);
  }
  if (const auto& ff = tracker_.first_failure()) {
    for (const auto& w : workers_) {
      if (w->plan.rank != ff->rank) continue;
      report_.first_failure = RankFailure{*ff, w->plan.node, w->last.lines(), error_file_of(*w), w->plan.log_file};
    }
  }
  // Post, so the owner may destroy this group from inside its callback.
  asio::post(io_, [cb = cb_.on_finished, report = report_] {
    if (cb) cb(report);
  });
}

void reap_children(WorkerGroup* group) {
  bool any = false;
  while (true) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) break;
    any = true;
    if (group) group->on_reaped(pid, status, std::chrono::system_clock::now());
  }
  if (any && group) group->check_finished();
}

}  // namespace ddp::launch

#include "launch/local_launcher.hpp"

#include "attempt/attempt.hpp"
#include "attempt/bind.hpp"
#include "attempt/files.hpp"
#include "attempt/report.hpp"
#include "binding/binding.hpp"
#include "common/host.hpp"
#include "common/log.hpp"
#include "common/strings.hpp"
#include "container/container.hpp"
#include "container/runtime.hpp"
#include "contract/dry_run.hpp"
#include "contract/flight_recorder.hpp"
#include "control/paths.hpp"
#include "control/server.hpp"
#include "facts/discover.hpp"
#include "facts/model.hpp"
#include "hang/flight_gather.hpp"
#include "hang/progress.hpp"
#include "launch/nccl_holder.hpp"
#include "launch/port_holder.hpp"
#include "launch/worker_group.hpp"
#include "pyenv/probe.hpp"
#include "store/peers.hpp"
#include "store/report.hpp"
#include "store/server.hpp"
#include "supervisor/cgroup.hpp"
#include "supervisor/output.hpp"
#include "supervisor/process.hpp"

#include <fmt/format.h>
#include <boost/asio.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

namespace ddp::launch {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using supervisor::Stream;

namespace {

std::string make_job_id(const std::string& name) {
  auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  ::localtime_r(&now, &tm);
  std::random_device rd;
  return fmt::format("{}-{:04}{:02}{:02}-{:02}{:02}{:02}-{:04x}", name, tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                     tm.tm_hour, tm.tm_min, tm.tm_sec, rd() & 0xffff);
}

}  // namespace

// The node's facts, read once: from --facts, else discovered. Launching needs the topology only
// (procfs/sysfs: NVML's initialisation costs far more than a launch), so neither NVML nor
// libnccl nor libcuda is loaded into the launcher; `ddpctl doctor` reports the rest.
static const facts::NodeFacts& node_facts(const LaunchOptions& opts) {
  static std::optional<facts::NodeFacts> cached;
  if (!cached) {
    try {
      auto discover_options = facts::discover_options_from_env();
      discover_options.load_libraries = false;
      discover_options.use_nvml = false;
      discover_options.topology_only = true;
      cached = opts.facts_file ? facts::load_facts_file(*opts.facts_file) : facts::discover(discover_options);
    } catch (const std::exception& e) {
      throw LaunchError(e.what());
    }
  }
  return *cached;
}

std::optional<facts::PythonFacts> job_python(const LaunchOptions& opts) {
  if (opts.facts_file) return node_facts(opts).python;
  if (opts.spec.container) return std::nullopt;
  pyenv::ProbeRequest req;
  req.choice = pyenv::choose_interpreter(opts.spec);
  req.env = contract::scrub(own_environment());
  for (const auto& [k, v] : opts.spec.env) req.env[k] = v;
  req.workdir = opts.spec.workdir.value_or("/");
  return pyenv::probe_python(req, &pyenv::process_cache(pyenv::default_cache_file()));
}

contract::NodeContext resolve_node_context(LaunchOptions& opts, int attempt) {
  auto& spec = opts.spec;
  if (opts.job_id.empty()) opts.job_id = make_job_id(spec.name);  // first: a refusal's result names it
  if (spec.nproc.kind == jobspec::Nproc::Kind::cpu) {
    spec.nproc = {jobspec::Nproc::Kind::count, usable_cpus()};
  } else if (spec.nproc.kind == jobspec::Nproc::Kind::gpu) {
    const auto& f = node_facts(opts);
    if (f.gpus.empty()) {
      throw LaunchError(
          fmt::format("nproc_per_node: gpu, but {} has no GPU{} (see `ddpctl doctor`); use a number or cpu", f.hostname,
                      opts.facts_file ? " in " + *opts.facts_file : ""));
    }
    spec.nproc = {jobspec::Nproc::Kind::count, static_cast<int>(facts::gpu_count(f))};
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

  contract::NodeContext node;
  node.job_id = opts.job_id;
  node.node_name = opts.facts_file ? node_facts(opts).hostname : own_hostname();
  node.local_world_size = spec.nproc.count;
  node.world_size = spec.nproc.count;
  node.master_addr = "127.0.0.1";
  node.master_port = spec.store_port;
  node.restart_count = attempt;
  node.use_agent_store = true;  // ddpctl serves the store; no worker binds MASTER_PORT
  node.attempt_dir = fmt::format("{}/{}/attempt-{}", spec.log_dir, opts.job_id, attempt);
  // Once per launch, before any event loop (the probe waits for its child itself).
  if (attempt == 0 && !opts.python) opts.python = job_python(opts);
  if (opts.python) node.torch_version = opts.python->torch;
  return node;
}

// The job's binding (lib/binding), planned for the --facts node when given (then this machine's
// affinity mask does not narrow it), else for this one, and laid onto the plan (attempt/bind.hpp).
static void apply_binding(contract::Plan& plan, const LaunchOptions& opts) {
  const auto& want = opts.spec.binding;
  if (want.all_none()) return;
  const facts::NodeFacts* f = nullptr;
  try {
    f = &node_facts(opts);
  } catch (const LaunchError& e) {
    if (opts.facts_file) throw;
    log::get("launch")->warn(
        "no binding: cannot discover this node ({}); set binding: {{gpu: none, numa: none, nic: none}} "
        "to silence this",
        e.what());
    return;
  }
  std::optional<std::vector<int>> allowed;
  if (!opts.facts_file) allowed = own_affinity();
  lay_binding(plan, binding::plan_binding(*f, static_cast<int>(plan.ranks.size()), want, allowed));
}

// The environment a rank is planned from: a container's worker gets only what enters the
// container (lib/container's policy), a host worker everything ddpctl inherited.
static contract::Env planning_env(const jobspec::JobSpec& spec, const contract::Env& inherited) {
  return spec.container ? container::forwarded_into_container(inherited, spec) : inherited;
}

// The whole plan of one attempt: contract, binding, then (for a container job) each rank's
// runtime command line.
static contract::Plan make_attempt_plan(const LaunchOptions& opts, const contract::NodeContext& node,
                                        const contract::Env& inherited, const container::HostLayout& host,
                                        int attempt) {
  auto plan = contract::make_plan(opts.spec, node, planning_env(opts.spec, inherited));
  apply_binding(plan, opts);
  container::wrap_plan(plan, opts.spec, inherited, host, attempt, container::own_owner(), fs::current_path().string());
  return plan;
}

// How the user would write `argv` where they gave the command, for an error's advice.
static std::string how_to_write(const jobspec::JobSpec& spec, const std::vector<std::string>& argv) {
  if (spec.file == "ddpctl launch") return fmt::format("ddpctl launch [OPTIONS] -- {}", join(argv, " "));
  if (spec.file == "ddpctl torchrun") {
    return argv.size() == 2 && argv[0] == "python3" ? "ddpctl torchrun without --no-python"
                                                    : fmt::format("ddpctl launch [OPTIONS] -- {}", join(argv, " "));
  }
  return fmt::format("command: [{}] in {}", join(argv, ", "), spec.file);
}

// A host job's program must be found as its workers would find it (their PATH, the workdir).
static void check_runnable(const jobspec::JobSpec& spec, const std::vector<std::string>& argv,
                           const std::string& path) {
  if (supervisor::resolve_executable(argv.at(0), path, *spec.workdir)) return;
  throw LaunchError(supervisor::explain_not_runnable(
      argv.at(0), path, *spec.workdir,
      [&spec](const std::vector<std::string>& cmd) { return how_to_write(spec, cmd); }));
}

nlohmann::json dry_run(LaunchOptions opts, bool show_env) {
  auto node = resolve_node_context(opts, 0);
  const auto inherited = own_environment();
  // What the launch would refuse, the dry run refuses too: it is how a job file is checked.
  if (!opts.spec.container) {
    const auto env0 = contract::worker_env(opts.spec, node, inherited, 0);
    check_runnable(opts.spec, contract::worker_argv(opts.spec), env0.count("PATH") ? env0.at("PATH") : "");
  }
  contract::DryRunNode n;
  n.name = n.hostname = node.node_name;
  n.plan = make_attempt_plan(opts, node, inherited, container::read_host_layout(), 0);
  n.planned_from = planning_env(opts.spec, inherited);
  n.python = opts.python ? facts::to_json(*opts.python) : nlohmann::json(nullptr);
  n.async_error_handling = contract::async_error_handling(node.torch_version);
  auto chosen = contract::scrub(inherited);
  for (const auto& [k, v] : opts.spec.env) chosen[k] = v;
  n.flight_recorder = contract::flight_recorder(opts.spec, node, chosen);
  contract::DryRun run;
  run.job_id = opts.job_id;
  run.world_size = node.world_size;
  run.master_addr = node.master_addr;
  run.notes.push_back("MASTER_ADDR is 127.0.0.1: a local job's store, served by ddpctl, listens on loopback");
  if (node.master_port == 0) {
    run.master_port = contract::run_time_value("a free port, which ddpctl picks when the job starts");
  } else {
    run.master_port = node.master_port;
    if (!opts.spec.store_port_explicit) {
      run.notes.push_back(
          fmt::format("MASTER_PORT {} unless another job holds it when this one starts: then a free one "
                      "(store.port or --master-port insists on it)",
                      node.master_port));
    }
  }
  // The job-wide NCCL_IB_HCA when ddpctl derived it (the binding's nic), not the job's own.
  const auto& env0 = n.plan.ranks.at(0).env;
  const bool job_sets_it =
      std::any_of(opts.spec.env.begin(), opts.spec.env.end(), [](const auto& kv) { return kv.first == "NCCL_IB_HCA"; });
  if (auto it = env0.find("NCCL_IB_HCA"); it != env0.end() && !job_sets_it && !n.planned_from.count("NCCL_IB_HCA"))
    run.nccl_ib_hca = it->second;
  run.nodes.push_back(std::move(n));
  return contract::to_json(run, opts.spec, show_env);
}

namespace {

class LocalLauncher {
 public:
  explicit LocalLauncher(LaunchOptions opts)
      : opts_(std::move(opts)),
        signals_(io_, SIGINT, SIGTERM, SIGHUP),
        user_signals_(io_, SIGUSR1, SIGUSR2),
        sigchld_(io_, SIGCHLD),
        backoff_timer_(io_),
        log_(log::get("launch")) {
    signals_.add(SIGQUIT);
  }
  // An error's way out (an exception) is no death: the kept guardian leaves no record.
  ~LocalLauncher() { end_last_guardian(); }
  LocalLauncher(const LocalLauncher&) = delete;
  LocalLauncher& operator=(const LocalLauncher&) = delete;

  const std::string& job_id() const { return opts_.job_id; }

  int run() {
    // Resolve everything that can be wrong before a single worker starts.
    contract::NodeContext node = resolve_node_context(opts_, 0);
    const auto argv = contract::worker_argv(opts_.spec);
    const auto env0 = contract::worker_env(opts_.spec, node, inherited_, 0);
    const int ranks = node.local_world_size;
    const auto path = env0.count("PATH") ? env0.at("PATH") : "";
    // Another ddpctl here runs a job of this id: both would write the same log files and answer
    // to the same `ddpctl status`. Checked before a container's preflight, which may pull; where
    // no runtime folder is usable, the job runs without a control socket, as before.
    try {
      if (control::someone_listens(control::socket_path(control::runtime_dir(), opts_.job_id)))
        throw LaunchError(
            fmt::format("job {} is already running here (another ddpctl): give this one another "
                        "--job-id, or stop that one first (ddpctl stop {})",
                        opts_.job_id, opts_.job_id));
    } catch (const control::ControlError&) {
    }
    if (opts_.spec.container) {
      prepare_containers();
    } else {
      check_runnable(opts_.spec, argv, path);
    }
    // The job's store: served here, for the whole job, so it outlives any worker.
    store::ServerOptions so;
    so.host = node.master_addr;
    so.port = opts_.spec.store_port;
    so.job_uid = ::geteuid();  // the workers run as we do; root may connect too
    so.totals.max_bytes = opts_.spec.store_max_bytes;
    so.totals.max_keys = opts_.spec.store_max_keys;
    so.threads = store::threads_for(opts_.spec.store_threads);
    so.legacy = store::legacy_hint(opts_.spec.store_protocol, node.torch_version);
    start_store(so);
    opts_.spec.store_port = store_->port();
    store_->set_rank_resolver({[] { return supervisor::descendants_of(::getpid()); }, store::rank_from_environ});
    // The first attempt's NCCL id holder starts as soon as rank 0's environment is known (the
    // store's port is in it): loading libnccl and opening its bootstrap root take longer than
    // the control socket and the plan together, which are made meanwhile.
    node.master_port = opts_.spec.store_port;
    make_attempt_dir(node);
    start_holder(node, contract::worker_env(opts_.spec, node, inherited_, 0));
    early_holder_ = true;

    report_.job_id = opts_.job_id;
    started_ = std::chrono::system_clock::now();
    open_control_socket();
    supervisor::become_subreaper();
    supervisor::Cgroup::sweep_stale();

    wait_signals();
    wait_user_signals();
    wait_sigchld();
    log_->info("job {}: {} worker{} of '{}', store on {}, logs in {}/{}", opts_.job_id, ranks, ranks == 1 ? "" : "s",
               join(argv, " "), store_->address(), opts_.spec.log_dir, opts_.job_id);
    if (auto outside = control::ranks_outside(opts_.show_ranks, ranks)) {
      log_->warn("--ranks: {}", *outside);
    }
    start_attempt(0);
    io_.run();
    terminal_.flush();

    if (opts_.result_json) {
      if (auto err = write_result_file(*opts_.result_json, to_json(report_))) {
        log_->error("{}", *err);
        if (report_.exit_code == 0) report_.exit_code = 2;  // the job ran, its report is lost: not a success
        opts_.result_json.reset();
        if (control_) control_->leave_record(end_record());
      }
    }
    control_.reset();
    return report_.exit_code;
  }

 private:
  // A container job's preflight, before any rank starts: the runtime and the image (pulled per
  // `pull:`), containers of launchers that died swept, the node's devices and limits read.
  void prepare_containers() {
    const auto& cs = *opts_.spec.container;
    const auto client = contract::scrub(inherited_);
    const auto cwd = fs::current_path().string();
    // This launcher's stops (Ctrl-C, SIGTERM, SIGHUP, SIGQUIT) are read by the event loop, which
    // does not run yet: during the preflight (a pull may take half an hour) they are taken from a
    // signalfd instead and end the runtime command at once. Those that come after it are left
    // pending for the loop.
    sigset_t stops, before;
    sigemptyset(&stops);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&stops, sig);
    ::pthread_sigmask(SIG_BLOCK, &stops, &before);
    const int sfd = ::signalfd(-1, &stops, SFD_CLOEXEC | SFD_NONBLOCK);
    container::set_interrupt_fd(sfd);
    struct Restore {
      int fd;
      sigset_t mask;
      ~Restore() {
        container::set_interrupt_fd(-1);
        if (fd >= 0) ::close(fd);
        ::pthread_sigmask(SIG_SETMASK, &mask, nullptr);
      }
    } restore{sfd, before};
    try {
      auto id = container::prepare_image(cs, client, cwd);
      log_->info("container image {} ({}): {}{}", cs.image, jobspec::runtime_name(cs.runtime),
                 id.digest.empty() ? "fetched by the runtime when it runs" : id.digest,
                 id.repo_digest.empty() ? "" : fmt::format(" (repo digest {})", id.repo_digest));
      container::sweep_stale(cs.runtime, client);
      // command[0] and the working directory are the image's, so they are checked in there.
      const auto argv0 = contract::worker_argv(opts_.spec).at(0);
      if (auto warning = container::check_command_in_image(container::with_absolute_mounts(cs, cwd), argv0,
                                                           container::worker_path(opts_.spec), client,
                                                           container::check_container_name(opts_.job_id, ::getpid()))) {
        log_->warn("{}", *warning);
      }
    } catch (const container::Interrupted&) {
      signalfd_siginfo si{};
      const int sig =
          ::read(sfd, &si, sizeof si) == static_cast<ssize_t>(sizeof si) ? static_cast<int>(si.ssi_signo) : SIGTERM;
      throw LaunchError(fmt::format("stopped by {} during the container preflight ({}); no rank had started",
                                    supervisor::signal_name(sig), cs.image),
                        128 + sig);
    } catch (const container::ContainerError& e) {
      throw LaunchError(e.what());
    }
    host_ = container::read_host_layout();
    if (host_.memlock_hard && !host_.rdma_devices.empty() && container::has_image_store(cs.runtime)) {
      log_->warn(
          "this node's hard memlock limit is {} KiB and cannot be raised from here: containers get it instead of "
          "unlimited, which RDMA may find too small (see `ddpctl doctor`)",
          *host_.memlock_hard / 1024);
    }
  }

  // The job's store on the port the spec names. Taken and not asked for by name (the default
  // 29500: another job on this machine has it): a free port, as torchrun --standalone takes.
  // Asked for by name (store.port, --master-port): that port or a failure naming who holds it.
  void start_store(store::ServerOptions so) {
    // Who holds the port, for the message (a holder this user may not look at, or no control
    // folder: unnamed).
    const auto held_by = [&] {
      std::optional<PortHolder> holder;
      try {
        holder = find_port_holder(so.port, control::runtime_dir());
      } catch (const std::exception&) {
      }
      return holder ? fmt::format(" by {}", describe(*holder)) : std::string();
    };
    so.any_port_if_taken = !opts_.spec.store_port_explicit;
    store_.emplace(io_, so);
    try {
      store_->start();
    } catch (const store::PortInUse&) {  // named, and taken
      const bool from_file = !opts_.spec.file.starts_with("ddpctl ");
      throw LaunchError(
          fmt::format("store port {} is taken{}; it was asked for by {}: choose another, or leave it out "
                      "and ddpctl picks a free one",
                      so.port, held_by(),
                      from_file ? fmt::format("store.port in {} (or --master-port)", opts_.spec.file)
                                : std::string("--master-port")));
    } catch (const store::StoreError& e) {
      throw LaunchError(e.what());
    }
    if (so.port != 0 && store_->port() != so.port)
      log_->info("store port {} is taken{}; using a free port", so.port, held_by());
  }

  // The attempt's containers by name, removed now (teardown); the watchdog stays until the
  // attempt is over.
  void remove_attempt_containers() {
    if (!opts_.spec.container || container_names_.empty()) return;
    container::remove_containers(opts_.spec.container->runtime, container_names_, contract::scrub(inherited_));
  }

  void start_attempt(int attempt) {
    attempt_ = attempt;
    store_->reset();  // a fresh keyspace: nothing of the last attempt can confuse this one
    auto node = resolve_node_context(opts_, attempt);
    node.master_port = opts_.spec.store_port;
    node.use_agent_store = true;
    make_attempt_dir(node);

    // A new NCCL unique id for every attempt (the first one's holder is already starting, see
    // run()), waited for on the loop (signals and `ddpctl stop` still answer meanwhile). The
    // attempt's plan (the binding reads the node's topology) is made while the holder starts:
    // the id is the one thing the plan waits for, and it goes into each rank's environment after.
    if (!std::exchange(early_holder_, false)) start_holder(node, contract::worker_env(opts_.spec, node, inherited_, 0));
    try {
      pending_.emplace(node, make_attempt_plan(opts_, node, inherited_, host_, attempt));
    } catch (...) {
      holder_wait_.reset();  // a plan that cannot be made ends the wait: no workers, no id
      holder_result_.reset();
      throw;
    }
    start_when_ready();
  }

  static void make_attempt_dir(const contract::NodeContext& node) {
    std::error_code ec;
    fs::create_directories(node.attempt_dir, ec);
    if (ec) throw LaunchError(fmt::format("cannot create the log directory {}: {}", node.attempt_dir, ec.message()));
  }

  // The attempt's NCCL id holder, from rank 0's environment. Its answer comes through the loop,
  // so after the plan (made at once, below start_holder's callers); start_when_ready takes the two
  // in either order all the same.
  void start_holder(const contract::NodeContext& node, contract::Env env0) {
    holder_.reset();
    holder_result_.reset();
    holder_wait_ = NcclHolder::start(io_, std::move(env0), *opts_.spec.workdir, node.attempt_dir,
                                     opts_.spec.nccl_unique_id, opts_.spec.container.has_value(), std::nullopt,
                                     [this](std::optional<NcclHolder> h, std::string error) {
                                       holder_wait_.reset();
                                       holder_result_.emplace(HolderResult{std::move(h), std::move(error)});
                                       start_when_ready();
                                     });
  }

  // The workers start once the attempt has both its plan and its holder's answer.
  void start_when_ready() {
    if (!pending_ || !holder_result_) return;
    auto [node, plan] = std::move(*pending_);
    pending_.reset();
    auto result = std::move(*holder_result_);
    holder_result_.reset();
    if (!result.error.empty()) throw LaunchError(result.error);
    if (result.holder) {
      holder_.emplace(std::move(*result.holder));
      node.nccl_unique_id_hex = holder_->hex();
      contract::set_nccl_unique_id(plan, holder_->hex());
    }
    start_workers(std::move(node), std::move(plan), attempt_);
  }

  void start_workers(contract::NodeContext node, contract::Plan plan, int attempt) {
    GroupOptions go{attempt, *opts_.spec.workdir, opts_.spec.stop_grace, opts_.spec.log_max_bytes, {}};
    if (opts_.spec.hang) go.hang_timeout = opts_.spec.hang->timeout;
    if (opts_.spec.container) {
      try {
        container::write_env_files(plan, opts_.spec.container->runtime);
        container_names_ = container::container_names(plan);
        watchdog_.reset();
        if (auto w = container::Watchdog::start(container::remove_argv(opts_.spec.container->runtime, container_names_),
                                                contract::scrub(inherited_))) {
          watchdog_.emplace(std::move(*w));
        }
      } catch (const container::ContainerError& e) {
        container::remove_env_files(plan);
        throw LaunchError(e.what());
      }
      env_files_ = plan;
      go.teardown = [this] { remove_attempt_containers(); };
    }
    GroupCallbacks cb;
    cb.on_line = [this](int rank, Stream s, const std::string& line) {
      if (const auto i = static_cast<std::size_t>(rank); i < last_output_.size())
        last_output_[i] = std::chrono::steady_clock::now();
      if (control_) control_->publish(rank, s, line);
      if (!opts_.quiet && (opts_.show_ranks.empty() || opts_.show_ranks.contains(rank))) {
        terminal_.write(s, fmt::format("[{}] {}", rank, line));
      }
    };
    cb.on_first_failure = [this](const WorkerExit& ex) {
      log_->error("rank {} {}; stopping the other ranks", ex.rank, ex.describe());
      note_waiters();
    };
    cb.on_finished = [this](AttemptReport r) { finish_attempt(std::move(r)); };
    cb.on_hang_round = [this, dir = node.attempt_dir](hang::RankProgress& p, hang::TimePoint now) {
      if (p.watch().check(now) == hang::Watch::Verdict::hung_now) on_hang(dir);
    };
    world_size_ = static_cast<int>(plan.ranks.size());
    notes_.clear();
    log_files_.clear();
    for (const auto& rp : plan.ranks) log_files_.push_back(rp.log_file);
    go.last_word = last_word();
    last_output_.assign(plan.ranks.size(), std::nullopt);
    hang_cause_.clear();
    group_ = std::make_unique<WorkerGroup>(io_, std::move(plan), node.attempt_dir, go, std::move(cb));
    if (holder_) group_->keep(holder_->pid());
    if (watchdog_) group_->keep(watchdog_->pid());
    if (last_guardian_) group_->succeed(std::move(*last_guardian_));  // ended once the new one runs
    last_guardian_.reset();
    group_->start();
  }

  // The last attempt's guardian, stood down (WorkerGroup::take_guardian): from the attempt's
  // end until the next attempt's guardian starts or this launcher's own record is written (a
  // restart's backoff, the report), a launcher killed meanwhile still leaves its job's record.
  void end_last_guardian() {
    if (last_guardian_) last_guardian_->done();
    last_guardian_.reset();
  }

  // The watchdog's verdict (lib/hang): no rank made progress for hang.timeout. Every rank's
  // stacks go to the terminal and to the attempt's folder (hang-stacks.txt), then the action.
  void on_hang(const std::string& attempt_dir) {
    const auto& h = *opts_.spec.hang;
    const auto cause = fmt::format("hung: no rank made progress for {}", format_duration(h.timeout));
    const auto stacks = group_->hang_stacks_text();
    log_->error("job {}: {} (hang.action: {}); where every rank is:\n{}", opts_.job_id, cause,
                jobspec::hang_action_name(h.action), stacks);
    group_->write_hang_stacks(
        fmt::format("{} at {}\n{}", cause, format_time(std::chrono::system_clock::now()), stacks));
    notes_.push_back(fmt::format("{} (stacks in {}/hang-stacks.txt)", cause, attempt_dir));
    if (h.action == jobspec::HangAction::report) return;
    note_waiters();
    hang_cause_ = cause;
    hang_stop_ = h.action == jobspec::HangAction::stop;
    group_->request_stop(SIGTERM);  // stop: the job fails; restart: the attempt fails, as a rank's failure would
  }

  // Who waits for what, at the moment it explains the most (before the others are stopped).
  void note_waiters() {
    if (!store_) return;
    auto text = store::format_wait_report(store_->waiters(), world_size_, store::Clock::now());
    if (text.empty()) return;
    for (auto line : split(text, '\n')) notes_.push_back(fmt::format("store: {}", line));
  }

  // What PyTorch's NCCL flight recorder says of a failed attempt, where a rank dumped into the
  // attempt folder (contract/flight_recorder.hpp): the converter runs with the job's Python (as
  // we, the job's user, do). It blocks the launcher's loop, within hang::kConvertLimit (3 s):
  // acceptable here, the workers are all gone by now and only `ddpctl stop` and signals wait.
  // Only where ddpctl turned the recorder on (the plan the workers' environment was made from):
  // dumps the job configured itself, or a container's, are not ours to read.
  void note_flight_recorder(AttemptReport& r) {
    contract::NodeContext node;
    if (opts_.python) node.torch_version = opts_.python->torch;
    node.attempt_dir = r.log_dir;
    auto chosen = contract::scrub(planning_env(opts_.spec, inherited_));
    for (const auto& [k, v] : opts_.spec.env) chosen[k] = v;
    if (contract::flight_recorder(opts_.spec, node, chosen).env.empty()) return;
    hang::ConvertRequest req;
    req.python = pyenv::choose_interpreter(opts_.spec).argv;
    req.env = contract::scrub(own_environment());
    for (const auto& [k, v] : opts_.spec.env) req.env[k] = v;
    req.workdir = *opts_.spec.workdir;
    try {
      if (auto f = hang::gather_flight(safefs::Dir::open(r.log_dir), world_size_, req)) {
        r.notes.push_back(hang::format_finding(*f));
      }
    } catch (const safefs::FsError& e) {
      log_->debug("no flight recorder dumps read: {}", e.what());
    }
  }

  void finish_attempt(AttemptReport r) {
    end_last_guardian();
    if (auto g = group_->take_guardian()) last_guardian_.emplace(std::move(*g));
    group_.reset();
    holder_.reset();
    if (env_files_) container::remove_env_files(*env_files_);
    env_files_.reset();
    watchdog_.reset();  // the group removed the containers: tell it all is done
    container_names_.clear();
    r.notes.insert(r.notes.end(), notes_.begin(), notes_.end());
    if (r.phase != Phase::succeeded) note_flight_recorder(r);
    report_.attempts.push_back(r);
    terminal_.flush();

    if (r.phase == Phase::succeeded) {
      report_.status = "succeeded";
      report_.exit_code = 0;
      log_->info("job {} succeeded{}", opts_.job_id,
                 attempt_ ? fmt::format(" after {} restart{}", attempt_, attempt_ == 1 ? "" : "s") : "");
      return done();
    }
    std::fputs(format_attempt(r, opts_.spec.max_restarts).c_str(), stderr);
    if (stop_signal_) {
      report_.status = "stopped";
      report_.exit_code = 128 + stop_signal_;
      log_->warn("job {} stopped by {}", opts_.job_id, supervisor::signal_name(stop_signal_));
      return done();
    }
    if (hang_stop_) {
      report_.status = "failed";
      report_.exit_code = kHungExitCode;
      report_.message = hang_cause_;
      log_->error("job {} failed: {}", opts_.job_id, hang_cause_);
      return done();
    }
    if (attempt_ < opts_.spec.max_restarts) {
      report_.restarts = attempt_ + 1;
      log_->warn("restarting the job in {} (restart {} of {})", format_duration(opts_.spec.restart_backoff),
                 attempt_ + 1, opts_.spec.max_restarts);
      backoff_timer_.expires_after(opts_.spec.restart_backoff);
      backoff_timer_.async_wait([this](boost::system::error_code ec) {
        if (ec || stop_signal_) return;
        start_attempt(attempt_ + 1);
      });
      return;
    }
    report_.status = "failed";
    report_.exit_code = 1;
    if (!hang_cause_.empty()) report_.message = hang_cause_;  // hang.action: restart, none left
    log_->error("job {} failed{}", opts_.job_id,
                opts_.spec.max_restarts ? fmt::format(" after {} restart{}", opts_.spec.max_restarts,
                                                      opts_.spec.max_restarts == 1 ? "" : "s")
                                        : "");
    done();
  }

  // The end record the attempt's guardian leaves if this launcher dies while the attempt runs (a
  // kill -9, a crash), so that `ddpctl status|logs JOB` still know the job; its own record,
  // written at the end, replaces it otherwise.
  std::optional<supervisor::LastWord> last_word() const {
    std::vector<std::pair<int, std::string>> files;
    for (std::size_t r = 0; r < log_files_.size(); ++r) files.emplace_back(static_cast<int>(r), log_files_[r]);
    auto r = control::record_if_killed(
        report_.job_id, fmt::format("{}/{}", opts_.spec.log_dir, opts_.job_id), std::move(files),
        fmt::format("ddpctl (pid {}) died while the job ran; what was left of the job was killed", ::getpid()));
    if (!r) return std::nullopt;
    return supervisor::LastWord{r->dir, std::move(r->text.name), std::move(r->text.before_time),
                                std::move(r->text.after_time)};
  }

  control::Ended end_record() const {
    auto e = control::ended_now(report_.job_id, report_.status, report_.exit_code,
                                fmt::format("{}/{}", opts_.spec.log_dir, opts_.job_id), opts_.result_json);
    e.message = report_.message;  // a hang's cause, a restart that could not start
    return e;
  }

 public:
  // A LaunchError out of run() once the job is known to `ddpctl status` (its control socket is
  // open): a restart whose plan cannot be made (a GPU gone), say. The job's record says what
  // `refused` (the result file's report) says, rather than the job vanishing.
  void record_refusal(const JobReport& refused) {
    if (done_ || !control_) return;
    done_ = true;
    report_.status = refused.status;
    report_.exit_code = refused.exit_code;
    report_.message = refused.message;
    control_->end(report_.status, end_record());
    end_last_guardian();
  }

 private:
  void done() {
    done_ = true;
    if (control_) control_->end(report_.status, end_record());
    end_last_guardian();  // after our own record: a guardian never replaces one
    boost::system::error_code ignored;
    signals_.cancel(ignored);
    user_signals_.cancel(ignored);
    sigchld_.cancel(ignored);
    backoff_timer_.cancel();
    holder_wait_.reset();
    holder_result_.reset();
    pending_.reset();
    if (store_) store_->stop();
  }

  void wait_sigchld() {
    sigchld_.async_wait([this](boost::system::error_code ec, int) {
      if (ec || done_) return;
      reap_children(group_.get());
      if (!done_) wait_sigchld();
    });
  }

  void wait_signals() {
    signals_.async_wait([this](boost::system::error_code ec, int sig) {
      if (ec) return;
      stop_job(sig, supervisor::signal_name(sig));
      if (!done_) wait_signals();
    });
  }

  // Ctrl-C, SIGTERM, SIGHUP, SIGQUIT (torchrun's four: contract::kSignalsToHandle), or `ddpctl stop` (as SIGTERM) from
  // another terminal.
  void stop_job(int sig, const std::string& what) {
    if (done_) return;
    if (stop_signal_) {
      log_->warn("{} again: killing every worker now", sig == SIGINT ? std::string("Ctrl-C") : what);
      if (group_) group_->kill_now();
      return;
    }
    stop_signal_ = sig;
    const auto grace = opts_.spec.stop_grace;
    const bool interrupt = sig == SIGINT && group_ && !group_->stopping();
    if (interrupt) {
      // Ctrl-C: SIGINT first, as a terminal would send it to a script run by hand. (A group that
      // is stopping already, after a failure, goes on with its SIGTERM.)
      const auto ranks = group_->worker_pids().size();
      log_->warn(
          "Ctrl-C: sending SIGINT to {} rank{} (KeyboardInterrupt); SIGTERM in {}, SIGKILL {} after that; "
          "Ctrl-C again to kill now",
          ranks, ranks == 1 ? "" : "s", format_duration(interrupt_grace(grace)), format_duration(grace));
    } else {
      log_->warn("{}: stopping the job (SIGTERM, then SIGKILL after {}; again to kill now)", what,
                 format_duration(grace));
    }
    if (group_) {
      note_waiters();  // a user stopping a hang wants to know what it hung on
      group_->request_stop(sig, interrupt ? interrupt_grace(grace) : Millis(0));
    } else {
      // Between attempts (backoff): nothing runs; end here.
      report_.status = "stopped";
      report_.exit_code = 128 + sig;
      done();
    }
  }

  // `ddpctl status/logs/stop` from another terminal. Without a usable folder the job still runs.
  void open_control_socket() {
    control::Provider p;
    p.status = [this] { return status(); };
    p.stop = [this](const std::string& who) { stop_job(SIGTERM, who); };
    p.log_files = [this](const std::set<int>& ranks) {
      std::vector<std::pair<int, std::string>> out;
      for (std::size_t r = 0; r < log_files_.size(); ++r) {
        if (ranks.empty() || ranks.contains(static_cast<int>(r))) out.emplace_back(static_cast<int>(r), log_files_[r]);
      }
      return out;
    };
    p.stacks = [this](const std::set<int>& ranks, bool native, std::function<void(nlohmann::json)> reply) {
      read_stacks(ranks, native, std::move(reply));
    };
    try {
      control_.emplace(io_, control::socket_path(control::runtime_dir(), opts_.job_id), std::move(p));
      log_->debug("control socket {}", control_->path());
    } catch (const control::ControlError& e) {
      log_->warn("no control socket, so ddpctl status/logs/stop cannot reach this job: {}", e.what());
    }
  }

  // `ddpctl stacks`: one node, so a rank is its local rank. Between attempts nothing runs.
  void read_stacks(const std::set<int>& ranks, bool native, std::function<void(nlohmann::json)> reply) {
    const auto world = static_cast<int>(log_files_.size());
    auto answer = [reply = std::move(reply), world](std::vector<stacks::RankStacks> got) {
      nlohmann::json out = nlohmann::json::array();
      for (const auto& r : got)
        out.push_back({{"rank", r.rank}, {"node", r.node}, {"process", stacks::to_json(r.stacks)}});
      reply({{"world_size", world}, {"ranks", out}});
    };
    if (!group_) return answer({});
    WorkerGroup::StacksQuery q;
    q.local_ranks.assign(ranks.begin(), ranks.end());
    q.native = native;
    group_->read_stacks(q, std::move(answer));
  }

  nlohmann::json status() const {
    using nlohmann::json;
    const auto now = std::chrono::steady_clock::now();
    json ranks = json::array();
    if (group_) {
      for (const auto& r : group_->rank_status()) {
        json j{{"rank", r.rank}, {"node", own_hostname()}};
        j["pid"] = r.pid > 0 ? json(r.pid) : json(nullptr);
        j["state"] = r.running ? "running" : r.exit ? r.exit->describe() : "not started";
        const auto& last = last_output_.at(static_cast<std::size_t>(r.local_rank));
        j["last_output_age_s"] = last ? json(std::chrono::duration<double>(now - *last).count()) : json(nullptr);
        ranks.push_back(j);
      }
    }
    json waiters = json::array();
    if (store_) {
      // split() returns views into the text: it must outlive the loop (a temporary would not).
      const auto text = store::format_wait_report(store_->waiters(), world_size_, store::Clock::now());
      for (auto line : split(text, '\n')) {
        if (!line.empty()) waiters.push_back(std::string(line));
      }
    }
    const char* state = done_ ? "finished" : stop_signal_ ? "stopping" : !group_ ? "waiting to restart" : "running";
    return {
        {"job_id", opts_.job_id},
        {"mode", "local"},
        {"pid", ::getpid()},
        {"started_unix_ms", std::chrono::duration_cast<std::chrono::milliseconds>(started_.time_since_epoch()).count()},
        {"state", state},
        {"attempt", attempt_},
        {"restarts", attempt_},
        {"max_restarts", opts_.spec.max_restarts},
        {"world_size", world_size_},
        {"store", store_ ? store_->address() : ""},
        {"nodes", json::array({own_hostname()})},
        {"ranks", ranks},
        {"store_waiters", waiters},
        {"hang", hang_status()},
        {"log_dir", fmt::format("{}/{}", opts_.spec.log_dir, opts_.job_id)}};
  }

  // The watchdog's view for `ddpctl status`: how long no rank made progress; null without one.
  nlohmann::json hang_status() const {
    if (!opts_.spec.hang) return nullptr;
    nlohmann::json j{{"timeout_s", std::chrono::duration<double>(opts_.spec.hang->timeout).count()},
                     {"action", jobspec::hang_action_name(opts_.spec.hang->action)}};
    if (const auto* w = group_ ? group_->hang_watch() : nullptr) {
      j["idle_s"] = std::chrono::duration<double>(w->idle(hang::Clock::now())).count();
      j["hung"] = w->hung();
    }
    return j;
  }

  void wait_user_signals() {
    user_signals_.async_wait([this](boost::system::error_code ec, int sig) {
      if (ec) return;
      // Schedulers warn of preemption with SIGUSR1/2: pass it on as it is, to every worker.
      log_->info("{}: passing it to the workers", supervisor::signal_name(sig));
      if (group_) group_->forward(sig);
      if (!done_) wait_user_signals();
    });
  }

  LaunchOptions opts_;
  contract::Env inherited_ = own_environment();
  asio::io_context io_;
  asio::signal_set signals_, user_signals_, sigchld_;
  asio::steady_timer backoff_timer_;
  supervisor::TerminalSink terminal_;
  std::shared_ptr<spdlog::logger> log_;

  std::optional<store::Server> store_;
  std::optional<NcclHolder> holder_;
  std::unique_ptr<NcclHolderWait> holder_wait_;  // the attempt's id on its way
  struct HolderResult {
    std::optional<NcclHolder> holder;  // none: the job makes no id
    std::string error;
  };
  std::optional<HolderResult> holder_result_;                                // the id, come before the plan
  std::optional<std::pair<contract::NodeContext, contract::Plan>> pending_;  // the plan, waiting for the id
  bool early_holder_ = false;                                                // attempt 0's holder started in run()
  container::HostLayout host_;
  std::optional<contract::Plan> env_files_;  // the attempt's plan, for its env files
  std::vector<std::string> container_names_;
  std::optional<container::Watchdog> watchdog_;
  std::unique_ptr<WorkerGroup> group_;
  std::optional<supervisor::Guardian> last_guardian_;  // end_last_guardian()
  std::optional<control::Server> control_;
  std::vector<std::string> log_files_;                                             // the current attempt's, by rank
  std::vector<std::optional<std::chrono::steady_clock::time_point>> last_output_;  // by rank
  std::chrono::system_clock::time_point started_;
  int attempt_ = 0;
  int world_size_ = 0;
  int stop_signal_ = 0;
  bool done_ = false;
  std::string hang_cause_;  // the attempt's hang that stops or restarts it
  bool hang_stop_ = false;  // hang.action: stop
  std::vector<std::string> notes_;
  JobReport report_;
};

}  // namespace

int run_local(LaunchOptions opts) {
  const auto result_json = opts.result_json;
  LocalLauncher launcher(std::move(opts));
  try {
    return launcher.run();
  } catch (const LaunchError& e) {
    // Refused before any attempt (a program not found, a port taken, a container's preflight),
    // or a restart's: the result file still says why, as docs/reference.md promises.
    JobReport r;
    r.job_id = launcher.job_id();
    r.exit_code = e.exit_code();
    r.status = e.exit_code() == 2 ? "failed" : "stopped";
    r.message = e.what();
    launcher.record_refusal(r);
    if (result_json) {
      if (auto err = write_result_file(*result_json, to_json(r))) log::get("launch")->error("{}", *err);
    }
    throw;
  }
}

}  // namespace ddp::launch

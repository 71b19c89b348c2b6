// ddpctl launch: parse the job file, apply flags, then dry-run or run locally.
#include "agent/agent.hpp"
#include "commands.hpp"
#include "common/log.hpp"
#include "common/strings.hpp"
#include "coordinator/client.hpp"
#include "coordinator/coordinator.hpp"
#include "coordinator/dry_run.hpp"
#include "coordinator/gather.hpp"
#include "coordinator/standing.hpp"
#include "facts/model.hpp"
#include "hostlist/hostlist.hpp"
#include "jobspec/flags.hpp"
#include "jobspec/jobspec.hpp"
#include "launch/local_launcher.hpp"
#include "launch/report.hpp"
#include "net/advertise.hpp"
#include "net/connection.hpp"
#include "net/token_file.hpp"
#include "proto/crypto.hpp"
#include "slurm/slurm.hpp"
#include "slurm/step.hpp"
#include "ssh/dialer.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <random>

extern char** environ;

namespace ddpctl {

namespace {
struct LaunchArgs {
  std::string job_file;
  std::vector<std::string> command;  // after `--`, or from a bare script.py (jobspec/flags.hpp)
  std::optional<int> nproc;
  std::optional<int> max_restarts;
  std::optional<std::string> log_dir;
  std::optional<int> master_port;
  std::string ranks;
  std::string job_id;
  std::string result_json;
  std::string nodes;
  std::string facts;
  bool dry_run = false;
  bool quiet = false;
  std::string token_file;
  bool tls = false;
  bool ssh = false;
  bool ssh_accept_new = false;
  double ssh_timeout_s = 15;
  int ssh_parallel = 8;
  std::string coordinator;
  bool detach = false;
  bool slurm = false;
  std::vector<std::string> srun_args;
  std::string advertise_addr;
};

std::map<std::string, std::string> own_environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv(*e);
    if (auto eq = kv.find('='); eq != std::string_view::npos) env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

// --slurm: the nodes of the allocation we run in (SLURM_JOB_NODELIST), as a host list.
std::string slurm_node_list(const LaunchArgs& args, const ddp::jobspec::JobSpec& spec) {
  if (!args.nodes.empty()) throw ddp::slurm::SlurmError("--slurm takes its nodes from the allocation: drop --nodes");
  if (args.ssh) throw ddp::slurm::SlurmError("--slurm and --ssh are two ways to reach the nodes: pick one");
  if (!args.token_file.empty())
    throw ddp::slurm::SlurmError("--token-file is not used with --slurm: each run makes its own secret");
  if (!args.coordinator.empty()) {
    throw ddp::slurm::SlurmError("--slurm runs the job's coordinator here, inside the allocation: drop --coordinator");
  }
  if (args.detach)
    throw ddp::slurm::SlurmError(
        "--detach is not supported with --slurm yet (the batch script's end ends the allocation anyway)");
  const auto alloc = ddp::slurm::allocation_from_env(own_environment());
  const auto nodes = ddp::slurm::pick_nodes(alloc, spec.nnodes_min, spec.nnodes_max, spec.nnodes_max > 1);
  return ddp::hostlist::compress(nodes);
}

// --detach without --coordinator: a background ddpctl (its own session, no terminal) runs the
// embedded coordinator. We wait until every rank of the job's first round has started, relaying
// the background ddpctl's log meanwhile, so a job that cannot start (a failed preflight, a node
// that never joins) fails here with its reason and exit status, as a foreground launch would;
// once it runs we print its id and return, and `ddpctl status/logs/stop` reach it through its
// control socket. Ctrl-C stops the waiting, not the job. Its log and result go beside the job's
// logs.
volatile std::sig_atomic_t detach_interrupted = 0;  // the signal that ended the waiting
void on_detach_signal(int sig) {
  detach_interrupted = sig;
}

// Copies to our stderr what `path` has gained past `offset`.
void relay_log(const std::string& path, off_t& offset) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  char buf[8192];
  ssize_t n = 0;
  while ((n = ::pread(fd, buf, sizeof buf, offset)) > 0) {
    offset += n;
    std::cerr.write(buf, n);
  }
  ::close(fd);
  std::cerr.flush();
}

int run_detached(ddp::coordinator::CoordinatorOptions opts) {
  namespace fs = std::filesystem;
  const auto dir = fmt::format("{}/{}", opts.spec.log_dir, opts.job_id);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    std::cerr << fmt::format("ddpctl launch: --detach: cannot create {}: {}\n", dir, ec.message());
    return 2;
  }
  const auto log_path = dir + "/coordinator.log";
  if (!opts.result_json) opts.result_json = dir + "/result.json";
  // The background ddpctl says 'L' once its control socket listens (its stderr is the log from
  // then on) and 'R' once the ranks run; its end closes the link. A socket, not a pipe: a send
  // to a launcher that is gone (Ctrl-C) must not raise SIGPIPE.
  int link[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, link) != 0) {
    std::cerr << fmt::format("ddpctl launch: --detach: socketpair failed: {}\n", std::strerror(errno));
    return 2;
  }
  struct stat st {};
  off_t relayed = ::stat(log_path.c_str(), &st) == 0 ? st.st_size : 0;  // a reused job id's old lines stay unsaid
  std::cout.flush();
  std::cerr.flush();
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::cerr << fmt::format("ddpctl launch: --detach: fork failed: {}\n", std::strerror(errno));
    return 2;
  }
  if (pid > 0) {
    ::close(link[1]);
    struct sigaction sa {};
    sa.sa_handler = on_detach_signal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
    // Woken by events only: the link, the log folder changing (inotify: the relay follows the
    // log as it grows), or SIGINT/SIGTERM, which stay blocked except inside ppoll() so that one
    // arriving between the check and the wait cannot be missed.
    sigset_t stop_signals, waiting_mask;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    ::sigprocmask(SIG_BLOCK, &stop_signals, &waiting_mask);
    sigdelset(&waiting_mask, SIGINT);
    sigdelset(&waiting_mask, SIGTERM);
    const int changes = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    if (changes >= 0) ::inotify_add_watch(changes, dir.c_str(), IN_MODIFY | IN_CREATE);
    const auto see_it = fmt::format("see it with ddpctl status|logs -f|stop {}", opts.job_id);
    bool listening = false;
    for (;;) {
      pollfd p[2] = {{link[0], POLLIN, 0}, {changes, POLLIN, 0}};
      // Without inotify (a kernel built without it), the log is relayed every 200 ms instead.
      const timespec fallback{0, 200'000'000};
      const int ready = ::ppoll(p, changes >= 0 ? 2 : 1, changes >= 0 ? nullptr : &fallback, &waiting_mask);
      if (changes >= 0 && ready > 0 && p[1].revents) {
        char events[4096];
        while (::read(changes, events, sizeof events) > 0) {
        }
      }
      if (listening) relay_log(log_path, relayed);
      if (detach_interrupted) {
        std::cout << opts.job_id << std::endl;
        std::cerr << fmt::format(
            "ddpctl launch: stopped waiting; job {} goes on in the background (pid {}; log {}); {}\n", opts.job_id, pid,
            log_path, see_it);
        return 128 + detach_interrupted;
      }
      if (ready <= 0 || !p[0].revents) continue;
      char c = 0;
      const ssize_t n = ::recv(link[0], &c, 1, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n == 1 && c == 'L') {
        listening = true;
        continue;
      }
      if (n == 1 && c == 'R') {
        std::cout << opts.job_id << std::endl;
        std::cerr << fmt::format("ddpctl launch: job {} runs in the background (pid {}; log {}); {}\n", opts.job_id,
                                 pid, log_path, see_it);
        return 0;
      }
      // It ended before its ranks ran; it said why (on our stderr, or in the log relayed above).
      ::close(link[0]);
      int status = 0;
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      if (listening) relay_log(log_path, relayed);
      return WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 2;
    }
  }
  ::close(link[0]);
  ::setsid();
  opts.quiet = true;
  opts.on_listening = [fd = link[1], log_path] {
    // From here on nothing of ours holds the caller's terminal or pipes.
    const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    const int out = log >= 0 ? log : null;
    ::dup2(null, STDIN_FILENO);
    ::dup2(out, STDOUT_FILENO);
    ::dup2(out, STDERR_FILENO);
    if (log >= 0) ::close(log);
    if (null >= 0) ::close(null);
    [[maybe_unused]] auto w = ::send(fd, "L", 1, MSG_NOSIGNAL);
  };
  opts.on_running = [fd = link[1]] {
    [[maybe_unused]] auto w = ::send(fd, "R", 1, MSG_NOSIGNAL);
    ::close(fd);
  };
  return ddp::coordinator::run_coordinator(std::move(opts));
}

// --dry-run --nodes ...: every node's plan, from recorded facts (--facts F1[,F2...]) or, without
// --facts, from the agents' live facts (as `doctor --nodes` gathers them; nothing is offered or
// started on them).
int print_multi_node_plan(const LaunchArgs& args, const ddp::coordinator::CoordinatorOptions& opts) {
  try {
    auto entries = ddp::net::node_entries(opts.nodes, 29410, static_cast<bool>(opts.make_dialer));
    std::vector<ddp::facts::NodeFacts> facts;
    if (args.facts.empty()) {
      const auto keys =
          ddp::net::load_token_file(args.token_file.empty() ? ddp::net::find_client_token_file() : args.token_file);
      bool missing = false;
      for (auto& g : ddp::coordinator::gather_facts(opts.nodes, keys, ddp::net::local_user(), ddp::Millis(15000))) {
        if (!g.facts) {
          std::cerr << fmt::format("ddpctl launch: {}: {}\n", g.node, g.error);
          missing = true;
          continue;
        }
        facts.push_back(ddp::facts::from_json(*g.facts, "agent " + g.node));
      }
      if (missing) {
        std::cerr << "ddpctl launch: --dry-run needs every node's facts (or give them with --facts)\n";
        return 2;
      }
    } else {
      for (auto f : ddp::split(args.facts, ','))
        facts.push_back(ddp::facts::load_facts_file(std::string(ddp::trim(f))));
    }
    if (facts.size() == 1) facts.resize(entries.size(), facts[0]);
    if (facts.size() != entries.size()) {
      std::cerr << fmt::format(
          "ddpctl launch: --facts names {} files for {} nodes: give one per node, or one for all\n", facts.size(),
          entries.size());
      return 2;
    }
    std::cout << ddp::coordinator::dry_run_plan(opts.spec, entries, facts, opts.job_id, opts.launcher_env).dump(2)
              << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "ddpctl launch: " << e.what() << "\n";
    return 2;
  }
}

// Our own ddp-agentd, the one SSH mode uploads: beside this ddpctl (build/bin, or /usr/bin).
std::string own_agent_binary() {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("ddp-agentd") : (exe.parent_path() / "ddp-agentd").string();
}

// The multi-node launch (--nodes, or the job file's hosts:): the embedded coordinator drives
// ddp-agentd on every node. nullopt: a local launch.
std::optional<int> maybe_run_multi_node(const LaunchArgs& args, ddp::jobspec::JobSpec spec) {
  namespace fs = std::filesystem;
  std::string list = !args.nodes.empty() ? args.nodes : ddp::join(spec.hosts, ",");
  if (args.slurm) {
    try {
      list = slurm_node_list(args, spec);
    } catch (const ddp::slurm::SlurmError& e) {
      std::cerr << "ddpctl launch: " << e.what() << "\n";
      return 2;
    }
  } else if (!args.srun_args.empty()) {
    std::cerr << "ddpctl launch: --srun-arg needs --slurm\n";
    return 2;
  }
  if (list.empty()) {
    if (args.ssh) {
      std::cerr << fmt::format(
          "ddpctl launch: --ssh needs nodes: pass --nodes (e.g. --nodes node[1-2]) or list hosts: "
          "in {}\n",
          spec.file);
      return 2;
    }
    if (spec.nnodes_max > 1) {
      std::cerr << fmt::format(
          "ddpctl launch: {}: nnodes {} needs nodes to run on: pass --nodes (e.g. --nodes "
          "node[1-{}]) or list hosts: in the job file; each node runs ddp-agentd\n",
          spec.file, spec.nnodes_max, spec.nnodes_max);
      return 2;
    }
    return std::nullopt;
  }
  auto fail = [](const std::string& msg) {
    std::cerr << "ddpctl launch: " << msg << "\n";
    return 2;
  };
  if (!args.facts.empty() && !args.dry_run)
    return fail("--facts with --nodes is for --dry-run (a launch uses each agent's live facts)");
  if (args.dry_run && args.facts.empty() && (args.ssh || args.slurm)) {
    return fail(
        "--dry-run with --ssh or --slurm needs --facts: one facts file per node (comma-separated, in --nodes order) or "
        "one for "
        "every node, e.g. from `ddpctl doctor --json` on each node (live facts come from standing agents only)");
  }
  auto hosts = ddp::hostlist::expand(list);
  if (!hosts.ok()) return fail(fmt::format("--nodes '{}': {}", list, hosts.error->to_string()));
  if (spec.nnodes_max > 1 && hosts.hosts.size() < static_cast<std::size_t>(spec.nnodes_min)) {
    return fail(fmt::format("nnodes {} in {} needs at least {} nodes, but {} were given",
                            spec.nnodes_min == spec.nnodes_max ? std::to_string(spec.nnodes_max)
                                                               : fmt::format("{}:{}", spec.nnodes_min, spec.nnodes_max),
                            spec.file, spec.nnodes_min, hosts.hosts.size()));
  }
  if (spec.nnodes_max == 1 && hosts.hosts.size() > 1) {
    // No nnodes in the file: the host list decides.
    spec.nnodes_min = spec.nnodes_max = static_cast<int>(hosts.hosts.size());
  }
  if (args.nproc) spec.nproc = {ddp::jobspec::Nproc::Kind::count, *args.nproc};
  if (args.max_restarts) spec.max_restarts = *args.max_restarts;
  if (args.log_dir) spec.log_dir = *args.log_dir;
  if (args.master_port)
    spec.store_port = static_cast<std::uint16_t>(*args.master_port), spec.store_port_explicit = *args.master_port != 0;
  // Relative paths mean the launcher's working directory; agents get them absolute.
  const fs::path cwd = fs::current_path();
  fs::path workdir = spec.workdir ? fs::path(*spec.workdir) : cwd;
  if (workdir.is_relative()) workdir = cwd / workdir;
  spec.workdir = workdir.lexically_normal().string();
  fs::path logs = spec.log_dir;
  if (logs.is_relative()) logs = cwd / logs;
  spec.log_dir = logs.lexically_normal().string();
  if (spec.container) {
    for (auto& m : spec.container->mounts) {
      if (fs::path(m.source).is_relative()) m.source = (cwd / m.source).lexically_normal().string();
      if (m.source.size() > 1 && m.source.back() == '/') m.source.pop_back();
    }
  }

  ddp::coordinator::CoordinatorOptions opts;
  opts.spec = spec;
  opts.nodes = hosts.hosts;
  opts.quiet = args.quiet;
  if (!args.result_json.empty()) opts.result_json = args.result_json;
  for (auto part : ddp::split(args.ranks, ',')) {
    if (ddp::trim(part).empty()) continue;
    auto r = ddp::parse_int(ddp::trim(part));
    if (!r || *r < 0) return fail(fmt::format("--ranks: expected rank numbers such as 0,3, got '{}'", part));
    opts.show_ranks.insert(static_cast<int>(*r));
  }
  opts.user = ddp::net::local_user();
  opts.launcher_env = own_environment();
  if (args.job_id.empty()) {
    auto t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    std::tm tm{};
    ::localtime_r(&t, &tm);
    std::random_device rd;
    opts.job_id = fmt::format("{}-{:04}{:02}{:02}-{:02}{:02}{:02}-{:04x}", spec.name, tm.tm_year + 1900, tm.tm_mon + 1,
                              tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, rd() & 0xffff);
  } else {
    opts.job_id = args.job_id;
  }
  if (args.dry_run) return print_multi_node_plan(args, opts);
  if (!args.advertise_addr.empty() && !args.ssh) {
    return fail(
        "--advertise-addr is for --ssh (agents connecting back); with --nodes the coordinator dials the agents and "
        "nothing connects to it");
  }
  if (!args.coordinator.empty()) {
    if (args.ssh)
      return fail(
          "--coordinator with --ssh: a standing coordinator reaches its agents over TCP (SSH mode starts its own)");
    auto ep = ddp::hostlist::parse_endpoint(args.coordinator);
    if (!ep.ok()) return fail(fmt::format("--coordinator '{}': {}", args.coordinator, ep.error->to_string()));
    ddp::coordinator::SubmitOptions so;
    so.host = ep.endpoint.host;
    so.port = ep.endpoint.port.value_or(ddp::coordinator::kStandingPort);
    try {
      so.keys =
          ddp::net::load_token_file(args.token_file.empty() ? ddp::net::find_client_token_file() : args.token_file);
    } catch (const ddp::net::TokenError& e) {
      return fail(e.what());
    }
    so.job_id = opts.job_id;
    so.user = opts.user;
    so.payload.spec = opts.spec;
    so.payload.forward_env = ddp::net::forwarded_env(opts.launcher_env, opts.spec.env_forward);
    so.nodes = opts.nodes;
    so.detach = args.detach;
    so.quiet = args.quiet;
    so.show_ranks = opts.show_ranks;
    so.result_json = opts.result_json;
    so.tls = args.tls;
    return ddp::coordinator::submit_job(std::move(so));
  }
  try {
    if (args.ssh) {
      if (!args.token_file.empty()) return fail("--token-file is not used with --ssh: each run makes its own secret");
      // A fresh secret per run, known only to us and to the agents we start: it travels inside
      // each SSH channel (the agent's stdin), never on a command line or in a file.
      const auto nonce = ddp::proto::random_nonce();
      const auto secret =
          ddp::proto::to_hex(std::string_view(reinterpret_cast<const char*>(nonce.data()), nonce.size()));
      opts.keys = ddp::proto::Keyring({{"ssh", secret}});
      ddp::ssh::DialerOptions so;
      so.accept_new = args.ssh_accept_new;
      so.timeout = ddp::Millis(static_cast<long long>(args.ssh_timeout_s * 1000));
      so.max_parallel = args.ssh_parallel;
      so.secret = secret;
      so.agent_binary = own_agent_binary();
      so.agent_version = ddp::agent::kVersion;
      so.verbose_agent = ddp::log::get("ssh")->should_log(spdlog::level::debug);
      if (!args.advertise_addr.empty()) {
        try {
          so.connect_back = ddp::net::parse_advertise_addr(args.advertise_addr);
        } catch (const std::invalid_argument& e) {
          return fail(fmt::format("--advertise-addr '{}': {}", args.advertise_addr, e.what()));
        }
      }
      if (!std::filesystem::exists(so.agent_binary)) {
        return fail(
            fmt::format("--ssh: our ddp-agentd is not at {} (it must sit beside ddpctl, to be uploaded to nodes "
                        "that lack it)",
                        so.agent_binary));
      }
      opts.make_dialer = [so](boost::asio::io_context& io) { return std::make_unique<ddp::ssh::Dialer>(io, so); };
      if (args.tls && args.advertise_addr.empty()) {
        return fail(
            "--tls is not used with --ssh: SSH already encrypts the link to each agent (with --advertise-addr, "
            "where the agents connect back over TCP, it is)");
      }
    } else if (args.slurm) {
      // A fresh secret per run, as over SSH: srun carries it to the agents in their environment
      // (slurm::kSecretEnv), which they read and remove; never a command-line word or a file.
      const auto nonce = ddp::proto::random_nonce();
      const auto secret =
          ddp::proto::to_hex(std::string_view(reinterpret_cast<const char*>(nonce.data()), nonce.size()));
      opts.keys = ddp::proto::Keyring({{"run", secret}});
      ddp::slurm::StepDialerOptions so;
      so.step.nodes = hosts.hosts;
      so.step.agent = own_agent_binary();
      so.step.verbose_agent = ddp::log::get("slurm")->should_log(spdlog::level::debug);
      so.step.extra = args.srun_args;
      so.step.job_name = "ddpctl-" + spec.name;
      so.secret = secret;
      so.env = opts.launcher_env;
      so.workdir = cwd.string();
      so.stop_grace = spec.stop_grace;
      if (!std::filesystem::exists(so.step.agent)) {
        return fail(
            fmt::format("--slurm: our ddp-agentd is not at {} (srun runs it from there on every node)", so.step.agent));
      }
      opts.make_dialer = [so](boost::asio::io_context& io) { return std::make_unique<ddp::slurm::StepDialer>(io, so); };
    } else {
      opts.keys =
          ddp::net::load_token_file(args.token_file.empty() ? ddp::net::find_client_token_file() : args.token_file);
    }
    opts.tls = args.tls;
    if (args.detach) return run_detached(std::move(opts));
    return ddp::coordinator::run_coordinator(std::move(opts));
  } catch (const ddp::net::TokenError& e) {
    return fail(e.what());
  } catch (const ddp::coordinator::CoordinatorError& e) {
    return fail(e.what());
  } catch (const ddp::slurm::SlurmError& e) {
    return fail(e.what());
  } catch (const std::runtime_error& e) {
    return fail(e.what());
  }
}
}  // namespace

Command add_launch_command(CLI::App& root) {
  auto args = std::make_shared<LaunchArgs>();
  auto* sub = root.add_subcommand("launch", "run a training job (locally unless --nodes is given)");
  sub->footer(
      "Without a job file: ddpctl launch [OPTIONS] SCRIPT.py [ITS ARGS...] (run as python3 SCRIPT.py), or\n"
      "ddpctl launch [OPTIONS] -- COMMAND [ITS ARGS...]; the options build the same job a file would.");
  sub->add_option("job", args->job_file,
                  "the job file (YAML); or a script.py, or -- and a command, to run without one");
  sub->add_option("-n,--nproc-per-node", args->nproc, "workers on this node (overrides nproc_per_node)")
      ->check(CLI::Range(1, 4096));
  sub->add_option("--max-restarts", args->max_restarts, "restarts after a failure (overrides restart.max_restarts)")
      ->check(CLI::Range(0, 1000));
  sub->add_option("--log-dir", args->log_dir, "where logs go (overrides logs.dir)");
  sub->add_option("--master-port", args->master_port,
                  "the store's port, MASTER_PORT (overrides store.port; 0: a free one)")
      ->check(CLI::Range(0, 65535));
  sub->add_option("--ranks", args->ranks, "show only these ranks' output on the terminal, e.g. 0,3 (files get all)");
  sub->add_option("--job-id", args->job_id, "the job id (default: <name>-<date>-<time>-<random>)");
  sub->add_option("--result-json", args->result_json, "write the job's result (first failure, exits) as JSON here")
      // Checked before anything starts: a report that cannot be written is found out now, not
      // after the job.
      ->check(CLI::Validator(
          [](std::string& path) -> std::string { return ddp::launch::result_file_problem(path).value_or(""); },
          "FILE"));
  sub->add_option("--nodes", args->nodes, "run on these nodes, each running ddp-agentd: node1,node2:29410,node[3-8]")
      ->check(ddpctl::non_empty_nodes());
  sub->add_option(
      "--token-file", args->token_file,
      "the shared secret for the agents (default: $DDP_TOKEN_FILE, $XDG_CONFIG_HOME/ddpctl/token, /etc/ddpctl/token)");
  sub->add_flag("--tls", args->tls,
                "talk to the agents inside TLS 1.3, keyed by the token (no certificates; agents allow it by default): "
                "with --nodes, --slurm, --ssh --advertise-addr, and --coordinator (the link to it, and its links to "
                "this job's agents)");
  sub->add_option("--facts", args->facts,
                  "describe this node from a facts file (ddpctl doctor --json) instead of discovery; "
                  "with --nodes and --dry-run: one file per node, comma-separated, or one for all");
  sub->add_flag("--ssh", args->ssh,
                "reach the nodes over SSH (~/.ssh/config, keys, ssh-agent) and run a one-shot ddp-agentd on each; no "
                "daemon or token file needed");
  sub->add_flag("--ssh-accept-new", args->ssh_accept_new,
                "with --ssh: add unknown host keys to known_hosts (first contact); a changed key is still refused");
  sub->add_option("--ssh-timeout", args->ssh_timeout_s,
                  "with --ssh: seconds for each node's connection and login steps")
      ->check(CLI::Range(1.0, 600.0));
  sub->add_option("--ssh-parallel", args->ssh_parallel,
                  "with --ssh: logins in progress at once (sshd's MaxStartups: 10)")
      ->check(CLI::Range(1, 1000));
  sub->add_option(
      "--coordinator", args->coordinator,
      "submit the job to this standing ddp-coordinator (HOST[:PORT], port 29411) instead of coordinating it "
      "here; it keeps running if ddpctl goes away");
  sub->add_flag("--detach", args->detach,
                "with --nodes: run the job in a background ddpctl (or on --coordinator), return once every rank has "
                "started and print its id, or fail with the job's reason and status as a foreground launch would "
                "(Ctrl-C stops the waiting, not the job); ddpctl status/logs/stop reach it");
  sub->add_flag(
      "--slurm", args->slurm,
      "inside a SLURM allocation (sbatch, salloc): run on its nodes (SLURM_JOB_NODELIST), starting a one-shot "
      "ddp-agentd on each with one srun step; no daemon or token file needed");
  sub->add_option("--srun-arg", args->srun_args,
                  "with --slurm: one more argument for the agents' srun, before the agent's command (repeatable; a "
                  "site's partition, account or GPU request)")
      ->expected(1)
      ->allow_extra_args(false)  // the job file after it is the job file, not a second srun argument
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  sub->add_option("--advertise-addr", args->advertise_addr,
                  "with --ssh: the agents connect back over TCP to HOST[:PORT] (auto or :PORT: this machine's address "
                  "on the route to each node; port 0: any) instead of speaking over their SSH channel");
  sub->add_flag("--dry-run", args->dry_run, "print the plan as JSON and start nothing");
  sub->add_flag("-q,--quiet", args->quiet, "no worker output on the terminal (log files still get it)");

  auto take_words = [args, sub](const std::vector<std::string>& words) {
    auto split = ddp::jobspec::split_launch_words(words, [sub](std::string_view name) -> std::optional<bool> {
      const auto* opt = sub->get_option_no_throw(std::string(name));
      if (!opt) return std::nullopt;
      return opt->get_type_size_max() != 0;
    });
    args->command = std::move(split.command);
    return split.own;
  };
  return {sub,
          [args] {
            ddp::launch::LaunchOptions opts;
            try {
              if (!args->command.empty() && !args->job_file.empty()) {
                std::cerr << fmt::format(
                    "ddpctl launch: a job file ({}) and a command after --: the job file names its "
                    "command; give one or the other\n",
                    args->job_file);
                return 2;
              }
              if (!args->command.empty()) {
                ddp::jobspec::JobFlags flags;
                flags.command = args->command;
                if (args->nproc) flags.nproc_per_node = std::to_string(*args->nproc);
                if (args->max_restarts) flags.max_restarts = std::to_string(*args->max_restarts);
                if (args->log_dir) flags.log_dir = *args->log_dir;
                if (args->master_port) flags.store_port = std::to_string(*args->master_port);
                opts.spec = ddp::jobspec::spec_from_flags(flags, "ddpctl launch");
              } else if (args->job_file.empty()) {
                std::cerr << "ddpctl launch: what to run? a job file (ddpctl launch job.yaml), a script (ddpctl launch "
                             "-n 2 train.py ARGS) or a command (ddpctl launch -n 2 -- python3 train.py ARGS)\n";
                return 2;
              } else {
                opts.spec = ddp::jobspec::load_job_file(args->job_file);
              }
            } catch (const ddp::jobspec::JobSpecError& e) {
              std::cerr << e.what() << "\n";
              return 2;
            }
            if (!args->job_id.empty() && !ddp::jobspec::valid_job_id(args->job_id)) {
              std::cerr << fmt::format("ddpctl launch: --job-id: expected {}, got '{}'\n", ddp::jobspec::kJobIdRule,
                                       args->job_id);
              return 2;
            }
            if (!args->ssh && (args->ssh_accept_new)) {
              std::cerr << "ddpctl launch: --ssh-accept-new needs --ssh\n";
              return 2;
            }
            if (auto rc = maybe_run_multi_node(*args, opts.spec)) return *rc;
            if (args->detach) {
              std::cerr << "ddpctl launch: --detach needs --nodes (or hosts: in the job file); a local launch runs "
                           "in the foreground. To leave one running without this terminal: `setsid -f ddpctl launch "
                           "ARGS >job.out 2>&1 </dev/null` (your arguments less --detach); `ddpctl status`, `logs` "
                           "and `stop` reach it as any local job\n";
              return 2;
            }
            if (!args->coordinator.empty()) {
              std::cerr << "ddpctl launch: --coordinator needs --nodes (or hosts: in the job file): a standing "
                           "coordinator runs jobs on agents; a local launch runs in the foreground\n";
              return 2;
            }
            if (args->nproc) opts.spec.nproc = {ddp::jobspec::Nproc::Kind::count, *args->nproc};
            if (args->max_restarts) opts.spec.max_restarts = *args->max_restarts;
            if (args->log_dir) opts.spec.log_dir = *args->log_dir;
            if (args->master_port) {
              opts.spec.store_port = static_cast<std::uint16_t>(*args->master_port);
              opts.spec.store_port_explicit = *args->master_port != 0;
            }
            opts.job_id = args->job_id;
            if (!args->facts.empty()) opts.facts_file = args->facts;
            opts.quiet = args->quiet;
            if (!args->result_json.empty()) opts.result_json = args->result_json;
            for (auto part : ddp::split(args->ranks, ',')) {
              if (ddp::trim(part).empty()) continue;
              auto r = ddp::parse_int(ddp::trim(part));
              if (!r || *r < 0) {
                std::cerr << fmt::format("ddpctl launch: --ranks: expected rank numbers such as 0,3, got '{}'\n", part);
                return 2;
              }
              opts.show_ranks.insert(static_cast<int>(*r));
            }
            try {
              if (args->dry_run) {
                std::cout << ddp::launch::dry_run(std::move(opts)).dump(2) << "\n";
                return 0;
              }
              return ddp::launch::run_local(std::move(opts));
            } catch (const ddp::launch::LaunchError& e) {
              std::cerr << "ddpctl launch: " << e.what() << "\n";
              return 2;
            }
          },
          take_words};
}

}  // namespace ddpctl

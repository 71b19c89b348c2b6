// ddpctl launch: parse the job file and the flags, then dry-run or run locally, or hand a multi-node
// launch to lib/multinode (its policy) and the coordinator.
#include "attempt/files.hpp"
#include "commands.hpp"
#include "common/safe_fs.hpp"
#include "common/strings.hpp"
#include "control/paths.hpp"
#include "control/protocol.hpp"
#include "coordinator/client.hpp"
#include "coordinator/coordinator.hpp"
#include "jobspec/flags.hpp"
#include "jobspec/jobspec.hpp"
#include "launch/local_launcher.hpp"
#include "multinode/launch_plan.hpp"
#include "multinode/reach.hpp"
#include "net/connection.hpp"

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
struct LaunchArgs : ddp::multinode::LaunchFlags {
  std::string job_file;
  std::vector<std::string> command;  // after `--`, or from a bare script.py (jobspec/flags.hpp)
  bool show_env = false;
};

std::map<std::string, std::string> own_environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv(*e);
    if (auto eq = kv.find('='); eq != std::string_view::npos) env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
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

// Copies to our stderr what the log (read through `fd`) has gained past `offset`.
void relay_log(int fd, off_t& offset) {
  if (fd < 0) return;
  char buf[8192];
  ssize_t n = 0;
  while ((n = ::pread(fd, buf, sizeof buf, offset)) > 0) {
    offset += n;
    std::cerr.write(buf, n);
  }
  std::cerr.flush();
}

int run_detached(ddp::coordinator::CoordinatorOptions opts) {
  namespace fs = std::filesystem;
  const auto dir = fmt::format("{}/{}", opts.spec.log_dir, opts.job_id);
  // The job's folder must be ours (made, or one of ours already there: not a link, not someone
  // else's; 0700) and stays open for the job's life: the log, the result and every attempt's
  // copy of the logs go below its descriptor, never by path (a log_dir others can write, /tmp,
  // must not let them point root's files at one of their choice, nor swap the folder later).
  ddp::safefs::Fd log_w, log_r;
  std::shared_ptr<const ddp::safefs::Dir> job;
  try {
    std::error_code ec;
    fs::create_directories(opts.spec.log_dir, ec);  // a folder of the user who runs ddpctl
    const auto root = ddp::safefs::Dir::open(opts.spec.log_dir);
    job = std::make_shared<const ddp::safefs::Dir>(ddp::safefs::make_dir(root, opts.job_id, 0700, std::nullopt, false));
    ::fchmod(job->fd(), 0700);
    log_w = ddp::safefs::open_append(*job, "coordinator.log", std::nullopt);
    // The same file again, to read (the relay): through our descriptor, not its name.
    log_r = ddp::safefs::Fd(::open(fmt::format("/proc/self/fd/{}", log_w.get()).c_str(), O_RDONLY | O_CLOEXEC));
    opts.job_folder = job;
  } catch (const ddp::safefs::FsError& e) {
    std::cerr << fmt::format("ddpctl launch: --detach: cannot keep the job's log in {}: {}\n", dir, e.what());
    return 2;
  }
  const auto log_path = dir + "/coordinator.log";  // for messages
  if (!opts.result_json) {
    opts.result_json = dir + "/result.json";
    opts.result_folder = job;
  }
  // The background ddpctl says 'L' once its control socket listens (its stderr is the log from
  // then on) and 'R' once the ranks run; its end closes the link. A socket, not a pipe: a send
  // to a launcher that is gone (Ctrl-C) must not raise SIGPIPE.
  int link[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, link) != 0) {
    std::cerr << fmt::format("ddpctl launch: --detach: socketpair failed: {}\n", std::strerror(errno));
    return 2;
  }
  struct stat st {};
  off_t relayed = ::fstat(log_w.get(), &st) == 0 ? st.st_size : 0;  // a reused job id's old lines stay unsaid
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
    int changes = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    // The folder opened above, whatever its path leads to now; without a watch (no /proc, the
    // user's watch limit reached) the log is relayed on a timer instead.
    if (changes >= 0 &&
        ::inotify_add_watch(changes, fmt::format("/proc/self/fd/{}", job->fd()).c_str(), IN_MODIFY | IN_CREATE) < 0) {
      ::close(changes);
      changes = -1;
    }
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
      if (listening) relay_log(log_r.get(), relayed);
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
      if (listening) relay_log(log_r.get(), relayed);
      return WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 2;
    }
  }
  ::close(link[0]);
  log_r = ddp::safefs::Fd();
  ::setsid();
  opts.quiet = true;
  opts.on_listening = [fd = link[1], log = log_w.release()] {
    // From here on nothing of ours holds the caller's terminal or pipes.
    const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    ::dup2(null, STDIN_FILENO);
    ::dup2(log, STDOUT_FILENO);
    ::dup2(log, STDERR_FILENO);
    ::close(log);
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
int print_multi_node_plan(const ddp::multinode::MultiNodePlan& plan, const LaunchArgs& args) {
  try {
    auto result = ddp::multinode::dry_run(plan, args, args.show_env);
    for (const auto& e : result.errors) std::cerr << "ddpctl launch: " << e << "\n";
    if (!result.plan) return 2;
    std::cout << result.plan->dump(2) << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "ddpctl launch: " << e.what() << "\n";
    return 2;
  }
}

// The multi-node launch (--nodes, or the job file's hosts:): the embedded coordinator drives
// ddp-agentd on every node (policy: lib/multinode). nullopt: a local launch.
std::optional<int> maybe_run_multi_node(const LaunchArgs& args, const ddp::jobspec::JobSpec& spec) {
  auto fail = [](const std::string& msg) {
    std::cerr << "ddpctl launch: " << msg << "\n";
    return 2;
  };
  ddp::multinode::LaunchContext context;
  context.cwd = std::filesystem::current_path().string();
  context.env = own_environment();
  context.user = ddp::net::local_user();
  const auto t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  ::localtime_r(&t, &context.local_time);
  context.random = static_cast<std::uint16_t>(std::random_device{}() & 0xffff);
  auto outcome = ddp::multinode::plan_multi_node(args, spec, context);
  if (!outcome.error.empty()) return fail(outcome.error);
  if (outcome.local()) return std::nullopt;
  auto& plan = *outcome.plan;
  if (args.dry_run) return print_multi_node_plan(plan, args);
  try {
    if (plan.reach == ddp::multinode::Reach::standing)
      return ddp::coordinator::submit_job(ddp::multinode::submit_options(plan, args));
    ddp::multinode::prepare_reach(plan, args);
    if (args.detach) return run_detached(std::move(plan.options));
    return ddp::coordinator::run_coordinator(std::move(plan.options));
  } catch (const std::runtime_error& e) {  // TokenError, CoordinatorError, SlurmError among them
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
  sub->add_option_function<std::string>(
         "-n,--nproc-per-node", [args](const std::string& v) { args->nproc = ddp::jobspec::parse_nproc(v); },
         "workers on each node: a count, cpu or gpu (one per GPU), as nproc_per_node (which it overrides)")
      ->check(CLI::Validator(
          [](std::string& v) {
            return ddp::jobspec::parse_nproc(v) ? std::string()
                                                : "expected a count from 1 to 4096, cpu or gpu, got '" + v + "'";
          },
          "N|cpu|gpu"));
  sub->add_option("--max-restarts", args->max_restarts, "restarts after a failure (overrides restart.max_restarts)")
      ->check(CLI::Range(0, 1000));
  sub->add_option("--log-dir", args->log_dir, "where logs go (overrides logs.dir)");
  sub->add_option("--master-port", args->master_port,
                  "the store's port, MASTER_PORT (overrides store.port; 0: a free one)")
      ->check(CLI::Range(0, 65535));
  sub->add_option("--ranks", args->ranks,
                  "show only these ranks' output on the terminal, e.g. 0,3 or 4-7 (files get all)");
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
  sub->add_flag("--dry-run", args->dry_run,
                "print the plan as JSON and start nothing; each rank's env shows the variables ddpctl sets and "
                "those the job names (env:, env_forward:)");
  sub->add_flag("--show-env", args->show_env,
                "with --dry-run: show every variable of each rank's environment, those passed on unchanged from "
                "ddpctl's own environment too (they may hold credentials)");
  sub->add_flag("-q,--quiet", args->quiet, "no worker output on the terminal (log files still get it)");

  auto take_words = [args, sub](const std::vector<std::string>& words) {
    auto split = ddp::jobspec::split_launch_words(words, [sub](std::string_view name) -> std::optional<bool> {
      const auto* opt = sub->get_option_no_throw(std::string(name));
      if (!opt) return std::nullopt;
      return opt->get_items_expected_max() != 0;  // a flag expects none (its type size is still 1)
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
                if (args->nproc) flags.nproc_per_node = ddp::jobspec::to_string(*args->nproc);
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
            if (args->show_env && !args->dry_run) {
              std::cerr << "ddpctl launch: --show-env is for --dry-run (ddpctl launch --dry-run --show-env ...)\n";
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
            if (args->nproc) opts.spec.nproc = *args->nproc;
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
            if (!ddp::trim(args->ranks).empty()) {
              try {
                opts.show_ranks = ddp::control::parse_rank_list(args->ranks);
              } catch (const ddp::control::ControlError& e) {
                std::cerr << "ddpctl launch: " << e.what() << "\n";
                return 2;
              }
            }
            try {
              if (args->dry_run) {
                std::cout << ddp::launch::dry_run(std::move(opts), args->show_env).dump(2) << "\n";
                return 0;
              }
              return ddp::launch::run_local(std::move(opts));
            } catch (const ddp::launch::LaunchError& e) {
              std::cerr << "ddpctl launch: " << e.what() << "\n";
              return e.exit_code();
            }
          },
          take_words};
}

}  // namespace ddpctl

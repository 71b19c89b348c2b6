// `ddpctl stacks [JOB] [--ranks R] [--native] [--json]`: a running job's stacks, through its
// launcher's control socket or --coordinator (cmd_control.cpp's run_stacks_job); every node's
// shepherd (or the local launcher) reads its ranks (lib/stacks/collect.hpp) and ddpctl merges.
// `--pid PID ...` (hidden): processes on this machine instead, read here; the i-th is "rank" i
// (the integration tests and bench/stacks use it).
#include "commands.hpp"

#include "stacks/collect.hpp"
#include "stacks/merge.hpp"

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>

namespace ddpctl {

Command add_stacks_command(CLI::App& root) {
  struct Opts {
    std::vector<int> pids;
    bool native = false, json = false, main_only = false;
    StacksJobArgs job;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = root.add_subcommand(
      "stacks", "where a running job's ranks are: every thread's Python (and native) stack, identical ones merged");
  sub->add_option("job", o->job.job, "job id (default: the only job of yours that runs)");
  sub->add_option("--ranks", o->job.ranks, "only these ranks, e.g. 0,3 or 4-7");
  sub->add_option("--pid", o->pids, "instead of a job: a local process to read (repeat: the i-th is shown as rank i)")
      ->check(CLI::PositiveNumber)
      ->group("");  // for tests and bench/stacks
  sub->add_flag("--native", o->native, "native frames too (libdw; stops each thread briefly with ptrace)");
  sub->add_flag("--json", o->json, "one JSON object: the processes as read, and the merged groups");
  sub->add_flag("--main-thread", o->main_only, "merge only each process's main thread");
  sub->add_option("--coordinator", o->job.coordinator,
                  "ask the standing ddp-coordinator at HOST[:PORT] (port 29411) for its job instead of this machine's "
                  "control sockets");
  sub->add_option("--token-file", o->job.token_file, "with --coordinator: the shared secret (as for `ddpctl status`)");
  sub->add_flag("--tls", o->job.tls, "with --coordinator: talk to it inside TLS 1.3, keyed by the token");
  return {
      sub, [o]() {
        if (o->pids.empty()) {
          o->job.native = o->native;
          o->job.json = o->json;
          o->job.main_only = o->main_only;
          return run_stacks_job(o->job);
        }
        if (!o->job.job.empty() || !o->job.ranks.empty() || !o->job.coordinator.empty()) {
          std::cerr << "ddpctl stacks: --pid reads local processes; it takes no job, --ranks or --coordinator\n";
          return 2;
        }
        // libdw would ask a debuginfod server for missing debug info when this is set: no
        // network traffic from a stack read.
        ::unsetenv("DEBUGINFOD_URLS");
        // Native frames through the privilege-separated reader (as root: it drops to each
        // process's own user before libdw opens that process's files).
        // The pids are the user's to name, read as they are (no start time to check them against).
        std::vector<ddp::stacks::Target> targets;
        for (pid_t pid : o->pids) targets.push_back({pid, std::nullopt});
        auto read = ddp::stacks::collect(targets, {.native = o->native});
        std::vector<ddp::stacks::RankStacks> ranks;
        for (std::size_t i = 0; i < read.size(); ++i) ranks.push_back({int(i), "", std::move(read[i])});
        const auto groups = ddp::stacks::merge(ranks, {.main_thread_only = o->main_only});
        int unreadable = 0;
        for (const auto& r : ranks)
          if (r.stacks.threads.empty() && !r.stacks.errors.empty()) ++unreadable;
        if (o->json) {
          nlohmann::json procs = nlohmann::json::array();
          for (const auto& r : ranks) procs.push_back(ddp::stacks::to_json(r.stacks));
          std::cout << nlohmann::json{{"processes", procs}, {"groups", ddp::stacks::to_json(groups)}}.dump(2) << "\n";
        } else {
          std::cout << ddp::stacks::render_text(groups, int(ranks.size())) << std::flush;
          for (const auto& r : ranks) {
            std::fprintf(stderr, "# rank %d pid %d: %s%s; read in %.2f ms", r.rank, r.stacks.pid,
                         r.stacks.python_ok ? "Python " : "", r.stacks.python.c_str(), r.stacks.timing.read_ms);
            if (o->native)
              std::fprintf(stderr, "; threads stopped at most %.2f ms each (ptrace)",
                           r.stacks.timing.native_stop_max_ms);
            std::fprintf(stderr, "\n");
            for (const auto& e : r.stacks.errors) std::fprintf(stderr, "# rank %d: %s\n", r.rank, e.c_str());
          }
        }
        // 1: some process could not be read at all (gone, or no right to read it).
        return unreadable ? 1 : 0;
      }};
}

}  // namespace ddpctl

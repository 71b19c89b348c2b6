// `ddpctl stacks --pid PID [--pid PID ...] [--native] [--json]` (hidden, for now): the stacks of
// processes on this machine, read from outside (lib/stacks), merged as a job's ranks would be
// (the i-th --pid is "rank" i). The job-level `ddpctl stacks JOB` through the agents comes later;
// this is its reader, exercised by the integration tests and bench/stacks.
#include "commands.hpp"

#include "stacks/merge.hpp"
#include "stacks/reader.hpp"

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>

namespace ddpctl {

Command add_stacks_command(CLI::App& root) {
  struct Opts {
    std::vector<int> pids;
    bool native = false, json = false, main_only = false;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = root.add_subcommand("stacks", "every thread's Python (and native) stack of local processes, merged");
  sub->group("");  // not in --help until `ddpctl stacks JOB` exists
  sub->add_option("--pid", o->pids, "a process to read (repeat: the i-th is shown as rank i)")
      ->required()
      ->check(CLI::PositiveNumber);
  sub->add_flag("--native", o->native, "native frames too (libdw; stops each thread briefly with ptrace)");
  sub->add_flag("--json", o->json, "one JSON object: the processes as read, and the merged groups");
  sub->add_flag("--main-thread", o->main_only, "merge only each process's main thread");
  return {
      sub, [o]() {
        // libdw would ask a debuginfod server for missing debug info when this is set: no
        // network traffic from a stack read.
        ::unsetenv("DEBUGINFOD_URLS");
        std::vector<ddp::stacks::RankStacks> ranks;
        for (std::size_t i = 0; i < o->pids.size(); ++i)
          ranks.push_back({int(i), "", ddp::stacks::read_process(o->pids[i], {.python = true, .native = o->native})});
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

// ddpctl launch: parse the job file, apply flags, then dry-run or run locally.
#include "commands.hpp"
#include "common/strings.hpp"
#include "jobspec/jobspec.hpp"
#include "launch/local_launcher.hpp"

#include <fmt/format.h>

#include <iostream>
#include <memory>

namespace ddpctl {

namespace {
struct LaunchArgs {
  std::string job_file;
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
};
}  // namespace

Command add_launch_command(CLI::App& root) {
  auto args = std::make_shared<LaunchArgs>();
  auto* sub = root.add_subcommand("launch", "run a training job (locally unless --nodes is given)");
  sub->add_option("job", args->job_file, "the job file (YAML)")->required();
  sub->add_option("--nproc-per-node", args->nproc, "workers on this node (overrides nproc_per_node)")->check(CLI::Range(1, 4096));
  sub->add_option("--max-restarts", args->max_restarts, "restarts after a failure (overrides restart.max_restarts)")
      ->check(CLI::Range(0, 1000));
  sub->add_option("--log-dir", args->log_dir, "where logs go (overrides logs.dir)");
  sub->add_option("--master-port", args->master_port, "the store's port, MASTER_PORT (overrides store.port; 0: a free one)")
      ->check(CLI::Range(0, 65535));
  sub->add_option("--ranks", args->ranks, "show only these ranks' output on the terminal, e.g. 0,3 (files get all)");
  sub->add_option("--job-id", args->job_id, "the job id (default: <name>-<date>-<time>-<random>)");
  sub->add_option("--result-json", args->result_json, "write the job's result (first failure, exits) as JSON here");
  sub->add_option("--nodes", args->nodes, "run on these nodes (multi-node: not supported yet)");
  sub->add_option("--facts", args->facts, "describe this node from a facts file (ddpctl doctor --json) instead of discovery");
  sub->add_flag("--dry-run", args->dry_run, "print the plan as JSON and start nothing");
  sub->add_flag("-q,--quiet", args->quiet, "no worker output on the terminal (log files still get it)");

  return {sub, [args] {
            if (!args->nodes.empty()) {
              std::cerr << "ddpctl launch: --nodes is not supported yet: multi-node launches need ddp-agentd "
                           "(the multi-node issue); without --nodes the job runs on this machine\n";
              return 2;
            }
            ddp::launch::LaunchOptions opts;
            try {
              opts.spec = ddp::jobspec::load_job_file(args->job_file);
            } catch (const ddp::jobspec::JobSpecError& e) {
              std::cerr << e.what() << "\n";
              return 2;
            }
            if (args->nproc) opts.spec.nproc = {ddp::jobspec::Nproc::Kind::count, *args->nproc};
            if (args->max_restarts) opts.spec.max_restarts = *args->max_restarts;
            if (args->log_dir) opts.spec.log_dir = *args->log_dir;
            if (args->master_port) opts.spec.store_port = static_cast<std::uint16_t>(*args->master_port);
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
          }};
}

}  // namespace ddpctl

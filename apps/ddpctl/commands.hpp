// Each ddpctl subcommand registers itself on the CLI and returns how to run it.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace ddpctl {

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
  // Given the words after the command's name, returns those for CLI11 and keeps the rest (the
  // job's own command line: `ddpctl launch -n 2 -- python3 train.py --lr 0.1`).
  std::function<std::vector<std::string>(const std::vector<std::string>&)> take_words;
  // Runs on the raw words after the command's name, without CLI11 (`ddpctl torchrun`: torchrun's
  // own command line, argparse's rules).
  std::function<int(const std::vector<std::string>&)> run_raw;
};

Command add_launch_command(CLI::App& root);
Command add_doctor_command(CLI::App& root);
Command add_store_command(CLI::App& root);
Command add_render_command(CLI::App& root);
Command add_generate_command(CLI::App& root);
Command add_stacks_command(CLI::App& root);                 // a running job's stacks (or --pid: local processes)
Command add_torchrun_command(CLI::App& root);               // torchrun's own command line, on this machine
std::vector<Command> add_control_commands(CLI::App& root);  // status, logs, stop

// `ddpctl stacks [JOB]`: through the job's control socket or --coordinator, as status/logs
// reach it (cmd_control.cpp).
struct StacksJobArgs {
  std::string job, ranks, coordinator, token_file;
  bool tls = false, native = false, json = false, main_only = false;
};
int run_stacks_job(const StacksJobArgs& a);

// --nodes given but empty (`--nodes "$NODES"` with NODES unset) is a mistake, not "run here".
inline CLI::Validator non_empty_nodes() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        if (s.find_first_not_of(" \t,") != std::string::npos) return {};
        return "is empty (an unset variable?): name the nodes, node1,node2,..., or leave --nodes out to run on this "
               "machine";
      },
      "NODES");
}

}  // namespace ddpctl

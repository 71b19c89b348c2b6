// Each ddpctl subcommand registers itself on the CLI and returns how to run it.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <vector>

namespace ddpctl {

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

Command add_launch_command(CLI::App& root);
Command add_doctor_command(CLI::App& root);
Command add_store_command(CLI::App& root);
Command add_render_command(CLI::App& root);
Command add_generate_command(CLI::App& root);
std::vector<Command> add_control_commands(CLI::App& root);  // status, logs, stop

}  // namespace ddpctl

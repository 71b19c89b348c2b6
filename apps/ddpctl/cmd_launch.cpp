// Placeholder until its issue lands: the command exists and says plainly that it is not built yet.
#include "commands.hpp"

#include <iostream>

namespace ddpctl {

Command add_launch_command(CLI::App& root) {
  auto* sub = root.add_subcommand("launch", "not yet available");
  sub->allow_extras();
  return {sub, [] {
            std::cerr << "ddpctl launch: not supported yet\n";
            return 2;
          }};
}

}  // namespace ddpctl

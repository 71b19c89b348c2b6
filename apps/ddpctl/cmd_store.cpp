// Placeholder until its issue lands: the command exists and says plainly that it is not built yet.
#include "commands.hpp"

#include <iostream>

namespace ddpctl {

Command add_store_command(CLI::App& root) {
  auto* sub = root.add_subcommand("store", "not yet available");
  sub->allow_extras();
  return {sub, [] {
            std::cerr << "ddpctl store: not supported yet\n";
            return 2;
          }};
}

}  // namespace ddpctl

// A program's man page and bash completion, written from its CLI11 definition (every
// subcommand, option and positional argument, with their descriptions). Hidden options and
// subcommands (CLI11 group "") are left out. The build runs the programs to produce both, and
// the .deb installs them.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace ddp::cliexport {

struct ManInfo {
  std::string program;   // "ddpctl"
  int section = 1;       // 1: user commands, 8: system administration
  std::string version;   // "ddpctl 0.1.0" (ddp::kCtlVersion)
  std::string see_also;  // "ddp-agentd(8), systemd.service(5)"; empty: no section
};

// roff for man(7): NAME, SYNOPSIS, DESCRIPTION, OPTIONS, then one subsection per subcommand.
std::string man_page(const CLI::App& app, const ManInfo& info);

// A bash completion script: `complete -F _<program> <program>`. Completes subcommands,
// their options, and file names for option values and positional arguments.
std::string bash_completion(const CLI::App& app, const std::string& program);

}  // namespace ddp::cliexport

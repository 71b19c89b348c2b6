// `ddpctl generate man|bash-completion` (hidden): the man page and the bash completion script,
// written from this very CLI definition (lib/cliexport). The build runs it; the .deb installs
// the results.
#include "commands.hpp"

#include "cliexport/cliexport.hpp"
#include "common/version.hpp"

#include <iostream>
#include <memory>

namespace ddpctl {

Command add_generate_command(CLI::App& root) {
  auto what = std::make_shared<std::string>();
  auto* sub = root.add_subcommand("generate", "write ddpctl's man page or bash completion script to stdout");
  sub->group("");  // for the build and packagers, not in --help
  sub->add_option("what", *what, "man | bash-completion")->required()->check(CLI::IsMember({"man", "bash-completion"}));
  return {sub, [what, &root]() {
            if (*what == "man") {
              std::cout << ddp::cliexport::man_page(root, {"ddpctl", 1, ddp::kCtlVersion, "ddp-agentd(8)"});
            } else {
              std::cout << ddp::cliexport::bash_completion(root, "ddpctl");
            }
            return 0;
          }};
}

}  // namespace ddpctl

// ddp-coordinator entry point: flags, the token file, then lib/coordinator's standing daemon.
#include "cliexport/cliexport.hpp"
#include "common/log.hpp"
#include "coordinator/standing.hpp"
#include "hostlist/hostlist.hpp"
#include "net/tls.hpp"
#include "net/token_file.hpp"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <iostream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  CLI::App app{
      "ddp-coordinator: a standing ddpctl coordinator; ddpctl launch submits jobs to it, and they keep "
      "running on the agents when that ddpctl goes away"};
  app.set_version_flag("--version", ddp::coordinator::kStandingVersion);
  ddp::coordinator::StandingOptions opts;
  std::string listen = fmt::format("[::]:{}", ddp::coordinator::kStandingPort);
  std::string token_file = ddp::net::kAgentTokenFile;
  bool verbose = false;
  app.add_option("--listen", listen, "HOST:PORT to listen on for ddpctl ([::]:29411: every address)");
  app.add_option("--token-file", token_file,
                 "the shared secret(s) (mode 0600): ddpctl must prove one, and the first proves us to the agents");
  std::vector<std::string> key_users;
  std::string tls = "allowed";
  app.add_option("--tls", tls,
                 "TLS 1.3 keyed by the token from ddpctl: allowed (either), required (plaintext clients refused, and "
                 "every job's agents reached inside TLS) or off")
      ->check(CLI::IsMember({"off", "allowed", "required"}));
  app.add_option("--key-user", key_users,
                 "KEY=USER (repeat for each key): a client proving token key KEY acts only as USER, and its jobs run "
                 "as USER on agents that map KEY (their key_users); without any, a client is the user it declares");
  app.add_option("--log-dir", opts.log_dir, "where the launcher's copy of every job's per-rank logs goes");
  app.add_flag("-v,--verbose", verbose, "debug logging (same as DDP_LOG_LEVEL=debug)");
  bool generate_man = false;  // for the build: the man page from this definition
  app.add_flag("--generate-man", generate_man)->group("");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (generate_man) {
    std::cout << ddp::cliexport::man_page(app, {"ddp-coordinator", 8, ddp::coordinator::kStandingVersion,
                                                "ddpctl(1), ddp-agentd(8), systemd.service(5)"});
    return 0;
  }
  if (verbose) ddp::log::set_level(spdlog::level::debug);
  auto ep = ddp::hostlist::parse_endpoint(listen);
  if (!ep.ok()) {
    std::cerr << fmt::format("ddp-coordinator: --listen '{}': {}\n", listen, ep.error->to_string());
    return 2;
  }
  opts.tls = *ddp::net::parse_tls_mode(tls);
  opts.listen_host = ep.endpoint.host;
  opts.port = ep.endpoint.port.value_or(ddp::coordinator::kStandingPort);
  try {
    opts.keys = ddp::net::load_token_file(token_file);
    for (const auto& ku : key_users) {
      const auto eq = ku.find('=');
      const auto key = ku.substr(0, eq == std::string::npos ? 0 : eq);
      const auto user = eq == std::string::npos ? std::string() : ku.substr(eq + 1);
      if (key.empty() || user.empty()) {
        std::cerr << fmt::format("ddp-coordinator: --key-user '{}': expected KEY=USER, such as alice-key=alice\n", ku);
        return 2;
      }
      if (!opts.keys.find(key)) {
        std::cerr << fmt::format("ddp-coordinator: --key-user '{}': key '{}' is not in {}\n", ku, key, token_file);
        return 2;
      }
      if (!opts.key_users.emplace(key, user).second) {
        std::cerr << fmt::format("ddp-coordinator: --key-user: key '{}' is mapped twice\n", key);
        return 2;
      }
    }
    return ddp::coordinator::run_standing(std::move(opts));
  } catch (const ddp::net::TokenError& e) {
    std::cerr << "ddp-coordinator: " << e.what() << "\n";
    return 2;
  } catch (const ddp::coordinator::StandingError& e) {
    std::cerr << "ddp-coordinator: " << e.what() << "\n";
    return 2;
  }
}

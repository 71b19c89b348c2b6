// ddp-agentd entry point: flags, the token file, then lib/agent's daemon loop.
#include "agent/agent.hpp"
#include "agent/preflight.hpp"
#include "agentconfig/agentconfig.hpp"
#include "agentconfig/users.hpp"
#include "cliexport/cliexport.hpp"
#include "common/log.hpp"
#include "common/safe_fs.hpp"
#include "common/strings.hpp"
#include "common/version.hpp"
#include "facts/model.hpp"
#include "hostlist/hostlist.hpp"
#include "net/token_file.hpp"
#include "shepherd/shepherd.hpp"
#include "slurm/slurm.hpp"
#include "stacks/collect.hpp"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <sys/resource.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string_view>

#include <unistd.h>

namespace {

// --stdio: the per-run secret is stdin's first line (never argv, which `ps` shows). Read byte
// by byte so that nothing after the newline (the protocol's first frame) is consumed here.
std::optional<std::string> read_secret_line() {
  std::string line;
  char c = 0;
  while (line.size() <= ddp::proto::kMaxSecretChars) {
    const ssize_t n = ::read(STDIN_FILENO, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;
    if (c == '\n') return line;
    line.push_back(c);
  }
  return std::nullopt;
}

// A per-run agent's: in its user's state folder; root's only where no other user can swap a
// folder on the way (ddp::safefs::usable_env_dir), else the service's own /var/log/ddpctl.
std::string default_stdio_log_dir() {
  std::string dir;
  if (const char* state = std::getenv("XDG_STATE_HOME"); state && *state) {
    dir = fmt::format("{}/ddpctl/logs", state);
  } else {
    const char* home = std::getenv("HOME");
    dir = fmt::format("{}/.local/state/ddpctl/logs", home && *home ? home : "/tmp");
  }
  return ddp::safefs::usable_env_dir(dir).value_or("/var/log/ddpctl");
}

// `ddp-agentd shepherd ...`: the per-job process the agent starts (lib/shepherd), not for users.
int shepherd_main(int argc, char** argv) {
  std::string error;
  auto args = ddp::shepherd::parse_args({argv + 2, argv + argc}, error);
  if (!args) {
    std::cerr << "ddp-agentd shepherd: " << error << " (this mode is started by ddp-agentd itself)\n";
    return 2;
  }
  return ddp::shepherd::run_shepherd(*args);
}

// The config file's values for every setting whose flag was not given (a flag wins).
void apply_config(const ddp::agentconfig::AgentConfig& cfg, const CLI::App& app, std::string& listen,
                  std::string& token_file, double& heartbeat_timeout_s, ddp::agent::AgentOptions& opts) {
  auto unset = [&](const char* flag) { return app.count(flag) == 0; };
  if (cfg.listen && unset("--listen")) listen = *cfg.listen;
  if (cfg.token_file && unset("--token-file")) token_file = *cfg.token_file;
  if (cfg.log_dir && unset("--log-dir")) opts.log_dir = *cfg.log_dir;
  if (cfg.name && unset("--name")) opts.name = *cfg.name;
  if (cfg.heartbeat_timeout && unset("--heartbeat-timeout"))
    heartbeat_timeout_s = cfg.heartbeat_timeout->count() / 1000.0;
  opts.allowed_users = cfg.allowed_users;
  if (cfg.job_units) {
    using J = ddp::agentconfig::JobUnits;
    using M = ddp::jobunit::Mode;
    opts.job_units = *cfg.job_units == J::systemd ? M::systemd : *cfg.job_units == J::fork ? M::fork : M::automatic;
  }
  if (cfg.container_runtime) opts.container_runtime = ddp::agentconfig::to_string(*cfg.container_runtime);
  // --gpus / --cpus, parsed below, replace these when given.
  opts.gpus = cfg.gpus;
  opts.cpus = cfg.cpus;
  if (cfg.tls && unset("--tls")) opts.tls = *ddp::net::parse_tls_mode(*cfg.tls);
  opts.limits = cfg.limits;
}

}  // namespace

int main(int argc, char** argv) {
  // The shepherd's privilege-separated native stack reader (lib/stacks/collect.hpp).
  if (auto rc = ddp::stacks::run_reader_if_asked(argc, argv)) return *rc;
  if (argc >= 2 && std::string_view(argv[1]) == "shepherd") return shepherd_main(argc, argv);
  // `ddp-agentd preflight`: a container job's preflight, started by the agent (lib/agent/preflight.hpp).
  if (argc == 2 && std::string_view(argv[1]) == "preflight")
    return ddp::agent::run_preflight_helper(std::cin, std::cout);
  CLI::App app{
      "ddp-agentd: the ddpctl node agent (runs a job's workers on this node for an authenticated coordinator)"};
  app.set_version_flag("--version", ddp::agent::kVersion);
  std::string listen = fmt::format("[::]:{}", ddp::agent::kDefaultPort);
  std::string token_file = ddp::net::kAgentTokenFile;
  std::string config;
  std::optional<ddp::agentconfig::AgentConfig> cfg;
  bool oneshot = false, stdio = false, verbose = false, announce = false;
  std::string secret_env;
  double heartbeat_timeout_s = 6;
  ddp::agent::AgentOptions opts;
  app.add_option("--listen", listen, "HOST:PORT to listen on ([::]:29410: every address)");
  app.add_option("--token-file", token_file, "the shared secret(s) coordinators must prove (mode 0600)");
  app.add_option("--name", opts.name, "this node's name in logs (default: the hostname)");
  auto* log_dir = app.add_option("--log-dir", opts.log_dir,
                                 "where workers' per-rank logs go on this node (default /var/log/ddpctl; with --stdio "
                                 "$XDG_STATE_HOME/ddpctl/logs or ~/.local/state/ddpctl/logs)");
  app.add_option(
         "--heartbeat-timeout", heartbeat_timeout_s,
         "seconds of coordinator silence that stop the workers (at least 2; this agent beats at a third of it at most, "
         "and coordinators answer each beat)")
      ->check(CLI::Range(2.0, 3600.0));
  std::string tls = "allowed";
  app.add_option("--tls", tls,
                 "TLS 1.3 keyed by the token: allowed (coordinators choose, per connection), required, or off")
      ->check(CLI::IsMember({"allowed", "required", "off"}));
  std::string gpus, cpus;
  app.add_option("--gpus", gpus,
                 "the GPUs this agent manages: indices in PCI bus order, UUIDs or PCI bus ids (default: all)");
  app.add_option("--cpus", cpus, "the CPUs this agent manages, a cpulist like 0-15,32-47 (default: its affinity)");
  app.add_option("--config", config,
                 fmt::format("agent config file (default: {}, when it exists); flags win over it",
                             ddp::agentconfig::kDefaultPath));
  app.add_flag("--oneshot", oneshot, "serve one job, then exit");
  app.add_flag("--stdio", stdio,
               "speak to one coordinator over stdin/stdout instead of listening (SSH mode): stdin's first line is "
               "the run's secret; logs go to stderr; implies --oneshot");
  app.add_option("--secret-env", secret_env,
                 "take the secret from this environment variable instead of a token file, and remove it from the "
                 "environment (ddpctl's SLURM mode passes the run's secret this way, through srun)");
  app.add_flag("--announce", announce,
               "once listening, print 'ddp-agentd listening PORT' on stdout (for --listen with port 0; ddpctl's "
               "SLURM mode reads it through srun)");
  std::string connect;
  app.add_option(
      "--connect", connect,
      "with --stdio: run the protocol over a TCP connection to the launcher at HOST:PORT (the address it advertised); "
      "stdin's second line is the tag that names this node to it");
  app.add_flag("-v,--verbose", verbose, "debug logging (same as DDP_LOG_LEVEL=debug)");
  bool generate_man = false;  // for the build: the man page from this definition
  app.add_flag("--generate-man", generate_man)->group("");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (generate_man) {
    std::cout << ddp::cliexport::man_page(app, {"ddp-agentd", 8, ddp::kAgentVersion, "ddpctl(1), systemd.service(5)"});
    return 0;
  }
  if (verbose) ddp::log::set_level(spdlog::level::debug);
  if (!connect.empty() && !stdio) {
    std::cerr << "ddp-agentd: --connect needs --stdio (the launcher starts it so, through SSH)\n";
    return 2;
  }
  opts.oneshot = oneshot || stdio;
  if (stdio && (!secret_env.empty() || announce)) {
    std::cerr << "ddp-agentd: --secret-env and --announce are for a listening agent, not --stdio\n";
    return 2;
  }
  opts.tls = *ddp::net::parse_tls_mode(tls);  // the config file's, below, unless --tls was given
  opts.stdio = stdio;
  // The default file is optional; one named with --config must be there.
  if (config.empty() && std::filesystem::exists(ddp::agentconfig::kDefaultPath))
    config = ddp::agentconfig::kDefaultPath;
  if (!config.empty()) {
    try {
      cfg = ddp::agentconfig::load_agent_config(config);
      apply_config(*cfg, app, listen, token_file, heartbeat_timeout_s, opts);
    } catch (const ddp::agentconfig::ConfigError& e) {
      std::cerr << e.what() << "\n";
      return 2;
    }
  }
  // Port 0 (any free port) only makes sense when the agent tells which one it got.
  const bool any_port = announce && listen.ends_with(":0");
  auto ep = ddp::hostlist::parse_endpoint(any_port ? std::string_view(listen).substr(0, listen.size() - 2) : listen);
  if (!ep.ok()) {
    std::cerr << fmt::format("ddp-agentd: --listen '{}': {}{}\n", listen, ep.error->to_string(),
                             listen.ends_with(":0") ? " (port 0 needs --announce)" : "");
    return 2;
  }
  opts.listen_host = ep.endpoint.host;
  opts.port = any_port ? 0 : ep.endpoint.port.value_or(ddp::agent::kDefaultPort);
  if (!gpus.empty()) {
    opts.gpus.emplace();
    for (auto g : ddp::split(gpus, ',')) opts.gpus->emplace_back(ddp::trim(g));
  }
  if (!cpus.empty()) {
    opts.cpus = ddp::facts::parse_cpulist(cpus);
    if (!opts.cpus || opts.cpus->empty()) {
      std::cerr << fmt::format("ddp-agentd: --cpus '{}': expected a cpulist like 0-15,32-47\n", cpus);
      return 2;
    }
  }
  opts.heartbeat_timeout = ddp::Millis(static_cast<long long>(heartbeat_timeout_s * 1000));
  try {
    if (stdio) {
      auto secret = read_secret_line();
      if (!secret || secret->size() < ddp::proto::kMinSecretChars) {
        std::cerr << "ddp-agentd: --stdio: stdin's first line must be the run's secret (32+ characters); "
                     "ddpctl launch --ssh writes it\n";
        return 2;
      }
      opts.keys = ddp::proto::Keyring({{"ssh", *secret}});
      if (!connect.empty()) {
        auto back = ddp::hostlist::parse_endpoint(connect);
        auto tag = read_secret_line();
        if (!back.ok() || !back.endpoint.port) {
          std::cerr << fmt::format("ddp-agentd: --connect '{}': expected HOST:PORT\n", connect);
          return 2;
        }
        if (!tag || tag->empty()) {
          std::cerr << "ddp-agentd: --connect: stdin's second line must be the tag the launcher gave this node\n";
          return 2;
        }
        opts.connect_host = back.endpoint.host;
        opts.connect_port = *back.endpoint.port;
        opts.connect_tag = *tag;
      }
      if (log_dir->count() == 0) opts.log_dir = default_stdio_log_dir();
    } else if (!secret_env.empty()) {
      // Read, then removed, so that no worker inherits it (DDP_* is scrubbed from workers too).
      const char* value = std::getenv(secret_env.c_str());
      const std::string secret = value ? value : "";
      ::unsetenv(secret_env.c_str());
      if (secret.size() < ddp::proto::kMinSecretChars) {
        std::cerr << fmt::format("ddp-agentd: --secret-env {}: the variable must hold the secret (32+ characters){}\n",
                                 secret_env, value ? "" : ", but it is not set");
        return 2;
      }
      opts.keys = ddp::proto::Keyring({{"run", secret}});
      // A per-run agent runs as the user: /var/log/ddpctl is not theirs.
      if (log_dir->count() == 0) opts.log_dir = default_stdio_log_dir();
    } else {
      opts.keys = ddp::net::load_token_file(token_file);
      // Per-user tokens: a per-run agent (--stdio, --secret-env) already runs as its user.
      if (cfg && !cfg->key_users.empty()) {
        std::vector<std::string> ids;
        for (const auto& k : opts.keys.keys()) ids.push_back(k.id);
        opts.key_users = ddp::agentconfig::resolve_key_users(*cfg, ids, ::geteuid());
      }
    }
    if (announce) opts.announce = [](std::uint16_t port) { return ddp::slurm::announce_line(port); };
    // The job's store on node rank 0 serves every rank of the job (two connections each from
    // PyTorch 1.13) and takes at most half the open-files limit: as high as the hard limit
    // allows, which the service unit sets (LimitNOFILE), also for an agent started otherwise
    // (over SSH or srun: the login's soft limit, often 1024). Its workers inherit it, as under
    // the unit.
    if (rlimit rl{}; ::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      ::setrlimit(RLIMIT_NOFILE, &rl);
    }
    return ddp::agent::run_agent(std::move(opts));
  } catch (const ddp::agentconfig::ConfigError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const ddp::net::TokenError& e) {
    std::cerr << "ddp-agentd: " << e.what() << "\n";
    return 2;
  } catch (const ddp::agent::AgentError& e) {
    std::cerr << "ddp-agentd: " << e.what() << "\n";
    return 2;
  }
}

// The edge of a multi-node launch (see reach.hpp).
#include "multinode/reach.hpp"

#include "common/log.hpp"
#include "common/strings.hpp"
#include "common/version.hpp"
#include "contract/dry_run.hpp"
#include "coordinator/dry_run.hpp"
#include "coordinator/gather.hpp"
#include "facts/model.hpp"
#include "net/token_file.hpp"
#include "proto/crypto.hpp"
#include "slurm/step.hpp"
#include "ssh/dialer.hpp"

#include <fmt/format.h>
#include <boost/asio/ip/address.hpp>

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <filesystem>
#include <memory>

namespace ddp::multinode {

namespace {

std::string token_path(const LaunchFlags& flags) {
  return flags.token_file.empty() ? net::find_client_token_file() : flags.token_file;
}

// A fresh secret per run, known only to us and to the agents we start.
std::string fresh_secret() {
  const auto nonce = proto::random_nonce();
  return proto::to_hex(std::string_view(reinterpret_cast<const char*>(nonce.data()), nonce.size()));
}

// As the coordinator writes a peer's address: an IPv4 one mapped into IPv6 as IPv4.
std::string plain(const std::string& text) {
  boost::system::error_code ec;
  auto a = boost::asio::ip::make_address(text, ec);
  if (ec) return text;
  if (a.is_v6() && a.to_v6().is_v4_mapped())
    a = boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped, a.to_v6());
  return a.to_string();
}

}  // namespace

Resolved resolve_here(const std::string& host) {
  boost::system::error_code literal;
  const auto addr = boost::asio::ip::make_address(host, literal);
  if (!literal) return {{plain(addr.to_string())}, {}};
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;  // and no AI_ADDRCONFIG, as net::dial
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res); rc != 0) return {{}, ::gai_strerror(rc)};
  Resolved out;
  for (auto* ai = res; ai; ai = ai->ai_next) {
    char text[NI_MAXHOST];
    if (::getnameinfo(ai->ai_addr, ai->ai_addrlen, text, sizeof text, nullptr, 0, NI_NUMERICHOST) != 0) continue;
    std::string a = text;
    if (auto pct = a.find('%'); pct != std::string::npos) a.resize(pct);  // a zone is the link's, not the peer's
    a = plain(a);
    if (std::find(out.addresses.begin(), out.addresses.end(), a) == out.addresses.end()) out.addresses.push_back(a);
  }
  ::freeaddrinfo(res);
  if (out.addresses.empty()) out.error = "no address";
  return out;
}

std::string own_agent_binary() {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("ddp-agentd") : (exe.parent_path() / "ddp-agentd").string();
}

void prepare_reach(MultiNodePlan& plan, const LaunchFlags& flags) {
  auto& opts = plan.options;
  switch (plan.reach) {
    case Reach::ssh: {
      // The secret travels inside each SSH channel (the agent's stdin), never on a command line
      // or in a file.
      const auto secret = fresh_secret();
      opts.keys = proto::Keyring({{"ssh", secret}});
      ssh::DialerOptions so;
      so.accept_new = flags.ssh_accept_new;
      so.timeout = Millis(static_cast<long long>(flags.ssh_timeout_s * 1000));
      so.max_parallel = flags.ssh_parallel;
      so.secret = secret;
      so.agent_binary = own_agent_binary();
      so.agent_version = ddp::kAgentVersion;
      so.verbose_agent = log::get("ssh")->should_log(spdlog::level::debug);
      so.connect_back = plan.connect_back;
      if (!std::filesystem::exists(so.agent_binary)) {
        throw std::runtime_error(
            fmt::format("--ssh: our ddp-agentd is not at {} (it must sit beside ddpctl, to be uploaded to nodes "
                        "that lack it)",
                        so.agent_binary));
      }
      opts.make_dialer = [so](boost::asio::io_context& io) { return std::make_unique<ssh::Dialer>(io, so); };
      return;
    }
    case Reach::slurm: {
      // As over SSH: srun carries the secret to the agents in their environment
      // (slurm::kSecretEnv), which they read and remove; never a command-line word or a file.
      const auto secret = fresh_secret();
      opts.keys = proto::Keyring({{"run", secret}});
      slurm::StepDialerOptions so;
      so.step.nodes = opts.nodes;
      so.step.agent = own_agent_binary();
      so.step.verbose_agent = log::get("slurm")->should_log(spdlog::level::debug);
      so.step.extra = flags.srun_args;
      so.step.job_name = "ddpctl-" + opts.spec.name;
      so.secret = secret;
      so.env = opts.launcher_env;
      so.workdir = plan.launcher_cwd;
      so.stop_grace = opts.spec.stop_grace;
      if (!std::filesystem::exists(so.step.agent)) {
        throw std::runtime_error(
            fmt::format("--slurm: our ddp-agentd is not at {} (srun runs it from there on every node)", so.step.agent));
      }
      opts.make_dialer = [so](boost::asio::io_context& io) { return std::make_unique<slurm::StepDialer>(io, so); };
      return;
    }
    case Reach::tcp:
    case Reach::standing:
      opts.keys = net::load_token_file(token_path(flags));
      return;
  }
}

coordinator::SubmitOptions submit_options(const MultiNodePlan& plan, const LaunchFlags& flags) {
  const auto& opts = plan.options;
  coordinator::SubmitOptions so;
  so.host = plan.coordinator_host;
  so.port = plan.coordinator_port;
  so.keys = net::load_token_file(token_path(flags));
  so.job_id = opts.job_id;
  so.user = opts.user;
  so.payload.spec = opts.spec;
  so.payload.forward_env = net::forwarded_env(opts.launcher_env, opts.spec.env_forward);
  so.nodes = opts.nodes;
  so.detach = flags.detach;
  so.quiet = flags.quiet;
  so.show_ranks = opts.show_ranks;
  so.result_json = opts.result_json;
  so.tls = flags.tls;
  return so;
}

std::string master_address(const net::NodeEntry& first, Reach reach, const std::optional<std::string>& dialed,
                           const std::function<Resolved(const std::string&)>& resolve) {
  if (dialed && !dialed->empty()) return *dialed;
  switch (reach) {
    case Reach::ssh:
      return contract::run_time_value(fmt::format(
          "{}'s address as its sshd sees the SSH connection (the server side of SSH_CONNECTION)", first.name));
    case Reach::slurm:
      return contract::run_time_value(
          fmt::format("the address {}'s agent connects back to this launcher from", first.name));
    case Reach::tcp:
    case Reach::standing:
      break;
  }
  const auto found = resolve(first.host);
  if (found.addresses.empty()) {
    return contract::run_time_value(
        fmt::format("{} does not resolve here ({}); the coordinator gives the address it reaches {}'s agent at",
                    first.host, found.error, first.name));
  }
  if (found.addresses.size() > 1) {
    return contract::run_time_value(fmt::format("the first of {} ({} here) that {}'s agent answers on",
                                                join(found.addresses, ", "), first.host, first.name));
  }
  return found.addresses.front();
}

DryRunResult dry_run(const MultiNodePlan& plan, const LaunchFlags& flags, bool show_env) {
  const auto& opts = plan.options;
  DryRunResult out;
  auto entries = net::node_entries(opts.nodes, 29410, plan.reach == Reach::ssh);
  std::vector<facts::NodeFacts> facts;
  std::optional<std::string> dialed;
  if (flags.facts.empty()) {
    const auto keys = net::load_token_file(token_path(flags));
    auto gathered = coordinator::gather_facts(opts.nodes, keys, opts.user, Millis(15000), nullptr, flags.tls);
    for (auto& g : gathered) {
      if (!g.facts) {
        out.errors.push_back(fmt::format("{}: {}", g.node, g.error));
        continue;
      }
      facts.push_back(facts::from_json(*g.facts, "agent " + g.node));
    }
    if (!out.errors.empty()) {
      out.errors.push_back("--dry-run needs every node's facts (or give them with --facts)");
      return out;
    }
    if (!gathered.empty()) dialed = gathered.front().address;
  } else {
    for (auto f : split(flags.facts, ',')) facts.push_back(facts::load_facts_file(std::string(trim(f))));
  }
  if (facts.size() == 1) facts.resize(entries.size(), facts[0]);
  if (facts.size() != entries.size()) {
    out.errors.push_back(fmt::format("--facts names {} files for {} nodes: give one per node, or one for all",
                                     facts.size(), entries.size()));
    return out;
  }
  const auto master = entries.empty() ? std::string() : master_address(entries.front(), plan.reach, dialed);
  out.plan = coordinator::dry_run_plan(opts.spec, entries, facts, opts.job_id, opts.launcher_env, master, show_env);
  return out;
}

}  // namespace ddp::multinode

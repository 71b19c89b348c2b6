// ddpctl torchrun: torchrun's own single-node command line (jobspec/torchrun.hpp parses it),
// run as a local launch. Replacing `torchrun` with `ddpctl torchrun` in a launch script is
// meant to just work; what ddpctl does with each flag is in docs/torchrun.md.
#include "commands.hpp"
#include "common/host.hpp"
#include "common/log.hpp"
#include "facts/discover.hpp"
#include "jobspec/torchrun.hpp"
#include "launch/local_launcher.hpp"

#include <fmt/format.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <iostream>
#include <memory>

namespace ddpctl {

namespace {

// This machine, for --master-addr and --rdzv-endpoint: a loopback or own address, or our name.
// No name lookup (a DNS that does not answer would hang the launch).
bool is_this_machine(std::string_view host) {
  const std::string h(host);
  if (h == "localhost" || h == "localhost.localdomain") return true;
  const auto name = ddp::own_hostname();
  if (h == name || h == name.substr(0, name.find('.'))) return true;
  in_addr v4{};
  in6_addr v6{};
  const bool is_v4 = ::inet_pton(AF_INET, h.c_str(), &v4) == 1;
  const bool is_v6 = !is_v4 && ::inet_pton(AF_INET6, h.c_str(), &v6) == 1;
  if (!is_v4 && !is_v6) return false;
  if (is_v4 && (ntohl(v4.s_addr) >> 24) == 127) return true;
  if (is_v6 && IN6_IS_ADDR_LOOPBACK(&v6)) return true;
  // "Any address" (a bind-all habit, `--master-addr 0.0.0.0`): a connect to it reaches this
  // machine, as it did for the workers under torchrun.
  if (is_v4 && v4.s_addr == htonl(INADDR_ANY)) return true;
  if (is_v6 && IN6_IS_ADDR_UNSPECIFIED(&v6)) return true;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return false;
  std::unique_ptr<ifaddrs, decltype(&::freeifaddrs)> owner(list, ::freeifaddrs);
  for (auto* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr) continue;
    if (is_v4 && a->ifa_addr->sa_family == AF_INET &&
        reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr == v4.s_addr) {
      return true;
    }
    if (is_v6 && a->ifa_addr->sa_family == AF_INET6 &&
        IN6_ARE_ADDR_EQUAL(&reinterpret_cast<const sockaddr_in6*>(a->ifa_addr)->sin6_addr, &v6)) {
      return true;
    }
  }
  return false;
}

int run_torchrun(const std::vector<std::string>& words) {
  ddp::jobspec::TorchrunContext ctx;
  ctx.env = ddp::own_environment();
  ctx.is_local = is_this_machine;
  ddp::jobspec::TorchrunPlan plan;
  try {
    plan = ddp::jobspec::parse_torchrun(words, ctx);
  } catch (const ddp::jobspec::TorchrunError& e) {
    std::cerr << "ddpctl torchrun: " << e.what() << "\n";
    return 2;
  } catch (const ddp::jobspec::JobSpecError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  if (plan.help) {
    std::cout << ddp::jobspec::torchrun_help();
    return 0;
  }
  auto log = ddp::log::get("launch");
  for (const auto& n : plan.notes) {
    // What changes behaviour is said; what ddpctl does as torchrun would is for -v.
    if (n.kind == ddp::jobspec::NoteKind::ignored)
      log->warn("{}: ignored: {}", n.flag, n.text);
    else
      log->debug("{}: {}", n.flag, n.text);
  }
  ddp::launch::LaunchOptions opts;
  opts.spec = std::move(plan.spec);
  opts.show_ranks = std::move(plan.show_ranks);
  opts.quiet = plan.quiet;
  if (plan.nproc_auto) {
    // torchrun's auto: one worker per GPU when there are GPUs, else one per CPU.
    try {
      auto o = ddp::facts::discover_options_from_env();
      o.load_libraries = false;
      o.use_nvml = false;
      o.topology_only = true;
      if (!ddp::facts::discover(o).gpus.empty()) opts.spec.nproc.kind = ddp::jobspec::Nproc::Kind::gpu;
    } catch (const std::exception& e) {
      log->debug("--nproc-per-node auto: no GPUs found ({}): one worker per CPU", e.what());
    }
  }
  try {
    return ddp::launch::run_local(std::move(opts));
  } catch (const ddp::launch::LaunchError& e) {
    std::cerr << "ddpctl torchrun: " << e.what() << "\n";
    return e.exit_code();
  }
}

}  // namespace

Command add_torchrun_command(CLI::App& root) {
  auto* sub = root.add_subcommand("torchrun",
                                  "torchrun's own command line on this node: ddpctl torchrun "
                                  "--nproc-per-node 2 train.py ARGS (ddpctl torchrun --help)");
  sub->prefix_command();  // never parsed by CLI11: main() hands the words to run_raw
  Command c{sub, [] { return 2; }, {}, {}};
  c.run_raw = run_torchrun;
  return c;
}

}  // namespace ddpctl

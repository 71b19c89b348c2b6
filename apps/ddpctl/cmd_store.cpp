// `ddpctl store serve --listen HOST:PORT [--allow ADDR ...] [--world-size N] [--threads N|auto]
// [--max-size BYTES] [--max-keys N] [--max-inflight BYTES] [--protocol RELEASE]`: a standalone c10d TCPStore-compatible
// server (the one launches embed), until SIGINT/SIGTERM. From this host it serves only its own user and root. Prints
// "listening on HOST:PORT" on stdout once it listens (port 0 picks a free port). SIGUSR1 logs who waits for what;
// standalone, ranks come from the clients' RANK variable.
#include "commands.hpp"

#include "common/log.hpp"
#include "jobspec/jobspec.hpp"
#include "store/report.hpp"
#include "store/server.hpp"

#include <fmt/format.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace ddpctl {
namespace {

struct ServeArgs {
  std::string listen = "127.0.0.1:29500";
  std::vector<std::string> allow;
  int world_size = 0;
  std::string threads = "auto";
  std::size_t max_size = ddp::store::Totals{}.max_bytes;
  std::size_t max_keys = ddp::store::Totals{}.max_keys;
  std::size_t max_inflight = ddp::store::Totals{}.max_inflight_bytes;
  std::string protocol = "auto";  // the clients' PyTorch release, for those without VALIDATE (1.13–2.1)
};

// "HOST:PORT", "[V6]:PORT".
std::pair<std::string, uint16_t> parse_listen(const std::string& text) {
  std::string host, port;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      throw std::runtime_error("--listen `" + text + "`: expected [ADDRESS]:PORT");
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string::npos) throw std::runtime_error("--listen `" + text + "`: expected HOST:PORT");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  if (host.empty()) throw std::runtime_error("--listen `" + text + "`: the host is empty (use 0.0.0.0 or ::)");
  char* end = nullptr;
  long p = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || p < 0 || p > 65535) {
    throw std::runtime_error("--listen `" + text + "`: the port must be 0..65535");
  }
  return {host, static_cast<uint16_t>(p)};
}

int serve(const ServeArgs& args) {
  auto [host, port] = parse_listen(args.listen);
  boost::asio::io_context io;
  // As the job file's store.threads: auto, or 0 to kMaxStoreThreads.
  if (args.protocol != "auto" && !ddp::store::parse_release(args.protocol)) {
    throw std::runtime_error(
        fmt::format("--protocol `{}`: expected auto or the clients' PyTorch release from 1.13 on, such as 1.13 or 2.1",
                    args.protocol));
  }
  int threads = ddp::jobspec::kAutoThreads;
  if (args.threads != "auto") {
    const auto& t = args.threads;
    const bool digits =
        !t.empty() && t.size() <= 2 && std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits || std::stoi(t) > ddp::jobspec::kMaxStoreThreads) {
      throw std::runtime_error(
          fmt::format("--threads `{}`: expected an integer from 0 to {}, or auto", t, ddp::jobspec::kMaxStoreThreads));
    }
    threads = std::stoi(t);
  }
  ddp::store::Totals totals;
  totals.max_bytes = args.max_size;
  totals.max_keys = args.max_keys;
  totals.max_inflight_bytes = args.max_inflight;
  ddp::store::Server server(io, {.host = host,
                                 .port = port,
                                 .allowed_peers = args.allow,
                                 .totals = totals,
                                 .threads = ddp::store::threads_for(threads),
                                 .legacy = ddp::store::legacy_hint(args.protocol, std::nullopt)});
  const pid_t self = getpid();
  server.set_rank_resolver({
      .candidate_pids =
          [self] {
            auto pids = ddp::store::all_pids();
            std::erase(pids, self);
            return pids;
          },
      .rank_of_pid = [](pid_t pid) { return ddp::store::rank_from_environ(pid); },
  });
  // The signals are ours before anyone can know the port: with I/O threads, clients are served
  // from start() on, and a SIGUSR1 or SIGTERM that came before these handlers would kill the
  // store with its default action (its clients then see their connections reset).
  auto log = ddp::log::get("store");
  boost::asio::signal_set stop_signals(io, SIGINT, SIGTERM);
  stop_signals.async_wait([&](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    log->info("store stopping on signal {}", sig);
    server.stop();
    io.stop();
  });
  boost::asio::signal_set report_signal(io, SIGUSR1);
  std::function<void()> arm_report = [&] {
    report_signal.async_wait([&](const boost::system::error_code& ec, int) {
      if (ec) return;
      auto report = server.waiters();
      auto text = ddp::store::format_wait_report(report, args.world_size, ddp::store::Clock::now());
      log->info("store: {} connections, {} keys; {}", report.connections, report.keys,
                text.empty() ? "nobody is waiting" : "waiting:\n" + text);
      arm_report();
    });
  };
  arm_report();
  server.start();
  std::cout << "listening on " << server.address() << std::endl;
  io.run();
  return 0;
}

}  // namespace

Command add_store_command(CLI::App& root) {
  auto* sub = root.add_subcommand("store", "c10d TCPStore-compatible store server");
  sub->require_subcommand(1);
  auto args = std::make_shared<ServeArgs>();
  auto* serve_cmd = sub->add_subcommand("serve", "serve a store until SIGINT/SIGTERM (SIGUSR1: log who waits)");
  serve_cmd->add_option("--listen", args->listen, "HOST:PORT to listen on ([::]:PORT for dual-stack; port 0: any)")
      ->capture_default_str();
  serve_cmd->add_option("--allow", args->allow,
                        "address of another host allowed to connect (repeatable); from this host only this "
                        "process's user and root may");
  serve_cmd->add_option("--max-size", args->max_size, "bytes of keys, values and queue items the store may hold")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::numeric_limits<std::size_t>::max()));
  serve_cmd->add_option("--max-keys", args->max_keys, "keys the store may hold")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::numeric_limits<std::size_t>::max()));
  serve_cmd
      ->add_option("--max-inflight", args->max_inflight,
                   "bytes of requests being read and replies not yet written, over all connections; past it "
                   "the connection holding the most is closed")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1}, std::numeric_limits<std::size_t>::max()));
  serve_cmd
      ->add_option("--protocol", args->protocol,
                   "the clients' PyTorch release (1.13, 2.0, 2.1, ...): how clients that send no VALIDATE (1.13-2.1) "
                   "are read where their releases differ; auto refuses those operations")
      ->capture_default_str();
  serve_cmd->add_option("--world-size", args->world_size, "expected number of ranks (for the wait report)");
  serve_cmd
      ->add_option("--threads", args->threads,
                   "I/O threads serving the connections: auto (a quarter of the usable CPUs, 1..8), 1..64, or 0 (the "
                   "main thread)")
      ->capture_default_str();
  return {sub, [args] { return serve(*args); }};
}

}  // namespace ddpctl

// fake_agents: N agents in one process speaking the real protocol (lib/proto over lib/net), for
// the rendezvous-at-scale benchmark (bench/rendezvous/run.py). Each listens on 127.0.0.1:BASE+i,
// authenticates the coordinator with the token file, joins with one worker (with the clock stamps
// a real agent's join carries), and on `start` reports that worker started at once and, --work-ms
// later (default 0), that it exited 0, so the job succeeds. Everything else about a node (facts,
// processes, logs) is left out: this measures the coordinator and the protocol, not worker
// start-up. A worker that runs a while keeps the exits out of the rendezvous: with 0, the
// simulated agents' own exit reports for the first nodes delay their handling of the last
// nodes' assigns, which real agents on machines of their own would not.
//
// Each agent also beats as a real agent with its default heartbeat_timeout (6 s) does: every
// second once established, then, once a coordinator of protocol version 7 offers its job, at the
// offer's interval or a third of --agent-timeout-ms (6 s), whichever is shorter
// (proto/heartbeat.hpp), said in its join;
// --heartbeat-ms fixes the interval instead (0: no beats). Beats are sent
// once established, echoing the coordinator's last one (t0_us, rx_us) as a real agent does; the
// agents' beats are spread evenly over the interval, as independent machines' would be. --out
// also counts the beats each way, and the coordinator's that came within 100 ms of the agent's
// own (answers).
//
//   fake_agents --count N --base-port P --token-file F --out times.json [--work-ms MS] [--heartbeat-ms MS]
// prints "ready" once every port listens, "started" once every node has its start (the
// benchmark measures the steady state, heartbeats only, after it); writes {first_accept_us, last_assign_us,
// last_start_us, assigned, finished, starts_in_assign, separate_starts, setup_cpu_us} (system clock, microseconds; the
// CPU time spent before "ready") when every agent's job
// is done or its link is gone. --version 3 speaks only the previous protocol version (the
// coordinator then sends each node a start of its own); tests/integration/coordinator uses it.
#include "net/connection.hpp"
#include "net/token_file.hpp"
#include "proto/heartbeat.hpp"

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <vector>

namespace asio = boost::asio;
using ddp::net::Connection;
using ddp::net::tcp;
using nlohmann::json;

namespace {

// This process's CPU time (user + system) so far, in microseconds.
std::int64_t cpu_us() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000LL + ru.ru_utime.tv_usec + ru.ru_stime.tv_usec;
}

std::int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct Bench {
  asio::io_context io;
  ddp::proto::Keyring keys;
  int count = 0;
  std::vector<std::unique_ptr<tcp::acceptor>> acceptors;
  std::int64_t first_accept_us = 0, last_assign_us = 0, last_start_us = 0;
  // When each step was last reached by any agent: where the time goes.
  std::int64_t last_accept_us = 0, last_established_us = 0, last_offer_us = 0, rank0_assign_us = 0, first_assign_us = 0;
  // This process's CPU time at the first accept and at the last assignment: how busy the agents'
  // side was during the rendezvous (the rest of the two cores is the coordinator's).
  std::int64_t cpu_first_accept_us = 0, cpu_last_assign_us = 0;
  int assigned = 0, finished = 0, closed = 0, started = 0;
  int starts_in_assign = 0, separate_starts = 0;
  std::uint32_t version = 0;    // 0: every version this build speaks
  int work_ms = 0;              // how long each worker "runs"
  int heartbeat_ms = -1;        // -1: as a real agent (above); 0: no heartbeats; else fixed
  std::vector<int> beat_ms;     // each agent's interval now
  int agent_timeout_ms = 6000;  // the agents' own heartbeat_timeout (a real agent's default)
  // The coordinator's last heartbeat per agent (now_us, and ours when it arrived), echoed.
  std::vector<std::int64_t> echo_t0, echo_rx;
  // When each agent last beat; how many beats we sent, how many the coordinator sent us, and how
  // many of those came within 100 ms of our own (answers to ours, not beats of its own).
  std::vector<std::int64_t> beat_sent_us;
  int agent_beats = 0, coordinator_beats = 0, coordinator_answers = 0;

  void accept(int i) {
    acceptors[i]->async_accept([this, i](boost::system::error_code ec, tcp::socket s) {
      if (ec) return;
      if (!first_accept_us) {
        first_accept_us = now_us();
        cpu_first_accept_us = cpu_us();
      }
      last_accept_us = now_us();
      // One coordinator per agent: no second accept (a real agent would answer a second with
      // "busy"). The listener stays open, as a real agent's does.
      serve(i, std::move(s));
    });
  }

  void serve(int i, tcp::socket s) {
    ddp::proto::ServerConfig sc;
    sc.role = ddp::proto::Role::agent;
    sc.name = fmt::format("fake{}", i);
    sc.software = "fake_agents";
    sc.keys = keys;
    sc.nonce = ddp::proto::random_nonce();
    sc.accept_roles = {ddp::proto::Role::coordinator};
    if (version) sc.versions = {version};
    auto conn = Connection::make(std::move(s), ddp::proto::Session::server(sc), sc.name, "bench", ddp::Millis(60000));
    Connection* raw = conn.get();
    conn->start({[this, i, raw](const ddp::proto::PeerInfo&) {
                   last_established_us = now_us();
                   if (beat_ms[i] > 0) {
                     // Spread: agent i's first beat at its share of the interval.
                     beat(raw->shared_from_this(), i,
                          std::chrono::microseconds(std::int64_t(beat_ms[i]) * 1000 * i / count));
                   }
                 },
                 [this, raw, i](ddp::proto::Message m) { on_message(*raw, i, m); },
                 [this](const std::string&) {
                   if (++closed == count) io.stop();
                 }});
  }

  void beat(std::shared_ptr<Connection> conn, int i, std::chrono::microseconds after) {
    auto timer = std::make_shared<asio::steady_timer>(io, after);
    timer->async_wait([this, timer, conn, i](boost::system::error_code ec) {
      if (ec || !conn->established()) return;
      std::optional<ddp::proto::Session::Echo> echo;
      if (echo_t0[i]) echo = ddp::proto::Session::Echo{echo_t0[i], echo_rx[i]};
      conn->send_heartbeat(now_us(), echo);
      beat_sent_us[i] = now_us();
      ++agent_beats;
      beat(conn, i, std::chrono::milliseconds(beat_ms[i]));
    });
  }

  bool send(Connection& c, const char* type, json fields) {
    return c.send(c.session().message(type, std::move(fields)));
  }

  void on_message(Connection& c, int i, const ddp::proto::Message& m) {
    const auto& b = m.body;
    if (m.type == "heartbeat") {
      if (m.beat.now_us) {
        echo_t0[i] = *m.beat.now_us;
        echo_rx[i] = now_us();
      }
      ++coordinator_beats;
      if (beat_sent_us[i] && now_us() - beat_sent_us[i] < 100'000) ++coordinator_answers;
      return;
    }
    if (m.type == "job_offer") {
      last_offer_us = now_us();
      json join{{"t0_us", b["t0_us"]},   {"rx_us", last_offer_us},           {"tx_us", now_us()},
                {"job_id", b["job_id"]}, {"node", fmt::format("fake{}", i)}, {"nproc", 1}};
      if (c.session().version() >= 7) {
        if (heartbeat_ms < 0 && b.contains("heartbeat_ms")) {
          beat_ms[i] =
              static_cast<int>(ddp::proto::agent_beat_interval(ddp::Millis(b["heartbeat_ms"].get<std::int64_t>()),
                                                               ddp::Millis(agent_timeout_ms))
                                   .count());
        }
        // Within the schema's bound: a fixed --heartbeat-ms above 10 s says 10 s (the coordinator
        // then beats to it on its own every 12.5 s).
        if (beat_ms[i] > 0)
          join["heartbeat_ms"] = std::min(beat_ms[i], static_cast<int>(ddp::proto::kBeatCeiling.count()));
      }
      send(c, "join", std::move(join));
    } else if (m.type == "assign") {
      last_assign_us = now_us();
      if (b["node_rank"] == 0)
        rank0_assign_us = last_assign_us;
      else if (!first_assign_us)
        first_assign_us = last_assign_us;
      cpu_last_assign_us = cpu_us();
      ++assigned;
      // Node rank 0 says its store is up (the coordinator assigns the others after that).
      if (b["node_rank"] == 0)
        send(c, "ready", {{"job_id", b["job_id"]}, {"round", b["round"]}, {"master_port", 29500}});
    }
    // An assign sent once the round is complete is also its start (protocol version 4).
    if (m.type == "start" || (m.type == "assign" && b.value("start", false))) {
      ++(m.type == "start" ? separate_starts : starts_in_assign);
      last_start_us = now_us();
      if (++started == count) std::cout << "started" << std::endl;
      const json job = b["job_id"], round = b["round"];
      send(c, "worker_started", {{"job_id", job}, {"round", round}, {"local_rank", 0}, {"pid", 1000 + i}});
      if (work_ms <= 0) return exit_worker(c, i, job, round);
      auto timer = std::make_shared<asio::steady_timer>(io, std::chrono::milliseconds(work_ms));
      timer->async_wait([this, timer, conn = c.shared_from_this(), i, job, round](boost::system::error_code) {
        exit_worker(*conn, i, job, round);
      });
    }
  }

  void exit_worker(Connection& c, int i, const json& job, const json& round) {
    // Counted only when both reports went out (a link already gone sends nothing).
    const bool sent = send(c, "worker_exited",
                           {{"job_id", job},
                            {"round", round},
                            {"local_rank", 0},
                            {"pid", 1000 + i},
                            {"exit_code", 0},
                            {"time_us", now_us()}}) &&
                      send(c, "attempt_finished", {{"job_id", job}, {"round", round}, {"ok", true}});
    if (sent) ++finished;
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fake_agents: N protocol-speaking agents for the rendezvous benchmark"};
  Bench bench;
  int base_port = 0;
  std::string token_file, out;
  app.add_option("--count", bench.count)->required()->check(CLI::Range(1, 16384));
  app.add_option("--base-port", base_port)->required()->check(CLI::Range(1024, 65535));
  app.add_option("--token-file", token_file)->required();
  app.add_option("--out", out)->required();
  app.add_option("--work-ms", bench.work_ms, "how long each worker runs before it exits 0")
      ->check(CLI::Range(0, 600000));
  app.add_option("--heartbeat-ms", bench.heartbeat_ms,
                 "each agent's heartbeat interval, fixed (0: none; default: as a real agent, from the offer)")
      ->check(CLI::Range(0, 60000));
  app.add_option("--agent-timeout-ms", bench.agent_timeout_ms,
                 "the agents' own heartbeat_timeout, which bounds their interval (default 6000, an agent's default)")
      ->check(CLI::Range(2000, 3600000));
  app.add_option("--version", bench.version, "speak only this protocol version")->check(CLI::Range(3, 7));
  CLI11_PARSE(app, argc, argv);

  // Two descriptors per agent (listener, connection): raise the soft limit as far as allowed.
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < static_cast<rlim_t>(2 * bench.count + 32)) {
    std::cerr << fmt::format("fake_agents: {} agents need {} descriptors; the limit is {}\n", bench.count,
                             2 * bench.count + 32, rl.rlim_cur);
    return 2;
  }
  bench.keys = ddp::net::load_token_file(token_file);
  bench.echo_t0.assign(bench.count, 0);
  bench.echo_rx.assign(bench.count, 0);
  bench.beat_sent_us.assign(bench.count, 0);
  bench.beat_ms.assign(bench.count, bench.heartbeat_ms < 0 ? 1000 : bench.heartbeat_ms);
  for (int i = 0; i < bench.count; ++i) {
    auto a = std::make_unique<tcp::acceptor>(bench.io);
    tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), static_cast<std::uint16_t>(base_port + i));
    a->open(ep.protocol());
    a->set_option(asio::socket_base::reuse_address(true));
    a->bind(ep);
    a->listen(64);
    bench.acceptors.push_back(std::move(a));
    bench.accept(i);
  }
  const auto setup_cpu_us = cpu_us();  // 4096 listeners and the rest: not the launch's
  std::cout << "ready" << std::endl;
  bench.io.run();
  std::ofstream(out) << json{{"first_accept_us", bench.first_accept_us},
                             {"last_assign_us", bench.last_assign_us},
                             {"last_start_us", bench.last_start_us},
                             {"last_accept_us", bench.last_accept_us},
                             {"last_established_us", bench.last_established_us},
                             {"last_offer_us", bench.last_offer_us},
                             {"rank0_assign_us", bench.rank0_assign_us},
                             {"first_assign_us", bench.first_assign_us},
                             {"agents_cpu_us", bench.cpu_last_assign_us - bench.cpu_first_accept_us},
                             {"setup_cpu_us", setup_cpu_us},
                             {"assigned", bench.assigned},
                             {"agent_beats", bench.agent_beats},
                             {"beat_ms", bench.beat_ms},
                             {"coordinator_beats", bench.coordinator_beats},
                             {"coordinator_answers", bench.coordinator_answers},
                             {"finished", bench.finished},
                             {"starts_in_assign", bench.starts_in_assign},
                             {"separate_starts", bench.separate_starts}}
                            .dump()
                     << "\n";
  return 0;
}

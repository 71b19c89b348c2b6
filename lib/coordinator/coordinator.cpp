// The coordinator edge: agent connections, clock offsets, the rendezvous and round machines'
// events and effects, the live stream, per-rank files on the launching machine, reports and the exit
// status. See coordinator.hpp for the flow and policy.
#include "coordinator/coordinator.hpp"
#include "coordinator/stacks_gather.hpp"
#include "hang/flight.hpp"

#include "common/version.hpp"
#include "coordinator/job_clock.hpp"
#include "coordinator/round_machine.hpp"

#include "hang/progress.hpp"

#include "attempt/files.hpp"
#include "attempt/report.hpp"
#include "binding/binding.hpp"
#include "common/log.hpp"
#include "common/strings.hpp"
#include "common/text.hpp"
#include "control/paths.hpp"
#include "control/server.hpp"
#include "facts/consistency.hpp"
#include "net/connection.hpp"
#include "net/wire.hpp"
#include "proto/clock_sync.hpp"
#include "proto/heartbeat.hpp"
#include "rendezvous/rendezvous.hpp"
#include "supervisor/guardian.hpp"
#include "supervisor/output.hpp"
#include "supervisor/process.hpp"

#include <boost/asio.hpp>

#include <fmt/format.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <thread>

namespace ddp::coordinator {

namespace asio = boost::asio;
namespace fs = std::filesystem;
namespace rdzv = ddp::rendezvous;
using net::Connection;
using net::tcp;
using nlohmann::json;

namespace {

// Redial backoff for an agent that is not reachable (yet): 0.5 s doubling to 5 s.
constexpr auto kRedialMin = std::chrono::milliseconds(500);
constexpr auto kRedialMax = std::chrono::milliseconds(5000);

// A time on the job's clock (job_clock.hpp) as a report's wall time.
launch::SysTime to_sys(rdzv::TimePoint t) {
  return JobClock::to_wall(t);
}

std::string plain_address(const asio::ip::address& addr) {
  auto a = addr;
  if (a.is_v6() && a.to_v6().is_v4_mapped()) a = asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6());
  return a.to_string();
}

// Why a node's agent could not be dialled, with what to check: the error alone ("Connection
// refused") does not say that it is the agent that is missing.
std::string dial_failure(const boost::system::error_code& ec, std::uint16_t port) {
  namespace e = asio::error;
  if (ec == e::connection_refused)
    return fmt::format("connection refused: is ddp-agentd running there, listening on port {}?", port);
  if (ec == e::host_not_found || ec == e::host_not_found_try_again || ec == e::no_data)
    return fmt::format("{}: is the host name in --nodes right?", ec.message());
  if (ec == e::timed_out)
    return fmt::format("no answer ({}): is the host up, and port {} open through its firewall?", ec.message(), port);
  if (ec == e::host_unreachable || ec == e::network_unreachable)
    return fmt::format("{}: is the host up and its address right?", ec.message());
  return ec.message();
}

class Coordinator {
 public:
  explicit Coordinator(CoordinatorOptions opts)
      : opts_(std::move(opts)),
        signals_(io_),
        user_signals_(io_),
        tick_timer_(io_),
        heartbeat_timer_(io_),
        progress_timer_(io_),
        hang_timer_(io_),
        interrupt_timer_(io_),
        log_(log::get("coord")),
        rdzv_(make_config(), now()) {}
  // Dropped without finish() (an exception): this process is not gone, so its guardian leaves
  // no record of a launcher that died.
  ~Coordinator() {
    if (recorder_) recorder_->done();
  }
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  int run() {
    payload_.spec = opts_.spec;
    payload_.forward_env = net::forwarded_env(opts_.launcher_env, opts_.spec.env_forward);
    offer_spec_ = proto::dump(net::to_json(payload_));
    if (opts_.make_dialer) dialer_ = opts_.make_dialer(io_);
    for (auto& e : entries_) {
      auto n = std::make_unique<Node>(io_);
      n->entry = e;
      n->label = dialer_ ? dialer_->describe(n->entry) : fmt::format("{} ({}:{})", e.name, e.host, e.port);
      // Names are unique (net::node_entries refuses a repeat); a pointer is kept only for a node
      // the map holds.
      if (auto [it, fresh] = nodes_.emplace(e.name, std::move(n)); fresh) sweep_.push_back(it->second.get());
    }
    report_.job_id = opts_.job_id;
    report_.status = "failed";
    report_.exit_code = 1;
    log_->info("job {}: {} node{} ({}), rendezvous: {}", opts_.job_id, entries_.size(), entries_.size() == 1 ? "" : "s",
               join_first(hosts_, ", ", 16), rdzv_.status());
    if (entries_.size() > static_cast<std::size_t>(opts_.spec.nnodes_max)) {
      say(spdlog::level::warn,
          "nnodes is {} but {} nodes are listed: the first {} agents to join run the job (whichever answer first, "
          "not the first listed), the others stay idle",
          opts_.spec.nnodes_min == opts_.spec.nnodes_max
              ? std::to_string(opts_.spec.nnodes_max)
              : fmt::format("{}:{}", opts_.spec.nnodes_min, opts_.spec.nnodes_max),
          entries_.size(), opts_.spec.nnodes_max);
    }
    started_ = clock_.wall_now();
    open_control_socket();
    if (opts_.on_listening) opts_.on_listening();
    if (opts_.own_signals) {
      signals_.add(SIGINT);
      signals_.add(SIGTERM);
      signals_.add(SIGHUP);
      signals_.add(SIGQUIT);
      wait_signals();
      user_signals_.add(SIGUSR1);
      user_signals_.add(SIGUSR2);
      wait_user_signals();
    }
    if (opts_.events.started) {
      // Posted onto this loop; once it has stopped, nothing runs (and `done` below tells the
      // caller to stop calling).
      opts_.events.started([this](int sig, const std::string& who) {
        asio::post(io_, [this, sig, who] {
          if (sig == SIGUSR1 || sig == SIGUSR2)
            forward_signal(sig);
          else
            stop_job(sig, who);
        });
      });
    }
    heartbeat();
    dial_from(nodes_.begin());
    arm_tick();
    arm_progress();
    io_.run();
    dialer_.reset();  // ends the SSH links (the remote agents see EOF) before the report
    flush_rank_files();
    terminal_.flush();
    if (opts_.result_json) {
      const auto report = launch::to_json(report_);
      auto err = opts_.result_folder
                     ? launch::write_result_file(*opts_.result_folder, fs::path(*opts_.result_json).filename().string(),
                                                 report)
                     : launch::write_result_file(*opts_.result_json, report);
      if (err) {
        log_->error("{}", *err);
        if (report_.exit_code == 0) report_.exit_code = 2;  // the job ran, its report is lost: not a success
        opts_.result_json.reset();
        if (control_) control_->leave_record(end_record());
      }
    }
    control_.reset();
    if (opts_.events.done) opts_.events.done(report_);
    return report_.exit_code;
  }

 private:
  struct Node {
    explicit Node(asio::io_context& io) : redial(io) {}
    // First, together: what heartbeat()'s sweep reads of every node, four times a beat interval
    // (one cache line for most nodes, two for some: a node is aligned to 16 bytes).
    // When we last sent this node a heartbeat (steady clock): heartbeat() beats only to nodes not
    // answered since (see on_message's heartbeat).
    std::chrono::steady_clock::time_point beat_at{};
    // How often its agent beats (its join's heartbeat_ms, version 7; else every second), and so
    // how often at least we beat to it (proto/heartbeat.hpp).
    proto::Millis beat_every = proto::kBeatFloor;
    bool joined = false;
    net::NodeEntry entry;
    std::string label;  // for logs: the name and where we reach it (made once: 4096 nodes log a lot)
    std::shared_ptr<Connection> conn;
    std::string address;  // the agent's address as we reached it
    proto::ClockSync sync;
    bool leaving = false;              // said `leaving`: its agent stops its ranks (until it joins again)
    std::vector<std::string> ib_hcas;  // the node's NCCL_IB_HCA entries, from its join
    std::string image_digest;          // a container job's image as the node resolved it
    bool ever_joined = false;
    int dial_failures = 0;
    std::string why_missing;  // the last reason it could not be reached (repeated while waiting)
    asio::steady_timer redial;
  };

  struct ExitInfo {
    launch::WorkerExit exit;
    std::string node;
    std::vector<std::string> tail;
    std::optional<launch::ErrorFile> error_file;
  };

  struct RankFiles {
    std::unique_ptr<supervisor::RankLogFile> file;
    supervisor::LastLines last{20};
    bool unflushed = false;  // lines written since the last flush_rank_files()
  };

  // The launcher's copy of the logs goes to disk once per turn of the loop (after every frame
  // that one read brought), not at 64 KiB: `tail -f` sees lines as they come, and a launcher
  // that is SIGKILLed loses none that it had (its end record points `ddpctl logs` at them).
  // The terminal gets a turn's lines after they are on disk: a line the user saw is one
  // `ddpctl logs` has, even if the launcher is killed the moment it is shown.
  void flush_rank_files() {
    flush_posted_ = false;
    for (int rank : unflushed_) {
      auto it = rank_files_.find(rank);
      if (it == rank_files_.end() || !it->second.file) continue;
      it->second.file->flush();
      it->second.unflushed = false;
    }
    unflushed_.clear();
    for (auto& [s, line] : to_terminal_) terminal_.write(s, std::move(line));
    to_terminal_.clear();
  }

  rdzv::Config make_config() {
    // Over SSH a port in --nodes is the SSH port; none means ~/.ssh/config's (or 22).
    entries_ = net::node_entries(opts_.nodes, opts_.make_dialer ? 0 : 29410, static_cast<bool>(opts_.make_dialer));
    rdzv::Config c;
    c.job_id = opts_.job_id;
    for (const auto& e : entries_) hosts_.push_back(e.name);
    c.hosts = hosts_;
    c.min_nodes = static_cast<std::uint32_t>(opts_.spec.nnodes_min);
    c.max_nodes = static_cast<std::uint32_t>(opts_.spec.nnodes_max);
    c.join_timeout = opts_.spec.join_timeout;
    c.last_call = opts_.spec.last_call;
    c.heartbeat_timeout = opts_.spec.heartbeat_timeout;
    c.stop_timeout = round_stop_timeout(opts_.spec.stop_grace);
    c.max_restarts = static_cast<std::uint32_t>(opts_.spec.max_restarts);
    c.backoff_initial = opts_.spec.restart_backoff;
    c.backoff_max = std::max<rdzv::Micros>(opts_.spec.restart_backoff, std::chrono::seconds(30));
    return c;
  }

  // A line about the job as a whole: to our log, and to a standing coordinator's submitter.
  template <typename... Args>
  void say(spdlog::level::level_enum level, fmt::format_string<Args...> f, Args&&... args) {
    auto text = fmt::format(f, std::forward<Args>(args)...);
    flush_rank_files();  // the ranks' lines that came before it, shown before it
    log_->log(level, "{}", text);
    if (opts_.events.notice) opts_.events.notice(level, text);
  }

  static const std::string& label(const Node& n) { return n.label; }

  rdzv::TimePoint now() const { return clock_.now(); }

  control::Ended end_record() const {
    auto e = control::ended_now(report_.job_id, report_.status, report_.exit_code,
                                fmt::format("{}/{}", opts_.spec.log_dir, opts_.job_id), opts_.result_json);
    e.message = report_.message;  // why, as the result file says it (a preflight, a hang, a rank's failure)
    return e;
  }

  // A launcher (not a standing coordinator's job) that is SIGKILLed leaves its job's end record
  // all the same, so that `ddpctl status|logs JOB` still know it: a guardian process
  // (supervisor/guardian.hpp) with nothing to kill here (each node's agent stops its ranks once
  // it loses us) writes it when this process is gone. One per attempt: the record names the
  // attempt's log files.
  void end_recorder() { retire(recorder_); }

  void retire(std::optional<supervisor::Guardian>& g) {
    if (g) {
      g->done();
      recorders_ended_.push_back(g->pid());
      g.reset();
    }
    // Reaped once they exited (at once, told done): nothing else here reaps children.
    std::erase_if(recorders_ended_, [](pid_t p) { return ::waitpid(p, nullptr, WNOHANG) != 0; });
  }

  // The last attempt's recorder is ended once this one runs: a launcher killed between the two
  // leaves a record all the same (each writes under a name of its own; one record wins).
  void start_recorder(const rdzv::AssignRanks& a) {
    std::optional<supervisor::Guardian> last;
    if (recorder_) last.emplace(std::move(*recorder_)), recorder_.reset();
    try {
      start_new_recorder(a);
    } catch (...) {
      retire(last);  // this process is not gone: no record of a death
      throw;
    }
    retire(last);
  }

  void start_new_recorder(const rdzv::AssignRanks& a) {
    if (!opts_.control_dir.empty() || !opts_.own_signals) return;
    std::vector<std::pair<int, std::string>> files;
    for (const auto& na : a.nodes) {
      for (std::uint32_t i = 0; i < na.local_world_size; ++i) {
        const int rank = static_cast<int>(na.rank_base.value + i);
        files.emplace_back(rank, contract_log(rank));
      }
    }
    auto r = control::record_if_killed(
        opts_.job_id, fmt::format("{}/{}", opts_.spec.log_dir, opts_.job_id), std::move(files),
        fmt::format(
            "ddpctl (pid {}) died while the job ran; each node's agent stops its ranks once it loses the launcher",
            ::getpid()));
    if (!r) return;
    if (auto g = supervisor::Guardian::start(
            -1, 0,
            supervisor::LastWord{r->dir, std::move(r->text.name), std::move(r->text.before_time),
                                 std::move(r->text.after_time)}))
      recorder_.emplace(std::move(*g));
  }

  // ---- connections ----

  void dial(Node& n) {
    if (done_) return;
    if (dialer_) {
      dialer_->dial(n.entry, [this, &n](net::Dialed d) {
        if (done_) return;
        if (!d.error.empty()) {
          if (!n.ever_joined && rdzv_.round().value <= 1 && rdzv_.state() == rdzv::State::joining) {
            return fatal(d.error + "; stopping the nodes that did start");
          }
          log_->warn("{}; retrying", d.error);
          n.why_missing = d.error;
          return schedule_redial(n);
        }
        n.address = d.address;
        auto conn = Connection::make(std::move(*d.socket), proto::Session::client(client_config()), label(n), "coord",
                                     std::chrono::seconds(10));
        // A TCP link a dialer made (srun's agents, SSH's connect-back): TLS as over --nodes. The
        // CLI leaves tls off for a link inside an SSH channel, which SSH encrypts already.
        if (opts_.tls) {
          if (!tls_) tls_ = net::tls_client_context(*opts_.keys.first());
          conn->use_tls({tls_});
        }
        start_session(n, std::move(conn));
      });
      return;
    }
    net::dial(io_, n.entry.host, n.entry.port, opts_.dial_timeout,
              [this, &n](boost::system::error_code ec, tcp::socket s) {
                if (done_) return;
                if (ec) {
                  n.why_missing = dial_failure(ec, n.entry.port);
                  auto lvl = n.dial_failures == 0 ? spdlog::level::warn : spdlog::level::debug;
                  log_->log(lvl, "{}: cannot reach the agent: {}; retrying", label(n), n.why_missing);
                  return schedule_redial(n);
                }
                connect(n, std::move(s));
              });
  }

  // Every node, a batch at a time: between batches the loop gets to the handshakes of the
  // nodes already reached, so agents start on them while the rest are dialled (at 4096 nodes,
  // dialling all first left the agents idle for the first fifth of the rendezvous).
  void dial_from(std::map<std::string, std::unique_ptr<Node>>::iterator it) {
    constexpr int kBatch = 32;
    for (int i = 0; i < kBatch && it != nodes_.end() && !done_; ++i, ++it) dial(*it->second);
    if (it != nodes_.end() && !done_) asio::post(io_, [this, it] { dial_from(it); });
  }

  void schedule_redial(Node& n) {
    if (done_) return;
    auto delay = kRedialMin * (1 << std::min(n.dial_failures, 4));
    ++n.dial_failures;
    n.redial.expires_after(std::min<std::chrono::milliseconds>(delay, kRedialMax));
    n.redial.async_wait([this, &n](boost::system::error_code ec) {
      if (!ec) dial(n);
    });
  }

  proto::ClientConfig client_config() const {
    proto::ClientConfig cc;
    cc.role = proto::Role::coordinator;
    cc.user = opts_.user;
    cc.name = "ddpctl";
    cc.software = ddp::kCtlVersion;
    cc.key = *opts_.keys.first();
    cc.nonce = proto::random_nonce();
    cc.expect_server = proto::Role::agent;
    return cc;
  }

  void connect(Node& n, tcp::socket s) {
    auto conn = Connection::make(std::move(s), proto::Session::client(client_config()), label(n), "coord",
                                 std::chrono::seconds(10));
    n.address = conn->remote_endpoint() ? plain_address(conn->remote_endpoint()->address()) : std::string();
    if (opts_.tls) {
      if (!tls_) tls_ = net::tls_client_context(*opts_.keys.first());
      conn->use_tls({tls_});
    }
    start_session(n, std::move(conn));
  }

  void start_session(Node& n, std::shared_ptr<Connection> conn) {
    n.conn = std::move(conn);
    n.sync = {};
    Connection* raw = n.conn.get();
    n.conn->start({[this, &n](const proto::PeerInfo& p) {
                     log_->debug("{}: authenticated (agent '{}', {})", label(n), p.name, p.software);
                     n.dial_failures = 0;
                     // The offer is as good as a beat: the timer's first for this node comes only if its
                     // agent has not beaten (and been answered) within 1.25 intervals.
                     n.beat_at = std::chrono::steady_clock::now();
                     // The offer is also the first clock probe: the join echoes its t0_us with
                     // the agent's stamps (proto/clock_sync.hpp); heartbeats refine it later.
                     auto offer = n.conn->session().message("job_offer", offer_fields(n));
                     if (opts_.delegation && n.conn->session().version() >= 6) offer["delegation"] = *opts_.delegation;
                     // Version 7: how often to beat, from the job's heartbeat_timeout (until its join says
                     // otherwise, the node is beaten every second, as an older agent is).
                     n.beat_every = proto::kBeatFloor;
                     if (n.conn->session().version() >= 7) offer["heartbeat_ms"] = beat_offer_.count();
                     n.conn->send_with(std::move(offer), "spec", offer_spec_);
                   },
                   [this, &n](proto::Message m) { on_message(n, std::move(m)); },
                   [this, &n, raw](const std::string& reason) { on_closed(n, raw, reason); }});
  }

  // The offer's own fields (the spec is added to its text once encoded, `send_with`). Member by
  // member, as in assign_body.
  json offer_fields(const Node& n) const {
    json fields = json::object();
    fields["t0_us"] = now().count();
    fields["job_id"] = opts_.job_id;
    fields["user"] = opts_.user;
    fields["node"] = n.entry.name;
    return fields;
  }

  void on_closed(Node& n, Connection* raw, const std::string& reason) {
    if (n.conn.get() != raw) return;
    const bool was_established = n.conn->session().peer().version != 0 || n.joined;
    n.conn.reset();
    if (done_) return;
    const bool first_gathering = rdzv_.state() == rdzv::State::joining && rdzv_.round().value == 1;
    // A TLS mismatch (an agent that requires it, or a secret TLS's handshake refused) says what
    // to do in its own words; dialling again would fail the same way.
    if (first_gathering &&
        (reason.find("TLS handshake failed") != std::string::npos || reason.find("only TLS") != std::string::npos)) {
      return fatal(fmt::format("{}: {}", label(n), reason));
    }
    if (reason.find("auth:") != std::string::npos && first_gathering &&
        (reason.find("delegation") != std::string::npos || reason.find("key_users") != std::string::npos ||
         reason.find("allowed_users") != std::string::npos)) {
      // A policy refusal (who the job runs as), not a wrong secret: its own words say what to do.
      return fatal(fmt::format("{}: refused: {}", label(n), reason.substr(reason.find("auth:") + 6)));
    }
    if (reason.find("auth:") != std::string::npos && first_gathering) {
      // "auth: the server failed to prove ..." / "peer refused: auth: ...": the protocol's
      // words, less its prefix, and what to do.
      auto why = reason.substr(reason.find("auth:") + 5);
      if (!why.empty() && why.front() == ' ') why.erase(0, 1);
      const auto& key = opts_.keys.first()->id;
      return fatal(
          fmt::format("{}: authentication failed: {}. Fix: {} must hold the agent's secret (the agent's "
                      "/etc/ddpctl/token or its --token-file)",
                      label(n), why, key == "default" ? "--token-file" : "--token-file's key '" + key + "'"));
    }
    if (reason.find("auth:") != std::string::npos) {
      // Later on (a restarted agent with another token): said here, as the connection leaves
      // authentication failures to its owner; retried, as the agent may be fixed meanwhile.
      log_->warn("{}: authentication failed: {}; retrying", label(n), reason);
    }
    if (dialer_ && !n.ever_joined && rdzv_.round().value <= 1 && rdzv_.state() == rdzv::State::joining) {
      // Over SSH the agent we started is gone before it joined (it could not run, or refused
      // the job): starting it again would fail the same way. Its stderr is in our log above.
      return fatal(
          fmt::format("{}: the agent ended before joining ({}); stopping the nodes that did start", label(n), reason));
    }
    if (n.joined) {
      n.joined = false;
      handle(rdzv::NodeLeft{n.entry.name, reason});
    } else if (!was_established) {
      log_->debug("{}: {}", label(n), reason);
    }
    if (!n.joined) n.why_missing = reason;
    schedule_redial(n);
  }

  // While a round runs and the nodes' beats come at least two to a period, the loop is paced
  // (coordinator.hpp, steady_batch): a step posted to the loop sleeps out the rest of the period
  // and posts itself again. Asio's epoll_wait does not block while a handler is queued, and what
  // it collects is queued behind the next step: each period is one wake-up, one epoll_wait, and
  // one pass over what arrived in the period before (so a message waits up to two periods).
  // Thousands of nodes' heartbeats then cost a wake-up per period, not one per beat. Fewer
  // beats gain nothing from it (the sleep is a wake-up of its own), so a small job's messages
  // never wait; the rendezvous and a stop are not paced. The loop itself stays io_.run().
  bool paced() const {
    const auto period_s = std::chrono::duration<double>(opts_.steady_batch).count();
    return !done_ && period_s > 0 && rdzv_.state() == rdzv::State::running && beats_per_s_ * period_s >= 2;
  }

  void pace() {
    if (pacing_ || !paced()) return;
    pacing_ = true;
    log_->debug("heartbeats: {:.0f} a second from the joined nodes; handled in batches, a pass every {} ms",
                beats_per_s_, opts_.steady_batch.count());
    paced_at_ = std::chrono::steady_clock::now();
    messages_at_pace_ = messages_;
    full_reads_at_pace_ = net::Connection::full_reads_on_this_thread();
    boost::asio::post(io_, [this] { pace_step(); });
  }

  void pace_step() {
    if (!paced()) {
      pacing_ = false;
      log_->debug("heartbeats: handled as they come again");
      return;
    }
    // A pass of 64 messages or more (half of the 128 sockets one epoll_wait of Asio's returns)
    // is a burst, such as every node's attempt_finished at a round's end, and a read that filled
    // its buffer is a stream (a node's output): neither waits, or 4096 attempt_finished would
    // take 32 periods and a stream would be read 64 KiB a period.
    const auto handled = messages_ - messages_at_pace_;
    messages_at_pace_ = messages_;
    const auto full_reads = net::Connection::full_reads_on_this_thread();
    const bool streaming = full_reads != full_reads_at_pace_;
    full_reads_at_pace_ = full_reads;
    const auto rest = opts_.steady_batch - (std::chrono::steady_clock::now() - paced_at_);
    if (handled < kPacedMessagesMax && !streaming && rest > decltype(rest)::zero()) std::this_thread::sleep_for(rest);
    paced_at_ = std::chrono::steady_clock::now();
    boost::asio::post(io_, [this] { pace_step(); });
  }

  void send(Node& n, std::string_view type, json fields) {
    if (n.conn && n.conn->established()) n.conn->send(n.conn->session().message(type, std::move(fields)));
  }

  // A clock sample from an echo: t0 ours, rx the agent's when it arrived, tx the agent's when it
  // answered, received now.
  void clock_sample(Node& n, std::int64_t t0, std::int64_t rx, std::int64_t tx) {
    std::int64_t hold = 0;
    if (__builtin_sub_overflow(tx, rx, &hold)) return;  // the agent's stamps: any 64-bit values
    n.sync.add({rdzv::Micros(t0), rdzv::Micros(rx), now(), rdzv::Micros(hold)});
  }
  void clock_sample(Node& n, const json& t0, const json& rx, const json& tx) {
    clock_sample(n, t0.get<std::int64_t>(), rx.get<std::int64_t>(), tx.get<std::int64_t>());
  }

  void on_message(Node& n, proto::Message m) {
    ++messages_;
    const auto& b = m.body;
    if (m.type == "heartbeat") {
      if (const auto& e = m.beat; e.t0_us && e.rx_us && e.now_us) clock_sample(n, *e.t0_us, *e.rx_us, *e.now_us);
      // Our beat answers the agent's (every second before version 7, at its join's interval
      // since): in the same wakeup, the reply carrying the TCP ACK of its beat, instead of a beat
      // of our own and a bare ACK at another moment (bench/rendezvous/loopback_floor --reply: a
      // quarter less CPU for the coordinator at 4096 nodes). heartbeat() still beats to any node
      // not answered. At most one answer per half second: an agent that beats faster (or
      // floods) gets no more of our sends than one beating every second.
      if (const auto at = std::chrono::steady_clock::now(); at - n.beat_at >= opts_.heartbeat_interval / 2) {
        beat(n, at);
      }
      if (n.joined) handle(rdzv::Heartbeat{n.entry.name});
      return;
    }
    if (m.type == "join") {
      clock_sample(n, b["t0_us"], b["rx_us"], b["tx_us"]);
      const auto off = n.sync.best().value_or(proto::ClockOffset{});
      log_->debug("{}: clock offset {} us (+/- {} us)", label(n), off.offset.count(), off.uncertainty.count());
      return on_join(n, b);
    }
    if (!n.joined) {
      // A node that left with `leaving` still reports its ranks' exits: they belong in the
      // report's list of exits, though never as a cause (on_worker_exited).
      if (n.leaving && m.type == "worker_exited") on_worker_exited(n, b);
      return;
    }
    if (m.type == "leaving") {
      // The node goes (its agent stops, and its workers with it): a lost node, told, not
      // found out; what its workers' exits say after this is no failure of theirs.
      if (b["job_id"].get<std::string>() != opts_.job_id) return;
      // The agent's words, for the user's terminal and the report: shown clean.
      const auto reason = clean_text(b["reason"].get_ref<const std::string&>(), 1024);
      say(spdlog::level::warn, "{}: {}", n.entry.name, reason);
      n.joined = false;
      n.leaving = true;
      handle(rdzv::NodeLeft{n.entry.name, reason});
      return;
    }
    if (m.type == "ready") return on_ready(n, b);
    if (m.type == "progress") return on_hang_progress(n, b);
    if (m.type == "output") return on_output(n, b);
    if (m.type == "stacks") return stacks_.on_stacks(n.entry.name, b);
    if (m.type == "stacks_done") return stacks_.on_done(n.entry.name, b);
    if (m.type == "worker_exited") return on_worker_exited(n, b);
    if (m.type == "attempt_finished") {
      const auto round = rdzv::Round{b["round"].get<std::uint32_t>()};
      if (b.contains("error")) {
        const auto err = b["error"].get<std::string>();
        say(spdlog::level::err, "{}: {}", n.entry.name, err);
        notes_.push_back(fmt::format("{}: {}", n.entry.name, err));
      }
      if (b.contains("stacks") && round.value == stacks_round_) take_stacks(n, b["stacks"]);
      if (auto it = b.find("flight"); it != b.end() && round.value == stacks_round_) take_flight(n.entry.name, *it);
      handle(rdzv::AttemptFinished{n.entry.name, round, b["ok"].get<bool>()});
      return;
    }
    if (m.type == "worker_started") {
      return apply_round(rounds_.handle(round::WorkerStarted{n.entry.name, rdzv::Round{b["round"].get<std::uint32_t>()},
                                                             rdzv::LocalRank{b["local_rank"].get<std::uint32_t>()},
                                                             b["pid"].get<std::uint32_t>()}));
    }
    if (m.type == "status") {  // node rank 0's store: who waits for what
      for (const auto& j : b["jobs"]) {
        if (j.value("job_id", "") != opts_.job_id || !j.contains("store_waiters") || !j["store_waiters"].is_array())
          continue;
        store_waiters_.clear();
        for (const auto& l : j["store_waiters"]) {
          if (l.is_string()) store_waiters_.push_back(l.get<std::string>());
        }
      }
      return;
    }
    n.conn->refuse(proto::ErrorCode::unexpected, fmt::format("a coordinator does not take '{}' from an agent", m.type));
  }

  void on_join(Node& n, const json& b) {
    if (b["job_id"].get<std::string>() != opts_.job_id) {
      n.conn->refuse(proto::ErrorCode::bad_value, "join for another job");
      return;
    }
    if (b.contains("preflight")) {
      const auto& p = b["preflight"];
      auto detail = p.value("detail", std::string());
      if (!p.value("command", true) || !p.value("workdir", true) || !detail.empty()) {
        return fatal(fmt::format("preflight failed on {}: {}", n.entry.name,
                                 detail.empty() ? "command or workdir missing" : detail));
      }
      // Every node must run the same image: compared as each joins, so a job whose nodes
      // disagree stops before any rank starts anywhere.
      if (opts_.spec.container && p.contains("image") && p["image"].is_object()) {
        n.image_digest = p["image"].value("digest", std::string());
        std::vector<std::pair<std::string, std::string>> digests;
        for (const auto& h : hosts_) {
          const auto& other = *nodes_.at(h);
          if (&other == &n || other.ever_joined) digests.emplace_back(h, other.image_digest);
        }
        if (auto why = facts::image_disagreement(opts_.spec.container->image, digests)) {
          return fatal(*why + " (pull or load the same image on every node, or name it by digest: image@sha256:...)");
        }
      }
    }
    n.beat_every = proto::joined_beat_interval(
        b.contains("heartbeat_ms") ? std::optional(proto::Millis(b["heartbeat_ms"].get<std::int64_t>())) : std::nullopt,
        beat_offer_);
    const auto nproc = b["nproc"].get<std::uint32_t>();
    const auto agent_name = b["node"].get<std::string>();
    n.ib_hcas.clear();
    if (b.contains("facts") && b["facts"].contains("ib_hcas")) {
      const auto& h = b["facts"]["ib_hcas"];
      const bool ok = h.is_array() && h.size() <= 256 && std::all_of(h.begin(), h.end(), [](const json& e) {
                        return e.is_string() && e.get_ref<const std::string&>().size() <= 64;
                      });
      if (!ok) {
        n.conn->refuse(proto::ErrorCode::bad_value, "join: facts.ib_hcas must be a list of at most 256 short strings");
        return;
      }
      for (const auto& e : h) n.ib_hcas.push_back(e.get<std::string>());
    }
    log_->log(nodes_.size() <= 32 ? spdlog::level::info : spdlog::level::debug, "{} joined: agent '{}', {} worker{}",
              label(n), agent_name, nproc, nproc == 1 ? "" : "s");
    n.joined = true;
    n.leaving = false;
    n.ever_joined = true;
    n.why_missing.clear();
    const auto off = n.sync.best().value_or(proto::ClockOffset{});
    handle(rdzv::NodeJoined{n.entry.name, nproc, off.offset});
  }

  // ---- the live stream and per-rank files ----

  // The launcher's copy of an attempt's logs, <log folder>/<job>/attempt-N: each folder made
  // below the log folder through its descriptor, never through a link, a folder of ours, 0700
  // (a standing coordinator runs as root and keeps every user's jobs here; the job's folders are
  // its submitter's business only, its rank files 0600). Null, with a warning, when that cannot
  // be done: the job runs, the launcher keeps no copy.
  std::shared_ptr<const safefs::Dir> open_attempt_folder(std::uint64_t attempt) {
    try {
      // The job's folder is found by its name once, then kept open (or given, opened, by a
      // detached launch): a later attempt's folder goes below the same folder, wherever it has
      // been moved meanwhile, never into whatever now has its name.
      if (!job_folder_) job_folder_ = opts_.job_folder;
      if (!job_folder_) {
        std::shared_ptr<const safefs::Dir> root = opts_.log_folder;
        if (!root && opts_.log_folder_only) return nullptr;  // warned when the folder was refused
        if (!root) {
          std::error_code ec;
          fs::create_directories(opts_.spec.log_dir, ec);  // a folder of the user who runs ddpctl
          root = std::make_shared<const safefs::Dir>(safefs::Dir::open(opts_.spec.log_dir));
        }
        auto job = safefs::make_dir(*root, opts_.job_id, 0700, std::nullopt, false);
        ::fchmod(job.fd(), 0700);
        job_folder_ = std::make_shared<const safefs::Dir>(std::move(job));
      }
      auto dir = safefs::make_dir(*job_folder_, fmt::format("attempt-{}", attempt), 0700, std::nullopt, false);
      ::fchmod(dir.fd(), 0700);
      return std::make_shared<const safefs::Dir>(std::move(dir));
    } catch (const safefs::FsError& e) {
      log_->warn("cannot keep the launcher's copy of the logs in {}: {}", attempt_dir_, e.what());
      return nullptr;
    }
  }

  std::optional<int> global_rank(const std::string& node, std::uint32_t round, std::uint32_t local_rank) const {
    return rounds_.global_rank(node, rdzv::Round{round}, local_rank);
  }

  RankFiles& files_of(int rank) {
    auto& f = rank_files_[rank];
    if (!f.file) {
      f.file = std::make_unique<supervisor::RankLogFile>(attempt_folder_, fmt::format("rank-{}.log", rank),
                                                         opts_.spec.log_max_bytes);
    }
    return f;
  }

  std::string contract_log(int rank) const { return fmt::format("{}/rank-{}.log", attempt_dir_, rank); }

  void on_output(Node& n, const json& b) {
    const auto local_rank = b["local_rank"].get<std::uint32_t>();
    auto rank = global_rank(n.entry.name, b["round"].get<std::uint32_t>(), local_rank);
    if (!rank) return;  // a straggler of an earlier round
    const auto s = b["stream"].get<std::string>() == "stderr" ? supervisor::Stream::err : supervisor::Stream::out;
    auto line = b["data"].get<std::string>();
    auto& f = files_of(*rank);
    f.file->write(s, line);
    if (!f.unflushed) {
      f.unflushed = true;
      unflushed_.push_back(*rank);
    }
    if (!flush_posted_) {
      flush_posted_ = true;
      asio::post(io_, [this] { flush_rank_files(); });
    }
    last_output_[*rank] = std::chrono::steady_clock::now();
    if (control_) control_->publish(*rank, s, line);
    if (opts_.events.output) opts_.events.output(n.entry.name, *rank, s, line);
    if (!opts_.quiet && (opts_.show_ranks.empty() || opts_.show_ranks.contains(*rank))) {
      to_terminal_.emplace_back(s, fmt::format("[{}:{}] {}", n.entry.name, *rank, line));
    }
    f.last.add(std::move(line));
  }

  void on_worker_exited(Node& n, const json& b) {
    const auto round = b["round"].get<std::uint32_t>();
    const auto local_rank = b["local_rank"].get<std::uint32_t>();
    auto rank = global_rank(n.entry.name, round, local_rank);
    if (!rank) return;
    flush_rank_files();  // its last lines before what is said of its exit
    const auto agent_time = rdzv::Micros(b["time_us"].get<std::int64_t>());
    auto key = std::make_pair(n.entry.name, local_rank);
    auto& info = exits_[key];
    info.node = n.entry.name;
    info.exit.rank = *rank;
    info.exit.local_rank = static_cast<int>(local_rank);
    info.exit.pid = static_cast<pid_t>(b["pid"].get<std::uint32_t>());
    info.exit.signal = b.contains("signal") ? static_cast<int>(b["signal"].get<std::uint32_t>()) : 0;
    info.exit.exit_code = b.contains("exit_code") ? static_cast<int>(b["exit_code"].get<std::int64_t>()) : 0;
    // Version 6. Only the signals ddpctl forwards (a preemption warning) can be: a node may not
    // hide a rank's SIGSEGV or an OOM kill as "forwarded".
    info.exit.forwarded = (info.exit.signal == SIGUSR1 || info.exit.signal == SIGUSR2) && b.value("forwarded", false);
    // Version 6. The node had sent its own stop signals (after a failure there, a forwarded
    // signal's death, or our stop): what this rank died of is the stop's doing.
    info.exit.after_stop = b.value("after_stop", false);
    const auto when = n.sync.to_local(agent_time);
    info.exit.when = to_sys(when);
    if (b.contains("tail")) info.tail = b["tail"].get<std::vector<std::string>>();
    if (b.contains("error_file") && b["error_file"].is_object()) {
      const auto& e = b["error_file"];
      info.error_file =
          launch::ErrorFile{e.value("path", ""), e.value("message", ""), e.value("traceback", ""), e.value("raw", "")};
    }
    round::WorkerExited ev{n.entry.name,
                           rdzv::Round{round},
                           rdzv::LocalRank{local_rank},
                           std::nullopt,
                           std::nullopt,
                           agent_time,
                           when,
                           static_cast<std::uint32_t>(info.exit.pid),
                           n.leaving,
                           info.exit.forwarded,
                           info.exit.after_stop};
    if (info.exit.signal)
      ev.signal = info.exit.signal;
    else
      ev.exit_code = info.exit.exit_code;
    apply_round(rounds_.handle(ev));
  }

  // ---- the rendezvous machine ----

  void handle(const rdzv::Event& e) {
    if (done_) return;
    apply(rdzv_.handle(e, now()));
    arm_tick();
  }

  void arm_tick() {
    if (done_) return;
    auto d = rdzv_.next_deadline();
    // A timer set for no later than the next deadline stands; a tick that comes early finds
    // nothing due and arms for the deadline then. Most events leave the deadline as it was or
    // move it later: the oldest heartbeat's moves on with nearly every beat in the steady state
    // (the nodes' beats come round in the same order), and re-arming for each would be a
    // cancelled wait, a timer-queue update and a timerfd_settime per beat (three per node while
    // joining).
    if (!d || (tick_armed_ && *tick_armed_ <= *d)) return;
    tick_armed_ = d;
    // Deadlines and the timer are on the same (steady) clock: one wait, however far.
    const auto wait = std::max<rdzv::Micros>(*d - now(), rdzv::Micros(0)) + std::chrono::milliseconds(1);
    tick_timer_.expires_after(wait);
    tick_timer_.async_wait([this](boost::system::error_code ec) {
      if (ec) return;
      tick_armed_.reset();
      handle(rdzv::Tick{});
    });
  }

  // While the rendezvous waits for nodes (up to rendezvous.join_timeout, 10 minutes by default),
  // a line every 30 s (a quarter of a shorter join_timeout) says who is missing: a launch waiting
  // on a dead host is not a silent hang.
  void arm_progress() {
    const auto every = std::clamp<Millis>(std::chrono::duration_cast<Millis>(opts_.spec.join_timeout) / 4,
                                          std::chrono::seconds(1), std::chrono::seconds(30));
    progress_timer_.expires_after(every);
    progress_timer_.async_wait([this](boost::system::error_code ec) {
      if (ec || done_) return;
      if (rdzv_.state() == rdzv::State::joining) {
        say(spdlog::level::info, "still waiting: {} (rendezvous.join_timeout: {}){}", rdzv_.status(),
            format_duration(std::chrono::duration_cast<Millis>(opts_.spec.join_timeout)), missing_reasons());
      }
      arm_progress();
    });
  }

  // "; n4: Host not found (...): is the name right?; n5: ..." for the nodes not joined that could
  // not be reached (the first 8 by name), so that every waiting line says why, not only the first.
  std::string missing_reasons() const {
    constexpr std::size_t kShown = 8;
    std::string out;
    std::size_t shown = 0, more = 0;
    for (const auto& [name, n] : nodes_) {
      if (n->joined || n->why_missing.empty()) continue;
      if (shown == kShown) {
        ++more;
        continue;
      }
      out += fmt::format("; {}: {}", name, n->why_missing);
      ++shown;
    }
    if (more) out += fmt::format("; and {} more unreachable", more);
    return out;
  }

  void apply(rdzv::Effects effects) {
    for (auto& e : effects) {
      if (done_) return;
      std::visit([this](auto& x) { on_effect(x); }, e);
    }
  }

  void on_effect(rdzv::AssignRanks& a) {
    if (auto outside = control::ranks_outside(opts_.show_ranks, static_cast<int>(a.world_size));
        outside && !ranks_warned_) {
      ranks_warned_ = true;  // once: a restart or re-form does not need to hear it again
      log_->warn("--ranks: {}", *outside);
    }
    exits_.clear();
    notes_.clear();
    node_stacks_.clear();
    stacks_round_ = a.round.value;
    stacks_world_size_ = a.world_size;
    flight_.clear();
    flight_world_ = static_cast<int>(a.world_size);
    flight_ranks_.clear();
    for (const auto& na : a.nodes)
      flight_ranks_[na.node] = {static_cast<int>(na.rank_base.value), static_cast<int>(na.local_world_size)};
    hang_reset();
    flush_rank_files();
    rank_files_.clear();
    last_output_.clear();
    store_waiters_.clear();
    attempt_dir_ = fmt::format("{}/{}/attempt-{}", opts_.spec.log_dir, opts_.job_id, a.restart_count);
    attempt_folder_ = open_attempt_folder(a.restart_count);
    start_recorder(a);
    cur_ = launch::AttemptReport{};
    cur_.attempt = static_cast<int>(a.restart_count);
    cur_.started = clock_.wall_now();
    cur_.log_dir = attempt_dir_;

    // The spec came with each node's job_offer; an assignment carries only the round.
    node_addresses_ = json::array();
    for (const auto& na : a.nodes) node_addresses_.push_back(nodes_.at(na.node)->address);
    const auto& master = nodes_.at(a.nodes.at(0).node)->address;
    std::vector<std::vector<std::string>> hcas;
    for (const auto& na : a.nodes) hcas.push_back(nodes_.at(na.node)->ib_hcas);
    ib_hca_ = binding::common_ib_hca(hcas);
    master_ = master;
    // What the log line shows of the placement: the first 16 nodes, as join_first() would, without
    // formatting the other 4080 at 4096 nodes (a measurable share of the rendezvous).
    constexpr std::size_t kShown = 16;
    std::vector<std::string> shares;
    for (const auto& na : a.nodes) {
      if (shares.size() < kShown) {
        shares.push_back(fmt::format("{}: {}", na.node, rank_range(na.rank_base.value, na.local_world_size)));
      }
    }
    const auto more = a.nodes.size() > kShown ? fmt::format("; and {} more", a.nodes.size() - kShown) : std::string();
    // The round machine opens the attempt and sends node rank 0's assign first.
    apply_round(rounds_.handle(round::Assigned{a}));
    say(spdlog::level::info, "round {} (attempt {}): world size {} on {} node{} ({}{}); MASTER_ADDR={}", a.round.value,
        a.restart_count, a.world_size, a.nodes.size(), a.nodes.size() == 1 ? "" : "s", join(shares, "; "), more,
        master);
  }

  // A node's share of round `a`.
  json assign_body(const rdzv::AssignRanks& a, const rdzv::NodeAssignment& na) const {
    // Member by member: nlohmann's initializer list builds each pair as an array first, about
    // twice the time (2.2 against 1.0 us for these thirteen, one assign per node).
    json assign = json::object();
    assign["job_id"] = opts_.job_id;
    assign["run_id"] = opts_.job_id;
    assign["user"] = opts_.user;
    assign["round"] = a.round.value;
    assign["restart_count"] = a.restart_count;
    assign["max_restarts"] = opts_.spec.max_restarts;
    assign["node_rank"] = na.node_rank.value;
    assign["nnodes"] = a.nodes.size();
    assign["rank_base"] = na.rank_base.value;
    assign["local_world_size"] = na.local_world_size;
    assign["world_size"] = a.world_size;
    assign["master_addr"] = master_;
    assign["master_port"] = opts_.spec.store_port;
    // Node rank 0 (the store's host) also gets the job's node addresses, its allow-list: in
    // every assign they made the round's traffic O(N^2). Over SSH every agent learns its own
    // address from the list (it has no socket address of its own): the list goes to all, as SSH
    // launches are small.
    if (na.node_rank.value == 0 || dialer_) assign["node_addresses"] = node_addresses_;
    if (ib_hca_) assign["nccl_ib_hca"] = *ib_hca_;
    return assign;
  }

  void on_effect(rdzv::StartAttempt& s) { apply_round(rounds_.handle(round::StartDue{s.round})); }

  json start_body(rdzv::Round round) const { return {{"job_id", opts_.job_id}, {"round", round.value}}; }

  // Node rank 0 holds the round's store (and NCCL id): the round machine releases the others.
  void on_ready(Node& n, const json& b) {
    round::Ready r{n.entry.name, rdzv::Round{b["round"].get<std::uint32_t>()}};
    if (b.contains("error"))
      r.error = b["error"].get<std::string>();
    else
      r.master_port = static_cast<std::uint16_t>(b["master_port"].get<std::uint32_t>());
    if (b.contains("nccl_unique_id")) r.nccl_id = b["nccl_unique_id"].get<std::string>();
    apply_round(rounds_.handle(r));
  }

  // ---- the round machine's effects ----

  void apply_round(round::Effects effects) {
    for (auto& e : effects) {
      if (done_) return;
      std::visit([this](auto& x) { on_round(x); }, e);
    }
  }

  // Node rank 0's share as the round opens; the others' when its ready released them, with its
  // store port and NCCL id. An assign that is also the start is one frame under protocol
  // version 4 (`start: true`), an assign and a start in one write under version 3.
  void on_round(round::SendAssign& s) {
    const auto& a = rounds_.assignment();
    auto& target = *nodes_.at(s.node);
    auto assign = assign_body(a, a.nodes.at(s.index));
    if (s.release) {
      assign["master_port"] = s.release->master_port;
      if (s.release->nccl_id) assign["nccl_unique_id"] = *s.release->nccl_id;
    }
    if (!s.start) return send(target, "assign", std::move(assign));
    if (target.conn && target.conn->session().version() >= 4) {
      assign["start"] = true;
      return send(target, "assign", std::move(assign));
    }
    std::optional<Connection::Cork> both;
    if (target.conn) both.emplace(*target.conn);
    send(target, "assign", std::move(assign));
    send(target, "start", start_body(a.round));
  }

  void on_round(round::SendStart& s) { send(*nodes_.at(s.node), "start", start_body(s.round)); }

  void on_round(round::StoreUp& u) {
    say(spdlog::level::info, "round {}: store on {}:{}{}", u.round.value, master_, u.master_port,
        u.has_nccl_id ? ", NCCL unique id from node rank 0" : "");
  }

  void on_round(round::ReadyFailed& f) { fatal(f.message); }

  void on_round(round::ReadyIgnored& r) {
    log_->debug("{}: ready for round {} ignored (not awaited)", r.node, r.round.value);
  }

  void on_round(round::AllStarted& a) {
    say(spdlog::level::info, "round {}: all {} rank{} started", a.round.value, a.world_size,
        a.world_size == 1 ? "" : "s");
    if (opts_.on_running) std::exchange(opts_.on_running, nullptr)();
  }

  void on_round(round::ForwardExit& f) { handle(f.exit); }

  void on_effect(rdzv::StopAll& s) {
    apply_round(rounds_.handle(round::StopIssued{s.round, now()}));
    // Who waits for what in the store (node rank 0's last word on it, at most a second old), at
    // the moment it explains the most: before the stop ends the waits. The report shows it, as
    // a local launch's does: the first clue in a hang.
    for (const auto& w : store_waiters_) notes_.push_back("store: " + w);
    say(spdlog::level::warn, "stopping every node's workers: {}", s.reason);
    // A Ctrl-C's stop (the user's, before any failure stopped the round): SIGINT first.
    const auto interrupt = stop_signal_ == SIGINT ? launch::interrupt_grace(opts_.spec.stop_grace) : Millis(0);
    for (const auto& m : rdzv_.members()) send_stop(*nodes_.at(m), s.round, s.reason, opts_.spec.stop_grace, interrupt);
    if (interrupt.count() > 0) say_sigterm_after(interrupt, s.round);
  }

  // The Ctrl-C's second step, said here as a local launch says it (the agents send it, on the
  // same timing; their own lines stay on the nodes).
  void say_sigterm_after(Millis interrupt, rdzv::Round round) {
    interrupt_timer_.expires_after(interrupt);
    interrupt_timer_.async_wait([this, interrupt, round](boost::system::error_code ec) {
      if (ec || done_ || killed_now_ || rounds_.round() != round) return;
      const auto left = ranks_running();
      if (left == 0) return;
      say(spdlog::level::warn,
          "{} rank{} still running {} after SIGINT: the agents send SIGTERM; SIGKILL {} after that", left,
          left == 1 ? "" : "s", format_duration(interrupt), format_duration(opts_.spec.stop_grace));
    });
  }

  // The current round's ranks that have not exited (yet).
  std::size_t ranks_running() const {
    std::size_t n = 0;
    for (const auto& [node, pl] : rounds_.placement()) n += pl.local_world_size;
    return n > exits_.size() ? n - exits_.size() : 0;
  }

  // ---- the hang watchdog (lib/hang): each node reports when it goes idle and when it resumes;
  // the job is hung when no rank on any node progressed for hang.timeout ----

  void hang_reset() {
    hang_timer_.cancel();
    hang_stacks_.clear();
    if (!opts_.spec.hang) return;
    if (!hang_) hang_.emplace(opts_.spec.hang->timeout, hang::Clock::now());
    hang_->reset(hang::Clock::now());
  }

  void on_hang_progress(Node& n, const json& b) {
    if (!hang_ || b["job_id"].get<std::string>() != opts_.job_id ||
        b["round"].get<std::uint32_t>() != rdzv_.round().value)
      return;
    const Millis idle(static_cast<Millis::rep>(b["idle_ms"].get<std::uint64_t>()));
    hang_->on_report(n.entry.name, idle, hang::Clock::now());
    if (idle.count() > 0) hang_stacks_[n.entry.name] = b["stacks"].get<std::string>();
    log_->debug("{}: {}", label(n),
                idle.count() ? fmt::format("no progress for {}", format_duration(idle)) : "progresses again");
    check_hang();
  }

  // The verdict now, or a timer for when it would be due if no node resumes.
  void check_hang() {
    hang_timer_.cancel();
    if (!hang_ || done_ || rdzv_.state() != rdzv::State::running) return;
    const auto now = hang::Clock::now();
    const auto verdict = hang_->check(rdzv_.members(), now);
    if (verdict == hang::Watch::Verdict::hung_now) return on_hang();
    if (verdict == hang::Watch::Verdict::still_hung) return;  // reported: wait for a node to resume
    const auto last = hang_->last_progress(rdzv_.members(), now);
    if (!last || *last == now) return;  // a node progresses: its idle report calls us again
    hang_timer_.expires_at(*last + opts_.spec.hang->timeout + std::chrono::milliseconds(1));
    hang_timer_.async_wait([this](boost::system::error_code ec) {
      if (!ec) check_hang();
    });
  }

  // Every node's stacks for a hang report. This default uses what each node sent with its idle
  // report: during a hang the stacks stand still (a changed stack is progress). One hook, so the
  // lead can switch it to `ddpctl stacks JOB`'s gathering (a fresh read, native frames too).
  void gather_hang_stacks(std::function<void(std::string)> done) {
    std::string out;
    for (const auto& m : rdzv_.members()) {
      auto it = hang_stacks_.find(m);
      out += fmt::format("node {}:\n{}", m, it != hang_stacks_.end() ? it->second : std::string("  (no report)\n"));
    }
    done(std::move(out));
  }

  void on_hang() {
    const auto& h = *opts_.spec.hang;
    const auto cause = fmt::format("hung: no rank made progress for {}", format_duration(h.timeout));
    const auto round = rdzv_.round();
    gather_hang_stacks([this, cause, round, action = h.action](std::string stacks) {
      if (done_ || rdzv_.round() != round) return;
      say(spdlog::level::err, "job {}: {} on any node (hang.action: {}); where every rank is:\n{}", opts_.job_id, cause,
          jobspec::hang_action_name(action), stacks);
      const auto file = fs::path(attempt_dir_) / "hang-stacks.txt";
      if (attempt_folder_) {
        try {
          const auto fd = safefs::open_append(*attempt_folder_, "hang-stacks.txt", std::nullopt);
          safefs::write_all(fd.get(), fmt::format("{} at {}\n{}\n", cause,
                                                  launch::format_time(std::chrono::system_clock::now()), stacks));
        } catch (const safefs::FsError& e) {
          log_->warn("the hang's stacks were not kept: {}", e.what());
        }
      }
      notes_.push_back(fmt::format("{} (stacks in {})", cause, file.string()));
      if (action == jobspec::HangAction::report) return;
      handle(rdzv::HangDetected{cause, action == jobspec::HangAction::restart});
    });
  }

  // `interrupt` (a Ctrl-C's, version 6): SIGINT first, SIGTERM that long after; an older agent
  // starts at SIGTERM.
  void send_stop(Node& n, rdzv::Round round, const std::string& reason, Millis grace, Millis interrupt = Millis(0)) {
    json m{{"job_id", opts_.job_id},
           {"round", round.value},
           {"reason", reason.substr(0, 4000)},
           {"grace_ms", static_cast<std::uint64_t>(grace.count())}};
    if (interrupt.count() > 0 && n.conn && n.conn->session().version() >= 6)
      m["interrupt_grace_ms"] = static_cast<std::uint64_t>(interrupt.count());
    send(n, "stop", std::move(m));
  }

  void on_effect(rdzv::RestartScheduled& r) {
    close_attempt(launch::Phase::failed, std::nullopt);
    say(spdlog::level::warn, "{}", r.reason);
    report_.restarts = static_cast<int>(r.restart_count);
  }

  void on_effect(rdzv::JobFailed& f) {
    report_.restarts = static_cast<int>(f.restart_count);
    if (f.kind == rdzv::JobFailed::Kind::hung) {
      close_attempt(launch::Phase::failed, f.first_failure);
      report_.status = "failed";
      report_.exit_code = launch::kHungExitCode;
      report_.message = f.message;
      say(spdlog::level::err, "job {} failed: {}", opts_.job_id, f.message);
    } else if (f.kind == rdzv::JobFailed::Kind::stopped) {
      close_attempt(launch::Phase::stopped, f.first_failure);
      report_.status = "stopped";
      report_.exit_code = 128 + (stop_signal_ ? stop_signal_ : SIGTERM);
      say(spdlog::level::warn, "job {} stopped{}", opts_.job_id,
          stop_signal_ ? " by " + supervisor::signal_name(stop_signal_) : "");
    } else {
      close_attempt(launch::Phase::failed, f.first_failure);
      report_.status = "failed";
      report_.exit_code = 1;
      // A timed-out rendezvous: why each node that did not come could not be reached.
      if (f.kind == rdzv::JobFailed::Kind::rendezvous_timeout) f.message += missing_reasons();
      report_.message = f.message;
      say(spdlog::level::err, "job {} failed: {}", opts_.job_id, f.message);
    }
    finish();
  }

  void on_effect(rdzv::JobSucceeded& s) {
    close_attempt(launch::Phase::succeeded, std::nullopt);
    report_.status = "succeeded";
    report_.exit_code = 0;
    report_.restarts = static_cast<int>(s.restart_count);
    say(spdlog::level::info, "job {} succeeded{}", opts_.job_id,
        s.restart_count ? fmt::format(" after {} restart{}", s.restart_count, s.restart_count == 1 ? "" : "s") : "");
    finish();
  }

  void on_effect(rdzv::RejectNode& r) {
    say(spdlog::level::err, "{}", r.reason);
    auto& n = *nodes_.at(r.node);
    n.joined = false;
    if (n.conn) n.conn->refuse(proto::ErrorCode::unexpected, r.reason);
  }

  void on_effect(rdzv::DropNode& d) {
    say(spdlog::level::warn, "giving up on {}: {}", d.node, d.reason);
    auto& n = *nodes_.at(d.node);
    n.joined = false;
    if (n.conn) n.conn->close(d.reason);
  }

  // Progress at most once a second (a large job joins thousands of nodes within one); the
  // rest at debug level.
  void on_effect(rdzv::Progress& p) {
    const auto t = std::chrono::steady_clock::now();
    const bool show = t - last_progress_ >= std::chrono::seconds(1);
    if (show) last_progress_ = t;
    if (show)
      say(spdlog::level::info, "{}", p.message);
    else
      log_->debug("{}", p.message);
  }

  // The round machine closes the attempt (once) and picks its first failure by mapped time.
  void close_attempt(launch::Phase phase, const std::optional<rdzv::Failure>& from_rdzv) {
    const auto outcome = phase == launch::Phase::succeeded ? round::Outcome::succeeded
                         : phase == launch::Phase::stopped ? round::Outcome::stopped
                                                           : round::Outcome::failed;
    apply_round(rounds_.handle(round::Close{outcome, from_rdzv}));
  }

  // A node's NCCL flight recorder summaries for this round (protocol version 6; the caller
  // checks the round), each parsed as hostile (lib/hang/flight.hpp); only ranks the node holds
  // count, once, and a node that sends again replaces what it sent.
  void take_flight(const std::string& node, const json& summaries) {
    const auto range = flight_ranks_.find(node);
    if (range == flight_ranks_.end()) return;
    hang::take_node_summaries(flight_, node, range->second.first, range->second.second, summaries);
  }

  // The attempt's report: exits by rank, the first failure the machine named, its notes.
  void on_round(round::AttemptClosed& c) {
    flush_rank_files();
    terminal_.flush();
    cur_.ended = clock_.wall_now();
    cur_.phase = c.outcome == round::Outcome::succeeded ? launch::Phase::succeeded
                 : c.outcome == round::Outcome::stopped ? launch::Phase::stopped
                                                        : launch::Phase::failed;
    std::vector<ExitInfo*> all;
    for (auto& [k, v] : exits_) all.push_back(&v);
    std::sort(all.begin(), all.end(), [](auto* a, auto* b) { return a->exit.rank < b->exit.rank; });
    for (auto* e : all) cur_.exits.push_back(e->exit);

    if (c.first_failure) {
      const auto& first = exits_.at(*c.first_failure);
      auto lines = first.tail;
      if (lines.empty()) {
        if (auto it = rank_files_.find(first.exit.rank); it != rank_files_.end()) lines = it->second.last.lines();
      }
      cur_.first_failure =
          launch::RankFailure{first.exit, first.node, lines, first.error_file, contract_log(first.exit.rank)};
    } else if (c.node_failure) {
      // A node lost (or failing as a whole) and no rank failed before it: the ranks the stop
      // then ended elsewhere were not the first failure, however early their exits came.
      notes_.push_back("first failure: " + c.node_failure->describe());
      std::vector<std::string> then;
      for (const auto& e : cur_.exits) then.push_back(fmt::format("rank {} {}", e.rank, e.describe()));
      if (!then.empty()) notes_.push_back("then: " + join_first(then, ", ", 16));
    }
    // The grace period's end, said here as a local launch says it: the agents' own lines stay
    // on the nodes.
    if (c.killed_after_stop && !killed_now_) {
      const auto killed = c.killed_after_stop;
      notes_.push_back(fmt::format("{} rank{} still running after the {} stop grace: SIGKILL", killed,
                                   killed == 1 ? " was" : "s were", format_duration(opts_.spec.stop_grace)));
    }
    merge_stacks();
    if (c.outcome != round::Outcome::succeeded && !flight_.empty())
      notes_.push_back(hang::format_finding(hang::analyze(flight_, flight_world_)));
    cur_.notes = notes_;
    report_.attempts.push_back(cur_);
    if (cur_.phase != launch::Phase::succeeded) {
      const auto text = launch::format_attempt(cur_, opts_.spec.max_restarts);
      std::fputs(text.c_str(), stderr);
      if (opts_.events.notice) opts_.events.notice(spdlog::level::err, text);
    }
  }

  // A node's stacks (version 6), named by the name we know it by, whatever it says.
  void take_stacks(Node& n, const json& j) {
    try {
      auto s = launch::from_wire(j, n.entry.name);
      // Only the ranks the round gave it: a node does not speak for another's ranks.
      const auto range = flight_ranks_.find(n.entry.name);
      launch::keep_own_ranks(s, range == flight_ranks_.end() ? 0 : range->second.first,
                             range == flight_ranks_.end() ? 0 : range->second.second);
      node_stacks_[n.entry.name] = std::move(s);
    } catch (const std::invalid_argument& e) {
      notes_.push_back(fmt::format("{}: its stacks were not understood: {}", n.entry.name, e.what()));
    }
  }

  // Every node's stacks as one (the report merges them into groups), and kept in the
  // launcher's copy of the attempt's folder.
  void merge_stacks() {
    if (node_stacks_.empty()) return;
    launch::FailureStacks all;
    for (auto& [node, s] : node_stacks_) {
      for (auto& r : s.ranks) all.ranks.push_back(std::move(r));
      for (auto& note : s.notes) all.notes.push_back(fmt::format("{}: {}", node, note));
    }
    node_stacks_.clear();
    std::sort(all.ranks.begin(), all.ranks.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
    try {
      if (!attempt_folder_) throw safefs::FsError(ENOENT, "the attempt's folder could not be made");
      const auto w =
          launch::write_stacks_files(*attempt_folder_, std::nullopt, all, static_cast<int>(stacks_world_size_));
      if (!w.error.empty()) log_->warn("the stacks were not kept: {}", w.error);
      all.file = w.path;
    } catch (const safefs::FsError& e) {
      log_->warn("the stacks were not kept: {}", e.what());
    }
    cur_.stacks = std::move(all);
  }

  void fatal(const std::string& message) {
    say(spdlog::level::err, "{}", message);
    // Nothing has started when this happens (auth and preflight come before any assignment);
    // closing the connections makes every agent forget the job.
    report_.status = "failed";
    report_.exit_code = 2;
    report_.message = message;  // a detached launch's result.json says why, too
    finish();
  }

  void finish() {
    if (done_) return;
    done_ = true;
    if (control_) control_->end(report_.status, end_record());
    end_recorder();  // after our own record (a guardian never replaces one): no gap before it
    boost::system::error_code ignored;
    signals_.cancel(ignored);
    user_signals_.cancel(ignored);
    tick_timer_.cancel();
    heartbeat_timer_.cancel();
    progress_timer_.cancel();
    hang_timer_.cancel();
    interrupt_timer_.cancel();
    for (auto& [name, n] : nodes_) {
      n->redial.cancel();
      if (n->conn) n->conn->close("the job is over", /*routine=*/true);
    }
    io_.stop();
  }

  void beat(Node& n, std::chrono::steady_clock::time_point at) {
    if (!n.conn || !n.conn->established()) return;
    n.conn->send_heartbeat(now().count());
    n.beat_at = at;
  }

  // Every quarter second, a beat to each node not sent one for 1.25 of its interval (its agent's
  // beats, which we answer, did not come): an agent hears from us at least every 1.5 of its
  // intervals (a third of its timeout or less), and one that beats gets no second beat.
  void heartbeat() {
    heartbeat_timer_.expires_after(opts_.heartbeat_interval / 4);
    heartbeat_timer_.async_wait([this](boost::system::error_code ec) {
      if (ec || done_) return;
      const auto at = std::chrono::steady_clock::now();
      double rate = 0;
      // Over a flat array, reading the front of each node: at 4096 nodes, walking the map and
      // each node's connection was 3% of the steady state's CPU. The pace counts joined nodes:
      // a node between its handshake and its join, or one that said `leaving` and still beats,
      // is left out (a few nodes, at worst pacing that stops a little early).
      for (Node* n : sweep_) {
        if (at - n->beat_at >= proto::coordinator_beat_due(n->beat_every)) beat(*n, at);
        if (n->joined) rate += 1000.0 / static_cast<double>(n->beat_every.count());
      }
      beats_per_s_ = rate;
      pace();
      heartbeat();
    });
  }

  void wait_signals() {
    signals_.async_wait([this](boost::system::error_code ec, int sig) {
      if (ec || done_) return;
      stop_job(sig, supervisor::signal_name(sig));
      wait_signals();
    });
  }

  // Schedulers warn of preemption with SIGUSR1/2 (SLURM: --signal=B:USR1@120): every agent of
  // the round passes it to its workers as it is, so a training script can checkpoint.
  void wait_user_signals() {
    user_signals_.async_wait([this](boost::system::error_code ec, int sig) {
      if (ec || done_) return;
      forward_signal(sig);
      wait_user_signals();
    });
  }

  // SIGUSR1/SIGUSR2, ours or a standing coordinator's submitter's.
  void forward_signal(int sig) {
    if (done_) return;
    const auto members = rdzv_.members();
    if (rounds_.round().value == 0 || members.empty()) {
      say(spdlog::level::warn, "{}: no workers run yet; not passed on", supervisor::signal_name(sig));
      return;
    }
    say(spdlog::level::info, "{}: passing it to every worker on {} node{}", supervisor::signal_name(sig),
        members.size(), members.size() == 1 ? "" : "s");
    for (const auto& m : members) {
      send(*nodes_.at(m), "signal",
           {{"job_id", opts_.job_id},
            {"round", rounds_.round().value},
            {"signal", sig == SIGUSR1 ? "SIGUSR1" : "SIGUSR2"}});
    }
  }

  // Ctrl-C, SIGTERM, SIGHUP, or `ddpctl stop` (as SIGTERM) from another terminal.
  void stop_job(int sig, const std::string& what) {
    if (done_) return;
    if (stop_signal_) {
      say(spdlog::level::warn, "{} again: killing every node's workers now",
          sig == SIGINT ? std::string("Ctrl-C") : what);
      killed_now_ = true;
      for (const auto& m : rdzv_.members()) send_stop(*nodes_.at(m), rounds_.round(), "killed by the user", Millis(0));
      return;
    }
    stop_signal_ = sig;
    // A Ctrl-C while the round runs: SIGINT first (on_effect(StopAll)). One that comes while a
    // failure's stop runs changes nothing of it.
    if (sig == SIGINT && rdzv_.state() == rdzv::State::running) {
      const auto ranks = ranks_running();
      const auto nodes = rdzv_.members().size();
      say(spdlog::level::warn,
          "Ctrl-C: sending SIGINT to {} rank{} on {} node{} (KeyboardInterrupt); SIGTERM in {}, SIGKILL {} after that; "
          "Ctrl-C again to kill now",
          ranks, ranks == 1 ? "" : "s", nodes, nodes == 1 ? "" : "s",
          format_duration(launch::interrupt_grace(opts_.spec.stop_grace)), format_duration(opts_.spec.stop_grace));
    } else {
      say(spdlog::level::warn, "{}: stopping the job on every node (SIGTERM, then SIGKILL after {}; again to kill now)",
          what, format_duration(opts_.spec.stop_grace));
    }
    handle(rdzv::StopRequested{what});
  }

  // `ddpctl status/logs/stop` from another terminal, as for a local launch. Workers' pids come
  // from the agents' worker_started; the store's waiters from node rank 0's agent, which reports
  // them with its heartbeat when they change (so they are at most a heartbeat old).
  void open_control_socket() {
    control::Provider p;
    p.status = [this] { return status(); };
    p.stop = [this](const std::string& who) { stop_job(SIGTERM, who); };
    p.log_files = [this](const std::set<int>& ranks) {
      std::vector<std::pair<int, std::string>> out;
      for (const auto& [node, pl] : rounds_.placement()) {
        for (std::uint32_t i = 0; i < pl.local_world_size; ++i) {
          const int rank = static_cast<int>(pl.rank_base + i);
          if (!ranks.empty() && !ranks.contains(rank)) continue;
          if (auto it = rank_files_.find(rank); it != rank_files_.end() && it->second.file) it->second.file->flush();
          out.emplace_back(rank, contract_log(rank));
        }
      }
      std::sort(out.begin(), out.end());
      return out;
    };
    p.stacks = [this](const std::set<int>& ranks, bool native, std::function<void(json)> reply) {
      read_stacks(ranks, native, std::move(reply));
    };
    try {
      if (!opts_.control_socket) throw control::ControlError("a standing coordinator without a folder for it");
      // The end record beside the socket in a folder given; the user's records_dir() otherwise.
      const auto dir = opts_.control_dir.empty() ? control::runtime_dir() : opts_.control_dir;
      control_.emplace(io_, control::socket_path(dir, opts_.job_id), std::move(p), opts_.control_dir);
    } catch (const control::ControlError& e) {
      log_->warn("no control socket, so ddpctl status/logs/stop cannot reach this job: {}", e.what());
    }
  }

  // `ddpctl stacks`: every node of the round that holds a rank asked for (stacks_gather.hpp).
  void read_stacks(const std::set<int>& wanted, bool native, std::function<void(json)> reply) {
    std::vector<StacksGather::NodeAsk> asks;
    int world = 0;
    for (const auto& [node, pl] : rounds_.placement()) {
      world += static_cast<int>(pl.local_world_size);
      StacksGather::NodeAsk a;
      a.node = node;
      for (std::uint32_t i = 0; i < pl.local_world_size; ++i) {
        const int rank = static_cast<int>(pl.rank_base + i);
        if (!wanted.empty() && !wanted.contains(rank)) continue;
        a.ranks.push_back(rank);
        a.local_ranks.push_back(static_cast<int>(i));
      }
      if (a.ranks.empty()) continue;
      auto it = nodes_.find(node);
      Node* n = it == nodes_.end() ? nullptr : it->second.get();
      if (!n || !n->joined || !n->conn || !n->conn->established()) {
        a.unavailable = fmt::format("node {} is not connected (lost, or leaving)", node);
      } else if (n->conn->session().version() < 6) {
        a.unavailable = fmt::format("node {}'s agent speaks protocol {} and cannot read stacks (version 6 can)", node,
                                    n->conn->session().version());
      } else {
        a.send = [this, n](json req) {
          req["job_id"] = opts_.job_id;
          send(*n, "stacks_request", std::move(req));
        };
      }
      asks.push_back(std::move(a));
    }
    stacks_.start(std::move(asks), native, native ? Millis(20'000) : Millis(5'000), world, std::move(reply));
  }

  json status() const {
    const auto now_steady = std::chrono::steady_clock::now();
    json ranks = json::array();
    for (const auto& [node, pl] : rounds_.placement()) {
      for (std::uint32_t i = 0; i < pl.local_world_size; ++i) {
        const int rank = static_cast<int>(pl.rank_base + i);
        json r{{"rank", rank}, {"node", node}, {"pid", nullptr}, {"state", "running"}};
        if (auto p = rounds_.pid({node, i}))
          r["pid"] = *p;
        else
          r["state"] = "starting";
        if (auto it = exits_.find({node, i}); it != exits_.end()) {
          r["pid"] = it->second.exit.pid;
          r["state"] = it->second.exit.describe();
        } else if (auto n = nodes_.find(node); n != nodes_.end() && !n->second->joined) {
          r["state"] = "node lost";  // its agent is gone: nobody reports this rank any more
        }
        auto lo = last_output_.find(rank);
        r["last_output_age_s"] = lo == last_output_.end()
                                     ? json(nullptr)
                                     : json(std::chrono::duration<double>(now_steady - lo->second).count());
        ranks.push_back(r);
      }
    }
    std::sort(ranks.begin(), ranks.end(), [](const json& a, const json& b) { return a["rank"] < b["rank"]; });
    return {
        {"job_id", opts_.job_id},
        {"mode", "nodes"},
        {"pid", ::getpid()},
        {"started_unix_ms", std::chrono::duration_cast<std::chrono::milliseconds>(started_.time_since_epoch()).count()},
        {"state", rdzv_.status()},
        {"attempt", rdzv_.restart_count()},
        {"restarts", rdzv_.restart_count()},
        {"max_restarts", opts_.spec.max_restarts},
        {"nodes", rdzv_.members().empty() ? hosts_ : rdzv_.members()},
        {"ranks", ranks},
        {"store", rounds_.master_port() ? fmt::format("{}:{}", master_, rounds_.master_port()) : ""},
        {"store_waiters", store_waiters_},
        {"log_dir", fmt::format("{}/{}", opts_.spec.log_dir, opts_.job_id)}};
  }

  CoordinatorOptions opts_;
  asio::io_context io_;
  asio::signal_set signals_, user_signals_;
  asio::steady_timer tick_timer_, heartbeat_timer_;
  std::optional<rdzv::TimePoint> tick_armed_;  // the deadline tick_timer_ waits for
  // The pace (pace_step()):
  double beats_per_s_ = 0;                          // the joined nodes' beats a second, as of the last heartbeat sweep
  bool pacing_ = false;                             // a pace_step() is posted
  std::chrono::steady_clock::time_point paced_at_;  // the last pace_step()'s end
  std::uint64_t messages_ = 0;                      // delivered by every node's session
  std::uint64_t messages_at_pace_ = 0;              // messages_ at the last pace_step()
  std::uint64_t full_reads_at_pace_ = 0;            // net::Connection::full_reads_on_this_thread() then
  static constexpr std::uint64_t kPacedMessagesMax = 64;
  bool killed_now_ = false;            // a second Ctrl-C: SIGKILL without the grace
  asio::steady_timer progress_timer_;  // "still waiting" while nodes are missing
  // The hang watchdog (spec.hang): the nodes' reports, each idle node's stacks, the verdict's timer.
  std::optional<hang::NodeProgress> hang_;
  std::map<std::string, std::string> hang_stacks_;
  asio::steady_timer hang_timer_;
  asio::steady_timer interrupt_timer_;  // a Ctrl-C: when the agents send SIGTERM
  std::shared_ptr<spdlog::logger> log_;
  std::vector<net::NodeEntry> entries_;
  std::vector<std::string> hosts_;
  JobClock clock_;  // every deadline and stamp of the job; before rdzv_, which starts on it
  rdzv::Rendezvous rdzv_;
  net::JobPayload payload_;
  std::string offer_spec_;  // payload_ as job_offer carries it, encoded once
  // The beat interval offered to agents of version 7 (proto/heartbeat.hpp), from the job's timeout.
  proto::Millis beat_offer_ = proto::offered_beat_interval(opts_.spec.heartbeat_timeout);
  std::chrono::steady_clock::time_point last_progress_{};
  std::map<std::string, std::unique_ptr<Node>> nodes_;
  std::vector<Node*> sweep_;                        // nodes_' nodes (made once, in run()), for heartbeat()
  std::unique_ptr<net::Dialer> dialer_;             // SSH mode; destroyed before io_
  std::shared_ptr<boost::asio::ssl::context> tls_;  // --tls: made at the first dial
  supervisor::TerminalSink terminal_;

  // After the rendezvous's AssignRanks: node rank 0's ready, the others' assigns and starts,
  // the workers' starts and exits, the attempt's close (round_machine.hpp).
  round::RoundMachine rounds_;
  json node_addresses_;                // the round's, by node rank
  std::optional<std::string> ib_hca_;  // NCCL_IB_HCA common to the round's nodes
  std::string master_;
  std::map<std::pair<std::string, std::uint32_t>, ExitInfo> exits_;
  std::vector<std::string> notes_;
  std::map<std::string, launch::FailureStacks> node_stacks_;  // the round's, by node (version 6)
  std::uint32_t stacks_round_ = 0, stacks_world_size_ = 0;
  std::vector<hang::RankDump> flight_;  // this round's flight recorder summaries, every node's
  int flight_world_ = 0;
  std::map<std::string, std::pair<int, int>> flight_ranks_;  // node -> (rank base, local world size)
  std::map<int, RankFiles> rank_files_;
  std::map<int, std::chrono::steady_clock::time_point> last_output_;  // by global rank
  bool ranks_warned_ = false;                                         // --ranks outside the job, said
  std::vector<std::string> store_waiters_;  // node rank 0's last report (sent with its heartbeat)
  std::optional<control::Server> control_;
  StacksGather stacks_{io_};
  std::chrono::system_clock::time_point started_;
  std::string attempt_dir_;
  std::vector<int> unflushed_;  // ranks whose copy has lines not yet written (flush_rank_files)
  bool flush_posted_ = false;
  std::vector<std::pair<supervisor::Stream, std::string>> to_terminal_;  // shown once on disk (flush_rank_files)
  std::optional<supervisor::Guardian> recorder_;                         // start_recorder()'s
  std::vector<pid_t> recorders_ended_;                                   // told done, not yet reaped
  std::shared_ptr<const safefs::Dir> attempt_folder_;                    // attempt_dir_, opened (null: not kept)
  std::shared_ptr<const safefs::Dir> job_folder_;  // the job's folder, opened at the first attempt
  launch::AttemptReport cur_;
  launch::JobReport report_;
  int stop_signal_ = 0;
  bool done_ = false;
};

}  // namespace

std::chrono::microseconds round_stop_timeout(std::chrono::milliseconds stop_grace) {
  return stop_grace + launch::interrupt_grace(stop_grace) + launch::kStacksBudget + hang::kConvertLimit +
         std::chrono::seconds(5);
}

int run_coordinator(CoordinatorOptions options) {
  if (options.nodes.empty()) throw CoordinatorError("no nodes to run on");
  if (options.keys.empty()) throw CoordinatorError("no key to authenticate with");
  // One socket per node: a large job needs more descriptors than the usual soft limit of 1024.
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
      rl.rlim_cur < options.nodes.size() * 2 + 256) {
    const rlim_t want = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < options.nodes.size() + 64) {
      throw CoordinatorError(fmt::format("{} nodes need more open files than this process may have ({}; ulimit -Hn)",
                                         options.nodes.size(), rl.rlim_cur));
    }
    log::get("coordinator")
        ->debug("open-files limit raised from {} to {} for {} nodes", want, rl.rlim_cur, options.nodes.size());
  }
  try {
    Coordinator c(std::move(options));
    return c.run();
  } catch (const net::WireError& e) {
    throw CoordinatorError(e.what());
  }
}

}  // namespace ddp::coordinator

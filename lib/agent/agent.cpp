// The agent daemon: listener, per-connection protocol handling, the one job's attempts, the
// store on node rank 0, heartbeats, signals and reaping. See agent.hpp for the flow and policy.
// The job's lifecycle is job_machine's (pure): this file turns frames, the shepherd's
// callbacks, closed links and signals into its events, and its effects into I/O.
#include "agent/agent.hpp"

#include "agent/interfaces.hpp"
#include "agent/job_machine.hpp"
#include "agent/preflight.hpp"
#include "agent/stdio_link.hpp"
#include "attempt/bind.hpp"
#include "binding/binding.hpp"
#include "common/host.hpp"
#include "common/log.hpp"
#include "common/safe_fs.hpp"
#include "common/strings.hpp"
#include "common/text.hpp"
#include "container/container.hpp"
#include "container/runtime.hpp"
#include "contract/contract.hpp"
#include "contract/flight_recorder.hpp"
#include "facts/discover.hpp"
#include "jobspec/jobspec.hpp"
#include "launch/nccl_holder.hpp"
#include "launch/worker_group.hpp"
#include "net/acceptor.hpp"
#include "net/advertise.hpp"
#include "net/connection.hpp"
#include "net/wire.hpp"
#include "proto/heartbeat.hpp"
#include "pyenv/probe.hpp"
#include "sdnotify/sdnotify.hpp"
#include "shepherd/client.hpp"
#include "stacks/collect.hpp"
#include "store/peers.hpp"
#include "store/report.hpp"
#include "store/server.hpp"
#include "supervisor/cgroup.hpp"
#include "supervisor/process.hpp"

#include <fmt/format.h>
#include <boost/asio.hpp>

#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <set>

namespace ddp::agent {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using net::Connection;
using net::tcp;
using nlohmann::json;

namespace {

// Output frames carry at most 16 KiB of a line: invalid UTF-8 may triple in size when the JSON
// is written, and the schema's bound for 'data' is 64 KiB.
constexpr std::size_t kOutputChunk = 16 * 1024;
// When the coordinator reads slower than workers write, output beyond this much queued is
// dropped (counted and announced) rather than buffered without bound or blocking workers.
constexpr std::size_t kMaxQueuedOutput = 64u << 20;
// Tail lines in worker_exited, and the error file's fields: bounded so one frame stays small.
constexpr std::size_t kTailLineBytes = 2048;
constexpr std::size_t kErrorFieldBytes = 64 * 1024;

std::int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A delegation's expiry is on the wall clock (Unix seconds), as its signer wrote it.
std::uint64_t wall_seconds() {
  return static_cast<std::uint64_t>(now_us() / 1000000);
}

std::string peer_label(const tcp::endpoint& ep) {
  auto a = ep.address();
  if (a.is_v6() && a.to_v6().is_v4_mapped()) a = asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6());
  return a.is_v6() ? fmt::format("[{}]:{}", a.to_string(), ep.port()) : fmt::format("{}:{}", a.to_string(), ep.port());
}

std::string plain_address(const asio::ip::address& addr) {
  auto a = addr;
  if (a.is_v6() && a.to_v6().is_v4_mapped()) a = asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6());
  return a.to_string();
}

supervisor::RunAs run_as_of(const agentconfig::LocalUser& u) {
  return {u.uid, u.gid, u.groups};
}

// Our own user's name: the log folder of jobs that run as the agent itself (no key_users).
std::string own_user_name() {
  struct passwd pw {};
  struct passwd* res = nullptr;
  std::vector<char> buf(16384);
  if (::getpwuid_r(::geteuid(), &pw, buf.data(), buf.size(), &res) == 0 && res && pw.pw_name && *pw.pw_name) {
    return pw.pw_name;
  }
  return fmt::format("uid-{}", ::geteuid());
}

std::string cut(const std::string& s, std::size_t n) {
  return s.size() <= n ? s : s.substr(0, n) + " ...(cut)";
}

class Agent {
 public:
  explicit Agent(AgentOptions opts)
      : opts_(std::move(opts)),
        acceptor_(io_),
        signals_(io_, SIGINT, SIGTERM),
        user_signals_(io_, SIGUSR1, SIGUSR2),
        sigchld_(io_, SIGCHLD),
        heartbeat_timer_(io_),
        watchdog_timer_(io_),
        log_(log::get("agent")),
        machine_(job::Config{}) {
    if (opts_.name.empty()) opts_.name = own_hostname();
    machine_ = job::JobMachine(job::Config{opts_.name, opts_.oneshot, opts_.stdio});
  }

  // The GPUs and CPUs this agent manages (--gpus, --cpus), checked against the node.
  void manage_share() {
    if (opts_.gpus) {
      try {
        facts_ = binding::restrict_gpus(std::move(facts_), *opts_.gpus);
      } catch (const std::invalid_argument& e) {
        throw AgentError(fmt::format("--gpus: {}", e.what()));
      }
    }
    cpus_ = own_affinity();
    if (opts_.cpus) {
      const std::set<int> mine(cpus_.begin(), cpus_.end());
      for (int c : *opts_.cpus) {
        if (!mine.count(c)) {
          throw AgentError(fmt::format("--cpus: CPU {} is not available to ddp-agentd (its affinity is {})", c,
                                       facts::format_cpulist(cpus_)));
        }
      }
      cpus_ = *opts_.cpus;
    }
    if (opts_.gpus || opts_.cpus) {
      log_->info("managing {} GPU{} and CPUs {}", facts_.gpus.size(), facts_.gpus.size() == 1 ? "" : "s",
                 facts::format_cpulist(cpus_));
    }
  }

  // The job's binding for this node's ranks, planned from the agent's (narrowed) facts. The
  // coordinator's `nccl_ib_hca` is the set every node shares; without it no node sets one. An
  // agent given --gpus/--cpus keeps its workers inside that share even under `binding: none`.
  void bind(contract::Plan& plan, const jobspec::BindingSpec& want, std::optional<std::string> job_ib_hca) {
    if (!want.all_none()) {
      auto b = binding::plan_binding(facts_, static_cast<int>(plan.ranks.size()), want, cpus_);
      b.nccl_ib_hca = want.nic == jobspec::NicBinding::none ? std::nullopt : std::move(job_ib_hca);
      launch::lay_binding(plan, b);
    }
    const bool uuids =
        std::all_of(facts_.gpus.begin(), facts_.gpus.end(), [](const auto& g) { return g.uuid.has_value(); });
    std::string managed;
    for (const auto& g : facts_.gpus) {
      managed += managed.empty() ? "" : ",";
      managed += uuids ? *g.uuid : std::to_string(g.index);
    }
    for (auto& r : plan.ranks) {
      if (opts_.gpus && !r.env.count("CUDA_VISIBLE_DEVICES")) r.env["CUDA_VISIBLE_DEVICES"] = managed;
      if (opts_.cpus && r.cpus.empty()) r.cpus = cpus_;
    }
  }

  // Transient units when under systemd (or asked for), else the shepherd fork.
  void choose_job_units() {
    std::string why;
    try {
      // A one-shot agent (SSH's --stdio, SLURM's) serves one run inside someone's login or
      // allocation, as that user: its job stays its child, in that session's cgroup.
      units_ = jobunit::choose(opts_.oneshot ? jobunit::Mode::fork : opts_.job_units, why);
    } catch (const jobunit::UnitError& e) {
      throw AgentError(e.what());
    }
    if (!units_) {
      log_->info("each job's shepherd runs as a child of ddp-agentd ({})", opts_.oneshot ? "one-shot agent" : why);
      return;
    }
    log_->info("each job's shepherd runs in a transient systemd unit ({})", why);
  }

  // Starts a job's shepherd in a unit of its own (lib/jobunit), for shepherd::Client.
  shepherd::Starter unit_starter(const std::string& job_id) {
    if (!units_) return {};
    return [this, job_id](const std::vector<std::string>& argv, int stdin_fd) {
      jobunit::ShepherdUnit u;
      u.job_id = job_id;
      u.agent_pid = ::getpid();
      u.sequence = ++units_started_;
      u.argv = argv;
      u.env = own_environment();
      u.stdin_fd = stdin_fd;
      u.stderr_fd = STDERR_FILENO;
      u.limits = jobunit::own_limits();
      const auto request = jobunit::shepherd_unit(u);
      try {
        const auto job = units_->start(request);
        log_->info("job {}: shepherd in unit {} (systemd job {})", job_id, request.name, job);
      } catch (const jobunit::UnitError& e) {
        throw shepherd::ShepherdError(e.what());
      }
    };
  }

  int run() {
    std::error_code ec;
    fs::create_directories(opts_.log_dir, ec);
    if (ec) throw AgentError(fmt::format("cannot create the log directory {}: {}", opts_.log_dir, ec.message()));
    if (!opts_.key_users.empty()) {  // mapped users' container env files (confinement())
      const auto dir = confined_env_dir();
      ::mkdir(dir.c_str(), 0700);
      struct stat st {};
      if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077)) {
        throw AgentError(fmt::format("{} must be a folder of this agent's user with mode 0700: remove it", dir));
      }
    }
    if (!opts_.stdio) listen();
    // Shepherds run this same binary; after an upgrade on disk /proc/self/exe still names ours.
    fs::path self = fs::read_symlink("/proc/self/exe", ec);
    shepherd_exe_ = !ec && fs::exists(self, ec) ? self.string() : "/proc/self/exe";
    supervisor::become_subreaper();
    supervisor::Cgroup::sweep_stale();
    choose_job_units();
    facts_ = facts::discover(facts::discover_options_from_env());
    manage_share();
    if (opts_.stdio) {
      // Our parent is sshd: a hang-up means the session is gone, and a write to a closed stdout
      // must be an error to handle, not a signal that kills us before the workers are stopped.
      signals_.add(SIGHUP);
      ::signal(SIGPIPE, SIG_IGN);
    }
    wait_signals();
    wait_user_signals();
    wait_sigchld();
    heartbeat();
    if (opts_.stdio && !opts_.connect_host.empty()) {
      log_->info("ddp-agentd {} connecting back to {} for one job (logs in {})", opts_.name,
                 net::format_host_port(opts_.connect_host, opts_.connect_port), opts_.log_dir);
      serve_connect_back();
    } else if (opts_.stdio) {
      log_->info("ddp-agentd {} serving one job over stdin/stdout (logs in {})", opts_.name, opts_.log_dir);
      serve_stdio();
    } else {
      log_->info("ddp-agentd {} listening on {}{} (logs in {})", opts_.name, peer_label(acceptor_.local_endpoint()),
                 opts_.oneshot ? " for one job" : "", opts_.log_dir);
      if (opts_.announce) {
        // Whoever started us (srun, for ddpctl launch --slurm) learns the port we were given.
        std::printf("%s\n", opts_.announce(acceptor_.local_endpoint().port()).c_str());
        std::fflush(stdout);
      }
      accept();
    }
    notify_.ready(idle_status());
    watchdog();
    io_.run();
    return 0;
  }

 private:
  struct Peer {
    std::shared_ptr<Connection> conn;
    std::chrono::steady_clock::time_point last_heard;
    // The peer's last heartbeat: its now_us and our clock when it arrived, echoed in ours so
    // that the coordinator gets a clock-offset sample every interval (proto/clock_sync.hpp).
    std::optional<std::int64_t> echo_t0_us, echo_rx_us;
    // How often we beat to it: every second, or, once a coordinator of version 7 offers its job,
    // at that offer or a third of our own heartbeat_timeout (proto/heartbeat.hpp); and when we last did.
    proto::Millis beat_every = proto::kBeatFloor;
    std::chrono::steady_clock::time_point beat_sent{};
    std::shared_ptr<PreflightRun> doctor;  // a facts_request's image lookup, killed if the peer goes
    job::LinkId id = 0;                    // the job machine's name for this link
    std::string key_id;                    // the key it proved (empty until it has)
  };

  // The data of the one job this agent runs (its lifecycle is machine_'s), owned by one
  // coordinator connection.
  struct Job {
    std::shared_ptr<Connection> owner;
    std::string job_id, node, user;
    std::optional<agentconfig::LocalUser> run_as;  // key_users' user; nullopt: the agent's own
    // <log_dir>/<user>/<job id>, the job's user's (common/safe_fs.hpp: reached by fd only), and
    // the attempt folders this job made in it (each made fresh, once).
    std::shared_ptr<const safefs::Dir> job_dir;
    std::set<int> attempt_dirs;
    net::JobPayload payload;
    int nproc = 0;
    contract::Env inherited;  // our environment + the launcher's forwarded variables
    // The current round's assignment, and every node's address in node rank order (node rank 0
    // and SSH launches get it: the store's allow-list, and how a stdio agent finds its own).
    std::optional<json> assign;
    std::vector<std::string> node_addresses;
    // The job's shepherd process (from its first start to the job's end) runs each round's workers.
    std::unique_ptr<shepherd::Client> shepherd;
    int rank_base = 0;
    std::uint64_t dropped_lines = 0;
    // The running round's exits as the shepherd reported them, for the machine's ReportExit.
    std::map<int, launch::WorkerExit> exits;
    std::optional<launch::RankFailure> first_failure;
    std::optional<json> stacks;                // the round's, as the shepherd took them (attempt/failure_stacks.hpp)
    std::shared_ptr<PreflightRun> preflight;   // until it joins (killed with the job): image, or Python
    std::optional<facts::PythonFacts> python;  // the job's interpreter here (lib/pyenv), for the contract
    json offer_t0_us;                          // the offer's coordinator time, echoed in the join
    std::int64_t offer_rx_us = 0;              // when the offer arrived here
  };

  void listen() {
    boost::system::error_code ec;
    auto addr = asio::ip::make_address(opts_.listen_host, ec);
    if (ec) throw AgentError(fmt::format("--listen: '{}' is not an IP address", opts_.listen_host));
    tcp::endpoint ep(addr, opts_.port);
    acceptor_.open(ep.protocol(), ec);
    if (!ec && addr.is_v6()) acceptor_.set_option(asio::ip::v6_only(false), ec);
    if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      throw AgentError(
          fmt::format("cannot listen on {}: {}{}", peer_label(ep), ec.message(),
                      ec == asio::error::address_in_use ? " (is another ddp-agentd running? use --listen)" : ""));
    }
  }

  // Out of descriptors: back off; unauthenticated connections capped (net/acceptor.hpp).
  void accept() {
    accept_loop_.emplace(acceptor_, "agent listener", log_, [this](tcp::socket s) {
      if (!machine_.shutting_down()) on_accept(std::move(s));
    });
    accept_loop_->start();
  }

  proto::Session server_session() const {
    proto::ServerConfig sc;
    sc.role = proto::Role::agent;
    sc.name = opts_.name;
    sc.software = kVersion;
    sc.keys = opts_.keys;
    sc.nonce = proto::random_nonce();
    sc.accept_roles = {proto::Role::coordinator};  // only a coordinator may give us work
    return proto::Session::server(sc);
  }

  void on_accept(tcp::socket s) {
    boost::system::error_code ec;
    auto remote = s.remote_endpoint(ec);
    auto conn = Connection::make(std::move(s), server_session(), ec ? "?" : peer_label(remote), "agent",
                                 opts_.handshake_timeout);
    conn->hold_until_established(accept_loop_->admit([w = std::weak_ptr<Connection>(conn)] {
      if (auto c = w.lock()) c->close("too many unauthenticated connections: the oldest is closed", /*routine=*/true);
    }));
    if (opts_.tls != net::TlsMode::off) {
      if (!tls_) tls_ = net::tls_server_context(opts_.keys);
      conn->use_tls({tls_, /*server=*/true, opts_.tls});
    }
    serve(std::move(conn));
  }

  // --stdio: the one coordinator is whoever writes our stdin (the launcher, through SSH). It
  // still has to prove the per-run secret it gave us, so a stray byte stream cannot run work.
  void serve_stdio() {
    stdio_.emplace(io_);
    auto conn = Connection::make(stdio_->take_socket(), server_session(), "stdio", "agent", opts_.handshake_timeout);
    stdio_->start([this](const std::string& why) { log_->info("link ended: {}", why); });
    serve(std::move(conn));
  }

  // --stdio --connect: dial the launcher, introduce ourselves with the tag it gave us, then serve
  // that connection as any coordinator's (it still has to prove the run's secret). stdin's EOF
  // (the SSH channel closed: the launcher is gone) ends it, as it ends a --stdio link.
  void serve_connect_back() {
    stdin_.emplace(io_, ::dup(STDIN_FILENO));
    watch_stdin();
    const auto where = net::format_host_port(opts_.connect_host, opts_.connect_port);
    net::dial(io_, opts_.connect_host, opts_.connect_port, std::chrono::seconds(10),
              [this, where](boost::system::error_code ec, tcp::socket s) {
                if (machine_.shutting_down()) return;
                if (ec) {
                  log_->error("cannot connect back to the launcher at {}: {}", where, ec.message());
                  return feed(job::DialFailed{});
                }
                boost::system::error_code ignored;
                s.set_option(tcp::no_delay(true), ignored);
                auto sock = std::make_shared<tcp::socket>(std::move(s));
                auto line = std::make_shared<std::string>(opts_.connect_tag + "\n");
                asio::async_write(*sock, asio::buffer(*line),
                                  [this, sock, line, where](boost::system::error_code ec, std::size_t) {
                                    if (machine_.shutting_down()) return;
                                    if (ec) {
                                      log_->error("cannot connect back to the launcher at {}: {}", where, ec.message());
                                      return feed(job::DialFailed{});
                                    }
                                    auto conn = Connection::make(std::move(*sock), server_session(),
                                                                 "launcher " + where, "agent", opts_.handshake_timeout);
                                    // The launcher speaks first, so TLS (launch --ssh --advertise-addr --tls) is told
                                    // apart as on our port.
                                    if (opts_.tls != net::TlsMode::off) {
                                      if (!tls_) tls_ = net::tls_server_context(opts_.keys);
                                      conn->use_tls({tls_, /*server=*/true, opts_.tls});
                                    }
                                    serve(std::move(conn));
                                  });
              });
  }

  void watch_stdin() {
    stdin_->async_read_some(asio::buffer(stdin_buf_), [this](boost::system::error_code ec, std::size_t) {
      if (!ec) return watch_stdin();  // nothing more is expected on stdin; its end is what counts
      log_->info("the launcher's SSH channel closed");
      for (auto& [raw, p] : std::map<Connection*, Peer>(peers_)) p.conn->close("the launcher's SSH channel closed");
      feed(job::LauncherGone{!peers_.empty()});
    });
  }

  void serve(std::shared_ptr<Connection> conn) {
    Connection* raw = conn.get();
    peers_[raw] = Peer{conn, std::chrono::steady_clock::now()};
    peers_[raw].id = ++last_link_;
    conn->start({[this, raw](const proto::PeerInfo& p) {
                   // The user as the peer wrote it (the session keeps it as sent, for comparing):
                   // it leads every line of this link, so it is shown clean.
                   raw->set_label(fmt::format("coordinator {} ({}, user {})", raw->label(),
                                              p.name.empty() ? "?" : p.name, clean_text(p.user, 256)));
                   std::size_t same_key = 0;
                   for (const auto& [other, peer] : peers_)
                     same_key += other != raw && !peer.key_id.empty() && peer.key_id == p.key_id;
                   if (same_key >= links_per_key_) {
                     const auto why = fmt::format(
                         "too many links with key '{}' to this agent: {} are open, at most {}; close some "
                         "(another ddpctl or coordinator with this key holds them)",
                         p.key_id, same_key, links_per_key_);
                     log_->warn("{}: {}; refused", raw->label(), why);
                     return raw->refuse(proto::ErrorCode::unexpected, why);
                   }
                   peers_.at(raw).key_id = p.key_id;
                   log_->info("{}: authenticated with key '{}'{}", raw->label(), p.key_id,
                              raw->encrypted() ? ", inside TLS 1.3" : "");
                 },
                 [this, raw](proto::Message m) { on_message(raw, std::move(m)); },
                 [this, raw](const std::string& reason) { on_closed(raw, reason); }});
  }

  void on_closed(Connection* raw, const std::string& reason) {
    auto it = peers_.find(raw);
    if (it == peers_.end()) return;
    auto conn = it->second.conn;
    const auto link = it->second.id;
    peers_.erase(it);
    feed(job::LinkClosed{link, reason});
  }

  void send(Connection* c, std::string_view type, json fields) {
    if (c && c->established()) c->send(c->session().message(type, std::move(fields)));
  }

  void on_message(Connection* c, proto::Message m) {
    auto it = peers_.find(c);
    if (it == peers_.end()) return;
    it->second.last_heard = std::chrono::steady_clock::now();
    const auto rx_us = now_us();
    const auto& b = m.body;
    if (m.type == "heartbeat") {
      if (m.beat.now_us) {
        it->second.echo_t0_us = *m.beat.now_us;
        it->second.echo_rx_us = rx_us;
      }
      return;
    }
    if (m.type == "facts_request") return on_facts_request(c, b);  // doctor --nodes: answered busy or not
    if (m.type == "job_offer") return on_offer(c, b, rx_us);
    const auto link = it->second.id;
    const auto job_id = b.contains("job_id") ? std::optional(b["job_id"].get<std::string>()) : std::nullopt;
    if (auto r = machine_.addressed(link, job_id, m.type)) return refuse(c, *r);
    const auto round = [&] { return b["round"].get<std::uint32_t>(); };
    if (m.type == "assign") {
      assign_body_ = b;  // for PrepareRound
      return feed(job::Assign{link, round(), b["node_rank"].get<std::uint32_t>(), b.value("start", false)});
    }
    if (m.type == "start") return feed(job::Start{link, round()});
    if (m.type == "stop") {
      return feed(job::Stop{link, round(), b["grace_ms"].get<std::uint64_t>() == 0, b["reason"].get<std::string>(),
                            b.value("interrupt_grace_ms", std::uint64_t{0})});
    }
    if (m.type == "signal") {
      const auto name = b["signal"].get<std::string>();
      return feed(job::Signal{round(), name == "SIGUSR1" ? SIGUSR1 : SIGUSR2, name});
    }
    if (m.type == "stacks_request") return on_stacks_request(b);
    c->refuse(proto::ErrorCode::unexpected, fmt::format("an agent does not take '{}'", m.type));
  }

  // `ddpctl stacks` (version 6): a query, no part of the job's lifecycle. The shepherd reads its
  // ranks (lib/stacks/collect.hpp); each rank goes up as one 'stacks' cut to fit a frame, then
  // 'stacks_done'. The answer goes to the job's owner if it is still connected.
  void on_stacks_request(const json& b) {
    const auto id = b["id"].get<std::uint64_t>();
    const auto job_id = job_->job_id;
    std::weak_ptr<Connection> owner = job_->owner;
    auto done = [this, owner, id, job_id](std::vector<stacks::RankStacks> ranks, std::string error) {
      auto c = owner.lock();
      if (!c) return;
      for (auto& r : ranks) {
        stacks::shrink_to_fit(r.stacks, kMaxStacksBytes);
        send(c.get(), "stacks",
             {{"job_id", job_id}, {"id", id}, {"rank", r.rank}, {"process", stacks::to_json(r.stacks)}});
      }
      json f{{"job_id", job_id}, {"id", id}};
      if (!error.empty()) f["error"] = error.substr(0, 4096);
      send(c.get(), "stacks_done", std::move(f));
    };
    if (!job_->shepherd) return done({}, fmt::format("no worker of job {} runs on node {}", job_id, opts_.name));
    launch::WorkerGroup::StacksQuery q;
    for (const auto& r : b["local_ranks"]) q.local_ranks.push_back(static_cast<int>(r.get<std::uint64_t>()));
    q.native = b["native"].get<bool>();
    q.budget = Millis(std::clamp<std::uint64_t>(b["budget_ms"].get<std::uint64_t>(), 100, 60'000));
    job_->shepherd->read_stacks(q, std::move(done));
  }
  // A rank's stacks in one frame (1 MiB), with room for the envelope and its MAC.
  static constexpr std::size_t kMaxStacksBytes = 900u << 10;

  // ---- the job machine's effects (lib/agent/job_machine.hpp) ----

  // Events are handled one at a time, in order: one that an effect raises (a store that cannot
  // be served, a closed link) waits until the effects before it are done.
  void feed(job::Event e) {
    events_.push_back(std::move(e));
    if (feeding_) return;
    feeding_ = true;
    while (!events_.empty()) {
      auto next = std::move(events_.front());
      events_.pop_front();
      for (auto& effect : machine_.handle(next)) std::visit([this](auto& x) { apply(x); }, effect);
    }
    feeding_ = false;
  }

  Connection* conn_of(job::LinkId link) const {
    for (const auto& [raw, p] : peers_) {
      if (p.id == link) return raw;
    }
    return nullptr;
  }

  void refuse(Connection* c, const job::Refuse& r) {
    if (!c) return;
    c->refuse(r.code == job::RefuseCode::bad_value ? proto::ErrorCode::bad_value : proto::ErrorCode::unexpected,
              r.message, r.hint);
  }

  Connection* owner() const { return job_ ? job_->owner.get() : nullptr; }

  void apply(job::Refuse& r) { refuse(conn_of(r.link), r); }
  void apply(job::PrepareRound& p) { prepare_round(p.round, p.serve); }
  void apply(job::StartWorkers& s) { start_workers(s.round); }
  void apply(job::StopWorkers& s) {
    if (!job_ || !job_->shepherd) return;
    if (s.now)
      job_->shepherd->kill_now();
    else if (s.interrupt_ms)
      // A Ctrl-C (version 6). The job's own interrupt grace bounds the coordinator's value: the
      // ranks never stay in the SIGINT step longer than the job file allows.
      job_->shepherd->request_stop(
          SIGINT, std::min(Millis(static_cast<long long>(std::min<std::uint64_t>(s.interrupt_ms, 600'000))),
                           launch::interrupt_grace(job_->payload.spec.stop_grace)));
    else
      job_->shepherd->request_stop(SIGTERM);
  }
  void apply(job::ForwardSignal& f) {
    if (job_ && job_->shepherd) job_->shepherd->forward(f.sig);
  }
  void apply(job::DropIdHolder&) {
    holder_wait_.reset();
    holder_.reset();
  }
  void apply(job::ReportExit& r) {
    if (!job_ || !job_->exits.count(r.local_rank)) return;
    const auto* detail = r.detail && job_->first_failure ? &*job_->first_failure : nullptr;
    send_exit(job_->exits.at(r.local_rank), detail);
  }
  void apply(job::ReportFinished& f) {
    if (!job_) return;
    json m{{"job_id", job_->job_id}, {"round", f.round}, {"ok", f.ok}};
    if (!f.error.empty()) m["error"] = f.error;
    // Protocol version 6: where this node's ranks were when the round stopped.
    if (job_->stacks && owner() && owner()->session().version() >= 6)
      m["stacks"] = *std::exchange(job_->stacks, std::nullopt);
    if (!f.ok && gather_flight(m)) return;  // sent once the dumps are read
    send(owner(), "attempt_finished", std::move(m));
  }
  // Version 6: a failed round's NCCL flight recorder dumps go up with attempt_finished, read by
  // the preflight helper (the converter runs as the workers' user: lib/hang/flight_gather.hpp).
  // Only where ddpctl turned the recorder on; the helper's own limit bounds the wait.
  bool gather_flight(json m) {
    auto& job = *job_;
    if (!owner() || owner()->session().version() < 6 || job.payload.spec.container || !job.assign) return false;
    const auto node = node_context();
    if (!job.attempt_dirs.count(node.restart_count)) return false;
    auto env = contract::scrub(job.inherited);
    for (const auto& [k, v] : job.payload.spec.env) env[k] = v;
    if (contract::flight_recorder(job.payload.spec, node, env).env.empty()) return false;
    auto request = preflight_request("flight", job.job_id, job.payload, env, job.payload.spec.workdir.value_or("/"));
    request["attempt_dir"] = node.attempt_dir;
    request["rank_base"] = node.rank_base;
    request["local_world_size"] = node.local_world_size;
    if (job.run_as && job.run_as->uid != ::geteuid()) {
      const auto r = run_as_of(*job.run_as);
      request["run_as"] = {{"uid", r.uid}, {"gid", r.gid}, {"groups", r.groups}};
    }
    Job* pending = job_.get();
    try {
      job.preflight = PreflightRun::start(io_, shepherd_exe_, request, [this, pending, m](const json& answer) mutable {
        if (job_.get() != pending) return;
        job_->preflight.reset();
        if (answer.contains("flight") && answer["flight"].is_array() && !answer["flight"].empty())
          m["flight"] = answer["flight"];
        if (auto w = answer.value("warning", std::string()); !w.empty())
          log_->warn("job {}: flight recorder: {}", job_->job_id, w);
        send(owner(), "attempt_finished", std::move(m));
      });
    } catch (const supervisor::SpawnError& e) {
      log_->warn("job {}: cannot read the flight recorder dumps: {}", job.job_id, e.what());
      return false;
    }
    return true;
  }
  void apply(job::SendLeaving& l) {
    // Protocol version 5; an older launcher finds the node lost when the connection closes.
    if (owner() && owner()->session().version() >= 5)
      send(owner(), "leaving", {{"job_id", job_->job_id}, {"reason", l.reason}});
  }
  void apply(job::Forget&) {
    job_.reset();
    store_.reset();
    holder_wait_.reset();
    holder_.reset();
    if (!machine_.shutting_down()) notify_.status(idle_status());
  }
  void apply(job::Exit&) {
    boost::system::error_code ignored;
    if (accept_loop_) accept_loop_->stop();
    acceptor_.close(ignored);
    finish_shutdown();
  }
  void apply(job::Log& l) {
    switch (l.level) {
      case job::Log::Level::info:
        log_->info("{}", l.text);
        break;
      case job::Log::Level::warn:
        log_->warn("{}", l.text);
        break;
      case job::Log::Level::error:
        log_->error("{}", l.text);
        break;
    }
  }

  // With an image ({runtime, image}), the answer waits for the helper that looks the image up
  // on this node (never pulling); the facts then carry its digest.
  void on_facts_request(Connection* c, const json& b) {
    if (!b.contains("image")) {
      send(c, "facts", {{"facts", facts::to_json(facts_)}});
      return;
    }
    facts::ContainerImage ci;
    ci.runtime = b["image"].value("runtime", std::string());
    ci.image = b["image"].value("image", std::string());
    auto runtime = jobspec::runtime_from_name(ci.runtime);
    if (!runtime || ci.image.empty() || ci.image.size() > 4096) {
      c->refuse(proto::ErrorCode::bad_value,
                "facts_request: image must be {runtime: docker|podman|apptainer|enroot, image}");
      return;
    }
    if (!opts_.key_users.empty() && !container::has_image_store(*runtime)) {
      // An apptainer or enroot image is a file that root would open and hash: with key_users
      // those runtimes run no user's job here (container.hpp's confinement), so nobody's key
      // gets root to read a path of its choosing.
      ci.error = fmt::format("{}this agent runs {} images for no key_users user", facts::kImageNotChecked, ci.runtime);
      auto f = facts_;
      f.container_image = ci;
      send(c, "facts", {{"facts", facts::to_json(f)}});
      return;
    }
    std::size_t lookups = 0;
    for (const auto& [other, peer] : peers_) lookups += peer.doctor != nullptr;
    if (lookups >= kMaxImageLookups) {
      ci.error = fmt::format("{}{} image lookups are already running on this node; ask again", facts::kImageNotChecked,
                             lookups);
      auto f = facts_;
      f.container_image = ci;
      send(c, "facts", {{"facts", facts::to_json(f)}});
      return;
    }
    net::JobPayload payload;
    payload.spec.command = {"true"};
    payload.spec.container =
        jobspec::ContainerSpec{*runtime, ci.image, {}, std::nullopt, jobspec::PullPolicy::never, {}, {}};
    auto answer = [this, c, ci](const json& r) mutable {
      if (!peers_.count(c)) return;
      peers_.at(c).doctor.reset();
      if (auto d = r.value("digest", std::string()); !d.empty()) ci.digest = d;
      if (auto d = r.value("repo_digest", std::string()); !d.empty()) ci.repo_digest = d;
      if (auto e = r.value("error", std::string()); !e.empty()) ci.error = e;
      if (!ci.digest && !ci.error) ci.error = "not resolved: the runtime fetches it when it runs";
      auto f = facts_;
      f.container_image = ci;
      send(c, "facts", {{"facts", facts::to_json(f)}});
    };
    try {
      peers_.at(c).doctor = PreflightRun::start(
          io_, shepherd_exe_, preflight_request("image", "doctor", payload, contract::scrub(own_environment()), "/"),
          answer);
    } catch (const supervisor::SpawnError& e) {
      answer({{"error", fmt::format("cannot start the image lookup: {}", e.what())}});
    }
  }

  void on_offer(Connection* c, const json& b, std::int64_t rx_us) {
    const auto job_id = b["job_id"].get<std::string>();
    // The id names <log_dir>/<id>/attempt-N, made as root: no '/' or '..' from the network.
    if (!jobspec::valid_job_id(job_id)) {
      c->refuse(proto::ErrorCode::bad_value,
                fmt::format("job_offer.job_id: expected {}, got '{}'", jobspec::kJobIdRule, job_id));
      return;
    }
    switch (machine_.busy(peers_.at(c).id)) {
      case job::JobMachine::Busy::no:
        break;
      case job::JobMachine::Busy::other_link:
        c->refuse(proto::ErrorCode::unexpected,
                  fmt::format("busy: {} runs job {} for {}", opts_.name, job_->job_id, job_->owner->label()),
                  "one job at a time: wait for it to end or stop it");
        return;
      case job::JobMachine::Busy::workers_running:
        c->refuse(proto::ErrorCode::unexpected, fmt::format("busy: job {} still has workers running", job_->job_id));
        return;
    }
    // Whose job this is: the key that signed its delegation (a standing coordinator's offer,
    // version 6), else the key this link proved; with key_users, that key's user (users.hpp).
    const auto decision = agentconfig::decide_offer(opts_.key_users, opts_.allowed_users, opts_.keys,
                                                    c->session().peer().key_id, b, wall_seconds());
    if (!decision.refusal.empty()) {
      log_->warn("job {} from {}: {}; refused", job_id, c->label(), decision.refusal);
      c->refuse(proto::ErrorCode::auth, fmt::format("{}: {}", opts_.name, decision.refusal), decision.hint);
      return;
    }
    net::JobPayload payload;
    try {
      payload = net::payload_from_json(b["spec"]);
    } catch (const net::WireError& e) {
      c->refuse(proto::ErrorCode::bad_value, e.what());
      return;
    }
    // The store and the rank logs are the root agent's memory and writes: the job asks within
    // the admin's limits (agent.yaml), whatever its spec says.
    if (auto why = agentconfig::over_limits(payload.spec, opts_.limits); !why.empty()) {
      log_->warn("job {} from {}: {}; refused", job_id, c->label(), why);
      c->refuse(proto::ErrorCode::auth, fmt::format("{}: {}", opts_.name, why));
      return;
    }
    // A policy refusal like the two above (auth: the coordinator gives up instead of redialling).
    // A mapped user's container runs confined (container.hpp's Confinement), or not at all.
    if (decision.user && decision.user->uid != ::geteuid() && payload.spec.container) {
      if (auto why = container::confinement_problem(*payload.spec.container)) {
        c->refuse(proto::ErrorCode::auth, fmt::format("{}: {}", opts_.name, *why),
                  "a mapped user's container may not do what the user could not do without it");
        return;
      }
    }
    auto job = std::make_unique<Job>();
    if (decision.user) job->run_as = *decision.user;
    auto& peer = peers_.at(c);
    peer.beat_every =
        proto::agent_beat_interval(c->session().version() >= 7 && b.contains("heartbeat_ms")
                                       ? std::optional(proto::Millis(b["heartbeat_ms"].get<std::int64_t>()))
                                       : std::nullopt,
                                   opts_.heartbeat_timeout);
    job->owner = peer.conn;
    job->job_id = job_id;
    job->node = b["node"].get<std::string>();
    job->user = b["user"].get<std::string>();
    job->inherited = own_environment();
    // Only what the job's env_forward selects, whatever the launcher sent.
    for (const auto& [k, v] : contract::filter_forwarded(payload.forward_env, payload.spec.env_forward))
      job->inherited[k] = v;
    job->offer_t0_us = b["t0_us"];
    job->offer_rx_us = rx_us;

    // What this node offers, and whether it can run the command at all, before any rank starts.
    json preflight{{"command", true}, {"workdir", true}};
    std::vector<std::string> problems;
    const auto& spec = payload.spec;
    switch (spec.nproc.kind) {
      case jobspec::Nproc::Kind::count:
        job->nproc = spec.nproc.count;
        break;
      case jobspec::Nproc::Kind::cpu:
        job->nproc = static_cast<int>(cpus_.size());
        break;
      case jobspec::Nproc::Kind::gpu:
        job->nproc = static_cast<int>(facts::gpu_count(facts_));
        if (job->nproc == 0) problems.push_back(fmt::format("nproc_per_node: gpu, but {} has no GPU", opts_.name));
        break;
    }
    const std::string workdir = spec.workdir.value_or("/");
    std::error_code ec;
    const bool container = spec.container.has_value();
    if (!fs::is_directory(workdir, ec)) {
      preflight["workdir"] = false;
      problems.push_back(fmt::format("workdir {} is not a directory on {}", workdir, opts_.name));
    } else if (container) {
      // The command runs inside the image: the helper below checks it there.
    } else if (job->run_as && job->run_as->uid != ::geteuid() &&
               !supervisor::accessible_as(run_as_of(*job->run_as), workdir, X_OK)) {
      preflight["workdir"] = false;
      problems.push_back(fmt::format("user {} cannot enter workdir {} on {}", job->run_as->name, workdir, opts_.name));
    } else {
      auto argv = contract::worker_argv(spec);
      auto path = job->inherited.count("PATH") ? job->inherited.at("PATH") : "/usr/bin:/bin";
      const auto exe = supervisor::resolve_executable(argv.at(0), path, workdir);
      if (!exe) {
        preflight["command"] = false;
        problems.push_back(
            fmt::format("on {}: {}", opts_.name, supervisor::explain_not_runnable(argv.at(0), path, workdir)));
      } else if (job->run_as && job->run_as->uid != ::geteuid() &&
                 !supervisor::accessible_as(run_as_of(*job->run_as), *exe, X_OK)) {
        preflight["command"] = false;
        problems.push_back(fmt::format("user {} may not run {} on {}", job->run_as->name, *exe, opts_.name));
      }
    }
    if (container && job->run_as && job->run_as->uid != ::geteuid()) {
      for (auto& p : confine_mounts(*payload.spec.container, *job->run_as, workdir)) {
        preflight["mounts"] = false;
        problems.push_back(fmt::format("{} on {}", p, opts_.name));
      }
    }
    job->payload = std::move(payload);
    // The label names the authenticated user already; the job's is said only when it differs (a
    // standing coordinator submitting for someone).
    log_->info("job {} offered by {}{}{}: node {}, {} worker{}", job_id, c->label(),
               job->user == c->session().peer().user ? "" : fmt::format(" for user {}", job->user),
               job->run_as ? fmt::format(" (runs as uid {})", job->run_as->uid) : "", job->node, job->nproc,
               job->nproc == 1 ? "" : "s");
    job_ = std::move(job);
    feed(job::Offer{peers_.at(c).id, job_id});
    notify_.status(fmt::format("running job {} for {} (user {})", job_->job_id, c->label(), job_->user));
    if (!problems.empty()) return send_join(preflight, problems);
    if (!container) return probe_python(preflight, workdir);
    // The command runs inside the image: the helper pulls it (per container.pull), resolves its
    // digest for the coordinator to compare across nodes, and checks command[0] and the workdir
    // in there. The join waits for it; heartbeats and other coordinators do not.
    const auto request =
        preflight_request("job", job_id, job_->payload,
                          contract::scrub(job_->run_as ? own_environment() : job_->inherited), workdir, confinement());
    Job* pending = job_.get();
    try {
      job_->preflight =
          PreflightRun::start(io_, shepherd_exe_, request, [this, pending, preflight](const json& answer) mutable {
            if (job_.get() != pending) return;  // (cancel() comes first when the job goes; belt and braces)
            std::vector<std::string> found;
            const auto error = answer.value("error", std::string());
            if (!error.empty()) {
              preflight["command"] = false;
              found.push_back(fmt::format("{}: {}", opts_.name, error));
            }
            if (const auto w = answer.value("warning", std::string()); !w.empty())
              log_->warn("job {}: {}", job_->job_id, w);
            const auto digest = answer.value("digest", std::string());
            preflight["image"] = {{"digest", digest}, {"repo_digest", answer.value("repo_digest", std::string())}};
            if (error.empty()) {
              log_->info("job {}: container image {} is {}", job_->job_id, job_->payload.spec.container->image,
                         digest.empty() ? "fetched by the runtime when it runs" : digest);
            }
            send_join(preflight, found);
          });
    } catch (const supervisor::SpawnError& e) {
      preflight["command"] = false;
      send_join(preflight, {fmt::format("{}: cannot start the container preflight: {}", opts_.name, e.what())});
    }
  }

  // A host job's interpreter, asked for its Python and PyTorch (lib/pyenv) by the helper, as the
  // workers' user with their environment, before the join: the contract sets what that PyTorch
  // reads. A probe that fails leaves the release unknown (the contract's safe default), never
  // the job refused.
  void probe_python(json preflight, const std::string& workdir) {
    auto env = contract::scrub(job_->inherited);
    for (const auto& [k, v] : job_->payload.spec.env) env[k] = v;
    auto request = preflight_request("python", job_->job_id, job_->payload, env, workdir);
    if (job_->run_as && job_->run_as->uid != ::geteuid()) {
      const auto r = run_as_of(*job_->run_as);
      request["run_as"] = {{"uid", r.uid}, {"gid", r.gid}, {"groups", r.groups}};
    }
    Job* pending = job_.get();
    try {
      job_->preflight =
          PreflightRun::start(io_, shepherd_exe_, request, [this, pending, preflight](const json& answer) {
            if (job_.get() != pending) return;
            if (answer.contains("python"))
              job_->python = pyenv::python_from_json(answer["python"]);
            else
              log_->warn("job {}: no Python probe: {}", job_->job_id, answer.value("error", std::string("no answer")));
            send_join(preflight, {});
          });
    } catch (const supervisor::SpawnError& e) {
      log_->warn("job {}: cannot start the Python probe: {}", job_->job_id, e.what());
      send_join(preflight, {});
    }
  }

  // The job's join, with what the preflight found; the job stays held until its coordinator
  // decides (a failed preflight makes it give up, which closes the connection).
  void send_join(json preflight, const std::vector<std::string>& problems) {
    auto& job = *job_;
    job.preflight.reset();
    preflight["detail"] = join(problems, "; ");
    if (!problems.empty()) log_->warn("job {}: preflight: {}", job.job_id, join(problems, "; "));
    json facts_summary{{"hostname", own_hostname()},
                       {"cpus", cpus_.size()},
                       {"gpus", facts::gpu_count(facts_)},
                       {"ib_hcas", binding::ib_hcas(facts_)}};
    if (job.python) {
      facts_summary["python"] = facts::to_json(*job.python);
      log_->info("job {}: Python {} {}, torch {}", job.job_id, job.python->interpreter,
                 job.python->version.value_or("?"),
                 job.python->torch.value_or(job.python->error ? "unknown: " + *job.python->error : "none"));
    }
    // The offer's time, when it arrived and when the join leaves: a clock-offset sample with
    // this node's preflight taken out of the round trip (proto/clock_sync.hpp).
    json join{{"t0_us", job.offer_t0_us}, {"rx_us", job.offer_rx_us},
              {"tx_us", now_us()},        {"job_id", job.job_id},
              {"node", opts_.name},       {"nproc", job.nproc},
              {"facts", facts_summary},   {"preflight", std::move(preflight)}};
    if (auto p = peers_.find(job.owner.get()); p != peers_.end() && job.owner->session().version() >= 7)
      join["heartbeat_ms"] = p->second.beat_every.count();  // how often we beat: the coordinator's due time
    send(job.owner.get(), "join", std::move(join));
    feed(job::Joined{});
  }

  // The machine took the round: its assignment, and on node rank 0 the store and the NCCL id,
  // then the ready (or the round's failure).
  void prepare_round(std::uint32_t round, bool serve) {
    if (!job_ || !assign_body_) return;
    auto& job = *job_;
    const json b = std::move(*assign_body_);
    assign_body_.reset();
    // The spec came with the offer; the assignment adds the round's node list where we need it.
    job.node_addresses = b.value("node_addresses", std::vector<std::string>{});
    job.assign = b;
    const auto node_rank = b["node_rank"].get<std::uint32_t>();
    log_->info("job {} round {}: node rank {} of {}, {} of {}, master {}:{}", job.job_id, round, node_rank,
               b["nnodes"].get<std::uint32_t>(),
               rank_range(b["rank_base"].get<std::uint32_t>(), b["local_world_size"].get<std::uint32_t>()),
               b["world_size"].get<std::uint32_t>(), b["master_addr"].get<std::string>(),
               b["master_port"].get<std::uint32_t>());
    holder_wait_.reset();  // the last attempt's id dies with it
    holder_.reset();
    if (!serve) {
      store_.reset();
      return;
    }
    // Node rank 0 serves the job's store, on the address the coordinator reached us at (which
    // it gave the workers as MASTER_ADDR), open to the job's nodes only; fresh every round.
    const auto host = own_address();
    const auto port = static_cast<std::uint16_t>(b["master_port"].get<std::uint32_t>());
    try {
      // The root agent binds it for the job: not a port the job's user could not bind itself.
      if (job.run_as) {
        auto why = agentconfig::store_port_refusal(port, *job.run_as, agentconfig::unprivileged_port_start());
        if (!why.empty()) throw store::StoreError(why);
      }
      // store.port 0: the port picked for the first round stays the job's.
      if (store_ && (store_host_ != host || store_port_ != port)) store_.reset();
      if (!store_) {
        store::ServerOptions so;
        so.host = host;
        so.port = port;
        so.allowed_peers = job.node_addresses;
        so.job_uid = job.run_as ? job.run_as->uid : ::geteuid();  // and root: who may connect from here
        so.totals.max_bytes = job.payload.spec.store_max_bytes;
        so.totals.max_keys = job.payload.spec.store_max_keys;
        // Never on our own loop (store.threads: 0): a request that holds the store's lock a while
        // (a huge WAIT, LIST_KEYS over a full keyspace) would hold this agent and its other jobs.
        so.threads = std::max(1u, store::threads_for(job.payload.spec.store_threads));
        so.legacy = store::legacy_hint(job.payload.spec.store_protocol,
                                       job.python ? job.python->torch : std::optional<std::string>{});
        // The default port (store.port not named: 29500) taken here, by another job's store or
        // anything else: a free one, as a local launch takes; ready tells the coordinator, which
        // gives it to the other nodes. A port the job named is that one or a failure.
        so.any_port_if_taken = !job.payload.spec.store_port_explicit;
        store_.emplace(io_, so);
        store_host_ = host;
        store_port_ = port;  // the port asked for: a later round asking for it again keeps this store
        store_->start();
        if (port != 0 && store_->port() != port)
          log_->info("job {}: store port {} is taken on this node; using a free port", job.job_id, port);
        store_->set_rank_resolver({[] { return supervisor::descendants_of(::getpid()); }, store::rank_from_environ});
        log_->info("job {}: store on {} ({}) for {}", job.job_id, store_->address(),
                   so.threads == 0 ? std::string("the agent's loop")
                                   : fmt::format("{} I/O thread{}", so.threads, so.threads == 1 ? "" : "s"),
                   join(so.allowed_peers, ", "));
      } else {
        store_->set_allowed_peers(job.node_addresses);
        store_->reset();
      }
    } catch (const store::StoreError& e) {
      store_.reset();
      const std::string why = fmt::format("{} cannot serve the job's store: {}", opts_.name, e.what());
      log_->error("job {}: {}", job.job_id, why);
      return feed(job::RoundFailed{round, why});
    }
    // The attempt's NCCL unique id, made here, by a holder with rank 0's environment (so with
    // the workers' libnccl and NCCL_SOCKET_IFNAME); the coordinator hands it to every node.
    json ready{{"job_id", job.job_id}, {"round", round}, {"master_port", store_->port()}};
    job.assign->operator[]("master_port") = store_->port();
    if (auto why = make_attempt_dir(assigned_restart_count()); !why.empty()) {
      ready["error"] = fmt::format("{}: {}", opts_.name, why);
      send(job.owner.get(), "ready", std::move(ready));
      return feed(job::Ready{round});
    }
    // The holder prints the id once NCCL has scanned the interfaces (up to 30 s): waited for on
    // this loop, asynchronously, so heartbeats, the watchdog and other coordinators go on.
    const auto node = node_context();
    const auto& spec = job.payload.spec;
    Job* pending = job_.get();
    holder_wait_ = launch::NcclHolder::start(
        io_, contract::worker_env(spec, node, worker_inherited(false), 0), spec.workdir.value_or("/"), node.attempt_dir,
        spec.nccl_unique_id, spec.container.has_value(), job_user(),
        [this, pending, round, ready = std::move(ready)](std::optional<launch::NcclHolder> holder,
                                                         std::string error) mutable {
          holder_wait_.reset();
          if (job_.get() != pending || machine_.round() != round)
            return;  // (the wait is dropped first; belt and braces)
          auto& job = *job_;
          if (!error.empty()) {
            ready["error"] =
                fmt::format("nccl.unique_id: on, but node rank 0 ({}) cannot make the id: {}", opts_.name, error);
            log_->error("job {}: {}", job.job_id, ready["error"].get<std::string>());
          } else if (holder) {
            holder_.emplace(std::move(*holder));
            ready["nccl_unique_id"] = holder_->hex();
            job.assign->operator[]("nccl_unique_id") = holder_->hex();
            log_->info("job {} round {}: NCCL unique id held by ddp-ncclid pid {}", job.job_id, round, holder_->pid());
          }
          send(job.owner.get(), "ready", std::move(ready));
          feed(job::Ready{round});
        });
  }

  int assigned_restart_count() const { return static_cast<int>((*job_->assign)["restart_count"].get<std::uint32_t>()); }

  // The current assignment as the contract's node context.
  contract::NodeContext node_context() const {
    const auto& job = *job_;
    const auto& a = *job.assign;
    contract::NodeContext node;
    node.job_id = job.job_id;
    node.node_name = job.node;
    node.node_rank = static_cast<int>(a["node_rank"].get<std::uint32_t>());
    node.nnodes = static_cast<int>(a["nnodes"].get<std::uint32_t>());
    node.local_world_size = static_cast<int>(a["local_world_size"].get<std::uint32_t>());
    node.rank_base = static_cast<int>(a["rank_base"].get<std::uint32_t>());
    node.world_size = static_cast<int>(a["world_size"].get<std::uint32_t>());
    node.master_addr = a["master_addr"].get<std::string>();
    node.master_port = static_cast<std::uint16_t>(a["master_port"].get<std::uint32_t>());
    node.restart_count = static_cast<int>(a["restart_count"].get<std::uint32_t>());
    node.use_agent_store = true;
    node.local_mode = false;
    // (made by make_attempt_dir(), which comes first; without it nothing starts)
    node.attempt_dir =
        fmt::format("{}/attempt-{}", job.job_dir ? job.job_dir->path() : opts_.log_dir, node.restart_count);
    if (a.contains("nccl_unique_id")) node.nccl_unique_id_hex = a["nccl_unique_id"].get<std::string>();
    if (job.python) node.torch_version = job.python->torch;
    return node;
  }

  // What this node's workers inherit. NCCL and gloo talk over the interface that carries the
  // rendezvous, unless the job (its env: or the launcher's forwarded NCCL_* variables) chose one.
  // A container's workers get only what enters the container (lib/container's policy).
  contract::Env worker_inherited(bool warn) const {
    const auto& job = *job_;
    const auto& spec = job.payload.spec;
    auto inherited = spec.container ? container::forwarded_into_container(job.inherited, spec) : job.inherited;
    const auto rdzv_addr = own_address();
    if (auto ifname = interface_of(rdzv_addr)) {
      for (const char* k : {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"}) {
        if (!job.payload.forward_env.count(k)) inherited[k] = *ifname;
      }
    } else if (warn) {
      log_->warn("job {}: no interface holds {}; NCCL and gloo pick their own", job.job_id, rdzv_addr);
    }
    // The user's own HOME, USER, LOGNAME and SHELL, not the agent's (the job's env: still wins).
    if (job.run_as && !spec.container) {
      for (const auto& [k, v] : agentconfig::user_environment(*job.run_as)) inherited[k] = v;
    }
    return inherited;
  }

  // Log folders, made by us (maybe root) for the job's user (common/safe_fs.hpp):
  //   <log_dir>/                      the admin's, trusted
  //   <log_dir>/<user>/               the user's, 0700: one namespace of job ids per user
  //   <log_dir>/<user>/<job>/         the user's, 0700
  //   .../attempt-<n>/                the user's, 0700, made new; rank logs 0600
  // Every step below <log_dir> goes by directory fd, without following a link. An attempt
  // folder is used only if this agent made it, in its life, for the same user and job id: a
  // coordinator that redials us (a dropped link, an elastic job re-forming without spending a
  // restart) finds the folder it had. One that was there before (a job id used before this
  // agent started) or that the job made itself is refused. (The protocol has no run identity,
  // so a job id that comes again within the agent's life continues in its folders: they are
  // the user's own, and every file in them is opened as above.)
  std::optional<safefs::Owner> job_owner(const Job& job) const {
    if (!job.run_as || job.run_as->uid == ::geteuid()) return std::nullopt;
    return safefs::Owner{job.run_as->uid, job.run_as->gid};
  }

  std::string make_job_dir(Job& job) const {
    const auto& job_id = job.job_id;
    const auto user = job.run_as ? job.run_as->name : own_user_name();
    const auto owner = job_owner(job);
    try {
      const auto root = safefs::Dir::open(opts_.log_dir);
      const auto user_dir = safefs::make_dir(root, user, 0700, owner, false);
      job.job_dir = std::make_shared<const safefs::Dir>(safefs::make_dir(user_dir, job_id, 0700, owner, false));
    } catch (const safefs::FsError& e) {
      return fmt::format("cannot make the job's log folder on {}: {}", opts_.name, e.what());
    }
    return {};
  }

  // The attempt's folder on this node (node rank 0 makes it when it starts the NCCL id holder,
  // then every node when it starts workers); workers (and the NCCL id holder) running as the
  // job's user write their error files (and NCCL's log) there. Returns why it cannot be made
  // (empty: it is there).
  std::string make_attempt_dir(int restart_count) {
    auto& job = *job_;
    if (job.attempt_dirs.count(restart_count)) return {};
    if (!job.job_dir) {
      if (auto why = make_job_dir(job); !why.empty()) return why;
    }
    const auto name = fmt::format("attempt-{}", restart_count);
    const auto key = fmt::format("{}/{}", job.job_dir->path(), name);
    const bool ours = made_attempt_dirs_.count(key) != 0;
    try {
      safefs::make_dir(*job.job_dir, name, 0700, job_owner(job), !ours);
    } catch (const safefs::FsError& e) {
      const auto why =
          e.error() == EEXIST
              ? fmt::format(
                    "{} exists already, and this agent did not make it: job id '{}' was used on {} before (or the "
                    "job made that folder itself); launch with another --job-id (the default is a new one every "
                    "time), or remove {}",
                    key, job.job_id, opts_.name, job.job_dir->path())
              : fmt::format("cannot make the attempt's log folder: {}", e.what());
      log_->error("job {}: {}", job.job_id, why);
      return why;
    }
    if (!ours) {
      // Bounded: the oldest go first (a redial comes within a job's life).
      made_attempt_order_.push_back(key);
      made_attempt_dirs_.insert(key);
      if (made_attempt_order_.size() > 4096) {
        made_attempt_dirs_.erase(made_attempt_order_.front());
        made_attempt_order_.pop_front();
      }
    }
    job.attempt_dirs.insert(restart_count);
    return {};
  }

  // The job's user for processes of its attempts (nullopt: ours).
  // A mapped user's container job: how it is confined (container.hpp); nullopt for the others.
  // Its env files go to a folder of root's under the log folder (made at the start).
  std::optional<container::Confinement> confinement() const {
    const auto& job = *job_;
    if (!job.payload.spec.container || !job.run_as || job.run_as->uid == ::geteuid()) return std::nullopt;
    container::Confinement c{job.run_as->uid, job.run_as->gid, {}, confined_env_dir()};
    for (auto g : job.run_as->groups) c.groups.push_back(g);
    return c;
  }
  std::string confined_env_dir() const { return opts_.log_dir + "/.container-env"; }

  // A mapped user's container mounts: each source made absolute (against the workdir) and
  // canonical, and readable by the user (as the user: every folder on the way counts), since
  // root's runtime mounts it. What is wrong, for the preflight; the sources are rewritten to
  // the canonical paths checked, which the runtime then gets.
  static std::vector<std::string> confine_mounts(jobspec::ContainerSpec& cs, const agentconfig::LocalUser& user,
                                                 const std::string& workdir) {
    std::vector<std::string> problems;
    cs = container::with_absolute_mounts(std::move(cs), workdir);
    for (auto& m : cs.mounts) {
      std::error_code ec;
      const auto real = fs::canonical(m.source, ec);
      if (ec) {
        problems.push_back(fmt::format("container mount source {} cannot be used: {}", m.source, ec.message()));
        continue;
      }
      const int mode = fs::is_directory(real, ec) ? (R_OK | X_OK) : R_OK;
      if (!supervisor::accessible_as(run_as_of(user), real.string(), mode)) {
        problems.push_back(fmt::format("user {} cannot read container mount source {}", user.name, m.source));
        continue;
      }
      // The runtime resolves the path again when it starts the container: a folder above the
      // source that the user can write could by then hold a link to what the user cannot read.
      // In a sticky folder (/tmp, /var/tmp) only an entry's or the folder's owner may rename it.
      std::optional<fs::path> writable;
      for (auto below = real, up = real.parent_path(); !writable; below = up, up = up.parent_path()) {
        struct stat dir {
        }, entry{};
        const bool sticky_protects = ::lstat(up.c_str(), &dir) == 0 && (dir.st_mode & S_ISVTX) &&
                                     ::lstat(below.c_str(), &entry) == 0 && dir.st_uid != user.uid &&
                                     entry.st_uid != user.uid;
        if (!sticky_protects && supervisor::accessible_as(run_as_of(user), up.string(), W_OK)) writable = up;
        if (up == up.root_path()) break;
      }
      if (writable) {
        problems.push_back(
            fmt::format("container mount source {} lies in {}, which user {} can change (it could be "
                        "swapped for a link before the runtime mounts it): mount {} itself, or a folder "
                        "in one that only root changes",
                        m.source, writable->string(), user.name, writable->string()));
        continue;
      }
      // Canonical, the path must still carry no --volume options (a link's target may hold ':').
      if (real.string().find_first_of(":,") != std::string::npos) {
        problems.push_back(
            fmt::format("container mount source {} resolves to {}, which holds ':' or ','", m.source, real.string()));
        continue;
      }
      m.source = real.string();
    }
    return problems;
  }

  std::optional<supervisor::RunAs> job_user() const {
    const auto& job = *job_;
    if (!job.run_as || job.run_as->uid == ::geteuid()) return std::nullopt;
    return supervisor::RunAs{job.run_as->uid, job.run_as->gid, job.run_as->groups};
  }

  // The machine started the assigned round: its plan, to the job's shepherd.
  void start_workers(std::uint32_t round) {
    if (!job_) return;
    if (!job_->assign) return feed(job::RoundFailed{round, fmt::format("{}: start without an assignment", opts_.name)});
    auto& job = *job_;
    const auto& a = *job.assign;
    const auto& spec = job.payload.spec;
    if (auto why = make_attempt_dir(assigned_restart_count()); !why.empty()) {
      return feed(job::RoundFailed{round, fmt::format("{}: {}", opts_.name, why)});
    }
    const auto node = node_context();
    auto inherited = worker_inherited(true);
    auto plan = contract::make_plan(spec, node, inherited);
    bind(plan, spec.binding,
         a.contains("nccl_ib_hca") ? std::optional(a["nccl_ib_hca"].get<std::string>()) : std::nullopt);
    // The shepherd owns the containers (env files, teardown, watchdog); their owner label names
    // this agent, whose death the next job's sweep on this node recognises.
    // A mapped user's runtime client runs as root: with root's environment (its PATH finds the
    // runtime), not the user's forwarded one.
    const auto confine = confinement();
    container::wrap_plan(plan, spec, confine ? own_environment() : job.inherited, container::read_host_layout(),
                         node.restart_count, container::own_owner(), spec.workdir.value_or("/"), confine);

    launch::GroupOptions go{node.restart_count, spec.workdir.value_or("/"), spec.stop_grace, spec.log_max_bytes};
    if (job.run_as && job.run_as->uid != ::geteuid()) go.run_as = run_as_of(*job.run_as);
    go.log_root = opts_.log_dir;
    // The hang watchdog samples here (the shepherd); a coordinator that predates it (version < 6)
    // could not take the node's reports.
    if (spec.hang && job.owner->session().version() >= 6) go.hang_timeout = spec.hang->timeout;
    launch::GroupCallbacks cb;
    cb.on_line = [this](int rank, supervisor::Stream s, const std::string& line) { forward_line(rank, s, line); };
    cb.on_first_failure = [this](const launch::WorkerExit& ex) {
      if (!job_) return;
      job_->exits[ex.local_rank] = ex;
      feed(job::FirstFailure{ex.local_rank, job_->rank_base + ex.local_rank, ex.describe()});
    };
    cb.on_started = [this](const std::vector<pid_t>& pids) {
      if (!job_) return;
      for (std::size_t i = 0; i < pids.size(); ++i) {
        if (pids[i] <= 0) continue;
        send(job_->owner.get(), "worker_started",
             {{"job_id", job_->job_id}, {"round", machine_.group_round()}, {"local_rank", i}, {"pid", pids[i]}});
      }
    };
    cb.on_finished = [this](launch::AttemptReport r) { on_group_finished(std::move(r)); };
    job.rank_base = node.rank_base;
    job.exits.clear();
    job.first_failure.reset();
    job.dropped_lines = 0;
    log_->info("job {} round {}: starting {} worker{} ({}), logs in {}", job.job_id, round, node.local_world_size,
               node.local_world_size == 1 ? "" : "s", rank_range(node.rank_base, node.local_world_size),
               node.attempt_dir);
    try {
      if (!job.shepherd) {
        job.shepherd = std::make_unique<shepherd::Client>(io_, shepherd_exe_, job.job_id, unit_starter(job.job_id));
      }
      job.shepherd->on_progress([this](const shepherd::Progress& p) {
        if (!job_ || !job_->owner->established()) return;
        send(job_->owner.get(), "progress",
             {{"job_id", job_->job_id},
              {"round", machine_.group_round()},
              {"idle_ms", p.idle.count()},
              {"stacks", p.stacks}});
      });
      job.shepherd->start({node.attempt_dir, go, std::move(plan)}, std::move(cb));
    } catch (const shepherd::ShepherdError& e) {
      log_->error("job {} round {}: {}", job.job_id, round, e.what());
      feed(job::RoundFailed{round, fmt::format("{}: {}", opts_.name, e.what())});
    }
  }

  void forward_line(int rank, supervisor::Stream s, const std::string& line) {
    if (!job_ || !job_->owner->established()) return;
    auto& job = *job_;
    if (job.owner->queued_bytes() > kMaxQueuedOutput) {
      if (job.dropped_lines++ == 0)
        log_->warn("job {}: the coordinator reads too slowly; dropping output lines", job.job_id);
      return;
    }
    const int local_rank = rank - job.rank_base;  // the group reports global ranks
    const char* stream = s == supervisor::Stream::out ? "stdout" : "stderr";
    for (std::size_t pos = 0; pos < line.size() || pos == 0; pos += kOutputChunk) {
      send(job.owner.get(), "output",
           {{"job_id", job.job_id},
            {"round", machine_.group_round()},
            {"local_rank", local_rank},
            {"stream", stream},
            {"data", line.substr(pos, kOutputChunk)}});
      if (line.empty()) break;
    }
  }

  void send_exit(const launch::WorkerExit& ex, const launch::RankFailure* detail) {
    auto& job = *job_;
    json m{{"job_id", job.job_id},
           {"round", machine_.group_round()},
           {"local_rank", ex.local_rank},
           {"pid", ex.pid > 0 ? ex.pid : 0},
           {"time_us", std::chrono::duration_cast<std::chrono::microseconds>(ex.when.time_since_epoch()).count()}};
    if (ex.signal)
      m["signal"] = ex.signal;
    else
      m["exit_code"] = ex.exit_code;
    // Version 6: killed by a signal this node forwarded (SIGUSR1/2), so no failure of its own.
    if (ex.forwarded && job.owner && job.owner->session().version() >= 6) m["forwarded"] = true;
    // Version 6: this node's stop signals had gone out: a consequence, never the first failure.
    if (ex.after_stop && job.owner && job.owner->session().version() >= 6) m["after_stop"] = true;
    if (detail) {
      json tail = json::array();
      for (const auto& l : detail->last_lines) tail.push_back(cut(l, kTailLineBytes));
      m["tail"] = tail;
      if (detail->error_file) {
        const auto& e = *detail->error_file;
        m["error_file"] = {{"path", e.path},
                           {"message", cut(e.message, kErrorFieldBytes)},
                           {"traceback", cut(e.traceback, kErrorFieldBytes)},
                           {"raw", cut(e.raw, kErrorFieldBytes)}};
      }
    }
    send(job.owner.get(), "worker_exited", m);
  }

  void on_group_finished(launch::AttemptReport r) {
    if (!job_) return;
    job::WorkersDone done;
    done.ok = r.phase == launch::Phase::succeeded;
    done.dropped_lines = job_->dropped_lines;
    for (const auto& ex : r.exits) {
      if (!ex.started) continue;
      job_->exits[ex.local_rank] = ex;
      done.started_ranks.push_back(ex.local_rank);
    }
    job_->stacks.reset();
    if (r.stacks) job_->stacks = launch::to_wire(*r.stacks);
    if (r.first_failure) {
      done.first_failure = r.first_failure->exit.local_rank;
      job_->first_failure = std::move(r.first_failure);
    }
    feed(std::move(done));
  }

  // The address the job's peers reach this node at: where the coordinator reached us over TCP;
  // over stdio, the launcher's record of it (this node's entry in the job's node list, in node
  // rank order, from the SSH server address the node reported).
  std::string own_address() const {
    // Connected back to the launcher, our socket's address faces the launcher, not the job's peers.
    auto local = opts_.stdio ? std::nullopt : job_->owner->local_endpoint();
    if (local) return plain_address(local->address());
    const auto& addrs = job_->node_addresses;
    const auto rank = job_->assign ? (*job_->assign)["node_rank"].get<std::uint32_t>() : 0;
    return rank < addrs.size() ? addrs[rank] : std::string();
  }

  // Every second: each peer's silence checked, and a beat to each peer due one (its beat_every,
  // to within half a tick: every other tick at 2 s).
  void heartbeat() {
    heartbeat_timer_.expires_after(opts_.heartbeat_interval);
    heartbeat_timer_.async_wait([this](boost::system::error_code ec) {
      if (ec) return;
      const auto now = std::chrono::steady_clock::now();
      std::vector<std::shared_ptr<Connection>> silent;
      for (auto& [raw, p] : peers_) {
        if (!p.conn->established()) continue;
        if (now - p.last_heard > opts_.heartbeat_timeout) {
          silent.push_back(p.conn);
          continue;
        }
        if (now - p.beat_sent < p.beat_every - opts_.heartbeat_interval / 2) continue;
        p.beat_sent = now;
        std::optional<proto::Session::Echo> echo;
        if (p.echo_t0_us) echo = proto::Session::Echo{*p.echo_t0_us, *p.echo_rx_us};
        raw->send_heartbeat(now_us(), echo);
      }
      for (auto& c : silent) {
        c->close(fmt::format("no heartbeat from the coordinator for more than {}",
                             format_duration(opts_.heartbeat_timeout)));
      }
      report_waiters();
      heartbeat();
    });
  }

  // Node rank 0: who waits for which store key, for `ddpctl status` on the launcher; sent with
  // the heartbeat whenever it changed (the ages in it change every second, so while anyone
  // waits that is every heartbeat).
  void report_waiters() {
    if (!job_ || !store_ || !job_->assign || !job_->owner->established()) return;
    const auto world = static_cast<int>((*job_->assign)["world_size"].get<std::uint32_t>());
    json lines = json::array();
    const auto text = store::format_wait_report(store_->waiters(), world, store::Clock::now());  // split() views it
    for (auto line : split(text, '\n')) {
      if (!line.empty()) lines.push_back(std::string(line));
    }
    if (lines == last_waiters_) return;
    last_waiters_ = lines;
    send(job_->owner.get(), "status",
         {{"jobs", json::array({{{"job_id", job_->job_id},
                                 {"round", machine_.round()},
                                 {"store", store_->address()},
                                 {"store_waiters", lines}}})}});
  }

  std::string idle_status() const {
    if (opts_.stdio) return "idle, serving one job over stdin/stdout";
    return fmt::format("idle, listening on {}", peer_label(acceptor_.local_endpoint()));
  }

  // Pings systemd's watchdog from this loop, so a stuck loop is what stops the pings.
  void watchdog() {
    const auto interval = notify_.watchdog_interval();
    if (!interval) return;
    notify_.watchdog();
    watchdog_timer_.expires_after(*interval);
    watchdog_timer_.async_wait([this](boost::system::error_code ec) {
      if (!ec) watchdog();
    });
  }

  void wait_sigchld() {
    sigchld_.async_wait([this](boost::system::error_code ec, int) {
      if (ec) return;
      // Shepherds, and strays that re-parented to us (a shepherd killed with -9 leaves its
      // workers' setsid()'d descendants to the subreaper above it).
      while (true) {
        int status = 0;
        const pid_t pid = ::waitpid(-1, &status, WNOHANG);
        if (pid <= 0) break;
        if (job_ && job_->shepherd) job_->shepherd->on_reaped(pid, status);
        if (PreflightRun::was_cancelled(pid)) supervisor::Cgroup::sweep_stale();  // its helper's cgroup
      }
      wait_sigchld();
    });
  }

  void wait_signals() {
    signals_.async_wait([this](boost::system::error_code ec, int sig) {
      if (ec) return;
      const auto name = supervisor::signal_name(sig);
      if (!machine_.shutting_down()) {
        notify_.stopping(
            fmt::format("{}: stopping{}", name, job_ ? fmt::format(" job {}'s workers", job_->job_id) : ""));
        boost::system::error_code ignored;
        if (accept_loop_) accept_loop_->stop();
        acceptor_.close(ignored);
      }
      feed(job::Shutdown{name});
      wait_signals();
    });
  }

  // SIGUSR1/SIGUSR2 sent to the agent itself (kill, or a scheduler signalling every process of
  // its job step) go to the workers as they are, as ddpctl does locally; never the agent's death.
  void wait_user_signals() {
    user_signals_.async_wait([this](boost::system::error_code ec, int sig) {
      if (ec) return;
      feed(job::Signal{std::nullopt, sig, supervisor::signal_name(sig)});
      wait_user_signals();
    });
  }

  void finish_shutdown() {
    for (auto& [raw, p] : std::map<Connection*, Peer>(peers_)) p.conn->close("ddp-agentd is shutting down");
    io_.stop();
  }

  AgentOptions opts_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  asio::signal_set signals_, user_signals_, sigchld_;
  asio::steady_timer heartbeat_timer_, watchdog_timer_;
  sdnotify::Notifier notify_;
  std::shared_ptr<spdlog::logger> log_;
  std::optional<net::Acceptor<tcp>> accept_loop_;  // after log_ and acceptor_, which it uses
  facts::NodeFacts facts_;                         // narrowed to the GPUs this agent manages
  std::vector<int> cpus_;                          // the CPUs it manages: its affinity, narrowed by --cpus
  std::map<Connection*, Peer> peers_;
  // Links one key may hold at once (links_per_key_cap), from the descriptors we started with.
  const std::size_t links_per_key_ = links_per_key_cap(net::nofile_soft_limit());
  std::unique_ptr<Job> job_;  // the job's data; its lifecycle is machine_'s
  job::JobMachine machine_;
  std::deque<job::Event> events_;  // fed, not yet handled (feed())
  bool feeding_ = false;
  job::LinkId last_link_ = 0;
  std::optional<json> assign_body_;          // the assign being taken (PrepareRound)
  std::set<std::string> made_attempt_dirs_;  // attempt folders this agent made (make_attempt_dir)
  std::deque<std::string> made_attempt_order_;
  std::optional<store::Server> store_;
  std::optional<launch::NcclHolder> holder_;             // node rank 0: the current attempt's NCCL id
  std::unique_ptr<launch::NcclHolderWait> holder_wait_;  // node rank 0: the id on its way (then the ready)
  std::optional<StdioLink> stdio_;
  std::shared_ptr<boost::asio::ssl::context> tls_;       // made at the first accepted connection
  std::optional<asio::posix::stream_descriptor> stdin_;  // --connect: watched for EOF
  std::array<char, 256> stdin_buf_{};
  std::string store_host_;
  std::uint16_t store_port_ = 0;       // as the job asked (0: any)
  json last_waiters_ = json::array();  // as last sent (report_waiters)
  std::string shepherd_exe_;
  std::unique_ptr<jobunit::Manager> units_;  // nullptr: shepherds are our children
  unsigned units_started_ = 0;
};

}  // namespace

std::size_t links_per_key_cap(std::uint64_t nofile_soft) {
  return static_cast<std::size_t>(std::clamp<std::uint64_t>(nofile_soft / 8, 4, 64));
}

int run_agent(AgentOptions options) {
  Agent agent(std::move(options));
  return agent.run();
}

}  // namespace ddp::agent

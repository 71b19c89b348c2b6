// The standing coordinator's edge: the listener, ctl sessions, one thread per job, and the
// relays to the submitter and to the jobs' control sockets. See standing.hpp for the policy.
#include "coordinator/standing.hpp"
#include "coordinator/stacks_gather.hpp"

#include "common/log.hpp"
#include "common/text.hpp"
#include "control/log_merge.hpp"
#include "control/paths.hpp"
#include "control/protocol.hpp"
#include "coordinator/coordinator.hpp"
#include "coordinator/relay_limits.hpp"
#include "jobspec/jobspec.hpp"
#include "net/acceptor.hpp"
#include "net/connection.hpp"
#include "net/wire.hpp"
#include "proto/delegation.hpp"
#include "sdnotify/sdnotify.hpp"
#include "supervisor/process.hpp"

#include <boost/asio.hpp>

#include <fmt/format.h>

#include <filesystem>
#include <regex>

#include <chrono>
#include <csignal>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

namespace ddp::coordinator {

namespace asio = boost::asio;
using net::Connection;
using net::tcp;
using nlohmann::json;

namespace {

// A submitter that reads slower than its job writes loses lines beyond this much queued.
constexpr std::size_t kMaxQueuedOutput = 8u << 20;
// Inlined log files are sent while less than this is queued for the client, then paced.
constexpr std::size_t kRelayHighWater = 4u << 20;
// A relayed line's bound (proto/messages.json's control.line, 768 KiB), less room for the job id.
constexpr std::size_t kMaxRelayedLine = 760u << 10;
constexpr auto kRelayPace = std::chrono::milliseconds(20);
// One control line from a job's socket (a worker line is at most 64 KiB, JSON-escaped).
constexpr std::size_t kMaxControlLine = 768u << 10;

std::string endpoint_label(const tcp::endpoint& ep) {
  auto a = ep.address();
  if (a.is_v6() && a.to_v6().is_v4_mapped()) a = asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6());
  return a.is_v6() ? fmt::format("[{}]:{}", a.to_string(), ep.port()) : fmt::format("{}:{}", a.to_string(), ep.port());
}

std::string level_kind(spdlog::level::level_enum l) {
  return l >= spdlog::level::err ? "error" : l == spdlog::level::warn ? "warning" : "info";
}

struct Job {
  std::string id, user;
  std::thread thread;
  std::mutex mu;
  std::function<void(int, const std::string&)> signal;      // set while the job's loop runs (under mu)
  std::optional<std::pair<int, std::string>> pending_stop;  // a stop that came before the loop ran (under mu)
  std::weak_ptr<Connection> submitter;                      // empty: detached, or the submitter left
  std::uint64_t dropped = 0;
  std::string record_dir;  // where its control server leaves its end record; empty: none
  std::string logs;        // the launcher's copy of its user's logs (<log dir>/<user>)
  std::int64_t submitted_unix_ms = 0;
  std::size_t nodes = 0;  // listed in its submit: a connection each
};

// A job that ended here, kept for `ddpctl status|logs|stop|stacks --coordinator` after it (in
// memory: a restarted coordinator knows none): its end record and its user.
struct EndedJob {
  std::string user;
  control::Ended record;
  std::size_t bytes = 0;  // what its record holds, about
};
// Jobs that ended here, remembered at most (the oldest forgotten first: a user's own past their
// share, anyone's past the total), and for at most as long as a launcher keeps its end records.
constexpr std::size_t kMaxEndedJobs = 1024;
constexpr std::size_t kMaxEndedJobsPerUser = 64;
constexpr std::size_t kMaxEndedBytes = 16u << 20;        // their records' paths, all told
constexpr std::size_t kMaxEndedBytesPerUser = 4u << 20;  // one user's share of that
constexpr std::size_t kMaxEndedMessage = 4096;           // a record's why (its job's launcher's message)
// A run's record taken even when it says it ended this much before the job was submitted (the
// wall clock stepped back meanwhile); an older one is an earlier run's.
constexpr std::int64_t kClockSlackMs = 60'000;
constexpr auto kEndedKept = std::chrono::hours(24 * 30);

std::int64_t unix_ms_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// One `control` request carried to a job's control socket, and its answer back.
struct Relay {
  explicit Relay(asio::io_context& io) : sock(io), pace(io), buf(kMaxControlLine) {}
  asio::local::stream_protocol::socket sock;
  asio::steady_timer pace;
  asio::streambuf buf;
  std::string job_id;
  std::string user;       // who asked (relay_limits.hpp counts per user)
  std::size_t files = 0;  // log files its backlog may hold open (0 once the backlog is sent)
  bool answered = false;
  bool ended = false;
  std::optional<control::Request> attempts;  // `logs --attempt`: read here from the job's folder (send_attempts)
};

class Standing {
 public:
  explicit Standing(StandingOptions o)
      : opts_(std::move(o)),
        acceptor_(io_),
        signals_(io_, SIGINT, SIGTERM),
        watchdog_timer_(io_),
        log_(log::get("coordinator")),
        relay_limits_(relay_limits(net::nofile_soft_limit(), net::nofile_hard_limit())) {}

  int run() {
    listen();
    // A client that vanished must be an error on its socket, not a signal that kills every job.
    ::signal(SIGPIPE, SIG_IGN);
    wait_signals();
    accept();
    log_->info("ddp-coordinator listening on {} (the launcher's copy of job logs in {})",
               endpoint_label(acceptor_.local_endpoint()), opts_.log_dir);
    notify_.ready(status_line());
    watchdog();
    io_.run();
    for (auto& [id, j] : jobs_) {
      if (j->thread.joinable()) j->thread.join();
    }
    return 0;
  }

 private:
  void listen() {
    boost::system::error_code ec;
    auto addr = asio::ip::make_address(opts_.listen_host, ec);
    if (ec) throw StandingError(fmt::format("--listen: '{}' is not an IP address", opts_.listen_host));
    tcp::endpoint ep(addr, opts_.port);
    acceptor_.open(ep.protocol(), ec);
    if (!ec && addr.is_v6()) acceptor_.set_option(asio::ip::v6_only(false), ec);
    if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      throw StandingError(
          fmt::format("cannot listen on {}: {}{}", endpoint_label(ep), ec.message(),
                      ec == asio::error::address_in_use ? " (is another ddp-coordinator running? use --listen)" : ""));
    }
  }

  // Out of descriptors: back off; unauthenticated connections capped (net/acceptor.hpp).
  void accept() {
    accept_loop_.emplace(acceptor_, "coordinator listener", log_, [this](tcp::socket s) {
      if (!stopping_) on_accept(std::move(s));
    });
    accept_loop_->start();
  }

  void on_accept(tcp::socket s) {
    boost::system::error_code ec;
    auto remote = s.remote_endpoint(ec);
    proto::ServerConfig sc;
    sc.role = proto::Role::coordinator;
    sc.name = "ddp-coordinator";
    sc.software = kStandingVersion;
    sc.keys = opts_.keys;
    sc.nonce = proto::random_nonce();
    sc.accept_roles = {proto::Role::ctl};      // agents are dialled by us, never the other way
    sc.delegate_key = opts_.keys.first()->id;  // what ddpctl's delegations name (version 6)
    auto conn = Connection::make(std::move(s), proto::Session::server(sc), ec ? "?" : endpoint_label(remote),
                                 "coordinator", opts_.handshake_timeout);
    conn->hold_until_established(accept_loop_->admit([w = std::weak_ptr<Connection>(conn)] {
      if (auto c = w.lock()) c->close("too many unauthenticated connections: the oldest is closed", /*routine=*/true);
    }));
    if (opts_.tls != net::TlsMode::off) {
      if (!tls_) tls_ = net::tls_server_context(opts_.keys);
      conn->use_tls({tls_, /*server=*/true, opts_.tls});
    }
    Connection* raw = conn.get();
    clients_[raw] = conn;
    conn->start({[this, raw](const proto::PeerInfo& p) {
                   const auto id = client_identity(opts_.key_users, p.key_id, p.user);
                   if (!id.refusal.empty()) {
                     log_->warn("ddpctl {}: {}; refused", raw->label(), id.refusal);
                     return raw->refuse(proto::ErrorCode::auth, id.refusal, id.hint);
                   }
                   std::size_t mine = 0;
                   for (const auto& [other, u] : users_) mine += u == id.user ? 1 : 0;
                   if (auto why =
                           refuse_client(relay_limits_, users_.size(), mine, id.user, !opts_.key_users.empty())) {
                     log_->warn("ddpctl {}: {}; refused", raw->label(), *why);
                     return raw->refuse(proto::ErrorCode::bad_value, *why);
                   }
                   users_[raw] = id.user;
                   // Without --key-user, the user the client declared: shown clean in every line.
                   raw->set_label(fmt::format("ddpctl {} (user {})", raw->label(), clean_text(id.user, 256)));
                   log_->debug("{}: authenticated with key '{}'{}", raw->label(), p.key_id,
                               raw->encrypted() ? ", inside TLS 1.3" : "");
                 },
                 [this, raw](proto::Message m) { on_message(raw, std::move(m)); },
                 [this, raw](const std::string&) {
                   if (auto it = relays_.find(raw); it != relays_.end()) {
                     // The relay's pending handlers still hold it and run after `raw` is freed:
                     // ended keeps them from touching the connection.
                     it->second->ended = true;
                     boost::system::error_code ignored;
                     it->second->sock.close(ignored);
                     it->second->pace.cancel();
                     relays_.erase(it);
                   }
                   clients_.erase(raw);
                   users_.erase(raw);
                 }});
  }

  static void send(Connection* c, std::string_view type, json fields) {
    if (c && c->established()) c->send(c->session().message(type, std::move(fields)));
  }

  // The user a client acts as (identity.hpp), set once its connection is established and not refused.
  const std::string* user_of(Connection* c) const {
    auto it = users_.find(c);
    return it == users_.end() ? nullptr : &it->second;
  }

  void on_message(Connection* c, proto::Message m) {
    if (!user_of(c)) return;  // refused at establishment: its frames behind the handshake are moot
    if (m.type == "submit") return on_submit(c, m.body);
    if (m.type == "stop_job") return on_stop_job(c, m.body);
    if (m.type == "signal_job") return on_signal_job(c, m.body);
    if (m.type == "control") return on_control(c, m.body);
    if (m.type == "heartbeat") return;
    c->refuse(proto::ErrorCode::unexpected, fmt::format("a coordinator does not take '{}' from ddpctl", m.type));
  }

  // The submitter, or root (a root-mapped key with key_users), may stop or inspect a job.
  static bool may_touch(const Job& j, const std::string& user) { return coordinator::may_touch(j.user, user); }

  void on_submit(Connection* c, const json& b) {
    const auto job_id = b["job_id"].get<std::string>();
    // The id names <log_dir>/<user>/<id> and a control socket, made as root: no '/' or '..' from the network.
    if (!jobspec::valid_job_id(job_id)) {
      return c->refuse(proto::ErrorCode::bad_value,
                       fmt::format("submit.job_id: expected {}, got '{}'", jobspec::kJobIdRule, job_id));
    }
    const auto user = b["user"].get<std::string>();
    const auto& peer_user = *user_of(c);
    if (user != peer_user) {
      return c->refuse(
          proto::ErrorCode::auth,
          fmt::format("the job claims user '{}' but this connection is user '{}'", user, peer_user),
          opts_.key_users.empty() ? "" : "with key_users, a job runs as the user its submitter's key maps to");
    }
    if (stopping_) return c->refuse(proto::ErrorCode::unexpected, "ddp-coordinator is shutting down");
    if (jobs_.count(job_id)) {
      return c->refuse(proto::ErrorCode::bad_value,
                       fmt::format("a job named {} already runs on this coordinator", job_id));
    }
    std::size_t mine = 0;
    for (const auto& [id, j] : jobs_) mine += j->user == user ? 1 : 0;
    if (auto why = refuse_job(relay_limits_, jobs_.size(), mine, user)) {
      log_->warn("{}: {}; refused", c->label(), *why);
      return c->refuse(proto::ErrorCode::bad_value, *why);
    }
    net::JobPayload payload;
    try {
      payload = net::payload_from_json(b["spec"]);
    } catch (const net::WireError& e) {
      return c->refuse(proto::ErrorCode::bad_value, fmt::format("submit.spec: {}", e.what()));
    }
    auto nodes = b["nodes"].get<std::vector<std::string>>();
    if (nodes.empty()) return c->refuse(proto::ErrorCode::bad_value, "submit.nodes: no nodes to run on");
    {
      std::size_t all_nodes = 0, my_nodes = 0;
      for (const auto& [id, j] : jobs_) {
        all_nodes += j->nodes;
        if (j->user == user) my_nodes += j->nodes;
      }
      if (auto why = refuse_nodes(relay_limits_, all_nodes, my_nodes, user, nodes.size())) {
        log_->warn("{}: {}; refused", c->label(), *why);
        return c->refuse(proto::ErrorCode::bad_value, *why);
      }
    }
    // The delegation goes to the agents as it came; checked here too (we hold the same keys) so
    // that a bad one is refused now, with its reason, not by every agent at the job's start.
    std::optional<json> delegation;
    if (b.contains("delegation")) {
      std::string error;
      auto d = proto::delegation_from_json(b["delegation"], &error);
      if (d) {
        const auto now_s = static_cast<std::uint64_t>(
            std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
                .count());
        if (auto why = proto::verify_delegation(*d, opts_.keys,
                                                {job_id, user, opts_.keys.first()->id, c->session().peer().key_id,
                                                 proto::payload_digest(b["spec"]), now_s})) {
          error = *why;
        }
      }
      if (!error.empty()) {
        log_->warn("job {} from {}: {}; refused", job_id, c->label(), error);
        return c->refuse(proto::ErrorCode::auth, "submit: " + error);
      }
      delegation = b["delegation"];
    } else if (!opts_.key_users.empty()) {
      // Without one the agents would decide by our own key: with --key-user, only a job its
      // submitter signed runs anywhere.
      log_->warn("job {} from {}: no delegation; refused", job_id, c->label());
      return c->refuse(proto::ErrorCode::auth,
                       "submit: the job carries no delegation, and this coordinator (--key-user) runs only jobs their "
                       "submitter signed",
                       "use a ddpctl of protocol version 6 or later (ddpctl --version)");
    }
    // Each user's logs in a folder of their own: a job id another user used before is theirs.
    // (a path component: no '/', no leading '.' or '-'; dots, capitals and digits as LDAP has them)
    static const std::regex user_re("^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}\\$?$");
    if (!std::regex_match(user, user_re)) {
      return c->refuse(proto::ErrorCode::bad_value, fmt::format("submit.user: '{}' is not a user name", user));
    }
    const bool detach = b.value("detach", false);

    auto job = std::make_shared<Job>();
    job->id = job_id;
    job->user = user;
    job->nodes = nodes.size();
    job->submitted_unix_ms = unix_ms_now();
    if (!detach) job->submitter = clients_.at(c);

    CoordinatorOptions o;
    o.spec = std::move(payload.spec);
    o.spec.log_dir = (std::filesystem::path(opts_.log_dir) / user).string();  // the launcher's copy of the logs
    job->logs = o.spec.log_dir;
    // <log_dir>/<user>, made and held through descriptors (we are root; whoever can write near
    // it must not steer us through a link): a folder of ours, or no copy of the logs.
    o.log_folder_only = true;
    try {
      std::error_code ec;
      std::filesystem::create_directories(opts_.log_dir, ec);  // the admin's
      o.log_folder = std::make_shared<const safefs::Dir>(
          safefs::make_dir(safefs::Dir::open(opts_.log_dir), user, 0755, std::nullopt, false));
    } catch (const safefs::FsError& e) {
      log_->warn("job {}: no copy of its logs is kept: {}", job_id, e.what());
    }
    // Its control socket in our folder for jobs: never at a name a launch of our own user uses.
    try {
      o.control_dir = control::coordinator_jobs_dir();
      job->record_dir = o.control_dir;
      // An earlier job's record of this id (anyone's) must not answer for this one, however
      // early this one fails (before its control server, which forgets it too, is made).
      control::forget_ended(job->record_dir, job_id);
    } catch (const control::ControlError& e) {
      log_->warn("job {}: no folder for its control socket: {}", job_id, e.what());
      o.control_socket = false;  // never the folder of our own user's launches instead
    }
    o.nodes = std::move(nodes);
    o.keys = opts_.keys;
    o.job_id = job_id;
    o.user = user;
    o.delegation = std::move(delegation);
    // The submitter asked for TLS on every link of its job (its own is already), or we insist.
    o.tls = b.value("tls", false) || opts_.tls == net::TlsMode::required;
    o.quiet = true;
    o.launcher_env = std::move(payload.forward_env);
    o.own_signals = false;
    o.events.output = [this, job](const std::string& node, int rank, supervisor::Stream s, const std::string& line) {
      asio::post(io_, [this, job, node, rank, s, line] { relay_output(*job, node, rank, s, line); });
    };
    o.events.notice = [this, job](spdlog::level::level_enum level, const std::string& text) {
      asio::post(io_, [job, level, text] {
        send(job->submitter.lock().get(), "job_event",
             {{"job_id", job->id}, {"kind", level_kind(level)}, {"message", text.substr(0, 262144)}});
      });
    };
    // What `launch --coordinator --detach` waits for before it returns (client.cpp).
    o.on_running = [this, job] {
      asio::post(io_, [job] {
        send(job->submitter.lock().get(), "job_event",
             {{"job_id", job->id}, {"kind", "running"}, {"message", "every rank has started"}});
      });
    };
    o.events.started = [job](std::function<void(int, const std::string&)> signal) {
      std::lock_guard lock(job->mu);
      job->signal = std::move(signal);
      if (auto p = std::exchange(job->pending_stop, std::nullopt)) job->signal(p->first, p->second);
    };
    auto report = std::make_shared<launch::JobReport>();
    o.events.done = [job, report](const launch::JobReport& r) {
      std::lock_guard lock(job->mu);
      job->signal = nullptr;  // the job's loop is gone: nothing may be posted to it any more
      *report = r;
    };

    send(c, "job_accepted", {{"job_id", job_id}});
    log_->info("job {}: submitted by {} for {} node{}{}", job_id, c->label(), o.nodes.size(),
               o.nodes.size() == 1 ? "" : "s", detach ? " (detached)" : "");
    jobs_[job_id] = job;
    notify_.status(status_line());
    job->thread = std::thread([this, job, report, o = std::move(o)]() mutable {
      std::string error;
      try {
        run_coordinator(std::move(o));
      } catch (const std::exception& e) {
        error = e.what();
      }
      {
        // run_coordinator may throw after `started` without `done`: its loop is gone all the same.
        std::lock_guard lock(job->mu);
        job->signal = nullptr;
      }
      asio::post(io_, [this, job, report, error] { on_job_over(job, *report, error); });
    });
  }

  // Its end record: the one its control server left for this run, else one made from its result.
  // Only its user's log files are kept in it (<log dir>/<user>/...).
  void remember_ended(const Job& job, const std::string& state, int exit_code) {
    std::optional<control::Ended> left;
    if (!job.record_dir.empty()) left = control::read_ended(job.record_dir, job.id);
    if (left && left->ended_unix_ms < job.submitted_unix_ms - kClockSlackMs) left.reset();  // an earlier run's
    control::Ended record;
    if (left && left->status == state) {
      record = std::move(*left);
    } else {  // none, or it says otherwise than the job's result (which the submitter was told)
      record = control::ended_now(job.id, state, exit_code, left ? left->logs : job.logs, std::nullopt);
      if (left) record.files = std::move(left->files);
    }
    const std::string mine = job.logs + "/";
    std::erase_if(record.files, [&](const auto& f) { return !f.second.starts_with(mine); });
    if (!record.logs.starts_with(mine) && record.logs != job.logs) record.logs = job.logs;
    if (record.message.size() > kMaxEndedMessage) record.message = clean_text(record.message, kMaxEndedMessage);
    EndedJob e{job.user, std::move(record)};
    auto count = [](const EndedJob& x) {
      std::size_t n = sizeof(EndedJob) + x.record.logs.size() + x.record.result_json.size() + x.record.message.size();
      for (const auto& f : x.record.files) n += sizeof(f) + f.second.size();
      return n;
    };
    e.bytes = count(e);
    if (e.bytes > kMaxEndedBytesPerUser) {  // a job of very many ranks: how it ended, not its files
      e.record.files.clear();
      e.bytes = count(e);
    }
    // The same user's record of the same id is replaced; another user's stays theirs.
    std::erase_if(ended_, [&](const EndedJob& x) { return x.user == job.user && x.record.job_id == job.id; });
    ended_.push_back(std::move(e));
    std::size_t theirs = 0, their_bytes = 0, bytes = 0;
    for (const auto& x : ended_) {
      if (x.user == job.user) {
        ++theirs;
        their_bytes += x.bytes;
      }
      bytes += x.bytes;
    }
    for (auto it = ended_.begin();
         (theirs > kMaxEndedJobsPerUser || their_bytes > kMaxEndedBytesPerUser) && it != ended_.end();) {
      if (it->user != job.user) {
        ++it;
        continue;
      }
      bytes -= it->bytes;
      their_bytes -= it->bytes;
      --theirs;
      it = ended_.erase(it);
    }
    while (!ended_.empty() && (ended_.size() > kMaxEndedJobs || bytes > kMaxEndedBytes)) {
      bytes -= ended_.front().bytes;
      ended_.pop_front();
    }
  }

  // The job `id` that ended here, or without an id the last of `user`'s; null when there is none
  // the user may see.
  const EndedJob* find_ended(const std::string& id, const std::string& user) const {
    const auto oldest = std::chrono::duration_cast<std::chrono::milliseconds>(
                            (std::chrono::system_clock::now() - kEndedKept).time_since_epoch())
                            .count();
    for (auto it = ended_.rbegin(); it != ended_.rend(); ++it) {
      if (it->record.ended_unix_ms < oldest || !coordinator::may_touch(it->user, user)) continue;
      if (id.empty() || it->record.job_id == id) return &*it;
    }
    return nullptr;
  }

  void relay_output(Job& job, const std::string& node, int rank, supervisor::Stream s, const std::string& line) {
    auto c = job.submitter.lock();
    if (!c || !c->established()) return;
    if (c->queued_bytes() > kMaxQueuedOutput) {
      ++job.dropped;
      return;
    }
    if (job.dropped) {
      send(c.get(), "job_event",
           {{"job_id", job.id},
            {"kind", "warning"},
            {"message",
             fmt::format("{} output line(s) skipped: ddpctl read too slowly (the log files have them)", job.dropped)}});
      job.dropped = 0;
    }
    send(c.get(), "job_output",
         {{"job_id", job.id},
          {"node", node},
          {"rank", rank},
          {"stream", s == supervisor::Stream::err ? "stderr" : "stdout"},
          {"data", line.substr(0, 65536)}});
  }

  void on_job_over(const std::shared_ptr<Job>& job, const launch::JobReport& report, const std::string& error) {
    if (job->thread.joinable()) job->thread.join();
    json result{{"job_id", job->id}, {"restarts", static_cast<std::uint64_t>(std::max(report.restarts, 0))}};
    if (!error.empty()) {
      log_->error("job {}: {}", job->id, error);
      result.update({{"state", "failed"}, {"exit_code", 2}, {"message", error.substr(0, 4000)}});
    } else {
      log_->info("job {}: {}", job->id, report.status);
      const auto state =
          report.status == "succeeded" || report.status == "stopped" ? report.status : std::string("failed");
      result.update({{"state", state},
                     {"exit_code", report.exit_code},
                     {"message", fmt::format("job {} {}", job->id, state)},
                     {"report", launch::to_json(report, launch::StacksDetail::kSummary)}});  // a frame: 1 MiB
    }
    remember_ended(*job, result.value("state", std::string("failed")), result.value("exit_code", 2));
    send(job->submitter.lock().get(), "job_result", std::move(result));
    jobs_.erase(job->id);
    if (stopping_ && jobs_.empty()) return finish();
    notify_.status(status_line());
  }

  void on_stop_job(Connection* c, const json& b) {
    auto it = jobs_.find(b["job_id"].get<std::string>());
    if (it == jobs_.end() || !may_touch(*it->second, *user_of(c))) {
      return c->refuse(proto::ErrorCode::bad_value,
                       fmt::format("no job {} of yours runs here", b["job_id"].get<std::string>()));
    }
    // Version 6: the submitter's Ctrl-C is a SIGINT (its ranks get SIGINT first, as a local
    // launch's); without it, SIGTERM (ddpctl stop's).
    const int sig = b.value("signal", std::string()) == "SIGINT" ? SIGINT : SIGTERM;
    stop(*it->second,
         fmt::format("{}{}", c->label(), b.contains("reason") ? ": " + b["reason"].get<std::string>() : ""), sig);
  }

  // Version 6: the submitter got SIGUSR1/SIGUSR2 (a scheduler's preemption warning): the job's
  // workers get it too, as a local launch's do.
  void on_signal_job(Connection* c, const json& b) {
    auto it = jobs_.find(b["job_id"].get<std::string>());
    if (it == jobs_.end() || !may_touch(*it->second, *user_of(c))) {
      return c->refuse(proto::ErrorCode::bad_value,
                       fmt::format("no job {} of yours runs here", b["job_id"].get<std::string>()));
    }
    const int sig = b["signal"].get<std::string>() == "SIGUSR1" ? SIGUSR1 : SIGUSR2;
    std::lock_guard lock(it->second->mu);
    if (it->second->signal) it->second->signal(sig, c->label());  // none yet: no workers to pass it to
  }

  static void stop(Job& j, const std::string& who, int sig = SIGTERM) {
    std::lock_guard lock(j.mu);
    if (j.signal)
      j.signal(sig, who);
    else
      j.pending_stop = {sig, who};  // applied once the loop runs; harmless once it has ended
  }

  // ---- ddpctl status/logs/stop --coordinator ----

  void control_reply(Connection* c, json line, bool eof) {
    json f{{"eof", eof}};
    if (!line.is_null()) f["line"] = line.dump();
    send(c, "control", std::move(f));
  }

  void on_control(Connection* c, const json& b) {
    if (relays_.count(c)) return c->refuse(proto::ErrorCode::unexpected, "one control request per connection");
    const auto& user = *user_of(c);
    std::string id = b.value("job_id", std::string());
    if (id.empty()) {
      std::vector<std::string> mine;
      for (const auto& [jid, j] : jobs_) {
        if (may_touch(*j, user)) mine.push_back(jid);
      }
      if (mine.empty()) {
        if (const auto* e = find_ended("", user)) return answer_ended(c, *e, b, true);
      }
      if (mine.size() != 1) {
        return control_reply(c,
                             {{"ok", false},
                              {"error", mine.empty() ? "no job of yours runs on this coordinator"
                                                     : fmt::format("{} jobs run on this coordinator; name one: {}",
                                                                   mine.size(), fmt::join(mine, ", "))}},
                             true);
      }
      id = mine.front();
    }
    auto it = jobs_.find(id);
    if (it == jobs_.end() || !may_touch(*it->second, user)) {
      if (const auto* e = find_ended(id, user)) return answer_ended(c, *e, b, false);
      return control_reply(
          c,
          {{"ok", false},
           {"error", fmt::format("job {} is not running on this coordinator, nor is it among the jobs of yours "
                                 "that it remembers ended",
                                 id)}},
          true);
    }
    std::string path;
    try {
      path = control::socket_path(control::coordinator_jobs_dir(), id);
    } catch (const control::ControlError& e) {
      return control_reply(c, {{"ok", false}, {"error", e.what()}}, true);
    }
    if (auto why = refuse_relay(relay_limits_, relay_use(nullptr), relay_use(&user), user)) {
      log_->warn("{}: {}; refused", c->label(), *why);
      return c->refuse(proto::ErrorCode::bad_value, *why);
    }
    auto r = std::make_shared<Relay>(io_);
    r->job_id = id;
    r->user = user;
    auto line = b.value("line", std::string());
    // `logs --attempt`: the job is asked for its current files only; the attempts' folders are
    // found beside them and read here (a line it cannot parse goes as it is: the job says why).
    try {
      if (auto req = control::parse_request(line); req.op == control::Op::logs && req.attempt) {
        r->attempts = req;
        line = control::encode_request(control::Request{control::Op::logs, {}, false, false, std::nullopt});
      }
    } catch (const control::ControlError&) {
    }
    relays_[c] = r;
    if (line.empty() || line.back() != '\n') line += '\n';
    r->sock.async_connect(path, [this, c, r, line](boost::system::error_code ec) {
      if (r->ended) return;
      if (ec) return end_relay(c, *r, fmt::format("job {}'s control socket: {}", r->job_id, ec.message()));
      auto data = std::make_shared<std::string>(line);
      asio::async_write(r->sock, asio::buffer(*data), [this, c, r, data](boost::system::error_code ec, std::size_t) {
        if (r->ended) return;
        if (ec) return end_relay(c, *r, fmt::format("job {}'s control socket: {}", r->job_id, ec.message()));
        read_relay(c, r);
      });
    });
  }

  // A job that ended here: {"ok": false, "error": "job X is not running: it ended ...", "job_id",
  // "ended": its record less the files, "last": true when no id was named}, then for `logs` its
  // last attempt's files' lines, as a running job's backlog is sent (their paths are this
  // machine's: only their lines go). "ok" is false so that a ddpctl older than this answer, which
  // knows no "ended", says the error and exits 1 as before rather than taking it for a running
  // job; a newer one reads "ended" first.
  void answer_ended(Connection* c, const EndedJob& e, const json& b, bool last) {
    control::Request req;
    try {
      req = control::parse_request(b.value("line", std::string()));
    } catch (const control::ControlError& err) {
      return control_reply(c, {{"ok", false}, {"error", err.what()}}, true);
    }
    auto shown = control::to_json(e.record);
    shown.erase("files");
    json j{{"ok", false},
           {"error", fmt::format("job {} is not running: it ended on this coordinator ({}, exit code {})",
                                 e.record.job_id, e.record.status, e.record.exit_code)},
           {"job_id", e.record.job_id},
           {"ended", std::move(shown)}};
    if (last) j["last"] = true;
    const auto& files = e.record.files;
    if (req.op == control::Op::logs && req.attempt) {
      auto plan = attempts_of(c, e.record.job_id, files, req, true);
      if (!plan) return;
      auto r = relay_for_backlog(c, e.record.job_id, max_files(*plan));
      if (!r) return;
      r->attempts = req;
      control_reply(c, std::move(j), false);
      return send_attempts(c, r, std::move(plan), 0, std::make_shared<const std::map<std::string, std::uint64_t>>());
    }
    if (req.op != control::Op::logs || files.empty()) return control_reply(c, std::move(j), true);
    if (auto outside = control::ranks_outside(req.ranks, static_cast<int>(files.size())))
      return control_reply(c, {{"ok", false}, {"error", *outside}}, true);
    auto sources = control::LogMerge::of_files(files, req.ranks);
    auto r = relay_for_backlog(c, e.record.job_id, sources.size());  // no socket: the backlog is all there is
    if (!r) return;
    control_reply(c, std::move(j), false);
    send_backlog(c, r, std::make_shared<control::LogMerge>(std::move(sources)));
  }

  void read_relay(Connection* c, const std::shared_ptr<Relay>& r) {
    asio::async_read_until(r->sock, r->buf, '\n', [this, c, r](boost::system::error_code ec, std::size_t n) {
      if (r->ended) return;
      if (ec) return end_relay(c, *r, "");
      std::string line(asio::buffers_begin(r->buf.data()),
                       asio::buffers_begin(r->buf.data()) + static_cast<std::ptrdiff_t>(n) - 1);
      r->buf.consume(n);
      auto j = json::parse(line, nullptr, false);
      if (j.is_discarded()) return end_relay(c, *r, "the job's control socket sent a malformed line");
      if (r->attempts && !r->answered) return relay_attempts(c, r, std::move(j));
      if (r->answered) {
        control_reply(c, std::move(j), false);
        return paced(c, r, [this, c, r] { read_relay(c, r); });
      }
      r->answered = true;
      j["job_id"] = r->job_id;
      if (j.contains("ranks")) fit_stacks_reply(j, kMaxRelayedLine);  // ddpctl stacks: one line, bounded
      if (!j.contains("files")) {
        control_reply(c, std::move(j), false);
        return read_relay(c, r);
      }
      // The files are on this machine: their lines (up to the sizes taken with the
      // subscription) go inline, then the live stream carries on from there. A merge holds one
      // file open per rank while it reads (control/log_merge.hpp).
      auto files = j["files"];
      if (auto why = refuse_backlog(relay_limits_, relay_use(nullptr), relay_use(&r->user), r->user, r->job_id,
                                    files.size())) {
        log_->warn("{}: {}; refused", c->label(), *why);
        r->ended = true;
        boost::system::error_code ignored;
        r->sock.close(ignored);
        return c->refuse(proto::ErrorCode::bad_value, *why);
      }
      r->files = files.size();
      j["files"] = json::array();
      control_reply(c, std::move(j), false);
      // Merged by time, as `ddpctl logs` shows a local job's files.
      std::vector<control::LogMerge::Source> sources;
      for (const auto& f : files) {
        sources.push_back({f.value("rank", -1), {{f.value("path", ""), f.value("size", std::uint64_t{0})}}});
      }
      send_backlog(c, r, std::make_shared<control::LogMerge>(std::move(sources)));
    });
  }

  // ---- `ddpctl logs --attempt N|all --coordinator` ----
  // The attempts' files are on this machine: found beside the job's current (or last) ones
  // (control::attempt_logs, as ddpctl finds a local job's), and their lines sent attempt by
  // attempt, each after {"attempt": N, "header": "job J, attempt N (the last)"}; then the end.

  using AttemptPlan = std::shared_ptr<std::vector<control::AttemptLogs>>;

  // Null (the client told why) where the plan cannot be made.
  AttemptPlan attempts_of(Connection* c, const std::string& job_id,
                          const std::vector<std::pair<int, std::string>>& files, const control::Request& req,
                          bool ended) {
    try {
      return std::make_shared<std::vector<control::AttemptLogs>>(
          control::attempt_logs(job_id, files, *req.attempt, req.ranks, ended));
    } catch (const control::ControlError& e) {
      control_reply(c, {{"ok", false}, {"error", e.what()}}, true);
      return nullptr;
    }
  }

  static std::size_t max_files(const std::vector<control::AttemptLogs>& plan) {
    std::size_t n = 0;
    for (const auto& a : plan) n = std::max(n, a.files.size());
    return n;
  }

  // A relay with no job socket, for a backlog of `files` files at most; null (refused) past the limits.
  std::shared_ptr<Relay> relay_for_backlog(Connection* c, const std::string& job_id, std::size_t files) {
    const auto& user = *user_of(c);
    auto why = refuse_relay(relay_limits_, relay_use(nullptr), relay_use(&user), user);
    if (!why) why = refuse_backlog(relay_limits_, relay_use(nullptr), relay_use(&user), user, job_id, files);
    if (why) {
      log_->warn("{}: {}; refused", c->label(), *why);
      c->refuse(proto::ErrorCode::bad_value, *why);
      return nullptr;
    }
    auto r = std::make_shared<Relay>(io_);
    r->job_id = job_id;
    r->user = user;
    r->answered = true;
    r->files = files;
    relays_[c] = r;
    return r;
  }

  // A running job's answer to the plain `logs` asked in its place: its current files.
  void relay_attempts(Connection* c, const std::shared_ptr<Relay>& r, json j) {
    boost::system::error_code ignored;
    r->sock.close(ignored);  // nothing more is wanted of the job
    if (!j.value("ok", false) || !j["files"].is_array()) {
      r->answered = true;
      j["job_id"] = r->job_id;
      control_reply(c, std::move(j), true);
      r->ended = true;
      return;
    }
    std::vector<std::pair<int, std::string>> files;
    auto sizes = std::make_shared<std::map<std::string, std::uint64_t>>();
    for (const auto& f : j["files"]) {
      if (!f.is_object()) continue;
      files.emplace_back(f.value("rank", -1), f.value("path", std::string()));
      // The latest attempt's files are read up to what they held when asked, as plain `logs`.
      (*sizes)[files.back().second] = f.value("size", std::uint64_t{0});
    }
    auto plan = attempts_of(c, r->job_id, files, *r->attempts, false);
    if (!plan) {
      r->ended = true;
      return;
    }
    if (auto why = refuse_backlog(relay_limits_, relay_use(nullptr), relay_use(&r->user), r->user, r->job_id,
                                  max_files(*plan))) {
      log_->warn("{}: {}; refused", c->label(), *why);
      r->ended = true;
      return c->refuse(proto::ErrorCode::bad_value, *why);
    }
    r->answered = true;
    r->files = max_files(*plan);
    j["job_id"] = r->job_id;
    j["files"] = json::array();
    control_reply(c, std::move(j), false);
    send_attempts(c, r, std::move(plan), 0, std::move(sizes));
  }

  using Sizes = std::shared_ptr<const std::map<std::string, std::uint64_t>>;

  // `sizes`: the running job's current files, read up to what they held (none for an ended job).
  void send_attempts(Connection* c, const std::shared_ptr<Relay>& r, AttemptPlan plan, std::size_t i, Sizes sizes) {
    if (r->ended) return;
    if (i == plan->size()) return end_relay(c, *r, "");
    const auto& a = (*plan)[i];
    control_reply(c, {{"attempt", a.attempt}, {"header", a.header}}, false);
    send_backlog(c, r,
                 std::make_shared<control::LogMerge>(control::LogMerge::of_files(a.files, r->attempts->ranks, *sizes)),
                 [this, c, r, plan, i, sizes] { send_attempts(c, r, plan, i + 1, sizes); });
  }

  // The files' lines, read as the client takes them (one line per rank held, never the files);
  // then `then`, else the live stream (a running job's) or the end (an ended job's).
  void send_backlog(Connection* c, const std::shared_ptr<Relay>& r, std::shared_ptr<control::LogMerge> merge,
                    std::function<void()> then = {}) {
    while (c->queued_bytes() < kRelayHighWater) {
      auto l = merge->next();
      if (!l) {
        // A file skipped (a link, a FIFO, not its folder's owner's), named as `ddpctl logs` names
        // one of a local job's.
        for (const auto& u : merge->unreadable()) control_reply(c, {{"unreadable", u}}, false);
        if (then) return then();
        r->files = 0;                                         // every file read and closed
        if (!r->sock.is_open()) return end_relay(c, *r, "");  // an ended job's: nothing follows
        return read_relay(c, r);
      }
      control_reply(c, {{"rank", l->rank}, {"stream", l->stream}, {"line", l->text}, {"time", l->time}}, false);
    }
    paced(c, r, [this, c, r, merge, then] { send_backlog(c, r, merge, then); });
  }

  // Carries on once the client has taken most of what is queued for it.
  template <typename F>
  void paced(Connection* c, const std::shared_ptr<Relay>& r, F next) {
    if (c->queued_bytes() < kRelayHighWater) return next();
    r->pace.expires_after(kRelayPace);
    r->pace.async_wait([this, c, r, next](boost::system::error_code ec) {
      if (ec || r->ended) return;
      paced(c, r, next);
    });
  }

  void end_relay(Connection* c, Relay& r, const std::string& error) {
    r.ended = true;
    r.files = 0;
    boost::system::error_code ignored;
    r.sock.close(ignored);
    if (!error.empty() && !r.answered)
      control_reply(c, {{"ok", false}, {"error", error}}, true);
    else
      control_reply(c, nullptr, true);
  }

  // What relays hold now: all of them (user null), or one user's.
  RelayUse relay_use(const std::string* user) const {
    RelayUse u;
    for (const auto& [c, r] : relays_) {
      if (user && r->user != *user) continue;
      ++u.relays;
      u.files += r->files;
    }
    return u;
  }

  // ---- lifetime ----

  std::string status_line() const {
    if (jobs_.empty()) return fmt::format("idle, listening on {}", endpoint_label(acceptor_.local_endpoint()));
    std::vector<std::string> ids;
    for (const auto& [id, j] : jobs_) ids.push_back(id);
    return fmt::format("{} job{} running: {}", ids.size(), ids.size() == 1 ? "" : "s", fmt::join(ids, ", "));
  }

  void watchdog() {
    const auto interval = notify_.watchdog_interval();
    if (!interval) return;
    notify_.watchdog();
    watchdog_timer_.expires_after(*interval);
    watchdog_timer_.async_wait([this](boost::system::error_code ec) {
      if (!ec) watchdog();
    });
  }

  void wait_signals() {
    signals_.async_wait([this](boost::system::error_code ec, int sig) {
      if (ec) return;
      const auto name = supervisor::signal_name(sig);
      if (!stopping_) {
        stopping_ = true;
        log_->warn("{}: shutting down (stopping {} job{} first)", name, jobs_.size(), jobs_.size() == 1 ? "" : "s");
        notify_.stopping(fmt::format("{}: stopping", name));
        boost::system::error_code ignored;
        if (accept_loop_) accept_loop_->stop();
        acceptor_.close(ignored);
        if (jobs_.empty()) return finish();
      } else {
        log_->warn("{} again: killing every job's workers now", name);
      }
      // A second stop of a job kills its workers at once.
      for (auto& [id, j] : jobs_) stop(*j, fmt::format("ddp-coordinator got {}", name));
      wait_signals();
    });
  }

  void finish() {
    for (auto& [raw, c] : std::map<Connection*, std::shared_ptr<Connection>>(clients_))
      c->close("ddp-coordinator is shutting down");
    boost::system::error_code ignored;
    signals_.cancel(ignored);
    watchdog_timer_.cancel();
    io_.stop();
  }

  StandingOptions opts_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  asio::signal_set signals_;
  asio::steady_timer watchdog_timer_;
  sdnotify::Notifier notify_;
  std::shared_ptr<spdlog::logger> log_;
  std::map<Connection*, std::shared_ptr<Connection>> clients_;
  std::map<Connection*, std::shared_ptr<Relay>> relays_;  // bounded by relay_limits_
  std::map<Connection*, std::string> users_;  // each established client's user (identity.hpp); bounded by relay_limits_
  std::shared_ptr<boost::asio::ssl::context> tls_;    // made at the first client
  std::map<std::string, std::shared_ptr<Job>> jobs_;  // bounded by relay_limits_
  std::deque<EndedJob> ended_;                        // oldest first; kMaxEndedJobs at most
  bool stopping_ = false;
  RelayLimits relay_limits_;
  std::optional<net::Acceptor<tcp>> accept_loop_;  // last: it uses acceptor_ and log_
};

}  // namespace

int run_standing(StandingOptions options) {
  Standing s(std::move(options));
  return s.run();
}

}  // namespace ddp::coordinator

// ddpctl's side of a standing coordinator: submit_job and ControlRelay (client.hpp).
#include "coordinator/client.hpp"

#include "attempt/files.hpp"
#include "common/log.hpp"
#include "common/version.hpp"
#include "coordinator/standing.hpp"
#include "net/connection.hpp"
#include "proto/delegation.hpp"
#include "supervisor/output.hpp"
#include "supervisor/process.hpp"

#include <boost/asio.hpp>

#include <fmt/format.h>

#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>

namespace ddp::coordinator {

namespace asio = boost::asio;
using net::Connection;
using net::tcp;
using nlohmann::json;

namespace {

proto::ClientConfig ctl_config(const proto::Keyring& keys, const std::string& user) {
  proto::ClientConfig cc;
  cc.role = proto::Role::ctl;
  cc.user = user;
  cc.name = "ddpctl";
  cc.software = ddp::kCtlVersion;
  cc.key = *keys.first();
  cc.nonce = proto::random_nonce();
  cc.expect_server = proto::Role::coordinator;
  return cc;
}

std::string where(const std::string& host, std::uint16_t port) {
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
}

class Submitter {
 public:
  explicit Submitter(SubmitOptions o)
      : opts_(std::move(o)),
        signals_(io_, SIGINT, SIGTERM, SIGQUIT),
        user_signals_(io_, SIGUSR1, SIGUSR2),
        log_(log::get("coord")) {}

  int run() {
    wait_signals();
    wait_user_signals();
    net::dial(io_, opts_.host, opts_.port, opts_.dial_timeout, [this](boost::system::error_code ec, tcp::socket s) {
      if (ec) return end(2, fmt::format("cannot reach the coordinator at {}: {}", at(), ec.message()));
      conn_ = Connection::make(std::move(s), proto::Session::client(ctl_config(opts_.keys, opts_.user)),
                               "coordinator " + at(), "coord", std::chrono::seconds(10));
      if (opts_.tls) conn_->use_tls({net::tls_client_context(*opts_.keys.first())});
      conn_->start({[this](const proto::PeerInfo& p) {
                      // A spec saying "port not named" (node rank 0 may take a free one) goes
                      // only to a coordinator of protocol version 7: an older one rewrites the
                      // spec it passes on, dropping what it does not know, and the agents would
                      // refuse the delegation's digest. To it the port is named, as every build
                      // writes it alike (a taken 29500 fails the job, as it did).
                      auto payload = opts_.payload;
                      if (p.version < 7) payload.spec.store_port_explicit = true;
                      auto spec = net::to_json(payload);
                      json submit{{"job_id", opts_.job_id}, {"user", opts_.user}, {"nodes", opts_.nodes}};
                      if (opts_.tls) submit["tls"] = true;  // only here with version 6: TLS needs it
                      // Version 6: our key's permission for the coordinator's key to run this
                      // job as us, which the agents check (proto/delegation.hpp).
                      if (p.version >= 6 && !p.delegate_key.empty()) {
                        submit["delegation"] = proto::to_json(delegation(p.delegate_key, spec));
                      }
                      submit["spec"] = std::move(spec);
                      // No "detach" (what older builds sent, to be answered at once): we
                      // stay to see the ranks start (a `running` event), then leave the job
                      // to the coordinator; one older than that never says it, and Ctrl-C
                      // leaves then.
                      conn_->send(conn_->session().message("submit", std::move(submit)));
                    },
                    [this](proto::Message m) { on_message(std::move(m)); },
                    [this](const std::string& reason) { on_closed(reason); }});
    });
    io_.run();
    terminal_.flush();
    return rc_;
  }

 private:
  proto::Delegation delegation(const std::string& coordinator_key, const json& spec) const {
    const auto nonce = proto::random_nonce();
    proto::Delegation d;
    d.user = opts_.user;
    d.coordinator_key = coordinator_key;
    d.job_id = opts_.job_id;
    d.expires_s = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::seconds>(
                                                 std::chrono::system_clock::now().time_since_epoch())
                                                 .count()) +
                  proto::kDelegationSeconds;
    d.nonce = proto::to_hex(std::string_view(reinterpret_cast<const char*>(nonce.data()), 16));
    d.spec_sha256 = proto::payload_digest(spec);
    return proto::sign_delegation(std::move(d), *opts_.keys.first());
  }

  std::string at() const { return where(opts_.host, opts_.port); }

  void on_message(proto::Message m) {
    const auto& b = m.body;
    if (m.type == "job_accepted") {
      accepted_ = true;
      if (opts_.detach) {
        log_->info(
            "job {} accepted by the coordinator at {}; waiting for its ranks to start (Ctrl-C stops the waiting, "
            "not the job)",
            opts_.job_id, at());
        return;
      }
      log_->info(
          "job {} accepted by the coordinator at {} (it keeps running there if this ddpctl goes away; Ctrl-C stops it)",
          opts_.job_id, at());
      return;
    }
    if (m.type == "job_output") {
      const int rank = static_cast<int>(b["rank"].get<std::uint32_t>());
      if (opts_.quiet || opts_.detach || (!opts_.show_ranks.empty() && !opts_.show_ranks.contains(rank))) return;
      const auto s = b["stream"].get<std::string>() == "stderr" ? supervisor::Stream::err : supervisor::Stream::out;
      terminal_.write(s, fmt::format("[{}:{}] {}", b["node"].get<std::string>(), rank, b["data"].get<std::string>()));
      return;
    }
    if (m.type == "job_event") {
      const auto text = b["message"].get<std::string>();
      const auto kind = b["kind"].get<std::string>();
      if (kind == "running") {
        if (!opts_.detach) return;
        std::cout << opts_.job_id << std::endl;
        std::cerr << fmt::format(
            "ddpctl launch: job {} runs on the coordinator at {}; see it with ddpctl status|logs -f|stop "
            "--coordinator {} {}\n",
            opts_.job_id, at(), at(), opts_.job_id);
        return end(0, "");
      }
      if (text.find('\n') != std::string::npos) {  // a failure report, printed as the embedded coordinator prints it
        terminal_.flush();
        std::fputs(text.c_str(), stderr);
        return;
      }
      log_->log(kind == "error"     ? spdlog::level::err
                : kind == "warning" ? spdlog::level::warn
                                    : spdlog::level::info,
                "{}", text);
      return;
    }
    if (m.type == "job_result") {
      bool report_lost = false;
      if (opts_.result_json && b.contains("report")) {
        if (auto err = launch::write_result_file(*opts_.result_json, b["report"])) {
          log_->error("{}", *err);
          report_lost = true;
        }
      }
      // A process status is 0..255; a coordinator's number outside it is no status (2, as any bad answer).
      const auto remote = b.contains("exit_code") ? b["exit_code"].get<std::int64_t>() : 1;
      int code = remote >= 0 && remote <= 255 ? static_cast<int>(remote) : 2;
      if (report_lost && code == 0) code = 2;  // the job ran, its report is lost: not a success
      return end(code, code == 2 && !b.contains("report") ? b["message"].get<std::string>() : "");
    }
    if (m.type == "heartbeat") return;
    conn_->refuse(proto::ErrorCode::unexpected, fmt::format("ddpctl does not take '{}' from a coordinator", m.type));
  }

  void on_closed(const std::string& reason) {
    if (done_) return;
    if (accepted_) {
      return end(2, fmt::format("lost the coordinator at {} ({}); job {} keeps running there if the coordinator does "
                                "(ddpctl status --coordinator {} {})",
                                at(), reason, opts_.job_id, at(), opts_.job_id));
    }
    end(2, fmt::format("the coordinator at {} refused the job: {}", at(), reason));
  }

  void wait_signals() {
    signals_.async_wait([this](boost::system::error_code ec, int sig) {
      if (ec || done_) return;
      if (conn_ && conn_->established() && accepted_ && opts_.detach) {
        std::cout << opts_.job_id << std::endl;
        std::cerr << fmt::format(
            "ddpctl launch: stopped waiting; job {} goes on at the coordinator at {}; see it with "
            "ddpctl status|logs -f|stop --coordinator {} {}\n",
            opts_.job_id, at(), at(), opts_.job_id);
        return end(128 + sig, "");
      }
      if (conn_ && conn_->established() && accepted_) {
        log_->warn("{}: stopping job {} on the coordinator (again to kill its workers now)",
                   supervisor::signal_name(sig), opts_.job_id);
        json stop{{"job_id", opts_.job_id}, {"reason", supervisor::signal_name(sig)}};
        // Version 6: a Ctrl-C reaches the ranks as SIGINT first, as a local launch's does.
        if (conn_->session().version() >= 6) stop["signal"] = sig == SIGINT ? "SIGINT" : "SIGTERM";
        conn_->send(conn_->session().message("stop_job", std::move(stop)));
      } else {
        return end(128 + sig, fmt::format("{} before the job was accepted", supervisor::signal_name(sig)));
      }
      wait_signals();
    });
  }

  // SIGUSR1/SIGUSR2 (a scheduler's preemption warning, SLURM's --signal=B:USR1@120) go on to
  // the job's workers, as a local launch's do; the job goes on.
  void wait_user_signals() {
    user_signals_.async_wait([this](boost::system::error_code ec, int sig) {
      if (ec || done_) return;
      const auto name = sig == SIGUSR1 ? "SIGUSR1" : "SIGUSR2";
      if (!conn_ || !conn_->established() || !accepted_) {
        log_->warn("{}: job {} is not accepted yet; not passed on", name, opts_.job_id);
      } else if (conn_->session().version() < 6) {
        log_->warn("{}: not passed on: the coordinator at {} speaks protocol version {} (passing signals needs 6)",
                   name, at(), conn_->session().version());
      } else {
        conn_->send(conn_->session().message("signal_job", {{"job_id", opts_.job_id}, {"signal", name}}));
      }
      wait_user_signals();
    });
  }

  void end(int rc, const std::string& error) {
    if (done_) return;
    done_ = true;
    rc_ = rc;
    if (!error.empty()) log_->error("{}", error);
    boost::system::error_code ignored;
    signals_.cancel(ignored);
    user_signals_.cancel(ignored);
    if (conn_) conn_->close("done", /*routine=*/true);
    io_.stop();
  }

  SubmitOptions opts_;
  asio::io_context io_;
  asio::signal_set signals_, user_signals_;
  std::shared_ptr<spdlog::logger> log_;
  supervisor::TerminalSink terminal_;
  std::shared_ptr<Connection> conn_;
  bool accepted_ = false;
  bool done_ = false;
  int rc_ = 2;
};

}  // namespace

int submit_job(SubmitOptions options) {
  Submitter s(std::move(options));
  return s.run();
}

// The relay's thread: the caller's request line goes out as one `control` frame once the
// session is established; every `control` line that comes back is written to the caller's end.
struct ControlRelay::Impl {
  Impl(std::string host, std::uint16_t port, proto::Keyring keys, std::string user, std::string job_id, int fd,
       bool tls)
      : host(std::move(host)),
        port(port),
        keys(std::move(keys)),
        user(std::move(user)),
        job_id(std::move(job_id)),
        tls(tls),
        local(io, asio::generic::stream_protocol(AF_UNIX, SOCK_STREAM), fd),
        buf(768u << 10) {}

  void run() {
    net::dial(io, host, port, std::chrono::seconds(10), [this](boost::system::error_code ec, tcp::socket s) {
      if (ec) return fail(fmt::format("cannot reach the coordinator at {}: {}", where(host, port), ec.message()));
      conn = Connection::make(std::move(s), proto::Session::client(ctl_config(keys, user)),
                              "coordinator " + where(host, port), "coord", std::chrono::seconds(10));
      if (tls) conn->use_tls({net::tls_client_context(*keys.first())});
      conn->start({[this](const proto::PeerInfo&) { read_request(); },
                   [this](proto::Message m) {
                     if (m.type != "control") return;
                     if (m.body.contains("line")) write_line(m.body["line"].get<std::string>());
                     if (m.body.value("eof", false)) finish();
                   },
                   [this](const std::string& reason) {
                     if (!answered) fail(fmt::format("the coordinator at {}: {}", where(host, port), reason));
                     finish();
                   }});
    });
    io.run();
  }

  void read_request() {
    asio::async_read_until(local, buf, '\n', [this](boost::system::error_code ec, std::size_t n) {
      if (ec) return finish();
      std::string line(asio::buffers_begin(buf.data()),
                       asio::buffers_begin(buf.data()) + static_cast<std::ptrdiff_t>(n));
      buf.consume(n);
      json f{{"line", line}};
      if (!job_id.empty()) f["job_id"] = job_id;
      conn->send(conn->session().message("control", std::move(f)));
    });
  }

  void write_line(std::string line) {
    answered = true;
    out.push_back(std::move(line) + "\n");
    if (out.size() == 1) write_next();
  }

  void write_next() {
    if (out.empty()) {
      if (finishing) close_local();
      return;
    }
    asio::async_write(local, asio::buffer(out.front()), [this](boost::system::error_code ec, std::size_t) {
      if (ec) {
        out.clear();
        return finish();
      }
      out.pop_front();
      write_next();
    });
  }

  void fail(const std::string& error) {
    if (answered) return;
    write_line(json{{"ok", false}, {"error", error}}.dump());
  }

  // What is queued for the caller is written first; then both ends close.
  void finish() {
    finishing = true;
    if (conn) conn->close("done", /*routine=*/true);
    if (out.empty()) close_local();
  }

  void close_local() {
    boost::system::error_code ignored;
    local.shutdown(asio::socket_base::shutdown_both, ignored);
    local.close(ignored);
    io.stop();
  }

  std::string host;
  std::uint16_t port;
  proto::Keyring keys;
  std::string user, job_id;
  bool tls = false;
  asio::io_context io;
  asio::generic::stream_protocol::socket local;
  asio::streambuf buf;
  std::shared_ptr<Connection> conn;
  std::deque<std::string> out;
  bool answered = false;
  bool finishing = false;
};

ControlRelay::ControlRelay(std::string host, std::uint16_t port, proto::Keyring keys, std::string user,
                           std::string job_id, bool tls) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) throw std::runtime_error("socketpair failed");
  fd_ = sv[0];
  impl_ =
      std::make_unique<Impl>(std::move(host), port, std::move(keys), std::move(user), std::move(job_id), sv[1], tls);
  thread_ = std::thread([this] { impl_->run(); });
}

ControlRelay::~ControlRelay() {
  impl_->io.stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace ddp::coordinator

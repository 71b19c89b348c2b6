#include "control/server.hpp"

#include "common/log.hpp"
#include "control/paths.hpp"

#include <fmt/format.h>
#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <deque>
#include <filesystem>

namespace ddp::control {

namespace asio = boost::asio;
using asio::local::stream_protocol;
using nlohmann::json;

namespace {
constexpr auto kRequestDeadline = std::chrono::seconds(5);
constexpr std::size_t kMaxQueuedPerClient = 8u << 20;
}  // namespace

struct Server::Client : std::enable_shared_from_this<Client> {
  explicit Client(stream_protocol::socket s)
      : sock(std::move(s)), deadline(sock.get_executor()), in(kMaxRequestBytes + 1) {}
  stream_protocol::socket sock;
  asio::steady_timer deadline;
  asio::streambuf in;
  std::deque<std::string> out;
  std::size_t queued = 0;
  std::uint64_t dropped = 0;
  bool writing = false;
  bool follower = false;
  std::set<int> filter;  // a follower's ranks; empty: all
  bool close_after_write = false;
  bool closed = false;
  std::string who;
  std::shared_ptr<void> slot;  // among the clients that have not sent their request yet

  void send(const json& j, bool bounded = false) {
    if (closed) return;
    auto text = j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    if (bounded && queued + text.size() > kMaxQueuedPerClient) {
      ++dropped;
      return;
    }
    if (bounded && dropped) {
      auto note = json{{"dropped", dropped}}.dump() + "\n";
      dropped = 0;
      queued += note.size();
      out.push_back(std::move(note));
    }
    queued += text.size();
    out.push_back(std::move(text));
    if (!writing) write();
  }
  void write() {
    if (closed) return;
    if (out.empty()) {
      writing = false;
      if (close_after_write) close();
      return;
    }
    writing = true;
    asio::async_write(sock, asio::buffer(out.front()),
                      [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
                        if (ec) return self->close();
                        self->queued -= self->out.front().size();
                        self->out.pop_front();
                        self->write();
                      });
  }
  void finish() {
    close_after_write = true;
    if (!writing) write();
  }
  void close() {
    if (closed) return;
    closed = true;
    boost::system::error_code ignored;
    deadline.cancel();
    sock.close(ignored);
    slot.reset();
  }
};

Server::Server(asio::io_context& io, std::string path, Provider provider, std::string records)
    : io_(io),
      path_(std::move(path)),
      records_(std::move(records)),
      provider_(std::move(provider)),
      acceptor_(io),
      end_timer_(io) {
  boost::system::error_code ec;
  const auto slash = path_.rfind('/');
  // Other jobs' sockets left by launchers that were SIGKILLed: gone before they confuse a
  // `ddpctl status` with no job named.
  if (slash != std::string::npos && slash > 0) {
    for (const auto& job : sweep_stale_sockets(path_.substr(0, slash))) {
      log::get("control")->debug("removed the control socket of job {}, whose launcher no longer runs", job);
    }
  }
  job_id_ = path_.substr(slash == std::string::npos ? 0 : slash + 1);
  if (job_id_.ends_with(".sock")) job_id_.resize(job_id_.size() - 5);  // socket_path()'s suffix
  // A socket file already there: a live launcher of the same job id, or a dead one's leftover.
  struct stat st {};
  if (::lstat(path_.c_str(), &st) == 0) {
    stream_protocol::socket probe(io);
    probe.connect(stream_protocol::endpoint(path_), ec);
    if (!ec) throw ControlError(fmt::format("another ddpctl already runs job {} (control socket {})", job_id_, path_));
    ::unlink(path_.c_str());
  }
  // A job id used again: the old run's end record must not answer for this one.
  try {
    forget_ended(records_.empty() ? records_dir() : records_, job_id_);
  } catch (const ControlError&) {
  }
  acceptor_.open(stream_protocol(), ec);
  if (!ec) {
    const mode_t old = ::umask(077);  // the socket is born 0700 (then 0600), never briefly open
    acceptor_.bind(stream_protocol::endpoint(path_), ec);
    ::umask(old);
  }
  if (!ec && ::chmod(path_.c_str(), 0600) != 0) ec.assign(errno, boost::system::system_category());
  if (!ec) acceptor_.listen(16, ec);
  if (ec) throw ControlError(fmt::format("cannot listen on {}: {}", path_, ec.message()));
  if (::lstat(path_.c_str(), &st) == 0) inode_ = st.st_ino;
  accept();
}

Server::~Server() {
  boost::system::error_code ignored;
  if (accept_loop_) accept_loop_->stop();
  acceptor_.close(ignored);
  end_timer_.cancel();
  for (const auto& c : clients_) c->close();
  // Remove the file only if it is still ours (a second launcher may have replaced a stale one).
  struct stat st {};
  if (inode_ && ::lstat(path_.c_str(), &st) == 0 && st.st_ino == inode_) ::unlink(path_.c_str());
}

// The job's own user (or root) only; out of descriptors, back off; clients that have not sent
// their request yet are capped (net/acceptor.hpp).
void Server::accept() {
  accept_loop_.emplace(acceptor_, "control socket", log::get("control"),
                       [this](stream_protocol::socket s) { on_socket(std::move(s)); });
  accept_loop_->start();
}

void Server::on_socket(stream_protocol::socket s) {
  if (ended_) return;
  ucred cred{};
  socklen_t len = sizeof cred;
  auto c = std::make_shared<Client>(std::move(s));
  if (::getsockopt(c->sock.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
      (cred.uid != ::geteuid() && cred.uid != 0)) {
    log::get("control")->warn("refused a control client of uid {} (pid {})", cred.uid, cred.pid);
    c->send({{"ok", false}, {"error", "permission denied: not the job's user"}});
    c->finish();
  } else {
    c->who = fmt::format("pid {}", cred.pid);
    clients_.insert(c);
    c->slot = accept_loop_->admit([w = std::weak_ptr<Client>(c)] {
      if (auto cl = w.lock()) cl->close();
    });
    c->deadline.expires_after(kRequestDeadline);
    c->deadline.async_wait([c](boost::system::error_code e) {
      if (!e) c->close();
    });
    asio::async_read_until(c->sock, c->in, '\n', [this, c](boost::system::error_code e, std::size_t n) {
      if (c->closed) return;
      c->deadline.cancel();
      c->slot.reset();
      if (e) {
        if (e == asio::error::not_found) {
          c->send({{"ok", false}, {"error", "request too long"}});
          c->finish();
        } else {
          c->close();
        }
        return;
      }
      std::string line(asio::buffers_begin(c->in.data()), asio::buffers_begin(c->in.data()) + static_cast<long>(n));
      on_request(c, line);
    });
  }
  // Forget clients that are gone (bounded by the accepts that find them).
  std::erase_if(clients_, [](const auto& x) { return x->closed; });
}

void Server::on_request(const std::shared_ptr<Client>& c, const std::string& line) {
  Request r;
  try {
    r = parse_request(line);
  } catch (const ControlError& e) {
    c->send({{"ok", false}, {"error", e.what()}});
    c->finish();
    return;
  }
  switch (r.op) {
    case Op::status:
      c->send({{"ok", true}, {"status", provider_.status()}});
      c->finish();
      return;
    case Op::stop:
      log::get("control")->warn("stop requested through the control socket ({})", c->who);
      c->send({{"ok", true}, {"stopping", true}});
      provider_.stop(fmt::format("ddpctl stop ({})", c->who));
      return;  // closed when the job has ended
    case Op::stacks: {
      if (auto missing = missing_ranks(r.ranks)) {
        c->send({{"ok", false}, {"error", *missing}});
        c->finish();
        return;
      }
      if (!provider_.stacks) {
        c->send({{"ok", false}, {"error", "this launcher cannot read stacks (an older ddpctl?)"}});
        c->finish();
        return;
      }
      // The answer comes later (a read takes up to its budget); a client gone meanwhile is closed.
      provider_.stacks(r.ranks, r.native, [c](json body) {
        body["ok"] = true;
        c->send(body);
        c->finish();
      });
      return;
    }
    case Op::logs: {
      if (r.attempt) {  // another attempt's files are read where they are (ddpctl logs --attempt)
        c->send(
            {{"ok", false}, {"error", "a launcher sends its current files; ddpctl logs --attempt reads the others"}});
        c->finish();
        return;
      }
      if (auto missing = missing_ranks(r.ranks)) {
        c->send({{"ok", false}, {"error", *missing}});
        c->finish();
        return;
      }
      json files = json::array();
      for (const auto& [rank, path] : provider_.log_files(r.ranks)) {
        std::error_code ec;
        const auto size = std::filesystem::file_size(path, ec);
        files.push_back({{"rank", rank}, {"path", path}, {"size", ec ? 0 : size}});
      }
      c->send({{"ok", true}, {"files", files}});
      if (r.follow && !ended_) {
        c->follower = true;
        c->filter = r.ranks;
      } else {
        c->finish();
      }
      return;
    }
  }
}

// `--ranks` naming a rank the job does not have: a typo would otherwise show nothing, or wait
// forever with -f. Before the ranks are placed (a rendezvous still gathering) any rank may come.
std::optional<std::string> Server::missing_ranks(const std::set<int>& wanted) const {
  if (wanted.empty()) return std::nullopt;
  const auto all = provider_.log_files({});
  if (all.empty()) return std::nullopt;
  return ranks_outside(wanted, static_cast<int>(all.size()));
}

void Server::publish(int rank, Stream stream, const std::string& line) {
  std::string time;  // taken once, for the followers that are there
  for (const auto& c : clients_) {
    if (!c->follower || c->closed || (!c->filter.empty() && !c->filter.contains(rank))) continue;
    if (time.empty()) time = utc_timestamp();
    c->send({{"rank", rank}, {"stream", stream == Stream::out ? "out" : "err"}, {"line", line}, {"time", time}}, true);
  }
}

void Server::leave_record(Ended record) {
  record.job_id = job_id_;
  record.files = provider_.log_files({});
  try {
    record_ended(records_.empty() ? records_dir() : records_, record);
  } catch (const ControlError& e) {
    log::get("control")->debug("no end record for job {}: {}", job_id_, e.what());
  }
}

void Server::end(const std::string& result, std::optional<Ended> record) {
  if (ended_) return;
  ended_ = true;
  if (record) leave_record(std::move(*record));
  boost::system::error_code ignored;
  if (accept_loop_) accept_loop_->stop();
  acceptor_.close(ignored);
  for (const auto& c : clients_) {
    if (c->follower) c->send({{"end", result}});
    c->finish();
  }
  // Clients get up to 2 s to read their last lines; with none left (the usual case), the loop
  // has nothing more to wait for and the launcher exits at once.
  end_deadline_ = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  close_when_done();
}

void Server::close_when_done() {
  if (std::all_of(clients_.begin(), clients_.end(), [](const auto& c) { return c->closed; })) return;
  if (std::chrono::steady_clock::now() >= end_deadline_) {
    for (const auto& c : clients_) c->close();
    return;
  }
  end_timer_.expires_after(std::chrono::milliseconds(20));
  end_timer_.async_wait([this](boost::system::error_code ec) {
    if (!ec) close_when_done();
  });
}

}  // namespace ddp::control

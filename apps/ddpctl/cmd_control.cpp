// `ddpctl status`, `ddpctl logs [-f] [--ranks LIST]`, `ddpctl stop`: a running job, reached
// through its launcher's control socket (lib/control), or with --coordinator through a standing
// coordinator that relays the same conversation (coordinator/client.hpp). Blocking I/O: a CLI
// talking to one socket.
#include "commands.hpp"
#include "common/stream.hpp"
#include "common/strings.hpp"
#include "common/text.hpp"
#include "control/log_merge.hpp"
#include "control/paths.hpp"
#include "control/protocol.hpp"
#include "coordinator/client.hpp"
#include "coordinator/standing.hpp"
#include "hostlist/hostlist.hpp"
#include "jobspec/jobspec.hpp"
#include "net/connection.hpp"
#include "net/token_file.hpp"
#include "stacks/collect.hpp"
#include "stacks/merge.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>

namespace ddpctl {

namespace control = ddp::control;
using nlohmann::json;

namespace {

// A connected socket to `path`, or -1 with errno set.
int dial(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

struct Target {
  std::string job_id;
  int fd = -1;
  std::shared_ptr<ddp::coordinator::ControlRelay> relay;  // --coordinator: carries fd's conversation
  std::optional<control::Ended> ended;                    // set (and fd -1): the job is over; its record
};

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// "job X ended 3 min ago (failed, exit code 1); result: F; logs: D"; `remote`: a standing
// coordinator's record, whose paths are on its machine.
std::string describe_ended(const control::Ended& e, bool remote = false) {
  const auto ago_s = std::max<std::int64_t>(0, now_ms() - e.ended_unix_ms) / 1000;
  const auto ago = ago_s < 120    ? fmt::format("{} s", ago_s)
                   : ago_s < 7200 ? fmt::format("{} min", ago_s / 60)
                                  : fmt::format("{} h", ago_s / 3600);
  const char* where = remote ? " on the coordinator's machine" : "";
  // Every field made safe for a terminal: a coordinator's answer, or a file.
  const auto shown = [](const std::string& s) { return ddp::clean_text(s, 1024); };
  // A record may say why (a hang, a restart that could not start); one with exit code -1 has
  // none to give (a launcher killed: its guardian wrote it).
  auto how = e.exit_code >= 0 ? fmt::format("{}, exit code {}", shown(e.status), e.exit_code) : shown(e.status);
  if (!e.message.empty()) how += ": " + ddp::clean_text(e.message, 512);
  return fmt::format("job {} ended {} ago ({}); {}logs{}: {}", shown(e.job_id), ago, how,
                     e.result_json.empty() ? "" : fmt::format("result{}: {}; ", where, shown(e.result_json)), where,
                     shown(e.logs));
}

// describe_ended(), after "no job of yours is running; the last one: " when the job was chosen for
// the user (no id named).
std::string said_ended(const control::Ended& e, bool defaulted, bool remote = false) {
  return (defaulted ? "no job of yours is running; the last one: " : "") + describe_ended(e, remote);
}

struct ControlArgs {
  std::string job;
  bool json_out = false;
  bool follow = false;
  bool timestamps = false;
  std::string ranks;
  std::optional<std::string> attempt;  // logs: "N" or "all"; none: the current (or last) attempt
  std::string coordinator;
  std::string token_file;
  bool tls = false;
};

// --coordinator HOST[:PORT]: the job is asked for through the standing coordinator.
std::optional<Target> relay_job(const ControlArgs& a, const char* cmd, int& rc) {
  auto ep = ddp::hostlist::parse_endpoint(a.coordinator);
  if (!ep.ok()) {
    std::cerr << fmt::format("ddpctl {}: --coordinator '{}': {}\n", cmd, a.coordinator, ep.error->to_string());
    rc = 2;
    return std::nullopt;
  }
  try {
    auto keys = ddp::net::load_token_file(a.token_file.empty() ? ddp::net::find_client_token_file() : a.token_file);
    auto relay = std::make_shared<ddp::coordinator::ControlRelay>(
        ep.endpoint.host, ep.endpoint.port.value_or(ddp::coordinator::kStandingPort), std::move(keys),
        ddp::net::local_user(), a.job, a.tls);
    return Target{a.job, relay->fd(), relay};
  } catch (const std::exception& e) {
    std::cerr << fmt::format("ddpctl {}: {}\n", cmd, e.what());
    rc = 2;
    return std::nullopt;
  }
}

// The job named (its id or any prefix that names one job only), or without a name the only one
// running, else the one that ended last; otherwise says what there is and returns nullopt (exit
// code in `rc`). `defaulted` says the job was chosen for the user (no id given).
std::optional<Target> find_job(const ControlArgs& a, const char* cmd, int& rc, bool* defaulted = nullptr) {
  if (defaulted) *defaulted = false;
  if (!a.coordinator.empty()) return relay_job(a, cmd, rc);
  if (a.tls) {
    std::cerr << fmt::format(
        "ddpctl {}: --tls is for --coordinator (a job on this machine is reached through its local socket)\n", cmd);
    rc = 2;
    return std::nullopt;
  }
  const std::string& job = a.job;
  std::string dir;
  try {
    dir = control::runtime_dir();
  } catch (const control::ControlError& e) {
    std::cerr << fmt::format("ddpctl {}: {}\n", cmd, e.what());
    rc = 2;
    return std::nullopt;
  }
  std::string records;
  std::vector<std::string> ended;  // newest first
  try {
    records = control::records_dir();
    ended = control::ended_jobs(records);
  } catch (const control::ControlError&) {  // no record of ended jobs: only running ones are found
  }
  auto try_job = [&](const std::string& id) -> int {
    std::string path;
    try {
      path = control::socket_path(dir, id);
    } catch (const control::ControlError&) {
      return -1;
    }
    const int fd = dial(path);
    // A launcher that was SIGKILLed left its socket; nobody listens there any more (unless it
    // is a launcher between bind() and listen(): remove_if_stale tells them apart).
    if (fd < 0 && errno == ECONNREFUSED) {
      const int e = errno;
      control::remove_if_stale(path);
      errno = e;
    }
    return fd;
  };
  // The running jobs the name may mean (ids it begins): only their sockets are dialled.
  std::vector<Target> live;
  for (const auto& id : control::socket_jobs(dir)) {
    if (!id.starts_with(job)) continue;
    const int fd = try_job(id);
    if (fd >= 0) live.push_back({id, fd});
  }
  auto close_all = [&] {
    for (auto& t : live) ::close(t.fd);
  };
  auto as_ended = [&](const std::string& id) -> std::optional<Target> {
    if (auto e = control::read_ended(records, id)) return Target{id, -1, nullptr, std::move(e)};
    return std::nullopt;
  };
  auto listing = [&](const std::vector<std::string>& ids) {
    constexpr std::size_t kShown = 10;
    std::string out;
    for (std::size_t i = 0; i < ids.size() && i < kShown; ++i) {
      const bool runs = std::any_of(live.begin(), live.end(), [&](const Target& t) { return t.job_id == ids[i]; });
      out += fmt::format("  {}{}\n", ids[i], runs ? " (running)" : "");
    }
    if (ids.size() > kShown) out += fmt::format("  ... and {} more\n", ids.size() - kShown);
    return out;
  };
  if (job.empty()) {
    if (live.size() == 1) return live.front();
    if (live.size() > 1) {
      std::vector<std::string> ids;
      for (const auto& t : live) ids.push_back(t.job_id);
      std::cerr << fmt::format("ddpctl {}: {} jobs are running; name one (any unique beginning of its id will do):\n{}",
                               cmd, live.size(), listing(ids));
      close_all();
      rc = 2;
      return std::nullopt;
    }
    // Nothing runs: the job that ended last (a record that cannot be read is passed over).
    for (const auto& id : ended) {
      if (auto t = as_ended(id)) {
        if (defaulted) *defaulted = true;
        return t;
      }
    }
    std::cerr << fmt::format(
        "ddpctl {}: no job of yours is running (control sockets live in {}), and none has ended in the last 30 "
        "days{}\n",
        cmd, dir, records.empty() ? "" : fmt::format(" (records in {})", records));
    rc = 1;
    return std::nullopt;
  }
  // A name: a running job's id, an ended job's, or the beginning of exactly one of them.
  std::vector<std::string> ids;
  for (const auto& t : live) ids.push_back(t.job_id);
  ids.insert(ids.end(), ended.begin(), ended.end());
  const auto matches = control::match_job(ids, job);
  if (matches.size() == 1) {
    for (auto& t : live) {
      if (t.job_id != matches.front()) continue;
      auto found = t;
      t.fd = -1;
      close_all();
      return found;
    }
    close_all();
    if (auto t = as_ended(matches.front())) return t;
    std::cerr << fmt::format("ddpctl {}: job {} is not running here, and its end record in {} cannot be read\n", cmd,
                             matches.front(), records);
    rc = 1;
    return std::nullopt;
  }
  if (matches.size() > 1) {
    std::cerr << fmt::format("ddpctl {}: '{}' begins {} job ids; type more of the one you mean:\n{}", cmd, job,
                             matches.size(), listing(matches));
    close_all();
    rc = 2;
    return std::nullopt;
  }
  close_all();
  // None: what there is instead (the running jobs, then those that ended, newest first).
  std::vector<std::string> running;
  for (const auto& id : control::socket_jobs(dir)) {
    const int fd = try_job(id);
    if (fd >= 0) {
      running.push_back(id);
      ::close(fd);
    }
  }
  auto some = [](const std::vector<std::string>& v) {
    constexpr std::size_t kShown = 10;
    if (v.empty()) return std::string("none");
    std::vector<std::string> shown(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(std::min(v.size(), kShown)));
    return fmt::format("{}{}", fmt::join(shown, ", "),
                       v.size() > kShown ? fmt::format(" and {} more", v.size() - kShown) : std::string());
  };
  std::cerr << fmt::format(
      "ddpctl {}: job {} is not running here, and no job id here begins with it (running: {}; ended in the last 30 "
      "days, newest first: {})\n",
      cmd, job, some(running), some(ended));
  rc = 1;
  return std::nullopt;
}

// Reads '\n'-terminated lines from a socket.
class LineReader {
 public:
  explicit LineReader(int fd) : fd_(fd) {}
  ~LineReader() { ::close(fd_); }
  std::optional<json> next() {
    while (true) {
      auto nl = buf_.find('\n');
      if (nl != std::string::npos) {
        auto line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        auto j = json::parse(line, nullptr, false);
        if (j.is_discarded()) throw std::runtime_error("the launcher sent a malformed line");
        return j;
      }
      char tmp[65536];
      const ssize_t n = ::read(fd_, tmp, sizeof tmp);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return std::nullopt;
      buf_.append(tmp, static_cast<std::size_t>(n));
    }
  }
  bool send(const std::string& s) {
    return ::send(fd_, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size());
  }

 private:
  int fd_;
  std::string buf_;
};

// The first reply: {"ok": true, ...} or an error printed (nullopt).
std::optional<json> ask(LineReader& r, const control::Request& req, const char* cmd) {
  if (!r.send(control::encode_request(req))) {
    std::cerr << fmt::format("ddpctl {}: the launcher went away\n", cmd);
    return std::nullopt;
  }
  auto reply = r.next();
  if (!reply) {
    std::cerr << fmt::format("ddpctl {}: the launcher closed the connection without an answer\n", cmd);
    return std::nullopt;
  }
  // A standing coordinator's answer for a job that ended there carries "ok": false (for older
  // clients) and "ended" (for us): see ended_in().
  if (!reply->value("ok", false) && !reply->contains("ended")) {
    std::cerr << fmt::format("ddpctl {}: {}\n", cmd, reply->value("error", "refused"));
    return std::nullopt;
  }
  return reply;
}

// The job a reply names (a coordinator names the one it chose), else `fallback`.
std::string job_id_in(const json& reply, const std::string& fallback) {
  const auto id = reply.find("job_id");
  return id != reply.end() && id->is_string() ? id->get<std::string>() : fallback;
}

// A standing coordinator's answer for a job that ended there (its end record, less the files);
// nullopt for a running job's. `defaulted`: the coordinator chose it (no id named).
std::optional<control::Ended> ended_in(const json& reply, bool& defaulted) {
  auto it = reply.find("ended");
  if (it == reply.end()) return std::nullopt;
  const auto last = reply.find("last");
  defaulted = last != reply.end() && last->is_boolean() && last->get<bool>();
  if (auto e = control::ended_from_json(*it)) return e;
  control::Ended unknown;  // malformed: said as such rather than taken for a running job
  unknown.job_id = job_id_in(reply, "?");
  unknown.status = "ended (the coordinator's record of it is malformed)";
  unknown.exit_code = -1;  // not known: no "exit code 0" said of it
  return unknown;
}

// `status` of a job that has ended: exit code 1 (not running).
int status_of_ended(const control::Ended& e, bool defaulted, bool json_out, bool remote = false) {
  if (json_out) {
    auto j = control::to_json(e);
    j.erase("files");
    j["state"] = "ended";
    std::cout << j.dump(2) << "\n";
  }
  std::cerr << "ddpctl status: " << said_ended(e, defaulted, remote) << "\n";
  return 1;
}

int run_status(const ControlArgs& a) {
  int rc = 0;
  bool defaulted = false;
  auto t = find_job(a, "status", rc, &defaulted);
  if (!t) return rc;
  if (t->ended) return status_of_ended(*t->ended, defaulted, a.json_out);
  LineReader r(t->fd);
  auto reply = ask(r, {control::Op::status, {}, false}, "status");
  if (!reply) return 1;
  if (auto e = ended_in(*reply, defaulted)) return status_of_ended(*e, defaulted, a.json_out, true);
  if (a.json_out)
    std::cout << (*reply)["status"].dump(2) << "\n";
  else
    std::cout << control::format_status((*reply)["status"], now_ms());
  return 0;
}

int run_stop(const ControlArgs& a) {
  int rc = 0;
  bool defaulted = false;
  auto t = find_job(a, "stop", rc, &defaulted);
  if (!t) return rc;
  auto nothing_to_stop = [&](const control::Ended& e, bool remote) {
    std::cerr << "ddpctl stop: nothing to stop: " << said_ended(e, defaulted, remote) << "\n";
    return 1;
  };
  if (t->ended) return nothing_to_stop(*t->ended, false);
  LineReader r(t->fd);
  auto reply = ask(r, {control::Op::stop, {}, false}, "stop");
  if (!reply) return 1;
  if (auto e = ended_in(*reply, defaulted)) return nothing_to_stop(*e, true);
  t->job_id = job_id_in(*reply, t->job_id);  // a coordinator names the job it chose
  std::cerr << fmt::format("ddpctl stop: stopping job {} ...\n", t->job_id);
  while (r.next()) {
  }
  std::cerr << fmt::format("ddpctl stop: job {} has ended\n", t->job_id);
  return 0;
}

// "[rank] text", or with --timestamps "<UTC time> [rank] text".
void print_line(bool timestamps, const std::string& time, int rank, const std::string& text) {
  if (timestamps)
    std::cout << fmt::format("{} [{}] {}\n", time, rank, text);
  else
    std::cout << fmt::format("[{}] {}\n", rank, text);
}

// The ranks' files merged by time (LogMerge), each read up to its limit.
void print_merged(std::vector<control::LogMerge::Source> sources, bool timestamps) {
  control::LogMerge merge(std::move(sources));
  while (auto l = merge.next()) print_line(timestamps, l->time, l->rank, l->text);
  std::cout.flush();
  for (const auto& u : merge.unreadable()) std::cerr << "ddpctl logs: " << u << "\n";
}

// `logs --attempt N|all` where the files are here: the attempt folders beside the ones the
// launcher (or the end record) names (control::attempt_logs); each attempt's lines after a line
// on stderr saying which. (Through a standing coordinator, it reads them and sends the lines.)
int logs_of_attempts(const ControlArgs& a, const control::Request& req, Target& t, bool defaulted) {
  std::vector<std::pair<int, std::string>> files;
  std::map<std::string, std::uint64_t> sizes;
  if (t.ended) {
    files = t.ended->files;
    std::cerr << "ddpctl logs: " << said_ended(*t.ended, defaulted) << "\n";
  } else {
    // Only the current attempt's folder is wanted of the launcher: asked with no ranks (an
    // earlier attempt may have had more) and no "attempt" (a launcher reads no other's files).
    LineReader r(t.fd);
    auto reply = ask(r, control::Request{control::Op::logs, {}, false, false, std::nullopt}, "logs");
    if (!reply) return 1;
    t.job_id = job_id_in(*reply, t.job_id);
    if (reply->contains("ended") || !(*reply)["files"].is_array() ||
        (!(*reply)["files"].empty() && !(*reply)["files"][0].contains("path"))) {
      std::cerr << "ddpctl logs: the job's log files are not on this machine\n";
      return 1;
    }
    for (const auto& f : (*reply)["files"]) {
      files.emplace_back(f.value("rank", -1), f.value("path", ""));
      sizes[files.back().second] = f.value("size", std::uint64_t{0});  // the latest attempt's, as they were
    }
  }
  std::vector<control::AttemptLogs> attempts;
  try {
    attempts = control::attempt_logs(t.job_id, files, *req.attempt, req.ranks, t.ended.has_value());
  } catch (const control::ControlError& e) {
    std::cerr << "ddpctl logs: " << e.what() << "\n";
    return 1;
  }
  for (const auto& at : attempts) {
    std::cerr << "ddpctl logs: " << at.header << "\n" << std::flush;
    print_merged(control::LogMerge::of_files(at.files, req.ranks, sizes), a.timestamps);
  }
  return 0;
}

int run_logs(const ControlArgs& a) {
  control::Request req{control::Op::logs, {}, a.follow};
  if (!a.ranks.empty()) {
    try {
      req.ranks = control::parse_rank_list(a.ranks);
    } catch (const control::ControlError& e) {
      std::cerr << "ddpctl logs: " << e.what() << "\n";
      return 2;
    }
  }
  if (a.attempt) {
    if (a.follow) {
      std::cerr
          << "ddpctl logs: --follow is the current attempt's; --attempt reads the files of one that may be over\n";
      return 2;
    }
    const auto n = ddp::parse_int(*a.attempt);
    if (*a.attempt != "all" && (!n || *n < 0 || *n > control::kMaxAttempt)) {
      std::cerr << fmt::format("ddpctl logs: --attempt: expected an attempt number (0 is the first) or all, got '{}'\n",
                               *a.attempt);
      return 2;
    }
    req.attempt = n ? static_cast<int>(*n) : control::kEveryAttempt;
  }
  int rc = 0;
  bool defaulted = false;
  auto t = find_job(a, "logs", rc, &defaulted);
  if (!t) return rc;
  if (a.attempt && a.coordinator.empty()) return logs_of_attempts(a, req, *t, defaulted);
  if (t->ended) {  // the last attempt's files, as the launcher listed them when the job ended
    const auto& files = t->ended->files;
    if (auto outside = control::ranks_outside(req.ranks, static_cast<int>(files.size())); outside && !files.empty()) {
      std::cerr << fmt::format("ddpctl logs: {}\n", *outside);
      return 1;
    }
    // Which job these lines are, before them (the user did not name it, or it is over).
    std::cerr << "ddpctl logs: " << said_ended(*t->ended, defaulted) << "\n" << std::flush;
    print_merged(control::LogMerge::of_files(files, req.ranks), a.timestamps);
    return 0;
  }
  LineReader r(t->fd);
  auto reply = ask(r, req, "logs");
  if (!reply) return 1;
  t->job_id = job_id_in(*reply, t->job_id);
  if (auto e = ended_in(*reply, defaulted))  // through a coordinator: its lines follow inline
    std::cerr << "ddpctl logs: " << said_ended(*e, defaulted, true) << "\n" << std::flush;
  // What the files held when we asked, merged by time; with -f, the stream carries on from exactly there.
  std::vector<control::LogMerge::Source> sources;
  for (const auto& f : (*reply)["files"]) {
    sources.push_back({f.value("rank", -1), {{f.value("path", ""), f.value("size", std::uint64_t{0})}}});
  }
  print_merged(std::move(sources), a.timestamps);
  // Without -f a launcher closes now; a coordinator first sends its files' lines inline.
  while (auto m = r.next()) {
    if (m->contains("line")) {
      // Each field checked for its type: a line that is not what we expect is skipped, not fatal.
      const auto& line = (*m)["line"];
      const auto* rank = m->contains("rank") ? &(*m)["rank"] : nullptr;
      if (!line.is_string() || (rank && !rank->is_number_integer())) continue;
      const auto time =
          m->contains("time") && (*m)["time"].is_string() ? (*m)["time"].get<std::string>() : ddp::utc_timestamp();
      print_line(a.timestamps, time, rank ? rank->get<int>() : -1, line.get<std::string>());
      std::cout.flush();
    } else if (m->contains("dropped")) {
      std::cerr << fmt::format("ddpctl logs: {} line(s) skipped (we read too slowly; the log files have them)\n",
                               m->value("dropped", 0));
    } else if (m->contains("attempt") && m->contains("header") && (*m)["header"].is_string()) {
      // --attempt through a coordinator: the attempt whose lines follow
      std::cerr << "ddpctl logs: " << ddp::clean_text((*m)["header"].get<std::string>(), 1024) << "\n" << std::flush;
    } else if (m->contains("unreadable") && (*m)["unreadable"].is_string()) {  // a coordinator's file skipped
      std::cerr << "ddpctl logs: " << ddp::clean_text((*m)["unreadable"].get<std::string>(), 1024) << "\n";
    } else if (m->contains("end")) {
      std::cerr << fmt::format("ddpctl logs: job {} ended ({})\n", t->job_id, m->value("end", "?"));
    }
  }
  return 0;
}

}  // namespace

int run_stacks_job(const StacksJobArgs& sa) {
  control::Request req{control::Op::stacks, {}, false, sa.native};
  if (!sa.ranks.empty()) {
    try {
      req.ranks = control::parse_rank_list(sa.ranks);
    } catch (const control::ControlError& e) {
      std::cerr << "ddpctl stacks: " << e.what() << "\n";
      return 2;
    }
  }
  ControlArgs a;
  a.job = sa.job;
  a.coordinator = sa.coordinator;
  a.token_file = sa.token_file;
  a.tls = sa.tls;
  int rc = 0;
  auto t = find_job(a, "stacks", rc);
  if (!t) return rc;
  if (t->ended) {
    std::cerr << fmt::format("ddpctl stacks: nothing runs: {}\n", describe_ended(*t->ended));
    return 1;
  }
  LineReader r(t->fd);
  auto reply = ask(r, req, "stacks");
  if (!reply) return 1;
  bool defaulted = false;
  if (auto e = ended_in(*reply, defaulted)) {
    std::cerr << fmt::format("ddpctl stacks: nothing runs: {}\n", describe_ended(*e, true));
    return 1;
  }
  // The launcher (or coordinator) is ours, but its reply is still checked like any other.
  std::vector<ddp::stacks::RankStacks> ranks;
  const auto& list = (*reply)["ranks"];
  if (!list.is_array()) {
    std::cerr << "ddpctl stacks: the launcher's reply holds no list of ranks\n";
    return 1;
  }
  for (const auto& x : list) {
    ddp::stacks::RankStacks rs;
    rs.rank = x.value("rank", -1);
    rs.node = x.value("node", "");
    std::string error;
    auto p = x.contains("process") ? ddp::stacks::process_from_json(x["process"], error) : std::nullopt;
    if (!p) {
      rs.stacks.python = "not read";
      rs.stacks.errors.push_back("the launcher's reply for this rank is malformed: " + error);
    } else {
      rs.stacks = std::move(*p);
    }
    ranks.push_back(std::move(rs));
  }
  const int world = reply->value("world_size", static_cast<int>(ranks.size()));
  const auto groups = ddp::stacks::merge(ranks, {.main_thread_only = sa.main_only});
  int unreadable = 0;
  for (const auto& x : ranks)
    if (x.stacks.threads.empty() && !x.stacks.errors.empty()) ++unreadable;
  if (sa.json) {
    json procs = json::array();
    for (const auto& x : ranks) {
      auto j = ddp::stacks::to_json(x.stacks);
      j["rank"] = x.rank;
      j["node"] = x.node;
      procs.push_back(std::move(j));
    }
    std::cout << json{{"job_id", job_id_in(*reply, t->job_id)},
                      {"world_size", world},
                      {"processes", procs},
                      {"groups", ddp::stacks::to_json(groups)}}
                     .dump(2)
              << "\n";
  } else if (ranks.empty()) {
    std::cerr << fmt::format("ddpctl stacks: job {}: no rank runs now (between attempts?)\n", t->job_id);
    return 1;
  } else {
    std::cout << ddp::stacks::render_text(groups, world) << std::flush;
    for (const auto& x : ranks) {
      for (const auto& e : x.stacks.errors)
        std::cerr << fmt::format("# rank {}{}: {}\n", x.rank, x.node.empty() ? "" : " on " + x.node, e);
    }
  }
  return unreadable ? 1 : 0;
}

std::vector<Command> add_control_commands(CLI::App& root) {
  auto args = std::make_shared<ControlArgs>();
  std::vector<Command> out;
  auto* status =
      root.add_subcommand("status", "a running job: nodes, ranks, pids, restarts, last output, store waiters");
  status->add_option("job", args->job,
                     "job id, or any beginning of it that names one job (default: the only job of yours that runs, "
                     "else the one that ended last)");
  status->add_flag("--json", args->json_out, "the status document as JSON");
  out.push_back({status, [args] { return run_status(*args); }});
  auto* logs =
      root.add_subcommand("logs", "a job's output from its per-rank log files, the ranks' lines merged by time");
  logs->add_option("job", args->job,
                   "job id, or any beginning of it that names one job (default: the only job of yours that runs, else "
                   "the one that ended last)");
  logs->add_flag("-f,--follow", args->follow, "then follow the live output until the job ends");
  logs->add_option("--ranks", args->ranks, "only these ranks, e.g. 0,3 or 4-7");
  logs->add_flag("--timestamps", args->timestamps, "begin each line with the UTC time it was written");
  logs->add_option("--attempt", args->attempt,
                   "an earlier attempt's lines (0 is the first), or all: every attempt's, in order (default: the "
                   "current or last attempt)");
  out.push_back({logs, [args] { return run_logs(*args); }});
  auto* stop =
      root.add_subcommand("stop", "stop a running job as Ctrl-C would (SIGTERM, grace, SIGKILL); waits for its end");
  stop->add_option("job", args->job,
                   "job id, or any beginning of it that names one job (default: the only job of yours that runs)");
  out.push_back({stop, [args] { return run_stop(*args); }});
  for (auto* cmd : {status, logs, stop}) {
    cmd->add_option(
        "--coordinator", args->coordinator,
        "ask the standing ddp-coordinator at HOST[:PORT] (port 29411) for its job instead of this machine's "
        "control sockets");
    cmd->add_option("--token-file", args->token_file,
                    "with --coordinator: the shared secret (default: $DDP_TOKEN_FILE, $XDG_CONFIG_HOME/ddpctl/token, "
                    "/etc/ddpctl/token)");
    cmd->add_flag("--tls", args->tls, "with --coordinator: talk to it inside TLS 1.3, keyed by the token");
  }
  return out;
}

}  // namespace ddpctl

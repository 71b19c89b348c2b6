#include "control/paths.hpp"

#include "common/log.hpp"
#include "common/safe_fs.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

namespace ddp::control {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kSuffix = ".sock";
constexpr std::string_view kEndedSuffix = ".ended";
constexpr auto kEndedKeep = std::chrono::hours(24 * 30);
constexpr auto kPruneEvery = std::chrono::hours(1);
constexpr std::string_view kPruneMarker = ".pruned";

// Creates `dir` 0700 if missing; an error text when it is not a private folder of ours.
std::string private_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    return fmt::format("cannot create {}: {}", dir, std::strerror(errno));
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return fmt::format("{}: {}", dir, std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) return fmt::format("{} is not a folder", dir);
  if (st.st_uid != ::getuid()) return fmt::format("{} belongs to uid {}, not to us", dir, st.st_uid);
  if (st.st_mode & 077)
    return fmt::format("{} is open to other users (mode {:o}); it must be 0700", dir, st.st_mode & 0777);
  return {};
}

bool is_dir(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

std::string runtime_dir() {
  std::vector<std::string> candidates;
  if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x && *x == '/' && is_dir(x)) {
    if (const auto usable = safefs::usable_env_dir(x)) candidates.push_back(fmt::format("{}/ddpctl", *usable));
  }
  if (const auto run = fmt::format("/run/user/{}", ::getuid()); is_dir(run)) candidates.push_back(run + "/ddpctl");
  candidates.push_back(fmt::format("/tmp/ddpctl-{}", ::getuid()));
  std::vector<std::string> why;
  for (const auto& c : candidates) {
    auto err = private_dir(c);
    if (err.empty()) return c;
    why.push_back(err);
  }
  throw ControlError(fmt::format("no private folder for control sockets: {}", fmt::join(why, "; ")));
}

std::string socket_path(const std::string& dir, const std::string& job_id) {
  auto p = fmt::format("{}/{}{}", dir, job_id, kSuffix);
  if (p.size() >= sizeof(sockaddr_un{}.sun_path)) {
    throw ControlError(fmt::format("the control socket path {} is longer than {} bytes (use a shorter --job-id)", p,
                                   sizeof(sockaddr_un{}.sun_path) - 1));
  }
  return p;
}

std::vector<std::string> socket_jobs(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const auto name = e.path().filename().string();
    if (name.size() > kSuffix.size() && name.ends_with(kSuffix) && e.is_socket(ec)) {
      out.push_back(name.substr(0, name.size() - kSuffix.size()));
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> sweep_stale_sockets(const std::string& dir) {
  std::vector<std::string> removed;
  for (const auto& job : socket_jobs(dir)) {
    std::string path;
    try {
      path = socket_path(dir, job);
    } catch (const ControlError&) {
      continue;
    }
    if (remove_if_stale(path)) removed.push_back(job);
  }
  return removed;
}

namespace {

// Whether a socket of this network namespace is bound to `path` (/proc/net/unix, whose last
// column is the bound path). Read in bounded pieces; a line too long to be ours is skipped.
bool bound_in_proc_net_unix(const std::string& path) {
  const int fd = ::open("/proc/net/unix", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;  // cannot tell: taken as bound (a stale file left beats a live one lost)
  constexpr std::size_t kMaxBytes = 64u << 20;
  const std::string tail = " " + path;
  std::string line;
  bool found = false;
  char buf[16 * 1024];
  std::size_t total = 0;
  for (ssize_t n; !found && total < kMaxBytes && (n = ::read(fd, buf, sizeof buf)) > 0;) {
    total += static_cast<std::size_t>(n);
    for (ssize_t i = 0; i < n && !found; ++i) {
      if (buf[i] != '\n') {
        if (line.size() <= 4096) line.push_back(buf[i]);
        continue;
      }
      found = line.ends_with(tail);
      line.clear();
    }
  }
  ::close(fd);
  return found || total >= kMaxBytes;  // unread beyond the cap: taken as bound, as above
}

// What a connect to the socket at `path` says: 0 (accepted), its errno, or -1 when none could be
// tried (the path too long, no socket). Non-blocking: a live launcher with a full backlog answers
// EAGAIN, not ECONNREFUSED.
int connect_errno(const std::string& path) {
  if (path.size() >= sizeof(sockaddr_un{}.sun_path)) return -1;
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  const int err = ::connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) == 0 ? 0 : errno;
  ::close(fd);
  return err;
}

}  // namespace

bool remove_if_stale(const std::string& path) {
  struct stat before {};
  if (::lstat(path.c_str(), &before) != 0) return false;
  const bool refused = connect_errno(path) == ECONNREFUSED;
  // Refused: a dead launcher's file, or a live one's between bind() and listen().
  if (!refused || bound_in_proc_net_unix(path)) return false;
  // Still the file that refused: not one a new launcher of the same job id bound meanwhile.
  struct stat now {};
  if (::lstat(path.c_str(), &now) != 0 || now.st_ino != before.st_ino || now.st_dev != before.st_dev) return false;
  return ::unlink(path.c_str()) == 0;
}

bool someone_listens(const std::string& path) {
  const int err = connect_errno(path);
  return err == 0 || err == EAGAIN;  // a full backlog is a live launcher too
}

std::string coordinator_jobs_dir() {
  auto dir = runtime_dir() + "/coordinator";
  if (auto err = private_dir(dir); !err.empty()) throw ControlError(err);
  return dir;
}

std::string records_dir() {
  std::string base;  // root: not in a folder another user could swap (safefs::usable_env_dir)
  if (const char* x = std::getenv("XDG_STATE_HOME"); x && *x == '/')
    base = x;
  else if (const char* h = std::getenv("HOME"); h && *h == '/')
    base = fmt::format("{}/.local/state", h);
  if (!base.empty()) base = safefs::usable_env_dir(base).value_or("");
  if (!base.empty()) {
    std::error_code ec;
    fs::create_directories(base, ec);
    if (!ec && private_dir(base + "/ddpctl").empty() && private_dir(base + "/ddpctl/jobs").empty()) {
      return base + "/ddpctl/jobs";
    }
  }
  return runtime_dir();
}

Ended ended_now(const std::string& job_id, const std::string& status, int exit_code, const std::string& logs,
                const std::optional<std::string>& result_json) {
  Ended e;
  e.job_id = job_id;
  e.status = status;
  e.exit_code = exit_code;
  e.ended_unix_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  e.logs = logs;
  std::error_code ec;
  e.result_json = result_json ? fs::absolute(*result_json, ec).string() : std::string();
  return e;
}

nlohmann::json to_json(const Ended& e) {
  nlohmann::json files = nlohmann::json::array();
  for (const auto& [rank, path] : e.files) files.push_back({{"rank", rank}, {"path", path}});
  nlohmann::json j = {{"job_id", e.job_id},
                      {"status", e.status},
                      {"exit_code", e.exit_code},
                      {"ended_unix_ms", e.ended_unix_ms},
                      {"logs", e.logs},
                      {"result_json", e.result_json},
                      {"files", files}};
  if (!e.message.empty()) j["message"] = e.message;
  return j;
}

// Records older than kEndedKeep go, in a walk over the folder that runs at most once per
// kPruneEvery (the marker's mtime says when it last ran): a user of many short jobs keeps
// thousands of records, and every launch's end looked at each of them.
static void prune_ended(const std::string& dir) {
  const auto marker = dir + "/" + std::string(kPruneMarker);
  struct stat st {};
  if (::lstat(marker.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    // A marker from the future (a clock that ran ahead, a restored snapshot) is no reason to wait.
    const auto age = std::chrono::system_clock::now() - std::chrono::system_clock::from_time_t(st.st_mtime);
    if (age >= decltype(age)::zero() && age < kPruneEvery) return;
  }
  // Not a link (O_NOFOLLOW), and a FIFO in its place does not block us (O_NONBLOCK).
  const int fd = ::open(marker.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
  if (fd >= 0) {
    struct stat fst {};
    if (::fstat(fd, &fst) == 0 && S_ISREG(fst.st_mode)) ::futimens(fd, nullptr);
    ::close(fd);
  }
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (const auto& f : fs::directory_iterator(dir, ec)) {
    const auto name = f.path().filename().string();
    if (name.find(kEndedSuffix) == std::string::npos || !f.is_regular_file(ec)) continue;
    const auto t = fs::last_write_time(f.path(), ec);
    if (!ec && now - t > kEndedKeep) fs::remove(f.path(), ec);
  }
}

static std::string text_of(const Ended& e) {
  return to_json(e).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

void record_ended(const std::string& dir, const Ended& e) {
  prune_ended(dir);
  const auto path = fmt::format("{}/{}{}", dir, e.job_id, kEndedSuffix);
  const auto tmp = path + ".tmp";
  const auto text = text_of(e);
  // 0600 from the start, without the process's umask (other threads' files would get ours).
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return;
  const bool written = safefs::write_all(fd, text);
  const bool closed = ::close(fd) == 0;
  if (!written || !closed || ::rename(tmp.c_str(), path.c_str()) != 0) ::unlink(tmp.c_str());
}

EndedText ended_text(Ended e) {
  // A time no record has (the year 144 000); found after its key, which no string value can
  // hold unescaped.
  constexpr std::int64_t kMark = 4'503'599'627'370'497;
  e.ended_unix_ms = kMark;
  const auto text = text_of(e);
  const auto mark = fmt::format("\"ended_unix_ms\": {}", kMark);
  const auto at = text.find(mark);
  const auto digits = fmt::format("{}", kMark).size();
  return {fmt::format("{}{}", e.job_id, kEndedSuffix), text.substr(0, at + mark.size() - digits),
          text.substr(at + mark.size())};
}

std::optional<RecordIfKilled> record_if_killed(const std::string& job_id, const std::string& logs,
                                               std::vector<std::pair<int, std::string>> files, std::string message) {
  std::string dir;
  try {
    dir = records_dir();
  } catch (const ControlError& e) {
    log::get("control")->debug("no end record for job {} if its launcher is killed: {}", job_id, e.what());
    return std::nullopt;
  }
  auto e = ended_now(job_id, "failed", -1, logs, std::nullopt);
  e.files = std::move(files);
  std::sort(e.files.begin(), e.files.end());
  e.message = std::move(message);
  return RecordIfKilled{std::move(dir), ended_text(std::move(e))};
}

void forget_ended(const std::string& dir, const std::string& job_id) {
  ::unlink(fmt::format("{}/{}{}", dir, job_id, kEndedSuffix).c_str());
}

std::optional<Ended> read_ended(const std::string& dir, const std::string& job_id) {
  std::ifstream in(fmt::format("{}/{}{}", dir, job_id, kEndedSuffix));
  if (!in) return std::nullopt;
  const auto j = nlohmann::json::parse(in, nullptr, false);
  auto e = ended_from_json(j);
  if (!e || e->job_id != job_id || !j.contains("files")) return std::nullopt;
  return e;
}

std::optional<Ended> ended_from_json(const nlohmann::json& j) {
  if (!j.is_object()) return std::nullopt;
  try {
    Ended e;
    e.job_id = j.at("job_id").get<std::string>();
    e.status = j.at("status").get<std::string>();
    // A standing coordinator's answer, or a file: an integer in range, nothing converted.
    const auto int64_in = [](const nlohmann::json& v, std::int64_t lo, std::int64_t hi) -> std::optional<std::int64_t> {
      if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(hi)))
        return std::nullopt;
      const auto x = v.get<std::int64_t>();
      if (x < lo || x > hi) return std::nullopt;
      return x;
    };
    const auto int_in = [&](const nlohmann::json& v, std::int64_t lo, std::int64_t hi) -> std::optional<int> {
      const auto x = int64_in(v, lo, hi);
      return x ? std::optional<int>(static_cast<int>(*x)) : std::nullopt;
    };
    const auto code = int_in(j.at("exit_code"), std::numeric_limits<int>::min(), std::numeric_limits<int>::max());
    if (!code) return std::nullopt;
    e.exit_code = *code;
    // Milliseconds since 1970, up to the year 33658: `ddpctl status` subtracts it from now.
    const auto ended = int64_in(j.at("ended_unix_ms"), 0, std::int64_t{1} << 50);
    if (!ended) return std::nullopt;
    e.ended_unix_ms = *ended;
    e.logs = j.at("logs").get<std::string>();
    e.result_json = j.at("result_json").get<std::string>();
    if (auto f = j.find("files"); f != j.end()) {
      for (const auto& x : *f) {
        const auto rank = int_in(x.at("rank"), 0, 1 << 20);
        if (!rank) return std::nullopt;
        e.files.emplace_back(*rank, x.at("path").get<std::string>());
      }
    }
    if (auto m = j.find("message"); m != j.end() && m->is_string()) e.message = m->get<std::string>();
    return e;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

std::vector<std::string> ended_jobs(const std::string& dir) {
  std::vector<std::pair<fs::file_time_type, std::string>> found;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir, ec)) {
    const auto name = f.path().filename().string();
    if (name.size() <= kEndedSuffix.size() || !name.ends_with(kEndedSuffix) || !f.is_regular_file(ec)) continue;
    const auto t = fs::last_write_time(f.path(), ec);
    if (ec) continue;
    found.emplace_back(t, name.substr(0, name.size() - kEndedSuffix.size()));
  }
  // Newest first; ties (records written in the same clock tick) by id, for a stable answer.
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  std::vector<std::string> out;
  out.reserve(found.size());
  for (auto& [t, id] : found) out.push_back(std::move(id));
  return out;
}

std::vector<std::string> match_job(const std::vector<std::string>& ids, std::string_view typed) {
  if (!typed.empty() && std::find(ids.begin(), ids.end(), typed) != ids.end()) return {std::string(typed)};
  std::vector<std::string> out;
  for (const auto& id : ids) {
    if (id.starts_with(typed) && std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  }
  return out;
}

}  // namespace ddp::control

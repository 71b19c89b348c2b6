#include "supervisor/cgroup.hpp"

#include "common/log.hpp"
#include "common/strings.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace ddp::supervisor {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Mount points in mountinfo escape space, tab, newline and backslash as octal.
std::string unescape_mount(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      int v = 0;
      bool ok = true;
      for (int k = 1; k <= 3; ++k) {
        char c = s[i + k];
        if (c < '0' || c > '7') ok = false;
        v = v * 8 + (c - '0');
      }
      if (ok) {
        out += static_cast<char>(v);
        i += 3;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

std::optional<std::string> base_dir() {
  auto mount = cgroup2_mount_from_mountinfo(read_file("/proc/self/mountinfo"));
  auto own = own_cgroup2_path(read_file("/proc/self/cgroup"));
  if (!mount || !own) return std::nullopt;
  return *own == "/" ? *mount : *mount + *own;
}

}  // namespace

std::optional<std::string> cgroup2_mount_from_mountinfo(std::string_view mountinfo) {
  for (auto line : split(mountinfo, '\n')) {
    // "36 25 0:30 / /sys/fs/cgroup/unified rw,... shared:9 - cgroup2 cgroup2 rw,nsdelegate"
    auto dash = line.find(" - ");
    if (dash == std::string_view::npos) continue;
    auto after = split(line.substr(dash + 3), ' ');
    if (after.empty() || after[0] != "cgroup2") continue;
    auto before = split(line.substr(0, dash), ' ');
    if (before.size() < 5 || before[3] != "/") continue;  // a bind of a sub-tree: skip
    return unescape_mount(before[4]);
  }
  return std::nullopt;
}

std::optional<std::string> own_cgroup2_path(std::string_view proc_self_cgroup) {
  for (auto line : split(proc_self_cgroup, '\n')) {
    if (starts_with(line, "0::")) {
      auto p = std::string(trim(line.substr(3)));
      if (p.empty() || p[0] != '/') return std::nullopt;
      // "(deleted)" or a cgroup namespace root we cannot see from here
      if (p.find(" (deleted)") != std::string::npos) return std::nullopt;
      return p;
    }
  }
  return std::nullopt;
}

std::optional<unsigned long long> start_time_from_stat(std::string_view stat_line) {
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses; count from the last ')'.
  auto close = stat_line.rfind(')');
  if (close == std::string_view::npos || close + 2 > stat_line.size()) return std::nullopt;
  auto fields = split(trim(stat_line.substr(close + 2)), ' ');
  if (fields.size() < 20) return std::nullopt;  // fields[0] is field 3 (state), so 22 is [19]
  auto v = parse_int(fields[19]);
  if (!v || *v < 0) return std::nullopt;
  return static_cast<unsigned long long>(*v);
}

namespace {
std::optional<unsigned long long> start_time_of(long long pid) {
  return start_time_from_stat(read_file(fmt::format("/proc/{}/stat", pid)));
}
}  // namespace

std::optional<Cgroup> Cgroup::create(const std::string& tag, Use use) {
  auto log = log::get("supervisor");
  const bool helper = use == Use::helper;
  const char* instead = helper ? "a helper's process group is killed at its end instead (a grandchild that called "
                                 "setsid() then outlives it)"
                               : "workers are tracked by the subreaper walk instead (a worker that leaves the process "
                                 "tree by double-forking is then not killed with the attempt)";
  if (const char* off = std::getenv("DDP_NO_CGROUP"); off && *off && std::string_view(off) != "0") {
    log->debug("DDP_NO_CGROUP is set: {}", instead);
    return std::nullopt;
  }
  auto base = base_dir();
  if (!base) {
    log->debug("no cgroup v2 found: {}", instead);
    return std::nullopt;
  }
  std::string path = fmt::format("{}/ddpctl-{}-{}-{}", *base, ::getpid(), start_time_of(::getpid()).value_or(0), tag);
  // Root (the agent, its shepherd, a root launch) is expected to contain its workers: losing
  // the cgroup is said at warning. A user's launch usually may not write its own cgroup's
  // parent, and the subreaper walk is the documented way there: debug.
  // A helper's cgroup is a refinement (its process group is killed either way): debug, or every
  // probe would warn where cgroups are read-only.
  const auto level = ::geteuid() == 0 && !helper ? spdlog::level::warn : spdlog::level::debug;
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    log->log(level, "cannot create cgroup {}: {}; {}", path, std::strerror(errno), instead);
    return std::nullopt;
  }
  int fd = ::open((path + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    log->log(level, "cannot open {}/cgroup.procs: {}; {}", path, std::strerror(errno), instead);
    ::rmdir(path.c_str());
    return std::nullopt;
  }
  // Only for clone3's CLONE_INTO_CGROUP: without it, children migrate through cgroup.procs.
  const int dir = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  log->debug("{} run in cgroup {}", helper ? "a helper program and its children" : "workers of this attempt", path);
  return Cgroup(path, fd, dir);
}

Cgroup::Cgroup(Cgroup&& other) noexcept
    : path_(std::move(other.path_)),
      procs_fd_(std::exchange(other.procs_fd_, -1)),
      dir_fd_(std::exchange(other.dir_fd_, -1)) {
  other.path_.clear();
}

Cgroup::~Cgroup() {
  if (procs_fd_ >= 0) ::close(procs_fd_);
  if (dir_fd_ >= 0) ::close(dir_fd_);
  if (path_.empty()) return;
  if (!empty()) kill_all();
  // rmdir fails with EBUSY until the killed processes are gone; they are (SIGKILL is final) by
  // the time the launcher destroys the cgroup after reaping, but the kernel may still be tearing
  // them down: wait for cgroup.events to say "populated 0" (an event, not a poll), at most 1 s.
  if (::rmdir(path_.c_str()) == 0 || errno != EBUSY) return;
  if (!wait_unpopulated(std::chrono::seconds(1)) || ::rmdir(path_.c_str()) != 0) {
    log::get("supervisor")
        ->warn(
            "cannot remove cgroup {}: {} (a process of the job may still be exiting; "
            "the next launch's sweep removes it)",
            path_, std::strerror(errno));
  }
}

bool Cgroup::wait_unpopulated(std::chrono::milliseconds limit) const {
  int fd = ::open((path_ + "/cgroup.events").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return empty();
  const auto deadline = std::chrono::steady_clock::now() + limit;
  bool unpopulated = false;
  while (true) {
    // kernfs: read the whole file from offset 0, then poll() wakes with POLLPRI on a change.
    char buf[256];
    ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    if (n < 0) break;
    buf[n] = '\0';
    if (std::strstr(buf, "populated 0")) {
      unpopulated = true;
      break;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLPRI, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) < 0 && errno != EINTR) break;
  }
  ::close(fd);
  return unpopulated;
}

std::vector<pid_t> Cgroup::pids() const {
  std::vector<pid_t> out;
  std::ifstream in(path_ + "/cgroup.procs");
  pid_t p;
  while (in >> p) out.push_back(p);
  return out;
}

void Cgroup::signal_all(int sig) const {
  for (pid_t p : pids()) ::kill(p, sig);
}

void Cgroup::kill_all() const {
  int fd = ::open((path_ + "/cgroup.kill").c_str(), O_WRONLY | O_CLOEXEC);
  if (fd >= 0) {
    bool ok = ::write(fd, "1", 1) == 1;
    ::close(fd);
    if (ok) return;
  }
  signal_all(SIGKILL);
}

void Cgroup::sweep_stale() {
  auto base = base_dir();
  if (!base) return;
  DIR* d = ::opendir(base->c_str());
  if (!d) return;
  std::vector<std::string> stale;
  while (auto* e = ::readdir(d)) {
    std::string_view name = e->d_name;
    if (!starts_with(name, "ddpctl-")) continue;
    auto parts = split(name, '-');
    if (parts.size() < 4) continue;
    auto pid = parse_int(parts[1]);
    auto started = parse_int(parts[2]);
    if (!pid || !started || *pid == ::getpid()) continue;
    auto now = start_time_of(*pid);
    if (now && static_cast<long long>(*now) == *started) continue;  // its owner still runs
    stale.push_back(*base + "/" + std::string(name));
  }
  ::closedir(d);
  for (const auto& path : stale) {
    log::get("supervisor")->warn("killing processes left in {} by a launcher that no longer runs", path);
    Cgroup stale_group(path, -1, -1);  // its destructor kills what is left and removes it
  }
}

}  // namespace ddp::supervisor

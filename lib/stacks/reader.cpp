// See reader.hpp. The I/O edge: /proc/PID/{maps,task} and process memory; the decisions live in
// elf.cpp, cpython.cpp and native.cpp.
#include "stacks/reader.hpp"

#include "stacks/cpython.hpp"
#include "stacks/elf.hpp"
#include "stacks/memory.hpp"
#include "stacks/native.hpp"
#include "supervisor/cgroup.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>

namespace ddp::stacks {

namespace {

constexpr std::size_t kMaxMaps = 64u << 20;  // a big libtorch process has ~10k mappings, ~1 MiB

std::optional<std::string> slurp(const std::string& path, std::size_t max, int& err) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    err = errno;
    return std::nullopt;
  }
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, std::size_t(n));
    if (out.size() > max) break;
  }
  ::close(fd);
  return out;
}

std::string basename_of(const std::string& p) {
  auto s = p.rfind('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

std::string permission_hint(int err) {
  if (err == EPERM || err == EACCES)
    return " (reading another process needs root, or the same user with kernel.yama.ptrace_scope=0; see "
           "docs/architecture.md)";
  if (err == ESRCH || err == ENOENT) return " (the process is gone)";
  return "";
}

// "3.10" from "python3.10" or "libpython3.10.so.1.0".
std::optional<std::string> version_in_name(const std::string& base) {
  const auto at = base.find("python");
  if (at == std::string::npos) return std::nullopt;
  std::size_t i = at + 6, digits = 0;
  std::string v;
  while (i < base.size() && (std::isdigit(static_cast<unsigned char>(base[i])) || (base[i] == '.' && digits == 1))) {
    if (base[i] != '.') ++digits;
    if (base[i] == '.' && v.find('.') != std::string::npos) break;
    v += base[i++];
  }
  if (v.size() < 3 || v.find('.') == std::string::npos || v.back() == '.') return std::nullopt;
  return v;
}

void read_python(pid_t pid, const std::vector<Mapping>& maps, const ReadOptions& options, ProcessStacks& out,
                 std::map<int, PyThread>& py) {
  ProcessMemory mem(pid);
  std::optional<std::string> versioned_name;
  for (const auto& m : maps) {
    if (m.offset != 0 || m.path.empty() || m.path[0] != '/') continue;
    const std::string base = basename_of(m.path);
    if (base.find("python") == std::string::npos) continue;
    if (auto v = version_in_name(base)) versioned_name = v;
    auto runtime = find_dynamic_symbol(mem, m.start, "_PyRuntime");
    if (!runtime) {
      if (mem.last_errno() == EPERM || mem.last_errno() == EACCES || mem.last_errno() == ESRCH) break;
      continue;
    }
    auto version_addr = find_dynamic_symbol(mem, m.start, "Py_Version");
    auto version = version_addr ? mem.get<std::uint32_t>(*version_addr) : std::nullopt;
    if (!version) {
      out.python =
          "Python " + versioned_name.value_or("older than 3.11") +
          " (no Py_Version): only native stacks are available (--native); Python frames are read for 3.11 and 3.12";
      return;
    }
    auto layout = layout_for(*version);
    if (!layout) {
      out.python = "Python " + format_version(*version) +
                   ": only native stacks are available (--native); Python frames are read for 3.11 and 3.12";
      return;
    }
    WalkLimits limits;
    limits.out_of_time = [&options] {
      return options.stop.stop_requested() || std::chrono::steady_clock::now() >= options.deadline;
    };
    PyWalk walk = walk_python(mem, *runtime, *layout, limits);
    // A read that failed (the target moved under us) is tried once more; a limit reached is not:
    // a second walk would reach it again, and would have doubled what the first one holds.
    if (!walk.error.empty() && !walk.limit_reached) {
      walk = PyWalk{};
      walk = walk_python(mem, *runtime, *layout, limits);
    }
    if (!walk.error.empty()) out.errors.push_back("Python frames: " + walk.error);
    out.python = format_version(*version);
    out.python_ok = true;
    for (auto& t : walk.threads) py[t.native_tid] = std::move(t);
    out.timing.memory_reads = mem.reads();
    return;
  }
  if (mem.last_errno() == EPERM || mem.last_errno() == EACCES || mem.last_errno() == ESRCH) {
    out.python = "unknown";
    out.errors.push_back(std::string("cannot read the memory of pid ") + std::to_string(pid) + ": " +
                         std::strerror(mem.last_errno()) + permission_hint(mem.last_errno()));
    return;
  }
  out.python = versioned_name
                   ? "Python " + *versioned_name + " without _PyRuntime: only native stacks are available (--native)"
                   : "not a Python process: only native stacks are available (--native)";
}

void sort_threads(ProcessStacks& p) {
  std::stable_sort(p.threads.begin(), p.threads.end(), [](const ThreadStack& a, const ThreadStack& b) {
    return a.main != b.main ? a.main : a.tid < b.tid;
  });
}

}  // namespace

std::optional<unsigned long long> process_start_time(pid_t pid) {
  if (pid <= 0) return std::nullopt;
  const int fd = ::open(("/proc/" + std::to_string(pid) + "/stat").c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return std::nullopt;
  char buf[1024];  // comm is at most 16 bytes: the line is a few hundred
  const ssize_t n = ::read(fd, buf, sizeof buf);
  ::close(fd);
  if (n <= 0) return std::nullopt;
  return supervisor::start_time_from_stat(std::string_view(buf, std::size_t(n)));
}

void add_native(ProcessStacks& out, NativeRead n) {
  for (auto& e : n.errors) out.errors.push_back(std::move(e));
  for (auto& [tid, frames] : n.threads) {
    auto it = std::find_if(out.threads.begin(), out.threads.end(), [&](const ThreadStack& t) { return t.tid == tid; });
    if (it == out.threads.end()) {  // a thread that started after the listing
      out.threads.push_back({});
      it = std::prev(out.threads.end());
      it->tid = tid;
      it->main = tid == out.pid;
    }
    it->native = std::move(frames);
    it->native_stop_ms = n.stop_ms.count(tid) ? n.stop_ms[tid] : 0;
    it->truncated = it->truncated || n.truncated[tid];
  }
  out.timing.native_stop_max_ms = n.stop_max_ms;
  out.timing.native_stop_total_ms = n.stop_total_ms;
  sort_threads(out);
}

ProcessStacks read_process(pid_t pid, const ReadOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  ProcessStacks out;
  out.pid = pid;
  const std::string proc = "/proc/" + std::to_string(pid);
  int err = 0;
  auto maps_text = slurp(proc + "/maps", kMaxMaps, err);
  if (!maps_text || maps_text->empty()) {
    if (maps_text) err = EPERM;  // an empty maps file: no right to look (or a kernel thread)
    out.python = "not read";
    out.errors.push_back("cannot read " + proc + "/maps: " + std::strerror(err) + permission_hint(err));
    return out;
  }
  const auto maps = parse_maps(*maps_text);

  // Threads, with their names.
  std::map<int, ThreadStack> threads;
  if (DIR* d = ::opendir((proc + "/task").c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      ThreadStack t;
      t.tid = std::atoi(e->d_name);
      t.main = t.tid == pid;
      int ignored = 0;
      if (auto comm = slurp(proc + "/task/" + e->d_name + "/comm", 64, ignored)) {
        while (!comm->empty() && comm->back() == '\n') comm->pop_back();
        t.name = *comm;
      }
      threads[t.tid] = std::move(t);
    }
    ::closedir(d);
  }

  std::map<int, PyThread> py;
  if (options.python) read_python(pid, maps, options, out, py);
  for (auto& [tid, p] : py) {
    auto& t = threads[tid];  // a thread that ended between the listing and the walk still shows
    t.tid = tid;
    t.main = tid == pid;
    t.python = std::move(p.frames);
    t.truncated = t.truncated || p.truncated;
  }

  for (auto& [tid, t] : threads) out.threads.push_back(std::move(t));
  if (options.native) add_native(out, read_native(pid));
  sort_threads(out);
  out.timing.read_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace ddp::stacks

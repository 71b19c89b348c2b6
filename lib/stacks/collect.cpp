// See collect.hpp.
#include "stacks/collect.hpp"

#include "common/json_parse.hpp"
#include "common/pidfd.hpp"
#include "stacks/merge.hpp"
#include "stacks/native.hpp"
#include "stacks/reader.hpp"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

namespace ddp::stacks {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// Bounds on a reply (a reader's, or a shepherd's or agent's over the wire). A process of
// NativeLimits' 4096 threads with 256 native frames each fits; so does CPython's deepest stack
// the walker reads (cpython.hpp caps it lower).
constexpr std::size_t kMaxThreads = 8192;
constexpr std::size_t kMaxFrames = 1024;
constexpr std::size_t kMaxString = 4096;
constexpr std::size_t kMaxErrors = 256;
constexpr std::size_t kMaxNesting = 8;  // to_json(ProcessStacks) nests 5 deep

struct Bad {
  std::string what;
};

const json& field(const json& j, const char* key) {
  if (!j.is_object()) throw Bad{std::string("expected an object holding '") + key + "'"};
  auto it = j.find(key);
  if (it == j.end()) throw Bad{std::string("missing '") + key + "'"};
  return *it;
}

std::string str(const json& j, const char* key) {
  const auto& v = field(j, key);
  if (!v.is_string() || v.get_ref<const std::string&>().size() > kMaxString)
    throw Bad{std::string("'") + key + "' is not a string of at most 4096 bytes"};
  return v.get<std::string>();
}

long long integer(const json& j, const char* key, long long lo, long long hi) {
  const auto& v = field(j, key);
  if (!v.is_number_integer() || v.get<long long>() < lo || v.get<long long>() > hi)
    throw Bad{std::string("'") + key + "' is not an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
              "]"};
  return v.get<long long>();
}

bool boolean(const json& j, const char* key) {
  const auto& v = field(j, key);
  if (!v.is_boolean()) throw Bad{std::string("'") + key + "' is not true or false"};
  return v.get<bool>();
}

double number(const json& j, const char* key) {
  const auto& v = field(j, key);
  if (!v.is_number() || !(v.get<double>() >= 0) || v.get<double>() > 1e9)
    throw Bad{std::string("'") + key + "' is not a number in [0, 1e9]"};
  return v.get<double>();
}

const json& array(const json& j, const char* key, std::size_t max) {
  const auto& v = field(j, key);
  if (!v.is_array() || v.size() > max)
    throw Bad{std::string("'") + key + "' is not a list of at most " + std::to_string(max) + " entries"};
  return v;
}

std::vector<Frame> frames(const json& j, const char* key, Frame::Kind kind) {
  std::vector<Frame> out;
  for (const auto& f : array(j, key, kMaxFrames)) {
    Frame x;
    x.kind = kind;
    x.function = str(f, "function");
    if (kind == Frame::Kind::python) {  // merge.cpp's frames_json
      x.file = str(f, "file");
      // Clamped, not refused: a line is only shown, and one bad frame must not cost the rank.
      x.line = int(std::clamp<long long>(
          integer(f, "line", std::numeric_limits<long long>::min(), std::numeric_limits<long long>::max()), 0,
          1 << 30));
    } else {
      x.file = str(f, "module");
      x.offset = std::uint64_t(integer(f, "offset", 0, std::numeric_limits<long long>::max()));
    }
    out.push_back(std::move(x));
  }
  return out;
}

std::string status_field(pid_t pid, const char* key) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  for (int n = 0; n < 128 && std::getline(in, line); ++n)
    if (line.rfind(key, 0) == 0) return line.substr(std::strlen(key));
  return {};
}

// The target's real uid and gid: a native reader never has more rights than the process's own
// user (a set-user-ID program's real user, not its owner).
std::optional<Credentials> owner_of(pid_t pid) {
  Credentials c;
  std::istringstream u(status_field(pid, "Uid:")), g(status_field(pid, "Gid:"));
  long long uid = -1, gid = -1;
  if (!(u >> uid) || !(g >> gid) || uid < 0 || gid < 0) return std::nullopt;
  c.uid = uid_t(uid);
  c.gid = gid_t(gid);
  return c;
}

ProcessStacks not_read(pid_t pid, std::string why) {
  ProcessStacks p;
  p.pid = pid;
  p.python = "not read";
  p.errors.push_back(std::move(why));
  return p;
}

// The reader's exit code when its target's start time is not the one it was given.
constexpr int kReaderEnded = 4;

ProcessStacks ended(pid_t pid) {
  return not_read(pid, "the process ended before it was read (its pid may be another process's now)");
}

// One reader process: its pid, a pidfd (a signal never reaches a recycled pid, and the owner's
// SIGCHLD handler may reap it before we do) and its stdout. Dropping it kills and reaps it.
struct Reader {
  pid_t target = 0;
  std::size_t index = 0;
  pid_t pid = -1;
  int pidfd = -1, out = -1;
  std::string reply;
  bool too_big = false;
  Clock::time_point started;

  Reader() = default;
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;
  ~Reader() {
    if (pidfd >= 0) {
      ::syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0);
      reap(std::chrono::milliseconds(1000));
      ::close(pidfd);
    }
    if (out >= 0) ::close(out);
  }
  // Waits for the reader's exit (bounded); returns its wait status, or -1.
  int reap(std::chrono::milliseconds limit) {
    if (!pidfd_exited_within(pidfd, limit)) return -1;
    siginfo_t info{};
    if (::waitid(idtype_t(3) /* P_PIDFD */, id_t(pidfd), &info, WEXITED) != 0) return -1;  // reaped by the owner
    return info.si_code == CLD_EXITED ? info.si_status : 128 + info.si_status;
  }
};

// Forks and execs the reader for `target`; the child waits for a byte on `go` so that the pidfd
// exists before it can exit. Returns "" or what failed.
std::string start_reader(Reader& r, const std::vector<std::string>& argv_s) {
  std::vector<char*> argv;
  for (const auto& a : argv_s) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  int out[2], go[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return std::string("pipe: ") + std::strerror(errno);
  if (::pipe2(go, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    return std::string("pipe: ") + std::strerror(errno);
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    for (int fd : {out[0], out[1], go[0], go[1]}) ::close(fd);
    return std::string("fork: ") + std::strerror(e);
  }
  if (pid == 0) {
    // Only async-signal-safe calls until exec: the caller may have threads.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    char byte = 0;
    if (::read(go[0], &byte, 1) != 1) ::_exit(127);
    const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null < 0 || ::dup2(null, 0) < 0 || ::dup2(out[1], 1) < 0 || ::dup2(null, 2) < 0) ::_exit(127);
    ::syscall(SYS_close_range, 3u, ~0u, 0u);  // nothing of the caller's (sockets, keys) goes along
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(go[0]);
  r.pid = pid;
  r.out = out[0];
  r.pidfd = int(::syscall(SYS_pidfd_open, pid, 0));
  if (r.pidfd < 0) {
    const int e = errno;
    ::close(go[1]);  // the child reads EOF and exits; not reaped here: the owner's handler does
    return std::string("pidfd_open: ") + std::strerror(e);
  }
  const char byte = 1;
  const bool sent = ::write(go[1], &byte, 1) == 1;
  ::close(go[1]);
  if (!sent) return std::string("cannot start the reader: ") + std::strerror(errno);
  ::fcntl(r.out, F_SETFL, O_NONBLOCK);
  r.started = Clock::now();
  return "";
}

ProcessStacks finish_reader(Reader& r, const CollectOptions& o) {
  ::close(r.out);
  r.out = -1;
  const int status = r.reap(std::chrono::milliseconds(1000));
  ::close(r.pidfd);
  r.pidfd = -1;
  if (r.too_big)
    return not_read(r.target, "the stack reader's reply exceeded " + std::to_string(o.max_reply_bytes >> 20) +
                                  " MiB; it was stopped");
  std::string error;
  auto p = process_from_text(r.reply, error);
  if (!p && status == kReaderEnded) return ended(r.target);
  if (!p && status == 3)
    return not_read(r.target, "native stacks: the stack reader could not drop to the job's user (setresuid failed)");
  if (!p) {
    return not_read(r.target,
                    "the stack reader (exit status " + std::to_string(status) + ") gave no usable reply: " + error);
  }
  if (p->pid != r.target) return not_read(r.target, "the stack reader answered for another process");
  return std::move(*p);
}

std::vector<std::string> reader_argv(const Target& t, const CollectOptions& o, std::string& error) {
  const pid_t target = t.pid;
  std::vector<std::string> a = o.reader;
  a.insert(a.end(), {"--pid", std::to_string(target)});
  if (t.start_time) a.insert(a.end(), {"--start-time", std::to_string(*t.start_time)});
  if (::geteuid() == 0) {
    auto c = o.as ? o.as : owner_of(target);
    if (!c) {
      error = "cannot tell the user of pid " + std::to_string(target) + " (is it gone?)";
      return {};
    }
    a.insert(a.end(), {"--uid", std::to_string(c->uid), "--gid", std::to_string(c->gid)});
    for (gid_t g : c->groups) a.insert(a.end(), {"--group", std::to_string(g)});
  }
  if (o.native) a.push_back("--native");
  return a;
}

std::vector<ProcessStacks> collect_native(const std::vector<Target>& targets, const CollectOptions& o) {
  const auto deadline = Clock::now() + o.budget;
  std::vector<std::optional<ProcessStacks>> results(targets.size());
  std::vector<std::unique_ptr<Reader>> running;
  std::size_t next = 0;
  const std::size_t parallel = std::size_t(std::max(1, o.parallel));
  for (;;) {
    while (next < targets.size() && running.size() < parallel && Clock::now() < deadline) {
      const Target& t = targets[next];
      if (!same_process(t)) {  // no reader for a pid that is someone else's already
        results[next++] = ended(t.pid);
        continue;
      }
      auto r = std::make_unique<Reader>();
      r->target = t.pid;
      r->index = next++;
      std::string error;
      auto argv = reader_argv(t, o, error);
      if (error.empty()) error = start_reader(*r, argv);
      if (!error.empty()) {
        results[r->index] = not_read(r->target, "native stacks: " + error);
        continue;
      }
      running.push_back(std::move(r));
    }
    if (running.empty()) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) break;
    std::vector<pollfd> fds;
    for (const auto& r : running) fds.push_back({r->out, POLLIN, 0});
    const int n = ::poll(fds.data(), fds.size(), int(std::min<long long>(left.count() + 1, 1 << 30)));
    if (n < 0 && errno != EINTR) break;
    for (std::size_t i = 0; i < running.size(); ++i) {
      if (!fds[i].revents) continue;
      Reader& r = *running[i];
      char buf[65536];
      bool done = false;
      for (;;) {
        const ssize_t got = ::read(r.out, buf, sizeof buf);
        if (got > 0) {
          if (r.reply.size() + std::size_t(got) > o.max_reply_bytes) {
            r.too_big = done = true;
            break;
          }
          r.reply.append(buf, std::size_t(got));
          continue;
        }
        if (got < 0 && errno == EINTR) continue;
        done = got == 0 || errno != EAGAIN;
        break;
      }
      if (done) {
        if (r.too_big) ::syscall(SYS_pidfd_send_signal, r.pidfd, SIGKILL, nullptr, 0);
        results[r.index] = finish_reader(r, o);
        running[i].reset();
      }
    }
    std::erase_if(running, [](const auto& r) { return !r; });
  }
  // The deadline: whoever is still reading is killed (Reader's destructor), and said so.
  const std::string late = "native stacks: not read within the time budget of " + std::to_string(o.budget.count()) +
                           " ms (the reader was stopped)";
  for (auto& r : running) results[r->index] = not_read(r->target, late);
  running.clear();
  std::vector<ProcessStacks> out;
  for (std::size_t i = 0; i < targets.size(); ++i)
    out.push_back(results[i] ? std::move(*results[i]) : not_read(targets[i].pid, late));
  return out;
}

// The reader's own work. Exit codes: 0 a reply was written, 2 bad arguments, 3 the drop failed,
// kReaderEnded the pid is not the process asked for (--start-time).
int reader_main(const std::vector<std::string>& args) {
  pid_t pid = 0;
  std::optional<unsigned long long> start_time;
  std::optional<uid_t> uid;
  std::optional<gid_t> gid;
  std::vector<gid_t> groups;
  bool native = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const auto& k = args[i];
    if (k == "--native") {
      native = true;
      continue;
    }
    if (i + 1 >= args.size()) return 2;
    const long long v = std::atoll(args[++i].c_str());
    if (k == "--start-time") {  // clock ticks since boot: past 2^32 after 497 days at 100 Hz
      if (v < 0) return 2;
      start_time = static_cast<unsigned long long>(v);
      continue;
    }
    if (v < 0 || v > (1ll << 32)) return 2;
    if (k == "--pid")
      pid = pid_t(v);
    else if (k == "--uid")
      uid = uid_t(v);
    else if (k == "--gid")
      gid = gid_t(v);
    else if (k == "--group")
      groups.push_back(gid_t(v));
    else
      return 2;
  }
  if (pid <= 0 || uid.has_value() != gid.has_value()) return 2;
  ::unsetenv("DEBUGINFOD_URLS");  // libdw would fetch missing debug info over the network

  // 1. With the caller's rights: the Python frames (nothing opened) and the ptrace capture. Each
  // only while the pid is still the process asked for: the caller took it as its child's, and a
  // pid reused since is someone else's process, not to be read or stopped as root. What was read
  // when the check after it fails is dropped (the caller checks once more after the reply).
  const Target target{pid, start_time};
  if (!same_process(target)) return kReaderEnded;
  ProcessStacks p = read_process(pid, {.python = true, .native = false});
  if (!same_process(target)) return kReaderEnded;
  NativeCapture capture;
  if (native) {
    capture = capture_native(pid);
    if (!same_process(target)) return kReaderEnded;
  }

  // 2. The job's user, for good, before any file of the job's is opened.
  if (uid && ::geteuid() == 0) {
    if (::setgroups(groups.size(), groups.data()) != 0 || ::setresgid(*gid, *gid, *gid) != 0 ||
        ::setresuid(*uid, *uid, *uid) != 0)
      return 3;
    uid_t r = 0, e = 0, s = 0;
    if (::getresuid(&r, &e, &s) != 0 || r != *uid || e != *uid || s != *uid) return 3;
  }
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return 3;
  // A change of user clears the parent-death signal: set it again, then check the parent.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() == 1) return 3;

  // 3. libdw opens the target's files as that user and unwinds from the copies.
  if (native) add_native(p, unwind_native(pid, std::move(capture)));
  const std::string text = to_json(p).dump(-1, ' ', false, json::error_handler_t::replace);
  for (std::size_t at = 0; at < text.size();) {
    const ssize_t n = ::write(1, text.data() + at, text.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return 1;
    at += std::size_t(n);
  }
  return 0;
}

}  // namespace

void shrink_to_fit(ProcessStacks& p, std::size_t max_bytes) {
  auto size = [&] { return to_json(p).dump(-1, ' ', false, json::error_handler_t::replace).size(); };
  if (size() <= max_bytes) return;
  bool had_native = false;
  for (auto& t : p.threads) {
    had_native = had_native || !t.native.empty();
    t.native.clear();
  }
  if (had_native) {
    p.errors.push_back("native frames left out: this process's stacks exceed the " + std::to_string(max_bytes >> 10) +
                       " KiB a message may carry");
    if (size() <= max_bytes) return;
  }
  std::erase_if(p.threads, [](const ThreadStack& t) { return !t.main; });
  p.errors.push_back("threads other than the main one left out: the stacks still exceed the message size");
  if (p.errors.size() > 16) p.errors.resize(16);
  while (size() > max_bytes && !p.threads.empty() && p.threads.front().python.size() > 1) {
    auto& f = p.threads.front().python;
    f.resize(f.size() / 2);
    p.threads.front().truncated = true;
  }
  if (size() > max_bytes) p.threads.clear();
}

std::optional<ProcessStacks> process_from_json(const json& j, std::string& error) {
  try {
    ProcessStacks p;
    p.pid = pid_t(integer(j, "pid", 0, 1 << 22));  // 0: a rank that never started
    p.python = str(j, "python");
    p.python_ok = boolean(j, "python_ok");
    for (const auto& t : array(j, "threads", kMaxThreads)) {
      ThreadStack x;
      x.tid = int(integer(t, "tid", 1, 1 << 22));
      x.name = str(t, "name");
      x.main = boolean(t, "main");
      x.python = frames(t, "python", Frame::Kind::python);
      x.native = frames(t, "native", Frame::Kind::native);
      x.truncated = boolean(t, "truncated");
      x.native_stop_ms = number(t, "native_stop_ms");
      p.threads.push_back(std::move(x));
    }
    for (const auto& e : array(j, "errors", kMaxErrors)) {
      if (!e.is_string() || e.get_ref<const std::string&>().size() > kMaxString)
        throw Bad{"'errors' holds a non-string"};
      p.errors.push_back(e.get<std::string>());
    }
    const auto& t = field(j, "timing");
    p.timing.read_ms = number(t, "read_ms");
    p.timing.native_stop_max_ms = number(t, "native_stop_max_ms");
    p.timing.native_stop_total_ms = number(t, "native_stop_total_ms");
    p.timing.memory_reads = int(integer(t, "memory_reads", 0, 1 << 30));
    return p;
  } catch (const Bad& b) {
    error = b.what;
    return std::nullopt;
  }
}

std::optional<ProcessStacks> process_from_text(const std::string& text, std::string& error) {
  if (text.empty()) {
    error = "it wrote nothing";
    return std::nullopt;
  }
  auto read = parse_json(text, kMaxNesting);
  if (read.too_deep) {
    error = "its JSON nests deeper than " + std::to_string(kMaxNesting);
    return std::nullopt;
  }
  if (!read.ok()) {
    error = "it is not JSON (" + read.error + ")";
    return std::nullopt;
  }
  return process_from_json(read.value, error);
}

bool same_process(const Target& t) {
  return !t.start_time || process_start_time(t.pid) == t.start_time;
}

std::vector<ProcessStacks> collect(const std::vector<Target>& targets, const CollectOptions& options) {
  std::vector<ProcessStacks> out;
  if (options.native) {
    out = collect_native(targets, options);
  } else {
    // Python only: in-process, a few ms each; the budget is checked between processes and by the
    // walk once per frame (a process that makes its reads slow does not hold the rest up).
    const auto deadline = Clock::now() + options.budget;
    for (const Target& t : targets) {
      if (Clock::now() >= deadline) {
        out.push_back(
            not_read(t.pid, "not read within the time budget of " + std::to_string(options.budget.count()) + " ms"));
      } else if (!same_process(t)) {
        out.push_back(ended(t.pid));
      } else {
        out.push_back(read_process(t.pid, {.python = true, .native = false, .deadline = deadline}));
      }
    }
  }
  // A pid that changed hands during its read was read as someone else's process: nothing kept.
  for (std::size_t i = 0; i < targets.size() && i < out.size(); ++i) {
    if (!same_process(targets[i])) out[i] = ended(targets[i].pid);
  }
  return out;
}

std::optional<int> run_reader_if_asked(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], kReaderArg) != 0) return std::nullopt;
  return reader_main(std::vector<std::string>(argv + 2, argv + argc));
}

}  // namespace ddp::stacks

#include "supervisor/process.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <unordered_map>
#include <utility>

#include "common/strings.hpp"

namespace ddp::supervisor {
namespace {

bool is_executable_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
}

struct Pipe {
  int r = -1, w = -1;
  Pipe() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw SpawnError(fmt::format("pipe: {}", std::strerror(errno)));
    r = fds[0];
    w = fds[1];
  }
  void close_r() {
    if (r >= 0) ::close(r), r = -1;
  }
  void close_w() {
    if (w >= 0) ::close(w), w = -1;
  }
  ~Pipe() {
    close_r();
    close_w();
  }
};

// Async-signal-safe write of the whole buffer.
void write_all(int fd, const void* buf, size_t n) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// What the child needs, all of it built before the clone: it shares our memory and may not allocate.
struct ChildArgs {
  pid_t parent;
  bool own_process_group;
  bool die_with_parent;
  int parent_death_signal;
  int cgroup_procs_fd;
  const cpu_set_t* cpu_mask;      // null: inherit
  const unsigned long* mem_mask;  // null: inherit
  unsigned long mem_mask_bits;
  const RunAs* run_as;  // null: our own user
  int stdin_src;
  int out_w, err_w;  // -1: inherit
  int status_w;
  const char* workdir;
  const char* path;
  char* const* argv;
  char* const* envp;
};

// The child, between clone and exec. It runs on a stack of its own in our memory while the
// thread that cloned it waits (CLONE_VFORK), so it only makes system calls: no allocation, no
// lock, nothing a handler of ours could see half done. Credentials change through raw system
// calls: glibc's setuid() believes this process multi-threaded and would walk our thread list
// under its lock (which another of our threads may hold) to have each of them follow.
// The exec-failure report: [stage byte][errno int], then exit.
[[noreturn]] void child_fail(int status_w, char stage) {
  int e = errno;
  char buf[1 + sizeof(int)];
  buf[0] = stage;
  std::memcpy(buf + 1, &e, sizeof e);
  write_all(status_w, buf, sizeof buf);
  ::_exit(127);
}

// Every descriptor above stderr closes at exec, whatever opened it without O_CLOEXEC (Asio's
// sockets: the agent's listener, the store's, accepted links): a worker must inherit none of
// root's. close_range's CLOEXEC flag (Linux 5.11) does it in one call. Where it is refused
// (EINVAL on 5.9 and 5.10; ENOSYS before, or EPERM from a seccomp filter older than the call)
// each descriptor /proc/self/fd lists is marked; without /proc, every number below the
// descriptor limit. Marked, not closed: the exec-failure pipe must stay open until the exec.
// Only system calls, on this stack: the child's rules above.
void close_inherited_on_exec() {
  if (::syscall(SYS_close_range, 3u, ~0u, CLOSE_RANGE_CLOEXEC) == 0) return;
  const int dir =
      static_cast<int>(::syscall(SYS_openat, AT_FDCWD, "/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir >= 0) {
    alignas(struct dirent64) char buf[1024];
    bool listed = true;
    for (;;) {
      const long n = ::syscall(SYS_getdents64, dir, buf, sizeof buf);
      if (n <= 0) {
        listed = n == 0;
        break;
      }
      for (long at = 0; at < n;) {
        const auto* d = reinterpret_cast<const struct dirent64*>(buf + at);
        at += d->d_reclen;
        long fd = 0;
        const char* c = d->d_name;
        for (; *c >= '0' && *c <= '9' && fd < (1L << 31); ++c) fd = fd * 10 + (*c - '0');
        if (c == d->d_name || *c != '\0' || fd <= 2 || fd == dir || fd >= (1L << 31)) continue;  // ".", ".."
        (void)::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
      }
    }
    (void)::syscall(SYS_close, dir);
    if (listed) return;
  }
  struct rlimit rl {};
  const long top = ::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (1u << 30) ? long(rl.rlim_cur) : 1L << 20;
  for (long fd = 3; fd < top; ++fd) (void)::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
}

[[noreturn]] void child_exec(const ChildArgs& a) {
  const auto fail = [&](char stage) { child_fail(a.status_w, stage); };
  if (a.own_process_group) ::setpgid(0, 0);
  if (a.die_with_parent) {
    ::prctl(PR_SET_PDEATHSIG, a.parent_death_signal);
    if (::getppid() != a.parent) ::_exit(127);  // the launcher died before the line above
  }
  for (int s = 1; s < NSIG; ++s) ::signal(s, SIG_DFL);  // handlers first, then unblock
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  if (a.cgroup_procs_fd >= 0 && ::write(a.cgroup_procs_fd, "0", 1) != 1) fail('c');
  // Placement after joining the cgroup (whose cpuset bounds it); errors leave the worker unbound.
  if (a.cpu_mask) (void)::sched_setaffinity(0, sizeof *a.cpu_mask, a.cpu_mask);
  if (a.mem_mask) {
    constexpr long kMpolPreferred = 1;  // <linux/mempolicy.h>; raw syscall, no libnuma
    (void)::syscall(SYS_set_mempolicy, kMpolPreferred, a.mem_mask, a.mem_mask_bits);
  }
  // After the cgroup move (its cgroup.procs is root's) and before chdir and exec, which must
  // succeed with the user's rights alone. Groups first: setgid/setuid drop the right to.
  if (a.run_as) {
    const auto& u = *a.run_as;
    if (::syscall(SYS_setgroups, u.groups.size(), u.groups.data()) != 0 || ::syscall(SYS_setgid, u.gid) != 0 ||
        ::syscall(SYS_setuid, u.uid) != 0) {
      fail('u');
    }
    // A change of credentials clears the parent-death signal: set it again.
    if (a.die_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, a.parent_death_signal);
      if (::getppid() != a.parent) ::_exit(127);
    }
  }
  if (::dup2(a.stdin_src, 0) < 0) fail('d');
  if (a.out_w >= 0 && (::dup2(a.out_w, 1) < 0 || ::dup2(a.err_w, 2) < 0)) fail('d');
  if (::chdir(a.workdir) != 0) fail('w');
  close_inherited_on_exec();
  ::execve(a.path, a.argv, a.envp);
  child_fail(a.status_w, 'e');
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kShareMemory = false;  // sanitizers keep per-thread state that a clone would share
#else
constexpr bool kShareMemory = true;
#endif

// The child's stack when it shares our memory: what child_exec needs, with room to spare.
constexpr std::size_t kChildStack = 32 * 1024;

[[maybe_unused]] int child_entry(void* arg) {
  child_exec(*static_cast<const ChildArgs*>(arg));
}

// The kernel's struct clone_args as far as its cgroup field (CLONE_ARGS_SIZE_VER2), spelled here:
// <linux/sched.h> redefines <sched.h>'s CLONE_* macros.
struct CloneArgs {
  std::uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid, set_tid_size, cgroup;
};
static_assert(sizeof(CloneArgs) == 88);
constexpr std::uint64_t kCloneIntoCgroup = 0x200000000ULL;

#ifdef DDP_HAVE_CLONE3_TRAMPOLINE
extern "C" long ddp_clone3(CloneArgs* args, std::size_t size, int (*fn)(void*), void* arg);  // clone3_x86_64.S
#else
long ddp_clone3(CloneArgs*, std::size_t, int (*)(void*), void*) {
  return -ENOSYS;
}
#endif
// Cleared when the kernel (or a seccomp filter: container runtimes answer clone3 with ENOSYS so
// that glibc falls back) has no clone3 or no CLONE_INTO_CGROUP: later spawns go straight to clone.
std::atomic<bool> clone_into_cgroup{true};

// A child sharing our memory on `stack`, started inside the cgroup `cgroup_dir_fd`: its pid, or
// -1 when the kernel would not (the caller then clones it the old way, and the child migrates).
[[maybe_unused]] pid_t clone_into(int cgroup_dir_fd, std::span<char> stack, const ChildArgs& args) {
  if (cgroup_dir_fd < 0 || !clone_into_cgroup.load(std::memory_order_relaxed)) return -1;
  ChildArgs inside = args;
  inside.cgroup_procs_fd = -1;  // it is there already
  CloneArgs ca{};
  ca.flags = CLONE_VM | CLONE_VFORK | kCloneIntoCgroup;
  ca.exit_signal = SIGCHLD;
  ca.stack = reinterpret_cast<std::uintptr_t>(stack.data());
  ca.stack_size = stack.size();
  ca.cgroup = static_cast<std::uint64_t>(cgroup_dir_fd);
  // `inside` lives on this stack, which waits unused until the child has exec'd (CLONE_VFORK).
  const long r = ddp_clone3(&ca, sizeof ca, child_entry, &inside);
  if (r > 0) return static_cast<pid_t>(r);
  // ENOSYS: no clone3 (or a seccomp filter's answer, EPERM in older container profiles); E2BIG,
  // EINVAL: no CLONE_INTO_CGROUP (5.3-5.6). A cgroup that refuses the child says so otherwise
  // (EBADF, ENOENT, EACCES, EBUSY, EOPNOTSUPP, EAGAIN, ENOSPC): that, ENOMEM and the like are for
  // the old way to meet and report, and the next spawn tries again.
  if (r == -ENOSYS || r == -EPERM || r == -E2BIG || r == -EINVAL) {
    clone_into_cgroup.store(false, std::memory_order_relaxed);
  }
  return -1;
}

}  // namespace

std::optional<std::string> resolve_executable(const std::string& argv0, const std::string& path_var,
                                              const std::string& workdir) {
  if (argv0.empty()) return std::nullopt;
  if (argv0.find('/') != std::string::npos) {
    std::string p = argv0[0] == '/' ? argv0 : workdir + "/" + argv0;
    return is_executable_file(p) ? std::optional(p) : std::nullopt;
  }
  const std::string search = path_var.empty() ? "/usr/local/bin:/usr/bin:/bin" : path_var;
  for (auto dir : split(search, ':')) {
    std::string d = dir.empty() ? std::string(".") : std::string(dir);
    if (d[0] != '/') d = workdir + "/" + d;
    std::string p = d + "/" + argv0;
    if (is_executable_file(p)) return p;
  }
  return std::nullopt;
}

std::string explain_not_runnable(const std::string& argv0, const std::string& path_var, const std::string& workdir,
                                 const std::function<std::string(const std::vector<std::string>&)>& write) {
  const auto spell = [&](const std::vector<std::string>& argv) {
    return write ? write(argv) : fmt::format("command: [{}]", join(argv, ", "));
  };
  // The interpreter a script's name suggests; its first line is never read (root may be asking).
  const auto interpreter = [](const std::string& name) -> std::string {
    if (name.ends_with(".py")) return "python3";
    if (name.ends_with(".sh") || name.ends_with(".bash")) return "bash";
    return {};
  };
  const auto run_with = [&](const std::string& shown) {
    const auto interp = interpreter(shown);
    if (interp.empty()) return fmt::format("make it executable (chmod +x {})", shown);
    return fmt::format("run it with its interpreter: {} (or chmod +x it)", spell({interp, shown}));
  };
  if (argv0.empty()) return "the command's program (its first word) is empty";
  struct stat st {};
  if (argv0.find('/') != std::string::npos) {
    const std::string p = argv0[0] == '/' ? argv0 : workdir + "/" + argv0;
    const auto where = argv0[0] == '/' ? std::string() : fmt::format(" (in workdir {})", workdir);
    if (::stat(p.c_str(), &st) != 0) return fmt::format("{} does not exist{}", argv0, where);
    if (S_ISDIR(st.st_mode)) return fmt::format("{} is a directory{}, not a program", argv0, where);
    return fmt::format("{} is not executable{}; {}", argv0, where, run_with(argv0));
  }
  const std::string search = path_var.empty() ? "/usr/local/bin:/usr/bin:/bin" : path_var;
  std::vector<std::string> dirs;
  for (auto dir : split(search, ':')) dirs.emplace_back(dir.empty() ? "." : dir);
  for (const auto& d : dirs) {
    const std::string p = (d[0] == '/' ? d : workdir + "/" + d) + "/" + argv0;
    if (::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      return fmt::format("{} is not executable (found on PATH, in {}); {}", argv0, d, run_with(p));
    }
  }
  const std::string local = workdir + "/" + argv0;
  if (::stat(local.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    const auto interp = interpreter(argv0);
    const bool exec = ::access(local.c_str(), X_OK) == 0;
    return fmt::format("{} is not a program on PATH; it is a file in workdir {}: {}", argv0, workdir,
                       !interp.empty() ? fmt::format("run it with its interpreter: {}", spell({interp, argv0}))
                       : exec          ? fmt::format("write it with its folder: {}", spell({"./" + argv0}))
                                       : run_with("./" + argv0));
  }
  return fmt::format("'{}' is not found on PATH ({}); give its full path, or check the spelling", argv0,
                     join_first(dirs, ", ", 3));
}

PendingSpawn spawn_start(const SpawnSpec& spec) {
  if (spec.argv.empty()) throw SpawnError("empty command");
  auto path_it = spec.env.find("PATH");
  auto exe = resolve_executable(spec.argv[0], path_it == spec.env.end() ? "" : path_it->second, spec.workdir);
  if (!exe) {
    throw SpawnError(fmt::format(
        "cannot run {}: {}", spec.argv[0],
        explain_not_runnable(spec.argv[0], path_it == spec.env.end() ? "" : path_it->second, spec.workdir)));
  }

  // Everything the child touches is built here, before the clone.
  std::vector<std::string> env_strings;
  env_strings.reserve(spec.env.size());
  for (const auto& [k, v] : spec.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, argv;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = spec.argv;
  for (auto& s : argv_copy) argv.push_back(s.data());
  argv.push_back(nullptr);

  std::optional<Pipe> out, err, in;
  if (spec.stdin_pipe) in.emplace();
  if (spec.capture_output) {
    out.emplace();
    err.emplace();
  }
  Pipe status;  // exec-failure report: [stage byte][errno int]
  // Opened last: nothing after it can throw before the clone, so it cannot leak.
  int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull < 0) throw SpawnError(fmt::format("/dev/null: {}", std::strerror(errno)));
  // The CPU mask and memory node mask, built here: the child may not allocate.
  std::optional<cpu_set_t> cpu_mask;
  if (!spec.cpus.empty()) {
    cpu_mask.emplace();
    CPU_ZERO(&*cpu_mask);
    for (int c : spec.cpus) {
      if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &*cpu_mask);
    }
  }
  constexpr int kMaxMemNode = 1024;  // the kernel's MAX_NUMNODES on common configurations
  std::array<unsigned long, kMaxMemNode / (8 * sizeof(unsigned long))> mem_mask{};
  const bool set_mem = spec.mem_node && *spec.mem_node >= 0 && *spec.mem_node < kMaxMemNode;
  if (set_mem) {
    const auto bits = 8 * sizeof(unsigned long);
    mem_mask[static_cast<std::size_t>(*spec.mem_node) / bits] |= 1ul
                                                                 << (static_cast<std::size_t>(*spec.mem_node) % bits);
  }
  const ChildArgs args{
      .parent = ::getpid(),
      .own_process_group = spec.own_process_group,
      .die_with_parent = spec.die_with_parent,
      .parent_death_signal = spec.parent_death_signal,
      .cgroup_procs_fd = spec.cgroup_procs_fd,
      .cpu_mask = cpu_mask ? &*cpu_mask : nullptr,
      .mem_mask = set_mem ? mem_mask.data() : nullptr,
      .mem_mask_bits = static_cast<unsigned long>(kMaxMemNode),
      .run_as = spec.run_as ? &*spec.run_as : nullptr,
      .stdin_src = in                   ? in->r
                   : spec.stdin_fd >= 0 ? spec.stdin_fd
                                        : devnull,
      .out_w = out ? out->w : -1,
      .err_w = err ? err->w : -1,
      .status_w = status.w,
      .workdir = spec.workdir.c_str(),
      .path = exe->c_str(),
      .argv = argv.data(),
      .envp = envp.data(),
  };

  // Block every signal across the clone: until the child has reset the handlers it inherited
  // (Asio's, which write to a self-pipe shared with us), a signal it receives must not be
  // taken for one sent to ddpctl.
  //
  // The child shares our memory and this thread waits until it has exec'd (CLONE_VFORK, as
  // posix_spawn does): a fork would copy the page tables of this whole process for a child that
  // drops them at once, then take a copy-on-write fault for each page either side touches, and
  // exec would tear the copy down again (on a paravirtualised VM, where a fault costs about
  // 15 us, half of a local launch's time; bench/launch). The ranks' execs still overlap: this
  // thread resumes when the kernel has the new program, before its loader runs.
  sigset_t all, saved;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &saved);
  pid_t pid;
  if constexpr (kShareMemory) {
    alignas(16) std::array<char, kChildStack> stack;  // ours is idle until the child has exec'd
    pid = clone_into(spec.cgroup_dir_fd, stack, args);
    if (pid < 0) {
      pid = ::clone(child_entry, stack.data() + stack.size(), CLONE_VM | CLONE_VFORK | SIGCHLD,
                    const_cast<ChildArgs*>(&args));
    }
  } else {
    pid = ::fork();
    if (pid == 0) child_exec(args);
  }
  ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  if (pid < 0) {
    int e = errno;
    ::close(devnull);
    throw SpawnError(fmt::format("fork: {}", std::strerror(e)));
  }

  ::close(devnull);
  status.close_w();
  if (in) in->close_r();
  if (out) {
    out->close_w();
    err->close_w();
  }
  PendingSpawn p;
  p.spawned.pid = pid;
  if (in) p.spawned.stdin_fd = std::exchange(in->w, -1);
  if (out) {
    p.spawned.stdout_fd = std::exchange(out->r, -1);
    p.spawned.stderr_fd = std::exchange(err->r, -1);
  }
  p.status_fd = std::exchange(status.r, -1);
  p.program = spec.argv[0];
  p.exe = *exe;
  p.workdir = spec.workdir;
  if (spec.run_as) p.user = fmt::format("uid {} gid {}", spec.run_as->uid, spec.run_as->gid);
  return p;
}

PendingSpawn::PendingSpawn(PendingSpawn&& o) noexcept
    : spawned(std::exchange(o.spawned, Spawned{})),
      status_fd(std::exchange(o.status_fd, -1)),
      program(std::move(o.program)),
      exe(std::move(o.exe)),
      workdir(std::move(o.workdir)),
      user(std::move(o.user)) {}

PendingSpawn::~PendingSpawn() {
  for (int fd : {status_fd, spawned.stdout_fd, spawned.stderr_fd, spawned.stdin_fd}) {
    if (fd >= 0) ::close(fd);
  }
}

Spawned spawn_finish(PendingSpawn& p) {
  char buf[1 + sizeof(int)];
  ssize_t n;
  do {
    n = ::read(p.status_fd, buf, sizeof buf);
  } while (n < 0 && errno == EINTR);
  ::close(std::exchange(p.status_fd, -1));
  if (n == static_cast<ssize_t>(sizeof buf)) {
    int e;
    std::memcpy(&e, buf + 1, sizeof e);
    // The child exits 127 at once; the caller's reaper collects it. Its pipes close with `p`.
    const char* what = buf[0] == 'w'   ? "cannot enter the working directory"
                       : buf[0] == 'c' ? "cannot join the job's cgroup"
                       : buf[0] == 'd' ? "cannot set up stdio"
                       : buf[0] == 'u' ? "cannot switch to the job's user"
                                       : "exec failed";
    // The cgroup's and stdio's failures have no path of their own to name.
    const std::string where = buf[0] == 'w'   ? " (" + p.workdir + ")"
                              : buf[0] == 'u' ? " (" + p.user + ")"
                              : buf[0] == 'e' ? " (" + p.exe + ")"
                                              : "";
    throw SpawnError(fmt::format("cannot run '{}': {}{}: {}", p.program, what, where, std::strerror(e)));
  }
  return std::exchange(p.spawned, Spawned{});  // the caller owns the fds now
}

bool accessible_as(const RunAs& user, const std::string& path, int mode) {
  const char* p = path.c_str();
  const pid_t pid = ::fork();
  if (pid < 0) return false;
  if (pid == 0) {
    if (::setgroups(user.groups.size(), user.groups.data()) != 0 || ::setgid(user.gid) != 0 ||
        ::setuid(user.uid) != 0) {
      ::_exit(2);
    }
    ::_exit(::access(p, mode) == 0 ? 0 : 1);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

Spawned spawn(const SpawnSpec& spec) {
  auto pending = spawn_start(spec);
  return spawn_finish(pending);
}

std::vector<pid_t> descendants_of(pid_t root) {
  std::unordered_multimap<pid_t, pid_t> children;
  DIR* d = ::opendir("/proc");
  if (!d) return {};
  // Every process of the machine, each time (a launch's end, each store client's rank): one
  // openat and one read each, into a buffer on the stack, nothing allocated per process.
  const int proc = ::dirfd(d);
  while (auto* e = ::readdir(d)) {
    auto pid = parse_int(e->d_name);
    if (!pid) continue;
    char path[32];
    std::snprintf(path, sizeof path, "%s/stat", e->d_name);
    const int fd = ::openat(proc, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    char buf[1024];  // "pid (comm) state ppid ...": comm is at most 64 bytes
    const ssize_t n = ::read(fd, buf, sizeof buf);
    ::close(fd);
    if (n <= 0) continue;
    const std::string_view line(buf, static_cast<std::size_t>(n));
    // comm may hold spaces and parentheses; parse from the last ')'.
    auto close = line.rfind(')');
    if (close == std::string_view::npos || close + 4 > line.size()) continue;
    const auto rest = line.substr(close + 2);  // "state ppid ..."
    const auto sp = rest.find(' ');
    if (sp == std::string_view::npos) continue;
    const auto field = rest.substr(sp + 1, rest.find(' ', sp + 1) - (sp + 1));
    if (auto ppid = parse_int(field)) children.emplace(static_cast<pid_t>(*ppid), static_cast<pid_t>(*pid));
  }
  ::closedir(d);
  std::vector<pid_t> out, frontier{root};
  while (!frontier.empty()) {
    pid_t p = frontier.back();
    frontier.pop_back();
    auto [b, e] = children.equal_range(p);
    for (auto it = b; it != e; ++it) {
      out.push_back(it->second);
      frontier.push_back(it->second);
    }
  }
  return out;
}

std::optional<std::vector<pid_t>> children_of(pid_t pid) {
  char path[48];
  std::snprintf(path, sizeof path, "/proc/%d/task", static_cast<int>(pid));
  DIR* d = ::opendir(path);
  if (!d) {
    if (errno == ENOENT || errno == ESRCH) return std::vector<pid_t>{};  // gone
    return std::nullopt;  // not allowed to look, or out of descriptors: cannot say
  }
  const int task = ::dirfd(d);
  std::vector<pid_t> out;
  bool offered = false;
  while (auto* e = ::readdir(d)) {
    if (!parse_int(e->d_name)) continue;
    char name[48];
    std::snprintf(name, sizeof name, "%s/children", e->d_name);
    const int fd = ::openat(task, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const bool absent = errno == ENOENT || errno == ESRCH;
      if (!absent || (!offered && ::faccessat(task, e->d_name, F_OK, 0) == 0)) {
        // Not allowed to read it (a security policy, hidepid), or the thread is there and its
        // children file is not (a kernel without one): cannot say.
        ::closedir(d);
        return std::nullopt;
      }
      continue;  // the thread ended meanwhile
    }
    offered = true;
    std::string text;
    char buf[4096];
    bool failed = false;
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno != ESRCH) failed = true;  // ESRCH: the thread ended while read
      if (n <= 0) break;
      text.append(buf, static_cast<std::size_t>(n));
    }
    ::close(fd);
    if (failed) {
      ::closedir(d);
      return std::nullopt;
    }
    for (auto word : split(text, ' ')) {  // "pid pid ... " (a newline at the end on some kernels)
      if (auto child = parse_int(trim(word))) out.push_back(static_cast<pid_t>(*child));
    }
  }
  ::closedir(d);
  return out;
}

void become_subreaper() {
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
}

std::string signal_name(int sig) {
  if (const char* abbrev = ::sigabbrev_np(sig)) return fmt::format("SIG{}", abbrev);
  return fmt::format("signal {}", sig);
}

}  // namespace ddp::supervisor

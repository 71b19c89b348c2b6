#include "supervisor/guardian.hpp"

#include "common/log.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>  // RENAME_NOREPLACE
#include <cstring>
#include <utility>
#include <vector>

namespace ddp::supervisor {
namespace {

// One record on the socket: a kind ('+' watch, '-' forget, 's' stand down, 'd' done) and a
// process group id, in eight bytes. A read may end inside one: the guardian keeps the rest for
// the next.
constexpr std::size_t kRecord = 8;

// Every process the cgroup lists, SIGKILLed, until it lists none (a kernel without cgroup.kill);
// a fork racing the kills is caught by the next round. Bounded: a second at most.
void kill_listed(int cgroup_fd) {
  static char buf[1 << 16];  // the guardian's own copy; no allocation after fork
  for (int round = 0; round < 50; ++round) {
    const int fd = ::openat(cgroup_fd, "cgroup.procs", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    bool any = false;
    ssize_t n;
    std::size_t have = 0;
    while ((n = ::read(fd, buf + have, sizeof buf - have)) > 0 || (n < 0 && errno == EINTR)) {
      if (n < 0) continue;
      have += static_cast<std::size_t>(n);
      std::size_t start = 0;
      for (std::size_t i = 0; i < have; ++i) {
        if (buf[i] != '\n') continue;
        pid_t p = 0;
        for (std::size_t j = start; j < i && buf[j] >= '0' && buf[j] <= '9'; ++j) p = p * 10 + (buf[j] - '0');
        if (p > 0) ::kill(p, SIGKILL), any = true;
        start = i + 1;
      }
      std::memmove(buf, buf + start, have - start);
      have -= start;
      if (have == sizeof buf) have = 0;  // no line is that long; never stall on one
    }
    ::close(fd);
    if (!any) return;
    const timespec pause{0, 20'000'000};
    ::nanosleep(&pause, nullptr);
  }
}

bool write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w, n -= static_cast<std::size_t>(w);
  }
  return true;
}

// The launcher's last word, in `dir_fd`: async-signal-safe, no allocation (the strings are the
// guardian's copies of the launcher's, made by the fork).
void leave(int dir_fd, const LastWord& w) {
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  char digits[24];
  std::size_t n = 0;
  for (auto ms = static_cast<std::uint64_t>(now.tv_sec) * 1000 + static_cast<std::uint64_t>(now.tv_nsec) / 1'000'000;
       n == 0 || ms > 0; ms /= 10)
    digits[sizeof digits - 1 - n++] = static_cast<char>('0' + ms % 10);
  // A temporary name of its own, <name>.guardian-<pid>.tmp: the launcher's writer uses
  // <name>.tmp, and two guardians of one job (a restart's, the one before it standing down) may
  // write at once. Made new (whatever was at that name, a link included, removed first).
  char pid_digits[16];
  std::size_t pn = 0;
  for (auto p = static_cast<unsigned>(::getpid()); pn == 0 || p > 0; p /= 10)
    pid_digits[sizeof pid_digits - 1 - pn++] = static_cast<char>('0' + p % 10);
  constexpr char kMid[] = ".guardian-", kEnd[] = ".tmp";
  char tmp[256];
  if (w.name.empty() || w.name.size() + (sizeof kMid - 1) + pn + sizeof kEnd > sizeof tmp) return;
  char* t = tmp;
  std::memcpy(t, w.name.data(), w.name.size()), t += w.name.size();
  std::memcpy(t, kMid, sizeof kMid - 1), t += sizeof kMid - 1;
  std::memcpy(t, pid_digits + sizeof pid_digits - pn, pn), t += pn;
  std::memcpy(t, kEnd, sizeof kEnd);
  ::unlinkat(dir_fd, tmp, 0);
  const int fd = ::openat(dir_fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
  if (fd < 0) return;
  const bool written = write_all(fd, w.before_time.data(), w.before_time.size()) &&
                       write_all(fd, digits + sizeof digits - n, n) &&
                       write_all(fd, w.after_time.data(), w.after_time.size());
  const bool closed = ::close(fd) == 0;
  // Never over a record that is there: the launcher's own, or a later run's of the same job id
  // (a relaunch while this one was still killing); it was removed when this run began.
  if (!written || !closed || ::syscall(SYS_renameat2, dir_fd, tmp, dir_fd, w.name.c_str(), RENAME_NOREPLACE) != 0)
    ::unlinkat(dir_fd, tmp, 0);
}

// The guardian itself: async-signal-safe calls only (it is a fork of a launcher that may have
// threads), into memory allocated before the fork.
[[noreturn]] void guard(int in, int cgroup_fd, pid_t* groups, std::size_t cap, int word_fd, const LastWord* word) {
  std::size_t count = 0;
  unsigned char buf[kRecord * 64];
  std::size_t have = 0;
  for (;;) {
    const ssize_t n = ::read(in, buf + have, sizeof buf - have);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    have += static_cast<std::size_t>(n);
    std::size_t off = 0;
    for (; have - off >= kRecord; off += kRecord) {
      const char kind = static_cast<char>(buf[off]);
      std::int32_t value = 0;
      std::memcpy(&value, buf + off + 4, sizeof value);
      if (kind == 'd') ::_exit(0);
      if (kind == 's') {  // nothing of the attempt runs: from now on, only the last word
        if (cgroup_fd >= 0) ::close(cgroup_fd);
        cgroup_fd = -1;
        count = 0;
      }
      if (kind == '+' && value > 0 && count < cap) groups[count++] = value;
      if (kind == '-') {
        for (std::size_t i = 0; i < count; ++i) {
          if (groups[i] != value) continue;
          groups[i] = groups[--count];
          break;
        }
      }
    }
    std::memmove(buf, buf + off, have - off);
    have -= off;
  }
  // The launcher is gone and never said the attempt ended.
  if (cgroup_fd >= 0) {
    const int k = ::openat(cgroup_fd, "cgroup.kill", O_WRONLY | O_CLOEXEC);
    const bool killed = k >= 0 && ::write(k, "1", 1) == 1;
    if (k >= 0) ::close(k);
    if (!killed) kill_listed(cgroup_fd);
  }
  for (std::size_t i = 0; i < count; ++i) ::kill(-groups[i], SIGKILL);
  if (word_fd >= 0 && word) leave(word_fd, *word);
  ::_exit(0);
}

void close_from(int first) {
  if (::syscall(SYS_close_range, static_cast<unsigned>(first), ~0u, 0u) == 0) return;
  rlimit rl{};
  const rlim_t top =
      ::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < 65536 ? rl.rlim_cur : 65536;
  for (int fd = first; fd < static_cast<int>(top); ++fd) ::close(fd);
}

}  // namespace

std::optional<Guardian> Guardian::start(int cgroup_dir_fd, std::size_t max_groups,
                                        const std::optional<LastWord>& last_word) {
  std::vector<pid_t> groups(max_groups == 0 ? 1 : max_groups);  // the guardian's, sized before the fork
  int word_dir = -1;  // opened now, not after the launcher is gone: the same folder, whatever moves
  if (last_word) {
    word_dir = ::open(last_word->dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (word_dir < 0)
      log::get("supervisor")->debug("the guardian leaves no end record: {}: {}", last_word->dir, std::strerror(errno));
  }
  // A socket pair rather than a pipe: a write to a guardian that was killed must not kill its
  // launcher with SIGPIPE (send's MSG_NOSIGNAL; a shepherd keeps SIGPIPE's default).
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    log::get("supervisor")->warn("no guardian for this attempt: socketpair: {}", std::strerror(errno));
    if (word_dir >= 0) ::close(word_dir);
    return std::nullopt;
  }
  ::shutdown(fds[0], SHUT_WR);  // the guardian only reads
  const int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  // Every signal blocked across the fork (as spawn_start does): until the child has reset them,
  // the launcher's handlers are its too, and a Ctrl-C landing then would be written into the
  // launcher's own signal pipe twice (a second Ctrl-C: kill at once).
  sigset_t all, before;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &before);
  const pid_t pid = ::fork();
  if (pid != 0) ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
  if (pid < 0) {
    const int err = errno;
    ::close(fds[0]), ::close(fds[1]);
    if (devnull >= 0) ::close(devnull);
    if (word_dir >= 0) ::close(word_dir);
    log::get("supervisor")->warn("no guardian for this attempt: fork: {}", std::strerror(err));
    return std::nullopt;
  }
  if (pid == 0) {
    ::setsid();  // out of the launcher's process group and terminal: a Ctrl-C is the launcher's
    // The stops a launcher takes (and passes on) are not the guardian's: it ends when told, or
    // when the launcher is gone.
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGUSR1, SIGUSR2}) ::signal(sig, SIG_IGN);
    ::signal(SIGCHLD, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::prctl(PR_SET_NAME, "ddp-guardian", 0, 0, 0);
    // Its socket, cgroup and record folder far from 0..4 first, then in place; nothing else of
    // the launcher's stays open (a listening socket, another attempt's socket, the workers' pipes).
    const int in = ::fcntl(fds[0], F_DUPFD, 64);
    if (in < 0) ::_exit(1);  // never read the launcher's stdin for its socket
    const int cg = cgroup_dir_fd >= 0 ? ::fcntl(cgroup_dir_fd, F_DUPFD, 64) : -1;
    const int wd = word_dir >= 0 ? ::fcntl(word_dir, F_DUPFD, 64) : -1;
    ::dup2(in, 0);
    if (devnull >= 0) ::dup2(devnull, 1), ::dup2(devnull, 2);
    if (cg >= 0) ::dup2(cg, 3);
    if (wd >= 0) ::dup2(wd, 4);
    if (cg < 0) ::close(3);
    if (wd < 0) ::close(4);
    close_from(5);
    ::chdir("/");
    guard(0, cg >= 0 ? 3 : -1, groups.data(), groups.size(), wd >= 0 ? 4 : -1, last_word ? &*last_word : nullptr);
  }
  ::close(fds[0]);
  if (devnull >= 0) ::close(devnull);
  if (word_dir >= 0) ::close(word_dir);
  return Guardian(pid, fds[1]);
}

Guardian::Guardian(Guardian&& o) noexcept : pid_(std::exchange(o.pid_, -1)), fd_(std::exchange(o.fd_, -1)) {}

Guardian::~Guardian() {
  if (fd_ >= 0) ::close(fd_);
}

void Guardian::send(char kind, pid_t value) {
  if (fd_ < 0) return;
  unsigned char rec[kRecord] = {};
  rec[0] = static_cast<unsigned char>(kind);
  const std::int32_t v = value;
  std::memcpy(rec + 4, &v, sizeof v);
  // Never blocks (a stopped guardian loses records rather than stalling the launcher), never
  // raises SIGPIPE (a killed one).
  ssize_t n;
  while ((n = ::send(fd_, rec, sizeof rec, MSG_NOSIGNAL | MSG_DONTWAIT)) < 0 && errno == EINTR) {
  }
  // Half a record would shift every later one: the rest goes, waiting if it must (a guardian
  // that reads; one that is gone fails at once).
  for (std::size_t off = n > 0 ? static_cast<std::size_t>(n) : sizeof rec; off < sizeof rec;) {
    n = ::send(fd_, rec + off, sizeof rec - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    off += static_cast<std::size_t>(n);
  }
}

void Guardian::watch_group(pid_t pgid) {
  send('+', pgid);
}
void Guardian::forget_group(pid_t pgid) {
  send('-', pgid);
}

void Guardian::stand_down() {
  send('s', 0);
}

void Guardian::done() {
  send('d', 0);
  ::close(fd_);
  fd_ = -1;
}

}  // namespace ddp::supervisor

#include "supervisor/cgroup.hpp"
#include "supervisor/output.hpp"
#include "supervisor/process.hpp"
#include "supervisor/run_bounded.hpp"

#include <gtest/gtest.h>
#include <algorithm>

#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

using namespace ddp::supervisor;

TEST(LineSplitter, SplitsAcrossChunks) {
  LineSplitter s;
  EXPECT_TRUE(s.feed("hel").empty());
  auto l = s.feed("lo\nwor");
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0], "hello");
  l = s.feed("ld\r\n\n");
  ASSERT_EQ(l.size(), 2u);
  EXPECT_EQ(l[0], "world");
  EXPECT_EQ(l[1], "");
  EXPECT_TRUE(s.finish().empty());
  s.feed("tail");
  EXPECT_EQ(s.finish(), std::vector<std::string>{"tail"});
}

TEST(LineSplitter, CutsHugeLines) {
  LineSplitter s;
  std::string big(kMaxLine * 2 + 10, 'x');
  auto l = s.feed(big);
  ASSERT_EQ(l.size(), 2u);
  EXPECT_EQ(l[0].size(), kMaxLine);
  auto rest = s.finish();
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0].size(), 10u);
}

TEST(LastLines, KeepsTheLastN) {
  LastLines l(3);
  for (int i = 0; i < 10; ++i) l.add(std::to_string(i));
  EXPECT_EQ(l.lines(), (std::vector<std::string>{"7", "8", "9"}));
}

namespace {
struct LogDir {
  std::filesystem::path path;
  LogDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ddp-ranklog-XXXXXX").string();
    path = ::mkdtemp(tmpl.data());
  }
  ~LogDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string read(const std::string& name) const {
    std::ifstream in(path / name);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
};
}  // namespace

TEST(RankLogFile, RotatesOnceIntoAFreshPrivateFile) {
  LogDir d;
  auto dir = std::make_shared<const ddp::safefs::Dir>(ddp::safefs::Dir::open(d.path.string()));
  RankLogFile log(dir, "rank-0.log", 4096);
  ASSERT_EQ(log.error(), "");
  for (int i = 0; i < 50; ++i) log.write(Stream::out, std::string(100, 'a' + i % 26));
  log.flush();
  const auto now = d.read("rank-0.log"), old = d.read("rank-0.log.1");
  EXPECT_NE(now.find("(older output rotated to"), std::string::npos) << now;
  EXPECT_NE(old.find(std::string(100, 'a')), std::string::npos);
  EXPECT_LE(now.size(), 4096u + 200);
  struct stat st {};
  ASSERT_EQ(::stat((d.path / "rank-0.log").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

// logs.max_size bounds what is written for a rank (root's writes pass the user's quota): its file
// and one .1. Output older than that is freed whatever the job did with its file: moved it away,
// linked it, or held it open; the log goes on.
TEST(RankLogFile, OutputOlderThanTheRotatedFileIsFreedWhateverTheJobDidWithIt) {
  constexpr std::uint64_t kMax = 4096;
  for (const std::string how : {"moved", "linked", "held open"}) {
    LogDir d;
    auto dir = std::make_shared<const ddp::safefs::Dir>(ddp::safefs::Dir::open(d.path.string()));
    RankLogFile log(dir, "rank-0.log", kMax);
    std::vector<int> held;  // read-only descriptors on each rotated file, as a job could keep
    std::set<ino_t> seen;
    for (int i = 0; i < 400; ++i) {
      log.write(Stream::out, std::string(500, 'k'));
      log.flush();
      const auto rotated = d.path / "rank-0.log.1";
      struct stat st {};
      if (::stat(rotated.c_str(), &st) != 0 || !seen.insert(st.st_ino).second) continue;  // a new .1
      const auto keep = d.path / ("keep-" + std::to_string(i));
      if (how == "moved") {
        std::filesystem::rename(rotated, keep);
      } else if (how == "linked") {
        ASSERT_EQ(::link(rotated.c_str(), keep.c_str()), 0);
      } else {
        held.push_back(::open(rotated.c_str(), O_RDONLY | O_CLOEXEC));
        ASSERT_GE(held.back(), 0);
      }
    }
    ASSERT_GE(seen.size(), 40u) << how;  // about 50 rotations
    EXPECT_EQ(log.error(), "") << how;
    EXPECT_NE(d.read("rank-0.log").find(std::string(500, 'k')), std::string::npos) << how;
    // Every kept file but the newest .1 is empty: at most the file and one .1 hold output.
    std::uint64_t kept = 0;
    int nonempty = 0;
    for (const auto& e : std::filesystem::directory_iterator(d.path)) {
      if (e.path().filename().string().starts_with("keep-") && std::filesystem::file_size(e.path()) > 0) {
        ++nonempty;
        kept += std::filesystem::file_size(e.path());
      }
    }
    for (int fd : held) {
      struct stat st {};
      ASSERT_EQ(::fstat(fd, &st), 0);
      if (st.st_size > 0) ++nonempty, kept += static_cast<std::uint64_t>(st.st_size);
      ::close(fd);
    }
    EXPECT_LE(nonempty, 1) << how;
    EXPECT_LE(kept, kMax + 1024) << how;
  }
}

TEST(RankLogFile, RotationMovesALinkTheJobSwappedInAndNeverFollowsIt) {
  LogDir d;
  std::ofstream(d.path / "victim") << "secret\n";
  auto dir = std::make_shared<const ddp::safefs::Dir>(ddp::safefs::Dir::open(d.path.string()));
  RankLogFile log(dir, "rank-0.log", 4096);
  log.write(Stream::out, "first");
  log.flush();
  std::filesystem::remove(d.path / "rank-0.log");
  std::filesystem::create_symlink(d.path / "victim", d.path / "rank-0.log");
  for (int i = 0; i < 50; ++i) log.write(Stream::out, std::string(100, 'x'));
  log.flush();
  EXPECT_EQ(d.read("victim"), "secret\n");
  EXPECT_TRUE(std::filesystem::is_symlink(d.path / "rank-0.log.1"));
  EXPECT_FALSE(std::filesystem::is_symlink(d.path / "rank-0.log"));
  EXPECT_NE(d.read("rank-0.log").find(std::string(100, 'x')), std::string::npos);
}

TEST(RankLogFile, ALinkAtTheNameIsNotOpened) {
  LogDir d;
  std::ofstream(d.path / "victim") << "secret\n";
  std::filesystem::create_symlink(d.path / "victim", d.path / "rank-0.log");
  auto dir = std::make_shared<const ddp::safefs::Dir>(ddp::safefs::Dir::open(d.path.string()));
  RankLogFile log(dir, "rank-0.log", 4096);
  EXPECT_NE(log.error().find("symbolic link"), std::string::npos) << log.error();
  log.write(Stream::out, "lost");
  log.note("lost too");
  EXPECT_EQ(d.read("victim"), "secret\n");
  RankLogFile none(nullptr, "/x/rank-0.log", 4096);
  EXPECT_NE(none.error(), "");
}

TEST(Cgroup, MountFromMountinfo) {
  const char* hybrid =
      "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
      "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
      "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate\n";
  EXPECT_EQ(cgroup2_mount_from_mountinfo(hybrid), "/sys/fs/cgroup/unified");
  const char* v2 = "25 20 0:22 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw\n";
  EXPECT_EQ(cgroup2_mount_from_mountinfo(v2), "/sys/fs/cgroup");
  const char* v1 = "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n";
  EXPECT_FALSE(cgroup2_mount_from_mountinfo(v1));
  const char* escaped = "41 31 0:38 / /mnt/my\\040cg rw - cgroup2 cgroup2 rw\n";
  EXPECT_EQ(cgroup2_mount_from_mountinfo(escaped), "/mnt/my cg");
  const char* bind = "41 31 0:38 /sub /mnt/x rw - cgroup2 cgroup2 rw\n";
  EXPECT_FALSE(cgroup2_mount_from_mountinfo(bind));
}

TEST(Cgroup, OwnPath) {
  EXPECT_EQ(own_cgroup2_path("12:cpu:/a\n0::/user.slice/x.scope\n"), "/user.slice/x.scope");
  EXPECT_EQ(own_cgroup2_path("0::/\n"), "/");
  EXPECT_FALSE(own_cgroup2_path("4:memory:/x\n"));
}

TEST(Cgroup, StartTimeFromStat) {
  // comm with spaces and parentheses; field 22 (starttime) is 987654
  const char* line = "1234 (my (odd) prog) S 1 1234 1234 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 987654 1000 200";
  EXPECT_EQ(start_time_from_stat(line), 987654ull);
  EXPECT_FALSE(start_time_from_stat("1234 (x) S 1 2 3"));
  EXPECT_FALSE(start_time_from_stat(""));
  EXPECT_TRUE(
      start_time_from_stat(std::string(1, ' ') + "1 (init) S 0 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0").has_value());
}

TEST(Process, ResolveExecutable) {
  EXPECT_EQ(resolve_executable("sh", "/nonexistent:/bin", "/"), "/bin/sh");
  EXPECT_FALSE(resolve_executable("no-such-program-xyz", "/bin:/usr/bin", "/"));
  EXPECT_EQ(resolve_executable("/bin/sh", "", "/"), "/bin/sh");
  EXPECT_FALSE(resolve_executable("/etc/passwd", "", "/"));  // not executable
}

// Issue 25: `command: [./train.py]` (not executable) and `command: [train.py]` (not on PATH) once
// both said "no such executable (PATH=<300 characters>)".
TEST(Process, ExplainNotRunnable) {
  char tmpl[] = "/tmp/explain-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  { std::ofstream(dir + "/train.py") << "print(1)\n"; }
  { std::ofstream(dir + "/tool") << "#!/bin/sh\n"; }
  ::chmod((dir + "/tool").c_str(), 0755);
  ::mkdir((dir + "/sub").c_str(), 0755);
  EXPECT_EQ(explain_not_runnable("./train.py", "/bin", dir),
            "./train.py is not executable (in workdir " + dir +
                "); run it with its interpreter: command: [python3, ./train.py] (or chmod +x it)");
  EXPECT_EQ(explain_not_runnable("train.py", "/bin", dir),
            "train.py is not a program on PATH; it is a file in workdir " + dir +
                ": run it with its interpreter: command: [python3, train.py]");
  EXPECT_EQ(explain_not_runnable("tool", "/bin", dir), "tool is not a program on PATH; it is a file in workdir " + dir +
                                                           ": write it with its folder: command: [./tool]");
  EXPECT_EQ(explain_not_runnable("./gone.py", "/bin", dir), "./gone.py does not exist (in workdir " + dir + ")");
  EXPECT_EQ(explain_not_runnable("sub", "/bin", "/"),
            "'sub' is not found on PATH (/bin); give its full path, or check the spelling");
  EXPECT_EQ(explain_not_runnable(dir + "/sub", "", "/"), dir + "/sub is a directory, not a program");
  // A long PATH is named by its first folders.
  const auto msg = explain_not_runnable("trian", "/a:/b:/c:/d:/e:/f", "/");
  EXPECT_EQ(msg, "'trian' is not found on PATH (/a, /b, /c, and 3 more); give its full path, or check the spelling");
  // On PATH but not executable: the interpreter, with the path found.
  EXPECT_EQ(explain_not_runnable("train.py", dir, "/"), "train.py is not executable (found on PATH, in " + dir +
                                                            "); run it with its interpreter: command: [python3, " +
                                                            dir + "/train.py] (or chmod +x it)");
  // The caller spells commands its own way.
  EXPECT_EQ(
      explain_not_runnable("./train.py", "", dir, [](const std::vector<std::string>& a) { return "<" + a[0] + ">"; }),
      "./train.py is not executable (in workdir " + dir + "); run it with its interpreter: <python3> (or chmod +x it)");
  std::filesystem::remove_all(dir);
}

TEST(Process, SpawnCapturesAndReportsExecFailure) {
  SpawnSpec s;
  s.argv = {"/bin/sh", "-c", "echo out; echo err >&2; exit 3"};
  s.env = {{"PATH", "/bin:/usr/bin"}};
  s.workdir = "/";
  auto sp = spawn(s);
  char buf[64] = {};
  ssize_t n = ::read(sp.stdout_fd, buf, sizeof buf - 1);
  EXPECT_EQ(std::string(buf, n > 0 ? n : 0), "out\n");
  n = ::read(sp.stderr_fd, buf, sizeof buf - 1);
  EXPECT_EQ(std::string(buf, n > 0 ? n : 0), "err\n");
  int status = 0;
  ASSERT_EQ(::waitpid(sp.pid, &status, 0), sp.pid);
  EXPECT_EQ(WEXITSTATUS(status), 3);
  EXPECT_EQ(::getpgid(0) == sp.pid, false);
  ::close(sp.stdout_fd);
  ::close(sp.stderr_fd);

  s.workdir = "/nonexistent-dir";
  try {
    spawn(s);
    FAIL();
  } catch (const SpawnError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot enter the working directory"), std::string::npos) << e.what();
  }
  int st;
  while (::waitpid(-1, &st, 0) > 0) {
  }
}

TEST(Process, DescendantsSeeGrandchildren) {
  SpawnSpec s;
  s.argv = {"/bin/sh", "-c", "sleep 30 & sleep 30 & wait"};
  s.env = {{"PATH", "/bin:/usr/bin"}};
  s.workdir = "/";
  s.capture_output = false;
  auto sp = spawn(s);
  std::vector<pid_t> d;
  for (int i = 0; i < 200 && d.size() < 3; ++i) {
    ::usleep(10000);
    d = descendants_of(::getpid());
  }
  EXPECT_GE(d.size(), 3u);  // sh and two sleeps
  EXPECT_NE(std::find(d.begin(), d.end(), sp.pid), d.end()) << "the shell itself is among them";
  for (pid_t p : d) ::kill(p, SIGKILL);
  int st;
  while (::waitpid(-1, &st, 0) > 0) {
  }
  EXPECT_TRUE(descendants_of(::getpid()).empty());
}

namespace {
std::string read_all(int fd) {
  std::string out;
  char buf[512];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  return out;
}

// Whether spawn_start can start a child inside a cgroup here (clone3's CLONE_INTO_CGROUP): its
// x86-64 trampoline, a build that shares memory with the child (not under a sanitizer), a
// kernel of 5.7 or later, and no seccomp filter refusing clone3.
std::string why_no_clone_into_cgroup() {
#if !defined(__x86_64__)
  return "clone3 is reached through an x86-64 trampoline only";
#elif defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return "under a sanitizer the child is forked, and moves into its cgroup";
#else
  struct utsname u {};
  int major = 0, minor = 0;
  if (::uname(&u) != 0 || std::sscanf(u.release, "%d.%d", &major, &minor) != 2) return "unknown kernel";
  if (major < 5 || (major == 5 && minor < 7)) return std::string("kernel ") + u.release + " has no CLONE_INTO_CGROUP";
  errno = 0;
  if (::syscall(SYS_clone3, nullptr, 0) == -1 && (errno == ENOSYS || errno == EPERM)) {
    return "clone3 is refused here (a seccomp filter)";
  }
  return {};
#endif
}

// /proc/self/cgroup as a child spawned with `base`'s cgroup settings prints it (/bin/cat).
std::string cgroup_seen_by_child(const SpawnSpec& base) {
  SpawnSpec s = base;
  s.argv = {"/bin/cat", "/proc/self/cgroup"};
  s.env = {{"PATH", "/bin:/usr/bin"}};
  s.workdir = "/";
  auto sp = spawn(s);
  const auto out = read_all(sp.stdout_fd);
  ::close(sp.stdout_fd);
  ::close(sp.stderr_fd);
  int status = 0;
  if (::waitpid(sp.pid, &status, 0) != sp.pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return "(cat failed)";
  return out;
}
}  // namespace

// A worker joins its attempt's cgroup before it execs: by moving itself there (given only
// cgroup.procs), and by moving itself when the kernel refuses the directory it was also given
// (here one that is no cgroup at all).
TEST(Process, AChildMovesIntoItsCgroup) {
  auto cg = Cgroup::create("cg-move");
  if (!cg) GTEST_SKIP() << "no writable cgroup v2 here: workers are found by the subreaper walk instead";
  const auto want = "/" + std::filesystem::path(cg->path()).filename().string() + "\n";
  const int not_a_cgroup = ::open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(not_a_cgroup, 0);
  SpawnSpec s;
  s.cgroup_procs_fd = cg->procs_fd();
  for (int dir : {-1, not_a_cgroup}) {
    s.cgroup_dir_fd = dir;
    const auto seen = cgroup_seen_by_child(s);
    EXPECT_NE(seen.find(want), std::string::npos) << "given directory " << dir << ": " << seen;
  }
  ::close(not_a_cgroup);
  EXPECT_TRUE(cg->empty());
}

// Where the kernel can, it is started inside the cgroup instead (no migration): given the
// directory alone, it is there from its first instruction.
TEST(Process, AChildStartsInsideItsCgroup) {
  if (const auto why = why_no_clone_into_cgroup(); !why.empty()) GTEST_SKIP() << why;
  auto cg = Cgroup::create("cg-start");
  if (!cg) GTEST_SKIP() << "no writable cgroup v2 here: workers are found by the subreaper walk instead";
  const auto want = "/" + std::filesystem::path(cg->path()).filename().string() + "\n";
  SpawnSpec s;
  s.cgroup_dir_fd = cg->dir_fd();  // and no cgroup.procs: only the kernel can have put it there
  const auto seen = cgroup_seen_by_child(s);
  EXPECT_NE(seen.find(want), std::string::npos) << seen;
  EXPECT_TRUE(cg->empty());
}

// A child belongs to the thread that forked it: children_of reads every thread's list.
TEST(Process, ChildrenOfListsEveryThreadsChildren) {
  const auto before = children_of(::getpid());  // another test's children, if any, stay out of it
  if (!before) GTEST_SKIP() << "this kernel offers no /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN)";
  auto new_ones = [&] {
    std::vector<pid_t> out;
    for (pid_t c : children_of(::getpid()).value_or(std::vector<pid_t>{})) {
      if (std::find(before->begin(), before->end(), c) == before->end()) out.push_back(c);
    }
    std::sort(out.begin(), out.end());
    return out;
  };
  const pid_t mine = ::fork();
  if (mine == 0) {
    ::pause();
    ::_exit(0);
  }
  pid_t theirs = -1;
  std::thread t([&] {
    theirs = ::fork();
    if (theirs == 0) {
      ::pause();
      ::_exit(0);
    }
  });
  t.join();
  ASSERT_GT(mine, 0);
  ASSERT_GT(theirs, 0);
  std::vector<pid_t> want{mine, theirs};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(new_ones(), want);
  EXPECT_TRUE(children_of(mine).value_or(std::vector<pid_t>{1}).empty());
  ::kill(mine, SIGKILL);
  ::kill(theirs, SIGKILL);
  int st;
  ::waitpid(mine, &st, 0);
  ::waitpid(theirs, &st, 0);
  EXPECT_TRUE(new_ones().empty());
  EXPECT_TRUE(children_of(mine).value_or(std::vector<pid_t>{1}).empty()) << "a process that is gone has none";
}

TEST(Process, SignalNames) {
  EXPECT_EQ(signal_name(SIGTERM), "SIGTERM");
  EXPECT_EQ(signal_name(SIGKILL), "SIGKILL");
}

// ddp-agentd's per-user tokens: the child has the user's ids and only its groups, and enters
// the working directory with the user's rights.
TEST(Process, RunAsSwitchesUserAndGroups) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to switch users";
  SpawnSpec s;
  s.argv = {"/bin/sh", "-c", "echo $(id -u) $(id -g) $(id -G)"};
  s.env = {{"PATH", "/bin:/usr/bin"}};
  s.workdir = "/";
  s.run_as = RunAs{65534, 65534, {65534, 4242}};
  auto sp = spawn(s);
  const auto out = read_all(sp.stdout_fd);
  int status = 0;
  ::waitpid(sp.pid, &status, 0);
  EXPECT_EQ(out, "65534 65534 65534 4242\n");
  ::close(sp.stdout_fd);
  ::close(sp.stderr_fd);

  // A directory only root may enter is refused to the user, and said so.
  char dir[] = "/tmp/ddp-runas-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  ASSERT_EQ(::chmod(dir, 0700), 0);
  s.workdir = dir;
  try {
    spawn(s);
    ADD_FAILURE() << "entered a 0700 root directory as uid 65534";
  } catch (const SpawnError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot enter the working directory"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Permission denied"), std::string::npos) << e.what();
  }
  // The preflight's question, answered the same way.
  EXPECT_FALSE(accessible_as(*s.run_as, dir, X_OK));
  EXPECT_TRUE(accessible_as(*s.run_as, "/", X_OK));
  EXPECT_TRUE(accessible_as(RunAs{0, 0, {0}}, dir, X_OK));
  ::rmdir(dir);
  int st;
  while (::waitpid(-1, &st, 0) > 0) {
  }
}

// run_bounded (supervisor/run_bounded.hpp): a helper's output within caps, its status, and a
// deadline after which its whole group is gone.
namespace {
ddp::supervisor::SpawnSpec shell(const std::string& script) {
  ddp::supervisor::SpawnSpec s;
  s.argv = {"/bin/sh", "-c", script};
  s.env = {{"PATH", "/usr/bin:/bin"}};
  s.workdir = "/";
  return s;
}
// Whether `pid` (a grandchild a helper started) exits within 10 s: its pidfd says so, or it is
// gone already (a pid gone cannot be opened). Killed here if not: ours, started by the test.
bool exits_soon(pid_t pid) {
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) return errno == ESRCH;
  pollfd p{pidfd, POLLIN, 0};
  const bool gone = ::poll(&p, 1, 10000) == 1;
  if (!gone) ::kill(pid, SIGKILL);
  ::close(pidfd);
  return gone;
}
}  // namespace

TEST(RunBounded, OutputStatusAndCaps) {
  using namespace std::chrono_literals;
  auto r = ddp::supervisor::run_bounded(shell("echo out; echo err >&2; exit 3"), 10s, 100, 100);
  EXPECT_EQ(r.out, "out\n");
  EXPECT_EQ(r.err, "err\n");
  EXPECT_EQ(r.status, 3);
  EXPECT_FALSE(r.timed_out);
  EXPECT_FALSE(r.out_truncated);
  // Past the caps the rest is read and dropped: the child never blocks on a full pipe.
  r = ddp::supervisor::run_bounded(shell("head -c 1000000 /dev/zero; head -c 1000000 /dev/zero >&2"), 30s, 10, 5);
  EXPECT_EQ(r.out.size(), 10u);
  EXPECT_EQ(r.err.size(), 5u);
  EXPECT_TRUE(r.out_truncated);
  EXPECT_EQ(r.status, 0);
  r = ddp::supervisor::run_bounded(shell("kill -TERM $$"), 10s, 10, 10);
  EXPECT_EQ(r.status, -1);
}

TEST(RunBounded, TheDeadlineEndsTheWholeGroup) {
  using namespace std::chrono_literals;
  // A grandchild in the helper's group holds the pipes open: the deadline ends it too.
  const auto t0 = std::chrono::steady_clock::now();
  auto r = ddp::supervisor::run_bounded(shell("sleep 300 & echo $!; wait"), 300ms, 100, 100);
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.status, -1);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);
  EXPECT_TRUE(exits_soon(std::stoi(r.out))) << "the grandchild outlived the deadline";  // killed with its group
}

// A grandchild that called setsid() has left the helper's process group, and its stdio: the
// helper ends at once, and the grandchild is killed with it through the helper's cgroup (the
// Python probe and the flight recorder's converter run this way, as the job's user).
TEST(RunBounded, AGrandchildThatLeftItsGroupEndsWithTheHelper) {
  using namespace std::chrono_literals;
  using ddp::supervisor::Cgroup;
  if (!Cgroup::create("h-check", Cgroup::Use::helper)) {
    GTEST_SKIP() << "no writable cgroup v2 here: a helper's grandchild that calls setsid() outlives it "
                    "(docs/security.md)";
  }
  // The helper waits until the grandchild leads its own session (field 6 of its stat), so
  // that it has left the group before the helper ends.
  auto r = ddp::supervisor::run_bounded(
      shell("setsid sleep 300 </dev/null >/dev/null 2>&1 & p=$!; "
            "while [ \"$(cut -d' ' -f6 /proc/$p/stat)\" != \"$p\" ]; do sleep 0.01; done; echo $p"),
      10s, 100, 100);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.status, 0);
  EXPECT_TRUE(exits_soon(std::stoi(r.out))) << "the setsid() grandchild outlived its helper";
}

// The child switches user while it still shares our memory (spawn_start clones with CLONE_VM):
// only it may change, never this process or its other threads.
TEST(Process, RunAsChangesOnlyTheChild) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to switch users";
  std::mutex mu;
  std::condition_variable cv;
  bool spawned = false;
  uid_t thread_euid = 12345;
  std::thread other([&] {
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return spawned; });
    thread_euid = ::geteuid();
  });
  SpawnSpec s;
  s.argv = {"/usr/bin/id", "-u"};
  s.env = {{"PATH", "/bin:/usr/bin"}};
  s.workdir = "/";
  s.run_as = RunAs{65534, 65534, {65534}};
  auto sp = spawn(s);
  const auto out = read_all(sp.stdout_fd);
  {
    std::lock_guard lk(mu);
    spawned = true;
  }
  cv.notify_one();
  other.join();
  int status = 0;
  ASSERT_EQ(::waitpid(sp.pid, &status, 0), sp.pid);
  EXPECT_EQ(out, "65534\n");
  EXPECT_EQ(::geteuid(), 0u);
  EXPECT_EQ(::getegid(), 0u);
  EXPECT_EQ(thread_euid, 0u);
  ::close(sp.stdout_fd);
  ::close(sp.stderr_fd);
}

namespace {

// A seccomp filter on the calling process and what it starts: each (call, errno) pair's call
// fails with that errno, as an older kernel (or a container's older profile) answers it.
bool refuse_calls(const std::vector<std::pair<long, int>>& calls) {
  std::vector<sock_filter> f{
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
  };
  for (const auto& [nr, err] : calls) {
    f.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<__u32>(nr), 0, 1));
    f.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (static_cast<__u32>(err) & SECCOMP_RET_DATA)));
  }
  f.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
  sock_fprog prog{static_cast<unsigned short>(f.size()), f.data()};
  return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         ::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) == 0;
}

}  // namespace

// A descriptor opened without O_CLOEXEC (Asio opens and accepts its sockets so: the agent's
// listener, the store's) never reaches a worker: close_range's CLOEXEC flag where the kernel has
// it (5.11), else each descriptor /proc/self/fd lists, else every number below the limit. The
// older kernels' answers come from a seccomp filter, in a child of this test's own.
TEST(Process, AWorkerInheritsNoDescriptorWhereCloseRangeIsRefusedToo) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "the seccomp filter here is written for x86-64's system call numbers";
#endif
  struct Case {
    const char* name;
    std::vector<std::pair<long, int>> refused;
  };
  const std::vector<Case> cases = {
      {"this kernel", {}},
      {"Linux 5.9 and 5.10: close_range without CLOSE_RANGE_CLOEXEC", {{SYS_close_range, EINVAL}}},
      {"before 5.9: no close_range", {{SYS_close_range, ENOSYS}}},
      {"no close_range, /proc/self/fd not listable", {{SYS_close_range, EPERM}, {SYS_getdents64, ENOSYS}}},
  };
  for (const auto& c : cases) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int p[2];
      if (::pipe(p) != 0 || ::dup2(p[1], 100) != 100) ::_exit(10);  // inheritable: no O_CLOEXEC
      if (!c.refused.empty() && !refuse_calls(c.refused)) ::_exit(11);
      SpawnSpec s;
      s.argv = {"/bin/sh", "-c", "if [ -e /proc/self/fd/100 ]; then echo leaked; else echo closed; fi"};
      s.env = {{"PATH", "/bin:/usr/bin"}};
      s.workdir = "/";
      try {
        auto sp = spawn(s);
        const auto out = read_all(sp.stdout_fd);
        int st = 0;
        ::waitpid(sp.pid, &st, 0);
        ::_exit(out == "closed\n" ? 0 : out == "leaked\n" ? 1 : 12);
      } catch (...) {
        ::_exit(13);
      }
    }
    int st = 0;
    ASSERT_EQ(::waitpid(pid, &st, 0), pid);
    ASSERT_TRUE(WIFEXITED(st)) << c.name;
    EXPECT_EQ(WEXITSTATUS(st), 0) << c.name << " (1: fd 100 reached the worker; 11: no seccomp filter; 12: "
                                  << "the worker said something else; 13: spawn threw)";
  }
}

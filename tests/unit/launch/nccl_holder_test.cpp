// The NCCL id holder's start, against stand-in holders (shell scripts on PATH that speak
// nccl/holder_protocol.hpp): the wait for the id is asynchronous, so the loop that waits runs
// its other handlers (an agent's heartbeats, its watchdog) meanwhile (issue 23).
#include "launch/nccl_holder.hpp"

#include <gtest/gtest.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <fcntl.h>
#include <linux/sched.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

using namespace ddp;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

const std::string kHex(256, 'a');

// A folder with a stand-in `ddp-ncclid` (the given shell body) first on PATH, and a FIFO, `go`,
// that the stand-in may wait on: the test writes it from a handler of the loop that waits.
struct StandIn {
  explicit StandIn(const std::string& body) {
    char tmpl[] = "/tmp/ncclholder-XXXXXX";
    dir = ::mkdtemp(tmpl);
    go = dir + "/go";
    ::mkfifo(go.c_str(), 0600);
    const auto exe = dir + "/ddp-ncclid";
    std::ofstream(exe) << "#!/bin/sh\n" << body << "\n";
    ::chmod(exe.c_str(), 0755);
    old_path = std::getenv("PATH") ? std::getenv("PATH") : "";
    ::setenv("PATH", (dir + ":/usr/bin:/bin").c_str(), 1);
  }
  ~StandIn() {
    if (go_fd >= 0) ::close(go_fd);
    ::setenv("PATH", old_path.c_str(), 1);
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  // Opened read-write so that it does not block; kept open until the stand-in has read it.
  void release() {
    go_fd = ::open(go.c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_EQ(::write(go_fd, "go\n", 3), 3);
  }
  contract::Env env() const { return {{"GO", go}, {"PATH", "/usr/bin:/bin"}}; }

  std::string dir, go, old_path;
  int go_fd = -1;
};

struct Outcome {
  bool called = false;
  std::optional<launch::NcclHolder> holder;
  std::string error;
};

std::unique_ptr<launch::NcclHolderWait> start(boost::asio::io_context& io, const StandIn& s, jobspec::NcclUniqueId mode,
                                              Outcome& out, std::chrono::milliseconds deadline = 20s) {
  return launch::NcclHolder::start(
      io, s.env(), s.dir, s.dir, mode, false, std::nullopt,
      [&out](std::optional<launch::NcclHolder> h, std::string e) {
        out.called = true;
        if (h) out.holder.emplace(std::move(*h));
        out.error = std::move(e);
      },
      deadline);
}

}  // namespace

// The stand-in prints its id only once a handler of the waiting loop has released it: with a
// blocking wait that handler never runs, and the start ends at its deadline without an id.
TEST(NcclHolder, TheLoopRunsOtherHandlersWhileTheIdIsOnItsWay) {
  StandIn s("read go < \"$GO\"; echo " + kHex + "; exec cat >/dev/null");
  boost::asio::io_context io;
  Outcome out;
  int ticks = 0;
  auto wait = start(io, s, jobspec::NcclUniqueId::on, out);
  EXPECT_FALSE(out.called);  // never from inside start()
  boost::asio::steady_timer heartbeat(io);
  std::function<void()> tick = [&] {
    heartbeat.expires_after(10ms);
    heartbeat.async_wait([&](boost::system::error_code ec) {
      if (ec || out.called) return;
      if (++ticks == 3) s.release();  // three heartbeats went out while it waited
      tick();
    });
  };
  tick();
  while (!out.called && io.run_one_for(20s)) {
  }
  ASSERT_TRUE(out.called);
  EXPECT_GE(ticks, 3);
  ASSERT_TRUE(out.holder) << out.error;
  EXPECT_EQ(out.holder->hex(), kHex);
  EXPECT_GT(out.holder->pid(), 0);
}

TEST(NcclHolder, DroppingTheWaitStopsTheHolderAndNeverCallsBack) {
  StandIn s("read go < \"$GO\"; echo " + kHex + "; exec cat >/dev/null");
  boost::asio::io_context io;
  Outcome out;
  auto wait = start(io, s, jobspec::NcclUniqueId::on, out);
  boost::asio::steady_timer t(io);
  t.expires_after(20ms);
  t.async_wait([&](boost::system::error_code) { wait.reset(); });
  io.run_for(20s);  // returns early only if nothing is left pending: pipes closed, timer cancelled
  EXPECT_TRUE(io.stopped());
  EXPECT_FALSE(out.called);
}

TEST(NcclHolder, TheDeadlineEndsTheWait) {
  StandIn s("read go < \"$GO\"; echo " + kHex);
  boost::asio::io_context io;
  Outcome on, autom;
  auto w1 = start(io, s, jobspec::NcclUniqueId::on, on, 200ms);
  auto w2 = start(io, s, jobspec::NcclUniqueId::automatic, autom, 200ms);
  io.run_for(20s);
  ASSERT_TRUE(on.called && autom.called);
  EXPECT_FALSE(on.holder);
  EXPECT_EQ(on.error, "ddp-ncclid gave no id within 200ms");
  EXPECT_FALSE(autom.holder);
  EXPECT_EQ(autom.error, "");  // auto goes on without an id
}

TEST(NcclHolder, TheHoldersErrorLineIsTheReason) {
  StandIn s("echo 'NCCL INFO stray line'; echo 'error: cannot load libnccl.so.2'; exit 3");
  boost::asio::io_context io;
  Outcome out;
  auto wait = start(io, s, jobspec::NcclUniqueId::on, out);
  io.run_for(20s);
  ASSERT_TRUE(out.called);
  EXPECT_FALSE(out.holder);
  EXPECT_EQ(out.error, "error: cannot load libnccl.so.2");
}

TEST(NcclHolder, AHolderThatEndsWithoutALineSaysSo) {
  StandIn s("exit 1");
  boost::asio::io_context io;
  Outcome out;
  auto wait = start(io, s, jobspec::NcclUniqueId::on, out);
  io.run_for(20s);
  ASSERT_TRUE(out.called);
  EXPECT_FALSE(out.holder);
  EXPECT_NE(out.error.find("ended without printing an id"), std::string::npos) << out.error;
}

TEST(NcclHolder, OffAndContainersGetNoHolderLater) {
  StandIn s("echo " + kHex);
  boost::asio::io_context io;
  Outcome off;
  auto wait = start(io, s, jobspec::NcclUniqueId::off, off);
  EXPECT_FALSE(off.called);
  io.run_for(20s);
  EXPECT_TRUE(off.called);
  EXPECT_FALSE(off.holder);
  EXPECT_EQ(off.error, "");
}

// stop() signals the holder through a pidfd. Once the owner's loop has reaped it (reap_children
// does, for every child), a process that got its pid is not signalled: here the pid is given to
// a new process on purpose (clone3's set_tid, root only), then the holder is stopped.
TEST(NcclHolder, StoppingAReapedHolderSignalsNoOtherProcess) {
  StandIn s("echo " + kHex);  // prints its id and ends
  boost::asio::io_context io;
  Outcome out;
  auto wait = start(io, s, jobspec::NcclUniqueId::on, out);
  io.run_for(20s);
  ASSERT_TRUE(out.called);
  ASSERT_TRUE(out.holder) << out.error;
  const pid_t pid = out.holder->pid();
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);  // as the owner's SIGCHLD handler would

  pid_t want = pid;
  clone_args args{};
  args.exit_signal = SIGCHLD;
  args.set_tid = reinterpret_cast<std::uint64_t>(&want);
  args.set_tid_size = 1;
  const long other = ::syscall(SYS_clone3, &args, sizeof args);
  if (other == 0) {
    for (;;) ::pause();  // until a signal ends it
  }
  if (other < 0) {
    GTEST_SKIP() << "cannot give a process a chosen pid here (clone3 with set_tid: " << std::strerror(errno)
                 << "; it needs root and Linux 5.5)";
  }
  ASSERT_EQ(other, pid);
  out.holder->stop();
  ::usleep(200 * 1000);
  const pid_t ended = ::waitpid(pid, &status, WNOHANG);
  ::kill(pid, SIGKILL);
  if (ended == 0) ::waitpid(pid, &status, 0);
  EXPECT_EQ(ended, 0) << "the process that got the holder's pid was signalled";
}

// A holder stuck inside NCCL does not end on SIGTERM (it blocks it until its id is made): stop()
// kills it after a second. The owner's loop catches signals (SIGCHLD, SIGINT, SIGUSR1, ...), and
// a signal that lands during that second interrupts the wait; the holder must be gone all the
// same when stop() returns. Here the stand-in ignores SIGTERM and its stdin, and this thread is
// signalled every 20 ms while it stops it.
namespace {
void on_usr1(int) {}
}  // namespace

TEST(NcclHolder, SignalsDuringTheStopDoNotLeaveAStuckHolderRunning) {
  StandIn s("trap '' TERM; echo " + kHex + "; exec sleep 30");  // sleep inherits the ignored TERM
  boost::asio::io_context io;
  Outcome out;
  auto wait = start(io, s, jobspec::NcclUniqueId::on, out);
  while (!out.called && io.run_one_for(20s)) {
  }
  ASSERT_TRUE(out.called);
  ASSERT_TRUE(out.holder) << out.error;
  const pid_t pid = out.holder->pid();

  struct sigaction act {
  }, old{};
  act.sa_handler = on_usr1;
  sigemptyset(&act.sa_mask);
  ASSERT_EQ(::sigaction(SIGUSR1, &act, &old), 0);
  std::atomic<bool> stopped{false};
  const pthread_t self = ::pthread_self();
  std::thread pester([&] {
    while (!stopped) {
      ::pthread_kill(self, SIGUSR1);
      std::this_thread::sleep_for(20ms);
    }
  });
  out.holder->stop();
  const bool gone = ::kill(pid, 0) != 0 && errno == ESRCH;
  stopped = true;
  pester.join();
  ::sigaction(SIGUSR1, &old, nullptr);
  if (!gone) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
  EXPECT_TRUE(gone) << "the holder (pid " << pid << ") still ran after stop() returned";
}

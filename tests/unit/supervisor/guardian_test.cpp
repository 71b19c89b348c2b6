// The attempt's guardian (supervisor/guardian.hpp): a launcher that goes away without ending
// the attempt gets its workers' process groups killed; one that ends it, or forgets a group,
// does not.
#include "supervisor/guardian.hpp"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace {

using ddp::supervisor::Guardian;
using ddp::supervisor::LastWord;
namespace fs = std::filesystem;

fs::path scratch_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / (name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A process group of two: a leader and its child, both sleeping. The child re-parents to this
// test (a subreaper), which reaps it: a zombie left to init still counts as the group's.
pid_t sleeping_group() {
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    if (::fork() == 0) {
      ::pause();
      ::_exit(0);
    }
    ::pause();
    ::_exit(0);
  }
  ::setpgid(pid, pid);
  return pid;
}

bool group_alive(pid_t pgid) {
  return ::kill(-pgid, 0) == 0;
}

bool dies_within(pid_t pgid, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    if (!group_alive(pgid)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

void end_group(pid_t pgid) {
  ::kill(-pgid, SIGKILL);
  dies_within(pgid, std::chrono::seconds(5));
}

// What the folder holds, by name (no temporary file may be left).
std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

fs::path tmp_of(const fs::path& dir, pid_t guardian) {
  return dir / ("job.ended.guardian-" + std::to_string(guardian) + ".tmp");
}

void reap(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
}

TEST(Guardian, KillsTheGroupsItWatchesWhenTheLauncherGoesAway) {
  const pid_t g = sleeping_group();
  pid_t guardian_pid = -1;
  {
    auto guardian = Guardian::start(-1, 4);
    ASSERT_TRUE(guardian);
    guardian_pid = guardian->pid();
    guardian->watch_group(g);
  }  // closed without done(): as if this process had been SIGKILLed
  EXPECT_TRUE(dies_within(g, std::chrono::seconds(5)));
  reap(guardian_pid);
  end_group(g);
}

TEST(Guardian, LeavesEverythingAloneOnceTheAttemptEnded) {
  const pid_t g = sleeping_group();
  auto guardian = Guardian::start(-1, 4);
  ASSERT_TRUE(guardian);
  guardian->watch_group(g);
  guardian->done();
  reap(guardian->pid());  // it exits when told
  EXPECT_TRUE(group_alive(g));
  end_group(g);
}

TEST(Guardian, AForgottenGroupIsNotKilled) {
  const pid_t kept = sleeping_group(), forgotten = sleeping_group();
  pid_t guardian_pid = -1;
  {
    auto guardian = Guardian::start(-1, 4);
    ASSERT_TRUE(guardian);
    guardian_pid = guardian->pid();
    guardian->watch_group(kept);
    guardian->watch_group(forgotten);
    guardian->forget_group(forgotten);
  }
  EXPECT_TRUE(dies_within(kept, std::chrono::seconds(5)));
  reap(guardian_pid);
  EXPECT_TRUE(group_alive(forgotten));
  end_group(forgotten);
}

TEST(Guardian, IgnoresTheStopSignalsALauncherTakes) {
  const pid_t g = sleeping_group();
  auto guardian = Guardian::start(-1, 4);
  ASSERT_TRUE(guardian);
  guardian->watch_group(g);
  // No wait for it to set its handlers: it is forked with every signal blocked, and unblocks
  // them once it ignores these.
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::kill(guardian->pid(), sig);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(::waitpid(guardian->pid(), nullptr, WNOHANG), 0) << "the guardian died of a stop signal";
  const pid_t pid = guardian->pid();
  guardian.reset();
  EXPECT_TRUE(dies_within(g, std::chrono::seconds(5)));
  reap(pid);
  end_group(g);
}

TEST(Guardian, LeavesTheLastWordWithTheTimeOfDeathOnceTheLauncherIsGone) {
  const auto dir = scratch_dir("guardian-word");
  const auto before = std::chrono::system_clock::now();
  pid_t guardian_pid = -1;
  {
    auto guardian = Guardian::start(-1, 4, LastWord{dir.string(), "job.ended", "{\"t\": ", "}\n"});
    ASSERT_TRUE(guardian);
    guardian_pid = guardian->pid();
    EXPECT_FALSE(fs::exists(dir / "job.ended")) << "written before the launcher went";
  }
  reap(guardian_pid);
  const auto after = std::chrono::system_clock::now();
  const auto text = slurp(dir / "job.ended");
  ASSERT_TRUE(text.starts_with("{\"t\": ") && text.ends_with("}\n")) << text;
  const auto ms = std::stoll(text.substr(6));
  const auto ms_of = [](auto t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
  };
  EXPECT_GE(ms, ms_of(before));
  EXPECT_LE(ms, ms_of(after));
  EXPECT_EQ(fs::status(dir / "job.ended").permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(names_in(dir), std::vector<std::string>{"job.ended"});
  fs::remove_all(dir);
}

TEST(Guardian, LeavesNoWordWhenTheAttemptEnded) {
  const auto dir = scratch_dir("guardian-done");
  auto guardian = Guardian::start(-1, 4, LastWord{dir.string(), "job.ended", "a", "b"});
  ASSERT_TRUE(guardian);
  guardian->done();
  reap(guardian->pid());
  EXPECT_TRUE(fs::is_empty(dir));
  fs::remove_all(dir);
}

TEST(Guardian, StoodDownItKillsNothingButStillLeavesTheWord) {
  // The attempt ended (a restart's backoff follows) and the launcher dies before the next one.
  const auto dir = scratch_dir("guardian-standby");
  const pid_t g = sleeping_group();
  pid_t guardian_pid = -1;
  {
    auto guardian = Guardian::start(-1, 4, LastWord{dir.string(), "job.ended", "before ", " after"});
    ASSERT_TRUE(guardian);
    guardian_pid = guardian->pid();
    guardian->watch_group(g);
    guardian->stand_down();
  }
  reap(guardian_pid);
  EXPECT_TRUE(group_alive(g)) << "a group it was told of before standing down was killed";
  const auto word = slurp(dir / "job.ended");
  EXPECT_TRUE(word.starts_with("before ") && word.ends_with(" after")) << word;
  end_group(g);
  fs::remove_all(dir);
}

TEST(Guardian, NeverReplacesAFileOfTheWordsName) {
  // A later run of the same job id wrote its record while this one's guardian was still killing.
  const auto dir = scratch_dir("guardian-noreplace");
  std::ofstream(dir / "job.ended") << "newer";
  pid_t guardian_pid = -1;
  {
    auto guardian = Guardian::start(-1, 4, LastWord{dir.string(), "job.ended", "a", "b"});
    ASSERT_TRUE(guardian);
    guardian_pid = guardian->pid();
  }
  reap(guardian_pid);
  EXPECT_EQ(slurp(dir / "job.ended"), "newer");
  EXPECT_EQ(names_in(dir), std::vector<std::string>{"job.ended"});
  fs::remove_all(dir);
}

TEST(Guardian, FollowsNoLinkAtItsTemporaryName) {
  // A link where the guardian writes first (its own temporary name): removed, not followed.
  const auto dir = scratch_dir("guardian-link");
  const auto target = dir / "elsewhere";
  std::ofstream(target) << "kept";
  pid_t guardian_pid = -1;
  {
    auto guardian = Guardian::start(-1, 4, LastWord{dir.string(), "job.ended", "a", "b"});
    ASSERT_TRUE(guardian);
    guardian_pid = guardian->pid();
    fs::create_symlink(target, tmp_of(dir, guardian_pid));  // it writes only once we are gone
  }
  reap(guardian_pid);
  EXPECT_EQ(slurp(target), "kept");
  EXPECT_EQ(slurp(dir / "job.ended").substr(0, 1), "a");
  EXPECT_EQ(names_in(dir), (std::vector<std::string>{"elsewhere", "job.ended"}));
  fs::remove_all(dir);
}

TEST(Guardian, TwoGuardiansOfOneJobLeaveOneWholeRecord) {
  // A restart's guardian and the last attempt's, standing down, both outlive a launcher killed
  // between the two: each writes its own temporary file, one record comes of it, whole.
  const auto dir = scratch_dir("guardian-two");
  const std::string a_before(4096, 'a'), b_before(4096, 'b');
  pid_t pids[2] = {-1, -1};
  {
    auto first = Guardian::start(-1, 4, LastWord{dir.string(), "job.ended", a_before, "A"});
    auto second = Guardian::start(-1, 4, LastWord{dir.string(), "job.ended", b_before, "B"});
    ASSERT_TRUE(first && second);
    pids[0] = first->pid(), pids[1] = second->pid();
    first->stand_down();
  }
  reap(pids[0]);
  reap(pids[1]);
  const auto text = slurp(dir / "job.ended");
  EXPECT_TRUE((text.starts_with(a_before) && text.ends_with("A")) ||
              (text.starts_with(b_before) && text.ends_with("B")))
      << text.size();
  EXPECT_EQ(text.find(text[0] == 'a' ? 'b' : 'a'), std::string::npos) << "a record of two writers";
  EXPECT_EQ(names_in(dir), std::vector<std::string>{"job.ended"});
  fs::remove_all(dir);
}

}  // namespace

// common/safe_fs: every refusal on real files in a temporary folder, the "victim" being a file
// of ours outside it whose content and owner must never change.
#include "common/safe_fs.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

using namespace ddp::safefs;
namespace fs = std::filesystem;

namespace {

constexpr uid_t kNobody = 65534;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "ddp-safefs-XXXXXX").string();
    path = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write(const fs::path& p, const std::string& text, mode_t mode = 0600) {
  std::ofstream(p) << text;
  ::chmod(p.c_str(), mode);
}

struct stat stat_of(const fs::path& p) {
  struct stat st {};
  EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
  return st;
}

int error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const FsError& e) {
    return e.error();
  }
  return 0;
}

}  // namespace

TEST(SafeFs, CheckNameRefusesPaths) {
  for (const char* bad : {"", ".", "..", "a/b", "/x"}) EXPECT_EQ(error_of([&] { check_name(bad); }), EINVAL) << bad;
  EXPECT_EQ(error_of([] { check_name("rank-0.log"); }), 0);
}

TEST(SafeFs, OpenAppendCreates0600AndAppends) {
  TempDir t;
  const auto dir = Dir::open(t.path.string());
  {
    auto fd = open_append(dir, "rank-0.log", std::nullopt);
    ASSERT_TRUE(write_all(fd.get(), "one\n"));
  }
  {
    auto fd = open_append(dir, "rank-0.log", std::nullopt);
    ASSERT_TRUE(write_all(fd.get(), "two\n"));
  }
  EXPECT_EQ(read(t.path / "rank-0.log"), "one\ntwo\n");
  EXPECT_EQ(stat_of(t.path / "rank-0.log").st_mode & 07777, 0600u);
}

TEST(SafeFs, OpenAppendNeverWritesThroughALinkOrAHardLink) {
  TempDir t;
  fs::create_directory(t.path / "jobdir");
  write(t.path / "victim", "secret\n");
  const auto dir = Dir::open((t.path / "jobdir").string());
  fs::create_symlink(t.path / "victim", t.path / "jobdir" / "rank-0.log");
  EXPECT_EQ(error_of([&] { open_append(dir, "rank-0.log", std::nullopt); }), ELOOP);
  fs::create_hard_link(t.path / "victim", t.path / "jobdir" / "rank-1.log");
  EXPECT_EQ(error_of([&] { open_append(dir, "rank-1.log", std::nullopt); }), EPERM);
  EXPECT_EQ(read(t.path / "victim"), "secret\n");
}

TEST(SafeFs, OpenAppendRefusesAFifoWithoutBlocking) {
  TempDir t;
  ASSERT_EQ(::mkfifo((t.path / "rank-0.log").c_str(), 0600), 0);
  const auto dir = Dir::open(t.path.string());
  // O_WRONLY|O_NONBLOCK on a FIFO without a reader: ENXIO, at once (a blocking open would hang here).
  const int err = error_of([&] { open_append(dir, "rank-0.log", std::nullopt); });
  EXPECT_TRUE(err == ENXIO || err == EPERM) << err;
}

TEST(SafeFs, OpenBeneathFollowsNoLink) {
  TempDir t;
  fs::create_directories(t.path / "root" / "alice" / "job");
  fs::create_directories(t.path / "elsewhere");
  fs::create_directory_symlink(t.path / "elsewhere", t.path / "root" / "alice" / "evil");
  const auto root = Dir::open((t.path / "root").string());
  EXPECT_NO_THROW(Dir::open_beneath(root, "alice/job", ::geteuid()));
  EXPECT_EQ(Dir::open_beneath(root, "alice//job/").path(), (t.path / "root" / "alice" / "job").string());
  const int err = error_of([&] { Dir::open_beneath(root, "alice/evil"); });
  EXPECT_TRUE(err == ELOOP || err == ENOTDIR) << err;
  EXPECT_EQ(error_of([&] { Dir::open_beneath(root, "alice/../../x"); }), EINVAL);
  EXPECT_EQ(error_of([&] { Dir::open_beneath(root, ""); }), EINVAL);
  EXPECT_EQ(error_of([&] { Dir::open_beneath(root, "alice", ::geteuid() + 1); }), EPERM);
}

TEST(SafeFs, MakeDirFreshRefusesWhatExists) {
  TempDir t;
  const auto dir = Dir::open(t.path.string());
  const auto made = make_dir(dir, "attempt-0", 0700, std::nullopt, true);
  EXPECT_EQ(stat_of(t.path / "attempt-0").st_mode & 07777, 0700u);
  EXPECT_EQ(error_of([&] { make_dir(dir, "attempt-0", 0700, std::nullopt, true); }), EEXIST);
  EXPECT_NO_THROW(make_dir(dir, "attempt-0", 0700, std::nullopt, false));
  // A link where a folder should be is not used, fresh or not.
  fs::create_directory(t.path / "target");
  fs::create_directory_symlink(t.path / "target", t.path / "user");
  EXPECT_EQ(error_of([&] { make_dir(dir, "user", 0700, std::nullopt, true); }), EEXIST);
  const int err = error_of([&] { make_dir(dir, "user", 0700, std::nullopt, false); });
  EXPECT_TRUE(err == ELOOP || err == ENOTDIR) << err;
  EXPECT_EQ(error_of([&] { make_dir(dir, "..", 0700, std::nullopt, false); }), EINVAL);
}

TEST(SafeFs, CreateNewNeverReplacesOrFollows) {
  TempDir t;
  write(t.path / "victim", "secret\n");
  fs::create_directory(t.path / "d");
  const auto dir = Dir::open((t.path / "d").string());
  fs::create_symlink(t.path / "victim", t.path / "d" / "rank-0.log");
  EXPECT_EQ(error_of([&] { create_new(dir, "rank-0.log", std::nullopt); }), EEXIST);
  // Rotation's steps: the link is moved aside, not followed; the new file is ours.
  rename_in(dir, "rank-0.log", "rank-0.log.1");
  auto fd = create_new(dir, "rank-0.log", std::nullopt);
  ASSERT_TRUE(write_all(fd.get(), "fresh\n"));
  EXPECT_TRUE(fs::is_symlink(t.path / "d" / "rank-0.log.1"));
  EXPECT_EQ(read(t.path / "d" / "rank-0.log"), "fresh\n");
  EXPECT_EQ(read(t.path / "victim"), "secret\n");
  remove_in(dir, "rank-0.log.1");
  EXPECT_FALSE(fs::exists(fs::symlink_status(t.path / "d" / "rank-0.log.1")));
  EXPECT_EQ(read(t.path / "victim"), "secret\n");
}

TEST(SafeFs, ReplaceFileReplacesALinkAndAStaleTemporaryNeverFollowingThem) {
  TempDir t;
  write(t.path / "victim", "secret\n");
  fs::create_directory(t.path / "d");
  const auto dir = Dir::open((t.path / "d").string());
  fs::create_symlink(t.path / "victim", t.path / "d" / "result.json");
  fs::create_symlink(t.path / "victim", t.path / "d" / ".result.json.tmp");  // a stale temporary, a link
  replace_file(dir, "result.json", "{}\n", std::nullopt);
  EXPECT_FALSE(fs::is_symlink(t.path / "d" / "result.json"));
  EXPECT_EQ(read(t.path / "d" / "result.json"), "{}\n");
  EXPECT_EQ(stat_of(t.path / "d" / "result.json").st_mode & 0777, 0600u);
  EXPECT_FALSE(fs::exists(fs::symlink_status(t.path / "d" / ".result.json.tmp")));
  EXPECT_EQ(read(t.path / "victim"), "secret\n");
  // A name that is not one: refused, nothing made.
  EXPECT_EQ(error_of([&] { replace_file(dir, "../x", "", std::nullopt); }), EINVAL);
  EXPECT_FALSE(fs::exists(t.path / "x"));
}

TEST(SafeFs, ReadOwnedReadsOnlyARegularFileOfItsOwnerWithinTheBound) {
  TempDir t;
  write(t.path / "victim", "secret\n");
  fs::create_directory(t.path / "d");
  const auto dir = Dir::open((t.path / "d").string());
  const uid_t me = ::geteuid();
  EXPECT_EQ(read_owned(dir, "none.json", me, 100).kind, ReadResult::Kind::missing);
  write(t.path / "d" / "ok.json", "{}");
  auto r = read_owned(dir, "ok.json", me, 100);
  EXPECT_EQ(r.kind, ReadResult::Kind::ok);
  EXPECT_EQ(r.text, "{}");
  EXPECT_EQ(read_owned(dir, "ok.json", me, 1).kind, ReadResult::Kind::too_big);
  EXPECT_EQ(read_owned(dir, "ok.json", me + 1, 100).kind, ReadResult::Kind::refused);
  fs::create_symlink(t.path / "victim", t.path / "d" / "link.json");
  r = read_owned(dir, "link.json", me, 100);
  EXPECT_EQ(r.kind, ReadResult::Kind::refused);
  EXPECT_EQ(r.text, "");
  EXPECT_NE(r.reason.find("symbolic link"), std::string::npos) << r.reason;
  fs::create_hard_link(t.path / "victim", t.path / "d" / "hard.json");
  EXPECT_EQ(read_owned(dir, "hard.json", me, 100).kind, ReadResult::Kind::refused);
  ASSERT_EQ(::mkfifo((t.path / "d" / "fifo.json").c_str(), 0600), 0);
  r = read_owned(dir, "fifo.json", me, 100);  // returns at once: opened O_NONBLOCK, then refused
  EXPECT_EQ(r.kind, ReadResult::Kind::refused);
  EXPECT_NE(r.reason.find("not a regular file"), std::string::npos) << r.reason;
}

// As root, for another user (what a root agent does for a job's user).
TEST(SafeFs, GivesFoldersAndFilesToTheirOwnerAndRefusesOthersFiles) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give files to another user";
  TempDir t;
  const auto root = Dir::open(t.path.string());
  const Owner nobody{kNobody, kNobody};
  const auto user = make_dir(root, "nobody", 0700, nobody, false);
  auto st = stat_of(t.path / "nobody");
  EXPECT_EQ(st.st_uid, kNobody);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_NO_THROW(make_dir(root, "nobody", 0700, nobody, false));  // the user's own, used again
  {
    auto fd = open_append(user, "rank-0.log", nobody);
    ASSERT_TRUE(write_all(fd.get(), "x\n"));
  }
  st = stat_of(t.path / "nobody" / "rank-0.log");
  EXPECT_EQ(st.st_uid, kNobody);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_NO_THROW(open_append(user, "rank-0.log", nobody));
  // A folder or file of root's where the user's should be is not taken over.
  fs::create_directory(t.path / "rootdir");
  EXPECT_EQ(error_of([&] { make_dir(root, "rootdir", 0700, nobody, false); }), EPERM);
  EXPECT_EQ(stat_of(t.path / "rootdir").st_uid, 0u);
  write(t.path / "nobody" / "rootfile", "secret\n");  // root's, with one name
  EXPECT_EQ(error_of([&] { open_append(user, "rootfile", nobody); }), EPERM);
  EXPECT_EQ(stat_of(t.path / "nobody" / "rootfile").st_uid, 0u);
  EXPECT_EQ(read_owned(user, "rootfile", kNobody, 100).kind, ReadResult::Kind::refused);
  EXPECT_EQ(read(t.path / "nobody" / "rootfile"), "secret\n");
}

// A file named by a path, in a folder someone else may write (ddpctl logs as root).
TEST(SafeFs, OpenInFolderToReadTakesOnlyARegularFileOfTheFoldersOwner) {
  TempDir t;
  std::ofstream(t.path / "rank-0.log") << "x\n";
  auto r = open_in_folder_to_read((t.path / "rank-0.log").string());
  ASSERT_TRUE(r.fd) << r.reason;
  char c = 0;
  EXPECT_EQ(::read(r.fd.get(), &c, 1), 1);
  EXPECT_EQ(c, 'x');
  r = open_in_folder_to_read((t.path / "none.log").string());
  EXPECT_TRUE(!r.fd && r.missing);
  r = open_in_folder_to_read((t.path / "nofolder" / "rank-0.log").string());
  EXPECT_TRUE(!r.fd && r.missing);
  fs::create_symlink(t.path / "rank-0.log", t.path / "link.log");
  r = open_in_folder_to_read((t.path / "link.log").string());
  EXPECT_TRUE(!r.fd && !r.missing);
  EXPECT_EQ(r.reason, "it is a symbolic link, which is not followed here");
  fs::create_directory_symlink(t.path, t.path / "folder-link");
  r = open_in_folder_to_read((t.path / "folder-link" / "rank-0.log").string());
  EXPECT_TRUE(!r.fd && !r.missing);
  EXPECT_NE(r.reason.find("its folder: "), std::string::npos) << r.reason;
  ASSERT_EQ(::mkfifo((t.path / "fifo.log").c_str(), 0600), 0);  // no writer: a blocking open would hang
  r = open_in_folder_to_read((t.path / "fifo.log").string());
  EXPECT_EQ(r.reason, "it is not a regular file");
  fs::create_hard_link(t.path / "rank-0.log", t.path / "hard.log");
  r = open_in_folder_to_read((t.path / "hard.log").string());
  EXPECT_EQ(r.reason, "it has 2 names (a hard link)");
  r = open_in_folder_to_read((t.path / "..").string());
  EXPECT_FALSE(r.fd);
  if (::geteuid() == 0) {  // a file given to another user in our folder (a job could not, as it is not root)
    std::ofstream(t.path / "theirs.log") << "y\n";
    ASSERT_EQ(::chown((t.path / "theirs.log").c_str(), kNobody, kNobody), 0);
    r = open_in_folder_to_read((t.path / "theirs.log").string());
    EXPECT_EQ(r.reason, "it belongs to uid 65534, not to its folder's owner (uid 0)");
  }
}

// Root uses a folder the environment names only where no other user can swap one of the folders
// on its way for a link (`su` keeps a user's XDG_RUNTIME_DIR, `sudo -E` their HOME), and then
// by the path with every link resolved, not by one a user's link is part of.
TEST(SafeFs, RootUsesAnEnvironmentFolderOnlyWhereNoUserCanSwapIt) {
  ASSERT_EQ(::geteuid(), 0u) << "this test makes folders of another user: it runs as root (as the suite does)";
  TempDir t;  // root's, 0700, in /tmp (root's, sticky)
  const auto p = fs::canonical(t.path);
  EXPECT_EQ(usable_env_dir(p.string()), p.string());
  EXPECT_EQ(usable_env_dir((p / "not/yet").string()), (p / "not/yet").string());  // root makes the rest
  EXPECT_EQ(usable_env_dir("relative/x", kNobody), "relative/x");                 // a user's own environment is theirs

  fs::create_directories(p / "users/alice/run");
  ::chown((p / "users/alice").c_str(), kNobody, kNobody);
  EXPECT_EQ(usable_env_dir((p / "users/alice").string()), std::nullopt);      // another user's
  EXPECT_EQ(usable_env_dir((p / "users/alice/run").string()), std::nullopt);  // root's, inside another user's
  EXPECT_EQ(usable_env_dir((p / "users/alice/run/later").string()), std::nullopt);

  fs::create_symlink(p / "users/alice/run", p / "link");  // root's link, into another user's folder
  EXPECT_EQ(usable_env_dir((p / "link").string()), std::nullopt);

  // alice's link to a folder of root's: root may use that folder, by its own path only (alice
  // can point her link elsewhere at any time).
  fs::create_directories(p / "roots");
  fs::create_symlink(p / "roots", p / "users/alice/rt");
  EXPECT_EQ(usable_env_dir((p / "users/alice/rt").string()), (p / "roots").string());
  EXPECT_EQ(usable_env_dir((p / "users/alice/rt/state").string()), (p / "roots/state").string());
  EXPECT_EQ(usable_env_dir((p / "roots/x/../../users").string()), std::nullopt);  // a tail that climbs

  fs::create_directories(p / "group");
  ::chmod((p / "group").c_str(), 0775);  // anyone in the group can rename what is inside
  EXPECT_EQ(usable_env_dir((p / "group").string()), std::nullopt);
  fs::create_directories(p / "group/sub");
  EXPECT_EQ(usable_env_dir((p / "group/sub").string()), std::nullopt);

  fs::create_directories(p / "sticky");
  ::chmod((p / "sticky").c_str(), 01777);  // like /tmp: what root made there stays root's ...
  fs::create_directories(p / "sticky/mine");
  EXPECT_EQ(usable_env_dir((p / "sticky/mine").string()), (p / "sticky/mine").string());
  EXPECT_EQ(usable_env_dir((p / "sticky/not-yet").string()), std::nullopt);  // ... what is to make, others may first
  EXPECT_EQ(usable_env_dir("relative/path"), std::nullopt);
}

// Token files: permissions are checked before a secret is trusted; errors say what to do.
#include "net/token_file.hpp"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cstdlib>
#include <filesystem>
#include <fstream>

using namespace ddp::net;
namespace fs = std::filesystem;

namespace {
struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/ddp-token-test-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
};

std::string write(const fs::path& p, const std::string& text, mode_t mode) {
  std::ofstream(p) << text;
  ::chmod(p.c_str(), mode);
  return p.string();
}

std::string error_of(const std::string& path) {
  try {
    load_token_file(path);
  } catch (const TokenError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(TokenFile, LoadsA0600File) {
  TempDir d;
  auto p = write(d.path / "token", std::string(64, 'a') + "\n", 0600);
  auto k = load_token_file(p);
  ASSERT_NE(k.first(), nullptr);
  EXPECT_EQ(k.first()->id, "default");
}

TEST(TokenFile, RefusesGroupOrWorldAccess) {
  TempDir d;
  auto p = write(d.path / "token", std::string(64, 'a') + "\n", 0644);
  auto e = error_of(p);
  EXPECT_NE(e.find("mode 0644"), std::string::npos) << e;
  EXPECT_NE(e.find("chmod 600"), std::string::npos) << e;
}

TEST(TokenFile, OwnerMustBeUsOrRoot) {
  EXPECT_FALSE(token_owner_problem("/t", 1000, 1000));
  EXPECT_FALSE(token_owner_problem("/t", 0, 1000));  // root's file, readable by us: root gave it to us
  auto e = token_owner_problem("/t", 65534, 0);
  ASSERT_TRUE(e);
  EXPECT_NE(e->find("token file /t belongs to uid 65534, not to uid 0 (us) or root"), std::string::npos) << *e;
  EXPECT_NE(e->find("chown 0 /t"), std::string::npos) << *e;
  EXPECT_TRUE(token_owner_problem("/t", 1001, 1000));
}

TEST(TokenFile, RefusesAFileOfAnotherUserWhenRoot) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give the file to another user";
  TempDir d;
  auto p = write(d.path / "token", std::string(64, 'a') + "\n", 0600);
  ASSERT_EQ(::chown(p.c_str(), 65534, 65534), 0);
  auto e = error_of(p);
  EXPECT_NE(e.find("belongs to uid 65534"), std::string::npos) << e;
}

TEST(TokenFile, MissingAndMalformed) {
  TempDir d;
  EXPECT_NE(error_of((d.path / "nope").string()).find("does not exist"), std::string::npos);
  auto p = write(d.path / "short", "tooshort\n", 0600);
  EXPECT_NE(error_of(p).find("line 1"), std::string::npos) << error_of(p);
}

TEST(TokenFile, ClientCandidatesFollowTheDocumentedOrder) {
  ::setenv("DDP_TOKEN_FILE", "/x/token", 1);
  ::setenv("XDG_CONFIG_HOME", "/cfg", 1);
  auto c = client_token_candidates();
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0], "/x/token");
  EXPECT_EQ(c[1], "/cfg/ddpctl/token");
  EXPECT_EQ(c[2], "/etc/ddpctl/token");
  ::unsetenv("DDP_TOKEN_FILE");
  ::unsetenv("XDG_CONFIG_HOME");
}

// A FIFO where the token file should be (root's `sudo -E ddpctl` takes the path from the user's
// environment) is refused at once: a blocking open would wait for a writer for ever. Read in a
// child, so that a regression fails here instead of hanging the suite.
TEST(TokenFile, AFifoAtThePathIsRefusedWithoutWaiting) {
  TempDir d;
  const auto p = (d.path / "token").string();
  ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) ::_exit(error_of(p).find("is not a regular file") != std::string::npos ? 0 : 1);
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 200 && done == 0; ++i) {  // 20 s: the answer takes microseconds
    done = ::waitpid(pid, &status, WNOHANG);
    if (done == 0) ::usleep(100'000);
  }
  if (done == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL() << "load_token_file waited on the FIFO";
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "exit " << WEXITSTATUS(status);
}

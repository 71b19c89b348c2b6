// libsystemd loaded on first use (common/systemd.hpp): this test links the library as well, so the
// build link-checks it, and the functions loaded must be that library's own. The notifier's path
// through the loaded library is exercised against a datagram socket of our own.
#include "common/systemd.hpp"
#include "sdnotify/sdnotify.hpp"

#include <gtest/gtest.h>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

namespace {

TEST(SystemdLazy, LoadsDebiansLibsystemd) {
  const auto* sd = ddp::systemd::api();
  ASSERT_NE(sd, nullptr) << ddp::systemd::load_error();
  EXPECT_TRUE(ddp::systemd::load_error().empty());
  // Linked here too: the loader hands back the one copy of the library, so the addresses agree.
  EXPECT_EQ(sd->journal_sendv, &::sd_journal_sendv);
  EXPECT_EQ(sd->notify, &::sd_notify);
  EXPECT_EQ(sd->watchdog_enabled, &::sd_watchdog_enabled);
  EXPECT_EQ(ddp::systemd::api(), sd);  // loaded once
}

TEST(SystemdLazy, NotifierSpeaksThroughTheLoadedLibrary) {
  auto dir = std::filesystem::temp_directory_path() / ("ddp-sdnotify-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "notify").string();
  int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  ASSERT_LT(path.size(), sizeof sa.sun_path);
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0) << std::strerror(errno);
  ::setenv("NOTIFY_SOCKET", path.c_str(), 1);
  ::setenv("WATCHDOG_USEC", "4000000", 1);
  ::setenv("WATCHDOG_PID", std::to_string(::getpid()).c_str(), 1);
  ddp::sdnotify::Notifier n;
  EXPECT_TRUE(n.active());
  EXPECT_EQ(n.watchdog_interval(), std::chrono::seconds(2));
  n.ready("serving");  // sd_notify reads NOTIFY_SOCKET at each call
  ::unsetenv("NOTIFY_SOCKET");
  ::unsetenv("WATCHDOG_USEC");
  ::unsetenv("WATCHDOG_PID");
  char buf[256];
  // The datagram is queued before sd_notify returns: a blocking read cannot wait for nothing.
  ssize_t got = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
  ASSERT_GT(got, 0) << std::strerror(errno);
  EXPECT_EQ(std::string(buf, static_cast<std::size_t>(got)), "READY=1\nSTATUS=serving");
  ::close(fd);
  std::filesystem::remove_all(dir);
}

}  // namespace

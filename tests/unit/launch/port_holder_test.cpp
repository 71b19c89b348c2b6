// Who holds a store port (launch/port_holder.hpp): /proc/net texts parsed, and a live lookup of
// a port and a control socket this test holds itself.
#include "launch/port_holder.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>

using namespace ddp::launch;

TEST(PortHolder, ListeningInodesFromProcNetTcp) {
  const char* tcp =
      "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
      "   0: 0100007F:7436 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0 100 0 0 10 "
      "0\n"
      "   1: 0100007F:7436 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 5151 1 0 20 4 30 10 "
      "-1\n"
      "   2: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 77 1 0 100 0 0 10 0\n"
      "   3: garbage\n";
  EXPECT_EQ(listening_inodes(tcp, 29750), (std::set<unsigned long>{4242}));  // 0x7436; the established one is not
  EXPECT_EQ(listening_inodes(tcp, 22), (std::set<unsigned long>{77}));
  EXPECT_TRUE(listening_inodes(tcp, 1).empty());
  EXPECT_TRUE(listening_inodes("", 22).empty());
}

TEST(PortHolder, ControlJobsFromProcNetUnix) {
  const char* unix_text =
      "Num       RefCount Protocol Flags    Type St Inode Path\n"
      "0000000000000000: 00000002 00000000 00010000 0001 01 900 /run/user/0/ddpctl/train-1.sock\n"
      "0000000000000000: 00000002 00000000 00010000 0001 01 901 /run/user/0/ddpctl/other.sock\n"
      "0000000000000000: 00000002 00000000 00010000 0001 01 902 /elsewhere/x.sock\n"
      "0000000000000000: 00000003 00000000 00000000 0001 03 903\n";
  EXPECT_EQ(control_jobs(unix_text, {900, 902, 903}, "/run/user/0/ddpctl"), (std::vector<std::string>{"train-1"}));
  EXPECT_TRUE(control_jobs(unix_text, {}, "/run/user/0/ddpctl").empty());
}

TEST(PortHolder, FindsThisProcessAndItsJob) {
  const int tcp = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(tcp, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(tcp, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(tcp, 1), 0);
  socklen_t len = sizeof a;
  ::getsockname(tcp, reinterpret_cast<sockaddr*>(&a), &len);
  const auto port = ntohs(a.sin_port);

  char tmpl[] = "/tmp/port-holder-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  const int ctl = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un u{};
  u.sun_family = AF_UNIX;
  std::snprintf(u.sun_path, sizeof u.sun_path, "%s/my-job.sock", dir.c_str());
  ASSERT_EQ(::bind(ctl, reinterpret_cast<sockaddr*>(&u), sizeof u), 0);
  ASSERT_EQ(::listen(ctl, 1), 0);

  auto h = find_port_holder(port, dir);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->pid, ::getpid());
  EXPECT_EQ(h->job_id, "my-job");
  EXPECT_EQ(describe(*h).rfind("job my-job (pid " + std::to_string(::getpid()) + ": ", 0), 0u) << describe(*h);
  ::close(ctl);
  ::close(tcp);
  EXPECT_FALSE(find_port_holder(port, dir));  // nobody listens now
  std::filesystem::remove_all(dir);
}

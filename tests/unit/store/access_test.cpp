// Who may connect to a job's store: the pure decision, exhaustively; the kernel lookups
// (sock_diag and /proc) against real sockets on loopback held by processes of other uids; the
// server refusing another uid's connection while serving root and the job's user.
#include "loopback.hpp"

#include "store/access.hpp"
#include "store/peers.hpp"
#include "store/protocol.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <grp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

using namespace ddp::store;
using namespace ddp::store::testing;
using boost::asio::ip::address;
using boost::asio::ip::make_address;
using boost::asio::ip::tcp;

namespace {

constexpr uid_t kJob = 4242;
constexpr uid_t kNobody = 65534;

std::vector<address> addrs(std::initializer_list<const char*> list) {
  std::vector<address> out;
  for (const char* a : list) out.push_back(make_address(a));
  return out;
}

AccessDecision decide(const char* peer, const std::vector<address>& host, std::optional<SocketOwner> owner,
                      const std::vector<address>& nodes) {
  return decide_access(make_address(peer), host, owner, kJob, nodes);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The decision

TEST(StoreAccessDecision, FromThisHostOnlyTheJobsUserAndRoot) {
  const auto host = addrs({"10.0.0.1", "fd00::1"});
  const auto nodes = addrs({"10.0.0.1", "10.0.0.2", "fd00::2"});
  // Every way of being on this host: loopback (any of 127/8, ::1, v4-mapped), an own address
  // (listed as a node or not), or a client socket the kernel shows here.
  for (const char* peer :
       {"127.0.0.1", "127.9.9.9", "::1", "::ffff:127.0.0.1", "10.0.0.1", "::ffff:10.0.0.1", "fd00::1"}) {
    SCOPED_TRACE(peer);
    for (bool listed : {false, true}) {
      const auto& n = listed ? nodes : std::vector<address>{};
      EXPECT_TRUE(decide(peer, host, SocketOwner{0, true}, n).allowed);
      EXPECT_TRUE(decide(peer, host, SocketOwner{kJob, true}, n).allowed);
      const auto other = decide(peer, host, SocketOwner{kNobody, true}, n);
      EXPECT_FALSE(other.allowed);
      EXPECT_TRUE(other.local);
      EXPECT_NE(other.why.find("uid 65534"), std::string::npos) << other.why;
      EXPECT_NE(other.why.find("uid 4242"), std::string::npos) << other.why;
      // A socket no process holds any more shows as root's: never taken for root.
      EXPECT_FALSE(decide(peer, host, SocketOwner{0, false}, n).allowed);
      EXPECT_FALSE(decide(peer, host, SocketOwner{kJob, false}, n).allowed);
      // Unknown owner: refused, not guessed.
      const auto unknown = decide(peer, host, std::nullopt, n);
      EXPECT_FALSE(unknown.allowed);
      EXPECT_TRUE(unknown.local);
    }
  }
}

TEST(StoreAccessDecision, AKernelSocketMakesItLocalWhateverTheAddress) {
  // An address this host answers for but getifaddrs did not list (an AnyIP route, a race with
  // an address change): the kernel holding the client socket here is what counts.
  const auto nodes = addrs({"10.0.0.2"});
  EXPECT_FALSE(decide("10.0.0.2", {}, SocketOwner{kNobody, true}, nodes).allowed);
  EXPECT_TRUE(decide("10.0.0.2", {}, SocketOwner{kJob, true}, nodes).allowed);
  EXPECT_TRUE(decide("10.0.0.2", {}, SocketOwner{kJob, true}, nodes).local);
}

TEST(StoreAccessDecision, FromOtherHostsOnlyTheJobsNodes) {
  const auto host = addrs({"10.0.0.1"});
  const auto nodes = addrs({"10.0.0.1", "10.0.0.2", "fd00::2"});
  for (const char* peer : {"10.0.0.2", "::ffff:10.0.0.2", "fd00::2"}) {
    SCOPED_TRACE(peer);
    const auto d = decide(peer, host, std::nullopt, nodes);
    EXPECT_TRUE(d.allowed);
    EXPECT_FALSE(d.local);
  }
  for (const char* peer : {"10.0.0.3", "fd00::3", "::ffff:10.0.0.3", "0.0.0.0"}) {
    SCOPED_TRACE(peer);
    const auto d = decide(peer, host, std::nullopt, nodes);
    EXPECT_FALSE(d.allowed);
    EXPECT_NE(d.why.find("not one of this job's nodes"), std::string::npos);
  }
  EXPECT_FALSE(decide("10.0.0.2", host, std::nullopt, {}).allowed);  // no nodes listed: nobody remote
}

TEST(StoreAccessDecision, RootJobsAcceptRootOnly) {
  const auto d = decide_access(make_address("127.0.0.1"), {}, SocketOwner{kJob, true}, 0, {});
  EXPECT_FALSE(d.allowed);
  EXPECT_TRUE(decide_access(make_address("127.0.0.1"), {}, SocketOwner{0, true}, 0, {}).allowed);
}

TEST(StoreAccessDecision, HostAddressesIncludeLoopback) {
  const auto host = host_addresses();
  EXPECT_NE(std::find(host.begin(), host.end(), make_address("127.0.0.1")), host.end());
}

// ---------------------------------------------------------------------------------------------
// The kernel's answer, against real sockets held by processes of other uids

namespace {

// A child process that runs as `uid`: connects to 127.0.0.1:port, writes `request`, and then
// reports through its exit status: 0 the server closed the connection without an answer, 1 it
// answered (`answer_bytes` arrived), 2 something else. With `hold`, it stays connected until
// the parent closes `release` (its client port is written to `ready` first).
struct Child {
  pid_t pid = -1;
  int ready = -1, release = -1;
  uint16_t client_port = 0;

  static Child start(uid_t uid, uint16_t port, const std::string& request, std::size_t answer_bytes, bool hold) {
    int up[2], down[2];
    if (::pipe(up) != 0 || ::pipe(down) != 0) throw std::runtime_error("pipe");
    Child c;
    c.pid = ::fork();
    if (c.pid < 0) throw std::runtime_error("fork");
    if (c.pid == 0) {
      // Only async-signal-safe calls from here: the parent has threads.
      ::close(up[0]);
      ::close(down[1]);
      gid_t gid = uid;
      if (::setgroups(0, nullptr) != 0 || ::setgid(gid) != 0 || ::setuid(uid) != 0) ::_exit(3);
      int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(port);
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) ::_exit(4);
      sockaddr_in me{};
      socklen_t len = sizeof me;
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len);
      uint16_t my_port = ntohs(me.sin_port);
      if (::write(up[1], &my_port, sizeof my_port) != sizeof my_port) ::_exit(5);
      if (hold) {
        char b;
        while (::read(down[0], &b, 1) < 0 && errno == EINTR) {
        }
      }
      timeval tv{10, 0};
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      if (!request.empty() && ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) < 0) ::_exit(0);
      if (answer_bytes == 0) ::_exit(2);
      char buf[64];
      std::size_t got = 0;
      while (got < answer_bytes) {
        ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n == 0 || (n < 0 && errno == ECONNRESET)) ::_exit(0);
        if (n < 0) ::_exit(2);
        got += static_cast<std::size_t>(n);
      }
      ::_exit(1);
    }
    ::close(up[1]);
    ::close(down[0]);
    c.ready = up[0];
    c.release = down[1];
    if (::read(c.ready, &c.client_port, sizeof c.client_port) != sizeof c.client_port) c.client_port = 0;
    return c;
  }

  // Lets a holding child go on; returns its exit status (-1 if it did not exit normally).
  int finish() {
    if (release >= 0) ::close(release);
    release = -1;
    int status = 0;
    ::waitpid(pid, &status, 0);
    pid = -1;
    if (ready >= 0) ::close(ready);
    ready = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  ~Child() {
    if (pid > 0) finish();
  }
};

std::string set_then_get() {
  Request set, get;
  set.op = Op::set;
  set.key = "/k";
  set.value = "v";
  get.op = Op::get;
  get.key = "/k";
  return encode_request(Protocol::v1, set) + encode_request(Protocol::v1, get);
}

}  // namespace

class StoreAccessKernel : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to run clients as other uids";
  }
};

TEST_F(StoreAccessKernel, SockDiagAndProcNameTheClientSocketsUid) {
  // A plain listener (not the store): the child holds its client socket while we ask.
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(lfd, 8), 0);
  socklen_t len = sizeof a;
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
  const uint16_t port = ntohs(a.sin_port);

  Child c = Child::start(kNobody, port, "", 0, true);
  ASSERT_NE(c.client_port, 0);
  const tcp::endpoint client(make_address("127.0.0.1"), c.client_port), server(make_address("127.0.0.1"), port);
  bool failed = true;
  auto diag = owner_by_sock_diag(client, server, failed);
  EXPECT_FALSE(failed);
  ASSERT_TRUE(diag.has_value());
  EXPECT_EQ(diag->uid, kNobody);
  EXPECT_TRUE(diag->held);
  auto proc = owner_by_proc_net(client, server);
  ASSERT_TRUE(proc.has_value());
  EXPECT_EQ(proc->uid, kNobody);
  EXPECT_TRUE(proc->held);
  // v4-mapped forms (a dual-stack server's view) find the same socket.
  const tcp::endpoint mapped(make_address("::ffff:127.0.0.1"), c.client_port);
  auto diag_mapped = owner_by_sock_diag(mapped, tcp::endpoint(make_address("::ffff:127.0.0.1"), port), failed);
  ASSERT_TRUE(diag_mapped.has_value());
  EXPECT_EQ(diag_mapped->uid, kNobody);

  // The child exits, its socket is no process's: it never reads as root's and held.
  EXPECT_EQ(c.finish(), 2);
  auto gone = client_socket_owner(client, server);
  EXPECT_TRUE(!gone || !gone->held);
  ::close(lfd);
}

TEST_F(StoreAccessKernel, ALookupByPortNeverReturnsAListener) {
  // The kernel's exact lookup falls back to listeners: a remote client whose source port is the
  // port of a wildcard listener here (root's) would read as "root on this host".
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(lfd, 8), 0);
  socklen_t len = sizeof a;
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
  const tcp::endpoint remote_client(make_address("192.0.2.7"), ntohs(a.sin_port));
  const tcp::endpoint server(make_address("127.0.0.1"), 29999);
  bool failed = true;
  EXPECT_EQ(owner_by_sock_diag(remote_client, server, failed), std::nullopt);
  EXPECT_FALSE(failed);
  EXPECT_EQ(owner_by_proc_net(remote_client, server), std::nullopt);
  ::close(lfd);
}

TEST_F(StoreAccessKernel, ServerRefusesAnotherUidOverLoopbackAndServesTheJobsUserAndRoot) {
  ServerThread st({.host = "127.0.0.1", .port = 0, .job_uid = kJob});
  const std::string request = set_then_get();
  const std::size_t answer = 8 + 1;  // GET's u64 length + "v"

  Child other = Child::start(kNobody, st.port(), request, answer, false);
  EXPECT_EQ(other.finish(), 0) << "uid 65534 was served by a store of uid 4242's job";
  EXPECT_EQ(st.call([&] { return st.server().stats().refused; }), 1u);
  EXPECT_EQ(st.call([&] { return st.server().stats().accepted; }), 0u);

  Child job = Child::start(kJob, st.port(), request, answer, false);
  EXPECT_EQ(job.finish(), 1) << "the job's own user was not served";

  RawClient root(st.port());  // this test runs as root
  root.send(request);
  EXPECT_EQ(root.recv(answer), std::string("\x01\0\0\0\0\0\0\0v", 9));
  EXPECT_EQ(st.call([&] { return st.server().stats().accepted; }), 2u);
}

TEST_F(StoreAccessKernel, ServerOfANonRootJobRefusesEveryOtherUser) {
  // The default job uid is the server's own (ddpctl's for local jobs, `store serve`): here root,
  // so only root may connect.
  ServerThread st({.host = "127.0.0.1", .port = 0});
  Child job = Child::start(kJob, st.port(), set_then_get(), 9, false);
  EXPECT_EQ(job.finish(), 0);
  RawClient root(st.port());
  root.send(set_then_get());
  EXPECT_EQ(root.recv(9).size(), 9u);
}

TEST(StoreAccessKernelKept, OneNetlinkSocketAnswersEveryLookupInTurn) {
  // The store keeps one sock_diag socket for all its accepts: each answer must be its own
  // question's, found, not found and found again, alternating (a reply read for the wrong
  // question would name the wrong user).
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(lfd, 64), 0);
  socklen_t len = sizeof a;
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
  const uint16_t port = ntohs(a.sin_port);
  const tcp::endpoint server(make_address("127.0.0.1"), port);
  std::vector<int> fds;
  std::vector<uint16_t> ports;
  for (int i = 0; i < 32; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    sockaddr_in me{};
    socklen_t ml = sizeof me;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &ml);
    fds.push_back(fd);
    ports.push_back(ntohs(me.sin_port));
  }
  SockDiag kept;
  for (int round = 0; round < 2; ++round) {
    for (std::size_t i = 0; i < ports.size(); ++i) {
      bool failed = true;
      auto got = kept.owner(tcp::endpoint(make_address("127.0.0.1"), ports[i]), server, failed);
      EXPECT_FALSE(failed);
      ASSERT_TRUE(got.has_value()) << "client " << i << ", round " << round;
      EXPECT_EQ(got->uid, ::geteuid());
      EXPECT_TRUE(got->held);
      // A client port nobody holds, between two that exist: not found, and no error.
      got = kept.owner(tcp::endpoint(make_address("127.0.0.2"), ports[i]), server, failed);
      EXPECT_FALSE(failed);
      EXPECT_EQ(got, std::nullopt);
      EXPECT_EQ(client_socket_owner(kept, tcp::endpoint(make_address("127.0.0.1"), ports[i]), server)->uid,
                ::geteuid());
    }
  }
  for (int fd : fds) ::close(fd);
  ::close(lfd);
}

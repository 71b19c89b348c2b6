// The accept policy (net/acceptor.hpp): the cap on unauthenticated connections (the oldest goes),
// the backoff while accept() fails for want of resources, and the Asio loop around them under a
// real descriptor limit.
#include "net/acceptor.hpp"

#include "common/log.hpp"

#include <gtest/gtest.h>
#include <boost/asio.hpp>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

namespace ddp::net {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using std::chrono::milliseconds;

boost::system::error_code sys(int e) {
  return {e, boost::system::system_category()};
}

TEST(PendingSet, KeepsAtMostCapAndEvictsTheOldest) {
  PendingSet s(3);
  auto a = s.admit(), b = s.admit(), c = s.admit();
  EXPECT_FALSE(a.evicted || b.evicted || c.evicted);
  EXPECT_EQ(s.size(), 3u);
  auto d = s.admit();
  ASSERT_TRUE(d.evicted);
  EXPECT_EQ(*d.evicted, a.id);  // the oldest, never the newcomer
  EXPECT_EQ(s.size(), 3u);
  // b authenticates: its place is free, the next one evicts nobody.
  EXPECT_TRUE(s.release(b.id));
  EXPECT_FALSE(s.admit().evicted);
  // An evicted id is no longer held: releasing it again changes nothing.
  EXPECT_FALSE(s.release(a.id));
  auto f = s.admit();
  ASSERT_TRUE(f.evicted);
  EXPECT_EQ(*f.evicted, c.id);
}

TEST(PendingSet, PopOldestEmptiesInOrder) {
  PendingSet s(10);
  auto a = s.admit(), b = s.admit();
  EXPECT_EQ(s.pop_oldest(), a.id);
  EXPECT_EQ(s.pop_oldest(), b.id);
  EXPECT_EQ(s.pop_oldest(), std::nullopt);
  EXPECT_EQ(PendingSet(0).cap(), 1u);  // a cap of 0 would refuse everyone, honest peers too
}

TEST(PendingCap, AQuarterOfTheDescriptorsAtMost) {
  EXPECT_EQ(pending_cap(128, 1024), 128u);
  EXPECT_EQ(pending_cap(128, 64), 16u);  // the reported case: RLIMIT_NOFILE 64
  EXPECT_EQ(pending_cap(128, 8), 4u);
  EXPECT_EQ(pending_cap(0, 1024), 1u);
  EXPECT_EQ(pending_cap(128, UINT64_MAX), 128u);
}

TEST(AcceptError, ResourcesWaitOtherFailuresGoOn) {
  for (int e : {EMFILE, ENFILE, ENOBUFS, ENOMEM, EBADF})
    EXPECT_EQ(classify_accept_error(sys(e)), AcceptError::resources) << e;
  for (int e : {ECONNABORTED, EPROTO, EPERM, EINTR})
    EXPECT_EQ(classify_accept_error(sys(e)), AcceptError::per_connection) << e;
  EXPECT_EQ(classify_accept_error(asio::error::operation_aborted), AcceptError::aborted);
  EXPECT_TRUE(out_of_descriptors(sys(EMFILE)));
  EXPECT_TRUE(out_of_descriptors(sys(ENFILE)));
  EXPECT_FALSE(out_of_descriptors(sys(ENOBUFS)));
}

TEST(AcceptBackoff, DoublesToTheMaximumWarnsOnceAndResets) {
  AcceptBackoff b(milliseconds(50), milliseconds(300));
  auto s1 = b.failed();
  EXPECT_EQ(s1.delay, milliseconds(50));
  EXPECT_TRUE(s1.starts_episode);
  auto s2 = b.failed();
  EXPECT_EQ(s2.delay, milliseconds(100));
  EXPECT_FALSE(s2.starts_episode);
  EXPECT_EQ(b.failed().delay, milliseconds(200));
  EXPECT_EQ(b.failed().delay, milliseconds(300));
  EXPECT_EQ(b.failed().delay, milliseconds(300));
  EXPECT_EQ(b.succeeded(), 5u);
  EXPECT_EQ(b.succeeded(), 0u);  // no episode going on
  auto again = b.failed();
  EXPECT_EQ(again.delay, milliseconds(50));
  EXPECT_TRUE(again.starts_episode);
}

// Lowers this process's soft RLIMIT_NOFILE for a scope.
class NofileLimit {
 public:
  explicit NofileLimit(rlim_t soft) {
    ::getrlimit(RLIMIT_NOFILE, &old_);
    rlimit now = old_;
    now.rlim_cur = soft;
    ok_ = ::setrlimit(RLIMIT_NOFILE, &now) == 0;
  }
  ~NofileLimit() { ::setrlimit(RLIMIT_NOFILE, &old_); }
  bool ok() const { return ok_; }

 private:
  rlimit old_{};
  bool ok_ = false;
};

// The descriptor limit that leaves exactly `room` descriptors free for new files: the kernel
// hands out the lowest free number, below the soft limit (holes count, numbers above do not).
rlim_t limit_with_room(int room) {
  int free_seen = 0;
  for (int fd = 0; fd < 65536; ++fd) {
    if (::fcntl(fd, F_GETFD) == -1 && ++free_seen > room) return static_cast<rlim_t>(fd);
  }
  return 65536;
}

struct Listener {
  asio::io_context io;
  tcp::acceptor acceptor{io, tcp::endpoint(asio::ip::address_v4::loopback(), 0)};
  std::vector<tcp::socket> clients;
  void connect(int n) {
    for (int i = 0; i < n; ++i) {
      clients.emplace_back(io);
      clients.back().connect(acceptor.local_endpoint());  // completes in the backlog, unaccepted
    }
  }
};

// Out of descriptors with nothing to evict: the loop waits between tries instead of spinning,
// and takes the waiting connections once descriptors are back.
TEST(Acceptor, BacksOffWhileOutOfDescriptorsThenAcceptsTheBacklog) {
  Listener l;
  l.connect(20);
  std::vector<tcp::socket> kept;  // accepted and kept: established peers, say
  Acceptor<tcp> loop(l.acceptor, "test listener", log::get("net"), [&](tcp::socket s) { kept.push_back(std::move(s)); },
                     {.max_pending = 128, .backoff_first = milliseconds(20), .backoff_max = milliseconds(100)});
  {
    NofileLimit limit(limit_with_room(2));  // room for 2 accepted sockets
    ASSERT_TRUE(limit.ok());
    loop.start();
    l.io.run_for(milliseconds(500));
    EXPECT_EQ(kept.size(), 2u);
    // Immediate re-arming made hundreds of thousands of failed accepts in this time; waiting
    // 20, 40, 80, 100, 100 ... ms makes a handful.
    EXPECT_GE(loop.gate().failures(), 2u);
    EXPECT_LE(loop.gate().failures(), 10u);
  }
  // Descriptors are back: the next try takes the rest of the backlog.
  for (int i = 0; i < 100 && kept.size() < 20; ++i) l.io.run_one_for(milliseconds(200));
  EXPECT_EQ(kept.size(), 20u);
}

// Out of descriptors while unauthenticated connections are held: the oldest is closed and the
// newcomer accepted at once.
TEST(Acceptor, OutOfDescriptorsEvictsTheOldestUnauthenticated) {
  Listener l;
  l.connect(6);
  std::vector<std::shared_ptr<tcp::socket>> pending;
  std::vector<std::shared_ptr<void>> slots;
  std::vector<int> evicted;
  std::unique_ptr<Acceptor<tcp>> loop;
  loop = std::make_unique<Acceptor<tcp>>(l.acceptor, "test listener", log::get("net"), [&](tcp::socket s) {
    auto sock = std::make_shared<tcp::socket>(std::move(s));
    const int index = static_cast<int>(pending.size());
    pending.push_back(sock);
    slots.push_back(loop->admit([&evicted, sock, index] {
      evicted.push_back(index);
      boost::system::error_code ignored;
      sock->close(ignored);
    }));
  });
  NofileLimit limit(limit_with_room(2));
  ASSERT_TRUE(limit.ok());
  loop->start();
  for (int i = 0; i < 100 && pending.size() < 6; ++i) l.io.run_one_for(milliseconds(200));
  ASSERT_EQ(pending.size(), 6u);
  // Two descriptors' room: each newcomer after the first two closed the oldest still open.
  EXPECT_EQ(evicted, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(loop->gate().evicted(), 4u);
  EXPECT_EQ(loop->gate().failures(), 0u);  // no backoff was needed
}

// The cap: the (cap+1)th unauthenticated connection closes the oldest; an authenticated one
// (its slot dropped) no longer counts.
TEST(Acceptor, CapEvictsTheOldestAndReleasedSlotsFreeRoom) {
  Listener l;
  l.connect(5);
  std::vector<std::shared_ptr<void>> slots;
  std::vector<int> evicted;
  std::unique_ptr<Acceptor<tcp>> loop;
  int accepted = 0;
  loop = std::make_unique<Acceptor<tcp>>(
      l.acceptor, "test listener", log::get("net"),
      [&](tcp::socket) {
        const int index = accepted++;
        slots.push_back(loop->admit([&evicted, index] { evicted.push_back(index); }));
        if (index == 1) slots.back().reset();  // the second authenticates at once
      },
      AcceptorLimits{.max_pending = 2});
  loop->start();
  for (int i = 0; i < 100 && accepted < 5; ++i) l.io.run_one_for(milliseconds(200));
  ASSERT_EQ(accepted, 5);
  // Held after each: {0}, {0} (1 authenticated), {0,2}, {2,3} (0 evicted), {3,4} (2 evicted).
  EXPECT_EQ(evicted, (std::vector<int>{0, 2}));
  EXPECT_EQ(loop->gate().pending(), 2u);
}

}  // namespace
}  // namespace ddp::net

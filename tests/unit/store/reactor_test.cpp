// The store's epoll loop (lib/store/reactor.hpp) over real socket pairs: the edge-triggered
// contract the server's read and write paths rely on, posted work, and handler lifetimes.
#include "store/reactor.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using ddp::store::Reactor;

namespace {

struct Pair {
  int ours = -1, theirs = -1;
  Pair() {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
      throw std::runtime_error("socketpair");
    ours = sv[0];
    theirs = sv[1];
  }
  ~Pair() {
    if (ours >= 0) ::close(ours);
    if (theirs >= 0) ::close(theirs);
  }
  Pair(const Pair&) = delete;
  Pair& operator=(const Pair&) = delete;
};

struct Recorder final : Reactor::Handler {
  std::vector<uint32_t> events;
  std::function<void(uint32_t)> also;
  void on_events(uint32_t e) noexcept override {
    events.push_back(e);
    if (also) also(e);
  }
  int count(uint32_t bit) const {
    int n = 0;
    for (auto e : events) n += (e & bit) ? 1 : 0;
    return n;
  }
};

void send_byte(int fd) {
  ASSERT_EQ(::write(fd, "x", 1), 1);
}

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

// A reactor with one socket pair's end registered and the registration's event delivered.
struct Registered {
  Reactor r;
  Pair p;
  Recorder h;
  Registered() {
    r.add(p.ours, h);
    r.poll();
  }
};

}  // namespace

TEST(StoreReactor, AnEventComesOncePerChangeNotWhileTheStateLasts) {
  Registered t;
  auto& [r, p, h] = t;
  // Registration: writable, nothing to read.
  ASSERT_EQ(h.events.size(), 1u);
  EXPECT_TRUE(h.events[0] & EPOLLOUT);
  EXPECT_FALSE(h.events[0] & EPOLLIN);

  send_byte(p.theirs);
  r.poll();
  ASSERT_EQ(h.count(EPOLLIN), 1);
  r.poll();  // the byte is still unread: level-triggered would repeat it, edge-triggered does not
  r.poll();
  EXPECT_EQ(h.count(EPOLLIN), 1);
}

// The store stops reading when recv() comes up short; that is safe only because every arrival
// raises an edge, also while earlier bytes are still unread.
TEST(StoreReactor, EveryArrivalRaisesAnEdgeEvenWithBytesUnread) {
  Registered t;
  auto& [r, p, h] = t;
  for (int i = 1; i <= 3; ++i) {
    send_byte(p.theirs);
    r.poll();
    EXPECT_EQ(h.count(EPOLLIN), i);
  }
  char buf[8];
  EXPECT_EQ(::read(p.ours, buf, sizeof buf), 3);
}

// The exception to the short-read rule: an end of input queued behind data is announced on the
// same event (EPOLLRDHUP) and raises no edge of its own after a short read, so the store reads on
// until recv() says 0 once an event carried it.
TEST(StoreReactor, AnEndOfInputQueuedBehindDataRaisesNoEdgeOfItsOwn) {
  Registered t;
  auto& [r, p, h] = t;
  send_byte(p.theirs);
  ASSERT_EQ(::shutdown(p.theirs, SHUT_WR), 0);
  r.poll();
  ASSERT_EQ(h.events.size(), 2u);
  EXPECT_TRUE(h.events[1] & EPOLLIN);
  EXPECT_TRUE(h.events[1] & EPOLLRDHUP);
  char buf[8];
  EXPECT_EQ(::recv(p.ours, buf, sizeof buf, 0), 1);  // short
  r.poll();
  EXPECT_EQ(h.events.size(), 2u) << "no new edge for the end of input";
  EXPECT_EQ(::recv(p.ours, buf, sizeof buf, 0), 0);  // yet it is there
}

TEST(StoreReactor, WritableAgainOnlyAfterASendCameUpShortAndRoomWasMade) {
  Registered t;
  auto& [r, p, h] = t;
  ASSERT_EQ(h.count(EPOLLOUT), 1);
  const std::string chunk(4096, 'y');
  std::size_t sent = 0;
  for (;;) {
    const ssize_t n = ::send(p.ours, chunk.data(), chunk.size(), MSG_NOSIGNAL);
    if (n < 0) {
      ASSERT_TRUE(errno == EAGAIN || errno == EWOULDBLOCK) << errno;
      break;
    }
    sent += static_cast<std::size_t>(n);
  }
  r.poll();
  EXPECT_EQ(h.count(EPOLLOUT), 1) << "full, not writable";
  std::vector<char> sink(sent);
  std::size_t got = 0;
  while (got < sent) {
    const ssize_t n = ::read(p.theirs, sink.data(), sink.size() - got);
    ASSERT_GT(n, 0);
    got += static_cast<std::size_t>(n);
  }
  r.poll();
  EXPECT_EQ(h.count(EPOLLOUT), 2);
}

TEST(StoreReactor, ThePeerClosingIsAnEvent) {
  Registered t;
  auto& [r, p, h] = t;
  ::close(p.theirs);
  p.theirs = -1;
  r.poll();
  ASSERT_EQ(h.events.size(), 2u);
  EXPECT_TRUE(h.events[1] & (EPOLLRDHUP | EPOLLHUP));
}

TEST(StoreReactor, RemovedDescriptorsRaiseNothing) {
  Registered t;
  auto& [r, p, h] = t;
  r.remove(p.ours);
  send_byte(p.theirs);
  r.poll();
  EXPECT_EQ(h.events.size(), 1u);
}

// A batch that holds events for two handlers, the first of which removes and lets go of both:
// the second's event is still delivered (the kernel gave it already), to a handler that retire()
// kept alive until the batch ended.
TEST(StoreReactor, ARetiredHandlerLivesUntilItsBatchEnds) {
  struct Owned final : Reactor::Handler {
    std::function<void()> fn;
    bool* destroyed;
    explicit Owned(bool* d) : destroyed(d) {}
    ~Owned() { *destroyed = true; }
    void on_events(uint32_t) noexcept override { fn(); }
  };
  Reactor r;
  Pair a, b;
  bool a_gone = false, b_gone = false;
  auto ha = std::make_shared<Owned>(&a_gone);
  auto hb = std::make_shared<Owned>(&b_gone);
  int delivered = 0;
  auto retire_both = [&] {
    ++delivered;
    EXPECT_FALSE(a_gone);
    EXPECT_FALSE(b_gone);
    if (!ha) return;
    r.remove(a.ours);
    r.remove(b.ours);
    r.retire(std::move(ha));
    r.retire(std::move(hb));
  };
  ha->fn = retire_both;
  hb->fn = retire_both;
  r.add(a.ours, *ha);
  r.add(b.ours, *hb);
  // Both registrations are writable at once: one batch holds both events.
  r.poll();
  EXPECT_EQ(delivered, 2);
  EXPECT_TRUE(a_gone);
  EXPECT_TRUE(b_gone);
}

TEST(StoreReactor, PostedWorkRunsOnTheLoopsThreadInOrderAndStopComesAfterIt) {
  Reactor r;
  std::thread::id loop_thread;
  std::atomic<bool> started{false};
  std::thread t([&] {
    loop_thread = std::this_thread::get_id();
    started = true;
    r.run();
  });
  while (!started) std::this_thread::yield();
  std::vector<int> seen;  // the loop's only
  std::atomic<int> wrong_thread{0};
  constexpr int kPosters = 3, kEach = 500;
  std::vector<std::thread> posters;
  for (int p = 0; p < kPosters; ++p) {
    posters.emplace_back([&, p] {
      for (int i = 0; i < kEach; ++i) {
        r.post([&, v = p * kEach + i] {
          if (std::this_thread::get_id() != loop_thread) ++wrong_thread;
          seen.push_back(v);
        });
      }
    });
  }
  for (auto& p : posters) p.join();
  r.stop();
  t.join();  // returns: stop()'s turn came, after everything posted before it
  EXPECT_EQ(wrong_thread, 0);
  ASSERT_EQ(seen.size(), static_cast<std::size_t>(kPosters * kEach));
  std::vector<int> last(kPosters, -1);
  for (int v : seen) {
    const int p = v / kEach;
    EXPECT_LT(last[p], v) << "poster " << p << " out of order";
    last[p] = v;
  }
}

TEST(StoreReactor, WorkPostedFromPostedWorkRunsToo) {
  Reactor r;
  int depth = 0;
  std::function<void()> again = [&] {
    if (++depth < 5) r.post(again);
  };
  r.post(again);
  for (int i = 0; i < 10 && depth < 5; ++i) r.poll();
  EXPECT_EQ(depth, 5);
}

// How the store's loop lives on the launcher's Asio io_context: the epoll descriptor is readable
// while there is something to deliver; poll() delivers one batch (256 events) and leaves the
// descriptor readable while more wait, so the outer loop serves its own work in between.
TEST(StoreReactor, ItsDescriptorIsReadableWhileWorkWaitsAndPollTakesOneBatch) {
  Reactor r;
  EXPECT_FALSE(readable(r.fd()));
  bool ran = false;
  r.post([&] { ran = true; });
  EXPECT_TRUE(readable(r.fd()));
  r.poll();
  EXPECT_TRUE(ran);
  EXPECT_FALSE(readable(r.fd()));

  constexpr int kPairs = 600;  // more than one batch (256)
  std::vector<std::unique_ptr<Pair>> pairs;
  std::vector<std::unique_ptr<Recorder>> hs;
  for (int i = 0; i < kPairs; ++i) {
    pairs.push_back(std::make_unique<Pair>());
    hs.push_back(std::make_unique<Recorder>());
    r.add(pairs.back()->ours, *hs.back());
  }
  auto delivered = [&] {
    std::size_t n = 0;
    for (auto& h : hs) n += h->events.size();
    return n;
  };
  int polls = 0;
  while (readable(r.fd()) && polls < 10) {
    r.poll();
    ++polls;
    EXPECT_LE(delivered(), static_cast<std::size_t>(256 * polls));
  }
  EXPECT_EQ(polls, 3);  // 256 + 256 + 88
  for (auto& h : hs) ASSERT_EQ(h->events.size(), 1u);
  for (auto& p : pairs) send_byte(p->theirs);
  EXPECT_TRUE(readable(r.fd()));
  r.drain();
  EXPECT_FALSE(readable(r.fd()));
  for (auto& h : hs) EXPECT_EQ(h->count(EPOLLIN), 1);
}

TEST(StoreReactor, UrgentDataIsAnEvent) {
  // A TCP pair over loopback (socketpair has no urgent data).
  int lst = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(lst, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(lst, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(::getsockname(lst, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ASSERT_EQ(::listen(lst, 1), 0);
  int cl = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_EQ(::connect(cl, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  int sv = ::accept4(lst, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  ASSERT_GE(sv, 0);
  Reactor r;
  Recorder h;
  r.add(sv, h);
  r.poll();
  ASSERT_EQ(::send(cl, "!", 1, MSG_OOB), 1);
  for (int i = 0; i < 100 && h.count(EPOLLPRI) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    r.poll();
  }
  EXPECT_EQ(h.count(EPOLLPRI), 1);
  ::close(sv);
  ::close(cl);
  ::close(lst);
}

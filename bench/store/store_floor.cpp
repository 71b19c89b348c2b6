// store_floor: the least a TCPStore server can do for store_load's mix, as a floor to measure
// servers against. It frames requests with the store's own decoder and answers them from the
// connection's own memory: no keyspace, no lock, no waits, no bounds, no logging; ADD on the
// shared counter is one atomic add. What is left is the kernel's part of a request (the
// wake-up, recv, send over loopback) and the decoding; a real server can only be slower.
//
//   store_floor --threads N     N epoll loops, each socket registered once, edge-triggered, a
//                               read until it comes up short, one send for what it produced (the
//                               I/O shape of `ddpctl store serve`); connections dealt in turn
//   store_floor --threads N --shared
//                               N threads on one epoll set: a thread that finds its connections
//                               idle takes another's instead of sleeping (a connection's events
//                               are served by one thread at a time: a claim flag, no re-arming);
//                               --batch K events per epoll_wait (default 256)
//   store_floor --blocking      a thread per connection, blocking in recv(): no epoll_wait at
//                               all, the shortest path a request can take without busy-polling
//
// Prints "listening on 127.0.0.1:PORT" (what bench/store/run.sh waits for) and serves until
// killed. Only SET, GET, ADD, WAIT (on one key the client set) and VALIDATE: anything else
// closes the connection, which store_load reports as a failure.
#include "store/protocol.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace ddp::store;

namespace {

std::atomic<int64_t> g_counter{0};
constexpr std::size_t kChunk = 64 * 1024;

struct Conn {
  int fd = -1;
  // --shared: kBusy while a thread serves it (for good once closed), kAgain when an event came
  // meanwhile.
  std::atomic<uint32_t> state{0};
  Decoder dec;
  std::string last_value;  // GET answers the value this client set last
  std::string out;
};

// Decodes what arrived and appends the replies to c.out. False: close the connection.
bool serve(Conn& c, std::span<const uint8_t> in) {
  while (true) {
    switch (c.dec.next(in)) {
      case Decoder::Status::need_more:
        return true;
      case Decoder::Status::error:
        return false;
      case Decoder::Status::request:
        break;
    }
    const Request& req = c.dec.request();
    switch (req.op) {
      case Op::validate:
      case Op::set:
        if (req.op == Op::set) c.last_value = req.value;
        break;
      case Op::get:
        put_bytes(c.out, c.last_value);
        break;
      case Op::add:
        put_i64(c.out, g_counter.fetch_add(req.number, std::memory_order_relaxed) + req.number);
        break;
      case Op::wait:
        put_u8(c.out, kStopWaiting);
        break;
      default:
        std::fprintf(stderr, "store_floor: %s is not served here\n", std::string(to_string(req.op)).c_str());
        return false;
    }
  }
}

bool send_all(Conn& c) {
  std::size_t off = 0;
  while (off < c.out.size()) {
    // Blocking sockets, or a reply of a few bytes to a client that reads each one: a full send
    // buffer would be a client not reading, which store_load is not.
    const ssize_t n = ::send(c.fd, c.out.data() + off, c.out.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{c.fd, POLLOUT, 0};
      ::poll(&p, 1, -1);
      continue;
    }
    if (n <= 0) return false;
    off += static_cast<std::size_t>(n);
  }
  c.out.clear();
  return true;
}

void blocking_connection(int fd) {
  Conn c;
  c.fd = fd;
  std::vector<uint8_t> buf(kChunk);
  while (true) {
    const ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (!serve(c, std::span<const uint8_t>(buf.data(), static_cast<std::size_t>(n))) || !send_all(c)) break;
  }
  ::close(fd);
}

constexpr uint32_t kBusy = 1, kAgain = 2;
int g_batch = 256;

struct Loop {
  int ep = ::epoll_create1(EPOLL_CLOEXEC);
  bool shared = false;

  void add(int fd) {
    auto* c = new Conn;  // freed when its connection closes
    c->fd = fd;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
    ev.data.ptr = c;
    if (::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) throw std::runtime_error("epoll_ctl");
  }

  // Reads what c has, answers it. False: close it.
  static bool drain(Conn& c, std::vector<uint8_t>& buf) {
    bool more = true;
    while (more) {
      const ssize_t got = ::recv(c.fd, buf.data(), buf.size(), 0);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (got <= 0) return false;
      more = static_cast<std::size_t>(got) == buf.size();  // short: a new edge for what comes next
      if (!serve(c, std::span<const uint8_t>(buf.data(), static_cast<std::size_t>(got)))) return false;
    }
    return send_all(c);
  }

  void run() {
    std::vector<uint8_t> buf(kChunk);
    std::vector<epoll_event> events(static_cast<std::size_t>(g_batch));
    while (true) {
      const int n = ::epoll_wait(ep, events.data(), g_batch, -1);
      for (int i = 0; i < n; ++i) {
        auto* c = static_cast<Conn*>(events[i].data.ptr);
        const bool hup = events[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR);
        if (!shared) {
          if (!drain(*c, buf) || hup) {
            ::close(c->fd);  // leaves the epoll set with it
            delete c;
          }
          continue;
        }
        // Shared set: claim c, or leave a note for the thread serving it. A closed connection's
        // memory is kept (a late event may still name it): the floor runs for minutes.
        uint32_t s = c->state.load();
        bool claimed = false;
        while (!claimed) {
          if (s & kBusy) {
            if (c->state.compare_exchange_weak(s, s | kAgain)) break;
          } else if (c->state.compare_exchange_weak(s, kBusy)) {
            claimed = true;
          }
        }
        if (!claimed) continue;
        for (;;) {
          if (!drain(*c, buf) || hup) {
            // Closed while still claimed, and never let go: a late event for it (taken by
            // another thread before the close) finds it busy and leaves it alone, so no thread
            // touches the descriptor, whose number a new connection may already have.
            ::close(c->fd);
            break;
          }
          uint32_t busy = kBusy;
          if (c->state.compare_exchange_strong(busy, 0)) break;
          c->state.store(kBusy);  // an event came meanwhile: read again
        }
      }
    }
  }
};

}  // namespace

int main(int argc, char** argv) try {
  int threads = 1;
  bool blocking = false, shared = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--blocking") {
      blocking = true;
    } else if (a == "--shared") {
      shared = true;
    } else if (a == "--batch" && i + 1 < argc) {
      g_batch = std::max(1, std::stoi(argv[++i]));
    } else if (a == "--threads" && i + 1 < argc) {
      threads = std::max(1, std::stoi(argv[++i]));
    } else {
      throw std::runtime_error("usage: store_floor [--threads N [--shared] [--batch K] | --blocking]");
    }
  }
  const int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(lfd, 4096) != 0 ||
      ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    throw std::runtime_error(std::string("listen: ") + std::strerror(errno));
  }
  std::printf("listening on 127.0.0.1:%u\n", ntohs(a.sin_port));
  std::fflush(stdout);

  std::vector<std::unique_ptr<Loop>> loops;
  if (!blocking) {
    for (int i = 0; i < (shared ? 1 : threads); ++i) {
      loops.push_back(std::make_unique<Loop>());
      loops.back()->shared = shared;
    }
    for (int i = 0; i < threads; ++i) std::thread([l = loops[i % loops.size()].get()] { l->run(); }).detach();
  }
  for (std::size_t next = 0;; ++next) {
    const int fd = ::accept4(lfd, nullptr, nullptr, blocking ? SOCK_CLOEXEC : SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) continue;
      throw std::runtime_error(std::string("accept: ") + std::strerror(errno));
    }
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (blocking) {
      std::thread(blocking_connection, fd).detach();
    } else {
      loops[next % loops.size()]->add(fd);
    }
  }
} catch (const std::exception& e) {
  std::fprintf(stderr, "store_floor: %s\n", e.what());
  return 2;
}

// The store's epoll loop (reactor.hpp).
#include "store/reactor.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>
#include <utility>

namespace ddp::store {

namespace {

// Events taken per epoll_wait: at 256 busy clients a loop finds tens ready at once; more wait
// for the next call, which comes as soon as these are served.
constexpr int kMaxEvents = 256;

[[noreturn]] void fail(const char* what) {
  throw std::system_error(errno, std::generic_category(), what);
}

}  // namespace

Reactor::Reactor() {
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) fail("store: epoll_create1");
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) {
    const int e = errno;
    ::close(epoll_fd_);
    errno = e;
    fail("store: eventfd");
  }
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLET;
  ev.data.ptr = nullptr;  // the wake-up; every handler's pointer is non-null
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev) != 0) {
    const int e = errno;
    ::close(wake_fd_);
    ::close(epoll_fd_);
    errno = e;
    fail("store: epoll_ctl(eventfd)");
  }
}

Reactor::~Reactor() {
  ::close(wake_fd_);
  ::close(epoll_fd_);
}

void Reactor::add(int fd, Handler& handler) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLPRI | EPOLLET;
  ev.data.ptr = &handler;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) fail("store: epoll_ctl(ADD)");
}

void Reactor::remove(int fd) {
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);  // ENOENT, EBADF: it is not there either way
}

void Reactor::retire(std::shared_ptr<void> what) {
  retired_.push_back(std::move(what));
}

void Reactor::post(std::function<void()> fn) {
  bool wake;
  {
    std::lock_guard lk(mu_);
    posted_.push_back(std::move(fn));
    wake = !std::exchange(signalled_, true);
  }
  if (wake) {
    const uint64_t one = 1;
    // Cannot fail short of a counter at 2^64 - 1; EINTR cannot happen on a non-blocking eventfd.
    [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
  }
}

void Reactor::run_posted() {
  uint64_t count;
  [[maybe_unused]] auto n = ::read(wake_fd_, &count, sizeof count);  // clears the counter
  std::vector<std::function<void()>> now;
  {
    std::lock_guard lk(mu_);
    now.swap(posted_);
    signalled_ = false;  // a post from here on writes the eventfd again
  }
  // The tasks catch what they throw (the store's do); one that did not reaches run()'s or
  // poll()'s caller, and the tasks after it must not be lost meanwhile: they are put back first.
  for (std::size_t i = 0; i < now.size(); ++i) {
    try {
      now[i]();
    } catch (...) {
      {
        std::lock_guard lk(mu_);
        posted_.insert(posted_.begin(), std::make_move_iterator(now.begin() + static_cast<std::ptrdiff_t>(i) + 1),
                       std::make_move_iterator(now.end()));
        signalled_ = true;
      }
      const uint64_t one = 1;
      [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
      throw;
    }
  }
}

int Reactor::run_once(int timeout_ms) {
  epoll_event events[kMaxEvents];
  const int n = ::epoll_wait(epoll_fd_, events, kMaxEvents, timeout_ms);
  if (n < 0) {
    if (errno == EINTR) return 0;
    fail("store: epoll_wait");
  }
  bool woken = false;
  for (int i = 0; i < n; ++i) {
    if (events[i].data.ptr == nullptr) {
      woken = true;
      continue;
    }
    static_cast<Handler*>(events[i].data.ptr)->on_events(events[i].events);
  }
  if (woken) run_posted();
  retired_.clear();
  return n;
}

void Reactor::run() {
  while (!stopping_) run_once(-1);
  stopping_ = false;
}

void Reactor::stop() {
  post([this] { stopping_ = true; });
}

void Reactor::poll() {
  // One batch, so that the loop nesting this one serves its own work between batches. What is
  // left in the ready list keeps fd() readable: Asio's next async_wait on it re-registers it
  // (EPOLL_CTL_MOD), which reports readiness that is already there.
  run_once(0);
}

void Reactor::drain() {
  while (run_once(0) > 0) {
  }
}

}  // namespace ddp::store

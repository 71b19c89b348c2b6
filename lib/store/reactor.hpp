// The store's I/O loop: one epoll set, its descriptors registered once and edge-triggered, and a
// queue of work other threads post to it.
//
// Why not Asio here: Asio's async_wait re-registers the descriptor (epoll_ctl) for every wait,
// so a store request cost recv + send + epoll_ctl; and Asio 1.81 tries every async_read_some at
// once, which turns the saved epoll_ctl into a recv that finds nothing (docs/performance.md).
// Registered once for EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLPRI with EPOLLET, a request costs its recv and
// its send, and one epoll_wait is shared by every connection ready at the time.
//
// The edge-triggered contract, for a Handler:
//  - An event says that something changed since the last one; it is not repeated. Read until
//    recv() returns EAGAIN or fewer bytes than asked: a stream socket then holds nothing that
//    will not raise a new edge (Linux signals every arrival, not only empty-to-nonempty). Not
//    so once an event has carried EPOLLRDHUP, EPOLLHUP or EPOLLERR: the end of input (or the
//    error) is already queued behind the data and raises nothing more, so read until recv()
//    returns 0, an error or EAGAIN.
//    A handler that stops reading early (fairness, back-pressure) must come back on its own,
//    by a post().
//  - EPOLLOUT comes after a send() has returned EAGAIN and room has been made; the first one, at
//    registration, says only that the socket is writable.
//  - EPOLLPRI: TCP urgent data, at whose mark recv() stops short with more queued behind it (the
//    one exception to the rule above); the store closes such a client.
//
// Threads: run() on the loop's own thread, or poll() from a thread that owns the loop through
// another loop's readiness of fd() (the store on the launcher's Asio io_context). post() from any
// thread; add(), remove() and retire() from the loop's thread (add() also from another thread
// when no event can reach the descriptor's handler before the call returns).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace ddp::store {

class Reactor {
 public:
  class Handler {
   public:
    // EPOLLIN, EPOLLOUT, EPOLLRDHUP, EPOLLPRI, EPOLLERR, EPOLLHUP. Catches what it throws: an
    // exception would lose the rest of the batch, whose edges do not come again.
    virtual void on_events(uint32_t events) noexcept = 0;

   protected:
    ~Handler() = default;
  };

  Reactor();  // throws std::system_error (out of descriptors)
  ~Reactor();
  Reactor(const Reactor&) = delete;
  Reactor& operator=(const Reactor&) = delete;

  // Registers fd for reading and writing, edge-triggered; the handler must stay alive while fd
  // is registered and through the batch that removes it (retire()).
  void add(int fd, Handler& handler);  // throws std::system_error
  // Stops fd's events. Events already taken from the kernel in this batch are still delivered:
  // keep the handler alive until the batch ends (retire()).
  void remove(int fd);
  // Keeps `what` until the events of the current batch have been delivered.
  void retire(std::shared_ptr<void> what);

  // Runs fn on the loop's thread after the events of the current batch, in the order posted.
  void post(std::function<void()> fn);
  // Delivers events and posted work, blocking in epoll_wait, until stop()'s turn comes: the work
  // posted before stop() runs first.
  void run();
  void stop();
  // Delivers one batch of what is ready now and what has been posted, without blocking; fd()
  // stays readable while more is ready.
  void poll();
  // Delivers batches until nothing is ready and nothing is posted (at the end, with no thread
  // left running the loop).
  void drain();
  // Readable while poll() has something to deliver (for nesting in another loop).
  int fd() const { return epoll_fd_; }

 private:
  // One epoll_wait, its events, then the posted work. Returns the number of events taken.
  int run_once(int timeout_ms);
  void run_posted();

  int epoll_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: post() writes it when the queue was not already signalled
  bool stopping_ = false;
  std::vector<std::shared_ptr<void>> retired_;

  std::mutex mu_;  // guards what follows
  std::vector<std::function<void()>> posted_;
  bool signalled_ = false;
};

}  // namespace ddp::store

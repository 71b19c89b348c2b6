// Test helpers: a store Server on its own io thread (port 0, loopback), raw blocking clients
// with deadlines, and the byte-fixture format of fixtures/README.md.
#pragma once

#include "store/server.hpp"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include <chrono>
#include <functional>
#include <future>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace ddp::store::testing {

class ServerThread {
 public:
  explicit ServerThread(ServerOptions opts = {.host = "127.0.0.1", .port = 0});
  ~ServerThread();
  uint16_t port() const { return port_; }
  Server& server() { return *server_; }
  // Runs f on the io thread and returns its result.
  template <class F>
  auto call(F f) -> decltype(f()) {
    std::packaged_task<decltype(f())()> task(std::move(f));
    auto fut = task.get_future();
    boost::asio::post(io_, [&task] { task(); });
    return fut.get();
  }
  // Asks pred() on the io thread until it holds or the deadline passes; returns its last answer.
  // For states a test must see before its next step (a waiter registered, a connection gone).
  template <class F>
  bool eventually(F pred, std::chrono::milliseconds deadline = std::chrono::seconds(5)) {
    const auto end = std::chrono::steady_clock::now() + deadline;
    for (;;) {
      if (call(pred)) return true;
      if (std::chrono::steady_clock::now() >= end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

 private:
  boost::asio::io_context io_;
  // Keeps io_.run() going after the server stops (a test may still call() it then).
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_{io_.get_executor()};
  std::optional<Server> server_;
  uint16_t port_ = 0;
  std::thread thread_;
};

class RawClient {
 public:
  explicit RawClient(uint16_t port);
  ~RawClient();
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  void send(const std::string& bytes);
  // Exactly n bytes, or fewer if the peer closed / the deadline passed.
  std::string recv(std::size_t n, std::chrono::milliseconds deadline = std::chrono::seconds(5));
  // True when nothing arrives within `quiet`.
  bool quiet(std::chrono::milliseconds quiet = std::chrono::milliseconds(100));
  // True when the server closes the connection within the deadline (data before it is dropped).
  bool closed_by_peer(std::chrono::milliseconds deadline = std::chrono::seconds(5));
  void close();
  int fd() const { return fd_; }
  uint16_t local_port() const;

 private:
  int fd_ = -1;
};

// One step of a byte fixture.
struct FixtureStep {
  enum class Kind { send, expect, expect_quiet, expect_eof, close } kind;
  int conn = 1;
  std::string bytes;
  int line = 0;
};

// Parses the fixture text format (fixtures/README.md). Throws std::runtime_error with the line.
std::vector<FixtureStep> parse_fixture(const std::string& text);

// Replays steps against a server on `port`; returns "" or what went wrong (with the line).
std::string replay_fixture(const std::vector<FixtureStep>& steps, uint16_t port);

std::string hex(const std::string& bytes);

}  // namespace ddp::store::testing

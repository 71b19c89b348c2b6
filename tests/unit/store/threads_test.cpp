// The store server's I/O threads for real, for ThreadSanitizer (label tsan; scripts/test runs it
// in build-tsan): four I/O threads, many client threads over loopback doing SET, GET, WAIT and ADD
// at once, WAITs released by another thread's SET, and the public calls (stats, waiters, the
// allow-list) made from the caller's loop while the I/O threads serve. The answers are checked
// too: the test means something without the sanitizer.
#include "loopback.hpp"

#include "store/protocol.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace ddp::store;
using namespace ddp::store::testing;

namespace {

Request req(Op op, std::string key = {}, std::string value = {}) {
  Request r;
  r.op = op;
  r.key = std::move(key);
  r.value = std::move(value);
  return r;
}

// Appended, not `"/c" + ...`: GCC 12 warns (-Wrestrict) about that.
std::string key_of(int client, int step) {
  std::string k = "/c";
  k += std::to_string(client);
  k += '/';
  k += std::to_string(step);
  return k;
}
std::string value_of(int client, int step) {
  std::string v = "v";
  v += std::to_string(client);
  v += '.';
  v += std::to_string(step);
  return v;
}

int64_t i64_of(const std::string& r) {
  int64_t v = 0;
  std::memcpy(&v, r.data(), 8);
  return v;
}

}  // namespace

// Client c, step s: SET its own key, ADD the counter, WAIT for its neighbour's key of the same
// step (set by another client, most likely served by another I/O thread), GET it. Every GET
// returns what the neighbour set; the ADDs' replies together are 1..N, each once.
TEST(StoreThreads, ManyClientsOnFourIoThreadsSetGetWaitAndAdd) {
  ServerThread st({.host = "127.0.0.1", .port = 0, .threads = 4});
  constexpr int kClients = 16, kSteps = 40;
  std::vector<std::vector<int64_t>> adds(kClients);
  std::vector<std::string> errors(kClients);
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      RawClient cl(st.port());
      const int next = (c + 1) % kClients;
      Request add = req(Op::add, "/counter");
      add.number = 1;
      for (int s = 0; s < kSteps; ++s) {
        Request wait;
        wait.op = Op::wait;
        wait.keys = {key_of(next, s)};
        // As a client does: a WAIT's answer is read before the next request (a request sent
        // after an unanswered WAIT stands for a WAIT that timed out, fixtures/v1_wait_two_clients).
        cl.send(encode_request(Protocol::v1, req(Op::set, key_of(c, s), value_of(c, s))) +
                encode_request(Protocol::v1, add));
        const auto a = cl.recv(8);
        cl.send(encode_request(Protocol::v1, wait));
        const auto w = cl.recv(1);
        cl.send(encode_request(Protocol::v1, req(Op::get, key_of(next, s))));
        const auto want = value_of(next, s);
        const auto g = cl.recv(8 + want.size());
        if (a.size() != 8 || w != std::string(1, '\0') || g.size() != 8 + want.size() ||
            i64_of(g) != static_cast<int64_t>(want.size()) || g.substr(8) != want) {
          errors[c] = "client " + std::to_string(c) + " step " + std::to_string(s) + ": add " +
                      std::to_string(a.size()) + " bytes, wait " + hex(w) + ", get " + hex(g);
          return;
        }
        adds[c].push_back(i64_of(a));
      }
    });
  }
  // The caller's loop asks while the I/O threads serve (the launcher's status and its wait
  // report on a timeout do this).
  std::atomic<bool> done{false};
  std::thread asker([&] {
    while (!done.load()) {
      st.call([&] {
        (void)st.server().stats();
        (void)st.server().waiters();
        st.server().set_allowed_peers({"10.0.0.2"});
        return 0;
      });
    }
  });
  for (auto& t : clients) t.join();
  done = true;
  asker.join();
  for (const auto& e : errors) EXPECT_EQ(e, "");
  std::vector<int64_t> all;
  for (const auto& v : adds) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  ASSERT_EQ(all.size(), std::size_t{kClients * kSteps});
  for (std::size_t i = 0; i < all.size(); ++i) ASSERT_EQ(all[i], static_cast<int64_t>(i + 1)) << "at " << i;
}

// reset() between attempts while clients of the old attempt are still sending: they are all
// closed, the new keyspace is empty, and the I/O threads keep serving new clients.
TEST(StoreThreads, ResetWhileClientsAreBusyOnIoThreads) {
  ServerThread st({.host = "127.0.0.1", .port = 0, .threads = 4});
  constexpr int kClients = 8;
  std::atomic<int> connected{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      RawClient cl(st.port());
      Request add = req(Op::add, "/k");
      add.number = 1;
      cl.send(encode_request(Protocol::v1, add));
      if (cl.recv(8).size() == 8) ++connected;
      // Until reset closes us: a closed socket ends the loop (recv returns fewer bytes, or
      // send fails).
      try {
        for (int i = 0; i < 100000; ++i) {
          cl.send(encode_request(Protocol::v1, req(Op::set, "/c" + std::to_string(c), "v")) +
                  encode_request(Protocol::v1, add));
          if (cl.recv(8).size() != 8) return;
        }
      } catch (const std::runtime_error&) {
      }
    });
  }
  ASSERT_TRUE(st.eventually([&] { return connected.load() == kClients; }));
  st.call([&] {
    st.server().reset();
    return 0;
  });
  for (auto& t : clients) t.join();
  RawClient fresh(st.port());
  fresh.send(encode_request(Protocol::v1, req(Op::get_num_keys)));
  EXPECT_EQ(i64_of(fresh.recv(8)), 0);
}

// Waiters on several I/O threads, half of which hang up while another client's SET releases
// them all: the SET's replies are pushed to connections that other threads are closing at that
// moment. The waiters still there get their answer, the ones gone get nothing and are not counted
// as bad, and no connection is left behind.
TEST(StoreThreads, WaitersThatHangUpWhileTheirWaitIsReleased) {
  ServerThread st({.host = "127.0.0.1", .port = 0, .threads = 4});
  constexpr int kRounds = 25, kWaiters = 12;
  RawClient setter(st.port());
  for (int round = 0; round < kRounds; ++round) {
    const std::string key = "/round" + std::to_string(round);
    std::vector<std::unique_ptr<RawClient>> waiters;
    for (int i = 0; i < kWaiters; ++i) {
      waiters.push_back(std::make_unique<RawClient>(st.port()));
      Request wait;
      wait.op = Op::wait;
      wait.keys = {key};
      waiters.back()->send(encode_request(Protocol::v1, wait));
    }
    ASSERT_TRUE(st.eventually([&] {
      const auto report = st.server().waiters();
      return report.waited.size() == 1 && report.waited[0].waiters.size() == static_cast<std::size_t>(kWaiters);
    })) << "round "
        << round;
    // The odd ones hang up from another thread while the SET goes out.
    std::thread hangup([&] {
      for (int i = 1; i < kWaiters; i += 2) waiters[i]->close();
    });
    setter.send(encode_request(Protocol::v1, req(Op::set, key, "go")));
    hangup.join();
    for (int i = 0; i < kWaiters; i += 2) {
      EXPECT_EQ(hex(waiters[i]->recv(1)), hex(std::string(1, '\0'))) << "round " << round << ", waiter " << i;
    }
    waiters.clear();
    ASSERT_TRUE(st.eventually([&] { return st.server().stats().connections == 1; }))
        << "round " << round << ": connections left behind";
  }
  const auto stats = st.call([&] { return st.server().stats(); });
  EXPECT_EQ(stats.closed_bad, 0u);
  EXPECT_EQ(stats.accepted, static_cast<uint64_t>(1 + kRounds * kWaiters));
  setter.send(encode_request(Protocol::v1, req(Op::get_num_keys)));
  EXPECT_EQ(i64_of(setter.recv(8)), kRounds);
}

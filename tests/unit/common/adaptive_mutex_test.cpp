// AdaptiveMutex: it excludes (threads counting under it lose no increment) and try_lock fails
// while another thread holds it.
#include "common/adaptive_mutex.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

using ddp::AdaptiveMutex;

TEST(AdaptiveMutex, ThreadsCountingUnderItLoseNothing) {
  AdaptiveMutex mu;
  long counter = 0;  // not atomic: only the lock keeps the increments apart
  constexpr int kThreads = 4, kEach = 1'000'000;
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      ++ready;  // all start together, so that they overlap
      while (ready.load() < kThreads) std::this_thread::yield();
      for (int i = 0; i < kEach; ++i) {
        std::lock_guard lk(mu);
        // A read, a pause, a write: without exclusion, threads interleave here and lose counts.
        const long seen = counter;
        std::atomic_signal_fence(std::memory_order_seq_cst);
        counter = seen + 1;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(counter, long{kThreads} * kEach);
}

TEST(AdaptiveMutex, TryLockFailsWhileAnotherThreadHoldsIt) {
  AdaptiveMutex mu;
  std::atomic<bool> held{false}, release{false};
  std::thread holder([&] {
    std::lock_guard lk(mu);
    held = true;
    while (!release) std::this_thread::yield();
  });
  while (!held) std::this_thread::yield();
  EXPECT_FALSE(mu.try_lock());
  release = true;
  holder.join();
  ASSERT_TRUE(mu.try_lock());
  mu.unlock();
}

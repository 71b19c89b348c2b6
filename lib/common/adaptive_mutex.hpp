// A mutex that spins briefly before it sleeps: glibc's adaptive kind (PTHREAD_MUTEX_ADAPTIVE_NP),
// which retries the lock a bounded number of times (at most glibc.pthread.mutex_spin_count, 100
// by default, adapted to how long the lock was recently held) and then waits in the kernel as a
// plain mutex does.
//
// For a lock held for a fraction of a microsecond by several threads at once: the store's
// keyspace, taken once per request by each I/O thread. A std::mutex there put a thread that
// found it taken to sleep (a futex wait and the wake-up: tens of microseconds of CPU on a
// virtual machine) where the holder was about to let go; on the 16-core machine the store's
// threads slept 0.08 times per request at 16 clients, a floor server without the lock not at all
// (docs/performance-gpu.md). The spin waits on a lock, never on I/O.
#pragma once

#include <pthread.h>

namespace ddp {

class AdaptiveMutex {
 public:
  AdaptiveMutex() noexcept {
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ADAPTIVE_NP);
    pthread_mutex_init(&m_, &attr);
    pthread_mutexattr_destroy(&attr);
  }
  ~AdaptiveMutex() { pthread_mutex_destroy(&m_); }
  AdaptiveMutex(const AdaptiveMutex&) = delete;
  AdaptiveMutex& operator=(const AdaptiveMutex&) = delete;

  // Lockable, as std::lock_guard and std::unique_lock want it. An adaptive mutex fails only
  // for errors of a kind it is not (EDEADLK is an error-checking mutex's): nothing to report.
  void lock() noexcept { pthread_mutex_lock(&m_); }
  bool try_lock() noexcept { return pthread_mutex_trylock(&m_) == 0; }
  void unlock() noexcept { pthread_mutex_unlock(&m_); }

 private:
  pthread_mutex_t m_;
};

}  // namespace ddp

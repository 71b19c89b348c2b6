// A native (non-Python) worker for tests/integration/stacks: the main thread blocks in
// ddp_stacks_test::stuck_in_native_leaf (reading the pipe the test holds, its fd in argv[1]), two
// threads block in ddp_stacks_test::waiting_worker on a condition variable. It prints "ready"
// once every thread has been started; a byte on that pipe lets main return 0 (the test checks that
// a native read left the process healthy).
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace ddp_stacks_test {

std::mutex m;
std::condition_variable cv;
bool done = false;

__attribute__((noinline)) void waiting_worker(int) {
  std::unique_lock lock(m);
  cv.wait(lock, [] { return done; });
}

__attribute__((noinline)) int stuck_in_native_leaf(int fd) {
  char c = 0;
  const ssize_t n = ::read(fd, &c, 1);
  asm volatile("" ::: "memory");  // keep the call a call (no tail call): the caller stays on the stack
  return n == 1 ? 0 : 1;
}

__attribute__((noinline)) int native_middle(int fd) {
  const int rc = stuck_in_native_leaf(fd);
  asm volatile("" ::: "memory");
  return rc;
}

}  // namespace ddp_stacks_test

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) threads.emplace_back(ddp_stacks_test::waiting_worker, i);
  std::printf("ready\n");
  std::fflush(stdout);
  const int rc = ddp_stacks_test::native_middle(std::atoi(argv[1]));
  {
    std::lock_guard lock(ddp_stacks_test::m);
    ddp_stacks_test::done = true;
  }
  ddp_stacks_test::cv.notify_all();
  for (auto& t : threads) t.join();
  return rc;
}

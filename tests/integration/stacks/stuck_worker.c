/* A non-Python worker for `ddpctl stacks --native` (test_stacks_job.py): says "ready", then
 * blocks for good in stuck_in_c_function, in pause(2). Stopped by the test, by pid or with its job. */
#include <stdio.h>
#include <unistd.h>

__attribute__((noinline)) void stuck_in_c_function(void) {
  for (;;) {
    pause();
    __asm__ volatile("" ::: "memory"); /* keep the call a call */
  }
}

int main(void) {
  printf("ready\n");
  fflush(stdout);
  stuck_in_c_function();
  return 0;
}

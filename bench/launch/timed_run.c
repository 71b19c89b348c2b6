/* timed_run: bench/launch/run.py's stopwatch. Runs a program as its child and writes, to the
 * file named first, "WALL_NS MAXRSS_KIB MINFLT": the wall time from just before the fork to
 * the child's reaping, read here, and what wait4 reports for the child and the descendants it
 * reaped (peak resident set, minor page faults), as GNU time reports them. GNU time's own wall
 * time has 10 ms steps, and timing this program from Python counts its start and Python's fork,
 * a constant that made every ratio to the floor look smaller than it is.
 *
 *   timed_run OUT PROGRAM [ARG...]     exit status: the child's (128 + N for signal N) */
#include <errno.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: timed_run OUT PROGRAM [ARG...]\n");
    return 2;
  }
  FILE* out = fopen(argv[1], "w");
  if (!out) {
    perror(argv[1]);
    return 2;
  }
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  const pid_t pid = fork();
  if (pid == 0) {
    execvp(argv[2], argv + 2);
    perror(argv[2]);
    _exit(127);
  }
  if (pid < 0) {
    perror("fork");
    return 2;
  }
  int status = 0;
  struct rusage ru;
  while (wait4(pid, &status, 0, &ru) < 0) {
    if (errno != EINTR) {
      perror("wait4");
      return 2;
    }
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  const long long ns = (long long)(t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
  fprintf(out, "%lld %ld %ld\n", ns, ru.ru_maxrss, ru.ru_minflt);
  fclose(out);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

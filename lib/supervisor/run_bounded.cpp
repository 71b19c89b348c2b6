#include "supervisor/run_bounded.hpp"

#include "supervisor/cgroup.hpp"

#include <fmt/format.h>

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>

namespace ddp::supervisor {

Bounded run_bounded(const SpawnSpec& spec, std::chrono::milliseconds timeout, std::size_t max_out,
                    std::size_t max_err) {
  auto s = spec;
  s.capture_output = true;
  s.own_process_group = true;  // the SIGKILL below is for its group
  // A cgroup of its own where one can be made: then nothing it started outlives the call.
  static std::atomic<unsigned> runs{0};
  auto cg = Cgroup::create(fmt::format("h{}", runs.fetch_add(1) + 1), Cgroup::Use::helper);
  if (cg) {
    s.cgroup_procs_fd = cg->procs_fd();
    s.cgroup_dir_fd = cg->dir_fd();
  }
  const auto sp = spawn(s);
  Bounded r;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::array<pollfd, 2> fds{pollfd{sp.stdout_fd, POLLIN, 0}, pollfd{sp.stderr_fd, POLLIN, 0}};
  int open = 2;
  char buf[16384];
  while (open > 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      r.timed_out = true;
      break;
    }
    const int n = ::poll(fds.data(), fds.size(), static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const ssize_t got = ::read(fds[i].fd, buf, sizeof buf);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open;
        continue;
      }
      auto& text = i == 0 ? r.out : r.err;
      const std::size_t cap = i == 0 ? max_out : max_err;
      const auto take = std::min<std::size_t>(static_cast<std::size_t>(got), cap - std::min(cap, text.size()));
      text.append(buf, take);
      if (i == 0 && take < static_cast<std::size_t>(got)) r.out_truncated = true;
    }
  }
  for (auto& p : fds)
    if (p.fd >= 0) ::close(p.fd);
  if (cg) cg->kill_all();
  ::kill(-sp.pid, SIGKILL);
  int st = 0;
  while (::waitpid(sp.pid, &st, 0) < 0 && errno == EINTR) {
  }
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;  // cg's destructor waits for the cgroup to empty and removes it
}

}  // namespace ddp::supervisor

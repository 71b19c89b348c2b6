#include "container/runtime.hpp"

#include "common/log.hpp"
#include "common/strings.hpp"
#include "supervisor/cgroup.hpp"
#include "supervisor/process.hpp"

#include <fmt/format.h>

#include <openssl/evp.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

namespace ddp::container {

namespace fs = std::filesystem;

namespace {

std::optional<unsigned long long> start_time_of(long long pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(in, line)) return std::nullopt;
  return supervisor::start_time_from_stat(line);
}

std::string first_line(const std::string& s) {
  auto t = trim(s);
  return std::string(t.substr(0, t.find('\n')));
}

// A pull prints its progress first and its error last.
std::string last_line(const std::string& s) {
  auto t = trim(s);
  auto nl = t.rfind('\n');
  return std::string(nl == std::string_view::npos ? t : t.substr(nl + 1));
}

}  // namespace

HostLayout read_host_layout() {
  HostLayout h;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/dev/infiniband", ec)) {
    if (e.is_character_file(ec)) h.rdma_devices.push_back(e.path().string());
  }
  std::sort(h.rdma_devices.begin(), h.rdma_devices.end());
  rlimit rl{};
  if (::getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_max != RLIM_INFINITY) h.memlock_hard = rl.rlim_max;
  return h;
}

Owner own_owner() {
  return Owner{::getpid(), start_time_of(::getpid()).value_or(0)};
}

namespace {
thread_local int interrupt_fd = -1;
}  // namespace

void set_interrupt_fd(int fd) {
  interrupt_fd = fd;
}

CommandResult run_command(const std::vector<std::string>& argv, const Env& env, std::chrono::milliseconds timeout) {
  CommandResult r;
  bool interrupted = false;
  supervisor::SpawnSpec s;
  s.argv = argv;
  s.env = env;
  s.workdir.assign(1, '/');  // (a literal here trips GCC 12's -Wrestrict false positive)
  supervisor::Spawned sp;
  try {
    sp = supervisor::spawn(s);
  } catch (const supervisor::SpawnError& e) {
    r.err = e.what();
    return r;
  }
  // The runtime may hand our pipes to a daemonized helper (podman's conmon), so its end is
  // known from a pidfd, not from EOF.
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, sp.pid, 0));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  constexpr std::size_t kCap = 64 * 1024;
  bool exited = false;
  int fds[2] = {sp.stdout_fd, sp.stderr_fd};
  std::string* bufs[2] = {&r.out, &r.err};
  while (!exited) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      r.timed_out = true;
      ::kill(-sp.pid, SIGKILL);
      ::kill(sp.pid, SIGKILL);
      break;
    }
    // Without a pidfd (old kernels) EOF on both pipes has to do; bounded by the deadline anyway.
    pollfd p[4] = {{fds[0], POLLIN, 0}, {fds[1], POLLIN, 0}, {pidfd, POLLIN, 0}, {interrupt_fd, POLLIN, 0}};
    const int n = ::poll(p, 4, static_cast<int>(std::min<long long>(left.count(), 1000)));  // -1 fds: skipped
    if (n < 0 && errno != EINTR) break;
    if (interrupt_fd >= 0 && (p[3].revents & POLLIN)) {
      interrupted = true;
      ::kill(-sp.pid, SIGKILL);
      ::kill(sp.pid, SIGKILL);
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i] < 0 || !(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      ssize_t got = ::read(fds[i], buf, sizeof buf);
      if (got > 0) {
        if (bufs[i]->size() < kCap) bufs[i]->append(buf, static_cast<std::size_t>(std::min<ssize_t>(got, kCap)));
      } else if (got == 0 || errno != EINTR) {
        ::close(fds[i]);
        fds[i] = -1;
      }
    }
    if (pidfd >= 0 && (p[2].revents & POLLIN)) exited = true;
    if (pidfd < 0 && fds[0] < 0 && fds[1] < 0) exited = true;
  }
  // What is already in the pipes, without waiting for writers that outlive the command.
  for (int i = 0; i < 2; ++i) {
    if (fds[i] < 0) continue;
    ::fcntl(fds[i], F_SETFL, O_NONBLOCK);
    char buf[4096];
    ssize_t got;
    while ((got = ::read(fds[i], buf, sizeof buf)) > 0 && bufs[i]->size() < kCap)
      bufs[i]->append(buf, static_cast<std::size_t>(got));
    ::close(fds[i]);
  }
  if (pidfd >= 0) ::close(pidfd);
  int status = 0;
  while (::waitpid(sp.pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.exit_code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
  if (interrupted) throw Interrupted(fmt::format("stopped while {} ran", argv.empty() ? "a command" : argv[0]));
  return r;
}

std::string sha256_of_file(const std::string& path) {
  // Look before opening: opening a device can act (a watchdog arms on open, a tape rewinds),
  // and a FIFO would block. O_PATH opens nothing; the regular file it names is then reopened
  // through /proc/self/fd, so what is read is the inode that was checked.
  const int pfd = ::open(path.c_str(), O_PATH | O_CLOEXEC);
  if (pfd < 0) throw ContainerError(fmt::format("cannot read {}: {}", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(pfd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(pfd);
    throw ContainerError(fmt::format("{} is not a regular file (an image file is expected)", path));
  }
  const int fd = ::open(fmt::format("/proc/self/fd/{}", pfd).c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  const int open_err = errno;
  ::close(pfd);
  if (fd < 0) throw ContainerError(fmt::format("cannot read {}: {}", path, std::strerror(open_err)));
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
  std::vector<char> buf(1 << 20);
  ssize_t got;
  while ((got = ::read(fd, buf.data(), buf.size())) != 0) {
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int err = errno;
      ::close(fd);
      throw ContainerError(fmt::format("cannot read {}: {}", path, std::strerror(err)));
    }
    EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<std::size_t>(got));
  }
  ::close(fd);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &len);
  std::string hex = "sha256:";
  for (unsigned int i = 0; i < len; ++i) hex += fmt::format("{:02x}", md[i]);
  return hex;
}

ImageIdentity prepare_image(const jobspec::ContainerSpec& spec, const Env& client_env, const std::string& cwd,
                            bool may_pull) {
  if (auto why = image_problem(spec.image)) throw ContainerError("container.image: " + *why);
  const std::string runtime(jobspec::runtime_name(spec.runtime));
  auto path = client_env.count("PATH") ? client_env.at("PATH") : std::string();
  if (!supervisor::resolve_executable(runtime, path, cwd)) {
    throw ContainerError(
        fmt::format("container.runtime {}: '{}' was not found on PATH ({}); install it or pick "
                    "another runtime",
                    runtime, runtime, path));
  }
  if (!has_image_store(spec.runtime)) {
    // apptainer and enroot run an image file, or fetch a URI (docker://...) themselves.
    if (spec.image.find("://") != std::string::npos) return {};
    fs::path p(spec.image);
    if (p.is_relative()) p = fs::path(cwd) / p;
    std::error_code ec;
    if (!fs::exists(p, ec))
      throw ContainerError(fmt::format("container.image {}: no such file on this node", p.string()));
    return {sha256_of_file(p.string()), ""};
  }
  using namespace std::chrono_literals;
  auto log = log::get("container");
  auto inspect = [&] { return run_command(image_identity_argv(spec.runtime, spec.image), client_env, 60s); };
  auto pull = [&] {
    log->info("pulling {} with {}", spec.image, runtime);
    auto r = run_command(pull_argv(spec.runtime, spec.image), client_env, 30min);
    if (r.exit_code != 0) {
      throw ContainerError(fmt::format("{} pull {} failed{}: {}", runtime, spec.image,
                                       r.timed_out ? " (after 30 min)" : "", last_line(r.err.empty() ? r.out : r.err)));
    }
  };
  if (may_pull && spec.pull == jobspec::PullPolicy::always) pull();
  auto r = inspect();
  if (r.exit_code != 0 && may_pull && spec.pull == jobspec::PullPolicy::missing) {
    pull();
    r = inspect();
  }
  if (r.exit_code != 0) {
    throw ContainerError(fmt::format(
        "image {} is not present on this node ({} image inspect: {}){}", spec.image, runtime, first_line(r.err),
        !may_pull                                 ? ""
        : spec.pull == jobspec::PullPolicy::never ? "; container.pull is never: load or pull it first"
                                                  : ""));
  }
  auto id = parse_image_identity(spec.runtime, r.out);
  if (!id) {
    throw ContainerError(
        fmt::format("{} image inspect {} printed no image id: '{}'", runtime, spec.image, first_line(r.out)));
  }
  return *id;
}

std::optional<std::string> check_command_in_image(const jobspec::ContainerSpec& spec, const std::string& argv0,
                                                  const std::string& path, const Env& client_env,
                                                  const std::string& name, const std::optional<Confinement>& confine) {
  Env env = client_env;
  if (spec.runtime == ContainerRuntime::enroot && !path.empty()) env["PATH"] = path;  // enroot passes it by name
  auto argv = command_check_argv(spec, argv0, path, name, own_owner().label(), confine);
  auto r = run_command(argv, env, std::chrono::minutes(2));
  const std::string where = spec.workdir ? fmt::format(" (workdir {})", *spec.workdir) : "";
  switch (r.timed_out ? CommandCheck::runtime_error : classify_command_check(spec.runtime, r.exit_code)) {
    case CommandCheck::ok:
      return std::nullopt;
    case CommandCheck::no_workdir:
      throw ContainerError(fmt::format("container.workdir {} is not a directory inside image {}",
                                       spec.workdir.value_or(""), spec.image));
    case CommandCheck::no_command:
      throw ContainerError(fmt::format("cannot run '{}' inside image {}: no such executable (PATH={}){}", argv0,
                                       spec.image, path.empty() ? "the image's" : path, where));
    case CommandCheck::no_shell:
      return fmt::format("the command was not checked inside image {}: it has no /bin/sh to check with ({})",
                         spec.image, first_line(r.err));
    case CommandCheck::runtime_error:
      break;
  }
  throw ContainerError(
      fmt::format("checking the command inside image {} failed ({}): {}", spec.image,
                  r.timed_out ? "no answer in 2 min" : fmt::format("{} exited {}", argv[0], r.exit_code),
                  first_line(r.err.empty() ? r.out : r.err)));
}

void write_env_files(const contract::Plan& plan, ContainerRuntime runtime) {
  for (const auto& r : plan.ranks) {
    if (!r.container || r.container->env_file.empty()) continue;
    const auto& path = r.container->env_file;
    std::string text;
    try {
      text = env_file_text(runtime, r.container->env);
    } catch (const std::invalid_argument& e) {
      throw ContainerError(fmt::format("rank {}: {}", r.rank, e.what()));
    }
    ::unlink(path.c_str());  // a file of an earlier run with the same --job-id, whatever its mode
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) throw ContainerError(fmt::format("cannot create {}: {}", path, std::strerror(errno)));
    const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    ::close(fd);
    if (!ok) throw ContainerError(fmt::format("cannot write {}", path));
  }
}

void remove_env_files(const contract::Plan& plan) {
  for (const auto& r : plan.ranks) {
    if (r.container && !r.container->env_file.empty()) ::unlink(r.container->env_file.c_str());
  }
}

std::vector<std::string> container_names(const contract::Plan& plan) {
  std::vector<std::string> out;
  for (const auto& r : plan.ranks) {
    if (r.container && !r.container->name.empty()) out.push_back(r.container->name);
  }
  return out;
}

void remove_containers(ContainerRuntime runtime, const std::vector<std::string>& names, const Env& client_env) {
  auto argv = remove_argv(runtime, names);
  if (argv.empty()) return;
  auto r = run_command(argv, client_env, std::chrono::seconds(60));
  // docker says "No such container" for a name already gone; that is the goal, not a failure.
  if (r.exit_code != 0 && r.err.find("No such container") == std::string::npos) {
    log::get("container")
        ->warn("{} failed ({}): {}", join(argv, " "), r.timed_out ? "timed out" : fmt::format("exit {}", r.exit_code),
               first_line(r.err));
  }
}

void sweep_stale(ContainerRuntime runtime, const Env& client_env) {
  auto argv = list_owned_argv(runtime);
  if (argv.empty()) return;
  auto r = run_command(argv, client_env, std::chrono::seconds(60));
  if (r.exit_code == -1) return;  // no runtime to ask; nothing of ours can be there either
  if (r.exit_code != 0) {
    // The runtime is there but would not list: what a dead launcher left stays. Say so.
    log::get("container")
        ->warn("cannot look for containers left by launchers that no longer run ({} exited {}): {}", join(argv, " "),
               r.exit_code, first_line(r.err.empty() ? r.out : r.err));
    return;
  }
  std::vector<std::string> stale;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    auto parts = split(trim(line), ' ');
    if (parts.size() != 2) continue;
    auto owner = parse_owner(parts[1]);
    if (!owner || owner->pid == ::getpid()) continue;
    auto now = start_time_of(owner->pid);
    if (now && *now == owner->start_time) continue;  // its launcher still runs
    stale.emplace_back(parts[0]);
  }
  if (stale.empty()) return;
  log::get("container")
      ->warn("removing {} container(s) left by a launcher that no longer runs: {}", stale.size(), join(stale, " "));
  remove_containers(runtime, stale, client_env);
}

std::optional<Watchdog> Watchdog::start(const std::vector<std::string>& remove, const Env& env) {
  if (remove.empty()) return std::nullopt;
  auto path = env.count("PATH") ? env.at("PATH") : std::string();
  auto exe = supervisor::resolve_executable(remove[0], path, "/");
  if (!exe) throw ContainerError(fmt::format("'{}' was not found on PATH ({})", remove[0], path));
  // Everything the child needs exists before fork(): it only makes async-signal-safe calls.
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> argv_c, envp_c;
  for (const auto& a : remove) argv_c.push_back(const_cast<char*>(a.c_str()));
  argv_c.push_back(nullptr);
  for (auto& e : env_strings) envp_c.push_back(e.data());
  envp_c.push_back(nullptr);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw ContainerError(fmt::format("pipe: {}", std::strerror(errno)));
  const int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]), ::close(fds[1]);
    if (devnull >= 0) ::close(devnull);
    throw ContainerError(fmt::format("fork: {}", std::strerror(errno)));
  }
  if (pid == 0) {
    ::setsid();  // out of the launcher's process group: a terminal's Ctrl-C is the launcher's to handle
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD, SIGPIPE, SIGUSR1, SIGUSR2}) ::signal(sig, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::dup2(fds[0], 0);
    if (devnull >= 0) ::dup2(devnull, 1), ::dup2(devnull, 2);
    ::syscall(SYS_close_range, 3u, ~0u, 0u);
    char c = 0;
    ssize_t n;
    while ((n = ::read(0, &c, 1)) < 0 && errno == EINTR) {
    }
    if (n == 1 && c == 'd') ::_exit(0);
    ::chdir("/");
    ::execve(exe->c_str(), argv_c.data(), envp_c.data());
    ::_exit(127);
  }
  ::close(fds[0]);
  if (devnull >= 0) ::close(devnull);
  log::get("container")->debug("watchdog pid {} removes {} if this launcher dies", pid, join(remove, " "));
  return Watchdog(pid, fds[1]);
}

Watchdog::Watchdog(Watchdog&& o) noexcept : pid_(std::exchange(o.pid_, -1)), fd_(std::exchange(o.fd_, -1)) {}

Watchdog::~Watchdog() {
  if (fd_ < 0) return;
  const char done = 'd';
  [[maybe_unused]] auto ignored = ::write(fd_, &done, 1);
  ::close(fd_);
}

}  // namespace ddp::container

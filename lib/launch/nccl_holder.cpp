#include "launch/nccl_holder.hpp"

#include "common/log.hpp"
#include "common/strings.hpp"
#include "nccl/holder_protocol.hpp"
#include "supervisor/process.hpp"

#include <boost/asio/read.hpp>

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

namespace ddp::launch {

namespace asio = boost::asio;
namespace fs = std::filesystem;

std::optional<NcclHolder> NcclHolder::start(asio::io_context& io, contract::Env env, const std::string& workdir,
                                            const std::string& attempt_dir, jobspec::NcclUniqueId mode,
                                            bool in_container, std::optional<supervisor::RunAs> run_as) {
  auto log = log::get("nccl");
  if (mode == jobspec::NcclUniqueId::off) return std::nullopt;
  if (in_container) {
    // This holder would load the host's libnccl; the workers load the image's (`on` is refused
    // by the job file parser for the same reason).
    log->debug("no NCCL unique id for a container job: the host's libnccl may not match the image's");
    return std::nullopt;
  }
  auto fail = [&](const std::string& why) -> std::optional<NcclHolder> {
    if (mode == jobspec::NcclUniqueId::on) throw NcclIdError(why);
    log->debug("no NCCL unique id for this job: {}", why);
    return std::nullopt;
  };
  auto exe = holder_binary();
  if (!exe) return fail("ddp-ncclid was not found beside this program or on PATH");
  // NCCL's own log lines (NCCL_DEBUG=INFO) go to stdout by default, where the id is: keep
  // them in a file of the attempt unless the job chose a place.
  env.try_emplace("NCCL_DEBUG_FILE", attempt_dir + "/ddp-ncclid.nccl.log");
  supervisor::SpawnSpec s;
  s.argv = {*exe, "--expect-parent", std::to_string(::getpid())};
  s.env = std::move(env);
  s.workdir = workdir;
  s.stdin_pipe = true;
  s.own_process_group = false;
  s.run_as = std::move(run_as);
  supervisor::Spawned sp;
  try {
    sp = supervisor::spawn(s);
  } catch (const supervisor::SpawnError& e) {
    return fail(e.what());
  }
  NcclHolder h(sp.pid, sp.stdin_fd, sp.stdout_fd, sp.stderr_fd);
  std::string last;
  for (int i = 0; i < 64; ++i) {  // the id line, past any stray lines before it
    auto line = h.read_line(std::chrono::seconds(30));
    if (line.empty()) break;
    if (auto id = nccl::holder::parse_line(line)) {
      h.hex_ = std::string(trim(line));
      break;
    }
    last = line;
    if (starts_with(line, nccl::holder::kErrorPrefix)) break;
  }
  if (h.hex_.empty()) {
    h.stop();
    return fail(last.empty() ? "ddp-ncclid gave no id within 30 s" : std::string(trim(last)));
  }
  h.drain(io);  // from now on nobody needs its output, but it must never block on a full pipe
  log->debug("NCCL unique id from ddp-ncclid pid {}", sp.pid);
  return h;
}

NcclHolder::NcclHolder(NcclHolder&& o) noexcept
    : pid_(std::exchange(o.pid_, -1)),
      in_(std::exchange(o.in_, -1)),
      out_(std::exchange(o.out_, -1)),
      err_(std::exchange(o.err_, -1)),
      hex_(std::move(o.hex_)),
      pending_(std::move(o.pending_)),
      drains_(std::move(o.drains_)) {}

void NcclHolder::stop() {
  for (auto& d : drains_) {
    boost::system::error_code ignored;
    d->sd.close(ignored);
  }
  drains_.clear();
  for (int* fd : {&in_, &out_, &err_}) {
    if (*fd >= 0) ::close(*fd), *fd = -1;
  }
  if (pid_ > 0) ::kill(pid_, SIGTERM), pid_ = -1;
}

// Beside the running program (ddpctl or ddp-agentd), else on PATH.
std::optional<std::string> NcclHolder::holder_binary() {
  std::error_code ec;
  auto self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    auto p = self.parent_path() / std::string(nccl::holder::kBinaryName);
    if (fs::exists(p, ec)) return p.string();
  }
  const char* path = std::getenv("PATH");
  return supervisor::resolve_executable(std::string(nccl::holder::kBinaryName), path ? path : "", "/");
}

// One line of the holder's stdout (bounded at 4 KiB); "" at EOF or when the deadline passes.
std::string NcclHolder::read_line(std::chrono::milliseconds deadline) {
  std::string& line = pending_;
  auto until = std::chrono::steady_clock::now() + deadline;
  while (line.find('\n') == std::string::npos && line.size() < 4096) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{out_, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    char buf[512];
    ssize_t n = ::read(out_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    line.append(buf, static_cast<std::size_t>(n));
  }
  auto nl = line.find('\n');
  std::string out = line.substr(0, nl);
  line.erase(0, nl == std::string::npos ? line.size() : nl + 1);
  return out;
}

void NcclHolder::discard(const std::shared_ptr<Drain>& d) {
  d->sd.async_read_some(asio::buffer(d->buf), [d](boost::system::error_code ec, std::size_t) {
    if (!ec) discard(d);
  });
}

void NcclHolder::drain(asio::io_context& io) {
  for (int* fd : {&out_, &err_}) {
    drains_.push_back(std::make_shared<Drain>(io, std::exchange(*fd, -1)));
    discard(drains_.back());
  }
}

}  // namespace ddp::launch

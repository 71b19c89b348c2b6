#include "launch/nccl_holder.hpp"

#include "common/duration.hpp"
#include "common/log.hpp"
#include "common/pidfd.hpp"
#include "common/strings.hpp"
#include "nccl/holder_protocol.hpp"
#include "supervisor/process.hpp"

#include <fmt/format.h>
#include <boost/asio/post.hpp>

#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>

namespace ddp::launch {

namespace asio = boost::asio;
namespace fs = std::filesystem;

// The wait for one holder's id: its stdout read on the owner's loop, line by line, raced
// against the deadline. Everything here runs on that loop; the handlers hold it weakly, so
// dropping the NcclHolderWait ends the wait wherever it is.
struct NcclHolderWait::State : std::enable_shared_from_this<NcclHolderWait::State> {
  State(asio::io_context& io, jobspec::NcclUniqueId mode, NcclHolderDone done, std::chrono::milliseconds deadline)
      : io(io), timer(io), mode(mode), done(std::move(done)), deadline(deadline) {}

  asio::io_context& io;
  asio::steady_timer timer;
  jobspec::NcclUniqueId mode;
  NcclHolderDone done;
  std::chrono::milliseconds deadline;
  std::optional<NcclHolder> holder;
  std::shared_ptr<NcclHolder::Drain> out;  // the holder's stdout, where the id line comes
  std::string pending;                     // read from stdout, not yet a whole line
  std::string last;                        // the last line that was not the id
  int lines = 0;
  bool over = false;

  // The policy's answer when no id can be made: `on` reports why; `auto` goes on without one.
  std::string refusal(const std::string& why) const {
    if (mode == jobspec::NcclUniqueId::on) return why;
    log::get("nccl")->debug("no NCCL unique id for this job: {}", why);
    return {};
  }

  void complete(std::optional<NcclHolder> h, std::string error) {
    over = true;
    timer.cancel();
    auto cb = std::move(done);
    cb(std::move(h), std::move(error));
  }

  // Later, on the loop (start() never calls back from inside itself).
  void complete_later(std::string error) {
    asio::post(io, [w = weak_from_this(), error = std::move(error)]() mutable {
      if (auto s = w.lock(); s && !s->over) s->complete(std::nullopt, std::move(error));
    });
  }

  void give_up(const std::string& why) {
    if (holder) holder->stop();
    holder.reset();
    complete(std::nullopt, refusal(why));
  }

  void wait_deadline() {
    timer.expires_after(deadline);
    timer.async_wait([w = weak_from_this()](boost::system::error_code ec) {
      auto s = w.lock();
      if (ec || !s || s->over) return;
      s->give_up(s->last.empty() ? fmt::format("ddp-ncclid gave no id within {}", format_duration(s->deadline))
                                 : std::string(trim(s->last)));
    });
  }

  void read() {
    out->sd.async_read_some(
        asio::buffer(out->buf), [w = weak_from_this(), d = out](boost::system::error_code ec, std::size_t n) {
          auto s = w.lock();
          if (!s || s->over) return;
          if (ec) {
            return s->give_up(s->last.empty()
                                  ? std::string("ddp-ncclid ended without printing an id (see its stderr above)")
                                  : std::string(trim(s->last)));
          }
          s->pending.append(d->buf.data(), n);
          if (s->take_lines()) s->read();
        });
  }

  // Each whole line of stdout (bounded at 4 KiB): the id ends the wait, an "error: " line or 64
  // stray lines give up. False once the wait is over.
  bool take_lines() {
    while (true) {
      auto nl = pending.find('\n');
      if (nl == std::string::npos && pending.size() < 4096) return true;
      std::string line = pending.substr(0, nl);
      pending.erase(0, nl == std::string::npos ? pending.size() : nl + 1);
      if (nccl::holder::parse_line(line)) {
        holder->hex_ = std::string(trim(line));
        log::get("nccl")->debug("NCCL unique id from ddp-ncclid pid {}", holder->pid());
        // From now on nobody needs its output, but it must never block on a full pipe.
        NcclHolder::discard(out);
        auto h = std::move(holder);
        holder.reset();
        complete(std::move(h), {});
        return false;
      }
      last = line;
      if (starts_with(line, nccl::holder::kErrorPrefix) || ++lines >= 64) {
        give_up(std::string(trim(last)));
        return false;
      }
    }
  }
};

NcclHolderWait::~NcclHolderWait() {
  if (!s_) return;
  s_->over = true;
  s_->timer.cancel();
  if (s_->holder) s_->holder->stop();
  s_->holder.reset();
}

std::unique_ptr<NcclHolderWait> NcclHolder::start(asio::io_context& io, contract::Env env, const std::string& workdir,
                                                  const std::string& attempt_dir, jobspec::NcclUniqueId mode,
                                                  bool in_container, std::optional<supervisor::RunAs> run_as,
                                                  NcclHolderDone done, std::chrono::milliseconds deadline) {
  auto log = log::get("nccl");
  auto s = std::make_shared<NcclHolderWait::State>(io, mode, std::move(done), deadline);
  auto wait = std::make_unique<NcclHolderWait>(s);
  if (mode == jobspec::NcclUniqueId::off) {
    s->complete_later({});
    return wait;
  }
  if (in_container) {
    // This holder would load the host's libnccl; the workers load the image's (`on` is refused
    // by the job file parser for the same reason).
    log->debug("no NCCL unique id for a container job: the host's libnccl may not match the image's");
    s->complete_later({});
    return wait;
  }
  auto exe = holder_binary();
  if (!exe) {
    s->complete_later(s->refusal("ddp-ncclid was not found beside this program or on PATH"));
    return wait;
  }
  // NCCL's own log lines (NCCL_DEBUG=INFO) go to stdout by default, where the id is: keep
  // them in a file of the attempt unless the job chose a place.
  env.try_emplace("NCCL_DEBUG_FILE", attempt_dir + "/ddp-ncclid.nccl.log");
  supervisor::SpawnSpec spec;
  spec.argv = {*exe, "--expect-parent", std::to_string(::getpid())};
  spec.env = std::move(env);
  spec.workdir = workdir;
  spec.stdin_pipe = true;
  spec.own_process_group = false;
  spec.run_as = std::move(run_as);
  supervisor::Spawned sp;
  try {
    sp = supervisor::spawn(spec);
  } catch (const supervisor::SpawnError& e) {
    s->complete_later(s->refusal(e.what()));
    return wait;
  }
  s->holder.emplace(NcclHolder(sp.pid, sp.stdin_fd));
  s->out = std::make_shared<Drain>(io, sp.stdout_fd);
  auto err = std::make_shared<Drain>(io, sp.stderr_fd);
  s->holder->drains_ = {s->out, err};
  discard(err);
  s->read();
  s->wait_deadline();
  return wait;
}

// The pidfd is opened at once, on the loop that spawned the holder and that alone reaps it
// (reap_children, waitpid(-1)): the holder is still our child then, reaped or not, and a signal
// sent through the pidfd later never reaches another process that got its pid meanwhile.
// Without pidfds (Linux before 5.3), by pid as before.
NcclHolder::NcclHolder(pid_t pid, int in)
    : pid_(pid), pidfd_(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0))), in_(in) {}

NcclHolder::NcclHolder(NcclHolder&& o) noexcept
    : pid_(std::exchange(o.pid_, -1)),
      pidfd_(std::exchange(o.pidfd_, -1)),
      in_(std::exchange(o.in_, -1)),
      hex_(std::move(o.hex_)),
      drains_(std::move(o.drains_)) {}

void NcclHolder::stop() {
  for (auto& d : drains_) {
    boost::system::error_code ignored;
    d->sd.close(ignored);
  }
  drains_.clear();
  if (in_ >= 0) ::close(in_), in_ = -1;
  if (pidfd_ >= 0) {
    // Gone before we go on: an attempt's end, and a launcher's exit, leave no holder behind and
    // its bootstrap port closed. It ends at once on SIGTERM or its stdin's EOF; one stuck inside
    // NCCL gets SIGKILL after a second. Reaped here unless the owner's loop has done it.
    ::syscall(SYS_pidfd_send_signal, pidfd_, SIGTERM, nullptr, 0);  // ESRCH once it has exited
    if (!pidfd_exited_within(pidfd_, std::chrono::seconds(1))) {
      ::syscall(SYS_pidfd_send_signal, pidfd_, SIGKILL, nullptr, 0);
      pidfd_exited_within(pidfd_, std::chrono::seconds(1));
    }
    siginfo_t info{};
    ::waitid(idtype_t(3) /* P_PIDFD */, id_t(pidfd_), &info, WEXITED | WNOHANG);
    ::close(pidfd_), pidfd_ = -1;
  } else if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
  }
  pid_ = -1;
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

void NcclHolder::discard(const std::shared_ptr<Drain>& d) {
  d->sd.async_read_some(asio::buffer(d->buf), [d](boost::system::error_code ec, std::size_t) {
    if (!ec) discard(d);
  });
}

}  // namespace ddp::launch

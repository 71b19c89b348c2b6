// ddp-ncclid: the NCCL unique id holder, one per job attempt, started by the launcher on node
// rank 0 with the workers' environment. NCCL's bootstrap root listens inside the process that
// calls ncclGetUniqueId, so this process must outlive the attempt's ncclCommInitRank calls.
//
// Protocol (the contract is lib/nccl/holder_protocol.hpp; keep both in step):
//   ddp-ncclid [--nccl-lib PATH] [--expect-parent PID]
//     stdin : a pipe held open by the launcher; EOF means stop (bytes are read and ignored).
//     stdout: exactly one line: the 256-lowercase-hex id + "\n", or "error: <message>\n" and
//             exit 3. Nothing else is ever written to stdout.
//     stderr: diagnostics only.
//     After the id line: alive until EOF on stdin, SIGTERM, SIGINT, SIGHUP, SIGQUIT, or the parent's death
//     (PR_SET_PDEATHSIG SIGTERM), then exit 0.
//   ddp-ncclid --decode HEX
//     a debugging aid: prints the id's bootstrap root as one JSON object
//     {"family":"ipv4","ip":"127.0.0.1","port":N,"magic":"0x...","endpoint":"127.0.0.1:N"}
//     and exits 0, or "error: ..." and exit 3. Needs no NCCL.
//
// Policy: SIGTERM/SIGINT/SIGHUP/SIGQUIT are blocked before NCCL starts any thread (threads inherit the mask), and
// taken through a signalfd, so they always end in a clean exit 0. The exit is _exit: NCCL's root
// thread is still running and static destructors must not pull its state from under it.
#include "common/log.hpp"
#include "nccl/holder_protocol.hpp"
#include "nccl/library.hpp"
#include "nccl/unique_id.hpp"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

namespace holder = ddp::nccl::holder;

// One write of the whole line, so a reader never sees half of it interleaved with anything.
bool write_line(const std::string& line) {
  std::string buf = line + "\n";
  std::size_t done = 0;
  while (done < buf.size()) {
    ssize_t n = ::write(STDOUT_FILENO, buf.data() + done, buf.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

[[noreturn]] void fail(const std::string& message) {
  ddp::log::get("nccl")->error("{}", message);
  ddp::log::get("nccl")->flush();
  write_line(std::string(holder::kErrorPrefix) + message);
  std::_Exit(holder::kExitFailed);
}

int decode_mode(const std::string& hex) {
  auto id = ddp::nccl::unique_id_from_hex(hex);
  if (!id) fail(id.error);
  auto addr = ddp::nccl::decode_bootstrap_address(*id.value);
  if (!addr) fail(addr.error);
  char magic[19];
  std::snprintf(magic, sizeof magic, "0x%016llx", static_cast<unsigned long long>(addr.value->magic));
  nlohmann::json j = {{"family", ddp::nccl::to_string(addr.value->family)},
                      {"ip", addr.value->ip},
                      {"port", addr.value->port},
                      {"scope_id", addr.value->scope_id},
                      {"magic", magic},
                      {"endpoint", addr.value->endpoint()}};
  write_line(j.dump());
  return 0;
}

// Returns the signalfd for SIGTERM/SIGINT/SIGHUP/SIGQUIT, all blocked in this (still only) thread.
// The holder is in the launcher's process group: a terminal's Ctrl-C, Ctrl-\ or hangup reaches
// it too, and must end it cleanly (SIGQUIT's default would dump a core).
int block_stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  sigaddset(&set, SIGQUIT);
  if (sigprocmask(SIG_BLOCK, &set, nullptr) != 0) fail(std::string("sigprocmask: ") + std::strerror(errno));
  int fd = signalfd(-1, &set, SFD_CLOEXEC);
  if (fd < 0) fail(std::string("signalfd: ") + std::strerror(errno));
  std::signal(SIGPIPE, SIG_IGN);  // a closed stdout shows up as a failed write instead
  return fd;
}

void die_with_parent(pid_t parent_before, long expect_parent) {
  if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) fail(std::string("prctl(PR_SET_PDEATHSIG): ") + std::strerror(errno));
  // The parent may have died before prctl took effect; then no signal will ever come.
  pid_t now = getppid();
  pid_t expected = expect_parent > 0 ? static_cast<pid_t>(expect_parent) : parent_before;
  if (now != expected) fail("the launcher (pid " + std::to_string(expected) + ") is gone; not serving an id");
}

// Blocks until EOF on stdin or a stop signal. Returns what ended it, for the log.
std::string wait_for_stop(int sigfd) {
  pollfd fds[2] = {{STDIN_FILENO, POLLIN, 0}, {sigfd, POLLIN, 0}};
  char buf[4096];
  for (;;) {
    int n = poll(fds, 2, -1);  // no deadline by design: the attempt's length is the launcher's call
    if (n < 0) {
      if (errno == EINTR) continue;
      return std::string("poll failed: ") + std::strerror(errno);
    }
    if (fds[1].revents & POLLIN) {
      signalfd_siginfo info{};
      if (read(sigfd, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
        return std::string("signal ") + strsignal(static_cast<int>(info.ssi_signo));
      }
    }
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL)) {
      if (fds[0].revents & POLLNVAL) return "stdin is closed";
      ssize_t r = read(STDIN_FILENO, buf, sizeof buf);
      if (r == 0) return "EOF on stdin";
      if (r < 0 && errno != EINTR && errno != EAGAIN) return std::string("stdin read error: ") + std::strerror(errno);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const pid_t parent_before = getppid();
  ddp::log::configure_from_env();
  auto log = ddp::log::get("nccl");

  CLI::App app{
      "Holds a job attempt's NCCL unique id: prints it, then keeps NCCL's bootstrap root alive "
      "until stdin reaches EOF or SIGTERM/SIGINT."};
  std::string nccl_lib;
  std::string decode_hex;
  long expect_parent = 0;
  app.add_option("--nccl-lib", nccl_lib, "load this libnccl instead of searching for libnccl.so.2");
  app.add_option("--expect-parent", expect_parent, "pid of the launcher; exit at once if it is not our parent");
  app.add_option("--decode", decode_hex, "print the bootstrap address inside this hex id as JSON, then exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fail(std::string("bad arguments: ") + e.what());
  }
  if (!decode_hex.empty()) return decode_mode(decode_hex);

  int sigfd = block_stop_signals();
  die_with_parent(parent_before, expect_parent);

  ddp::nccl::UniqueId id;
  try {
    auto lib = ddp::nccl::Library::load(
        {.path = nccl_lib, .hint = "the job asked for an NCCL unique id: install NCCL or set nccl.unique_id: off"});
    if (std::getenv("NCCL_COMM_ID")) {
      log->warn("NCCL_COMM_ID is set: NCCL will use that fixed address and magic instead of a fresh root");
    }
    id = lib.get_unique_id();
    // The id first: the workers wait for it, the log line can wait for them.
    if (!write_line(ddp::nccl::to_hex(id))) fail("cannot write the id to stdout (launcher gone?)");
    const char* ifname = std::getenv("NCCL_SOCKET_IFNAME");
    auto addr = ddp::nccl::decode_bootstrap_address(id);
    log->info("NCCL {} ({}): bootstrap root listening on {} (NCCL_SOCKET_IFNAME={})", lib.version(), lib.path(),
              addr ? addr.value->endpoint() : "? (" + addr.error + ")", ifname ? ifname : "unset");
  } catch (const std::exception& e) {
    fail(e.what());
  }

  std::string why = wait_for_stop(sigfd);
  log->debug("stopping: {}", why);
  log->flush();
  std::_Exit(holder::kExitStopped);
}

// See native.hpp.
#include "stacks/native.hpp"

#ifdef DDP_HAVE_LIBDW
#include "stacks/elf.hpp"
#include "stacks/libdw.hpp"

#include <cxxabi.h>
#include <fcntl.h>
#include <sys/ptrace.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dirent.h>

#include <algorithm>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#endif

namespace ddp::stacks {

#ifndef DDP_HAVE_LIBDW

bool native_available() {
  return false;
}

NativeRead read_native(pid_t, const NativeLimits&) {
  NativeRead r;
  r.errors.push_back("native stacks: this build has no libdw (install Debian's libdw-dev and rebuild)");
  return r;
}

struct NativeCapture::Impl {};

NativeCapture capture_native(pid_t, const NativeLimits&) {
  return {};
}

NativeRead unwind_native(pid_t pid, NativeCapture, const NativeLimits& limits) {
  return read_native(pid, limits);
}

#else

namespace {

// libdw's table, loaded by then: every entry point below checks libdw() first.
const Libdw& dw() {
  return *libdw();
}

char* debuginfo_path = nullptr;
// dwfl_standard_find_debuginfo looks in the module itself, then /usr/lib/debug by build id; it
// asks a debuginfod server only when DEBUGINFOD_URLS is set (ddpctl clears it: no network).
const Dwfl_Callbacks* callbacks() {
  static const Dwfl_Callbacks c = {
      .find_elf = dw().dwfl_linux_proc_find_elf,
      .find_debuginfo = dw().dwfl_standard_find_debuginfo,
      .section_address = nullptr,
      .debuginfo_path = &debuginfo_path,
  };
  return &c;
}

struct DwflDeleter {
  void operator()(Dwfl* d) const { dw().dwfl_end(d); }
};

#if !defined(__x86_64__)
struct Ctx {
  Dwfl* dwfl;
  const NativeLimits* limits;
  NativeRead* out;
  std::map<int, std::vector<std::uint64_t> > pcs;  // raw, symbolised after every detach
  std::vector<std::uint64_t>* current = nullptr;
  bool current_truncated = false;
};

int on_frame(Dwfl_Frame* frame, void* arg) {
  auto* c = static_cast<Ctx*>(arg);
  Dwarf_Addr pc = 0;
  bool activation = false;
  if (!dw().dwfl_frame_pc(frame, &pc, &activation)) return DWARF_CB_ABORT;
  // A return address points after the call: look up the call itself.
  c->current->push_back(activation ? pc : pc - 1);
  if (int(c->current->size()) >= c->limits->max_depth) {
    c->current_truncated = true;
    return DWARF_CB_ABORT;
  }
  return DWARF_CB_OK;
}

int on_thread(Dwfl_Thread* thread, void* arg) {
  auto* c = static_cast<Ctx*>(arg);
  const int tid = int(dw().dwfl_thread_tid(thread));
  if (int(c->pcs.size()) >= c->limits->max_threads) return DWARF_CB_ABORT;
  c->current = &c->pcs[tid];
  c->current_truncated = false;
  // dwfl_thread_getframes attaches the thread (PTRACE_ATTACH + wait), unwinds and detaches it:
  // the time around it bounds how long this thread was stopped.
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = dw().dwfl_thread_getframes(thread, on_frame, c);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  c->out->stop_ms[tid] = ms;
  c->out->stop_max_ms = std::max(c->out->stop_max_ms, ms);
  c->out->stop_total_ms += ms;
  c->out->truncated[tid] = c->current_truncated;
  if (rc != 0 && c->current->empty())
    c->out->errors.push_back("thread " + std::to_string(tid) + ": " + dw().dwfl_errmsg(-1));
  return DWARF_CB_OK;
}

#endif

std::string demangle(const char* name) {
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> d(abi::__cxa_demangle(name, nullptr, nullptr, &status), &std::free);
  return status == 0 && d ? std::string(d.get()) : std::string(name);
}

int preload(Dwfl_Module* m, void**, const char*, Dwarf_Addr, void*) {
  Dwarf_Addr bias = 0;
  dw().dwfl_module_getelf(m, &bias);
  dw().dwfl_module_eh_cfi(m, &bias);
  return DWARF_CB_OK;
}

}  // namespace

bool native_available() {
  return libdw() != nullptr;
}

namespace {

std::string slurp_small(const std::string& path, std::size_t max) {
  std::string out;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[65536];
  for (ssize_t n; out.size() < max && (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, std::size_t(n));
  ::close(fd);
  return out;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::string ptrace_hint(int err) {
  if (err == EPERM || err == EACCES)
    return " (ptrace needs root, or the same user with kernel.yama.ptrace_scope=0, and no other tracer such as a "
           "debugger)";
  return "";
}

// Symbolises raw pcs (innermost first) after every thread is running again.
std::vector<Frame> symbolise(Dwfl* dwfl, const std::vector<std::uint64_t>& pcs) {
  std::vector<Frame> frames;
  for (std::uint64_t pc : pcs) {
    Frame f;
    f.kind = Frame::Kind::native;
    f.function = "??";
    if (Dwfl_Module* m = dw().dwfl_addrmodule(dwfl, pc)) {
      const char* mainfile = nullptr;
      const char* modname = dw().dwfl_module_info(m, nullptr, nullptr, nullptr, nullptr, nullptr, &mainfile, nullptr);
      std::string file = mainfile ? mainfile : (modname ? modname : "");
      if (auto slash = file.rfind('/'); slash != std::string::npos) file = file.substr(slash + 1);
      f.file = file;
      GElf_Off off = 0;
      GElf_Sym sym;
      if (const char* name = dw().dwfl_module_addrinfo(m, pc, &off, &sym, nullptr, nullptr, nullptr)) {
        f.function = demangle(name);
        f.offset = off;
      }
    }
    frames.push_back(std::move(f));
  }
  return frames;
}

#if defined(__x86_64__)

// x86-64: each thread is stopped only to copy its registers and the live part of its stack
// (PTRACE_SEIZE + PTRACE_INTERRUPT: no SIGSTOP is queued, so nothing is left for the process to
// see), then let go; libdw unwinds from the copies afterwards. The stop costs tens of
// microseconds instead of the whole unwind (libdw's own attach holds the thread while it reads
// the stack word by word with PTRACE_PEEKDATA).
constexpr std::uint64_t kStackCopy = 256 * 1024;  // deeper frames are read live, after the stop
constexpr std::uint64_t kRedZone = 128;

struct Snapshot {
  int tid = 0;
  user_regs_struct regs{};
  std::uint64_t stack_lo = 0;
  std::vector<std::uint8_t> stack;
};

struct SnapshotState {
  pid_t pid = 0;
  std::vector<Snapshot>* snaps = nullptr;
  std::size_t next = 0;
  const Snapshot* current = nullptr;
};

// Stops one thread, copies, lets it go. Returns an error message, or "" (also for a thread that
// ended meanwhile, which is simply not there).
std::string take_snapshot(pid_t pid, int tid, const std::vector<Mapping>& maps, Snapshot& out, double& stop_ms) {
  // A thread in uninterruptible sleep would not stop until it leaves it (maybe never, in a hang
  // on a device or a network file system): it is not attached, and says where it sleeps.
  const std::string stat = slurp_small("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/stat", 4096);
  if (auto rp = stat.rfind(')'); rp != std::string::npos && rp + 2 < stat.size() && stat[rp + 2] == 'D') {
    std::string wchan = slurp_small("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/wchan", 256);
    return "thread " + std::to_string(tid) + " is in uninterruptible sleep (in the kernel at " +
           (wchan.empty() ? "?" : wchan) + "): its native stack was not taken";
  }
  if (::ptrace(PTRACE_SEIZE, tid, nullptr, nullptr) != 0) {
    const int e = errno;
    if (e == ESRCH) return "";
    return "cannot ptrace thread " + std::to_string(tid) + ": " + std::strerror(e) + ptrace_hint(e);
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::string err;
  int status = 0;
  if (::ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr) != 0) {
    err = std::string("PTRACE_INTERRUPT: ") + std::strerror(errno);
  } else {
    pid_t w;
    do w = ::waitpid(tid, &status, __WALL);
    while (w < 0 && errno == EINTR);
    if (w != tid || !WIFSTOPPED(status)) {
      ::ptrace(PTRACE_DETACH, tid, nullptr, nullptr);
      return "";  // it ended
    }
    if (::ptrace(PTRACE_GETREGS, tid, nullptr, &out.regs) != 0) {
      err = std::string("PTRACE_GETREGS: ") + std::strerror(errno);
    } else {
      const std::uint64_t sp = out.regs.rsp;
      for (const auto& m : maps) {
        if (sp < m.start || sp >= m.end) continue;
        out.stack_lo = std::max(m.start, sp - kRedZone);
        const std::uint64_t hi = std::min(m.end, sp + kStackCopy);
        out.stack.resize(hi - out.stack_lo);
        iovec local{out.stack.data(), out.stack.size()};
        iovec remote{reinterpret_cast<void*>(out.stack_lo), out.stack.size()};
        const ssize_t got = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
        out.stack.resize(got > 0 ? std::size_t(got) : 0);
        break;
      }
    }
  }
  // A signal that arrived meanwhile (a signal-delivery stop, not our interrupt's event stop)
  // goes back to the thread on the way out.
  const bool event_stop = (status >> 16) == PTRACE_EVENT_STOP;
  const long sig = WIFSTOPPED(status) && !event_stop ? WSTOPSIG(status) : 0;
  ::ptrace(PTRACE_DETACH, tid, nullptr, reinterpret_cast<void*>(sig));
  stop_ms = ms_since(t0);
  out.tid = tid;
  if (!err.empty()) return "thread " + std::to_string(tid) + ": " + err;
  return "";
}

pid_t snap_next_thread(Dwfl*, void* arg, void** thread_arg) {
  auto* st = static_cast<SnapshotState*>(arg);
  if (st->next >= st->snaps->size()) return 0;
  Snapshot& s = (*st->snaps)[st->next++];
  *thread_arg = &s;
  return s.tid;
}

bool snap_memory_read(Dwfl*, Dwarf_Addr addr, Dwarf_Word* result, void* arg) {
  auto* st = static_cast<SnapshotState*>(arg);
  if (const Snapshot* s = st->current; s && addr >= s->stack_lo && addr + 8 <= s->stack_lo + s->stack.size()) {
    std::memcpy(result, s->stack.data() + (addr - s->stack_lo), 8);
    return true;
  }
  // Beyond the copy (a very deep stack): read it live; a blocked thread's older frames do not move.
  iovec local{result, 8};
  iovec remote{reinterpret_cast<void*>(addr), 8};
  return ::process_vm_readv(st->pid, &local, 1, &remote, 1, 0) == 8;
}

bool snap_set_initial_registers(Dwfl_Thread* thread, void* thread_arg) {
  const auto* s = static_cast<const Snapshot*>(thread_arg);
  const user_regs_struct& r = s->regs;
  // DWARF register numbers of x86-64 (System V psABI): rax rdx rcx rbx rsi rdi rbp rsp r8..r15, rip.
  const Dwarf_Word regs[17] = {r.rax, r.rdx, r.rcx, r.rbx, r.rsi, r.rdi, r.rbp, r.rsp, r.r8,
                               r.r9,  r.r10, r.r11, r.r12, r.r13, r.r14, r.r15, r.rip};
  return dw().dwfl_thread_state_registers(thread, 0, 17, regs);
}

const Dwfl_Thread_Callbacks snapshot_callbacks = {
    .next_thread = snap_next_thread,
    .get_thread = nullptr,
    .memory_read = snap_memory_read,
    .set_initial_registers = snap_set_initial_registers,
    .detach = nullptr,
    .thread_detach = nullptr,
};

struct SnapCtx {
  SnapshotState* state;
  const NativeLimits* limits;
  std::map<int, std::vector<std::uint64_t> > pcs;
  std::map<int, bool> truncated;
  std::vector<std::string> errors;
  std::vector<std::uint64_t>* current = nullptr;
};

int snap_on_frame(Dwfl_Frame* frame, void* arg) {
  auto* c = static_cast<SnapCtx*>(arg);
  Dwarf_Addr pc = 0;
  bool activation = false;
  if (!dw().dwfl_frame_pc(frame, &pc, &activation)) return DWARF_CB_ABORT;
  c->current->push_back(activation ? pc : pc - 1);
  if (int(c->current->size()) >= c->limits->max_depth) {
    c->truncated[int(dw().dwfl_thread_tid(dw().dwfl_frame_thread(frame)))] = true;
    return DWARF_CB_ABORT;
  }
  return DWARF_CB_OK;
}

int snap_on_thread(Dwfl_Thread* thread, void* arg) {
  auto* c = static_cast<SnapCtx*>(arg);
  const int tid = int(dw().dwfl_thread_tid(thread));
  for (const auto& s : *c->state->snaps)
    if (s.tid == tid) c->state->current = &s;
  c->current = &c->pcs[tid];
  if (dw().dwfl_thread_getframes(thread, snap_on_frame, c) != 0 && c->current->empty())
    c->errors.push_back("thread " + std::to_string(tid) + ": " + dw().dwfl_errmsg(-1));
  return DWARF_CB_OK;
}

}  // namespace

struct NativeCapture::Impl {
  std::vector<Snapshot> snaps;
  NativeRead partial;  // stop times and the errors of the capture
};

namespace {

void take_snapshots(pid_t pid, const NativeLimits& limits, NativeCapture::Impl& cap) {
  NativeRead& out = cap.partial;
  const auto maps = parse_maps(slurp_small("/proc/" + std::to_string(pid) + "/maps", 64u << 20));
  std::vector<int> tids;
  if (DIR* d = ::opendir(("/proc/" + std::to_string(pid) + "/task").c_str())) {
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] >= '0' && e->d_name[0] <= '9' && int(tids.size()) < limits.max_threads)
        tids.push_back(std::atoi(e->d_name));
    ::closedir(d);
  }
  auto& snaps = cap.snaps;
  snaps.reserve(tids.size());
  for (int tid : tids) {
    Snapshot s;
    double stop = 0;
    std::string err = take_snapshot(pid, tid, maps, s, stop);
    if (stop > 0) out.stop_ms[tid] = stop;
    out.stop_max_ms = std::max(out.stop_max_ms, stop);
    out.stop_total_ms += stop;
    if (!err.empty()) out.errors.push_back("native stacks: " + err);
    if (s.tid != 0 && err.empty()) snaps.push_back(std::move(s));
    if (!err.empty() && err.find("cannot ptrace") != std::string::npos) break;  // the same for every thread
  }
}

void unwind_from_snapshots(Dwfl* dwfl, pid_t pid, const NativeLimits& limits, NativeCapture::Impl& cap,
                           NativeRead& out) {
  auto& snaps = cap.snaps;
  SnapshotState state{pid, &snaps, 0, nullptr};
  if (!dw().dwfl_attach_state(dwfl, nullptr, pid, &snapshot_callbacks, &state)) {
    out.errors.push_back(std::string("native stacks: dwfl_attach_state: ") + dw().dwfl_errmsg(-1));
    return;
  }
  SnapCtx ctx{&state, &limits, {}, {}, {}};
  dw().dwfl_getthreads(dwfl, snap_on_thread, &ctx);
  for (auto& e : ctx.errors) out.errors.push_back("native stacks: " + e);
  for (auto& [tid, pcs] : ctx.pcs) {
    out.threads[tid] = symbolise(dwfl, pcs);
    out.truncated[tid] = ctx.truncated[tid];
  }
}

#else
}  // namespace
struct NativeCapture::Impl {
  NativeRead partial;
};
namespace {
#endif

}  // namespace

NativeCapture capture_native(pid_t pid, const NativeLimits& limits) {
  NativeCapture c;
  if (!libdw()) return c;  // nothing could unwind what stopping the threads would capture
#if defined(__x86_64__)
  take_snapshots(pid, limits, *c.impl);
#else
  (void)pid;
  (void)limits;
#endif
  return c;
}

NativeRead unwind_native(pid_t pid, NativeCapture capture, const NativeLimits& limits) {
  NativeRead out = std::move(capture.impl->partial);
  if (!libdw()) {
    out.errors.push_back(libdw_error());
    return out;
  }
  std::unique_ptr<Dwfl, DwflDeleter> dwfl(dw().dwfl_begin(callbacks()));
  if (!dwfl) {
    out.errors.push_back(std::string("native stacks: dwfl_begin: ") + dw().dwfl_errmsg(-1));
    return out;
  }
  dw().dwfl_report_begin(dwfl.get());
  if (int e = dw().dwfl_linux_proc_report(dwfl.get(), pid); e != 0) {
    out.errors.push_back("native stacks: cannot read /proc/" + std::to_string(pid) +
                         "/maps: " + std::strerror(e > 0 ? e : EINVAL));
    return out;
  }
  dw().dwfl_report_end(dwfl.get(), nullptr, nullptr);
  dw().dwfl_getmodules(dwfl.get(), preload, nullptr, 0);
#if defined(__x86_64__)
  unwind_from_snapshots(dwfl.get(), pid, limits, *capture.impl, out);
#else
  // Elsewhere libdw attaches each thread itself and holds it for the whole unwind.
  if (int e = dw().dwfl_linux_proc_attach(dwfl.get(), pid, false); e != 0) {
    out.errors.push_back("native stacks: cannot attach to pid " + std::to_string(pid) + ": " +
                         (e > 0 ? std::strerror(e) : dw().dwfl_errmsg(-1)) + ptrace_hint(e > 0 ? e : EPERM));
    return out;
  }
  Ctx ctx{dwfl.get(), &limits, &out, {}};
  if (dw().dwfl_getthreads(dwfl.get(), on_thread, &ctx) < 0 && ctx.pcs.empty())
    out.errors.push_back(std::string("native stacks: ") + dw().dwfl_errmsg(-1) + ptrace_hint(EPERM));
  for (auto& [tid, pcs] : ctx.pcs) out.threads[tid] = symbolise(dwfl.get(), pcs);
#endif
  return out;
}

NativeRead read_native(pid_t pid, const NativeLimits& limits) {
  return unwind_native(pid, capture_native(pid, limits), limits);
}

#endif

NativeCapture::NativeCapture() : impl(std::make_unique<Impl>()) {}
NativeCapture::~NativeCapture() = default;
NativeCapture::NativeCapture(NativeCapture&&) noexcept = default;
NativeCapture& NativeCapture::operator=(NativeCapture&&) noexcept = default;

}  // namespace ddp::stacks

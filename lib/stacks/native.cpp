// See native.hpp.
#include "stacks/native.hpp"

#ifdef DDP_HAVE_LIBDW
#include <cxxabi.h>
#include <elfutils/libdwfl.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#endif

namespace ddp::stacks {

#ifndef DDP_HAVE_LIBDW

bool native_available() { return false; }

NativeRead read_native(pid_t, const NativeLimits&) {
  NativeRead r;
  r.errors.push_back("native stacks: this build has no libdw (install Debian's libdw-dev and rebuild)");
  return r;
}

#else

namespace {

char* debuginfo_path = nullptr;
// dwfl_standard_find_debuginfo looks in the module itself, then /usr/lib/debug by build id; it
// asks a debuginfod server only when DEBUGINFOD_URLS is set (ddpctl clears it: no network).
const Dwfl_Callbacks callbacks = {
    .find_elf = dwfl_linux_proc_find_elf,
    .find_debuginfo = dwfl_standard_find_debuginfo,
    .section_address = nullptr,
    .debuginfo_path = &debuginfo_path,
};

struct DwflDeleter {
  void operator()(Dwfl* d) const { dwfl_end(d); }
};

struct Ctx {
  Dwfl* dwfl;
  const NativeLimits* limits;
  NativeRead* out;
  std::map<int, std::vector<std::uint64_t>> pcs;  // raw, symbolised after every detach
  std::vector<std::uint64_t>* current = nullptr;
  bool current_truncated = false;
};

int on_frame(Dwfl_Frame* frame, void* arg) {
  auto* c = static_cast<Ctx*>(arg);
  Dwarf_Addr pc = 0;
  bool activation = false;
  if (!dwfl_frame_pc(frame, &pc, &activation)) return DWARF_CB_ABORT;
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
  const int tid = int(dwfl_thread_tid(thread));
  if (int(c->pcs.size()) >= c->limits->max_threads) return DWARF_CB_ABORT;
  c->current = &c->pcs[tid];
  c->current_truncated = false;
  // dwfl_thread_getframes attaches the thread (PTRACE_ATTACH + wait), unwinds and detaches it:
  // the time around it bounds how long this thread was stopped.
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = dwfl_thread_getframes(thread, on_frame, c);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  c->out->stop_max_ms = std::max(c->out->stop_max_ms, ms);
  c->out->stop_total_ms += ms;
  c->out->truncated[tid] = c->current_truncated;
  if (rc != 0 && c->current->empty())
    c->out->errors.push_back("thread " + std::to_string(tid) + ": " + dwfl_errmsg(-1));
  return DWARF_CB_OK;
}

std::string demangle(const char* name) {
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> d(abi::__cxa_demangle(name, nullptr, nullptr, &status), &std::free);
  return status == 0 && d ? std::string(d.get()) : std::string(name);
}

int preload(Dwfl_Module* m, void**, const char*, Dwarf_Addr, void*) {
  Dwarf_Addr bias = 0;
  dwfl_module_getelf(m, &bias);
  dwfl_module_eh_cfi(m, &bias);
  return DWARF_CB_OK;
}

}  // namespace

bool native_available() { return true; }

NativeRead read_native(pid_t pid, const NativeLimits& limits) {
  NativeRead out;
  std::unique_ptr<Dwfl, DwflDeleter> dwfl(dwfl_begin(&callbacks));
  if (!dwfl) {
    out.errors.push_back(std::string("native stacks: dwfl_begin: ") + dwfl_errmsg(-1));
    return out;
  }
  dwfl_report_begin(dwfl.get());
  if (int e = dwfl_linux_proc_report(dwfl.get(), pid); e != 0) {
    out.errors.push_back("native stacks: cannot read /proc/" + std::to_string(pid) + "/maps: " + std::strerror(e > 0 ? e : EINVAL));
    return out;
  }
  dwfl_report_end(dwfl.get(), nullptr, nullptr);
  dwfl_getmodules(dwfl.get(), preload, nullptr, 0);
  if (int e = dwfl_linux_proc_attach(dwfl.get(), pid, false); e != 0) {
    out.errors.push_back("native stacks: cannot attach to pid " + std::to_string(pid) + ": " +
                         (e > 0 ? std::strerror(e) : dwfl_errmsg(-1)) +
                         " (needs root, or the same user with kernel.yama.ptrace_scope=0)");
    return out;
  }
  Ctx ctx{dwfl.get(), &limits, &out, {}};
  if (dwfl_getthreads(dwfl.get(), on_thread, &ctx) < 0 && ctx.pcs.empty())
    out.errors.push_back(std::string("native stacks: ") + dwfl_errmsg(-1) +
                         " (ptrace refused? needs root, or the same user with kernel.yama.ptrace_scope=0)");
  for (auto& [tid, pcs] : ctx.pcs) {
    auto& frames = out.threads[tid];
    for (std::uint64_t pc : pcs) {
      Frame f;
      f.kind = Frame::Kind::native;
      f.function = "??";
      if (Dwfl_Module* m = dwfl_addrmodule(dwfl.get(), pc)) {
        const char* mainfile = nullptr;
        const char* modname = dwfl_module_info(m, nullptr, nullptr, nullptr, nullptr, nullptr, &mainfile, nullptr);
        std::string file = mainfile ? mainfile : (modname ? modname : "");
        if (auto slash = file.rfind('/'); slash != std::string::npos) file = file.substr(slash + 1);
        f.file = file;
        GElf_Off off = 0;
        GElf_Sym sym;
        if (const char* name = dwfl_module_addrinfo(m, pc, &off, &sym, nullptr, nullptr, nullptr)) {
          f.function = demangle(name);
          f.offset = off;
        }
      }
      frames.push_back(std::move(f));
    }
  }
  return out;
}

#endif

}  // namespace ddp::stacks

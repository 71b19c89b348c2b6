// elfutils' libdw, called through a table. ddpctl and the coordinator load libdw.so.1 the first
// time they read a native stack (libdw_dlopen.cpp), so a launch maps neither it nor the four
// libraries it needs (libelf, libz, liblzma, libbz2; docs/performance.md). The agent, which
// ddpctl --ssh uploads to nodes that may lack libdw1, has it linked in statically
// (libdw_direct.cpp). Which one a program gets is chosen when it is linked (DDP_PORTABLE,
// lib/stacks/CMakeLists.txt). The members' types are the declarations in elfutils' headers
// (decltype), so a changed signature fails the build.
#pragma once

#include <elfutils/libdwfl.h>

#include <string>

// Every libdw function native.cpp calls or hands to libdw as a callback.
#define DDP_LIBDW_FUNCTIONS(X)    \
  X(dwfl_addrmodule)              \
  X(dwfl_attach_state)            \
  X(dwfl_begin)                   \
  X(dwfl_end)                     \
  X(dwfl_errmsg)                  \
  X(dwfl_frame_pc)                \
  X(dwfl_frame_thread)            \
  X(dwfl_getmodules)              \
  X(dwfl_getthreads)              \
  X(dwfl_linux_proc_attach)       \
  X(dwfl_linux_proc_find_elf)     \
  X(dwfl_linux_proc_report)       \
  X(dwfl_module_addrinfo)         \
  X(dwfl_module_eh_cfi)           \
  X(dwfl_module_getelf)           \
  X(dwfl_module_info)             \
  X(dwfl_report_begin)            \
  X(dwfl_report_end)              \
  X(dwfl_standard_find_debuginfo) \
  X(dwfl_thread_getframes)        \
  X(dwfl_thread_state_registers)  \
  X(dwfl_thread_tid)

namespace ddp::stacks {

struct Libdw {
#define DDP_LIBDW_MEMBER(name) decltype(&::name) name = nullptr;
  DDP_LIBDW_FUNCTIONS(DDP_LIBDW_MEMBER)
#undef DDP_LIBDW_MEMBER
};

// The table, loaded on the first call (thread-safe); nullptr when libdw cannot be loaded, and
// libdw_error() then says why and what to install.
const Libdw* libdw();
const std::string& libdw_error();

}  // namespace ddp::stacks

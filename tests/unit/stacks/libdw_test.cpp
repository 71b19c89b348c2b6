// libdw loaded on first use (stacks/libdw.hpp, the dlopen side ddpctl links): this test links
// libdw as well, so the build link-checks every function in the table, and each one loaded must
// be that library's own.
#include "stacks/libdw.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <string>

namespace {

TEST(LibdwLazy, LoadsDebiansLibdwWithEveryFunction) {
  const auto* api = ddp::stacks::libdw();
  ASSERT_NE(api, nullptr) << ddp::stacks::libdw_error();
  // Linked here too: the loader hands back the one copy of the library, so the addresses agree.
#define DDP_LIBDW_SAME(name) EXPECT_EQ(api->name, &::name) << #name;
  DDP_LIBDW_FUNCTIONS(DDP_LIBDW_SAME)
#undef DDP_LIBDW_SAME
  EXPECT_EQ(ddp::stacks::libdw(), api);  // loaded once
  EXPECT_EQ(ddp::stacks::libdw_error(), "");
}

TEST(LibdwLazy, ReportsThisProcessesModulesThroughTheLoadedLibrary) {
  const auto* dw = ddp::stacks::libdw();
  ASSERT_NE(dw, nullptr) << ddp::stacks::libdw_error();
  char* debuginfo_path = nullptr;
  const Dwfl_Callbacks cb = {.find_elf = dw->dwfl_linux_proc_find_elf,
                             .find_debuginfo = dw->dwfl_standard_find_debuginfo,
                             .section_address = nullptr,
                             .debuginfo_path = &debuginfo_path};
  Dwfl* d = dw->dwfl_begin(&cb);
  ASSERT_NE(d, nullptr) << dw->dwfl_errmsg(-1);
  dw->dwfl_report_begin(d);
  ASSERT_EQ(dw->dwfl_linux_proc_report(d, ::getpid()), 0);
  dw->dwfl_report_end(d, nullptr, nullptr);
  // This very function lies in a module libdw now knows, and it names the test's binary.
  Dwfl_Module* m = dw->dwfl_addrmodule(d, reinterpret_cast<Dwarf_Addr>(&ddp::stacks::libdw));
  ASSERT_NE(m, nullptr) << dw->dwfl_errmsg(-1);
  const char* name = dw->dwfl_module_info(m, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
  ASSERT_NE(name, nullptr);
  EXPECT_NE(std::string(name).find("libdw_test"), std::string::npos) << name;
  dw->dwfl_end(d);
}

}  // namespace

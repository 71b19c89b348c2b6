// libssh loaded on first use (ssh/libssh.hpp): this test links the library as well, so the build
// link-checks every function we call, and each one loaded must be that library's own.
#include "ssh/libssh.hpp"

#include <gtest/gtest.h>

namespace {

TEST(LibsshLazy, LoadsDebiansLibsshWithEveryFunction) {
  const auto& api = ddp::ssh::libssh();
  // Linked here too: the loader hands back the one copy of the library, so the addresses agree.
#define DDP_LIBSSH_SAME(name) EXPECT_EQ(api.name, &::name) << #name;
  DDP_LIBSSH_FUNCTIONS(DDP_LIBSSH_SAME)
#undef DDP_LIBSSH_SAME
  EXPECT_EQ(&ddp::ssh::libssh(), &api);  // loaded once
}

TEST(LibsshLazy, ASessionWorksThroughTheLoadedLibrary) {
  const auto& api = ddp::ssh::libssh();
  ssh_session s = api.ssh_new();
  ASSERT_NE(s, nullptr);
  ASSERT_EQ(api.ssh_options_set(s, SSH_OPTIONS_HOST, "node7.example"), SSH_OK);
  char* host = nullptr;
  ASSERT_EQ(api.ssh_options_get(s, SSH_OPTIONS_HOST, &host), SSH_OK);
  EXPECT_STREQ(host, "node7.example");
  api.ssh_string_free_char(host);
  EXPECT_FALSE(api.ssh_is_connected(s));
  api.ssh_free(s);
}

}  // namespace

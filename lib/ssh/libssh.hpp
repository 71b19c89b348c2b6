// libssh, loaded the first time SSH mode needs it (dlopen of Debian's libssh.so.4): a local
// launch, and every command that does not dial nodes over SSH, never maps it and the Kerberos
// libraries it needs (seven libraries; about 60 page faults and their relocations at each start
// on a paravirtualised VM; docs/performance.md).
//
// session.cpp and dialer.cpp call libssh through libssh(): the pointers' types are the
// declarations in Debian's headers (decltype), so a changed signature fails the build, and
// ssh_test links the library as well and checks that every function loaded here is its own.
#pragma once

#include <libssh/callbacks.h>
#include <libssh/libssh.h>
#include <libssh/sftp.h>

// Every libssh function we call.
#define DDP_LIBSSH_FUNCTIONS(X)     \
  X(sftp_attributes_free)           \
  X(sftp_chmod)                     \
  X(sftp_close)                     \
  X(sftp_free)                      \
  X(sftp_init)                      \
  X(sftp_mkdir)                     \
  X(sftp_new)                       \
  X(sftp_open)                      \
  X(sftp_rename)                    \
  X(sftp_stat)                      \
  X(sftp_unlink)                    \
  X(sftp_write)                     \
  X(ssh_channel_close)              \
  X(ssh_channel_free)               \
  X(ssh_channel_get_exit_status)    \
  X(ssh_channel_is_closed)          \
  X(ssh_channel_is_eof)             \
  X(ssh_channel_is_open)            \
  X(ssh_channel_new)                \
  X(ssh_channel_open_session)       \
  X(ssh_channel_read_nonblocking)   \
  X(ssh_channel_read_timeout)       \
  X(ssh_channel_request_exec)       \
  X(ssh_channel_send_eof)           \
  X(ssh_channel_write)              \
  X(ssh_clean_pubkey_hash)          \
  X(ssh_connect)                    \
  X(ssh_disconnect)                 \
  X(ssh_free)                       \
  X(ssh_get_error)                  \
  X(ssh_get_fd)                     \
  X(ssh_get_fingerprint_hash)       \
  X(ssh_get_publickey_hash)         \
  X(ssh_get_server_publickey)       \
  X(ssh_is_connected)               \
  X(ssh_key_free)                   \
  X(ssh_key_type)                   \
  X(ssh_key_type_to_char)           \
  X(ssh_new)                        \
  X(ssh_options_get)                \
  X(ssh_options_get_port)           \
  X(ssh_options_parse_config)       \
  X(ssh_options_set)                \
  X(ssh_remove_channel_callbacks)   \
  X(ssh_session_is_known_server)    \
  X(ssh_session_update_known_hosts) \
  X(ssh_set_channel_callbacks)      \
  X(ssh_string_free_char)           \
  X(ssh_userauth_none)              \
  X(ssh_userauth_publickey_auto)

namespace ddp::ssh {

struct Libssh {
#define DDP_LIBSSH_MEMBER(name) decltype(&::name) name = nullptr;
  DDP_LIBSSH_FUNCTIONS(DDP_LIBSSH_MEMBER)
#undef DDP_LIBSSH_MEMBER
};

// Loads libssh.so.4 once (thread-safe); throws std::runtime_error, saying what to install, when
// it cannot be loaded or lacks a function.
const Libssh& libssh();

}  // namespace ddp::ssh

// One libssh session (see session.hpp).
#include "ssh/session.hpp"

#include "common/strings.hpp"
#include "ssh/libssh.hpp"

#include <fmt/format.h>
#include <libssh/sftp.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <vector>

namespace ddp::ssh {

namespace {

std::string take_string(char* s) {
  std::string out = s ? s : "";
  if (s) libssh().ssh_string_free_char(s);
  return out;
}

KnownHost known_state(ssh_known_hosts_e e) {
  switch (e) {
    case SSH_KNOWN_HOSTS_OK:
      return KnownHost::ok;
    case SSH_KNOWN_HOSTS_CHANGED:
      return KnownHost::changed;
    case SSH_KNOWN_HOSTS_OTHER:
      return KnownHost::other_type;
    case SSH_KNOWN_HOSTS_UNKNOWN:
      return KnownHost::unknown;
    case SSH_KNOWN_HOSTS_NOT_FOUND:
      return KnownHost::no_file;
    case SSH_KNOWN_HOSTS_ERROR:
      break;
  }
  return KnownHost::error;
}

}  // namespace

Session::Session() : s_(libssh().ssh_new()) {
  if (!s_) throw std::runtime_error("libssh: cannot create a session");
}

Session::~Session() {
  if (libssh().ssh_is_connected(s_)) libssh().ssh_disconnect(s_);
  libssh().ssh_free(s_);
}

std::string Session::error() const {
  return libssh().ssh_get_error(s_);
}

std::string Session::host() const {
  char* h = nullptr;
  if (libssh().ssh_options_get(s_, SSH_OPTIONS_HOST, &h) != SSH_OK) return "";
  return take_string(h);
}

int Session::port() const {
  unsigned int p = 22;
  libssh().ssh_options_get_port(s_, &p);
  return static_cast<int>(p);
}

std::string Session::peer_address() const {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  const int fd = libssh().ssh_get_fd(s_);
  if (fd < 0 || ::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "";
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr, buf, sizeof buf);
  } else if (ss.ss_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr, buf, sizeof buf);
  } else {
    return "";  // a proxy command's socketpair
  }
  return buf;
}

std::string Session::connect(const SessionOptions& o) {
  timeout_ = o.timeout;
  libssh().ssh_options_set(s_, SSH_OPTIONS_HOST, o.host.c_str());
  // NULL: the user's ~/.ssh/config, then /etc/ssh/ssh_config, as ssh reads them.
  if (libssh().ssh_options_parse_config(s_, nullptr) != SSH_OK) return fmt::format("~/.ssh/config: {}", error());
  // Like `ssh alice@n1 -p 2222`: what --nodes says wins over the config's User and Port.
  if (o.port != 0) {
    unsigned int port = o.port;
    libssh().ssh_options_set(s_, SSH_OPTIONS_PORT, &port);
  }
  if (!o.user.empty()) libssh().ssh_options_set(s_, SSH_OPTIONS_USER, o.user.c_str());
  long secs = std::max<long>(1, static_cast<long>((o.timeout.count() + 999) / 1000));
  libssh().ssh_options_set(s_, SSH_OPTIONS_TIMEOUT, &secs);
  if (libssh().ssh_connect(s_) != SSH_OK) return error();
  return "";
}

std::string Session::verify_host_key(const SessionOptions& o, std::string* added) {
  ssh_key key = nullptr;
  if (libssh().ssh_get_server_publickey(s_, &key) != SSH_OK) return fmt::format("{}: no host key: {}", o.node, error());
  std::unique_ptr<ssh_key_struct, void (*)(ssh_key)> key_owner(key, libssh().ssh_key_free);
  unsigned char* hash = nullptr;
  size_t hlen = 0;
  if (libssh().ssh_get_publickey_hash(key, SSH_PUBLICKEY_HASH_SHA256, &hash, &hlen) != 0) {
    return fmt::format("{}: cannot hash the host key", o.node);
  }
  HostKeyFacts f;
  f.fingerprint = take_string(libssh().ssh_get_fingerprint_hash(SSH_PUBLICKEY_HASH_SHA256, hash, hlen));
  libssh().ssh_clean_pubkey_hash(&hash);
  f.key_type = libssh().ssh_key_type_to_char(libssh().ssh_key_type(key));
  f.node = o.node;
  f.host = host();
  f.port = port();
  char* kh = nullptr;
  if (libssh().ssh_options_get(s_, SSH_OPTIONS_KNOWNHOSTS, &kh) == SSH_OK) f.known_hosts = take_string(kh);
  // libssh answers "ok" for any key when StrictHostKeyChecking is "no" (in ~/.ssh/config): the
  // user's explicit choice, as with ssh. We never set it ourselves.
  const auto state = libssh().ssh_session_is_known_server(s_);
  const auto d = decide_host_key(known_state(state), o.accept_new, f);
  if (!d.accept) return d.message;
  if (d.remember) {
    if (libssh().ssh_session_update_known_hosts(s_) != SSH_OK) {
      return fmt::format("{}: cannot add its host key to {}: {}", o.node, f.known_hosts, error());
    }
    if (added) *added = d.message;
  }
  return "";
}

std::string Session::authenticate() {
  // "none" first: it tells libssh the server's methods, and some servers require it.
  int rc = libssh().ssh_userauth_none(s_, nullptr);
  if (rc == SSH_AUTH_SUCCESS) return "";
  if (rc == SSH_AUTH_ERROR) return error();
  rc = libssh().ssh_userauth_publickey_auto(s_, nullptr, nullptr);
  if (rc == SSH_AUTH_SUCCESS) return "";
  if (rc == SSH_AUTH_ERROR) return error();
  char* user = nullptr;
  std::string who = libssh().ssh_options_get(s_, SSH_OPTIONS_USER, &user) == SSH_OK ? take_string(user) : "?";
  return fmt::format(
      "authentication failed for user {} (public keys from ssh-agent and ~/.ssh; password "
      "logins are not used): {}",
      who, error());
}

ExecResult Session::exec(const std::string& command) {
  ssh_channel ch = start(command);
  ExecResult r;
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  char buf[16 * 1024];
  bool out_eof = false, err_eof = false;
  while (!(out_eof && err_eof)) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      close_channel(ch);
      throw std::runtime_error(
          fmt::format("'{}' did not finish within {} ms", command.substr(0, 80), timeout_.count()));
    }
    for (int is_err = 0; is_err < 2; ++is_err) {
      bool& eof = is_err ? err_eof : out_eof;
      if (eof) continue;
      const int n = libssh().ssh_channel_read_timeout(ch, buf, sizeof buf, is_err,
                                                      is_err ? 0 : static_cast<int>(std::min<long>(left.count(), 200)));
      if (n > 0)
        (is_err ? r.err : r.out).append(buf, static_cast<std::size_t>(n));
      else if (n == SSH_ERROR) {
        close_channel(ch);
        throw std::runtime_error(error());
      } else if (n == 0 && libssh().ssh_channel_is_eof(ch)) {
        eof = true;
      }
    }
  }
  // The exit status arrives with (or just before) the close.
  r.exit_status = libssh().ssh_channel_get_exit_status(ch);
  close_channel(ch);
  return r;
}

ssh_channel Session::start(const std::string& command) {
  ssh_channel ch = libssh().ssh_channel_new(s_);
  if (!ch) throw std::runtime_error(error());
  if (libssh().ssh_channel_open_session(ch) != SSH_OK ||
      libssh().ssh_channel_request_exec(ch, command.c_str()) != SSH_OK) {
    const auto why = error();
    libssh().ssh_channel_free(ch);
    throw std::runtime_error(why);
  }
  return ch;
}

void Session::close_channel(ssh_channel ch) {
  if (!ch) return;
  if (libssh().ssh_channel_is_open(ch)) {
    libssh().ssh_channel_send_eof(ch);
    libssh().ssh_channel_close(ch);
  }
  libssh().ssh_channel_free(ch);
}

Session::UploadVia Session::upload(const std::string& local_path, const std::string& remote_dir,
                                   const std::string& name, const std::string& sha256) {
  std::ifstream in(local_path, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("cannot read {}", local_path));
  std::unique_ptr<sftp_session_struct, void (*)(sftp_session)> sftp(libssh().sftp_new(s_), libssh().sftp_free);
  if (!sftp || libssh().sftp_init(sftp.get()) != SSH_OK) {
    // No 'Subsystem sftp' in the node's sshd_config (hardened images drop it): a plain exec
    // channel carries the bytes instead; the caller checks the result by its hash either way.
    sftp.reset();
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(local_path, ec);
    if (ec) throw std::runtime_error(fmt::format("cannot read {}: {}", local_path, ec.message()));
    upload_exec(in, bytes, remote_dir, name, sha256);
    return UploadVia::exec;
  }
  // Each level, 0700; an existing one is fine (its mode is the user's business, except ours).
  std::string path;
  for (auto part : {std::string(".cache"), std::string(".cache/ddpctl"), remote_dir}) {
    path = part;
    if (libssh().sftp_mkdir(sftp.get(), path.c_str(), 0700) != SSH_OK) {
      sftp_attributes a = libssh().sftp_stat(sftp.get(), path.c_str());
      if (!a) throw std::runtime_error(fmt::format("cannot create ~/{}: {}", path, error()));
      const bool dir = a->type == SSH_FILEXFER_TYPE_DIRECTORY;
      libssh().sftp_attributes_free(a);
      if (!dir) throw std::runtime_error(fmt::format("~/{} exists and is not a directory", path));
    }
  }
  libssh().sftp_chmod(sftp.get(), remote_dir.c_str(), 0700);
  const auto tmp = fmt::format("{}/.{}.part", remote_dir, name);
  const auto dest = fmt::format("{}/{}", remote_dir, name);
  sftp_file f = libssh().sftp_open(sftp.get(), tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0700);
  if (!f) throw std::runtime_error(fmt::format("cannot write ~/{}: {}", tmp, error()));
  std::vector<char> buf(32 * 1024);  // below SFTP servers' usual 32 KiB limit per write
  bool ok = true;
  while (ok && in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto n = static_cast<std::size_t>(in.gcount());
    if (n > 0 && libssh().sftp_write(f, buf.data(), n) != static_cast<ssize_t>(n)) ok = false;
  }
  libssh().sftp_close(f);
  if (!ok) throw std::runtime_error(fmt::format("writing ~/{} failed: {}", tmp, error()));
  libssh().sftp_chmod(sftp.get(), tmp.c_str(), 0700);
  libssh().sftp_unlink(sftp.get(), dest.c_str());  // SFTP v3's rename does not replace
  if (libssh().sftp_rename(sftp.get(), tmp.c_str(), dest.c_str()) != SSH_OK) {
    throw std::runtime_error(fmt::format("cannot rename ~/{} to ~/{}: {}", tmp, dest, error()));
  }
  return UploadVia::sftp;
}

void Session::upload_exec(std::istream& in, std::uint64_t bytes, const std::string& remote_dir, const std::string& name,
                          const std::string& sha256) {
  const auto command = exec_upload_command(remote_dir, name, bytes, sha256);
  ssh_channel ch = start(command);
  std::vector<char> buf(32 * 1024);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto n = static_cast<std::size_t>(in.gcount());
    for (std::size_t off = 0; off < n;) {
      // Blocking write: libssh waits for the channel's window, bounded by the session's timeout.
      const int w = libssh().ssh_channel_write(ch, buf.data() + off, static_cast<std::uint32_t>(n - off));
      if (w == SSH_ERROR || w <= 0) {
        const auto why = error();
        close_channel(ch);
        throw std::runtime_error(
            fmt::format("writing ~/{}/{} through an exec channel failed: {}", remote_dir, name, why));
      }
      off += static_cast<std::size_t>(w);
    }
  }
  libssh().ssh_channel_send_eof(ch);
  // The shell's answer: its stderr (bounded) and exit status, within the session's timeout.
  std::string err;
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  char rd[4096];
  for (bool out_eof = false, err_eof = false; !(out_eof && err_eof);) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      close_channel(ch);
      throw std::runtime_error(
          fmt::format("writing ~/{}/{} did not finish within {} ms", remote_dir, name, timeout_.count()));
    }
    for (int is_err = 0; is_err < 2; ++is_err) {
      bool& eof = is_err ? err_eof : out_eof;
      if (eof) continue;
      const int n = libssh().ssh_channel_read_timeout(ch, rd, sizeof rd, is_err,
                                                      is_err ? 0 : static_cast<int>(std::min<long>(left.count(), 200)));
      if (n > 0 && is_err && err.size() < 4096) err.append(rd, static_cast<std::size_t>(n));
      if (n == SSH_ERROR) {
        const auto why = error();
        close_channel(ch);
        throw std::runtime_error(why);
      }
      if (n == 0 && libssh().ssh_channel_is_eof(ch)) eof = true;
    }
  }
  const int status = libssh().ssh_channel_get_exit_status(ch);
  close_channel(ch);
  if (status != 0) {
    throw std::runtime_error(
        fmt::format("writing ~/{}/{} without SFTP failed (exit status {}): {}", remote_dir, name, status,
                    ddp::trim(err).empty() ? std::string("no message") : std::string(ddp::trim(err))));
  }
}

}  // namespace ddp::ssh

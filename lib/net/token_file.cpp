// Token files: candidates and the permission check (see token_file.hpp).
#include "net/token_file.hpp"

#include "common/strings.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace ddp::net {

namespace {
// A secret is at most 1 KiB and a file holds a handful; 64 KiB bounds what we read.
constexpr std::size_t kMaxTokenFileBytes = 64 * 1024;
}  // namespace

std::optional<std::string> token_owner_problem(const std::string& path, uid_t file_uid, uid_t self) {
  if (file_uid == self || file_uid == 0) return std::nullopt;
  return fmt::format(
      "token file {} belongs to uid {}, not to uid {} (us) or root: whoever owns it may change or read "
      "its secret; give it to us: chown {} {}",
      path, file_uid, self, self, path);
}

proto::Keyring load_token_file(const std::string& path) {
  // Non-blocking: a FIFO at the path (`sudo -E` takes it from the user's environment) is refused
  // below, not waited on for ever; a regular file reads the same.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      throw TokenError(fmt::format(
          "token file {} does not exist; create one with: umask 077; openssl rand -hex 32 > {}", path, path));
    }
    throw TokenError(fmt::format("cannot open token file {}: {}", path, std::strerror(err)));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw TokenError(fmt::format("cannot stat token file {}: {}", path, std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) throw TokenError(fmt::format("token file {} is not a regular file", path));
  if (auto bad = token_owner_problem(path, st.st_uid, ::geteuid())) throw TokenError(*bad);
  if (st.st_mode & 077) {
    throw TokenError(
        fmt::format("token file {} is accessible by group or others (mode {:04o}); its secret must stay "
                    "private: chmod 600 {}",
                    path, st.st_mode & 07777, path));
  }
  if (static_cast<std::size_t>(st.st_size) > kMaxTokenFileBytes) {
    throw TokenError(fmt::format("token file {} is {} bytes; a token file holds a few keys (at most {} bytes)", path,
                                 st.st_size, kMaxTokenFileBytes));
  }
  std::string text;
  char buf[4096];
  while (text.size() <= kMaxTokenFileBytes) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw TokenError(fmt::format("cannot read token file {}: {}", path, std::strerror(errno)));
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
  }
  auto parsed = proto::parse_keyring(text);
  if (!parsed.ok()) throw TokenError(fmt::format("token file {}: {}", path, parsed.error->to_string()));
  if (parsed.keyring.empty()) throw TokenError(fmt::format("token file {} holds no key", path));
  return parsed.keyring;
}

std::vector<std::string> client_token_candidates() {
  std::vector<std::string> out;
  if (const char* e = std::getenv("DDP_TOKEN_FILE"); e && *e) out.emplace_back(e);
  if (const char* x = std::getenv("XDG_CONFIG_HOME"); x && *x) {
    out.push_back(std::string(x) + "/ddpctl/token");
  } else if (const char* h = std::getenv("HOME"); h && *h) {
    out.push_back(std::string(h) + "/.config/ddpctl/token");
  }
  out.emplace_back(kAgentTokenFile);
  return out;
}

std::string find_client_token_file() {
  auto c = client_token_candidates();
  for (const auto& p : c) {
    struct stat st {};
    if (::stat(p.c_str(), &st) == 0) return p;
  }
  throw TokenError(
      fmt::format("no token file found (looked for {}); give one with --token-file or DDP_TOKEN_FILE, "
                  "holding the same secret as the agents' /etc/ddpctl/token",
                  join(c, ", ")));
}

}  // namespace ddp::net

#include "common/safe_fs.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace ddp::safefs {

namespace {

std::string why_not_opened(int err) {
  // O_NOFOLLOW on a link: ELOOP (a file), ELOOP or ENOTDIR (with O_DIRECTORY).
  if (err == ELOOP) return "it is a symbolic link, which is not followed here";
  if (err == ENOTDIR) return "it is not a folder (or is a symbolic link, which is not followed here)";
  return std::strerror(err);
}

uid_t expected_uid(const std::optional<Owner>& owner) {
  return owner ? owner->uid : ::geteuid();
}

// Gives an fd we opened to its owner and mode, through the fd.
void give(int fd, const std::string& path, const std::optional<Owner>& owner, mode_t mode) {
  if (owner && ::fchown(fd, owner->uid, owner->gid) != 0) {
    throw FsError(errno, fmt::format("cannot give {} to uid {}: {}", path, owner->uid, std::strerror(errno)));
  }
  if (::fchmod(fd, mode) != 0)
    throw FsError(errno, fmt::format("cannot set the mode of {}: {}", path, std::strerror(errno)));
}

// The checks on a file that is open for writing, before a byte goes into it.
void check_file(int fd, const std::string& path, uid_t uid) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw FsError(errno, fmt::format("cannot stat {}: {}", path, std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) throw FsError(EPERM, fmt::format("{} is not a regular file; not written", path));
  if (st.st_nlink != 1) {
    throw FsError(EPERM, fmt::format("{} has {} names (a hard link); not written: remove it", path, st.st_nlink));
  }
  if (st.st_uid != uid) {
    throw FsError(EPERM,
                  fmt::format("{} belongs to uid {}, not to uid {}; not written: remove it", path, st.st_uid, uid));
  }
}

// Back to blocking writes once the fd is known to be a regular file (O_NONBLOCK only kept a
// FIFO from holding up the open).
void make_blocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
}

}  // namespace

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

void check_name(std::string_view name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string_view::npos ||
      name.find('\0') != std::string_view::npos) {
    throw FsError(EINVAL, fmt::format("'{}' is not a single file name", name));
  }
}

std::string Dir::path_of(std::string_view name) const {
  if (path_.empty() || path_.back() == '/') return fmt::format("{}{}", path_, name);
  return fmt::format("{}/{}", path_, name);
}

Dir Dir::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw FsError(errno, fmt::format("cannot open the folder {}: {}", path, std::strerror(errno)));
  return Dir(Fd(fd), path);
}

Dir Dir::open_beneath(const Dir& base, std::string_view rel, std::optional<uid_t> expect_uid) {
  Dir cur(Fd(::fcntl(base.fd(), F_DUPFD_CLOEXEC, 0)), base.path());
  if (!cur.fd_)
    throw FsError(errno, fmt::format("cannot duplicate the fd of {}: {}", base.path(), std::strerror(errno)));
  std::size_t steps = 0;
  while (!rel.empty()) {
    const auto slash = rel.find('/');
    const auto part = rel.substr(0, slash);
    rel = slash == std::string_view::npos ? std::string_view() : rel.substr(slash + 1);
    if (part.empty()) continue;
    check_name(part);
    const std::string name(part);
    const auto path = cur.path_of(name);
    const int fd = ::openat(cur.fd(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) throw FsError(errno, fmt::format("cannot open the folder {}: {}", path, why_not_opened(errno)));
    Dir next(Fd(fd), path);
    if (expect_uid) {
      struct stat st {};
      if (::fstat(fd, &st) != 0) throw FsError(errno, fmt::format("cannot stat {}: {}", path, std::strerror(errno)));
      if (st.st_uid != *expect_uid) {
        throw FsError(EPERM,
                      fmt::format("the folder {} belongs to uid {}, not to uid {}", path, st.st_uid, *expect_uid));
      }
    }
    cur = std::move(next);
    ++steps;
  }
  if (steps == 0) throw FsError(EINVAL, fmt::format("no folder below {} named", base.path()));
  return cur;
}

Dir make_dir(const Dir& parent, const std::string& name, mode_t mode, const std::optional<Owner>& owner, bool fresh) {
  check_name(name);
  const auto path = parent.path_of(name);
  // 0700 and ours until it is open: nobody else gets in before it has its owner and mode.
  const bool made = ::mkdirat(parent.fd(), name.c_str(), 0700) == 0;
  if (!made && errno != EEXIST)
    throw FsError(errno, fmt::format("cannot create the folder {}: {}", path, std::strerror(errno)));
  if (!made && fresh) throw FsError(EEXIST, fmt::format("the folder {} exists already", path));
  Dir dir = Dir::open_beneath(parent, name);  // without following a link
  struct stat st {};
  if (::fstat(dir.fd(), &st) != 0) throw FsError(errno, fmt::format("cannot stat {}: {}", path, std::strerror(errno)));
  // A folder we just made is ours; one that was there (or was put there meanwhile, in a parent
  // its owner can write) must already belong to the owner: we never take over someone's folder.
  const uid_t want = expected_uid(owner);
  if (st.st_uid != want && !(made && st.st_uid == ::geteuid())) {
    throw FsError(EPERM, fmt::format("the folder {} belongs to uid {}, not to uid {}; remove it or give it to uid {}",
                                     path, st.st_uid, want, want));
  }
  if (made) give(dir.fd(), path, owner, mode);
  return dir;
}

Fd open_append(const Dir& dir, const std::string& name, const std::optional<Owner>& owner) {
  check_name(name);
  const auto path = dir.path_of(name);
  // New (O_EXCL: ours, whatever happens meanwhile), else the one that is there, checked; a few
  // tries, as a job may remove the file between the two.
  for (int attempt = 0; attempt < 4; ++attempt) {
    int fd = ::openat(dir.fd(), name.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) {
      Fd f(fd);
      give(fd, path, owner, 0600);
      return f;
    }
    if (errno != EEXIST) throw FsError(errno, fmt::format("cannot create {}: {}", path, why_not_opened(errno)));
    fd = ::openat(dir.fd(), name.c_str(), O_WRONLY | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) continue;
    if (fd < 0) throw FsError(errno, fmt::format("cannot open {}: {}", path, why_not_opened(errno)));
    Fd f(fd);
    check_file(fd, path, expected_uid(owner));
    make_blocking(fd);
    return f;
  }
  throw FsError(EAGAIN, fmt::format("cannot open {}: it keeps appearing and disappearing", path));
}

Fd create_new(const Dir& dir, const std::string& name, const std::optional<Owner>& owner) {
  check_name(name);
  const auto path = dir.path_of(name);
  const int fd =
      ::openat(dir.fd(), name.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) throw FsError(errno, fmt::format("cannot create {}: {}", path, why_not_opened(errno)));
  Fd f(fd);
  give(fd, path, owner, 0600);
  return f;
}

void rename_in(const Dir& dir, const std::string& from, const std::string& to) {
  check_name(from);
  check_name(to);
  if (::renameat(dir.fd(), from.c_str(), dir.fd(), to.c_str()) != 0) {
    throw FsError(errno, fmt::format("cannot rename {} to {}: {}", dir.path_of(from), to, std::strerror(errno)));
  }
}

void replace_file(const Dir& dir, const std::string& name, std::string_view text, const std::optional<Owner>& owner) {
  std::string tmp = ".";  // appended: GCC 12's -Wrestrict misfires on "." + name
  tmp += name;
  tmp += ".tmp";
  try {
    remove_in(dir, tmp);  // left by a process that died mid-write
    const auto fd = create_new(dir, tmp, owner);
    if (!write_all(fd.get(), text)) {
      const int e = errno;
      throw FsError(e, fmt::format("cannot write {}: {}", dir.path_of(tmp), std::strerror(e)));
    }
    rename_in(dir, tmp, name);
  } catch (const FsError&) {
    remove_in(dir, tmp);
    throw;
  }
}

void remove_in(const Dir& dir, const std::string& name) noexcept {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") return;
  ::unlinkat(dir.fd(), name.c_str(), 0);
}

namespace {

// `name` under `dirfd`, opened to read without following a link or blocking on a FIFO, if it is
// a regular file with one name that belongs to `owner_uid` (`owner` names that uid in the
// refusal). Not open: `missing`, or `reason` says why. What both readers below share.
struct Checked {
  Fd fd;
  bool missing = false;
  std::string reason;
  struct stat st {};
};
Checked open_checked(int dirfd, const std::string& name, uid_t owner_uid, std::string_view owner) {
  Checked c;
  Fd fd(::openat(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (!fd) {
    c.missing = errno == ENOENT;
    c.reason = why_not_opened(errno);
  } else if (::fstat(fd.get(), &c.st) != 0) {
    c.reason = std::strerror(errno);
  } else if (!S_ISREG(c.st.st_mode)) {
    c.reason = "it is not a regular file";
  } else if (c.st.st_nlink != 1) {
    c.reason = fmt::format("it has {} names (a hard link)", c.st.st_nlink);
  } else if (c.st.st_uid != owner_uid) {
    c.reason = fmt::format("it belongs to uid {}, not to {}", c.st.st_uid, owner);
  } else {
    c.fd = std::move(fd);
  }
  return c;
}

}  // namespace

OpenResult open_in_folder_to_read(const std::string& path) noexcept {
  OpenResult r;
  try {
    const auto slash = path.rfind('/');
    const std::string folder = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
    check_name(name);
    Fd dir(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!dir) {
      r.missing = errno == ENOENT;
      r.reason = fmt::format("its folder: {}", why_not_opened(errno));
      return r;
    }
    struct stat dst {};
    if (::fstat(dir.get(), &dst) != 0) {
      r.reason = std::strerror(errno);
      return r;
    }
    auto c = open_checked(dir.get(), name, dst.st_uid, fmt::format("its folder's owner (uid {})", dst.st_uid));
    r.fd = std::move(c.fd);
    r.missing = c.missing;
    r.reason = std::move(c.reason);
  } catch (const std::exception& e) {  // a bad name (FsError), or no memory for a message
    r.reason = e.what();
  }
  return r;
}

ReadResult read_owned(const Dir& dir, const std::string& name, uid_t owner_uid, std::size_t max_bytes) noexcept {
  ReadResult r;
  try {
    check_name(name);
  } catch (const FsError& e) {
    r.kind = ReadResult::Kind::refused;
    r.reason = e.what();
    return r;
  }
  Checked c;
  try {
    c = open_checked(dir.fd(), name, owner_uid, fmt::format("uid {}", owner_uid));
  } catch (const std::exception& e) {  // no memory for a message
    r.kind = ReadResult::Kind::refused;
    r.reason = e.what();
    return r;
  }
  if (c.missing) return r;
  if (!c.fd) {
    r.kind = ReadResult::Kind::refused;
    r.reason = std::move(c.reason);
    return r;
  }
  const int fd = c.fd.get();
  const struct stat& st = c.st;
  r.kind = ReadResult::Kind::refused;
  r.size = static_cast<std::uint64_t>(st.st_size);
  if (r.size > max_bytes) {
    r.kind = ReadResult::Kind::too_big;
    return r;
  }
  // Bounded by max_bytes + 1 whatever the file does meanwhile (it may still be growing).
  std::string text;
  char buf[8192];
  while (text.size() <= max_bytes) {
    const ssize_t n = ::read(fd, buf, std::min(sizeof buf, max_bytes + 1 - text.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      r.reason = std::strerror(errno);
      return r;
    }
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
  }
  if (text.size() > max_bytes) {
    r.kind = ReadResult::Kind::too_big;
    r.size = text.size();
    return r;
  }
  r.kind = ReadResult::Kind::ok;
  r.text = std::move(text);
  return r;
}

bool write_all(int fd, std::string_view data) noexcept {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

std::optional<std::string> usable_env_dir(const std::string& path, uid_t euid) {
  if (euid != 0) return path;
  if (path.empty() || path.front() != '/') return std::nullopt;
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p(path);
  while (!fs::exists(p, ec)) {
    if (p == p.parent_path()) return std::nullopt;
    p = p.parent_path();
  }
  const auto real = fs::canonical(p, ec);  // no link left in it: root uses this, not `path`
  if (ec) return std::nullopt;
  auto steady = [](const fs::path& d) {
    struct stat st {};
    if (::lstat(d.c_str(), &st) != 0 || st.st_uid != 0) return false;
    return (st.st_mode & (S_IWGRP | S_IWOTH)) == 0 || (st.st_mode & S_ISVTX) != 0;
  };
  fs::path walk = "/";
  if (!steady(walk)) return std::nullopt;
  for (const auto& part : real.relative_path()) {
    walk /= part;
    if (!steady(walk)) return std::nullopt;
  }
  const auto tail = fs::path(path).lexically_relative(p);
  if (tail.empty() || tail == ".") return real.string();
  // What is still to be made, root makes; in a sticky folder others may make it first. A tail
  // that climbs (`..`) is refused: it would leave the folders just checked.
  struct stat st {};
  if (::lstat(real.c_str(), &st) != 0 || (st.st_mode & (S_IWGRP | S_IWOTH)) != 0) return std::nullopt;
  for (const auto& part : tail)
    if (part == "..") return std::nullopt;
  return (real / tail).string();
}

}  // namespace ddp::safefs

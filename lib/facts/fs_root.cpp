#include "facts/fs_root.hpp"

#include "common/strings.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace ddp::facts {

namespace fs = std::filesystem;

FsRoot::FsRoot(fs::path root) : root_(std::move(root)) {
  std::error_code ec;
  auto canon = fs::weakly_canonical(root_.empty() ? fs::path("/") : root_, ec);
  if (!ec) root_ = canon;
  live_ = root_ == fs::path("/");
}

fs::path FsRoot::host_path(std::string_view path) const {
  std::string p(path);
  while (!p.empty() && p.front() == '/') p.erase(0, 1);
  return root_ / p;
}

// POSIX reads into a string that grows with what came: a sysfs attribute is a few bytes, and a
// buffer of max_bytes made (and zeroed) for each of the hundreds a launch reads was a sixth of
// its instructions.
std::optional<std::string> FsRoot::read(std::string_view path, std::size_t max_bytes) const {
  const auto at = where(path);
  if (!at) return std::nullopt;
  const int fd = ::open(at->c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string out;
  char buf[4096];
  bool failed = false;
  while (out.size() < max_bytes) {
    const ssize_t n = ::read(fd, buf, std::min(sizeof buf, max_bytes - out.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      failed = true;  // e.g. EINVAL from a down link's "speed", EISDIR
      break;
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  if (failed) return std::nullopt;
  return out;
}

std::optional<std::string> FsRoot::read_line(std::string_view path) const {
  auto s = read(path);
  if (!s) return std::nullopt;
  auto nl = s->find('\n');
  auto line = std::string(trim(std::string_view(*s).substr(0, nl)));
  if (line.empty()) return std::nullopt;
  return line;
}

std::vector<std::string> FsRoot::list(std::string_view dir) const {
  std::vector<std::string> out;
  const auto at = where(dir);
  if (!at) return out;
  std::error_code ec;
  fs::directory_iterator it(*at, ec), end;
  // Bounded: a directory of more than 64k entries is not a sysfs class we understand.
  for (std::size_t n = 0; !ec && it != end && n < 65536; it.increment(ec), ++n)
    out.push_back(it->path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

bool FsRoot::exists(std::string_view path) const {
  const auto at = where(path);
  std::error_code ec;
  return at && (!live_ || fs::exists(*at, ec));
}

// On the live root the kernel resolves the links as resolve() would (nothing is outside "/"),
// and a walk of its own costs a lstat per component of each of the hundreds of paths a launch
// reads; a fixture's links need resolve() to stay inside it.
std::optional<fs::path> FsRoot::where(std::string_view path) const {
  if (live_) return host_path(path);
  auto real = resolve(path);
  if (!real) return std::nullopt;
  return host_path(*real);
}

std::optional<std::string> FsRoot::resolve(std::string_view path) const {
  // Components still to walk (front = next), and the resolved prefix so far.
  std::vector<std::string> todo;
  for (auto c : split(path, '/'))
    if (!c.empty()) todo.emplace_back(c);
  std::reverse(todo.begin(), todo.end());
  std::vector<std::string> done;
  int links = 0;
  while (!todo.empty()) {
    std::string c = todo.back();
    todo.pop_back();
    if (c == ".") continue;
    if (c == "..") {
      if (!done.empty()) done.pop_back();
      continue;
    }
    std::string rel;
    for (const auto& d : done) rel += "/" + d;
    rel += "/" + c;
    auto host = host_path(rel);
    std::error_code ec;
    auto st = fs::symlink_status(host, ec);
    if (ec || !fs::exists(st)) return std::nullopt;
    if (fs::is_symlink(st)) {
      if (++links > 40) return std::nullopt;  // ELOOP, as the kernel counts
      auto target = fs::read_symlink(host, ec).string();
      if (ec) return std::nullopt;
      if (!target.empty() && target.front() == '/') done.clear();
      std::vector<std::string> parts;
      for (auto t : split(target, '/'))
        if (!t.empty()) parts.emplace_back(t);
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) todo.push_back(*it);
      continue;
    }
    done.push_back(std::move(c));
  }
  std::string out;
  for (const auto& d : done) out += "/" + d;
  return out.empty() ? std::string("/") : out;
}

}  // namespace ddp::facts

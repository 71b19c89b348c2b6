// FsRoot: every file discovery reads goes through here, relative to one root directory, so that
// discovery runs unchanged on the live machine ("/") and on fixture trees (tests, --sysfs-root,
// DDP_SYSFS_ROOT). Symlinks are resolved inside the root: an absolute link target is taken
// relative to the root and ".." stops at it, so a fixture (or a copied /sys) can never make us
// read the host's files. On the live root the kernel resolves links (the same places, nothing
// is outside "/"), including /proc's magic links into other namespaces: not for another
// process's /proc/PID paths.
#pragma once

#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::facts {

class FsRoot {
 public:
  explicit FsRoot(std::filesystem::path root = "/");

  // True when the root is the live "/" (only then do NVML, dlopen, getrlimit and getifaddrs
  // describe the same machine as the files).
  bool is_live() const { return live_; }
  const std::filesystem::path& root() const { return root_; }

  // Whole file (at most max_bytes; sysfs attributes are one page), nullopt if unreadable.
  std::optional<std::string> read(std::string_view path, std::size_t max_bytes = 64 * 1024) const;
  // First line, trimmed; nullopt if unreadable or empty.
  std::optional<std::string> read_line(std::string_view path) const;
  // Names in a directory (sorted; "." and ".." excluded); empty if none or unreadable.
  std::vector<std::string> list(std::string_view dir) const;
  bool exists(std::string_view path) const;
  // The path with every symlink resolved, as an absolute path inside the root ("/sys/devices/..."),
  // nullopt if a component is missing or the links loop.
  std::optional<std::string> resolve(std::string_view path) const;

 private:
  std::filesystem::path host_path(std::string_view path) const;
  // Where to open `path` on this machine: nullopt when it leads nowhere inside the root.
  std::optional<std::filesystem::path> where(std::string_view path) const;

  std::filesystem::path root_;
  bool live_ = true;
};

}  // namespace ddp::facts

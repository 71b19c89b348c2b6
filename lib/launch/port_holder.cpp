#include "launch/port_holder.hpp"

#include "common/strings.hpp"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace ddp::launch {

namespace fs = std::filesystem;

namespace {

constexpr std::size_t kMaxProcesses = 1u << 16;
constexpr std::size_t kMaxFds = 1u << 16;
constexpr std::size_t kMaxProcFile = 64u << 20;  // /proc/net/* of a busy machine

std::string read_small(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string text;
  char buf[65536];
  while (in && text.size() < kMaxProcFile) {
    in.read(buf, sizeof buf);
    text.append(buf, static_cast<std::size_t>(in.gcount()));
  }
  return text;
}

std::vector<std::string_view> fields(std::string_view line) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    const std::size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
    if (i > start) out.push_back(line.substr(start, i - start));
  }
  return out;
}

std::optional<unsigned long> hex_or_dec(std::string_view s, int base) {
  if (s.empty()) return std::nullopt;
  unsigned long v = 0;
  for (char c : s) {
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : 99;
    if (d >= base) return std::nullopt;
    v = v * static_cast<unsigned long>(base) + static_cast<unsigned long>(d);
  }
  return v;
}

}  // namespace

std::set<unsigned long> listening_inodes(std::string_view text, std::uint16_t port) {
  std::set<unsigned long> out;
  bool header = true;
  for (auto line : split(text, '\n')) {
    if (header) {
      header = false;
      continue;
    }
    auto f = fields(line);
    // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
    if (f.size() < 10 || f[3] != "0A") continue;  // 0A: TCP_LISTEN
    const auto colon = f[1].rfind(':');
    if (colon == std::string_view::npos) continue;
    auto p = hex_or_dec(f[1].substr(colon + 1), 16);
    auto inode = hex_or_dec(f[9], 10);
    if (p && *p == port && inode && *inode) out.insert(*inode);
  }
  return out;
}

std::vector<std::string> control_jobs(std::string_view text, const std::set<unsigned long>& inodes,
                                      const std::string& control_dir) {
  std::vector<std::string> out;
  const std::string prefix = control_dir + "/";
  bool header = true;
  for (auto line : split(text, '\n')) {
    if (header) {
      header = false;
      continue;
    }
    // Num RefCount Protocol Flags Type St Inode Path
    auto f = fields(line);
    if (f.size() < 8) continue;
    auto inode = hex_or_dec(f[6], 10);
    if (!inode || !inodes.contains(*inode)) continue;
    const std::string path(f[7]);
    if (path.starts_with(prefix) && path.ends_with(".sock") && path.find('/', prefix.size()) == std::string::npos) {
      out.push_back(path.substr(prefix.size(), path.size() - prefix.size() - 5));
    }
  }
  return out;
}

std::optional<PortHolder> find_port_holder(std::uint16_t port, const std::string& control_dir) {
  auto wanted = listening_inodes(read_small("/proc/net/tcp"), port);
  for (auto i : listening_inodes(read_small("/proc/net/tcp6"), port)) wanted.insert(i);
  if (wanted.empty()) return std::nullopt;
  std::error_code ec;
  std::size_t processes = 0;
  for (const auto& proc : fs::directory_iterator("/proc", ec)) {
    if (++processes > kMaxProcesses) break;
    const auto name = proc.path().filename().string();
    auto pid = parse_int(name);
    if (!pid || *pid <= 0) continue;
    std::set<unsigned long> sockets;
    bool holds = false;
    std::size_t fds = 0;
    std::error_code fec;
    for (const auto& fd : fs::directory_iterator(proc.path() / "fd", fec)) {
      if (++fds > kMaxFds) break;
      std::error_code lec;
      const auto target = fs::read_symlink(fd.path(), lec).string();
      if (lec || !target.starts_with("socket:[")) continue;
      auto inode = hex_or_dec(std::string_view(target).substr(8, target.size() - 9), 10);
      if (!inode) continue;
      sockets.insert(*inode);
      if (wanted.contains(*inode)) holds = true;
    }
    if (!holds) continue;
    PortHolder h;
    h.pid = static_cast<int>(*pid);
    auto cmdline = read_small(proc.path().string() + "/cmdline");
    for (auto& c : cmdline) {
      if (c == '\0') c = ' ';
    }
    h.command = std::string(trim(cmdline));
    if (h.command.size() > 120) h.command = h.command.substr(0, 117) + "...";
    auto jobs = control_jobs(read_small("/proc/net/unix"), sockets, control_dir);
    if (!jobs.empty()) h.job_id = jobs.front();
    return h;
  }
  return std::nullopt;
}

std::string describe(const PortHolder& h) {
  if (h.job_id) return fmt::format("job {} (pid {}: {})", *h.job_id, h.pid, h.command);
  return fmt::format("pid {} ({})", h.pid, h.command.empty() ? "?" : h.command);
}

}  // namespace ddp::launch

// Peer identity: allow-list decision and the /proc lookup of a loopback client's pid.
#include "store/peers.hpp"

#include "common/strings.hpp"

#include <fmt/format.h>

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

namespace ddp::store {

namespace asio = boost::asio;
using asio::ip::tcp;

asio::ip::address normalize(const asio::ip::address& a) {
  if (a.is_v6() && a.to_v6().is_v4_mapped()) {
    return asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6());
  }
  return a;
}

bool is_loopback(const asio::ip::address& a) {
  return normalize(a).is_loopback();
}

std::string format_endpoint(const tcp::endpoint& ep) {
  auto a = normalize(ep.address());
  if (a.is_v6()) return fmt::format("[{}]:{}", a.to_string(), ep.port());
  return fmt::format("{}:{}", a.to_string(), ep.port());
}

namespace {

// "0100007F:1F90" (IPv4) or 32 hex digits + ":PORT" (IPv6), as the kernel prints them: each
// 32-bit word of the address in host byte order.
std::optional<tcp::endpoint> parse_proc_endpoint(std::string_view text) {
  auto colon = text.find(':');
  if (colon == std::string_view::npos) return std::nullopt;
  std::string_view addr = text.substr(0, colon), port = text.substr(colon + 1);
  auto hex32 = [](std::string_view h) -> std::optional<uint32_t> {
    if (h.size() != 8) return std::nullopt;
    uint32_t v = 0;
    for (char c : h) {
      int d = (c >= '0' && c <= '9')   ? c - '0'
              : (c >= 'A' && c <= 'F') ? c - 'A' + 10
              : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                                       : -1;
      if (d < 0) return std::nullopt;
      v = (v << 4) | static_cast<uint32_t>(d);
    }
    return v;
  };
  std::string port8(4, '0');
  port8.append(port);
  auto p = port.size() == 4 ? hex32(port8) : std::nullopt;
  if (!p) return std::nullopt;
  if (addr.size() == 8) {
    auto w = hex32(addr);
    if (!w) return std::nullopt;
    asio::ip::address_v4::bytes_type b;
    std::memcpy(b.data(), &*w, 4);  // the kernel printed the in-memory word in host order
    return tcp::endpoint(asio::ip::address_v4(b), static_cast<uint16_t>(*p));
  }
  if (addr.size() == 32) {
    asio::ip::address_v6::bytes_type b;
    for (int i = 0; i < 4; ++i) {
      auto w = hex32(addr.substr(8 * i, 8));
      if (!w) return std::nullopt;
      std::memcpy(b.data() + 4 * i, &*w, 4);
    }
    return tcp::endpoint(asio::ip::address_v6(b), static_cast<uint16_t>(*p));
  }
  return std::nullopt;
}

}  // namespace

std::vector<ProcSocket> read_proc_net_tcp() {
  std::vector<ProcSocket> out;
  for (const char* path : {"/proc/self/net/tcp", "/proc/self/net/tcp6"}) {
    std::ifstream f(path);
    std::string line;
    std::getline(f, line);  // header
    while (std::getline(f, line)) {
      std::istringstream in(line);
      std::string sl, local, remote, st, queues, timer, retr, uid, timeout;
      unsigned long inode = 0;
      if (!(in >> sl >> local >> remote >> st >> queues >> timer >> retr >> uid >> timeout >> inode)) continue;
      auto l = parse_proc_endpoint(local), r = parse_proc_endpoint(remote);
      unsigned state = 0;
      std::from_chars(st.data(), st.data() + st.size(), state, 16);
      auto owner = ddp::parse_int(uid);
      if (!l || !r || !owner || *owner < 0) continue;
      out.push_back({tcp::endpoint(normalize(l->address()), l->port()),
                     tcp::endpoint(normalize(r->address()), r->port()), static_cast<uint8_t>(state),
                     static_cast<uid_t>(*owner), inode});
    }
  }
  return out;
}

namespace {

// socket inode -> pids holding it, for the candidates.
std::multimap<unsigned long, pid_t> socket_inodes_of(std::span<const pid_t> candidates) {
  std::multimap<unsigned long, pid_t> out;
  for (pid_t pid : candidates) {
    std::string dir = "/proc/" + std::to_string(pid) + "/fd";
    DIR* d = opendir(dir.c_str());
    if (!d) continue;
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::array<char, 64> target{};
      std::string link = dir + "/" + e->d_name;
      ssize_t n = readlink(link.c_str(), target.data(), target.size() - 1);
      if (n <= 0) continue;
      std::string_view t(target.data(), static_cast<std::size_t>(n));
      if (!t.starts_with("socket:[") || !t.ends_with("]")) continue;
      auto inode = ddp::parse_int(t.substr(8, t.size() - 9));
      if (inode && *inode > 0) out.emplace(static_cast<unsigned long>(*inode), pid);
    }
    closedir(d);
  }
  return out;
}

}  // namespace

std::vector<std::vector<pid_t>> pids_owning_connections(
    std::span<const std::pair<tcp::endpoint, tcp::endpoint>> connections, std::span<const pid_t> candidates) {
  std::vector<std::vector<pid_t>> out(connections.size());
  if (connections.empty() || candidates.empty()) return out;
  auto sockets = read_proc_net_tcp();
  auto inodes = socket_inodes_of(candidates);
  for (std::size_t i = 0; i < connections.size(); ++i) {
    tcp::endpoint client(normalize(connections[i].first.address()), connections[i].first.port());
    tcp::endpoint server(normalize(connections[i].second.address()), connections[i].second.port());
    for (const auto& s : sockets) {
      if (s.local != client || s.remote != server) continue;
      auto [lo, hi] = inodes.equal_range(s.inode);
      for (auto it = lo; it != hi; ++it) out[i].push_back(it->second);
    }
    std::sort(out[i].begin(), out[i].end());
    out[i].erase(std::unique(out[i].begin(), out[i].end()), out[i].end());
  }
  return out;
}

std::vector<pid_t> pids_owning_connection(const tcp::endpoint& client, const tcp::endpoint& server,
                                          std::span<const pid_t> candidates) {
  std::pair<tcp::endpoint, tcp::endpoint> one{client, server};
  return pids_owning_connections(std::span(&one, 1), candidates).front();
}

std::vector<pid_t> all_pids() {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    auto v = ddp::parse_int(e->d_name);
    if (v && *v > 0) out.push_back(static_cast<pid_t>(*v));
  }
  closedir(d);
  return out;
}

std::optional<int> rank_from_environ(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  if (!f) return std::nullopt;
  std::string entry;
  while (std::getline(f, entry, '\0')) {
    if (entry.starts_with("RANK=")) {
      auto v = ddp::parse_int(std::string_view(entry).substr(5));
      if (v && *v >= 0 && *v <= INT32_MAX) return static_cast<int>(*v);
      return std::nullopt;
    }
  }
  return std::nullopt;
}

}  // namespace ddp::store

// Store access: the pure decision and the kernel lookups it needs (see access.hpp for the policy).
#include "store/access.hpp"

#include "store/peers.hpp"

#include <fmt/format.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ddp::store {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

constexpr uint8_t kTcpListen = 10;  // TCP_LISTEN in the kernel's state numbering

// Equal as addresses: v4-mapped as v4, a v6 scope id ignored (the kernel's tables have none).
bool same_address(const asio::ip::address& a, const asio::ip::address& b) {
  const auto x = normalize(a), y = normalize(b);
  if (x.is_v4() != y.is_v4()) return false;
  if (x.is_v4()) return x.to_v4() == y.to_v4();
  return x.to_v6().to_bytes() == y.to_v6().to_bytes();
}

bool listed(const asio::ip::address& a, std::span<const asio::ip::address> list) {
  return std::any_of(list.begin(), list.end(), [&](const asio::ip::address& b) { return same_address(a, b); });
}

// The address in an inet_diag id field: 4 bytes for AF_INET, 16 for AF_INET6.
std::optional<asio::ip::address> diag_address(uint8_t family, const uint32_t (&field)[4]) {
  if (family == AF_INET) {
    asio::ip::address_v4::bytes_type b;
    std::memcpy(b.data(), field, 4);
    return asio::ip::address_v4(b);
  }
  if (family == AF_INET6) {
    asio::ip::address_v6::bytes_type b;
    std::memcpy(b.data(), field, 16);
    return normalize(asio::ip::address_v6(b));
  }
  return std::nullopt;
}

void put_diag_address(const asio::ip::address& a, uint32_t (&field)[4]) {
  if (a.is_v4()) {
    const auto b = a.to_v4().to_bytes();
    std::memcpy(field, b.data(), 4);
  } else {
    const auto b = a.to_v6().to_bytes();
    std::memcpy(field, b.data(), 16);
  }
}

}  // namespace

AccessDecision decide_access(const asio::ip::address& peer, std::span<const asio::ip::address> host_addrs,
                             const std::optional<SocketOwner>& owner, uid_t job_uid,
                             std::span<const asio::ip::address> nodes) {
  const auto p = normalize(peer);
  const bool local = p.is_loopback() || listed(p, host_addrs) || owner.has_value();
  if (!local) {
    if (listed(p, nodes)) return {true, false, "one of the job's nodes"};
    return {false, false, "not one of this job's nodes"};
  }
  if (!owner) {
    return {false, true,
            "it comes from this host, but the kernel shows no socket of this network namespace for it, so its "
            "user is unknown (only the job's user and root may connect from this host)"};
  }
  if (!owner->held) return {false, true, "its socket was closed before its user could be checked"};
  if (owner->uid == 0) return {true, true, "root"};
  if (owner->uid == job_uid) return {true, true, fmt::format("the job's user (uid {})", job_uid)};
  return {false, true,
          fmt::format("its socket belongs to uid {}, and only the job's user (uid {}) and root may connect from this "
                      "host",
                      owner->uid, job_uid)};
}

std::vector<asio::ip::address> host_addresses() {
  std::vector<asio::ip::address> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr) continue;
    if (i->ifa_addr->sa_family == AF_INET) {
      const auto* sin = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
      asio::ip::address_v4::bytes_type b;
      std::memcpy(b.data(), &sin->sin_addr, 4);
      out.emplace_back(asio::ip::address_v4(b));
    } else if (i->ifa_addr->sa_family == AF_INET6) {
      const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
      asio::ip::address_v6::bytes_type b;
      std::memcpy(b.data(), &sin6->sin6_addr, 16);
      out.emplace_back(normalize(asio::ip::address_v6(b)));
    }
  }
  ::freeifaddrs(list);
  return out;
}

SockDiag& SockDiag::operator=(SockDiag&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
    seq_ = o.seq_;
  }
  return *this;
}

SockDiag::~SockDiag() {
  if (fd_ >= 0) ::close(fd_);
}

std::optional<SocketOwner> SockDiag::owner(const tcp::endpoint& client, const tcp::endpoint& server, bool& failed) {
  failed = false;
  const auto c = normalize(client.address()), s = normalize(server.address());
  if (c.is_v4() != s.is_v4()) {
    failed = true;
    return std::nullopt;
  }
  if (fd_ < 0) {
    fd_ = ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (fd_ < 0) {
      failed = true;
      return std::nullopt;
    }
    // The kernel answers inside sendto(); the timeout only bounds a kernel that would not.
    timeval tv{1, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  // Any failure below closes the socket: the next lookup starts on a fresh one, so an answer
  // that came late (past the timeout) is never read as the answer to another question.
  auto broken = [&] {
    ::close(fd_);
    fd_ = -1;
    failed = true;
    return std::nullopt;
  };

  struct {
    nlmsghdr nlh;
    inet_diag_req_v2 req;
  } msg{};
  msg.nlh.nlmsg_len = sizeof msg;
  msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  msg.nlh.nlmsg_flags = NLM_F_REQUEST;  // no NLM_F_DUMP: an exact lookup by the 4-tuple
  msg.nlh.nlmsg_seq = ++seq_;
  msg.req.sdiag_family = c.is_v4() ? AF_INET : AF_INET6;  // v4-mapped v6 sockets are found as AF_INET
  msg.req.sdiag_protocol = IPPROTO_TCP;
  msg.req.idiag_states = ~0u;
  msg.req.id.idiag_sport = htons(client.port());
  msg.req.id.idiag_dport = htons(server.port());
  put_diag_address(c, msg.req.id.idiag_src);
  put_diag_address(s, msg.req.id.idiag_dst);
  msg.req.id.idiag_cookie[0] = msg.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;

  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(fd_, &msg, sizeof msg, 0, reinterpret_cast<const sockaddr*>(&kernel), sizeof kernel) < 0)
    return broken();
  alignas(nlmsghdr) char buf[8192];
  ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
  if (n < 0) return broken();
  int len = static_cast<int>(n);
  for (auto* h = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
    if (h->nlmsg_seq != seq_) return broken();  // not this question's answer
    if (h->nlmsg_type == NLMSG_ERROR) {
      const auto* e = static_cast<const nlmsgerr*>(NLMSG_DATA(h));
      if (e->error != -ENOENT) failed = true;  // ENOENT: no such socket here (another host's)
      return std::nullopt;
    }
    if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY || h->nlmsg_len < NLMSG_LENGTH(sizeof(inet_diag_msg))) continue;
    const auto* m = static_cast<const inet_diag_msg*>(NLMSG_DATA(h));
    // The kernel's lookup falls back to a listener on the port; only the exact connection counts.
    if (m->idiag_state == kTcpListen) continue;
    const auto src = diag_address(m->idiag_family, m->id.idiag_src),
               dst = diag_address(m->idiag_family, m->id.idiag_dst);
    if (!src || !dst || !same_address(*src, c) || !same_address(*dst, s) || ntohs(m->id.idiag_sport) != client.port() ||
        ntohs(m->id.idiag_dport) != server.port()) {
      continue;
    }
    return SocketOwner{m->idiag_uid, m->idiag_inode != 0};
  }
  return std::nullopt;
}

std::optional<SocketOwner> owner_by_sock_diag(const tcp::endpoint& client, const tcp::endpoint& server, bool& failed) {
  SockDiag diag;
  return diag.owner(client, server, failed);
}

std::optional<SocketOwner> owner_by_proc_net(const tcp::endpoint& client, const tcp::endpoint& server) {
  const tcp::endpoint c(normalize(client.address()), client.port()), s(normalize(server.address()), server.port());
  for (const auto& sock : read_proc_net_tcp()) {
    if (sock.state == kTcpListen || sock.local != c || sock.remote != s) continue;
    return SocketOwner{sock.uid, sock.inode != 0};
  }
  return std::nullopt;
}

std::optional<SocketOwner> client_socket_owner(SockDiag& diag, const tcp::endpoint& client,
                                               const tcp::endpoint& server) {
  bool failed = false;
  auto owner = diag.owner(client, server, failed);
  if (!failed) return owner;
  return owner_by_proc_net(client, server);
}

std::optional<SocketOwner> client_socket_owner(const tcp::endpoint& client, const tcp::endpoint& server) {
  SockDiag diag;
  return client_socket_owner(diag, client, server);
}

}  // namespace ddp::store

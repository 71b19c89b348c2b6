// Who may connect to a job's store: the decision (pure) and the two kernel facts it needs (the
// addresses of this host, and the uid that owns the client end of a connection from this host).
//
// Policy (docs/security.md has the model; docs/jobfile.md "The job's store" the user's view):
//  - A connection from this host is one whose source address is loopback (127/8, ::1, their
//    v4-mapped forms), one of this host's interface addresses (node rank 0's workers reach the
//    store at MASTER_ADDR, the node's own address), or one whose client socket the kernel shows
//    in this network namespace. It is allowed only when the kernel says the client socket belongs
//    to the job's user or to root, whichever local address it used. A client socket no process
//    holds any more (closed before we looked: the kernel reports such a socket as root's, inode
//    0) is refused, and so is one the kernel cannot show us: we never guess.
//  - Any other connection comes from another host: allowed only when its address is one of the
//    job's nodes (the allow-list). Which user on that node made it, nobody here can know: the
//    PyTorch protocol has no authentication.
//  - The uid is the one the kernel keeps for the socket (its creator's), looked up once per
//    accepted connection through NETLINK_SOCK_DIAG (inet_diag, an exact 4-tuple lookup), with
//    /proc/net/tcp{,6}'s uid column as the fallback.
#pragma once

#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <sys/types.h>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace ddp::store {

// The client end of a connection from this host, as the kernel shows it.
struct SocketOwner {
  uid_t uid = 0;
  bool held = true;  // a process still holds the socket (inode != 0); if not, uid says nothing
};

struct AccessDecision {
  bool allowed = false;
  bool local = false;  // the connection came from this host
  std::string why;     // for the log: why refused, or who was let in
};

// The decision. `peer`: the connection's source address; `host_addrs`: this host's interface
// addresses; `owner`: the kernel's answer for the client socket (nullopt: not found in this
// network namespace, or not readable); `job_uid`: the user the job runs as; `nodes`: the job's
// nodes' addresses (this node's own included, as the coordinator lists them).
AccessDecision decide_access(const boost::asio::ip::address& peer, std::span<const boost::asio::ip::address> host_addrs,
                             const std::optional<SocketOwner>& owner, uid_t job_uid,
                             std::span<const boost::asio::ip::address> nodes);

// This host's interface addresses in our network namespace (getifaddrs), v4-mapped as v4.
// Empty when they cannot be read.
std::vector<boost::asio::ip::address> host_addresses();

// The owner of the socket whose local end is `client` and remote end `server` (the server's
// view of a connection reversed), when it lives in our network namespace. Exact match only: a
// listening socket that a lookup by port might return is never taken for it. nullopt when no
// such socket is found or neither source can be read.
std::optional<SocketOwner> client_socket_owner(const boost::asio::ip::tcp::endpoint& client,
                                               const boost::asio::ip::tcp::endpoint& server);

// One sock_diag netlink socket kept for every lookup of a listener (one thread's): a connection
// storm of 8192 accepts made three system calls more each when every lookup opened, set up and
// closed its own (bench/store MODE=storm). Opened at the first lookup; movable, not copyable.
class SockDiag {
 public:
  SockDiag() = default;
  SockDiag(SockDiag&& o) noexcept : fd_(std::exchange(o.fd_, -1)), seq_(o.seq_) {}
  SockDiag& operator=(SockDiag&& o) noexcept;
  SockDiag(const SockDiag&) = delete;
  SockDiag& operator=(const SockDiag&) = delete;
  ~SockDiag();
  // As owner_by_sock_diag; `failed` when the netlink socket cannot be used.
  std::optional<SocketOwner> owner(const boost::asio::ip::tcp::endpoint& client,
                                   const boost::asio::ip::tcp::endpoint& server, bool& failed);

 private:
  int fd_ = -1;
  uint32_t seq_ = 0;
};

// client_socket_owner with a kept netlink socket (sock_diag first, the /proc fallback after).
std::optional<SocketOwner> client_socket_owner(SockDiag& diag, const boost::asio::ip::tcp::endpoint& client,
                                               const boost::asio::ip::tcp::endpoint& server);

// The two sources, each on its own (for tests): sock_diag, and the /proc fallback.
std::optional<SocketOwner> owner_by_sock_diag(const boost::asio::ip::tcp::endpoint& client,
                                              const boost::asio::ip::tcp::endpoint& server, bool& failed);
std::optional<SocketOwner> owner_by_proc_net(const boost::asio::ip::tcp::endpoint& client,
                                             const boost::asio::ip::tcp::endpoint& server);

}  // namespace ddp::store

// Who is on the other end of a store connection, for peers on this host (loopback, or the
// server's own address) that never told us their pid (1.13 clients send no PING): the process
// that owns the client socket, found through /proc. (Who may connect at all: access.hpp.)
//
// Policy: the /proc lookup reads only the network namespace we are in (/proc/net/tcp{,6} of this process) and
// only the fd tables of the candidate pids the caller names; it never blocks on the network
// and returns nothing rather than guess.
#pragma once

#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <sys/types.h>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace ddp::store {

// v4-mapped v6 addresses as v4; everything else unchanged.
boost::asio::ip::address normalize(const boost::asio::ip::address& a);
bool is_loopback(const boost::asio::ip::address& a);

// One line of /proc/self/net/tcp{,6} (this network namespace's TCP sockets), addresses
// normalized. inode 0: no process holds the socket any more (closed, TIME_WAIT).
struct ProcSocket {
  boost::asio::ip::tcp::endpoint local, remote;
  uint8_t state = 0;  // the kernel's TCP state number (10: LISTEN)
  uid_t uid = 0;
  unsigned long inode = 0;
};
std::vector<ProcSocket> read_proc_net_tcp();

// "127.0.0.1:41234" / "[::1]:41234".
std::string format_endpoint(const boost::asio::ip::tcp::endpoint& ep);

// The pids among `candidates` that hold the client end of the TCP connection whose client side
// is `client` and server side is `server` (as seen by the server). Usually one; a fork()ed child
// that inherited the socket adds its own pid. Empty when not found or not readable.
std::vector<pid_t> pids_owning_connection(const boost::asio::ip::tcp::endpoint& client,
                                          const boost::asio::ip::tcp::endpoint& server,
                                          std::span<const pid_t> candidates);

// The same for many connections at once: reads /proc/net/tcp{,6} once and each candidate's fd
// table once. Result i belongs to connections[i] = {client, server}.
std::vector<std::vector<pid_t>> pids_owning_connections(
    std::span<const std::pair<boost::asio::ip::tcp::endpoint, boost::asio::ip::tcp::endpoint>> connections,
    std::span<const pid_t> candidates);

// Every pid in /proc (for a standalone server that has no better list of candidates).
std::vector<pid_t> all_pids();

// The integer value of RANK in /proc/<pid>/environ (the worker env contract), if readable.
std::optional<int> rank_from_environ(pid_t pid);

// How the server names the rank behind a connection. Both parts optional.
struct RankResolver {
  // Pids that may own this host's client sockets (the launcher's or agent's workers). Called
  // only when a report is built and some such waiter's pid is unknown.
  std::function<std::vector<pid_t>()> candidate_pids;
  // The global rank of a pid (nullopt: not one of this attempt's workers).
  std::function<std::optional<int>(pid_t)> rank_of_pid;
};

}  // namespace ddp::store

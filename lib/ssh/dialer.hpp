// SSH mode's way to reach a node (net::Dialer): log in with libssh, make sure a ddp-agentd of
// our version is there (the remote PATH's, else our own uploaded over SFTP into a per-user
// cache checked by hash), start it as `--oneshot --stdio`, hand it the run's secret on stdin,
// then pump the channel to one end of a socketpair whose other end the coordinator's
// Connection uses. Nothing connects back to the launcher, unless `connect_back` (--advertise-addr)
// asks for it: then the agent is started with `--connect HOST:PORT`, gets a per-node tag after
// the secret on stdin, and dials our CallbackListener; the channel then carries only its stderr,
// and our EOF still stops it.
//
// Threads: one per node (libssh is blocking; a session is used by one thread only); at most
// `max_parallel` of them are connecting and authenticating at once, the rest wait for a slot.
// The remote agent's stderr becomes log lines named after the node. Closing the coordinator's
// end ends the pump, which sends EOF to the agent (it stops its workers and exits); a dead
// launcher closes the TCP connection, and sshd closes the agent's stdin the same way.
#pragma once

#include "common/duration.hpp"
#include "net/advertise.hpp"
#include "net/callback_listener.hpp"
#include "net/dialer.hpp"

#include <boost/asio/io_context.hpp>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <semaphore>
#include <string>
#include <thread>
#include <vector>

namespace ddp::ssh {

struct DialerOptions {
  bool accept_new = false;
  Millis timeout{15000};  // connect + key exchange, and each step after it
  int max_parallel = 8;
  std::string secret;         // the run's secret (the agent reads it from stdin)
  std::string agent_binary;   // our ddp-agentd (uploaded when the node has none of our version)
  std::string agent_version;  // what `ddp-agentd --version` prints
  bool verbose_agent = false;
  // Set: agents connect back to this machine over TCP (--advertise-addr) instead of speaking
  // over their SSH channel.
  std::optional<net::AdvertiseAddr> connect_back;
};

class Dialer final : public net::Dialer {
 public:
  // Throws std::runtime_error when our own agent binary cannot be read, or the connect-back
  // port cannot be listened on.
  Dialer(boost::asio::io_context& io, DialerOptions options);
  ~Dialer() override;  // ends every pump and joins the threads

  void dial(const net::NodeEntry& node, std::function<void(net::Dialed)> done) override;
  std::string describe(const net::NodeEntry& node) const override;

 private:
  void run_node(const net::NodeEntry& node, const std::function<void(net::Dialed)>& done);
  bool wait_or_cancel(Millis delay);

  boost::asio::io_context& io_;
  DialerOptions opts_;
  std::string our_sha256_, our_arch_;
  std::counting_semaphore<1024> slots_;
  std::atomic<bool> cancel_{false};
  int wake_fd_ = -1;  // an eventfd, readable once cancel_ is set: the pumps poll it with their sockets
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::thread> threads_;
  std::unique_ptr<net::CallbackListener> listener_;  // with connect_back
};

// The hex SHA-256 of a file; throws std::runtime_error.
std::string sha256_file(const std::string& path);

}  // namespace ddp::ssh

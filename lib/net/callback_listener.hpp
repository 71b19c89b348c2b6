// The launcher's end of connect-back (`launch --ssh --advertise-addr`): one TCP listener that the
// one-shot agents dial instead of speaking over their SSH channel.
//
// Each connection's first line is the tag the launcher gave that node's agent through its SSH
// channel (stdin, never a command line); it says which node is calling and nothing more: the
// protocol's handshake then authenticates the agent with the run's secret as always. A
// connection whose tag is not expected, whose line is over 128 bytes or is followed by more
// bytes (the agent speaks only after our hello), or that sends no line within 10 s is closed;
// callers still owing their tag are capped, the oldest closed first (acceptor.hpp).
//
// `expect` and `forget` may be called from any thread (the SSH dialer's); the rest runs on the
// io_context's thread. Binds every address (dual-stack): the address agents dial may not be one
// of this machine's (NAT, a port forward).
#pragma once

#include "net/acceptor.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

namespace ddp::net {

class CallbackListener {
 public:
  // Listens on [::]:port (0: any free port); throws std::runtime_error saying why it cannot.
  CallbackListener(boost::asio::io_context& io, std::uint16_t port);
  ~CallbackListener();
  CallbackListener(const CallbackListener&) = delete;
  CallbackListener& operator=(const CallbackListener&) = delete;

  std::uint16_t port() const { return port_; }
  // `on_connect` runs once, on the io_context's thread, with the caller's socket.
  void expect(const std::string& tag, std::function<void(boost::asio::ip::tcp::socket)> on_connect);
  // false: too late, the agent has called (its on_connect runs or ran).
  bool forget(const std::string& tag);

  struct Caller;

 private:
  void accept();
  void read_tag(const std::shared_ptr<Caller>& c);
  void drop(const std::shared_ptr<Caller>& c, const std::string& why, bool quiet = false);

  boost::asio::io_context& io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::uint16_t port_ = 0;
  std::mutex mu_;
  std::map<std::string, std::function<void(boost::asio::ip::tcp::socket)>> expected_;
  std::set<std::shared_ptr<Caller>> callers_;
  std::unique_ptr<Acceptor<boost::asio::ip::tcp>> accept_loop_;  // last: uses acceptor_
};

}  // namespace ddp::net

// The agent's end of an SSH-mode link: the protocol runs over the agent's stdin and stdout (the
// SSH channel of `ddp-agentd --stdio`), logs go to stderr.
//
// A socketpair joins the two: net::Connection runs over one end, and two pumps copy stdin into
// the other end and that end into stdout. When either direction ends (stdin EOF: the launcher's
// SSH connection is gone; stdout unwritable), the socketpair end is closed, so the Connection
// sees EOF and the agent stops its workers as for a dropped TCP coordinator.
#pragma once

#include "net/connection.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>

#include <array>
#include <functional>

namespace ddp::agent {

class StdioLink {
 public:
  // Takes over fds 0 and 1 (stdout must carry nothing else from now on).
  explicit StdioLink(boost::asio::io_context& io);
  // The Connection's end; call once.
  net::stream_socket take_socket();
  // Starts both pumps; `on_end` runs once, with why, when either direction ends.
  void start(std::function<void(const std::string&)> on_end);

 private:
  void pump_in();
  void pump_out();
  void end(const std::string& why);

  net::stream_socket ours_, theirs_;
  boost::asio::posix::stream_descriptor in_, out_;
  std::array<char, 64 * 1024> in_buf_{}, out_buf_{};
  std::function<void(const std::string&)> on_end_;
  bool ended_ = false;
};

}  // namespace ddp::agent

// One end of the agent <-> shepherd socketpair: length-prefixed JSON messages (messages.hpp)
// read and written on the owner's io_context.
//
// Policy: reads are bounded (kMaxFrameBytes, checked before buffering a body) and a malformed
// frame or message closes the channel with the reason; writes are queued, never blocking, and
// a queue over `max_queued` refuses further messages (the caller counts them as dropped) so a
// peer that stops reading cannot grow us without bound. on_closed is called once, with why.
#pragma once

#include "proto/frame.hpp"
#include "shepherd/messages.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>

#include <array>
#include <deque>
#include <functional>
#include <memory>
#include <string>

namespace ddp::shepherd {

class Channel : public std::enable_shared_from_this<Channel> {
 public:
  struct Handlers {
    std::function<void(const std::string& type, const nlohmann::json& m)> on_message;
    std::function<void(const std::string& why)> on_closed;
  };

  // Takes ownership of `fd` (a connected AF_UNIX stream socket). `peer` is who sends to us.
  static std::shared_ptr<Channel> make(boost::asio::io_context& io, int fd, Sender peer, std::size_t max_queued);
  void start(Handlers h);
  // Queues one message; false when closed or when the queue is full (the message is dropped).
  bool send(const nlohmann::json& m);
  void close(const std::string& why);
  bool open() const { return open_; }
  std::size_t queued_bytes() const { return queued_; }

 private:
  Channel(boost::asio::io_context& io, int fd, Sender peer, std::size_t max_queued);
  void read();
  void write();

  boost::asio::local::stream_protocol::socket sock_;
  Sender peer_;
  std::size_t max_queued_;
  Handlers h_;
  proto::FrameDecoder decoder_{kMaxFrameBytes};
  std::array<char, 64 * 1024> buf_{};
  std::deque<std::string> out_;
  std::size_t queued_ = 0;
  bool writing_ = false;
  bool open_ = true;
};

}  // namespace ddp::shepherd

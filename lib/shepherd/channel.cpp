#include "shepherd/channel.hpp"

#include <fmt/format.h>
#include <boost/asio/write.hpp>

#include <utility>

namespace ddp::shepherd {

namespace asio = boost::asio;

std::shared_ptr<Channel> Channel::make(asio::io_context& io, int fd, Sender peer, std::size_t max_queued) {
  return std::shared_ptr<Channel>(new Channel(io, fd, peer, max_queued));
}

Channel::Channel(asio::io_context& io, int fd, Sender peer, std::size_t max_queued)
    : sock_(io, asio::local::stream_protocol(), fd), peer_(peer), max_queued_(max_queued) {}

void Channel::start(Handlers h) {
  h_ = std::move(h);
  read();
}

void Channel::read() {
  sock_.async_read_some(asio::buffer(buf_), [self = shared_from_this()](boost::system::error_code ec, std::size_t n) {
    if (!self->open_) return;
    if (ec) {
      self->close(ec == asio::error::eof ? "the peer closed the connection" : ec.message());
      return;
    }
    self->decoder_.feed(std::string_view(self->buf_.data(), n));
    while (self->open_) {
      auto body = self->decoder_.next();
      if (!body) break;
      std::string type;
      nlohmann::json m;
      try {
        m = nlohmann::json::parse(*body);
        type = message_type(m, self->peer_);
      } catch (const std::exception& e) {
        self->close(fmt::format("bad message: {}", e.what()));
        return;
      }
      if (self->h_.on_message) self->h_.on_message(type, m);
    }
    if (const auto& err = self->decoder_.error()) {
      self->close(fmt::format("bad frame: {}", err->message));
      return;
    }
    if (self->open_) self->read();
  });
}

bool Channel::send(const nlohmann::json& m) {
  if (!open_ || queued_ > max_queued_) return false;
  auto body = dump(m);
  if (body.size() > kMaxFrameBytes) return false;
  auto frame = proto::encode_frame(body);
  queued_ += frame.size();
  out_.push_back(std::move(frame));
  if (!writing_) write();
  return true;
}

void Channel::write() {
  if (out_.empty() || !open_) {
    writing_ = false;
    return;
  }
  writing_ = true;
  asio::async_write(sock_, asio::buffer(out_.front()),
                    [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
                      if (!self->open_) return;
                      if (ec) {
                        self->close(fmt::format("cannot write to the peer: {}", ec.message()));
                        return;
                      }
                      self->queued_ -= self->out_.front().size();
                      self->out_.pop_front();
                      self->write();
                    });
}

void Channel::close(const std::string& why) {
  if (!open_) return;
  open_ = false;
  boost::system::error_code ignored;
  sock_.close(ignored);
  out_.clear();
  queued_ = 0;
  // on_message stays: it may be the caller of this close(), still running.
  if (auto cb = std::exchange(h_.on_closed, nullptr)) cb(why);
}

}  // namespace ddp::shepherd

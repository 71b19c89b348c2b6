// The stdin/stdout link of `ddp-agentd --stdio` (see stdio_link.hpp).
#include "agent/stdio_link.hpp"

#include <boost/asio/write.hpp>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <system_error>

namespace ddp::agent {

namespace asio = boost::asio;

namespace {
std::pair<int, int> make_socketpair() {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    throw std::system_error(errno, std::generic_category(), "socketpair");
  }
  return {fds[0], fds[1]};
}
}  // namespace

StdioLink::StdioLink(asio::io_context& io) : ours_(io), theirs_(io), in_(io), out_(io) {
  auto [a, b] = make_socketpair();
  const asio::generic::stream_protocol unix_stream(AF_UNIX, 0);
  ours_.assign(unix_stream, a);
  theirs_.assign(unix_stream, b);
  // Duplicates, so closing them never frees fd 0/1 for an unrelated file to take.
  in_.assign(::fcntl(STDIN_FILENO, F_DUPFD_CLOEXEC, 3));
  out_.assign(::fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3));
}

net::stream_socket StdioLink::take_socket() {
  return std::move(theirs_);
}

void StdioLink::start(std::function<void(const std::string&)> on_end) {
  on_end_ = std::move(on_end);
  pump_in();
  pump_out();
}

void StdioLink::pump_in() {
  in_.async_read_some(asio::buffer(in_buf_), [this](boost::system::error_code ec, std::size_t n) {
    if (ended_) return;
    if (ec)
      return end(ec == asio::error::eof ? "stdin closed (the launcher's SSH connection is gone)"
                                        : "stdin: " + ec.message());
    asio::async_write(ours_, asio::buffer(in_buf_.data(), n), [this](boost::system::error_code ec, std::size_t) {
      if (ended_) return;
      if (ec) return end("link: " + ec.message());
      pump_in();
    });
  });
}

void StdioLink::pump_out() {
  ours_.async_read_some(asio::buffer(out_buf_), [this](boost::system::error_code ec, std::size_t n) {
    if (ended_) return;
    if (ec) return end(ec == asio::error::eof ? "the agent closed the link" : "link: " + ec.message());
    asio::async_write(out_, asio::buffer(out_buf_.data(), n), [this](boost::system::error_code ec, std::size_t) {
      if (ended_) return;
      if (ec) return end("stdout: " + ec.message());
      pump_out();
    });
  });
}

void StdioLink::end(const std::string& why) {
  ended_ = true;
  boost::system::error_code ignored;
  ours_.close(ignored);  // the Connection sees EOF
  in_.close(ignored);
  out_.close(ignored);
  if (auto cb = std::move(on_end_)) cb(why);
}

}  // namespace ddp::agent

// The channel over a real socketpair, both ends in one io_context.
#include "shepherd/channel.hpp"

#include "proto/frame.hpp"

#include <gtest/gtest.h>
#include <boost/asio/io_context.hpp>

#include <sys/socket.h>
#include <unistd.h>

using namespace ddp::shepherd;
using nlohmann::json;
namespace asio = boost::asio;

namespace {

struct Pair {
  int a = -1, b = -1;
  Pair() {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    a = sv[0];
    b = sv[1];
  }
};

}  // namespace

TEST(ShepherdChannel, MessagesArriveInOrderBothWays) {
  asio::io_context io;
  Pair p;
  auto agent = Channel::make(io, p.a, Sender::shepherd, 1 << 20);
  auto shep = Channel::make(io, p.b, Sender::agent, 1 << 20);
  std::vector<std::string> at_shepherd, at_agent;
  shep->start(
      {[&](const std::string& t, const json& m) {
         at_shepherd.push_back(t);
         if (t == "stop")
           shep->send(encode_line({0, ddp::supervisor::Stream::out, "bye " + std::to_string(decode_signal(m))}));
       },
       nullptr});
  agent->start({[&](const std::string&, const json& m) {
                  at_agent.push_back(decode_line(m).data);
                  agent->close("done");
                  shep->close("done");
                },
                nullptr});
  agent->send(encode_signal("forward", 10));
  agent->send(encode_signal("stop", 15));
  io.run_for(std::chrono::seconds(10));
  EXPECT_EQ(at_shepherd, (std::vector<std::string>{"forward", "stop"}));
  EXPECT_EQ(at_agent, (std::vector<std::string>{"bye 15"}));
}

TEST(ShepherdChannel, PeerGoneIsReportedOnce) {
  asio::io_context io;
  Pair p;
  auto shep = Channel::make(io, p.b, Sender::agent, 1 << 20);
  int closed = 0;
  std::string why;
  shep->start({nullptr, [&](const std::string& w) {
                 ++closed;
                 why = w;
               }});
  ::close(p.a);
  io.run_for(std::chrono::seconds(10));
  EXPECT_EQ(closed, 1);
  EXPECT_EQ(why, "the peer closed the connection");
  EXPECT_FALSE(shep->open());
  EXPECT_FALSE(shep->send(encode_signal("stop", 15)));
}

// What a broken or hostile peer writes: each closes the channel with a reason, and nothing of
// it reaches on_message.
TEST(ShepherdChannel, MalformedInputClosesWithAReason) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {ddp::proto::encode_frame("not json"), "bad message"},
      {ddp::proto::encode_frame(R"({"type":"finished"})"), "is not a message the agent sends"},
      {ddp::proto::encode_frame("[1,2]"), "must be a JSON object"},
      {std::string("\x7f\xff\xff\xff", 4), "bad frame"},  // 2 GiB declared: refused before reading it
  };
  for (const auto& [bytes, needle] : cases) {
    asio::io_context io;
    Pair p;
    auto shep = Channel::make(io, p.b, Sender::agent, 1 << 20);
    int messages = 0;
    std::string why;
    shep->start({[&](const std::string&, const json&) { ++messages; }, [&](const std::string& w) { why = w; }});
    ASSERT_EQ(::write(p.a, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    io.run_for(std::chrono::seconds(10));
    EXPECT_EQ(messages, 0);
    EXPECT_NE(why.find(needle), std::string::npos) << why;
    ::close(p.a);
  }
}

TEST(ShepherdChannel, AFullQueueDropsInsteadOfGrowing) {
  asio::io_context io;
  Pair p;
  // Nobody reads the other end and the io_context does not run: writes stay queued.
  auto agent = Channel::make(io, p.a, Sender::shepherd, 1000);
  int accepted = 0;
  for (int i = 0; i < 100; ++i)
    accepted += agent->send(encode_line({0, ddp::supervisor::Stream::out, std::string(100, 'x')}));
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, 100);
  ::close(p.b);
}

// Two Connections over loopback on port 0, in one io_context: handshake, messages both ways,
// a wrong key refused with a clear reason on both sides, and a silent peer timed out; and the
// same over a socketpair (SSH mode).
#include "net/connection.hpp"

#include "common/log.hpp"
#include "proto/frame.hpp"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <boost/asio.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <sstream>

using namespace ddp::net;
using namespace ddp::proto;
namespace asio = boost::asio;

namespace {

Key key(char c) {
  return Key{"default", std::string(40, c)};
}

struct Pair {
  asio::io_context io;
  tcp::acceptor acceptor{io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)};
  std::shared_ptr<Connection> server, client;
  std::string server_closed, client_closed;
  std::vector<std::string> server_got, client_got;
  bool server_est = false, client_est = false;

  void run(Key client_key, ddp::Millis handshake = ddp::Millis(2000), bool silent_client = false) {
    acceptor.async_accept([&](boost::system::error_code ec, tcp::socket s) {
      ASSERT_FALSE(ec);
      ServerConfig sc;
      sc.role = Role::agent;
      sc.keys = Keyring({key('s')});
      sc.nonce = random_nonce();
      sc.accept_roles = {Role::coordinator};
      server = Connection::make(std::move(s), Session::server(sc), "client-peer", "test", handshake);
      server->start({[&](const PeerInfo&) { server_est = true; },
                     [&](Message m) {
                       server_got.push_back(m.type);
                       server->send(server->session().message("heartbeat"));
                     },
                     [&](const std::string& r) { server_closed = r; }});
    });
    tcp::socket cs(io);
    cs.connect(acceptor.local_endpoint());
    if (silent_client) {
      io.run_for(std::chrono::seconds(3));
      return;
    }
    ClientConfig cc;
    cc.role = Role::coordinator;
    cc.user = "u";
    cc.key = client_key;
    cc.nonce = random_nonce();
    client = Connection::make(std::move(cs), Session::client(cc), "server-peer", "test", handshake);
    client->start({[&](const PeerInfo&) {
                     client_est = true;
                     client->send(client->session().message("heartbeat", {{"now_us", 1}}));
                   },
                   [&](Message m) {
                     client_got.push_back(m.type);
                     client->close("done");
                   },
                   [&](const std::string& r) { client_closed = r; }});
    io.run_for(std::chrono::seconds(3));
  }
};

// Both ends of a socketpair as Connections: `server` an agent, `client` a coordinator.
struct Socketpair {
  std::shared_ptr<Connection> server, client;
};
Socketpair socketpair_connections(asio::io_context& io, std::string server_label, std::string client_label) {
  int fds[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  const asio::generic::stream_protocol unix_stream(AF_UNIX, 0);
  stream_socket a(io, unix_stream, fds[0]), b(io, unix_stream, fds[1]);
  ServerConfig sc;
  sc.role = Role::agent;
  sc.keys = Keyring({key('s')});
  sc.nonce = random_nonce();
  sc.accept_roles = {Role::coordinator};
  ClientConfig cc;
  cc.role = Role::coordinator;
  cc.user = "u";
  cc.key = key('s');
  cc.nonce = random_nonce();
  return {Connection::make(std::move(a), Session::server(sc), std::move(server_label), "test", ddp::Millis(2000)),
          Connection::make(std::move(b), Session::client(cc), std::move(client_label), "test", ddp::Millis(2000))};
}

}  // namespace

TEST(Connection, HandshakeAndMessagesBothWays) {
  Pair p;
  p.run(key('s'));
  EXPECT_TRUE(p.server_est);
  EXPECT_TRUE(p.client_est);
  EXPECT_EQ(p.server_got, std::vector<std::string>{"heartbeat"});
  EXPECT_EQ(p.client_got, std::vector<std::string>{"heartbeat"});
  EXPECT_EQ(p.client_closed, "done");
  EXPECT_NE(p.server_closed.find("closed"), std::string::npos) << p.server_closed;
}

TEST(Connection, WrongKeyIsRefusedAndBothSidesSayWhy) {
  Pair p;
  p.run(key('x'));
  EXPECT_FALSE(p.server_est);
  EXPECT_FALSE(p.client_est);
  EXPECT_NE(p.server_closed.find("auth"), std::string::npos) << p.server_closed;
  EXPECT_NE(p.client_closed.find("auth"), std::string::npos) << p.client_closed;
  EXPECT_TRUE(p.server_got.empty());
}

TEST(Connection, SilentPeerTimesOutInTheHandshake) {
  Pair p;
  p.run(key('s'), ddp::Millis(200), /*silent_client=*/true);
  EXPECT_NE(p.server_closed.find("timed out waiting for the peer's hello"), std::string::npos) << p.server_closed;
}

// SSH mode runs the same Connection over socketpair ends (the pumps sit behind them): no TCP
// endpoints, the same handshake and frames.
TEST(Connection, OverASocketpairWithoutEndpoints) {
  asio::io_context io;
  auto [server, client] = socketpair_connections(io, "stdio", "n1 (ssh)");
  std::vector<std::string> server_got;
  std::string server_closed;
  server->start(
      {nullptr, [&](Message m) { server_got.push_back(m.type); }, [&](const std::string& r) { server_closed = r; }});
  client->start({[&](const PeerInfo&) {
                   client->send(client->session().message("heartbeat", {{"now_us", 1}}));
                   client->close("done");
                 },
                 nullptr, nullptr});
  io.run_for(std::chrono::seconds(3));
  EXPECT_EQ(server_got, std::vector<std::string>{"heartbeat"});
  EXPECT_NE(server_closed.find("closed"), std::string::npos) << server_closed;
  EXPECT_FALSE(server->local_endpoint().has_value());
  EXPECT_FALSE(client->remote_endpoint().has_value());
}

// A handler that throws ends its own link only: the peer is told why, the loop goes on (other
// links of the same io_context keep working), nothing unwinds through io_context::run().
TEST(Connection, AHandlerThatThrowsClosesItsLinkOnlyAndThePeerIsTold) {
  asio::io_context io;
  auto [bad_server, bad_client] = socketpair_connections(io, "throws", "peer-1");
  auto [good_server, good_client] = socketpair_connections(io, "works", "peer-2");
  std::string bad_closed, bad_client_closed, good_closed;
  std::vector<std::string> good_got;
  bad_server->start({nullptr, [&](Message) -> void { throw std::runtime_error("a bug on this side"); },
                     [&](const std::string& r) { bad_closed = r; }});
  bad_client->start({[&](const PeerInfo&) { bad_client->send(bad_client->session().message("heartbeat")); }, nullptr,
                     [&](const std::string& r) { bad_client_closed = r; }});
  good_server->start(
      {nullptr, [&](Message m) { good_got.push_back(m.type); }, [&](const std::string& r) { good_closed = r; }});
  good_client->start({[&](const PeerInfo&) {
                        // The second message leaves after the first link has failed.
                        asio::post(io, [&] {
                          asio::post(io, [&] { good_client->send(good_client->session().message("heartbeat")); });
                        });
                      },
                      nullptr, nullptr});
  EXPECT_NO_THROW(io.run_for(std::chrono::seconds(2)));
  EXPECT_NE(bad_client_closed.find("failed while handling its 'heartbeat'"), std::string::npos) << bad_client_closed;
  EXPECT_FALSE(bad_closed.empty());
  EXPECT_EQ(good_got, std::vector<std::string>{"heartbeat"});
  EXPECT_TRUE(good_server->open()) << good_closed;
}

// cork()/uncork(): frames queued between them stay with us until uncork, then arrive in order
// (the coordinator's assign + start to one node); nested corks hold until the outermost ends.
TEST(Connection, CorkedFramesWaitForUncorkThenArriveInOrder) {
  asio::io_context io;
  auto [agent, coord] = socketpair_connections(io, "agent", "coordinator");
  std::vector<std::int64_t> got;  // each heartbeat's now_us: which frame, in arrival order
  agent->start({nullptr, [&](Message m) { got.push_back(m.beat.now_us.value()); }, nullptr});
  bool up = false;
  coord->start({[&](const PeerInfo&) { up = true; }, nullptr, nullptr});
  for (int i = 0; i < 200 && !(up && agent->established()); ++i) io.run_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(up && agent->established());

  coord->cork();
  coord->cork();
  for (std::int64_t n : {1, 2}) ASSERT_TRUE(coord->send(coord->session().message("heartbeat", {{"now_us", n}})));
  coord->uncork();
  io.run_for(std::chrono::milliseconds(200));
  EXPECT_TRUE(got.empty()) << "a frame left while still corked";
  EXPECT_GT(coord->queued_bytes(), 0u);
  coord->uncork();
  for (int i = 0; i < 200 && got.size() < 2; ++i) io.run_for(std::chrono::milliseconds(10));
  EXPECT_EQ(got, (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(coord->queued_bytes(), 0u);
}

// A peer that does not read what we send (here: the writes never complete, the loop is not run)
// is dropped once what is queued for it would pass the limit: nothing past the limit is queued,
// the owner sees the link go out of service at once and closed from the loop afterwards, and
// the log and the reason say why.
TEST(Connection, APeerThatDoesNotReadIsDroppedAtTheQueueLimit) {
  asio::io_context io;
  auto [agent, coord] = socketpair_connections(io, "agent", "coordinator");
  std::string agent_closed, coord_closed;
  agent->start({nullptr, nullptr, [&](const std::string& r) { agent_closed = r; }});
  coord->start({nullptr, nullptr, [&](const std::string& r) { coord_closed = r; }});
  for (int i = 0; i < 200 && !(coord->established() && agent->established()); ++i)
    io.run_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(agent->established());
  constexpr std::size_t kLimit = 1 << 20;
  agent->set_max_queued_bytes(kLimit);
  const std::string chunk(32 * 1024, 'x');
  int sent = 0;
  for (int i = 0; i < 64; ++i) {
    const std::size_t before = agent->queued_bytes();
    const bool ok = agent->send(agent->session().message(
        "output", {{"job_id", "j"}, {"round", 0}, {"local_rank", 0}, {"stream", "stdout"}, {"data", chunk}}));
    if (!ok) break;
    ++sent;
    EXPECT_GT(agent->queued_bytes(), before) << "send() said the frame was queued, and it was not";
    EXPECT_LE(agent->queued_bytes(), kLimit);
  }
  EXPECT_GT(sent, 16);  // what fits under the limit was queued
  EXPECT_LT(sent, 64);  // and then the link went out of service
  EXPECT_FALSE(agent->established());
  EXPECT_LE(agent->queued_bytes(), kLimit);
  EXPECT_TRUE(agent_closed.empty()) << "closed from inside send(): " << agent_closed;
  for (int i = 0; i < 200 && (agent_closed.empty() || coord_closed.empty()); ++i)
    io.run_for(std::chrono::milliseconds(10));
  EXPECT_NE(agent_closed.find("does not read what we send"), std::string::npos) << agent_closed;
  EXPECT_NE(agent_closed.find("the limit is 1048576"), std::string::npos) << agent_closed;
  EXPECT_FALSE(coord_closed.empty());  // the peer sees the link end
}

// The coordinator's pace (coordinator.hpp, steady_batch) stops pausing while a connection
// streams: its sign is a read that filled the buffer. Small frames one at a time never fill one;
// an agent's output of 200 KiB arriving while the loop is not reading fills several.
TEST(Connection, AReadThatFillsItsBufferIsCountedOnItsThread) {
  asio::io_context io;
  auto [agent, coordinator] = socketpair_connections(io, "coordinator", "agent");
  int beats = 0;
  std::size_t output_bytes = 0;
  agent->start({[](const PeerInfo&) {}, [&](Message m) { beats += m.type == "heartbeat"; }, [](const std::string&) {}});
  coordinator->start({[](const PeerInfo&) {},
                      [&](Message m) {
                        if (m.type == "output") output_bytes += m.body["data"].get<std::string>().size();
                      },
                      [](const std::string&) {}});
  io.run_for(std::chrono::milliseconds(300));
  ASSERT_TRUE(agent->established() && coordinator->established());

  const auto before = Connection::full_reads_on_this_thread();
  for (int i = 0; i < 5; ++i) {
    coordinator->send_heartbeat(i);
    io.run_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(beats, 5);
  EXPECT_EQ(Connection::full_reads_on_this_thread(), before) << "a heartbeat filled a read buffer";

  for (int i = 0; i < 4; ++i) {
    agent->send(agent->session().message("output", {{"job_id", "j"},
                                                    {"round", 1},
                                                    {"local_rank", 0},
                                                    {"stream", "stdout"},
                                                    {"data", std::string(50 * 1024, 'x')}}));
  }
  io.run_for(std::chrono::milliseconds(500));
  EXPECT_EQ(output_bytes, 4u * 50 * 1024);
  EXPECT_GE(Connection::full_reads_on_this_thread() - before, 3u);
}

// A close's reason goes to our log (a warning, for a peer that never authenticated) and to the
// owner, which may print it on a user's terminal. A stranger's 'error' frame, and a reason with
// control characters however it was built, come out on one line, without them, and bounded.
TEST(Connection, ACloseReasonIsLoggedAndHandedOnClean) {
  std::ostringstream logged;
  auto logger = ddp::log::get("test");
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_st>(logged);
  logger->sinks().push_back(sink);
  struct Unsink {
    std::shared_ptr<spdlog::logger> logger;
    ~Unsink() { logger->sinks().pop_back(); }
  } unsink{logger};

  asio::io_context io;
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  stream_socket mine(io, asio::generic::stream_protocol(AF_UNIX, 0), fds[0]);
  ServerConfig sc;
  sc.role = Role::agent;
  sc.keys = Keyring({key('s')});
  sc.nonce = random_nonce();
  sc.accept_roles = {Role::coordinator};
  auto server = Connection::make(std::move(mine), Session::server(sc), "stranger", "test", ddp::Millis(2000));
  std::string closed;
  server->start({nullptr, nullptr, [&](const std::string& r) { closed = r; }});
  // No key, no hello: an 'error' frame first, as anyone can send.
  const auto frame = encode_frame(
      R"({"type":"error","v":3,"code":"x","message":"\u001b]0;PWNED\u0007\u001b[2J\nddpctl error [coordinator] forged line\r"})");
  ASSERT_EQ(::write(fds[1], frame.data(), frame.size()), static_cast<ssize_t>(frame.size()));
  io.run_for(std::chrono::milliseconds(500));
  ::close(fds[1]);
  const std::string shown = "peer refused: x: ?]0;PWNED??[2J?ddpctl error [coordinator] forged line?";
  EXPECT_EQ(closed, shown);
  EXPECT_NE(logged.str().find("stranger: connection closed: " + shown + "\n"), std::string::npos) << logged.str();
  EXPECT_EQ(logged.str().find('\x1b'), std::string::npos);

  // Whatever built the reason, the last line before the log and the owner cleans it.
  auto [agent, coord] = socketpair_connections(io, "agent", "coordinator");
  std::string why;
  agent->start({nullptr, nullptr, [&](const std::string& r) { why = r; }});
  agent->close("bye\x1b[2J\r\n" + std::string(64 * 1024, 'x'));
  EXPECT_EQ(why.substr(0, 12), "bye?[2J??xxx");
  EXPECT_EQ(why.size(), 16u * 1024);
  EXPECT_EQ(logged.str().find('\n', logged.str().find("agent: connection closed: bye?[2J??x")) -
                logged.str().find("agent: connection closed: bye?[2J??x"),
            std::string("agent: connection closed: ").size() + 16 * 1024)
      << "one line, bounded";
}

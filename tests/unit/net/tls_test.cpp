// TLS 1.3 under the protocol (net/tls.hpp): a coordinator-side Connection dials an agent-side
// one over loopback through a tap that records every byte in both directions. With TLS the
// job's text never crosses in clear; an agent that allows TLS takes plaintext too, one that
// requires it refuses plaintext and says why; a wrong secret or an unknown key id fails TLS's own
// handshake before the protocol's starts.
#include "net/tls.hpp"
#include "net/connection.hpp"

#include <gtest/gtest.h>
#include <boost/asio.hpp>

#include <mutex>
#include <thread>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

using namespace ddp::net;
using namespace ddp::proto;
namespace asio = boost::asio;

namespace {

const std::string kMarker = "a-job-secret-that-must-not-travel-in-clear";

Key key(const std::string& id, char c) {
  return Key{id, std::string(40, c)};
}

// A one-connection TCP relay on loopback that keeps a copy of everything it forwards.
class Tap {
 public:
  explicit Tap(std::uint16_t target) : target_(target) {
    listen_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(listen_, 1);
    socklen_t len = sizeof a;
    ::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { relay(); });
  }
  ~Tap() {
    ::shutdown(listen_, SHUT_RDWR);
    thread_.join();
    ::close(listen_);
  }
  std::uint16_t port() const { return port_; }
  std::string seen() {
    std::lock_guard lock(mu_);
    return seen_;
  }

 private:
  void relay() {
    const int in = ::accept(listen_, nullptr, nullptr);
    if (in < 0) return;
    const int out = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(target_);
    if (::connect(out, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(in);
      ::close(out);
      return;
    }
    std::thread back([&] { copy(out, in); });
    copy(in, out);
    back.join();
    ::close(in);
    ::close(out);
  }
  void copy(int from, int to) {
    char buf[4096];
    for (;;) {
      const auto n = ::read(from, buf, sizeof buf);
      if (n <= 0) break;
      {
        std::lock_guard lock(mu_);
        seen_.append(buf, static_cast<std::size_t>(n));
      }
      if (::write(to, buf, static_cast<std::size_t>(n)) != n) break;
    }
    ::shutdown(to, SHUT_WR);
  }

  std::uint16_t target_, port_ = 0;
  int listen_ = -1;
  std::thread thread_;
  std::mutex mu_;
  std::string seen_;
};

struct Run {
  bool server_est = false, client_est = false, server_tls = false, client_tls = false;
  std::string server_closed, client_closed, server_got;
  std::string wire;
};

// client_tls: the coordinator dials with TLS; server_mode: the agent's `tls:` setting.
Run run(bool client_tls, TlsMode server_mode, const Key& client_key) {
  Run r;
  asio::io_context io;
  tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  const Keyring agent_keys({key("default", 's'), key("team-b", 'b')});
  std::shared_ptr<Connection> server, client;
  acceptor.async_accept([&](boost::system::error_code ec, tcp::socket s) {
    ASSERT_FALSE(ec);
    ServerConfig sc;
    sc.role = Role::agent;
    sc.keys = agent_keys;
    sc.nonce = random_nonce();
    sc.accept_roles = {Role::coordinator};
    server = Connection::make(std::move(s), Session::server(sc), "coordinator", "test", ddp::Millis(3000));
    if (server_mode != TlsMode::off) server->use_tls({tls_server_context(agent_keys), true, server_mode});
    server->start({[&](const PeerInfo&) {
                     r.server_est = true;
                     r.server_tls = server->encrypted();
                   },
                   [&](Message m) {
                     r.server_got = m.body.dump();
                     server->send(server->session().message("heartbeat"));
                   },
                   [&](const std::string& why) { r.server_closed = why; }});
  });
  Tap tap(acceptor.local_endpoint().port());
  tcp::socket cs(io);
  cs.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), tap.port()));
  ClientConfig cc;
  cc.role = Role::coordinator;
  cc.user = "u";
  cc.key = client_key;
  cc.nonce = random_nonce();
  client = Connection::make(std::move(cs), Session::client(cc), "agent", "test", ddp::Millis(3000));
  if (client_tls) client->use_tls({tls_client_context(client_key)});
  client->start({[&](const PeerInfo&) {
                   r.client_est = true;
                   r.client_tls = client->encrypted();
                   // Any message will do; a stop's reason carries the marker here.
                   client->send(client->session().message(
                       "stop", {{"job_id", "j"}, {"round", 1}, {"grace_ms", 1000}, {"reason", kMarker}}));
                 },
                 [&](Message) { client->close("done"); }, [&](const std::string& why) { r.client_closed = why; }});
  // Until both ends have closed (the client closes once answered; a refusal closes both).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while ((r.client_closed.empty() || r.server_closed.empty()) && std::chrono::steady_clock::now() < deadline) {
    io.run_one_for(std::chrono::milliseconds(100));
  }
  if (client) client->close("test over");
  if (server) server->close("test over");
  io.poll();
  r.wire = tap.seen();
  return r;
}

}  // namespace

TEST(Tls, PskIsDerivedPerKeyAndIsNotTheSecret) {
  const auto a = tls_psk(key("default", 's')), b = tls_psk(key("default", 't'));
  EXPECT_EQ(a.size(), 32u);
  EXPECT_NE(a, b);
  EXPECT_EQ(a, tls_psk(key("other-id", 's')));  // the identity travels beside it, not inside
  EXPECT_EQ(a.find(std::string(40, 's')), std::string::npos);
}

TEST(Tls, ModesParse) {
  EXPECT_EQ(parse_tls_mode("allowed"), TlsMode::allowed);
  EXPECT_EQ(parse_tls_mode("required"), TlsMode::required);
  EXPECT_EQ(parse_tls_mode("off"), TlsMode::off);
  EXPECT_FALSE(parse_tls_mode("on"));
  EXPECT_EQ(to_string(TlsMode::required), "required");
}

TEST(Tls, PlaintextCarriesTheJobTextInClearAsTheControl) {
  auto r = run(false, TlsMode::allowed, key("default", 's'));
  ASSERT_TRUE(r.client_est && r.server_est) << r.client_closed << " / " << r.server_closed;
  EXPECT_FALSE(r.client_tls || r.server_tls);
  EXPECT_NE(r.wire.find(kMarker), std::string::npos);  // what TLS is for
}

TEST(Tls, InsideTlsNothingOfTheJobCrossesInClear) {
  for (auto mode : {TlsMode::allowed, TlsMode::required}) {
    auto r = run(true, mode, key("default", 's'));
    ASSERT_TRUE(r.client_est && r.server_est) << r.client_closed << " / " << r.server_closed;
    EXPECT_TRUE(r.client_tls && r.server_tls);
    EXPECT_NE(r.server_got.find(kMarker), std::string::npos) << r.server_got;
    EXPECT_EQ(r.wire.find(kMarker), std::string::npos);
    EXPECT_EQ(r.wire.find("\"hello\""), std::string::npos);  // not even the protocol's handshake
    EXPECT_EQ(static_cast<unsigned char>(r.wire[0]), 0x16);  // a TLS handshake record
  }
}

TEST(Tls, SecondKeyOfTheRingWorksByItsId) {
  auto r = run(true, TlsMode::required, key("team-b", 'b'));
  EXPECT_TRUE(r.client_est && r.server_est && r.client_tls) << r.client_closed << " / " << r.server_closed;
}

TEST(Tls, AgentRequiringTlsRefusesPlaintextAndSaysWhy) {
  auto r = run(false, TlsMode::required, key("default", 's'));
  EXPECT_FALSE(r.client_est);
  EXPECT_FALSE(r.server_est);
  EXPECT_NE(r.client_closed.find("only TLS"), std::string::npos) << r.client_closed;
  EXPECT_NE(r.client_closed.find("--tls"), std::string::npos) << r.client_closed;
}

TEST(Tls, WrongSecretOrUnknownKeyIdFailsTlsItself) {
  for (const auto& k : {key("default", 'x'), key("nobody", 's')}) {
    auto r = run(true, TlsMode::allowed, k);
    EXPECT_FALSE(r.client_est || r.server_est) << k.id;
    EXPECT_NE(r.client_closed.find("TLS handshake failed"), std::string::npos) << k.id << ": " << r.client_closed;
    EXPECT_NE(r.server_closed.find("TLS handshake failed"), std::string::npos) << k.id << ": " << r.server_closed;
    EXPECT_EQ(r.server_got, "");
  }
}

TEST(Tls, AgentWithTlsOffDropsATlsClient) {
  auto r = run(true, TlsMode::off, key("default", 's'));
  EXPECT_FALSE(r.client_est || r.server_est);
  EXPECT_NE(r.client_closed.find("TLS handshake failed"), std::string::npos) << r.client_closed;
}

// The handshake and authenticated frames, end to end between two in-memory sessions.
#include "proto/session.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

using namespace ddp::proto;
using nlohmann::json;

namespace {

const std::string kSecret = "7f1c2a9e4b3d5f60718293a4b5c6d7e8f90a1b2c3d4e5f60";
const std::string kOtherSecret = "00000000000000000000000000000000000000000000000000";

Nonce nonce(std::uint8_t seed) {
  Nonce n{};
  for (std::size_t i = 0; i < n.size(); ++i) n[i] = static_cast<std::uint8_t>(seed * 31 + i);
  return n;
}

ClientConfig client_config(std::uint8_t seed = 1) {
  ClientConfig c;
  c.role = Role::agent;
  c.user = "alice";
  c.name = "n1";
  c.key = Key{"default", kSecret};
  c.nonce = nonce(seed);
  return c;
}

ServerConfig server_config(std::uint8_t seed = 2) {
  ServerConfig s;
  s.role = Role::coordinator;
  s.name = "coord";
  s.keys = Keyring({Key{"default", kSecret}, Key{"ops", kOtherSecret}});
  s.nonce = nonce(seed);
  return s;
}

// What one side did in response to input.
struct Outcome {
  std::string sent;  // concatenated Send bytes
  std::vector<Message> delivered;
  std::optional<PeerInfo> established;
  std::optional<std::string> dropped;
};

Outcome absorb(Effects effects) {
  Outcome o;
  for (auto& e : effects) {
    if (auto* s = std::get_if<Send>(&e)) o.sent += s->bytes;
    if (auto* d = std::get_if<Deliver>(&e)) o.delivered.push_back(d->message);
    if (auto* x = std::get_if<Established>(&e)) o.established = x->peer;
    if (auto* x = std::get_if<Drop>(&e)) o.dropped = x->reason;
  }
  return o;
}

// A connected pair, pumped until quiet. Records every byte on the wire.
struct Pair {
  Session client = Session::client(client_config());
  Session server = Session::server(server_config());
  Outcome c, s;  // accumulated per side
  std::string wire;

  void merge(Outcome& into, Outcome o) {
    into.sent += o.sent;
    for (auto& m : o.delivered) into.delivered.push_back(m);
    if (o.established) into.established = o.established;
    if (o.dropped) into.dropped = o.dropped;
  }
  void pump(std::string to_server, std::string to_client = "") {
    while (!to_server.empty() || !to_client.empty()) {
      wire += to_server + to_client;
      auto a = absorb(server.on_bytes(to_server));
      auto b = absorb(client.on_bytes(to_client));
      to_client = a.sent;
      to_server = b.sent;
      merge(s, std::move(a));
      merge(c, std::move(b));
    }
  }
  void connect() {
    auto first = absorb(client.start());
    merge(c, first);
    pump(first.sent);
  }
};

std::string body_of(const std::string& frame) {
  return frame.substr(kFrameHeaderBytes);
}

}  // namespace

TEST(Session, HandshakeEstablishesBothSides) {
  Pair p;
  p.connect();
  ASSERT_TRUE(p.client.established()) << p.c.dropped.value_or("");
  ASSERT_TRUE(p.server.established()) << p.s.dropped.value_or("");
  ASSERT_TRUE(p.s.established);
  EXPECT_EQ(p.s.established->user, "alice");
  EXPECT_EQ(p.s.established->role, Role::agent);
  EXPECT_EQ(p.s.established->key_id, "default");
  EXPECT_EQ(p.s.established->name, "n1");
  EXPECT_EQ(p.s.established->version, 7u);
  ASSERT_TRUE(p.c.established);
  EXPECT_EQ(p.c.established->role, Role::coordinator);
  EXPECT_EQ(p.c.established->name, "coord");
  EXPECT_EQ(p.client.version(), 7u);
  EXPECT_EQ(p.c.established->delegate_key, "");  // a server without one says nothing
}

// Version 6: a standing coordinator names the key it dials agents with, for ddpctl's delegation;
// only to a client that negotiated 6 (an older one's schema would refuse the field).
TEST(Session, AStandingCoordinatorNamesItsDelegateKeyFromVersion6) {
  {
    Pair p;
    auto scfg = server_config();
    scfg.delegate_key = "coord-key";
    p.server = Session::server(scfg);
    p.connect();
    ASSERT_TRUE(p.client.established()) << p.c.dropped.value_or("");
    EXPECT_EQ(p.c.established->delegate_key, "coord-key");
  }
  {
    Pair p;
    auto cfg = client_config();
    cfg.versions = {3, 4, 5};
    p.client = Session::client(cfg);
    auto scfg = server_config();
    scfg.delegate_key = "coord-key";
    p.server = Session::server(scfg);
    p.connect();
    ASSERT_TRUE(p.client.established()) << p.c.dropped.value_or("");
    EXPECT_EQ(p.client.version(), 5u);
    EXPECT_EQ(p.c.established->delegate_key, "");
    EXPECT_EQ(p.wire.find("delegate_key"), std::string::npos);
  }
}

TEST(Session, TheSecretNeverCrossesTheWire) {
  Pair p;
  p.connect();
  p.pump(p.client.seal(p.client.message("heartbeat")));
  EXPECT_EQ(p.wire.find(kSecret), std::string::npos);
  EXPECT_EQ(p.wire.find(to_hex(kSecret)), std::string::npos);
}

TEST(Session, MessagesFlowBothWaysInOrder) {
  Pair p;
  p.connect();
  std::string batch;
  for (int i = 0; i < 5; ++i) batch += p.client.seal(p.client.message("heartbeat", {{"now_us", i}}));
  p.pump(batch);
  ASSERT_EQ(p.s.delivered.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(p.s.delivered[i].beat.now_us, i);
  p.pump("", p.server.seal(p.server.message("start", {{"job_id", "j"}, {"round", 99}})));
  ASSERT_EQ(p.c.delivered.size(), 1u);
  EXPECT_EQ(p.c.delivered[0].type, "start");
  EXPECT_EQ(p.c.delivered[0].body["round"], 99);
}

TEST(Session, WholeConversationSplitAtEveryByteBoundary) {
  // Record a full client->server byte stream, then replay it into fresh servers split anywhere.
  Pair p;
  auto hello = absorb(p.client.start()).sent;
  auto ack_and_proof = absorb(p.server.on_bytes(hello)).sent;
  auto auth = absorb(p.client.on_bytes(ack_and_proof)).sent;
  ASSERT_TRUE(p.client.established());
  std::string stream = hello + auth;
  stream += p.client.seal(p.client.message(
      "join", {{"t0_us", 1}, {"rx_us", 2}, {"tx_us", 3}, {"job_id", "j"}, {"node", "n1"}, {"nproc", 2}}));
  stream += p.client.seal(p.client.message("heartbeat"));  // sealed in order: seq 0, then 1
  for (std::size_t i = 0; i <= stream.size(); ++i) {
    Session server = Session::server(server_config());
    Outcome total;
    for (auto piece : {stream.substr(0, i), stream.substr(i)}) {
      auto o = absorb(server.on_bytes(piece));
      ASSERT_FALSE(o.dropped) << "split at " << i << ": " << *o.dropped;
      for (auto& m : o.delivered) total.delivered.push_back(m);
    }
    ASSERT_TRUE(server.established()) << i;
    ASSERT_EQ(total.delivered.size(), 2u) << i;
    EXPECT_EQ(total.delivered[0].type, "join");
    EXPECT_EQ(total.delivered[1].type, "heartbeat");
  }
  // And one byte at a time.
  Session server = Session::server(server_config());
  std::size_t delivered = 0;
  for (char ch : stream) {
    auto o = absorb(server.on_bytes(std::string_view(&ch, 1)));
    ASSERT_FALSE(o.dropped);
    delivered += o.delivered.size();
  }
  EXPECT_EQ(delivered, 2u);
}

// The first frame of a byte string (the rest: what follows it in the same write).
std::string first_frame(const std::string& bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::size_t n = (std::size_t{p[0]} << 24) | (std::size_t{p[1]} << 16) | (std::size_t{p[2]} << 8) | p[3];
  return bytes.substr(0, kFrameHeaderBytes + n);
}

TEST(Session, ClientWithTheWrongSecretStopsBeforeItProvesAnything) {
  Pair p;
  auto cfg = client_config();
  cfg.key.secret = kOtherSecret;
  p.client = Session::client(cfg);
  p.connect();
  EXPECT_FALSE(p.server.established());
  EXPECT_FALSE(p.client.established());
  ASSERT_TRUE(p.c.dropped);
  EXPECT_EQ(*p.c.dropped,
            "auth: the server failed to prove it holds key 'default' (its token file has a different secret for this "
            "key, or it is not the server you meant to reach)");
  ASSERT_TRUE(p.s.dropped);
  EXPECT_NE(p.s.dropped->find("peer refused: auth: the server failed to prove"), std::string::npos);
  // The client checked the server's proof first: its own never went out.
  EXPECT_EQ(p.wire.find(R"("type":"auth")"), std::string::npos);
  EXPECT_EQ(p.server.state(), Session::State::dropped);
}

TEST(Session, ServerWithTheWrongSecretIsCaughtByTheClient) {
  Pair p;
  auto cfg = server_config();
  cfg.keys = Keyring({Key{"default", kOtherSecret}});
  p.server = Session::server(cfg);
  p.connect();
  ASSERT_TRUE(p.c.dropped);
  EXPECT_NE(p.c.dropped->find("the server failed to prove it holds key 'default'"), std::string::npos);
  EXPECT_FALSE(p.client.established());
  EXPECT_FALSE(p.server.established());
  EXPECT_EQ(p.wire.find(R"("type":"auth")"), std::string::npos);
}

TEST(Session, AProofUnderTheWrongSecretIsRefusedAndWhatFollowsItIsNotRead) {
  // A client that ignores the server's proof and answers with one under another secret: a
  // mirror pair with the same nonces and names (so the same transcript) but that secret makes
  // a well-formed auth and a session frame behind it, sealed under its session key.
  auto wrong_c = client_config();
  wrong_c.key.secret = kOtherSecret;
  auto wrong_s = server_config();
  wrong_s.keys = Keyring({Key{"default", kOtherSecret}});
  Session mc = Session::client(wrong_c);
  Session ms = Session::server(wrong_s);
  auto mirrored = absorb(mc.on_bytes(absorb(ms.on_bytes(absorb(mc.start()).sent)).sent));
  ASSERT_TRUE(mc.established());
  const std::string forged = mirrored.sent + mc.seal(mc.message("heartbeat"));

  Session server = Session::server(server_config());
  absorb(server.on_bytes(absorb(Session::client(client_config()).start()).sent));
  auto o = absorb(server.on_bytes(forged));
  ASSERT_TRUE(o.dropped);
  EXPECT_EQ(*o.dropped,
            "auth: authentication failed for key id 'default': the proof does not match (the client's secret for this "
            "key differs from the server's token file (or the handshake was replayed))");
  EXPECT_TRUE(o.delivered.empty());
  EXPECT_FALSE(o.established);
  EXPECT_EQ(json::parse(body_of(o.sent))["type"], "error");
}

TEST(Session, UnknownKeyId) {
  Pair p;
  auto cfg = client_config();
  cfg.key.id = "nobody";
  p.client = Session::client(cfg);
  p.connect();
  ASSERT_TRUE(p.s.dropped);
  EXPECT_NE(p.s.dropped->find("unknown key id 'nobody'"), std::string::npos);
  EXPECT_NE(p.c.dropped->find("peer refused: auth: unknown key id 'nobody'"), std::string::npos);
  EXPECT_NE(p.c.dropped->find("--token-file"), std::string::npos);
}

TEST(Session, SecondKeyOfTheKeyringWorks) {
  Pair p;
  auto cfg = client_config();
  cfg.key = Key{"ops", kOtherSecret};
  p.client = Session::client(cfg);
  p.connect();
  ASSERT_TRUE(p.server.established());
  EXPECT_EQ(p.s.established->key_id, "ops");
}

TEST(Session, VersionMismatchGivesAHint) {
  {
    Pair p;
    auto cfg = client_config();
    cfg.versions = {8, 9};
    p.client = Session::client(cfg);
    p.connect();
    ASSERT_TRUE(p.s.dropped);
    EXPECT_EQ(
        *p.s.dropped,
        "version: no common protocol version: the client speaks 8, 9, 'coord' speaks 3, 4, 5, 6, 7 (upgrade ddpctl on "
        "'coord' (it is older than the client))");
    EXPECT_NE(p.c.dropped->find("peer refused: version"), std::string::npos);
  }
  {
    Pair p;
    auto scfg = server_config();
    scfg.versions = {8};
    p.server = Session::server(scfg);
    p.connect();
    EXPECT_NE(p.s.dropped->find("upgrade the client's ddpctl"), std::string::npos);
  }
}

TEST(Session, HighestCommonVersionIsChosen) {
  Pair p;
  auto cfg = client_config();
  cfg.versions = {3, 5, 6};
  auto scfg = server_config();
  scfg.versions = {3, 5};
  // Version 5 is not in the schema's range, but negotiation itself is pure arithmetic.
  p.client = Session::client(cfg);
  p.server = Session::server(scfg);
  auto hello = absorb(p.client.start()).sent;
  auto ack = absorb(p.server.on_bytes(hello));
  ASSERT_FALSE(ack.dropped);
  EXPECT_EQ(p.server.version(), 5u);
  EXPECT_EQ(json::parse(body_of(ack.sent))["version"], 5);
}

// The previous release speaks only version 3 (no start inside an assign): it still connects, and
// the coordinator sees version 3 and sends separate starts.
TEST(Session, AVersion3PeerStillConnects) {
  Pair p;
  auto cfg = client_config();
  cfg.versions = {3};
  p.client = Session::client(cfg);
  p.connect();
  ASSERT_TRUE(p.server.established()) << p.s.dropped.value_or("");
  EXPECT_EQ(p.server.version(), 3u);
  EXPECT_EQ(p.client.version(), 3u);
}

TEST(Session, ClientRefusesAVersionItDidNotOffer) {
  Session client = Session::client(client_config());
  absorb(client.start());
  auto ack = make_message("hello_ack", 8, {{"version", 8}, {"nonce", std::string(64, 'b')}, {"role", "coordinator"}});
  auto o = absorb(client.on_bytes(encode_frame(dump(ack))));
  ASSERT_TRUE(o.dropped);
  EXPECT_NE(o.dropped->find("chose protocol version 8, which this client did not offer (3, 4, 5, 6, 7)"),
            std::string::npos);
  auto sent = json::parse(body_of(o.sent));
  EXPECT_EQ(sent["type"], "error");
  EXPECT_EQ(sent["code"], "version");
}

TEST(Session, ClientRefusesAFramedVersionDifferentFromTheChosenOne) {
  Session client = Session::client(client_config());
  absorb(client.start());
  auto ack = make_message("hello_ack", 4, {{"version", 3}, {"nonce", std::string(64, 'b')}, {"role", "coordinator"}});
  auto o = absorb(client.on_bytes(encode_frame(dump(ack))));
  ASSERT_TRUE(o.dropped);
  EXPECT_NE(o.dropped->find("framed as version 4"), std::string::npos);
}

TEST(Session, RoleNotAccepted) {
  Pair p;
  auto scfg = server_config();
  scfg.accept_roles = {Role::ctl};
  p.server = Session::server(scfg);
  p.connect();
  ASSERT_TRUE(p.s.dropped);
  EXPECT_NE(p.s.dropped->find("role 'agent' is not accepted by this coordinator"), std::string::npos);
}

TEST(Session, ClientExpectingAnotherKindOfServer) {
  Pair p;
  auto cfg = client_config();
  cfg.role = Role::ctl;
  cfg.expect_server = Role::agent;
  p.client = Session::client(cfg);
  p.connect();
  ASSERT_TRUE(p.c.dropped);
  EXPECT_NE(p.c.dropped->find("expected to reach a agent, but this port is served by a coordinator"),
            std::string::npos);
  EXPECT_FALSE(p.server.established());
}

TEST(Session, ReplayedClientHandshakeFailsAgainstAFreshServerNonce) {
  Pair p;
  auto hello = absorb(p.client.start()).sent;
  auto ack = absorb(p.server.on_bytes(hello)).sent;
  auto auth = absorb(p.client.on_bytes(ack)).sent;
  absorb(p.client.on_bytes(absorb(p.server.on_bytes(auth)).sent));
  ASSERT_TRUE(p.server.established());
  // An eavesdropper replays the recorded hello + auth to a new connection.
  Session victim = Session::server(server_config(/*seed=*/9));
  auto o1 = absorb(victim.on_bytes(hello));
  ASSERT_FALSE(o1.dropped);
  auto o2 = absorb(victim.on_bytes(auth));
  ASSERT_TRUE(o2.dropped);
  EXPECT_NE(o2.dropped->find("authentication failed"), std::string::npos);
  EXPECT_FALSE(victim.established());
}

TEST(Session, ReplayedServerHandshakeFailsAgainstAFreshClientNonce) {
  Pair p;
  auto hello = absorb(p.client.start()).sent;
  auto ack_and_proof = absorb(p.server.on_bytes(hello)).sent;
  absorb(p.client.on_bytes(ack_and_proof));
  ASSERT_TRUE(p.client.established());
  // A fake server replays the recorded hello_ack and auth_ok to a new client.
  Session victim = Session::client(client_config(/*seed=*/7));
  absorb(victim.start());
  auto o = absorb(victim.on_bytes(ack_and_proof));
  ASSERT_TRUE(o.dropped);
  EXPECT_NE(o.dropped->find("failed to prove"), std::string::npos);
  EXPECT_EQ(o.sent.find(R"("type":"auth")"), std::string::npos);
}

namespace {
Pair established_pair() {
  Pair p;
  p.connect();
  EXPECT_TRUE(p.server.established());
  return p;
}
}  // namespace

// seal_heartbeat() encodes without a DOM: it must give the very bytes seal() gives (two pairs
// from the same nonces hold the same keys), and the peer must read back what was sent, for
// either side, with and without the echo, at the integers' extremes.
TEST(SessionFrames, AHeartbeatSealedWithoutADomIsByteForByteTheSealedMessage) {
  const std::int64_t lo = std::numeric_limits<std::int64_t>::min(), hi = std::numeric_limits<std::int64_t>::max();
  for (bool from_client : {true, false}) {
    for (auto [now, echo] :
         std::vector<std::pair<std::int64_t, std::optional<Session::Echo>>>{{0, std::nullopt},
                                                                            {1733540000123456, std::nullopt},
                                                                            {-5, Session::Echo{17, -3}},
                                                                            {hi, Session::Echo{lo, hi}},
                                                                            {lo, Session::Echo{0, 0}}}) {
      auto a = established_pair();
      auto b = established_pair();
      Session& sa = from_client ? a.client : a.server;
      Session& sb = from_client ? b.client : b.server;
      Session& peer = from_client ? b.server : b.client;
      nlohmann::json fields{{"now_us", now}};
      if (echo) {
        fields["t0_us"] = echo->t0_us;
        fields["rx_us"] = echo->rx_us;
      }
      const auto expected = sa.seal(sa.message("heartbeat", fields));
      const auto got = sb.seal_heartbeat(now, echo);
      EXPECT_EQ(got, expected) << "now " << now << (echo ? " with an echo" : "");
      auto o = absorb(peer.on_bytes(got));
      ASSERT_EQ(o.delivered.size(), 1u);
      EXPECT_FALSE(o.dropped);
      const auto& m = o.delivered[0];
      EXPECT_EQ(m.type, "heartbeat");
      EXPECT_EQ(m.beat.now_us, now);
      EXPECT_EQ(m.beat.t0_us, echo ? std::optional(echo->t0_us) : std::nullopt);
      EXPECT_EQ(m.beat.rx_us, echo ? std::optional(echo->rx_us) : std::nullopt);
      EXPECT_TRUE(m.body.is_null());
      // The sequence moved on as seal()'s does: the next frame still authenticates.
      EXPECT_EQ(absorb(peer.on_bytes(sb.seal(sb.message("heartbeat")))).delivered.size(), 1u);
    }
  }
  Session idle = Session::client(client_config());
  EXPECT_THROW(idle.seal_heartbeat(1), std::logic_error);
}

TEST(SessionFrames, ReplayedFrameIsDropped) {
  auto p = established_pair();
  auto f = p.client.seal(p.client.message("heartbeat"));
  EXPECT_EQ(absorb(p.server.on_bytes(f)).delivered.size(), 1u);
  auto o = absorb(p.server.on_bytes(f));
  EXPECT_TRUE(o.delivered.empty());
  ASSERT_TRUE(o.dropped);
  EXPECT_EQ(*o.dropped, "bad_mac: frame #1 failed authentication (replayed, reordered, injected or corrupted)");
  EXPECT_TRUE(o.sent.empty());  // no answer to a forged frame
}

TEST(SessionFrames, ReorderedFramesAreDropped) {
  auto p = established_pair();
  auto f0 = p.client.seal(p.client.message("heartbeat", {{"now_us", 0}}));
  auto f1 = p.client.seal(p.client.message("heartbeat", {{"now_us", 1}}));
  auto o = absorb(p.server.on_bytes(f1 + f0));
  EXPECT_TRUE(o.delivered.empty());
  EXPECT_TRUE(o.dropped);
}

TEST(SessionFrames, DroppedFrameBreaksTheSequence) {
  auto p = established_pair();
  p.client.seal(p.client.message("heartbeat"));  // lost on the way
  auto o = absorb(p.server.on_bytes(p.client.seal(p.client.message("heartbeat"))));
  EXPECT_TRUE(o.dropped);
}

TEST(SessionFrames, EveryTamperedByteIsDetected) {
  auto base = established_pair();
  auto f = base.client.seal(base.client.message(
      "join", {{"t0_us", 1}, {"rx_us", 2}, {"tx_us", 3}, {"job_id", "j"}, {"node", "n1"}, {"nproc", 8}}));
  for (std::size_t i = kFrameHeaderBytes; i < f.size(); ++i) {
    auto p = established_pair();  // identical nonces: identical keys and sequence
    auto same = p.client.seal(p.client.message(
        "join", {{"t0_us", 1}, {"rx_us", 2}, {"tx_us", 3}, {"job_id", "j"}, {"node", "n1"}, {"nproc", 8}}));
    ASSERT_EQ(same, f);
    same[i] = static_cast<char>(same[i] ^ 0x01);
    auto o = absorb(p.server.on_bytes(same));
    EXPECT_TRUE(o.delivered.empty()) << i;
    ASSERT_TRUE(o.dropped) << i;
  }
}

TEST(SessionFrames, InjectedPlainFrameIsDropped) {
  auto p = established_pair();
  auto o = absorb(p.server.on_bytes(encode_frame(
      dump(make_message("submit", 1, {{"user", "mallory"}, {"spec", json::object()}, {"nodes", json::array()}})))));
  EXPECT_TRUE(o.delivered.empty());
  EXPECT_TRUE(o.dropped);
}

TEST(SessionFrames, FrameFromAnotherSessionIsDropped) {
  auto p = established_pair();
  Pair other;
  other.client = Session::client(client_config(/*seed=*/5));
  other.connect();
  auto o = absorb(p.server.on_bytes(other.client.seal(other.client.message("heartbeat"))));
  EXPECT_TRUE(o.dropped);
}

TEST(SessionFrames, ReflectedFrameIsDropped) {
  auto p = established_pair();
  // The server's own frame sent back to it: right key, wrong direction.
  auto o = absorb(p.server.on_bytes(p.server.seal(p.server.message("heartbeat"))));
  EXPECT_TRUE(o.dropped);
}

TEST(SessionFrames, TooShortToCarryAMac) {
  auto p = established_pair();
  auto o = absorb(p.server.on_bytes(encode_frame("{}")));
  ASSERT_TRUE(o.dropped);
  EXPECT_NE(o.dropped->find("too short"), std::string::npos);
}

TEST(SessionFrames, InvalidAuthenticatedMessageGetsAnErrorThenDrop) {
  struct Case {
    std::string json;
    const char* needle;
  };
  for (const auto& c : std::vector<Case>{
           {R"({"type":"launch_rockets","v":1})", "unknown_type: unknown message type 'launch_rockets'"},
           {R"({"type":"join","v":1,"job_id":"j","node":"n1"})",
            "missing_field: 'join' is missing required field 'nproc'"},
           {R"({"type":"join","v":1,"job_id":"j","node":"n1","nproc":"8"})",
            "wrong_type: 'join.nproc' must be an unsigned integer, got a string"},
           {R"({"type":"assign","v":1})", "wrong_sender"},
           {R"({"type":"heartbeat","v":1})", "version: 'heartbeat' is framed as version 1, negotiated 7"},
           {R"({"type":"hello","v":7,"versions":[7],"key_id":"k","nonce":")" + std::string(64, 'a') +
                R"(","role":"agent","user":"u"})",
            "unexpected: 'hello' after the handshake finished"},
           {R"(not json)", "bad_json"},
       }) {
    auto p = established_pair();
    auto o = absorb(p.server.on_bytes(p.client.seal_raw(c.json)));
    ASSERT_TRUE(o.dropped) << c.json;
    EXPECT_NE(o.dropped->find(c.needle), std::string::npos) << *o.dropped;
    // The peer is told why, authenticated, and drops on reading it.
    auto back = absorb(p.client.on_bytes(o.sent));
    ASSERT_TRUE(back.dropped) << c.json;
    EXPECT_NE(back.dropped->find("peer closed: "), std::string::npos) << *back.dropped;
    EXPECT_NE(back.dropped->find(c.needle), std::string::npos) << *back.dropped;
  }
}

TEST(SessionFrames, RefuseSendsAnAuthenticatedError) {
  auto p = established_pair();
  auto o = absorb(p.server.refuse(ErrorCode::unexpected, "busy: job j1 is running", "wait or stop it"));
  ASSERT_TRUE(o.dropped);
  auto back = absorb(p.client.on_bytes(o.sent));
  ASSERT_TRUE(back.dropped);
  EXPECT_EQ(*back.dropped, "peer closed: unexpected: busy: job j1 is running (wait or stop it)");
}

TEST(SessionFrames, LargeFramesUpToTheLimitAfterAuth) {
  auto p = established_pair();
  std::string data(65536, 'x');
  auto o = absorb(p.server.on_bytes(p.client.seal(p.client.message(
      "output", {{"job_id", "j"}, {"round", 1}, {"local_rank", 0}, {"stream", "stdout"}, {"data", data}}))));
  ASSERT_EQ(o.delivered.size(), 1u);
  EXPECT_EQ(o.delivered[0].body["data"], data);
  // Over the limit: the sender refuses to build it; a receiver refuses it from the header.
  json big = p.client.message("join", {{"t0_us", 1},
                                       {"rx_us", 2},
                                       {"tx_us", 3},
                                       {"job_id", "j"},
                                       {"node", "n"},
                                       {"nproc", 1},
                                       {"facts", {{"blob", std::string(limits().max_frame_bytes, 'f')}}}});
  EXPECT_THROW(p.client.seal(big), std::invalid_argument);
  auto huge = p.client.seal_raw(std::string(limits().max_frame_bytes + 1, ' '));
  auto r = absorb(p.server.on_bytes(huge.substr(0, 8)));
  ASSERT_TRUE(r.dropped);
  EXPECT_NE(r.dropped->find("too_large"), std::string::npos);
}

TEST(SessionHandshake, OversizedFrameBeforeAuthIsRefused) {
  Session server = Session::server(server_config());
  auto o = absorb(server.on_bytes(std::string("\0\0\x10\x01", 4)));  // 4097 bytes declared
  ASSERT_TRUE(o.dropped);
  EXPECT_EQ(*o.dropped, "too_large: frame of 4097 bytes exceeds the limit of 4096 bytes");
  EXPECT_EQ(json::parse(body_of(o.sent))["code"], "too_large");
}

TEST(SessionHandshake, GarbageIsRefused) {
  Session server = Session::server(server_config());
  auto o = absorb(server.on_bytes("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
  ASSERT_TRUE(o.dropped);
  EXPECT_NE(o.dropped->find("another protocol"), std::string::npos);
  // After the drop, nothing more happens.
  EXPECT_TRUE(server.on_bytes("more").empty());
  EXPECT_TRUE(server.on_handshake_timeout().empty());
}

TEST(SessionHandshake, SessionMessagesBeforeAuthAreRefused) {
  Session server = Session::server(server_config());
  auto join = make_message("join", 1,
                           {{"t0_us", 1}, {"rx_us", 2}, {"tx_us", 3}, {"job_id", "j"}, {"node", "n1"}, {"nproc", 2}});
  auto o = absorb(server.on_bytes(encode_frame(dump(join))));
  ASSERT_TRUE(o.dropped);
  EXPECT_EQ(*o.dropped, "unexpected: 'join' before authentication finished (complete the hello/auth handshake first)");
}

TEST(SessionHandshake, OutOfOrderHandshakeMessages) {
  Session server = Session::server(server_config());
  auto o = absorb(server.on_bytes(encode_frame(dump(make_message("auth", 1, {{"proof", std::string(64, 'a')}})))));
  ASSERT_TRUE(o.dropped);
  EXPECT_EQ(*o.dropped, "unexpected: expected 'hello', got 'auth'");
  // A second hello where the proof is due.
  Pair p;
  auto hello = absorb(p.client.start()).sent;
  absorb(p.server.on_bytes(hello));
  auto o2 = absorb(p.server.on_bytes(hello));
  ASSERT_TRUE(o2.dropped);
  EXPECT_EQ(*o2.dropped, "unexpected: expected 'auth', got 'hello'");
  // A hello from a server (wrong side) to a client.
  Session client = Session::client(client_config());
  absorb(client.start());
  auto o3 = absorb(client.on_bytes(hello));
  ASSERT_TRUE(o3.dropped);
  EXPECT_NE(o3.dropped->find("wrong_sender"), std::string::npos);
}

TEST(SessionHandshake, InvalidHelloNamesTheField) {
  Session server = Session::server(server_config());
  auto hello = make_message(
      "hello", 1, {{"versions", {1}}, {"key_id", "default"}, {"nonce", "abcd"}, {"role", "agent"}, {"user", "u"}});
  auto o = absorb(server.on_bytes(encode_frame(dump(hello))));
  ASSERT_TRUE(o.dropped);
  EXPECT_NE(o.dropped->find("bad_value: 'hello.nonce' must be 32 bytes"), std::string::npos);
}

TEST(SessionHandshake, TimeoutsSayWhatTheyWaitedFor) {
  Session server = Session::server(server_config());
  auto o = absorb(server.on_handshake_timeout());
  EXPECT_EQ(*o.dropped, "handshake timed out waiting for the peer's hello");
  Pair p;
  auto hello = absorb(p.client.start()).sent;
  EXPECT_EQ(*absorb(p.client.on_handshake_timeout()).dropped, "handshake timed out waiting for the server's hello_ack");
  Pair q;
  absorb(q.server.on_bytes(absorb(q.client.start()).sent));
  EXPECT_EQ(*absorb(q.server.on_handshake_timeout()).dropped,
            "handshake timed out waiting for the client's proof (auth)");
  Pair r;
  absorb(r.client.on_bytes(first_frame(absorb(r.server.on_bytes(absorb(r.client.start()).sent)).sent)));
  EXPECT_EQ(*absorb(r.client.on_handshake_timeout()).dropped,
            "handshake timed out waiting for the server's proof (auth_ok)");
  auto e = established_pair();
  EXPECT_TRUE(e.client.on_handshake_timeout().empty());
}

TEST(SessionHandshake, ErrorFromThePeerCarriesItsHint) {
  Session client = Session::client(client_config());
  absorb(client.start());
  auto err = make_message("error", 1, {{"code", "busy"}, {"message", "one job at a time"}, {"hint", "ddpctl stop"}});
  auto o = absorb(client.on_bytes(encode_frame(dump(err))));
  EXPECT_EQ(*o.dropped, "peer refused: busy: one job at a time (ddpctl stop)");
  EXPECT_TRUE(o.sent.empty());
}

TEST(SessionApi, SealingIsForEstablishedSessionsAndValidMessages) {
  Session client = Session::client(client_config());
  EXPECT_THROW(client.seal(make_message("heartbeat", 1)), std::logic_error);
  auto p = established_pair();
  EXPECT_THROW(p.client.seal(p.client.message("assign")), std::invalid_argument);  // not ours to send
  EXPECT_THROW(p.client.seal(p.client.message("join")), std::invalid_argument);    // missing fields
  EXPECT_TRUE(Session::server(server_config()).start().empty());
}

TEST(SessionFuzz, RandomBytesNeverCrashAndNeverEstablish) {
  std::uint64_t x = 88172645463325252ULL;
  auto next = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  for (int trial = 0; trial < 3000; ++trial) {
    Session server = Session::server(server_config());
    std::string bytes;
    const auto n = next() % 64;
    if (trial % 3 == 0) bytes = std::string("\0\0\0", 3) + static_cast<char>(n);
    for (std::uint64_t i = 0; i < n; ++i) bytes.push_back(static_cast<char>(next()));
    auto o = absorb(server.on_bytes(bytes));
    EXPECT_FALSE(server.established());
    EXPECT_TRUE(o.delivered.empty());
  }
}

TEST(Session, SealWithSplicesAnEncodedObjectAsAMember) {
  auto p = established_pair();
  const json spec{{"command", {"/bin/true"}}, {"env", json::array()}, {"name", "j\"x"}};
  const json fields{{"t0_us", 7}, {"job_id", "j"}, {"user", "u"}, {"node", "n1"}};
  auto m = fields;
  m["spec"] = spec;
  // The receiver gets what seal() of the whole message would have given it.
  auto spliced = p.server.seal_with(p.server.message("job_offer", fields), "spec", dump(spec));
  auto whole = p.server.seal(p.server.message("job_offer", m));
  auto a = absorb(p.client.on_bytes(spliced));
  auto b = absorb(p.client.on_bytes(whole));
  ASSERT_FALSE(a.dropped) << *a.dropped;
  ASSERT_FALSE(b.dropped) << *b.dropped;
  ASSERT_EQ(a.delivered.size(), 1u);
  ASSERT_EQ(b.delivered.size(), 1u);
  EXPECT_EQ(a.delivered[0].body, b.delivered[0].body);
  EXPECT_EQ(a.delivered[0].body["spec"]["name"], "j\"x");
  // The rest of the message is still checked, and the text must be an object.
  EXPECT_THROW(p.server.seal_with(p.server.message("job_offer", {{"t0_us", 7}}), "spec", "{}"), std::invalid_argument);
  EXPECT_THROW(p.server.seal_with(p.server.message("job_offer", fields), "spec", "[1]"), std::invalid_argument);
  EXPECT_THROW(p.server.seal_with(p.server.message("job_offer", fields), "spec", ""), std::invalid_argument);
}

// What a peer writes (an 'error' frame's code, message and hint, a key id, a type, a field's
// name or value) ends up in the reason we log and hand to our owner, which may print it on a
// user's terminal. The JSON reader takes \u001b, \u0007, \r and \n: whoever sends them, before
// authentication anyone, must not get escape sequences or forged log lines into our output.
namespace {
bool shows_safe(std::string_view s) {
  return std::none_of(s.begin(), s.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u < 0x20 || u == 0x7f;
  });
}
const std::string kHostile = R"(\u001b]0;PWNED\u0007\u001b[2J\nddpctl error [coordinator] forged line\r)";
const std::string kHostileShown = "?]0;PWNED??[2J?ddpctl error [coordinator] forged line?";
std::string hello_json(const std::string& key_id, const std::string& role = "agent", const std::string& extra = "") {
  return R"({"type":"hello","v":7,"versions":[7],"key_id":")" + key_id + R"(","nonce":")" + std::string(64, 'a') +
         R"(","role":")" + role + R"(","user":"u")" + extra + "}";
}
}  // namespace

TEST(SessionPeerText, AnErrorFrameFromAStrangerIsLoggedClean) {
  const auto frame = encode_frame(R"({"type":"error","v":3,"code":"x\u001b[31m","message":")" + kHostile +
                                  R"(","hint":")" + kHostile + R"("})");
  // As a server's first frame (no key, no hello), and as a client's answer to its hello.
  Session server = Session::server(server_config());
  auto o = absorb(server.on_bytes(frame));
  ASSERT_TRUE(o.dropped);
  EXPECT_EQ(*o.dropped, "peer refused: x?[31m: " + kHostileShown + " (" + kHostileShown + ")");
  Session client = Session::client(client_config());
  absorb(client.start());
  auto c = absorb(client.on_bytes(frame));
  ASSERT_TRUE(c.dropped);
  EXPECT_TRUE(shows_safe(*c.dropped)) << *c.dropped;
  EXPECT_NE(c.dropped->find("forged line"), std::string::npos) << *c.dropped;
}

TEST(SessionPeerText, AnErrorFrameAfterAuthenticationIsLoggedClean) {
  auto p = established_pair();
  auto o = absorb(
      p.server.on_bytes(p.client.seal_raw(R"({"type":"error","v":7,"code":"busy","message":")" + kHostile + R"("})")));
  ASSERT_TRUE(o.dropped);
  EXPECT_EQ(*o.dropped, "peer closed: busy: " + kHostileShown);
}

TEST(SessionPeerText, AnUnknownKeyIdIsQuotedClean) {
  Session server = Session::server(server_config());
  auto o = absorb(server.on_bytes(encode_frame(hello_json(R"(\u001b[41mKEY\n)"))));
  ASSERT_TRUE(o.dropped);
  EXPECT_NE(o.dropped->find("auth: unknown key id '?[41mKEY?'"), std::string::npos) << *o.dropped;
  EXPECT_TRUE(shows_safe(*o.dropped)) << *o.dropped;
  // The error frame back quotes it the same way.
  const auto back = json::parse(body_of(o.sent));
  EXPECT_EQ(back["message"], "unknown key id '?[41mKEY?'");
}

// Schema errors quote the message's own type, field names and enum values: cleaned and short,
// before and after authentication.
TEST(SessionPeerText, SchemaErrorsQuoteTheMessageClean) {
  const std::string long_junk = R"(\u001b[2J\r\n)" + std::string(3000, 'A');
  struct Case {
    std::string json;
    std::string needle;
  };
  for (const auto& c : std::vector<Case>{
           {R"({"type":"\u001b[2J\nfake","v":3})", "unknown message type '?[2J?fake'"},
           {R"({"type":")" + long_junk + R"(","v":3})", "unknown message type '?[2J??AAAA"},
           {R"({"type":"\u001b[2J\nfake"})", "message '?[2J?fake' has no 'v'"},
           {hello_json("default", R"(\u001b[31mroot\n)"),
            "'hello.role' must be one of agent, ctl, coordinator, got '?[31mroot?'"},
           {hello_json("default", long_junk), "got '?[2J??AAAA"},
           {hello_json("default", "agent", R"(,"\u001b[31mx\r":1)"), "'hello' has unknown field '?[31mx?'"},
       }) {
    Session server = Session::server(server_config());
    auto o = absorb(server.on_bytes(encode_frame(c.json)));
    ASSERT_TRUE(o.dropped) << c.json;
    EXPECT_NE(o.dropped->find(c.needle), std::string::npos) << *o.dropped;
    EXPECT_TRUE(shows_safe(*o.dropped)) << *o.dropped;
    EXPECT_LT(o.dropped->size(), 512u) << *o.dropped;
    const auto back = json::parse(body_of(o.sent));
    EXPECT_TRUE(shows_safe(back["message"].get<std::string>())) << back.dump();
    // The same message, authenticated: the same words, as clean.
    auto p = established_pair();
    auto a = absorb(p.server.on_bytes(p.client.seal_raw(c.json)));
    ASSERT_TRUE(a.dropped) << c.json;
    EXPECT_TRUE(shows_safe(*a.dropped)) << *a.dropped;
    EXPECT_LT(a.dropped->size(), 512u) << *a.dropped;
  }
}

// Ordinary words, UTF-8 included, read as they were written.
TEST(SessionPeerText, AnOrdinaryErrorReadsAsWritten) {
  Session client = Session::client(client_config());
  absorb(client.start());
  auto err = make_message("error", 1,
                          {{"code", "version"},
                           {"message", "no common protocol version: 'nœud-7' speaks 3, 4 — «upgrade» ✓"},
                           {"hint", "upgrade ddpctl on 'nœud-7'"}});
  auto o = absorb(client.on_bytes(encode_frame(dump(err))));
  EXPECT_EQ(*o.dropped,
            "peer refused: version: no common protocol version: 'nœud-7' speaks 3, 4 — «upgrade» ✓ (upgrade ddpctl on "
            "'nœud-7')");
}

// The peer's name and software are only ever shown: the session hands them on clean. Its user
// and key id are compared (to key_users, to a job's user), so they stay as sent.
TEST(SessionPeerText, ThePeersNameAndSoftwareAreHandedOnClean) {
  Pair p;
  auto cfg = client_config();
  cfg.name = "n1\x1b[2J\n";
  cfg.software = "ddpctl\r 9";
  cfg.user =
      "al\x1b"
      "ice";
  p.client = Session::client(cfg);
  auto sc = server_config();
  sc.name = "coord\x07";
  p.server = Session::server(sc);
  p.connect();
  ASSERT_TRUE(p.s.established);
  EXPECT_EQ(p.s.established->name, "n1?[2J?");
  EXPECT_EQ(p.s.established->software, "ddpctl? 9");
  EXPECT_EQ(p.s.established->user,
            "al\x1b"
            "ice");
  ASSERT_TRUE(p.c.established);
  EXPECT_EQ(p.c.established->name, "coord?");
}

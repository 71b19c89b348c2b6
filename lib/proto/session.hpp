// One connection's protocol state: versioned hello, mutual authentication, then authenticated
// frames. A pure state machine: bytes and timeouts in, effects out; no sockets, no clock, no
// randomness (the nonce is given). The edge writes every Send, hands Deliver to the
// application, and closes the connection on Drop (logging its reason with the peer's name).
//
//   client                                   server
//   hello{versions,key_id,nonce_c,role,user} ─▶  picks version, looks up key_id, checks role
//                       ◀─ hello_ack{version,nonce_s,role} ‖ auth_ok{proof_s}   (one write)
//   checks proof_s (constant time)
//   auth{proof_c} ‖ first session frames ─▶  checks proof_c, then reads the frames behind it
//   ═══ every later frame: JSON ‖ HMAC(session_key, dir ‖ seq ‖ JSON) ═══
//
// transcript = SHA-256(len ‖ hello body ‖ len ‖ hello_ack body)   (the exact bytes on the wire)
// proof_X    = HMAC(secret, "ddpctl X proof" 0 ‖ nonce_c ‖ nonce_s ‖ len‖role ‖ len‖key_id ‖ transcript)
// session key= HMAC(secret, "ddpctl session" 0 ‖ nonce_c ‖ nonce_s ‖ transcript)
// dir = 'C' (client to server) or 'S'; seq = 8-byte big-endian count of frames sent that way,
// from 0, never on the wire: a replayed, reordered, dropped or injected frame fails its MAC.
//
// The secret never crosses the wire. The server proves first (as TLS 1.3's server Finished
// does), so the client knows whom it talks to before it proves anything or sends its first
// session frame, and both of those leave in one write: a connection costs one round trip and
// two writes less than with the client proving first (protocol version 2), which is most of a
// rendezvous of thousands of nodes. What a peer without the secret gets is the server's proof
// over its fresh nonce: labels differ per direction, so it is no use as a client proof, and a
// fresh server nonce per connection makes a recorded handshake useless. The server reads no
// session frame before the client's proof checks out. Any failure: Drop, and the connection's
// state is gone; nothing else is touched.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "proto/crypto.hpp"
#include "proto/frame.hpp"
#include "proto/keyring.hpp"
#include "proto/schema.hpp"

namespace ddp::proto {

enum class Role { agent, ctl, coordinator };
std::string_view to_string(Role r);
std::optional<Role> role_from(std::string_view s);

struct PeerInfo {
  Role role = Role::agent;
  std::string user;  // client's user (as the server sees it); empty on the client side
  std::string key_id;
  std::string name;  // from hello / hello_ack, for logs
  std::string software;
  std::uint32_t version = 0;
  // Client side, version 6: the key id a standing coordinator dials agents with (hello_ack's
  // delegate_key), for the delegation ddpctl signs (proto/delegation.hpp); empty otherwise.
  std::string delegate_key;
};

// Effects, in the order the edge must carry them out.
struct Send {
  std::string bytes;  // a complete frame
};
struct Established {
  PeerInfo peer;
};
struct Deliver {
  Message message;
};
struct Drop {
  std::string reason;
};
using Effect = std::variant<Send, Established, Deliver, Drop>;
using Effects = std::vector<Effect>;

struct ClientConfig {
  Role role = Role::agent;
  std::string user;
  std::string name;
  std::string software;
  Key key;
  Nonce nonce{};
  std::vector<std::uint32_t> versions;  // empty: every version this build speaks
  std::optional<Role> expect_server;    // e.g. ctl dialling a coordinator port
};

struct ServerConfig {
  Role role = Role::agent;
  std::string name;
  std::string software;
  Keyring keys;
  Nonce nonce{};
  std::vector<std::uint32_t> versions;  // empty: every version this build speaks
  std::vector<Role> accept_roles{Role::agent, Role::ctl, Role::coordinator};
  // Sent in hello_ack when version 6 or later is chosen (a standing coordinator's dial key).
  std::string delegate_key;
};

class Session {
 public:
  enum class State { idle, await_hello, await_hello_ack, await_auth, await_auth_ok, established, dropped };

  static Session client(ClientConfig config);
  static Session server(ServerConfig config);

  // Client: sends the hello. Server: nothing (it waits for one).
  Effects start();
  // Bytes read from the connection, in order; any size, any split.
  Effects on_bytes(std::string_view bytes);
  // The edge's handshake deadline fired; says what the handshake was waiting for.
  Effects on_handshake_timeout();

  // An application message as a ready-to-write authenticated frame. Only when established;
  // the message is validated as sent by us first. Both failures are bugs in the caller, so
  // they throw (std::logic_error / std::invalid_argument).
  std::string seal(const nlohmann::json& message);
  // seal() of `message` with one more member, `key` (a plain name, no escaping), whose value is
  // `object_json`: the text of a JSON object the caller encoded and checked once, such as the
  // job spec every offer carries, so it is neither copied nor encoded again per connection.
  std::string seal_with(nlohmann::json message, std::string_view key, std::string_view object_json);
  // seal() of a heartbeat (messages.json) carrying `now_us` and, when given, the echo of the
  // peer's last beat (t0_us: its now_us, rx_us: ours when it arrived), encoded without a DOM:
  // the one message every node gets every interval, the coordinator's answer to each agent's
  // beat. Byte for byte what seal(message("heartbeat", {...})) gives (session_test).
  struct Echo {
    std::int64_t t0_us = 0, rx_us = 0;
  };
  std::string seal_heartbeat(std::int64_t now_us, std::optional<Echo> echo = std::nullopt);
  // Seals bytes as they are, unvalidated: for tests and fuzzers that need a correctly
  // authenticated but malformed frame. Never for production messages.
  std::string seal_raw(std::string_view json);
  // make_message() with the negotiated version.
  nlohmann::json message(std::string_view type, nlohmann::json fields = nlohmann::json::object()) const;
  // Refuse the peer's request politely and drop it (sealed when established).
  Effects refuse(ErrorCode code, std::string message, std::string hint = "");

  State state() const { return state_; }
  bool established() const { return state_ == State::established; }
  const PeerInfo& peer() const { return peer_; }
  std::uint32_t version() const { return version_; }
  bool is_client() const { return is_client_; }

 private:
  Session() = default;
  Effects on_frame(std::string body);
  std::string finish_frame(std::string frame);
  Effects on_handshake_frame(std::string_view body);
  Effects on_session_frame(std::string_view body);
  Effects handle_hello(const Message& m, std::string_view body);
  Effects handle_hello_ack(const Message& m, std::string_view body);
  Effects handle_auth(const Message& m);
  Effects handle_auth_ok(const Message& m);
  Effects fail(ErrorCode code, std::string message, std::string hint = "");  // error to the peer + Drop
  Effects drop(std::string reason);                                          // Drop only
  std::string plain(const nlohmann::json& m);                                // a handshake frame
  std::string plain(const nlohmann::json& m, std::string_view encoded);      // ... of m as encoded
  Digest proof(std::string_view label) const;
  void establish();
  std::string my_side() const { return is_client_ ? "client" : "server"; }
  std::string peer_side() const { return is_client_ ? "server" : "client"; }

  bool is_client_ = true;
  State state_ = State::idle;
  Role role_ = Role::agent;
  std::string user_, name_, software_, delegate_key_;
  Keyring keys_;
  Key key_;
  std::string nonce_c_, nonce_s_;
  std::vector<std::uint32_t> versions_;
  std::vector<Role> accept_roles_;
  std::optional<Role> expect_server_;
  std::string hello_body_, ack_body_;
  Digest transcript_{};
  std::string session_key_;
  HmacKey frame_key_;  // session_key_'s keyed HMAC state, for every frame
  std::uint64_t seq_out_ = 0, seq_in_ = 0;
  std::uint32_t version_ = 0;
  PeerInfo peer_;
  FrameDecoder decoder_{0};
};

}  // namespace ddp::proto

// The handshake and authenticated-frame state machine; see session.hpp for the construction.
#include "proto/session.hpp"

#include <algorithm>
#include <charconv>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "common/strings.hpp"
#include "common/text.hpp"

namespace ddp::proto {
namespace {

constexpr char kDirClientToServer = 'C';
constexpr char kDirServerToClient = 'S';

std::vector<std::uint32_t> all_versions() {
  std::vector<std::uint32_t> v;
  for (auto i = limits().min_version; i <= limits().max_version; ++i) v.push_back(i);
  return v;
}

std::string versions_text(const std::vector<std::uint32_t>& v) {
  std::vector<std::string> parts;
  for (auto x : v) parts.push_back(std::to_string(x));
  return parts.empty() ? "none" : join(parts, ", ");
}

// The MAC input of a frame: direction byte, 8-byte big-endian sequence number, JSON bytes.
Digest frame_mac(const HmacKey& key, char dir, std::uint64_t seq, std::string_view json) {
  std::string head(1, dir);
  put_u64(head, seq);
  return key.mac({head, json});
}

// Effects from values, moved in. `return {Deliver{...}};` would build the vector from an
// initializer_list, whose elements are const: every message's whole DOM and every frame copied
// once more.
template <class... E>
Effects effects(E&&... e) {
  Effects out;
  out.reserve(sizeof...(E));
  (out.emplace_back(std::forward<E>(e)), ...);
  return out;
}
static_assert(std::is_nothrow_move_constructible_v<Effect>, "a growing Effects vector must move, not copy");

// An 'error' frame's code, message and hint as the reason we log and hand to our owner, which
// may print it on a user's terminal. The peer wrote them (before authentication, anyone), and
// the JSON reader takes \u001b, \r and \n: without cleaning, a stranger's escape sequences and
// forged log lines would reach agents', coordinators' and ddpctl's output. Bounded as the schema
// bounds them.
std::string peer_error(const nlohmann::json& b) {
  auto text = clean_text(b["code"].get_ref<const std::string&>(), 64) + ": " +
              clean_text(b["message"].get_ref<const std::string&>(), 4096);
  if (auto h = b.find("hint"); h != b.end()) text += " (" + clean_text(h->get_ref<const std::string&>(), 4096) + ")";
  return text;
}

}  // namespace

std::string_view to_string(Role r) {
  switch (r) {
    case Role::agent:
      return "agent";
    case Role::ctl:
      return "ctl";
    case Role::coordinator:
      return "coordinator";
  }
  return "?";
}

std::optional<Role> role_from(std::string_view s) {
  if (s == "agent") return Role::agent;
  if (s == "ctl") return Role::ctl;
  if (s == "coordinator") return Role::coordinator;
  return std::nullopt;
}

Session Session::client(ClientConfig c) {
  Session s;
  s.is_client_ = true;
  s.role_ = c.role;
  s.user_ = std::move(c.user);
  s.name_ = std::move(c.name);
  s.software_ = std::move(c.software);
  s.key_ = std::move(c.key);
  s.nonce_c_.assign(reinterpret_cast<const char*>(c.nonce.data()), c.nonce.size());
  s.versions_ = c.versions.empty() ? all_versions() : std::move(c.versions);
  s.expect_server_ = c.expect_server;
  s.decoder_.set_max_body(limits().max_handshake_frame_bytes);
  return s;
}

Session Session::server(ServerConfig c) {
  Session s;
  s.is_client_ = false;
  s.role_ = c.role;
  s.name_ = std::move(c.name);
  s.software_ = std::move(c.software);
  s.keys_ = std::move(c.keys);
  s.nonce_s_.assign(reinterpret_cast<const char*>(c.nonce.data()), c.nonce.size());
  s.versions_ = c.versions.empty() ? all_versions() : std::move(c.versions);
  s.accept_roles_ = std::move(c.accept_roles);
  s.delegate_key_ = std::move(c.delegate_key);
  s.decoder_.set_max_body(limits().max_handshake_frame_bytes);
  s.state_ = State::await_hello;
  return s;
}

std::string Session::plain(const nlohmann::json& m) {
  return plain(m, dump(m));
}

std::string Session::plain(const nlohmann::json& m, std::string_view encoded) {
  if (auto e = validate(m, Sender{my_side(), std::string(to_string(role_))})) {
    throw std::invalid_argument("outgoing handshake message is invalid: " + e->message);
  }
  return encode_frame(encoded);
}

Effects Session::start() {
  if (!is_client_ || state_ != State::idle) return {};
  // Member by member (nlohmann's initializer list builds each pair as an array first).
  nlohmann::json fields = nlohmann::json::object();
  fields["versions"] = versions_;
  fields["key_id"] = key_.id;
  fields["nonce"] = to_hex(nonce_c_);
  fields["role"] = std::string(to_string(role_));
  fields["user"] = user_;
  if (!name_.empty()) fields["name"] = name_;
  if (!software_.empty()) fields["software"] = software_;
  auto hello = make_message("hello", versions_.empty() ? 0 : *std::max_element(versions_.begin(), versions_.end()),
                            std::move(fields));
  hello_body_ = dump(hello);
  state_ = State::await_hello_ack;
  return effects(Send{plain(hello, hello_body_)});
}

Effects Session::on_bytes(std::string_view bytes) {
  Effects out;
  if (state_ == State::dropped) return out;
  decoder_.feed(bytes);
  while (state_ != State::dropped) {
    auto body = decoder_.next();
    if (!body) break;
    auto fx = on_frame(std::move(*body));
    if (out.empty()) {
      out = std::move(fx);  // one frame per read, mostly: its vector as it is
    } else {
      for (auto& e : fx) out.push_back(std::move(e));
    }
  }
  if (state_ != State::dropped && decoder_.error()) {
    const auto& e = *decoder_.error();
    for (auto& x : fail(e.code, e.message, e.hint)) out.push_back(std::move(x));
  }
  return out;
}

Effects Session::on_handshake_timeout() {
  switch (state_) {
    case State::idle:
    case State::await_hello:
      return drop("handshake timed out waiting for the peer's hello");
    case State::await_hello_ack:
      return drop("handshake timed out waiting for the server's hello_ack");
    case State::await_auth:
      return drop("handshake timed out waiting for the client's proof (auth)");
    case State::await_auth_ok:
      return drop("handshake timed out waiting for the server's proof (auth_ok)");
    case State::established:
    case State::dropped:
      return {};
  }
  return {};
}

Effects Session::drop(std::string reason) {
  state_ = State::dropped;
  session_key_.assign(session_key_.size(), '\0');
  frame_key_ = HmacKey();
  return effects(Drop{std::move(reason)});
}

Effects Session::fail(ErrorCode code, std::string message, std::string hint) {
  Effects out;
  nlohmann::json fields{{"code", std::string(to_string(code))}, {"message", message.substr(0, 4096)}};
  if (!hint.empty()) fields["hint"] = hint.substr(0, 4096);
  if (state_ == State::established) {
    out.push_back(Send{seal(make_message("error", version_, std::move(fields)))});
  } else if (state_ != State::dropped) {
    out.push_back(Send{plain(make_message("error", version_ ? version_ : limits().min_version, std::move(fields)))});
  }
  auto reason = std::string(to_string(code)) + ": " + message;
  if (!hint.empty()) reason += " (" + hint + ")";
  for (auto& e : drop(std::move(reason))) out.push_back(std::move(e));
  return out;
}

Effects Session::refuse(ErrorCode code, std::string message, std::string hint) {
  if (state_ == State::dropped) return {};
  return fail(code, std::move(message), std::move(hint));
}

Effects Session::on_frame(std::string body) {
  return state_ == State::established ? on_session_frame(body) : on_handshake_frame(body);
}

Effects Session::on_handshake_frame(std::string_view body) {
  // Before authentication the peer's role is not established, only its side.
  auto parsed = parse_message(body, Sender{peer_side(), ""});
  const auto& m = parsed.message;
  if (phase_of(m.type) == Phase::session) {
    return fail(ErrorCode::unexpected, "'" + m.type + "' before authentication finished",
                "complete the hello/auth handshake first");
  }
  if (!parsed.ok()) return fail(parsed.error->code, parsed.error->message, parsed.error->hint);
  if (m.type == "error") return drop("peer refused: " + peer_error(m.body));
  switch (state_) {
    case State::await_hello:
      if (m.type == "hello") return handle_hello(m, body);
      break;
    case State::await_hello_ack:
      if (m.type == "hello_ack") return handle_hello_ack(m, body);
      break;
    case State::await_auth:
      if (m.type == "auth") return handle_auth(m);
      break;
    case State::await_auth_ok:
      if (m.type == "auth_ok") return handle_auth_ok(m);
      break;
    default:
      break;
  }
  static const char* kExpected[] = {"nothing", "hello", "hello_ack", "auth", "auth_ok", "", ""};
  return fail(ErrorCode::unexpected,
              "expected '" + std::string(kExpected[static_cast<int>(state_)]) + "', got '" + m.type + "'");
}

Effects Session::handle_hello(const Message& m, std::string_view body) {
  const auto& b = m.body;
  peer_.role = *role_from(b["role"].get<std::string>());  // the schema's enum guarantees it
  peer_.user = b["user"].get<std::string>();
  peer_.key_id = b["key_id"].get<std::string>();
  // Only ever shown (logs, labels): made safe to show here, once. The user and key id are
  // compared, so they stay as sent, and whoever shows them cleans them.
  peer_.name = clean_text(b.value("name", ""), 256);
  peer_.software = clean_text(b.value("software", ""), 64);
  const auto offered = b["versions"].get<std::vector<std::uint32_t>>();
  std::uint32_t chosen = 0;
  for (auto v : offered) {
    if (std::find(versions_.begin(), versions_.end(), v) != versions_.end()) chosen = std::max(chosen, v);
  }
  if (chosen == 0) {
    const auto their_max = offered.empty() ? 0 : *std::max_element(offered.begin(), offered.end());
    const auto our_max = *std::max_element(versions_.begin(), versions_.end());
    const std::string who = name_.empty() ? "this " + std::string(to_string(role_)) : "'" + name_ + "'";
    return fail(ErrorCode::version,
                "no common protocol version: the client speaks " + versions_text(offered) + ", " + who + " speaks " +
                    versions_text(versions_),
                their_max > our_max ? "upgrade ddpctl on " + who + " (it is older than the client)"
                                    : "upgrade the client's ddpctl (it is older than " + who + ")");
  }
  if (std::find(accept_roles_.begin(), accept_roles_.end(), peer_.role) == accept_roles_.end()) {
    return fail(ErrorCode::auth, "role '" + std::string(to_string(peer_.role)) + "' is not accepted by this " +
                                     std::string(to_string(role_)));
  }
  const Key* key = keys_.find(peer_.key_id);
  if (!key) {
    // Anyone's words, before any proof: as a reason they go into our log and back to the peer.
    return fail(ErrorCode::auth, "unknown key id '" + clean_text(peer_.key_id, 64) + "'",
                "both sides need the same key in their token files (--token-file)");
  }
  key_ = *key;
  auto nonce = from_hex(b["nonce"].get<std::string>());
  nonce_c_ = *nonce;  // the schema checked 32 bytes of hex
  version_ = chosen;
  peer_.version = chosen;
  hello_body_ = std::string(body);
  nlohmann::json fields = nlohmann::json::object();
  fields["version"] = chosen;
  fields["nonce"] = to_hex(nonce_s_);
  fields["role"] = std::string(to_string(role_));
  if (!name_.empty()) fields["name"] = name_;
  if (!software_.empty()) fields["software"] = software_;
  if (chosen >= 6 && !delegate_key_.empty()) fields["delegate_key"] = delegate_key_;
  auto ack = make_message("hello_ack", chosen, std::move(fields));
  ack_body_ = dump(ack);
  std::string t;
  put_lp(t, hello_body_);
  put_lp(t, ack_body_);
  transcript_ = sha256(t);
  state_ = State::await_auth;
  // The server proves first, in the same write as its hello_ack: the client checks it before
  // it sends its own proof and its first session frame together (session.hpp).
  auto mine = proof("ddpctl server proof");
  return effects(Send{plain(ack, ack_body_)},
                 Send{plain(make_message("auth_ok", version_, {{"proof", to_hex(as_bytes(mine))}}))});
}

Effects Session::handle_hello_ack(const Message& m, std::string_view body) {
  const auto& b = m.body;
  const auto chosen = b["version"].get<std::uint64_t>();
  if (std::find(versions_.begin(), versions_.end(), chosen) == versions_.end()) {
    return fail(ErrorCode::version, "server chose protocol version " + std::to_string(chosen) +
                                        ", which this client did not offer (" + versions_text(versions_) + ")");
  }
  if (m.version != chosen) {
    return fail(ErrorCode::version, "hello_ack is framed as version " + std::to_string(m.version) +
                                        " but chooses version " + std::to_string(chosen));
  }
  peer_.role = *role_from(b["role"].get<std::string>());
  peer_.name = clean_text(b.value("name", ""), 256);  // only ever shown, as the server's hello's
  peer_.software = clean_text(b.value("software", ""), 64);
  peer_.delegate_key = b.value("delegate_key", "");
  peer_.key_id = key_.id;
  if (expect_server_ && *expect_server_ != peer_.role) {
    return fail(ErrorCode::unexpected,
                "expected to reach a " + std::string(to_string(*expect_server_)) + ", but this port is served by a " +
                    std::string(to_string(peer_.role)),
                "check the port (agents listen on 29410, a standing coordinator on 29411)");
  }
  version_ = static_cast<std::uint32_t>(chosen);
  peer_.version = version_;
  nonce_s_ = *from_hex(b["nonce"].get<std::string>());
  ack_body_ = std::string(body);
  std::string t;
  put_lp(t, hello_body_);
  put_lp(t, ack_body_);
  transcript_ = sha256(t);
  state_ = State::await_auth_ok;
  return {};
}

Digest Session::proof(std::string_view label) const {
  std::string in(label);
  in.push_back('\0');
  in += nonce_c_;
  in += nonce_s_;
  put_lp(in, to_string(is_client_ ? role_ : peer_.role));
  put_lp(in, key_.id);
  in.append(reinterpret_cast<const char*>(transcript_.data()), transcript_.size());
  return hmac_sha256(key_.secret, in);
}

void Session::establish() {
  std::string in("ddpctl session");
  in.push_back('\0');
  in += nonce_c_;
  in += nonce_s_;
  in.append(reinterpret_cast<const char*>(transcript_.data()), transcript_.size());
  auto k = hmac_sha256(key_.secret, in);
  session_key_.assign(reinterpret_cast<const char*>(k.data()), k.size());
  frame_key_ = HmacKey(session_key_);
  state_ = State::established;
  decoder_.set_max_body(limits().max_frame_bytes + kDigestBytes);
}

Effects Session::handle_auth(const Message& m) {
  if (m.version != version_) {
    return fail(ErrorCode::version,
                "auth is framed as version " + std::to_string(m.version) + ", negotiated " + std::to_string(version_));
  }
  auto expected = proof("ddpctl client proof");
  auto got = from_hex(m.body["proof"].get<std::string>());
  if (!got || !equal_ct(*got, as_bytes(expected))) {
    return fail(
        ErrorCode::auth, "authentication failed for key id '" + key_.id + "': the proof does not match",
        "the client's secret for this key differs from the server's token file (or the handshake was replayed)");
  }
  establish();
  return effects(Established{peer_});
}

Effects Session::handle_auth_ok(const Message& m) {
  if (m.version != version_) {
    return fail(ErrorCode::version, "auth_ok is framed as version " + std::to_string(m.version) + ", negotiated " +
                                        std::to_string(version_));
  }
  auto expected = proof("ddpctl server proof");
  auto got = from_hex(m.body["proof"].get<std::string>());
  if (!got || !equal_ct(*got, as_bytes(expected))) {
    return fail(ErrorCode::auth, "the server failed to prove it holds key '" + key_.id + "'",
                "its token file has a different secret for this key, or it is not the server you meant to reach");
  }
  // Our proof, then established: what the application sends next leaves in the same write.
  auto mine = proof("ddpctl client proof");
  Send auth{plain(make_message("auth", version_, {{"proof", to_hex(as_bytes(mine))}}))};
  establish();
  return effects(std::move(auth), Established{peer_});
}

Effects Session::on_session_frame(std::string_view body) {
  if (body.size() < kDigestBytes + 2) {
    return drop("bad_frame: authenticated frame #" + std::to_string(seq_in_) + " is too short to carry its MAC");
  }
  const auto json = body.substr(0, body.size() - kDigestBytes);
  const auto tag = body.substr(body.size() - kDigestBytes);
  const char dir = is_client_ ? kDirServerToClient : kDirClientToServer;
  auto expected = frame_mac(frame_key_, dir, seq_in_, json);
  if (!equal_ct(tag, as_bytes(expected))) {
    // No reply: whoever sent this cannot be told apart from an attacker on the link.
    return drop("bad_mac: frame #" + std::to_string(seq_in_) +
                " failed authentication (replayed, reordered, injected or corrupted)");
  }
  ++seq_in_;
  auto parsed = parse_message(json, Sender{peer_side(), std::string(to_string(peer_.role))});
  if (!parsed.ok()) return fail(parsed.error->code, parsed.error->message, parsed.error->hint);
  auto& m = parsed.message;
  if (m.version != version_) {
    return fail(ErrorCode::version, "'" + m.type + "' is framed as version " + std::to_string(m.version) +
                                        ", negotiated " + std::to_string(version_));
  }
  if (m.type == "error") return drop("peer closed: " + peer_error(m.body));
  if (phase_of(m.type) == Phase::handshake) {
    return fail(ErrorCode::unexpected, "'" + m.type + "' after the handshake finished");
  }
  return effects(Deliver{std::move(m)});
}

nlohmann::json Session::message(std::string_view type, nlohmann::json fields) const {
  return make_message(type, version_, std::move(fields));
}

std::string Session::seal(const nlohmann::json& m) {
  if (state_ != State::established) throw std::logic_error("seal() before the session is established");
  if (auto e = validate(m, Sender{my_side(), std::string(to_string(role_))})) {
    throw std::invalid_argument("outgoing message is invalid: " + e->message);
  }
  auto json = dump(m);
  if (json.size() > limits().max_frame_bytes) {
    throw std::invalid_argument("outgoing '" + m["type"].get<std::string>() + "' is " + std::to_string(json.size()) +
                                " bytes, over the frame limit; the sender must chunk it");
  }
  return seal_raw(json);
}

std::string Session::seal_with(nlohmann::json m, std::string_view key, std::string_view object_json) {
  if (state_ != State::established) throw std::logic_error("seal() before the session is established");
  if (object_json.size() < 2 || object_json.front() != '{' || object_json.back() != '}') {
    throw std::invalid_argument("seal_with: '" + std::string(key) + "' must be the text of a JSON object");
  }
  const std::string name(key);
  m[name] = nlohmann::json::object();  // what the schema sees there: an object
  if (auto e = validate(m, Sender{my_side(), std::string(to_string(role_))})) {
    throw std::invalid_argument("outgoing message is invalid: " + e->message);
  }
  m.erase(name);
  auto json = dump(m);  // an object with at least type and v: "{...}"
  json.pop_back();
  json += ",\"" + name + "\":";
  json += object_json;
  json += '}';
  if (json.size() > limits().max_frame_bytes) {
    throw std::invalid_argument("outgoing '" + m["type"].get<std::string>() + "' is " + std::to_string(json.size()) +
                                " bytes, over the frame limit; the sender must chunk it");
  }
  return seal_raw(json);
}

std::string Session::seal_heartbeat(std::int64_t now_us, std::optional<Echo> echo) {
  if (state_ != State::established) throw std::logic_error("seal() before the session is established");
  // Written straight into the frame, after room for its length: the frame is the one allocation.
  // dump()'s order: an object's keys sorted, so now_us, rx_us, t0_us, type, v.
  std::string frame;
  frame.reserve(kFrameHeaderBytes + 128 + kDigestBytes);  // the longest JSON is 123 bytes
  frame.resize(kFrameHeaderBytes);
  auto number = [&](auto v) {
    char digits[24];
    frame.append(digits, std::to_chars(digits, digits + sizeof digits, v).ptr);
  };
  frame += "{\"now_us\":";
  number(now_us);
  if (echo) {
    frame += ",\"rx_us\":";
    number(echo->rx_us);
    frame += ",\"t0_us\":";
    number(echo->t0_us);
  }
  frame += ",\"type\":\"heartbeat\",\"v\":";
  number(version_);
  frame += '}';
  return finish_frame(std::move(frame));
}

std::string Session::seal_raw(std::string_view json) {
  if (state_ != State::established) throw std::logic_error("seal() before the session is established");
  std::string frame;
  frame.reserve(kFrameHeaderBytes + json.size() + kDigestBytes);
  frame.resize(kFrameHeaderBytes);
  frame.append(json);
  return finish_frame(std::move(frame));
}

// The frame in place: `frame` is room for the length, then the JSON; the length is written and
// the tag appended (what encode_frame(json + tag) gives, without copies).
std::string Session::finish_frame(std::string frame) {
  const char dir = is_client_ ? kDirClientToServer : kDirServerToClient;
  const auto json = std::string_view(frame).substr(kFrameHeaderBytes);
  const auto tag = frame_mac(frame_key_, dir, seq_out_++, json);
  std::string length;
  put_u32(length, static_cast<std::uint32_t>(json.size() + kDigestBytes));
  frame.replace(0, kFrameHeaderBytes, length);
  frame.append(as_bytes(tag));
  return frame;
}

}  // namespace ddp::proto

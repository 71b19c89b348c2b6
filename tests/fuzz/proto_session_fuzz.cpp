// libFuzzer target for the multi-node protocol's decoder: frames, the handshake, the schema.
//
// Input: byte 0 picks a mode and how the rest is cut into reads (1..16 bytes, or whole).
//  - mode even: the rest is what an unauthenticated peer sends to a fresh server (an agent's
//    listening port): frame headers, hello/auth bodies, garbage.
//  - mode odd: a client and a server complete the handshake in memory first; the rest is then
//    split at '\n' into message bodies that the client seals as they are (seal_raw: valid MACs
//    around arbitrary JSON), so the schema's checks of every message type are reached.
// Properties: nothing crashes or leaks (sanitizers); nothing is delivered before the session is
// established or after a Drop; every delivered message names a type the schema knows and
// passes the schema's validation again (a heartbeat: comes as its fields, with no DOM); every
// body that read_plain_heartbeat reads, the general reader (parse_json, validate) accepts with
// the same values.
#include "proto/session.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/json_parse.hpp"
#include "proto/schema.hpp"

using namespace ddp::proto;

namespace {

const std::string kSecret = "5c0ffee5c0ffee5c0ffee5c0ffee5c0ffee5c0ffee5c0ffee5c0ffee";

Nonce nonce(std::uint8_t seed) {
  Nonce n{};
  for (std::size_t i = 0; i < n.size(); ++i) n[i] = static_cast<std::uint8_t>(seed * 17 + i);
  return n;
}

Session server() {
  ServerConfig s;
  s.role = Role::agent;
  s.name = "agent";
  s.keys = Keyring({Key{"default", kSecret}});
  s.nonce = nonce(2);
  s.accept_roles = {Role::coordinator};
  return Session::server(s);
}

// Applies the effects of one call; returns false once the session dropped. Checks every
// delivery: only once established (before the call, or by an Established earlier in its
// effects) and never after a Drop. A read may deliver messages and then drop on a later one in
// the same bytes: the session is no longer established when the effects are looked at.
bool check(const Effects& effects, bool established_before, std::string* to_peer) {
  bool alive = true, up = established_before;
  for (const auto& e : effects) {
    if (std::holds_alternative<Drop>(e)) alive = false;
    if (std::holds_alternative<Established>(e)) up = true;
    if (auto* send = std::get_if<Send>(&e); send && to_peer) *to_peer += send->bytes;
    if (auto* d = std::get_if<Deliver>(&e)) {
      if (!alive || !up) std::abort();
      const auto types = message_types();
      if (std::find(types.begin(), types.end(), d->message.type) == types.end()) std::abort();
      if (d->message.type == "heartbeat") {
        if (!d->message.body.is_null()) std::abort();
      } else if (validate(d->message.body, Sender{"client", "coordinator"})) {
        std::abort();
      }
    }
  }
  return alive;
}

// What the plain heartbeat reader reads, the general reader must accept, with the same values.
void same_as_general(std::string_view body) {
  const auto plain = read_plain_heartbeat(body);
  if (!plain) return;
  auto read = ddp::parse_json(body, limits().max_json_depth);
  if (!read.ok() || read.repeated_key || validate(read.value, Sender{"client", "coordinator"})) std::abort();
  const auto& j = read.value;
  auto field = [&](const char* key) {
    return j.contains(key) ? std::optional(j[key].get<std::int64_t>()) : std::nullopt;
  };
  if (j["type"] != "heartbeat" || j["v"].get<std::uint32_t>() != plain->version) std::abort();
  if (!(plain->beat == Beat{field("now_us"), field("t0_us"), field("rx_us")})) std::abort();
}

void feed(Session& s, std::string_view bytes, std::size_t cut) {
  while (!bytes.empty()) {
    const auto n = cut ? std::min(cut, bytes.size()) : bytes.size();
    const bool before = s.established();
    if (!check(s.on_bytes(bytes.substr(0, n)), before, nullptr)) {
      // Dropped: the edge closes the connection; nothing more may come of this session.
      if (!s.on_bytes("x").empty() && s.established()) std::abort();
      return;
    }
    bytes.remove_prefix(n);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::size_t cut = (data[0] >> 1) % 17;
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  Session srv = server();
  if ((data[0] & 1) == 0) {
    srv.start();
    feed(srv, rest, cut);
    return 0;
  }
  ClientConfig c;
  c.role = Role::coordinator;
  c.user = "fuzz";
  c.key = Key{"default", kSecret};
  c.nonce = nonce(1);
  c.expect_server = Role::agent;
  Session cli = Session::client(c);
  srv.start();
  std::string c2s, s2c;
  check(cli.start(), false, &c2s);
  for (int i = 0; i < 4 && !(cli.established() && srv.established()); ++i) {
    std::string a;
    a.swap(c2s);
    const bool srv_before = srv.established();
    check(srv.on_bytes(a), srv_before, &s2c);
    std::string b;
    b.swap(s2c);
    const bool cli_before = cli.established();
    check(cli.on_bytes(b), cli_before, &c2s);
  }
  if (!cli.established() || !srv.established()) std::abort();  // the fixed handshake must work
  std::string wire;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= rest.size(); ++i) {
    if (i == rest.size() || rest[i] == '\n') {
      if (i > start) {
        same_as_general(rest.substr(start, i - start));
        wire += cli.seal_raw(rest.substr(start, i - start));
      }
      start = i + 1;
    }
  }
  feed(srv, wire, cut);
  return 0;
}

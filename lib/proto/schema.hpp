// The message schema (proto/messages.json, embedded at build time) and strict validation.
//
// Policy: everything is refused that the schema does not allow: unknown types, unknown fields,
// missing required fields, wrong JSON types, values outside 'enum'/'max'/'max_len'/'bytes', and
// messages from a side or role not in 'from'. Errors name the message and field. JSON nesting is
// bounded while parsing (common/json_parse.hpp), so a hostile '[[[[...' builds nothing deep.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "proto/error.hpp"

namespace ddp::proto {

struct Limits {
  std::uint32_t min_version = 0, max_version = 0;
  std::size_t max_frame_bytes = 0;            // after authentication
  std::size_t max_handshake_frame_bytes = 0;  // before it
  std::size_t max_json_depth = 0;
};

enum class Phase { handshake, session, any };

// Who sent a message: its side of the connection ("client" dialled, "server" accepted) and,
// once known, its role ("agent", "ctl", "coordinator"). A message is allowed when 'from' lists
// either.
struct Sender {
  std::string side;
  std::string role;
};

// A heartbeat's fields (messages.json). The heartbeat is the one message every node sends and
// gets every interval, so it is read into these instead of a DOM: a Message of type
// "heartbeat" carries them in `beat` and leaves `body` null, whichever way it was read.
struct Beat {
  std::optional<std::int64_t> now_us, t0_us, rx_us;
  friend bool operator==(const Beat&, const Beat&) = default;
};

struct Message {
  std::string type;
  std::uint32_t version = 0;
  nlohmann::json body;  // the whole object, 'type' and 'v' included; null for a heartbeat
  Beat beat;            // a heartbeat's fields
};

struct Parsed {
  Message message;
  std::optional<ProtoError> error;
  bool ok() const { return !error.has_value(); }
};

const Limits& limits();
std::string_view schema_text();
std::vector<std::string> message_types();
std::optional<Phase> phase_of(std::string_view type);

// Validates a decoded object as sent by `sender`.
std::optional<ProtoError> validate(const nlohmann::json& message, const Sender& sender);

// Parses one JSON body (common/json_parse.hpp: strict, depth-bounded) and validates it. On a validation error,
// message.type still holds the claimed type when there was one. A heartbeat in the form our
// encoders give it (read_plain_heartbeat) takes a shorter way to the same result.
Parsed parse_message(std::string_view json_bytes, const Sender& sender);

// A heartbeat exactly as Session::seal_heartbeat() and dump() write one: no spaces, the keys
// in dump()'s (sorted) order, each at most once, integers in their shortest form within the
// schema's ranges. Anything else gives nullopt, and parse_message's general reader decides
// (which accepts every text this accepts, with the same values: schema_test). The sender is
// not checked here.
std::optional<Message> read_plain_heartbeat(std::string_view json_bytes);

// {"type": type, "v": version, ...fields}.
nlohmann::json make_message(std::string_view type, std::uint32_t version,
                            nlohmann::json fields = nlohmann::json::object());

// Compact JSON; invalid UTF-8 (a worker's raw output) is replaced, never thrown on.
std::string dump(const nlohmann::json& message);

}  // namespace ddp::proto

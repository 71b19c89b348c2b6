// Protocol errors as values: a code the peer can act on (it goes into the 'error' frame), a
// human message, and the offending field when there is one.
#pragma once

#include <string>
#include <string_view>

namespace ddp::proto {

enum class ErrorCode {
  bad_frame,      // framing is broken (empty frame, missing MAC tag)
  too_large,      // a frame's declared length exceeds the limit
  bad_json,       // not a JSON object, or nested too deep
  unknown_type,   // 'type' names no message of the schema
  missing_field,  // a required field is absent
  wrong_type,     // a field has the wrong JSON type
  unknown_field,  // a field the schema does not list
  bad_value,      // right type, value out of range / not in enum / bad hex
  wrong_sender,   // this side or role may not send this message
  unexpected,     // a valid message, but not in this state (e.g. 'join' before authentication)
  version,        // no common protocol version, or a frame with another version
  auth,           // unknown key id, wrong proof, role refused
  bad_mac,        // per-frame authentication failed: replay, reorder, injection or corruption
};

std::string_view to_string(ErrorCode code);

struct ProtoError {
  ErrorCode code = ErrorCode::bad_frame;
  std::string message;
  std::string field;  // empty when not about one field
  std::string hint;   // how to fix it, when we know
};

}  // namespace ddp::proto

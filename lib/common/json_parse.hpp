// The reader for JSON text whose nesting must be bounded: protocol frames from peers, and what a
// job's processes write that is then walked (stack readers' replies, flight-recorder summaries).
// Pure (common/json_parse.cpp).
//
// It reads RFC 8259 as nlohmann::json::parse does in its strict mode, and builds the same value:
// an integer without a minus sign is unsigned, one with it signed (-0 too), one that does not fit
// (past 2^64 - 1, or below -2^63) or has a fraction or an exponent is a double (one too large for a
// double is refused); of two equal keys the last wins (and `repeated_key` says so); strings must
// be valid UTF-8 (no overlong forms, no encoded surrogates, nothing past U+10FFFF), control
// characters must be escaped, and \u escapes pair their surrogates. It refuses three things
// nlohmann accepts: nesting deeper than `max_depth` (checked as it reads, so nothing deeper is
// built; such a value would cost a stack frame per level wherever it is copied, compared, dumped
// or walked), a NUL byte after the value (nlohmann takes it as the end of the text and ignores the
// rest) and a leading UTF-8 byte order mark (which nlohmann skips).
// tests/unit/common/json_parse_test.cpp holds it to nlohmann's answers on edge cases, random
// documents, their prefixes and their mutants.
//
// Why not nlohmann's own parser: its lexer copies every byte through a token buffer and its
// DOM builder finds each key's place in the object by search. Here a string's unescaped bytes are
// copied as one run, and keys that arrive in order (every message our side encodes: its objects
// are sorted maps) are appended at the object's end; every protocol frame from a peer
// (proto::parse_message) passes here (docs/performance.md, "A JSON reader of our own").
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace ddp {

struct JsonParsed {
  nlohmann::json value;  // null unless ok()
  // Empty when the text is one JSON value; else where and what, e.g. "at byte 12: expected ':'".
  std::string error;
  bool too_deep = false;  // the error is the depth bound
  // Some object held a key twice (its value is the last one's, as nlohmann's): RFC 8259 leaves
  // such text's meaning to the reader, so a protocol frame with one is refused (parse_message).
  bool repeated_key = false;
  bool ok() const { return error.empty(); }
};

// The largest max_depth: each level is a stack frame of the reader.
inline constexpr std::size_t kJsonMaxDepth = 512;

// Reads `text` as exactly one JSON value, whitespace around it allowed. `max_depth`: how many
// arrays and objects may nest ("1" is depth 0, "[]" and "{}" depth 1, "[[]]" depth 2); above
// kJsonMaxDepth it throws std::invalid_argument (a caller's bug). Out of memory: std::bad_alloc.
JsonParsed parse_json(std::string_view text, std::size_t max_depth);

}  // namespace ddp

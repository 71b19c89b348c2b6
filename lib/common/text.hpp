// Hostile text made safe to show and to store (common/text.cpp). Pure.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace ddp {

// Text from a hostile source (the job's memory, its interpreter's output, a peer's message), made
// safe for a terminal, a log line and a strict JSON dump: valid UTF-8 of at most `max_bytes`, cut
// on a character boundary. Each byte of an invalid sequence (stray continuation, overlong form,
// surrogate, above U+10FFFF, cut short) becomes '?', as does every C0/C1 control and DEL (except
// those in `keep`, e.g. "\n\t") and every bidirectional embedding, override or isolate
// (U+202A-U+202E, U+2066-U+2069), which would reorder what a reader sees. The one sanitizer:
// use it rather than another.
std::string clean_text(std::string_view s, std::size_t max_bytes, std::string_view keep = {});

// The length of the UTF-8 sequence that starts at s[i] when it is the shortest form of a scalar
// value (RFC 3629, section 4: no overlong form, no surrogate, nothing above U+10FFFF, nothing cut
// short; an ASCII byte is 1), else 0. The one UTF-8 rule, which clean_text and the JSON reader
// (common/json_parse) apply.
std::size_t utf8_length(std::string_view s, std::size_t i);
// Whether all of `s` is UTF-8 by that rule (what a strict JSON dump takes).
bool valid_utf8(std::string_view s);

}  // namespace ddp

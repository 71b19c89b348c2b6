// Length-prefixed frames: a 4-byte big-endian body length, then the body.
//
// Policy: the declared length is checked against the limit before a single byte of the body is
// buffered or allocated; a stream with a bad frame is dead (the error is sticky), because after a
// framing error nothing that follows can be trusted to start on a boundary. The limit can change
// between frames (the session raises it after authentication).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "proto/error.hpp"

namespace ddp::proto {

inline constexpr std::size_t kFrameHeaderBytes = 4;

// The header followed by `body`. The caller keeps bodies within the limit its peer enforces.
std::string encode_frame(std::string_view body);

class FrameDecoder {
 public:
  explicit FrameDecoder(std::size_t max_body) : max_body_(max_body) {}

  // Appends bytes from the stream. Drain next() after every feed: then the buffer never holds
  // more than one read plus one (size-checked) frame.
  void feed(std::string_view bytes);

  // The next complete body, or nullopt when more bytes are needed or the stream is broken.
  std::optional<std::string> next();

  void set_max_body(std::size_t max_body) { max_body_ = max_body; }
  std::size_t max_body() const { return max_body_; }
  const std::optional<ProtoError>& error() const { return error_; }
  std::size_t buffered() const { return buf_.size() - pos_; }

 private:
  std::string buf_;
  std::size_t pos_ = 0;  // start of the first unconsumed byte in buf_
  std::size_t max_body_;
  std::optional<ProtoError> error_;
};

}  // namespace ddp::proto

// Frame encoding and the incremental decoder; see frame.hpp for the policy.
#include "proto/frame.hpp"

namespace ddp::proto {

std::string_view to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::bad_frame:
      return "bad_frame";
    case ErrorCode::too_large:
      return "too_large";
    case ErrorCode::bad_json:
      return "bad_json";
    case ErrorCode::unknown_type:
      return "unknown_type";
    case ErrorCode::missing_field:
      return "missing_field";
    case ErrorCode::wrong_type:
      return "wrong_type";
    case ErrorCode::unknown_field:
      return "unknown_field";
    case ErrorCode::bad_value:
      return "bad_value";
    case ErrorCode::wrong_sender:
      return "wrong_sender";
    case ErrorCode::unexpected:
      return "unexpected";
    case ErrorCode::version:
      return "version";
    case ErrorCode::auth:
      return "auth";
    case ErrorCode::bad_mac:
      return "bad_mac";
  }
  return "unknown";
}

std::string encode_frame(std::string_view body) {
  const auto n = static_cast<std::uint32_t>(body.size());
  std::string out;
  out.reserve(kFrameHeaderBytes + body.size());
  out.push_back(static_cast<char>((n >> 24) & 0xff));
  out.push_back(static_cast<char>((n >> 16) & 0xff));
  out.push_back(static_cast<char>((n >> 8) & 0xff));
  out.push_back(static_cast<char>(n & 0xff));
  out.append(body);
  return out;
}

void FrameDecoder::feed(std::string_view bytes) {
  if (error_) return;
  // Compact once the consumed prefix dominates, so a long-lived stream does not grow.
  if (pos_ > 0 && pos_ * 2 >= buf_.size()) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  buf_.append(bytes);
}

std::optional<std::string> FrameDecoder::next() {
  if (error_ || buffered() < kFrameHeaderBytes) return std::nullopt;
  const auto* p = reinterpret_cast<const unsigned char*>(buf_.data() + pos_);
  const std::size_t n = (std::size_t(p[0]) << 24) | (std::size_t(p[1]) << 16) | (std::size_t(p[2]) << 8) | p[3];
  if (n > max_body_) {
    error_ = ProtoError{
        ErrorCode::too_large,
        "frame of " + std::to_string(n) + " bytes exceeds the limit of " + std::to_string(max_body_) + " bytes", "",
        ""};
    // A peer speaking another protocol (HTTP, TLS) shows up here as a huge "length".
    if (p[0] >= 0x16 && p[0] <= 0x7e) error_->hint = "is the peer speaking another protocol (HTTP, TLS) on this port?";
    buf_.clear();
    pos_ = 0;
    return std::nullopt;
  }
  if (n == 0) {
    error_ = ProtoError{ErrorCode::bad_frame, "empty frame", "", ""};
    return std::nullopt;
  }
  if (buffered() < kFrameHeaderBytes + n) return std::nullopt;
  std::string body = buf_.substr(pos_ + kFrameHeaderBytes, n);
  pos_ += kFrameHeaderBytes + n;
  if (pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  }
  return body;
}

}  // namespace ddp::proto

#include "common/text.hpp"

#include <algorithm>

namespace ddp {

std::size_t utf8_length(std::string_view s, std::size_t i) {
  auto byte = [&s](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const auto c = byte(i);
  if (c < 0x80) return 1;
  // The length, and the range of the second byte, that make the shortest form.
  std::size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf;
  if (c >= 0xc2 && c <= 0xdf)
    n = 2;
  else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
  }
  bool ok = n != 0 && i + n <= s.size() && byte(i + 1) >= lo && byte(i + 1) <= hi;
  for (std::size_t k = 2; ok && k < n; ++k) ok = (byte(i + k) & 0xc0) == 0x80;
  return ok ? n : 0;
}

bool valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto n = utf8_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string clean_text(std::string_view s, std::size_t max_bytes, std::string_view keep) {
  std::string out;
  out.reserve(std::min(s.size(), max_bytes));
  auto byte = [&s](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  for (std::size_t i = 0; i < s.size() && out.size() < max_bytes;) {
    const auto c = byte(i);
    if (c < 0x80) {
      const bool control = c < 0x20 || c == 0x7f;
      out += control && keep.find(static_cast<char>(c)) == std::string_view::npos ? '?' : static_cast<char>(c);
      ++i;
      continue;
    }
    const auto n = utf8_length(s, i);
    if (n == 0) {
      out += '?';
      ++i;
      continue;
    }
    const bool c1 = c == 0xc2 && byte(i + 1) <= 0x9f;  // U+0080-U+009F
    const bool bidi = c == 0xe2 && ((byte(i + 1) == 0x80 && byte(i + 2) >= 0xaa && byte(i + 2) <= 0xae) ||
                                    (byte(i + 1) == 0x81 && byte(i + 2) >= 0xa6 && byte(i + 2) <= 0xa9));
    if (c1 || bidi)
      out += '?';
    else if (out.size() + n <= max_bytes)
      out.append(s.substr(i, n));
    else
      break;  // never half a character
    i += n;
  }
  return out;
}

}  // namespace ddp

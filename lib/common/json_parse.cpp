// A strict, depth-bounded JSON reader that builds nlohmann::json values; see json_parse.hpp.
#include "common/json_parse.hpp"

#include "common/text.hpp"

#include <locale.h>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

namespace ddp {
namespace {

using nlohmann::json;

// Bytes a string may hold as they are: printable ASCII but the quote and the backslash. Anything
// else ends a run (the run is copied at once): the closing quote, an escape, a control character
// (refused) or the first byte of a UTF-8 sequence (checked).
constexpr std::array<bool, 256> plain_table() {
  std::array<bool, 256> t{};
  for (int c = 0x20; c < 0x80; ++c) t[c] = c != '"' && c != '\\';
  return t;
}
constexpr auto kPlain = plain_table();

// The C locale, for strtod: a job's locale must not change what "1.5" means.
locale_t c_locale() {
  static const locale_t loc = ::newlocale(LC_ALL_MASK, "C", static_cast<locale_t>(nullptr));
  if (!loc) throw std::bad_alloc();  // its only failure for "C"
  return loc;
}

class Reader {
 public:
  Reader(std::string_view text, std::size_t max_depth)
      : begin_(text.data()), p_(text.data()), end_(text.data() + text.size()), max_depth_(max_depth) {}

  JsonParsed run() {
    JsonParsed out;
    if (value(out.value) && (skip_ws(), p_ == end_ || fail("expected the end of the text after the value"))) {
      out.repeated_key = repeated_key_;
      return out;
    }
    out.value = nullptr;
    out.error = "at byte " + std::to_string(error_at_ - begin_) + ": " + error_;
    out.too_deep = too_deep_;
    return out;
  }

 private:
  bool fail(std::string what) {
    if (error_.empty()) {
      error_ = std::move(what);
      error_at_ = p_;
    }
    return false;
  }

  void skip_ws() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }

  bool literal(std::string_view word) {
    if (static_cast<std::size_t>(end_ - p_) < word.size() || std::memcmp(p_, word.data(), word.size()) != 0) {
      return fail("expected a value");
    }
    p_ += word.size();
    return true;
  }

  bool value(json& v) {
    skip_ws();
    if (p_ == end_) return fail("expected a value, got the end of the text");
    switch (*p_) {
      case '{':
        return object(v);
      case '[':
        return array(v);
      case '"': {
        ++p_;
        std::string s;
        if (!string(s)) return false;
        v = std::move(s);
        return true;
      }
      case 't':
        if (!literal("true")) return false;
        v = true;
        return true;
      case 'f':
        if (!literal("false")) return false;
        v = false;
        return true;
      case 'n':
        if (!literal("null")) return false;
        v = nullptr;
        return true;
      default:
        if (*p_ == '-' || (*p_ >= '0' && *p_ <= '9')) return number(v);
        return fail("expected a value");
    }
  }

  bool enter() {
    if (++depth_ > max_depth_) {
      too_deep_ = true;
      return fail("nested deeper than " + std::to_string(max_depth_) + " levels");
    }
    ++p_;
    return true;
  }

  // After whitespace: the container's `closer` (it ends: one level up), or not.
  bool closes(char closer) {
    skip_ws();
    if (p_ == end_ || *p_ != closer) return false;
    ++p_;
    --depth_;
    return true;
  }

  // After whitespace: a comma (another item follows), or not.
  bool comma() {
    skip_ws();
    if (p_ == end_ || *p_ != ',') return false;
    ++p_;
    return true;
  }

  bool object(json& v) {
    if (!enter()) return false;
    v = json::object();
    auto& obj = v.get_ref<json::object_t&>();
    if (closes('}')) return true;
    for (;;) {
      skip_ws();
      if (p_ == end_ || *p_ != '"') return fail("expected a key (a string)");
      ++p_;
      std::string key;
      if (!string(key)) return false;
      skip_ws();
      if (p_ == end_ || *p_ != ':') return fail("expected ':' after the key");
      ++p_;
      // Keys in order (what every sorted map encodes) go at the end without a search; another
      // key finds its place, and a repeated one's value is replaced (the last wins) and noted.
      json* slot;
      if (obj.empty() || obj.rbegin()->first < key) {
        slot = &obj.emplace_hint(obj.end(), std::move(key), nullptr)->second;
      } else {
        auto [at, fresh] = obj.try_emplace(std::move(key), nullptr);
        repeated_key_ = repeated_key_ || !fresh;
        slot = &at->second;  // value() below replaces what an earlier equal key left
      }
      if (!value(*slot)) return false;
      if (comma()) continue;
      if (closes('}')) return true;
      return fail("expected ',' or '}' in an object");
    }
  }

  bool array(json& v) {
    if (!enter()) return false;
    v = json::array();
    auto& arr = v.get_ref<json::array_t&>();
    if (closes(']')) return true;
    for (;;) {
      arr.emplace_back();
      if (!value(arr.back())) return false;
      if (comma()) continue;
      if (closes(']')) return true;
      return fail("expected ',' or ']' in an array");
    }
  }

  static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // Four hex digits after "\u".
  bool code_unit(unsigned& out) {
    if (end_ - p_ < 4) return fail("expected four hex digits after \\u");
    out = 0;
    for (int i = 0; i < 4; ++i) {
      const int d = hex_digit(p_[i]);
      if (d < 0) return fail("expected four hex digits after \\u");
      out = out * 16 + static_cast<unsigned>(d);
    }
    p_ += 4;
    return true;
  }

  static void put_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  bool escape(std::string& out) {
    ++p_;  // the backslash
    if (p_ == end_) return fail("unterminated string");
    const char c = *p_++;
    switch (c) {
      case '"':
      case '\\':
      case '/':
        out += c;
        return true;
      case 'b':
        out += '\b';
        return true;
      case 'f':
        out += '\f';
        return true;
      case 'n':
        out += '\n';
        return true;
      case 'r':
        out += '\r';
        return true;
      case 't':
        out += '\t';
        return true;
      case 'u': {
        unsigned cp = 0;
        if (!code_unit(cp)) return false;
        if (cp >= 0xDC00 && cp <= 0xDFFF) return fail("a low surrogate (\\uDC00-\\uDFFF) without a high one before it");
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') return fail("a high surrogate not followed by \\u");
          p_ += 2;
          unsigned low = 0;
          if (!code_unit(low)) return false;
          if (low < 0xDC00 || low > 0xDFFF) return fail("a high surrogate not followed by a low one");
          cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
        }
        put_utf8(out, cp);
        return true;
      }
      default:
        --p_;
        return fail("an unknown escape");
    }
  }

  // One UTF-8 sequence of two to four bytes (common/text.hpp's rule), copied as it is.
  bool utf8(std::string& out) {
    const auto n = utf8_length(std::string_view(p_, static_cast<std::size_t>(end_ - p_)), 0);
    if (n == 0) return fail("invalid UTF-8 in a string");
    out.append(p_, n);
    p_ += n;
    return true;
  }

  // After the opening quote, through the closing one.
  bool string(std::string& out) {
    for (;;) {
      const char* run = p_;
      while (p_ < end_ && kPlain[static_cast<unsigned char>(*p_)]) ++p_;
      out.append(run, static_cast<std::size_t>(p_ - run));
      if (p_ == end_) return fail("unterminated string");
      const auto c = static_cast<unsigned char>(*p_);
      if (c == '"') {
        ++p_;
        return true;
      }
      if (c == '\\') {
        if (!escape(out)) return false;
      } else if (c < 0x20) {
        return fail("a control character in a string (it must be escaped)");
      } else if (!utf8(out)) {
        return false;
      }
    }
  }

  static bool digit(char c) { return c >= '0' && c <= '9'; }

  bool number(json& v) {
    const char* start = p_;
    const bool negative = *p_ == '-';
    if (negative) ++p_;
    if (p_ < end_ && *p_ == '0') {
      ++p_;
    } else if (p_ < end_ && *p_ >= '1' && *p_ <= '9') {
      while (p_ < end_ && digit(*p_)) ++p_;
    } else {
      return fail("expected a digit");
    }
    bool integer = true;
    if (p_ < end_ && *p_ == '.') {
      ++p_;
      if (p_ == end_ || !digit(*p_)) return fail("expected a digit after '.'");
      while (p_ < end_ && digit(*p_)) ++p_;
      integer = false;
    }
    if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
      ++p_;
      if (p_ < end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (p_ == end_ || !digit(*p_)) return fail("expected a digit in the exponent");
      while (p_ < end_ && digit(*p_)) ++p_;
      integer = false;
    }
    if (integer) {
      std::uint64_t n = 0;
      bool fits = true;
      for (const char* d = start + (negative ? 1 : 0); d < p_; ++d) {
        const auto x = static_cast<std::uint64_t>(*d - '0');
        if (n > (UINT64_MAX - x) / 10) {
          fits = false;
          break;
        }
        n = n * 10 + x;
      }
      if (fits && !negative) {
        v = n;
        return true;
      }
      constexpr auto kMinMagnitude = static_cast<std::uint64_t>(INT64_MAX) + 1;  // |INT64_MIN|
      if (fits && n <= kMinMagnitude) {
        v = n == kMinMagnitude ? INT64_MIN : -static_cast<std::int64_t>(n);
        return true;
      }
      // Past 64 bits: a double, as nlohmann makes it.
    }
    const std::string token(start, p_);
    const double d = ::strtod_l(token.c_str(), nullptr, c_locale());
    if (!std::isfinite(d)) {
      p_ = start;
      return fail("a number too large for a double");
    }
    v = d;
    return true;
  }

  const char* begin_;
  const char* p_;
  const char* end_;
  std::size_t max_depth_, depth_ = 0;
  bool too_deep_ = false;
  bool repeated_key_ = false;
  std::string error_;
  const char* error_at_ = nullptr;
};

}  // namespace

JsonParsed parse_json(std::string_view text, std::size_t max_depth) {
  if (max_depth > kJsonMaxDepth) throw std::invalid_argument("parse_json: max_depth above kJsonMaxDepth");
  return Reader(text, max_depth).run();
}

}  // namespace ddp

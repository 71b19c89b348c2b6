// common/json_parse: the reader for JSON from peers and jobs. Held to nlohmann::json::parse's
// answers (accepted or not, and the same value with the same JSON types) on hand-written edge cases,
// on random documents written with random whitespace and escapes, and on every one of those
// mutated byte by byte; apart from that, its own promises: the types of numbers, the last of two
// equal keys, the depth bound, and the three things it refuses that nlohmann accepts.
#include "common/json_parse.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace {

using ddp::parse_json;
using nlohmann::json;

// Equal values of equal JSON types, all the way down (nlohmann's == calls 1 and 1u and 1.0 equal).
bool same(const json& a, const json& b) {
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case json::value_t::object: {
      if (a.size() != b.size()) return false;
      for (auto i = a.begin(), j = b.begin(); i != a.end(); ++i, ++j) {
        if (i.key() != j.key() || !same(*i, *j)) return false;
      }
      return true;
    }
    case json::value_t::array:
      if (a.size() != b.size()) return false;
      for (std::size_t i = 0; i < a.size(); ++i) {
        if (!same(a[i], b[i])) return false;
      }
      return true;
    case json::value_t::number_float: {
      const double x = a.get<double>(), y = b.get<double>();
      return std::memcmp(&x, &y, sizeof x) == 0;
    }
    default:
      return a == b;
  }
}

std::string shown(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

// Whether the text holds something we refuse and nlohmann does not: a NUL byte, or a leading BOM.
bool has_our_refusals(const std::string& text) {
  return text.find('\0') != std::string::npos || text.rfind("\xEF\xBB\xBF", 0) == 0;
}

// Our answer against nlohmann's: the same acceptance and the same value, or, where the text holds
// a NUL byte or a BOM, no more accepted than nlohmann accepts (what we then accept, the same).
// Read from a heap copy of exactly its size, no terminator after it: a read one byte past the end
// is then an overflow the address sanitizer reports (scripts/test runs this test under it).
ddp::JsonParsed parse_exact(const std::string& text, std::size_t max_depth = ddp::kJsonMaxDepth) {
  const auto copy = std::make_unique<char[]>(text.size());
  std::memcpy(copy.get(), text.data(), text.size());
  return parse_json(std::string_view(copy.get(), text.size()), max_depth);
}

::testing::AssertionResult agrees(const std::string& text) {
  const auto ours = parse_exact(text);
  const auto theirs = json::parse(text, nullptr, /*allow_exceptions=*/false);
  const bool they_accept = !theirs.is_discarded();
  if (has_our_refusals(text)) {
    if (ours.ok() && (!they_accept || !same(ours.value, theirs))) {
      return ::testing::AssertionFailure() << "accepted what nlohmann does not (or differently): " << shown(text);
    }
    return ::testing::AssertionSuccess();
  }
  if (ours.ok() != they_accept) {
    return ::testing::AssertionFailure() << (ours.ok() ? "accepted" : "refused (" + ours.error + ")")
                                         << " where nlohmann " << (they_accept ? "accepts" : "refuses") << ": "
                                         << shown(text);
  }
  if (ours.ok() && !same(ours.value, theirs)) {
    return ::testing::AssertionFailure() << "a different value for " << shown(text) << ": " << ours.value.dump()
                                         << " against " << theirs.dump();
  }
  if (!ours.ok() && !ours.value.is_null()) return ::testing::AssertionFailure() << "an error with a value";
  return ::testing::AssertionSuccess();
}

TEST(JsonParse, AgreesWithNlohmannOnEdgeCases) {
  const std::vector<std::string> cases = {
      // values and whitespace
      "null", "true", "false", " \t\r\n1 \t\r\n", "\"\"", "{}", "[]", "[ ]", "{ }", "[1,2,3]",
      R"({"a":1,"b":[true,null]})", "", " ", "nul", "tru", "falsey", "truex", "nullnull", "[1,]", "[,1]", "[1 2]",
      "{\"a\" 1}", "{\"a\":}", "{,}", "{\"a\":1,}", "{1:2}", "{'a':1}", "[1]]", "[[1]", "{\"a\":1}}",
      "\x0b"
      "1",
      "\f1", "1\x0b",
      // numbers
      "0", "-0", "1", "-1", "00", "01", "-01", "0.0", "-0.0", "1.5", "1.", ".5", "-", "+1", "1e5", "1E5", "1e+5",
      "1e-5", "1e", "1e+", "1.5e3", "0e0", "-0e-0", "1.0e400", "1e400", "-1e400", "1e-400", "4.9e-324", "2.5e-324",
      "1.7976931348623157e308", "1.7976931348623159e308", "9223372036854775807", "9223372036854775808",
      "-9223372036854775808", "-9223372036854775809", "18446744073709551615", "18446744073709551616",
      "123456789012345678901234567890", "-123456789012345678901234567890", "0x10", "1_000", "Infinity", "NaN", "[-]",
      "[1.e5]", "[1e5.5]", "[0.1.2]",
      // strings: escapes
      R"("\"\\\/\b\f\n\r\t")", R"("\u0000")", R"("\u0041\u00e9\u20AC")", R"("\uD83D\uDE00")", R"("\ud83d\ude00")",
      R"("\uD83D")", R"("\uD83Dx")", R"("\uD83D\u0041")", R"("\uDE00")", R"("\uDE00\uD83D")", R"("\uD83D\uD83D")",
      R"("\u12")", R"("\u12G4")", R"("\x41")", R"("\a")", R"("\)", R"("\")", "\"abc", "\"\\u", R"("\uDBFF\uDFFF")",
      R"("\uD800\uDC00")", R"("\uFFFF")", R"("\uFEFF")",
      // strings: raw bytes
      "\"\x01\"", "\"\x1f\"", "\"\x7f\"", "\"\t\"", "\"\n\"", "\"caf\xC3\xA9\"", "\"\xE2\x82\xAC\"",
      "\"\xF0\x9F\x98\x80\"", "\"\xC0\x80\"", "\"\xC1\xBF\"", "\"\xC2\x80\"", "\"\xC2\"", "\"\xC2\x41\"",
      "\"\xE0\x80\x80\"", "\"\xE0\x9F\xBF\"", "\"\xE0\xA0\x80\"", "\"\xED\x9F\xBF\"", "\"\xED\xA0\x80\"",
      "\"\xEE\x80\x80\"", "\"\xEF\xBF\xBF\"", "\"\xF0\x8F\xBF\xBF\"", "\"\xF0\x90\x80\x80\"", "\"\xF4\x8F\xBF\xBF\"",
      "\"\xF4\x90\x80\x80\"", "\"\xF5\x80\x80\x80\"", "\"\xFF\"", "\"\x80\"", "\"\xE2\x82\"", "\"\xF0\x9F\x98\"",
      "\xC3\xA9", "[\"a\",\xC3\xA9]",
      // objects: duplicates and order
      R"({"b":1,"a":2})", R"({"a":1,"a":2})", R"({"a":1,"b":2,"a":3})", R"({"b":{"x":1},"b":[2]})", R"({"":0,"":1})",
      R"({"a":{"a":{"a":{}}}})", R"([{"z":1,"y":2,"x":3}])",
      // a byte order mark nlohmann skips and we refuse; a NUL it takes as the end
      "\xEF\xBB\xBF{}", std::string("{}\0garbage", 10), std::string("\0", 1), std::string("[1,\0]", 5),
      std::string("\"a\0b\"", 5)};
  for (const auto& text : cases) EXPECT_TRUE(agrees(text));
}

TEST(JsonParse, NumbersKeepNlohmannsTypes) {
  auto v = [](const std::string& text) {
    auto p = parse_json(text, 8);
    EXPECT_TRUE(p.ok()) << text << ": " << p.error;
    return p.value;
  };
  EXPECT_TRUE(v("0").is_number_unsigned());
  EXPECT_TRUE(v("18446744073709551615").is_number_unsigned());
  EXPECT_EQ(v("18446744073709551615").get<std::uint64_t>(), UINT64_MAX);
  EXPECT_TRUE(v("-0").is_number_integer() && !v("-0").is_number_unsigned());
  EXPECT_TRUE(v("-9223372036854775808").is_number_integer());
  EXPECT_EQ(v("-9223372036854775808").get<std::int64_t>(), INT64_MIN);
  EXPECT_TRUE(v("-9223372036854775809").is_number_float());
  EXPECT_TRUE(v("18446744073709551616").is_number_float());
  EXPECT_DOUBLE_EQ(v("18446744073709551616").get<double>(), 18446744073709551616.0);
  EXPECT_TRUE(v("1.0").is_number_float());
  EXPECT_TRUE(v("1e2").is_number_float());
  EXPECT_DOUBLE_EQ(v("1e2").get<double>(), 100.0);
  EXPECT_EQ(v("1e-400").get<double>(), 0.0);  // below a double's range: zero, as strtod gives
  EXPECT_FALSE(parse_json("1e400", 8).ok());  // above it: refused
  EXPECT_EQ(v("[1,\"x\",{\"k\":[]}]"), json::parse(R"([1,"x",{"k":[]}])"));
}

TEST(JsonParse, TheLastOfEqualKeysWins) {
  auto p = parse_json(R"({"role":"agent","x":1,"role":"coordinator"})", 8);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p.value["role"], "coordinator");
  EXPECT_EQ(p.value.size(), 2u);
  // Out of order, into the middle: still sorted, the repeated one replaced.
  p = parse_json(R"({"c":1,"a":2,"b":3,"a":{"z":4}})", 8);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p.value.dump(), R"({"a":{"z":4},"b":3,"c":1})");
  EXPECT_TRUE(p.repeated_key);  // and it says so
  // Nested, and in order: said too; distinct keys, or equal keys in two objects, are not.
  EXPECT_TRUE(parse_json(R"([{"a":{"b":1,"b":2}}])", 8).repeated_key);
  EXPECT_TRUE(parse_json(R"({"a":1,"a":1})", 8).repeated_key);
  EXPECT_FALSE(parse_json(R"({"a":{"a":1},"b":[{"a":2},{"a":3}]})", 8).repeated_key);
  EXPECT_FALSE(parse_json(R"({"b":1,"a":2})", 8).repeated_key);
}

TEST(JsonParse, StringsDecodeEscapesAndKeepUtf8) {
  auto p = parse_json(R"(["\u0000x", "\uD83D\uDE00", "caf\u00e9", "\/\t"])", 8);
  ASSERT_TRUE(p.ok()) << p.error;
  EXPECT_EQ(p.value[0].get<std::string>(), std::string("\0x", 2));
  EXPECT_EQ(p.value[1].get<std::string>(), "\xF0\x9F\x98\x80");
  EXPECT_EQ(p.value[2].get<std::string>(), "caf\xC3\xA9");
  EXPECT_EQ(p.value[3].get<std::string>(), "/\t");
}

TEST(JsonParse, DepthIsBoundedWhileReading) {
  EXPECT_TRUE(parse_json("1", 0).ok());
  EXPECT_FALSE(parse_json("[]", 0).ok());
  EXPECT_TRUE(parse_json(R"({"a":[1,{"b":2}]})", 3).ok());
  auto p = parse_json(R"({"a":[1,{"b":2}]})", 2);
  EXPECT_FALSE(p.ok());
  EXPECT_TRUE(p.too_deep);
  EXPECT_EQ(p.error, "at byte 8: nested deeper than 2 levels");
  EXPECT_TRUE(parse_json("[[],[]]", 2).ok());                    // siblings do not add up
  EXPECT_TRUE(parse_json(R"(["[[[[{{{{", "\"[[[["])", 1).ok());  // brackets in strings are text
  EXPECT_TRUE(parse_json(R"(["\\", [[]]])", 3).ok());            // the string ends at \\": the rest counts
  EXPECT_TRUE(parse_json(R"(["\\", [[]]])", 2).too_deep);
  EXPECT_TRUE(parse_json(std::string(32, '[') + std::string(32, ']'), 32).ok());
  EXPECT_FALSE(parse_json(std::string(33, '[') + std::string(33, ']'), 32).ok());
  // A hostile text stops at the first opener past the bound, whatever follows.
  p = parse_json(std::string(1000000, '['), 32);
  EXPECT_TRUE(p.too_deep);
  EXPECT_EQ(p.error, "at byte 32: nested deeper than 32 levels");
  // A syntax error before the bound is just that.
  p = parse_json("[[x" + std::string(100, '['), 32);
  EXPECT_FALSE(p.too_deep);
  EXPECT_EQ(p.error, "at byte 2: expected a value");
  EXPECT_THROW(parse_json("1", 513), std::invalid_argument);
}

TEST(JsonParse, RefusesWhatNlohmannLetsThrough) {
  // nlohmann skips a byte order mark and stops at a NUL byte: both would let a text mean more
  // than its reader sees.
  EXPECT_FALSE(json::parse("\xEF\xBB\xBF{}", nullptr, false).is_discarded());
  EXPECT_EQ(parse_json("\xEF\xBB\xBF{}", 8).error, "at byte 0: expected a value");
  const std::string nul("{\"a\":1}\0{\"a\":2}", 15);
  EXPECT_EQ(json::parse(nul, nullptr, false), json({{"a", 1}}));
  EXPECT_EQ(parse_json(nul, 8).error, "at byte 7: expected the end of the text after the value");
}

TEST(JsonParse, ErrorsSayWhere) {
  EXPECT_EQ(parse_json("", 8).error, "at byte 0: expected a value, got the end of the text");
  EXPECT_EQ(parse_json(R"({"a" 1})", 8).error, "at byte 5: expected ':' after the key");
  EXPECT_EQ(parse_json("[1,2", 8).error, "at byte 4: expected ',' or ']' in an array");
  EXPECT_EQ(parse_json("\"ab\x01\"", 8).error, "at byte 3: a control character in a string (it must be escaped)");
  EXPECT_EQ(parse_json("\"\xC0\x80\"", 8).error, "at byte 1: invalid UTF-8 in a string");
  EXPECT_EQ(parse_json(R"("\q")", 8).error, "at byte 2: an unknown escape");
  EXPECT_EQ(parse_json("1 2", 8).error, "at byte 2: expected the end of the text after the value");
  EXPECT_EQ(parse_json("-1e999", 8).error, "at byte 0: a number too large for a double");
}

// Random documents, written with random whitespace, random escapes (surrogate pairs for the
// characters past U+FFFF), repeated and unordered keys and numbers at the edges of their types.
class Writer {
 public:
  explicit Writer(std::uint32_t seed) : rng_(seed) {}

  std::string document() {
    std::string out;
    ws(out);
    value(out, 0);
    ws(out);
    return out;
  }

 private:
  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }

  void ws(std::string& out) {
    if (pick(3)) return;
    for (int i = pick(3); i >= 0; --i) out += " \t\r\n"[pick(4)];
  }

  void number(std::string& out) {
    static const char* kEdges[] = {"0",
                                   "-0",
                                   "9223372036854775807",
                                   "9223372036854775808",
                                   "-9223372036854775808",
                                   "-9223372036854775809",
                                   "18446744073709551615",
                                   "18446744073709551616",
                                   "99999999999999999999999",
                                   "0.5",
                                   "-2.25e-3",
                                   "1E+10",
                                   "6.02214076e23",
                                   "1e-320",
                                   "1.7976931348623157e308"};
    switch (pick(4)) {
      case 0:
        out += kEdges[pick(std::size(kEdges))];
        return;
      case 1:
        out += std::to_string(std::uniform_int_distribution<std::int64_t>(INT64_MIN, INT64_MAX)(rng_));
        return;
      case 2:
        out += std::to_string(std::uniform_int_distribution<std::uint64_t>(0, UINT64_MAX)(rng_) >> pick(64));
        return;
      default: {
        char buf[64];
        std::snprintf(buf, sizeof buf, pick(2) ? "%.17g" : "%.3e",
                      std::uniform_real_distribution<double>(-1e6, 1e6)(rng_) * std::pow(10.0, pick(40) - 20));
        out += buf;
      }
    }
  }

  std::uint32_t code_point() {
    switch (pick(6)) {
      case 0:
        return static_cast<std::uint32_t>(pick(0x20));  // control
      case 1:
        return "\"\\/ab"[pick(5)];
      case 2:
        return static_cast<std::uint32_t>(0x80 + pick(0x800 - 0x80));
      case 3: {
        std::uint32_t c = static_cast<std::uint32_t>(0x800 + pick(0x10000 - 0x800));
        return c >= 0xD800 && c <= 0xDFFF ? 0xE000 : c;
      }
      case 4:
        return static_cast<std::uint32_t>(0x10000 + pick(0x110000 - 0x10000));
      default:
        return static_cast<std::uint32_t>(0x20 + pick(0x5f));
    }
  }

  static void utf8(std::string& out, std::uint32_t c) {
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (c < 0x800) {
      out += static_cast<char>(0xC0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      out += static_cast<char>(0xE0 | (c >> 12));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (c >> 18));
      out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    }
  }

  void u_escape(std::string& out, std::uint32_t unit) {
    char buf[8];
    std::snprintf(buf, sizeof buf, pick(2) ? "\\u%04x" : "\\u%04X", unit);
    out += buf;
  }

  void string(std::string& out, std::string_view fixed = {}) {
    out += '"';
    const int n = fixed.empty() ? pick(12) : 0;
    for (char c : fixed) out += c;
    for (int i = 0; i < n; ++i) {
      const auto c = code_point();
      const bool must = c < 0x20 || c == '"' || c == '\\';
      if (!must && pick(3)) {
        utf8(out, c);
      } else if (c >= 0x10000) {
        u_escape(out, 0xD800 + ((c - 0x10000) >> 10));
        u_escape(out, 0xDC00 + ((c - 0x10000) & 0x3FF));
      } else if (c == '"' || c == '\\' || c == '/' || c == '\n' || c == '\t' || c == '\b' || c == '\f' || c == '\r') {
        if (pick(2)) {
          u_escape(out, c);
        } else {
          out += '\\';
          out += c == '\n' ? 'n' : c == '\t' ? 't' : c == '\b' ? 'b' : c == '\f' ? 'f' : c == '\r' ? 'r' : char(c);
        }
      } else {
        u_escape(out, c);
      }
    }
    out += '"';
  }

  void value(std::string& out, int depth) {
    switch (depth > 5 ? pick(4) : pick(7)) {
      case 0:
        number(out);
        return;
      case 1:
        string(out);
        return;
      case 2:
        out += pick(2) ? "true" : "false";
        return;
      case 3:
        out += "null";
        return;
      case 4:
      case 5: {
        out += '{';
        const int n = pick(6);
        for (int i = 0; i < n; ++i) {
          if (i) out += ',';
          ws(out);
          static const char* kKeys[] = {"a", "b", "c", "job_id", "node", "type", "v", ""};
          if (pick(2))
            string(out, kKeys[pick(std::size(kKeys))]);  // repeated keys, in and out of order
          else
            string(out);
          ws(out);
          out += ':';
          ws(out);
          value(out, depth + 1);
          ws(out);
        }
        out += '}';
        return;
      }
      default: {
        out += '[';
        const int n = pick(5);
        for (int i = 0; i < n; ++i) {
          if (i) out += ',';
          ws(out);
          value(out, depth + 1);
          ws(out);
        }
        out += ']';
      }
    }
  }

  std::mt19937 rng_;
};

TEST(JsonParse, AgreesWithNlohmannOnRandomDocumentsAndEveryMutation) {
  Writer writer(20261206);
  std::mt19937 rng(7);
  auto pick = [&](std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng); };
  static const unsigned char kBytes[] = {'"',  '\\', '{',  '}',  '[',  ']',  ',',  ':',  ' ',  '0',  '9',  '-',
                                         '+',  '.',  'e',  'u',  'D',  'x',  't',  'n',  0x00, 0x01, 0x1f, 0x7f,
                                         0x80, 0xBF, 0xC0, 0xC2, 0xE0, 0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xFF};
  int accepted = 0, mutants = 0, mutants_accepted = 0;
  for (int doc = 0; doc < 3000; ++doc) {
    const auto text = writer.document();
    ASSERT_TRUE(agrees(text));
    accepted += parse_exact(text).ok();
    // Cut at every byte: each end of the text met in every state.
    if (text.size() < 160) {
      for (std::size_t cut = 0; cut < text.size(); ++cut) ASSERT_TRUE(agrees(text.substr(0, cut)));
    }
    for (int m = 0; m < 12; ++m) {
      std::string t = text;
      const std::size_t at = t.empty() ? 0 : pick(t.size());
      const char b = static_cast<char>(pick(4) ? kBytes[pick(std::size(kBytes))] : pick(256));
      switch (pick(4)) {
        case 0:
          if (!t.empty()) t[at] = b;
          break;
        case 1:
          t.insert(t.begin() + static_cast<std::ptrdiff_t>(at), b);
          break;
        case 2:
          if (!t.empty()) t.erase(at, 1);
          break;
        default:
          t.resize(at);
      }
      ASSERT_TRUE(agrees(t));
      ++mutants;
      mutants_accepted += parse_exact(t).ok();
    }
  }
  // The generator writes valid JSON except a number past a double's range, which it does not
  // write: all accepted. Mutants are both (or the comparison would be one-sided).
  EXPECT_EQ(accepted, 3000);
  EXPECT_GT(mutants_accepted, mutants / 20);
  EXPECT_LT(mutants_accepted, mutants * 19 / 20);
}

}  // namespace

// Hostlist parsing, expansion and compression; see hostlist.hpp for the grammar and policy.
#include "hostlist/hostlist.hpp"

#include <charconv>
#include <unordered_map>
#include <variant>

namespace ddp::hostlist {
namespace {

// 18 digits always fit in uint64_t; longer numbers are refused rather than wrapped.
constexpr std::size_t kMaxDigits = 18;

struct Range {
  std::uint64_t lo = 0, hi = 0;
  std::size_t width = 0;  // zero padding, from the low end as written
};
struct Brackets {
  std::vector<Range> ranges;
  std::size_t size() const {
    std::size_t n = 0;
    for (const auto& r : ranges) n += static_cast<std::size_t>(r.hi - r.lo + 1);
    return n;
  }
};
using Segment = std::variant<std::string, Brackets>;
struct Item {
  std::vector<Segment> segments;
  std::size_t column = 0;
};

bool is_host_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
         c == '_' || c == ':' || c == '@';  // '@': "user@host" for SSH logins (parse_endpoint splits it)
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
// POSIX portable user names (and what useradd accepts by default): letters, digits, '.', '_', '-'.
bool is_user_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_';
}
bool is_space(char c) {
  return c == ' ' || c == '\t';
}

std::string describe(char c) {
  if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return "control character";
  return std::string("'") + c + "'";
}

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  std::optional<Error> parse(std::vector<Item>& items) {
    while (true) {
      skip_spaces();
      Item item;
      item.column = pos_ + 1;
      if (auto e = parse_item(item)) return e;
      if (item.segments.empty()) return fail(item.column, "expected a host name");
      items.push_back(std::move(item));
      skip_spaces();
      if (pos_ == s_.size()) return std::nullopt;
      if (s_[pos_] != ',') {
        if (s_[pos_] == ']') return fail(pos_ + 1, "unexpected ']' without a matching '['");
        return fail(pos_ + 1, "expected ',' or the end of the list, got " + describe(s_[pos_]));
      }
      ++pos_;
    }
  }

 private:
  static Error fail(std::size_t column, std::string message) { return Error{column, std::move(message)}; }

  void skip_spaces() {
    while (pos_ < s_.size() && is_space(s_[pos_])) ++pos_;
  }

  std::optional<Error> parse_item(Item& item) {
    std::string text;
    auto flush = [&] {
      if (!text.empty()) item.segments.emplace_back(std::move(text));
      text.clear();
    };
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c == ',' || is_space(c) || c == ']') break;
      if (c == '[') {
        auto close = s_.find(']', pos_);
        auto inner = s_.substr(pos_ + 1, close == std::string_view::npos ? std::string_view::npos : close - pos_ - 1);
        if (close != std::string_view::npos && inner.find(':') != std::string_view::npos &&
            inner.find_first_of("[,") == std::string_view::npos) {
          // IPv6 literal: kept verbatim, brackets included.
          text.append(s_.substr(pos_, close - pos_ + 1));
          pos_ = close + 1;
          continue;
        }
        flush();
        Brackets b;
        if (auto e = parse_brackets(b)) return e;
        item.segments.emplace_back(std::move(b));
        continue;
      }
      if (!is_host_char(c)) return fail(pos_ + 1, "unexpected " + describe(c) + " in a host name");
      text.push_back(c);
      ++pos_;
    }
    flush();
    return std::nullopt;
  }

  std::optional<Error> parse_number(std::uint64_t& value, std::size_t& digits) {
    std::size_t start = pos_;
    while (pos_ < s_.size() && is_digit(s_[pos_])) ++pos_;
    digits = pos_ - start;
    if (digits == 0) {
      if (pos_ == s_.size()) return fail(pos_ + 1, "expected a number, got the end of the list");
      return fail(pos_ + 1, "expected a number, got " + describe(s_[pos_]));
    }
    if (digits > kMaxDigits) return fail(start + 1, "number too long (at most 18 digits)");
    std::from_chars(s_.data() + start, s_.data() + pos_, value);
    return std::nullopt;
  }

  std::optional<Error> parse_brackets(Brackets& b) {
    std::size_t open = pos_;
    ++pos_;  // '['
    while (true) {
      std::size_t range_col = pos_ + 1;
      Range r;
      std::size_t digits = 0;
      if (auto e = parse_number(r.lo, digits)) return e;
      r.width = digits;
      r.hi = r.lo;
      if (pos_ < s_.size() && s_[pos_] == '-') {
        ++pos_;
        std::size_t hi_digits = 0;
        if (auto e = parse_number(r.hi, hi_digits)) return e;
        if (r.hi < r.lo) {
          return fail(range_col, "range " + std::to_string(r.lo) + "-" + std::to_string(r.hi) +
                                     " goes backwards (write the low end first)");
        }
      }
      b.ranges.push_back(r);
      if (pos_ == s_.size()) {
        return fail(pos_ + 1, "expected ']' to close the '[' at column " + std::to_string(open + 1));
      }
      if (s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (s_[pos_] == ']') {
        ++pos_;
        return std::nullopt;
      }
      return fail(pos_ + 1, "expected ']', got " + describe(s_[pos_]));
    }
  }

  std::string_view s_;
  std::size_t pos_ = 0;
};

std::string pad(std::uint64_t v, std::size_t width) {
  std::string digits = std::to_string(v);
  if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
  return digits;
}

// Size of one item, saturating at `cap + 1` so callers can compare without overflow.
std::size_t item_size(const Item& item, std::size_t cap) {
  std::size_t n = 1;
  for (const auto& seg : item.segments) {
    if (const auto* b = std::get_if<Brackets>(&seg)) {
      // Each range is at most 10^18 long: saturate before multiplying.
      std::uint64_t k = 0;
      for (const auto& r : b->ranges) {
        k += r.hi - r.lo + 1;
        if (k > cap) return cap + 1;
      }
      if (n > (cap + 1) / k + 1) return cap + 1;
      n *= static_cast<std::size_t>(k);
      if (n > cap) return cap + 1;
    }
  }
  return n;
}

void expand_item(const Item& item, std::size_t seg, std::string& prefix, std::vector<std::string>& out) {
  if (seg == item.segments.size()) {
    out.push_back(prefix);
    return;
  }
  const auto keep = prefix.size();
  if (const auto* text = std::get_if<std::string>(&item.segments[seg])) {
    prefix += *text;
    expand_item(item, seg + 1, prefix, out);
  } else {
    for (const auto& r : std::get<Brackets>(item.segments[seg]).ranges) {
      for (std::uint64_t v = r.lo;; ++v) {
        prefix.resize(keep);
        prefix += pad(v, r.width);
        expand_item(item, seg + 1, prefix, out);
        if (v == r.hi) break;
      }
    }
  }
  prefix.resize(keep);
}

}  // namespace

std::string Error::to_string() const {
  if (column == 0) return message;
  return message + " at column " + std::to_string(column);
}

Expansion expand(std::string_view list, const Options& options) {
  Expansion result;
  std::vector<Item> items;
  if (auto e = Parser(list).parse(items)) {
    result.error = std::move(e);
    return result;
  }
  std::size_t total = 0;
  for (const auto& item : items) {
    total += item_size(item, options.max_hosts);
    if (total > options.max_hosts) {
      result.error =
          Error{item.column, "host list expands to more than " + std::to_string(options.max_hosts) + " hosts"};
      return result;
    }
  }
  result.hosts.reserve(total);
  std::unordered_map<std::string, std::size_t> seen;
  for (const auto& item : items) {
    std::string prefix;
    auto before = result.hosts.size();
    expand_item(item, 0, prefix, result.hosts);
    if (options.allow_duplicates) continue;
    for (auto i = before; i < result.hosts.size(); ++i) {
      auto [it, fresh] = seen.emplace(result.hosts[i], i);
      if (!fresh) {
        result.error = Error{item.column, "host '" + result.hosts[i] + "' is listed twice (positions " +
                                              std::to_string(it->second + 1) + " and " + std::to_string(i + 1) + ")"};
        result.hosts.clear();
        return result;
      }
    }
  }
  return result;
}

std::optional<std::size_t> count(std::string_view list) {
  std::vector<Item> items;
  if (Parser(list).parse(items)) return std::nullopt;
  constexpr std::size_t cap = std::size_t(1) << 62;
  std::size_t total = 0;
  for (const auto& item : items) {
    total += item_size(item, cap);
    if (total > cap) return std::nullopt;
  }
  return total;
}

namespace {

// A host split around its last run of digits: prefix, number (as written), suffix.
struct Split {
  std::string_view prefix, digits, suffix;
  std::uint64_t value = 0;
};

std::optional<Split> split_number(std::string_view host) {
  if (host.find_first_of("[],") != std::string_view::npos) return std::nullopt;
  auto last = host.find_last_of("0123456789");
  if (last == std::string_view::npos) return std::nullopt;
  auto first = last;
  while (first > 0 && is_digit(host[first - 1])) --first;
  Split s{host.substr(0, first), host.substr(first, last - first + 1), host.substr(last + 1)};
  if (s.digits.size() > kMaxDigits) return std::nullopt;
  std::from_chars(s.digits.data(), s.digits.data() + s.digits.size(), s.value);
  return s;
}

}  // namespace

std::string compress(const std::vector<std::string>& hosts) {
  std::string out;
  auto emit = [&](std::string_view piece) {
    if (!out.empty()) out += ',';
    out += piece;
  };
  std::size_t i = 0;
  while (i < hosts.size()) {
    auto head = split_number(hosts[i]);
    if (!head) {
      emit(hosts[i++]);
      continue;
    }
    // Greedily take the following hosts with the same prefix and suffix, grouping consecutive
    // values written with the same padding into ranges.
    std::vector<Range> ranges;
    std::size_t j = i;
    while (j < hosts.size()) {
      auto s = split_number(hosts[j]);
      if (!s || s->prefix != head->prefix || s->suffix != head->suffix) break;
      if (!ranges.empty()) {
        auto& r = ranges.back();
        if (s->value == r.hi + 1 && pad(s->value, r.width) == s->digits) {
          r.hi = s->value;
          ++j;
          continue;
        }
      }
      ranges.push_back(Range{s->value, s->value, s->digits.size()});
      ++j;
    }
    if (j - i == 1) {
      emit(hosts[i]);
    } else {
      std::string piece(head->prefix);
      piece += '[';
      for (std::size_t k = 0; k < ranges.size(); ++k) {
        if (k) piece += ',';
        piece += pad(ranges[k].lo, ranges[k].width);
        if (ranges[k].hi != ranges[k].lo) {
          piece += '-';
          piece += pad(ranges[k].hi, ranges[k].width);
        }
      }
      piece += ']';
      piece += head->suffix;
      // Two lone singletons ("x20,x06") are shorter than their bracket ("x[20,06]").
      std::size_t plain = j - i - 1;
      for (auto k = i; k < j; ++k) plain += hosts[k].size();
      if (piece.size() <= plain) {
        emit(piece);
      } else {
        for (auto k = i; k < j; ++k) emit(hosts[k]);
      }
    }
    i = j;
  }
  return out;
}

EndpointParse parse_endpoint(std::string_view text) {
  EndpointParse r;
  std::size_t offset = 0;  // the length of "user@", so columns count in the whole text
  auto fail = [&](std::size_t col, std::string msg) {
    r.error = Error{col + offset, std::move(msg)};
    return r;
  };
  if (text.empty()) return fail(1, "expected a host name");
  if (auto at = text.find('@'); at != std::string_view::npos) {
    if (at == 0) return fail(1, "expected a user name before '@'");
    for (std::size_t k = 0; k < at; ++k) {
      if (!is_user_char(text[k])) return fail(k + 1, "unexpected " + describe(text[k]) + " in a user name");
    }
    r.endpoint.user = std::string(text.substr(0, at));
    text.remove_prefix(at + 1);
    offset = at + 1;
    if (text.empty()) return fail(1, "expected a host name after '@'");
  }
  std::string_view host, port;
  bool has_port = false;
  if (text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos) return fail(text.size() + 1, "expected ']' to close the IPv6 address");
    host = text.substr(1, close - 1);
    if (host.empty()) return fail(2, "expected an IPv6 address inside '[]'");
    auto rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return fail(close + 2, "expected ':' and a port after ']'");
      has_port = true;
      port = rest.substr(1);
    }
  } else {
    auto colon = text.find(':');
    if (colon != std::string_view::npos && text.find(':', colon + 1) != std::string_view::npos) {
      return fail(colon + 1, "an IPv6 address with a port must be written [addr]:port");
    }
    host = text.substr(0, colon);
    if (host.empty()) return fail(1, "expected a host name before ':'");
    for (std::size_t k = 0; k < host.size(); ++k) {
      if (host[k] == '@' || !is_host_char(host[k])) {
        return fail(k + 1, "unexpected " + describe(host[k]) + " in a host name");
      }
    }
    if (colon != std::string_view::npos) {
      has_port = true;
      port = text.substr(colon + 1);
    }
  }
  r.endpoint.host = std::string(host);
  if (has_port) {
    std::size_t col = text.size() - port.size() + 1;
    unsigned value = 0;
    auto [p, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (port.empty() || ec != std::errc() || p != port.data() + port.size() || value == 0 || value > 65535) {
      return fail(col, "expected a port number 1-65535");
    }
    r.endpoint.port = static_cast<std::uint16_t>(value);
  }
  return r;
}

}  // namespace ddp::hostlist

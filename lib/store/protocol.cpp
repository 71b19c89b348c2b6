// Decoder and encoders of the c10d TCPStore wire protocol (see protocol.hpp for the policy).
#include "store/protocol.hpp"

#include <array>
#include <bit>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace ddp::store {
namespace {

// Wire numbering, indexed by opcode (docs/store-protocol.md: each release's enum, with its source).
// PyTorch 1.13 and 2.0: TCPStore.cpp's QueryType.
constexpr std::array kV1Ops{
    Op::set, Op::compare_set, Op::get, Op::add, Op::check, Op::wait, Op::get_num_keys, Op::watch_key, Op::delete_key,
};
// PyTorch 2.1: WATCH_KEY removed (pytorch#105014), APPEND..CANCEL_WAIT after DELETE_KEY, no VALIDATE yet.
constexpr std::array kV21Ops{
    Op::set,          Op::compare_set, Op::get,    Op::add,       Op::check,     Op::wait,
    Op::get_num_keys, Op::delete_key,  Op::append, Op::multi_get, Op::multi_set, Op::cancel_wait,
};
// What 1.13, 2.0 and 2.1 number alike.
constexpr std::size_t kLegacyShared = 7;
// PyTorch 2.2 and later (TCPStoreBackend.hpp): append-only since VALIDATE came (pytorch#107607).
constexpr std::array kV2Ops{
    Op::validate,     Op::set,        Op::compare_set, Op::get,       Op::add,       Op::check,       Op::wait,
    Op::get_num_keys, Op::delete_key, Op::append,      Op::multi_get, Op::multi_set, Op::cancel_wait, Op::ping,
    Op::queue_push,   Op::queue_pop,  Op::queue_len,   Op::list_keys, Op::barrier,
};

constexpr uint8_t kMagicBytes[4] = {0xCE, 0xF7, 0x85, 0x3C};  // kValidateMagic, little-endian

enum class Kind : uint8_t { none, key, value, value2, number, word, batch_keys, batch_pairs };

// The arguments of each operation after its opcode byte, in wire order.
struct Shape {
  Kind a = Kind::none, b = Kind::none, c = Kind::none;
};

Shape shape_of(Op op) {
  switch (op) {
    case Op::validate:
    case Op::ping:
      return {Kind::word};
    case Op::set:
    case Op::append:
    case Op::queue_push:
      return {Kind::key, Kind::value};
    case Op::compare_set:
      return {Kind::key, Kind::value, Kind::value2};
    case Op::get:
    case Op::watch_key:
    case Op::delete_key:
    case Op::queue_pop:
    case Op::queue_len:
      return {Kind::key};
    case Op::add:
    case Op::barrier:
      return {Kind::key, Kind::number};
    case Op::check:
    case Op::wait:
    case Op::multi_get:
      return {Kind::batch_keys};
    case Op::multi_set:
      return {Kind::batch_pairs};
    case Op::get_num_keys:
    case Op::cancel_wait:
    case Op::list_keys:
      return {};
  }
  return {};
}

Kind kind_at(const Shape& s, uint8_t i) {
  return i == 0 ? s.a : i == 1 ? s.b : i == 2 ? s.c : Kind::none;
}

// Bookkeeping cost of one batch entry beyond its bytes (a std::string header).
constexpr std::size_t kItemOverhead = sizeof(std::string);

}  // namespace

std::string_view to_string(Protocol p) {
  switch (p) {
    case Protocol::unknown:
      return "unknown";
    case Protocol::legacy:
      return "1.13–2.1";
    case Protocol::v1:
      return "1.13–2.0";
    case Protocol::v21:
      return "2.1";
    case Protocol::v2:
      return "2.2+";
  }
  return "?";
}

std::optional<Release> parse_release(std::string_view v) {
  auto number = [&v]() -> std::optional<int> {
    std::size_t n = 0;
    int value = 0;
    while (n < v.size() && n < 4 && v[n] >= '0' && v[n] <= '9') value = value * 10 + (v[n++] - '0');
    if (n == 0 || (n < v.size() && v[n] >= '0' && v[n] <= '9')) return std::nullopt;
    v.remove_prefix(n);
    return value;
  };
  auto major = number();
  if (!major || v.empty() || v.front() != '.') return std::nullopt;
  v.remove_prefix(1);
  auto minor = number();
  if (!minor) return std::nullopt;
  if (!v.empty() && v.front() != '.' && v.front() != '+' && v.front() != 'a' && v.front() != 'r' && v.front() != 'b' &&
      v.front() != 'd')
    return std::nullopt;  // "2.1x": not a version
  Release r{*major, *minor};
  if (r < Release{1, 13} || r.major > 2) return std::nullopt;
  return r;
}

Protocol layout_of(Release r) {
  if (r < Release{2, 1}) return Protocol::v1;
  if (r == Release{2, 1}) return Protocol::v21;
  return Protocol::v2;
}

LegacyHint legacy_hint(std::string_view store_protocol, const std::optional<std::string>& torch_version) {
  if (!store_protocol.empty() && store_protocol != "auto") {
    if (auto r = parse_release(store_protocol)) {
      return {layout_of(*r), "store.protocol " + std::string(store_protocol)};
    }
    return {Protocol::unknown, "store.protocol " + std::string(store_protocol) + " (not a release from 1.13 on)"};
  }
  if (torch_version) {
    if (auto r = parse_release(*torch_version)) return {layout_of(*r), "the job's PyTorch " + *torch_version};
    return {Protocol::unknown, "the job's PyTorch " + *torch_version + " (not a release ddpctl knows)"};
  }
  return {Protocol::unknown, "the job's PyTorch is not known"};
}

std::string_view to_string(Op op) {
  static constexpr std::array<std::string_view, 20> names{
      "VALIDATE",   "SET",        "COMPARE_SET", "GET",       "ADD",       "CHECK",     "WAIT",
      "GETNUMKEYS", "WATCH_KEY",  "DELETE_KEY",  "APPEND",    "MULTI_GET", "MULTI_SET", "CANCEL_WAIT",
      "PING",       "QUEUE_PUSH", "QUEUE_POP",   "QUEUE_LEN", "LIST_KEYS", "BARRIER"};
  auto i = static_cast<std::size_t>(op);
  return i < names.size() ? names[i] : "?";
}

namespace {
// What a cleared Request keeps for the next one: small buffers, so that a connection's next
// request is decoded without allocating; a large one (a 64 MiB value, a million keys) is let go.
constexpr std::size_t kKeepBytes = 128;  // PyTorch's keys and small values
constexpr std::size_t kKeepItems = 4;    // a WAIT's keys, most often one

void clear_keeping_small(std::string& s) {
  if (s.capacity() > kKeepBytes) {
    std::string().swap(s);
  } else {
    s.clear();
  }
}

void clear_keeping_small(std::vector<std::string>& v) {
  if (v.capacity() > kKeepItems) {
    std::vector<std::string>().swap(v);
  } else {
    v.clear();
  }
}
}  // namespace

void Request::clear() {
  op = Op::set;
  clear_keeping_small(key);
  clear_keeping_small(value);
  clear_keeping_small(value2);
  clear_keeping_small(keys);
  clear_keeping_small(values);
  number = 0;
  word = 0;
}

int opcode_of(Protocol p, Op op) {
  auto find = [op](const auto& table) {
    for (std::size_t i = 0; i < table.size(); ++i) {
      if (table[i] == op) return static_cast<int>(i);
    }
    return -1;
  };
  switch (p) {
    case Protocol::legacy: {
      const int code = find(kV1Ops);
      return code < static_cast<int>(kLegacyShared) ? code : -1;
    }
    case Protocol::v1:
      return find(kV1Ops);
    case Protocol::v21:
      return find(kV21Ops);
    case Protocol::v2:
      return find(kV2Ops);
    case Protocol::unknown:
      break;
  }
  return -1;
}

// ---------------------------------------------------------------------------------------------
// Decoder

Decoder::Decoder(Limits limits, LegacyHint hint)
    : limits_(limits), hint_(std::move(hint)), budget_(limits.max_connection_bytes) {}

bool Decoder::fail(std::string message) {
  error_ = std::move(message);
  return false;
}

// A connection without VALIDATE at an opcode beyond the shared 0..6: its bytes decide (9..11
// exist only in 2.1), else the hint does (7, 8), else it is refused.
bool Decoder::resolve_legacy(uint8_t opcode) {
  if (opcode < kLegacyShared) return true;
  if (opcode >= 9 && opcode < kV21Ops.size()) {
    protocol_ = Protocol::v21;
    return true;
  }
  if (opcode != 7 && opcode != 8) {
    return fail("unknown opcode " + std::to_string(opcode) +
                ": no PyTorch release numbers an operation so (this client sent no VALIDATE, so it is 1.13–2.1, "
                "whose opcodes end at 11)");
  }
  const std::string what = opcode == 7 ? "opcode 7 is WATCH_KEY in PyTorch 1.13 and 2.0 but DELETE_KEY in 2.1"
                                       : "opcode 8 is DELETE_KEY in PyTorch 1.13 and 2.0 but APPEND in 2.1";
  const std::string fix =
      "set the job's release in the job file: store: {protocol: \"1.13\"} (for 1.13 or 2.0) or store: {protocol: "
      "\"2.1\"}";
  switch (hint_.layout) {
    case Protocol::v1:
    case Protocol::v21:
      protocol_ = hint_.layout;
      return true;
    case Protocol::v2:
      return fail(what + ", and this client sent no VALIDATE (2.2 and later do), so it is not the job's release (" +
                  hint_.source + "); run the job's clients with that PyTorch, or " + fix);
    default:
      return fail(what +
                  "; this client sent no VALIDATE (2.2 and later do), so which one it is cannot be told "
                  "from its bytes, and " +
                  (hint_.source.empty() ? std::string("the job's PyTorch is not known") : hint_.source) + ": " + fix +
                  " (ddpctl store serve: --protocol 1.13 or 2.1)");
  }
}

bool Decoder::begin_request(uint8_t opcode) {
  held_ = 0;  // cur_ is clear: since construction, the last request, or the detect stage
  step_ = 0;
  items_left_ = 0;
  field_ = Field::none;
  if (protocol_ == Protocol::legacy && !resolve_legacy(opcode)) return false;
  if (protocol_ == Protocol::legacy) {
    cur_.op = kV1Ops[opcode];  // 0..6 (resolve_legacy): the same in 1.13, 2.0 and 2.1
  } else if (protocol_ == Protocol::v1 && opcode < kV1Ops.size()) {
    cur_.op = kV1Ops[opcode];
  } else if (protocol_ == Protocol::v21 && opcode < kV21Ops.size()) {
    cur_.op = kV21Ops[opcode];
  } else if (protocol_ == Protocol::v2 && opcode < kV2Ops.size()) {
    cur_.op = kV2Ops[opcode];
  } else {
    std::string msg = "unknown opcode " + std::to_string(opcode) + " for PyTorch " + std::string(to_string(protocol_));
    if (protocol_ == Protocol::v1 && opcode >= 9 && opcode < kV21Ops.size()) {
      msg += " (read so from " + hint_.source + "); it is " + std::string(to_string(kV21Ops[opcode])) +
             " in PyTorch 2.1: if the job runs 2.1, set store: {protocol: \"2.1\"} in the job file";
    }
    return fail(msg);
  }
  return after_field();
}

std::size_t Decoder::max_len_for(Field f) const {
  return (f == Field::key || f == Field::keys_item) ? limits_.max_key_bytes : limits_.max_value_bytes;
}

std::string* Decoder::bytes_target() {
  switch (field_) {
    case Field::key:
      return &cur_.key;
    case Field::value:
      return &cur_.value;
    case Field::value2:
      return &cur_.value2;
    case Field::keys_item:
      return &cur_.keys.back();
    case Field::values_item:
      return &cur_.values.back();
    default:
      return nullptr;
  }
}

bool Decoder::start_integer(Stage s, Field f) {
  stage_ = s;
  field_ = f;
  have_ = 0;
  return true;
}

bool Decoder::start_bytes(Field f) {
  if (f == Field::keys_item) cur_.keys.emplace_back();
  if (f == Field::values_item) cur_.values.emplace_back();
  stage_ = Stage::len;
  field_ = f;
  have_ = 0;
  return true;
}

// Sets up the next field of the current request, or marks it complete.
bool Decoder::after_field() {
  Shape shape = shape_of(cur_.op);
  Kind kind = kind_at(shape, step_);
  if (kind != Kind::none) {
    ++step_;
    switch (kind) {
      case Kind::key:
        return start_bytes(Field::key);
      case Kind::value:
        return start_bytes(Field::value);
      case Kind::value2:
        return start_bytes(Field::value2);
      case Kind::number:
        return start_integer(Stage::i64, Field::number);
      case Kind::word:
        return start_integer(Stage::u32, Field::word);
      case Kind::batch_keys:
      case Kind::batch_pairs:
        return start_integer(Stage::count, Field::count);
      case Kind::none:
        break;
    }
  }
  if (cur_.op == Op::multi_set && field_ == Field::keys_item) return start_bytes(Field::values_item);
  if (items_left_ > 0) {
    --items_left_;
    return start_bytes(Field::keys_item);
  }
  done_ = true;
  stage_ = Stage::opcode;
  field_ = Field::none;
  return true;
}

Decoder::Status Decoder::next(std::span<const uint8_t>& in, Request& out) {
  const Status s = next(in);
  if (s == Status::request) out = std::move(cur_);
  return s;
}

Decoder::Status Decoder::next(std::span<const uint8_t>& in) {
  if (!error_.empty()) return Status::error;
  if (std::exchange(handed_out_, false)) cur_.clear();
  for (;;) {
    if (done_) {
      done_ = false;
      handed_out_ = true;
      held_ = 0;
      return Status::request;
    }
    if (in.empty()) return Status::need_more;

    bool ok = true;
    switch (stage_) {
      case Stage::detect: {
        uint8_t b = in.front();
        in = in.subspan(1);
        if (have_ == 0 && b != 0x00) {
          protocol_ = Protocol::legacy;
          ok = begin_request(b);
          break;
        }
        if (have_ == 0 || b == kMagicBytes[have_ - 1]) {
          scratch_[have_++] = b;
          if (have_ == 5) {  // 00 CE F7 85 3C: a 2.x VALIDATE
            protocol_ = Protocol::v2;
            cur_.op = Op::validate;
            cur_.word = kValidateMagic;
            done_ = true;
            stage_ = Stage::opcode;
            have_ = 0;
          }
          break;
        }
        // A 0x00 not followed by the magic: a SET of 1.13–2.1. Replay what we held through it (a SET
        // needs at least 17 bytes, so no request can complete inside these 5).
        uint8_t held[5];
        std::size_t n = 0;
        for (uint8_t i = 1; i < have_; ++i) held[n++] = scratch_[i];
        held[n++] = b;
        have_ = 0;
        protocol_ = Protocol::legacy;
        ok = begin_request(0x00);
        if (ok) {
          std::span<const uint8_t> replay(held, n);
          ok = next(replay) != Status::error;
        }
        break;
      }
      case Stage::opcode: {
        uint8_t b = in.front();
        in = in.subspan(1);
        ok = begin_request(b);
        break;
      }
      case Stage::u32:
      case Stage::i64:
      case Stage::len:
      case Stage::count: {
        const uint8_t width = stage_ == Stage::u32 ? 4 : 8;
        const uint8_t* p;
        if (have_ == 0 && in.size() >= width) {  // whole in the input: read in place
          p = in.data();
          in = in.subspan(width);
        } else {
          std::size_t take = std::min<std::size_t>(width - have_, in.size());
          for (std::size_t i = 0; i < take; ++i) scratch_[have_++] = in[i];
          in = in.subspan(take);
          if (have_ < width) break;
          have_ = 0;
          p = scratch_;
        }
        if (stage_ == Stage::u32) {
          cur_.word = get_u32(p);
          ok = after_field();
        } else if (stage_ == Stage::i64) {
          cur_.number = static_cast<int64_t>(get_u64(p));
          ok = after_field();
        } else if (stage_ == Stage::count) {
          uint64_t n = get_u64(p);
          if (n > limits_.max_batch_keys) {
            ok = fail(std::string(to_string(cur_.op)) + " of " + std::to_string(n) + " keys exceeds the limit of " +
                      std::to_string(limits_.max_batch_keys));
            break;
          }
          const std::size_t per_item = cur_.op == Op::multi_set ? 2 * kItemOverhead : kItemOverhead;
          if (held_ + n * per_item > budget_) {
            ok = fail(std::string(to_string(cur_.op)) + " of " + std::to_string(n) +
                      " keys exceeds the connection's memory cap of " + std::to_string(budget_) + " bytes");
            break;
          }
          held_ += n * per_item;
          items_left_ = n;
          ok = after_field();
        } else {  // len
          uint64_t n = get_u64(p);
          const std::size_t max = max_len_for(field_);
          const bool is_key = field_ == Field::key || field_ == Field::keys_item;
          if (n > max) {
            ok = fail(std::string(to_string(cur_.op)) + (is_key ? " key" : " value") + " of " + std::to_string(n) +
                      " bytes exceeds the limit of " + std::to_string(max));
            break;
          }
          if (held_ + n > budget_) {
            ok = fail(std::string(to_string(cur_.op)) + " would hold " + std::to_string(held_ + n) +
                      " bytes, more than the connection's memory cap of " + std::to_string(budget_));
            break;
          }
          held_ += n;
          remaining_ = n;
          if (n == 0) {
            ok = after_field();
          } else {
            // All at once, as counted: grown as it comes, a string can take twice what it holds.
            bytes_target()->reserve(n);
            stage_ = Stage::bytes;
          }
        }
        break;
      }
      case Stage::bytes: {
        std::size_t take = std::min<uint64_t>(remaining_, in.size());
        bytes_target()->append(reinterpret_cast<const char*>(in.data()), take);
        in = in.subspan(take);
        remaining_ -= take;
        if (remaining_ == 0) ok = after_field();
        break;
      }
    }
    if (!ok) return Status::error;
  }
}

// ---------------------------------------------------------------------------------------------
// Encoders

void put_u8(std::string& out, uint8_t v) {
  out.push_back(static_cast<char>(v));
}

void put_u32(std::string& out, uint32_t v) {
  if constexpr (std::endian::native != std::endian::little) v = __builtin_bswap32(v);
  char b[sizeof v];
  std::memcpy(b, &v, sizeof v);
  out.append(b, sizeof b);
}

void put_u64(std::string& out, uint64_t v) {
  if constexpr (std::endian::native != std::endian::little) v = __builtin_bswap64(v);
  char b[sizeof v];
  std::memcpy(b, &v, sizeof v);
  out.append(b, sizeof b);
}

void put_i64(std::string& out, int64_t v) {
  put_u64(out, static_cast<uint64_t>(v));
}

void put_bytes(std::string& out, std::string_view bytes) {
  put_u64(out, bytes.size());
  out.append(bytes);
}

uint32_t get_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return std::endian::native == std::endian::little ? v : __builtin_bswap32(v);
}

uint64_t get_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return std::endian::native == std::endian::little ? v : __builtin_bswap64(v);
}

std::string encode_request(Protocol p, const Request& r) {
  int code = opcode_of(p, r.op);
  if (code < 0) {
    throw std::invalid_argument(std::string(to_string(r.op)) + " does not exist in the " + std::string(to_string(p)) +
                                " protocol");
  }
  std::string out;
  put_u8(out, static_cast<uint8_t>(code));
  Shape shape = shape_of(r.op);
  for (uint8_t i = 0; i < 3; ++i) {
    switch (kind_at(shape, i)) {
      case Kind::none:
        break;
      case Kind::key:
        put_bytes(out, r.key);
        break;
      case Kind::value:
        put_bytes(out, r.value);
        break;
      case Kind::value2:
        put_bytes(out, r.value2);
        break;
      case Kind::number:
        put_i64(out, r.number);
        break;
      case Kind::word:
        put_u32(out, r.word);
        break;
      case Kind::batch_keys:
        put_u64(out, r.keys.size());
        for (const auto& k : r.keys) put_bytes(out, k);
        break;
      case Kind::batch_pairs:
        if (r.keys.size() != r.values.size()) throw std::invalid_argument("MULTI_SET keys/values differ in length");
        put_u64(out, r.keys.size());
        for (std::size_t j = 0; j < r.keys.size(); ++j) {
          put_bytes(out, r.keys[j]);
          put_bytes(out, r.values[j]);
        }
        break;
    }
  }
  return out;
}

}  // namespace ddp::store

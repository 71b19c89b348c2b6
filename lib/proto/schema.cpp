// Loads the embedded schema once and validates messages against it; see schema.hpp.
#include "proto/schema.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>

#include "common/json_parse.hpp"
#include "common/strings.hpp"
#include "common/text.hpp"
#include "proto/schema_data.hpp"

namespace ddp::proto {
namespace {

enum class FieldType { string, hex, int_, uint, boolean, object, string_array, uint_array, object_array };

struct FieldSpec {
  FieldType type = FieldType::string;
  bool required = false;
  std::optional<std::size_t> max_len, max_items, bytes;
  std::optional<std::uint64_t> max;
  std::vector<std::string> allowed;  // enum
};

struct MessageSpec {
  Phase phase = Phase::session;
  std::vector<std::string> from;
  std::map<std::string, FieldSpec, std::less<>> fields;
};

struct Schema {
  Limits limits;
  std::map<std::string, MessageSpec, std::less<>> messages;
};

FieldType field_type(const std::string& name) {
  static const std::map<std::string, FieldType> kTypes{{"string", FieldType::string},
                                                       {"hex", FieldType::hex},
                                                       {"int", FieldType::int_},
                                                       {"uint", FieldType::uint},
                                                       {"bool", FieldType::boolean},
                                                       {"object", FieldType::object},
                                                       {"string[]", FieldType::string_array},
                                                       {"uint[]", FieldType::uint_array},
                                                       {"object[]", FieldType::object_array}};
  auto it = kTypes.find(name);
  if (it == kTypes.end()) throw std::logic_error("proto/messages.json: unknown field type '" + name + "'");
  return it->second;
}

std::string_view type_name(FieldType t) {
  switch (t) {
    case FieldType::string:
      return "a string";
    case FieldType::hex:
      return "a hex string";
    case FieldType::int_:
      return "an integer";
    case FieldType::uint:
      return "an unsigned integer";
    case FieldType::boolean:
      return "a boolean";
    case FieldType::object:
      return "an object";
    case FieldType::string_array:
      return "an array of strings";
    case FieldType::uint_array:
      return "an array of unsigned integers";
    case FieldType::object_array:
      return "an array of objects";
  }
  return "?";
}

std::string json_kind(const nlohmann::json& j) {
  if (j.is_number_unsigned()) return "an unsigned integer";
  if (j.is_number_integer()) return "an integer";
  if (j.is_number_float()) return "a floating-point number";
  return std::string(j.type_name()) == "array" || std::string(j.type_name()) == "object"
             ? std::string("an ") + j.type_name()
             : std::string("a ") + j.type_name();
}

// The schema is part of the build: a malformed one is a programming error, found by the first
// test that touches it.
Schema load() {
  const auto& raw = generated::kSchemaJson;
  auto doc = nlohmann::json::parse(std::string_view(reinterpret_cast<const char*>(raw), sizeof raw));
  Schema s;
  s.limits.min_version = doc.at("versions").at("min").get<std::uint32_t>();
  s.limits.max_version = doc.at("versions").at("max").get<std::uint32_t>();
  const auto& lim = doc.at("limits");
  s.limits.max_frame_bytes = lim.at("max_frame_bytes").get<std::size_t>();
  s.limits.max_handshake_frame_bytes = lim.at("max_handshake_frame_bytes").get<std::size_t>();
  s.limits.max_json_depth = lim.at("max_json_depth").get<std::size_t>();
  if (s.limits.max_json_depth > kJsonMaxDepth)
    throw std::logic_error("proto/messages.json: max_json_depth above " + std::to_string(kJsonMaxDepth));
  for (const auto& [name, m] : doc.at("messages").items()) {
    MessageSpec spec;
    const auto phase = m.at("phase").get<std::string>();
    spec.phase = phase == "handshake" ? Phase::handshake : phase == "any" ? Phase::any : Phase::session;
    spec.from = m.at("from").get<std::vector<std::string>>();
    for (const auto& [fname, f] : m.at("fields").items()) {
      FieldSpec fs;
      fs.type = field_type(f.at("type").get<std::string>());
      fs.required = f.at("required").get<bool>();
      if (f.contains("max_len")) fs.max_len = f["max_len"].get<std::size_t>();
      if (f.contains("max_items")) fs.max_items = f["max_items"].get<std::size_t>();
      if (f.contains("bytes")) fs.bytes = f["bytes"].get<std::size_t>();
      if (f.contains("max")) fs.max = f["max"].get<std::uint64_t>();
      if (f.contains("enum")) fs.allowed = f["enum"].get<std::vector<std::string>>();
      if (fname == "type" || fname == "v") throw std::logic_error("proto/messages.json: '" + fname + "' is reserved");
      spec.fields.emplace(fname, std::move(fs));
    }
    s.messages.emplace(name, std::move(spec));
  }
  // read_plain_heartbeat() knows the heartbeat's fields by heart: the schema must say the same.
  const auto hb = s.messages.find("heartbeat");
  if (hb == s.messages.end() || hb->second.phase != Phase::session || hb->second.fields.size() != 3 ||
      std::any_of(hb->second.fields.begin(), hb->second.fields.end(), [](const auto& f) {
        return (f.first != "now_us" && f.first != "rx_us" && f.first != "t0_us") || f.second.type != FieldType::int_ ||
               f.second.required;
      })) {
    throw std::logic_error("proto/messages.json: 'heartbeat' is not what read_plain_heartbeat() reads");
  }
  return s;
}

const Schema& schema() {
  static const Schema s = load();
  return s;
}

ProtoError err(ErrorCode code, std::string message, std::string field = "") {
  return ProtoError{code, std::move(message), std::move(field), ""};
}

// What a message says for itself (its type, a field's name or value), as an error's words show
// it: the error becomes a reason in our log and the 'error' frame back, and before
// authentication anyone writes it. No control characters or escapes (the JSON reader takes
// \u001b, \r, \n), and short.
std::string peer_words(std::string_view s) {
  return clean_text(s, 64);
}

bool is_uint(const nlohmann::json& j) {
  return j.is_number_unsigned() || (j.is_number_integer() && j.get<std::int64_t>() >= 0);
}

bool is_lower_hex(const std::string& s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return s.size() % 2 == 0;
}

bool allowed_from(const MessageSpec& spec, const Sender& sender) {
  for (const auto& f : spec.from) {
    if (f == sender.side || (!sender.role.empty() && f == sender.role)) return true;
  }
  return false;
}

// A JSON integer in its shortest form ("-0" and leading zeros are not), at s[i]: its value when it
// is within [-neg_max, pos_max], moving i past it.
std::optional<std::int64_t> plain_integer(std::string_view s, std::size_t& i, std::uint64_t pos_max,
                                          std::uint64_t neg_max) {
  std::size_t j = i;
  const bool neg = j < s.size() && s[j] == '-';
  if (neg) ++j;
  const std::size_t first = j;
  std::uint64_t mag = 0;
  for (; j < s.size() && s[j] >= '0' && s[j] <= '9'; ++j) {
    if (j - first == 19) return std::nullopt;  // 20 digits: past every 64-bit integer we take
    mag = mag * 10 + static_cast<std::uint64_t>(s[j] - '0');
  }
  if (j == first || (s[first] == '0' && (j - first > 1 || neg))) return std::nullopt;
  if (mag > (neg ? neg_max : pos_max)) return std::nullopt;
  i = j;
  // Two's complement: the negation of a magnitude up to 2^63 wraps to the value meant.
  return neg ? static_cast<std::int64_t>(0 - mag) : static_cast<std::int64_t>(mag);
}

std::optional<ProtoError> check_field(std::string_view msg, const std::string& name, const FieldSpec& f,
                                      const nlohmann::json& v) {
  // The field's name for a message, built only on the error path: every frame in and out goes
  // through here, and the string would be an allocation per field.
  auto where = [&] {
    std::string w = "'";  // built with += : GCC 12 flags "'" + std::string(...) with a bogus -Wrestrict
    w += msg;
    w += '.';
    w += name;
    w += '\'';
    return w;
  };
  auto wrong = [&] {
    return err(ErrorCode::wrong_type, where() + " must be " + std::string(type_name(f.type)) + ", got " + json_kind(v),
               name);
  };
  switch (f.type) {
    case FieldType::string:
    case FieldType::hex: {
      if (!v.is_string()) return wrong();
      const auto& s = v.get_ref<const std::string&>();
      if (f.max_len && s.size() > *f.max_len) {
        return err(
            ErrorCode::bad_value,
            where() + " is " + std::to_string(s.size()) + " bytes, at most " + std::to_string(*f.max_len) + " allowed",
            name);
      }
      if (!f.allowed.empty() && std::find(f.allowed.begin(), f.allowed.end(), s) == f.allowed.end()) {
        return err(ErrorCode::bad_value,
                   where() + " must be one of " + join(f.allowed, ", ") + ", got '" + peer_words(s) + "'", name);
      }
      if (f.type == FieldType::hex) {
        if (!is_lower_hex(s)) return err(ErrorCode::bad_value, where() + " must be lower-case hex", name);
        if (f.bytes && s.size() != *f.bytes * 2) {
          return err(ErrorCode::bad_value,
                     where() + " must be " + std::to_string(*f.bytes) + " bytes (" + std::to_string(*f.bytes * 2) +
                         " hex digits), got " + std::to_string(s.size()) + " digits",
                     name);
        }
      }
      return std::nullopt;
    }
    case FieldType::int_:
      if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<std::uint64_t>() > std::uint64_t(INT64_MAX))) {
        return wrong();
      }
      return std::nullopt;
    case FieldType::uint:
      if (!is_uint(v)) return wrong();
      if (f.max && v.get<std::uint64_t>() > *f.max) {
        return err(ErrorCode::bad_value,
                   where() + " is " + std::to_string(v.get<std::uint64_t>()) + ", at most " + std::to_string(*f.max) +
                       " allowed",
                   name);
      }
      return std::nullopt;
    case FieldType::boolean:
      if (!v.is_boolean()) return wrong();
      return std::nullopt;
    case FieldType::object:
      if (!v.is_object()) return wrong();
      return std::nullopt;
    case FieldType::string_array:
    case FieldType::uint_array:
    case FieldType::object_array: {
      if (!v.is_array()) return wrong();
      if (f.max_items && v.size() > *f.max_items) {
        return err(ErrorCode::bad_value,
                   where() + " has " + std::to_string(v.size()) + " items, at most " + std::to_string(*f.max_items) +
                       " allowed",
                   name);
      }
      for (std::size_t i = 0; i < v.size(); ++i) {
        bool good = f.type == FieldType::string_array ? v[i].is_string()
                    : f.type == FieldType::uint_array ? is_uint(v[i])
                                                      : v[i].is_object();
        if (!good) {
          return err(ErrorCode::wrong_type,
                     where() + " item " + std::to_string(i) + " must be " +
                         (f.type == FieldType::string_array ? "a string"
                          : f.type == FieldType::uint_array ? "an unsigned integer"
                                                            : "an object") +
                         ", got " + json_kind(v[i]),
                     name);
        }
      }
      return std::nullopt;
    }
  }
  return std::nullopt;
}

}  // namespace

const Limits& limits() {
  return schema().limits;
}

std::string_view schema_text() {
  const auto& raw = generated::kSchemaJson;
  return {reinterpret_cast<const char*>(raw), sizeof raw};
}

std::vector<std::string> message_types() {
  std::vector<std::string> out;
  for (const auto& [name, spec] : schema().messages) out.push_back(name);
  return out;
}

std::optional<Phase> phase_of(std::string_view type) {
  auto it = schema().messages.find(type);
  if (it == schema().messages.end()) return std::nullopt;
  return it->second.phase;
}

std::optional<ProtoError> validate(const nlohmann::json& m, const Sender& sender) {
  if (!m.is_object()) return err(ErrorCode::bad_json, "a message must be a JSON object, got " + json_kind(m));
  auto t = m.find("type");
  if (t == m.end()) return err(ErrorCode::missing_field, "message has no 'type'", "type");
  if (!t->is_string()) return err(ErrorCode::wrong_type, "'type' must be a string, got " + json_kind(*t), "type");
  const auto& type = t->get_ref<const std::string&>();
  auto v = m.find("v");
  if (v == m.end()) {
    return err(ErrorCode::missing_field, "message '" + peer_words(type) + "' has no 'v' (protocol version)", "v");
  }
  if (!is_uint(*v) || v->get<std::uint64_t>() > UINT32_MAX) {
    return err(ErrorCode::wrong_type, "'v' must be an unsigned integer, got " + json_kind(*v), "v");
  }
  const auto& s = schema();
  auto it = s.messages.find(type);
  if (it == s.messages.end()) {
    auto e = err(ErrorCode::unknown_type, "unknown message type '" + peer_words(type) + "'", "type");
    if (auto near = nearest(type, message_types())) e.hint = "did you mean '" + *near + "'?";
    return e;
  }
  const auto& spec = it->second;
  if (!allowed_from(spec, sender)) {
    return err(ErrorCode::wrong_sender, "'" + type + "' may only be sent by " + join(spec.from, ", ") + ", not by " +
                                            (sender.role.empty() ? "the " + sender.side : "a " + sender.role));
  }
  // The message's keys and the spec's fields are both sorted (std::map, the same order): one
  // walk over both finds each field's value and every unknown key. Errors keep their order: the
  // first bad or missing field in the spec's order, then the first unknown key.
  const std::string* unknown = nullptr;
  const auto& obj = m.get_ref<const nlohmann::json::object_t&>();
  auto mit = obj.begin();
  for (const auto& [name, f] : spec.fields) {
    for (; mit != obj.end() && mit->first < name; ++mit) {
      if (!unknown && mit->first != "type" && mit->first != "v") unknown = &mit->first;
    }
    if (mit == obj.end() || mit->first != name) {
      if (f.required)
        return err(ErrorCode::missing_field, "'" + type + "' is missing required field '" + name + "'", name);
      continue;
    }
    if (auto e = check_field(type, name, f, mit->second)) return e;
    ++mit;
  }
  for (; !unknown && mit != obj.end(); ++mit) {
    if (mit->first != "type" && mit->first != "v") unknown = &mit->first;
  }
  if (unknown) {
    const auto& name = *unknown;
    auto e =
        err(ErrorCode::unknown_field, "'" + type + "' has unknown field '" + peer_words(name) + "'", peer_words(name));
    std::vector<std::string> known;
    for (const auto& [k, f] : spec.fields) known.push_back(k);
    if (auto near = nearest(name, known)) e.hint = "did you mean '" + *near + "'?";
    return e;
  }
  return std::nullopt;
}

std::optional<Message> read_plain_heartbeat(std::string_view s) {
  constexpr std::uint64_t kMax = INT64_MAX, kMinMagnitude = std::uint64_t(INT64_MAX) + 1;
  std::size_t i = 0;
  auto literal = [&](std::string_view t) {
    if (s.substr(i, t.size()) != t) return false;
    i += t.size();
    return true;
  };
  Message m;
  if (!literal("{")) return std::nullopt;
  // Each optional field, in dump()'s order; every one is followed by a comma ("type" comes after).
  for (auto [key, field] : {std::pair{std::string_view("\"now_us\":"), &Beat::now_us},
                            std::pair{std::string_view("\"rx_us\":"), &Beat::rx_us},
                            std::pair{std::string_view("\"t0_us\":"), &Beat::t0_us}}) {
    if (!literal(key)) continue;
    auto value = plain_integer(s, i, kMax, kMinMagnitude);
    if (!value || !literal(",")) return std::nullopt;
    m.beat.*field = *value;
  }
  if (!literal(R"("type":"heartbeat","v":)")) return std::nullopt;
  auto v = plain_integer(s, i, UINT32_MAX, 0);
  if (!v || !literal("}") || i != s.size()) return std::nullopt;
  m.type = "heartbeat";
  m.version = static_cast<std::uint32_t>(*v);
  return m;
}

Parsed parse_message(std::string_view json_bytes, const Sender& sender) {
  Parsed p;
  // The beat every node sends every interval, as our encoders write it: no DOM. The schema's
  // heartbeat is checked against what this reads when it is loaded.
  if (auto beat = read_plain_heartbeat(json_bytes)) {
    static const MessageSpec& spec = schema().messages.find("heartbeat")->second;
    if (allowed_from(spec, sender)) {
      p.message = std::move(*beat);
      return p;
    }
  }
  auto read = parse_json(json_bytes, limits().max_json_depth);
  if (!read.ok()) {
    p.error = err(ErrorCode::bad_json,
                  read.too_deep ? "JSON nested deeper than " + std::to_string(limits().max_json_depth) + " levels"
                                : "frame body is not valid JSON (" + read.error + ")");
    return p;
  }
  if (read.repeated_key) {
    p.error = err(ErrorCode::bad_json, "frame body repeats a key within one object");
    return p;
  }
  auto& j = read.value;
  if (auto e = validate(j, sender)) {
    p.error = std::move(e);
    // Callers may still want to know what it claimed to be (e.g. a session message sent
    // before authentication deserves "not yet", not "wrong sender").
    if (j.is_object() && j.contains("type") && j["type"].is_string()) p.message.type = j["type"].get<std::string>();
    return p;
  }
  p.message.type = j["type"].get<std::string>();
  p.message.version = j["v"].get<std::uint32_t>();
  if (p.message.type == "heartbeat") {
    auto field = [&](const char* key) {
      auto it = j.find(key);
      return it == j.end() ? std::nullopt : std::optional(it->get<std::int64_t>());
    };
    p.message.beat = Beat{field("now_us"), field("t0_us"), field("rx_us")};
    return p;
  }
  p.message.body = std::move(j);
  return p;
}

nlohmann::json make_message(std::string_view type, std::uint32_t version, nlohmann::json fields) {
  if (fields.is_null()) fields = nlohmann::json::object();
  fields["type"] = std::string(type);
  fields["v"] = version;
  return fields;
}

std::string dump(const nlohmann::json& message) {
  return message.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace ddp::proto

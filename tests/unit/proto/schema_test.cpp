// Schema validation: every message type, every field, every error path, generated from
// proto/messages.json itself so the tests follow the schema.
#include "proto/schema.hpp"

#include <gtest/gtest.h>

#include <limits>
#include <optional>
#include <set>

#include "common/json_parse.hpp"

using namespace ddp::proto;
using nlohmann::json;

namespace {

const json& doc() {
  static const json d = json::parse(schema_text());
  return d;
}

// A valid value for a field spec.
json example(const json& f) {
  const auto t = f["type"].get<std::string>();
  if (t == "string") return f.contains("enum") ? f["enum"][0] : json("x");
  if (t == "hex") return std::string(f.value("bytes", 4) * 2, 'a');
  if (t == "int") return -5;
  if (t == "uint") return 7;
  if (t == "bool") return true;
  if (t == "object") return json::object();
  if (t == "string[]") return json::array({"a", "b"});
  if (t == "uint[]") return json::array({1, 2});
  if (t == "object[]") return json::array({json::object()});
  ADD_FAILURE() << "type " << t;
  return nullptr;
}

// A value of the wrong JSON type for a field spec.
json wrong(const json& f) {
  const auto t = f["type"].get<std::string>();
  if (t == "string" || t == "hex" || t == "string[]") return 12;
  return "text";
}

Sender sender_for(const std::string& type) {
  auto from = doc()["messages"][type]["from"][0].get<std::string>();
  if (from == "client" || from == "server") return Sender{from, ""};
  return Sender{"client", from};
}

json minimal(const std::string& type, bool with_optional = false) {
  json m = make_message(type, 1);
  for (const auto& [name, f] : doc()["messages"][type]["fields"].items()) {
    if (f["required"].get<bool>() || with_optional) m[name] = example(f);
  }
  return m;
}

}  // namespace

TEST(Schema, LoadsWithDocumentedLimits) {
  EXPECT_EQ(limits().max_frame_bytes, 1048576u);
  EXPECT_EQ(limits().max_handshake_frame_bytes, 4096u);
  EXPECT_EQ(limits().min_version, 3u);
  EXPECT_EQ(limits().max_version, 7u);
  EXPECT_GE(limits().max_json_depth, 8u);
  EXPECT_EQ(message_types().size(), doc()["messages"].size());
  EXPECT_EQ(phase_of("hello"), Phase::handshake);
  EXPECT_EQ(phase_of("join"), Phase::session);
  EXPECT_EQ(phase_of("error"), Phase::any);
  EXPECT_EQ(phase_of("nope"), std::nullopt);
}

TEST(Schema, EveryMessageNamesKnownSendersAndDocumentsFields) {
  const std::set<std::string> senders{"client", "server", "agent", "ctl", "coordinator"};
  for (const auto& [type, m] : doc()["messages"].items()) {
    ASSERT_FALSE(m["from"].empty()) << type;
    for (const auto& f : m["from"]) EXPECT_TRUE(senders.count(f.get<std::string>())) << type;
    for (const auto& [name, f] : m["fields"].items()) {
      EXPECT_TRUE(f.contains("required")) << type << "." << name;
      EXPECT_TRUE(doc()["field_types"].contains(f["type"].get<std::string>())) << type << "." << name;
    }
  }
}

TEST(Schema, EveryMessageMinimalAndFullAreValid) {
  for (const auto& type : message_types()) {
    EXPECT_EQ(validate(minimal(type), sender_for(type)), std::nullopt) << type;
    EXPECT_EQ(validate(minimal(type, true), sender_for(type)), std::nullopt) << type;
  }
}

TEST(Schema, EveryRequiredFieldMissingIsNamed) {
  for (const auto& type : message_types()) {
    for (const auto& [name, f] : doc()["messages"][type]["fields"].items()) {
      if (!f["required"].get<bool>()) continue;
      auto m = minimal(type);
      m.erase(name);
      auto e = validate(m, sender_for(type));
      ASSERT_TRUE(e) << type << "." << name;
      EXPECT_EQ(e->code, ErrorCode::missing_field);
      EXPECT_EQ(e->field, name);
      EXPECT_EQ(e->message, "'" + type + "' is missing required field '" + name + "'");
    }
  }
}

TEST(Schema, EveryFieldWithTheWrongTypeIsNamed) {
  for (const auto& type : message_types()) {
    for (const auto& [name, f] : doc()["messages"][type]["fields"].items()) {
      auto m = minimal(type, true);
      m[name] = wrong(f);
      auto e = validate(m, sender_for(type));
      ASSERT_TRUE(e) << type << "." << name;
      EXPECT_EQ(e->code, ErrorCode::wrong_type) << e->message;
      EXPECT_EQ(e->field, name);
      EXPECT_NE(e->message.find("'" + type + "." + name + "' must be"), std::string::npos) << e->message;
    }
  }
}

TEST(Schema, EnvelopeErrors) {
  const Sender agent{"client", "agent"};
  auto code = [&](const json& m) { return validate(m, agent).value_or(ProtoError{}).code; };
  EXPECT_EQ(code(json::array()), ErrorCode::bad_json);
  EXPECT_EQ(code(json{{"v", 1}}), ErrorCode::missing_field);
  EXPECT_EQ(code(json{{"type", 5}, {"v", 1}}), ErrorCode::wrong_type);
  EXPECT_EQ(code(json{{"type", "heartbeat"}}), ErrorCode::missing_field);
  EXPECT_EQ(code(json{{"type", "heartbeat"}, {"v", -1}}), ErrorCode::wrong_type);
  EXPECT_EQ(code(json{{"type", "heartbeat"}, {"v", "1"}}), ErrorCode::wrong_type);
  EXPECT_EQ(code(json{{"type", "heartbeat"}, {"v", 5'000'000'000LL}}), ErrorCode::wrong_type);
  EXPECT_EQ(validate(json{{"type", "heartbeat"}, {"v", 1}}, agent), std::nullopt);
}

TEST(Schema, UnknownTypeAndFieldGetHints) {
  auto e = validate(make_message("hearbeat", 1), Sender{"client", "agent"});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, ErrorCode::unknown_type);
  EXPECT_EQ(e->message, "unknown message type 'hearbeat'");
  EXPECT_EQ(e->hint, "did you mean 'heartbeat'?");
  auto m = minimal("join");
  m["nprocs"] = 2;
  e = validate(m, Sender{"client", "agent"});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, ErrorCode::unknown_field);
  EXPECT_EQ(e->field, "nprocs");
  EXPECT_EQ(e->hint, "did you mean 'nproc'?");
}

TEST(Schema, ValueBounds) {
  const Sender agent{"client", "agent"};
  auto check = [&](json m, const char* field, ErrorCode code, const char* needle) {
    auto e = validate(m, agent);
    ASSERT_TRUE(e) << m.dump();
    EXPECT_EQ(e->code, code) << e->message;
    EXPECT_EQ(e->field, field);
    EXPECT_NE(e->message.find(needle), std::string::npos) << e->message;
  };
  auto hello = minimal("hello");
  hello["role"] = "root";
  check(hello, "role", ErrorCode::bad_value, "must be one of agent, ctl, coordinator, got 'root'");
  hello = minimal("hello");
  hello["nonce"] = std::string(62, 'a');
  check(hello, "nonce", ErrorCode::bad_value, "32 bytes (64 hex digits), got 62");
  hello["nonce"] = std::string(64, 'A');
  check(hello, "nonce", ErrorCode::bad_value, "lower-case hex");
  hello["nonce"] = std::string(63, 'a') + "g";
  check(hello, "nonce", ErrorCode::bad_value, "lower-case hex");
  hello = minimal("hello");
  hello["key_id"] = std::string(65, 'k');
  check(hello, "key_id", ErrorCode::bad_value, "65 bytes, at most 64");
  hello = minimal("hello");
  hello["versions"] = json::array({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17});
  check(hello, "versions", ErrorCode::bad_value, "17 items, at most 16");
  hello["versions"] = json::array({1, -2});
  check(hello, "versions", ErrorCode::wrong_type, "item 1 must be an unsigned integer, got an integer");
  auto join = minimal("join");
  join["nproc"] = 4097;
  check(join, "nproc", ErrorCode::bad_value, "4097, at most 4096");
  join["nproc"] = -1;
  check(join, "nproc", ErrorCode::wrong_type, "unsigned integer, got an integer");
  join["nproc"] = 1.5;
  check(join, "nproc", ErrorCode::wrong_type, "floating-point");
  auto joined = minimal("join");
  joined["rx_us"] = std::uint64_t(1) << 63;
  check(joined, "rx_us", ErrorCode::wrong_type, "must be an integer");
  auto out = minimal("output");
  out["data"] = std::string(65537, 'd');
  check(out, "data", ErrorCode::bad_value, "at most 65536");
  auto status = minimal("status");
  status["jobs"] = json::array({1});
  status["type"] = "status";
  EXPECT_EQ(validate(status, Sender{"server", "coordinator"}).value_or(ProtoError{}).code, ErrorCode::wrong_type);
  auto sub = minimal("submit");
  sub["nodes"] = json::array({"a", 3});
  EXPECT_EQ(validate(sub, Sender{"client", "ctl"})->message, "'submit.nodes' item 1 must be a string, got an integer");
}

TEST(Schema, SenderIsChecked) {
  auto e = validate(minimal("assign"), Sender{"client", "agent"});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, ErrorCode::wrong_sender);
  EXPECT_EQ(e->message, "'assign' may only be sent by coordinator, not by a agent");
  e = validate(minimal("hello"), Sender{"server", ""});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message, "'hello' may only be sent by client, not by the server");
  EXPECT_EQ(validate(minimal("assign"), Sender{"server", "coordinator"}), std::nullopt);
  EXPECT_EQ(validate(minimal("error"), Sender{"server", ""}), std::nullopt);
}

TEST(Schema, ParseMessageRejectsBadJsonAndDeepNesting) {
  const Sender agent{"client", "agent"};
  EXPECT_EQ(parse_message("{not json", agent).error->code, ErrorCode::bad_json);
  EXPECT_EQ(parse_message("", agent).error->code, ErrorCode::bad_json);
  EXPECT_EQ(parse_message("\"str\"", agent).error->code, ErrorCode::bad_json);
  // A key twice in one object: which one counts is the reader's guess (RFC 8259), so neither.
  for (const char* twice :
       {R"({"now_us":1,"type":"heartbeat","v":7,"v":8})", R"({"now_us":1,"type":"job_offer","type":"heartbeat","v":7})",
        R"({"type":"error","v":1,"code":"x","message":"a","code":"y"})"}) {
    auto t = parse_message(twice, agent);
    ASSERT_TRUE(t.error) << twice;
    EXPECT_EQ(t.error->code, ErrorCode::bad_json) << twice;
    EXPECT_EQ(t.error->message, "frame body repeats a key within one object");
  }
  std::string deep(100000, '[');
  auto p = parse_message(deep, agent);
  EXPECT_EQ(p.error->code, ErrorCode::bad_json);
  EXPECT_NE(p.error->message.find("nested deeper"), std::string::npos);
  // Brackets inside strings do not count as nesting.
  auto m = minimal("heartbeat");
  auto ok = parse_message(R"({"type":"error","v":1,"code":"x","message":")" + std::string(100, '[') + R"(\"[["})",
                          Sender{"server", ""});
  EXPECT_TRUE(ok.ok()) << ok.error->message;
  auto good = parse_message(dump(minimal("join")), agent);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(good.message.type, "join");
  EXPECT_EQ(good.message.version, 1u);
  EXPECT_EQ(good.message.body["node"], "x");
}

TEST(Schema, DumpReplacesInvalidUtf8) {
  json m = make_message("heartbeat", 1);
  m["junk"] = std::string("\xff\xfe ok");
  EXPECT_NO_THROW(dump(m));
}

// ---- heartbeats read without a DOM ----

namespace {

// What the general reader (parse_json, a repeated key refused, then validate) makes of a text, as a
// heartbeat's fields.
std::optional<Message> general_heartbeat(std::string_view text) {
  auto read = ddp::parse_json(text, limits().max_json_depth);
  if (!read.ok() || read.repeated_key || validate(read.value, Sender{"client", "agent"})) return std::nullopt;
  const auto& j = read.value;
  if (j["type"] != "heartbeat") return std::nullopt;
  Message m;
  m.type = "heartbeat";
  m.version = j["v"].get<std::uint32_t>();
  for (auto [key, field] : {std::pair{"now_us", &Beat::now_us}, {"t0_us", &Beat::t0_us}, {"rx_us", &Beat::rx_us}}) {
    if (j.contains(key)) m.beat.*field = j[key].get<std::int64_t>();
  }
  return m;
}

// Wherever the plain reader reads a text, the general reader takes it too and finds the same
// values; `plain` counts where it read one.
void same_as_general(std::string_view text, int& plain) {
  auto fast = read_plain_heartbeat(text);
  if (!fast) return;
  ++plain;
  auto slow = general_heartbeat(text);
  ASSERT_TRUE(slow) << "read plainly, refused in general: " << text;
  EXPECT_EQ(fast->type, slow->type) << text;
  EXPECT_EQ(fast->version, slow->version) << text;
  EXPECT_EQ(fast->beat, slow->beat) << text;
  EXPECT_TRUE(fast->body.is_null()) << text;
}

// Heartbeats as our encoders write them: every subset of the three fields, at the integers'
// extremes and around them.
std::vector<std::string> encoded_heartbeats() {
  const std::int64_t lo = std::numeric_limits<std::int64_t>::min(), hi = std::numeric_limits<std::int64_t>::max();
  const std::vector<std::int64_t> values{0, 1, -1, 9, 10, -10, 1733540000123456, lo, lo + 1, hi, hi - 1};
  std::vector<std::string> out;
  for (unsigned mask = 0; mask < 8; ++mask) {
    for (std::size_t k = 0; k < values.size(); ++k) {
      for (std::uint32_t v : {0u, 7u, 4294967295u}) {
        json fields = json::object();
        if (mask & 1) fields["now_us"] = values[k];
        if (mask & 2) fields["t0_us"] = values[(k + 3) % values.size()];
        if (mask & 4) fields["rx_us"] = values[(k + 7) % values.size()];
        out.push_back(dump(make_message("heartbeat", v, fields)));
      }
    }
  }
  return out;
}

}  // namespace

// The encoders' heartbeats take the short way, and give what the general reader gives.
TEST(PlainHeartbeat, EveryEncodedHeartbeatIsReadPlainlyWithTheGeneralReadersValues) {
  int plain = 0;
  const auto texts = encoded_heartbeats();
  for (const auto& t : texts) same_as_general(t, plain);
  EXPECT_EQ(plain, static_cast<int>(texts.size())) << "an encoded heartbeat went the general way";
  auto m = read_plain_heartbeat(R"({"now_us":-9223372036854775808,"rx_us":2,"t0_us":1,"type":"heartbeat","v":7})");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->beat, (Beat{std::numeric_limits<std::int64_t>::min(), 1, 2}));
  EXPECT_EQ(m->version, 7u);
}

// Every prefix, every byte deleted, replaced or inserted (from a set of JSON's structural and
// number characters): where the plain reader still reads it, the general reader agrees. Texts
// valid JSON but not in the encoders' form go the general way.
TEST(PlainHeartbeat, NoMutantIsReadDifferentlyThanTheGeneralReaderReadsIt) {
  const std::string alphabet = "0123456789-+.eE,:{}\"\\ atvx_";
  int plain = 0, mutants = 0;
  for (const auto& t : encoded_heartbeats()) {
    if (t.size() > 90) continue;  // the long ones add nothing but time
    for (std::size_t i = 0; i <= t.size(); ++i) {
      same_as_general(t.substr(0, i), plain);
      for (char c : alphabet) {
        std::string ins = t;
        ins.insert(ins.begin() + static_cast<std::ptrdiff_t>(i), c);
        same_as_general(ins, plain);
        ++mutants;
        if (i == t.size()) continue;
        std::string rep = t;
        rep[i] = c;
        same_as_general(rep, plain);
        ++mutants;
      }
      if (i < t.size()) same_as_general(std::string(t).erase(i, 1), plain);
    }
  }
  EXPECT_GT(mutants, 100000);
  EXPECT_GT(plain, 1000);  // digits replaced by digits: still plain heartbeats
  for (const char* general_only :
       {R"({"type":"heartbeat","v":7, "now_us":1})", R"({ "type":"heartbeat","v":7})", R"({"v":7,"type":"heartbeat"})",
        R"({"now_us":-0,"type":"heartbeat","v":7})", R"({"type":"he\u0061rtbeat","v":7})",
        R"({"now_us":1,"now_us":2,"type":"heartbeat","v":7})", R"({"t0_us":1,"rx_us":2,"type":"heartbeat","v":7})"}) {
    EXPECT_FALSE(read_plain_heartbeat(general_only)) << general_only;
  }
  for (const char* refused :
       {R"({"now_us":9223372036854775808,"type":"heartbeat","v":7})", R"({"now_us":01,"type":"heartbeat","v":7})",
        R"({"type":"heartbeat","v":4294967296})", R"({"type":"heartbeat","v":-1})",
        R"({"now_us":1.0,"type":"heartbeat","v":7})", R"({"type":"heartbeat","v":7}x)"}) {
    EXPECT_FALSE(read_plain_heartbeat(refused)) << refused;
    EXPECT_FALSE(parse_message(refused, Sender{"client", "agent"}).ok()) << refused;
  }
}

// parse_message takes the short way only for a sender the schema allows; either way a heartbeat
// comes out as its fields, with no DOM.
TEST(PlainHeartbeat, ParseMessageChecksTheSenderAndGivesTheFieldsEitherWay) {
  const std::string plain = R"({"now_us":5,"type":"heartbeat","v":7})";
  auto p = parse_message(plain, Sender{"client", "agent"});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p.message.beat, (Beat{5, std::nullopt, std::nullopt}));
  EXPECT_TRUE(p.message.body.is_null());
  auto before_roles = parse_message(plain, Sender{"client", ""});
  ASSERT_FALSE(before_roles.ok());
  EXPECT_EQ(before_roles.error->code, ErrorCode::wrong_sender);
  auto spaced = parse_message(R"({ "v": 7, "type": "heartbeat", "rx_us": 2, "now_us": 5 })", Sender{"server", "ctl"});
  ASSERT_TRUE(spaced.ok()) << spaced.error->message;
  EXPECT_EQ(spaced.message.beat, (Beat{5, std::nullopt, 2}));
  EXPECT_EQ(spaced.message.version, 7u);
  EXPECT_TRUE(spaced.message.body.is_null());
  auto unknown = parse_message(R"({"now_us":5,"type":"heartbeat","v":7,"x":1})", Sender{"client", "agent"});
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.error->code, ErrorCode::unknown_field);
}

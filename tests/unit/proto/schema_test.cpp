// Schema validation: every message type, every field, every error path, generated from
// proto/messages.json itself so the tests follow the schema.
#include "proto/schema.hpp"

#include <gtest/gtest.h>

#include <set>

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

// proto/node-facts.schema.json against what we write and what the fixtures hold. A small
// validator of the JSON Schema subset the schema uses (type, required, properties, items, enum,
// const, oneOf, $ref, minimum, maximum, minLength, pattern), so no Python jsonschema is needed.
#include "facts/discover.hpp"
#include "test_util.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <regex>

using nlohmann::json;

namespace {

class MiniSchema {
 public:
  explicit MiniSchema(json root) : root_(std::move(root)) {}

  std::vector<std::string> errors(const json& v) {
    errs_.clear();
    check(root_, v, "$");
    return errs_;
  }

 private:
  bool type_ok(const std::string& t, const json& v) {
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    if (t == "string") return v.is_string();
    if (t == "integer") return v.is_number_integer();
    if (t == "number") return v.is_number();
    if (t == "boolean") return v.is_boolean();
    return false;
  }

  void check(const json& s, const json& v, const std::string& at) {
    if (s.contains("$ref")) {
      auto ref = s["$ref"].get<std::string>();  // "#/$defs/name"
      check(root_["$defs"][ref.substr(ref.rfind('/') + 1)], v, at);
    }
    if (s.contains("type") && !type_ok(s["type"], v)) return fail(at, "type " + s["type"].get<std::string>());
    if (s.contains("enum") && std::find(s["enum"].begin(), s["enum"].end(), v) == s["enum"].end()) fail(at, "enum");
    if (s.contains("const") && v != s["const"]) fail(at, "const");
    if (s.contains("minimum") && v.is_number() && v.get<double>() < s["minimum"].get<double>()) fail(at, "minimum");
    if (s.contains("maximum") && v.is_number() && v.get<double>() > s["maximum"].get<double>()) fail(at, "maximum");
    if (s.contains("minLength") && v.is_string() && v.get<std::string>().size() < s["minLength"].get<std::size_t>())
      fail(at, "minLength");
    if (s.contains("pattern") && v.is_string() &&
        !std::regex_search(v.get<std::string>(), std::regex(s["pattern"].get<std::string>())))
      fail(at, "pattern " + s["pattern"].get<std::string>());
    if (s.contains("oneOf")) {
      int ok = 0;
      for (const auto& alt : s["oneOf"]) {
        MiniSchema sub(root_);
        if (sub.errors_at(alt, v).empty()) ++ok;
      }
      if (ok != 1) fail(at, "oneOf matched " + std::to_string(ok));
    }
    if (v.is_object()) {
      for (const auto& r : s.value("required", json::array()))
        if (!v.contains(r.get<std::string>())) fail(at, "required " + r.get<std::string>());
      if (s.contains("properties"))
        for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it)
          if (v.contains(it.key())) check(it.value(), v[it.key()], at + "." + it.key());
    }
    if (v.is_array() && s.contains("items"))
      for (std::size_t i = 0; i < v.size(); ++i) check(s["items"], v[i], at + "[" + std::to_string(i) + "]");
  }

  std::vector<std::string> errors_at(const json& s, const json& v) {
    errs_.clear();
    check(s, v, "$");
    return errs_;
  }

  void fail(const std::string& at, const std::string& what) { errs_.push_back(at + ": " + what); }

  json root_;
  std::vector<std::string> errs_;
};

json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

}  // namespace

TEST(Schema, DiscoveredFactsAndFixturesConform) {
  MiniSchema schema(read_json(facts_test::source_dir() / "proto/node-facts.schema.json"));
  for (const char* tree : {"dgx-h100", "amd-uneven", "cpu-only"}) {
    auto j = ddp::facts::to_json(ddp::facts::discover({facts_test::sysfs_fixture(tree), false, false}));
    EXPECT_EQ(schema.errors(j), std::vector<std::string>{}) << tree;
  }
  auto live = ddp::facts::to_json(ddp::facts::discover({}));
  EXPECT_EQ(schema.errors(live), std::vector<std::string>{}) << "live";
  for (const auto& e : std::filesystem::directory_iterator(facts_test::source_dir() / "tests/fixtures/facts")) {
    if (e.path().extension() != ".json") continue;
    EXPECT_EQ(schema.errors(read_json(e.path())), std::vector<std::string>{}) << e.path();
  }
}

TEST(Schema, CatchesWhatTheReaderRefuses) {
  MiniSchema schema(read_json(facts_test::source_dir() / "proto/node-facts.schema.json"));
  auto j = json::parse(
      R"({"hostname": "n", "numa_nodes": [{"id": 0, "cpus": "0-x"}], "gpus": [{"index": 0, "pci_bus_id": "0000:18:00.0"}], "nics": [{"name": "e", "kind": "wifi"}]})");
  auto errs = schema.errors(j);
  EXPECT_EQ(errs.size(), 2u);
  j.erase("gpus");
  EXPECT_EQ(schema.errors(j).size(), 3u);
}

// Model: cpulists, bus ids, JSON round trip, and the reader's errors and notes.
#include "facts/model.hpp"
#include "facts/discover.hpp"
#include "facts/native.hpp"
#include "test_util.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

using namespace ddp::facts;
using nlohmann::json;
using ::testing::HasSubstr;

TEST(Cpulist, ParsesAndFormatsRoundTrip) {
  EXPECT_EQ(parse_cpulist("0-3,8,10-11"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpulist("0-55,112-167\n")->size(), 112u);
  EXPECT_EQ(parse_cpulist(""), std::vector<int>{});  // memory-only NUMA node
  EXPECT_EQ(format_cpulist({3, 0, 1, 2, 8, 10, 11, 11}), "0-3,8,10-11");
  EXPECT_EQ(format_cpulist({}), "");
  for (std::string s : {"0-55,112-167", "5", "0-1", "0,2,4", "1-2,4-5,7"})
    EXPECT_EQ(format_cpulist(*parse_cpulist(s)), s) << s;
}

TEST(Cpulist, RejectsGarbageAndHugeRanges) {
  for (const char* bad : {"a", "1-", "-1", "3-1", "0-4000000000", "0,,1", "1 2", "0-65536"})
    EXPECT_FALSE(parse_cpulist(bad).has_value()) << bad;
}

TEST(PciBusId, Normalises) {
  EXPECT_EQ(normalize_pci_bus_id("0000:18:00.0"), "0000:18:00.0");
  EXPECT_EQ(normalize_pci_bus_id("00000000:1A:00.0"), "0000:1a:00.0");  // NVML
  EXPECT_EQ(normalize_pci_bus_id("1a:00.1"), "0000:1a:00.1");
  EXPECT_EQ(normalize_pci_bus_id("10000:01:00.0"), "10000:01:00.0");  // VMD domains are 5 digits
  for (const char* bad : {"", "18:00", "0000:18:00.8", "zz:00.0", "0000:118:00.0", "0:0:0:0.0"})
    EXPECT_FALSE(normalize_pci_bus_id(bad).has_value()) << bad;
}

TEST(Native, FormatsLibraryVersionCodes) {
  EXPECT_EQ(native::format_nccl_version(22809), "2.28.9");
  EXPECT_EQ(native::format_nccl_version(21905), "2.19.5");
  EXPECT_EQ(native::format_nccl_version(2804), "2.8.4");  // before 2.9: major*1000
  EXPECT_EQ(native::format_cuda_version(12040), "12.4");
  EXPECT_EQ(native::format_cuda_version(13000), "13.0");
}

namespace {
json minimal() {
  return json::parse(R"({"hostname": "n1", "numa_nodes": [{"id": 0, "cpus": "0-3"}], "gpus": [], "nics": []})");
}
std::string error_of(const json& j) {
  try {
    from_json(j, "node.json");
  } catch (const FactsError& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST(FactsJson, MinimalFileIsEnoughAndEverythingElseIsAbsent) {
  std::vector<std::string> notes;
  auto f = from_json(minimal(), "node.json", &notes);
  EXPECT_EQ(f.hostname, "n1");
  EXPECT_FALSE(f.versions.driver);
  EXPECT_FALSE(f.limits.memlock);
  EXPECT_FALSE(f.container_runtimes);
  EXPECT_TRUE(notes.empty());
}

TEST(FactsJson, RoundTripsDiscoveredFixtures) {
  for (const char* tree : {"dgx-h100", "amd-uneven", "cpu-only"}) {
    auto f = discover({facts_test::sysfs_fixture(tree), false, false});
    std::vector<std::string> notes;
    auto back = from_json(to_json(f), tree, &notes);
    EXPECT_EQ(to_json(back), to_json(f)) << tree;
    EXPECT_TRUE(notes.empty()) << tree;
  }
}

TEST(FactsJson, ContainerImageRoundTripsAndConformsToTheSchemaShape) {
  auto f = from_json(minimal(), "node.json");
  f.container_image = ContainerImage{"podman", "localhost/img:1", "sha256:aa", "sha256:bb", std::nullopt};
  auto j = to_json(f);
  EXPECT_EQ(
      j["container_image"],
      (json{
          {"runtime", "podman"}, {"image", "localhost/img:1"}, {"digest", "sha256:aa"}, {"repo_digest", "sha256:bb"}}));
  std::vector<std::string> notes;
  EXPECT_EQ(to_json(from_json(j, "node.json", &notes)), j);
  EXPECT_TRUE(notes.empty());
  j["container_image"].erase("image");
  EXPECT_THAT(error_of(j), HasSubstr("container_image: missing required field 'image'"));
}

TEST(FactsJson, ErrorsNameFileAndPath) {
  auto j = minimal();
  j.erase("hostname");
  EXPECT_THAT(error_of(j), HasSubstr("node.json: missing required field 'hostname'"));
  j = minimal();
  j.erase("nics");
  EXPECT_THAT(error_of(j), HasSubstr("missing required field 'nics'"));
  j = minimal();
  j["gpus"] = "eight";
  EXPECT_THAT(error_of(j), HasSubstr("node.json: gpus: expected an array, got string"));
  j = minimal();
  j["gpus"] = json::array({{{"index", 0}, {"pci_bus_id", "18:00"}}});
  EXPECT_THAT(error_of(j), HasSubstr("node.json: gpus[0].pci_bus_id: not a PCI bus id"));
  j = minimal();
  j["numa_nodes"][0]["cpus"] = "0-x";
  EXPECT_THAT(error_of(j), HasSubstr("node.json: numa_nodes[0].cpus: not a cpulist"));
  j = minimal();
  j["nics"] = json::array({{{"name", "eth0"}, {"kind", "wifi"}}});
  EXPECT_THAT(error_of(j), HasSubstr("node.json: nics[0].kind: expected \"ib\" or \"eth\", got \"wifi\""));
  j = minimal();
  j["limits"] = {{"memlock", -5}};
  EXPECT_THAT(error_of(j), HasSubstr("node.json: limits.memlock: expected a non-negative integer or \"unlimited\""));
  EXPECT_THAT(error_of(json::array()), HasSubstr("expected an object, got array"));
}

TEST(FactsJson, UnknownFieldsBecomeNotes) {
  auto j = minimal();
  j["facts_version"] = 7;
  j["power"] = 1;
  j["numa_nodes"][0]["distance"] = json::array({10});
  j["versions"] = {{"rocm", "6.1"}};
  std::vector<std::string> notes;
  auto f = from_json(j, "new.json", &notes);
  EXPECT_EQ(f.hostname, "n1");
  EXPECT_THAT(notes,
              ::testing::UnorderedElementsAre(HasSubstr("newer ddpctl"), HasSubstr("'power'"),
                                              HasSubstr("'numa_nodes[0].distance'"), HasSubstr("'versions.rocm'")));
}

TEST(FactsJson, NumaMinusOneIsZeroAndLimitsTakeBothShapes) {
  auto j = minimal();
  j["gpus"] = json::array({{{"index", 0}, {"pci_bus_id", "0000:3B:00.0"}, {"numa_node", -1}}});
  j["limits"] = {{"memlock", "unlimited"}, {"nofile", {{"soft", 1024}, {"hard", 1048576}}}, {"shm_bytes", 67108864}};
  auto f = from_json(j, "x");
  EXPECT_EQ(f.gpus[0].numa_node, 0);
  EXPECT_EQ(f.gpus[0].pci_bus_id, "0000:3b:00.0");
  EXPECT_TRUE(f.limits.memlock->soft_unlimited());
  EXPECT_EQ(f.limits.nofile->soft, 1024u);
  EXPECT_EQ(f.limits.nofile->hard, 1048576u);
  EXPECT_EQ(f.limits.shm_bytes, 67108864u);
  auto out = to_json(f);
  EXPECT_EQ(out["limits"]["memlock"]["soft"], "unlimited");
}

TEST(FactsFile, LoadsFixturesAndNamesBadFiles) {
  std::vector<std::string> notes;
  auto f = load_facts_file(facts_test::facts_fixture("dgx-a"), &notes);
  EXPECT_EQ(f.hostname, "dgx-a");
  EXPECT_EQ(gpu_count(f), 8u);
  EXPECT_TRUE(notes.empty());
  load_facts_file(facts_test::facts_fixture("cpu-future"), &notes);
  EXPECT_EQ(notes.size(), 5u);

  facts_test::ScratchTree t;
  t.write("bad.json", "{\"hostname\": ");
  try {
    load_facts_file(t.root() / "bad.json");
    FAIL();
  } catch (const FactsError& e) {
    EXPECT_THAT(e.what(), HasSubstr("bad.json: not valid JSON"));
  }
  try {
    load_facts_file(t.root() / "missing.json");
    FAIL();
  } catch (const FactsError& e) {
    EXPECT_THAT(e.what(), HasSubstr("missing.json: cannot read facts file"));
  }
}

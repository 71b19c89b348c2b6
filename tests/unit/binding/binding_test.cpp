// plan_binding over the recorded fixtures (tests/fixtures/facts, tests/fixtures/sysfs), rank by rank.
#include "binding/binding.hpp"
#include "facts/discover.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>

using namespace ddp;
using binding::BindingSpec;
using binding::plan_binding;
using jobspec::GpuBinding;
using jobspec::NicBinding;
using jobspec::NumaBinding;
using testing::ElementsAre;
using testing::HasSubstr;

namespace {

std::filesystem::path source_dir() {
  const char* s = std::getenv("DDP_SOURCE_DIR");
  return s ? std::filesystem::path(s) : std::filesystem::path(DDP_FALLBACK_SOURCE_DIR);
}
facts::NodeFacts fixture(const std::string& name) {
  return facts::load_facts_file(source_dir() / "tests/fixtures/facts" / (name + ".json"));
}
facts::NodeFacts sysfs_fixture(const std::string& name) {
  facts::DiscoverOptions o;
  o.root = source_dir() / "tests/fixtures/sysfs" / name;
  return facts::discover(o);
}
std::vector<int> cpus_of(const facts::NodeFacts& f, int numa) {
  for (const auto& n : f.numa_nodes) {
    if (n.id == numa) return *facts::parse_cpulist(n.cpus);
  }
  return {};
}
std::string uuid(int i) {
  return "GPU-6a1e5f33-9c0b-4d7e-8a21-00000000aa0" + std::to_string(i);
}

}  // namespace

TEST(Binding, DgxEightRanks) {
  auto f = fixture("dgx-a");
  auto p = plan_binding(f, 8, {});
  ASSERT_EQ(p.ranks.size(), 8u);
  std::string all;
  for (int i = 0; i < 8; ++i) all += (i ? "," : "") + uuid(i);
  std::set<std::string> nics;
  for (int r = 0; r < 8; ++r) {
    const auto& rb = p.ranks[r];
    EXPECT_EQ(rb.gpu, r);
    EXPECT_EQ(rb.cuda_visible_devices, all);
    EXPECT_EQ(rb.numa_node, r < 4 ? 0 : 1) << r;
    EXPECT_EQ(rb.cpus, cpus_of(f, r < 4 ? 0 : 1)) << r;
    ASSERT_TRUE(rb.nic);
    EXPECT_EQ(*rb.nic, "mlx5_" + std::to_string(r)) << r;  // the one on the GPU's PCI switch
    EXPECT_THAT(rb.reason(), HasSubstr("same PCI switch"));
    nics.insert(*rb.nic);
  }
  EXPECT_EQ(nics.size(), 8u);
  EXPECT_EQ(p.nccl_ib_hca, "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1");
  auto j = binding::to_json(p.ranks[5]);
  EXPECT_EQ(j["gpu"], 5);
  EXPECT_EQ(j["cpus"], "56-111,168-223");
  EXPECT_EQ(j["numa_node"], 1);
  EXPECT_EQ(j["nic"], "mlx5_5");
  EXPECT_EQ(j["cuda_visible_devices"], all);
  EXPECT_TRUE(j["reason"].is_string());
}

TEST(Binding, GpusFollowPciOrderNotIndex) {
  auto f = fixture("dgx-a");
  std::swap(f.gpus[0], f.gpus[7]);  // discovery order must not matter
  auto p = plan_binding(f, 2, {});
  EXPECT_EQ(p.ranks[0].gpu, 0);
  EXPECT_EQ(p.ranks[1].gpu, 1);
  EXPECT_EQ(p.ranks[0].cuda_visible_devices, uuid(0) + "," + uuid(1));
}

TEST(Binding, NicsSpreadWithoutSwitchInformation) {
  auto f = fixture("dgx-a");
  for (auto& n : f.nics) n.sysfs_path.reset();
  for (auto& g : f.gpus) g.sysfs_path.reset();
  auto p = plan_binding(f, 8, {});
  std::set<std::string> numa0, numa1;
  for (int r = 0; r < 8; ++r) (r < 4 ? numa0 : numa1).insert(*p.ranks[r].nic);
  EXPECT_EQ(numa0, (std::set<std::string>{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}));
  EXPECT_EQ(numa1, (std::set<std::string>{"mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"}));
}

TEST(Binding, AmdUnevenUsesTheGpusNumaNodes) {
  auto f = sysfs_fixture("amd-uneven");
  ASSERT_EQ(f.gpus.size(), 4u);
  auto p = plan_binding(f, 4, {});
  std::vector<int> numa;
  for (const auto& rb : p.ranks) {
    ASSERT_TRUE(rb.numa_node);
    numa.push_back(*rb.numa_node);
    EXPECT_EQ(rb.cpus, cpus_of(f, *rb.numa_node));
  }
  EXPECT_THAT(numa, ElementsAre(1, 2, 6, 7));
  EXPECT_EQ(facts::format_cpulist(p.ranks[2].cpus), "72-83,168-179");
}

TEST(Binding, CpuOnlyRoundRobin) {
  auto f = fixture("dgx-a");
  f.gpus.clear();
  auto p = plan_binding(f, 3, {});
  EXPECT_EQ(p.ranks[0].numa_node, 0);
  EXPECT_EQ(p.ranks[1].numa_node, 1);
  EXPECT_EQ(p.ranks[2].numa_node, 0);
  EXPECT_EQ(p.ranks[1].cpus, cpus_of(f, 1));
  for (const auto& rb : p.ranks) {
    EXPECT_FALSE(rb.gpu);
    EXPECT_FALSE(rb.cuda_visible_devices);
    EXPECT_THAT(rb.reason(), HasSubstr("no GPU"));
  }
  auto c = plan_binding(sysfs_fixture("cpu-only"), 2, {});
  for (const auto& rb : c.ranks) {
    EXPECT_FALSE(rb.gpu);
    EXPECT_FALSE(rb.cpus.empty());
  }
  EXPECT_FALSE(c.nccl_ib_hca);
}

// A rank bound to its node's CPUs prefers that node's memory where the machine has more than one
// node; on a machine of one it keeps the default policy (what a rank started by hand has), and
// a rank without CPUs gets no memory policy either.
TEST(Binding, MemoryIsPreferredOnlyWhereThereIsAChoice) {
  auto dgx = fixture("dgx-a");
  auto p = plan_binding(dgx, 8, {});
  for (const auto& rb : p.ranks) {
    ASSERT_TRUE(rb.numa_node);
    ASSERT_FALSE(rb.cpus.empty());
    EXPECT_EQ(rb.mem_node, rb.numa_node);
  }
  auto cpu = fixture("cpu-a");
  ASSERT_EQ(cpu.numa_nodes.size(), 1u);
  auto one = plan_binding(cpu, 2, {});
  for (const auto& rb : one.ranks) {
    EXPECT_TRUE(rb.numa_node);
    EXPECT_FALSE(rb.cpus.empty());
    EXPECT_FALSE(rb.mem_node);
  }
  auto none = plan_binding(dgx, 2, {}, std::vector<int>{100000});  // none of the nodes' CPUs allowed
  for (const auto& rb : none.ranks) {
    EXPECT_TRUE(rb.cpus.empty());
    EXPECT_FALSE(rb.mem_node);
  }
}

TEST(Binding, IsolateShowsOneGpu) {
  auto p = plan_binding(fixture("dgx-a"), 4, {GpuBinding::isolate, NumaBinding::automatic, NicBinding::automatic});
  for (int r = 0; r < 4; ++r) EXPECT_EQ(p.ranks[r].cuda_visible_devices, uuid(r));
}

TEST(Binding, ExclusiveSplitsTheNode) {
  auto f = fixture("dgx-a");
  auto p = plan_binding(f, 8, {GpuBinding::automatic, NumaBinding::exclusive, NicBinding::automatic});
  EXPECT_EQ(facts::format_cpulist(p.ranks[0].cpus), "0-13,112-125");  // cores with their siblings
  EXPECT_EQ(facts::format_cpulist(p.ranks[3].cpus), "42-55,154-167");
  EXPECT_EQ(facts::format_cpulist(p.ranks[4].cpus), "56-69,168-181");
  std::set<int> seen;
  std::size_t total = 0;
  for (const auto& rb : p.ranks) {
    EXPECT_EQ(rb.cpus.size(), 28u);
    total += rb.cpus.size();
    seen.insert(rb.cpus.begin(), rb.cpus.end());
  }
  EXPECT_EQ(seen.size(), total);  // disjoint
  // Two ranks on two CPUs: one each.
  facts::NodeFacts two;
  two.numa_nodes = {{0, "0-1"}};
  auto q = plan_binding(two, 2, {GpuBinding::automatic, NumaBinding::exclusive, NicBinding::automatic});
  EXPECT_THAT(q.ranks[0].cpus, ElementsAre(0));
  EXPECT_THAT(q.ranks[1].cpus, ElementsAre(1));
}

TEST(Binding, AllowedSetNarrowsCpus) {
  auto f = fixture("dgx-a");
  auto p = plan_binding(f, 8, {}, std::vector<int>{0, 1, 2, 3, 60, 61});
  EXPECT_THAT(p.ranks[0].cpus, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(p.ranks[4].cpus, ElementsAre(60, 61));
  auto q = plan_binding(f, 8, {}, std::vector<int>{0, 1});
  EXPECT_TRUE(q.ranks[4].cpus.empty());  // none of node 1 may be used: left unbound, said why
  EXPECT_THAT(q.ranks[4].reason(), HasSubstr("no CPU binding"));
  EXPECT_TRUE(binding::to_json(q.ranks[4])["cpus"].is_null());
}

TEST(Binding, MoreRanksThanGpus) {
  auto f = fixture("dgx-a");
  auto p = plan_binding(f, 10, {});
  EXPECT_EQ(p.ranks[7].gpu, 7);
  for (int r : {8, 9}) {
    EXPECT_FALSE(p.ranks[r].gpu);
    EXPECT_FALSE(p.ranks[r].cuda_visible_devices);
    EXPECT_THAT(p.ranks[r].reason(), HasSubstr("10 local ranks for 8 GPUs"));
    EXPECT_FALSE(p.ranks[r].cpus.empty());
  }
  EXPECT_EQ(p.ranks[8].numa_node, 0);
  EXPECT_EQ(p.ranks[9].numa_node, 1);
  // The 8 GPU ranks see only the 8 job GPUs, in order.
  EXPECT_THAT(*p.ranks[0].cuda_visible_devices, HasSubstr(uuid(7)));
}

TEST(Binding, NoneTurnsPartsOff) {
  auto p = plan_binding(fixture("dgx-a"), 2, {GpuBinding::none, NumaBinding::none, NicBinding::none});
  for (const auto& rb : p.ranks) {
    EXPECT_FALSE(rb.gpu);
    EXPECT_FALSE(rb.cuda_visible_devices);
    EXPECT_FALSE(rb.numa_node);
    EXPECT_TRUE(rb.cpus.empty());
    EXPECT_FALSE(rb.nic);
  }
  EXPECT_FALSE(p.nccl_ib_hca);
  auto q = plan_binding(fixture("dgx-no-ib"), 2, {});
  EXPECT_FALSE(q.nccl_ib_hca);
  EXPECT_EQ(q.ranks[0].nic, "eno1");  // eno2 is down
}

TEST(Binding, IbHcasOfANode) {
  EXPECT_THAT(binding::ib_hcas(fixture("dgx-a")), ElementsAre("mlx5_0:1", "mlx5_1:1", "mlx5_2:1", "mlx5_3:1",
                                                              "mlx5_4:1", "mlx5_5:1", "mlx5_6:1", "mlx5_7:1"));
  EXPECT_TRUE(binding::ib_hcas(fixture("dgx-no-ib")).empty());
}

TEST(Binding, CommonIbHcaIsTheIntersection) {
  using V = std::vector<std::string>;
  EXPECT_EQ(binding::common_ib_hca({V{"mlx5_1:1", "mlx5_0:1"}}), "=mlx5_0:1,mlx5_1:1");
  EXPECT_EQ(binding::common_ib_hca({V{"mlx5_0:1", "mlx5_1:1", "mlx5_2:1"}, V{"mlx5_2:1", "mlx5_0:1"},
                                    V{"mlx5_0:1", "mlx5_2:1", "mlx5_3:1"}}),
            "=mlx5_0:1,mlx5_2:1");
  // The same device on another port is another rail.
  EXPECT_EQ(binding::common_ib_hca({V{"mlx5_0:1"}, V{"mlx5_0:2"}}), std::nullopt);
  // A node without IB: nothing in common, NCCL_IB_HCA is left alone.
  EXPECT_EQ(binding::common_ib_hca({V{"mlx5_0:1"}, V{}}), std::nullopt);
  EXPECT_EQ(binding::common_ib_hca({}), std::nullopt);
}

TEST(Binding, RestrictGpusBySelector) {
  auto f = fixture("dgx-a");
  std::reverse(f.gpus.begin(), f.gpus.end());  // selection is by PCI order, not discovery order
  auto two = binding::restrict_gpus(f, {"6", uuid(2)});
  ASSERT_EQ(two.gpus.size(), 2u);
  EXPECT_EQ(two.gpus[0].uuid, uuid(2));  // kept in PCI order
  EXPECT_EQ(two.gpus[1].uuid, uuid(6));
  auto p = plan_binding(two, 2, {});
  EXPECT_EQ(p.ranks[0].cuda_visible_devices, uuid(2) + "," + uuid(6));
  EXPECT_EQ(p.ranks[0].numa_node, 0);
  EXPECT_EQ(p.ranks[1].numa_node, 1);

  const auto bus = f.gpus.back().pci_bus_id;                 // the first in PCI order, after the reverse
  auto by_bus = binding::restrict_gpus(f, {bus.substr(5)});  // "18:00.0" without the domain
  ASSERT_EQ(by_bus.gpus.size(), 1u);
  EXPECT_EQ(by_bus.gpus[0].pci_bus_id, bus);

  EXPECT_TRUE(binding::restrict_gpus(f, {}).gpus.empty());
  try {
    binding::restrict_gpus(f, {"8"});
    FAIL() << "GPU 8 of 8 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("GPU '8' is not on this node (8 GPUs"));
  }
  EXPECT_THROW(binding::restrict_gpus(f, {"GPU-nope"}), std::invalid_argument);
  EXPECT_THROW(binding::restrict_gpus(f, {"1", "1"}), std::invalid_argument);
  EXPECT_THROW(binding::restrict_gpus(f, {"0", f.gpus.back().pci_bus_id}),
               std::invalid_argument);  // the same GPU twice
}

TEST(Binding, PerRankHcaIsOptIn) {
  auto f = fixture("dgx-a");
  auto shared = plan_binding(f, 8, {});
  EXPECT_FALSE(shared.ranks[3].nccl_ib_hca);
  BindingSpec spec;
  spec.nic = NicBinding::rank;
  auto p = plan_binding(f, 8, spec);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(p.ranks[r].nccl_ib_hca, "=mlx5_" + std::to_string(r) + ":1") << r;  // its own rail only
  }
  EXPECT_EQ(p.nccl_ib_hca, shared.nccl_ib_hca);  // the node-wide value is still known
  EXPECT_EQ(binding::to_json(p.ranks[2])["nccl_ib_hca"], "=mlx5_2:1");
  // No IB device: nothing to restrict to.
  auto eth = plan_binding(fixture("dgx-no-ib"), 2, spec);
  EXPECT_FALSE(eth.ranks[0].nccl_ib_hca);
}

// Discovery over fixture trees (laid out as the kernel and the NVIDIA driver lay them out),
// the file parsers, FsRoot's confinement, and robustness on broken or unfamiliar layouts.
#include "facts/discover.hpp"
#include "facts/fs_root.hpp"
#include "test_util.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

using namespace ddp::facts;
using facts_test::ScratchTree;
using ::testing::ElementsAre;

namespace {
NodeFacts discover_tree(const std::filesystem::path& root) {
  DiscoverOptions o;
  o.root = root;
  return discover(o);  // NVML and dlopen are skipped by themselves: the root is not "/"
}
std::vector<std::string> nic_names(const NodeFacts& f) {
  std::vector<std::string> out;
  for (const auto& n : f.nics) out.push_back(n.name + (n.port ? ":" + std::to_string(*n.port) : ""));
  return out;
}
}  // namespace

TEST(Discover, DgxH100) {
  auto f = discover_tree(facts_test::sysfs_fixture("dgx-h100"));
  EXPECT_EQ(f.hostname, "dgx-h100-01");
  ASSERT_EQ(f.numa_nodes.size(), 2u);
  EXPECT_EQ(f.numa_nodes[0].cpus, "0-55,112-167");
  EXPECT_EQ(f.numa_nodes[1].cpus, "56-111,168-223");

  ASSERT_EQ(f.gpus.size(), 8u);  // the two NVSwitches (class 0x0680) are not GPUs
  const char* buses[] = {"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
                         "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"};
  for (int i = 0; i < 8; ++i) {
    const auto& g = f.gpus[i];
    EXPECT_EQ(g.index, i);
    EXPECT_EQ(g.pci_bus_id, buses[i]);
    EXPECT_EQ(g.numa_node, i < 4 ? 0 : 1);
    EXPECT_EQ(g.name, "NVIDIA H100 80GB HBM3");
    EXPECT_EQ(g.pci_id, "10de:2330");
    EXPECT_THAT(*g.uuid, ::testing::StartsWith("GPU-6a1e5f33-"));
    EXPECT_EQ(g.local_cpus, i < 4 ? "0-55,112-167" : "56-111,168-223");
    EXPECT_FALSE(g.memory_mib);  // NVML only
  }
  EXPECT_EQ(f.gpus[0].sysfs_path, "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0");

  EXPECT_THAT(nic_names(f),
              ElementsAre("mlx5_0:1", "mlx5_1:1", "mlx5_2:1", "mlx5_3:1", "mlx5_4:1", "mlx5_5:1", "mlx5_6:1",
                          "mlx5_7:1", "eno1", "eno2"));  // IPoIB netdevs, lo and docker0 are not NICs
  const auto& ib0 = f.nics[0];
  EXPECT_EQ(ib0.kind, NicKind::ib);
  EXPECT_EQ(ib0.netdev, "ibp25s0");
  EXPECT_EQ(ib0.pci_bus_id, "0000:19:00.0");
  EXPECT_EQ(ib0.state, "active");
  EXPECT_EQ(ib0.link_layer, "infiniband");
  EXPECT_EQ(ib0.speed_mbps, 400000u);
  EXPECT_EQ(f.nics[7].numa_node, 1);
  // GPU 0 and mlx5_0 hang off the same PCIe switch (0000:16:00.0).
  EXPECT_EQ(ib0.sysfs_path->substr(0, 46), f.gpus[0].sysfs_path->substr(0, 46));
  const auto& eno1 = f.nics[8];
  EXPECT_EQ(eno1.kind, NicKind::eth);
  EXPECT_EQ(eno1.state, "up");
  EXPECT_EQ(eno1.speed_mbps, 10000u);
  EXPECT_EQ(f.nics[9].state, "down");
  EXPECT_FALSE(f.nics[9].speed_mbps);  // "-1"

  EXPECT_EQ(f.versions.driver, "550.54.15");
  EXPECT_EQ(f.versions.kernel, "5.15.0-1042-nvidia");
  EXPECT_EQ(f.versions.torch, "2.3.0a0+ebedce2");
  EXPECT_FALSE(f.versions.nccl);  // needs the live machine's loader
  EXPECT_TRUE(f.limits.memlock->soft_unlimited());
  EXPECT_EQ(f.limits.nofile->soft, 1048576u);
  EXPECT_EQ(f.limits.shm_bytes, 2113645692ull * 1024 / 2);  // tmpfs without size=: half of RAM
  EXPECT_EQ(*f.container_runtimes, (std::vector<std::string>{"docker", "enroot", "nvidia-container-toolkit"}));
}

TEST(Discover, UnevenAmdLayout) {
  auto f = discover_tree(facts_test::sysfs_fixture("amd-uneven"));
  ASSERT_EQ(f.numa_nodes.size(), 8u);
  EXPECT_EQ(f.numa_nodes[6].cpus, "72-83,168-179");
  ASSERT_EQ(f.gpus.size(), 4u);
  std::vector<int> numa;
  for (const auto& g : f.gpus) numa.push_back(g.numa_node);
  EXPECT_THAT(numa, ElementsAre(1, 2, 6, 7));
  EXPECT_EQ(f.gpus[2].local_cpus, "72-83,168-179");
  EXPECT_EQ(f.versions.driver, "570.124.06");  // the open kernel module's version line
  EXPECT_FALSE(f.versions.torch);
  ASSERT_EQ(f.nics.size(), 5u);
  EXPECT_EQ(f.nics[4].name, "enp129s0f0np0");
  EXPECT_EQ(f.nics[4].numa_node, 4);
  EXPECT_EQ(f.nics[4].speed_mbps, 25000u);
  EXPECT_EQ(f.limits.nofile->soft, 65536u);
  EXPECT_EQ(f.limits.nofile->hard, 524288u);
  EXPECT_EQ(f.limits.shm_bytes, 64ull << 30);
  EXPECT_EQ(*f.container_runtimes, (std::vector<std::string>{"podman", "apptainer", "nvidia-container-toolkit"}));
}

TEST(Discover, CpuOnlyNode) {
  auto f = discover_tree(facts_test::sysfs_fixture("cpu-only"));
  EXPECT_EQ(f.hostname, "cpu-node-3");
  ASSERT_EQ(f.numa_nodes.size(), 1u);
  EXPECT_EQ(f.numa_nodes[0].cpus, "0-15");
  EXPECT_TRUE(f.gpus.empty());
  EXPECT_FALSE(f.versions.driver);
  ASSERT_EQ(f.nics.size(), 1u);
  EXPECT_EQ(f.nics[0].name, "eth0");
  EXPECT_EQ(f.nics[0].pci_bus_id, "0000:00:03.0");  // virtio2's parent PCI function
  EXPECT_EQ(f.nics[0].numa_node, 0);                // sysfs says -1
  EXPECT_EQ(f.limits.memlock->soft, 8u << 20);
  EXPECT_EQ(f.limits.shm_bytes, 4ull << 30);
  EXPECT_EQ(f.versions.torch, "1.13.0a0");
}

TEST(Discover, EmptyRootGivesAnEmptyNodeNotACrash) {
  ScratchTree t;
  auto f = discover_tree(t.root());
  EXPECT_EQ(f.hostname, "localhost");
  ASSERT_EQ(f.numa_nodes.size(), 1u);  // kernel without NUMA: node 0
  EXPECT_TRUE(f.gpus.empty());
  EXPECT_TRUE(f.nics.empty());
  EXPECT_FALSE(f.limits.memlock);
  EXPECT_TRUE(f.container_runtimes->empty());
}

TEST(Discover, GpuWithoutDriverInfoAndGarbageFiles) {
  ScratchTree t;
  t.write("sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/vendor", "0x10de\n");
  t.write("sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/device", "0x20b0\n");
  t.write("sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/class", "0x030200\n");
  t.write("sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/numa_node", "banana\n");
  t.write("sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/local_cpulist", "not-a-list\n");
  t.link("sys/bus/pci/devices/0000:01:00.0", "../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0");
  t.link("sys/bus/pci/devices/garbage", "../../../devices/nowhere");
  t.write("sys/devices/system/node/node0/cpulist", "0-7\n");
  t.write("sys/devices/system/node/nodeX/cpulist", "0-7\n");
  t.write("sys/devices/system/node/node1/cpulist", "\n");  // memory-only node (CXL)
  t.write("proc/self/limits", "Max open files  lots  of\n");
  t.write("proc/driver/nvidia/version", "something else entirely\n");
  t.write("sys/class/infiniband/mlx5_9/ports/1/state", "1: DOWN\n");  // HCA without a device link
  t.write("sys/class/infiniband/mlx5_9/ports/x/state", "4: ACTIVE\n");
  auto f = discover_tree(t.root());
  ASSERT_EQ(f.gpus.size(), 1u);
  EXPECT_EQ(f.gpus[0].pci_id, "10de:20b0");
  EXPECT_FALSE(f.gpus[0].name);
  EXPECT_FALSE(f.gpus[0].uuid);
  EXPECT_EQ(f.gpus[0].numa_node, 0);
  EXPECT_FALSE(f.gpus[0].local_cpus);
  EXPECT_FALSE(f.versions.driver);
  ASSERT_EQ(f.numa_nodes.size(), 2u);
  EXPECT_EQ(f.numa_nodes[1].cpus, "");
  EXPECT_FALSE(f.limits.nofile);
  ASSERT_EQ(f.nics.size(), 1u);
  EXPECT_EQ(f.nics[0].state, "down");
  EXPECT_FALSE(f.nics[0].pci_bus_id);
}

TEST(Discover, RoceHcaClaimsItsEthernetNetdev) {
  ScratchTree t;
  std::string dev = "sys/devices/pci0000:00/0000:00:02.0/0000:03:00.0";
  t.write(dev + "/vendor", "0x15b3\n");
  t.write(dev + "/numa_node", "1\n");
  t.link("sys/bus/pci/devices/0000:03:00.0", "../../../devices/pci0000:00/0000:00:02.0/0000:03:00.0");
  t.write(dev + "/net/ens3np0/type", "1\n");
  t.write(dev + "/net/ens3np0/operstate", "up\n");
  t.link(dev + "/net/ens3np0/device", "../../../0000:03:00.0");
  t.link("sys/class/net/ens3np0", "../../devices/pci0000:00/0000:00:02.0/0000:03:00.0/net/ens3np0");
  t.write(dev + "/infiniband/mlx5_0/ports/1/state", "4: ACTIVE\n");
  t.write(dev + "/infiniband/mlx5_0/ports/1/rate", "100 Gb/sec (2X HDR)\n");
  t.write(dev + "/infiniband/mlx5_0/ports/1/link_layer", "Ethernet\n");
  t.write(dev + "/infiniband/mlx5_0/ports/1/gid_attrs/ndevs/0", "ens3np0\n");
  t.link(dev + "/infiniband/mlx5_0/device", "../../../0000:03:00.0");
  t.link("sys/class/infiniband/mlx5_0", "../../devices/pci0000:00/0000:00:02.0/0000:03:00.0/infiniband/mlx5_0");
  auto f = discover_tree(t.root());
  ASSERT_EQ(f.nics.size(), 1u);
  EXPECT_EQ(f.nics[0].kind, NicKind::ib);
  EXPECT_EQ(f.nics[0].link_layer, "ethernet");
  EXPECT_EQ(f.nics[0].netdev, "ens3np0");
  EXPECT_EQ(f.nics[0].numa_node, 1);
  EXPECT_EQ(f.nics[0].speed_mbps, 100000u);
}

TEST(FsRoot, ConfinesSymlinksToTheRoot) {
  ScratchTree t;
  t.write("etc/hostname", "inside\n");
  t.link("abs", "/etc");               // absolute: taken relative to the root
  t.link("up", "../../../../../etc");  // ".." stops at the root
  t.link("loop1", "loop2");
  t.link("loop2", "loop1");
  FsRoot fs(t.root());
  EXPECT_FALSE(fs.is_live());
  EXPECT_EQ(fs.read_line("/abs/hostname"), "inside");
  EXPECT_EQ(fs.read_line("up/hostname"), "inside");
  EXPECT_EQ(fs.resolve("/abs/hostname"), "/etc/hostname");
  EXPECT_FALSE(fs.resolve("/loop1"));
  EXPECT_FALSE(fs.read("/missing"));
  EXPECT_TRUE(fs.list("/missing").empty());
  EXPECT_TRUE(FsRoot("/").is_live());
}

TEST(Parse, NvidiaFiles) {
  auto info = parse::nvidia_information(
      "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 200\nGPU UUID: \t GPU-abc\nBus Location: \t 0000:18:00.0\nDevice "
      "Minor: \t 0\n");
  EXPECT_EQ(info.model, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(info.uuid, "GPU-abc");
  EXPECT_EQ(info.bus_location, "0000:18:00.0");
  EXPECT_EQ(parse::nvidia_driver_version(
                "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023\n"),
            "535.129.03");
  EXPECT_EQ(
      parse::nvidia_driver_version("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  "
                                   "(dvs-builder@U16)  Tue Mar  5 22:15:33 UTC 2024\n"),
      "550.54.15");
  EXPECT_EQ(parse::nvidia_driver_version(
                "NVRM version: NVIDIA UNIX aarch64 Kernel Module  560.35.03  Fri Aug 16 21:22:33 UTC 2024"),
            "560.35.03");
  EXPECT_FALSE(parse::nvidia_driver_version("garbage 1.2.3"));
}

TEST(Parse, SysfsAndProcValues) {
  EXPECT_EQ(parse::ib_rate_mbps("400 Gb/sec (4X NDR)"), 400000u);
  EXPECT_EQ(parse::ib_rate_mbps("53.125 Gb/sec (1X HDR)"), 53125u);
  EXPECT_EQ(parse::ib_rate_mbps("2.5 Gb/sec (1X SDR)"), 2500u);
  EXPECT_FALSE(parse::ib_rate_mbps("fast"));
  EXPECT_EQ(parse::ib_state("4: ACTIVE"), "active");
  EXPECT_EQ(parse::ib_state("1: DOWN\n"), "down");
  auto limits =
      "Limit                     Soft Limit           Hard Limit           Units     \n"
      "Max open files            1024                 1048576              files     \n"
      "Max locked memory         8388608              unlimited            bytes     \n";
  auto nofile = parse::proc_limit(limits, "Max open files");
  EXPECT_EQ(nofile->soft, 1024u);
  EXPECT_EQ(nofile->hard, 1048576u);
  auto memlock = parse::proc_limit(limits, "Max locked memory");
  EXPECT_EQ(memlock->soft, 8388608u);
  EXPECT_FALSE(memlock->hard);
  EXPECT_FALSE(parse::proc_limit(limits, "Max processes"));
  auto mounts = "tmpfs /dev/shm tmpfs rw,nosuid,nodev,size=65536k 0 0\nshm /dev/shm tmpfs rw,size=2g 0 0\n";
  EXPECT_EQ(parse::tmpfs_size(mounts, "/dev/shm"), 2ull << 30);  // the last mount wins
  EXPECT_EQ(parse::tmpfs_size("tmpfs /dev/shm tmpfs rw,size=65536k 0 0\n", "/dev/shm"), 64ull << 20);
  EXPECT_FALSE(parse::tmpfs_size("tmpfs /dev/shm tmpfs rw,inode64 0 0\n", "/dev/shm"));
  EXPECT_EQ(parse::torch_version("__version__ = '2.3.0+cu121'\ndebug = False\n"), "2.3.0+cu121");
  EXPECT_EQ(parse::torch_version("__version__ = \"1.13.1\"\n"), "1.13.1");
  EXPECT_FALSE(parse::torch_version("version = '1'\n"));
  EXPECT_EQ(parse::last_pci_bus_id("/sys/devices/pci0000:00/0000:00:03.0/virtio2/net/eth0"), "0000:00:03.0");
  EXPECT_EQ(parse::last_pci_bus_id("/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:19:00.0"), "0000:19:00.0");
  EXPECT_FALSE(parse::last_pci_bus_id("/sys/devices/virtual/net/lo"));
}

TEST(Discover, LiveMachineAnswersWithoutThrowing) {
  auto f = discover(DiscoverOptions{});
  EXPECT_FALSE(f.hostname.empty());
  EXPECT_FALSE(f.numa_nodes.empty());
  EXPECT_TRUE(f.limits.nofile.has_value());
}

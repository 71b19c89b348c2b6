// Consistency: planted mismatches are found and name nodes and values; clean sets pass; the
// job decides what matters.
#include "facts/consistency.hpp"
#include "facts/report.hpp"
#include "test_util.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

using namespace ddp::facts;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

namespace {

std::vector<NodeFacts> load(std::initializer_list<const char*> names) {
  std::vector<NodeFacts> out;
  for (auto n : names) out.push_back(load_facts_file(facts_test::facts_fixture(n)));
  return out;
}

const Finding* find(const std::vector<Finding>& fs, const std::string& code) {
  for (const auto& f : fs)
    if (f.code == code) return &f;
  return nullptr;
}

std::string codes(const std::vector<Finding>& fs) {
  std::string out;
  for (const auto& f : fs) out += std::string(to_string(f.severity)) + ":" + f.code + " ";
  return out;
}

std::vector<Finding> check(const std::vector<NodeFacts>& nodes) {
  return check_consistency(nodes, default_job_needs(nodes));
}

}  // namespace

TEST(Consistency, CleanSetsPass) {
  for (auto set :
       {load({"dgx-a", "dgx-b"}), load({"cpu-a", "cpu-b"}), load({"dgx-a"}), load({"cpu-a", "cpu-future"})}) {
    auto fs = check(set);
    EXPECT_FALSE(has_errors(fs)) << codes(fs);
    for (const auto& f : fs) EXPECT_EQ(f.severity, Severity::info) << f.message;
  }
}

TEST(Consistency, DriverMismatchNamesNodesAndValues) {
  auto fs = check(load({"dgx-a", "dgx-b", "dgx-driver"}));
  ASSERT_TRUE(has_errors(fs));
  auto* f = find(fs, "driver-version-mismatch");
  ASSERT_NE(f, nullptr) << codes(fs);
  EXPECT_EQ(f->severity, Severity::error);
  EXPECT_THAT(f->message, HasSubstr("550.54.15 on dgx-a, dgx-b; 535.161.08 on dgx-c"));
}

TEST(Consistency, MissingGpu) {
  auto fs = check(load({"dgx-a", "dgx-gpu-missing"}));
  auto* f = find(fs, "gpu-count-mismatch");
  ASSERT_NE(f, nullptr) << codes(fs);
  EXPECT_EQ(f->severity, Severity::error);
  EXPECT_THAT(f->message, HasSubstr("7 GPUs on dgx-d"));
  EXPECT_THAT(f->message, HasSubstr("8 GPUs on dgx-a"));
}

TEST(Consistency, NcclMismatch) {
  auto fs = check(load({"dgx-a", "dgx-b", "dgx-nccl"}));
  auto* f = find(fs, "nccl-version-mismatch");
  ASSERT_NE(f, nullptr) << codes(fs);
  EXPECT_EQ(f->severity, Severity::error);
  EXPECT_THAT(f->message, HasSubstr("2.21.5 on dgx-a, dgx-b; 2.19.3 on dgx-e"));
  EXPECT_THAT(f->nodes, ::testing::UnorderedElementsAre("dgx-a", "dgx-b", "dgx-e"));
}

TEST(Consistency, NodeWithoutIb) {
  auto fs = check(load({"dgx-a", "dgx-no-ib"}));
  auto* f = find(fs, "nic-kind-mismatch");
  ASSERT_NE(f, nullptr) << codes(fs);
  EXPECT_EQ(f->severity, Severity::error);
  EXPECT_THAT(f->message, HasSubstr("RDMA (ib) on dgx-a but not on dgx-f"));
  EXPECT_THAT(f->nodes, ::testing::ElementsAre("dgx-f"));
  // A job that turned RDMA off does not care.
  JobNeeds job;
  job.rdma = false;
  EXPECT_FALSE(has_errors(check_consistency(load({"dgx-a", "dgx-no-ib"}), job)));
}

TEST(Consistency, JudgedAgainstTheJob) {
  auto mixed = load({"dgx-a", "cpu-a"});
  auto gpu = check_consistency(mixed, default_job_needs(mixed));  // any GPU -> GPU job
  EXPECT_NE(find(gpu, "gpu-missing"), nullptr) << codes(gpu);
  EXPECT_THAT(find(gpu, "gpu-missing")->message, HasSubstr("cpu-a has none"));
  JobNeeds cpu_job;
  cpu_job.gpu = false;
  auto cpu = check_consistency(mixed, cpu_job);
  EXPECT_FALSE(has_errors(cpu)) << codes(cpu);
  EXPECT_EQ(find(cpu, "gpu-missing"), nullptr);
  // A CPU job with differing drivers: info, not an error.
  auto drv = check_consistency(load({"dgx-a", "dgx-driver"}), cpu_job);
  EXPECT_EQ(find(drv, "driver-version-mismatch")->severity, Severity::info);
  // RDMA demanded: a node without it is an error even alone.
  JobNeeds rdma;
  rdma.rdma = true;
  auto r = check_consistency(load({"cpu-a"}), JobNeeds{false, true, std::nullopt});
  EXPECT_NE(find(r, "rdma-missing"), nullptr) << codes(r);
}

TEST(Consistency, LimitsThatBite) {
  auto nodes = load({"dgx-a", "dgx-b"});
  nodes[1].limits.memlock = Limit{8u << 20, 8u << 20};
  nodes[1].limits.shm_bytes = 64u << 20;
  nodes[0].limits.nofile = Limit{200, 200};
  auto fs = check(nodes);
  auto* m = find(fs, "memlock-low");
  ASSERT_NE(m, nullptr) << codes(fs);
  EXPECT_EQ(m->severity, Severity::error);
  EXPECT_THAT(m->message, HasSubstr("dgx-b: locked-memory limit 8 MiB"));
  auto* s = find(fs, "shm-small");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->severity, Severity::error);
  EXPECT_THAT(s->message, HasSubstr("dgx-b: /dev/shm is 64 MiB"));
  auto* n = find(fs, "nofile-low");
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->severity, Severity::error);
  EXPECT_THAT(n->message, HasSubstr("dgx-a: open-files limit 200 is below 288"));  // 2*16 + 256

  // Finite but large memlock: a warning. nofile 1024: a warning. CPU node: small shm is a warning.
  nodes = load({"dgx-a", "dgx-b"});
  nodes[0].limits.memlock = Limit{64ull << 30, 64ull << 30};
  nodes[0].limits.nofile = Limit{1024, 4096};
  fs = check(nodes);
  EXPECT_FALSE(has_errors(fs)) << codes(fs);
  EXPECT_EQ(find(fs, "memlock-finite")->severity, Severity::warning);
  EXPECT_EQ(find(fs, "nofile-low")->severity, Severity::warning);
  auto cpu = load({"cpu-a"});
  cpu[0].limits.shm_bytes = 64u << 20;
  fs = check(cpu);
  EXPECT_EQ(find(fs, "shm-small")->severity, Severity::warning);
  EXPECT_EQ(find(fs, "memlock-low"), nullptr);  // no RDMA there
}

TEST(Consistency, DuplicatesAndDownPorts) {
  auto fs = check(load({"dgx-a", "dgx-a"}));
  EXPECT_NE(find(fs, "duplicate-node"), nullptr) << codes(fs);
  EXPECT_NE(find(fs, "duplicate-gpu"), nullptr);
  EXPECT_TRUE(has_errors(fs));

  auto nodes = load({"dgx-a", "dgx-b"});
  nodes[1].nics[3].state = "down";
  fs = check(nodes);
  auto* d = find(fs, "ib-port-down");
  ASSERT_NE(d, nullptr) << codes(fs);
  EXPECT_EQ(d->severity, Severity::warning);
  EXPECT_THAT(d->message, HasSubstr("dgx-b: RDMA ports not active: mlx5_3:1 (down)"));
  EXPECT_THAT(find(fs, "ib-port-count")->message, HasSubstr("7 active on dgx-b"));
}

TEST(Consistency, MixedGpuModelsWarn) {
  auto nodes = load({"dgx-a", "dgx-b"});
  for (auto& g : nodes[1].gpus) g.name = "NVIDIA A100-SXM4-80GB";
  auto fs = check(nodes);
  EXPECT_FALSE(has_errors(fs));
  EXPECT_THAT(find(fs, "gpu-model-mismatch")->message, HasSubstr("NVIDIA A100-SXM4-80GB on dgx-b"));
}

TEST(Report, RendersTablesAndVerdict) {
  auto nodes = load({"dgx-a", "dgx-nccl"});
  auto table = format_node(nodes[0]);
  EXPECT_THAT(table, HasSubstr("node dgx-a"));
  EXPECT_THAT(table, HasSubstr("0000:18:00.0"));
  EXPECT_THAT(table, HasSubstr("mlx5_0:1"));
  EXPECT_THAT(table, HasSubstr("400 Gb/s"));
  EXPECT_THAT(format_nodes_summary(nodes), HasSubstr("8x NVIDIA H100 80GB HBM3"));
  auto text = format_findings(check(nodes));
  EXPECT_THAT(text, HasSubstr("error    NCCL versions differ"));
  EXPECT_THAT(text, HasSubstr("1 error(s)"));
  EXPECT_THAT(format_findings({}), HasSubstr("ok: no problems found"));
}

// ---- a container job's image (doctor --image / --job)

TEST(ImageDisagreement, SameOrUnknownDigestsAgree) {
  EXPECT_FALSE(image_disagreement("img:1", {}));
  EXPECT_FALSE(image_disagreement("img:1", {{"n1", "sha256:aa"}, {"n2", "sha256:aa"}, {"n3", ""}}));
}

TEST(ImageDisagreement, NamesEveryDigestAndItsNodesBiggestGroupFirst) {
  auto why = image_disagreement("img:1", {{"n1", "sha256:bb"}, {"n2", "sha256:aa"}, {"n3", "sha256:aa"}, {"n4", ""}});
  ASSERT_TRUE(why);
  EXPECT_EQ(*why, "the nodes have different images for img:1: n2, n3 have sha256:aa; n1 has sha256:bb");
}

TEST(Consistency, ImageMissingOrDifferentIsAnError) {
  auto nodes = load({"cpu-a", "cpu-b"});
  nodes[0].container_image = ContainerImage{"podman", "img:1", "sha256:aa", std::nullopt, std::nullopt};
  nodes[1].container_image = ContainerImage{"podman", "img:1", "sha256:aa", "sha256:cc", std::nullopt};
  const auto same = check(nodes);
  EXPECT_FALSE(has_errors(same)) << codes(same);
  nodes[1].container_image->digest = "sha256:bb";
  const auto differ = check(nodes);
  const auto* f = find(differ, "image-mismatch");
  ASSERT_TRUE(f) << codes(differ);
  EXPECT_EQ(f->severity, Severity::error);
  EXPECT_THAT(f->message, HasSubstr("sha256:aa"));
  EXPECT_THAT(f->message, HasSubstr("sha256:bb"));
  nodes[1].container_image->digest.reset();
  nodes[1].container_image->error = "image img:1 is not present on this node";
  const auto missing = check(nodes);
  const auto* m = find(missing, "image-missing");
  ASSERT_TRUE(m) << codes(missing);
  EXPECT_EQ(m->severity, Severity::error);
  EXPECT_THAT(m->message, HasSubstr("is not present on this node"));
  EXPECT_EQ(m->nodes, std::vector<std::string>{nodes[1].hostname});
  EXPECT_FALSE(find(missing, "image-mismatch"));
  // A node that did not look (its policy, or its lookups all busy) is unchecked, not missing.
  nodes[1].container_image->error = std::string(ddp::facts::kImageNotChecked) + "4 image lookups are already running";
  const auto unchecked = check(nodes);
  const auto* u = find(unchecked, "image-unchecked");
  ASSERT_TRUE(u) << codes(unchecked);
  EXPECT_EQ(u->severity, Severity::warning);
  EXPECT_FALSE(find(unchecked, "image-missing")) << codes(unchecked);
  EXPECT_FALSE(has_errors(unchecked)) << codes(unchecked);
}

// The job's PyTorch and Python (lib/pyenv's probe): another release or Python minor is an error.
namespace {
PythonFacts py(const char* version, std::optional<std::string> torch) {
  return PythonFacts{
      "/venv/bin/python3", "the command's program", "/usr/bin/python3.11", version, std::move(torch), {}};
}
}  // namespace

TEST(Consistency, TorchReleasesAndPythonMinorsMustMatch) {
  auto nodes = load({"cpu-a", "cpu-b"});
  nodes[0].python = py("3.11.2", "2.11.0+cu128");
  nodes[1].python = py("3.11.9", "2.11.0+cu128");
  EXPECT_FALSE(has_errors(check(nodes))) << codes(check(nodes));  // patch releases of Python agree

  nodes[1].python = py("3.11.2", "2.11.0+cu126");  // another build of one release: a warning
  auto fs = check(nodes);
  ASSERT_TRUE(find(fs, "torch-version-mismatch")) << codes(fs);
  EXPECT_EQ(find(fs, "torch-version-mismatch")->severity, Severity::warning);
  EXPECT_FALSE(find(fs, "torch-release-mismatch"));

  nodes[1].python = py("3.11.2", "2.10.1");  // another release: an error naming both
  fs = check(nodes);
  ASSERT_TRUE(find(fs, "torch-release-mismatch")) << codes(fs);
  EXPECT_EQ(find(fs, "torch-release-mismatch")->severity, Severity::error);
  EXPECT_THAT(find(fs, "torch-release-mismatch")->message, HasSubstr("2.10 on cpu-b"));
  EXPECT_THAT(find(fs, "torch-release-mismatch")->message, HasSubstr("2.11 on cpu-a"));

  nodes[1].python = py("3.11.2", std::nullopt);  // the interpreter answered: no torch there
  fs = check(nodes);
  ASSERT_TRUE(find(fs, "python-no-torch")) << codes(fs);  // said once, as what it is
  EXPECT_THAT(find(fs, "python-no-torch")->nodes, ElementsAre("cpu-b"));
  EXPECT_FALSE(find(fs, "torch-release-mismatch")) << codes(fs);

  nodes[1].python = py("3.12.1", "2.11.0+cu128");  // another Python minor: an error
  fs = check(nodes);
  ASSERT_TRUE(find(fs, "python-version-mismatch")) << codes(fs);
  EXPECT_EQ(find(fs, "python-version-mismatch")->severity, Severity::error);

  // Where a node's torch is only the system Python's (no probe), a release mismatch is a warning.
  nodes[1].python.reset();
  nodes[1].versions.torch = "2.3.0";
  fs = check(nodes);
  ASSERT_TRUE(find(fs, "torch-release-mismatch")) << codes(fs);
  EXPECT_EQ(find(fs, "torch-release-mismatch")->severity, Severity::warning);

  // A probe that failed is unknown, never a mismatch.
  nodes[1].python = PythonFacts{"python3", "a guess", {}, {}, {}, std::string("python3 not found")};
  fs = check(nodes);
  EXPECT_FALSE(find(fs, "torch-release-mismatch")) << codes(fs);
  EXPECT_FALSE(find(fs, "python-version-mismatch")) << codes(fs);
}

// The job's own interpreter without torch is an error even where no other node has torch to
// compare with: the job would stop at `import torch` (doctor said "ok" for it). A guessed one (no
// job file, or a shell command) is a warning. Either says which interpreter and how to fix it.
TEST(Consistency, AnInterpreterWithoutTorchIsAFindingOnItsOwn) {
  auto nodes = load({"cpu-a"});
  nodes[0].python = py("3.11.2", std::nullopt);
  auto fs = check(nodes);
  ASSERT_TRUE(find(fs, "python-no-torch")) << codes(fs);
  EXPECT_EQ(find(fs, "python-no-torch")->severity, Severity::error);
  EXPECT_TRUE(has_errors(fs));
  const auto& own = find(fs, "python-no-torch")->message;
  EXPECT_THAT(own, HasSubstr("/venv/bin/python3 (the command's program)"));
  EXPECT_THAT(own, HasSubstr("import torch"));
  EXPECT_THAT(own, HasSubstr("python: key"));

  nodes[0].python->guessed = true;
  nodes[0].python->source = "python3 on PATH";
  fs = check(nodes);
  ASSERT_TRUE(find(fs, "python-no-torch")) << codes(fs);
  EXPECT_EQ(find(fs, "python-no-torch")->severity, Severity::warning);
  EXPECT_FALSE(has_errors(fs));
  EXPECT_THAT(find(fs, "python-no-torch")->message, HasSubstr("ddpctl doctor --job FILE"));
  // A guess made for --job (its command is not a Python): no --job hint, the python: key.
  nodes[0].python->source = "a guess: python3 on the job's PATH, as the command is not a Python";
  fs = check(nodes);
  ASSERT_TRUE(find(fs, "python-no-torch")) << codes(fs);
  EXPECT_EQ(find(fs, "python-no-torch")->severity, Severity::warning);
  EXPECT_THAT(find(fs, "python-no-torch")->message, Not(HasSubstr("--job")));
  EXPECT_THAT(find(fs, "python-no-torch")->message, HasSubstr("with the job file's python: key"));

  // Two nodes, the same interpreter: one finding naming both.
  nodes = load({"cpu-a", "cpu-b"});
  nodes[0].python = nodes[1].python = py("3.11.2", std::nullopt);
  fs = check(nodes);
  EXPECT_EQ(std::count_if(fs.begin(), fs.end(), [](const Finding& f) { return f.code == "python-no-torch"; }), 1);
  EXPECT_THAT(find(fs, "python-no-torch")->nodes, ElementsAre("cpu-a", "cpu-b"));

  // An interpreter that did not answer: not known, a warning that says why.
  nodes[1].python = PythonFacts{"python3", "a guess", {}, {}, {}, std::string("python3 not found")};
  fs = check(nodes);
  ASSERT_TRUE(find(fs, "python-unknown")) << codes(fs);
  EXPECT_EQ(find(fs, "python-unknown")->severity, Severity::warning);
  EXPECT_THAT(find(fs, "python-unknown")->message, HasSubstr("python3 not found"));

  // With torch there, nothing.
  nodes[0].python = nodes[1].python = py("3.11.2", "2.11.0");
  EXPECT_FALSE(find(check(nodes), "python-no-torch"));
}

// The versions table and the python section give one answer for torch: the interpreter's,
// also when it has none (the table showed the system Python's torch/version.py beside "torch
// none"); without a probe the table says the torch is the system Python's.
TEST(Report, TheVersionsTableSaysTheSameTorchAsThePythonSection) {
  auto nodes = load({"cpu-a"});
  nodes[0].versions.torch = "1.13.0a0";  // the system Python's, as discover reads it
  auto node = nodes[0];
  EXPECT_THAT(format_node(node), HasSubstr("torch of the system Python"));
  EXPECT_TRUE(torch_shown(node).of_system_python);

  set_python(node, py("3.11.7", std::nullopt));  // the job's: none
  EXPECT_FALSE(node.versions.torch);
  auto table = format_node(node);
  EXPECT_THAT(table, Not(HasSubstr("1.13.0a0"))) << table;
  EXPECT_THAT(table, HasSubstr("torch of the python below"));
  EXPECT_THAT(table, HasSubstr("torch none"));
  EXPECT_EQ(torch_shown(node).value, "none");

  // A facts file of an older ddpctl (versions.torch the system's beside a python without
  // torch) reads the same way.
  node.versions.torch = "1.13.0a0";
  EXPECT_THAT(format_node(node), Not(HasSubstr("1.13.0a0")));

  node = nodes[0];
  set_python(node, py("3.11.7", "2.11.0"));
  EXPECT_EQ(node.versions.torch, "2.11.0");
  node = nodes[0];
  set_python(node, PythonFacts{"python3", "a guess", {}, {}, {}, std::string("python3 not found")});
  EXPECT_FALSE(node.versions.torch);  // not known: not the system Python's either
  EXPECT_EQ(torch_shown(node).value, "-");

  // Several nodes: a torch that is the system Python's is marked where others' were asked.
  auto pair = load({"cpu-a", "cpu-b"});
  pair[0].versions.torch = pair[1].versions.torch = "1.13.0a0";
  EXPECT_THAT(format_nodes_summary(pair), HasSubstr("torch: the system Python's"));
  set_python(pair[0], py("3.11.7", std::nullopt));
  auto summary = format_nodes_summary(pair);
  EXPECT_THAT(summary, HasSubstr("1.13.0a0 (system)"));
  EXPECT_THAT(summary, HasSubstr("none"));
}

TEST(Report, ShowsTheJobsPython) {
  auto nodes = load({"cpu-a"});
  nodes[0].python = py("3.11.2", "1.13.1");
  auto table = format_node(nodes[0]);
  EXPECT_THAT(table, HasSubstr("/venv/bin/python3 -> /usr/bin/python3.11"));
  EXPECT_THAT(table, HasSubstr("Python 3.11.2, torch 1.13.1"));
  // and the facts file keeps it
  auto back = from_json(to_json(nodes[0]), "t");
  ASSERT_TRUE(back.python);
  EXPECT_EQ(back.python->torch, "1.13.1");
  EXPECT_EQ(back.python->executable, "/usr/bin/python3.11");
  EXPECT_FALSE(back.python->guessed);
  EXPECT_FALSE(to_json(nodes[0])["python"].contains("guessed"));  // only a guess says so
  nodes[0].python->guessed = true;
  EXPECT_TRUE(from_json(to_json(nodes[0]), "t").python->guessed);
  // A node's facts from a ddpctl before `guessed`: its guess said so in `source` alone.
  auto old = to_json(nodes[0]);
  old["python"].erase("guessed");
  old["python"]["source"] = "a guess: python3 on the job's PATH, as the command is not a Python";
  EXPECT_TRUE(from_json(old, "t").python->guessed);
  old["python"]["source"] = "python3 on PATH (give --job FILE to ask the job's own interpreter)";  // doctor's own
  EXPECT_TRUE(from_json(old, "t").python->guessed);
  old["python"]["source"] = "the command's program";
  EXPECT_FALSE(from_json(old, "t").python->guessed);
}

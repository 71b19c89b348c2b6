// Every runtime's command line for ranks planned on a recorded 8-GPU node (tests/fixtures/facts),
// with and without RDMA devices and an unlimited memlock: the argv a user would type by hand.
#include "container/container.hpp"
#include "binding/binding.hpp"
#include "container/runtime.hpp"
#include "facts/model.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

using namespace ddp;
using container::HostLayout;
using jobspec::ContainerRuntime;
using testing::Contains;
using testing::ElementsAre;
using testing::HasSubstr;
using testing::Not;

namespace {

std::filesystem::path source_dir() {
  const char* s = std::getenv("DDP_SOURCE_DIR");
  return s ? std::filesystem::path(s) : std::filesystem::path(DDP_FALLBACK_SOURCE_DIR);
}

std::string uuid(int i) {
  return "GPU-6a1e5f33-9c0b-4d7e-8a21-00000000aa0" + std::to_string(i);
}
std::string all_uuids() {
  std::string s;
  for (int i = 0; i < 8; ++i) {
    if (i) s += ',';
    s += uuid(i);
  }
  return s;
}

const container::Owner kOwner{4242, 987654};
const contract::Env kInherited{{"PATH", "/usr/bin:/bin"},
                               {"HOME", "/root"},
                               {"LD_LIBRARY_PATH", "/opt/host/lib"},
                               {"NCCL_DEBUG", "INFO"},
                               {"CONTAINERS_CONF", "/etc/ddp-test/containers.conf"},
                               {"RANK", "7"}};  // a stale one of another launcher

jobspec::JobSpec job(const std::string& container_yaml, const std::string& extra = "") {
  return jobspec::parse_job_yaml("name: resnet\nnproc_per_node: 8\ncommand: [python3, train.py, --epochs, '90']\n" +
                                     extra + "container:\n" + container_yaml,
                                 "train.yaml");
}

// The plan the launcher makes for dgx-a: contract from the forwarded environment, then the
// binding's variables and CPUs, then the container.
contract::Plan plan_for(const jobspec::JobSpec& spec, const HostLayout& host, int attempt = 0) {
  auto f = facts::load_facts_file(source_dir() / "tests/fixtures/facts/dgx-a.json");
  contract::NodeContext node;
  node.job_id = "resnet-20261202-130000-ab12";
  node.node_name = "dgx-a";
  node.local_world_size = 8;
  node.world_size = 8;
  node.attempt_dir = "/var/log/ddp/resnet-20261202-130000-ab12/attempt-0";
  auto plan = contract::make_plan(spec, node, container::forwarded_into_container(kInherited, spec));
  auto b = binding::plan_binding(f, 8, spec.binding);
  for (auto& r : plan.ranks) {
    const auto& rb = b.ranks.at(static_cast<std::size_t>(r.local_rank));
    if (rb.cuda_visible_devices) r.env["CUDA_VISIBLE_DEVICES"] = *rb.cuda_visible_devices;
    r.cpus = rb.cpus;
    r.mem_node = rb.numa_node;
  }
  container::wrap_plan(plan, spec, kInherited, host, attempt, kOwner, "/home/u/project");
  return plan;
}

const HostLayout kIb{{"/dev/infiniband/rdma_cm", "/dev/infiniband/uverbs0"}, std::nullopt};
const HostLayout kNoIbLimited{{}, 8u << 20};

const std::string kYaml =
    "  runtime: RT\n  image: nvcr.io/nvidia/pytorch:24.05-py3\n"
    "  mounts: ['./:/workspace', '/data:/data:ro']\n  workdir: /workspace\n"
    "  extra_args: [--shm-size, 16g]\n  env: {HF_HOME: /data/hf}\n";
std::string yaml_for(const std::string& rt) {
  auto s = kYaml;
  s.replace(s.find("RT"), 2, rt);
  return s;
}

}  // namespace

TEST(Container, PodmanRankFive) {
  auto plan = plan_for(job(yaml_for("podman")), kIb);
  const auto& r = plan.ranks.at(5);
  std::vector<std::string> want{"podman",
                                "run",
                                "--rm",
                                "--init",
                                "--name",
                                "ddpctl-resnet-20261202-130000-ab12-a0-r5",
                                "--label",
                                "ddpctl.job=resnet-20261202-130000-ab12",
                                "--label",
                                "ddpctl.rank=5",
                                "--label",
                                "ddpctl.owner=4242-987654",
                                "--network",
                                "host",
                                "--ipc",
                                "host",
                                "--pull=never",
                                "--ulimit",
                                "memlock=-1:-1",
                                "--cpuset-cpus",
                                "56-111,168-223",
                                "--cpuset-mems",
                                "1",
                                "--device",
                                "/dev/infiniband/rdma_cm",
                                "--device",
                                "/dev/infiniband/uverbs0"};
  for (int i = 0; i < 8; ++i) want.insert(want.end(), {"--device", "nvidia.com/gpu=" + uuid(i)});
  want.insert(want.end(),
              {"--env-file", "/var/log/ddp/resnet-20261202-130000-ab12/attempt-0/rank-5.env", "--volume",
               "/home/u/project:/workspace", "--volume", "/data:/data:ro", "--workdir", "/workspace", "--shm-size",
               "16g", "nvcr.io/nvidia/pytorch:24.05-py3", "python3", "train.py", "--epochs", "90"});
  EXPECT_EQ(r.argv, want);
  ASSERT_TRUE(r.container);
  EXPECT_EQ(r.container->runtime, "podman");
  EXPECT_EQ(r.container->name, "ddpctl-resnet-20261202-130000-ab12-a0-r5");
  // Inside: the contract, the binding, forwarded NCCL_*, the container's env; no host paths.
  const auto& in = r.container->env;
  EXPECT_EQ(in.at("RANK"), "5");
  EXPECT_EQ(in.at("LOCAL_RANK"), "5");
  EXPECT_EQ(in.at("WORLD_SIZE"), "8");
  EXPECT_EQ(in.at("CUDA_VISIBLE_DEVICES"), all_uuids());
  EXPECT_EQ(in.at("NCCL_DEBUG"), "INFO");
  EXPECT_EQ(in.at("HF_HOME"), "/data/hf");
  EXPECT_EQ(in.at("OMP_NUM_THREADS"), "1");
  EXPECT_FALSE(in.count("PATH"));
  EXPECT_FALSE(in.count("LD_LIBRARY_PATH"));
  EXPECT_FALSE(in.count("HOME"));
  EXPECT_FALSE(in.count("CONTAINERS_CONF"));
  // The client: ddpctl's environment, scrubbed (podman needs CONTAINERS_CONF, not RANK).
  EXPECT_EQ(r.env.at("CONTAINERS_CONF"), "/etc/ddp-test/containers.conf");
  EXPECT_EQ(r.env.at("PATH"), "/usr/bin:/bin");
  EXPECT_FALSE(r.env.count("RANK"));
  // No variable's value is on the command line.
  for (const auto& a : r.argv) EXPECT_THAT(a, Not(HasSubstr("MASTER_ADDR")));
}

TEST(Container, DockerQuotesTheGpuListAndKeepsTheHardMemlock) {
  auto plan = plan_for(job(yaml_for("docker")), kNoIbLimited, 2);
  const auto& a = plan.ranks.at(0).argv;
  EXPECT_EQ(a.at(0), "docker");
  EXPECT_EQ(a.at(5), "ddpctl-resnet-20261202-130000-ab12-a2-r0");
  auto at = [&](const std::string& flag) {
    auto it = std::find(a.begin(), a.end(), flag);
    return it == a.end() || it + 1 == a.end() ? std::string("<absent>") : *(it + 1);
  };
  EXPECT_EQ(at("--gpus"), "\"device=" + all_uuids() + "\"");
  EXPECT_EQ(at("--ulimit"), "memlock=8388608:8388608");
  EXPECT_EQ(at("--cpuset-cpus"), "0-55,112-167");
  EXPECT_EQ(at("--cpuset-mems"), "0");
  EXPECT_THAT(a, Not(Contains("--device")));  // no RDMA devices, GPUs go by --gpus
  EXPECT_EQ(at("--env-file"), "/var/log/ddp/resnet-20261202-130000-ab12/attempt-0/rank-0.env");
}

TEST(Container, IsolatedGpuIsTheOnlyOnePassed) {
  auto spec = job(yaml_for("docker"), "binding: {gpu: isolate}\n");
  auto plan = plan_for(spec, kIb);
  const auto& a = plan.ranks.at(3).argv;
  auto it = std::find(a.begin(), a.end(), "--gpus");
  ASSERT_NE(it, a.end());
  EXPECT_EQ(*(it + 1), "device=" + uuid(3));  // one device: no quotes needed
  EXPECT_EQ(plan.ranks.at(3).container->env.at("CUDA_VISIBLE_DEVICES"), uuid(3));
}

TEST(Container, ContainerEnvDoesNotWidenTheGpus) {
  // container.env's CUDA_VISIBLE_DEVICES is the numbering inside; the runtime still gets the rank's GPU.
  auto spec =
      job("  runtime: docker\n  image: img:1\n  env: {CUDA_VISIBLE_DEVICES: all}\n", "binding: {gpu: isolate}\n");
  auto plan = plan_for(spec, kIb);
  const auto& a = plan.ranks.at(3).argv;
  auto it = std::find(a.begin(), a.end(), "--gpus");
  ASSERT_NE(it, a.end());
  EXPECT_EQ(*(it + 1), "device=" + uuid(3));
  // NVIDIA_* would have the runtime's hook hand over GPUs: not for a mapped user's container.
  auto nv = *job("  runtime: podman\n  image: img:1\n").container;
  nv.env = {{"NVIDIA_VISIBLE_DEVICES", "all"}};
  ASSERT_TRUE(container::confinement_problem(nv));
  EXPECT_THAT(*container::confinement_problem(nv), HasSubstr("NVIDIA_VISIBLE_DEVICES"));
}

TEST(Container, PodmanWithALimitedMemlockCopiesTheClientsLimits) {
  auto plan = plan_for(job(yaml_for("podman")), kNoIbLimited);
  const auto& a = plan.ranks.at(0).argv;
  auto it = std::find(a.begin(), a.end(), "--ulimit");
  ASSERT_NE(it, a.end());
  EXPECT_EQ(*(it + 1), "host");
}

TEST(Container, Apptainer) {
  auto plan = plan_for(job(yaml_for("apptainer")), kIb);
  const auto& r = plan.ranks.at(2);
  EXPECT_THAT(r.argv, ElementsAre("apptainer", "exec", "--cleanenv", "--env-file",
                                  "/var/log/ddp/resnet-20261202-130000-ab12/attempt-0/rank-2.env", "--nv", "--pwd",
                                  "/workspace", "--bind", "/home/u/project:/workspace", "--bind", "/data:/data:ro",
                                  "--shm-size", "16g", "nvcr.io/nvidia/pytorch:24.05-py3", "python3", "train.py",
                                  "--epochs", "90"));
  EXPECT_EQ(r.container->name, "");  // no named containers: the processes are the client's children
  EXPECT_EQ(r.container->env.at("RANK"), "2");
}

TEST(Container, Enroot) {
  auto plan = plan_for(job(yaml_for("enroot")), kIb);
  const auto& r = plan.ranks.at(6);
  const auto& a = r.argv;
  ASSERT_GE(a.size(), 2u);
  EXPECT_EQ(a[0], "enroot");
  EXPECT_EQ(a[1], "start");
  // Variables go by name; their values sit in the client's environment.
  EXPECT_THAT(a, Contains("RANK"));
  EXPECT_THAT(a, Contains("NVIDIA_VISIBLE_DEVICES"));
  EXPECT_THAT(a, Contains("MELLANOX_VISIBLE_DEVICES"));
  for (const auto& x : a) EXPECT_THAT(x, Not(HasSubstr("RANK=")));
  EXPECT_EQ(r.env.at("RANK"), "6");
  EXPECT_EQ(r.env.at("NVIDIA_VISIBLE_DEVICES"), all_uuids());
  EXPECT_EQ(r.env.at("MELLANOX_VISIBLE_DEVICES"), "all");
  EXPECT_EQ(r.env.at("HF_HOME"), "/data/hf");
  EXPECT_EQ(r.container->env_file, "");
  std::vector<std::string> tail(a.end() - 15, a.end());
  EXPECT_THAT(tail, ElementsAre("--mount", "/home/u/project:/workspace:none:x-create=auto,bind", "--mount",
                                "/data:/data:none:x-create=auto,bind,ro", "--shm-size", "16g",
                                "nvcr.io/nvidia/pytorch:24.05-py3", "/bin/sh", "-c", "cd -- \"$0\" && exec \"$@\"",
                                "/workspace", "python3", "train.py", "--epochs", "90"));
  // Every --env names a variable the client has.
  for (std::size_t i = 0; i + 1 < a.size(); ++i) {
    if (a[i] == "--env") {
      EXPECT_TRUE(r.env.count(a[i + 1])) << a[i + 1];
    }
  }
}

TEST(Container, NoGpusNoGpuFlags) {
  auto spec = job(yaml_for("podman"), "binding: {gpu: none}\n");
  auto plan = plan_for(spec, kNoIbLimited);
  for (const auto& a : plan.ranks.at(0).argv) EXPECT_THAT(a, Not(HasSubstr("nvidia.com/gpu")));
  auto app = plan_for(job(yaml_for("apptainer"), "binding: {gpu: none}\n"), kNoIbLimited);
  EXPECT_THAT(app.ranks.at(0).argv, Not(Contains("--nv")));
}

TEST(Container, ShellCommandRunsInsideTheImagesShell) {
  auto spec = jobspec::parse_job_yaml("command: 'echo $RANK'\ncontainer: {runtime: podman, image: img}\n", "t");
  auto plan = plan_for(spec, kNoIbLimited);
  const auto& a = plan.ranks.at(0).argv;
  EXPECT_THAT(std::vector<std::string>(a.end() - 4, a.end()), ElementsAre("img", "/bin/sh", "-c", "echo $RANK"));
  EXPECT_THAT(a, Not(Contains("--workdir")));  // the image's own working directory
}

TEST(Container, EnvFileText) {
  contract::Env env{{"A", "1"}, {"B", "it's \"x\" $y"}};
  EXPECT_EQ(container::env_file_text(ContainerRuntime::podman, env), "A=1\nB=it's \"x\" $y\n");
  EXPECT_EQ(container::env_file_text(ContainerRuntime::apptainer, env), "A='1'\nB='it'\\''s \"x\" $y'\n");
  EXPECT_THROW(container::env_file_text(ContainerRuntime::docker, {{"A", "two\nlines"}}), std::invalid_argument);
}

TEST(Container, NamesAndOwners) {
  EXPECT_EQ(container::container_name("my job/1", 3, 12), "ddpctl-my_job_1-a3-r12");
  EXPECT_EQ(container::Owner({12, 34}).label(), "12-34");
  auto o = container::parse_owner("12-34");
  ASSERT_TRUE(o);
  EXPECT_EQ(o->pid, 12);
  EXPECT_EQ(o->start_time, 34u);
  EXPECT_FALSE(container::parse_owner("12"));
  EXPECT_FALSE(container::parse_owner("x-1"));
  EXPECT_FALSE(container::parse_owner("0-1"));
  EXPECT_EQ(container::cpu_list({3, 0, 1, 2, 8, 10, 9}), "0-3,8-10");
  EXPECT_EQ(container::cpu_list({5}), "5");
}

TEST(Container, RuntimeCommands) {
  EXPECT_THAT(container::remove_argv(ContainerRuntime::podman, {"a", "b"}),
              ElementsAre("podman", "rm", "--force", "--ignore", "--time", "0", "a", "b"));
  EXPECT_THAT(container::remove_argv(ContainerRuntime::docker, {"a"}), ElementsAre("docker", "rm", "--force", "a"));
  EXPECT_TRUE(container::remove_argv(ContainerRuntime::apptainer, {"a"}).empty());
  EXPECT_TRUE(container::remove_argv(ContainerRuntime::podman, {}).empty());
  EXPECT_THAT(container::list_owned_argv(ContainerRuntime::podman),
              ElementsAre("podman", "ps", "--all", "--filter", "label=ddpctl.owner", "--format",
                          "{{.Names}} {{index .Labels \"ddpctl.owner\"}}"));
  // docker's .Labels is a string, not a map: `index` makes it exit 1 (tests/integration/containers/test_docker.py).
  EXPECT_THAT(container::list_owned_argv(ContainerRuntime::docker),
              ElementsAre("docker", "ps", "--all", "--filter", "label=ddpctl.owner", "--format",
                          "{{.Names}} {{.Label \"ddpctl.owner\"}}"));
  EXPECT_THAT(container::image_identity_argv(ContainerRuntime::docker, "img:1"),
              ElementsAre("docker", "image", "inspect", "--format", "{{.Id}}{{range .RepoDigests}} {{.}}{{end}}", "--",
                          "img:1"));
  EXPECT_THAT(container::image_identity_argv(ContainerRuntime::podman, "img:1"),
              ElementsAre("podman", "image", "inspect", "--format", "{{.Id}} {{.Digest}}", "--", "img:1"));
  EXPECT_THAT(container::pull_argv(ContainerRuntime::podman, "img:1"), ElementsAre("podman", "pull", "--", "img:1"));
  EXPECT_TRUE(container::image_identity_argv(ContainerRuntime::enroot, "x.sqsh").empty());
}

const std::string kId = "41a72250a71d6244bdd072905fd064edcae1e2debf5210b308d49d1bdfc2ec20";
const std::string kManifest = "8bc4a02543b5a567c3e5184097dd33549959e12106450666b8aea69ab760edc8";

TEST(ImageIdentity, PodmanIdAndManifestDigest) {
  // What podman 4.3 printed for an imported image on this machine.
  auto id = container::parse_image_identity(ContainerRuntime::podman, kId + " sha256:" + kManifest + "\n");
  ASSERT_TRUE(id);
  EXPECT_EQ(id->digest, "sha256:" + kId);
  EXPECT_EQ(id->repo_digest, "sha256:" + kManifest);
}

TEST(ImageIdentity, DockerIdWithAndWithoutRepoDigests) {
  auto pulled = container::parse_image_identity(
      ContainerRuntime::docker,
      "sha256:" + kId + " nvcr.io/nvidia/pytorch@sha256:" + kManifest + " mirror/pytorch@sha256:" + kId);
  ASSERT_TRUE(pulled);
  EXPECT_EQ(pulled->digest, "sha256:" + kId);
  EXPECT_EQ(pulled->repo_digest, "sha256:" + kManifest);  // the first registry's
  auto imported = container::parse_image_identity(ContainerRuntime::docker, "sha256:" + kId + "\n");
  ASSERT_TRUE(imported);
  EXPECT_EQ(imported->digest, "sha256:" + kId);
  EXPECT_EQ(imported->repo_digest, "");
}

TEST(ImageIdentity, NotAnIdIsRefused) {
  EXPECT_FALSE(container::parse_image_identity(ContainerRuntime::podman, ""));
  EXPECT_FALSE(container::parse_image_identity(ContainerRuntime::podman, "Error: image not known"));
  EXPECT_FALSE(container::parse_image_identity(ContainerRuntime::docker, "sha256:" + kId.substr(1)));
  EXPECT_FALSE(container::parse_image_identity(ContainerRuntime::docker, "sha256:" + std::string(64, 'G')));
  EXPECT_FALSE(container::parse_image_identity(ContainerRuntime::apptainer, kId));  // files are hashed, not inspected
}

TEST(CommandCheck, PodmanRunsTheCheckWithTheJobsMountsAndExtraArgs) {
  auto spec = *job("  runtime: podman\n  image: nvcr.io/nvidia/pytorch:24.05-py3\n  mounts: [/data:/workspace:ro]\n"
                   "  workdir: /workspace\n  extra_args: [--volume, /usr:/usr:ro]\n")
                   .container;
  EXPECT_THAT(container::command_check_argv(spec, "python3", "", "ddpctl-j-check-7", "7-1234"),
              ElementsAre("podman", "run", "--rm", "--name", "ddpctl-j-check-7", "--label", "ddpctl.owner=7-1234",
                          "--network", "none", "--pull=never", "--volume", "/data:/workspace:ro", "--volume",
                          "/usr:/usr:ro", "--entrypoint", "/bin/sh", "nvcr.io/nvidia/pytorch:24.05-py3", "-c",
                          "[ -z \"$1\" ] || cd -- \"$1\" || exit 3; command -v -- \"$2\" >/dev/null || exit 4", "sh",
                          "/workspace", "python3"));
}

TEST(CommandCheck, DockerPassesTheWorkersPathAndAnEmptyWorkdirMeansTheImages) {
  auto spec = *job("  runtime: docker\n  image: img:1\n").container;
  auto a = container::command_check_argv(spec, "./train.sh", "/opt/conda/bin:/usr/bin", "n", "1-2");
  EXPECT_THAT(std::vector<std::string>(a.begin(), a.begin() + 3), ElementsAre("docker", "run", "--rm"));
  EXPECT_THAT(a, Contains("PATH=/opt/conda/bin:/usr/bin"));
  EXPECT_THAT(std::vector<std::string>(a.end() - 3, a.end()), ElementsAre("sh", "", "./train.sh"));
}

TEST(CommandCheck, ApptainerAndEnroot) {
  auto app =
      *job("  runtime: apptainer\n  image: /images/pt.sif\n  mounts: [/data:/data]\n  workdir: /data\n").container;
  auto a = container::command_check_argv(app, "python3", "", "unused", "1-2");
  EXPECT_THAT(std::vector<std::string>(a.begin(), a.begin() + 7),
              ElementsAre("apptainer", "exec", "--cleanenv", "--bind", "/data:/data", "/images/pt.sif", "/bin/sh"));
  EXPECT_THAT(std::vector<std::string>(a.end() - 3, a.end()), ElementsAre("sh", "/data", "python3"));
  auto en = *job("  runtime: enroot\n  image: /images/pt.sqsh\n  mounts: [/data:/data:ro]\n").container;
  auto e = container::command_check_argv(en, "python3", "/usr/bin", "unused", "1-2");
  EXPECT_THAT(std::vector<std::string>(e.begin(), e.begin() + 8),
              ElementsAre("enroot", "start", "--env", "PATH", "--mount", "/data:/data:none:x-create=auto,bind,ro",
                          "/images/pt.sqsh", "/bin/sh"));
}

TEST(CommandCheck, ExitCodesSayWhatIsMissing) {
  using container::CommandCheck;
  EXPECT_EQ(container::classify_command_check(ContainerRuntime::podman, 0), CommandCheck::ok);
  EXPECT_EQ(container::classify_command_check(ContainerRuntime::podman, 3), CommandCheck::no_workdir);
  EXPECT_EQ(container::classify_command_check(ContainerRuntime::docker, 4), CommandCheck::no_command);
  EXPECT_EQ(container::classify_command_check(ContainerRuntime::podman, 127), CommandCheck::no_shell);
  EXPECT_EQ(container::classify_command_check(ContainerRuntime::docker, 126), CommandCheck::no_shell);
  EXPECT_EQ(container::classify_command_check(ContainerRuntime::docker, 125), CommandCheck::runtime_error);
  EXPECT_EQ(container::classify_command_check(ContainerRuntime::podman, 1), CommandCheck::runtime_error);
}

TEST(CommandCheck, WorkerPathIsContainerEnvsThenTheJobs) {
  EXPECT_EQ(container::worker_path(job("  runtime: podman\n  image: i\n")), "");
  EXPECT_EQ(container::worker_path(job("  runtime: podman\n  image: i\n", "env: {PATH: /job/bin}\n")), "/job/bin");
  EXPECT_EQ(
      container::worker_path(job("  runtime: podman\n  image: i\n  env: {PATH: /c/bin}\n", "env: {PATH: /job/bin}\n")),
      "/c/bin");
}

TEST(CommandCheck, CheckNamesAreSafeAndPerProcess) {
  EXPECT_EQ(container::check_container_name("a b/c", 12), "ddpctl-a_b_c-check-12");
}

TEST(Container, JobWithoutContainerIsLeftAlone) {
  auto spec = jobspec::parse_job_yaml("command: [x]\n", "t");
  contract::NodeContext node;
  auto plan = contract::make_plan(spec, node, kInherited);
  auto before = plan.ranks.at(0).argv;
  container::wrap_plan(plan, spec, kInherited, kIb, 0, kOwner, "/");
  EXPECT_EQ(plan.ranks.at(0).argv, before);
  EXPECT_FALSE(plan.ranks.at(0).container);
}

// ---- a mapped user's container (Confinement) and what reaches the runtime's command line ----

namespace {
const container::Confinement kAlice{1001, 1001, {1001, 27, 44}, "/var/log/ddp/.container-env"};
const std::string kPlainPodman =
    "  runtime: podman\n  image: img:1\n  mounts: ['/home/alice/p:/work']\n  workdir: /work\n";

contract::Plan confined_plan(const jobspec::JobSpec& spec) {
  contract::NodeContext node;
  node.job_id = "j";
  node.local_world_size = 1;
  node.attempt_dir = "/var/log/ddp/j/attempt-0";
  auto plan = contract::make_plan(spec, node, container::forwarded_into_container(kInherited, spec));
  container::wrap_plan(plan, spec, kInherited, HostLayout{}, 0, kOwner, "/home/alice", kAlice);
  return plan;
}
}  // namespace

TEST(Confinement, TheWorkerRunsAsTheUserWithNoCapabilitiesAndNoWayUp) {
  auto plan = confined_plan(job(kPlainPodman));
  const auto& a = plan.ranks.at(0).argv;
  auto at = std::find(a.begin(), a.end(), "--user");
  ASSERT_NE(at, a.end());
  // Before the mounts and the image: flags, not arguments of the worker.
  EXPECT_THAT(std::vector<std::string>(at, at + 10),
              ElementsAre("--user", "1001:1001", "--group-add", "27", "--group-add", "44", "--cap-drop", "all",
                          "--security-opt", "no-new-privileges"));
  EXPECT_LT(at - a.begin(), std::find(a.begin(), a.end(), "img:1") - a.begin());
  EXPECT_THAT(a, Not(Contains("--privileged")));
  // The env file lives in root's folder, not in the user's attempt folder.
  EXPECT_EQ(plan.ranks.at(0).container->env_file, "/var/log/ddp/.container-env/ddpctl-j-a0-r0.env");
  EXPECT_THAT(a, Contains("/var/log/ddp/.container-env/ddpctl-j-a0-r0.env"));
}

TEST(Confinement, TheCommandCheckInTheImageRunsConfinedToo) {
  auto spec = *job(kPlainPodman).container;
  auto a = container::command_check_argv(spec, "python3", "", "n", "1-2", kAlice);
  auto at = std::find(a.begin(), a.end(), "--user");
  ASSERT_NE(at, a.end());
  EXPECT_EQ(*(at + 1), "1001:1001");
  EXPECT_THAT(a, Contains("no-new-privileges"));
  EXPECT_LT(at - a.begin(), std::find(a.begin(), a.end(), "img:1") - a.begin());
  // Without a confinement: as before, no --user.
  EXPECT_THAT(container::command_check_argv(spec, "python3", "", "n", "1-2"), Not(Contains("--user")));
}

TEST(Confinement, RootsFlagsAndRootRunningRuntimesAreRefused) {
  EXPECT_EQ(container::confinement_problem(*job(kPlainPodman).container), std::nullopt);
  EXPECT_EQ(container::confinement_problem(*job("  runtime: docker\n  image: img:1\n").container), std::nullopt);
  auto extra = container::confinement_problem(
      *job("  runtime: podman\n  image: img:1\n  extra_args: [--privileged]\n").container);
  ASSERT_TRUE(extra);
  EXPECT_THAT(*extra, HasSubstr("container.extra_args (--privileged) are not allowed"));
  for (const char* rt : {"apptainer", "enroot"}) {
    auto spec = *job(std::string("  runtime: ") + rt + "\n  image: x.sif\n").container;
    ASSERT_TRUE(container::confinement_problem(spec)) << rt;
    EXPECT_THROW(container::command_check_argv(spec, "python3", "", "n", "1-2", kAlice), std::invalid_argument) << rt;
  }
  // A mount path may not smuggle --volume options (podman's :U would chown the source, as root).
  auto smuggled = *job(kPlainPodman).container;
  smuggled.mounts.at(0).target = "/work:U";  // past the job file's parser: it came over the wire
  ASSERT_TRUE(container::confinement_problem(smuggled));
  EXPECT_THAT(*container::confinement_problem(smuggled), HasSubstr("'/work:U'"));
  smuggled.mounts.at(0) = {"/home/alice/a,b", "/work", false};
  EXPECT_TRUE(container::confinement_problem(smuggled));
  // A spec that is refused never becomes a command line, however it got here.
  auto spec = job("  runtime: podman\n  image: img:1\n  extra_args: [--volume, '/:/host']\n");
  EXPECT_THROW(confined_plan(spec), std::invalid_argument);
}

TEST(ImageName, AnOptionIsNeverTakenForAnImage) {
  EXPECT_EQ(container::image_problem("nvcr.io/nvidia/pytorch:24.05-py3"), std::nullopt);
  EXPECT_EQ(container::image_problem("localhost/x@sha256:abc"), std::nullopt);
  EXPECT_TRUE(container::image_problem("--privileged"));
  EXPECT_TRUE(container::image_problem("-v"));
  EXPECT_TRUE(container::image_problem(""));
  EXPECT_TRUE(container::image_problem("img:1 --privileged"));
  EXPECT_TRUE(container::image_problem("img\n"));
  // podman's transports that name files or stores on the node (root's runtime would open them).
  for (const char* t :
       {"oci-archive:/root/private.tar", "docker-archive:/var/backups/x.tar", "dir:/srv/img", "oci:/dev/watchdog",
        "containers-storage:[overlay@/home/u/root+/home/u/run]img", "docker-daemon:img:1"}) {
    ASSERT_TRUE(container::image_problem(t)) << t;
    EXPECT_THAT(*container::image_problem(t), HasSubstr("transport")) << t;
  }
  EXPECT_EQ(container::image_problem("docker://nvcr.io/nvidia/pytorch:24.05-py3"), std::nullopt);
  EXPECT_EQ(container::image_problem("registry.example:5000/team/img:2"), std::nullopt);
  EXPECT_EQ(container::image_problem("dir.example.com/img:2"), std::nullopt);
  // `--` before the image where the runtime takes one, and a refusal in every builder.
  EXPECT_THAT(container::pull_argv(ContainerRuntime::docker, "img:1"), ElementsAre("docker", "pull", "--", "img:1"));
  EXPECT_THROW(container::image_identity_argv(ContainerRuntime::podman, "--help"), std::invalid_argument);
  EXPECT_THROW(container::pull_argv(ContainerRuntime::podman, "--all-tags"), std::invalid_argument);
  jobspec::ContainerSpec bad = *job(kPlainPodman).container;
  bad.image = "--privileged";  // past the job file's own check (it came over the wire)
  EXPECT_THROW(container::command_check_argv(bad, "python3", "", "n", "1-2"), std::invalid_argument);
  container::RankRun run;
  run.argv = {"python3"};
  for (auto rt :
       {ContainerRuntime::podman, ContainerRuntime::docker, ContainerRuntime::apptainer, ContainerRuntime::enroot}) {
    bad.runtime = rt;
    EXPECT_THROW(container::run_argv(bad, run, HostLayout{}), std::invalid_argument);
  }
}

TEST(ImageName, TheJobFileRefusesAnImageThatReadsAsAnOption) {
  try {
    job("  runtime: podman\n  image: --privileged\n");
    FAIL() << "accepted";
  } catch (const jobspec::JobSpecError& e) {
    EXPECT_THAT(e.what(), HasSubstr("which a runtime would read as an option"));
  }
}

TEST(Container, TheRuntimesClientNeverGetsTheLoadersVariables) {
  contract::Env host = kInherited;
  host["LD_PRELOAD"] = "/tmp/evil.so";
  host["GCONV_PATH"] = "/tmp/g";
  auto spec = job(kPlainPodman);
  contract::NodeContext node;
  node.job_id = "j";
  node.local_world_size = 1;
  node.attempt_dir = "/a";
  auto plan = contract::make_plan(spec, node, container::forwarded_into_container(host, spec));
  container::wrap_plan(plan, spec, host, HostLayout{}, 0, kOwner, "/home/u");
  const auto& env = plan.ranks.at(0).env;
  EXPECT_FALSE(env.count("LD_PRELOAD"));
  EXPECT_FALSE(env.count("LD_LIBRARY_PATH"));
  EXPECT_FALSE(env.count("GCONV_PATH"));
  EXPECT_EQ(env.at("PATH"), "/usr/bin:/bin");
}

// An apptainer or enroot image is hashed by root: only a regular file is opened, never a
// device (a watchdog arms on open) or a FIFO (the read would block).
TEST(ImageFile, OnlyARegularFileIsOpened) {
  char dir[] = "/tmp/ddp-image-file-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string file = std::string(dir) + "/img.sif", fifo = std::string(dir) + "/fifo";
  { std::ofstream(file) << "abc"; }
  EXPECT_EQ(container::sha256_of_file(file), "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THROW(container::sha256_of_file(fifo), container::ContainerError);  // returns: nothing opened the FIFO
  EXPECT_THROW(container::sha256_of_file("/dev/null"), container::ContainerError);
  EXPECT_THROW(container::sha256_of_file(std::string(dir) + "/none"), container::ContainerError);
  std::filesystem::remove_all(dir);
}

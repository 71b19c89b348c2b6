#include "jobspec/jobspec.hpp"

#include <gtest/gtest.h>

using namespace ddp::jobspec;
using namespace std::chrono_literals;

namespace {

// Parses and expects failure; returns the diagnostics.
std::vector<Diagnostic> errors_of(const std::string& yaml) {
  try {
    parse_job_yaml(yaml, "train.yaml");
  } catch (const JobSpecError& e) {
    return e.diagnostics();
  }
  ADD_FAILURE() << "expected an error for:\n" << yaml;
  return {};
}

void expect_error(const std::string& yaml, int line, int column, const std::string& fragment) {
  auto d = errors_of(yaml);
  ASSERT_FALSE(d.empty());
  bool found = false;
  for (const auto& x : d) {
    if (x.line == line && x.column == column && x.message.find(fragment) != std::string::npos) found = true;
  }
  std::string all;
  for (const auto& x : d) all += x.to_string() + "\n";
  EXPECT_TRUE(found) << "wanted " << line << ":" << column << " '" << fragment << "' in:\n" << all;
}

}  // namespace

TEST(JobSpec, FullExampleParses) {
  auto s = parse_job_yaml(R"(
name: resnet50-ddp
nnodes: 1
nproc_per_node: 4
command: [python3, train_ddp.py, --epochs, "90"]
workdir: /workspace
env: {NCCL_DEBUG: WARN, SEED: 7}
env_forward: [PATH, "NCCL_*"]
restart: {max_restarts: 3, backoff: 2s}
logs: {dir: ./logs, max_size: 10MiB}
store: {port: 29600, threads: 4, max_size: 64MiB, max_keys: 10000}
stop: {grace: 5s}
nccl: {unique_id: off}
)",
                          "train.yaml");
  EXPECT_EQ(s.name, "resnet50-ddp");
  EXPECT_EQ(s.nproc.kind, Nproc::Kind::count);
  EXPECT_EQ(s.nproc.count, 4);
  EXPECT_EQ(s.command, (std::vector<std::string>{"python3", "train_ddp.py", "--epochs", "90"}));
  EXPECT_FALSE(s.shell);
  EXPECT_EQ(s.workdir, "/workspace");
  ASSERT_EQ(s.env.size(), 2u);
  EXPECT_EQ(s.env[0], (std::pair<std::string, std::string>{"NCCL_DEBUG", "WARN"}));
  EXPECT_EQ(s.env[1].second, "7");
  EXPECT_EQ(s.env_forward, (std::vector<std::string>{"PATH", "NCCL_*"}));
  EXPECT_EQ(s.max_restarts, 3);
  EXPECT_EQ(s.restart_backoff, ddp::Millis(2s));
  EXPECT_EQ(s.log_dir, "./logs");
  EXPECT_EQ(s.log_max_bytes, 10u << 20);
  EXPECT_EQ(s.store_port, 29600);
  EXPECT_EQ(s.store_threads, 4);
  EXPECT_EQ(s.store_max_bytes, 64u << 20);
  EXPECT_EQ(s.store_max_keys, 10000u);
  EXPECT_EQ(s.stop_grace, ddp::Millis(5s));
  EXPECT_EQ(s.nccl_unique_id, NcclUniqueId::off);
}

TEST(JobSpec, DefaultsForAMinimalFile) {
  auto s = parse_job_yaml("command: [python3, train.py]\n", "t.yaml");
  EXPECT_EQ(s.name, "job");
  EXPECT_EQ(s.nproc.count, 1);
  EXPECT_EQ(s.max_restarts, 0);
  EXPECT_EQ(s.store_port, 29500);
  EXPECT_EQ(s.store_threads, kAutoThreads);
  EXPECT_EQ(s.store_max_bytes, 1u << 30);
  EXPECT_EQ(s.store_max_keys, 1u << 20);
  EXPECT_EQ(parse_job_yaml("command: [x]\nstore: {threads: 0}\n", "t.yaml").store_threads, 0);
  EXPECT_EQ(s.stop_grace, ddp::Millis(30s));
  EXPECT_EQ(s.log_dir, "./logs");
  EXPECT_FALSE(s.workdir.has_value());
  EXPECT_EQ(s.nccl_unique_id, NcclUniqueId::automatic);
  EXPECT_EQ(s.env_forward.size(), 5u);
}

TEST(JobSpec, NprocCpuAndGpu) {
  EXPECT_EQ(parse_job_yaml("command: [x]\nnproc_per_node: cpu\n", "t").nproc.kind, Nproc::Kind::cpu);
  EXPECT_EQ(parse_job_yaml("command: [x]\nnproc_per_node: gpu\n", "t").nproc.kind, Nproc::Kind::gpu);
}

TEST(JobSpec, CommandStringMeansShell) {
  auto s = parse_job_yaml("command: python3 train.py && echo done\n", "t");
  EXPECT_TRUE(s.shell);
  ASSERT_EQ(s.command.size(), 1u);
  EXPECT_EQ(s.command[0], "python3 train.py && echo done");
}

TEST(JobSpec, MissingCommand) {
  expect_error("name: x\n", 1, 1, "missing key 'command'");
}

TEST(JobSpec, UnknownKeyWithHint) {
  expect_error("command: [x]\nnproc_per_nod: 4\n", 2, 1, "did you mean 'nproc_per_node'");
  expect_error("command: [x]\nrestart: {max_restart: 2}\n", 2, 11, "did you mean 'max_restarts'");
  expect_error("command: [x]\nlogs:\n  dri: /tmp\n", 3, 3, "did you mean 'dir'");
  expect_error("command: [x]\nfrobnicate: 1\n", 2, 1, "unknown key 'frobnicate'");
}

TEST(JobSpec, WrongTypes) {
  expect_error("command: [x]\nnproc_per_node: four\n", 2, 17, "expected an integer, 'cpu' or 'gpu'");
  expect_error("command: [x]\nnproc_per_node: 0\n", 2, 17, "from 1 to 4096");
  expect_error("command: [x]\nnproc_per_node: [1]\n", 2, 17, "got a list");
  expect_error("command: {a: b}\n", 1, 10, "expected a non-empty list");
  expect_error("command: []\n", 1, 10, "expected a non-empty list");
  expect_error("command: [x, [y]]\n", 1, 14, "every item must be a string");
  expect_error("command: [x]\nrestart: 3\n", 2, 10, "expected a mapping");
  expect_error("command: [x]\nrestart: {max_restarts: -1}\n", 2, 25, "from 0 to 1000");
  expect_error("command: [x]\nstop: {grace: soon}\n", 2, 15, "expected a duration");
  expect_error("command: [x]\nstore: {port: 70000}\n", 2, 15, "from 0 to 65535");
  expect_error("command: [x]\nstore: {threads: many}\n", 2, 18,
               "store.threads (or auto): expected an integer from 0 to 64");
  expect_error("command: [x]\nstore: {max_size: 1KiB}\n", 2, 19, "store.max_size: expected at least 1MiB");
  expect_error("command: [x]\nstore: {max_keys: 10}\n", 2, 19, "store.max_keys");
  expect_error("command: [x]\nenv: [A, B]\n", 2, 6, "expected a mapping of NAME: value");
  expect_error("command: [x]\nenv: {A: [1]}\n", 2, 10, "expected a string value");
  expect_error("command: [x]\nenv: {1A: x}\n", 2, 7, "expected a variable name");
  expect_error("command: [x]\nlogs: {max_size: huge}\n", 2, 18, "expected a size");
  expect_error("command: [x]\nname: \"a b\"\n", 2, 7, "letters, digits");
  expect_error("command: [x]\nnccl: {unique_id: maybe}\n", 2, 19, "expected auto, on or off");
  expect_error("command: [x]\nworkdir: [a]\n", 2, 10, "expected a string");
  expect_error("command: [x]\nenv_forward: [\"a b\"]\n", 2, 15, "NAME_* pattern");
}

TEST(JobSpec, ReservedEnvIsRefused) {
  expect_error("command: [x]\nenv: {RANK: '3'}\n", 2, 7, "set by ddpctl");
  expect_error("command: [x]\nenv:\n  MASTER_PORT: '1'\n", 3, 3, "set by ddpctl");
}

TEST(JobSpec, DuplicateKeys) {
  expect_error("command: [x]\nname: a\nname: b\n", 3, 1, "duplicate key 'name'");
}

TEST(JobSpec, Container) {
  auto s = parse_job_yaml(R"(command: [python3, train.py]
container:
  runtime: podman
  image: localhost/pytorch:2
  mounts: ["./:/workspace", "/data:/data:ro"]
  workdir: /workspace
  pull: never
  extra_args: [--shm-size, 8g]
  env: {HF_HOME: /data/hf}
)",
                          "t");
  ASSERT_TRUE(s.container);
  const auto& c = *s.container;
  EXPECT_EQ(c.runtime, ContainerRuntime::podman);
  EXPECT_EQ(runtime_name(c.runtime), "podman");
  EXPECT_EQ(c.image, "localhost/pytorch:2");
  ASSERT_EQ(c.mounts.size(), 2u);
  EXPECT_EQ(c.mounts[0].source, "./");
  EXPECT_EQ(c.mounts[0].target, "/workspace");
  EXPECT_FALSE(c.mounts[0].read_only);
  EXPECT_TRUE(c.mounts[1].read_only);
  EXPECT_EQ(c.workdir, "/workspace");
  EXPECT_EQ(c.pull, PullPolicy::never);
  EXPECT_EQ(c.extra_args, (std::vector<std::string>{"--shm-size", "8g"}));
  ASSERT_EQ(c.env.size(), 1u);
  EXPECT_EQ(c.env[0].first, "HF_HOME");

  auto d = parse_job_yaml("command: [x]\ncontainer: {runtime: docker, image: img}\n", "t");
  EXPECT_EQ(d.container->pull, PullPolicy::missing);
  EXPECT_FALSE(d.container->workdir);
  EXPECT_FALSE(parse_job_yaml("command: [x]\n", "t").container);
}

TEST(JobSpec, ContainerErrors) {
  expect_error("command: [x]\ncontainer: {runtime: docker}\n", 2, 1, "missing key 'image'");
  expect_error("command: [x]\ncontainer: {image: i}\n", 2, 1, "missing key 'runtime'");
  expect_error("command: [x]\ncontainer: {runtime: dokcer, image: i}\n", 2, 22, "did you mean 'docker'");
  expect_error("command: [x]\ncontainer: {runtime: podman, image: i, pul: never}\n", 2, 40, "did you mean 'pull'");
  expect_error("command: [x]\ncontainer: {runtime: podman, image: i, pull: sometimes}\n", 2, 46,
               "never, missing, always");
  expect_error("command: [x]\ncontainer: {runtime: podman, image: ''}\n", 2, 37, "empty string");
  expect_error("command: [x]\ncontainer: {runtime: podman, image: i, workdir: rel}\n", 2, 49, "absolute path");
  expect_error("command: [x]\ncontainer:\n  runtime: podman\n  image: i\n  mounts: [/a]\n", 5, 12, "SOURCE:TARGET");
  expect_error("command: [x]\ncontainer:\n  runtime: podman\n  image: i\n  mounts: ['/a:rel']\n", 5, 12,
               "absolute TARGET");
  expect_error("command: [x]\ncontainer:\n  runtime: podman\n  image: i\n  mounts: ['/a:/b:rx']\n", 5, 12, "ro|rw");
  expect_error("command: [x]\ncontainer:\n  runtime: podman\n  image: i\n  mounts: /a:/b\n", 5, 11, "expected a list");
  expect_error("command: [x]\ncontainer:\n  runtime: podman\n  image: i\n  env: {RANK: '1'}\n", 5, 9,
               "container.env.RANK: set by ddpctl");
  expect_error("command: [x]\ncontainer:\n  runtime: podman\n  image: i\n  extra_args: --x\n", 5, 15,
               "list of arguments");
  expect_error("command: [x]\ncontainer: docker\n", 2, 12, "expected a mapping");
  // The host's id holder cannot speak the image's NCCL.
  expect_error("command: [x]\nnccl: {unique_id: on}\ncontainer: {runtime: podman, image: i}\n", 2, 19,
               "cannot be honoured with container");
  EXPECT_NO_THROW(
      parse_job_yaml("command: [x]\nnccl: {unique_id: auto}\ncontainer: {runtime: podman, image: i}\n", "t"));
}

TEST(JobSpec, Binding) {
  auto d = parse_job_yaml("command: [x]\n", "t");
  EXPECT_EQ(d.binding.gpu, GpuBinding::automatic);
  EXPECT_EQ(d.binding.numa, NumaBinding::automatic);
  EXPECT_EQ(d.binding.nic, NicBinding::automatic);
  auto s = parse_job_yaml("command: [x]\nbinding: {gpu: isolate, numa: exclusive, nic: none}\n", "t");
  EXPECT_EQ(s.binding.gpu, GpuBinding::isolate);
  EXPECT_EQ(s.binding.numa, NumaBinding::exclusive);
  EXPECT_EQ(s.binding.nic, NicBinding::none);
  EXPECT_FALSE(s.binding.all_none());
  auto n = parse_job_yaml("command: [x]\nbinding:\n  gpu: none\n  numa: none\n  nic: none\n", "t");
  auto r = parse_job_yaml("command: [x]\nbinding: {nic: rank}\n", "t");
  EXPECT_EQ(r.binding.nic, NicBinding::rank);
  EXPECT_TRUE(n.binding.all_none());
  expect_error("command: [x]\nbinding: {gpu: all}\n", 2, 16, "binding.gpu: expected auto, none, isolate, got 'all'");
  expect_error("command: [x]\nbinding:\n  numa: socket\n", 3, 9, "binding.numa: expected auto, none, node, exclusive");
  expect_error("command: [x]\nbinding: {nic: [mlx5_0]}\n", 2, 16, "binding.nic: expected auto, none, rank, got a list");
  expect_error("command: [x]\nbinding: {cpu: auto}\n", 2, 11, "unknown key 'binding.cpu'");
  expect_error("command: [x]\nbinding: isolate\n", 2, 10, "binding: expected a mapping");
}

TEST(JobSpec, MultiNodeKeys) {
  auto s = parse_job_yaml(
      "command: [x]\nnnodes: 2\nhosts: [a, 'b:29411']\nrendezvous: {join_timeout: 1m, last_call: 2s}\n", "t");
  EXPECT_EQ(s.nnodes_min, 2);
  EXPECT_EQ(s.nnodes_max, 2);
  EXPECT_EQ(s.hosts, (std::vector<std::string>{"a", "b:29411"}));
  EXPECT_EQ(s.join_timeout, ddp::Millis(60000));
  EXPECT_EQ(s.last_call, ddp::Millis(2000));
  EXPECT_EQ(s.heartbeat_timeout, ddp::Millis(6000));
  EXPECT_EQ(parse_job_yaml("command: [x]\nrendezvous: {heartbeat_timeout: 3s}\n", "t").heartbeat_timeout,
            ddp::Millis(3000));
  expect_error("command: [x]\nrendezvous: {heartbeat_timeout: 500ms}\n", 2, 33,
               "rendezvous.heartbeat_timeout: expected at least 2s");
  expect_error("command: [x]\nrendezvous: {heartbeat_timeout: 1s}\n", 2, 33, "one late heartbeat must not lose a node");
  EXPECT_EQ(parse_job_yaml("command: [x]\nhosts: 'n[1-4]'\n", "t").hosts, (std::vector<std::string>{"n[1-4]"}));
  auto e = parse_job_yaml("command: [x]\nnnodes: '2:4'\n", "t");
  EXPECT_EQ(e.nnodes_min, 2);
  EXPECT_EQ(e.nnodes_max, 4);
  expect_error("command: [x]\nhosts: []\n", 2, 8, "hosts: expected a list");
  expect_error("command: [x]\nrendezvous: {join_timeout: soon}\n", 2, 28,
               "rendezvous.join_timeout: expected a duration");
  expect_error("command: [x]\nrendezvous: {last_cal: 1s}\n", 2, 14, "did you mean 'last_call'");
}

TEST(JobSpec, NnodesForms) {
  EXPECT_EQ(parse_job_yaml("command: [x]\nnnodes: 1\n", "t").nnodes_max, 1);
  EXPECT_EQ(parse_job_yaml("command: [x]\nnnodes: '1:1'\n", "t").nnodes_min, 1);
  expect_error("command: [x]\nnnodes: 0\n", 2, 9, "MIN:MAX");
  expect_error("command: [x]\nnnodes: 3:2\n", 2, 9, "MIN:MAX");
  expect_error("command: [x]\nnnodes: a:b\n", 2, 9, "MIN:MAX");
}

TEST(JobSpec, SyntaxErrorHasPosition) {
  auto d = errors_of("command: [x\nname: y\n");
  ASSERT_FALSE(d.empty());
  EXPECT_NE(d[0].message.find("not valid YAML"), std::string::npos);
  EXPECT_GT(d[0].line, 0);
}

TEST(JobSpec, AnUnclosedBracketIsReportedWhereItWasOpened) {
  // yaml-cpp gives up at the next key or the end of the file; the user needs the `[`.
  expect_error("nproc_per_node: 2\ncommand: [python3, t.py\n", 2, 10,
               "this '[' is never closed with ']' (the parser gave up at line 3");
  expect_error("command: [x]\nenv: {A: '1'\nname: y\n", 2, 6, "this '{' is never closed with '}'");
  // Brackets inside quotes, comments and plain scalars are not openings.
  expect_error("name: a[1]\ncommand: [\"[\", '[''', x # [\n", 2, 10, "this '[' is never closed");
  // A quote inside a plain scalar is no quote; a block scalar's lines are not YAML.
  expect_error("command: [echo, it's]\nenv: [x\n", 2, 6, "this '[' is never closed");
  expect_error("name: |\n  [not yaml\n\n  'either\ncommand: [x\n", 5, 10, "this '[' is never closed");
  // The innermost open one of the kind yaml-cpp missed.
  expect_error("command: [x]\nenv: {A: [1, 2], B: [3\n", 2, 21, "this '[' is never closed");
  // Every other syntax error keeps yaml-cpp's own words and place.
  auto d = errors_of("command: [x]\nname: 'y\n");
  ASSERT_FALSE(d.empty());
  EXPECT_EQ(d[0].message.find("never closed"), std::string::npos) << d[0].message;
}

TEST(JobSpec, AKeyWithoutAValueIsReportedWhereTheKeyIs) {
  // yaml-cpp marks an empty value at the next token: the following key's line.
  expect_error("name: demo\nrestart:\nnproc_per_node: 2\ncommand: [x]\n", 2, 1, "restart: expected a mapping");
  expect_error("command: [x]\nenv:\n  A:\n  B: b\n", 3, 3, "got nothing");
  expect_error("command: [x]\nname:\n", 2, 1, "name: expected a string, got nothing");
}

TEST(JobSpec, OneJobPerFile) {
  // Everything after a `---` was dropped without a word.
  expect_error("command: [python3, a.py]\n---\ncommand: [python3, b.py]\n", 3, 1, "a second YAML document");
  EXPECT_EQ(parse_job_yaml("---\ncommand: [x]\n", "t").command, std::vector<std::string>{"x"});
  EXPECT_EQ(parse_job_yaml("command: [x]\n---\n", "t").command, std::vector<std::string>{"x"});
}

TEST(JobSpec, NotAMappingAtTop) {
  expect_error("- a\n- b\n", 1, 1, "expected a mapping");
  auto d = errors_of("");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_NE(d[0].message.find("empty"), std::string::npos);
}

TEST(JobSpec, AllErrorsAtOnce) {
  auto d = errors_of("nproc_per_node: x\nrestart: {max_restarts: y}\nbogus: 1\n");
  EXPECT_EQ(d.size(), 4u);  // nproc, max_restarts, bogus, missing command
}

TEST(JobSpec, DiagnosticFormat) {
  Diagnostic d{"train.yaml", 3, 5, "boom"};
  EXPECT_EQ(d.to_string(), "train.yaml:3:5: error: boom");
  Diagnostic n{"train.yaml", 0, 0, "unreadable"};
  EXPECT_EQ(n.to_string(), "train.yaml: error: unreadable");
}

TEST(JobSpec, UnreadableFile) {
  try {
    load_job_file("/nonexistent/job.yaml");
    FAIL();
  } catch (const JobSpecError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/job.yaml: error: cannot read"), std::string::npos);
  }
}

TEST(JobSpec, ValidJobId) {
  for (const char* ok : {"a", "train-20261202-171500-0a1f", "A.b_c-9", "0..x"}) EXPECT_TRUE(valid_job_id(ok)) << ok;
  for (const char* bad : {"", "..", ".", "../x", "a/b", "/abs", "-x", "_x", ".hidden", "a b", "a\nb", "a\\b"}) {
    EXPECT_FALSE(valid_job_id(bad)) << bad;
  }
  EXPECT_TRUE(valid_job_id(std::string(128, 'j')));
  EXPECT_FALSE(valid_job_id(std::string(129, 'j')));
  EXPECT_FALSE(valid_job_id(std::string("a\0b", 3)));
}

// python: the interpreter of a command that is not one (shell script, uv run, conda run).
TEST(JobSpec, PythonKey) {
  EXPECT_TRUE(parse_job_yaml("command: [x]\n", "t.yaml").python.empty());
  EXPECT_EQ(parse_job_yaml("command: [sh, run.sh]\npython: /venv/bin/python\n", "t.yaml").python,
            (std::vector<std::string>{"/venv/bin/python"}));
  EXPECT_EQ(parse_job_yaml("command: [uv, run, train.py]\npython: [uv, run, python]\n", "t.yaml").python,
            (std::vector<std::string>{"uv", "run", "python"}));
  expect_error("command: [x]\npython: ''\n", 2, 9, "python: expected a program");
  expect_error("command: [x]\npython: []\n", 2, 9, "python: expected a program");
  expect_error("command: [x]\npython: {a: 1}\n", 2, 9, "python: expected a program");
  expect_error("command: [x]\npython: [uv, [run]]\n", 2, 14, "every item must be a non-empty string");
  expect_error("command: [x]\npyhton: python3\n", 2, 1, "did you mean 'python'");
}

TEST(JobSpec, Hang) {
  EXPECT_FALSE(parse_job_yaml("command: [x]\n", "t").hang.has_value());
  auto s = parse_job_yaml("command: [x]\nhang: {timeout: 10m, action: stop}\n", "t");
  ASSERT_TRUE(s.hang.has_value());
  EXPECT_EQ(s.hang->timeout, ddp::Millis(10min));
  EXPECT_EQ(s.hang->action, HangAction::stop);
  auto d = parse_job_yaml("command: [x]\nhang:\n  timeout: 90s\n", "t");
  EXPECT_EQ(d.hang->action, HangAction::report);
  EXPECT_EQ(d.hang->timeout, ddp::Millis(90s));
  EXPECT_EQ(parse_job_yaml("command: [x]\nhang: {timeout: 5s, action: restart}\n", "t").hang->action,
            HangAction::restart);
  expect_error("command: [x]\nhang: {timeout: 10m, action: kill}\n", 2, 30,
               "hang.action: expected report, stop or restart, got 'kill'");
  expect_error("command: [x]\nhang: {timeout: soon}\n", 2, 17, "hang.timeout: expected a duration");
  expect_error("command: [x]\nhang: {timeout: 500ms}\n", 2, 17, "hang.timeout: expected at least 2s");
  expect_error("command: [x]\nhang: {action: stop}\n", 2, 7, "hang: missing key 'timeout'");
  expect_error("command: [x]\nhang:\n  timout: 5s\n", 3, 3, "unknown key 'hang.timout' (did you mean 'timeout'?)");
  expect_error("command: [x]\nhang: 10m\n", 2, 7, "hang: expected a mapping with keys timeout, action");
  for (auto a : {HangAction::report, HangAction::stop, HangAction::restart}) {
    EXPECT_EQ(hang_action_from_name(hang_action_name(a)), a);
  }
  EXPECT_FALSE(hang_action_from_name("Stop").has_value());
  expect_error("command: [x]\ncontainer: {runtime: podman, image: x}\nhang: {timeout: 5s}\n", 3, 7,
               "hang: not supported yet with container");
}

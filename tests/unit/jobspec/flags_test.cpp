// The job spec from the command line (jobspec/flags.hpp) and torchrun's command line
// (jobspec/torchrun.hpp): pure functions, every spelling.
#include "jobspec/flags.hpp"
#include "jobspec/torchrun.hpp"

#include <gtest/gtest.h>

using namespace ddp::jobspec;
using namespace std::chrono_literals;
using V = std::vector<std::string>;

namespace {

// ddpctl launch's options, as its CLI declares them.
std::optional<bool> launch_takes_value(std::string_view o) {
  for (auto v : {"-n", "--nproc-per-node", "--nnodes", "--max-restarts", "--log-dir", "--master-port", "--ranks",
                 "--job-id", "--result-json", "--nodes", "--facts"}) {
    if (o == v) return true;
  }
  for (auto f : {"--dry-run", "-q", "--quiet", "--ssh", "--slurm", "--tls", "--detach"}) {
    if (o == f) return false;
  }
  return std::nullopt;
}

TorchrunContext ctx(std::map<std::string, std::string> env = {}) {
  TorchrunContext c;
  c.env = std::move(env);
  c.is_local = [](std::string_view h) { return h == "localhost" || h == "127.0.0.1" || h == "here" || h == "::1"; };
  return c;
}

TorchrunPlan tr(V args, std::map<std::string, std::string> env = {}) {
  return parse_torchrun(args, ctx(std::move(env)));
}

std::string refusal(V args, std::map<std::string, std::string> env = {}) {
  try {
    tr(std::move(args), std::move(env));
  } catch (const TorchrunError& e) {
    return e.what();
  } catch (const JobSpecError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a refusal";
  return {};
}

const TorchrunNote* note_of(const TorchrunPlan& p, std::string_view flag) {
  for (const auto& n : p.notes) {
    if (n.flag == flag) return &n;
  }
  return nullptr;
}

}  // namespace

// --- spec_from_flags ---

TEST(SpecFromFlags, BuildsTheJobAFileWould) {
  JobFlags f;
  f.command = {"python3", "train.py", "--lr", "0.1"};
  f.nproc_per_node = "4";
  f.max_restarts = "2";
  f.log_dir = "/tmp/l";
  auto s = spec_from_flags(f, "ddpctl launch");
  EXPECT_EQ(s.command, (V{"python3", "train.py", "--lr", "0.1"}));
  EXPECT_FALSE(s.shell);
  EXPECT_EQ(s.nproc.count, 4);
  EXPECT_EQ(s.max_restarts, 2);
  EXPECT_EQ(s.log_dir, "/tmp/l");
  EXPECT_EQ(s.name, "train");
  EXPECT_EQ(s.file, "ddpctl launch");
  EXPECT_EQ(s.store_port, 29500);
  EXPECT_FALSE(s.store_port_explicit);
}

TEST(SpecFromFlags, SameRulesAsTheFile) {
  JobFlags f;
  f.command = {"python3", "t.py"};
  f.nproc_per_node = "0";
  try {
    spec_from_flags(f, "ddpctl launch");
    FAIL();
  } catch (const JobSpecError& e) {
    EXPECT_NE(std::string(e.what()).find("ddpctl launch: error: nproc_per_node: expected an integer from 1 to 4096"),
              std::string::npos)
        << e.what();
  }
  f.nproc_per_node = "gpu";
  f.store_port = "70000";
  EXPECT_THROW(spec_from_flags(f, "x"), JobSpecError);
  f.store_port = "1234";
  auto s = spec_from_flags(f, "x");
  EXPECT_EQ(s.store_port, 1234);
  EXPECT_TRUE(s.store_port_explicit);
  EXPECT_EQ(s.nproc.kind, Nproc::Kind::gpu);
  f.store_port = std::string("0");  // not the literal: GCC 12 warns falsely (-Wrestrict) on an optional<string> = "0"
  EXPECT_FALSE(spec_from_flags(f, "x").store_port_explicit);
  JobFlags none;
  EXPECT_THROW(spec_from_flags(none, "x"), JobSpecError);
  JobFlags empty_program;
  empty_program.command = {""};
  EXPECT_THROW(spec_from_flags(empty_program, "x"), JobSpecError);
}

TEST(SpecFromFlags, WordsThatLookLikeYamlStayWords) {
  JobFlags f;
  f.command = {"python3", "t.py", "yes", "{a: b}", "- x", "null", "~"};
  auto s = spec_from_flags(f, "x");
  EXPECT_EQ(s.command, f.command);
}

TEST(SpecFromFlags, Names) {
  EXPECT_EQ(name_from_command({"python3", "-u", "dir/train_ddp.py"}), "train_ddp");
  EXPECT_EQ(name_from_command({"python3", "-u", "-m", "pkg.sub.trainer"}), "trainer");
  EXPECT_EQ(name_from_command({"./run.sh", "x"}), "run");
  EXPECT_EQ(name_from_command({"/usr/bin/my prog"}), "my_prog");
  EXPECT_EQ(name_from_command({"...."}), "job");
  EXPECT_EQ(name_from_command({}), "job");
  EXPECT_EQ(name_from_command({std::string(100, 'a') + ".py"}).size(), 64u);
}

// --- split_launch_words ---

TEST(LaunchWords, JobFileKeepsFlagsAfterIt) {
  auto w = split_launch_words({"job.yaml", "-n", "2", "--dry-run"}, launch_takes_value);
  EXPECT_EQ(w.own, (V{"job.yaml", "-n", "2", "--dry-run"}));
  EXPECT_TRUE(w.command.empty());
}

TEST(LaunchWords, CommandAfterSeparator) {
  auto w =
      split_launch_words({"-n", "4", "--nodes", "a,b", "--", "python3", "train.py", "-n", "9"}, launch_takes_value);
  EXPECT_EQ(w.own, (V{"-n", "4", "--nodes", "a,b"}));
  EXPECT_EQ(w.command, (V{"python3", "train.py", "-n", "9"}));
  EXPECT_FALSE(w.script);
}

TEST(LaunchWords, BarePythonScriptIsTheCommand) {
  // The first thing a torchrun user types (issue 25: "not valid YAML: illegal map value").
  auto w = split_launch_words({"--nproc-per-node", "2", "train.py", "--lr", "0.1", "-n", "3"}, launch_takes_value);
  EXPECT_EQ(w.own, (V{"--nproc-per-node", "2"}));
  EXPECT_EQ(w.command, (V{"python3", "train.py", "--lr", "0.1", "-n", "3"}));
  EXPECT_TRUE(w.script);
  // An option's value that ends in .py is a value, not the script.
  w = split_launch_words({"--result-json", "r.py", "-q", "t.py"}, launch_takes_value);
  EXPECT_EQ(w.own, (V{"--result-json", "r.py", "-q"}));
  EXPECT_EQ(w.command, (V{"python3", "t.py"}));
  w = split_launch_words({"--log-dir=x.py", "-n4", "t.py"}, launch_takes_value);
  EXPECT_EQ(w.own, (V{"--log-dir=x.py", "-n4"}));
  EXPECT_EQ(w.command, (V{"python3", "t.py"}));
}

TEST(LaunchWords, ScriptAfterJobFileIsNotACommand) {
  auto w = split_launch_words({"job.yaml", "t.py"}, launch_takes_value);
  EXPECT_EQ(w.own, (V{"job.yaml", "t.py"}));  // the option parser refuses the extra word
  EXPECT_TRUE(w.command.empty());
  w = split_launch_words({"--"}, launch_takes_value);
  EXPECT_EQ(w.own, (V{"--"}));
}

// --- parse_torchrun ---

TEST(Torchrun, StandaloneBothSpellings) {
  for (const auto* spelling : {"--nproc-per-node", "--nproc_per_node", "--nproc"}) {
    auto p = tr({"--standalone", spelling, "2", "train.py", "--arg", "x"});
    EXPECT_EQ(p.spec.nproc.count, 2) << spelling;
    EXPECT_EQ(p.spec.command, (V{"python3", "-u", "train.py", "--arg", "x"}));
    EXPECT_FALSE(p.spec.store_port_explicit);
    EXPECT_EQ(p.spec.name, "train");
    ASSERT_NE(note_of(p, "--standalone"), nullptr);
  }
  auto p = tr({"--nproc_per_node=3", "t.py"});
  EXPECT_EQ(p.spec.nproc.count, 3);
}

TEST(Torchrun, OptionsAfterTheScriptAreTheScripts) {
  auto p = tr({"t.py", "--nnodes", "4", "--standalone"});
  EXPECT_EQ(p.spec.command, (V{"python3", "-u", "t.py", "--nnodes", "4", "--standalone"}));
  p = tr({"--", "t.py", "-m"});
  EXPECT_EQ(p.spec.command, (V{"python3", "-u", "t.py", "-m"}));
}

TEST(Torchrun, CommandForms) {
  EXPECT_EQ(tr({"-m", "pkg.train", "a"}).spec.command, (V{"python3", "-u", "-m", "pkg.train", "a"}));
  EXPECT_EQ(tr({"--module", "pkg.train"}).spec.command, (V{"python3", "-u", "-m", "pkg.train"}));
  EXPECT_EQ(tr({"--no-python", "./run.sh", "a"}).spec.command, (V{"./run.sh", "a"}));
  EXPECT_EQ(tr({"--no_python", "./run.sh"}).spec.command, (V{"./run.sh"}));
  auto rp = tr({"--run-path", "t.py", "a"});
  EXPECT_EQ(rp.spec.command, (V{"python3", "-u", "t.py", "a"}));
  EXPECT_EQ(note_of(rp, "--run-path")->kind, NoteKind::mapped);
  EXPECT_EQ(tr({"--run_path", "t.py"}).spec.command, (V{"python3", "-u", "t.py"}));
  EXPECT_EQ(tr({"t.py"}, {{"PYTHON_EXEC", "/venv/bin/python"}}).spec.command, (V{"/venv/bin/python", "-u", "t.py"}));
  EXPECT_NE(refusal({"--no-python", "-m", "pkg"}).find("--no-python and --module"), std::string::npos);
  EXPECT_NE(refusal({"--standalone"}).find("no training script"), std::string::npos);
}

TEST(Torchrun, RestartsAndMonitorAndStartMethod) {
  for (const auto* s : {"--max-restarts", "--max_restarts"}) EXPECT_EQ(tr({s, "3", "t.py"}).spec.max_restarts, 3);
  EXPECT_THROW(tr({"--max-restarts", "-1", "t.py"}), JobSpecError);
  auto p = tr({"--monitor-interval", "5", "--start_method", "fork", "t.py"});
  EXPECT_EQ(note_of(p, "--monitor-interval")->kind, NoteKind::ignored);
  EXPECT_EQ(note_of(p, "--start_method")->kind, NoteKind::ignored);
  EXPECT_THROW(tr({"--monitor_interval", "soon", "t.py"}), TorchrunError);
  EXPECT_THROW(tr({"--start-method", "thread", "t.py"}), TorchrunError);
}

TEST(Torchrun, SingleNodeSpellingsAccepted) {
  auto p = tr({"--nnodes", "1", "--node-rank", "0", "--master-addr", "localhost", "--master-port", "29600",
               "--nproc-per-node", "2", "t.py"});
  EXPECT_EQ(p.spec.store_port, 29600);
  EXPECT_TRUE(p.spec.store_port_explicit);
  EXPECT_EQ(note_of(p, "--master-addr")->kind, NoteKind::mapped);
  p = tr({"--nnodes=1:1", "--node_rank=0", "--master_addr=127.0.0.1", "--master_port=29601", "t.py"});
  EXPECT_EQ(p.spec.store_port, 29601);
  p = tr({"--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "t.py"});
  EXPECT_EQ(p.spec.store_port, 0);
  EXPECT_FALSE(p.spec.store_port_explicit);
  p = tr({"--rdzv_backend=c10d", "--rdzv_endpoint=localhost:29400", "--rdzv_id=123", "t.py"});
  EXPECT_EQ(p.spec.store_port, 29400);
  EXPECT_FALSE(p.spec.store_port_explicit);  // preferred, not demanded: torchrun's agent store takes its own
  EXPECT_EQ(p.spec.name, "123");
  p = tr({"--rdzv-endpoint", "[::1]:29400", "t.py"});
  EXPECT_EQ(p.spec.store_port, 29400);
  // --master-port means nothing to torchrun's c10d backend
  p = tr({"--standalone", "--master-port", "1234", "t.py"});
  EXPECT_EQ(note_of(p, "--master-port")->kind, NoteKind::ignored);
  EXPECT_FALSE(p.spec.store_port_explicit);
  p = tr({"--rdzv-backend", "static", "--rdzv-conf", "timeout=900", "t.py"});
  EXPECT_EQ(note_of(p, "--rdzv-conf")->kind, NoteKind::ignored);
}

TEST(Torchrun, MultiNodeRefusedWithTheDdpctlWay) {
  for (V args :
       {V{"--nnodes", "2", "t.py"}, V{"--nnodes=1:4", "t.py"}, V{"--node-rank", "1", "t.py"},
        V{"--rdzv-endpoint", "n1:29400", "--rdzv-backend", "c10d", "t.py"}, V{"--master_addr", "10.0.0.1", "t.py"}}) {
    auto msg = refusal(args);
    EXPECT_NE(msg.find("--nodes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--ssh"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--slurm"), std::string::npos) << msg;
    EXPECT_NE(msg.find("t.py"), std::string::npos) << msg;
  }
  EXPECT_NE(refusal({"--rdzv-backend", "etcd-v2", "t.py"}).find("needs no etcd-v2 server"), std::string::npos);
  EXPECT_NE(refusal({"--nnodes", "0", "t.py"}).find("0 < MIN <= MAX"), std::string::npos);
  EXPECT_NE(refusal({"--nnodes", "3:2", "t.py"}).find("0 < MIN <= MAX"), std::string::npos);
}

TEST(Torchrun, Nproc) {
  EXPECT_EQ(tr({"--nproc-per-node", "cpu", "t.py"}).spec.nproc.kind, Nproc::Kind::cpu);
  EXPECT_EQ(tr({"--nproc-per-node", "gpu", "t.py"}).spec.nproc.kind, Nproc::Kind::gpu);
  EXPECT_TRUE(tr({"--nproc-per-node", "auto", "t.py"}).nproc_auto);
  EXPECT_NE(refusal({"--nproc-per-node", "xpu", "t.py"}).find("a number, cpu, gpu or auto"), std::string::npos);
  EXPECT_THROW(tr({"--nproc-per-node", "0", "t.py"}), JobSpecError);
  EXPECT_EQ(tr({"t.py"}).spec.nproc.count, 1);  // torchrun's default
}

TEST(Torchrun, OutputFlags) {
  auto p = tr({"--log-dir", "/tmp/x", "-r", "3", "-t", "3", "--local-ranks-filter", "0,2", "t.py"});
  EXPECT_EQ(p.spec.log_dir, "/tmp/x");
  EXPECT_FALSE(p.quiet);  // torchrun tails what --tee names to the console even when redirected
  EXPECT_EQ(note_of(p, "-r")->kind, NoteKind::honoured);
  EXPECT_EQ(p.show_ranks, (std::set<int>{0, 2}));
  EXPECT_EQ(note_of(p, "-t")->kind, NoteKind::honoured);
  EXPECT_TRUE(tr({"-r", "3", "-t", "0", "t.py"}).quiet);
  EXPECT_FALSE(tr({"-r", "3", "--tee", "0:0,1:2", "t.py"}).quiet);
  p = tr({"--redirects=0:3,1:1", "--tee", "1", "--log_dir=l", "--local_ranks_filter=1", "t.py"});
  EXPECT_FALSE(p.quiet);
  EXPECT_EQ(note_of(p, "--redirects")->kind, NoteKind::ignored);
  p = tr({"-r3", "t.py"});
  EXPECT_TRUE(p.quiet);
  EXPECT_THROW(tr({"-r", "4", "t.py"}), TorchrunError);
  EXPECT_THROW(tr({"-t", "0:x", "t.py"}), TorchrunError);
  EXPECT_THROW(tr({"--local-ranks-filter", "a", "t.py"}), TorchrunError);
  p = tr({"--log-line-prefix-template", "${rank}", "--local-addr", "x", "--logs-specs", "s", "--signals-to-handle",
          "SIGUSR1", "--duplicate-stdout-filters", "err", "--event-log-handler", "null", "--role", "trainer", "t.py"});
  for (auto f : {"--log-line-prefix-template", "--local-addr", "--logs-specs", "--signals-to-handle",
                 "--duplicate-stdout-filters", "--event-log-handler", "--role"}) {
    ASSERT_NE(note_of(p, f), nullptr) << f;
    EXPECT_EQ(note_of(p, f)->kind, NoteKind::ignored) << f;
  }
}

TEST(Torchrun, BindingAndShutdown) {
  auto p = tr({"--numa-binding", "node", "--shutdown-timeout", "2.5", "t.py"});
  EXPECT_EQ(p.spec.binding.numa, NumaBinding::node);
  EXPECT_EQ(p.spec.stop_grace, 2500ms);
  // Rounded to the nearest millisecond; negative and absurd values refused.
  EXPECT_EQ(tr({"--shutdown-timeout", "0.0015", "t.py"}).spec.stop_grace, 2ms);
  EXPECT_EQ(tr({"--shutdown-timeout", "0.0014", "t.py"}).spec.stop_grace, 1ms);
  EXPECT_EQ(tr({"--shutdown-timeout", "0", "t.py"}).spec.stop_grace, 0ms);
  EXPECT_THROW(tr({"--shutdown-timeout", "-1", "t.py"}), TorchrunError);
  EXPECT_EQ(tr({"--shutdown-timeout", "1000000", "t.py"}).spec.stop_grace, 1000000000ms);
  EXPECT_THROW(tr({"--shutdown-timeout", "2000000", "t.py"}), TorchrunError);
  EXPECT_THROW(tr({"--shutdown-timeout", "1e300", "t.py"}), TorchrunError);
  EXPECT_THROW(tr({"--numa_binding", "socket", "t.py"}), TorchrunError);
  EXPECT_NE(refusal({"--virtual-local-rank", "t.py"}).find("gpu: isolate"), std::string::npos);
}

TEST(Torchrun, ArgparseShapes) {
  EXPECT_NE(refusal({"--nproc-per-nodes", "2", "t.py"}).find("(did you mean --nproc-per-node?)"), std::string::npos);
  EXPECT_NE(refusal({"--bogus", "t.py"}).find("not a torchrun option"), std::string::npos);
  EXPECT_NE(refusal({"--r", "t.py"}).find("ambiguous"),
            std::string::npos);  // --rdzv-*, --redirects, --role, --run-path
  EXPECT_NE(refusal({"--standalone=1", "t.py"}).find("takes no value"), std::string::npos);
  EXPECT_NE(refusal({"--nproc-per-node"}).find("expects a value"), std::string::npos);
  EXPECT_NE(refusal({"-x", "t.py"}).find("not a torchrun option"), std::string::npos);
  EXPECT_TRUE(tr({"-h"}).help);
  EXPECT_TRUE(tr({"--nnodes", "2", "--help"}).help);
  EXPECT_NE(torchrun_help().find("--nproc_per_node"), std::string::npos);
}

TEST(Torchrun, PetVariablesUnderTheCommandLine) {
  auto p = tr({"t.py"}, {{"PET_NPROC_PER_NODE", "3"}, {"PET_STANDALONE", "1"}, {"PET_MAX_RESTARTS", "2"}});
  EXPECT_EQ(p.spec.nproc.count, 3);
  EXPECT_EQ(p.spec.max_restarts, 2);
  ASSERT_NE(note_of(p, "PET_STANDALONE"), nullptr);
  EXPECT_EQ(tr({"--nproc-per-node", "2", "t.py"}, {{"PET_NPROC_PER_NODE", "3"}}).spec.nproc.count, 2);
  EXPECT_NE(refusal({"t.py"}, {{"PET_NNODES", "2"}}).find("PET_NNODES 2"), std::string::npos);
  EXPECT_EQ(note_of(tr({"t.py"}, {{"PET_STANDALONE", "0"}}), "PET_STANDALONE"), nullptr);
}

// ddpctl doctor: this node's facts as a table (or JSON), and a consistency preflight across
// nodes described by facts files.
//
//   ddpctl doctor                     discover this node, print it, check it alone
//   ddpctl doctor --json              this node as JSON in the facts model (save it as a facts file)
//   ddpctl doctor --facts a.json --facts b.json
//                                     compare saved nodes; --json then prints {nodes, findings}
//   ddpctl doctor --nodes n[1-4]      the same with live facts from each node's ddp-agentd
//   --image IMAGE --runtime R / --job FILE
//                                     also look the job's container image up on each node (never
//                                     pulling) and check that every node has the same digest
//   --job FILE (no container)         on this node, ask the job's interpreter (lib/pyenv) for its
//                                     Python and PyTorch; without it, python3 on PATH is asked
//   --sysfs-root DIR (or DDP_SYSFS_ROOT)  discover from a copied or fixture sysfs/procfs tree
//   --gpu-job / --cpu-job             what the job needs (default: GPUs iff any node has one)
//   --rdma / --no-rdma                whether the job must use RDMA (default: if all nodes have it)
//
// Exit status: 0 no error-level finding, 1 an error-level finding, 2 bad usage or unreadable
// input. Findings go to stdout with the table, to stderr when stdout carries JSON.
#include "commands.hpp"

#include "container/runtime.hpp"
#include "contract/contract.hpp"
#include "coordinator/gather.hpp"
#include "facts/consistency.hpp"
#include "facts/discover.hpp"
#include "facts/report.hpp"
#include "hostlist/hostlist.hpp"
#include "jobspec/jobspec.hpp"
#include "net/connection.hpp"
#include "net/token_file.hpp"
#include "net/wire.hpp"
#include "pyenv/probe.hpp"

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>

namespace ddpctl {

namespace {

struct DoctorArgs {
  bool json = false;
  std::vector<std::string> facts_files;
  std::string sysfs_root;
  std::string nodes;
  std::string token_file;
  bool tls = false;
  bool gpu_job = false, cpu_job = false, rdma = false, no_rdma = false, no_nvml = false;
  int world_size = 0;
  std::string image, runtime, job;
};

extern "C" char** environ;

// The container image to look up (--image/--runtime or --job's container), or nullopt.
std::optional<ddp::jobspec::ContainerSpec> wanted_image(const DoctorArgs& a) {
  if (!a.job.empty()) {
    return ddp::jobspec::load_job_file(a.job).container;  // a host job: only its Python is asked about
  }
  if (a.image.empty()) return std::nullopt;
  auto runtime = ddp::jobspec::runtime_from_name(a.runtime);
  if (!runtime) throw std::invalid_argument("--image needs --runtime docker|podman|apptainer|enroot");
  ddp::jobspec::ContainerSpec cs;
  cs.runtime = *runtime;
  cs.image = a.image;
  return cs;
}

ddp::contract::Env own_env() {
  ddp::contract::Env env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv(*e);
    if (auto eq = kv.find('='); eq != std::string_view::npos) env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

// The job's Python here (--job FILE of a host job), else python3 on this PATH, as a launch would
// probe it (lib/pyenv): the torch version that doctor shows and compares is the job's.
std::optional<ddp::facts::PythonFacts> python_here(const DoctorArgs& a) {
  ddp::jobspec::JobSpec spec;
  if (!a.job.empty()) spec = ddp::jobspec::load_job_file(a.job);
  if (spec.container) return std::nullopt;  // the image's Python: not probed here yet
  ddp::pyenv::ProbeRequest req;
  if (a.job.empty()) {
    req.choice = {{"python3"},
                  std::string(ddp::facts::kNoJobSourcePrefix) + "give --job FILE to ask the job's own interpreter)",
                  true};
  } else {
    req.choice = ddp::pyenv::choose_interpreter(spec);
  }
  req.env = ddp::contract::scrub(own_env());
  for (const auto& [k, v] : spec.env) req.env[k] = v;
  req.workdir = spec.workdir.value_or(std::filesystem::current_path().string());
  return ddp::pyenv::probe_python(req, &ddp::pyenv::process_cache(ddp::pyenv::default_cache_file()));
}

// This node's view of the image, looked up here (never pulled).
ddp::facts::ContainerImage look_up_here(const ddp::jobspec::ContainerSpec& cs) {
  const auto env = own_env();
  ddp::facts::ContainerImage ci{std::string(ddp::jobspec::runtime_name(cs.runtime)), cs.image, {}, {}, {}};
  try {
    auto id =
        ddp::container::prepare_image(cs, ddp::contract::scrub(env), std::filesystem::current_path().string(), false);
    if (!id.digest.empty())
      ci.digest = id.digest;
    else
      ci.error = "not resolved: the runtime fetches it when it runs";
    if (!id.repo_digest.empty()) ci.repo_digest = id.repo_digest;
  } catch (const ddp::container::ContainerError& e) {
    ci.error = e.what();
  }
  return ci;
}

int run_doctor(const DoctorArgs& a) {
  namespace F = ddp::facts;
  if (!a.nodes.empty() && (!a.facts_files.empty() || !a.sysfs_root.empty())) {
    std::cerr << "ddpctl doctor: --nodes asks the agents; it excludes --facts and --sysfs-root\n";
    return 2;
  }
  if (!a.facts_files.empty() && !a.sysfs_root.empty()) {
    std::cerr << "ddpctl doctor: --facts and --sysfs-root exclude each other (a facts file replaces discovery)\n";
    return 2;
  }

  // A root that does not exist would read as an empty node; say so instead.
  std::string root = a.sysfs_root;
  if (root.empty())
    if (const char* env = std::getenv("DDP_SYSFS_ROOT")) root = env;
  if (a.facts_files.empty() && !root.empty() && !std::filesystem::is_directory(root)) {
    std::cerr << "ddpctl doctor: sysfs root " << root << " is not a directory\n";
    return 2;
  }

  std::optional<ddp::jobspec::ContainerSpec> image;
  try {
    image = wanted_image(a);
  } catch (const ddp::jobspec::JobSpecError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const std::invalid_argument& e) {
    std::cerr << "ddpctl doctor: " << e.what() << "\n";
    return 2;
  }
  if (image && !a.facts_files.empty()) {
    std::cerr
        << "ddpctl doctor: --image/--job look the image up on live nodes (this one, or --nodes), not in facts files\n";
    return 2;
  }

  std::vector<F::NodeFacts> nodes;
  std::vector<std::string> notes;
  bool unanswered = false;  // a --nodes node that did not answer fails the check, as an error would
  try {
    if (!a.nodes.empty()) {
      auto hosts = ddp::hostlist::expand(a.nodes);
      if (!hosts.ok()) {
        std::cerr << "ddpctl doctor: --nodes '" << a.nodes << "': " << hosts.error->to_string() << "\n";
        return 2;
      }
      const auto keys =
          ddp::net::load_token_file(a.token_file.empty() ? ddp::net::find_client_token_file() : a.token_file);
      bool missing = false;
      nlohmann::json want_image = nullptr;
      if (image) want_image = {{"runtime", ddp::jobspec::runtime_name(image->runtime)}, {"image", image->image}};
      for (auto& g : ddp::coordinator::gather_facts(hosts.hosts, keys, ddp::net::local_user(), ddp::Millis(60000),
                                                    want_image, a.tls)) {
        if (!g.facts) {
          std::cerr << "ddpctl doctor: " << g.node << ": " << g.error << "\n";
          missing = true;
          continue;
        }
        nodes.push_back(F::from_json(*g.facts, "agent " + g.node, &notes));
      }
      if (missing) {
        unanswered = true;
        std::cerr << "ddpctl doctor: not every node answered; the checks below cover those that did (exit 1)\n";
        if (nodes.empty()) return 2;
      }
    } else if (a.facts_files.empty()) {
      auto opt = F::discover_options_from_env();
      if (!a.sysfs_root.empty()) opt.root = a.sysfs_root;
      opt.use_nvml = !a.no_nvml;
      nodes.push_back(F::discover(opt));
      if (image) nodes.back().container_image = look_up_here(*image);
      // The live machine only: a copied sysfs tree is another node, whose Python is not here.
      // The interpreter's torch replaces the system Python's, also when it has none: the
      // versions table and the python section then say the same.
      if (root.empty())
        if (auto py = python_here(a)) F::set_python(nodes.back(), std::move(*py));
    } else {
      for (const auto& file : a.facts_files) nodes.push_back(F::load_facts_file(file, &notes));
    }
  } catch (const F::FactsError& e) {
    std::cerr << "ddpctl doctor: " << e.what() << "\n";
    return 2;
  } catch (const ddp::net::TokenError& e) {
    std::cerr << "ddpctl doctor: " << e.what() << "\n";
    return 2;
  } catch (const ddp::net::WireError& e) {
    std::cerr << "ddpctl doctor: " << e.what() << "\n";
    return 2;
  }
  for (const auto& n : notes) std::cerr << "note: " << n << "\n";

  auto job = F::default_job_needs(nodes);
  if (a.gpu_job) job.gpu = true;
  if (a.cpu_job) job.gpu = false;
  if (a.rdma) job.rdma = true;
  if (a.no_rdma) job.rdma = false;
  if (a.world_size > 0) job.world_size = a.world_size;
  auto findings = F::check_consistency(nodes, job);
  const int rc = F::has_errors(findings) || unanswered ? 1 : 0;

  if (a.json) {
    if (nodes.size() == 1) {
      std::cout << F::to_json(nodes.front()).dump(2) << "\n";
      for (const auto& f : findings)
        if (f.severity != F::Severity::info)
          std::cerr << F::to_string(f.severity) << ": " << f.message << " [" << f.code << "]\n";
    } else {
      nlohmann::json out{{"nodes", nlohmann::json::array()}, {"findings", nlohmann::json::array()}};
      for (const auto& n : nodes) out["nodes"].push_back(F::to_json(n));
      for (const auto& f : findings) out["findings"].push_back(F::to_json(f));
      out["ok"] = rc == 0;
      std::cout << out.dump(2) << "\n";
    }
    return rc;
  }

  if (nodes.size() == 1) {
    std::cout << F::format_node(nodes.front());
  } else {
    std::cout << F::format_nodes_summary(nodes);
  }
  std::cout << "\nchecks (" << (job.gpu ? "GPU job" : "CPU job") << ", " << nodes.size() << " node"
            << (nodes.size() == 1 ? "" : "s") << ")\n"
            << F::format_findings(findings);
  return rc;
}

}  // namespace

Command add_doctor_command(CLI::App& root) {
  auto args = std::make_shared<DoctorArgs>();
  auto* sub = root.add_subcommand("doctor", "show this node's facts and check nodes for mismatches before a launch");
  sub->add_flag("--json", args->json, "print JSON in the node-facts model (several nodes: {nodes, findings})");
  sub->add_option("--facts", args->facts_files,
                  "a facts file (from `ddpctl doctor --json`) instead of discovery; repeat, one per node")
      ->take_all();
  sub->add_option("--sysfs-root", args->sysfs_root,
                  "read sysfs/procfs under this directory instead of / (also DDP_SYSFS_ROOT)");
  sub->add_option(
         "--nodes", args->nodes,
         "gather live facts from these nodes' ddp-agentd (node1,node2:29410,node[3-8]) and check them together")
      ->check(ddpctl::non_empty_nodes());
  sub->add_option("--token-file", args->token_file, "the agents' shared secret (default: as for launch)");
  sub->add_flag("--tls", args->tls, "with --nodes: inside TLS 1.3, as launch --tls");
  auto* gpu = sub->add_flag("--gpu-job", args->gpu_job, "judge as a GPU (NCCL) job (default: if any node has a GPU)");
  sub->add_flag("--cpu-job", args->cpu_job, "judge as a CPU (gloo) job: GPUs, drivers and NCCL are not required")
      ->excludes(gpu);
  auto* rdma = sub->add_flag("--rdma", args->rdma, "the job must use RDMA (InfiniBand/RoCE) on every node");
  sub->add_flag("--no-rdma", args->no_rdma, "the job will not use RDMA (NCCL_IB_DISABLE=1)")->excludes(rdma);
  sub->add_option("--world-size", args->world_size,
                  "ranks in the job, for the open-files check (default: GPUs, or one per node)")
      ->check(CLI::PositiveNumber);
  sub->add_flag("--no-nvml", args->no_nvml, "do not load NVML; read sysfs/procfs only");
  auto* image = sub->add_option("--image", args->image,
                                "look this container image up on each node (never pulled) and compare their digests");
  sub->add_option("--runtime", args->runtime, "the runtime of --image: docker, podman, apptainer or enroot")
      ->needs(image);
  sub->add_option("--job", args->job,
                  "this job file's container image (looked up on each node), or for a host job its Python and "
                  "PyTorch here")
      ->excludes(image);
  return {sub, [args] { return run_doctor(*args); }};
}

}  // namespace ddpctl

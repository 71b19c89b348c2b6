// `ddpctl render k8s job.yaml --image IMG [...]`: the job as Kubernetes manifests (lib/k8s), on
// stdout or into -o FILE, for `kubectl apply -f`.
#include "commands.hpp"

#include "k8s/render.hpp"

#include <fmt/format.h>

#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>

namespace ddpctl {
namespace {

struct RenderArgs {
  std::string job_file, output;
  ddp::k8s::RenderOptions options;
  int nodes = 0;
  long long active_deadline_s = 0;
  std::string name, namespace_;
};

int render_k8s(RenderArgs& a) {
  auto spec = ddp::jobspec::load_job_file(a.job_file);
  std::ifstream in(a.job_file);
  a.options.job_file_text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (a.nodes > 0) a.options.nodes = a.nodes;
  if (a.active_deadline_s > 0) a.options.active_deadline_s = a.active_deadline_s;
  if (!a.name.empty()) a.options.name = a.name;
  if (!a.namespace_.empty()) a.options.namespace_ = a.namespace_;
  const std::string text = ddp::k8s::to_yaml(ddp::k8s::render(spec, a.options));
  if (a.output.empty() || a.output == "-") {
    std::cout << text;
    return 0;
  }
  std::ofstream out(a.output);
  out << text;
  if (!out.flush()) throw std::runtime_error(fmt::format("cannot write {}", a.output));
  return 0;
}

}  // namespace

Command add_render_command(CLI::App& root) {
  auto args = std::make_shared<RenderArgs>();
  auto* render = root.add_subcommand("render", "write the manifests that run a job under a scheduler");
  render->require_subcommand(1);
  auto* k8s = render->add_subcommand(
      "k8s",
      "Kubernetes: an Indexed Job (one pod per node, each a one-shot ddp-agentd; pod 0 also runs ddpctl "
      "launch), a headless Service and a ConfigMap with the job file");
  k8s->add_option("job_file", args->job_file, "the job file (train.yaml)")->required();
  k8s->add_option("--image", args->options.image, "container image with ddpctl, ddp-agentd and the job's code")
      ->required();
  k8s->add_option("--nodes", args->nodes, "number of pods (default: the job's nnodes)")->check(CLI::Range(1, 10000));
  k8s->add_option("--name", args->name, "name of the Job, Service and ConfigMap (default: the job's name)");
  k8s->add_option("--namespace", args->namespace_, "namespace for the objects (default: kubectl's)");
  k8s->add_option("--token-secret", args->options.token_secret,
                  "Secret whose key 'token' holds the shared secret (default: ddpctl-token)");
  k8s->add_option("--gpus-per-pod", args->options.gpus_per_pod, "nvidia.com/gpu limit per pod (default: none)")
      ->check(CLI::Range(0, 1024));
  k8s->add_option("--active-deadline", args->active_deadline_s, "seconds before Kubernetes stops the whole Job")
      ->check(CLI::Range(1LL, 31'536'000LL));
  k8s->add_option("-o,--output", args->output, "write to FILE instead of stdout");
  return {render, [args, k8s]() {
            if (!k8s->parsed()) return 2;
            return render_k8s(*args);
          }};
}

}  // namespace ddpctl

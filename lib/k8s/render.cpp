#include "k8s/render.hpp"

#include "common/strings.hpp"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <regex>

namespace ddp::k8s {

using Object = nlohmann::ordered_json;

namespace {

constexpr const char* kTokenPath = "/etc/ddpctl/token";
constexpr const char* kJobDir = "/etc/ddpctl/job";

// What every pod runs. sh is PID 1 in the container, which ignores signals it does not trap:
// the trap passes Kubernetes' SIGTERM on to the agent and the launcher, which stop the
// workers within stop.grace. `waitfor` waits again after a trapped signal interrupts `wait`.
constexpr const char* kPodScript = R"(pids=""
trap 'kill -TERM $pids 2>/dev/null' TERM INT
waitfor() { while kill -0 "$1" 2>/dev/null; do wait "$1"; rc=$?; done; return "${rc:-0}"; }
ddp-agentd --oneshot --listen "[::]:29410" --token-file /etc/ddpctl/token --log-dir /var/log/ddpctl &
agent=$!
pids=$agent
if [ "$JOB_COMPLETION_INDEX" = 0 ]; then
  ddpctl launch --nodes "$DDP_K8S_NODES" --token-file /etc/ddpctl/token /etc/ddpctl/job/job.yaml &
  launcher=$!
  pids="$agent $launcher"
  waitfor "$launcher"; status=$?
  kill -TERM "$agent" 2>/dev/null
  waitfor "$agent"
  exit "$status"
fi
waitfor "$agent"
)";

bool dns1035_label(const std::string& s) {
  static const std::regex re("^[a-z]([-a-z0-9]*[a-z0-9])?$");
  return std::regex_match(s, re);
}

}  // namespace

std::string object_name(const std::string& job_name) {
  std::string out;
  for (char c : job_name)
    out += (c == '_' || c == '.') ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (out.size() > static_cast<std::size_t>(kMaxNameLength) || !dns1035_label(out)) {
    throw RenderError(fmt::format(
        "the job name '{}' does not make a Kubernetes name ('{}'): it must start with a letter, end with a letter or "
        "digit and have at most {} characters; pass --name",
        job_name, out, kMaxNameLength));
  }
  return out;
}

std::vector<Object> render(const jobspec::JobSpec& spec, const RenderOptions& o) {
  if (o.image.empty())
    throw RenderError("--image is required: the container image with ddpctl, ddp-agentd and the job's code");
  const std::string name = object_name(o.name.value_or(spec.name));
  int nodes = 0;
  if (o.nodes) {
    nodes = *o.nodes;
    if (nodes < spec.nnodes_min || nodes > spec.nnodes_max) {
      throw RenderError(fmt::format("--nodes {}: the job file asks for nnodes {}{}", nodes, spec.nnodes_min,
                                    spec.nnodes_min == spec.nnodes_max ? "" : fmt::format(":{}", spec.nnodes_max)));
    }
  } else if (spec.nnodes_min != spec.nnodes_max) {
    throw RenderError(fmt::format("nnodes {}:{}: an Indexed Job has a fixed number of pods; pass --nodes N",
                                  spec.nnodes_min, spec.nnodes_max));
  } else {
    nodes = spec.nnodes_max;
  }
  if (nodes < 1 || nodes > 10000) throw RenderError(fmt::format("--nodes {}: expected 1 to 10000 pods", nodes));
  if (spec.store_port == 0)
    throw RenderError("store.port 0 (any free port) does not work across nodes yet; give a port");
  if (o.gpus_per_pod < 0) throw RenderError("--gpus-per-pod must not be negative");

  // Pod i is "<name>-<i>" (an Indexed Job's hostname), "<name>-<i>.<name>" through the
  // headless Service, which is what pod 0's launcher dials.
  std::vector<std::string> hosts;
  for (int i = 0; i < nodes; ++i) hosts.push_back(fmt::format("{}-{}.{}", name, i, name));

  Object labels{{"app.kubernetes.io/name", "ddpctl"}, {"app.kubernetes.io/instance", name}};
  auto metadata = [&](const std::string& object) {
    Object m{{"name", object}};
    if (o.namespace_) m["namespace"] = *o.namespace_;
    m["labels"] = labels;
    return m;
  };

  Object config_map{{"apiVersion", "v1"},
                    {"kind", "ConfigMap"},
                    {"metadata", metadata(name + "-job")},
                    {"data", {{"job.yaml", o.job_file_text}}}};

  Object service{{"apiVersion", "v1"},
                 {"kind", "Service"},
                 {"metadata", metadata(name)},
                 {"spec",
                  {{"clusterIP", "None"},
                   {"publishNotReadyAddresses", true},
                   {"selector", labels},
                   {"ports", Object::array({{{"name", "agent"}, {"port", kAgentPort}, {"protocol", "TCP"}},
                                            {{"name", "store"}, {"port", spec.store_port}, {"protocol", "TCP"}}})}}}};

  Object container{
      {"name", "ddp"},
      {"image", o.image},
      {"command", Object::array({"/bin/sh", "-c", kPodScript})},
      {"env", Object::array({{{"name", "DDP_K8S_NODES"}, {"value", join(hosts, ",")}}})},
      {"ports", Object::array({{{"name", "agent"}, {"containerPort", kAgentPort}, {"protocol", "TCP"}},
                               {{"name", "store"}, {"containerPort", spec.store_port}, {"protocol", "TCP"}}})},
      {"volumeMounts",
       Object::array({{{"name", "token"}, {"mountPath", kTokenPath}, {"subPath", "token"}, {"readOnly", true}},
                      {{"name", "job"}, {"mountPath", kJobDir}, {"readOnly", true}}})}};
  if (o.gpus_per_pod > 0) container["resources"] = {{"limits", {{"nvidia.com/gpu", o.gpus_per_pod}}}};

  const auto grace_s = std::chrono::duration_cast<std::chrono::seconds>(spec.stop_grace).count() + 30;
  Object pod_spec{
      {"subdomain", name},
      {"restartPolicy", "Never"},
      {"terminationGracePeriodSeconds", grace_s},
      {"containers", Object::array({container})},
      {"volumes",
       Object::array({{{"name", "token"}, {"secret", {{"secretName", o.token_secret}, {"defaultMode", 0400}}}},
                      {{"name", "job"}, {"configMap", {{"name", name + "-job"}}}}})}};

  Object job_spec{{"completionMode", "Indexed"}, {"completions", nodes}, {"parallelism", nodes}, {"backoffLimit", 0}};
  if (o.active_deadline_s) job_spec["activeDeadlineSeconds"] = *o.active_deadline_s;
  job_spec["template"] = {{"metadata", {{"labels", labels}}}, {"spec", pod_spec}};

  Object job{{"apiVersion", "batch/v1"}, {"kind", "Job"}, {"metadata", metadata(name)}, {"spec", job_spec}};
  return {config_map, service, job};
}

namespace {

// Plain scalars that a YAML 1.1 reader (Kubernetes' go-yaml, PyYAML) would take for a number,
// a bool or null, and so must be quoted to stay strings.
bool looks_typed(const std::string& s) {
  static const std::regex number(
      R"(^[-+]?(\.?[0-9][0-9_.:eE+-]*|\.inf|\.Inf|\.INF|\.nan|\.NaN|\.NAN|0x[0-9a-fA-F_]+|0o?[0-7_]+)$)");
  static const std::vector<std::string> words{"y", "n", "yes", "no", "true", "false", "on", "off", "null", "~"};
  std::string lower(s);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return s.empty() || std::regex_match(s, number) || std::find(words.begin(), words.end(), lower) != words.end();
}

void emit(YAML::Emitter& out, const Object& v) {
  if (v.is_object()) {
    out << YAML::BeginMap;
    for (const auto& [k, x] : v.items()) {
      out << YAML::Key << k << YAML::Value;
      emit(out, x);
    }
    out << YAML::EndMap;
  } else if (v.is_array()) {
    out << YAML::BeginSeq;
    for (const auto& x : v) emit(out, x);
    out << YAML::EndSeq;
  } else if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    if (s.find('\n') != std::string::npos)
      out << YAML::Literal << s;
    else if (looks_typed(s))
      out << YAML::DoubleQuoted << s;
    else
      out << s;
  } else if (v.is_boolean()) {
    out << YAML::TrueFalseBool << v.get<bool>();
  } else if (v.is_number_integer()) {
    out << v.get<long long>();
  } else if (v.is_number()) {
    out << v.get<double>();
  } else {
    out << YAML::Null;
  }
}

}  // namespace

std::string to_yaml(const std::vector<Object>& objects) {
  std::string text;
  for (const auto& o : objects) {
    YAML::Emitter out;
    emit(out, o);
    text += "---\n";
    text += out.c_str();
    text += "\n";
  }
  return text;
}

}  // namespace ddp::k8s

// `ddpctl render k8s job.yaml`: the manifests that run a job on Kubernetes.
//
//   ConfigMap <name>-job   the job file, mounted at /etc/ddpctl/job/job.yaml
//   Service   <name>       headless (clusterIP: None) with publishNotReadyAddresses, so every
//                          pod's name resolves before it is Ready, pod 0's included
//   Job       <name>       completionMode: Indexed, one pod per node; every pod runs a one-shot
//                          ddp-agentd, and pod 0 (JOB_COMPLETION_INDEX 0) also runs
//                          `ddpctl launch --nodes <name>-0.<name>,<name>-1.<name>,...`
//
// The shared secret comes from a Secret the admin makes (`kubectl create secret generic
// ddpctl-token --from-file=token=...`), mounted with subPath as a regular 0400 file (the agent
// refuses symlinks and loose modes). ddpctl restarts the job itself (restart.max_restarts), so
// the Job has backoffLimit 0: a failed pod fails the Job, and Kubernetes stops the others.
//
// Policy: names must be DNS-1035 labels short enough for "<name>-<index>" hostnames; anything
// else is an error naming what to pass instead (--name).
#pragma once

#include "jobspec/jobspec.hpp"

#include <nlohmann/json.hpp>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::k8s {

class RenderError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct RenderOptions {
  std::string image;                      // required: holds ddpctl, ddp-agentd and the job's code
  std::optional<std::string> name;        // default: the job's name, lower-cased, '_'/'.' as '-'
  std::optional<std::string> namespace_;  // default: none (kubectl's current namespace)
  std::optional<int> nodes;               // default: the job's nnodes (which must then be fixed)
  std::string token_secret = "ddpctl-token";
  int gpus_per_pod = 0;  // nvidia.com/gpu limit; 0: none requested
  std::optional<long long> active_deadline_s;
  std::string job_file_text;  // the job file as written (the ConfigMap's data)
};

inline constexpr int kAgentPort = 29410;
inline constexpr int kMaxNameLength = 47;  // "<name>-<index>" stays a 63-character label up to index 10^15

// The objects, in apply order (ConfigMap, Service, Job). Throws RenderError.
std::vector<nlohmann::ordered_json> render(const jobspec::JobSpec& spec, const RenderOptions& options);

// A multi-document YAML stream ("---" between objects). Strings that YAML 1.1 would read as
// another type ("0", "true", "on") are quoted; multi-line strings are literal blocks.
std::string to_yaml(const std::vector<nlohmann::ordered_json>& objects);

// The name a job file's `name` becomes (lower case, '_' and '.' as '-'), or why it cannot.
std::string object_name(const std::string& job_name);

}  // namespace ddp::k8s

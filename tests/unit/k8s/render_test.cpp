#include "k8s/render.hpp"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

using namespace ddp;
using Object = nlohmann::ordered_json;

namespace {

jobspec::JobSpec spec(const std::string& extra = "") {
  return jobspec::parse_job_yaml("name: Resnet_50.ddp\nnnodes: 3\ncommand: [python3, train.py]\n" + extra,
                                 "train.yaml");
}

k8s::RenderOptions options() {
  k8s::RenderOptions o;
  o.image = "registry.example/ddp:1";
  o.job_file_text = "name: x\n";
  return o;
}

const Object& find(const std::vector<Object>& objs, const std::string& kind) {
  for (const auto& o : objs) {
    if (o["kind"] == kind) return o;
  }
  throw std::runtime_error("no " + kind);
}

std::string render_error(const jobspec::JobSpec& s, const k8s::RenderOptions& o) {
  try {
    k8s::render(s, o);
  } catch (const k8s::RenderError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(K8sRender, IndexedJobHeadlessServiceAndConfigMap) {
  auto objs = k8s::render(spec(), options());
  ASSERT_EQ(objs.size(), 3u);
  EXPECT_EQ(objs[0]["kind"], "ConfigMap");  // apply order: what the Job mounts comes first
  const auto& svc = find(objs, "Service");
  EXPECT_EQ(svc["metadata"]["name"], "resnet-50-ddp");
  EXPECT_EQ(svc["spec"]["clusterIP"], "None");
  EXPECT_EQ(svc["spec"]["publishNotReadyAddresses"], true);
  const auto& job = find(objs, "Job");
  EXPECT_EQ(job["spec"]["completionMode"], "Indexed");
  EXPECT_EQ(job["spec"]["completions"], 3);
  EXPECT_EQ(job["spec"]["parallelism"], 3);
  EXPECT_EQ(job["spec"]["backoffLimit"], 0);
  const auto& pod = job["spec"]["template"]["spec"];
  EXPECT_EQ(pod["subdomain"], svc["metadata"]["name"]);
  EXPECT_EQ(job["spec"]["template"]["metadata"]["labels"], svc["spec"]["selector"]);
  const auto& c = pod["containers"][0];
  EXPECT_EQ(c["env"][0]["name"], "DDP_K8S_NODES");
  EXPECT_EQ(c["env"][0]["value"],
            "resnet-50-ddp-0.resnet-50-ddp,resnet-50-ddp-1.resnet-50-ddp,resnet-50-ddp-2.resnet-50-ddp");
  const std::string script = c["command"][2];
  EXPECT_NE(script.find("ddp-agentd --oneshot"), std::string::npos);
  EXPECT_NE(script.find("if [ \"$JOB_COMPLETION_INDEX\" = 0 ]"), std::string::npos);
  EXPECT_NE(script.find("ddpctl launch --nodes \"$DDP_K8S_NODES\""), std::string::npos);
  EXPECT_EQ(c["volumeMounts"][0]["mountPath"], "/etc/ddpctl/token");
  EXPECT_EQ(c["volumeMounts"][0]["subPath"], "token");  // a regular file, not the volume's symlink
  EXPECT_EQ(pod["volumes"][0]["secret"]["secretName"], "ddpctl-token");
  EXPECT_EQ(pod["volumes"][0]["secret"]["defaultMode"], 0400);
  EXPECT_EQ(pod["terminationGracePeriodSeconds"], 60);  // stop.grace 30 s + 30
  EXPECT_FALSE(c.contains("resources"));
  EXPECT_EQ(objs[0]["data"]["job.yaml"], "name: x\n");
}

TEST(K8sRender, OptionsShowUp) {
  auto o = options();
  o.nodes = 2;
  o.name = "exp7";
  o.namespace_ = "ml";
  o.gpus_per_pod = 8;
  o.active_deadline_s = 3600;
  o.token_secret = "team-token";
  auto elastic = jobspec::parse_job_yaml("nnodes: 1:4\ncommand: [x]\n", "t.yaml");
  auto objs = k8s::render(elastic, o);
  const auto& job = find(objs, "Job");
  EXPECT_EQ(job["metadata"]["name"], "exp7");
  EXPECT_EQ(job["metadata"]["namespace"], "ml");
  EXPECT_EQ(job["spec"]["completions"], 2);
  EXPECT_EQ(job["spec"]["activeDeadlineSeconds"], 3600);
  const auto& pod = job["spec"]["template"]["spec"];
  EXPECT_EQ(pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], 8);
  EXPECT_EQ(pod["volumes"][0]["secret"]["secretName"], "team-token");
  EXPECT_EQ(find(objs, "ConfigMap")["metadata"]["name"], "exp7-job");
}

TEST(K8sRender, ErrorsSayWhatToPass) {
  auto o = options();
  auto elastic = jobspec::parse_job_yaml("nnodes: 1:4\ncommand: [x]\n", "t.yaml");
  EXPECT_NE(render_error(elastic, o).find("nnodes 1:4: an Indexed Job has a fixed number of pods; pass --nodes N"),
            std::string::npos);
  o.nodes = 5;
  EXPECT_NE(render_error(elastic, o).find("--nodes 5: the job file asks for nnodes 1:4"), std::string::npos);
  o.nodes.reset();
  EXPECT_NE(render_error(jobspec::parse_job_yaml("name: 7up\ncommand: [x]\n", "t.yaml"), o).find("pass --name"),
            std::string::npos);
  o.name = std::string(48, 'a');
  EXPECT_NE(render_error(spec(), o).find("at most 47 characters"), std::string::npos);
  o.name.reset();
  o.image.clear();
  EXPECT_NE(render_error(spec(), o).find("--image is required"), std::string::npos);
  EXPECT_NE(render_error(spec("store: {port: 0}\n"), options()).find("store.port 0"), std::string::npos);
}

TEST(K8sRender, NamesFollowDns1035) {
  EXPECT_EQ(k8s::object_name("Train_DDP.v2"), "train-ddp-v2");
  EXPECT_THROW(k8s::object_name("job-"), k8s::RenderError);
  EXPECT_THROW(k8s::object_name("9lives"), k8s::RenderError);
}

// YAML 1.1 readers (Kubernetes') must get back exactly the objects: strings that look like
// numbers or bools stay strings, multi-line text survives.
TEST(K8sRender, YamlRoundTripsTypes) {
  Object o{
      {"apiVersion", "v1"},
      {"s", Object::array({"1", "0400", "true", "on", "No", "~", "", "1e3", "0x1f", ".5", "plain", "a: b", "- x"})},
      {"n", 256},
      {"b", false},
      {"text", "line 1\n  indented: 2\n"}};
  auto docs = YAML::LoadAll(k8s::to_yaml({o, o}));
  ASSERT_EQ(docs.size(), 2u);
  const auto& d = docs[1];
  for (std::size_t i = 0; i < o["s"].size(); ++i) {
    const std::string want = o["s"][i];
    EXPECT_EQ(d["s"][i].Scalar(), want);
    // yaml-cpp keeps the tag: "!" marks a quoted (non-plain) scalar, so a YAML 1.1 resolver
    // cannot turn it into a number or bool.
    if (want == "1" || want == "true" || want == "on" || want == "No" || want == "1e3" || want == "0x1f") {
      EXPECT_EQ(d["s"][i].Tag(), "!") << want;
    }
  }
  EXPECT_EQ(d["n"].as<int>(), 256);
  EXPECT_EQ(d["b"].Scalar(), "false");
  EXPECT_EQ(d["text"].Scalar(), "line 1\n  indented: 2\n");
}

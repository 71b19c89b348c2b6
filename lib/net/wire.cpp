// The job payload codec and --nodes entries (see wire.hpp).
#include "net/wire.hpp"

#include "common/strings.hpp"
#include "hostlist/hostlist.hpp"

#include <fmt/format.h>

#include <regex>

#include <algorithm>
#include <set>

namespace ddp::net {

using nlohmann::json;

namespace {

const char* nproc_kind(jobspec::Nproc::Kind k) {
  switch (k) {
    case jobspec::Nproc::Kind::cpu:
      return "cpu";
    case jobspec::Nproc::Kind::gpu:
      return "gpu";
    default:
      return "count";
  }
}

template <class T>
T get(const json& j, const char* key) {
  if (!j.contains(key)) throw WireError(fmt::format("job spec: missing '{}'", key));
  try {
    return j.at(key).get<T>();
  } catch (const json::exception&) {
    throw WireError(fmt::format("job spec: '{}' has the wrong type", key));
  }
}

// binding: values in the enums' order, as the job file spells them.
const std::vector<std::string> kGpuBinding{"auto", "none", "isolate"};
const std::vector<std::string> kNumaBinding{"auto", "none", "node", "exclusive"};
const std::vector<std::string> kNicBinding{"auto", "none", "rank"};

const std::vector<std::string> kRuntime{"docker", "podman", "apptainer", "enroot"};
const std::vector<std::string> kPull{"never", "missing", "always"};

std::size_t enum_index(const std::vector<std::string>& names, const std::string& v, const char* what) {
  auto it = std::find(names.begin(), names.end(), v);
  if (it == names.end()) throw WireError(fmt::format("job spec: {} '{}' is not one of {}", what, v, join(names, ", ")));
  return static_cast<std::size_t>(it - names.begin());
}

}  // namespace

json to_json(const JobPayload& p) {
  const auto& s = p.spec;
  json env = json::array();
  for (const auto& [k, v] : s.env) env.push_back({k, v});
  json j{{"file", s.file},
         {"name", s.name},
         {"nnodes_min", s.nnodes_min},
         {"nnodes_max", s.nnodes_max},
         {"nproc", {{"kind", nproc_kind(s.nproc.kind)}, {"count", s.nproc.count}}},
         {"command", s.command},
         {"shell", s.shell},
         {"env", env},
         {"env_forward", s.env_forward},
         {"max_restarts", s.max_restarts},
         {"restart_backoff_ms", s.restart_backoff.count()},
         {"log_dir", s.log_dir},
         {"log_max_bytes", s.log_max_bytes},
         {"store_port", s.store_port},
         {"store_threads", s.store_threads},
         {"store_max_bytes", s.store_max_bytes},
         {"store_max_keys", s.store_max_keys},
         {"nccl_unique_id", s.nccl_unique_id == jobspec::NcclUniqueId::on    ? "on"
                            : s.nccl_unique_id == jobspec::NcclUniqueId::off ? "off"
                                                                             : "auto"},
         {"stop_grace_ms", s.stop_grace.count()},
         {"binding",
          {{"gpu", kGpuBinding.at(static_cast<std::size_t>(s.binding.gpu))},
           {"numa", kNumaBinding.at(static_cast<std::size_t>(s.binding.numa))},
           {"nic", kNicBinding.at(static_cast<std::size_t>(s.binding.nic))}}},
         {"forward_env", p.forward_env}};
  if (s.workdir) j["workdir"] = *s.workdir;
  if (!s.python.empty()) j["python"] = s.python;
  // store.protocol (version 6; absent: auto): how node 0's store reads 1.13–2.1 clients.
  if (s.store_protocol != "auto") j["store_protocol"] = s.store_protocol;
  // Written only when false (store.port not named: node rank 0 may take a free port when it is
  // taken): a spec without it reads as named, which is what a launcher that predates it meant,
  // and stays byte for byte what older builds wrote, which a standing coordinator's delegation
  // digest (proto/delegation.hpp) relies on.
  if (!s.store_port_explicit) j["store_port_explicit"] = false;
  // The hang watchdog (version 6): the agents sample with its timeout; the coordinator acts.
  if (s.hang)
    j["hang"] = {{"timeout_ms", s.hang->timeout.count()}, {"action", jobspec::hang_action_name(s.hang->action)}};
  if (s.container) {
    const auto& c = *s.container;
    json mounts = json::array(), cenv = json::array();
    for (const auto& m : c.mounts)
      mounts.push_back({{"source", m.source}, {"target", m.target}, {"read_only", m.read_only}});
    for (const auto& [k, v] : c.env) cenv.push_back({k, v});
    j["container"] = {
        {"runtime", kRuntime.at(static_cast<std::size_t>(c.runtime))}, {"image", c.image},           {"mounts", mounts},
        {"pull", kPull.at(static_cast<std::size_t>(c.pull))},          {"extra_args", c.extra_args}, {"env", cenv}};
    if (c.workdir) j["container"]["workdir"] = *c.workdir;
  }
  return j;
}

JobPayload payload_from_json(const json& j) {
  if (!j.is_object()) throw WireError("job spec: expected an object");
  // A variable's name as the job file allows it: a name with '=' or a newline would smuggle
  // another variable past the agent's filters (a loader variable to a root process) or add a
  // line to a container's env file. Values may hold anything but NUL.
  auto check_var = [](const std::string& where, const std::string& name, const std::string* value) {
    static const std::regex re("^[A-Za-z_][A-Za-z0-9_]{0,255}$");
    if (!std::regex_match(name, re))
      throw WireError(fmt::format("job spec: {}: '{}' is not a variable name", where, name));
    if (value && value->find('\0') != std::string::npos)
      throw WireError(fmt::format("job spec: {}: {} holds a NUL byte", where, name));
  };
  JobPayload p;
  auto& s = p.spec;
  s.file = get<std::string>(j, "file");
  s.name = get<std::string>(j, "name");
  s.nnodes_min = get<int>(j, "nnodes_min");
  s.nnodes_max = get<int>(j, "nnodes_max");
  const auto& n = j.contains("nproc") ? j.at("nproc") : json();
  if (!n.is_object()) throw WireError("job spec: missing 'nproc'");
  const auto kind = get<std::string>(n, "kind");
  if (kind == "cpu")
    s.nproc.kind = jobspec::Nproc::Kind::cpu;
  else if (kind == "gpu")
    s.nproc.kind = jobspec::Nproc::Kind::gpu;
  else if (kind == "count")
    s.nproc.kind = jobspec::Nproc::Kind::count;
  else
    throw WireError(fmt::format("job spec: nproc.kind '{}' is not cpu, gpu or count", kind));
  s.nproc.count = get<int>(n, "count");
  if (s.nproc.kind == jobspec::Nproc::Kind::count && (s.nproc.count < 1 || s.nproc.count > 4096)) {
    throw WireError(fmt::format("job spec: nproc.count {} is outside 1-4096", s.nproc.count));
  }
  s.command = get<std::vector<std::string>>(j, "command");
  if (s.command.empty() || s.command[0].empty()) throw WireError("job spec: 'command' is empty");
  s.shell = get<bool>(j, "shell");
  if (j.contains("workdir")) s.workdir = get<std::string>(j, "workdir");
  if (j.contains("python")) {
    s.python = get<std::vector<std::string>>(j, "python");
    if (s.python.empty() || s.python.size() > 64 || s.python[0].empty())
      throw WireError("job spec: 'python' must be a non-empty argv");
  }
  for (const auto& kv : get<json>(j, "env")) {
    if (!kv.is_array() || kv.size() != 2 || !kv[0].is_string() || !kv[1].is_string()) {
      throw WireError("job spec: 'env' items must be [name, value] pairs of strings");
    }
    s.env.emplace_back(kv[0].get<std::string>(), kv[1].get<std::string>());
    check_var("env", s.env.back().first, &s.env.back().second);
  }
  s.env_forward = get<std::vector<std::string>>(j, "env_forward");
  for (const auto& pat : s.env_forward) {
    check_var("env_forward", !pat.empty() && pat.back() == '*' ? pat.substr(0, pat.size() - 1) + "_" : pat, nullptr);
  }
  s.max_restarts = get<int>(j, "max_restarts");
  s.restart_backoff = Millis(get<long long>(j, "restart_backoff_ms"));
  s.log_dir = get<std::string>(j, "log_dir");
  s.log_max_bytes = get<std::uint64_t>(j, "log_max_bytes");
  s.store_port = get<std::uint16_t>(j, "store_port");
  // Absent from a launcher that predates it: that port or a failure, as node rank 0 did then.
  s.store_port_explicit = j.contains("store_port_explicit") ? get<bool>(j, "store_port_explicit") : true;
  // Absent from a launcher that predates it: 0, as then (an agent now serves it on one thread).
  const auto threads = j.contains("store_threads") ? get<long long>(j, "store_threads") : 0;
  if (threads < jobspec::kAutoThreads || threads > jobspec::kMaxStoreThreads)
    throw WireError("job spec: store_threads out of range");
  s.store_threads = static_cast<int>(threads);
  // Absent from a launcher that predates them: the defaults.
  if (j.contains("store_max_bytes")) s.store_max_bytes = get<std::uint64_t>(j, "store_max_bytes");
  if (j.contains("store_max_keys")) s.store_max_keys = get<std::uint64_t>(j, "store_max_keys");
  if (j.contains("store_protocol")) {
    s.store_protocol = get<std::string>(j, "store_protocol");
    if (s.store_protocol.size() > 8) throw WireError("job spec: store_protocol is not a PyTorch release");
  }
  const auto nccl = get<std::string>(j, "nccl_unique_id");
  s.nccl_unique_id = nccl == "on"    ? jobspec::NcclUniqueId::on
                     : nccl == "off" ? jobspec::NcclUniqueId::off
                                     : jobspec::NcclUniqueId::automatic;
  s.stop_grace = Millis(get<long long>(j, "stop_grace_ms"));
  if (s.stop_grace.count() < 0 || s.restart_backoff.count() < 0) throw WireError("job spec: negative duration");
  if (j.contains("binding")) {
    const auto& b = j.at("binding");
    if (!b.is_object()) throw WireError("job spec: 'binding' must be an object");
    s.binding.gpu =
        static_cast<jobspec::GpuBinding>(enum_index(kGpuBinding, get<std::string>(b, "gpu"), "binding.gpu"));
    s.binding.numa =
        static_cast<jobspec::NumaBinding>(enum_index(kNumaBinding, get<std::string>(b, "numa"), "binding.numa"));
    s.binding.nic =
        static_cast<jobspec::NicBinding>(enum_index(kNicBinding, get<std::string>(b, "nic"), "binding.nic"));
  }
  if (j.contains("container")) {
    const auto& cj = j.at("container");
    if (!cj.is_object()) throw WireError("job spec: 'container' must be an object");
    jobspec::ContainerSpec c;
    c.runtime = static_cast<jobspec::ContainerRuntime>(
        enum_index(kRuntime, get<std::string>(cj, "runtime"), "container.runtime"));
    c.pull = static_cast<jobspec::PullPolicy>(enum_index(kPull, get<std::string>(cj, "pull"), "container.pull"));
    c.image = get<std::string>(cj, "image");
    if (c.image.empty()) throw WireError("job spec: container.image is empty");
    for (const auto& m : get<json>(cj, "mounts")) {
      if (!m.is_object()) throw WireError("job spec: container.mounts items must be objects");
      jobspec::Mount mount{get<std::string>(m, "source"), get<std::string>(m, "target"), get<bool>(m, "read_only")};
      // The launcher made sources absolute; a relative one here would mean the agent's directory.
      if (mount.source.empty() || mount.source[0] != '/' || mount.target.empty() || mount.target[0] != '/') {
        throw WireError("job spec: container.mounts need absolute sources and targets");
      }
      c.mounts.push_back(std::move(mount));
    }
    c.extra_args = get<std::vector<std::string>>(cj, "extra_args");
    for (const auto& kv : get<json>(cj, "env")) {
      if (!kv.is_array() || kv.size() != 2 || !kv[0].is_string() || !kv[1].is_string()) {
        throw WireError("job spec: 'container.env' items must be [name, value] pairs of strings");
      }
      c.env.emplace_back(kv[0].get<std::string>(), kv[1].get<std::string>());
      check_var("container.env", c.env.back().first, &c.env.back().second);
    }
    if (cj.contains("workdir")) c.workdir = get<std::string>(cj, "workdir");
    s.container = std::move(c);
  }
  if (j.contains("hang")) {
    const auto& hj = j.at("hang");
    if (!hj.is_object()) throw WireError("job spec: 'hang' must be an object");
    jobspec::HangSpec h;
    h.timeout = Millis(get<long long>(hj, "timeout_ms"));
    if (h.timeout < jobspec::kMinHangTimeout || h.timeout > Millis(7 * 24 * 3600 * 1000ll)) {
      throw WireError("job spec: hang.timeout_ms out of range");
    }
    const auto action = jobspec::hang_action_from_name(get<std::string>(hj, "action"));
    if (!action) throw WireError("job spec: hang.action must be report, stop or restart");
    h.action = *action;
    s.hang = h;
  }
  p.forward_env = get<std::map<std::string, std::string>>(j, "forward_env");
  for (const auto& [k, v] : p.forward_env) check_var("forward_env", k, &v);
  return p;
}

std::map<std::string, std::string> forwarded_env(const std::map<std::string, std::string>& launcher_env,
                                                 const std::vector<std::string>& patterns) {
  std::map<std::string, std::string> out;
  static const std::regex name_re("^[A-Za-z_][A-Za-z0-9_]{0,255}$");  // what an agent accepts (payload_from_json)
  for (const auto& [k, v] : launcher_env) {
    if (!std::regex_match(k, name_re) || v.find('\0') != std::string::npos) continue;
    for (const auto& p : patterns) {
      const bool prefix = !p.empty() && p.back() == '*';
      if (prefix ? k.rfind(p.substr(0, p.size() - 1), 0) == 0 : k == p) {
        out.emplace(k, v);
        break;
      }
    }
  }
  return out;
}

std::vector<NodeEntry> node_entries(const std::vector<std::string>& hosts, std::uint16_t default_port,
                                    bool allow_user) {
  std::vector<NodeEntry> out;
  std::map<std::string, int> per_host;
  std::set<std::pair<std::string, std::uint16_t>> seen;
  for (const auto& h : hosts) {
    auto ep = hostlist::parse_endpoint(h);
    if (!ep.ok()) throw WireError(fmt::format("node '{}': {}", h, ep.error->to_string()));
    if (!ep.endpoint.user.empty() && !allow_user) {
      throw WireError(
          fmt::format("node '{}': a login user ('{}@') is only for --ssh; an agent runs jobs as the user "
                      "its token maps to",
                      h, ep.endpoint.user));
    }
    NodeEntry e{"", ep.endpoint.host, ep.endpoint.port.value_or(default_port), ep.endpoint.user};
    if (!seen.insert({e.host, e.port}).second) {
      throw WireError(fmt::format("node '{}' is listed twice (as {}:{})", h, e.host, e.port));
    }
    ++per_host[e.host];
    out.push_back(std::move(e));
  }
  for (auto& e : out) {
    const bool v6 = e.host.find(':') != std::string::npos;
    e.name = per_host[e.host] > 1 ? (v6 ? fmt::format("[{}]:{}", e.host, e.port) : fmt::format("{}:{}", e.host, e.port))
                                  : e.host;
  }
  return out;
}

}  // namespace ddp::net

#include "agentconfig/agentconfig.hpp"

#include "common/size.hpp"
#include "common/strings.hpp"
#include "facts/model.hpp"
#include "hostlist/hostlist.hpp"
#include "proto/keyring.hpp"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

namespace ddp::agentconfig {

static std::string join_diagnostics(const std::vector<Diagnostic>& d) {
  std::string out;
  for (const auto& x : d) {
    if (!out.empty()) out += "\n";
    out += x.to_string();
  }
  return out;
}

ConfigError::ConfigError(std::vector<Diagnostic> diagnostics)
    : std::runtime_error(join_diagnostics(diagnostics)), diagnostics_(std::move(diagnostics)) {}

const char* to_string(ContainerRuntime r) {
  switch (r) {
    case ContainerRuntime::podman:
      return "podman";
    case ContainerRuntime::docker:
      return "docker";
    case ContainerRuntime::none:
      return "none";
  }
  return "none";
}

namespace {

const std::vector<std::string> kKeys{"listen",
                                     "token_file",
                                     "log_dir",
                                     "name",
                                     "heartbeat_timeout",
                                     "allowed_users",
                                     "key_users",
                                     "allow_root",
                                     "container_runtime",
                                     "job_units",
                                     "gpus",
                                     "cpus",
                                     "tls",
                                     "limits"};

// POSIX portable user names (what useradd accepts by default).
const std::regex& user_name_re() {
  static const std::regex re("^[a-z_][a-z0-9_-]{0,31}\\$?$");
  return re;
}

class Parser {
 public:
  explicit Parser(std::string file) : file_(std::move(file)) {}

  AgentConfig parse(const std::string& text) {
    AgentConfig cfg;
    cfg.file = file_;
    YAML::Node root;
    try {
      root = YAML::Load(text);
    } catch (const YAML::ParserException& e) {
      error(e.mark, fmt::format("not valid YAML: {}", e.msg));
      throw ConfigError(diags_);
    }
    // An empty file (or one of comments only) is a valid config: every default kept.
    if (!root.IsDefined() || root.IsNull()) return cfg;
    if (!root.IsMap()) {
      error(root.Mark(), fmt::format("expected a mapping with keys {}, got {}", join(kKeys, ", "), describe(root)));
      throw ConfigError(diags_);
    }
    std::set<std::string> seen;
    for (auto it = root.begin(); it != root.end(); ++it) {
      const YAML::Node k = it->first, v = it->second;
      if (!k.IsScalar()) {
        error(k.Mark(), "keys must be plain names");
        continue;
      }
      const std::string key = k.Scalar();
      if (!seen.insert(key).second) {
        error(k.Mark(), fmt::format("duplicate key '{}'", key));
      } else if (std::find(kKeys.begin(), kKeys.end(), key) == kKeys.end()) {
        auto hint = nearest(key, kKeys);
        error(k.Mark(), fmt::format("unknown key '{}'{}; expected one of: {}", key,
                                    hint ? fmt::format(" (did you mean '{}'?)", *hint) : "", join(kKeys, ", ")));
      } else {
        field(cfg, key, v);
      }
    }
    // Checked once every key is read: allow_root may come after key_users.
    for (const auto& ku : cfg.key_users) {
      if (ku.user == "root" && !cfg.allow_root) {
        diags_.push_back(
            {file_, ku.line, ku.column,
             fmt::format("key_users: key '{}' maps to root; jobs run as root only with allow_root: true", ku.key_id)});
      }
    }
    if (!diags_.empty()) throw ConfigError(diags_);
    return cfg;
  }

 private:
  void field(AgentConfig& cfg, const std::string& key, const YAML::Node& v) {
    if (key == "listen") {
      if (auto s = string(v, key)) {
        auto ep = hostlist::parse_endpoint(*s);
        if (!ep.ok())
          error(v.Mark(), fmt::format("listen: expected HOST:PORT such as '[::]:29410', got '{}': {}", *s,
                                      ep.error->to_string()));
        else
          cfg.listen = *s;
      }
    } else if (key == "token_file" || key == "log_dir") {
      if (auto s = path(v, key)) (key == "token_file" ? cfg.token_file : cfg.log_dir) = *s;
    } else if (key == "name") {
      if (auto s = string(v, key)) {
        static const std::regex re("^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$");
        if (!std::regex_match(*s, re))
          error(v.Mark(), fmt::format("name: expected 1-64 letters, digits, '.', '_' or '-', got '{}'", *s));
        else
          cfg.name = *s;
      }
    } else if (key == "heartbeat_timeout") {
      std::optional<Millis> d;
      if (v.IsScalar()) d = parse_duration(v.Scalar());
      // Coordinators beat every second at the most (proto/heartbeat.hpp): less than two
      // intervals stops workers over one late beat.
      if (!d || *d < Millis(2000) || *d > Millis(3'600'000)) {
        error(v.Mark(),
              fmt::format("heartbeat_timeout: expected a duration from 2s to 1h such as 6s, got {}", describe(v)));
      } else {
        cfg.heartbeat_timeout = *d;
      }
    } else if (key == "allowed_users") {
      allowed_users(cfg, v);
    } else if (key == "key_users") {
      key_users(cfg, v);
    } else if (key == "allow_root") {
      const std::string s = v.IsScalar() ? v.Scalar() : "";
      if (s == "true")
        cfg.allow_root = true;
      else if (s == "false")
        cfg.allow_root = false;
      else
        error(v.Mark(), fmt::format("allow_root: expected true or false, got {}", describe(v)));
    } else if (key == "container_runtime") {
      const std::string s = v.IsScalar() ? v.Scalar() : "";
      if (s == "podman")
        cfg.container_runtime = ContainerRuntime::podman;
      else if (s == "docker")
        cfg.container_runtime = ContainerRuntime::docker;
      else if (s == "none")
        cfg.container_runtime = ContainerRuntime::none;
      else
        error(v.Mark(), fmt::format("container_runtime: expected podman, docker or none, got {}", describe(v)));
    } else if (key == "job_units") {
      const std::string s = v.IsScalar() ? v.Scalar() : "";
      if (s == "auto")
        cfg.job_units = JobUnits::automatic;
      else if (s == "systemd")
        cfg.job_units = JobUnits::systemd;
      else if (s == "fork")
        cfg.job_units = JobUnits::fork;
      else
        error(v.Mark(), fmt::format("job_units: expected auto, systemd or fork, got {}", describe(v)));
    } else if (key == "tls") {
      const std::string s = v.IsScalar() ? v.Scalar() : "";
      if (s == "off" || s == "allowed" || s == "required")
        cfg.tls = s;
      else
        error(v.Mark(), fmt::format("tls: expected allowed, required or off, got {}", describe(v)));
    } else if (key == "limits") {
      limits(cfg, v);
    } else if (key == "gpus") {
      gpus(cfg, v);
    } else if (key == "cpus") {
      // A cpulist as the kernel writes it; a YAML integer (cpus: 3) is a one-CPU list too.
      std::optional<std::vector<int>> list;
      if (v.IsScalar()) list = facts::parse_cpulist(v.Scalar());
      if (!list || list->empty()) {
        error(v.Mark(), fmt::format("cpus: expected a CPU list such as 0-15,32-47, got {}", describe(v)));
      } else {
        cfg.cpus = std::move(*list);
      }
    }
  }

  // limits: {store_max_size: 4GiB, store_max_keys: 4194304, log_max_size: 10GiB}
  void limits(AgentConfig& cfg, const YAML::Node& v) {
    if (!v.IsMap()) {
      error(v.Mark(), fmt::format("limits: expected a mapping with keys store_max_size, store_max_keys, log_max_size, "
                                  "got {}",
                                  describe(v)));
      return;
    }
    for (auto it = v.begin(); it != v.end(); ++it) {
      const std::string k = it->first.IsScalar() ? it->first.Scalar() : "";
      const YAML::Node val = it->second;
      if (k == "store_max_keys") {
        static const std::regex re(R"(^\d{1,10}$)");
        if (!val.IsScalar() || !std::regex_match(val.Scalar(), re) || std::stoull(val.Scalar()) < 1024) {
          error(val.Mark(), fmt::format("limits.store_max_keys: expected a number of keys of at least 1024, got {}",
                                        describe(val)));
        } else {
          cfg.limits.store_max_keys = std::stoull(val.Scalar());
        }
      } else if (k == "store_max_size" || k == "log_max_size") {
        std::optional<std::uint64_t> bytes;
        if (val.IsScalar()) bytes = parse_size(val.Scalar());
        if (bytes && *bytes < (1ull << 20)) bytes.reset();
        if (!bytes)
          error(val.Mark(),
                fmt::format("limits.{}: expected a size of at least 1MiB such as 4GiB, got {}", k, describe(val)));
        else
          (k == "store_max_size" ? cfg.limits.store_max_size : cfg.limits.log_max_size) = *bytes;
      } else {
        error(it->first.Mark(),
              fmt::format("limits: unknown key {}; expected store_max_size, store_max_keys or log_max_size",
                          describe(it->first)));
      }
    }
  }

  void allowed_users(AgentConfig& cfg, const YAML::Node& v) {
    if (!v.IsSequence()) {
      error(v.Mark(),
            fmt::format("allowed_users: expected a list of user names such as [alice, bob], got {}", describe(v)));
      return;
    }
    for (const auto& item : v) {
      if (!item.IsScalar() || !std::regex_match(item.Scalar(), user_name_re())) {
        error(item.Mark(), fmt::format("allowed_users: expected a user name, got {}", describe(item)));
      } else if (std::find(cfg.allowed_users.begin(), cfg.allowed_users.end(), item.Scalar()) !=
                 cfg.allowed_users.end()) {
        error(item.Mark(), fmt::format("allowed_users: '{}' is listed twice", item.Scalar()));
      } else {
        cfg.allowed_users.push_back(item.Scalar());
      }
    }
  }

  // key id: user name. A user may have several keys (one per machine it submits from); a key
  // has one user.
  void key_users(AgentConfig& cfg, const YAML::Node& v) {
    if (!v.IsMap()) {
      error(v.Mark(), fmt::format("key_users: expected a mapping from token key ids to local user names such as "
                                  "{{alice-laptop: alice}}, got {}",
                                  describe(v)));
      return;
    }
    std::set<std::string> seen;
    for (auto it = v.begin(); it != v.end(); ++it) {
      const YAML::Node k = it->first, u = it->second;
      if (!k.IsScalar() || !proto::valid_key_id(k.Scalar())) {
        error(k.Mark(), fmt::format("key_users: expected a key id (1-64 letters, digits, '.', '_' or '-', as in the "
                                    "token file), got {}",
                                    describe(k)));
        continue;
      }
      if (!seen.insert(k.Scalar()).second) {
        error(k.Mark(), fmt::format("key_users: key '{}' is mapped twice", k.Scalar()));
        continue;
      }
      if (!u.IsScalar() || !std::regex_match(u.Scalar(), user_name_re())) {
        error(u.Mark(),
              fmt::format("key_users: key '{}': expected a local user name, got {}", k.Scalar(), describe(u)));
        continue;
      }
      cfg.key_users.push_back({k.Scalar(), u.Scalar(), u.Mark().line + 1, u.Mark().column + 1});
    }
  }

  void gpus(AgentConfig& cfg, const YAML::Node& v) {
    if (v.IsScalar() && v.Scalar() == "all") return;  // the default, said out loud
    if (!v.IsSequence()) {
      error(v.Mark(), fmt::format("gpus: expected 'all' or a list of GPUs (indices, UUIDs or PCI bus ids) "
                                  "such as [0, 1], got {}",
                                  describe(v)));
      return;
    }
    // Which GPUs these name is checked against the node's facts when a job is planned
    // (binding::restrict_gpus), as for --gpus; here only the shape.
    std::vector<std::string> out;
    for (const auto& item : v) {
      if (!item.IsScalar() || trim(item.Scalar()).empty() || item.Scalar().find(',') != std::string::npos) {
        error(item.Mark(), fmt::format("gpus: expected a GPU index, UUID or PCI bus id, got {}", describe(item)));
      } else if (std::find(out.begin(), out.end(), item.Scalar()) != out.end()) {
        error(item.Mark(), fmt::format("gpus: GPU {} is listed twice", item.Scalar()));
      } else {
        out.push_back(item.Scalar());
      }
    }
    cfg.gpus = std::move(out);
  }

  std::optional<std::string> string(const YAML::Node& v, std::string_view key) {
    if (!v.IsScalar() || v.Scalar().empty()) {
      error(v.Mark(),
            fmt::format("{}: expected a string, got {}", key, v.IsScalar() ? "an empty string" : describe(v)));
      return std::nullopt;
    }
    return v.Scalar();
  }

  // Absolute paths only: the agent is a daemon, and a relative path would depend on the
  // directory systemd (or whoever) started it in.
  std::optional<std::string> path(const YAML::Node& v, std::string_view key) {
    auto s = string(v, key);
    if (s && (*s)[0] != '/') {
      error(v.Mark(), fmt::format("{}: expected an absolute path, got '{}'", key, *s));
      return std::nullopt;
    }
    return s;
  }

  static std::string describe(const YAML::Node& n) {
    switch (n.Type()) {
      case YAML::NodeType::Map:
        return "a mapping";
      case YAML::NodeType::Sequence:
        return "a list";
      case YAML::NodeType::Null:
        return "nothing";
      case YAML::NodeType::Scalar:
        return fmt::format("'{}'", n.Scalar());
      default:
        return "an undefined value";
    }
  }

  void error(const YAML::Mark& m, std::string msg) {
    diags_.push_back({file_, m.line >= 0 ? m.line + 1 : 0, m.column >= 0 ? m.column + 1 : 0, std::move(msg)});
  }

  std::string file_;
  std::vector<Diagnostic> diags_;
};

}  // namespace

AgentConfig parse_agent_config(const std::string& text, const std::string& file) {
  return Parser(file).parse(text);
}

AgentConfig load_agent_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError({{path, 0, 0, fmt::format("cannot read the agent config: {}", std::strerror(errno))}});
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad())
    throw ConfigError({{path, 0, 0, fmt::format("cannot read the agent config: {}", std::strerror(errno))}});
  return parse_agent_config(text.str(), path);
}

}  // namespace ddp::agentconfig

namespace ddp::agentconfig {

std::string over_limits(const jobspec::JobSpec& spec, const JobLimits& limits) {
  auto over = [](const char* what, std::uint64_t asked, const char* key, std::uint64_t max) {
    return fmt::format(
        "the job's {} ({}) is above this node's limit of {} (limits.{} in the agent's config file, "
        "/etc/ddpctl/agent.yaml): ask for less, or have the admin raise it",
        what, asked, max, key);
  };
  if (spec.store_max_bytes > limits.store_max_size)
    return over("store.max_size", spec.store_max_bytes, "store_max_size", limits.store_max_size);
  if (spec.store_max_keys > limits.store_max_keys)
    return over("store.max_keys", spec.store_max_keys, "store_max_keys", limits.store_max_keys);
  if (spec.log_max_bytes > limits.log_max_size)
    return over("logs.max_size", spec.log_max_bytes, "log_max_size", limits.log_max_size);
  return {};
}

}  // namespace ddp::agentconfig

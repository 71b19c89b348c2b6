#include "jobspec/jobspec.hpp"
#include "jobspec/parse_node.hpp"

#include "common/size.hpp"
#include "common/strings.hpp"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <sys/stat.h>
#include <algorithm>
#include <cstring>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

namespace ddp::jobspec {

std::string Diagnostic::to_string() const {
  if (line > 0) return fmt::format("{}:{}:{}: error: {}", file, line, column, message);
  return fmt::format("{}: error: {}", file, message);
}

static std::string join_diagnostics(const std::vector<Diagnostic>& d) {
  std::string out;
  for (std::size_t i = 0; i < d.size(); ++i) {
    if (i) out += "\n";
    out += d[i].to_string();
  }
  return out;
}

JobSpecError::JobSpecError(std::vector<Diagnostic> diagnostics)
    : std::runtime_error(join_diagnostics(diagnostics)), diagnostics_(std::move(diagnostics)) {}

namespace {

// yaml-cpp says "end of sequence flow not found" where it gave up (the next key, the end of the
// file), not where the `[` was opened. The last `[` (or `{`) before `end` that is never closed:
// a light scan that skips comments, quoted scalars and block scalars (`|`, `>`), and takes a
// quote or, outside any flow, a bracket only where a node may start (first on its line, after
// `: `, `- `, `? `, or in a flow after `[`, `{`, `,`): `a[1]` and `it's` are plain scalars.
std::optional<YAML::Mark> unclosed_flow(const std::string& text, std::size_t end, char open) {
  struct Open {
    char c;
    YAML::Mark at;
  };
  std::vector<Open> stack;
  end = std::min(end, text.size());
  int line = 0, column = 0, indent = 0;
  bool at_indent = true;    // only blanks so far on this line
  bool node_starts = true;  // a node may start here
  auto newline = [&] { ++line, column = -1, indent = 0, at_indent = true; };
  for (std::size_t i = 0; i < end; ++i, ++column) {
    const char c = text[i];
    const bool in_flow = !stack.empty();
    if (c == '\n') {
      newline();
      if (!in_flow) node_starts = true;
      continue;
    }
    if (c == ' ' || c == '\t') {
      if (at_indent) ++indent;
      continue;
    }
    at_indent = false;
    const bool after_blank = i == 0 || text[i - 1] == ' ' || text[i - 1] == '\t' || text[i - 1] == '\n';
    if (c == '#' && after_blank) {  // a comment, to the end of its line
      while (i + 1 < end && text[i + 1] != '\n') ++i, ++column;
      continue;
    }
    if ((c == '\'' || c == '"') && node_starts) {  // a quoted scalar, to its close
      for (++i, ++column; i < end; ++i, ++column) {
        if (text[i] == '\n') newline(), at_indent = false;
        if (c == '"' && text[i] == '\\') {
          ++i, ++column;
          continue;
        }
        if (text[i] != c) continue;
        if (c == '\'' && i + 1 < end && text[i + 1] == '\'') {  // '' inside single quotes
          ++i, ++column;
          continue;
        }
        break;
      }
      node_starts = false;
      continue;
    }
    if ((c == '|' || c == '>') && node_starts && !in_flow) {
      // A block scalar: the rest of this line, then every line blank or indented deeper.
      const int own = indent;
      while (i + 1 < end && text[i + 1] != '\n') ++i;
      while (i + 1 < end) {
        std::size_t j = i + 2, spaces = 0;  // the next line's first byte is text[i + 2]
        while (j < end && text[j] == ' ') ++j, ++spaces;
        const bool blank = j >= end || text[j] == '\n';
        if (!blank && static_cast<int>(spaces) <= own) break;
        newline();
        i = j;
        while (i < end && text[i] != '\n') ++i;
        if (i >= end) break;
        --i;  // text[i + 1] is the newline ending the skipped line
      }
      column = 0;
      continue;
    }
    if ((c == '[' || c == '{') && (in_flow || node_starts)) {
      YAML::Mark m;
      m.pos = static_cast<int>(i), m.line = line, m.column = column;
      stack.push_back({c, m});
      node_starts = true;
      continue;
    }
    if (in_flow && (c == ']' || c == '}')) {
      stack.pop_back();
      node_starts = false;
      continue;
    }
    const bool blank_after = i + 1 >= end || text[i + 1] == ' ' || text[i + 1] == '\t' || text[i + 1] == '\n';
    node_starts = (in_flow && c == ',') || ((c == ':' || c == '-' || c == '?') && blank_after);
  }
  for (auto it = stack.rbegin(); it != stack.rend(); ++it) {
    if (it->c == open) return it->at;
  }
  return std::nullopt;
}

// store.protocol: "auto", or a PyTorch release MAJOR.MINOR from 1.13 on (1.13, or 2.N).
std::optional<std::string> store_protocol(const YAML::Node& v) {
  if (!v.IsScalar()) return std::nullopt;
  const std::string& t = v.Scalar();
  if (t == "auto" || t == "1.13") return t;
  if (t.size() < 3 || t.size() > 4 || t.compare(0, 2, "2.") != 0) return std::nullopt;
  for (std::size_t i = 2; i < t.size(); ++i) {
    if (t[i] < '0' || t[i] > '9') return std::nullopt;
  }
  if (t.size() == 4 && t[2] == '0') return std::nullopt;  // "2.01"
  return t;
}

// Keys we know. Those in `not_yet` belong to features of later issues.
const std::vector<std::string> kTopKeys{"name", "nnodes",      "hosts",   "nproc_per_node", "command", "workdir",
                                        "env",  "env_forward", "restart", "logs",           "store",   "stop",
                                        "nccl", "container",   "binding", "rendezvous",     "python",  "hang"};
const std::map<std::string, std::string> kNotYet{};

// Environment variables that ddpctl owns: a job may not set them (the value would be a lie).
const std::set<std::string> kReservedEnv{"RANK",
                                         "LOCAL_RANK",
                                         "WORLD_SIZE",
                                         "LOCAL_WORLD_SIZE",
                                         "GROUP_RANK",
                                         "GROUP_WORLD_SIZE",
                                         "ROLE_NAME",
                                         "ROLE_RANK",
                                         "ROLE_WORLD_SIZE",
                                         "MASTER_ADDR",
                                         "MASTER_PORT",
                                         "TORCHELASTIC_RESTART_COUNT",
                                         "TORCHELASTIC_MAX_RESTARTS",
                                         "TORCHELASTIC_RUN_ID",
                                         "TORCHELASTIC_USE_AGENT_STORE",
                                         "TORCHELASTIC_ERROR_FILE",
                                         "TORCHELASTIC_SIGNALS_TO_HANDLE",
                                         "DDP_JOB_ID",
                                         "DDP_NODE",
                                         "DDP_NODE_RANK",
                                         "DDP_NCCL_UNIQUE_ID",
                                         "DDP_ATTEMPT"};

}  // namespace

const std::set<std::string>& reserved_env() {
  return kReservedEnv;
}

std::optional<Nproc> parse_nproc(std::string_view text) {
  if (text == "cpu") return Nproc{Nproc::Kind::cpu, 1};
  if (text == "gpu") return Nproc{Nproc::Kind::gpu, 1};
  const auto n = parse_int(text);
  if (!n || *n < 1 || *n > 4096) return std::nullopt;
  return Nproc{Nproc::Kind::count, static_cast<int>(*n)};
}

std::string to_string(const Nproc& n) {
  switch (n.kind) {
    case Nproc::Kind::cpu:
      return "cpu";
    case Nproc::Kind::gpu:
      return "gpu";
    default:
      return std::to_string(n.count);
  }
}

namespace {

class Parser {
 public:
  explicit Parser(std::string file) : file_(std::move(file)) {}

  void error(const YAML::Mark& m, std::string msg) {
    diags_.push_back({file_, m.line >= 0 ? m.line + 1 : 0, m.column >= 0 ? m.column + 1 : 0, std::move(msg)});
  }
  // A key with no value has no place of its own (yaml-cpp marks the token after it, often the
  // next line's key): the error goes to the key it belongs to.
  void error(const YAML::Node& n, std::string msg) {
    error(n.IsNull() && key_mark_ ? *key_mark_ : n.Mark(), std::move(msg));
  }

  static std::string describe(const YAML::Node& n) {
    switch (n.Type()) {
      case YAML::NodeType::Map:
        return "a mapping";
      case YAML::NodeType::Sequence:
        return n.size() == 0 ? "an empty list" : "a list";
      case YAML::NodeType::Null:
        return "nothing";
      case YAML::NodeType::Scalar:
        return fmt::format("'{}'", n.Scalar());
      default:
        return "an undefined value";
    }
  }

  std::optional<std::string> string(const YAML::Node& n, std::string_view key) {
    if (!n.IsScalar()) {
      error(n, fmt::format("{}: expected a string, got {}", key, describe(n)));
      return std::nullopt;
    }
    return n.Scalar();
  }

  std::optional<long long> integer(const YAML::Node& n, std::string_view key, long long lo, long long hi) {
    std::optional<long long> v;
    if (n.IsScalar()) v = parse_int(n.Scalar());
    if (!v || *v < lo || *v > hi) {
      error(n, fmt::format("{}: expected an integer from {} to {}, got {}", key, lo, hi, describe(n)));
      return std::nullopt;
    }
    return v;
  }

  std::optional<Millis> duration(const YAML::Node& n, std::string_view key) {
    std::optional<Millis> d;
    if (n.IsScalar()) d = parse_duration(n.Scalar());
    if (!d) {
      error(n, fmt::format("{}: expected a duration such as 30s, 10m, 1h, 1.5s or 500ms, got {}", key, describe(n)));
    }
    return d;
  }

  std::optional<std::uint64_t> size(const YAML::Node& n, std::string_view key) {
    if (n.IsScalar()) {
      if (auto v = parse_size(n.Scalar())) return v;
    }
    error(n, fmt::format("{}: expected a size such as 100MiB or 1GiB, got {}", key, describe(n)));
    return std::nullopt;
  }

  // Iterates a mapping, checking keys against `known` (with a hint for typos) and duplicates.
  template <typename F>
  void mapping(const YAML::Node& n, std::string_view where, const std::vector<std::string>& known, F&& on_key) {
    if (!n.IsMap()) {
      // The whole file has no name of its own: "the job file", not ": expected ...".
      error(n, fmt::format("{}: expected a mapping with keys {}, got {}", where.empty() ? "the job file" : where,
                           join(known, ", "), describe(n)));
      return;
    }
    std::set<std::string> seen;
    for (auto it = n.begin(); it != n.end(); ++it) {
      // yaml-cpp's iterator yields a temporary pair: copy the nodes (cheap handles), never bind references.
      const YAML::Node k = it->first;
      if (!k.IsScalar()) {
        error(k, fmt::format("{}: keys must be plain names", where));
        continue;
      }
      const std::string key = k.Scalar();
      const std::string path = where.empty() ? key : fmt::format("{}.{}", where, key);
      if (!seen.insert(key).second) {
        error(k, fmt::format("duplicate key '{}'", path));
        continue;
      }
      if (std::find(known.begin(), known.end(), key) == known.end()) {
        auto hint = nearest(key, known);
        error(k, fmt::format("unknown key '{}'{}; expected one of: {}", path,
                             hint ? fmt::format(" (did you mean '{}'?)", *hint) : "", join(known, ", ")));
        continue;
      }
      const auto outer = std::exchange(key_mark_, k.Mark());
      on_key(key, k, YAML::Node(it->second));
      key_mark_ = outer;
    }
  }

  JobSpec parse(const std::string& text) {
    std::vector<YAML::Node> docs;
    try {
      docs = YAML::LoadAll(text);
    } catch (const YAML::ParserException& e) {
      // An unclosed `[`/`{` is said where it was opened, with where yaml-cpp gave up.
      const bool seq = e.msg == YAML::ErrorMsg::END_OF_SEQ_FLOW, map = e.msg == YAML::ErrorMsg::END_OF_MAP_FLOW;
      const auto opened = seq || map
                              ? unclosed_flow(text, static_cast<std::size_t>(std::max(e.mark.pos, 0)), seq ? '[' : '{')
                              : std::nullopt;
      if (opened) {
        error(*opened, fmt::format("not valid YAML: this '{}' is never closed with '{}' (the parser gave up at line "
                                   "{}, column {})",
                                   seq ? '[' : '{', seq ? ']' : '}', e.mark.line + 1, e.mark.column + 1));
      } else {
        error(e.mark, fmt::format("not valid YAML: {}", e.msg));
      }
      throw JobSpecError(diags_);
    }
    // One job per file: what follows a `---` was silently dropped.
    for (std::size_t i = 1; i < docs.size(); ++i) {
      if (docs[i].IsNull()) continue;  // a bare `---` at the end
      error(docs[i].Mark(), "a second YAML document (after '---'): a job file holds one job");
      throw JobSpecError(diags_);
    }
    return parse_root(docs.empty() ? YAML::Node() : docs[0]);
  }

  // A document already built (the command line's flags, jobspec/flags.cpp): the same rules.
  JobSpec parse_root(const YAML::Node& root) {
    JobSpec spec;
    spec.file = file_;
    if (!root.IsDefined() || root.IsNull()) {
      diags_.push_back({file_, 0, 0, "the job file is empty; it needs at least a 'command'"});
      throw JobSpecError(diags_);
    }
    bool have_command = false;
    mapping(root, "", kTopKeys, [&](const std::string& key, const YAML::Node& k, const YAML::Node& v) {
      if (auto ny = kNotYet.find(key); ny != kNotYet.end()) {
        error(k, fmt::format("'{}' is not supported yet: {}", key, ny->second));
        return;
      }
      if (key == "name") {
        if (auto s = string(v, key)) {
          static const std::regex re("^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$");
          if (!std::regex_match(*s, re)) {
            error(v, fmt::format("name: expected 1-64 characters of letters, digits, '.', '_' or '-' "
                                 "(it names log folders), got '{}'",
                                 *s));
          } else {
            spec.name = *s;
          }
        }
      } else if (key == "nnodes") {
        parse_nnodes(v, spec);
      } else if (key == "hosts") {
        parse_hosts(v, spec);
      } else if (key == "rendezvous") {
        mapping(v, "rendezvous", {"join_timeout", "last_call", "heartbeat_timeout"},
                [&](const std::string& rk, const YAML::Node&, const YAML::Node& rv) {
                  auto d = duration(rv, "rendezvous." + rk);
                  if (!d) return;
                  // Heartbeats come every second at the most (a third of this timeout since
                  // protocol version 7, proto/heartbeat.hpp): a timeout of one interval loses
                  // nodes to ordinary jitter; two is the least that tolerates one late beat.
                  if (rk == "heartbeat_timeout" && *d < Millis(2000)) {
                    error(rv,
                          "rendezvous.heartbeat_timeout: expected at least 2s (agents beat every second at the most; "
                          "one late heartbeat must not lose a node)");
                    return;
                  }
                  (rk == "join_timeout" ? spec.join_timeout
                   : rk == "last_call"  ? spec.last_call
                                        : spec.heartbeat_timeout) = *d;
                });
      } else if (key == "nproc_per_node") {
        if (v.IsScalar() && (v.Scalar() == "cpu" || v.Scalar() == "gpu")) {
          spec.nproc = *parse_nproc(v.Scalar());
        } else if (v.IsScalar() && parse_int(v.Scalar())) {
          if (auto n = integer(v, key, 1, 4096)) spec.nproc = {Nproc::Kind::count, static_cast<int>(*n)};
        } else {
          error(v, fmt::format("nproc_per_node: expected an integer, 'cpu' or 'gpu', got {}", describe(v)));
        }
      } else if (key == "command") {
        have_command = true;
        parse_command(v, spec);
      } else if (key == "python") {
        parse_python(v, spec);
      } else if (key == "workdir") {
        if (auto s = string(v, key)) {
          if (s->empty())
            error(v, "workdir: expected a directory, got an empty string");
          else
            spec.workdir = *s;
        }
      } else if (key == "env") {
        parse_env(v, spec);
      } else if (key == "env_forward") {
        parse_env_forward(v, spec);
      } else if (key == "restart") {
        mapping(v, "restart", {"max_restarts", "backoff"},
                [&](const std::string& rk, const YAML::Node&, const YAML::Node& rv) {
                  if (rk == "max_restarts") {
                    if (auto n = integer(rv, "restart.max_restarts", 0, 1000)) spec.max_restarts = static_cast<int>(*n);
                  } else if (auto d = duration(rv, "restart.backoff")) {
                    spec.restart_backoff = *d;
                  }
                });
      } else if (key == "logs") {
        mapping(v, "logs", {"dir", "max_size"}, [&](const std::string& lk, const YAML::Node&, const YAML::Node& lv) {
          if (lk == "dir") {
            if (auto s = string(lv, "logs.dir")) {
              if (s->empty())
                error(lv, "logs.dir: expected a directory, got an empty string");
              else
                spec.log_dir = *s;
            }
          } else if (auto sz = size(lv, "logs.max_size")) {
            if (*sz < 4096)
              error(lv, "logs.max_size: expected at least 4KiB");
            else
              spec.log_max_bytes = *sz;
          }
        });
      } else if (key == "store") {
        mapping(v, "store", {"port", "threads", "max_size", "max_keys", "protocol"},
                [&](const std::string& sk, const YAML::Node&, const YAML::Node& sv) {
                  if (sk == "port") {
                    if (auto n = integer(sv, "store.port (0 picks a free port)", 0, 65535)) {
                      spec.store_port = static_cast<std::uint16_t>(*n);
                      spec.store_port_explicit = *n != 0;
                    }
                  } else if (sk == "max_size") {
                    if (auto sz = size(sv, "store.max_size")) {
                      if (*sz < (1ull << 20))
                        error(sv, "store.max_size: expected at least 1MiB");
                      else
                        spec.store_max_bytes = *sz;
                    }
                  } else if (sk == "protocol") {
                    if (auto p = store_protocol(sv))
                      spec.store_protocol = *p;
                    else
                      error(sv,
                            "store.protocol: expected auto or the job's PyTorch release from 1.13 on, such as "
                            "\"1.13\", \"2.1\" or \"2.11\"");
                  } else if (sk == "max_keys") {
                    if (auto n = integer(sv, "store.max_keys", 1024, 1ll << 32))
                      spec.store_max_keys = static_cast<std::uint64_t>(*n);
                  } else if (sv.IsScalar() && sv.Scalar() == "auto") {
                    spec.store_threads = kAutoThreads;
                  } else if (auto n = integer(sv, "store.threads (or auto)", 0, kMaxStoreThreads)) {
                    spec.store_threads = static_cast<int>(*n);
                  }
                });
      } else if (key == "stop") {
        mapping(v, "stop", {"grace"}, [&](const std::string&, const YAML::Node&, const YAML::Node& sv) {
          if (auto d = duration(sv, "stop.grace")) spec.stop_grace = *d;
        });
      } else if (key == "hang") {
        parse_hang(v, spec);
      } else if (key == "binding") {
        parse_binding(v, spec);
      } else if (key == "container") {
        parse_container(k, v, spec);
      } else if (key == "nccl") {
        mapping(v, "nccl", {"unique_id"}, [&](const std::string&, const YAML::Node&, const YAML::Node& nv) {
          if (nv.IsScalar() && (nv.Scalar() == "auto" || nv.Scalar() == "on" || nv.Scalar() == "off")) {
            spec.nccl_unique_id = nv.Scalar() == "auto" ? NcclUniqueId::automatic
                                  : nv.Scalar() == "on" ? NcclUniqueId::on
                                                        : NcclUniqueId::off;
          } else {
            error(nv, fmt::format("nccl.unique_id: expected auto, on or off, got {}", describe(nv)));
          }
        });
      }
    });
    // The id holder runs on the host with the host's libnccl; a container's NCCL may differ, and
    // an id from another NCCL version is worse than none (see README, containers).
    if (spec.container && spec.nccl_unique_id == NcclUniqueId::on) {
      const YAML::Node& croot = root;
      error(croot["nccl"]["unique_id"],
            "nccl.unique_id: on cannot be honoured with container: the id holder would use the host's "
            "libnccl, not the image's; use auto or off (PyTorch's NCCL process group needs no id from ddpctl)");
    }
    // The watchdog reads each rank's own process (and its descendants); a container rank's is the
    // runtime's client, whose Python lives elsewhere (podman's conmon, docker's daemon).
    if (spec.container && spec.hang) {
      const YAML::Node& croot = root;
      error(croot["hang"],
            "hang: not supported yet with container: the watchdog reads the rank's own process, which is "
            "the container runtime's client; remove one of the two");
    }
    if (root.IsMap() && !have_command) {
      diags_.push_back(
          {file_, 1, 1, "missing key 'command': expected the worker's argv, e.g. command: [python3, train.py]"});
    }
    if (!diags_.empty()) throw JobSpecError(diags_);
    return spec;
  }

 private:
  void parse_nnodes(const YAML::Node& v, JobSpec& spec) {
    if (!v.IsScalar()) {
      error(v, fmt::format("nnodes: expected an integer or MIN:MAX, got {}", describe(v)));
      return;
    }
    auto parts = split(v.Scalar(), ':');
    std::optional<long long> lo = parse_int(parts[0]), hi = parts.size() == 2 ? parse_int(parts[1]) : lo;
    if (parts.size() > 2 || !lo || !hi || *lo < 1 || *hi < *lo || *hi > 65536) {
      error(v, fmt::format("nnodes: expected an integer N >= 1 or MIN:MAX with 1 <= MIN <= MAX, got {}", describe(v)));
      return;
    }
    spec.nnodes_min = static_cast<int>(*lo);
    spec.nnodes_max = static_cast<int>(*hi);
  }

  // hosts: a list of names (host or host:port), or one SLURM-style string; the launcher expands
  // and checks it (lib/hostlist), so the file and --nodes give the same errors.
  // hang: {timeout: 10m, action: report|stop|restart}; timeout is required (no silent default
  // for how long a job may stand still), action defaults to report (the least harm).
  void parse_hang(const YAML::Node& v, JobSpec& spec) {
    HangSpec h;
    bool have_timeout = false, ok = true;
    mapping(v, "hang", {"timeout", "action"}, [&](const std::string& hk, const YAML::Node&, const YAML::Node& hv) {
      if (hk == "timeout") {
        have_timeout = true;
        auto d = duration(hv, "hang.timeout");
        if (!d) {
          ok = false;
        } else if (*d < kMinHangTimeout) {
          error(hv, fmt::format("hang.timeout: expected at least {} (ranks are sampled once a second), got {}",
                                format_duration(kMinHangTimeout), describe(hv)));
          ok = false;
        } else {
          h.timeout = *d;
        }
      } else if (auto a = hv.IsScalar() ? hang_action_from_name(hv.Scalar()) : std::nullopt) {
        h.action = *a;
      } else {
        error(hv, fmt::format("hang.action: expected report, stop or restart, got {}", describe(hv)));
        ok = false;
      }
    });
    if (v.IsMap() && !have_timeout) {
      error(v,
            "hang: missing key 'timeout': how long no rank may make progress, e.g. hang: {timeout: 10m, action: stop}");
      ok = false;
    }
    if (v.IsMap() && ok) spec.hang = h;
  }

  // binding: {gpu: auto|none|isolate, numa: auto|none|node|exclusive, nic: auto|none|rank}
  void parse_binding(const YAML::Node& v, JobSpec& spec) {
    mapping(v, "binding", {"gpu", "numa", "nic"}, [&](const std::string& bk, const YAML::Node&, const YAML::Node& bv) {
      const std::vector<std::string> allowed = bk == "gpu" ? std::vector<std::string>{"auto", "none", "isolate"}
                                               : bk == "numa"
                                                   ? std::vector<std::string>{"auto", "none", "node", "exclusive"}
                                                   : std::vector<std::string>{"auto", "none", "rank"};
      const std::string value = bv.IsScalar() ? bv.Scalar() : std::string();
      auto it = std::find(allowed.begin(), allowed.end(), value);
      if (!bv.IsScalar() || it == allowed.end()) {
        error(bv, fmt::format("binding.{}: expected {}, got {}", bk, join(allowed, ", "), describe(bv)));
        return;
      }
      const auto pos = it - allowed.begin();
      if (bk == "gpu")
        spec.binding.gpu = static_cast<GpuBinding>(pos);
      else if (bk == "numa")
        spec.binding.numa = static_cast<NumaBinding>(pos);
      else
        spec.binding.nic = static_cast<NicBinding>(pos);
    });
  }

  void parse_hosts(const YAML::Node& v, JobSpec& spec) {
    if (v.IsScalar() && !trim(v.Scalar()).empty()) {
      spec.hosts = {v.Scalar()};
      return;
    }
    if (!v.IsSequence() || v.size() == 0) {
      error(v, fmt::format("hosts: expected a list of node names such as [node1, node2] or a host list "
                           "such as 'node[1-4]', got {}",
                           describe(v)));
      return;
    }
    for (const auto& item : v) {
      if (!item.IsScalar() || trim(item.Scalar()).empty()) {
        error(item, fmt::format("hosts: every item must be a node name, got {}", describe(item)));
        return;
      }
      spec.hosts.push_back(item.Scalar());
    }
  }

  void parse_command(const YAML::Node& v, JobSpec& spec) {
    if (v.IsScalar()) {
      if (trim(v.Scalar()).empty()) {
        error(v,
              "command: expected a list such as [python3, train.py] (or a shell command string), got an empty string");
        return;
      }
      spec.shell = true;
      spec.command = {v.Scalar()};
      return;
    }
    if (!v.IsSequence() || v.size() == 0) {
      error(v, fmt::format("command: expected a non-empty list such as [python3, train.py], got {}", describe(v)));
      return;
    }
    for (const auto& item : v) {
      if (!item.IsScalar()) {
        error(item, fmt::format("command: every item must be a string, got {}", describe(item)));
        return;
      }
      spec.command.push_back(item.Scalar());
    }
    if (spec.command[0].empty()) error(v[0], "command: the program (first item) is empty");
  }

  // python: a program, or a non-empty list of strings (a command that acts as the interpreter).
  void parse_python(const YAML::Node& v, JobSpec& spec) {
    constexpr const char* kExpected =
        "a program such as python3 or /venv/bin/python, or a list such as [uv, run, python]";
    if (v.IsScalar()) {
      if (trim(v.Scalar()).empty())
        error(v, fmt::format("python: expected {}, got an empty string", kExpected));
      else
        spec.python = {v.Scalar()};
      return;
    }
    if (!v.IsSequence() || v.size() == 0) {
      error(v, fmt::format("python: expected {}, got {}", kExpected, describe(v)));
      return;
    }
    std::vector<std::string> argv;
    for (const auto& item : v) {
      if (!item.IsScalar() || item.Scalar().empty()) {
        error(item, fmt::format("python: every item must be a non-empty string, got {}", describe(item)));
        return;
      }
      argv.push_back(item.Scalar());
    }
    spec.python = std::move(argv);
  }

  // container: {runtime, image, mounts, workdir, pull, extra_args, env}; runtime and image required.
  void parse_container(const YAML::Node& key, const YAML::Node& v, JobSpec& spec) {
    ContainerSpec c;
    bool have_runtime = false, have_image = false;
    const std::size_t before = diags_.size();
    mapping(v, "container", {"runtime", "image", "mounts", "workdir", "pull", "extra_args", "env"},
            [&](const std::string& ck, const YAML::Node&, const YAML::Node& cv) {
              if (ck == "runtime" || ck == "pull") {
                const std::vector<std::string> allowed =
                    ck == "runtime" ? std::vector<std::string>{"docker", "podman", "apptainer", "enroot"}
                                    : std::vector<std::string>{"never", "missing", "always"};
                const std::string value = cv.IsScalar() ? cv.Scalar() : std::string();
                auto it = std::find(allowed.begin(), allowed.end(), value);
                if (!cv.IsScalar() || it == allowed.end()) {
                  auto hint = cv.IsScalar() ? nearest(value, allowed) : std::nullopt;
                  error(cv, fmt::format("container.{}: expected {}, got {}{}", ck, join(allowed, ", "), describe(cv),
                                        hint ? fmt::format(" (did you mean '{}'?)", *hint) : ""));
                  return;
                }
                const auto pos = static_cast<int>(it - allowed.begin());
                if (ck == "runtime")
                  have_runtime = true, c.runtime = static_cast<ContainerRuntime>(pos);
                else
                  c.pull = static_cast<PullPolicy>(pos);
              } else if (ck == "image") {
                if (auto s = string(cv, "container.image")) {
                  if (trim(*s).empty())
                    error(
                        cv,
                        "container.image: expected an image reference such as pytorch-cuda:v2.6, got an empty string");
                  else if ((*s)[0] == '-')
                    error(cv, fmt::format("container.image: expected an image reference, got '{}', which a runtime "
                                          "would read as an option",
                                          *s));
                  else
                    have_image = true, c.image = *s;
                }
              } else if (ck == "workdir") {
                if (auto s = string(cv, "container.workdir")) {
                  if (s->empty() || (*s)[0] != '/')
                    error(cv, fmt::format("container.workdir: expected an absolute path inside the container, got {}",
                                          describe(cv)));
                  else
                    c.workdir = *s;
                }
              } else if (ck == "mounts") {
                parse_mounts(cv, c);
              } else if (ck == "extra_args") {
                if (!cv.IsSequence()) {
                  error(cv, fmt::format("container.extra_args: expected a list of arguments, got {}", describe(cv)));
                  return;
                }
                for (const auto& item : cv) {
                  if (auto s = string(item, "container.extra_args item")) c.extra_args.push_back(*s);
                }
              } else {
                parse_env_map(cv, "container.env", c.env);
              }
            });
    if (diags_.size() != before || !v.IsMap()) return;
    if (!have_runtime) error(key, "container: missing key 'runtime': expected docker, podman, apptainer or enroot");
    if (!have_image)
      error(key, "container: missing key 'image': expected the image to run, e.g. image: pytorch-cuda:v2.6");
    if (have_runtime && have_image) spec.container = std::move(c);
  }

  // "SOURCE:TARGET" or "SOURCE:TARGET:ro|rw"; TARGET absolute.
  void parse_mounts(const YAML::Node& v, ContainerSpec& c) {
    if (!v.IsSequence()) {
      error(v, fmt::format("container.mounts: expected a list such as [\"./:/workspace\", \"/data:/data:ro\"], got {}",
                           describe(v)));
      return;
    }
    for (const auto& item : v) {
      if (!item.IsScalar()) {
        error(item, fmt::format("container.mounts: every item must be SOURCE:TARGET[:ro|rw], got {}", describe(item)));
        continue;
      }
      auto parts = split(item.Scalar(), ':');
      const bool mode_ok = parts.size() == 2 || (parts.size() == 3 && (parts[2] == "ro" || parts[2] == "rw"));
      if (!mode_ok || parts[0].empty() || parts[1].empty() || parts[1][0] != '/') {
        error(item, fmt::format("container.mounts: expected SOURCE:TARGET[:ro|rw] with an absolute TARGET, got {}",
                                describe(item)));
        continue;
      }
      c.mounts.push_back({std::string(parts[0]), std::string(parts[1]), parts.size() == 3 && parts[2] == "ro"});
    }
  }

  void parse_env(const YAML::Node& v, JobSpec& spec) { parse_env_map(v, "env", spec.env); }

  void parse_env_map(const YAML::Node& v, const std::string& where,
                     std::vector<std::pair<std::string, std::string>>& out) {
    if (!v.IsMap()) {
      error(v, fmt::format("{}: expected a mapping of NAME: value, got {}", where, describe(v)));
      return;
    }
    static const std::regex name_re("^[A-Za-z_][A-Za-z0-9_]*$");
    std::set<std::string> seen;
    for (auto it = v.begin(); it != v.end(); ++it) {
      const YAML::Node k = it->first;
      const YAML::Node val = it->second;
      if (!k.IsScalar() || !std::regex_match(k.Scalar(), name_re)) {
        error(k, fmt::format("{}: expected a variable name (letters, digits, '_'), got {}", where, describe(k)));
        continue;
      }
      if (!seen.insert(k.Scalar()).second) {
        error(k, fmt::format("duplicate key '{}.{}'", where, k.Scalar()));
        continue;
      }
      if (kReservedEnv.contains(k.Scalar())) {
        error(k, fmt::format("{}.{}: set by ddpctl for every worker (see the environment contract); "
                             "remove it from {}",
                             where, k.Scalar(), where));
        continue;
      }
      if (!val.IsScalar()) {
        error(val.IsNull() ? k.Mark() : val.Mark(),
              fmt::format("{}.{}: expected a string value, got {}", where, k.Scalar(), describe(val)));
        continue;
      }
      out.emplace_back(k.Scalar(), val.Scalar());
    }
  }

  void parse_env_forward(const YAML::Node& v, JobSpec& spec) {
    if (!v.IsSequence()) {
      error(v, fmt::format("env_forward: expected a list of variable names or NAME_* patterns, got {}", describe(v)));
      return;
    }
    static const std::regex re(R"(^[A-Za-z_][A-Za-z0-9_]*\*?$)");
    spec.env_forward.clear();
    for (const auto& item : v) {
      if (!item.IsScalar() || !std::regex_match(item.Scalar(), re)) {
        error(item, fmt::format("env_forward: expected a variable name or a NAME_* pattern, got {}", describe(item)));
        continue;
      }
      spec.env_forward.push_back(item.Scalar());
    }
  }

  std::string file_;
  std::vector<Diagnostic> diags_;
  std::optional<YAML::Mark> key_mark_;  // the key whose value is being read (mapping())
};

}  // namespace

const std::vector<std::string>& known_top_level_keys() {
  return kTopKeys;
}

std::optional<ContainerRuntime> runtime_from_name(std::string_view name) {
  for (auto r :
       {ContainerRuntime::docker, ContainerRuntime::podman, ContainerRuntime::apptainer, ContainerRuntime::enroot}) {
    if (runtime_name(r) == name) return r;
  }
  return std::nullopt;
}

std::string_view runtime_name(ContainerRuntime r) {
  switch (r) {
    case ContainerRuntime::docker:
      return "docker";
    case ContainerRuntime::podman:
      return "podman";
    case ContainerRuntime::apptainer:
      return "apptainer";
    case ContainerRuntime::enroot:
      return "enroot";
  }
  return "?";
}

JobSpec parse_job_yaml(const std::string& text, const std::string& file) {
  return Parser(file).parse(text);
}

JobSpec parse_job_node(const YAML::Node& root, const std::string& where) {
  return Parser(where).parse_root(root);
}

JobSpec load_job_file(const std::string& path) {
  constexpr std::size_t kMaxJobFile = 4u << 20;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw JobSpecError({{path, 0, 0, fmt::format("cannot read the job file: {}", std::strerror(errno))}});
  }
  if (!S_ISREG(st.st_mode)) throw JobSpecError({{path, 0, 0, "the job file is not a regular file"}});
  if (static_cast<std::size_t>(st.st_size) > kMaxJobFile)
    throw JobSpecError({{path, 0, 0, "the job file is larger than 4 MiB"}});
  std::ifstream in(path);
  if (!in) {
    throw JobSpecError({{path, 0, 0, fmt::format("cannot read the job file: {}", std::strerror(errno))}});
  }
  // Sized from stat, plus one byte to notice a file that grew while it was read.
  std::string text(static_cast<std::size_t>(st.st_size) + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > static_cast<std::size_t>(st.st_size)) {
    throw JobSpecError({{path, 0, 0, "the job file changed while it was read"}});
  }
  return parse_job_yaml(text, path);
}

std::string_view hang_action_name(HangAction a) {
  switch (a) {
    case HangAction::report:
      return "report";
    case HangAction::stop:
      return "stop";
    case HangAction::restart:
      return "restart";
  }
  return "report";
}

std::optional<HangAction> hang_action_from_name(std::string_view name) {
  if (name == "report") return HangAction::report;
  if (name == "stop") return HangAction::stop;
  if (name == "restart") return HangAction::restart;
  return std::nullopt;
}

bool valid_job_id(std::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); };
  if (!alnum(id.front())) return false;
  return std::all_of(id.begin(), id.end(), [&](char c) { return alnum(c) || c == '_' || c == '.' || c == '-'; });
}

}  // namespace ddp::jobspec

// The node-facts model: JSON shape, strict-but-forgiving reader, cpulist and bus id helpers.
#include "facts/model.hpp"

#include "common/strings.hpp"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <set>
#include <sstream>

namespace ddp::facts {

using nlohmann::json;

std::string_view to_string(NicKind k) {
  return k == NicKind::ib ? "ib" : "eth";
}

// ---------------------------------------------------------------- cpulist / bus id

std::optional<std::vector<int>> parse_cpulist(std::string_view s) {
  s = trim(s);
  std::vector<int> out;
  if (s.empty()) return out;  // the kernel writes an empty line for a memory-only node
  for (auto part : split(s, ',')) {
    part = trim(part);
    auto dash = part.find('-');
    auto lo = parse_int(part.substr(0, dash));
    auto hi = dash == std::string_view::npos ? lo : parse_int(part.substr(dash + 1));
    if (!lo || !hi || *lo < 0 || *hi < *lo || *hi > kMaxCpuId) return std::nullopt;
    for (long long c = *lo; c <= *hi; ++c) out.push_back(static_cast<int>(c));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string format_cpulist(const std::vector<int>& cpus_in) {
  std::vector<int> cpus = cpus_in;
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

namespace {

bool all_hex(std::string_view s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

std::optional<std::string> normalize_pci_bus_id(std::string_view s) {
  s = trim(s);
  auto parts = split(s, ':');
  std::string_view domain = "0000", bus, devfn;
  if (parts.size() == 3) {
    domain = parts[0];
    bus = parts[1];
    devfn = parts[2];
  } else if (parts.size() == 2) {
    bus = parts[0];
    devfn = parts[1];
  } else {
    return std::nullopt;
  }
  auto dot = devfn.find('.');
  if (dot == std::string_view::npos) return std::nullopt;
  auto dev = devfn.substr(0, dot), fn = devfn.substr(dot + 1);
  // NVML pads the domain to 8 digits; PCI domains are 16 bits (some VMD/Hyper-V hosts use 5 hex
  // digits in sysfs, so keep any significant digits beyond 4).
  while (domain.size() > 4 && domain.front() == '0') domain.remove_prefix(1);
  if (!all_hex(domain) || domain.size() > 8 || !all_hex(bus) || bus.size() > 2 || !all_hex(dev) || dev.size() > 2 ||
      fn.size() != 1 || !std::isdigit(static_cast<unsigned char>(fn[0])) || fn[0] > '7')
    return std::nullopt;
  auto pad = [](std::string_view v, std::size_t n) {
    return std::string(n > v.size() ? n - v.size() : 0, '0') + lower(v);
  };
  return pad(domain, 4) + ":" + pad(bus, 2) + ":" + pad(dev, 2) + "." + std::string(fn);
}

// ---------------------------------------------------------------- to_json

namespace {

template <class T>
void put(json& j, const char* key, const std::optional<T>& v) {
  if (v) j[key] = *v;
}

json limit_value(const std::optional<std::uint64_t>& v) {
  return v ? json(*v) : json("unlimited");
}

}  // namespace

json to_json(const PythonFacts& py) {
  json o{{"interpreter", py.interpreter}, {"source", py.source}};
  put(o, "executable", py.executable);
  put(o, "version", py.version);
  put(o, "torch", py.torch);
  put(o, "error", py.error);
  if (py.guessed) o["guessed"] = true;
  return o;
}

void set_python(NodeFacts& node, PythonFacts python) {
  node.versions.torch = python.torch;
  node.python = std::move(python);
}

TorchShown torch_shown(const NodeFacts& n) {
  if (n.python) return {n.python->error ? "-" : n.python->torch.value_or("none"), false};
  return {n.versions.torch.value_or("-"), n.versions.torch.has_value()};
}

json to_json(const NodeFacts& f) {
  json j;
  j["facts_version"] = kFactsVersion;
  j["hostname"] = f.hostname;
  j["numa_nodes"] = json::array();
  for (const auto& n : f.numa_nodes) j["numa_nodes"].push_back({{"id", n.id}, {"cpus", n.cpus}});
  j["gpus"] = json::array();
  for (const auto& g : f.gpus) {
    json o{{"index", g.index}, {"pci_bus_id", g.pci_bus_id}, {"numa_node", g.numa_node}};
    put(o, "uuid", g.uuid);
    put(o, "name", g.name);
    put(o, "pci_id", g.pci_id);
    put(o, "memory_mib", g.memory_mib);
    put(o, "local_cpus", g.local_cpus);
    put(o, "sysfs_path", g.sysfs_path);
    j["gpus"].push_back(std::move(o));
  }
  j["nics"] = json::array();
  for (const auto& n : f.nics) {
    json o{{"name", n.name},
           {"kind", std::string(to_string(n.kind))},
           {"numa_node", n.numa_node},
           {"addresses", n.addresses}};
    put(o, "port", n.port);
    put(o, "link_layer", n.link_layer);
    put(o, "netdev", n.netdev);
    put(o, "pci_bus_id", n.pci_bus_id);
    put(o, "speed_mbps", n.speed_mbps);
    put(o, "state", n.state);
    put(o, "local_cpus", n.local_cpus);
    put(o, "sysfs_path", n.sysfs_path);
    j["nics"].push_back(std::move(o));
  }
  json v = json::object();
  put(v, "driver", f.versions.driver);
  put(v, "cuda_driver", f.versions.cuda_driver);
  put(v, "nccl", f.versions.nccl);
  put(v, "nccl_library", f.versions.nccl_library);
  put(v, "torch", f.versions.torch);
  put(v, "kernel", f.versions.kernel);
  j["versions"] = std::move(v);
  json l = json::object();
  if (f.limits.memlock)
    l["memlock"] = {{"soft", limit_value(f.limits.memlock->soft)}, {"hard", limit_value(f.limits.memlock->hard)}};
  if (f.limits.nofile)
    l["nofile"] = {{"soft", limit_value(f.limits.nofile->soft)}, {"hard", limit_value(f.limits.nofile->hard)}};
  put(l, "shm_bytes", f.limits.shm_bytes);
  j["limits"] = std::move(l);
  if (f.container_runtimes) j["container_runtimes"] = *f.container_runtimes;
  if (const auto& ci = f.container_image) {
    json o{{"runtime", ci->runtime}, {"image", ci->image}};
    put(o, "digest", ci->digest);
    put(o, "repo_digest", ci->repo_digest);
    put(o, "error", ci->error);
    j["container_image"] = std::move(o);
  }
  if (f.python) j["python"] = to_json(*f.python);
  if (!f.sources.empty()) j["sources"] = f.sources;
  return j;
}

// ---------------------------------------------------------------- from_json

namespace {

// Walks one JSON object, remembering where it is, so that every error says file and path.
class Reader {
 public:
  Reader(const json& j, std::string source, std::string path, std::vector<std::string>* notes)
      : j_(j), source_(std::move(source)), path_(std::move(path)), notes_(notes) {
    if (!j_.is_object()) fail("expected an object, got " + type_of(j_));
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw FactsError(source_ + ": " + (path_.empty() ? std::string() : path_ + ": ") + what);
  }

  // An error at a field of this object: "file: gpus[3].pci_bus_id: what".
  [[noreturn]] void fail_key(const std::string& key, const std::string& what) const { fail_path(at(key), what); }
  [[noreturn]] void fail_path(const std::string& path, const std::string& what) const {
    throw FactsError(source_ + ": " + path + ": " + what);
  }

  std::string at(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  const json* find(const std::string& key) {
    seen_.insert(key);
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  const json& need(const std::string& key) {
    auto* v = find(key);
    if (!v) fail("missing required field '" + key + "'");
    return *v;
  }

  std::optional<std::string> str(const std::string& key, bool required = false) {
    auto* v = required ? &need(key) : find(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) wrong(key, "a string", *v);
    return v->get<std::string>();
  }

  std::optional<bool> boolean(const std::string& key) {
    auto* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) wrong(key, "a boolean", *v);
    return v->get<bool>();
  }

  std::optional<long long> integer(const std::string& key, bool required = false) {
    auto* v = required ? &need(key) : find(key);
    if (!v) return std::nullopt;
    if (!v->is_number_integer()) wrong(key, "an integer", *v);
    return v->get<long long>();
  }

  std::optional<std::uint64_t> count(const std::string& key) {
    auto v = integer(key);
    if (v && *v < 0) fail_key(key, "expected a non-negative integer, got " + std::to_string(*v));
    return v ? std::optional<std::uint64_t>(static_cast<std::uint64_t>(*v)) : std::nullopt;
  }

  // An rlimit: {"soft": N|"unlimited", "hard": ...}, or a bare N|"unlimited" meaning both.
  std::optional<Limit> limit(const std::string& key) {
    auto* v = find(key);
    if (!v) return std::nullopt;
    auto one = [&](const json& x, const std::string& where) -> std::optional<std::uint64_t> {
      if (x.is_string() && x.get<std::string>() == "unlimited") return std::nullopt;
      if (x.is_number_unsigned()) return x.get<std::uint64_t>();
      if (x.is_number_integer() && x.get<long long>() >= 0) return static_cast<std::uint64_t>(x.get<long long>());
      fail_path(where, "expected a non-negative integer or \"unlimited\", got " + x.dump());
    };
    if (v->is_object()) {
      Reader r(*v, source_, at(key), notes_);
      Limit l;
      const json* s = r.find("soft");
      const json* h = r.find("hard");
      if (!s) r.fail("missing required field 'soft'");
      l.soft = one(*s, at(key) + ".soft");
      l.hard = h ? one(*h, at(key) + ".hard") : l.soft;
      r.finish();
      return l;
    }
    auto x = one(*v, at(key));
    return Limit{x, x};
  }

  const json& array(const std::string& key, bool required) {
    static const json empty = json::array();
    auto* v = required ? &need(key) : find(key);
    if (!v) return empty;
    if (!v->is_array()) wrong(key, "an array", *v);
    return *v;
  }

  // Unknown keys become notes: files may come from newer versions.
  void finish() {
    if (!notes_) return;
    for (auto it = j_.begin(); it != j_.end(); ++it) {
      if (!seen_.count(it.key())) notes_->push_back(source_ + ": unknown field '" + at(it.key()) + "' ignored");
    }
  }

  const std::string& source() const { return source_; }

 private:
  static std::string type_of(const json& v) { return v.type_name(); }
  [[noreturn]] void wrong(const std::string& key, const char* expected, const json& v) const {
    std::string shown = v.dump();
    if (shown.size() > 60) shown = shown.substr(0, 57) + "...";
    fail_key(key, std::string("expected ") + expected + ", got " + type_of(v) + " " + shown);
  }

  const json& j_;
  std::string source_, path_;
  std::vector<std::string>* notes_;
  std::set<std::string> seen_;
};

int numa_of(Reader& r, const std::string& key) {
  auto v = r.integer(key);
  if (!v) return 0;
  if (*v < -1 || *v > kMaxCpuId) r.fail_key(key, "NUMA node out of range: " + std::to_string(*v));
  return *v < 0 ? 0 : static_cast<int>(*v);  // -1: no NUMA information, i.e. node 0
}

std::optional<std::string> cpulist_of(Reader& r, const std::string& key, bool required) {
  auto s = r.str(key, required);
  if (s && !parse_cpulist(*s)) r.fail_key(key, "not a cpulist (like \"0-55,112-167\"): \"" + *s + "\"");
  return s;
}

std::string bus_id_of(Reader& r, const std::string& key, bool required, std::optional<std::string>* out = nullptr) {
  auto s = r.str(key, required);
  if (!s) return {};
  auto n = normalize_pci_bus_id(*s);
  if (!n) r.fail_key(key, "not a PCI bus id (like \"0000:18:00.0\"): \"" + *s + "\"");
  if (out) *out = *n;
  return *n;
}

std::vector<std::string> strings_of(Reader& r, const std::string& key) {
  std::vector<std::string> out;
  const auto& a = r.array(key, false);
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!a[i].is_string())
      r.fail_path(r.at(key) + "[" + std::to_string(i) + "]", "expected a string, got " + a[i].dump());
    out.push_back(a[i].get<std::string>());
  }
  return out;
}

}  // namespace

NodeFacts from_json(const json& j, std::string_view source_view, std::vector<std::string>* notes) {
  std::string source(source_view);
  Reader top(j, source, "", notes);
  NodeFacts f;
  if (auto v = top.integer("facts_version"); v && *v > kFactsVersion && notes)
    notes->push_back(source + ": written by a newer ddpctl (facts_version " + std::to_string(*v) +
                     "); fields it added are ignored");
  f.hostname = *top.str("hostname", true);
  if (f.hostname.empty()) top.fail_key("hostname", "must not be empty");

  const auto& numa = top.array("numa_nodes", true);
  for (std::size_t i = 0; i < numa.size(); ++i) {
    Reader r(numa[i], source, "numa_nodes[" + std::to_string(i) + "]", notes);
    NumaNode n;
    auto id = r.integer("id", true);
    if (*id < 0 || *id > kMaxCpuId) r.fail_key("id", "out of range: " + std::to_string(*id));
    n.id = static_cast<int>(*id);
    n.cpus = *cpulist_of(r, "cpus", true);
    r.finish();
    f.numa_nodes.push_back(std::move(n));
  }

  const auto& gpus = top.array("gpus", true);
  for (std::size_t i = 0; i < gpus.size(); ++i) {
    Reader r(gpus[i], source, "gpus[" + std::to_string(i) + "]", notes);
    Gpu g;
    auto idx = r.integer("index", true);
    if (*idx < 0 || *idx > 4096) r.fail_key("index", "out of range: " + std::to_string(*idx));
    g.index = static_cast<int>(*idx);
    g.uuid = r.str("uuid");
    g.name = r.str("name");
    g.pci_id = r.str("pci_id");
    g.pci_bus_id = bus_id_of(r, "pci_bus_id", true);
    g.memory_mib = r.count("memory_mib");
    g.numa_node = numa_of(r, "numa_node");
    g.local_cpus = cpulist_of(r, "local_cpus", false);
    g.sysfs_path = r.str("sysfs_path");
    r.finish();
    f.gpus.push_back(std::move(g));
  }

  const auto& nics = top.array("nics", true);
  for (std::size_t i = 0; i < nics.size(); ++i) {
    Reader r(nics[i], source, "nics[" + std::to_string(i) + "]", notes);
    Nic n;
    n.name = *r.str("name", true);
    auto kind = r.str("kind", true);
    if (*kind == "ib")
      n.kind = NicKind::ib;
    else if (*kind == "eth")
      n.kind = NicKind::eth;
    else
      r.fail_key("kind", "expected \"ib\" or \"eth\", got \"" + *kind + "\"");
    if (auto p = r.integer("port")) {
      if (*p < 1 || *p > 255) r.fail_key("port", "out of range: " + std::to_string(*p));
      n.port = static_cast<int>(*p);
    }
    n.link_layer = r.str("link_layer");
    n.netdev = r.str("netdev");
    bus_id_of(r, "pci_bus_id", false, &n.pci_bus_id);
    n.numa_node = numa_of(r, "numa_node");
    n.speed_mbps = r.count("speed_mbps");
    n.state = r.str("state");
    n.addresses = strings_of(r, "addresses");
    n.local_cpus = cpulist_of(r, "local_cpus", false);
    n.sysfs_path = r.str("sysfs_path");
    r.finish();
    f.nics.push_back(std::move(n));
  }

  if (auto* v = top.find("versions")) {
    Reader r(*v, source, "versions", notes);
    f.versions.driver = r.str("driver");
    f.versions.cuda_driver = r.str("cuda_driver");
    f.versions.nccl = r.str("nccl");
    f.versions.nccl_library = r.str("nccl_library");
    f.versions.torch = r.str("torch");
    f.versions.kernel = r.str("kernel");
    r.finish();
  }
  if (auto* v = top.find("limits")) {
    Reader r(*v, source, "limits", notes);
    f.limits.memlock = r.limit("memlock");
    f.limits.nofile = r.limit("nofile");
    f.limits.shm_bytes = r.count("shm_bytes");
    r.finish();
  }
  if (top.find("container_runtimes")) f.container_runtimes = strings_of(top, "container_runtimes");
  if (auto* v = top.find("container_image")) {
    Reader r(*v, source, "container_image", notes);
    ContainerImage ci;
    ci.runtime = *r.str("runtime", true);
    ci.image = *r.str("image", true);
    ci.digest = r.str("digest");
    ci.repo_digest = r.str("repo_digest");
    ci.error = r.str("error");
    r.finish();
    f.container_image = std::move(ci);
  }
  if (auto* v = top.find("python")) {
    Reader r(*v, source, "python", notes);
    PythonFacts py;
    py.interpreter = *r.str("interpreter", true);
    py.source = r.str("source").value_or("");
    py.executable = r.str("executable");
    py.version = r.str("version");
    py.torch = r.str("torch");
    py.error = r.str("error");
    py.guessed = r.boolean("guessed").value_or(py.source.starts_with(kGuessedSourcePrefix) ||
                                               py.source.starts_with(kNoJobSourcePrefix));
    r.finish();
    f.python = std::move(py);
  }
  f.sources = strings_of(top, "sources");
  top.finish();
  return f;
}

NodeFacts load_facts_file(const std::filesystem::path& path, std::vector<std::string>* notes) {
  // Facts of the largest machines are tens of KiB; 16 MiB bounds a wrong file (a core dump...).
  constexpr std::uintmax_t kMaxFactsFile = 16u << 20;
  std::error_code ec;
  auto size = std::filesystem::file_size(path, ec);
  if (ec) throw FactsError(path.string() + ": cannot read facts file: " + ec.message());
  if (size > kMaxFactsFile)
    throw FactsError(path.string() + ": facts file too large (" + std::to_string(size) + " bytes)");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw FactsError(path.string() + ": cannot open facts file");
  std::stringstream ss;
  ss << in.rdbuf();
  json j;
  try {
    j = json::parse(ss.str());
  } catch (const json::parse_error& e) {
    throw FactsError(path.string() + ": not valid JSON: " + e.what());
  }
  return from_json(j, path.string(), notes);
}

}  // namespace ddp::facts

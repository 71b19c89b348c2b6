#include "facts/report.hpp"

#include "common/strings.hpp"

#include <algorithm>
#include <cstdio>
#include <map>

namespace ddp::facts {

namespace {

// Columns padded to their widest cell; "-" for an absent value.
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void row(std::vector<std::string> r) { rows_.push_back(std::move(r)); }
  std::string str(const std::string& indent = "  ") const {
    std::vector<std::size_t> w;
    for (const auto& r : rows_)
      for (std::size_t i = 0; i < r.size(); ++i) {
        if (w.size() <= i) w.push_back(0);
        w[i] = std::max(w[i], r[i].size());
      }
    std::string out;
    for (const auto& r : rows_) {
      std::string line = indent;
      for (std::size_t i = 0; i < r.size(); ++i) {
        line += r[i];
        if (i + 1 < r.size()) line += std::string(w[i] - r[i].size() + 2, ' ');
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      out += line + "\n";
    }
    return out;
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

std::string opt(const std::optional<std::string>& v) {
  return v && !v->empty() ? *v : "-";
}

std::string speed(const std::optional<std::uint64_t>& mbps) {
  if (!mbps) return "-";
  if (*mbps >= 1000 && *mbps % 1000 == 0) return std::to_string(*mbps / 1000) + " Gb/s";
  return std::to_string(*mbps) + " Mb/s";
}

std::string limit(const std::optional<Limit>& l, bool as_bytes) {
  if (!l) return "-";
  auto one = [&](const std::optional<std::uint64_t>& v) {
    return v ? (as_bytes ? format_bytes(*v) : std::to_string(*v)) : std::string("unlimited");
  };
  if (l->soft == l->hard) return one(l->soft);
  return one(l->soft) + " (hard " + one(l->hard) + ")";
}

std::string gpu_summary(const NodeFacts& n) {
  if (n.gpus.empty()) return "none";
  std::map<std::string, int> by_model;
  for (const auto& g : n.gpus) ++by_model[g.name.value_or(g.pci_id.value_or("GPU"))];
  std::vector<std::string> parts;
  for (const auto& [m, c] : by_model) parts.push_back(std::to_string(c) + "x " + m);
  return join(parts, " + ");
}

std::string nic_summary(const NodeFacts& n) {
  int ib = 0, ib_up = 0, eth = 0, eth_up = 0;
  for (const auto& x : n.nics) {
    bool up = x.state && (*x.state == "active" || *x.state == "up");
    if (x.kind == NicKind::ib)
      ++ib, ib_up += up;
    else
      ++eth, eth_up += up;
  }
  std::vector<std::string> parts;
  if (ib) parts.push_back(std::to_string(ib) + " ib (" + std::to_string(ib_up) + " active)");
  if (eth) parts.push_back(std::to_string(eth) + " eth (" + std::to_string(eth_up) + " up)");
  return parts.empty() ? "none" : join(parts, ", ");
}

}  // namespace

std::string format_bytes(std::uint64_t b) {
  constexpr std::uint64_t KiB = 1ull << 10, MiB = 1ull << 20, GiB = 1ull << 30;
  char buf[32];
  if (b >= GiB && b % GiB == 0)
    std::snprintf(buf, sizeof buf, "%llu GiB", static_cast<unsigned long long>(b / GiB));
  else if (b >= GiB)
    std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(b) / GiB);
  else if (b >= MiB)
    std::snprintf(buf, sizeof buf, "%llu MiB", static_cast<unsigned long long>(b / MiB));
  else if (b >= KiB)
    std::snprintf(buf, sizeof buf, "%llu KiB", static_cast<unsigned long long>(b / KiB));
  else
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

std::string format_node(const NodeFacts& f) {
  std::string out = "node " + f.hostname + "\n";
  const auto& v = f.versions;
  const auto torch = torch_shown(f);
  Table versions({"driver", "cuda_driver", "nccl", "torch", "kernel"});
  versions.row({opt(v.driver), opt(v.cuda_driver), opt(v.nccl), torch.value, opt(v.kernel)});
  out += "\nversions\n" + versions.str();
  if (v.nccl_library) out += "  (nccl from " + *v.nccl_library + ")\n";
  // Whose torch that is, so that it never reads as another answer than the python section's.
  if (f.python)
    out += "  (torch of the python below)\n";
  else if (torch.of_system_python)
    out += "  (torch of the system Python's packages; the job's interpreter was not asked)\n";

  Table numa({"id", "cpus", "gpus", "nics"});
  for (const auto& n : f.numa_nodes) {
    std::vector<std::string> g, x;
    for (const auto& gpu : f.gpus)
      if (gpu.numa_node == n.id) g.push_back(std::to_string(gpu.index));
    for (const auto& nic : f.nics)
      if (nic.numa_node == n.id)
        x.push_back(nic.port && nic.kind == NicKind::ib ? nic.name + ":" + std::to_string(*nic.port) : nic.name);
    numa.row({std::to_string(n.id), n.cpus.empty() ? "(none)" : n.cpus, g.empty() ? "-" : join(g, ","),
              x.empty() ? "-" : join(x, ",")});
  }
  out += "\nNUMA nodes (" + std::to_string(f.numa_nodes.size()) + ")\n" + numa.str();

  out += "\nGPUs (" + std::to_string(f.gpus.size()) + ")\n";
  if (f.gpus.empty()) {
    out += "  none\n";
  } else {
    Table t({"index", "name", "memory", "pci_bus_id", "numa", "uuid"});
    for (const auto& g : f.gpus)
      t.row({std::to_string(g.index), g.name.value_or(g.pci_id.value_or("-")),
             g.memory_mib ? format_bytes(*g.memory_mib << 20) : "-", g.pci_bus_id, std::to_string(g.numa_node),
             opt(g.uuid)});
    out += t.str();
  }

  out += "\nNICs (" + std::to_string(f.nics.size()) + ")\n";
  if (f.nics.empty()) {
    out += "  none\n";
  } else {
    Table t({"name", "kind", "netdev", "pci_bus_id", "numa", "speed", "state", "addresses"});
    for (const auto& n : f.nics) {
      std::string kind(to_string(n.kind));
      if (n.kind == NicKind::ib && n.link_layer == "ethernet") kind += " (roce)";
      t.row({n.port && n.kind == NicKind::ib ? n.name + ":" + std::to_string(*n.port) : n.name, kind, opt(n.netdev),
             opt(n.pci_bus_id), std::to_string(n.numa_node), speed(n.speed_mbps), opt(n.state),
             n.addresses.empty() ? "-" : join(n.addresses, " ")});
    }
    out += t.str();
  }

  Table lim({"memlock", "nofile", "/dev/shm"});
  lim.row({limit(f.limits.memlock, true), limit(f.limits.nofile, false),
           f.limits.shm_bytes ? format_bytes(*f.limits.shm_bytes) : "-"});
  out += "\nlimits\n" + lim.str();
  out += "\ncontainer runtimes\n  ";
  if (!f.container_runtimes)
    out += "-";
  else if (f.container_runtimes->empty())
    out += "none";
  else
    out += join(*f.container_runtimes, ", ");
  out += "\n";
  if (const auto& py = f.python) {
    out += "\npython (" + py->source + ")\n  " + py->interpreter;
    if (py->executable && *py->executable != py->interpreter) out += " -> " + *py->executable;
    out += "\n  ";
    if (py->error)
      out += "unknown: " + *py->error;
    else
      out += "Python " + py->version.value_or("?") + ", torch " + py->torch.value_or("none");
    out += "\n";
  }
  if (const auto& ci = f.container_image) {
    out += "\ncontainer image (" + ci->runtime + ")\n  " + ci->image + "\n  ";
    out += ci->digest ? *ci->digest : "not resolved: " + ci->error.value_or("?");
    if (ci->repo_digest) out += "\n  repo digest " + *ci->repo_digest;
    out += "\n";
  }
  return out;
}

std::string format_nodes_summary(const std::vector<NodeFacts>& nodes) {
  const bool images =
      std::any_of(nodes.begin(), nodes.end(), [](const NodeFacts& n) { return n.container_image.has_value(); });
  const bool pythons = std::any_of(nodes.begin(), nodes.end(), [](const NodeFacts& n) { return n.python.has_value(); });
  std::vector<std::string> head{"node", "gpus", "nics", "driver", "cuda", "nccl", "torch"};
  if (pythons) head.push_back("python");
  if (images) head.push_back("image digest");
  Table t(head);
  for (const auto& n : nodes) {
    std::vector<std::string> row{
        n.hostname,
        gpu_summary(n),
        nic_summary(n),
        opt(n.versions.driver),
        opt(n.versions.cuda_driver),
        opt(n.versions.nccl),
        torch_shown(n).value + (torch_shown(n).of_system_python && pythons ? " (system)" : "")};
    if (pythons) row.push_back(n.python && n.python->version ? *n.python->version : "-");
    if (images) {
      const auto& ci = n.container_image;
      row.push_back(!ci ? "-" : ci->digest ? *ci->digest : "missing");
    }
    t.row(row);
  }
  auto out = t.str("");
  // Where no node's interpreter was asked (agents, facts files of a sysfs tree), every torch is
  // the system Python's; where some were, those that were not are marked "(system)" above.
  if (!pythons && std::any_of(nodes.begin(), nodes.end(), [](const NodeFacts& n) { return n.versions.torch; }))
    out += "(torch: the system Python's packages; the jobs' interpreters were not asked)\n";
  return out;
}

std::string format_findings(const std::vector<Finding>& findings) {
  std::string out;
  int errors = 0, warnings = 0;
  for (const auto& f : findings) {
    errors += f.severity == Severity::error;
    warnings += f.severity == Severity::warning;
    char sev[16];
    std::snprintf(sev, sizeof sev, "%-7s", std::string(to_string(f.severity)).c_str());
    out += std::string(sev) + "  " + f.message + "  [" + f.code + "]\n";
  }
  if (errors)
    out += std::to_string(errors) + " error(s), " + std::to_string(warnings) +
           " warning(s): fix the errors before launching\n";
  else if (warnings)
    out += "no errors, " + std::to_string(warnings) + " warning(s)\n";
  else
    out += "ok: no problems found\n";
  return out;
}

}  // namespace ddp::facts

#include "binding/binding.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

namespace ddp::binding {
namespace {

using jobspec::GpuBinding;
using jobspec::NicBinding;
using jobspec::NumaBinding;

// "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0" -> its components.
std::vector<std::string> path_parts(const std::optional<std::string>& p) {
  std::vector<std::string> out;
  if (!p) return out;
  std::size_t i = 0;
  while (i < p->size()) {
    auto j = p->find('/', i);
    if (j == std::string::npos) j = p->size();
    if (j > i) out.push_back(p->substr(i, j - i));
    i = j + 1;
  }
  return out;
}

// How many PCI levels two devices share below /sys/devices: 0 none (or unknown), 1 the root
// complex, 2 or more a bridge or switch.
int pci_affinity(const std::optional<std::string>& a, const std::optional<std::string>& b) {
  auto pa = path_parts(a), pb = path_parts(b);
  std::size_t i = 0;
  while (i < pa.size() && i < pb.size() && pa[i] == pb[i]) ++i;
  if (i < 2 || pa[0] != "sys" || pa[1] != "devices") return 0;
  // The device itself is never shared: a GPU and a NIC that share the whole path are the same device.
  return static_cast<int>(i) - 2;
}

// Splits `cpus` evenly into `k` parts; part `i`. Each contiguous run (e.g. the physical cores,
// then their hyperthread siblings: "0-55,112-167") is split on its own, so a rank gets cores
// and their siblings; when a run is shorter than k, the flat list is split instead.
std::vector<int> split_part(const std::vector<int>& cpus, int k, int i) {
  auto chunk = [](const std::vector<int>& v, int parts, int idx) {
    const std::size_t n = v.size(), base = n / parts, extra = n % parts;
    const std::size_t begin = idx * base + std::min<std::size_t>(idx, extra);
    const std::size_t len = base + (static_cast<std::size_t>(idx) < extra ? 1 : 0);
    return std::vector<int>(v.begin() + begin, v.begin() + begin + len);
  };
  std::vector<std::vector<int>> runs;
  for (int c : cpus) {
    if (runs.empty() || runs.back().back() + 1 != c) runs.emplace_back();
    runs.back().push_back(c);
  }
  const bool by_run =
      std::all_of(runs.begin(), runs.end(), [k](const auto& r) { return r.size() >= static_cast<std::size_t>(k); });
  if (!by_run) return chunk(cpus, k, i);
  std::vector<int> out;
  for (const auto& r : runs) {
    auto part = chunk(r, k, i);
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

std::vector<int> intersect(const std::vector<int>& a, const std::optional<std::vector<int>>& allowed) {
  if (!allowed) return a;
  std::vector<int> b = *allowed, out;
  std::sort(b.begin(), b.end());
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

bool nic_usable(const facts::Nic& n) {
  // A port known to be down carries no traffic; unknown state counts as usable.
  return !n.state || (*n.state != "down" && *n.state != "disabled");
}

}  // namespace

std::string RankBinding::reason() const {
  std::string out;
  for (const auto& r : reasons) {
    if (!out.empty()) out += "; ";
    out += r;
  }
  return out;
}

Plan plan_binding(const facts::NodeFacts& facts, int nproc, const BindingSpec& spec,
                  const std::optional<std::vector<int>>& allowed) {
  Plan plan;
  plan.ranks.resize(static_cast<std::size_t>(std::max(nproc, 0)));
  for (int r = 0; r < nproc; ++r) plan.ranks[r].local_rank = r;

  // GPUs in PCI bus id order (normalised by the facts model, so the string order is the bus order).
  std::vector<const facts::Gpu*> gpus;
  for (const auto& g : facts.gpus) gpus.push_back(&g);
  std::stable_sort(gpus.begin(), gpus.end(), [](auto* a, auto* b) { return a->pci_bus_id < b->pci_bus_id; });
  const int job_gpus = spec.gpu == GpuBinding::none ? 0 : std::min<int>(nproc, static_cast<int>(gpus.size()));
  auto gpu_of = [&](int r) -> const facts::Gpu* { return r < job_gpus ? gpus[r] : nullptr; };

  // CUDA_VISIBLE_DEVICES takes UUIDs or indices, never a mix: UUIDs when every GPU has one.
  const bool all_uuids =
      std::all_of(gpus.begin(), gpus.begin() + job_gpus, [](auto* g) { return g->uuid.has_value(); });
  auto device_name = [&](const facts::Gpu* g) { return all_uuids ? *g->uuid : std::to_string(g->index); };
  std::string all_visible;
  for (int r = 0; r < job_gpus; ++r) {
    if (r) all_visible += ',';
    all_visible += device_name(gpus[r]);
  }

  std::map<int, const facts::NumaNode*> numa_by_id;
  for (const auto& n : facts.numa_nodes) numa_by_id.emplace(n.id, &n);

  // GPU and NUMA node of each rank.
  int gpuless = 0;
  for (int r = 0; r < nproc; ++r) {
    auto& rb = plan.ranks[r];
    const facts::Gpu* g = gpu_of(r);
    if (g) {
      rb.gpu = g->index;
      rb.cuda_visible_devices = spec.gpu == GpuBinding::isolate ? device_name(g) : all_visible;
      rb.reasons.push_back(fmt::format("GPU {} ({}), #{} in PCI order{}", g->index, g->pci_bus_id, r,
                                       all_uuids ? "" : "; CUDA_VISIBLE_DEVICES by index: a GPU has no UUID"));
    } else if (spec.gpu == GpuBinding::none) {
      rb.reasons.push_back("no GPU binding (binding.gpu: none)");
    } else if (gpus.empty()) {
      rb.reasons.push_back("no GPU binding: the node has no GPU");
    } else {
      rb.reasons.push_back(fmt::format("no GPU binding: {} local ranks for {} GPUs", nproc, gpus.size()));
    }
    if (spec.numa == NumaBinding::none) continue;
    if (g) {
      const int node = g->numa_node < 0 ? 0 : g->numa_node;
      if (numa_by_id.contains(node)) {
        rb.numa_node = node;
      } else {
        rb.reasons.push_back(fmt::format("no NUMA binding: the GPU's NUMA node {} is not in the facts", node));
      }
    } else if (!facts.numa_nodes.empty()) {
      rb.numa_node = facts.numa_nodes[static_cast<std::size_t>(gpuless++) % facts.numa_nodes.size()].id;
      rb.reasons.push_back(fmt::format("NUMA node {} round-robin", *rb.numa_node));
    }
  }

  // CPUs: the node's CPUs the launcher may use; with `exclusive`, an even share of them.
  std::map<int, std::vector<int>> sharing;  // NUMA node -> its ranks
  for (const auto& rb : plan.ranks) {
    if (rb.numa_node) sharing[*rb.numa_node].push_back(rb.local_rank);
  }
  for (auto& rb : plan.ranks) {
    if (!rb.numa_node) continue;
    auto parsed = facts::parse_cpulist(numa_by_id.at(*rb.numa_node)->cpus);
    std::vector<int> cpus = intersect(parsed ? *parsed : std::vector<int>{}, allowed);
    if (cpus.empty()) {
      rb.reasons.push_back(fmt::format("no CPU binding: none of NUMA node {}'s CPUs may be used here", *rb.numa_node));
      continue;
    }
    if (spec.numa == NumaBinding::exclusive) {
      const auto& peers = sharing[*rb.numa_node];
      const int k = static_cast<int>(peers.size());
      const int i = static_cast<int>(std::find(peers.begin(), peers.end(), rb.local_rank) - peers.begin());
      if (static_cast<int>(cpus.size()) >= k) {
        cpus = split_part(cpus, k, i);
        rb.reasons.push_back(fmt::format("share {} of {} of NUMA node {}'s CPUs", i + 1, k, *rb.numa_node));
      } else {
        cpus = {cpus[static_cast<std::size_t>(i) % cpus.size()]};
        rb.reasons.push_back(
            fmt::format("{} ranks share NUMA node {}'s {} CPUs: not exclusive", k, *rb.numa_node, cpus.size()));
      }
    }
    rb.cpus = std::move(cpus);
    if (facts.numa_nodes.size() > 1) rb.mem_node = rb.numa_node;
  }

  if (spec.nic == NicBinding::none) return plan;

  // NCCL_IB_HCA: every IB device of the node, exact names.
  std::vector<const facts::Nic*> ib, eth;
  for (const auto& n : facts.nics) (n.kind == facts::NicKind::ib ? ib : eth).push_back(&n);
  std::sort(ib.begin(), ib.end(), [](auto* a, auto* b) { return a->name < b->name; });
  plan.nccl_ib_hca = common_ib_hca({ib_hcas(facts)});

  // The nearest NIC per rank: NCCL's rails are the IB devices; without any, the Ethernet ones.
  std::vector<const facts::Nic*> cands;
  for (auto* n : ib.empty() ? eth : ib) {
    if (nic_usable(*n)) cands.push_back(n);
  }
  if (cands.empty()) return plan;
  struct Want {
    int rank;
    int best;  // the best PCI affinity any candidate offers: the pickiest ranks choose first
  };
  std::vector<Want> order;
  for (const auto& rb : plan.ranks) {
    const facts::Gpu* g = gpu_of(rb.local_rank);
    int best = 0;
    for (auto* n : cands) best = std::max(best, g ? pci_affinity(g->sysfs_path, n->sysfs_path) : 0);
    order.push_back({rb.local_rank, best});
  }
  std::stable_sort(order.begin(), order.end(), [](const Want& a, const Want& b) { return a.best > b.best; });
  std::map<const facts::Nic*, int> uses;
  for (const auto& w : order) {
    auto& rb = plan.ranks[w.rank];
    const facts::Gpu* g = gpu_of(w.rank);
    const int node = g ? (g->numa_node < 0 ? 0 : g->numa_node) : rb.numa_node.value_or(0);
    // Same NUMA node first, then the least used (spread), then the closest on the PCI tree.
    auto key = [&](const facts::Nic* n) {
      return std::tuple(n->numa_node == node ? 0 : 1, uses[n], g ? -pci_affinity(g->sysfs_path, n->sysfs_path) : 0,
                        n->name);
    };
    const facts::Nic* pick =
        *std::min_element(cands.begin(), cands.end(), [&](auto* a, auto* b) { return key(a) < key(b); });
    ++uses[pick];
    rb.nic = pick->name;
    if (spec.nic == NicBinding::rank && pick->kind == facts::NicKind::ib) {
      rb.nccl_ib_hca = pick->port ? fmt::format("={}:{}", pick->name, *pick->port) : "=" + pick->name;
    }
    const int aff = g ? pci_affinity(g->sysfs_path, pick->sysfs_path) : 0;
    rb.reasons.push_back(fmt::format("NIC {}: {}", pick->name,
                                     aff >= 2                  ? "same PCI switch as the GPU"
                                     : pick->numa_node == node ? fmt::format("same NUMA node {}", node)
                                                               : fmt::format("no usable NIC on NUMA node {}", node)));
  }
  return plan;
}

std::vector<std::string> ib_hcas(const facts::NodeFacts& facts) {
  std::vector<std::string> out;
  for (const auto& n : facts.nics) {
    if (n.kind != facts::NicKind::ib) continue;
    out.push_back(n.port ? fmt::format("{}:{}", n.name, *n.port) : n.name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<std::string> common_ib_hca(const std::vector<std::vector<std::string>>& per_node) {
  if (per_node.empty()) return std::nullopt;
  std::set<std::string> common(per_node[0].begin(), per_node[0].end());
  for (std::size_t i = 1; i < per_node.size(); ++i) {
    const std::set<std::string> mine(per_node[i].begin(), per_node[i].end());
    std::erase_if(common, [&](const std::string& e) { return !mine.count(e); });
  }
  if (common.empty()) return std::nullopt;
  std::string out = "=";
  for (const auto& e : common) {
    if (out.size() > 1) out += ',';
    out += e;
  }
  return out;
}

facts::NodeFacts restrict_gpus(facts::NodeFacts facts, const std::vector<std::string>& selectors) {
  std::vector<facts::Gpu> by_bus = facts.gpus;
  std::stable_sort(by_bus.begin(), by_bus.end(),
                   [](const auto& a, const auto& b) { return a.pci_bus_id < b.pci_bus_id; });
  std::set<std::size_t> keep;
  for (const auto& sel : selectors) {
    std::optional<std::size_t> hit;
    const bool numeric =
        !sel.empty() && std::all_of(sel.begin(), sel.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (numeric && sel.size() <= 4) {
      const auto i = std::stoul(sel);
      if (i < by_bus.size()) hit = i;
    } else {
      const auto bus = facts::normalize_pci_bus_id(sel);
      for (std::size_t i = 0; i < by_bus.size() && !hit; ++i) {
        if ((by_bus[i].uuid && *by_bus[i].uuid == sel) || (bus && by_bus[i].pci_bus_id == *bus)) hit = i;
      }
    }
    if (!hit) {
      throw std::invalid_argument(
          fmt::format("GPU '{}' is not on this node ({} GPU{}{})", sel, by_bus.size(), by_bus.size() == 1 ? "" : "s",
                      by_bus.empty() ? "" : "; name one by index in PCI order, UUID or PCI bus id"));
    }
    if (!keep.insert(*hit).second) throw std::invalid_argument(fmt::format("GPU '{}' is named twice", sel));
  }
  facts.gpus.clear();
  for (auto i : keep) facts.gpus.push_back(by_bus[i]);
  return facts;
}

nlohmann::json to_json(const RankBinding& rb) {
  using nlohmann::json;
  return {{"gpu", rb.gpu ? json(*rb.gpu) : json(nullptr)},
          {"cuda_visible_devices", rb.cuda_visible_devices ? json(*rb.cuda_visible_devices) : json(nullptr)},
          {"numa_node", rb.numa_node ? json(*rb.numa_node) : json(nullptr)},
          {"cpus", rb.cpus.empty() ? json(nullptr) : json(facts::format_cpulist(rb.cpus))},
          {"mem_node", rb.mem_node ? json(*rb.mem_node) : json(nullptr)},
          {"nic", rb.nic ? json(*rb.nic) : json(nullptr)},
          {"nccl_ib_hca", rb.nccl_ib_hca ? json(*rb.nccl_ib_hca) : json(nullptr)},
          {"reason", rb.reason()}};
}

}  // namespace ddp::binding

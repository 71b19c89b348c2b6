#include "facts/consistency.hpp"

#include "common/strings.hpp"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <set>

namespace ddp::facts {

std::string_view to_string(Severity s) {
  switch (s) {
    case Severity::info:
      return "info";
    case Severity::warning:
      return "warning";
    case Severity::error:
      return "error";
  }
  return "?";
}

nlohmann::json to_json(const Finding& f) {
  return {
      {"severity", std::string(to_string(f.severity))}, {"code", f.code}, {"message", f.message}, {"nodes", f.nodes}};
}

bool has_errors(const std::vector<Finding>& findings) {
  return std::any_of(findings.begin(), findings.end(), [](const Finding& f) { return f.severity == Severity::error; });
}

std::optional<std::string> image_disagreement(const std::string& image,
                                              const std::vector<std::pair<std::string, std::string>>& node_digests) {
  std::vector<std::pair<std::string, std::vector<std::string>>> groups;  // digest -> nodes, first seen first
  for (const auto& [node, digest] : node_digests) {
    if (digest.empty()) continue;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == digest; });
    if (it == groups.end())
      groups.push_back({digest, {node}});
    else
      it->second.push_back(node);
  }
  if (groups.size() <= 1) return std::nullopt;
  std::stable_sort(groups.begin(), groups.end(),
                   [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
  std::string out = "the nodes have different images for " + image + ": ";
  for (std::size_t i = 0; i < groups.size(); ++i) {
    out += (i ? "; " : "") + join(groups[i].second, ", ") + (groups[i].second.size() == 1 ? " has " : " have ") +
           groups[i].first;
  }
  return out;
}

JobNeeds default_job_needs(const std::vector<NodeFacts>& nodes) {
  JobNeeds j;
  j.gpu = std::any_of(nodes.begin(), nodes.end(), [](const NodeFacts& n) { return !n.gpus.empty(); });
  return j;
}

namespace {

constexpr std::uint64_t MiB = 1ull << 20, GiB = 1ull << 30;

std::string bytes(std::uint64_t b) {
  char buf[32];
  if (b >= GiB && b % GiB == 0)
    std::snprintf(buf, sizeof buf, "%llu GiB", static_cast<unsigned long long>(b / GiB));
  else if (b >= GiB)
    std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(b) / GiB);
  else if (b >= MiB)
    std::snprintf(buf, sizeof buf, "%llu MiB", static_cast<unsigned long long>(b / MiB));
  else if (b >= 1024)
    std::snprintf(buf, sizeof buf, "%llu KiB", static_cast<unsigned long long>(b / 1024));
  else
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

bool usable_ib(const Nic& n) {
  return n.kind == NicKind::ib && n.state && *n.state == "active";
}
bool usable_eth(const Nic& n) {
  return n.kind == NicKind::eth && (!n.state || *n.state == "up" || *n.state == "unknown");
}

std::string nic_id(const Nic& n) {
  return n.port ? n.name + ":" + std::to_string(*n.port) : n.name;
}

class Checker {
 public:
  Checker(const std::vector<NodeFacts>& nodes, const JobNeeds& job) : nodes_(nodes), job_(job) {
    std::map<std::string, int> seen;
    for (const auto& n : nodes) ++seen[n.hostname];
    std::map<std::string, int> k;
    for (const auto& n : nodes)
      labels_.push_back(seen[n.hostname] > 1 ? n.hostname + "#" + std::to_string(++k[n.hostname]) : n.hostname);
  }

  std::vector<Finding> run() {
    duplicates();
    if (job_.gpu) gpus();
    versions();
    python();
    nics();
    limits();
    image();
    std::stable_sort(out_.begin(), out_.end(),
                     [](const Finding& a, const Finding& b) { return a.severity > b.severity; });
    return std::move(out_);
  }

 private:
  void add(Severity s, std::string code, std::string message, std::vector<std::string> nodes = {}) {
    out_.push_back({s, std::move(code), std::move(message), std::move(nodes)});
  }

  // "2.21.5 on a, b; 2.19.3 on c" for differing values; absent values are grouped as "unknown".
  using Groups = std::map<std::string, std::vector<std::string>>;
  static std::string describe(const Groups& g) {
    // Largest group first: the odd one out reads last.
    std::vector<std::pair<std::string, std::vector<std::string>>> v(g.begin(), g.end());
    std::stable_sort(v.begin(), v.end(),
                     [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
    std::vector<std::string> parts;
    for (const auto& [value, nodes] : v) parts.push_back(value + " on " + join(nodes, ", "));
    return join(parts, "; ");
  }

  // "2.11" of "2.11.0+cu128", "3.11" of "3.11.2": the release; the whole string if it has no
  // two dotted parts (then only equal strings are the same release).
  static std::string release_of(const std::string& v) {
    auto dot = v.find('.');
    if (dot == std::string::npos) return v;
    auto end = v.find_first_not_of("0123456789", dot + 1);
    return v.substr(0, end == std::string::npos ? v.size() : end);
  }

  // The job's PyTorch and Python (the probed interpreter's, else the system Python's torch):
  // another PyTorch release on one node is an error (its collectives, store and pickled objects
  // are another's; the store cannot tell the wire layouts apart), another build of one release a
  // warning; another Python minor version an error (pickles and extension modules differ).
  // An interpreter that answered without torch is a finding of its own, whatever the others
  // have: the job would stop at `import torch`, an error where the interpreter is the job's own
  // (its python: key or its command's program), a warning where it is a guess. One that did not
  // answer is a warning: what the job would import is not known.
  void python() {
    Groups torch_release, torch_build, py_minor, no_torch_own, no_torch_guessed, no_torch_job_guess, unknown;
    bool all_probed = true;  // else some torch is the system Python's, maybe not the job's: a warning
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      const auto& n = nodes_[i];
      all_probed = all_probed && n.python;
      std::optional<std::string> torch = n.python ? n.python->torch : n.versions.torch;
      // Known to have none only when the interpreter answered; else unknown, never compared.
      const bool answered = n.python && !n.python->error;
      if (torch) {
        torch_release[release_of(*torch)].push_back(labels_[i]);
        torch_build[*torch].push_back(labels_[i]);
      } else if (answered) {
        // A guess made for a job (--job, whose command is not a Python) is not one --job helps with.
        auto& g = !n.python->guessed                                   ? no_torch_own
                  : n.python->source.starts_with(kGuessedSourcePrefix) ? no_torch_job_guess
                                                                       : no_torch_guessed;
        g[asked(*n.python)].push_back(labels_[i]);
      }
      if (n.python && n.python->error) unknown[asked(*n.python) + ": " + *n.python->error].push_back(labels_[i]);
      if (answered && n.python->version) py_minor["Python " + release_of(*n.python->version)].push_back(labels_[i]);
    }
    auto nodes_of = [](const Groups& g) {
      std::vector<std::string> out;
      for (const auto& [v, l] : g) out.insert(out.end(), l.begin(), l.end());
      return out;
    };
    for (const auto& [python, nodes] : no_torch_own)
      add(Severity::error, "python-no-torch",
          "no torch in the job's Python on " + join(nodes, ", ") + ": " + python +
              "; the job would stop at `import torch`: install PyTorch for that interpreter, or name one that has "
              "it with the job file's python: key",
          nodes);
    const std::pair<const Groups*, const char*> guesses[] = {
        {&no_torch_guessed,
         "ask the job's own interpreter (`ddpctl doctor --job FILE`; the job file's python: key "
         "names it)"},
        {&no_torch_job_guess, "name the job's interpreter with the job file's python: key"}};
    for (const auto& [groups, hint] : guesses) {
      for (const auto& [python, nodes] : *groups)
        add(Severity::warning, "python-no-torch",
            "no torch in " + python + " on " + join(nodes, ", ") +
                "; a job that runs it would stop at `import torch`: install PyTorch for it, or " + hint,
            nodes);
    }
    for (const auto& [why, nodes] : unknown)
      add(Severity::warning, "python-unknown",
          "the Python asked on " + join(nodes, ", ") + " did not answer, so its torch is not known: " + why, nodes);
    if (torch_release.size() > 1) {
      add(all_probed ? Severity::error : Severity::warning, "torch-release-mismatch",
          "PyTorch releases differ: " + describe(torch_release) +
              (all_probed ? " (ranks of different releases disagree on collectives and the store's wire; install one "
                            "release everywhere)"
                          : " (of the system Python where the job's was not asked: `ddpctl doctor --job FILE`)"),
          nodes_of(torch_release));
    } else if (torch_build.size() > 1) {
      add(Severity::warning, "torch-version-mismatch", "PyTorch builds differ: " + describe(torch_build),
          nodes_of(torch_build));
    }
    if (py_minor.size() > 1) {
      add(Severity::error, "python-version-mismatch",
          "Python versions differ: " + describe(py_minor) +
              " (pickled objects and extension modules differ between them)",
          nodes_of(py_minor));
    }
  }

  // "/venv/bin/python3 (python: in job.yaml)": which interpreter was asked, and why that one.
  static std::string asked(const PythonFacts& py) {
    return py.source.empty() ? py.interpreter : py.interpreter + " (" + py.source + ")";
  }

  // A job's container image (doctor --image/--job): on every node, and the same there.
  void image() {
    std::vector<std::pair<std::string, std::string>> digests;
    std::vector<std::string> all;
    std::string name;
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      const auto& ci = nodes_[i].container_image;
      if (!ci) continue;
      name = ci->image;
      all.push_back(labels_[i]);
      if (ci->digest) {
        digests.emplace_back(labels_[i], *ci->digest);
      } else if (ci->error && ci->error->starts_with(kImageNotChecked)) {
        add(Severity::warning, "image-unchecked", labels_[i] + ": image " + ci->image + ": " + *ci->error,
            {labels_[i]});
      } else {
        add(Severity::error, "image-missing",
            labels_[i] + ": image " + ci->image + ": " + ci->error.value_or("not resolved"), {labels_[i]});
      }
    }
    if (auto why = image_disagreement(name, digests)) add(Severity::error, "image-mismatch", *why, all);
  }

  void duplicates() {
    std::map<std::string, std::vector<std::string>> hosts, uuids;
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      hosts[nodes_[i].hostname].push_back(labels_[i]);
      std::set<std::string> mine;
      for (const auto& g : nodes_[i].gpus)
        if (g.uuid && mine.insert(*g.uuid).second) uuids[*g.uuid].push_back(labels_[i]);
    }
    for (const auto& [h, l] : hosts)
      if (l.size() > 1)
        add(Severity::error, "duplicate-node",
            "hostname " + h + " appears " + std::to_string(l.size()) + " times (the same node described twice?)", l);
    for (const auto& [u, l] : uuids)
      if (l.size() > 1)
        add(Severity::error, "duplicate-gpu",
            "GPU " + u + " appears on " + join(l, ", ") + " (the same node described twice?)", l);
  }

  void gpus() {
    Groups counts, models;
    std::vector<std::string> none;
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      const auto& n = nodes_[i];
      counts[std::to_string(n.gpus.size()) + " GPU" + (n.gpus.size() == 1 ? "" : "s")].push_back(labels_[i]);
      if (n.gpus.empty()) none.push_back(labels_[i]);
      std::set<std::string> m;
      for (const auto& g : n.gpus) m.insert(g.name.value_or(g.pci_id.value_or("unknown model")));
      if (m.size() > 1)
        add(Severity::warning, "gpu-model-mixed",
            labels_[i] + " has GPUs of different models: " + join({m.begin(), m.end()}, ", "), {labels_[i]});
      if (!m.empty()) models[join({m.begin(), m.end()}, " + ")].push_back(labels_[i]);
    }
    if (!none.empty())
      add(Severity::error, "gpu-missing",
          "the job needs GPUs but " + join(none, ", ") + (none.size() == 1 ? " has" : " have") + " none", none);
    if (counts.size() > 1)
      add(Severity::error, "gpu-count-mismatch", "GPU counts differ: " + describe(counts), all_with_gpus_or_all());
    if (models.size() > 1)
      add(Severity::warning, "gpu-model-mismatch",
          "GPU models differ: " + describe(models) + " (the job runs at the slowest one's pace)");
  }

  std::vector<std::string> all_with_gpus_or_all() const { return labels_; }

  void versions() {
    struct V {
      const char* what;
      const char* code;
      std::function<const std::optional<std::string>&(const NodeFacts&)> get;
      Severity mismatch;  // for this job
      bool need_known;    // warn when unknown (GPU jobs, for what they depend on)
      const char* why;
    };
    const bool gpu = job_.gpu;
    const std::vector<V> checks{
        {"NVIDIA driver", "driver-version", [](const NodeFacts& n) -> const auto& {return n.versions.driver;
  }
  , gpu ? Severity::error : Severity::info, gpu, "mixed drivers make NCCL fail or hang"
}, {"CUDA driver", "cuda-driver-version", [](const NodeFacts& n) -> const auto& {return n.versions.cuda_driver;
}  // namespace
, gpu ? Severity::error : Severity::info, false, "mixed CUDA drivers make NCCL fail or hang"
}  // namespace ddp::facts
, {"NCCL", "nccl-version", [](const NodeFacts& n) -> const auto& {return n.versions.nccl;
}
, gpu ? Severity::error : Severity::info, false, "NCCL refuses peers of another version"
}
, {"kernel", "kernel-version", [](const NodeFacts& n) -> const auto& {return n.versions.kernel;
}
, Severity::info, false, ""
}
,
}
;
for (const auto& c : checks) {
  Groups known;
  std::vector<std::string> unknown;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const auto& v = c.get(nodes_[i]);
    if (v)
      known[*v].push_back(labels_[i]);
    else
      unknown.push_back(labels_[i]);
  }
  if (known.size() > 1) {
    std::string msg = std::string(c.what) + " versions differ: " + describe(known);
    if (*c.why && c.mismatch != Severity::info) msg += std::string(" (") + c.why + ")";
    std::vector<std::string> nodes;
    for (const auto& [v, l] : known) nodes.insert(nodes.end(), l.begin(), l.end());
    add(c.mismatch, std::string(c.code) + "-mismatch", msg, nodes);
  }
  if (c.need_known && !unknown.empty()) {
    // Only where the node has GPUs: a driver version matters there.
    std::vector<std::string> with_gpus;
    for (std::size_t i = 0; i < nodes_.size(); ++i)
      if (!c.get(nodes_[i]) && !nodes_[i].gpus.empty()) with_gpus.push_back(labels_[i]);
    if (!with_gpus.empty())
      add(Severity::warning, std::string(c.code) + "-unknown",
          std::string(c.what) + " version unknown on " + join(with_gpus, ", ") + " (driver not loaded?)", with_gpus);
  }
}
}

void nics() {
  const bool multi = nodes_.size() > 1;
  std::vector<std::string> with_ib, without_ib, no_nic;
  Groups active_ports;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const auto& n = nodes_[i];
    int active = 0;
    bool eth = false;
    std::vector<std::string> down;
    for (const auto& nic : n.nics) {
      if (usable_ib(nic))
        ++active;
      else if (nic.kind == NicKind::ib)
        down.push_back(nic_id(nic) + " (" + nic.state.value_or("state unknown") + ")");
      if (usable_eth(nic)) eth = true;
    }
    if (!down.empty())
      add(job_.gpu ? Severity::warning : Severity::info, "ib-port-down",
          labels_[i] + ": RDMA ports not active: " + join(down, ", "), {labels_[i]});
    (active ? with_ib : without_ib).push_back(labels_[i]);
    if (active) active_ports[std::to_string(active) + " active"].push_back(labels_[i]);
    if (!active && !eth) no_nic.push_back(labels_[i]);
  }
  if (job_.rdma.value_or(false) && !without_ib.empty()) {
    add(Severity::error, "rdma-missing",
        "the job expects RDMA (ib) but " + join(without_ib, ", ") + (without_ib.size() == 1 ? " has" : " have") +
            " no active IB port",
        without_ib);
  } else if (multi && !with_ib.empty() && !without_ib.empty()) {
    std::string msg = "RDMA (ib) on " + join(with_ib, ", ") + " but not on " + join(without_ib, ", ");
    if (job_.gpu && job_.rdma != false)
      add(Severity::error, "nic-kind-mismatch",
          msg +
              ": NCCL would use IB on some nodes and sockets on others, which cannot connect (fix the node, or set "
              "NCCL_IB_DISABLE=1 to use sockets everywhere)",
          without_ib);
    else
      add(Severity::info, "nic-kind-mismatch", msg + " (this job does not use it)", without_ib);
  }
  if (multi && active_ports.size() > 1)
    add(Severity::warning, "ib-port-count",
        "active RDMA ports differ: " + describe(active_ports) + " (fewer rails on some nodes)");
  if (multi && !no_nic.empty())
    add(Severity::warning, "no-nic", "no usable physical NIC found on " + join(no_nic, ", "), no_nic);
  if (multi && without_ib.empty() && !with_ib.empty())
    add(Severity::info, "nic-kind", "common NIC kind: ib (RDMA) on all nodes");
  else if (multi && no_nic.empty() && with_ib.empty())
    add(Severity::info, "nic-kind", "common NIC kind: eth (sockets)");
}

void limits() {
  // RDMA is in play wherever a GPU job finds an active IB port, unless the job turned it off.
  const bool rdma = job_.gpu && job_.rdma != false;
  long long world = 0;
  if (job_.world_size)
    world = *job_.world_size;
  else
    for (const auto& n : nodes_) world += job_.gpu ? static_cast<long long>(n.gpus.size()) : 1;
  const std::uint64_t nofile_need = 2 * static_cast<std::uint64_t>(std::max(world, 1LL)) + 256;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const auto& n = nodes_[i];
    const auto& L = n.limits;
    const bool node_ib = std::any_of(n.nics.begin(), n.nics.end(), usable_ib);
    if (rdma && node_ib && L.memlock && L.memlock->soft) {
      auto soft = *L.memlock->soft;
      std::string hard = L.memlock->hard ? bytes(*L.memlock->hard) : "unlimited";
      if (soft < GiB)
        add(Severity::error, "memlock-low",
            labels_[i] + ": locked-memory limit " + bytes(soft) + " (hard " + hard +
                ") is too low for RDMA: NCCL cannot register its buffers; set memlock to unlimited (limits.conf, "
                "systemd LimitMEMLOCK=infinity, docker --ulimit memlock=-1)",
            {labels_[i]});
      else
        add(Severity::warning, "memlock-finite",
            labels_[i] + ": locked-memory limit " + bytes(soft) + " is not unlimited, as RDMA wants", {labels_[i]});
    }
    if (L.nofile && L.nofile->soft) {
      auto soft = *L.nofile->soft;
      if (soft < nofile_need)
        add(Severity::error, "nofile-low",
            labels_[i] + ": open-files limit " + std::to_string(soft) + " is below " + std::to_string(nofile_need) +
                " (2 per rank for " + std::to_string(world) + " ranks + 256); raise nofile",
            {labels_[i]});
      else if (soft < 4096)
        add(Severity::warning, "nofile-low",
            labels_[i] + ": open-files limit " + std::to_string(soft) +
                " is below 4096 (DataLoader workers run out of descriptors)",
            {labels_[i]});
    }
    if (L.shm_bytes) {
      auto shm = *L.shm_bytes;
      if (job_.gpu && n.gpus.size() >= 2 && shm < 256 * MiB)
        add(Severity::error, "shm-small",
            labels_[i] + ": /dev/shm is " + bytes(shm) + ", too small for NCCL's shared-memory transport between " +
                std::to_string(n.gpus.size()) + " GPUs (docker: --shm-size=16g or --ipc=host)",
            {labels_[i]});
      else if (shm < GiB)
        add(Severity::warning, "shm-small",
            labels_[i] + ": /dev/shm is " + bytes(shm) + " (DataLoader workers and NCCL want at least 1 GiB)",
            {labels_[i]});
    }
  }
}

const std::vector<NodeFacts>& nodes_;
const JobNeeds& job_;
std::vector<std::string> labels_;
std::vector<Finding> out_;
}
;

}  // namespace

std::vector<Finding> check_consistency(const std::vector<NodeFacts>& nodes, const JobNeeds& job) {
  return Checker(nodes, job).run();
}

}  // namespace ddp::facts

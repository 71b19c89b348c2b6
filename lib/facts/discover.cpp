#include "facts/discover.hpp"

#include "common/log.hpp"
#include "common/strings.hpp"
#include "facts/fs_root.hpp"
#include "facts/native.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

namespace ddp::facts {

// ---------------------------------------------------------------- pure parsers

namespace parse {

namespace {
std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}
bool looks_like_version(std::string_view t) {
  return !t.empty() && std::isdigit(static_cast<unsigned char>(t.front())) && t.find('.') != std::string_view::npos &&
         std::all_of(t.begin(), t.end(),
                     [](char c) { return std::isdigit(static_cast<unsigned char>(c)) || c == '.'; });
}
}  // namespace

NvidiaInformation nvidia_information(std::string_view text) {
  NvidiaInformation out;
  for (auto line : split(text, '\n')) {
    auto colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    auto key = trim(line.substr(0, colon));
    auto value = std::string(trim(line.substr(colon + 1)));
    if (value.empty()) continue;
    if (key == "Model")
      out.model = value;
    else if (key == "GPU UUID")
      out.uuid = value;
    else if (key == "Bus Location")
      out.bus_location = value;
  }
  return out;
}

std::optional<std::string> nvidia_driver_version(std::string_view text) {
  auto first = text.substr(0, text.find('\n'));
  if (first.find("NVRM") == std::string_view::npos) return std::nullopt;
  // The version is the first dotted number after "Module" (both the proprietary and the open
  // kernel module lines have it there); a date never looks like "550.54.15".
  auto from = first.find("Module");
  if (from == std::string_view::npos) from = 0;
  std::string_view rest = first.substr(from);
  std::size_t i = 0;
  while (i < rest.size()) {
    while (i < rest.size() && std::isspace(static_cast<unsigned char>(rest[i]))) ++i;
    auto j = i;
    while (j < rest.size() && !std::isspace(static_cast<unsigned char>(rest[j]))) ++j;
    auto tok = rest.substr(i, j - i);
    if (looks_like_version(tok)) return std::string(tok);
    i = j;
  }
  return std::nullopt;
}

std::optional<Limit> proc_limit(std::string_view text, std::string_view row) {
  for (auto line : split(text, '\n')) {
    if (!starts_with(line, row)) continue;
    auto rest = line.substr(row.size());
    std::vector<std::string_view> toks;
    for (auto t : split(rest, ' '))
      if (!trim(t).empty()) toks.push_back(trim(t));
    if (toks.size() < 2) return std::nullopt;
    auto value = [](std::string_view t) -> std::optional<std::optional<std::uint64_t>> {
      if (t == "unlimited") return std::optional<std::uint64_t>();
      auto v = parse_int(t);
      if (!v || *v < 0) return std::nullopt;
      return std::optional<std::uint64_t>(static_cast<std::uint64_t>(*v));
    };
    auto soft = value(toks[0]), hard = value(toks[1]);
    if (!soft || !hard) return std::nullopt;
    return Limit{*soft, *hard};
  }
  return std::nullopt;
}

std::optional<std::uint64_t> ib_rate_mbps(std::string_view text) {
  text = trim(text);
  auto sp = text.find(' ');
  auto num = text.substr(0, sp);
  auto unit = sp == std::string_view::npos ? std::string_view() : trim(text.substr(sp + 1));
  // Rates such as "2.5 Gb/sec (1X SDR)" or "53.125 Gb/sec (1X HDR)" have fractions.
  auto dot = num.find('.');
  auto whole = parse_int(num.substr(0, dot));
  if (!whole || *whole < 0) return std::nullopt;
  std::uint64_t milli = static_cast<std::uint64_t>(*whole) * 1000;
  if (dot != std::string_view::npos) {
    auto frac = std::string(num.substr(dot + 1)).substr(0, 3);
    while (frac.size() < 3) frac += '0';
    auto f = parse_int(frac);
    if (!f || *f < 0) return std::nullopt;
    milli += static_cast<std::uint64_t>(*f);
  }
  if (starts_with(unit, "Gb")) return milli;         // Gb/s -> Mb/s
  if (starts_with(unit, "Mb")) return milli / 1000;  // already Mb/s
  return std::nullopt;
}

std::string ib_state(std::string_view text) {
  text = trim(text);
  auto colon = text.find(':');
  if (colon != std::string_view::npos) text = trim(text.substr(colon + 1));
  return lower(text);
}

std::optional<std::uint64_t> tmpfs_size(std::string_view mounts, std::string_view mount_point) {
  std::optional<std::uint64_t> found;
  for (auto line : split(mounts, '\n')) {
    auto f = split(trim(line), ' ');
    if (f.size() < 4 || f[1] != mount_point) continue;
    found.reset();  // the last mount on a point is the visible one
    for (auto opt : split(f[3], ',')) {
      if (!starts_with(opt, "size=")) continue;
      auto v = opt.substr(5);
      std::uint64_t mult = 1;
      if (!v.empty() && std::isalpha(static_cast<unsigned char>(v.back()))) {
        switch (std::tolower(static_cast<unsigned char>(v.back()))) {
          case 'k':
            mult = 1ull << 10;
            break;
          case 'm':
            mult = 1ull << 20;
            break;
          case 'g':
            mult = 1ull << 30;
            break;
          default:
            mult = 0;
        }
        v.remove_suffix(1);
      }
      auto n = parse_int(v);
      if (n && *n >= 0 && mult) found = static_cast<std::uint64_t>(*n) * mult;
    }
  }
  return found;
}

std::optional<std::string> torch_version(std::string_view text) {
  for (auto line : split(text, '\n')) {
    line = trim(line);
    if (!starts_with(line, "__version__")) continue;
    auto q = line.find_first_of("'\"");
    if (q == std::string_view::npos) continue;
    auto e = line.find(line[q], q + 1);
    if (e == std::string_view::npos) continue;
    auto v = line.substr(q + 1, e - q - 1);
    if (!v.empty() && v.size() < 64) return std::string(v);
  }
  return std::nullopt;
}

std::optional<std::string> last_pci_bus_id(std::string_view sysfs_path) {
  std::optional<std::string> out;
  for (auto c : split(sysfs_path, '/')) {
    if (c.size() >= 12 && c.find(':') != std::string_view::npos && c.find('.') != std::string_view::npos)
      if (auto n = normalize_pci_bus_id(c)) out = n;
  }
  return out;
}

}  // namespace parse

// ---------------------------------------------------------------- discovery

namespace {

struct PciInfo {
  std::string bus_id;
  std::optional<std::string> sysfs_path;
  int numa_node = 0;
  std::optional<std::string> local_cpus;
};

PciInfo pci_info(const FsRoot& fs, const std::string& bus_id) {
  PciInfo p;
  p.bus_id = bus_id;
  std::string dir = "/sys/bus/pci/devices/" + bus_id;
  p.sysfs_path = fs.resolve(dir);
  if (auto n = fs.read_line(dir + "/numa_node")) {
    if (auto v = parse_int(*n); v && *v > 0 && *v <= kMaxCpuId) p.numa_node = static_cast<int>(*v);
  }
  if (auto l = fs.read_line(dir + "/local_cpulist"); l && parse_cpulist(*l)) p.local_cpus = *l;
  return p;
}

std::optional<long long> hex_attr(const FsRoot& fs, const std::string& path) {
  auto s = fs.read_line(path);
  if (!s) return std::nullopt;
  std::string_view v = *s;
  if (starts_with(v, "0x") || starts_with(v, "0X")) v.remove_prefix(2);
  try {
    std::size_t used = 0;
    long long out = std::stoll(std::string(v), &used, 16);
    if (used != v.size()) return std::nullopt;
    return out;
  } catch (...) {
    return std::nullopt;
  }
}

std::vector<NumaNode> discover_numa(const FsRoot& fs) {
  std::vector<NumaNode> out;
  for (const auto& name : fs.list("/sys/devices/system/node")) {
    if (!starts_with(name, "node")) continue;
    auto id = parse_int(std::string_view(name).substr(4));
    if (!id || *id < 0 || *id > kMaxCpuId) continue;
    auto cpus = fs.read_line("/sys/devices/system/node/" + name + "/cpulist").value_or("");
    auto parsed = parse_cpulist(cpus);
    out.push_back({static_cast<int>(*id), parsed ? format_cpulist(*parsed) : std::string()});
  }
  std::sort(out.begin(), out.end(), [](const NumaNode& a, const NumaNode& b) { return a.id < b.id; });
  if (out.empty()) {
    // A kernel built without NUMA: one node holding every online CPU.
    auto cpus = fs.read_line("/sys/devices/system/cpu/online").value_or("");
    auto parsed = parse_cpulist(cpus);
    out.push_back({0, parsed ? format_cpulist(*parsed) : std::string()});
  }
  return out;
}

void discover_gpus(const FsRoot& fs, const DiscoverOptions& opt, NodeFacts& f) {
  auto log = ddp::log::get("facts");
  std::optional<native::NvmlReport> nvml;
  if (fs.is_live() && opt.use_nvml) nvml = native::query_nvml();

  // Every NVIDIA display/3D controller on the PCI bus (NVSwitches are bridges: class 0x0680).
  std::map<std::string, std::string> pci_gpus;  // bus id -> "10de:2330"
  for (const auto& dev : fs.list("/sys/bus/pci/devices")) {
    auto bus = normalize_pci_bus_id(dev);
    if (!bus) continue;
    std::string dir = "/sys/bus/pci/devices/" + dev;
    auto vendor = hex_attr(fs, dir + "/vendor");
    auto cls = hex_attr(fs, dir + "/class");
    if (vendor != 0x10de || !cls || ((*cls >> 8) != 0x0300 && (*cls >> 8) != 0x0302)) continue;
    char id[16];
    std::snprintf(id, sizeof id, "10de:%04llx",
                  static_cast<unsigned long long>(hex_attr(fs, dir + "/device").value_or(0)));
    pci_gpus[*bus] = id;
  }

  // The driver's own list.
  std::map<std::string, parse::NvidiaInformation> proc_gpus;
  for (const auto& dev : fs.list("/proc/driver/nvidia/gpus")) {
    auto text = fs.read("/proc/driver/nvidia/gpus/" + dev + "/information");
    if (!text) continue;
    auto info = parse::nvidia_information(*text);
    auto bus = normalize_pci_bus_id(info.bus_location.value_or(dev));
    if (bus) proc_gpus[*bus] = std::move(info);
  }

  auto complete = [&](Gpu& g) {
    auto p = pci_info(fs, g.pci_bus_id);
    g.numa_node = p.numa_node;
    g.local_cpus = p.local_cpus;
    g.sysfs_path = p.sysfs_path;
    if (auto it = pci_gpus.find(g.pci_bus_id); it != pci_gpus.end()) g.pci_id = it->second;
    if (auto it = proc_gpus.find(g.pci_bus_id); it != proc_gpus.end()) {
      if (!g.name) g.name = it->second.model;
      if (!g.uuid) g.uuid = it->second.uuid;
    }
  };

  if (nvml) {
    f.sources.push_back("nvml");
    for (auto& n : nvml->gpus) {
      Gpu g;
      g.index = n.index;
      g.pci_bus_id = n.pci_bus_id;
      if (!n.uuid.empty()) g.uuid = n.uuid;
      if (!n.name.empty()) g.name = n.name;
      g.memory_mib = n.memory_mib;
      complete(g);
      f.gpus.push_back(std::move(g));
    }
    f.versions.driver = nvml->driver;
    f.versions.cuda_driver = nvml->cuda_driver;
  } else {
    std::set<std::string> buses;
    if (!proc_gpus.empty()) {
      f.sources.push_back("procfs-nvidia");
      for (const auto& [bus, info] : proc_gpus) buses.insert(bus);
    } else {
      for (const auto& [bus, id] : pci_gpus) buses.insert(bus);
      if (!buses.empty())
        log->warn("{} NVIDIA GPU(s) on the PCI bus but no driver information (driver not loaded?)", buses.size());
    }
    int index = 0;
    for (const auto& bus : buses) {  // std::set: PCI bus order, NVML's default enumeration
      Gpu g;
      g.index = index++;
      g.pci_bus_id = bus;
      complete(g);
      f.gpus.push_back(std::move(g));
    }
  }
  if (!f.versions.driver) {
    if (auto t = fs.read("/proc/driver/nvidia/version")) f.versions.driver = parse::nvidia_driver_version(*t);
  }
  if (!f.versions.driver) f.versions.driver = fs.read_line("/sys/module/nvidia/version");
  if (!f.versions.cuda_driver && fs.is_live() && opt.load_libraries && f.versions.driver)
    f.versions.cuda_driver = native::query_cuda_driver();
}

std::map<std::string, std::vector<std::string>> live_addresses() {
  std::map<std::string, std::vector<std::string>> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (auto* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || !a->ifa_name) continue;
    char buf[INET6_ADDRSTRLEN] = {};
    int prefix = 0;
    auto bits = [](const unsigned char* p, std::size_t n) {
      int c = 0;
      for (std::size_t i = 0; i < n; ++i) c += __builtin_popcount(p[i]);
      return c;
    };
    if (a->ifa_addr->sa_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf);
      if (a->ifa_netmask)
        prefix =
            bits(reinterpret_cast<const unsigned char*>(&reinterpret_cast<sockaddr_in*>(a->ifa_netmask)->sin_addr), 4);
    } else if (a->ifa_addr->sa_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr, buf, sizeof buf);
      if (a->ifa_netmask)
        prefix = bits(
            reinterpret_cast<const unsigned char*>(&reinterpret_cast<sockaddr_in6*>(a->ifa_netmask)->sin6_addr), 16);
    } else {
      continue;
    }
    out[a->ifa_name].push_back(std::string(buf) + "/" + std::to_string(prefix));
  }
  freeifaddrs(list);
  return out;
}

void discover_nics(const FsRoot& fs, NodeFacts& f) {
  std::set<std::string> hca_netdevs, hca_buses;
  // Netdevs that sit on one PCI function, from the function's net/ directory.
  auto netdevs_of = [&](const std::string& dev_dir) { return fs.list(dev_dir + "/net"); };

  for (const auto& hca : fs.list("/sys/class/infiniband")) {
    std::string dir = "/sys/class/infiniband/" + hca;
    auto dev_path = fs.resolve(dir + "/device");
    auto bus = dev_path ? parse::last_pci_bus_id(*dev_path) : std::nullopt;
    PciInfo p;
    if (bus) {
      p = pci_info(fs, *bus);
      hca_buses.insert(*bus);
    }
    auto netdevs = netdevs_of(dir + "/device");
    auto ports = fs.list(dir + "/ports");
    for (const auto& port : ports) {
      auto port_no = parse_int(port);
      if (!port_no || *port_no < 1 || *port_no > 255) continue;
      std::string pdir = dir + "/ports/" + port;
      Nic n;
      n.name = hca;
      n.kind = NicKind::ib;
      n.port = static_cast<int>(*port_no);
      if (auto ll = fs.read_line(pdir + "/link_layer")) n.link_layer = parse::ib_state(*ll);  // lowercases
      if (auto st = fs.read_line(pdir + "/state")) n.state = parse::ib_state(*st);
      if (auto r = fs.read_line(pdir + "/rate")) n.speed_mbps = parse::ib_rate_mbps(*r);
      // The port's netdev: RoCE names it in gid_attrs; else the function's netdev whose
      // dev_port is port-1 (or the only one).
      if (auto nd = fs.read_line(pdir + "/gid_attrs/ndevs/0")) n.netdev = *nd;
      for (const auto& nd : netdevs) {
        if (n.netdev) break;
        auto dp = fs.read_line("/sys/class/net/" + nd + "/dev_port");
        if (netdevs.size() == 1 || (dp && parse_int(*dp) == *port_no - 1)) n.netdev = nd;
      }
      if (n.netdev) hca_netdevs.insert(*n.netdev);
      if (bus) {
        n.pci_bus_id = bus;
        n.numa_node = p.numa_node;
        n.local_cpus = p.local_cpus;
        n.sysfs_path = p.sysfs_path;
      }
      f.nics.push_back(std::move(n));
    }
    for (const auto& nd : netdevs) hca_netdevs.insert(nd);
  }

  for (const auto& ifname : fs.list("/sys/class/net")) {
    std::string dir = "/sys/class/net/" + ifname;
    if (ifname == "lo" || hca_netdevs.count(ifname)) continue;
    auto dev_path = fs.resolve(dir + "/device");
    if (!dev_path) continue;  // virtual: bridge, veth, bond, tunnel, ifb
    if (auto type = fs.read_line(dir + "/type"); !type || parse_int(*type) != 1) continue;  // ARPHRD_ETHER only
    Nic n;
    n.name = ifname;
    n.kind = NicKind::eth;
    n.netdev = ifname;
    if (auto st = fs.read_line(dir + "/operstate")) n.state = *st;
    if (auto sp = fs.read_line(dir + "/speed")) {
      if (auto v = parse_int(*sp); v && *v > 0) n.speed_mbps = static_cast<std::uint64_t>(*v);
    }
    if (auto bus = parse::last_pci_bus_id(*dev_path)) {
      if (hca_buses.count(*bus)) continue;  // an HCA's Ethernet side, listed with the HCA
      auto p = pci_info(fs, *bus);
      n.pci_bus_id = bus;
      n.numa_node = p.numa_node;
      n.local_cpus = p.local_cpus;
      n.sysfs_path = p.sysfs_path;
    }
    f.nics.push_back(std::move(n));
  }

  if (fs.is_live()) {
    auto addrs = live_addresses();
    for (auto& n : f.nics) {
      if (n.netdev)
        if (auto it = addrs.find(*n.netdev); it != addrs.end()) n.addresses = it->second;
    }
  }
}

void discover_limits(const FsRoot& fs, NodeFacts& f) {
  if (auto t = fs.read("/proc/self/limits")) {
    f.limits.memlock = parse::proc_limit(*t, "Max locked memory");
    f.limits.nofile = parse::proc_limit(*t, "Max open files");
  }
  if (fs.is_live()) {
    struct statvfs sv {};
    if (statvfs("/dev/shm", &sv) == 0) f.limits.shm_bytes = static_cast<std::uint64_t>(sv.f_blocks) * sv.f_frsize;
  } else if (auto m = fs.read("/proc/mounts", 1 << 20)) {
    f.limits.shm_bytes = parse::tmpfs_size(*m, "/dev/shm");
    // A tmpfs mounted without size= gets half of RAM (the kernel's default).
    bool mounted = m->find(" /dev/shm tmpfs ") != std::string::npos;
    if (!f.limits.shm_bytes && mounted) {
      if (auto mi = fs.read("/proc/meminfo")) {
        for (auto line : split(*mi, '\n')) {
          if (!starts_with(line, "MemTotal:")) continue;
          auto rest = trim(line.substr(9));
          if (auto kb = parse_int(rest.substr(0, rest.find(' '))); kb && *kb > 0)
            f.limits.shm_bytes = static_cast<std::uint64_t>(*kb) * 1024 / 2;
        }
      }
    }
  }
}

void discover_runtimes(const FsRoot& fs, NodeFacts& f) {
  std::vector<std::string> dirs{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"};
  if (fs.is_live()) {
    if (const char* path = std::getenv("PATH"))
      for (auto d : split(path, ':'))
        if (!d.empty() && d.front() == '/') dirs.emplace_back(d);
  }
  // Reported name -> binaries that show it is installed.
  const std::vector<std::pair<std::string, std::vector<std::string>>> known{
      {"docker", {"docker"}},       {"podman", {"podman"}},
      {"apptainer", {"apptainer"}}, {"singularity", {"singularity"}},
      {"enroot", {"enroot"}},       {"nvidia-container-toolkit", {"nvidia-container-cli", "nvidia-ctk"}},
  };
  std::vector<std::string> found;
  for (const auto& [name, bins] : known) {
    bool has = false;
    for (const auto& b : bins)
      for (const auto& d : dirs)
        if (!has && fs.exists(d + "/" + b)) has = true;
    if (has) found.push_back(name);
  }
  f.container_runtimes = std::move(found);
}

std::optional<std::string> discover_torch(const FsRoot& fs) {
  std::vector<std::string> candidates{"/usr/lib/python3/dist-packages"};
  for (const auto* base : {"/usr/local/lib", "/usr/lib"}) {
    for (const auto& d : fs.list(base)) {
      if (!starts_with(d, "python3")) continue;
      candidates.push_back(std::string(base) + "/" + d + "/dist-packages");
      candidates.push_back(std::string(base) + "/" + d + "/site-packages");
    }
  }
  for (const auto& c : candidates) {
    if (auto t = fs.read(c + "/torch/version.py")) {
      if (auto v = parse::torch_version(*t)) return v;
    }
  }
  return std::nullopt;
}

}  // namespace

DiscoverOptions discover_options_from_env() {
  DiscoverOptions o;
  if (const char* r = std::getenv("DDP_SYSFS_ROOT"); r && *r) o.root = r;
  return o;
}

NodeFacts discover(const DiscoverOptions& opt) {
  auto log = ddp::log::get("facts");
  FsRoot fs(opt.root);
  NodeFacts f;
  f.sources.push_back(fs.is_live() ? "sysfs" : "sysfs-root:" + fs.root().string());
  f.hostname = fs.read_line("/proc/sys/kernel/hostname").value_or("");
  if (f.hostname.empty() && fs.is_live()) {
    char buf[256] = {};
    if (gethostname(buf, sizeof buf - 1) == 0) f.hostname = buf;
  }
  if (f.hostname.empty()) f.hostname = "localhost";
  f.versions.kernel = fs.read_line("/proc/sys/kernel/osrelease");
  f.numa_nodes = discover_numa(fs);
  discover_gpus(fs, opt, f);
  discover_nics(fs, f);
  if (opt.topology_only) {
    log->debug("discovered the topology of {}: {} NUMA node(s), {} GPU(s), {} NIC(s)", f.hostname, f.numa_nodes.size(),
               f.gpus.size(), f.nics.size());
    return f;
  }
  if (fs.is_live() && opt.load_libraries) {
    if (auto n = native::query_nccl(opt.nccl_library)) {
      f.versions.nccl = n->version;
      f.versions.nccl_library = n->library;
      f.sources.push_back("libnccl");
    }
  }
  f.versions.torch = discover_torch(fs);
  discover_limits(fs, f);
  discover_runtimes(fs, f);
  log->debug("discovered {}: {} NUMA node(s), {} GPU(s), {} NIC(s)", f.hostname, f.numa_nodes.size(), f.gpus.size(),
             f.nics.size());
  return f;
}

}  // namespace ddp::facts

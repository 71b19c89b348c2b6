// See elf.hpp. Layouts from <elf.h> (ELF-64 only: every platform PyTorch runs on).
#include "stacks/elf.hpp"

#include <elf.h>

#include <algorithm>
#include <charconv>
#include <cstring>

namespace ddp::stacks {

namespace {

std::optional<std::uint64_t> hex(std::string_view s) {
  std::uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 16);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

std::string_view next_field(std::string_view& line) {
  while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
  auto sp = line.find(' ');
  auto f = line.substr(0, sp);
  line.remove_prefix(sp == std::string_view::npos ? line.size() : sp);
  return f;
}

constexpr int kMaxPhdrs = 64;
constexpr int kMaxDyn = 4096;
constexpr int kMaxChainSteps = 1 << 20;

}  // namespace

std::vector<Mapping> parse_maps(std::string_view text) {
  std::vector<Mapping> out;
  while (!text.empty()) {
    auto nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    auto range = next_field(line);
    auto perms = next_field(line);
    auto offset = next_field(line);
    next_field(line);  // device
    next_field(line);  // inode
    while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    auto dash = range.find('-');
    if (dash == std::string_view::npos) continue;
    auto start = hex(range.substr(0, dash)), end = hex(range.substr(dash + 1)), off = hex(offset);
    if (!start || !end || !off || perms.size() != 4) continue;
    out.push_back(Mapping{*start, *end, *off, std::string(perms), std::string(line)});
  }
  return out;
}

std::uint32_t gnu_hash(std::string_view name) {
  std::uint32_t h = 5381;
  for (unsigned char c : name) h = h * 33 + c;
  return h;
}

std::uint32_t sysv_hash(std::string_view name) {
  std::uint32_t h = 0;
  for (unsigned char c : name) {
    h = (h << 4) + c;
    std::uint32_t g = h & 0xf0000000u;
    if (g) h ^= g >> 24;
    h &= ~g;
  }
  return h;
}

std::optional<std::uint64_t> find_dynamic_symbol(Memory& mem, std::uint64_t base, std::string_view name) {
  auto eh = mem.get<Elf64_Ehdr>(base);
  if (!eh || std::memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64) return std::nullopt;
  if (eh->e_phentsize != sizeof(Elf64_Phdr) || eh->e_phnum == 0 || eh->e_phnum > kMaxPhdrs) return std::nullopt;
  std::vector<Elf64_Phdr> ph(eh->e_phnum);
  if (!mem.read(base + eh->e_phoff, ph.data(), ph.size() * sizeof(Elf64_Phdr))) return std::nullopt;

  // The load bias: where the lowest PT_LOAD landed minus where it asked to be (0 for ET_EXEC).
  std::optional<std::uint64_t> lowest;
  const Elf64_Phdr* dynamic = nullptr;
  for (const auto& p : ph) {
    if (p.p_type == PT_LOAD) lowest = std::min(lowest.value_or(p.p_vaddr), p.p_vaddr);
    if (p.p_type == PT_DYNAMIC) dynamic = &p;
  }
  if (!lowest || !dynamic) return std::nullopt;
  const std::uint64_t bias = base - (*lowest & ~std::uint64_t{0xfff});

  const std::size_t ndyn = std::min<std::uint64_t>(dynamic->p_memsz / sizeof(Elf64_Dyn), kMaxDyn);
  std::vector<Elf64_Dyn> dyn(ndyn);
  if (ndyn == 0 || !mem.read(bias + dynamic->p_vaddr, dyn.data(), ndyn * sizeof(Elf64_Dyn))) return std::nullopt;
  std::uint64_t symtab = 0, strtab = 0, strsz = 0, gnuhash = 0, sysvhash = 0;
  for (const auto& d : dyn) {
    if (d.d_tag == DT_NULL) break;
    switch (d.d_tag) {
      case DT_SYMTAB:
        symtab = d.d_un.d_ptr;
        break;
      case DT_STRTAB:
        strtab = d.d_un.d_ptr;
        break;
      case DT_STRSZ:
        strsz = d.d_un.d_val;
        break;
      case DT_GNU_HASH:
        gnuhash = d.d_un.d_ptr;
        break;
      case DT_HASH:
        sysvhash = d.d_un.d_ptr;
        break;
      default:
        break;
    }
  }
  // glibc's loader rewrites these to run-time addresses on most architectures (not where the
  // dynamic section is read-only, e.g. RISC-V): an address below the bias was not rewritten.
  auto rt = [&](std::uint64_t a) { return a != 0 && a < bias ? a + bias : a; };
  symtab = rt(symtab), strtab = rt(strtab), gnuhash = rt(gnuhash), sysvhash = rt(sysvhash);
  if (!symtab || !strtab) return std::nullopt;

  auto matches = [&](std::uint32_t index) -> std::optional<std::uint64_t> {
    auto sym = mem.get<Elf64_Sym>(symtab + std::uint64_t{index} * sizeof(Elf64_Sym));
    if (!sym || sym->st_shndx == SHN_UNDEF || sym->st_value == 0) return std::nullopt;
    if (strsz && sym->st_name + name.size() >= strsz) return std::nullopt;
    std::string buf(name.size() + 1, '\0');
    if (!mem.read(strtab + sym->st_name, buf.data(), buf.size())) return std::nullopt;
    if (std::string_view(buf.data(), name.size()) != name || buf[name.size()] != '\0') return std::nullopt;
    return eh->e_type == ET_DYN ? sym->st_value + bias : sym->st_value;
  };

  if (gnuhash) {
    struct {
      std::uint32_t nbuckets, symoffset, bloom_size, bloom_shift;
    } h{};
    if (!mem.read(gnuhash, &h, sizeof h) || h.nbuckets == 0) return std::nullopt;
    const std::uint32_t hash = gnu_hash(name);
    const std::uint64_t buckets = gnuhash + 16 + std::uint64_t{h.bloom_size} * 8;
    const std::uint64_t chains = buckets + std::uint64_t{h.nbuckets} * 4;
    auto idx = mem.get<std::uint32_t>(buckets + std::uint64_t{hash % h.nbuckets} * 4);
    if (!idx || *idx < h.symoffset) return std::nullopt;
    for (std::uint32_t i = *idx, steps = 0; steps < kMaxChainSteps; ++i, ++steps) {
      auto c = mem.get<std::uint32_t>(chains + std::uint64_t{i - h.symoffset} * 4);
      if (!c) return std::nullopt;
      if ((*c | 1) == (hash | 1)) {
        if (auto v = matches(i)) return v;
      }
      if (*c & 1) break;
    }
    return std::nullopt;
  }
  if (sysvhash) {
    struct {
      std::uint32_t nbucket, nchain;
    } h{};
    if (!mem.read(sysvhash, &h, sizeof h) || h.nbucket == 0) return std::nullopt;
    auto i = mem.get<std::uint32_t>(sysvhash + 8 + std::uint64_t{sysv_hash(name) % h.nbucket} * 4);
    for (int steps = 0; i && *i != STN_UNDEF && *i < h.nchain && steps < kMaxChainSteps; ++steps) {
      if (auto v = matches(*i)) return v;
      i = mem.get<std::uint32_t>(sysvhash + 8 + std::uint64_t{h.nbucket} * 4 + std::uint64_t{*i} * 4);
    }
  }
  return std::nullopt;
}

}  // namespace ddp::stacks

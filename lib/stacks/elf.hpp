// Finding a symbol of a module that a process has mapped, from the process's own memory: the
// ELF header and program headers of its first mapping, the dynamic section, then the GNU (or
// SysV) hash table of its dynamic symbols. No file is opened: a root reader never parses a file
// that the job can replace, and a container's files need no path translation. CPython exports
// `_PyRuntime` and `Py_Version` dynamically (the interpreter links with -export-dynamic so that
// extension modules can bind to it), so the dynamic table is enough.
#pragma once

#include "stacks/memory.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::stacks {

struct Mapping {
  std::uint64_t start = 0, end = 0, offset = 0;
  std::string perms;  // "r-xp"
  std::string path;   // "" for anonymous
};

// /proc/PID/maps, parsed; lines that do not parse are skipped. Pure.
std::vector<Mapping> parse_maps(std::string_view text);

// The address of the defined dynamic symbol `name` of the ELF image whose first byte (its ELF
// header, file offset 0) is mapped at `base`; nullopt when it is not there or the image does not
// make sense. Bounded: at most 64 program headers, 4096 dynamic entries, 1<<20 chain steps.
std::optional<std::uint64_t> find_dynamic_symbol(Memory& mem, std::uint64_t base, std::string_view name);

// The hash functions of the two tables (exposed for the synthetic images of the unit tests).
std::uint32_t gnu_hash(std::string_view name);
std::uint32_t sysv_hash(std::string_view name);

}  // namespace ddp::stacks

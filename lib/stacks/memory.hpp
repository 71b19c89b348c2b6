// Reading another process's memory, behind an interface so that the frame walker (cpython.hpp)
// and the ELF symbol lookup (elf.hpp) run over synthetic images in unit tests.
//
// Policy: the target keeps running. Every read may race with the target changing the bytes;
// callers treat every value read as untrusted (bounded lengths, depth limits, pointers checked
// before use), never as a reason to crash or to allocate without a bound.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

namespace ddp::stacks {

class Memory {
 public:
  virtual ~Memory() = default;
  // Reads exactly n bytes at addr; false when any of them cannot be read.
  virtual bool read(std::uint64_t addr, void* out, std::size_t n) = 0;

  template <typename T>
  std::optional<T> get(std::uint64_t addr) {
    T v{};
    if (!read(addr, &v, sizeof v)) return std::nullopt;
    return v;
  }
};

// process_vm_readv on a live process: needs the same rights as ptrace (PTRACE_MODE_ATTACH), but
// never stops the target.
class ProcessMemory : public Memory {
 public:
  explicit ProcessMemory(pid_t pid) : pid_(pid) {}
  bool read(std::uint64_t addr, void* out, std::size_t n) override;
  int reads() const { return reads_; }
  int last_errno() const { return last_errno_; }

 private:
  pid_t pid_;
  int reads_ = 0;
  int last_errno_ = 0;
};

}  // namespace ddp::stacks

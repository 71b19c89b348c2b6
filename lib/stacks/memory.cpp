// See memory.hpp.
#include "stacks/memory.hpp"

#include <sys/uio.h>

#include <cerrno>

namespace ddp::stacks {

bool ProcessMemory::read(std::uint64_t addr, void* out, std::size_t n) {
  if (n == 0) return true;
  ++reads_;
  iovec local{out, n};
  iovec remote{reinterpret_cast<void*>(addr), n};
  const ssize_t got = process_vm_readv(pid_, &local, 1, &remote, 1, 0);
  if (got < 0) last_errno_ = errno;
  return got == static_cast<ssize_t>(n);
}

}  // namespace ddp::stacks

// A synthetic process image for the stacks unit tests: regions of bytes at chosen addresses,
// read through the same Memory interface as a live process.
#pragma once

#include "stacks/memory.hpp"

#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace ddp::stacks::test {

class Image : public Memory {
 public:
  bool read(std::uint64_t addr, void* out, std::size_t n) override {
    ++reads;
    auto it = regions_.upper_bound(addr);
    if (it == regions_.begin()) return false;
    --it;
    const auto& [start, bytes] = *it;
    if (addr + n > start + bytes.size()) return false;
    std::memcpy(out, bytes.data() + (addr - start), n);
    return true;
  }
  // A fresh zeroed region of n bytes; its address.
  std::uint64_t alloc(std::size_t n) {
    const std::uint64_t a = next_;
    regions_[a].resize(n);
    next_ += (n + 0x100) & ~std::uint64_t{0xff};
    return a;
  }
  void place(std::uint64_t addr, std::vector<std::uint8_t> bytes) { regions_[addr] = std::move(bytes); }
  template <typename T>
  void put(std::uint64_t addr, T v) {
    auto it = --regions_.upper_bound(addr);
    std::memcpy(it->second.data() + (addr - it->first), &v, sizeof v);
  }
  void put_bytes(std::uint64_t addr, const void* p, std::size_t n) {
    auto it = --regions_.upper_bound(addr);
    std::memcpy(it->second.data() + (addr - it->first), p, n);
  }
  int reads = 0;

 private:
  std::map<std::uint64_t, std::vector<std::uint8_t>> regions_;
  std::uint64_t next_ = 0x10000;
};

}  // namespace ddp::stacks::test

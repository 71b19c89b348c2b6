// Shared helpers for the facts tests: where the fixtures are, and scratch sysfs trees.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

namespace facts_test {

inline std::filesystem::path source_dir() {
  const char* s = std::getenv("DDP_SOURCE_DIR");
  return s ? std::filesystem::path(s) : std::filesystem::path(DDP_FALLBACK_SOURCE_DIR);
}
inline std::filesystem::path sysfs_fixture(const std::string& name) {
  return source_dir() / "tests/fixtures/sysfs" / name;
}
inline std::filesystem::path facts_fixture(const std::string& name) {
  return source_dir() / "tests/fixtures/facts" / (name + ".json");
}

// A temporary directory tree, removed when the object goes.
class ScratchTree {
 public:
  ScratchTree() {
    std::random_device rd;
    root_ = std::filesystem::temp_directory_path() / ("facts-test-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(root_);
  }
  ~ScratchTree() {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  ScratchTree(const ScratchTree&) = delete;
  ScratchTree& operator=(const ScratchTree&) = delete;

  const std::filesystem::path& root() const { return root_; }
  void write(const std::string& path, const std::string& text) const {
    auto p = root_ / path;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  void link(const std::string& path, const std::string& target) const {
    auto p = root_ / path;
    std::filesystem::create_directories(p.parent_path());
    std::filesystem::create_directory_symlink(target, p);
  }

 private:
  std::filesystem::path root_;
};

}  // namespace facts_test

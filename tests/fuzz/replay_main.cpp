// Runs a fuzz target's corpus once (no libFuzzer needed): every file under the given files or
// folders is passed to LLVMFuzzerTestOneInput. A crash or abort fails the ctest.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::size_t runs = 0;
  auto run = [&](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    ++runs;
  };
  for (int i = 1; i < argc; ++i) {
    fs::path arg(argv[i]);
    if (fs::is_directory(arg)) {
      for (const auto& e : fs::recursive_directory_iterator(arg)) {
        if (e.is_regular_file()) run(e.path());
      }
    } else if (fs::exists(arg)) {
      run(arg);
    } else {
      std::cerr << "no such corpus: " << arg << "\n";
      return 1;
    }
  }
  std::cout << "replayed " << runs << " inputs\n";
  return runs > 0 ? 0 : 1;
}

// The NCCL loader's failure messages (no NCCL needed) and version decoding.
#include "nccl/library.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>
#include <cstdlib>
#include <fstream>

using namespace ddp::nccl;
using ::testing::HasSubstr;

TEST(NcclVersion, DecodesBothEncodings) {
  EXPECT_EQ(version_string(22809), "2.28.9");
  EXPECT_EQ(version_string(21803), "2.18.3");
  EXPECT_EQ(version_string(20900), "2.9.0");
  EXPECT_EQ(version_string(2804), "2.8.4");
  EXPECT_EQ(version_string(2708), "2.7.8");
}

TEST(NcclLoader, BogusExplicitPathSaysWhereAndWhy) {
  try {
    Library::load({.path = "/nonexistent/ddp-test/libnccl.so.2", .hint = "install NCCL or set nccl.unique_id: off"});
    FAIL() << "loaded a library that does not exist";
  } catch (const LoadError& e) {
    std::string msg = e.what();
    EXPECT_THAT(msg, HasSubstr("cannot load NCCL from /nonexistent/ddp-test/libnccl.so.2"));
    EXPECT_THAT(msg, HasSubstr("No such file"));
    EXPECT_THAT(msg, HasSubstr("install NCCL or set nccl.unique_id: off"));
  }
}

TEST(NcclLoader, NotALibrary) {
  char path[] = "/tmp/ddp-nccl-test-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "not an ELF file\n", 16), 16);
  close(fd);
  try {
    Library::load({.path = path});
    FAIL() << "loaded a text file";
  } catch (const LoadError& e) {
    EXPECT_THAT(e.what(), HasSubstr(std::string("cannot load NCCL from ") + path));
  }
  unlink(path);
}

TEST(NcclLoader, LibraryWithoutNcclSymbols) {
  // libc is a real shared object that lacks every NCCL entry point.
  try {
    Library::load({.path = "libc.so.6"});
    FAIL() << "accepted libc as NCCL";
  } catch (const LoadError& e) {
    EXPECT_THAT(e.what(), HasSubstr("is not a usable NCCL 2 library: missing ncclGetVersion"));
  }
}

TEST(NcclLoader, FindsSystemNcclWhenPresent) {
  // Exercises the search path for real where NCCL is installed (this project's machines); a
  // machine without it must give the "not found on this node" message instead.
  try {
    Library lib = Library::load();
    EXPECT_GE(lib.version_code(), 20000);
    EXPECT_FALSE(lib.path().empty());
  } catch (const LoadError& e) {
    EXPECT_THAT(e.what(), HasSubstr("libnccl.so.2 not found on this node (LD_LIBRARY_PATH="));
  }
}

// The report's edge: a rank's error file read, the result file written.
#include "attempt/files.hpp"

#include <gtest/gtest.h>

#include <stdlib.h>

#include <filesystem>
#include <fstream>

using namespace ddp::launch;

TEST(ReportFiles, MissingErrorFile) {
  EXPECT_FALSE(read_error_file("/nonexistent/e.json"));
}

TEST(ReportFiles, AResultFileWithABadByteIsWrittenNotThrown) {
  char tmpl[] = "/tmp/ddp-result-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  const auto path = dir + "/result.json";
  nlohmann::json report{{"notes", {std::string("rank 0: \xff\xfe")}}};
  std::optional<std::string> err;
  EXPECT_NO_THROW(err = write_result_file(path, report));
  EXPECT_FALSE(err) << *err;
  std::ifstream f(path);
  const auto back = nlohmann::json::parse(f);
  EXPECT_EQ(back.at("notes").at(0).get<std::string>(), "rank 0: \xef\xbf\xbd\xef\xbf\xbd");
  std::filesystem::remove_all(dir);
}

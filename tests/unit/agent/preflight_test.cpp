// The preflight helper (root, `ddp-agentd preflight`): whatever it is fed, it answers one line
// of JSON and never terminates on a throw.
#include "agent/preflight.hpp"

#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include <sstream>

TEST(PreflightHelper, InvalidUtf8InTheRequestIsAnErrorNotATerminate) {
  // nlohmann quotes the bad byte in its parse error, which went into the answer's "error" and
  // made the final strict dump() throw outside the try.
  std::istringstream in("{\"mode\":\"\xff\"}");
  std::ostringstream out;
  EXPECT_EQ(ddp::agent::run_preflight_helper(in, out), 0);
  const auto answer = nlohmann::json::parse(out.str());
  EXPECT_NE(answer.at("error").get<std::string>().find("malformed"), std::string::npos) << out.str();
}

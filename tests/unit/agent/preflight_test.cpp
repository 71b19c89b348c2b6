// The preflight helper (root, `ddp-agentd preflight`): whatever it is fed, it answers one line
// of JSON and never terminates on a throw.
#include "agent/preflight.hpp"

#include <signal.h>
#include <sys/stat.h>
#include <boost/asio/io_context.hpp>
#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
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

// The helper runs as root: its own environment is the agent's, whatever the job's env: says (a
// job's DDP_NO_CGROUP once reached it, and took the commands it ran out of their cgroup). What it
// is given for the job's commands travels in the request.
TEST(PreflightRun, TheHelperKeepsTheAgentsEnvironmentNotTheJobs) {
  char dir[] = "/tmp/preflight-env-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string exe = std::string(dir) + "/helper";
  {
    std::ofstream f(exe);
    // It reads its request first, as the real helper does (else the request's write could meet a
    // closed pipe).
    f << "#!/bin/sh\ncat > /dev/null\nprintf '{\"job_var\": \"%s\", \"agent_var\": \"%s\"}\\n' "
         "\"$DDP_TEST_JOB_VAR\" \"$DDP_TEST_AGENT_VAR\"\n";
  }
  ASSERT_EQ(::chmod(exe.c_str(), 0755), 0);
  ::setenv("DDP_TEST_AGENT_VAR", "agent", 1);
  ::signal(SIGPIPE, SIG_IGN);  // as the agent does
  boost::asio::io_context io;
  nlohmann::json answer;
  const nlohmann::json request{{"mode", "python"}, {"env", {{"DDP_TEST_JOB_VAR", "job"}, {"PATH", "/usr/bin:/bin"}}}};
  auto run = ddp::agent::PreflightRun::start(io, exe, request, [&](const nlohmann::json& a) { answer = a; });
  io.run_for(std::chrono::seconds(20));
  ::unsetenv("DDP_TEST_AGENT_VAR");
  std::filesystem::remove_all(dir);
  EXPECT_EQ(answer.value("job_var", "?"), "") << answer.dump();
  EXPECT_EQ(answer.value("agent_var", "?"), "agent") << answer.dump();
}

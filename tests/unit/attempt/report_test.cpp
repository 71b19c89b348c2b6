#include "attempt/report.hpp"

#include <gtest/gtest.h>

#include <csignal>

using namespace ddp::launch;

TEST(Report, ParsesTorchelasticErrorFile) {
  auto ef = parse_error_file(
      "/x/rank-1.error.json",
      R"({"message": {"message": "RuntimeError: boom", "extraInfo": {"py_callstack": "Traceback...\n  line 3", "timestamp": "1700000000"}}})");
  ASSERT_TRUE(ef);
  EXPECT_EQ(ef->message, "RuntimeError: boom");
  EXPECT_EQ(ef->traceback, "Traceback...\n  line 3");
  EXPECT_TRUE(ef->raw.empty());
}

TEST(Report, KeepsUnknownShapesRaw) {
  auto ef = parse_error_file("/x", "not json at all");
  ASSERT_TRUE(ef);
  EXPECT_EQ(ef->raw, "not json at all");
  auto ef2 = parse_error_file("/x", R"({"message": "plain"})");
  EXPECT_EQ(ef2->message, "plain");
}

TEST(Report, FormatNamesTheFirstFailure) {
  AttemptReport a;
  a.attempt = 0;
  a.phase = Phase::failed;
  WorkerExit e{2, 2, 4242, 1, 0, SysTime{}};
  a.first_failure = RankFailure{e,
                                "vm",
                                {"step 3", "ValueError: nan"},
                                ErrorFile{"/l/rank-2.error.json", "ValueError: nan", "tb", ""},
                                "/l/rank-2.log"};
  a.exits = {WorkerExit{0, 0, 1, 0, 15, SysTime{}}, e};
  a.log_dir = "/l";
  auto text = format_attempt(a, 0);
  EXPECT_NE(text.find("first failure: rank 2 (local rank 2, node vm, pid 4242) exited with code 1"), std::string::npos)
      << text;
  EXPECT_NE(text.find("| ValueError: nan"), std::string::npos);
  EXPECT_NE(text.find("rank 0 was killed by SIGTERM"), std::string::npos);
  EXPECT_NE(text.find("logs: /l"), std::string::npos);

  JobReport r{"job-1", "failed", 1, 0, {a}};
  auto j = to_json(r);
  EXPECT_EQ(j["status"], "failed");
  EXPECT_EQ(j["attempts"][0]["first_failure"]["rank"], 2);
  EXPECT_EQ(j["attempts"][0]["first_failure"]["exit_code"], 1);
  EXPECT_EQ(j["attempts"][0]["first_failure"]["error_file"]["message"], "ValueError: nan");
  EXPECT_EQ(j["attempts"][0]["exits"][0]["signal"], 15);
}

TEST(Report, AForwardedSignalIsNamedAndNoRankIsTheFirstFailure) {
  AttemptReport a;
  a.phase = Phase::failed;
  WorkerExit fw{2, 2, 4242, 0, SIGUSR1, SysTime{}};
  fw.forwarded = true;
  a.exits = {WorkerExit{0, 0, 1, 0, SIGTERM, SysTime{}}, fw};
  auto text = format_attempt(a, 0);
  EXPECT_EQ(text.find("first failure"), std::string::npos) << text;
  EXPECT_NE(text.find("no rank failed by itself: rank 0 was killed by SIGTERM, rank 2 was killed by SIGUSR1, which "
                      "ddpctl forwarded (it has no handler for it)"),
            std::string::npos)
      << text;
  JobReport r{"job-1", "failed", 1, 0, {a}};
  auto j = to_json(r);
  EXPECT_TRUE(j["attempts"][0]["first_failure"].is_null());
  EXPECT_EQ(j["attempts"][0]["exits"][1]["forwarded"], true);
  EXPECT_EQ(j["attempts"][0]["exits"][0]["forwarded"], false);
}

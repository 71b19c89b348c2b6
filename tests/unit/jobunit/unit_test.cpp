#include "jobunit/unit.hpp"

#include <gtest/gtest.h>

#include <cstdint>

using namespace ddp::jobunit;

namespace {

ShepherdUnit sample() {
  ShepherdUnit u;
  u.job_id = "train-1a2b";
  u.agent_pid = 4242;
  u.sequence = 3;
  u.argv = {"/usr/bin/ddp-agentd", "shepherd", "--agent-pid", "4242", "--job", "train-1a2b", "--in-unit"};
  u.env = {{"PATH", "/usr/bin:/bin"}, {"LANG", "C.UTF-8"}};
  u.stdin_fd = 7;
  u.stderr_fd = 2;
  u.limits = {{"MEMLOCK", UINT64_MAX, UINT64_MAX}, {"NOFILE", 1024, 1048576}};
  return u;
}

template <class T>
const T& get(const UnitRequest& r, const std::string& name) {
  const Value* v = r.find(name);
  if (!v) throw std::runtime_error("no property " + name);
  return std::get<T>(*v);
}

}  // namespace

TEST(JobUnit, ShepherdRunsInADelegatedServiceKilledAsAWhole) {
  const auto r = shepherd_unit(sample());
  EXPECT_EQ(r.name, "ddp-job-train-1a2b-4242-3.service");
  EXPECT_EQ(get<std::string>(r, "Type"), "exec");
  EXPECT_TRUE(get<bool>(r, "Delegate"));
  EXPECT_EQ(get<std::string>(r, "KillMode"), "control-group");
  EXPECT_EQ(get<std::string>(r, "Restart"), "no");
  EXPECT_EQ(get<std::string>(r, "CollectMode"), "inactive-or-failed");
  const auto& exec = get<std::vector<Exec>>(r, "ExecStart");
  ASSERT_EQ(exec.size(), 1u);
  EXPECT_EQ(exec[0].path, "/usr/bin/ddp-agentd");
  EXPECT_EQ(exec[0].argv, sample().argv);
  EXPECT_FALSE(exec[0].ignore_failure);
  EXPECT_NE(get<std::string>(r, "Description").find("train-1a2b"), std::string::npos);
}

TEST(JobUnit, NoUserAndNoHardeningOfTheAgentsCarriesOver) {
  const auto r = shepherd_unit(sample());
  // The shepherd stays root and drops each worker to the job's user itself.
  EXPECT_EQ(r.find("User"), nullptr);
  EXPECT_EQ(r.find("Group"), nullptr);
  for (const char* hardening : {"ProtectHome", "PrivateTmp", "ProtectSystem", "NoNewPrivileges", "PrivateDevices",
                                "MemoryDenyWriteExecute", "SystemCallFilter", "RestrictNamespaces"}) {
    EXPECT_EQ(r.find(hardening), nullptr) << hardening;
  }
}

TEST(JobUnit, ChannelEnvironmentAndLimitsAreTheAgents) {
  const auto r = shepherd_unit(sample());
  EXPECT_EQ(get<Fd>(r, "StandardInputFileDescriptor"), Fd{7});
  EXPECT_EQ(get<Fd>(r, "StandardOutputFileDescriptor"), Fd{2});
  EXPECT_EQ(get<Fd>(r, "StandardErrorFileDescriptor"), Fd{2});
  EXPECT_EQ(get<std::vector<std::string>>(r, "Environment"),
            (std::vector<std::string>{"LANG=C.UTF-8", "PATH=/usr/bin:/bin"}));
  // The agent unit's own variables stay behind.
  auto u = sample();
  u.env["INVOCATION_ID"] = "0123";
  u.env["NOTIFY_SOCKET"] = "/run/systemd/notify";
  u.env["WATCHDOG_USEC"] = "30000000";
  u.env["JOURNAL_STREAM"] = "8:1234";
  u.env["LOGS_DIRECTORY"] = "/var/log/ddpctl";
  EXPECT_EQ(get<std::vector<std::string>>(shepherd_unit(u), "Environment"),
            (std::vector<std::string>{"LANG=C.UTF-8", "PATH=/usr/bin:/bin"}));
  EXPECT_EQ(get<std::uint64_t>(r, "LimitMEMLOCK"), UINT64_MAX);
  EXPECT_EQ(get<std::uint64_t>(r, "LimitMEMLOCKSoft"), UINT64_MAX);
  EXPECT_EQ(get<std::uint64_t>(r, "LimitNOFILE"), 1048576u);
  EXPECT_EQ(get<std::uint64_t>(r, "LimitNOFILESoft"), 1024u);
}

// The agent stops its jobs in order on its own shutdown; systemd must not stop them first.
TEST(JobUnit, NotBoundToTheAgentsUnit) {
  const auto r = shepherd_unit(sample());
  EXPECT_EQ(r.find("BindsTo"), nullptr);
  EXPECT_EQ(r.find("PartOf"), nullptr);
}

TEST(JobUnit, NamesAreValidWhateverTheJobId) {
  EXPECT_EQ(unit_name("a b/c", 1, 2), "ddp-job-a\\x20b\\x2fc-1-2.service");
  EXPECT_EQ(unit_name("x:y_z.w", 10, 0), "ddp-job-x:y_z.w-10-0.service");
  const auto long_name = unit_name(std::string(300, '/'), 99999, 4000000000u);
  EXPECT_LE(long_name.size(), 255u);
  EXPECT_EQ(long_name.rfind("-99999-4000000000.service"), long_name.size() - 25);
  // Only what systemd accepts: letters, digits, ":-_.\\".
  for (char c : unit_name("é\n\t*?[]", 1, 1)) {
    EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c)) || std::string(":-_.\\").find(c) != std::string::npos) << c;
  }
}

// SSH mode's pure decisions: host keys (strict, accept-new, changed), which connection failures
// are retried and how long to wait, the agent binary to run, remote command lines, the probe's
// answer, and the stderr line splitter.
#include "ssh/policy.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

using namespace ddp::ssh;
using ddp::Millis;

namespace {

HostKeyFacts facts(int port = 22) {
  return HostKeyFacts{"n1", "n1.example", port, "SHA256:abcDEF", "ssh-ed25519", "/home/u/.ssh/known_hosts"};
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST(HostKey, KnownKeyIsAcceptedQuietly) {
  auto d = decide_host_key(KnownHost::ok, false, facts());
  EXPECT_TRUE(d.accept);
  EXPECT_FALSE(d.remember);
}

TEST(HostKey, UnknownKeyIsRefusedWithFingerprintAndHowToTrustIt) {
  for (auto state : {KnownHost::unknown, KnownHost::no_file}) {
    auto d = decide_host_key(state, false, facts());
    EXPECT_FALSE(d.accept);
    EXPECT_TRUE(has(d.message, "n1 (n1.example): unknown host key ssh-ed25519 SHA256:abcDEF")) << d.message;
    EXPECT_TRUE(has(d.message, "ssh-keyscan n1.example >> /home/u/.ssh/known_hosts")) << d.message;
    EXPECT_TRUE(has(d.message, "--ssh-accept-new")) << d.message;
    EXPECT_TRUE(has(d.message, "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub")) << d.message;
  }
}

TEST(HostKey, NonDefaultPortIsNamedAsSshToolsNameIt) {
  auto d = decide_host_key(KnownHost::unknown, false, facts(2222));
  EXPECT_TRUE(has(d.message, "ssh-keyscan -p 2222 n1.example")) << d.message;
  auto c = decide_host_key(KnownHost::changed, false, facts(2222));
  EXPECT_TRUE(has(c.message, "-R '[n1.example]:2222'")) << c.message;
}

TEST(HostKey, AcceptNewAddsOnlyUnknownKeys) {
  auto d = decide_host_key(KnownHost::unknown, true, facts());
  EXPECT_TRUE(d.accept);
  EXPECT_TRUE(d.remember);
  EXPECT_TRUE(has(d.message, "SHA256:abcDEF")) << d.message;
  for (auto state : {KnownHost::changed, KnownHost::other_type, KnownHost::error}) {
    auto r = decide_host_key(state, true, facts());
    EXPECT_FALSE(r.accept);
    EXPECT_FALSE(r.remember);
  }
}

TEST(HostKey, ChangedKeySaysItMayBeAnAttackAndHowToRemoveTheOldKey) {
  auto d = decide_host_key(KnownHost::changed, false, facts());
  EXPECT_FALSE(d.accept);
  EXPECT_TRUE(has(d.message, "HOST KEY CHANGED: it now offers ssh-ed25519 SHA256:abcDEF")) << d.message;
  EXPECT_TRUE(has(d.message, "ssh-keygen -f /home/u/.ssh/known_hosts -R n1.example")) << d.message;
  auto o = decide_host_key(KnownHost::other_type, false, facts());
  EXPECT_TRUE(has(o.message, "another type")) << o.message;
}

TEST(Retry, ClassifiesLibsshErrors) {
  EXPECT_EQ(classify_connect_error("Timeout connecting to 10.0.0.2"), ConnectFailure::timeout);
  EXPECT_EQ(classify_connect_error("Connection refused"), ConnectFailure::refused);
  EXPECT_EQ(classify_connect_error("Failed to resolve hostname nx (Name or service not known)"),
            ConnectFailure::unreachable);
  EXPECT_EQ(classify_connect_error("Socket error: disconnected"), ConnectFailure::dropped);
  EXPECT_EQ(classify_connect_error("Connection reset by peer"), ConnectFailure::dropped);
  EXPECT_EQ(classify_connect_error("Access denied. Authentication that can continue: publickey"),
            ConnectFailure::other);
}

TEST(Retry, AFailureThatIsNotRetriedSaysWhatToCheck) {
  // A refused connection: no sshd there, and how to see it with ssh itself.
  EXPECT_EQ(connect_hint(ConnectFailure::refused, "n1", 0, ""), "; no sshd listening on n1? check that `ssh n1` works");
  EXPECT_EQ(connect_hint(ConnectFailure::refused, "n1", 2222, "alice"),
            "; no sshd listening on n1:2222? check that `ssh -p 2222 alice@n1` works");
  EXPECT_TRUE(has(connect_hint(ConnectFailure::unreachable, "nx", 0, ""), "`ssh nx` works"));
  EXPECT_TRUE(has(connect_hint(ConnectFailure::timeout, "n1", 22, ""), "--ssh-timeout"));
  EXPECT_EQ(connect_hint(ConnectFailure::auth, "n1", 22, ""), "");  // its own message says what to do
}

TEST(Retry, OnlyDropsAreRetriedWithGrowingCappedDelays) {
  RetryPolicy p{5, Millis(200), Millis(1000)};
  EXPECT_EQ(retry_after(ConnectFailure::dropped, 1, 1.0, p), Millis(200));
  EXPECT_EQ(retry_after(ConnectFailure::dropped, 2, 1.0, p), Millis(400));
  EXPECT_EQ(retry_after(ConnectFailure::dropped, 3, 1.0, p), Millis(800));
  EXPECT_EQ(retry_after(ConnectFailure::dropped, 4, 1.0, p), Millis(1000));  // capped
  EXPECT_EQ(retry_after(ConnectFailure::dropped, 5, 1.0, p), std::nullopt);  // attempts spent
  EXPECT_EQ(retry_after(ConnectFailure::dropped, 1, 0.0, p), Millis(100));   // jitter: half to all
  for (auto f : {ConnectFailure::timeout, ConnectFailure::refused, ConnectFailure::unreachable, ConnectFailure::auth,
                 ConnectFailure::host_key, ConnectFailure::other}) {
    EXPECT_EQ(retry_after(f, 1, 0.5, p), std::nullopt);
  }
}

TEST(Commands, ShellQuoting) {
  EXPECT_EQ(shell_quote("ddp-agentd"), "ddp-agentd");
  EXPECT_EQ(shell_quote("a b"), "'a b'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quote("$(reboot)"), "'$(reboot)'");
  EXPECT_EQ(shell_quote(""), "''");
}

TEST(Commands, AgentCommandCarriesNoSecret) {
  // Connect-back names where to dial; the tag and the secret go on stdin, never here.
  EXPECT_EQ(agent_command("ddp-agentd", "n1", false, "10.0.0.1:40001"),
            "exec ddp-agentd --oneshot --stdio --name n1 --connect 10.0.0.1:40001");
  EXPECT_EQ(agent_command("ddp-agentd", "n1", false), "exec ddp-agentd --oneshot --stdio --name n1");
  EXPECT_EQ(agent_command("~/.cache/ddpctl/ab/ddp-agentd", "node 2", true),
            "exec ~/.cache/ddpctl/ab/ddp-agentd --oneshot --stdio --name 'node 2' -v");
}

TEST(Probe, ParsesEveryAnswerAndRefusesAnythingElse) {
  auto p = parse_probe("motd noise\narch=x86_64\nversion=ddp-agentd 0.1.0\nserver=10.0.0.2\ncached=abc\ncachedrun=x\n");
  EXPECT_EQ(p.arch, "x86_64");
  EXPECT_EQ(p.path_version, "ddp-agentd 0.1.0");
  EXPECT_EQ(p.server_address, "10.0.0.2");
  EXPECT_EQ(p.cached_sha256, "abc");
  EXPECT_EQ(p.cached_runs, "x");
  auto empty = parse_probe("arch=aarch64\nversion=\nserver=\ncached=\ncachedrun=\n");
  EXPECT_EQ(empty.path_version, "");
  EXPECT_THROW(parse_probe("arch=x86_64\n"), std::runtime_error);
  EXPECT_TRUE(has(probe_command("abc"), ".cache/ddpctl/abc/ddp-agentd"));
}

TEST(AgentChoice, PathThenCacheThenUploadWhenTheArchitectureMatches) {
  Probe p{"x86_64", "ddp-agentd 0.1.0", "10.0.0.2", "", ""};
  EXPECT_EQ(choose_agent(p, "ddp-agentd 0.1.0", "x86_64", "sha").kind, AgentChoice::Kind::on_path);
  p.path_version = "ddp-agentd 0.0.9";
  auto up = choose_agent(p, "ddp-agentd 0.1.0", "x86_64", "sha");
  EXPECT_EQ(up.kind, AgentChoice::Kind::upload);
  EXPECT_EQ(up.command, "~/.cache/ddpctl/sha/ddp-agentd");
  EXPECT_TRUE(has(up.reason, "its PATH has ddp-agentd 0.0.9")) << up.reason;
  p.cached_sha256 = "sha";
  p.cached_runs = "ddp-agentd 0.1.0";
  EXPECT_EQ(choose_agent(p, "ddp-agentd 0.1.0", "x86_64", "sha").kind, AgentChoice::Kind::cached);
  // Our copy is there but cannot run (a library missing): upload again, and the check after
  // the upload names what is missing.
  p.cached_runs = "error while loading shared libraries: libfmt.so.9";
  EXPECT_EQ(choose_agent(p, "ddp-agentd 0.1.0", "x86_64", "sha").kind, AgentChoice::Kind::upload);
  p.cached_runs = "ddp-agentd 0.1.0";
  p.cached_sha256 = "stale";
  EXPECT_EQ(choose_agent(p, "ddp-agentd 0.1.0", "x86_64", "sha").kind, AgentChoice::Kind::upload);
  p.arch = "aarch64";
  p.path_version = "";
  auto no = choose_agent(p, "ddp-agentd 0.1.0", "x86_64", "sha");
  EXPECT_EQ(no.kind, AgentChoice::Kind::impossible);
  EXPECT_TRUE(has(no.reason, "no ddp-agentd on its PATH, and its architecture (aarch64) differs from ours (x86_64)"))
      << no.reason;
}

TEST(LineSplitter, SplitsAcrossChunksAndBoundsLongLines) {
  LineSplitter s(8);
  EXPECT_EQ(s.feed("ab"), std::vector<std::string>{});
  EXPECT_EQ(s.feed("c\nde\n"), (std::vector<std::string>{"abc", "de"}));
  EXPECT_EQ(s.feed("0123456789"), std::vector<std::string>{"01234567"});
  EXPECT_EQ(s.flush(), std::optional<std::string>("89"));
  EXPECT_EQ(s.flush(), std::nullopt);
}

TEST(Relay, KeepsTheAgentsLevelAndMarksOtherLinesAsWarnings) {
  auto l = relay_line("ddpctl info [agent] job j round 1: starting 2 workers");
  EXPECT_EQ(l.level, RelayedLine::Level::info);
  EXPECT_EQ(l.text, "[agent] job j round 1: starting 2 workers");
  EXPECT_EQ(relay_line("ddpctl warning [agent] x").level, RelayedLine::Level::warn);
  EXPECT_EQ(relay_line("ddpctl error [agent] x").level, RelayedLine::Level::error);
  auto other = relay_line("sh: 1: ddp-agentd: not found");
  EXPECT_EQ(other.level, RelayedLine::Level::warn);
  EXPECT_EQ(other.text, "sh: 1: ddp-agentd: not found");
}

// A relayed line is printed on the user's terminal: the other end (an agent, a shell, whoever
// writes to the step) gets no escape sequence or carriage return onto it, and no line past the
// bound; tabs and UTF-8 read as written.
TEST(Relay, ShowsTheLineClean) {
  auto l = relay_line("ddpctl error [agent] \x1b]0;PWNED\x07\x1b[2J\rddpctl error [coordinator] forged");
  EXPECT_EQ(l.level, RelayedLine::Level::error);
  EXPECT_EQ(l.text, "[agent] ?]0;PWNED??[2J?ddpctl error [coordinator] forged");
  EXPECT_EQ(relay_line("Traceback:\tnœud \x1b[31m").text, "Traceback:\tnœud ?[31m");
  EXPECT_EQ(relay_line(std::string(100 * 1024, 'x')).text.size(), ddp::log::kMaxRelayedLineBytes);
}

// The no-SFTP upload command, run by a real sh with a scratch HOME: the bytes land at the
// destination, 0700, through the temporary name (none left), replacing an older file; a
// transfer cut short (stdin ends early) or with other bytes is never renamed into place; a
// directory name with shell metacharacters is data, not code.
TEST(Commands, ExecUploadWritesTheFileWithoutSftp) {
  char tmpl[] = "/tmp/ddp-upload-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string home = tmpl;
  auto write = [](const std::string& p, const std::string& bytes) {
    std::ofstream f(p, std::ios::binary);
    f << bytes;
  };
  auto read = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  auto sha256 = [&](const std::string& bytes) {
    write(home + "/h", bytes);
    const auto cmd = fmt::format("sha256sum {} > {}/h.out", shell_quote(home + "/h"), shell_quote(home));
    EXPECT_EQ(std::system(cmd.c_str()), 0);
    return read(home + "/h.out").substr(0, 64);
  };
  // sends `sent` while the command expects `expected`
  auto run = [&](const std::string& dir, const std::string& expected, const std::string& sent) {
    const auto sum = sha256(expected);
    write(home + "/run.sh", exec_upload_command(dir, "ddp-agentd", expected.size(), sum) + "\n");
    write(home + "/in", sent);
    const auto cmd = fmt::format("HOME={} sh {} < {}/in 2>/dev/null", shell_quote(home), shell_quote(home + "/run.sh"),
                                 shell_quote(home));
    return std::system(cmd.c_str());
  };
  std::string payload(100000, '\0');
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 7);
  ASSERT_EQ(run(".cache/ddpctl/abc", payload, payload), 0);
  const auto dest = home + "/.cache/ddpctl/abc/ddp-agentd";
  EXPECT_EQ(read(dest), payload);
  struct stat st {};
  ASSERT_EQ(::stat(dest.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(::stat((home + "/.cache/ddpctl/abc").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_NE(::access((home + "/.cache/ddpctl/abc/.ddp-agentd.part").c_str(), F_OK), 0);
  // Cut short, or the same length with other bytes: refused, the old file stays.
  EXPECT_NE(run(".cache/ddpctl/abc", "new bytes", "new by"), 0);
  EXPECT_NE(run(".cache/ddpctl/abc", "new bytes", "NEW BYTES"), 0);
  EXPECT_EQ(read(dest), payload);
  // A whole second upload replaces the first.
  ASSERT_EQ(run(".cache/ddpctl/abc", "new", "new"), 0);
  EXPECT_EQ(read(dest), "new");
  // Metacharacters in the folder name are not run.
  ASSERT_EQ(run("odd $(touch pwned) ';x", "z", "z"), 0);
  EXPECT_EQ(read(home + "/odd $(touch pwned) ';x/ddp-agentd"), "z");
  EXPECT_NE(::access((home + "/pwned").c_str(), F_OK), 0);
  std::filesystem::remove_all(home);
}

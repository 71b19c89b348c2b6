#include "control/log_merge.hpp"
#include "control/paths.hpp"
#include "control/protocol.hpp"
#include "control/server.hpp"

#include <boost/asio.hpp>

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

using namespace ddp::control;
using nlohmann::json;

TEST(ControlProtocol, RequestsRoundTrip) {
  for (const auto& r :
       {Request{Op::status, {}, false}, Request{Op::stop, {}, false}, Request{Op::logs, {0, 3}, true}}) {
    const auto line = encode_request(r);
    ASSERT_EQ(line.back(), '\n');
    const auto d = parse_request(line);
    EXPECT_EQ(d.op, r.op);
    EXPECT_EQ(d.ranks, r.ranks);
    EXPECT_EQ(d.follow, r.follow);
  }
}

TEST(ControlProtocol, BadRequestsSayWhy) {
  auto msg = [](std::string_view line) {
    try {
      parse_request(line);
    } catch (const ControlError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(msg("status"), "a request is one JSON object on one line");
  EXPECT_EQ(msg(R"({"op": 1})"), "a request needs \"op\": status, stop, logs or stacks");
  EXPECT_EQ(msg(R"({"op": "kill"})"), "unknown op 'kill' (status, stop, logs or stacks)");
  EXPECT_EQ(msg(R"({"op": "stacks", "follow": true})"), "'stacks' does not take 'follow'");
  EXPECT_EQ(msg(R"({"op": "logs", "native": true})"), "'logs' does not take 'native'");
  EXPECT_EQ(msg(R"({"op": "stacks", "native": 1})"), "'native' must be true or false");
  EXPECT_EQ(msg(R"({"op": "stop", "ranks": [1]})"), "'stop' does not take 'ranks'");
  EXPECT_EQ(msg(R"({"op": "logs", "ranks": [-1]})"), "'ranks' must be a list of rank numbers");
  EXPECT_EQ(msg(R"({"op": "logs", "follow": "yes"})"), "'follow' must be true or false");
  EXPECT_EQ(msg(std::string(kMaxRequestBytes + 1, ' ')), "request too long");
  for (const char* bad : {R"("x")", "-1", "1000001", "1.5", "true"})
    EXPECT_EQ(msg(std::string(R"({"op": "logs", "attempt": )") + bad + "}"),
              "'attempt' must be an attempt number (0 is the first) or \"all\"")
        << bad;
  EXPECT_EQ(msg(R"({"op": "stacks", "attempt": 1})"), "'stacks' does not take 'attempt'");
}

TEST(ControlProtocol, AnAttemptGoesOnlyWhenAskedFor) {
  // A launcher that knows no "attempt" refuses what it does not know: a plain request has none.
  EXPECT_FALSE(json::parse(encode_request(Request{Op::logs, {1}, false})).contains("attempt"));
  Request r{Op::logs, {1}, false};
  r.attempt = 3;
  EXPECT_EQ(json::parse(encode_request(r))["attempt"], 3);
  EXPECT_EQ(parse_request(encode_request(r)).attempt, 3);
  r.attempt = kEveryAttempt;
  EXPECT_EQ(json::parse(encode_request(r))["attempt"], "all");
  EXPECT_EQ(parse_request(encode_request(r)).attempt, kEveryAttempt);
}

TEST(ControlProtocol, StacksRequestRoundTrips) {
  Request r{Op::stacks, {0, 2, 3}, false, true};
  auto d = parse_request(encode_request(r));
  EXPECT_EQ(d.op, Op::stacks);
  EXPECT_EQ(d.ranks, r.ranks);
  EXPECT_TRUE(d.native);
}

TEST(ControlProtocol, RankLists) {
  EXPECT_EQ(parse_rank_list("0,3"), (std::set<int>{0, 3}));
  EXPECT_EQ(parse_rank_list("4-6,1"), (std::set<int>{1, 4, 5, 6}));
  EXPECT_EQ(parse_rank_list(" 0, 3,"), (std::set<int>{0, 3}));  // as typed
  EXPECT_THROW(parse_rank_list("a"), ControlError);
  EXPECT_THROW(parse_rank_list("3-1"), ControlError);
  EXPECT_THROW(parse_rank_list("-1"), ControlError);
  EXPECT_THROW(parse_rank_list("0-99999999"), ControlError);
}

TEST(ControlProtocol, RanksOutsideTheJob) {
  EXPECT_EQ(ranks_outside({}, 4), std::nullopt);
  EXPECT_EQ(ranks_outside({0, 3}, 4), std::nullopt);
  EXPECT_EQ(ranks_outside({3, 4}, 4), "the job has no rank 4 (it has ranks 0-3)");
  EXPECT_EQ(ranks_outside({1}, 1), "the job has no rank 1 (it has rank 0)");
  EXPECT_EQ(ranks_outside(parse_rank_list("0-20"), 2),
            "the job has no ranks 2, 3, 4, 5, 6, 7, 8, 9, and 11 more (it has ranks 0-1)");
}

TEST(ControlProtocol, LogLines) {
  auto l = parse_log_line("2026-12-02T10:30:00.123Z out| loss 0.5");
  ASSERT_TRUE(l);
  EXPECT_EQ(l->stream, "out");
  EXPECT_EQ(l->text, "loss 0.5");
  l = parse_log_line("2026-12-02T10:30:00.123Z err| Traceback: x| y");
  ASSERT_TRUE(l);
  EXPECT_EQ(l->stream, "err");
  EXPECT_EQ(l->text, "Traceback: x| y");
  EXPECT_FALSE(parse_log_line("2026-12-02T10:30:00.123Z ddp| started pid 4"));
  EXPECT_FALSE(parse_log_line("garbage"));
}

TEST(ControlProtocol, StatusAsText) {
  json s{{"job_id", "j1"},
         {"mode", "local"},
         {"pid", 42},
         {"started_unix_ms", 1000},
         {"state", "running"},
         {"attempt", 1},
         {"restarts", 1},
         {"max_restarts", 3},
         {"store", "127.0.0.1:29500"},
         {"nodes", {"vm"}},
         {"ranks",
          {{{"rank", 0}, {"node", "vm"}, {"pid", 100}, {"state", "running"}, {"last_output_age_s", 0.25}},
           {{"rank", 1},
            {"node", "vm"},
            {"pid", nullptr},
            {"state", "exited with code 1"},
            {"last_output_age_s", nullptr}}}},
         {"store_waiters", {"1/2 ranks waiting on `k` for 3 s (rank 0)"}}};
  const auto text = format_status(s, 61'000);
  EXPECT_NE(text.find("job j1 (local, ddpctl pid 42): running, attempt 1, restarts 1/3, up 60 s"), std::string::npos)
      << text;
  EXPECT_NE(text.find("store: 127.0.0.1:29500"), std::string::npos);
  EXPECT_NE(text.find("100  running"), std::string::npos) << text;
  EXPECT_NE(text.find("0.2 s ago"), std::string::npos) << text;
  EXPECT_NE(text.find("-  exited with code 1"), std::string::npos) << text;
  EXPECT_NE(text.find("never"), std::string::npos);
  EXPECT_NE(text.find("store waiters:\n  1/2 ranks waiting on `k` for 3 s (rank 0)"), std::string::npos) << text;
  s["store_waiters"] = json::array();
  EXPECT_NE(format_status(s, 61'000).find("store waiters: none"), std::string::npos);
}

// While a multi-node job's nodes join there is no store and no rank yet: the status says so
// instead of an empty `store:` line and a table header with no rows.
TEST(ControlProtocol, StatusBeforeTheRoundStarts) {
  json s{{"job_id", "j2"},
         {"mode", "nodes"},
         {"pid", 7},
         {"started_unix_ms", 1000},
         {"state", "round 1: waiting for nodes: 1/2 nodes joined; missing: n2"},
         {"attempt", 0},
         {"restarts", 0},
         {"max_restarts", 0},
         {"store", ""},
         {"nodes", {"n1", "n2"}},
         {"ranks", json::array()},
         {"store_waiters", json::array()}};
  const auto text = format_status(s, 3'000);
  EXPECT_NE(text.find("store: not up yet\n"), std::string::npos) << text;
  EXPECT_NE(text.find("ranks: none started yet\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("last output"), std::string::npos) << text;
  EXPECT_EQ(text.find("store waiters"), std::string::npos) << text;
}

namespace {
struct TempDir {
  std::filesystem::path p;
  TempDir() {
    char t[] = "/tmp/ddp-control-test-XXXXXX";
    p = ::mkdtemp(t);
  }
  ~TempDir() { std::filesystem::remove_all(p); }
};
}  // namespace

TEST(ControlPaths, PrivateFolderUnderXdgRuntimeDir) {
  TempDir d;
  ::setenv("XDG_RUNTIME_DIR", d.p.c_str(), 1);
  const auto dir = runtime_dir();
  EXPECT_EQ(dir, (d.p / "ddpctl").string());
  struct stat st {};
  ASSERT_EQ(::stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_EQ(socket_path(dir, "job-1"), dir + "/job-1.sock");
  EXPECT_THROW(socket_path(dir, std::string(200, 'x')), ControlError);
  EXPECT_TRUE(socket_jobs(dir).empty());
  // A folder others may write to is not used: the next candidate is.
  ::chmod(dir.c_str(), 0777);
  EXPECT_NE(runtime_dir(), dir);
  ::unsetenv("XDG_RUNTIME_DIR");
}

TEST(ControlPaths, EndRecordsRoundTripAndOldOnesAreSwept) {
  TempDir d;
  const auto dir = d.p.string();
  EXPECT_EQ(read_ended(dir, "job-1"), std::nullopt);
  Ended e;
  e.job_id = "job-1";
  e.status = "failed";
  e.exit_code = 1;
  e.ended_unix_ms = 1700000000123;
  e.logs = "/logs/job-1";
  e.result_json = "/logs/job-1/result.json";
  e.files = {{0, "/logs/job-1/attempt-0/rank-0.log"}, {1, "/logs/job-1/attempt-0/rank-1.log"}};
  record_ended(dir, e);
  struct stat st {};
  ASSERT_EQ(::stat((d.p / "job-1.ended").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto back = read_ended(dir, "job-1");
  ASSERT_TRUE(back);
  EXPECT_EQ(back->status, "failed");
  EXPECT_EQ(back->exit_code, 1);
  EXPECT_EQ(back->ended_unix_ms, 1700000000123);
  EXPECT_EQ(back->logs, e.logs);
  EXPECT_EQ(back->result_json, e.result_json);
  EXPECT_EQ(back->files, e.files);
  // Another job's record under this name, or a damaged one, is no record.
  std::filesystem::copy_file(d.p / "job-1.ended", d.p / "job-2.ended");
  EXPECT_EQ(read_ended(dir, "job-2"), std::nullopt);
  std::ofstream(d.p / "job-3.ended") << "{\"job_id\": \"job-3\"";
  EXPECT_EQ(read_ended(dir, "job-3"), std::nullopt);
  // Writing a record removes those (and leftover temporary files) older than 30 days, and only
  // those, in a walk that runs at most once an hour: right after one, nothing is looked at.
  const auto old = std::filesystem::file_time_type::clock::now() - std::chrono::hours(24 * 31);
  std::ofstream(d.p / "job-9.ended.tmp") << "{";
  std::filesystem::last_write_time(d.p / "job-9.ended.tmp", old);
  std::filesystem::last_write_time(d.p / "job-2.ended", old);
  e.job_id = "job-4";
  record_ended(dir, e);
  EXPECT_TRUE(std::filesystem::exists(d.p / "job-2.ended"));  // the walk ran with job-1's record
  std::filesystem::last_write_time(d.p / ".pruned",
                                   std::filesystem::file_time_type::clock::now() - std::chrono::minutes(61));
  e.job_id = "job-5";
  record_ended(dir, e);
  EXPECT_TRUE(read_ended(dir, "job-1"));
  EXPECT_TRUE(read_ended(dir, "job-4"));
  EXPECT_TRUE(read_ended(dir, "job-5"));
  EXPECT_FALSE(std::filesystem::exists(d.p / "job-2.ended"));
  EXPECT_FALSE(std::filesystem::exists(d.p / "job-9.ended.tmp"));
  // A marker dated in the future (a clock that ran ahead) does not stop the walk.
  std::filesystem::last_write_time(d.p / "job-4.ended", old);
  std::filesystem::last_write_time(d.p / ".pruned",
                                   std::filesystem::file_time_type::clock::now() + std::chrono::hours(24));
  e.job_id = "job-6";
  record_ended(dir, e);
  EXPECT_FALSE(std::filesystem::exists(d.p / "job-4.ended"));
  EXPECT_TRUE(read_ended(dir, "job-6"));
  forget_ended(dir, "job-1");
  EXPECT_EQ(read_ended(dir, "job-1"), std::nullopt);
}

TEST(ControlPaths, TheGuardiansRecordIsARecordOnceItsTimeIsFilledIn) {
  Ended e;
  e.job_id = "job-\"ended_unix_ms\": 4503599627370497";  // the mark, in a value: escaped, not found
  e.status = "failed";
  e.exit_code = -1;
  e.logs = "/logs/x";
  e.files = {{0, "/logs/x/attempt-0/rank-0.log"}};
  e.message = "ddpctl (pid 7) died while the job ran";
  const auto t = ended_text(e);
  EXPECT_EQ(t.name, e.job_id + ".ended");
  const auto j = nlohmann::json::parse(t.before_time + "1700000000123" + t.after_time);
  const auto back = ended_from_json(j);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->job_id, e.job_id);
  EXPECT_EQ(back->ended_unix_ms, 1700000000123);
  EXPECT_EQ(back->exit_code, -1);
  EXPECT_EQ(back->files, e.files);
  EXPECT_EQ(back->message, e.message);
  // A number of another kind or range is no record (a standing coordinator's answer is read
  // with this; 1e300 converted to int was undefined).
  for (const char* bad :
       {R"("exit_code": 1e300)", R"("exit_code": 4294967296)", R"("exit_code": "1")",
        R"("exit_code": 18446744073709551615)", R"("ended_unix_ms": 1e300)", R"("ended_unix_ms": 9223372036854775813)",
        R"("ended_unix_ms": -5)", R"("ended_unix_ms": 1.5)"}) {
    auto k = j;
    k.merge_patch(nlohmann::json::parse(std::string("{") + bad + "}"));
    EXPECT_EQ(ended_from_json(k), std::nullopt) << bad;
  }
  auto k = j;
  k["files"] = nlohmann::json::array({{{"rank", -1}, {"path", "/x"}}});
  EXPECT_EQ(ended_from_json(k), std::nullopt);
  k["files"] = nlohmann::json::array({{{"rank", 2.5}, {"path", "/x"}}});
  EXPECT_EQ(ended_from_json(k), std::nullopt);
  // Without a message the record has no such key, as before.
  e.message.clear();
  EXPECT_FALSE(nlohmann::json::parse(ended_text(e).before_time + "1" + ended_text(e).after_time).contains("message"));
}

TEST(ControlPaths, RecordsLiveUnderXdgStateHome) {
  TempDir d;
  ::setenv("XDG_STATE_HOME", d.p.c_str(), 1);
  const auto dir = records_dir();
  EXPECT_EQ(dir, (d.p / "ddpctl" / "jobs").string());
  struct stat st {};
  ASSERT_EQ(::stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ::unsetenv("XDG_STATE_HOME");
}

// A SIGKILLed launcher leaves its socket file; the next launcher's sweep removes it, and only
// it: a socket someone listens on stays, and so does a file that is not a socket.
TEST(ControlPaths, SweepRemovesOnlySocketsNobodyListensOn) {
  TempDir d;
  auto bound = [&](const std::string& job, bool listening) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    const auto path = socket_path(d.p.string(), job);
    std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
    EXPECT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa), 0) << std::strerror(errno);
    if (listening) {
      EXPECT_EQ(::listen(fd, 4), 0);
    }
    return fd;
  };
  const int dead = bound("dead-job", false);
  ::close(dead);  // the file stays, as after a SIGKILL
  const int live = bound("live-job", true);
  const int starting = bound("starting-job", false);  // bound, not yet listening: refuses, and stays
  std::ofstream(d.p / "notes.sock") << "not a socket\n";
  EXPECT_EQ(socket_jobs(d.p.string()), (std::vector<std::string>{"dead-job", "live-job", "starting-job"}));
  EXPECT_EQ(sweep_stale_sockets(d.p.string()), std::vector<std::string>{"dead-job"});
  EXPECT_EQ(socket_jobs(d.p.string()), (std::vector<std::string>{"live-job", "starting-job"}));
  EXPECT_TRUE(std::filesystem::exists(d.p / "notes.sock"));
  ::close(live);
  ::close(starting);
}

// end(): with no client connected, the server leaves nothing for the loop to wait on (the
// launcher exits as soon as its job does); a follower still gets its "end" line first.
TEST(ControlServer, EndLeavesTheLoopFreeOnceClientsHaveTheirLastLine) {
  const auto dir = std::filesystem::temp_directory_path() / ("ddp-control-end-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  ::setenv("XDG_STATE_HOME", (dir / "state").c_str(), 1);  // the end record's folder
  const auto path = (dir / "job.sock").string();
  {
    boost::asio::io_context io;
    Server server(io, path,
                  Provider{[] { return json::object(); }, [](const std::string&) {},
                           [](const std::set<int>&) { return std::vector<std::pair<int, std::string>>{}; }});
    server.end("succeeded");
    io.poll();  // runs what is ready; the context stops only if nothing is left pending
    EXPECT_TRUE(io.stopped()) << "end() left work (a timer) for the launcher's loop to wait on";
  }
  {
    boost::asio::io_context io;
    Server server(io, path,
                  Provider{[] { return json::object(); }, [](const std::string&) {},
                           [](const std::set<int>&) { return std::vector<std::pair<int, std::string>>{}; }});
    boost::asio::local::stream_protocol::socket client(io);
    client.connect(boost::asio::local::stream_protocol::endpoint(path));
    const std::string follow = json{{"op", "logs"}, {"follow", true}}.dump() + "\n";
    boost::asio::write(client, boost::asio::buffer(follow));
    for (int i = 0; i < 100; ++i) io.run_for(std::chrono::milliseconds(5));  // accepted, following
    Ended record;
    record.status = "succeeded";
    record.logs = "/logs/job";
    server.end("succeeded", record);
    std::string got;
    std::optional<Ended> seen;
    boost::asio::streambuf buf;
    boost::system::error_code ec;
    std::thread reader([&] {
      boost::asio::read(client, buf, ec);  // to EOF: the server closes after the last line
      got.assign(boost::asio::buffers_begin(buf.data()), boost::asio::buffers_end(buf.data()));
      seen = read_ended(records_dir(), "job");  // there by the time a client hears of the end
    });
    io.run();
    reader.join();
    EXPECT_NE(got.find("\"end\":\"succeeded\""), std::string::npos) << got;
    ASSERT_TRUE(seen);
    EXPECT_EQ(seen->job_id, "job");
    EXPECT_EQ(seen->status, "succeeded");
    EXPECT_EQ(seen->logs, "/logs/job");
  }
  ::unsetenv("XDG_STATE_HOME");
  std::filesystem::remove_all(dir);
}

// A launcher sends its current files; another attempt's are read where they are: a request for
// one is refused, not answered with the current attempt's files.
TEST(ControlServer, ALauncherRefusesARequestForAnotherAttempt) {
  TempDir d;
  const auto path = (d.p / "job.sock").string();
  boost::asio::io_context io;
  Server server(io, path,
                Provider{[] { return json::object(); }, [](const std::string&) {},
                         [](const std::set<int>&) {
                           return std::vector<std::pair<int, std::string>>{{0, "/logs/j/attempt-1/rank-0.log"}};
                         }});
  auto ask = [&](const Request& r) {
    boost::asio::local::stream_protocol::socket client(io);
    client.connect(boost::asio::local::stream_protocol::endpoint(path));
    boost::asio::write(client, boost::asio::buffer(encode_request(r)));
    boost::asio::streambuf buf;
    boost::system::error_code ec;
    std::atomic<bool> answered{false};
    std::thread reader([&] {
      boost::asio::read_until(client, buf, '\n', ec);
      answered = true;
    });
    for (int i = 0; i < 400 && !answered; ++i) io.run_for(std::chrono::milliseconds(5));
    reader.join();
    return json::parse(std::string(boost::asio::buffers_begin(buf.data()), boost::asio::buffers_end(buf.data())));
  };
  Request r{Op::logs, {}, false};
  EXPECT_TRUE(ask(r).value("ok", false));
  r.attempt = 0;
  const auto refused = ask(r);
  EXPECT_FALSE(refused.value("ok", true)) << refused;
  EXPECT_NE(refused.value("error", "").find("ddpctl logs --attempt reads the others"), std::string::npos) << refused;
}

// `ddpctl status` (and a starting launcher's sweep) removes a socket that refuses connections as
// a dead launcher's. A socket bound but not yet listening refuses too: a status at the moment a
// job starts must not take its control socket away. Found as a flake of test_stacks_nodes, whose
// polling `ddpctl stacks` removed the coordinator's socket between bind and listen. The thread
// below does what apps/ddpctl/cmd_control.cpp does with every socket it finds.
namespace {
// A non-blocking dial, as the ddpctl client's: -1 with errno set when it is refused or gone; a
// full backlog (nobody accepts in this test) answers EAGAIN and is counted as there.
int dial(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) == 0 || errno == EAGAIN) return fd;
  const int e = errno;
  ::close(fd);
  errno = e;
  return -1;
}
}  // namespace

TEST(ControlServer, AStatusWhileAJobStartsLeavesItsSocketInPlace) {
  TempDir d;
  ::setenv("XDG_STATE_HOME", (d.p / "state").c_str(), 1);
  std::atomic<bool> done{false};
  std::thread status([&] {
    while (!done) {
      for (const auto& id : socket_jobs(d.p.string())) {
        const auto path = socket_path(d.p.string(), id);
        const int fd = dial(path);
        if (fd < 0 && errno == ECONNREFUSED) remove_if_stale(path);
        if (fd >= 0) ::close(fd);
      }
    }
  });
  int lost = 0, refused = 0;
  for (int i = 0; i < 2000; ++i) {
    boost::asio::io_context io;
    // A new id for each launcher, as launches have: an id used again at once by the next launcher
    // would race the check of whose socket refused, which is not the bind/listen window here.
    const auto path = socket_path(d.p.string(), "job" + std::to_string(i));
    try {
      Server server(io, path,
                    Provider{[] { return json::object(); }, [](const std::string&) {},
                             [](const std::set<int>&) { return std::vector<std::pair<int, std::string>>{}; }});
      const int fd = dial(path);
      if (fd < 0) ++lost;  // EAGAIN (a full backlog, nobody accepts here) still counts as there
      if (fd >= 0) ::close(fd);
    } catch (const ControlError&) {
      ++refused;
    }
  }
  done = true;
  status.join();
  EXPECT_EQ(lost, 0) << "launchers whose control socket was removed while they started";
  EXPECT_EQ(refused, 0) << "launchers that could not listen";
  ::unsetenv("XDG_STATE_HOME");
}

TEST(ControlPaths, AJobIsNamedByItsIdOrAnyBeginningThatIsUnique) {
  const std::vector<std::string> ids = {"train-20261204-101500-ab12", "train-20261204-113000-cd34", "eval-1", "eval-1x",
                                        "train-20261204-101500-ab12"};
  using V = std::vector<std::string>;
  EXPECT_EQ(match_job(ids, "eval"), (V{"eval-1", "eval-1x"}));  // ambiguous: both
  EXPECT_EQ(match_job(ids, "eval-1"), (V{"eval-1"}));           // a whole id wins over longer ones
  EXPECT_EQ(match_job(ids, "train-20261204-10"), (V{"train-20261204-101500-ab12"}));  // once, not twice
  EXPECT_EQ(match_job(ids, "train"), (V{"train-20261204-101500-ab12", "train-20261204-113000-cd34"}));
  EXPECT_EQ(match_job(ids, "nosuch"), V{});
  EXPECT_EQ(match_job(ids, "").size(), 4u);  // no name: every job
}

TEST(ControlPaths, EndedJobsAreListedNewestFirst) {
  TempDir d;
  const auto dir = d.p.string();
  Ended e;
  e.status = "succeeded";
  const auto now = std::filesystem::file_time_type::clock::now();
  int age = 3;
  for (const char* id : {"old", "newest", "middle"}) {
    e.job_id = id;
    record_ended(dir, e);
  }
  for (const char* id : {"old", "middle", "newest"}) {
    std::filesystem::last_write_time(d.p / (std::string(id) + ".ended"), now - std::chrono::minutes(age--));
  }
  std::ofstream(d.p / "stray.ended.tmp") << "{";  // a write that did not finish is no record
  std::filesystem::create_directory(d.p / "dir.ended");
  EXPECT_EQ(ended_jobs(dir), (std::vector<std::string>{"newest", "middle", "old"}));
}

namespace {
// A rank log file of "<time> <stream>| <text>" lines.
std::string write_log(const std::filesystem::path& p, const std::vector<std::string>& lines) {
  std::ofstream out(p);
  for (const auto& l : lines) out << l << "\n";
  return p.string();
}
std::vector<std::string> merged(LogMerge& m) {
  std::vector<std::string> out;
  while (auto l = m.next()) out.push_back(std::to_string(l->rank) + " " + l->time.substr(17) + " " + l->text);
  return out;
}
}  // namespace

TEST(ControlLogMerge, RanksLinesComeInTimeOrder) {
  TempDir d;
  const auto r0 =
      write_log(d.p / "rank-0.log", {"2026-12-04T10:00:01.000Z out| a0", "2026-12-04T10:00:03.000Z ddp| note",
                                     "2026-12-04T10:00:03.500Z err| b0", "2026-12-04T10:00:05.000Z out| c0"});
  const auto r1 = write_log(d.p / "rank-1.log", {"2026-12-04T10:00:00.500Z out| a1", "2026-12-04T10:00:03.500Z out| b1",
                                                 "garbage", "2026-12-04T10:00:04.000Z out| c1"});
  const auto r2 = write_log(d.p / "rank-2.log", {});
  LogMerge m({{0, {{r0}}}, {1, {{r1}}}, {2, {{r2}}}, {3, {{(d.p / "rank-3.log").string()}}}});
  // Equal times: the lower rank first. ddp| notes and lines of another shape are not output.
  EXPECT_EQ(merged(m), (std::vector<std::string>{"1 00.500Z a1", "0 01.000Z a0", "0 03.500Z b0", "1 03.500Z b1",
                                                 "1 04.000Z c1", "0 05.000Z c0"}));
  ASSERT_EQ(m.unreadable().size(), 1u);
  EXPECT_EQ(m.unreadable()[0], "rank 3: cannot read " + (d.p / "rank-3.log").string());
}

TEST(ControlLogMerge, ARanksOwnOrderStandsAndLimitsAndRotatedFilesAreKept) {
  TempDir d;
  // rank 0's clock stepped back: its lines still come in its own order.
  const auto r0 = write_log(d.p / "rank-0.log", {"2026-12-04T10:00:05.000Z out| x", "2026-12-04T10:00:01.000Z out| y"});
  // rank 1 rotated once: the .1 file first; its current file read only up to the limit (the size
  // the launcher gave: the line after it was written later).
  const auto r1old = write_log(d.p / "rank-1.log.1", {"2026-12-04T10:00:00.000Z out| old"});
  const auto line = std::string("2026-12-04T10:00:02.000Z out| new");
  const auto r1 = write_log(d.p / "rank-1.log", {line, "2026-12-04T10:00:03.000Z out| past the limit"});
  LogMerge m({{0, {{r0}}}, {1, {{r1old}, {r1, line.size() + 1}}}});
  EXPECT_EQ(merged(m), (std::vector<std::string>{"1 00.000Z old", "1 02.000Z new", "0 05.000Z x", "0 01.000Z y"}));
}

// An ended job's files as its record lists them: each rank's rotated .1 first where there is one
// (a link there is not taken), only the ranks asked for.
TEST(ControlLogMerge, AnEndedJobsFilesBecomeItsSources) {
  TempDir d;
  const auto r0 = write_log(d.p / "rank-0.log", {"2026-12-04T10:00:02.000Z out| now0"});
  write_log(d.p / "rank-0.log.1", {"2026-12-04T10:00:01.000Z out| before0"});
  const auto r1 = write_log(d.p / "rank-1.log", {"2026-12-04T10:00:03.000Z out| now1"});
  write_log(d.p / "elsewhere", {"2026-12-04T10:00:00.000Z out| not rank 1's"});
  std::filesystem::create_symlink(d.p / "elsewhere", d.p / "rank-1.log.1");
  const std::vector<std::pair<int, std::string>> files{{0, r0}, {1, r1}};
  auto all = LogMerge::of_files(files, {});
  ASSERT_EQ(all.size(), 2u);
  ASSERT_EQ(all[0].files.size(), 2u);
  EXPECT_EQ(all[0].files[0].path, r0 + ".1");
  EXPECT_EQ(all[1].files.size(), 1u);  // the link is no rotated file
  LogMerge m(std::move(all));
  EXPECT_EQ(merged(m), (std::vector<std::string>{"0 01.000Z before0", "0 02.000Z now0", "1 03.000Z now1"}));
  EXPECT_TRUE(m.unreadable().empty());
  auto one = LogMerge::of_files(files, {1});
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].rank, 1);
}

TEST(ControlLogMerge, CutsLongLines) {
  TempDir d;
  const auto long_text = std::string(LogMerge::kMaxLine * 2, 'z');
  const auto r0 = write_log(d.p / "rank-0.log",
                            {"2026-12-04T10:00:01.000Z out| " + long_text, "2026-12-04T10:00:02.000Z out| after"});
  LogMerge m({{0, {{r0}}}});
  auto first = m.next();
  ASSERT_TRUE(first);
  EXPECT_EQ(first->text.size(), LogMerge::kMaxLine - std::string("2026-12-04T10:00:01.000Z out| ").size());
  auto second = m.next();
  ASSERT_TRUE(second);
  EXPECT_EQ(second->text, "after");  // the long line's rest was skipped, not taken for a line
  EXPECT_FALSE(m.next());
}

// `ddpctl logs` run by root over a job's log folder: what the job left where a rank file is
// expected is refused, never followed or read (safe_fs.hpp's open_in_folder_to_read).
TEST(ControlLogMerge, NeverFollowsALinkNorOpensAFifoOrAHardLink) {
  TempDir d;
  const auto secret = write_log(d.p / "secret", {"2026-12-04T10:00:00.000Z out| the secret"});
  const auto r0 = write_log(d.p / "rank-0.log", {"2026-12-04T10:00:01.000Z out| mine"});
  std::filesystem::create_symlink(secret, d.p / "rank-1.log");
  std::filesystem::create_hard_link(secret, d.p / "rank-2.log");
  ASSERT_EQ(::mkfifo((d.p / "rank-3.log").c_str(), 0600), 0);
  // A writer that holds the FIFO open with a line in it: a reader that opened it would not block
  // at the open, and would show the line.
  const int w = ::open((d.p / "rank-3.log").c_str(), O_RDWR | O_NONBLOCK);
  ASSERT_GE(w, 0);
  const std::string fifo_line = "2026-12-04T10:00:00.000Z out| from the fifo\n";
  ASSERT_EQ(::write(w, fifo_line.data(), fifo_line.size()), static_cast<ssize_t>(fifo_line.size()));
  // A folder that is a link (to the folder holding the secret).
  std::filesystem::create_directory(d.p / "real");
  write_log(d.p / "real" / "rank-4.log", {"2026-12-04T10:00:00.000Z out| behind a folder link"});
  std::filesystem::create_directory_symlink(d.p / "real", d.p / "attempt-link");
  LogMerge m({{0, {{r0}}},
              {1, {{(d.p / "rank-1.log").string()}}},
              {2, {{(d.p / "rank-2.log").string()}}},
              {3, {{(d.p / "rank-3.log").string()}}},
              {4, {{(d.p / "attempt-link" / "rank-4.log").string()}}}});
  // Checked before any line is taken: a merge that opened the FIFO would block reading past its line.
  ASSERT_EQ(m.unreadable().size(), 4u);
  ::close(w);
  EXPECT_EQ(m.unreadable()[0], "rank 1: cannot read " + (d.p / "rank-1.log").string() +
                                   ": it is a symbolic link, which is not followed here");
  EXPECT_EQ(m.unreadable()[1],
            "rank 2: cannot read " + (d.p / "rank-2.log").string() + ": it has 2 names (a hard link)");
  EXPECT_EQ(m.unreadable()[2], "rank 3: cannot read " + (d.p / "rank-3.log").string() + ": it is not a regular file");
  EXPECT_NE(m.unreadable()[3].find("rank-4.log: its folder: it is not a folder (or is a symbolic link"),
            std::string::npos)
      << m.unreadable()[3];
  EXPECT_EQ(merged(m), (std::vector<std::string>{"0 01.000Z mine"}));
}

TEST(LogAttempts, TheFolderAndAttemptOfAJobsFiles) {
  auto f = attempt_folder_of({{0, "/logs/j/attempt-2/rank-0.log"}, {1, "/logs/j/attempt-2/rank-1.log"}});
  ASSERT_TRUE(f);
  EXPECT_EQ(f->job_dir, "/logs/j");
  EXPECT_EQ(f->attempt, 2);
  // Files of two attempts, or not in an attempt folder, name none.
  EXPECT_FALSE(attempt_folder_of({{0, "/logs/j/attempt-2/rank-0.log"}, {1, "/logs/j/attempt-1/rank-1.log"}}));
  EXPECT_FALSE(attempt_folder_of({{0, "/logs/j/rank-0.log"}}));
  EXPECT_FALSE(attempt_folder_of({{0, "/logs/j/attempt-x/rank-0.log"}}));
  EXPECT_FALSE(attempt_folder_of({{0, "/logs/j/attempt--1/rank-0.log"}}));
  EXPECT_FALSE(attempt_folder_of({}));
}

TEST(LogAttempts, AnAttemptsRankFilesAreListedByRankNothingFollowed) {
  TempDir d;
  std::filesystem::create_directories(d.p / "attempt-0");
  for (const char* name : {"rank-10.log", "rank-2.log", "rank-2.log.1", "rank-x.log", "stacks.txt"})
    std::ofstream(d.p / "attempt-0" / name) << "x";
  auto files = rank_files_of_attempt(d.p.string(), 0);
  const std::vector<std::pair<int, std::string>> want{{2, (d.p / "attempt-0" / "rank-2.log").string()},
                                                      {10, (d.p / "attempt-0" / "rank-10.log").string()}};
  EXPECT_EQ(files, want);
  EXPECT_TRUE(rank_files_of_attempt(d.p.string(), 1).empty());
  // An attempt folder that is a link (the job's own doing) is not read.
  std::filesystem::create_directory_symlink(d.p / "attempt-0", d.p / "attempt-1");
  EXPECT_TRUE(rank_files_of_attempt(d.p.string(), 1).empty());
  // rank-02.log is not rank 2's (two files of one rank would be shown twice).
  std::ofstream(d.p / "attempt-0" / "rank-02.log") << "x";
  EXPECT_EQ(rank_files_of_attempt(d.p.string(), 0), want);
}

TEST(LogAttempts, WhichAttemptsAndWhatIsSaidBeforeEach) {
  TempDir d;
  for (const char* f :
       {"attempt-0/rank-0.log", "attempt-0/rank-1.log", "attempt-0/rank-3.log", "attempt-2/rank-0.log"}) {
    std::filesystem::create_directories((d.p / f).parent_path());
    std::ofstream(d.p / f) << "x";
  }
  const std::vector<std::pair<int, std::string>> current{{0, (d.p / "attempt-2" / "rank-0.log").string()}};
  auto all = attempt_logs("j", current, kEveryAttempt, {}, true);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].attempt, 0);
  EXPECT_EQ(all[0].files.size(), 3u);
  EXPECT_EQ(all[0].header, "job j, attempt 0");
  EXPECT_EQ(all[1].header, fmt::format("job j, attempt 1: no log files in {}/attempt-1", d.p.string()));
  EXPECT_TRUE(all[1].files.empty());
  EXPECT_EQ(all[2].header, "job j, attempt 2 (the last)");
  EXPECT_EQ(attempt_logs("j", current, 2, {}, false)[0].header, "job j, attempt 2 (the latest)");
  // A rank with a file is found by its number, not by how many files there are (a multi-node
  // launcher's copy of a rank begins with its first line: rank 3's without rank 2's).
  auto one = attempt_logs("j", current, 0, {3}, true);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].files.size(), 3u);  // the merge takes the ranks asked for
  auto error = [&](int which, std::set<int> ranks, std::vector<std::pair<int, std::string>> files) {
    try {
      attempt_logs("j", files, which, ranks, true);
    } catch (const ControlError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(error(0, {2, 5}, current), "attempt 0: no log files of ranks 2,5 (there are ranks 0,1,3)");
  EXPECT_EQ(error(kEveryAttempt, {1}, current), "attempt 2: no log file of rank 1 (there is rank 0)");
  EXPECT_EQ(error(3, {}, current), "job j has no attempt 3 (it has attempts 0-2)");
  EXPECT_EQ(error(0, {}, {}), "job j has no log files yet");
  EXPECT_EQ(error(0, {}, {{0, "/elsewhere/rank-0.log"}}),
            "job j's log files are not in its attempt folders, so its other attempts cannot be found");
}

// The flight recorder's edge (lib/hang/flight_gather.hpp): the FIFO that asks a rank for a dump,
// and the converter run on a folder of dumps.
#include "hang/flight_gather.hpp"

#include "contract/flight_recorder.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

using namespace ddp;
using namespace ddp::hang;
namespace fs = std::filesystem;
using R = DumpRequest::Result;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/ddp-flight-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

void write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

}  // namespace

TEST(FlightRequestDump, OneByteIntoTheRanksFifo) {
  TempDir t;
  const auto pipe = t.file(contract::flight_pipe_name(3));
  ASSERT_EQ(::mkfifo(pipe.c_str(), 0600), 0);
  // The rank's side, as PyTorch opens it: read-only, non-blocking.
  const int reader = ::open(pipe.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  const auto dir = safefs::Dir::open(t.path.string());
  auto r = request_dump(dir, 3, ::geteuid());
  EXPECT_EQ(r.result, R::sent) << r.detail;
  char buf[8];
  EXPECT_EQ(::read(reader, buf, sizeof buf), 1);
  ::close(reader);
}

TEST(FlightRequestDump, NoReaderAnswersAtOnce) {
  TempDir t;
  ASSERT_EQ(::mkfifo(t.file(contract::flight_pipe_name(0)).c_str(), 0600), 0);
  auto r = request_dump(safefs::Dir::open(t.path.string()), 0, ::geteuid());  // would block without O_NONBLOCK
  EXPECT_EQ(r.result, R::not_listening) << r.detail;
}

TEST(FlightRequestDump, NoPipe) {
  TempDir t;
  EXPECT_EQ(request_dump(safefs::Dir::open(t.path.string()), 0, ::geteuid()).result, R::no_pipe);
}

TEST(FlightRequestDump, ALinkIsNeverFollowed) {
  // The job replaces its FIFO with a link to a file it wants root to write: refused, and the
  // target is untouched.
  TempDir t;
  const auto target = t.file("precious");
  write(target, "keep");
  ASSERT_EQ(::symlink(target.c_str(), t.file(contract::flight_pipe_name(1)).c_str()), 0);
  auto r = request_dump(safefs::Dir::open(t.path.string()), 1, ::geteuid());
  EXPECT_EQ(r.result, R::refused) << r.detail;
  std::ifstream in(target);
  std::string s;
  in >> s;
  EXPECT_EQ(s, "keep");
  // A link to a FIFO with a reader is refused too (it could be anyone's).
  const auto other = t.file("other.fifo");
  ASSERT_EQ(::mkfifo(other.c_str(), 0600), 0);
  const int reader = ::open(other.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_EQ(::symlink(other.c_str(), t.file(contract::flight_pipe_name(2)).c_str()), 0);
  EXPECT_EQ(request_dump(safefs::Dir::open(t.path.string()), 2, ::geteuid()).result, R::refused);
  char buf[8];
  EXPECT_LE(::read(reader, buf, sizeof buf), 0);  // nothing was written (no writer ever came: EOF)
  ::close(reader);
}

TEST(FlightRequestDump, ARegularFileOrAFolderIsRefusedAndUntouched) {
  TempDir t;
  write(t.file(contract::flight_pipe_name(0)), "data");
  auto r = request_dump(safefs::Dir::open(t.path.string()), 0, ::geteuid());
  EXPECT_EQ(r.result, R::refused);
  EXPECT_NE(r.detail.find("not a FIFO"), std::string::npos) << r.detail;
  EXPECT_EQ(fs::file_size(t.file(contract::flight_pipe_name(0))), 4u);
  fs::create_directory(t.file(contract::flight_pipe_name(1)));
  EXPECT_EQ(request_dump(safefs::Dir::open(t.path.string()), 1, ::geteuid()).result, R::refused);
}

TEST(FlightRequestDump, AFifoOfSomeoneElseIsRefused) {
  TempDir t;
  ASSERT_EQ(::mkfifo(t.file(contract::flight_pipe_name(0)).c_str(), 0600), 0);
  const int reader = ::open(t.file(contract::flight_pipe_name(0)).c_str(), O_RDONLY | O_NONBLOCK);
  auto r = request_dump(safefs::Dir::open(t.path.string()), 0, ::geteuid() + 1);  // the job is another uid
  EXPECT_EQ(r.result, R::refused);
  EXPECT_NE(r.detail.find("belongs to uid"), std::string::npos) << r.detail;
  ::close(reader);
}

TEST(FlightGather, ListsDumpsOnlyInRankOrder) {
  TempDir t;
  for (const char* n :
       {"nccl-flight-rank-10", "nccl-flight-rank-2", "nccl-flight-rank-2.pipe", "rank-0.log", "nccl-flight-rank-x"})
    write(t.file(n), "");
  EXPECT_EQ(list_dumps(safefs::Dir::open(t.path.string())),
            (std::vector<std::string>{"nccl-flight-rank-2", "nccl-flight-rank-10"}));
}

TEST(FlightGather, ConvertsWithPythonAndNamesTheCollective) {
  // Dumps in the recorder's layout (written as JSON here: the converter reads both; the pickle
  // layout is tests/integration/hang/test_flight_convert.py's), rank 1 behind, rank 2 garbage.
  TempDir t;
  auto entry = [](int seq, const char* state) {
    return std::string(R"({"record_id":)") + std::to_string(seq) + R"(,"pg_id":0,"process_group":["0","default_pg"],)" +
           R"("collective_seq_id":)" + std::to_string(seq) + R"(,"p2p_seq_id":0,"op_id":)" + std::to_string(seq) +
           R"(,"profiling_name":"nccl:all_reduce","time_created_ns":)" + std::to_string(1000 + seq) +
           R"(,"input_sizes":[[1024]],"input_dtypes":["Float"],"output_sizes":[[1024]],"output_dtypes":["Float"],)" +
           R"("state":")" + state + R"(","is_p2p":false,"retired":false,"timeout_ms":1000})";
  };
  write(t.file("nccl-flight-rank-0"),
        R"({"version":"2.4","pg_config":{"0":{"name":"0","desc":"default_pg","ranks":"[0, 1, 2]"}},"entries":[)" +
            entry(1, "completed") + "," + entry(2, "started") + "]}");
  write(t.file("nccl-flight-rank-1"), R"({"version":"2.4","entries":[)" + entry(1, "completed") + "]}");
  write(t.file("nccl-flight-rank-2"), "\x80\x04garbage");
  ConvertRequest req;
  req.env = {{"PATH", "/usr/bin:/bin"}};
  auto f = gather_flight(safefs::Dir::open(t.path.string()), 3, req);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->kind, Finding::Kind::not_entered);
  EXPECT_EQ(f->ahead, (std::vector<int>{0}));
  EXPECT_EQ(f->behind, (std::vector<int>{1}));
  EXPECT_EQ(f->missing, (std::vector<int>{2}));
  EXPECT_TRUE(f->errors.count(2));
  EXPECT_EQ(format_finding(*f).rfind("flight recorder: rank 0 entered all_reduce #2 (pg 0, 4 KiB), rank 1 did not; no "
                                     "dump from rank 2 (rank 2's: ",
                                     0),
            0u)
      << format_finding(*f);
}

TEST(FlightGather, NoDumpsNoFinding) {
  TempDir t;
  EXPECT_FALSE(gather_flight(safefs::Dir::open(t.path.string()), 2, {}));
}

TEST(FlightGather, AConverterThatHangsIsCutOffAndEveryRankSaysWhy) {
  // A "python" that never answers: each dump's error says so, within the limit.
  TempDir t;
  write(t.file("nccl-flight-rank-0"), "{}");
  write(t.file("nccl-flight-rank-1"), "{}");
  ConvertRequest req;
  req.python = {"/bin/sh", "-c", "exec sleep 30", "sh"};  // takes the converter's arguments and ignores them
  req.timeout = std::chrono::milliseconds(300);
  const auto t0 = std::chrono::steady_clock::now();
  auto dumps = convert_dumps(t.path.string(), {"nccl-flight-rank-0", "nccl-flight-rank-1"}, req);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  ASSERT_EQ(dumps.size(), 2u);
  for (const auto& d : dumps) EXPECT_NE(d.error.find("did not finish within 300 ms"), std::string::npos) << d.error;
  EXPECT_EQ(dumps[1].rank, 1);
}

TEST(FlightGather, AnswersForOtherFilesOrRanksAreNotBelieved) {
  // A converter that claims other files, or a rank that is not its file's: only the file's
  // name says which rank a summary is, and a dump without a line of its own is an error.
  TempDir t;
  write(t.file("nccl-flight-rank-0"), "{}");
  ConvertRequest req;
  req.python = {
      "/bin/sh", "-c",
      R"(echo '{"file":"nccl-flight-rank-7","rank":7,"entries":[]}'; echo '{"file":"nccl-flight-rank-0","rank":5,"entries":[]}')",
      "sh"};
  auto dumps = convert_dumps(t.path.string(), {"nccl-flight-rank-0"}, req);
  ASSERT_EQ(dumps.size(), 1u);
  EXPECT_EQ(dumps[0].rank, 0);
  EXPECT_EQ(dumps[0].error, "");
}

TEST(FlightGather, ASummaryNestedTooDeepIsNamedAndRefused) {
  // Its name is read whatever its depth, so its rank gets the reason, not "no answer"; asked for by
  // name or listed.
  TempDir t;
  write(t.file("nccl-flight-rank-0"), "{}");
  const std::string deep = std::string(40, '[') + std::string(40, ']');
  ConvertRequest req;
  req.python = {"/bin/sh", "-c", "echo '{\"file\":\"nccl-flight-rank-0\",\"entries\":" + deep + "}'", "sh"};
  for (const std::vector<std::string>& names :
       {std::vector<std::string>{"nccl-flight-rank-0"}, std::vector<std::string>{}}) {
    auto dumps = convert_dumps(t.path.string(), names, req);
    ASSERT_EQ(dumps.size(), 1u);
    EXPECT_EQ(dumps[0].rank, 0);
    EXPECT_EQ(dumps[0].error, "summary nested too deep");
  }
}

TEST(FlightGather, TheConverterListsTheFolderItselfWhenAsked) {
  // A root caller gives no names: the converter, as the job's user, finds the dumps.
  TempDir t;
  write(t.file("nccl-flight-rank-1"), R"({"entries":[]})");
  write(t.file("nccl-flight-rank-0"), R"({"entries":[]})");
  write(t.file("nccl-flight-rank-0.pipe"), "");
  write(t.file("other"), "");
  ConvertRequest req;
  req.env = {{"PATH", "/usr/bin:/bin"}};
  auto dumps = convert_dumps(t.path.string(), {}, req);
  ASSERT_EQ(dumps.size(), 2u);
  EXPECT_EQ(dumps[0].rank, 0);
  EXPECT_EQ(dumps[1].rank, 1);
  EXPECT_EQ(dumps[0].error, "");
  // A converter that cannot run: one error of no rank's, which analyze() leaves out.
  req.python = {"/nonexistent/python3"};
  auto failed = convert_dumps(t.path.string(), {}, req);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].rank, -1);
  EXPECT_NE(failed[0].error.find("not found"), std::string::npos);
  EXPECT_EQ(analyze(failed, 0).kind, Finding::Kind::no_data);
}

TEST(FlightGather, TheInterpretersStderrIsCleanedBeforeItIsQuoted) {
  // The first line of the converter's stderr goes into every dump's error, and so into JSON.
  TempDir t;
  write(t.file("nccl-flight-rank-0"), "{}");
  ConvertRequest req;
  req.python = {"/bin/sh", "-c", R"(printf 'bad \377\033[2J \342\200\256x\n' >&2; exit 3)", "sh"};
  auto dumps = convert_dumps(t.path.string(), {"nccl-flight-rank-0"}, req);
  ASSERT_EQ(dumps.size(), 1u);
  EXPECT_NE(dumps[0].error.find("exit status 3: bad ??[2J ?x"), std::string::npos) << dumps[0].error;
  EXPECT_NO_THROW(to_json(dumps[0]).dump());
}

TEST(FlightGather, APickleOfAMillionReferencesIsCutBeforeItIsBuilt) {
  // A pickle's memo makes a million references to one entry out of two bytes each (2 MB): the
  // converter cuts the list before it builds anything per entry, so it answers within a few
  // hundred MB (the old one built a million dicts: a MemoryError here, or its time ran out).
  TempDir t;
  auto text = [](const std::string& s) {
    std::string out = "X";
    for (int i = 0; i < 4; ++i) out += static_cast<char>((s.size() >> (8 * i)) & 0xff);
    return out + s;
  };
  constexpr int kRefs = 1'000'000;
  std::string p = std::string("\x80\x02}") + text("entries") + "](}q\x01" + text("state") + text("completed") + "s";
  for (int i = 1; i < kRefs; ++i) p += "h\x01";  // BINGET 1: the same entry again
  p += "es.";
  write(t.file("nccl-flight-rank-0"), p);
  ConvertRequest req;
  req.python = {"/bin/sh", "-c", "ulimit -v 400000 && exec python3 \"$@\"", "sh"};
  req.env = {{"PATH", "/usr/bin:/bin"}};
  req.timeout = std::chrono::seconds(30);  // a loaded test machine; the point is the memory
  auto dumps = convert_dumps(t.path.string(), {"nccl-flight-rank-0"}, req);
  ASSERT_EQ(dumps.size(), 1u);
  EXPECT_EQ(dumps[0].error, "");
  EXPECT_EQ(dumps[0].entries.size(), 64u);
}

TEST(FlightGather, TheConverterRunsWithoutTheSiteModule) {
  // -S: no site module, so no .pth file of the job's environment runs a line of code.
  TempDir t;
  write(t.file("nccl-flight-rank-0"), "{}");
  ConvertRequest req;
  req.python = {"/bin/sh", "-c", R"(case " $* " in *" -I -S -c "*) exit 7;; esac; exit 9)", "sh"};
  auto dumps = convert_dumps(t.path.string(), {"nccl-flight-rank-0"}, req);
  ASSERT_EQ(dumps.size(), 1u);
  EXPECT_NE(dumps[0].error.find("exit status 7"), std::string::npos) << dumps[0].error;
}

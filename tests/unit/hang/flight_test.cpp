// The flight recorder's analysis (lib/hang/flight.hpp): which collective some ranks entered and
// others did not, from every rank's summary.
#include "hang/flight.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

using namespace ddp::hang;
using nlohmann::json;

namespace {

// One entry as the converter writes it.
json entry(const std::string& pg, std::uint64_t seq, const std::string& op, const std::string& state,
           std::vector<std::int64_t> shape = {1048576}, const std::string& dtype = "Float", std::int64_t t = 0,
           bool p2p = false) {
  return {{"pg", pg},
          {"desc", pg == "0" ? "default_pg" : "tp"},
          {"seq", seq},
          {"p2p", p2p},
          {"op", "nccl:" + op},
          {"in", json::array({shape})},
          {"out", json::array({shape})},
          {"in_dtypes", json::array({dtype})},
          {"out_dtypes", json::array({dtype})},
          {"state", state},
          {"t", t ? t : static_cast<std::int64_t>(1000 + seq)}};
}

// A rank that ran all_reduce 1..n on the default group, the last one in `last_state`.
json steps(int n, const std::string& last_state, const std::string& pg = "0") {
  json es = json::array();
  for (int s = 1; s <= n; ++s) es.push_back(entry(pg, s, "all_reduce", s == n ? last_state : "completed"));
  return es;
}

RankDump dump(int rank, json entries, json groups = json::object()) {
  json j{{"file", "nccl-flight-rank-" + std::to_string(rank)},
         {"rank", rank},
         {"version", "2.10"},
         {"groups", groups},
         {"entries", entries},
         {"dropped", 0}};
  auto d = parse_summary(j.dump());
  EXPECT_EQ(d.error, "") << j.dump();
  return d;
}

using Ranks = std::vector<int>;

}  // namespace

TEST(FlightAnalysis, TheRankThatDidNotEnterIsNamed) {
  // Ranks 0,2,3 are in all_reduce #57; rank 1 completed #56 and is somewhere in Python.
  std::vector<RankDump> d{dump(0, steps(57, "started")), dump(1, steps(56, "completed")), dump(2, steps(57, "started")),
                          dump(3, steps(57, "scheduled"))};
  auto f = analyze(d, 4);
  EXPECT_EQ(f.kind, Finding::Kind::not_entered);
  EXPECT_EQ(f.pg, "0");
  EXPECT_EQ(f.seq, 57u);
  EXPECT_EQ(f.op, "all_reduce");
  EXPECT_EQ(f.ahead, (Ranks{0, 2, 3}));
  EXPECT_EQ(f.behind, (Ranks{1}));
  EXPECT_EQ(f.bytes, 4u << 20);
  EXPECT_EQ(format_finding(f), "flight recorder: ranks 0,2,3 entered all_reduce #57 (pg 0, 4 MiB), rank 1 did not");
  EXPECT_EQ(to_json(f)["kind"], "not_entered");
}

TEST(FlightAnalysis, SeveralBehindAtDifferentPointsTheFirstMissingCollectiveCounts) {
  // Rank 2 stopped after #10, rank 1 after #12, rank 0 is at #13: #11 is the first some did not enter.
  std::vector<RankDump> d{dump(0, steps(13, "started")), dump(1, steps(12, "completed")),
                          dump(2, steps(10, "completed"))};
  auto f = analyze(d, 3);
  EXPECT_EQ(f.kind, Finding::Kind::not_entered);
  EXPECT_EQ(f.seq, 11u);
  EXPECT_EQ(f.ahead, (Ranks{0, 1}));
  EXPECT_EQ(f.behind, (Ranks{2}));
}

TEST(FlightAnalysis, AllAgreeWhenEveryRankCompletedTheSame) {
  std::vector<RankDump> d{dump(0, steps(8, "completed")), dump(1, steps(8, "completed"))};
  auto f = analyze(d, 2);
  EXPECT_EQ(f.kind, Finding::Kind::agree);
  EXPECT_EQ(f.seq, 8u);
  EXPECT_EQ(f.ahead, (Ranks{0, 1}));
  EXPECT_EQ(format_finding(f),
            "flight recorder: ranks 0,1 agree: the last collective, all_reduce #8 (pg 0, 4 MiB), completed on all");
}

TEST(FlightAnalysis, AllEnteredSomeCompleted) {
  // Everyone entered #5; ranks 0,1 saw it complete, ranks 2,3 did not (their GPU or link).
  std::vector<RankDump> d{dump(0, steps(5, "completed")), dump(1, steps(5, "completed")), dump(2, steps(5, "started")),
                          dump(3, steps(5, "started"))};
  auto f = analyze(d, 4);
  EXPECT_EQ(f.kind, Finding::Kind::not_completed);
  EXPECT_EQ(f.seq, 5u);
  EXPECT_EQ(f.ahead, (Ranks{0, 1}));
  EXPECT_EQ(f.behind, (Ranks{2, 3}));
  EXPECT_EQ(format_finding(f),
            "flight recorder: all entered all_reduce #5 (pg 0, 4 MiB); ranks 0,1 completed it, ranks 2,3 did not");
}

TEST(FlightAnalysis, AllEnteredNoneCompleted) {
  std::vector<RankDump> d{dump(0, steps(5, "started")), dump(1, steps(5, "scheduled"))};
  auto f = analyze(d, 2);
  EXPECT_EQ(f.kind, Finding::Kind::not_completed);
  EXPECT_TRUE(f.ahead.empty());
  EXPECT_EQ(f.behind, (Ranks{0, 1}));
  EXPECT_EQ(format_finding(f), "flight recorder: ranks 0,1 entered all_reduce #5 (pg 0, 4 MiB) and none completed it");
}

TEST(FlightAnalysis, MissingRanksAreNamedAndDoNotHideTheFinding) {
  // Only rank 0 dumped (rank 1 was stopped before its own dump): its pending collective is named,
  // and so is the rank without a dump.
  std::vector<RankDump> d{dump(0, steps(3, "started"))};
  auto f = analyze(d, 2);
  EXPECT_EQ(f.kind, Finding::Kind::not_completed);
  EXPECT_EQ(f.seq, 3u);
  EXPECT_EQ(f.missing, (Ranks{1}));
  EXPECT_EQ(format_finding(f),
            "flight recorder: rank 0 entered all_reduce #3 (pg 0, 4 MiB) and none completed it; no dump from rank 1");
  // Among 4 with two missing, the two present still decide between themselves.
  std::vector<RankDump> d4{dump(0, steps(9, "started")), dump(3, steps(8, "completed"))};
  auto f4 = analyze(d4, 4);
  EXPECT_EQ(f4.kind, Finding::Kind::not_entered);
  EXPECT_EQ(f4.ahead, (Ranks{0}));
  EXPECT_EQ(f4.behind, (Ranks{3}));
  EXPECT_EQ(f4.missing, (Ranks{1, 2}));
}

TEST(FlightAnalysis, ARankThatRecordedNothingDidNotEnter) {
  // Rank 1 has a dump but no entry at all (it never reached its first collective).
  std::vector<RankDump> d{dump(0, steps(1, "started")), dump(1, json::array())};
  auto f = analyze(d, 2);
  EXPECT_EQ(f.kind, Finding::Kind::not_entered);
  EXPECT_EQ(f.seq, 1u);
  EXPECT_EQ(f.ahead, (Ranks{0}));
  EXPECT_EQ(f.behind, (Ranks{1}));
}

TEST(FlightAnalysis, SeveralProcessGroupsTheEarliestDivergenceWins) {
  // Group "1" (ranks 0,1) diverged first: rank 1 never entered its #4. Group "0" diverged later
  // as a consequence (rank 1 never got there).
  auto g = json{{"0", {{"desc", "default_pg"}, {"ranks", {0, 1, 2, 3}}}},
                {"1", {{"desc", "tp"}, {"ranks", {0, 1}}}},
                {"2", {{"desc", "tp"}, {"ranks", {2, 3}}}}};
  auto ranks01 = [&](int r, int tp_n, const std::string& tp_last) {
    json es = json::array();
    for (int s = 1; s <= tp_n; ++s)
      es.push_back(entry("1", s, "all_gather", s == tp_n ? tp_last : "completed", {64}, "BFloat16", 100 + s));
    es.push_back(entry("0", 7, "all_reduce", r == 0 ? "started" : "completed", {16}, "Float", 500));
    return es;
  };
  json e2 = json::array(), e3 = json::array();
  for (int s = 1; s <= 4; ++s) {
    e2.push_back(entry("2", s, "all_gather", "completed", {64}, "BFloat16", 100 + s));
    e3.push_back(entry("2", s, "all_gather", "completed", {64}, "BFloat16", 100 + s));
  }
  e2.push_back(entry("0", 8, "all_reduce", "started", {16}, "Float", 600));
  e3.push_back(entry("0", 8, "all_reduce", "started", {16}, "Float", 600));
  std::vector<RankDump> d{dump(0, ranks01(0, 4, "started"), g), dump(1, ranks01(1, 3, "completed"), g), dump(2, e2, g),
                          dump(3, e3, g)};
  auto f = analyze(d, 4);
  EXPECT_EQ(f.kind, Finding::Kind::not_entered);
  EXPECT_EQ(f.pg, "1");
  EXPECT_EQ(f.desc, "tp");
  EXPECT_EQ(f.seq, 4u);
  EXPECT_EQ(f.op, "all_gather");
  EXPECT_EQ(f.ahead, (Ranks{0}));
  EXPECT_EQ(f.behind, (Ranks{1}));
  EXPECT_EQ(f.bytes, 128u);
  EXPECT_EQ(format_finding(f), "flight recorder: rank 0 entered all_gather #4 (pg 1, 128 B), rank 1 did not");
}

TEST(FlightAnalysis, GroupMembershipComesFromTheDumps) {
  // Group "5" holds ranks 0 and 2 only; rank 1 having no entry in it is no divergence.
  auto g = json{{"5", {{"desc", "pair"}, {"ranks", {0, 2}}}}};
  std::vector<RankDump> d{dump(0, steps(3, "completed", "5"), g), dump(1, json::array(), g),
                          dump(2, steps(3, "completed", "5"), g)};
  auto f = analyze(d, 3);
  EXPECT_EQ(f.kind, Finding::Kind::agree);
  EXPECT_EQ(f.pg, "5");
}

TEST(FlightAnalysis, MismatchedSizesAreTheCause) {
  // At #3 rank 1 all_reduced 512 floats where the others did 1024: reported before the hang
  // that follows from it at #4.
  std::vector<RankDump> d;
  for (int r = 0; r < 3; ++r) {
    json es = json::array();
    es.push_back(entry("0", 1, "all_reduce", "completed"));
    es.push_back(entry("0", 2, "all_reduce", "completed"));
    es.push_back(entry("0", 3, "all_reduce", "started", {r == 1 ? 512 : 1024}));
    if (r != 1) es.push_back(entry("0", 4, "all_reduce", "scheduled"));
    d.push_back(dump(r, es));
  }
  auto f = analyze(d, 3);
  EXPECT_EQ(f.kind, Finding::Kind::mismatch);
  EXPECT_EQ(f.seq, 3u);
  EXPECT_EQ(f.ahead, (Ranks{0, 2}));
  EXPECT_EQ(f.behind, (Ranks{1}));
  EXPECT_NE(f.detail.find("ranks 0,2: all_reduce [1024] Float"), std::string::npos) << f.detail;
  EXPECT_NE(f.detail.find("rank 1: all_reduce [512] Float"), std::string::npos) << f.detail;
  EXPECT_EQ(format_finding(f).rfind("flight recorder: collective #3 of pg 0 differs between ranks: ", 0), 0u);
}

TEST(FlightAnalysis, MismatchedOpsAndDtypes) {
  std::vector<RankDump> d{dump(0, json::array({entry("0", 1, "all_reduce", "started")})),
                          dump(1, json::array({entry("0", 1, "broadcast", "started")}))};
  auto f = analyze(d, 2);
  EXPECT_EQ(f.kind, Finding::Kind::mismatch);
  EXPECT_NE(f.detail.find("broadcast"), std::string::npos);
  std::vector<RankDump> dt{dump(0, json::array({entry("0", 1, "all_reduce", "started", {8}, "Float")})),
                           dump(1, json::array({entry("0", 1, "all_reduce", "started", {8}, "BFloat16")}))};
  EXPECT_EQ(analyze(dt, 2).kind, Finding::Kind::mismatch);
}

TEST(FlightAnalysis, SizesThatMayDifferDoNotCountAsAMismatch) {
  // all_to_all and gather carry different sizes per rank by design.
  for (const char* op : {"all_to_all", "gather", "scatter", "_alltoall_base"}) {
    std::vector<RankDump> d{dump(0, json::array({entry("0", 1, op, "completed", {8})})),
                            dump(1, json::array({entry("0", 1, op, "completed", {16})}))};
    EXPECT_EQ(analyze(d, 2).kind, Finding::Kind::agree) << op;
  }
}

TEST(FlightAnalysis, PointToPointPendingWhenNoCollectiveDiverged) {
  std::vector<RankDump> d{dump(0, json::array({entry("0", 1, "all_reduce", "completed"),
                                               entry("0", 2, "send", "started", {8}, "Float", 50, true)})),
                          dump(1, json::array({entry("0", 1, "all_reduce", "completed")}))};
  auto f = analyze(d, 2);
  EXPECT_EQ(f.kind, Finding::Kind::p2p_pending);
  EXPECT_EQ(f.op, "send");
  EXPECT_EQ(f.ahead, (Ranks{0}));
  EXPECT_EQ(
      format_finding(f),
      "flight recorder: no collective diverged; rank 0 waits in point-to-point send #2 (pg 0, 32 B) (first pending)");
  // A p2p op's sequence number never counts as a collective's.
  std::vector<RankDump> c{dump(0, json::array({entry("0", 1, "all_reduce", "completed"),
                                               entry("0", 9, "recv", "completed", {8}, "Float", 0, true)})),
                          dump(1, json::array({entry("0", 1, "all_reduce", "completed")}))};
  EXPECT_EQ(analyze(c, 2).kind, Finding::Kind::agree);
}

TEST(FlightAnalysis, NoDataAndUnreadableDumps) {
  EXPECT_EQ(analyze({}, 2).kind, Finding::Kind::no_data);
  auto bad =
      parse_summary(R"({"file":"nccl-flight-rank-1","rank":1,"error":"UnpicklingError: refused global os.system"})");
  EXPECT_EQ(bad.rank, 1);
  EXPECT_NE(bad.error, "");
  auto f = analyze({bad}, 2);
  EXPECT_EQ(f.kind, Finding::Kind::no_data);
  EXPECT_EQ(f.missing, (Ranks{0, 1}));
  EXPECT_EQ(format_finding(f),
            "flight recorder: no rank's dump could be read; no dump from ranks 0,1 (rank 1's: UnpicklingError: refused "
            "global os.system)");
  // Next to a good one: the bad one is a missing rank with its reason.
  auto g = analyze({dump(0, steps(2, "started")), bad}, 2);
  EXPECT_EQ(g.kind, Finding::Kind::not_completed);
  EXPECT_EQ(g.missing, (Ranks{1}));
  EXPECT_EQ(g.errors.at(1), "UnpicklingError: refused global os.system");
}

TEST(FlightAnalysis, ADuplicateRankCountsOnce) {
  auto f = analyze({dump(0, steps(2, "completed")), dump(0, steps(5, "started")), dump(1, steps(2, "completed"))}, 2);
  EXPECT_EQ(f.kind, Finding::Kind::agree);
}

TEST(FlightSummary, GarbageIsAnErrorNeverAThrow) {
  for (const std::string& s : std::vector<std::string>{
           "", "{", "[]", "null", "42", "\"x\"", R"({"rank":"zero","entries":[]})", R"({"rank":-3,"entries":[]})",
           R"({"rank":0})", R"({"rank":0,"entries":{}})", std::string(50, '[') + std::string(50, ']'),
           R"({"rank":0,"entries":[)" + std::string(40, '[') + std::string(40, ']') + "]}"}) {
    auto d = parse_summary(s);
    EXPECT_NE(d.error, "") << s;
  }
  EXPECT_NE(parse_summary(std::string(kMaxSummaryBytes + 1, ' ')).error, "");
}

TEST(FlightSummary, OddFieldsAreToleratedAndBounded) {
  json e = entry("0", 1, "all_reduce", "completed");
  e["seq"] = -5;  // dropped
  json e2 = entry("0", 2, "all_reduce", "weird");
  e2["in"] = json::array({json::array({1, "x", 3}), 5, json::array()});
  e2["op"] = std::string(10000, 'a');
  json es = json::array({e, e2, 7, "x"});
  for (int i = 0; i < 5000; ++i) es.push_back(entry("0", 3, "all_reduce", "completed"));
  json j{{"rank", 2}, {"entries", es}, {"groups", {{"0", {{"ranks", {0, "one", -1, 2, 2}}}}, {"x", 5}}}};
  auto d = parse_summary(j.dump());
  EXPECT_EQ(d.error, "");
  EXPECT_EQ(d.rank, 2);
  ASSERT_EQ(d.entries.size(), kMaxEntries);
  EXPECT_EQ(d.entries[0].seq, 2u);
  EXPECT_EQ(d.entries[0].state, FlightState::unknown);
  EXPECT_EQ(d.entries[0].op.size(), 128u);
  EXPECT_EQ(d.entries[0].in, (std::vector<std::vector<std::int64_t>>{{1, 0, 3}, {}}));
  EXPECT_EQ(d.groups.at("0"), (std::vector<int>{0, 2}));
  EXPECT_FALSE(d.groups.count("x"));
}

TEST(FlightSummary, BytesAndDtypes) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(4u << 20), "4 MiB");
  EXPECT_EQ(dtype_size("BFloat16"), 2u);
  EXPECT_EQ(dtype_size("Nonsense"), std::nullopt);
  // An unknown dtype: the shape is shown instead of a size.
  std::vector<RankDump> d{dump(0, json::array({entry("0", 1, "all_reduce", "started", {3, 5}, "Float9")})),
                          dump(1, json::array())};
  auto f = analyze(d, 2);
  EXPECT_EQ(f.bytes, std::nullopt);
  EXPECT_EQ(format_finding(f), "flight recorder: rank 0 entered all_reduce #1 (pg 0, [3,5]), rank 1 did not");
  // Sizes that would overflow give no size rather than a wrong one.
  std::vector<RankDump> big{dump(0, json::array({entry("0", 1, "all_reduce", "started", {INT64_MAX, INT64_MAX})})),
                            dump(1, json::array())};
  EXPECT_EQ(analyze(big, 2).bytes, std::nullopt);
}

TEST(FlightSummary, ToJsonRoundTripsAndFitsOneFrame) {
  auto d = dump(3, steps(50, "started"), json{{"0", {{"ranks", {0, 1, 2, 3}}}}});
  auto back = parse_summary(to_json(d).dump());
  EXPECT_EQ(back.error, "");
  EXPECT_EQ(back.rank, 3);
  ASSERT_EQ(back.entries.size(), 50u);
  EXPECT_EQ(back.entries.back().seq, 50u);
  EXPECT_EQ(back.entries.back().state, FlightState::started);
  EXPECT_EQ(back.entries.back().in, d.entries.back().in);
  EXPECT_EQ(back.groups.at("0"), (std::vector<int>{0, 1, 2, 3}));
  RankDump bad;
  bad.rank = 4;
  bad.error = "UnpicklingError";
  EXPECT_EQ(parse_summary(to_json(bad).dump()).error, "UnpicklingError");

  // Eight ranks of 50 entries do not fit in 8 KiB: the oldest go, the newest stay, and the
  // analysis still sees where each rank got to.
  std::vector<RankDump> node;
  for (int r = 0; r < 8; ++r) node.push_back(dump(r, steps(r == 5 ? 49 : 50, r == 5 ? "completed" : "started")));
  ASSERT_TRUE(fit_summaries(node, 8192));
  std::size_t total = 0;
  for (const auto& x : node) total += to_json(x).dump().size() + 1;
  EXPECT_LE(total, 8192u);
  EXPECT_GE(node[0].entries.size(), 1u);
  EXPECT_EQ(node[0].entries.back().seq, 50u);
  auto f = analyze(node, 8);
  EXPECT_EQ(f.kind, Finding::Kind::not_entered);
  EXPECT_EQ(f.seq, 50u);
  EXPECT_EQ(f.behind, (Ranks{5}));
  // Nothing fits: errors only, and false.
  EXPECT_FALSE(fit_summaries(node, 10));
  EXPECT_NE(node[0].error, "");
}

TEST(FlightSummary, TextIsCutOnCharactersAndControlsAreReplaced) {
  // A dump's strings are the job's: a cut inside a character, an escape or a bidi override
  // would reach a terminal, or make the report's strict JSON dump throw.
  json e = entry("0", 1, "all_reduce", "completed");
  e["op"] = std::string(127, 'a') + "\xc3\xa9";  // the 128-byte cap falls inside "é"
  e["desc"] = "x\x1b[2Jy\xe2\x80\xae";
  json j{{"rank", 0},
         {"version",
          "2.\xc2\x9b"
          "1"},
         {"entries", json::array({e})}};
  auto d = parse_summary(j.dump());
  ASSERT_EQ(d.error, "");
  ASSERT_EQ(d.entries.size(), 1u);
  EXPECT_EQ(d.entries[0].op, std::string(127, 'a'));
  EXPECT_EQ(d.entries[0].desc, "x?[2Jy?");
  EXPECT_EQ(d.version, "2.?1");
  EXPECT_NO_THROW(to_json(d).dump());
  json err{{"rank", 0}, {"error", std::string(511, 'e') + "\xe2\x82\xac"}};
  EXPECT_EQ(parse_summary(err.dump()).error, std::string(511, 'e'));
}

TEST(FlightSummary, ANodeThatSendsAgainReplacesItsSummaries) {
  // The coordinator keeps every node's summaries of a round; a node's second message must not
  // count its ranks twice, nor may a node speak for ranks it does not hold.
  auto summary = [](int rank, int n) {
    return json{
        {"file", "nccl-flight-rank-" + std::to_string(rank)}, {"rank", rank}, {"entries", steps(n, "completed")}};
  };
  std::vector<RankDump> all;
  take_node_summaries(all, "b", 2, 2, json::array({summary(2, 1), summary(3, 1)}));
  take_node_summaries(all, "a", 0, 2, json::array({summary(0, 1), summary(1, 1), summary(2, 9), summary(0, 5)}));
  ASSERT_EQ(all.size(), 4u);
  take_node_summaries(all, "a", 0, 2, json::array({summary(0, 3)}));
  ASSERT_EQ(all.size(), 3u);
  int a = 0;
  for (const auto& d : all) {
    if (d.node != "a") continue;
    ++a;
    EXPECT_EQ(d.rank, 0);
    EXPECT_EQ(d.entries.size(), 3u);
  }
  EXPECT_EQ(a, 1);
  take_node_summaries(all, "a", 0, 2, json("not an array"));
  EXPECT_EQ(all.size(), 3u);
}

#include "common/duration.hpp"
#include "common/journal.hpp"
#include "common/size.hpp"
#include "common/strings.hpp"
#include "common/text.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

using namespace ddp;
using namespace std::chrono_literals;

TEST(Duration, ParsesUnitsAndBareSeconds) {
  EXPECT_EQ(parse_duration("30s"), Millis(30s));
  EXPECT_EQ(parse_duration("10m"), Millis(10min));
  EXPECT_EQ(parse_duration("1h30m"), Millis(90min));
  EXPECT_EQ(parse_duration("250ms"), Millis(250));
  EXPECT_EQ(parse_duration("5"), Millis(5s));
  EXPECT_EQ(parse_duration("0s"), Millis(0));
}

TEST(Duration, TakesFractionsToTheMillisecond) {
  EXPECT_EQ(parse_duration("1.5s"), Millis(1500));
  EXPECT_EQ(parse_duration("0.25"), Millis(250));  // bare seconds, as torchrun's float flags
  EXPECT_EQ(parse_duration("1.5m"), Millis(90s));
  EXPECT_EQ(parse_duration("0.001s"), Millis(1));
  EXPECT_EQ(parse_duration("1h0.5m"), Millis(3630s));
  EXPECT_EQ(parse_duration("2.0000000000s").has_value(), false);  // ten digits: refused, not rounded
  for (const char* bad : {"1.5ms", "0.0001s", "1.s", ".5s", "1..5s", "1.5.5s"}) {
    EXPECT_FALSE(parse_duration(bad).has_value()) << bad;
  }
}

TEST(Duration, RejectsGarbage) {
  for (const char* bad : {"", "s", "5x", "-5s", "5 s", "5m3", "99999999999999s", "3000000h"}) {
    EXPECT_FALSE(parse_duration(bad).has_value()) << bad;
  }
}

TEST(Duration, FormatsRoundTrip) {
  EXPECT_EQ(format_duration(Millis(30s)), "30s");
  EXPECT_EQ(format_duration(Millis(10min)), "10m");
  EXPECT_EQ(format_duration(Millis(250)), "250ms");
  EXPECT_EQ(parse_duration(format_duration(Millis(7200s))), Millis(7200s));
}

TEST(Strings, NearestFindsTypos) {
  std::vector<std::string> keys{"nproc_per_node", "command", "restart", "workdir"};
  EXPECT_EQ(nearest("nproc_per_nod", keys), "nproc_per_node");
  EXPECT_EQ(nearest("comand", keys), "command");
  EXPECT_FALSE(nearest("totally_unrelated", keys).has_value());
}

TEST(Strings, ParseIntIsStrict) {
  EXPECT_EQ(parse_int("42"), 42);
  EXPECT_EQ(parse_int("-3"), -3);
  EXPECT_FALSE(parse_int("4x").has_value());
  EXPECT_FALSE(parse_int("").has_value());
  EXPECT_FALSE(parse_int(" 4").has_value());
}

TEST(Strings, ShellQuote) {
  EXPECT_EQ(shell_quote("plain-arg"), "plain-arg");
  EXPECT_EQ(shell_quote("two words"), "'two words'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quote(""), "''");
}

TEST(Strings, JoinFirstSaysHowManyItLeftOut) {
  const std::vector<std::string> v{"a", "b", "c", "d"};
  EXPECT_EQ(join_first(v, ", ", 4), "a, b, c, d");
  EXPECT_EQ(join_first(v, ", ", 9), "a, b, c, d");
  EXPECT_EQ(join_first(v, ", ", 2), "a, b, and 2 more");
  EXPECT_EQ(join_first(v, "; ", 0), "and 4 more");
  EXPECT_EQ(join_first({}, ", ", 0), "");
}

// Issue 25: "ranks 0-0" for a node with one worker.
TEST(Strings, RankRange) {
  EXPECT_EQ(rank_range(0, 1), "rank 0");
  EXPECT_EQ(rank_range(4, 4), "ranks 4-7");
  EXPECT_EQ(rank_range(3, 0), "no ranks");
}

// One size syntax for the job file (logs.max_size, store.max_size) and agent.yaml (limits:).
TEST(Strings, ParseSize) {
  EXPECT_EQ(ddp::parse_size("100"), 100u);
  EXPECT_EQ(ddp::parse_size("100B"), 100u);
  EXPECT_EQ(ddp::parse_size("4 KiB"), 4096u);
  EXPECT_EQ(ddp::parse_size("100MiB"), 100ull << 20);
  EXPECT_EQ(ddp::parse_size("1GiB"), 1ull << 30);
  EXPECT_EQ(ddp::parse_size("2TiB"), 2ull << 40);
  EXPECT_EQ(ddp::parse_size("5MB"), 5000000u);
  EXPECT_EQ(ddp::parse_size("1024TiB"), 1ull << 50);  // a petabyte: the most
  EXPECT_FALSE(ddp::parse_size("1025TiB"));
  EXPECT_FALSE(ddp::parse_size("9999999999999999"));  // 16 digits
  for (const char* bad : {"", "MiB", "1.5GiB", "-1", "10 mib", "10GiBs", "lots", " 10"})
    EXPECT_FALSE(ddp::parse_size(bad)) << bad;
}

TEST(Strings, CleanTextCutsOnCharacterBoundaries) {
  // "é" is two bytes: a cap of 2 after "a" keeps "a", never half of it.
  EXPECT_EQ(ddp::clean_text("a\xc3\xa9", 2), "a");
  EXPECT_EQ(ddp::clean_text("a\xc3\xa9", 3), "a\xc3\xa9");
  EXPECT_EQ(ddp::clean_text("\xe2\x82\xac\xe2\x82\xac", 5), "\xe2\x82\xac");  // two euros, room for one
}

TEST(Strings, CleanTextReplacesInvalidSequences) {
  EXPECT_EQ(ddp::clean_text("\xed\xa0\x80", 64), "???");       // a surrogate (U+D800)
  EXPECT_EQ(ddp::clean_text("\xc0\xaf", 64), "??");            // overlong '/'
  EXPECT_EQ(ddp::clean_text("\xe0\x80\xaf", 64), "???");       // overlong, three bytes
  EXPECT_EQ(ddp::clean_text("\xf0\x80\x80\xaf", 64), "????");  // overlong, four bytes
  EXPECT_EQ(ddp::clean_text("\xf4\x90\x80\x80", 64), "????");  // above U+10FFFF
  EXPECT_EQ(ddp::clean_text("\xff"
                            "x\x80",
                            64),
            "?x?");
  EXPECT_EQ(ddp::clean_text("\xe2\x82", 64), "??");                        // cut short
  EXPECT_EQ(ddp::clean_text("\xf4\x8f\xbf\xbf", 64), "\xf4\x8f\xbf\xbf");  // U+10FFFF itself is fine
}

TEST(Strings, Utf8IsTheShortestFormOfAScalarValue) {
  // The rule clean_text and the JSON reader share (common/text.hpp): what a strict JSON dump takes.
  for (const std::string& good : std::vector<std::string>{"", "plain", std::string("nul\0", 4), "caf\xc3\xa9",
                                                          "\xe2\x82\xac", "\xf4\x8f\xbf\xbf"}) {
    EXPECT_TRUE(ddp::valid_utf8(good)) << good;
    EXPECT_NO_THROW((void)nlohmann::json(good).dump());
  }
  for (const std::string bad :
       {"\xed\xa0\x80", "\xc0\xaf", "\xe0\x80\xaf", "\xf4\x90\x80\x80", "x\x80", "\xe2\x82", "\xff"}) {
    EXPECT_FALSE(ddp::valid_utf8(bad)) << bad;
    EXPECT_THROW((void)nlohmann::json(bad).dump(), nlohmann::json::type_error);
  }
  EXPECT_EQ(ddp::utf8_length("a\xe2\x82\xac", 0), 1u);
  EXPECT_EQ(ddp::utf8_length("a\xe2\x82\xac", 1), 3u);
  EXPECT_EQ(ddp::utf8_length("a\xe2\x82", 1), 0u);  // cut short by the end of the text
}

TEST(Strings, CleanTextReplacesControlsAndBidiOverrides) {
  EXPECT_EQ(ddp::clean_text("a\x1b[2Jb\x7f", 64), "a?[2Jb?");
  EXPECT_EQ(ddp::clean_text("a\nb\tc", 64), "a?b?c");
  EXPECT_EQ(ddp::clean_text("a\nb\tc\r", 64, "\n\t"), "a\nb\tc?");
  EXPECT_EQ(ddp::clean_text("\xc2\x9b"
                            "1m",
                            64),
            "?1m");                                                        // C1 CSI
  EXPECT_EQ(ddp::clean_text("x\xe2\x80\xaey\xe2\x81\xa6z", 64), "x?y?z");  // RLO, LRI
  EXPECT_EQ(ddp::clean_text("\xe2\x80\x94", 64), "\xe2\x80\x94");          // an em dash stays
}

TEST(JournalFields, TakeTheJobRoundAndRankOfTheAgentsLines) {
  using F = std::vector<std::pair<std::string, std::string>>;
  using ddp::log::journal_fields;
  EXPECT_EQ(journal_fields("job j-1 round 2: rank 3 exited with code 1; stopping this node's other workers"),
            (F{{"DDP_JOB_ID", "j-1"}, {"DDP_ROUND", "2"}, {"DDP_RANK", "3"}}));
  // "node rank" is not a rank: only ": rank <r> " right after the job (and round) counts.
  EXPECT_EQ(journal_fields("job j round 1: node rank 0 of 1, ranks 0-1 of 2, master 127.0.0.1:29500"),
            (F{{"DDP_JOB_ID", "j"}, {"DDP_ROUND", "1"}}));
  EXPECT_EQ(journal_fields("job j: store on 127.0.0.1:29500"), (F{{"DDP_JOB_ID", "j"}}));
  EXPECT_EQ(journal_fields("job j from 10.0.0.1:5000: refused"), (F{{"DDP_JOB_ID", "j"}}));
  EXPECT_EQ(journal_fields("job j: rank 12x"), (F{{"DDP_JOB_ID", "j"}}));
  EXPECT_TRUE(journal_fields("jobs are refused").empty());
  EXPECT_TRUE(journal_fields("listening on [::]:29410").empty());
  EXPECT_TRUE(journal_fields("job ").empty());
}

TEST(JournalFields, TheStreamMatchesOnlyItsDeviceAndInode) {
  using ddp::log::is_journal_stream;
  EXPECT_TRUE(is_journal_stream("8:1234", 8, 1234));
  EXPECT_FALSE(is_journal_stream("8:1234", 8, 1235));
  EXPECT_FALSE(is_journal_stream("", 8, 1234));
  EXPECT_FALSE(is_journal_stream(nullptr, 8, 1234));
}

// Store semantics, pure: WAIT/CANCEL_WAIT ordering, ADD's decimal storage, COMPARE_SET's
// quirks, queues waking one, BARRIER, WATCH_KEY pushes, DELETE_KEY, GETNUMKEYS, the wait report,
// the store's totals (bytes, keys, queue items, registrations) and APPEND's value limit.
#include "store/state.hpp"
#include "store/report.hpp"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <map>

using namespace ddp::store;
using namespace std::chrono_literals;
using ::testing::HasSubstr;

namespace {

std::string u8(uint8_t v) {
  return std::string(1, static_cast<char>(v));
}
std::string i64(int64_t v) {
  std::string s;
  put_i64(s, v);
  return s;
}
std::string bytes(std::string_view v) {
  std::string s;
  put_bytes(s, v);
  return s;
}

struct Harness {
  Harness() = default;
  Harness(Limits limits, Totals totals) : st(limits, totals) {}
  State st;
  Effects fx;
  Clock::time_point now = Clock::time_point(1000s);

  Effects& run(ClientId c, Request r) {
    fx.clear();
    st.apply(c, r, now, fx);
    return fx;
  }
  Effects& set(ClientId c, std::string k, std::string v) {
    Request r;
    r.op = Op::set;
    r.key = std::move(k);
    r.value = std::move(v);
    return run(c, r);
  }
  Effects& get(ClientId c, std::string k) {
    Request r;
    r.op = Op::get;
    r.key = std::move(k);
    return run(c, r);
  }
  Effects& add(ClientId c, std::string k, int64_t d) {
    Request r;
    r.op = Op::add;
    r.key = std::move(k);
    r.number = d;
    return run(c, r);
  }
  Effects& wait(ClientId c, std::vector<std::string> keys) {
    Request r;
    r.op = Op::wait;
    r.keys = std::move(keys);
    return run(c, r);
  }
  Effects& check(ClientId c, std::vector<std::string> keys) {
    Request r;
    r.op = Op::check;
    r.keys = std::move(keys);
    return run(c, r);
  }
  Effects& simple(ClientId c, Op op, std::string k = {}) {
    Request r;
    r.op = op;
    r.key = std::move(k);
    return run(c, r);
  }
  Effects& cas(ClientId c, std::string k, std::string expected, std::string desired) {
    Request r;
    r.op = Op::compare_set;
    r.key = std::move(k);
    r.value = std::move(expected);
    r.value2 = std::move(desired);
    return run(c, r);
  }
  Effects& push(ClientId c, std::string k, std::string v) {
    Request r;
    r.op = Op::queue_push;
    r.key = std::move(k);
    r.value = std::move(v);
    return run(c, r);
  }
  Effects& barrier(ClientId c, std::string k, int64_t world) {
    Request r;
    r.op = Op::barrier;
    r.key = std::move(k);
    r.number = world;
    return run(c, r);
  }
};

using Pushes = std::vector<std::pair<ClientId, std::string>>;
// The pushes of one event, as (client, bytes).
Pushes flat(const Effects& fx) {
  Pushes out;
  for (const auto& p : fx.pushes) out.emplace_back(p.to, *p.bytes);
  return out;
}

}  // namespace

TEST(StoreState, WaitRepliesAtOnceWhenAllKeysExist) {
  Harness h;
  h.set(1, "/a", "1");
  EXPECT_EQ(h.wait(2, {"/a"}).reply, u8(kStopWaiting));
  EXPECT_FALSE(h.st.is_waiting(2));
}

TEST(StoreState, WaitRegistersOnlyMissingKeysAndWakesWhenTheLastAppears) {
  Harness h;
  h.set(1, "/a", "1");
  EXPECT_EQ(h.wait(2, {"/a", "/b", "/c"}).reply, "");
  EXPECT_TRUE(h.st.is_waiting(2));
  auto w = h.st.waiters();
  ASSERT_EQ(w.size(), 2u);  // /b and /c, not /a
  EXPECT_EQ(w[0].key, "/b");
  EXPECT_EQ(w[1].key, "/c");
  EXPECT_TRUE(h.set(1, "/b", "x").pushes.empty());
  EXPECT_EQ(flat(h.add(1, "/c", 1)), (Pushes{{2, u8(kStopWaiting)}}));
  EXPECT_FALSE(h.st.is_waiting(2));
  EXPECT_TRUE(h.st.waiters().empty());
}

TEST(StoreState, EveryWriterWakesWaiters) {
  for (int how = 0; how < 5; ++how) {
    Harness h;
    h.wait(2, {"/k"});
    Request r;
    r.key = "/k";
    switch (how) {
      case 0:
        r.op = Op::set;
        break;
      case 1:
        r.op = Op::add;
        break;
      case 2:
        r.op = Op::append;
        r.value = "z";
        break;
      case 3:
        r.op = Op::multi_set;
        r.keys = {"/k"};
        r.values = {"v"};
        break;
      case 4:
        r.op = Op::compare_set;
        r.value2 = "v";
        break;
    }
    EXPECT_EQ(flat(h.run(1, r)), (Pushes{{2, u8(kStopWaiting)}})) << how;
  }
}

TEST(StoreState, CancelWaitRepliesCanceledAndDropsTheWait) {
  Harness h;
  h.wait(2, {"/k"});
  EXPECT_EQ(h.simple(2, Op::cancel_wait).reply, u8(kWaitCanceled));
  EXPECT_FALSE(h.st.is_waiting(2));
  EXPECT_TRUE(h.set(1, "/k", "v").pushes.empty());  // nobody left to wake
}

TEST(StoreState, CancelWaitAfterStopWaitingStillRepliesCanceled) {
  // The race the 2.x client expects: STOP_WAITING went out, then its CANCEL_WAIT arrives.
  Harness h;
  h.wait(2, {"/k"});
  EXPECT_EQ(flat(h.set(1, "/k", "v")), (Pushes{{2, u8(kStopWaiting)}}));
  EXPECT_EQ(h.simple(2, Op::cancel_wait).reply, u8(kWaitCanceled));
}

TEST(StoreState, AnotherRequestFromAWaiterMeansItGaveUp) {
  // A 1.13 client whose recv timed out sends its next request; no stale STOP_WAITING may follow.
  Harness h;
  h.wait(2, {"/k"});
  auto& fx = h.simple(2, Op::get_num_keys);
  EXPECT_TRUE(fx.gave_up_wait);
  EXPECT_EQ(fx.reply, i64(0));
  EXPECT_TRUE(h.set(1, "/k", "v").pushes.empty());
}

TEST(StoreState, DisconnectDropsWaitsAndWatches) {
  Harness h;
  h.wait(2, {"/k"});
  h.simple(3, Op::watch_key, "/k");
  h.st.disconnect(2);
  h.st.disconnect(3);
  EXPECT_TRUE(h.set(1, "/k", "v").pushes.empty());
  EXPECT_TRUE(h.st.waiters().empty());
}

TEST(StoreState, AddStoresDecimalAscii) {
  Harness h;
  EXPECT_EQ(h.add(1, "/c", 5).reply, i64(5));
  EXPECT_EQ(*h.st.find("/c"), "5");
  EXPECT_EQ(h.add(1, "/c", -12).reply, i64(-7));
  EXPECT_EQ(*h.st.find("/c"), "-7");
  h.set(1, "/s", " +42xyz");  // std::stoll reads the leading number, ignores the rest
  EXPECT_EQ(h.add(1, "/s", 0).reply, i64(42));
  EXPECT_EQ(*h.st.find("/s"), "42");
  h.set(1, "/big", "9223372036854775807");
  EXPECT_EQ(h.add(1, "/big", 1).reply, i64(INT64_MIN));  // wraps
}

TEST(StoreState, AddOnANonNumberClosesThatClient) {
  Harness h;
  h.set(1, "/s", "abc");
  auto& fx = h.add(2, "/s", 1);
  EXPECT_FALSE(fx.close_reason.empty());
  EXPECT_EQ(fx.reply, "");
  EXPECT_EQ(*h.st.find("/s"), "abc");
  h.set(1, "/o", "99999999999999999999");  // out of range for stoll
  EXPECT_FALSE(h.add(2, "/o", 1).close_reason.empty());
}

// The reason goes to the store's log: a key is the client's bytes, shown escaped (no line of
// its own, no terminal escape, no backtick ending its quote early), as every other key in the
// store's messages.
TEST(StoreState, AReasonShowsTheKeyEscaped) {
  Harness h;
  const std::string key = "/k\n\x1b[31mfake` log line";
  h.set(1, key, "abc");
  const std::string add_why = h.add(2, key, 1).close_reason;
  EXPECT_THAT(add_why, HasSubstr("ADD on key `/k\\x0a\\x1b[31mfake\\x60 log line` whose value")) << add_why;
  const std::string barrier_why = h.barrier(3, key, 2).close_reason;
  EXPECT_THAT(barrier_why, HasSubstr("BARRIER on key `/k\\x0a\\x1b[31mfake\\x60 log line`")) << barrier_why;
  for (const auto& why : {add_why, barrier_why}) {
    EXPECT_EQ(why.find('\n'), std::string::npos) << why;
    EXPECT_EQ(why.find('\x1b'), std::string::npos) << why;
  }
}

TEST(StoreState, ParseLikeStoll) {
  EXPECT_EQ(parse_like_stoll("12"), 12);
  EXPECT_EQ(parse_like_stoll("\t\n -3abc"), -3);
  EXPECT_EQ(parse_like_stoll("-9223372036854775808"), INT64_MIN);
  EXPECT_EQ(parse_like_stoll("9223372036854775808"), std::nullopt);
  EXPECT_EQ(parse_like_stoll(""), std::nullopt);
  EXPECT_EQ(parse_like_stoll("-"), std::nullopt);
  EXPECT_EQ(parse_like_stoll("x1"), std::nullopt);
}

TEST(StoreState, CompareSetQuirks) {
  Harness h;
  // Missing + expected empty: store desired, return desired.
  EXPECT_EQ(h.cas(1, "/k", "", "d1").reply, bytes("d1"));
  EXPECT_EQ(*h.st.find("/k"), "d1");
  // Missing + expected non-empty: return expected, store nothing.
  EXPECT_EQ(h.cas(1, "/m", "exp", "d").reply, bytes("exp"));
  EXPECT_EQ(h.st.find("/m"), nullptr);
  // Present, equal: replace, return the new value.
  EXPECT_EQ(h.cas(1, "/k", "d1", "d2").reply, bytes("d2"));
  EXPECT_EQ(*h.st.find("/k"), "d2");
  // Present, different: keep, return the current value.
  EXPECT_EQ(h.cas(1, "/k", "nope", "d3").reply, bytes("d2"));
  EXPECT_EQ(*h.st.find("/k"), "d2");
  // Present with an empty expected that does not match.
  EXPECT_EQ(h.cas(1, "/k", "", "d4").reply, bytes("d2"));
}

TEST(StoreState, GetOfAMissingKeyIsEmpty) {
  Harness h;
  EXPECT_EQ(h.get(1, "/none").reply, bytes(""));
  EXPECT_TRUE(h.get(1, "/none").close_reason.empty());
}

TEST(StoreState, DeleteReturnsCountAndNumKeysCountsTheMapOnly) {
  Harness h;
  h.set(1, "/a", "1");
  h.add(1, "init/", 1);
  h.push(1, "/q", "x");
  EXPECT_EQ(h.simple(1, Op::get_num_keys).reply, i64(2));
  EXPECT_EQ(h.simple(1, Op::delete_key, "/a").reply, i64(1));
  EXPECT_EQ(h.simple(1, Op::delete_key, "/a").reply, i64(0));
  EXPECT_EQ(h.simple(1, Op::get_num_keys).reply, i64(1));
  auto& lk = h.simple(1, Op::list_keys);
  EXPECT_EQ(lk.reply, i64(1) + bytes("init/"));
}

TEST(StoreState, CheckTreatsANonEmptyQueueAsExisting) {
  Harness h;
  EXPECT_EQ(h.check(1, {"/q"}).reply, u8(kCheckNotReady));
  h.push(1, "/q", "x");
  EXPECT_EQ(h.check(1, {"/q"}).reply, u8(kCheckReady));
  EXPECT_EQ(h.wait(1, {"/q"}).reply, u8(kStopWaiting));
  EXPECT_EQ(h.simple(1, Op::queue_len, "/q").reply, i64(1));
  EXPECT_EQ(h.simple(1, Op::queue_pop, "/q").reply, i64(1) + bytes("x"));
  EXPECT_EQ(h.simple(1, Op::queue_pop, "/q").reply, i64(0));
  EXPECT_EQ(h.check(1, {"/q"}).reply, u8(kCheckNotReady));
}

TEST(StoreState, QueuePushWakesOneWaiter) {
  Harness h;
  h.wait(2, {"/q"});
  h.wait(3, {"/q"});
  h.wait(4, {"/q"});
  EXPECT_EQ(flat(h.push(1, "/q", "a")), (Pushes{{2, u8(kStopWaiting)}}));
  EXPECT_EQ(h.simple(2, Op::queue_pop, "/q").reply, i64(1) + bytes("a"));
  EXPECT_EQ(flat(h.push(1, "/q", "b")), (Pushes{{3, u8(kStopWaiting)}}));
  EXPECT_TRUE(h.st.is_waiting(4));
  EXPECT_EQ(h.simple(1, Op::queue_len, "/q").reply, i64(1));
  // A SET of the same key wakes everyone left.
  EXPECT_EQ(flat(h.set(1, "/q", "v")), (Pushes{{4, u8(kStopWaiting)}}));
}

TEST(StoreState, QueueFifoOrder) {
  Harness h;
  for (const char* v : {"1", "2", "3"}) h.push(1, "/q", v);
  EXPECT_EQ(h.simple(1, Op::queue_pop, "/q").reply, i64(3) + bytes("1"));
  EXPECT_EQ(h.simple(1, Op::queue_pop, "/q").reply, i64(2) + bytes("2"));
}

TEST(StoreState, BarrierCountsAndWakesAllAtWorldSize) {
  Harness h;
  EXPECT_EQ(h.barrier(1, "/b", 3).reply, "");
  EXPECT_EQ(*h.st.find("/b"), "1");
  EXPECT_EQ(h.barrier(2, "/b", 3).reply, "");
  auto w = h.st.waiters();
  ASSERT_EQ(w.size(), 1u);
  EXPECT_TRUE(w[0].barrier);
  EXPECT_EQ(w[0].clients.size(), 2u);
  auto& fx = h.barrier(3, "/b", 3);
  EXPECT_EQ(fx.reply, u8(kStopWaiting));
  EXPECT_EQ(flat(fx), (Pushes{{1, u8(kStopWaiting)}, {2, u8(kStopWaiting)}}));
  EXPECT_EQ(*h.st.find("/b"), "3");
  // A barrier waiter can cancel.
  h.barrier(4, "/b2", 2);
  EXPECT_EQ(h.simple(4, Op::cancel_wait).reply, u8(kWaitCanceled));
  EXPECT_TRUE(h.st.waiters().empty());
}

TEST(StoreState, WatchKeyPushesCreatedUpdatedDeleted) {
  Harness h;
  EXPECT_EQ(h.simple(9, Op::watch_key, "/w").reply, u8(kWatchCallbackRegistered));
  auto push = [](uint8_t type, std::string_view k, std::string_view o, std::string_view n) {
    return u8(type) + bytes(k) + bytes(o) + bytes(n);
  };
  EXPECT_EQ(flat(h.set(1, "/w", "a")), (Pushes{{9, push(kWatchKeyCreated, "/w", "", "a")}}));
  EXPECT_EQ(flat(h.set(1, "/w", "b")), (Pushes{{9, push(kWatchKeyUpdated, "/w", "a", "b")}}));
  EXPECT_EQ(flat(h.cas(1, "/w", "b", "c")), (Pushes{{9, push(kWatchKeyUpdated, "/w", "b", "c")}}));
  EXPECT_TRUE(h.cas(1, "/w", "zz", "d").pushes.empty());  // no change, no push
  EXPECT_EQ(flat(h.simple(1, Op::delete_key, "/w")), (Pushes{{9, push(kWatchKeyDeleted, "/w", "c", "")}}));
  EXPECT_EQ(flat(h.add(1, "/w", 3)), (Pushes{{9, push(kWatchKeyCreated, "/w", "", "3")}}));
  EXPECT_EQ(flat(h.add(1, "/w", 3)), (Pushes{{9, push(kWatchKeyUpdated, "/w", "3", "6")}}));
  EXPECT_TRUE(h.set(1, "/other", "x").pushes.empty());
}

TEST(StoreState, PingRecordsThePid) {
  Harness h;
  Request r;
  r.op = Op::ping;
  r.word = 4242;
  std::string echo;
  put_u32(echo, 4242);
  EXPECT_EQ(h.run(5, r).reply, echo);
  EXPECT_EQ(h.st.client_pid(5), 4242u);
}

TEST(StoreState, WrongValidateMagicCloses) {
  Harness h;
  Request r;
  r.op = Op::validate;
  r.word = 1;
  EXPECT_FALSE(h.run(5, r).close_reason.empty());
  r.word = kValidateMagic;
  EXPECT_TRUE(h.run(5, r).close_reason.empty());
  EXPECT_EQ(h.fx.reply, "");
}

TEST(StoreState, MultiGetAndAppend) {
  Harness h;
  h.set(1, "/a", "1");
  Request ap;
  ap.op = Op::append;
  ap.key = "/a";
  ap.value = "23";
  h.run(1, ap);
  Request mg;
  mg.op = Op::multi_get;
  mg.keys = {"/a", "/missing"};
  EXPECT_EQ(h.run(1, mg).reply, bytes("123") + bytes(""));
}

TEST(StoreState, ResetDropsEverything) {
  Harness h;
  h.set(1, "/a", "1");
  h.wait(2, {"/b"});
  h.push(1, "/q", "x");
  h.st.reset();
  EXPECT_EQ(h.st.num_keys(), 0u);
  EXPECT_EQ(h.st.queue_length("/q"), 0u);
  EXPECT_TRUE(h.st.waiters().empty());
  EXPECT_TRUE(h.set(1, "/b", "v").pushes.empty());
}

TEST(StoreState, WaitersRememberDeletedKeys) {
  Harness h;
  h.set(1, "/gone", "x");
  h.simple(1, Op::delete_key, "/gone");
  h.now += 5s;
  h.wait(2, {"/gone", "/never"});
  auto w = h.st.waiters();
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0].key, "/gone");
  EXPECT_TRUE(w[0].deleted);
  EXPECT_FALSE(w[1].deleted);
  EXPECT_EQ(w[1].clients.front().second, h.now);
}

TEST(StoreReport, FormatsOneLinePerKeyWithRanks) {
  WaitReport r;
  auto t0 = Clock::time_point(100s);
  WaitedKey k;
  k.key = "/default_pg/0//cuda//0";
  for (int rank : {1, 2, 3, 5}) k.waiters.push_back({.rank = rank, .since = t0});
  k.waiters.push_back({.pid = 777, .since = t0 + 10s});
  k.waiters.push_back({.since = t0 + 20s});
  r.waited.push_back(k);
  WaitedKey d;
  d.key = "/x";
  d.deleted = true;
  d.waiters.push_back({.since = t0 + 200s});
  r.waited.push_back(d);
  std::string text = format_wait_report(r, 16, t0 + 300s);
  EXPECT_EQ(text,
            "6/16 ranks waiting on `/default_pg/0//cuda//0` for 300 s (ranks 1-3,5; pid 777; 1 unidentified); "
            "set by nobody\n"
            "1/16 ranks waiting on `/x` for 100 s; it was set, then deleted");
  EXPECT_EQ(format_wait_report({}, 16, t0), "");
  WaitReport one;
  WaitedKey b;
  b.key = "/bar";
  b.barrier = true;
  b.waiters.push_back({.rank = 0, .since = t0});
  one.waited.push_back(b);
  EXPECT_EQ(format_wait_report(one, 0, t0 + 2s),
            "1 client in a barrier on `/bar` for 2 s (rank 0); barrier not reached");
}

TEST(StoreReport, RankList) {
  EXPECT_EQ(format_rank_list({5, 1, 2, 3, 3, 9, 10}), "1-3,5,9,10");
  EXPECT_EQ(format_rank_list({}), "");
  EXPECT_EQ(format_rank_list({0}), "0");
}

// ---------------------------------------------------------------------------------------------
// Totals: one job's store is bounded whoever writes it; a refused request changes nothing.

namespace {

Request appended(std::string k, std::string v) {
  Request r;
  r.op = Op::append;
  r.key = std::move(k);
  r.value = std::move(v);
  return r;
}

// The byte count from scratch: every key with its value, every queue's key and items.
std::size_t recount(const State& st, const std::vector<std::string>& keys, const std::vector<std::string>& queues) {
  std::size_t n = 0;
  for (const auto& k : keys) {
    if (const auto* v = st.find(k)) n += k.size() + v->size();
  }
  for (const auto& q : queues) {
    if (st.queue_length(q) > 0) n += q.size();  // items are added by the caller
  }
  return n;
}

}  // namespace

TEST(StoreTotals, SetPastTheByteTotalIsRefusedAndChangesNothing) {
  Harness h(Limits{}, Totals{.max_bytes = 100});
  EXPECT_TRUE(h.set(1, "/a", std::string(48, 'x')).close_reason.empty());  // 50 bytes
  EXPECT_TRUE(h.set(2, "/b", std::string(48, 'y')).close_reason.empty());  // 100: at the limit
  EXPECT_EQ(h.st.bytes(), 100u);
  const auto& why = h.set(3, "/c", "z").close_reason;
  EXPECT_NE(why.find("store full"), std::string::npos) << why;
  EXPECT_NE(why.find("store.max_size"), std::string::npos) << why;
  EXPECT_NE(why.find("`/c`"), std::string::npos) << why;
  EXPECT_EQ(h.st.find("/c"), nullptr);
  EXPECT_EQ(h.st.num_keys(), 2u);
  // Growing an existing value past it is refused too; the old value stays.
  EXPECT_FALSE(h.set(3, "/a", std::string(49, 'x')).close_reason.empty());
  EXPECT_EQ(*h.st.find("/a"), std::string(48, 'x'));
  // Shrinking is always allowed, and frees room.
  EXPECT_TRUE(h.set(1, "/a", "").close_reason.empty());
  EXPECT_EQ(h.st.bytes(), 52u);
  EXPECT_TRUE(h.set(3, "/c", "z").close_reason.empty());
  // DELETE_KEY frees what the key held.
  EXPECT_EQ(h.simple(1, Op::delete_key, "/b").reply, i64(1));
  EXPECT_EQ(h.st.bytes(), recount(h.st, {"/a", "/b", "/c"}, {}));
}

TEST(StoreTotals, KeyCountIsBounded) {
  Harness h(Limits{}, Totals{.max_keys = 3});
  for (auto k : {"/1", "/2", "/3"}) EXPECT_TRUE(h.set(1, k, "v").close_reason.empty());
  const auto& why = h.set(1, "/4", "v").close_reason;
  EXPECT_NE(why.find("store.max_keys"), std::string::npos) << why;
  EXPECT_EQ(h.st.num_keys(), 3u);
  EXPECT_TRUE(h.set(1, "/3", "replaced").close_reason.empty());  // not a new key
  EXPECT_FALSE(h.add(1, "/n", 1).close_reason.empty());
  EXPECT_FALSE(h.cas(1, "/n", "", "v").close_reason.empty());
  EXPECT_FALSE(h.barrier(1, "/n", 1).close_reason.empty());
  EXPECT_FALSE(h.run(1, appended("/n", "v")).close_reason.empty());
  EXPECT_EQ(h.st.find("/n"), nullptr);
  EXPECT_EQ(h.st.num_keys(), 3u);
}

TEST(StoreTotals, AppendPastTheValueLimitIsRefused) {
  Harness h(Limits{.max_value_bytes = 10}, Totals{});
  EXPECT_TRUE(h.run(1, appended("/a", "12345")).close_reason.empty());
  EXPECT_TRUE(h.run(1, appended("/a", "67890")).close_reason.empty());  // 10: at the limit
  const auto& why = h.run(1, appended("/a", "x")).close_reason;
  EXPECT_NE(why.find("APPEND"), std::string::npos) << why;
  EXPECT_NE(why.find("per value"), std::string::npos) << why;
  EXPECT_EQ(*h.st.find("/a"), "1234567890");
}

TEST(StoreTotals, AppendAddCompareSetCountAgainstTheByteTotal) {
  Harness h(Limits{}, Totals{.max_bytes = 20});
  EXPECT_TRUE(h.run(1, appended("/a", "12345678")).close_reason.empty());  // 10
  EXPECT_FALSE(h.run(1, appended("/a", "123456789ab")).close_reason.empty());
  EXPECT_EQ(*h.st.find("/a"), "12345678");
  EXPECT_TRUE(h.cas(1, "/a", "12345678", "1").close_reason.empty());  // 3
  EXPECT_FALSE(h.cas(1, "/a", "1", std::string(19, 'x')).close_reason.empty());
  EXPECT_EQ(*h.st.find("/a"), "1");
  EXPECT_TRUE(h.add(1, "/n", 1000000).close_reason.empty());               // "/n" + "1000000": 9, total 12
  EXPECT_FALSE(h.add(1, "/n", 1000000000000000000).close_reason.empty());  // 19 digits: 24 in all
  EXPECT_EQ(*h.st.find("/n"), "1000000");
  EXPECT_EQ(h.st.bytes(), recount(h.st, {"/a", "/n"}, {}));
}

// A MULTI_SET past a total sets none of its keys and wakes nobody (the docs: "changes nothing");
// one that fits as a whole is set even where a key named twice passes the total on the way.
TEST(StoreTotals, MultiSetIsAllOrNothing) {
  auto multi_set = [](std::vector<std::string> keys, std::vector<std::string> values) {
    Request r;
    r.op = Op::multi_set;
    r.keys = std::move(keys);
    r.values = std::move(values);
    return r;
  };
  {
    Harness h(Limits{}, Totals{.max_keys = 2});
    h.wait(7, {"/a"});
    const auto& fx = h.run(1, multi_set({"/a", "/b", "/c"}, {"1", "2", "3"}));
    EXPECT_NE(fx.close_reason.find("store.max_keys"), std::string::npos) << fx.close_reason;
    EXPECT_NE(fx.close_reason.find("no key of it was set"), std::string::npos) << fx.close_reason;
    EXPECT_TRUE(fx.pushes.empty());
    EXPECT_EQ(h.st.num_keys(), 0u);
    EXPECT_EQ(h.st.bytes(), 0u);
    EXPECT_TRUE(h.st.is_waiting(7));
    // A key named twice is one key: two fit.
    EXPECT_TRUE(h.run(1, multi_set({"/a", "/b", "/a"}, {"1", "2", "3"})).close_reason.empty());
    EXPECT_EQ(*h.st.find("/a"), "3");
    EXPECT_EQ(h.st.num_keys(), 2u);
    EXPECT_FALSE(h.st.is_waiting(7));
  }
  {
    Harness h(Limits{}, Totals{.max_bytes = 20});
    EXPECT_TRUE(h.set(1, "/a", "12345678").close_reason.empty());                     // 10
    const auto& fx = h.run(1, multi_set({"/a", "/b"}, {"1", std::string(17, 'x')}));  // 3 + 19 = 22
    EXPECT_NE(fx.close_reason.find("store.max_size"), std::string::npos) << fx.close_reason;
    EXPECT_EQ(*h.st.find("/a"), "12345678");
    EXPECT_EQ(h.st.find("/b"), nullptr);
    EXPECT_EQ(h.st.bytes(), 10u);
    // Through 28 bytes on the way (/a's long value first), 12 at the end: set.
    EXPECT_TRUE(h.run(1, multi_set({"/a", "/a"}, {std::string(26, 'y'), "1234567890"})).close_reason.empty());
    EXPECT_EQ(*h.st.find("/a"), "1234567890");
    EXPECT_EQ(h.st.bytes(), recount(h.st, {"/a"}, {}));
    // Shrinking one key makes room for another in the same request.
    EXPECT_TRUE(h.run(1, multi_set({"/a", "/b"}, {"", std::string(16, 'z')})).close_reason.empty());
    EXPECT_EQ(h.st.bytes(), recount(h.st, {"/a", "/b"}, {}));
    EXPECT_EQ(h.st.bytes(), 20u);
  }
}

TEST(StoreTotals, AMultiGetReplyIsBoundedLikeARequest) {
  // Naming one 100-byte key 20 times asks for a 2160-byte reply; the connection's cap is 1000.
  Harness h(Limits{.max_connection_bytes = 1000}, Totals{});
  h.set(1, "/big", std::string(100, 'v'));
  Request mg;
  mg.op = Op::multi_get;
  mg.keys.assign(9, "/big");  // 9 x 108 = 972: served
  EXPECT_EQ(h.run(1, mg).reply.size(), 972u);
  EXPECT_TRUE(h.fx.close_reason.empty());
  mg.keys.assign(20, "/big");
  Effects& fx = h.run(1, mg);
  EXPECT_TRUE(fx.reply.empty()) << "built a reply of " << fx.reply.size() << " bytes";
  EXPECT_NE(fx.close_reason.find("MULTI_GET of 20 keys would reply 2160 bytes"), std::string::npos) << fx.close_reason;
}

TEST(StoreTotals, AListKeysReplyIsBoundedLikeARequest) {
  // 20 keys of 60 bytes: 8 + 20 x 68 = 1368 bytes of reply, past a cap of 1000.
  Harness h(Limits{.max_connection_bytes = 1000}, Totals{});
  for (int i = 0; i < 20; ++i) h.set(1, fmt::format("/{:059}", i), "v");
  Request lk;
  lk.op = Op::list_keys;
  Effects& fx = h.run(1, lk);
  EXPECT_TRUE(fx.reply.empty()) << "built a reply of " << fx.reply.size() << " bytes";
  EXPECT_NE(fx.close_reason.find("LIST_KEYS of 20 keys would reply 1368 bytes"), std::string::npos) << fx.close_reason;
}

TEST(StoreState, OneWatchMessageIsSharedByEveryWatcher) {
  // A SET of a large value with many watchers must not copy old + new once per watcher before
  // the server can bound what it queues.
  Harness h;
  for (ClientId w = 10; w < 20; ++w) h.simple(w, Op::watch_key, "/w");
  const Effects& fx = h.set(1, "/w", std::string(1000, 'v'));
  ASSERT_EQ(fx.pushes.size(), 10u);
  for (const auto& p : fx.pushes) EXPECT_EQ(p.bytes.get(), fx.pushes[0].bytes.get());
}

// Watches stay until their connection closes and every change of the key pushes to each: one
// key's are bounded, so a SET costs at most that many pushes (64 connections x 16384 watches of
// one key used to hold the lock 14 s over 100 SETs).
TEST(StoreTotals, WatchesOfOneKeyAreBounded) {
  Harness h;
  const std::size_t cap = Totals{}.max_watchers_per_key;
  ASSERT_EQ(cap, 1024u);
  // From a few clients, some watching the key more than once (as PyTorch allows).
  for (std::size_t i = 0; i < cap; ++i) {
    ASSERT_TRUE(h.simple(10 + i % 7, Op::watch_key, "/k").close_reason.empty()) << i;
  }
  const auto& why = h.simple(99, Op::watch_key, "/k").close_reason;
  EXPECT_THAT(why, HasSubstr("WATCH_KEY of `/k` would make 1025 watches of that key, over the limit of 1024"));
  EXPECT_EQ(h.st.registrations(), cap);
  // Other keys are still watchable, by the refused client too.
  EXPECT_EQ(h.simple(99, Op::watch_key, "/other").reply, u8(kWatchCallbackRegistered));
  EXPECT_EQ(h.simple(10, Op::watch_key, "/other").reply, u8(kWatchCallbackRegistered));
  EXPECT_EQ(h.set(1, "/k", "v").pushes.size(), cap);
  EXPECT_EQ(h.set(1, "/other", "v").pushes.size(), 2u);
  // A closed watcher gives its room back.
  h.st.disconnect(10);
  EXPECT_TRUE(h.simple(99, Op::watch_key, "/k").close_reason.empty());
  EXPECT_LE(h.set(1, "/k", "w").pushes.size(), cap);
}

namespace {
// The bytes a watcher is pushed for one change (u8 type, key, old, new), as PyTorch 1.13 reads them.
std::string watch_msg(uint8_t type, std::string_view key, std::string_view old_value, std::string_view new_value) {
  return u8(type) + bytes(key) + bytes(old_value) + bytes(new_value);
}
}  // namespace

// What one request pushes to watchers is bounded (Totals::max_notify_bytes_per_request): 1024
// watches of a key set to a 64 MiB value over another copied 128 GiB under the store's lock.
// The change stands and the watches within the bound are sent it; the clients of the others are
// dropped (their connections closed by the server), and everyone else is served as before.
TEST(StoreTotals, AChangePastTheWatchBudgetDropsTheWatchersPastIt) {
  Harness h;
  const std::size_t budget = Totals{}.max_notify_bytes_per_request;
  ASSERT_EQ(budget, std::size_t{64} << 20);
  const std::size_t cap = Totals{}.max_watchers_per_key;
  for (ClientId w = 100; w < 100 + cap; ++w) ASSERT_TRUE(h.simple(w, Op::watch_key, "/k").close_reason.empty());
  h.simple(7, Op::watch_key, "/other");
  EXPECT_EQ(h.wait(5, {"/k"}).reply, "");
  const std::string value(1 << 20, 'v');
  const std::string msg = watch_msg(kWatchKeyCreated, "/k", "", value);
  const std::size_t fit = budget / msg.size();  // 63 of 1 MiB + 27 bytes
  ASSERT_EQ(fit, 63u);

  const Effects& fx = h.set(1, "/k", value);
  EXPECT_TRUE(fx.close_reason.empty()) << "the SET itself stands: " << fx.close_reason;
  EXPECT_EQ(*h.st.find("/k"), value);
  // The first `fit` watches, in the order they came, get the exact bytes; the waiter is released.
  Pushes want;
  for (ClientId w = 100; w < 100 + fit; ++w) want.emplace_back(w, msg);
  want.emplace_back(5, u8(kStopWaiting));
  EXPECT_EQ(flat(fx), want);
  EXPECT_LE(fx.notify_bytes, budget);
  std::vector<ClientId> dropped;
  for (ClientId w = 100 + fit; w < 100 + cap; ++w) dropped.push_back(w);
  EXPECT_EQ(fx.dropped_watchers, dropped);
  EXPECT_EQ(fx.dropped_keys, 1u);
  EXPECT_THAT(fx.dropped_reason, HasSubstr(fmt::format("SET of `/k` would push its 1024 watches {} bytes each ({} in "
                                                       "all), over the store's limit of 67108864 bytes of WATCH_KEY "
                                                       "callbacks per request; 961 watching clients past it dropped",
                                                       msg.size(), msg.size() * cap)));
  // The dropped watches are gone (their room given back); the kept ones and other keys' stay.
  EXPECT_EQ(h.st.registrations(), fit + 1);
  EXPECT_EQ(flat(h.set(1, "/k", "w")).size(), fit);
  EXPECT_EQ(flat(h.set(2, "/other", "o")), (Pushes{{7, watch_msg(kWatchKeyCreated, "/other", "", "o")}}));
  EXPECT_EQ(h.get(2, "/k").reply, bytes("w"));
  EXPECT_TRUE(h.fx.dropped_watchers.empty());
}

TEST(StoreTotals, TheFirstWatchIsSentAChangeLargerThanTheWholeBudget) {
  // One message costs what a GET of the value does: the bound is on the fan-out, not the value.
  Harness h(Limits{}, Totals{.max_notify_bytes_per_request = 10});
  for (ClientId w = 10; w < 13; ++w) h.simple(w, Op::watch_key, "/k");
  h.set(1, "/k", "old");
  EXPECT_EQ(flat(h.fx), (Pushes{{10, watch_msg(kWatchKeyCreated, "/k", "", "old")}}));
  EXPECT_EQ(h.fx.dropped_watchers, (std::vector<ClientId>{11, 12}));
  // The one left is sent every later change, DELETE_KEY's too.
  EXPECT_EQ(flat(h.simple(1, Op::delete_key, "/k")), (Pushes{{10, watch_msg(kWatchKeyDeleted, "/k", "old", "")}}));
  EXPECT_TRUE(h.fx.dropped_watchers.empty());
}

TEST(StoreTotals, AClientWithAWatchPastTheBudgetIsDroppedWhole) {
  // Client 10 watches the key twice (PyTorch calls back each); only its first fits, so it is
  // dropped and sent neither: a client is kept or dropped, never half served.
  const std::string msg = watch_msg(kWatchKeyCreated, "/k", "", "v");
  Harness h(Limits{}, Totals{.max_notify_bytes_per_request = 2 * msg.size()});
  h.simple(11, Op::watch_key, "/k");
  h.simple(10, Op::watch_key, "/k");
  h.simple(10, Op::watch_key, "/k");
  h.simple(10, Op::watch_key, "/other");
  EXPECT_EQ(flat(h.set(1, "/k", "v")), (Pushes{{11, msg}}));
  EXPECT_EQ(h.fx.dropped_watchers, (std::vector<ClientId>{10}));
  EXPECT_EQ(h.st.registrations(), 1u);  // all of 10's watches, of every key
  EXPECT_TRUE(h.set(1, "/other", "o").pushes.empty());
}

TEST(StoreTotals, AMultiSetsChangesShareOneWatchBudget) {
  // The bound is the request's (the lock is held for all of it): 3 messages over two keys.
  const std::string ma = watch_msg(kWatchKeyCreated, "/a", "", "1"), mb = watch_msg(kWatchKeyCreated, "/b", "", "2");
  Harness h(Limits{}, Totals{.max_notify_bytes_per_request = 3 * ma.size()});
  h.simple(10, Op::watch_key, "/a");
  h.simple(11, Op::watch_key, "/a");
  h.simple(12, Op::watch_key, "/b");
  h.simple(13, Op::watch_key, "/b");
  Request ms;
  ms.op = Op::multi_set;
  ms.keys = {"/a", "/b"};
  ms.values = {"1", "2"};
  Effects& fx = h.run(1, ms);
  EXPECT_TRUE(fx.close_reason.empty());
  EXPECT_EQ(flat(fx), (Pushes{{10, ma}, {11, ma}, {12, mb}}));
  EXPECT_EQ(fx.dropped_watchers, (std::vector<ClientId>{13}));
  EXPECT_THAT(fx.dropped_reason, HasSubstr("MULTI_SET of `/b` would push its 2 watches"));
  EXPECT_EQ(*h.st.find("/a"), "1");
  EXPECT_EQ(*h.st.find("/b"), "2");
  // The next request has the whole budget again.
  EXPECT_EQ(flat(h.set(1, "/a", "x")).size(), 2u);
}

TEST(StoreTotals, QueueItemsAndBytesAreBounded) {
  Harness h(Limits{}, Totals{.max_bytes = 12, .max_queue_items = 2});
  EXPECT_TRUE(h.push(1, "/q", "abcd").close_reason.empty());  // "/q" + 4 = 6
  EXPECT_TRUE(h.push(1, "/q", "ef").close_reason.empty());    // 8
  EXPECT_NE(h.push(1, "/q", "g").close_reason.find("queue items"), std::string::npos);
  EXPECT_EQ(h.st.queue_length("/q"), 2u);
  EXPECT_EQ(h.simple(1, Op::queue_pop, "/q").reply, i64(2) + bytes("abcd"));
  EXPECT_EQ(h.st.bytes(), 4u);
  EXPECT_NE(h.push(1, "/r", "123456789").close_reason.find("store.max_size"), std::string::npos);
  EXPECT_EQ(h.st.queue_length("/r"), 0u);
  EXPECT_EQ(h.simple(1, Op::queue_pop, "/q").reply, i64(1) + bytes("ef"));
  EXPECT_EQ(h.st.bytes(), 0u);
  EXPECT_EQ(h.st.queue_items(), 0u);
}

TEST(StoreTotals, WaitAndWatchRegistrationsAreBounded) {
  Harness h(Limits{}, Totals{.max_waiters = 3});
  EXPECT_TRUE(h.wait(1, {"/a", "/b"}).close_reason.empty());
  EXPECT_EQ(h.st.registrations(), 2u);
  const auto& why = h.wait(2, {"/c", "/d"}).close_reason;
  EXPECT_NE(why.find("registrations"), std::string::npos) << why;
  EXPECT_FALSE(h.st.is_waiting(2));
  EXPECT_TRUE(h.simple(3, Op::watch_key, "/w").close_reason.empty());
  EXPECT_FALSE(h.simple(4, Op::watch_key, "/w").close_reason.empty());
  EXPECT_FALSE(h.barrier(5, "/bar", 2).close_reason.empty());
  EXPECT_EQ(h.st.find("/bar"), nullptr);  // a refused BARRIER does not count its caller
  // Released waits and closed watchers give their room back.
  h.set(9, "/a", "1");
  h.set(9, "/b", "1");
  EXPECT_EQ(h.st.registrations(), 1u);
  h.st.disconnect(3);
  EXPECT_EQ(h.st.registrations(), 0u);
  EXPECT_TRUE(h.barrier(5, "/bar", 2).close_reason.empty());
  EXPECT_EQ(h.st.registrations(), 1u);
  h.barrier(6, "/bar", 2);
  EXPECT_EQ(h.st.registrations(), 0u);
  h.wait(7, {"/x"});
  h.simple(7, Op::cancel_wait);
  EXPECT_EQ(h.st.registrations(), 0u);
  h.wait(7, {"/x"});
  h.st.reset();
  EXPECT_EQ(h.st.registrations(), 0u);
  EXPECT_EQ(h.st.bytes(), 0u);
}

TEST(StoreTotals, RandomOperationsKeepTheCountExact) {
  // Whatever mix of writes, deletes and pops, the running byte count equals a recount, and
  // never passes the total.
  Harness h(Limits{.max_value_bytes = 64}, Totals{.max_bytes = 400, .max_keys = 12, .max_queue_items = 10});
  std::vector<std::string> keys, queues{"/q0", "/q1"};
  for (int i = 0; i < 16; ++i) keys.push_back("/k" + std::to_string(i));
  uint64_t seed = 42;
  auto rnd = [&](uint64_t n) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return (seed >> 33) % n;
  };
  std::map<std::string, std::deque<std::string>> shadow;  // the queues, as the test saw them
  for (int step = 0; step < 20000; ++step) {
    const auto& k = keys[rnd(keys.size())];
    const auto& q = queues[rnd(2)];
    std::string v(rnd(40), 'v');
    switch (rnd(7)) {
      case 0:
        h.set(1, k, v);
        break;
      case 1:
        h.run(1, appended(k, v));
        break;
      case 2:
        h.add(1, k, static_cast<int64_t>(rnd(1000000)));
        break;
      case 3:
        h.cas(1, k, h.st.find(k) ? *h.st.find(k) : "", v);
        break;
      case 4:
        h.simple(1, Op::delete_key, k);
        break;
      case 5:
        if (h.push(1, q, v).close_reason.empty()) shadow[q].push_back(v);
        break;
      case 6:
        h.simple(1, Op::queue_pop, q);
        if (!shadow[q].empty()) shadow[q].pop_front();
        break;
    }
    std::size_t items = 0, item_bytes = 0;
    for (const auto& [name, items_of] : shadow) {
      ASSERT_EQ(h.st.queue_length(name), items_of.size());
      items += items_of.size();
      for (const auto& item : items_of) item_bytes += item.size();
    }
    ASSERT_EQ(items, h.st.queue_items());
    ASSERT_LE(h.st.bytes(), 400u);
    ASSERT_LE(h.st.num_keys(), 12u);
    ASSERT_EQ(h.st.bytes(), recount(h.st, keys, queues) + item_bytes) << "step " << step;
  }
}

// What waits and watches hold counts with what is stored: a waited-for key is held once however
// many clients name it, and a wait whose new keys would pass the total is refused like a SET.
TEST(StoreTotals, WaitedAndWatchedKeysCountAgainstTheByteTotal) {
  Harness h(Limits{}, Totals{.max_bytes = 100});
  h.set(1, "/a", std::string(10, 'v'));  // 12 bytes
  const std::string big(80, 'k');
  EXPECT_TRUE(h.wait(2, {big}).close_reason.empty());
  EXPECT_TRUE(h.wait(3, {big, big}).close_reason.empty());  // held once: nothing more
  EXPECT_EQ(h.st.registered_bytes(), 80u);
  const auto why = h.wait(4, {std::string(20, 'x')}).close_reason;
  EXPECT_NE(why.find("waited-for keys"), std::string::npos) << why;
  EXPECT_FALSE(h.st.is_waiting(4));
  EXPECT_NE(h.set(5, "/b", std::string(10, 'v')).close_reason, "");  // 12 + 80 + 12 > 100
  EXPECT_FALSE(h.simple(6, Op::watch_key, std::string(20, 'w')).close_reason.empty());
  EXPECT_NE(h.push(7, "/q", std::string(10, 'i')).close_reason.find("waited-for keys"), std::string::npos);
  // Released, the room comes back.
  h.simple(2, Op::cancel_wait);
  h.st.disconnect(3);
  EXPECT_EQ(h.st.registered_bytes(), 0u);
  EXPECT_EQ(h.st.registrations(), 0u);
  EXPECT_TRUE(h.set(5, "/b", std::string(10, 'v')).close_reason.empty());
  EXPECT_TRUE(h.simple(6, Op::watch_key, std::string(20, 'w')).close_reason.empty());
  EXPECT_EQ(h.st.registered_bytes(), 20u);
  h.st.disconnect(6);
  EXPECT_EQ(h.st.registered_bytes(), 0u);
}

// A key named twice in one WAIT counts twice, as in PyTorch's servers: one SET of it releases
// both, and the wait ends when every key it named exists.
TEST(StoreState, AKeyNamedTwiceInOneWaitIsReleasedTogether) {
  Harness h;
  EXPECT_TRUE(h.wait(1, {"/k", "/k", "/j"}).reply.empty());
  EXPECT_EQ(h.st.registrations(), 3u);
  EXPECT_TRUE(flat(h.set(9, "/k", "1")).empty());
  EXPECT_TRUE(h.st.is_waiting(1));
  EXPECT_EQ(flat(h.set(9, "/j", "1")), (Pushes{{1, u8(kStopWaiting)}}));
  EXPECT_EQ(h.st.registrations(), 0u);
  EXPECT_EQ(h.st.registered_bytes(), 0u);
  EXPECT_TRUE(h.st.waiters().empty());
}

// Clients come and go on shared keys in every way a wait ends (released, cancelled, given up by
// another request, disconnected, a queue push taking one); after each step the store's own
// bookkeeping matches what the test expects, and at the end nothing is left registered.
TEST(StoreState, WaitsOnSharedKeysEndInAnyOrderAndLeaveNothingBehind) {
  Harness h;
  const std::vector<std::string> keys{"/a", "/b", "/q"};
  std::map<ClientId, std::vector<std::string>> waiting;  // client -> the keys it still misses
  uint64_t seed = 7;
  auto rnd = [&](uint64_t n) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return (seed >> 33) % n;
  };
  auto end_wait = [&](ClientId c) { waiting.erase(c); };
  for (int step = 0; step < 20000; ++step) {
    const ClientId c = 1 + rnd(200);
    switch (rnd(6)) {
      case 0:
      case 1: {  // a wait on one to four of the keys, some named twice
        std::vector<std::string> ks;
        for (uint64_t i = 0, n = 1 + rnd(4); i < n; ++i) ks.push_back(keys[rnd(keys.size())]);
        end_wait(c);  // any earlier wait of c is given up
        h.wait(c, ks);
        std::vector<std::string> missing;
        for (const auto& k : ks)
          if (!h.st.find(k) && !h.st.queue_length(k)) missing.push_back(k);
        if (!missing.empty()) waiting[c] = missing;
        break;
      }
      case 2:
        h.simple(c, Op::cancel_wait);
        end_wait(c);
        break;
      case 3:
        h.st.disconnect(c);
        end_wait(c);
        break;
      case 4: {  // a key set for a moment: every wait on it hears, then it goes again
        const auto& k = keys[rnd(2)];
        for (const auto& [id, bytes] : flat(h.set(999, k, "1"))) {
          EXPECT_EQ(bytes, u8(kStopWaiting));
          ASSERT_TRUE(waiting.count(id));
          auto& ks = waiting[id];
          ks.erase(std::remove(ks.begin(), ks.end(), k), ks.end());
          EXPECT_TRUE(ks.empty()) << "client " << id << " released with keys still missing";
          waiting.erase(id);
        }
        for (auto& [id, ks] : waiting) ks.erase(std::remove(ks.begin(), ks.end(), k), ks.end());
        h.simple(999, Op::delete_key, k);
        break;
      }
      case 5: {  // a queue item for one waiter on /q, popped again at once
        const auto pushes = flat(h.push(998, "/q", "x"));
        for (auto& [id, ks] : waiting) {
          auto at = std::find(ks.begin(), ks.end(), "/q");
          // Which waiter it went to the model cannot tell: /q counts as there for every one (so a
          // client released later must have had nothing else missing).
          if (at != ks.end() && pushes.empty()) ks.erase(at);
        }
        for (const auto& [id, bytes] : pushes) waiting.erase(id);
        h.simple(998, Op::queue_pop, "/q");
        // Which waiter the push took when it released none: recount from the store itself.
        for (auto it = waiting.begin(); it != waiting.end();) {
          if (!h.st.is_waiting(it->first)) {
            it = waiting.erase(it);
          } else {
            ++it;
          }
        }
        break;
      }
    }
    for (const auto& [id, ks] : waiting) ASSERT_TRUE(h.st.is_waiting(id)) << "step " << step;
    std::size_t total = 0;
    for (const auto& kw : h.st.waiters()) total += kw.total;
    std::size_t expected = 0;
    for (ClientId id = 1; id <= 200; ++id) expected += h.st.is_waiting(id) ? 1 : 0;
    ASSERT_EQ(h.st.registered_bytes() == 0, h.st.waiters().empty()) << "step " << step;
    ASSERT_GE(total, expected) << "step " << step;
  }
  for (ClientId id = 1; id <= 200; ++id) h.st.disconnect(id);
  EXPECT_EQ(h.st.registrations(), 0u);
  EXPECT_EQ(h.st.registered_bytes(), 0u);
  EXPECT_TRUE(h.st.waiters().empty());
}

// The report costs the same whatever the clients registered: the longest-waited keys, and the
// first waiters of each with the count of all of them.
TEST(StoreState, WaitersGathersTheOldestKeysAndCountsThoseNotListed) {
  Harness h;
  for (int i = 0; i < 100; ++i) {
    h.now = Clock::time_point(1000s) + std::chrono::seconds(i);
    h.wait(static_cast<ClientId>(1 + i), {fmt::format("/k{:03}", i)});
  }
  h.now = Clock::time_point(900s);  // the oldest of all, on one key
  for (ClientId c = 1000; c < 1000 + kMaxListedWaiters + 10; ++c) h.wait(c, {"/crowd"});
  const auto w = h.st.waiters();
  ASSERT_EQ(w.size(), kMaxReportedKeys);
  EXPECT_EQ(w.front().key, "/crowd");  // by key: "/c" before "/k"
  EXPECT_EQ(w.front().total, kMaxListedWaiters + 10);
  EXPECT_EQ(w.front().clients.size(), kMaxListedWaiters);
  EXPECT_EQ(w.back().key, fmt::format("/k{:03}", kMaxReportedKeys - 2));  // the 63 oldest /k keys
}

// Deleted keys are remembered (so a report can say "set, then deleted") up to a size.
TEST(StoreState, DeletedKeysAreRememberedUpToABound) {
  Harness h;
  const auto key = [](int i) { return fmt::format("/{:03}/", i) + std::string(64 * 1024, 'd'); };
  for (int i = 0; i < 300; ++i) {  // about 19 MiB of keys
    h.set(1, key(i), "1");
    h.simple(1, Op::delete_key, key(i));
  }
  h.wait(2, {key(0)});
  h.wait(3, {key(299)});
  const auto w = h.st.waiters();
  ASSERT_EQ(w.size(), 2u);
  EXPECT_TRUE(w[0].deleted);
  EXPECT_FALSE(w[1].deleted);  // past the bound: not remembered
}

TEST(StoreReport, KeysArePrintableAndTheReportIsBounded) {
  WaitReport r;
  const auto now = Clock::time_point(1000s);
  for (int i = 0; i < 30; ++i) {
    WaitedKey k;
    k.key = i == 0 ? std::string("/evil\x1b[2J\n") : fmt::format("/k{:02}", i);
    k.waiters.push_back(WaitingClient{.connection = 1, .rank = i, .since = now - std::chrono::seconds(100 - i)});
    if (i == 1) k.total = 5;
    r.waited.push_back(k);
  }
  r.waited_keys = 1000;  // the store gathered 30 of the 1000 keys waited for
  const auto text = format_wait_report(r, 8, now);
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
  EXPECT_NE(text.find("/evil\\x1b[2J\\x0a"), std::string::npos) << text;
  EXPECT_NE(text.find("5/8 ranks waiting on `/k01` for 99 s (rank 1; 4 more not listed)"), std::string::npos) << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), static_cast<long>(kMaxReportLines));
  EXPECT_NE(text.find("... and 980 more keys waited for"), std::string::npos) << text;
  EXPECT_EQ(text.find("/k29"), std::string::npos);  // the newest are the ones left out
}

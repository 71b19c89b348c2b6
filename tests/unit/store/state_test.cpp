// Store semantics, pure: WAIT/CANCEL_WAIT ordering, ADD's decimal storage, COMPARE_SET's
// quirks, queues waking one, BARRIER, WATCH_KEY pushes, DELETE_KEY, GETNUMKEYS, the wait report.
#include "store/report.hpp"
#include "store/state.hpp"

#include <gtest/gtest.h>

using namespace ddp::store;
using namespace std::chrono_literals;

namespace {

std::string u8(uint8_t v) { return std::string(1, static_cast<char>(v)); }
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
  EXPECT_EQ(h.add(1, "/c", 1).pushes, (Pushes{{2, u8(kStopWaiting)}}));
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
      case 0: r.op = Op::set; break;
      case 1: r.op = Op::add; break;
      case 2: r.op = Op::append; r.value = "z"; break;
      case 3: r.op = Op::multi_set; r.keys = {"/k"}; r.values = {"v"}; break;
      case 4: r.op = Op::compare_set; r.value2 = "v"; break;
    }
    EXPECT_EQ(h.run(1, r).pushes, (Pushes{{2, u8(kStopWaiting)}})) << how;
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
  EXPECT_EQ(h.set(1, "/k", "v").pushes, (Pushes{{2, u8(kStopWaiting)}}));
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
  EXPECT_EQ(h.push(1, "/q", "a").pushes, (Pushes{{2, u8(kStopWaiting)}}));
  EXPECT_EQ(h.simple(2, Op::queue_pop, "/q").reply, i64(1) + bytes("a"));
  EXPECT_EQ(h.push(1, "/q", "b").pushes, (Pushes{{3, u8(kStopWaiting)}}));
  EXPECT_TRUE(h.st.is_waiting(4));
  EXPECT_EQ(h.simple(1, Op::queue_len, "/q").reply, i64(1));
  // A SET of the same key wakes everyone left.
  EXPECT_EQ(h.set(1, "/q", "v").pushes, (Pushes{{4, u8(kStopWaiting)}}));
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
  EXPECT_EQ(fx.pushes, (Pushes{{1, u8(kStopWaiting)}, {2, u8(kStopWaiting)}}));
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
  EXPECT_EQ(h.set(1, "/w", "a").pushes, (Pushes{{9, push(kWatchKeyCreated, "/w", "", "a")}}));
  EXPECT_EQ(h.set(1, "/w", "b").pushes, (Pushes{{9, push(kWatchKeyUpdated, "/w", "a", "b")}}));
  EXPECT_EQ(h.cas(1, "/w", "b", "c").pushes, (Pushes{{9, push(kWatchKeyUpdated, "/w", "b", "c")}}));
  EXPECT_TRUE(h.cas(1, "/w", "zz", "d").pushes.empty());  // no change, no push
  EXPECT_EQ(h.simple(1, Op::delete_key, "/w").pushes, (Pushes{{9, push(kWatchKeyDeleted, "/w", "c", "")}}));
  EXPECT_EQ(h.add(1, "/w", 3).pushes, (Pushes{{9, push(kWatchKeyCreated, "/w", "", "3")}}));
  EXPECT_EQ(h.add(1, "/w", 3).pushes, (Pushes{{9, push(kWatchKeyUpdated, "/w", "3", "6")}}));
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
  EXPECT_EQ(format_wait_report(one, 0, t0 + 2s), "1 client in a barrier on `/bar` for 2 s (rank 0); barrier not reached");
}

TEST(StoreReport, RankList) {
  EXPECT_EQ(format_rank_list({5, 1, 2, 3, 3, 9, 10}), "1-3,5,9,10");
  EXPECT_EQ(format_rank_list({}), "");
  EXPECT_EQ(format_rank_list({0}), "0");
}

// The wire codec: every opcode of both families, split at every byte boundary, protocol
// detection, limits checked before any payload is read, unknown opcodes, explicit LE integers.
#include "store/protocol.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

using namespace ddp::store;

namespace {

std::span<const uint8_t> bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// One example request per operation.
std::vector<Request> examples() {
  std::vector<Request> out;
  auto add = [&](Op op, auto&& fill) {
    Request r;
    r.op = op;
    fill(r);
    out.push_back(r);
  };
  add(Op::validate, [](Request& r) { r.word = kValidateMagic; });
  add(Op::set, [](Request& r) {
    r.key = "/k";
    r.value = std::string("v\0\xff", 3);
  });
  add(Op::set, [](Request& r) {
    r.key = "";
    r.value = "";
  });
  add(Op::compare_set, [](Request& r) {
    r.key = "/c";
    r.value = "old";
    r.value2 = "new";
  });
  add(Op::get, [](Request& r) { r.key = "/default_pg/0//cuda//0"; });
  add(Op::add, [](Request& r) {
    r.key = "init/";
    r.number = -5;
  });
  add(Op::check, [](Request& r) { r.keys = {"/a", "/bb"}; });
  add(Op::wait, [](Request& r) { r.keys = {"/a"}; });
  add(Op::wait, [](Request& r) { r.keys = {}; });
  add(Op::get_num_keys, [](Request&) {});
  add(Op::watch_key, [](Request& r) { r.key = "/w"; });
  add(Op::delete_key, [](Request& r) { r.key = "/d"; });
  add(Op::append, [](Request& r) {
    r.key = "/ap";
    r.value = "xyz";
  });
  add(Op::multi_get, [](Request& r) { r.keys = {"/a", "", "/c"}; });
  add(Op::multi_set, [](Request& r) {
    r.keys = {"/a", "/b"};
    r.values = {"1", ""};
  });
  add(Op::cancel_wait, [](Request&) {});
  add(Op::ping, [](Request& r) { r.word = 0xDEADBEEF; });
  add(Op::queue_push, [](Request& r) {
    r.key = "/q";
    r.value = "item";
  });
  add(Op::queue_pop, [](Request& r) { r.key = "/q"; });
  add(Op::queue_len, [](Request& r) { r.key = "/q"; });
  add(Op::list_keys, [](Request&) {});
  add(Op::barrier, [](Request& r) {
    r.key = "/bar";
    r.number = 16;
  });
  return out;
}

// A connection's bytes for `p`: 2.x connections begin with VALIDATE.
std::string preamble(Protocol p) {
  if (p != Protocol::v2) return {};
  Request v;
  v.op = Op::validate;
  v.word = kValidateMagic;
  return encode_request(p, v);
}

// Decodes `wire` fed in the pieces given by `cuts` (sorted offsets); returns the requests.
std::vector<Request> decode_in_pieces(const std::string& wire, const std::vector<std::size_t>& cuts, Decoder& dec) {
  std::vector<Request> got;
  std::size_t start = 0;
  std::vector<std::size_t> ends = cuts;
  ends.push_back(wire.size());
  for (std::size_t end : ends) {
    auto piece = bytes(wire).subspan(start, end - start);
    start = end;
    Request r;
    for (;;) {
      auto st = dec.next(piece, r);
      if (st == Decoder::Status::request) {
        got.push_back(r);
        continue;
      }
      EXPECT_EQ(st, Decoder::Status::need_more) << dec.error();
      EXPECT_TRUE(piece.empty());
      break;
    }
  }
  return got;
}

}  // namespace

TEST(StoreProtocol, EveryOpRoundTripsSplitAtEveryByteBoundary) {
  for (Protocol p : {Protocol::v1, Protocol::v21, Protocol::v2}) {
    const LegacyHint hint{p == Protocol::v2 ? Protocol::unknown : p, "the test"};
    for (const Request& r : examples()) {
      if (opcode_of(p, r.op) < 0) continue;
      // Without VALIDATE, only what 1.13–2.1 number alike leaves the layout open.
      const Protocol seen = p != Protocol::v2 && opcode_of(Protocol::legacy, r.op) >= 0 ? Protocol::legacy : p;
      if (r.op == Op::validate) continue;  // covered by the preamble
      const std::string head = preamble(p);
      // A harmless first request so that 1.13 detection is not what is tested here.
      Request first;
      first.op = Op::get_num_keys;
      const std::string wire = head + encode_request(p, first) + encode_request(p, r);
      for (std::size_t cut = 0; cut <= wire.size(); ++cut) {
        Decoder dec({}, hint);
        auto got = decode_in_pieces(wire, {cut}, dec);
        std::size_t expected = (p == Protocol::v2 ? 1 : 0) + 2;
        ASSERT_EQ(got.size(), expected) << to_string(r.op) << " cut " << cut;
        EXPECT_EQ(got.back(), r) << to_string(r.op) << " cut " << cut;
        EXPECT_EQ(dec.protocol(), seen) << to_string(r.op);
        EXPECT_TRUE(dec.idle());
      }
      // And one byte at a time.
      std::vector<std::size_t> every;
      for (std::size_t i = 1; i < wire.size(); ++i) every.push_back(i);
      Decoder dec({}, hint);
      auto got = decode_in_pieces(wire, every, dec);
      ASSERT_FALSE(got.empty());
      EXPECT_EQ(got.back(), r) << to_string(r.op);
    }
  }
}

TEST(StoreProtocol, OpcodeTablesMatchTheReference) {
  // 1.13 and 2.0: SET..DELETE_KEY = 0..8, nothing after.
  EXPECT_EQ(opcode_of(Protocol::v1, Op::set), 0);
  EXPECT_EQ(opcode_of(Protocol::v1, Op::wait), 5);
  EXPECT_EQ(opcode_of(Protocol::v1, Op::watch_key), 7);
  EXPECT_EQ(opcode_of(Protocol::v1, Op::delete_key), 8);
  EXPECT_EQ(opcode_of(Protocol::v1, Op::append), -1);
  EXPECT_EQ(opcode_of(Protocol::v1, Op::cancel_wait), -1);
  EXPECT_EQ(opcode_of(Protocol::v1, Op::ping), -1);
  EXPECT_EQ(opcode_of(Protocol::v1, Op::validate), -1);
  // 2.1: no WATCH_KEY, no VALIDATE: DELETE_KEY=7 .. CANCEL_WAIT=11.
  EXPECT_EQ(opcode_of(Protocol::v21, Op::get_num_keys), 6);
  EXPECT_EQ(opcode_of(Protocol::v21, Op::delete_key), 7);
  EXPECT_EQ(opcode_of(Protocol::v21, Op::append), 8);
  EXPECT_EQ(opcode_of(Protocol::v21, Op::multi_get), 9);
  EXPECT_EQ(opcode_of(Protocol::v21, Op::multi_set), 10);
  EXPECT_EQ(opcode_of(Protocol::v21, Op::cancel_wait), 11);
  EXPECT_EQ(opcode_of(Protocol::v21, Op::watch_key), -1);
  EXPECT_EQ(opcode_of(Protocol::v21, Op::validate), -1);
  // What all three share.
  EXPECT_EQ(opcode_of(Protocol::legacy, Op::get_num_keys), 6);
  EXPECT_EQ(opcode_of(Protocol::legacy, Op::watch_key), -1);
  EXPECT_EQ(opcode_of(Protocol::legacy, Op::delete_key), -1);
  // 2.2+: VALIDATE=0 .. BARRIER=18, no WATCH_KEY.
  EXPECT_EQ(opcode_of(Protocol::v2, Op::validate), 0);
  EXPECT_EQ(opcode_of(Protocol::v2, Op::set), 1);
  EXPECT_EQ(opcode_of(Protocol::v2, Op::get_num_keys), 7);
  EXPECT_EQ(opcode_of(Protocol::v2, Op::delete_key), 8);
  EXPECT_EQ(opcode_of(Protocol::v2, Op::cancel_wait), 12);
  EXPECT_EQ(opcode_of(Protocol::v2, Op::ping), 13);
  EXPECT_EQ(opcode_of(Protocol::v2, Op::queue_push), 14);
  EXPECT_EQ(opcode_of(Protocol::v2, Op::list_keys), 17);
  EXPECT_EQ(opcode_of(Protocol::v2, Op::barrier), 18);
  EXPECT_EQ(opcode_of(Protocol::v2, Op::watch_key), -1);
}

TEST(StoreProtocol, IntegersAreLittleEndianByteByByte) {
  std::string s;
  put_i64(s, -2);
  EXPECT_EQ(s, std::string("\xFE\xFF\xFF\xFF\xFF\xFF\xFF\xFF", 8));
  s.clear();
  put_u32(s, kValidateMagic);
  EXPECT_EQ(s, std::string("\xCE\xF7\x85\x3C", 4));
  s.clear();
  put_bytes(s, "ab");
  EXPECT_EQ(s, std::string("\x02\0\0\0\0\0\0\0ab", 10));
  // ADD "k" 258 from raw bytes.
  Decoder dec;
  std::string wire = std::string("\x03\x01\0\0\0\0\0\0\0k\x02\x01\0\0\0\0\0\0", 18);
  auto in = bytes(wire);
  Request r;
  ASSERT_EQ(dec.next(in, r), Decoder::Status::request);
  EXPECT_EQ(r.op, Op::add);
  EXPECT_EQ(r.key, "k");
  EXPECT_EQ(r.number, 258);
}

TEST(StoreProtocol, DetectsTwoXByTheValidateMagic) {
  Decoder dec;
  std::string wire("\x00\xCE\xF7\x85\x3C\x0D\x39\x30\x00\x00", 10);  // VALIDATE, PING 12345
  auto in = bytes(wire);
  Request r;
  ASSERT_EQ(dec.next(in, r), Decoder::Status::request);
  EXPECT_EQ(dec.protocol(), Protocol::v2);
  EXPECT_EQ(r.op, Op::validate);
  EXPECT_EQ(r.word, kValidateMagic);
  ASSERT_EQ(dec.next(in, r), Decoder::Status::request);
  EXPECT_EQ(r.op, Op::ping);
  EXPECT_EQ(r.word, 12345u);
}

TEST(StoreProtocol, DetectsOneThirteenFromItsFirstByte) {
  // GETNUMKEYS is one byte: it must be answered without waiting for more.
  Decoder dec;
  std::string wire("\x06", 1);
  auto in = bytes(wire);
  Request r;
  ASSERT_EQ(dec.next(in, r), Decoder::Status::request);
  EXPECT_EQ(dec.protocol(), Protocol::legacy);
  EXPECT_EQ(r.op, Op::get_num_keys);
}

TEST(StoreProtocol, OneThirteenSetWhoseLengthStartsLikeTheMagicIsStillASet) {
  // 0x00 then key length bytes CE F7 00 ...: diverges from the magic at the third byte.
  Request set;
  set.op = Op::set;
  set.key = std::string(0xF7CE, 'k');
  set.value = "v";
  std::string wire = encode_request(Protocol::v1, set);
  ASSERT_EQ(static_cast<uint8_t>(wire[1]), 0xCE);
  ASSERT_EQ(static_cast<uint8_t>(wire[2]), 0xF7);
  for (std::size_t cut : {1, 2, 3, 4, 5, 6}) {
    Decoder dec;
    auto got = decode_in_pieces(wire, {cut}, dec);
    ASSERT_EQ(got.size(), 1u) << cut;
    EXPECT_EQ(got[0], set);
    EXPECT_EQ(dec.protocol(), Protocol::legacy);
  }
}

TEST(StoreProtocol, UnknownOpcodesCloseWithAClearMessage) {
  for (int code = 12; code < 256; ++code) {
    Decoder dec({}, {Protocol::v1, "the test"});
    std::string wire(1, static_cast<char>(code));
    auto in = bytes(wire);
    Request r;
    ASSERT_EQ(dec.next(in, r), Decoder::Status::error) << code;
    EXPECT_NE(dec.error().find("unknown opcode " + std::to_string(code)), std::string::npos) << dec.error();
    EXPECT_NE(dec.error().find("1.13–2.1"), std::string::npos) << dec.error();
  }
  for (int code = 19; code < 256; ++code) {
    Decoder dec;
    std::string wire = preamble(Protocol::v2) + std::string(1, static_cast<char>(code));
    auto in = bytes(wire);
    Request r;
    ASSERT_EQ(dec.next(in, r), Decoder::Status::request);
    ASSERT_EQ(dec.next(in, r), Decoder::Status::error) << code;
    EXPECT_NE(dec.error().find("unknown opcode " + std::to_string(code)), std::string::npos);
    // Failed decoders stay failed.
    std::string more("\x07", 1);
    auto in2 = bytes(more);
    EXPECT_EQ(dec.next(in2, r), Decoder::Status::error);
  }
}

TEST(StoreProtocol, OversizedLengthsAreRejectedBeforeAnyPayload) {
  Limits lim;
  lim.max_key_bytes = 100;
  lim.max_value_bytes = 1000;
  lim.max_batch_keys = 10;
  lim.max_connection_bytes = 5000;
  struct Case {
    std::string wire;
    const char* what;
  };
  std::string huge_key("\x00\x00\x00\x00\x00\x01\x00\x00", 8);  // 2^40
  std::vector<Case> cases{
      {std::string("\x02", 1) + huge_key, "key of 1099511627776 bytes"},                         // 1.13 GET
      {std::string("\x02\x65\0\0\0\0\0\0\0", 9), "key of 101 bytes"},                            // one over
      {std::string("\x00\x01\0\0\0\0\0\0\0k\xE9\x03\0\0\0\0\0\0", 18), "value of 1001"},         // SET
      {std::string("\x05\x0B\0\0\0\0\0\0\0", 9), "WAIT of 11 keys"},                             // batch
      {std::string("\x00\x01\0\0\0\0\0\0\0k\x00\x00\x00\x00\x00\x00\x00\x80", 18), "value of"},  // 2^63
  };
  for (const auto& c : cases) {
    Decoder dec(lim);
    auto in = bytes(c.wire);
    Request r;
    EXPECT_EQ(dec.next(in, r), Decoder::Status::error) << c.what;
    EXPECT_NE(dec.error().find(c.what), std::string::npos) << dec.error();
    EXPECT_TRUE(in.empty());
    EXPECT_LT(dec.pending_bytes(), 100u);  // nothing of the declared size was taken on
  }
  // The per-connection budget: several values that each pass but together do not.
  Decoder dec(lim);
  Request cs;
  cs.op = Op::compare_set;
  cs.key = "k";
  cs.value = std::string(1000, 'a');
  cs.value2 = std::string(1000, 'b');
  dec.set_budget(1500);
  std::string wire = encode_request(Protocol::v1, cs);
  auto in = bytes(wire);
  Request r;
  EXPECT_EQ(dec.next(in, r), Decoder::Status::error);
  EXPECT_NE(dec.error().find("memory cap"), std::string::npos) << dec.error();
}

TEST(StoreProtocol, DefaultLimitsAcceptPyTorchsOwnMaxima) {
  Limits lim;
  EXPECT_GE(lim.max_key_bytes, 8u * 1024);
  EXPECT_GE(lim.max_value_bytes, 8u * 1024 * 1024);
  EXPECT_GE(lim.max_batch_keys, 128u * 1024);
  Request set;
  set.op = Op::set;
  set.key = std::string(8 * 1024, 'k');
  set.value = std::string(8 * 1024 * 1024, 'v');
  std::string wire = encode_request(Protocol::v2, set);
  Decoder dec;
  std::string head = preamble(Protocol::v2);
  auto in0 = bytes(head);
  Request r;
  ASSERT_EQ(dec.next(in0, r), Decoder::Status::request);
  auto in = bytes(wire);
  ASSERT_EQ(dec.next(in, r), Decoder::Status::request) << dec.error();
  EXPECT_EQ(r.value.size(), 8u * 1024 * 1024);
}

TEST(StoreProtocol, ManyRequestsInOneRead) {
  std::string wire;
  Request r;
  r.op = Op::add;
  r.key = "/c";
  for (int i = 0; i < 100; ++i) {
    r.number = i;
    wire += encode_request(Protocol::v1, r);
  }
  Decoder dec;
  auto in = bytes(wire);
  Request got;
  for (int i = 0; i < 100; ++i) {
    ASSERT_EQ(dec.next(in, got), Decoder::Status::request);
    EXPECT_EQ(got.number, i);
  }
  EXPECT_EQ(dec.next(in, got), Decoder::Status::need_more);
}

// The server decodes in place (next(in), then request()) and moves fields out of each request
// as the state stores them: nothing of one request may show in the next, whichever op follows
// which, whole or a byte at a time.
TEST(StoreProtocol, InPlaceRequestsCarryNothingFromTheOneBefore) {
  for (Protocol p : {Protocol::v1, Protocol::v21, Protocol::v2}) {
    const LegacyHint hint{p == Protocol::v2 ? Protocol::unknown : p, "the test"};
    std::vector<Request> sent;
    for (int round = 0; round < 2; ++round) {
      for (const Request& r : examples()) {
        if (r.op != Op::validate && opcode_of(p, r.op) >= 0) sent.push_back(r);
      }
      std::reverse(sent.end() - static_cast<std::ptrdiff_t>(sent.size() / (round + 1)), sent.end());
    }
    std::string wire = preamble(p);
    for (const Request& r : sent) wire += encode_request(p, r);
    for (std::size_t piece_size : {wire.size(), std::size_t{1}, std::size_t{7}}) {
      Decoder dec({}, hint);
      std::vector<Request> got;
      for (std::size_t at = 0; at < wire.size(); at += piece_size) {
        auto piece = bytes(wire).subspan(at, std::min(piece_size, wire.size() - at));
        while (dec.next(piece) == Decoder::Status::request) {
          Request& r = dec.request();
          got.push_back(r);
          std::string taken = std::move(r.key);  // as the state takes a key it stores
          taken = std::move(r.value);
        }
        ASSERT_TRUE(dec.error().empty()) << dec.error();
      }
      if (p == Protocol::v2) {
        ASSERT_FALSE(got.empty());
        EXPECT_EQ(got.front().op, Op::validate);
        got.erase(got.begin());
      }
      ASSERT_EQ(got.size(), sent.size()) << to_string(p) << " pieces of " << piece_size;
      for (std::size_t i = 0; i < sent.size(); ++i) {
        EXPECT_EQ(got[i], sent[i]) << to_string(p) << " request " << i << " (" << to_string(sent[i].op)
                                   << "), pieces of " << piece_size;
      }
    }
  }
}

// A connection's decoder keeps small buffers for its next request, never a large request's: an
// idle connection costs under 1 KiB of them, however large its requests were.
TEST(StoreProtocol, ALargeRequestLeavesNoLargeBufferBehind) {
  Request big;
  big.op = Op::compare_set;  // not moved out by the state: its buffers stay with the request
  big.key = std::string(60000, 'k');
  big.value = std::string(1 << 20, 'e');
  big.value2 = std::string(1 << 20, 'd');
  Request many;
  many.op = Op::multi_get;
  many.keys.assign(10000, "/a-key-longer-than-sso");
  Request small;
  small.op = Op::get;
  small.key = "/k";
  const std::string wire =
      encode_request(Protocol::v21, big) + encode_request(Protocol::v21, many) + encode_request(Protocol::v21, small);
  Decoder dec({}, LegacyHint{Protocol::v21, "the test"});
  auto in = bytes(wire);
  for (const Request* want : {&big, &many, &small}) {
    ASSERT_EQ(dec.next(in), Decoder::Status::request) << dec.error();
    EXPECT_EQ(dec.request(), *want);
  }
  const Request& r = dec.request();
  const std::size_t kept = r.key.capacity() + r.value.capacity() + r.value2.capacity() +
                           r.keys.capacity() * sizeof(std::string) + r.values.capacity() * sizeof(std::string);
  EXPECT_LT(kept, 1024u);
}

TEST(StoreProtocol, EncodeRefusesOpsTheProtocolLacks) {
  Request r;
  r.op = Op::ping;
  EXPECT_THROW(encode_request(Protocol::v1, r), std::invalid_argument);
  r.op = Op::watch_key;
  EXPECT_THROW(encode_request(Protocol::v2, r), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
// The releases without VALIDATE (1.13, 2.0, 2.1): what the bytes tell, and what they do not.

namespace {
Request keyed(Op op, std::string key, std::string value = {}) {
  Request r;
  r.op = op;
  r.key = std::move(key);
  r.value = std::move(value);
  return r;
}
// Decodes all of `wire`; returns the requests and, on an error, leaves it in dec.error().
std::vector<Request> decode_all(const std::string& wire, Decoder& dec) {
  std::vector<Request> got;
  auto in = bytes(wire);
  Request r;
  while (dec.next(in, r) == Decoder::Status::request) got.push_back(r);
  return got;
}
}  // namespace

TEST(StoreLegacyLayouts, OpcodeSevenIsNeverGuessed) {
  // 07 s"/k": WATCH_KEY "/k" from 1.13/2.0, DELETE_KEY "/k" from 2.1. The same bytes.
  const std::string wire = encode_request(Protocol::v1, keyed(Op::watch_key, "/k"));
  ASSERT_EQ(wire, encode_request(Protocol::v21, keyed(Op::delete_key, "/k")));
  {
    Decoder dec;  // no hint: refused, naming both releases and the fix
    EXPECT_TRUE(decode_all(wire, dec).empty());
    EXPECT_NE(dec.error().find("WATCH_KEY in PyTorch 1.13 and 2.0 but DELETE_KEY in 2.1"), std::string::npos)
        << dec.error();
    EXPECT_NE(dec.error().find("store: {protocol: \"2.1\"}"), std::string::npos) << dec.error();
  }
  {
    Decoder dec({}, legacy_hint("auto", std::string("1.13.1")));
    auto got = decode_all(wire, dec);
    ASSERT_EQ(got.size(), 1u) << dec.error();
    EXPECT_EQ(got[0], keyed(Op::watch_key, "/k"));
    EXPECT_EQ(dec.protocol(), Protocol::v1);
  }
  {
    Decoder dec({}, legacy_hint("auto", std::string("2.1.2+cu121")));
    auto got = decode_all(wire, dec);
    ASSERT_EQ(got.size(), 1u) << dec.error();
    EXPECT_EQ(got[0], keyed(Op::delete_key, "/k"));
    EXPECT_EQ(dec.protocol(), Protocol::v21);
  }
  {
    // The job runs 2.11: a client without VALIDATE is not the job's.
    Decoder dec({}, legacy_hint("auto", std::string("2.11.0+cu130")));
    EXPECT_TRUE(decode_all(wire, dec).empty());
    EXPECT_NE(dec.error().find("not the job's release (the job's PyTorch 2.11.0+cu130)"), std::string::npos)
        << dec.error();
  }
}

TEST(StoreLegacyLayouts, OpcodeEightIsDeleteOrAppendByTheHint) {
  // 1.13 DELETE_KEY "/k" then GETNUMKEYS; read as 2.1, the 06 would be the start of APPEND's value.
  const std::string wire = encode_request(Protocol::v1, keyed(Op::delete_key, "/k")) + std::string("\x06", 1);
  Decoder v1({}, {Protocol::v1, "store.protocol 1.13"});
  auto got = decode_all(wire, v1);
  ASSERT_EQ(got.size(), 2u) << v1.error();
  EXPECT_EQ(got[0], keyed(Op::delete_key, "/k"));
  EXPECT_EQ(got[1].op, Op::get_num_keys);
  const std::string append = encode_request(Protocol::v21, keyed(Op::append, "/k", "tail"));
  Decoder v21({}, {Protocol::v21, "store.protocol 2.1"});
  got = decode_all(append, v21);
  ASSERT_EQ(got.size(), 1u) << v21.error();
  EXPECT_EQ(got[0], keyed(Op::append, "/k", "tail"));
  Decoder none;
  EXPECT_TRUE(decode_all(append, none).empty());
  EXPECT_NE(none.error().find("DELETE_KEY in PyTorch 1.13 and 2.0 but APPEND in 2.1"), std::string::npos)
      << none.error();
}

TEST(StoreLegacyLayouts, OpcodesNineToElevenProveTwoOneWhateverTheHint) {
  Request mg;
  mg.op = Op::multi_get;
  mg.keys = {"/a", "/b"};
  // MULTI_GET (9), then DELETE_KEY (7): the connection is 2.1 from its own bytes.
  const std::string wire =
      encode_request(Protocol::v21, mg) + encode_request(Protocol::v21, keyed(Op::delete_key, "/a"));
  for (const LegacyHint& hint : {LegacyHint{}, legacy_hint("auto", std::string("1.13.1"))}) {
    Decoder dec({}, hint);
    auto got = decode_all(wire, dec);
    ASSERT_EQ(got.size(), 2u) << dec.error();
    EXPECT_EQ(got[0], mg);
    EXPECT_EQ(got[1], keyed(Op::delete_key, "/a"));
    EXPECT_EQ(dec.protocol(), Protocol::v21);
  }
  // Once a 7 was read as 1.13 (by the hint), a later 9 is an error that names the fix.
  const std::string late =
      encode_request(Protocol::v1, keyed(Op::delete_key, "/a")) + encode_request(Protocol::v21, mg);
  Decoder dec({}, {Protocol::v1, "the job's PyTorch 1.13.1"});
  auto got = decode_all(late, dec);
  EXPECT_EQ(got.size(), 1u);
  EXPECT_NE(dec.error().find("MULTI_GET in PyTorch 2.1"), std::string::npos) << dec.error();
}

TEST(StoreLegacyLayouts, HintsFromTheJobFileWinOverTheProbe) {
  EXPECT_EQ(legacy_hint("2.1", std::string("1.13.1")).layout, Protocol::v21);
  EXPECT_EQ(legacy_hint("2.1", std::string("1.13.1")).source, "store.protocol 2.1");
  EXPECT_EQ(legacy_hint("2.0", std::nullopt).layout, Protocol::v1);
  EXPECT_EQ(legacy_hint("2.3", std::nullopt).layout, Protocol::v2);
  EXPECT_EQ(legacy_hint("auto", std::string("2.0.1")).layout, Protocol::v1);
  EXPECT_EQ(legacy_hint("auto", std::string("2.2.0a0+git")).layout, Protocol::v2);
  EXPECT_EQ(legacy_hint("auto", std::nullopt).layout, Protocol::unknown);
  EXPECT_EQ(legacy_hint("", std::string("garbage")).layout, Protocol::unknown);
  EXPECT_FALSE(parse_release("1.12.0"));
  EXPECT_FALSE(parse_release("3.0"));
  EXPECT_FALSE(parse_release("2.1x"));
  EXPECT_EQ(parse_release("2.10.1"), (Release{2, 10}));
}

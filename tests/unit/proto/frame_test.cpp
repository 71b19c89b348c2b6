// Frame codec: round trips, every split point, size limit before allocation, sticky errors.
#include "proto/frame.hpp"

#include <gtest/gtest.h>

using namespace ddp::proto;

namespace {
std::vector<std::string> drain(FrameDecoder& d) {
  std::vector<std::string> out;
  while (auto f = d.next()) out.push_back(*f);
  return out;
}
}  // namespace

TEST(Frame, HeaderIsBigEndianLength) {
  auto f = encode_frame(std::string(0x010203, 'x'));
  ASSERT_EQ(f.size(), 4u + 0x010203);
  EXPECT_EQ(f[0], 0x00);
  EXPECT_EQ(f[1], 0x01);
  EXPECT_EQ(f[2], 0x02);
  EXPECT_EQ(f[3], 0x03);
  EXPECT_EQ(encode_frame("{}"), std::string("\0\0\0\2{}", 6));
}

TEST(Frame, RoundTripSeveralFramesInOneFeed) {
  FrameDecoder d(1024);
  d.feed(encode_frame("a") + encode_frame("{\"x\":1}") + encode_frame(std::string(1024, 'z')));
  auto frames = drain(d);
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_EQ(frames[0], "a");
  EXPECT_EQ(frames[1], "{\"x\":1}");
  EXPECT_EQ(frames[2], std::string(1024, 'z'));
  EXPECT_EQ(d.buffered(), 0u);
  EXPECT_FALSE(d.error());
}

TEST(Frame, SplitAtEveryByteBoundary) {
  const std::vector<std::string> bodies{"first", std::string(300, 'm'), "{\"type\":\"x\"}"};
  std::string stream;
  for (const auto& b : bodies) stream += encode_frame(b);
  for (std::size_t i = 0; i <= stream.size(); ++i) {
    for (std::size_t j = i; j <= stream.size(); j += 7) {
      FrameDecoder d(4096);
      std::vector<std::string> got;
      for (auto piece : {stream.substr(0, i), stream.substr(i, j - i), stream.substr(j)}) {
        d.feed(piece);
        for (auto& f : drain(d)) got.push_back(f);
      }
      ASSERT_EQ(got, bodies) << "split at " << i << "," << j;
    }
  }
}

TEST(Frame, ByteByByte) {
  std::string stream = encode_frame("hello") + encode_frame("world");
  FrameDecoder d(16);
  std::vector<std::string> got;
  for (char c : stream) {
    d.feed(std::string_view(&c, 1));
    for (auto& f : drain(d)) got.push_back(f);
  }
  EXPECT_EQ(got, (std::vector<std::string>{"hello", "world"}));
}

TEST(Frame, OversizeRefusedFromTheHeaderAlone) {
  FrameDecoder d(100);
  d.feed(std::string("\0\0\0\x65", 4));  // declares 101 bytes, none sent
  EXPECT_FALSE(d.next());
  ASSERT_TRUE(d.error());
  EXPECT_EQ(d.error()->code, ErrorCode::too_large);
  EXPECT_EQ(d.error()->message, "frame of 101 bytes exceeds the limit of 100 bytes");
  EXPECT_EQ(d.buffered(), 0u);  // nothing kept
}

TEST(Frame, ExactlyTheLimitIsFine) {
  FrameDecoder d(100);
  d.feed(encode_frame(std::string(100, 'a')));
  EXPECT_EQ(d.next(), std::string(100, 'a'));
}

TEST(Frame, MaximalDeclaredLength) {
  FrameDecoder d(1 << 20);
  d.feed("\xff\xff\xff\xff");
  EXPECT_FALSE(d.next());
  EXPECT_EQ(d.error()->code, ErrorCode::too_large);
}

TEST(Frame, AnotherProtocolGetsAHint) {
  FrameDecoder d(4096);
  d.feed("GET / HTTP/1.1\r\n\r\n");
  EXPECT_FALSE(d.next());
  ASSERT_TRUE(d.error());
  EXPECT_NE(d.error()->hint.find("another protocol"), std::string::npos);
  FrameDecoder tls(4096);
  tls.feed(std::string("\x16\x03\x01\x02\x00", 5));
  EXPECT_FALSE(tls.next());
  EXPECT_EQ(tls.error()->code, ErrorCode::too_large);
}

TEST(Frame, EmptyFrameIsAnError) {
  FrameDecoder d(100);
  d.feed(std::string("\0\0\0\0", 4));
  EXPECT_FALSE(d.next());
  EXPECT_EQ(d.error()->code, ErrorCode::bad_frame);
}

TEST(Frame, ErrorsAreSticky) {
  FrameDecoder d(4);
  d.feed(encode_frame("toolong"));
  EXPECT_FALSE(d.next());
  d.feed(encode_frame("ok"));
  EXPECT_FALSE(d.next());
  EXPECT_TRUE(d.error());
}

TEST(Frame, LimitAppliesPerFrameAndCanRise) {
  FrameDecoder d(4);
  d.feed(encode_frame("abcd") + encode_frame("abcdefgh"));
  EXPECT_EQ(d.next(), "abcd");
  d.set_max_body(8);  // e.g. authentication finished between the two frames
  EXPECT_EQ(d.next(), "abcdefgh");
  EXPECT_FALSE(d.error());
}

TEST(Frame, LongStreamsDoNotAccumulate) {
  FrameDecoder d(64);
  const auto f = encode_frame("0123456789");
  for (int i = 0; i < 10000; ++i) {
    d.feed(f.substr(0, 5));
    EXPECT_FALSE(d.next());
    d.feed(f.substr(5));
    ASSERT_EQ(d.next(), "0123456789");
  }
  EXPECT_EQ(d.buffered(), 0u);
}

// The id's hex codec, the holder's line parser, and the bootstrap-address decode on crafted ids
// laid out as NCCL 2.x's ncclBootstrapHandle (magic at 0, sockaddr at 8).
#include "nccl/unique_id.hpp"
#include "nccl/holder_protocol.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

using namespace ddp::nccl;
using ::testing::HasSubstr;

namespace {

UniqueId pattern_id() {
  UniqueId id;
  for (std::size_t i = 0; i < id.bytes.size(); ++i) id.bytes[i] = static_cast<std::uint8_t>(i * 37 + 11);
  return id;
}

UniqueId ipv4_id(const char* ip, std::uint16_t port, std::uint64_t magic) {
  UniqueId id;
  std::memcpy(id.bytes.data(), &magic, sizeof magic);
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(port);
  inet_pton(AF_INET, ip, &sin.sin_addr);
  std::memcpy(id.bytes.data() + 8, &sin, sizeof sin);
  return id;
}

UniqueId ipv6_id(const char* ip, std::uint16_t port, std::uint32_t scope) {
  UniqueId id;
  std::uint64_t magic = 0x0123456789abcdefULL;
  std::memcpy(id.bytes.data(), &magic, sizeof magic);
  sockaddr_in6 sin6{};
  sin6.sin6_family = AF_INET6;
  sin6.sin6_port = htons(port);
  sin6.sin6_scope_id = scope;
  inet_pton(AF_INET6, ip, &sin6.sin6_addr);
  std::memcpy(id.bytes.data() + 8, &sin6, sizeof sin6);
  return id;
}

}  // namespace

TEST(UniqueIdHex, RoundTrip) {
  UniqueId id = pattern_id();
  std::string hex = to_hex(id);
  ASSERT_EQ(hex.size(), 256u);
  EXPECT_EQ(hex.substr(0, 4), "0b30");  // bytes 0x0b, 0x30
  EXPECT_EQ(hex.find_first_not_of("0123456789abcdef"), std::string::npos);
  auto back = unique_id_from_hex(hex);
  ASSERT_TRUE(back) << back.error;
  EXPECT_EQ(*back.value, id);
  EXPECT_EQ(to_hex(UniqueId{}), std::string(256, '0'));
}

TEST(UniqueIdHex, RejectsWrongLength) {
  std::string hex = to_hex(pattern_id());
  for (std::string bad : {std::string(), hex.substr(0, 255), hex + "0", hex.substr(0, 254), hex + "\n"}) {
    auto r = unique_id_from_hex(bad);
    EXPECT_FALSE(r);
    EXPECT_THAT(r.error, HasSubstr("256 lowercase hex characters")) << r.error;
    EXPECT_THAT(r.error, HasSubstr("got " + std::to_string(bad.size())));
  }
}

TEST(UniqueIdHex, RejectsBadCharactersWithPosition) {
  std::string hex = to_hex(pattern_id());
  struct Case {
    std::size_t at;
    char c;
    const char* shown;
  };
  for (Case k : {Case{0, 'A', "'A'"}, Case{17, 'g', "'g'"}, Case{255, ' ', "0x20"}, Case{100, 'x', "'x'"},
                 Case{3, '\0', "0x00"}, Case{254, 'F', "'F'"}}) {
    std::string bad = hex;
    bad[k.at] = k.c;
    auto r = unique_id_from_hex(bad);
    ASSERT_FALSE(r) << k.at;
    EXPECT_THAT(r.error, HasSubstr("position " + std::to_string(k.at))) << r.error;
    EXPECT_THAT(r.error, HasSubstr(k.shown)) << r.error;
  }
  // An upper-case id is refused, not normalised: the launcher writes lower case only.
  std::string upper = hex;
  for (auto& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  ASSERT_NE(upper, hex);
  EXPECT_FALSE(unique_id_from_hex(upper));
}

TEST(BootstrapAddress, DecodesIpv4) {
  auto r = decode_bootstrap_address(ipv4_id("127.0.0.1", 41234, 0xdeadbeefcafef00dULL));
  ASSERT_TRUE(r) << r.error;
  EXPECT_EQ(r.value->family, AddressFamily::ipv4);
  EXPECT_EQ(r.value->ip, "127.0.0.1");
  EXPECT_EQ(r.value->port, 41234);
  EXPECT_EQ(r.value->magic, 0xdeadbeefcafef00dULL);
  EXPECT_EQ(r.value->endpoint(), "127.0.0.1:41234");

  auto r2 = decode_bootstrap_address(ipv4_id("10.213.0.12", 65535, 1));
  ASSERT_TRUE(r2) << r2.error;
  EXPECT_EQ(r2.value->endpoint(), "10.213.0.12:65535");
}

TEST(BootstrapAddress, DecodesIpv6) {
  auto r = decode_bootstrap_address(ipv6_id("fd00::1:2", 29501, 0));
  ASSERT_TRUE(r) << r.error;
  EXPECT_EQ(r.value->family, AddressFamily::ipv6);
  EXPECT_EQ(r.value->ip, "fd00::1:2");
  EXPECT_EQ(r.value->port, 29501);
  EXPECT_EQ(r.value->magic, 0x0123456789abcdefULL);
  EXPECT_EQ(r.value->endpoint(), "[fd00::1:2]:29501");

  auto ll = decode_bootstrap_address(ipv6_id("fe80::42", 1024, 3));
  ASSERT_TRUE(ll) << ll.error;
  EXPECT_EQ(ll.value->scope_id, 3u);
  EXPECT_EQ(ll.value->endpoint(), "[fe80::42%3]:1024");
}

TEST(BootstrapAddress, SurvivesHexRoundTrip) {
  auto id = unique_id_from_hex(to_hex(ipv4_id("192.168.7.9", 50000, 42)));
  ASSERT_TRUE(id);
  auto r = decode_bootstrap_address(*id.value);
  ASSERT_TRUE(r) << r.error;
  EXPECT_EQ(r.value->endpoint(), "192.168.7.9:50000");
}

TEST(BootstrapAddress, RejectsIdsWithoutAnAddress) {
  auto zero = decode_bootstrap_address(UniqueId{});
  EXPECT_FALSE(zero);
  EXPECT_THAT(zero.error, HasSubstr("family 0"));

  UniqueId unix_family = ipv4_id("127.0.0.1", 80, 7);
  sa_family_t f = AF_UNIX;
  std::memcpy(unix_family.bytes.data() + 8, &f, sizeof f);
  EXPECT_FALSE(decode_bootstrap_address(unix_family));

  auto no_port = decode_bootstrap_address(ipv4_id("127.0.0.1", 0, 7));
  EXPECT_FALSE(no_port);
  EXPECT_THAT(no_port.error, HasSubstr("port 0"));
}

TEST(HolderProtocol, ParsesTheIdLine) {
  UniqueId id = ipv4_id("127.0.0.1", 3333, 9);
  for (std::string line : {to_hex(id), to_hex(id) + "\n", to_hex(id) + "\r\n"}) {
    auto r = holder::parse_line(line);
    ASSERT_TRUE(r) << r.error;
    EXPECT_EQ(*r.value, id);
  }
}

TEST(HolderProtocol, ReportsErrorLinesAndGarbage) {
  auto err = holder::parse_line("error: libnccl.so.2 not found on this node (LD_LIBRARY_PATH=unset): x\n");
  ASSERT_FALSE(err);
  EXPECT_EQ(err.error, "libnccl.so.2 not found on this node (LD_LIBRARY_PATH=unset): x");

  auto junk = holder::parse_line("hello\n");
  ASSERT_FALSE(junk);
  EXPECT_THAT(junk.error, HasSubstr("ddp-ncclid printed a malformed line"));

  EXPECT_FALSE(holder::parse_line(""));
  EXPECT_EQ(holder::parse_line("error: ").error, "unspecified error");
}

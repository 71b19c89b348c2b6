// Hostlist expansion, errors with columns, the size bound, compression round trips, endpoints.
#include "hostlist/hostlist.hpp"

#include <gtest/gtest.h>

#include <random>

#include "common/strings.hpp"

using namespace ddp::hostlist;
using V = std::vector<std::string>;

namespace {
V ok(std::string_view s, Options o = {}) {
  auto r = expand(s, o);
  EXPECT_TRUE(r.ok()) << s << ": " << (r.error ? r.error->to_string() : "");
  return r.hosts;
}
Error err(std::string_view s, Options o = {}) {
  auto r = expand(s, o);
  EXPECT_FALSE(r.ok()) << s;
  EXPECT_TRUE(r.hosts.empty());
  return r.error.value_or(Error{});
}
}  // namespace

TEST(HostlistExpand, PlainNamesAndCommaLists) {
  EXPECT_EQ(ok("node1"), V{"node1"});
  EXPECT_EQ(ok("node1,node2"), (V{"node1", "node2"}));
  EXPECT_EQ(ok(" a , b "), (V{"a", "b"}));
  EXPECT_EQ(ok("gpu-01.example.org"), V{"gpu-01.example.org"});
  EXPECT_EQ(ok("10.0.0.1,10.0.0.2"), (V{"10.0.0.1", "10.0.0.2"}));
}

TEST(HostlistExpand, Ranges) {
  EXPECT_EQ(ok("node[1-4]"), (V{"node1", "node2", "node3", "node4"}));
  EXPECT_EQ(ok("node[3]"), V{"node3"});
  EXPECT_EQ(ok("node[7-7]"), V{"node7"});
  EXPECT_EQ(ok("[1-2]"), (V{"1", "2"}));
}

TEST(HostlistExpand, ZeroPaddingFollowsTheLowEnd) {
  EXPECT_EQ(ok("node[01-03]"), (V{"node01", "node02", "node03"}));
  auto v = ok("node[01-10]");
  ASSERT_EQ(v.size(), 10u);
  EXPECT_EQ(v.front(), "node01");
  EXPECT_EQ(v[8], "node09");
  EXPECT_EQ(v.back(), "node10");
  EXPECT_EQ(ok("n[8-10]"), (V{"n8", "n9", "n10"}));
  EXPECT_EQ(ok("n[098-101]"), (V{"n098", "n099", "n100", "n101"}));
  EXPECT_EQ(ok("n[0-1]"), (V{"n0", "n1"}));
}

TEST(HostlistExpand, CommasInsideBracketsAndSuffixes) {
  EXPECT_EQ(ok("a[1-2,5]b"), (V{"a1b", "a2b", "a5b"}));
  EXPECT_EQ(ok("node[01-04,07]"), (V{"node01", "node02", "node03", "node04", "node07"}));
  EXPECT_EQ(ok("a[1,3],b[2-3],c"), (V{"a1", "a3", "b2", "b3", "c"}));
  EXPECT_EQ(ok("n[01-02,7-8]"), (V{"n01", "n02", "n7", "n8"}));
}

TEST(HostlistExpand, SeveralBracketsAreACartesianProductLeftmostSlowest) {
  EXPECT_EQ(ok("n[1-2]-ib[0-1]"), (V{"n1-ib0", "n1-ib1", "n2-ib0", "n2-ib1"}));
  EXPECT_EQ(ok("r[1-2]n[1-2]x[5,7]").size(), 8u);
  EXPECT_EQ(ok("r[1-2]n[1-2]x[5,7]")[1], "r1n1x7");
  EXPECT_EQ(ok("[1-2][3-4]"), (V{"13", "14", "23", "24"}));
}

TEST(HostlistExpand, PortsAndIpv6LiteralsPassThrough) {
  EXPECT_EQ(ok("node[1-2]:29410"), (V{"node1:29410", "node2:29410"}));
  EXPECT_EQ(ok("[fe80::1]:29410,[::1]"), (V{"[fe80::1]:29410", "[::1]"}));
  EXPECT_EQ(ok("n1:1,[2001:db8::2]:29410,n[3-4]"), (V{"n1:1", "[2001:db8::2]:29410", "n3", "n4"}));
}

TEST(HostlistErrors, MissingCloseBracketNamesTheColumn) {
  auto e = err("node[1-4");
  EXPECT_EQ(e.column, 9u);
  EXPECT_EQ(e.to_string(), "expected ']' to close the '[' at column 5 at column 9");
  e = err("node[1-4x");
  EXPECT_EQ(e.column, 9u);
  EXPECT_EQ(e.message, "expected ']', got 'x'");
  e = err("ab[1,2-3;");
  EXPECT_EQ(e.column, 9u);
}

TEST(HostlistErrors, EveryErrorPath) {
  struct Case {
    const char* input;
    std::size_t column;
    const char* needle;
  };
  for (const Case& c : std::vector<Case>{
           {"", 1, "expected a host name"},
           {"a,,b", 3, "expected a host name"},
           {"a,", 3, "expected a host name"},
           {",a", 1, "expected a host name"},
           {"n[]", 3, "expected a number, got ']'"},
           {"n[", 3, "expected a number, got the end"},
           {"n[a]", 3, "expected a number, got 'a'"},
           {"n[1-]", 5, "expected a number"},
           {"n[-2]", 3, "expected a number"},
           {"n[5-3]", 3, "goes backwards"},
           {"n[1,]", 5, "expected a number"},
           {"n[1-2", 6, "expected ']'"},
           {"n]", 2, "unexpected ']'"},
           {"n1]", 3, "unexpected ']'"},
           {"n[[1]]", 3, "expected a number, got '['"},
           {"no de", 4, "expected ','"},
           {"n/1", 2, "unexpected '/'"},
           {"n\x01", 2, "control character"},
           {"n[1234567890123456789]", 3, "number too long"},
           {"a,b,a", 5, "listed twice (positions 1 and 3)"},
           {"n[1-2],n2", 8, "'n2' is listed twice"},
       }) {
    auto e = err(c.input);
    EXPECT_EQ(e.column, c.column) << c.input << ": " << e.to_string();
    EXPECT_NE(e.message.find(c.needle), std::string::npos) << c.input << ": " << e.message;
  }
}

TEST(HostlistErrors, DuplicatesAllowedOnRequest) {
  Options o;
  o.allow_duplicates = true;
  EXPECT_EQ(ok("a,a", o), (V{"a", "a"}));
}

TEST(HostlistBound, CheckedBeforeExpanding) {
  EXPECT_EQ(ok("n[1-65536]").size(), 65536u);
  auto e = err("n[1-65537]");
  EXPECT_NE(e.message.find("more than 65536 hosts"), std::string::npos);
  // Would be 10^18 names; refused instantly.
  e = err("n[0-999999999999999999]");
  EXPECT_NE(e.message.find("more than"), std::string::npos);
  e = err("a[1-1000000]b[1-1000000]c[1-1000000]d[1-1000000]");
  EXPECT_NE(e.message.find("more than"), std::string::npos);
  // The bound is over the whole list, not per item; the error names the item that crossed it.
  Options o;
  o.max_hosts = 4;
  EXPECT_EQ(ok("a[1-2],b[1-2]", o).size(), 4u);
  e = err("a[1-2],b[1-2],c", o);
  EXPECT_EQ(e.column, 15u);
}

TEST(HostlistCount, WithoutExpanding) {
  EXPECT_EQ(count("n[1-4],m[01-10]-ib[0-1]"), 24u);
  EXPECT_EQ(count("n[0-999999999]"), 1000000000u);
  EXPECT_EQ(count("n[1"), std::nullopt);
}

TEST(HostlistCompress, FoldsRunsAndKeepsOrder) {
  EXPECT_EQ(compress({}), "");
  EXPECT_EQ(compress({"a"}), "a");
  EXPECT_EQ(compress({"n1", "n2", "n3", "n5"}), "n[1-3,5]");
  EXPECT_EQ(compress({"node01", "node02", "node03", "node04", "node07"}), "node[01-04,07]");
  EXPECT_EQ(compress({"n3", "n1", "n2"}), "n[3,1-2]");
  EXPECT_EQ(compress({"n1", "m1", "n2"}), "n1,m1,n2");
  EXPECT_EQ(compress({"n8", "n9", "n10"}), "n[8-10]");
  EXPECT_EQ(compress({"n08", "n09", "n10"}), "n[08-10]");
  EXPECT_EQ(compress({"node9", "node010"}), "node[9,010]");
  // Brackets only where they are shorter.
  EXPECT_EQ(compress({"n9", "n10"}), "n9,n10");
  EXPECT_EQ(compress({"x20", "x06"}), "x20,x06");
  EXPECT_EQ(compress({"n1-ib0", "n1-ib1"}), "n1-ib[0-1]");
  EXPECT_EQ(compress({"alpha", "beta"}), "alpha,beta");
  EXPECT_EQ(compress({"[::1]:1", "[::1]:2"}), "[::1]:1,[::1]:2");
}

TEST(HostlistCompress, RoundTripsRandomLists) {
  std::mt19937 rng(12345);
  const std::vector<std::string> prefixes{"n", "node", "gpu-", "r1n", "x"};
  const std::vector<std::string> suffixes{"", "-ib", ".lan", ":29410"};
  for (int trial = 0; trial < 2000; ++trial) {
    V hosts;
    std::size_t n = rng() % 20;
    for (std::size_t k = 0; k < n; ++k) {
      std::string num = std::to_string(rng() % 30);
      if (rng() % 3 == 0) num = "0" + num;
      std::string host = prefixes[rng() % prefixes.size()];  // += (not +): GCC 12 -Wrestrict false positive
      host += num;
      host += suffixes[rng() % suffixes.size()];
      hosts.push_back(std::move(host));
    }
    auto text = compress(hosts);
    Options o;
    o.allow_duplicates = true;
    auto back = expand(text.empty() ? "" : text, o);
    if (hosts.empty()) {
      EXPECT_FALSE(back.ok());
      continue;
    }
    ASSERT_TRUE(back.ok()) << text << ": " << back.error->to_string();
    EXPECT_EQ(back.hosts, hosts) << text;
    EXPECT_LE(text.size(), ddp::join(hosts, ",").size()) << text;
  }
}

TEST(Endpoint, Forms) {
  auto p = [](std::string_view s) {
    auto r = parse_endpoint(s);
    EXPECT_TRUE(r.ok()) << s << ": " << (r.error ? r.error->to_string() : "");
    return r.endpoint;
  };
  EXPECT_EQ(p("node1"), (Endpoint{"", "node1", std::nullopt}));
  EXPECT_EQ(p("node1:29410"), (Endpoint{"", "node1", 29410}));
  EXPECT_EQ(p("[fe80::1]:29410"), (Endpoint{"", "fe80::1", 29410}));
  EXPECT_EQ(p("[::1]"), (Endpoint{"", "::1", std::nullopt}));
  EXPECT_EQ(p("10.1.2.3:1"), (Endpoint{"", "10.1.2.3", 1}));
  // An SSH login name in front, as `ssh` takes it.
  EXPECT_EQ(p("alice@node1"), (Endpoint{"alice", "node1", std::nullopt}));
  EXPECT_EQ(p("svc-train.2@node1:2222"), (Endpoint{"svc-train.2", "node1", 2222}));
  EXPECT_EQ(p("bob@[fe80::1]:22"), (Endpoint{"bob", "fe80::1", 22}));
}

TEST(Endpoint, UserNamesExpandWithTheirHosts) {
  auto e = expand("alice@gpu[1-2],bob@cpu3");
  ASSERT_TRUE(e.ok()) << e.error->to_string();
  EXPECT_EQ(e.hosts, (std::vector<std::string>{"alice@gpu1", "alice@gpu2", "bob@cpu3"}));
}

TEST(Endpoint, Errors) {
  struct Case {
    const char* input;
    std::size_t column;
    const char* needle;
  };
  for (const Case& c : std::vector<Case>{
           {"", 1, "expected a host"},
           {":80", 1, "expected a host name before ':'"},
           {"n1:", 4, "port number"},
           {"n1:0", 4, "port number"},
           {"n1:65536", 4, "port number"},
           {"n1:12x", 4, "port number"},
           {"fe80::1", 5, "[addr]:port"},
           {"[::1", 5, "expected ']'"},
           {"[]", 2, "IPv6 address"},
           {"[::1]x", 6, "expected ':'"},
           {"n/1:5", 2, "unexpected '/'"},
           // Columns count in the whole entry, user name included.
           {"@n1", 1, "expected a user name"},
           {"alice@", 7, "expected a host name after '@'"},
           {"al ice@n1", 3, "in a user name"},
           {"alice@n1@x", 9, "unexpected '@' in a host name"},
           {"alice@n1:0", 10, "port number"},
           {"alice@[::1", 11, "expected ']'"},
       }) {
    auto r = parse_endpoint(c.input);
    ASSERT_FALSE(r.ok()) << c.input;
    EXPECT_EQ(r.error->column, c.column) << c.input << ": " << r.error->to_string();
    EXPECT_NE(r.error->message.find(c.needle), std::string::npos) << c.input << ": " << r.error->message;
  }
}

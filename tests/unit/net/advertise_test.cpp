// --advertise-addr: the forms it takes, and the address each node's agent is given.
#include "net/advertise.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

using ddp::net::AdvertiseAddr;
using ddp::net::advertised_endpoint;
using ddp::net::parse_advertise_addr;

TEST(AdvertiseAddr, Forms) {
  EXPECT_EQ(parse_advertise_addr("auto"), (AdvertiseAddr{std::nullopt, 0}));
  EXPECT_EQ(parse_advertise_addr(":29412"), (AdvertiseAddr{std::nullopt, 29412}));
  EXPECT_EQ(parse_advertise_addr("10.0.0.5"), (AdvertiseAddr{"10.0.0.5", 0}));
  EXPECT_EQ(parse_advertise_addr("10.0.0.5:29412"), (AdvertiseAddr{"10.0.0.5", 29412}));
  EXPECT_EQ(parse_advertise_addr("laptop.vpn:7000"), (AdvertiseAddr{"laptop.vpn", 7000}));
  EXPECT_EQ(parse_advertise_addr("[fd00::5]:29412"), (AdvertiseAddr{"fd00::5", 29412}));
}

TEST(AdvertiseAddr, BadFormsSayWhy) {
  auto what = [](const char* text) {
    try {
      parse_advertise_addr(text);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(what(""), "accepted");
  EXPECT_NE(what("host:99999"), "accepted");
  EXPECT_NE(what(":x"), "accepted");
  EXPECT_NE(what(":"), "accepted");
  EXPECT_EQ(what("auto:5"), "'auto' takes no port: use :PORT for a port with the automatic address");
}

TEST(AdvertisedEndpoint, GivenHostWinsWithTheListenersPort) {
  AdvertiseAddr a{"gw.example", 0};
  EXPECT_EQ(advertised_endpoint(a, "10.0.0.1", "10.0.0.2", 40001), "gw.example:40001");
  EXPECT_EQ(advertised_endpoint(AdvertiseAddr{"fd00::1", 0}, "", "n1", 40001), "[fd00::1]:40001");
}

TEST(AdvertisedEndpoint, OtherwiseTheRoutesSourcePerNode) {
  AdvertiseAddr a;
  EXPECT_EQ(advertised_endpoint(a, "10.1.0.1", "10.1.0.7", 40001), "10.1.0.1:40001");
  EXPECT_EQ(advertised_endpoint(a, "192.168.5.1", "192.168.5.9", 40001), "192.168.5.1:40001");
  EXPECT_EQ(advertised_endpoint(a, "fd00::1", "fd00::7", 40001), "[fd00::1]:40001");
  // A node on loopback (a test, or an agent on this machine) may be told loopback.
  EXPECT_EQ(advertised_endpoint(a, "127.0.0.1", "127.0.0.1", 40001), "127.0.0.1:40001");
}

TEST(AdvertisedEndpoint, NothingAnAgentCouldDialIsAnErrorNamingTheNode) {
  AdvertiseAddr a;
  EXPECT_THROW(advertised_endpoint(a, "", "10.0.0.7", 1), std::invalid_argument);
  EXPECT_THROW(advertised_endpoint(a, "0.0.0.0", "10.0.0.7", 1), std::invalid_argument);
  try {
    advertised_endpoint(a, "127.0.0.1", "10.0.0.7", 1);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("10.0.0.7"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--advertise-addr"), std::string::npos) << e.what();
  }
}

#include "coordinator/gather.hpp"

#include "common/version.hpp"
#include "net/connection.hpp"
#include "net/wire.hpp"

#include <fmt/format.h>
#include <boost/asio.hpp>

#include <memory>

namespace ddp::coordinator {

namespace asio = boost::asio;

std::vector<GatheredFacts> gather_facts(const std::vector<std::string>& nodes, const proto::Keyring& keys,
                                        const std::string& user, Millis timeout, const nlohmann::json& image,
                                        bool tls) {
  const auto entries = net::node_entries(nodes, 29410);
  // Reaching an agent and its handshake take milliseconds; a node whose firewall drops the
  // connection says nothing, and should not hold the whole answer for `timeout` (which also
  // covers the facts, image look-ups included).
  const Millis reach = std::min(timeout, kReachTimeout);
  const auto tls_context = tls ? net::tls_client_context(*keys.first()) : nullptr;
  std::vector<GatheredFacts> out(entries.size());
  std::vector<std::shared_ptr<net::Connection>> conns(entries.size());
  asio::io_context io;
  asio::steady_timer deadline(io, timeout);
  std::size_t pending = entries.size();
  auto settle = [&](std::size_t i, std::string error) {
    if (out[i].facts || !out[i].error.empty()) return;
    out[i].error = std::move(error);
    if (conns[i]) conns[i]->close("done", /*routine=*/true);
    if (--pending == 0) deadline.cancel();
  };
  for (std::size_t i = 0; i < entries.size(); ++i) {
    out[i].node = entries[i].name;
    net::dial(io, entries[i].host, entries[i].port, reach, [&, i](boost::system::error_code ec, net::tcp::socket s) {
      if (ec == asio::error::timed_out) {
        return settle(i, fmt::format("cannot reach its agent at port {}: no answer within {} s (a firewall dropping "
                                     "the connection?)",
                                     entries[i].port, reach.count() / 1000));
      }
      if (ec) return settle(i, fmt::format("cannot reach its agent at port {}: {}", entries[i].port, ec.message()));
      boost::system::error_code peer_ec;
      if (auto peer = s.remote_endpoint(peer_ec).address(); !peer_ec) {
        if (peer.is_v6() && peer.to_v6().is_v4_mapped())
          peer = asio::ip::make_address_v4(asio::ip::v4_mapped, peer.to_v6());
        out[i].address = peer.to_string();
      }
      proto::ClientConfig cc;
      cc.role = proto::Role::coordinator;
      cc.user = user;
      cc.name = "ddpctl doctor";
      cc.software = ddp::kCtlVersion;
      cc.key = *keys.first();
      cc.nonce = proto::random_nonce();
      cc.expect_server = proto::Role::agent;
      conns[i] = net::Connection::make(std::move(s), proto::Session::client(cc), entries[i].name, "doctor", reach);
      auto* c = conns[i].get();
      if (tls_context) c->use_tls({tls_context});
      c->start({[c, &image](const proto::PeerInfo&) {
                  c->send(image.is_null() ? c->session().message("facts_request")
                                          : c->session().message("facts_request", {{"image", image}}));
                },
                [&, i](proto::Message m) {
                  if (m.type != "facts") return;
                  out[i].facts = m.body["facts"];
                  conns[i]->close("done", /*routine=*/true);
                  if (--pending == 0) deadline.cancel();
                },
                [&, i](const std::string& reason) { settle(i, reason); }});
    });
  }
  deadline.async_wait([&](boost::system::error_code ec) {
    if (ec) return;
    for (std::size_t i = 0; i < out.size(); ++i) settle(i, fmt::format("no answer within {} ms", timeout.count()));
  });
  io.run();
  return out;
}

}  // namespace ddp::coordinator

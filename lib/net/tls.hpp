// TLS 1.3 under the protocol's frames, as an option (ddpctl --tls; agent.yaml `tls:`).
//
// The protocol already authenticates both ends and every frame with the token's secret (HMAC,
// proto/session.hpp); what it does not give is confidentiality: job specs, environments and
// output cross the network readable. TLS adds that without a PKI to run: both ends already share
// the token, so it is used as a TLS 1.3 external pre-shared key (RFC 8446 §2.2, identity = key
// id), with the (EC)DHE mode (psk_dhe_ke) for forward secrecy. No certificates. The PSK is
// derived from the secret (HMAC-SHA256(secret, label)), so the TLS key and the protocol's MAC
// keys never coincide. The protocol's own handshake still runs inside, unchanged.
//
// Agents take TLS and plaintext on one port and tell them apart by the first byte (a TLS
// record's content type 0x16 against the frame length's high byte, always 0 since frames are
// far below 16 MiB), unless `tls: required` or `tls: off` says otherwise.
#pragma once

#include "proto/keyring.hpp"

#include <boost/asio/ssl/context.hpp>

#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace ddp::net {

enum class TlsMode { off, allowed, required };
std::optional<TlsMode> parse_tls_mode(std::string_view text);  // "off" | "allowed" | "required"
std::string_view to_string(TlsMode mode);

// The 32-byte PSK for one key (pure; exposed for tests).
std::string tls_psk(const proto::Key& key);

// A client context offering `key` as its PSK; a server context that finds the client's key id in
// `keys`. Both TLS 1.3 only, no certificates. The keyring/key are copied into the context.
std::shared_ptr<boost::asio::ssl::context> tls_client_context(const proto::Key& key);
std::shared_ptr<boost::asio::ssl::context> tls_server_context(const proto::Keyring& keys);

// The first byte of a connection opens a TLS record (a ClientHello).
inline bool looks_like_tls(unsigned char first_byte) {
  return first_byte == 0x16;
}

}  // namespace ddp::net

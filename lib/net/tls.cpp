// TLS 1.3 with the token as an external PSK (see tls.hpp), over OpenSSL through Asio's context.
#include "net/tls.hpp"

#include "proto/crypto.hpp"

#include <openssl/ssl.h>

#include <stdexcept>

namespace ddp::net {

namespace ssl = boost::asio::ssl;

namespace {

// The label the PSK is derived under; a new label would be a new, incompatible TLS key.
constexpr std::string_view kPskLabel = "ddpctl tls13 external psk v1";
// TLS_AES_128_GCM_SHA256: every TLS 1.3 implementation must offer it (RFC 8446 §9.1), and an
// external PSK is bound to one hash, SHA-256 here.
constexpr unsigned char kCipherId[] = {0x13, 0x01};

struct ClientState {
  std::string identity;
  std::string psk;
};
struct ServerState {
  std::vector<std::pair<std::string, std::string>> psks;  // key id, PSK
};

// Where a context keeps its PSK state. Not SSL_CTX's "app data": Asio's ssl::context owns that
// slot (its verify callback) and deletes whatever it finds there.
int state_index() {
  static const int index = SSL_CTX_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  return index;
}
void* state_of(SSL* ssl) {
  return SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), state_index());
}

SSL_SESSION* psk_session(SSL* ssl, const std::string& psk) {
  const SSL_CIPHER* cipher = SSL_CIPHER_find(ssl, kCipherId);
  if (cipher == nullptr) return nullptr;
  SSL_SESSION* s = SSL_SESSION_new();
  if (s == nullptr) return nullptr;
  if (SSL_SESSION_set1_master_key(s, reinterpret_cast<const unsigned char*>(psk.data()), psk.size()) != 1 ||
      SSL_SESSION_set_cipher(s, cipher) != 1 || SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION) != 1) {
    SSL_SESSION_free(s);
    return nullptr;
  }
  return s;
}

int use_session(SSL* ssl, const EVP_MD* md, const unsigned char** id, std::size_t* idlen, SSL_SESSION** sess) {
  auto* st = static_cast<ClientState*>(state_of(ssl));
  *sess = nullptr;
  const SSL_CIPHER* cipher = SSL_CIPHER_find(ssl, kCipherId);
  // After a HelloRetryRequest OpenSSL asks again with the negotiated hash: offer the PSK only
  // when it is ours (anything else fails the handshake, as it should).
  if (st == nullptr || cipher == nullptr || (md != nullptr && md != SSL_CIPHER_get_handshake_digest(cipher))) return 1;
  *sess = psk_session(ssl, st->psk);
  if (*sess == nullptr) return 0;
  *id = reinterpret_cast<const unsigned char*>(st->identity.data());
  *idlen = st->identity.size();
  return 1;
}

int find_session(SSL* ssl, const unsigned char* identity, std::size_t identity_len, SSL_SESSION** sess) {
  auto* st = static_cast<ServerState*>(state_of(ssl));
  *sess = nullptr;
  const std::string_view id(reinterpret_cast<const char*>(identity), identity_len);
  if (st == nullptr) return 1;
  for (const auto& [key_id, psk] : st->psks) {
    // An unknown identity: no session, and with no certificate the handshake fails.
    if (key_id == id) {
      *sess = psk_session(ssl, psk);
      return *sess == nullptr ? 0 : 1;
    }
  }
  return 1;
}

void common_setup(ssl::context& ctx) {
  SSL_CTX* c = ctx.native_handle();
  if (SSL_CTX_set_min_proto_version(c, TLS1_3_VERSION) != 1 || SSL_CTX_set_max_proto_version(c, TLS1_3_VERSION) != 1) {
    throw std::runtime_error("TLS: this OpenSSL cannot do TLS 1.3");
  }
  // The PSK is bound to SHA-256; left to itself a server prefers TLS_AES_256_GCM_SHA384, would
  // then ignore the PSK and, having no certificate, fail the handshake.
  if (SSL_CTX_set_ciphersuites(c, "TLS_AES_128_GCM_SHA256") != 1)
    throw std::runtime_error("TLS: no TLS_AES_128_GCM_SHA256");
  // Connections are long-lived and never resumed: no tickets to make or keep.
  SSL_CTX_set_num_tickets(c, 0);
  SSL_CTX_set_session_cache_mode(c, SSL_SESS_CACHE_OFF);
  ctx.set_verify_mode(ssl::verify_none);  // no certificates: the PSK authenticates both ends
}

}  // namespace

std::optional<TlsMode> parse_tls_mode(std::string_view text) {
  if (text == "off") return TlsMode::off;
  if (text == "allowed") return TlsMode::allowed;
  if (text == "required") return TlsMode::required;
  return std::nullopt;
}

std::string_view to_string(TlsMode mode) {
  switch (mode) {
    case TlsMode::off:
      return "off";
    case TlsMode::allowed:
      return "allowed";
    case TlsMode::required:
      return "required";
  }
  return "?";
}

std::string tls_psk(const proto::Key& key) {
  return std::string(proto::as_bytes(proto::hmac_sha256(key.secret, kPskLabel)));
}

std::shared_ptr<ssl::context> tls_client_context(const proto::Key& key) {
  struct Holder {
    ClientState state;
    ssl::context ctx{ssl::context::tls_client};
  };
  auto h = std::make_shared<Holder>();
  h->state = {key.id, tls_psk(key)};
  common_setup(h->ctx);
  SSL_CTX_set_ex_data(h->ctx.native_handle(), state_index(), &h->state);
  SSL_CTX_set_psk_use_session_callback(h->ctx.native_handle(), use_session);
  return {h, &h->ctx};  // aliasing: the context keeps its state alive
}

std::shared_ptr<ssl::context> tls_server_context(const proto::Keyring& keys) {
  struct Holder {
    ServerState state;
    ssl::context ctx{ssl::context::tls_server};
  };
  auto h = std::make_shared<Holder>();
  for (const auto& k : keys.keys()) h->state.psks.emplace_back(k.id, tls_psk(k));
  common_setup(h->ctx);
  SSL_CTX_set_ex_data(h->ctx.native_handle(), state_index(), &h->state);
  SSL_CTX_set_psk_find_session_callback(h->ctx.native_handle(), find_session);
  return {h, &h->ctx};
}

}  // namespace ddp::net

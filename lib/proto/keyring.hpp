// Token files: the shared secrets both ends prove knowledge of.
//
// Format (a subset of YAML, so either reader accepts it): one `key_id: secret` per line; '#'
// starts a comment line; blank lines are ignored; the secret may be quoted ('...' or "...").
// A file whose only line is a bare secret (`openssl rand -hex 32 > token`) holds one key with
// id "default". Key ids: 1-64 of [A-Za-z0-9._-]. Secrets: 32-1024 characters, used as the
// literal bytes written (not hex-decoded), so 32 characters is at least 128 bits when random hex.
// The first key is the one a client uses unless told otherwise. File permissions are the
// edge's to check (it reads the file); this parser only sees text.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::proto {

inline constexpr std::size_t kMinSecretChars = 32;
inline constexpr std::size_t kMaxSecretChars = 1024;
inline constexpr std::size_t kMaxKeyIdChars = 64;

struct Key {
  std::string id;
  std::string secret;
};

class Keyring {
 public:
  Keyring() = default;
  explicit Keyring(std::vector<Key> keys) : keys_(std::move(keys)) {}
  const Key* find(std::string_view id) const;
  const Key* first() const { return keys_.empty() ? nullptr : &keys_.front(); }
  const std::vector<Key>& keys() const { return keys_; }
  bool empty() const { return keys_.empty(); }

 private:
  std::vector<Key> keys_;
};

struct KeyringError {
  std::size_t line = 0;  // 1-based; 0 for the whole file
  std::string message;
  std::string to_string() const;  // "line 3: ..."
};

struct KeyringParse {
  Keyring keyring;
  std::optional<KeyringError> error;
  bool ok() const { return !error.has_value(); }
};

KeyringParse parse_keyring(std::string_view text);
bool valid_key_id(std::string_view id);

}  // namespace ddp::proto

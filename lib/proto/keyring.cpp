// Token file parsing; see keyring.hpp for the format.
#include "proto/keyring.hpp"

#include "common/strings.hpp"
#include "proto/crypto.hpp"

namespace ddp::proto {

const Key* Keyring::find(std::string_view id) const {
  // Key ids are not secret (they travel in the hello), so an ordinary comparison is fine.
  for (const auto& k : keys_) {
    if (k.id == id) return &k;
  }
  return nullptr;
}

std::string KeyringError::to_string() const {
  return line ? "line " + std::to_string(line) + ": " + message : message;
}

bool valid_key_id(std::string_view id) {
  if (id.empty() || id.size() > kMaxKeyIdChars) return false;
  for (char c : id) {
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

KeyringParse parse_keyring(std::string_view text) {
  KeyringParse r;
  auto fail = [&](std::size_t line, std::string msg) {
    r.error = KeyringError{line, std::move(msg)};
    r.keyring = Keyring{};
    return r;
  };
  std::vector<Key> keys;
  std::vector<std::pair<std::size_t, std::string_view>> lines;
  std::size_t n = 0;
  for (auto raw : split(text, '\n')) {
    ++n;
    auto line = trim(raw);
    if (line.empty() || line.front() == '#') continue;
    lines.emplace_back(n, line);
  }
  if (lines.empty()) return fail(0, "no keys: expected 'key_id: secret' lines or a single secret");
  auto check_secret = [&](std::size_t line, std::string_view secret) -> std::optional<KeyringError> {
    if (secret.size() >= 2 && (secret.front() == '"' || secret.front() == '\'') && secret.back() == secret.front()) {
      secret = secret.substr(1, secret.size() - 2);
    }
    if (secret.size() < kMinSecretChars) {
      return KeyringError{line, "secret is " + std::to_string(secret.size()) + " characters, at least " +
                                    std::to_string(kMinSecretChars) + " needed (try: openssl rand -hex 32)"};
    }
    if (secret.size() > kMaxSecretChars) {
      return KeyringError{line, "secret is longer than " + std::to_string(kMaxSecretChars) + " characters"};
    }
    for (char c : secret) {
      if (static_cast<unsigned char>(c) < 0x20) return KeyringError{line, "secret holds a control character"};
    }
    return std::nullopt;
  };
  auto unquote = [](std::string_view s) {
    if (s.size() >= 2 && (s.front() == '"' || s.front() == '\'') && s.back() == s.front())
      return s.substr(1, s.size() - 2);
    return s;
  };
  if (lines.size() == 1 && lines[0].second.find(':') == std::string_view::npos) {
    if (auto e = check_secret(lines[0].first, lines[0].second)) return fail(e->line, e->message);
    r.keyring = Keyring({Key{"default", std::string(unquote(lines[0].second))}});
    return r;
  }
  for (auto [line, content] : lines) {
    auto colon = content.find(':');
    if (colon == std::string_view::npos) return fail(line, "expected 'key_id: secret'");
    auto id = trim(content.substr(0, colon));
    auto secret = trim(content.substr(colon + 1));
    if (!valid_key_id(id)) {
      return fail(line, "key id '" + std::string(id.substr(0, 64)) + "' must be 1-64 of A-Z a-z 0-9 . _ -");
    }
    if (auto e = check_secret(line, secret)) return fail(e->line, e->message);
    for (const auto& k : keys) {
      if (k.id == id) return fail(line, "key id '" + std::string(id) + "' appears twice");
    }
    keys.push_back(Key{std::string(id), std::string(unquote(secret))});
  }
  r.keyring = Keyring(std::move(keys));
  return r;
}

}  // namespace ddp::proto

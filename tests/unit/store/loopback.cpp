#include "loopback.hpp"

#include "store/protocol.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>

namespace ddp::store::testing {

using Clk = std::chrono::steady_clock;

ServerThread::ServerThread(ServerOptions opts) {
  server_.emplace(io_, std::move(opts));
  server_->start();
  port_ = server_->port();
  thread_ = std::thread([this] { io_.run(); });
}

ServerThread::~ServerThread() {
  boost::asio::post(io_, [this] {
    server_->stop();
    io_.stop();
  });
  thread_.join();
  server_.reset();
}

RawClient::RawClient(uint16_t port) {
  fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd_ < 0) throw std::runtime_error("socket failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    throw std::runtime_error(std::string("connect failed: ") + std::strerror(errno));
  }
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

RawClient::~RawClient() {
  close();
}

void RawClient::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

uint16_t RawClient::local_port() const {
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  return ntohs(addr.sin_port);
}

void RawClient::send(const std::string& bytes) {
  std::size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(std::string("send failed: ") + std::strerror(errno));
    }
    off += static_cast<std::size_t>(n);
  }
}

std::string RawClient::recv(std::size_t n, std::chrono::milliseconds deadline) {
  std::string out;
  auto end = Clk::now() + deadline;
  while (out.size() < n) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clk::now()).count();
    if (left <= 0) break;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    char buf[65536];
    ssize_t got = ::recv(fd_, buf, std::min(sizeof buf, n - out.size()), 0);
    if (got <= 0) break;
    out.append(buf, static_cast<std::size_t>(got));
  }
  return out;
}

bool RawClient::quiet(std::chrono::milliseconds q) {
  pollfd p{fd_, POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(q.count())) == 0;
}

bool RawClient::closed_by_peer(std::chrono::milliseconds deadline) {
  auto end = Clk::now() + deadline;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clk::now()).count();
    if (left <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    char buf[65536];
    ssize_t got = ::recv(fd_, buf, sizeof buf, 0);
    if (got == 0) return true;
    if (got < 0) return errno == ECONNRESET;
  }
}

// ---------------------------------------------------------------------------------------------

namespace {

int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Tokens: hex runs (even length), "raw text", s"PyTorch string" (u64 length + text),
// u8:N u32:N u64:N i64:N (little-endian). '#' starts a comment outside quotes.
std::string parse_tokens(const std::string& text, int line) {
  std::string out;
  auto bad = [&](const std::string& why) {
    return std::runtime_error("fixture line " + std::to_string(line) + ": " + why);
  };
  std::size_t i = 0;
  while (i < text.size()) {
    char c = text[i];
    if (c == ' ' || c == '\t' || c == '\r') {
      ++i;
      continue;
    }
    if (c == '#') break;
    if (c == '"' || (c == 's' && i + 1 < text.size() && text[i + 1] == '"')) {
      bool prefixed = c == 's';
      i += prefixed ? 2 : 1;
      std::string s;
      while (i < text.size() && text[i] != '"') {
        if (text[i] == '\\' && i + 1 < text.size()) ++i;
        s += text[i++];
      }
      if (i >= text.size()) throw bad("unterminated string");
      ++i;
      if (prefixed) put_u64(out, s.size());
      out += s;
      continue;
    }
    std::size_t j = i;
    while (j < text.size() && text[j] != ' ' && text[j] != '\t' && text[j] != '\r') ++j;
    std::string tok = text.substr(i, j - i);
    i = j;
    auto colon = tok.find(':');
    if (colon != std::string::npos) {
      std::string type = tok.substr(0, colon);
      long long v = 0;
      try {
        v = std::stoll(tok.substr(colon + 1), nullptr, 0);
      } catch (...) {
        throw bad("bad number in `" + tok + "`");
      }
      if (type == "u8") {
        put_u8(out, static_cast<uint8_t>(v));
      } else if (type == "u32") {
        put_u32(out, static_cast<uint32_t>(v));
      } else if (type == "u64") {
        put_u64(out, static_cast<uint64_t>(v));
      } else if (type == "i64") {
        put_i64(out, v);
      } else {
        throw bad("unknown token type `" + type + "`");
      }
      continue;
    }
    if (tok.size() % 2 != 0) throw bad("odd number of hex digits in `" + tok + "`");
    for (std::size_t k = 0; k < tok.size(); k += 2) {
      int hi = hexval(tok[k]), lo = hexval(tok[k + 1]);
      if (hi < 0 || lo < 0) throw bad("not hex: `" + tok + "`");
      out += static_cast<char>(hi * 16 + lo);
    }
  }
  return out;
}

}  // namespace

std::vector<FixtureStep> parse_fixture(const std::string& text) {
  std::vector<FixtureStep> steps;
  std::istringstream in(text);
  std::string line;
  int no = 0;
  while (std::getline(in, line)) {
    ++no;
    std::size_t i = 0;
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    if (i == line.size() || line[i] == '#') continue;
    FixtureStep step;
    step.line = no;
    std::size_t digits = i;
    while (digits < line.size() && line[digits] >= '0' && line[digits] <= '9') ++digits;
    if (digits > i) step.conn = std::stoi(line.substr(i, digits - i));
    if (digits >= line.size() || (line[digits] != '>' && line[digits] != '<')) {
      throw std::runtime_error("fixture line " + std::to_string(no) + ": expected [N]> or [N]<");
    }
    bool send = line[digits] == '>';
    std::string rest = line.substr(digits + 1);
    std::string word;
    std::istringstream(rest) >> word;
    if (send && word == "close") {
      step.kind = FixtureStep::Kind::close;
    } else if (!send && word == "quiet") {
      step.kind = FixtureStep::Kind::expect_quiet;
    } else if (!send && word == "eof") {
      step.kind = FixtureStep::Kind::expect_eof;
    } else {
      step.kind = send ? FixtureStep::Kind::send : FixtureStep::Kind::expect;
      step.bytes = parse_tokens(rest, no);
    }
    steps.push_back(std::move(step));
  }
  return steps;
}

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    if (!out.empty()) out += ' ';
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

std::string replay_fixture(const std::vector<FixtureStep>& steps, uint16_t port) {
  std::map<int, std::unique_ptr<RawClient>> conns;
  auto conn = [&](int n) -> RawClient& {
    auto& c = conns[n];
    if (!c) c = std::make_unique<RawClient>(port);
    return *c;
  };
  for (const auto& s : steps) {
    std::string where = "line " + std::to_string(s.line) + " (connection " + std::to_string(s.conn) + "): ";
    switch (s.kind) {
      case FixtureStep::Kind::send:
        conn(s.conn).send(s.bytes);
        break;
      case FixtureStep::Kind::close:
        conn(s.conn).close();
        break;
      case FixtureStep::Kind::expect: {
        std::string got = conn(s.conn).recv(s.bytes.size());
        if (got != s.bytes) return where + "expected [" + hex(s.bytes) + "], got [" + hex(got) + "]";
        break;
      }
      case FixtureStep::Kind::expect_quiet:
        if (!conn(s.conn).quiet()) return where + "expected no reply yet, got [" + hex(conn(s.conn).recv(1)) + "...]";
        break;
      case FixtureStep::Kind::expect_eof:
        if (!conn(s.conn).closed_by_peer()) return where + "expected the server to close the connection";
        conn(s.conn).close();
        break;
    }
  }
  // Nothing unexpected left over on any connection.
  for (auto& [n, c] : conns) {
    if (c->fd() >= 0 && !c->quiet(std::chrono::milliseconds(20))) {
      return "connection " + std::to_string(n) + ": unexpected extra bytes [" +
             hex(c->recv(64, std::chrono::milliseconds(50))) + "]";
    }
  }
  return "";
}

}  // namespace ddp::store::testing

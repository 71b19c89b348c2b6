// SSH mode's node dialer (see dialer.hpp).
#include "ssh/dialer.hpp"

#include "common/log.hpp"
#include "ssh/libssh.hpp"
#include "ssh/policy.hpp"
#include "ssh/session.hpp"

#include <fmt/format.h>
#include <libssh/callbacks.h>
#include <openssl/evp.h>
#include <boost/asio/post.hpp>

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <random>

namespace ddp::ssh {

namespace asio = boost::asio;

namespace {

// poll()'s timeout until `deadline`, rounded up (0 once it has passed).
int ms_until(std::chrono::steady_clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return static_cast<int>(std::clamp<long long>(left.count(), 0, 24LL * 3600 * 1000));
}

bool write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

// Owns a descriptor until handed over.
struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  Fd& operator=(Fd&&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  int release() { return std::exchange(fd, -1); }
};

// The remote agent's stderr in our log, named after its node. Its info lines repeat what the
// coordinator already says (joined, round, done), so they show at debug level; its warnings and
// errors (and anything that is not a log line) show as they are.
void relay(const std::string& node, const std::string& line) {
  static const auto log = log::get("ssh");
  const auto r = relay_line(line);
  using L = RelayedLine::Level;
  const auto level = r.level == L::debug || r.level == L::info ? spdlog::level::debug
                     : r.level == L::warn                      ? spdlog::level::warn
                                                               : spdlog::level::err;
  log->log(level, "{}| {}", node, r.text);
}

// Takes every byte libssh decodes for a channel when it decodes it, whichever call reads the
// socket (ssh_channel_write does too): nothing waits in libssh's buffers, so a poll() on the
// socket is a complete wait. stdout goes to `out_fd` (none: dropped), stderr to our log. What
// arrived before the callbacks were set is read by drain().
class ChannelSink {
 public:
  ChannelSink(ssh_channel ch, int out_fd, std::string node) : ch_(ch), out_fd_(out_fd), node_(std::move(node)) {
    cb_.userdata = this;
    cb_.channel_data_function = &ChannelSink::on_data;
    ssh_callbacks_init(&cb_);
    libssh().ssh_set_channel_callbacks(ch_, &cb_);
  }
  ChannelSink(const ChannelSink&) = delete;
  ChannelSink& operator=(const ChannelSink&) = delete;
  ~ChannelSink() { detach(); }

  // What libssh buffered before the callbacks, then whatever the socket holds now (decoded into
  // the callbacks). False when the SSH session failed.
  bool drain() {
    for (int is_err = 0; is_err < 2; ++is_err) {
      int n = 0;
      while ((n = libssh().ssh_channel_read_nonblocking(ch_, buf_.data(), buf_.size(), is_err)) > 0) {
        take(buf_.data(), static_cast<std::size_t>(n), is_err != 0);
      }
      if (n == SSH_ERROR) return false;
    }
    return true;
  }
  bool out_failed() const { return out_failed_; }
  // Before the channel is closed: the callbacks go, the last partial stderr line is logged.
  void detach() {
    if (!ch_) return;
    libssh().ssh_remove_channel_callbacks(ch_, &cb_);
    ch_ = nullptr;
    if (auto l = err_lines_.flush()) relay(node_, *l);
  }

 private:
  static int on_data(ssh_session, ssh_channel, void* data, uint32_t len, int is_stderr, void* self) {
    static_cast<ChannelSink*>(self)->take(static_cast<const char*>(data), len, is_stderr != 0);
    return static_cast<int>(len);  // all of it taken
  }
  void take(const char* p, std::size_t n, bool is_err) {
    if (is_err) {
      for (auto& l : err_lines_.feed(std::string_view(p, n))) relay(node_, l);
    } else if (out_fd_ >= 0 && !out_failed_ && !write_all(out_fd_, p, n)) {
      out_failed_ = true;
    }
  }

  ssh_channel ch_;
  int out_fd_;
  std::string node_;
  bool out_failed_ = false;
  LineSplitter err_lines_;
  ssh_channel_callbacks_struct cb_{};
  std::array<char, 32 * 1024> buf_{};
};

}  // namespace

std::string sha256_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("cannot read {}", path));
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
  std::array<char, 64 * 1024> buf{};
  while (in) {
    in.read(buf.data(), buf.size());
    if (in.gcount() > 0) EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<std::size_t>(in.gcount()));
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &len);
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) hex += fmt::format("{:02x}", md[i]);
  return hex;
}

Dialer::Dialer(asio::io_context& io, DialerOptions options)
    : io_(io), opts_(std::move(options)), slots_(std::clamp(opts_.max_parallel, 1, 1024)) {
  our_sha256_ = sha256_file(opts_.agent_binary);
  utsname u{};
  ::uname(&u);
  our_arch_ = u.machine;
  // libssh is loaded here, in the caller's context: a node's thread that found it missing could
  // only end the process.
  libssh();
  if (opts_.connect_back) listener_ = std::make_unique<net::CallbackListener>(io_, opts_.connect_back->port);
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);  // last: nothing after it throws
  if (wake_fd_ < 0) throw std::runtime_error(fmt::format("eventfd: {}", std::strerror(errno)));
}

Dialer::~Dialer() {
  cancel_ = true;
  cv_.notify_all();
  const std::uint64_t one = 1;  // never read: stays readable for every pump's poll()
  [[maybe_unused]] auto w = ::write(wake_fd_, &one, sizeof one);
  for (auto& t : threads_) t.join();
  ::close(wake_fd_);
}

std::string Dialer::describe(const net::NodeEntry& node) const {
  return node.port ? fmt::format("{} (ssh {}:{})", node.name, node.host, node.port)
                   : fmt::format("{} (ssh)", node.name);
}

void Dialer::dial(const net::NodeEntry& node, std::function<void(net::Dialed)> done) {
  threads_.emplace_back([this, node, done = std::move(done)] { run_node(node, done); });
}

bool Dialer::wait_or_cancel(Millis delay) {
  std::unique_lock lock(mu_);
  return !cv_.wait_for(lock, delay, [this] { return cancel_.load(); });
}

void Dialer::run_node(const net::NodeEntry& node, const std::function<void(net::Dialed)>& done) {
  auto log = log::get("ssh");
  auto fail = [&](const std::string& why) {
    asio::post(io_, [done, why] { done(net::Dialed{why, std::nullopt, ""}); });
  };
  SessionOptions so{node.name, node.host, node.port, node.user, opts_.timeout, opts_.accept_new};
  std::unique_ptr<Session> s;
  std::mt19937 rng(std::random_device{}());
  for (int attempt = 1;; ++attempt) {
    if (cancel_) return;
    s = std::make_unique<Session>();
    slots_.acquire();
    std::string err = s->connect(so);
    ConnectFailure kind = ConnectFailure::other;
    if (!err.empty()) {
      kind = classify_connect_error(err);
    } else {
      std::string added;
      if (auto hk = s->verify_host_key(so, &added); !hk.empty()) {
        slots_.release();
        return fail(hk);
      }
      if (!added.empty()) log->warn("{}", added);
      err = s->authenticate();
      if (!err.empty()) {
        kind = classify_connect_error(err);
        if (kind != ConnectFailure::dropped) kind = ConnectFailure::auth;
      }
    }
    slots_.release();
    if (err.empty()) break;
    auto wait = retry_after(kind, attempt, std::uniform_real_distribution<double>(0, 1)(rng));
    if (!wait) {
      const auto what = kind == ConnectFailure::timeout
                            ? fmt::format("no SSH answer within {} ms", opts_.timeout.count())
                            : std::string("cannot log in");
      return fail(fmt::format("{}: {}: {}{}{}", describe(node), what, err,
                              attempt > 1 ? fmt::format(" (after {} attempts)", attempt) : "",
                              connect_hint(kind, node.host, node.port, node.user)));
    }
    log->warn(
        "{}: connection dropped before login ({}); retrying in {} ms (attempt {}; sshd's MaxStartups limits "
        "concurrent logins)",
        describe(node), err, wait->count(), attempt + 1);
    if (!wait_or_cancel(*wait)) return;
  }

  ssh_channel ch = nullptr;
  std::string address, tag, back;
  try {
    auto probe = parse_probe(s->exec(probe_command(our_sha256_)).out);
    auto choice = choose_agent(probe, opts_.agent_version, our_arch_, our_sha256_);
    if (choice.kind == AgentChoice::Kind::impossible) return fail(fmt::format("{}: {}", describe(node), choice.reason));
    if (choice.kind == AgentChoice::Kind::upload) {
      log->info("{}: {}", node.name, choice.reason);
      if (s->upload(opts_.agent_binary, cache_dir(our_sha256_), "ddp-agentd", our_sha256_) == Session::UploadVia::exec)
        log->info("{}: its sshd has no SFTP subsystem; sent the agent through a plain exec channel", node.name);
      const auto check = parse_probe(s->exec(probe_command(our_sha256_)).out);
      if (check.cached_sha256 != our_sha256_) {
        return fail(fmt::format("{}: the uploaded agent's hash is '{}', expected {}", describe(node),
                                check.cached_sha256, our_sha256_));
      }
      if (check.cached_runs != opts_.agent_version) {
        return fail(fmt::format(
            "{}: our uploaded agent does not run there: {} (install {} on the node, or the "
            "libraries it names)",
            describe(node), check.cached_runs.empty() ? "no output" : check.cached_runs, opts_.agent_version));
      }
    } else {
      log->debug("{}: {}", node.name, choice.reason);
    }
    address = !probe.server_address.empty() ? probe.server_address : s->peer_address();
    if (address.empty())
      return fail(fmt::format("{}: cannot tell the node's address ($SSH_CONNECTION is empty)", describe(node)));
    if (listener_) {
      try {
        back = net::advertised_endpoint(*opts_.connect_back, net::route_source(address), address, listener_->port());
      } catch (const std::invalid_argument& e) {
        return fail(fmt::format("{}: {}", describe(node), e.what()));
      }
      std::array<unsigned char, 16> raw{};
      std::random_device rd;
      for (auto& b : raw) b = static_cast<unsigned char>(rd());
      for (auto b : raw) tag += fmt::format("{:02x}", b);
    }
    const auto command = agent_command(choice.command, node.name, opts_.verbose_agent, back);
    log->debug("{}: {}", node.name, command);
    ch = s->start(command);
    // The secret, then (connect-back) the tag the agent introduces itself with: stdin only.
    const auto line = opts_.secret + "\n" + (tag.empty() ? "" : tag + "\n");
    if (libssh().ssh_channel_write(ch, line.data(), static_cast<uint32_t>(line.size())) !=
        static_cast<int>(line.size())) {
      throw std::runtime_error(s->error());
    }
  } catch (const std::exception& e) {
    Session::close_channel(ch);
    return fail(fmt::format("{}: cannot start the agent: {}", describe(node), e.what()));
  }

  if (listener_) {
    // Connect-back: the coordinator gets the agent's own TCP connection through the listener;
    // this thread relays the agent's stderr meanwhile, and keeps the channel open after (its EOF
    // is how the agent learns that we are gone).
    auto delivered = std::make_shared<std::atomic<bool>>(false);
    listener_->expect(tag, [this, done, delivered, name = node.name, address](asio::ip::tcp::socket sock) {
      delivered->store(true);
      boost::system::error_code ec;
      sock.set_option(asio::ip::tcp::no_delay(true), ec);
      const auto remote = sock.remote_endpoint(ec);
      auto from = remote.address();
      if (from.is_v6() && from.to_v6().is_v4_mapped())
        from = asio::ip::make_address_v4(asio::ip::v4_mapped, from.to_v6());
      log::get("ssh")->debug("{}: its agent connected back from {}", name, ec ? "?" : from.to_string());
      net::stream_socket ss(io_);
      ss.assign(asio::generic::stream_protocol(remote.address().is_v6() ? AF_INET6 : AF_INET, IPPROTO_TCP),
                sock.release(), ec);
      done(net::Dialed{"", std::move(ss), address});
    });
    // The agent dials with a 10 s deadline of its own; past this, something between drops it.
    const auto deadline = std::chrono::steady_clock::now() + std::max<Millis>(opts_.timeout, std::chrono::seconds(12));
    ChannelSink sink(ch, -1, node.name);
    std::string why;
    bool first = true;  // libssh may hold the agent's first bytes already: read before any wait
    while (!cancel_) {
      pollfd p[2] = {{libssh().ssh_get_fd(s->raw()), POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      ::poll(p, 2, first ? 0 : delivered->load() ? -1 : ms_until(deadline));
      first = false;
      if (!sink.drain()) why = "SSH connection lost: " + s->error();
      if (why.empty() && (libssh().ssh_channel_is_eof(ch) || libssh().ssh_channel_is_closed(ch)))
        why = "the agent ended";
      if (!why.empty()) break;
      if (!delivered->load() && std::chrono::steady_clock::now() > deadline && listener_->forget(tag)) {
        sink.detach();
        Session::close_channel(ch);
        return fail(fmt::format(
            "{}: its agent did not connect back to {} within {} s (does a firewall on this side drop "
            "it? --advertise-addr must be an address the node can reach)",
            describe(node), back,
            std::chrono::duration_cast<std::chrono::seconds>(std::max<Millis>(opts_.timeout, std::chrono::seconds(12)))
                .count()));
      }
    }
    sink.detach();
    Session::close_channel(ch);
    if (!why.empty() && listener_->forget(tag)) {
      return fail(fmt::format("{}: {} before connecting back to {}", describe(node), why, back));
    }
    listener_->forget(tag);
    log->debug("{}: link closed: {}", node.name, why.empty() ? "the launcher is stopping" : why);
    return;
  }

  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    Session::close_channel(ch);
    return fail(fmt::format("{}: socketpair: {}", node.name, std::strerror(errno)));
  }
  Fd mine(fds[0]);
  auto theirs = std::make_shared<Fd>(fds[1]);
  asio::post(io_, [this, done, theirs, address] {
    net::stream_socket sock(io_);
    boost::system::error_code ec;
    sock.assign(asio::generic::stream_protocol(AF_UNIX, 0), theirs->release(), ec);
    done(net::Dialed{"", std::move(sock), address});
  });

  // The pump: our socketpair end <-> the agent's stdin/stdout; its stderr -> our log.
  ChannelSink sink(ch, mine.fd, node.name);
  std::array<char, 32 * 1024> buf{};
  std::string why = "the launcher is stopping";
  bool first = true;  // libssh may hold the agent's first bytes already: read before any wait
  while (!cancel_) {
    pollfd p[3] = {{libssh().ssh_get_fd(s->raw()), POLLIN, 0}, {mine.fd, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    ::poll(p, 3, first ? 0 : -1);
    first = false;
    if (p[1].revents) {
      const ssize_t n = ::read(mine.fd, buf.data(), buf.size());
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
        why = "the coordinator closed the link";
        break;
      }
      if (n > 0 && libssh().ssh_channel_write(ch, buf.data(), static_cast<uint32_t>(n)) != n) {
        why = "SSH connection lost: " + s->error();
        break;
      }
    }
    if (!sink.drain()) {
      why = "SSH connection lost: " + s->error();
      break;
    }
    if (sink.out_failed()) {
      why = "the coordinator closed the link";
      break;
    }
    if (libssh().ssh_channel_is_eof(ch) || libssh().ssh_channel_is_closed(ch)) {
      why = "the agent ended";
      break;
    }
  }
  sink.detach();
  log->debug("{}: link closed: {}", node.name, why);
  ::shutdown(mine.fd, SHUT_RDWR);
  Session::close_channel(ch);
}

}  // namespace ddp::ssh

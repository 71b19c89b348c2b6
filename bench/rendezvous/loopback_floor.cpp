// loopback_floor: what the kernel's loopback TCP alone costs the rendezvous benchmark's traffic
// pattern on this machine, with no protocol work at all (no JSON, no HMAC, no Asio): the floor
// under bench/rendezvous/run.py's numbers.
//
//   loopback_floor --count N [--mode rendezvous|heartbeat] [--seconds S] [--bytes B] [--reply]
//                  [--interval-ms MS]
//
// Two processes, one epoll loop each, as ddpctl and fake_agents are: "coordinator" and "agents".
//
// rendezvous: the coordinator connects N sockets to the agents' listener at once and, on each,
// the frames of a version 6 rendezvous go back and forth in their order and about their sizes
// (coordinator hello 200 B; agent hello + challenge 300 B; coordinator auth + job offer 1500 B;
// agent auth + join 600 B; coordinator assign with start 400 B), each sent only when the one
// before it arrived, as the protocol does. Reported: the wall time from the first connect to the
// last assign read by the agents, each process's CPU (user and system), and TCP segments per
// node (/proc/net/snmp). The connections stay open (the real ones do, until the job ends).
//
// heartbeat: N connections established first (not measured), then for --seconds each side sends
// each peer B bytes (default 120, a sealed heartbeat's size) once every --interval-ms (default
// 1000; protocol version 7 agents beat every 2000 at the default heartbeat_timeout), spread evenly
// over the interval, and reads whatever arrives. Reported: each process's CPU as a share of one
// core.
//
// --reply: the coordinator does not beat on its own but answers each agent's beat at once (its
// reply carries the ACK of the agent's beat: fewer segments).
//
// Prints one line of `key value` pairs. Everything stays on 127.0.0.1.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using Clk = std::chrono::steady_clock;

[[noreturn]] void die(const std::string& what) {
  throw std::runtime_error(what + ": " + std::strerror(errno));
}

long tcp_out_segs() {
  std::ifstream f("/proc/net/snmp");
  std::string names, values;
  while (std::getline(f, names) && std::getline(f, values)) {
    if (names.rfind("Tcp:", 0) != 0) continue;
    std::istringstream n(names), v(values);
    std::string key, val;
    while (n >> key && v >> val) {
      if (key == "OutSegs") return std::stol(val);
    }
  }
  return -1;
}

struct Cpu {
  double user = 0, sys = 0;
};
Cpu cpu_now() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return {ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6, ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6};
}

// The rendezvous' frames in order: even indexes from the coordinator, odd from the agent.
const std::vector<std::size_t> kFrames{200, 300, 1500, 600, 400};

struct Peer {
  int fd = -1;
  std::size_t step = 0;  // index into kFrames of the frame this side waits for
  std::size_t have = 0;
};

void send_all(int fd, const char* data, std::size_t n) {
  while (n > 0) {
    ssize_t k = ::send(fd, data, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) die("send");  // a few hundred bytes into a fresh socket buffer: never EAGAIN here
    data += k;
    n -= static_cast<std::size_t>(k);
  }
}

void nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// One side of the rendezvous: reads frames on every socket; whenever the frame it waits for is
// complete, sends its next one. Returns when every peer has read its last frame (the agents) or sent it (the
// coordinator).
void serve_rendezvous(int ep, std::vector<Peer>& peers, const std::string& payload) {
  std::size_t done = 0;
  std::vector<epoll_event> evs(512);
  std::vector<char> buf(4096);
  while (done < peers.size()) {
    int n = ::epoll_wait(ep, evs.data(), static_cast<int>(evs.size()), 10000);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error("rendezvous stalled for 10 s");
    for (int e = 0; e < n; ++e) {
      Peer& p = peers[evs[e].data.u32];
      for (;;) {
        ssize_t got = ::recv(p.fd, buf.data(), buf.size(), 0);
        if (got < 0 && (errno == EAGAIN || errno == EINTR)) break;
        if (got <= 0) throw std::runtime_error("peer closed");
        if (p.step >= kFrames.size()) break;
        std::size_t left = static_cast<std::size_t>(got);
        while (left > 0) {
          const std::size_t want = kFrames[p.step] - p.have, take = std::min(want, left);
          p.have += take;
          left -= take;
          if (p.have < kFrames[p.step]) continue;
          p.have = 0;
          ++p.step;  // the next frame is ours to send
          if (p.step >= kFrames.size()) {
            ++done;  // the agents read the last frame
            ::epoll_ctl(ep, EPOLL_CTL_DEL, p.fd, nullptr);
            break;
          }
          send_all(p.fd, payload.data(), kFrames[p.step]);
          ++p.step;
          if (p.step >= kFrames.size()) ++done;  // the coordinator sent the last frame
        }
      }
    }
  }
}

struct Result {
  double user_s = 0, sys_s = 0;
  double t_start = 0, t_end = 0;  // steady clock, seconds (one clock for both processes)
  int ok = 0;                     // the side measured; its figures mean nothing otherwise
};

double steady_s() {
  return std::chrono::duration<double>(Clk::now().time_since_epoch()).count();
}

// Heartbeats: every peer gets `bytes` once every `interval` seconds, peer i at its share i/N of it;
// whatever arrives is read. For `seconds`; the CPU of exactly that loop is returned.
// `reply`: this side does not beat on its own; it answers each beat it reads at once (the
// coordinator's beats as replies to the agents').
Result heartbeat_loop(int ep, std::vector<Peer>& peers, double seconds, double interval, int bytes,
                      const std::string& payload, bool reply = false) {
  const auto c0 = cpu_now();
  const double t0 = steady_s();
  const double n = static_cast<double>(peers.size());
  std::size_t next = 0;  // the next peer to beat
  double round = t0;     // the start of the current interval
  std::vector<epoll_event> evs(512);
  std::vector<char> buf(65536);
  for (;;) {
    const double now = steady_s();
    if (now - t0 >= seconds) break;
    while (!reply && now >= round + interval * static_cast<double>(next) / n) {
      send_all(peers[next].fd, payload.data(), static_cast<std::size_t>(bytes));
      if (++next == peers.size()) {
        next = 0;
        round += interval;
      }
    }
    // At least 1 ms: the beats due within it go out together (4 at 4096 nodes and 1 s), no busy
    // wait.
    const double due = round + interval * static_cast<double>(next) / n;
    const int wait_ms = reply ? static_cast<int>((t0 + seconds - now) * 1000) + 1
                              : std::max(1, static_cast<int>((std::min(due, t0 + seconds) - steady_s()) * 1000) + 1);
    int k = ::epoll_wait(ep, evs.data(), static_cast<int>(evs.size()), wait_ms);
    for (int e = 0; e < k; ++e) {
      Peer& p = peers[evs[e].data.u32];
      for (;;) {
        ssize_t got = ::recv(p.fd, buf.data(), buf.size(), 0);
        if (got < 0 && (errno == EAGAIN || errno == EINTR)) break;
        if (got <= 0) throw std::runtime_error("peer closed");
        if (!reply) continue;
        p.have += static_cast<std::size_t>(got);
        for (; p.have >= static_cast<std::size_t>(bytes); p.have -= static_cast<std::size_t>(bytes))
          send_all(p.fd, payload.data(), static_cast<std::size_t>(bytes));
      }
    }
  }
  const auto c1 = cpu_now();
  return Result{c1.user - c0.user, c1.sys - c0.sys, t0, steady_s()};
}

// In a forked child: runs `f`, writes its Result into the pipe, then holds its sockets open
// until `quit` reads end of file (the parent has both results), so neither side sees the other
// close while it still measures. A side that failed says so (ok 0) and exits at once: its
// sockets close, so the other side fails too instead of waiting for it.
template <class F>
pid_t child(int wfd, const int (&quit)[2], F f) {
  pid_t pid = ::fork();
  if (pid < 0) die("fork");
  if (pid > 0) return pid;
  ::close(quit[1]);
  Result r;
  try {
    r = f();
    r.ok = 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loopback_floor: %s\n", e.what());
  }
  const bool sent = ::write(wfd, &r, sizeof r) == sizeof r;
  if (!r.ok || !sent) ::_exit(1);
  char b;
  while (::read(quit[0], &b, 1) > 0) {
  }
  ::_exit(0);
}

int listener(uint16_t& port, int backlog) {
  int l = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) die("bind");
  if (::listen(l, backlog) != 0) die("listen");
  socklen_t len = sizeof a;
  ::getsockname(l, reinterpret_cast<sockaddr*>(&a), &len);
  port = ntohs(a.sin_port);
  return l;
}

int connect_to(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) die("socket");
  nodelay(fd);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS) die("connect");
  return fd;
}

}  // namespace

int main(int argc, char** argv) try {
  int count = 4096, bytes = 120;
  bool reply = false;
  double seconds = 5, interval = 1;
  std::string mode = "rendezvous";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return std::string(argv[++i]);
    };
    if (a == "--count")
      count = std::stoi(next());
    else if (a == "--mode")
      mode = next();
    else if (a == "--seconds")
      seconds = std::stod(next());
    else if (a == "--interval-ms")
      interval = std::stod(next()) / 1000;
    else if (a == "--reply")
      reply = true;
    else if (a == "--bytes")
      bytes = std::stoi(next());
    else
      throw std::runtime_error("unknown argument " + a + " (see the comment at the top of loopback_floor.cpp)");
  }
  if (mode != "rendezvous" && mode != "heartbeat") throw std::runtime_error("--mode rendezvous or heartbeat");
  if (!(interval > 0 && interval <= 3600))
    throw std::runtime_error("--interval-ms must be above 0 and at most 3600000");
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < static_cast<rlim_t>(count) * 2 + 64) throw std::runtime_error("too few descriptors for --count");

  uint16_t port = 0;
  const int l = listener(port, std::max(count, 128));
  const std::string payload(2048, 'x');
  int cp[2], ap[2], go[2], up[2], quit[2];
  if (::pipe(cp) || ::pipe(ap) || ::pipe(go) || ::pipe(up) || ::pipe(quit)) die("pipe");

  // The agents: accept N, then serve (the rendezvous' odd frames, or heartbeats).
  // Each side keeps only its own ends of the heartbeat mode's two handshake pipes (up: the
  // agents hold every connection; go: start), so a side that dies is seen as end of file.
  const pid_t agents = child(ap[1], quit, [&] {
    ::close(up[0]);
    ::close(go[1]);
    std::vector<Peer> peers(count);
    int ep = ::epoll_create1(EPOLL_CLOEXEC);
    auto accept_all = [&] {
      for (int i = 0; i < count; ++i) {
        int fd = ::accept4(l, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) die("accept");
        nodelay(fd);
        peers[i].fd = fd;
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u32 = static_cast<uint32_t>(i);
        ::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
      }
    };
    if (mode == "rendezvous") {
      // The agents' first frame to read is the coordinator's hello (index 0): they start there.
      const auto c0 = cpu_now();
      accept_all();
      serve_rendezvous(ep, peers, payload);
      const auto c1 = cpu_now();
      return Result{c1.user - c0.user, c1.sys - c0.sys, 0, steady_s()};
    }
    accept_all();
    char b = 0;
    if (::write(up[1], &b, 1) != 1) die("write");
    if (::read(go[0], &b, 1) != 1) die("read");
    return heartbeat_loop(ep, peers, seconds, interval, bytes, payload);
  });

  (void)agents;
  pid_t coord = child(cp[1], quit, [&] {
    ::close(up[1]);
    ::close(go[0]);
    std::vector<Peer> peers(count);
    int ep = ::epoll_create1(EPOLL_CLOEXEC);
    if (mode == "rendezvous") {
      const auto c0 = cpu_now();
      const auto t0 = Clk::now();
      for (int i = 0; i < count; ++i) {
        peers[i].fd = connect_to(port);  // loopback: established within connect() once accepted
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u32 = static_cast<uint32_t>(i);
        ::epoll_ctl(ep, EPOLL_CTL_ADD, peers[i].fd, &ev);
        send_all(peers[i].fd, payload.data(), kFrames[0]);  // hello right away, as a client does
        peers[i].step = 1;
      }
      serve_rendezvous(ep, peers, payload);
      const auto c1 = cpu_now();
      return Result{c1.user - c0.user, c1.sys - c0.sys, std::chrono::duration<double>(t0.time_since_epoch()).count(),
                    steady_s()};
    }
    // Heartbeats: connect all, wait until the agents hold them all, then both beat.
    for (int i = 0; i < count; ++i) {
      peers[i].fd = connect_to(port);
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u32 = static_cast<uint32_t>(i);
      ::epoll_ctl(ep, EPOLL_CTL_ADD, peers[i].fd, &ev);
    }
    char b = 0;
    if (::read(up[0], &b, 1) != 1) die("read");
    if (::write(go[1], &b, 1) != 1) die("write");
    return heartbeat_loop(ep, peers, seconds, interval, bytes, payload, reply);
  });
  (void)coord;
  for (int fd : {up[0], up[1], go[0], go[1]}) ::close(fd);
  const long segs0 = tcp_out_segs();
  Result rc{}, ra{};
  if (::read(cp[0], &rc, sizeof rc) != sizeof rc) throw std::runtime_error("the coordinator failed");
  // The agents' wall: they end when the last assign is read; the coordinator's when it was sent.
  if (::read(ap[0], &ra, sizeof ra) != sizeof ra) throw std::runtime_error("the agents failed");
  if (!rc.ok) throw std::runtime_error("the coordinator side failed (above)");
  if (!ra.ok) throw std::runtime_error("the agents' side failed (above)");
  const long segs = tcp_out_segs() - segs0;
  ::close(quit[1]);
  ::close(quit[0]);
  int st = 0;
  while (::wait(&st) > 0) {
  }
  if (mode == "rendezvous") {
    std::printf(
        "mode rendezvous count %d wall_ms %.1f coordinator_user_ms %.1f coordinator_sys_ms %.1f agents_user_ms %.1f "
        "agents_sys_ms %.1f segments_per_node %.1f cpu_us_per_node %.1f\n",
        count, (ra.t_end - rc.t_start) * 1e3, rc.user_s * 1e3, rc.sys_s * 1e3, ra.user_s * 1e3, ra.sys_s * 1e3,
        static_cast<double>(segs) / count, (rc.user_s + rc.sys_s + ra.user_s + ra.sys_s) * 1e6 / count);
  } else {
    const double wc = rc.t_end - rc.t_start, wa = ra.t_end - ra.t_start;
    std::printf(
        "mode heartbeat count %d bytes %d interval_ms %.0f seconds %.1f coordinator_core_pct %.2f (user %.2f sys %.2f) "
        "agents_core_pct "
        "%.2f segments_per_node_second %.2f cpu_us_per_beat_coordinator %.2f\n",
        count, bytes, interval * 1000, wc, (rc.user_s + rc.sys_s) / wc * 100, rc.user_s / wc * 100, rc.sys_s / wc * 100,
        (ra.user_s + ra.sys_s) / wa * 100, static_cast<double>(segs) / count / wc,
        (rc.user_s + rc.sys_s) * 1e6 / (count * wc / interval));
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "loopback_floor: %s\n", e.what());
  return 2;
}

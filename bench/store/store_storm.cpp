// store_storm: a connection storm against c10d TCPStore servers, as a job's start makes one.
//
//   store_storm --target ours=127.0.0.1:29500:PID --target torch=127.0.0.1:29501:PID
//               --clients 4096 [--protocol 1|2] [--conns K] [--repeats 3] [--threads 2] [--timeout 60]
//
// N clients connect at once (non-blocking connects issued back to back from --threads threads
// after a common start), each opening K connections: PyTorch 1.13's TCPStore client opens two
// (the store connection and its callback connection, which stays silent until a watch), a 2.x
// client one (K defaults to that: 2 for --protocol 1, 1 for --protocol 2). On its store
// connection each client then does what init does: (2.x) VALIDATE and PING, then ADD 1 to a
// shared barrier counter; the client whose ADD returns N SETs the release key; every client
// WAITs on the release key. The run ends when the last WAIT is answered.
//
// Reported per run: the time until every connection was established, until every client was
// released (from the common start), the per-client release time p50/p99, connections refused or
// reset (never retried: a PyTorch client would retry, so any is a failure of the run), and the
// server's CPU time over the run (/proc/PID/stat), and the kernel's counters of the run
// (/proc/net/netstat, machine-wide, so each run is alone on the machine's loopback): SYNs the
// listener dropped because its accept queue was full (ListenOverflows: the server did not
// accept fast enough; each such client waits for its SYN's retransmission, 1 s later) and SYNs
// retransmitted (TCPSynRetrans). Targets are measured in turn, --repeats times,
// alternating; the summary is the median. Clients close with SO_LINGER 0 (a reset, no TIME_WAIT)
// so repeated storms do not run out of ephemeral ports.
#include "store/protocol.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace ddp::store;
using Clk = std::chrono::steady_clock;

namespace {

struct Target {
  std::string name, host;
  uint16_t port = 0;
  pid_t pid = 0;
};

long cpu_ticks(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto close = s.rfind(')');
  if (close == std::string::npos) throw std::runtime_error("cannot read /proc/" + std::to_string(pid) + "/stat");
  std::istringstream in(s.substr(close + 2));
  std::string field;
  long utime = 0, stime = 0;
  for (int i = 3; i <= 15; ++i) {
    in >> field;
    if (i == 14) utime = std::stol(field);
    if (i == 15) stime = std::stol(field);
  }
  return utime + stime;
}

// TcpExt counters from /proc/net/netstat (a header line of names, then a line of values).
long netstat_counter(const char* name) {
  std::ifstream f("/proc/net/netstat");
  std::string names, values;
  while (std::getline(f, names) && std::getline(f, values)) {
    if (names.rfind("TcpExt:", 0) != 0) continue;
    std::istringstream n(names), v(values);
    std::string key, val;
    while (n >> key && v >> val) {
      if (key == name) return std::stol(val);
    }
  }
  return -1;
}

long status_kib(pid_t pid, const char* key) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key, 0) == 0) return std::stol(line.substr(std::strlen(key)));
  }
  return -1;
}

Target parse_target(const std::string& s) {  // NAME=HOST:PORT:PID
  Target t;
  auto eq = s.find('=');
  auto c2 = s.rfind(':');
  auto c1 = c2 == std::string::npos || c2 == 0 ? std::string::npos : s.rfind(':', c2 - 1);
  if (eq == std::string::npos || c1 == std::string::npos || c1 < eq)
    throw std::runtime_error("--target NAME=HOST:PORT:PID, got " + s);
  t.name = s.substr(0, eq);
  t.host = s.substr(eq + 1, c1 - eq - 1);
  t.port = static_cast<uint16_t>(std::stoi(s.substr(c1 + 1, c2 - c1 - 1)));
  t.pid = std::stoi(s.substr(c2 + 1));
  return t;
}

// Where one client is: connecting, then awaiting the reply to PING (2.x), ADD, WAIT.
enum class Stage : uint8_t { connecting, ping, add, wait, released, failed };

struct Client {
  std::vector<int> fds;  // fds[0] is the store connection
  std::vector<char> up;  // up[k]: fds[k] is established
  int pending = 0;       // connections not yet established
  Stage stage = Stage::connecting;
  std::size_t need = 0, have = 0;
  uint8_t buf[8]{};
  double released_ms = 0;
};

struct RunResult {
  double connected_ms = 0, released_ms = 0, p50_ms = 0, p99_ms = 0, cpu_ms = 0;
  double overflows = 0, syn_retrans = 0;  // the kernel's, over the run
  int failed = 0;
  std::string first_error;
};

void send_all(int fd, const std::string& b) {
  std::size_t off = 0;
  while (off < b.size()) {  // a few dozen bytes into an empty socket buffer: never blocks long
    ssize_t n = ::send(fd, b.data() + off, b.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EAGAIN) continue;
    if (n <= 0) throw std::runtime_error(std::string("send: ") + std::strerror(errno));
    off += static_cast<std::size_t>(n);
  }
}

RunResult storm(const Target& t, int clients, int conns, Protocol proto, int nthreads, double timeout_s,
                const std::string& prefix) {
  nthreads = std::max(1, std::min(nthreads, clients));
  const std::string count_key = prefix + "count", done_key = prefix + "done";
  Request r;
  r.op = Op::add;
  r.key = count_key;
  r.number = 1;
  const std::string add_b = encode_request(proto, r);
  r = {};
  r.op = Op::set;
  r.key = done_key;
  r.value = "1";
  const std::string set_b = encode_request(proto, r);
  r = {};
  r.op = Op::wait;
  r.keys = {done_key};
  const std::string wait_b = encode_request(proto, r);
  std::string hello;  // 2.x: VALIDATE (no reply) then PING with a nonce (echoed)
  if (proto == Protocol::v2) {
    r = {};
    r.op = Op::validate;
    r.word = kValidateMagic;
    hello = encode_request(proto, r);
    r = {};
    r.op = Op::ping;
    r.word = static_cast<uint32_t>(::getpid());
    hello += encode_request(proto, r);
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(t.port);
  if (::inet_pton(AF_INET, t.host.c_str(), &addr.sin_addr) != 1) throw std::runtime_error("bad host " + t.host);

  std::vector<std::vector<Client>> mine(nthreads);
  std::vector<double> connected_ms(nthreads, 0);
  std::vector<int> failed(nthreads, 0);
  std::vector<std::string> errors(nthreads);
  std::barrier start(nthreads + 1);
  Clk::time_point t0;  // written before the start barrier, read after it
  std::vector<std::thread> threads;
  const auto ms_since = [&](Clk::time_point now) {
    return std::chrono::duration<double, std::milli>(now - t0).count();
  };
  for (int ti = 0; ti < nthreads; ++ti) {
    threads.emplace_back([&, ti] {
      auto& cs = mine[ti];
      int ep = ::epoll_create1(0);
      for (int i = ti; i < clients; i += nthreads) cs.emplace_back();
      auto fail = [&](Client& c, const std::string& why) {
        if (c.stage == Stage::failed || c.stage == Stage::released) return;
        c.stage = Stage::failed;
        if (failed[ti]++ == 0) errors[ti] = why;
      };
      start.arrive_and_wait();
      for (std::size_t i = 0; i < cs.size(); ++i) {
        for (int k = 0; k < conns; ++k) {
          int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
          if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
          int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          cs[i].fds.push_back(fd);
          cs[i].up.push_back(0);
          int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
          if (rc != 0 && errno != EINPROGRESS) {
            fail(cs[i], std::string("connect: ") + std::strerror(errno));
            continue;
          }
          ++cs[i].pending;
          epoll_event ev{};
          ev.events = EPOLLOUT | EPOLLIN;
          ev.data.u64 = (uint64_t(i) << 8) | uint64_t(k);
          ::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
        }
      }
      std::size_t open = 0;
      for (auto& c : cs) open += c.stage == Stage::failed ? 0 : 1;
      int connecting = 0;
      for (auto& c : cs) connecting += c.stage == Stage::failed ? 0 : 1;
      std::vector<epoll_event> evs(256);
      const auto deadline = t0 + std::chrono::duration<double>(timeout_s);
      while (open > 0) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clk::now()).count();
        if (left <= 0) {
          for (auto& c : cs) fail(c, "no answer within --timeout");
          break;
        }
        int n = ::epoll_wait(ep, evs.data(), static_cast<int>(evs.size()), static_cast<int>(left));
        for (int e = 0; e < n; ++e) {
          Client& c = cs[evs[e].data.u64 >> 8];
          const int k = static_cast<int>(evs[e].data.u64 & 0xff);
          const int fd = c.fds[k];
          if (c.stage == Stage::failed || c.stage == Stage::released) {
            ::epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
            continue;
          }
          try {
            if (!c.up[k]) {
              int err = 0;
              socklen_t len = sizeof err;
              ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
              if (err != 0) throw std::runtime_error(std::string("connect: ") + std::strerror(err));
              epoll_event ev{};
              ev.events = EPOLLIN;  // established; now only replies matter
              ev.data.u64 = evs[e].data.u64;
              ::epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
              c.up[k] = 1;
              if (--c.pending > 0) continue;
              if (--connecting == 0) connected_ms[ti] = ms_since(Clk::now());
              if (proto == Protocol::v2) {
                send_all(c.fds[0], hello);
                c.stage = Stage::ping;
                c.need = 4;
              } else {
                send_all(c.fds[0], add_b);
                c.stage = Stage::add;
                c.need = 8;
              }
              c.have = 0;
              continue;
            }
            if (k != 0 || c.stage == Stage::connecting) {  // a callback connection speaking: a server that closed it
              char b;
              if (::recv(fd, &b, 1, 0) <= 0) throw std::runtime_error("server closed an idle connection");
              continue;
            }
            ssize_t got = ::recv(fd, c.buf + c.have, c.need - c.have, 0);
            if (got < 0 && errno == EAGAIN) continue;
            if (got <= 0) throw std::runtime_error(got == 0 ? "server closed the connection" : std::strerror(errno));
            c.have += static_cast<std::size_t>(got);
            if (c.have < c.need) continue;
            c.have = 0;
            if (c.stage == Stage::ping) {
              send_all(fd, add_b);
              c.stage = Stage::add;
              c.need = 8;
            } else if (c.stage == Stage::add) {
              if (static_cast<int64_t>(get_u64(c.buf)) == clients) send_all(fd, set_b);  // the last one in
              send_all(fd, wait_b);
              c.stage = Stage::wait;
              c.need = 1;
            } else if (c.stage == Stage::wait) {
              if (c.buf[0] != kStopWaiting) throw std::runtime_error("WAIT answered " + std::to_string(c.buf[0]));
              c.released_ms = ms_since(Clk::now());
              c.stage = Stage::released;
              --open;
            }
          } catch (const std::exception& ex) {
            fail(c, ex.what());
            --open;
          }
        }
      }
      ::close(ep);
    });
  }
  const long ticks0 = cpu_ticks(t.pid);
  const long overflows0 = netstat_counter("ListenOverflows"), syn0 = netstat_counter("TCPSynRetrans");
  t0 = Clk::now();
  start.arrive_and_wait();
  for (auto& th : threads) th.join();
  const long ticks1 = cpu_ticks(t.pid);
  RunResult res;
  res.overflows = static_cast<double>(netstat_counter("ListenOverflows") - overflows0);
  res.syn_retrans = static_cast<double>(netstat_counter("TCPSynRetrans") - syn0);
  std::vector<double> rel;
  for (int ti = 0; ti < nthreads; ++ti) {
    res.connected_ms = std::max(res.connected_ms, connected_ms[ti]);
    res.failed += failed[ti];
    if (res.first_error.empty()) res.first_error = errors[ti];
    for (auto& c : mine[ti]) {
      if (c.stage == Stage::released) rel.push_back(c.released_ms);
      linger lg{1, 0};  // a reset: no TIME_WAIT left behind for the next storm's ports
      for (int fd : c.fds) {
        ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        ::close(fd);
      }
    }
  }
  std::sort(rel.begin(), rel.end());
  if (!rel.empty()) {
    res.released_ms = rel.back();
    res.p50_ms = rel[rel.size() / 2];
    res.p99_ms = rel[std::min(rel.size() - 1, rel.size() * 99 / 100)];
  }
  res.cpu_ms = (ticks1 - ticks0) * 1e3 / sysconf(_SC_CLK_TCK);
  return res;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) try {
  std::vector<Target> targets;
  std::vector<int> clients{4096};
  int conns = 0, repeats = 3, threads = 2;
  double timeout = 60;
  Protocol proto = Protocol::v1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--target") {
      targets.push_back(parse_target(next()));
    } else if (a == "--clients") {
      clients.clear();
      std::stringstream ss(next());
      std::string item;
      while (std::getline(ss, item, ',')) clients.push_back(std::stoi(item));
    } else if (a == "--protocol") {
      auto v = next();
      if (v != "1" && v != "2") throw std::runtime_error("--protocol: 1 (PyTorch 1.13) or 2 (2.x)");
      proto = v == "1" ? Protocol::v1 : Protocol::v2;
    } else if (a == "--conns") {
      conns = std::stoi(next());
    } else if (a == "--repeats") {
      repeats = std::stoi(next());
    } else if (a == "--threads") {
      threads = std::stoi(next());
    } else if (a == "--timeout") {
      timeout = std::stod(next());
    } else {
      throw std::runtime_error("unknown argument " + a + " (see the comment at the top of store_storm.cpp)");
    }
  }
  if (targets.empty()) throw std::runtime_error("give at least one --target NAME=HOST:PORT:PID");
  if (conns <= 0) conns = proto == Protocol::v1 ? 2 : 1;
  if (conns > 255) throw std::runtime_error("--conns: at most 255");
  const int most = *std::max_element(clients.begin(), clients.end());
  rlimit nofile{};
  ::getrlimit(RLIMIT_NOFILE, &nofile);
  nofile.rlim_cur = nofile.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &nofile);
  if (static_cast<rlim_t>(most) * conns + 64 > nofile.rlim_cur)
    throw std::runtime_error(std::to_string(most) + " clients x " + std::to_string(conns) + " connections need more " +
                             "open files than this process may have (" + std::to_string(nofile.rlim_cur) +
                             "); the servers need as many: raise the hard limit (ulimit -Hn) or use fewer clients");
  std::printf(
      "store_storm: PyTorch %s clients, %d connection(s) each, all connecting at once from %d thread(s), then "
      "(2.x: VALIDATE, PING,) ADD to a barrier, WAIT for the last; median of %d\n",
      proto == Protocol::v1 ? "1.13" : "2.x", conns, threads, repeats);
  std::printf("%8s  %-8s %14s %14s %10s %10s %12s %8s %10s %10s\n", "clients", "server", "connected ms", "released ms",
              "p50 ms", "p99 ms", "server cpu ms", "failed", "overflows", "SYN rexmit");
  int any_failed = 0, run_no = 0;
  for (int n : clients) {
    std::vector<std::vector<RunResult>> rs(targets.size());
    for (int rep = 0; rep < repeats; ++rep) {
      for (std::size_t ti = 0; ti < targets.size(); ++ti) {
        auto res = storm(targets[ti], n, conns, proto, threads, timeout,
                         "/storm/" + std::to_string(::getpid()) + "/" + std::to_string(run_no++) + "/");
        if (res.failed > 0) {
          std::fprintf(stderr, "store_storm: %s, %d clients: %d failed, first: %s\n", targets[ti].name.c_str(), n,
                       res.failed, res.first_error.c_str());
          any_failed += res.failed;
        }
        rs[ti].push_back(res);
      }
    }
    std::vector<double> released;
    for (std::size_t ti = 0; ti < targets.size(); ++ti) {
      auto pick = [&](auto f) {
        std::vector<double> v;
        for (auto& r : rs[ti]) v.push_back(f(r));
        return median(v);
      };
      int failed = 0;
      for (auto& r : rs[ti]) failed += r.failed;
      released.push_back(pick([](auto& r) { return r.released_ms; }));
      std::printf("%8d  %-8s %14.1f %14.1f %10.1f %10.1f %12.1f %8d %10.0f %10.0f\n", n, targets[ti].name.c_str(),
                  pick([](auto& r) { return r.connected_ms; }), released.back(), pick([](auto& r) { return r.p50_ms; }),
                  pick([](auto& r) { return r.p99_ms; }), pick([](auto& r) { return r.cpu_ms; }), failed,
                  pick([](auto& r) { return r.overflows; }), pick([](auto& r) { return r.syn_retrans; }));
      std::printf("%8s  %-8s runs (released ms): ", "", targets[ti].name.c_str());
      for (auto& r : rs[ti]) std::printf("%.0f ", r.released_ms);
      std::printf("\n");
      std::fflush(stdout);
    }
    if (released.size() >= 2 && released[0] > 0)
      std::printf("%8d  %-8s %14s %13.2fx (theirs/ours: how many times faster all are released)\n", n, "ratio", "",
                  released[1] / released[0]);
    for (std::size_t ti = 2; ti < released.size(); ++ti)
      std::printf("%8d  %-8s %14s %13.2fx (%s/ours)\n", n, "ratio", "", released[ti] / released[0],
                  targets[ti].name.c_str());
  }
  std::printf("\nserver memory (KiB, VmHWM): ");
  for (auto& t : targets) std::printf("%s %ld  ", t.name.c_str(), status_kib(t.pid, "VmHWM:"));
  std::printf("\n");
  return any_failed ? 1 : 0;
} catch (const std::exception& e) {
  std::cerr << "store_storm: " << e.what() << "\n";
  return 2;
}

// store_load: a load generator for c10d TCPStore servers, speaking the PyTorch 1.13 or 2.x protocol
// (what Debian's PyTorch server speaks), run against several servers side by side.
//
//   store_load --target ours=127.0.0.1:29500:PID --target torch=127.0.0.1:29501:PID
//              --clients 1,16,256 --seconds 3 [--rounds 5]
//
// For each client count, each target in turn (same load, same machine, one after the other):
// that many client connections (spread over --threads epoll threads, default 2), each with one
// request outstanding as a PyTorch client has, loop over a set/get/add/wait mix on their own key
// plus one shared counter, like init-time traffic (SET + WAIT + GET of ids, ADD barriers).
// Reported per run: ops/s (one op = one request; SET has no reply), round-trip latency p50/p99
// of the replied ops, and the server's CPU time per op from /proc/PID/stat (utime+stime over
// the measured window), and how often its threads went to sleep per op (voluntary context
// switches of all its threads, /proc/PID/task/*/status): a busy server finds requests waiting
// and sleeps less than once per op. At the end: each server's resident memory (VmRSS before,
// VmHWM after).
// Ratios: every other target over the second (the peer), ops/s and CPU per op. With --rounds R
// each client count runs R rounds, the targets in turn (reversed in every other round), and
// each ratio is the median of the rounds' ratios with their range: the machine's speed drifts
// between runs, a round's two runs are seconds apart.
#include "store/protocol.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
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

struct RunResult {
  double ops_per_s = 0, cpu_us_per_op = 0, p50_us = 0, p99_us = 0, sleeps_per_op = 0;
  uint64_t ops = 0;
};

long cpu_ticks(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto close = s.rfind(')');
  if (close == std::string::npos) throw std::runtime_error("cannot read /proc/" + std::to_string(pid) + "/stat");
  std::istringstream in(s.substr(close + 2));
  std::string field;
  long utime = 0, stime = 0;
  for (int i = 3; i <= 15; ++i) {  // fields 3.. after "pid (comm)"; utime=14, stime=15
    in >> field;
    if (i == 14) utime = std::stol(field);
    if (i == 15) stime = std::stol(field);
  }
  return utime + stime;
}

// Voluntary context switches of every thread of pid (each time one of them blocked: in epoll_wait,
// poll, on a lock). Threads that ended within the window are not counted.
long sleeps(pid_t pid) {
  long sum = 0;
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  for (const auto& task : std::filesystem::directory_iterator(dir)) {
    std::ifstream f(task.path() / "status");
    std::string line;
    while (std::getline(f, line)) {
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0) sum += std::stol(line.substr(24));
    }
  }
  return sum;
}

long status_kib(pid_t pid, const char* key) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key, 0) == 0) return std::stol(line.substr(std::strlen(key)));
  }
  return -1;
}

class Conn {
 public:
  Conn(const Target& t) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(t.port);
    ::inet_pton(AF_INET, t.host.c_str(), &a.sin_addr);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      throw std::runtime_error("connect to " + t.name + " failed: " + std::strerror(errno));
    }
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ~Conn() { ::close(fd_); }
  int fd() const { return fd_; }
  void send(const std::string& b) {
    std::size_t off = 0;
    while (off < b.size()) {
      ssize_t n = ::send(fd_, b.data() + off, b.size() - off, MSG_NOSIGNAL);
      if (n <= 0) throw std::runtime_error("send failed");
      off += static_cast<std::size_t>(n);
    }
  }
  void recv(void* p, std::size_t n) {
    auto* c = static_cast<char*>(p);
    while (n > 0) {
      ssize_t got = ::recv(fd_, c, n, 0);
      if (got <= 0) throw std::runtime_error("server closed the connection");
      c += got;
      n -= static_cast<std::size_t>(got);
    }
  }
  uint64_t recv_u64() {
    uint8_t b[8];
    recv(b, 8);
    return get_u64(b);
  }

 private:
  int fd_ = -1;
};

// One client connection's place in the op cycle SET, WAIT, GET, ADD (replies: -, 1, 8+32, 8).
struct Client {
  std::unique_ptr<Conn> conn;
  std::string set_b, wait_b, get_b;
  int step = 0;  // 1: WAIT sent, 2: GET sent, 3: ADD sent
  std::size_t need = 0, have = 0;
  Clk::time_point sent{};
};

constexpr std::size_t kValueBytes = 32;

// --protocol 1 (PyTorch 1.13's numbering; what 1.13's server speaks) or 2 (the 2.x numbering,
// with the VALIDATE frame first; what 2.x servers, libuv's included, speak).
Protocol g_protocol = Protocol::v1;

// Threads, each driving its share of the clients through epoll: every client has one request
// outstanding at a time, as a PyTorch client does, but an idle client costs no thread wakeup,
// so the machine's two cores go to the servers rather than to 256 sleeping load threads.
RunResult run(const Target& t, int clients, double seconds, int max_threads) {
  std::atomic<bool> stop{false}, measuring{false};
  std::atomic<uint64_t> ops{0};
  const int nthreads = std::max(1, std::min(clients, max_threads));
  std::vector<std::vector<float>> lat(nthreads);
  std::barrier sync(nthreads + 1);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  Request add;
  add.op = Op::add;
  add.key = "/bench/counter";
  add.number = 1;
  const std::string add_b = encode_request(g_protocol, add);
  for (int ti = 0; ti < nthreads; ++ti) {
    threads.emplace_back([&, ti] {
      bool arrived = false;
      try {
        std::vector<Client> mine;
        for (int i = ti; i < clients; i += nthreads) {
          Client c;
          c.conn = std::make_unique<Conn>(t);
          if (g_protocol == Protocol::v2) {
            Request validate;
            validate.op = Op::validate;
            validate.word = 0x3C85F7CE;
            c.conn->send(encode_request(g_protocol, validate));  // no reply
          }
          const std::string key = "/bench/" + std::to_string(i);
          Request set, get, wait;
          set.op = Op::set;
          set.key = key;
          set.value = std::string(kValueBytes, 'v');
          get.op = Op::get;
          get.key = key;
          wait.op = Op::wait;
          wait.keys = {key};
          c.set_b = encode_request(g_protocol, set);
          c.get_b = encode_request(g_protocol, get);
          c.wait_b = encode_request(g_protocol, wait);
          mine.push_back(std::move(c));
        }
        int ep = epoll_create1(0);
        for (std::size_t i = 0; i < mine.size(); ++i) {
          epoll_event ev{};
          ev.events = EPOLLIN;
          ev.data.u64 = i;
          epoll_ctl(ep, EPOLL_CTL_ADD, mine[i].conn->fd(), &ev);
        }
        auto& my_lat = lat[ti];
        my_lat.reserve(1 << 18);
        // Sends the next request of c's cycle.
        auto next = [&](Client& c) {
          switch (c.step) {
            case 0:  // SET (no reply), then WAIT on the key just set
              c.conn->send(c.set_b);
              c.conn->send(c.wait_b);
              c.step = 1;
              c.need = 1;
              break;
            case 1:
              c.conn->send(c.get_b);
              c.step = 2;
              c.need = 8 + kValueBytes;
              break;
            case 2:
              c.conn->send(add_b);
              c.step = 3;
              c.need = 8;
              break;
          }
          c.have = 0;
          c.sent = Clk::now();
        };
        sync.arrive_and_wait();
        arrived = true;
        for (auto& c : mine) next(c);
        std::vector<epoll_event> events(64);
        char buf[4096];
        uint64_t local_ops = 0;
        while (!stop.load(std::memory_order_relaxed)) {
          int n = epoll_wait(ep, events.data(), static_cast<int>(events.size()), 100);
          const bool measure = measuring.load(std::memory_order_relaxed);
          for (int e = 0; e < n; ++e) {
            Client& c = mine[events[e].data.u64];
            ssize_t got = ::recv(c.conn->fd(), buf, std::min(sizeof buf, c.need - c.have), 0);
            if (got <= 0) throw std::runtime_error("server closed the connection");
            c.have += static_cast<std::size_t>(got);
            if (c.have < c.need) continue;
            if (measure) {
              my_lat.push_back(std::chrono::duration<float, std::micro>(Clk::now() - c.sent).count());
              local_ops += c.step == 1 ? 2 : 1;  // the SET rode with the WAIT
            }
            c.step = c.step == 3 ? 0 : c.step;
            next(c);
          }
          if (local_ops >= 256) {
            ops.fetch_add(local_ops, std::memory_order_relaxed);
            local_ops = 0;
          }
        }
        ops.fetch_add(local_ops, std::memory_order_relaxed);
        ::close(ep);
      } catch (const std::exception& e) {
        if (failures++ == 0) std::cerr << t.name << ": " << e.what() << "\n";
        if (!arrived) sync.arrive_and_drop();
      }
    });
  }
  sync.arrive_and_wait();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // warm-up
  const uint64_t ops0 = ops.load();
  const long ticks0 = cpu_ticks(t.pid);
  const long sleeps0 = sleeps(t.pid);
  const auto t0 = Clk::now();
  measuring = true;
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  measuring = false;
  const auto t1 = Clk::now();
  const long ticks1 = cpu_ticks(t.pid);
  const long sleeps1 = sleeps(t.pid);
  stop = true;
  for (auto& th : threads) th.join();
  if (failures > 0)
    throw std::runtime_error(t.name + ": " + std::to_string(failures.load()) + " client threads failed");
  const uint64_t n = ops.load() - ops0;
  if (n == 0) throw std::runtime_error(t.name + " answered no request in " + std::to_string(seconds) + " s");

  RunResult r;
  r.ops = n;
  const double secs = std::chrono::duration<double>(t1 - t0).count();
  r.ops_per_s = n / secs;
  r.cpu_us_per_op = n ? (ticks1 - ticks0) * 1e6 / sysconf(_SC_CLK_TCK) / n : 0;
  r.sleeps_per_op = n ? double(sleeps1 - sleeps0) / n : 0;
  std::vector<float> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  if (!all.empty()) {
    std::sort(all.begin(), all.end());
    r.p50_us = all[all.size() / 2];
    r.p99_us = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  }
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

// One printf-formatted piece of a line.
template <class... A>
std::string fmt_ratio(const char* format, A... args) {
  char buf[96];
  std::snprintf(buf, sizeof buf, format, args...);
  return buf;
}

Target parse_target(const std::string& s) {
  // NAME=HOST:PORT:PID
  Target t;
  auto eq = s.find('=');
  if (eq == std::string::npos) throw std::runtime_error("--target NAME=HOST:PORT:PID, got " + s);
  t.name = s.substr(0, eq);
  std::string rest = s.substr(eq + 1);
  auto c2 = rest.rfind(':');
  auto c1 = rest.rfind(':', c2 - 1);
  if (c1 == std::string::npos || c2 == std::string::npos)
    throw std::runtime_error("--target NAME=HOST:PORT:PID, got " + s);
  t.host = rest.substr(0, c1);
  t.port = static_cast<uint16_t>(std::stoi(rest.substr(c1 + 1, c2 - c1 - 1)));
  t.pid = std::stoi(rest.substr(c2 + 1));
  return t;
}

}  // namespace

int main(int argc, char** argv) try {
  std::vector<Target> targets;
  std::vector<int> clients{1, 16, 256};
  double seconds = 3;
  int threads = 2;
  int rounds = 1;
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
    } else if (a == "--threads") {
      threads = std::stoi(next());
    } else if (a == "--protocol") {
      auto v = next();
      if (v != "1" && v != "2") throw std::runtime_error("--protocol: 1 (PyTorch 1.13) or 2 (2.x)");
      g_protocol = v == "1" ? Protocol::v1 : Protocol::v2;
    } else if (a == "--rounds") {
      rounds = std::max(1, std::stoi(next()));
    } else if (a == "--seconds") {
      seconds = std::stod(next());
    } else {
      throw std::runtime_error("unknown argument " + a + " (see the comment at the top of store_load.cpp)");
    }
  }
  if (targets.empty()) throw std::runtime_error("give at least one --target NAME=HOST:PORT:PID");

  std::vector<long> rss0;
  for (auto& t : targets) rss0.push_back(status_kib(t.pid, "VmRSS:"));
  std::printf(
      "store_load: PyTorch %s protocol; per client a loop of SET, WAIT(existing), GET, ADD(shared);\n"
      "  one request outstanding per client; clients spread over up to %d epoll threads; %.1f s per run\n",
      g_protocol == Protocol::v1 ? "1.13" : "2.x", threads, seconds);
  std::printf("%8s  %-8s %12s %10s %10s %12s %12s\n", "clients", "server", "ops/s", "p50 us", "p99 us", "cpu us/op",
              "sleeps/op");
  for (int n : clients) {
    // by_target[i][r]: target i in round r. Odd rounds take the targets in reverse order, so that
    // neither side always runs on a machine the other has just warmed (or disturbed).
    std::vector<std::vector<RunResult>> by_target(targets.size());
    for (int r = 0; r < rounds; ++r) {
      for (std::size_t k = 0; k < targets.size(); ++k) {
        const std::size_t i = r % 2 == 0 ? k : targets.size() - 1 - k;
        const auto& t = targets[i];
        by_target[i].push_back(run(t, n, seconds, threads));
        const auto& res = by_target[i].back();
        std::printf("%8d  %-8s %12.0f %10.1f %10.1f %12.2f %12.3f%s\n", n, t.name.c_str(), res.ops_per_s, res.p50_us,
                    res.p99_us, res.cpu_us_per_op, res.sleeps_per_op,
                    rounds > 1 ? (" (round " + std::to_string(r + 1) + ")").c_str() : "");
        std::fflush(stdout);
      }
    }
    // Each target against the second (the peer), round by round: the median of the rounds'
    // ratios, and their range.
    if (targets.size() < 2) continue;
    for (std::size_t i = 0; i < targets.size(); ++i) {
      if (i == 1) continue;
      std::vector<double> ops_r, cpu_r;
      for (int r = 0; r < rounds; ++r) {
        const auto &a = by_target[i][r], &b = by_target[1][r];
        if (b.ops_per_s > 0) ops_r.push_back(a.ops_per_s / b.ops_per_s);
        if (b.cpu_us_per_op > 0) cpu_r.push_back(a.cpu_us_per_op / b.cpu_us_per_op);
      }
      if (ops_r.empty()) continue;
      const std::string who = targets[i].name + "/" + targets[1].name;
      // No CPU ratio when the peer's CPU did not move a tick in any round.
      std::string cpu = "cpu -";
      if (!cpu_r.empty()) {
        const auto [clo, chi] = std::minmax_element(cpu_r.begin(), cpu_r.end());
        cpu = cpu_r.size() == 1 ? fmt_ratio("cpu %.2fx", cpu_r[0])
                                : fmt_ratio("cpu %.2fx (%.2f-%.2f)", median(cpu_r), *clo, *chi);
      }
      if (ops_r.size() == 1) {
        std::printf("%8d  ratio %-16s %8.2fx %21s %s\n", n, who.c_str(), ops_r[0], "", cpu.c_str());
      } else {
        const auto [olo, ohi] = std::minmax_element(ops_r.begin(), ops_r.end());
        std::printf("%8d  ratio %-16s %8.2fx (%.2f-%.2f, %zu rounds)  %s\n", n, who.c_str(), median(ops_r), *olo, *ohi,
                    ops_r.size(), cpu.c_str());
      }
    }
  }
  std::printf("\nserver memory (KiB): VmRSS before -> VmHWM (peak) after\n");
  std::vector<long> hwm;
  for (std::size_t i = 0; i < targets.size(); ++i) {
    hwm.push_back(status_kib(targets[i].pid, "VmHWM:"));
    std::printf("  %-8s %8ld -> %8ld  (grew %ld)\n", targets[i].name.c_str(), rss0[i], hwm[i], hwm[i] - rss0[i]);
  }
  if (targets.size() >= 2 && hwm[1] > 0) {
    std::printf("  ratio peak %.2fx, growth %.2fx\n", double(hwm[0]) / hwm[1],
                (hwm[1] - rss0[1]) > 0 ? double(hwm[0] - rss0[0]) / (hwm[1] - rss0[1]) : 0.0);
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "store_load: " << e.what() << "\n";
  return 2;
}

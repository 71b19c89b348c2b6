// store_load: a load generator for c10d TCPStore servers, speaking the PyTorch 1.13 protocol
// (what Debian's PyTorch server speaks), run against several servers side by side.
//
//   store_load --target ours=127.0.0.1:29500:PID --target torch=127.0.0.1:29501:PID
//              --clients 1,16,256 --seconds 3
//
// For each client count, each target in turn (same load, same machine, one after the other):
// that many threads, one connection each, loop over a set/get/add/wait mix on their own key plus
// one shared counter, like init-time traffic (ADD init/, SET + WAIT + GET of ids, ADD barriers).
// Reported per run: ops/s (one op = one request; SET has no reply), round-trip latency p50/p99
// of the replied ops, and the server's CPU time per op from /proc/PID/stat (utime+stime over
// the measured window). At the end: each server's resident memory (VmRSS before, VmHWM after).
// Ratios are ours/theirs for the first target over the second.
#include "store/protocol.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
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
  double ops_per_s = 0, cpu_us_per_op = 0, p50_us = 0, p99_us = 0;
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

RunResult run(const Target& t, int clients, double seconds) {
  std::atomic<bool> stop{false}, measuring{false};
  std::atomic<uint64_t> ops{0};
  std::vector<std::vector<float>> lat(clients);
  std::barrier sync(clients + 1);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      try {
        Conn c(t);
        const std::string key = "/bench/" + std::to_string(i);
        Request set, get, add, wait;
        set.op = Op::set;
        set.key = key;
        set.value = std::string(32, 'v');
        get.op = Op::get;
        get.key = key;
        add.op = Op::add;
        add.key = "/bench/counter";
        add.number = 1;
        wait.op = Op::wait;
        wait.keys = {key};
        const std::string set_b = encode_request(Protocol::v1, set), get_b = encode_request(Protocol::v1, get),
                          add_b = encode_request(Protocol::v1, add), wait_b = encode_request(Protocol::v1, wait);
        c.send(set_b);
        sync.arrive_and_wait();
        auto& my = lat[i];
        my.reserve(1 << 16);
        char buf[64];
        uint64_t local = 0;
        auto timed = [&](auto&& fn) {
          auto t0 = Clk::now();
          fn();
          if (measuring.load(std::memory_order_relaxed)) {
            my.push_back(std::chrono::duration<float, std::micro>(Clk::now() - t0).count());
          }
        };
        while (!stop.load(std::memory_order_relaxed)) {
          c.send(set_b);  // no reply
          timed([&] {
            c.send(wait_b);
            c.recv(buf, 1);
          });
          timed([&] {
            c.send(get_b);
            uint64_t n = c.recv_u64();
            c.recv(buf, n);
          });
          timed([&] {
            c.send(add_b);
            c.recv_u64();
          });
          local += 4;
          if (measuring.load(std::memory_order_relaxed)) {
            ops.fetch_add(4, std::memory_order_relaxed);
          }
        }
        (void)local;
      } catch (const std::exception& e) {
        if (failures++ == 0) std::cerr << t.name << ": " << e.what() << "\n";
        sync.arrive_and_drop();
      }
    });
  }
  sync.arrive_and_wait();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // warm-up
  const long ticks0 = cpu_ticks(t.pid);
  const auto t0 = Clk::now();
  measuring = true;
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  measuring = false;
  const auto t1 = Clk::now();
  const long ticks1 = cpu_ticks(t.pid);
  const uint64_t n = ops.load();
  stop = true;
  for (auto& th : threads) th.join();
  if (failures > 0) throw std::runtime_error(t.name + ": " + std::to_string(failures.load()) + " clients failed");

  RunResult r;
  r.ops = n;
  const double secs = std::chrono::duration<double>(t1 - t0).count();
  r.ops_per_s = n / secs;
  r.cpu_us_per_op = n ? (ticks1 - ticks0) * 1e6 / sysconf(_SC_CLK_TCK) / n : 0;
  std::vector<float> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  if (!all.empty()) {
    std::sort(all.begin(), all.end());
    r.p50_us = all[all.size() / 2];
    r.p99_us = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  }
  return r;
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
  if (c1 == std::string::npos || c2 == std::string::npos) throw std::runtime_error("--target NAME=HOST:PORT:PID, got " + s);
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
    } else if (a == "--seconds") {
      seconds = std::stod(next());
    } else {
      throw std::runtime_error("unknown argument " + a + " (see the comment at the top of store_load.cpp)");
    }
  }
  if (targets.empty()) throw std::runtime_error("give at least one --target NAME=HOST:PORT:PID");

  std::vector<long> rss0;
  for (auto& t : targets) rss0.push_back(status_kib(t.pid, "VmRSS:"));
  std::printf("store_load: PyTorch 1.13 protocol; per client a loop of SET, WAIT(existing), GET, ADD(shared); %.1f s per run\n",
              seconds);
  std::printf("%8s  %-8s %12s %10s %10s %12s\n", "clients", "server", "ops/s", "p50 us", "p99 us", "cpu us/op");
  for (int n : clients) {
    std::vector<RunResult> rs;
    for (auto& t : targets) {
      rs.push_back(run(t, n, seconds));
      const auto& r = rs.back();
      std::printf("%8d  %-8s %12.0f %10.1f %10.1f %12.2f\n", n, t.name.c_str(), r.ops_per_s, r.p50_us, r.p99_us,
                  r.cpu_us_per_op);
      std::fflush(stdout);
    }
    if (rs.size() >= 2 && rs[1].ops_per_s > 0 && rs[1].cpu_us_per_op > 0) {
      std::printf("%8d  %-8s %11.2fx %21s %11.2fx\n", n, "ratio", rs[0].ops_per_s / rs[1].ops_per_s, "",
                  rs[0].cpu_us_per_op / rs[1].cpu_us_per_op);
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

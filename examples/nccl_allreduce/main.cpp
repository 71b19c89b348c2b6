// nccl_allreduce: a raw-NCCL all-reduce benchmark worker, one process per GPU.
//
// Id sources, so a run under ddpctl can be compared with one started by hand:
//   default    the id broadcast by the launcher (DDP_NCCL_UNIQUE_ID; RANK, WORLD_SIZE, LOCAL_RANK...).
//   --self-id PATH
//              rank 0 calls ncclGetUniqueId itself and publishes the hex id at PATH (written to a
//              temporary name and renamed, so readers never see half of it); the other ranks wait
//              for PATH (inotify, with a deadline). Only RANK and WORLD_SIZE are needed then
//              (LOCAL_RANK defaults to RANK). Rank 0 removes PATH at the end.
//
// Report: like nccl-tests' all_reduce_perf, in-place, float sum. For each size from --min-bytes to
// --max-bytes (x --factor): --warmup untimed iterations, then --iters timed ones between two CUDA
// events on one stream; time = mean per iteration; algbw = bytes / time; busbw = algbw * 2(n-1)/n
// (the bytes each rank's link carries in a ring all-reduce). After timing, the buffer is refilled
// and one all-reduce is checked element by element against the exact sum (#wrong).
// Rank 0 prints the table; every rank reports its own errors. Exit: 0 ok, 1 error or wrong
// results, 2 no CUDA runtime or no NCCL on this node.
#include "common/log.hpp"
#include "nccl/library.hpp"
#include "nccl/unique_id.hpp"
#include "worker/comm.hpp"
#include "worker/cuda_runtime.hpp"
#include "worker/env.hpp"

#include <CLI/CLI.hpp>

#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Options {
  std::size_t min_bytes = 8;
  std::size_t max_bytes = 64u << 20;
  int factor = 2;
  int warmup = 5;
  int iters = 20;
  std::string self_id;
  int self_id_timeout_s = 120;
  std::string nccl_lib;
};

std::optional<std::string> read_id_file(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  if (in && std::getline(in, line) && line.size() == ddp::nccl::kUniqueIdHexChars) return line;
  return std::nullopt;
}

// Waits for `path` to appear (it is published by rename, so it appears whole), up to a deadline.
std::string wait_for_id_file(const fs::path& path, std::chrono::seconds timeout) {
  fs::path dir = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  int fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (fd < 0) throw std::runtime_error("inotify_init1 failed");
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  if (inotify_add_watch(fd, dir.c_str(), IN_MOVED_TO | IN_CLOSE_WRITE | IN_CREATE) < 0) {
    throw std::runtime_error("cannot watch " + dir.string() + " for the id file");
  }
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    if (auto id = read_id_file(path)) return *id;  // checked after the watch exists: no lost wake-up
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      throw std::runtime_error("no NCCL id at " + path.string() + " after " + std::to_string(timeout.count()) +
                               " s: is rank 0 running with the same --self-id path?");
    }
    pollfd p{fd, POLLIN, 0};
    poll(&p, 1, static_cast<int>(left.count()));
    char buf[4096];
    while (read(fd, buf, sizeof buf) > 0) {
    }
  }
}

void publish_id_file(const fs::path& path, const std::string& hex) {
  fs::path tmp = path;
  tmp += ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << hex << "\n";
    if (!out.flush()) throw std::runtime_error("cannot write " + tmp.string());
  }
  fs::rename(tmp, path);
}

std::string format_size(std::size_t bytes) {
  return std::to_string(bytes);
}

struct DeviceBuffer {
  const ddp::worker::CudaRuntime& cuda;
  void* ptr;
  ~DeviceBuffer() { cuda.free(ptr); }
};

int run(const Options& opt) {
  std::string why;
  auto cuda = ddp::worker::CudaRuntime::load(&why);
  if (!cuda) {
    std::fprintf(stderr, "nccl_allreduce: %s\n", why.c_str());
    return 2;
  }
  const bool self = !opt.self_id.empty();
  auto env = ddp::worker::worker_env_from_process(
      {.require_rendezvous = false, .require_nccl_id = !self, .require_local = !self});

  ddp::nccl::Library nccl;
  try {
    nccl = ddp::nccl::Library::load({.path = opt.nccl_lib,
                                     .hint = "nccl_allreduce calls NCCL directly: install NCCL or put its lib "
                                             "directory on LD_LIBRARY_PATH"});
  } catch (const ddp::nccl::LoadError& e) {
    std::fprintf(stderr, "nccl_allreduce: %s\n", e.what());
    return 2;
  }

  cuda->set_device(env.local_rank);  // before any NCCL call that touches a device

  ddp::nccl::UniqueId id;
  std::string id_source;
  double id_ms = 0;
  auto t0 = Clock::now();
  if (self) {
    if (env.rank == 0) {
      id = nccl.get_unique_id();
      publish_id_file(opt.self_id, ddp::nccl::to_hex(id));
    } else {
      auto parsed =
          ddp::nccl::unique_id_from_hex(wait_for_id_file(opt.self_id, std::chrono::seconds(opt.self_id_timeout_s)));
      if (!parsed) throw std::runtime_error(opt.self_id + ": " + parsed.error);
      id = *parsed.value;
    }
    id_source = "self (" + opt.self_id + ")";
  } else {
    id = *env.nccl_unique_id;
    id_source = "broadcast (DDP_NCCL_UNIQUE_ID)";
  }
  id_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  auto root = ddp::nccl::decode_bootstrap_address(id);

  auto t1 = Clock::now();
  auto comm = ddp::worker::init_comm(nccl, id, env.world_size, env.rank);
  double init_ms = std::chrono::duration<double, std::milli>(Clock::now() - t1).count();
  const int n = env.world_size;
  const bool print = env.rank == 0;

  if (print) {
    std::printf("# nccl_allreduce: %d ranks, NCCL %s (%s), CUDA runtime %d (%s)\n", n, nccl.version().c_str(),
                nccl.path().c_str(), cuda->runtime_version(), cuda->path().c_str());
    std::printf("# id: %s, bootstrap root %s, id %.1f ms, ncclCommInitRank %.1f ms\n", id_source.c_str(),
                root ? root.value->endpoint().c_str() : "?", id_ms, init_ms);
    std::printf("# in-place, float, sum; warmup %d, iters %d\n#\n", opt.warmup, opt.iters);
    std::printf("# %10s %12s %8s %6s %10s %8s %8s %8s\n", "size", "count", "type", "redop", "time", "algbw", "busbw",
                "#wrong");
    std::printf("# %10s %12s %8s %6s %10s %8s %8s %8s\n", "(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", "");
    std::fflush(stdout);
  }

  const std::size_t max_count = std::max<std::size_t>(opt.max_bytes / sizeof(float), 1);
  DeviceBuffer buf{*cuda, cuda->malloc(max_count * sizeof(float))};
  auto stream = cuda->stream_create();
  auto ev_start = cuda->event_create();
  auto ev_end = cuda->event_create();
  std::vector<float> host(max_count);
  // Element i of rank r is (r + 1) + (i % 7): small integers, so every sum is exact in float.
  auto fill = [&](std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) host[i] = static_cast<float>(env.rank + 1 + i % 7);
    cuda->copy_to_device(buf.ptr, host.data(), count * sizeof(float));
  };
  auto all_reduce = [&](std::size_t count) {
    nccl.check(nccl.api().all_reduce(buf.ptr, buf.ptr, count, static_cast<int>(ddp::nccl::DataType::float32),
                                     static_cast<int>(ddp::nccl::RedOp::sum), comm.get(), stream),
               "ncclAllReduce", comm.get());
  };

  long long total_wrong = 0;
  double busbw_sum = 0;
  int sizes = 0;
  for (std::size_t bytes = opt.min_bytes; bytes <= opt.max_bytes; bytes *= opt.factor) {
    const std::size_t count = std::max<std::size_t>(bytes / sizeof(float), 1);
    const std::size_t real_bytes = count * sizeof(float);
    fill(count);
    for (int i = 0; i < opt.warmup; ++i) all_reduce(count);
    cuda->stream_synchronize(stream);
    cuda->event_record(ev_start, stream);
    for (int i = 0; i < opt.iters; ++i) all_reduce(count);
    cuda->event_record(ev_end, stream);
    cuda->event_synchronize(ev_end);
    double us = cuda->event_elapsed_ms(ev_start, ev_end) * 1000.0 / opt.iters;
    double algbw = static_cast<double>(real_bytes) / (us * 1e-6) / 1e9;
    double busbw = algbw * 2.0 * (n - 1) / n;

    fill(count);
    all_reduce(count);
    cuda->stream_synchronize(stream);
    cuda->copy_to_host(host.data(), buf.ptr, real_bytes);
    long long wrong = 0;
    for (std::size_t i = 0; i < count; ++i) {
      float expect = static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i % 7));
      if (host[i] != expect) ++wrong;
    }
    total_wrong += wrong;
    if (wrong != 0) {
      std::fprintf(stderr, "nccl_allreduce: rank %d: %lld of %zu elements wrong at %zu bytes\n", env.rank, wrong, count,
                   real_bytes);
    }
    busbw_sum += busbw;
    ++sizes;
    if (print) {
      std::printf("  %10s %12zu %8s %6s %10.2f %8.2f %8.2f %8lld\n", format_size(real_bytes).c_str(), count, "float",
                  "sum", us, algbw, busbw, wrong);
      std::fflush(stdout);
    }
    if (comm.async_error() != ddp::nccl::Result::success)
      throw std::runtime_error("NCCL reported an asynchronous error");
    if (opt.factor < 2) break;
  }
  if (print) {
    std::printf("# Out of bounds values : %lld %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth    : %.4f\n#\n", sizes ? busbw_sum / sizes : 0.0);
  }
  cuda->event_destroy(ev_start);
  cuda->event_destroy(ev_end);
  cuda->stream_destroy(stream);
  comm.destroy();
  if (self && env.rank == 0) {
    std::error_code ec;
    fs::remove(opt.self_id, ec);
  }
  return total_wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  ddp::log::configure_from_env();
  CLI::App app{"Raw-NCCL all-reduce benchmark worker (nccl-tests style report)."};
  Options opt;
  app.add_option("-b,--min-bytes", opt.min_bytes, "smallest message in bytes")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("-e,--max-bytes", opt.max_bytes, "largest message in bytes")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("-f,--factor", opt.factor, "size multiplier between steps")
      ->capture_default_str()
      ->check(CLI::Range(2, 1024));
  app.add_option("-w,--warmup", opt.warmup, "untimed iterations per size")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("-n,--iters", opt.iters, "timed iterations per size")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--self-id", opt.self_id, "make the id by hand: rank 0 writes it to this file, the others read it");
  app.add_option("--self-id-timeout", opt.self_id_timeout_s, "seconds ranks > 0 wait for the id file")
      ->capture_default_str();
  app.add_option("--nccl-lib", opt.nccl_lib, "load this libnccl instead of searching for libnccl.so.2");
  CLI11_PARSE(app, argc, argv);
  if (opt.min_bytes > opt.max_bytes) {
    std::fprintf(stderr, "nccl_allreduce: --min-bytes exceeds --max-bytes\n");
    return 1;
  }
  try {
    return run(opt);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nccl_allreduce: %s\n", e.what());
    return 1;
  }
}

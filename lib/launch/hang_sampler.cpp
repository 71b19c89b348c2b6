// See hang_sampler.hpp; what counts as progress is lib/hang/progress.hpp's.
#include "launch/hang_sampler.hpp"
#include "attempt/files.hpp"

#include "common/log.hpp"
#include "common/strings.hpp"
#include "stacks/reader.hpp"
#include "supervisor/process.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>

namespace ddp::launch {

namespace {

// A rank whose own process is not Python (sh -c, uv run, a wrapper) runs its Python below: the
// first few descendants are tried, so the watchdog watches the interpreter, not the wrapper.
constexpr std::size_t kMaxDescendantsTried = 8;

// The main thread's utime + stime (clock ticks), from /proc/PID/task/PID/stat.
std::optional<std::uint64_t> main_thread_cpu(pid_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/stat";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char buf[1024];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return std::nullopt;
  const std::string_view text(buf, static_cast<std::size_t>(n));
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses; fields follow the last ')'.
  const auto close = text.rfind(')');
  if (close == std::string_view::npos) return std::nullopt;
  auto fields = split(text.substr(close + 1), ' ');
  // After ')': "", state(3), ppid(4), ... utime is field 14, stime 15 (1-based, man 5 proc).
  if (fields.size() < 14) return std::nullopt;
  auto ut = parse_int(fields[12]), st = parse_int(fields[13]);
  if (!ut || !st || *ut < 0 || *st < 0) return std::nullopt;
  return static_cast<std::uint64_t>(*ut + *st);
}

const stacks::ThreadStack* main_thread(const stacks::ProcessStacks& p) {
  for (const auto& t : p.threads) {
    if (t.main) return &t;
  }
  return nullptr;
}

}  // namespace

HangSampler::HangSampler(boost::asio::io_context& io, Millis timeout, std::vector<Rank> ranks, OnRound on_round)
    : timer_(io),
      interval_(hang::sample_interval(timeout)),
      on_round_(std::move(on_round)),
      progress_(timeout, static_cast<int>(ranks.size()), hang::Clock::now()) {
  for (auto& r : ranks) ranks_.push_back(State{std::move(r)});
}

void HangSampler::start() {
  stopped_ = false;
  progress_ = hang::RankProgress(progress_.watch().timeout(), static_cast<int>(ranks_.size()), hang::Clock::now());
  schedule();
}

void HangSampler::stop() {
  stopped_ = true;
  timer_.cancel();
}

void HangSampler::on_output(int local_rank) {
  if (local_rank >= 0 && static_cast<std::size_t>(local_rank) < ranks_.size())
    ranks_[static_cast<std::size_t>(local_rank)].output = true;
}

void HangSampler::on_exit(int local_rank) {
  if (local_rank >= 0 && static_cast<std::size_t>(local_rank) < ranks_.size())
    ranks_[static_cast<std::size_t>(local_rank)].exited = true;
}

void HangSampler::schedule() {
  timer_.expires_after(interval_);
  timer_.async_wait([this](boost::system::error_code ec) {
    if (ec || stopped_) return;
    round();
    if (!stopped_) schedule();
  });
}

hang::Sample HangSampler::sample(State& s, hang::TimePoint now, stacks::ProcessStacks& read) {
  hang::Sample out;
  out.rank = s.rank.local_rank;
  out.when = now;
  out.output = std::exchange(s.output, false);
  // A descendant is read only while it is the process found (its start time before and after
  // the read): one that ended and whose pid went to another process, maybe another user's, is
  // not read (the sampler may run as root, and what it reads goes into this job's report).
  auto read_same = [](pid_t pid, const std::optional<unsigned long long>& started) {
    if (!started || process_start_time(pid) != started) return stacks::ProcessStacks{};
    stacks::ProcessStacks r = read_rank_stacks(pid);
    if (process_start_time(pid) != started) r = stacks::ProcessStacks{};
    return r;
  };
  if (s.python_pid > 0) {
    read = read_same(s.python_pid, s.python_started);
    if (!read.python_ok) s.python_pid = -1;  // gone, or it exec'd something else: look again
  }
  if (s.python_pid <= 0) {
    read = read_rank_stacks(s.rank.pid);  // our child: its pid is its own until we reap it
    if (read.python_ok) {
      s.python_pid = s.rank.pid;
      s.python_started = process_start_time(s.rank.pid);
    } else {
      std::size_t tried = 0;
      for (pid_t d : supervisor::descendants_of(s.rank.pid)) {
        if (tried++ == kMaxDescendantsTried) break;
        const auto started = process_start_time(d);
        auto r = read_same(d, started);
        if (!r.python_ok) continue;
        s.python_pid = d;
        s.python_started = started;
        read = std::move(r);
        break;
      }
    }
  }
  const pid_t watched = s.python_pid > 0 ? s.python_pid : s.rank.pid;
  out.cpu_ticks = main_thread_cpu(watched);
  if (read.python_ok) {
    const auto* t = main_thread(read);
    static const std::vector<stacks::Frame> none;
    const auto& frames = t ? t->python : none;
    out.stack = hang::fingerprint(frames);
    out.in_torch_distributed = hang::inside_torch_distributed(frames);
  }
  return out;
}

void HangSampler::round() {
  const auto now = hang::Clock::now();
  std::vector<stacks::RankStacks> read;
  for (auto& s : ranks_) {
    if (s.exited || s.rank.pid <= 0) continue;
    stacks::RankStacks rs;
    rs.rank = s.rank.rank;
    rs.node = s.rank.node;
    const auto why = progress_.on_sample(sample(s, now, rs.stacks));
    if (why != hang::Why::none) {
      log::get("hang")->trace("rank {} progressed: {}", s.rank.rank, hang::why_name(why));
    }
    read.push_back(std::move(rs));
  }
  last_ = std::move(read);
  if (on_round_) on_round_(progress_, now);
}

std::string HangSampler::stacks_text(int world_size) const {
  if (last_.empty()) return "no rank running to read\n";
  return stacks::render_text(stacks::merge(last_, {.main_thread_only = false}), world_size);
}

}  // namespace ddp::launch

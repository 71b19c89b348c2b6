// WorkerGroup::read_stacks: the stacks of an attempt's running ranks, for `ddpctl stacks`. The
// read (lib/stacks/collect.hpp) blocks for up to its budget, so it runs on a thread of its own;
// the result is posted back to the group's io_context. At most kMaxReads run at once (a burst of
// requests must not fork hundreds of readers); the group's destruction waits for them, which the
// budget bounds.
//
// Each rank's start time is taken on the loop, while the rank is an unreaped child (its pid surely
// its own), and goes with its pid: the read, later and on another thread, keeps only what it read
// from a pid that still has that start time, so a rank that ends meanwhile is never another
// process, read as root for the user who asked.
#include "launch/worker_group.hpp"

#include "stacks/collect.hpp"
#include "stacks/reader.hpp"

#include <boost/asio/post.hpp>

#include <algorithm>
#include <atomic>
#include <list>
#include <thread>

namespace ddp::launch {

namespace {
constexpr std::size_t kMaxReads = 4;
}

struct WorkerGroup::StackReads {
  struct Read {
    std::jthread thread;
    std::shared_ptr<std::atomic<bool>> over = std::make_shared<std::atomic<bool>>(false);
  };
  std::list<Read> reads;  // a jthread joins when destroyed
};

void WorkerGroup::read_stacks(const StacksQuery& q, std::function<void(std::vector<stacks::RankStacks>)> done) {
  if (!stack_reads_) stack_reads_ = std::make_shared<StackReads>();
  auto& reads = stack_reads_->reads;
  std::erase_if(reads, [](const StackReads::Read& r) { return r.over->load(); });

  // Which ranks, and which of them run now (read on the loop: the workers change only here).
  std::vector<stacks::RankStacks> out;
  std::vector<stacks::Target> targets;
  std::vector<std::size_t> slots;  // out[slots[i]] gets targets[i]'s read
  for (const auto& w : rank_status()) {
    if (!q.local_ranks.empty() &&
        std::find(q.local_ranks.begin(), q.local_ranks.end(), w.local_rank) == q.local_ranks.end())
      continue;
    stacks::RankStacks r;
    r.rank = w.rank;
    r.stacks.pid = w.pid > 0 ? w.pid : 0;
    const auto started = w.running ? stacks::process_start_time(w.pid) : std::nullopt;
    if (started) {
      slots.push_back(out.size());
      targets.push_back({w.pid, started});
    } else if (w.running) {  // no /proc/PID/stat for a child not reaped yet: nothing to check against
      r.stacks.python = "not read";
      r.stacks.errors.push_back("the process ended before it was read");
    } else {
      r.stacks.python = "not read";
      r.stacks.errors.push_back(w.exit ? "the rank has ended: " + w.exit->describe() : "the rank did not start");
    }
    out.push_back(std::move(r));
  }
  if (targets.empty() || reads.size() >= kMaxReads) {
    if (!targets.empty()) {
      for (std::size_t s : slots) out[s].stacks.errors.push_back("not read: four stack reads are running already");
      for (std::size_t s : slots) out[s].stacks.python = "not read";
    }
    boost::asio::post(io_, [done = std::move(done), out = std::move(out)]() mutable { done(std::move(out)); });
    return;
  }
  stacks::CollectOptions o;
  o.native = q.native;
  o.budget = q.budget;
  if (opts_.run_as) o.as = stacks::Credentials{opts_.run_as->uid, opts_.run_as->gid, opts_.run_as->groups};
  auto& read = reads.emplace_back();
  read.thread = std::jthread([&io = io_, over = read.over, o, targets = std::move(targets), slots = std::move(slots),
                              out = std::move(out), done = std::move(done)]() mutable {
    auto got = stacks::collect(targets, o);
    for (std::size_t i = 0; i < got.size() && i < slots.size(); ++i) out[slots[i]].stacks = std::move(got[i]);
    boost::asio::post(io, [done = std::move(done), out = std::move(out)]() mutable { done(std::move(out)); });
    over->store(true);
  });
}

}  // namespace ddp::launch

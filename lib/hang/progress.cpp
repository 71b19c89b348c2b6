// See progress.hpp: the definition of progress, and why.
#include "hang/progress.hpp"

#include <algorithm>

namespace ddp::hang {

Millis sample_interval(Millis timeout) {
  return std::clamp<Millis>(timeout / 8, Millis(1000), Millis(60'000));
}

std::uint64_t fingerprint(const std::vector<stacks::Frame>& python) {
  std::uint64_t h = 14695981039346656037ull;
  auto mix = [&h](std::string_view s) {
    for (unsigned char c : s) {
      h ^= c;
      h *= 1099511628211ull;
    }
    h ^= 0xff;  // a separator: ("ab","c") and ("a","bc") differ
    h *= 1099511628211ull;
  };
  for (const auto& f : python) {
    mix(f.function);
    mix(f.file);
    mix(std::to_string(f.line));
  }
  return h;
}

bool inside_torch_distributed(const std::vector<stacks::Frame>& python) {
  for (const auto& f : python) {
    const auto at = f.file.find("torch/distributed/");
    if (at == std::string::npos) continue;
    if (f.file.compare(at, 29, "torch/distributed/checkpoint/") == 0) continue;
    return true;
  }
  return false;
}

std::string_view why_name(Why w) {
  switch (w) {
    case Why::none:
      return "none";
    case Why::output:
      return "output";
    case Why::stack_changed:
      return "stack changed";
    case Why::cpu_outside_collective:
      return "CPU time outside torch.distributed";
    case Why::cpu_no_stack:
      return "CPU time (no Python stack)";
  }
  return "?";
}

void Watch::progressed(TimePoint when) {
  if (when <= last_) return;
  last_ = when;
  hung_ = false;  // the episode, if any, is over
}

Millis Watch::idle(TimePoint now) const {
  return now > last_ ? std::chrono::duration_cast<Millis>(now - last_) : Millis(0);
}

Watch::Verdict Watch::check(TimePoint now) {
  if (idle(now) < timeout_) return Verdict::progressing;
  if (hung_) return Verdict::still_hung;
  hung_ = true;
  return Verdict::hung_now;
}

RankProgress::RankProgress(Millis timeout, int nranks, TimePoint start)
    : ranks_(static_cast<std::size_t>(std::max(nranks, 0))), watch_(timeout, start) {
  for (auto& r : ranks_) r.last_progress = start;
}

TimePoint RankProgress::last_progress(int rank) const {
  if (rank < 0 || static_cast<std::size_t>(rank) >= ranks_.size()) return watch_.last_progress();
  return ranks_[static_cast<std::size_t>(rank)].last_progress;
}

Why RankProgress::on_sample(const Sample& s) {
  if (s.rank < 0 || static_cast<std::size_t>(s.rank) >= ranks_.size()) return Why::none;
  auto& r = ranks_[static_cast<std::size_t>(s.rank)];
  // A sample older than the previous one (never from our edge) says nothing new.
  if (r.previous && s.when < r.previous->when) return Why::none;
  Why why = Why::none;
  if (s.output) {
    why = Why::output;
  } else if (!r.previous) {
    // Nothing to compare with: the rank's start already counts as progress.
    why = Why::none;
  } else {
    const auto& p = *r.previous;
    const bool cpu_moved = s.cpu_ticks && p.cpu_ticks && *s.cpu_ticks > *p.cpu_ticks;
    if (s.stack && p.stack && *s.stack != *p.stack) {
      why = Why::stack_changed;
    } else if (s.stack.has_value() != p.stack.has_value()) {
      // The stack became readable (Python started) or stopped being: the process changed.
      why = Why::stack_changed;
    } else if (cpu_moved && s.stack && !s.in_torch_distributed) {
      why = Why::cpu_outside_collective;
    } else if (cpu_moved && !s.stack) {
      why = Why::cpu_no_stack;
    }
  }
  r.previous = s;
  if (why != Why::none) {
    r.last_progress = std::max(r.last_progress, s.when);
    watch_.progressed(s.when);
  }
  return why;
}

std::optional<Millis> NodeReporter::update(const Watch& w, TimePoint now) {
  const Millis idle = w.idle(now);
  if (!idle_ && idle >= threshold_) {
    idle_ = true;
    return std::max(idle, Millis(1));  // 0 means "progressing"
  }
  if (idle_ && idle < threshold_) {
    idle_ = false;
    return Millis(0);
  }
  return std::nullopt;
}

void NodeProgress::on_report(const std::string& node, Millis idle, TimePoint now) {
  auto it = std::find_if(nodes_.begin(), nodes_.end(), [&](const auto& n) { return n.first == node; });
  if (it == nodes_.end()) it = nodes_.insert(nodes_.end(), {node, Node{}});
  it->second.idle = idle.count() > 0;
  it->second.last_progress = std::max(start_, now - idle);
  if (!it->second.idle) hung_ = false;
}

void NodeProgress::forget(const std::string& node) {
  std::erase_if(nodes_, [&](const auto& n) { return n.first == node; });
}

void NodeProgress::reset(TimePoint start) {
  start_ = start;
  nodes_.clear();
  hung_ = false;
}

std::optional<TimePoint> NodeProgress::last_progress(const std::vector<std::string>& nodes, TimePoint now) const {
  if (nodes.empty()) return std::nullopt;
  TimePoint youngest = start_;
  for (const auto& name : nodes) {
    auto it = std::find_if(nodes_.begin(), nodes_.end(), [&](const auto& n) { return n.first == name; });
    if (it == nodes_.end() || !it->second.idle) return now;  // progressing, as far as we know
    youngest = std::max(youngest, it->second.last_progress);
  }
  return youngest;
}

Watch::Verdict NodeProgress::check(const std::vector<std::string>& nodes, TimePoint now) {
  const auto last = last_progress(nodes, now);
  // An episode ends only when a node says it progressed (on_report): an idle stretch that has
  // not reached the timeout neither starts nor ends one.
  if (!last || now - *last < timeout_) return Watch::Verdict::progressing;
  if (hung_) return Watch::Verdict::still_hung;
  hung_ = true;
  return Watch::Verdict::hung_now;
}

}  // namespace ddp::hang

// Formatting of the store's wait report (see report.hpp).
#include "store/report.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace ddp::store {

std::string printable_key(std::string_view key) {
  std::string out;
  for (std::size_t i = 0; i < key.size() && i < 80; ++i) {
    const auto c = static_cast<unsigned char>(key[i]);
    if (c >= 0x20 && c < 0x7F && c != '\\' && c != '`')  // a backtick would end the quote around it
      out.push_back(static_cast<char>(c));
    else
      out += fmt::format("\\x{:02x}", c);
  }
  if (key.size() > 80) out += fmt::format("... ({} bytes)", key.size());
  return out;
}

std::string format_wait_report(const WaitReport& report, int world_size, Clock::time_point now) {
  struct Line {
    Clock::time_point oldest;
    std::string text;
  };
  std::vector<Line> lines;
  for (const auto& wk : report.waited) {
    if (wk.waiters.empty()) continue;
    Clock::time_point oldest = wk.waiters.front().since;
    std::vector<int> ranks, pids;
    std::size_t unknown = 0;
    for (const auto& w : wk.waiters) {
      oldest = std::min(oldest, w.since);
      if (w.rank) {
        ranks.push_back(*w.rank);
      } else if (w.pid) {
        pids.push_back(*w.pid);
      } else {
        ++unknown;
      }
    }
    const std::size_t n = std::max(wk.total, wk.waiters.size());
    std::string who =
        world_size > 0 ? fmt::format("{}/{} ranks", n, world_size) : fmt::format("{} client{}", n, n == 1 ? "" : "s");
    auto secs = std::chrono::duration_cast<std::chrono::seconds>(now - oldest).count();
    if (secs < 0) secs = 0;
    std::string text = fmt::format("{} {} on `{}` for {} s", who, wk.barrier ? "in a barrier" : "waiting",
                                   printable_key(wk.key), secs);
    std::vector<std::string> named;
    if (!ranks.empty())
      named.push_back(fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", format_rank_list(ranks)));
    if (!pids.empty()) {
      std::sort(pids.begin(), pids.end());
      std::string list;
      for (int p : pids) {
        if (!list.empty()) list += ',';
        list += std::to_string(p);
      }
      named.push_back(fmt::format("{} {}", pids.size() == 1 ? "pid" : "pids", list));
    }
    if (unknown > 0 && !named.empty()) named.push_back(fmt::format("{} unidentified", unknown));
    if (n > wk.waiters.size()) named.push_back(fmt::format("{} more not listed", n - wk.waiters.size()));
    if (!named.empty()) {
      text += " (";
      for (std::size_t i = 0; i < named.size(); ++i) {
        if (i > 0) text += "; ";
        text += named[i];
      }
      text += ")";
    }
    if (wk.barrier) {
      text += "; barrier not reached";
    } else if (wk.deleted) {
      text += "; it was set, then deleted";
    } else {
      text += "; set by nobody";
    }
    lines.push_back({oldest, std::move(text)});
  }
  std::stable_sort(lines.begin(), lines.end(), [](const Line& a, const Line& b) { return a.oldest < b.oldest; });
  std::string out;
  for (std::size_t i = 0; i < lines.size() && i < kMaxReportLines; ++i) {
    if (!out.empty()) out += '\n';
    out += lines[i].text;
  }
  const std::size_t total = std::max(report.waited_keys, lines.size());
  const std::size_t shown = std::min(lines.size(), kMaxReportLines);
  if (total > shown) {
    const auto more = total - shown;
    if (!out.empty()) out += '\n';
    out += fmt::format("... and {} more key{} waited for", more, more == 1 ? "" : "s");
  }
  return out;
}

}  // namespace ddp::store

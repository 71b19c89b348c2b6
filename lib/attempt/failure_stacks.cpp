// See failure_stacks.hpp.
#include "attempt/failure_stacks.hpp"

#include "common/strings.hpp"
#include "common/text.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <stdexcept>

namespace ddp::launch {

using nlohmann::json;

namespace {

// Printable, valid UTF-8, at most kMaxStackString bytes: a name from the job's memory may hold
// terminal escapes or broken sequences, which would reach a terminal or throw in a JSON dump.
std::string clean(std::string_view s) {
  return clean_text(s, kMaxStackString);
}

void bound_frames(std::vector<stacks::Frame>& frames, bool& truncated) {
  if (frames.size() > kMaxStackFrames) {
    frames.resize(kMaxStackFrames);
    truncated = true;
  }
  for (auto& f : frames) {
    if (f.line < 0) f.line = 0;  // -1: the reader's "no location"; 0 prints as '?'
    f.function = clean(f.function);
    f.file = clean(f.file);
  }
}

// At most `n` bytes, not cutting a UTF-8 sequence (the string is valid UTF-8: clean() made it).
std::string clip_utf8(const std::string& s, std::size_t n) {
  if (s.size() <= n) return s;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xc0) == 0x80) --n;
  return s.substr(0, n);
}

std::string base_name(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// A frame of the interpreter or an installed package, not of the job's own code.
bool library_frame(const stacks::Frame& f) {
  return f.file.find("/site-packages/") != std::string::npos || f.file.find("/dist-packages/") != std::string::npos ||
         f.file.find("/lib/python3") != std::string::npos || f.file.starts_with("<frozen");
}

std::string short_frame(const stacks::Frame& f) {
  return fmt::format("{} ({}:{})", f.function, base_name(f.file), f.line > 0 ? std::to_string(f.line) : "?");
}

// "all_reduce (distributed_c10d.py:1320) <- step (train.py:42)": the innermost frame, then the
// job's own frame that led there (or, when the innermost is the job's own, its caller).
std::string place(const std::vector<stacks::Frame>& frames) {
  if (frames.empty()) return "?";
  std::string out = short_frame(frames[0]);
  std::size_t next = 1;
  if (library_frame(frames[0])) {
    while (next < frames.size() && library_frame(frames[next])) ++next;
  }
  if (next < frames.size()) out += " <- " + short_frame(frames[next]);
  return out;
}

const json& need(const json& j, const char* key, bool (json::*is)() const noexcept, const char* what) {
  if (!j.is_object() || !j.contains(key) || !(j.at(key).*is)())
    throw std::invalid_argument(fmt::format("stacks: field '{}' must be {}", key, what));
  return j.at(key);
}
std::string str(const json& j, const char* key) {
  return clean(need(j, key, &json::is_string, "a string").get_ref<const std::string&>());
}
long long num(const json& j, const char* key, long long lo, long long hi) {
  const auto v = need(j, key, &json::is_number_integer, "an integer").get<long long>();
  if (v < lo || v > hi) throw std::invalid_argument(fmt::format("stacks: field '{}' is out of range", key));
  return v;
}
// A line number is the job's to choose (co_firstlineno, -1 for "no location"): a wrong one is
// not worth the report it travels in.
int line_of(const json& j) {
  const auto& v = need(j, "line", &json::is_number_integer, "an integer");
  if (v.is_number_unsigned()) return static_cast<int>(std::min<std::uint64_t>(v.get<std::uint64_t>(), 1u << 30));
  return static_cast<int>(std::clamp<long long>(v.get<long long>(), 0, 1 << 30));
}

}  // namespace

void bound_stacks(stacks::ProcessStacks& p) {
  std::erase_if(p.threads, [](const stacks::ThreadStack& t) { return t.python.empty() && t.native.empty(); });
  if (p.threads.size() > kMaxStackThreads) {
    p.errors.push_back(fmt::format("{} threads with frames; the first {} kept", p.threads.size(), kMaxStackThreads));
    p.threads.resize(kMaxStackThreads);
  }
  for (auto& t : p.threads) {
    t.name = clean(t.name);
    bound_frames(t.python, t.truncated);
    bound_frames(t.native, t.truncated);
  }
  p.python = clean(p.python);
  if (p.errors.size() > 4) p.errors.resize(4);
  for (auto& e : p.errors) e = clean(e);
}

json to_wire(const FailureStacks& s) {
  json ranks = json::array();
  std::size_t bytes = 0, left_out = 0;
  auto encode = [](const stacks::RankStacks& r, bool main_only) {
    json threads = json::array();
    for (const auto& t : r.stacks.threads) {
      if (main_only && !t.main) continue;
      json frames = json::array();
      for (const auto& f : t.python)
        frames.push_back({{"function", f.function}, {"file", f.file}, {"line", std::max(f.line, 0)}});
      threads.push_back(
          {{"tid", t.tid}, {"name", t.name}, {"main", t.main}, {"truncated", t.truncated}, {"python", frames}});
    }
    auto errors = r.stacks.errors;
    if (main_only) errors.push_back("only the main thread's stack was kept: the others were too large to send");
    return json{{"rank", r.rank},
                {"node", r.node},
                {"pid", r.stacks.pid},
                {"python", r.stacks.python},
                {"python_ok", r.stacks.python_ok},
                {"errors", errors},
                {"threads", threads}};
  };
  auto size_of = [](const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace).size(); };
  for (const auto& r : s.ranks) {
    // One rank may have a large share; a rank too large for what is left keeps its main thread.
    auto rj = encode(r, false);
    auto size = size_of(rj);
    if (bytes + size > kMaxWireBytes || size > kMaxWireBytes / 8) {
      rj = encode(r, true);
      size = size_of(rj);
    }
    if (bytes + size > kMaxWireBytes || ranks.size() >= kMaxWireRanks) {
      ++left_out;
      continue;
    }
    bytes += size;
    ranks.push_back(std::move(rj));
  }
  auto notes = s.notes;
  if (left_out)
    notes.push_back(fmt::format("the stacks of {} rank(s) were left out: over {} KiB", left_out, kMaxWireBytes >> 10));
  if (notes.size() > 8) notes.resize(8);
  return {{"ranks", ranks}, {"notes", notes}, {"file", s.file}};
}

FailureStacks from_wire(const json& j, const std::string& node) {
  FailureStacks s;
  const auto& ranks = need(j, "ranks", &json::is_array, "an array");
  if (ranks.size() > kMaxWireRanks) throw std::invalid_argument("stacks: too many ranks");
  for (const auto& rj : ranks) {
    stacks::RankStacks r;
    r.rank = static_cast<int>(num(rj, "rank", 0, 1 << 30));
    r.node = node.empty() ? str(rj, "node") : node;
    r.stacks.pid = static_cast<int>(num(rj, "pid", 0, 1 << 22));
    r.stacks.python = str(rj, "python");
    r.stacks.python_ok = need(rj, "python_ok", &json::is_boolean, "true or false").get<bool>();
    for (const auto& e : need(rj, "errors", &json::is_array, "an array")) {
      if (!e.is_string()) throw std::invalid_argument("stacks: field 'errors' must hold strings");
      if (r.stacks.errors.size() < 4) r.stacks.errors.push_back(clean(e.get_ref<const std::string&>()));
    }
    for (const auto& tj : need(rj, "threads", &json::is_array, "an array")) {
      if (r.stacks.threads.size() >= kMaxStackThreads) break;
      stacks::ThreadStack t;
      t.tid = static_cast<int>(num(tj, "tid", 0, 1 << 22));
      t.name = str(tj, "name");
      t.main = need(tj, "main", &json::is_boolean, "true or false").get<bool>();
      t.truncated = need(tj, "truncated", &json::is_boolean, "true or false").get<bool>();
      for (const auto& fj : need(tj, "python", &json::is_array, "an array")) {
        if (t.python.size() >= kMaxStackFrames) {
          t.truncated = true;
          break;
        }
        t.python.push_back({stacks::Frame::Kind::python, str(fj, "function"), str(fj, "file"), line_of(fj), 0});
      }
      r.stacks.threads.push_back(std::move(t));
    }
    s.ranks.push_back(std::move(r));
  }
  for (const auto& n : need(j, "notes", &json::is_array, "an array")) {
    if (!n.is_string()) throw std::invalid_argument("stacks: field 'notes' must hold strings");
    if (s.notes.size() < 8) s.notes.push_back(clean(n.get_ref<const std::string&>()));
  }
  s.file = str(j, "file");
  return s;
}

void keep_own_ranks(FailureStacks& s, int base, int count) {
  std::set<int> seen;
  const auto before = s.ranks.size();
  std::erase_if(s.ranks, [&](const stacks::RankStacks& r) {
    return r.rank < base || r.rank >= base + count || !seen.insert(r.rank).second;
  });
  if (const auto dropped = before - s.ranks.size()) {
    const auto what =
        dropped == 1 ? std::string("1 rank it does not hold") : fmt::format("{} ranks it does not hold", dropped);
    s.notes.push_back(count > 0 ? fmt::format("{} ({} {}) {} left out", what, rank_range(base, count),
                                              count == 1 ? "is its" : "are its", dropped == 1 ? "was" : "were")
                                : fmt::format("{} {} left out", what, dropped == 1 ? "was" : "were"));
  }
}

std::vector<std::string> summary_lines(const FailureStacks& s) {
  std::vector<std::string> out;
  const auto groups = stacks::merge(s.ranks, {.main_thread_only = true});
  // Nodes are named only when there is more than one to tell apart (not on a local launch).
  std::set<std::string> nodes;
  for (const auto& r : s.ranks) nodes.insert(r.node);
  for (std::size_t i = 0; i < groups.size() && i < kSummaryGroups; ++i) {
    const auto& g = groups[i];
    std::string who = fmt::format("{} {}", g.ranks.size() == 1 ? "rank" : "ranks", stacks::format_ranks(g.ranks));
    if (who.size() > 80) who = fmt::format("{} ranks from {} to {}", g.ranks.size(), g.ranks.front(), g.ranks.back());
    if (nodes.size() > 1 && !g.nodes.empty()) {
      who += " on " + g.nodes.front();
      if (g.nodes.size() > 1)
        who += fmt::format(" and {} other node{}", g.nodes.size() - 1, g.nodes.size() == 2 ? "" : "s");
    }
    if (!g.note.empty()) {
      out.push_back(fmt::format("{}: no stack ({})", who, g.note.substr(0, 200)));
    } else {
      out.push_back(fmt::format("{} {} in {}", who, g.ranks.size() == 1 ? "was" : "were", place(g.python)));
    }
  }
  if (groups.size() > kSummaryGroups)
    out.push_back(fmt::format("... and {} more groups", groups.size() - kSummaryGroups));
  for (const auto& n : s.notes) out.push_back(n);
  return out;
}

std::string full_text(const FailureStacks& s, int world_size) {
  std::string out = stacks::render_text(stacks::merge(s.ranks), world_size);
  for (const auto& n : s.notes) out += n + "\n";
  return out;
}

json report_json(const FailureStacks& s) {
  return {{"groups", stacks::to_json(stacks::merge(s.ranks))}, {"notes", s.notes}, {"file", s.file}};
}

json stacks_summary_json(const FailureStacks& s, bool with_lines) {
  json lines = json::array();
  if (with_lines) {
    auto all = summary_lines(s);
    if (all.size() > kSummaryMessageLines) {
      const auto more = all.size() - (kSummaryMessageLines - 1);
      all.resize(kSummaryMessageLines - 1);
      all.push_back(fmt::format("... and {} more lines (the file has them)", more));
    }
    for (auto& l : all) {
      if (l.size() > kMaxStackString) l = clip_utf8(l, kMaxStackString);
      lines.push_back(std::move(l));
    }
  }
  return {{"summary", lines}, {"file", s.file}};
}

}  // namespace ddp::launch

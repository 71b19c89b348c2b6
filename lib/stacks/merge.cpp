// See merge.hpp.
#include "stacks/merge.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

namespace ddp::stacks {

namespace {

std::string key_of(const std::vector<Frame>& python, const std::vector<Frame>& native) {
  std::string k;
  for (const auto& f : python) k += "P\x1f" + f.function + "\x1f" + f.file + "\x1f" + std::to_string(f.line) + "\x1e";
  k += "\x1d";
  for (const auto& f : native) k += "N\x1f" + f.function + "\x1f" + f.file + "\x1e";
  return k;
}

std::string hex(std::uint64_t v) {
  std::ostringstream s;
  s << "0x" << std::hex << v;
  return s.str();
}

std::string frame_text(const Frame& f) {
  if (f.kind == Frame::Kind::python)
    return f.function + " (" + f.file + ":" + (f.line > 0 ? std::to_string(f.line) : std::string("?")) + ")";
  return f.function + (f.function != "??" ? "+" + hex(f.offset) : "") + " (" + (f.file.empty() ? "?" : f.file) + ")";
}

}  // namespace

std::vector<Group> merge(const std::vector<RankStacks>& ranks, const MergeOptions& options) {
  std::map<std::string, Group> by_key;
  auto add = [&](const std::string& key, const RankStacks& r, const ThreadStack* t, auto&& fill) {
    auto [it, fresh] = by_key.try_emplace(key);
    if (fresh) fill(it->second);
    Member m{r.rank, r.node, r.stacks.pid, t ? t->tid : 0, t ? t->name : "", t ? t->main : false};
    it->second.members.push_back(std::move(m));
  };
  for (const auto& r : ranks) {
    bool any = false;
    for (const auto& t : r.stacks.threads) {
      if (options.main_thread_only && !t.main) continue;
      if (t.python.empty() && t.native.empty()) continue;
      any = true;
      add(key_of(t.python, t.native), r, &t, [&](Group& g) {
        g.python = t.python;
        g.native = t.native;
      });
    }
    if (!any) {
      // No frame at all: say why, so that the rank is still named.
      std::string note = !r.stacks.errors.empty() ? r.stacks.errors.front()
                         : !r.stacks.python_ok    ? r.stacks.python
                                                  : "no Python frames (idle interpreter, or between frames)";
      add("E\x1f" + note, r, nullptr, [&](Group& g) { g.note = note; });
    }
  }
  std::vector<Group> out;
  out.reserve(by_key.size());
  for (auto& [key, g] : by_key) {
    std::sort(g.members.begin(), g.members.end(), [](const Member& a, const Member& b) {
      return std::tuple(a.rank, !a.main, a.tid) < std::tuple(b.rank, !b.main, b.tid);
    });
    std::set<int> rs;
    std::set<std::string> ns;
    for (const auto& m : g.members) {
      rs.insert(m.rank);
      if (!m.node.empty()) ns.insert(m.node);
    }
    g.ranks.assign(rs.begin(), rs.end());
    g.nodes.assign(ns.begin(), ns.end());
    out.push_back(std::move(g));
  }
  // Smallest first; then the lowest rank; then (for equal rank sets) the main thread's group
  // before the others, then the stack itself, so that the order never depends on input order.
  std::sort(out.begin(), out.end(), [](const Group& a, const Group& b) {
    const bool am = a.members.front().main, bm = b.members.front().main;
    return std::tuple(a.ranks.size(), a.ranks, !am, key_of(a.python, a.native), a.note) <
           std::tuple(b.ranks.size(), b.ranks, !bm, key_of(b.python, b.native), b.note);
  });
  return out;
}

std::string format_ranks(const std::vector<int>& r) {
  std::string out;
  for (std::size_t i = 0; i < r.size();) {
    std::size_t j = i;
    while (j + 1 < r.size() && r[j + 1] == r[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(r[i]);
    if (j > i) {
      out += j == i + 1 ? ',' : '-';
      out += std::to_string(r[j]);
    }
    i = j + 1;
  }
  return out;
}

std::string render_text(const std::vector<Group>& groups, int total_ranks) {
  std::ostringstream s;
  for (const auto& g : groups) {
    s << (g.ranks.size() == 1 ? "rank " : "ranks ") << format_ranks(g.ranks) << " (" << g.ranks.size() << " of "
      << total_ranks << ")";
    if (!g.nodes.empty()) {
      s << " on ";
      for (std::size_t i = 0; i < g.nodes.size() && i < 8; ++i) s << (i ? "," : "") << g.nodes[i];
      if (g.nodes.size() > 8) s << " +" << g.nodes.size() - 8 << " more";
    }
    if (g.note.empty()) {
      std::set<std::string> names;
      for (const auto& m : g.members) names.insert(m.thread);
      if (g.members.size() == 1)
        s << ", thread " << g.members[0].thread << " (tid " << g.members[0].tid << ")";
      else if (names.size() == 1)
        s << ", " << g.members.size() << " threads " << *names.begin();
      else
        s << ", " << g.members.size() << " threads";
    }
    s << ":\n";
    if (!g.note.empty()) s << "    " << g.note << "\n";
    for (const auto& f : g.python) s << "    " << frame_text(f) << "\n";
    if (!g.native.empty()) {
      if (!g.python.empty()) s << "  native:\n";
      for (const auto& f : g.native) s << "    " << frame_text(f) << "\n";
    }
  }
  return s.str();
}

namespace {

nlohmann::json frames_json(const std::vector<Frame>& frames) {
  auto a = nlohmann::json::array();
  for (const auto& f : frames) {
    if (f.kind == Frame::Kind::python)
      a.push_back({{"function", f.function}, {"file", f.file}, {"line", f.line}});
    else
      a.push_back({{"function", f.function}, {"module", f.file}, {"offset", f.offset}});
  }
  return a;
}

}  // namespace

nlohmann::json to_json(const std::vector<Group>& groups) {
  auto a = nlohmann::json::array();
  for (const auto& g : groups) {
    auto members = nlohmann::json::array();
    for (const auto& m : g.members)
      members.push_back({{"rank", m.rank}, {"node", m.node}, {"pid", m.pid}, {"tid", m.tid}, {"thread", m.thread}});
    nlohmann::json j{{"ranks", g.ranks},   {"ranks_text", format_ranks(g.ranks)}, {"nodes", g.nodes},
                     {"members", members}, {"python", frames_json(g.python)},     {"native", frames_json(g.native)}};
    if (!g.note.empty()) j["note"] = g.note;
    a.push_back(std::move(j));
  }
  return a;
}

nlohmann::json to_json(const ProcessStacks& p) {
  auto threads = nlohmann::json::array();
  for (const auto& t : p.threads)
    threads.push_back({{"tid", t.tid},
                       {"name", t.name},
                       {"main", t.main},
                       {"python", frames_json(t.python)},
                       {"native", frames_json(t.native)},
                       {"truncated", t.truncated},
                       {"native_stop_ms", t.native_stop_ms}});
  return {{"pid", p.pid},
          {"python", p.python},
          {"python_ok", p.python_ok},
          {"threads", threads},
          {"errors", p.errors},
          {"timing",
           {{"read_ms", p.timing.read_ms},
            {"native_stop_max_ms", p.timing.native_stop_max_ms},
            {"native_stop_total_ms", p.timing.native_stop_total_ms},
            {"memory_reads", p.timing.memory_reads}}}};
}

}  // namespace ddp::stacks

#include "hang/flight.hpp"

#include "common/json_parse.hpp"
#include "common/strings.hpp"
#include "common/text.hpp"
#include "stacks/merge.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <tuple>

namespace ddp::hang {

using nlohmann::json;

namespace {

std::string text(const json& j, const char* key, std::size_t max = 128) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return {};
  return clean_text(it->get_ref<const std::string&>(), max);
}

std::int64_t integer(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) return 0;
  if (it->is_number_integer()) return it->get<std::int64_t>();
  if (it->is_number_unsigned())
    return static_cast<std::int64_t>(std::min<std::uint64_t>(it->get<std::uint64_t>(), INT64_MAX));
  return 0;
}

std::vector<std::vector<std::int64_t>> shapes(const json& j, const char* key) {
  std::vector<std::vector<std::int64_t>> out;
  auto it = j.find(key);
  if (it == j.end() || !it->is_array()) return out;
  for (const auto& t : *it) {
    if (out.size() >= 8) break;
    if (!t.is_array()) continue;
    std::vector<std::int64_t> dims;
    for (const auto& d : t) {
      if (dims.size() >= 8) break;
      dims.push_back(d.is_number_integer() ? d.get<std::int64_t>() : 0);
    }
    out.push_back(std::move(dims));
  }
  return out;
}

std::vector<std::string> strings(const json& j, const char* key) {
  std::vector<std::string> out;
  auto it = j.find(key);
  if (it == j.end() || !it->is_array()) return out;
  for (const auto& s : *it) {
    if (out.size() >= 8) break;
    out.push_back(s.is_string() ? clean_text(s.get_ref<const std::string&>(), 64) : std::string("?"));
  }
  return out;
}

FlightState state_of(std::string_view s) {
  if (s == "scheduled") return FlightState::scheduled;
  if (s == "started") return FlightState::started;
  if (s == "completed") return FlightState::completed;
  return FlightState::unknown;
}

std::string short_op(std::string_view op) {
  if (auto colon = op.find(':'); colon != std::string_view::npos) op.remove_prefix(colon + 1);
  return op.empty() ? std::string("(unnamed op)") : std::string(op);
}

bool contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

// What must be equal on every rank for the same collective: the op always; the sizes and dtypes
// only where the collective requires it (gather, scatter and all_to_all differ legitimately).
std::string signature(const FlightEntry& e) {
  const auto op = short_op(e.op);
  std::string sig = op;
  auto add = [&sig](const std::vector<std::vector<std::int64_t>>& s, const std::vector<std::string>& d) {
    for (const auto& t : s) {
      sig += " [";
      for (std::size_t i = 0; i < t.size(); ++i) {
        if (i) sig += ',';  // appended: GCC 12's -Wrestrict misfires on ("," or "") + string
        sig += std::to_string(t[i]);
      }
      sig += "]";
    }
    for (const auto& x : d) sig += " " + x;
  };
  const bool reduce_scatter = contains(op, "reduce_scatter");
  const bool all_gather = contains(op, "all_gather") || contains(op, "allgather");
  if (reduce_scatter)
    add(e.out, e.out_dtypes);
  else if (all_gather)
    add(e.in, e.in_dtypes);
  else if (contains(op, "all_reduce") || contains(op, "allreduce") || contains(op, "broadcast") || op == "reduce") {
    add(e.in, e.in_dtypes);
  }
  return sig;
}

std::string rank_word(const std::vector<int>& r) {
  return r.size() == 1 ? "rank" : "ranks";
}

std::string ranks_text(const std::vector<int>& r) {
  return rank_word(r) + " " + stacks::format_ranks(r);
}

std::string shape_text(const std::vector<std::vector<std::int64_t>>& s) {
  std::string out;
  for (const auto& t : s) {
    out += out.empty() ? "[" : " [";
    for (std::size_t i = 0; i < t.size(); ++i) {
      if (i) out += ',';
      out += std::to_string(t[i]);
    }
    out += "]";
  }
  return out;
}

void describe(Finding& f, const FlightEntry& e) {
  f.op = short_op(e.op);
  const bool use_out = e.in.empty();
  f.sizes = use_out ? e.out : e.in;
  f.dtypes = use_out ? e.out_dtypes : e.in_dtypes;
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < f.sizes.size(); ++i) {
    const auto size = i < f.dtypes.size() ? dtype_size(f.dtypes[i]) : std::nullopt;
    if (!size) return;
    std::uint64_t n = *size;
    for (auto d : f.sizes[i]) {
      if (d < 0 || (d != 0 && n > UINT64_MAX / static_cast<std::uint64_t>(d))) return;
      n *= static_cast<std::uint64_t>(d);
    }
    if (total > UINT64_MAX - n) return;
    total += n;
  }
  if (!f.sizes.empty()) f.bytes = total;
}

struct GroupView {
  std::string desc;
  std::vector<int> members;
  bool known = false;
};

// The per-group verdict, with the time it happened (the ahead ranks' earliest entry) to order
// groups by.
struct Candidate {
  Finding finding;
  std::int64_t t = 0;
};

}  // namespace

std::optional<std::uint64_t> dtype_size(std::string_view n) {
  static const std::map<std::string_view, std::uint64_t> sizes{{"Float", 4},
                                                               {"Double", 8},
                                                               {"Half", 2},
                                                               {"BFloat16", 2},
                                                               {"ComplexFloat", 8},
                                                               {"ComplexDouble", 16},
                                                               {"ComplexHalf", 4},
                                                               {"Long", 8},
                                                               {"Int", 4},
                                                               {"Short", 2},
                                                               {"Char", 1},
                                                               {"Byte", 1},
                                                               {"Bool", 1},
                                                               {"UInt16", 2},
                                                               {"UInt32", 4},
                                                               {"UInt64", 8},
                                                               {"Float8_e4m3fn", 1},
                                                               {"Float8_e5m2", 1},
                                                               {"Float8_e4m3fnuz", 1},
                                                               {"Float8_e5m2fnuz", 1},
                                                               {"Float8_e8m0fnu", 1},
                                                               {"QInt8", 1},
                                                               {"QUInt8", 1},
                                                               {"QInt32", 4}};
  auto it = sizes.find(n);
  if (it == sizes.end()) return std::nullopt;
  return it->second;
}

std::string format_bytes(std::uint64_t n) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  double v = static_cast<double>(n);
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  if (u == 0) return fmt::format("{} B", n);
  if (v == static_cast<double>(static_cast<std::uint64_t>(v)))
    return fmt::format("{} {}", static_cast<std::uint64_t>(v), units[u]);
  return fmt::format("{:.1f} {}", v, units[u]);
}

RankDump parse_summary(std::string_view line) {
  RankDump d;
  if (line.size() > kMaxSummaryBytes) {
    d.error = fmt::format("summary of {} bytes, more than {}", line.size(), kMaxSummaryBytes);
    return d;
  }
  auto read = parse_json(line, kMaxSummaryDepth);
  if (read.too_deep) {
    d.error = "summary nested too deep";
    return d;
  }
  if (!read.ok()) {
    d.error = "not a summary: " + read.error;  // where and what, never the line's own bytes
    return d;
  }
  const json& j = read.value;
  if (!j.is_object()) {
    d.error = "not a summary: not a JSON object";
    return d;
  }
  if (auto it = j.find("rank"); it != j.end() && it->is_number_integer()) {
    const auto r = it->get<std::int64_t>();
    if (r >= 0 && r < (1 << 24)) d.rank = static_cast<int>(r);
  }
  d.version = text(j, "version", 32);
  if (auto e = text(j, "error", 512); !e.empty()) {
    d.error = e;
    return d;
  }
  if (d.rank < 0) {
    d.error = "the dump's file name carries no rank";
    return d;
  }
  if (auto g = j.find("groups"); g != j.end() && g->is_object()) {
    for (const auto& [name, info] : g->items()) {
      if (d.groups.size() >= kMaxGroups) break;
      if (!info.is_object()) continue;
      std::vector<int> ranks;
      if (auto r = info.find("ranks"); r != info.end() && r->is_array()) {
        for (const auto& x : *r) {
          if (ranks.size() >= kMaxGroupRanks) break;
          if (x.is_number_integer() && x.get<std::int64_t>() >= 0 && x.get<std::int64_t>() < (1 << 24))
            ranks.push_back(static_cast<int>(x.get<std::int64_t>()));
        }
      }
      std::sort(ranks.begin(), ranks.end());
      ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
      d.groups[clean_text(name, 128)] = std::move(ranks);
    }
  }
  if (auto es = j.find("entries"); es != j.end() && es->is_array()) {
    for (const auto& e : *es) {
      if (d.entries.size() >= kMaxEntries) break;
      if (!e.is_object()) continue;
      FlightEntry fe;
      fe.pg = text(e, "pg");
      fe.desc = text(e, "desc");
      const auto seq = integer(e, "seq");
      if (seq < 0) continue;
      fe.seq = static_cast<std::uint64_t>(seq);
      if (auto p = e.find("p2p"); p != e.end() && p->is_boolean()) fe.p2p = p->get<bool>();
      fe.op = text(e, "op");
      fe.in = shapes(e, "in");
      fe.out = shapes(e, "out");
      fe.in_dtypes = strings(e, "in_dtypes");
      fe.out_dtypes = strings(e, "out_dtypes");
      fe.state = state_of(text(e, "state"));
      fe.t = integer(e, "t");
      d.entries.push_back(std::move(fe));
    }
  } else {
    d.error = "not a summary: no entries";
  }
  return d;
}

json to_json(const RankDump& d) {
  static const char* states[] = {"scheduled", "started", "completed", ""};
  json j{{"file", d.rank >= 0 ? "nccl-flight-rank-" + std::to_string(d.rank) : std::string()}, {"rank", d.rank}};
  if (!d.error.empty()) {
    j["error"] = d.error;
    return j;
  }
  j["version"] = d.version;
  json groups = json::object();
  for (const auto& [name, ranks] : d.groups) groups[name] = {{"ranks", ranks}};
  j["groups"] = std::move(groups);
  json es = json::array();
  for (const auto& e : d.entries) {
    es.push_back({{"pg", e.pg},
                  {"desc", e.desc},
                  {"seq", e.seq},
                  {"p2p", e.p2p},
                  {"op", e.op},
                  {"in", e.in},
                  {"out", e.out},
                  {"in_dtypes", e.in_dtypes},
                  {"out_dtypes", e.out_dtypes},
                  {"state", states[static_cast<int>(e.state)]},
                  {"t", e.t}});
  }
  j["entries"] = std::move(es);
  return j;
}

void take_node_summaries(std::vector<RankDump>& all, const std::string& node, int first, int count,
                         const nlohmann::json& summaries) {
  if (!summaries.is_array()) return;
  std::erase_if(all, [&node](const RankDump& d) { return d.node == node; });
  std::set<int> seen;
  for (const auto& s : summaries) {
    auto d = parse_summary(s.dump(-1, ' ', false, json::error_handler_t::replace));
    if (d.rank < first || d.rank >= first + count || !seen.insert(d.rank).second) continue;
    d.node = node;
    all.push_back(std::move(d));
  }
}

bool fit_summaries(std::vector<RankDump>& dumps, std::size_t max_bytes) {
  auto size = [&dumps] {
    std::size_t n = 2;
    for (const auto& d : dumps) n += to_json(d).dump().size() + 1;
    return n;
  };
  for (std::size_t keep = 64; size() > max_bytes; keep /= 2) {
    if (keep == 0) {
      for (auto& d : dumps) {
        d.entries.clear();
        d.groups.clear();
        if (d.error.empty()) d.error = "the node's summaries did not fit in one message";
      }
      return size() <= max_bytes;
    }
    // The newest `keep` entries of each group (collective and p2p apart) stay.
    for (auto& d : dumps) {
      std::map<std::pair<std::string, bool>, std::size_t> seen;
      std::vector<FlightEntry> kept;
      for (auto it = d.entries.rbegin(); it != d.entries.rend(); ++it)
        if (seen[{it->pg, it->p2p}]++ < keep) kept.push_back(std::move(*it));
      d.entries.assign(std::make_move_iterator(kept.rbegin()), std::make_move_iterator(kept.rend()));
    }
  }
  return true;
}

Finding analyze(const std::vector<RankDump>& dumps, int world_size) {
  Finding f;
  std::map<int, const RankDump*> ok;
  std::set<int> expected;
  for (int r = 0; r < world_size; ++r) expected.insert(r);
  for (const auto& d : dumps) {
    if (d.rank < 0) continue;
    expected.insert(d.rank);
    if (!d.error.empty()) {
      f.errors.emplace(d.rank, d.error);
      continue;
    }
    ok.emplace(d.rank, &d);  // a second dump of the same rank: the first counts
  }
  for (int r : expected)
    if (!ok.count(r)) f.missing.push_back(r);
  if (ok.empty()) return f;

  // The groups, and who is in them: as the dumps' pg_config says, else (the default group) every
  // expected rank, else the ranks that recorded something in it.
  std::map<std::string, GroupView> groups;
  for (const auto& [rank, d] : ok) {
    for (const auto& [name, ranks] : d->groups) {
      auto& g = groups[name];
      if (!g.known && !ranks.empty()) {
        g.members = ranks;
        g.known = true;
      }
    }
    for (const auto& e : d->entries) {
      auto& g = groups[e.pg];
      if (g.desc.empty()) g.desc = e.desc;
    }
  }
  for (auto& [name, g] : groups) {
    if (g.known) continue;
    if (name == "0") {
      g.members.assign(expected.begin(), expected.end());
      continue;
    }
    for (const auto& [rank, d] : ok)
      if (std::any_of(d->entries.begin(), d->entries.end(), [&](const FlightEntry& e) { return e.pg == name; }))
        g.members.push_back(rank);
  }

  std::vector<Candidate> diverged;
  std::optional<Candidate> agreed;
  for (const auto& [name, g] : groups) {
    struct Progress {
      std::uint64_t entered = 0, completed = 0;
      std::map<std::uint64_t, const FlightEntry*> by_seq;
    };
    std::map<int, Progress> progress;
    for (int r : g.members) {
      auto it = ok.find(r);
      if (it == ok.end()) continue;
      auto& p = progress[r];
      for (const auto& e : it->second->entries) {
        if (e.p2p || e.pg != name) continue;
        p.entered = std::max(p.entered, e.seq);
        if (e.state == FlightState::completed) p.completed = std::max(p.completed, e.seq);
        p.by_seq[e.seq] = &e;
      }
    }
    if (progress.empty()) continue;

    auto base = [&](Finding::Kind kind, std::uint64_t seq) {
      Finding x;
      x.kind = kind;
      x.pg = name;
      x.desc = g.desc;
      x.seq = seq;
      return x;
    };
    // The entry of `seq` on the first of `ranks` that has it, and the earliest time among them.
    auto entry_of = [&](const std::vector<int>& ranks, std::uint64_t seq, std::int64_t& t) -> const FlightEntry* {
      const FlightEntry* first = nullptr;
      for (int r : ranks) {
        auto it = progress[r].by_seq.find(seq);
        if (it == progress[r].by_seq.end()) continue;
        if (!first) first = it->second;
        if (it->second->t > 0 && (t == 0 || it->second->t < t)) t = it->second->t;
      }
      return first;
    };

    std::uint64_t lo = UINT64_MAX, hi = 0, clo = UINT64_MAX;
    for (const auto& [r, p] : progress) {
      lo = std::min(lo, p.entered);
      hi = std::max(hi, p.entered);
      clo = std::min(clo, p.completed);
    }
    std::optional<Candidate> here;
    std::uint64_t diverged_at = UINT64_MAX;
    if (lo < hi) {
      const auto s = lo + 1;
      Candidate c{base(Finding::Kind::not_entered, s)};
      for (const auto& [r, p] : progress) (p.entered >= s ? c.finding.ahead : c.finding.behind).push_back(r);
      if (auto* e = entry_of(c.finding.ahead, s, c.t)) describe(c.finding, *e);
      here = std::move(c);
      diverged_at = s;
    } else if (hi > 0 && clo < hi) {
      const auto s = clo + 1;
      Candidate c{base(Finding::Kind::not_completed, s)};
      for (const auto& [r, p] : progress) (p.completed >= s ? c.finding.ahead : c.finding.behind).push_back(r);
      std::vector<int> all;
      for (const auto& [r, p] : progress) all.push_back(r);
      if (auto* e = entry_of(c.finding.ahead.empty() ? all : c.finding.behind, s, c.t)) describe(c.finding, *e);
      here = std::move(c);
      diverged_at = s;
    }

    // The first sequence number where ranks recorded different calls: the cause, where it comes
    // no later than the divergence.
    std::map<std::uint64_t, std::map<std::string, std::vector<int>>> calls;
    for (const auto& [r, p] : progress)
      for (const auto& [seq, e] : p.by_seq)
        if (seq <= diverged_at) calls[seq][signature(*e)].push_back(r);
    for (const auto& [seq, variants] : calls) {
      if (variants.size() < 2) continue;
      Candidate c{base(Finding::Kind::mismatch, seq)};
      std::vector<std::pair<std::vector<int>, std::string>> ordered;
      for (const auto& [sig, ranks] : variants) ordered.emplace_back(ranks, sig);
      std::sort(ordered.begin(), ordered.end());
      c.finding.ahead = ordered.front().first;
      for (std::size_t i = 1; i < ordered.size(); ++i)
        c.finding.behind.insert(c.finding.behind.end(), ordered[i].first.begin(), ordered[i].first.end());
      std::sort(c.finding.behind.begin(), c.finding.behind.end());
      for (std::size_t i = 0; i < ordered.size() && i < 4; ++i)
        c.finding.detail += fmt::format("{}{}: {}", i ? "; " : "", ranks_text(ordered[i].first), ordered[i].second);
      if (ordered.size() > 4) c.finding.detail += fmt::format("; {} more variants", ordered.size() - 4);
      if (auto* e = entry_of(c.finding.ahead, seq, c.t)) describe(c.finding, *e);
      here = std::move(c);
      break;
    }

    if (here) {
      diverged.push_back(std::move(*here));
    } else if (hi > 0 && (!agreed || name == "0")) {
      Candidate c{base(Finding::Kind::agree, hi)};
      for (const auto& [r, p] : progress) c.finding.ahead.push_back(r);
      if (auto* e = entry_of(c.finding.ahead, hi, c.t)) describe(c.finding, *e);
      agreed = std::move(c);
    }
  }

  auto keep_context = [&f](Finding x) {
    x.missing = std::move(f.missing);
    x.errors = std::move(f.errors);
    return x;
  };
  if (!diverged.empty()) {
    // The earliest divergence (by the time the ahead ranks recorded it; unknown times last), then
    // the group's name: a later group's hang is most often the consequence of an earlier one's.
    std::stable_sort(diverged.begin(), diverged.end(), [](const Candidate& a, const Candidate& b) {
      const auto ta = a.t > 0 ? a.t : INT64_MAX, tb = b.t > 0 ? b.t : INT64_MAX;
      return std::tie(ta, a.finding.pg) < std::tie(tb, b.finding.pg);
    });
    return keep_context(std::move(diverged.front().finding));
  }

  // No collective diverged: point-to-point ops still pending, the oldest first.
  const FlightEntry* oldest = nullptr;
  std::set<int> waiting;
  for (const auto& [rank, d] : ok) {
    for (const auto& e : d->entries) {
      if (!e.p2p || e.state == FlightState::completed) continue;
      waiting.insert(rank);
      if (!oldest || (e.t > 0 && (oldest->t == 0 || e.t < oldest->t))) oldest = &e;
    }
  }
  if (oldest) {
    Finding x;
    x.kind = Finding::Kind::p2p_pending;
    x.pg = oldest->pg;
    x.desc = oldest->desc;
    x.seq = oldest->seq;
    x.ahead.assign(waiting.begin(), waiting.end());
    describe(x, *oldest);
    return keep_context(std::move(x));
  }
  if (agreed) return keep_context(std::move(agreed->finding));
  Finding x;
  x.kind = Finding::Kind::agree;
  for (const auto& [rank, d] : ok) x.ahead.push_back(rank);
  return keep_context(std::move(x));
}

std::string format_finding(const Finding& f) {
  auto what = [&f] {
    std::string s = fmt::format("{} #{} (pg {}", f.op, f.seq, f.pg);
    if (f.bytes)
      s += ", " + format_bytes(*f.bytes);
    else if (!f.sizes.empty())
      s += ", " + shape_text(f.sizes);
    return s + ")";
  };
  std::string out = "flight recorder: ";
  switch (f.kind) {
    case Finding::Kind::no_data:
      out += "no rank's dump could be read";
      break;
    case Finding::Kind::not_entered:
      out += fmt::format("{} entered {}, {} did not", ranks_text(f.ahead), what(), ranks_text(f.behind));
      break;
    case Finding::Kind::not_completed:
      if (f.ahead.empty()) {
        out += fmt::format("{} entered {} and none completed it", ranks_text(f.behind), what());
      } else {
        out += fmt::format("all entered {}; {} completed it, {} did not", what(), ranks_text(f.ahead),
                           ranks_text(f.behind));
      }
      break;
    case Finding::Kind::mismatch:
      out += fmt::format("collective #{} of pg {} differs between ranks: {}", f.seq, f.pg, f.detail);
      break;
    case Finding::Kind::p2p_pending:
      out += fmt::format("no collective diverged; {} wait{} in point-to-point {} (first pending)", ranks_text(f.ahead),
                         f.ahead.size() == 1 ? "s" : "", what());
      break;
    case Finding::Kind::agree:
      if (f.op.empty())
        out += fmt::format("{} recorded no collective", ranks_text(f.ahead));
      else
        out += fmt::format("{} agree: the last collective, {}, completed on all", ranks_text(f.ahead), what());
      break;
  }
  if (!f.missing.empty()) out += fmt::format("; no dump from {}", ranks_text(f.missing));
  if (!f.errors.empty()) {
    const auto& [rank, why] = *f.errors.begin();
    out += fmt::format(" (rank {}'s: {}{})", rank, why,
                       f.errors.size() > 1 ? fmt::format(", and {} more", f.errors.size() - 1) : "");
  }
  return out;
}

json to_json(const Finding& f) {
  static const char* kinds[] = {"agree", "not_entered", "not_completed", "mismatch", "p2p_pending", "no_data"};
  json j{{"kind", kinds[static_cast<int>(f.kind)]}, {"ahead", f.ahead}, {"behind", f.behind}, {"missing", f.missing}};
  if (!f.pg.empty()) {
    j["pg"] = f.pg;
    j["pg_desc"] = f.desc;
    j["seq"] = f.seq;
    j["op"] = f.op;
    j["sizes"] = f.sizes;
    j["dtypes"] = f.dtypes;
    if (f.bytes) j["bytes"] = *f.bytes;
  }
  if (!f.detail.empty()) j["detail"] = f.detail;
  if (!f.errors.empty()) {
    json e = json::object();
    for (const auto& [r, why] : f.errors) e[std::to_string(r)] = why;
    j["errors"] = e;
  }
  j["text"] = format_finding(f);
  return j;
}

}  // namespace ddp::hang

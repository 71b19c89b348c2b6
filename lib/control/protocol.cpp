#include "control/protocol.hpp"

#include "common/duration.hpp"
#include "common/strings.hpp"
#include "control/paths.hpp"

#include <fmt/format.h>

namespace ddp::control {

using nlohmann::json;

namespace {

constexpr int kMaxRank = 1 << 20;

std::string age(double seconds) {
  if (seconds < 0) return "-";
  if (seconds < 60) return fmt::format("{:.1f} s ago", seconds);
  return format_duration(Millis(static_cast<long long>(seconds * 1000))) + " ago";
}

}  // namespace

Request parse_request(std::string_view line) {
  if (line.size() > kMaxRequestBytes) throw ControlError("request too long");
  auto j = json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw ControlError("a request is one JSON object on one line");
  auto op = j.find("op");
  if (op == j.end() || !op->is_string()) throw ControlError("a request needs \"op\": status, stop, logs or stacks");
  Request r;
  const auto name = op->get<std::string>();
  if (name == "status")
    r.op = Op::status;
  else if (name == "stop")
    r.op = Op::stop;
  else if (name == "logs")
    r.op = Op::logs;
  else if (name == "stacks")
    r.op = Op::stacks;
  else
    throw ControlError(fmt::format("unknown op '{}' (status, stop, logs or stacks)", name));
  for (const auto& [k, v] : j.items()) {
    if (k == "op") continue;
    const bool takes = (r.op == Op::logs && (k == "ranks" || k == "follow" || k == "attempt")) ||
                       (r.op == Op::stacks && (k == "ranks" || k == "native"));
    if (!takes) throw ControlError(fmt::format("'{}' does not take '{}'", name, k));
    if (k == "attempt") {
      if (v.is_string() && v.get<std::string>() == "all")
        r.attempt = kEveryAttempt;
      else if (v.is_number_integer() && v.get<long long>() >= 0 && v.get<long long>() <= kMaxAttempt)
        r.attempt = v.get<int>();
      else
        throw ControlError("'attempt' must be an attempt number (0 is the first) or \"all\"");
    } else if (k == "follow" || k == "native") {
      if (!v.is_boolean()) throw ControlError(fmt::format("'{}' must be true or false", k));
      (k == "follow" ? r.follow : r.native) = v.get<bool>();
    } else {
      if (!v.is_array()) throw ControlError("'ranks' must be a list of rank numbers");
      for (const auto& x : v) {
        if (!x.is_number_integer() || x.get<long long>() < 0 || x.get<long long>() > kMaxRank) {
          throw ControlError("'ranks' must be a list of rank numbers");
        }
        r.ranks.insert(x.get<int>());
      }
    }
  }
  return r;
}

std::string encode_request(const Request& r) {
  json j{{"op", r.op == Op::status ? "status" : r.op == Op::stop ? "stop" : r.op == Op::logs ? "logs" : "stacks"}};
  if (r.op == Op::logs) {
    j["ranks"] = r.ranks;
    j["follow"] = r.follow;
    if (r.attempt) j["attempt"] = *r.attempt == kEveryAttempt ? json("all") : json(*r.attempt);
  }
  if (r.op == Op::stacks) {
    j["ranks"] = r.ranks;
    j["native"] = r.native;
  }
  return j.dump() + "\n";
}

std::set<int> parse_rank_list(std::string_view text) {
  std::set<int> out;
  for (auto part : split(text, ',')) {
    part = trim(part);
    if (part.empty()) continue;  // "0,3," as typed
    auto bad = [&] {
      return ControlError(fmt::format("--ranks: expected rank numbers such as 0,3 or 4-7, got '{}'", part));
    };
    auto dash = part.find('-');
    auto lo = parse_int(part.substr(0, dash));
    auto hi = dash == std::string_view::npos ? lo : parse_int(part.substr(dash + 1));
    if (!lo || !hi || *lo < 0 || *hi < *lo || *hi > kMaxRank || *hi - *lo > 65536) throw bad();
    for (auto r = *lo; r <= *hi; ++r) out.insert(static_cast<int>(r));
  }
  if (out.empty()) throw ControlError("--ranks: no rank given");
  return out;
}

std::optional<std::string> ranks_outside(const std::set<int>& wanted, int world_size) {
  std::vector<std::string> missing;
  for (int r : wanted) {
    if (r < 0 || r >= world_size) missing.push_back(std::to_string(r));
  }
  if (missing.empty()) return std::nullopt;
  constexpr std::size_t kShown = 8;
  auto named = join_first(missing, ", ", kShown);
  const auto has = world_size <= 0   ? std::string("no ranks")
                   : world_size == 1 ? std::string("rank 0")
                                     : fmt::format("ranks 0-{}", world_size - 1);
  return fmt::format("the job has no rank{} {} (it has {})", missing.size() == 1 ? "" : "s", named, has);
}

std::string format_status(const json& s, std::int64_t now_unix_ms) {
  std::string out;
  const auto started = s.value("started_unix_ms", now_unix_ms);
  out += fmt::format("job {} ({}, ddpctl pid {}): {}, attempt {}, restarts {}/{}, up {:.0f} s\n",
                     s.value("job_id", "?"), s.value("mode", "?"), s.value("pid", 0), s.value("state", "?"),
                     s.value("attempt", 0), s.value("restarts", 0), s.value("max_restarts", 0),
                     static_cast<double>(std::max<std::int64_t>(0, now_unix_ms - started)) / 1000.0);
  // An empty store: not up yet (a multi-node job's node rank 0 starts it once the round is
  // complete); its waiters are then not worth a line either.
  const bool store_up =
      s.contains("store") && s["store"].is_string() && !s["store"].get_ref<const std::string&>().empty();
  if (s.contains("store")) out += fmt::format("store: {}\n", store_up ? s["store"].get<std::string>() : "not up yet");
  if (s.contains("nodes") && s["nodes"].is_array() && !s["nodes"].empty()) {
    out += "nodes:";
    for (const auto& n : s["nodes"]) out += fmt::format(" {}", n.is_string() ? n.get<std::string>() : n.dump());
    out += "\n";
  }
  const auto ranks = s.value("ranks", json::array());
  if (ranks.empty())
    out += "ranks: none started yet\n";
  else
    out += fmt::format("{:>5}  {:<16} {:>8}  {:<24} {}\n", "rank", "node", "pid", "state", "last output");
  for (const auto& r : ranks) {
    const auto pid =
        r.contains("pid") && r["pid"].is_number_integer() ? std::to_string(r["pid"].get<long long>()) : "-";
    const double a = r.contains("last_output_age_s") && r["last_output_age_s"].is_number()
                         ? r["last_output_age_s"].get<double>()
                         : -1;
    out += fmt::format("{:>5}  {:<16} {:>8}  {:<24} {}\n", r.value("rank", -1), r.value("node", "?"), pid,
                       r.value("state", "?"), a < 0 ? "never" : age(a));
  }
  const auto waiters = s.value("store_waiters", json::array());
  if (!waiters.empty()) {
    out += "store waiters:\n";
    for (const auto& w : waiters) out += fmt::format("  {}\n", w.is_string() ? w.get<std::string>() : w.dump());
  } else if (s.contains("store_waiters") && store_up) {
    out += "store waiters: none\n";
  }
  return out;
}

std::optional<LogLine> parse_log_line(std::string_view line) {
  auto sp = line.find(' ');
  if (sp == std::string_view::npos) return std::nullopt;
  auto rest = line.substr(sp + 1);
  for (const char* s : {"out", "err"}) {
    const auto tag = fmt::format("{}| ", s);
    if (rest.starts_with(tag)) return LogLine{s, std::string(rest.substr(tag.size()))};
  }
  return std::nullopt;
}

}  // namespace ddp::control

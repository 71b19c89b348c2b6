#include "shepherd/messages.hpp"

#include "stacks/collect.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <limits>
#include <vector>

namespace ddp::shepherd {

using nlohmann::json;

namespace {

// Strict readers: the field must exist with the right JSON type and a value in range.
const json& need(const json& j, const char* key) {
  if (!j.is_object()) throw MessageError(fmt::format("expected an object holding '{}'", key));
  auto it = j.find(key);
  if (it == j.end()) throw MessageError(fmt::format("missing field '{}'", key));
  return *it;
}

long long get_int(const json& j, const char* key, long long lo, long long hi) {
  const auto& v = need(j, key);
  if (!v.is_number_integer()) throw MessageError(fmt::format("field '{}': expected an integer", key));
  const auto n = v.get<long long>();
  if (n < lo || n > hi) throw MessageError(fmt::format("field '{}': {} is out of range [{}, {}]", key, n, lo, hi));
  return n;
}

std::string get_str(const json& j, const char* key) {
  const auto& v = need(j, key);
  if (!v.is_string()) throw MessageError(fmt::format("field '{}': expected a string", key));
  return v.get<std::string>();
}

bool get_bool(const json& j, const char* key) {
  const auto& v = need(j, key);
  if (!v.is_boolean()) throw MessageError(fmt::format("field '{}': expected true or false", key));
  return v.get<bool>();
}

const json& get_array(const json& j, const char* key) {
  const auto& v = need(j, key);
  if (!v.is_array()) throw MessageError(fmt::format("field '{}': expected an array", key));
  return v;
}

const json& get_object(const json& j, const char* key) {
  const auto& v = need(j, key);
  if (!v.is_object()) throw MessageError(fmt::format("field '{}': expected an object", key));
  return v;
}

std::vector<std::string> get_strings(const json& j, const char* key) {
  std::vector<std::string> out;
  for (const auto& v : get_array(j, key)) {
    if (!v.is_string()) throw MessageError(fmt::format("field '{}': expected strings only", key));
    out.push_back(v.get<std::string>());
  }
  return out;
}

constexpr long long kMaxInt = std::numeric_limits<int>::max();
constexpr long long kMaxPid = 1ll << 22;  // the kernel's PID_MAX_LIMIT

std::int64_t to_us(launch::SysTime t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}
launch::SysTime from_us(long long us) {
  return launch::SysTime(std::chrono::duration_cast<launch::SysTime::duration>(std::chrono::microseconds(us)));
}

json exit_to_json(const launch::WorkerExit& e) {
  return {{"rank", e.rank},           {"local_rank", e.local_rank}, {"pid", e.pid},
          {"exit_code", e.exit_code}, {"signal", e.signal},         {"when_us", to_us(e.when)},
          {"started", e.started},     {"forwarded", e.forwarded},   {"after_stop", e.after_stop}};
}

launch::WorkerExit exit_from_json(const json& j) {
  launch::WorkerExit e;
  e.rank = static_cast<int>(get_int(j, "rank", 0, kMaxInt));
  e.local_rank = static_cast<int>(get_int(j, "local_rank", 0, kMaxInt));
  e.pid = static_cast<pid_t>(get_int(j, "pid", -1, kMaxPid));
  e.exit_code = static_cast<int>(get_int(j, "exit_code", 0, 255));
  e.signal = static_cast<int>(get_int(j, "signal", 0, 64));
  e.when = from_us(get_int(j, "when_us", 0, std::numeric_limits<long long>::max()));
  e.started = get_bool(j, "started");
  e.forwarded = j.contains("forwarded") && get_bool(j, "forwarded");
  e.after_stop = j.contains("after_stop") && get_bool(j, "after_stop");
  return e;
}

constexpr std::array kPhases{launch::Phase::running, launch::Phase::stopping, launch::Phase::succeeded,
                             launch::Phase::failed, launch::Phase::stopped};

json with_type(std::string_view type, json body) {
  body["type"] = type;
  return body;
}

}  // namespace

std::string message_type(const json& m, Sender from) {
  if (!m.is_object()) throw MessageError("a message must be a JSON object");
  const auto type = get_str(m, "type");
  static const std::vector<std::string_view> kFromAgent{"start", "stop", "kill", "forward", "stacks"};
  static const std::vector<std::string_view> kFromShepherd{"started",  "line",        "first_failure",
                                                           "finished", "stacks_read", "progress"};
  const auto& known = from == Sender::agent ? kFromAgent : kFromShepherd;
  if (std::find(known.begin(), known.end(), type) == known.end()) {
    throw MessageError(
        fmt::format("'{}' is not a message the {} sends", type, from == Sender::agent ? "agent" : "shepherd"));
  }
  return type;
}

json encode_start(const StartAttempt& s) {
  json ranks = json::array();
  for (const auto& r : s.plan.ranks) {
    json rj{{"rank", r.rank},
            {"local_rank", r.local_rank},
            {"node", r.node},
            {"argv", r.argv},
            {"env", r.env},
            {"log_file", r.log_file},
            {"error_file", r.error_file},
            {"binding", r.binding},
            {"cpus", r.cpus}};
    if (r.mem_node) rj["mem_node"] = *r.mem_node;
    if (r.container) {
      rj["container"] = {{"runtime", r.container->runtime},
                         {"image", r.container->image},
                         {"name", r.container->name},
                         {"env_file", r.container->env_file},
                         {"env", r.container->env}};
    }
    ranks.push_back(std::move(rj));
  }
  json options{{"attempt", s.options.attempt},
               {"workdir", s.options.workdir},
               {"stop_grace_ms", s.options.stop_grace.count()},
               {"log_max_bytes", s.options.log_max_bytes}};
  if (!s.options.log_root.empty()) options["log_root"] = s.options.log_root;
  if (s.options.hang_timeout.count() > 0) options["hang_timeout_ms"] = s.options.hang_timeout.count();
  if (const auto& u = s.options.run_as) options["run_as"] = {{"uid", u->uid}, {"gid", u->gid}, {"groups", u->groups}};
  return with_type("start",
                   {{"attempt_dir", s.attempt_dir},
                    {"options", std::move(options)},
                    {"plan", {{"job_id", s.plan.job_id}, {"world_size", s.plan.world_size}, {"ranks", ranks}}}});
}

StartAttempt decode_start(const json& m) {
  StartAttempt s;
  s.attempt_dir = get_str(m, "attempt_dir");
  const auto& o = get_object(m, "options");
  s.options.attempt = static_cast<int>(get_int(o, "attempt", 0, kMaxInt));
  s.options.workdir = get_str(o, "workdir");
  s.options.stop_grace = Millis(get_int(o, "stop_grace_ms", 0, 24ll * 3600 * 1000));
  s.options.log_max_bytes =
      static_cast<std::uint64_t>(get_int(o, "log_max_bytes", 0, std::numeric_limits<long long>::max()));
  if (o.contains("log_root")) s.options.log_root = get_str(o, "log_root");
  if (o.contains("hang_timeout_ms"))
    s.options.hang_timeout = Millis(get_int(o, "hang_timeout_ms", 1000, 7ll * 24 * 3600 * 1000));
  if (o.contains("run_as")) {
    const auto& u = get_object(o, "run_as");
    constexpr long long kMaxId = std::numeric_limits<std::uint32_t>::max() - 1;  // (uid_t)-1 means "unchanged"
    supervisor::RunAs r;
    r.uid = static_cast<uid_t>(get_int(u, "uid", 0, kMaxId));
    r.gid = static_cast<gid_t>(get_int(u, "gid", 0, kMaxId));
    for (const auto& g : get_array(u, "groups")) {
      if (!g.is_number_integer() || g.get<long long>() < 0 || g.get<long long>() > kMaxId) {
        throw MessageError("field 'groups': expected group ids");
      }
      r.groups.push_back(static_cast<gid_t>(g.get<long long>()));
    }
    s.options.run_as = std::move(r);
  }
  const auto& p = get_object(m, "plan");
  s.plan.job_id = get_str(p, "job_id");
  s.plan.world_size = static_cast<int>(get_int(p, "world_size", 1, kMaxInt));
  for (const auto& rj : get_array(p, "ranks")) {
    contract::RankPlan r;
    r.rank = static_cast<int>(get_int(rj, "rank", 0, kMaxInt));
    r.local_rank = static_cast<int>(get_int(rj, "local_rank", 0, kMaxInt));
    r.node = get_str(rj, "node");
    r.argv = get_strings(rj, "argv");
    if (r.argv.empty()) throw MessageError("field 'argv': empty command");
    for (const auto& [k, v] : get_object(rj, "env").items()) {
      if (!v.is_string()) throw MessageError(fmt::format("field 'env': {} is not a string", k));
      r.env[k] = v.get<std::string>();
    }
    r.log_file = get_str(rj, "log_file");
    r.error_file = get_str(rj, "error_file");
    r.binding = need(rj, "binding");
    for (const auto& c : get_array(rj, "cpus")) {
      if (!c.is_number_integer() || c.get<long long>() < 0 || c.get<long long>() > 65535) {
        throw MessageError("field 'cpus': expected CPU numbers");
      }
      r.cpus.push_back(c.get<int>());
    }
    if (rj.contains("mem_node")) r.mem_node = static_cast<int>(get_int(rj, "mem_node", 0, 65535));
    if (rj.contains("container")) {
      const auto& cj = get_object(rj, "container");
      contract::ContainerRun c{
          get_str(cj, "runtime"), get_str(cj, "image"), get_str(cj, "name"), get_str(cj, "env_file"), {}};
      if (!jobspec::runtime_from_name(c.runtime))
        throw MessageError(fmt::format("field 'runtime': '{}' is not a container runtime", c.runtime));
      for (const auto& [k, v] : get_object(cj, "env").items()) {
        if (!v.is_string()) throw MessageError(fmt::format("field 'container.env': {} is not a string", k));
        c.env[k] = v.get<std::string>();
      }
      r.container = std::move(c);
    }
    if (r.local_rank != static_cast<int>(s.plan.ranks.size())) {
      throw MessageError(fmt::format("rank {}: local ranks must count up from 0", r.rank));
    }
    s.plan.ranks.push_back(std::move(r));
  }
  if (s.plan.ranks.empty()) throw MessageError("field 'ranks': no rank to run");
  return s;
}

json encode_signal(std::string_view type, int signal) {
  return with_type(type, {{"signal", signal}});
}

int decode_signal(const json& m) {
  return static_cast<int>(get_int(m, "signal", 1, 64));
}

Millis decode_interrupt(const json& m) {
  if (!m.contains("interrupt_ms")) return Millis(0);
  return Millis(get_int(m, "interrupt_ms", 0, 24ll * 3600 * 1000));
}

json encode_started(const std::vector<pid_t>& pids) {
  return with_type("started", {{"pids", pids}});
}

std::vector<pid_t> decode_started(const json& m) {
  std::vector<pid_t> out;
  for (const auto& p : get_array(m, "pids")) {
    if (!p.is_number_integer() || p.get<long long>() < 0 || p.get<long long>() > kMaxPid) {
      throw MessageError("field 'pids': expected process ids (0: not started)");
    }
    out.push_back(p.get<pid_t>());
  }
  return out;
}

json encode_line(const Line& l) {
  return with_type(
      "line", {{"rank", l.rank}, {"stream", l.stream == supervisor::Stream::out ? "out" : "err"}, {"data", l.data}});
}

Line decode_line(const json& m) {
  Line l;
  l.rank = static_cast<int>(get_int(m, "rank", 0, kMaxInt));
  const auto stream = get_str(m, "stream");
  if (stream != "out" && stream != "err")
    throw MessageError(fmt::format("field 'stream': '{}' is neither out nor err", stream));
  l.stream = stream == "out" ? supervisor::Stream::out : supervisor::Stream::err;
  l.data = get_str(m, "data");
  if (l.data.size() > supervisor::kMaxLine) throw MessageError("field 'data': a line longer than 64 KiB");
  return l;
}

json encode_progress(const Progress& p) {
  return with_type("progress", {{"idle_ms", p.idle.count()}, {"stacks", p.stacks}});
}

Progress decode_progress(const json& m) {
  Progress p;
  p.idle = Millis(get_int(m, "idle_ms", 0, std::numeric_limits<std::int32_t>::max() * 1000ll));
  p.stacks = get_str(m, "stacks");
  if (p.stacks.size() > kMaxProgressStacks) throw MessageError("field 'stacks': longer than 60000 bytes");
  return p;
}

json encode_first_failure(const launch::WorkerExit& e) {
  return with_type("first_failure", {{"exit", exit_to_json(e)}});
}

launch::WorkerExit decode_first_failure(const json& m) {
  return exit_from_json(get_object(m, "exit"));
}

json encode_finished(const launch::AttemptReport& r) {
  json exits = json::array();
  for (const auto& e : r.exits) exits.push_back(exit_to_json(e));
  json report{{"attempt", r.attempt},
              {"started_us", to_us(r.started)},
              {"ended_us", to_us(r.ended)},
              {"phase", static_cast<int>(std::find(kPhases.begin(), kPhases.end(), r.phase) - kPhases.begin())},
              {"exits", exits},
              {"notes", r.notes},
              {"log_dir", r.log_dir}};
  if (r.first_failure) {
    const auto& f = *r.first_failure;
    json fj{{"exit", exit_to_json(f.exit)}, {"node", f.node}, {"last_lines", f.last_lines}, {"log_file", f.log_file}};
    if (f.error_file) {
      fj["error_file"] = {{"path", f.error_file->path},
                          {"message", f.error_file->message},
                          {"traceback", f.error_file->traceback},
                          {"raw", f.error_file->raw}};
    }
    report["first_failure"] = fj;
  }
  if (r.stacks) report["stacks"] = launch::to_wire(*r.stacks);
  return with_type("finished", {{"report", report}});
}

launch::AttemptReport decode_finished(const json& m) {
  const auto& j = get_object(m, "report");
  launch::AttemptReport r;
  r.attempt = static_cast<int>(get_int(j, "attempt", 0, kMaxInt));
  r.started = from_us(get_int(j, "started_us", 0, std::numeric_limits<long long>::max()));
  r.ended = from_us(get_int(j, "ended_us", 0, std::numeric_limits<long long>::max()));
  r.phase = kPhases.at(static_cast<std::size_t>(get_int(j, "phase", 0, static_cast<long long>(kPhases.size()) - 1)));
  for (const auto& e : get_array(j, "exits")) r.exits.push_back(exit_from_json(e));
  r.notes = get_strings(j, "notes");
  r.log_dir = get_str(j, "log_dir");
  if (j.contains("first_failure")) {
    const auto& fj = get_object(j, "first_failure");
    launch::RankFailure f;
    f.exit = exit_from_json(get_object(fj, "exit"));
    f.node = get_str(fj, "node");
    f.last_lines = get_strings(fj, "last_lines");
    f.log_file = get_str(fj, "log_file");
    if (fj.contains("error_file")) {
      const auto& ej = get_object(fj, "error_file");
      f.error_file =
          launch::ErrorFile{get_str(ej, "path"), get_str(ej, "message"), get_str(ej, "traceback"), get_str(ej, "raw")};
    }
    r.first_failure = std::move(f);
  }
  if (j.contains("stacks")) {
    try {
      r.stacks = launch::from_wire(get_object(j, "stacks"));
    } catch (const std::invalid_argument& e) {
      throw MessageError(e.what());
    }
  }
  return r;
}

json encode_stacks(const StacksRequest& r) {
  return with_type("stacks", {{"id", r.id},
                              {"local_ranks", r.query.local_ranks},
                              {"native", r.query.native},
                              {"budget_ms", r.query.budget.count()}});
}

StacksRequest decode_stacks(const json& m) {
  StacksRequest r;
  r.id = static_cast<std::uint64_t>(get_int(m, "id", 0, std::numeric_limits<long long>::max()));
  const auto& ranks = get_array(m, "local_ranks");
  if (ranks.size() > 65536) throw MessageError("field 'local_ranks': too many ranks");
  for (const auto& v : ranks) {
    if (!v.is_number_integer() || v.get<long long>() < 0 || v.get<long long>() > kMaxInt)
      throw MessageError("field 'local_ranks': expected rank numbers");
    r.query.local_ranks.push_back(v.get<int>());
  }
  r.query.native = get_bool(m, "native");
  r.query.budget = Millis(get_int(m, "budget_ms", 1, 600'000));
  return r;
}

json encode_stacks_read(StacksRead r) {
  auto encode = [&] {
    json ranks = json::array();
    for (const auto& x : r.ranks) ranks.push_back({{"rank", x.rank}, {"process", stacks::to_json(x.stacks)}});
    return with_type("stacks_read", {{"id", r.id}, {"ranks", ranks}});
  };
  auto m = encode();
  constexpr std::size_t kRoom = kMaxFrameBytes - (64u << 10);
  if (dump(m).size() <= kRoom) return m;
  for (auto& x : r.ranks) {
    for (auto& t : x.stacks.threads) t.native.clear();
    x.stacks.errors.push_back("native frames left out: the stacks of this node's ranks exceed 16 MiB");
  }
  m = encode();
  if (dump(m).size() <= kRoom) return m;
  for (auto& x : r.ranks) {
    std::erase_if(x.stacks.threads, [](const stacks::ThreadStack& t) { return !t.main; });
    x.stacks.errors.push_back("threads other than the main one left out: the stacks exceed 16 MiB");
  }
  return encode();
}

StacksRead decode_stacks_read(const json& m) {
  StacksRead r;
  r.id = static_cast<std::uint64_t>(get_int(m, "id", 0, std::numeric_limits<long long>::max()));
  const auto& ranks = get_array(m, "ranks");
  if (ranks.size() > 65536) throw MessageError("field 'ranks': too many ranks");
  for (const auto& x : ranks) {
    stacks::RankStacks rs;
    rs.rank = static_cast<int>(get_int(x, "rank", 0, kMaxInt));
    std::string error;
    auto p = stacks::process_from_json(get_object(x, "process"), error);
    if (!p) throw MessageError(fmt::format("rank {}: {}", rs.rank, error));
    rs.stacks = std::move(*p);
    r.ranks.push_back(std::move(rs));
  }
  return r;
}

std::string dump(const json& m) {
  return m.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace ddp::shepherd

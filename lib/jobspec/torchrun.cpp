#include "jobspec/torchrun.hpp"

#include "common/strings.hpp"
#include "jobspec/flags.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <set>

namespace ddp::jobspec {

namespace {

// One torchrun flag: every spelling any release from 1.13 on accepts (1.13: underscores only;
// 2.x: dashes too), argparse's dest (also the PET_<DEST> variable's name), whether it takes a
// value, and what ddpctl does with it (for --help).
struct Flag {
  std::vector<std::string> names;
  std::string dest;
  bool takes_value = true;
  std::string what;
};

const std::vector<Flag>& flags() {
  static const std::vector<Flag> table{
      {{"--nnodes"}, "nnodes", true, "1 (or 1:1) only; more nodes: ddpctl launch --nodes/--ssh/--slurm"},
      {{"--nproc-per-node", "--nproc_per_node"}, "nproc_per_node", true, "N, cpu, gpu or auto: the workers"},
      {{"--rdzv-backend", "--rdzv_backend"},
       "rdzv_backend",
       true,
       "static or c10d: accepted (ddpctl serves the store)"},
      {{"--rdzv-endpoint", "--rdzv_endpoint"},
       "rdzv_endpoint",
       true,
       "this machine only; its port is the store's if free"},
      {{"--rdzv-id", "--rdzv_id"}, "rdzv_id", true, "the job id starts with it (TORCHELASTIC_RUN_ID)"},
      {{"--rdzv-conf", "--rdzv_conf"}, "rdzv_conf", true, "ignored (one node: no rendezvous to tune)"},
      {{"--standalone"}, "standalone", false, "honoured: one node, a free store port"},
      {{"--max-restarts", "--max_restarts"}, "max_restarts", true, "restart.max_restarts"},
      {{"--monitor-interval", "--monitor_interval"},
       "monitor_interval",
       true,
       "ignored (ddpctl is told of exits, it does not poll)"},
      {{"--start-method", "--start_method"},
       "start_method",
       true,
       "ignored (for function entry points; a script is exec'd)"},
      {{"--role"}, "role", true, "default only (ROLE_NAME stays 'default')"},
      {{"-m", "--module"}, "module", false, "honoured: python -u -m MODULE"},
      {{"--no-python", "--no_python"}, "no_python", false, "honoured: the script is run as a program"},
      {{"--run-path", "--run_path"}, "run_path", false, "mapped: the script runs as python -u SCRIPT"},
      {{"--log-dir", "--log_dir"}, "log_dir", true, "logs.dir (ddpctl's layout: DIR/JOB/attempt-N/rank-R.log)"},
      {{"-r", "--redirects"}, "redirects", true, "3: nothing on the terminal (files keep it); others ignored"},
      {{"-t", "--tee"}, "tee", true, "honoured: ddpctl always writes the terminal and each rank's file"},
      {{"--local-ranks-filter", "--local_ranks_filter"},
       "local_ranks_filter",
       true,
       "honoured: only these ranks on the terminal"},
      {{"--log-line-prefix-template", "--log_line_prefix_template"},
       "log_line_prefix_template",
       true,
       "ignored (lines start with [RANK])"},
      {{"--node-rank", "--node_rank"}, "node_rank", true, "0 only"},
      {{"--master-addr", "--master_addr"}, "master_addr", true, "this machine only; workers get 127.0.0.1"},
      {{"--master-port", "--master_port"},
       "master_port",
       true,
       "the store's port, exactly (static backend, as torchrun)"},
      {{"--local-addr", "--local_addr"}, "local_addr", true, "ignored (one node)"},
      {{"--logs-specs", "--logs_specs"}, "logs_specs", true, "ignored (ddpctl writes its own logs)"},
      {{"--numa-binding", "--numa_binding"}, "numa_binding", true, "node or exclusive: binding.numa; others refused"},
      {{"--signals-to-handle", "--signals_to_handle"},
       "signals_to_handle",
       true,
       "ignored (ddpctl stops the job on TERM, INT, HUP, QUIT and passes USR1, USR2 on)"},
      {{"--shutdown-timeout", "--shutdown_timeout"},
       "shutdown_timeout",
       true,
       "stop.grace (seconds from SIGTERM to SIGKILL)"},
      {{"--virtual-local-rank", "--virtual_local_rank"},
       "virtual_local_rank",
       false,
       "refused (binding: {gpu: isolate} is near)"},
      {{"--duplicate-stdout-filters", "--duplicate_stdout_filters"}, "duplicate_stdout_filters", true, "ignored"},
      {{"--duplicate-stderr-filters", "--duplicate_stderr_filters"}, "duplicate_stderr_filters", true, "ignored"},
      {{"--event-log-handler", "--event_log_handler"}, "event_log_handler", true, "ignored"},
      {{"-h", "--help"}, "help", false, "this list"},
  };
  return table;
}

const Flag* by_name(std::string_view name) {
  for (const auto& f : flags()) {
    if (std::find(f.names.begin(), f.names.end(), name) != f.names.end()) return &f;
  }
  return nullptr;
}

std::vector<std::string> all_long_names() {
  std::vector<std::string> out;
  for (const auto& f : flags()) {
    for (const auto& n : f.names) {
      if (n.starts_with("--")) out.push_back(n);
    }
  }
  return out;
}

// argparse accepts any unique prefix of a long option (allow_abbrev); a prefix shared only by
// the spellings of one flag (--nproc: --nproc-per-node, --nproc_per_node) is that flag.
const Flag* resolve_long(const std::string& name) {
  if (auto* f = by_name(name)) return f;
  std::set<const Flag*> found;
  std::vector<std::string> candidates;
  for (const auto& f : flags()) {
    for (const auto& n : f.names) {
      if (n.starts_with("--") && n.starts_with(name)) found.insert(&f), candidates.push_back(n);
    }
  }
  if (found.size() > 1)
    throw TorchrunError(fmt::format("{} is ambiguous: it could be {}", name, join(candidates, ", ")));
  if (found.empty()) {
    auto hint = nearest(name, all_long_names());
    throw TorchrunError(fmt::format("{} is not a torchrun option{}; ddpctl torchrun --help lists them", name,
                                    hint ? fmt::format(" (did you mean {}?)", *hint) : ""));
  }
  return *found.begin();
}

struct Given {
  std::string value;
  std::string as;  // how the user wrote it: "--nproc_per_node" or "PET_NPROC_PER_NODE"
};

std::string upper(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::optional<bool> env_bool(const std::string& v) {
  if (v == "1" || v == "true" || v == "True") return true;
  if (v == "0" || v == "false" || v == "False" || v.empty()) return false;
  return std::nullopt;
}

// "N" or "MIN:MAX", torchrun's parse_min_max_nnodes.
std::pair<long long, long long> parse_nnodes(const Given& g) {
  auto parts = split(g.value, ':');
  std::optional<long long> lo = parse_int(trim(parts[0]));
  std::optional<long long> hi = parts.size() == 2 ? parse_int(trim(parts[1])) : lo;
  if (parts.size() > 2 || !lo || !hi || *lo < 1 || *hi < *lo) {
    throw TorchrunError(fmt::format("{} {}: expected N or MIN:MAX with 0 < MIN <= MAX", g.as, g.value));
  }
  return {*lo, *hi};
}

// Std.from_str: "0".."3", or "LOCAL_RANK:0..3,..." per rank.
std::map<int, int> parse_std(const Given& g) {
  const auto bad = [&] {
    return TorchrunError(
        fmt::format("{} {}: expected 0, 1, 2 or 3 (1 stdout, 2 stderr, 3 both), or per local rank "
                    "such as 0:3,1:1",
                    g.as, g.value));
  };
  std::map<int, int> out;
  if (auto v = parse_int(trim(g.value))) {
    if (*v < 0 || *v > 3) throw bad();
    out[-1] = static_cast<int>(*v);
    return out;
  }
  for (auto part : split(g.value, ',')) {
    auto kv = split(part, ':');
    if (kv.size() != 2) throw bad();
    auto r = parse_int(trim(kv[0])), v = parse_int(trim(kv[1]));
    if (!r || !v || *r < 0 || *v < 0 || *v > 3) throw bad();
    out[static_cast<int>(*r)] = static_cast<int>(*v);
  }
  return out;
}

std::optional<double> parse_number(const std::string& s) {
  try {
    std::size_t used = 0;
    const double d = std::stod(s, &used);
    if (used != s.size() || !std::isfinite(d)) return std::nullopt;
    return d;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// "host", "host:port", "[v6]:port", "v6" (torchrun's parse_rendezvous_endpoint).
std::pair<std::string, std::optional<std::string>> split_endpoint(const std::string& ep) {
  if (!ep.empty() && ep[0] == '[') {
    const auto close = ep.find(']');
    if (close != std::string::npos) {
      auto host = ep.substr(1, close - 1);
      if (close + 1 < ep.size() && ep[close + 1] == ':') return {host, ep.substr(close + 2)};
      return {host, std::nullopt};
    }
  }
  const auto colon = ep.rfind(':');
  if (colon == std::string::npos || ep.find(':') != colon) return {ep, std::nullopt};  // a bare IPv6 has several
  return {ep.substr(0, colon), ep.substr(colon + 1)};
}

std::string multi_node_refusal(const std::string& what, const std::string& script) {
  return fmt::format(
      "{}: ddpctl torchrun runs one node. For several, each running ddp-agentd: ddpctl launch "
      "--nodes node[1-2] -n N -- python3 {} ...; or reach them with --ssh (no daemon), or "
      "--slurm inside an allocation (README: multi-node)",
      what, script.empty() ? "train.py" : script);
}

}  // namespace

TorchrunPlan parse_torchrun(const std::vector<std::string>& args, const TorchrunContext& ctx) {
  TorchrunPlan plan;
  std::map<std::string, Given> given;  // by dest
  std::vector<std::string> script_and_args;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& w = args[i];
    if (w == "--") {
      script_and_args.assign(args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());
      break;
    }
    if (w.size() < 2 || w[0] != '-') {  // the script: the rest is its own (argparse REMAINDER)
      script_and_args.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
      break;
    }
    std::string name = w;
    std::optional<std::string> value;
    if (w.starts_with("--")) {
      if (auto eq = w.find('='); eq != std::string::npos) name = w.substr(0, eq), value = w.substr(eq + 1);
    } else if (w.size() > 2) {  // -r3, -r=3
      name = w.substr(0, 2);
      value = w[2] == '=' ? w.substr(3) : w.substr(2);
    }
    const Flag* f = name.starts_with("--") ? resolve_long(name) : by_name(name);
    if (!f) throw TorchrunError(fmt::format("{} is not a torchrun option; ddpctl torchrun --help lists them", name));
    if (!f->takes_value) {
      if (value) throw TorchrunError(fmt::format("{} takes no value, got '{}'", name, *value));
      value = "1";
    } else if (!value) {
      if (i + 1 >= args.size()) throw TorchrunError(fmt::format("{} expects a value", name));
      value = args[++i];
    }
    given[f->dest] = {*value, name};
  }
  // PET_<DEST>: torchrun's defaults from the environment; the command line wins.
  for (const auto& f : flags()) {
    if (f.dest == "help" || given.contains(f.dest)) continue;
    const auto var = "PET_" + upper(f.dest);
    if (auto it = ctx.env.find(var); it != ctx.env.end()) {
      if (!f.takes_value) {
        auto b = env_bool(it->second);
        if (!b) throw TorchrunError(fmt::format("{}={}: expected 0 or 1", var, it->second));
        if (!*b) continue;
      }
      given[f.dest] = {f.takes_value ? it->second : "1", var};
    }
  }
  auto has = [&](const std::string& dest) { return given.contains(dest); };
  auto note = [&](const std::string& dest, NoteKind kind, std::string text) {
    plan.notes.push_back({given.at(dest).as, kind, std::move(text)});
  };
  if (has("help")) {
    plan.help = true;
    return plan;
  }
  if (script_and_args.empty()) {
    throw TorchrunError("no training script: ddpctl torchrun [torchrun's options] train.py [its arguments]");
  }
  const std::string script = script_and_args[0];

  JobFlags jf;
  // Several nodes: refused, with the ddpctl way.
  if (has("nnodes")) {
    auto [lo, hi] = parse_nnodes(given.at("nnodes"));
    if (hi > 1) {
      throw TorchrunError(
          multi_node_refusal(fmt::format("{} {}", given.at("nnodes").as, given.at("nnodes").value), script));
    }
  }
  if (has("node_rank")) {
    auto r = parse_int(trim(given.at("node_rank").value));
    if (!r)
      throw TorchrunError(
          fmt::format("{} {}: expected an integer", given.at("node_rank").as, given.at("node_rank").value));
    if (*r != 0) throw TorchrunError(multi_node_refusal(fmt::format("{} {}", given.at("node_rank").as, *r), script));
  }
  const bool standalone = has("standalone");
  if (standalone) note("standalone", NoteKind::honoured, "one node, the store on a free port");
  std::string backend = has("rdzv_backend") ? given.at("rdzv_backend").value : "static";
  if (standalone) backend = "c10d";
  if (has("rdzv_backend")) {
    if (backend != "static" && backend != "c10d") {
      throw TorchrunError(
          fmt::format("{} {}: ddpctl serves the rendezvous and the store itself and needs no {} "
                      "server; drop it (static and c10d are accepted)",
                      given.at("rdzv_backend").as, backend, backend));
    }
    note("rdzv_backend", NoteKind::mapped,
         "ddpctl serves the store itself (the workers see TORCHELASTIC_USE_AGENT_STORE=True)");
  }
  if (has("rdzv_endpoint") && !given.at("rdzv_endpoint").value.empty()) {
    const auto& g = given.at("rdzv_endpoint");
    auto [host, port] = split_endpoint(g.value);
    if (!host.empty() && !(ctx.is_local && ctx.is_local(host))) {
      throw TorchrunError(multi_node_refusal(fmt::format("{} {} is not this machine", g.as, g.value), script));
    }
    if (port && !standalone) {
      auto p = parse_int(*port);
      if (!p || *p < 0 || *p > 65535) throw TorchrunError(fmt::format("{} {}: expected HOST:PORT", g.as, g.value));
      jf.store_port = std::to_string(*p);
      note("rdzv_endpoint", NoteKind::mapped,
           *p ? fmt::format("the store prefers port {} (a free one if it is taken)", *p)
              : "the store takes a free port");
    } else {
      note("rdzv_endpoint", NoteKind::mapped, "the store takes a free port");
    }
  }
  if (has("master_addr")) {
    const auto& g = given.at("master_addr");
    if (!(ctx.is_local && ctx.is_local(g.value))) {
      throw TorchrunError(multi_node_refusal(fmt::format("{} {} is not this machine", g.as, g.value), script));
    }
    note("master_addr", NoteKind::mapped, "the workers get MASTER_ADDR=127.0.0.1, where ddpctl's store listens");
  }
  bool port_explicit = false;
  if (has("master_port")) {
    const auto& g = given.at("master_port");
    auto p = parse_int(trim(g.value));
    if (!p || *p < 0 || *p > 65535)
      throw TorchrunError(fmt::format("{} {}: expected a port, 0 to 65535", g.as, g.value));
    if (backend == "static") {
      jf.store_port = std::to_string(*p);
      port_explicit = *p != 0;
      note("master_port", NoteKind::honoured, fmt::format("the store listens on port {}", *p));
    } else {
      note("master_port", NoteKind::ignored,
           fmt::format("{}: torchrun uses it with the static backend only",
                       standalone ? "--standalone" : "--rdzv-backend c10d"));
    }
  }
  if (!has("master_port") && !(has("rdzv_endpoint") && jf.store_port))
    jf.store_port = "29500";  // preferred, not demanded
  if (has("rdzv_id") && given.at("rdzv_id").value != "none") {
    jf.name = name_from_command({given.at("rdzv_id").value});
    note("rdzv_id", NoteKind::mapped,
         fmt::format("the job id starts with '{}' (TORCHELASTIC_RUN_ID is the job id)", *jf.name));
  }
  if (has("rdzv_conf") && !given.at("rdzv_conf").value.empty()) {
    note("rdzv_conf", NoteKind::ignored, "one node has no rendezvous to tune");
  }

  // The workers.
  if (has("nproc_per_node")) {
    const auto& g = given.at("nproc_per_node");
    const auto v = std::string(trim(g.value));
    if (v == "auto") {
      plan.nproc_auto = true;
      jf.nproc_per_node = "cpu";
    } else if (v == "cpu" || v == "gpu" || parse_int(v)) {
      jf.nproc_per_node = v;
    } else {
      throw TorchrunError(fmt::format("{} {}: ddpctl takes a number, cpu, gpu or auto", g.as, g.value));
    }
  }
  if (has("max_restarts")) jf.max_restarts = std::string(trim(given.at("max_restarts").value));
  if (has("monitor_interval")) {
    const auto& g = given.at("monitor_interval");
    auto d = parse_number(g.value);
    if (!d || *d < 0) throw TorchrunError(fmt::format("{} {}: expected seconds", g.as, g.value));
    note("monitor_interval", NoteKind::ignored, "ddpctl is told at once when a worker exits; it does not poll");
  }
  if (has("start_method")) {
    const auto& g = given.at("start_method");
    if (g.value != "spawn" && g.value != "fork" && g.value != "forkserver") {
      throw TorchrunError(fmt::format("{} {}: expected spawn, fork or forkserver", g.as, g.value));
    }
    note("start_method", NoteKind::ignored, "it applies to function entry points; a script is started as a program");
  }
  if (has("role") && given.at("role").value != "default") {
    note("role", NoteKind::ignored, "ROLE_NAME stays 'default'");
  }

  // The command, as torchrun builds it (config_from_args): [python, -u, (-m), script, args...],
  // or the script itself with --no-python.
  const bool module = has("module"), no_python = has("no_python"), run_path = has("run_path");
  std::vector<std::string> command;
  if (no_python && module && !run_path) {
    throw TorchrunError("--no-python and --module together: torchrun refuses them too (a module needs Python)");
  }
  const auto python = ctx.env.contains("PYTHON_EXEC") && !ctx.env.at("PYTHON_EXEC").empty()
                          ? ctx.env.at("PYTHON_EXEC")
                          : std::string(kDefaultPython);
  if (run_path) {
    command = {python, "-u", script};
    note("run_path", NoteKind::mapped,
         "the script runs as its own process (python -u SCRIPT), not inside the launcher");
  } else if (no_python) {
    command = {script};
    note("no_python", NoteKind::honoured, "the script is run as a program");
  } else {
    command = {python, "-u"};
    if (module) command.push_back("-m"), note("module", NoteKind::honoured, "python -u -m " + script);
    command.push_back(script);
  }
  command.insert(command.end(), script_and_args.begin() + 1, script_and_args.end());
  jf.command = std::move(command);

  // Output and logs.
  if (has("log_dir")) {
    jf.log_dir = given.at("log_dir").value;
    note("log_dir", NoteKind::mapped, "ddpctl's layout: DIR/JOB_ID/attempt-N/rank-R.log");
  }
  // torchrun's --tee wins over --redirects for the streams it names (they are tailed to the
  // console from the files), so `-r 3 -t 3` shows everything.
  bool teed = false;
  if (has("tee")) {
    auto m = parse_std(given.at("tee"));
    teed = std::any_of(m.begin(), m.end(), [](const auto& kv) { return kv.second != 0; });
    note("tee", NoteKind::honoured, "ddpctl always writes each rank's output to the terminal and to its log file");
  }
  if (has("redirects")) {
    auto m = parse_std(given.at("redirects"));
    if (m.size() == 1 && m.begin()->first == -1 && m.begin()->second == 3) {
      if (teed) {
        note("redirects", NoteKind::honoured, "with --tee: the terminal and each rank's log file get all its output");
      } else {
        plan.quiet = true;
        note("redirects", NoteKind::mapped, "no worker output on the terminal; each rank's log file has it all");
      }
    } else if (!(m.size() == 1 && m.begin()->first == -1 && m.begin()->second == 0)) {
      note("redirects", NoteKind::ignored,
           "ddpctl cannot hold back one stream or some ranks: the terminal gets all (see "
           "--local-ranks-filter), each rank's log file too");
    }
  }
  if (has("local_ranks_filter")) {
    const auto& g = given.at("local_ranks_filter");
    for (auto part : split(g.value, ',')) {
      if (trim(part).empty()) continue;
      auto r = parse_int(trim(part));
      if (!r || *r < 0) throw TorchrunError(fmt::format("{} {}: expected local ranks such as 0,3", g.as, g.value));
      plan.show_ranks.insert(static_cast<int>(*r));
    }
    note("local_ranks_filter", NoteKind::honoured, "only these ranks on the terminal (their log files get all)");
  }
  for (const char* dest : {"log_line_prefix_template", "local_addr", "logs_specs", "signals_to_handle",
                           "duplicate_stdout_filters", "duplicate_stderr_filters", "event_log_handler"}) {
    if (!has(dest)) continue;
    const std::string d = dest;
    note(d, NoteKind::ignored,
         d == "log_line_prefix_template" ? "each line starts with [RANK]"
         : d == "local_addr"             ? "one node: the store is on 127.0.0.1"
         : d == "signals_to_handle"      ? "ddpctl stops the job on SIGTERM, SIGINT, SIGHUP and SIGQUIT, as "
                                           "TORCHELASTIC_SIGNALS_TO_HANDLE says, and passes SIGUSR1 and SIGUSR2 on"
                                         : "ddpctl writes its own logs");
  }
  if (has("numa_binding")) {
    const auto& g = given.at("numa_binding");
    if (g.value != "node" && g.value != "exclusive") {
      throw TorchrunError(
          fmt::format("{} {}: ddpctl binds numa: node or exclusive (binding: in a job file)", g.as, g.value));
    }
    jf.numa_binding = g.value;
    note("numa_binding", NoteKind::mapped, "binding.numa: " + g.value);
  }
  if (has("shutdown_timeout")) {
    const auto& g = given.at("shutdown_timeout");
    auto d = parse_number(g.value);
    // (a stop grace is at most 10^9 ms: the job file's duration limit)
    if (!d || *d < 0 || *d > 1e6)
      throw TorchrunError(fmt::format("{} {}: expected seconds, at most 1000000", g.as, g.value));
    // Rounded to the nearest millisecond (d >= 0, so half away from zero is + 0.5), without libm.
    jf.stop_grace = fmt::format("{}ms", static_cast<long long>(*d * 1000 + 0.5));
    note("shutdown_timeout", NoteKind::honoured, fmt::format("SIGKILL {} s after SIGTERM", g.value));
  }
  if (has("virtual_local_rank")) {
    throw TorchrunError(
        fmt::format("{} is not supported: ddpctl keeps LOCAL_RANK; a job file's binding: {{gpu: isolate}} "
                    "shows each rank only its own GPU",
                    given.at("virtual_local_rank").as));
  }
  plan.spec = spec_from_flags(jf, "ddpctl torchrun");
  plan.spec.store_port_explicit = port_explicit;
  return plan;
}

std::string torchrun_help() {
  std::string out =
      "usage: ddpctl torchrun [torchrun's options] SCRIPT [its arguments]\n"
      "       ddpctl torchrun [options] -m MODULE [its arguments]\n\n"
      "torchrun's single-node command line, in the spellings of 1.13 (--nproc_per_node) and later\n"
      "(--nproc-per-node); PET_<OPTION> variables as in torchrun. One node only: for several, ddpctl\n"
      "launch --nodes, --ssh or --slurm.\n\n";
  for (const auto& f : flags())
    out += fmt::format("  {:<56} {}\n", join(f.names, ", ") + (f.takes_value ? " V" : ""), f.what);
  return out;
}

}  // namespace ddp::jobspec

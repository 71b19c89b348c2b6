// The probe: the job's interpreter run once per node, as the job's user, with the job's
// environment and workdir, to learn its Python and PyTorch versions (pyenv.hpp says how).
//
// Bounded: kProbeTimeout (a Python starts in tens of milliseconds; `conda run` in about a
// second; a `uv run` that would first build an environment is not waited for), stdout kept up to
// 64 KiB and stderr up to 4 KiB, the interpreter's process group killed at the deadline.
// Never throws for what the interpreter does: a failure is a PythonFacts with `error` set, which
// the contract reads as "release not known".
//
// Cached by (the interpreter as resolved, its argv, the user, the workdir, the variables Python
// and its wrappers read): an entry holds the mtimes of the real interpreter and of every sys.path
// folder it reported, and is used only while they are unchanged, so a pip install or a new
// interpreter is seen on the next launch. An entry holds the interpreter's answer only (its real
// path, Python and torch versions), never the question's words: why this interpreter was asked
// (`source`) and whether it is a guess belong to each request, as doctor with and without --job,
// or two jobs, ask one interpreter for different reasons (an entry written before held them,
// and they are not read back). One cache per process; ddpctl keeps a copy in
// $XDG_CACHE_HOME/ddpctl/python.jsonl (else ~/.cache/...), so one launch pays for it once.
// Blocking, with the deadline above: call it before an event loop runs, or from a helper
// process (the agent, a subreaper that reaps every child on SIGCHLD, uses `ddp-agentd preflight`).
#pragma once

#include "facts/model.hpp"
#include "pyenv/pyenv.hpp"
#include "supervisor/process.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

namespace ddp::pyenv {

inline constexpr std::chrono::milliseconds kProbeTimeout{5000};

struct ProbeRequest {
  InterpreterChoice choice;
  std::map<std::string, std::string> env;  // the job's environment: PATH finds the interpreter
  std::string workdir = "/";
  std::optional<supervisor::RunAs> run_as;  // nullopt: our own user
  std::chrono::milliseconds timeout = kProbeTimeout;
};

class ProbeCache {
 public:
  // `file`: load from and save to it (ddpctl); nullopt: memory only (the agent's helper).
  explicit ProbeCache(std::optional<std::filesystem::path> file = std::nullopt);
  std::optional<facts::PythonFacts> find(const std::string& key) const;
  void put(const std::string& key, const facts::PythonFacts& f, const std::vector<std::string>& stamp_paths);

 private:
  struct Entry {
    facts::PythonFacts facts;
    std::vector<std::pair<std::string, std::int64_t>> stamps;  // path, mtime in ns
  };
  std::optional<std::filesystem::path> file_;
  std::vector<std::string> lines_;  // the file's entries as written, `[KEY, ENTRY]`, oldest first
  static std::string line_prefix(const std::string& key);
  std::optional<Entry> entry(const std::string& key) const;
  void save() const;
};

// $XDG_CACHE_HOME/ddpctl/python.jsonl, else ~/.cache/ddpctl/python.jsonl; nullopt without a home.
std::optional<std::filesystem::path> default_cache_file();

// The process's own cache (memory only, or `file` on its first use).
ProbeCache& process_cache(std::optional<std::filesystem::path> file = std::nullopt);

facts::PythonFacts probe_python(const ProbeRequest& request, ProbeCache* cache);

// PythonFacts from facts::to_json's shape (our own answers and cache; lenient on optional keys,
// throws nlohmann::json::exception without `interpreter`).
facts::PythonFacts python_from_json(const nlohmann::json& j);

// The cache key of a request (exposed for tests).
std::string cache_key(const ProbeRequest& request, const std::string& resolved);

// What a cache entry keeps of a probe's facts: the answer, without the question's source or guess.
facts::PythonFacts answer_of(facts::PythonFacts facts);
// A request's facts (`asked`: its interpreter, source and guess) with a cached entry's answer.
facts::PythonFacts answered_from_cache(facts::PythonFacts asked, const facts::PythonFacts& cached);

}  // namespace ddp::pyenv

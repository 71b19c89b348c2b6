// The local launch: one node, no daemon. ddpctl itself plays coordinator and agent, and
// it starts nproc_per_node workers with the environment contract, streams and files their
// output, stops everyone at the first failure, restarts from checkpoint while restarts remain,
// and leaves nothing running.
#pragma once

#include "contract/contract.hpp"
#include "facts/model.hpp"
#include "jobspec/jobspec.hpp"

#include <nlohmann/json.hpp>

#include <optional>
#include <set>
#include <string>

namespace ddp::launch {

struct LaunchOptions {
  jobspec::JobSpec spec;     // CLI overrides already applied
  std::string job_id;        // empty: <name>-<date>-<time>-<random>
  std::set<int> show_ranks;  // terminal filter; empty: all ranks
  bool quiet = false;        // no worker output on the terminal
  std::optional<std::string> result_json;
  std::optional<std::string> facts_file;  // describe the node from this facts file, not discovery
  // The job's Python and PyTorch on this node (lib/pyenv), probed once by resolve_node_context.
  std::optional<facts::PythonFacts> python;
};

class LaunchError : public std::runtime_error {
 public:
  explicit LaunchError(const std::string& what, int exit_code = 2) : std::runtime_error(what), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }  // ddpctl's: 2, or 128+signal when stopped before any rank

 private:
  int exit_code_ = 2;
};

// Resolves what the spec leaves open (nproc cpu, workdir, log dir, job id) and returns the
// node's context for attempt `attempt`. Throws LaunchError with a clear message.
contract::NodeContext resolve_node_context(LaunchOptions& opts, int attempt);

// The job's Python on this node: from the --facts file when it has one, else the interpreter
// probed here (lib/pyenv; cached in $XDG_CACHE_HOME/ddpctl). nullopt for a container job (its
// Python is the image's, which this launcher does not probe yet) or a facts file without one.
std::optional<facts::PythonFacts> job_python(const LaunchOptions& opts);

// `ddpctl launch --dry-run`: the plan as JSON (contract/dry_run.hpp's shape); starts nothing,
// binds nothing. show_env: every variable of the ranks' environment, inherited ones included.
nlohmann::json dry_run(LaunchOptions opts, bool show_env = false);

// Runs the job to the end; returns ddpctl's exit status (0 only if every rank exited 0).
int run_local(LaunchOptions opts);

}  // namespace ddp::launch

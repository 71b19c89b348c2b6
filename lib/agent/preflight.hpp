// A container job's preflight on an agent's node, in a helper process (`ddp-agentd preflight`).
//
// Why a process: a pull takes minutes, and the agent's loop must keep answering heartbeats and
// other coordinators meanwhile; and the agent, a subreaper, reaps every child of its own
// (waitpid(-1)) on SIGCHLD, so the runtime commands the preflight runs must be some other
// process's children, whose exit codes that process reads itself.
//
// The helper reads one JSON request on stdin and writes one JSON answer on stdout:
//   request {mode: "job" | "image" | "python", job_id, spec: <job payload>, env: {...}, cwd,
//            run_as: {uid, gid, groups} (python, optional)}
//   answer  {digest, repo_digest, error, warning}   (error empty: the node is ready)
//           + {python: <facts' python>} in mode "python": a host job's interpreter (lib/pyenv)
//   mode "flight" (+ attempt_dir, rank_base, local_world_size, run_as): a failed round's NCCL
//   flight recorder summaries of this node's ranks (lib/hang), answer + {flight: [...]}
// "job" (a job offer): the image is pulled per `container.pull`, containers of dead launchers
// are swept, and command[0] and the workdir are checked inside the image. "image" (doctor):
// the image is only looked up.
#pragma once

#include "container/container.hpp"
#include "contract/contract.hpp"
#include "net/wire.hpp"

#include <boost/asio/io_context.hpp>
#include <nlohmann/json.hpp>

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>

namespace ddp::agent {

// The helper's main: request from `in`, answer to `out`. Returns its exit status.
int run_preflight_helper(std::istream& in, std::ostream& out);

// `confine`: a mapped user's job (container.hpp's Confinement): the check in the image runs as
// that user too.
nlohmann::json preflight_request(const std::string& mode, const std::string& job_id, const net::JobPayload& payload,
                                 const contract::Env& client_env, const std::string& cwd,
                                 const std::optional<container::Confinement>& confine = std::nullopt);

// One helper run, driven from the agent's loop. `done` gets the answer (or {error} when the
// helper failed) on the loop's thread, unless cancel() came first. cancel() (also on
// destruction) kills the helper and whatever it started in its process group.
class PreflightRun {
 public:
  static std::shared_ptr<PreflightRun> start(boost::asio::io_context& io, const std::string& exe,
                                             const nlohmann::json& request,
                                             std::function<void(const nlohmann::json&)> done);
  ~PreflightRun();
  void cancel();
  // Whether `pid`, just reaped, was a helper that cancel() killed, forgetting it. Killed in the
  // middle of a run_bounded() child, it left that child's cgroup (and whatever the child started
  // there) behind: the agent sweeps such cgroups once it has reaped the helper
  // (supervisor::Cgroup::sweep_stale, which needs the owner gone).
  static bool was_cancelled(pid_t pid);

  struct State;

 private:
  explicit PreflightRun(std::shared_ptr<State> s) : state_(std::move(s)) {}
  std::shared_ptr<State> state_;
};

}  // namespace ddp::agent

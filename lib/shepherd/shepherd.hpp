// The shepherd: one process per job on a node, between the agent and the job's workers.
//
// Why a process: workers run as children of whoever spawns them, and a worker's setsid()'d or
// double-forked descendants re-parent to the nearest subreaper. If that were the agent, a
// `kill -9` of the agent would leave them to init, running. The shepherd is the job's subreaper
// and the owner of its per-attempt cgroups; it runs each attempt with launch::WorkerGroup, and
// watches the agent through a pidfd (and the socketpair's EOF): when the agent is gone, it kills
// the whole tree (cgroup.kill where there is a cgroup, else every descendant it is subreaper
// of), reaps it, and exits. The agent starts it as `ddp-agentd shepherd --agent-pid P --job ID`
// with the socketpair as its stdin; the messages are in messages.hpp, the agent's side in
// client.hpp.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace ddp::shepherd {

struct ShepherdArgs {
  int fd = 0;           // the socketpair end, as stdin
  pid_t agent_pid = 0;  // the process to watch
  std::string job_id;   // for log lines
  // Started by systemd in a transient unit (lib/jobunit), not forked by the agent: our parent
  // is not the agent, so only the pidfd and the channel say whether the agent lives.
  bool in_unit = false;
};

// argv after "shepherd": --agent-pid P --job ID [--in-unit]. nullopt (with `error` set) on
// anything else.
std::optional<ShepherdArgs> parse_args(const std::vector<std::string>& args, std::string& error);

// Runs until the agent says goodbye (closes the socket) or dies, or a signal asks; returns the
// process's exit status (0: ended with nothing left running).
int run_shepherd(const ShepherdArgs& args);

}  // namespace ddp::shepherd

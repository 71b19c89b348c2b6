// ddp-agentd's core: one per node. Listens for coordinators, authenticates them (the token
// file's keys; only role "coordinator" is accepted), and runs one job at a time.
//
// Per connection (the coordinator dials; frames in lib/proto):
//   handshake ─▶ job_offer{t0} ─▶ join{nproc, facts, preflight; t0 echoed, offer rx, tx: clock offset}
//   assign{ranks, master} ─▶ (node rank 0: the job's store, reset) ─▶ start ─▶ workers
//   output / worker_exited / attempt_finished ─▶ coordinator;  stop ─▶ SIGTERM, grace, SIGKILL
//   heartbeat both ways, every interval (ours echoes the coordinator's last: a clock sample).
//
// Policy: nothing runs without an authenticated coordinator behind it. The job's workers are
// stopped when that coordinator says so, when its connection drops, and when its heartbeats stop
// (heartbeat_timeout); a second coordinator's offer while a job runs gets a clear "busy". Worker
// logs stay on the node (<log_dir>/<job>/attempt-<n>/rank-<r>.log) and every line also goes up.
//
// One-shot (SSH mode, `--oneshot --stdio`): no listener; the launcher starts the agent through
// SSH, writes a fresh secret as stdin's first line, then speaks the same protocol over
// stdin/stdout. stdin's EOF (the SSH connection died), a hang-up or missed heartbeats stop the
// workers, and the agent exits when its one job is over. With `--connect HOST:PORT` (the
// launcher's --advertise-addr) the protocol runs over a TCP connection the agent opens to the
// launcher instead; stdin still carries the secret, a tag naming this node, and the EOF.
//
// One-shot under SLURM (`--oneshot --listen [::]:0 --secret-env NAME --announce`): the secret
// from the environment, and once listening, the port printed on stdout for srun to relay
// (lib/slurm). SIGUSR1/SIGUSR2, from the coordinator's `signal` message or sent to the agent
// itself, go to the running workers as they are.
#pragma once

#include "agentconfig/agentconfig.hpp"
#include "agentconfig/users.hpp"
#include "common/duration.hpp"
#include "common/version.hpp"
#include "jobunit/systemd.hpp"
#include "net/tls.hpp"
#include "proto/keyring.hpp"

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::agent {

inline constexpr std::uint16_t kDefaultPort = 29410;
// What `ddp-agentd --version` prints; SSH mode runs a remote agent only when it prints the same.
inline constexpr const char* kVersion = ddp::kAgentVersion;

struct AgentOptions {
  std::string listen_host = "::";  // dual-stack, all addresses
  std::uint16_t port = kDefaultPort;
  proto::Keyring keys;
  std::string name;  // default: the hostname
  std::string log_dir = "/var/log/ddpctl";
  Millis heartbeat_interval{1000};
  Millis heartbeat_timeout{6000};   // the coordinator's silence that stops our workers
  Millis handshake_timeout{10000};  // an unauthenticated peer's time to finish the handshake
  // The share of the node this agent manages (--gpus, --cpus): for sharing a node between
  // agents, or simulating several nodes on one machine. nullopt: every GPU, every CPU of the
  // agent's affinity. GPUs by index in PCI order, UUID or PCI bus id (binding::restrict_gpus).
  std::optional<std::vector<std::string>> gpus;
  std::optional<std::vector<int>> cpus;
  // From /etc/ddpctl/agent.yaml. A job offer whose user is not listed is refused (empty: any
  // user the token admits).
  std::vector<std::string> allowed_users;
  // Per-user tokens (key_users, resolved): the user each key's jobs run as; a job offered with
  // an unmapped key, or claiming another user, is refused (agentconfig::decide_run_as). Empty:
  // every key may run jobs, as the agent's own user. Not used with --stdio (the SSH login
  // chose the user).
  agentconfig::KeyUserMap key_users;
  // Where each job's shepherd runs (agent.yaml's job_units): in a transient systemd unit of
  // its own, or as a child of the agent (lib/jobunit's policy). A one-shot agent always forks.
  jobunit::Mode job_units = jobunit::Mode::automatic;
  // Passed through, not consumed yet: the runtime for containerised jobs.
  std::string container_runtime;
  // TLS 1.3 under the protocol (net/tls.hpp), keyed by `keys`. Not for --stdio: SSH already
  // encrypts that link.
  net::TlsMode tls = net::TlsMode::allowed;
  // What one job may ask of the agent's own store and log writes (agent.yaml's limits:).
  agentconfig::JobLimits limits;
  // Serve exactly one job, then exit (the job ends when its coordinator leaves).
  bool oneshot = false;
  // No listener: the one coordinator speaks over stdin/stdout (SSH mode; implies oneshot).
  // `keys` then holds the per-run secret the launcher wrote as stdin's first line.
  bool stdio = false;
  // Set: once listening, the agent prints this line for its port on stdout (--announce: srun
  // relays it to `ddpctl launch --slurm`, which dials that port).
  std::function<std::string(std::uint16_t port)> announce;
  // With stdio: the protocol runs over a TCP connection we open to the launcher at this
  // HOST:PORT (its --advertise-addr), introduced by `connect_tag` (from stdin, after the
  // secret); stdin stays the SSH channel, and its EOF still means the launcher is gone.
  std::string connect_host;
  std::uint16_t connect_port = 0;
  std::string connect_tag;
};

// How many links one key may hold to an agent at once: many times what a standing coordinator
// needs (a link per job it runs here, plus `doctor` and `stacks` queries), and never more than
// an eighth of the agent's descriptors (`nofile_soft`, net::nofile_soft_limit()). Past it the
// newest link is refused with the bound, so one key cannot take the agent's descriptors, nor
// 128 MiB of queued output per link many times over.
std::size_t links_per_key_cap(std::uint64_t nofile_soft);
// Container image lookups (`ddpctl doctor --nodes` with an image: a root helper asking the
// runtime) running at once over all links; a request past it is answered "not checked".
inline constexpr std::size_t kMaxImageLookups = 4;

class AgentError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Runs the daemon until SIGTERM/SIGINT (its workers stopped first). Throws AgentError when it
// cannot start (port taken, log dir unusable).
int run_agent(AgentOptions options);

}  // namespace ddp::agent

// ddp-coordinator: a standing coordinator. ddpctl submits jobs to it (`launch --coordinator`)
// and it runs them against the agents as ddpctl's embedded coordinator would; a job keeps
// running when the ddpctl that submitted it goes away.
//
//   ddpctl ─hello(role ctl)─▶ handshake (the token file's keys, as the agents') ─▶ submit{job, user, spec, nodes}
//          ◀─ job_accepted ◀─ job_output / job_event ... ◀─ job_result{state, exit_code, report}
//          ─▶ stop_job{signal} (the submitter's Ctrl-C or SIGTERM), signal_job (its SIGUSR1/2)
//   ddpctl status/logs/stop --coordinator ─▶ control{job_id, line} ◀─ control{line} ... control{eof}
//
// Each job runs on a thread of its own with its own event loop (run_coordinator, unchanged);
// this loop only accepts clients and relays. A job's control socket (lib/control) is opened in
// this daemon's runtime folder like a foreground launch's, and `control` frames are relayed to
// it, so status/logs/stop mean the same here as on the launching machine; the log files that
// `logs` names are read here and sent inline.
//
// Policy: only role ctl is accepted, and only after the handshake. Identity is the key: with
// key_users a client acts only as the user its key maps to (identity.hpp; a hello or submit that
// names anyone else is refused), and its jobs reach the agents with the delegation its ddpctl
// signed with that key (proto/delegation.hpp, protocol version 6), which the agents check and
// map themselves; without key_users a client is the user it declares (one shared token cannot
// tell users apart). A job is stopped or inspected only by its submitter or root. A submitter that
// reads slowly loses output lines (counted, and told), never slows the job. The control requests
// a client may hold open, the log files their backlogs hold open, the jobs and the connections
// are bounded per user and in all (relay_limits.hpp): past a bound the request is refused with
// the bound, only its connection dropped. SIGTERM stops every
// job (their workers on every node), then the daemon exits.
#pragma once

#include "common/duration.hpp"
#include "common/version.hpp"
#include "coordinator/identity.hpp"
#include "net/tls.hpp"
#include "proto/keyring.hpp"

#include <cstdint>
#include <stdexcept>
#include <string>

namespace ddp::coordinator {

inline constexpr std::uint16_t kStandingPort = 29411;
inline constexpr const char* kStandingVersion = ddp::kCoordinatorVersion;

struct StandingOptions {
  std::string listen_host = "::";
  std::uint16_t port = kStandingPort;
  proto::Keyring keys;  // proves us to the agents (the first), and clients to us
  // Key id → the user a client proving that key acts as (--key-user); empty: the declared user.
  CoordinatorKeyUsers key_users;
  // TLS 1.3 keyed by the token (net/tls.hpp) from ddpctl: allowed (told apart per connection),
  // required (plaintext clients refused, and every job's agents reached inside TLS), or off.
  // A job submitted with --tls reaches its agents inside TLS whatever this says.
  net::TlsMode tls = net::TlsMode::allowed;
  std::string log_dir = "/var/log/ddpctl/coordinator";  // the launcher's copy of every job's per-rank logs
  Millis handshake_timeout{10000};
};

class StandingError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Serves until SIGTERM/SIGINT (every job stopped first). Throws StandingError when it cannot start.
int run_standing(StandingOptions options);

}  // namespace ddp::coordinator

// Where a foreground launch's control socket lives: one AF_UNIX socket per job, named
// <job-id>.sock, in the first usable of $XDG_RUNTIME_DIR/ddpctl, /run/user/<uid>/ddpctl,
// /tmp/ddpctl-<uid>.
//
// Policy: the folder is ours alone: created 0700, and refused when it is a symlink, not owned by
// us, or open to others (another user could otherwise plant a socket there and read what
// `ddpctl stop` or `logs` asks).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ddp::control {

class ControlError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The folder, created if missing; throws ControlError saying why none is usable.
std::string runtime_dir();
// A standing coordinator's folder for its jobs' control sockets and end records: runtime_dir()'s
// "coordinator", private, so that no job a user submits shares a name with one its own user
// (root) launches here. Created if missing; throws ControlError when it is not a private folder.
std::string coordinator_jobs_dir();
// The socket of `job_id` in `dir`; throws ControlError when the path is too long for sun_path.
std::string socket_path(const std::string& dir, const std::string& job_id);
// Job ids of the sockets in `dir` (sorted); no check that anyone listens.
std::vector<std::string> socket_jobs(const std::string& dir);
// Removes the sockets in `dir` that nobody listens on any more (left by launchers that were
// SIGKILLed: a connect is refused); a live launcher's socket, or one whose backlog is full,
// stays. Returns the job ids removed. Every launcher sweeps its folder when it opens its own.
std::vector<std::string> sweep_stale_sockets(const std::string& dir);

// Removes the socket file at `path` when it is a dead launcher's: a connect is refused and no
// socket of this network namespace is bound to the path (/proc/net/unix). A launcher that has
// bound its socket but not yet called listen() refuses connections too, and keeps its socket.
// True when it removed the file.
bool remove_if_stale(const std::string& path);
// Whether a live launcher listens on the socket at `path` (a connect is accepted or queued).
bool someone_listens(const std::string& path);

// A job's last word, left when it ends (`<job-id>.ended`, 0600, in records_dir()): how it ended
// and where its logs and result are, so that `ddpctl status|logs JOB` still answer once the job
// and its launcher (a detached one, say) are gone. Not beside the socket: the runtime folder
// goes at logout and reboot, and a detached job's user comes back after both.
struct Ended {
  std::string job_id;
  std::string status;  // "succeeded", "failed", "stopped"
  int exit_code = 0;
  std::int64_t ended_unix_ms = 0;
  std::string logs;                                // the job's log folder
  std::string result_json;                         // empty: none was written
  std::vector<std::pair<int, std::string>> files;  // (rank, path): the last attempt's log files
  std::string message;                             // why, when the status alone does not say; may be empty
};
// The record of a job that ends now; `result_json` made absolute (`ddpctl status` reads it from
// anywhere).
Ended ended_now(const std::string& job_id, const std::string& status, int exit_code, const std::string& logs,
                const std::optional<std::string>& result_json);
// The record as JSON (what the file holds; `ddpctl status --json` shows it, less the files).
nlohmann::json to_json(const Ended& e);
// $XDG_STATE_HOME/ddpctl/jobs, else ~/.local/state/ddpctl/jobs (private folders, created), else
// runtime_dir(); throws ControlError when none is usable.
std::string records_dir();
// Written whole or not at all (a temporary file renamed); failures are ignored: it is a courtesy.
// Records (and leftovers of a write) older than 30 days go at the same time.
void record_ended(const std::string& dir, const Ended& e);
// The record a launcher's guardian leaves if the launcher dies (supervisor::LastWord): the file's
// name in the folder, and its text cut where the time of death goes (`e.ended_unix_ms` unused).
struct EndedText {
  std::string name;
  std::string before_time, after_time;
};
EndedText ended_text(Ended e);
// What a launcher hands its guardian (supervisor::LastWord): the record of a job whose launcher
// died while it ran ("failed", no exit code: -1, `message` saying what happened), for the
// user's records_dir(); nullopt where there is none (said at debug level).
struct RecordIfKilled {
  std::string dir;
  EndedText text;
};
std::optional<RecordIfKilled> record_if_killed(const std::string& job_id, const std::string& logs,
                                               std::vector<std::pair<int, std::string>> files, std::string message);
// A record of `job_id` removed (a job id used again: its old record would answer for the new job).
void forget_ended(const std::string& dir, const std::string& job_id);
// nullopt when there is none, or it is not one of ours (malformed).
std::optional<Ended> read_ended(const std::string& dir, const std::string& job_id);
// A record from its JSON (to_json's; "files" may be absent: a standing coordinator's answer
// leaves them out); nullopt when malformed.
std::optional<Ended> ended_from_json(const nlohmann::json& j);
// Job ids of the records in `dir`, the most recently written (ended) first; names only, nothing
// parsed (at most a month of records: record_ended sweeps older ones).
std::vector<std::string> ended_jobs(const std::string& dir);

// What a job id the user typed names among `ids` (in their order, duplicates once): the id
// itself when it is one of them, else every id it begins; empty when it names none. An empty
// `typed` begins every id.
std::vector<std::string> match_job(const std::vector<std::string>& ids, std::string_view typed);

}  // namespace ddp::control

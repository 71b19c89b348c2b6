// The edge of the flight recorder work (contract/flight_recorder.hpp turns it on, flight.hpp
// reads it): asking a rank for a dump through its FIFO, and turning the attempt folder's dumps
// into summaries.
//
// Why the job's Python, as the job's user, reads the dumps: they are pickles, and unpickling
// data someone else wrote is running their code. Root never opens a dump; the job's own
// interpreter, run as the job's user (what lib/pyenv's probe does), reading the job's own files,
// can do nothing the job could not do already. It is bounded: a time limit (its process group
// killed at the deadline), and the output read up to a cap and parsed as hostile (flight.hpp).
// A C++ pickle reader in root would be a new parser of hostile input in the most privileged
// process; the job's Python already has one, and it is the one the dump was written for.
#pragma once

#include "common/safe_fs.hpp"
#include "hang/flight.hpp"
#include "supervisor/process.hpp"

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddp::hang {

// Asks global rank `rank` to dump now: one byte into its FIFO in the attempt folder
// (contract::flight_pipe_name), which the rank made itself (mode 0666 less its umask) and
// reads, without blocking, on its NCCL watchdog's loop. Root may call this: the name is opened
// below the folder's fd with O_PATH|O_NOFOLLOW (a link is refused), checked with fstat (a FIFO,
// of `owner_uid`), and only then that very inode is opened to write, O_NONBLOCK (through
// /proc/self/fd, so nothing can be swapped in between): no other file is ever opened for
// writing, and a FIFO without a reader (the rank has none, or is gone) answers at once.
struct DumpRequest {
  enum class Result { sent, no_pipe, not_listening, refused, failed } result = Result::failed;
  std::string detail;  // for a log line: what was wrong
};
DumpRequest request_dump(const safefs::Dir& attempt_dir, int rank, uid_t owner_uid);

inline constexpr std::size_t kMaxDumps = 4096;  // more ranks than one node has

// The dumps in the attempt folder, by name ("nccl-flight-rank-R"), rank order. Names only:
// nothing is opened here.
std::vector<std::string> list_dumps(const safefs::Dir& attempt_dir);

struct ConvertRequest {
  std::vector<std::string> python{"python3"};  // the job's interpreter (pyenv::choose_interpreter)
  std::map<std::string, std::string> env;      // the job's environment (PATH finds the interpreter)
  std::string workdir = "/";
  std::optional<supervisor::RunAs> run_as;  // nullopt: our own user (never root for a job of another)
  std::chrono::milliseconds timeout = kConvertLimit;
  std::size_t max_output = 8u << 20;  // the converter keeps ~30 KiB a rank
};

// Runs the converter on `names` in `attempt_dir_path`: one RankDump per name, in order, each
// with its error where that dump (or the whole run) failed. Blocking, within req.timeout.
// `names` empty: the converter lists the folder itself, as the job's user (what a root caller
// wants: it never reads the job's folder); every dump found, rank order, and where the run
// failed one more RankDump of rank -1 saying why (analyze() ignores it).
std::vector<RankDump> convert_dumps(const std::string& attempt_dir_path, const std::vector<std::string>& names,
                                    const ConvertRequest& req);

// The converter's source (lib/hang/flight_convert.py, embedded), run with `python -I -S -c`.
const char* convert_script();

// list + convert + analyze; nullopt where the folder holds no dump.
std::optional<Finding> gather_flight(const safefs::Dir& attempt_dir, int world_size, const ConvertRequest& req);

}  // namespace ddp::hang

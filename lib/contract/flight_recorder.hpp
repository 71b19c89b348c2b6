// PyTorch's NCCL flight recorder, turned on for the job where its PyTorch has it and the job did
// not configure it itself: a ring buffer of each rank's last collectives, dumped (one pickle per
// rank) into the attempt's log folder when a collective times out, or when ddpctl asks through
// the rank's FIFO (lib/hang/flight_gather.hpp). Pure.
//
// The variables, as PyTorch's c10d reads them (torch/csrc/distributed/c10d: ProcessGroupNCCL.hpp,
// FlightRecorder.hpp; pytorch#115139 and #115770 for the pipe, Dec. 2023):
//   TORCH_NCCL_TRACE_BUFFER_SIZE=N     entries kept; 0 (the default before 2.10-ish) turns it off
//   TORCH_NCCL_DUMP_ON_TIMEOUT=1       dump when the watchdog sees a timeout or an NCCL error
//   TORCH_NCCL_DEBUG_INFO_TEMP_FILE=P  the dump of global rank R is the file P<R>
//   TORCH_NCCL_DEBUG_INFO_PIPE_FILE=P  rank R (its default group) makes the FIFO P<R>.pipe; a
//                                      write to it makes the rank dump, as on a timeout
// Newer releases also read TORCH_FR_BUFFER_SIZE, TORCH_FR_DUMP_ON_TIMEOUT and
// TORCH_FR_DUMP_TEMP_FILE, and take the TORCH_NCCL_ names as deprecated aliases (one warning per
// process). ddpctl still sets the TORCH_NCCL_ names: every release with a flight recorder reads
// them, and the pipe is made only where TORCH_NCCL_TRACE_BUFFER_SIZE itself is above 0.
#pragma once

#include "contract/contract.hpp"

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ddp::contract {

// The first release where all four variables above are read (2.2 was cut while the pipe was
// landing; ddpctl does not guess).
inline constexpr TorchRelease kTorchFlightRecorder{2, 3};

// Entries kept per rank: PyTorch's own recommendation (and later default).
inline constexpr int kFlightRecorderEntries = 2000;

// Names in the attempt folder: the dump of rank R, and its FIFO.
inline constexpr const char* kFlightDumpPrefix = "nccl-flight-rank-";
std::string flight_dump_name(int rank);  // nccl-flight-rank-R
std::string flight_pipe_name(int rank);  // nccl-flight-rank-R.pipe
// R when `name` is a dump's name (not its FIFO), else nullopt.
std::optional<int> flight_dump_rank(const std::string& name);

// Every name by which a job configures the flight recorder itself; one set leaves all to it.
const std::vector<std::string>& flight_recorder_variables();

struct FlightRecorderPlan {
  std::vector<std::pair<std::string, std::string>> env;  // empty: not turned on
  std::string why;                                       // for the dry-run and the report
};
// `chosen`: the environment before ddpctl's defaults (inherited, and the job's env:).
FlightRecorderPlan flight_recorder(const std::optional<std::string>& torch_version, const std::string& attempt_dir,
                                   const Env& chosen);
// The job's plan, as worker_env, the dry run and the readers of dumps all compute it: as above,
// and never for a container job (the attempt folder is not mounted in: a dump would be lost
// inside the container, and the pipe would not be where ddpctl looks).
FlightRecorderPlan flight_recorder(const jobspec::JobSpec& spec, const NodeContext& node, const Env& chosen);

}  // namespace ddp::contract

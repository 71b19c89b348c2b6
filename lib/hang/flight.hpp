// PyTorch's NCCL flight recorder, read after a hang: every rank's summary in (the converter's
// JSON, lib/hang/flight_convert.py), one finding out: the first collective that some ranks
// entered (or completed) and others did not, and which ranks; or that they all agree. Pure: no
// I/O, no clock. Every summary is the job's data, so it is parsed as hostile: bounded, and a bad
// one is that rank's error, never an exception.
//
// How ranks are compared (PyTorch's FlightRecorder.hpp): each entry carries its process group's
// name (process_group[0], the same on every rank, unlike pg_id, which counts per process) and
// collective_seq_id, which counts the group's collectives, the same on every member. So within a
// group the last sequence number a rank entered says how far it got: the ranks that got further
// than the least advanced entered a collective the others did not. A collective all entered and
// some completed points at the others; one that none completed, at the network or a GPU. Point-
// to-point ops count per rank and peer (p2p_seq_id), so they are compared only as "pending".
// Ops and sizes of the same sequence number must match where the collective requires it
// (all_reduce, broadcast, reduce, all_gather's input, reduce_scatter's output): a mismatch is a
// desynchronised job, and it is reported before what follows from it.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::hang {

enum class FlightState { scheduled, started, completed, unknown };

struct FlightEntry {
  std::string pg;    // the process group's name ("0" for the default group)
  std::string desc;  // its description ("default_pg"), for the report
  std::uint64_t seq = 0;
  bool p2p = false;
  std::string op;  // profiling_name, e.g. "nccl:all_reduce"
  std::vector<std::vector<std::int64_t>> in, out;
  std::vector<std::string> in_dtypes, out_dtypes;
  FlightState state = FlightState::unknown;
  std::int64_t t = 0;  // time_created_ns, the rank's clock
};

struct RankDump {
  int rank = -1;
  std::string node;
  std::string version;                             // the dump's format version
  std::map<std::string, std::vector<int>> groups;  // pg name -> its global ranks, where known
  std::vector<FlightEntry> entries;                // oldest first
  std::string error;                               // set: this rank's dump could not be read
};

// Limits on one summary (the converter keeps fewer; these hold against anything else).
inline constexpr std::size_t kMaxSummaryBytes = 1u << 20;
// How deep its JSON may nest (parsing, copying or dumping it costs a stack frame a level).
inline constexpr std::size_t kMaxSummaryDepth = 16;

// How long the converter (flight_gather.hpp) may take, all dumps together: a Python start and a
// few MiB of pickles. The agent holds its attempt_finished that long, so the coordinator's stop
// timeout allows for it (coordinator.hpp's round_stop_timeout).
inline constexpr std::chrono::milliseconds kConvertLimit{3000};
inline constexpr std::size_t kMaxEntries = 4096;
inline constexpr std::size_t kMaxGroups = 256;
inline constexpr std::size_t kMaxGroupRanks = 65536;

// One line of the converter's output. Never throws: what is wrong is in `error`.
RankDump parse_summary(std::string_view line);

// The summary's shape again (what parse_summary reads), for passing a node's dumps on: the
// agent sends these to the coordinator (attempt_finished, protocol version 6).
nlohmann::json to_json(const RankDump& d);
// Trims `dumps` (each rank's oldest entries first, down to one per group) until their JSON fits
// in `max_bytes`, so that a node's summaries always fit in one frame; false if even that is too
// big (then every rank keeps its error only).
bool fit_summaries(std::vector<RankDump>& dumps, std::size_t max_bytes);

// A node's summaries as its peer sent them (a JSON array, hostile): each parsed, only ranks in
// [first, first + count) (the node's own) kept, once, and they replace whatever that node sent
// before (a node that sends again is not counted twice).
void take_node_summaries(std::vector<RankDump>& all, const std::string& node, int first, int count,
                         const nlohmann::json& summaries);

struct Finding {
  enum class Kind {
    agree,          // every rank with a dump got equally far, and completed it
    not_entered,    // `ahead` entered collective `seq`, `behind` did not
    not_completed,  // all entered `seq`; `ahead` completed it, `behind` did not (ahead may be empty)
    mismatch,       // at `seq`, `ahead` called one thing and `behind` another (`detail`)
    p2p_pending,    // no collective diverged; `ahead` wait in a point-to-point op
    no_data,        // no rank's dump could be read
  };
  Kind kind = Kind::no_data;
  std::string pg, desc;
  std::uint64_t seq = 0;
  std::string op;  // without the "nccl:" prefix
  std::vector<std::vector<std::int64_t>> sizes;
  std::vector<std::string> dtypes;
  std::optional<std::uint64_t> bytes;  // of the first tensor list, where every dtype is known
  std::vector<int> ahead, behind;
  std::vector<int> missing;           // ranks without a readable dump
  std::map<int, std::string> errors;  // why, per rank, where a dump was there but unreadable
  std::string detail;
};

// `world_size`: ranks 0..world_size-1 are expected; 0: only those that have a dump.
Finding analyze(const std::vector<RankDump>& dumps, int world_size);

// One line for the report, starting "flight recorder: ".
std::string format_finding(const Finding& f);
nlohmann::json to_json(const Finding& f);

// Bytes of one element of PyTorch's dtype name ("Float", "BFloat16", ...); nullopt: unknown.
std::optional<std::uint64_t> dtype_size(std::string_view name);
// "4 MiB", "512 B", "1.5 KiB".
std::string format_bytes(std::uint64_t n);

}  // namespace ddp::hang

// Where the ranks still running were when an attempt failed or was stopped: their stacks, taken
// before the first signal (stack_snapshot.hpp), for the report (report.hpp), the attempt's log
// folder (stacks.txt, stacks.json) and --result-json, and, from an agent, for the launcher.
//
// The stacks are read from the job's memory: every string and count in them is the job's to
// choose. So they are bounded here, once, when read (frames, threads, bytes per string), and
// again on the wire (kMaxWireBytes per node) and on the terminal (kSummaryGroups lines, the rest in
// the file). One function reads a rank (read_rank_stacks, attempt/files.hpp): Python frames only,
// which root may read in-process (lib/stacks); the privilege-separated native reader can replace
// it there. This header is pure; the reads and the files are attempt/files.hpp's.
#pragma once

#include "stacks/merge.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace ddp::launch {

inline constexpr std::size_t kMaxStackFrames = 64;        // per thread, innermost kept
inline constexpr std::size_t kMaxStackThreads = 32;       // per rank, threads with frames only
inline constexpr std::size_t kMaxStackString = 512;       // a function or file name, an error
inline constexpr std::size_t kMaxWireBytes = 256u << 10;  // one node's stacks in a message (frames are 1 MiB)
inline constexpr std::size_t kMaxWireRanks = 4096;        // ranks of one node in a message
inline constexpr std::size_t kSummaryGroups = 6;          // lines on the terminal; the rest in stacks.txt
// The time the stacks are read in before the first signal (the worker group's default); the
// coordinator's stop timeout allows for it.
inline constexpr std::chrono::milliseconds kStacksBudget{2000};

struct FailureStacks {
  std::vector<stacks::RankStacks> ranks;  // the ranks that were still running, by rank
  std::vector<std::string> notes;         // what was not read, and why (skipped, out of time)
  std::string file;                       // the full text (stacks.txt), empty: not written
};

// Cuts `p` to the bounds above (the reader's own depth limit aside).
void bound_stacks(stacks::ProcessStacks& p);

// One node's stacks as the shepherd and the agent send them: at most kMaxWireBytes of JSON
// (ranks past it are named in a note), and back. from_wire is strict (a wrong type or value
// throws std::invalid_argument) and bounds again; every rank is given `node`, the name the
// receiver knows the sender by (empty: keep what was sent, for our own shepherd).
nlohmann::json to_wire(const FailureStacks& s);
FailureStacks from_wire(const nlohmann::json& j, const std::string& node = "");

// Keeps the ranks in [base, base + count) (the node's own), each once; a note counts the others.
void keep_own_ranks(FailureStacks& s, int base, int count);

// The few lines the report prints under its header: one per group of main-thread stacks,
// smallest first ("ranks 0,2,3 were in all_reduce (distributed_c10d.py:1320) <- step
// (train.py:42)"), at most kSummaryGroups, each line at most about 300 bytes.
std::vector<std::string> summary_lines(const FailureStacks& s);
// Every thread of every rank, merged (stacks::render_text), for stacks.txt.
std::string full_text(const FailureStacks& s, int world_size);
// {"groups": [...stacks::to_json of every thread...], "notes": [...], "file": "..."}.
nlohmann::json report_json(const FailureStacks& s);

// For a message (a frame is 1 MiB): {"summary": [summary_lines, at most kSummaryMessageLines of
// at most kMaxStackString bytes], "file": "..."}, the lines left out when !with_lines; and for a
// whole job, the lines of the last kSummaryAttempts attempts only.
inline constexpr std::size_t kSummaryMessageLines = 16;
inline constexpr std::size_t kSummaryAttempts = 16;
nlohmann::json stacks_summary_json(const FailureStacks& s, bool with_lines = true);

}  // namespace ddp::launch

// Merging the stacks of many ranks: every thread stack that is the same place in the code (same
// frames, by function, file and line; native offsets and addresses do not count) becomes one
// group that names its ranks and nodes. Groups come smallest first (fewest distinct ranks, then
// the lowest rank), so the odd rank is the first thing printed at 8 ranks as at 4096. A rank that
// could not be read is a group of its own, keyed by what went wrong: every rank appears. Pure.
#pragma once

#include "stacks/model.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace ddp::stacks {

struct RankStacks {
  int rank = 0;
  std::string node;  // "" for a local run
  ProcessStacks stacks;
};

struct Member {
  int rank = 0;
  std::string node;
  int pid = 0, tid = 0;
  std::string thread;
  bool main = false;
};

struct Group {
  std::vector<Frame> python, native;  // the shared stack, innermost first
  std::string note;                   // instead of frames: why this rank has none
  std::vector<Member> members;        // by rank, then main thread first, then tid
  std::vector<int> ranks;             // distinct, ascending
  std::vector<std::string> nodes;     // distinct, ascending
};

struct MergeOptions {
  bool main_thread_only = false;  // one stack per rank: its main thread's
};

std::vector<Group> merge(const std::vector<RankStacks>& ranks, const MergeOptions& options = {});

// "0,2-5,7": ascending distinct ranks, runs folded. Pure.
std::string format_ranks(const std::vector<int>& sorted_ranks);

// The text ddpctl prints: per group a header ("rank 1 (1 of 4) on node-b, thread MainThread")
// and its frames, innermost first, "function (file:line)". total_ranks: for "(k of N)".
std::string render_text(const std::vector<Group>& groups, int total_ranks);
nlohmann::json to_json(const std::vector<Group>& groups);
nlohmann::json to_json(const ProcessStacks& p);

}  // namespace ddp::stacks

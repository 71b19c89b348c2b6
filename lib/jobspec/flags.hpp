// The job spec from the command line, without a job file: `ddpctl launch -n 4 -- python3
// train.py --lr 0.1`, `ddpctl launch --nproc-per-node 2 train.py`, and `ddpctl torchrun`
// (jobspec/torchrun.hpp). The one place where flags become a job spec: they are written into
// the document a job file would hold and checked by the job file's own parser, so a flag and a
// key never disagree about what is valid.
#pragma once

#include "jobspec/jobspec.hpp"

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::jobspec {

// What the command line says about the job, as typed (values are checked by the file's rules).
struct JobFlags {
  std::vector<std::string> command;           // the worker's argv; required
  std::optional<std::string> name;            // default: from the command (name_from_command)
  std::optional<std::string> nproc_per_node;  // N, cpu or gpu
  std::optional<std::string> nnodes;          // N or MIN:MAX
  std::optional<std::string> max_restarts;
  std::optional<std::string> log_dir;
  std::optional<std::string> store_port;    // 0: a free port; another: exactly that one
  std::optional<std::string> stop_grace;    // a duration: 30s
  std::optional<std::string> numa_binding;  // binding.numa
};

// The job of a command line. `where` names it in messages ("ddpctl launch"). Throws JobSpecError.
JobSpec spec_from_flags(const JobFlags& flags, const std::string& where);

// A job name (log folders, job ids) from the command: `python3 -u train.py` gives "train",
// `python3 -m pkg.train` "train", `./run.sh` "run"; "job" when nothing fits.
std::string name_from_command(const std::vector<std::string>& argv);

// The interpreter a bare script (`ddpctl launch train.py`) runs with.
inline constexpr std::string_view kDefaultPython = "python3";

// `ddpctl launch`'s words (after the command name), split into ddpctl's own and the job's
// command. The command starts after `--`, or at the first word that is not an option or an
// option's value when it names a Python script (`train.py`): everything from there on is the
// script's, as with torchrun (`ddpctl launch -n 2 train.py --lr 0.1`). Any other first word is
// a job file and the words after it stay ddpctl's (`ddpctl launch job.yaml -n 2`).
// `takes_value(option)`: whether ddpctl's option (as written, `--nproc-per-node` or `-n`) takes
// a value; nullopt for one it does not know (left for the option parser to refuse).
struct LaunchWords {
  std::vector<std::string> own;      // for ddpctl's option parser
  std::vector<std::string> command;  // the job's argv; empty: a job file names it
  bool script = false;               // the command is [python3, <script>, args...] from a bare .py
};
LaunchWords split_launch_words(const std::vector<std::string>& words,
                               const std::function<std::optional<bool>(std::string_view)>& takes_value);

// Whether `word` names a Python script (ends in .py).
bool is_python_script(std::string_view word);

}  // namespace ddp::jobspec

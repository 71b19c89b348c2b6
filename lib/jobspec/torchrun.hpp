// `ddpctl torchrun`: torchrun's own single-node command line, in the spellings of every release
// from 1.13 (`--nproc_per_node`) to today (`--nproc-per-node`), read as torchrun's argparse reads
// it (unique prefixes, `--flag=value`, `-r3`, options before the script only, PET_<FLAG>
// variables under the command line) and turned into a job spec (jobspec/flags.hpp) plus notes of
// what each flag became. Pure: no files, no clock; the host check is injected.
//
// Policy, flag by flag (docs/torchrun.md has the table): a flag whose meaning ddpctl has is
// honoured or mapped; a flag about how torchrun itself works (monitor interval, start method,
// log plug-ins) is ignored with a note; a flag that asks for several nodes, or for something
// ddpctl would do differently in a way the script could notice, is refused with a message that
// names the ddpctl way.
#pragma once

#include "jobspec/jobspec.hpp"

#include <functional>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::jobspec {

class TorchrunError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TorchrunContext {
  std::map<std::string, std::string> env;               // PET_* defaults, PYTHON_EXEC
  std::function<bool(std::string_view host)> is_local;  // this machine's name or address?
};

enum class NoteKind { honoured, mapped, ignored };
struct TorchrunNote {
  std::string flag;  // as the user wrote it (or PET_X)
  NoteKind kind = NoteKind::honoured;
  std::string text;
};

struct TorchrunPlan {
  JobSpec spec;
  std::set<int> show_ranks;  // --local-ranks-filter
  bool quiet = false;        // --redirects 3: the terminal gets no worker output
  bool nproc_auto = false;   // --nproc-per-node auto: one per GPU if there are GPUs, else per CPU
  bool help = false;         // -h/--help: print torchrun_help() and run nothing
  std::vector<TorchrunNote> notes;
};

// Throws TorchrunError (a bad or refused flag) or JobSpecError (a value the job file's rules refuse).
TorchrunPlan parse_torchrun(const std::vector<std::string>& args, const TorchrunContext& ctx);

// `ddpctl torchrun --help`: every flag torchrun has, and what ddpctl does with it.
std::string torchrun_help();

}  // namespace ddp::jobspec

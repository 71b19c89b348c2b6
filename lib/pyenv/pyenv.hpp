// Which Python a job runs, and how to ask it for its version and PyTorch's. Pure: no I/O.
//
// The interpreter, first that applies:
//  1. the job file's `python:` (a program, or a command that acts as one: [uv, run, python],
//     [conda, run, -n, env, python]): for commands that are shell scripts or wrappers;
//  2. the command's program when it is a Python (python, python3, python3.11, a path to one);
//  3. `python3` on the job's PATH, marked as a guess (a shell script most likely runs that).
// The probe is a few lines of Python that find what importlib.metadata would say (the first
// torch distribution's metadata on sys.path) and, for a torch without metadata, read
// torch/version.py next to the package importlib finds: torch itself is never imported, which
// would take seconds and initialise CUDA, nor json or importlib.metadata (five times the probe's
// own time, paid by every job on every node: the agents keep no cache).
#pragma once

#include "facts/model.hpp"
#include "jobspec/jobspec.hpp"

#include <string>
#include <string_view>
#include <vector>

namespace ddp::pyenv {

struct InterpreterChoice {
  std::vector<std::string> argv;  // the interpreter's argv; the probe adds [-c, script]
  std::string source;             // why this one, for doctor and the dry-run
  bool guessed = false;           // rule 3: the command is not a Python
};

// python, python3, python3.11, pypy3, /venv/bin/python3, ...
bool looks_like_python(std::string_view program);

InterpreterChoice choose_interpreter(const jobspec::JobSpec& spec);

// The script the interpreter runs (`-c`). It prints one JSON line:
//   {"executable": realpath, "python": "3.11.2", "torch": "2.11.0" | null, "site": [dirs]}
// where `site` lists the existing sys.path folders (at most kMaxSiteDirs): installing or
// removing a package changes one of their mtimes, which is how a cached answer goes stale.
const std::string& probe_script();
inline constexpr std::size_t kMaxSiteDirs = 32;

struct ProbeAnswer {
  facts::PythonFacts facts;       // interpreter/source left to the caller
  std::vector<std::string> site;  // from the answer, bounded
};

// The interpreter's stdout. The last line that parses as the answer counts (a sitecustomize may
// print before it); errors say what was wrong in `facts.error`.
ProbeAnswer parse_probe_output(std::string_view stdout_text);

}  // namespace ddp::pyenv

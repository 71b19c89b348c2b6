// Inside ddp::jobspec only: the job file's parser over a document already built (the command
// line's flags, flags.cpp), so a flag and a key are checked by the same rules.
#pragma once

#include "jobspec/jobspec.hpp"

#include <yaml-cpp/yaml.h>

namespace ddp::jobspec {

// `where` names the source in diagnostics (a built node has no line or column). Throws JobSpecError.
JobSpec parse_job_node(const YAML::Node& root, const std::string& where);

}  // namespace ddp::jobspec

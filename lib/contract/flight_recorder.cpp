#include "contract/flight_recorder.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace ddp::contract {

std::string flight_dump_name(int rank) {
  return fmt::format("{}{}", kFlightDumpPrefix, rank);
}
std::string flight_pipe_name(int rank) {
  return fmt::format("{}{}.pipe", kFlightDumpPrefix, rank);
}

std::optional<int> flight_dump_rank(const std::string& name) {
  const std::string_view prefix = kFlightDumpPrefix;
  if (name.size() <= prefix.size() || name.size() > prefix.size() + 8 || name.compare(0, prefix.size(), prefix) != 0)
    return std::nullopt;
  int rank = 0;
  for (std::size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    rank = rank * 10 + (name[i] - '0');
  }
  return rank;
}

const std::vector<std::string>& flight_recorder_variables() {
  static const std::vector<std::string> names{"TORCH_NCCL_TRACE_BUFFER_SIZE",    "TORCH_FR_BUFFER_SIZE",
                                              "TORCH_NCCL_DUMP_ON_TIMEOUT",      "TORCH_FR_DUMP_ON_TIMEOUT",
                                              "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE",
                                              "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"};
  return names;
}

FlightRecorderPlan flight_recorder(const std::optional<std::string>& torch_version, const std::string& attempt_dir,
                                   const Env& chosen) {
  const auto& names = flight_recorder_variables();
  if (auto it = std::find_if(names.begin(), names.end(), [&](const auto& n) { return chosen.count(n) != 0; });
      it != names.end()) {
    return {{},
            fmt::format("the job sets {} itself: its flight recorder settings are left as they are, and ddpctl "
                        "reads no dumps",
                        *it)};
  }
  const auto release = torch_version ? parse_torch_release(*torch_version) : std::nullopt;
  if (!release) {
    return {{},
            torch_version ? fmt::format("PyTorch {} is not a release ddpctl can read: flight recorder not turned on",
                                        *torch_version)
                          : "the job's PyTorch is not known: flight recorder not turned on"};
  }
  if (*release < kTorchFlightRecorder) {
    return {{},
            fmt::format("PyTorch {} has no NCCL flight recorder that ddpctl can use (2.3 and later)", *torch_version)};
  }
  const auto prefix = fmt::format("{}/{}", attempt_dir, kFlightDumpPrefix);
  return {{{"TORCH_NCCL_TRACE_BUFFER_SIZE", std::to_string(kFlightRecorderEntries)},
           {"TORCH_NCCL_DUMP_ON_TIMEOUT", "1"},
           {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE", prefix},
           {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE", prefix}},
          fmt::format("PyTorch {}: NCCL flight recorder on, dumps in {}<rank>", *torch_version, prefix)};
}

FlightRecorderPlan flight_recorder(const jobspec::JobSpec& spec, const NodeContext& node, const Env& chosen) {
  if (spec.container)
    return {{}, "a container job: the attempt folder is not mounted in, flight recorder not turned on"};
  return flight_recorder(node.torch_version, node.attempt_dir, chosen);
}

}  // namespace ddp::contract

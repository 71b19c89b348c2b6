#include "attempt/bind.hpp"

#include <fmt/format.h>

namespace ddp::launch {

void lay_binding(contract::Plan& plan, const binding::Plan& b) {
  for (auto& r : plan.ranks) {
    const auto& rb = b.ranks.at(static_cast<std::size_t>(r.local_rank));
    auto shown = binding::to_json(rb);
    std::string reason = rb.reason();
    auto set_env = [&](const std::string& key, const std::optional<std::string>& value) {
      if (!value) return;
      if (auto it = r.env.find(key); it != r.env.end()) {
        if (it->second != *value) reason += fmt::format("; {} kept as the job's env sets it", key);
        return;
      }
      r.env[key] = *value;
    };
    set_env("CUDA_VISIBLE_DEVICES", rb.cuda_visible_devices);
    const auto& hca = rb.nccl_ib_hca ? rb.nccl_ib_hca : b.nccl_ib_hca;
    set_env("NCCL_IB_HCA", hca);
    shown["reason"] = reason;
    shown["nccl_ib_hca"] = hca ? nlohmann::json(*hca) : nlohmann::json(nullptr);
    r.binding = std::move(shown);
    r.cpus = rb.cpus;
    r.mem_node = rb.mem_node;
  }
}

}  // namespace ddp::launch

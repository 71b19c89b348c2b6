// What the launching process knows of its own host: its environment, hostname and the CPUs it
// may use. Shared by the local launcher and the agent, which both plan workers for this host.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace ddp {

std::map<std::string, std::string> own_environment();
std::string own_hostname();
int usable_cpus();                // CPUs in this process's affinity mask
std::vector<int> own_affinity();  // those CPUs, ascending

}  // namespace ddp

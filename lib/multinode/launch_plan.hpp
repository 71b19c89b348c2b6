// The multi-node launch's policy (`ddpctl launch --nodes|--ssh|--slurm|--coordinator`, or a job
// file with hosts:): from ddpctl's flags and the job file to the coordinator's options, or to
// the reason it cannot run.
//
// Policy: pure. plan_multi_node decides which nodes (--nodes, hosts:, or the SLURM allocation
// in the launcher's environment), checks nnodes against them, applies the flags to the spec,
// makes relative paths absolute against the launcher's working directory (agents have none of
// their own), names the job, picks how the nodes are reached (Reach) and refuses every flag that
// does not fit the others, each refusal saying what to do instead. The clock, the working
// directory, the environment and the randomness of a job id come in through LaunchContext. The
// edge that acts on a plan (token files, secrets, dialers) is reach.hpp.
#pragma once

#include "coordinator/coordinator.hpp"
#include "jobspec/jobspec.hpp"
#include "net/advertise.hpp"

#include <cstdint>
#include <ctime>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddp::multinode {

// ddpctl launch's flags, as parsed (CLI11 in apps/ddpctl/cmd_launch.cpp).
struct LaunchFlags {
  std::optional<jobspec::Nproc> nproc;
  std::optional<int> max_restarts;
  std::optional<std::string> log_dir;
  std::optional<int> master_port;
  std::string ranks;
  std::string job_id;
  std::string result_json;
  std::string nodes;
  std::string facts;
  bool dry_run = false;
  bool quiet = false;
  std::string token_file;
  bool tls = false;
  bool ssh = false;
  bool ssh_accept_new = false;
  double ssh_timeout_s = 15;
  int ssh_parallel = 8;
  std::string coordinator;
  bool detach = false;
  bool slurm = false;
  std::vector<std::string> srun_args;
  std::string advertise_addr;
};

// What the launcher is and sees, injected.
struct LaunchContext {
  std::string cwd;                         // the launcher's working directory (absolute)
  std::map<std::string, std::string> env;  // the launcher's environment
  std::string user;                        // net::local_user()
  std::tm local_time{};                    // now, for a job id
  std::uint16_t random = 0;                // for a job id
};

// How the coordinator reaches the agents.
enum class Reach {
  tcp,       // --nodes: their ddp-agentd on TCP, with the token file
  ssh,       // --ssh: a one-shot ddp-agentd started over SSH
  slurm,     // --slurm: one-shot agents started by one srun step
  standing,  // --coordinator: the job is submitted to a standing ddp-coordinator
};

struct MultiNodePlan {
  coordinator::CoordinatorOptions options;  // keys and make_dialer not yet set (reach.hpp)
  Reach reach = Reach::tcp;
  std::string coordinator_host;                    // Reach::standing
  std::uint16_t coordinator_port = 0;              // Reach::standing
  std::optional<net::AdvertiseAddr> connect_back;  // Reach::ssh with --advertise-addr
  std::string launcher_cwd;                        // srun's working directory (Reach::slurm)
};

struct PlanOutcome {
  std::optional<MultiNodePlan> plan;  // set: a multi-node launch
  std::string error;                  // set: refused, with what to do (exit 2)
  bool local() const { return !plan && error.empty(); }
};

PlanOutcome plan_multi_node(const LaunchFlags& flags, jobspec::JobSpec spec, const LaunchContext& context);

// The default job id: <name>-<date>-<time>-<random>.
std::string default_job_id(const std::string& name, const std::tm& local_time, std::uint16_t random);

}  // namespace ddp::multinode

// `ddpctl launch --slurm`'s way to reach the nodes (net::Dialer): one srun job step runs a
// one-shot ddp-agentd on every node; each agent listens on a port of its own choosing and
// announces it on stdout, which srun labels with the task (so the node) it came from; the
// coordinator then dials that node's port and authenticates with the run's secret, which the
// agents got through srun's environment (slurm::kSecretEnv), never on a command line.
//
// srun runs in a process group of its own (a terminal's Ctrl-C reaches ddpctl, which stops the
// job in order) with PR_SET_PDEATHSIG(SIGTERM): if ddpctl dies, even by SIGKILL, srun gets
// SIGTERM, which it passes to the agents, and the agents lose their coordinator anyway. The
// agents' stderr becomes log lines named after the node ("[slurm] n1| ..."); srun's own lines
// show at warning level. When srun ends before an agent announced itself, the node's dial fails
// (fatal before the job starts: the launch stops, naming the node and srun's exit status).
#pragma once

#include "common/duration.hpp"
#include "net/dialer.hpp"
#include "slurm/slurm.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/streambuf.hpp>

#include <sys/types.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddp::slurm {

struct StepDialerOptions {
  StepOptions step;
  std::string secret;                      // the run's secret, for kSecretEnv
  std::map<std::string, std::string> env;  // srun's environment (ddpctl's own), without the secret
  std::string workdir;                     // srun's working directory
  Millis dial_timeout{5000};
  Millis stop_grace{30000};  // the job's stop.grace: the agents' time to stop workers
};

class StepDialer final : public net::Dialer {
 public:
  // Starts srun at once. Throws SlurmError when it cannot be started (not on PATH, ...).
  StepDialer(boost::asio::io_context& io, StepDialerOptions options);
  // Ends the step: the one-shot agents exit once their coordinator is gone, so srun is waited
  // for a moment first; then SIGTERM (srun passes it to the agents, which stop their workers
  // within the grace), then SIGKILL.
  ~StepDialer() override;

  void dial(const net::NodeEntry& node, std::function<void(net::Dialed)> done) override;
  std::string describe(const net::NodeEntry& node) const override;

 private:
  void read_stdout();
  void read_stderr();
  void connect(int task, std::function<void(net::Dialed)> done);
  void on_srun_gone();
  std::string node_of(int task) const;
  bool wait_exit(Millis timeout);

  boost::asio::io_context& io_;
  StepDialerOptions opts_;
  pid_t pid_ = -1;
  std::optional<int> status_;  // srun's wait status once reaped
  boost::asio::posix::stream_descriptor out_, err_;
  // srun's output is read in lines of at most kMaxLine bytes; a longer one comes in pieces, so a
  // step that prints without newlines cannot grow ddpctl's memory.
  static constexpr std::size_t kMaxLine = 64 * 1024;
  boost::asio::streambuf out_buf_{kMaxLine}, err_buf_{kMaxLine};
  std::map<std::string, int> task_of_;                     // node name -> task
  std::vector<std::optional<std::uint16_t>> ports_;        // by task: the announced port
  std::vector<std::function<void(net::Dialed)>> pending_;  // by task: a dial waiting for it
  std::vector<bool> dialled_;                              // by task: its one connection is made
  bool stdout_open_ = true;
  std::string gone_;  // set when srun's stdout closed: why no more agents will come
};

}  // namespace ddp::slurm

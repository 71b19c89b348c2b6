// The agent <-> shepherd message set, as JSON bodies of length-prefixed frames (proto/frame.hpp)
// on a local socketpair. Pure: encoding and strict decoding, no I/O.
//
//   agent -> shepherd:  start {attempt_dir, options, plan}   run one attempt's workers
//                       stop {signal, interrupt_ms?}         SIGTERM, grace, SIGKILL (interrupt_ms:
//                                                            SIGINT first, SIGTERM that long after)
//                       kill {}                              SIGKILL now (a stop with no grace)
//                       forward {signal}                     SIGUSR1/2 to every worker, as it is
//                       stacks {id, local_ranks, native, budget_ms}  read the running ranks' stacks
//   shepherd -> agent:  started {pids}                       every rank forked and exec'd (or not):
//                                                            pids by local rank, 0 for one that did not start
//                       line {rank, stream, data}            one output line (already in the log file)
//                       first_failure {exit}                 the attempt is stopping because of it
//                       finished {report}                    the attempt is over, nothing of it runs
//                                                            (report.stacks: where the ranks were when
//                                                            it was stopped, attempt/failure_stacks.hpp)
//                       stacks_read {id, ranks: [{rank, process}]}   the answer to 'stacks' (also after
//                                                            the attempt ended); process: stacks::to_json
//                       progress {idle_ms, stacks}           the hang watchdog: the node went idle
//                                                            (idle_ms > 0, its merged stacks) or progressed again (0)
//
// The peer is our own process, but a message is still checked field by field before use: a
// wrong one ends the conversation (and, in the shepherd, the job's processes) instead of being
// half understood. Frames are bounded (kMaxFrameBytes): a start for a few hundred ranks, each with
// a large environment, fits; one output line is at most 64 KiB.
#pragma once

#include "attempt/report.hpp"
#include "contract/contract.hpp"
#include "launch/worker_group.hpp"
#include "stacks/merge.hpp"

#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::shepherd {

inline constexpr std::size_t kMaxFrameBytes = 16u << 20;

class MessageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct StartAttempt {
  std::string attempt_dir;
  launch::GroupOptions options;
  contract::Plan plan;
};

// The message's type; throws MessageError unless it is an object with a known type for `from`.
enum class Sender { agent, shepherd };
std::string message_type(const nlohmann::json& m, Sender from);

nlohmann::json encode_start(const StartAttempt& s);
StartAttempt decode_start(const nlohmann::json& m);

nlohmann::json encode_signal(std::string_view type, int signal);  // stop, forward
int decode_signal(const nlohmann::json& m);                       // 1..64
Millis decode_interrupt(const nlohmann::json& m);                 // a stop's interrupt_ms (0: none)

nlohmann::json encode_started(const std::vector<pid_t>& pids);
std::vector<pid_t> decode_started(const nlohmann::json& m);

struct Line {
  int rank = 0;
  supervisor::Stream stream = supervisor::Stream::out;
  std::string data;
};
nlohmann::json encode_line(const Line& l);
Line decode_line(const nlohmann::json& m);

nlohmann::json encode_first_failure(const launch::WorkerExit& e);
launch::WorkerExit decode_first_failure(const nlohmann::json& m);

nlohmann::json encode_finished(const launch::AttemptReport& r);
launch::AttemptReport decode_finished(const nlohmann::json& m);

struct StacksRequest {
  std::uint64_t id = 0;
  launch::WorkerGroup::StacksQuery query;
};
nlohmann::json encode_stacks(const StacksRequest& r);
StacksRequest decode_stacks(const nlohmann::json& m);

struct StacksRead {
  std::uint64_t id = 0;
  std::vector<stacks::RankStacks> ranks;  // node: "" (the agent names its node)
};
// Fits in a frame: when the stacks would not, native frames and then every thread but the main
// one are left out (said in each process's errors).
nlohmann::json encode_stacks_read(StacksRead r);
StacksRead decode_stacks_read(const nlohmann::json& m);  // hostile-input checks of stacks::process_from_json
// The hang watchdog's node report (lib/hang NodeReporter): sent when the node's idle time
// crosses half the timeout, with the node's merged stacks of that moment, and when it
// progresses again (idle 0, no stacks). The stacks are cut to kMaxProgressStacks bytes.
inline constexpr std::size_t kMaxProgressStacks = 60'000;
struct Progress {
  Millis idle{0};
  std::string stacks;
};
nlohmann::json encode_progress(const Progress& p);
Progress decode_progress(const nlohmann::json& m);

// JSON text of a message; invalid UTF-8 in output lines is replaced, never an exception.
std::string dump(const nlohmann::json& m);

}  // namespace ddp::shepherd

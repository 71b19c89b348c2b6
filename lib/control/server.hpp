// The launcher's control socket (AF_UNIX, 0600, in control/paths.hpp's folder): `ddpctl status`,
// `logs [-f]` and `stop` from another terminal reach the job here. Protocol in protocol.hpp.
//
// Policy: only our own uid or root may talk (SO_PEERCRED, on top of the 0600 socket in a 0700
// folder); a request is one line of at most 4 KiB within 5 s, or the client is dropped; a
// follower that reads slower than the job writes loses lines (counted, and told), never slows the
// job down. The socket file is removed when the server goes (and a stale one of a SIGKILLed
// launcher, found when binding, is replaced).
#pragma once

#include "common/stream.hpp"
#include "control/paths.hpp"
#include "control/protocol.hpp"
#include "net/acceptor.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace ddp::control {

struct Provider {
  std::function<nlohmann::json()> status;
  std::function<void(const std::string& who)> stop;  // like Ctrl-C; `who` names the asking process
  // (rank, path) of the current attempt's log files for `ranks` (empty: all), flushed to disk.
  std::function<std::vector<std::pair<int, std::string>>(const std::set<int>& ranks)> log_files;
  // `ddpctl stacks`: the running ranks' stacks ({"world_size", "ranks": [{"rank", "node",
  // "process"}]}, protocol.hpp), handed to `reply` once, on the io_context, within the job's own
  // deadline. Unset: the launcher cannot (the reply says so).
  std::function<void(const std::set<int>& ranks, bool native, std::function<void(nlohmann::json)> reply)> stacks;
};

class Server {
 public:
  // Listens on `path`; throws ControlError when it cannot (another launcher runs that job id).
  // `records`: the folder of the job's end record (records_dir(), the user's, when empty).
  Server(boost::asio::io_context& io, std::string path, Provider provider, std::string records = {});
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  const std::string& path() const { return path_; }
  // A worker's line, to every follower.
  void publish(int rank, Stream stream, const std::string& line);
  // The job is over: followers get {"end": result}; every client is closed once its queue is
  // written (at most 2 s: a stuck client must not hold the launcher's exit); nothing more is accepted.
  // `record`: the job's end record (paths.hpp; the provider's log files added), left before any
  // client hears of the end, so `ddpctl stop J && ddpctl status J` finds it.
  void end(const std::string& result, std::optional<Ended> record = std::nullopt);
  // The end record again (what ended differently after end(): a result file that could not be written).
  void leave_record(Ended record);

  struct Client;

 private:
  void accept();
  void on_socket(boost::asio::local::stream_protocol::socket s);
  void on_request(const std::shared_ptr<Client>& c, const std::string& line);
  std::optional<std::string> missing_ranks(const std::set<int>& wanted) const;  // why `wanted` is refused

  boost::asio::io_context& io_;
  std::string path_;
  std::string records_;  // empty: records_dir()
  Provider provider_;
  boost::asio::local::stream_protocol::acceptor acceptor_;
  std::set<std::shared_ptr<Client>> clients_;
  boost::asio::steady_timer end_timer_;
  std::chrono::steady_clock::time_point end_deadline_;
  void close_when_done();
  std::string job_id_;  // the socket's name, less ".sock"
  ino_t inode_ = 0;
  bool ended_ = false;
  std::optional<net::Acceptor<boost::asio::local::stream_protocol>> accept_loop_;  // last: uses acceptor_
};

}  // namespace ddp::control

// One protocol connection over a stream socket: the Asio edge around a proto::Session.
//
// The stream is TCP (agents listening on the network) or one end of a socketpair whose other
// end a pump feeds (SSH mode: the launcher's end pumps a libssh channel, the agent's end pumps
// its stdin/stdout); the session cannot tell the difference, and neither can the owners,
// except that only TCP has endpoints.
//
// Owns the socket, the handshake deadline, the write queue and the read loop; carries out the
// session's effects in order (Send: queue the frame; Established/Deliver: hand to the owner;
// Drop: flush what is queued, e.g. the error frame that explains the drop, then close and log
// the reason with the peer's name). Every callback runs on the io_context's thread.
//
// Lifetime: pending operations hold a shared_ptr, so an owner may forget a connection inside
// its own on_closed. on_closed fires exactly once, for a drop by either side or close().
#pragma once

#include "common/duration.hpp"
#include "net/tls.hpp"
#include "proto/session.hpp"

#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ddp::net {

using tcp = boost::asio::ip::tcp;
using stream_socket = boost::asio::generic::stream_protocol::socket;

// TLS under the frames (tls.hpp): the dialling side is the client; an accepting side with
// TlsMode::allowed tells TLS from plaintext by the first byte, with required refuses plaintext.
struct TlsSetup {
  std::shared_ptr<boost::asio::ssl::context> context;
  bool server = false;
  TlsMode mode = TlsMode::required;  // for a server
};

struct ConnectionHandlers {
  std::function<void(const proto::PeerInfo&)> on_established;
  std::function<void(proto::Message)> on_message;
  std::function<void(const std::string& reason)> on_closed;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  // `label` names the peer in every log line ("n2 (10.0.0.2:29410)"); `log_subsystem` picks the logger.
  static std::shared_ptr<Connection> make(tcp::socket socket, proto::Session session, std::string label,
                                          std::string log_subsystem, Millis handshake_timeout);
  // Over a non-TCP stream (a socketpair end): no endpoints.
  static std::shared_ptr<Connection> make(stream_socket socket, proto::Session session, std::string label,
                                          std::string log_subsystem, Millis handshake_timeout);
  ~Connection();

  // Before start(): run the connection inside TLS.
  void use_tls(TlsSetup tls) { tls_setup_ = std::move(tls); }
  // Before start(): a place among a listener's unauthenticated connections (acceptor.hpp),
  // given back once the peer has authenticated or the connection has ended.
  void hold_until_established(std::shared_ptr<void> slot) { pending_slot_ = std::move(slot); }
  // Starts reading and the handshake (a client sends its hello now; TLS's handshake, if any,
  // comes first; the handshake deadline covers both).
  void start(ConnectionHandlers handlers);
  // Whether the frames travel inside TLS (known once the protocol's handshake has started).
  bool encrypted() const { return tls_ != nullptr; }
  // Seals and queues an application message; false when the session is not established (or gone).
  bool send(const nlohmann::json& message);
  // send() with one member given as encoded JSON object text (proto::Session::seal_with).
  bool send_with(nlohmann::json message, std::string_view key, std::string_view object_json);
  // send() of a heartbeat, encoded without a DOM (proto::Session::seal_heartbeat).
  bool send_heartbeat(std::int64_t now_us, std::optional<proto::Session::Echo> echo = std::nullopt);
  // Between cork() and uncork(), frames queue and then leave in one write: a round's assign
  // and start to one node cost one system call, not two. Nests (a read handler corks too).
  void cork() { ++corked_; }
  void uncork();
  // cork() for a scope.
  class Cork {
   public:
    explicit Cork(Connection& c) : c_(c) { c_.cork(); }
    ~Cork() { c_.uncork(); }
    Cork(const Cork&) = delete;
    Cork& operator=(const Cork&) = delete;

   private:
    Connection& c_;
  };
  // Refuses the peer (an 'error' frame with code and message), then closes.
  void refuse(proto::ErrorCode code, const std::string& message, const std::string& hint = "");
  // Closes from our side without telling the peer (it sees EOF).
  // `routine`: an expected end (the job is over, a query answered), logged at debug, not info:
  // a launch of 4096 nodes should not end with 4096 lines saying so.
  void close(const std::string& reason, bool routine = false);

  proto::Session& session() { return session_; }
  bool established() const { return session_.established() && !closing_; }
  bool open() const { return !closed_; }
  const std::string& label() const { return label_; }
  void set_label(std::string label) { label_ = std::move(label); }
  // How many reads on the calling thread have filled their buffer (the peer had more to send
  // than one read takes), since the thread began: a loop that paces itself (the coordinator's
  // steady state) does not pause while a connection streams.
  static std::uint64_t full_reads_on_this_thread();
  // Bytes queued for the peer and not yet written (output backpressure for the agent).
  std::size_t queued_bytes() const { return queued_bytes_; }
  // A peer that does not read is dropped once what is queued for it would pass this
  // (kMaxQueuedBytes unless set): authenticated or not, no peer grows our memory without bound.
  // The owners' own soft limits (an agent drops output lines past 64 MiB, a standing
  // coordinator's relays pause) keep a slow but reading peer under it.
  static constexpr std::size_t kMaxQueuedBytes = std::size_t{128} << 20;
  void set_max_queued_bytes(std::size_t bytes) { max_queued_bytes_ = bytes; }
  // The TCP endpoints; nullopt over a socketpair.
  std::optional<tcp::endpoint> remote_endpoint() const { return remote_; }
  std::optional<tcp::endpoint> local_endpoint() const { return local_; }

 private:
  Connection(stream_socket socket, proto::Session session, std::string label, std::string log_subsystem,
             Millis handshake_timeout);
  struct TlsStream;
  void begin();
  void detect_tls();
  void tls_handshake();
  void read();
  void apply(proto::Effects effects);
  // Runs a handler; if it throws, logs it, refuses the peer and returns false.
  // `type`: the delivered message's, put into words only on a failure; nullopt: the handler of
  // the authentication.
  bool guarded(std::optional<std::string_view> type, const std::function<void()>& handler);
  void queue(std::string frame);
  void write();
  void finish_close();
  void closed(const std::string& reason);

  stream_socket socket_;
  std::optional<TlsSetup> tls_setup_;
  std::unique_ptr<TlsStream> tls_;  // over socket_; declared after it, so destroyed first
  proto::Session session_;
  std::string label_;
  std::string log_subsystem_;
  Millis handshake_timeout_;
  boost::asio::steady_timer timer_;  // handshake deadline, then the linger after a drop
  std::optional<tcp::endpoint> remote_, local_;
  ConnectionHandlers handlers_;
  std::deque<std::string> out_;
  // The frames of out_ in the write in flight (at most kMaxGather: one writev, under IOV_MAX).
  static constexpr std::size_t kMaxGather = 64;
  std::vector<boost::asio::const_buffer> gather_;
  std::size_t queued_bytes_ = 0;
  std::size_t max_queued_bytes_ = kMaxQueuedBytes;
  bool overflowed_ = false;  // past max_queued_bytes_: frames are no longer queued, the close is posted
  bool writing_ = false;
  // While this connection's bytes are being handled, or between cork() and uncork(): frames
  // wait, and whatever the handling sends this peer (auth and the first session frame, a
  // reply) leaves in one write after it. A depth: the two may nest.
  int corked_ = 0;
  bool closing_ = false;  // a drop: flush the queue, then close
  bool closed_ = false;
  bool was_established_ = false;
  bool routine_close_ = false;
  bool warn_close_ = false;  // dropped for misbehaving (overflowed_): logged as a warning
  bool started_ = false;     // the protocol's handshake (after TLS's, if any)
  std::string close_reason_;
  std::shared_ptr<void> pending_slot_;
  // The read buffer: 1 KiB while the peer sends small frames (most connections, all their
  // life), 4x larger after a read that filled it, up to 64 KiB (a worker's output stream). At
  // 4096 nodes a fixed 64 KiB each was 256 MiB of heap, and its page faults showed.
  static constexpr std::size_t kReadStart = 1024, kReadMax = 64 * 1024;
  std::unique_ptr<char[]> buf_;  // not zeroed
  std::size_t buf_size_ = 0;
};

// Resolves and connects with a deadline; `done` gets an error or the connected socket.
void dial(boost::asio::io_context& io, const std::string& host, std::uint16_t port, Millis timeout,
          std::function<void(boost::system::error_code, tcp::socket)> done);

// The local user's name, for hello and job messages ("uid 1234" when it has no name).
std::string local_user();

// The source address this machine picks for sending to IP `address` (a UDP socket's connect,
// which sends nothing); empty when there is no route or `address` is not an IP address.
std::string route_source(const std::string& address);

}  // namespace ddp::net

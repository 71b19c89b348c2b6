// The c10d TCPStore wire protocol, as bytes: an incremental request decoder for both protocol
// families on one port, and the encoders for requests (tests, benchmark) and replies (server).
//
// Policy:
//  - No sockets here, no clock: bytes in, requests out. The server feeds whatever recv() gave it.
//  - Layouts (docs/store-protocol.md has each release's, with its source): a connection whose
//    first bytes are 00 CE F7 85 3C (VALIDATE with the magic 0x3C85F7CE) is PyTorch 2.2 or later,
//    one append-only enum for all of them. Any other start is a release without VALIDATE: 1.13
//    and 2.0 (WATCH_KEY=7, DELETE_KEY=8) or 2.1 (DELETE_KEY=7, APPEND=8, MULTI_GET=9,
//    MULTI_SET=10, CANCEL_WAIT=11). Opcodes 0..6 mean the same in both; 9..11 prove 2.1; 7 and 8
//    cannot be told apart from the bytes, and are read as the LegacyHint says (the job's PyTorch,
//    or store.protocol in the job file). Without a hint they are refused with a message naming
//    the releases and the fix, never guessed.
//  - Integers are little-endian, as PyTorch sends them (host-order memcpy on x86/arm64). We
//    encode and decode them byte by byte, so this code means the same on any host.
//  - Every length and count is checked against Limits the moment it is read, before a single
//    byte of its payload is buffered; the request under construction also counts against the
//    per-connection budget. A decoder never holds more than one request: fields are moved into
//    the request as they complete, with no staging buffer.
//  - The decoder is resumable at every byte boundary (a request may arrive one byte per read).
//  - After an error the decoder stays failed; the connection is to be closed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::store {

enum class Protocol : uint8_t {
  unknown,  // nothing decided yet (fewer than the deciding bytes seen)
  legacy,   // no VALIDATE: 1.13, 2.0 or 2.1; only opcodes 0..6 (the same in all three) seen yet
  v1,       // PyTorch 1.13 and 2.0 (no VALIDATE; WATCH_KEY=7, DELETE_KEY=8)
  v21,      // PyTorch 2.1 (no VALIDATE; DELETE_KEY=7 .. CANCEL_WAIT=11)
  v2,       // PyTorch 2.2 and later (VALIDATE first; PING, queues, LIST_KEYS, BARRIER appended since)
};
// The releases a layout stands for: "1.13–2.1", "1.13–2.0", "2.1", "2.2+".
std::string_view to_string(Protocol p);

// How a connection without VALIDATE reads opcodes 7 and 8 when its own bytes have not told
// (legacy_hint() makes one). layout v1 or v21: read so; v2: the job runs 2.2 or later, so such a
// client is not the job's and is refused; unknown: refused (the job's PyTorch is not known).
struct LegacyHint {
  Protocol layout = Protocol::unknown;
  std::string source;  // why, for messages: "the job's PyTorch 2.1.2", "store.protocol 2.1"
  bool operator==(const LegacyHint&) const = default;
};

// The PyTorch release {major, minor} of a version string ("2.1.2+cu121", "1.13.1"); nullopt when
// it does not start with two dotted numbers, or is not a release from 1.13 on.
struct Release {
  int major = 0, minor = 0;
  friend auto operator<=>(const Release&, const Release&) = default;
};
std::optional<Release> parse_release(std::string_view version);
// The wire layout of a release: v1 (1.13, 2.0), v21 (2.1), v2 (2.2 and later).
Protocol layout_of(Release r);
// store_protocol: the job file's store.protocol ("auto" or empty: not given, or a release such as
// "2.1"); torch_version: the job's PyTorch as probed on the store's node, if known. store.protocol
// wins over the probe.
LegacyHint legacy_hint(std::string_view store_protocol, const std::optional<std::string>& torch_version);

// Operations, independent of their numbering on the wire.
enum class Op : uint8_t {
  validate,
  set,
  compare_set,
  get,
  add,
  check,
  wait,
  get_num_keys,
  watch_key,
  delete_key,
  append,
  multi_get,
  multi_set,
  cancel_wait,
  ping,
  queue_push,
  queue_pop,
  queue_len,
  list_keys,
  barrier,
};
std::string_view to_string(Op op);

inline constexpr uint32_t kValidateMagic = 0x3C85F7CE;

// Reply enums (1 byte on the wire).
inline constexpr uint8_t kCheckReady = 0, kCheckNotReady = 1;
inline constexpr uint8_t kStopWaiting = 0, kWaitCanceled = 1;
inline constexpr uint8_t kWatchKeyUpdated = 0, kWatchKeyCreated = 1, kWatchKeyDeleted = 2, kWatchCallbackRegistered = 3;

// Upper bounds on what one client may make us hold. PyTorch's libuv server caps keys at 8 KiB,
// values at 8 MiB and batches at 128 Ki keys; we accept 8x those so that no PyTorch client is
// refused by us that PyTorch's own server would serve.
struct Limits {
  std::size_t max_key_bytes = 64 * 1024;
  std::size_t max_value_bytes = 64 * 1024 * 1024;
  std::size_t max_batch_keys = 1024 * 1024;
  // Per connection: the request being decoded plus replies not yet written. A MULTI_SET of a
  // few maximal values, or a GET of a maximal value to a slow reader, fits.
  std::size_t max_connection_bytes = 256 * 1024 * 1024;
  // Per connection: replies queued for a client that is not reading them. One reply of any
  // size (up to max_connection_bytes) may always be queued; another on top of what is still
  // unwritten only while the sum stays under this (one maximal value plus 16 MiB). PyTorch's
  // clients wait for each reply, so only a client that does not read comes near it.
  std::size_t max_unread_bytes = 80 * 1024 * 1024;
};

// One decoded request. Fields not used by `op` are empty/zero.
//   key:    SET/COMPARE_SET/GET/ADD/WATCH_KEY/DELETE_KEY/APPEND/QUEUE_*/BARRIER
//   value:  SET/APPEND/QUEUE_PUSH value; COMPARE_SET expected
//   value2: COMPARE_SET desired
//   keys:   CHECK/WAIT/MULTI_GET/MULTI_SET keys; values: MULTI_SET values (same length)
//   number: ADD delta, BARRIER world size
//   word:   VALIDATE magic, PING nonce (the client's pid)
struct Request {
  Op op = Op::set;
  std::string key;
  std::string value;
  std::string value2;
  std::vector<std::string> keys;
  std::vector<std::string> values;
  int64_t number = 0;
  uint32_t word = 0;

  void clear();
  bool operator==(const Request&) const = default;
};

// The wire opcode of `op` in protocol `p`, or -1 when `p` has no such operation.
int opcode_of(Protocol p, Op op);

class Decoder {
 public:
  enum class Status { need_more, request, error };

  explicit Decoder(Limits limits = {}, LegacyHint hint = {});

  // Consumes bytes from the front of `in` until one request is complete (Status::request: it is
  // request(), and `in` holds what follows it), the input runs out (need_more: all consumed), or
  // the bytes are invalid (error: see error()).
  Status next(std::span<const uint8_t>& in);
  // The request next() completed, until next() is called again; the caller may move from it.
  // The decoder reuses its small buffers for the next request (Request::clear).
  Request& request() { return cur_; }
  // next(), the request moved into `out` (overwritten on Status::request only).
  Status next(std::span<const uint8_t>& in, Request& out);

  Protocol protocol() const { return protocol_; }
  const std::string& error() const { return error_; }
  // Bytes held for the request under construction (counted against max_connection_bytes).
  std::size_t pending_bytes() const { return held_; }
  // Lowers the budget of the request under construction (the server passes what its pending
  // output leaves of max_connection_bytes). Checked at the next length read.
  void set_budget(std::size_t bytes) { budget_ = bytes; }
  // True between requests (no partial request held).
  bool idle() const { return stage_ == Stage::opcode && protocol_ != Protocol::unknown; }

 private:
  enum class Stage : uint8_t { detect, opcode, u32, i64, len, bytes, count };
  enum class Field : uint8_t { none, key, value, value2, keys_item, values_item, number, word, count };

  bool begin_request(uint8_t opcode);
  bool resolve_legacy(uint8_t opcode);  // protocol_ legacy: decides v1/v21 for this opcode, or fails
  bool fail(std::string message);
  bool after_field();  // the next field of the current op, or completion
  bool start_integer(Stage s, Field f);
  bool start_bytes(Field f);
  std::string* bytes_target();
  std::size_t max_len_for(Field f) const;

  Limits limits_;
  LegacyHint hint_;
  std::size_t budget_;
  Protocol protocol_ = Protocol::unknown;
  Stage stage_ = Stage::detect;
  Field field_ = Field::none;
  uint8_t scratch_[8]{};
  uint8_t have_ = 0;         // bytes in scratch_
  uint64_t remaining_ = 0;   // bytes still to copy into the current bytes field
  uint64_t items_left_ = 0;  // batch items still to read (after the current one)
  uint8_t step_ = 0;         // which field of the current op comes next
  std::size_t held_ = 0;
  bool done_ = false;
  bool handed_out_ = false;  // cur_ is a completed request the caller has seen
  Request cur_;
  std::string error_;
};

// Little-endian integer and string encoders (replies, and requests in tests and the benchmark).
void put_u8(std::string& out, uint8_t v);
void put_u32(std::string& out, uint32_t v);
void put_i64(std::string& out, int64_t v);
void put_u64(std::string& out, uint64_t v);
void put_bytes(std::string& out, std::string_view bytes);  // u64 length + bytes
uint32_t get_u32(const uint8_t* p);
uint64_t get_u64(const uint8_t* p);

// The bytes a PyTorch client of protocol `p` sends for `r` (the first VALIDATE of a 2.2+
// connection included only when r.op is validate; `legacy` encodes the opcodes 0..6 that 1.13–2.1
// share). Throws std::invalid_argument when `p` has no such operation.
std::string encode_request(Protocol p, const Request& r);

}  // namespace ddp::store

// The c10d TCPStore wire protocol, as bytes: an incremental request decoder for both protocol
// families on one port, and the encoders for requests (tests, benchmark) and replies (server).
//
// Policy:
//  - No sockets here, no clock: bytes in, requests out. The server feeds whatever recv() gave it.
//  - Families are told apart by the first bytes of a connection: 00 CE F7 85 3C (VALIDATE with
//    the magic 0x3C85F7CE) is 2.x (2.6+ enum); anything else is 1.13. The 1.13 family also
//    accepts opcodes 9..12 (APPEND, MULTI_GET, MULTI_SET, CANCEL_WAIT) because early 2.x clients
//    without VALIDATE used 1.13's enum extended that way; any other opcode is an error
//    ("unknown opcode N, PyTorch 2.0–2.5?").
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
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::store {

enum class Protocol : uint8_t {
  unknown,  // nothing decided yet (fewer than the deciding bytes seen)
  v1,       // PyTorch 1.13 (no VALIDATE, WATCH_KEY), plus the early-2.x opcodes 9..12
  v2,       // PyTorch 2.6+ (VALIDATE first, PING, queues, LIST_KEYS, BARRIER)
};
std::string_view to_string(Protocol p);

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

  explicit Decoder(Limits limits = {});

  // Consumes bytes from the front of `in` until one request is complete (Status::request: it is
  // in `out`, and `in` holds what follows it), the input runs out (need_more: all consumed), or
  // the bytes are invalid (error: see error()). `out` is overwritten on Status::request only.
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
  bool fail(std::string message);
  bool after_field();  // the next field of the current op, or completion
  bool start_integer(Stage s, Field f);
  bool start_bytes(Field f);
  std::string* bytes_target();
  std::size_t max_len_for(Field f) const;

  Limits limits_;
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

// The bytes a PyTorch client of protocol `p` sends for `r` (the first VALIDATE of a 2.x
// connection included only when r.op is validate). Throws std::invalid_argument when `p` has no
// such operation.
std::string encode_request(Protocol p, const Request& r);

}  // namespace ddp::store

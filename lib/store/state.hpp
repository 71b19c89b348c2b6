// The store's contents and its semantics: the key/value map, queues, WAIT and BARRIER waiters,
// and 1.13 WATCH_KEY watchers. Events in (a decoded request from a client, a disconnect),
// effects out (reply bytes for that client, pushes for others, or "close this client").
//
// Policy, matching PyTorch's servers (../shared/reference/torchrun.md 4.5) where they agree:
//  - WAIT replies STOP_WAITING at once when every key exists; otherwise the client is registered
//    on each key still missing and answered when the last of them appears (SET, ADD, APPEND,
//    MULTI_SET, a COMPARE_SET that creates the key, a QUEUE_PUSH for one waiter).
//  - A key "exists" for CHECK and WAIT when it is in the map or is a non-empty queue.
//  - CANCEL_WAIT drops the client's wait and replies WAIT_CANCELED, even when STOP_WAITING was
//    already sent (the client expects that race). Any other request from a client that still
//    has a wait registered means it gave up (a 1.13 client's recv timed out): its wait is
//    dropped first, so no stale STOP_WAITING byte can arrive as the answer to a later request.
//  - ADD parses the stored value the way std::stoll does (leading blanks, sign, digits, rest
//    ignored), adds with two's-complement wrap-around, and stores std::to_string of the sum. A
//    value with no number in front closes that client, as in PyTorch.
//  - COMPARE_SET: missing + expected empty -> store desired, return desired; missing + expected
//    non-empty -> return expected, store nothing; present -> replace iff equal to expected,
//    return the value now stored.
//  - GET/MULTI_GET of a missing key return an empty value (the libuv server's answer; the legacy
//    server dropped the connection). Clients WAIT before they GET, so this only shows after a
//    DELETE_KEY race.
//  - DELETE_KEY returns the i64 number erased; GETNUMKEYS and LIST_KEYS see the map only.
//  - QUEUE_POP replies the queue's length before the pop, then the popped value if there was
//    one. A push wakes one waiter (one that waits for nothing else, if any).
//  - BARRIER increments the decimal counter at its key; at >= world size it wakes every waiter
//    on the key and replies STOP_WAITING, below it parks the client as a waiter on the key.
//  - WATCH_KEY (1.13, on the client's second connection) replies KEY_CALLBACK_REGISTERED and,
//    until that connection closes, pushes u8 type + key + old + new on every SET, ADD, APPEND,
//    COMPARE_SET that changes the value, and DELETE_KEY of the key. A key takes at most
//    Totals::max_watchers_per_key watches (1024), so one change of it pushes at most that many;
//    a WATCH_KEY past it is refused as a request past the totals is (below). What one request's
//    changes push to watchers is bounded too (Totals::max_notify_bytes_per_request): the
//    watches, in the order they were registered, are sent the message while the request's pushes
//    fit the bound (the first always is: one message costs what a GET of the value does); the
//    clients of the watches past it are dropped (Effects::dropped_watchers, all their watches
//    gone at once; the server closes their connections, as it closes a client that does not
//    read its replies), not the change: the requester's SET stands and is answered as before.
//  - A wrong VALIDATE magic closes the client.
//  - Totals (one store is one job's, whoever its clients are): the bytes of keys, values and
//    queue items, the number of keys, of queue items and of wait/watch registrations are bounded
//    by Totals. A request that would pass one (or an APPEND that would grow a value past
//    Limits::max_value_bytes) changes nothing and closes its client with a close_reason that
//    names the limit: PyTorch's protocol has no error reply, so the client sees its connection
//    closed, and the server's log says which limit and which peer.
//  - What waits and watches hold counts too: a waited or watched key is kept once however many
//    clients name it, and its bytes count against Totals::max_bytes with the keys, values and
//    queue items. Every registration is dropped in constant time (a disconnect costs what the
//    client registered, not what everyone else did), so no client can make another's request,
//    or the server's wait report, wait on a long scan. Keys deleted are remembered for the
//    report up to kMaxDeletedBytes.
//  - Replies are bounded like requests: a MULTI_GET or LIST_KEYS whose reply would pass
//    Limits::max_connection_bytes closes its client before any of it is built. A WATCH_KEY
//    message is built once and shared by every watcher's Push.
//
// Exception safety: apply() either completes or throws std::bad_alloc; each key's update is
// all-or-nothing, so a throw leaves a consistent map (a MULTI_SET may then be half applied; one
// refused for the totals sets no key: it is checked as a whole first). Nothing
// here throws for any input bytes; bad input becomes Effects::close_reason.
#pragma once

#include "store/protocol.hpp"
#include "store/report.hpp"

#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace ddp::store {

using ClientId = uint64_t;

// What one job's store may hold in all, over all its connections. The defaults are far above
// what initialisation stores (docs/jobfile.md, "The job's store": a few keys of at most a few hundred bytes
// per rank and process group): they stop a runaway or hostile client, not a job.
struct Totals {
  std::size_t max_bytes = std::size_t{1} << 30;  // keys + values + queue items + waited/watched keys (store.max_size)
  std::size_t max_keys = std::size_t{1} << 20;   // keys in the map (store.max_keys)
  std::size_t max_queue_items = std::size_t{1} << 20;  // items in all queues
  std::size_t max_waiters = std::size_t{1} << 20;      // (client, key) registrations: WAIT, BARRIER, WATCH_KEY
  std::size_t max_connections = 65536;                 // open connections (the server's)
  // WATCH_KEY registrations of one key, over all clients. Unlike a wait, which one change
  // releases, a watch stays until its connection closes, and every change of the key pushes to
  // each one under the store's lock: without this bound one client's watches would make every
  // other client's request wait on them. PyTorch 1.13 registers one per callback (a handful).
  std::size_t max_watchers_per_key = 1024;
  // Bytes one request may push to watchers (u8 type + key + old + new, once per watch), all its
  // changes together (a MULTI_SET makes many). Each push is a copy into a connection's queue,
  // under the store's lock: 1024 watches of a key set to a 64 MiB value over another would copy
  // 128 GiB there. Watches are rare (PyTorch 1.13/2.0's callbacks; later releases send none)
  // and their values small, so 1024 of them on a key are sent messages of up to 64 KiB; a
  // MULTI_GET's reply, built under the same lock, may be 4x this.
  std::size_t max_notify_bytes_per_request = std::size_t{64} << 20;
  // Bytes in flight over all connections (the server's): requests being decoded (as their
  // lengths announce them) plus replies queued and not yet written. Separate from max_bytes
  // because what is in flight grows with clients times reply size, not with what is stored;
  // with both, a store holds at most their sum (2 GiB by default) whoever its clients are.
  std::size_t max_inflight_bytes = std::size_t{1} << 30;
};

// A message for another client (a WAIT released, a WATCH_KEY callback). One WATCH_KEY message
// goes to every watcher of the key: they share its bytes until the server queues them.
struct Push {
  ClientId to = 0;
  std::shared_ptr<const std::string> bytes;
};

// What one event made the store do. The caller reuses one Effects, clear()ing it in between.
struct Effects {
  std::string reply;          // for the client that sent the request
  std::vector<Push> pushes;   // for other clients, in this order
  std::string close_reason;   // non-empty: close the requester
  bool gave_up_wait = false;  // an implicit cancel happened (for logs)
  // Clients whose watches a change could not be pushed to within
  // Totals::max_notify_bytes_per_request: their watches are dropped, and their connections are to
  // be closed (the requester's too, if it is one). `dropped_reason` names the first such key, the
  // bytes and the limit; dropped_keys counts the keys (a MULTI_SET's).
  std::vector<ClientId> dropped_watchers;
  std::string dropped_reason;
  std::size_t dropped_keys = 0;
  std::size_t notify_bytes = 0;  // pushed to watchers by this request so far
  void clear();
};

// One waited key, with the clients still waiting for it (in the order they arrived): `total`
// of them, the first kMaxListedWaiters listed.
struct KeyWaiters {
  std::string key;
  bool barrier = false;
  bool deleted = false;
  std::size_t total = 0;
  std::vector<std::pair<ClientId, Clock::time_point>> clients;
};

// What State::waiters() gathers at most, so that a report costs the same whatever the clients
// registered: the keys waited for longest, and the first waiters of each.
constexpr std::size_t kMaxReportedKeys = 64;
constexpr std::size_t kMaxListedWaiters = 4096;

class State {
 public:
  explicit State(Limits limits = {}, Totals totals = {}) : limits_(limits), totals_(totals) {}

  // Applies one request from `from`; fields of `req` may be moved from.
  void apply(ClientId from, Request& req, Clock::time_point now, Effects& out);
  // The client's connection closed: its waits and watches are dropped.
  void disconnect(ClientId id);
  // A new attempt: no keys, queues, waiters, watchers or client records.
  void reset();

  std::size_t num_keys() const { return kv_.size(); }
  std::size_t bytes() const { return bytes_; }  // keys + values + queue items, as counted
  std::size_t queue_items() const { return queue_items_; }
  std::size_t registrations() const { return registrations_; }
  std::size_t registered_bytes() const { return registered_bytes_; }  // the waited and watched keys' bytes
  std::size_t waited_keys() const { return waiting_.size(); }         // keys somebody waits for
  const std::string* find(const std::string& key) const;
  std::size_t queue_length(const std::string& key) const;
  std::optional<uint32_t> client_pid(ClientId id) const;  // from its PING
  bool is_waiting(ClientId id) const;
  // The kMaxReportedKeys keys waited for longest, by key.
  std::vector<KeyWaiters> waiters() const;

 private:
  // A client on a key's list of waiters; `slot` is its registration's index in Wait::regs.
  struct Waiter {
    ClientId id = 0;
    std::uint32_t slot = 0;
  };
  using WaiterList = std::list<Waiter>;  // one key's waiters, in the order they arrived
  // One key a wait was registered on: where it stands in that key's list (list null once the
  // key has released it).
  struct Reg {
    const std::string* key = nullptr;  // the key in waiting_ (a node's: it stays put)
    WaiterList* list = nullptr;
    WaiterList::iterator it;
  };
  struct Wait {
    bool active = false;
    bool barrier = false;
    std::size_t remaining = 0;
    std::vector<Reg> regs;  // one per key it was registered on (a key named twice: twice)
    Clock::time_point since{};
  };
  using WatcherList = std::list<ClientId>;
  struct Client {
    std::optional<uint32_t> pid;
    Wait wait;
    // One per WATCH_KEY it sent (a key watched twice is called back twice, as in PyTorch).
    std::vector<std::pair<const std::string*, WatcherList::iterator>> watched;
  };

  bool exists(const std::string& key) const;
  // Puts `from` on `key`'s list of waiters as its registration number me.wait.regs.size().
  void register_wait(ClientId from, Client& me, std::string key);
  // Takes a registration off its key's list (the key goes once nobody waits for it).
  void unregister(Reg& r);
  void drop_wait(ClientId id, Client& c);
  // Takes every watch of the client off its keys' lists (a key goes once nobody watches it).
  void drop_watches(Client& c);
  // Wakes every waiter registered on `key`.
  void wake_all(const std::string& key, Effects& out);
  void wake_one(const std::string& key, Effects& out);
  // Pushes the change to the key's watchers within Totals::max_notify_bytes_per_request (counted
  // in out.notify_bytes); drops the clients of the watches past it (out.dropped_watchers).
  void notify_watchers(Op op, const std::string& key, uint8_t type, std::string_view old_value,
                       std::string_view new_value, Effects& out);
  // False (and out.close_reason set, nothing changed) when the totals refuse it.
  // `admitted`: the totals were checked for the whole request (MULTI_SET); only accounted here.
  bool do_set(Op op, std::string& key, std::string& value, Effects& out, bool admitted = false);
  // Whether the map may go from `old_bytes` to `new_bytes` for entry `key` (a key just inserted
  // when `inserted`); accounts it if so, else sets out.close_reason.
  // `admitted`: checked already (admit_multi_set); only accounted.
  bool admit(Op op, const std::string& key, bool inserted, std::size_t old_bytes, std::size_t new_bytes, Effects& out,
             bool admitted = false);
  // Whether a MULTI_SET fits the totals as a whole (the map as it will be once every key is
  // set); else sets out.close_reason.
  bool admit_multi_set(const Request& req, Effects& out) const;
  // Whether n more wait/watch registrations, holding at most `key_bytes` more bytes of keys,
  // fit (the caller adds them); else sets out.close_reason.
  bool room_for_registrations(Op op, std::size_t n, std::size_t key_bytes, Effects& out) const;

  Limits limits_;
  Totals totals_;
  std::size_t bytes_ = 0;
  std::size_t queue_items_ = 0;
  std::size_t registrations_ = 0;     // WAIT keys of active waits (all they were registered on) + watches
  std::size_t registered_bytes_ = 0;  // the keys of waiting_ and watchers_ (each held once)
  std::size_t deleted_bytes_ = 0;

  std::unordered_map<std::string, std::string> kv_;
  std::unordered_map<std::string, std::deque<std::string>> queues_;  // non-empty queues only
  std::unordered_map<std::string, WaiterList> waiting_;              // key -> waiters; none empty
  std::unordered_map<std::string, WatcherList> watchers_;            // key -> callback connections; none empty
  std::unordered_map<ClientId, Client> clients_;
  // Keys deleted in this attempt (bounded), so a report can tell "deleted" from "never set".
  std::unordered_set<std::string> deleted_;
};

// std::stoll's reading of a decimal value: leading whitespace, optional sign, at least one
// digit, the rest ignored; nullopt where std::stoll would throw.
std::optional<int64_t> parse_like_stoll(std::string_view s);

}  // namespace ddp::store

// The store's semantics (see state.hpp for the policy).
#include "store/state.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string_view>
#include <unordered_set>

namespace ddp::store {
namespace {

// Enough to tell "deleted" from "never set" for every key of a realistic job's waits.
constexpr std::size_t kMaxDeletedRemembered = 64 * 1024;
constexpr std::size_t kMaxDeletedBytes = 16u << 20;
// How far down a queue's waiters a QUEUE_PUSH looks for one it completes (then the first).
constexpr std::size_t kWakeOneLooks = 64;

std::string bytes_reply(std::string_view value) {
  std::string out;
  out.reserve(8 + value.size());
  put_bytes(out, value);
  return out;
}

}  // namespace

namespace {
// The one byte that releases a waiter, shared by every release.
const std::shared_ptr<const std::string>& stop_waiting_push() {
  static const auto msg = std::make_shared<const std::string>(1, static_cast<char>(kStopWaiting));
  return msg;
}
}  // namespace

void Effects::clear() {
  reply.clear();
  pushes.clear();
  close_reason.clear();
  gave_up_wait = false;
  dropped_watchers.clear();
  dropped_reason.clear();
  dropped_keys = 0;
  notify_bytes = 0;
}

std::optional<int64_t> parse_like_stoll(std::string_view s) {
  std::size_t i = 0;
  auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; };
  while (i < s.size() && is_space(s[i])) ++i;
  bool negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) {
    negative = s[i] == '-';
    ++i;
  }
  if (i == s.size() || s[i] < '0' || s[i] > '9') return std::nullopt;
  // Accumulate as a negative number so that INT64_MIN fits.
  int64_t v = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) {
    int digit = s[i] - '0';
    if (v < (INT64_MIN + digit) / 10) return std::nullopt;  // out of range: stoll throws
    v = v * 10 - digit;
  }
  if (!negative) {
    if (v == INT64_MIN) return std::nullopt;
    v = -v;
  }
  return v;
}

const std::string* State::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

std::size_t State::queue_length(const std::string& key) const {
  auto it = queues_.find(key);
  return it == queues_.end() ? 0 : it->second.size();
}

std::optional<uint32_t> State::client_pid(ClientId id) const {
  auto it = clients_.find(id);
  return it == clients_.end() ? std::nullopt : it->second.pid;
}

bool State::is_waiting(ClientId id) const {
  auto it = clients_.find(id);
  return it != clients_.end() && it->second.wait.active;
}

bool State::exists(const std::string& key) const {
  return kv_.contains(key) || queues_.contains(key);  // queues_ holds non-empty queues only
}

std::vector<KeyWaiters> State::waiters() const {
  // A key's first waiter is its oldest: the kMaxReportedKeys keys waited for longest, found
  // without looking further down any list.
  struct Oldest {
    Clock::time_point since;
    const std::string* key;
    const WaiterList* list;
  };
  std::vector<Oldest> keys;
  keys.reserve(waiting_.size());
  for (const auto& [key, list] : waiting_) {
    auto c = clients_.find(list.front().id);
    keys.push_back({c == clients_.end() ? Clock::time_point{} : c->second.wait.since, &key, &list});
  }
  const auto n = std::min(keys.size(), kMaxReportedKeys);
  std::partial_sort(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(n), keys.end(),
                    [](const Oldest& a, const Oldest& b) { return a.since < b.since; });
  std::vector<KeyWaiters> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    KeyWaiters kw;
    kw.key = *keys[i].key;
    kw.deleted = deleted_.contains(kw.key);
    kw.total = keys[i].list->size();
    for (const Waiter& w : *keys[i].list) {
      if (kw.clients.size() == kMaxListedWaiters) break;
      auto it = clients_.find(w.id);
      if (it == clients_.end() || !it->second.wait.active) continue;
      kw.barrier = kw.barrier || it->second.wait.barrier;
      kw.clients.emplace_back(w.id, it->second.wait.since);
    }
    out.push_back(std::move(kw));
  }
  std::sort(out.begin(), out.end(), [](const KeyWaiters& a, const KeyWaiters& b) { return a.key < b.key; });
  return out;
}

void State::register_wait(ClientId from, Client& me, std::string key) {
  // All or nothing if an allocation fails (the client is then closed): no empty list left in
  // waiting_, no registration counted that is not there. me.wait.regs has room (reserved).
  auto [it, created] = waiting_.try_emplace(std::move(key));
  try {
    it->second.push_back({from, static_cast<std::uint32_t>(me.wait.regs.size())});
  } catch (...) {
    if (created) waiting_.erase(it);
    throw;
  }
  if (created) registered_bytes_ += it->first.size();
  ++registrations_;
  me.wait.regs.push_back({&it->first, &it->second, std::prev(it->second.end())});
}

void State::unregister(Reg& r) {
  if (!r.list) return;
  r.list->erase(r.it);
  if (r.list->empty()) {
    const std::string key = *r.key;  // a copy: erase() must not read the key it is freeing
    registered_bytes_ -= key.size();
    waiting_.erase(key);
  }
  r.list = nullptr;
}

void State::drop_wait(ClientId, Client& c) {
  if (!c.wait.active) return;
  registrations_ -= c.wait.regs.size();
  for (auto& r : c.wait.regs) unregister(r);
  c.wait = Wait{};
}

void State::disconnect(ClientId id) {
  auto it = clients_.find(id);
  if (it == clients_.end()) return;
  drop_wait(id, it->second);
  drop_watches(it->second);
  clients_.erase(it);
}

void State::drop_watches(Client& c) {
  registrations_ -= c.watched.size();
  for (auto& [key, pos] : c.watched) {
    auto w = watchers_.find(*key);
    if (w == watchers_.end()) continue;
    w->second.erase(pos);
    if (w->second.empty()) {
      registered_bytes_ -= w->first.size();
      watchers_.erase(w);
    }
  }
  c.watched.clear();
}

void State::reset() {
  kv_.clear();
  queues_.clear();
  waiting_.clear();
  watchers_.clear();
  clients_.clear();
  deleted_.clear();
  bytes_ = 0;
  queue_items_ = 0;
  registrations_ = 0;
  registered_bytes_ = 0;
  deleted_bytes_ = 0;
}

bool State::admit(Op op, const std::string& key, bool inserted, std::size_t old_bytes, std::size_t new_bytes,
                  Effects& out, bool admitted) {
  if (admitted) {
    bytes_ = bytes_ - old_bytes + new_bytes;
    return true;
  }
  if (inserted && kv_.size() > totals_.max_keys) {
    out.close_reason = fmt::format(
        "store full: {} of the new key `{}` would make {} keys, over this job's limit of {} (store.max_keys in "
        "the job file)",
        to_string(op), printable_key(key), kv_.size(), totals_.max_keys);
    return false;
  }
  const std::size_t after = bytes_ - old_bytes + new_bytes;
  if (new_bytes > old_bytes && after + registered_bytes_ > totals_.max_bytes) {
    out.close_reason = fmt::format(
        "store full: {} of key `{}` would make the store hold {} bytes of keys, values, queue items and "
        "waited-for keys, over this job's limit of {} (store.max_size in the job file)",
        to_string(op), printable_key(key), after + registered_bytes_, totals_.max_bytes);
    return false;
  }
  bytes_ = after;
  return true;
}

bool State::admit_multi_set(const Request& req, Effects& out) const {
  // Each key's value once the request is applied: the last one given for it.
  std::unordered_map<std::string_view, std::size_t> last;  // key -> index into req.values
  last.reserve(req.keys.size());
  for (std::size_t i = 0; i < req.keys.size(); ++i) last.insert_or_assign(req.keys[i], i);
  std::size_t new_keys = 0, grow = 0, shrink = 0;
  for (const auto& [key, i] : last) {
    const std::size_t after = key.size() + req.values[i].size();
    const auto it = kv_.find(req.keys[i]);  // the key itself, no copy
    const std::size_t before = it == kv_.end() ? 0 : it->first.size() + it->second.size();
    if (it == kv_.end()) ++new_keys;
    (after > before ? grow : shrink) += after > before ? after - before : before - after;
  }
  if (new_keys > 0 && kv_.size() + new_keys > totals_.max_keys) {
    out.close_reason = fmt::format(
        "store full: MULTI_SET of {} new keys would make {} keys, over this job's limit of {} (store.max_keys in the "
        "job file); no key of it was set",
        new_keys, kv_.size() + new_keys, totals_.max_keys);
    return false;
  }
  if (grow > shrink && bytes_ + (grow - shrink) + registered_bytes_ > totals_.max_bytes) {
    out.close_reason = fmt::format(
        "store full: MULTI_SET of {} keys would make the store hold {} bytes of keys, values, queue items and "
        "waited-for keys, over this job's limit of {} (store.max_size in the job file); no key of it was set",
        req.keys.size(), bytes_ + (grow - shrink) + registered_bytes_, totals_.max_bytes);
    return false;
  }
  return true;
}

bool State::room_for_registrations(Op op, std::size_t n, std::size_t key_bytes, Effects& out) const {
  if (registrations_ + n > totals_.max_waiters) {
    out.close_reason = fmt::format(
        "store full: {} would make {} waiting or watching registrations (one per client and key), over this "
        "job's limit of {}",
        to_string(op), registrations_ + n, totals_.max_waiters);
    return false;
  }
  if (bytes_ + registered_bytes_ + key_bytes > totals_.max_bytes) {
    out.close_reason = fmt::format(
        "store full: {} would make the store hold {} bytes of keys, values, queue items and waited-for keys, "
        "over this job's limit of {} (store.max_size in the job file)",
        to_string(op), bytes_ + registered_bytes_ + key_bytes, totals_.max_bytes);
    return false;
  }
  return true;
}

void State::wake_all(const std::string& key, Effects& out) {
  auto it = waiting_.find(key);
  if (it == waiting_.end()) return;
  WaiterList list = std::move(it->second);
  registered_bytes_ -= it->first.size();
  waiting_.erase(it);
  for (const Waiter& w : list) {
    auto c = clients_.find(w.id);
    if (c == clients_.end() || !c->second.wait.active) continue;
    auto& wait = c->second.wait;
    wait.regs[w.slot].list = nullptr;  // this key no longer holds it
    if (wait.remaining > 0) --wait.remaining;
    if (wait.remaining == 0) {
      drop_wait(w.id, c->second);
      out.pushes.push_back({w.id, stop_waiting_push()});
    }
  }
}

void State::wake_one(const std::string& key, Effects& out) {
  auto it = waiting_.find(key);
  if (it == waiting_.end()) return;
  auto& list = it->second;
  // Prefer a waiter that this push completes, among the first few; else the first in line.
  auto chosen = list.begin();
  std::size_t looked = 0;
  for (auto i = list.begin(); i != list.end() && looked < kWakeOneLooks; ++i, ++looked) {
    auto c = clients_.find(i->id);
    if (c != clients_.end() && c->second.wait.remaining == 1) {
      chosen = i;
      break;
    }
  }
  const Waiter w = *chosen;
  auto c = clients_.find(w.id);
  if (c != clients_.end()) c->second.wait.regs[w.slot].list = nullptr;
  list.erase(chosen);
  if (list.empty()) {
    registered_bytes_ -= it->first.size();
    waiting_.erase(it);
  }
  if (c == clients_.end() || !c->second.wait.active) return;
  auto& wait = c->second.wait;
  if (wait.remaining > 0) --wait.remaining;
  if (wait.remaining == 0) {
    drop_wait(w.id, c->second);
    out.pushes.push_back({w.id, stop_waiting_push()});
  }
}

void State::notify_watchers(Op op, const std::string& key, uint8_t type, std::string_view old_value,
                            std::string_view new_value, Effects& out) {
  auto it = watchers_.find(key);
  if (it == watchers_.end()) return;
  auto msg = std::make_shared<std::string>();
  put_u8(*msg, type);
  put_bytes(*msg, key);
  put_bytes(*msg, old_value);
  put_bytes(*msg, new_value);
  std::shared_ptr<const std::string> shared = std::move(msg);
  const std::size_t size = shared->size(), budget = totals_.max_notify_bytes_per_request;
  const std::size_t first_push = out.pushes.size(), watches = it->second.size();
  // In the order the watches were registered, while the request's pushes fit (the first always).
  std::vector<ClientId> dropped;
  for (ClientId id : it->second) {
    if (out.notify_bytes == 0 || (out.notify_bytes <= budget && size <= budget - out.notify_bytes)) {
      out.pushes.push_back({id, shared});
      out.notify_bytes += size;
    } else {
      dropped.push_back(id);
    }
  }
  if (dropped.empty()) return;
  // A client is dropped as a whole: none of its watches (a key watched twice) is sent this one.
  std::sort(dropped.begin(), dropped.end());
  dropped.erase(std::unique(dropped.begin(), dropped.end()), dropped.end());
  auto is_dropped = [&](const Push& p) { return std::binary_search(dropped.begin(), dropped.end(), p.to); };
  out.pushes.erase(
      std::remove_if(out.pushes.begin() + static_cast<std::ptrdiff_t>(first_push), out.pushes.end(), is_dropped),
      out.pushes.end());
  if (out.dropped_keys++ == 0) {
    out.dropped_reason = fmt::format(
        "{} of `{}` would push its {} watches {} bytes each ({} in all), over the store's limit of {} bytes of "
        "WATCH_KEY callbacks per request; {} watching client{} past it dropped",
        to_string(op), printable_key(key), watches, size, size * watches, budget, dropped.size(),
        dropped.size() == 1 ? "" : "s");
  }
  out.dropped_watchers.reserve(out.dropped_watchers.size() + dropped.size());  // no throw once a watch is gone
  for (ClientId id : dropped) {
    if (auto c = clients_.find(id); c != clients_.end()) drop_watches(c->second);
    out.dropped_watchers.push_back(id);
  }
}

bool State::do_set(Op op, std::string& key, std::string& value, Effects& out, bool admitted) {
  auto [it, inserted] = kv_.try_emplace(std::move(key));
  const std::size_t old_bytes = inserted ? 0 : it->first.size() + it->second.size();
  if (!admit(op, it->first, inserted, old_bytes, it->first.size() + value.size(), out, admitted)) {
    if (inserted) kv_.erase(it);
    return false;
  }
  if (watchers_.empty()) {
    it->second = std::move(value);
    if (inserted) wake_all(it->first, out);
    return true;
  }
  std::string old = std::exchange(it->second, std::move(value));
  notify_watchers(op, it->first, inserted ? kWatchKeyCreated : kWatchKeyUpdated, old, it->second, out);
  if (inserted) wake_all(it->first, out);
  return true;
}

void State::apply(ClientId from, Request& req, Clock::time_point now, Effects& out) {
  Client& me = clients_[from];
  if (me.wait.active && req.op != Op::cancel_wait) {
    drop_wait(from, me);
    out.gave_up_wait = true;
  }

  switch (req.op) {
    case Op::validate:
      if (req.word != kValidateMagic) out.close_reason = "bad VALIDATE magic (not a PyTorch 2.x client?)";
      return;

    case Op::ping:
      me.pid = req.word;
      put_u32(out.reply, req.word);
      return;

    case Op::set:
      do_set(Op::set, req.key, req.value, out);
      return;

    case Op::multi_set:
      // All or nothing: the totals are checked for the whole request first (a key named twice
      // ends with its last value), so that a refused MULTI_SET sets no key and wakes nobody.
      // Admitted as a whole, each key is set without a check of its own: a key named twice may
      // pass a total on the way to a last value that does not.
      if (!admit_multi_set(req, out)) return;
      for (std::size_t i = 0; i < req.keys.size(); ++i) do_set(Op::multi_set, req.keys[i], req.values[i], out, true);
      return;

    case Op::append: {
      auto [it, inserted] = kv_.try_emplace(std::move(req.key));
      if (it->second.size() + req.value.size() > limits_.max_value_bytes) {
        out.close_reason =
            fmt::format("APPEND to key `{}` would make its value {} bytes, over the limit of {} per value",
                        printable_key(it->first), it->second.size() + req.value.size(), limits_.max_value_bytes);
        if (inserted) kv_.erase(it);
        return;
      }
      const std::size_t old_bytes = inserted ? 0 : it->first.size() + it->second.size();
      if (!admit(Op::append, it->first, inserted, old_bytes,
                 (inserted ? it->first.size() : old_bytes) + req.value.size(), out)) {
        if (inserted) kv_.erase(it);
        return;
      }
      std::string old = watchers_.contains(it->first) ? it->second : std::string();  // for its watchers only
      it->second.append(req.value);
      notify_watchers(Op::append, it->first, inserted ? kWatchKeyCreated : kWatchKeyUpdated, old, it->second, out);
      if (inserted) wake_all(it->first, out);
      return;
    }

    case Op::compare_set: {
      auto it = kv_.find(req.key);
      if (it == kv_.end()) {
        if (req.value.empty()) {
          auto [ins, _] = kv_.emplace(std::move(req.key), req.value2);
          if (!admit(Op::compare_set, ins->first, true, 0, ins->first.size() + ins->second.size(), out)) {
            kv_.erase(ins);
            return;
          }
          notify_watchers(Op::compare_set, ins->first, kWatchKeyCreated, req.value, ins->second, out);
          out.reply = bytes_reply(ins->second);
          wake_all(ins->first, out);
        } else {
          out.reply = bytes_reply(req.value);  // PyTorch's documented "lie"
        }
        return;
      }
      if (it->second == req.value) {
        if (!admit(Op::compare_set, it->first, false, it->first.size() + it->second.size(),
                   it->first.size() + req.value2.size(), out)) {
          return;
        }
        it->second = std::move(req.value2);
        notify_watchers(Op::compare_set, it->first, kWatchKeyUpdated, req.value, it->second, out);
      }
      out.reply = bytes_reply(it->second);
      return;
    }

    case Op::get: {
      auto it = kv_.find(req.key);
      out.reply = bytes_reply(it == kv_.end() ? std::string_view() : std::string_view(it->second));
      return;
    }

    case Op::multi_get: {
      // The reply is bounded like a request: naming one large key many times must not make
      // the store build a reply of many gigabytes.
      std::size_t total = 0;
      for (const auto& k : req.keys) {
        auto it = kv_.find(k);
        total += 8 + (it == kv_.end() ? 0 : it->second.size());
      }
      if (total > limits_.max_connection_bytes) {
        out.close_reason =
            fmt::format("MULTI_GET of {} keys would reply {} bytes, more than the connection's memory cap of {}",
                        req.keys.size(), total, limits_.max_connection_bytes);
        return;
      }
      out.reply.reserve(total);
      for (const auto& k : req.keys) {
        auto it = kv_.find(k);
        put_bytes(out.reply, it == kv_.end() ? std::string_view() : std::string_view(it->second));
      }
      return;
    }

    case Op::add: {
      auto [it, inserted] = kv_.try_emplace(std::move(req.key));
      int64_t sum = req.number;
      if (!inserted) {
        auto current = parse_like_stoll(it->second);
        if (!current) {
          out.close_reason =
              fmt::format("ADD on key `{}` whose value is not a decimal number", printable_key(it->first));
          return;
        }
        sum = static_cast<int64_t>(static_cast<uint64_t>(*current) + static_cast<uint64_t>(req.number));
      }
      std::string text = std::to_string(sum);
      if (!admit(Op::add, it->first, inserted, inserted ? 0 : it->first.size() + it->second.size(),
                 it->first.size() + text.size(), out)) {
        if (inserted) kv_.erase(it);
        return;
      }
      std::string old = watchers_.empty() ? std::string() : std::move(it->second);
      it->second = std::move(text);
      put_i64(out.reply, sum);
      notify_watchers(Op::add, it->first, inserted ? kWatchKeyCreated : kWatchKeyUpdated, old, it->second, out);
      if (inserted) wake_all(it->first, out);
      return;
    }

    case Op::check: {
      bool all = std::all_of(req.keys.begin(), req.keys.end(), [this](const std::string& k) { return exists(k); });
      put_u8(out.reply, all ? kCheckReady : kCheckNotReady);
      return;
    }

    case Op::wait: {
      std::size_t missing = 0;
      for (const auto& k : req.keys) missing += exists(k) ? 0 : 1;
      if (missing == 0) {
        put_u8(out.reply, kStopWaiting);
        return;
      }
      std::size_t key_bytes = 0;  // held anew: keys nobody waits for yet, each once
      {
        std::unordered_set<std::string_view> fresh;
        for (const auto& k : req.keys)
          if (!exists(k) && !waiting_.contains(k) && fresh.insert(k).second) key_bytes += k.size();
      }
      if (!room_for_registrations(Op::wait, missing, key_bytes, out)) return;
      me.wait.active = true;
      me.wait.barrier = false;
      me.wait.since = now;
      me.wait.remaining = missing;
      me.wait.regs.clear();
      me.wait.regs.reserve(missing);
      for (auto& k : req.keys) {
        if (exists(k)) continue;
        register_wait(from, me, std::move(k));
      }
      return;
    }

    case Op::cancel_wait:
      drop_wait(from, me);
      put_u8(out.reply, kWaitCanceled);
      return;

    case Op::get_num_keys:
      put_i64(out.reply, static_cast<int64_t>(kv_.size()));
      return;

    case Op::delete_key: {
      auto it = kv_.find(req.key);
      if (it == kv_.end()) {
        put_i64(out.reply, 0);
        return;
      }
      notify_watchers(Op::delete_key, it->first, kWatchKeyDeleted, it->second, std::string_view(), out);
      bytes_ -= it->first.size() + it->second.size();
      kv_.erase(it);
      if (deleted_.size() < kMaxDeletedRemembered && deleted_bytes_ + req.key.size() <= kMaxDeletedBytes &&
          deleted_.insert(req.key).second) {
        deleted_bytes_ += req.key.size();
      }
      put_i64(out.reply, 1);
      return;
    }

    case Op::watch_key: {
      // Every change of the key pushes to each of its watchers under the server's lock: bounded
      // per key, so no client's watches make a SET (anyone's) cost more than that.
      if (auto w = watchers_.find(req.key); w != watchers_.end() && w->second.size() >= totals_.max_watchers_per_key) {
        out.close_reason =
            fmt::format("store full: WATCH_KEY of `{}` would make {} watches of that key, over the limit of {} per key",
                        printable_key(req.key), w->second.size() + 1, totals_.max_watchers_per_key);
        return;
      }
      if (!room_for_registrations(Op::watch_key, 1, req.key.size(), out)) return;
      // Room for the record below made first (it may not throw once registered), growing by half
      // or more: to the exact size, each WATCH_KEY of a client copied all its earlier ones.
      if (me.watched.size() == me.watched.capacity()) me.watched.reserve(me.watched.size() * 3 / 2 + 8);
      auto [w, created] = watchers_.try_emplace(std::move(req.key));
      try {  // all or nothing, as register_wait
        w->second.push_back(from);
      } catch (...) {
        if (created) watchers_.erase(w);
        throw;
      }
      if (created) registered_bytes_ += w->first.size();
      ++registrations_;
      me.watched.emplace_back(&w->first, std::prev(w->second.end()));
      put_u8(out.reply, kWatchCallbackRegistered);
      return;
    }

    case Op::queue_push: {
      if (queue_items_ >= totals_.max_queue_items) {
        out.close_reason =
            fmt::format("store full: QUEUE_PUSH to `{}` would make {} queue items, over this job's limit of {}",
                        printable_key(req.key), queue_items_ + 1, totals_.max_queue_items);
        return;
      }
      auto [q, created] = queues_.try_emplace(req.key);
      const std::size_t add = req.value.size() + (created ? q->first.size() : 0);
      if (bytes_ + registered_bytes_ + add > totals_.max_bytes) {
        out.close_reason = fmt::format(
            "store full: QUEUE_PUSH to `{}` would make the store hold {} bytes of keys, values, queue items and "
            "waited-for keys, over this job's limit of {} (store.max_size in the job file)",
            printable_key(req.key), bytes_ + registered_bytes_ + add, totals_.max_bytes);
        if (created) queues_.erase(q);
        return;
      }
      bytes_ += add;
      ++queue_items_;
      q->second.push_back(std::move(req.value));
      wake_one(req.key, out);
      return;
    }

    case Op::queue_pop: {
      auto it = queues_.find(req.key);
      if (it == queues_.end()) {
        put_i64(out.reply, 0);
        return;
      }
      put_i64(out.reply, static_cast<int64_t>(it->second.size()));
      put_bytes(out.reply, it->second.front());
      bytes_ -= it->second.front().size();
      --queue_items_;
      it->second.pop_front();
      if (it->second.empty()) {
        bytes_ -= it->first.size();
        queues_.erase(it);
      }
      return;
    }

    case Op::queue_len:
      put_i64(out.reply, static_cast<int64_t>(queue_length(req.key)));
      return;

    case Op::list_keys: {
      std::size_t total = 8;
      for (const auto& [k, _] : kv_) total += 8 + k.size();
      if (total > limits_.max_connection_bytes) {
        out.close_reason =
            fmt::format("LIST_KEYS of {} keys would reply {} bytes, more than the connection's memory cap of {}",
                        kv_.size(), total, limits_.max_connection_bytes);
        return;
      }
      out.reply.reserve(total);
      put_i64(out.reply, static_cast<int64_t>(kv_.size()));
      for (const auto& [k, _] : kv_) put_bytes(out.reply, k);
      return;
    }

    case Op::barrier: {
      auto [it, inserted] = kv_.try_emplace(req.key);
      int64_t count = 1;
      if (!inserted) {
        auto current = parse_like_stoll(it->second);
        if (!current) {
          out.close_reason =
              fmt::format("BARRIER on key `{}` whose value is not a decimal number", printable_key(it->first));
          return;
        }
        count = static_cast<int64_t>(static_cast<uint64_t>(*current) + 1);
      }
      std::string text = std::to_string(count);
      const bool parks = count < req.number;
      if ((parks && !room_for_registrations(Op::barrier, 1, req.key.size(), out)) ||
          !admit(Op::barrier, it->first, inserted, inserted ? 0 : it->first.size() + it->second.size(),
                 it->first.size() + text.size(), out)) {
        if (inserted) kv_.erase(it);
        return;
      }
      it->second = std::move(text);
      if (!parks) {
        wake_all(it->first, out);
        put_u8(out.reply, kStopWaiting);
        return;
      }
      me.wait.active = true;
      me.wait.barrier = true;
      me.wait.since = now;
      me.wait.remaining = 1;
      me.wait.regs.clear();
      me.wait.regs.reserve(1);
      register_wait(from, me, req.key);
      return;
    }
  }
}

}  // namespace ddp::store

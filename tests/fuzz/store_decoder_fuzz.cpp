// libFuzzer target for the store's wire decoder and, behind it, the store semantics.
//
// Input: byte 0 picks how the rest is cut into reads (1..16 bytes, or whole when 0), how
// requests are spread over three clients, and the release the decoder is told (bits 6-7); the rest is what a connection
// sends. Properties: nothing crashes or leaks (sanitizers), no limit is exceeded, and every decoded request re-encodes
// to bytes that decode to the same request.
#include "store/protocol.hpp"
#include "store/state.hpp"

#include <cstdint>
#include <cstdlib>
#include <span>

using namespace ddp::store;

namespace {

void check_round_trip(Protocol p, const Request& r) {
  if (r.op == Op::validate || p == Protocol::unknown) return;
  std::string wire;
  if (p == Protocol::v2) wire = std::string("\x00\xCE\xF7\x85\x3C", 5);
  wire += encode_request(p, r);
  // A fresh connection of the same release: 1.13/2.0 and 2.1 say it through the hint.
  Decoder again({}, {p == Protocol::v1 || p == Protocol::v21 ? p : Protocol::unknown, "the fuzz target"});
  std::span<const uint8_t> in(reinterpret_cast<const uint8_t*>(wire.data()), wire.size());
  Request got;
  if (p == Protocol::v2 && again.next(in, got) != Decoder::Status::request) std::abort();
  if (again.next(in, got) != Decoder::Status::request || !(got == r) || !in.empty()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const uint8_t seed = data[0];
  std::span<const uint8_t> rest(data + 1, size - 1);

  Limits lim;
  lim.max_key_bytes = 4096;
  lim.max_value_bytes = 1 << 16;
  lim.max_batch_keys = 1024;
  lim.max_connection_bytes = 1 << 20;
  // Bits 6-7 of the seed: the job's release as the store would know it (none, 1.13, 2.1, 2.2+).
  constexpr Protocol kHints[] = {Protocol::unknown, Protocol::v1, Protocol::v21, Protocol::v2};
  Decoder dec(lim, {kHints[seed >> 6], "the fuzz target"});
  // Small totals, so that the limits' paths are taken and their bounds checked.
  const Totals totals{.max_bytes = 1 << 17, .max_keys = 64, .max_queue_items = 64, .max_waiters = 64};
  State state(lim, totals);
  Effects fx;
  Request req;
  const auto now = Clock::time_point(std::chrono::seconds(1));
  ClientId base = 1;  // the three current clients are base, base+1, base+2
  unsigned turn = 0;

  const std::size_t chunk = (seed & 0x0F) == 0 ? rest.size() : (seed & 0x0F);
  while (!rest.empty()) {
    std::size_t n = std::min(chunk, rest.size());
    std::span<const uint8_t> piece = rest.first(n);
    rest = rest.subspan(n);
    for (;;) {
      auto st = dec.next(piece, req);
      if (st == Decoder::Status::need_more) break;
      if (st == Decoder::Status::error) {
        if (dec.error().empty()) std::abort();
        return 0;
      }
      if (req.key.size() > lim.max_key_bytes || req.value.size() > lim.max_value_bytes ||
          req.value2.size() > lim.max_value_bytes || req.keys.size() > lim.max_batch_keys) {
        std::abort();
      }
      check_round_trip(dec.protocol(), req);
      // Spread requests over a few clients so that waits, wakes and watches interact.
      const ClientId client = base + (turn++ * (1u + (seed >> 4))) % 3;
      fx.clear();
      state.apply(client, req, now, fx);
      if (state.bytes() > totals.max_bytes || state.num_keys() > totals.max_keys ||
          state.queue_items() > totals.max_queue_items || state.registrations() > totals.max_waiters) {
        std::abort();
      }
      if (!fx.close_reason.empty()) {
        state.disconnect(client);
        base += 3;
      }
    }
  }
  return 0;
}

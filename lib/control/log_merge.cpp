#include "control/log_merge.hpp"

#include "control/protocol.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>

namespace ddp::control {

struct LogMerge::Reader {
  int rank = -1;
  std::size_t order = 0;  // the source's place: equal times go in this order
  std::vector<File> files;
  std::size_t next_file = 0;
  std::ifstream in;
  std::uint64_t left = 0;
  MergedLine pending;
};

namespace {

// One line (without '\n') of at most `cap` bytes kept, the rest of a longer one skipped; false
// at the end of the file or of `left`.
bool read_line(std::ifstream& in, std::uint64_t& left, std::string& out, std::size_t cap) {
  out.clear();
  auto* sb = in.rdbuf();
  bool any = false;
  while (left > 0) {
    const int c = sb->sbumpc();
    if (c == std::char_traits<char>::eof()) break;
    --left;
    any = true;
    if (c == '\n') return true;
    if (out.size() < cap) out.push_back(static_cast<char>(c));
  }
  return any;
}

}  // namespace

LogMerge::LogMerge(std::vector<Source> sources) {
  for (std::size_t i = 0; i < sources.size(); ++i) {
    auto r = std::make_unique<Reader>();
    r->rank = sources[i].rank;
    r->order = i;
    r->files = std::move(sources[i].files);
    readers_.push_back(std::move(r));
  }
  for (std::size_t i = 0; i < readers_.size(); ++i) {
    if (advance(*readers_[i])) heap_.push_back(i);
  }
  std::make_heap(heap_.begin(), heap_.end(), [this](std::size_t a, std::size_t b) {
    const auto& x = *readers_[a];
    const auto& y = *readers_[b];
    return std::tie(x.pending.time, x.order) > std::tie(y.pending.time, y.order);
  });
}

LogMerge::~LogMerge() = default;

bool LogMerge::advance(Reader& r) {
  std::string line;
  while (true) {
    if (!r.in.is_open()) {
      if (r.next_file >= r.files.size()) return false;
      const auto& f = r.files[r.next_file++];
      r.in.open(f.path, std::ios::binary);
      if (!r.in) {
        unreadable_.push_back(fmt::format("rank {}: cannot read {}", r.rank, f.path));
        r.in = std::ifstream();
        continue;
      }
      r.left = f.limit;
    }
    if (!read_line(r.in, r.left, line, kMaxLine)) {
      r.in.close();
      r.in = std::ifstream();
      continue;
    }
    auto parsed = parse_log_line(line);
    if (!parsed) continue;
    r.pending.rank = r.rank;
    r.pending.time = line.substr(0, line.find(' '));
    r.pending.stream = std::move(parsed->stream);
    r.pending.text = std::move(parsed->text);
    return true;
  }
}

std::optional<MergedLine> LogMerge::next() {
  if (heap_.empty()) return std::nullopt;
  auto later = [this](std::size_t a, std::size_t b) {
    const auto& x = *readers_[a];
    const auto& y = *readers_[b];
    return std::tie(x.pending.time, x.order) > std::tie(y.pending.time, y.order);
  };
  std::pop_heap(heap_.begin(), heap_.end(), later);
  const auto i = heap_.back();
  MergedLine out = std::move(readers_[i]->pending);
  if (advance(*readers_[i])) {
    std::push_heap(heap_.begin(), heap_.end(), later);
  } else {
    heap_.pop_back();
  }
  return out;
}

}  // namespace ddp::control

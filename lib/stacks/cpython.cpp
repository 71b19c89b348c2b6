// See cpython.hpp.
#include "stacks/cpython.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <unordered_map>

namespace ddp::stacks {

namespace {

// The table. Each number is offsetof()/sizeof() in a 64-bit build over the headers of the tag
// named; tests/unit/stacks/offsets_probe.c prints the same list from installed headers.
//
// field                         3.11 (v3.11.2)  3.12 (v3.12.1)  header (Include/...)
// _PyRuntimeState.interpreters.head   40        40    internal/pycore_runtime.h
// PyInterpreterState.next              0         0    internal/pycore_interp.h
// PyInterpreterState.threads.head     16        72    internal/pycore_interp.h (3.12: id, id_refcount,
//                                                     requires_idref, id_mutex, _initialized,
//                                                     finalizing, monitoring_version, last_restart_version
//                                                     come first)
// PyThreadState.next                   8         8    cpython/pystate.h
// PyThreadState.cframe                56        56    cpython/pystate.h
// PyThreadState.thread_id            152       136    cpython/pystate.h
// PyThreadState.native_thread_id     160       144    cpython/pystate.h
// _PyCFrame.current_frame              8         0    cpython/pystate.h (3.11: use_tracing first)
// _PyInterpreterFrame.f_code          32         0    internal/pycore_frame.h (3.12 moved f_code first)
// _PyInterpreterFrame.previous        48         8    internal/pycore_frame.h
// _PyInterpreterFrame.prev_instr      56        56    internal/pycore_frame.h
// _PyInterpreterFrame.owner           69        70    internal/pycore_frame.h (char; enum _frameowner)
// FRAME_OWNED_BY_GENERATOR             1         1    internal/pycore_frame.h
// FRAME_OWNED_BY_CSTACK                -         3    internal/pycore_frame.h (3.12: C-stack shim frames)
// PyCodeObject.co_firstlineno         72        68    cpython/code.h
// PyCodeObject.co_filename           112       112    cpython/code.h
// PyCodeObject.co_name               120       120    cpython/code.h
// PyCodeObject.co_qualname           128       128    cpython/code.h
// PyCodeObject.co_linetable          136       136    cpython/code.h
// PyCodeObject._co_firsttraceable    168       176    cpython/code.h
// PyCodeObject.co_code_adaptive      184       192    cpython/code.h (_PyCode_CODE(co))
// PyBytesObject.ob_size / ob_sval  16/32     16/32    cpython/bytesobject.h
// PyASCIIObject.length / state     16/32     16/32    cpython/unicodeobject.h
// sizeof(PyASCIIObject)               48        40    cpython/unicodeobject.h (3.12 dropped wstr)
// sizeof(PyCompactUnicodeObject)      72        56    cpython/unicodeobject.h (3.12 dropped wstr_length)
//
// Cross-checked against the layouts py-spy and austin carry for the same versions; CPython keeps
// these internal layouts fixed within a minor release (debuggers depend on it).
PyLayout layout_311() {
  PyLayout l;
  l.major = 3, l.minor = 11;
  l.runtime_interpreters_head = 40;
  l.interp_next = 0, l.interp_threads_head = 16;
  l.tstate_next = 8, l.tstate_thread_id = 152, l.tstate_native_thread_id = 160, l.tstate_cframe = 56;
  l.cframe_current_frame = 8;
  l.frame_code = 32, l.frame_previous = 48, l.frame_prev_instr = 56, l.frame_owner = 69;
  l.owner_generator = 1, l.owner_cstack = -1;
  l.code_firstlineno = 72, l.code_filename = 112, l.code_name = 120, l.code_qualname = 128, l.code_linetable = 136;
  l.code_firsttraceable = 168, l.code_adaptive = 184;
  l.unicode_ascii_size = 48, l.unicode_compact_size = 72;
  return l;
}

PyLayout layout_312() {
  PyLayout l;
  l.major = 3, l.minor = 12;
  l.runtime_interpreters_head = 40;
  l.interp_next = 0, l.interp_threads_head = 72;
  l.tstate_next = 8, l.tstate_thread_id = 136, l.tstate_native_thread_id = 144, l.tstate_cframe = 56;
  l.cframe_current_frame = 0;
  l.frame_code = 0, l.frame_previous = 8, l.frame_prev_instr = 56, l.frame_owner = 70;
  l.owner_generator = 1, l.owner_cstack = 3;
  l.code_firstlineno = 68, l.code_filename = 112, l.code_name = 120, l.code_qualname = 128, l.code_linetable = 136;
  l.code_firsttraceable = 176, l.code_adaptive = 192;
  l.unicode_ascii_size = 40, l.unicode_compact_size = 56;
  return l;
}

// Location table entries (Objects/locations.md): a first byte 1ccccLLL (code, length-1 in code
// units), then varints of 6 bits with 0x40 as "more".
unsigned scan_varint(std::span<const std::uint8_t> t, std::size_t i) {
  unsigned val = 0, shift = 0;
  for (; i < t.size() && shift < 32; ++i, shift += 6) {
    val |= unsigned(t[i] & 63) << shift;
    if (!(t[i] & 64)) break;
  }
  return val;
}

int scan_signed_varint(std::span<const std::uint8_t> t, std::size_t i) {
  unsigned u = scan_varint(t, i);
  return (u & 1) ? -int(u >> 1) : int(u >> 1);
}

int line_delta(std::span<const std::uint8_t> t, std::size_t i) {
  switch ((t[i] >> 3) & 15) {
    case 15:
      return 0;  // no location
    case 14:     // long form
    case 13:
      return scan_signed_varint(t, i + 1);  // no columns
    case 12:
      return 2;  // one-line forms: line delta is code - 10
    case 11:
      return 1;
    default:
      return 0;  // 10 and the short forms: same line
  }
}

}  // namespace

std::optional<PyLayout> layout_for(std::uint32_t v) {
  const int major = (v >> 24) & 0xff, minor = (v >> 16) & 0xff;
  if (major == 3 && minor == 11) return layout_311();
  if (major == 3 && minor == 12) return layout_312();
  return std::nullopt;
}

std::string format_version(std::uint32_t v) {
  return std::to_string((v >> 24) & 0xff) + "." + std::to_string((v >> 16) & 0xff) + "." +
         std::to_string((v >> 8) & 0xff);
}

int addr_to_line(std::span<const std::uint8_t> t, int first_line, int addr) {
  if (addr < 0) return first_line;
  int computed = first_line;
  long start = 0;
  std::size_t i = 0;
  while (i < t.size()) {
    const std::uint8_t first = t[i];
    const long end = start + long((first & 7) + 1) * 2;  // sizeof(_Py_CODEUNIT)
    computed += line_delta(t, i);
    const int line = ((first >> 3) & 15) == 15 ? -1 : computed;
    if (addr < end) return line;
    start = end;
    do ++i;
    while (i < t.size() && !(t[i] & 128));
  }
  return -1;
}

namespace {

// A code object's names and line table, read once however many frames run it: frames copy the
// names (the model's Frame owns its strings), and every copy counts against the walk's total.
struct CodeInfo {
  std::string file, function;
  int first_line = 0, first_traceable = 0;
  std::vector<std::uint8_t> linetable;
  bool ok = false;
};

std::string size_text(std::size_t bytes) {
  return bytes % (1u << 20) == 0 ? std::to_string(bytes >> 20) + " MiB" : std::to_string(bytes) + " bytes";
}

class Walker {
 public:
  Walker(Memory& mem, const PyLayout& l, const WalkLimits& lim) : mem_(mem), l_(l), lim_(lim) {}

  std::optional<std::uint64_t> ptr(std::uint64_t addr) { return mem_.get<std::uint64_t>(addr); }

  // Why the walk was cut ("truncated: ..."), or "" while it may go on. Checked before every
  // frame: a frame read costs at most one code object (names of max_string characters, one line
  // table), so no total is passed by more than one step's worth.
  const std::string& cut() const { return cut_; }
  bool go_on() {
    if (!cut_.empty()) return false;
    if (visited_ >= std::size_t(std::max(lim_.max_frames, 0)))
      cut_ = "truncated: more than " + std::to_string(lim_.max_frames) + " frames in all (a loop?)";
    else if (names_ >= lim_.max_string_bytes)
      cut_ = "truncated: the frames' names passed " + size_text(lim_.max_string_bytes);
    else if (scanned_ >= lim_.max_linetable_scan)
      cut_ = "truncated: the line lookups passed " + size_text(lim_.max_linetable_scan) + " of line tables";
    else if (lim_.out_of_time && lim_.out_of_time())
      cut_ = "truncated: out of time";
    return cut_.empty();
  }
  void out_of_time() {
    if (cut_.empty()) cut_ = "truncated: out of time";
  }

  std::string read_str(std::uint64_t obj) {
    if (!obj) return "?";
    auto length = mem_.get<std::int64_t>(obj + l_.unicode_length);
    auto state = mem_.get<std::uint32_t>(obj + l_.unicode_state);
    if (!length || !state || *length < 0) return "?";
    const unsigned kind = (*state >> 2) & 7, compact = (*state >> 5) & 1, ascii = (*state >> 6) & 1;
    if (!compact || (kind != 1 && kind != 2 && kind != 4)) return "?";
    const std::size_t n = std::min<std::size_t>(std::size_t(*length), lim_.max_string);
    std::vector<std::uint8_t> raw(n * kind);
    if (!raw.empty() &&
        !mem_.read(obj + (ascii ? l_.unicode_ascii_size : l_.unicode_compact_size), raw.data(), raw.size()))
      return "?";
    std::string out;
    for (std::size_t k = 0; k < n; ++k) {
      std::uint32_t c = 0;
      std::memcpy(&c, raw.data() + k * kind, kind);  // little-endian hosts only (x86-64, aarch64)
      if (c < 0x80) {
        out += char(c);
      } else if (c < 0x800) {
        out += char(0xc0 | (c >> 6)), out += char(0x80 | (c & 63));
      } else if (c < 0x10000) {
        out += char(0xe0 | (c >> 12)), out += char(0x80 | ((c >> 6) & 63)), out += char(0x80 | (c & 63));
      } else {
        out += char(0xf0 | (c >> 18)), out += char(0x80 | ((c >> 12) & 63)), out += char(0x80 | ((c >> 6) & 63)),
            out += char(0x80 | (c & 63));
      }
    }
    if (std::size_t(*length) > n) out += "...";
    return out;
  }

  // nullptr once the line tables' total would pass its limit (cut() then says so).
  const CodeInfo* code(std::uint64_t addr) {
    auto it = codes_.find(addr);
    if (it != codes_.end()) return &it->second;
    CodeInfo ci;
    std::vector<std::uint8_t> head(l_.code_adaptive);
    if (mem_.read(addr, head.data(), head.size())) {
      auto field = [&](std::uint64_t off, auto& v) { std::memcpy(&v, head.data() + off, sizeof v); };
      std::uint64_t filename = 0, qualname = 0, linetable = 0;
      std::int32_t first_line = 0, first_traceable = 0;
      field(l_.code_filename, filename), field(l_.code_qualname, qualname), field(l_.code_linetable, linetable);
      field(l_.code_firstlineno, first_line), field(l_.code_firsttraceable, first_traceable);
      if (auto size = mem_.get<std::int64_t>(linetable + l_.bytes_size);
          size && *size >= 0 && std::size_t(*size) <= lim_.max_linetable) {
        if (linetables_ + std::size_t(*size) > lim_.max_linetable_bytes) {
          cut_ = "truncated: the code objects' line tables passed " + size_text(lim_.max_linetable_bytes);
          return nullptr;
        }
        linetables_ += std::size_t(*size);
        ci.linetable.resize(std::size_t(*size));
        if (!ci.linetable.empty() && !mem_.read(linetable + l_.bytes_sval, ci.linetable.data(), ci.linetable.size()))
          ci.linetable.clear();
      }
      ci.file = read_str(filename);
      ci.function = read_str(qualname);
      names_ += ci.file.size() + ci.function.size();
      ci.first_line = first_line;
      ci.first_traceable = first_traceable;
      ci.ok = true;
    }
    return &codes_.emplace(addr, std::move(ci)).first->second;
  }

  // One thread's frames, innermost first.
  void frames(std::uint64_t tstate, PyThread& out) {
    auto cframe = ptr(tstate + l_.tstate_cframe);
    if (!cframe || !*cframe) return;
    auto frame = ptr(*cframe + l_.cframe_current_frame);
    std::uint64_t f = frame.value_or(0);
    std::vector<std::uint8_t> buf(std::max(l_.frame_owner, l_.frame_prev_instr + 8) + 1);
    for (int depth = 0; f; ++depth) {
      if (depth >= lim_.max_depth || !go_on()) {
        out.truncated = true;
        return;
      }
      ++visited_;  // every frame read counts, kept or not: each may add a code object
      if (!mem_.read(f, buf.data(), buf.size())) {
        out.truncated = true;  // the chain points where nothing is mapped (it moved under us)
        return;
      }
      std::uint64_t code_addr = 0, previous = 0, prev_instr = 0;
      std::memcpy(&code_addr, buf.data() + l_.frame_code, 8);
      std::memcpy(&previous, buf.data() + l_.frame_previous, 8);
      std::memcpy(&prev_instr, buf.data() + l_.frame_prev_instr, 8);
      const int owner = buf[l_.frame_owner];
      f = previous;
      if (owner == l_.owner_cstack || !code_addr) continue;
      const CodeInfo* ci = code(code_addr);
      if (!ci) {
        out.truncated = true;
        return;
      }
      if (!ci->ok) continue;
      const std::uint64_t code_start = code_addr + l_.code_adaptive;
      // A frame that has not reached its first traceable instruction yet (_PyFrame_IsIncomplete).
      if (owner != l_.owner_generator && prev_instr < code_start + std::uint64_t(std::max(ci->first_traceable, 0)) * 2)
        continue;
      const long lasti = (long(prev_instr) - long(code_start)) / 2;
      Frame fr;
      fr.kind = Frame::Kind::python;
      fr.function = ci->function;
      fr.file = ci->file;
      names_ += fr.function.size() + fr.file.size();
      scanned_ += ci->linetable.size();  // at most: the lookup stops at the frame's instruction
      // -1 (no location: a frozen module's frames during start-up, say) and a hostile negative
      // first line are 0, the model's "unknown".
      fr.line = std::max(0, addr_to_line(ci->linetable, ci->first_line, int(lasti * 2)));
      out.frames.push_back(std::move(fr));
    }
  }

 private:
  Memory& mem_;
  const PyLayout& l_;
  const WalkLimits& lim_;
  std::unordered_map<std::uint64_t, CodeInfo> codes_;
  std::size_t visited_ = 0, names_ = 0, linetables_ = 0, scanned_ = 0;
  std::string cut_;
};

}  // namespace

PyWalk walk_python(Memory& mem, std::uint64_t runtime_addr, const PyLayout& layout, const WalkLimits& limits) {
  PyWalk out;
  Walker w(mem, layout, limits);
  auto interp = w.ptr(runtime_addr + layout.runtime_interpreters_head);
  if (!interp) {
    out.error = "cannot read _PyRuntime.interpreters.head";
    return out;
  }
  // The thread states first (each costs a few reads and no frame), then their frames, oldest first.
  std::vector<std::uint64_t> states;
  std::string listing;  // why the listing stopped early
  int ninterp = 0;
  for (std::uint64_t is = *interp; is && listing.empty() && w.cut().empty(); ++ninterp) {
    if (ninterp >= limits.max_interpreters) {
      listing = "truncated: more than " + std::to_string(limits.max_interpreters) + " interpreters (a loop?)";
      break;
    }
    auto t = w.ptr(is + layout.interp_threads_head);
    for (std::uint64_t ts = t.value_or(0); ts;) {
      if (int(states.size()) >= limits.max_threads) {
        listing = "truncated: more than " + std::to_string(limits.max_threads) + " threads (a loop?)";
        break;
      }
      if (limits.out_of_time && limits.out_of_time()) {
        w.out_of_time();
        break;
      }
      states.push_back(ts);
      ts = w.ptr(ts + layout.tstate_next).value_or(0);
    }
    is = w.ptr(is + layout.interp_next).value_or(0);
  }
  // A walk cut short leaves out the newest threads it did not reach (the error says so).
  std::size_t first = states.size();
  out.threads.resize(states.size());
  for (; first > 0 && w.cut().empty(); --first) {
    PyThread& th = out.threads[first - 1];
    th.thread_id = w.ptr(states[first - 1] + layout.tstate_thread_id).value_or(0);
    th.native_tid = int(mem.get<std::uint64_t>(states[first - 1] + layout.tstate_native_thread_id).value_or(0));
    w.frames(states[first - 1], th);
  }
  out.threads.erase(out.threads.begin(), out.threads.begin() + std::ptrdiff_t(first));
  for (const std::string& why : {listing, w.cut()}) {
    if (why.empty()) continue;
    out.error += (out.error.empty() ? "" : "; ") + why;
    out.limit_reached = true;
  }
  return out;
}

}  // namespace ddp::stacks

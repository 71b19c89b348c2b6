// lib/stacks' pure parts over synthetic memory: the CPython location table (fixtures captured
// from CPython 3.11.2 and 3.12.1), the layout table (against offsetof() over Debian's headers),
// the ELF dynamic-symbol lookup, and the frame walk for 3.11 and 3.12 including hostile images.
#include "image.hpp"
#include "stacks/cpython.hpp"
#include "stacks/elf.hpp"

#include <elf.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <map>
#include <memory>
#include <sstream>
#include <utility>

using namespace ddp::stacks;
using ddp::stacks::test::Image;

namespace {

std::vector<std::uint8_t> unhex(std::string_view h) {
  std::vector<std::uint8_t> out;
  for (std::size_t i = 0; i + 1 < h.size(); i += 2)
    out.push_back(std::uint8_t(std::stoi(std::string(h.substr(i, 2)), nullptr, 16)));
  return out;
}

// f's co_linetable and co_lines(), captured with tests/unit/stacks/linetable_fixture.py:
// a loop, an if/else, 100 blank lines (a varint of two chunks), a comprehension, try/except and
// a two-line return, so every entry form except "long" with columns > 127 occurs.
struct LineFixture {
  const char* version;
  int first_line;
  const char* table;
  std::vector<std::pair<int, int>> lines;
};

const LineFixture k311{
    "3.11.2",
    202,
    "8000d80c0d8045dd0d12903189588c58f000040517f0000405178801d80b0c8871893590418a3a883ad80c119051894a88458845e00c119051"
    "894a88458845f04c03030511d80c29d00c299d45a025994c9c4cd00c29d10c29d40c2988018801f8dd0b15f000010511f000010511f0000105"
    "11d80c10880188018801f003010511f8f8f8e00c11d80c0df003010c0ff00001050f",
    {{0, 202},   {2, 203},   {4, 203},   {6, 204},   {8, 204},   {10, 204},  {12, 204},  {14, 204},  {16, 204},
     {18, 204},  {20, 204},  {22, 204},  {24, 204},  {26, 204},  {28, 204},  {30, 204},  {32, 204},  {34, 204},
     {36, 204},  {38, 204},  {40, 205},  {42, 205},  {44, 205},  {46, 205},  {48, 205},  {50, 205},  {52, 205},
     {54, 205},  {56, 205},  {58, 206},  {60, 206},  {62, 206},  {64, 206},  {66, 206},  {68, 206},  {70, 208},
     {72, 208},  {74, 208},  {76, 208},  {78, 208},  {80, 208},  {82, 310},  {84, 311},  {86, 311},  {88, 311},
     {90, 311},  {92, 311},  {94, 311},  {96, 311},  {98, 311},  {100, 311}, {102, 311}, {104, 311}, {106, 311},
     {108, 311}, {110, 311}, {112, 311}, {114, 311}, {116, 311}, {118, 311}, {120, 311}, {122, 311}, {124, 311},
     {126, 311}, {128, 311}, {130, 311}, {132, 311}, {134, 311}, {136, -1},  {138, 312}, {140, 312}, {142, 312},
     {144, 312}, {146, 312}, {148, 312}, {150, 312}, {152, 312}, {154, 312}, {156, 313}, {158, 313}, {160, 313},
     {162, 313}, {164, 312}, {166, -1},  {168, -1},  {170, -1},  {172, 314}, {174, 315}, {176, 314}, {178, 314}}};

const LineFixture k312{
    "3.12.1",
    202,
    "8000d80c0d8045dc0d1290318b58f2000405178801d80b0c8871893590418a3ad80c119051894a8945e00c119051894a8945f009040517f054"
    "03030511dc1c21a0259b4cd60c299071885190118b55d00c298801d00c29f006000d12d80c0df003010c0ff00001050ff9f207000d2af8dc0b"
    "15f200010511d80c108901d80c11d80c0df003010c0ff00001050ff005010511fa",
    {{0, 202},   {2, 203},   {4, 203},   {6, 204},   {8, 204},   {10, 204},  {12, 204},  {14, 204},  {16, 204},
     {18, 204},  {20, 204},  {22, 204},  {24, 204},  {26, 204},  {28, 204},  {30, 204},  {32, 204},  {34, 205},
     {36, 205},  {38, 205},  {40, 205},  {42, 205},  {44, 205},  {46, 205},  {48, 205},  {50, 206},  {52, 206},
     {54, 206},  {56, 206},  {58, 206},  {60, 206},  {62, 208},  {64, 208},  {66, 208},  {68, 208},  {70, 208},
     {72, 208},  {74, 204},  {76, 310},  {78, 311},  {80, 311},  {82, 311},  {84, 311},  {86, 311},  {88, 311},
     {90, 311},  {92, 311},  {94, 311},  {96, 311},  {98, 311},  {100, 311}, {102, 311}, {104, 311}, {106, 311},
     {108, 311}, {110, 311}, {112, 311}, {114, 311}, {116, 311}, {118, 311}, {120, 311}, {122, 311}, {124, 311},
     {126, 311}, {128, 311}, {130, 311}, {132, 314}, {134, 315}, {136, 314}, {138, 314}, {140, -1},  {142, -1},
     {144, 311}, {146, 311}, {148, 311}, {150, -1},  {152, 312}, {154, 312}, {156, 312}, {158, 312}, {160, 312},
     {162, 312}, {164, 312}, {166, 312}, {168, 313}, {170, 313}, {172, 313}, {174, 314}, {176, 315}, {178, 314},
     {180, 314}, {182, 312}, {184, -1},  {186, -1},  {188, -1}}};

}  // namespace

TEST(StacksLineTable, MatchesCPythonForEveryInstruction) {
  for (const auto* fx : {&k311, &k312}) {
    const auto table = unhex(fx->table);
    for (auto [addr, line] : fx->lines)
      EXPECT_EQ(addr_to_line(table, fx->first_line, addr), line) << fx->version << " addr " << addr;
  }
}

TEST(StacksLineTable, EdgesAreBounded) {
  const auto table = unhex(k311.table);
  EXPECT_EQ(addr_to_line(table, 202, -2), 202);     // before the first instruction: the def line
  EXPECT_EQ(addr_to_line(table, 202, 100000), -1);  // past the end
  EXPECT_EQ(addr_to_line({}, 7, 0), -1);
  // A truncated varint (continuation bit on the last byte) must not read past the table.
  const std::vector<std::uint8_t> cut{0x80 | (13 << 3), 0x7f};
  EXPECT_NO_FATAL_FAILURE(addr_to_line(cut, 1, 0));
}

TEST(StacksLayout, KnowsOnly311And312) {
  EXPECT_TRUE(layout_for(0x030b02f0));
  EXPECT_TRUE(layout_for(0x030c01f0));
  EXPECT_FALSE(layout_for(0x030a0cf0));  // 3.10: PyFrameObject chains, not read
  EXPECT_FALSE(layout_for(0x030d00f0));  // 3.13: _Py_DebugOffsets, not read
  EXPECT_EQ(format_version(0x030b02f0), "3.11.2");
}

TEST(StacksLayout, Table311MatchesDebianHeaders) {
#ifndef DDP_OFFSETS_PROBE_311
  FAIL() << "tests/unit/stacks/offsets_probe.c was not built: install python3-dev (scripts/setup) and re-run cmake";
#else
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(DDP_OFFSETS_PROBE_311, "r"), pclose);
  ASSERT_TRUE(p);
  std::map<std::string, std::uint64_t> got;
  char name[128];
  unsigned long long v = 0;
  char ver[32];
  ASSERT_EQ(std::fscanf(p.get(), "version %31s\n", ver), 1);
  while (std::fscanf(p.get(), "%127s %llu\n", name, &v) == 2) got[name] = v;
  const PyLayout l = *layout_for(0x030b00f0);
  const std::map<std::string, std::uint64_t> want{{"runtime_interpreters_head", l.runtime_interpreters_head},
                                                  {"interp_next", l.interp_next},
                                                  {"interp_threads_head", l.interp_threads_head},
                                                  {"tstate_next", l.tstate_next},
                                                  {"tstate_thread_id", l.tstate_thread_id},
                                                  {"tstate_native_thread_id", l.tstate_native_thread_id},
                                                  {"tstate_cframe", l.tstate_cframe},
                                                  {"cframe_current_frame", l.cframe_current_frame},
                                                  {"frame_code", l.frame_code},
                                                  {"frame_previous", l.frame_previous},
                                                  {"frame_prev_instr", l.frame_prev_instr},
                                                  {"frame_owner", l.frame_owner},
                                                  {"owner_generator", std::uint64_t(l.owner_generator)},
                                                  {"code_filename", l.code_filename},
                                                  {"code_name", l.code_name},
                                                  {"code_qualname", l.code_qualname},
                                                  {"code_firstlineno", l.code_firstlineno},
                                                  {"code_linetable", l.code_linetable},
                                                  {"code_firsttraceable", l.code_firsttraceable},
                                                  {"code_adaptive", l.code_adaptive},
                                                  {"bytes_size", l.bytes_size},
                                                  {"bytes_sval", l.bytes_sval},
                                                  {"unicode_length", l.unicode_length},
                                                  {"unicode_state", l.unicode_state},
                                                  {"unicode_ascii_size", l.unicode_ascii_size},
                                                  {"unicode_compact_size", l.unicode_compact_size}};
  EXPECT_EQ(std::string(ver), "3.11");
  EXPECT_EQ(got, want);
#endif
}

TEST(StacksMaps, ParsesProcMaps) {
  const auto m = parse_maps(
      "55d0c0a00000-55d0c0a6f000 r--p 00000000 08:01 1835033                    /usr/bin/python3.11\n"
      "7f1c2c000000-7f1c2c021000 rw-p 00000000 00:00 0 \n"
      "garbage line\n"
      "7ffd1a5e3000-7ffd1a604000 rw-p 00000000 00:00 0                          [stack]\n"
      "7f00-7f10 r-xp 0001a000 08:01 42 /opt/my lib/libpython3.12.so.1.0");
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0].start, 0x55d0c0a00000u);
  EXPECT_EQ(m[0].end, 0x55d0c0a6f000u);
  EXPECT_EQ(m[0].perms, "r--p");
  EXPECT_EQ(m[0].path, "/usr/bin/python3.11");
  EXPECT_EQ(m[1].path, "");
  EXPECT_EQ(m[2].path, "[stack]");
  EXPECT_EQ(m[3].offset, 0x1a000u);
  EXPECT_EQ(m[3].path, "/opt/my lib/libpython3.12.so.1.0");  // a space in a path stays
}

// ---- ELF: a shared object with a dynamic symbol table, built in memory ----

namespace {

struct ElfSym {
  std::string name;
  std::uint64_t value;
  bool defined = true;
};

// Lays out: Ehdr | 2 Phdrs | dynamic | symtab | strtab | hash table, as one PT_LOAD at vaddr 0.
// relocated: the dynamic entries hold run-time addresses (what glibc's loader leaves on x86-64).
std::vector<std::uint8_t> make_elf(std::uint64_t base, const std::vector<ElfSym>& syms, bool gnu, bool relocated,
                                   std::uint16_t type = ET_DYN) {
  std::vector<std::uint8_t> img(0x2000);
  auto at = [&](std::size_t off, const void* p, std::size_t n) { std::memcpy(img.data() + off, p, n); };
  const std::uint64_t bias = type == ET_DYN ? base : 0;
  const std::size_t dyn_off = 0x100, sym_off = 0x200, str_off = 0x600, hash_off = 0x800;
  Elf64_Ehdr eh{};
  std::memcpy(eh.e_ident, ELFMAG, SELFMAG);
  eh.e_ident[EI_CLASS] = ELFCLASS64;
  eh.e_type = type;
  eh.e_phoff = sizeof eh;
  eh.e_phentsize = sizeof(Elf64_Phdr);
  eh.e_phnum = 2;
  at(0, &eh, sizeof eh);
  const std::uint64_t vbase = type == ET_DYN ? 0 : base;  // an executable asks for its address
  Elf64_Phdr load{};
  load.p_type = PT_LOAD, load.p_vaddr = vbase, load.p_memsz = img.size();
  Elf64_Phdr dyn{};
  dyn.p_type = PT_DYNAMIC, dyn.p_vaddr = vbase + dyn_off, dyn.p_memsz = 8 * sizeof(Elf64_Dyn);
  at(sizeof eh, &load, sizeof load);
  at(sizeof eh + sizeof load, &dyn, sizeof dyn);
  // strings and symbols (index 0 is the null symbol)
  std::string strtab(1, '\0');
  std::vector<Elf64_Sym> st(1);
  for (const auto& s : syms) {
    Elf64_Sym e{};
    e.st_name = std::uint32_t(strtab.size());
    strtab += s.name + '\0';
    e.st_value = s.defined ? s.value : 0;
    e.st_shndx = s.defined ? 1 : SHN_UNDEF;
    st.push_back(e);
  }
  at(sym_off, st.data(), st.size() * sizeof(Elf64_Sym));
  at(str_off, strtab.data(), strtab.size());
  std::vector<std::uint32_t> h;
  if (gnu) {
    h = {1, 1, 1, 6, 0, 0, 1};  // nbuckets, symoffset, bloom_size, bloom_shift, bloom (u64), bucket[0]
    for (std::size_t i = 0; i < syms.size(); ++i) {
      std::uint32_t v = gnu_hash(syms[i].name) & ~1u;
      if (i + 1 == syms.size()) v |= 1;
      h.push_back(v);
    }
  } else {
    const std::uint32_t n = std::uint32_t(st.size());
    h = {1, n, n > 1 ? n - 1 : 0};  // one bucket: the chain runs from the last symbol down
    for (std::uint32_t i = 0; i < n; ++i) h.push_back(i == 0 ? 0 : i - 1);
  }
  at(hash_off, h.data(), h.size() * 4);
  const std::uint64_t r = relocated ? bias : 0;
  const std::vector<Elf64_Dyn> d{{DT_SYMTAB, {vbase + sym_off + r}},
                                 {DT_STRTAB, {vbase + str_off + r}},
                                 {DT_STRSZ, {strtab.size()}},
                                 {std::int64_t(gnu ? DT_GNU_HASH : DT_HASH), {vbase + hash_off + r}},
                                 {DT_NULL, {0}}};
  at(dyn_off, d.data(), d.size() * sizeof(Elf64_Dyn));
  return img;
}

}  // namespace

TEST(StacksElf, FindsDefinedDynamicSymbols) {
  const std::uint64_t base = 0x7f0000000000;
  const std::vector<ElfSym> syms{
      {"PyDict_New", 0x1000}, {"_PyRuntime", 0x1a2b3c}, {"Py_Version", 0x1234}, {"memcpy", 0, false}};
  for (bool gnu : {true, false}) {
    for (bool relocated : {true, false}) {
      Image img;
      img.place(base, make_elf(base, syms, gnu, relocated));
      SCOPED_TRACE(std::string(gnu ? "gnu" : "sysv") + (relocated ? " relocated" : " raw"));
      EXPECT_EQ(find_dynamic_symbol(img, base, "_PyRuntime"), base + 0x1a2b3c);
      EXPECT_EQ(find_dynamic_symbol(img, base, "Py_Version"), base + 0x1234);
      EXPECT_EQ(find_dynamic_symbol(img, base, "PyDict_New"), base + 0x1000);
      EXPECT_FALSE(find_dynamic_symbol(img, base, "memcpy"));     // an import, not a definition
      EXPECT_FALSE(find_dynamic_symbol(img, base, "_PyRuntim"));  // a prefix is not the name
      EXPECT_FALSE(find_dynamic_symbol(img, base, "nope"));
    }
  }
}

TEST(StacksElf, ExecutableUsesAbsoluteAddresses) {
  const std::uint64_t base = 0x400000;
  Image img;
  img.place(base, make_elf(base, {{"_PyRuntime", 0xa5b740}}, true, false, ET_EXEC));
  EXPECT_EQ(find_dynamic_symbol(img, base, "_PyRuntime"), 0xa5b740u);
}

TEST(StacksElf, RejectsWhatIsNotAnElfImage) {
  const std::uint64_t base = 0x7f0000000000;
  auto good = make_elf(base, {{"_PyRuntime", 0x100}}, true, true);
  Image img;
  img.place(base, std::vector<std::uint8_t>(0x2000, 0xff));
  EXPECT_FALSE(find_dynamic_symbol(img, base, "_PyRuntime"));
  auto many = good;
  reinterpret_cast<Elf64_Ehdr*>(many.data())->e_phnum = 60000;  // a hostile header: bounded
  Image img2;
  img2.place(base, many);
  EXPECT_FALSE(find_dynamic_symbol(img2, base, "_PyRuntime"));
  Image none;  // nothing mapped
  EXPECT_FALSE(find_dynamic_symbol(none, base, "_PyRuntime"));
}

// ---- the frame walk over a synthetic CPython ----

namespace {

// Builds CPython objects at the offsets of a layout, so the walker sees what the real
// interpreter of that version would show.
struct FakePython {
  Image img;
  PyLayout l;
  std::uint64_t runtime = 0;

  explicit FakePython(const PyLayout& layout) : l(layout) { runtime = img.alloc(256); }

  std::uint64_t str(const std::string& s) {
    const std::uint64_t o = img.alloc(l.unicode_ascii_size + s.size() + 1);
    img.put<std::int64_t>(o + l.unicode_length, std::int64_t(s.size()));
    img.put<std::uint32_t>(o + l.unicode_state, (1u << 2) | (1u << 5) | (1u << 6));  // kind 1, compact, ascii
    img.put_bytes(o + l.unicode_ascii_size, s.data(), s.size());
    return o;
  }
  std::uint64_t ucs2(const std::u16string& s) {
    const std::uint64_t o = img.alloc(l.unicode_compact_size + 2 * s.size() + 2);
    img.put<std::int64_t>(o + l.unicode_length, std::int64_t(s.size()));
    img.put<std::uint32_t>(o + l.unicode_state, (2u << 2) | (1u << 5));  // kind 2, compact, not ascii
    img.put_bytes(o + l.unicode_compact_size, s.data(), 2 * s.size());
    return o;
  }
  std::uint64_t bytes(const std::vector<std::uint8_t>& b) {
    const std::uint64_t o = img.alloc(l.bytes_sval + b.size() + 1);
    img.put<std::int64_t>(o + l.bytes_size, std::int64_t(b.size()));
    if (!b.empty()) img.put_bytes(o + l.bytes_sval, b.data(), b.size());
    return o;
  }
  // A code object whose line table maps each code unit k to line first+k ("no columns" entries
  // of one unit, delta 1 after the first).
  std::uint64_t code(std::uint64_t name, const std::string& file, int first, int units = 32, int first_traceable = 0) {
    std::vector<std::uint8_t> t;
    for (int k = 0; k < units; ++k) {
      t.push_back(0x80 | (13 << 3));
      t.push_back(k == 0 ? 0 : 2);  // signed varint: +1
    }
    const std::uint64_t c = img.alloc(l.code_adaptive + 2 * units);
    img.put<std::uint64_t>(c + l.code_qualname, name);
    img.put<std::uint64_t>(c + l.code_name, name);
    img.put<std::uint64_t>(c + l.code_filename, str(file));
    img.put<std::int32_t>(c + l.code_firstlineno, first);
    img.put<std::int32_t>(c + l.code_firsttraceable, first_traceable);
    img.put<std::uint64_t>(c + l.code_linetable, bytes(t));
    return c;
  }
  std::uint64_t code(const std::string& name, const std::string& file, int first, int units = 32,
                     int first_traceable = 0) {
    return code(str(name), file, first, units, first_traceable);
  }
  // A frame executing code unit `unit` of `code`.
  std::uint64_t frame(std::uint64_t code, int unit, std::uint64_t previous, int owner = 0) {
    const std::uint64_t f = img.alloc(96);
    img.put<std::uint64_t>(f + l.frame_code, code);
    img.put<std::uint64_t>(f + l.frame_previous, previous);
    img.put<std::uint64_t>(f + l.frame_prev_instr, code + l.code_adaptive + 2 * std::uint64_t(unit));
    img.put<std::uint8_t>(f + l.frame_owner, std::uint8_t(owner));
    return f;
  }
  std::uint64_t thread(int tid, std::uint64_t top, std::uint64_t next = 0) {
    const std::uint64_t ts = img.alloc(256), cf = img.alloc(32);
    img.put<std::uint64_t>(ts + l.tstate_next, next);
    img.put<std::uint64_t>(ts + l.tstate_thread_id, 0x7f0000001000u + std::uint64_t(tid));
    img.put<std::uint64_t>(ts + l.tstate_native_thread_id, std::uint64_t(tid));
    img.put<std::uint64_t>(ts + l.tstate_cframe, cf);
    img.put<std::uint64_t>(cf + l.cframe_current_frame, top);
    return ts;
  }
  std::uint64_t interp(std::uint64_t threads, std::uint64_t next = 0) {
    const std::uint64_t is = img.alloc(256);
    img.put<std::uint64_t>(is + l.interp_next, next);
    img.put<std::uint64_t>(is + l.interp_threads_head, threads);
    return is;
  }
  void set_interpreters(std::uint64_t head) { img.put<std::uint64_t>(runtime + l.runtime_interpreters_head, head); }
};

std::string describe(const std::vector<Frame>& fs) {
  std::ostringstream s;
  for (const auto& f : fs) s << f.function << "@" << f.file << ":" << f.line << ";";
  return s.str();
}

class StacksWalk : public ::testing::TestWithParam<std::uint32_t> {};

}  // namespace

TEST_P(StacksWalk, EveryThreadInnermostFirstWithLines) {
  FakePython py(*layout_for(GetParam()));
  const auto c_main = py.code("<module>", "/w/train.py", 1);
  const auto c_step = py.code("Trainer.step", "/w/train.py", 40);
  const auto c_stuck = py.code("stuck_here", "/w/train.py", 10);
  const auto c_loop = py.code("worker_loop", "/usr/lib/python3/dist-packages/torch/data.py", 100);
  auto f0 = py.frame(c_main, 5, 0);
  auto f1 = py.frame(c_step, 2, f0);
  auto f2 = py.frame(c_stuck, 3, f1);
  auto g0 = py.frame(c_loop, 7, 0);
  auto t2 = py.thread(102, g0);
  auto t1 = py.thread(101, f2, t2);
  py.set_interpreters(py.interp(t1));
  const PyWalk w = walk_python(py.img, py.runtime, py.l);
  EXPECT_EQ(w.error, "");
  ASSERT_EQ(w.threads.size(), 2u);
  EXPECT_EQ(w.threads[0].native_tid, 101);
  EXPECT_EQ(w.threads[0].thread_id, 0x7f0000001000u + 101);
  EXPECT_EQ(describe(w.threads[0].frames),
            "stuck_here@/w/train.py:13;Trainer.step@/w/train.py:42;<module>@/w/train.py:6;");
  EXPECT_EQ(w.threads[1].native_tid, 102);
  EXPECT_EQ(describe(w.threads[1].frames), "worker_loop@/usr/lib/python3/dist-packages/torch/data.py:107;");
}

TEST_P(StacksWalk, SkipsIncompleteFramesAndKeepsGenerators) {
  FakePython py(*layout_for(GetParam()));
  const auto c_outer = py.code("outer", "/a.py", 1);
  const auto c_gen = py.code("gen", "/a.py", 20, 32, 4);
  const auto c_new = py.code("just_called", "/a.py", 30, 32, 4);
  auto f0 = py.frame(c_outer, 1, 0);
  auto f1 = py.frame(c_gen, 1, f0, py.l.owner_generator);  // a generator before its first traceable unit: kept
  auto f2 = py.frame(c_new, 1, f1);                        // a frame still in its prologue: skipped
  py.set_interpreters(py.interp(py.thread(7, f2)));
  const PyWalk w = walk_python(py.img, py.runtime, py.l);
  ASSERT_EQ(w.threads.size(), 1u);
  EXPECT_EQ(describe(w.threads[0].frames), "gen@/a.py:21;outer@/a.py:2;");
}

TEST_P(StacksWalk, ThreadWithoutFramesAndSeveralInterpreters) {
  FakePython py(*layout_for(GetParam()));
  const auto c = py.code("sub", "/s.py", 1);
  auto idle = py.thread(11, 0);
  auto busy = py.thread(12, py.frame(c, 0, 0));
  auto second = py.interp(busy);
  py.set_interpreters(py.interp(idle, second));
  const PyWalk w = walk_python(py.img, py.runtime, py.l);
  ASSERT_EQ(w.threads.size(), 2u);
  EXPECT_TRUE(w.threads[0].frames.empty());
  EXPECT_EQ(describe(w.threads[1].frames), "sub@/s.py:1;");
}

TEST_P(StacksWalk, NonAsciiNamesBecomeUtf8) {
  FakePython py(*layout_for(GetParam()));
  const auto c = py.code(py.ucs2(u"sch\u00e4tze_\u03bb"), "/\u00e9.py", 3);
  py.set_interpreters(py.interp(py.thread(5, py.frame(c, 0, 0))));
  const PyWalk w = walk_python(py.img, py.runtime, py.l);
  ASSERT_EQ(w.threads.size(), 1u);
  ASSERT_EQ(w.threads[0].frames.size(), 1u);
  EXPECT_EQ(w.threads[0].frames[0].function, "sch\xc3\xa4tze_\xce\xbb");
}

TEST_P(StacksWalk, HostileImagesAreBounded) {
  FakePython py(*layout_for(GetParam()));
  const auto c = py.code("spin", "/x.py", 1);
  // A frame whose previous is itself: the depth limit cuts it and says so.
  auto self = py.frame(c, 0, 0);
  py.img.put<std::uint64_t>(self + py.l.frame_previous, self);
  // A thread list that loops back on itself.
  auto ts = py.thread(9, self);
  py.img.put<std::uint64_t>(ts + py.l.tstate_next, ts);
  py.set_interpreters(py.interp(ts));
  WalkLimits lim;
  lim.max_depth = 50;
  lim.max_threads = 8;
  const PyWalk w = walk_python(py.img, py.runtime, py.l, lim);
  EXPECT_NE(w.error.find("more than 8 threads"), std::string::npos) << w.error;
  ASSERT_EQ(w.threads.size(), 8u);
  EXPECT_TRUE(w.threads[0].truncated);
  EXPECT_EQ(w.threads[0].frames.size(), 50u);
  // A huge string length and a pointer to nowhere: "?" (or a cut name), no crash, no huge allocation.
  const auto bad = py.str("x");
  py.img.put<std::int64_t>(bad + py.l.unicode_length, std::int64_t(1) << 60);
  const auto c2 = py.code(bad, "/y.py", 1);
  auto f = py.frame(c2, 0, py.frame(0xdead0000, 0, 0));
  py.set_interpreters(py.interp(py.thread(3, f)));
  const PyWalk w2 = walk_python(py.img, py.runtime, py.l);
  ASSERT_EQ(w2.threads.size(), 1u);
  ASSERT_EQ(w2.threads[0].frames.size(), 1u);  // the frame with an unreadable code object is left out
  EXPECT_FALSE(w2.threads[0].truncated);
  EXPECT_EQ(w2.threads[0].frames[0].function, "?");
  // A previous pointer into nothing: the walk stops there and says the stack is cut.
  auto dangling = py.frame(c, 0, 0xbad00000);
  py.set_interpreters(py.interp(py.thread(4, dangling)));
  const PyWalk w3 = walk_python(py.img, py.runtime, py.l);
  ASSERT_EQ(w3.threads.size(), 1u);
  EXPECT_EQ(w3.threads[0].frames.size(), 1u);
  EXPECT_TRUE(w3.threads[0].truncated);
  // Nothing readable at _PyRuntime.
  Image empty;
  EXPECT_NE(walk_python(empty, 0x1000, py.l).error, "");
}

namespace {

struct Totals {
  std::size_t frames = 0, name_bytes = 0;
};
Totals totals(const PyWalk& w) {
  Totals t;
  for (const auto& th : w.threads) {
    t.frames += th.frames.size();
    for (const auto& f : th.frames) t.name_bytes += f.function.size() + f.file.size();
  }
  return t;
}

}  // namespace

// The reviewer's process: a thread list and a frame list that loop, every frame running one code
// object with the longest names read. Per-thread limits alone made that 4096 threads x 512
// frames x 8 KiB of names (16 GiB); the walk's totals stop it at 4 MiB, in a few thousand reads.
TEST_P(StacksWalk, LoopingThreadsAndFramesAreBoundedInAll) {
  FakePython py(*layout_for(GetParam()));
  const auto c = py.code(std::string(4096, 'f'), std::string(4096, 'p'), 1);
  auto self = py.frame(c, 0, 0);
  py.img.put<std::uint64_t>(self + py.l.frame_previous, self);
  auto ts = py.thread(9, self);
  py.img.put<std::uint64_t>(ts + py.l.tstate_next, ts);
  py.set_interpreters(py.interp(ts));
  const WalkLimits lim;
  const PyWalk w = walk_python(py.img, py.runtime, py.l);
  EXPECT_TRUE(w.limit_reached);
  EXPECT_EQ(w.error.rfind("truncated: ", 0), 0u) << w.error;
  EXPECT_NE(w.error.find("the frames' names passed 4 MiB"), std::string::npos) << w.error;
  const Totals t = totals(w);
  EXPECT_LE(t.name_bytes, lim.max_string_bytes);
  EXPECT_GT(t.name_bytes, lim.max_string_bytes / 2);
  EXPECT_LE(t.frames, std::size_t(lim.max_frames));
  ASSERT_FALSE(w.threads.empty());
  EXPECT_TRUE(w.threads.front().truncated);
  EXPECT_LT(py.img.reads, 3 * lim.max_threads + 2 * lim.max_frames);

  // Short names: the total of frames read cuts it instead (8 threads of 512).
  FakePython small(*layout_for(GetParam()));
  const auto c2 = small.code("spin", "/x.py", 1);
  auto self2 = small.frame(c2, 0, 0);
  small.img.put<std::uint64_t>(self2 + small.l.frame_previous, self2);
  auto ts2 = small.thread(9, self2);
  small.img.put<std::uint64_t>(ts2 + small.l.tstate_next, ts2);
  small.set_interpreters(small.interp(ts2));
  const PyWalk w2 = walk_python(small.img, small.runtime, small.l);
  EXPECT_TRUE(w2.limit_reached);
  EXPECT_NE(w2.error.find("truncated: more than 4096 threads (a loop?)"), std::string::npos) << w2.error;
  EXPECT_NE(w2.error.find("truncated: more than 4096 frames in all (a loop?)"), std::string::npos) << w2.error;
  EXPECT_EQ(totals(w2).frames, 4096u);
  EXPECT_LE(w2.threads.size(), 9u);  // the threads not reached are left out
}

// Code objects of their own, each with a line table just under the per-object limit: their sum
// is what is bounded.
TEST_P(StacksWalk, LineTablesAreBoundedInAll) {
  FakePython py(*layout_for(GetParam()));
  std::uint64_t f = 0;
  for (int k = 0; k < 16; ++k) f = py.frame(py.code("fn" + std::to_string(k), "/t.py", 1, 100), 0, f);
  py.set_interpreters(py.interp(py.thread(3, f)));
  WalkLimits lim;
  lim.max_linetable = 256;         // each table is 200 bytes
  lim.max_linetable_bytes = 1000;  // five of them
  const PyWalk w = walk_python(py.img, py.runtime, py.l, lim);
  EXPECT_TRUE(w.limit_reached);
  EXPECT_EQ(w.error, "truncated: the code objects' line tables passed 1000 bytes");
  ASSERT_EQ(w.threads.size(), 1u);
  EXPECT_EQ(w.threads[0].frames.size(), 5u);
  EXPECT_TRUE(w.threads[0].truncated);

  // One code object, held once, but looked through by every frame of a loop: that is bounded too.
  FakePython loop(*layout_for(GetParam()));
  auto self = loop.frame(loop.code("spin", "/x.py", 1, 100), 99, 0);
  loop.img.put<std::uint64_t>(self + loop.l.frame_previous, self);
  loop.set_interpreters(loop.interp(loop.thread(4, self)));
  WalkLimits scan;
  scan.max_linetable_scan = 1000;
  const PyWalk w2 = walk_python(loop.img, loop.runtime, loop.l, scan);
  EXPECT_EQ(w2.error, "truncated: the line lookups passed 1000 bytes of line tables");
  ASSERT_EQ(w2.threads.size(), 1u);
  EXPECT_EQ(w2.threads[0].frames.size(), 5u);
  EXPECT_EQ(w2.threads[0].frames[4].line, 100);
}

// The time check: asked before every frame; once it says so, the walk ends where it is.
TEST_P(StacksWalk, OutOfTimeEndsTheWalkAtTheNextFrame) {
  FakePython py(*layout_for(GetParam()));
  const auto c = py.code("spin", "/x.py", 1);
  auto self = py.frame(c, 0, 0);
  py.img.put<std::uint64_t>(self + py.l.frame_previous, self);
  py.set_interpreters(py.interp(py.thread(9, self)));
  int asked = 0;
  WalkLimits lim;
  lim.out_of_time = [&asked] { return ++asked > 20; };
  const PyWalk w = walk_python(py.img, py.runtime, py.l, lim);
  EXPECT_TRUE(w.limit_reached);
  EXPECT_EQ(w.error, "truncated: out of time");
  ASSERT_EQ(w.threads.size(), 1u);
  EXPECT_TRUE(w.threads[0].truncated);
  EXPECT_EQ(w.threads[0].frames.size(), 19u);  // one ask for the thread's listing, one per frame
  EXPECT_EQ(asked, 21);
}

// A walk cut short keeps the oldest thread (the main one: CPython adds threads at the head of
// its list) and leaves out newer ones it did not reach; the order stays the list's.
TEST_P(StacksWalk, ACutWalkKeepsTheMainThread) {
  FakePython py(*layout_for(GetParam()));
  const auto c = py.code("work", "/w.py", 1);
  auto chain = [&](int n) {
    std::uint64_t f = 0;
    for (int k = 0; k < n; ++k) f = py.frame(c, k, f);
    return f;
  };
  auto main = py.thread(100, chain(3));
  auto mid = py.thread(101, chain(3), main);
  auto newest = py.thread(102, chain(3), mid);
  py.set_interpreters(py.interp(newest));
  WalkLimits lim;
  lim.max_frames = 4;
  const PyWalk w = walk_python(py.img, py.runtime, py.l, lim);
  EXPECT_EQ(w.error, "truncated: more than 4 frames in all (a loop?)");
  ASSERT_EQ(w.threads.size(), 2u);
  EXPECT_EQ(w.threads[0].native_tid, 101);
  EXPECT_EQ(w.threads[0].frames.size(), 1u);
  EXPECT_TRUE(w.threads[0].truncated);
  EXPECT_EQ(w.threads[1].native_tid, 100);
  EXPECT_EQ(w.threads[1].frames.size(), 3u);
  EXPECT_FALSE(w.threads[1].truncated);
}

TEST(StacksWalk312, ShimFramesAreNotPython) {
  FakePython py(*layout_for(0x030c01f0));
  const auto c = py.code("caller", "/c.py", 1);
  const auto shim = py.code("<shim>", "<shim>", 0);
  auto f0 = py.frame(c, 0, 0);
  auto f1 = py.frame(shim, 0, f0, py.l.owner_cstack);
  py.set_interpreters(py.interp(py.thread(1, f1)));
  const PyWalk w = walk_python(py.img, py.runtime, py.l);
  ASSERT_EQ(w.threads.size(), 1u);
  EXPECT_EQ(describe(w.threads[0].frames), "caller@/c.py:1;");
}

INSTANTIATE_TEST_SUITE_P(Versions, StacksWalk, ::testing::Values(0x030b02f0u, 0x030c01f0u), [](const auto& info) {
  return info.param == 0x030b02f0u ? std::string("py311") : std::string("py312");
});

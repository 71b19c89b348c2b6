// For the project's x86-64 assembly files (lib/common/openssl_lazy.S, lib/supervisor/clone3_x86_64.S),
// included at their top:
// - DDP_ENDBR begins every entry reached by an indirect jump or call when built with
//   -fcf-protection (not Debian's default);
// - the object says its stack is not executable, and, with -fcf-protection, that it is IBT and
//   shadow-stack clean as the compiler was asked: each including file keeps to that (every call
//   in it returns normally, or never returns).
#pragma once
// Assembler directives below, not C: clang-format would break them.
// clang-format off

#if defined(__CET__)
#define DDP_ENDBR endbr64
#else
#define DDP_ENDBR
#endif

  .pushsection .note.GNU-stack,"",@progbits
  .popsection

#if defined(__CET__)
  .pushsection .note.gnu.property,"a"
  .p2align 3
  .long 4           // the name's size
  .long 16          // the description's size
  .long 5           // NT_GNU_PROPERTY_TYPE_0
  .asciz "GNU"
  .long 0xc0000002  // GNU_PROPERTY_X86_FEATURE_1_AND
  .long 4
  .long (__CET__) & 3  // 1: IBT, 2: SHSTK
  .p2align 3
  .popsection
#endif

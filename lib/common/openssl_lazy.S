// OpenSSL for ddpctl, loaded when first called (Release builds on x86-64; see openssl_lazy.hpp).
// Each OpenSSL function ddpctl calls is defined here as a one-instruction trampoline,
// `jmp *slot`. Every slot starts at a stub that records its index and enters
// ddp_openssl_lazy_enter: that saves the argument registers, has ddp_openssl_lazy_resolve
// (openssl_lazy.cpp) load libssl.so.3 and fill every slot, restores them and jumps on. Later
// calls cost the one indirect jump. Arguments pass untouched, so no signature is needed here:
// the callers were compiled against OpenSSL's own headers.
//
// The list is exactly what ddpctl imports: a name it calls that is missing here fails its link
// (undefined reference); `nm -D --undefined-only` on a build linked the usual way gives it.

// With -fcf-protection the entries reached by an indirect jump or call (a trampoline whose
// address ddpctl takes, as a deleter; every stub) begin with DDP_ENDBR, and every call here
// returns normally (asm_x86_64.h).
#include "common/asm_x86_64.h"

  .macro LAZY name
  .pushsection .text.ddp_openssl_lazy,"ax",@progbits
  .globl \name
  .hidden \name  // ddpctl's own calls only: never exported, so no library loaded later binds to it
  .type \name, @function
\name:
  DDP_ENDBR
  jmp *ddp_openssl_slots+8*ddp_openssl_n(%rip)
  .size \name, .-\name
.Lstub_\name:
  DDP_ENDBR
  mov $ddp_openssl_n, %r11d
  jmp ddp_openssl_lazy_enter
  .popsection
  .pushsection .data.ddp_openssl_slots,"aw",@progbits
  .quad .Lstub_\name
  .popsection
  .pushsection .rodata.ddp_openssl_names,"a",@progbits
  .asciz "\name"
  .popsection
  .set ddp_openssl_n, ddp_openssl_n + 1
  .endm

  .set ddp_openssl_n, 0
  .pushsection .data.ddp_openssl_slots,"aw",@progbits
  .balign 8
  .globl ddp_openssl_slots
  .hidden ddp_openssl_slots
ddp_openssl_slots:
  .popsection
  .pushsection .rodata.ddp_openssl_names,"a",@progbits
  .globl ddp_openssl_names
  .hidden ddp_openssl_names
ddp_openssl_names:
  .popsection

LAZY BIO_ctrl
LAZY BIO_ctrl_pending
LAZY BIO_free
LAZY BIO_new_bio_pair
LAZY BIO_read
LAZY BIO_write
LAZY CRYPTO_get_ex_new_index
LAZY CRYPTO_memcmp
LAZY ERR_clear_error
LAZY ERR_get_error
LAZY ERR_lib_error_string
LAZY ERR_reason_error_string
LAZY EVP_DigestFinal_ex
LAZY EVP_DigestInit_ex
LAZY EVP_DigestUpdate
LAZY EVP_MD_CTX_free
LAZY EVP_MD_CTX_new
LAZY EVP_sha256
LAZY OPENSSL_cleanse
LAZY RAND_bytes
LAZY SHA256
LAZY SHA256_Final
LAZY SHA256_Init
LAZY SHA256_Update
LAZY SSL_CIPHER_find
LAZY SSL_CIPHER_get_handshake_digest
LAZY SSL_CTX_ctrl
LAZY SSL_CTX_free
LAZY SSL_CTX_get_default_passwd_cb_userdata
LAZY SSL_CTX_get_ex_data
LAZY SSL_CTX_get_verify_callback
LAZY SSL_CTX_new
LAZY SSL_CTX_set_ciphersuites
LAZY SSL_CTX_set_default_passwd_cb_userdata
LAZY SSL_CTX_set_ex_data
LAZY SSL_CTX_set_num_tickets
LAZY SSL_CTX_set_options
LAZY SSL_CTX_set_psk_use_session_callback
LAZY SSL_CTX_set_verify
LAZY SSL_SESSION_free
LAZY SSL_SESSION_new
LAZY SSL_SESSION_set1_master_key
LAZY SSL_SESSION_set_cipher
LAZY SSL_SESSION_set_protocol_version
LAZY SSL_accept
LAZY SSL_connect
LAZY SSL_ctrl
LAZY SSL_free
LAZY SSL_get_SSL_CTX
LAZY SSL_get_error
LAZY SSL_get_ex_data
LAZY SSL_get_shutdown
LAZY SSL_new
LAZY SSL_read
LAZY SSL_set_bio
LAZY SSL_set_ex_data
LAZY SSL_write
LAZY TLS_client_method

  .pushsection .rodata.ddp_openssl_names,"a",@progbits
  .byte 0  // the end: an empty name
  .popsection

// Entered by a stub with the slot's index in r11 and the stack as the caller left it at its
// call (rsp = 8 mod 16). Saves what a C call may clobber and the caller's arguments (rdi, rsi,
// rdx, rcx, r8, r9, rax for variadic calls, xmm0-7), calls the resolver with the stack aligned,
// restores them and jumps to the now filled slot.
  .pushsection .text.ddp_openssl_lazy,"ax",@progbits
  .type ddp_openssl_lazy_enter, @function
ddp_openssl_lazy_enter:
  push %rdi
  push %rsi
  push %rdx
  push %rcx
  push %r8
  push %r9
  push %rax
  push %r11
  sub $136, %rsp  // 8 xmm registers and 8 bytes that align the call
  movdqu %xmm0, 0(%rsp)
  movdqu %xmm1, 16(%rsp)
  movdqu %xmm2, 32(%rsp)
  movdqu %xmm3, 48(%rsp)
  movdqu %xmm4, 64(%rsp)
  movdqu %xmm5, 80(%rsp)
  movdqu %xmm6, 96(%rsp)
  movdqu %xmm7, 112(%rsp)
  call ddp_openssl_lazy_resolve
  movdqu 0(%rsp), %xmm0
  movdqu 16(%rsp), %xmm1
  movdqu 32(%rsp), %xmm2
  movdqu 48(%rsp), %xmm3
  movdqu 64(%rsp), %xmm4
  movdqu 80(%rsp), %xmm5
  movdqu 96(%rsp), %xmm6
  movdqu 112(%rsp), %xmm7
  add $136, %rsp
  pop %r11
  pop %rax
  pop %r9
  pop %r8
  pop %rcx
  pop %rdx
  pop %rsi
  pop %rdi
  lea ddp_openssl_slots(%rip), %r10
  jmp *(%r10,%r11,8)
  .size ddp_openssl_lazy_enter, .-ddp_openssl_lazy_enter
  .popsection

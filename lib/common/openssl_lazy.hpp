// OpenSSL, loaded into ddpctl when first called. A local launch (ddpctl's everyday command)
// uses none of it: TLS and the protocol's HMAC serve only the multi-node modes. Linked the usual
// way, the loader mapped libssl and libcrypto at every start and, as Debian builds them with
// BIND_NOW, looked up their 4000 symbols: two thirds of `ddpctl --version`'s instructions,
// 1.6 MiB of a launch's memory (docs/performance.md).
//
// How: openssl_lazy.S defines each OpenSSL function ddpctl calls as a trampoline through a
// slot; the first call through any of them lands in ddp_openssl_lazy_resolve, which loads
// libssl.so.3 (and with it libcrypto.so.3) and fills every slot. Callers are compiled against
// OpenSSL's headers as usual. The trampolines are x86-64 code: elsewhere, and in sanitizer and
// Debug builds, OpenSSL is linked (the `ddp_openssl` target in the top-level CMakeLists.txt).
// Only ddpctl uses this (its DDP_LAZY_OPENSSL property); the daemons link OpenSSL.
#pragma once

extern "C" {
// Loads libssl.so.3 and fills every slot, once, whichever thread comes first; the others wait.
// If the library cannot be loaded or lacks a function, says so on stderr and ends the process
// with status 2: the call that needed it cannot go on.
void ddp_openssl_lazy_resolve();
}

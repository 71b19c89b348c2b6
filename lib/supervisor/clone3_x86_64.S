// ddp_clone3: the clone3 system call with a function to run in the child, for spawn_start
// (process.cpp): a child that shares our memory (CLONE_VM | CLONE_VFORK) on a stack of its own,
// started straight inside the job's cgroup (CLONE_INTO_CGROUP), so that it never migrates into
// it. A migration takes the kernel's cgroup_threadgroup_rwsem for writing, which waits for an
// RCU grace period unless the hierarchy is mounted with favordynmods: a millisecond or more on
// every launch. glibc 2.36 has no public clone3 wrapper.
//
//   long ddp_clone3(struct clone_args* args, size_t size, int (*fn)(void*), void* arg);
//
// The parent gets what the system call returns: the child's pid, or -errno. The child (on the
// stack that args names: the kernel points %rsp at its top) calls fn(arg) and exits with its
// result; fn is expected to exec or _exit first.
#include "common/asm_x86_64.h"  // DDP_ENDBR; the child never returns from its call

  .text
  .globl ddp_clone3
  .hidden ddp_clone3
  .type ddp_clone3, @function
ddp_clone3:
  DDP_ENDBR
  mov %rdx, %r8    // fn and arg where the system call keeps them (it clobbers %rcx and %r11)
  mov %rcx, %r9
  mov $435, %eax   // __NR_clone3; %rdi, %rsi: args, size, as given
  syscall
  test %rax, %rax
  jz 1f
  ret              // the parent: a pid or -errno
1:
  xor %ebp, %ebp   // the child: the outermost frame of its stack
  and $-16, %rsp   // aligned for the call whatever the stack given
  mov %r9, %rdi
  call *%r8
  mov %eax, %edi
  mov $60, %eax    // __NR_exit
  syscall
  hlt
  .size ddp_clone3, .-ddp_clone3

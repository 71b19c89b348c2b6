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
#if defined(__CET__)
#define DDP_ENDBR endbr64
#else
#define DDP_ENDBR
#endif

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

  .section .note.GNU-stack,"",@progbits

#if defined(__CET__)
  .pushsection .note.gnu.property,"a"
  .p2align 3
  .long 4           // the name's size
  .long 16          // the description's size
  .long 5           // NT_GNU_PROPERTY_TYPE_0
  .asciz "GNU"
  .long 0xc0000002  // GNU_PROPERTY_X86_FEATURE_1_AND
  .long 4
  .long (__CET__) & 3  // as the compiler was asked: the child never returns from its call
  .p2align 3
  .popsection
#endif

/* nccl_id_floor: the least a launcher that hands its workers an NCCL unique id must do before
 * the first worker starts: load libnccl and ask it for an id (which opens NCCL's bootstrap root),
 * then print the id. bench/launch/run.py runs it in front of the shell's forks, as "the floor
 * with an NCCL id": what NCCL itself costs, apart from what ddpctl adds around it.
 *
 * A benchmark's floor, not a holder: it exits at once, taking the root with it (the workers of
 * the benchmark are /bin/true). Exit 3 when libnccl cannot be loaded or makes no id. */
#include <dlfcn.h>
#include <stdio.h>

int main(void) {
  void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "nccl_id_floor: %s\n", dlerror());
    return 3;
  }
  int (*get_unique_id)(unsigned char*) = (int (*)(unsigned char*))dlsym(lib, "ncclGetUniqueId");
  unsigned char id[128]; /* NCCL_UNIQUE_ID_BYTES */
  if (!get_unique_id || get_unique_id(id) != 0) {
    fprintf(stderr, "nccl_id_floor: ncclGetUniqueId failed\n");
    return 3;
  }
  for (int i = 0; i < 128; ++i) printf("%02x", id[i]);
  printf("\n");
  return 0;
}

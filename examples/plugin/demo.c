/* demo.c -- runs a few operations on a backend chosen by name, to try a
 * freshly built plugin from C:
 *
 *   ./demo                 # the "loopback" backend
 *   ./demo <name>          # any backend the loader finds
 *
 * The loader looks for libtorchcomms-<name>.so in
 * $TORCHCOMMS_BACKEND_LIB_PATH_<NAME> (a file or a directory), then beside
 * libtorchcomms.so. World size 1 unless the environment says otherwise
 * (TORCHCOMM_RANK / TORCHCOMM_SIZE, torchrun, tcrun...).
 */
#include <stdio.h>
#include <stdlib.h>

#include <torchcomms.h>

#define CHECK(call)                                                            \
  do {                                                                         \
    if ((call) != TC_OK) {                                                     \
      fprintf(stderr, "%s\n", tc_last_error());                                \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

int main(int argc, char **argv) {
  const char *backend = argc > 1 ? argv[1] : "loopback";
  tc_comm_options_t opts = TC_COMM_OPTIONS_INIT;
  opts.name = "demo";
  tc_comm_t *comm;
  CHECK(tc_comm_create(backend, "cpu", &opts, &comm));
  int rank = tc_comm_rank(comm), size = tc_comm_size(comm);
  printf("Rank %d: backend %s version %s, %d rank(s)\n", rank,
         tc_comm_backend(comm), tc_comm_backend_version(comm), size);

  float x[4] = {1, 2, 3, 4};
  CHECK(tc_all_reduce(comm, x, 4, TC_FLOAT32, TC_OP_PREMUL_SUM(2.0), NULL,
                      NULL));
  printf("Rank %d: all_reduce PREMUL_SUM(2): %.1f %.1f %.1f %.1f\n", rank, x[0],
         x[1], x[2], x[3]);

  float *all = calloc((size_t)size * 4, sizeof *all);
  if (!all) return 1;
  tc_work_t *work;
  CHECK(tc_all_gather_single(comm, all, x, 4, TC_FLOAT32, NULL, &work));
  CHECK(tc_work_wait(work));
  CHECK(tc_work_release(work));
  printf("Rank %d: all_gather_single: %.1f ... %.1f\n", rank, all[0],
         all[size * 4 - 1]);
  free(all);

  CHECK(tc_barrier(comm, NULL, NULL));
  CHECK(tc_comm_finalize(comm));
  CHECK(tc_comm_destroy(comm));
  printf("Rank %d: done\n", rank);
  return 0;
}

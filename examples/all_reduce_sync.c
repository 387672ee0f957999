/* all_reduce_sync.c -- the quick start: every rank fills a buffer with
 * rank + 1 and sums it over all ranks synchronously.
 *
 *   tcrun -n 4 ./build/examples/all_reduce_sync
 *   torchrun --no-python --nproc_per_node=4 ./build/examples/all_reduce_sync
 */
#include <stdio.h>
#include <stdlib.h>

#include "torchcomms.h"

#define CHECK(call)                                                            \
  do {                                                                         \
    if ((call) != TC_OK) {                                                     \
      fprintf(stderr, "%s\n", tc_last_error());                                \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

int main(void) {
  tc_comm_options_t opts = TC_COMM_OPTIONS_INIT;
  opts.name = "main_comm";
  tc_comm_t *comm;
  CHECK(tc_comm_create("cpu", "cpu", &opts, &comm));
  int rank = tc_comm_rank(comm);

  enum { N = 1024 };
  static float tensor[N];
  for (int i = 0; i < N; i++) tensor[i] = (float)(rank + 1);
  printf("Rank %d: Before AllReduce: %.1f\n", rank, tensor[0]);

  CHECK(tc_all_reduce(comm, tensor, N, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL));

  printf("Rank %d: After AllReduce: %.1f\n", rank, tensor[0]);
  CHECK(tc_comm_finalize(comm));
  CHECK(tc_comm_destroy(comm));
  return 0;
}

/* all_reduce_async.c -- the asynchronous variant of all_reduce_sync.c: every
 * rank fills a buffer with rank + 1, issues the sum over all ranks with a
 * work pointer (the call returns once the operation is queued), waits on the
 * work object, releases it, and checks the result n * (n + 1) / 2.
 *
 *   tcrun -n 4 ./build/examples/all_reduce_async
 *   torchrun --no-python --nproc_per_node=4 ./build/examples/all_reduce_async
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
  int size = tc_comm_size(comm);

  enum { N = 1024 };
  static float tensor[N];
  for (int i = 0; i < N; i++) tensor[i] = (float)(rank + 1);
  printf("Rank %d: Before AllReduce: %.1f\n", rank, tensor[0]);

  /* Asynchronous: returns at once with a work object. The buffer must not be
   * touched until the work has completed. */
  tc_work_t *work = NULL;
  CHECK(tc_all_reduce(comm, tensor, N, TC_FLOAT32, TC_OP(TC_SUM), NULL, &work));
  /* ... other computation could overlap with the communication here ... */
  CHECK(tc_work_wait(work));
  CHECK(tc_work_release(work));

  printf("Rank %d: After AllReduce: %.1f\n", rank, tensor[0]);
  float expected = (float)size * (float)(size + 1) / 2.0f;
  for (int i = 0; i < N; i++) {
    if (tensor[i] != expected) {
      fprintf(stderr, "Rank %d: wrong value %.1f at %d (expected %.1f)\n", rank,
              tensor[i], i, expected);
      return 1;
    }
  }
  CHECK(tc_comm_finalize(comm));
  CHECK(tc_comm_destroy(comm));
  return 0;
}

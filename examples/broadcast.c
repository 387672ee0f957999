/* broadcast.c -- rank 0 (the root) fills a buffer with 42 + i; every other
 * rank starts with zeros; after tc_broadcast every rank holds the root's
 * data.
 *
 *   tcrun -n 4 ./build/examples/broadcast
 *   torchrun --no-python --nproc_per_node=4 ./build/examples/broadcast
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
  const int root = 0;

  enum { N = 256 };
  static int64_t data[N];
  for (int i = 0; i < N; i++) data[i] = rank == root ? 42 + i : 0;
  printf("Rank %d: Before Broadcast: %lld\n", rank, (long long)data[0]);

  CHECK(tc_broadcast(comm, data, N, TC_INT64, root, NULL, NULL));

  printf("Rank %d: After Broadcast: %lld\n", rank, (long long)data[0]);
  for (int i = 0; i < N; i++) {
    if (data[i] != 42 + i) {
      fprintf(stderr, "Rank %d: wrong value %lld at %d (expected %d)\n", rank,
              (long long)data[i], i, 42 + i);
      return 1;
    }
  }
  CHECK(tc_comm_finalize(comm));
  CHECK(tc_comm_destroy(comm));
  return 0;
}

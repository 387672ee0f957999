/* all_gather.c -- every rank contributes a small block (its rank repeated)
 * and receives every rank's block: once into a list of per-rank buffers
 * (tc_all_gather) and once into one contiguous buffer of size * count
 * elements (tc_all_gather_single).
 *
 *   tcrun -n 4 ./build/examples/all_gather
 *   torchrun --no-python --nproc_per_node=4 ./build/examples/all_gather
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

enum { COUNT = 4 };

int main(void) {
  tc_comm_options_t opts = TC_COMM_OPTIONS_INIT;
  opts.name = "main_comm";
  tc_comm_t *comm;
  CHECK(tc_comm_create("cpu", "cpu", &opts, &comm));
  int rank = tc_comm_rank(comm);
  int size = tc_comm_size(comm);

  float mine[COUNT];
  for (int i = 0; i < COUNT; i++) mine[i] = (float)rank;

  /* A list of per-rank receive buffers. */
  float *blocks = calloc((size_t)size * COUNT, sizeof *blocks);
  void **recvbufs = calloc((size_t)size, sizeof *recvbufs);
  if (!blocks || !recvbufs) return 1;
  for (int r = 0; r < size; r++) recvbufs[r] = blocks + (size_t)r * COUNT;
  CHECK(tc_all_gather(comm, recvbufs, mine, COUNT, TC_FLOAT32, NULL, NULL));

  /* One contiguous receive buffer. */
  float *flat = calloc((size_t)size * COUNT, sizeof *flat);
  if (!flat) return 1;
  CHECK(tc_all_gather_single(comm, flat, mine, COUNT, TC_FLOAT32, NULL, NULL));

  printf("Rank %d: gathered", rank);
  for (int r = 0; r < size; r++) printf(" %.0f", blocks[(size_t)r * COUNT]);
  printf("\n");
  for (int r = 0; r < size; r++) {
    for (int i = 0; i < COUNT; i++) {
      size_t k = (size_t)r * COUNT + (size_t)i;
      if (blocks[k] != (float)r || flat[k] != (float)r) {
        fprintf(stderr,
                "Rank %d: wrong value from rank %d: %.1f / %.1f (expected "
                "%d)\n", rank, r, blocks[k], flat[k], r);
        return 1;
      }
    }
  }
  free(flat);
  free(recvbufs);
  free(blocks);
  CHECK(tc_comm_finalize(comm));
  CHECK(tc_comm_destroy(comm));
  return 0;
}

/* split.c -- tc_comm_split: the ranks split into two groups, the even ranks
 * and the odd ranks (each rank passes the list of its own group, in the
 * parent's rank order). Each group then sums the parent ranks of its members
 * with an all_reduce on the new communicator, and every rank prints its rank
 * and size in the subgroup and the sum.
 *
 *   tcrun -n 4 ./build/examples/split
 *   torchrun --no-python --nproc_per_node=4 ./build/examples/split
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

  /* My group: the ranks with my parity. */
  int *ranks = calloc((size_t)size, sizeof *ranks);
  if (!ranks) return 1;
  size_t n = 0;
  for (int r = rank % 2; r < size; r += 2) ranks[n++] = r;

  tc_comm_t *sub = NULL;
  CHECK(tc_comm_split(comm, ranks, n, rank % 2 ? "odd" : "even", NULL, &sub));
  int subrank = tc_comm_rank(sub), subsize = tc_comm_size(sub);

  int64_t value = rank, expected = 0;
  for (size_t i = 0; i < n; i++) expected += ranks[i];
  CHECK(tc_all_reduce(sub, &value, 1, TC_INT64, TC_OP(TC_SUM), NULL, NULL));

  printf("Rank %d: in group '%s' as rank %d of %d, sum of parent ranks = %lld\n",
         rank, tc_comm_name(sub), subrank, subsize, (long long)value);
  if (subsize != (int)n || subrank != rank / 2 || value != expected) {
    fprintf(stderr,
            "Rank %d: wrong result: rank %d of %d, sum %lld (expected rank %d "
            "of %zu, sum %lld)\n", rank, subrank, subsize, (long long)value,
            rank / 2, n, (long long)expected);
    return 1;
  }
  free(ranks);
  CHECK(tc_comm_finalize(sub));
  CHECK(tc_comm_destroy(sub));
  CHECK(tc_comm_finalize(comm));
  CHECK(tc_comm_destroy(comm));
  return 0;
}

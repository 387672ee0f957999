/* batch_send_recv.c -- batch point-to-point: every rank posts a send to
 * every rank (itself included) and a receive from every rank in one batch
 * (tc_batch_*), then issues it as a single operation. The ops of a batch
 * complete in any order, so this all-to-all exchange cannot deadlock. Rank r
 * sends the value 1000 * r + p to rank p.
 *
 *   tcrun -n 4 ./build/examples/batch_send_recv
 *   torchrun --no-python --nproc_per_node=4 ./build/examples/batch_send_recv
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

enum { COUNT = 8 };

int main(void) {
  tc_comm_options_t opts = TC_COMM_OPTIONS_INIT;
  opts.name = "main_comm";
  tc_comm_t *comm;
  CHECK(tc_comm_create("cpu", "cpu", &opts, &comm));
  int rank = tc_comm_rank(comm);
  int size = tc_comm_size(comm);

  /* sendbuf block p goes to rank p; recvbuf block p comes from rank p. */
  int32_t *sendbuf = calloc((size_t)size * COUNT, sizeof *sendbuf);
  int32_t *recvbuf = calloc((size_t)size * COUNT, sizeof *recvbuf);
  if (!sendbuf || !recvbuf) return 1;
  for (int p = 0; p < size; p++)
    for (int i = 0; i < COUNT; i++) {
      sendbuf[p * COUNT + i] = 1000 * rank + p;
      recvbuf[p * COUNT + i] = -1;
    }

  tc_batch_t *batch;
  CHECK(tc_batch_create(comm, &batch));
  for (int p = 0; p < size; p++) {
    CHECK(tc_batch_send(batch, sendbuf + p * COUNT, COUNT, TC_INT32, p));
    CHECK(tc_batch_recv(batch, recvbuf + p * COUNT, COUNT, TC_INT32, p));
  }
  tc_work_t *work = NULL;
  CHECK(tc_batch_issue(batch, NULL, &work));
  CHECK(tc_work_wait(work));
  CHECK(tc_work_release(work));
  CHECK(tc_batch_free(batch));

  printf("Rank %d: received", rank);
  for (int p = 0; p < size; p++) printf(" %d", recvbuf[p * COUNT]);
  printf("\n");
  for (int p = 0; p < size; p++)
    for (int i = 0; i < COUNT; i++)
      if (recvbuf[p * COUNT + i] != 1000 * p + rank) {
        fprintf(stderr, "Rank %d: wrong value %d from rank %d (expected %d)\n",
                rank, recvbuf[p * COUNT + i], p, 1000 * p + rank);
        return 1;
      }
  free(sendbuf);
  free(recvbuf);
  CHECK(tc_comm_finalize(comm));
  CHECK(tc_comm_destroy(comm));
  return 0;
}

/* send_recv_ring.c -- point-to-point in a ring: every rank sends a block
 * (rank * 100 + i) to the next rank, (r + 1) % n, and receives one from the
 * previous rank, (r - 1 + n) % n, with asynchronous tc_send / tc_recv, then
 * waits on both work objects.
 *
 * Operations on one communicator run in the order they were issued, so if
 * every rank issued its recv first, every rank would wait in its recv for a
 * send still queued behind it on the neighbour: a deadlock. Even ranks
 * therefore issue send then recv, odd ranks recv then send: every even rank's
 * first send meets an odd rank's first recv, and the ring unwinds for any
 * n >= 2 (odd n included). (A batch, see batch_send_recv.c, needs no such
 * ordering: its sends and receives complete in any order.)
 * Needs at least 2 ranks.
 *
 *   tcrun -n 4 ./build/examples/send_recv_ring
 *   torchrun --no-python --nproc_per_node=4 ./build/examples/send_recv_ring
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
  opts.name = "ring";
  tc_comm_t *comm;
  CHECK(tc_comm_create("cpu", "cpu", &opts, &comm));
  int rank = tc_comm_rank(comm);
  int size = tc_comm_size(comm);
  if (size < 2) {
    fprintf(stderr, "Rank %d: send_recv_ring needs at least 2 ranks\n", rank);
    return 1;
  }
  int next = (rank + 1) % size, prev = (rank - 1 + size) % size;

  enum { N = 16 };
  int32_t sendbuf[N], recvbuf[N];
  for (int i = 0; i < N; i++) {
    sendbuf[i] = rank * 100 + i;
    recvbuf[i] = -1;
  }

  tc_work_t *recv_work = NULL, *send_work = NULL;
  if (rank % 2 == 0) {
    CHECK(tc_send(comm, sendbuf, N, TC_INT32, next, NULL, &send_work));
    CHECK(tc_recv(comm, recvbuf, N, TC_INT32, prev, NULL, &recv_work));
  } else {
    CHECK(tc_recv(comm, recvbuf, N, TC_INT32, prev, NULL, &recv_work));
    CHECK(tc_send(comm, sendbuf, N, TC_INT32, next, NULL, &send_work));
  }
  CHECK(tc_work_wait(send_work));
  CHECK(tc_work_wait(recv_work));
  CHECK(tc_work_release(send_work));
  CHECK(tc_work_release(recv_work));

  printf("Rank %d: sent %d to rank %d, received %d from rank %d\n", rank,
         sendbuf[0], next, recvbuf[0], prev);
  for (int i = 0; i < N; i++) {
    if (recvbuf[i] != prev * 100 + i) {
      fprintf(stderr, "Rank %d: wrong value %d at %d (expected %d)\n", rank,
              recvbuf[i], i, prev * 100 + i);
      return 1;
    }
  }
  CHECK(tc_comm_finalize(comm));
  CHECK(tc_comm_destroy(comm));
  return 0;
}

/* window_pipeline.c -- a pipeline hand-off with one-sided windows: rank 0
 * produces STEPS blocks; every rank adds its rank to each block it gets and
 * puts the result straight into the next rank's window, then signals it.
 * The receiving rank posts nothing: it waits for the signal, and the data is
 * already in its memory. A signal back ("the slot is free again") keeps the
 * producer from overwriting a block the next rank has not read yet. The last
 * rank checks every block against the sum 0 + 1 + ... + (n-1).
 *
 * On one host the window is shared memory: a put is a memcpy into the next
 * rank's memory, and wait_signal returns as soon as the counter moves. Over
 * TCP (TORCHCOMMS_CPU_TRANSPORT=tcp, or several hosts) the next rank's
 * window service writes the block into its memory.
 *
 *   tcrun -n 4 ./build/examples/window_pipeline
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

enum { N = 1024, STEPS = 100 };

int main(void) {
  tc_comm_options_t opts = TC_COMM_OPTIONS_INIT;
  opts.name = "pipeline";
  tc_comm_t *comm;
  CHECK(tc_comm_create("cpu", "cpu", &opts, &comm));
  int rank = tc_comm_rank(comm), size = tc_comm_size(comm);
  int next = rank + 1 < size ? rank + 1 : -1, prev = rank > 0 ? rank - 1 : -1;

  /* every rank's window: one block the previous rank writes into */
  tc_window_t *win;
  CHECK(tc_window_create(comm, NULL, N * sizeof(double), NULL, &win));
  double *inbox = tc_window_base(win);
  double block[N];
  long bad = 0;
  for (int step = 0; step < STEPS; step++) {
    if (prev < 0) {
      for (int i = 0; i < N; i++) block[i] = step * 1000.0 + i;
    } else {
      CHECK(tc_window_wait_signal(win, prev, NULL, NULL)); /* a block arrived */
      for (int i = 0; i < N; i++) block[i] = inbox[i] + rank;
      CHECK(tc_window_signal(win, prev, NULL, NULL)); /* the inbox is free again */
    }
    if (next >= 0) {
      if (step > 0) CHECK(tc_window_wait_signal(win, next, NULL, NULL)); /* its inbox is free */
      CHECK(tc_window_put(win, block, sizeof block, next, 0, NULL, NULL));
      CHECK(tc_window_signal(win, next, NULL, NULL));
    } else {
      double add = size * (size - 1) / 2.0;
      for (int i = 0; i < N; i++) bad += block[i] != step * 1000.0 + i + add;
    }
  }
  if (next >= 0 && STEPS > 0) CHECK(tc_window_wait_signal(win, next, NULL, NULL));
  CHECK(tc_window_free(win));
  if (next < 0)
    printf("Rank %d: received %d blocks through the pipeline of %d ranks: %s\n", rank, STEPS,
           size, bad ? "WRONG VALUES" : "all correct");
  else
    printf("Rank %d: passed %d blocks to rank %d\n", rank, STEPS, next);
  CHECK(tc_comm_finalize(comm));
  CHECK(tc_comm_destroy(comm));
  return bad ? 1 : 0;
}

/* fr_sigstop.c -- one rank of a job in which the last rank stops (SIGSTOP)
 * before the fourth collective, for tests/py/test_flight_recorder.py. Run
 * under tcrun with TORCH_FR_DUMP_TEMP_FILE set.
 *
 * Every rank runs all_reduce #1, broadcast #2 and all_gather_single #3
 * (timeout 2 s). Then the last rank publishes its pid and stops itself;
 * the others call all_reduce #4, which times out: each prints its error
 * ("error: ..."), which must carry the hang report naming the stopped rank,
 * and its trace is on disk before the error is returned. Rank 0 then
 * continues the stopped rank (SIGCONT), whose next collectives fail once
 * it finds its peers gone, which writes its trace too. Every rank exits 0 when
 * things went as described, 1 otherwise. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "torchcomms.h"

static int fail(const char *what) {
  fprintf(stderr, "fr_sigstop: %s: %s\n", what, tc_last_error());
  return 1;
}

int main(void) {
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.name = "world";
  o.timeout_s = 2.0;
  tc_comm_t *c;
  if (tc_comm_create("cpu", "cpu", &o, &c) != TC_OK) return fail("create");
  int rank = tc_comm_rank(c), size = tc_comm_size(c), last = size - 1;
  float x[16];
  for (int i = 0; i < 16; i++) x[i] = (float)rank;
  float *g = calloc((size_t)size * 16, sizeof *g);
  if (tc_all_reduce(c, x, 16, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL) != TC_OK ||
      tc_broadcast(c, x, 16, TC_FLOAT32, 0, NULL, NULL) != TC_OK ||
      tc_all_gather_single(c, g, x, 16, TC_FLOAT32, NULL, NULL) != TC_OK)
    return fail("the first three collectives");
  tc_store_t *s = tc_comm_get_options(c, &o) == TC_OK ? o.store : NULL;
  if (rank == last) {
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%d", (int)getpid());
    if (tc_store_set(s, "fr_sigstop/pid", pid, (size_t)n) != TC_OK) return fail("set pid");
    raise(SIGSTOP);
    /* continued by rank 0 once the others have failed and dumped; #4 may
     * still complete from what they left in shared memory, a later one
     * cannot: the peers are gone, and the lost peer dumps this rank's trace */
    int rc = TC_OK;
    for (int i = 0; i < 3 && rc == TC_OK; i++)
      rc = tc_all_reduce(c, x, 16, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL);
    printf("rank %d after SIGCONT: %s\n", rank, rc == TC_OK ? "ok" : tc_last_error());
    return rc == TC_ERR_REMOTE || rc == TC_ERR_TIMEOUT ? 0 : 1;
  }
  int rc = tc_all_reduce(c, x, 16, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL);
  printf("rank %d error: %s\n", rank, rc == TC_OK ? "(none)" : tc_last_error());
  fflush(stdout);
  if (rc != TC_ERR_TIMEOUT) return 1;
  /* every punctual rank has failed (and dumped) before any leaves: one
   * leaving earlier would turn a slower rank's timeout into a lost peer */
  int64_t v = 0;
  if (tc_store_add(s, "fr_sigstop/done", 1, &v) != TC_OK) return fail("add done");
  if (v == size - 1 && tc_store_set(s, "fr_sigstop/all_done", "1", 1) != TC_OK)
    return fail("set all_done");
  const char *k = "fr_sigstop/all_done";
  if (tc_store_wait(s, &k, 1, 30) != TC_OK) return fail("wait all_done");
  if (rank == 0) { /* then the stopped rank goes on */
    void *pid;
    size_t len;
    if (tc_store_get(s, "fr_sigstop/pid", &pid, &len, 10) != TC_OK) return fail("get pid");
    char buf[32];
    snprintf(buf, sizeof buf, "%.*s", (int)len, (const char *)pid);
    tc_free(pid);
    kill((pid_t)atoi(buf), SIGCONT);
  }
  tc_comm_destroy(c);
  free(g);
  return 0;
}

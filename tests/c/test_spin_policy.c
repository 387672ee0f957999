/* test_spin_policy.c -- the busy-wait policy counts the cores of the union
 * of the local ranks' CPU masks (issue 16): ranks bound to a core each (by
 * tcrun, mpirun or srun) spin, although each one's own mask holds a single
 * core; ranks bound to one shared core poll with sched_yield (their sockets
 * too, over TCP). Checked in the init summary each rank logs
 * (TORCHCOMMS_LOG=debug), over shared memory and over TCP. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/internal.h"
#include "runner.h"

typedef struct {
  char dir[64];
  int tcp;      /* TORCHCOMMS_CPU_TRANSPORT=tcp */
  int cpu[2];   /* the core each rank binds itself to */
} job_t;

static void rank_bound(tc_ctx_t *ctx) {
  job_t *j = ctx->arg;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(j->cpu[ctx->rank], &one);
  TC_ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  char path[128];
  snprintf(path, sizeof path, "%s/r%d.log", j->dir, ctx->rank);
  setenv("TORCHCOMMS_LOG_FILE", path, 1);
  setenv("TORCHCOMMS_LOG", "debug", 1);
  unsetenv("TORCHCOMMS_CPU_SPIN_US");
  unsetenv("TORCHCOMMS_CPU_YIELD_US");
  if (j->tcp) setenv("TORCHCOMMS_CPU_TRANSPORT", "tcp", 1);
  else unsetenv("TORCHCOMMS_CPU_TRANSPORT");
  char err[512] = "";
  if (tc__settings_reload(err, sizeof err) != TC_OK) tc_test_fail(__FILE__, __LINE__, "%s", err);
  tc_comm_t *c = tc_ctx_comm(ctx, "spinpol", NULL);
  int x = ctx->rank + 1;
  TC_ASSERT_OK(tc_all_reduce(c, &x, 1, TC_INT32, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT_EQ(x, 3);
  TC_ASSERT_OK(tc_comm_finalize(c));
  tc_comm_destroy(c);
}

/* Runs 2 ranks bound to cpu0 and cpu1 and checks each one's summary. */
static void run_case(int tcp, int cpu0, int cpu1) {
  job_t j = {.tcp = tcp, .cpu = {cpu0, cpu1}};
  snprintf(j.dir, sizeof j.dir, "/tmp/tc_spinpol.XXXXXX");
  TC_ASSERT(mkdtemp(j.dir) != NULL);
  tc_spawn(2, rank_bound, &j, 60);
  const int cores = cpu0 == cpu1 ? 1 : 2;
  for (int r = 0; r < 2; r++) {
    char path[128], want[256];
    static char text[1 << 16];
    snprintf(path, sizeof path, "%s/r%d.log", j.dir, r);
    tc_read_text(path, text, sizeof text);
    unlink(path);
    snprintf(want, sizeof want,
             "cpu backend 'spinpol' rank %d: 2 ranks on this machine, %d cores: busy-poll %s us\n",
             r, cores, cores == 2 ? "200" : "0");
    TC_ASSERT_CONTAINS(text, want);
    if (!tcp) TC_ASSERT_CONTAINS(text, cores == 2 ? "), spin 200 us, " : "), yield-poll 200 us, ");
    else /* the sockets: the same policy (tcp_connect.c) */
      TC_ASSERT_CONTAINS(text, cores == 2 ? "; busy-poll 200 us, poll and yield 0 us, "
                                          : "; busy-poll 0 us, poll and yield 200 us, ");
  }
  rmdir(j.dir);
}

static int own_cpus(int *cpus, int max) {
  cpu_set_t set;
  TC_ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  int n = 0;
  for (int k = 0; k < CPU_SETSIZE && n < max; k++)
    if (CPU_ISSET(k, &set)) cpus[n++] = k;
  return n;
}

TC_TEST(spin_policy_ranks_bound_to_own_cores_spin) {
  int cpus[2];
  if (own_cpus(cpus, 2) < 2) return; /* one core: nothing to bind apart */
  run_case(0, cpus[0], cpus[1]);
  run_case(1, cpus[0], cpus[1]);
}

TC_TEST(spin_policy_ranks_bound_to_one_core_yield) {
  int cpus[2];
  TC_ASSERT(own_cpus(cpus, 2) >= 1);
  run_case(0, cpus[0], cpus[0]);
  run_case(1, cpus[0], cpus[0]);
}

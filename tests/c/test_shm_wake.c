/* test_shm_wake.c -- posts without a fence (transport/shm.c, shm_post_flag;
 * every rank of a small broadcast posts so): a rank that sleeps on a futex
 * is still woken by every post, with
 * TORCHCOMMS_SHM_MEMBARRIER on (the default: membarrier where the kernel
 * has MEMBARRIER_CMD_GLOBAL_EXPEDITED) and off (a fence on every post).
 *
 * The waits sleep at once (TORCHCOMMS_CPU_SPIN_US=0), so every post that
 * finds its peer not yet there must wake it: sync flags (broadcast from
 * alternating roots, all_reduce) and the message rings' heads and tails
 * (send/recv). Values are checked exactly. The transport's own line
 * (TORCHCOMMS_LOG=debug) says which form of post each rank uses.
 *
 * A lost wake-up would not fail a result: the sleeper looks again after
 * its nap (at most 5 ms) and goes on. The order a missed handshake needs (a
 * post's store still in its core's buffer while the sleeper looks twice) is
 * not one a test can provoke; the reasoning is in the comment above shm_post_flag.
 * What the job's time shows is gross loss: 6000 sleeping waits that each
 * ran to the end of their nap would take 30 s, where woken ones take well
 * under a second; the bound below is 10 s. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <linux/membarrier.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"
#include "runner.h"

enum { ROUNDS = 2000 };

typedef struct {
  char dir[64];
  int membarrier; /* TORCHCOMMS_SHM_MEMBARRIER */
} job_t;

static double mono(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void rank_fn(tc_ctx_t *ctx) {
  job_t *j = ctx->arg;
  char path[128];
  snprintf(path, sizeof path, "%s/r%d.log", j->dir, ctx->rank);
  setenv("TORCHCOMMS_LOG_FILE", path, 1);
  setenv("TORCHCOMMS_LOG", "debug", 1);
  setenv("TORCHCOMMS_LOG_SUBSYS", "init", 1);
  setenv("TORCHCOMMS_CPU_SPIN_US", "0", 1);
  setenv("TORCHCOMMS_CPU_TRANSPORT", "shm", 1);
  setenv("TORCHCOMMS_SHM_MEMBARRIER", j->membarrier ? "1" : "0", 1);
  char err[512] = "";
  if (tc__settings_reload(err, sizeof err) != TC_OK) tc_test_fail(__FILE__, __LINE__, "%s", err);
  tc_comm_t *c = tc_ctx_comm(ctx, "wake", NULL);
  const int me = ctx->rank, peer = 1 - me;
  const double t0 = mono();
  for (int i = 0; i < ROUNDS; i++) {
    const int root = i & 1;
    int64_t b = me == root ? (int64_t)i * 10 + root : -1;
    TC_ASSERT_OK(tc_broadcast(c, &b, 1, TC_INT64, root, NULL, NULL));
    TC_ASSERT_EQ(b, (int64_t)i * 10 + root);
    int32_t x = (int32_t)(i + me * 1000);
    TC_ASSERT_OK(tc_all_reduce(c, &x, 1, TC_INT32, TC_OP(TC_SUM), NULL, NULL));
    TC_ASSERT_EQ(x, 2 * i + 1000);
    int32_t v = (int32_t)(i * 3 + me);
    if (me == 0) {
      TC_ASSERT_OK(tc_send(c, &v, 1, TC_INT32, peer, NULL, NULL));
      TC_ASSERT_OK(tc_recv(c, &v, 1, TC_INT32, peer, NULL, NULL));
      TC_ASSERT_EQ(v, i * 3 + 1);
    } else {
      TC_ASSERT_OK(tc_recv(c, &v, 1, TC_INT32, peer, NULL, NULL));
      TC_ASSERT_EQ(v, i * 3);
      v = i * 3 + 1;
      TC_ASSERT_OK(tc_send(c, &v, 1, TC_INT32, peer, NULL, NULL));
    }
  }
  const double took = mono() - t0;
  if (took > 10.0)
    tc_test_fail(__FILE__, __LINE__, "%d rounds of sleeping waits took %.1f s (lost wake-ups?)",
                 ROUNDS, took);
  TC_ASSERT_OK(tc_comm_finalize(c));
  tc_comm_destroy(c);
}

static int kernel_has_membarrier(void) {
  long q = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  return q >= 0 && (q & MEMBARRIER_CMD_GLOBAL_EXPEDITED) &&
         (q & MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED);
}

static void run_case(int membarrier) {
  job_t j = {.membarrier = membarrier};
  snprintf(j.dir, sizeof j.dir, "/tmp/tc_shmwake.XXXXXX");
  TC_ASSERT(mkdtemp(j.dir) != NULL);
  tc_spawn(2, rank_fn, &j, 90);
  const char *want = membarrier && kernel_has_membarrier() ? "posts with a fence, a small broadcast's without (membarrier)"
                                                           : "posts with a fence";
  for (int r = 0; r < 2; r++) {
    char path[128];
    static char text[1 << 16];
    snprintf(path, sizeof path, "%s/r%d.log", j.dir, r);
    tc_read_text(path, text, sizeof text);
    unlink(path);
    TC_ASSERT_CONTAINS(text, want);
  }
  rmdir(j.dir);
}

TC_TEST(shm_wake_sleeping_waiters_membarrier_posts) { run_case(1); }

TC_TEST(shm_wake_sleeping_waiters_fenced_posts) { run_case(0); }

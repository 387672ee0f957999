/* test_restart.c -- store keys across restarts and reused stores: keys are
 * scoped by job id and restart count, deleted once creation completed, and
 * keys left by an earlier job whose creation died make creation fail fast
 * with a message that says so (src/core/comm_keys.c). */
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "runner.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static tc_comm_t *make_comm(tc_ctx_t *ctx, const char *name, double timeout_s, int *rc) {
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.name = name;
  o.rank = ctx->rank;
  o.world_size = ctx->size;
  o.timeout_s = timeout_s;
  o.store = tc_ctx_store(ctx);
  tc_comm_t *c = NULL;
  *rc = tc_comm_create("cpu", "cpu", &o, &c);
  tc_store_release(o.store);
  return c;
}

/* all_reduce of rank+1 over every rank: n(n+1)/2 everywhere. */
static void check_sum(tc_comm_t *c, int rank, int size) {
  float x[7];
  for (int i = 0; i < 7; i++) x[i] = (float)(rank + 1) * (float)(i + 1);
  TC_ASSERT_OK(tc_all_reduce(c, x, 7, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL));
  for (int i = 0; i < 7; i++)
    TC_ASSERT_EQ((long long)x[i], (long long)(size * (size + 1) / 2 * (i + 1)));
}

/* ---- nothing of a completed creation stays in the store ---- */

static void keys_rank(tc_ctx_t *ctx) {
  setenv("TORCHCOMMS_JOB_ID", "keys-test", 1);
  unsetenv("TORCHELASTIC_RESTART_COUNT");
  int rc;
  tc_store_t *s = tc_ctx_store(ctx);
  if (ctx->rank == ctx->size - 1) {
    /* while the others wait for this rank, their keys are there, under the
     * scoped prefix */
    void *v = NULL;
    size_t len = 0;
    TC_ASSERT_OK(tc_store_get(s, "tc/keys-test/0/kd/0/cpu/addr/0", &v, &len, 20));
    tc_free(v);
  }
  tc_comm_t *c = make_comm(ctx, "kd", 30, &rc);
  TC_ASSERT_OK(rc);
  TC_ASSERT_OK(tc_barrier(c, NULL, NULL)); /* every rank deleted its keys before it */
  char addr0[128], tok[128], arr[128];
  snprintf(addr0, sizeof addr0, "tc/keys-test/0/kd/0/cpu/addr/0");
  snprintf(tok, sizeof tok, "tc/keys-test/0/kd/0/cpu/token");
  snprintf(arr, sizeof arr, "tc/keys-test/0/kd/0/arrivals");
  /* a lazy TCP mesh keeps each rank's address until the rank closes the
   * communicator (peers read it when they first need the rank); shared
   * memory connects every pair at creation and drops it then */
  const char *tp = getenv("TORCHCOMMS_CPU_TRANSPORT"), *eager = getenv("TORCHCOMMS_CPU_EAGER");
  int lazy_tcp = tp && !strcmp(tp, "tcp") && !(eager && !strcmp(eager, "1"));
  const char *keys[] = {tok, arr, addr0};
  for (int i = 0; i < 3; i++) {
    int ready = -1;
    TC_ASSERT_OK(tc_store_check(s, &keys[i], 1, &ready));
    if (i == 2 && lazy_tcp) {
      if (!ready) tc_test_fail(__FILE__, __LINE__, "key '%s' is gone too early", keys[i]);
    } else if (ready) {
      tc_test_fail(__FILE__, __LINE__, "key '%s' is still in the store", keys[i]);
    }
  }
  /* a second communicator of the same name: its own keys, same result */
  tc_comm_t *c2 = make_comm(ctx, "kd", 30, &rc);
  TC_ASSERT_OK(rc);
  check_sum(c2, ctx->rank, ctx->size);
  TC_ASSERT_OK(tc_comm_finalize(c2));
  tc_comm_destroy(c2);
  TC_ASSERT_OK(tc_comm_finalize(c));
  tc_comm_destroy(c);
  /* once every rank closed it, nothing of it is left */
  int64_t closed = 0;
  TC_ASSERT_OK(tc_store_add(s, "kd_closed", 1, &closed));
  const char *all_closed = "kd_all_closed";
  if (closed == ctx->size) TC_ASSERT_OK(tc_store_set(s, all_closed, "1", 1));
  TC_ASSERT_OK(tc_store_wait(s, &all_closed, 1, 30));
  int ready = -1;
  TC_ASSERT_OK(tc_store_check(s, (const char *const *)&keys[2], 1, &ready));
  if (ready) tc_test_fail(__FILE__, __LINE__, "key '%s' is still in the store", keys[2]);
  tc_store_release(s);
}

TC_TEST(restart_keys_deleted_after_creation) { tc_spawn(3, keys_rank, NULL, 60); }

/* ---- two jobs one after the other on one store ---- */

/* One "job" is a fresh process per rank (so the per-process name counter
 * starts again at 0, exactly as in a new job or a restarted attempt). */
static void one_job(tc_ctx_t *ctx, int finalize, int exit_code) {
  pid_t pid = fork();
  TC_ASSERT(pid >= 0);
  if (pid == 0) {
    int rc;
    tc_comm_t *c = make_comm(ctx, "main", 20, &rc);
    if (rc != TC_OK) {
      fprintf(stderr, "rank %d: %s\n", ctx->rank, tc_last_error());
      _exit(10);
    }
    check_sum(c, ctx->rank, ctx->size);
    if (finalize && tc_comm_finalize(c) != TC_OK) _exit(11);
    _exit(exit_code); /* without finalize: like a job that crashed after creation */
  }
  int st = 0;
  TC_ASSERT_EQ(waitpid(pid, &st, 0), pid);
  TC_ASSERT(WIFEXITED(st));
  TC_ASSERT_EQ(WEXITSTATUS(st), exit_code);
}

static void jobs_rank(tc_ctx_t *ctx) {
  setenv("TORCHCOMMS_JOB_ID", "same-job-id", 1);
  unsetenv("TORCHELASTIC_RESTART_COUNT");
  double t0 = now_s();
  one_job(ctx, 0, 3); /* crashes after creating and using it */
  one_job(ctx, 0, 3); /* the same again on the same store */
  one_job(ctx, 1, 0); /* and one that finishes */
  TC_ASSERT(now_s() - t0 < 15);
}

TC_TEST(restart_jobs_one_after_another_on_one_store) { tc_spawn(2, jobs_rank, NULL, 90); }

/* ---- keys left by a creation that died: fail fast, say why ---- */

static void stale_rank(tc_ctx_t *ctx) {
  setenv("TORCHCOMMS_JOB_ID", "stale-test", 1);
  unsetenv("TORCHELASTIC_RESTART_COUNT");
  tc_store_t *s = tc_ctx_store(ctx);
  if (ctx->rank == 0) {
    /* what a 2-rank creation that died half-way leaves: both arrived, rank
     * 0 published a token and an address that nobody listens on */
    int64_t v;
    TC_ASSERT_OK(tc_store_add(s, "tc/stale-test/0/st/0/arrivals", 2, &v));
    TC_ASSERT_OK(tc_store_set(s, "tc/stale-test/0/st/0/cpu/token", "0123456789abcdef", 16));
    TC_ASSERT_OK(tc_store_set(s, "tc/stale-test/0/st/0/cpu/addr/0", "127.0.0.1:9", 11));
    TC_ASSERT_OK(tc_store_set(s, "planted", "1", 1));
  } else {
    void *v;
    size_t len;
    TC_ASSERT_OK(tc_store_get(s, "planted", &v, &len, 30));
    tc_free(v);
  }
  double t0 = now_s();
  int rc;
  tc_comm_t *c = make_comm(ctx, "st", 60, &rc);
  double took = now_s() - t0;
  fprintf(stderr, "rank %d: %s (%.3f s)\n", ctx->rank, tc_last_error(), took);
  TC_ASSERT(c == NULL);
  TC_ASSERT_EQ(rc, TC_ERR_INVALID_USAGE);
  TC_ASSERT_CONTAINS(tc_last_error(), "tc_comm_create on 'st'");
  TC_ASSERT_CONTAINS(tc_last_error(), "left by an earlier job or attempt on the same store");
  TC_ASSERT_CONTAINS(tc_last_error(), "TORCHCOMMS_JOB_ID");
  TC_ASSERT(took < 5); /* not the 60 s timeout */
  /* the same job under a new restart count does not see them at all */
  setenv("TORCHELASTIC_RESTART_COUNT", "1", 1);
  c = make_comm(ctx, "st", 20, &rc);
  TC_ASSERT_OK(rc);
  check_sum(c, ctx->rank, ctx->size);
  TC_ASSERT_OK(tc_comm_finalize(c));
  tc_comm_destroy(c);
  tc_store_release(s);
}

TC_TEST(restart_stale_keys_fail_fast) { tc_spawn(2, stale_rank, NULL, 60); }

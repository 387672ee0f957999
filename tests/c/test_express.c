/* test_express.c -- the express path (src/core/ops.c, op_express; the cpu
 * backend's cpu_express): a synchronous collective small enough for the
 * shared-memory slots runs on the caller's thread without a work object.
 *
 *  - every small synchronous collective takes it (counted), with exact
 *    values and the flight recorder's entries as the work path writes
 *    them (the last one's completion included, which its end keeps aside
 *    for the next taker of the recorder's lock); asynchronous and large
 *    ones do not;
 *  - synchronous send, recv and batch take it over shared memory, numbered
 *    and recorded as point-to-point operations, and a receive's timeout
 *    reads as the work path's;
 *  - it steps aside for queued asynchronous work (issue order), for hooks,
 *    and when TORCHCOMMS_EXPRESS=0;
 *  - its failures (mismatch, timeout) read exactly as the work path's:
 *    the same message, hang report, recorder state and last error;
 *  - tc_comm_abort from another thread ends a wait in it at once;
 *  - one that waited for its peer records the end it read (a prompt one
 *    may take its begin for its end: end_prompt).
 * Ranks coordinate through an anonymous shared mapping (conditions with
 * deadlines, never sleeps standing in for synchronisation). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll_util.h"
#include "core/core.h"

typedef struct {
  _Atomic int done;
  char msg[2][2][1024];   /* [express][rank]: the failure's text */
  char fr[2][2][256];     /* [express][rank]: the failed entry's state */
} shared_t;

/* TORCHCOMMS_EXPRESS for the communicators created from now on, over
 * shared memory (the cpu backend's express path is the slots': over TCP
 * every operation takes the work path, which the rest of the suite runs). */
static void express_setting(int on) {
  setenv("TORCHCOMMS_EXPRESS", on ? "1" : "0", 1);
  setenv("TORCHCOMMS_CPU_TRANSPORT", "shm", 1);
  char err[512] = "";
  if (tc__settings_reload(err, sizeof err) != TC_OK) tc_test_fail(__FILE__, __LINE__, "%s", err);
}

/* Where field's value begins in the entry whose collective_seq_id is seq,
 * in the dump j (times compared within one dump: each dump converts the
 * monotonic times to the wall clock at its own moment). */
static const char *fr_field_at(const char *j, const char *key, const char *field) {
  const char *e = strstr(j, key);
  TC_ASSERT(e != NULL);
  const char *f = strstr(e, field);
  TC_ASSERT(f != NULL);
  return f + strlen(field);
}
static const char *fr_field(const char *j, int seq, const char *field) {
  char key[64];
  snprintf(key, sizeof key, "\"collective_seq_id\": %d,", seq);
  return fr_field_at(j, key, field);
}

/* The "state" of the entry that key (its sequence numbers) begins, from a
 * dump. */
static void fr_state_at(tc_comm_t *c, const char *key, char *out, size_t len) {
  char *j;
  TC_ASSERT_OK(tc_fr_dump_json(c, 1, &j));
  const char *s = fr_field_at(j, key, "\"state\": \"");
  size_t n = strcspn(s, "\"");
  snprintf(out, len, "%.*s", (int)(n < len ? n : len - 1), s);
  tc_free(j);
}

/* The "state" of the entry whose collective_seq_id is seq, from a dump. */
static void fr_state(tc_comm_t *c, int seq, char *out, size_t len) {
  char key[64];
  snprintf(key, sizeof key, "\"collective_seq_id\": %d,", seq);
  fr_state_at(c, key, out, len);
}

/* ---- small synchronous collectives take it; values and records exact ---- */

static void runs_rank(tc_ctx_t *ctx) {
  express_setting(1);
  tc_comm_t *c = tc_ctx_comm(ctx, "xp", NULL);
  const int me = ctx->rank, n = ctx->size;
  enum { ROUNDS = 50 };
  uint64_t ops = 0;
  for (int i = 0; i < ROUNDS; i++) {
    int32_t x[3] = {i, me, 7};
    TC_ASSERT_OK(tc_all_reduce(c, x, 3, TC_INT32, TC_OP(TC_SUM), NULL, NULL));
    TC_ASSERT_EQ(x[0], i * n);
    TC_ASSERT_EQ(x[1], n * (n - 1) / 2);
    TC_ASSERT_EQ(x[2], 7 * n);
    const int root = i % n;
    int64_t b = me == root ? 1000 * i + root : -1;
    TC_ASSERT_OK(tc_broadcast(c, &b, 1, TC_INT64, root, NULL, NULL));
    TC_ASSERT_EQ(b, 1000 * i + root);
    int32_t mine = 10 * i + me, all[8];
    TC_ASSERT_OK(tc_all_gather_single(c, all, &mine, 1, TC_INT32, NULL, NULL));
    for (int r = 0; r < n; r++) TC_ASSERT_EQ(all[r], 10 * i + r);
    int32_t in[8], out = -1;
    for (int r = 0; r < n; r++) in[r] = r + me + i;
    TC_ASSERT_OK(tc_reduce_scatter_single(c, &out, in, 1, TC_INT32, TC_OP(TC_SUM), NULL, NULL));
    TC_ASSERT_EQ(out, n * (me + i) + n * (n - 1) / 2);
    int32_t sa[8], ra[8];
    for (int r = 0; r < n; r++) sa[r] = 100 * me + r;
    TC_ASSERT_OK(tc_all_to_all_single(c, ra, sa, 1, TC_INT32, NULL, NULL));
    for (int r = 0; r < n; r++) TC_ASSERT_EQ(ra[r], 100 * r + me);
    TC_ASSERT_OK(tc_barrier(c, NULL, NULL));
    ops += 6;
  }
  TC_ASSERT_EQ(tc__comm_express_ops(c), ops);
  /* the last one's completion, kept aside without the recorder's lock
   * (tc__fr_end_express), is in the dump that follows it at once */
  {
    char *d;
    TC_ASSERT_OK(tc_fr_dump_json(c, 1, &d));
    TC_ASSERT_CONTAINS(d, "\"last_started_collective\": 300, \"last_completed_collective\": 300");
    TC_ASSERT(!strstr(d, "\"state\": \"started\""));
    tc_free(d);
    char st[32];
    fr_state(c, 300, st, sizeof st);
    TC_ASSERT_STR_EQ(st, "completed");
  }
  /* asynchronous, and larger than the slots: the work path */
  tc_work_t *w;
  int32_t y = me;
  TC_ASSERT_OK(tc_all_reduce(c, &y, 1, TC_INT32, TC_OP(TC_SUM), NULL, &w));
  TC_ASSERT_OK(tc_work_wait(w));
  TC_ASSERT_OK(tc_work_release(w));
  TC_ASSERT_EQ(y, n * (n - 1) / 2);
  const size_t big = 1 << 20;
  float *f = tc_xmalloc(big * sizeof *f);
  for (size_t k = 0; k < big; k++) f[k] = (float)(me + 1);
  TC_ASSERT_OK(tc_all_reduce(c, f, big, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT_EQ(f[0], (float)(n * (n + 1) / 2));
  TC_ASSERT_EQ(f[big - 1], (float)(n * (n + 1) / 2));
  free(f);
  TC_ASSERT_EQ(tc__comm_express_ops(c), ops);
  /* the recorder: every express entry completed, numbered as the others */
  char *j;
  TC_ASSERT_OK(tc_fr_dump_json(c, 1, &j));
  TC_ASSERT_CONTAINS(j, "\"collective_seq_id\": 1, \"p2p_seq_id\": 0, \"op_id\": 1, "
                        "\"profiling_name\": \"gloo:all_reduce\"");
  TC_ASSERT_CONTAINS(j, "\"input_sizes\": [[3]], \"input_dtypes\": [\"Int\"], "
                        "\"output_sizes\": [[3]], \"output_dtypes\": [\"Int\"], "
                        "\"state\": \"completed\"");
  TC_ASSERT_CONTAINS(j, "\"collective_seq_id\": 2, \"p2p_seq_id\": 0, \"op_id\": 2, "
                        "\"profiling_name\": \"gloo:broadcast\"");
  TC_ASSERT_CONTAINS(j, "\"last_completed_collective\": 302");
  TC_ASSERT(!strstr(j, "\"state\": \"scheduled\""));
  TC_ASSERT(!strstr(j, "\"state\": \"started\""));
  tc_free(j);
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(express_small_sync_collectives) { tc_spawn(2, runs_rank, NULL, 60); }
TC_TEST(express_small_sync_collectives_w3) { tc_spawn(3, runs_rank, NULL, 60); }

/* ---- synchronous send, recv and batch take it too ---- */

/* The "state" of the point-to-point entry whose p2p_seq_id is seq. */
static void fr_p2p_state(tc_comm_t *c, int seq, char *out, size_t len) {
  char key[64];
  snprintf(key, sizeof key, "\"collective_seq_id\": 0, \"p2p_seq_id\": %d,", seq);
  fr_state_at(c, key, out, len);
}

/* Every rank sends to the next and receives from the one before, as
 * separate calls (small: the send does not wait for its receive) and as a
 * batch; exact values; the point-to-point numbers and records are the work
 * path's, and asynchronous ones still take the work path. */
static void p2p_rank(tc_ctx_t *ctx) {
  express_setting(1);
  tc_comm_t *c = tc_ctx_comm(ctx, "xp2p", NULL);
  const int me = ctx->rank, n = ctx->size, to = (me + 1) % n, from = (me + n - 1) % n;
  enum { ROUNDS = 40 };
  uint64_t ops = 0;
  for (int i = 0; i < ROUNDS; i++) {
    int64_t out[5] = {i, me, 3, 4, 5}, in[5] = {-1, -1, -1, -1, -1};
    TC_ASSERT_OK(tc_send(c, out, 5, TC_INT64, to, NULL, NULL));
    TC_ASSERT_OK(tc_recv(c, in, 5, TC_INT64, from, NULL, NULL));
    TC_ASSERT_EQ(in[0], i);
    TC_ASSERT_EQ(in[1], from);
    TC_ASSERT_EQ(in[4], 5);
    float fo[16], fi[16];
    for (int k = 0; k < 16; k++) fo[k] = (float)(100 * me + k + i), fi[k] = -1.0f;
    tc_batch_t *b;
    TC_ASSERT_OK(tc_batch_create(c, &b));
    TC_ASSERT_OK(tc_batch_recv(b, fi, 16, TC_FLOAT32, from));
    TC_ASSERT_OK(tc_batch_send(b, fo, 16, TC_FLOAT32, to));
    TC_ASSERT_OK(tc_batch_issue(b, NULL, NULL));
    TC_ASSERT_OK(tc_batch_free(b));
    for (int k = 0; k < 16; k++) TC_ASSERT_EQ(fi[k], (float)(100 * from + k + i));
    ops += 3;
  }
  TC_ASSERT_EQ(tc__comm_express_ops(c), ops);
  /* a collective between them keeps its own numbering */
  int32_t x = me;
  TC_ASSERT_OK(tc_all_reduce(c, &x, 1, TC_INT32, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT_EQ(x, n * (n - 1) / 2);
  /* asynchronous: the work path, numbered after the express ones */
  tc_work_t *ws, *wr;
  int64_t v = 7 + me, got = -1;
  TC_ASSERT_OK(tc_send(c, &v, 1, TC_INT64, to, NULL, &ws));
  TC_ASSERT_OK(tc_recv(c, &got, 1, TC_INT64, from, NULL, &wr));
  TC_ASSERT_OK(tc_work_wait(ws));
  TC_ASSERT_OK(tc_work_wait(wr));
  TC_ASSERT_OK(tc_work_release(ws));
  TC_ASSERT_OK(tc_work_release(wr));
  TC_ASSERT_EQ(got, 7 + from);
  TC_ASSERT_EQ(tc__comm_express_ops(c), ops + 1);
  char *j;
  TC_ASSERT_OK(tc_fr_dump_json(c, 1, &j));
  TC_ASSERT_CONTAINS(j, "\"collective_seq_id\": 0, \"p2p_seq_id\": 1, \"op_id\": 1, "
                        "\"profiling_name\": \"gloo:send ");
  TC_ASSERT_CONTAINS(j, "\"collective_seq_id\": 0, \"p2p_seq_id\": 2, \"op_id\": 2, "
                        "\"profiling_name\": \"gloo:recv ");
  TC_ASSERT_CONTAINS(j, "\"collective_seq_id\": 1, \"p2p_seq_id\": 0, \"op_id\": 121, "
                        "\"profiling_name\": \"gloo:all_reduce\"");
  TC_ASSERT_CONTAINS(j, "\"collective_seq_id\": 0, \"p2p_seq_id\": 121, \"op_id\": 122, "
                        "\"profiling_name\": \"gloo:send ");
  TC_ASSERT_CONTAINS(j, "\"collective_seq_id\": 0, \"p2p_seq_id\": 122, \"op_id\": 123, "
                        "\"profiling_name\": \"gloo:recv ");
  TC_ASSERT(!strstr(j, "\"state\": \"scheduled\""));
  TC_ASSERT(!strstr(j, "\"state\": \"started\""));
  tc_free(j);
  char st[32];
  fr_p2p_state(c, 120, st, sizeof st); /* the last batch */
  TC_ASSERT_STR_EQ(st, "completed");
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(express_sync_p2p) { tc_spawn(2, p2p_rank, NULL, 60); }
TC_TEST(express_sync_p2p_w3) { tc_spawn(3, p2p_rank, NULL, 60); }

/* A receive whose sender never sends times out with the same text, hang
 * report and recorder state with the express path on and off. */
static void p2p_timeout_rank(tc_ctx_t *ctx) {
  shared_t *sh = ctx->arg;
  for (int on = 1; on >= 0; on--) {
    express_setting(on);
    tc_comm_t *c = tc_ctx_comm(ctx, "xp2pt", NULL);
    int32_t x = 1;
    TC_ASSERT_OK(tc_all_reduce(c, &x, 1, TC_INT32, TC_OP(TC_SUM), NULL, NULL));
    if (ctx->rank == 0) {
      tc_op_options_t o = TC_OP_OPTIONS_INIT;
      o.timeout_s = 0.3;
      int64_t v = -1;
      TC_ASSERT_ERR(tc_recv(c, &v, 1, TC_INT64, 1, &o, NULL), TC_ERR_TIMEOUT,
                    "torchcomms: recv on 'xp2pt' (rank 0 of 2): timed out after 0.3 s");
      snprintf(sh->msg[on][0], sizeof sh->msg[on][0], "%s", tc_last_error());
      fr_p2p_state(c, 1, sh->fr[on][0], sizeof sh->fr[on][0]);
      TC_ASSERT_EQ(tc__comm_express_ops(c), on ? 2u : 0u);
      TC_ASSERT_ERR(tc_send(c, &v, 1, TC_INT64, 1, NULL, NULL), TC_ERR_TIMEOUT,
                    "an earlier operation failed");
      sh->done = 2 - on; /* 1, then 2 */
    } else {
      tc_wait_flag(&sh->done, 2 - on, 30); /* never sends */
    }
    TC_ASSERT_OK(tc_comm_abort(c));
    TC_ASSERT_OK(tc_comm_destroy(c));
  }
  express_setting(1);
}

TC_TEST(express_p2p_timeout_reads_as_the_work_path) {
  shared_t *sh = tc_shared_zalloc(sizeof *sh);
  tc_spawn(2, p2p_timeout_rank, sh, 60);
  TC_ASSERT_CONTAINS(sh->msg[1][0], "recv on 'xp2pt' (rank 0 of 2): timed out after 0.3 s");
  TC_ASSERT_STR_EQ(sh->msg[1][0], sh->msg[0][0]);
  TC_ASSERT_STR_EQ(sh->fr[1][0], "timed_out");
  TC_ASSERT_STR_EQ(sh->fr[0][0], "timed_out");
}

/* ---- behind queued asynchronous work; off with hooks or the setting ---- */

static int pre_hook(tc_hook_kind_t kind, const tc_op_info_t *info, void *arg) {
  (void)kind;
  (void)info;
  (*(int *)arg)++;
  return 0;
}

static void steps_aside_rank(tc_ctx_t *ctx) {
  express_setting(1);
  tc_comm_t *c = tc_ctx_comm(ctx, "xq", NULL);
  const int me = ctx->rank;
  const size_t big = 1 << 20;
  float *f = tc_xmalloc(big * sizeof *f);
  for (int i = 0; i < 20; i++) {
    for (size_t k = 0; k < big; k++) f[k] = (float)(me + i);
    tc_work_t *w;
    TC_ASSERT_OK(tc_all_reduce(c, f, big, TC_FLOAT32, TC_OP(TC_SUM), NULL, &w));
    /* issued while that one may still run: after it, in order */
    int32_t x = me + i;
    TC_ASSERT_OK(tc_all_reduce(c, &x, 1, TC_INT32, TC_OP(TC_MAX), NULL, NULL));
    TC_ASSERT_EQ(x, 1 + i);
    TC_ASSERT_OK(tc_work_wait(w));
    TC_ASSERT_OK(tc_work_release(w));
    TC_ASSERT_EQ(f[0], (float)(1 + 2 * i));
    TC_ASSERT_EQ(f[big - 1], (float)(1 + 2 * i));
  }
  free(f);
  /* hooks see every operation: the work path */
  uint64_t before = tc__comm_express_ops(c);
  int calls = 0;
  uint64_t h;
  TC_ASSERT_OK(tc_comm_register_hook(c, TC_HOOK_PRE, pre_hook, &calls, &h));
  for (int i = 0; i < 10; i++) {
    int32_t x = 1;
    TC_ASSERT_OK(tc_all_reduce(c, &x, 1, TC_INT32, TC_OP(TC_SUM), NULL, NULL));
    TC_ASSERT_EQ(x, 2);
  }
  TC_ASSERT_EQ(calls, 10);
  TC_ASSERT_EQ(tc__comm_express_ops(c), before);
  TC_ASSERT_OK(tc_comm_unregister_hook(c, h));
  int32_t x = 1;
  TC_ASSERT_OK(tc_all_reduce(c, &x, 1, TC_INT32, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT_EQ(tc__comm_express_ops(c), before + 1);
  TC_ASSERT_OK(tc_comm_destroy(c));
  /* the setting off: never */
  express_setting(0);
  c = tc_ctx_comm(ctx, "xoff", NULL);
  for (int i = 0; i < 10; i++) {
    int32_t y = me;
    TC_ASSERT_OK(tc_all_reduce(c, &y, 1, TC_INT32, TC_OP(TC_SUM), NULL, NULL));
    TC_ASSERT_EQ(y, 1);
  }
  TC_ASSERT_EQ(tc__comm_express_ops(c), 0);
  TC_ASSERT_OK(tc_comm_destroy(c));
  express_setting(1);
}

TC_TEST(express_steps_aside) { tc_spawn(2, steps_aside_rank, NULL, 60); }

/* ---- failures read as the work path's ---- */

/* A mismatched count (rank 1 reduces 3 elements, rank 0 two), then a
 * timeout (rank 1 never joins the next all_reduce), with the express path
 * on and off; each rank keeps its texts for the parent to compare. */
static void fails_rank(tc_ctx_t *ctx) {
  shared_t *sh = ctx->arg;
  const int me = ctx->rank;
  for (int on = 1; on >= 0; on--) {
    express_setting(on);
    tc_comm_t *c = tc_ctx_comm(ctx, "xfail", NULL);
    int32_t x[3] = {1, 2, 3};
    TC_ASSERT_ERR(tc_all_reduce(c, x, me ? 3 : 2, TC_INT32, TC_OP(TC_SUM), NULL, NULL),
                  TC_ERR_PROTOCOL, "mismatched");
    snprintf(sh->msg[on][me], sizeof sh->msg[on][me], "%s", tc_last_error());
    TC_ASSERT_CONTAINS(tc_comm_last_error(c), "mismatched");
    fr_state(c, 1, sh->fr[on][me], sizeof sh->fr[on][me]);
    TC_ASSERT_EQ(tc__comm_express_ops(c), on ? 1u : 0u);
    TC_ASSERT_OK(tc_comm_abort(c));
    TC_ASSERT_OK(tc_comm_destroy(c));
  }
  express_setting(1);
}

TC_TEST(express_failures_read_as_the_work_path) {
  shared_t *sh = tc_shared_zalloc(sizeof *sh);
  tc_spawn(2, fails_rank, sh, 60);
  for (int r = 0; r < 2; r++) {
    TC_ASSERT_CONTAINS(sh->msg[1][r], "all_reduce on 'xfail' (rank ");
    TC_ASSERT_STR_EQ(sh->msg[1][r], sh->msg[0][r]);
    TC_ASSERT_STR_EQ(sh->fr[1][r], "failed");
    TC_ASSERT_STR_EQ(sh->fr[0][r], "failed");
  }
}

/* A communicator `name` with the express path on, past one all_reduce
 * (both ranks in step). */
static tc_comm_t *comm_in_step(tc_ctx_t *ctx, const char *name) {
  express_setting(1);
  tc_comm_t *c = tc_ctx_comm(ctx, name, NULL);
  int32_t x = 1;
  TC_ASSERT_OK(tc_all_reduce(c, &x, 1, TC_INT32, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT_EQ(x, 2);
  return c;
}

static void timeout_rank(tc_ctx_t *ctx) {
  shared_t *sh = ctx->arg;
  tc_comm_t *c = comm_in_step(ctx, "xtime");
  int32_t x = 1;
  if (ctx->rank == 0) {
    tc_op_options_t o = TC_OP_OPTIONS_INIT;
    o.timeout_s = 0.5;
    double t0 = tc__now();
    TC_ASSERT_ERR(tc_all_reduce(c, &x, 1, TC_INT32, TC_OP(TC_SUM), &o, NULL), TC_ERR_TIMEOUT,
                  "torchcomms: all_reduce on 'xtime' (rank 0 of 2): timed out after 0.5 s");
    double dt = tc__now() - t0;
    TC_ASSERT(dt >= 0.45 && dt < 5);
    TC_ASSERT_CONTAINS(tc_last_error(), "[hang report: all_reduce #2: rank 1 never entered it");
    TC_ASSERT_CONTAINS(tc_comm_last_error(c), "timed out");
    TC_ASSERT_EQ(tc__comm_express_ops(c), 2);
    char st[64];
    fr_state(c, 2, st, sizeof st);
    TC_ASSERT_STR_EQ(st, "timed_out");
    /* broken from then on, as after any failure */
    TC_ASSERT_ERR(tc_all_reduce(c, &x, 1, TC_INT32, TC_OP(TC_SUM), NULL, NULL), TC_ERR_TIMEOUT,
                  "an earlier operation failed");
    sh->done = 1;
  } else {
    tc_wait_flag(&sh->done, 1, 30); /* never joins the second all_reduce */
  }
  TC_ASSERT_OK(tc_comm_abort(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(express_timeout_reported) { tc_spawn(2, timeout_rank, tc_shared_zalloc(sizeof(shared_t)), 60); }

/* ---- an operation that waited records the end it read ---- */

/* The number after `field` in the entry whose collective_seq_id is seq. */
static double fr_number(const char *j, int seq, const char *field) {
  return strtod(fr_field(j, seq, field), NULL);
}

/* A prompt operation takes its begin for its end (end_prompt: no clock
 * read); one that waited for its peer must not: rank 0's all_reduce waits
 * 50 ms for rank 1, and its recorded duration says so. */
static void waited_rank(tc_ctx_t *ctx) {
  shared_t *sh = ctx->arg;
  tc_comm_t *c = comm_in_step(ctx, "xwait");
  int32_t x = 1;
  if (ctx->rank == 0) {
    sh->done = 1;
  } else {
    tc_wait_flag(&sh->done, 1, 30);
    struct timespec ts = {0, 50 * 1000 * 1000}; /* the delay measured, not a synchronisation */
    nanosleep(&ts, NULL);
  }
  TC_ASSERT_OK(tc_all_reduce(c, &x, 1, TC_INT32, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT_EQ(x, 2);
  for (int i = 0; i < 20; i++) {
    x = ctx->rank + i;
    TC_ASSERT_OK(tc_all_reduce(c, &x, 1, TC_INT32, TC_OP(TC_SUM), NULL, NULL));
    TC_ASSERT_EQ(x, 2 * i + 1);
  }
  TC_ASSERT_EQ(tc__comm_express_ops(c), 22);
  char *j;
  TC_ASSERT_OK(tc_fr_dump_json(c, 1, &j));
  if (ctx->rank == 0) {
    double ms = fr_number(j, 2, "\"duration_ms\": ");
    TC_ASSERT(ms >= 40 && ms < 30000);
  }
  for (int s = 1; s <= 22; s++) {
    TC_ASSERT(fr_number(j, s, "\"time_discovered_completed_ns\": ") >=
              fr_number(j, s, "\"time_created_ns\": "));
    TC_ASSERT(fr_number(j, s, "\"duration_ms\": ") >= 0);
  }
  tc_free(j);
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(express_waited_end_read) { tc_spawn(2, waited_rank, tc_shared_zalloc(sizeof(shared_t)), 60); }

/* ---- abort from another thread ends a wait in it ---- */

typedef struct {
  tc_comm_t *c;
  double aborted_at;
} abort_arg_t;

static void *abort_later(void *p) {
  abort_arg_t *a = p;
  /* once the all_reduce is recorded as started (it waits for rank 1) */
  double dl = tc__now() + 20;
  for (;;) {
    char *j = NULL;
    int found = tc_fr_dump_json(a->c, 0, &j) == TC_OK && strstr(j, "\"state\": \"started\"");
    tc_free(j);
    if (found || tc__now() > dl) break;
    struct timespec ts = {0, 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  a->aborted_at = tc__now();
  tc_comm_abort(a->c);
  return NULL;
}

static void abort_rank(tc_ctx_t *ctx) {
  shared_t *sh = ctx->arg;
  tc_comm_t *c = comm_in_step(ctx, "xabort");
  int32_t x = 1;
  if (ctx->rank == 0) {
    abort_arg_t a = {c, 0};
    pthread_t th;
    pthread_create(&th, NULL, abort_later, &a);
    TC_ASSERT_ERR(tc_all_reduce(c, &x, 1, TC_INT32, TC_OP(TC_SUM), NULL, NULL), TC_ERR_ABORTED,
                  "aborted");
    double dt = tc__now() - a.aborted_at;
    pthread_join(th, NULL);
    TC_ASSERT(a.aborted_at > 0);
    TC_ASSERT(dt < 2.0); /* not the 600 s deadline */
    TC_ASSERT(tc_comm_is_aborted(c));
    sh->done = 1;
  } else {
    tc_wait_flag(&sh->done, 1, 30);
    TC_ASSERT_OK(tc_comm_abort(c));
  }
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(express_abort_ends_its_wait) { tc_spawn(2, abort_rank, tc_shared_zalloc(sizeof(shared_t)), 60); }

/* ---- over TCP: never (the work path) ---- */

static void tcp_rank(tc_ctx_t *ctx) {
  express_setting(1);
  setenv("TORCHCOMMS_CPU_TRANSPORT", "tcp", 1);
  char err[512] = "";
  if (tc__settings_reload(err, sizeof err) != TC_OK) tc_test_fail(__FILE__, __LINE__, "%s", err);
  tc_comm_t *c = tc_ctx_comm(ctx, "xtcp", NULL);
  for (int i = 0; i < 10; i++) {
    int32_t x = ctx->rank + i;
    TC_ASSERT_OK(tc_all_reduce(c, &x, 1, TC_INT32, TC_OP(TC_SUM), NULL, NULL));
    TC_ASSERT_EQ(x, 1 + 2 * i);
  }
  const int to = (ctx->rank + 1) % ctx->size, from = (ctx->rank + ctx->size - 1) % ctx->size;
  for (int i = 0; i < 5; i++) {
    int64_t v = 10 * ctx->rank + i, got = -1;
    TC_ASSERT_OK(tc_send(c, &v, 1, TC_INT64, to, NULL, NULL));
    TC_ASSERT_OK(tc_recv(c, &got, 1, TC_INT64, from, NULL, NULL));
    TC_ASSERT_EQ(got, 10 * from + i);
  }
  TC_ASSERT_EQ(tc__comm_express_ops(c), 0);
  TC_ASSERT_OK(tc_comm_destroy(c));
  express_setting(1);
}

TC_TEST(express_not_over_tcp) { tc_spawn(2, tcp_rank, NULL, 60); }

/* ---- wait hooks: the caller's lock goes before it blocks ---- */

typedef struct {
  shared_t *sh;
  int released, reacquired;
} hooks_arg_t;

static void hook_release(void *p) {
  hooks_arg_t *h = p;
  h->released++;
  h->sh->done = 1; /* rank 1 joins only now */
}
static void hook_reacquire(void *p) { ((hooks_arg_t *)p)->reacquired++; }

static void wait_hooks_rank(tc_ctx_t *ctx) {
  shared_t *sh = ctx->arg;
  tc_comm_t *c = comm_in_step(ctx, "xhooks");
  int32_t x = ctx->rank + 1;
  if (ctx->rank == 0) {
    /* rank 1 waits for the release: without it this all_reduce never ends */
    hooks_arg_t h = {sh, 0, 0};
    tc_op_options_t o = TC_OP_OPTIONS_INIT;
    o.wait_release = hook_release;
    o.wait_reacquire = hook_reacquire;
    o.wait_arg = &h;
    TC_ASSERT_OK(tc_all_reduce(c, &x, 1, TC_INT32, TC_OP(TC_SUM), &o, NULL));
    TC_ASSERT_EQ(h.released, 1);
    TC_ASSERT_EQ(h.reacquired, 1);
  } else {
    tc_wait_flag(&sh->done, 1, 30);
    TC_ASSERT_OK(tc_all_reduce(c, &x, 1, TC_INT32, TC_OP(TC_SUM), NULL, NULL));
  }
  TC_ASSERT_EQ(x, 3);
  TC_ASSERT_EQ(tc__comm_express_ops(c), 2); /* both through the express path */
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(express_wait_hooks_released_before_blocking) {
  tc_spawn(2, wait_hooks_rank, tc_shared_zalloc(sizeof(shared_t)), 60);
}

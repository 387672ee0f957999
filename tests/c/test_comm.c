/* test_comm.c -- communicators: several at once (interleaved, and from
 * several threads), issue order of asynchronous operations, split, getters
 * and options, finalize semantics. */
#include <pthread.h>

#include "coll_util.h"

/* ---- two communicators interleaved ---- */

static void interleave_rank(tc_ctx_t *ctx) {
  tc_comm_t *a = tc_ctx_comm(ctx, "alpha", NULL);
  tc_comm_t *b = tc_ctx_comm(ctx, "beta", NULL);
  for (int it = 0; it < 20; it++) {
    int32_t x = ctx->rank + it, y = 100 * (ctx->rank + 1);
    tc_work_t *wa, *wb;
    TC_ASSERT_OK(tc_all_reduce(a, &x, 1, TC_INT32, TC_OP(TC_SUM), NULL, &wa));
    TC_ASSERT_OK(tc_all_reduce(b, &y, 1, TC_INT32, TC_OP(TC_MAX), NULL, &wb));
    TC_ASSERT_OK(tc_work_wait(wb));
    TC_ASSERT_OK(tc_work_wait(wa));
    int n = ctx->size;
    TC_ASSERT_EQ(x, n * (n - 1) / 2 + n * it);
    TC_ASSERT_EQ(y, 100 * n);
    tc_work_release(wa);
    tc_work_release(wb);
  }
  TC_ASSERT_STR_EQ(tc_comm_name(a), "alpha");
  TC_ASSERT_STR_EQ(tc_comm_name(b), "beta");
  TC_ASSERT_OK(tc_comm_finalize(b));
  TC_ASSERT_OK(tc_comm_finalize(a));
  TC_ASSERT_OK(tc_comm_destroy(a));
  TC_ASSERT_OK(tc_comm_destroy(b));
}

TC_TEST(comm_two_interleaved) { tc_spawn(3, interleave_rank, NULL, 60); }

/* ---- several threads, each with its own communicator ---- */

typedef struct {
  tc_comm_t *c;
  int rank, size, id;
} thread_arg_t;

static void *comm_thread(void *p) {
  thread_arg_t *t = p;
  for (int it = 0; it < 50; it++) {
    int64_t v[3] = {t->rank, t->id, it};
    TC_ASSERT_OK(tc_all_reduce(t->c, v, 3, TC_INT64, TC_OP(TC_SUM), NULL, NULL));
    TC_ASSERT_EQ(v[0], t->size * (t->size - 1) / 2);
    TC_ASSERT_EQ(v[1], t->size * t->id);
    TC_ASSERT_EQ(v[2], t->size * it);
  }
  return NULL;
}

static void threads_rank(tc_ctx_t *ctx) {
  enum { T = 3 };
  thread_arg_t args[T];
  pthread_t th[T];
  for (int i = 0; i < T; i++) {
    char name[32];
    snprintf(name, sizeof name, "thread%d", i);
    args[i] = (thread_arg_t){tc_ctx_comm(ctx, name, NULL), ctx->rank, ctx->size, i};
  }
  for (int i = 0; i < T; i++) pthread_create(&th[i], NULL, comm_thread, &args[i]);
  for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < T; i++) {
    TC_ASSERT_OK(tc_comm_finalize(args[i].c));
    TC_ASSERT_OK(tc_comm_destroy(args[i].c));
  }
}

TC_TEST(comm_threads) { tc_spawn(4, threads_rank, NULL, 60); }

/* ---- issue order: many asynchronous operations, waited in reverse ---- */

static void order_rank(tc_ctx_t *ctx) {
  tc_comm_t *c = tc_ctx_comm(ctx, "order", NULL);
  enum { K = 64 };
  int32_t buf[K];
  tc_work_t *w[K];
  /* Broadcasts from rotating roots of one value: all see 1 only if they ran
   * in issue order on every rank. */
  int32_t chain = ctx->rank == 0 ? 1 : 0;
  for (int k = 0; k < K; k++) {
    TC_ASSERT_OK(tc_broadcast(c, &chain, 1, TC_INT32, k % ctx->size, NULL, &w[k]));
  }
  for (int k = K - 1; k >= 0; k--) {
    TC_ASSERT_OK(tc_work_wait(w[k]));
    tc_work_release(w[k]);
  }
  TC_ASSERT_EQ(chain, 1);
  for (int k = 0; k < K; k++) {
    buf[k] = ctx->rank * k;
    TC_ASSERT_OK(tc_all_reduce(c, &buf[k], 1, TC_INT32, TC_OP(TC_SUM), NULL, &w[k]));
  }
  for (int k = K - 1; k >= 0; k--) {
    TC_ASSERT_OK(tc_work_wait(w[k]));
    int done = 0;
    TC_ASSERT_OK(tc_work_test(w[k], &done));
    TC_ASSERT_EQ(done, 1);
    tc_work_release(w[k]);
    TC_ASSERT_EQ(buf[k], k * ctx->size * (ctx->size - 1) / 2);
  }
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(comm_issue_order) { tc_spawn(3, order_rank, NULL, 60); }

/* ---- split ---- */

static void split_rank(tc_ctx_t *ctx) {
  tc_comm_t *c = tc_ctx_comm(ctx, "parent", NULL);
  int r = ctx->rank;
  /* 4 ranks: {3, 1} (order reversed on purpose) and {0, 2} */
  int odd[] = {3, 1}, even[] = {0, 2};
  const int *mine = r % 2 ? odd : even;
  tc_comm_t *s = NULL;
  TC_ASSERT_OK(tc_comm_split(c, mine, 2, r % 2 ? "odd" : "even", NULL, &s));
  TC_ASSERT(s != NULL);
  TC_ASSERT_EQ(tc_comm_size(s), 2);
  TC_ASSERT_EQ(tc_comm_rank(s), mine[0] == r ? 0 : 1);
  TC_ASSERT_STR_EQ(tc_comm_name(s), r % 2 ? "odd" : "even");
  int32_t v = r;
  TC_ASSERT_OK(tc_all_reduce(s, &v, 1, TC_INT32, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT_EQ(v, r % 2 ? 4 : 2);
  /* rank order follows the list: root 0 of "odd" is parent rank 3 */
  int32_t b = r;
  TC_ASSERT_OK(tc_broadcast(s, &b, 1, TC_INT32, 0, NULL, NULL));
  TC_ASSERT_EQ(b, mine[0]);
  /* a split where rank 3 joins no group */
  int first3[] = {0, 1, 2};
  tc_comm_t *t = NULL;
  TC_ASSERT_OK(tc_comm_split(c, first3, r == 3 ? 0 : 3, "three", NULL, &t));
  if (r == 3) {
    TC_ASSERT(t == NULL);
  } else {
    TC_ASSERT(t != NULL);
    TC_ASSERT_EQ(tc_comm_size(t), 3);
    int32_t x = 1;
    TC_ASSERT_OK(tc_all_reduce(t, &x, 1, TC_INT32, TC_OP(TC_SUM), NULL, NULL));
    TC_ASSERT_EQ(x, 3);
    /* a split of a split */
    int pair[] = {0, 1};
    tc_comm_t *u = NULL;
    int rt = tc_comm_rank(t);
    TC_ASSERT_OK(tc_comm_split(t, pair, rt < 2 ? 2 : 0, "pair", NULL, &u));
    if (rt < 2) {
      int32_t y = 5;
      TC_ASSERT_OK(tc_all_reduce(u, &y, 1, TC_INT32, TC_OP(TC_SUM), NULL, NULL));
      TC_ASSERT_EQ(y, 10);
      TC_ASSERT_OK(tc_comm_finalize(u));
      TC_ASSERT_OK(tc_comm_destroy(u));
    }
    TC_ASSERT_OK(tc_comm_finalize(t));
    TC_ASSERT_OK(tc_comm_destroy(t));
  }
  /* the parent still works after splitting */
  int32_t p = 1;
  TC_ASSERT_OK(tc_all_reduce(c, &p, 1, TC_INT32, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT_EQ(p, 4);
  TC_ASSERT_OK(tc_comm_finalize(s));
  TC_ASSERT_OK(tc_comm_destroy(s));
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(comm_split) { tc_spawn(4, split_rank, NULL, 60); }

/* Members passing different lists for one group: every member errors. */
static void split_mismatch_rank(tc_ctx_t *ctx) {
  tc_comm_t *c = tc_ctx_comm(ctx, "parent", NULL);
  int a[] = {0, 1}, b[] = {1, 0};
  tc_comm_t *s = NULL;
  TC_ASSERT_ERR(tc_comm_split(c, ctx->rank == 0 ? a : b, 2, "bad", NULL, &s),
                TC_ERR_INVALID_ARGUMENT, "passed a different rank list");
  TC_ASSERT(s == NULL);
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(comm_split_mismatch) { tc_spawn(2, split_mismatch_rank, NULL, 60); }

/* One rank's refused list fails the split on every rank, at once (no rank
 * is left waiting), and so does a mismatch only one rank can see; the
 * parent stays usable and a later split succeeds. */
static void split_refused_rank(tc_ctx_t *ctx) {
  tc_comm_t *c = tc_ctx_comm(ctx, "parent", NULL);
  int me = ctx->rank;
  tc_comm_t *s = NULL;
  char want[256];
  int dup[2] = {0, 0}, all[3] = {0, 1, 2}, mine = me;
  /* rank 0 passes a duplicate, the others valid lists */
  if (me == 0) {
    TC_ASSERT_ERR(tc_comm_split(c, dup, 2, "bad", NULL, &s), TC_ERR_INVALID_ARGUMENT,
                  "rank 0 appears twice in 'ranks' (duplicate ranks found in ranks list)");
  } else {
    TC_ASSERT_ERR(tc_comm_split(c, all, 3, "bad", NULL, &s), TC_ERR_INVALID_ARGUMENT,
                  "rank 0 passed an invalid 'ranks' list (rank 0 appears twice), so the "
                  "split fails on every rank");
  }
  TC_ASSERT(s == NULL);
  /* rank 2 leaves itself out */
  int others[2] = {0, 1};
  snprintf(want, sizeof want, "'ranks' does not contain the caller's rank 2");
  if (me == 2)
    TC_ASSERT_ERR(tc_comm_split(c, others, 2, "bad", NULL, &s), TC_ERR_INVALID_ARGUMENT, want);
  else
    TC_ASSERT_ERR(tc_comm_split(c, all, 3, "bad", NULL, &s), TC_ERR_INVALID_ARGUMENT,
                  "rank 2 passed an invalid 'ranks' list (it does not contain rank 2 itself)");
  /* rank 0 lists {0, 1}, rank 1 only itself: only rank 0 sees the
   * mismatch; rank 2 (joining none) fails too */
  if (me == 0) {
    TC_ASSERT_ERR(tc_comm_split(c, others, 2, "bad", NULL, &s), TC_ERR_INVALID_ARGUMENT,
                  "rank 1 passed a different rank list (1 ranks) for this group");
  } else if (me == 1) {
    TC_ASSERT_ERR(tc_comm_split(c, &mine, 1, "bad", NULL, &s), TC_ERR_INVALID_ARGUMENT,
                  "rank 0 found that rank 1 passed a different rank list for their group");
  } else {
    TC_ASSERT_ERR(tc_comm_split(c, NULL, 0, "bad", NULL, &s), TC_ERR_INVALID_ARGUMENT,
                  "rank 0 found that rank 1 passed a different rank list");
  }
  TC_ASSERT(s == NULL);
  /* still usable: a valid split works */
  TC_ASSERT_OK(tc_comm_split(c, all, 3, "good", NULL, &s));
  TC_ASSERT_EQ(tc_comm_rank(s), me);
  int64_t v = me + 1;
  TC_ASSERT_OK(tc_all_reduce(s, &v, 1, TC_INT64, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT_EQ(v, 6);
  TC_ASSERT_OK(tc_comm_finalize(s));
  TC_ASSERT_OK(tc_comm_destroy(s));
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(comm_split_refused_everywhere) { tc_spawn(3, split_refused_rank, NULL, 60); }

/* ---- getters, options, reuse of a name ---- */

static void options_rank(tc_ctx_t *ctx) {
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  tc_hint_t hints[] = {{"algo", "ring"}, {"x", "1"}};
  o.hints = hints;
  o.num_hints = 2;
  o.timeout_s = 42;
  for (int round = 0; round < 3; round++) { /* the same name, three times */
    tc_comm_t *c = tc_ctx_comm(ctx, "opts", &o);
    tc_comm_options_t got;
    TC_ASSERT_OK(tc_comm_get_options(c, &got));
    TC_ASSERT_DBL_NEAR(got.timeout_s, 42, 0);
    TC_ASSERT_EQ(got.num_hints, 2);
    TC_ASSERT_STR_EQ(got.hints[0].key, "algo");
    TC_ASSERT_STR_EQ(got.hints[0].value, "ring");
    TC_ASSERT_EQ(got.abort_process_on_timeout_or_error, 0);
    TC_ASSERT_STR_EQ(tc_comm_backend(c), "cpu");
    TC_ASSERT_STR_EQ(tc_comm_device(c), "cpu");
    TC_ASSERT(tc_comm_backend_version(c) != NULL);
    TC_ASSERT_EQ(tc_comm_rank(c), ctx->rank);
    TC_ASSERT_EQ(tc_comm_size(c), ctx->size);
    TC_ASSERT_OK(tc_comm_set_timeout(c, 7));
    TC_ASSERT_OK(tc_comm_get_options(c, &got));
    TC_ASSERT_DBL_NEAR(got.timeout_s, 7, 0);
    /* set_hints: given keys added or replaced (the last of a repeated key
     * wins), the others kept; earlier get_options pointers stay valid */
    const tc_hint_t *before = got.hints;
    tc_hint_t more[] = {{"x", "2"}, {"new", "a"}, {"new", "b"}};
    TC_ASSERT_OK(tc_comm_set_hints(c, more, 3));
    TC_ASSERT_STR_EQ(before[1].value, "1");
    TC_ASSERT_OK(tc_comm_get_options(c, &got));
    TC_ASSERT_EQ(got.num_hints, 3);
    TC_ASSERT_STR_EQ(got.hints[0].key, "algo");
    TC_ASSERT_STR_EQ(got.hints[0].value, "ring");
    TC_ASSERT_STR_EQ(got.hints[1].key, "x");
    TC_ASSERT_STR_EQ(got.hints[1].value, "2");
    TC_ASSERT_STR_EQ(got.hints[2].key, "new");
    TC_ASSERT_STR_EQ(got.hints[2].value, "b");
    tc_hint_t bad[] = {{"k", NULL}};
    TC_ASSERT_ERR(tc_comm_set_hints(c, bad, 1), TC_ERR_INVALID_ARGUMENT, "NULL key or value");
    TC_ASSERT_ERR(tc_comm_set_hints(c, NULL, 1), TC_ERR_INVALID_ARGUMENT, "'hints' is NULL");
    TC_ASSERT_OK(tc_comm_set_hints(c, NULL, 0));
    TC_ASSERT_OK(tc_comm_get_options(c, &got));
    TC_ASSERT_EQ(got.num_hints, 3);
    int32_t v = round;
    TC_ASSERT_OK(tc_all_reduce(c, &v, 1, TC_INT32, TC_OP(TC_SUM), NULL, NULL));
    TC_ASSERT_EQ(v, round * ctx->size);
    TC_ASSERT_OK(tc_comm_finalize(c));
    TC_ASSERT_OK(tc_comm_finalize(c)); /* twice is harmless */
    TC_ASSERT_ERR(tc_all_reduce(c, &v, 1, TC_INT32, TC_OP(TC_SUM), NULL, NULL),
                  TC_ERR_INVALID_USAGE, "finalized");
    TC_ASSERT_OK(tc_comm_destroy(c));
  }
}

TC_TEST(comm_options_and_name_reuse) { tc_spawn(2, options_rank, NULL, 60); }

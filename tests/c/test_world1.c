/* test_world1.c -- correctness of every operation on a world-size-1 "cpu"
 * communicator (in-process store, no launcher): all_reduce is the identity
 * for every dtype and reduction (PREMUL_SUM scales), the gathers, scatters
 * and all-to-alls copy, broadcast is a no-op, batches with self send+recv
 * move data in posted order, barrier completes, zero-count operations with
 * NULL buffers succeed, async work objects report completion, and split /
 * getters / options behave.
 * Run: build/tc_test world1
 */
#include <math.h>
#include <stdint.h>

#include "runner.h"

static void clear_env(void) {
  static const char *vars[] = {
      "MASTER_ADDR",     "MASTER_PORT",          "TORCHELASTIC_USE_AGENT_STORE",
      "TORCHCOMM_RANK",  "TORCHCOMM_SIZE",       "OMPI_COMM_WORLD_RANK",
      "OMPI_COMM_WORLD_SIZE", "PMI_RANK",        "PMI_SIZE",
      "SLURM_PROCID",    "SLURM_NTASKS",         "RANK",
      "WORLD_SIZE",      "TORCHCOMM_TIMEOUT_SECONDS",
      "TORCHCOMM_ABORT_ON_ERROR"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

static tc_comm_t *comm1(void) {
  clear_env();
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.rank = 0;
  o.world_size = 1;
  tc_comm_t *c = NULL;
  TC_ASSERT_OK(tc_comm_create("cpu", "cpu", &o, &c));
  return c;
}

static const tc_dtype_t all_dtypes[] = {TC_FLOAT32, TC_FLOAT64, TC_FLOAT16,
                                        TC_BFLOAT16, TC_INT8,   TC_UINT8,
                                        TC_INT16,   TC_INT32,   TC_INT64,
                                        TC_BOOL,    TC_FLOAT8_E4M3FN,
                                        TC_FLOAT8_E5M2};
#define NDTYPES (sizeof all_dtypes / sizeof all_dtypes[0])

static int is_float(tc_dtype_t dt) {
  return dt == TC_FLOAT32 || dt == TC_FLOAT64 || dt == TC_FLOAT16 ||
         dt == TC_BFLOAT16 || dt == TC_FLOAT8_E4M3FN || dt == TC_FLOAT8_E5M2;
}

/* Elements i of a and b are equal (as doubles). */
static void assert_same(const void *a, const void *b, size_t n, tc_dtype_t dt) {
  for (size_t i = 0; i < n; i++)
    if (tc_get(a, i, dt) != tc_get(b, i, dt))
      tc_test_fail(__FILE__, __LINE__, "%s element %zu: %g != %g",
                   tc_dtype_name(dt), i, tc_get(a, i, dt), tc_get(b, i, dt));
}

TC_TEST(world1_create_and_getters) {
  clear_env();
  tc_comm_t *c = NULL;
  /* no options at all: rank 0 of 1 from an empty environment */
  TC_ASSERT_OK(tc_comm_create("cpu", NULL, NULL, &c));
  TC_ASSERT_EQ(tc_comm_rank(c), 0);
  TC_ASSERT_EQ(tc_comm_size(c), 1);
  TC_ASSERT_STR_EQ(tc_comm_name(c), "main");
  TC_ASSERT_STR_EQ(tc_comm_backend(c), "cpu");
  TC_ASSERT_STR_EQ(tc_comm_device(c), "cpu");
  TC_ASSERT(tc_comm_backend_version(c) != NULL);
  TC_ASSERT_STR_EQ(tc_comm_last_error(c), "");
  tc_comm_options_t o;
  TC_ASSERT_OK(tc_comm_get_options(c, &o));
  TC_ASSERT_EQ(o.size, sizeof o);
  TC_ASSERT_EQ(o.rank, 0);
  TC_ASSERT_EQ(o.world_size, 1);
  TC_ASSERT_DBL_NEAR(o.timeout_s, 600.0, 0);
  TC_ASSERT_STR_EQ(o.name, "main");
  TC_ASSERT_OK(tc_comm_set_timeout(c, 5.5));
  TC_ASSERT_OK(tc_comm_get_options(c, &o));
  TC_ASSERT_DBL_NEAR(o.timeout_s, 5.5, 0);
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));

  /* options: name, timeout, hints (copied) */
  tc_hint_t hints[2] = {{"a", "1"}, {"b", "2"}};
  tc_comm_options_t in = TC_COMM_OPTIONS_INIT;
  in.rank = 0;
  in.world_size = 1;
  in.name = "named";
  in.timeout_s = 12;
  in.hints = hints;
  in.num_hints = 2;
  TC_ASSERT_OK(tc_comm_create("cpu", "cpu", &in, &c));
  hints[0].value = "changed";
  TC_ASSERT_OK(tc_comm_get_options(c, &o));
  TC_ASSERT_STR_EQ(o.name, "named");
  TC_ASSERT_DBL_NEAR(o.timeout_s, 12.0, 0);
  TC_ASSERT_EQ(o.num_hints, 2);
  TC_ASSERT_STR_EQ(o.hints[0].key, "a");
  TC_ASSERT_STR_EQ(o.hints[0].value, "1");
  TC_ASSERT_STR_EQ(o.hints[1].value, "2");
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(world1_all_reduce_identity) {
  tc_comm_t *c = comm1();
  /* the quick check: SUM on 7 floats is the identity */
  float f[7] = {1.5f, -2, 3, 0, 1e30f, -1e-30f, 7};
  float copy[7];
  memcpy(copy, f, sizeof f);
  TC_ASSERT_OK(tc_all_reduce(c, f, 7, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT(memcmp(f, copy, sizeof f) == 0);

  /* every dtype, every reduction defined for it */
  enum { N = 37 };
  unsigned char buf[N * 8], ref[N * 8];
  for (size_t d = 0; d < NDTYPES; d++) {
    tc_dtype_t dt = all_dtypes[d];
    for (int op = 0; op < TC_REDOP_COUNT; op++) {
      if (op == TC_PREMUL_SUM) continue;
      int bitwise = op == TC_BAND || op == TC_BOR || op == TC_BXOR;
      if (bitwise && is_float(dt)) continue;
      if (op == TC_AVG && dt == TC_BOOL) continue; /* undefined: see test_validate */
      tc_fill(buf, N, dt, 0, op);
      memcpy(ref, buf, sizeof buf);
      if (tc_all_reduce(c, buf, N, dt, TC_OP((tc_redop_type_t)op), NULL, NULL) != TC_OK)
        tc_test_fail(__FILE__, __LINE__, "all_reduce %s %s: %s", tc_dtype_name(dt),
                     tc_redop_name((tc_redop_type_t)op), tc_last_error());
      assert_same(buf, ref, N, dt);
    }
  }
  /* PREMUL_SUM multiplies by the factor (exact for these values) */
  float g[4] = {1, -2, 3.5f, 0};
  TC_ASSERT_OK(tc_all_reduce(c, g, 4, TC_FLOAT32, TC_OP_PREMUL_SUM(2.0), NULL, NULL));
  TC_ASSERT_DBL_NEAR(g[0], 2.0, 0);
  TC_ASSERT_DBL_NEAR(g[1], -4.0, 0);
  TC_ASSERT_DBL_NEAR(g[2], 7.0, 0);
  TC_ASSERT_DBL_NEAR(g[3], 0.0, 0);
  double h[2] = {3, -1};
  TC_ASSERT_OK(tc_all_reduce(c, h, 2, TC_FLOAT64, TC_OP_PREMUL_SUM(0.5), NULL, NULL));
  TC_ASSERT_DBL_NEAR(h[0], 1.5, 0);
  TC_ASSERT_DBL_NEAR(h[1], -0.5, 0);
  uint16_t bf[2];
  tc_set(bf, 0, TC_BFLOAT16, 3.0);
  tc_set(bf, 1, TC_BFLOAT16, -0.25);
  TC_ASSERT_OK(tc_all_reduce(c, bf, 2, TC_BFLOAT16, TC_OP_PREMUL_SUM(4.0), NULL, NULL));
  TC_ASSERT_DBL_NEAR(tc_get(bf, 0, TC_BFLOAT16), 12.0, 0);
  TC_ASSERT_DBL_NEAR(tc_get(bf, 1, TC_BFLOAT16), -1.0, 0);
  /* a large buffer */
  size_t big = 1 << 20;
  float *l = malloc(big * sizeof *l);
  TC_ASSERT(l != NULL);
  for (size_t i = 0; i < big; i++) l[i] = (float)(i % 1000);
  TC_ASSERT_OK(tc_all_reduce(c, l, big, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL));
  for (size_t i = 0; i < big; i++)
    if (l[i] != (float)(i % 1000)) tc_test_fail(__FILE__, __LINE__, "element %zu", i);
  free(l);
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(world1_reduce_and_broadcast) {
  tc_comm_t *c = comm1();
  int64_t a[5] = {1, -2, 3, -4, 5}, ref[5];
  memcpy(ref, a, sizeof a);
  TC_ASSERT_OK(tc_reduce(c, a, 5, TC_INT64, TC_OP(TC_SUM), 0, NULL, NULL));
  TC_ASSERT(memcmp(a, ref, sizeof a) == 0);
  TC_ASSERT_OK(tc_reduce(c, a, 5, TC_INT64, TC_OP(TC_AVG), 0, NULL, NULL));
  TC_ASSERT(memcmp(a, ref, sizeof a) == 0);
  TC_ASSERT_OK(tc_broadcast(c, a, 5, TC_INT64, 0, NULL, NULL));
  TC_ASSERT(memcmp(a, ref, sizeof a) == 0);
  for (size_t d = 0; d < NDTYPES; d++) {
    unsigned char b[64], r[64];
    tc_fill(b, 8, all_dtypes[d], 0, 3);
    memcpy(r, b, sizeof b);
    TC_ASSERT_OK(tc_broadcast(c, b, 8, all_dtypes[d], 0, NULL, NULL));
    TC_ASSERT(memcmp(b, r, sizeof b) == 0);
  }
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(world1_all_gather) {
  tc_comm_t *c = comm1();
  float in[6] = {1, 2, 3, 4, 5, 6}, out[6] = {0};
  void *rl[1] = {out};
  TC_ASSERT_OK(tc_all_gather(c, rl, in, 6, TC_FLOAT32, NULL, NULL));
  TC_ASSERT(memcmp(in, out, sizeof in) == 0);
  memset(out, 0, sizeof out);
  size_t cnt[1] = {6};
  TC_ASSERT_OK(tc_all_gather_v(c, rl, cnt, in, 6, TC_FLOAT32, NULL, NULL));
  TC_ASSERT(memcmp(in, out, sizeof in) == 0);
  memset(out, 0, sizeof out);
  TC_ASSERT_OK(tc_all_gather_single(c, out, in, 6, TC_FLOAT32, NULL, NULL));
  TC_ASSERT(memcmp(in, out, sizeof in) == 0);
  /* in place: sendbuf == recvbuf + rank * count */
  TC_ASSERT_OK(tc_all_gather_single(c, out, out, 6, TC_FLOAT32, NULL, NULL));
  TC_ASSERT(memcmp(in, out, sizeof in) == 0);
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(world1_reduce_scatter) {
  tc_comm_t *c = comm1();
  int32_t in[5] = {9, -8, 7, -6, 5}, out[5] = {0};
  const void *sl[1] = {in};
  size_t cnt[1] = {5};
  TC_ASSERT_OK(tc_reduce_scatter(c, out, sl, 5, TC_INT32, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT(memcmp(in, out, sizeof in) == 0);
  memset(out, 0, sizeof out);
  TC_ASSERT_OK(tc_reduce_scatter_v(c, out, 5, sl, cnt, TC_INT32, TC_OP(TC_MAX), NULL, NULL));
  TC_ASSERT(memcmp(in, out, sizeof in) == 0);
  memset(out, 0, sizeof out);
  TC_ASSERT_OK(tc_reduce_scatter_single(c, out, in, 5, TC_INT32, TC_OP(TC_AVG), NULL, NULL));
  TC_ASSERT(memcmp(in, out, sizeof in) == 0);
  /* in place: recvbuf == sendbuf + rank * count */
  TC_ASSERT_OK(tc_reduce_scatter_single(c, out, out, 5, TC_INT32, TC_OP(TC_MIN), NULL, NULL));
  TC_ASSERT(memcmp(in, out, sizeof in) == 0);
  double d[3] = {1, 2, 3}, dout[3] = {0};
  TC_ASSERT_OK(tc_reduce_scatter_single(c, dout, d, 3, TC_FLOAT64, TC_OP_PREMUL_SUM(3.0), NULL, NULL));
  TC_ASSERT_DBL_NEAR(dout[0], 3.0, 0);
  TC_ASSERT_DBL_NEAR(dout[2], 9.0, 0);
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(world1_all_to_all) {
  tc_comm_t *c = comm1();
  int16_t in[4] = {1, 2, 3, 4}, out[4] = {0};
  TC_ASSERT_OK(tc_all_to_all_single(c, out, in, 4, TC_INT16, NULL, NULL));
  TC_ASSERT(memcmp(in, out, sizeof in) == 0);
  memset(out, 0, sizeof out);
  size_t cnt[1] = {4};
  TC_ASSERT_OK(tc_all_to_all_v_single(c, out, cnt, in, cnt, TC_INT16, NULL, NULL));
  TC_ASSERT(memcmp(in, out, sizeof in) == 0);
  memset(out, 0, sizeof out);
  void *rl[1] = {out};
  const void *sl[1] = {in};
  TC_ASSERT_OK(tc_all_to_all(c, rl, cnt, sl, cnt, TC_INT16, NULL, NULL));
  TC_ASSERT(memcmp(in, out, sizeof in) == 0);
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(world1_scatter_gather) {
  tc_comm_t *c = comm1();
  uint8_t in[3] = {7, 8, 9}, out[3] = {0};
  const void *sl[1] = {in};
  void *rl[1] = {out};
  TC_ASSERT_OK(tc_scatter(c, out, sl, 3, TC_UINT8, 0, NULL, NULL));
  TC_ASSERT(memcmp(in, out, sizeof in) == 0);
  memset(out, 0, sizeof out);
  TC_ASSERT_OK(tc_gather(c, rl, in, 3, TC_UINT8, 0, NULL, NULL));
  TC_ASSERT(memcmp(in, out, sizeof in) == 0);
  memset(out, 0, sizeof out);
  TC_ASSERT_OK(tc_gather_single(c, out, in, 3, TC_UINT8, 0, NULL, NULL));
  TC_ASSERT(memcmp(in, out, sizeof in) == 0);
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(world1_batch_self) {
  tc_comm_t *c = comm1();
  int32_t a[3] = {1, 2, 3}, b[2] = {4, 5}, ra[3] = {0}, rb[2] = {0};
  tc_batch_t *bt = NULL;
  TC_ASSERT_OK(tc_batch_create(c, &bt));
  /* recvs posted first; self messages match in posted order */
  TC_ASSERT_OK(tc_batch_recv(bt, ra, 3, TC_INT32, 0));
  TC_ASSERT_OK(tc_batch_recv(bt, rb, 2, TC_INT32, 0));
  TC_ASSERT_OK(tc_batch_send(bt, a, 3, TC_INT32, 0));
  TC_ASSERT_OK(tc_batch_send(bt, b, 2, TC_INT32, 0));
  TC_ASSERT_OK(tc_batch_issue(bt, NULL, NULL));
  TC_ASSERT(memcmp(a, ra, sizeof a) == 0);
  TC_ASSERT(memcmp(b, rb, sizeof b) == 0);
  /* the batch may be issued again (async this time) */
  a[0] = 42;
  tc_work_t *w = NULL;
  TC_ASSERT_OK(tc_batch_issue(bt, NULL, &w));
  TC_ASSERT_OK(tc_work_wait(w));
  TC_ASSERT_EQ(tc_work_status(w), TC_WORK_COMPLETED);
  TC_ASSERT_OK(tc_work_release(w));
  TC_ASSERT_EQ(ra[0], 42);
  TC_ASSERT_OK(tc_batch_free(bt));
  /* an empty batch completes */
  TC_ASSERT_OK(tc_batch_create(c, &bt));
  TC_ASSERT_OK(tc_batch_issue(bt, NULL, NULL));
  TC_ASSERT_OK(tc_batch_free(bt));
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(world1_barrier_and_async) {
  tc_comm_t *c = comm1();
  TC_ASSERT_OK(tc_barrier(c, NULL, NULL));
  tc_work_t *w = NULL;
  TC_ASSERT_OK(tc_barrier(c, NULL, &w));
  int done = 0;
  for (int i = 0; i < 10000 && !done; i++) TC_ASSERT_OK(tc_work_test(w, &done));
  TC_ASSERT_OK(tc_work_wait_for(w, 30));
  TC_ASSERT_OK(tc_work_test(w, &done));
  TC_ASSERT_EQ(done, 1);
  TC_ASSERT_EQ(tc_work_status(w), TC_WORK_COMPLETED);
  TC_ASSERT_STR_EQ(tc_work_error(w), "");
  TC_ASSERT_OK(tc_work_release(w));

  /* many async operations in flight, waited in order */
  enum { K = 64 };
  tc_work_t *ws[K];
  float v[K];
  for (int i = 0; i < K; i++) {
    v[i] = (float)i;
    TC_ASSERT_OK(tc_all_reduce(c, &v[i], 1, TC_FLOAT32, TC_OP(TC_SUM), NULL, &ws[i]));
  }
  for (int i = 0; i < K; i++) {
    TC_ASSERT_OK(tc_work_wait(ws[i]));
    TC_ASSERT_OK(tc_work_release(ws[i]));
    TC_ASSERT_DBL_NEAR(v[i], (double)i, 0);
  }
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(world1_zero_count) {
  tc_comm_t *c = comm1();
  void *rl[1] = {NULL};
  const void *sl[1] = {NULL};
  size_t z[1] = {0};
  tc_dtype_t f = TC_FLOAT32;
  TC_ASSERT_OK(tc_all_reduce(c, NULL, 0, f, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT_OK(tc_reduce(c, NULL, 0, f, TC_OP(TC_MAX), 0, NULL, NULL));
  TC_ASSERT_OK(tc_broadcast(c, NULL, 0, f, 0, NULL, NULL));
  TC_ASSERT_OK(tc_all_gather(c, rl, NULL, 0, f, NULL, NULL));
  TC_ASSERT_OK(tc_all_gather_v(c, rl, z, NULL, 0, f, NULL, NULL));
  TC_ASSERT_OK(tc_all_gather_single(c, NULL, NULL, 0, f, NULL, NULL));
  TC_ASSERT_OK(tc_reduce_scatter(c, NULL, sl, 0, f, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT_OK(tc_reduce_scatter_v(c, NULL, 0, sl, z, f, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT_OK(tc_reduce_scatter_single(c, NULL, NULL, 0, f, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT_OK(tc_all_to_all_single(c, NULL, NULL, 0, f, NULL, NULL));
  TC_ASSERT_OK(tc_all_to_all_v_single(c, NULL, z, NULL, z, f, NULL, NULL));
  TC_ASSERT_OK(tc_all_to_all(c, rl, z, sl, z, f, NULL, NULL));
  TC_ASSERT_OK(tc_scatter(c, NULL, sl, 0, f, 0, NULL, NULL));
  TC_ASSERT_OK(tc_gather(c, rl, NULL, 0, f, 0, NULL, NULL));
  TC_ASSERT_OK(tc_gather_single(c, NULL, NULL, 0, f, 0, NULL, NULL));
  tc_batch_t *b = NULL;
  TC_ASSERT_OK(tc_batch_create(c, &b));
  TC_ASSERT_OK(tc_batch_send(b, NULL, 0, f, 0));
  TC_ASSERT_OK(tc_batch_recv(b, NULL, 0, f, 0));
  TC_ASSERT_OK(tc_batch_issue(b, NULL, NULL));
  TC_ASSERT_OK(tc_batch_free(b));
  tc_work_t *w = NULL;
  TC_ASSERT_OK(tc_all_reduce(c, NULL, 0, TC_INT8, TC_OP(TC_BOR), NULL, &w));
  TC_ASSERT_OK(tc_work_wait(w));
  TC_ASSERT_OK(tc_work_release(w));
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(world1_split_and_many_comms) {
  tc_comm_t *c = comm1();
  int me = 0;
  tc_comm_t *child = NULL;
  TC_ASSERT_OK(tc_comm_split(c, &me, 1, "child", NULL, &child));
  TC_ASSERT(child != NULL);
  TC_ASSERT_EQ(tc_comm_rank(child), 0);
  TC_ASSERT_EQ(tc_comm_size(child), 1);
  TC_ASSERT_STR_EQ(tc_comm_name(child), "child");
  TC_ASSERT_STR_EQ(tc_comm_backend(child), "cpu");
  double v[2] = {1.25, 2.5};
  TC_ASSERT_OK(tc_all_reduce(child, v, 2, TC_FLOAT64, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT_DBL_NEAR(v[1], 2.5, 0);
  /* a split of a split */
  tc_comm_t *grandchild = NULL;
  TC_ASSERT_OK(tc_comm_split(child, &me, 1, "grandchild", NULL, &grandchild));
  TC_ASSERT_OK(tc_barrier(grandchild, NULL, NULL));
  /* joining no group */
  tc_comm_t *none = (tc_comm_t *)&none;
  TC_ASSERT_OK(tc_comm_split(c, NULL, 0, NULL, NULL, &none));
  TC_ASSERT(none == NULL);
  /* the parent keeps working, and so does a second split with the same name */
  tc_comm_t *again = NULL;
  TC_ASSERT_OK(tc_comm_split(c, &me, 1, "child", NULL, &again));
  TC_ASSERT_OK(tc_all_reduce(again, v, 2, TC_FLOAT64, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT_OK(tc_all_reduce(c, v, 2, TC_FLOAT64, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT_DBL_NEAR(v[0], 1.25, 0);
  TC_ASSERT_OK(tc_comm_finalize(grandchild));
  TC_ASSERT_OK(tc_comm_destroy(grandchild));
  TC_ASSERT_OK(tc_comm_finalize(again));
  TC_ASSERT_OK(tc_comm_destroy(again));
  TC_ASSERT_OK(tc_comm_finalize(child));
  TC_ASSERT_OK(tc_comm_destroy(child));
  /* several communicators with one name at once */
  tc_comm_t *cs[3];
  for (int i = 0; i < 3; i++) {
    tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
    o.rank = 0;
    o.world_size = 1;
    o.name = "same";
    TC_ASSERT_OK(tc_comm_create("cpu", "cpu", &o, &cs[i]));
  }
  for (int i = 0; i < 3; i++) {
    int32_t x = i;
    TC_ASSERT_OK(tc_all_reduce(cs[i], &x, 1, TC_INT32, TC_OP(TC_SUM), NULL, NULL));
    TC_ASSERT_EQ(x, i);
  }
  for (int i = 2; i >= 0; i--) TC_ASSERT_OK(tc_comm_destroy(cs[i]));
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(world1_op_options) {
  tc_comm_t *c = comm1();
  tc_hint_t hints[1] = {{"unknown.key", "ignored"}};
  tc_op_options_t o = TC_OP_OPTIONS_INIT;
  o.timeout_s = 3;
  o.hints = hints;
  o.num_hints = 1;
  float f[2] = {1, 2};
  TC_ASSERT_OK(tc_all_reduce(c, f, 2, TC_FLOAT32, TC_OP(TC_SUM), &o, NULL));
  TC_ASSERT_OK(tc_broadcast(c, f, 2, TC_FLOAT32, 0, &o, NULL));
  TC_ASSERT_OK(tc_barrier(c, &o, NULL));
  TC_ASSERT_DBL_NEAR(f[1], 2.0, 0);
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

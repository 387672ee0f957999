/* test_plugin_example.c -- the example out-of-tree backend of
 * examples/plugin/ ("loopback", built as build/plugins/libtorchcomms-
 * loopback.so), loaded BY NAME through TORCHCOMMS_BACKEND_LIB_PATH_LOOPBACK
 * as a user would:
 *  - every operation of the table on a world of one rank, values checked
 *    exactly (PREMUL_SUM scales, the rest copies), every dtype, zero counts,
 *    batches of self send/recv, split, async work objects;
 *  - asynchronous completion and issue order (the test hint
 *    "loopback.delay_ms" holds an operation on the progress thread: the
 *    post returns at once, and a later operation sees its result);
 *  - errors: world size 2 and device "cuda" refused at create, PREMUL_SUM on float16 and a
 *    mismatched all_to_all_v_single reported through the work, a bad hint,
 *    a timeout reported by the backend, abort failing pending operations,
 *    finalize draining the queue, the plugin missing from the directory.
 * Every test runs in its own forked process (fresh loader cache).
 * Run: build/tc_test plugin_example
 */
#include <stdint.h>
#include <time.h>

#include "runner.h"

#define LB_ENV "TORCHCOMMS_BACKEND_LIB_PATH_LOOPBACK"
#define LB_DIR TC_BUILD_DIR "/plugins"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void clear_env(void) {
  static const char *vars[] = {
      "MASTER_ADDR",    "MASTER_PORT",    "TORCHELASTIC_USE_AGENT_STORE",
      "TORCHCOMM_RANK", "TORCHCOMM_SIZE", "RANK",
      "WORLD_SIZE",     "TORCHCOMM_TIMEOUT_SECONDS", "TORCHCOMM_ABORT_ON_ERROR",
      LB_ENV};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

/* A world-size-1 communicator on the example plugin, found through the
 * environment variable naming its directory. */
static tc_comm_t *loopback_comm(const char *name) {
  clear_env();
  TC_ASSERT_EQ(setenv(LB_ENV, LB_DIR, 1), 0);
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.name = name;
  o.rank = 0;
  o.world_size = 1;
  tc_comm_t *c = NULL;
  TC_ASSERT_OK(tc_comm_create("loopback", "cpu", &o, &c));
  return c;
}

/* Options carrying the delay hint (value: milliseconds, as text). */
static tc_op_options_t delayed(tc_hint_t *h, const char *ms) {
  h->key = "loopback.delay_ms";
  h->value = ms;
  tc_op_options_t o = TC_OP_OPTIONS_INIT;
  o.hints = h;
  o.num_hints = 1;
  return o;
}

TC_TEST(plugin_example_identity) {
  tc_comm_t *c = loopback_comm("lb");
  TC_ASSERT_STR_EQ(tc_comm_backend(c), "loopback");
  TC_ASSERT_STR_EQ(tc_comm_backend_version(c), "1.0.0");
  TC_ASSERT_STR_EQ(tc_comm_name(c), "lb");
  TC_ASSERT_EQ(tc_comm_rank(c), 0);
  TC_ASSERT_EQ(tc_comm_size(c), 1);
  TC_ASSERT_OK(tc_barrier(c, NULL, NULL));
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(plugin_example_collectives) {
  tc_comm_t *c = loopback_comm("lb");
  /* all_reduce: SUM, MAX and AVG are the identity on one rank */
  float f[5] = {1, 2, 3, 4, 5};
  TC_ASSERT_OK(tc_all_reduce(c, f, 5, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL));
  for (int i = 0; i < 5; i++) TC_ASSERT_DBL_NEAR(f[i], i + 1, 0);
  int32_t n[3] = {-7, 0, 9};
  TC_ASSERT_OK(tc_all_reduce(c, n, 3, TC_INT32, TC_OP(TC_AVG), NULL, NULL));
  TC_ASSERT_EQ(n[0], -7);
  TC_ASSERT_EQ(n[2], 9);
  TC_ASSERT_OK(tc_all_reduce(c, n, 3, TC_INT32, TC_OP(TC_BXOR), NULL, NULL));
  TC_ASSERT_EQ(n[0], -7);
  /* PREMUL_SUM scales by the factor, float32 and float64 */
  TC_ASSERT_OK(tc_all_reduce(c, f, 5, TC_FLOAT32, TC_OP_PREMUL_SUM(2.5), NULL, NULL));
  for (int i = 0; i < 5; i++) TC_ASSERT_DBL_NEAR(f[i], 2.5 * (i + 1), 0);
  double d[2] = {1.5, -4};
  TC_ASSERT_OK(tc_reduce(c, d, 2, TC_FLOAT64, TC_OP_PREMUL_SUM(-0.5), 0, NULL, NULL));
  TC_ASSERT_DBL_NEAR(d[0], -0.75, 0);
  TC_ASSERT_DBL_NEAR(d[1], 2.0, 0);
  /* broadcast from the only root leaves the buffer */
  int64_t b[2] = {INT64_MAX, INT64_MIN};
  TC_ASSERT_OK(tc_broadcast(c, b, 2, TC_INT64, 0, NULL, NULL));
  TC_ASSERT(b[0] == INT64_MAX && b[1] == INT64_MIN);

  /* gathers */
  int32_t in[4] = {10, 11, 12, 13}, out[4] = {0};
  int32_t *outs[1] = {out};
  TC_ASSERT_OK(tc_all_gather(c, (void *const *)outs, in, 4, TC_INT32, NULL, NULL));
  for (int i = 0; i < 4; i++) TC_ASSERT_EQ(out[i], 10 + i);
  memset(out, 0, sizeof out);
  size_t cnt3[1] = {3};
  TC_ASSERT_OK(tc_all_gather_v(c, (void *const *)outs, cnt3, in, 3, TC_INT32, NULL, NULL));
  TC_ASSERT_EQ(out[2], 12);
  TC_ASSERT_EQ(out[3], 0);
  memset(out, 0, sizeof out);
  TC_ASSERT_OK(tc_all_gather_single(c, out, in, 4, TC_INT32, NULL, NULL));
  TC_ASSERT_EQ(out[3], 13);
  memset(out, 0, sizeof out);
  TC_ASSERT_OK(tc_gather(c, (void *const *)outs, in, 4, TC_INT32, 0, NULL, NULL));
  TC_ASSERT_EQ(out[1], 11);
  memset(out, 0, sizeof out);
  TC_ASSERT_OK(tc_gather_single(c, out, in, 4, TC_INT32, 0, NULL, NULL));
  TC_ASSERT_EQ(out[0], 10);
  /* in place */
  TC_ASSERT_OK(tc_all_gather_single(c, in, in, 4, TC_INT32, NULL, NULL));
  TC_ASSERT_EQ(in[3], 13);

  /* scatters and reduce-scatters (these reduce: PREMUL_SUM scales) */
  float fin[3] = {1, 2, 3}, fout[3] = {0};
  const float *fins[1] = {fin};
  TC_ASSERT_OK(tc_scatter(c, fout, (const void *const *)fins, 3, TC_FLOAT32, 0, NULL, NULL));
  TC_ASSERT_DBL_NEAR(fout[2], 3, 0);
  memset(fout, 0, sizeof fout);
  TC_ASSERT_OK(tc_reduce_scatter(c, fout, (const void *const *)fins, 3, TC_FLOAT32,
                                 TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT_DBL_NEAR(fout[1], 2, 0);
  TC_ASSERT_OK(tc_reduce_scatter_single(c, fout, fin, 3, TC_FLOAT32, TC_OP_PREMUL_SUM(3.0),
                                        NULL, NULL));
  TC_ASSERT_DBL_NEAR(fout[0], 3, 0);
  TC_ASSERT_DBL_NEAR(fout[2], 9, 0);
  memset(fout, 0, sizeof fout);
  size_t cnt2[1] = {2};
  TC_ASSERT_OK(tc_reduce_scatter_v(c, fout, 2, (const void *const *)fins, cnt2, TC_FLOAT32,
                                   TC_OP_PREMUL_SUM(0.5), NULL, NULL));
  TC_ASSERT_DBL_NEAR(fout[0], 0.5, 0);
  TC_ASSERT_DBL_NEAR(fout[1], 1.0, 0);
  TC_ASSERT_DBL_NEAR(fout[2], 0, 0);

  /* all-to-alls */
  uint8_t u[6] = {1, 2, 3, 4, 5, 6}, v[6] = {0};
  TC_ASSERT_OK(tc_all_to_all_single(c, v, u, 6, TC_UINT8, NULL, NULL));
  TC_ASSERT_EQ(memcmp(u, v, 6), 0);
  memset(v, 0, sizeof v);
  size_t c5[1] = {5};
  TC_ASSERT_OK(tc_all_to_all_v_single(c, v, c5, u, c5, TC_UINT8, NULL, NULL));
  TC_ASSERT_EQ(v[4], 5);
  TC_ASSERT_EQ(v[5], 0);
  memset(v, 0, sizeof v);
  const uint8_t *us[1] = {u};
  uint8_t *vs[1] = {v};
  TC_ASSERT_OK(tc_all_to_all(c, (void *const *)vs, c5, (const void *const *)us, c5,
                             TC_UINT8, NULL, NULL));
  TC_ASSERT_EQ(v[0], 1);
  TC_ASSERT_EQ(v[5], 0);

  /* every dtype moves bit-exactly */
  for (int dt = 0; dt < TC_DTYPE_COUNT; dt++) {
    unsigned char src[40], dst[40];
    for (int i = 0; i < 40; i++) src[i] = (unsigned char)(37 * i + dt);
    memset(dst, 0xee, sizeof dst);
    size_t count = 32 / tc_dtype_size((tc_dtype_t)dt);
    TC_ASSERT_OK(tc_all_gather_single(c, dst, src, count, (tc_dtype_t)dt, NULL, NULL));
    TC_ASSERT_EQ(memcmp(src, dst, 32), 0);
    TC_ASSERT_EQ(dst[32], 0xee);
  }
  /* zero counts with NULL buffers */
  TC_ASSERT_OK(tc_all_reduce(c, NULL, 0, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT_OK(tc_all_gather_single(c, NULL, NULL, 0, TC_INT8, NULL, NULL));

  /* a batch of self send/recv pairs, matched in posted order */
  int16_t s1[2] = {1, 2}, s2[3] = {3, 4, 5}, r1[2] = {0}, r2[3] = {0};
  tc_batch_t *bt = NULL;
  TC_ASSERT_OK(tc_batch_create(c, &bt));
  TC_ASSERT_OK(tc_batch_recv(bt, r1, 2, TC_INT16, 0));
  TC_ASSERT_OK(tc_batch_send(bt, s1, 2, TC_INT16, 0));
  TC_ASSERT_OK(tc_batch_send(bt, s2, 3, TC_INT16, 0));
  TC_ASSERT_OK(tc_batch_recv(bt, r2, 3, TC_INT16, 0));
  TC_ASSERT_OK(tc_batch_issue(bt, NULL, NULL));
  TC_ASSERT_OK(tc_batch_free(bt));
  TC_ASSERT(r1[0] == 1 && r1[1] == 2);
  TC_ASSERT(r2[0] == 3 && r2[2] == 5);

  /* async work objects */
  tc_work_t *w = NULL;
  int64_t x = 42;
  TC_ASSERT_OK(tc_all_reduce(c, &x, 1, TC_INT64, TC_OP(TC_MIN), NULL, &w));
  TC_ASSERT_OK(tc_work_wait(w));
  TC_ASSERT_EQ(tc_work_status(w), TC_WORK_COMPLETED);
  TC_ASSERT_OK(tc_work_release(w));
  TC_ASSERT_EQ(x, 42);

  /* split: the core calls the plugin's init again for the child */
  int me = 0;
  tc_comm_t *child = NULL;
  TC_ASSERT_OK(tc_comm_split(c, &me, 1, "lb_child", NULL, &child));
  TC_ASSERT(child != NULL);
  TC_ASSERT_STR_EQ(tc_comm_backend(child), "loopback");
  TC_ASSERT_EQ(tc_comm_size(child), 1);
  double cd = 3.0;
  TC_ASSERT_OK(tc_all_reduce(child, &cd, 1, TC_FLOAT64, TC_OP_PREMUL_SUM(2.0), NULL, NULL));
  TC_ASSERT_DBL_NEAR(cd, 6.0, 0);
  TC_ASSERT_OK(tc_comm_finalize(child));
  TC_ASSERT_OK(tc_comm_destroy(child));

  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_ERR(tc_barrier(c, NULL, NULL), TC_ERR_INVALID_USAGE, "finalized");
  TC_ASSERT_OK(tc_comm_destroy(c));
}

/* The op entries only queue: a delayed operation leaves the post at once,
 * and an operation posted after it sees its result (issue order). */
TC_TEST(plugin_example_async_order) {
  tc_comm_t *c = loopback_comm("lb");
  tc_hint_t h;
  tc_op_options_t slow = delayed(&h, "150");
  int32_t x[4] = {1, 2, 3, 4}, y[4] = {0}, z[4] = {0};
  tc_work_t *wa = NULL, *wb = NULL;
  double t0 = now_s();
  TC_ASSERT_OK(tc_all_gather_single(c, y, x, 4, TC_INT32, &slow, &wa));
  TC_ASSERT_OK(tc_all_gather_single(c, z, y, 4, TC_INT32, NULL, &wb));
  TC_ASSERT(now_s() - t0 < 0.1); /* neither post waited for the delay */
  int done = 1;
  TC_ASSERT_OK(tc_work_test(wb, &done));
  TC_ASSERT_EQ(done, 0); /* queued behind the delayed one */
  TC_ASSERT_OK(tc_work_wait(wb));
  TC_ASSERT(now_s() - t0 >= 0.14);
  TC_ASSERT_EQ(tc_work_status(wa), TC_WORK_COMPLETED);
  for (int i = 0; i < 4; i++) TC_ASSERT_EQ(z[i], i + 1);
  TC_ASSERT_OK(tc_work_release(wa));
  TC_ASSERT_OK(tc_work_release(wb));

  /* finalize runs what is still queued before it returns */
  double v = 2.0;
  TC_ASSERT_OK(tc_all_reduce(c, &v, 1, TC_FLOAT64, TC_OP(TC_SUM), &slow, &wa));
  TC_ASSERT_OK(tc_all_reduce(c, &v, 1, TC_FLOAT64, TC_OP_PREMUL_SUM(5.0), &slow, &wb));
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_EQ(tc_work_status(wa), TC_WORK_COMPLETED);
  TC_ASSERT_EQ(tc_work_status(wb), TC_WORK_COMPLETED);
  TC_ASSERT_DBL_NEAR(v, 10.0, 0);
  TC_ASSERT_OK(tc_work_release(wa));
  TC_ASSERT_OK(tc_work_release(wb));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(plugin_example_errors) {
  /* world size 2: refused at create with the plugin's own sentence */
  clear_env();
  TC_ASSERT_EQ(setenv(LB_ENV, LB_DIR, 1), 0);
  tc_store_t *s = NULL;
  TC_ASSERT_OK(tc_store_memory(&s));
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.rank = 0;
  o.world_size = 2;
  o.store = s;
  tc_comm_t *c = NULL;
  TC_ASSERT_ERR(tc_comm_create("loopback", "cpu", &o, &c), TC_ERR_NOT_SUPPORTED,
                "torchcomms: tc_comm_create on 'main' (rank 0 of 2): backend 'loopback' "
                "failed to start: the loopback backend runs a world of one rank only "
                "(got world size 2); use the cpu backend for more");
  TC_ASSERT(c == NULL);
  tc_store_release(s);
  /* a device it does not serve */
  o.world_size = 1;
  o.store = NULL;
  TC_ASSERT_ERR(tc_comm_create("loopback", "cuda", &o, &c), TC_ERR_NOT_SUPPORTED,
                "backend 'loopback' failed to start: the loopback backend works on host "
                "memory (device 'cpu'), not on device 'cuda'");
  TC_ASSERT(c == NULL);

  c = loopback_comm("lb");
  /* reported through the work by the progress thread, sync and async */
  uint16_t h16[2] = {0x3c00, 0x4000};
  TC_ASSERT_ERR(tc_all_reduce(c, h16, 2, TC_FLOAT16, TC_OP_PREMUL_SUM(2.0), NULL, NULL),
                TC_ERR_NOT_SUPPORTED,
                "torchcomms: all_reduce on 'lb' (rank 0 of 1): loopback: PREMUL_SUM on "
                "float16 is not implemented (float32 and float64 are)");
  TC_ASSERT_EQ(h16[0], 0x3c00); /* untouched */
  TC_ASSERT_CONTAINS(tc_comm_last_error(c), "PREMUL_SUM on float16");
  int8_t a[4] = {1, 2, 3, 4}, b[4] = {0};
  size_t sc[1] = {3}, rc[1] = {4};
  tc_work_t *w = NULL;
  TC_ASSERT_OK(tc_all_to_all_v_single(c, b, rc, a, sc, TC_INT8, NULL, &w));
  TC_ASSERT_ERR(tc_work_wait(w), TC_ERR_INVALID_ARGUMENT,
                "torchcomms: all_to_all_v_single on 'lb' (rank 0 of 1): loopback: rank 0 "
                "sends 3 elements to itself but expects to receive 4");
  TC_ASSERT_EQ(tc_work_status(w), TC_WORK_ERROR);
  TC_ASSERT_CONTAINS(tc_work_error(w), "expects to receive 4");
  TC_ASSERT_OK(tc_work_release(w));
  TC_ASSERT_EQ(b[0], 0);
  /* a bad value for the plugin's hint */
  tc_hint_t hb;
  tc_op_options_t bad = delayed(&hb, "soon");
  TC_ASSERT_ERR(tc_barrier(c, &bad, NULL), TC_ERR_INVALID_ARGUMENT,
                "barrier on 'lb' (rank 0 of 1): loopback: hint loopback.delay_ms='soon' "
                "is not a number of milliseconds >= 0");
  /* the backend reports its own timeout at the operation's deadline */
  tc_hint_t hs;
  tc_op_options_t slow = delayed(&hs, "10000");
  slow.timeout_s = 0.2;
  double t0 = now_s();
  TC_ASSERT_ERR(tc_barrier(c, &slow, NULL), TC_ERR_TIMEOUT,
                "barrier on 'lb' (rank 0 of 1): loopback: timed out after 0.200 s");
  double dt = now_s() - t0;
  TC_ASSERT(dt >= 0.19 && dt < 3.0);
  /* the errors above leave the communicator usable */
  float f = 1.5f;
  TC_ASSERT_OK(tc_all_reduce(c, &f, 1, TC_FLOAT32, TC_OP_PREMUL_SUM(2.0), NULL, NULL));
  TC_ASSERT_DBL_NEAR(f, 3.0, 0);
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

/* abort fails the running and the queued operations at once */
TC_TEST(plugin_example_abort) {
  tc_comm_t *c = loopback_comm("lb");
  tc_hint_t h;
  tc_op_options_t slow = delayed(&h, "20000");
  int32_t x[2] = {5, 6}, y[2] = {0};
  tc_work_t *w1 = NULL, *w2 = NULL;
  TC_ASSERT_OK(tc_all_gather_single(c, y, x, 2, TC_INT32, &slow, &w1));
  TC_ASSERT_OK(tc_all_gather_single(c, y, x, 2, TC_INT32, NULL, &w2));
  double t0 = now_s();
  TC_ASSERT_OK(tc_comm_abort(c));
  TC_ASSERT(tc_comm_is_aborted(c));
  TC_ASSERT_ERR(tc_work_wait(w1), TC_ERR_ABORTED,
                "all_gather_single on 'lb' (rank 0 of 1): loopback: communicator was aborted");
  TC_ASSERT_ERR(tc_work_wait(w2), TC_ERR_ABORTED, "loopback: communicator was aborted");
  TC_ASSERT(now_s() - t0 < 2.0);
  TC_ASSERT_EQ(y[0], 0); /* neither ran */
  TC_ASSERT_OK(tc_work_release(w1));
  TC_ASSERT_OK(tc_work_release(w2));
  TC_ASSERT_ERR(tc_barrier(c, NULL, NULL), TC_ERR_ABORTED, "aborted");
  TC_ASSERT_OK(tc_comm_destroy(c));

  /* destroy without finalize aborts too */
  c = loopback_comm("lb2");
  TC_ASSERT_OK(tc_all_gather_single(c, y, x, 2, TC_INT32, &slow, &w1));
  TC_ASSERT_OK(tc_comm_destroy(c));
  TC_ASSERT_ERR(tc_work_wait(w1), TC_ERR_ABORTED, "communicator was aborted");
  TC_ASSERT_OK(tc_work_release(w1));
}

/* The variable naming a directory without the plugin: the loader names the
 * path it tried and the variable to set. */
TC_TEST(plugin_example_not_found) {
  clear_env();
  TC_ASSERT_EQ(setenv(LB_ENV, TC_SOURCE_DIR "/include", 1), 0);
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.rank = 0;
  o.world_size = 1;
  tc_comm_t *c = NULL;
  TC_ASSERT_ERR(tc_comm_create("loopback", "cpu", &o, &c), TC_ERR_BACKEND_NOT_FOUND,
                "torchcomms: backend 'loopback' not found: tried " TC_SOURCE_DIR
                "/include/libtorchcomms-loopback.so (No such file or directory), ");
  TC_ASSERT_CONTAINS(tc_last_error(), "the built-in backends (cpu");
  TC_ASSERT_CONTAINS(tc_last_error(),
                     "set " LB_ENV " to the path of libtorchcomms-loopback.so");
  TC_ASSERT(c == NULL);
}

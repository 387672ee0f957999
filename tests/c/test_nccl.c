/* test_nccl.c -- the nccl backend's loading, device selection, stream
 * ordering, split, refusals, timeout, remote error and abort, through the
 * fake NCCL and CUDA runtime (tests/c/fake_nccl/; nccl_util.h). The
 * operations themselves: test_nccl_ops.c.
 *
 *  - nccl_missing_*: no NCCL / no CUDA runtime -> TC_ERR_BACKEND_NOT_FOUND
 *    with one sentence naming every path tried;
 *  - nccl_beside_libtorchcomms: the module is found beside the library
 *    (here: beside tc_test, which links the library statically);
 *  - nccl_device_*: device index out of range, no device, device "cpu"
 *    refused unless TORCHCOMMS_NCCL_FAKE_HOST=1;
 *  - nccl_stream_order: an operation waits for work queued before it on the
 *    caller's stream (tc_op_options_t.stream) and reports "not started"
 *    until then;
 *  - nccl_split_w4: ncclCommSplit with two groups, a rank in no group, a
 *    split of a split;
 *  - nccl_unsupported: reductions NCCL lacks are refused before anything is
 *    enqueued, the communicator stays usable;
 *  - nccl_timeout_w2, nccl_remote_error_w2, nccl_abort_w2,
 *    nccl_init_timeout: the failure paths.
 * Run: build/tc_test nccl
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <time.h>
#include <unistd.h>

#include "nccl_util.h"

/* The fake CUDA runtime's entry points, from the very file the backend
 * loads (one instance in the process); tc_test does not link it. */
typedef int (*fk_int_fn)(int);
typedef int (*fk_intp_fn)(int *);
typedef int (*fk_stream_create_fn)(void **, unsigned int);
typedef int (*fk_stream_fn)(void *);
typedef int (*fk_enqueue_fn)(void *, void (*)(void *), void *);

static void *fk_sym(const char *name) {
  void *h = dlopen(FAKE_CUDART, RTLD_NOW | RTLD_LOCAL);
  if (!h) tc_test_fail(__FILE__, __LINE__, "dlopen %s: %s", FAKE_CUDART, dlerror());
  void *f = dlsym(h, name);
  if (!f) tc_test_fail(__FILE__, __LINE__, "%s lacks %s", FAKE_CUDART, name);
  return f;
}
#define cudaSuccess 0
#define cudaStreamNonBlocking 1u
#define cudaSetDevice(d) ((fk_int_fn)fk_sym("cudaSetDevice"))(d)
#define cudaGetDevice(p) ((fk_intp_fn)fk_sym("cudaGetDevice"))(p)
#define cudaStreamCreateWithFlags(p, f)                                        \
  ((fk_stream_create_fn)fk_sym("cudaStreamCreateWithFlags"))(p, f)
#define cudaStreamSynchronize(s) ((fk_stream_fn)fk_sym("cudaStreamSynchronize"))(s)
#define cudaStreamDestroy(s) ((fk_stream_fn)fk_sym("cudaStreamDestroy"))(s)
#define tcfake_stream_enqueue(s, f, a)                                         \
  ((fk_enqueue_fn)fk_sym("tcfake_stream_enqueue"))(s, f, a)

static int create1(const char *device, int index, double timeout_s,
                   tc_comm_t **out) {
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.rank = 0;
  o.world_size = 1;
  o.device_index = index;
  o.timeout_s = timeout_s;
  tc_store_t *s = NULL;
  TC_ASSERT_OK(tc_store_memory(&s));
  o.store = s;
  *out = NULL;
  int rc = tc_comm_create("nccl", device, &o, out);
  tc_store_release(s);
  return rc;
}

/* ---- loading ---- */

TC_TEST(nccl_missing_nccl_library) {
  nccl_use_fake();
  setenv("TORCHCOMMS_NCCL_LIB", "/nonexistent/libnccl.so.2", 1);
  tc_comm_t *c;
  TC_ASSERT_ERR(create1("cuda", 0, 5, &c), TC_ERR_BACKEND_NOT_FOUND,
                "backend 'nccl' failed to start: cannot load the NCCL "
                "library: tried /nonexistent/libnccl.so.2 from "
                "$TORCHCOMMS_NCCL_LIB (");
  TC_ASSERT_CONTAINS(tc_last_error(), "set TORCHCOMMS_NCCL_LIB");
  TC_ASSERT(c == NULL);
}

/* Without the variable, the usual names; checked only where this machine
 * has no NCCL (a GPU machine may well have it). */
TC_TEST(nccl_missing_default_names) {
  nccl_use_fake();
  unsetenv("TORCHCOMMS_NCCL_LIB");
  void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (h) {
    dlclose(h);
    printf("# skipped: this machine has libnccl.so.2\n");
    return;
  }
  tc_comm_t *c;
  TC_ASSERT_ERR(create1("cuda", 0, 5, &c), TC_ERR_BACKEND_NOT_FOUND,
                "cannot load the NCCL library: tried libnccl.so.2 (");
  TC_ASSERT_CONTAINS(tc_last_error(), ") and libnccl.so (");
  TC_ASSERT_CONTAINS(tc_last_error(), "pip install nvidia-nccl-cu12");
}

TC_TEST(nccl_missing_cudart) {
  nccl_use_fake();
  setenv("TORCHCOMMS_CUDART_LIB", "/nonexistent/libcudart.so.12", 1);
  tc_comm_t *c;
  TC_ASSERT_ERR(create1("cuda", 0, 5, &c), TC_ERR_BACKEND_NOT_FOUND,
                "cannot load the CUDA runtime library: tried "
                "/nonexistent/libcudart.so.12 from $TORCHCOMMS_CUDART_LIB");
}

/* A library that is not NCCL: the symbol it lacks is named. */
TC_TEST(nccl_not_nccl) {
  nccl_use_fake();
  setenv("TORCHCOMMS_NCCL_LIB", FAKE_CUDART, 1);
  tc_comm_t *c;
  TC_ASSERT_ERR(create1("cuda", 0, 5, &c), TC_ERR_BACKEND,
                "was loaded but does not define ncclGetVersion");
}

/* 1 if the library's code (linked into tc_test) lives in TC_BUILD_DIR, as
 * when tc_test is started as ./build/tc_test. */
static int started_from_build_dir(void) {
  Dl_info info;
  char dir[4096], a[4096], b[4096];
  if (!dladdr((void *)&tc_comm_create, &info) || !info.dli_fname) return 0;
  snprintf(dir, sizeof dir, "%s", info.dli_fname);
  char *slash = strrchr(dir, '/');
  if (!slash) return 0;
  *slash = 0;
  return realpath(dir, a) && realpath(TC_BUILD_DIR, b) && !strcmp(a, b);
}

TC_TEST(nccl_beside_libtorchcomms) {
  nccl_use_fake();
  unsetenv("TORCHCOMMS_BACKEND_LIB_PATH_NCCL");
  if (!started_from_build_dir()) {
    printf("# skipped: tc_test was not started from the build directory\n");
    return;
  }
  tc_comm_t *c;
  TC_ASSERT_OK(create1("cuda", 0, 5, &c));
  TC_ASSERT_STR_EQ(tc_comm_backend(c), "nccl");
  TC_ASSERT_STR_EQ(tc_comm_device(c), "cuda");
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

/* ---- devices ---- */

TC_TEST(nccl_device_selection) {
  nccl_use_fake();
  setenv("TCFAKE_CUDA_DEVICES", "2", 1);
  tc_comm_t *c;
  TC_ASSERT_ERR(create1("cuda", 3, 5, &c), TC_ERR_INVALID_ARGUMENT,
                "device index 3 is out of range: this process sees 2 CUDA "
                "devices");
  TC_ASSERT_ERR(create1("cpu", 0, 5, &c), TC_ERR_INVALID_ARGUMENT,
                "the nccl backend runs on CUDA devices: create the "
                "communicator on device 'cuda' (got 'cpu')");
  /* device 1 is the current device of the poller and while posting, and
   * the caller's current device is left alone */
  TC_ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  TC_ASSERT_OK(create1("cuda", 1, 5, &c));
  float x[3] = {1, 2, 3};
  TC_ASSERT_OK(tc_all_reduce(c, x, 3, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL));
  int d = -1;
  TC_ASSERT_EQ(cudaGetDevice(&d), cudaSuccess);
  TC_ASSERT_EQ(d, 0);
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
  /* -1: the caller's current device */
  TC_ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  TC_ASSERT_OK(create1("cuda", -1, 5, &c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(nccl_device_none) {
  nccl_use_fake();
  setenv("TCFAKE_CUDA_DEVICES", "0", 1);
  tc_comm_t *c;
  TC_ASSERT_ERR(create1("cuda", 0, 5, &c), TC_ERR_BACKEND_NOT_FOUND,
                "no CUDA device is usable (cudaGetDeviceCount: no "
                "CUDA-capable device is detected");
}

/* The test-only switch that lets host tensors through (Python tests). */
TC_TEST(nccl_fake_host_switch) {
  nccl_use_fake();
  setenv("TORCHCOMMS_NCCL_FAKE_HOST", "1", 1);
  tc_comm_t *c;
  TC_ASSERT_OK(create1("cpu", -1, 5, &c));
  int64_t v[2] = {4, 5};
  TC_ASSERT_OK(tc_all_reduce(c, v, 2, TC_INT64, TC_OP(TC_MAX), NULL, NULL));
  TC_ASSERT_EQ(v[1], 5);
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

/* ---- the caller's stream ---- */

static void slow_fill(void *arg) {
  struct timespec ts = {0, 300 * 1000 * 1000};
  nanosleep(&ts, NULL);
  float *x = arg;
  for (int i = 0; i < 4; i++) x[i] = 5.0f;
}

TC_TEST(nccl_stream_order) {
  nccl_use_fake();
  tc_comm_t *c;
  TC_ASSERT_OK(create1("cuda", 0, 10, &c));
  void *s;
  TC_ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
               cudaSuccess);
  float x[4] = {1, 1, 1, 1};
  /* a "kernel" on the caller's stream writes x after 300 ms; an all_reduce
   * issued after it on that stream must see the written values */
  TC_ASSERT_EQ(tcfake_stream_enqueue(s, slow_fill, x), cudaSuccess);
  tc_op_options_t o = TC_OP_OPTIONS_INIT;
  o.stream = s;
  tc_work_t *w;
  TC_ASSERT_OK(tc_all_reduce(c, x, 4, TC_FLOAT32, TC_OP_PREMUL_SUM(2.0), &o,
                             &w));
  TC_ASSERT_EQ(tc_work_status(w), TC_WORK_NOT_STARTED);
  TC_ASSERT_OK(tc_work_wait(w));
  TC_ASSERT_OK(tc_work_release(w));
  for (int i = 0; i < 4; i++) TC_ASSERT_DBL_NEAR(x[i], 10.0, 0);
  /* a synchronous operation on the stream: later work on it runs after */
  TC_ASSERT_OK(tc_broadcast(c, x, 4, TC_FLOAT32, 0, &o, NULL));
  TC_ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
  TC_ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

/* ---- split ---- */

static void all_reduce_check(tc_comm_t *c, int64_t mine, int64_t expect) {
  int64_t v[3] = {mine, mine, mine};
  TC_ASSERT_OK(tc_all_reduce(c, v, 3, TC_INT64, TC_OP(TC_SUM), NULL, NULL));
  for (int i = 0; i < 3; i++) TC_ASSERT_EQ(v[i], expect);
}

static void split_rank(tc_ctx_t *ctx) {
  int r = ctx->rank;
  tc_comm_t *c = nccl_comm(ctx, "split_parent", 30), *s = NULL, *t = NULL,
            *u = NULL;
  int pair[2] = {r - r % 2, r - r % 2 + 1};
  TC_ASSERT_OK(tc_comm_split(c, pair, 2, r % 2 ? "odd" : "even", NULL, &s));
  TC_ASSERT_STR_EQ(tc_comm_backend(s), "nccl");
  TC_ASSERT_EQ(tc_comm_size(s), 2);
  TC_ASSERT_EQ(tc_comm_rank(s), r % 2);
  all_reduce_check(s, r, pair[0] + pair[1]);
  /* rank 3 joins no group: it still takes part in ncclCommSplit */
  int three[3] = {2, 1, 0}; /* ranks follow the list's order */
  TC_ASSERT_OK(tc_comm_split(c, three, r == 3 ? 0 : 3, "three", NULL, &t));
  if (r == 3) {
    TC_ASSERT(t == NULL);
  } else {
    TC_ASSERT_EQ(tc_comm_rank(t), 2 - r);
    all_reduce_check(t, r + 1, 6);
    /* a split of a split */
    int two[2] = {0, 1};
    int rt = tc_comm_rank(t);
    TC_ASSERT_OK(tc_comm_split(t, two, rt < 2 ? 2 : 0, "pair", NULL, &u));
    if (rt < 2) all_reduce_check(u, 10, 20);
    else TC_ASSERT(u == NULL);
  }
  all_reduce_check(c, 1, 4); /* the parent still works */
  if (u) TC_ASSERT_OK(tc_comm_finalize(u));
  if (t) TC_ASSERT_OK(tc_comm_finalize(t));
  TC_ASSERT_OK(tc_comm_finalize(s));
  TC_ASSERT_OK(tc_comm_finalize(c));
  if (u) tc_comm_destroy(u);
  if (t) tc_comm_destroy(t);
  tc_comm_destroy(s);
  tc_comm_destroy(c);
}

TC_TEST(nccl_split_w4) {
  nccl_use_fake();
  tc_spawn(4, split_rank, NULL, 60);
}

/* ---- refusals ---- */

TC_TEST(nccl_unsupported) {
  nccl_use_fake();
  tc_comm_t *c;
  TC_ASSERT_OK(create1("cuda", 0, 5, &c));
  int16_t h[2] = {1, 2};
  int32_t i[2] = {3, 4};
  uint8_t b[2] = {1, 0};
  TC_ASSERT_ERR(tc_all_reduce(c, h, 2, TC_INT16, TC_OP(TC_SUM), NULL, NULL),
                TC_ERR_NOT_SUPPORTED,
                "all_reduce on 'main' (rank 0 of 1): NCCL cannot reduce "
                "dtype int16 (it has no NCCL type): convert to int32 first");
  TC_ASSERT_ERR(tc_reduce(c, i, 2, TC_INT32, TC_OP(TC_BAND), 0, NULL, NULL),
                TC_ERR_NOT_SUPPORTED, "NCCL has no bitwise reductions (BAND)");
  TC_ASSERT_ERR(tc_all_reduce(c, b, 2, TC_BOOL, TC_OP(TC_BXOR), NULL, NULL),
                TC_ERR_NOT_SUPPORTED, "NCCL has no BXOR reduction on bool");
  uint8_t f8[2] = {0x38, 0x40}; /* float8_e4m3fn 1.0, 2.0 */
  TC_ASSERT_ERR(tc_all_reduce(c, f8, 2, TC_FLOAT8_E4M3FN, TC_OP(TC_AVG), NULL, NULL),
                TC_ERR_NOT_SUPPORTED,
                "all_reduce on 'main' (rank 0 of 1): NCCL has no AVG on float8_e4m3fn "
                "(ncclAvg takes integers, float16, bfloat16, float32 and float64): reduce "
                "with SUM and divide, or convert to bfloat16 first");
  TC_ASSERT_ERR(tc_reduce_scatter_single(c, f8, f8, 2, TC_FLOAT8_E5M2,
                                         TC_OP_PREMUL_SUM(0.5), NULL, NULL),
                TC_ERR_NOT_SUPPORTED,
                "NCCL's PREMUL_SUM takes float16, bfloat16, float32 and float64, not "
                "float8_e5m2: convert to bfloat16 first");
  /* still usable; int16 moves as bytes */
  TC_ASSERT_OK(tc_broadcast(c, h, 2, TC_INT16, 0, NULL, NULL));
  TC_ASSERT_OK(tc_all_reduce(c, b, 2, TC_BOOL, TC_OP(TC_BOR), NULL, NULL));
  TC_ASSERT_EQ(b[0], 1);
  TC_ASSERT_EQ(b[1], 0);
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

/* An old NCCL (ncclGetVersion 2.9.9): no bfloat16, no ncclAvg. */
TC_TEST(nccl_old_version) {
  nccl_use_fake();
  setenv("TCFAKE_NCCL_VERSION", "20909", 1);
  tc_comm_t *c;
  TC_ASSERT_OK(create1("cuda", 0, 5, &c));
  float f[2] = {1, 2};
  uint16_t h[2] = {0, 0};
  TC_ASSERT_ERR(tc_all_reduce(c, f, 2, TC_FLOAT32, TC_OP(TC_AVG), NULL, NULL),
                TC_ERR_NOT_SUPPORTED, "AVG needs ncclAvg (NCCL >= 2.10");
  TC_ASSERT_ERR(tc_all_reduce(c, h, 2, TC_BFLOAT16, TC_OP(TC_SUM), NULL, NULL),
                TC_ERR_NOT_SUPPORTED, "NCCL cannot reduce dtype bfloat16");
  uint8_t b[2] = {0x38, 0x40};
  TC_ASSERT_ERR(tc_all_reduce(c, b, 2, TC_FLOAT8_E4M3FN, TC_OP(TC_SUM), NULL, NULL),
                TC_ERR_NOT_SUPPORTED, "NCCL cannot reduce dtype float8_e4m3fn: "
                "ncclFloat8e4m3 needs NCCL >= 2.24 (this is NCCL 20909)");
  TC_ASSERT_OK(tc_all_reduce(c, f, 2, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

/* NCCL 2.23: bfloat16 reduces, the float8 types (ncclFloat8e4m3 and
 * ncclFloat8e5m2 came with 2.24) are refused before anything is enqueued,
 * for every reducing operation; they still move (as bytes). */
TC_TEST(nccl_old_version_fp8) {
  nccl_use_fake();
  setenv("TCFAKE_NCCL_VERSION", "22303", 1);
  tc_comm_t *c;
  TC_ASSERT_OK(create1("cuda", 0, 5, &c));
  uint16_t h[2] = {0x3F80, 0x4000};
  TC_ASSERT_OK(tc_all_reduce(c, h, 2, TC_BFLOAT16, TC_OP(TC_SUM), NULL, NULL));
  uint8_t b[2] = {0x38, 0x40}, o[2] = {0, 0};
  const void *bl[1] = {b};
  TC_ASSERT_ERR(tc_all_reduce(c, b, 2, TC_FLOAT8_E4M3FN, TC_OP(TC_SUM), NULL, NULL),
                TC_ERR_NOT_SUPPORTED, "NCCL cannot reduce dtype float8_e4m3fn: "
                "ncclFloat8e4m3 needs NCCL >= 2.24 (this is NCCL 22303); convert "
                "to bfloat16 first");
  TC_ASSERT_ERR(tc_reduce(c, b, 2, TC_FLOAT8_E5M2, TC_OP(TC_MAX), 0, NULL, NULL),
                TC_ERR_NOT_SUPPORTED, "NCCL cannot reduce dtype float8_e5m2: "
                "ncclFloat8e5m2 needs NCCL >= 2.24");
  TC_ASSERT_ERR(tc_reduce_scatter_single(c, o, b, 2, TC_FLOAT8_E5M2,
                                         TC_OP_PREMUL_SUM(0.5), NULL, NULL),
                TC_ERR_NOT_SUPPORTED, "float8_e5m2");
  TC_ASSERT_ERR(tc_reduce_scatter(c, o, bl, 2, TC_FLOAT8_E4M3FN, TC_OP(TC_AVG),
                                  NULL, NULL),
                TC_ERR_NOT_SUPPORTED, "float8_e4m3fn");
  TC_ASSERT(b[0] == 0x38 && b[1] == 0x40 && o[0] == 0 && o[1] == 0);
  TC_ASSERT_OK(tc_broadcast(c, b, 2, TC_FLOAT8_E4M3FN, 0, NULL, NULL));
  TC_ASSERT_OK(tc_all_gather_single(c, o, b, 2, TC_FLOAT8_E5M2, NULL, NULL));
  TC_ASSERT(o[0] == 0x38 && o[1] == 0x40);
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

/* NCCL 2.24 and later (the fake's default, 2.27.3): the float8 types
 * reduce with SUM, PRODUCT, MIN and MAX; AVG and PREMUL_SUM are refused
 * (NCCL's ncclAvg has no float8 case, and torchcomms' NCCL backend takes
 * PREMUL_SUM on float16, bfloat16, float32 and float64 only). */
TC_TEST(nccl_fp8_reduces) {
  nccl_use_fake();
  tc_comm_t *c;
  TC_ASSERT_OK(create1("cuda", 0, 5, &c));
  uint8_t e4[3] = {0x44, 0x7E, 0xB8}; /* 3, 448, -1 */
  TC_ASSERT_OK(tc_all_reduce(c, e4, 3, TC_FLOAT8_E4M3FN, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT(e4[0] == 0x44 && e4[1] == 0x7E && e4[2] == 0xB8); /* one rank: unchanged */
  TC_ASSERT_ERR(tc_all_reduce(c, e4, 3, TC_FLOAT8_E4M3FN, TC_OP_PREMUL_SUM(0.5), NULL, NULL),
                TC_ERR_NOT_SUPPORTED, "NCCL's PREMUL_SUM takes float16, bfloat16");
  TC_ASSERT_ERR(tc_all_reduce(c, e4, 3, TC_FLOAT8_E4M3FN, TC_OP(TC_AVG), NULL, NULL),
                TC_ERR_NOT_SUPPORTED, "NCCL has no AVG on float8_e4m3fn");
  uint8_t e5[2] = {0x42, 0x7B}; /* 3, 57344 */
  TC_ASSERT_OK(tc_all_reduce(c, e5, 2, TC_FLOAT8_E5M2, TC_OP(TC_MAX), NULL, NULL));
  TC_ASSERT(e5[0] == 0x42 && e5[1] == 0x7B);
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

/* ---- failures ---- */

/* The 3rd NCCL task of each communicator never finishes: the poller times
 * the operation out (1 s), aborts the NCCL communicator and fails what is
 * queued behind it; later operations are refused. */
static void timeout_rank(tc_ctx_t *ctx) {
  tc_comm_t *c = nccl_comm(ctx, "hangs", 30);
  TC_ASSERT_OK(tc_comm_set_timeout(c, 1.0));
  float x[2] = {1, 2};
  TC_ASSERT_OK(tc_all_reduce(c, x, 2, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT_OK(tc_barrier(c, NULL, NULL));
  tc_work_t *w1, *w2;
  double t0 = tc__now();
  TC_ASSERT_OK(tc_all_reduce(c, x, 2, TC_FLOAT32, TC_OP(TC_SUM), NULL, &w1));
  TC_ASSERT_OK(tc_broadcast(c, x, 2, TC_FLOAT32, 0, NULL, &w2));
  TC_ASSERT_ERR(tc_work_wait(w1), TC_ERR_TIMEOUT,
                "all_reduce on 'hangs' (rank ");
  TC_ASSERT_CONTAINS(tc_last_error(), "timed out after 1.0 s waiting for the "
                     "NCCL kernel to finish; the NCCL communicator was aborted");
  double dt = tc__now() - t0;
  TC_ASSERT(dt >= 0.9 && dt < 10);
  TC_ASSERT_EQ(tc_work_status(w1), TC_WORK_TIMEDOUT);
  TC_ASSERT_ERR(tc_work_wait(w2), TC_ERR_ABORTED, "broadcast on 'hangs'");
  TC_ASSERT_CONTAINS(tc_last_error(), "not run: an earlier operation failed");
  tc_work_release(w1);
  tc_work_release(w2);
  TC_ASSERT_ERR(tc_barrier(c, NULL, NULL), TC_ERR_TIMEOUT,
                "barrier on 'hangs'");
  TC_ASSERT_CONTAINS(tc_last_error(), "aborted after an earlier failure");
  TC_ASSERT_ERR(tc_comm_finalize(c), TC_ERR_TIMEOUT, "finalize on 'hangs'");
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(nccl_timeout_w2) {
  nccl_use_fake();
  setenv("TCFAKE_NCCL_FAULT", "hang:3", 1);
  tc_spawn(2, timeout_rank, NULL, 60);
}

/* The 2nd task reports ncclRemoteError (as when a peer dies): the poller
 * sees it through ncclCommGetAsyncError. */
static void remote_rank(tc_ctx_t *ctx) {
  tc_comm_t *c = nccl_comm(ctx, "remote", 30);
  int32_t v[4] = {1, 2, 3, 4};
  TC_ASSERT_OK(tc_all_reduce(c, v, 4, TC_INT32, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT_ERR(tc_all_reduce(c, v, 4, TC_INT32, TC_OP(TC_SUM), NULL, NULL),
                TC_ERR_REMOTE, "all_reduce on 'remote' (rank ");
  TC_ASSERT_CONTAINS(tc_last_error(), "NCCL reported ncclRemoteError");
  TC_ASSERT_CONTAINS(tc_last_error(), "injected remote error");
  TC_ASSERT_ERR(tc_send(c, v, 4, TC_INT32, 1 - ctx->rank, NULL, NULL),
                TC_ERR_REMOTE, "aborted after an earlier failure");
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(nccl_remote_error_w2) {
  nccl_use_fake();
  setenv("TCFAKE_NCCL_FAULT", "remote:2", 1);
  tc_spawn(2, remote_rank, NULL, 60);
}

/* Rank 0 waits on an all_reduce rank 1 never joins, then aborts: the wait
 * returns at once with TC_ERR_ABORTED. */
static void abort_rank(tc_ctx_t *ctx) {
  tc_comm_t *c = nccl_comm(ctx, "aborts", 30);
  float x[2] = {1, 2};
  TC_ASSERT_OK(tc_all_reduce(c, x, 2, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL));
  if (ctx->rank == 0) {
    tc_work_t *w;
    TC_ASSERT_OK(tc_all_reduce(c, x, 2, TC_FLOAT32, TC_OP(TC_SUM), NULL, &w));
    TC_ASSERT_EQ(tc_work_wait_for(w, 0.3), TC_ERR_TIMEOUT); /* still running */
    double t0 = tc__now();
    TC_ASSERT_OK(tc_comm_abort(c));
    TC_ASSERT_ERR(tc_work_wait(w), TC_ERR_ABORTED, "all_reduce on 'aborts'");
    TC_ASSERT_CONTAINS(tc_last_error(), "aborted before the operation finished");
    TC_ASSERT(tc__now() - t0 < 5);
    tc_work_release(w);
    TC_ASSERT_ERR(tc_barrier(c, NULL, NULL), TC_ERR_ABORTED, "aborted");
    TC_ASSERT(tc_comm_is_aborted(c));
  } else {
    struct timespec ts = {1, 0};
    nanosleep(&ts, NULL);
    TC_ASSERT_OK(tc_comm_abort(c));
  }
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(nccl_abort_w2) {
  nccl_use_fake();
  tc_spawn(2, abort_rank, NULL, 60);
}

/* Creation with a missing rank ends at the bootstrap deadline: rank 0
 * waits in ncclCommInitRankConfig (polled), rank 1 for the unique id. */
static void init_timeout_rank(tc_ctx_t *ctx) {
  int absent = *(int *)ctx->arg;
  if (ctx->rank == absent) return;
  tc_comm_t *c;
  double t0 = tc__now();
  int rc = nccl_try_comm(ctx, "lonely", 1.0, &c);
  TC_ASSERT_EQ(rc, TC_ERR_TIMEOUT);
  TC_ASSERT(tc__now() - t0 < 10);
  if (ctx->rank == 0)
    TC_ASSERT_CONTAINS(tc_last_error(), "ncclCommInitRankConfig did not "
                       "finish within 1.0 s (NCCL connecting the 2 ranks");
  else
    TC_ASSERT_CONTAINS(tc_last_error(), "did not receive the NCCL unique id "
                       "of rank 0 from the store within 1.0 s");
}

TC_TEST(nccl_init_timeout) {
  nccl_use_fake();
  setenv("TCFAKE_NCCL_TIMEOUT", "3", 1);
  int absent = 1;
  tc_spawn(2, init_timeout_rank, &absent, 60);
  absent = 0;
  tc_spawn(2, init_timeout_rank, &absent, 60);
}

/* test_cpu_direct.c -- drives the cpu backend through its table
 * (tc__cpu_backend) with a tiny host of its own, independent of the core's
 * op path: every collective at world sizes 1..4 checked exactly, bitwise
 * identical float results, queue order, a killed peer, timeouts, abort, a
 * stray connection with a bad token, and a count mismatch. */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "backends/cpu/cpu.h"
#include "core/core.h" /* tc__op_describe: descriptors as the core builds them */
#include "runner.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
/* ranks leave with _exit, which skips LeakSanitizer's exit check */
#define LEAK_CHECK() __lsan_do_leak_check()
#else
#define LEAK_CHECK() ((void)0)
#endif

/* ---- the test's host ---- */

typedef struct twork {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int started, done, rc;
  char msg[1024];
  char prefix[256]; /* "torchcomms: <op> on '<comm>' (rank r of n): " */
} twork_t;

static char d_logbuf[4096];
static pthread_mutex_t d_logmu = PTHREAD_MUTEX_INITIALIZER;

static void h_started(tc_work_t *w) {
  twork_t *t = (twork_t *)w;
  pthread_mutex_lock(&t->mu);
  t->started = 1;
  pthread_mutex_unlock(&t->mu);
}

static void h_complete(tc_work_t *w, int rc, const char *msg) {
  twork_t *t = (twork_t *)w;
  pthread_mutex_lock(&t->mu);
  t->rc = rc;
  /* the reason, with the prefix the core's host adds */
  snprintf(t->msg, sizeof t->msg, "%s%s", msg ? t->prefix : "", msg ? msg : "");
  t->done = 1;
  pthread_cond_broadcast(&t->cv);
  pthread_mutex_unlock(&t->mu);
}

static void h_log(int level, const char *fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&d_logmu);
  size_t l = strlen(d_logbuf);
  snprintf(d_logbuf + l, sizeof d_logbuf - l, "%s\n", line);
  pthread_mutex_unlock(&d_logmu);
  if (level <= 1) fprintf(stderr, "  [log %d] %s\n", level, line);
}

static const tc_backend_host_t d_host = {
    .size = sizeof(tc_backend_host_t),
    .work_started = h_started,
    .work_complete = h_complete,
    .store_set = tc_store_set,
    .store_get = tc_store_get,
    .store_add = tc_store_add,
    .free = tc_free,
    .log = h_log,
};

static void twork_init(twork_t *t) {
  memset(t, 0, sizeof *t);
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_mutex_init(&t->mu, NULL);
  pthread_cond_init(&t->cv, &a);
  pthread_condattr_destroy(&a);
}

static void twork_destroy(twork_t *t) {
  pthread_mutex_destroy(&t->mu);
  pthread_cond_destroy(&t->cv);
}

/* Waits for completion; fails the test past timeout_s. */
static int twork_wait(twork_t *t, double timeout_s) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  double dl = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + timeout_s;
  pthread_mutex_lock(&t->mu);
  while (!t->done) {
    struct timespec d = {(time_t)dl, (long)((dl - (double)(time_t)dl) * 1e9)};
    if (pthread_cond_timedwait(&t->cv, &t->mu, &d) == ETIMEDOUT && !t->done) {
      pthread_mutex_unlock(&t->mu);
      tc_test_fail(__FILE__, __LINE__, "work not completed within %.0f s", timeout_s);
    }
  }
  int rc = t->rc;
  pthread_mutex_unlock(&t->mu);
  return rc;
}

/* ---- a communicator driven through the table ---- */

typedef struct dcomm {
  void *b;
  char name[64];
  int rank, size;
  double timeout_s;
  char msg[1024]; /* message of the last failed op */
} dcomm_t;

static int d_try_init(tc_ctx_t *ctx, const char *name, double timeout_s, dcomm_t *d,
                      char *err, size_t errlen) {
  tc_store_t *base = tc_ctx_store(ctx), *s = NULL;
  TC_ASSERT_OK(tc_store_prefix(base, name, &s));
  tc_store_release(base);
  memset(d, 0, sizeof *d);
  snprintf(d->name, sizeof d->name, "%s", name);
  d->rank = ctx->rank;
  d->size = ctx->size;
  d->timeout_s = timeout_s;
  (void)tc__settings_reload(NULL, 0); /* as tc_comm_create: the settings now set */
  tc_backend_init_args_t a = {.size = sizeof a, .host = &d_host, .comm_name = name,
                              .device = "cpu", .device_index = -1, .rank = ctx->rank,
                              .world_size = ctx->size, .timeout_s = timeout_s,
                              .store = s, .advertise_addr = "127.0.0.1"};
  int rc = tc__cpu_backend.init(&a, &d->b, err, errlen);
  tc_store_release(s); /* the backend only borrows it during init */
  return rc;
}

static dcomm_t *d_init(tc_ctx_t *ctx, const char *name, double timeout_s) {
  static dcomm_t d;
  char err[1024] = "";
  int rc = d_try_init(ctx, name, timeout_s, &d, err, sizeof err);
  if (rc != TC_OK)
    tc_test_fail(__FILE__, __LINE__, "init returned %s: %s", tc_status_name(rc), err);
  return &d;
}

/* Posts as the core posts an asynchronous call (the caller holds the work
 * and waits later): a synchronous one may run to completion inside post. */
static void d_post(dcomm_t *d, tc_backend_op_t *op, twork_t *w) {
  op->size = sizeof *op;
  op->flags |= TC_BACKEND_OP_ASYNC;
  if (op->timeout_s <= 0) op->timeout_s = d->timeout_s;
  twork_init(w);
  snprintf(w->prefix, sizeof w->prefix, "torchcomms: %s on '%s' (rank %d of %d): ",
           tc_op_name(op->type), d->name, d->rank, d->size);
  char err[512] = "";
  int rc = tc__cpu_backend.post(d->b, op, (tc_work_t *)w, err, sizeof err);
  if (rc != TC_OK)
    tc_test_fail(__FILE__, __LINE__, "post returned %s: %s", tc_status_name(rc), err);
}

/* The descriptor of a call as the core builds it (ops.c): blocks resolved
 * from the call's form into `arrays` (freed by the caller). */
static tc_backend_op_t d_describe(dcomm_t *d, tc__op_args_t a, double timeout_s,
                                  void **arrays) {
  tc_backend_op_t op;
  size_t need = tc__op_arrays_size(&a, d->rank, d->size);
  *arrays = need ? aligned_alloc(16, (need + 15) & ~(size_t)15) : NULL;
  tc__op_describe(&a, d->rank, d->size, *arrays, &op);
  op.timeout_s = timeout_s;
  return op;
}

/* Runs one call synchronously; returns its status (message in d->msg). */
static int d_run_t(dcomm_t *d, tc__op_args_t a, double timeout_s) {
  twork_t w;
  void *arrays;
  tc_backend_op_t op = d_describe(d, a, timeout_s, &arrays);
  d_post(d, &op, &w);
  int rc = twork_wait(&w, op.timeout_s + 30);
  snprintf(d->msg, sizeof d->msg, "%s", w.msg);
  twork_destroy(&w);
  free(arrays);
  return rc;
}
static int d_run(dcomm_t *d, tc__op_args_t a) { return d_run_t(d, a, 0); }

/* finalize, its reason with the prefix the core adds (in d->msg). */
static int d_fin(dcomm_t *d) {
  char err[768] = "";
  int rc = tc__cpu_backend.finalize(d->b, err, sizeof err);
  snprintf(d->msg, sizeof d->msg, "torchcomms: finalize on '%s' (rank %d of %d): %s",
           d->name, d->rank, d->size, err);
  return rc;
}

#define D_OK(d, ...)                                                           \
  do {                                                                         \
    int rc_ = d_run((d), (tc__op_args_t){__VA_ARGS__});                        \
    if (rc_ != TC_OK)                                                          \
      tc_test_fail(__FILE__, __LINE__, "op returned %s: %s",                   \
                   tc_status_name(rc_), (d)->msg);                             \
  } while (0)

static void d_finalize(dcomm_t *d) {
  int rc = d_fin(d);
  if (rc != TC_OK)
    tc_test_fail(__FILE__, __LINE__, "finalize returned %s: %s", tc_status_name(rc),
                 d->msg);
  tc__cpu_backend.destroy(d->b);
  LEAK_CHECK();
}

/* Prints an error text when TC_TEST_VERBOSE is set (to read the messages). */
static void show(const char *what, const char *msg) {
  if (getenv("TC_TEST_VERBOSE")) fprintf(stderr, "  [%s] %s\n", what, msg);
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  TC_ASSERT(p != NULL);
  return p;
}

/* Checks buf[i] == expected (exactly), printing the first difference. */
static void check_eq(const void *buf, const void *exp, size_t count, tc_dtype_t dt,
                     const char *what, int rank) {
  for (size_t i = 0; i < count; i++) {
    double a = tc_get(buf, i, dt), b = tc_get(exp, i, dt);
    if (a != b)
      tc_test_fail(__FILE__, __LINE__, "rank %d: %s %s[%zu] = %.9g, expected %.9g", rank,
                   what, tc_dtype_name(dt), i, a, b);
  }
}

/* The reduction over ranks of tc_fill(.., rank, seed), computed locally. */
static void expect_reduce(void *out, size_t count, tc_dtype_t dt, int n, int seed,
                          tc_redop_t op) {
  size_t es = tc_dtype_size(dt);
  void *tmp = xmalloc(count * es);
  for (size_t i = 0; i < count; i++) tc_set(out, i, dt, 0);
  for (int r = 0; r < n; r++) {
    tc_fill(tmp, count, dt, r, seed);
    for (size_t i = 0; i < count; i++) {
      double v = tc_get(tmp, i, dt), a = tc_get(out, i, dt);
      if (op.type == TC_PREMUL_SUM) v *= op.factor;
      double res = r == 0 ? v
                   : op.type == TC_MAX ? (v > a ? v : a)
                   : op.type == TC_PRODUCT ? a * v
                                           : a + v;
      tc_set(out, i, dt, res);
    }
  }
  if (op.type == TC_AVG)
    for (size_t i = 0; i < count; i++) {
      double a = tc_get(out, i, dt);
      if (dt == TC_INT32) tc_set(out, i, dt, (double)((int32_t)a / n));
      else tc_set(out, i, dt, a / n);
    }
  free(tmp);
}

/* ---- all_reduce, exact, world sizes 1..4 ---- */

static const size_t ar_counts[] = {0, 1, 7, 1000, 16385, (1u << 20) + 3};

static void all_reduce_rank(tc_ctx_t *ctx) {
  dcomm_t *d = d_init(ctx, "ar", 30);
  const tc_dtype_t dts[] = {TC_FLOAT32, TC_INT32};
  const tc_redop_t ops[] = {TC_OP(TC_SUM), TC_OP(TC_MAX), TC_OP(TC_AVG),
                            TC_OP_PREMUL_SUM(0.5), TC_OP(TC_PRODUCT)};
  int seed = 1;
  for (size_t di = 0; di < 2; di++)
    for (size_t oi = 0; oi < sizeof ops / sizeof ops[0]; oi++)
      for (size_t ci = 0; ci < sizeof ar_counts / sizeof ar_counts[0]; ci++) {
        tc_dtype_t dt = dts[di];
        tc_redop_t op = ops[oi];
        size_t count = ar_counts[ci];
        if (op.type == TC_PREMUL_SUM && dt == TC_INT32) continue;
        if (op.type != TC_SUM && count > 20000) continue; /* keep it quick */
        if (op.type == TC_AVG && dt == TC_FLOAT32 && ctx->size == 3) continue; /* inexact */
        size_t es = tc_dtype_size(dt);
        void *buf = xmalloc(count * es), *exp = xmalloc(count * es);
        tc_fill(buf, count, dt, ctx->rank, seed);
        expect_reduce(exp, count, dt, ctx->size, seed, op);
        D_OK(d, .type = TC_OP_ALL_REDUCE, .dtype = dt, .redop = op, .count = count,
             .recvbuf = buf);
        char what[64];
        snprintf(what, sizeof what, "all_reduce %s count %zu", tc_redop_name(op.type), count);
        check_eq(buf, exp, count, dt, what, ctx->rank);
        free(buf);
        free(exp);
        seed++;
      }
  d_finalize(d);
}

TC_TEST(cpu_direct_all_reduce_1) { tc_spawn(1, all_reduce_rank, NULL, 60); }
TC_TEST(cpu_direct_all_reduce_2) { tc_spawn(2, all_reduce_rank, NULL, 60); }
TC_TEST(cpu_direct_all_reduce_3) { tc_spawn(3, all_reduce_rank, NULL, 60); }
TC_TEST(cpu_direct_all_reduce_4) { tc_spawn(4, all_reduce_rank, NULL, 90); }

/* ---- float results are bitwise identical on every rank ---- */

static uint64_t fnv(const void *p, size_t n) {
  const unsigned char *b = p;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

static void identical_rank(tc_ctx_t *ctx) {
  dcomm_t *d = d_init(ctx, "ident", 30);
  const size_t counts[] = {3, 1000, 300001};
  for (size_t ci = 0; ci < 3; ci++) {
    size_t count = counts[ci];
    float *buf = xmalloc(count * sizeof *buf);
    srand(ctx->rank * 7 + 1);
    for (size_t i = 0; i < count; i++) buf[i] = (float)rand() / (float)RAND_MAX * 3.1f - 1.0f;
    D_OK(d, .type = TC_OP_ALL_REDUCE, .dtype = TC_FLOAT32, .redop = TC_OP(TC_SUM),
         .count = count, .recvbuf = buf);
    uint64_t h = fnv(buf, count * sizeof *buf), all[8];
    D_OK(d, .type = TC_OP_ALL_GATHER_SINGLE, .dtype = TC_INT64, .count = 1, .sendbuf = &h,
         .recvbuf = all);
    for (int r = 0; r < ctx->size; r++)
      if (all[r] != h)
        tc_test_fail(__FILE__, __LINE__, "count %zu: rank %d's result differs from rank %d's",
                     count, r, ctx->rank);
    free(buf);
  }
  d_finalize(d);
}

TC_TEST(cpu_direct_identical_floats) {
  tc_spawn(3, identical_rank, NULL, 60);
  tc_spawn(4, identical_rank, NULL, 60);
}

/* ---- every other collective ---- */

static void gather_family(dcomm_t *d, size_t count, int seed) {
  int r = d->rank, n = d->size;
  tc_dtype_t dt = TC_INT32;
  int32_t *in = xmalloc(count * 4), *out = xmalloc(n * count * 4), *exp = xmalloc(n * count * 4);
  tc_fill(in, count, dt, r, seed);
  for (int i = 0; i < n; i++) tc_fill(exp + i * count, count, dt, i, seed);
  /* all_gather_single, then in place */
  D_OK(d, .type = TC_OP_ALL_GATHER_SINGLE, .dtype = dt, .count = count, .sendbuf = in,
       .recvbuf = out);
  check_eq(out, exp, n * count, dt, "all_gather_single", r);
  memset(out, 0, n * count * 4);
  memcpy(out + r * count, in, count * 4);
  D_OK(d, .type = TC_OP_ALL_GATHER_SINGLE, .dtype = dt, .count = count,
       .sendbuf = out + r * count, .recvbuf = out);
  check_eq(out, exp, n * count, dt, "all_gather_single in place", r);
  /* all_gather (list) */
  void *bufs[8];
  for (int i = 0; i < n; i++) bufs[i] = xmalloc(count * 4);
  D_OK(d, .type = TC_OP_ALL_GATHER, .dtype = dt, .count = count, .sendbuf = in,
       .recvbufs = bufs);
  for (int i = 0; i < n; i++) check_eq(bufs[i], exp + i * count, count, dt, "all_gather", r);
  /* all_gather_v: rank i contributes count + i elements (0 for rank 1) */
  size_t vc[8];
  for (int i = 0; i < n; i++) vc[i] = i == 1 ? 0 : count + (size_t)i;
  int32_t *vin = xmalloc((count + n) * 4);
  tc_fill(vin, vc[r], dt, r, seed + 1);
  for (int i = 0; i < n; i++) {
    free(bufs[i]);
    bufs[i] = xmalloc((count + n) * 4);
  }
  D_OK(d, .type = TC_OP_ALL_GATHER_V, .dtype = dt, .count = vc[r], .sendbuf = vin,
       .recvbufs = bufs, .recvcounts = vc);
  for (int i = 0; i < n; i++) {
    tc_fill(vin, vc[i], dt, i, seed + 1);
    check_eq(bufs[i], vin, vc[i], dt, "all_gather_v", r);
  }
  for (int i = 0; i < n; i++) free(bufs[i]);
  /* gather / gather_single at root n-1, scatter from root 0 */
  int root = n - 1;
  memset(out, 0, n * count * 4);
  D_OK(d, .type = TC_OP_GATHER_SINGLE, .dtype = dt, .count = count, .root = root,
       .sendbuf = in, .recvbuf = r == root ? out : NULL);
  if (r == root) check_eq(out, exp, n * count, dt, "gather_single", r);
  for (int i = 0; i < n; i++) bufs[i] = r == root ? xmalloc(count * 4) : NULL;
  D_OK(d, .type = TC_OP_GATHER, .dtype = dt, .count = count, .root = root, .sendbuf = in,
       .recvbufs = r == root ? bufs : NULL);
  if (r == root)
    for (int i = 0; i < n; i++) check_eq(bufs[i], exp + i * count, count, dt, "gather", r);
  for (int i = 0; i < n; i++) free(bufs[i]);
  const void *sb[8];
  for (int i = 0; i < n; i++) sb[i] = exp + i * count;
  memset(out, 0, count * 4);
  D_OK(d, .type = TC_OP_SCATTER, .dtype = dt, .count = count, .root = 0,
       .sendbufs = r == 0 ? sb : NULL, .recvbuf = out);
  check_eq(out, exp + r * count, count, dt, "scatter", r);
  free(in);
  free(out);
  free(exp);
  free(vin);
}

static void reduce_scatter_family(dcomm_t *d, size_t count, int seed, tc_redop_t op) {
  int r = d->rank, n = d->size;
  tc_dtype_t dt = TC_FLOAT32;
  float *in = xmalloc(n * count * 4), *exp = xmalloc(n * count * 4), *out = xmalloc(count * 4);
  tc_fill(in, n * count, dt, r, seed);
  expect_reduce(exp, n * count, dt, n, seed, op);
  D_OK(d, .type = TC_OP_REDUCE_SCATTER_SINGLE, .dtype = dt, .redop = op, .count = count,
       .sendbuf = in, .recvbuf = out);
  check_eq(out, exp + r * count, count, dt, "reduce_scatter_single", r);
  const void *sb[8];
  for (int i = 0; i < n; i++) sb[i] = in + i * count;
  D_OK(d, .type = TC_OP_REDUCE_SCATTER, .dtype = dt, .redop = op, .count = count,
       .sendbufs = sb, .recvbuf = out);
  check_eq(out, exp + r * count, count, dt, "reduce_scatter", r);
  /* in place: the output is the own block of the input */
  D_OK(d, .type = TC_OP_REDUCE_SCATTER_SINGLE, .dtype = dt, .redop = op, .count = count,
       .sendbuf = in, .recvbuf = in + r * count);
  check_eq(in + r * count, exp + r * count, count, dt, "reduce_scatter_single in place", r);
  /* _v: block i has count - i elements (at least 0) */
  size_t vc[8];
  for (int i = 0; i < n; i++) vc[i] = count > (size_t)i ? count - (size_t)i : 0;
  tc_fill(in, n * count, dt, r, seed); /* in was overwritten */
  D_OK(d, .type = TC_OP_REDUCE_SCATTER_V, .dtype = dt, .redop = op, .count = vc[r],
       .sendbufs = sb, .sendcounts = vc, .recvbuf = out);
  check_eq(out, exp + r * count, vc[r], dt, "reduce_scatter_v", r);
  free(in);
  free(exp);
  free(out);
}

static void all_to_all_family(dcomm_t *d, size_t count, int seed) {
  int r = d->rank, n = d->size;
  tc_dtype_t dt = TC_INT32;
  int32_t *in = xmalloc(n * count * 4), *out = xmalloc(n * count * 4), *exp = xmalloc(n * count * 4);
  tc_fill(in, n * count, dt, r, seed);
  int32_t *tmp = xmalloc(n * count * 4);
  for (int j = 0; j < n; j++) { /* block j of exp = block r of rank j's input */
    tc_fill(tmp, n * count, dt, j, seed);
    memcpy(exp + j * count, tmp + r * count, count * 4);
  }
  D_OK(d, .type = TC_OP_ALL_TO_ALL_SINGLE, .dtype = dt, .count = count, .sendbuf = in,
       .recvbuf = out);
  check_eq(out, exp, n * count, dt, "all_to_all_single", r);
  memcpy(out, in, n * count * 4);
  D_OK(d, .type = TC_OP_ALL_TO_ALL_SINGLE, .dtype = dt, .count = count, .sendbuf = out,
       .recvbuf = out);
  check_eq(out, exp, n * count, dt, "all_to_all_single in place", r);
  /* v_single: rank i sends (i + j) % 3 * count / 2 elements to rank j */
  size_t sc[8], rc[8], so = 0, ro = 0;
  for (int j = 0; j < n; j++) {
    sc[j] = (size_t)((r + j) % 3) * count / 2;
    rc[j] = (size_t)((j + r) % 3) * count / 2;
  }
  int32_t *vin = xmalloc(3 * n * count * 4), *vout = xmalloc(3 * n * count * 4);
  for (int j = 0; j < n; j++) so += sc[j];
  for (size_t i = 0; i < so; i++) vin[i] = r * 1000000 + (int32_t)i;
  D_OK(d, .type = TC_OP_ALL_TO_ALL_V_SINGLE, .dtype = dt, .sendbuf = vin, .sendcounts = sc,
       .recvbuf = vout, .recvcounts = rc);
  for (int j = 0; j < n; j++) { /* rank j's send offset to us */
    size_t off = 0;
    for (int k = 0; k < r; k++) off += (size_t)((j + k) % 3) * count / 2;
    for (size_t i = 0; i < rc[j]; i++)
      if (vout[ro + i] != j * 1000000 + (int32_t)(off + i))
        tc_test_fail(__FILE__, __LINE__, "rank %d: all_to_all_v_single from %d [%zu] = %d",
                     r, j, i, vout[ro + i]);
    ro += rc[j];
  }
  /* list form */
  const void *sb[8];
  void *rb[8];
  size_t cc[8];
  for (int j = 0; j < n; j++) {
    sb[j] = in + j * count;
    rb[j] = out + j * count;
    cc[j] = count;
  }
  memset(out, 0, n * count * 4);
  tc_fill(in, n * count, dt, r, seed);
  D_OK(d, .type = TC_OP_ALL_TO_ALL, .dtype = dt, .sendbufs = sb, .sendcounts = cc,
       .recvbufs = rb, .recvcounts = cc);
  check_eq(out, exp, n * count, dt, "all_to_all", r);
  free(in);
  free(out);
  free(exp);
  free(tmp);
  free(vin);
  free(vout);
}

static void bcast_reduce_family(dcomm_t *d, size_t count, int seed) {
  int r = d->rank, n = d->size;
  tc_dtype_t dt = TC_FLOAT32;
  float *buf = xmalloc(count * 4), *exp = xmalloc(count * 4), *orig = xmalloc(count * 4);
  for (int root = 0; root < n; root += (n > 2 ? n - 1 : 1)) {
    tc_fill(buf, count, dt, r, seed);
    tc_fill(exp, count, dt, root, seed);
    D_OK(d, .type = TC_OP_BROADCAST, .dtype = dt, .count = count, .root = root, .recvbuf = buf);
    check_eq(buf, exp, count, dt, "broadcast", r);
    const tc_redop_t ops[] = {TC_OP(TC_SUM), TC_OP_PREMUL_SUM(2.0), TC_OP(TC_MAX)};
    for (int o = 0; o < 3; o++) {
      tc_fill(buf, count, dt, r, seed);
      memcpy(orig, buf, count * 4);
      expect_reduce(exp, count, dt, n, seed, ops[o]);
      D_OK(d, .type = TC_OP_REDUCE, .dtype = dt, .redop = ops[o], .count = count, .root = root,
           .recvbuf = buf);
      if (r == root) check_eq(buf, exp, count, dt, "reduce at root", r);
      else check_eq(buf, orig, count, dt, "reduce: a non-root buffer changed", r);
    }
  }
  free(buf);
  free(exp);
  free(orig);
}

static void p2p_family(dcomm_t *d, size_t count, int seed) {
  int r = d->rank, n = d->size;
  tc_dtype_t dt = TC_INT32;
  int32_t *a = xmalloc(count * 4), *b = xmalloc(count * 4), *e = xmalloc(count * 4);
  int right = (r + 1) % n, left = (r + n - 1) % n;
  /* send/recv around the ring: even ranks send first */
  if (n > 1) {
    tc_fill(a, count, dt, r, seed);
    tc_fill(e, count, dt, left, seed);
    for (int phase = 0; phase < 2; phase++) {
      if ((r % 2 == 0) == (phase == 0))
        D_OK(d, .type = TC_OP_SEND, .dtype = dt, .count = count, .root = right, .sendbuf = a);
      else
        D_OK(d, .type = TC_OP_RECV, .dtype = dt, .count = count, .root = left, .recvbuf = b);
    }
    check_eq(b, e, count, dt, "send/recv", r);
  }
  /* batch: to both neighbours and to itself, several messages per pair */
  int32_t *s2 = xmalloc(count * 4), *r2 = xmalloc(count * 4), *self = xmalloc(count * 4);
  tc_fill(a, count, dt, r, seed);
  tc_fill(s2, count, dt, r, seed + 7);
  tc_p2p_t p[6];
  int np = 0;
  p[np++] = (tc_p2p_t){.is_send = 0, .peer = left, .buf = b, .count = count, .dtype = dt};
  p[np++] = (tc_p2p_t){.is_send = 1, .peer = right, .buf = a, .count = count, .dtype = dt};
  p[np++] = (tc_p2p_t){.is_send = 1, .peer = right, .buf = s2, .count = count, .dtype = dt};
  p[np++] = (tc_p2p_t){.is_send = 0, .peer = left, .buf = r2, .count = count, .dtype = dt};
  p[np++] = (tc_p2p_t){.is_send = 1, .peer = r, .buf = s2, .count = count, .dtype = dt};
  p[np++] = (tc_p2p_t){.is_send = 0, .peer = r, .buf = self, .count = count, .dtype = dt};
  D_OK(d, .type = TC_OP_BATCH, .p2p = p, .num_p2p = (size_t)np);
  tc_fill(e, count, dt, left, seed);
  check_eq(b, e, count, dt, "batch first message", r);
  tc_fill(e, count, dt, left, seed + 7);
  check_eq(r2, e, count, dt, "batch second message", r);
  check_eq(self, s2, count, dt, "batch self", r);
  free(a);
  free(b);
  free(e);
  free(s2);
  free(r2);
  free(self);
}

static void collectives_rank(tc_ctx_t *ctx) {
  dcomm_t *d = d_init(ctx, "coll", 30);
  const size_t counts[] = {1, 5, 1000, 70001};
  int seed = 3;
  for (size_t ci = 0; ci < 4; ci++, seed += 10) {
    size_t count = counts[ci];
    gather_family(d, count, seed);
    reduce_scatter_family(d, count, seed, TC_OP(TC_SUM));
    reduce_scatter_family(d, count, seed + 1, TC_OP_PREMUL_SUM(0.5));
    all_to_all_family(d, count, seed);
    bcast_reduce_family(d, count, seed);
    p2p_family(d, count, seed);
    D_OK(d, .type = TC_OP_BARRIER);
  }
  /* large broadcast / reduce: segmented paths */
  bcast_reduce_family(d, (3u << 20) / 4 + 5, 99);
  reduce_scatter_family(d, (1u << 19) + 3, 98, TC_OP(TC_AVG));
  /* count 0 everywhere */
  D_OK(d, .type = TC_OP_BROADCAST, .dtype = TC_INT8, .count = 0, .root = 0, .recvbuf = NULL);
  D_OK(d, .type = TC_OP_ALL_GATHER_SINGLE, .dtype = TC_INT8, .count = 0);
  D_OK(d, .type = TC_OP_ALL_TO_ALL_SINGLE, .dtype = TC_INT8, .count = 0);
  /* the queue runs ops in post order: 64 async all_reduces, then wait */
  enum { NQ = 64 };
  static twork_t w[NQ];
  static tc_backend_op_t ops[NQ];
  static void *arrays[NQ];
  static int32_t v[NQ][3];
  for (int i = 0; i < NQ; i++) {
    for (int k = 0; k < 3; k++) v[i][k] = i * 10 + k + ctx->rank;
    ops[i] = d_describe(d, (tc__op_args_t){.type = TC_OP_ALL_REDUCE, .dtype = TC_INT32,
                                           .redop = TC_OP(TC_SUM), .count = 3,
                                           .recvbuf = v[i]}, 0, &arrays[i]);
    d_post(d, &ops[i], &w[i]);
  }
  int n = ctx->size;
  for (int i = 0; i < NQ; i++) {
    TC_ASSERT_EQ(twork_wait(&w[i], 30), TC_OK);
    TC_ASSERT(w[i].started);
    for (int k = 0; k < 3; k++) TC_ASSERT_EQ(v[i][k], n * (i * 10 + k) + n * (n - 1) / 2);
    twork_destroy(&w[i]);
    free(arrays[i]);
  }
  d_finalize(d);
}

TC_TEST(cpu_direct_collectives_1) { tc_spawn(1, collectives_rank, NULL, 60); }
TC_TEST(cpu_direct_collectives_2) { tc_spawn(2, collectives_rank, NULL, 60); }
TC_TEST(cpu_direct_collectives_3) { tc_spawn(3, collectives_rank, NULL, 90); }
TC_TEST(cpu_direct_collectives_4) { tc_spawn(4, collectives_rank, NULL, 120); }

/* Blocks large enough for streaming stores (TORCHCOMMS_CPU_STREAM_BYTES,
 * here 1 MiB) through the big halves (single copy off), at offsets that are
 * no multiple of 64: all_gathers out of place (the halves take the own
 * block from the send buffer), in place and as a list (from the output);
 * all_to_alls; broadcasts. Then the same just below the threshold (plain
 * copies, the own all_gather block through the output). */
static void big_copy_rank(tc_ctx_t *ctx) {
  setenv("TORCHCOMMS_CPU_STREAM_BYTES", "1M", 1);
  setenv("TORCHCOMMS_CPU_CMA_BYTES", "0", 1);
  dcomm_t *d = d_init(ctx, "bigcopy", 60);
  TC_ASSERT_EQ(((cpu_comm_t *)d->b)->stream_min, (size_t)1 << 20);
  size_t count = (1u << 20) / 4 + 7;
  gather_family(d, count, 97);
  all_to_all_family(d, count, 96);
  bcast_reduce_family(d, count, 95);
  count = (1u << 20) / 4 - 9;
  gather_family(d, count, 94);
  all_to_all_family(d, count, 93);
  bcast_reduce_family(d, count, 92);
  d_finalize(d);
}
TC_TEST(cpu_direct_streaming_copies) { tc_spawn(2, big_copy_rank, NULL, 120); }

/* The streaming threshold when TORCHCOMMS_CPU_STREAM_BYTES is unset: 8 MiB,
 * or the L3 / (8 x ranks) when that is larger (cpu.h). */
TC_TEST(cpu_direct_stream_threshold) {
  TC_ASSERT_EQ(tc__cpu_stream_min(0, 2), (size_t)8 << 20);
  TC_ASSERT_EQ(tc__cpu_stream_min((size_t)32 << 20, 2), (size_t)8 << 20);
  TC_ASSERT_EQ(tc__cpu_stream_min((size_t)128 << 20, 2), (size_t)8 << 20);
  TC_ASSERT_EQ(tc__cpu_stream_min(((size_t)128 << 20) + 16, 2), ((size_t)8 << 20) + 1);
  TC_ASSERT_EQ(tc__cpu_stream_min((size_t)480 << 20, 2), (size_t)30 << 20);
  TC_ASSERT_EQ(tc__cpu_stream_min((size_t)480 << 20, 4), (size_t)15 << 20);
  TC_ASSERT_EQ(tc__cpu_stream_min((size_t)480 << 20, 8), (size_t)8 << 20);
  TC_ASSERT_EQ(tc__cpu_stream_min((size_t)480 << 20, 1), (size_t)60 << 20);
}

/* The L3's size from a sysfs-like cache directory (tc__cpu_llc_bytes):
 * the level-3 entry's size with its K/M/G suffix; 0 where the directory
 * has no level-3 entry or does not exist; the scan stops at the first
 * missing indexK. */
static void llc_put(const char *dir, int i, const char *level, const char *size) {
  char path[512];
  snprintf(path, sizeof path, "%s/index%d", dir, i);
  TC_ASSERT_EQ(mkdir(path, 0700), 0);
  snprintf(path, sizeof path, "%s/index%d/level", dir, i);
  FILE *f = fopen(path, "w");
  TC_ASSERT(f != NULL);
  fprintf(f, "%s\n", level);
  fclose(f);
  snprintf(path, sizeof path, "%s/index%d/size", dir, i);
  TC_ASSERT((f = fopen(path, "w")) != NULL);
  fprintf(f, "%s\n", size);
  fclose(f);
}
TC_TEST(cpu_direct_llc_from_sysfs) {
  char dir[] = "/tmp/tc_llc_XXXXXX", sub[600];
  TC_ASSERT(mkdtemp(dir));
  TC_ASSERT_EQ(tc__cpu_llc_bytes(dir), (size_t)0); /* no entries */
  TC_ASSERT_EQ(tc__cpu_llc_bytes("/nonexistent/tc_llc"), (size_t)0);
  llc_put(dir, 0, "1", "32K");
  llc_put(dir, 1, "1", "32K");
  llc_put(dir, 2, "2", "1024K");
  TC_ASSERT_EQ(tc__cpu_llc_bytes(dir), (size_t)0); /* no level 3 */
  llc_put(dir, 3, "3", "32768K");
  TC_ASSERT_EQ(tc__cpu_llc_bytes(dir), (size_t)32 << 20);
  llc_put(dir, 5, "3", "1G"); /* after a gap: not read */
  TC_ASSERT_EQ(tc__cpu_llc_bytes(dir), (size_t)32 << 20);
  llc_put(dir, 4, "3", "480M"); /* two level-3 entries: the larger */
  TC_ASSERT_EQ(tc__cpu_llc_bytes(dir), (size_t)1 << 30);
  TC_ASSERT_EQ(tc__cpu_stream_min(tc__cpu_llc_bytes(dir), 2), (size_t)64 << 20);
  for (int i = 0; i <= 5; i++) {
    snprintf(sub, sizeof sub, "%s/index%d/level", dir, i);
    unlink(sub);
    snprintf(sub, sizeof sub, "%s/index%d/size", dir, i);
    unlink(sub);
    snprintf(sub, sizeof sub, "%s/index%d", dir, i);
    rmdir(sub);
  }
  TC_ASSERT_EQ(rmdir(dir), 0);
}

/* ---- failures ---- */

typedef struct {
  _Atomic double t;
  _Atomic int flag;
} shared_t;

static shared_t *shared_new(void) {
  shared_t *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  TC_ASSERT(s != MAP_FAILED);
  memset(s, 0, sizeof *s);
  return s;
}

static void killed_rank(tc_ctx_t *ctx) {
  shared_t *sh = ctx->arg;
  dcomm_t *d = d_init(ctx, "kill", 30);
  float buf[2048];
  for (int it = 0;; it++) {
    if (ctx->rank == 2 && it == 30) {
      sh->t = tc__now();
      raise(SIGKILL);
    }
    for (int i = 0; i < 2048; i++) buf[i] = 1.0f;
    double t0 = tc__now();
    int rc = d_run(d, (tc__op_args_t){.type = TC_OP_ALL_REDUCE, .dtype = TC_FLOAT32,
                                        .redop = TC_OP(TC_SUM), .count = it % 2 ? 2048 : 16,
                                        .recvbuf = buf});
    if (rc == TC_OK) {
      TC_ASSERT(it < 30);
      continue;
    }
    double now = tc__now(), since = now - (sh->t > t0 ? sh->t : t0);
    show("killed", d->msg);
    TC_ASSERT_EQ(rc, TC_ERR_REMOTE);
    TC_ASSERT_CONTAINS(d->msg, "peer 2");
    TC_ASSERT_CONTAINS(d->msg, "all_reduce on 'kill'");
    if (since > 2.0) tc_test_fail(__FILE__, __LINE__, "detected after %.2f s", since);
    break;
  }
  /* later ops fail at once, naming the earlier failure */
  int rc = d_run(d, (tc__op_args_t){.type = TC_OP_BARRIER});
  TC_ASSERT(rc != TC_OK);
  show("after", d->msg);
  TC_ASSERT_CONTAINS(d->msg, "an earlier operation failed");
  TC_ASSERT_CONTAINS(d->msg, "peer 2");
  TC_ASSERT(d_fin(d) != TC_OK); /* error, but frees */
  tc__cpu_backend.destroy(d->b);
  LEAK_CHECK();
}

TC_TEST(cpu_direct_peer_killed) {
  shared_t *sh = shared_new();
  int st[4];
  tc_spawn_status(4, killed_rank, sh, 60, st);
  for (int r = 0; r < 4; r++) {
    if (r == 2) TC_ASSERT(WIFSIGNALED(st[r]) && WTERMSIG(st[r]) == SIGKILL);
    else TC_ASSERT(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0);
  }
}

static void timeout_rank(tc_ctx_t *ctx) {
  shared_t *sh = ctx->arg;
  dcomm_t *d = d_init(ctx, "tmo", 30);
  if (ctx->rank == 2) { /* never joins the op: waits until the others gave up */
    double dl = tc__now() + 20;
    while (sh->flag < 2 && tc__now() < dl) usleep(10000);
    TC_ASSERT_EQ(sh->flag, 2);
    tc__cpu_backend.abort(d->b);
    tc__cpu_backend.destroy(d->b);
    return;
  }
  int32_t v = 1;
  double t0 = tc__now();
  int rc = d_run_t(d, (tc__op_args_t){.type = TC_OP_ALL_REDUCE, .dtype = TC_INT32,
                                      .redop = TC_OP(TC_SUM), .count = 1, .recvbuf = &v},
                  1.0);
  double dt = tc__now() - t0;
  show("timeout", d->msg);
  TC_ASSERT_EQ(rc, TC_ERR_TIMEOUT);
  TC_ASSERT_CONTAINS(d->msg, "timed out after 1 s");
  TC_ASSERT(dt >= 0.9 && dt < 3.0);
  atomic_fetch_add(&sh->flag, 1);
  double dl = tc__now() + 20; /* nobody closes before both timed out */
  while (sh->flag < 2 && tc__now() < dl) usleep(10000);
  tc__cpu_backend.abort(d->b);
  tc__cpu_backend.destroy(d->b);
  LEAK_CHECK();
}

TC_TEST(cpu_direct_timeout) { tc_spawn(3, timeout_rank, shared_new(), 60); }

static void init_timeout_rank(tc_ctx_t *ctx) {
  if (ctx->rank == 1) return; /* never creates its communicator */
  dcomm_t d;
  char err[1024] = "";
  double t0 = tc__now();
  int rc = d_try_init(ctx, "itmo", 1.0, &d, err, sizeof err);
  show("init timeout", err);
  TC_ASSERT_EQ(rc, TC_ERR_TIMEOUT);
  TC_ASSERT(tc__now() - t0 < 5.0);
  /* rank 0 waits for the higher rank 1 to connect, rank 2 for rank 1's
   * address (it connects to lower ranks itself) */
  if (ctx->rank == 0) TC_ASSERT_CONTAINS(err, "peer 1 has not connected to this rank");
  else TC_ASSERT_CONTAINS(err, "rank 1's address");
  LEAK_CHECK();
}

TC_TEST(cpu_direct_init_timeout) { tc_spawn(3, init_timeout_rank, NULL, 30); }

static void abort_rank(tc_ctx_t *ctx) {
  shared_t *sh = ctx->arg;
  dcomm_t *d = d_init(ctx, "abrt", 30);
  if (ctx->rank == 1) {
    double dl = tc__now() + 20;
    while (sh->flag < 1 && tc__now() < dl) usleep(10000);
    tc__cpu_backend.abort(d->b);
    tc__cpu_backend.destroy(d->b);
    return;
  }
  int32_t v[4] = {0};
  void *a1, *a2;
  tc_backend_op_t o1 = d_describe(d, (tc__op_args_t){.type = TC_OP_RECV, .dtype = TC_INT32,
                                                     .count = 4, .root = 1, .recvbuf = v},
                                  0, &a1),
                  o2 = d_describe(d, (tc__op_args_t){.type = TC_OP_BARRIER}, 0, &a2);
  twork_t w1, w2;
  d_post(d, &o1, &w1);
  d_post(d, &o2, &w2);
  usleep(200 * 1000);
  pthread_mutex_lock(&w1.mu);
  int pending = !w1.done;
  pthread_mutex_unlock(&w1.mu);
  TC_ASSERT(pending);
  double t0 = tc__now();
  TC_ASSERT_OK(tc__cpu_backend.abort(d->b));
  TC_ASSERT_EQ(twork_wait(&w1, 5), TC_ERR_ABORTED);
  TC_ASSERT_EQ(twork_wait(&w2, 5), TC_ERR_ABORTED);
  TC_ASSERT(tc__now() - t0 < 1.0);
  show("abort", w1.msg);
  TC_ASSERT_CONTAINS(w1.msg, "communicator was aborted");
  TC_ASSERT_CONTAINS(w1.msg, "recv on 'abrt' (rank 0 of 2)");
  /* posting after abort is refused */
  tc_backend_op_t o3 = {.size = sizeof o3, .type = TC_OP_BARRIER,
                        .kind = TC_KIND_BARRIER, .root = -1, .timeout_s = 5};
  twork_t w3;
  twork_init(&w3);
  char err3[256] = "";
  TC_ASSERT_EQ(tc__cpu_backend.post(d->b, &o3, (tc_work_t *)&w3, err3, sizeof err3),
               TC_ERR_ABORTED);
  TC_ASSERT_CONTAINS(err3, "communicator was aborted");
  free(a1);
  free(a2);
  d_fin(d); /* after abort: harmless */
  tc__cpu_backend.destroy(d->b);
  twork_destroy(&w1);
  twork_destroy(&w2);
  twork_destroy(&w3);
  sh->flag = 1;
  LEAK_CHECK();
}

TC_TEST(cpu_direct_abort) { tc_spawn(2, abort_rank, shared_new(), 30); }

static void mismatch_rank(tc_ctx_t *ctx) {
  dcomm_t *d = d_init(ctx, "mism", 10);
  float buf[200] = {0};
  int rc = d_run(d, (tc__op_args_t){.type = TC_OP_ALL_REDUCE, .dtype = TC_FLOAT32,
                                      .redop = TC_OP(TC_SUM),
                                      .count = ctx->rank == 0 ? 100 : 200, .recvbuf = buf});
  show("mismatch", d->msg);
  TC_ASSERT_EQ(rc, TC_ERR_PROTOCOL);
  TC_ASSERT_CONTAINS(d->msg, "mismatched collectives: rank 0 calls all_reduce #1 of 100 float32 "
                            "with SUM, rank 1 calls all_reduce #1 of 200 float32 with SUM");
  tc__cpu_backend.abort(d->b);
  tc__cpu_backend.destroy(d->b);
  LEAK_CHECK();
}

TC_TEST(cpu_direct_count_mismatch) { tc_spawn(2, mismatch_rank, NULL, 30); }

static void badtoken_rank(tc_ctx_t *ctx) {
  if (ctx->rank == 1) {
    /* a stray connection to rank 0 with a wrong token, before the real one */
    tc_store_t *base = tc_ctx_store(ctx), *s = NULL;
    TC_ASSERT_OK(tc_store_prefix(base, "tok", &s));
    void *v = NULL;
    size_t len = 0;
    TC_ASSERT_OK(tc_store_get(s, "cpu/addr/0", &v, &len, 20));
    char val[200];
    snprintf(val, sizeof val, "%.*s", (int)len, (char *)v);
    tc_free(v);
    tc_store_release(s);
    tc_store_release(base);
    char *bar = strchr(val, '|'), *addr = bar ? bar + 1 : val; /* "<token>|host:port" */
    char *colon = strrchr(addr, ':');
    TC_ASSERT(colon != NULL);
    *colon = 0;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(atoi(colon + 1))};
    inet_pton(AF_INET, addr, &sa.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    TC_ASSERT(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    char junk[36]; /* a whole hello's worth (TC__TCP_HELLO_BYTES) */
    memset(junk, 0x5a, sizeof junk);
    TC_ASSERT(send(fd, junk, sizeof junk, 0) == (ssize_t)sizeof junk);
    char c;
    TC_ASSERT(recv(fd, &c, 1, 0) == 0); /* rank 0 closes it */
    close(fd);
  }
  dcomm_t *d = d_init(ctx, "tok", 20);
  D_OK(d, .type = TC_OP_BARRIER);
  if (ctx->rank == 0) TC_ASSERT_CONTAINS(d_logbuf, "refused a connection from 127.0.0.1: no torchcomms hello");
  d_finalize(d);
}

TC_TEST(cpu_direct_bad_token) { tc_spawn(2, badtoken_rank, NULL, 30); }

static void env_rank(tc_ctx_t *ctx) {
  setenv("TORCHCOMMS_CPU_TRANSPORT", "carrier-pigeon", 1);
  dcomm_t d;
  char err[1024] = "";
  TC_ASSERT_EQ(d_try_init(ctx, "env", 5, &d, err, sizeof err), TC_ERR_INVALID_ARGUMENT);
  show("env", err);
  TC_ASSERT_CONTAINS(err, "TORCHCOMMS_CPU_TRANSPORT");
}

TC_TEST(cpu_direct_bad_transport_env) { tc_spawn(1, env_rank, NULL, 30); }

/* ---- finalize: a peer dying during it, and a rank still in an op ---- */

static void finalize_death_rank(tc_ctx_t *ctx) {
  dcomm_t *d = d_init(ctx, "fdie", 20);
  D_OK(d, .type = TC_OP_BARRIER);
  /* rank 2 dies once the others are out of the barrier (a death during it
   * is the barrier's failure, not finalize's) */
  tc_store_t *st = tc_ctx_store(ctx);
  if (ctx->rank != 2) {
    char key[32];
    snprintf(key, sizeof key, "fdie-out-%d", ctx->rank);
    TC_ASSERT_OK(tc_store_set(st, key, "1", 1));
  } else {
    const char *keys[] = {"fdie-out-0", "fdie-out-1"};
    TC_ASSERT_OK(tc_store_wait(st, keys, 2, 20));
    raise(SIGKILL);
  }
  tc_store_release(st);
  int rc = d_fin(d);
  show("finalize death", d->msg);
  TC_ASSERT_EQ(rc, TC_ERR_REMOTE);
  TC_ASSERT_CONTAINS(d->msg, "finalize on 'fdie'");
  TC_ASSERT_CONTAINS(d->msg, "peer 2");
  tc__cpu_backend.destroy(d->b);
  LEAK_CHECK();
}

TC_TEST(cpu_direct_finalize_peer_dies) {
  int st[3];
  tc_spawn_status(3, finalize_death_rank, NULL, 30, st);
  TC_ASSERT(WIFSIGNALED(st[2]));
  TC_ASSERT(WIFEXITED(st[0]) && WEXITSTATUS(st[0]) == 0);
  TC_ASSERT(WIFEXITED(st[1]) && WEXITSTATUS(st[1]) == 0);
}

static void finalize_mismatch_rank(tc_ctx_t *ctx) {
  dcomm_t *d = d_init(ctx, "fmis", 20);
  if (ctx->rank == 0) {
    int rc = d_fin(d);
    show("finalize vs barrier", d->msg);
    TC_ASSERT(rc == TC_ERR_PROTOCOL || rc == TC_ERR_REMOTE);
  } else {
    int rc = d_run(d, (tc__op_args_t){.type = TC_OP_BARRIER});
    show("barrier vs finalize", d->msg);
    TC_ASSERT_EQ(rc, TC_ERR_PROTOCOL);
    TC_ASSERT_CONTAINS(d->msg, "peer 0 is already in finalize while this rank is in barrier");
    tc__cpu_backend.abort(d->b);
  }
  tc__cpu_backend.destroy(d->b);
  LEAK_CHECK();
}

TC_TEST(cpu_direct_finalize_mismatch) { tc_spawn(2, finalize_mismatch_rank, NULL, 30); }

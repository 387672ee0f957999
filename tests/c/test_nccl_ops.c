/* test_nccl_ops.c -- every operation of the nccl backend, through the fake
 * NCCL and CUDA runtime (tests/c/fake_nccl/), with world sizes 1, 2 and 4:
 * the backend's real code (symbol table, unique id through the store,
 * ncclCommInitRankConfig polled while ncclInProgress, events on its
 * internal stream ordered after the caller's stream, the poller, grouped
 * send/recv, ncclBroadcast/ncclReduce groups for the list variants,
 * ncclAvg, ncclRedOpCreatePreMulSum) moves real data between real
 * processes, and every result is compared exactly with a reference
 * computed locally (coll_util.h).
 *
 * Reductions run every dtype NCCL can reduce (float32, float64, float16,
 * bfloat16, float8_e4m3fn, float8_e5m2 (NCCL >= 2.24; the fake is 2.27),
 * int8, uint8, int32, int64, and bool as uint8) with every reduction both
 * the core and NCCL allow, at counts 0, 1 and 7, and SUM on float32 at
 * 65537; data movement runs uint8, int16 (no NCCL type: moved as bytes),
 * float32, int64, bool and float8_e4m3fn at the same counts. Every other case is
 * asynchronous. nccl_ops_inprogress_w2 repeats a subset with the fake's
 * ncclInProgress on every enqueue (the non-blocking communicator path).
 * Run: build/tc_test nccl_ops
 */
#include "nccl_util.h"

typedef void (*case_fn)(tc_comm_t *c, int rank, int n, tc_dtype_t dt,
                        tc_redop_t op, size_t count, int async);

#define ISSUE(async, call)                                                     \
  do {                                                                         \
    tc_work_t *w_ = NULL;                                                      \
    tc_work_t **wp = (async) ? &w_ : NULL;                                     \
    int rc_ = (call);                                                          \
    if (rc_ != TC_OK)                                                          \
      tc_test_fail(__FILE__, __LINE__, "%s: %s: %s", tc_case,                  \
                   tc_status_name(rc_), tc_last_error());                      \
    if (w_) {                                                                  \
      if (tc_work_wait(w_) != TC_OK)                                           \
        tc_test_fail(__FILE__, __LINE__, "%s: wait: %s", tc_case,              \
                     tc_last_error());                                         \
      TC_ASSERT_EQ(tc_work_status(w_), TC_WORK_COMPLETED);                     \
      TC_ASSERT_OK(tc_work_release(w_));                                       \
    }                                                                          \
  } while (0)

#define ES(dt) tc_dtype_size(dt)
#define AT(buf, i, dt) ((char *)(buf) + (size_t)(i) * ES(dt))

static void *filled(size_t count, tc_dtype_t dt, int rank, int seed) {
  void *p = nccl_buf(count * ES(dt));
  tc_fill(p, count, dt, rank, seed);
  return p;
}

static void check_fill(const void *got, size_t count, tc_dtype_t dt, int rank,
                       int seed, const char *what) {
  void *ref = filled(count, dt, rank, seed);
  tc_check_equal(got, ref, count, dt, TC_SUM, what);
  nccl_free(ref);
}

/* ---- reductions ---- */

static void case_all_reduce(tc_comm_t *c, int rank, int n, tc_dtype_t dt,
                            tc_redop_t op, size_t count, int async) {
  void *buf = filled(count, dt, rank, 1), *ref = nccl_buf(count * ES(dt));
  ISSUE(async, tc_all_reduce(c, buf, count, dt, op, NULL, wp));
  tc_reference(ref, count, dt, op, n, 1);
  tc_check_equal(buf, ref, count, dt, op.type, "buf");
  nccl_free(buf);
  nccl_free(ref);
}

static void case_reduce(tc_comm_t *c, int rank, int n, tc_dtype_t dt,
                        tc_redop_t op, size_t count, int async) {
  int root = (int)((count + (size_t)dt) % (size_t)n);
  void *buf = filled(count, dt, rank, 2);
  ISSUE(async, tc_reduce(c, buf, count, dt, op, root, NULL, wp));
  if (rank == root) {
    void *ref = nccl_buf(count * ES(dt));
    tc_reference(ref, count, dt, op, n, 2);
    tc_check_equal(buf, ref, count, dt, op.type, "root buf");
    nccl_free(ref);
  } else {
    check_fill(buf, count, dt, rank, 2, "non-root buf (unchanged)");
  }
  nccl_free(buf);
}

static size_t vcount(size_t count, int i) {
  return count == 0 || i == 1 ? 0 : count + (size_t)i * 3;
}

static void case_reduce_scatter(tc_comm_t *c, int rank, int n, tc_dtype_t dt,
                                tc_redop_t op, size_t count, int async) {
  void **send = tc_xmalloc((size_t)n * sizeof *send);
  for (int j = 0; j < n; j++) send[j] = filled(count, dt, rank, 10 + j);
  void *recv = nccl_buf(count * ES(dt)), *ref = nccl_buf(count * ES(dt));
  ISSUE(async, tc_reduce_scatter(c, recv, (const void *const *)send, count, dt,
                                 op, NULL, wp));
  tc_reference(ref, count, dt, op, n, 10 + rank);
  tc_check_equal(recv, ref, count, dt, op.type, "recvbuf");
  for (int j = 0; j < n; j++) nccl_free(send[j]);
  free(send);
  nccl_free(recv);
  nccl_free(ref);
}

static void case_reduce_scatter_single(tc_comm_t *c, int rank, int n,
                                       tc_dtype_t dt, tc_redop_t op,
                                       size_t count, int async) {
  char *send = nccl_buf((size_t)n * count * ES(dt));
  for (int j = 0; j < n; j++)
    tc_fill(AT(send, (size_t)j * count, dt), count, dt, rank, 10 + j);
  /* async: in place, the output is the own block of the input */
  void *recv = async ? AT(send, (size_t)rank * count, dt)
                     : nccl_buf(count * ES(dt));
  void *ref = nccl_buf(count * ES(dt));
  ISSUE(async, tc_reduce_scatter_single(c, recv, send, count, dt, op, NULL, wp));
  tc_reference(ref, count, dt, op, n, 10 + rank);
  tc_check_equal(recv, ref, count, dt, op.type, "recvbuf");
  if (!async) nccl_free(recv);
  nccl_free(send);
  nccl_free(ref);
}

static void case_reduce_scatter_v(tc_comm_t *c, int rank, int n, tc_dtype_t dt,
                                  tc_redop_t op, size_t count, int async) {
  size_t *counts = tc_xmalloc((size_t)n * sizeof *counts);
  void **send = tc_xmalloc((size_t)n * sizeof *send);
  for (int j = 0; j < n; j++) {
    counts[j] = vcount(count, j);
    send[j] = filled(counts[j], dt, rank, 10 + j);
  }
  void *recv = nccl_buf(counts[rank] * ES(dt));
  void *ref = nccl_buf(counts[rank] * ES(dt));
  ISSUE(async, tc_reduce_scatter_v(c, recv, counts[rank],
                                   (const void *const *)send, counts, dt, op,
                                   NULL, wp));
  tc_reference(ref, counts[rank], dt, op, n, 10 + rank);
  tc_check_equal(recv, ref, counts[rank], dt, op.type, "recvbuf");
  for (int j = 0; j < n; j++) nccl_free(send[j]);
  free(send);
  free(counts);
  nccl_free(recv);
  nccl_free(ref);
}

/* ---- data movement ---- */

static void case_broadcast(tc_comm_t *c, int rank, int n, tc_dtype_t dt,
                           tc_redop_t op, size_t count, int async) {
  int root = (int)((count + (size_t)dt + 1) % (size_t)n);
  void *buf = filled(count, dt, rank == root ? root : 1000 + rank, 3);
  ISSUE(async, tc_broadcast(c, buf, count, dt, root, NULL, wp));
  check_fill(buf, count, dt, root, 3, "buf");
  nccl_free(buf);
}

static void case_all_gather(tc_comm_t *c, int rank, int n, tc_dtype_t dt,
                            tc_redop_t op, size_t count, int async) {
  void *send = filled(count, dt, rank, 4);
  void **recv = tc_xmalloc((size_t)n * sizeof *recv);
  for (int i = 0; i < n; i++) recv[i] = nccl_buf(count * ES(dt));
  ISSUE(async, tc_all_gather(c, recv, send, count, dt, NULL, wp));
  for (int i = 0; i < n; i++) {
    check_fill(recv[i], count, dt, i, 4, "recvbufs[i]");
    nccl_free(recv[i]);
  }
  free(recv);
  nccl_free(send);
}

static void case_all_gather_single(tc_comm_t *c, int rank, int n,
                                   tc_dtype_t dt, tc_redop_t op, size_t count,
                                   int async) {
  char *recv = nccl_buf((size_t)n * count * ES(dt));
  void *send;
  if (async) { /* in place */
    send = AT(recv, (size_t)rank * count, dt);
    tc_fill(send, count, dt, rank, 5);
  } else {
    send = filled(count, dt, rank, 5);
  }
  ISSUE(async, tc_all_gather_single(c, recv, send, count, dt, NULL, wp));
  for (int i = 0; i < n; i++)
    check_fill(AT(recv, (size_t)i * count, dt), count, dt, i, 5, "block");
  if (!async) nccl_free(send);
  nccl_free(recv);
}

static void case_all_gather_v(tc_comm_t *c, int rank, int n, tc_dtype_t dt,
                              tc_redop_t op, size_t count, int async) {
  size_t *counts = tc_xmalloc((size_t)n * sizeof *counts);
  void **recv = tc_xmalloc((size_t)n * sizeof *recv);
  for (int i = 0; i < n; i++) {
    counts[i] = vcount(count, i);
    recv[i] = nccl_buf(counts[i] * ES(dt));
  }
  void *send = filled(counts[rank], dt, rank, 6);
  ISSUE(async,
        tc_all_gather_v(c, recv, counts, send, counts[rank], dt, NULL, wp));
  for (int i = 0; i < n; i++) {
    check_fill(recv[i], counts[i], dt, i, 6, "recvbufs[i]");
    nccl_free(recv[i]);
  }
  nccl_free(send);
  free(recv);
  free(counts);
}

static void case_all_to_all_single(tc_comm_t *c, int rank, int n,
                                   tc_dtype_t dt, tc_redop_t op, size_t count,
                                   int async) {
  char *send = nccl_buf((size_t)n * count * ES(dt));
  char *recv = nccl_buf((size_t)n * count * ES(dt));
  for (int j = 0; j < n; j++)
    tc_fill(AT(send, (size_t)j * count, dt), count, dt, rank, 20 + j);
  ISSUE(async, tc_all_to_all_single(c, recv, send, count, dt, NULL, wp));
  for (int j = 0; j < n; j++)
    check_fill(AT(recv, (size_t)j * count, dt), count, dt, j, 20 + rank,
               "block");
  nccl_free(send);
  nccl_free(recv);
}

static size_t a2a_count(size_t count, int a, int b) {
  return count ? count + (size_t)((a + 2 * b) % 3) : 0;
}

static void case_all_to_all_v_single(tc_comm_t *c, int rank, int n,
                                     tc_dtype_t dt, tc_redop_t op,
                                     size_t count, int async) {
  size_t *sc = tc_xmalloc((size_t)n * sizeof *sc);
  size_t *rc = tc_xmalloc((size_t)n * sizeof *rc);
  size_t st = 0, rt = 0;
  for (int j = 0; j < n; j++) {
    st += sc[j] = a2a_count(count, rank, j);
    rt += rc[j] = a2a_count(count, j, rank);
  }
  char *send = nccl_buf(st * ES(dt)), *recv = nccl_buf(rt * ES(dt));
  size_t off = 0;
  for (int j = 0; j < n; j++) {
    tc_fill(AT(send, off, dt), sc[j], dt, rank, 20 + j);
    off += sc[j];
  }
  ISSUE(async, tc_all_to_all_v_single(c, recv, rc, send, sc, dt, NULL, wp));
  off = 0;
  for (int j = 0; j < n; j++) {
    check_fill(AT(recv, off, dt), rc[j], dt, j, 20 + rank, "block");
    off += rc[j];
  }
  nccl_free(send);
  nccl_free(recv);
  free(sc);
  free(rc);
}

static void case_all_to_all(tc_comm_t *c, int rank, int n, tc_dtype_t dt,
                            tc_redop_t op, size_t count, int async) {
  size_t *sc = tc_xmalloc((size_t)n * sizeof *sc);
  size_t *rc = tc_xmalloc((size_t)n * sizeof *rc);
  void **send = tc_xmalloc((size_t)n * sizeof *send);
  void **recv = tc_xmalloc((size_t)n * sizeof *recv);
  for (int j = 0; j < n; j++) {
    sc[j] = a2a_count(count, rank, j);
    rc[j] = a2a_count(count, j, rank);
    send[j] = filled(sc[j], dt, rank, 20 + j);
    recv[j] = nccl_buf(rc[j] * ES(dt));
  }
  ISSUE(async, tc_all_to_all(c, recv, rc, (const void *const *)send, sc, dt,
                             NULL, wp));
  for (int j = 0; j < n; j++) {
    check_fill(recv[j], rc[j], dt, j, 20 + rank, "recvbufs[j]");
    nccl_free(send[j]);
    nccl_free(recv[j]);
  }
  free(send);
  free(recv);
  free(sc);
  free(rc);
}

static void case_scatter(tc_comm_t *c, int rank, int n, tc_dtype_t dt,
                         tc_redop_t op, size_t count, int async) {
  int root = (int)(count % (size_t)n);
  void **send = NULL;
  if (rank == root) {
    send = tc_xmalloc((size_t)n * sizeof *send);
    for (int j = 0; j < n; j++) send[j] = filled(count, dt, root, 30 + j);
  }
  void *recv = nccl_buf(count * ES(dt));
  ISSUE(async, tc_scatter(c, recv, (const void *const *)send, count, dt, root,
                          NULL, wp));
  check_fill(recv, count, dt, root, 30 + rank, "recvbuf");
  if (send) {
    for (int j = 0; j < n; j++) nccl_free(send[j]);
    free(send);
  }
  nccl_free(recv);
}

static void case_gather(tc_comm_t *c, int rank, int n, tc_dtype_t dt,
                        tc_redop_t op, size_t count, int async) {
  int root = (int)((count + 1) % (size_t)n);
  void *send = filled(count, dt, rank, 40);
  void **recv = NULL;
  if (rank == root) {
    recv = tc_xmalloc((size_t)n * sizeof *recv);
    for (int j = 0; j < n; j++) recv[j] = nccl_buf(count * ES(dt));
  }
  ISSUE(async, tc_gather(c, recv, send, count, dt, root, NULL, wp));
  if (recv) {
    for (int j = 0; j < n; j++) {
      check_fill(recv[j], count, dt, j, 40, "recvbufs[j]");
      nccl_free(recv[j]);
    }
    free(recv);
  }
  nccl_free(send);
}

static void case_gather_single(tc_comm_t *c, int rank, int n, tc_dtype_t dt,
                               tc_redop_t op, size_t count, int async) {
  int root = (int)((count + 2) % (size_t)n);
  void *send = filled(count, dt, rank, 41);
  char *recv = rank == root ? nccl_buf((size_t)n * count * ES(dt)) : NULL;
  ISSUE(async, tc_gather_single(c, recv, send, count, dt, root, NULL, wp));
  if (recv) {
    for (int j = 0; j < n; j++)
      check_fill(AT(recv, (size_t)j * count, dt), count, dt, j, 41, "block");
    nccl_free(recv);
  }
  nccl_free(send);
}

static void case_send_recv(tc_comm_t *c, int rank, int n, tc_dtype_t dt,
                           tc_redop_t op, size_t count, int async) {
  if (n == 1) return;
  int right = (rank + 1) % n, left = (rank + n - 1) % n;
  void *send = filled(count, dt, rank, 50), *recv = nccl_buf(count * ES(dt));
  tc_work_t *ws, *wr;
  /* even ranks send first, odd ranks receive first: ncclSend and ncclRecv
   * are separate operations on one stream, so a ring of blocking sends
   * would deadlock on a GPU; this order cannot */
  if (rank % 2 == 0) {
    TC_ASSERT_OK(tc_send(c, send, count, dt, right, NULL, &ws));
    TC_ASSERT_OK(tc_recv(c, recv, count, dt, left, NULL, &wr));
  } else {
    TC_ASSERT_OK(tc_recv(c, recv, count, dt, left, NULL, &wr));
    TC_ASSERT_OK(tc_send(c, send, count, dt, right, NULL, &ws));
  }
  TC_ASSERT_OK(tc_work_wait(wr));
  TC_ASSERT_OK(tc_work_wait(ws));
  TC_ASSERT_OK(tc_work_release(ws));
  TC_ASSERT_OK(tc_work_release(wr));
  check_fill(recv, count, dt, left, 50, "recvbuf");
  nccl_free(send);
  nccl_free(recv);
}

static void case_batch(tc_comm_t *c, int rank, int n, tc_dtype_t dt,
                       tc_redop_t op, size_t count, int async) {
  tc_batch_t *b;
  TC_ASSERT_OK(tc_batch_create(c, &b));
  void **send = tc_xmalloc((size_t)n * sizeof *send);
  void **recv = tc_xmalloc((size_t)n * sizeof *recv);
  for (int j = 0; j < n; j++) {
    send[j] = filled(count, dt, rank, 60 + j);
    recv[j] = nccl_buf(count * ES(dt));
  }
  for (int j = n - 1; j >= 0; j--) /* self included */
    TC_ASSERT_OK(tc_batch_recv(b, recv[j], count, dt, j));
  for (int j = 0; j < n; j++)
    TC_ASSERT_OK(tc_batch_send(b, send[j], count, dt, j));
  ISSUE(async, tc_batch_issue(b, NULL, wp));
  for (int j = 0; j < n; j++) {
    check_fill(recv[j], count, dt, j, 60 + rank, "recv from j");
    nccl_free(send[j]);
    nccl_free(recv[j]);
  }
  TC_ASSERT_OK(tc_batch_free(b));
  free(send);
  free(recv);
}

static void case_barrier(tc_comm_t *c, int rank, int n, tc_dtype_t dt,
                         tc_redop_t op, size_t count, int async) {
  ISSUE(async, tc_barrier(c, NULL, wp));
}

/* ---- the matrix ---- */

typedef struct {
  const char *name;
  case_fn fn;
  int reducing;
} op_desc_t;

static const op_desc_t ops[] = {
    {"all_reduce", case_all_reduce, 1},
    {"reduce", case_reduce, 1},
    {"reduce_scatter", case_reduce_scatter, 1},
    {"reduce_scatter_single", case_reduce_scatter_single, 1},
    {"reduce_scatter_v", case_reduce_scatter_v, 1},
    {"broadcast", case_broadcast, 0},
    {"all_gather", case_all_gather, 0},
    {"all_gather_single", case_all_gather_single, 0},
    {"all_gather_v", case_all_gather_v, 0},
    {"all_to_all_single", case_all_to_all_single, 0},
    {"all_to_all_v_single", case_all_to_all_v_single, 0},
    {"all_to_all", case_all_to_all, 0},
    {"scatter", case_scatter, 0},
    {"gather", case_gather, 0},
    {"gather_single", case_gather_single, 0},
    {"send_recv", case_send_recv, 0},
    {"batch", case_batch, 0},
    {"barrier", case_barrier, 0},
};

/* What NCCL can reduce (the backend refuses the rest: test_nccl.c). */
static int nccl_reducible(tc_dtype_t dt, tc_redop_type_t op) {
  if (dt == TC_INT16 || !tc__redop_allowed(dt, op)) return 0;
  if (op == TC_BXOR) return 0;
  if ((op == TC_BAND || op == TC_BOR) && dt != TC_BOOL) return 0;
  if ((op == TC_AVG || op == TC_PREMUL_SUM) &&
      (dt == TC_FLOAT8_E4M3FN || dt == TC_FLOAT8_E5M2))
    return 0;
  return 1;
}

static const tc_dtype_t move_dtypes[] = {TC_UINT8, TC_INT16, TC_FLOAT32,
                                         TC_INT64, TC_BOOL, TC_FLOAT8_E4M3FN};

typedef struct {
  int small_only; /* counts 0..7 only, one dtype per class */
} matrix_arg_t;

static void matrix_rank(tc_ctx_t *ctx) {
  const matrix_arg_t *arg = ctx->arg;
  tc_comm_t *c = nccl_comm(ctx, "nccl_matrix", 60);
  const size_t counts[] = {0, 1, 7, 65537};
  const size_t ncounts = arg->small_only ? 3 : 4;
  int k = 0;
  for (size_t oi = 0; oi < sizeof ops / sizeof ops[0]; oi++) {
    const op_desc_t *d = &ops[oi];
    for (size_t ci = 0; ci < ncounts; ci++) {
      size_t count = counts[ci];
      int big = count > 7;
      int ndt = d->reducing ? TC_DTYPE_COUNT
                            : (int)(sizeof move_dtypes / sizeof move_dtypes[0]);
      for (int di = 0; di < ndt; di++) {
        tc_dtype_t dt = d->reducing ? (tc_dtype_t)di : move_dtypes[di];
        if ((big || arg->small_only) && dt != TC_FLOAT32 && dt != TC_BOOL)
          continue;
        if (d->fn == case_barrier && (count || dt != TC_FLOAT32)) continue;
        for (int op = 0; op < (d->reducing ? TC_REDOP_COUNT : 1); op++) {
          if (d->reducing && !nccl_reducible(dt, (tc_redop_type_t)op)) continue;
          if (big && d->reducing && op != TC_SUM) continue;
          tc_redop_t rop = op == TC_PREMUL_SUM ? TC_OP_PREMUL_SUM(0.5)
                                               : TC_OP((tc_redop_type_t)op);
          int async = (k++ % 2) == 1;
          snprintf(tc_case, sizeof tc_case,
                   "nccl %s rank %d of %d dtype %s op %s count %zu %s",
                   d->name, ctx->rank, ctx->size, tc_dtype_name(dt),
                   d->reducing ? tc_redop_name((tc_redop_type_t)op) : "-",
                   count, async ? "async" : "sync");
          d->fn(c, ctx->rank, ctx->size, dt, rop, count, async);
        }
      }
    }
  }
  TC_ASSERT(k > (arg->small_only ? 100 : 900)); /* the matrix did run */
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

static const matrix_arg_t full = {0}, small = {1};

TC_TEST(nccl_ops_w1) {
  nccl_use_fake();
  tc_spawn(1, matrix_rank, (void *)&full, 120);
}
TC_TEST(nccl_ops_w2) {
  nccl_use_fake();
  tc_spawn(2, matrix_rank, (void *)&full, 120);
}
TC_TEST(nccl_ops_w4) {
  nccl_use_fake();
  tc_spawn(4, matrix_rank, (void *)&full, 120);
}
/* Every enqueue returns ncclInProgress and the communicator reads
 * ncclInProgress for two more polls: the backend must wait before
 * recording its end event, and finalize must wait for ncclCommFinalize. */
TC_TEST(nccl_ops_inprogress_w2) {
  nccl_use_fake();
  setenv("TCFAKE_NCCL_INPROGRESS", "1", 1);
  tc_spawn(2, matrix_rank, (void *)&small, 120);
}

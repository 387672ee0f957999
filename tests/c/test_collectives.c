/* test_collectives.c -- every operation x world sizes 1, 2, 3, 4, 8 x counts
 * 0, 1, 7, 1 Mi + 3 x dtypes x reductions, over real processes and real
 * sockets, each result compared with a reference computed locally.
 *
 * At counts 0, 1 and 7 the cross product is complete. At 1 Mi + 3 elements:
 * reducing operations run every dtype with SUM and every allowed reduction
 * on float32, bfloat16 and int32; data-movement operations run one dtype of
 * each element size (uint8, float16, float32, int64). TC_TEST_FULL=1 runs the
 * complete cross product at every count. Every other case is asynchronous
 * (work object + wait), the rest synchronous. */
#include "coll_util.h"
#include <unistd.h>

typedef void (*tc_case_fn)(tc_comm_t *c, int rank, int n, tc_dtype_t dt,
                           tc_redop_t op, size_t count, int async);

typedef struct {
  const char *name;
  tc_case_fn fn;
  int reducing;
} tc_op_desc_t;

/* Issues `call` (which uses `wp`) synchronously or asynchronously. */
#define ISSUE(async, call)                                                     \
  do {                                                                         \
    tc_work_t *w_ = NULL;                                                      \
    tc_work_t **wp = (async) ? &w_ : NULL;                                     \
    int rc_ = (call);                                                          \
    if (rc_ != TC_OK)                                                          \
      tc_test_fail(__FILE__, __LINE__, "%s: %s: %s", tc_case,                  \
                   tc_status_name(rc_), tc_last_error());                      \
    if (w_) {                                                                  \
      rc_ = tc_work_wait(w_);                                                  \
      if (rc_ != TC_OK)                                                        \
        tc_test_fail(__FILE__, __LINE__, "%s: wait: %s", tc_case,              \
                     tc_last_error());                                         \
      TC_ASSERT_EQ(tc_work_status(w_), TC_WORK_COMPLETED);                     \
      TC_ASSERT_OK(tc_work_release(w_));                                       \
    }                                                                          \
  } while (0)

#define ES(dt) tc_dtype_size(dt)
#define AT(buf, i, dt) ((char *)(buf) + (size_t)(i) * ES(dt))

static void *tc_filled(size_t count, tc_dtype_t dt, int rank, int seed) {
  void *p = tc_xmalloc(count * ES(dt));
  tc_fill(p, count, dt, rank, seed);
  return p;
}

static void tc_check_fill(const void *got, size_t count, tc_dtype_t dt,
                          int rank, int seed, const char *what) {
  void *ref = tc_filled(count, dt, rank, seed);
  tc_check_equal(got, ref, count, dt, TC_SUM, what);
  free(ref);
}

/* ---- one function per operation ---- */

static void case_all_reduce(tc_comm_t *c, int rank, int n, tc_dtype_t dt,
                            tc_redop_t op, size_t count, int async) {
  void *buf = tc_filled(count, dt, rank, 1), *ref = tc_xmalloc(count * ES(dt));
  ISSUE(async, tc_all_reduce(c, buf, count, dt, op, NULL, wp));
  tc_reference(ref, count, dt, op, n, 1);
  tc_check_equal(buf, ref, count, dt, op.type, "buf");
  free(buf);
  free(ref);
}

static void case_reduce(tc_comm_t *c, int rank, int n, tc_dtype_t dt,
                        tc_redop_t op, size_t count, int async) {
  int root = (int)((count + (size_t)dt) % (size_t)n);
  void *buf = tc_filled(count, dt, rank, 2);
  ISSUE(async, tc_reduce(c, buf, count, dt, op, root, NULL, wp));
  if (rank == root) {
    void *ref = tc_xmalloc(count * ES(dt));
    tc_reference(ref, count, dt, op, n, 2);
    tc_check_equal(buf, ref, count, dt, op.type, "root buf");
    free(ref);
  } else {
    tc_check_fill(buf, count, dt, rank, 2, "non-root buf (must be unchanged)");
  }
  free(buf);
}

static void case_broadcast(tc_comm_t *c, int rank, int n, tc_dtype_t dt,
                           tc_redop_t op, size_t count, int async) {
  int root = (int)((count + (size_t)dt + 1) % (size_t)n);
  void *buf = tc_filled(count, dt, rank == root ? root : 1000 + rank, 3);
  ISSUE(async, tc_broadcast(c, buf, count, dt, root, NULL, wp));
  tc_check_fill(buf, count, dt, root, 3, "buf");
  free(buf);
}

static void case_all_gather(tc_comm_t *c, int rank, int n, tc_dtype_t dt,
                            tc_redop_t op, size_t count, int async) {
  void *send = tc_filled(count, dt, rank, 4);
  void **recv = tc_xmalloc((size_t)n * sizeof *recv);
  for (int i = 0; i < n; i++) recv[i] = tc_xmalloc(count * ES(dt));
  ISSUE(async, tc_all_gather(c, recv, send, count, dt, NULL, wp));
  for (int i = 0; i < n; i++) {
    tc_check_fill(recv[i], count, dt, i, 4, "recvbufs[i]");
    free(recv[i]);
  }
  free(recv);
  free(send);
}

static void case_all_gather_single(tc_comm_t *c, int rank, int n,
                                   tc_dtype_t dt, tc_redop_t op, size_t count,
                                   int async) {
  char *recv = tc_xmalloc((size_t)n * count * ES(dt));
  void *send;
  if (async) { /* in place: the own block is the input */
    send = AT(recv, (size_t)rank * count, dt);
    tc_fill(send, count, dt, rank, 5);
  } else {
    send = tc_filled(count, dt, rank, 5);
  }
  ISSUE(async, tc_all_gather_single(c, recv, send, count, dt, NULL, wp));
  for (int i = 0; i < n; i++)
    tc_check_fill(AT(recv, (size_t)i * count, dt), count, dt, i, 5, "block");
  if (!async) free(send);
  free(recv);
}

static size_t vcount(size_t count, int i) {
  if (count == 0) return 0;
  return i == 1 ? 0 : count + (size_t)i * 3; /* rank 1 contributes nothing */
}

static void case_all_gather_v(tc_comm_t *c, int rank, int n, tc_dtype_t dt,
                              tc_redop_t op, size_t count, int async) {
  size_t *counts = tc_xmalloc((size_t)n * sizeof *counts);
  void **recv = tc_xmalloc((size_t)n * sizeof *recv);
  for (int i = 0; i < n; i++) {
    counts[i] = vcount(count, i);
    recv[i] = tc_xmalloc(counts[i] * ES(dt));
  }
  void *send = tc_filled(counts[rank], dt, rank, 6);
  ISSUE(async,
        tc_all_gather_v(c, recv, counts, send, counts[rank], dt, NULL, wp));
  for (int i = 0; i < n; i++) {
    tc_check_fill(recv[i], counts[i], dt, i, 6, "recvbufs[i]");
    free(recv[i]);
  }
  free(send);
  free(recv);
  free(counts);
}

static void case_reduce_scatter(tc_comm_t *c, int rank, int n, tc_dtype_t dt,
                                tc_redop_t op, size_t count, int async) {
  void **send = tc_xmalloc((size_t)n * sizeof *send);
  for (int j = 0; j < n; j++) send[j] = tc_filled(count, dt, rank, 10 + j);
  void *recv = tc_xmalloc(count * ES(dt)), *ref = tc_xmalloc(count * ES(dt));
  ISSUE(async, tc_reduce_scatter(c, recv, (const void *const *)send, count, dt,
                                 op, NULL, wp));
  tc_reference(ref, count, dt, op, n, 10 + rank);
  tc_check_equal(recv, ref, count, dt, op.type, "recvbuf");
  for (int j = 0; j < n; j++) free(send[j]);
  free(send);
  free(recv);
  free(ref);
}

static void case_reduce_scatter_single(tc_comm_t *c, int rank, int n,
                                       tc_dtype_t dt, tc_redop_t op,
                                       size_t count, int async) {
  char *send = tc_xmalloc((size_t)n * count * ES(dt));
  for (int j = 0; j < n; j++)
    tc_fill(AT(send, (size_t)j * count, dt), count, dt, rank, 10 + j);
  /* async cases run in place: the output is the own block of the input */
  void *recv = async ? AT(send, (size_t)rank * count, dt)
                     : tc_xmalloc(count * ES(dt));
  void *ref = tc_xmalloc(count * ES(dt));
  ISSUE(async,
        tc_reduce_scatter_single(c, recv, send, count, dt, op, NULL, wp));
  tc_reference(ref, count, dt, op, n, 10 + rank);
  tc_check_equal(recv, ref, count, dt, op.type, "recvbuf");
  if (!async) free(recv);
  free(send);
  free(ref);
}

static void case_reduce_scatter_v(tc_comm_t *c, int rank, int n, tc_dtype_t dt,
                                  tc_redop_t op, size_t count, int async) {
  size_t *counts = tc_xmalloc((size_t)n * sizeof *counts);
  void **send = tc_xmalloc((size_t)n * sizeof *send);
  for (int j = 0; j < n; j++) {
    counts[j] = vcount(count, j);
    send[j] = tc_filled(counts[j], dt, rank, 10 + j);
  }
  void *recv = tc_xmalloc(counts[rank] * ES(dt));
  void *ref = tc_xmalloc(counts[rank] * ES(dt));
  ISSUE(async, tc_reduce_scatter_v(c, recv, counts[rank],
                                   (const void *const *)send, counts, dt, op,
                                   NULL, wp));
  tc_reference(ref, counts[rank], dt, op, n, 10 + rank);
  tc_check_equal(recv, ref, counts[rank], dt, op.type, "recvbuf");
  for (int j = 0; j < n; j++) free(send[j]);
  free(send);
  free(counts);
  free(recv);
  free(ref);
}

static void case_all_to_all_single(tc_comm_t *c, int rank, int n,
                                   tc_dtype_t dt, tc_redop_t op, size_t count,
                                   int async) {
  char *send = tc_xmalloc((size_t)n * count * ES(dt));
  char *recv = tc_xmalloc((size_t)n * count * ES(dt));
  for (int j = 0; j < n; j++)
    tc_fill(AT(send, (size_t)j * count, dt), count, dt, rank, 20 + j);
  ISSUE(async, tc_all_to_all_single(c, recv, send, count, dt, NULL, wp));
  for (int j = 0; j < n; j++)
    tc_check_fill(AT(recv, (size_t)j * count, dt), count, dt, j, 20 + rank,
                  "block");
  free(send);
  free(recv);
}

/* What rank a sends to rank b in the v variants. */
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
    sc[j] = a2a_count(count, rank, j);
    rc[j] = a2a_count(count, j, rank);
    st += sc[j];
    rt += rc[j];
  }
  char *send = tc_xmalloc(st * ES(dt)), *recv = tc_xmalloc(rt * ES(dt));
  size_t off = 0;
  for (int j = 0; j < n; j++) {
    tc_fill(AT(send, off, dt), sc[j], dt, rank, 20 + j);
    off += sc[j];
  }
  ISSUE(async, tc_all_to_all_v_single(c, recv, rc, send, sc, dt, NULL, wp));
  off = 0;
  for (int j = 0; j < n; j++) {
    tc_check_fill(AT(recv, off, dt), rc[j], dt, j, 20 + rank, "block");
    off += rc[j];
  }
  free(send);
  free(recv);
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
    send[j] = tc_filled(sc[j], dt, rank, 20 + j);
    recv[j] = tc_xmalloc(rc[j] * ES(dt));
  }
  ISSUE(async, tc_all_to_all(c, recv, rc, (const void *const *)send, sc, dt,
                             NULL, wp));
  for (int j = 0; j < n; j++) {
    tc_check_fill(recv[j], rc[j], dt, j, 20 + rank, "recvbufs[j]");
    free(send[j]);
    free(recv[j]);
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
    for (int j = 0; j < n; j++) send[j] = tc_filled(count, dt, root, 30 + j);
  }
  void *recv = tc_xmalloc(count * ES(dt));
  ISSUE(async, tc_scatter(c, recv, (const void *const *)send, count, dt, root,
                          NULL, wp));
  tc_check_fill(recv, count, dt, root, 30 + rank, "recvbuf");
  if (send) {
    for (int j = 0; j < n; j++) free(send[j]);
    free(send);
  }
  free(recv);
}

static void case_gather(tc_comm_t *c, int rank, int n, tc_dtype_t dt,
                        tc_redop_t op, size_t count, int async) {
  int root = (int)((count + 1) % (size_t)n);
  void *send = tc_filled(count, dt, rank, 40);
  void **recv = NULL;
  if (rank == root) {
    recv = tc_xmalloc((size_t)n * sizeof *recv);
    for (int j = 0; j < n; j++) recv[j] = tc_xmalloc(count * ES(dt));
  }
  ISSUE(async, tc_gather(c, recv, send, count, dt, root, NULL, wp));
  if (recv) {
    for (int j = 0; j < n; j++) {
      tc_check_fill(recv[j], count, dt, j, 40, "recvbufs[j]");
      free(recv[j]);
    }
    free(recv);
  }
  free(send);
}

static void case_gather_single(tc_comm_t *c, int rank, int n, tc_dtype_t dt,
                               tc_redop_t op, size_t count, int async) {
  int root = (int)((count + 2) % (size_t)n);
  void *send = tc_filled(count, dt, rank, 41);
  char *recv = rank == root ? tc_xmalloc((size_t)n * count * ES(dt)) : NULL;
  ISSUE(async, tc_gather_single(c, recv, send, count, dt, root, NULL, wp));
  if (recv) {
    for (int j = 0; j < n; j++)
      tc_check_fill(AT(recv, (size_t)j * count, dt), count, dt, j, 41, "block");
    free(recv);
  }
  free(send);
}

static void case_send_recv(tc_comm_t *c, int rank, int n, tc_dtype_t dt,
                           tc_redop_t op, size_t count, int async) {
  if (n == 1) return; /* a send to oneself is an error; see test_validate */
  int right = (rank + 1) % n, left = (rank + n - 1) % n;
  void *send = tc_filled(count, dt, rank, 50);
  void *recv = tc_xmalloc(count * ES(dt));
  tc_work_t *ws, *wr;
  /* even ranks post the send first, odd ranks the receive */
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
  tc_check_fill(recv, count, dt, left, 50, "recvbuf");
  free(send);
  free(recv);
}

static void case_batch(tc_comm_t *c, int rank, int n, tc_dtype_t dt,
                       tc_redop_t op, size_t count, int async) {
  tc_batch_t *b;
  TC_ASSERT_OK(tc_batch_create(c, &b));
  void **send = tc_xmalloc((size_t)n * sizeof *send);
  void **recv = tc_xmalloc((size_t)n * sizeof *recv);
  for (int j = 0; j < n; j++) {
    send[j] = tc_filled(count, dt, rank, 60 + j);
    recv[j] = tc_xmalloc(count * ES(dt));
  }
  /* receives first, in reverse order, to show that order does not matter */
  for (int j = n - 1; j >= 0; j--)
    TC_ASSERT_OK(tc_batch_recv(b, recv[j], count, dt, j));
  for (int j = 0; j < n; j++)
    TC_ASSERT_OK(tc_batch_send(b, send[j], count, dt, j));
  ISSUE(async, tc_batch_issue(b, NULL, wp));
  for (int j = 0; j < n; j++) {
    tc_check_fill(recv[j], count, dt, j, 60 + rank, "recv from j");
    free(send[j]);
    free(recv[j]);
  }
  TC_ASSERT_OK(tc_batch_free(b));
  free(send);
  free(recv);
}

static void case_barrier(tc_comm_t *c, int rank, int n, tc_dtype_t dt,
                         tc_redop_t op, size_t count, int async) {
  if (count != 0 || dt != TC_FLOAT32) return;
  ISSUE(async, tc_barrier(c, NULL, wp));
}

/* ---- the matrix ---- */

static int big_allowed(const tc_op_desc_t *d, tc_dtype_t dt, tc_redop_type_t op, int n) {
  const char *full = getenv("TC_TEST_FULL"); /* the tests' own variable */
  if (full && (!strcmp(full, "1") || !strcasecmp(full, "true") || !strcasecmp(full, "yes") ||
               !strcasecmp(full, "on")))
    return 1;
  /* 8 ranks (4 per core here): the large algorithms' steps at that many
   * ranks, on one 4-byte and one 2-byte type; the other types and
   * reductions at the big count are covered on 2, 3 and 4 ranks, which
   * run the same code per element (make test: about 35 s less per
   * transport) */
  if (n >= 8) /* n 0: no limit (the mixes, multi-host) */
    return d->reducing ? op == TC_SUM && (dt == TC_FLOAT32 || dt == TC_BFLOAT16)
                       : dt == TC_FLOAT32 || dt == TC_FLOAT16;
  if (d->reducing)
    return op == TC_SUM || dt == TC_FLOAT32 || dt == TC_BFLOAT16 ||
           dt == TC_INT32;
  return dt == TC_UINT8 || dt == TC_FLOAT16 || dt == TC_FLOAT32 ||
         dt == TC_INT64;
}

static void matrix_rank(tc_ctx_t *ctx) {
  const tc_op_desc_t *d = ctx->arg;
  tc_comm_t *c = tc_ctx_comm(ctx, "matrix", NULL);
  const size_t counts[] = {0, 1, 7, TC_BIG_COUNT};
  int k = 0;
  for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
    for (int dt = 0; dt < TC_DTYPE_COUNT; dt++) {
      for (int op = 0; op < (d->reducing ? TC_REDOP_COUNT : 1); op++) {
        if (d->reducing && !tc__redop_allowed((tc_dtype_t)dt, op)) continue;
        if (counts[ci] == TC_BIG_COUNT &&
            !big_allowed(d, (tc_dtype_t)dt, (tc_redop_type_t)op, ctx->size))
          continue;
        tc_redop_t rop = op == TC_PREMUL_SUM ? TC_OP_PREMUL_SUM(0.5)
                                             : TC_OP((tc_redop_type_t)op);
        int async = (k++ % 2) == 1;
        snprintf(tc_case, sizeof tc_case,
                 "%s rank %d of %d dtype %s op %s count %zu %s", d->name,
                 ctx->rank, ctx->size, tc_dtype_name((tc_dtype_t)dt),
                 d->reducing ? tc_redop_name((tc_redop_type_t)op) : "-",
                 counts[ci], async ? "async" : "sync");
        d->fn(c, ctx->rank, ctx->size, (tc_dtype_t)dt, rop, counts[ci], async);
      }
    }
  }
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

#define OP_DESC(name, reducing)                                                \
  static const tc_op_desc_t desc_##name = {#name, case_##name, reducing};

OP_DESC(all_reduce, 1)
OP_DESC(reduce, 1)
OP_DESC(broadcast, 0)
OP_DESC(all_gather, 0)
OP_DESC(all_gather_single, 0)
OP_DESC(all_gather_v, 0)
OP_DESC(reduce_scatter, 1)
OP_DESC(reduce_scatter_single, 1)
OP_DESC(reduce_scatter_v, 1)
OP_DESC(all_to_all_single, 0)
OP_DESC(all_to_all_v_single, 0)
OP_DESC(all_to_all, 0)
OP_DESC(scatter, 0)
OP_DESC(gather, 0)
OP_DESC(gather_single, 0)
OP_DESC(send_recv, 0)
OP_DESC(batch, 0)
OP_DESC(barrier, 0)

#define MATRIX(name, n)                                                        \
  TC_TEST(coll_##name##_w##n) { tc_spawn(n, matrix_rank, (void *)&desc_##name, 600); }

#define MATRIX_ALL(name)                                                       \
  MATRIX(name, 1) MATRIX(name, 2) MATRIX(name, 3) MATRIX(name, 4) MATRIX(name, 8)

MATRIX_ALL(all_reduce)
MATRIX_ALL(reduce)
MATRIX_ALL(broadcast)
MATRIX_ALL(all_gather)
MATRIX_ALL(all_gather_single)
MATRIX_ALL(all_gather_v)
MATRIX_ALL(reduce_scatter)
MATRIX_ALL(reduce_scatter_single)
MATRIX_ALL(reduce_scatter_v)
MATRIX_ALL(all_to_all_single)
MATRIX_ALL(all_to_all_v_single)
MATRIX_ALL(all_to_all)
MATRIX_ALL(scatter)
MATRIX_ALL(gather)
MATRIX_ALL(gather_single)
MATRIX_ALL(send_recv)
MATRIX_ALL(batch)
MATRIX_ALL(barrier)

/* ------------------------------------------------------------------------ */
/* Hierarchical algorithms on one machine                                    */
/* ------------------------------------------------------------------------ */

/* TORCHCOMMS_CPU_HIER_FAKE_HOSTS (tests only) puts the ranks on fake hosts,
 * so the cpu backend builds its hierarchy here: the communicator over TCP,
 * each fake host's ranks over shared memory, the hosts' leaders over TCP.
 * Every operation runs (the hierarchical ones and the flat ones beside
 * them) with exact values, on uneven layouts, one of them with hosts that
 * are not numbered host by host. */
typedef struct {
  int fake;       /* TORCHCOMMS_CPU_HIER_FAKE_HOSTS */
  const char *want; /* the log line of rank 0 */
} hier_case_t;

static char hier_log[128];

static void hier_rank(tc_ctx_t *ctx) {
  const hier_case_t *hc = ctx->arg;
  tc_comm_t *c = tc_ctx_comm(ctx, "hier", NULL);
  if (ctx->rank == 0) { /* the hierarchy was chosen: its log line */
    char path[160], text[1 << 16];
    snprintf(path, sizeof path, "%s.0", hier_log);
    FILE *f = fopen(path, "r");
    TC_ASSERT(f != NULL);
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    if (!strstr(text, hc->want))
      tc_test_fail(__FILE__, __LINE__, "the log %s lacks \"%s\"", path, hc->want);
  }
  static const tc_op_desc_t *const ops[] = {
      &desc_all_reduce, &desc_reduce, &desc_broadcast, &desc_all_gather,
      &desc_all_gather_single, &desc_reduce_scatter, &desc_reduce_scatter_single,
      &desc_barrier, &desc_all_gather_v, &desc_all_to_all_single, &desc_send_recv};
  const size_t counts[] = {0, 1, 7, 20001}; /* 20001 x 4 B > 64 KiB: ring, big halves */
  int k = 0;
  for (size_t oi = 0; oi < sizeof ops / sizeof ops[0]; oi++)
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
      for (int dt = 0; dt < TC_DTYPE_COUNT; dt++)
        for (int op = 0; op < (ops[oi]->reducing ? TC_REDOP_COUNT : 1); op++) {
          if (ops[oi]->reducing && !tc__redop_allowed((tc_dtype_t)dt, op)) continue;
          if (counts[ci] > 7 && !big_allowed(ops[oi], (tc_dtype_t)dt, (tc_redop_type_t)op, 0))
            continue;
          tc_redop_t rop = op == TC_PREMUL_SUM ? TC_OP_PREMUL_SUM(0.5)
                                               : TC_OP((tc_redop_type_t)op);
          int async = (k++ % 2) == 1;
          snprintf(tc_case, sizeof tc_case, "hier %d: %s rank %d of %d dtype %s op %s count %zu %s",
                   hc->fake, ops[oi]->name, ctx->rank, ctx->size,
                   tc_dtype_name((tc_dtype_t)dt),
                   ops[oi]->reducing ? tc_redop_name((tc_redop_type_t)op) : "-", counts[ci],
                   async ? "async" : "sync");
          ops[oi]->fn(c, ctx->rank, ctx->size, (tc_dtype_t)dt, rop, counts[ci], async);
        }
  /* every root of broadcast and reduce: on and off its host's leader */
  for (int root = 0; root < ctx->size; root++) {
    int32_t v[3] = {ctx->rank == root ? 7 : -1, 3, ctx->rank == root ? 9 : 5};
    TC_ASSERT_OK(tc_broadcast(c, v, 3, TC_INT32, root, NULL, NULL));
    TC_ASSERT_EQ(v[0], 7);
    TC_ASSERT_EQ(v[2], 9);
    int32_t s[2] = {ctx->rank + 1, 2};
    TC_ASSERT_OK(tc_reduce(c, s, 2, TC_INT32, TC_OP(TC_SUM), root, NULL, NULL));
    if (ctx->rank == root) {
      TC_ASSERT_EQ(s[0], ctx->size * (ctx->size + 1) / 2);
      TC_ASSERT_EQ(s[1], 2 * ctx->size);
    } else {
      TC_ASSERT_EQ(s[0], ctx->rank + 1); /* input only */
    }
  }
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

/* Fake hosts need a transport between the hosts: with
 * TORCHCOMMS_CPU_TRANSPORT=shm forced (the C suite run over shared memory
 * only) there is no hierarchy to test, so these tests take the default
 * (shared memory on a host, TCP between hosts) instead; "tcp" is kept. Each
 * test runs in its own forked process: the setting is not changed for the
 * tests after it. */
static void hier_transport(void) {
  const char *t = getenv("TORCHCOMMS_CPU_TRANSPORT");
  if (t && !strcmp(t, "shm")) unsetenv("TORCHCOMMS_CPU_TRANSPORT");
}

static void hier_run(int n, const hier_case_t *hc) {
  hier_transport();
  char fake[16];
  snprintf(fake, sizeof fake, "%d", hc->fake);
  setenv("TORCHCOMMS_CPU_HIER_FAKE_HOSTS", fake, 1);
  snprintf(hier_log, sizeof hier_log, "/tmp/tchier-%d.log", (int)getpid());
  char logf[160];
  snprintf(logf, sizeof logf, "%s.%%r", hier_log);
  setenv("TORCHCOMMS_LOG", "debug", 1);
  setenv("TORCHCOMMS_LOG_SUBSYS", "init", 1);
  setenv("TORCHCOMMS_LOG_FILE", logf, 1);
  tc_spawn(n, hier_rank, (void *)hc, 300);
  for (int r = 0; r < n; r++) {
    char path[160];
    snprintf(path, sizeof path, "%s.%d", hier_log, r);
    unlink(path);
  }
}

/* 5 ranks on 3 hosts: {0, 1} {2, 3} {4} (a host of one rank: no local group). */
TC_TEST(coll_hier_fake_hosts_5_on_3) {
  static const hier_case_t hc = {3, "'hier' rank 0: hierarchical: 3 hosts, 2 local ranks, "
                                    "leader rank 0 (local group over "};
  hier_run(5, &hc);
}

/* 5 ranks on 2 hosts, interleaved: {0, 2, 4} {1, 3}. */
TC_TEST(coll_hier_fake_hosts_interleaved) {
  static const hier_case_t hc = {-2, "'hier' rank 0: hierarchical: 2 hosts, 3 local ranks, "
                                     "leader rank 0 (local group over "};
  hier_run(5, &hc);
}

/* A collective mismatched across fake hosts (ranks 0, 1 on one, 2, 3 on the
 * other; the second host's ranks call all_reduce with another count) fails
 * on every rank, quickly: the leaders see the mismatch, named with
 * communicator ranks, and close the hierarchy's groups, so the other ranks
 * fail at once instead of at their deadline (30 s). */
static void hier_mismatch_rank(tc_ctx_t *ctx) {
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.timeout_s = 30;
  tc_comm_t *c = tc_ctx_comm(ctx, "hmis", &o);
  float v[64] = {0};
  double t0 = tc__now();
  int rc = tc_all_reduce(c, v, ctx->rank < 2 ? 64 : 32, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL);
  double took = tc__now() - t0;
  const char *msg = tc_last_error();
  if (rc == TC_OK) tc_test_fail(__FILE__, __LINE__, "rank %d: a mismatched all_reduce "
                                "succeeded", ctx->rank);
  if (took > 10)
    tc_test_fail(__FILE__, __LINE__, "rank %d failed only after %.1f s: %s", ctx->rank, took,
                 msg);
  if (ctx->rank == 0 || ctx->rank == 2) {
    const char *want = "mismatched collectives: rank 0 calls all_reduce #1 of 64 float32 "
                       "with SUM, rank 2 calls all_reduce #1 of 32 float32 with SUM";
    if (!strstr(msg, want) || !strstr(msg, "hierarchical all_reduce, step 'all_reduce "
                                          "between the hosts' leaders'"))
      tc_test_fail(__FILE__, __LINE__, "rank %d: \"%s\" lacks \"%s\"", ctx->rank, msg, want);
  }
  if (!strstr(msg, "torchcomms: all_reduce on 'hmis' (rank "))
    tc_test_fail(__FILE__, __LINE__, "rank %d: \"%s\": not the parent's format", ctx->rank,
                 msg);
  tc_comm_abort(c);
  tc_comm_destroy(c);
}

TC_TEST(coll_hier_fake_hosts_mismatch) {
  hier_transport();
  setenv("TORCHCOMMS_CPU_HIER_FAKE_HOSTS", "2", 1);
  tc_spawn(4, hier_mismatch_rank, NULL, 60);
}

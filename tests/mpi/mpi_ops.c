/* mpi_ops.c -- the operation matrix of a backend, as one rank of a job
 * started by any launcher: mpirun / mpiexec (Open MPI, MPICH), tcrun,
 * torchrun. Written for the `mpi` backend (issue 18; make test-mpi runs it
 * under both MPIs' launchers), it runs on any backend on device "cpu":
 *
 *   tc_mpi_ops [BACKEND]        BACKEND defaults to "mpi"
 *   ./build/tcrun -n 4 ./build/tc_mpi_ops cpu
 *   mpirun -np 4 -x TORCHCOMMS_BACKEND_LIB_PATH_MPI=build/mpi/openmpi \
 *     ./build/tc_mpi_ops
 *
 * Rank and size come from the environment (tc_env_rank_size: Open MPI's
 * OMPI_COMM_WORLD_RANK / _SIZE, MPICH's PMI_RANK / PMI_SIZE, torchrun's and
 * tcrun's RANK / WORLD_SIZE); the program itself does not link MPI.
 *
 * What it checks, every result compared exactly with a reference computed
 * locally (tests/c/coll_util.h; the case functions are those of
 * tests/c/test_collectives.c, compiled in, as tests/multihost/mh_check.c
 * does):
 *  1. every operation (all_reduce, reduce, broadcast, all_gather, its
 *     _single and _v forms, reduce_scatter, its _single and _v forms,
 *     all_to_all, all_to_all_single, all_to_all_v_single, scatter, gather,
 *     gather_single, send/recv, a batch of sends and receives to every rank,
 *     barrier) on every dtype, with every reduction the core allows on it
 *     (SUM, PRODUCT, MIN, MAX; BAND, BOR, BXOR on integers and bool; AVG;
 *     PREMUL_SUM on floats), at counts 0, 1 and 7; at 65537 elements the
 *     subset of test_collectives.c (reductions: SUM on every dtype, every
 *     reduction on float32, bfloat16 and int32; data movement: uint8,
 *     float16, float32, int64). Every other case is asynchronous (work
 *     object + wait), the rest synchronous. The float8 dtypes run where the
 *     backend's supports() accepts them and are counted as skipped where it
 *     does not; every other dtype must work.
 *  2. split: even and odd ranks (tc_comm_split), on each child an
 *     all_reduce (every reduction on float32 and int32), all_gather,
 *     broadcast, send/recv and batch at counts 1 and 7, exact.
 *  3. a timeout (2 or more ranks): rank 0 receives from rank 1, which never
 *     sends, with a per-operation timeout of 1 s: the wait must fail with
 *     TC_ERR_TIMEOUT after about that long, its message must say "timed out"
 *     and name "recv on 'mpi_ops' (rank 0 of N)"; rank 0 then aborts the
 *     communicator (a later operation fails with TC_ERR_ABORTED), while the
 *     other ranks wait on a barrier of a second communicator, so that no
 *     rank leaves before the timeout happened.
 *  4. a collective timeout (2 or more ranks): rank 0 alone calls an
 *     all_reduce with a 1 s timeout: TC_ERR_TIMEOUT, then the next operation
 *     on that communicator is refused at once ("out of step").
 *
 * Rank 0 prints one line per group of cases and "mpi_ops: N cases passed"
 * at the end (after every rank agreed on its count). The first failure
 * prints "FAIL <file>:<line> ...: <case>: <reason>" and exits 1. */
#define main tc_mpi_ops_runner_main_unused /* the runner's main is not ours */
#include "../c/runner.c"
#undef main
#include "../c/test_collectives.c"

#include "core/core.h" /* tc__comm_enter, tc__v_supports: the float8 probe */

#define MPI_OPS_BIG_COUNT ((size_t)65537)

typedef struct {
  const tc_op_desc_t *d;
  tc_op_type_t type; /* what supports() is asked */
} mpi_op_t;

static const mpi_op_t mpi_all_ops[] = {
    {&desc_all_reduce, TC_OP_ALL_REDUCE},
    {&desc_reduce, TC_OP_REDUCE},
    {&desc_broadcast, TC_OP_BROADCAST},
    {&desc_all_gather, TC_OP_ALL_GATHER},
    {&desc_all_gather_single, TC_OP_ALL_GATHER_SINGLE},
    {&desc_all_gather_v, TC_OP_ALL_GATHER_V},
    {&desc_reduce_scatter, TC_OP_REDUCE_SCATTER},
    {&desc_reduce_scatter_single, TC_OP_REDUCE_SCATTER_SINGLE},
    {&desc_reduce_scatter_v, TC_OP_REDUCE_SCATTER_V},
    {&desc_all_to_all, TC_OP_ALL_TO_ALL},
    {&desc_all_to_all_single, TC_OP_ALL_TO_ALL_SINGLE},
    {&desc_all_to_all_v_single, TC_OP_ALL_TO_ALL_V_SINGLE},
    {&desc_scatter, TC_OP_SCATTER},
    {&desc_gather, TC_OP_GATHER},
    {&desc_gather_single, TC_OP_GATHER_SINGLE},
    {&desc_send_recv, TC_OP_SEND},
    {&desc_batch, TC_OP_BATCH},
    {&desc_barrier, TC_OP_BARRIER},
};

static const mpi_op_t mpi_split_ops[] = {
    {&desc_all_reduce, TC_OP_ALL_REDUCE},
    {&desc_all_gather, TC_OP_ALL_GATHER},
    {&desc_broadcast, TC_OP_BROADCAST},
    {&desc_send_recv, TC_OP_SEND},
    {&desc_batch, TC_OP_BATCH},
};

static int mpi_is_fp8(tc_dtype_t dt) {
  return dt == TC_FLOAT8_E4M3FN || dt == TC_FLOAT8_E5M2;
}

/* 1 if the communicator's backend runs `type` on dt with redop (-1: none):
 * the question the core asks before every operation (supports()). */
static int mpi_supports(tc_comm_t *h, tc_op_type_t type, tc_dtype_t dt, int redop) {
  tc_comm_t *c = h;
  TC_ASSERT_OK(tc__comm_enter(&c, "mpi_ops probe"));
  return tc__v_supports(c, "mpi_ops probe", type, dt, redop) == TC_OK;
}

/* Runs op `m` on c at `count` over every dtype and allowed reduction (at
 * counts above 7 the big_allowed subset; `split_subset`: only float32 and
 * int32). Returns the cases run; adds the float8 cases the backend refused
 * to *skipped. k numbers the cases (sync / async alternate). */
static int mpi_run_op(tc_comm_t *c, const mpi_op_t *m, size_t count, int split_subset,
                      const char *label, int *k, int *skipped) {
  const tc_op_desc_t *d = m->d;
  int rank = tc_comm_rank(c), n = tc_comm_size(c), cases = 0;
  for (int dt = 0; dt < TC_DTYPE_COUNT; dt++) {
    if (split_subset && dt != TC_FLOAT32 && dt != TC_INT32) continue;
    if (d->fn == case_barrier && (count != 0 || dt != TC_FLOAT32)) continue;
    for (int op = 0; op < (d->reducing ? TC_REDOP_COUNT : 1); op++) {
      if (d->reducing && !tc__redop_allowed((tc_dtype_t)dt, op)) continue;
      if (count > 7 && !big_allowed(d, (tc_dtype_t)dt, (tc_redop_type_t)op, 0)) continue;
      if (mpi_is_fp8((tc_dtype_t)dt) &&
          !mpi_supports(c, m->type, (tc_dtype_t)dt, d->reducing ? op : -1)) {
        (*skipped)++;
        continue;
      }
      tc_redop_t rop = op == TC_PREMUL_SUM ? TC_OP_PREMUL_SUM(0.5)
                                           : TC_OP((tc_redop_type_t)op);
      /* the barrier, one case, runs both ways */
      for (int rep = 0; rep < (d->fn == case_barrier ? 2 : 1); rep++) {
        int async = ((*k)++ % 2) == 1;
        snprintf(tc_case, sizeof tc_case, "%s: %s rank %d of %d dtype %s op %s count %zu %s",
                 label, d->name, rank, n, tc_dtype_name((tc_dtype_t)dt),
                 d->reducing ? tc_redop_name((tc_redop_type_t)op) : "-", count,
                 async ? "async" : "sync");
        d->fn(c, rank, n, (tc_dtype_t)dt, rop, count, async);
        cases++;
      }
    }
  }
  return cases;
}

/* Many asynchronous all_reduces in flight at once, of the sizes that run
 * as steps over MPI_Isend/MPI_Irecv (recursive doubling, ring) and of one
 * that runs as MPI_Iallreduce, with small broadcasts (a tree of steps)
 * among them, issued back to back and waited at the end:
 * the steps of different operations between the same two ranks must never
 * match each other's messages (each operation has its own tag). Exact. */
static int mpi_concurrent(tc_comm_t *c, int rank, int n) {
  enum { K = 24 };
  static const size_t sizes[] = {2, 20000, 5, 100000, 3, 9000};
  float *buf[K];
  tc_work_t *w[K];
  for (int i = 0; i < K; i++) {
    size_t cnt = sizes[i % 6];
    buf[i] = tc_xmalloc(cnt * sizeof(float));
    for (size_t j = 0; j < cnt; j++) buf[i][j] = (float)((rank + 1) * (i + 1) + (int)(j % 7));
    snprintf(tc_case, sizeof tc_case, "concurrent: all_reduce %d of %d (count %zu) rank %d of %d",
             i, K, cnt, rank, n);
    w[i] = NULL;
    if (i % 6 == 4) /* a broadcast tree among them, from rank i % n */
      TC_ASSERT_OK(tc_broadcast(c, buf[i], cnt, TC_FLOAT32, i % n, NULL, &w[i]));
    else
      TC_ASSERT_OK(tc_all_reduce(c, buf[i], cnt, TC_FLOAT32, TC_OP(TC_SUM), NULL, &w[i]));
  }
  for (int i = 0; i < K; i++) {
    size_t cnt = sizes[i % 6];
    snprintf(tc_case, sizeof tc_case, "concurrent: all_reduce %d of %d (count %zu) rank %d of %d",
             i, K, cnt, rank, n);
    TC_ASSERT_OK(tc_work_wait(w[i]));
    TC_ASSERT_OK(tc_work_release(w[i]));
    for (size_t j = 0; j < cnt; j++) {
      float want = i % 6 == 4 ? (float)((i % n + 1) * (i + 1) + (int)(j % 7))
                              : (float)((i + 1) * n * (n + 1) / 2 + n * (int)(j % 7));
      if (buf[i][j] != want)
        tc_test_fail(__FILE__, __LINE__, "%s: element %zu is %g, want %g", tc_case, j,
                     (double)buf[i][j], (double)want);
    }
    free(buf[i]);
  }
  return K;
}

/* The timeout case (section 3 of the header). */
static void mpi_timeout(tc_comm_t *c, tc_comm_t *sync, int rank, int n) {
  snprintf(tc_case, sizeof tc_case, "timeout: recv rank %d of %d", rank, n);
  if (rank == 0) {
    float x = 0;
    tc_op_options_t o = TC_OP_OPTIONS_INIT;
    o.timeout_s = 1.0;
    tc_work_t *w = NULL;
    double t0 = tc__now();
    TC_ASSERT_OK(tc_recv(c, &x, 1, TC_FLOAT32, 1, &o, &w));
    int rc = tc_work_wait(w);
    double dt = tc__now() - t0;
    if (rc != TC_ERR_TIMEOUT)
      tc_test_fail(__FILE__, __LINE__, "%s: the wait returned %s, expected TC_ERR_TIMEOUT (%s)",
                   tc_case, tc_status_name(rc), tc_last_error());
    TC_ASSERT_EQ(tc_work_status(w), TC_WORK_TIMEDOUT);
    char want[128];
    snprintf(want, sizeof want, "recv on 'mpi_ops' (rank 0 of %d)", n);
    TC_ASSERT_CONTAINS(tc_work_error(w), "timed out");
    TC_ASSERT_CONTAINS(tc_work_error(w), want);
    if (!(dt >= 0.9 && dt < 10.0))
      tc_test_fail(__FILE__, __LINE__, "%s: the 1 s timeout took %.2f s", tc_case, dt);
    TC_ASSERT_OK(tc_work_release(w));
    TC_ASSERT_OK(tc_comm_abort(c));
    TC_ASSERT_EQ(tc_comm_is_aborted(c), 1);
    TC_ASSERT_ERR(tc_barrier(c, NULL, NULL), TC_ERR_ABORTED, "barrier");
  }
  /* rank 0 arrives after its timeout; no rank leaves c before that */
  TC_ASSERT_OK(tc_barrier(sync, NULL, NULL));
  if (rank != 0) TC_ASSERT_OK(tc_comm_abort(c));
}

/* A collective given up (section 4 of the header): rank 0 calls an
 * all_reduce that no other rank calls, with a 1 s timeout; it must fail with
 * TC_ERR_TIMEOUT, and the next operation on that communicator must be
 * refused at once (the ranks are out of step: MPI cannot cancel a
 * collective), never run against a stale message. */
static void mpi_coll_timeout(tc_comm_t *c, tc_comm_t *sync, int rank, int n) {
  snprintf(tc_case, sizeof tc_case, "collective timeout: rank %d of %d", rank, n);
  if (rank == 0) {
    float x = 1;
    tc_op_options_t o = TC_OP_OPTIONS_INIT;
    o.timeout_s = 1.0;
    double t0 = tc__now();
    int rc = tc_all_reduce(c, &x, 1, TC_FLOAT32, TC_OP(TC_SUM), &o, NULL);
    double dt = tc__now() - t0;
    if (rc != TC_ERR_TIMEOUT)
      tc_test_fail(__FILE__, __LINE__, "%s: all_reduce returned %s, expected TC_ERR_TIMEOUT (%s)",
                   tc_case, tc_status_name(rc), tc_last_error());
    char want[128];
    snprintf(want, sizeof want, "all_reduce on 'mpi_ops_coll' (rank 0 of %d)", n);
    TC_ASSERT_CONTAINS(tc_last_error(), want);
    TC_ASSERT_CONTAINS(tc_last_error(), "timed out");
    if (!(dt >= 0.9 && dt < 10.0))
      tc_test_fail(__FILE__, __LINE__, "%s: the 1 s timeout took %.2f s", tc_case, dt);
    t0 = tc__now();
    rc = tc_barrier(c, NULL, NULL);
    if (rc == TC_OK)
      tc_test_fail(__FILE__, __LINE__, "%s: a barrier after the given-up all_reduce ran", tc_case);
    TC_ASSERT_CONTAINS(tc_last_error(), "out of step");
    TC_ASSERT_CONTAINS(tc_last_error(), "barrier on 'mpi_ops_coll'");
    if (tc__now() - t0 > 0.5)
      tc_test_fail(__FILE__, __LINE__, "%s: the refusal took %.2f s", tc_case, tc__now() - t0);
  }
  TC_ASSERT_OK(tc_barrier(sync, NULL, NULL));
  TC_ASSERT_OK(tc_comm_abort(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

int main(int argc, char **argv) {
  const char *backend = argc > 1 ? argv[1] : "mpi";
  if (argc > 2 || (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")))) {
    fprintf(stderr, "usage: %s [BACKEND]   (default mpi; N processes from any launcher)\n",
            argv[0]);
    return 2;
  }
  int rank = -1, size = -1;
  const char *source = NULL;
  TC_ASSERT_OK(tc_env_rank_size(&rank, &size, &source));
  double t0 = tc__now();

  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.name = "mpi_ops";
  o.timeout_s = 120; /* a hang fails here, before the launcher's timeout */
  tc_comm_t *c = NULL, *sync = NULL;
  snprintf(tc_case, sizeof tc_case, "create backend %s rank %d of %d (from %s)", backend,
           rank, size, source);
  int rc = tc_comm_create(backend, "cpu", &o, &c);
  if (rc != TC_OK)
    tc_test_fail(__FILE__, __LINE__, "%s: %s: %s", tc_case, tc_status_name(rc),
                 tc_last_error());
  TC_ASSERT_EQ(tc_comm_rank(c), rank);
  TC_ASSERT_EQ(tc_comm_size(c), size);
  TC_ASSERT_STR_EQ(tc_comm_backend(c), backend);
  o.name = "mpi_ops_sync";
  TC_ASSERT_OK(tc_comm_create(backend, "cpu", &o, &sync));
  tc_comm_t *coll = NULL;
  o.name = "mpi_ops_coll";
  TC_ASSERT_OK(tc_comm_create(backend, "cpu", &o, &coll));
  if (rank == 0) {
    printf("mpi_ops: backend %s (%s), %d ranks (rank and size from %s)\n", backend,
           tc_comm_backend_version(c) ? tc_comm_backend_version(c) : "?", size, source);
    fflush(stdout);
  }

  /* 1. the matrix */
  const size_t counts[] = {0, 1, 7, MPI_OPS_BIG_COUNT};
  int total = 0, skipped = 0, k = 0;
  for (size_t oi = 0; oi < sizeof mpi_all_ops / sizeof mpi_all_ops[0]; oi++) {
    int cases = 0, skip0 = skipped;
    double t1 = tc__now();
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
      cases += mpi_run_op(c, &mpi_all_ops[oi], counts[ci], 0, "world", &k, &skipped);
    total += cases;
    if (rank == 0) {
      printf("mpi_ops: %-22s %4d cases passed (counts 0, 1, 7, %zu)", mpi_all_ops[oi].d->name,
             cases, MPI_OPS_BIG_COUNT);
      if (skipped > skip0) printf(", %d float8 cases skipped (not supported)", skipped - skip0);
      printf(" in %.1f s\n", tc__now() - t1);
      fflush(stdout);
    }
  }

  /* 2. split into even and odd ranks */
  {
    int *ranks = tc_xmalloc((size_t)size * sizeof *ranks);
    size_t nr = 0;
    for (int r = 0; r < size; r++)
      if (r % 2 == rank % 2) ranks[nr++] = r;
    tc_comm_t *s = NULL;
    const char *name = rank % 2 ? "mpi_ops_odd" : "mpi_ops_even";
    snprintf(tc_case, sizeof tc_case, "split %s rank %d of %d", name, rank, size);
    TC_ASSERT_OK(tc_comm_split(c, ranks, nr, name, NULL, &s));
    TC_ASSERT(s != NULL);
    TC_ASSERT_EQ(tc_comm_size(s), (long long)nr);
    TC_ASSERT_EQ(tc_comm_rank(s), rank / 2);
    TC_ASSERT_STR_EQ(tc_comm_name(s), name);
    int cases = 0;
    const size_t scounts[] = {1, 7};
    for (size_t oi = 0; oi < sizeof mpi_split_ops / sizeof mpi_split_ops[0]; oi++)
      for (size_t ci = 0; ci < 2; ci++)
        cases += mpi_run_op(s, &mpi_split_ops[oi], scounts[ci], 1, name, &k, &skipped);
    TC_ASSERT_OK(tc_comm_finalize(s));
    TC_ASSERT_OK(tc_comm_destroy(s));
    free(ranks);
    total += cases;
    if (rank == 0) {
      printf("mpi_ops: %-22s %4d cases passed (sizes %d and %d)\n", "split even/odd", cases,
             (size + 1) / 2, size / 2);
      fflush(stdout);
    }
  }

  /* 2b. asynchronous all_reduces in flight together */
  {
    double t1 = tc__now();
    int cases = 0;
    for (int round = 0; round < 20; round++) cases += mpi_concurrent(c, rank, size);
    total += cases;
    if (rank == 0) {
      printf("mpi_ops: %-22s %4d cases passed (24 in flight at a time) in %.1f s\n",
             "concurrent ar/bcast", cases, tc__now() - t1);
      fflush(stdout);
    }
  }

  /* every rank ran as many cases as rank 0 */
  int64_t mm[2] = {total, -(int64_t)total};
  snprintf(tc_case, sizeof tc_case, "case count agreement rank %d", rank);
  TC_ASSERT_OK(tc_all_reduce(c, mm, 2, TC_INT64, TC_OP(TC_MAX), NULL, NULL));
  if (mm[0] != total || -mm[1] != total)
    tc_test_fail(__FILE__, __LINE__, "rank %d ran %d cases, the ranks ran %lld to %lld",
                 rank, total, (long long)-mm[1], (long long)mm[0]);

  /* 3. a timeout */
  if (size >= 2) {
    double t1 = tc__now();
    mpi_timeout(c, sync, rank, size);
    total++;
    if (rank == 0) {
      printf("mpi_ops: timeout                   1 case passed (recv, 1 s: TC_ERR_TIMEOUT, "
             "then abort) in %.1f s\n", tc__now() - t1);
      fflush(stdout);
    }
    TC_ASSERT_OK(tc_comm_destroy(c));
    t1 = tc__now();
    mpi_coll_timeout(coll, sync, rank, size);
    total++;
    if (rank == 0) {
      printf("mpi_ops: collective timeout        1 case passed (all_reduce, 1 s: "
             "TC_ERR_TIMEOUT, the next operation refused) in %.1f s\n", tc__now() - t1);
      fflush(stdout);
    }
  } else {
    TC_ASSERT_OK(tc_comm_finalize(c));
    TC_ASSERT_OK(tc_comm_destroy(c));
    TC_ASSERT_OK(tc_comm_finalize(coll));
    TC_ASSERT_OK(tc_comm_destroy(coll));
  }
  TC_ASSERT_OK(tc_barrier(sync, NULL, NULL));
  TC_ASSERT_OK(tc_comm_finalize(sync));
  TC_ASSERT_OK(tc_comm_destroy(sync));
  if (rank == 0) {
    printf("mpi_ops: %d cases passed", total);
    if (skipped) printf(" (%d float8 cases skipped: not supported by the backend)", skipped);
    printf(" on backend %s, %d ranks, in %.1f s\n", backend, size, tc__now() - t0);
    fflush(stdout);
  }
  return 0;
}

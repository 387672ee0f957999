/* test_mismatch.c -- ranks that call different collectives (op, dtype,
 * count, root, reduction, or one collective more) fail on EVERY rank, at
 * once, with a message naming both sides; never a wrong result and never a
 * confusing error one operation later. (A rank of a small broadcast that
 * does not wait, its own data right, fails at its next operation with the
 * same message and a note that it was found later: the root over shared
 * memory; over TCP any rank of a broadcast of at most 4 KiB whose data
 * agreed with its parent's.) Runs over the transport the suite
 * runs on (make test: shared memory, then TORCHCOMMS_CPU_TRANSPORT=tcp), at
 * small and large sizes (every shared-memory path and the TCP algorithms). */
#include <stdint.h>
#include <time.h>

#include <stdatomic.h>

#include "coll_util.h" /* tc_shared_zalloc, tc_wait_flag; includes runner.h */

typedef struct spec {
  char op;   /* 'A' all_reduce, 'B' broadcast, 'R' reduce, 'G' all_gather_single,
              * 'S' reduce_scatter_single, 'T' all_to_all_single, 'X' barrier,
              * 'g' gather_single, 's' scatter */
  tc_dtype_t dtype;
  size_t count;
  int root;
  tc_redop_type_t redop;
} spec_t;

typedef struct mcase {
  const char *name;
  int n;        /* ranks */
  int odd;      /* the rank that runs `b` (every other rank runs `a`) */
  int extra;    /* 1: the odd rank first runs one barrier more */
  spec_t a, b;
  const char *want_a, *want_b; /* how the message describes each side */
} mcase_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int run_spec(tc_comm_t *c, const spec_t *s, int n) {
  size_t es = tc_dtype_size(s->dtype), cnt = s->count;
  char *in = calloc(cnt * (size_t)n + 1, es), *out = calloc(cnt * (size_t)n + 1, es);
  TC_ASSERT(in && out);
  int rc;
  switch (s->op) {
  case 'A': rc = tc_all_reduce(c, in, cnt, s->dtype, TC_OP(s->redop), NULL, NULL); break;
  case 'B': rc = tc_broadcast(c, in, cnt, s->dtype, s->root, NULL, NULL); break;
  case 'R': rc = tc_reduce(c, in, cnt, s->dtype, TC_OP(s->redop), s->root, NULL, NULL); break;
  case 'G': rc = tc_all_gather_single(c, out, in, cnt, s->dtype, NULL, NULL); break;
  case 'S':
    rc = tc_reduce_scatter_single(c, out, in, cnt, s->dtype, TC_OP(s->redop), NULL, NULL);
    break;
  case 'T': rc = tc_all_to_all_single(c, out, in, cnt, s->dtype, NULL, NULL); break;
  case 'X': rc = tc_barrier(c, NULL, NULL); break;
  case 'g': rc = tc_gather_single(c, out, in, cnt, s->dtype, s->root, NULL, NULL); break;
  default: TC_ASSERT(!"unknown op"); rc = -1;
  }
  free(in);
  free(out);
  return rc;
}

#define F32 TC_FLOAT32
#define I32 TC_INT32
#define BIG ((size_t)1 << 20) /* 4 MiB of float32: the large paths */

static const mcase_t cases[] = {
    {"dtype_same_bytes", 2, 1, 0, {'A', F32, 1024, 0, TC_SUM}, {'A', I32, 1024, 0, TC_SUM},
     "all_reduce #1 of 1024 float32 with SUM", "all_reduce #1 of 1024 int32 with SUM"},
    {"dtype_big", 2, 1, 0, {'A', F32, BIG, 0, TC_SUM}, {'A', I32, BIG, 0, TC_SUM},
     "of 1048576 float32 with SUM", "of 1048576 int32 with SUM"},
    {"redop", 3, 2, 0, {'A', F32, 64, 0, TC_SUM}, {'A', F32, 64, 0, TC_MAX},
     "all_reduce #1 of 64 float32 with SUM", "all_reduce #1 of 64 float32 with MAX"},
    {"redop_big", 4, 3, 0, {'A', F32, BIG, 0, TC_SUM}, {'A', F32, BIG, 0, TC_MIN},
     "with SUM", "with MIN"},
    {"all_reduce_vs_broadcast", 2, 1, 0, {'A', F32, 256, 0, TC_SUM}, {'B', F32, 256, 1, TC_SUM},
     "all_reduce #1 of 256 float32 with SUM", "broadcast #1 of 256 float32 from root 1"},
    {"broadcast_roots", 3, 1, 0, {'B', F32, 100, 0, TC_SUM}, {'B', F32, 100, 2, TC_SUM},
     "broadcast #1 of 100 float32 from root 0", "broadcast #1 of 100 float32 from root 2"},
    {"broadcast_roots_big", 2, 1, 0, {'B', F32, BIG, 0, TC_SUM}, {'B', F32, BIG, 1, TC_SUM},
     "from root 0", "from root 1"},
    {"broadcast_count_mid", 4, 2, 0, {'B', F32, 8192, 1, TC_SUM}, {'B', F32, 8193, 1, TC_SUM},
     "broadcast #1 of 8192 float32", "broadcast #1 of 8193 float32"},
    {"reduce_roots", 3, 0, 0, {'R', F32, 10, 1, TC_SUM}, {'R', F32, 10, 2, TC_SUM},
     "reduce #1 of 10 float32 with SUM to root 1", "reduce #1 of 10 float32 with SUM to root 2"},
    {"count", 4, 1, 0, {'G', F32, 300, 0, TC_SUM}, {'G', F32, 301, 0, TC_SUM},
     "all_gather_single #1 of 300 float32", "all_gather_single #1 of 301 float32"},
    {"gather_vs_scatter_op", 2, 0, 0, {'S', F32, 4096, 0, TC_SUM}, {'T', F32, 4096, 0, TC_SUM},
     "reduce_scatter_single #1 of 4096 float32 with SUM", "all_to_all_single #1 of 4096 float32"},
    {"one_collective_more", 3, 1, 1, {'A', F32, 16, 0, TC_SUM}, {'A', F32, 16, 0, TC_SUM},
     "all_reduce #1 of 16 float32 with SUM", "barrier #1"},
    {"gather_root_zero_count", 2, 1, 0, {'g', F32, 0, 0, TC_SUM}, {'g', F32, 0, 1, TC_SUM},
     "gather_single #1 of 0 float32 to root 0", "gather_single #1 of 0 float32 to root 1"},
    /* over shared memory, data that fits beside the header in one line
     * (16 bytes) keeps its headers in another ring than more data
     * (shm_algos.c, fp_hdr_at): each side finds the other's there */
    {"count_line_vs_slot", 2, 1, 0, {'A', F32, 4, 0, TC_SUM}, {'A', F32, 5, 0, TC_SUM},
     "all_reduce #1 of 4 float32 with SUM", "all_reduce #1 of 5 float32 with SUM"},
    {"broadcast_line_vs_slot", 3, 2, 0, {'B', I32, 4, 0, TC_SUM}, {'B', I32, 8, 0, TC_SUM},
     "broadcast #1 of 4 int32 from root 0", "broadcast #1 of 8 int32 from root 0"},
    {"broadcast_root_slot_vs_line", 2, 0, 0, {'B', I32, 2, 0, TC_SUM}, {'B', I32, 40, 0, TC_SUM},
     "broadcast #1 of 2 int32 from root 0", "broadcast #1 of 40 int32 from root 0"},
};

/* A case and a counter shared by its ranks (an anonymous shared mapping). */
typedef struct {
  const mcase_t *k;
  _Atomic int *reported;
} mrun_t;

static void mismatch_rank(tc_ctx_t *ctx) {
  const mrun_t *run = ctx->arg;
  const mcase_t *k = run->k;
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.timeout_s = 30;
  char name[64];
  snprintf(name, sizeof name, "mm-%s", k->name);
  tc_comm_t *c = tc_ctx_comm(ctx, name, &o);
  int odd = ctx->rank == k->odd;
  double t0 = now_s();
  int rc = TC_OK;
  if (odd && k->extra) rc = tc_barrier(c, NULL, NULL);
  const spec_t *mine = odd ? &k->b : &k->a;
  if (rc == TC_OK) rc = run_spec(c, mine, ctx->size);
  const char *tp = getenv("TORCHCOMMS_CPU_TRANSPORT");
  const int tcp_small = tp && !strcmp(tp, "tcp") && mine->count * tc_dtype_size(mine->dtype) <= 4096;
  if (rc == TC_OK && mine->op == 'B' && (mine->root == ctx->rank || tcp_small)) {
    /* the root of a small broadcast over shared memory does not wait for
     * its receivers, nor over TCP any rank for the peers it receives no
     * data from (backends/cpu/backend.c, "Fingerprints owed"): such a
     * rank, its own data right, finds the mismatch at its next operation */
    float y = 1;
    rc = tc_all_reduce(c, &y, 1, F32, TC_OP(TC_SUM), NULL, NULL);
  }
  double took = now_s() - t0;
  fprintf(stderr, "[%s rank %d] %.3f s: %s\n", k->name, ctx->rank, took, tc_last_error());
  /* no rank leaves before every rank has its error: a rank that exits right
   * after its own mismatch error closes its connections, and a peer whose
   * fingerprint from the odd rank is still on its way (over TCP the odd
   * rank writes them peer after peer) then sees that hang-up first and
   * reports the lost peer instead (a real job's ranks exit the same way;
   * docs/reliability.md). What is tested here is the mismatch report. */
  atomic_fetch_add(run->reported, 1);
  tc_wait_flag(run->reported, ctx->size, 30);
  /* every rank fails, with the mismatch itself, naming both sides */
  if (rc != TC_ERR_PROTOCOL)
    tc_test_fail(__FILE__, __LINE__, "%s: rank %d got %s, expected TC_ERR_PROTOCOL (%s)",
                 k->name, ctx->rank, tc_status_name(rc), tc_last_error());
  TC_ASSERT_CONTAINS(tc_last_error(), "mismatched collectives");
  TC_ASSERT_CONTAINS(tc_last_error(), k->want_b);
  if (!(k->extra && odd)) TC_ASSERT_CONTAINS(tc_last_error(), k->want_a);
  char side[32];
  snprintf(side, sizeof side, "rank %d calls", k->odd);
  TC_ASSERT_CONTAINS(tc_last_error(), side);
  TC_ASSERT(took < 10); /* at once, not at the 30 s timeout */
  /* the communicator stays failed, with the first cause in the text */
  float x = 1;
  TC_ASSERT_EQ(tc_all_reduce(c, &x, 1, F32, TC_OP(TC_SUM), NULL, NULL), TC_ERR_PROTOCOL);
  TC_ASSERT_CONTAINS(tc_last_error(), "mismatched collectives");
  tc_comm_abort(c);
  tc_comm_destroy(c);
}

#define MCASE(i)                                                                   \
  TC_TEST(mismatch_##i) {                                                          \
    mrun_t run = {&cases[i], tc_shared_zalloc(sizeof(_Atomic int))};               \
    tc_spawn(cases[i].n, mismatch_rank, &run, 60);                                 \
  }
MCASE(0) MCASE(1) MCASE(2) MCASE(3) MCASE(4) MCASE(5) MCASE(6) MCASE(7) MCASE(8) MCASE(9)
MCASE(10) MCASE(11) MCASE(12) MCASE(13) MCASE(14) MCASE(15)
_Static_assert(sizeof cases / sizeof cases[0] == 16, "one MCASE per case");

/* With the check off (TORCHCOMMS_CHECK_MISMATCH=0) the sizes are still
 * compared: an all_gather_v whose receive counts differ between the ranks
 * (rank 0: 4 and 4 float32, its data in header lines; rank 1: 4 and 5, its
 * data in the slots), where the block rank 1 expects from rank 0 is the
 * size rank 0 sends. Over shared memory rank 1 finds rank 0's header in the
 * other ring and fails rather than read the wrong place; rank 0 finds rank
 * 1's 20 bytes. Every rank fails with a protocol error, except rank 1 over
 * TCP, whose messages are what it asked for: its result is then exact. */
static void v_counts_rank(tc_ctx_t *ctx) {
  _Atomic int *reported = ctx->arg;
  setenv("TORCHCOMMS_CHECK_MISMATCH", "0", 1);
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.timeout_s = 30;
  tc_comm_t *c = tc_ctx_comm(ctx, "mm-v-counts", &o);
  float in[5] = {1, 2, 3, 4, 5}, out0[5], out1[5];
  void *outs[2] = {out0, out1};
  size_t counts[2] = {4, ctx->rank == 0 ? 4u : 5u};
  double t0 = now_s();
  int rc = tc_all_gather_v(c, outs, counts, in, counts[ctx->rank], F32, NULL, NULL);
  double took = now_s() - t0;
  char why[1024];
  snprintf(why, sizeof why, "%s", tc_last_error());
  fprintf(stderr, "[v_counts rank %d] %.3f s: %s\n", ctx->rank, took, why);
  atomic_fetch_add(reported, 1);
  tc_wait_flag(reported, ctx->size, 30);
  TC_ASSERT(took < 10);
  if (rc == TC_OK && ctx->rank == 1 && getenv("TORCHCOMMS_CPU_TRANSPORT") &&
      !strcmp(getenv("TORCHCOMMS_CPU_TRANSPORT"), "tcp")) {
    /* over TCP, with no fingerprints, rank 1 got what it asked for: exact */
    for (int i = 0; i < 4; i++) TC_ASSERT_EQ((int)out0[i], i + 1);
    for (int i = 0; i < 5; i++) TC_ASSERT_EQ((int)out1[i], i + 1);
  } else {
    TC_ASSERT_EQ(rc, TC_ERR_PROTOCOL);
    if (ctx->rank == 0) TC_ASSERT_CONTAINS(why, "peer 1");
    else TC_ASSERT_CONTAINS(why, "peer 0");
    TC_ASSERT_CONTAINS(why, "mismatched count");
  }
  tc_comm_abort(c);
  tc_comm_destroy(c);
}
TC_TEST(mismatch_v_counts_check_off_w2) {
  tc_spawn(2, v_counts_rank, tc_shared_zalloc(sizeof(_Atomic int)), 60);
}

/* Matching collectives of every kind keep working with the check on (the
 * fingerprints of 200 collectives in a row agree, sequence numbers too). */
static void agree_rank(tc_ctx_t *ctx) {
  tc_comm_t *c = tc_ctx_comm(ctx, "mm-agree", NULL);
  for (int it = 0; it < 200; it++) {
    float v[33];
    for (int i = 0; i < 33; i++) v[i] = (float)(ctx->rank + i);
    TC_ASSERT_OK(tc_all_reduce(c, v, 33, F32, TC_OP(TC_SUM), NULL, NULL));
    for (int i = 0; i < 33; i++)
      TC_ASSERT_EQ((long long)v[i], (long long)(ctx->size * (ctx->size - 1) / 2 + ctx->size * i));
    int root = it % ctx->size;
    float b = (float)(ctx->rank == root ? 1000 + it : -1);
    TC_ASSERT_OK(tc_broadcast(c, &b, 1, F32, root, NULL, NULL));
    TC_ASSERT_EQ((long long)b, 1000 + it);
    if (it % 50 == 0) TC_ASSERT_OK(tc_barrier(c, NULL, NULL));
  }
  TC_ASSERT_OK(tc_comm_finalize(c));
  tc_comm_destroy(c);
}

TC_TEST(mismatch_none_when_agreeing_w3) { tc_spawn(3, agree_rank, NULL, 60); }

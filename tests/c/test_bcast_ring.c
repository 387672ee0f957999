/* test_bcast_ring.c -- the root of a small broadcast over shared memory
 * runs ahead of its receivers (a ring of TC_SHM_LINES header lines per
 * rank for data that fits beside the header in one line, of TC_SHM_SLOTS
 * slots for more; shm_algos.c), and the mismatch check it skips is made
 * later. The bcast_tcp_* cases: the same over TCP, where in a broadcast
 * of at most 4 KiB each rank reads the fingerprints of the peers that send
 * it no data later (backends/cpu/backend.c, "Fingerprints owed"): the root
 * runs ahead (63 broadcasts of 16 bytes, 7 of 4 KiB; at 2, 3 and 4 ranks),
 * so does a receiver with it (4 ranks), a mismatch is found at a later
 * operation (every receiver, or a leaf under another receiver), two roots
 * of many 4 KiB broadcasts fail with the mismatch (not in a full socket),
 * and point-to-point, collectives and finalize after such broadcasts read
 * what is owed first.
 *
 *  - runs_ahead: the root completes TC_SHM_LINES - 1 broadcasts of 16
 *    bytes (runs_ahead_slots: TC_SHM_SLOTS - 1 of 64 bytes) before any
 *    receiver has issued one (a receiver waits on a flag the root sets
 *    after them); a root that waited for its receivers would never set it
 *    and the test would fail at its deadline. Every receiver then gets
 *    every value, in order.
 *  - mixed: line and slot broadcasts interleaved while the root runs ahead
 *    (the checks due in either ring at their own depth): exact values.
 *  - stream: 3000 broadcasts of changing data from changing roots, mixed
 *    with all_reduces, receivers lagging by uneven work: exact values.
 *  - two_roots_finalize: two ranks each broadcast as root (a mismatch that
 *    no receiver sees); finalize finds it and fails, naming both sides
 *    (over TCP the broadcast itself fails).
 *  - deep_mismatch: the receivers' 50th broadcast has another count, while
 *    the root runs ahead of them (they lag by uneven work): the receivers
 *    fail at it, the root at its next operation (its checks of their
 *    headers are batched and its reads of their flags are sparse: shm_algos.c,
 *    fp_begin_root), every rank naming both sides. */
#include <stdlib.h>
#include <string.h>

#include "coll_util.h"

#define SLOTS 4  /* TC_SHM_SLOTS (transport/shm.h) */
#define LINES 32 /* TC_SHM_LINES */
#define MAXC 16  /* int32 per broadcast at most */
/* over TCP (backends/cpu/backend.c, "Fingerprints owed"): the root of a
 * broadcast of at most 4 KiB runs up to 63 ahead (CPU_OWED_MAX - 1), and
 * sends each receiver at most 32 KiB (CPU_OWED_BYTES) with the
 * fingerprints it has not read: 7 broadcasts of 4 KiB */
#define TCP_MAXC 1024

typedef struct {
  _Atomic int flag;
  int count; /* int32 per broadcast: 4 (the lines) or 16 (the slots) */
  int tcp;   /* over TCP: `ahead` broadcasts of `count` int32 */
  int ahead;
  int first; /* ranks below it (the root, 0, and its first receivers) go first */
} ahead_t;

static tc_comm_t *shm_comm(tc_ctx_t *ctx, const char *name) {
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.timeout_s = 30;
  return tc_ctx_comm(ctx, name, &o);
}

static void ahead_rank(tc_ctx_t *ctx) {
  ahead_t *a = ctx->arg;
  _Atomic int *flag = &a->flag;
  const int cnt = a->count, ahead = a->tcp ? a->ahead : (cnt == 4 ? LINES : SLOTS) - 1;
  /* the transport named, whatever the suite's pass (a forked rank: its own
   * environment) */
  setenv("TORCHCOMMS_CPU_TRANSPORT", a->tcp ? "tcp" : "shm", 1);
  tc_comm_t *c = shm_comm(ctx, "ring-ahead");
  int v[TCP_MAXC];
  if (ctx->rank < a->first) {
    for (int i = 0; i < ahead; i++) {
      for (int j = 0; j < cnt; j++) v[j] = ctx->rank == 0 ? 100 * i + j : -1;
      TC_ASSERT_OK(tc_broadcast(c, v, (size_t)cnt, TC_INT32, 0, NULL, NULL));
      for (int j = 0; j < cnt; j++) TC_ASSERT_EQ(v[j], 100 * i + j);
    }
    atomic_fetch_add(flag, 1); /* the others begin once all of these are here */
  } else {
    tc_wait_flag(flag, a->first, 20);
    for (int i = 0; i < ahead; i++) {
      memset(v, 0, sizeof v);
      TC_ASSERT_OK(tc_broadcast(c, v, (size_t)cnt, TC_INT32, 0, NULL, NULL));
      for (int j = 0; j < cnt; j++) TC_ASSERT_EQ(v[j], 100 * i + j);
    }
  }
  float x = 1;
  TC_ASSERT_OK(tc_all_reduce(c, &x, 1, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT_EQ((int)x, ctx->size);
  TC_ASSERT_OK(tc_comm_finalize(c));
  tc_comm_destroy(c);
}

static ahead_t *ahead_first(int count, int tcp, int ahead, int first) {
  ahead_t *a = tc_shared_zalloc(sizeof *a);
  a->count = count;
  a->tcp = tcp;
  a->ahead = ahead;
  a->first = first;
  return a;
}
static ahead_t *ahead_arg(int count, int tcp, int ahead) {
  return ahead_first(count, tcp, ahead, 1);
}
TC_TEST(bcast_ring_runs_ahead_w2) { tc_spawn(2, ahead_rank, ahead_arg(4, 0, 0), 60); }
TC_TEST(bcast_ring_runs_ahead_w3) { tc_spawn(3, ahead_rank, ahead_arg(4, 0, 0), 60); }
TC_TEST(bcast_ring_runs_ahead_slots_w2) { tc_spawn(2, ahead_rank, ahead_arg(16, 0, 0), 60); }
TC_TEST(bcast_ring_runs_ahead_slots_w3) { tc_spawn(3, ahead_rank, ahead_arg(16, 0, 0), 60); }
TC_TEST(bcast_tcp_runs_ahead_w2) { tc_spawn(2, ahead_rank, ahead_arg(4, 1, 63), 60); }
TC_TEST(bcast_tcp_runs_ahead_4k_w2) { tc_spawn(2, ahead_rank, ahead_arg(TCP_MAXC, 1, 7), 60); }
TC_TEST(bcast_tcp_runs_ahead_w3) { tc_spawn(3, ahead_rank, ahead_arg(4, 1, 63), 60); }
TC_TEST(bcast_tcp_runs_ahead_w4) { tc_spawn(4, ahead_rank, ahead_arg(4, 1, 63), 60); }
/* 4 ranks, root 0: rank 1 (a leaf under the root in the binomial tree)
 * finishes its 63 broadcasts with the root before ranks 2 and 3 begin:
 * a receiver reads only its parent's fingerprint at once, the others'
 * later */
TC_TEST(bcast_tcp_receiver_runs_ahead_w4) {
  tc_spawn(4, ahead_rank, ahead_first(4, 1, 63, 2), 60);
}

/* Broadcasts of 1-4 int32 (the lines) and of 16 (the slots) in an uneven
 * pattern from one root, the receivers lagging by uneven work: the root
 * runs ahead in both rings at once; every value exact. */
static void mixed_rank(tc_ctx_t *ctx) {
  tc_comm_t *c = shm_comm(ctx, "ring-mixed");
  volatile uint64_t sink = 0;
  for (int i = 0; i < 4000; i++) {
    size_t n = (i * 7) % 13 < 4 ? MAXC : 1 + (size_t)(i % 4);
    int32_t v[MAXC];
    for (size_t j = 0; j < n; j++) v[j] = ctx->rank == 0 ? i * 100 + (int32_t)j : -1;
    TC_ASSERT_OK(tc_broadcast(c, v, n, TC_INT32, 0, NULL, NULL));
    for (size_t j = 0; j < n; j++) TC_ASSERT_EQ(v[j], i * 100 + (int32_t)j);
    if (ctx->rank != 0) /* receivers lag by uneven work, no sleeping */
      for (int k = 0; k < ((i * 31 + ctx->rank * 17) % 97) * 40; k++) sink += (uint64_t)k;
  }
  TC_ASSERT_OK(tc_comm_finalize(c));
  tc_comm_destroy(c);
}
TC_TEST(bcast_ring_mixed_w2) { tc_spawn(2, mixed_rank, NULL, 120); }
TC_TEST(bcast_ring_mixed_w3) { tc_spawn(3, mixed_rank, NULL, 120); }

static void stream_rank(tc_ctx_t *ctx) {
  tc_comm_t *c = shm_comm(ctx, "ring-stream");
  volatile uint64_t sink = 0;
  for (int i = 0; i < 3000; i++) {
    int root = (i / 7) % ctx->size;
    size_t n = 1 + (size_t)(i % 37);
    int64_t v[37];
    for (size_t j = 0; j < n; j++) v[j] = ctx->rank == root ? (int64_t)i * 1000 + (int64_t)j : -1;
    TC_ASSERT_OK(tc_broadcast(c, v, n, TC_INT64, root, NULL, NULL));
    for (size_t j = 0; j < n; j++) TC_ASSERT_EQ(v[j], (int64_t)i * 1000 + (int64_t)j);
    if (i % 11 == 0) {
      int64_t s = ctx->rank + i;
      TC_ASSERT_OK(tc_all_reduce(c, &s, 1, TC_INT64, TC_OP(TC_SUM), NULL, NULL));
      TC_ASSERT_EQ(s, (int64_t)ctx->size * i + (int64_t)ctx->size * (ctx->size - 1) / 2);
    }
    /* receivers lag by uneven amounts of work (no sleeping) */
    for (int k = 0; k < ((i * 31 + ctx->rank * 17) % 97) * 50; k++) sink += (uint64_t)k;
  }
  TC_ASSERT_OK(tc_comm_finalize(c));
  tc_comm_destroy(c);
}

TC_TEST(bcast_ring_stream_w2) { tc_spawn(2, stream_rank, NULL, 120); }
TC_TEST(bcast_ring_stream_w4) { tc_spawn(4, stream_rank, NULL, 120); }

static void two_roots_rank(tc_ctx_t *ctx) {
  tc_comm_t *c = shm_comm(ctx, "ring-two-roots");
  int v[4] = {ctx->rank, ctx->rank, ctx->rank, ctx->rank};
  /* each rank believes it is the root: neither waits for the other */
  int rc = tc_broadcast(c, v, 4, TC_INT32, ctx->rank, NULL, NULL);
  /* neither root waits for the other's fingerprint (over TCP either: a
   * broadcast of at most 4 KiB), so finalize finds it, or the broadcast
   * itself where the peer's arrives while it waits for the connection */
  if (rc == TC_OK) rc = tc_comm_finalize(c);
  char why[1024];
  snprintf(why, sizeof why, "%s", tc_last_error());
  if (rc != TC_OK) tc_comm_abort(c);
  TC_ASSERT_EQ(rc, TC_ERR_PROTOCOL);
  TC_ASSERT_CONTAINS(why, "mismatched collectives");
  TC_ASSERT_CONTAINS(why, "broadcast #1 of 4 int32 from root 0");
  TC_ASSERT_CONTAINS(why, "broadcast #1 of 4 int32 from root 1");
  tc_comm_destroy(c);
}

TC_TEST(bcast_ring_two_roots_finalize_w2) { tc_spawn(2, two_roots_rank, NULL, 60); }

typedef struct {
  _Atomic int reported;
  int tcp; /* else shared memory, whatever the suite's pass */
  int odd; /* the one rank with the other count (0: every receiver) */
} deep_t;

static void deep_mismatch_rank(tc_ctx_t *ctx) {
  deep_t *d = ctx->arg;
  _Atomic int *reported = &d->reported;
  setenv("TORCHCOMMS_CPU_TRANSPORT", d->tcp ? "tcp" : "shm", 1);
  tc_comm_t *c = shm_comm(ctx, "ring-deep-mismatch");
  volatile uint64_t sink = 0;
  int rc = TC_OK;
  for (int i = 1; i <= 50 && rc == TC_OK; i++) {
    int v[5];
    const int other = d->odd ? ctx->rank == d->odd : ctx->rank != 0;
    size_t n = other && i == 50 ? 5 : 4;
    for (int j = 0; j < 5; j++) v[j] = ctx->rank == 0 ? 10 * i + j : -1;
    rc = tc_broadcast(c, v, n, TC_INT32, 0, NULL, NULL);
    if (rc == TC_OK && i < 50)
      for (int j = 0; j < 4; j++) TC_ASSERT_EQ(v[j], 10 * i + j);
    if (ctx->rank != 0) /* receivers lag by uneven work, no sleeping */
      for (int k = 0; k < ((i * 31 + ctx->rank * 17) % 97) * 40; k++) sink += (uint64_t)k;
  }
  if (rc == TC_OK) { /* the root, or a rank that did not read the odd one's fingerprint */
    float y = 1;
    rc = tc_all_reduce(c, &y, 1, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL);
  }
  char why[1024];
  snprintf(why, sizeof why, "%s", tc_last_error());
  /* no rank leaves before every rank has its error (test_mismatch.c) */
  atomic_fetch_add(reported, 1);
  tc_wait_flag(reported, ctx->size, 30);
  TC_ASSERT_EQ(rc, TC_ERR_PROTOCOL);
  TC_ASSERT_CONTAINS(why, "mismatched collectives");
  TC_ASSERT_CONTAINS(why, "broadcast #50 of 4 int32 from root 0");
  TC_ASSERT_CONTAINS(why, "broadcast #50 of 5 int32 from root 0");
  tc_comm_abort(c);
  tc_comm_destroy(c);
}

static deep_t *deep_odd(int tcp, int odd) {
  deep_t *d = tc_shared_zalloc(sizeof *d);
  d->tcp = tcp;
  d->odd = odd;
  return d;
}
static deep_t *deep_arg(int tcp) { return deep_odd(tcp, 0); }
TC_TEST(bcast_ring_deep_mismatch_w2) { tc_spawn(2, deep_mismatch_rank, deep_arg(0), 60); }
TC_TEST(bcast_ring_deep_mismatch_w3) { tc_spawn(3, deep_mismatch_rank, deep_arg(0), 60); }
TC_TEST(bcast_tcp_deep_mismatch_w2) { tc_spawn(2, deep_mismatch_rank, deep_arg(1), 60); }
TC_TEST(bcast_tcp_deep_mismatch_w3) { tc_spawn(3, deep_mismatch_rank, deep_arg(1), 60); }
TC_TEST(bcast_tcp_deep_mismatch_w4) { tc_spawn(4, deep_mismatch_rank, deep_arg(1), 60); }
/* only rank 3 (under rank 2 in the tree) has the other count: rank 3 finds
 * it in its parent's fingerprint at once; rank 2, which sends rank 3 the
 * data, and the root and rank 1, which exchange no data with it, read its
 * fingerprint later, at the all_reduce after */
TC_TEST(bcast_tcp_leaf_mismatch_w4) { tc_spawn(4, deep_mismatch_rank, deep_odd(1, 3), 60); }

/* Over TCP, two ranks that each believe they are the root of 200
 * broadcasts of 4 KiB: neither reads what the other sends, so a root that
 * let its fingerprints owed pile up (64 of them: 256 KiB) would fill the
 * sockets and both would block in a send until the timeout. Each reads the
 * other's fingerprint once it has sent it 32 KiB, and both fail with the
 * mismatch within the first broadcasts. */
static void tcp_two_roots_rank(tc_ctx_t *ctx) {
  _Atomic int *reported = ctx->arg;
  setenv("TORCHCOMMS_CPU_TRANSPORT", "tcp", 1);
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.timeout_s = 20;
  tc_comm_t *c = tc_ctx_comm(ctx, "tcp-two-roots", &o);
  static int32_t v[TCP_MAXC];
  int rc = TC_OK, i = 0;
  for (; i < 200 && rc == TC_OK; i++) {
    for (int j = 0; j < TCP_MAXC; j++) v[j] = ctx->rank * 1000000 + i * 1000 + j;
    rc = tc_broadcast(c, v, TCP_MAXC, TC_INT32, ctx->rank, NULL, NULL);
  }
  char why[1024];
  snprintf(why, sizeof why, "%s", tc_last_error());
  atomic_fetch_add(reported, 1);
  tc_wait_flag(reported, ctx->size, 30);
  TC_ASSERT_EQ(rc, TC_ERR_PROTOCOL);
  TC_ASSERT(i <= 9); /* the 8th at the latest finds it (32 KiB / 4 KiB + 1) */
  TC_ASSERT_CONTAINS(why, "mismatched collectives");
  TC_ASSERT_CONTAINS(why, "of 1024 int32 from root 0");
  TC_ASSERT_CONTAINS(why, "of 1024 int32 from root 1");
  tc_comm_abort(c);
  tc_comm_destroy(c);
}
TC_TEST(bcast_tcp_two_roots_bounded_w2) {
  tc_spawn(2, tcp_two_roots_rank, tc_shared_zalloc(sizeof(_Atomic int)), 60);
}

/* Over TCP, what follows broadcasts whose receivers' fingerprints the root
 * has not read yet, or that a receiver has not sent yet (queued: tc_xfer_t.lazy):
 * point-to-point both ways, an all_gather, and finalize; exact values, in
 * order, no error. */
static void tcp_after_rank(tc_ctx_t *ctx) {
  setenv("TORCHCOMMS_CPU_TRANSPORT", "tcp", 1);
  tc_comm_t *c = shm_comm(ctx, "tcp-after");
  for (int round = 0; round < 5; round++) {
    for (int i = 0; i < 10 + round * 13; i++) {
      int64_t v[3] = {-1, -1, -1};
      if (ctx->rank == 0)
        for (int j = 0; j < 3; j++) v[j] = round * 10000 + i * 10 + j;
      TC_ASSERT_OK(tc_broadcast(c, v, 3, TC_INT64, 0, NULL, NULL));
      for (int j = 0; j < 3; j++) TC_ASSERT_EQ(v[j], round * 10000 + i * 10 + j);
    }
    int32_t msg[8];
    if (ctx->rank == 1) {
      for (int j = 0; j < 8; j++) msg[j] = round * 100 + j;
      TC_ASSERT_OK(tc_send(c, msg, 8, TC_INT32, 0, NULL, NULL));
      TC_ASSERT_OK(tc_recv(c, msg, 8, TC_INT32, 0, NULL, NULL));
      for (int j = 0; j < 8; j++) TC_ASSERT_EQ(msg[j], round * 100 + j + 1);
    } else if (ctx->rank == 0) {
      TC_ASSERT_OK(tc_recv(c, msg, 8, TC_INT32, 1, NULL, NULL));
      for (int j = 0; j < 8; j++) TC_ASSERT_EQ(msg[j], round * 100 + j);
      for (int j = 0; j < 8; j++) msg[j]++;
      TC_ASSERT_OK(tc_send(c, msg, 8, TC_INT32, 1, NULL, NULL));
    }
    if (round % 2) {
      int32_t in = ctx->rank + round, out[8];
      TC_ASSERT_OK(tc_all_gather_single(c, out, &in, 1, TC_INT32, NULL, NULL));
      for (int r = 0; r < ctx->size; r++) TC_ASSERT_EQ(out[r], r + round);
    }
  }
  for (int i = 0; i < 20; i++) { /* the last ones checked by finalize */
    int32_t x = ctx->rank == 0 ? 7 * i : -1;
    TC_ASSERT_OK(tc_broadcast(c, &x, 1, TC_INT32, 0, NULL, NULL));
    TC_ASSERT_EQ(x, 7 * i);
  }
  TC_ASSERT_OK(tc_comm_finalize(c));
  tc_comm_destroy(c);
}
TC_TEST(bcast_tcp_then_p2p_w2) { tc_spawn(2, tcp_after_rank, NULL, 60); }
TC_TEST(bcast_tcp_then_p2p_w3) { tc_spawn(3, tcp_after_rank, NULL, 60); }

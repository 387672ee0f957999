/* test_bcast_split.c -- a broadcast at 2 ranks with single copy is copied
 * by both ranks: the receiver reads the first half of the root's buffer
 * while the root writes the second half into the receiver's output
 * (shm_algos.c, bcast_split_run). Single copy is forced from 1 byte
 * (TORCHCOMMS_CPU_CMA_BYTES=1), over shared memory even in the suite's TCP
 * pass (each rank a forked process with its own environment).
 *
 *  - values: sizes from 1 byte to 16 MiB + 5 (below one page, where the root
 *    writes everything; around the page-aligned split; odd sizes; above
 *    CPU_CMA_MAX_BLOCK, which limits single copy for the others), each
 *    rank as root, outputs at an odd offset: every byte exact, and the
 *    guard bytes on both sides of every output untouched (the root writes
 *    into the receiver's memory: a wrong offset or length would land
 *    there; each rank's guard bytes differ, so that the root's own cannot
 *    pass for the receiver's).
 *  - gate: the receiver gives up (its timeout) before the root has begun;
 *    only then does the root issue the broadcast. The root fails, naming
 *    the peer that gave up, and writes nothing: the receiver's output,
 *    checked after the root has returned, still holds what it held.
 *  - two_roots: with the mismatch check off, each rank calls itself the
 *    root. Both fail, naming the peer and the roots, and each buffer still
 *    holds its own rank's data (the headers' check refuses it first;
 *    neither rank opened a gate for this broadcast either). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_util.h"

enum { GUARD = 64 };

static tc_comm_t *split_comm(tc_ctx_t *ctx, const char *name, double timeout_s) {
  setenv("TORCHCOMMS_CPU_TRANSPORT", "shm", 1);
  setenv("TORCHCOMMS_CPU_CMA_BYTES", "1", 1);
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.timeout_s = timeout_s;
  return tc_ctx_comm(ctx, name, &o);
}

static unsigned char val(size_t i, size_t size, int root) {
  return (unsigned char)(i * 131u + size * 7u + (unsigned)root * 29u + 1u);
}

static void values_rank(tc_ctx_t *ctx) {
  tc_comm_t *c = split_comm(ctx, "split-values", 30);
  const size_t sizes[] = {1, 7, 4095, 4096, 8191, 8192, 8193, 12288, 65536 + 13, 262144,
                          (1u << 20) + 3, (3u << 20) + 5, (16u << 20) + 5};
  const size_t most = (16u << 20) + 5;
  unsigned char *mem = malloc(most + 2 * GUARD + 1);
  TC_ASSERT(mem != NULL);
  for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
    const size_t n = sizes[si];
    for (int root = 0; root < 2; root++) {
      unsigned char *buf = mem + GUARD + 1; /* an odd address */
      const unsigned char gb = (unsigned char)(0xA5 + ctx->rank); /* each rank its own */
      memset(mem, gb, n + 2 * GUARD + 1);
      for (size_t i = 0; i < n; i++) buf[i] = ctx->rank == root ? val(i, n, root) : 0x5A;
      TC_ASSERT_OK(tc_broadcast(c, buf, n, TC_UINT8, root, NULL, NULL));
      size_t wrong = 0;
      for (size_t i = 0; i < n; i++) wrong += buf[i] != val(i, n, root);
      if (wrong)
        tc_test_fail(__FILE__, __LINE__, "rank %d: %zu of %zu bytes wrong (root %d)", ctx->rank,
                     wrong, n, root);
      for (size_t i = 0; i < GUARD + 1; i++) TC_ASSERT_EQ(mem[i], gb);
      for (size_t i = 0; i < GUARD; i++) TC_ASSERT_EQ(buf[n + i], gb);
    }
  }
  free(mem);
  TC_ASSERT_OK(tc_comm_finalize(c));
  tc_comm_destroy(c);
}
TC_TEST(bcast_split_values_w2) { tc_spawn(2, values_rank, NULL, 120); }

typedef struct {
  _Atomic int gave_up;  /* the receiver's broadcast has failed */
  _Atomic int root_done; /* the root's broadcast has returned */
} gate_t;

static void gate_rank(tc_ctx_t *ctx) {
  gate_t *g = ctx->arg;
  tc_comm_t *c = split_comm(ctx, "split-gate", 30);
  const size_t n = 1u << 20;
  unsigned char *buf = malloc(n);
  TC_ASSERT(buf != NULL);
  if (ctx->rank == 1) { /* the receiver */
    memset(buf, 0x5A, n);
    tc_op_options_t o = TC_OP_OPTIONS_INIT;
    o.timeout_s = 0.3;
    int rc = tc_broadcast(c, buf, n, TC_UINT8, 0, &o, NULL);
    TC_ASSERT_EQ(rc, TC_ERR_TIMEOUT);
    atomic_store(&g->gave_up, 1);
    tc_wait_flag(&g->root_done, 1, 60);
    for (size_t i = 0; i < n; i++)
      if (buf[i] != 0x5A) tc_test_fail(__FILE__, __LINE__, "byte %zu was written: %d", i, buf[i]);
  } else {
    for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)i;
    tc_wait_flag(&g->gave_up, 1, 60);
    int rc = tc_broadcast(c, buf, n, TC_UINT8, 0, NULL, NULL);
    TC_ASSERT(rc != TC_OK);
    const char *e = tc_last_error();
    fprintf(stderr, "# root: %s\n", e);
    TC_ASSERT_CONTAINS(e, "broadcast");
    TC_ASSERT_CONTAINS(e, "peer 1");
    atomic_store(&g->root_done, 1);
  }
  free(buf);
  tc_comm_destroy(c);
}
TC_TEST(bcast_split_gate_w2) { tc_spawn(2, gate_rank, tc_shared_zalloc(sizeof(gate_t)), 90); }

static void two_roots_rank(tc_ctx_t *ctx) {
  setenv("TORCHCOMMS_CHECK_MISMATCH", "0", 1);
  tc_comm_t *c = split_comm(ctx, "split-roots", 30);
  const size_t n = 1u << 20;
  unsigned char *buf = malloc(n);
  TC_ASSERT(buf != NULL);
  for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)(i * 3u + (unsigned)ctx->rank);
  int rc = tc_broadcast(c, buf, n, TC_UINT8, ctx->rank, NULL, NULL);
  TC_ASSERT_EQ(rc, TC_ERR_PROTOCOL);
  const char *e = tc_last_error();
  fprintf(stderr, "# rank %d: %s\n", ctx->rank, e);
  /* the headers' check finds it first (it runs even with the setting
   * off); the gate would refuse the write after it */
  TC_ASSERT_CONTAINS(e, "root");
  TC_ASSERT_CONTAINS(e, ctx->rank == 0 ? "peer 1" : "peer 0");
  for (size_t i = 0; i < n; i++)
    if (buf[i] != (unsigned char)(i * 3u + (unsigned)ctx->rank))
      tc_test_fail(__FILE__, __LINE__, "rank %d: byte %zu was written", ctx->rank, i);
  free(buf);
  tc_comm_destroy(c);
}
TC_TEST(bcast_split_two_roots_w2) { tc_spawn(2, two_roots_rank, NULL, 60); }

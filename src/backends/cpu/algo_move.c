/* algo_move.c -- the data-movement algorithms of the cpu backend, written
 * against the transport's exchange.
 *
 *  broadcast       < 64 KiB: binomial tree; otherwise a pipelined chain of
 *                  512 KiB segments.
 *  send / recv     one transfer (a zero-count message is still sent, so a
 *                  count mismatch is reported, not hung on).
 *  batch           one exchange with every transfer; sends to the own rank
 *                  matched with its receives in posted order (memcpy).
 *  all_gather(_v, _single)  total < 64 KiB: one round (own block to every
 *                  peer) up to 8 ranks, Bruck's log2(n) rounds above (a
 *                  rank then talks to 2 log2(n) peers, not n - 1);
 *                  otherwise a ring over block pointers. In place when
 *                  sendbuf already is the own block.
 *  all_to_all(_single, _v_single)  total sent < 1 MiB: one round;
 *                  otherwise pairwise steps (send to r+s, receive from r-s).
 *                  Overlapping send and receive memory is staged in scratch.
 *  barrier         dissemination, header-only messages, ceil(log2 n) rounds.
 *  scatter / gather(_single)  root exchanges with everyone in one round.
 */
#include "backends/cpu/cpu.h"

#include <string.h>

/* ------------------------------------------------------------------------ */
/* point to point                                                            */
/* ------------------------------------------------------------------------ */

int tc__cpu_p2p(cpu_ctx_t *ctx) {
  const tc_backend_op_t *op = ctx->op;
  size_t bytes = op->count * ctx->es;
  tc_xfer_t *x;
  TC_CHECK(tc__cpu_xfers(ctx, 1, &x));
  if (op->kind == TC_KIND_SEND)
    x[0] = tc__xfer_send(op->root, op->sendbuf, bytes);
  else
    x[0] = tc__xfer_recv(op->root, op->recvbuf, bytes);
  return tc__cpu_xchg(ctx, x, 1);
}

/* The next entry at or after *i that is a self send (or receive). */
static const tc_p2p_t *next_self(const tc_backend_op_t *op, int rank, int is_send,
                                 size_t *i) {
  for (; *i < op->num_p2p; (*i)++) {
    const tc_p2p_t *p = &op->p2p[*i];
    if (p->peer == rank && !!p->is_send == is_send) return &op->p2p[(*i)++];
  }
  return NULL;
}

int tc__cpu_batch(cpu_ctx_t *ctx) {
  const tc_backend_op_t *op = ctx->op;
  int r = ctx->rank;
  /* self sends and receives pair up in posted order */
  size_t si = 0, ri = 0;
  for (;;) {
    const tc_p2p_t *s = next_self(op, r, 1, &si), *v = next_self(op, r, 0, &ri);
    if (!s && !v) break;
    if (!s || !v)
      return tc__cpu_fail(ctx, TC_ERR_INVALID_USAGE,
                          "the batch has a %s to its own rank without a matching %s",
                          s ? "send" : "receive", s ? "receive" : "send");
    size_t sb = s->count * tc_dtype_size(s->dtype), vb = v->count * tc_dtype_size(v->dtype);
    if (sb != vb)
      return tc__cpu_fail(ctx, TC_ERR_PROTOCOL,
                          "a send of %zu bytes to its own rank was matched with a "
                          "receive of %zu bytes (mismatched count or dtype?)", sb, vb);
    if (sb && s->buf != v->buf) memmove(v->buf, s->buf, sb);
  }
  tc_xfer_t *x;
  TC_CHECK(tc__cpu_xfers(ctx, op->num_p2p, &x));
  size_t k = 0;
  for (size_t i = 0; i < op->num_p2p; i++) {
    const tc_p2p_t *p = &op->p2p[i];
    if (p->peer == r) continue;
    size_t bytes = p->count * tc_dtype_size(p->dtype);
    x[k++] = p->is_send ? tc__xfer_send(p->peer, p->buf, bytes)
                        : tc__xfer_recv(p->peer, p->buf, bytes);
  }
  return tc__cpu_xchg(ctx, x, k);
}

/* ------------------------------------------------------------------------ */
/* broadcast                                                                 */
/* ------------------------------------------------------------------------ */

int tc__cpu_broadcast(cpu_ctx_t *ctx) {
  const tc_backend_op_t *op = ctx->op;
  int r = ctx->rank, n = ctx->size, root = op->root;
  size_t bytes = op->count * ctx->es;
  char *buf = op->recvbuf;
  if (bytes == 0 || n == 1) return TC_OK;
  int vr = cpu_mod(r - root, n);
  tc_xfer_t *x;
  TC_CHECK(tc__cpu_xfers(ctx, 34, &x));
  if (bytes < CPU_SMALL_BYTES) { /* binomial tree */
    int parent, child[32];
    int nc = cpu_tree(vr, n, &parent, child);
    if (parent >= 0) {
      x[0] = tc__xfer_recv(cpu_mod(parent + root, n), buf, bytes);
      TC_CHECK(tc__cpu_xchg(ctx, x, 1));
    }
    for (int c = 0; c < nc; c++) /* largest subtree first */
      x[c] = tc__xfer_send(cpu_mod(child[nc - 1 - c] + root, n), buf, bytes);
    return tc__cpu_xchg(ctx, x, (size_t)nc);
  }
  /* pipelined chain root -> root+1 -> ... : each rank forwards segment j-1
   * while it receives segment j */
  size_t seg = CPU_BCAST_SEG, nseg = (bytes + seg - 1) / seg;
  int prev = cpu_mod(r - 1, n), next = cpu_mod(r + 1, n), lag = vr > 0;
  for (size_t j = 0; j <= nseg; j++) {
    int k = 0;
    if (vr > 0 && j < nseg)
      x[k++] = tc__xfer_recv(prev, buf + j * seg, cpu_seg_len(bytes, j * seg, seg));
    if (vr < n - 1 && j >= (size_t)lag && j - (size_t)lag < nseg) {
      size_t s = j - (size_t)lag;
      x[k++] = tc__xfer_send(next, buf + s * seg, cpu_seg_len(bytes, s * seg, seg));
    }
    TC_CHECK(tc__cpu_xchg(ctx, x, (size_t)k));
  }
  return TC_OK;
}

/* ------------------------------------------------------------------------ */
/* all_gather                                                                */
/* ------------------------------------------------------------------------ */

/* Bruck's all-gather for small totals on many ranks: in step k (d = 2^k)
 * each rank sends the blocks it holds (its own and the next d - 1 ranks',
 * in rotated order in scratch) to rank - d and receives the next ones from
 * rank + d: ceil(log2 n) rounds with 2 log2(n) peers, where one round would
 * take n - 1 peers (and as many connections). Blocks may differ in size:
 * both sides of a step know every block's count. */
static int ag_bruck(cpu_ctx_t *ctx, const tc_block_t *blk, size_t total) {
  int r = ctx->rank, n = ctx->size;
  size_t es = ctx->es;
  char *scr;
  size_t tab = ((size_t)(n + 1) * sizeof(size_t) + 63) & ~(size_t)63;
  TC_CHECK(tc__cpu_scratch(ctx, tab + total, (void **)&scr));
  size_t *off = (size_t *)scr;
  char *held = scr + tab;
  off[0] = 0;
  for (int i = 0; i < n; i++) off[i + 1] = off[i] + blk[cpu_mod(r + i, n)].count * es;
  if (off[1]) memcpy(held, blk[r].buf, off[1]);
  tc_xfer_t *x;
  TC_CHECK(tc__cpu_xfers(ctx, 2, &x));
  for (int d = 1; d < n; d *= 2) {
    int cnt = d < n - d ? d : n - d;
    size_t k = 0, sbytes = off[cnt], rbytes = off[d + cnt] - off[d];
    if (sbytes) x[k++] = tc__xfer_send(cpu_mod(r - d, n), held, sbytes);
    if (rbytes) x[k++] = tc__xfer_recv(cpu_mod(r + d, n), held + off[d], rbytes);
    TC_CHECK(tc__cpu_xchg(ctx, x, k));
  }
  for (int i = 1; i < n; i++)
    if (off[i + 1] > off[i]) memcpy(blk[cpu_mod(r + i, n)].buf, held + off[i], off[i + 1] - off[i]);
  return TC_OK;
}

int tc__cpu_all_gather(cpu_ctx_t *ctx) {
  const tc_backend_op_t *op = ctx->op;
  const tc_block_t *blk = op->recv; /* where every rank's block goes */
  int r = ctx->rank, n = ctx->size;
  size_t es = ctx->es, total = 0;
  for (int i = 0; i < n; i++) total += blk[i].count * es;
  size_t mine = blk[r].count * es;
  if (mine && blk[r].buf != op->sendbuf) memmove(blk[r].buf, op->sendbuf, mine);
  if (total == 0 || n == 1) return TC_OK;
  if (total < CPU_DIRECT_GATHER_BYTES && n > CPU_DIRECT_GATHER_RANKS)
    return ag_bruck(ctx, blk, total);
  tc_xfer_t *x;
  TC_CHECK(tc__cpu_xfers(ctx, 2 * (size_t)n, &x));
  if (total < CPU_DIRECT_GATHER_BYTES) { /* one round */
    size_t k = 0;
    for (int i = 0; i < n; i++) {
      if (i == r) continue;
      if (mine) x[k++] = tc__xfer_send(i, blk[r].buf, mine);
      if (blk[i].count) x[k++] = tc__xfer_recv(i, blk[i].buf, blk[i].count * es);
    }
    return tc__cpu_xchg(ctx, x, k);
  }
  int right = cpu_mod(r + 1, n), left = cpu_mod(r - 1, n);
  for (int s = 0; s < n - 1; s++) { /* ring: forward what arrived last */
    int sb = cpu_mod(r - s, n), rb = cpu_mod(r - s - 1, n);
    size_t k = 0;
    if (blk[sb].count) x[k++] = tc__xfer_send(right, blk[sb].buf, blk[sb].count * es);
    if (blk[rb].count) x[k++] = tc__xfer_recv(left, blk[rb].buf, blk[rb].count * es);
    TC_CHECK(tc__cpu_xchg(ctx, x, k));
  }
  return TC_OK;
}

/* ------------------------------------------------------------------------ */
/* all_to_all                                                                */
/* ------------------------------------------------------------------------ */

int tc__cpu_all_to_all(cpu_ctx_t *ctx) {
  const tc_backend_op_t *op = ctx->op;
  const tc_block_t *sb = op->send, *rb = op->recv;
  int r = ctx->rank, n = ctx->size;
  size_t es = ctx->es, stotal = 0;
  /* does any send memory overlap any receive memory? (conservative: the
   * spans of the two sides) */
  const char *smin = NULL, *smax = NULL, *rmin = NULL, *rmax = NULL;
  for (int i = 0; i < n; i++) {
    const char *s = sb[i].buf, *v = rb[i].buf;
    size_t sl = sb[i].count * es, vl = rb[i].count * es;
    stotal += sl;
    if (sl && (!smin || s < smin)) smin = s;
    if (sl && (!smax || s + sl > smax)) smax = s + sl;
    if (vl && (!rmin || v < rmin)) rmin = v;
    if (vl && (!rmax || v + vl > rmax)) rmax = v + vl;
  }
  if (stotal == 0 && (op->flags & TC_OPF_UNIFORM)) return TC_OK;
  int stage = smin && rmin && smin < rmax && rmin < smax;
  /* block tables in scratch: send ptr/len, recv ptr/len; then staging */
  size_t tab = (size_t)n * 2 * (sizeof(char *) + sizeof(size_t));
  tab = (tab + 63) & ~(size_t)63;
  char *scr;
  TC_CHECK(tc__cpu_scratch(ctx, tab + (stage ? stotal : 0), (void **)&scr));
  char **sp = (char **)scr, **rp = sp + n;
  size_t *sl = (size_t *)(rp + n), *rl = sl + n;
  char *staged = scr + tab;
  size_t soff = 0;
  for (int i = 0; i < n; i++) {
    sp[i] = sb[i].buf;
    rp[i] = rb[i].buf;
    sl[i] = sb[i].count * es;
    rl[i] = rb[i].count * es;
    if (stage) {
      if (sl[i]) memcpy(staged + soff, sp[i], sl[i]);
      sp[i] = staged + soff;
    }
    soff += sl[i];
  }
  if (sl[r] != rl[r])
    return tc__cpu_fail(ctx, TC_ERR_INVALID_ARGUMENT,
                        "sends %zu bytes to its own rank but expects %zu from it",
                        sl[r], rl[r]);
  if (sl[r] && sp[r] != rp[r]) memmove(rp[r], sp[r], sl[r]);
  if (n == 1) return TC_OK;
  tc_xfer_t *x;
  TC_CHECK(tc__cpu_xfers(ctx, 2 * (size_t)n, &x));
  if (stotal < CPU_DIRECT_A2A_BYTES) {
    size_t k = 0;
    for (int s = 1; s < n; s++) {
      int to = cpu_mod(r + s, n), from = cpu_mod(r - s, n);
      x[k++] = tc__xfer_send(to, sp[to], sl[to]);
      x[k++] = tc__xfer_recv(from, rp[from], rl[from]);
    }
    return tc__cpu_xchg(ctx, x, k);
  }
  for (int s = 1; s < n; s++) {
    int to = cpu_mod(r + s, n), from = cpu_mod(r - s, n);
    x[0] = tc__xfer_send(to, sp[to], sl[to]);
    x[1] = tc__xfer_recv(from, rp[from], rl[from]);
    TC_CHECK(tc__cpu_xchg(ctx, x, 2));
  }
  return TC_OK;
}

/* ------------------------------------------------------------------------ */
/* barrier, scatter, gather                                                  */
/* ------------------------------------------------------------------------ */

int tc__cpu_barrier(cpu_ctx_t *ctx) {
  int r = ctx->rank, n = ctx->size;
  tc_xfer_t *x;
  TC_CHECK(tc__cpu_xfers(ctx, 2, &x));
  for (int k = 1; k < n; k <<= 1) {
    x[0] = tc__xfer_send(cpu_mod(r + k, n), NULL, 0);
    x[1] = tc__xfer_recv(cpu_mod(r - k, n), NULL, 0);
    TC_CHECK(tc__cpu_xchg(ctx, x, 2));
  }
  return TC_OK;
}

int tc__cpu_scatter(cpu_ctx_t *ctx) {
  const tc_backend_op_t *op = ctx->op;
  int r = ctx->rank, n = ctx->size, root = op->root;
  size_t bytes = op->count * ctx->es;
  if (bytes == 0) return TC_OK;
  tc_xfer_t *x;
  TC_CHECK(tc__cpu_xfers(ctx, (size_t)n, &x));
  if (r != root) {
    x[0] = tc__xfer_recv(root, op->recvbuf, bytes);
    return tc__cpu_xchg(ctx, x, 1);
  }
  if (op->send[r].buf != op->recvbuf) memmove(op->recvbuf, op->send[r].buf, bytes);
  size_t k = 0;
  for (int i = 0; i < n; i++)
    if (i != r) x[k++] = tc__xfer_send(i, op->send[i].buf, bytes);
  return tc__cpu_xchg(ctx, x, k);
}

int tc__cpu_gather(cpu_ctx_t *ctx) {
  const tc_backend_op_t *op = ctx->op;
  int r = ctx->rank, n = ctx->size, root = op->root;
  size_t bytes = op->count * ctx->es;
  if (bytes == 0) return TC_OK;
  tc_xfer_t *x;
  TC_CHECK(tc__cpu_xfers(ctx, (size_t)n, &x));
  if (r != root) {
    x[0] = tc__xfer_send(root, op->sendbuf, bytes);
    return tc__cpu_xchg(ctx, x, 1);
  }
  size_t k = 0;
  for (int i = 0; i < n; i++) {
    char *dst = op->recv[i].buf;
    if (i == r) {
      if (dst != (const char *)op->sendbuf) memmove(dst, op->sendbuf, bytes);
    } else {
      x[k++] = tc__xfer_recv(i, dst, bytes);
    }
  }
  return tc__cpu_xchg(ctx, x, k);
}

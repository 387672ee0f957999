/* algos2.c -- the data-movement algorithms of the cpu backend.
 *
 *  send / recv     one transfer (a zero-count message is still sent, so a
 *                  count mismatch is reported, not hung on).
 *  batch           one exchange with every transfer; sends to the own rank
 *                  matched with its receives in posted order (memcpy).
 *  all_gather(_v, _single)  total < 64 KiB: one round (own block to every
 *                  peer); otherwise a ring over block pointers. In place
 *                  when sendbuf already is the own block.
 *  all_to_all(_single, _v_single)  total sent < 1 MiB: one round;
 *                  otherwise pairwise steps (send to r+s, receive from r-s).
 *                  Overlapping send and receive memory is staged in scratch.
 *  barrier         dissemination, header-only messages, ceil(log2 n) rounds.
 *  scatter / gather(_single)  root exchanges with everyone in one round.
 */
#include "backends/cpu/cpu.h"

#include <string.h>

#define MOD(a, n) ((((a) % (n)) + (n)) % (n))

/* ------------------------------------------------------------------------ */
/* point to point                                                            */
/* ------------------------------------------------------------------------ */

int tc__cpu_p2p(cpu_ctx_t *ctx) {
  const tc_backend_op_t *op = ctx->op;
  size_t bytes = op->count * ctx->es;
  tc_xfer_t *x;
  TC_CHECK(tc__cpu_xfers(ctx, 1, &x));
  if (op->type == TC_OP_SEND)
    x[0] = tc__xfer_send(op->root, op->sendbuf ? op->sendbuf : op->recvbuf, bytes);
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
/* all_gather                                                                */
/* ------------------------------------------------------------------------ */

int tc__cpu_all_gather(cpu_ctx_t *ctx) {
  const tc_backend_op_t *op = ctx->op;
  int r = ctx->rank, n = ctx->size;
  size_t es = ctx->es, total = 0;
  /* the destination of every rank's block, kept in scratch */
  char **blk;
  size_t *len;
  TC_CHECK(tc__cpu_scratch(ctx, (size_t)n * (sizeof *blk + sizeof *len), (void **)&blk));
  len = (size_t *)(blk + n);
  for (int i = 0; i < n; i++) {
    switch (op->type) {
    case TC_OP_ALL_GATHER_SINGLE:
      blk[i] = (char *)op->recvbuf + (size_t)i * op->count * es;
      len[i] = op->count * es;
      break;
    case TC_OP_ALL_GATHER_V:
      blk[i] = op->recvbufs[i];
      len[i] = op->recvcounts[i] * es;
      break;
    default:
      blk[i] = op->recvbufs[i];
      len[i] = op->count * es;
      break;
    }
    total += len[i];
  }
  if (len[r] && blk[r] != (const char *)op->sendbuf) memmove(blk[r], op->sendbuf, len[r]);
  if (total == 0 || n == 1) return TC_OK;
  tc_xfer_t *x;
  TC_CHECK(tc__cpu_xfers(ctx, 2 * (size_t)n, &x));
  if (total < CPU_DIRECT_GATHER_BYTES) { /* one round */
    size_t k = 0;
    for (int i = 0; i < n; i++) {
      if (i == r) continue;
      if (len[r]) x[k++] = tc__xfer_send(i, blk[r], len[r]);
      if (len[i]) x[k++] = tc__xfer_recv(i, blk[i], len[i]);
    }
    return tc__cpu_xchg(ctx, x, k);
  }
  int right = MOD(r + 1, n), left = MOD(r - 1, n);
  for (int s = 0; s < n - 1; s++) { /* ring: forward what arrived last */
    int sb = MOD(r - s, n), rb = MOD(r - s - 1, n);
    size_t k = 0;
    if (len[sb]) x[k++] = tc__xfer_send(right, blk[sb], len[sb]);
    if (len[rb]) x[k++] = tc__xfer_recv(left, blk[rb], len[rb]);
    TC_CHECK(tc__cpu_xchg(ctx, x, k));
  }
  return TC_OK;
}

/* ------------------------------------------------------------------------ */
/* all_to_all                                                                */
/* ------------------------------------------------------------------------ */

static int overlaps(const char *a, size_t al, const char *b, size_t bl) {
  return al && bl && a < b + bl && b < a + al;
}

int tc__cpu_all_to_all(cpu_ctx_t *ctx) {
  const tc_backend_op_t *op = ctx->op;
  int r = ctx->rank, n = ctx->size;
  size_t es = ctx->es;
  if (op->type == TC_OP_ALL_TO_ALL_SINGLE && op->count == 0) return TC_OK;
  /* block tables in scratch: send ptr/len, recv ptr/len; then staging */
  size_t tab = (size_t)n * 2 * (sizeof(char *) + sizeof(size_t));
  tab = (tab + 63) & ~(size_t)63;
  size_t stotal = 0, rtotal = 0;
  for (int i = 0; i < n; i++) {
    size_t sc = op->type == TC_OP_ALL_TO_ALL_SINGLE ? op->count : op->sendcounts[i];
    size_t rc = op->type == TC_OP_ALL_TO_ALL_SINGLE ? op->count : op->recvcounts[i];
    stotal += sc * es;
    rtotal += rc * es;
  }
  /* does any send memory overlap any receive memory? */
  int stage = 0;
  const char *smin = NULL, *smax = NULL, *rmin = NULL, *rmax = NULL;
  if (op->type != TC_OP_ALL_TO_ALL) {
    stage = overlaps(op->sendbuf, stotal, op->recvbuf, rtotal);
  } else {
    for (int i = 0; i < n; i++) {
      const char *s = op->sendbufs[i], *v = op->recvbufs[i];
      size_t sl = op->sendcounts[i] * es, vl = op->recvcounts[i] * es;
      if (sl && (!smin || s < smin)) smin = s;
      if (sl && (!smax || s + sl > smax)) smax = s + sl;
      if (vl && (!rmin || v < rmin)) rmin = v;
      if (vl && (!rmax || v + vl > rmax)) rmax = v + vl;
    }
    stage = smin && rmin && smin < rmax && rmin < smax; /* conservative */
  }
  char *scr;
  TC_CHECK(tc__cpu_scratch(ctx, tab + (stage ? stotal : 0), (void **)&scr));
  char **sp = (char **)scr, **rp = sp + n;
  size_t *sl = (size_t *)(rp + n), *rl = sl + n;
  char *staged = scr + tab;
  size_t soff = 0, roff = 0;
  for (int i = 0; i < n; i++) {
    switch (op->type) {
    case TC_OP_ALL_TO_ALL:
      sp[i] = (char *)op->sendbufs[i];
      rp[i] = op->recvbufs[i];
      sl[i] = op->sendcounts[i] * es;
      rl[i] = op->recvcounts[i] * es;
      break;
    default: {
      int single = op->type == TC_OP_ALL_TO_ALL_SINGLE;
      sl[i] = (single ? op->count : op->sendcounts[i]) * es;
      rl[i] = (single ? op->count : op->recvcounts[i]) * es;
      sp[i] = (char *)op->sendbuf + soff;
      rp[i] = (char *)op->recvbuf + roff;
      break;
    }
    }
    if (stage) {
      if (sl[i]) memcpy(staged + soff, sp[i], sl[i]);
      sp[i] = staged + soff;
    }
    soff += sl[i];
    roff += rl[i];
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
      int to = MOD(r + s, n), from = MOD(r - s, n);
      x[k++] = tc__xfer_send(to, sp[to], sl[to]);
      x[k++] = tc__xfer_recv(from, rp[from], rl[from]);
    }
    return tc__cpu_xchg(ctx, x, k);
  }
  for (int s = 1; s < n; s++) {
    int to = MOD(r + s, n), from = MOD(r - s, n);
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
    x[0] = tc__xfer_send(MOD(r + k, n), NULL, 0);
    x[1] = tc__xfer_recv(MOD(r - k, n), NULL, 0);
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
  if (op->sendbufs[r] != op->recvbuf) memmove(op->recvbuf, op->sendbufs[r], bytes);
  size_t k = 0;
  for (int i = 0; i < n; i++)
    if (i != r) x[k++] = tc__xfer_send(i, op->sendbufs[i], bytes);
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
    char *dst = op->type == TC_OP_GATHER_SINGLE ? (char *)op->recvbuf + (size_t)i * bytes
                                                : op->recvbufs[i];
    if (i == r) {
      if (dst != (const char *)op->sendbuf) memmove(dst, op->sendbuf, bytes);
    } else {
      x[k++] = tc__xfer_recv(i, dst, bytes);
    }
  }
  return tc__cpu_xchg(ctx, x, k);
}

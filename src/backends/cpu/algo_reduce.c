/* algo_reduce.c -- the reducing algorithms of the cpu backend (all_reduce,
 * reduce, reduce_scatter), written against the transport's exchange.
 *
 *  all_reduce      < 64 KiB: recursive doubling (extra ranks of a non-power
 *                  of two folded in first and out last); each pair combines
 *                  lower-rank data first so every rank gets identical bits.
 *                  Otherwise: ring reduce-scatter (1 MiB segments received
 *                  into scratch, reduced into the buffer) + ring all-gather
 *                  straight into the buffer.
 *  reduce          binomial tree into root, pipelined in 1 MiB segments;
 *                  non-root buffers are never written (partials in scratch).
 *  reduce_scatter  < 64 KiB of input: one round (block i to rank i), reduced
 *                  locally in rank order; otherwise a ring, segment by
 *                  segment, with partial sums double-buffered in scratch.
 * Every rank reduces each element in one fixed order, then copies, so float
 * results are identical on every rank. */
#include "backends/cpu/cpu.h"

#include <string.h>

static size_t seg_elems(size_t es) {
  size_t s = CPU_REDUCE_SEG / es;
  return s ? s : 1;
}

/* ------------------------------------------------------------------------ */
/* all_reduce                                                                */
/* ------------------------------------------------------------------------ */

static int ar_doubling(cpu_ctx_t *ctx, char *buf, size_t count) {
  const tc_backend_op_t *op = ctx->op;
  int r = ctx->rank, n = ctx->size, rc;
  size_t bytes = count * ctx->es;
  tc_redop_type_t kop = cpu_kop(op);
  void *tmp;
  tc_xfer_t *x;
  TC_CHECK(tc__cpu_scratch(ctx, bytes, &tmp));
  TC_CHECK(tc__cpu_xfers(ctx, 2, &x));
  int p = 1;
  while (p * 2 <= n) p *= 2;
  int rem = n - p, vr;
  if (r < 2 * rem) { /* fold: even ranks hand their data to the odd one */
    if (r % 2 == 0) {
      x[0] = tc__xfer_send(r + 1, buf, bytes);
      TC_CHECK(tc__cpu_xchg(ctx, x, 1));
      vr = -1;
    } else {
      x[0] = tc__xfer_recv(r - 1, tmp, bytes);
      TC_CHECK(tc__cpu_xchg(ctx, x, 1));
      tc__reduce3(buf, tmp, buf, count, op->dtype, kop);
      vr = r / 2;
    }
  } else {
    vr = r - rem;
  }
  if (vr >= 0) {
    for (int mask = 1; mask < p; mask <<= 1) {
      int pv = vr ^ mask, peer = pv < rem ? pv * 2 + 1 : pv + rem;
      x[0] = tc__xfer_send(peer, buf, bytes);
      x[1] = tc__xfer_recv(peer, tmp, bytes);
      TC_CHECK(tc__cpu_xchg(ctx, x, 2));
      if (pv < vr) tc__reduce3(buf, tmp, buf, count, op->dtype, kop);
      else tc__reduce3(buf, buf, tmp, count, op->dtype, kop);
    }
  }
  if (r < 2 * rem) { /* unfold: the odd rank returns the result */
    x[0] = r % 2 == 0 ? tc__xfer_recv(r + 1, buf, bytes)
                      : tc__xfer_send(r - 1, buf, bytes);
    if ((rc = tc__cpu_xchg(ctx, x, 1)) != TC_OK) return rc;
  }
  if (op->redop.type == TC_AVG) tc__divide(buf, count, op->dtype, (uint64_t)n);
  return TC_OK;
}

static int ar_ring(cpu_ctx_t *ctx, char *buf, size_t count) {
  const tc_backend_op_t *op = ctx->op;
  int r = ctx->rank, n = ctx->size;
  int right = cpu_mod(r + 1, n), left = cpu_mod(r - 1, n);
  size_t es = ctx->es, seg = seg_elems(es);
  tc_redop_type_t kop = cpu_kop(op);
  void *tmp;
  tc_xfer_t *x;
  size_t maxblk = cpu_blk_cnt(count, n, 0);
  TC_CHECK(tc__cpu_scratch(ctx, (maxblk < seg ? maxblk : seg) * es, &tmp));
  TC_CHECK(tc__cpu_xfers(ctx, 2, &x));
  /* reduce-scatter: after step s, block r-s-1 holds s+2 contributions */
  for (int s = 0; s < n - 1; s++) {
    int sb = cpu_mod(r - s, n), rb = cpu_mod(r - s - 1, n);
    size_t scnt = cpu_blk_cnt(count, n, sb), rcnt = cpu_blk_cnt(count, n, rb);
    char *sbase = buf + cpu_blk_off(count, n, sb) * es;
    char *rbase = buf + cpu_blk_off(count, n, rb) * es;
    size_t most = scnt > rcnt ? scnt : rcnt;
    for (size_t off = 0; off < most; off += seg) {
      size_t sl = cpu_seg_len(scnt, off, seg), rl = cpu_seg_len(rcnt, off, seg);
      int k = 0;
      if (sl) x[k++] = tc__xfer_send(right, sbase + off * es, sl * es);
      if (rl) x[k++] = tc__xfer_recv(left, tmp, rl * es);
      TC_CHECK(tc__cpu_xchg(ctx, x, (size_t)k));
      if (rl) tc__reduce(rbase + off * es, tmp, rl, op->dtype, kop);
    }
  }
  int own = cpu_mod(r + 1, n);
  if (op->redop.type == TC_AVG)
    tc__divide(buf + cpu_blk_off(count, n, own) * es, cpu_blk_cnt(count, n, own), op->dtype,
               (uint64_t)n);
  /* all-gather: pass the completed blocks around the ring */
  for (int s = 0; s < n - 1; s++) {
    int sb = cpu_mod(r + 1 - s, n), rb = cpu_mod(r - s, n);
    size_t scnt = cpu_blk_cnt(count, n, sb), rcnt = cpu_blk_cnt(count, n, rb);
    int k = 0;
    if (scnt) x[k++] = tc__xfer_send(right, buf + cpu_blk_off(count, n, sb) * es, scnt * es);
    if (rcnt) x[k++] = tc__xfer_recv(left, buf + cpu_blk_off(count, n, rb) * es, rcnt * es);
    TC_CHECK(tc__cpu_xchg(ctx, x, (size_t)k));
  }
  return TC_OK;
}

int tc__cpu_all_reduce(cpu_ctx_t *ctx) {
  const tc_backend_op_t *op = ctx->op;
  size_t count = op->count;
  char *buf = op->recvbuf;
  if (count == 0) return TC_OK;
  if (op->redop.type == TC_PREMUL_SUM)
    tc__scale(buf, buf, count, op->dtype, op->redop.factor);
  if (ctx->size == 1) return TC_OK; /* AVG over one rank: unchanged */
  if (count * ctx->es < CPU_SMALL_BYTES || count < (size_t)ctx->size)
    return ar_doubling(ctx, buf, count);
  return ar_ring(ctx, buf, count);
}

/* ------------------------------------------------------------------------ */
/* reduce                                                                    */
/* ------------------------------------------------------------------------ */

int tc__cpu_reduce(cpu_ctx_t *ctx) {
  const tc_backend_op_t *op = ctx->op;
  int r = ctx->rank, n = ctx->size, root = op->root;
  size_t count = op->count, es = ctx->es;
  char *buf = op->recvbuf; /* in/out at root, input elsewhere */
  int premul = op->redop.type == TC_PREMUL_SUM;
  tc_redop_type_t kop = cpu_kop(op);
  if (count == 0) return TC_OK;
  if (r == root && premul) tc__scale(buf, buf, count, op->dtype, op->redop.factor);
  if (n == 1) return TC_OK;

  int vr = cpu_mod(r - root, n), parent, child[32];
  int nc = cpu_tree(vr, n, &parent, child);
  size_t seg = seg_elems(es);
  if (seg > count) seg = count;
  size_t nseg = (count + seg - 1) / seg, sb = seg * es;
  int leaf_direct = nc == 0 && !premul; /* sends its input as is */
  char *scr = NULL;
  size_t need = (size_t)nc * sb + (r == root || leaf_direct ? 0 : 2 * sb);
  tc_xfer_t *x;
  TC_CHECK(tc__cpu_xfers(ctx, (size_t)nc + 1, &x));
  if (need) TC_CHECK(tc__cpu_scratch(ctx, need, (void **)&scr));
  char *slot = scr, *acc[2] = {scr + (size_t)nc * sb, scr + (size_t)nc * sb + sb};

  if (r == root) {
    for (size_t j = 0; j < nseg; j++) {
      size_t len = cpu_seg_len(count, j * seg, seg);
      for (int c = 0; c < nc; c++)
        x[c] = tc__xfer_recv(cpu_mod(child[c] + root, n), slot + (size_t)c * sb, len * es);
      TC_CHECK(tc__cpu_xchg(ctx, x, (size_t)nc));
      for (int c = 0; c < nc; c++)
        tc__reduce(buf + j * seg * es, slot + (size_t)c * sb, len, op->dtype, kop);
    }
    if (op->redop.type == TC_AVG) tc__divide(buf, count, op->dtype, (uint64_t)n);
    return TC_OK;
  }
  /* non-root: step j receives segment j from the children while segment j-1
   * goes up to the parent */
  int up = cpu_mod(parent + root, n);
  const char *prev = NULL;
  size_t prev_len = 0;
  for (size_t j = 0; j <= nseg; j++) {
    size_t len = j < nseg ? cpu_seg_len(count, j * seg, seg) : 0;
    int k = 0;
    if (j < nseg)
      for (int c = 0; c < nc; c++)
        x[k++] = tc__xfer_recv(cpu_mod(child[c] + root, n), slot + (size_t)c * sb, len * es);
    if (j > 0) x[k++] = tc__xfer_send(up, prev, prev_len * es);
    TC_CHECK(tc__cpu_xchg(ctx, x, (size_t)k));
    if (j == nseg) break;
    const char *in = buf + j * seg * es;
    if (leaf_direct) {
      prev = in;
    } else {
      char *a = acc[j % 2];
      if (premul) tc__scale(a, in, len, op->dtype, op->redop.factor);
      else memcpy(a, in, len * es);
      for (int c = 0; c < nc; c++)
        tc__reduce(a, slot + (size_t)c * sb, len, op->dtype, kop);
      prev = a;
    }
    prev_len = len;
  }
  return TC_OK;
}

/* ------------------------------------------------------------------------ */
/* reduce_scatter                                                            */
/* ------------------------------------------------------------------------ */

/* One round: block i goes to rank i; the own block is reduced in rank order. */
static int rs_direct(cpu_ctx_t *ctx, char *out, size_t mycnt, size_t total) {
  const tc_backend_op_t *op = ctx->op;
  int r = ctx->rank, n = ctx->size, premul = op->redop.type == TC_PREMUL_SUM;
  size_t es = ctx->es, mb = mycnt * es;
  tc_redop_type_t kop = cpu_kop(op);
  char *scr;
  tc_xfer_t *x;
  TC_CHECK(tc__cpu_xfers(ctx, 2 * (size_t)n, &x));
  TC_CHECK(tc__cpu_scratch(ctx, (size_t)n * mb + (premul ? total * es : 0) + 1,
                           (void **)&scr));
  char *scaled = scr + (size_t)n * mb;
  size_t k = 0;
  for (int i = 0; i < n; i++) {
    size_t cnt = op->send[i].count;
    const char *in = op->send[i].buf;
    if (i == r) {
      if (premul) tc__scale(scr + (size_t)i * mb, in, cnt, op->dtype, op->redop.factor);
      else memcpy(scr + (size_t)i * mb, in, mb);
      continue;
    }
    if (mycnt) x[k++] = tc__xfer_recv(i, scr + (size_t)i * mb, mb);
    if (!cnt) continue;
    if (premul) {
      tc__scale(scaled, in, cnt, op->dtype, op->redop.factor);
      in = scaled;
      scaled += cnt * es;
    }
    x[k++] = tc__xfer_send(i, in, cnt * es);
  }
  TC_CHECK(tc__cpu_xchg(ctx, x, k));
  if (!mycnt) return TC_OK;
  if (n == 1) {
    memcpy(out, scr, mb);
  } else {
    tc__reduce3(out, scr, scr + mb, mycnt, op->dtype, kop);
    for (int i = 2; i < n; i++) tc__reduce(out, scr + (size_t)i * mb, mycnt, op->dtype, kop);
  }
  if (op->redop.type == TC_AVG) tc__divide(out, mycnt, op->dtype, (uint64_t)n);
  return TC_OK;
}

int tc__cpu_reduce_scatter(cpu_ctx_t *ctx) {
  const tc_backend_op_t *op = ctx->op;
  int r = ctx->rank, n = ctx->size, premul = op->redop.type == TC_PREMUL_SUM;
  size_t es = ctx->es, mycnt, total = 0, maxcnt = 0;
  char *out = op->recvbuf;
  tc_redop_type_t kop = cpu_kop(op);
  mycnt = op->send[r].count;
  for (int i = 0; i < n; i++) {
    size_t cnt = op->send[i].count;
    total += cnt;
    if (cnt > maxcnt) maxcnt = cnt;
  }
  if (total == 0) return TC_OK; /* every rank knows every count */
  if (n == 1 || total * es < CPU_SMALL_BYTES) return rs_direct(ctx, out, mycnt, total);

  /* ring, segment by segment: at step s rank r sends the partial of block
   * r-s-1 and receives the partial of block r-s-2; the last is its own */
  int right = cpu_mod(r + 1, n), left = cpu_mod(r - 1, n);
  size_t seg = seg_elems(es);
  if (seg > maxcnt) seg = maxcnt;
  size_t sb = seg * es;
  char *scr;
  tc_xfer_t *x;
  TC_CHECK(tc__cpu_xfers(ctx, 2, &x));
  TC_CHECK(tc__cpu_scratch(ctx, 3 * sb, (void **)&scr));
  char *rbuf = scr, *acc[2] = {scr + sb, scr + 2 * sb};
  for (size_t off = 0; off < maxcnt; off += seg) {
    for (int s = 0; s < n - 1; s++) {
      const tc_block_t *sblk = &op->send[cpu_mod(r - s - 1, n)];
      const tc_block_t *rblk = &op->send[cpu_mod(r - s - 2, n)];
      size_t scnt = sblk->count, rcnt = rblk->count;
      const char *sin = sblk->buf, *rin = rblk->buf;
      size_t sl = cpu_seg_len(scnt, off, seg), rl = cpu_seg_len(rcnt, off, seg);
      const char *sptr = acc[(s + 1) % 2];
      if (s == 0) {
        if (premul && sl) tc__scale(acc[1], sin + off * es, sl, op->dtype, op->redop.factor);
        else sptr = sin + off * es;
      }
      int k = 0;
      if (sl) x[k++] = tc__xfer_send(right, sptr, sl * es);
      if (rl) x[k++] = tc__xfer_recv(left, rbuf, rl * es);
      TC_CHECK(tc__cpu_xchg(ctx, x, (size_t)k));
      if (!rl) continue;
      char *dst = s == n - 2 ? out + off * es : acc[s % 2];
      if (premul) {
        tc__scale(dst, rin + off * es, rl, op->dtype, op->redop.factor);
        tc__reduce(dst, rbuf, rl, op->dtype, kop);
      } else {
        tc__reduce3(dst, rbuf, rin + off * es, rl, op->dtype, kop);
      }
    }
  }
  if (op->redop.type == TC_AVG && mycnt) tc__divide(out, mycnt, op->dtype, (uint64_t)n);
  return TC_OK;
}

/* algos.c -- the reducing algorithms of the cpu backend (all_reduce, reduce,
 * reduce_scatter) and broadcast, written against the transport's exchange.
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
 *  broadcast       < 64 KiB: binomial tree; otherwise a pipelined chain of
 *                  512 KiB segments.
 * Every rank reduces each element in one fixed order, then copies, so float
 * results are identical on every rank. */
#include "backends/cpu/cpu.h"

#include <string.h>

#define MOD(a, n) ((((a) % (n)) + (n)) % (n))

/* Part i of count elements split in n: count/n, one more for i < count%n. */
static size_t blk_cnt(size_t count, int n, int i) {
  return count / (size_t)n + ((size_t)i < count % (size_t)n);
}
static size_t blk_off(size_t count, int n, int i) {
  size_t q = count / (size_t)n, r = count % (size_t)n;
  return q * (size_t)i + ((size_t)i < r ? (size_t)i : r);
}

/* Elements of a segment of at most seg elements starting at off in cnt. */
static size_t seg_len(size_t cnt, size_t off, size_t seg) {
  if (off >= cnt) return 0;
  return cnt - off < seg ? cnt - off : seg;
}

static size_t seg_elems(size_t es) {
  size_t s = CPU_REDUCE_SEG / es;
  return s ? s : 1;
}

/* The binomial tree of relative rank vr in n: parent (or -1) and children
 * (relative ranks, largest subtree last). Returns the number of children. */
static int tree(int vr, int n, int *parent, int *child) {
  int nc = 0;
  *parent = -1;
  for (int mask = 1; mask < n; mask <<= 1) {
    if (vr & mask) {
      *parent = vr - mask;
      break;
    }
    if (vr + mask < n) child[nc++] = vr + mask;
  }
  return nc;
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
  int right = MOD(r + 1, n), left = MOD(r - 1, n);
  size_t es = ctx->es, seg = seg_elems(es);
  tc_redop_type_t kop = cpu_kop(op);
  void *tmp;
  tc_xfer_t *x;
  size_t maxblk = blk_cnt(count, n, 0);
  TC_CHECK(tc__cpu_scratch(ctx, (maxblk < seg ? maxblk : seg) * es, &tmp));
  TC_CHECK(tc__cpu_xfers(ctx, 2, &x));
  /* reduce-scatter: after step s, block r-s-1 holds s+2 contributions */
  for (int s = 0; s < n - 1; s++) {
    int sb = MOD(r - s, n), rb = MOD(r - s - 1, n);
    size_t scnt = blk_cnt(count, n, sb), rcnt = blk_cnt(count, n, rb);
    char *sbase = buf + blk_off(count, n, sb) * es;
    char *rbase = buf + blk_off(count, n, rb) * es;
    size_t most = scnt > rcnt ? scnt : rcnt;
    for (size_t off = 0; off < most; off += seg) {
      size_t sl = seg_len(scnt, off, seg), rl = seg_len(rcnt, off, seg);
      int k = 0;
      if (sl) x[k++] = tc__xfer_send(right, sbase + off * es, sl * es);
      if (rl) x[k++] = tc__xfer_recv(left, tmp, rl * es);
      TC_CHECK(tc__cpu_xchg(ctx, x, (size_t)k));
      if (rl) tc__reduce(rbase + off * es, tmp, rl, op->dtype, kop);
    }
  }
  int own = MOD(r + 1, n);
  if (op->redop.type == TC_AVG)
    tc__divide(buf + blk_off(count, n, own) * es, blk_cnt(count, n, own), op->dtype,
               (uint64_t)n);
  /* all-gather: pass the completed blocks around the ring */
  for (int s = 0; s < n - 1; s++) {
    int sb = MOD(r + 1 - s, n), rb = MOD(r - s, n);
    size_t scnt = blk_cnt(count, n, sb), rcnt = blk_cnt(count, n, rb);
    int k = 0;
    if (scnt) x[k++] = tc__xfer_send(right, buf + blk_off(count, n, sb) * es, scnt * es);
    if (rcnt) x[k++] = tc__xfer_recv(left, buf + blk_off(count, n, rb) * es, rcnt * es);
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

  int vr = MOD(r - root, n), parent, child[32];
  int nc = tree(vr, n, &parent, child);
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
      size_t len = seg_len(count, j * seg, seg);
      for (int c = 0; c < nc; c++)
        x[c] = tc__xfer_recv(MOD(child[c] + root, n), slot + (size_t)c * sb, len * es);
      TC_CHECK(tc__cpu_xchg(ctx, x, (size_t)nc));
      for (int c = 0; c < nc; c++)
        tc__reduce(buf + j * seg * es, slot + (size_t)c * sb, len, op->dtype, kop);
    }
    if (op->redop.type == TC_AVG) tc__divide(buf, count, op->dtype, (uint64_t)n);
    return TC_OK;
  }
  /* non-root: step j receives segment j from the children while segment j-1
   * goes up to the parent */
  int up = MOD(parent + root, n);
  const char *prev = NULL;
  size_t prev_len = 0;
  for (size_t j = 0; j <= nseg; j++) {
    size_t len = j < nseg ? seg_len(count, j * seg, seg) : 0;
    int k = 0;
    if (j < nseg)
      for (int c = 0; c < nc; c++)
        x[k++] = tc__xfer_recv(MOD(child[c] + root, n), slot + (size_t)c * sb, len * es);
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
/* broadcast                                                                 */
/* ------------------------------------------------------------------------ */

int tc__cpu_broadcast(cpu_ctx_t *ctx) {
  const tc_backend_op_t *op = ctx->op;
  int r = ctx->rank, n = ctx->size, root = op->root;
  size_t bytes = op->count * ctx->es;
  char *buf = op->recvbuf;
  if (bytes == 0 || n == 1) return TC_OK;
  int vr = MOD(r - root, n);
  tc_xfer_t *x;
  TC_CHECK(tc__cpu_xfers(ctx, 34, &x));
  if (bytes < CPU_SMALL_BYTES) { /* binomial tree */
    int parent, child[32];
    int nc = tree(vr, n, &parent, child);
    if (parent >= 0) {
      x[0] = tc__xfer_recv(MOD(parent + root, n), buf, bytes);
      TC_CHECK(tc__cpu_xchg(ctx, x, 1));
    }
    for (int c = 0; c < nc; c++) /* largest subtree first */
      x[c] = tc__xfer_send(MOD(child[nc - 1 - c] + root, n), buf, bytes);
    return tc__cpu_xchg(ctx, x, (size_t)nc);
  }
  /* pipelined chain root -> root+1 -> ... : each rank forwards segment j-1
   * while it receives segment j */
  size_t seg = CPU_BCAST_SEG, nseg = (bytes + seg - 1) / seg;
  int prev = MOD(r - 1, n), next = MOD(r + 1, n), lag = vr > 0;
  for (size_t j = 0; j <= nseg; j++) {
    int k = 0;
    if (vr > 0 && j < nseg)
      x[k++] = tc__xfer_recv(prev, buf + j * seg, seg_len(bytes, j * seg, seg));
    if (vr < n - 1 && j >= (size_t)lag && j - (size_t)lag < nseg) {
      size_t s = j - (size_t)lag;
      x[k++] = tc__xfer_send(next, buf + s * seg, seg_len(bytes, s * seg, seg));
    }
    TC_CHECK(tc__cpu_xchg(ctx, x, (size_t)k));
  }
  return TC_OK;
}

/* ------------------------------------------------------------------------ */
/* reduce_scatter                                                            */
/* ------------------------------------------------------------------------ */

/* Input block i of this rank (const) and its element count. */
static const char *rs_in(const cpu_ctx_t *ctx, int i, size_t *cnt) {
  const tc_backend_op_t *op = ctx->op;
  switch (op->type) {
  case TC_OP_REDUCE_SCATTER_V:
    *cnt = op->sendcounts[i];
    return op->sendbufs[i];
  case TC_OP_REDUCE_SCATTER_SINGLE:
    *cnt = op->count;
    return (const char *)op->sendbuf + (size_t)i * op->count * ctx->es;
  default:
    *cnt = op->count;
    return op->sendbufs[i];
  }
}

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
    size_t cnt;
    const char *in = rs_in(ctx, i, &cnt);
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
  rs_in(ctx, r, &mycnt);
  for (int i = 0; i < n; i++) {
    size_t cnt;
    rs_in(ctx, i, &cnt);
    total += cnt;
    if (cnt > maxcnt) maxcnt = cnt;
  }
  if (total == 0) return TC_OK; /* every rank knows every count */
  if (n == 1 || total * es < CPU_SMALL_BYTES) return rs_direct(ctx, out, mycnt, total);

  /* ring, segment by segment: at step s rank r sends the partial of block
   * r-s-1 and receives the partial of block r-s-2; the last is its own */
  int right = MOD(r + 1, n), left = MOD(r - 1, n);
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
      size_t scnt, rcnt;
      const char *sin = rs_in(ctx, MOD(r - s - 1, n), &scnt);
      const char *rin = rs_in(ctx, MOD(r - s - 2, n), &rcnt);
      size_t sl = seg_len(scnt, off, seg), rl = seg_len(rcnt, off, seg);
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

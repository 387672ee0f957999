/* chaos_ops.c -- every operation of libtorchcomms, drawn at random sizes,
 * issued synchronously or asynchronously, and checked exactly (see
 * chaos_ops.h for the scheme). */
#include "chaos_ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- deterministic randomness and values ---- */

static uint64_t mix(uint64_t x) { /* splitmix64's finalizer */
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

typedef struct { uint64_t s; } rng_t;
static uint64_t rnd(rng_t *r) { return mix(r->s++ * 0x2545f4914f6cdd1dull); }
static size_t rnd_below(rng_t *r, size_t n) { return n ? (size_t)(rnd(r) % n) : 0; }

static uint64_t key4(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  return mix(mix(mix(mix(a) ^ b) ^ c) ^ d);
}

/* Reduction input: 1..4 (1..2 for PRODUCT: 2^8 is still exact everywhere). */
static double red_val(const chaos_op_t *op, int src, size_t i) {
  uint64_t h = key4((uint64_t)src, i, op->step, 0x5eed);
  return op->red.type == TC_PRODUCT ? (double)(1 + (h & 1)) : (double)(1 + (h & 3));
}

/* Data-movement value from src to dst: integers exact in the dtype. */
static double mov_val(const chaos_op_t *op, int src, int dst, size_t i) {
  uint64_t h = key4((uint64_t)src, (uint64_t)dst, i, op->step);
  switch (op->dt) {
    case TC_UINT8: case TC_BFLOAT16: return (double)(h & 0xff);
    default: return (double)(h & 0xffffff);
  }
}

static void el_set(void *b, size_t i, tc_dtype_t dt, double v) {
  switch (dt) {
    case TC_FLOAT32: ((float *)b)[i] = (float)v; break;
    case TC_FLOAT64: ((double *)b)[i] = v; break;
    case TC_INT32: ((int32_t *)b)[i] = (int32_t)v; break;
    case TC_INT64: ((int64_t *)b)[i] = (int64_t)v; break;
    case TC_UINT8: ((uint8_t *)b)[i] = (uint8_t)v; break;
    case TC_BFLOAT16: { /* integers up to 256: the upper half is exact */
      float f = (float)v;
      uint32_t u;
      memcpy(&u, &f, 4);
      ((uint16_t *)b)[i] = (uint16_t)(u >> 16);
      break;
    }
    default: abort();
  }
}

static double el_get(const void *b, size_t i, tc_dtype_t dt) {
  switch (dt) {
    case TC_FLOAT32: return ((const float *)b)[i];
    case TC_FLOAT64: return ((const double *)b)[i];
    case TC_INT32: return ((const int32_t *)b)[i];
    case TC_INT64: return (double)((const int64_t *)b)[i];
    case TC_UINT8: return ((const uint8_t *)b)[i];
    case TC_BFLOAT16: {
      uint32_t u = (uint32_t)((const uint16_t *)b)[i] << 16;
      float f;
      memcpy(&f, &u, 4);
      return f;
    }
    default: abort();
  }
}

/* The reduction over ranks of red_val(p, idx). */
static double red_ref(const chaos_op_t *op, size_t idx) {
  double acc = red_val(op, 0, idx);
  for (int p = 1; p < op->size; p++) {
    double v = red_val(op, p, idx);
    switch (op->red.type) {
      case TC_SUM: acc += v; break;
      case TC_PRODUCT: acc *= v; break;
      case TC_MIN: acc = v < acc ? v : acc; break;
      case TC_MAX: acc = v > acc ? v : acc; break;
      case TC_BAND: acc = (double)((int64_t)acc & (int64_t)v); break;
      case TC_BOR: acc = (double)((int64_t)acc | (int64_t)v); break;
      case TC_BXOR: acc = (double)((int64_t)acc ^ (int64_t)v); break;
      default: abort();
    }
  }
  return acc;
}

const char *chaos_op_name(chaos_kind_t k) {
  static const char *names[] = {
#define CHAOS_OP_NAME(e, s) s,
      CHAOS_OP_MAP(CHAOS_OP_NAME)
#undef CHAOS_OP_NAME
  };
  return k < CHAOS_NOPS ? names[k] : "?";
}

/* ---- drawing ---- */

/* 0 now and then, else log-uniform in [1, max]. */
static size_t draw_count(rng_t *r, size_t max) {
  if (rnd_below(r, 16) == 0) return 0;
  int bits = 0;
  while (((size_t)2 << bits) <= max) bits++;
  size_t e = rnd_below(r, (size_t)bits + 1);
  size_t c = ((size_t)1 << e) + rnd_below(r, (size_t)1 << e);
  return c > max ? max : c;
}

void chaos_op_draw(chaos_op_t *op, uint64_t seed, uint64_t step, int rank,
                   int size, size_t max_count) {
  static const tc_dtype_t dts[] = {TC_FLOAT32, TC_FLOAT64, TC_BFLOAT16,
                                   TC_INT32, TC_INT64, TC_UINT8};
  memset(op, 0, sizeof *op);
  rng_t r = {mix(seed) ^ mix(step + 1)};
  op->step = step;
  op->rank = rank;
  op->size = size;
  op->kind = (chaos_kind_t)rnd_below(&r, CHAOS_NOPS);
  op->dt = dts[rnd_below(&r, sizeof dts / sizeof dts[0])];
  int isint = op->dt == TC_INT32 || op->dt == TC_INT64 || op->dt == TC_UINT8;
  static const tc_redop_type_t reds[] = {TC_SUM, TC_MIN, TC_MAX, TC_PRODUCT,
                                         TC_BAND, TC_BOR, TC_BXOR};
  tc_redop_type_t rt = reds[rnd_below(&r, isint ? 7 : 4)];
  if (rt == TC_PRODUCT && op->dt == TC_UINT8) rt = TC_SUM; /* 2^8 overflows */
  op->red = TC_OP(rt);
  op->root = (int)rnd_below(&r, (size_t)size);
  op->inplace = (int)rnd_below(&r, 2);
  op->count = draw_count(&r, max_count);
  /* the list and _v forms move size times more: keep them smaller */
  size_t vmax = max_count / (size_t)size;
  if (vmax == 0) vmax = 1;
  for (int p = 0; p < size; p++) op->counts[p] = draw_count(&r, vmax);
  for (int s = 0; s < size; s++)
    for (int d = 0; d < size; d++) op->m[s][d] = draw_count(&r, vmax);
  int perm[CHAOS_MAX_RANKS];
  for (int p = 0; p < size; p++) perm[p] = p;
  for (int p = size - 1; p > 0; p--) {
    int j = (int)rnd_below(&r, (size_t)p + 1), t = perm[p];
    perm[p] = perm[j];
    perm[j] = t;
  }
  for (int p = 0; p < size; p++) op->partner[p] = -1;
  for (int p = 0; p + 1 < size; p += 2) {
    op->partner[perm[p]] = perm[p + 1];
    op->partner[perm[p + 1]] = perm[p];
  }
  for (int s = 0; s < size; s++)
    for (int d = 0; d < size; d++) {
      op->nmsg[s][d] = (uint8_t)rnd_below(&r, 3);
      for (int j = 0; j < 2; j++) op->mcount[s][d][j] = draw_count(&r, vmax);
    }
}

/* ---- buffers ---- */

static void *xalloc(size_t count, tc_dtype_t dt, int *oom) {
  void *p = malloc(count * tc_dtype_size(dt) + 1);
  if (!p) *oom = 1;
  return p;
}

static void fill_red(const chaos_op_t *op, void *b, size_t count, size_t base) {
  for (size_t i = 0; i < count; i++) el_set(b, i, op->dt, red_val(op, op->rank, base + i));
}

static void fill_mov(const chaos_op_t *op, void *b, size_t count, int dst) {
  for (size_t i = 0; i < count; i++) el_set(b, i, op->dt, mov_val(op, op->rank, dst, i));
}

/* Garbage in receive buffers, so that a result left unwritten shows. */
static void poison(void *b, size_t count, tc_dtype_t dt) {
  memset(b, 0xa5, count * tc_dtype_size(dt));
}

static size_t sum_counts(const size_t *c, int n) {
  size_t s = 0;
  for (int i = 0; i < n; i++) s += c[i];
  return s;
}

int chaos_op_prepare(chaos_op_t *op) {
  int n = op->size, me = op->rank, oom = 0;
  size_t c = op->count;
  tc_dtype_t dt = op->dt;
  size_t es = tc_dtype_size(dt);
  switch (op->kind) {
    case CHAOS_ALL_REDUCE: case CHAOS_REDUCE:
      op->buf = xalloc(c, dt, &oom);
      if (!oom) fill_red(op, op->buf, c, 0);
      break;
    case CHAOS_BROADCAST:
      op->buf = xalloc(c, dt, &oom);
      if (oom) break;
      if (me == op->root) fill_mov(op, op->buf, c, -1);
      else poison(op->buf, c, dt);
      break;
    case CHAOS_ALL_GATHER: case CHAOS_ALL_GATHER_V:
      for (int p = 0; p < n && !oom; p++) {
        size_t cp = op->kind == CHAOS_ALL_GATHER ? c : op->counts[p];
        op->recvv[p] = xalloc(cp, dt, &oom);
        if (!oom) poison(op->recvv[p], cp, dt);
      }
      {
        size_t cm = op->kind == CHAOS_ALL_GATHER ? c : op->counts[me];
        op->buf = xalloc(cm, dt, &oom);
        if (!oom) fill_mov(op, op->buf, cm, -1);
      }
      break;
    case CHAOS_ALL_GATHER_SINGLE:
      op->buf = xalloc(c * (size_t)n, dt, &oom);
      if (oom) break;
      poison(op->buf, c * (size_t)n, dt);
      if (op->inplace) {
        fill_mov(op, (char *)op->buf + (size_t)me * c * es, c, -1);
      } else {
        op->buf2 = xalloc(c, dt, &oom);
        if (!oom) fill_mov(op, op->buf2, c, -1);
      }
      break;
    case CHAOS_REDUCE_SCATTER: case CHAOS_REDUCE_SCATTER_V: {
      size_t base = 0;
      for (int p = 0; p < n && !oom; p++) {
        size_t cp = op->kind == CHAOS_REDUCE_SCATTER ? c : op->counts[p];
        op->sendv[p] = xalloc(cp, dt, &oom);
        if (!oom) fill_red(op, op->sendv[p], cp, base);
        base += cp;
      }
      size_t cm = op->kind == CHAOS_REDUCE_SCATTER ? c : op->counts[me];
      op->buf = xalloc(cm, dt, &oom);
      if (!oom) poison(op->buf, cm, dt);
      break;
    }
    case CHAOS_REDUCE_SCATTER_SINGLE:
      op->buf2 = xalloc(c * (size_t)n, dt, &oom); /* sendbuf */
      if (oom) break;
      fill_red(op, op->buf2, c * (size_t)n, 0);
      if (op->inplace) {
        op->buf = (char *)op->buf2 + (size_t)me * c * es;
      } else {
        op->buf = xalloc(c, dt, &oom);
        if (!oom) poison(op->buf, c, dt);
      }
      break;
    case CHAOS_ALL_TO_ALL:
      for (int p = 0; p < n && !oom; p++) {
        op->sendv[p] = xalloc(op->m[me][p], dt, &oom);
        if (!oom) fill_mov(op, op->sendv[p], op->m[me][p], p);
        op->recvv[p] = oom ? NULL : xalloc(op->m[p][me], dt, &oom);
        if (!oom) poison(op->recvv[p], op->m[p][me], dt);
      }
      break;
    case CHAOS_ALL_TO_ALL_SINGLE: case CHAOS_ALL_TO_ALL_V_SINGLE: {
      int v = op->kind == CHAOS_ALL_TO_ALL_V_SINGLE;
      size_t st = 0, rt = 0;
      for (int p = 0; p < n; p++) {
        st += v ? op->m[me][p] : c;
        rt += v ? op->m[p][me] : c;
      }
      op->buf2 = xalloc(st, dt, &oom);
      op->buf = oom ? NULL : xalloc(rt, dt, &oom);
      if (oom) break;
      size_t off = 0;
      for (int p = 0; p < n; p++) {
        size_t cp = v ? op->m[me][p] : c;
        fill_mov(op, (char *)op->buf2 + off * es, cp, p);
        off += cp;
      }
      poison(op->buf, rt, dt);
      break;
    }
    case CHAOS_SCATTER:
      if (me == op->root)
        for (int p = 0; p < n && !oom; p++) {
          op->sendv[p] = xalloc(c, dt, &oom);
          if (!oom) fill_mov(op, op->sendv[p], c, p);
        }
      op->buf = oom ? NULL : xalloc(c, dt, &oom);
      if (!oom) poison(op->buf, c, dt);
      break;
    case CHAOS_GATHER: case CHAOS_GATHER_SINGLE:
      op->buf2 = xalloc(c, dt, &oom); /* sendbuf */
      if (oom) break;
      fill_mov(op, op->buf2, c, op->root);
      if (me != op->root) break;
      if (op->kind == CHAOS_GATHER_SINGLE) {
        op->buf = xalloc(c * (size_t)n, dt, &oom);
        if (!oom) poison(op->buf, c * (size_t)n, dt);
      } else {
        for (int p = 0; p < n && !oom; p++) {
          op->recvv[p] = xalloc(c, dt, &oom);
          if (!oom) poison(op->recvv[p], c, dt);
        }
      }
      break;
    case CHAOS_BARRIER:
      break;
    case CHAOS_SEND_RECV:
      op->buf2 = xalloc(c, dt, &oom);
      if (!oom) fill_mov(op, op->buf2, c, op->partner[me]);
      op->buf = oom ? NULL : xalloc(c, dt, &oom);
      if (!oom) poison(op->buf, c, dt);
      break;
    case CHAOS_BATCH:
      for (int p = 0; p < n && !oom; p++)
        for (int j = 0; j < 2 && !oom; j++) {
          if (j < op->nmsg[me][p]) {
            size_t cs = op->mcount[me][p][j];
            op->bsend[p][j] = xalloc(cs, dt, &oom);
            if (oom) break;
            for (size_t i = 0; i < cs; i++)
              el_set(op->bsend[p][j], i, dt, mov_val(op, me, p * 2 + j, i));
          }
          if (j < op->nmsg[p][me]) {
            op->brecv[p][j] = xalloc(op->mcount[p][me][j], dt, &oom);
            if (!oom) poison(op->brecv[p][j], op->mcount[p][me][j], dt);
          }
        }
      break;
    default: abort();
  }
  return oom ? -1 : 0;
}

/* ---- issuing ---- */

#define CHAOS_FAIL(call)                                                       \
  do {                                                                         \
    int rc_ = (call);                                                          \
    if (rc_ != TC_OK) {                                                        \
      *msg = tc_last_error();                                                  \
      return rc_;                                                              \
    }                                                                          \
  } while (0)

int chaos_op_issue(chaos_op_t *op, tc_comm_t *cm, int async, const char **msg) {
  int n = op->size, me = op->rank;
  size_t c = op->count;
  tc_dtype_t dt = op->dt;
  size_t es = tc_dtype_size(dt);
  tc_work_t **w = async ? &op->work[0] : NULL;
  *msg = "";
  op->nwork = async ? 1 : 0;
  switch (op->kind) {
    case CHAOS_ALL_REDUCE:
      CHAOS_FAIL(tc_all_reduce(cm, op->buf, c, dt, op->red, NULL, w));
      break;
    case CHAOS_REDUCE:
      CHAOS_FAIL(tc_reduce(cm, op->buf, c, dt, op->red, op->root, NULL, w));
      break;
    case CHAOS_BROADCAST:
      CHAOS_FAIL(tc_broadcast(cm, op->buf, c, dt, op->root, NULL, w));
      break;
    case CHAOS_ALL_GATHER:
      CHAOS_FAIL(tc_all_gather(cm, op->recvv, op->buf, c, dt, NULL, w));
      break;
    case CHAOS_ALL_GATHER_V:
      CHAOS_FAIL(tc_all_gather_v(cm, op->recvv, op->counts, op->buf,
                                 op->counts[me], dt, NULL, w));
      break;
    case CHAOS_ALL_GATHER_SINGLE: {
      const void *src = op->inplace ? (char *)op->buf + (size_t)me * c * es : op->buf2;
      CHAOS_FAIL(tc_all_gather_single(cm, op->buf, src, c, dt, NULL, w));
      break;
    }
    case CHAOS_REDUCE_SCATTER:
      CHAOS_FAIL(tc_reduce_scatter(cm, op->buf, (const void *const *)op->sendv, c,
                                   dt, op->red, NULL, w));
      break;
    case CHAOS_REDUCE_SCATTER_V:
      CHAOS_FAIL(tc_reduce_scatter_v(cm, op->buf, op->counts[me],
                                     (const void *const *)op->sendv, op->counts,
                                     dt, op->red, NULL, w));
      break;
    case CHAOS_REDUCE_SCATTER_SINGLE:
      CHAOS_FAIL(tc_reduce_scatter_single(cm, op->buf, op->buf2, c, dt, op->red,
                                          NULL, w));
      break;
    case CHAOS_ALL_TO_ALL: {
      size_t sc[CHAOS_MAX_RANKS], rc[CHAOS_MAX_RANKS];
      for (int p = 0; p < n; p++) {
        sc[p] = op->m[me][p];
        rc[p] = op->m[p][me];
      }
      CHAOS_FAIL(tc_all_to_all(cm, op->recvv, rc, (const void *const *)op->sendv,
                               sc, dt, NULL, w));
      break;
    }
    case CHAOS_ALL_TO_ALL_SINGLE:
      CHAOS_FAIL(tc_all_to_all_single(cm, op->buf, op->buf2, c, dt, NULL, w));
      break;
    case CHAOS_ALL_TO_ALL_V_SINGLE: {
      size_t sc[CHAOS_MAX_RANKS], rc[CHAOS_MAX_RANKS];
      for (int p = 0; p < n; p++) {
        sc[p] = op->m[me][p];
        rc[p] = op->m[p][me];
      }
      CHAOS_FAIL(tc_all_to_all_v_single(cm, op->buf, rc, op->buf2, sc, dt, NULL, w));
      break;
    }
    case CHAOS_SCATTER:
      CHAOS_FAIL(tc_scatter(cm, op->buf,
                            me == op->root ? (const void *const *)op->sendv : NULL,
                            c, dt, op->root, NULL, w));
      break;
    case CHAOS_GATHER:
      CHAOS_FAIL(tc_gather(cm, me == op->root ? op->recvv : NULL, op->buf2, c, dt,
                           op->root, NULL, w));
      break;
    case CHAOS_GATHER_SINGLE:
      CHAOS_FAIL(tc_gather_single(cm, op->buf, op->buf2, c, dt, op->root, NULL, w));
      break;
    case CHAOS_BARRIER:
      CHAOS_FAIL(tc_barrier(cm, NULL, w));
      break;
    case CHAOS_SEND_RECV: {
      /* operations run in issue order, one at a time: the lower rank of a
       * pair sends first, the higher receives first (a ring of sends and
       * receives needs a batch) */
      int p = op->partner[me];
      if (p < 0) { /* the odd one out */
        op->nwork = 0;
        break;
      }
      tc_work_t **w2 = async ? &op->work[1] : NULL;
      if (me < p) {
        CHAOS_FAIL(tc_send(cm, op->buf2, c, dt, p, NULL, w));
        CHAOS_FAIL(tc_recv(cm, op->buf, c, dt, p, NULL, w2));
      } else {
        CHAOS_FAIL(tc_recv(cm, op->buf, c, dt, p, NULL, w));
        CHAOS_FAIL(tc_send(cm, op->buf2, c, dt, p, NULL, w2));
      }
      op->nwork = async ? 2 : 0;
      break;
    }
    case CHAOS_BATCH: {
      CHAOS_FAIL(tc_batch_create(cm, &op->batch));
      /* peers in a rotated order per rank; one pair's messages in order */
      for (int k = 0; k < n; k++) {
        int p = (me + k) % n;
        for (int j = 0; j < op->nmsg[me][p]; j++)
          CHAOS_FAIL(tc_batch_send(op->batch, op->bsend[p][j], op->mcount[me][p][j],
                                   dt, p));
        for (int j = 0; j < op->nmsg[p][me]; j++)
          CHAOS_FAIL(tc_batch_recv(op->batch, op->brecv[p][j], op->mcount[p][me][j],
                                   dt, p));
      }
      CHAOS_FAIL(tc_batch_issue(op->batch, NULL, w));
      break;
    }
    default: abort();
  }
  return TC_OK;
}

int chaos_op_wait(chaos_op_t *op, const char **msg) {
  int first = TC_OK;
  for (int i = 0; i < op->nwork; i++) {
    int rc = tc_work_wait(op->work[i]);
    if (rc != TC_OK && first == TC_OK) {
      first = rc;
      *msg = tc_work_error(op->work[i]);
    }
  }
  return first;
}

/* ---- checking ---- */

typedef struct {
  char *why;
  size_t len;
} why_t;

static int mismatch(why_t *w, const char *what, size_t i, double got, double want) {
  snprintf(w->why, w->len, "%s: element %zu is %.17g, expected %.17g", what, i, got, want);
  return -1;
}

static int check_mov(const chaos_op_t *op, why_t *w, const void *b, size_t count,
                     int src, int dst, const char *what) {
  for (size_t i = 0; i < count; i++) {
    double got = el_get(b, i, op->dt), want = mov_val(op, src, dst, i);
    if (got != want) return mismatch(w, what, i, got, want);
  }
  return 0;
}

static int check_red(const chaos_op_t *op, why_t *w, const void *b, size_t count,
                     size_t base, const char *what) {
  for (size_t i = 0; i < count; i++) {
    double got = el_get(b, i, op->dt), want = red_ref(op, base + i);
    if (got != want) return mismatch(w, what, i, got, want);
  }
  return 0;
}

int chaos_op_check(const chaos_op_t *op, char *whybuf, size_t len) {
  why_t w = {whybuf, len};
  int n = op->size, me = op->rank;
  size_t c = op->count, es = tc_dtype_size(op->dt);
  char what[64];
  switch (op->kind) {
    case CHAOS_ALL_REDUCE:
      return check_red(op, &w, op->buf, c, 0, "result");
    case CHAOS_REDUCE:
      if (me == op->root) return check_red(op, &w, op->buf, c, 0, "root's result");
      for (size_t i = 0; i < c; i++) /* left unchanged elsewhere */
        if (el_get(op->buf, i, op->dt) != red_val(op, me, i))
          return mismatch(&w, "non-root buffer (must be unchanged)", i,
                          el_get(op->buf, i, op->dt), red_val(op, me, i));
      return 0;
    case CHAOS_BROADCAST:
      return check_mov(op, &w, op->buf, c, op->root, -1, "result");
    case CHAOS_ALL_GATHER: case CHAOS_ALL_GATHER_V:
      for (int p = 0; p < n; p++) {
        snprintf(what, sizeof what, "recvbufs[%d]", p);
        size_t cp = op->kind == CHAOS_ALL_GATHER ? c : op->counts[p];
        if (check_mov(op, &w, op->recvv[p], cp, p, -1, what)) return -1;
      }
      return 0;
    case CHAOS_ALL_GATHER_SINGLE:
      for (int p = 0; p < n; p++) {
        snprintf(what, sizeof what, "block %d", p);
        if (check_mov(op, &w, (char *)op->buf + (size_t)p * c * es, c, p, -1, what))
          return -1;
      }
      return 0;
    case CHAOS_REDUCE_SCATTER:
      return check_red(op, &w, op->buf, c, (size_t)me * c, "result");
    case CHAOS_REDUCE_SCATTER_V:
      return check_red(op, &w, op->buf, op->counts[me], sum_counts(op->counts, me),
                       "result");
    case CHAOS_REDUCE_SCATTER_SINGLE:
      return check_red(op, &w, op->buf, c, (size_t)me * c, "result");
    case CHAOS_ALL_TO_ALL:
      for (int p = 0; p < n; p++) {
        snprintf(what, sizeof what, "recvbufs[%d]", p);
        if (check_mov(op, &w, op->recvv[p], op->m[p][me], p, me, what)) return -1;
      }
      return 0;
    case CHAOS_ALL_TO_ALL_SINGLE: case CHAOS_ALL_TO_ALL_V_SINGLE: {
      size_t off = 0;
      for (int p = 0; p < n; p++) {
        size_t cp = op->kind == CHAOS_ALL_TO_ALL_V_SINGLE ? op->m[p][me] : c;
        snprintf(what, sizeof what, "block from rank %d", p);
        if (check_mov(op, &w, (char *)op->buf + off * es, cp, p, me, what)) return -1;
        off += cp;
      }
      return 0;
    }
    case CHAOS_SCATTER:
      return check_mov(op, &w, op->buf, c, op->root, me, "result");
    case CHAOS_GATHER:
      if (me != op->root) return 0;
      for (int p = 0; p < n; p++) {
        snprintf(what, sizeof what, "recvbufs[%d]", p);
        if (check_mov(op, &w, op->recvv[p], c, p, op->root, what)) return -1;
      }
      return 0;
    case CHAOS_GATHER_SINGLE:
      if (me != op->root) return 0;
      for (int p = 0; p < n; p++) {
        snprintf(what, sizeof what, "block %d", p);
        if (check_mov(op, &w, (char *)op->buf + (size_t)p * c * es, c, p, op->root,
                      what))
          return -1;
      }
      return 0;
    case CHAOS_BARRIER:
      return 0;
    case CHAOS_SEND_RECV: {
      int from = op->partner[me];
      if (from < 0) return 0;
      snprintf(what, sizeof what, "message from rank %d", from);
      return check_mov(op, &w, op->buf, c, from, me, what);
    }
    case CHAOS_BATCH:
      for (int p = 0; p < n; p++)
        for (int j = 0; j < op->nmsg[p][me]; j++) {
          snprintf(what, sizeof what, "message %d from rank %d", j, p);
          if (check_mov(op, &w, op->brecv[p][j], op->mcount[p][me][j], p, me * 2 + j,
                        what))
            return -1;
        }
      return 0;
    default: abort();
  }
}

/* The buffers this rank's result lands in (count > 0 only). */
static int result_bufs(const chaos_op_t *op, void **b, size_t *cnt) {
  int n = op->size, me = op->rank, k = 0;
  size_t c = op->count;
#define RB(ptr, count)                                                         \
  do {                                                                         \
    if ((count) > 0) {                                                         \
      b[k] = (ptr);                                                            \
      cnt[k++] = (count);                                                      \
    }                                                                          \
  } while (0)
  switch (op->kind) {
    case CHAOS_ALL_REDUCE: case CHAOS_BROADCAST: case CHAOS_SCATTER:
    case CHAOS_REDUCE_SCATTER: case CHAOS_REDUCE_SCATTER_SINGLE:
      RB(op->buf, c);
      break;
    case CHAOS_REDUCE:
      RB(op->buf, c); /* the root's result, or the unchanged input */
      break;
    case CHAOS_REDUCE_SCATTER_V:
      RB(op->buf, op->counts[me]);
      break;
    case CHAOS_ALL_GATHER: case CHAOS_ALL_GATHER_V:
      for (int p = 0; p < n; p++)
        RB(op->recvv[p], op->kind == CHAOS_ALL_GATHER ? c : op->counts[p]);
      break;
    case CHAOS_ALL_GATHER_SINGLE:
      RB(op->buf, c * (size_t)n);
      break;
    case CHAOS_ALL_TO_ALL:
      for (int p = 0; p < n; p++) RB(op->recvv[p], op->m[p][me]);
      break;
    case CHAOS_ALL_TO_ALL_SINGLE: case CHAOS_ALL_TO_ALL_V_SINGLE: {
      size_t t = 0;
      for (int p = 0; p < n; p++) t += op->kind == CHAOS_ALL_TO_ALL_SINGLE ? c : op->m[p][me];
      RB(op->buf, t);
      break;
    }
    case CHAOS_GATHER:
      if (me == op->root)
        for (int p = 0; p < n; p++) RB(op->recvv[p], c);
      break;
    case CHAOS_GATHER_SINGLE:
      if (me == op->root) RB(op->buf, c * (size_t)n);
      break;
    case CHAOS_SEND_RECV:
      if (op->partner[me] >= 0) RB(op->buf, c);
      break;
    case CHAOS_BATCH:
      for (int p = 0; p < n; p++)
        for (int j = 0; j < op->nmsg[p][me]; j++) RB(op->brecv[p][j], op->mcount[p][me][j]);
      break;
    default:
      break;
  }
#undef RB
  return k;
}

int chaos_op_selftest(chaos_op_t *op, char *why, size_t len) {
  void *b[CHAOS_MAX_RANKS * 2 * 2];
  size_t cnt[CHAOS_MAX_RANKS * 2 * 2];
  int k = result_bufs(op, b, cnt);
  for (int i = 0; i < k; i++) {
    size_t at = (size_t)key4(op->step, (uint64_t)i, 1, 2) % cnt[i];
    double v = el_get(b[i], at, op->dt);
    el_set(b[i], at, op->dt, v == 1 ? 2 : 1); /* any other value */
    char tmp[256];
    int caught = chaos_op_check(op, tmp, sizeof tmp) != 0;
    el_set(b[i], at, op->dt, v);
    if (!caught) {
      snprintf(why, len, "a corrupted element %zu of result buffer %d went unnoticed", at, i);
      return -1;
    }
  }
  return 0;
}

void chaos_op_free(chaos_op_t *op) {
  for (int i = 0; i < op->nwork; i++) tc_work_release(op->work[i]);
  op->nwork = 0;
  if (op->batch) tc_batch_free(op->batch);
  int inplace_rs = op->kind == CHAOS_REDUCE_SCATTER_SINGLE && op->inplace;
  if (!inplace_rs) free(op->buf);
  free(op->buf2);
  for (int p = 0; p < CHAOS_MAX_RANKS; p++) {
    free(op->sendv[p]);
    free(op->recvv[p]);
    for (int j = 0; j < 2; j++) {
      free(op->bsend[p][j]);
      free(op->brecv[p][j]);
    }
  }
  memset(op, 0, sizeof *op);
}

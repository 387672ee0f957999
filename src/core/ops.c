/* ops.c -- every operation's entry point: validation before any byte moves
 * (messages name the function and the argument), then one issue path. */
#include "core.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- validation helpers: each returns TC_OK or sets a full message ---- */

#define TC_FAIL(c, fn, rc, ...) return tc__comm_error((c), (rc), (fn), __VA_ARGS__)

int tc__v_comm(tc_comm_t **cp, const char *fn, const tc_op_options_t *o) {
  TC_CHECK(tc__comm_enter(cp, fn));
  tc_comm_t *c = *cp;
  int state = tc__comm_state(c);
  if (state != TC_STATE_ACTIVE) {
    int rc;
    const char *why = tc__comm_state_refusal(c, state, &rc);
    TC_FAIL(c, fn, rc, "%s", why);
  }
  if (o) {
    if (o->size < offsetof(tc_op_options_t, stream) || o->version < 1 ||
        o->version > TC_OP_OPTIONS_VERSION)
      TC_FAIL(c, fn, TC_ERR_INVALID_ARGUMENT,
              "argument 'opts' has size %u version %u (initialise it with "
              "TC_OP_OPTIONS_INIT)", o->size, o->version);
    if (isnan(o->timeout_s) || isinf(o->timeout_s))
      TC_FAIL(c, fn, TC_ERR_INVALID_ARGUMENT,
              "option 'timeout_s' is not a finite number");
    if (o->num_hints && !o->hints)
      TC_FAIL(c, fn, TC_ERR_INVALID_ARGUMENT,
              "option 'hints' is NULL but num_hints is %zu", o->num_hints);
    for (size_t i = 0; i < o->num_hints; i++)
      if (!o->hints[i].key || !o->hints[i].value)
        TC_FAIL(c, fn, TC_ERR_INVALID_ARGUMENT,
                "option hint %zu has a NULL key or value", i);
    if (o->size >= offsetof(tc_op_options_t, wait_arg) + sizeof o->wait_arg &&
        !o->wait_release != !o->wait_reacquire)
      TC_FAIL(c, fn, TC_ERR_INVALID_ARGUMENT,
              "options 'wait_release' and 'wait_reacquire' must be set together "
              "(one is NULL)");
  }
  return TC_OK;
}

int tc__v_dtype(tc_comm_t *c, const char *fn, tc_dtype_t dt) {
  if ((unsigned)dt >= TC_DTYPE_COUNT)
    TC_FAIL(c, fn, TC_ERR_INVALID_ARGUMENT,
            "argument 'dtype' = %d is not a tc_dtype_t", (int)dt);
  return TC_OK;
}

static int v_redop(tc_comm_t *c, const char *fn, tc_dtype_t dt,
                       tc_redop_t op) {
  if ((unsigned)op.type >= TC_REDOP_COUNT)
    TC_FAIL(c, fn, TC_ERR_INVALID_ARGUMENT,
            "argument 'op' = %d is not a tc_redop_type_t", (int)op.type);
  if (!tc__redop_allowed(dt, op.type))
    TC_FAIL(c, fn, TC_ERR_INVALID_ARGUMENT,
            "reduction %s (argument 'op') is not defined for dtype %s%s",
            tc_redop_name(op.type), tc_dtype_name(dt),
            (op.type == TC_BAND || op.type == TC_BOR || op.type == TC_BXOR)
                ? " (bitwise reductions take integer or bool types)"
                : "");
  if (op.type == TC_PREMUL_SUM && !isfinite(op.factor))
    TC_FAIL(c, fn, TC_ERR_INVALID_ARGUMENT,
            "PREMUL_SUM factor (argument 'op') is not finite");
  return TC_OK;
}

/* count elements of dtype times `mult` must fit in size_t bytes. */
int tc__v_count(tc_comm_t *c, const char *fn, const char *arg,
                       size_t count, tc_dtype_t dt, size_t mult) {
  size_t es = tc__dtype_size(dt), bytes;
  if (mult == 0) mult = 1;
  /* count * es * mult > SIZE_MAX / 2, without the two divisions (tens of
   * cycles each, on every operation) */
  if (__builtin_mul_overflow(count, es, &bytes) || __builtin_mul_overflow(bytes, mult, &bytes) ||
      bytes > SIZE_MAX / 2)
    TC_FAIL(c, fn, TC_ERR_INVALID_ARGUMENT,
            "argument '%s' = %zu elements of %s overflows the addressable "
            "size", arg, count, tc_dtype_name(dt));
  return TC_OK;
}

int tc__v_buf(tc_comm_t *c, const char *fn, const char *arg,
                     const void *p, size_t count) {
  if (!p && count > 0)
    TC_FAIL(c, fn, TC_ERR_INVALID_ARGUMENT,
            "argument '%s' is NULL but the count is %zu", arg, count);
  return TC_OK;
}

int tc__v_rank(tc_comm_t *c, const char *fn, const char *arg, int r) {
  if (r < 0 || r >= c->size)
    TC_FAIL(c, fn, TC_ERR_INVALID_ARGUMENT,
            "argument '%s' = %d is out of range [0, %d)", arg, r, c->size);
  return TC_OK;
}

/* A list of size buffers (each `counts ? counts[i] : count` elements). */
static int v_list(tc_comm_t *c, const char *fn, const char *arg,
                      const void *const *list, const size_t *counts,
                      const char *countsarg, size_t count, tc_dtype_t dt) {
  if (!list)
    TC_FAIL(c, fn, TC_ERR_INVALID_ARGUMENT,
            "argument '%s' is NULL (a list of %d buffers is required)", arg,
            c->size);
  if (countsarg && !counts)
    TC_FAIL(c, fn, TC_ERR_INVALID_ARGUMENT,
            "argument '%s' is NULL (a list of %d counts is required)",
            countsarg, c->size);
  for (int i = 0; i < c->size; i++) {
    size_t n = counts ? counts[i] : count;
    if (counts) {
      char a[64];
      snprintf(a, sizeof a, "%s[%d]", countsarg, i);
      TC_CHECK(tc__v_count(c, fn, a, n, dt, (size_t)c->size));
    }
    if (!list[i] && n > 0)
      TC_FAIL(c, fn, TC_ERR_INVALID_ARGUMENT,
              "argument '%s[%d]' is NULL but its count is %zu", arg, i, n);
  }
  return TC_OK;
}

static int v_counts(tc_comm_t *c, const char *fn, const char *arg,
                        const size_t *counts, tc_dtype_t dt) {
  if (!counts)
    TC_FAIL(c, fn, TC_ERR_INVALID_ARGUMENT,
            "argument '%s' is NULL (a list of %d counts is required)", arg,
            c->size);
  size_t total = 0;
  for (int i = 0; i < c->size; i++) {
    char a[64];
    snprintf(a, sizeof a, "%s[%d]", arg, i);
    TC_CHECK(tc__v_count(c, fn, a, counts[i], dt, (size_t)c->size));
    total += counts[i];
  }
  return tc__v_count(c, fn, arg, total, dt, 1);
}

static size_t sum(const size_t *v, int n) {
  size_t s = 0;
  for (int i = 0; i < n; i++) s += v[i];
  return s;
}

/* ---- the issue path ---- */

const char *tc_op_name(tc_op_type_t t) { return tc_backend_op_name(t); }

uint32_t tc_op_flags(tc_op_type_t t) { return tc_backend_op_flags(t); }

/* The last combination the backend said yes to (c->supported; its answer
 * does not change): one compare instead of its call, on every operation. */
static inline uint32_t supports_key(tc_op_type_t type, tc_dtype_t dt, int redop) {
  return ((uint32_t)type << 16 | (uint32_t)dt << 8 | (uint32_t)(redop + 1)) + 1;
}

/* The backend runs type on dt with reduction redop (-1: none)? When not,
 * the message says whether the operation or the dtype is missing. */
int tc__v_supports(tc_comm_t *c, const char *fn, tc_op_type_t type,
                   tc_dtype_t dt, int redop) {
  const tc_backend_ops_t *o = c->ops;
  const uint32_t key = supports_key(type, dt, redop);
  if (atomic_load_explicit(&c->supported, memory_order_relaxed) == key) return TC_OK;
  if (!o->supports || !c->bcomm || o->supports(c->bcomm, type, dt, redop)) {
    atomic_store_explicit(&c->supported, key, memory_order_relaxed);
    return TC_OK;
  }
  if (!o->supports(c->bcomm, type, TC_DTYPE_COUNT, -1))
    TC_FAIL(c, fn, TC_ERR_NOT_SUPPORTED, "backend '%s' does not implement %s",
            c->backend_name, tc__op_name(type));
  if (redop >= 0 && o->supports(c->bcomm, type, dt, -1))
    TC_FAIL(c, fn, TC_ERR_NOT_SUPPORTED,
            "backend '%s' does not support reduction %s on dtype %s",
            c->backend_name, tc_redop_name((tc_redop_type_t)redop), tc_dtype_name(dt));
  TC_FAIL(c, fn, TC_ERR_NOT_SUPPORTED, "backend '%s' does not support dtype %s",
          c->backend_name, tc_dtype_name(dt));
}

/* One side's blocks from the call's form: a list of buffers (bufs), or one
 * buffer with the blocks back to back (base); each block counts[i]
 * elements, or `count` when counts is NULL. */
static void fill_blocks(tc_block_t *out, int n, size_t es, void *const *bufs,
                       const void *base, const size_t *counts, size_t count) {
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    size_t k = counts ? counts[i] : count;
    out[i].buf = bufs ? bufs[i] : (char *)(uintptr_t)base + off * es;
    out[i].count = k;
    off += k;
  }
}

/* Which sides of a call have per-rank blocks on this rank. */
static void op_sides(const tc__op_args_t *a, int rank, int *send, int *recv) {
  *send = *recv = 0;
  switch (tc_backend_op_kind(a->type)) {
  case TC_KIND_ALL_GATHER: *recv = 1; break;
  case TC_KIND_REDUCE_SCATTER: *send = 1; break;
  case TC_KIND_ALL_TO_ALL: *send = *recv = 1; break;
  case TC_KIND_SCATTER: *send = rank == a->root; break;
  case TC_KIND_GATHER: *recv = rank == a->root; break;
  default: break;
  }
}

size_t tc__op_arrays_size(const tc__op_args_t *a, int rank, int size) {
  int s, r;
  op_sides(a, rank, &s, &r);
  return (size_t)(s + r) * (size_t)size * sizeof(tc_block_t) +
         a->num_p2p * sizeof(tc_p2p_t);
}

void tc__op_describe(const tc__op_args_t *a, int rank, int size, void *arrays,
                     tc_backend_op_t *op) {
  const uint32_t f = tc_backend_op_flags(a->type);
  char *arr = arrays;
  int send_side, recv_side;
  op_sides(a, rank, &send_side, &recv_side);
  *op = (tc_backend_op_t){.size = sizeof *op, .type = a->type,
                          .kind = tc_backend_op_kind(a->type), .flags = f,
                          .dtype = a->dtype, .redop = a->redop,
                          .root = (f & (TC_OPF_ROOT | TC_OPF_PEER)) ? a->root : -1,
                          .count = a->count, .sendbuf = a->sendbuf,
                          .recvbuf = a->recvbuf};
  const size_t es = tc__dtype_size(a->dtype);
  if (send_side) {
    tc_block_t *b = (tc_block_t *)arr;
    fill_blocks(b, size, es, (void *const *)a->sendbufs, a->sendbuf, a->sendcounts, a->count);
    op->send = b;
    arr += (size_t)size * sizeof *b;
  }
  if (recv_side) {
    tc_block_t *b = (tc_block_t *)arr;
    fill_blocks(b, size, es, a->recvbufs, a->recvbuf, a->recvcounts, a->count);
    op->recv = b;
    arr += (size_t)size * sizeof *b;
  }
  if (a->num_p2p) {
    memcpy(arr, a->p2p, a->num_p2p * sizeof(tc_p2p_t));
    op->p2p = (const tc_p2p_t *)arr;
    op->num_p2p = a->num_p2p;
  }
}

/* The operation's deadline: the call's timeout, else the communicator's. */
static inline double op_timeout(const tc_comm_t *c, const tc_op_options_t *opts) {
  return opts && opts->timeout_s > 0 ? opts->timeout_s : c->timeout_s;
}

/* The call's options into the descriptor: its hints (borrowed for the
 * call), stream and backend argument, as far as its size has them. */
static inline void op_options(tc_backend_op_t *op, const tc_op_options_t *opts) {
  if (!opts) return;
  op->hints = opts->hints;
  op->num_hints = opts->num_hints;
  if (opts->size >= offsetof(tc_op_options_t, stream) + sizeof(void *))
    op->stream = opts->stream;
  if (opts->size >= offsetof(tc_op_options_t, backend_arg) + sizeof(void *))
    op->backend_arg = opts->backend_arg;
}

/* Takes the communicator's lock to issue; with wait hooks, the caller's
 * lock goes first when another thread's operation holds it. */
static inline void issue_lock(tc_comm_t *c, tc__waith_t *wh) {
  if (!wh) {
    tc__lock(&c->mu);
  } else if (!tc__trylock(&c->mu)) { /* another thread's operation */
    tc__waith_release(wh);
    tc__lock(&c->mu);
  }
}

/* tc__op_issue's body, inlined into its one call there. wh: the call's
 * wait hooks, NULL when it has none: they let the caller's lock go before
 * anything here could block (a taken communicator lock, the wait for a
 * synchronous operation; a backend blocking in its post calls
 * host->work_blocking). */
static inline __attribute__((always_inline)) int op_issue(tc_comm_t *c, const char *fn, const tc__op_args_t *a, const tc_op_options_t *opts,
         tc_work_t **work, tc__waith_t *wh) {
  if (work) *work = NULL;
  const double timeout = op_timeout(c, opts);
  /* the lock first: the spare work of a synchronous operation is then
   * taken without a locked instruction */
  issue_lock(c, wh);
  tc_work_t *w = work ? tc__work_alloc(c, tc__op_name(a->type), timeout)
                      : tc__work_alloc_sync(c, tc__op_name(a->type), timeout);
  size_t need = w ? tc__op_arrays_size(a, c->rank, c->size) : 0;
  void *arrays = need ? tc__work_arrays(w, need) : NULL;
  if (!w || (need && !arrays)) {
    tc__unlock(&c->mu);
    if (w) tc__work_unref(w);
    TC_FAIL(c, fn, TC_ERR_NOMEM, "out of memory");
  }
  tc_backend_op_t *op = &w->op;
  tc__op_describe(a, c->rank, c->size, arrays, op);
  op->timeout_s = timeout;
  op->issue_time = w->issue_time;
  if (work) op->flags |= TC_BACKEND_OP_ASYNC;
  if (wh && !wh->released) op->flags |= TC_BACKEND_OP_REPORT_BLOCKING;
  op_options(op, opts);
  /* the backend's reference: a plain store, not a locked add, since no
   * other thread can see the work yet (it was allocated just above, its
   * handle is not out) */
  atomic_store_explicit(&w->refs, 2, memory_order_relaxed);
  char why[768];
  why[0] = 0; /* not "= {0}": zeroing it all costs ~10% of a small operation */
  int rc;
  if (c->state != TC_STATE_ACTIVE) {
    snprintf(why, sizeof why, "%s", tc__comm_state_refusal(c, c->state, &rc));
  } else {
    /* numbers are taken only by operations that are posted: a refused one
     * leaves every rank's numbering as it was */
    const int coll = tc_backend_op_is_collective(op);
    op->seq = c->seq + 1;
    w->coll_seq = coll ? c->coll_seq + 1 : 0;
    w->p2p_seq = coll ? 0 : c->p2p_seq + 1;
    rc = tc__hooks_pre(c, w, why, sizeof why);
    if (rc == TC_OK) {
      c->seq++;
      if (coll) tc__comm_set_coll_seq(c, c->coll_seq + 1);
      else c->p2p_seq++;
      tc__fr_issue(c, w);
      tc__board_issue(c, w);
      if (tc__log_on(TC_LOG_TRACE, TC_LOG_COLL | TC_LOG_P2P)) {
        tc_op_info_t info;
        tc__op_info(w, &info);
        tc__log_op("issue", &info);
      }
      w->post_thread = pthread_self();
      w->inline_done = 0;
      w->waith = wh;
      atomic_store_explicit(&w->posting, 1, memory_order_relaxed);
      rc = c->ops->post(c->bcomm, op, w, why, sizeof why);
      atomic_store_explicit(&w->posting, 0, memory_order_relaxed);
      w->waith = NULL;
      if (rc != TC_OK) tc__fr_update(w, TC_FR_FAILED);
      else tc__work_posted(w);
    }
  }
  if (rc == TC_OK && !work && w->inline_done) {
    /* ended inside the post, on this thread: nobody else has it; let go
     * of it before the lock, as the work took no reference to c */
    rc = w->rc;
    if (rc != TC_OK) tc__set_error_text(rc, w->msg);
    tc__work_unref_inline(w);
    tc__unlock(&c->mu);
    return rc;
  }
  if (rc == TC_OK) tc__work_hold_comm(w); /* it lives on past the post */
  tc__unlock(&c->mu);
  /* w->op now belongs to the backend (its thread may be reading it): the
   * hints stay as they were, documented as valid during the post call only */
  if (rc != TC_OK) {
    tc__work_unref(w); /* the backend never took it */
    tc__work_unref(w);
    return tc__comm_error(c, rc, fn, "%s", why[0] ? why : "the backend refused the operation");
  }
  if (w->inline_done) /* ended inside the post, on this thread (asynchronous) */
    atomic_store_explicit(&w->refs, 1, memory_order_relaxed); /* the handle's only */
  if (work) {
    *work = tc__work_handle(w);
    return TC_OK;
  }
  tc__waith_release(wh); /* not ended inside the post: a wait */
  rc = tc__work_wait(w);
  tc__work_unref(w);
  return rc;
}

/* ---- the express path ---- */

/* One express operation: what begin numbers and records, what end
 * reports. */
typedef struct {
  tc_comm_t *c;
  tc_backend_op_t *op; /* its issue_time set by begin */
  uint64_t coll_seq; /* its collective number (c->coll_seq + 1), 0: point-to-point */
  uint64_t p2p_seq;  /* its point-to-point number (c->p2p_seq + 1), 0: collective */
  uint64_t fr_id;    /* its flight-recorder entry (id + 1, 0: none) */
  size_t fr_slot;
  tc__waith_t *wh; /* the call's wait hooks, or NULL */
  int begun, ended;
  int rc; /* its result, once ended */
} op_express_t;

/* Under c->mu: numbers and records the operation, then lets go of the
 * lock (the backend runs it without: abort, finalize and other threads'
 * operations go on meanwhile). */
static void express_begin(void *arg) {
  op_express_t *x = arg;
  tc_comm_t *c = x->c;
  if (x->begun) return;
  x->begun = 1;
  x->op->issue_time = tc__now(); /* not before: a declined operation reads no clock */
  c->seq++;
  if (x->coll_seq) tc__comm_set_coll_seq(c, c->coll_seq + 1);
  else c->p2p_seq++;
  c->express_ops++;
  x->fr_id = tc__fr_record_started(c, x->op, x->coll_seq, x->p2p_seq, x->op->issue_time,
                                   x->op->timeout_s, &x->fr_slot);
  tc__board_issue_op(c, x->op->type, x->op->root, x->coll_seq, x->p2p_seq);
  tc__unlock(&c->mu);
}

/* The backend is about to block: the caller's lock goes (once). */
static void express_blocking(void *arg) { tc__waith_release(((op_express_t *)arg)->wh); }

/* The operation ended (on the issuing thread; the backend still holds
 * what an abort or a destroy of c waits for, so c lives): recorded as
 * completed at `end` (< 0: read the clock now), or reported as the work path
 * reports a failure. */
static inline __attribute__((always_inline)) void express_finish(op_express_t *x, int status,
                                                                const char *reason, double end) {
  tc_comm_t *c = x->c;
  if (x->ended) return;
  x->ended = 1;
  x->rc = status;
  const tc_backend_op_t *op = x->op;
  if (status != TC_OK) {
    tc__lock(&c->mu); /* the spare work */
    x->rc = tc__work_express_failed(c, op, x->coll_seq, x->p2p_seq, x->fr_id, x->fr_slot, status,
                                    reason);
    atomic_store_explicit(&c->express_busy, 0, memory_order_relaxed); /* under mu */
    tc__unlock(&c->mu);
    return;
  }
  if (end < 0) end = tc__now();
  tc__fr_end_express(c, x->fr_id, x->fr_slot, op->issue_time, end);
  tc__board_done_op(c, op->type, x->coll_seq, x->p2p_seq, TC_OK);
  atomic_store_explicit(&c->last_progress_ns, (int64_t)(end * 1e9), memory_order_relaxed);
  /* after the completion kept aside: the next express operation's record
   * (another thread's, which reads this under mu) takes it */
  atomic_store_explicit(&c->express_busy, 0, memory_order_release);
}

static void express_end(void *arg, int status, const char *reason) {
  express_finish(arg, status, reason, -1);
}

/* Ended without a wait that read the clock (tc_backend_express_t.end_prompt):
 * within about a microsecond of its begin, which stands for its end (8-byte
 * broadcast at 2 ranks, Intel Xeon guest, 12 alternating launches: 0.175
 * -> 0.158 us; a time-stamp counter read costs ~10 ns there). */
static void express_end_prompt(void *arg) {
  op_express_t *x = arg;
  express_finish(x, TC_OK, NULL, x->op->issue_time);
}

/* A synchronous operation through the backend's express entry
 * (tc_backend_ops_t.express): what op_issue does for it (the state, the
 * numbers, the flight recorder, the status board, the end's report) without
 * a work object, hooks or the post's hand-offs. Taken when nothing needs
 * those: no hooks registered, no trace, no recorded stack frames (any of
 * them: the work path, which has them). TC_BACKEND_DECLINED when the
 * communicator or the backend cannot (nothing done: op_issue goes on);
 * else the operation's result, a failure reported exactly as the work path
 * does (tc__work_express_failed). wh: the call's wait hooks (NULL: none),
 * released before anything could block. */
static int op_express(tc_comm_t *c, const tc__op_args_t *a, const tc_op_options_t *opts,
                      tc__waith_t *wh) {
  if (atomic_load_explicit(&c->nhooks[TC_HOOK_PRE], memory_order_relaxed) ||
      atomic_load_explicit(&c->nhooks[TC_HOOK_POST], memory_order_relaxed) || c->fr_stacks ||
      tc__log_on(TC_LOG_TRACE, TC_LOG_COLL | TC_LOG_P2P))
    return TC_BACKEND_DECLINED;
  /* the per-rank blocks of a small all_gather, reduce_scatter or
   * all_to_all, on the stack */
  _Alignas(16) char arrays[256];
  size_t need = tc__op_arrays_size(a, c->rank, c->size);
  if (need > sizeof arrays) return TC_BACKEND_DECLINED;
  tc_backend_op_t op;
  tc__op_describe(a, c->rank, c->size, need ? arrays : NULL, &op);
  op.timeout_s = op_timeout(c, opts);
  op_options(&op, opts);
  issue_lock(c, wh);
  if (c->state != TC_STATE_ACTIVE || atomic_load_explicit(&c->express_busy, memory_order_acquire)) {
    tc__unlock(&c->mu);
    return TC_BACKEND_DECLINED; /* op_issue says why, or posts it */
  }
  if (wh && !wh->released) op.flags |= TC_BACKEND_OP_REPORT_BLOCKING;
  op.seq = c->seq + 1;
  /* numbered as op_issue numbers it: a collective, or a point-to-point
   * operation (send, recv, batch) */
  const int coll = tc_backend_op_is_collective(&op);
  op_express_t x = {.c = c, .op = &op, .coll_seq = coll ? c->coll_seq + 1 : 0,
                    .p2p_seq = coll ? 0 : c->p2p_seq + 1, .wh = wh};
  const tc_backend_express_t cb = {&x, express_begin, express_blocking, express_end,
                                   express_end_prompt};
  atomic_store_explicit(&c->express_busy, 1, memory_order_relaxed); /* under mu */
  int rc = c->ops->express(c->bcomm, &op, &cb);
  if (rc == TC_BACKEND_DECLINED && !x.begun) {
    atomic_store_explicit(&c->express_busy, 0, memory_order_relaxed);
    tc__unlock(&c->mu);
    return rc;
  }
  /* a backend that left out a call: numbered and reported anyway */
  if (__builtin_expect(!x.begun, 0)) express_begin(&x);
  if (__builtin_expect(!x.ended, 0))
    express_end(&x, rc == TC_BACKEND_DECLINED ? TC_ERR_INTERNAL : rc, NULL);
  return x.rc;
}

uint64_t tc__comm_express_ops(const tc_comm_t *h) {
  tc_comm_t *c = (tc_comm_t *)h;
  if (tc__comm_enter(&c, "tc__comm_express_ops") != TC_OK) return 0;
  tc__lock(&c->mu);
  uint64_t n = c->express_ops;
  tc__unlock(&c->mu);
  return n;
}

/* Never inlined, cloned or split (noipa), as a guard for the public entry
 * that calls it (tc_all_reduce, ...): the flight recorder's stack frames
 * start at that entry's frame (tc__fr_issue, TORCH_FR_CPP_STACK). Under
 * link-time optimisation GCC otherwise splits this function
 * (tc__op_issue.part.0). Not shown to be needed: the one lost frame seen
 * (flight_recorder_stack_frames_on_request, first LTO build) came from the
 * test program being optimised together with the library, and the Python
 * extension keeps tc_all_reduce's frame without it. It costs about 30
 * instructions per operation on a broadcast root (docs/benchmarks.md,
 * "Link-time optimisation"). Its own callees are still inlined into it. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((noipa))
#else
__attribute__((noinline))
#endif
int tc__op_issue(tc_comm_t *c, const char *fn, const tc__op_args_t *a,
                 const tc_op_options_t *opts, tc_work_t **work) {
  const uint32_t f = tc_backend_op_flags(a->type);
  const tc_dtype_t sdt =
      a->type == TC_OP_BARRIER || a->type == TC_OP_BATCH ? TC_DTYPE_COUNT : a->dtype;
  const int sredop = (f & TC_OPF_REDUCE) ? (int)a->redop.type : -1;
  /* the known answer inline, the backend's question in tc__v_supports */
  if (atomic_load_explicit(&c->supported, memory_order_relaxed) !=
      supports_key(a->type, sdt, sredop))
    TC_CHECK(tc__v_supports(c, fn, a->type, sdt, sredop));
  /* wait hooks (tc_op_options_t.wait_release): the caller's lock goes at
   * once when the backend may block in its post without saying so, else
   * only when something here is about to block; it comes back last, with
   * no lock of ours held (a thread holding the caller's lock may take the
   * communicator's lock) */
  tc__waith_t h, *wh = NULL;
  if (__builtin_expect(opts && opts->size >= offsetof(tc_op_options_t, wait_arg) +
                                                 sizeof opts->wait_arg &&
                           opts->wait_release, 0)) {
    h = (tc__waith_t){opts->wait_release, opts->wait_reacquire, opts->wait_arg, 0};
    wh = &h;
    if (!TC_BACKEND_HAS_CAP(c->ops, TC_BACKEND_CAP_BLOCKING_REPORTED)) tc__waith_release(wh);
  }
  const tc_op_kind_t k = tc_backend_op_kind(a->type);
  if (!work && c->express &&
      (c->express_p2p || (k != TC_KIND_SEND && k != TC_KIND_RECV && k != TC_KIND_BATCH))) {
    int rc = op_express(c, a, opts, wh);
    if (rc != TC_BACKEND_DECLINED) {
      if (wh && wh->released) wh->reacquire(wh->arg);
      return rc;
    }
  }
  int rc = op_issue(c, fn, a, opts, work, wh);
  if (wh && wh->released) wh->reacquire(wh->arg);
  return rc;
}

#define TC_OP_INIT(t) {.type = (t), .root = -1}

/* ---- the operations ---- */

int tc_send(tc_comm_t *c, const void *buf, size_t count, tc_dtype_t dt,
            int peer, const tc_op_options_t *opts, tc_work_t **work) {
  static const char *fn = "send";
  TC_CHECK(tc__v_comm(&c, fn, opts));
  TC_CHECK(tc__v_dtype(c, fn, dt));
  TC_CHECK(tc__v_count(c, fn, "count", count, dt, 1));
  TC_CHECK(tc__v_buf(c, fn, "buf", buf, count));
  TC_CHECK(tc__v_rank(c, fn, "peer", peer));
  if (peer == c->rank)
    TC_FAIL(c, fn, TC_ERR_INVALID_ARGUMENT,
            "argument 'peer' is the caller's own rank %d (use a batch for "
            "self send/recv)", peer);
  tc__op_args_t op = TC_OP_INIT(TC_OP_SEND);
  op.sendbuf = buf;
  op.count = count;
  op.dtype = dt;
  op.root = peer;
  return tc__op_issue(c, fn, &op, opts, work);
}

int tc_recv(tc_comm_t *c, void *buf, size_t count, tc_dtype_t dt, int peer,
            const tc_op_options_t *opts, tc_work_t **work) {
  static const char *fn = "recv";
  TC_CHECK(tc__v_comm(&c, fn, opts));
  TC_CHECK(tc__v_dtype(c, fn, dt));
  TC_CHECK(tc__v_count(c, fn, "count", count, dt, 1));
  TC_CHECK(tc__v_buf(c, fn, "buf", buf, count));
  TC_CHECK(tc__v_rank(c, fn, "peer", peer));
  if (peer == c->rank)
    TC_FAIL(c, fn, TC_ERR_INVALID_ARGUMENT,
            "argument 'peer' is the caller's own rank %d (use a batch for "
            "self send/recv)", peer);
  tc__op_args_t op = TC_OP_INIT(TC_OP_RECV);
  op.recvbuf = buf;
  op.count = count;
  op.dtype = dt;
  op.root = peer;
  return tc__op_issue(c, fn, &op, opts, work);
}

int tc_broadcast(tc_comm_t *c, void *buf, size_t count, tc_dtype_t dt,
                 int root, const tc_op_options_t *opts, tc_work_t **work) {
  static const char *fn = "broadcast";
  TC_CHECK(tc__v_comm(&c, fn, opts));
  TC_CHECK(tc__v_dtype(c, fn, dt));
  TC_CHECK(tc__v_count(c, fn, "count", count, dt, 1));
  TC_CHECK(tc__v_buf(c, fn, "buf", buf, count));
  TC_CHECK(tc__v_rank(c, fn, "root", root));
  tc__op_args_t op = TC_OP_INIT(TC_OP_BROADCAST);
  op.recvbuf = buf;
  op.count = count;
  op.dtype = dt;
  op.root = root;
  return tc__op_issue(c, fn, &op, opts, work);
}

int tc_all_reduce(tc_comm_t *c, void *buf, size_t count, tc_dtype_t dt,
                  tc_redop_t rop, const tc_op_options_t *opts,
                  tc_work_t **work) {
  static const char *fn = "all_reduce";
  TC_CHECK(tc__v_comm(&c, fn, opts));
  TC_CHECK(tc__v_dtype(c, fn, dt));
  TC_CHECK(v_redop(c, fn, dt, rop));
  TC_CHECK(tc__v_count(c, fn, "count", count, dt, 1));
  TC_CHECK(tc__v_buf(c, fn, "buf", buf, count));
  tc__op_args_t op = TC_OP_INIT(TC_OP_ALL_REDUCE);
  op.recvbuf = buf;
  op.count = count;
  op.dtype = dt;
  op.redop = rop;
  return tc__op_issue(c, fn, &op, opts, work);
}

int tc_reduce(tc_comm_t *c, void *buf, size_t count, tc_dtype_t dt,
              tc_redop_t rop, int root, const tc_op_options_t *opts,
              tc_work_t **work) {
  static const char *fn = "reduce";
  TC_CHECK(tc__v_comm(&c, fn, opts));
  TC_CHECK(tc__v_dtype(c, fn, dt));
  TC_CHECK(v_redop(c, fn, dt, rop));
  TC_CHECK(tc__v_count(c, fn, "count", count, dt, 1));
  TC_CHECK(tc__v_buf(c, fn, "buf", buf, count));
  TC_CHECK(tc__v_rank(c, fn, "root", root));
  tc__op_args_t op = TC_OP_INIT(TC_OP_REDUCE);
  op.recvbuf = buf;
  op.count = count;
  op.dtype = dt;
  op.redop = rop;
  op.root = root;
  return tc__op_issue(c, fn, &op, opts, work);
}

int tc_all_gather(tc_comm_t *c, void *const *recvbufs, const void *sendbuf,
                  size_t count, tc_dtype_t dt, const tc_op_options_t *opts,
                  tc_work_t **work) {
  static const char *fn = "all_gather";
  TC_CHECK(tc__v_comm(&c, fn, opts));
  TC_CHECK(tc__v_dtype(c, fn, dt));
  TC_CHECK(tc__v_count(c, fn, "count", count, dt, (size_t)c->size));
  TC_CHECK(tc__v_buf(c, fn, "sendbuf", sendbuf, count));
  TC_CHECK(v_list(c, fn, "recvbufs", (const void *const *)recvbufs, NULL,
                      NULL, count, dt));
  tc__op_args_t op = TC_OP_INIT(TC_OP_ALL_GATHER);
  op.sendbuf = sendbuf;
  op.recvbufs = recvbufs;
  op.count = count;
  op.dtype = dt;
  return tc__op_issue(c, fn, &op, opts, work);
}

int tc_all_gather_v(tc_comm_t *c, void *const *recvbufs,
                    const size_t *recvcounts, const void *sendbuf,
                    size_t sendcount, tc_dtype_t dt,
                    const tc_op_options_t *opts, tc_work_t **work) {
  static const char *fn = "all_gather_v";
  TC_CHECK(tc__v_comm(&c, fn, opts));
  TC_CHECK(tc__v_dtype(c, fn, dt));
  TC_CHECK(tc__v_count(c, fn, "sendcount", sendcount, dt, 1));
  TC_CHECK(tc__v_buf(c, fn, "sendbuf", sendbuf, sendcount));
  TC_CHECK(v_list(c, fn, "recvbufs", (const void *const *)recvbufs,
                      recvcounts, "recvcounts", 0, dt));
  if (recvcounts[c->rank] != sendcount)
    TC_FAIL(c, fn, TC_ERR_INVALID_ARGUMENT,
            "argument 'sendcount' = %zu differs from recvcounts[%d] = %zu",
            sendcount, c->rank, recvcounts[c->rank]);
  tc__op_args_t op = TC_OP_INIT(TC_OP_ALL_GATHER_V);
  op.sendbuf = sendbuf;
  op.recvbufs = recvbufs;
  op.recvcounts = recvcounts;
  op.count = sendcount;
  op.dtype = dt;
  return tc__op_issue(c, fn, &op, opts, work);
}

int tc_all_gather_single(tc_comm_t *c, void *recvbuf, const void *sendbuf,
                         size_t count, tc_dtype_t dt,
                         const tc_op_options_t *opts, tc_work_t **work) {
  static const char *fn = "all_gather_single";
  TC_CHECK(tc__v_comm(&c, fn, opts));
  TC_CHECK(tc__v_dtype(c, fn, dt));
  TC_CHECK(tc__v_count(c, fn, "count", count, dt, (size_t)c->size));
  TC_CHECK(tc__v_buf(c, fn, "sendbuf", sendbuf, count));
  TC_CHECK(tc__v_buf(c, fn, "recvbuf", recvbuf, count));
  tc__op_args_t op = TC_OP_INIT(TC_OP_ALL_GATHER_SINGLE);
  op.sendbuf = sendbuf;
  op.recvbuf = recvbuf;
  op.count = count;
  op.dtype = dt;
  return tc__op_issue(c, fn, &op, opts, work);
}

int tc_reduce_scatter(tc_comm_t *c, void *recvbuf, const void *const *sendbufs,
                      size_t count, tc_dtype_t dt, tc_redop_t rop,
                      const tc_op_options_t *opts, tc_work_t **work) {
  static const char *fn = "reduce_scatter";
  TC_CHECK(tc__v_comm(&c, fn, opts));
  TC_CHECK(tc__v_dtype(c, fn, dt));
  TC_CHECK(v_redop(c, fn, dt, rop));
  TC_CHECK(tc__v_count(c, fn, "count", count, dt, (size_t)c->size));
  TC_CHECK(tc__v_buf(c, fn, "recvbuf", recvbuf, count));
  TC_CHECK(v_list(c, fn, "sendbufs", sendbufs, NULL, NULL, count, dt));
  tc__op_args_t op = TC_OP_INIT(TC_OP_REDUCE_SCATTER);
  op.recvbuf = recvbuf;
  op.sendbufs = sendbufs;
  op.count = count;
  op.dtype = dt;
  op.redop = rop;
  return tc__op_issue(c, fn, &op, opts, work);
}

int tc_reduce_scatter_v(tc_comm_t *c, void *recvbuf, size_t recvcount,
                        const void *const *sendbufs, const size_t *sendcounts,
                        tc_dtype_t dt, tc_redop_t rop,
                        const tc_op_options_t *opts, tc_work_t **work) {
  static const char *fn = "reduce_scatter_v";
  TC_CHECK(tc__v_comm(&c, fn, opts));
  TC_CHECK(tc__v_dtype(c, fn, dt));
  TC_CHECK(v_redop(c, fn, dt, rop));
  TC_CHECK(tc__v_count(c, fn, "recvcount", recvcount, dt, 1));
  TC_CHECK(tc__v_buf(c, fn, "recvbuf", recvbuf, recvcount));
  TC_CHECK(v_list(c, fn, "sendbufs", sendbufs, sendcounts, "sendcounts", 0,
                      dt));
  if (sendcounts[c->rank] != recvcount)
    TC_FAIL(c, fn, TC_ERR_INVALID_ARGUMENT,
            "argument 'recvcount' = %zu differs from sendcounts[%d] = %zu",
            recvcount, c->rank, sendcounts[c->rank]);
  tc__op_args_t op = TC_OP_INIT(TC_OP_REDUCE_SCATTER_V);
  op.recvbuf = recvbuf;
  op.sendbufs = sendbufs;
  op.sendcounts = sendcounts;
  op.count = recvcount;
  op.dtype = dt;
  op.redop = rop;
  return tc__op_issue(c, fn, &op, opts, work);
}

int tc_reduce_scatter_single(tc_comm_t *c, void *recvbuf, const void *sendbuf,
                             size_t count, tc_dtype_t dt, tc_redop_t rop,
                             const tc_op_options_t *opts, tc_work_t **work) {
  static const char *fn = "reduce_scatter_single";
  TC_CHECK(tc__v_comm(&c, fn, opts));
  TC_CHECK(tc__v_dtype(c, fn, dt));
  TC_CHECK(v_redop(c, fn, dt, rop));
  TC_CHECK(tc__v_count(c, fn, "count", count, dt, (size_t)c->size));
  TC_CHECK(tc__v_buf(c, fn, "recvbuf", recvbuf, count));
  TC_CHECK(tc__v_buf(c, fn, "sendbuf", sendbuf, count));
  tc__op_args_t op = TC_OP_INIT(TC_OP_REDUCE_SCATTER_SINGLE);
  op.recvbuf = recvbuf;
  op.sendbuf = sendbuf;
  op.count = count;
  op.dtype = dt;
  op.redop = rop;
  return tc__op_issue(c, fn, &op, opts, work);
}

int tc_all_to_all_single(tc_comm_t *c, void *recvbuf, const void *sendbuf,
                         size_t count, tc_dtype_t dt,
                         const tc_op_options_t *opts, tc_work_t **work) {
  static const char *fn = "all_to_all_single";
  TC_CHECK(tc__v_comm(&c, fn, opts));
  TC_CHECK(tc__v_dtype(c, fn, dt));
  TC_CHECK(tc__v_count(c, fn, "count", count, dt, (size_t)c->size));
  TC_CHECK(tc__v_buf(c, fn, "recvbuf", recvbuf, count));
  TC_CHECK(tc__v_buf(c, fn, "sendbuf", sendbuf, count));
  tc__op_args_t op = TC_OP_INIT(TC_OP_ALL_TO_ALL_SINGLE);
  op.recvbuf = recvbuf;
  op.sendbuf = sendbuf;
  op.count = count;
  op.dtype = dt;
  return tc__op_issue(c, fn, &op, opts, work);
}

int tc_all_to_all_v_single(tc_comm_t *c, void *recvbuf,
                           const size_t *recvcounts, const void *sendbuf,
                           const size_t *sendcounts, tc_dtype_t dt,
                           const tc_op_options_t *opts, tc_work_t **work) {
  static const char *fn = "all_to_all_v_single";
  TC_CHECK(tc__v_comm(&c, fn, opts));
  TC_CHECK(tc__v_dtype(c, fn, dt));
  TC_CHECK(v_counts(c, fn, "recvcounts", recvcounts, dt));
  TC_CHECK(v_counts(c, fn, "sendcounts", sendcounts, dt));
  TC_CHECK(tc__v_buf(c, fn, "recvbuf", recvbuf, sum(recvcounts, c->size)));
  TC_CHECK(tc__v_buf(c, fn, "sendbuf", sendbuf, sum(sendcounts, c->size)));
  tc__op_args_t op = TC_OP_INIT(TC_OP_ALL_TO_ALL_V_SINGLE);
  op.recvbuf = recvbuf;
  op.sendbuf = sendbuf;
  op.recvcounts = recvcounts;
  op.sendcounts = sendcounts;
  op.dtype = dt;
  return tc__op_issue(c, fn, &op, opts, work);
}

int tc_all_to_all(tc_comm_t *c, void *const *recvbufs, const size_t *recvcounts,
                  const void *const *sendbufs, const size_t *sendcounts,
                  tc_dtype_t dt, const tc_op_options_t *opts,
                  tc_work_t **work) {
  static const char *fn = "all_to_all";
  TC_CHECK(tc__v_comm(&c, fn, opts));
  TC_CHECK(tc__v_dtype(c, fn, dt));
  TC_CHECK(v_list(c, fn, "recvbufs", (const void *const *)recvbufs,
                      recvcounts, "recvcounts", 0, dt));
  TC_CHECK(v_list(c, fn, "sendbufs", sendbufs, sendcounts, "sendcounts", 0,
                      dt));
  tc__op_args_t op = TC_OP_INIT(TC_OP_ALL_TO_ALL);
  op.recvbufs = recvbufs;
  op.recvcounts = recvcounts;
  op.sendbufs = sendbufs;
  op.sendcounts = sendcounts;
  op.dtype = dt;
  return tc__op_issue(c, fn, &op, opts, work);
}

int tc_barrier(tc_comm_t *c, const tc_op_options_t *opts, tc_work_t **work) {
  static const char *fn = "barrier";
  TC_CHECK(tc__v_comm(&c, fn, opts));
  tc__op_args_t op = TC_OP_INIT(TC_OP_BARRIER);
  return tc__op_issue(c, fn, &op, opts, work);
}

int tc_scatter(tc_comm_t *c, void *recvbuf, const void *const *sendbufs,
               size_t count, tc_dtype_t dt, int root,
               const tc_op_options_t *opts, tc_work_t **work) {
  static const char *fn = "scatter";
  TC_CHECK(tc__v_comm(&c, fn, opts));
  TC_CHECK(tc__v_dtype(c, fn, dt));
  TC_CHECK(tc__v_count(c, fn, "count", count, dt, (size_t)c->size));
  TC_CHECK(tc__v_buf(c, fn, "recvbuf", recvbuf, count));
  TC_CHECK(tc__v_rank(c, fn, "root", root));
  if (c->rank == root)
    TC_CHECK(v_list(c, fn, "sendbufs", sendbufs, NULL, NULL, count, dt));
  tc__op_args_t op = TC_OP_INIT(TC_OP_SCATTER);
  op.recvbuf = recvbuf;
  op.sendbufs = c->rank == root ? sendbufs : NULL;
  op.count = count;
  op.dtype = dt;
  op.root = root;
  return tc__op_issue(c, fn, &op, opts, work);
}

int tc_gather(tc_comm_t *c, void *const *recvbufs, const void *sendbuf,
              size_t count, tc_dtype_t dt, int root,
              const tc_op_options_t *opts, tc_work_t **work) {
  static const char *fn = "gather";
  TC_CHECK(tc__v_comm(&c, fn, opts));
  TC_CHECK(tc__v_dtype(c, fn, dt));
  TC_CHECK(tc__v_count(c, fn, "count", count, dt, (size_t)c->size));
  TC_CHECK(tc__v_buf(c, fn, "sendbuf", sendbuf, count));
  TC_CHECK(tc__v_rank(c, fn, "root", root));
  if (c->rank == root)
    TC_CHECK(v_list(c, fn, "recvbufs", (const void *const *)recvbufs, NULL,
                        NULL, count, dt));
  tc__op_args_t op = TC_OP_INIT(TC_OP_GATHER);
  op.sendbuf = sendbuf;
  op.recvbufs = c->rank == root ? recvbufs : NULL;
  op.count = count;
  op.dtype = dt;
  op.root = root;
  return tc__op_issue(c, fn, &op, opts, work);
}

int tc_gather_single(tc_comm_t *c, void *recvbuf, const void *sendbuf,
                     size_t count, tc_dtype_t dt, int root,
                     const tc_op_options_t *opts, tc_work_t **work) {
  static const char *fn = "gather_single";
  TC_CHECK(tc__v_comm(&c, fn, opts));
  TC_CHECK(tc__v_dtype(c, fn, dt));
  TC_CHECK(tc__v_count(c, fn, "count", count, dt, (size_t)c->size));
  TC_CHECK(tc__v_buf(c, fn, "sendbuf", sendbuf, count));
  TC_CHECK(tc__v_rank(c, fn, "root", root));
  if (c->rank == root) TC_CHECK(tc__v_buf(c, fn, "recvbuf", recvbuf, count));
  tc__op_args_t op = TC_OP_INIT(TC_OP_GATHER_SINGLE);
  op.sendbuf = sendbuf;
  op.recvbuf = c->rank == root ? recvbuf : NULL;
  op.count = count;
  op.dtype = dt;
  op.root = root;
  return tc__op_issue(c, fn, &op, opts, work);
}

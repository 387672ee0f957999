/* ops.c -- every operation's entry point: validation before any byte moves
 * (messages name the function and the argument), then one issue path. */
#include "core.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *tc__op_name(tc_op_type_t t) { return tc_backend_op_name(t); }

static tc_backend_op_fn tc__op_fn(const tc_backend_ops_t *ops, tc_op_type_t t) {
  /* The table's op entries are laid out in tc_op_type_t order. */
  const tc_backend_op_fn *first = &ops->send;
  size_t off = offsetof(tc_backend_ops_t, send) + (size_t)t * sizeof(tc_backend_op_fn);
  if (off + sizeof(tc_backend_op_fn) > ops->size) return NULL;
  return first[t];
}

/* ---- validation helpers: each returns TC_OK or sets a full message ---- */

#define TC_FAIL(c, fn, rc, ...) return tc__comm_error((c), (rc), (fn), __VA_ARGS__)

int tc__v_comm(tc_comm_t **cp, const char *fn, const tc_op_options_t *o) {
  TC_CHECK(tc__comm_enter(cp, fn));
  tc_comm_t *c = *cp;
  if (c->state == TC_STATE_FINALIZED)
    TC_FAIL(c, fn, TC_ERR_INVALID_USAGE,
            "the communicator was finalized (create a new one)");
  if (c->state == TC_STATE_ABORTED)
    TC_FAIL(c, fn, TC_ERR_ABORTED,
            "the communicator was aborted (create a new one)");
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
  }
  return TC_OK;
}

int tc__v_dtype(tc_comm_t *c, const char *fn, tc_dtype_t dt) {
  if ((unsigned)dt >= TC_DTYPE_COUNT)
    TC_FAIL(c, fn, TC_ERR_INVALID_ARGUMENT,
            "argument 'dtype' = %d is not a tc_dtype_t", (int)dt);
  if (c->ops->supports_dtype &&
      offsetof(tc_backend_ops_t, supports_dtype) < c->ops->size &&
      !c->ops->supports_dtype(dt))
    TC_FAIL(c, fn, TC_ERR_NOT_SUPPORTED,
            "backend '%s' does not support dtype %s", c->backend_name,
            tc_dtype_name(dt));
  return TC_OK;
}

static int tc__v_redop(tc_comm_t *c, const char *fn, tc_dtype_t dt,
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
  size_t es = tc_dtype_size(dt);
  if (mult == 0) mult = 1;
  if (count > (SIZE_MAX / 2) / es / mult)
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
static int tc__v_list(tc_comm_t *c, const char *fn, const char *arg,
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

static int tc__v_counts(tc_comm_t *c, const char *fn, const char *arg,
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

static size_t tc__sum(const size_t *v, int n) {
  size_t s = 0;
  for (int i = 0; i < n; i++) s += v[i];
  return s;
}

/* ---- the issue path ---- */

static size_t tc__align16(size_t n) { return (n + 15) & ~(size_t)15; }

int tc__op_issue(tc_comm_t *c, const char *fn, tc_backend_op_t *op,
                 const tc_op_options_t *opts, tc_work_t **work) {
  tc_backend_op_fn f = tc__op_fn(c->ops, op->type);
  if (!f)
    TC_FAIL(c, fn, TC_ERR_NOT_SUPPORTED, "backend '%s' does not implement %s",
            c->backend_name, tc__op_name(op->type));
  if (work) *work = NULL;
  double timeout = opts && opts->timeout_s > 0 ? opts->timeout_s : c->timeout_s;
  tc_work_t *w = tc__work_alloc(c, tc__op_name(op->type), timeout);
  if (!w) TC_FAIL(c, fn, TC_ERR_NOMEM, "out of memory");
  /* Own copies of every list so the caller's arrays may go away. */
  size_t n = (size_t)c->size;
  size_t pl = tc__align16(n * sizeof(void *)), cl = tc__align16(n * sizeof(size_t));
  size_t need = (op->sendbufs ? pl : 0) + (op->recvbufs ? pl : 0) +
                (op->sendcounts ? cl : 0) + (op->recvcounts ? cl : 0) +
                op->num_p2p * sizeof(tc_p2p_t);
  if (need) {
    char *a = tc__work_arrays(w, need);
    if (!a) {
      tc__work_unref(w);
      TC_FAIL(c, fn, TC_ERR_NOMEM, "out of memory");
    }
    if (op->p2p) {
      memcpy(a, op->p2p, op->num_p2p * sizeof(tc_p2p_t));
      op->p2p = (const tc_p2p_t *)a;
      a += op->num_p2p * sizeof(tc_p2p_t);
    }
    if (op->sendbufs) {
      memcpy(a, op->sendbufs, n * sizeof(void *));
      op->sendbufs = (const void *const *)a;
      a += pl;
    }
    if (op->recvbufs) {
      memcpy(a, op->recvbufs, n * sizeof(void *));
      op->recvbufs = (void *const *)a;
      a += pl;
    }
    if (op->sendcounts) {
      memcpy(a, op->sendcounts, n * sizeof(size_t));
      op->sendcounts = (const size_t *)a;
      a += cl;
    }
    if (op->recvcounts) {
      memcpy(a, op->recvcounts, n * sizeof(size_t));
      op->recvcounts = (const size_t *)a;
    }
  }
  op->size = sizeof *op;
  op->timeout_s = timeout;
  op->flags = work ? TC_BACKEND_OP_ASYNC : 0;
  if (opts) {
    op->hints = opts->hints; /* borrowed for the post call only */
    op->num_hints = opts->num_hints;
    if (opts->size >= offsetof(tc_op_options_t, stream) + sizeof(void *))
      op->stream = opts->stream;
  }
  w->op = *op;
  atomic_fetch_add(&w->refs, 1); /* the backend's reference */
  pthread_mutex_lock(&c->mu);
  int rc;
  if (c->state != TC_STATE_ACTIVE) {
    rc = tc__comm_error(c, c->state == TC_STATE_ABORTED ? TC_ERR_ABORTED
                                                        : TC_ERR_INVALID_USAGE,
                        fn, "the communicator was %s",
                        c->state == TC_STATE_ABORTED ? "aborted" : "finalized");
  } else {
    w->op.seq = ++c->seq;
    /* a refusal must not show an old message; success keeps it */
    char before[1024];
    const int had = tc_last_error()[0] != 0;
    if (had) {
      snprintf(before, sizeof before, "%s", tc_last_error());
      tc__set_error_text(TC_OK, "");
    }
    rc = f(c->bcomm, &w->op, w);
    if (rc == TC_OK && had) tc__set_error_text(TC_OK, before);
  }
  pthread_mutex_unlock(&c->mu);
  /* w->op now belongs to the backend (its thread may be reading it): the
   * hints stay as they were, documented as valid during the post call only */
  if (rc != TC_OK) {
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", tc_last_error());
    tc__work_unref(w); /* the backend never took it */
    tc__work_unref(w);
    if (!saved[0])
      return tc__comm_error(c, rc, fn, "the backend refused the operation");
    return tc__set_error_text(rc, saved);
  }
  if (work) {
    *work = tc__work_handle(w);
    return TC_OK;
  }
  rc = tc__work_wait(w);
  tc__work_unref(w);
  return rc;
}

#define TC_OP_INIT(t) {.size = sizeof(tc_backend_op_t), .type = (t)}

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
  tc_backend_op_t op = TC_OP_INIT(TC_OP_SEND);
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
  tc_backend_op_t op = TC_OP_INIT(TC_OP_RECV);
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
  tc_backend_op_t op = TC_OP_INIT(TC_OP_BROADCAST);
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
  TC_CHECK(tc__v_redop(c, fn, dt, rop));
  TC_CHECK(tc__v_count(c, fn, "count", count, dt, 1));
  TC_CHECK(tc__v_buf(c, fn, "buf", buf, count));
  tc_backend_op_t op = TC_OP_INIT(TC_OP_ALL_REDUCE);
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
  TC_CHECK(tc__v_redop(c, fn, dt, rop));
  TC_CHECK(tc__v_count(c, fn, "count", count, dt, 1));
  TC_CHECK(tc__v_buf(c, fn, "buf", buf, count));
  TC_CHECK(tc__v_rank(c, fn, "root", root));
  tc_backend_op_t op = TC_OP_INIT(TC_OP_REDUCE);
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
  TC_CHECK(tc__v_list(c, fn, "recvbufs", (const void *const *)recvbufs, NULL,
                      NULL, count, dt));
  tc_backend_op_t op = TC_OP_INIT(TC_OP_ALL_GATHER);
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
  TC_CHECK(tc__v_list(c, fn, "recvbufs", (const void *const *)recvbufs,
                      recvcounts, "recvcounts", 0, dt));
  if (recvcounts[c->rank] != sendcount)
    TC_FAIL(c, fn, TC_ERR_INVALID_ARGUMENT,
            "argument 'sendcount' = %zu differs from recvcounts[%d] = %zu",
            sendcount, c->rank, recvcounts[c->rank]);
  tc_backend_op_t op = TC_OP_INIT(TC_OP_ALL_GATHER_V);
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
  tc_backend_op_t op = TC_OP_INIT(TC_OP_ALL_GATHER_SINGLE);
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
  TC_CHECK(tc__v_redop(c, fn, dt, rop));
  TC_CHECK(tc__v_count(c, fn, "count", count, dt, (size_t)c->size));
  TC_CHECK(tc__v_buf(c, fn, "recvbuf", recvbuf, count));
  TC_CHECK(tc__v_list(c, fn, "sendbufs", sendbufs, NULL, NULL, count, dt));
  tc_backend_op_t op = TC_OP_INIT(TC_OP_REDUCE_SCATTER);
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
  TC_CHECK(tc__v_redop(c, fn, dt, rop));
  TC_CHECK(tc__v_count(c, fn, "recvcount", recvcount, dt, 1));
  TC_CHECK(tc__v_buf(c, fn, "recvbuf", recvbuf, recvcount));
  TC_CHECK(tc__v_list(c, fn, "sendbufs", sendbufs, sendcounts, "sendcounts", 0,
                      dt));
  if (sendcounts[c->rank] != recvcount)
    TC_FAIL(c, fn, TC_ERR_INVALID_ARGUMENT,
            "argument 'recvcount' = %zu differs from sendcounts[%d] = %zu",
            recvcount, c->rank, sendcounts[c->rank]);
  tc_backend_op_t op = TC_OP_INIT(TC_OP_REDUCE_SCATTER_V);
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
  TC_CHECK(tc__v_redop(c, fn, dt, rop));
  TC_CHECK(tc__v_count(c, fn, "count", count, dt, (size_t)c->size));
  TC_CHECK(tc__v_buf(c, fn, "recvbuf", recvbuf, count));
  TC_CHECK(tc__v_buf(c, fn, "sendbuf", sendbuf, count));
  tc_backend_op_t op = TC_OP_INIT(TC_OP_REDUCE_SCATTER_SINGLE);
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
  tc_backend_op_t op = TC_OP_INIT(TC_OP_ALL_TO_ALL_SINGLE);
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
  TC_CHECK(tc__v_counts(c, fn, "recvcounts", recvcounts, dt));
  TC_CHECK(tc__v_counts(c, fn, "sendcounts", sendcounts, dt));
  TC_CHECK(tc__v_buf(c, fn, "recvbuf", recvbuf, tc__sum(recvcounts, c->size)));
  TC_CHECK(tc__v_buf(c, fn, "sendbuf", sendbuf, tc__sum(sendcounts, c->size)));
  tc_backend_op_t op = TC_OP_INIT(TC_OP_ALL_TO_ALL_V_SINGLE);
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
  TC_CHECK(tc__v_list(c, fn, "recvbufs", (const void *const *)recvbufs,
                      recvcounts, "recvcounts", 0, dt));
  TC_CHECK(tc__v_list(c, fn, "sendbufs", sendbufs, sendcounts, "sendcounts", 0,
                      dt));
  tc_backend_op_t op = TC_OP_INIT(TC_OP_ALL_TO_ALL);
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
  tc_backend_op_t op = TC_OP_INIT(TC_OP_BARRIER);
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
    TC_CHECK(tc__v_list(c, fn, "sendbufs", sendbufs, NULL, NULL, count, dt));
  tc_backend_op_t op = TC_OP_INIT(TC_OP_SCATTER);
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
    TC_CHECK(tc__v_list(c, fn, "recvbufs", (const void *const *)recvbufs, NULL,
                        NULL, count, dt));
  tc_backend_op_t op = TC_OP_INIT(TC_OP_GATHER);
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
  tc_backend_op_t op = TC_OP_INIT(TC_OP_GATHER_SINGLE);
  op.sendbuf = sendbuf;
  op.recvbuf = c->rank == root ? recvbuf : NULL;
  op.count = count;
  op.dtype = dt;
  op.root = root;
  return tc__op_issue(c, fn, &op, opts, work);
}

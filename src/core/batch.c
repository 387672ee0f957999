/* batch.c -- batched point-to-point operations (tc_batch_*): the table of
 * batch handles (slot index + generation, never a pointer) and the checks
 * of a batch before it is issued as one operation. */
#include "core.h"

#include <stdlib.h>
#include <string.h>

#define TC_FAIL(c, fn, rc, ...) return tc__comm_error((c), (rc), (fn), __VA_ARGS__)

/* The batch table (handles.h): a freed batch's handle is stale from then on,
 * also once its slot holds a new batch; a slot keeps its struct (and its
 * list's memory) for the slot's next batch. */
static tc__htable_t batches = TC__HTABLE_INIT(TC__HANDLE_BATCH);

/* The live batch of handle h, or NULL with the thread's error set. */
static tc_batch_t *batch_live(const tc_batch_t *h, const char *fn) {
  if (!h) {
    tc__set_error(TC_ERR_INVALID_ARGUMENT, "torchcomms: %s: argument 'batch' is NULL", fn);
    return NULL;
  }
  int stale;
  tc_batch_t *b = tc__htable_get(&batches, h, &stale);
  if (!b)
    tc__set_error(TC_ERR_INVALID_USAGE,
                  "torchcomms: %s: argument 'batch' is not a live batch handle (freed "
                  "already, or not a batch handle?)", fn);
  return b;
}

/* The live batch of h in *b and its live communicator in *c (a destroyed
 * one is "the communicator handle was destroyed"). */
static int batch_check(const tc_batch_t *h, const char *fn, tc_batch_t **b,
                           tc_comm_t **c) {
  if (!(*b = batch_live(h, fn))) return h ? TC_ERR_INVALID_USAGE : TC_ERR_INVALID_ARGUMENT;
  *c = (*b)->comm;
  return tc__comm_enter(c, fn);
}

int tc_batch_create(tc_comm_t *c, tc_batch_t **out) {
  static const char *fn = "batch_op_create";
  TC_CHECK(tc__v_comm(&c, fn, NULL));
  if (!out)
    TC_FAIL(c, fn, TC_ERR_INVALID_ARGUMENT, "argument 'out' is NULL");
  uint32_t idx;
  void *obj;
  if (tc__htable_take(&batches, &idx, &obj))
    TC_FAIL(c, fn, TC_ERR_NOMEM, "out of memory (batch handles)");
  tc_batch_t *b = obj;
  if (!b) {
    if (!(b = calloc(1, sizeof *b))) {
      tc__htable_put(&batches, idx);
      TC_FAIL(c, fn, TC_ERR_NOMEM, "out of memory");
    }
    b->slot = idx;
    tc__htable_set(&batches, idx, b);
  }
  b->magic = TC_BATCH_MAGIC;
  b->comm = c->handle;
  b->n = 0;
  *out = (tc_batch_t *)tc__htable_open(&batches, idx);
  return TC_OK;
}

static int batch_add(tc_batch_t *h, int is_send, void *buf, size_t count,
                         tc_dtype_t dt, int peer, const char *fn) {
  tc_batch_t *b;
  tc_comm_t *c;
  TC_CHECK(batch_check(h, fn, &b, &c));
  TC_CHECK(tc__v_dtype(c, fn, dt));
  TC_CHECK(tc__v_supports(c, fn, TC_OP_BATCH, dt, -1));
  TC_CHECK(tc__v_count(c, fn, "count", count, dt, 1));
  TC_CHECK(tc__v_buf(c, fn, "buf", buf, count));
  TC_CHECK(tc__v_rank(c, fn, "peer", peer));
  if (b->n == b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 8;
    tc_p2p_t *p = realloc(b->ops, cap * sizeof *p);
    if (!p) TC_FAIL(c, fn, TC_ERR_NOMEM, "out of memory");
    b->ops = p;
    b->cap = cap;
  }
  b->ops[b->n++] = (tc_p2p_t){.is_send = is_send, .peer = peer, .buf = buf,
                              .count = count, .dtype = dt};
  return TC_OK;
}

int tc_batch_send(tc_batch_t *b, const void *buf, size_t count, tc_dtype_t dt,
                  int peer) {
  return batch_add(b, 1, (void *)buf, count, dt, peer, "batch.send");
}

int tc_batch_recv(tc_batch_t *b, void *buf, size_t count, tc_dtype_t dt,
                  int peer) {
  return batch_add(b, 0, buf, count, dt, peer, "batch.recv");
}

int tc_batch_issue(tc_batch_t *h, const tc_op_options_t *opts,
                   tc_work_t **work) {
  static const char *fn = "batch_op_issue";
  tc_batch_t *b = batch_live(h, fn);
  if (!b) return h ? TC_ERR_INVALID_USAGE : TC_ERR_INVALID_ARGUMENT;
  tc_comm_t *c = b->comm;
  TC_CHECK(tc__v_comm(&c, fn, opts));
  /* Self sends and receives must pair up with equal byte sizes. */
  size_t ns = 0, nr = 0;
  for (size_t i = 0; i < b->n; i++) {
    if (b->ops[i].peer != c->rank) continue;
    size_t bytes = b->ops[i].count * tc_dtype_size(b->ops[i].dtype);
    size_t k = 0, *idx = b->ops[i].is_send ? &ns : &nr;
    for (size_t j = 0; j < b->n; j++) {
      if (b->ops[j].peer != c->rank || b->ops[j].is_send == b->ops[i].is_send)
        continue;
      if (k++ == *idx &&
          b->ops[j].count * tc_dtype_size(b->ops[j].dtype) != bytes)
        TC_FAIL(c, fn, TC_ERR_INVALID_ARGUMENT,
                "self %s #%zu has %zu bytes but its matching %s has %zu",
                b->ops[i].is_send ? "send" : "recv", *idx, bytes,
                b->ops[i].is_send ? "recv" : "send",
                b->ops[j].count * tc_dtype_size(b->ops[j].dtype));
    }
    if (k <= *idx)
      TC_FAIL(c, fn, TC_ERR_INVALID_ARGUMENT,
              "self %s #%zu has no matching self %s in the batch",
              b->ops[i].is_send ? "send" : "recv", *idx,
              b->ops[i].is_send ? "recv" : "send");
    (*idx)++;
  }
  tc__op_args_t op = {.type = TC_OP_BATCH, .root = -1};
  op.p2p = b->ops;
  op.num_p2p = b->n;
  return tc__op_issue(c, fn, &op, opts, work);
}

/* Freeing ends the handle's life first (one winner when two threads free
 * it), then empties the batch (its list's memory is kept for the slot's next
 * batch) and returns the slot. Works after the comm was destroyed. */
int tc_batch_free(tc_batch_t *h) {
  tc_batch_t *b = batch_live(h, "batch_free");
  if (!b) return h ? TC_ERR_INVALID_USAGE : TC_ERR_INVALID_ARGUMENT;
  if (!tc__htable_close(&batches, h)) /* freed by another thread meanwhile */
    return tc__set_error(TC_ERR_INVALID_USAGE, "torchcomms: batch_free: argument 'batch' "
                         "is not a live batch handle (freed already, or not a batch handle?)");
  b->magic = TC_BATCH_FREED;
  b->comm = NULL;
  b->n = 0;
  if (b->cap > 64) { /* a huge list is not kept around */
    free(b->ops);
    b->ops = NULL;
    b->cap = 0;
  }
  tc__htable_put(&batches, b->slot);
  return TC_OK;
}

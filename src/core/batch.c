/* batch.c -- batched point-to-point operations (tc_batch_*): the table of
 * batch handles (slot index + generation, never a pointer) and the checks
 * of a batch before it is issued as one operation. */
#include "core.h"

#include <stdlib.h>
#include <string.h>

#define TC_FAIL(c, fn, rc, ...) return tc__comm_error((c), (rc), (fn), __VA_ARGS__)

/* The batch table: chunks of slots allocated once and never moved or freed
 * (a slot's address stays valid while other threads grow the table); a
 * handle is (generation << 32) | (index << 3) | 4, its generation bumped at
 * every free. Freed slots go on a free list and are reused. */
#define TC_BATCH_CHUNK 1024u
#define TC_BATCH_CHUNKS 4096u /* at most 4M batches alive at once */
_Static_assert(sizeof(uintptr_t) >= 8, "batch handles need 64-bit pointers");

typedef struct tc__bslot {
  struct tc_batch b;
  _Atomic uint32_t gen; /* odd: live; even: free */
  uint32_t next_free;
} tc__bslot_t;

static _Atomic(tc__bslot_t *) tc__bchunks[TC_BATCH_CHUNKS];
static pthread_mutex_t tc__btable_mu = PTHREAD_MUTEX_INITIALIZER;
static uint32_t tc__bslots_used;               /* slots ever handed out */
static uint32_t tc__bfree_head = UINT32_MAX;   /* free list of slot indexes */

static tc__bslot_t *tc__bslot_at(uint32_t idx) {
  if (idx / TC_BATCH_CHUNK >= TC_BATCH_CHUNKS) return NULL;
  tc__bslot_t *ch = atomic_load(&tc__bchunks[idx / TC_BATCH_CHUNK]);
  return ch ? &ch[idx % TC_BATCH_CHUNK] : NULL;
}

static tc_batch_t *tc__bhandle(uint32_t idx, uint32_t gen) {
  return (tc_batch_t *)(uintptr_t)(((uint64_t)gen << 32) | ((uint64_t)idx << 3) | 4u);
}

/* The slot of a live handle, or NULL with the thread's error set. */
static tc__bslot_t *tc__batch_slot(const tc_batch_t *h, const char *fn) {
  if (!h) {
    tc__set_error(TC_ERR_INVALID_ARGUMENT, "torchcomms: %s: argument 'batch' is NULL", fn);
    return NULL;
  }
  uint64_t v = (uint64_t)(uintptr_t)h;
  uint32_t idx = (uint32_t)(v & 0xffffffffu) >> 3, gen = (uint32_t)(v >> 32);
  tc__bslot_t *s = (v & 7u) == 4u ? tc__bslot_at(idx) : NULL;
  if (!s || !(gen & 1u) || atomic_load(&s->gen) != gen) {
    tc__set_error(TC_ERR_INVALID_USAGE,
                  "torchcomms: %s: argument 'batch' is not a live batch handle (freed "
                  "already, or not a batch handle?)", fn);
    return NULL;
  }
  return s;
}

static int tc__batch_check(const tc_batch_t *h, const char *fn, tc_batch_t **b) {
  tc__bslot_t *s = tc__batch_slot(h, fn);
  if (!s) return h ? TC_ERR_INVALID_USAGE : TC_ERR_INVALID_ARGUMENT;
  *b = &s->b;
  return tc__comm_check(s->b.comm, fn);
}

/* A free slot (reused, or a new one), marked live; its handle in *h. */
static tc__bslot_t *tc__batch_alloc(tc_batch_t **h) {
  pthread_mutex_lock(&tc__btable_mu);
  uint32_t idx = tc__bfree_head;
  tc__bslot_t *s = NULL;
  if (idx != UINT32_MAX) {
    s = tc__bslot_at(idx);
    tc__bfree_head = s->next_free;
  } else if (tc__bslots_used / TC_BATCH_CHUNK < TC_BATCH_CHUNKS) {
    idx = tc__bslots_used;
    uint32_t k = idx / TC_BATCH_CHUNK;
    if (!atomic_load(&tc__bchunks[k])) {
      tc__bslot_t *ch = calloc(TC_BATCH_CHUNK, sizeof *ch);
      if (ch) atomic_store(&tc__bchunks[k], ch);
    }
    s = tc__bslot_at(idx);
    if (s) tc__bslots_used++;
  }
  if (s) {
    uint32_t gen = atomic_load(&s->gen) + 1u; /* even (free) -> odd (live) */
    atomic_store(&s->gen, gen);
    *h = tc__bhandle(idx, gen);
  }
  pthread_mutex_unlock(&tc__btable_mu);
  return s;
}

int tc_batch_create(tc_comm_t *c, tc_batch_t **out) {
  static const char *fn = "batch_op_create";
  TC_CHECK(tc__v_comm(c, fn, NULL));
  if (!out)
    TC_FAIL(c, fn, TC_ERR_INVALID_ARGUMENT, "argument 'out' is NULL");
  tc_batch_t *h = NULL;
  tc__bslot_t *s = tc__batch_alloc(&h);
  if (!s) TC_FAIL(c, fn, TC_ERR_NOMEM, "out of memory (batch handles)");
  s->b.magic = TC_BATCH_MAGIC;
  s->b.comm = c;
  s->b.n = 0;
  *out = h;
  return TC_OK;
}

static int tc__batch_add(tc_batch_t *h, int is_send, void *buf, size_t count,
                         tc_dtype_t dt, int peer, const char *fn) {
  tc_batch_t *b;
  TC_CHECK(tc__batch_check(h, fn, &b));
  tc_comm_t *c = b->comm;
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
  return tc__batch_add(b, 1, (void *)buf, count, dt, peer, "batch.send");
}

int tc_batch_recv(tc_batch_t *b, void *buf, size_t count, tc_dtype_t dt,
                  int peer) {
  return tc__batch_add(b, 0, buf, count, dt, peer, "batch.recv");
}

int tc_batch_issue(tc_batch_t *h, const tc_op_options_t *opts,
                   tc_work_t **work) {
  static const char *fn = "batch_op_issue";
  tc_batch_t *b;
  TC_CHECK(tc__batch_check(h, fn, &b));
  tc_comm_t *c = b->comm;
  TC_CHECK(tc__v_comm(c, fn, opts));
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

/* Freeing empties the slot (its list's memory is kept for the next batch in
 * it) and bumps its generation: the old handle is stale from now on, also
 * once the slot holds a new batch. Works after the comm was destroyed. */
int tc_batch_free(tc_batch_t *h) {
  tc__bslot_t *s = tc__batch_slot(h, "batch_free");
  if (!s) return h ? TC_ERR_INVALID_USAGE : TC_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&tc__btable_mu);
  if (!(atomic_load(&s->gen) & 1u)) { /* freed by another thread meanwhile */
    pthread_mutex_unlock(&tc__btable_mu);
    return tc__set_error(TC_ERR_INVALID_USAGE, "torchcomms: batch_free: argument 'batch' "
                         "is not a live batch handle (freed already, or not a batch handle?)");
  }
  s->b.magic = TC_BATCH_FREED;
  s->b.comm = NULL;
  s->b.n = 0;
  if (s->b.cap > 64) { /* a huge list is not kept around */
    free(s->b.ops);
    s->b.ops = NULL;
    s->b.cap = 0;
  }
  atomic_store(&s->gen, atomic_load(&s->gen) + 1u); /* odd -> even: free */
  uint64_t v = (uint64_t)(uintptr_t)h;
  s->next_free = tc__bfree_head;
  tc__bfree_head = (uint32_t)(v & 0xffffffffu) >> 3;
  pthread_mutex_unlock(&tc__btable_mu);
  return TC_OK;
}

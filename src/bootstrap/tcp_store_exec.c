/* tcp_store_exec.c -- what each request of torch's TCPStore protocol does
 * to our server's store (store_server.h), with torch's semantics: a GET of
 * a missing key answers an empty value, an ADD on a non-integer value drops
 * the connection, a WAIT (or BARRIER) is answered when its keys appear.
 *
 * Every request first has its memory cost computed (answer bytes, stored
 * bytes, waited-for keys, all upper bounds); it runs only when that fits
 * the server's budget (tc__srv_room), so the accounting never overshoots.
 */
#include "bootstrap/store_server.h"

#include <stdio.h>

/* A cursor over one complete request (already checked by
 * tc__store_req_scan, so every read is in bounds). */
typedef struct rd {
  const uint8_t *p;
  size_t off;
} rd_t;

static uint64_t rd64(rd_t *r) {
  uint64_t v = tc__rd_u64(r->p + r->off);
  r->off += 8;
  return v;
}

static const uint8_t *rdstr(rd_t *r, size_t *len) {
  *len = (size_t)rd64(r);
  const uint8_t *s = r->p + r->off;
  r->off += *len;
  return s;
}

/* Accounted size of an entry of kv (0 for none). */
static size_t entry_cost(const tc__kv_entry_t *e) {
  return e ? TC__STORE_ENTRY_COST(e->klen, e->vlen) : 0;
}

/* A key exists: set, or a non-empty queue (torch's checkKeys). */
static int present(tc_store_server_t *s, const void *k, size_t n) {
  if (tc__kv_find(&s->kv, k, n)) return 1;
  tc__kv_entry_t *q = tc__kv_find(&s->queues, k, n);
  return q && q->vlen > 0;
}

/* A key of our refusal table ("torchcomms/refusal/<peer>"): its answer. */
static const char *refusal_of(tc_store_server_t *s, const uint8_t *k,
                              size_t kl) {
  size_t pl = sizeof TC__STORE_REFUSAL_KEY - 1;
  if (kl <= pl || memcmp(k, TC__STORE_REFUSAL_KEY, pl)) return NULL;
  const char *why = tc__srv_refusal(s, k + pl, kl - pl);
  return why ? why : "";
}

/* Answers one string: a value, empty when missing. */
static void answer_value(tc_store_server_t *s, tc__conn_t *c,
                         const uint8_t *k, size_t kl) {
  const char *why = refusal_of(s, k, kl);
  if (why) {
    tc__buf_str(&c->out, why, strlen(why));
    return;
  }
  tc__kv_entry_t *cur = tc__kv_find(&s->kv, k, kl);
  tc__buf_str(&c->out, cur ? cur->val : NULL, cur ? cur->vlen : 0);
}

/* Bytes answer_value will write. */
static size_t value_answer_len(tc_store_server_t *s, const uint8_t *k,
                               size_t kl) {
  const char *why = refusal_of(s, k, kl);
  if (why) return 8 + strlen(why);
  tc__kv_entry_t *cur = tc__kv_find(&s->kv, k, kl);
  return 8 + (cur ? cur->vlen : 0);
}

void tc__srv_clear_wait(tc_store_server_t *s, tc__conn_t *c) {
  for (size_t i = 0; i < c->nwait; i++) free(c->wkeys[i]);
  free(c->wkeys);
  free(c->wklen);
  c->wkeys = NULL;
  c->wklen = NULL;
  c->nwait = 0;
  tc__srv_acct(s, -(long long)c->wcost);
  c->wcost = 0;
}

/* The key was written: removes it from the waiting lists and answers
 * STOP_WAITING to clients that have nothing left to wait for (only the
 * first such client when `one`, for a queue push). The byte fits: room for
 * it was reserved when the wait began. */
static void notify(tc_store_server_t *s, const void *k, size_t n, int one) {
  for (size_t i = 0; i < s->nconns; i++) {
    tc__conn_t *c = s->conns[i];
    for (size_t j = 0; !c->dead && j < c->nwait; j++) {
      if (c->wklen[j] != n || memcmp(c->wkeys[j], k, n)) continue;
      free(c->wkeys[j]);
      c->wkeys[j] = c->wkeys[c->nwait - 1];
      c->wklen[j] = c->wklen[c->nwait - 1];
      if (--c->nwait == 0) {
        tc__srv_clear_wait(s, c);
        if (c->out.len == c->out_off) c->out_since = tc__now();
        tc__buf_u8(&c->out, TC__WAIT_STOP_WAITING);
        if (one) return;
      }
      break;
    }
  }
}

/* Accounted cost of waiting for n keys of total length klen. */
static size_t wait_cost(uint64_t n, size_t klen) {
  return (size_t)n * (sizeof(char *) + sizeof(size_t) + 1) + klen + 16;
}

/* Starts waiting for the keys among the n at r that are missing (all of
 * them when `all`); answers STOP_WAITING at once when none is. */
static void start_wait(tc_store_server_t *s, tc__conn_t *c, rd_t *r,
                       uint64_t n, size_t cost, int all) {
  tc__srv_clear_wait(s, c);
  c->wkeys = calloc(n ? n : 1, sizeof *c->wkeys);
  c->wklen = calloc(n ? n : 1, sizeof *c->wklen);
  c->wcost = cost;
  tc__srv_acct(s, (long long)cost);
  if (!c->wkeys || !c->wklen) {
    tc__srv_drop(s, c, 0, "out of memory for a wait");
    return;
  }
  for (uint64_t i = 0; i < n; i++) {
    size_t kl;
    const uint8_t *k = rdstr(r, &kl);
    if (!all && present(s, k, kl)) continue;
    char *copy = malloc(kl ? kl : 1);
    if (!copy) {
      tc__srv_drop(s, c, 0, "out of memory for a wait");
      return;
    }
    memcpy(copy, k, kl);
    c->wkeys[c->nwait] = copy;
    c->wklen[c->nwait++] = kl;
  }
  if (c->nwait == 0) {
    tc__srv_clear_wait(s, c);
    tc__buf_u8(&c->out, TC__WAIT_STOP_WAITING);
  }
}

/* Number of items in a queue value. */
static int64_t queue_len(const tc__kv_entry_t *q) {
  int64_t n = 0;
  for (size_t off = 0; q && off + 8 <= q->vlen; n++)
    off += 8 + (size_t)tc__rd_u64(q->val + off);
  return n;
}

/* Sets key in kv (accounted), or drops c when out of memory; then wakes
 * its waiters. */
static void do_set(tc_store_server_t *s, tc__conn_t *c, const void *k,
                   size_t kl, const void *v, size_t vl) {
  size_t before = entry_cost(tc__kv_find(&s->kv, k, kl));
  tc__kv_entry_t *e = tc__kv_set(&s->kv, k, kl, v, vl);
  if (!e) {
    tc__srv_drop(s, c, 0, "out of memory for a value");
    return;
  }
  tc__srv_acct(s, (long long)entry_cost(e) - (long long)before);
  notify(s, k, kl, 0);
}

/* Appends to key in kv (queues when q), accounted. NULL when out of
 * memory. */
static tc__kv_entry_t *do_append(tc_store_server_t *s, tc__kv_t *kv,
                                 const void *k, size_t kl, const void *v,
                                 size_t vl) {
  size_t before = entry_cost(tc__kv_find(kv, k, kl));
  tc__kv_entry_t *e = tc__kv_append(kv, k, kl, v, vl);
  if (e) tc__srv_acct(s, (long long)entry_cost(e) - (long long)before);
  return e;
}

/* torch's add (accounted): TC_OK, TC_ERR_STORE, TC_ERR_NOMEM. */
static int do_add(tc_store_server_t *s, const void *k, size_t kl,
                  int64_t delta, int64_t *res) {
  size_t before = entry_cost(tc__kv_find(&s->kv, k, kl));
  int rc = tc__kv_add(&s->kv, k, kl, delta, res);
  tc__srv_acct(s, (long long)entry_cost(tc__kv_find(&s->kv, k, kl)) -
                      (long long)before);
  return rc;
}

/* What a request costs before it runs: *answer bytes of answers, *store
 * bytes of stored data and wait lists (upper bounds). */
static void cost_of(tc_store_server_t *s, const uint8_t *req, size_t *answer,
                    size_t *store) {
  rd_t r = {req, 1};
  size_t kl, vl, el, a = 0, st = 0;
  const uint8_t *k;
  switch ((tc__tcp_query_t)req[0]) {
  case TC__Q_PING: a = 4; break;
  case TC__Q_SET:
  case TC__Q_APPEND:
    rdstr(&r, &kl);
    rdstr(&r, &vl);
    st = TC__STORE_ENTRY_COST(kl, vl);
    break;
  case TC__Q_COMPARE_SET: {
    k = rdstr(&r, &kl);
    rdstr(&r, &el);
    rdstr(&r, &vl);
    tc__kv_entry_t *cur = tc__kv_find(&s->kv, k, kl);
    size_t m = cur && cur->vlen > vl ? cur->vlen : vl;
    a = 8 + (m > el ? m : el);
    st = TC__STORE_ENTRY_COST(kl, vl);
    break;
  }
  case TC__Q_GET:
    k = rdstr(&r, &kl);
    a = value_answer_len(s, k, kl);
    break;
  case TC__Q_ADD:
    rdstr(&r, &kl);
    a = 8;
    st = TC__STORE_ENTRY_COST(kl, 24);
    break;
  case TC__Q_CHECK:
  case TC__Q_CANCEL_WAIT: a = 1; break;
  case TC__Q_WAIT: {
    uint64_t n = rd64(&r);
    size_t tot = 0;
    for (uint64_t i = 0; i < n; i++) {
      rdstr(&r, &kl);
      tot += kl;
    }
    a = 1;
    st = wait_cost(n, tot);
    break;
  }
  case TC__Q_GETNUMKEYS:
  case TC__Q_DELETE_KEY:
  case TC__Q_QUEUE_LEN: a = 8; break;
  case TC__Q_MULTI_GET: {
    uint64_t n = rd64(&r);
    for (uint64_t i = 0; i < n; i++) {
      k = rdstr(&r, &kl);
      a += value_answer_len(s, k, kl);
    }
    break;
  }
  case TC__Q_MULTI_SET: {
    uint64_t n = rd64(&r);
    for (uint64_t i = 0; i < n; i++) {
      rdstr(&r, &kl);
      rdstr(&r, &vl);
      st += TC__STORE_ENTRY_COST(kl, vl);
    }
    break;
  }
  case TC__Q_QUEUE_PUSH:
    rdstr(&r, &kl);
    rdstr(&r, &vl);
    st = TC__STORE_ENTRY_COST(kl, 8 + vl);
    break;
  case TC__Q_QUEUE_POP: {
    k = rdstr(&r, &kl);
    tc__kv_entry_t *q = tc__kv_find(&s->queues, k, kl);
    a = 8;
    if (q && q->vlen >= 8) a += 8 + (size_t)tc__rd_u64(q->val);
    break;
  }
  case TC__Q_LIST_KEYS:
    a = 8;
    for (size_t i = 0; i < s->kv.nbuckets; i++)
      for (tc__kv_entry_t *x = s->kv.buckets[i]; x; x = x->next)
        a += 8 + x->klen;
    break;
  case TC__Q_BARRIER:
    rdstr(&r, &kl);
    a = 1;
    st = TC__STORE_ENTRY_COST(kl, 24) + wait_cost(1, kl);
    break;
  default: break;
  }
  *answer = a;
  *store = st;
}

/* Pops the first item of queue q into c's answer (accounted). */
static void queue_pop(tc_store_server_t *s, tc__conn_t *c, tc__kv_entry_t *q) {
  int64_t n = queue_len(q);
  tc__buf_u64(&c->out, (uint64_t)n);
  if (n <= 0) return;
  size_t il = (size_t)tc__rd_u64(q->val), before = entry_cost(q);
  tc__buf_str(&c->out, q->val + 8, il);
  memmove(q->val, q->val + 8 + il, q->vlen - 8 - il);
  q->vlen -= 8 + il;
  if (q->vlen == 0) {
    free(q->val);
    q->val = NULL;
  } else {
    uint8_t *p = realloc(q->val, q->vlen); /* give the memory back */
    if (p) q->val = p;
  }
  tc__srv_acct(s, (long long)entry_cost(q) - (long long)before);
}

int tc__srv_exec(tc_store_server_t *s, tc__conn_t *c, const uint8_t *req,
                 size_t len) {
  size_t answer = 0, store = 0;
  (void)len;
  cost_of(s, req, &answer, &store);
  size_t need = store + tc__srv_out_growth(c, answer);
  int room = tc__srv_room(s, need, c);
  if (room == 0) return 0;
  if (room < 0) {
    tc__srv_drop(s, c, 1,
                 "a %s request needs %zu bytes, more than the server's memory "
                 "budget of %llu bytes allows (%zu in use; "
                 "TORCHCOMMS_STORE_MAX_BYTES)",
                 tc__store_req_name(req[0]), need,
                 (unsigned long long)s->lim.max_bytes, s->used);
    return 1;
  }
  if (tc__srv_reserve_out(s, c, answer, store)) return 1;
  if (c->out.len == c->out_off && answer) c->out_since = tc__now();

  rd_t r = {req, 1};
  tc__buf_t *o = &c->out;
  size_t kl, vl, el;
  const uint8_t *k, *v, *e;
  switch ((tc__tcp_query_t)req[0]) {
  case TC__Q_VALIDATE: {
    uint32_t m = tc__rd_u32(req + 1);
    if (m != TC__TCP_VALIDATION_MAGIC)
      tc__srv_drop(s, c, 1, "wrong validation magic 0x%08x (not a TCPStore "
                   "client?)", m);
    c->validated = 1;
    break;
  }
  case TC__Q_PING:
    tc__buf_put(o, req + 1, 4);
    break;
  case TC__Q_SET:
    k = rdstr(&r, &kl);
    v = rdstr(&r, &vl);
    do_set(s, c, k, kl, v, vl);
    break;
  case TC__Q_COMPARE_SET: {
    k = rdstr(&r, &kl);
    e = rdstr(&r, &el);
    v = rdstr(&r, &vl);
    tc__kv_entry_t *cur = tc__kv_find(&s->kv, k, kl);
    if (!cur && el != 0) {
      tc__buf_str(o, e, el); /* torch answers `expected` here */
      break;
    }
    if (!cur || (cur->vlen == el && (!el || !memcmp(cur->val, e, el))))
      do_set(s, c, k, kl, v, vl);
    cur = tc__kv_find(&s->kv, k, kl);
    if (cur) tc__buf_str(o, cur->val, cur->vlen);
    break;
  }
  case TC__Q_GET:
    k = rdstr(&r, &kl);
    answer_value(s, c, k, kl);
    break;
  case TC__Q_ADD: {
    k = rdstr(&r, &kl);
    int64_t delta = (int64_t)rd64(&r), res = 0;
    int rc = do_add(s, k, kl, delta, &res);
    if (rc != TC_OK) {
      tc__srv_drop(s, c, 1, "%s", rc == TC_ERR_STORE ? "ADD on a key whose "
                   "value is not an integer" : "out of memory");
      break;
    }
    tc__buf_u64(o, (uint64_t)res);
    notify(s, k, kl, 0);
    break;
  }
  case TC__Q_CHECK: {
    uint64_t n = rd64(&r);
    int ready = 1;
    for (uint64_t i = 0; i < n; i++) {
      k = rdstr(&r, &kl);
      ready &= present(s, k, kl);
    }
    tc__buf_u8(o, ready ? TC__CHECK_READY : TC__CHECK_NOT_READY);
    break;
  }
  case TC__Q_WAIT: {
    uint64_t n = rd64(&r);
    start_wait(s, c, &r, n, store, 0);
    break;
  }
  case TC__Q_GETNUMKEYS:
    tc__buf_u64(o, (uint64_t)s->kv.count);
    break;
  case TC__Q_DELETE_KEY: {
    k = rdstr(&r, &kl);
    size_t before = entry_cost(tc__kv_find(&s->kv, k, kl));
    int n = tc__kv_delete(&s->kv, k, kl);
    tc__srv_acct(s, -(long long)before);
    tc__buf_u64(o, (uint64_t)n);
    break;
  }
  case TC__Q_APPEND:
    k = rdstr(&r, &kl);
    v = rdstr(&r, &vl);
    if (!do_append(s, &s->kv, k, kl, v, vl))
      tc__srv_drop(s, c, 0, "out of memory for a value");
    else
      notify(s, k, kl, 0);
    break;
  case TC__Q_MULTI_GET: {
    uint64_t n = rd64(&r);
    for (uint64_t i = 0; i < n; i++) {
      k = rdstr(&r, &kl);
      answer_value(s, c, k, kl);
    }
    break;
  }
  case TC__Q_MULTI_SET: {
    uint64_t n = rd64(&r);
    for (uint64_t i = 0; i < n && !c->dead; i++) {
      k = rdstr(&r, &kl);
      v = rdstr(&r, &vl);
      do_set(s, c, k, kl, v, vl);
    }
    break;
  }
  case TC__Q_CANCEL_WAIT:
    tc__srv_clear_wait(s, c);
    tc__buf_u8(o, TC__WAIT_CANCELED);
    break;
  case TC__Q_QUEUE_PUSH: {
    k = rdstr(&r, &kl);
    v = rdstr(&r, &vl);
    uint8_t hdr[8];
    for (int i = 0; i < 8; i++) hdr[i] = (uint8_t)((uint64_t)vl >> (8 * i));
    /* the length, then the bytes; a failed second append takes the
     * length back, so the queue stays well-formed */
    tc__kv_entry_t *q = do_append(s, &s->queues, k, kl, hdr, 8);
    if (q && !do_append(s, &s->queues, k, kl, v, vl)) {
      q->vlen -= 8;
      tc__srv_acct(s, -8);
      q = NULL;
    }
    if (!q) tc__srv_drop(s, c, 0, "out of memory for a queue item");
    else notify(s, k, kl, 1);
    break;
  }
  case TC__Q_QUEUE_POP:
    k = rdstr(&r, &kl);
    queue_pop(s, c, tc__kv_find(&s->queues, k, kl));
    break;
  case TC__Q_QUEUE_LEN:
    k = rdstr(&r, &kl);
    tc__buf_u64(o, (uint64_t)queue_len(tc__kv_find(&s->queues, k, kl)));
    break;
  case TC__Q_LIST_KEYS:
    tc__buf_u64(o, (uint64_t)s->kv.count);
    for (size_t i = 0; i < s->kv.nbuckets; i++)
      for (tc__kv_entry_t *x = s->kv.buckets[i]; x; x = x->next)
        tc__buf_str(o, x->key, x->klen);
    break;
  case TC__Q_BARRIER: {
    k = rdstr(&r, &kl);
    int64_t world = (int64_t)rd64(&r), count = 0;
    /* the count is stored without waking waiters until it is complete */
    if (do_add(s, k, kl, 1, &count) != TC_OK) {
      tc__srv_drop(s, c, 1, "BARRIER on a key whose value is not an integer");
      break;
    }
    if (count >= world) {
      notify(s, k, kl, 0);
      tc__buf_u8(o, TC__WAIT_STOP_WAITING);
    } else {
      rd_t kr = {req, 1}; /* re-read the key for the wait */
      start_wait(s, c, &kr, 1, wait_cost(1, kl), 1);
    }
    break;
  }
  default:
    break;
  }
  return 1;
}

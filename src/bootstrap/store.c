/* store.c -- the tc_store_t object and its public functions, the in-process
 * memory store, the prefix store, and the byte-keyed hash map shared with
 * the TCP store server.
 *
 * Handles: every live store is on a registry list (guarded by a mutex), so
 * a released or foreign pointer is reported as TC_ERR_INVALID_USAGE instead
 * of being dereferenced. Every operation holds a reference for its whole
 * duration, so a concurrent release cannot free the store under it.
 */
#include "bootstrap/store_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

#define TC__STORE_MAGIC 0x53544f52u /* "STOR" */
#define TC__STORE_DEAD 0x44454144u  /* "DEAD" */

struct tc_store {
  uint32_t magic;
  atomic_int refs;
  tc_store_vtable_t vt;
  tc__store_ext_t ext;
  void *ctx;
  struct tc_store *prev, *next; /* registry list */
};

static pthread_mutex_t tc__store_reg_mu = PTHREAD_MUTEX_INITIALIZER;
static tc_store_t *tc__store_reg_head;

/* ======================================================================== */
/* Hash map                                                                  */
/* ======================================================================== */

/* FNV-1a, 64 bit. */
static uint64_t tc__kv_hash(const void *key, size_t klen) {
  const uint8_t *p = key;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < klen; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

tc__kv_entry_t *tc__kv_find(const tc__kv_t *kv, const void *key, size_t klen) {
  if (!kv->nbuckets) return NULL;
  uint64_t h = tc__kv_hash(key, klen);
  for (tc__kv_entry_t *e = kv->buckets[h & (kv->nbuckets - 1)]; e; e = e->next)
    if (e->hash == h && e->klen == klen && !memcmp(e->key, key, klen)) return e;
  return NULL;
}

/* Doubles the table when it is more than 3/4 full; -1 when out of memory. */
static int tc__kv_grow(tc__kv_t *kv) {
  if (kv->nbuckets && kv->count < kv->nbuckets / 4 * 3) return 0;
  size_t n = kv->nbuckets ? kv->nbuckets * 2 : 64;
  tc__kv_entry_t **b = calloc(n, sizeof *b);
  if (!b) return kv->nbuckets ? 0 : -1; /* a fuller table still works */
  for (size_t i = 0; i < kv->nbuckets; i++) {
    tc__kv_entry_t *e = kv->buckets[i];
    while (e) {
      tc__kv_entry_t *next = e->next;
      e->next = b[e->hash & (n - 1)];
      b[e->hash & (n - 1)] = e;
      e = next;
    }
  }
  free(kv->buckets);
  kv->buckets = b;
  kv->nbuckets = n;
  return 0;
}

/* Finds key or inserts it with an empty value; NULL when out of memory.
 * *created tells which. */
static tc__kv_entry_t *tc__kv_lookup_or_add(tc__kv_t *kv, const void *key,
                                            size_t klen, int *created) {
  tc__kv_entry_t *e = tc__kv_find(kv, key, klen);
  *created = 0;
  if (e) return e;
  if (tc__kv_grow(kv)) return NULL;
  e = malloc(sizeof *e + klen + 1);
  if (!e) return NULL;
  e->hash = tc__kv_hash(key, klen);
  e->val = NULL;
  e->vlen = 0;
  e->klen = klen;
  memcpy(e->key, key, klen);
  e->key[klen] = '\0';
  size_t i = e->hash & (kv->nbuckets - 1);
  e->next = kv->buckets[i];
  kv->buckets[i] = e;
  kv->count++;
  *created = 1;
  return e;
}

tc__kv_entry_t *tc__kv_set(tc__kv_t *kv, const void *key, size_t klen,
                           const void *val, size_t vlen) {
  uint8_t *copy = NULL;
  if (vlen) {
    copy = malloc(vlen);
    if (!copy) return NULL;
    memcpy(copy, val, vlen);
  }
  int created;
  tc__kv_entry_t *e = tc__kv_lookup_or_add(kv, key, klen, &created);
  if (!e) {
    free(copy);
    return NULL;
  }
  free(e->val);
  e->val = copy;
  e->vlen = vlen;
  return e;
}

tc__kv_entry_t *tc__kv_append(tc__kv_t *kv, const void *key, size_t klen,
                              const void *data, size_t len) {
  int created;
  tc__kv_entry_t *e = tc__kv_lookup_or_add(kv, key, klen, &created);
  if (!e) return NULL;
  if (len) {
    uint8_t *v = realloc(e->val, e->vlen + len);
    if (!v) {
      if (created) tc__kv_delete(kv, key, klen);
      return NULL;
    }
    memcpy(v + e->vlen, data, len);
    e->val = v;
    e->vlen += len;
  }
  return e;
}

int tc__kv_add(tc__kv_t *kv, const void *key, size_t klen, int64_t delta,
               int64_t *result) {
  int64_t cur = 0;
  tc__kv_entry_t *e = tc__kv_find(kv, key, klen);
  if (e) {
    char text[32];
    if (e->vlen == 0 || e->vlen >= sizeof text) return TC_ERR_STORE;
    memcpy(text, e->val, e->vlen);
    text[e->vlen] = '\0';
    char *end = NULL;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end) return TC_ERR_STORE;
    cur = (int64_t)v;
  }
  /* wraps like torch's int64 arithmetic, without signed overflow UB */
  int64_t sum = (int64_t)((uint64_t)cur + (uint64_t)delta);
  char out[32];
  int n = snprintf(out, sizeof out, "%" PRId64, sum);
  if (!tc__kv_set(kv, key, klen, out, (size_t)n)) return TC_ERR_NOMEM;
  *result = sum;
  return TC_OK;
}

int tc__kv_delete(tc__kv_t *kv, const void *key, size_t klen) {
  if (!kv->nbuckets) return 0;
  uint64_t h = tc__kv_hash(key, klen);
  tc__kv_entry_t **pp = &kv->buckets[h & (kv->nbuckets - 1)];
  for (; *pp; pp = &(*pp)->next) {
    tc__kv_entry_t *e = *pp;
    if (e->hash == h && e->klen == klen && !memcmp(e->key, key, klen)) {
      *pp = e->next;
      free(e->val);
      free(e);
      kv->count--;
      return 1;
    }
  }
  return 0;
}

void tc__kv_free(tc__kv_t *kv) {
  for (size_t i = 0; i < kv->nbuckets; i++) {
    tc__kv_entry_t *e = kv->buckets[i];
    while (e) {
      tc__kv_entry_t *next = e->next;
      free(e->val);
      free(e);
      e = next;
    }
  }
  free(kv->buckets);
  memset(kv, 0, sizeof *kv);
}

/* ======================================================================== */
/* Messages                                                                  */
/* ======================================================================== */

void tc__store_key_owner(const char *key, char *buf, size_t len) {
  size_t n = strlen(key), i = n;
  while (i > 0 && key[i - 1] >= '0' && key[i - 1] <= '9') i--;
  if (i < n && i > 0 && key[i - 1] == '/' && n - i < 10)
    snprintf(buf, len, "rank %s", key + i);
  else
    snprintf(buf, len, "the process that sets it");
}

/* Appends "'k1', 'k2', ... and N more" (at most 4 keys) to buf. */
static void tc__store_key_list(char *buf, size_t len, const char *const *keys,
                               size_t nkeys, const unsigned char *skip) {
  size_t used = strlen(buf), shown = 0, total = 0;
  for (size_t i = 0; i < nkeys; i++) {
    if (skip && skip[i]) continue;
    total++;
    if (shown == 4) continue;
    snprintf(buf + used, len - used, "%s'%s'", shown ? ", " : "", keys[i]);
    used = strlen(buf);
    shown++;
  }
  if (total > shown)
    snprintf(buf + used, len - used, " and %zu more", total - shown);
}

int tc__store_wait_timeout_error(
    const char *op, int (*check)(void *, const char *const *, size_t, int *),
    void *ctx, const char *const *keys, size_t nkeys, double timeout_s,
    const char *suffix) {
  char list[512] = "", missing[512] = "", owner[64];
  const char *first_missing = nkeys ? keys[0] : "";
  tc__store_key_list(list, sizeof list, keys, nkeys, NULL);
  unsigned char *present = check && nkeys > 1 ? calloc(nkeys, 1) : NULL;
  if (present) {
    int any_missing = 0;
    for (size_t i = 0; i < nkeys; i++) {
      int ready = 0;
      if (check(ctx, &keys[i], 1, &ready) != TC_OK) {
        any_missing = 0;
        break;
      }
      present[i] = (unsigned char)(ready != 0);
      if (!ready && !any_missing) first_missing = keys[i];
      any_missing |= !ready;
    }
    if (any_missing) {
      snprintf(missing, sizeof missing, "; still missing: ");
      tc__store_key_list(missing, sizeof missing, keys, nkeys, present);
    }
    free(present);
  }
  tc__store_key_owner(first_missing, owner, sizeof owner);
  return tc__set_error(TC_ERR_TIMEOUT,
                       "torchcomms: store %s(%s) timed out after %.1f s%s "
                       "(is %s running%s)",
                       op, list, timeout_s, missing, owner,
                       suffix ? suffix : "?");
}

/* ======================================================================== */
/* The store object                                                          */
/* ======================================================================== */

/* Takes a reference on a live store, or fails naming the function. */
static int tc__store_acquire(tc_store_t *s, const char *fn) {
  if (!s)
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: %s: store is NULL", fn);
  pthread_mutex_lock(&tc__store_reg_mu);
  tc_store_t *it = tc__store_reg_head;
  while (it && it != s) it = it->next;
  int ok = it && s->magic == TC__STORE_MAGIC;
  if (ok) atomic_fetch_add(&s->refs, 1);
  pthread_mutex_unlock(&tc__store_reg_mu);
  if (!ok)
    return tc__set_error(TC_ERR_INVALID_USAGE,
                         "torchcomms: %s: %p is not a live store (already "
                         "released with tc_store_release, or not a "
                         "tc_store_t)",
                         fn, (void *)s);
  return TC_OK;
}

/* Drops a reference; the last one unregisters and destroys the store. */
static void tc__store_drop(tc_store_t *s, const char *fn) {
  pthread_mutex_lock(&tc__store_reg_mu);
  tc_store_t *it = tc__store_reg_head;
  while (it && it != s) it = it->next;
  int last = 0;
  if (it && s->magic == TC__STORE_MAGIC) {
    last = atomic_fetch_sub(&s->refs, 1) == 1;
    if (last) {
      if (s->prev) s->prev->next = s->next;
      else tc__store_reg_head = s->next;
      if (s->next) s->next->prev = s->prev;
      s->magic = TC__STORE_DEAD;
    }
  } else {
    it = NULL;
  }
  pthread_mutex_unlock(&tc__store_reg_mu);
  if (!it) {
    tc__log(1, "%s: %p is not a live store (released twice?); ignored", fn,
            (void *)s);
    return;
  }
  if (last) {
    if (s->vt.destroy) s->vt.destroy(s->ctx);
    free(s);
  }
}

int tc__store_create_ext(const tc_store_vtable_t *vt,
                         const tc__store_ext_t *ext, void *ctx,
                         tc_store_t **out) {
  if (!out)
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: tc_store_create: out is NULL");
  *out = NULL;
  if (!vt)
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: tc_store_create: vtable is NULL");
  size_t need = offsetof(tc_store_vtable_t, destroy) + sizeof vt->destroy;
  if (vt->size < need || vt->version < 1)
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: tc_store_create: vtable size %u / "
                         "version %u not supported (set size = "
                         "sizeof(tc_store_vtable_t), version = 1)",
                         vt->size, vt->version);
  if (!vt->set || !vt->get || !vt->add || !vt->check || !vt->delete_key)
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: tc_store_create: the vtable must "
                         "provide set, get, add, check and delete_key");
  tc_store_t *s = calloc(1, sizeof *s);
  if (!s)
    return tc__set_error(TC_ERR_NOMEM,
                         "torchcomms: tc_store_create: out of memory");
  memcpy(&s->vt, vt, sizeof s->vt);
  s->vt.size = sizeof s->vt;
  if (ext) s->ext = *ext;
  if (!s->ext.kind) s->ext.kind = "custom";
  s->ctx = ctx;
  s->magic = TC__STORE_MAGIC;
  atomic_init(&s->refs, 1);
  pthread_mutex_lock(&tc__store_reg_mu);
  s->next = tc__store_reg_head;
  if (s->next) s->next->prev = s;
  tc__store_reg_head = s;
  pthread_mutex_unlock(&tc__store_reg_mu);
  *out = s;
  return TC_OK;
}

int tc_store_create(const tc_store_vtable_t *vtable, void *ctx,
                    tc_store_t **out) {
  return tc__store_create_ext(vtable, NULL, ctx, out);
}

void tc_store_retain(tc_store_t *store) {
  if (tc__store_acquire(store, "tc_store_retain") != TC_OK)
    tc__log(1, "%s", tc_last_error());
}

void tc_store_release(tc_store_t *store) {
  if (store) tc__store_drop(store, "tc_store_release");
}

/* Normalises a custom store's failure: non-negative codes become
 * TC_ERR_STORE, and a failure that left no error text gets a generic one. */
static int tc__store_fail(tc_store_t *s, int rc, const char *op,
                          const char *key) {
  if (rc > 0) rc = TC_ERR_STORE;
  if (tc_last_error()[0] == '\0')
    tc__set_error(rc, "torchcomms: store %s('%s') failed on the %s store: %s",
                  op, key, s->ext.kind, tc_strerror(rc));
  return rc;
}

/* Rejects NaN and negative timeouts. */
static int tc__store_check_timeout(double t, const char *fn) {
  if (isnan(t) || t < 0)
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: %s: timeout_s must be >= 0 (got %g)", fn,
                         t);
  return TC_OK;
}

#define TC__ARG(cond, fn, what)                                                \
  do {                                                                         \
    if (!(cond))                                                               \
      return tc__set_error(TC_ERR_INVALID_ARGUMENT,                            \
                           "torchcomms: %s: %s", fn, what);                    \
  } while (0)

int tc_store_set(tc_store_t *store, const char *key, const void *value,
                 size_t len) {
  static const char fn[] = "tc_store_set";
  TC__ARG(key, fn, "key is NULL");
  TC__ARG(value || len == 0, fn, "value is NULL but len > 0");
  TC_CHECK(tc__store_acquire(store, fn));
  tc__set_error_text(TC_OK, "");
  int rc = store->vt.set(store->ctx, key, value ? value : "", len);
  if (rc != TC_OK) rc = tc__store_fail(store, rc, "set", key);
  tc__store_drop(store, fn);
  return rc;
}

int tc_store_get(tc_store_t *store, const char *key, void **value, size_t *len,
                 double timeout_s) {
  static const char fn[] = "tc_store_get";
  TC__ARG(value && len, fn, "value and len must not be NULL");
  *value = NULL;
  *len = 0;
  TC__ARG(key, fn, "key is NULL");
  TC_CHECK(tc__store_check_timeout(timeout_s, fn));
  TC_CHECK(tc__store_acquire(store, fn));
  tc__set_error_text(TC_OK, "");
  void *v = NULL;
  size_t n = 0;
  int rc = store->vt.get(store->ctx, key, &v, &n, timeout_s);
  if (rc == TC_OK) {
    /* always a non-NULL, NUL-terminated buffer (the NUL not counted) */
    uint8_t *t = realloc(v, n + 1);
    if (!t) {
      free(v);
      rc = tc__set_error(TC_ERR_NOMEM,
                         "torchcomms: store get('%s'): out of memory", key);
    } else {
      t[n] = 0;
      *value = t;
      *len = n;
    }
  } else {
    free(v);
    rc = tc__store_fail(store, rc, "get", key);
  }
  tc__store_drop(store, fn);
  return rc;
}

int tc_store_add(tc_store_t *store, const char *key, int64_t delta,
                 int64_t *result) {
  static const char fn[] = "tc_store_add";
  TC__ARG(key, fn, "key is NULL");
  TC_CHECK(tc__store_acquire(store, fn));
  tc__set_error_text(TC_OK, "");
  int64_t r = 0;
  int rc = store->vt.add(store->ctx, key, delta, &r);
  if (rc != TC_OK) rc = tc__store_fail(store, rc, "add", key);
  else if (result) *result = r;
  tc__store_drop(store, fn);
  return rc;
}

int tc_store_check(tc_store_t *store, const char *const *keys, size_t nkeys,
                   int *ready) {
  static const char fn[] = "tc_store_check";
  TC__ARG(ready, fn, "ready is NULL");
  *ready = 0;
  TC__ARG(keys || nkeys == 0, fn, "keys is NULL but nkeys > 0");
  for (size_t i = 0; i < nkeys; i++) TC__ARG(keys[i], fn, "a key is NULL");
  TC_CHECK(tc__store_acquire(store, fn));
  int rc = TC_OK;
  if (nkeys == 0) {
    *ready = 1;
  } else {
    tc__set_error_text(TC_OK, "");
    rc = store->vt.check(store->ctx, keys, nkeys, ready);
    if (rc != TC_OK) rc = tc__store_fail(store, rc, "check", keys[0]);
    else *ready = *ready != 0;
  }
  tc__store_drop(store, fn);
  return rc;
}

/* Waits for keys by polling `check`, sleeping 1 ms doubling to 50 ms. */
static int tc__store_poll_wait(tc_store_t *s, const char *const *keys,
                               size_t nkeys, double timeout_s) {
  double deadline = tc__deadline(timeout_s), nap = 0.001;
  for (;;) {
    int ready = 0;
    tc__set_error_text(TC_OK, "");
    int rc = s->vt.check(s->ctx, keys, nkeys, &ready);
    if (rc != TC_OK) return tc__store_fail(s, rc, "wait", keys[0]);
    if (ready) return TC_OK;
    double left = deadline - tc__now();
    if (left <= 0)
      return tc__store_wait_timeout_error(
          "wait", s->vt.check, s->ctx, keys, nkeys, timeout_s, "?");
    double t = nap < left ? nap : left;
    struct timespec ts = {(time_t)t, (long)((t - (double)(time_t)t) * 1e9)};
    nanosleep(&ts, NULL);
    nap = nap * 2 < 0.05 ? nap * 2 : 0.05;
  }
}

int tc_store_wait(tc_store_t *store, const char *const *keys, size_t nkeys,
                  double timeout_s) {
  static const char fn[] = "tc_store_wait";
  TC__ARG(keys || nkeys == 0, fn, "keys is NULL but nkeys > 0");
  for (size_t i = 0; i < nkeys; i++) TC__ARG(keys[i], fn, "a key is NULL");
  TC_CHECK(tc__store_check_timeout(timeout_s, fn));
  TC_CHECK(tc__store_acquire(store, fn));
  int rc = TC_OK;
  if (nkeys > 0) {
    tc__set_error_text(TC_OK, "");
    if (store->ext.wait) {
      rc = store->ext.wait(store->ctx, keys, nkeys, timeout_s);
      if (rc != TC_OK) rc = tc__store_fail(store, rc, "wait", keys[0]);
    } else {
      rc = tc__store_poll_wait(store, keys, nkeys, timeout_s);
    }
  }
  tc__store_drop(store, fn);
  return rc;
}

int tc_store_delete(tc_store_t *store, const char *key, int *deleted) {
  static const char fn[] = "tc_store_delete";
  TC__ARG(key, fn, "key is NULL");
  TC_CHECK(tc__store_acquire(store, fn));
  tc__set_error_text(TC_OK, "");
  int d = 0;
  int rc = store->vt.delete_key(store->ctx, key, &d);
  if (rc != TC_OK) rc = tc__store_fail(store, rc, "delete", key);
  else if (deleted) *deleted = d != 0;
  tc__store_drop(store, fn);
  return rc;
}

const char *tc_store_local_addr(tc_store_t *store) {
  if (tc__store_acquire(store, "tc_store_local_addr") != TC_OK) return NULL;
  const char *a = store->ext.local_addr ? store->ext.local_addr(store->ctx)
                                        : NULL;
  tc__store_drop(store, "tc_store_local_addr");
  return a; /* owned by the store's context, valid while it lives */
}

/* ======================================================================== */
/* Memory store                                                              */
/* ======================================================================== */

typedef struct tc__mem_store {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* broadcast on every change */
  tc__kv_t kv;
} tc__mem_store_t;

/* Waits on the memory store's condvar until `deadline` (monotonic s). */
static void tc__mem_wait_until(tc__mem_store_t *m, double deadline) {
  struct timespec now, ts;
  clock_gettime(CLOCK_MONOTONIC, &now);
  double left = deadline - tc__now();
  if (left > 3600) left = 3600; /* re-checked by the caller's loop */
  if (left < 0) left = 0;
  double s = (double)now.tv_sec + (double)now.tv_nsec * 1e-9 + left;
  ts.tv_sec = (time_t)s;
  ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
  if (ts.tv_nsec >= 1000000000L) ts.tv_nsec = 999999999L;
  pthread_cond_timedwait(&m->cv, &m->mu, &ts);
}

/* vtable set: stores a copy and wakes every waiter. */
static int tc__mem_set(void *ctx, const char *key, const void *v, size_t n) {
  tc__mem_store_t *m = ctx;
  pthread_mutex_lock(&m->mu);
  tc__kv_entry_t *e = tc__kv_set(&m->kv, key, strlen(key), v, n);
  pthread_cond_broadcast(&m->cv);
  pthread_mutex_unlock(&m->mu);
  return e ? TC_OK
           : tc__set_error(TC_ERR_NOMEM,
                           "torchcomms: store set('%s'): out of memory", key);
}

/* vtable get: waits on the condvar until the key exists or timeout_s. */
static int tc__mem_get(void *ctx, const char *key, void **value, size_t *len,
                       double timeout_s) {
  tc__mem_store_t *m = ctx;
  double deadline = tc__deadline(timeout_s);
  size_t klen = strlen(key);
  pthread_mutex_lock(&m->mu);
  for (;;) {
    tc__kv_entry_t *e = tc__kv_find(&m->kv, key, klen);
    if (e) {
      void *copy = malloc(e->vlen + 1);
      if (copy && e->vlen) memcpy(copy, e->val, e->vlen);
      *len = e->vlen;
      pthread_mutex_unlock(&m->mu);
      *value = copy;
      return copy ? TC_OK
                  : tc__set_error(TC_ERR_NOMEM,
                                  "torchcomms: store get('%s'): out of memory",
                                  key);
    }
    if (tc__now() >= deadline) break;
    tc__mem_wait_until(m, deadline);
  }
  pthread_mutex_unlock(&m->mu);
  const char *keys[1] = {key};
  return tc__store_wait_timeout_error(
      "get", NULL, NULL, keys, 1, timeout_s,
      "? (in-process memory store: no thread of this process set it)");
}

/* vtable add: torch add semantics (decimal text counters). */
static int tc__mem_add(void *ctx, const char *key, int64_t delta,
                       int64_t *result) {
  tc__mem_store_t *m = ctx;
  pthread_mutex_lock(&m->mu);
  int rc = tc__kv_add(&m->kv, key, strlen(key), delta, result);
  pthread_cond_broadcast(&m->cv);
  pthread_mutex_unlock(&m->mu);
  if (rc == TC_ERR_STORE)
    return tc__set_error(rc,
                         "torchcomms: store add('%s'): the key holds a value "
                         "that is not a decimal integer (use a key of its "
                         "own for counters)",
                         key);
  if (rc != TC_OK)
    return tc__set_error(rc, "torchcomms: store add('%s'): out of memory", key);
  return TC_OK;
}

/* 1 if every key is present; the caller holds m->mu. */
static int tc__mem_all_present(tc__mem_store_t *m, const char *const *keys,
                               size_t nkeys) {
  for (size_t i = 0; i < nkeys; i++)
    if (!tc__kv_find(&m->kv, keys[i], strlen(keys[i]))) return 0;
  return 1;
}

/* vtable check: 1 when every key exists. */
static int tc__mem_check(void *ctx, const char *const *keys, size_t nkeys,
                         int *ready) {
  tc__mem_store_t *m = ctx;
  pthread_mutex_lock(&m->mu);
  *ready = tc__mem_all_present(m, keys, nkeys);
  pthread_mutex_unlock(&m->mu);
  return TC_OK;
}

/* ext wait: waits on the condvar until every key exists or timeout_s. */
static int tc__mem_wait(void *ctx, const char *const *keys, size_t nkeys,
                        double timeout_s) {
  tc__mem_store_t *m = ctx;
  double deadline = tc__deadline(timeout_s);
  pthread_mutex_lock(&m->mu);
  int ok;
  while (!(ok = tc__mem_all_present(m, keys, nkeys)) && tc__now() < deadline)
    tc__mem_wait_until(m, deadline);
  pthread_mutex_unlock(&m->mu);
  if (ok) return TC_OK;
  return tc__store_wait_timeout_error(
      "wait", tc__mem_check, m, keys, nkeys, timeout_s,
      "? (in-process memory store: no thread of this process set it)");
}

/* vtable delete_key. */
static int tc__mem_delete(void *ctx, const char *key, int *deleted) {
  tc__mem_store_t *m = ctx;
  pthread_mutex_lock(&m->mu);
  *deleted = tc__kv_delete(&m->kv, key, strlen(key));
  pthread_mutex_unlock(&m->mu);
  return TC_OK;
}

/* vtable destroy: frees the map and the context. */
static void tc__mem_destroy(void *ctx) {
  tc__mem_store_t *m = ctx;
  tc__kv_free(&m->kv);
  pthread_cond_destroy(&m->cv);
  pthread_mutex_destroy(&m->mu);
  free(m);
}

int tc_store_memory(tc_store_t **out) {
  if (!out)
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: tc_store_memory: out is NULL");
  *out = NULL;
  tc__mem_store_t *m = calloc(1, sizeof *m);
  if (!m)
    return tc__set_error(TC_ERR_NOMEM,
                         "torchcomms: tc_store_memory: out of memory");
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&m->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&m->mu, NULL);
  static const tc_store_vtable_t vt = {
      .size = sizeof(tc_store_vtable_t), .version = 1, .set = tc__mem_set,
      .get = tc__mem_get, .add = tc__mem_add, .check = tc__mem_check,
      .delete_key = tc__mem_delete, .destroy = tc__mem_destroy};
  static const tc__store_ext_t ext = {.wait = tc__mem_wait, .kind = "memory"};
  int rc = tc__store_create_ext(&vt, &ext, m, out);
  if (rc != TC_OK) tc__mem_destroy(m);
  return rc;
}

/* ======================================================================== */
/* Prefix store                                                              */
/* ======================================================================== */

typedef struct tc__prefix_store {
  tc_store_t *base;
  char *prefix;
  size_t plen;
} tc__prefix_store_t;

/* "<prefix>/<key>", malloc()ed; NULL (error text set) when out of memory. */
static char *tc__prefix_key(tc__prefix_store_t *p, const char *key) {
  size_t klen = strlen(key);
  char *k = malloc(p->plen + 1 + klen + 1);
  if (!k) {
    tc__set_error(TC_ERR_NOMEM, "torchcomms: prefix store: out of memory");
    return NULL;
  }
  memcpy(k, p->prefix, p->plen);
  k[p->plen] = '/';
  memcpy(k + p->plen + 1, key, klen + 1);
  return k;
}

/* vtable set/get/add/delete_key: forward "<prefix>/<key>" to the base. */
static int tc__prefix_set(void *ctx, const char *key, const void *v,
                          size_t n) {
  char *k = tc__prefix_key(ctx, key);
  if (!k) return TC_ERR_NOMEM;
  int rc = tc_store_set(((tc__prefix_store_t *)ctx)->base, k, v, n);
  free(k);
  return rc;
}

static int tc__prefix_get(void *ctx, const char *key, void **value,
                          size_t *len, double timeout_s) {
  char *k = tc__prefix_key(ctx, key);
  if (!k) return TC_ERR_NOMEM;
  int rc = tc_store_get(((tc__prefix_store_t *)ctx)->base, k, value, len,
                        timeout_s);
  free(k);
  return rc;
}

static int tc__prefix_add(void *ctx, const char *key, int64_t delta,
                          int64_t *result) {
  char *k = tc__prefix_key(ctx, key);
  if (!k) return TC_ERR_NOMEM;
  int rc = tc_store_add(((tc__prefix_store_t *)ctx)->base, k, delta, result);
  free(k);
  return rc;
}

static int tc__prefix_delete(void *ctx, const char *key, int *deleted) {
  char *k = tc__prefix_key(ctx, key);
  if (!k) return TC_ERR_NOMEM;
  int rc = tc_store_delete(((tc__prefix_store_t *)ctx)->base, k, deleted);
  free(k);
  return rc;
}

/* Runs check (wait == 0) or wait on the prefixed keys. */
static int tc__prefix_multi(tc__prefix_store_t *p, const char *const *keys,
                            size_t nkeys, int wait, int *ready,
                            double timeout_s) {
  char **pk = calloc(nkeys, sizeof *pk);
  int rc = pk ? TC_OK
              : tc__set_error(TC_ERR_NOMEM,
                              "torchcomms: prefix store: out of memory");
  for (size_t i = 0; rc == TC_OK && i < nkeys; i++)
    if (!(pk[i] = tc__prefix_key(p, keys[i]))) rc = TC_ERR_NOMEM;
  if (rc == TC_OK)
    rc = wait ? tc_store_wait(p->base, (const char *const *)pk, nkeys,
                              timeout_s)
              : tc_store_check(p->base, (const char *const *)pk, nkeys, ready);
  for (size_t i = 0; pk && i < nkeys; i++) free(pk[i]);
  free(pk);
  return rc;
}

/* vtable check: the base checks the prefixed keys. */
static int tc__prefix_check(void *ctx, const char *const *keys, size_t nkeys,
                            int *ready) {
  return tc__prefix_multi(ctx, keys, nkeys, 0, ready, 0);
}

/* ext wait: the base waits for the prefixed keys. */
static int tc__prefix_wait(void *ctx, const char *const *keys, size_t nkeys,
                           double timeout_s) {
  return tc__prefix_multi(ctx, keys, nkeys, 1, NULL, timeout_s);
}

/* ext local_addr: the base's. */
static const char *tc__prefix_local_addr(void *ctx) {
  return tc_store_local_addr(((tc__prefix_store_t *)ctx)->base);
}

/* vtable destroy: drops the base reference. */
static void tc__prefix_destroy(void *ctx) {
  tc__prefix_store_t *p = ctx;
  tc_store_release(p->base);
  free(p->prefix);
  free(p);
}

int tc_store_prefix(tc_store_t *base, const char *prefix, tc_store_t **out) {
  static const char fn[] = "tc_store_prefix";
  TC__ARG(out, fn, "out is NULL");
  *out = NULL;
  TC__ARG(prefix, fn, "prefix is NULL");
  TC_CHECK(tc__store_acquire(base, fn)); /* the prefix store's reference */
  tc__prefix_store_t *p = calloc(1, sizeof *p);
  if (p) p->prefix = strdup(prefix);
  if (!p || !p->prefix) {
    if (p) free(p);
    tc_store_release(base);
    return tc__set_error(TC_ERR_NOMEM, "torchcomms: %s: out of memory", fn);
  }
  p->base = base;
  p->plen = strlen(prefix);
  static const tc_store_vtable_t vt = {
      .size = sizeof(tc_store_vtable_t), .version = 1, .set = tc__prefix_set,
      .get = tc__prefix_get, .add = tc__prefix_add, .check = tc__prefix_check,
      .delete_key = tc__prefix_delete, .destroy = tc__prefix_destroy};
  static const tc__store_ext_t ext = {.wait = tc__prefix_wait,
                                      .local_addr = tc__prefix_local_addr,
                                      .kind = "prefix"};
  int rc = tc__store_create_ext(&vt, &ext, p, out);
  if (rc != TC_OK) tc__prefix_destroy(p);
  return rc;
}

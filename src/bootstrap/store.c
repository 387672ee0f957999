/* store.c -- the tc_store_t handle: its registry, references, the public
 * tc_store_* functions over any store's vtable and their timeout messages.
 * The stores themselves: store_memory.c (in-process), store_prefix.c (keys
 * prefixed onto another store), tcp_store_client.c; the hash map they and
 * the TCP store server keep keys in: kv.c.
 *
 * Handles: every live store is on a registry list (guarded by a mutex), so
 * a released or foreign pointer is reported as TC_ERR_INVALID_USAGE instead
 * of being dereferenced. Every operation holds a reference for its whole
 * duration, so a concurrent release cannot free the store under it.
 *
 * Counter: each request that a tc_store_* function passes to a store's
 * vtable is counted per process, by kind (tc__store_counts, private_api.h),
 * except on stores that forward to another store (prefix), whose base
 * counts it: tools/tcscale.c measures bootstrap cost with it.
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

static pthread_mutex_t store_reg_mu = PTHREAD_MUTEX_INITIALIZER;
static tc_store_t *store_reg_head;

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
static void store_key_list(char *buf, size_t len, const char *const *keys,
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
  store_key_list(list, sizeof list, keys, nkeys, NULL);
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
      store_key_list(missing, sizeof missing, keys, nkeys, present);
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
/* Request counter (private_api.h)                                           */
/* ======================================================================== */

static _Atomic unsigned long long store_req_n[TC__SREQ_KINDS];
static _Atomic unsigned long long store_req_keys;

void tc__store_count(int kind, size_t nkeys) {
  if (kind < 0 || kind >= TC__SREQ_KINDS) return;
  atomic_fetch_add_explicit(&store_req_n[kind], 1, memory_order_relaxed);
  if (kind != TC__SREQ_CONNECT)
    atomic_fetch_add_explicit(&store_req_keys, nkeys, memory_order_relaxed);
}

int tc__store_is_private(const tc_store_t *store) {
  return store && store->magic == TC__STORE_MAGIC && store->ext.rank_private;
}

void tc__store_counts(tc__store_counts_t *out) {
  if (!out) return;
  memset(out, 0, sizeof *out);
  for (int k = 0; k < TC__SREQ_KINDS; k++) {
    out->n[k] = atomic_load_explicit(&store_req_n[k], memory_order_relaxed);
    if (k != TC__SREQ_CONNECT) out->requests += out->n[k];
  }
  out->keys = atomic_load_explicit(&store_req_keys, memory_order_relaxed);
}

void tc__store_counts_reset(void) {
  for (int k = 0; k < TC__SREQ_KINDS; k++)
    atomic_store_explicit(&store_req_n[k], 0, memory_order_relaxed);
  atomic_store_explicit(&store_req_keys, 0, memory_order_relaxed);
}

const char *tc__store_req_kind_name(int kind) {
  static const char *const names[TC__SREQ_KINDS] = {
      "set", "get", "add", "check", "wait", "delete", "connect"};
  return kind >= 0 && kind < TC__SREQ_KINDS ? names[kind] : "?";
}

/* Counts a request on s unless s forwards it to a store that counts it. */
static void store_count(const tc_store_t *s, int kind, size_t nkeys) {
  if (!s->ext.forwards) tc__store_count(kind, nkeys);
}

/* ======================================================================== */
/* The store object                                                          */
/* ======================================================================== */

/* Takes a reference on a live store, or fails naming the function. */
int tc__store_acquire(tc_store_t *s, const char *fn) {
  if (!s)
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: %s: store is NULL", fn);
  pthread_mutex_lock(&store_reg_mu);
  tc_store_t *it = store_reg_head;
  while (it && it != s) it = it->next;
  int ok = it && s->magic == TC__STORE_MAGIC;
  if (ok) atomic_fetch_add(&s->refs, 1);
  pthread_mutex_unlock(&store_reg_mu);
  if (!ok)
    return tc__set_error(TC_ERR_INVALID_USAGE,
                         "torchcomms: %s: %p is not a live store (already "
                         "released with tc_store_release, or not a "
                         "tc_store_t)",
                         fn, (void *)s);
  return TC_OK;
}

/* Drops a reference; the last one unregisters and destroys the store. */
void tc__store_drop(tc_store_t *s, const char *fn) {
  pthread_mutex_lock(&store_reg_mu);
  tc_store_t *it = store_reg_head;
  while (it && it != s) it = it->next;
  int last = 0;
  if (it && s->magic == TC__STORE_MAGIC) {
    last = atomic_fetch_sub(&s->refs, 1) == 1;
    if (last) {
      if (s->prev) s->prev->next = s->next;
      else store_reg_head = s->next;
      if (s->next) s->next->prev = s->prev;
      s->magic = TC__STORE_DEAD;
    }
  } else {
    it = NULL;
  }
  pthread_mutex_unlock(&store_reg_mu);
  if (!it) {
    tc__logs(TC_LOG_WARN, TC_LOG_STORE,
             "%s: %p is not a live store (released twice?); ignored", fn,
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
  pthread_mutex_lock(&store_reg_mu);
  s->next = store_reg_head;
  if (s->next) s->next->prev = s;
  store_reg_head = s;
  pthread_mutex_unlock(&store_reg_mu);
  *out = s;
  return TC_OK;
}

int tc_store_create(const tc_store_vtable_t *vtable, void *ctx,
                    tc_store_t **out) {
  return tc__store_create_ext(vtable, NULL, ctx, out);
}

void tc_store_retain(tc_store_t *store) {
  if (tc__store_acquire(store, "tc_store_retain") != TC_OK)
    tc__logs(TC_LOG_WARN, TC_LOG_STORE, "%s", tc_last_error());
}

void tc_store_release(tc_store_t *store) {
  if (store) tc__store_drop(store, "tc_store_release");
}

/* Normalises a custom store's failure: non-negative codes become
 * TC_ERR_STORE, and a failure that left no error text gets a generic one. */
static int store_fail(tc_store_t *s, int rc, const char *op,
                          const char *key) {
  if (rc > 0) rc = TC_ERR_STORE;
  if (tc_last_error()[0] == '\0')
    tc__set_error(rc, "torchcomms: store %s('%s') failed on the %s store: %s",
                  op, key, s->ext.kind, tc_strerror(rc));
  return rc;
}

/* Rejects NaN and negative timeouts. */
static int store_check_timeout(double t, const char *fn) {
  if (isnan(t) || t < 0)
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: %s: timeout_s must be >= 0 (got %g)", fn,
                         t);
  return TC_OK;
}


int tc_store_set(tc_store_t *store, const char *key, const void *value,
                 size_t len) {
  static const char fn[] = "tc_store_set";
  TC__ARG(key, fn, "key is NULL");
  TC__ARG(value || len == 0, fn, "value is NULL but len > 0");
  TC_CHECK(tc__store_acquire(store, fn));
  tc__set_error_text(TC_OK, "");
  store_count(store, TC__SREQ_SET, 1);
  int rc = store->vt.set(store->ctx, key, value ? value : "", len);
  if (rc != TC_OK) rc = store_fail(store, rc, "set", key);
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
  TC_CHECK(store_check_timeout(timeout_s, fn));
  TC_CHECK(tc__store_acquire(store, fn));
  tc__set_error_text(TC_OK, "");
  void *v = NULL;
  size_t n = 0;
  store_count(store, TC__SREQ_GET, 1);
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
    rc = store_fail(store, rc, "get", key);
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
  store_count(store, TC__SREQ_ADD, 1);
  int rc = store->vt.add(store->ctx, key, delta, &r);
  if (rc != TC_OK) rc = store_fail(store, rc, "add", key);
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
    store_count(store, TC__SREQ_CHECK, nkeys);
    rc = store->vt.check(store->ctx, keys, nkeys, ready);
    if (rc != TC_OK) rc = store_fail(store, rc, "check", keys[0]);
    else *ready = *ready != 0;
  }
  tc__store_drop(store, fn);
  return rc;
}

/* Waits for keys by polling `check`, sleeping 1 ms doubling to 50 ms. */
static int store_poll_wait(tc_store_t *s, const char *const *keys,
                               size_t nkeys, double timeout_s) {
  double deadline = tc__deadline(timeout_s), nap = 0.001;
  for (;;) {
    int ready = 0;
    tc__set_error_text(TC_OK, "");
    store_count(s, TC__SREQ_CHECK, nkeys);
    int rc = s->vt.check(s->ctx, keys, nkeys, &ready);
    if (rc != TC_OK) return store_fail(s, rc, "wait", keys[0]);
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
  TC_CHECK(store_check_timeout(timeout_s, fn));
  TC_CHECK(tc__store_acquire(store, fn));
  int rc = TC_OK;
  if (nkeys > 0) {
    tc__set_error_text(TC_OK, "");
    if (store->ext.wait) {
      store_count(store, TC__SREQ_WAIT, nkeys);
      rc = store->ext.wait(store->ctx, keys, nkeys, timeout_s);
      if (rc != TC_OK) rc = store_fail(store, rc, "wait", keys[0]);
    } else {
      rc = store_poll_wait(store, keys, nkeys, timeout_s);
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
  store_count(store, TC__SREQ_DELETE, 1);
  int rc = store->vt.delete_key(store->ctx, key, &d);
  if (rc != TC_OK) rc = store_fail(store, rc, "delete", key);
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


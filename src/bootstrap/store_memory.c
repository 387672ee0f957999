/* store_memory.c -- tc_store_memory: the in-process store (a hash map under
 * a mutex, waits on a condition variable), for a world of one and tests. */
#include "bootstrap/store_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

typedef struct tc__mem_store {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* broadcast on every change */
  tc__kv_t kv;
} tc__mem_store_t;

/* Waits on the memory store's condvar until `deadline` (monotonic s). */
static void mem_wait_until(tc__mem_store_t *m, double deadline) {
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
static int mem_set(void *ctx, const char *key, const void *v, size_t n) {
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
static int mem_get(void *ctx, const char *key, void **value, size_t *len,
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
    mem_wait_until(m, deadline);
  }
  pthread_mutex_unlock(&m->mu);
  const char *keys[1] = {key};
  return tc__store_wait_timeout_error(
      "get", NULL, NULL, keys, 1, timeout_s,
      "? (in-process memory store: no thread of this process set it)");
}

/* vtable add: torch add semantics (decimal text counters). */
static int mem_add(void *ctx, const char *key, int64_t delta,
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
static int mem_all_present(tc__mem_store_t *m, const char *const *keys,
                               size_t nkeys) {
  for (size_t i = 0; i < nkeys; i++)
    if (!tc__kv_find(&m->kv, keys[i], strlen(keys[i]))) return 0;
  return 1;
}

/* vtable check: 1 when every key exists. */
static int mem_check(void *ctx, const char *const *keys, size_t nkeys,
                         int *ready) {
  tc__mem_store_t *m = ctx;
  pthread_mutex_lock(&m->mu);
  *ready = mem_all_present(m, keys, nkeys);
  pthread_mutex_unlock(&m->mu);
  return TC_OK;
}

/* ext wait: waits on the condvar until every key exists or timeout_s. */
static int mem_wait(void *ctx, const char *const *keys, size_t nkeys,
                        double timeout_s) {
  tc__mem_store_t *m = ctx;
  double deadline = tc__deadline(timeout_s);
  pthread_mutex_lock(&m->mu);
  int ok;
  while (!(ok = mem_all_present(m, keys, nkeys)) && tc__now() < deadline)
    mem_wait_until(m, deadline);
  pthread_mutex_unlock(&m->mu);
  if (ok) return TC_OK;
  return tc__store_wait_timeout_error(
      "wait", mem_check, m, keys, nkeys, timeout_s,
      "? (in-process memory store: no thread of this process set it)");
}

/* vtable delete_key. */
static int mem_delete(void *ctx, const char *key, int *deleted) {
  tc__mem_store_t *m = ctx;
  pthread_mutex_lock(&m->mu);
  *deleted = tc__kv_delete(&m->kv, key, strlen(key));
  pthread_mutex_unlock(&m->mu);
  return TC_OK;
}

/* vtable destroy: frees the map and the context. */
static void mem_destroy(void *ctx) {
  tc__mem_store_t *m = ctx;
  tc__kv_free(&m->kv);
  pthread_cond_destroy(&m->cv);
  pthread_mutex_destroy(&m->mu);
  free(m);
}

static int mem_create(tc_store_t **out, int rank_private) {
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
      .size = sizeof(tc_store_vtable_t), .version = 1, .set = mem_set,
      .get = mem_get, .add = mem_add, .check = mem_check,
      .delete_key = mem_delete, .destroy = mem_destroy};
  const tc__store_ext_t ext = {.wait = mem_wait, .kind = "memory",
                               .rank_private = rank_private};
  int rc = tc__store_create_ext(&vt, &ext, m, out);
  if (rc != TC_OK) mem_destroy(m);
  return rc;
}

/* Shared by whoever holds it: the ranks may be threads of one process. */
int tc_store_memory(tc_store_t **out) { return mem_create(out, 0); }

int tc__store_memory_private(tc_store_t **out) { return mem_create(out, 1); }


/* store_prefix.c -- tc_store_prefix: a store that prefixes every key onto
 * another store (a communicator's view of the job's store). */
#include "bootstrap/store_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

typedef struct tc__prefix_store {
  tc_store_t *base;
  char *prefix;
  size_t plen;
} tc__prefix_store_t;

/* "<prefix>/<key>", malloc()ed; NULL (error text set) when out of memory. */
static char *prefix_key(tc__prefix_store_t *p, const char *key) {
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
static int prefix_set(void *ctx, const char *key, const void *v,
                          size_t n) {
  char *k = prefix_key(ctx, key);
  if (!k) return TC_ERR_NOMEM;
  int rc = tc_store_set(((tc__prefix_store_t *)ctx)->base, k, v, n);
  free(k);
  return rc;
}

static int prefix_get(void *ctx, const char *key, void **value,
                          size_t *len, double timeout_s) {
  char *k = prefix_key(ctx, key);
  if (!k) return TC_ERR_NOMEM;
  int rc = tc_store_get(((tc__prefix_store_t *)ctx)->base, k, value, len,
                        timeout_s);
  free(k);
  return rc;
}

static int prefix_add(void *ctx, const char *key, int64_t delta,
                          int64_t *result) {
  char *k = prefix_key(ctx, key);
  if (!k) return TC_ERR_NOMEM;
  int rc = tc_store_add(((tc__prefix_store_t *)ctx)->base, k, delta, result);
  free(k);
  return rc;
}

static int prefix_delete(void *ctx, const char *key, int *deleted) {
  char *k = prefix_key(ctx, key);
  if (!k) return TC_ERR_NOMEM;
  int rc = tc_store_delete(((tc__prefix_store_t *)ctx)->base, k, deleted);
  free(k);
  return rc;
}

/* Runs check (wait == 0) or wait on the prefixed keys. */
static int prefix_multi(tc__prefix_store_t *p, const char *const *keys,
                            size_t nkeys, int wait, int *ready,
                            double timeout_s) {
  char **pk = calloc(nkeys, sizeof *pk);
  int rc = pk ? TC_OK
              : tc__set_error(TC_ERR_NOMEM,
                              "torchcomms: prefix store: out of memory");
  for (size_t i = 0; rc == TC_OK && i < nkeys; i++)
    if (!(pk[i] = prefix_key(p, keys[i]))) rc = TC_ERR_NOMEM;
  if (rc == TC_OK)
    rc = wait ? tc_store_wait(p->base, (const char *const *)pk, nkeys,
                              timeout_s)
              : tc_store_check(p->base, (const char *const *)pk, nkeys, ready);
  for (size_t i = 0; pk && i < nkeys; i++) free(pk[i]);
  free(pk);
  return rc;
}

/* vtable check: the base checks the prefixed keys. */
static int prefix_check(void *ctx, const char *const *keys, size_t nkeys,
                            int *ready) {
  return prefix_multi(ctx, keys, nkeys, 0, ready, 0);
}

/* ext wait: the base waits for the prefixed keys. */
static int prefix_wait(void *ctx, const char *const *keys, size_t nkeys,
                           double timeout_s) {
  return prefix_multi(ctx, keys, nkeys, 1, NULL, timeout_s);
}

/* ext local_addr: the base's. */
static const char *prefix_local_addr(void *ctx) {
  return tc_store_local_addr(((tc__prefix_store_t *)ctx)->base);
}

/* vtable destroy: drops the base reference. */
static void prefix_destroy(void *ctx) {
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
      .size = sizeof(tc_store_vtable_t), .version = 1, .set = prefix_set,
      .get = prefix_get, .add = prefix_add, .check = prefix_check,
      .delete_key = prefix_delete, .destroy = prefix_destroy};
  static const tc__store_ext_t ext = {.wait = prefix_wait,
                                      .local_addr = prefix_local_addr,
                                      .kind = "prefix", .forwards = 1};
  int rc = tc__store_create_ext(&vt, &ext, p, out);
  if (rc != TC_OK) prefix_destroy(p);
  return rc;
}

/* kv.c -- tc__kv_*: the byte-keyed hash map (open addressing, FNV-1a)
 * that the memory store and the TCP store server keep their keys in. */
#include "bootstrap/store_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

/* FNV-1a, 64 bit. */
static uint64_t kv_hash(const void *key, size_t klen) {
  const uint8_t *p = key;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < klen; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

tc__kv_entry_t *tc__kv_find(const tc__kv_t *kv, const void *key, size_t klen) {
  if (!kv->nbuckets) return NULL;
  uint64_t h = kv_hash(key, klen);
  for (tc__kv_entry_t *e = kv->buckets[h & (kv->nbuckets - 1)]; e; e = e->next)
    if (e->hash == h && e->klen == klen && !memcmp(e->key, key, klen)) return e;
  return NULL;
}

/* Doubles the table when it is more than 3/4 full; -1 when out of memory. */
static int kv_grow(tc__kv_t *kv) {
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
static tc__kv_entry_t *kv_lookup_or_add(tc__kv_t *kv, const void *key,
                                            size_t klen, int *created) {
  tc__kv_entry_t *e = tc__kv_find(kv, key, klen);
  *created = 0;
  if (e) return e;
  if (kv_grow(kv)) return NULL;
  e = malloc(sizeof *e + klen + 1);
  if (!e) return NULL;
  e->hash = kv_hash(key, klen);
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
  tc__kv_entry_t *e = kv_lookup_or_add(kv, key, klen, &created);
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
  tc__kv_entry_t *e = kv_lookup_or_add(kv, key, klen, &created);
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
  uint64_t h = kv_hash(key, klen);
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


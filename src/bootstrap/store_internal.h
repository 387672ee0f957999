/* store_internal.h -- internals shared by the store layer (store.c,
 * store_memory.c, store_prefix.c, the TCP store client and server): the
 * extended store constructor and references, a byte-keyed hash map (kv.c),
 * a growable byte buffer and torch's TCPStore wire constants.
 *
 * Wire protocol (torch's TCPStore, verified against torch 2.13):
 *  - every request is one command byte (tc__tcp_query_t) followed by its
 *    arguments; integers are little-endian (host order on every platform
 *    torch supports), strings and byte vectors are a uint64 length followed
 *    by the bytes, key lists are a uint64 count followed by strings;
 *  - a new connection first sends VALIDATE + uint32 0x3C85F7CE (no reply),
 *    then PING + uint32 nonce (the server echoes the nonce);
 *  - torch's TCPStore client prefixes every user key with "/", so ours
 *    does the same to see the same keys.
 */
#ifndef TC_STORE_INTERNAL_H
#define TC_STORE_INTERNAL_H

#include "core/internal.h" /* first: defines _GNU_SOURCE */
#include "private_api.h"    /* tc__store_ext_t, tc__store_create_ext */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- torch TCPStore wire protocol ---- */

#define TC__TCP_VALIDATION_MAGIC 0x3C85F7CEu
#define TC__TCP_KEY_PREFIX "/"

typedef enum tc__tcp_query {
  TC__Q_VALIDATE = 0,
  TC__Q_SET = 1,
  TC__Q_COMPARE_SET = 2,
  TC__Q_GET = 3,
  TC__Q_ADD = 4,
  TC__Q_CHECK = 5,
  TC__Q_WAIT = 6,
  TC__Q_GETNUMKEYS = 7,
  TC__Q_DELETE_KEY = 8,
  TC__Q_APPEND = 9,
  TC__Q_MULTI_GET = 10,
  TC__Q_MULTI_SET = 11,
  TC__Q_CANCEL_WAIT = 12,
  TC__Q_PING = 13,
  TC__Q_QUEUE_PUSH = 14,
  TC__Q_QUEUE_POP = 15,
  TC__Q_QUEUE_LEN = 16,
  TC__Q_LIST_KEYS = 17,
  TC__Q_BARRIER = 18,
  TC__Q_COUNT
} tc__tcp_query_t;

/* CheckResponseType */
#define TC__CHECK_READY 0
#define TC__CHECK_NOT_READY 1
/* WaitResponseType */
#define TC__WAIT_STOP_WAITING 0
#define TC__WAIT_CANCELED 1

/* ---- request scanning (store_proto.c) ---- */

/* Keys longer than this are refused by the server. */
#define TC__STORE_MAX_KEY ((uint64_t)1 << 20)
/* Keys in one multi-key request, at most. */
#define TC__STORE_MAX_KEY_COUNT ((uint64_t)1 << 20)
/* Room beyond the value limit that one request may take (its key and
 * headers): a request is at most max_value + TC__STORE_REQ_SLACK bytes. */
#define TC__STORE_REQ_SLACK (TC__STORE_MAX_KEY + 1024)
/* Prefix of the keys through which our client asks our server why it closed
 * a connection: "torchcomms/refusal/<ip>:<port>" (torch's clients prefix
 * every key with "/", so they never see these). */
#define TC__STORE_REFUSAL_KEY "torchcomms/refusal/"

enum {
  TC__REQ_INCOMPLETE = 0, /* more bytes needed: at least `need` in all */
  TC__REQ_COMPLETE = 1,   /* one whole request of `len` bytes */
  TC__REQ_UNKNOWN = -1,   /* unknown command byte */
  TC__REQ_TOO_BIG = -2    /* a length or count over the limits (`why`) */
};

/* What tc__store_req_scan found. */
typedef struct tc__store_req {
  uint8_t type;    /* the command byte */
  size_t len;      /* COMPLETE: bytes of the request */
  size_t need;     /* INCOMPLETE: the request has at least this many bytes */
  uint64_t bad;    /* TOO_BIG: the offending length or count */
  uint64_t limit;  /* TOO_BIG: the limit it exceeds */
  const char *why; /* TOO_BIG: "value", "key", "key count" or "request" */
} tc__store_req_t;

/* Scans the request that starts at p[0] (avail > 0 bytes buffered) of
 * torch's TCPStore protocol without executing it: a pure function of its
 * arguments, so it can be fuzzed. A value may have at most max_value bytes,
 * a key TC__STORE_MAX_KEY, a key list TC__STORE_MAX_KEY_COUNT entries, the
 * whole request max_value + TC__STORE_REQ_SLACK bytes; a length over a
 * limit is refused as soon as its 8 bytes arrive, before any more is read.
 * Returns a TC__REQ_* code and fills *r. */
TC_INTERNAL int tc__store_req_scan(const uint8_t *p, size_t avail,
                                   uint64_t max_value, tc__store_req_t *r);
/* Name of a request type ("SET"), or "unknown". */
TC_INTERNAL const char *tc__store_req_name(uint8_t type);

/* ---- the store object ---- */

/* tc__store_ext_t (the optional functions of the built-in stores, beyond
 * the public vtable) and tc__store_create_ext are declared in
 * private_api.h: the Python extension builds its stores with them. */

/* Takes a reference on a live store, or fails naming the function
 * (TC_ERR_INVALID_USAGE for a released or foreign pointer); drops one, the
 * last one destroying the store (store.c). */
TC_INTERNAL int tc__store_acquire(tc_store_t *s, const char *fn);
TC_INTERNAL void tc__store_drop(tc_store_t *s, const char *fn);

/* Returns TC_ERR_INVALID_ARGUMENT naming fn when cond is false. */
#define TC__ARG(cond, fn, what)                                                \
  do {                                                                         \
    if (!(cond))                                                               \
      return tc__set_error(TC_ERR_INVALID_ARGUMENT,                            \
                           "torchcomms: %s: %s", fn, what);                    \
  } while (0)

/* Sets the error text of a wait for keys that timed out and returns
 * TC_ERR_TIMEOUT: "torchcomms: store <op>('k1', 'k2') timed out after T s;
 * still missing: 'k2' (is rank 2 running<suffix>)". With `check` (may be
 * NULL) the missing keys are found by asking the store; `suffix` (may be
 * NULL: "?") ends the hint, e.g. " and using the same MASTER_ADDR...?". */
TC_INTERNAL int tc__store_wait_timeout_error(
    const char *op, int (*check)(void *, const char *const *, size_t, int *),
    void *ctx, const char *const *keys, size_t nkeys, double timeout_s,
    const char *suffix);

/* Writes into buf a hint naming the rank that probably publishes `key`
 * ("rank 3" when the key ends in "/3"), or "the process that sets it". */
TC_INTERNAL void tc__store_key_owner(const char *key, char *buf, size_t len);

/* A deadline `timeout_s` from now (timeouts above ~30 years are clamped). */
static inline double tc__deadline(double timeout_s) {
  if (!(timeout_s < 1e9)) timeout_s = 1e9;
  return tc__now() + timeout_s;
}

/* ---- byte-keyed hash map (not thread-safe) ---- */

typedef struct tc__kv_entry {
  struct tc__kv_entry *next;
  uint64_t hash;
  uint8_t *val; /* malloc()ed, may be NULL when vlen == 0 */
  size_t vlen;
  size_t klen;
  char key[]; /* klen bytes + NUL */
} tc__kv_entry_t;

typedef struct tc__kv {
  tc__kv_entry_t **buckets;
  size_t nbuckets;
  size_t count;
} tc__kv_t;

/* Finds key, or NULL. */
TC_INTERNAL tc__kv_entry_t *tc__kv_find(const tc__kv_t *kv, const void *key,
                                        size_t klen);
/* Sets key to a copy of val. Returns the entry, NULL when out of memory. */
TC_INTERNAL tc__kv_entry_t *tc__kv_set(tc__kv_t *kv, const void *key,
                                       size_t klen, const void *val,
                                       size_t vlen);
/* Appends data to key's value (creating it). NULL when out of memory. */
TC_INTERNAL tc__kv_entry_t *tc__kv_append(tc__kv_t *kv, const void *key,
                                          size_t klen, const void *data,
                                          size_t len);
/* torch's add: the value (decimal text, created as 0) plus delta, stored
 * as decimal text. Returns TC_OK, TC_ERR_STORE when the existing value is
 * not an integer, TC_ERR_NOMEM. */
TC_INTERNAL int tc__kv_add(tc__kv_t *kv, const void *key, size_t klen,
                           int64_t delta, int64_t *result);
/* Removes key; returns 1 if it existed. */
TC_INTERNAL int tc__kv_delete(tc__kv_t *kv, const void *key, size_t klen);
/* Frees every entry and the table. */
TC_INTERNAL void tc__kv_free(tc__kv_t *kv);

/* ---- growable byte buffer ---- */

typedef struct tc__buf {
  uint8_t *p;
  size_t len;
  size_t cap;
  int oom; /* set when a put failed; the contents are then incomplete */
} tc__buf_t;

/* Makes room for n more bytes; 0 on success, -1 (and oom set) on failure. */
static inline int tc__buf_reserve(tc__buf_t *b, size_t n) {
  if (b->oom) return -1;
  if (b->len + n <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 64;
  while (cap < b->len + n) cap *= 2;
  uint8_t *p = realloc(b->p, cap);
  if (!p) {
    b->oom = 1;
    return -1;
  }
  b->p = p;
  b->cap = cap;
  return 0;
}

/* Appends n raw bytes. */
static inline void tc__buf_put(tc__buf_t *b, const void *data, size_t n) {
  if (n == 0 || tc__buf_reserve(b, n)) return;
  memcpy(b->p + b->len, data, n);
  b->len += n;
}

static inline void tc__buf_u8(tc__buf_t *b, uint8_t v) { tc__buf_put(b, &v, 1); }

/* Appends a little-endian uint32. */
static inline void tc__buf_u32(tc__buf_t *b, uint32_t v) {
  uint8_t x[4];
  for (int i = 0; i < 4; i++) x[i] = (uint8_t)(v >> (8 * i));
  tc__buf_put(b, x, 4);
}

/* Appends a little-endian uint64. */
static inline void tc__buf_u64(tc__buf_t *b, uint64_t v) {
  uint8_t x[8];
  for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> (8 * i));
  tc__buf_put(b, x, 8);
}

/* Appends a torch string/vector: uint64 length, then the bytes. */
static inline void tc__buf_str(tc__buf_t *b, const void *data, size_t n) {
  tc__buf_u64(b, (uint64_t)n);
  tc__buf_put(b, data, n);
}

/* Appends "/" + key (torch's TCPStore client key prefix) as a string. */
static inline void tc__buf_key(tc__buf_t *b, const char *key) {
  size_t n = strlen(key);
  tc__buf_u64(b, (uint64_t)(n + 1));
  tc__buf_put(b, TC__TCP_KEY_PREFIX, 1);
  tc__buf_put(b, key, n);
}

static inline void tc__buf_free(tc__buf_t *b) {
  free(b->p);
  b->p = NULL;
  b->len = b->cap = 0;
  b->oom = 0;
}

/* Reads a little-endian uint32 / uint64 from p. */
static inline uint32_t tc__rd_u32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}
static inline uint64_t tc__rd_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

#endif /* TC_STORE_INTERNAL_H */

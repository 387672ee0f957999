/* store_proto.c -- scanning one request of torch's TCPStore wire protocol
 * (store_internal.h) before the server executes it: is it complete, how
 * long is it, is any length or count over the server's limits. A pure
 * function of the bytes, shared by the server and the fuzz target
 * tests/fuzz/fuzz_store_proto.c. */
#include "bootstrap/store_internal.h"

/* Argument layout of each request: '4' uint32, '8' uint64, 'k' key string,
 * 'v' value string, 'N' a uint64 count of repeats of the rest. */
static const char *const spec[TC__Q_COUNT] = {
    [TC__Q_VALIDATE] = "4",      [TC__Q_SET] = "kv",
    [TC__Q_COMPARE_SET] = "kvv", [TC__Q_GET] = "k",
    [TC__Q_ADD] = "k8",          [TC__Q_CHECK] = "Nk",
    [TC__Q_WAIT] = "Nk",         [TC__Q_GETNUMKEYS] = "",
    [TC__Q_DELETE_KEY] = "k",    [TC__Q_APPEND] = "kv",
    [TC__Q_MULTI_GET] = "Nk",    [TC__Q_MULTI_SET] = "Nkv",
    [TC__Q_CANCEL_WAIT] = "",    [TC__Q_PING] = "4",
    [TC__Q_QUEUE_PUSH] = "kv",   [TC__Q_QUEUE_POP] = "k",
    [TC__Q_QUEUE_LEN] = "k",     [TC__Q_LIST_KEYS] = "",
    [TC__Q_BARRIER] = "k8",
};

static const char *const names[TC__Q_COUNT] = {
    [TC__Q_VALIDATE] = "VALIDATE",       [TC__Q_SET] = "SET",
    [TC__Q_COMPARE_SET] = "COMPARE_SET", [TC__Q_GET] = "GET",
    [TC__Q_ADD] = "ADD",                 [TC__Q_CHECK] = "CHECK",
    [TC__Q_WAIT] = "WAIT",               [TC__Q_GETNUMKEYS] = "GETNUMKEYS",
    [TC__Q_DELETE_KEY] = "DELETE_KEY",   [TC__Q_APPEND] = "APPEND",
    [TC__Q_MULTI_GET] = "MULTI_GET",     [TC__Q_MULTI_SET] = "MULTI_SET",
    [TC__Q_CANCEL_WAIT] = "CANCEL_WAIT", [TC__Q_PING] = "PING",
    [TC__Q_QUEUE_PUSH] = "QUEUE_PUSH",   [TC__Q_QUEUE_POP] = "QUEUE_POP",
    [TC__Q_QUEUE_LEN] = "QUEUE_LEN",     [TC__Q_LIST_KEYS] = "LIST_KEYS",
    [TC__Q_BARRIER] = "BARRIER",
};

const char *tc__store_req_name(uint8_t type) {
  return type < TC__Q_COUNT ? names[type] : "unknown";
}

/* Refuses: fills the TOO_BIG fields. */
static int too_big(tc__store_req_t *r, const char *why, uint64_t bad,
                   uint64_t limit) {
  r->why = why;
  r->bad = bad;
  r->limit = limit;
  return TC__REQ_TOO_BIG;
}

/* Walks the fields of `sp` from *off: COMPLETE when all are buffered,
 * INCOMPLETE (r->need set) when more bytes are needed, TOO_BIG. */
static int walk(const char *sp, const uint8_t *p, size_t avail, size_t *off,
                uint64_t max_value, uint64_t max_req, tc__store_req_t *r) {
  for (const char *s = sp; *s; s++) {
    if (*s == '4' || *s == '8') {
      size_t n = *s == '4' ? 4 : 8;
      if (avail - *off < n) {
        r->need = *off + n;
        return TC__REQ_INCOMPLETE;
      }
      *off += n;
    } else if (*s == 'k' || *s == 'v') {
      if (avail - *off < 8) {
        r->need = *off + 8;
        return TC__REQ_INCOMPLETE;
      }
      uint64_t n = tc__rd_u64(p + *off);
      if (*s == 'k' && n > TC__STORE_MAX_KEY)
        return too_big(r, "key", n, TC__STORE_MAX_KEY);
      if (*s == 'v' && n > max_value) return too_big(r, "value", n, max_value);
      *off += 8;
      if (*off > max_req || n > max_req - *off)
        return too_big(r, "request", (uint64_t)*off + n, max_req);
      if (avail - *off < n) {
        r->need = *off + (size_t)n;
        return TC__REQ_INCOMPLETE;
      }
      *off += (size_t)n;
    } else { /* 'N': a count, then that many repeats of the rest */
      if (avail - *off < 8) {
        r->need = *off + 8;
        return TC__REQ_INCOMPLETE;
      }
      uint64_t n = tc__rd_u64(p + *off);
      if (n > TC__STORE_MAX_KEY_COUNT)
        return too_big(r, "key count", n, TC__STORE_MAX_KEY_COUNT);
      *off += 8;
      /* every repeat takes at least 8 bytes per field */
      uint64_t least = n * 8 * (uint64_t)strlen(s + 1);
      if (*off > max_req || least > max_req - *off)
        return too_big(r, "request", (uint64_t)*off + least, max_req);
      for (uint64_t i = 0; i < n; i++) {
        int w = walk(s + 1, p, avail, off, max_value, max_req, r);
        if (w != TC__REQ_COMPLETE) return w;
      }
      return TC__REQ_COMPLETE;
    }
    if (*off > max_req)
      return too_big(r, "request", (uint64_t)*off, max_req);
  }
  return TC__REQ_COMPLETE;
}

int tc__store_req_scan(const uint8_t *p, size_t avail, uint64_t max_value,
                       tc__store_req_t *r) {
  memset(r, 0, sizeof *r);
  if (avail == 0) {
    r->need = 1;
    return TC__REQ_INCOMPLETE;
  }
  r->type = p[0];
  if (p[0] >= TC__Q_COUNT) return TC__REQ_UNKNOWN;
  uint64_t max_req = max_value + TC__STORE_REQ_SLACK;
  if (max_req < max_value) max_req = UINT64_MAX; /* overflow */
  size_t off = 1;
  int w = walk(spec[p[0]], p, avail, &off, max_value, max_req, r);
  if (w == TC__REQ_COMPLETE) r->len = off;
  return w;
}

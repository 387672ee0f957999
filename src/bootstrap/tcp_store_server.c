/* tcp_store_server.c -- a TCPStore server speaking torch's wire protocol
 * (torch 2.13: VALIDATE .. BARRIER, see store_internal.h), so that torch's
 * TCPStore clients and ours share one store.
 *
 * One background thread runs a poll() loop over the listening socket, a
 * wake-up pipe and every client (non-blocking sockets). Requests are parsed
 * only once complete, answers are buffered and sent as the socket accepts
 * them, and a WAIT (or BARRIER, or a blocking queue pop) is answered later,
 * when its keys appear, so a waiting client never blocks the others. Like
 * torch's libuv server, a connection must begin with VALIDATE and the magic
 * number, or it is dropped (and logged); a GET of a missing key answers an
 * empty value; an ADD on a non-integer value drops the connection.
 */
#include "bootstrap/store_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

#define TC__SERVER_MAGIC 0x53525652u /* "SRVR" */
#define TC__MAX_KEY_LEN ((uint64_t)1 << 20)
#define TC__MAX_VALUE_LEN ((uint64_t)1 << 34)
#define TC__MAX_KEY_COUNT ((uint64_t)1 << 20)
#define TC__READ_BUDGET (4u << 20) /* bytes read per client per round */
#define TC__MAX_PENDING_OUT ((size_t)64 << 20) /* then stop reading it */

typedef struct tc__conn {
  int fd;
  int validated;   /* sent VALIDATE with the magic number */
  int dead;        /* to be closed at the end of this round */
  char peer[64];
  tc__buf_t in;    /* received bytes; in.p[in_off..in.len) not parsed yet */
  size_t in_off;
  tc__buf_t out;   /* answers; out.p[out_off..out.len) not sent yet */
  size_t out_off;
  char **wkeys;    /* keys a WAIT / BARRIER still waits for */
  size_t *wklen;
  size_t nwait;
} tc__conn_t;

struct tc_store_server {
  uint32_t magic;
  int lfd;
  int port;
  int wake[2];
  pthread_t thread;
  tc__conn_t **conns;
  size_t nconns, cap;
  struct pollfd *pfds;
  size_t npfds;
  tc__kv_t kv;
  tc__kv_t queues; /* value: items, each a uint64 length + bytes */
};

/* Argument layout of each request: '4' uint32, '8' uint64, 'k' key string,
 * 'v' value string, 'N' a uint64 count of repeats of the rest. */
static const char *const tc__spec[TC__Q_COUNT] = {
    [TC__Q_VALIDATE] = "4",    [TC__Q_SET] = "kv",
    [TC__Q_COMPARE_SET] = "kvv", [TC__Q_GET] = "k",
    [TC__Q_ADD] = "k8",        [TC__Q_CHECK] = "Nk",
    [TC__Q_WAIT] = "Nk",       [TC__Q_GETNUMKEYS] = "",
    [TC__Q_DELETE_KEY] = "k",  [TC__Q_APPEND] = "kv",
    [TC__Q_MULTI_GET] = "Nk",  [TC__Q_MULTI_SET] = "Nkv",
    [TC__Q_CANCEL_WAIT] = "",  [TC__Q_PING] = "4",
    [TC__Q_QUEUE_PUSH] = "kv", [TC__Q_QUEUE_POP] = "k",
    [TC__Q_QUEUE_LEN] = "k",   [TC__Q_LIST_KEYS] = "",
    [TC__Q_BARRIER] = "k8",
};

/* ---- parsing ---- */

/* Walks the fields `spec` over p[*off..avail): 1 when all are there, 0 when
 * more bytes are needed, -1 when a length or count is out of bounds. */
static int tc__walk(const char *spec, const uint8_t *p, size_t avail,
                    size_t *off) {
  for (const char *s = spec; *s; s++) {
    if (*s == '4' || *s == '8') {
      size_t n = *s == '4' ? 4 : 8;
      if (avail - *off < n) return 0;
      *off += n;
    } else if (*s == 'k' || *s == 'v') {
      if (avail - *off < 8) return 0;
      uint64_t n = tc__rd_u64(p + *off);
      if (n > (*s == 'k' ? TC__MAX_KEY_LEN : TC__MAX_VALUE_LEN)) return -1;
      *off += 8;
      if (avail - *off < n) return 0;
      *off += (size_t)n;
    } else { /* 'N' */
      if (avail - *off < 8) return 0;
      uint64_t n = tc__rd_u64(p + *off);
      if (n > TC__MAX_KEY_COUNT) return -1;
      *off += 8;
      for (uint64_t i = 0; i < n; i++) {
        int r = tc__walk(s + 1, p, avail, off);
        if (r <= 0) return r;
      }
      return 1;
    }
  }
  return 1;
}

/* A cursor over one complete request. */
typedef struct tc__rd {
  const uint8_t *p;
  size_t off;
} tc__rd_t;

static uint64_t tc__rd64(tc__rd_t *r) {
  uint64_t v = tc__rd_u64(r->p + r->off);
  r->off += 8;
  return v;
}

static const uint8_t *tc__rdstr(tc__rd_t *r, size_t *len) {
  *len = (size_t)tc__rd64(r);
  const uint8_t *s = r->p + r->off;
  r->off += *len;
  return s;
}

/* ---- connections ---- */

/* Marks c dead (closed at the end of the round), logging why. */
static void tc__conn_drop(tc__conn_t *c, int level, const char *why) {
  if (!c->dead) tc__log(level, "store server: closing connection from %s: %s",
                        c->peer, why);
  c->dead = 1;
}

/* Sends buffered answers until the socket would block. */
static void tc__conn_flush(tc__conn_t *c) {
  if (c->out.oom) {
    tc__conn_drop(c, 0, "out of memory for an answer");
    return;
  }
  while (!c->dead && c->out_off < c->out.len) {
    ssize_t n = send(c->fd, c->out.p + c->out_off, c->out.len - c->out_off,
                     MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c->out_off += (size_t)n;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (c->out_off > c->out.len / 2) { /* keep the buffer from creeping */
        memmove(c->out.p, c->out.p + c->out_off, c->out.len - c->out_off);
        c->out.len -= c->out_off;
        c->out_off = 0;
      }
      return;
    } else {
      tc__conn_drop(c, 3, "send failed (client gone)");
      return;
    }
  }
  c->out.len = c->out_off = 0;
}

/* Forgets what c waits for. */
static void tc__conn_clear_wait(tc__conn_t *c) {
  for (size_t i = 0; i < c->nwait; i++) free(c->wkeys[i]);
  free(c->wkeys);
  free(c->wklen);
  c->wkeys = NULL;
  c->wklen = NULL;
  c->nwait = 0;
}

/* Closes c and frees it. */
static void tc__conn_free(tc__conn_t *c) {
  if (c->fd >= 0) close(c->fd);
  tc__conn_clear_wait(c);
  tc__buf_free(&c->in);
  tc__buf_free(&c->out);
  free(c);
}

/* ---- store semantics ---- */

/* A key exists: set, or a non-empty queue (torch's checkKeys). */
static int tc__srv_present(tc_store_server_t *s, const void *k, size_t n) {
  if (tc__kv_find(&s->kv, k, n)) return 1;
  tc__kv_entry_t *q = tc__kv_find(&s->queues, k, n);
  return q && q->vlen > 0;
}

/* The key was written: removes it from the waiting lists and answers
 * STOP_WAITING to clients that have nothing left to wait for (only the
 * first such client when `one`, for a queue push). */
static void tc__srv_notify(tc_store_server_t *s, const void *k, size_t n,
                           int one) {
  for (size_t i = 0; i < s->nconns; i++) {
    tc__conn_t *c = s->conns[i];
    for (size_t j = 0; !c->dead && j < c->nwait; j++) {
      if (c->wklen[j] != n || memcmp(c->wkeys[j], k, n)) continue;
      free(c->wkeys[j]);
      c->wkeys[j] = c->wkeys[c->nwait - 1];
      c->wklen[j] = c->wklen[c->nwait - 1];
      if (--c->nwait == 0) {
        tc__conn_clear_wait(c);
        tc__buf_u8(&c->out, TC__WAIT_STOP_WAITING);
        tc__conn_flush(c);
        if (one) return;
      }
      break;
    }
  }
}

/* Starts waiting for the keys among keys[0..n) that are missing (all of
 * them when `all`); answers STOP_WAITING at once when none is. */
static void tc__srv_wait(tc_store_server_t *s, tc__conn_t *c, tc__rd_t *r,
                         uint64_t n, int all) {
  tc__conn_clear_wait(c);
  c->wkeys = calloc(n ? n : 1, sizeof *c->wkeys);
  c->wklen = calloc(n ? n : 1, sizeof *c->wklen);
  if (!c->wkeys || !c->wklen) {
    tc__conn_drop(c, 0, "out of memory for a wait");
    return;
  }
  for (uint64_t i = 0; i < n; i++) {
    size_t kl;
    const uint8_t *k = tc__rdstr(r, &kl);
    if (!all && tc__srv_present(s, k, kl)) continue;
    char *copy = malloc(kl ? kl : 1);
    if (!copy) {
      tc__conn_drop(c, 0, "out of memory for a wait");
      return;
    }
    memcpy(copy, k, kl);
    c->wkeys[c->nwait] = copy;
    c->wklen[c->nwait++] = kl;
  }
  if (c->nwait == 0) {
    tc__conn_clear_wait(c);
    tc__buf_u8(&c->out, TC__WAIT_STOP_WAITING);
  }
}

/* Number of items in a queue value. */
static int64_t tc__queue_len(const tc__kv_entry_t *q) {
  int64_t n = 0;
  for (size_t off = 0; q && off + 8 <= q->vlen; n++)
    off += 8 + (size_t)tc__rd_u64(q->val + off);
  return n;
}

/* Sets key, or drops c when out of memory; then wakes its waiters. */
static void tc__srv_set(tc_store_server_t *s, tc__conn_t *c, const void *k,
                        size_t kl, const void *v, size_t vl) {
  if (!tc__kv_set(&s->kv, k, kl, v, vl)) {
    tc__conn_drop(c, 0, "out of memory for a value");
    return;
  }
  tc__srv_notify(s, k, kl, 0);
}

/* Executes one complete request of c. */
static void tc__srv_exec(tc_store_server_t *s, tc__conn_t *c,
                         const uint8_t *req) {
  tc__rd_t r = {req, 1};
  tc__buf_t *o = &c->out;
  size_t kl, vl, el;
  const uint8_t *k, *v, *e;
  switch ((tc__tcp_query_t)req[0]) {
  case TC__Q_VALIDATE: {
    uint32_t m = tc__rd_u32(req + 1);
    if (m != TC__TCP_VALIDATION_MAGIC) {
      char why[96];
      snprintf(why, sizeof why, "wrong validation magic 0x%08x (not a "
               "TCPStore client?)", m);
      tc__conn_drop(c, 1, why);
    }
    c->validated = 1;
    break;
  }
  case TC__Q_PING:
    tc__buf_put(o, req + 1, 4);
    break;
  case TC__Q_SET:
    k = tc__rdstr(&r, &kl);
    v = tc__rdstr(&r, &vl);
    tc__srv_set(s, c, k, kl, v, vl);
    break;
  case TC__Q_COMPARE_SET: {
    k = tc__rdstr(&r, &kl);
    e = tc__rdstr(&r, &el);
    v = tc__rdstr(&r, &vl);
    tc__kv_entry_t *cur = tc__kv_find(&s->kv, k, kl);
    if (!cur && el != 0) {
      tc__buf_str(o, e, el); /* torch answers `expected` here */
      break;
    }
    if (!cur || (cur->vlen == el && (!el || !memcmp(cur->val, e, el))))
      tc__srv_set(s, c, k, kl, v, vl);
    cur = tc__kv_find(&s->kv, k, kl);
    if (cur) tc__buf_str(o, cur->val, cur->vlen);
    break;
  }
  case TC__Q_GET: {
    k = tc__rdstr(&r, &kl);
    tc__kv_entry_t *cur = tc__kv_find(&s->kv, k, kl);
    tc__buf_str(o, cur ? cur->val : NULL, cur ? cur->vlen : 0);
    break;
  }
  case TC__Q_ADD: {
    k = tc__rdstr(&r, &kl);
    int64_t delta = (int64_t)tc__rd64(&r), res = 0;
    int rc = tc__kv_add(&s->kv, k, kl, delta, &res);
    if (rc != TC_OK) {
      tc__conn_drop(c, 1, rc == TC_ERR_STORE ? "ADD on a key whose value is "
                    "not an integer" : "out of memory");
      break;
    }
    tc__buf_u64(o, (uint64_t)res);
    tc__srv_notify(s, k, kl, 0);
    break;
  }
  case TC__Q_CHECK: {
    uint64_t n = tc__rd64(&r);
    int ready = 1;
    for (uint64_t i = 0; i < n; i++) {
      k = tc__rdstr(&r, &kl);
      ready &= tc__srv_present(s, k, kl);
    }
    tc__buf_u8(o, ready ? TC__CHECK_READY : TC__CHECK_NOT_READY);
    break;
  }
  case TC__Q_WAIT: {
    uint64_t n = tc__rd64(&r);
    tc__srv_wait(s, c, &r, n, 0);
    break;
  }
  case TC__Q_GETNUMKEYS:
    tc__buf_u64(o, (uint64_t)s->kv.count);
    break;
  case TC__Q_DELETE_KEY:
    k = tc__rdstr(&r, &kl);
    tc__buf_u64(o, (uint64_t)tc__kv_delete(&s->kv, k, kl));
    break;
  case TC__Q_APPEND:
    k = tc__rdstr(&r, &kl);
    v = tc__rdstr(&r, &vl);
    if (!tc__kv_append(&s->kv, k, kl, v, vl))
      tc__conn_drop(c, 0, "out of memory for a value");
    else
      tc__srv_notify(s, k, kl, 0);
    break;
  case TC__Q_MULTI_GET: {
    uint64_t n = tc__rd64(&r);
    for (uint64_t i = 0; i < n; i++) {
      k = tc__rdstr(&r, &kl);
      tc__kv_entry_t *cur = tc__kv_find(&s->kv, k, kl);
      tc__buf_str(o, cur ? cur->val : NULL, cur ? cur->vlen : 0);
    }
    break;
  }
  case TC__Q_MULTI_SET: {
    uint64_t n = tc__rd64(&r);
    for (uint64_t i = 0; i < n && !c->dead; i++) {
      k = tc__rdstr(&r, &kl);
      v = tc__rdstr(&r, &vl);
      tc__srv_set(s, c, k, kl, v, vl);
    }
    break;
  }
  case TC__Q_CANCEL_WAIT:
    tc__conn_clear_wait(c);
    tc__buf_u8(o, TC__WAIT_CANCELED);
    break;
  case TC__Q_QUEUE_PUSH: {
    k = tc__rdstr(&r, &kl);
    v = tc__rdstr(&r, &vl);
    tc__buf_t item = {0};
    tc__buf_str(&item, v, vl);
    if (item.oom || !tc__kv_append(&s->queues, k, kl, item.p, item.len))
      tc__conn_drop(c, 0, "out of memory for a queue item");
    else
      tc__srv_notify(s, k, kl, 1);
    tc__buf_free(&item);
    break;
  }
  case TC__Q_QUEUE_POP: {
    k = tc__rdstr(&r, &kl);
    tc__kv_entry_t *q = tc__kv_find(&s->queues, k, kl);
    int64_t n = tc__queue_len(q);
    tc__buf_u64(o, (uint64_t)n);
    if (n > 0) {
      size_t il = (size_t)tc__rd_u64(q->val);
      tc__buf_str(o, q->val + 8, il);
      memmove(q->val, q->val + 8 + il, q->vlen - 8 - il);
      q->vlen -= 8 + il;
    }
    break;
  }
  case TC__Q_QUEUE_LEN:
    k = tc__rdstr(&r, &kl);
    tc__buf_u64(o, (uint64_t)tc__queue_len(tc__kv_find(&s->queues, k, kl)));
    break;
  case TC__Q_LIST_KEYS:
    tc__buf_u64(o, (uint64_t)s->kv.count);
    for (size_t i = 0; i < s->kv.nbuckets; i++)
      for (tc__kv_entry_t *x = s->kv.buckets[i]; x; x = x->next)
        tc__buf_str(o, x->key, x->klen);
    break;
  case TC__Q_BARRIER: {
    k = tc__rdstr(&r, &kl);
    int64_t world = (int64_t)tc__rd64(&r), count = 0;
    size_t key_off = r.off - kl - 8 - 8; /* re-read the key for the wait */
    /* the count is stored without waking waiters until it is complete */
    if (tc__kv_add(&s->kv, k, kl, 1, &count) != TC_OK) {
      tc__conn_drop(c, 1, "BARRIER on a key whose value is not an integer");
      break;
    }
    if (count >= world) {
      tc__srv_notify(s, k, kl, 0);
      tc__buf_u8(o, TC__WAIT_STOP_WAITING);
    } else {
      tc__rd_t kr = {req, key_off};
      tc__srv_wait(s, c, &kr, 1, 1);
    }
    break;
  }
  default:
    break;
  }
}

/* Parses and executes the complete requests buffered for c, then sends
 * the answers. Requests wait while more than TC__MAX_PENDING_OUT bytes of
 * answers are unsent (backpressure); they resume after a flush. */
static void tc__srv_process(tc_store_server_t *s, tc__conn_t *c) {
  int held;
  do {
    held = 0;
    while (!c->dead && c->in_off < c->in.len) {
      if (c->out.len - c->out_off > TC__MAX_PENDING_OUT) {
        held = 1;
        break;
      }
      const uint8_t *p = c->in.p + c->in_off;
      size_t avail = c->in.len - c->in_off, off = 1;
      char why[96];
      if (!c->validated && p[0] != TC__Q_VALIDATE) {
        snprintf(why, sizeof why, "first request is %u, not VALIDATE (not a "
                 "TCPStore client?)", p[0]);
        tc__conn_drop(c, 1, why);
        break;
      }
      if (p[0] >= TC__Q_COUNT) {
        snprintf(why, sizeof why, "unknown request type %u", p[0]);
        tc__conn_drop(c, 1, why);
        break;
      }
      int w = tc__walk(tc__spec[p[0]], p, avail, &off);
      if (w < 0) tc__conn_drop(c, 1, "request with an oversized length field");
      if (w <= 0) break;
      tc__srv_exec(s, c, p);
      c->in_off += off;
    }
    if (c->in_off == c->in.len) {
      c->in.len = c->in_off = 0;
    } else if (c->in_off > c->in.len / 2) {
      memmove(c->in.p, c->in.p + c->in_off, c->in.len - c->in_off);
      c->in.len -= c->in_off;
      c->in_off = 0;
    }
    tc__conn_flush(c);
    /* held back but the client drained enough already: go on now, since
     * no poll event may come for the held requests */
  } while (held && !c->dead &&
           c->out.len - c->out_off <= TC__MAX_PENDING_OUT);
}

/* Reads what c sent (up to a budget), then processes it. */
static void tc__srv_read(tc_store_server_t *s, tc__conn_t *c) {
  size_t got = 0;
  int eof = 0;
  while (got < TC__READ_BUDGET) {
    if (tc__buf_reserve(&c->in, 65536)) {
      tc__conn_drop(c, 0, "out of memory for a request");
      return;
    }
    ssize_t n = recv(c->fd, c->in.p + c->in.len, c->in.cap - c->in.len,
                     MSG_DONTWAIT);
    if (n > 0) {
      c->in.len += (size_t)n;
      got += (size_t)n;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      eof = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
      break;
    }
  }
  tc__srv_process(s, c);
  if (eof) tc__conn_drop(c, 3, "client closed the connection");
}

/* Accepts every pending connection. */
static void tc__srv_accept(tc_store_server_t *s) {
  for (;;) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int fd = accept4(s->lfd, (struct sockaddr *)&ss, &sl,
                     SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) {
        /* out of descriptors: back off rather than spin on the listener */
        tc__log(1, "store server: accept: %s (raise ulimit -n?)",
                strerror(errno));
        usleep(10000);
      } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
        tc__log(1, "store server: accept: %s", strerror(errno));
      }
      return;
    }
    tc__conn_t *c = calloc(1, sizeof *c);
    if (c && s->nconns == s->cap) {
      size_t cap = s->cap ? s->cap * 2 : 16;
      tc__conn_t **a = realloc(s->conns, cap * sizeof *a);
      if (a) {
        s->conns = a;
        s->cap = cap;
      }
    }
    if (!c || s->nconns == s->cap) {
      tc__log(0, "store server: out of memory accepting a connection");
      free(c);
      close(fd);
      return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->fd = fd;
    char host[INET6_ADDRSTRLEN] = "?", port[16] = "?";
    getnameinfo((struct sockaddr *)&ss, sl, host, sizeof host, port,
                sizeof port, NI_NUMERICHOST | NI_NUMERICSERV);
    snprintf(c->peer, sizeof c->peer, "%s:%s", host, port);
    s->conns[s->nconns++] = c;
    tc__log(3, "store server: connection from %s", c->peer);
  }
}

/* The server thread: the poll loop, until the wake pipe is written. */
static void *tc__srv_main(void *arg) {
  tc_store_server_t *s = arg;
  for (;;) {
    size_t n = 2 + s->nconns;
    if (n > s->npfds) {
      struct pollfd *p = realloc(s->pfds, n * 2 * sizeof *p);
      if (!p) {
        tc__log(0, "store server: out of memory; waiting");
        usleep(100000);
        continue;
      }
      s->pfds = p;
      s->npfds = n * 2;
    }
    s->pfds[0] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
    s->pfds[1] = (struct pollfd){.fd = s->lfd, .events = POLLIN};
    size_t npoll = s->nconns;
    for (size_t i = 0; i < npoll; i++) {
      tc__conn_t *c = s->conns[i];
      /* a client that does not read its answers is not read either */
      size_t pending = c->out.len - c->out_off;
      short ev = pending > TC__MAX_PENDING_OUT ? 0 : POLLIN;
      if (pending) ev |= POLLOUT;
      s->pfds[2 + i] = (struct pollfd){.fd = c->fd, .events = ev};
    }
    int r = poll(s->pfds, 2 + npoll, -1);
    if (r < 0) {
      if (errno == EINTR) continue;
      tc__log(0, "store server: poll: %s", strerror(errno));
      usleep(10000);
      continue;
    }
    if (s->pfds[0].revents) break;
    for (size_t i = 0; i < npoll; i++) {
      tc__conn_t *c = s->conns[i];
      short re = s->pfds[2 + i].revents;
      if (c->dead || !re) continue;
      if (re & POLLOUT) {
        tc__conn_flush(c);
        if (c->in_off < c->in.len) tc__srv_process(s, c); /* held back */
      }
      if (re & (POLLIN | POLLHUP | POLLERR)) tc__srv_read(s, c);
    }
    if (s->pfds[1].revents) tc__srv_accept(s);
    size_t j = 0; /* reap dead connections, keeping the order */
    for (size_t i = 0; i < s->nconns; i++) {
      if (s->conns[i]->dead) tc__conn_free(s->conns[i]);
      else s->conns[j++] = s->conns[i];
    }
    s->nconns = j;
  }
  return NULL;
}

/* ---- public API ---- */

/* Creates, binds and listens on the server socket; returns the fd or -1
 * with *err set. bind_host NULL/""/"0.0.0.0"/"::" means every interface
 * (dual-stack IPv6 when available, else IPv4). */
static int tc__srv_listen(const char *bind_host, int port, int *err,
                          int *gai) {
  int any = !bind_host || !*bind_host || !strcmp(bind_host, "0.0.0.0") ||
            !strcmp(bind_host, "::");
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
  struct addrinfo *res = NULL;
  char ps[16];
  snprintf(ps, sizeof ps, "%d", port);
  struct sockaddr_in6 any6 = {.sin6_family = AF_INET6,
                              .sin6_port = htons((uint16_t)port),
                              .sin6_addr = IN6ADDR_ANY_INIT};
  struct sockaddr_in any4 = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_ANY)};
  struct addrinfo a4 = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM,
                        .ai_addr = (struct sockaddr *)&any4,
                        .ai_addrlen = sizeof any4};
  struct addrinfo a6 = {.ai_family = AF_INET6, .ai_socktype = SOCK_STREAM,
                        .ai_addr = (struct sockaddr *)&any6,
                        .ai_addrlen = sizeof any6, .ai_next = &a4};
  struct addrinfo *list = &a6;
  if (!any) {
    *gai = getaddrinfo(bind_host, ps, &hints, &res);
    if (*gai) return -1;
    list = res;
  }
  int fd = -1;
  *err = EADDRNOTAVAIL;
  for (struct addrinfo *ai = list; ai; ai = ai->ai_next) {
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      *err = errno;
      continue;
    }
    int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ai->ai_family == AF_INET6)
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 4096) == 0)
      break;
    *err = errno;
    close(fd);
    fd = -1;
    if (*err == EADDRINUSE || *err == EACCES) break; /* no use trying IPv4 */
  }
  if (res) freeaddrinfo(res);
  return fd;
}

int tc_store_server_start(const char *bind_host, int port,
                          tc_store_server_t **out) {
  static const char fn[] = "tc_store_server_start";
  if (!out)
    return tc__set_error(TC_ERR_INVALID_ARGUMENT, "torchcomms: %s: out is "
                         "NULL", fn);
  *out = NULL;
  if (port < 0 || port > 65535)
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: %s: port %d out of range 0..65535", fn,
                         port);
  tc_store_server_t *s = calloc(1, sizeof *s);
  if (!s)
    return tc__set_error(TC_ERR_NOMEM, "torchcomms: %s: out of memory", fn);
  s->wake[0] = s->wake[1] = -1;
  const char *where = bind_host && *bind_host ? bind_host : "0.0.0.0";
  int err = 0, gai = 0, rc;
  s->lfd = tc__srv_listen(bind_host, port, &err, &gai);
  if (s->lfd < 0) {
    if (gai)
      rc = tc__set_error(TC_ERR_INVALID_ARGUMENT, "torchcomms: %s: cannot "
                         "resolve bind address '%s': %s", fn, where,
                         gai_strerror(gai));
    else
      rc = tc__set_error(TC_ERR_SYSTEM,
                         "torchcomms: %s: cannot listen on %s:%d: %s%s", fn,
                         where, port, strerror(err),
                         err == EADDRINUSE ? " (another store or program "
                         "uses this port: pick another MASTER_PORT, or 0)"
                                           : "");
    free(s);
    return rc;
  }
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  getsockname(s->lfd, (struct sockaddr *)&ss, &sl);
  s->port = ntohs(ss.ss_family == AF_INET6
                      ? ((struct sockaddr_in6 *)&ss)->sin6_port
                      : ((struct sockaddr_in *)&ss)->sin_port);
  if (pipe2(s->wake, O_NONBLOCK | O_CLOEXEC)) {
    rc = tc__set_error(TC_ERR_SYSTEM, "torchcomms: %s: pipe: %s", fn,
                       strerror(errno));
    close(s->lfd);
    free(s);
    return rc;
  }
  s->magic = TC__SERVER_MAGIC;
  int e = pthread_create(&s->thread, NULL, tc__srv_main, s);
  if (e) {
    close(s->lfd);
    close(s->wake[0]);
    close(s->wake[1]);
    free(s);
    return tc__set_error(TC_ERR_SYSTEM, "torchcomms: %s: pthread_create: %s",
                         fn, strerror(e));
  }
  tc__log(2, "store server listening on %s:%d", where, s->port);
  *out = s;
  return TC_OK;
}

int tc_store_server_port(const tc_store_server_t *server) {
  if (!server || server->magic != TC__SERVER_MAGIC) {
    tc__set_error(TC_ERR_INVALID_ARGUMENT,
                  "torchcomms: tc_store_server_port: server is %s",
                  server ? "not a running store server" : "NULL");
    return -1;
  }
  return server->port;
}

void tc_store_server_stop(tc_store_server_t *server) {
  if (!server) return;
  if (server->magic != TC__SERVER_MAGIC) {
    tc__log(1, "tc_store_server_stop: %p is not a running store server "
            "(stopped twice?); ignored", (void *)server);
    return;
  }
  server->magic = 0;
  ssize_t w;
  do {
    w = write(server->wake[1], "x", 1);
  } while (w < 0 && errno == EINTR);
  pthread_join(server->thread, NULL);
  for (size_t i = 0; i < server->nconns; i++) tc__conn_free(server->conns[i]);
  free(server->conns);
  free(server->pfds);
  close(server->lfd);
  close(server->wake[0]);
  close(server->wake[1]);
  tc__kv_free(&server->kv);
  tc__kv_free(&server->queues);
  free(server);
}

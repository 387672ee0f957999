/* tcp_store_server.c -- a TCPStore server speaking torch's wire protocol
 * (torch 2.13: VALIDATE .. BARRIER, see store_internal.h), so that torch's
 * TCPStore clients and ours share one store.
 *
 * One background thread runs a poll() loop over the listening socket, a
 * wake-up pipe and every client (non-blocking sockets). Requests are parsed
 * only once complete (tc__store_req_scan), executed by tcp_store_exec.c,
 * answers are buffered and sent as the socket accepts them, and a WAIT (or
 * BARRIER, or a blocking queue pop) is answered later, when its keys
 * appear, so a waiting client never blocks the others. Like torch's libuv
 * server, a connection must begin with VALIDATE and the magic number, or it
 * is dropped.
 *
 * Hostile or broken clients are bounded (limits from the environment, read
 * at start; README.md, "Environment"):
 *  - TORCHCOMMS_STORE_MAX_BYTES (default 1 GiB): everything the server
 *    holds -- stored data, buffered requests, unsent answers -- is accounted
 *    and never exceeds it (store_server.h says how);
 *  - TORCHCOMMS_STORE_MAX_VALUE_BYTES (default 256 MiB): a larger value (or
 *    request: the value limit plus 1 MiB for keys) is refused as soon as its
 *    length field arrives, before it is buffered;
 *  - TORCHCOMMS_STORE_MAX_UNSENT_BYTES (default 16 MiB): past this many
 *    unsent answer bytes a client's requests wait until it reads
 *    (backpressure), and a client that reads nothing at all is evicted when
 *    the memory is needed.
 * torch's protocol cannot carry an error, so a refused client is closed;
 * the reason is logged and kept, and our client asks for it on a fresh
 * connection (the key TC__STORE_REFUSAL_KEY + "<its ip:port>", invisible to
 * torch's clients) to report one clear sentence. Log lines are rate-limited
 * (TC__STORE_LOG_BURST per TC__STORE_LOG_WINDOW_S, then counted).
 */
#include "bootstrap/store_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

#define TC__SERVER_MAGIC 0x53525652u /* "SRVR" */
#define READ_BUDGET (4u << 20)  /* bytes read per client per round */
#define MIN_READ 4096u          /* free space a read wants at least */
#define KEEP_BUF (64u << 10)    /* idle buffers above this are freed */
#define HELD_POLL_MS 50         /* retry period of requests held for memory */

enum { HELD_NONE = 0, HELD_EXEC, HELD_READ };

/* ---- logging (rate-limited) and refusals ---- */

/* Logs one line, at most TC__STORE_LOG_BURST per window; the rest are
 * counted and reported by the next line of a later window (or at stop). */
static void srv_logv(tc_store_server_t *s, int level, const char *fmt,
                     va_list ap) {
  if (!tc__log_on(level, TC_LOG_STORE)) return;
  double now = tc__now();
  if (now - s->log_window >= TC__STORE_LOG_WINDOW_S) {
    if (s->log_suppressed)
      tc__logs(TC_LOG_WARN, TC_LOG_STORE, "store server: %lu more log lines suppressed "
               "in the last %.0f s (at most %d per %.0f s)", s->log_suppressed,
               now - s->log_window, TC__STORE_LOG_BURST,
               TC__STORE_LOG_WINDOW_S);
    s->log_window = now;
    s->log_lines = 0;
    s->log_suppressed = 0;
  }
  if (s->log_lines >= TC__STORE_LOG_BURST) {
    s->log_suppressed++;
    return;
  }
  s->log_lines++;
  char line[768];
  vsnprintf(line, sizeof line, fmt, ap);
  tc__logs(level, TC_LOG_STORE, "store server: %s", line);
}

static void srv_log(tc_store_server_t *s, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void srv_log(tc_store_server_t *s, int level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  srv_logv(s, level, fmt, ap);
  va_end(ap);
}

void tc__srv_drop(tc_store_server_t *s, tc__conn_t *c, int level,
                  const char *fmt, ...) {
  if (c->dead) return;
  c->dead = 1;
  char why[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  srv_log(s, level, "closing the connection from %s: %s", c->peer, why);
  if (level > 1) return;
  tc__store_refusal_t *r = &s->refusals[s->nrefusals++ % TC__STORE_NREFUSALS];
  snprintf(r->peer, sizeof r->peer, "%s", c->peer);
  snprintf(r->why, sizeof r->why, "%s", why);
}

const char *tc__srv_refusal(const tc_store_server_t *s, const void *peer,
                            size_t len) {
  /* newest first: a port reused by a later connection has the later one */
  for (unsigned i = 0; i < TC__STORE_NREFUSALS && i < s->nrefusals; i++) {
    const tc__store_refusal_t *r =
        &s->refusals[(s->nrefusals - 1 - i) % TC__STORE_NREFUSALS];
    if (strlen(r->peer) == len && !memcmp(r->peer, peer, len)) return r->why;
  }
  return NULL;
}

/* ---- memory accounting ---- */

void tc__srv_acct(tc_store_server_t *s, long long delta) {
  s->used = (size_t)((long long)s->used + delta);
  atomic_store_explicit(&s->used_pub, s->used, memory_order_relaxed);
  if (s->used > atomic_load_explicit(&s->peak_pub, memory_order_relaxed))
    atomic_store_explicit(&s->peak_pub, s->used, memory_order_relaxed);
}

static size_t unsent(const tc__conn_t *c) { return c->out.len - c->out_off; }

/* Accounted bytes c holds. */
static size_t conn_bytes(const tc__conn_t *c) {
  return TC__STORE_CONN_COST + c->in.cap + c->out.cap + c->wcost;
}

/* Frees a buffer of c, accounted. */
static void buf_release(tc_store_server_t *s, tc__buf_t *b) {
  tc__srv_acct(s, -(long long)b->cap);
  tc__buf_free(b);
}

/* Frees what c holds (it is dead); the socket is closed when reaped. */
static void conn_release(tc_store_server_t *s, tc__conn_t *c) {
  tc__srv_clear_wait(s, c);
  buf_release(s, &c->in);
  buf_release(s, &c->out);
  c->in_off = c->out_off = c->in_need = 0;
}

/* Closes c and frees it. */
static void conn_free(tc_store_server_t *s, tc__conn_t *c) {
  conn_release(s, c);
  if (c->fd >= 0) close(c->fd);
  tc__srv_acct(s, -(long long)TC__STORE_CONN_COST);
  free(c);
}

/* A connection that holds memory without progress: unsent answers and no
 * send for TC__STORE_STALL_S, or a partial request and nothing received
 * for as long. */
static int stalled(const tc__conn_t *c, double now) {
  if (c->dead) return 0;
  if (unsent(c) && now - c->out_since >= TC__STORE_STALL_S) return 1;
  return c->in.len > c->in_off && now - c->in_since >= TC__STORE_STALL_S &&
         c->held != HELD_EXEC;
}

int tc__srv_room(tc_store_server_t *s, size_t n, tc__conn_t *c) {
  uint64_t max = s->lim.max_bytes;
  if (s->used + n <= max && s->used + n >= s->used) return 1;
  if (n > max) return -1;
  double now = tc__now();
  for (;;) { /* evict stalled connections, the largest first */
    tc__conn_t *worst = NULL;
    for (size_t i = 0; i < s->nconns; i++) {
      tc__conn_t *x = s->conns[i];
      if (x != c && stalled(x, now) &&
          (!worst || conn_bytes(x) > conn_bytes(worst)))
        worst = x;
    }
    if (!worst) break;
    size_t held = unsent(worst), part = worst->in.len - worst->in_off;
    tc__srv_drop(s, worst, 1,
                 "evicted: it left %zu answer bytes unread and %zu request "
                 "bytes incomplete for %.1f s while the store needed memory "
                 "(%zu of %" PRIu64 " bytes in use; TORCHCOMMS_STORE_MAX_BYTES)",
                 held, part, now - worst->out_since, s->used, max);
    conn_release(s, worst);
    if (s->used + n <= max) return 1;
  }
  /* may others (or c itself) still free memory by reading or sending? */
  for (size_t i = 0; i < s->nconns; i++) {
    tc__conn_t *x = s->conns[i];
    if (!x->dead && (unsent(x) || (x != c && x->in.len > x->in_off &&
                                    x->held != HELD_EXEC)))
      return 0;
  }
  return -1;
}

size_t tc__srv_out_growth(const tc__conn_t *c, size_t n) {
  size_t want = c->out.len + n + (c->nwait ? 1 : 0);
  return want > c->out.cap ? want - c->out.cap : 0;
}

/* Grows b to cap bytes, accounted. 0, or -1 when out of memory. */
static int buf_grow(tc_store_server_t *s, tc__buf_t *b, size_t cap) {
  uint8_t *p = realloc(b->p, cap);
  if (!p) return -1;
  tc__srv_acct(s, (long long)cap - (long long)b->cap);
  b->p = p;
  b->cap = cap;
  return 0;
}

int tc__srv_reserve_out(tc_store_server_t *s, tc__conn_t *c, size_t n,
                        size_t keep) {
  size_t grow = tc__srv_out_growth(c, n);
  if (!grow) return 0;
  size_t exact = c->out.cap + grow, dbl = c->out.cap * 2;
  /* doubling saves copies; it is taken only when it fits as it is, with
   * `keep` bytes still free */
  uint64_t avail = s->used < s->lim.max_bytes ? s->lim.max_bytes - s->used : 0;
  size_t cap = dbl > exact && dbl - c->out.cap + (uint64_t)keep <= avail
                   ? dbl : exact;
  if (cap < 64 && 64 - c->out.cap + (uint64_t)keep <= avail) cap = 64;
  if (buf_grow(s, &c->out, cap) == 0) return 0;
  tc__srv_drop(s, c, 0, "out of memory for an answer");
  return -1;
}

/* ---- connections ---- */

/* Sends buffered answers until the socket would block (a connection
 * without a socket, fed by a fuzzer, drops them). */
static void conn_flush(tc_store_server_t *s, tc__conn_t *c) {
  if (c->out.oom) {
    tc__srv_drop(s, c, 0, "out of memory for an answer");
    return;
  }
  while (!c->dead && c->out_off < c->out.len) {
    ssize_t n = c->fd < 0 ? (ssize_t)(c->out.len - c->out_off)
                          : send(c->fd, c->out.p + c->out_off,
                                 c->out.len - c->out_off,
                                 MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c->out_off += (size_t)n;
      c->out_since = tc__now();
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
      tc__srv_drop(s, c, 3, "send failed (client gone)");
      return;
    }
  }
  c->out.len = c->out_off = 0;
  /* an idle big buffer goes back (a pending WAIT keeps its byte) */
  if (c->out.cap > KEEP_BUF && !c->nwait) buf_release(s, &c->out);
}

/* Executes the complete requests buffered for c, then sends the answers.
 * Requests wait while more than max_unsent answer bytes are unsent
 * (backpressure), or while the memory they need is not free (c->held). */
static void conn_process(tc_store_server_t *s, tc__conn_t *c) {
  int again;
  if (c->held == HELD_EXEC) c->held = HELD_NONE;
  do {
    again = 0;
    while (!c->dead && c->in_off < c->in.len && c->held != HELD_EXEC) {
      if (unsent(c) > s->lim.max_unsent) {
        again = 1;
        break;
      }
      const uint8_t *p = c->in.p + c->in_off;
      size_t avail = c->in.len - c->in_off;
      if (avail < c->in_need) break; /* the rest has not arrived */
      if (!c->validated && p[0] != TC__Q_VALIDATE) {
        tc__srv_drop(s, c, 1, "first request is %u, not VALIDATE (not a "
                     "TCPStore client?)", p[0]);
        break;
      }
      tc__store_req_t r;
      int w = tc__store_req_scan(p, avail, s->lim.max_value, &r);
      if (w == TC__REQ_UNKNOWN) {
        tc__srv_drop(s, c, 1, "unknown request type %u", p[0]);
      } else if (w == TC__REQ_TOO_BIG) {
        int keys = !strcmp(r.why, "key count");
        const char *var =
            !strcmp(r.why, "value") ? " (TORCHCOMMS_STORE_MAX_VALUE_BYTES)"
            : !strcmp(r.why, "request") ? " (TORCHCOMMS_STORE_MAX_VALUE_BYTES "
                                          "plus 1 MiB for keys)"
                                        : "";
        tc__srv_drop(s, c, 1, "a %s of %" PRIu64 " %s exceeds its limit of "
                     "%" PRIu64 "%s (%s request)", r.why, r.bad,
                     keys ? "keys" : "bytes", r.limit, var,
                     tc__store_req_name(r.type));
      } else if (w == TC__REQ_INCOMPLETE) {
        c->in_need = r.need;
      } else if (!tc__srv_exec(s, c, p, r.len)) {
        c->held = HELD_EXEC;
      } else {
        c->in_off += r.len;
        c->in_need = 0;
        s->nexec++;
        continue;
      }
      break;
    }
    if (c->dead) return;
    if (c->in_off == c->in.len) {
      c->in.len = c->in_off = 0;
      if (c->in.cap > KEEP_BUF) buf_release(s, &c->in);
    } else if (c->in_off > 0) { /* the pending request moves to the front */
      memmove(c->in.p, c->in.p + c->in_off, c->in.len - c->in_off);
      c->in.len -= c->in_off;
      c->in_off = 0;
    }
    conn_flush(s, c);
    /* held back but the client drained enough already: go on now, since
     * no poll event may come for the held requests */
  } while (again && !c->dead && unsent(c) <= s->lim.max_unsent);
}

/* Free space in c->in for the next read, growing the buffer (up to the end
 * of the pending request when its size is known) if the budget allows:
 * > 0, or 0 when it must wait for memory (c->held), or 0 with c dropped. */
static size_t conn_in_room(tc_store_server_t *s, tc__conn_t *c) {
  size_t free_now = c->in.cap - c->in.len;
  size_t end = c->in_off + c->in_need; /* where the pending request ends */
  size_t want = end > c->in.len ? end - c->in.len : 0;
  if (want < MIN_READ) want = MIN_READ;
  if (free_now >= MIN_READ || free_now >= want) return free_now;
  size_t cap = c->in.cap * 2;
  if (cap < c->in.len + MIN_READ) cap = c->in.len + MIN_READ;
  if (cap > c->in.len + want) cap = c->in.len + want;
  int room = tc__srv_room(s, cap - c->in.cap, c);
  if (room > 0 && buf_grow(s, &c->in, cap) == 0) return cap - c->in.len;
  if (room == 0) {
    c->held = HELD_READ;
  } else if (room < 0) {
    tc__srv_drop(s, c, 1, "a %s request of %zu bytes does not fit in the "
                 "server's memory budget (%zu of %" PRIu64 " bytes in use; "
                 "TORCHCOMMS_STORE_MAX_BYTES)",
                 tc__store_req_name(c->in.len > c->in_off ?
                                    c->in.p[c->in_off] : 0),
                 c->in_need, s->used, s->lim.max_bytes);
  } else {
    tc__srv_drop(s, c, 0, "out of memory for a request");
  }
  return 0;
}

/* Reads what c sent (up to a budget), then processes it. */
static void conn_read(tc_store_server_t *s, tc__conn_t *c) {
  size_t got = 0;
  int eof = 0;
  if (c->held == HELD_READ) c->held = HELD_NONE;
  while (got < READ_BUDGET && !c->dead && !c->held) {
    size_t room = conn_in_room(s, c);
    if (!room) break;
    ssize_t n = recv(c->fd, c->in.p + c->in.len, room, MSG_DONTWAIT);
    if (n > 0) {
      c->in.len += (size_t)n;
      got += (size_t)n;
      c->in_since = tc__now(); /* progress, for stalled() */
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      eof = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
      break;
    }
  }
  conn_process(s, c);
  if (eof) tc__srv_drop(s, c, 3, "client closed the connection");
}

/* Formats a peer address as "ip:port" (IPv4-mapped IPv6 as IPv4), as our
 * client names itself when it asks why it was refused. */
static void peer_name(const struct sockaddr_storage *ss, char *buf,
                      size_t len) {
  char ip[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (ss->ss_family == AF_INET) {
    const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
    inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
    port = ntohs(a->sin_port);
  } else if (ss->ss_family == AF_INET6) {
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
    if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr))
      inet_ntop(AF_INET, &a->sin6_addr.s6_addr[12], ip, sizeof ip);
    else
      inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
    port = ntohs(a->sin6_port);
  }
  snprintf(buf, len, "%s:%d", ip, port);
}

/* Adds a connection (fd -1: fed by a fuzzer); NULL when out of memory. */
static tc__conn_t *conn_add(tc_store_server_t *s, int fd) {
  if (s->nconns == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 16;
    tc__conn_t **a = realloc(s->conns, cap * sizeof *a);
    if (!a) return NULL;
    s->conns = a;
    s->cap = cap;
  }
  tc__conn_t *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->fd = fd;
  c->out_since = c->in_since = tc__now();
  s->conns[s->nconns++] = c;
  tc__srv_acct(s, TC__STORE_CONN_COST);
  return c;
}

/* Accepts every pending connection. */
static void srv_accept(tc_store_server_t *s) {
  for (;;) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int fd = accept4(s->lfd, (struct sockaddr *)&ss, &sl,
                     SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) {
        /* out of descriptors: back off rather than spin on the listener */
        srv_log(s, 1, "accept: %s (raise ulimit -n?)", strerror(errno));
        usleep(10000);
      } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
        srv_log(s, 1, "accept: %s", strerror(errno));
      }
      return;
    }
    char peer[64];
    peer_name(&ss, peer, sizeof peer);
    tc__conn_t *c = NULL;
    int room = tc__srv_room(s, TC__STORE_CONN_COST, NULL);
    if (room <= 0 || !(c = conn_add(s, fd))) {
      srv_log(s, room <= 0 ? 1 : 0, "refusing the connection from %s: %s",
              peer, room <= 0 ? "the memory budget is exhausted "
              "(TORCHCOMMS_STORE_MAX_BYTES)" : "out of memory");
      close(fd);
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    snprintf(c->peer, sizeof c->peer, "%s", peer);
    srv_log(s, 3, "connection from %s", c->peer);
  }
}

/* Closes and forgets the dead connections, keeping the order. */
static void srv_reap(tc_store_server_t *s) {
  size_t j = 0;
  for (size_t i = 0; i < s->nconns; i++) {
    if (s->conns[i]->dead) conn_free(s, s->conns[i]);
    else s->conns[j++] = s->conns[i];
  }
  s->nconns = j;
}

/* The server thread: the poll loop, until the wake pipe is written. */
static void *srv_main(void *arg) {
  tc_store_server_t *s = arg;
  for (;;) {
    size_t n = 2 + s->nconns;
    if (n > s->npfds) {
      struct pollfd *p = realloc(s->pfds, n * 2 * sizeof *p);
      if (!p) {
        srv_log(s, 0, "out of memory; waiting");
        usleep(100000);
        continue;
      }
      s->pfds = p;
      s->npfds = n * 2;
    }
    s->pfds[0] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
    s->pfds[1] = (struct pollfd){.fd = s->lfd, .events = POLLIN};
    size_t npoll = s->nconns;
    int held = 0;
    for (size_t i = 0; i < npoll; i++) {
      tc__conn_t *c = s->conns[i];
      /* a client that does not read its answers is not read either */
      short ev = unsent(c) > s->lim.max_unsent || c->held ? 0 : POLLIN;
      if (unsent(c)) ev |= POLLOUT;
      held |= c->held != HELD_NONE;
      s->pfds[2 + i] = (struct pollfd){.fd = c->fd, .events = ev};
    }
    int r = poll(s->pfds, 2 + npoll, held ? HELD_POLL_MS : -1);
    if (r < 0) {
      if (errno == EINTR) continue;
      srv_log(s, 0, "poll: %s", strerror(errno));
      usleep(10000);
      continue;
    }
    if (s->pfds[0].revents) break;
    for (size_t i = 0; i < npoll; i++) {
      tc__conn_t *c = s->conns[i];
      short re = s->pfds[2 + i].revents;
      if (c->dead) continue;
      if (re & POLLOUT) {
        conn_flush(s, c);
        if (c->in_off < c->in.len) conn_process(s, c); /* held back */
      }
      if (!c->dead && (re & (POLLIN | POLLHUP | POLLERR)))
        conn_read(s, c);
      else if (!c->dead && c->held == HELD_READ)
        conn_read(s, c);
      else if (!c->dead && c->held == HELD_EXEC)
        conn_process(s, c);
    }
    if (s->pfds[1].revents) srv_accept(s);
    srv_reap(s);
  }
  return NULL;
}

/* ---- limits ---- */

/* The limits, read from the environment now (a new snapshot of the
 * settings: a malformed value is logged and reads as its default). */
static tc__store_limits_t read_limits(void) {
  (void)tc__settings_reload(NULL, 0);
  tc__store_limits_t l = {.max_bytes = tc__setting_bytes(TC_SET_STORE_MAX_BYTES),
                          .max_value = tc__setting_bytes(TC_SET_STORE_MAX_VALUE_BYTES),
                          .max_unsent = tc__setting_bytes(TC_SET_STORE_MAX_UNSENT_BYTES)};
  return l;
}

void tc__store_server_memory(tc_store_server_t *s, size_t *used, size_t *peak,
                             size_t *budget) {
  *used = atomic_load(&s->used_pub);
  *peak = atomic_load(&s->peak_pub);
  *budget = (size_t)s->lim.max_bytes;
}

/* Accounted bytes recomputed from scratch (the fuzzer checks it). */
static size_t recount(const tc_store_server_t *s) {
  size_t n = 0;
  for (size_t i = 0; i < s->nconns; i++) n += conn_bytes(s->conns[i]);
  const tc__kv_t *kvs[2] = {&s->kv, &s->queues};
  for (int t = 0; t < 2; t++)
    for (size_t i = 0; i < kvs[t]->nbuckets; i++)
      for (tc__kv_entry_t *e = kvs[t]->buckets[i]; e; e = e->next)
        n += TC__STORE_ENTRY_COST(e->klen, e->vlen);
  return n;
}

size_t tc__store_server_fuzz(const uint8_t *data, size_t len) {
  tc_store_server_t *s = calloc(1, sizeof *s);
  if (!s) return 0;
  s->lim = (tc__store_limits_t){.max_bytes = 1u << 20, .max_value = 64u << 10,
                                .max_unsent = 16u << 10};
  s->log_window = tc__now();
  s->log_lines = TC__STORE_LOG_BURST; /* quiet */
  tc__conn_t *c[2] = {conn_add(s, -1), conn_add(s, -1)};
  for (int i = 0; i < 2; i++)
    if (c[i]) snprintf(c[i]->peer, sizeof c[i]->peer, "fuzz:%d", i);
  /* chunks: one byte (bit 7: which client, bits 0-6: length), then data */
  for (size_t off = 0; c[0] && c[1] && off < len;) {
    tc__conn_t *x = c[data[off] >> 7];
    size_t n = data[off++] & 0x7f;
    if (n > len - off) n = len - off;
    const uint8_t *p = data + off;
    off += n;
    for (int i = 0; i < 2; i++) { /* retry what waits for memory */
      if (c[i]->dead || !c[i]->held) continue;
      c[i]->held = HELD_NONE;
      conn_process(s, c[i]);
    }
    while (n > 0 && !x->dead && !x->held) {
      size_t room = conn_in_room(s, x);
      if (!room) break;
      size_t k = room < n ? room : n;
      memcpy(x->in.p + x->in.len, p, k);
      x->in.len += k;
      p += k;
      n -= k;
      conn_process(s, x);
    }
    if (recount(s) != s->used || s->used > s->lim.max_bytes) {
      fprintf(stderr, "store server fuzz: accounted %zu, recounted %zu, "
              "budget %" PRIu64 "\n", s->used, recount(s), s->lim.max_bytes);
      abort();
    }
  }
  size_t done = s->nexec;
  for (size_t i = 0; i < s->nconns; i++) conn_free(s, s->conns[i]);
  free(s->conns);
  tc__kv_free(&s->kv);
  tc__kv_free(&s->queues);
  free(s);
  return done;
}

/* ---- public API ---- */

/* Creates, binds and listens on the server socket; returns the fd or -1
 * with *err set. bind_host NULL/""/"0.0.0.0"/"::" means every interface
 * (dual-stack IPv6 when available, else IPv4). */
static int srv_listen(const char *bind_host, int port, int *err,
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
  s->lfd = srv_listen(bind_host, port, &err, &gai);
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
  s->lim = read_limits();
  s->log_window = tc__now();
  int e = pthread_create(&s->thread, NULL, srv_main, s);
  if (e) {
    close(s->lfd);
    close(s->wake[0]);
    close(s->wake[1]);
    free(s);
    return tc__set_error(TC_ERR_SYSTEM, "torchcomms: %s: pthread_create: %s",
                         fn, strerror(e));
  }
  tc__logs(TC_LOG_INFO, TC_LOG_STORE,
           "store server listening on %s:%d (limits: %" PRIu64 " bytes in "
           "all, %" PRIu64 " per value, %" PRIu64 " unsent per client)",
           where, s->port, s->lim.max_bytes, s->lim.max_value,
           s->lim.max_unsent);
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
    tc__logs(TC_LOG_WARN, TC_LOG_STORE,
             "tc_store_server_stop: %p is not a running store server "
             "(stopped twice?); ignored", (void *)server);
    return;
  }
  server->magic = 0;
  ssize_t w;
  do {
    w = write(server->wake[1], "x", 1);
  } while (w < 0 && errno == EINTR);
  pthread_join(server->thread, NULL);
  for (size_t i = 0; i < server->nconns; i++)
    conn_free(server, server->conns[i]);
  if (server->log_suppressed)
    tc__logs(TC_LOG_WARN, TC_LOG_STORE,
             "store server: %lu more log lines suppressed in the last %.0f "
             "s (at most %d per %.0f s)", server->log_suppressed,
             tc__now() - server->log_window, TC__STORE_LOG_BURST,
             TC__STORE_LOG_WINDOW_S);
  free(server->conns);
  free(server->pfds);
  close(server->lfd);
  close(server->wake[0]);
  close(server->wake[1]);
  tc__kv_free(&server->kv);
  tc__kv_free(&server->queues);
  free(server);
}

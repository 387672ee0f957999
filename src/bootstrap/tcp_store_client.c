/* tcp_store_client.c -- a client of torch's TCPStore wire protocol (works
 * against torch's own server, libuv or legacy, and against ours), wrapped
 * as a tc_store_t.
 *
 * One TCP connection per store; a mutex serialises requests (a get that
 * waits holds it, as in torch). A request from a thread that finds the
 * connection busy goes over a spare connection to the same server instead
 * (opened on first need, kept for later), so that a thread waiting for a key
 * never keeps another thread from setting it: several ranks of one
 * communicator may be threads of one process sharing this store (the
 * default store, default_store.c). Every read and write has a deadline
 * (poll), so nothing blocks forever. A get is torch's sequence: WAIT for
 * the key with the caller's timeout (the server answers when the key
 * appears, without blocking its other clients), then GET; on timeout the
 * client sends CANCEL_WAIT and drains the server's answer. Keys are sent
 * with torch's client prefix "/" so that C and Python see the same keys.
 * A connection that failed mid-request is out of sync and is not reused:
 * later requests fail at once with the original reason.
 *
 * torch's protocol has no error answers: a server refusing a request (our
 * server's limits, see tcp_store_server.c) can only close the connection.
 * When the server closes ours, we ask it why on a fresh connection (a GET
 * of TC__STORE_REFUSAL_KEY + our "ip:port"; torch's server answers empty)
 * and report its reason. A SET is followed by a PING whose echo confirms
 * it, so a refused SET fails in tc_store_set itself.
 */
#include "bootstrap/store_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Replies are never larger than this (a sanity bound on a length field). */
#define TC__TCP_MAX_REPLY ((uint64_t)1 << 40)

typedef struct tc__tcp_client {
  pthread_mutex_t mu;
  int fd;             /* -1 once the connection is lost */
  char lost[512];     /* why it was lost */
  char host[256];
  int port;
  double io_timeout;  /* for replies to requests that do not wait */
  char local[INET6_ADDRSTRLEN];
  int local_port;
  int no_explain;     /* a connection asking why: never asks itself */
  char hint[320];     /* " and using the same MASTER_ADDR:MASTER_PORT...?" */
  /* the store's own connection only: its idle spare connections */
  pthread_mutex_t spare_mu;
  struct tc__tcp_client *spare;
  struct tc__tcp_client *next; /* on the spare list */
} tc__tcp_client_t;

/* Milliseconds from now to deadline for poll(), at least 0. */
static int tcp_ms_left(double deadline) {
  double left = deadline - tc__now();
  if (left <= 0) return 0;
  double ms = ceil(left * 1000.0);
  return ms > INT_MAX ? INT_MAX : (int)ms;
}

/* Closes the connection, remembering why; sets the error text and returns
 * rc. */
static int tcp_lose(tc__tcp_client_t *c, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int tcp_lose(tc__tcp_client_t *c, int rc, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (c->fd >= 0) {
    close(c->fd);
    c->fd = -1;
    snprintf(c->lost, sizeof c->lost, "%s", msg);
  }
  return tc__set_error(rc, "torchcomms: %s", msg);
}

static int tcp_closed(tc__tcp_client_t *c, int err, const char *op,
                          const char *key);

/* Sends len bytes before deadline. */
static int tcp_send(tc__tcp_client_t *c, const void *buf, size_t len,
                        double deadline, const char *op, const char *key) {
  const uint8_t *p = buf;
  while (len > 0) {
    ssize_t n = send(c->fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET))
      return tcp_closed(c, errno, op, key);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
      return tcp_lose(c, TC_ERR_REMOTE,
                          "store %s('%s'): sending to the store at %s:%d "
                          "failed: %s (did the process hosting the store "
                          "exit?)",
                          op, key, c->host, c->port, strerror(errno));
    struct pollfd pfd = {.fd = c->fd, .events = POLLOUT};
    int r = poll(&pfd, 1, tcp_ms_left(deadline));
    if (r < 0 && errno != EINTR)
      return tcp_lose(c, TC_ERR_SYSTEM, "store %s('%s'): poll: %s", op,
                          key, strerror(errno));
    if (r == 0 && tc__now() >= deadline)
      return tcp_lose(c, TC_ERR_TIMEOUT,
                          "store %s('%s'): the store at %s:%d accepted no "
                          "data for %.1f s (is it hung or overloaded?)",
                          op, key, c->host, c->port, c->io_timeout);
  }
  return TC_OK;
}

/* Receives exactly len bytes before deadline. */
static int tcp_recv(tc__tcp_client_t *c, void *buf, size_t len,
                        double deadline, const char *op, const char *key) {
  uint8_t *p = buf;
  while (len > 0) {
    ssize_t n = recv(c->fd, p, len, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (n == 0 || errno == ECONNRESET)
      return tcp_closed(c, n == 0 ? 0 : errno, op, key);
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      return tcp_lose(c, TC_ERR_REMOTE,
                          "store %s('%s'): receiving from the store at %s:%d "
                          "failed: %s (did the process hosting the store "
                          "exit?)",
                          op, key, c->host, c->port, strerror(errno));
    struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
    int r = poll(&pfd, 1, tcp_ms_left(deadline));
    if (r < 0 && errno != EINTR)
      return tcp_lose(c, TC_ERR_SYSTEM, "store %s('%s'): poll: %s", op,
                          key, strerror(errno));
    if (r == 0 && tc__now() >= deadline)
      return tcp_lose(c, TC_ERR_TIMEOUT,
                          "store %s('%s'): no reply from the store at %s:%d "
                          "within %.1f s (is it hung or overloaded?)",
                          op, key, c->host, c->port, c->io_timeout);
  }
  return TC_OK;
}

static int tcp_try(tc__tcp_client_t *c, const struct addrinfo *ai,
                       double deadline, char *why, size_t whylen);

/* Asks the server, on a new connection, why it closed ours: 1 with its
 * reason in why, 0 when it has none (torch's server, a server that exited,
 * or a client it sees under another address). */
static int tcp_refusal(tc__tcp_client_t *c, char *why, size_t len) {
  if (c->no_explain || !c->local[0] || c->local_port <= 0) return 0;
  tc__tcp_client_t *q = calloc(1, sizeof *q);
  if (!q) return 0;
  q->fd = -1;
  q->no_explain = 1;
  snprintf(q->host, sizeof q->host, "%s", c->host);
  q->port = c->port;
  q->io_timeout = 2.0;
  char portstr[16], err[256], saved[1024];
  snprintf(saved, sizeof saved, "%s", tc_last_error());
  snprintf(portstr, sizeof portstr, "%d", c->port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_NUMERICSERV}, *res = NULL;
  int found = 0;
  double deadline = tc__deadline(q->io_timeout);
  if (getaddrinfo(c->host, portstr, &hints, &res) == 0) {
    for (struct addrinfo *ai = res; ai && q->fd < 0; ai = ai->ai_next)
      if (tcp_try(q, ai, deadline, err, sizeof err) != TC_OK) q->fd = -1;
    freeaddrinfo(res);
  }
  if (q->fd >= 0) {
    char key[sizeof TC__STORE_REFUSAL_KEY + INET6_ADDRSTRLEN + 16];
    snprintf(key, sizeof key, "%s%s:%d", TC__STORE_REFUSAL_KEY, c->local,
             c->local_port);
    tc__buf_t b = {0};
    tc__buf_u8(&b, TC__Q_GET);
    tc__buf_str(&b, key, strlen(key));
    uint8_t x[8];
    if (!b.oom && tcp_send(q, b.p, b.len, deadline, "get", key) == TC_OK &&
        tcp_recv(q, x, 8, deadline, "get", key) == TC_OK) {
      uint64_t n = tc__rd_u64(x);
      if (n > 0 && n < len &&
          tcp_recv(q, why, (size_t)n, deadline, "get", key) == TC_OK) {
        why[n] = 0;
        found = 1;
      }
    }
    tc__buf_free(&b);
    if (q->fd >= 0) close(q->fd);
  }
  free(q);
  tc__set_error_text(TC_OK, saved);
  return found;
}

/* The server closed the connection (err: 0 for EOF, else errno): names
 * its reason when it gives one, else the likely causes. */
static int tcp_closed(tc__tcp_client_t *c, int err, const char *op,
                          const char *key) {
  if (c->fd >= 0) {
    close(c->fd);
    c->fd = -1;
  }
  char why[300];
  if (tcp_refusal(c, why, sizeof why)) {
    snprintf(c->lost, sizeof c->lost, "the store server refused a request: "
             "%s", why);
    return tc__set_error(TC_ERR_STORE,
                         "torchcomms: store %s('%s'): the store server at "
                         "%s:%d refused the request: %s; it closed the "
                         "connection (create a new store connection)",
                         op, key, c->host, c->port, why);
  }
  snprintf(c->lost, sizeof c->lost, "the store at %s:%d closed the "
           "connection%s%s", c->host, c->port, err ? ": " : "",
           err ? strerror(err) : "");
  return tc__set_error(TC_ERR_REMOTE,
                       "torchcomms: store %s('%s'): the store at %s:%d closed "
                       "the connection%s%s (did the process hosting the store "
                       "exit, or did it refuse the request? its log says "
                       "why)",
                       op, key, c->host, c->port, err ? ": " : "",
                       err ? strerror(err) : "");
}

/* Fails when the connection was lost earlier or the request could not be
 * built; otherwise sends it. */
static int tcp_request(tc__tcp_client_t *c, tc__buf_t *b, const char *op,
                           const char *key) {
  if (c->fd < 0)
    return tc__set_error(TC_ERR_REMOTE,
                         "torchcomms: store %s('%s'): the connection to the "
                         "store at %s:%d was lost earlier (%s); create a new "
                         "store connection",
                         op, key, c->host, c->port, c->lost);
  if (b->oom)
    return tc__set_error(TC_ERR_NOMEM, "torchcomms: store %s('%s'): out of "
                         "memory", op, key);
  return tcp_send(c, b->p, b->len, tc__deadline(c->io_timeout), op, key);
}

/* Receives a little-endian int64 reply. */
static int tcp_recv_i64(tc__tcp_client_t *c, int64_t *v, const char *op,
                            const char *key) {
  uint8_t x[8];
  TC_CHECK(tcp_recv(c, x, 8, tc__deadline(c->io_timeout), op, key));
  *v = (int64_t)tc__rd_u64(x);
  return TC_OK;
}

/* Receives one response byte before deadline. */
static int tcp_recv_u8(tc__tcp_client_t *c, uint8_t *v, double deadline,
                           const char *op, const char *key) {
  return tcp_recv(c, v, 1, deadline, op, key);
}

/* torch's doWait: WAIT for keys; *present = 1 when the server answered
 * STOP_WAITING before timeout_s, 0 after a cancelled wait. Holds c->mu. */
static int tcp_do_wait(tc__tcp_client_t *c, const char *const *keys,
                           size_t nkeys, double timeout_s, const char *op,
                           int *present) {
  *present = 0;
  tc__buf_t b = {0};
  tc__buf_u8(&b, TC__Q_WAIT);
  tc__buf_u64(&b, nkeys);
  for (size_t i = 0; i < nkeys; i++) tc__buf_key(&b, keys[i]);
  int rc = tcp_request(c, &b, op, keys[0]);
  tc__buf_free(&b);
  if (rc != TC_OK) return rc;
  double deadline = tc__deadline(timeout_s);
  for (;;) {
    struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
    int r = poll(&pfd, 1, tcp_ms_left(deadline));
    if (r > 0) break; /* an answer, EOF or an error: recv tells */
    if (r == 0 && tc__now() < deadline) continue; /* poll's ms cap */
    if (r == 0) {
      /* timed out: cancel; the server answers WAIT_CANCELED, preceded by
       * STOP_WAITING if the keys appeared meanwhile */
      uint8_t q = TC__Q_CANCEL_WAIT, a = 0;
      double io = tc__deadline(c->io_timeout);
      TC_CHECK(tcp_send(c, &q, 1, io, op, keys[0]));
      TC_CHECK(tcp_recv_u8(c, &a, io, op, keys[0]));
      if (a == TC__WAIT_CANCELED) return TC_OK;
      if (a == TC__WAIT_STOP_WAITING) {
        TC_CHECK(tcp_recv_u8(c, &a, io, op, keys[0]));
        if (a == TC__WAIT_CANCELED) {
          *present = 1;
          return TC_OK;
        }
      }
      return tcp_lose(c, TC_ERR_PROTOCOL,
                          "store %s('%s'): unexpected answer %u to "
                          "CANCEL_WAIT from %s:%d (not a TCPStore server?)",
                          op, keys[0], a, c->host, c->port);
    }
    if (errno != EINTR)
      return tcp_lose(c, TC_ERR_SYSTEM, "store %s('%s'): poll: %s", op,
                          keys[0], strerror(errno));
  }
  uint8_t a = 0;
  TC_CHECK(tcp_recv_u8(c, &a, tc__deadline(c->io_timeout), op, keys[0]));
  if (a != TC__WAIT_STOP_WAITING)
    return tcp_lose(c, TC_ERR_PROTOCOL,
                        "store %s('%s'): unexpected answer %u to WAIT from "
                        "%s:%d (not a TCPStore server?)",
                        op, keys[0], a, c->host, c->port);
  *present = 1;
  return TC_OK;
}

/* ---- the connection of a request ---- */

static int tcp_try(tc__tcp_client_t *c, const struct addrinfo *ai,
                   double deadline, char *why, size_t whylen);
static void tcp_note_local(tc__tcp_client_t *c);

/* A new connection to root's server, or NULL (no error text set). */
static tc__tcp_client_t *tcp_spare_open(tc__tcp_client_t *root) {
  tc__tcp_client_t *q = calloc(1, sizeof *q);
  if (!q) return NULL;
  pthread_mutex_init(&q->mu, NULL);
  q->fd = -1;
  snprintf(q->host, sizeof q->host, "%s", root->host);
  q->port = root->port;
  q->io_timeout = root->io_timeout;
  snprintf(q->hint, sizeof q->hint, "%s", root->hint);
  char portstr[16], why[256], saved[1024];
  snprintf(saved, sizeof saved, "%s", tc_last_error());
  snprintf(portstr, sizeof portstr, "%d", root->port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_NUMERICSERV}, *res = NULL;
  double deadline = tc__deadline(5.0);
  if (getaddrinfo(root->host, portstr, &hints, &res) == 0) {
    for (struct addrinfo *ai = res; ai && q->fd < 0; ai = ai->ai_next)
      if (tcp_try(q, ai, deadline, why, sizeof why) != TC_OK) q->fd = -1;
    freeaddrinfo(res);
  }
  tc__set_error_text(TC_OK, saved);
  if (q->fd < 0) {
    pthread_mutex_destroy(&q->mu);
    free(q);
    return NULL;
  }
  tcp_note_local(q);
  tc__store_count(TC__SREQ_CONNECT, 0);
  return q;
}

/* The connection for one request, locked: the store's own when it is free
 * (a lost one fails the request with its reason), else an idle spare, else
 * a new spare; when none can be opened, the store's own once it is free
 * (the requests then take turns, as in torch). A thread's requests follow
 * one another, so which connection carries each does not reorder them. */
static tc__tcp_client_t *tcp_acquire(tc__tcp_client_t *root) {
  if (pthread_mutex_trylock(&root->mu) == 0) return root;
  pthread_mutex_lock(&root->spare_mu);
  tc__tcp_client_t *q = root->spare;
  if (q) root->spare = q->next;
  pthread_mutex_unlock(&root->spare_mu);
  if (!q) q = tcp_spare_open(root);
  if (!q) {
    pthread_mutex_lock(&root->mu);
    return root;
  }
  pthread_mutex_lock(&q->mu);
  return q;
}

static void tcp_conn_free(tc__tcp_client_t *q) {
  if (q->fd >= 0) close(q->fd);
  pthread_mutex_destroy(&q->mu);
  free(q);
}

/* Ends the request on c (from tcp_acquire): a spare goes back to the idle
 * list, or is closed when it was lost. */
static void tcp_release(tc__tcp_client_t *root, tc__tcp_client_t *c) {
  pthread_mutex_unlock(&c->mu);
  if (c == root) return;
  if (c->fd < 0) {
    tcp_conn_free(c);
    return;
  }
  pthread_mutex_lock(&root->spare_mu);
  c->next = root->spare;
  root->spare = c;
  pthread_mutex_unlock(&root->spare_mu);
}

/* ---- vtable ---- */

/* vtable set: SET key value (no answer), then a PING whose echo confirms
 * that the server took it (a refused SET closes the connection instead). */
static int tcp_set(void *ctx, const char *key, const void *v, size_t n) {
  tc__tcp_client_t *root = ctx, *c;
  tc__buf_t b = {0};
  static _Atomic uint32_t seq;
  uint32_t nonce = atomic_fetch_add(&seq, 1) ^ 0x5E7C0000u;
  tc__buf_u8(&b, TC__Q_SET);
  tc__buf_key(&b, key);
  tc__buf_str(&b, v, n);
  tc__buf_u8(&b, TC__Q_PING);
  tc__buf_u32(&b, nonce);
  c = tcp_acquire(root);
  int rc = tcp_request(c, &b, "set", key);
  uint8_t echo[4];
  if (rc == TC_OK)
    rc = tcp_recv(c, echo, 4, tc__deadline(c->io_timeout), "set", key);
  if (rc == TC_OK && tc__rd_u32(echo) != nonce)
    rc = tcp_lose(c, TC_ERR_PROTOCOL,
                      "store set('%s'): the store at %s:%d answered the "
                      "confirming PING with 0x%08x instead of 0x%08x (not a "
                      "TCPStore server?)",
                      key, c->host, c->port, tc__rd_u32(echo), nonce);
  tcp_release(root, c);
  tc__buf_free(&b);
  return rc;
}

/* vtable get: WAIT for the key up to timeout_s, then GET it. */
static int tcp_get(void *ctx, const char *key, void **value, size_t *len,
                       double timeout_s) {
  tc__tcp_client_t *root = ctx, *c;
  int present = 0;
  c = tcp_acquire(root);
  int rc = tcp_do_wait(c, &key, 1, timeout_s, "get", &present);
  if (rc == TC_OK && present) {
    tc__buf_t b = {0};
    tc__buf_u8(&b, TC__Q_GET);
    tc__buf_key(&b, key);
    rc = tcp_request(c, &b, "get", key);
    tc__buf_free(&b);
    int64_t n = 0;
    if (rc == TC_OK) rc = tcp_recv_i64(c, &n, "get", key);
    if (rc == TC_OK && (uint64_t)n > TC__TCP_MAX_REPLY)
      rc = tcp_lose(c, TC_ERR_PROTOCOL,
                        "store get('%s'): the store at %s:%d announced a "
                        "value of %" PRIu64 " bytes (not a TCPStore?)",
                        key, c->host, c->port, (uint64_t)n);
    if (rc == TC_OK) {
      uint8_t *v = malloc((size_t)n + 1);
      if (!v) {
        /* the unread value leaves the stream out of sync: drop it */
        rc = tcp_lose(c, TC_ERR_NOMEM,
                          "store get('%s'): out of memory for %" PRId64
                          " bytes",
                          key, n);
      } else {
        rc = tcp_recv(c, v, (size_t)n, tc__deadline(c->io_timeout),
                          "get", key);
        if (rc == TC_OK) {
          v[n] = 0;
          *value = v;
          *len = (size_t)n;
        } else {
          free(v);
        }
      }
    }
  }
  tcp_release(root, c);
  if (rc == TC_OK && !present)
    rc = tc__store_wait_timeout_error("get", NULL, NULL, &key, 1, timeout_s,
                                      root->hint);
  return rc;
}

/* vtable add: ADD key delta, answered with the new value. */
static int tcp_add(void *ctx, const char *key, int64_t delta,
                       int64_t *result) {
  tc__tcp_client_t *root = ctx, *c;
  tc__buf_t b = {0};
  tc__buf_u8(&b, TC__Q_ADD);
  tc__buf_key(&b, key);
  tc__buf_u64(&b, (uint64_t)delta);
  c = tcp_acquire(root);
  int rc = tcp_request(c, &b, "add", key);
  if (rc == TC_OK) rc = tcp_recv_i64(c, result, "add", key);
  tcp_release(root, c);
  tc__buf_free(&b);
  return rc;
}

/* vtable check: CHECK keys, answered READY or NOT_READY. */
static int tcp_check(void *ctx, const char *const *keys, size_t nkeys,
                         int *ready) {
  tc__tcp_client_t *root = ctx, *c;
  tc__buf_t b = {0};
  tc__buf_u8(&b, TC__Q_CHECK);
  tc__buf_u64(&b, nkeys);
  for (size_t i = 0; i < nkeys; i++) tc__buf_key(&b, keys[i]);
  c = tcp_acquire(root);
  int rc = tcp_request(c, &b, "check", keys[0]);
  uint8_t a = 0;
  if (rc == TC_OK)
    rc = tcp_recv_u8(c, &a, tc__deadline(c->io_timeout), "check",
                         keys[0]);
  if (rc == TC_OK && a != TC__CHECK_READY && a != TC__CHECK_NOT_READY)
    rc = tcp_lose(c, TC_ERR_PROTOCOL,
                      "store check('%s'): unexpected answer %u from %s:%d",
                      keys[0], a, c->host, c->port);
  tcp_release(root, c);
  tc__buf_free(&b);
  if (rc == TC_OK) *ready = a == TC__CHECK_READY;
  return rc;
}

/* ext wait: WAIT for all keys up to timeout_s. */
static int tcp_wait(void *ctx, const char *const *keys, size_t nkeys,
                        double timeout_s) {
  tc__tcp_client_t *root = ctx, *c;
  int present = 0;
  c = tcp_acquire(root);
  int rc = tcp_do_wait(c, keys, nkeys, timeout_s, "wait", &present);
  tcp_release(root, c);
  if (rc == TC_OK && !present)
    rc = tc__store_wait_timeout_error("wait", tcp_check, root, keys, nkeys,
                                      timeout_s, root->hint);
  return rc;
}

/* vtable delete_key: DELETE_KEY, answered with the number deleted. */
static int tcp_delete(void *ctx, const char *key, int *deleted) {
  tc__tcp_client_t *root = ctx, *c;
  tc__buf_t b = {0};
  tc__buf_u8(&b, TC__Q_DELETE_KEY);
  tc__buf_key(&b, key);
  int64_t n = 0;
  c = tcp_acquire(root);
  int rc = tcp_request(c, &b, "delete", key);
  if (rc == TC_OK) rc = tcp_recv_i64(c, &n, "delete", key);
  tcp_release(root, c);
  tc__buf_free(&b);
  if (rc == TC_OK) *deleted = n == 1;
  return rc;
}

/* ext local_addr: our end of the connection, as text. */
static const char *tcp_local_addr(void *ctx) {
  tc__tcp_client_t *c = ctx;
  return c->local[0] ? c->local : NULL;
}

/* vtable destroy: closes the connection. */
static void tcp_destroy(void *ctx) {
  tc__tcp_client_t *c = ctx;
  while (c->spare) {
    tc__tcp_client_t *q = c->spare;
    c->spare = q->next;
    tcp_conn_free(q);
  }
  pthread_mutex_destroy(&c->spare_mu);
  tcp_conn_free(c);
}

/* ---- connect ---- */

/* Records the local address of fd as text (IPv4-mapped IPv6 as IPv4). */
static void tcp_note_local(tc__tcp_client_t *c) {
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  c->local[0] = '\0';
  c->local_port = 0;
  if (getsockname(c->fd, (struct sockaddr *)&ss, &sl)) return;
  if (ss.ss_family == AF_INET) {
    inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, c->local,
              sizeof c->local);
    c->local_port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    c->local_port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    struct in6_addr *a = &((struct sockaddr_in6 *)&ss)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(a))
      inet_ntop(AF_INET, &a->s6_addr[12], c->local, sizeof c->local);
    else
      inet_ntop(AF_INET6, a, c->local, sizeof c->local);
  }
}

/* One attempt on one address before deadline: connect, then torch's
 * handshake (VALIDATE + magic, then PING + nonce, echoed). TC_OK with c->fd
 * set; TC_ERR_PROTOCOL when the peer is not a TCPStore; another code (and
 * why) when worth retrying. */
static int tcp_try(tc__tcp_client_t *c, const struct addrinfo *ai,
                       double deadline, char *why, size_t whylen) {
  int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                  ai->ai_protocol);
  if (fd < 0) {
    snprintf(why, whylen, "socket: %s", strerror(errno));
    return TC_ERR_SYSTEM;
  }
  int err = 0;
  if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
    err = errno;
    if (err == EINPROGRESS) {
      struct pollfd pfd = {.fd = fd, .events = POLLOUT};
      int r;
      while ((r = poll(&pfd, 1, tcp_ms_left(deadline))) < 0 &&
             errno == EINTR) {
      }
      socklen_t sl = sizeof err;
      if (r == 0) err = ETIMEDOUT;
      else if (r < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &sl))
        err = errno;
    }
  }
  if (err) {
    snprintf(why, whylen, "connect: %s", strerror(err));
    close(fd);
    return TC_ERR_REMOTE;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  c->fd = fd;
  tc__buf_t b = {0};
  uint32_t nonce = (uint32_t)getpid();
  tc__buf_u8(&b, TC__Q_VALIDATE);
  tc__buf_u32(&b, TC__TCP_VALIDATION_MAGIC);
  tc__buf_u8(&b, TC__Q_PING);
  tc__buf_u32(&b, nonce);
  uint8_t echo[4] = {0};
  int rc = b.oom ? TC_ERR_NOMEM
                 : tcp_send(c, b.p, b.len, deadline, "connect", "");
  tc__buf_free(&b);
  if (rc == TC_OK) rc = tcp_recv(c, echo, 4, deadline, "connect", "");
  if (rc == TC_OK && tc__rd_u32(echo) != nonce) {
    snprintf(why, whylen,
             "the server answered the handshake with a wrong nonce (is "
             "%s:%d a TCPStore?)", c->host, c->port);
    rc = TC_ERR_PROTOCOL;
  } else if (rc != TC_OK) {
    snprintf(why, whylen, "handshake: %s", tc_last_error());
  }
  if (rc != TC_OK && c->fd >= 0) close(c->fd);
  if (rc != TC_OK) c->fd = -1;
  return rc;
}

int tc_store_tcp_connect(const char *host, int port, double timeout_s,
                         tc_store_t **out) {
  static const char fn[] = "tc_store_tcp_connect";
  if (!out)
    return tc__set_error(TC_ERR_INVALID_ARGUMENT, "torchcomms: %s: out is "
                         "NULL", fn);
  *out = NULL;
  if (!host || !*host)
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: %s: host is NULL or empty", fn);
  if (strlen(host) >= 256)
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: %s: host name too long", fn);
  if (port <= 0 || port > 65535)
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: %s: port %d out of range 1..65535", fn,
                         port);
  if (isnan(timeout_s) || timeout_s < 0)
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: %s: timeout_s must be >= 0 (got %g)", fn,
                         timeout_s);
  tc__tcp_client_t *c = calloc(1, sizeof *c);
  if (!c)
    return tc__set_error(TC_ERR_NOMEM, "torchcomms: %s: out of memory", fn);
  pthread_mutex_init(&c->mu, NULL);
  pthread_mutex_init(&c->spare_mu, NULL);
  c->fd = -1;
  snprintf(c->host, sizeof c->host, "%s", host);
  c->port = port;
  c->io_timeout = timeout_s > 30.0 ? timeout_s : 30.0;
  snprintf(c->hint, sizeof c->hint,
           " and using the same MASTER_ADDR:MASTER_PORT (%s:%d)?", host, port);

  double deadline = tc__deadline(timeout_s), nap = 0.01;
  char why[512] = "no attempt made";
  char portstr[16];
  snprintf(portstr, sizeof portstr, "%d", port);
  int rc = TC_ERR_TIMEOUT, tries = 0;
  for (;;) {
    /* every attempt gets at least 1 s, so timeout 0 means "try once" */
    double attempt = tries++ == 0 && deadline < tc__now() + 1.0
                         ? tc__now() + 1.0 : deadline;
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int g = getaddrinfo(host, portstr, &hints, &res);
    if (g == 0) {
      for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        rc = tcp_try(c, ai, attempt, why, sizeof why);
        if (rc == TC_OK || rc == TC_ERR_PROTOCOL) break;
      }
      freeaddrinfo(res);
    } else {
      snprintf(why, sizeof why, "cannot resolve '%s': %s", host,
               gai_strerror(g));
      if (g != EAI_AGAIN) {
        rc = TC_ERR_INVALID_ARGUMENT;
        break;
      }
    }
    if (rc == TC_OK || rc == TC_ERR_PROTOCOL) break;
    double left = deadline - tc__now();
    if (left <= 0) {
      rc = TC_ERR_TIMEOUT;
      break;
    }
    double t = nap < left ? nap : left;
    struct timespec ts = {(time_t)t, (long)((t - (double)(time_t)t) * 1e9)};
    nanosleep(&ts, NULL);
    nap = nap * 2 < 1.0 ? nap * 2 : 1.0;
  }
  if (rc != TC_OK) {
    tcp_destroy(c);
    if (rc == TC_ERR_TIMEOUT)
      return tc__set_error(rc,
                           "torchcomms: could not connect to the store at "
                           "%s:%d within %.1f s (%d attempts; last: %s). Is "
                           "the store server running (rank 0, or the "
                           "torchrun agent) and are MASTER_ADDR/MASTER_PORT "
                           "right?",
                           host, port, timeout_s, tries, why);
    return tc__set_error(rc, "torchcomms: could not connect to the store at "
                         "%s:%d: %s", host, port, why);
  }
  tcp_note_local(c);
  static const tc_store_vtable_t vt = {
      .size = sizeof(tc_store_vtable_t), .version = 1, .set = tcp_set,
      .get = tcp_get, .add = tcp_add, .check = tcp_check,
      .delete_key = tcp_delete, .destroy = tcp_destroy};
  static const tc__store_ext_t ext = {
      .wait = tcp_wait, .local_addr = tcp_local_addr, .kind = "tcp"};
  rc = tc__store_create_ext(&vt, &ext, c, out);
  if (rc != TC_OK) tcp_destroy(c);
  else tc__store_count(TC__SREQ_CONNECT, 0);
  return rc;
}

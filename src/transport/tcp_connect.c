/* tcp_connect.c -- the TCP transport's connections: the token, the
 * listening socket, the published addresses, and the connector that turns
 * them into authenticated sockets, at creation or on first use.
 *
 * Creation (tc__tcp_create): rank 0 puts a random token in the store; every
 * rank listens on an ephemeral port of the one address it publishes
 * ("cpu/addr/<rank>" = "<token hex>|addr:port"; TORCHCOMMS_CPU_IFNAME picks
 * the interface) and its CPU mask ("cpu/cpus/<rank>"); then the ranks
 * all-gather a hash of their host name and boot id through the mesh's
 * all-gather (mesh.c: log2(n) steps, each rank talking to the ranks at
 * distances 1, 2, 4, ... on either side), which tells every rank which ranks
 * share its machine. That is a constant number of store requests per rank
 * plus one address read per peer it connects to.
 *
 * Lazy connections (the default). A peer is connected the first time an
 * exchange has a transfer with it (tc__tcp_cx_want): its address is read
 * from the store once, a non-blocking connect starts, and the exchange's poll
 * loop drives it (tc__tcp_cx_fill / tc__tcp_cx_events) together with the
 * listening socket, which stays open for the communicator's life and is
 * served by every exchange (a rank busy with one peer still accepts the
 * others, so two ranks never wait on each other's accept). Both sides of a
 * transfer need the connection at about the same time; the higher rank
 * starts it (at once), the lower one waits for it. After creation, a lower
 * rank that waited TCP_CX_GRACE_S in vain starts one too (the peer may be
 * dead: a refused connect says so at once, where waiting would last until
 * the deadline; during creation a peer that has not published its address
 * has not started, and connects when it does). When two connections cross, the
 * higher rank's is kept: a rank drops an incoming connection from a lower
 * rank while its own to that rank is under way, and accepts one from a
 * higher rank, leaving its own to end (a connection is never closed before
 * it sent its hello, which the peer would count as a stranger's). Each side
 * decides alone and both arrive at the same socket. A refused connect means
 * the peer's listening socket is gone (it exited, or destroyed the
 * communicator): the exchange fails at once with that, as a lost peer's
 * hang-up does. A rank's address is read from the store only by the ranks
 * that connect to it: once, and without waiting when a lower rank looks
 * (its own exchanges are never held up by a store request for a peer that
 * has not started yet). TORCHCOMMS_CPU_EAGER=1 connects every pair at
 * creation (rank i connecting to every j < i), as the shared-memory
 * transport also does, whose liveness channel is a socket to every peer.
 *
 * Connections open with a hello {magic, version, rank, size, epoch, token}
 * in both directions before they count. Against strangers on the port
 * (scans, idle connections, other jobs): an incoming connection must send a
 * valid hello within TC__TCP_HELLO_TIMEOUT_S; at most the expected peers
 * plus TC__TCP_PENDING_EXTRA connections wait unauthenticated, the oldest
 * dropped first for a newer one; refusals are logged once per source, then
 * counted and reported once (tcp_listen.c). Addresses carry the token, so an
 * address left in the store by an earlier job with the same keys is never
 * used. */
#include "transport/mesh.h" /* tc__mesh_all_gather_as, tc__mesh_spin_policy */
#include "transport/tcp_internal.h"
#include "transport/tcp_listen.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct conn {
  int fd;
  int peer;  /* known for outgoing; from the hello for incoming */
  int state; /* CONN_* */
  int want;  /* outgoing: an exchange needs this peer (until connected) */
  double want_since; /* outgoing to a higher rank: when its grace began */
  double retry_at;
  double since; /* incoming: when accepted */
  size_t off;
  unsigned char out[TCP_HELLO], in[TCP_HELLO];
  char ip[64];
  int last_err; /* errno of the last failed connect attempt (outgoing) */
} conn_t;

enum { CONN_IDLE, CONN_CONNECTING, CONN_SENDING, CONN_RECEIVING, CONN_DONE };

/* How long a lower rank waits for a higher one to connect before it tries
 * too (see the top of the file). */
#define TCP_CX_GRACE_S 0.05

struct tcp_cx {
  tcp_t *t;
  const tc_backend_host_t *host;
  tc_store_t *store; /* the communicator's, retained */
  unsigned char token[16];
  char tokhex[33];
  int lazy;    /* connect on first use (else every pair at creation) */
  int all;     /* connecting every pair: only the higher rank of a pair
                * starts the connection (tc__tcp_connect_all) */
  int published; /* our address is in the store (lazy: deleted at close) */
  int created; /* creation complete: every rank published its address */
  double timeout_s;
  int lfd;
  conn_t *out;  /* [size]: outgoing connections */
  conn_t *pend; /* [maxpend]: incoming, not yet authenticated or answered */
  int npend, maxpend;
  int base_pend, base_out; /* pfd_peer encodings: TCP_PFD_CX - 1 - index */
  char **addrs; /* [size]: "addr:port", read from the store on first use */
  char pub[300]; /* our own "addr:port" */
  char whoami[200];
  tc__tcp_refusals_t refused;
};

static int msg_fail(char *msg, size_t len, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int msg_fail(char *msg, size_t len, int rc, const char *fmt, ...) {
  if (!msg || !len) return rc;
  /* the core adds the communicator, the rank and the size */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, len, fmt, ap);
  va_end(ap);
  return rc;
}

static void tune_socket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static void sockaddr_ip(const struct sockaddr_storage *ss, char *buf, size_t len) {
  buf[0] = 0;
  if (ss->ss_family == AF_INET) {
    inet_ntop(AF_INET, &((const struct sockaddr_in *)ss)->sin_addr, buf, (socklen_t)len);
  } else if (ss->ss_family == AF_INET6) {
    const struct in6_addr *a6 = &((const struct sockaddr_in6 *)ss)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(a6)) inet_ntop(AF_INET, &a6->s6_addr[12], buf, (socklen_t)len);
    else inet_ntop(AF_INET6, a6, buf, (socklen_t)len);
  }
}

/* ------------------------------------------------------------------------ */
/* The store                                                                 */
/* ------------------------------------------------------------------------ */

/* The store's own message for a failed request. */
static void store_why(int rc, char *why, size_t len) {
  snprintf(why, len, "%s", tc_last_error()[0] ? tc_last_error() : tc_strerror(rc));
}

/* Gets a store key, waiting until the deadline. */
static int store_get(tcp_cx_t *cx, const char *key, void **v, size_t *len, double deadline,
                     const char *what, char *msg, size_t msglen) {
  double left = deadline - tc__now();
  if (left < 0.001) left = 0.001;
  int rc = cx->host->store_get(cx->store, key, v, len, left);
  if (rc == TC_ERR_TIMEOUT)
    return msg_fail(msg, msglen, TC_ERR_TIMEOUT,
                    "timed out after %g s waiting for %s in the store (key '%s'); "
                    "check that all %d ranks were started with the same store and "
                    "communicator name",
                    cx->timeout_s, what, key, cx->t->size);
  if (rc != TC_OK) {
    char why[512];
    store_why(rc, why, sizeof why);
    return msg_fail(msg, msglen, rc, "could not read '%s' from the store (%s); check that "
                    "the store server is still running", key, why);
  }
  return TC_OK;
}

/* Reads peer p's address (once). wait: until the deadline; else 1 when it
 * is not there yet. An address with another token was left by an earlier
 * job with the same keys: it is read again until p replaced it. */
static int cx_addr(tcp_cx_t *cx, int p, int wait, double deadline, char *msg,
                   size_t msglen) {
  if (cx->addrs[p]) return TC_OK;
  char key[64], what[64];
  snprintf(key, sizeof key, "cpu/addr/%d", p);
  snprintf(what, sizeof what, "rank %d's address", p);
  if (cx->created || !wait) {
    /* every rank published before creation completed: a missing address
     * was deleted by a peer that left */
    const char *keys[1] = {key};
    int ready = 1;
    if (tc_store_check(cx->store, keys, 1, &ready) == TC_OK && !ready) {
      if (!cx->created) return 1;
      return msg_fail(msg, msglen, TC_ERR_REMOTE,
                      "peer %d left the communicator (destroyed it) before this rank "
                      "first needed a connection to it (it issued fewer operations than "
                      "this rank?)", p);
    }
  }
  for (;;) {
    void *v = NULL;
    size_t len = 0;
    int rc = store_get(cx, key, &v, &len, deadline, what, msg, msglen);
    if (rc != TC_OK) return rc;
    const char *s = v, *bar = len > 33 ? memchr(s, '|', len) : NULL;
    if (bar == s + 32 && !memcmp(s, cx->tokhex, 32)) {
      size_t al = len - 33;
      cx->addrs[p] = malloc(al + 1);
      if (!cx->addrs[p]) {
        cx->host->free(v);
        return msg_fail(msg, msglen, TC_ERR_NOMEM, "out of memory");
      }
      memcpy(cx->addrs[p], bar + 1, al);
      cx->addrs[p][al] = 0;
      cx->host->free(v);
      return TC_OK;
    }
    cx->host->free(v);
    if (tc__now() >= deadline)
      return msg_fail(msg, msglen, TC_ERR_TIMEOUT,
                      "timed out after %g s waiting for %s in the store: key '%s' holds "
                      "another job's address (a store shared with an earlier job of the "
                      "same id?); set TORCHCOMMS_JOB_ID to a new value",
                      cx->timeout_s, what, key);
    if (atomic_load(cx->t->aborted))
      return msg_fail(msg, msglen, TC_ERR_ABORTED, "aborted while reading %s", what);
    struct pollfd w = {.fd = cx->t->wake_fd, .events = POLLIN};
    (void)poll(&w, 1, 10); /* an earlier job's key: p replaces it soon */
  }
}

/* ------------------------------------------------------------------------ */
/* Connections                                                               */
/* ------------------------------------------------------------------------ */

/* Listens on an ephemeral port of the address it publishes (cx->pub is
 * set to "addr:port"). */
static int cx_listen(tcp_cx_t *cx, const tc_tp_args_t *a, char *err, size_t errlen) {
  char addr[256], why[400];
  int rc = tc__tcp_pick_addr(a->advertise_addr, addr, sizeof addr, why, sizeof why);
  if (rc != TC_OK) return msg_fail(err, errlen, rc, "%s", why);
  int port = 0, everywhere = 0;
  /* a backlog for bursts: connections wait there until accepted */
  rc = tc__tcp_listen_on(addr, cx->t->size + 1024, &cx->lfd, &port, &everywhere,
                         why, sizeof why);
  if (rc != TC_OK) return msg_fail(err, errlen, rc, "%s", why);
  if (everywhere)
    TC_BACKEND_LOGS(a->host, everywhere == 1 ? TC_LOG_WARN : TC_LOG_INFO, TC_LOG_TCP,
                    "%s: %s %s; listening on every "
                    "interface (TORCHCOMMS_CPU_IFNAME, or a numeric "
                    "TORCHCOMMS_SOCKET_ADDR of this host, binds one)", cx->whoami,
                    addr, everywhere == 1 ? "is no address of this host (a "
                    "NAT's?)" : "names several addresses");
  snprintf(cx->pub, sizeof cx->pub, strchr(addr, ':') ? "[%s]:%d" : "%s:%d", addr, port);
  return TC_OK;
}

/* Starts a non-blocking connect to peer j (its address is known). */
static void conn_start(tcp_cx_t *cx, int j) {
  conn_t *c = &cx->out[j];
  const char *addr = cx->addrs[j];
  char host[256];
  const char *colon = strrchr(addr, ':');
  size_t hl = colon ? (size_t)(colon - addr) : 0;
  if (hl >= sizeof host) hl = sizeof host - 1;
  memcpy(host, addr, hl);
  host[hl] = 0;
  if (host[0] == '[' && hl >= 2 && host[hl - 1] == ']') { /* [v6]:port */
    memmove(host, host + 1, hl - 2);
    host[hl - 2] = 0;
  }
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_NUMERICSERV}, *ai = NULL;
  c->state = CONN_IDLE;
  c->retry_at = tc__now() + 0.1;
  if (!colon || getaddrinfo(host, colon + 1, &hints, &ai) != 0 || !ai) {
    c->last_err = EADDRNOTAVAIL;
    return;
  }
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    c->last_err = errno;
    freeaddrinfo(ai);
    return;
  }
  int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
  freeaddrinfo(ai);
  if (r < 0 && errno != EINPROGRESS) {
    c->last_err = errno;
    close(fd);
    return;
  }
  c->fd = fd;
  c->peer = j;
  c->off = 0;
  tc__tcp_put_hello(c->out, cx->t->rank, cx->t->size, cx->t->epoch, cx->token);
  c->state = r == 0 ? CONN_SENDING : CONN_CONNECTING;
}

static void conn_reset(conn_t *c, int err) {
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
  c->state = CONN_IDLE;
  c->last_err = err;
  c->retry_at = tc__now() + 0.1;
}

/* Writes or reads the hello; returns 1 when that step completed, 0 when it
 * would block, -1 (errno set, 0 for EOF) on failure. */
static int conn_io(conn_t *c, int sending) {
  while (c->off < TCP_HELLO) {
    ssize_t n = sending ? send(c->fd, c->out + c->off, TCP_HELLO - c->off, MSG_NOSIGNAL)
                        : recv(c->fd, c->in + c->off, TCP_HELLO - c->off, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      return -1;
    }
    if (n == 0) {
      errno = 0;
      return -1;
    }
    c->off += (size_t)n;
  }
  c->off = 0;
  return 1;
}

/* A lower rank tries the higher one itself after the grace: lazily, once
 * creation is complete (every address is in the store then; before, a
 * missing one means the peer has not started, and it connects when it
 * does). */
static int cx_grace(const tcp_cx_t *cx) { return cx->lazy && !cx->all && cx->created; }

/* This rank may start the connection to p now: to a lower rank at once;
 * to a higher one only lazily, after the grace (see the top of the file). */
static int cx_may_start(const tcp_cx_t *cx, int p, double now) {
  return p < cx->t->rank || (cx_grace(cx) && now >= cx->out[p].want_since + TCP_CX_GRACE_S);
}

/* An outgoing connection to lower rank p is under way or due (not yet
 * connected): an incoming one from p is the crossing one, and is dropped. */
static int cx_outgoing(const tcp_cx_t *cx, int p) {
  const conn_t *c = &cx->out[p];
  return cx->t->fd[p] < 0 && (c->fd >= 0 || c->want);
}

/* Closes pending connection i (refused for `why` unless NULL). */
static void pend_drop(tcp_cx_t *cx, int i, const char *why) {
  if (why) tc__tcp_refused(&cx->refused, cx->host, cx->whoami, cx->pend[i].ip, why);
  if (cx->pend[i].fd >= 0) close(cx->pend[i].fd);
  cx->pend[i] = cx->pend[--cx->npend];
}

/* 1 if an accepted connection from peer p is still sending our hello. */
static int pend_answering(const tcp_cx_t *cx, int p) {
  for (int i = 0; i < cx->npend; i++)
    if (cx->pend[i].state == CONN_SENDING && cx->pend[i].peer == p) return 1;
  return 0;
}

/* Peer p is connected through fd. An outgoing connection of ours still
 * under way lost the crossing: it runs to its end (the peer drops it after
 * its hello) and is closed then. */
static void cx_connected(tcp_cx_t *cx, int p, int fd) {
  tune_socket(fd);
  cx->t->fd[p] = fd;
  cx->out[p].want = 0;
}

/* Progresses one incoming connection; may drop it (then returns 1). */
static int cx_incoming(tcp_cx_t *cx, int i, short re) {
  conn_t *c = &cx->pend[i];
  tcp_t *t = cx->t;
  if (c->state == CONN_RECEIVING) {
    int r = conn_io(c, 0);
    if (r == 0 && !(re & (POLLHUP | POLLERR))) return 0;
    if (r <= 0) {
      pend_drop(cx, i, "closed before its hello (a port scan?)");
      return 1;
    }
    const char *why = NULL;
    int peer = tc__tcp_parse_hello(c->in, TCP_HELLO, t->size, t->epoch, cx->token, &why);
    if (peer == t->rank) why = "a hello with this rank's own number";
    if (why) {
      pend_drop(cx, i, why);
      return 1;
    }
    /* a peer (it has the token) already connected, or crossing connections
     * (ours, the higher rank's, stays): closed without a word, the peer
     * takes the other one */
    if (t->fd[peer] >= 0 || pend_answering(cx, peer) ||
        (peer < t->rank && cx_outgoing(cx, peer))) {
      pend_drop(cx, i, NULL);
      return 1;
    }
    c->peer = peer;
    tc__tcp_put_hello(c->out, t->rank, t->size, t->epoch, cx->token);
    c->state = CONN_SENDING;
  }
  if (c->state == CONN_SENDING) {
    int r = conn_io(c, 1);
    if (r == 0) return 0;
    if (r < 0) {
      pend_drop(cx, i, NULL); /* a peer that went away: it retries */
      return 1;
    }
    cx_connected(cx, c->peer, c->fd);
    c->fd = -1;
    pend_drop(cx, i, NULL);
    return 1;
  }
  return 0;
}

/* Accepts every waiting connection; when the pending table is full the
 * oldest unauthenticated one makes room. A hello already there is read at
 * once. */
static void cx_accept(tcp_cx_t *cx) {
  for (;;) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int fd = accept4(cx->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return; /* EAGAIN, or a transient error: poll again */
    if (cx->npend == cx->maxpend) {
      int old = -1;
      for (int i = 0; i < cx->npend; i++)
        if (cx->pend[i].state == CONN_RECEIVING &&
            (old < 0 || cx->pend[i].since < cx->pend[old].since))
          old = i;
      if (old < 0) { /* all answering peers: this one waits for the next round */
        close(fd);
        return;
      }
      pend_drop(cx, old, "dropped for a newer connection (too many "
                "connections without a hello)");
    }
    conn_t *c = &cx->pend[cx->npend++];
    memset(c, 0, sizeof *c);
    c->fd = fd;
    c->peer = -1;
    c->state = CONN_RECEIVING;
    c->since = tc__now();
    sockaddr_ip(&ss, c->ip, sizeof c->ip);
    cx_incoming(cx, cx->npend - 1, POLLIN);
  }
}

/* Closes the pending connections that sent no hello in time. */
static void cx_expire(tcp_cx_t *cx, double now) {
  for (int i = cx->npend - 1; i >= 0; i--)
    if (cx->pend[i].state == CONN_RECEIVING &&
        now - cx->pend[i].since >= TC__TCP_HELLO_TIMEOUT_S)
      pend_drop(cx, i, "no hello within the deadline (an idle connection)");
}

/* Progresses the outgoing connection to peer j. */
static void cx_outgoing_io(tcp_cx_t *cx, int j, short re) {
  conn_t *c = &cx->out[j];
  tcp_t *t = cx->t;
  if (c->state == CONN_CONNECTING) {
    if (!(re & (POLLOUT | POLLERR | POLLHUP))) return;
    int err = tc__tcp_sock_error(c->fd);
    if (err) {
      conn_reset(c, err);
      return;
    }
    c->state = CONN_SENDING;
  }
  if (c->state == CONN_SENDING) {
    int r = conn_io(c, 1);
    if (r < 0) conn_reset(c, errno ? errno : ECONNRESET);
    if (r <= 0) return;
    c->state = CONN_RECEIVING;
  }
  if (c->state == CONN_RECEIVING) {
    int r = conn_io(c, 0);
    /* closed during the hello: the peer kept its own connection (crossing,
     * lazy), or a stale address; retry unless connected meanwhile */
    if (r < 0) conn_reset(c, errno ? errno : ECONNABORTED);
    if (r <= 0) return;
    const char *why = NULL;
    if (tc__tcp_parse_hello(c->in, TCP_HELLO, t->size, t->epoch, cx->token, &why) != j) {
      /* a stale address: someone else listens there; retry later */
      conn_reset(c, EACCES);
      return;
    }
    int fd = c->fd;
    c->fd = -1;
    c->state = CONN_DONE;
    if (t->fd[j] >= 0) close(fd); /* it lost the crossing: the peer's is kept */
    else cx_connected(cx, j, fd);
  }
}

/* A connect to p was refused while the communicator exists: p's listening
 * socket is gone. Lazy only: every rank listens from before it publishes
 * its address until it closes the communicator. */
static int cx_refused(const tcp_cx_t *cx, int p) {
  return cx->lazy && cx->out[p].want && cx->out[p].fd < 0 && cx->t->fd[p] < 0 &&
         cx->out[p].last_err == ECONNREFUSED;
}

static int cx_refused_fail(tcp_cx_t *cx, int p, char *msg, size_t msglen) {
  return msg_fail(msg, msglen, TC_ERR_REMOTE,
                  "peer %d refused this rank's connection to %s (its process exited, or "
                  "it destroyed the communicator)", p, cx->addrs[p] ? cx->addrs[p] : "?");
}

int tc__tcp_cx_want(tcp_t *t, int p, const tc_tp_op_t *op) {
  tcp_cx_t *cx = t->cx;
  if (t->fd[p] >= 0) return TC_OK;
  if (!cx)
    return msg_fail(op->msg, op->msglen, TC_ERR_INTERNAL,
                    "internal error: transfer to peer %d, which is not connected", p);
  conn_t *c = &cx->out[p];
  if (c->want) return TC_OK;
  c->want = 1;
  c->want_since = tc__now();
  c->last_err = 0;
  c->retry_at = 0;
  if (p < t->rank) { /* a lower rank published before its first exchange */
    int rc = cx_addr(cx, p, 1, op->deadline, op->msg, op->msglen);
    if (rc != TC_OK) {
      c->want = 0;
      return rc;
    }
    if (c->fd < 0) conn_start(cx, p);
  }
  return TC_OK;
}

int tc__tcp_cx_fill(tcp_t *t, int *np, int *ms, const tc_tp_op_t *op) {
  tcp_cx_t *cx = t->cx;
  if (!cx) return TC_OK;
  double now = tc__now(), next = now + 3600;
  cx_expire(cx, now);
  int k = *np;
  if (cx->lfd >= 0) {
    t->pfd[k] = (struct pollfd){.fd = cx->lfd, .events = POLLIN};
    t->pfd_peer[k++] = TCP_PFD_CX;
  }
  for (int i = 0; i < cx->npend; i++) {
    conn_t *c = &cx->pend[i];
    t->pfd[k] = (struct pollfd){.fd = c->fd,
                                .events = c->state == CONN_SENDING ? POLLOUT : POLLIN};
    t->pfd_peer[k++] = TCP_PFD_CX - 1 - (cx->base_pend + i);
    if (c->state == CONN_RECEIVING && c->since + TC__TCP_HELLO_TIMEOUT_S < next)
      next = c->since + TC__TCP_HELLO_TIMEOUT_S;
  }
  for (int j = 0; j < t->size; j++) {
    conn_t *c = &cx->out[j];
    if (c->fd < 0) { /* none under way: start one if it is due */
      if (!c->want || t->fd[j] >= 0) continue;
      if (cx_refused(cx, j)) return cx_refused_fail(cx, j, op->msg, op->msglen);
      if (!cx_may_start(cx, j, now)) {
        if (cx_grace(cx) && c->want_since + TCP_CX_GRACE_S < next)
          next = c->want_since + TCP_CX_GRACE_S;
        continue;
      }
      if (!cx->addrs[j]) { /* a higher rank: is it there? (never waits) */
        int rc = cx_addr(cx, j, 0, op->deadline, op->msg, op->msglen);
        if (rc < 0 || rc > TC_OK) {
          if (rc != 1) return rc;
          c->want_since = now; /* not yet: look again after another grace */
          if (now + TCP_CX_GRACE_S < next) next = now + TCP_CX_GRACE_S;
          continue;
        }
      }
      if (c->retry_at <= now) conn_start(cx, j);
      if (cx_refused(cx, j)) return cx_refused_fail(cx, j, op->msg, op->msglen);
      if (c->fd < 0) {
        if (c->retry_at < next) next = c->retry_at;
        continue;
      }
    }
    t->pfd[k] = (struct pollfd){.fd = c->fd,
                                .events = c->state == CONN_RECEIVING ? POLLIN : POLLOUT};
    t->pfd_peer[k++] = TCP_PFD_CX - 1 - (cx->base_out + j);
  }
  *np = k;
  int tms = (int)((next - now) * 1000.0) + 1;
  if (tms < *ms) *ms = tms < 0 ? 0 : tms;
  return TC_OK;
}

void tc__tcp_cx_events(tcp_t *t, int from, int to) {
  tcp_cx_t *cx = t->cx;
  if (!cx) return;
  /* pending connections first, from the end, so drops keep indexes valid */
  for (int i = to - 1; i >= from; i--) {
    int code = TCP_PFD_CX - 1 - t->pfd_peer[i];
    if (!t->pfd[i].revents || t->pfd_peer[i] >= TCP_PFD_CX) continue;
    if (code >= cx->base_pend && code < cx->base_out)
      cx_incoming(cx, code - cx->base_pend, t->pfd[i].revents);
  }
  for (int i = from; i < to; i++) {
    if (!t->pfd[i].revents) continue;
    if (t->pfd_peer[i] == TCP_PFD_CX) {
      cx_accept(cx);
      continue;
    }
    int code = TCP_PFD_CX - 1 - t->pfd_peer[i];
    if (code >= cx->base_out) cx_outgoing_io(cx, code - cx->base_out, t->pfd[i].revents);
  }
}

void tc__tcp_cx_describe(const tcp_t *t, int p, char *buf, size_t len) {
  const tcp_cx_t *cx = t->cx;
  buf[0] = 0;
  if (t->fd[p] >= 0 || !cx) return;
  const conn_t *c = &cx->out[p];
  if (c->fd < 0 && !c->last_err)
    snprintf(buf, len, "; peer %d has not connected to this rank (listening at %s)", p,
             cx->pub);
  else
    snprintf(buf, len, "; no connection to peer %d at %s yet (%s)", p,
             cx->addrs[p] ? cx->addrs[p] : "?",
             c->state == CONN_CONNECTING ? "no answer"
             : c->state == CONN_SENDING || c->state == CONN_RECEIVING ? "in the handshake"
             : c->last_err == EACCES ? "it answered with a wrong token"
             : c->last_err == ECONNABORTED ? "it closed the connection during the handshake"
             : c->last_err ? strerror(c->last_err) : "not started");
}

void tc__tcp_cx_created(tcp_t *t) {
  tcp_cx_t *cx = t->cx;
  if (!cx) return;
  cx->created = 1;
}

void tc__tcp_cx_free(tcp_t *t) {
  tcp_cx_t *cx = t->cx;
  if (!cx) return;
  t->cx = NULL;
  if (cx->lfd >= 0) close(cx->lfd);
  if (cx->pend)
    while (cx->npend > 0) /* those still sending our hello are peers */
      pend_drop(cx, cx->npend - 1, cx->pend[cx->npend - 1].state == CONN_SENDING ? NULL
                : "still without a hello when the connections were closed");
  tc__tcp_refusals_report(&cx->refused, cx->host, cx->whoami);
  if (cx->out)
    for (int i = 0; i < t->size; i++)
      if (cx->out[i].fd >= 0) close(cx->out[i].fd);
  if (cx->addrs)
    for (int i = 0; i < t->size; i++) free(cx->addrs[i]);
  if (cx->lazy && cx->published) { /* our address: nobody may connect now */
    char key[64];
    int deleted = 0;
    snprintf(key, sizeof key, "cpu/addr/%d", t->rank);
    (void)tc_store_delete(cx->store, key, &deleted);
  }
  if (cx->store) tc_store_release(cx->store);
  free(cx->addrs);
  free(cx->out);
  free(cx->pend);
  free(cx);
}

/* Waits, under `deadline`, until every peer is connected. */
int tc__tcp_connect_all(tcp_t *t, double deadline, char *err, size_t errlen) {
  tcp_cx_t *cx = t->cx;
  if (!cx) return TC_OK;
  tc_tp_op_t op = {.opname = "init (connections)", .deadline = deadline,
                   .timeout_s = cx->timeout_s, .msg = err, .msglen = errlen};
  cx->all = 1; /* every pair: the higher rank connects, as eager creation does */
  if (cx->lazy) {
    /* the addresses through the mesh (log2 n steps) rather than one store
     * request per lower rank; one too long for a slot is read from the
     * store */
    enum { SLOT = 80 };
    char mine[SLOT] = "", *all = malloc((size_t)t->size * SLOT);
    if (!all) return msg_fail(err, errlen, TC_ERR_NOMEM, "out of memory");
    size_t publen = strlen(cx->pub);
    if (publen < SLOT) memcpy(mine, cx->pub, publen + 1);
    int rc = tc__mesh_all_gather_as(t, "the exchange of addresses", mine, SLOT, all, 0,
                                    deadline, err, errlen);
    for (int p = 0; p < t->size && rc == TC_OK; p++) {
      char *a = all + (size_t)p * SLOT;
      a[SLOT - 1] = 0;
      if (p == t->rank || cx->addrs[p] || !a[0]) continue;
      if (!(cx->addrs[p] = strdup(a))) rc = msg_fail(err, errlen, TC_ERR_NOMEM, "out of memory");
    }
    free(all);
    if (rc != TC_OK) return rc;
  }
  for (int p = 0; p < t->size; p++) {
    if (p == t->rank || t->fd[p] >= 0) continue;
    if (cx->out[p].want && p > t->rank) continue; /* it connects to this rank */
    cx->out[p].want = 0;
    int rc = tc__tcp_cx_want(t, p, &op);
    if (rc != TC_OK) return rc;
  }
  for (;;) {
    int missing = -1;
    for (int p = 0; p < t->size && missing < 0; p++)
      if (p != t->rank && t->fd[p] < 0) missing = p;
    if (missing < 0) return TC_OK;
    if (atomic_load(t->aborted))
      return msg_fail(err, errlen, TC_ERR_ABORTED, "aborted while connecting to its peers");
    double left = deadline - tc__now();
    if (left <= 0) {
      char d[400];
      tc__tcp_cx_describe(t, missing, d, sizeof d);
      return msg_fail(err, errlen, TC_ERR_TIMEOUT,
                      "could not connect to every peer within %g s%s; check that rank %d "
                      "is running and that the addresses are reachable between the hosts "
                      "(advertise address, firewall)", cx->timeout_s, d, missing);
    }
    int np = 0;
    t->pfd[np] = (struct pollfd){.fd = t->wake_fd, .events = POLLIN};
    t->pfd_peer[np++] = TCP_PFD_WAKE;
    int ms = (int)(left * 1000.0) + 1;
    if (ms > TCP_POLL_CAP_MS) ms = TCP_POLL_CAP_MS;
    int rc = tc__tcp_cx_fill(t, &np, &ms, &op);
    if (rc != TC_OK) return rc;
    int r = poll(t->pfd, (nfds_t)np, ms);
    if (r < 0 && errno != EINTR)
      return msg_fail(err, errlen, TC_ERR_SYSTEM, "poll failed: %s", strerror(errno));
    if (r <= 0) continue;
    tc__tcp_cx_events(t, 1, np);
  }
}

/* ------------------------------------------------------------------------ */
/* Creation                                                                  */
/* ------------------------------------------------------------------------ */

/* FNV-1a, 64 bits. */
static uint64_t hash64(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

/* The token: made by rank 0, read by the others. */
static int setup_token(tcp_cx_t *cx, const tc_tp_args_t *a, double deadline, char *err,
                       size_t errlen) {
  if (a->rank == 0) {
    size_t got = 0;
    while (got < sizeof cx->token) {
      ssize_t r = getrandom(cx->token + got, sizeof cx->token - got, 0);
      if (r < 0 && errno != EINTR)
        return msg_fail(err, errlen, TC_ERR_SYSTEM, "getrandom failed: %s", strerror(errno));
      if (r > 0) got += (size_t)r;
    }
    int rc = a->host->store_set(a->store, "cpu/token", cx->token, sizeof cx->token);
    if (rc != TC_OK) {
      char why[512];
      store_why(rc, why, sizeof why);
      return msg_fail(err, errlen, rc, "could not publish the connection token in the "
                      "store (%s)", why);
    }
    return TC_OK;
  }
  void *v = NULL;
  size_t len = 0;
  int rc = store_get(cx, "cpu/token", &v, &len, deadline, "rank 0's connection token", err,
                     errlen);
  if (rc != TC_OK) return rc;
  if (len != sizeof cx->token) {
    a->host->free(v);
    return msg_fail(err, errlen, TC_ERR_PROTOCOL, "the connection token in the store has "
                    "%zu bytes instead of 16 (another program using the same keys?)", len);
  }
  memcpy(cx->token, v, sizeof cx->token);
  a->host->free(v);
  return TC_OK;
}

/* The busy-wait policy: the cores of the local ranks' CPU masks (the union
 * when this rank's own mask has fewer cores than there are local ranks:
 * each rank bound to a core of its own by tcrun, mpirun or srun is not
 * oversubscribed, which its own one-core mask would suggest). The masks are
 * read only then, only when the own mask is not all the machine's, and
 * only when there are no more local ranks than the machine has cores:
 * beyond that no union can give each rank a core (tcrun deals such ranks
 * round-robin over the cores, one core each, and reading every peer's
 * mask would cost each rank one store request per local rank). */
static int setup_spin(tcp_cx_t *cx, const tc_tp_args_t *a, uint64_t *cpus, double deadline,
                      char *err, size_t errlen) {
  tcp_t *t = cx->t;
  int ncpu = tc__mesh_cpu_count(cpus);
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  if (t->local > ncpu && ncpu < online && t->local <= online) {
    for (int r = 0; r < t->size; r++) {
      if (r == t->rank || t->host_id[r] != t->host_id[t->rank]) continue;
      void *v = NULL;
      size_t len = 0;
      char key[64];
      snprintf(key, sizeof key, "cpu/cpus/%d", r);
      int rc = store_get(cx, key, &v, &len, deadline, "a local rank's CPU mask", err, errlen);
      if (rc != TC_OK) return rc;
      for (size_t w = 0; w < TC_MESH_CPU_WORDS && (w + 1) * 8 <= len; w++) {
        uint64_t word;
        memcpy(&word, (const char *)v + w * 8, 8);
        cpus[w] |= word;
      }
      a->host->free(v);
    }
    ncpu = tc__mesh_cpu_count(cpus);
  }
  t->spin_s = tc__mesh_spin_policy(a, t->local, ncpu);
  /* TCP busy-polls the sockets as long, unless TORCHCOMMS_CPU_TCP_SPIN_US
   * says otherwise (0: sleep in poll at once; on a loaded VM, whose loopback
   * packets are delivered by ksoftirqd, spinning delays them) */
  t->poll_spin_s = t->spin_s;
  if (tc__setting_is_set(TC_SET_CPU_TCP_SPIN_US)) {
    double tsp = tc__setting_double(TC_SET_CPU_TCP_SPIN_US);
    t->poll_spin_s = tsp > 0 ? tsp * 1e-6 : 0;
  } else {
    /* more ranks than cores: poll the sockets and yield the core before
     * sleeping in poll, as shared memory does */
    t->poll_yield_s = tc__mesh_yield_policy(t->spin_s);
  }
  return TC_OK;
}

static int setup(tcp_t *t, tcp_cx_t *cx, const tc_tp_args_t *a, double deadline, char *err,
                 size_t errlen) {
  int rc = setup_token(cx, a, deadline, err, errlen);
  if (rc != TC_OK) return rc;
  for (int i = 0; i < 16; i++) snprintf(cx->tokhex + 2 * i, 3, "%02x", cx->token[i]);
  memcpy(t->token, cx->token, sizeof t->token);

  /* listen, and publish "<token>|addr:port" and the CPU mask. A lazy
   * communicator's address stays in the store until it closes (peers read
   * it on first use): set directly, not through the host, which deletes
   * what creation set once it completes */
  rc = cx_listen(cx, a, err, errlen);
  if (rc != TC_OK) return rc;
  char key[64], val[400];
  snprintf(key, sizeof key, "cpu/addr/%d", t->rank);
  snprintf(val, sizeof val, "%s|%s", cx->tokhex, cx->pub);
  rc = cx->lazy ? tc_store_set(a->store, key, val, strlen(val))
                : a->host->store_set(a->store, key, val, strlen(val));
  cx->published = rc == TC_OK;
  uint64_t cpus[TC_MESH_CPU_WORDS];
  tc__mesh_own_cpus(cpus);
  snprintf(key, sizeof key, "cpu/cpus/%d", t->rank);
  if (rc == TC_OK) rc = a->host->store_set(a->store, key, cpus, sizeof cpus);
  if (rc != TC_OK) {
    char why[512];
    store_why(rc, why, sizeof why);
    return msg_fail(err, errlen, rc, "could not publish its address in the store (%s)", why);
  }

  /* eager: every pair now */
  if (!cx->lazy && (rc = tc__tcp_connect_all(t, deadline, err, errlen)) != TC_OK) return rc;

  /* every rank's machine (host name and boot id), through the mesh */
  char hkey[400];
  tc__mesh_host_key(hkey, sizeof hkey);
  uint64_t mine = hash64(hkey);
  rc = tc__mesh_all_gather_as(t, "the exchange of host names", &mine, sizeof mine,
                              t->host_id, 0, deadline, err, errlen);
  if (rc != TC_OK) return rc;
  t->local = 0;
  for (int r = 0; r < t->size; r++) t->local += t->host_id[r] == mine;
  return setup_spin(cx, a, cpus, deadline, err, errlen);
}

int tc__tcp_create(const tc_tp_args_t *a, void **out, char *err, size_t errlen) {
  *out = NULL;
  tcp_t *t = calloc(1, sizeof *t);
  if (!t) return TC_ERR_NOMEM;
  t->host = a->host;
  snprintf(t->name, sizeof t->name, "%s", a->comm_name ? a->comm_name : "");
  t->rank = a->rank;
  t->size = a->size;
  t->wake_fd = a->wake_fd;
  t->aborted = a->aborted;
  t->epoch = a->epoch;
  t->local = -1;
  t->timeout_s = a->timeout_s > 0 ? a->timeout_s : TC_DEFAULT_TIMEOUT_S;
  size_t n = (size_t)a->size;
  /* unauthenticated connections waiting at once: every peer at most, and
   * no more than 1024 peers (others wait in the backlog) */
  int maxpend = (a->size - 1 < 1024 ? a->size - 1 : 1024) + TC__TCP_PENDING_EXTRA;
  t->npfd = 2 + 2 * a->size + maxpend;
  t->fd = malloc(n * sizeof *t->fd);
  t->gone = calloc(n, 1);
  t->hup = calloc(n, 1);
  t->heard = calloc(n, sizeof *t->heard);
  t->send_head = malloc(n * sizeof(int));
  t->send_tail = malloc(n * sizeof(int));
  t->recv_head = malloc(n * sizeof(int));
  t->recv_tail = malloc(n * sizeof(int));
  t->pfd = malloc((size_t)t->npfd * sizeof *t->pfd);
  t->pfd_peer = malloc((size_t)t->npfd * sizeof(int));
  t->bye = malloc(2 * n * sizeof *t->bye);
  t->host_id = calloc(n, sizeof *t->host_id);
  t->quiet = calloc(n, 1);
  tcp_cx_t *cx = t->cx = calloc(1, sizeof *cx);
  if (cx) {
    cx->t = t;
    cx->host = a->host;
    cx->lfd = -1;
    cx->maxpend = maxpend;
    cx->base_pend = 0;
    cx->base_out = maxpend;
    cx->timeout_s = a->timeout_s > 0 ? a->timeout_s : TC_DEFAULT_TIMEOUT_S;
    cx->lazy = !tc__setting_bool(TC_SET_CPU_EAGER);
    cx->out = calloc(n, sizeof *cx->out);
    cx->pend = calloc((size_t)maxpend, sizeof *cx->pend);
    cx->addrs = calloc(n, sizeof *cx->addrs);
    snprintf(cx->whoami, sizeof cx->whoami, "cpu backend '%s' rank %d", t->name, t->rank);
    cx->refused.at_close = cx->lazy; /* the refusals are reported when it stops listening */
    tc_store_retain(a->store);
    cx->store = a->store;
  }
  int rc = TC_OK;
  if (t->fd) for (size_t i = 0; i < n; i++) t->fd[i] = -1;
  if (!t->fd || !t->gone || !t->hup || !t->heard || !t->send_head || !t->send_tail ||
      !t->recv_head || !t->recv_tail || !t->pfd || !t->pfd_peer || !t->bye || !t->host_id ||
      !t->quiet || !cx || !cx->out || !cx->pend || !cx->addrs) {
    rc = msg_fail(err, errlen, TC_ERR_NOMEM, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < n; i++) cx->out[i].fd = -1;
  if (a->size > TC__TCP_MAX_RANKS) {
    rc = msg_fail(err, errlen, TC_ERR_NOT_SUPPORTED,
                  "the TCP transport supports at most %d ranks", TC__TCP_MAX_RANKS);
    goto out;
  }
  rc = setup(t, cx, a, tc__now() + cx->timeout_s, err, errlen);
  if (rc == TC_OK && !cx->lazy) tc__tcp_cx_free(t); /* every peer is connected */
out:
  if (rc != TC_OK) {
    tc__tcp_close(t);
    return rc;
  }
  TC_BACKEND_LOGS(a->host, TC_LOG_DEBUG, TC_LOG_TCP,
                  "cpu backend '%s' rank %d: %s connections, %d of %d ranks on this machine",
                  t->name, t->rank, t->cx ? "lazy" : "eager", t->local, t->size);
  *out = t;
  return TC_OK;
}

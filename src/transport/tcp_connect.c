/* tcp_connect.c -- builds the TCP transport's full mesh: a random token in
 * the store, every rank listening on an ephemeral port of the one address
 * it publishes ("addr:port"; TORCHCOMMS_CPU_IFNAME picks the interface),
 * rank i connecting to every j < i and accepting every j > i, both sides
 * exchanging a hello {magic, version, rank, size, token} before a
 * connection counts. All non-blocking, in one poll loop, under the
 * bootstrap deadline.
 *
 * Against strangers on the port (scans, idle connections, other jobs): an
 * incoming connection must send a valid hello within
 * TC__TCP_HELLO_TIMEOUT_S; at most the expected peers plus
 * TC__TCP_PENDING_EXTRA connections wait unauthenticated, the oldest dropped
 * first for a newer one; refusals are logged once per source, then counted
 * and reported once (tcp_listen.c). */
#include "transport/mesh.h" /* tc__mesh_host_key, tc__mesh_spin_policy */
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
  double retry_at;
  double since; /* incoming: when accepted */
  size_t off;
  unsigned char out[TCP_HELLO], in[TCP_HELLO];
  char ip[64];
  int last_err; /* errno of the last failed connect attempt (outgoing) */
} conn_t;

enum { CONN_IDLE, CONN_CONNECTING, CONN_SENDING, CONN_RECEIVING, CONN_DONE };

typedef struct setup {
  tcp_t *t;
  const tc_tp_args_t *a;
  unsigned char token[16];
  double deadline;
  int lfd;
  conn_t *out;     /* [rank]: connections to lower ranks */
  conn_t *pend;    /* [maxpend]: incoming, not yet authenticated */
  int npend, maxpend;
  struct pollfd *pfd; /* [2 + maxpend + rank] */
  int *who;
  tc__tcp_refusals_t refused;
  char whoami[200]; /* "cpu backend 'name' rank r" for log lines */
  char *err;
  size_t errlen;
  char **addrs; /* [rank] "host:port" of lower ranks */
  char pub[300]; /* our own published "host:port" */
} setup_t;

static int setup_fail(setup_t *s, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int setup_fail(setup_t *s, int rc, const char *fmt, ...) {
  if (!s->err || !s->errlen) return rc;
  /* the core adds the communicator, the rank and the size */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->err, s->errlen, fmt, ap);
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

/* Listens on an ephemeral port of the address it publishes (s->pub is
 * set to "addr:port"). */
static int setup_listen(setup_t *s) {
  char addr[256], err[400];
  int rc = tc__tcp_pick_addr(s->a->advertise_addr, addr, sizeof addr, err,
                             sizeof err);
  if (rc != TC_OK) return setup_fail(s, rc, "%s", err);
  int port = 0, everywhere = 0;
  /* a backlog for bursts: connections wait there until accepted */
  rc = tc__tcp_listen_on(addr, s->t->size + 1024, &s->lfd, &port, &everywhere,
                         err, sizeof err);
  if (rc != TC_OK) return setup_fail(s, rc, "%s", err);
  if (everywhere)
    TC_BACKEND_LOGS(s->a->host, everywhere == 1 ? TC_LOG_WARN : TC_LOG_INFO, TC_LOG_TCP,
                    "%s: %s %s; listening on every "
                    "interface (TORCHCOMMS_CPU_IFNAME, or a numeric "
                    "TORCHCOMMS_SOCKET_ADDR of this host, binds one)", s->whoami,
                    addr, everywhere == 1 ? "is no address of this host (a "
                    "NAT's?)" : "names several addresses");
  snprintf(s->pub, sizeof s->pub, strchr(addr, ':') ? "[%s]:%d" : "%s:%d",
           addr, port);
  return TC_OK;
}

/* Gets a store key, waiting until the deadline. */
static int setup_get(setup_t *s, const char *key, void **v, size_t *len, const char *what) {
  double left = s->deadline - tc__now();
  if (left < 0.001) left = 0.001;
  int rc = s->a->host->store_get(s->a->store, key, v, len, left);
  if (rc == TC_ERR_TIMEOUT)
    return setup_fail(s, TC_ERR_TIMEOUT,
                      "timed out after %g s waiting for %s in the store (key '%s'); "
                      "check that all %d ranks were started with the same store and "
                      "communicator name",
                      s->a->timeout_s, what, key, s->t->size);
  if (rc != TC_OK)
    return setup_fail(s, rc, "could not read '%s' from the store (%s); check that the "
                      "store server is still running", key, tc_strerror(rc));
  return TC_OK;
}

/* Starts a non-blocking connect to lower rank j. */
static void conn_start(setup_t *s, int j) {
  conn_t *c = &s->out[j];
  const char *addr = s->addrs[j];
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
  c->off = 0;
  tc__tcp_put_hello(c->out, s->t->rank, s->t->size, s->t->epoch, s->token);
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

/* Closes pending connection i (refused for `why` unless NULL). */
static void pend_drop(setup_t *s, int i, const char *why) {
  if (why)
    tc__tcp_refused(&s->refused, s->a->host, s->whoami, s->pend[i].ip,
                    why);
  if (s->pend[i].fd >= 0) close(s->pend[i].fd);
  s->pend[i] = s->pend[--s->npend];
}

static int setup_incoming(setup_t *s, int i, short re);

/* Accepts every waiting connection; when the pending table is full the
 * oldest unauthenticated one makes room. A hello already there is read at
 * once. */
static void setup_accept(setup_t *s) {
  for (;;) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int fd = accept4(s->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return; /* EAGAIN, or a transient error: poll again */
    if (s->npend == s->maxpend) {
      int old = 0;
      for (int i = 1; i < s->npend; i++)
        if (s->pend[i].since < s->pend[old].since) old = i;
      pend_drop(s, old, "dropped for a newer connection (too many "
                "connections without a hello)");
    }
    conn_t *c = &s->pend[s->npend++];
    memset(c, 0, sizeof *c);
    c->fd = fd;
    c->peer = -1;
    c->state = CONN_RECEIVING;
    c->since = tc__now();
    sockaddr_ip(&ss, c->ip, sizeof c->ip);
    setup_incoming(s, s->npend - 1, POLLIN);
  }
}

/* Closes the pending connections that sent no hello in time. */
static void setup_expire(setup_t *s, double now) {
  for (int i = s->npend - 1; i >= 0; i--)
    if (s->pend[i].state == CONN_RECEIVING &&
        now - s->pend[i].since >= TC__TCP_HELLO_TIMEOUT_S)
      pend_drop(s, i, "no hello within the deadline (an idle connection)");
}

/* Progresses one incoming connection; may drop it (then returns 1). */
static int setup_incoming(setup_t *s, int i, short re) {
  conn_t *c = &s->pend[i];
  tcp_t *t = s->t;
  if (c->state == CONN_RECEIVING) {
    int r = conn_io(c, 0);
    if (r == 0 && !(re & (POLLHUP | POLLERR))) return 0;
    if (r <= 0) {
      pend_drop(s, i, "closed before its hello (a port scan?)");
      return 1;
    }
    const char *why = NULL;
    int peer = tc__tcp_parse_hello(c->in, TCP_HELLO, t->size, t->epoch, s->token, &why);
    if (peer >= 0 && (peer <= t->rank || t->fd[peer] >= 0))
      why = "a hello from an unexpected or duplicate rank";
    if (why) {
      pend_drop(s, i, why);
      return 1;
    }
    c->peer = peer;
    tc__tcp_put_hello(c->out, t->rank, t->size, t->epoch, s->token);
    c->state = CONN_SENDING;
  }
  if (c->state == CONN_SENDING) {
    int r = conn_io(c, 1);
    if (r == 0) return 0;
    if (r < 0) {
      pend_drop(s, i, NULL); /* a peer that went away: it retries */
      return 1;
    }
    tune_socket(c->fd);
    t->fd[c->peer] = c->fd;
    c->fd = -1;
    pend_drop(s, i, NULL);
    return 1;
  }
  return 0;
}

/* Progresses the outgoing connection to lower rank j. */
static void setup_outgoing(setup_t *s, int j, short re) {
  conn_t *c = &s->out[j];
  tcp_t *t = s->t;
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
    if (r < 0) conn_reset(c, errno ? errno : ECONNABORTED);
    if (r <= 0) return;
    const char *why = NULL;
    if (tc__tcp_parse_hello(c->in, TCP_HELLO, t->size, t->epoch, s->token, &why) != j) {
      /* a stale address: someone else listens there; retry later */
      conn_reset(c, EACCES);
      return;
    }
    tune_socket(c->fd);
    t->fd[j] = c->fd;
    c->fd = -1;
    c->state = CONN_DONE;
  }
}

static int setup_mesh(setup_t *s) {
  tcp_t *t = s->t;
  for (int j = 0; j < t->rank; j++) conn_start(s, j);
  for (;;) {
    int missing = -1;
    for (int p = 0; p < t->size && missing < 0; p++)
      if (p != t->rank && t->fd[p] < 0) missing = p;
    if (missing < 0) return TC_OK;
    if (atomic_load(s->a->aborted))
      return setup_fail(s, TC_ERR_ABORTED, "aborted while connecting to its peers");
    double now = tc__now(), left = s->deadline - now;
    if (left <= 0) {
      if (missing < t->rank) {
        conn_t *c = &s->out[missing];
        return setup_fail(s, TC_ERR_TIMEOUT,
                          "could not connect to rank %d at %s within %g s (%s); "
                          "check that rank %d is running and that this address is "
                          "reachable from this host (advertise address, firewall)",
                          missing, s->addrs[missing], s->a->timeout_s,
                          c->last_err == EACCES ? "it answered with a wrong token"
                          : c->last_err == ECONNABORTED
                              ? "it closed the connection during the handshake: a "
                                "different token, i.e. a stale address or another job?"
                          : c->last_err ? strerror(c->last_err) : "no answer",
                          missing);
      }
      return setup_fail(s, TC_ERR_TIMEOUT,
                        "rank %d did not connect to this rank (listening at %s) "
                        "within %g s; check that rank %d is running and can reach "
                        "this address (advertise address, firewall)",
                        missing, s->pub, s->a->timeout_s, missing);
    }
    setup_expire(s, now);
    struct pollfd *pfd = s->pfd;
    int *who = s->who; /* -1 wake, -2 listen, 0.. out, 10000+ pend */
    int np = 0;
    double next_retry = s->deadline;
    pfd[np] = (struct pollfd){.fd = s->a->wake_fd, .events = POLLIN};
    who[np++] = -1;
    if (s->lfd >= 0) {
      pfd[np] = (struct pollfd){.fd = s->lfd, .events = POLLIN};
      who[np++] = -2;
    }
    for (int i = 0; i < s->npend; i++) {
      conn_t *c = &s->pend[i];
      pfd[np] = (struct pollfd){.fd = c->fd,
                                .events = c->state == CONN_SENDING ? POLLOUT : POLLIN};
      who[np++] = 10000 + i;
      if (c->since + TC__TCP_HELLO_TIMEOUT_S < next_retry)
        next_retry = c->since + TC__TCP_HELLO_TIMEOUT_S;
    }
    for (int j = 0; j < t->rank; j++) {
      conn_t *c = &s->out[j];
      if (c->state == CONN_DONE) continue;
      if (c->state == CONN_IDLE) {
        if (c->retry_at <= now) conn_start(s, j);
        if (c->state == CONN_IDLE) {
          if (c->retry_at < next_retry) next_retry = c->retry_at;
          continue;
        }
      }
      pfd[np] = (struct pollfd){.fd = c->fd,
                                .events = c->state == CONN_RECEIVING ? POLLIN : POLLOUT};
      who[np++] = j;
    }
    double wait = next_retry - now;
    if (wait > left) wait = left;
    int ms = (int)(wait * 1000.0) + 1;
    if (ms > TCP_POLL_CAP_MS) ms = TCP_POLL_CAP_MS;
    int r = poll(pfd, (nfds_t)np, ms);
    if (r < 0 && errno != EINTR)
      return setup_fail(s, TC_ERR_SYSTEM, "poll failed: %s", strerror(errno));
    if (r <= 0) continue;
    /* pending connections first, from the end, so drops keep indexes valid */
    for (int i = np - 1; i >= 0; i--) {
      if (!pfd[i].revents) continue;
      if (who[i] >= 10000) setup_incoming(s, who[i] - 10000, pfd[i].revents);
    }
    for (int i = 0; i < np; i++) {
      if (!pfd[i].revents) continue;
      if (who[i] == -2) setup_accept(s);
      else if (who[i] >= 0 && who[i] < 10000) setup_outgoing(s, who[i], pfd[i].revents);
    }
  }
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
  size_t n = (size_t)a->size;
  t->fd = malloc(n * sizeof *t->fd);
  t->gone = calloc(n, 1);
  t->hup = calloc(n, 1);
  t->send_head = malloc(n * sizeof(int));
  t->send_tail = malloc(n * sizeof(int));
  t->recv_head = malloc(n * sizeof(int));
  t->recv_tail = malloc(n * sizeof(int));
  t->pfd = malloc((n + 1) * sizeof *t->pfd);
  t->pfd_peer = malloc((n + 1) * sizeof(int));
  t->bye = malloc(2 * n * sizeof *t->bye);
  setup_t s = {.t = t, .a = a, .lfd = -1, .err = err, .errlen = errlen,
               .deadline = tc__now() + (a->timeout_s > 0 ? a->timeout_s : TC_DEFAULT_TIMEOUT_S)};
  int rc = TC_OK;
  if (!t->fd || !t->gone || !t->hup || !t->send_head || !t->send_tail || !t->recv_head ||
      !t->recv_tail || !t->pfd || !t->pfd_peer || !t->bye) {
    if (t->fd) for (size_t i = 0; i < n; i++) t->fd[i] = -1;
    rc = setup_fail(&s, TC_ERR_NOMEM, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < n; i++) t->fd[i] = -1;
  if (a->size > 1024) {
    rc = setup_fail(&s, TC_ERR_NOT_SUPPORTED, "the TCP transport supports at most 1024 ranks");
    goto out;
  }
  snprintf(s.whoami, sizeof s.whoami, "cpu backend '%s' rank %d", t->name, t->rank);
  s.maxpend = a->size - 1 - a->rank + TC__TCP_PENDING_EXTRA;
  s.out = calloc(n, sizeof *s.out);
  s.addrs = calloc(n, sizeof *s.addrs);
  s.pend = calloc((size_t)s.maxpend, sizeof *s.pend);
  s.pfd = calloc(2 + (size_t)s.maxpend + n, sizeof *s.pfd);
  s.who = calloc(2 + (size_t)s.maxpend + n, sizeof *s.who);
  if (!s.out || !s.addrs || !s.pend || !s.pfd || !s.who) {
    rc = setup_fail(&s, TC_ERR_NOMEM, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < n; i++) s.out[i].fd = -1;

  /* 0. count the ranks on this machine (read back once all are connected),
   * and publish this rank's CPU mask under its place in that count */
  char hkey[400], mkey[440];
  tc__mesh_host_key(hkey, sizeof hkey);
  int64_t local = 0;
  uint64_t cpus[TC_MESH_CPU_WORDS];
  tc__mesh_own_cpus(cpus);
  if (a->host->store_add(a->store, hkey, 1, &local) != TC_OK) local = -1;
  if (local > 0) {
    snprintf(mkey, sizeof mkey, "%s/cpus/%lld", hkey, (long long)local);
    if (a->host->store_set(a->store, mkey, cpus, sizeof cpus) != TC_OK) local = -1;
  }

  /* 1. the token */
  if (t->rank == 0) {
    size_t got = 0;
    while (got < sizeof s.token) {
      ssize_t r = getrandom(s.token + got, sizeof s.token - got, 0);
      if (r < 0 && errno != EINTR) {
        rc = setup_fail(&s, TC_ERR_SYSTEM, "getrandom failed: %s", strerror(errno));
        goto out;
      }
      if (r > 0) got += (size_t)r;
    }
    rc = a->host->store_set(a->store, "cpu/token", s.token, sizeof s.token);
    if (rc != TC_OK) {
      {
        char why[512]; /* the store's own message (e.g. a Python exception) */
        snprintf(why, sizeof why, "%s", tc_last_error()[0] ? tc_last_error() : tc_strerror(rc));
        rc = setup_fail(&s, rc, "could not publish the connection token in the store (%s)", why);
      }
      goto out;
    }
  } else {
    void *v = NULL;
    size_t len = 0;
    TC_CHECK_GOTO(setup_get(&s, "cpu/token", &v, &len, "rank 0's connection token"), rc, out);
    if (len != sizeof s.token) {
      a->host->free(v);
      rc = setup_fail(&s, TC_ERR_PROTOCOL, "the connection token in the store has %zu "
                      "bytes instead of 16 (another program using the same keys?)", len);
      goto out;
    }
    memcpy(s.token, v, sizeof s.token);
    a->host->free(v);
  }

  /* 2. listen and publish (ranks that higher ranks connect to) */
  if (t->rank < t->size - 1) {
    TC_CHECK_GOTO(setup_listen(&s), rc, out);
    char key[64];
    snprintf(key, sizeof key, "cpu/addr/%d", t->rank);
    rc = a->host->store_set(a->store, key, s.pub, strlen(s.pub));
    if (rc != TC_OK) {
      {
        char why[512]; /* the store's own message (e.g. a Python exception) */
        snprintf(why, sizeof why, "%s", tc_last_error()[0] ? tc_last_error() : tc_strerror(rc));
        rc = setup_fail(&s, rc, "could not publish its address in the store (%s)", why);
      }
      goto out;
    }
  }

  /* 3. the addresses of lower ranks */
  for (int j = 0; j < t->rank; j++) {
    char key[64], what[64];
    snprintf(key, sizeof key, "cpu/addr/%d", j);
    snprintf(what, sizeof what, "rank %d's address", j);
    void *v = NULL;
    size_t len = 0;
    TC_CHECK_GOTO(setup_get(&s, key, &v, &len, what), rc, out);
    s.addrs[j] = malloc(len + 1);
    if (!s.addrs[j]) {
      a->host->free(v);
      rc = setup_fail(&s, TC_ERR_NOMEM, "out of memory");
      goto out;
    }
    memcpy(s.addrs[j], v, len);
    s.addrs[j][len] = 0;
    a->host->free(v);
  }

  /* 4. connect down, accept up */
  TC_CHECK_GOTO(setup_mesh(&s), rc, out);

  /* 5. every peer has counted itself before it could connect */
  if (local >= 0 && a->host->store_add(a->store, hkey, 0, &local) != TC_OK) local = -1;
  /* the cores the local ranks may run on: the union of their CPU masks
   * when this rank's own has fewer cores than there are local ranks (each
   * rank bound to a core of its own by tcrun, mpirun or srun is not
   * oversubscribed, which its own one-core mask would suggest) */
  int ncpu = tc__mesh_cpu_count(cpus);
  if (local > ncpu) {
    for (int64_t i = 1; i <= local; i++) {
      void *v = NULL;
      size_t len = 0;
      snprintf(mkey, sizeof mkey, "%s/cpus/%lld", hkey, (long long)i);
      TC_CHECK_GOTO(setup_get(&s, mkey, &v, &len, "a local rank's CPU mask"), rc, out);
      for (size_t w = 0; w < TC_MESH_CPU_WORDS && (w + 1) * 8 <= len; w++) {
        uint64_t word;
        memcpy(&word, (const char *)v + w * 8, 8);
        cpus[w] |= word;
      }
      a->host->free(v);
    }
    ncpu = tc__mesh_cpu_count(cpus);
  }
  t->spin_s = tc__mesh_spin_policy(a, (int)local, ncpu);
  /* TCP busy-polls the sockets as long, unless TORCHCOMMS_CPU_TCP_SPIN_US
   * says otherwise (0: sleep in poll at once; on a loaded VM, whose loopback
   * packets are delivered by ksoftirqd, spinning delays them) */
  t->poll_spin_s = t->spin_s;
  if (tc__setting_is_set(TC_SET_CPU_TCP_SPIN_US)) {
    double tsp = tc__setting_double(TC_SET_CPU_TCP_SPIN_US);
    t->poll_spin_s = tsp > 0 ? tsp * 1e-6 : 0;
  }
  t->local = (int)local;
  memcpy(t->token, s.token, sizeof t->token);

out:
  if (s.lfd >= 0) close(s.lfd);
  while (s.npend > 0) /* those still sending our hello are peers */
    pend_drop(&s, s.npend - 1, s.pend[s.npend - 1].state == CONN_SENDING ? NULL
              : "still without a hello when the setup ended");
  tc__tcp_refusals_report(&s.refused, a->host, s.whoami);
  free(s.pend);
  free(s.pfd);
  free(s.who);
  if (s.out)
    for (size_t i = 0; i < n; i++)
      if (s.out[i].fd >= 0) close(s.out[i].fd);
  if (s.addrs)
    for (size_t i = 0; i < n; i++) free(s.addrs[i]);
  free(s.addrs);
  free(s.out);
  if (rc != TC_OK) {
    tc__tcp_close(t);
    return rc;
  }
  *out = t;
  return TC_OK;
}


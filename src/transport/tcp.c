/* tcp.c -- the TCP transport of the cpu backend: the exchange primitive over
 * the full mesh of non-blocking sockets that tcp_connect.c builds (tcp.h).
 *
 * Wire format: every message is a 16-byte header {magic, kind, length}
 * followed by `length` payload bytes, streamed straight from / into the
 * user's buffer. A collective's first messages to each peer are preceded by
 * its fingerprint (kind TC_XFER_FP, transport.h), checked on arrival. Connections open with a 32-byte hello in both directions
 * {magic, version, rank, size, token[16]}. */
#include "transport/tcp_internal.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sched.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>


/* ------------------------------------------------------------------------ */
/* Messages                                                                  */
/* ------------------------------------------------------------------------ */

static int tcp_fail(tcp_t *t, const tc_tp_op_t *op, int rc, const char *fmt,
                    ...) __attribute__((format(printf, 4, 5)));

static int tcp_fail(tcp_t *t, const tc_tp_op_t *op, int rc, const char *fmt,
                    ...) {
  if (!op->msg || !op->msglen) return rc;
  (void)t; /* the core adds "torchcomms: <op> on '<comm>' (rank r of n): " */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(op->msg, op->msglen, fmt, ap);
  va_end(ap);
  return rc;
}

/* Other peers whose connections are gone too. A failure cascades (a rank
 * that lost a peer fails and exits, and its own exit is seen by others,
 * possibly before the first loss is), so wait a moment and name every lost
 * peer; the first cause is then always in the message. Appends to op->msg.
 * A reconfigured communicator (epoch != 0) does not wait, it only names the
 * peers already seen gone: its survivors do not exit on a failure, they
 * reconfigure, and their recovery waits on this error (the wait was most
 * of the time from a kill to resumed training). */
#define TCP_CASCADE_S 0.1
static void tcp_also_gone(tcp_t *t, const tc_tp_op_t *op, int peer) {
  unsigned char *lost = t->quiet; /* per exchange, and this one is over */
  memset(lost, 0, (size_t)t->size);
  int np = 0;
  for (int p = 0; p < t->size; p++) {
    if (p == peer || t->fd[p] < 0 || t->gone[p] || tc__tcp_left(t, p)) continue;
    t->pfd[np] = (struct pollfd){.fd = t->fd[p], .events = POLLRDHUP};
    t->pfd_peer[np++] = p;
  }
  if (np == 0) return;
  double until = tc__now() + (t->epoch ? 0 : TCP_CASCADE_S);
  int nlost = 0;
  for (;;) {
    double left = until - tc__now();
    if (poll(t->pfd, (nfds_t)np, left > 0 ? (int)(left * 1000) + 1 : 0) < 0 && errno != EINTR)
      break;
    for (int i = 0; i < np; i++) {
      if (!(t->pfd[i].revents & (POLLRDHUP | POLLHUP | POLLERR))) continue;
      lost[t->pfd_peer[i]] = 1;
      t->pfd[i].fd = -1; /* poll ignores it from now on */
      nlost++;
    }
    if (nlost == np || tc__now() >= until) break;
  }
  size_t l = strlen(op->msg);
  int first = 1;
  for (int p = 0; p < t->size && l + 16 < op->msglen; p++) {
    if (!lost[p]) continue;
    int w = snprintf(op->msg + l, op->msglen - l, "%s%d", first ? "; also lost: peer " : ", ", p);
    if (w > 0) l += (size_t)w;
    first = 0;
  }
}

static void tcp_notice_send(tcp_t *t, int code, const char *text);

/* A peer's connection failed: EOF (err == 0) or a socket error. */
static int tcp_dead(tcp_t *t, const tc_tp_op_t *op, int peer, int err) {
  if (err == 0)
    tcp_fail(t, op, TC_ERR_REMOTE,
             "peer %d closed its connection (process exited or aborted?)", peer);
  else if (err == ECONNRESET || err == EPIPE)
    tcp_fail(t, op, TC_ERR_REMOTE,
             "the connection to peer %d was reset (process killed?)", peer);
  else
    tcp_fail(t, op, TC_ERR_REMOTE, "the connection to peer %d failed: %s", peer,
             strerror(err));
  if (op->msg && op->msglen) {
    tcp_also_gone(t, op, peer);
    tcp_notice_send(t, TC_ERR_REMOTE, op->msg); /* the ranks not connected to it */
  }
  return TC_ERR_REMOTE;
}

/* Hang-ups. A peer's hang-up (end of stream, reset) fails the exchange that
 * sees it when the exchange still has transfers pending with that peer
 * (what it did not send will never come) and, for early detection, also
 * when nothing is pending with it but its stream holds nothing more: it died
 * or failed, and the ranks waiting on it may be waiting on us. It does not
 * fail the exchange when nothing is pending with the peer and
 *  - its stream ends with a TC_XFER_LEFT notice: it destroyed or aborted its
 *    communicator with nothing in flight (tc__tcp_leave), so every operation
 *    it completed stands, this one included;
 *  - unread messages precede the end: they belong to a later exchange, which
 *    meets the end of the stream if it needs more than there is;
 *  - the exchange is the final barrier of creation (op->hangup_ok): the peer
 *    completed creation; its death is an error of the next operation;
 *  - this rank received a message from the peer during this collective
 *    (op->coll): it took part and may have finished its part and exited
 *    (a script's last barrier); the ranks still waiting on it fail and
 *    send their notice, and the next collective fails with it.
 * Such a peer is marked in t->hup and no longer watched (a peer that left
 * fails at once every later exchange with a transfer to or from it). */
static int tcp_may_hang_up(const tcp_t *t, int p, const tc_tp_op_t *op) {
  return op->hangup_ok || (op->coll && t->heard[p] == op->coll);
}

static int tcp_hup_ok(tcp_t *t, int p, const tc_tp_op_t *op) {
  unsigned char h[TCP_HDR];
  ssize_t n;
  do n = recv(t->fd[p], h, sizeof h, MSG_PEEK | MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  if (n == (ssize_t)sizeof h) {
    tc_xfer_t left = {.peer = p, .kind = TC_XFER_LEFT};
    char why[8];
    t->hup[p] = tc__xfer_hdr_problem((const char *)h, TCP_MSG_MAGIC, t->epoch, &left, op->opname,
                                     why, sizeof why) ? TCP_HUP_DATA : TCP_HUP_LEFT;
    return 1;
  }
  if (n <= 0 && !tcp_may_hang_up(t, p, op)) return 0; /* nothing more from it: died or failed */
  t->hup[p] = n > 0 ? TCP_HUP_DATA : TCP_HUP_DONE;
  return 1;
}

int tc__tcp_check_alive(tcp_t *t, const tc_tp_op_t *op) {
  int np = 0;
  for (int p = 0; p < t->size; p++) {
    if (t->fd[p] < 0 || t->gone[p] || tc__tcp_left(t, p)) continue;
    t->pfd[np] = (struct pollfd){.fd = t->fd[p], .events = POLLRDHUP};
    t->pfd_peer[np++] = p;
  }
  if (np == 0) return TC_OK;
  int r = poll(t->pfd, (nfds_t)np, 0);
  if (r <= 0) return TC_OK; /* EINTR: next time */
  for (int i = 0; i < np; i++) {
    short re = t->pfd[i].revents;
    if (!(re & (POLLRDHUP | POLLHUP | POLLERR))) continue;
    int p = t->pfd_peer[i];
    if (tcp_hup_ok(t, p, op)) continue;
    return tcp_dead(t, op, p, (re & POLLERR) ? tc__tcp_sock_error(t->fd[p]) : 0);
  }
  return TC_OK;
}

int tc__tcp_sock_error(int fd) {
  int err = 0;
  socklen_t len = sizeof err;
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = errno;
  return err;
}

static void tcp_put_hdr(unsigned char *h, uint32_t kind, uint32_t epoch, uint64_t len) {
  uint32_t magic = TCP_MSG_MAGIC, word = TC_XFER_WORD(kind, epoch);
  memcpy(h, &magic, 4);
  memcpy(h + 4, &word, 4);
  memcpy(h + 8, &len, 8);
}

/* ------------------------------------------------------------------------ */
/* Lazy sends (tc_xfer_t.lazy)                                               */
/* ------------------------------------------------------------------------ */

/* A lazy send is copied, header and all, into its peer's queue and counts
 * as done. The queue is written before any other message to that peer (in
 * order), before an exchange that waits goes to sleep (after its busy poll
 * or yield phase: a peer waiting for what is queued waits that long at
 * most, and is never waited on in turn while it does), once TCP_OQ_FLUSH
 * bytes wait (16 fingerprints) or TCP_OQ_WEIGHT of their weight (a quarter
 * of the bound CPU_OWED_BYTES at which the reader waits for the oldest
 * half of what a peer owes it, backends/cpu/backend.c; the count's bound,
 * CPU_OWED_MAX, is 64), and before the goodbye or the notice of leaving.
 * So the peer never has to wait for a queue in the common case, and a
 * broadcast's receiver sends its fingerprints 16 at a time instead of one
 * system call per broadcast: 4 ranks on 2 cores, 8 bytes, ~2.5 sends per
 * broadcast when every waiting round wrote the queues, a third of the
 * kernel time of the whole operation (docs/benchmarks.md, "Lazy
 * fingerprints over TCP: written before a sleep"). */
#define TCP_OQ_CAP 2048u
#define TCP_OQ_FLUSH 640u
#define TCP_OQ_WEIGHT 8192u

/* Writes what peer p's queue holds, without blocking: 1 when it is empty
 * after, 0 when the socket took only part (the rest stays). A peer whose
 * socket fails loses its queue (what is queued is for that peer alone). */
static int tcp_oq_flush(tcp_t *t, int p) {
  uint32_t *off = &t->oq_off[p], len = t->oq_len[p];
  while (*off < len) {
    ssize_t n = send(t->fd[p], t->oq[p] + *off, len - *off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (n <= 0) break; /* its failure is the next exchange's with it */
    *off += (uint32_t)n;
  }
  t->oq_len[p] = t->oq_off[p] = t->oq_weight[p] = 0;
  return 1;
}

static void tcp_oq_flush_all(tcp_t *t) {
  int left = 0;
  for (int p = 0; p < t->size; p++)
    if (t->oq_len[p] && t->fd[p] >= 0 && !tcp_oq_flush(t, p)) left = 1;
  t->oq_any = left;
}

/* Queues lazy send x (its peer connected): 1 when queued, 0 when it has to
 * go as a plain send (no memory, or no room). */
static int tcp_oq_put(tcp_t *t, const tc_xfer_t *x) {
  int p = x->peer;
  size_t need = TCP_HDR + x->len;
  if (need > TCP_OQ_CAP) return 0;
  if (!t->oq) {
    size_t n = (size_t)t->size;
    t->oq = calloc(n, sizeof *t->oq);
    t->oq_len = calloc(n, sizeof *t->oq_len);
    t->oq_off = calloc(n, sizeof *t->oq_off);
    t->oq_weight = calloc(n, sizeof *t->oq_weight);
    if (!t->oq || !t->oq_len || !t->oq_off || !t->oq_weight) {
      free(t->oq);
      free(t->oq_len);
      free(t->oq_off);
      free(t->oq_weight);
      t->oq = NULL;
      t->oq_len = t->oq_off = t->oq_weight = NULL;
      return 0;
    }
  }
  if (!t->oq[p] && !(t->oq[p] = malloc(TCP_OQ_CAP))) return 0;
  if (t->oq_len[p] + need > TCP_OQ_CAP && !tcp_oq_flush(t, p))
    return 0; /* no room (a full socket): the plain send goes after the queue */
  unsigned char *at = t->oq[p] + t->oq_len[p];
  tcp_put_hdr(at, x->kind, t->epoch, x->len);
  if (x->len) memcpy(at + TCP_HDR, x->buf, x->len);
  t->oq_len[p] += (uint32_t)need;
  t->oq_weight[p] += x->lazy;
  t->oq_any = 1;
  if (t->oq_len[p] >= TCP_OQ_FLUSH || t->oq_weight[p] >= TCP_OQ_WEIGHT) (void)tcp_oq_flush(t, p);
  return 1;
}

/* Before a message written straight to peer p (a notice): 1 when nothing
 * of the queue is left, or nothing of it was written (then it is dropped:
 * a message cut in two would break the stream). */
static int tcp_oq_clear(tcp_t *t, int p) {
  if (!t->oq || !t->oq_len[p] || tcp_oq_flush(t, p)) return 1;
  if (t->oq_off[p]) return 0;
  t->oq_len[p] = t->oq_weight[p] = 0;
  return 1;
}

/* ------------------------------------------------------------------------ */
/* Mismatch notices (TC_XFER_NOTICE, transport.h)                            */
/* ------------------------------------------------------------------------ */

/* Sends the notice {code, text} to every connected peer that is still
 * there, once per transport, without waiting (a full socket misses it: that
 * peer learns from another, or fails on its own). */
static void tcp_notice_send(tcp_t *t, int code, const char *text) {
  if (t->noticed) return;
  t->noticed = 1;
  size_t len = strlen(text);
  if (len > TC_XFER_NOTICE_MAX - 4) len = TC_XFER_NOTICE_MAX - 4;
  unsigned char msg[TCP_HDR + TC_XFER_NOTICE_MAX];
  int32_t c32 = code;
  tcp_put_hdr(msg, TC_XFER_NOTICE, t->epoch, 4 + len);
  memcpy(msg + TCP_HDR, &c32, 4);
  memcpy(msg + TCP_HDR + 4, text, len);
  len += 4;
  for (int p = 0; p < t->size; p++) {
    if (t->fd[p] < 0 || t->gone[p] || t->hup[p] || !tcp_oq_clear(t, p)) continue;
    ssize_t n;
    do n = send(t->fd[p], msg, TCP_HDR + len, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
  }
}

/* Reads the rest of a notice from peer p (have bytes of its len-byte text
 * are in text already), waiting at most a second for them; then passes it
 * on and fails the exchange with it. */
static int tcp_notice_got(tcp_t *t, const tc_tp_op_t *op, int p, char *text, size_t have,
                          size_t len) {
  if (len > TC_XFER_NOTICE_MAX) len = TC_XFER_NOTICE_MAX;
  double until = tc__now() + 1.0;
  while (have < len) {
    ssize_t n = recv(t->fd[p], text + have, len - have, MSG_DONTWAIT);
    if (n > 0) {
      have += (size_t)n;
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) break;
    double left = until - tc__now();
    if (left <= 0) break;
    struct pollfd w = {.fd = t->fd[p], .events = POLLIN};
    (void)poll(&w, 1, (int)(left * 1000) + 1);
  }
  text[have < len ? have : len] = 0;
  int32_t code = TC_ERR_REMOTE;
  if (have >= 4) memcpy(&code, text, 4);
  if (code != TC_ERR_PROTOCOL) code = TC_ERR_REMOTE;
  const char *why = have > 4 ? text + 4 : "";
  tcp_notice_send(t, code, why);
  if (!why[0]) return tcp_fail(t, op, code, "peer %d failed this operation", p);
  return tcp_fail(t, op, code, "%s (as peer %d found)", why, p);
}

/* 1 if the 16 bytes at h are the header of a message of this kind (of
 * this configuration); its length in *len. */
static int tcp_is_kind(const unsigned char *h, uint32_t epoch, uint32_t kind, size_t *len) {
  uint32_t magic, word;
  uint64_t l;
  memcpy(&magic, h, 4);
  memcpy(&word, h + 4, 4);
  memcpy(&l, h + 8, 8);
  if (magic != TCP_MSG_MAGIC || TC_XFER_KIND(word) != kind ||
      TC_XFER_EPOCH(word) != (epoch & 0xffffffu))
    return 0;
  *len = (size_t)l;
  return 1;
}

/* Fingerprints peer p owes this rank (tc_tp_op_t.owed_want), read while
 * the exchange waits for something else: at most TCP_OWED_BATCH whole
 * TC_XFER_FP messages, each owed, at the front of its stream, seen in the
 * n bytes m peeked, are read with one recv and compared (a root of 8-byte
 * broadcasts at 4 ranks on 2 cores found a few dozen queued each time, and
 * read them with a peek and a recv each). *got: how many were read; *more:
 * what follows them in m, TCP_OWED_NONE (nothing whole: it may be
 * arriving), TCP_OWED_NOTICE (a notice header), TCP_OWED_OTHER (anything
 * else: for a later exchange). TC_ERR_PROTOCOL with a mismatch (the others
 * told). */
enum { TCP_OWED_BATCH = 32, TCP_OWED_MSG = TCP_HDR + sizeof(tc_opfp_t) };
enum { TCP_OWED_NONE, TCP_OWED_NOTICE, TCP_OWED_OTHER };
/* 1 if the header at h starts the j-th oldest fingerprint p owes. */
static int tcp_owed_at(const tcp_t *t, int p, const tc_tp_op_t *op, const unsigned char *h,
                       size_t j) {
  size_t len = 0;
  return op->owed_want && tcp_is_kind(h, t->epoch, TC_XFER_FP, &len) &&
         len == sizeof(tc_opfp_t) && op->owed_want(op->owed_arg, p, (uint32_t)j);
}
static int tcp_read_owed(tcp_t *t, int p, const tc_tp_op_t *op, unsigned char *m, size_t n,
                         size_t *got, int *more) {
  const size_t M = TCP_OWED_MSG;
  size_t j = 0, len = 0;
  *got = 0;
  while (j < TCP_OWED_BATCH && (j + 1) * M <= n && tcp_owed_at(t, p, op, m + j * M, j)) j++;
  const size_t at = j * M;
  *more = n - at < TCP_HDR                                        ? TCP_OWED_NONE
          : tcp_is_kind(m + at, t->epoch, TC_XFER_NOTICE, &len) ? TCP_OWED_NOTICE
          : n - at < M && tcp_owed_at(t, p, op, m + at, j)
              ? TCP_OWED_NONE /* an owed one, not whole yet: at a later round */
              : TCP_OWED_OTHER;
  if (!j) return TC_OK;
  ssize_t r;
  do r = recv(t->fd[p], m, at, MSG_DONTWAIT); /* what was peeked (the same bytes) */
  while (r < 0 && errno == EINTR);
  if (r != (ssize_t)at) /* what was peeked is there: cannot be */
    return tcp_fail(t, op, TC_ERR_SYSTEM, "could not read peer %d's fingerprints (%s)", p,
                    r < 0 ? strerror(errno) : "short read");
  char why[400];
  int bad = 0;
  for (size_t i = 0; i < j && !bad; i++) {
    const tc_opfp_t *want = op->owed_want(op->owed_arg, p, (uint32_t)i);
    /* the current collective's own: found now, not later */
    const int now = op->fp && op->fp->seq == want->seq;
    tc_xfer_t x = {.peer = p, .kind = TC_XFER_FP, .buf = m + i * M + TCP_HDR,
                   .len = sizeof(tc_opfp_t), .fp_want = now ? NULL : want};
    bad = tc__xfer_fp_problem(&x, op, t->rank, why, sizeof why);
  }
  op->owed_read(op->owed_arg, p, (uint32_t)j); /* out of the stream, all of them */
  if (bad) {
    tcp_notice_send(t, TC_ERR_PROTOCOL, why);
    return tcp_fail(t, op, TC_ERR_PROTOCOL, "%s", why);
  }
  *got = j;
  return TC_OK;
}

/* A peer with nothing pending in this exchange sent something: a notice
 * fails the exchange; fingerprints it owes are read (tcp_read_owed);
 * anything else is for a later exchange and is left unread (the peer is
 * not watched for input again in this exchange). One peek shows a
 * header, or the fingerprints owed that are there and what follows. */
static int tcp_peek_notice(tcp_t *t, int p, const tc_tp_op_t *op) {
  unsigned char m[TCP_OWED_BATCH * TCP_OWED_MSG + TCP_HDR];
  size_t len = 0;
  ssize_t n;
  for (;;) {
    do n = recv(t->fd[p], m, op->owed_want ? sizeof m : TCP_HDR, MSG_PEEK | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n < (ssize_t)TCP_HDR) return TC_OK;
    if (tcp_is_kind(m, t->epoch, TC_XFER_NOTICE, &len)) {
      do n = recv(t->fd[p], m, TCP_HDR, MSG_DONTWAIT); /* consumes the header */
      while (n < 0 && errno == EINTR);
      char text[TC_XFER_NOTICE_MAX + 1];
      return tcp_notice_got(t, op, p, text, 0, len);
    }
    size_t got;
    int more, rc = tcp_read_owed(t, p, op, m, (size_t)n, &got, &more);
    if (rc != TC_OK) return rc;
    if (got == TCP_OWED_BATCH || (got && more == TCP_OWED_NOTICE)) continue;
    if (more == TCP_OWED_OTHER) t->quiet[p] = 1; /* else: the rest at a later round */
    return TC_OK;
  }
}

/* Checks a received header against what the transfer expects. */
static int tcp_check_hdr(tcp_t *t, const tc_tp_op_t *op, const tc_xfer_t *x) {
  char why[256];
  if (tc__xfer_hdr_problem((const char *)x->hdr, TCP_MSG_MAGIC, t->epoch, x, op->opname, why,
                           sizeof why)) {
    /* a TC_XFER_LEFT notice: the peer is gone, not confused ("Hang-ups") */
    tc_xfer_t left = {.peer = x->peer, .kind = TC_XFER_LEFT};
    char no[8];
    int gone = !tc__xfer_hdr_problem((const char *)x->hdr, TCP_MSG_MAGIC, t->epoch, &left,
                                     op->opname, no, sizeof no);
    if (gone) t->hup[x->peer] = TCP_HUP_LEFT;
    return tcp_fail(t, op, gone ? TC_ERR_REMOTE : TC_ERR_PROTOCOL, "%s", why);
  }
  return TC_OK;
}

/* ------------------------------------------------------------------------ */
/* Exchange                                                                  */
/* ------------------------------------------------------------------------ */

/* Moves as many bytes as the socket takes (or has) for the chain of
 * transfers of one peer and direction starting at *head; advances *head past
 * completed transfers and decrements *remaining. TC_OK when the socket would
 * block or the chain is done. */
static int tcp_progress(tcp_t *t, tc_xfer_t *x, int *head, int is_send,
                        size_t *remaining, const tc_tp_op_t *op) {
  while (*head >= 0) {
    struct iovec iov[TCP_MAX_IOV];
    int niov = 0, peer = x[*head].peer, fd = t->fd[peer];
    /* the peer's queue of lazy sends goes first, in the same call (an
     * interior rank of a broadcast queues its fingerprint for a child in
     * the exchange that receives, then sends the data in the next) */
    size_t qlen = 0;
    if (is_send && t->oq && t->oq_len[peer]) {
      qlen = t->oq_len[peer] - t->oq_off[peer];
      iov[niov++] = (struct iovec){t->oq[peer] + t->oq_off[peer], qlen};
    }
    for (int k = *head; k >= 0 && niov + 2 <= TCP_MAX_IOV; k = x[k].next) {
      tc_xfer_t *xf = &x[k];
      if (xf->done < TCP_HDR) {
        iov[niov++] = (struct iovec){xf->hdr + xf->done, TCP_HDR - xf->done};
        if (xf->len) iov[niov++] = (struct iovec){xf->buf, xf->len};
      } else {
        size_t off = xf->done - TCP_HDR;
        iov[niov++] = (struct iovec){(char *)xf->buf + off, xf->len - off};
      }
    }
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
    ssize_t n = is_send ? sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT)
                        : recvmsg(fd, &mh, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return TC_OK;
      int err = errno;
      if (t->gone[peer] && is_send) { /* it said goodbye: nothing to deliver */
        if (qlen) t->oq_len[peer] = t->oq_off[peer] = t->oq_weight[peer] = 0;
        while (*head >= 0) {
          (*remaining)--;
          *head = x[*head].next;
        }
        return TC_OK;
      }
      return tcp_dead(t, op, peer, err);
    }
    if (n == 0) return tcp_dead(t, op, peer, 0); /* EOF (recv only) */
    size_t left = (size_t)n;
    if (qlen) {
      if (left < qlen) { /* the socket is full */
        t->oq_off[peer] += (uint32_t)left;
        return TC_OK;
      }
      t->oq_len[peer] = t->oq_off[peer] = t->oq_weight[peer] = 0;
      left -= qlen;
    }
    while (left > 0 && *head >= 0) {
      tc_xfer_t *xf = &x[*head];
      size_t total = TCP_HDR + xf->len, take = total - xf->done;
      if (take > left) take = left;
      size_t before = xf->done;
      xf->done += take;
      left -= take;
      size_t nlen = 0;
      if (!is_send && before < TCP_HDR && xf->done >= TCP_HDR &&
          tcp_is_kind(xf->hdr, t->epoch, TC_XFER_NOTICE, &nlen)) {
        /* its text follows the header in this read (the iovecs put it in
         * the transfer's buffer and beyond), the rest is in the socket */
        char text[TC_XFER_NOTICE_MAX + 1];
        size_t at = (size_t)n - left - take + (TCP_HDR - before); /* the header's end */
        size_t want = nlen < TC_XFER_NOTICE_MAX ? nlen : TC_XFER_NOTICE_MAX;
        size_t have = 0, avail = (size_t)n - at;
        if (want > avail) want = avail;
        for (int i = 0; i < niov && have < want; i++) {
          size_t il = iov[i].iov_len;
          if (at >= il) {
            at -= il;
            continue;
          }
          size_t c = il - at < want - have ? il - at : want - have;
          memcpy(text + have, (const char *)iov[i].iov_base + at, c);
          have += c;
          at = 0;
        }
        return tcp_notice_got(t, op, xf->peer, text, have, nlen);
      }
      if (!is_send && before < TCP_HDR && xf->done >= TCP_HDR) {
        int rc = tcp_check_hdr(t, op, xf);
        if (rc != TC_OK) return rc;
        t->heard[peer] = op->coll;
      }
      if (xf->done < total) break;
      if (!is_send && xf->kind == TC_XFER_GOODBYE) t->gone[peer] = 1;
      char why[400];
      if (!is_send && tc__xfer_fp_problem(xf, op, t->rank, why, sizeof why)) {
        tcp_notice_send(t, TC_ERR_PROTOCOL, why); /* the ranks that do not exchange with it */
        return tcp_fail(t, op, TC_ERR_PROTOCOL, "%s", why);
      }
      (*remaining)--;
      *head = xf->next;
    }
    /* a short transfer means the socket is full / drained: go back to poll */
    size_t asked = 0;
    for (int i = 0; i < niov; i++) asked += iov[i].iov_len;
    if ((size_t)n < asked) return TC_OK;
  }
  return TC_OK;
}

static int tcp_timeout(tcp_t *t, tc_xfer_t *x, size_t nx, const tc_tp_op_t *op) {
  char list[400], conn[400] = "";
  (void)nx;
  tc__xfer_pending_text(list, sizeof list, x, t->send_head, t->recv_head,
                        t->size, TCP_HDR);
  for (int p = 0; p < t->size && !conn[0]; p++) /* the first peer not connected */
    if ((t->send_head[p] >= 0 || t->recv_head[p] >= 0) && t->fd[p] < 0)
      tc__tcp_cx_describe(t, p, conn, sizeof conn);
  return tcp_fail(t, op, TC_ERR_TIMEOUT, "timed out after %g s; still waiting on %s%s",
                  op->timeout_s, list, conn);
}

/* A peer hung up while the exchange still needs it. A rank that found a
 * mismatch of collectives fails, and often exits, at once: its hang-up can
 * reach this rank before the fingerprint that explains it, which another
 * peer sent ahead of everything else and which is already in its socket.
 * The cause is reported rather than its consequence: the fingerprints
 * waiting from the other peers are read (no waiting) before the dead peer. */
static int tcp_dead_or_cause(tcp_t *t, tc_xfer_t *x, const tc_tp_op_t *op, int dead,
                             int dead_err, size_t *remaining) {
  for (int p = 0; p < t->size && op->fp; p++) {
    int k = t->recv_head[p];
    if (p == dead || k < 0 || x[k].kind != TC_XFER_FP) continue;
    int rc = tcp_progress(t, x, &t->recv_head[p], 0, remaining, op);
    if (rc == TC_ERR_PROTOCOL) return rc; /* op->msg names the mismatch */
  }
  return tcp_dead(t, op, dead, dead_err);
}

static int tcp_exchange(void *vtp, tc_xfer_t *x, size_t nx, const tc_tp_op_t *op) {
  tcp_t *t = vtp;
  int rc;
  size_t lazy = 0; /* lazy sends queued: done */
  if (nx == 0) return TC_OK;
  for (int p = 0; p < t->size; p++)
    t->send_head[p] = t->send_tail[p] = t->recv_head[p] = t->recv_tail[p] = -1;
  memset(t->quiet, 0, (size_t)t->size);
  for (size_t i = 0; i < nx; i++) {
    tc_xfer_t *xf = &x[i];
    if (xf->peer < 0 || xf->peer >= t->size || xf->peer == t->rank)
      return tcp_fail(t, op, TC_ERR_INTERNAL,
                      "internal error: transfer to invalid peer %d", xf->peer);
    if (t->hup[xf->peer] == TCP_HUP_LEFT) /* see "Hang-ups" */
      return tcp_fail(t, op, TC_ERR_REMOTE, "peer %d left the communicator (destroyed or "
                      "aborted it without finalize) before its part of this operation (it "
                      "issued fewer operations than this rank?)", xf->peer);
    if (t->fd[xf->peer] < 0 && (rc = tc__tcp_cx_want(t, xf->peer, op)) != TC_OK)
      return rc; /* lazy: the first transfer with this peer connects it */
    xf->done = 0;
    xf->next = -1;
    if (xf->is_send && xf->lazy && tcp_oq_put(t, xf)) {
      xf->done = TCP_HDR + xf->len;
      lazy++;
      continue;
    }
    if (xf->is_send) tcp_put_hdr(xf->hdr, xf->kind, t->epoch, xf->len);
    int *head = xf->is_send ? t->send_head : t->recv_head;
    int *tail = xf->is_send ? t->send_tail : t->recv_tail;
    if (tail[xf->peer] < 0) head[xf->peer] = (int)i;
    else x[tail[xf->peer]].next = (int)i;
    tail[xf->peer] = (int)i;
  }
  size_t remaining = nx - lazy;
  /* optimistic first pass: most small messages go out without a poll */
  for (int p = 0; p < t->size; p++)
    if (t->send_head[p] >= 0 && t->fd[p] >= 0 &&
        (rc = tcp_progress(t, x, &t->send_head[p], 1, &remaining, op)) != TC_OK)
      return rc;
  for (int p = 0; p < t->size; p++)
    if (t->recv_head[p] >= 0 && t->fd[p] >= 0 &&
        (rc = tcp_progress(t, x, &t->recv_head[p], 0, &remaining, op)) != TC_OK)
      return rc;

  int slept = 0; /* this exchange went to sleep: the queues go at each round */
  while (remaining > 0) {
    if (atomic_load(t->aborted))
      return tcp_fail(t, op, TC_ERR_ABORTED, "communicator was aborted");
    if (t->oq_any && slept) tcp_oq_flush_all(t); /* nobody waits on what this rank queued */
    double left = op->deadline - tc__now();
    if (left <= 0) return tcp_timeout(t, x, nx, op);
    int np = 0;
    t->pfd[np] = (struct pollfd){.fd = t->wake_fd, .events = POLLIN};
    t->pfd_peer[np++] = TCP_PFD_WAKE;
    for (int p = 0; p < t->size; p++) {
      if (t->fd[p] < 0) continue;
      short ev = 0;
      if (t->send_head[p] >= 0 || (slept && t->oq && t->oq_len[p])) ev |= POLLOUT;
      if (t->recv_head[p] >= 0) ev |= POLLIN;
      /* a peer with nothing pending: its failure notice, if it sends one */
      else if (!t->quiet[p] && !t->gone[p] && !t->hup[p]) ev |= POLLIN;
      if (!t->gone[p] && (!t->hup[p] || (t->hup[p] == TCP_HUP_DONE && !tcp_may_hang_up(t, p, op))))
        ev |= POLLRDHUP;
      else if (!ev) continue; /* said goodbye, or left: no liveness check */
      t->pfd[np] = (struct pollfd){.fd = t->fd[p], .events = ev};
      t->pfd_peer[np++] = p;
    }
    int ms = (int)(left * 1000.0) + 1;
    if (ms > TCP_POLL_CAP_MS) ms = TCP_POLL_CAP_MS;
    int npeers = np; /* then the connector's sockets (lazy): the listening
                      * one always, so a peer that needs this rank is
                      * accepted whatever this exchange waits for */
    if (t->cx && (rc = tc__tcp_cx_fill(t, &np, &ms, op)) != TC_OK) return rc;
    int r = 0;
    if (t->poll_spin_s > 0) { /* a short busy poll may save the sleep/wake-up */
      double until = tc__now() + t->poll_spin_s;
      while ((r = poll(t->pfd, (nfds_t)np, 0)) == 0 && tc__now() < until) {
      }
    }
    if (t->poll_yield_s > 0) { /* more ranks than cores: the core goes to them */
      double until = tc__now() + t->poll_yield_s;
      while ((r = poll(t->pfd, (nfds_t)np, 0)) == 0 && tc__now() < until) sched_yield();
    }
    if (r == 0 && !slept) { /* "Lazy sends": the queues before the sleep */
      slept = 1;
      if (t->oq_any) tcp_oq_flush_all(t);
      if (t->oq_any) continue; /* a full socket: the next round polls it for room */
    }
    if (r == 0) r = poll(t->pfd, (nfds_t)np, ms);
    if (r < 0) {
      if (errno == EINTR) continue;
      return tcp_fail(t, op, TC_ERR_SYSTEM, "poll failed: %s", strerror(errno));
    }
    if (r == 0) continue;
    /* a hang-up fails the exchange unless this very round completed it, or
     * nothing is pending with that peer and it may leave ("Hang-ups") */
    int dead = -1, dead_err = 0;
    for (int i = 1; i < npeers; i++) {
      short re = t->pfd[i].revents;
      int p = t->pfd_peer[i];
      if (!re) continue;
      if (t->recv_head[p] >= 0 && (re & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)) &&
          (rc = tcp_progress(t, x, &t->recv_head[p], 0, &remaining, op)) != TC_OK)
        return rc;
      if (t->send_head[p] >= 0 && (re & (POLLOUT | POLLHUP | POLLERR)) &&
          (rc = tcp_progress(t, x, &t->send_head[p], 1, &remaining, op)) != TC_OK)
        return rc;
      if (t->send_head[p] < 0 && (re & POLLOUT) && t->oq && t->oq_len[p])
        (void)tcp_oq_flush(t, p);
      if (t->recv_head[p] < 0 && (re & POLLIN) && !t->quiet[p] &&
          (rc = tcp_peek_notice(t, p, op)) != TC_OK)
        return rc;
      if (t->gone[p] || dead >= 0 || !(re & (POLLERR | POLLHUP | POLLRDHUP))) continue;
      if (t->send_head[p] < 0 && t->recv_head[p] < 0 && tcp_hup_ok(t, p, op)) continue;
      dead = p;
      if (re & POLLERR) dead_err = tc__tcp_sock_error(t->fd[p]);
    }
    if (dead >= 0 && remaining > 0) return tcp_dead_or_cause(t, x, op, dead, dead_err, &remaining);
    if (np > npeers) tc__tcp_cx_events(t, npeers, np);
  }
  return TC_OK;
}

static int tcp_goodbye(void *vtp, const tc_tp_op_t *op) {
  tcp_t *t = vtp;
  size_t n = 0;
  for (int p = 0; p < t->size; p++) {
    if (p == t->rank || t->fd[p] < 0) continue;
    t->bye[n] = tc__xfer_send(p, NULL, 0);
    t->bye[n++].kind = TC_XFER_GOODBYE;
    t->bye[n] = tc__xfer_recv(p, NULL, 0);
    t->bye[n++].kind = TC_XFER_GOODBYE;
  }
  return tcp_exchange(t, t->bye, n, op);
}

void tc__tcp_leave(void *vtp) {
  tcp_t *t = vtp;
  if (!t || !t->fd) return;
  unsigned char h[TCP_HDR];
  tcp_put_hdr(h, TC_XFER_LEFT, t->epoch, 0);
  for (int p = 0; p < t->size; p++) {
    int fd = t->fd[p];
    if (fd < 0 || t->gone[p]) continue;
    if (!tcp_oq_clear(t, p)) { /* part of its queue went: end the stream there */
      shutdown(fd, SHUT_WR);
      continue;
    }
    ssize_t n; /* a notice cut short by a full socket reads as data: also no failure */
    do n = send(fd, h, sizeof h, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    /* closing a socket with unread data sends a reset, which can discard
     * what this rank sent and the peer has not read yet: end the stream
     * with a FIN instead, and drop what the peer sent (best effort: data
     * that arrives after the drain still resets; it was not for us) */
    shutdown(fd, SHUT_WR);
    char sink[4096];
    for (int i = 0; i < 256 && recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; i++) {
    }
  }
}

void tc__tcp_close(void *vtp) {
  tcp_t *t = vtp;
  if (!t) return;
  tc__tcp_cx_free(t);
  if (t->fd)
    for (int p = 0; p < t->size; p++)
      if (t->fd[p] >= 0) close(t->fd[p]);
  free(t->fd);
  free(t->gone);
  free(t->hup);
  free(t->heard);
  free(t->send_head);
  free(t->send_tail);
  free(t->recv_head);
  free(t->recv_tail);
  free(t->pfd);
  free(t->pfd_peer);
  free(t->bye);
  if (t->oq)
    for (int p = 0; p < t->size; p++) free(t->oq[p]);
  free(t->oq);
  free(t->oq_len);
  free(t->oq_off);
  free(t->oq_weight);
  free(t->host_id);
  free(t->quiet);
  free(t);
}

/* tc_transport_ops_t.describe */
static void tcp_describe(void *tp, char *buf, size_t len) {
  const tcp_t *t = tp;
  char local[32] = "?";
  if (t->local >= 0) snprintf(local, sizeof local, "%d", t->local);
  int conn = 0;
  for (int p = 0; p < t->size; p++) conn += t->fd[p] >= 0;
  snprintf(buf, len, "tcp: a socket per peer, %s (%d of %d peers connected), %s of %d "
           "ranks on this machine; busy-poll %g us, poll and yield %g us, then sleep in poll",
           t->cx ? "connected on first use" : "every pair connected", conn, t->size - 1,
           local, t->size, t->poll_spin_s * 1e6, t->poll_yield_s * 1e6);
}

const tc_transport_ops_t tc__tcp_transport = {
    .name = "tcp",
    .create = tc__tcp_create,
    .exchange = tcp_exchange,
    .goodbye = tcp_goodbye,
    .close = tc__tcp_close,
    .leave = tc__tcp_leave,
    .describe = tcp_describe,
};

double tc__tcp_poll_spin_s(const tc_transport_ops_t *ops, void *tp) {
  return ops == &tc__tcp_transport && tp ? ((const tcp_t *)tp)->poll_spin_s : 0;
}

const uint64_t *tc__tcp_host_ids(const tc_transport_ops_t *ops, void *tp) {
  return ops == &tc__tcp_transport && tp ? ((const tcp_t *)tp)->host_id : NULL;
}

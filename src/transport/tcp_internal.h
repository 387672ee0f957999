/* tcp_internal.h -- state shared by the two halves of the TCP transport:
 * tcp.c (messages, exchange, goodbye, close) and tcp_connect.c (the
 * authenticated full mesh). Not for use outside src/transport/. */
#ifndef TC_TRANSPORT_TCP_INTERNAL_H
#define TC_TRANSPORT_TCP_INTERNAL_H

#include <poll.h>

#include "transport/tcp.h"

#define TCP_MSG_MAGIC 0x314d4354u   /* "TCM1" */
#define TCP_HDR 16u
#define TCP_HELLO TC__TCP_HELLO_BYTES
#define TCP_POLL_CAP_MS 100 /* abort flags are re-checked at least this often */
#define TCP_MAX_IOV 16
#define TCP_MAX_PENDING 64 /* unauthenticated incoming connections */
/* Ranks of one communicator: a rank keeps a few hundred bytes per peer
 * (socket, state, address once read), 65536 peers about 30 MB */
#define TC__TCP_MAX_RANKS 65536

/* tcp_t.hup: why a peer's hang-up did not fail the exchange that saw it */
#define TCP_HUP_LEFT 1 /* its stream ends with a TC_XFER_LEFT notice */
#define TCP_HUP_DATA 2 /* unread messages precede the end of its stream */
#define TCP_HUP_DONE 3 /* it closed after its part of creation or of a collective */

typedef struct tcp_cx tcp_cx_t; /* tcp_connect.c: connections being made */

typedef struct tcp {
  const tc_backend_host_t *host;
  char name[128];
  int rank, size;
  int *fd;                /* [size]; -1 for self and for peers not connected
                           * yet (lazy: connected on first use) */
  unsigned char *gone;    /* [size]; goodbye received: may close any time */
  unsigned char *hup;     /* [size]; TCP_HUP_*: hung up while nothing was
                           * pending with it (tcp.c, "Hang-ups") */
  int *send_head, *send_tail, *recv_head, *recv_tail; /* [size] per exchange */
  struct pollfd *pfd;     /* [npfd]: the peers, the wake fd and the
                           * connector's sockets */
  int *pfd_peer;          /* [npfd]: peer, or TCP_PFD_* */
  int npfd;
  tc_xfer_t *bye;         /* [2 * size] goodbye transfers */
  int wake_fd;
  atomic_int *aborted;
  double spin_s;      /* shared memory's busy-wait budget (tc__mesh_spin_policy, mesh.c) */
  double poll_spin_s; /* TCP: busy-poll the sockets this long before sleeping
                       * in poll (TORCHCOMMS_CPU_TCP_SPIN_US, default spin_s) */
  double poll_yield_s; /* then, with more ranks on this machine than cores,
                        * poll and sched_yield this long (TORCHCOMMS_CPU_YIELD_US,
                        * as shared memory; tcp.c, tcp_exchange) */
  double timeout_s; /* the creation deadline's length, for messages */
  int noticed;       /* a mismatch notice was sent to every peer */
  unsigned char *quiet; /* [size]: this exchange saw early data from the peer */
  uint64_t *heard;      /* [size]: the collective (tc_tp_op_t.coll) of the
                         * last message received from the peer */
  int local;     /* ranks of this communicator on this machine (-1: unknown) */
  uint64_t *host_id; /* [size]: a hash of each rank's host name and boot id */
  tcp_cx_t *cx;  /* lazy: the listening socket and the connections being
                  * made; NULL once every peer is connected (eager) */
  /* [size] each, allocated at first use: whole messages of lazy sends
   * (tc_xfer_t.lazy) not written yet, bytes oq_off .. oq_len of oq[p];
   * written before anything else to that peer, before an exchange sleeps,
   * once TCP_OQ_FLUSH bytes or TCP_OQ_WEIGHT of their weight (tc_xfer_t.lazy)
   * wait, and when leaving (tcp.c, "Lazy sends") */
  unsigned char **oq;
  uint32_t *oq_len, *oq_off, *oq_weight;
  int oq_any; /* some queue may hold bytes */
  unsigned char token[16]; /* the communicator's random token */
  uint32_t epoch;          /* the configuration, in every header and hello */
} tcp_t;

/* pfd_peer values that are not peers */
#define TCP_PFD_WAKE (-1)
#define TCP_PFD_CX (-2) /* a connector socket: tc__tcp_cx_event */

/* tcp_connect.c: creates the transport (tc_transport_ops_t.create): the
 * token, this rank's listening socket and published address, and an
 * all-gather of every rank's host (which also connects the all-gather's
 * partners). Lazy (the default): a peer is connected the first time an
 * exchange has a transfer with it; TORCHCOMMS_CPU_EAGER=1 connects every
 * pair first. */
TC_INTERNAL int tc__tcp_create(const tc_tp_args_t *a, void **out, char *err,
                               size_t errlen);
/* tcp_connect.c: connects every peer not yet connected (the shared-memory
 * transport's liveness channel needs them all; TORCHCOMMS_CPU_EAGER=1)
 * within the deadline: the higher rank of each pair connects. */
TC_INTERNAL int tc__tcp_connect_all(tcp_t *t, double deadline, char *err, size_t errlen);
/* tcp_connect.c: creation is complete: every rank published its address
 * (a missing one now means the peer left). */
TC_INTERNAL void tc__tcp_cx_created(tcp_t *t);
/* tcp_connect.c: an exchange needs peer p, not connected yet: starts
 * connecting (reads its address from the store the first time). TC_OK, or
 * an error with op->msg set. */
TC_INTERNAL int tc__tcp_cx_want(tcp_t *t, int p, const tc_tp_op_t *op);
/* tcp_connect.c: appends the connector's sockets to t->pfd (pfd_peer
 * TCP_PFD_CX and below) from index *np, starting the connects that are
 * due; lowers *ms to its next timer. TC_OK, or TC_ERR_REMOTE with op->msg
 * set when a wanted peer refused the connection (it is gone). */
TC_INTERNAL int tc__tcp_cx_fill(tcp_t *t, int *np, int *ms, const tc_tp_op_t *op);
/* tcp_connect.c: handles the events of t->pfd[from..to) that are the
 * connector's (accepts, hellos, connects). A connect refused is reported
 * by the next tc__tcp_cx_fill. */
TC_INTERNAL void tc__tcp_cx_events(tcp_t *t, int from, int to);
/* tcp_connect.c: " (not connected: ...)" for a timeout message. */
TC_INTERNAL void tc__tcp_cx_describe(const tcp_t *t, int p, char *buf, size_t len);
/* tcp_connect.c: frees the connector (closes its sockets). */
TC_INTERNAL void tc__tcp_cx_free(tcp_t *t);
/* tcp.c: the pending error of a socket (SO_ERROR), or errno. */
TC_INTERNAL int tc__tcp_sock_error(int fd);
/* tcp.c: a zero-timeout check of every connection whose peer has not said
 * goodbye (the shared-memory transport's liveness channel): TC_OK, or
 * TC_ERR_REMOTE with op->msg naming the lost peer(s), like an exchange. */
TC_INTERNAL int tc__tcp_check_alive(tcp_t *t, const tc_tp_op_t *op);
/* tcp.c: tc_transport_ops_t.leave: a TC_XFER_LEFT notice to every peer that
 * has not said goodbye, then a half-close (FIN after it) and a drain of what
 * they sent, so that the close that follows sends no reset. */
TC_INTERNAL void tc__tcp_leave(void *t);
/* tcp.c: 1 if peer p has left (TCP_HUP_LEFT, or DATA: for the shared-memory
 * transport, whose sockets carry nothing after setup, a cut-off notice). */
static inline int tc__tcp_left(const tcp_t *t, int p) {
  return t->hup[p] == TCP_HUP_LEFT || t->hup[p] == TCP_HUP_DATA;
}
/* tcp.c: closes every socket and frees t (also for a half-built t). */
TC_INTERNAL void tc__tcp_close(void *t);

#endif /* TC_TRANSPORT_TCP_INTERNAL_H */

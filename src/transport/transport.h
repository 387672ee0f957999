/* transport.h -- the transport seam of the cpu backend.
 *
 * A transport connects the ranks of one communicator and moves messages
 * between them. Its one data primitive is the *exchange*: a set of transfers
 * {peer, send|recv, buffer, length} progressed together until all are done,
 * the deadline passes, the communicator is aborted, or a peer fails. The
 * algorithms of the cpu backend are written only against this interface;
 * two transports implement it: TCP (tcp.h) and shared memory (shm.h).
 *
 * Semantics every transport provides:
 *  - Messages between a pair of ranks, in one direction, are matched in the
 *    order they were posted (stream FIFO), within and across exchanges.
 *  - Every message carries its length; a receive whose length differs from
 *    the message's is reported as TC_ERR_PROTOCOL, naming the peer and both
 *    sizes, instead of corrupting the stream.
 *  - A zero-length message is a real message (header only).
 *  - Waiting spins at most briefly, then sleeps (poll / futex); abort wakes
 *    it at once; every wait has the operation's deadline.
 *  - Error texts name the operation, the communicator, the rank, the world
 *    size and the peer.
 */
#ifndef TC_TRANSPORT_H
#define TC_TRANSPORT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"

/* Message kinds on the wire: the low 8 bits of a header's second word;
 * the upper 24 carry the communicator's epoch (tc_tp_args_t.epoch), so a
 * message of another configuration of the communicator is never taken
 * for one of this configuration (tc__xfer_hdr_problem reports it). */
#define TC_XFER_WORD(kind, epoch) ((uint32_t)(kind) | ((uint32_t)(epoch) & 0xffffffu) << 8)
#define TC_XFER_KIND(word) ((uint32_t)(word) & 0xffu)
#define TC_XFER_EPOCH(word) ((uint32_t)(word) >> 8)
/* Message kinds on the wire. */
#define TC_XFER_DATA 1u    /* a message of an operation */
#define TC_XFER_GOODBYE 2u /* sent by finalize; nothing follows it */
#define TC_XFER_FP 3u      /* a tc_opfp_t: the collective the sender starts */

/* The fingerprint of a collective operation, compared across the ranks
 * before any result is delivered (mismatch detection): over TCP every rank
 * sends its fingerprint to every peer ahead of the operation's first
 * message (one TC_XFER_FP message per peer, in the same socket writes), and
 * the transport compares each peer's with the own (tc_tp_op_t.fp) as it
 * arrives; over shared memory it is part of the slot header every rank
 * publishes at the operation's first sync point. */
typedef struct tc_opfp {
  uint64_t seq;   /* collectives on this communicator: 1, 2, ... */
  uint64_t count; /* elements (per rank where the op has a per-rank count) */
  uint8_t op;     /* tc_op_type_t */
  uint8_t dtype;  /* tc_dtype_t */
  uint8_t redop;  /* tc_redop_type_t, or TC_OPFP_NO_REDOP */
  uint8_t flags;  /* TC_OPFP_* */
  int32_t root;   /* -1 when the operation has none */
} tc_opfp_t;
_Static_assert(sizeof(tc_opfp_t) == 24, "fingerprint layout");
#define TC_OPFP_NO_REDOP 0xffu
#define TC_OPFP_COUNTS_HASHED 0x1u   /* count is a hash of the per-rank counts */
#define TC_OPFP_COUNTS_PER_PEER 0x2u /* counts differ per pair (all_to_all_v):
                                      * not compared; message lengths are */

/* Writes "all_reduce #17 of 1024 float32 with sum" into buf. */
TC_INTERNAL void tc__opfp_describe(const tc_opfp_t *f, char *buf, size_t len);
/* 0 if they agree; else 1 with "mismatched collectives: rank 0 calls ...,
 * rank 1 calls ...; ..." in why. */
TC_INTERNAL int tc__opfp_mismatch(const tc_opfp_t *mine, int rank, const tc_opfp_t *theirs,
                                  int peer, char *why, size_t wl);
/* Sent (TCP only, header only) by a rank that destroys or aborts its
 * communicator while no operation of it is in flight and none failed
 * (tc_transport_ops_t.leave): every operation it completed stands, nothing
 * more will come from it, and nothing follows. See tcp.c, "Hang-ups". */
#define TC_XFER_LEFT 0x10u
/* Sent (TCP only) by a rank that found a mismatch of collectives or lost a
 * peer, to every peer it is connected to, and passed on by each peer that
 * receives it (once per rank): a lazy mesh connects a rank only to the
 * peers its algorithms use, and this tells the others at once. Its payload
 * is the status (int32: TC_ERR_PROTOCOL or TC_ERR_REMOTE) and the text of
 * the failure (at most TC_XFER_NOTICE_MAX bytes in all); the receiver fails
 * its operation with them, "(as peer p found)". */
#define TC_XFER_NOTICE 0x11u
#define TC_XFER_NOTICE_MAX 1024u

/* One transfer of an exchange. Fill the public fields (tc__xfer_send /
 * tc__xfer_recv); the rest belongs to the transport. */
typedef struct tc_xfer {
  int peer;
  int is_send;
  uint32_t kind; /* TC_XFER_DATA, or TC_XFER_GOODBYE (len 0) */
  void *buf;     /* read-only for sends */
  size_t len;    /* bytes */
  /* a received TC_XFER_FP: compared with this fingerprint instead of the
   * exchange's (tc_tp_op_t.fp): one an earlier collective is owed (the
   * root of a broadcast reads its receivers' later); NULL: the exchange's */
  const tc_opfp_t *fp_want;
  /* > 0: a small send that may wait in a queue (TCP) and go with the next
   * message to its peer, before this rank sleeps in a wait, or once a few
   * are queued; complete when queued. For the fingerprint a peer reads
   * later (backends/cpu/backend.c, "Fingerprints owed"); the value is what
   * that peer counts for it against its bound (CPU_OWED_BYTES), so that
   * the queue goes out before the peer has to wait for it (tcp.c, "Lazy
   * sends") */
  uint32_t lazy;
  /* private to the transport */
  size_t done;  /* bytes moved, header included */
  int next;     /* next transfer of the same peer and direction, or -1 */
  unsigned char hdr[16];
} tc_xfer_t;

static inline tc_xfer_t tc__xfer_send(int peer, const void *buf, size_t len) {
  tc_xfer_t x = {.peer = peer, .is_send = 1, .kind = TC_XFER_DATA,
                 .buf = (void *)(uintptr_t)buf, .len = len};
  return x;
}
static inline tc_xfer_t tc__xfer_recv(int peer, void *buf, size_t len) {
  tc_xfer_t x = {.peer = peer, .is_send = 0, .kind = TC_XFER_DATA,
                 .buf = buf, .len = len};
  return x;
}

/* What one exchange is done for: names for messages, and the deadline. */
typedef struct tc_tp_op {
  const char *opname; /* "all_reduce" */
  double deadline;    /* absolute, on the tc__now() clock */
  double timeout_s;   /* the operation's timeout, for messages */
  char *msg;          /* out: one sentence on failure */
  size_t msglen;
  /* this rank's fingerprint: a received TC_XFER_FP message (its transfer's
   * buf) is compared with it as soon as it is complete; NULL: no check */
  const tc_opfp_t *fp;
  /* 1 for the final barrier of creation (an all-to-all): a peer whose
   * transfers of this exchange are all done may close its connections (it
   * completed creation; its death is an error of the next operation). */
  int hangup_ok;
  /* the collective's sequence number (0: not a collective). A peer this
   * rank received from during the collective took part in it: its hang-up
   * with nothing pending fails neither this exchange nor the collective's
   * later ones (it may have finished its part and exited; the ranks still
   * waiting on it fail, and say so). */
  uint64_t coll;
  /* fingerprints peers owe this rank (backends/cpu/backend.c, "Fingerprints
   * owed"), read as soon as they are there: while the exchange waits, a
   * peer with nothing pending in it whose next message is a whole
   * TC_XFER_FP one is read if owed_want(owed_arg, peer, i) gives the
   * fingerprint to compare it with (i: the i-th oldest owed, from 0; NULL:
   * not that many owed), and owed_read(owed_arg, peer, k) then drops the k
   * oldest (several read with one recv). So a rank that waits on another
   * of another mind (a mismatch) finds it in what a third sent ahead of
   * time. NULL: never. */
  const tc_opfp_t *(*owed_want)(void *arg, int peer, uint32_t i);
  void (*owed_read)(void *arg, int peer, uint32_t k);
  void *owed_arg;
} tc_tp_op_t;

/* What a transport is created from (collective over the communicator). */
typedef struct tc_tp_args {
  const tc_backend_host_t *host;
  tc_store_t *store; /* prefixed per communicator */
  const char *comm_name;
  int rank;
  int size;
  const char *advertise_addr; /* address peers connect to (NULL: 127.0.0.1) */
  double timeout_s;           /* bootstrap deadline */
  int wake_fd;                /* readable once aborted; in every poll set */
  atomic_int *aborted;        /* nonzero once aborted */
  uint32_t epoch; /* the configuration (tc_backend_init_args_t.epoch): in
                   * every message header and hello */
} tc_tp_args_t;

typedef struct tc_transport_ops {
  const char *name;
  /* Connects every pair of ranks; on failure writes one sentence to err. */
  int (*create)(const tc_tp_args_t *args, void **tp, char *err, size_t errlen);
  /* Progresses x[0..nx) together. TC_OK, TC_ERR_TIMEOUT, TC_ERR_ABORTED,
   * TC_ERR_REMOTE (a peer closed or reset its connection), TC_ERR_PROTOCOL
   * (size or kind mismatch) or TC_ERR_SYSTEM, with op->msg filled in. */
  int (*exchange)(void *tp, tc_xfer_t *x, size_t nx, const tc_tp_op_t *op);
  /* The orderly close handshake: every rank sends a goodbye to every peer
   * and receives one from each; a peer whose goodbye arrived may close. */
  int (*goodbye)(void *tp, const tc_tp_op_t *op);
  /* Closes every connection and frees the transport. */
  void (*close)(void *tp);
  /* Optional, before close when the communicator is destroyed or aborted
   * with no operation in flight and none failed: tells every peer that this
   * rank leaves after the operations it completed (TC_XFER_LEFT), so that a
   * peer still finishing one of those does not fail. May be NULL. */
  void (*leave)(void *tp);
  /* Optional: wakes a wait of this transport at once (called by abort after
   * *aborted was set; never concurrently with close). May be NULL. */
  void (*interrupt)(void *tp);
  /* Optional: one line on how it was set up and how it waits, for the init
   * summary ("shm: 4194304-byte segments ...; spin 50 us, then futex").
   * May be NULL. */
  void (*describe)(void *tp, char *buf, size_t len);
} tc_transport_ops_t;

/* Which transport: TORCHCOMMS_CPU_TRANSPORT = "tcp" | "shm" | unset/"auto". */
typedef enum { TC_TP_AUTO = 0, TC_TP_TCP, TC_TP_SHM } tc_tp_choice_t;

/* Creates the transport of a communicator (shm.c): the TCP mesh, then, when
 * every rank runs on this host (same host name and boot id) and the choice
 * allows it, shared memory over it. *ops receives the table used. */
TC_INTERNAL int tc__transport_open(const tc_tp_args_t *args, tc_tp_choice_t choice,
                                   const tc_transport_ops_t **ops, void **tp,
                                   char *err, size_t errlen);

/* Checks a received message header h (magic, kind and epoch, length)
 * against the transfer x expects in configuration `epoch`; 0 if it
 * matches, else 1 with the one-sentence reason ("peer 3 sent 8 bytes but
 * 16 were expected (...)") in why. (xfer.c) */
TC_INTERNAL int tc__xfer_hdr_problem(const char *h, uint32_t want_magic, uint32_t epoch,
                                     const tc_xfer_t *x, const char *opname, char *why,
                                     size_t wl);
/* Writes "peer 1 (receiving, 10 of 64 bytes done), ..." for the transfers
 * still at the head of each peer's queues (at most four, then ", ...") into
 * buf, for timeout messages. hdr: header bytes counted in x[k].done. */
TC_INTERNAL void tc__xfer_pending_text(char *buf, size_t len, const tc_xfer_t *x,
                                       const int *send_head,
                                       const int *recv_head, int size,
                                       size_t hdr);

/* Appended to a mismatch that a small broadcast found after it returned
 * (over shared memory its root, shm_algos.c; over TCP any rank, with the
 * fingerprint of a peer it received no data from, read later:
 * tc_xfer_t.fp_want). */
#define TC_FOUND_LATER                                                          \
  " (found by a later operation: a small broadcast does not wait for the "      \
  "ranks it receives nothing from, and checks them afterwards)"

/* A received TC_XFER_FP transfer x is complete: 0 if it matches op->fp (or
 * there is nothing to compare), else 1 with the reason in why. */
static inline int tc__xfer_fp_problem(const tc_xfer_t *x, const tc_tp_op_t *op, int rank,
                                      char *why, size_t wl) {
  const tc_opfp_t *mine = x->fp_want ? x->fp_want : op->fp;
  if (x->kind != TC_XFER_FP || !mine || x->len != sizeof(tc_opfp_t)) return 0;
  tc_opfp_t theirs;
  memcpy(&theirs, x->buf, sizeof theirs);
  if (!tc__opfp_mismatch(mine, rank, &theirs, x->peer, why, wl)) return 0;
  size_t used = strlen(why);
  if (x->fp_want && used < wl) snprintf(why + used, wl - used, "%s", TC_FOUND_LATER);
  return 1;
}

#endif /* TC_TRANSPORT_H */

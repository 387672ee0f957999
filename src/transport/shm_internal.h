/* shm_internal.h -- state shared by the two halves of the shared-memory
 * transport: shm.c (rings, exchange, waits, flags) and shm_setup.c
 * (segments, the choice of transport, close). Not for use outside
 * src/transport/. */
#ifndef TC_TRANSPORT_SHM_INTERNAL_H
#define TC_TRANSPORT_SHM_INTERNAL_H

#include "transport/mesh.h"
#include "transport/shm.h"

#define SHM_MAGIC 0x314d48535443ull /* "CTSHM1" */
#define SHM_VERSION 3u /* 2: TC_SHM_SLOTS small slots, the aux word; 3: the lines */
#define SHM_LINE 64u
#define SHM_PAGE 4096u
#define SHM_NAME_PREFIX "torchcomms-"
/* Messages in a ring: a 64-byte header unit {magic, kind, length, stamp},
 * then the payload padded to 64 bytes, so that producer and consumer never
 * write one cache line and payloads are aligned; a payload of at most 40
 * bytes rides in the header unit instead (shm.c, SHM_INLINE). */
#define SHM_UNIT 64u
#define SHM_MSG_MAGIC 0x314d5354u /* "TSM1" */
#define SHM_NAP_S 0.005  /* longest futex sleep between liveness checks */
#define SHM_LIVE_S 0.004 /* peers' sockets are checked at most this often */
#define SHM_ACTIVE_SPIN_S 1e-3 /* spin of an exchange whose peers are active */
#define SHM_YIELD_S 20e-6 /* spinning longer than this yields the core each round */
#define SHM_PUB_BYTES (32u * 1024u) /* a ring position is published this often */
#define SHM_MIN_BYTES (256u * 1024u)
#define SHM_SLOT_BYTES (64u * 1024u)
#define SHM_HALF_MIN (64u * 1024u)
#define SHM_HALF_MAX (512u * 1024u)

/* The control page at the start of every segment. */
typedef struct shm_ctl {
  /* written once by the owner before any peer maps the segment */
  uint64_t magic;
  uint32_t version, rank, size, pad0;
  uint64_t total, ring_bytes, slot_bytes, half_bytes;
  unsigned char token[16];
  uint64_t self_addr; /* where the owner mapped this segment (CMA probe) */
  int32_t pid;        /* the owner's process id (CMA) */
  uint32_t pad1;
  _Alignas(64) _Atomic uint32_t bell;     /* futex word; peers ring it */
  _Alignas(64) _Atomic uint32_t sleepers; /* owner threads about to sleep */
  _Atomic uint32_t light;                 /* 1 once the owner posted without a fence (shm_post_flag) */
  _Alignas(64) _Atomic uint64_t flag;     /* the owner's sync flag */
  _Atomic uint64_t aux;                   /* beside it: read with it (tc__shm_aux) */
  _Alignas(64) char end[1];
} shm_ctl_t;

/* The two positions of the ring from one producer to the segment's owner
 * (free-running byte counters, multiples of SHM_UNIT). */
typedef struct shm_ring_ctl {
  _Alignas(64) _Atomic uint32_t head; /* written by the producer */
  _Alignas(64) _Atomic uint32_t tail; /* written by the owner (consumer) */
  /* written by the owner: its buffer (address, bytes) for the producer's
   * message number rtr >> 2, which the producer may write there itself
   * while rtr & 3 is SHM_RTR_POSTED (shm.c, "Direct delivery") */
  _Alignas(64) _Atomic uint64_t rtr;
  _Atomic uint64_t rtr_addr, rtr_len;
} shm_ring_ctl_t;

/* Who created a segment (its name carries it; shm_sweep.c). */
typedef struct tc_shm_owner {
  int32_t pid;
  uint32_t pad;
  uint64_t start; /* start time in clock ticks since boot (0: unknown) */
  uint64_t pidns; /* inode of its pid namespace (0: unknown) */
} tc_shm_owner_t;

struct tc_shm {
  tc_mesh_t *mesh; /* the TCP mesh: setup channel and liveness channel */
  const tc_backend_host_t *host;
  char name[128];
  int rank, size;
  atomic_int *aborted;
  double spin_s;    /* polling budget before sleeping (seconds) */
  int yield_poll;   /* oversubscribed: poll with sched_yield only, at most spin_s */
  int light_post;   /* posts without a fence: sleepers call membarrier (shm_post_flag) */
  size_t total, ring_bytes, slot_bytes, half_bytes;
  size_t off_rctl, off_line, off_ring, off_slot, off_half; /* layout of every segment */
  char **base;      /* [size] every rank's segment, mapped here */
  shm_ctl_t *me;    /* == (shm_ctl_t *)base[rank] */
  /* [size] our head of the ring to each peer, and our tail of the ring
   * from each peer: 64-bit byte counts since the start, of which the ring
   * control words hold the low 32 bits (the header units' stamps, shm.c) */
  uint64_t *out_head;
  uint32_t *out_tail; /* [size] the consumer's tail as last read (ring_send) */
  uint64_t *in_tail;
  /* [size] each: messages written to each peer's ring, messages taken from
   * each peer's ring, and 1 + the number of the message from each peer
   * whose buffer this rank posted (0: none; shm.c, "Direct delivery") */
  uint64_t *out_msgs, *in_msgs, *rtr_posted;
  /* [size] per exchange: until when a send to each peer waits for that
   * peer's post (0: not yet waiting), and whether one waits now */
  double *rtr_wait;
  int rtr_waiting;
  const tc_xfer_t *xs; /* the exchange's transfers (nxs), while it runs */
  size_t nxs;
  uint64_t stamp_key; /* header units' stamps: position ^ key (shm.c, hdr_stamp) */
  int *send_head, *send_tail, *recv_head, *recv_tail; /* per exchange */
  tc_xfer_t *bye;     /* [2 * size] */
  char segname[200];  /* our own segment's name, until unlinked */
  int created, unlinked;
  int cma;          /* every rank can read every rank's memory (process_vm_readv) */
  int *pids;        /* [size] every rank's process id, for process_vm_readv */
  tc_shm_owner_t *owners; /* [size] every segment's creator: its name */
  uint32_t epoch;   /* the configuration, in every message header */
  _Atomic uint64_t clock_waits; /* shm_block's clock reads (tc__shm_clock_waits) */
  _Atomic uint64_t direct_writes; /* messages delivered directly (tc__shm_direct_writes) */
};

/* Registers this process for membarrier posts (shm.c, shm_post_flag); 1 if
 * it is (then and on every later call). */
TC_INTERNAL int tc__shm_light_setup(void);

/* Layout helpers. */
static inline shm_ctl_t *shm_ctl(struct tc_shm *s, int r) {
  return (shm_ctl_t *)s->base[r];
}
/* The ring from producer p to owner q: control and data (in q's segment). */
static inline shm_ring_ctl_t *shm_rctl(struct tc_shm *s, int p, int q) {
  return (shm_ring_ctl_t *)(s->base[q] + s->off_rctl) + p;
}
static inline char *shm_rdata(struct tc_shm *s, int p, int q) {
  return s->base[q] + s->off_ring + (size_t)(p < q ? p : p - 1) * s->ring_bytes;
}

/* shm.c */
TC_INTERNAL int tc__shm_fail(struct tc_shm *s, const tc_tp_op_t *op, int rc,
                             const char *fmt, ...) __attribute__((format(printf, 4, 5)));
TC_INTERNAL int tc__shm_left(struct tc_shm *s, const tc_tp_op_t *op, int p);
TC_INTERNAL int tc__shm_exchange(void *tp, tc_xfer_t *x, size_t nx, const tc_tp_op_t *op);
TC_INTERNAL int tc__shm_goodbye(void *tp, const tc_tp_op_t *op);
TC_INTERNAL void tc__shm_interrupt(void *tp);
/* shm_setup.c */
TC_INTERNAL void tc__shm_close(void *tp);
/* shm_sweep.c: the calling process as a creator; the name of rank r's
 * segment of communicator comm made by o; o from a name (-1: not ours). */
TC_INTERNAL void tc__shm_owner_self(tc_shm_owner_t *o);
TC_INTERNAL void tc__shm_name(char *buf, size_t len, const char *comm,
                              const unsigned char token[16], int rank,
                              const tc_shm_owner_t *o);
TC_INTERNAL int tc__shm_name_owner(const char *name, tc_shm_owner_t *o);
/* 1 if creator o is certainly gone: no such process, a zombie, or its pid
 * reused (the sweep's test, in this process's pid namespace). */
TC_INTERNAL int tc__shm_owner_gone(const tc_shm_owner_t *o);

#endif /* TC_TRANSPORT_SHM_INTERNAL_H */

/* shm.c -- the shared-memory transport's data path (shm.h): the exchange over
 * per-pair single-producer / single-consumer byte rings, the waits (spin,
 * then futex naps with abort, deadline and liveness checks), the sync flags
 * of the collective area, goodbye and interrupt. Segments are set up in
 * shm_setup.c. */
#include "transport/shm_internal.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Messages, futex, doorbells                                                */
/* ------------------------------------------------------------------------ */

int tc__shm_fail(struct tc_shm *s, const tc_tp_op_t *op, int rc, const char *fmt, ...) {
  if (!op->msg || !op->msglen) return rc;
  (void)s; /* the core adds "torchcomms: <op> on '<comm>' (rank r of n): " */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(op->msg, op->msglen, fmt, ap);
  va_end(ap);
  return rc;
}

/* Peer p left the communicator (its sockets ended with a TC_XFER_LEFT notice,
 * seen by the liveness check, which then no longer counts it as lost) while
 * this rank waits on it: it will never take part in this operation. */
int tc__shm_left(struct tc_shm *s, const tc_tp_op_t *op, int p) {
  return tc__shm_fail(s, op, TC_ERR_REMOTE,
                      "peer %d left the communicator (destroyed or aborted it without "
                      "finalize) before its part of this operation (it issued fewer "
                      "operations than this rank?)", p);
}

static void shm_futex_wait(_Atomic uint32_t *w, uint32_t val, double secs) {
  if (secs <= 0) return;
  struct timespec ts = {(time_t)secs, (long)((secs - (double)(time_t)secs) * 1e9)};
  syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void shm_futex_wake(_Atomic uint32_t *w) {
  syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Wakes rank q if it sleeps (or is about to). The caller published what q
 * waits for before, then passed a fence (or, posting light, the sleeper's
 * membarrier stands for it: shm_post_flag), which orders that store before
 * the sleepers load (q does the mirror image: sleepers store, fence or
 * membarrier, re-check, sleep). */
static inline void shm_ring_bell(shm_ctl_t *q) {
  if (atomic_load_explicit(&q->sleepers, memory_order_relaxed)) {
    atomic_fetch_add_explicit(&q->bell, 1, memory_order_seq_cst);
    shm_futex_wake(&q->bell);
  }
}

/* Posts without a fence (tc__shm_post_light, shm_post_flag). A post publishes what a
 * peer waits for (a flag, a ring head or tail), then looks whether that
 * peer sleeps (sleepers); the sleeper does the mirror image: sleepers up,
 * look again, sleep. The post's store must reach the peer before the
 * post's load of sleepers runs, or both miss (store buffering): a fence
 * between them does that, at the cost of waiting for the store's line to
 * come over from the peer that polls it (a quarter of an 8-byte broadcast
 * root's samples, docs/benchmarks.md). Instead, where the kernel has
 * MEMBARRIER_CMD_GLOBAL_EXPEDITED, every process registers for it and a
 * waiter about to sleep calls it after raising sleepers: every core that
 * runs a registered process then passes a full barrier before the call
 * returns, so a post whose load of sleepers came too early has its store
 * visible by the time the waiter looks again (the asymmetric form of the
 * same Dekker handshake: the cost moves to the rare sleep). light_pid: the
 * process that registered (a child of fork must register again: the
 * registration belongs to the address space), 0 none. A process that
 * cannot register posts with the fence. A sleeper calls membarrier only
 * once a peer has posted light (peers_light): 0.1-2 us, on the way to a
 * sleep of at least 50 us. */
static atomic_int light_pid;

int tc__shm_light_setup(void) {
  const int me = (int)getpid();
  if (atomic_load_explicit(&light_pid, memory_order_acquire) == me) return 1;
  long q = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  if (q < 0 || !(q & MEMBARRIER_CMD_GLOBAL_EXPEDITED) ||
      !(q & MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) ||
      syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0) != 0)
    return 0;
  atomic_store_explicit(&light_pid, me, memory_order_release);
  return 1;
}

/* 1 if a peer has ever posted without a fence. A peer says so (light = 1,
 * then a fence) before its first such post; a sleeper reads it after
 * raising sleepers and its fence: either the sleeper sees light, or the
 * peer's later load of sleepers sees the sleeper (the same handshake,
 * fenced on both sides, once). */
static int peers_light(struct tc_shm *s) {
  for (int q = 0; q < s->size; q++)
    if (q != s->rank && atomic_load_explicit(&shm_ctl(s, q)->light, memory_order_relaxed))
      return 1;
  return 0;
}

static inline void shm_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* ------------------------------------------------------------------------ */
/* Waiting                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct shm_waiter {
  double spin_until; /* 0: not started */
  double yield_after;
  double next_live;
} shm_waiter_t;

enum { SHM_RETRY = 0, SHM_NOT_YET = 1, SHM_DEADLINE = 2 };

/* Pauses before a wait first reads the clock (a pause is ~10-140 cycles:
 * at most a few microseconds, within any spin budget). */
#define SHM_PRESPIN 24

/* One round of waiting for ready(arg) once nothing could progress. Returns
 * SHM_RETRY (look again), SHM_NOT_YET (spin budget spent and !may_sleep),
 * SHM_DEADLINE (the caller formats the timeout), or a negative error. */
static int shm_block(struct tc_shm *s, shm_waiter_t *w, double spin_s, int may_sleep,
                     const tc_tp_op_t *op, int (*ready)(struct tc_shm *, void *),
                     int (*check)(struct tc_shm *, void *, const tc_tp_op_t *),
                     void *arg) {
  if (atomic_load_explicit(s->aborted, memory_order_relaxed))
    return tc__shm_fail(s, op, TC_ERR_ABORTED, "communicator was aborted");
  double now = tc__now();
  /* a load and a store, not a locked add: two threads waiting at once may
   * lose a count, never leave it unchanged (tc__shm_clock_waits) */
  atomic_store_explicit(&s->clock_waits,
                        atomic_load_explicit(&s->clock_waits, memory_order_relaxed) + 1,
                        memory_order_relaxed);
  if (w->spin_until == 0) {
    if (s->yield_poll && spin_s > s->spin_s) spin_s = s->spin_s;
    w->spin_until = now + spin_s;
    w->yield_after = s->yield_poll ? now : now + SHM_YIELD_S;
    if (w->next_live == 0) w->next_live = now + SHM_LIVE_S;
  }
  if (now >= op->deadline) return SHM_DEADLINE;
  if (now < w->spin_until) {
    /* a long spin lets whatever else wants this core run (another rank,
     * another job), so spinning never starves the peer it waits for */
    if (now >= w->yield_after) {
      sched_yield();
      return SHM_RETRY;
    }
    /* look often (a pause is ~10-140 cycles), read the clock rarely */
    for (int i = 0; i < 32 && !ready(s, arg); i++) shm_pause();
    return SHM_RETRY;
  }
  if (!may_sleep) return SHM_NOT_YET;
  if (now >= w->next_live) {
    int rc = check ? check(s, arg, op) : TC_OK;
    if (rc == TC_OK) rc = tc__mesh_check_alive(s->mesh, op);
    /* a peer that wrote its last message for this operation and then moved
     * on to the next one (the mismatch check) or exited (a goodbye; the
     * liveness check) between the caller's look and this check: take the
     * message first; the next wait reports the failure if something is
     * still missing */
    if (rc != TC_OK && ready(s, arg)) return SHM_RETRY;
    if (rc != TC_OK) return rc;
    w->next_live = now + SHM_LIVE_S;
  }
  shm_ctl_t *me = s->me;
  uint32_t b = atomic_load_explicit(&me->bell, memory_order_seq_cst);
  atomic_fetch_add_explicit(&me->sleepers, 1, memory_order_seq_cst);
  atomic_thread_fence(memory_order_seq_cst);
  /* every light post's store is visible past this (shm_post_flag), if a peer
   * ever posted so (else no call: a membarrier interrupts every core that
   * runs a registered process, which costs ranks that share their cores
   * with others, measured under load at 4 ranks on 2 cores) */
  if (atomic_load_explicit(&light_pid, memory_order_relaxed) && peers_light(s))
    syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0);
  if (!ready(s, arg) && !atomic_load(s->aborted)) {
    double nap = w->next_live - now;
    if (op->deadline - now < nap) nap = op->deadline - now;
    if (nap > SHM_NAP_S) nap = SHM_NAP_S;
    if (nap < 50e-6) nap = 50e-6;
    shm_futex_wait(&me->bell, b, nap);
  }
  atomic_fetch_sub_explicit(&me->sleepers, 1, memory_order_relaxed);
  return SHM_RETRY;
}

void tc__shm_interrupt(void *tp) {
  struct tc_shm *s = tp;
  atomic_fetch_add(&s->me->bell, 1);
  shm_futex_wake(&s->me->bell);
}

/* ------------------------------------------------------------------------ */
/* Sync flags                                                                */
/* ------------------------------------------------------------------------ */

uint64_t tc__shm_flag(tc_shm_t *s, int r) {
  return atomic_load_explicit(&shm_ctl(s, r)->flag, memory_order_acquire);
}

_Atomic uint64_t *tc__shm_aux(tc_shm_t *s, int r) { return &shm_ctl(s, r)->aux; }

/* Publishes the own flag, then wakes the peers that sleep: with a fence
 * between the two, or (light) only the compiler's, this process having
 * registered for membarrier (see "Posts without a fence" above). */
static inline void shm_post_flag(tc_shm_t *s, uint64_t v, int light) {
  atomic_store_explicit(&s->me->flag, v, memory_order_release);
  if (light) atomic_signal_fence(memory_order_seq_cst);
  else atomic_thread_fence(memory_order_seq_cst);
  for (int q = 0; q < s->size; q++)
    if (q != s->rank) shm_ring_bell(shm_ctl(s, q));
}

void tc__shm_post(tc_shm_t *s, uint64_t v) { shm_post_flag(s, v, 0); }

void tc__shm_post_light(tc_shm_t *s, uint64_t v) {
  /* said once, with a fence, before the first such post (peers_light) */
  if (s->light_post && __builtin_expect(!atomic_load_explicit(&s->me->light, memory_order_relaxed), 0)) {
    atomic_store(&s->me->light, 1);
    atomic_thread_fence(memory_order_seq_cst);
  }
  shm_post_flag(s, v, s->light_post);
}

typedef struct {
  int r;
  uint64_t v;
  const _Atomic uint64_t *w;
  int or_flag;   /* also done once r's flag is >= v (tc__shm_wait_word) */
  int flag_seen; /* ... which flag_check found */
} flag_arg_t;

static int flag_ready(struct tc_shm *s, void *arg) {
  (void)s;
  flag_arg_t *a = arg;
  return a->flag_seen || atomic_load_explicit(a->w, memory_order_acquire) >= a->v;
}

/* The peer we wait for is in finalize (its goodbye is the next message). */
static inline size_t ring_avail(struct tc_shm *s, int p);
static int flag_check(struct tc_shm *s, void *arg, const tc_tp_op_t *op) {
  flag_arg_t *a = arg;
  int p = a->r;
  if (a->or_flag && atomic_load_explicit(&shm_ctl(s, p)->flag, memory_order_acquire) >= a->v) {
    a->flag_seen = 1;
    return TC_OK;
  }
  if (tc__mesh_left(s->mesh, p)) return tc__shm_left(s, op, p);
  if (!ring_avail(s, p)) return TC_OK;
  const char *h = shm_rdata(s, p, s->rank) + (s->in_tail[p] & (s->ring_bytes - 1));
  uint32_t magic, word;
  memcpy(&magic, h, 4);
  memcpy(&word, h + 4, 4);
  if (magic == SHM_MSG_MAGIC && word == TC_XFER_WORD(TC_XFER_GOODBYE, s->epoch))
    return tc__shm_fail(s, op, TC_ERR_PROTOCOL,
                        "peer %d is already in finalize while this rank is in %s "
                        "(mismatched operations between ranks?)", p, op->opname);
  return TC_OK;
}

int tc__shm_wait_word(tc_shm_t *s, int r, const _Atomic uint64_t *word, uint64_t v,
                      double spin_s, int may_sleep, int or_flag, const tc_tp_op_t *op) {
  flag_arg_t a = {r, v, word, or_flag, 0};
  if (flag_ready(s, &a)) return TC_OK;
  /* a peer a fraction of a microsecond behind (the common case of a small
   * operation) is seen here without a clock read; with more ranks than
   * cores (yield_poll) the core is given up at once instead */
  if (!s->yield_poll && spin_s > 0)
    for (int i = 0; i < SHM_PRESPIN; i++) {
      shm_pause();
      if (flag_ready(s, &a)) return TC_OK;
    }
  shm_waiter_t w = {0, 0, 0};
  double spin = s->spin_s > 0 ? spin_s : 0;
  for (;;) {
    int rc = shm_block(s, &w, spin, may_sleep, op, flag_ready, flag_check, &a);
    if (rc < 0) return rc;
    if (rc == SHM_NOT_YET) return 1;
    if (rc == SHM_DEADLINE)
      return tc__shm_fail(s, op, TC_ERR_TIMEOUT,
                          "timed out after %g s; still waiting on peer %d (it has not "
                          "joined this collective operation)", op->timeout_s, r);
    if (flag_ready(s, &a)) return TC_OK;
  }
}

int tc__shm_wait_flag(tc_shm_t *s, int r, uint64_t v, double spin_s, int may_sleep,
                      const tc_tp_op_t *op) {
  return tc__shm_wait_word(s, r, &shm_ctl(s, r)->flag, v, spin_s, may_sleep, 0, op);
}

double tc__shm_spin_s(const tc_shm_t *s) { return s->spin_s; }
uint64_t tc__shm_direct_writes(const tc_shm_t *s) {
  return atomic_load_explicit(&s->direct_writes, memory_order_relaxed);
}
uint64_t tc__shm_clock_waits(const tc_shm_t *s) {
  return atomic_load_explicit(&s->clock_waits, memory_order_relaxed);
}
int tc__shm_cma(const tc_shm_t *s) { return s->cma; }
int tc__shm_wait_write_end(tc_shm_t *s, int q, int (*writing)(void *), void *arg,
                           double timeout_s) {
  const double end = tc__now() + (timeout_s > 0 ? timeout_s : 600);
  while (writing(arg) && tc__shm_peer_alive(s, q)) {
    if (tc__now() > end) return 1;
    struct timespec ts = {0, 20 * 1000};
    nanosleep(&ts, NULL);
  }
  return 0;
}
int tc__shm_post_state(tc_shm_t *s, int p) {
  return (int)(atomic_load_explicit(&shm_rctl(s, p, s->rank)->rtr, memory_order_acquire) & 3u);
}
char *tc__shm_ring_at(tc_shm_t *s, int p, int q, size_t *bytes) {
  *bytes = s->ring_bytes;
  return shm_rdata(s, p, q);
}

int tc__shm_read_peer(tc_shm_t *s, int q, void *dst, uint64_t remote, size_t len,
                      const tc_tp_op_t *op) {
  char *d = dst;
  while (len > 0) {
    struct iovec l = {d, len}, r = {(void *)(uintptr_t)remote, len};
    ssize_t got = process_vm_readv(s->pids[q], &l, 1, &r, 1, 0);
    if (got <= 0) {
      int e = got < 0 ? errno : EFAULT;
      if (e == EINTR) continue;
      return tc__shm_fail(s, op, TC_ERR_REMOTE,
                          "could not read peer %d's buffer (process_vm_readv: %s; "
                          "peer exited or freed the buffer during the operation?)",
                          q, strerror(e));
    }
    d += got;
    remote += (uint64_t)got;
    len -= (size_t)got;
  }
  return TC_OK;
}
int tc__shm_peer_alive(const tc_shm_t *s, int q) { return !tc__shm_owner_gone(&s->owners[q]); }
int tc__shm_write_peer(tc_shm_t *s, int q, uint64_t remote, const void *src, size_t len,
                       char *why, size_t wl) {
  const char *p = src;
  while (len > 0) {
    struct iovec l = {(void *)(uintptr_t)p, len}, r = {(void *)(uintptr_t)remote, len};
    ssize_t put = process_vm_writev(s->pids[q], &l, 1, &r, 1, 0);
    if (put <= 0) {
      int e = put < 0 ? errno : EFAULT;
      if (e == EINTR) continue;
      snprintf(why, wl, "could not write into peer %d's window (process_vm_writev: %s; peer "
               "exited or freed its window?)", q, strerror(e));
      return TC_ERR_REMOTE;
    }
    p += put;
    remote += (uint64_t)put;
    len -= (size_t)put;
  }
  return TC_OK;
}
void tc__shm_areas(const tc_shm_t *s, tc_shm_areas_t *a) {
  *a = (tc_shm_areas_t){.base = s->base, .off_slot = s->off_slot, .off_half = s->off_half,
                        .slot_bytes = s->slot_bytes, .half_bytes = s->half_bytes,
                        .off_line = s->off_line};
}

/* ------------------------------------------------------------------------ */
/* Rings                                                                     */
/* ------------------------------------------------------------------------ */

static inline size_t al_unit(size_t n) { return (n + SHM_UNIT - 1) & ~(size_t)(SHM_UNIT - 1); }

/* A payload this small travels in its header's unit, after the header:
 * one cache line from the producer to the consumer, not two. */
#define SHM_HDR 24u
#define SHM_INLINE (SHM_UNIT - SHM_HDR)
#define SHM_STAMP_AT 16u

/* The stamp of a header unit at ring position pos (64-bit, from the
 * start), its last word, written last: a consumer that expects a header
 * there and finds its stamp takes the unit without reading the ring's
 * head, whose line is a second transfer between the cores before the
 * unit's own (2 ranks, 8 B send_recv: docs/benchmarks.md). An older unit
 * there has the stamp of another position; a payload unit, user data,
 * would have to hold this position xor the communicator's key. */
static inline uint64_t hdr_stamp(const struct tc_shm *s, uint64_t pos) {
  return pos ^ s->stamp_key;
}
/* Bytes of the ring from p that its published head says are there past
 * this rank's tail: none when the head is behind the tail, which it is
 * after this rank took messages by their stamps before the producer
 * published the head past them (the difference as a signed 32-bit
 * number: a ring is at most 1 GiB). */
static inline size_t ring_avail(struct tc_shm *s, int p) {
  const uint32_t head =
      atomic_load_explicit(&shm_rctl(s, p, s->rank)->head, memory_order_acquire);
  const int32_t d = (int32_t)(head - (uint32_t)s->in_tail[p]);
  return d > 0 ? (size_t)d : 0;
}

/* The stamp's low bit set (no unit lies at an odd position): the whole
 * message, payload included, was written before its header, so that the
 * consumer takes it without the ring's head either (a message of at most
 * SHM_PUB_BYTES the ring had room for: ring_send). */
#define SHM_STAMP_WHOLE 1u

/* Ring footprint of a transfer: header unit (with a payload of at most
 * SHM_INLINE bytes) or header unit + padded payload. */
static inline size_t xf_total(const tc_xfer_t *x) {
  return x->len <= SHM_INLINE ? SHM_UNIT : SHM_UNIT + al_unit(x->len);
}

/* Direct delivery. A consumer about to wait for a message of at least
 * SHM_DIRECT_MIN bytes posts its buffer (rtr_post: address and size, then
 * rtr = number << 2 | SHM_RTR_POSTED, in the ring's control). A producer
 * whose next message to it is that one, of that size, claims the post
 * (POSTED -> CLAIMED, one compare-and-swap), writes the payload straight
 * into the buffer (process_vm_writev: one copy instead of two through the
 * ring), then a header unit stamped SHM_STAMP_DIRECT in place of the
 * payload. A producer that finds no post for its message (the consumer is
 * not waiting yet, or posted for another size) sends it through the ring
 * as before, as it does when the write fails: it never waits for a
 * consumer, so no program that runs without it deadlocks with it. A
 * consumer that leaves without the message (timeout, abort, a failed
 * peer) takes its post back (POSTED -> REVOKED); if the producer claimed
 * it first, it waits until that producer's header is there or the
 * producer is dead, so that no write lands in a buffer its caller got
 * back (rtr_revoke). In an exchange that also receives from the peer (a
 * send_recv, a batch of both), whose post is then due any moment, a send
 * waits for it a little first: at most SHM_DIRECT_WAIT_NS per byte, at
 * most SHM_DIRECT_WAIT_MAX_S. Neither where buffers of the exchange overlap
 * (xfer_overlap: a send and a receive of one buffer, a swap in place, as
 * the ring allows): no buffer is posted while a send of the exchange still
 * has to read it, and such a send does not wait. */
#define SHM_DIRECT_MIN (32u * 1024u)
#define SHM_DIRECT_WAIT_NS 0.05 /* 1 MiB: 52 us; through the ring: about 200 */
#define SHM_DIRECT_WAIT_MAX_S 1e-3
enum { SHM_RTR_POSTED = 1, SHM_RTR_CLAIMED = 2, SHM_RTR_REVOKED = 3 };
#define SHM_STAMP_DIRECT 2u

static inline int direct_ok(const struct tc_shm *s, const tc_xfer_t *xf) {
  return s->cma && xf->kind == TC_XFER_DATA && xf->len >= SHM_DIRECT_MIN;
}

/* Does [a, a + al) share a byte with a transfer of the running exchange
 * in the other direction that has not moved all its bytes (a send not yet
 * taken from its buffer, a receive not yet written)? A buffer posted while
 * a send of the same exchange still reads it could be written before that
 * send took it (a swap in place), and a send that waited for a post could
 * read what a receive already wrote there. */
static int xfer_overlap(const struct tc_shm *s, const void *a, size_t al, int sends) {
  const uintptr_t lo = (uintptr_t)a, hi = lo + al;
  for (size_t i = 0; i < s->nxs; i++) {
    const tc_xfer_t *o = &s->xs[i];
    if (o->is_send != sends || !o->len || o->done >= xf_total(o)) continue;
    const uintptr_t olo = (uintptr_t)o->buf, ohi = olo + o->len;
    if (lo < ohi && olo < hi) return 1;
  }
  return 0;
}

/* The consumer: posts the buffer of the chain from p's next message (the
 * common case, a smaller one, in two compares: inline). */
static void rtr_post_now(struct tc_shm *s, const tc_xfer_t *xf, int p);
static inline void rtr_post(struct tc_shm *s, const tc_xfer_t *x, int p) {
  const tc_xfer_t *xf = &x[s->recv_head[p]];
  if (xf->len >= SHM_DIRECT_MIN && xf->done == 0) rtr_post_now(s, xf, p);
}
static void rtr_post_now(struct tc_shm *s, const tc_xfer_t *xf, int p) {
  const uint64_t k = s->in_msgs[p];
  if (s->rtr_posted[p] == k + 1 || !direct_ok(s, xf) || xfer_overlap(s, xf->buf, xf->len, 1))
    return;
  shm_ring_ctl_t *rc = shm_rctl(s, p, s->rank);
  atomic_store_explicit(&rc->rtr_addr, (uint64_t)(uintptr_t)xf->buf, memory_order_relaxed);
  atomic_store_explicit(&rc->rtr_len, (uint64_t)xf->len, memory_order_relaxed);
  atomic_store_explicit(&rc->rtr, k << 2 | SHM_RTR_POSTED, memory_order_release);
  s->rtr_posted[p] = k + 1;
}

/* The producer: 1 if it wrote xf, its next message to p, into p's posted
 * buffer; 0 if it is to go through the ring; -1 to wait for p's post (wait:
 * this exchange receives from p too). */
static int direct_send(struct tc_shm *s, int p, const tc_xfer_t *xf, int wait) {
  shm_ring_ctl_t *rc = shm_rctl(s, s->rank, p);
  const uint64_t k = s->out_msgs[p];
  uint64_t cur = atomic_load_explicit(&rc->rtr, memory_order_acquire);
  if ((cur >> 2) != k && wait && !xfer_overlap(s, xf->buf, xf->len, 0)) {
    const double now = tc__now();
    if (s->rtr_wait[p] == 0) {
      double w = (double)xf->len * SHM_DIRECT_WAIT_NS * 1e-9;
      s->rtr_wait[p] = now + (w < SHM_DIRECT_WAIT_MAX_S ? w : SHM_DIRECT_WAIT_MAX_S);
    }
    if (now < s->rtr_wait[p]) {
      s->rtr_waiting = 1;
      return -1;
    }
  }
  if (cur != (k << 2 | SHM_RTR_POSTED)) return 0;
  const uint64_t addr = atomic_load_explicit(&rc->rtr_addr, memory_order_relaxed);
  if (atomic_load_explicit(&rc->rtr_len, memory_order_relaxed) != (uint64_t)xf->len) return 0;
  if (!atomic_compare_exchange_strong_explicit(&rc->rtr, &cur, k << 2 | SHM_RTR_CLAIMED,
                                               memory_order_acq_rel, memory_order_acquire))
    return 0; /* taken back meanwhile */
  char why[256];
  /* failed: through the ring, which overwrites whatever was written */
  if (tc__shm_write_peer(s, p, addr, xf->buf, xf->len, why, sizeof why) != TC_OK) return 0;
  atomic_store_explicit(&s->direct_writes,
                        atomic_load_explicit(&s->direct_writes, memory_order_relaxed) + 1,
                        memory_order_relaxed);
  return 1;
}

/* Has a header unit arrived at the consumer's tail of the ring from p
 * (any of its stamps)? */
static inline int hdr_there(struct tc_shm *s, int p) {
  const size_t at = (size_t)(s->in_tail[p] & (s->ring_bytes - 1)) + SHM_STAMP_AT;
  const _Atomic uint64_t *st =
      (const _Atomic uint64_t *)(const void *)(shm_rdata(s, p, s->rank) + at);
  return (atomic_load_explicit(st, memory_order_acquire) ^ hdr_stamp(s, s->in_tail[p])) <=
         (SHM_STAMP_WHOLE | SHM_STAMP_DIRECT);
}

/* The consumer leaves an exchange before p's message it posted a buffer
 * for: the post is taken back, or, claimed already, the producer's write
 * is waited for (its header, or its end), at most one more timeout of the
 * operation (tc__shm_wait_write_end); past that, op->msg says that the
 * buffer may still change. */
typedef struct { struct tc_shm *s; int p; } revoke_arg_t;
static int revoke_writing(void *arg) {
  const revoke_arg_t *a = arg;
  return !hdr_there(a->s, a->p);
}
static void rtr_revoke(struct tc_shm *s, int p, const tc_tp_op_t *op) {
  const uint64_t k = s->in_msgs[p];
  if (s->rtr_posted[p] != k + 1) return; /* none, or for a message taken */
  s->rtr_posted[p] = 0;
  shm_ring_ctl_t *rc = shm_rctl(s, p, s->rank);
  uint64_t cur = k << 2 | SHM_RTR_POSTED;
  if (atomic_compare_exchange_strong_explicit(&rc->rtr, &cur, k << 2 | SHM_RTR_REVOKED,
                                              memory_order_acq_rel, memory_order_acquire))
    return;
  if (cur != (k << 2 | SHM_RTR_CLAIMED)) return;
  revoke_arg_t a = {s, p};
  if (tc__shm_wait_write_end(s, p, revoke_writing, &a, op->timeout_s) && op->msg && op->msglen) {
    size_t l = strlen(op->msg);
    snprintf(op->msg + l, op->msglen - l,
             "; peer %d was still writing into this rank's receive buffer when this rank "
             "gave up, and may still change it",
             p);
  }
}

/* Copies len bytes into the ring at position pos, wrapping at its end. */
static void ring_copy_in(char *data, size_t R, uint64_t pos, const void *src, size_t len) {
  size_t at = (size_t)(pos & (R - 1)), first = len < R - at ? len : R - at;
  memcpy(data + at, src, first);
  if (first < len) memcpy(data, (const char *)src + first, len - first);
}

/* Writes xf's header unit {magic, kind and epoch, length, stamp} at ring
 * position pos of the ring to p (its SHM_HDR bytes; an inline payload is
 * written before), the stamp last, varied by how the payload travels
 * (0, SHM_STAMP_WHOLE, SHM_STAMP_DIRECT), and counts the message. */
static void put_hdr(struct tc_shm *s, int p, char *data, uint64_t pos, const tc_xfer_t *xf,
                    uint64_t how) {
  char *h = data + (pos & (s->ring_bytes - 1));
  uint32_t magic = SHM_MSG_MAGIC, word = TC_XFER_WORD(xf->kind, s->epoch);
  uint64_t len = xf->len;
  memcpy(h, &magic, 4);
  memcpy(h + 4, &word, 4);
  memcpy(h + 8, &len, 8);
  atomic_store_explicit((_Atomic uint64_t *)(void *)(h + SHM_STAMP_AT), hdr_stamp(s, pos) ^ how,
                        memory_order_release);
  s->out_msgs[p]++;
}

/* The same checks and texts as the TCP transport. */
static int check_hdr(struct tc_shm *s, const tc_tp_op_t *op, const tc_xfer_t *x,
                     const char *h) {
  char why[256];
  if (tc__xfer_hdr_problem(h, SHM_MSG_MAGIC, s->epoch, x, op->opname, why, sizeof why))
    return tc__shm_fail(s, op, TC_ERR_PROTOCOL, "%s", why);
  return TC_OK;
}

static inline void publish_head(struct tc_shm *s, int p, uint64_t head) {
  atomic_store_explicit(&shm_rctl(s, s->rank, p)->head, (uint32_t)head, memory_order_release);
  s->out_head[p] = head;
  atomic_thread_fence(memory_order_seq_cst);
  shm_ring_bell(shm_ctl(s, p));
}

static inline void publish_tail(struct tc_shm *s, int p, uint64_t tail) {
  atomic_store_explicit(&shm_rctl(s, p, s->rank)->tail, (uint32_t)tail, memory_order_release);
  s->in_tail[p] = tail;
  atomic_thread_fence(memory_order_seq_cst);
  shm_ring_bell(shm_ctl(s, p));
}

/* Copies as much of the send chain to peer p as the ring takes. */
static void ring_send(struct tc_shm *s, tc_xfer_t *x, int *hi, size_t *remaining,
                      int *moved) {
  int p = x[*hi].peer;
  shm_ring_ctl_t *rc = shm_rctl(s, s->rank, p);
  char *data = shm_rdata(s, s->rank, p);
  size_t R = s->ring_bytes, mask = R - 1;
  uint64_t head = s->out_head[p], start = head;
  /* the consumer's tail only moves forward: the one last read gives a
   * space that is never too large. It is read again only when that space
   * is under half the ring, so a small message does not wait for the line
   * the consumer wrote (a transfer between the cores) before it goes out */
  uint32_t tail = s->out_tail[p];
  size_t space = R - (uint32_t)((uint32_t)head - tail);
  if (space < R / 2) {
    tail = s->out_tail[p] = atomic_load_explicit(&rc->tail, memory_order_acquire);
    space = R - (uint32_t)((uint32_t)head - tail);
  }
  if (space == 0 && tc__mesh_gone(s->mesh, p)) { /* it said goodbye: nothing to deliver */
    while (*hi >= 0) {
      (*remaining)--;
      *hi = x[*hi].next;
    }
    return;
  }
  uint64_t pub = head;
  while (*hi >= 0 && space > 0) {
    tc_xfer_t *xf = &x[*hi];
    size_t total = xf_total(xf);
    int d = xf->done == 0 && direct_ok(s, xf) ? direct_send(s, p, xf, s->recv_head[p] >= 0) : 0;
    if (d < 0) break; /* its peer's post is due: sent later */
    if (d > 0) {
      /* written into the consumer's buffer: a header unit stands for it */
      put_hdr(s, p, data, head, xf, SHM_STAMP_DIRECT);
      head += SHM_UNIT;
      space -= SHM_UNIT;
      xf->done = total;
      s->rtr_wait[p] = 0;
    } else if (xf->done == 0 && total > SHM_UNIT && total <= space && total <= SHM_PUB_BYTES) {
      /* the payload first, then its header: whole (SHM_STAMP_WHOLE) */
      ring_copy_in(data, R, head + SHM_UNIT, xf->buf, xf->len);
      put_hdr(s, p, data, head, xf, SHM_STAMP_WHOLE);
      head += total;
      space -= total;
      xf->done = total;
    } else if (xf->done == 0) {
      if (xf->len && xf->len <= SHM_INLINE) memcpy(data + (head & mask) + SHM_HDR, xf->buf, xf->len);
      put_hdr(s, p, data, head, xf, 0);
      head += SHM_UNIT;
      space -= SHM_UNIT;
      xf->done = SHM_UNIT;
    }
    while (xf->done < total && space > 0) {
      size_t off = xf->done - SHM_UNIT, pos = head & mask;
      size_t n = total - xf->done;
      if (n > space) n = space;
      if (n > R - pos) n = R - pos;
      if (n > SHM_PUB_BYTES) n = SHM_PUB_BYTES;
      if (off < xf->len) {
        size_t c = xf->len - off < n ? xf->len - off : n;
        memcpy(data + pos, (const char *)xf->buf + off, c);
      }
      head += n;
      space -= n;
      xf->done += n;
      if (head - pub >= SHM_PUB_BYTES) {
        publish_head(s, p, head);
        pub = head;
      }
    }
    if (xf->done < total) break;
    (*remaining)--;
    *hi = xf->next;
  }
  if (head != pub) publish_head(s, p, head);
  if (head != start) *moved = 1;
}

/* Copies what has arrived from peer p into the receive chain. */
static int ring_recv(struct tc_shm *s, tc_xfer_t *x, int *hi, size_t *remaining,
                     int *moved, const tc_tp_op_t *op) {
  int p = x[*hi].peer;
  const char *data = shm_rdata(s, p, s->rank);
  size_t R = s->ring_bytes, mask = R - 1;
  uint64_t tail = s->in_tail[p], start = tail;
  size_t avail;
  int direct = 0;
  const tc_xfer_t *first = &x[*hi];
  if (first->done == 0) {
    rtr_post(s, x, p);
    /* a header is due: its stamp says whether it is there; a payload that
     * rides in it needs nothing else, a longer one the ring's head */
    const _Atomic uint64_t *st =
        (const _Atomic uint64_t *)(const void *)(data + (tail & mask) + SHM_STAMP_AT);
    const uint64_t got = atomic_load_explicit(st, memory_order_acquire), want = hdr_stamp(s, tail);
    if (got == (want ^ SHM_STAMP_WHOLE)) { /* the message's own size, checked with its header */
      avail = xf_total(first);
    } else if (got == (want ^ SHM_STAMP_DIRECT)) { /* its header alone: the payload is here */
      avail = SHM_UNIT;
      direct = 1;
    } else if (got != want) {
      return TC_OK;
    }
    else if (first->len <= SHM_INLINE) avail = SHM_UNIT;
    else avail = ring_avail(s, p);
  } else {
    avail = ring_avail(s, p);
  }
  uint64_t pub = tail;
  int err = TC_OK;
  while (*hi >= 0 && avail > 0) {
    tc_xfer_t *xf = &x[*hi];
    size_t total = xf_total(xf);
    if (xf->done == 0) {
      const char *h = data + (tail & mask);
      if ((err = check_hdr(s, op, xf, h)) != TC_OK) break;
      if (xf->kind == TC_XFER_GOODBYE) tc__mesh_mark_gone(s->mesh, p);
      if (xf->len && xf->len <= SHM_INLINE) memcpy(xf->buf, h + SHM_HDR, xf->len);
      s->in_msgs[p]++;
      tail += SHM_UNIT;
      avail -= SHM_UNIT;
      xf->done = direct ? total : SHM_UNIT;
      direct = 0;
    }
    while (xf->done < total && avail > 0) {
      size_t off = xf->done - SHM_UNIT, pos = tail & mask;
      size_t n = total - xf->done;
      if (n > avail) n = avail;
      if (n > R - pos) n = R - pos;
      if (n > SHM_PUB_BYTES) n = SHM_PUB_BYTES;
      if (off < xf->len) {
        size_t c = xf->len - off < n ? xf->len - off : n;
        memcpy((char *)xf->buf + off, data + pos, c);
      }
      tail += n;
      avail -= n;
      xf->done += n;
      if (tail - pub >= SHM_PUB_BYTES) {
        publish_tail(s, p, tail);
        pub = tail;
      }
    }
    if (xf->done < total) break;
    char why[400];
    if (tc__xfer_fp_problem(xf, op, s->rank, why, sizeof why)) {
      err = tc__shm_fail(s, op, TC_ERR_PROTOCOL, "%s", why);
      break;
    }
    (*remaining)--;
    *hi = xf->next;
  }
  if (tail != pub) publish_tail(s, p, tail);
  if (tail != start) *moved = 1;
  return err;
}

/* ------------------------------------------------------------------------ */
/* Exchange                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct { tc_xfer_t *x; } exch_arg_t;

/* Has something arrived for the receive chain from p? A header due: its
 * stamp (ring_recv), so that a waiting consumer polls the unit's line, not
 * the head's as well; else the head. */
static inline int ring_has(struct tc_shm *s, const tc_xfer_t *x, int p) {
  if (x[s->recv_head[p]].done == 0) return hdr_there(s, p);
  return ring_avail(s, p) > 0;
}

/* Could any chain progress now? (checked after announcing a sleep) */
static int exch_ready(struct tc_shm *s, void *arg) {
  const tc_xfer_t *x = ((const exch_arg_t *)arg)->x;
  if (s->rtr_waiting) return 1; /* a send waits for a post: look again, no sleep */
  for (int p = 0; p < s->size; p++) {
    if (s->recv_head[p] >= 0 && ring_has(s, x, p)) return 1;
    if (s->send_head[p] >= 0) {
      uint32_t tail = atomic_load_explicit(&shm_rctl(s, s->rank, p)->tail,
                                           memory_order_acquire);
      if ((uint32_t)((uint32_t)s->out_head[p] - tail) < s->ring_bytes ||
          tc__mesh_gone(s->mesh, p))
        return 1;
    }
  }
  return 0;
}

static int exch_timeout(struct tc_shm *s, tc_xfer_t *x, const tc_tp_op_t *op) {
  char list[400];
  tc__xfer_pending_text(list, sizeof list, x, s->send_head, s->recv_head, s->size,
                        SHM_UNIT);
  return tc__shm_fail(s, op, TC_ERR_TIMEOUT, "timed out after %g s; still waiting on %s",
                      op->timeout_s, list);
}

/* A peer we wait on has entered a collective this rank has not: the ranks
 * issued different operations (or counts that chose different algorithms). */
static int exch_mismatch(struct tc_shm *s, void *arg, const tc_tp_op_t *op) {
  (void)arg;
  uint64_t mine = atomic_load_explicit(&s->me->flag, memory_order_relaxed);
  for (int p = 0; p < s->size; p++) {
    if (s->recv_head[p] < 0 && s->send_head[p] < 0) continue;
    if (tc__mesh_gone(s->mesh, p)) continue;
    if (tc__mesh_left(s->mesh, p)) return tc__shm_left(s, op, p);
    if (tc__shm_flag(s, p) > mine)
      return tc__shm_fail(s, op, TC_ERR_PROTOCOL,
                          "peer %d is in a different operation than this rank "
                          "(mismatched operations, counts or dtypes between ranks?)",
                          p);
  }
  return TC_OK;
}

int tc__shm_exchange(void *tp, tc_xfer_t *x, size_t nx, const tc_tp_op_t *op) {
  struct tc_shm *s = tp;
  if (nx == 0) return TC_OK;
  for (int p = 0; p < s->size; p++) {
    s->send_head[p] = s->send_tail[p] = s->recv_head[p] = s->recv_tail[p] = -1;
    s->rtr_wait[p] = 0;
  }
  size_t most = 0; /* the largest receive */
  s->xs = x;
  s->nxs = nx;
  for (size_t i = 0; i < nx; i++) {
    tc_xfer_t *xf = &x[i];
    if (xf->peer < 0 || xf->peer >= s->size || xf->peer == s->rank)
      return tc__shm_fail(s, op, TC_ERR_INTERNAL,
                          "internal error: transfer to invalid peer %d", xf->peer);
    xf->done = 0;
    xf->next = -1;
    int *head = xf->is_send ? s->send_head : s->recv_head;
    int *tail = xf->is_send ? s->send_tail : s->recv_tail;
    if (tail[xf->peer] < 0) head[xf->peer] = (int)i;
    else x[tail[xf->peer]].next = (int)i;
    tail[xf->peer] = (int)i;
    if (!xf->is_send && xf->len > most) most = xf->len;
  }
  /* the receive buffers a peer may write into directly, before this rank's
   * own sends: a peer that sends now finds them */
  if (most >= SHM_DIRECT_MIN)
    for (int p = 0; p < s->size; p++)
      if (s->recv_head[p] >= 0) rtr_post(s, x, p);
  size_t remaining = nx;
  shm_waiter_t w = {0, 0, 0};
  double spin = s->spin_s; /* once data moved, the peers are busy with this
                            * exchange: spin longer (politely) before sleeping */
  int rc;
  for (;;) {
    int moved = 0;
    s->rtr_waiting = 0;
    for (int p = 0; p < s->size; p++)
      if (s->send_head[p] >= 0) ring_send(s, x, &s->send_head[p], &remaining, &moved);
    rc = TC_OK;
    for (int p = 0; p < s->size && rc == TC_OK; p++)
      if (s->recv_head[p] >= 0) rc = ring_recv(s, x, &s->recv_head[p], &remaining, &moved, op);
    if (rc != TC_OK || remaining == 0) break;
    if (moved) {
      w.spin_until = 0;
      if (s->spin_s > 0 && spin < SHM_ACTIVE_SPIN_S) spin = SHM_ACTIVE_SPIN_S;
      continue;
    }
    exch_arg_t ea = {x};
    rc = shm_block(s, &w, spin, 1, op, exch_ready, exch_mismatch, &ea);
    if (rc < 0) break;
    if (rc == SHM_DEADLINE) {
      rc = exch_timeout(s, x, op);
      break;
    }
  }
  /* left before a message whose buffer was posted: no write into it later */
  if (rc != TC_OK)
    for (int p = 0; p < s->size; p++)
      if (s->recv_head[p] >= 0) rtr_revoke(s, p, op);
  return rc;
}

int tc__shm_goodbye(void *tp, const tc_tp_op_t *op) {
  struct tc_shm *s = tp;
  size_t n = 0;
  for (int p = 0; p < s->size; p++) {
    if (p == s->rank) continue;
    s->bye[n] = tc__xfer_send(p, NULL, 0);
    s->bye[n++].kind = TC_XFER_GOODBYE;
    s->bye[n] = tc__xfer_recv(p, NULL, 0);
    s->bye[n++].kind = TC_XFER_GOODBYE;
  }
  return tc__shm_exchange(s, s->bye, n, op);
}

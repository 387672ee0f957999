/* backend.c -- the native `cpu` backend: its table, init / finalize / abort /
 * destroy, and the progress thread that runs queued operations in order.
 *
 * Transport: shared memory when every rank is on this machine, else TCP
 * (TORCHCOMMS_CPU_TRANSPORT=auto|shm|tcp; transport/shm_setup.c).
 *
 * Threads: one progress thread per communicator pops operations in post
 * order, runs the algorithm (algo_reduce.c, algo_move.c over the transport's
 * exchange, or shm_algos.c on the shared segments) and reports through the
 * host. A thread hand-off costs microseconds, so an operation with a
 * shared-memory path posted on an idle communicator (empty queue, nothing
 * running), synchronous or of at most TORCHCOMMS_CPU_INLINE_BYTES (1 MiB),
 * runs on the caller's thread inside the post, spinning briefly at its
 * waits; if a peer
 * is late it stops at a wait and goes on to the thread, first in line, from
 * where it stopped. The post never sleeps, and order is kept: while it runs
 * other posts queue behind it, and it reports after anything the thread
 * finished before it. Any other synchronous operation (point-to-point,
 * batches, large ones without a shared-memory path) posted on an idle
 * communicator runs to its end on the caller's thread, which waits for it
 * anyway. Which of the caller and the thread runs is decided by one flag,
 * the lane (`running`), taken with a compare-and-swap: the common inline
 * operation takes no lock.
 *
 * Abort sets a flag, writes an eventfd that is in every poll set of the TCP
 * transport and wakes the futex waits of the shared-memory transport, so a
 * running operation fails at once. */
#include "backends/cpu/cpu.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define CPU_BACKEND_VERSION "0.1.0"

/* ------------------------------------------------------------------------ */
/* Helpers used by the algorithms                                            */
/* ------------------------------------------------------------------------ */

/* Messages are the reason only: the core adds "torchcomms: <op> on
 * '<comm>' (rank r of n): " (torchcomms_backend.h). */
int tc__cpu_fail(cpu_ctx_t *ctx, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ctx->msg, sizeof ctx->msg, fmt, ap);
  va_end(ap);
  return rc;
}

/* A refusal's or finalize's reason into the caller's err buffer. */
static int cpu_err(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int cpu_err(char *err, size_t errlen, int rc, const char *fmt, ...) {
  if (!err || !errlen) return rc;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return rc;
}

int tc__cpu_scratch(cpu_ctx_t *ctx, size_t bytes, void **out) {
  cpu_comm_t *c = ctx->c;
  if (bytes > c->scratch_cap) {
    size_t cap = c->scratch_cap ? c->scratch_cap : 64 * 1024;
    while (cap < bytes) cap = cap > SIZE_MAX / 2 ? bytes : cap * 2;
    void *p = aligned_alloc(64, (cap + 63) & ~(size_t)63);
    if (!p)
      return tc__cpu_fail(ctx, TC_ERR_NOMEM,
                          "out of memory allocating %zu bytes of scratch", cap);
    free(c->scratch);
    c->scratch = p;
    c->scratch_cap = cap;
  }
  *out = c->scratch;
  return TC_OK;
}

int tc__cpu_xfers(cpu_ctx_t *ctx, size_t n, tc_xfer_t **out) {
  cpu_comm_t *c = ctx->c;
  if (n > c->xf_cap) {
    size_t cap = c->xf_cap ? c->xf_cap : 16;
    while (cap < n) cap *= 2;
    tc_xfer_t *p = realloc(c->xf, cap * sizeof *p);
    if (!p) return tc__cpu_fail(ctx, TC_ERR_NOMEM, "out of memory (%zu transfers)", n);
    c->xf = p;
    c->xf_cap = cap;
  }
  *out = c->xf;
  return TC_OK;
}

/* Fingerprints owed (TCP). In a small broadcast (at most
 * CPU_OWED_OP_BYTES) a rank compares at once only the fingerprint of the
 * peer that sends it the data (its parent in the tree, algo_move.c; that
 * peer sends its fingerprint ahead of the data), and reads the others of
 * its pairs (cpu_xchg_fp) later: the root all of them, a receiver all but
 * its parent's. Its own fingerprint goes at once to the peers it sends
 * data to, and as a lazy send to the others (tc_xfer_t.lazy: queued, and
 * written with the next message to that peer, before the rank sleeps in a
 * wait, or 16 at a time; tcp.c, "Lazy sends"). So a rank never takes data
 * it has not checked (never a wrong result), and no rank waits for a peer
 * that sends it nothing. It reads what a peer owes before anything else from that
 * peer: at its next exchange that receives from it; when CPU_OWED_MAX are
 * owed, or it sent the peer more than CPU_OWED_BYTES since the oldest (it
 * then waits for the oldest half at least); and at finalize
 * (tc__cpu_settle). A mismatch is then reported by that later operation,
 * naming the broadcast, as the shared-memory root's lazy check does
 * (shm_algos.c). The byte bound keeps what a peer has not read within what
 * the sockets hold (Linux starts a connection with 16 KiB to send and 128
 * KiB to receive), so that two ranks that are both a broadcast's root,
 * neither reading, never block in a send: each reads the other's
 * fingerprint, sent ahead of its data, and both fail with the mismatch.
 * 2 ranks, 8 bytes: 4.6 us per broadcast with a round trip to the
 * receiver, 3.5 without (docs/benchmarks.md, "Broadcast over TCP without a
 * round trip"). 4 ranks on 2 cores: 80 us when only the root deferred
 * (the receivers exchanged fingerprints among themselves at every
 * broadcast, a barrier), 13.8 with every rank deferring (Open MPI 3.9)
 * (docs/benchmarks.md, "Small broadcasts over TCP at any rank count"). */
#define CPU_OWED_MAX 64u
#define CPU_OWED_BYTES (32u * 1024u)
#define CPU_OWED_OP_BYTES (4u * 1024u)
/* the ring: CPU_OWED_MAX owed, and as many being read */
#define CPU_OWED_RING (2u * CPU_OWED_MAX)
typedef struct cpu_owed {
  uint32_t head, n; /* a ring of CPU_OWED_RING, oldest at head */
  uint32_t take;    /* the oldest ones the current exchange reads */
  uint32_t bytes;   /* what this rank sent the peer with the ones owed */
  uint32_t sent[CPU_OWED_RING];  /* the same per broadcast */
  tc_opfp_t want[CPU_OWED_RING]; /* this rank's fingerprint of each */
  tc_opfp_t got[CPU_OWED_RING];  /* the peer's, as received */
} cpu_owed_t;

/* The current exchange reads the oldest k fingerprints peer p owes. */
static void owed_take(cpu_comm_t *c, int p, uint32_t k) {
  cpu_owed_t *o = c->owed[p];
  if (k > o->n) k = o->n;
  if (k <= o->take) return;
  if (o->take == 0) c->owed_touch[c->owed_ntouch++] = p;
  o->take = k;
}

/* Peer p owes this rank its fingerprint of the current collective, a
 * broadcast that sends it at most `bytes` besides. */
static int owed_push(cpu_ctx_t *ctx, int p, uint32_t bytes) {
  cpu_comm_t *c = ctx->c;
  if (!c->owed) {
    c->owed = calloc((size_t)c->size, sizeof *c->owed);
    c->owed_touch = calloc((size_t)c->size, sizeof *c->owed_touch);
    if (!c->owed || !c->owed_touch) {
      free(c->owed);
      free(c->owed_touch);
      c->owed = NULL;
      c->owed_touch = NULL;
      return tc__cpu_fail(ctx, TC_ERR_NOMEM, "out of memory (fingerprints owed by peers)");
    }
  }
  if (!c->owed[p] && !(c->owed[p] = calloc(1, sizeof(cpu_owed_t))))
    return tc__cpu_fail(ctx, TC_ERR_NOMEM, "out of memory (fingerprints owed by peer %d)", p);
  cpu_owed_t *o = c->owed[p];
  /* the oldest that must be read now, so that the rest and this one stay
   * within the bounds: half of them at least (one wait for many) */
  uint32_t k = 0, left = o->bytes;
  while (k < o->n && (o->n - k + 1 > CPU_OWED_MAX || left + bytes > CPU_OWED_BYTES))
    left -= o->sent[(o->head + k++) % CPU_OWED_RING];
  if (k && k < o->n / 2) k = o->n / 2;
  if (k) owed_take(c, p, k);
  if (o->n >= CPU_OWED_RING) /* a failed exchange left them: broken */
    return tc__cpu_fail(ctx, TC_ERR_INTERNAL, "internal error: %u fingerprints owed by peer "
                        "%d were not read", o->n, p);
  uint32_t at = (o->head + o->n) % CPU_OWED_RING;
  o->want[at] = ctx->fp;
  o->sent[at] = bytes;
  o->bytes += bytes;
  o->n++;
  c->owed_n++;
  return TC_OK;
}

/* tc_tp_op_t.owed_want and owed_read: the i-th oldest fingerprint peer p
 * owes (from 0), read by the transport while it waits for something else. */
static const tc_opfp_t *owed_want(void *arg, int p, uint32_t i) {
  cpu_comm_t *c = arg;
  const cpu_owed_t *o = c->owed ? c->owed[p] : NULL;
  return o && i < o->n && !o->take ? &o->want[(o->head + i) % CPU_OWED_RING] : NULL;
}
/* The k oldest fingerprints o holds were read: no longer owed. */
static void owed_drop(cpu_comm_t *c, cpu_owed_t *o, uint32_t k) {
  for (uint32_t j = 0; j < k; j++) o->bytes -= o->sent[(o->head + j) % CPU_OWED_RING];
  o->head = (o->head + k) % CPU_OWED_RING;
  o->n -= k;
  c->owed_n -= k;
}
static void owed_read(void *arg, int p, uint32_t k) {
  cpu_comm_t *c = arg;
  owed_drop(c, c->owed[p], k);
}

/* Writes the receives of what the current exchange reads (owed_take) at x
 * (room for owed_n); returns their number. */
static size_t owed_recvs(cpu_comm_t *c, tc_xfer_t *x) {
  size_t m = 0;
  for (int i = 0; i < c->owed_ntouch; i++) {
    int p = c->owed_touch[i];
    cpu_owed_t *o = c->owed[p];
    for (uint32_t j = 0; j < o->take; j++) {
      uint32_t at = (o->head + j) % CPU_OWED_RING;
      x[m] = tc__xfer_recv(p, &o->got[at], sizeof o->got[at]);
      x[m].kind = TC_XFER_FP;
      x[m++].fp_want = &o->want[at];
    }
  }
  return m;
}

/* After the exchange: what it read is no longer owed (a failed exchange
 * breaks the communicator; what it did not read stays). */
static void owed_done(cpu_comm_t *c, int rc) {
  for (int i = 0; i < c->owed_ntouch; i++) {
    cpu_owed_t *o = c->owed[c->owed_touch[i]];
    if (rc == TC_OK) owed_drop(c, o, o->take);
    o->take = 0;
  }
  c->owed_ntouch = 0;
}

static int cpu_fpx_room(cpu_ctx_t *ctx, size_t need) {
  cpu_comm_t *c = ctx->c;
  if (need <= c->fpx_cap) return TC_OK;
  tc_xfer_t *p = realloc(c->fpx, need * sizeof *p);
  if (!p) return tc__cpu_fail(ctx, TC_ERR_NOMEM, "out of memory (%zu transfers)", need);
  c->fpx = p;
  c->fpx_cap = need;
  return TC_OK;
}

/* Over TCP a collective's fingerprint goes to each peer it exchanges with
 * and to the ranks at distances 1, 2, 4, ... on either side (connected at
 * creation; with them every rank is linked to every other through compared
 * pairs, whatever the algorithm), queued ahead of the first transfer with
 * that peer in the operation (and one comes back, at once or, to the root
 * of a broadcast, later: see "Fingerprints owed"), so that each arrives
 * (and is compared, transport.h) before any data of the op from that peer.
 * Both sides add the pair at their first transfer with each other in the
 * op (the distance set with the op's first exchange, or at its end when it
 * moved nothing), so they always match. A rank that finds a mismatch tells
 * the others (TC_XFER_NOTICE). At most 2 log2(n) peers beyond the
 * algorithm's are involved: a lazy mesh connects no others. An exchange
 * that receives from a peer that owes fingerprints reads those first (also
 * outside collectives: ctx->fp_todo 0). */
static int cpu_xchg_fp(cpu_ctx_t *ctx, tc_xfer_t *x, size_t n, tc_tp_op_t *t) {
  cpu_comm_t *c = ctx->c;
  int dist[128], nd = 0;
  const int pair = ctx->fp_todo;
  if (pair && !ctx->fp_any)
    for (int d = 1; d < c->size && nd + 2 <= (int)(sizeof dist / sizeof dist[0]); d *= 2) {
      dist[nd++] = (c->rank + d) % c->size;
      dist[nd++] = (c->rank - d + c->size) % c->size;
    }
  if (pair) ctx->fp_any = 1;
  /* the root of a broadcast receives nothing in it (algo_move.c) */
  const size_t obytes = ctx->op ? ctx->op->count * ctx->es : 0;
  const int small_bcast = pair && ctx->op && ctx->op->kind == TC_KIND_BROADCAST &&
                          obytes <= CPU_OWED_OP_BYTES;
  /* the owed ones read here come first; at most owed_n of them, and the
   * pairs are written after that many, then moved down */
  const size_t base = c->owed_n, cand = pair ? n + (size_t)nd : 0;
  TC_CHECK(cpu_fpx_room(ctx, base + 2 * cand + n));
  uint64_t seq = ctx->fp.seq;
  size_t k = base;
  c->owed_ntouch = 0;
  for (size_t i = 0; i < cand; i++) {
    int p = i < (size_t)nd ? dist[i] : x[i - (size_t)nd].peer;
    if (p < 0 || p >= c->size || p == c->rank || c->fp_seq[p] == seq) continue;
    c->fp_seq[p] = seq;
    /* in a small broadcast: does p send this rank data in this exchange
     * (its parent in the tree: compared now, before the data), or this
     * rank p (its fingerprint goes at once, ahead of the data)? */
    int gets = 0, gives = 0;
    for (size_t j = 0; small_bcast && j < n; j++)
      if (x[j].peer == p) *(x[j].is_send ? &gives : &gets) = 1;
    /* what each side counts for one owed fingerprint (CPU_OWED_BYTES) */
    const uint32_t weigh = (uint32_t)obytes + 2 * (uint32_t)sizeof(tc_opfp_t) + 16u;
    c->fpx[k] = tc__xfer_send(p, &ctx->fp, sizeof ctx->fp);
    c->fpx[k].lazy = small_bcast && !gives ? weigh : 0; /* p reads it later */
    c->fpx[k++].kind = TC_XFER_FP;
    if (small_bcast && !gets) {
      int rc = owed_push(ctx, p, weigh);
      if (rc != TC_OK) {
        owed_done(c, rc);
        return rc;
      }
      continue;
    }
    c->fpx[k] = tc__xfer_recv(p, &c->peer_fp[p], sizeof ctx->fp);
    c->fpx[k++].kind = TC_XFER_FP;
  }
  if (c->owed_n)
    for (size_t i = 0; i < n; i++) {
      int p = x[i].peer;
      if (!x[i].is_send && p >= 0 && p < c->size && c->owed[p] && c->owed[p]->n)
        owed_take(c, p, c->owed[p]->n);
    }
  if (c->owed_n) /* a pair's peer: before its fingerprint */
    for (size_t i = base; i < k; i++)
      if (!c->fpx[i].is_send && c->owed[c->fpx[i].peer] && c->owed[c->fpx[i].peer]->n)
        owed_take(c, c->fpx[i].peer, c->owed[c->fpx[i].peer]->n);
  size_t m = c->owed_ntouch ? owed_recvs(c, c->fpx) : 0;
  if (m != base) memmove(c->fpx + m, c->fpx + base, (k - base) * sizeof *c->fpx);
  k = m + (k - base);
  if (pair) t->fp = &ctx->fp;
  if (k == 0) return n ? c->tp_ops->exchange(c->tp, x, n, t) : TC_OK;
  if (n) memcpy(c->fpx + k, x, n * sizeof *x);
  int rc = c->tp_ops->exchange(c->tp, c->fpx, k + n, t);
  if (n) memcpy(x, c->fpx + k, n * sizeof *x); /* the transfers' progress, as the caller's */
  owed_done(c, rc);
  return rc;
}

int tc__cpu_xchg(cpu_ctx_t *ctx, tc_xfer_t *x, size_t n) {
  if (n == 0) return TC_OK;
  cpu_comm_t *c = ctx->c;
  if (!c->tp)
    return tc__cpu_fail(ctx, TC_ERR_INTERNAL, "internal error: no transport");
  tc_tp_op_t t = {.opname = ctx->opname, .deadline = ctx->deadline,
                  .timeout_s = ctx->timeout_s, .msg = ctx->msg,
                  .msglen = sizeof ctx->msg, .coll = ctx->fp.seq,
                  .owed_want = owed_want, .owed_read = owed_read, .owed_arg = c};
  if (ctx->fp_todo || c->owed_n) return cpu_xchg_fp(ctx, x, n, &t);
  return c->tp_ops->exchange(c->tp, x, n, &t);
}

int tc__cpu_settle(cpu_ctx_t *ctx) {
  cpu_comm_t *c = ctx->c;
  if (c->lazy_lo) TC_CHECK(tc__cpu_fast_settle(ctx));
  if (!c->owed_n || !c->tp) return TC_OK;
  TC_CHECK(cpu_fpx_room(ctx, c->owed_n));
  c->owed_ntouch = 0;
  for (int p = 0; p < c->size; p++)
    if (c->owed[p] && c->owed[p]->n) owed_take(c, p, c->owed[p]->n);
  size_t m = owed_recvs(c, c->fpx);
  tc_tp_op_t t = {.opname = ctx->opname, .deadline = ctx->deadline,
                  .timeout_s = ctx->timeout_s, .msg = ctx->msg,
                  .msglen = sizeof ctx->msg};
  int rc = c->tp_ops->exchange(c->tp, c->fpx, m, &t);
  owed_done(c, rc);
  return rc;
}

static uint64_t cpu_hash_counts(const tc_block_t *b, int n) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (int i = 0; i < n; i++)
    for (int k = 0; k < 8; k++)
      h = (h ^ ((uint64_t)b[i].count >> (8 * k) & 0xff)) * 1099511628211ull;
  return h;
}

/* What the ranks must agree on for collective number seq: the call, the
 * dtype, the reduction and root when it takes them, and the counts (one
 * count when the call took one; a hash of every rank's block counts when
 * they are global knowledge; per peer, checked by the transport, for an
 * all-to-all with counts). */
void tc__cpu_fingerprint(const cpu_comm_t *c, const tc_backend_op_t *op, uint64_t seq,
                         tc_opfp_t *f) {
  memset(f, 0, sizeof *f);
  f->seq = seq;
  f->op = (uint8_t)op->type;
  f->dtype = op->kind == TC_KIND_BARRIER ? 0 : (uint8_t)op->dtype;
  f->redop = tc_backend_op_reduces(op) ? (uint8_t)op->redop.type : TC_OPFP_NO_REDOP;
  f->root = op->root >= 0 && op->kind != TC_KIND_ALL_REDUCE ? op->root : -1;
  f->count = op->kind == TC_KIND_BARRIER ? 0 : op->count;
  if (op->flags & TC_OPF_UNIFORM) return;
  switch (op->kind) {
  case TC_KIND_ALL_GATHER:
    f->count = cpu_hash_counts(op->recv, c->size);
    f->flags = TC_OPFP_COUNTS_HASHED;
    break;
  case TC_KIND_REDUCE_SCATTER:
    f->count = cpu_hash_counts(op->send, c->size);
    f->flags = TC_OPFP_COUNTS_HASHED;
    break;
  case TC_KIND_ALL_TO_ALL:
    f->count = 0;
    f->flags = TC_OPFP_COUNTS_PER_PEER;
    break;
  default: break;
  }
}

static int cpu_run_algo(cpu_ctx_t *ctx) {
  switch (ctx->op->kind) {
  case TC_KIND_SEND:
  case TC_KIND_RECV: return tc__cpu_p2p(ctx);
  case TC_KIND_BATCH: return tc__cpu_batch(ctx);
  case TC_KIND_BROADCAST: return tc__cpu_broadcast(ctx);
  case TC_KIND_ALL_REDUCE: return tc__cpu_all_reduce(ctx);
  case TC_KIND_REDUCE: return tc__cpu_reduce(ctx);
  case TC_KIND_ALL_GATHER: return tc__cpu_all_gather(ctx);
  case TC_KIND_REDUCE_SCATTER: return tc__cpu_reduce_scatter(ctx);
  case TC_KIND_ALL_TO_ALL: return tc__cpu_all_to_all(ctx);
  case TC_KIND_BARRIER: return tc__cpu_barrier(ctx);
  case TC_KIND_SCATTER: return tc__cpu_scatter(ctx);
  case TC_KIND_GATHER: return tc__cpu_gather(ctx);
  case TC_KIND_COUNT: break;
  }
  return tc__cpu_fail(ctx, TC_ERR_NOT_SUPPORTED, "operation type %d is not supported",
                      (int)ctx->op->type);
}

int tc__cpu_run(cpu_ctx_t *ctx) {
  if (ctx->c->hier && tc__cpu_hier_takes(ctx->c, ctx->op)) {
    ctx->fp_todo = 0; /* the groups' steps compare their own fingerprints */
    return tc__cpu_hier_run(ctx);
  }
  if (ctx->fp_todo && ctx->c->shm) { /* the fingerprints through the slots */
    TC_CHECK(tc__cpu_fast_fpsync(ctx));
    ctx->fp_todo = 0;
  }
  ctx->fp_any = 0;
  int rc = cpu_run_algo(ctx);
  if (rc == TC_OK && ctx->fp_todo && !ctx->fp_any && ctx->c->tp && ctx->c->size > 1) {
    /* moved no data: the fingerprints with the distance set alone */
    tc_tp_op_t t = {.opname = ctx->opname, .deadline = ctx->deadline,
                    .timeout_s = ctx->timeout_s, .msg = ctx->msg,
                    .msglen = sizeof ctx->msg, .coll = ctx->fp.seq};
    rc = cpu_xchg_fp(ctx, NULL, 0, &t);
  }
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Progress thread                                                           */
/* ------------------------------------------------------------------------ */

static int cpu_on_thread(const cpu_comm_t *c) {
  return c->thread_started && pthread_equal(pthread_self(), c->thread);
}

/* A context for c: everything but the 1 KiB message zeroed (zeroing the
 * whole context, as a designated initializer does, was a tenth of a small
 * operation). */
void tc__cpu_ctx_init(cpu_ctx_t *ctx, cpu_comm_t *c, const char *opname) {
  /* every field but msg's 1 KiB, one by one (memset's call cost ~30
   * instructions of an 8-byte operation); a field added to cpu_ctx_t
   * (which has no hole before msg on a 64-bit target) fails this
   * assertion until it is set here */
  _Static_assert(sizeof(void *) != 8 || offsetof(cpu_ctx_t, msg) == 104,
                 "tc__cpu_ctx_init sets every field of cpu_ctx_t");
  ctx->c = c;
  ctx->op = NULL;
  ctx->opname = opname;
  ctx->rank = c->rank;
  ctx->size = c->size;
  ctx->es = 0;
  ctx->deadline = ctx->timeout_s = 0;
  ctx->fp = (tc_opfp_t){0};
  ctx->fp_todo = ctx->fp_any = ctx->fam = 0;
  ctx->fbytes = 0;
  ctx->line = 0;
  ctx->msg[0] = 0;
}

/* An operation ended with rc: a failure breaks the communicator (the
 * first one's text is kept for every later refusal). */
static void cpu_ended(cpu_comm_t *c, const cpu_ctx_t *ctx, int rc) {
  if (rc != TC_OK && c->broken_rc == TC_OK && !atomic_load(&c->aborted)) {
    c->broken_rc = rc;
    snprintf(c->broken_msg, sizeof c->broken_msg, "%s #%llu: %.700s", ctx->opname,
             (unsigned long long)ctx->op->seq, ctx->msg);
  }
}

/* Runs (or resumes) one operation. inline_spin >= 0: on the caller's
 * thread, a shared-memory operation may give up at a wait that spun that
 * long; returns 0 then (e keeps its progress, the work is not reported),
 * 1 once the work was reported. */
static int cpu_exec(cpu_comm_t *c, cpu_qent_t *e, double inline_spin) {
  cpu_ctx_t ctx;
  tc__cpu_ctx_init(&ctx, c, tc__op_name(e->op->type));
  ctx.op = e->op;
  ctx.es = tc__dtype_size(e->op->dtype);
  int rc;
  if (e->deadline != 0) { /* begun inline: resume */
    ctx.timeout_s = e->timeout_s;
    ctx.deadline = e->deadline;
    tc__cpu_fingerprint(c, e->op, e->seq, &ctx.fp);
    rc = tc__cpu_fast_run(&ctx, &e->fst, inline_spin);
  } else if (atomic_load(&c->aborted)) {
    rc = tc__cpu_fail(&ctx, TC_ERR_ABORTED, "communicator was aborted");
  } else if (c->broken_rc != TC_OK) {
    rc = tc__cpu_fail(&ctx, c->broken_rc,
                      "an earlier operation failed (%s); the communicator must be "
                      "aborted and recreated", c->broken_msg);
  } else {
    c->host->work_started(e->work);
    e->timeout_s = e->op->timeout_s > 0 ? e->op->timeout_s : c->timeout_s;
    /* started inside the post (inline_spin >= 0): the issue is the start,
     * and its time is known; else a coarse read, a few ms early at most */
    e->deadline = (inline_spin >= 0 && e->op->issue_time > 0 ? e->op->issue_time
                                                             : tc__now_coarse()) +
                  e->timeout_s;
    ctx.timeout_s = e->timeout_s;
    ctx.deadline = e->deadline;
    if (tc_backend_op_is_collective(e->op)) {
      e->seq = ++c->coll_seq;
      tc__cpu_fingerprint(c, e->op, e->seq, &ctx.fp);
      ctx.fp_todo = c->check_fp && c->size > 1;
    }
    rc = e->fst.kind ? tc__cpu_fast_run(&ctx, &e->fst, inline_spin) : tc__cpu_run(&ctx);
  }
  if (rc != CPU_PENDING && c->scratch_cap > CPU_SCRATCH_KEEP) { /* a rare huge staging */
    free(c->scratch);
    c->scratch = NULL;
    c->scratch_cap = 0;
  }
  if (rc == CPU_PENDING) return 0;
  cpu_ended(c, &ctx, rc);
  if (inline_spin < 0) {
    /* the thread: idle before reporting, so that a caller woken by the
     * report finds the communicator idle and runs its next operation
     * inline; an inline operation reports only after this report */
    atomic_store(&c->reporting, 1);
    pthread_mutex_lock(&c->mu);
    atomic_store(&c->running, 0);
    pthread_cond_broadcast(&c->idle_cv);
    pthread_mutex_unlock(&c->mu);
    c->host->work_complete(e->work, rc, rc == TC_OK ? NULL : ctx.msg);
    atomic_store(&c->reporting, 0);
  } else {
    while (atomic_load(&c->reporting)) sched_yield();
    c->host->work_complete(e->work, rc, rc == TC_OK ? NULL : ctx.msg);
  }
  return 1;
}

/* With mu held: waits until no operation runs (an inline one may). */
static void cpu_wait_idle(cpu_comm_t *c) {
  atomic_fetch_add(&c->idle_waiters, 1);
  while (atomic_load(&c->running)) {
    /* a timed wait: cpu_lane_give sees this waiter without a fence, so
     * its broadcast may be missed; the running flag is looked at again
     * every millisecond instead (finalize, abort and drain wait here, not
     * operations) */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* idle_cv's clock */
    ts.tv_nsec += 1000000;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&c->idle_cv, &c->mu, &ts);
  }
  atomic_fetch_sub(&c->idle_waiters, 1);
}

static void *cpu_thread(void *arg) {
  cpu_comm_t *c = arg;
  for (;;) {
    pthread_mutex_lock(&c->mu);
    for (;;) {
      int z = 0;
      if (atomic_load(&c->qlen) > 0 && atomic_compare_exchange_strong(&c->running, &z, 1))
        break; /* the lane is the thread's: run the first in line */
      if (c->draining || atomic_load(&c->aborted)) {
        if (atomic_load(&c->running)) { /* let an inline operation end */
          cpu_wait_idle(c);
          continue;
        }
        if (atomic_load(&c->qlen) == 0) { /* nothing left */
          pthread_mutex_unlock(&c->mu);
          return NULL;
        }
        continue;
      }
      pthread_cond_wait(&c->cv, &c->mu);
    }
    cpu_qent_t e = c->q[c->qhead];
    c->qhead = (c->qhead + 1) % c->qcap;
    atomic_fetch_sub(&c->qlen, 1);
    pthread_mutex_unlock(&c->mu);
    cpu_exec(c, &e, -1); /* clears running */
  }
}

/* Takes the lane for an inline run, without mu: nothing running, nothing
 * queued, still accepting (checked after the swap: finalize and abort clear
 * accepting, then wait for the lane; a poster that queued meanwhile is run
 * first, by the thread). 1: taken. */
static int cpu_lane_take(cpu_comm_t *c) {
  int z = 0;
  if (atomic_load(&c->qlen) != 0 || !atomic_compare_exchange_strong(&c->running, &z, 1))
    return 0;
  if (atomic_load(&c->accepting) && atomic_load(&c->qlen) == 0) return 1;
  atomic_store(&c->running, 0);
  pthread_mutex_lock(&c->mu);
  if (atomic_load(&c->qlen)) pthread_cond_signal(&c->cv);
  pthread_cond_broadcast(&c->idle_cv);
  pthread_mutex_unlock(&c->mu);
  return 0;
}

/* Gives the lane back; mu only when someone is to be woken (the thread,
 * for posts queued meanwhile, or a wait for idle). A release store, not a
 * sequentially consistent one (a locked exchange, draining every store of
 * the operation before it: about 5 % of a small operation, perf): nothing
 * can be queued while the lane is held inline (posts come under the core's
 * lock, which the inline operation's post holds; the thread takes from
 * the queue only), and the waits for idle look again every millisecond
 * (cpu_wait_idle). */
static void cpu_lane_give(cpu_comm_t *c) {
  /* who to wake is read before the lane goes, and the store that lets it
   * go is the last touch of c: an abort from another thread waits for the
   * lane, then frees c (ThreadSanitizer saw the reads after the store
   * race with that free). A waiter that comes after the reads looks again
   * within the millisecond, as it would after a missed broadcast. */
  if (__builtin_expect(atomic_load_explicit(&c->qlen, memory_order_relaxed) ||
                           atomic_load_explicit(&c->idle_waiters, memory_order_relaxed),
                       0)) {
    pthread_mutex_lock(&c->mu); /* the freer takes it after us */
    atomic_store_explicit(&c->running, 0, memory_order_release);
    if (atomic_load(&c->qlen)) pthread_cond_signal(&c->cv);
    pthread_cond_broadcast(&c->idle_cv);
    pthread_mutex_unlock(&c->mu);
    return;
  }
  atomic_store_explicit(&c->running, 0, memory_order_release);
}

/* With mu held: room for one more entry. */
static int cpu_queue_room(cpu_comm_t *c) {
  if (c->qlen < c->qcap) return TC_OK;
  size_t cap = c->qcap * 2;
  cpu_qent_t *q = malloc(cap * sizeof *q);
  if (!q) return TC_ERR_NOMEM;
  for (size_t i = 0; i < c->qlen; i++) q[i] = c->q[(c->qhead + i) % c->qcap];
  free(c->q);
  c->q = q;
  c->qcap = cap;
  c->qhead = 0;
  return TC_OK;
}

/* tc_backend_ops_t.express: a synchronous collective through the small
 * slots, run to its end here when the communicator is idle (nothing queued
 * or running: taking the lane keeps issue order), waiting as the thread
 * would (spin, then sleep until the deadline; abort wakes it). It spares
 * the work's report and the posting's classification (cpu_post, cpu_exec);
 * the slots' protocol is the same, so peers may run the same operation
 * either way. Anything else is declined before it begins. */
/* An express operation's start (cpu_express, cpu_express_p2p): 1 with the
 * lane taken; 0 when the backend declines (run on its thread, or busy, or
 * broken or aborted: the post reports that, as for any operation). */
static int cpu_express_lane(cpu_comm_t *c) {
  if (c->inline_max == 0 || cpu_on_thread(c) || !cpu_lane_take(c)) return 0;
  if (atomic_load_explicit(&c->aborted, memory_order_relaxed) || c->broken_rc != TC_OK) {
    cpu_lane_give(c);
    return 0;
  }
  return 1;
}

/* An express operation's end (cpu_express, cpu_express_p2p): reported
 * after the thread's report of the operation before (cpu_exec), and before
 * the lane goes (abort and destroy wait for it); prompt: no wait of it
 * read the clock, and the core may take its begin for its end. */
static int cpu_express_end(cpu_comm_t *c, const tc_backend_express_t *x, const cpu_ctx_t *ctx,
                           int rc, int prompt) {
  cpu_ended(c, ctx, rc);
  while (atomic_load(&c->reporting)) {
    prompt = 0;
    sched_yield();
  }
  if (prompt && rc == TC_OK) x->end_prompt(x->arg);
  else x->end(x->arg, rc, rc == TC_OK ? NULL : ctx->msg);
  cpu_lane_give(c);
  return rc;
}

/* The bytes a point-to-point operation moves (its sends' and receives'). */
static size_t cpu_p2p_bytes(const tc_backend_op_t *op) {
  if (op->kind != TC_KIND_BATCH) return op->count * tc__dtype_size(op->dtype);
  size_t b = 0;
  for (size_t i = 0; i < op->num_p2p; i++)
    b += op->p2p[i].count * tc__dtype_size(op->p2p[i].dtype);
  return b;
}

/* cpu_express for a synchronous send, recv or batch over shared memory
 * (TC_BACKEND_CAP_EXPRESS_P2P): what cpu_post's inline run of it does
 * (cpu_exec on the caller's thread, the lane held), without the work
 * object and its reports (2 ranks, 8 B, a batch of a send and a recv per
 * rank: 2 150 -> 1 810 instructions per operation, 0.58 -> 0.53 us;
 * docs/benchmarks.md). Over TCP, or between hosts, the work path: its
 * waits are the transport's, and a prompt end could not be told. */
static int cpu_express_p2p(cpu_comm_t *c, const tc_backend_op_t *op,
                           const tc_backend_express_t *x) {
  if (!c->shm || c->hier || !cpu_express_lane(c)) return TC_BACKEND_DECLINED;
  x->begin(x->arg);
  const uint64_t clock_waits = tc__shm_clock_waits(c->shm);
  cpu_ctx_t ctx;
  tc__cpu_ctx_init(&ctx, c, tc__op_name(op->type));
  ctx.op = op;
  ctx.es = tc__dtype_size(op->dtype);
  ctx.timeout_s = op->timeout_s > 0 ? op->timeout_s : c->timeout_s;
  ctx.deadline = op->issue_time + ctx.timeout_s;
  /* peers may keep it waiting: the caller's lock goes first (as cpu_post) */
  if (op->flags & TC_BACKEND_OP_REPORT_BLOCKING) x->blocking(x->arg);
  int rc = tc__cpu_run(&ctx);
  if (c->scratch_cap > CPU_SCRATCH_KEEP) { /* a rare huge staging */
    free(c->scratch);
    c->scratch = NULL;
    c->scratch_cap = 0;
  }
  /* a prompt end only for a few bytes: a large copy reads no clock either */
  return cpu_express_end(c, x, &ctx, rc,
                         tc__shm_clock_waits(c->shm) == clock_waits &&
                             cpu_p2p_bytes(op) <= CPU_EXPRESS_P2P_PROMPT_MAX);
}

static int cpu_express(void *bc, const tc_backend_op_t *op, const tc_backend_express_t *x) {
  cpu_comm_t *c = bc;
  if (op->kind == TC_KIND_SEND || op->kind == TC_KIND_RECV || op->kind == TC_KIND_BATCH)
    return cpu_express_p2p(c, op, x);
  cpu_ctx_t ctx;
  cpu_fast_t st;
  tc_opfp_t fp = {0};
  /* the classification and the fingerprint of the last such operation,
   * else made now and kept (about a tenth of a small operation's
   * instructions; a declined one's classification too). Read and written
   * here only before begin, under the core's lock, which begin lets go */
  const int same = c->xc_valid && op->type == c->xc_type && op->count == c->xc_count &&
                   op->dtype == c->xc_dtype && (int)op->redop.type == c->xc_redop &&
                   op->root == c->xc_root;
  if (same) {
    st = c->xc_st;
    fp = c->xc_fp;
  } else {
    memset(&st, 0, sizeof st);
    if (tc__cpu_fast_kind(c, op, &st) == CPU_FAST_SMALL) tc__cpu_fingerprint(c, op, 0, &fp);
    /* the key says all there is: no per-rank counts, or one for all */
    c->xc_valid = (!op->send && !op->recv) || (op->flags & TC_OPF_UNIFORM);
    c->xc_type = op->type;
    c->xc_dtype = op->dtype;
    c->xc_count = op->count;
    c->xc_redop = (int)op->redop.type;
    c->xc_root = op->root;
    c->xc_st = st;
    c->xc_fp = fp;
  }
  if (st.kind != CPU_FAST_SMALL || !cpu_express_lane(c)) return TC_BACKEND_DECLINED;
  x->begin(x->arg);
  const uint64_t clock_waits = tc__shm_clock_waits(c->shm);
  tc__cpu_ctx_init(&ctx, c, tc__op_name(op->type));
  ctx.op = op;
  ctx.es = tc__dtype_size(op->dtype);
  ctx.timeout_s = op->timeout_s > 0 ? op->timeout_s : c->timeout_s;
  ctx.deadline = op->issue_time + ctx.timeout_s;
  ctx.fp = fp;
  ctx.fp.seq = ++c->coll_seq;
  /* the caller's lock (wait hooks) is kept over a wait within the spin,
   * let go before one that may sleep */
  int rc = tc__cpu_fast_run(
      &ctx, &st, (op->flags & TC_BACKEND_OP_REPORT_BLOCKING) ? tc__shm_spin_s(c->shm) : -1.0);
  if (rc == CPU_PENDING) {
    x->blocking(x->arg);
    rc = tc__cpu_fast_run(&ctx, &st, -1.0);
  }
  return cpu_express_end(c, x, &ctx, rc, tc__shm_clock_waits(c->shm) == clock_waits);
}

static int cpu_post(void *bc, const tc_backend_op_t *op, tc_work_t *work, char *err,
                    size_t errlen) {
  cpu_comm_t *c = bc;
  cpu_qent_t e = {.op = op, .work = work};
  if (c->inline_max > 0 && !cpu_on_thread(c) && cpu_lane_take(c)) {
    const int sync = !(op->flags & TC_BACKEND_OP_ASYNC);
    if (tc__cpu_fast_kind(c, op, &e.fst) && (e.fst.bytes <= c->inline_max || sync)) {
      /* idle: run it on the caller's thread, spinning at most briefly; an
       * operation that cannot finish that soon goes on to the thread.
       * After a hand-off the peers may be waking up on their threads,
       * which takes longer than the usual spin: wait longer for a while,
       * so that the ranks fall back into step instead of handing off every
       * other operation; a peer late even so is slow, not waking: stop.
       * A synchronous one runs here at any size: its caller waits for it
       * anyway, and the thread copying beside a caller waiting on the same
       * core took longer (2 ranks, Intel Xeon guest, medians of 9
       * alternating launches, us: all_gather 4 MiB 370 -> 356, all_to_all
       * 4 MiB 366 -> 355, 16 MiB the same; 4 ranks, all_to_all 4 MiB 802
       * -> 741: docs/benchmarks.md, "Synchronous operations on the
       * caller's thread"). Copying takes longer than a spin there: a
       * caller's lock goes first */
      if (e.fst.bytes > c->inline_max && (op->flags & TC_BACKEND_OP_REPORT_BLOCKING))
        c->host->work_blocking(work);
      double base = tc__shm_spin_s(c->shm);
      int boosted = c->inline_boost > 0;
      int done = cpu_exec(c, &e, boosted ? CPU_INLINE_BOOST * base : base);
      if (done) c->inline_boost -= boosted;
      else c->inline_boost = boosted ? 0 : CPU_INLINE_BOOST_OPS; /* late even so: a slow peer */
      if (done) {
        cpu_lane_give(c);
        return TC_OK;
      }
      /* first in line: posts during the attempt queued behind it */
      pthread_mutex_lock(&c->mu);
      int rc = cpu_queue_room(c);
      if (rc == TC_OK) {
        c->qhead = (c->qhead + c->qcap - 1) % c->qcap;
        c->q[c->qhead] = e;
        atomic_fetch_add(&c->qlen, 1);
      }
      atomic_store(&c->running, 0);
      pthread_cond_signal(&c->cv);
      pthread_cond_broadcast(&c->idle_cv);
      pthread_mutex_unlock(&c->mu);
      if (rc != TC_OK) /* begun: it cannot be refused any more */
        c->host->work_complete(work, TC_ERR_NOMEM,
                               "out of memory growing the operation queue");
      return TC_OK;
    }
    if (!e.fst.kind && (c->size == 1 || !(op->flags & TC_BACKEND_OP_ASYNC))) {
      /* nothing to wait for (world size 1) or a synchronous operation (its
       * caller waits for it anyway; point-to-point, batches, the rest): run
       * it here, sparing two thread hand-offs; abort still interrupts it
       * (the eventfd in every poll set of TCP, the futex bell of shared
       * memory). Peers may keep it waiting: the caller's lock goes first
       * (TC_BACKEND_CAP_BLOCKING_REPORTED) */
      if ((op->flags & TC_BACKEND_OP_REPORT_BLOCKING) && c->size > 1)
        c->host->work_blocking(work);
      cpu_exec(c, &e, 0.0);
      cpu_lane_give(c);
      return TC_OK;
    }
    cpu_lane_give(c);
  }
  pthread_mutex_lock(&c->mu);
  if (!atomic_load(&c->accepting)) {
    int aborted = atomic_load(&c->aborted);
    pthread_mutex_unlock(&c->mu);
    if (aborted) return cpu_err(err, errlen, TC_ERR_ABORTED, "communicator was aborted");
    return cpu_err(err, errlen, TC_ERR_INVALID_USAGE, "communicator was finalized");
  }
  if (cpu_queue_room(c) != TC_OK) {
    pthread_mutex_unlock(&c->mu);
    return cpu_err(err, errlen, TC_ERR_NOMEM, "out of memory growing the operation queue");
  }
  tc__cpu_fast_kind(c, op, &e.fst);
  c->q[(c->qhead + atomic_load(&c->qlen)) % c->qcap] = e;
  atomic_fetch_add(&c->qlen, 1);
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
  return TC_OK;
}

/* ------------------------------------------------------------------------ */
/* Lifecycle                                                                 */
/* ------------------------------------------------------------------------ */

/* With life_mu held. */
static void cpu_join(cpu_comm_t *c) {
  if (c->thread_started && !c->thread_joined && !cpu_on_thread(c)) {
    pthread_join(c->thread, NULL);
    c->thread_joined = 1;
  }
}

/* With life_mu held, after the join. */
static void cpu_close_transport(cpu_comm_t *c) {
  if (c->closed) return;
  pthread_mutex_lock(&c->mu); /* an inline operation may still use it */
  cpu_wait_idle(c);
  pthread_mutex_unlock(&c->mu);
  pthread_mutex_lock(&c->tp_mu);
  if (c->tp && c->leave_clean && c->tp_ops->leave) c->tp_ops->leave(c->tp);
  if (c->tp) c->tp_ops->close(c->tp);
  c->tp = NULL;
  c->shm = NULL;
  c->areas = (tc_shm_areas_t){0}; /* its segments are unmapped */
  c->slot_k1 = 0;
  c->closed = 1;
  pthread_mutex_unlock(&c->tp_mu);
  if (c->hier) tc__cpu_hier_close(c, c->leave_clean);
}

void tc__cpu_free(cpu_comm_t *c) {
  if (c->hier) tc__cpu_hier_free(c);
  if (c->wake_fd >= 0) close(c->wake_fd);
  pthread_mutex_destroy(&c->mu);
  pthread_mutex_destroy(&c->life_mu);
  pthread_mutex_destroy(&c->tp_mu);
  pthread_cond_destroy(&c->cv);
  pthread_cond_destroy(&c->idle_cv);
  free(c->q);
  free(c->scratch);
  free(c->xf);
  free(c->fpx);
  if (c->owed)
    for (int p = 0; p < c->size; p++) free(c->owed[p]);
  free(c->owed);
  free(c->owed_touch);
  free(c->peer_fp);
  free(c->fp_seq);
  free(c);
}

static int cpu_init(const tc_backend_init_args_t *a, void **out, char *err,
                    size_t errlen) {
  *out = NULL;
  static const tc_tp_choice_t choices[] = {TC_TP_AUTO, TC_TP_SHM, TC_TP_TCP}; /* the table's */
  tc_tp_choice_t choice = choices[tc__setting_choice(TC_SET_CPU_TRANSPORT)];
  if (tc__setting_malformed(TC_SET_CPU_TRANSPORT)) { /* a backend created without tc_comm_create */
    const char *tpname = tc__setting_str(TC_SET_CPU_TRANSPORT);
    snprintf(err, errlen,
             "TORCHCOMMS_CPU_TRANSPORT='%s' is not supported (valid: auto, shm, tcp)",
             tpname);
    return TC_ERR_INVALID_ARGUMENT;
  }
  const char *dev = a->device ? a->device : "cpu";
  if (strncmp(dev, "cpu", 3) != 0 || (dev[3] && dev[3] != ':')) {
    char shown[64];
    if (a->device_index >= 0 && !strchr(dev, ':'))
      snprintf(shown, sizeof shown, "%s:%d", dev, a->device_index);
    else
      snprintf(shown, sizeof shown, "%s", dev);
    snprintf(err, errlen,
             "device '%s' is not served by this backend (it moves host memory only: "
             "use device 'cpu', or backend 'nccl' for CUDA tensors)", shown);
    return TC_ERR_INVALID_ARGUMENT;
  }
  /* a test layout of several hosts on this machine: the communicator is
   * TCP between every pair, as across machines */
  if (choice == TC_TP_AUTO && tc__cpu_hier_fake_hosts() != 0) choice = TC_TP_TCP;
  cpu_comm_t *c = NULL;
  int rc = tc__cpu_open(a, choice, 0, &c, err, errlen);
  if (rc == TC_OK) *out = c;
  return rc;
}

int tc__cpu_open(const tc_backend_init_args_t *a, tc_tp_choice_t choice, int child,
                 cpu_comm_t **out, char *err, size_t errlen) {
  *out = NULL;
  const char *cname = a->comm_name ? a->comm_name : "";
  cpu_comm_t *c = calloc(1, sizeof *c);
  if (!c) {
    snprintf(err, errlen, "out of memory");
    return TC_ERR_NOMEM;
  }
  c->host = a->host;
  snprintf(c->name, sizeof c->name, "%s", cname);
  snprintf(c->advertise, sizeof c->advertise, "%s", a->advertise_addr ? a->advertise_addr : "");
  c->rank = a->rank;
  c->size = a->world_size;
  c->timeout_s = a->timeout_s > 0 ? a->timeout_s : TC_DEFAULT_TIMEOUT_S;
  c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  atomic_init(&c->aborted, 0);
  pthread_mutex_init(&c->mu, NULL);
  pthread_mutex_init(&c->life_mu, NULL);
  pthread_mutex_init(&c->tp_mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  pthread_cond_init(&c->idle_cv, NULL);
  c->qcap = 64;
  c->q = malloc(c->qcap * sizeof *c->q);
  c->accepting = 1;
  int rc = TC_OK;
  if (c->wake_fd < 0 || !c->q) {
    snprintf(err, errlen, "%s",
             c->wake_fd < 0 ? "eventfd failed (file descriptor limit?)" : "out of memory");
    rc = c->wake_fd < 0 ? TC_ERR_SYSTEM : TC_ERR_NOMEM;
    goto fail;
  }
  c->check_fp = tc__setting_bool(TC_SET_CHECK_MISMATCH);
  c->peer_fp = calloc((size_t)c->size, sizeof *c->peer_fp);
  c->fp_seq = calloc((size_t)c->size, sizeof *c->fp_seq);
  if (!c->peer_fp || !c->fp_seq) {
    snprintf(err, errlen, "out of memory");
    rc = TC_ERR_NOMEM;
    goto fail;
  }
  c->inline_max = (size_t)tc__setting_bytes(TC_SET_CPU_INLINE_BYTES);
  if (c->size > 1) {
    tc_tp_args_t ta = {.host = a->host, .store = a->store, .comm_name = cname,
                       .rank = c->rank, .size = c->size,
                       .advertise_addr = a->advertise_addr,
                       .timeout_s = c->timeout_s, .wake_fd = c->wake_fd,
                       .aborted = &c->aborted,
                       .epoch = a->size >= offsetof(tc_backend_init_args_t, epoch) +
                                            sizeof a->epoch ? a->epoch : 0};
    rc = tc__transport_open(&ta, choice, &c->tp_ops, &c->tp, err, errlen);
    if (rc != TC_OK) goto fail;
    c->shm = tc__shm_of(c->tp_ops, c->tp);
    if (c->shm) tc__shm_areas(c->shm, &c->areas);
    c->slot_k1 = 0;
    c->small_ar = (size_t)tc__setting_bytes(TC_SET_CPU_SHM_SMALL_BYTES);
    if (tc__setting_is_set(TC_SET_CPU_STREAM_BYTES)) {
      c->stream_min = (size_t)tc__setting_bytes(TC_SET_CPU_STREAM_BYTES);
    } else {
      size_t llc = tc__cpu_llc_bytes("/sys/devices/system/cpu/cpu0/cache");
      if (!llc) {
        long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
        llc = v > 0 ? (size_t)v : 0;
      }
      c->stream_min = tc__cpu_stream_min(llc, c->size);
    }
    /* single copy (process_vm_readv from the peers' buffers) or two
     * copies through the shared segments: which is faster depends on the
     * host (on an AMD one the segments won 1.3-4x at 2 ranks from 16 KiB
     * to 16 MiB, on an Intel Xeon single copy won 1.2-2x from 64 KiB:
     * docs/benchmarks.md), so unless set it is measured here (where the
     * ranks are not more than the cores, else timings say little: off) */
    size_t cma_bytes = (size_t)tc__setting_bytes(TC_SET_CPU_CMA_BYTES);
    int can_cma = c->shm && tc__shm_cma(c->shm);
    c->cma_min = can_cma && cma_bytes > 0 ? cma_bytes : SIZE_MAX;
    c->cma_min_a2a = c->cma_min;
    if (can_cma && !tc__setting_is_set(TC_SET_CPU_CMA_BYTES)) {
      rc = tc__cpu_cma_calibrate(c, err, errlen);
      if (rc != TC_OK) goto fail;
    }
  }
  if (!child && c->tp_ops) {
    rc = tc__cpu_hier_setup(c, a, choice, err, errlen);
    if (rc != TC_OK) goto fail;
  }
  if (child) { /* a group of a hierarchy: run by its parent's thread */
    *out = c;
    return TC_OK;
  }
  /* the progress thread takes no asynchronous signals: they belong to the
   * application's threads */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int e = pthread_create(&c->thread, NULL, cpu_thread, c);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (e != 0) {
    snprintf(err, errlen, "could not start the progress thread: %s", strerror(e));
    rc = TC_ERR_SYSTEM;
    goto fail;
  }
  c->thread_started = 1;
  *out = c;
  return TC_OK;
fail:
  if (c->tp) c->tp_ops->close(c->tp);
  c->tp = NULL;
  if (c->hier) tc__cpu_hier_close(c, 0);
  tc__cpu_free(c);
  return rc;
}

static int cpu_finalize(void *bc, char *err, size_t errlen) {
  cpu_comm_t *c = bc;
  if (cpu_on_thread(c))
    return cpu_err(err, errlen, TC_ERR_INVALID_USAGE,
                   "finalize was called from a completion callback");
  pthread_mutex_lock(&c->life_mu);
  if (c->closed) {
    pthread_mutex_unlock(&c->life_mu);
    return TC_OK; /* second finalize, or after abort */
  }
  pthread_mutex_lock(&c->mu);
  c->accepting = 0;
  c->draining = 1;
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
  cpu_join(c); /* runs every queued operation first */
  int rc = TC_OK;
  if (atomic_load(&c->aborted)) {
    rc = cpu_err(err, errlen, TC_ERR_ABORTED, "communicator was aborted");
  } else if (c->broken_rc != TC_OK) {
    rc = cpu_err(err, errlen, c->broken_rc,
                 "an earlier operation failed (%s); connections were closed "
                 "without the orderly goodbye", c->broken_msg);
  } else if (c->tp) {
    if (c->lazy_lo || c->owed_n) { /* broadcasts it rooted, still to be checked */
      cpu_ctx_t ctx;
      tc__cpu_ctx_init(&ctx, c, "finalize");
      ctx.timeout_s = c->timeout_s;
      ctx.deadline = tc__now() + c->timeout_s;
      rc = tc__cpu_settle(&ctx);
      if (rc != TC_OK) cpu_err(err, errlen, rc, "%s", ctx.msg);
    }
    if (rc == TC_OK && c->hier) rc = tc__cpu_hier_finalize(c, err, errlen);
    tc_tp_op_t t = {.opname = "finalize", .deadline = tc__now() + c->timeout_s,
                    .timeout_s = c->timeout_s, .msg = err, .msglen = errlen};
    if (rc == TC_OK) rc = c->tp_ops->goodbye(c->tp, &t);
  }
  cpu_close_transport(c);
  pthread_mutex_unlock(&c->life_mu);
  return rc;
}

static int cpu_abort(void *bc) {
  cpu_comm_t *c = bc;
  /* Dropped with nothing in flight and nothing failed (destroy without
   * finalize, e.g. garbage collection): every operation this rank issued
   * completed, so the peers are told that it leaves after them (->leave),
   * and one still finishing them does not take the hang-up for a death. */
  pthread_mutex_lock(&c->mu);
  if (c->accepting && !c->running && c->qlen == 0 && c->broken_rc == TC_OK &&
      !atomic_load(&c->aborted))
    c->leave_clean = 1;
  c->accepting = 0;
  pthread_mutex_unlock(&c->mu);
  atomic_store(&c->aborted, 1);
  uint64_t one = 1;
  ssize_t w = write(c->wake_fd, &one, sizeof one); /* wakes every poll */
  (void)w;
  pthread_mutex_lock(&c->tp_mu); /* wakes futex waits (shm) */
  if (c->tp && c->tp_ops->interrupt) c->tp_ops->interrupt(c->tp);
  pthread_mutex_unlock(&c->tp_mu);
  if (c->hier) tc__cpu_hier_abort(c); /* wakes the groups' waits too */
  pthread_mutex_lock(&c->mu);
  c->accepting = 0;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  if (cpu_on_thread(c)) return TC_OK; /* from a callback: destroy joins */
  pthread_mutex_lock(&c->life_mu);
  cpu_join(c); /* the thread fails the running and queued operations */
  cpu_close_transport(c);
  pthread_mutex_unlock(&c->life_mu);
  return TC_OK;
}

static void cpu_destroy(void *bc) {
  cpu_comm_t *c = bc;
  if (!c) return;
  pthread_mutex_lock(&c->life_mu);
  int live = !c->closed;
  pthread_mutex_unlock(&c->life_mu);
  if (live) cpu_abort(c); /* neither finalized nor aborted */
  pthread_mutex_lock(&c->life_mu);
  cpu_join(c);
  cpu_close_transport(c);
  pthread_mutex_unlock(&c->life_mu);
  tc__cpu_free(c);
}

/* "16 KiB", "1 MiB", "100 B". */
static const char *cpu_bytes(size_t n, char *buf, size_t len) {
  static const char *const units[] = {"GiB", "MiB", "KiB"};
  for (int k = 0; k < 3; k++) {
    size_t u = (size_t)1 << (30 - 10 * k);
    if (n >= u && n % u == 0) {
      snprintf(buf, len, "%zu %s", n / u, units[k]);
      return buf;
    }
  }
  snprintf(buf, len, "%zu B", n);
  return buf;
}

/* tc_backend_ops_t.describe: this backend's part of the init summary. */
static void cpu_describe(void *bc, char *buf, size_t len) {
  const cpu_comm_t *c = bc;
  size_t at = 0;
#define PUT(...) tc__appendf(buf, len, &at, __VA_ARGS__)
  buf[0] = 0;
  if (!c->tp_ops) {
    PUT("transport: none (world size 1)");
  } else {
    PUT("transport per peer:");
    for (int p = 0, shown = 0; p < c->size; p++) {
      if (p == c->rank) continue;
      if (shown++ == 16) {
        PUT(" ... (every peer %s)", c->tp_ops->name);
        break;
      }
      PUT("%s %d %s", shown > 1 ? "," : "", p, c->tp_ops->name);
    }
    char d[512] = "";
    if (c->tp_ops->describe) c->tp_ops->describe(c->tp, d, sizeof d);
    if (d[0]) PUT("\n%s", d);
    if (c->hier) {
      tc__cpu_hier_describe(c, d, sizeof d);
      PUT("\n%s", d);
    }
  }
  char b1[32], b2[32], b3[32], b4[32], b5[32];
  if (c->inline_max)
    PUT("\nthresholds: caller's thread when idle up to %s (synchronous operations at any size)",
        cpu_bytes(c->inline_max, b1, sizeof b1));
  else
    PUT("\nthresholds: caller's thread never (TORCHCOMMS_CPU_INLINE_BYTES=0)");
  if (c->shm) {
    PUT("; shm all_reduce through the small slots up to %s; streaming stores from %s blocks; "
        "single copy %s%s",
        cpu_bytes(c->small_ar, b2, sizeof b2), cpu_bytes(c->stream_min, b4, sizeof b4),
        c->cma_min == SIZE_MAX ? "off" : "from ",
        c->cma_min == SIZE_MAX ? "" : cpu_bytes(c->cma_min, b3, sizeof b3));
    if (c->cma_min_a2a != c->cma_min)
      PUT(", for all_to_all %s%s", c->cma_min_a2a == SIZE_MAX ? "off" : "from ",
          c->cma_min_a2a == SIZE_MAX ? "" : cpu_bytes(c->cma_min_a2a, b3, sizeof b3));
    if (c->cma_cal_bytes) {
      const double *us = c->cma_cal_us;
      PUT(" (measured: all_gather of %s per rank %.1f us with it, %.1f us through the "
          "shared segments; all_to_all %.1f us with it, %.1f us through them",
          cpu_bytes(c->cma_cal_bytes, b3, sizeof b3), us[1], us[0], us[3], us[2]);
      if (c->cma_cal_small)
        PUT("; of %s per rank: all_gather %.1f us with it, %.1f us through them, "
            "all_to_all %.1f and %.1f",
            cpu_bytes(c->cma_cal_small, b3, sizeof b3), us[5], us[4], us[7], us[6]);
      PUT(")");
    }
  }
  if (c->tp_ops)
    PUT("; exchange algorithms: tree or recursive doubling below %s, ring above, "
        "one-round all_gather below %s, all_to_all below %s",
        cpu_bytes(CPU_SMALL_BYTES, b1, sizeof b1),
        cpu_bytes(CPU_DIRECT_GATHER_BYTES, b4, sizeof b4),
        cpu_bytes(CPU_DIRECT_A2A_BYTES, b5, sizeof b5));
  PUT("\nmismatch check %s", c->check_fp ? "on" : "off");
#undef PUT
}

const tc_backend_ops_t tc__cpu_backend = {
    .abi_version = TC_BACKEND_ABI_VERSION,
    .size = sizeof(tc_backend_ops_t),
    .name = "cpu",
    .version = CPU_BACKEND_VERSION,
    .init = cpu_init,
    .finalize = cpu_finalize,
    .abort = cpu_abort,
    .destroy = cpu_destroy,
    .post = cpu_post,
    .supports = NULL, /* every operation, dtype and reduction */
    .split = NULL,
    .describe = cpu_describe,
    .caps = TC_BACKEND_CAP_RECONFIGURE | TC_BACKEND_CAP_BLOCKING_REPORTED |
            TC_BACKEND_CAP_EXPRESS_P2P,
    .express = cpu_express,
    .window_create = tc__cpu_win_create,
    .window_attach = tc__cpu_win_attach,
    .window_ready = tc__cpu_win_ready,
    .window_op = tc__cpu_win_op,
    .window_map = tc__cpu_win_map,
    .window_free = tc__cpu_win_free,
};

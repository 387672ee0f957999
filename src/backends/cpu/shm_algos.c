/* shm_algos.c -- collectives straight on the shared-memory segments (used
 * when the communicator's transport is shm; see transport/shm.h).
 *
 * Sync points. Every rank has one flag in its segment; the k-th sync point
 * of the communicator (the same k on every rank: every rank takes the same
 * path for the same operation) is "flag >= k". A rank writes what peers
 * read at sync k into its slot (or half), posts k, waits for the flags it
 * needs, and reads. Peers read data of sync k only before they post k+1, so
 * a rank that has seen every flag >= k-1 may overwrite anything but what
 * was written at k-1: small slots rotate through a ring of TC_SHM_SLOTS by
 * k (an operation whose header and data fit in one cache line, up to 16
 * bytes, uses a ring of TC_SHM_LINES header lines instead: fp_line_class),
 * big halves alternate by a round counter, and each round's writes after
 * its first sync touch only the writer's own slice, which nobody reads at
 * that sync. Which rank's segment holds the slot a rank writes rotates too,
 * one segment per lap of the ring (fp_seg): a rank writes what its peer
 * wrote and it read a lap earlier, because on the machine we measure a
 * cache line moves to the core that reads it (2-2.8x faster exchanges from
 * 4 KiB), and for the same reason a rank takes its own contribution from
 * its own buffers rather than back from its slot where it can (fp_read).
 * The root of a small broadcast is the exception: it writes its slot
 * once every peer has left that slot's last use (flag >= k-TC_SHM_SLOTS+1;
 * k-TC_SHM_LINES+1 in the lines) and returns without waiting for its
 * receivers, so it runs ahead of them; the mismatch check of their headers
 * is made later (fp_begin_root, fp_lazy_check).
 *
 *  small (one sync, resumable, may run inline on the caller's thread):
 *   all_reduce      every rank copies its input into its slot; all reduce
 *                   all slots in rank order: identical bits everywhere.
 *   broadcast       below CPU_SHM_BCAST_HALVES: the root copies into its
 *                   slot and returns (up to TC_SHM_SLOTS-1 ahead, or
 *                   TC_SHM_LINES-1 in the lines), the others copy out (in
 *                   the lines fetching the root's next line ahead).
 *   barrier         post, wait for all.
 *   all_gather*     every rank copies its block in, everyone copies all out.
 *   reduce_scatter* every rank copies its whole input in; each reduces its
 *                   block from every slot in rank order.
 *   all_to_all_single  every rank copies its send buffer in; each copies
 *                   its block out of every slot.
 *  large (rounds through the two big halves, progress thread):
 *   all_reduce      per round: copy in, sync, each rank reduces its slice
 *                   of the round from every half (rank order) into its own
 *                   half, sync, everyone copies every slice out.
 *   broadcast, all_gather*, reduce_scatter*, all_to_all_single: one sync
 *                   per round, each byte copied in once and out once (a
 *                   broadcast of up to half a half moves on through the
 *                   half op by op: bcast_off).
 */
#include "backends/cpu/cpu.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>



enum { FAM_AR = 1, FAM_BCAST, FAM_BARRIER, FAM_AG, FAM_RS, FAM_A2A };

typedef struct fp_hdr {
  _Atomic uint64_t sync; /* written last (release): the rest is then valid */
  tc_opfp_t fp;          /* the operation's fingerprint (transport.h) */
  uint64_t bytes; /* this rank's contribution */
  uint64_t addr; /* single copy: where this rank's data lies, in its own address space */
} fp_hdr_t;

/* Two fingerprints equal to the byte (the common case of every check): three
 * 8-byte compares, not memcmp's call. */
_Static_assert(sizeof(tc_opfp_t) == 24, "a fingerprint is three 8-byte words");
static inline int fp_same(const tc_opfp_t *a, const tc_opfp_t *b) {
  uint64_t x[3], y[3];
  memcpy(x, a, sizeof x);
  memcpy(y, b, sizeof y);
  return ((x[0] ^ y[0]) | (x[1] ^ y[1]) | (x[2] ^ y[2])) == 0;
}

/* Header at the start of a small slot, data from FP_HDR on (cache-line
 * aligned); data that fits beside the header follows it at once instead, so
 * that a tiny operation's sync word, header and data share one cache line. */
#define FP_HDR 64u
/* The small slot of sync point k (transport/shm.h: a ring of TC_SHM_SLOTS). */
#define SLOT_I(k) ((int)((k) % TC_SHM_SLOTS))

/* Whose segment rank q writes in, in epoch e: the areas rotate through the
 * ranks' segments, so that a rank writes the slot (or half) that rank q+1
 * wrote one epoch earlier and this rank read then. On this machine, writing
 * lines this core read last, whose dirty copy the writer's peer holds, costs
 * a fraction of writing lines this core wrote and the peer then read: a
 * 2-rank exchange of 32 KiB each way took 2.2 us instead of 5.3, of 4 KiB
 * 0.34 instead of 0.6 (docs/benchmarks.md, "Whose lines a rank writes"). */
static inline int fp_seg(const cpu_comm_t *c, int q, uint64_t e) {
  uint32_t n = (uint32_t)c->size;
  uint32_t k = (n & (n - 1)) ? (uint32_t)(e % n) : (uint32_t)e & (n - 1);
  uint32_t g = (uint32_t)q + k; /* < 2n: no second division */
  return (int)(g >= n ? g - n : g);
}
/* Where a small slot or header line of sync point k lies in a segment
 * (line 1: the ring of header lines, for operations whose header and data
 * fit in one line: fp_line_class), and its epoch (one lap of its ring). */
static inline size_t fp_slot_off(const tc_shm_areas_t *a, uint64_t k, int line) {
  return line ? a->off_line + (size_t)(k % TC_SHM_LINES) * TC_SHM_LINE_STRIDE
              : a->off_slot + (size_t)SLOT_I(k) * a->slot_bytes;
}
static inline uint64_t fp_slot_epoch(uint64_t k, int line) {
  return line ? k / TC_SHM_LINES : k / TC_SHM_SLOTS;
}
/* The small slot (or header line) rank q writes at sync point k. */
static inline char *fp_slot_of(const cpu_comm_t *c, int q, uint64_t k, int line) {
  const tc_shm_areas_t *a = &c->areas;
  return a->base[fp_seg(c, q, fp_slot_epoch(k, line))] + fp_slot_off(a, k, line);
}
/* The same, for the current operation's sync points. An operation asks
 * for the slots of one sync point several times (its own, then each
 * peer's for the wait, the header check and the read): the epoch's
 * rotation and the slot's offset are kept for the last k and ring asked
 * (slot_k1 = (k + 1) * 2 + line, 0: none), so that each further call is an
 * add, a compare and a load. */
static inline char *fp_slot(cpu_comm_t *c, int q, uint64_t k, int line) {
  const tc_shm_areas_t *a = &c->areas;
  const uint64_t key = (k + 1) << 1 | (uint64_t)(line != 0);
  if (__builtin_expect(c->slot_k1 != key, 0)) {
    c->slot_rot = (uint32_t)fp_seg(c, 0, fp_slot_epoch(k, line));
    c->slot_off = fp_slot_off(a, k, line);
    c->slot_k1 = key;
  }
  const uint32_t n = (uint32_t)c->size, g = (uint32_t)q + c->slot_rot; /* < 2n */
  return a->base[g >= n ? g - n : g] + c->slot_off;
}
/* The big half rank q writes in round t (an epoch: the two halves). */
static inline char *fp_half(cpu_comm_t *c, int q, uint64_t t) {
  const tc_shm_areas_t *a = &c->areas;
  return a->base[fp_seg(c, q, t >> 1)] + a->off_half + (size_t)(t & 1) * a->half_bytes;
}
/* The part of its half that writer w fills for reader q in round t
 * (reduce_scatter, all_to_all: a half holds one part per destination). At
 * 2 ranks the index alternates by epoch between reader and writer, so that
 * the part a rank fills is the one it read in the previous epoch, from the
 * half it now writes (fp_seg). */
static inline char *fp_part(cpu_comm_t *c, int w, int q, uint64_t t, size_t part) {
  size_t i = (size_t)(c->size == 2 && (t >> 1 & 1) ? w : q);
  return fp_half(c, w, t) + i * part;
}
_Static_assert(sizeof(fp_hdr_t) % 8 == 0 && sizeof(fp_hdr_t) <= FP_HDR, "slot header");
_Static_assert(FP_HDR <= TC_SHM_LINE_STRIDE, "a header line holds a header and its data");
static size_t fp_data_off(size_t bytes) {
  return bytes + sizeof(fp_hdr_t) <= FP_HDR ? sizeof(fp_hdr_t) : FP_HDR;
}
/* 1 if an operation of `bytes` per rank (cpu_fast_t.bytes, the same on
 * every rank that runs the same operation) keeps its headers in the ring
 * of header lines rather than in the small slots: when its data fits
 * beside the header in one line. Ranks that disagree (mismatched counts)
 * look for each other's headers in both (fp_hdr_at). */
static int fp_line_class(size_t bytes) { return bytes + sizeof(fp_hdr_t) <= FP_HDR; }
/* The depth of the ring an operation of that class uses. */
static uint64_t fp_ring(int line) { return line ? TC_SHM_LINES : TC_SHM_SLOTS; }

/* Peer q's header of sync point s, q having posted s: h, where this rank's
 * operation (of class `line`) looks for it, or, when h holds another sync
 * point's, q's header of s in the other ring, *other set: q took s for an
 * operation of the other class (other counts: a mismatch). */
static const fp_hdr_t *fp_hdr_at(const cpu_comm_t *c, const fp_hdr_t *h, int q, uint64_t s,
                                 int line, int *other) {
  *other = 0;
  if (__builtin_expect(atomic_load_explicit(&h->sync, memory_order_acquire) == s, 1)) return h;
  const fp_hdr_t *o = (const fp_hdr_t *)fp_slot_of(c, q, s, !line);
  if (atomic_load_explicit(&o->sync, memory_order_acquire) != s) return h;
  *other = 1;
  return o;
}

/* The text for a peer whose header was in the other ring (fp_hdr_at) when
 * its fingerprint did not tell the difference (the check off): 1. */
static int fp_other_size(int q, const fp_hdr_t *h, char *why, size_t wl) {
  snprintf(why, wl, "peer %d runs this operation with another amount of data (%llu bytes "
           "of its own; mismatched counts between ranks?)", q, (unsigned long long)h->bytes);
  return 1;
}

/* The shared-memory family of an operation type, by its kind (an
 * all-to-all only when every rank's blocks are one count, back to back in
 * one buffer on both sides); 0: no shared-memory path. Also applied to a
 * peer's header, whose type is known from its fingerprint. */
static int fam_of(tc_op_type_t t) {
  const uint32_t a2a = TC_OPF_UNIFORM | TC_OPF_SEND_CONTIG | TC_OPF_RECV_CONTIG;
  switch (tc_backend_op_kind(t)) {
  case TC_KIND_ALL_REDUCE: return FAM_AR;
  case TC_KIND_BROADCAST: return FAM_BCAST;
  case TC_KIND_BARRIER: return FAM_BARRIER;
  case TC_KIND_ALL_GATHER: return FAM_AG;
  case TC_KIND_REDUCE_SCATTER: return FAM_RS;
  case TC_KIND_ALL_TO_ALL: return (tc_backend_op_flags(t) & a2a) == a2a ? FAM_A2A : 0;
  default: return 0;
  }
}

static const char *fam_name(uint32_t f) {
  static const char *const n[] = {"?", "all_reduce", "broadcast", "barrier",
                                   "all_gather", "reduce_scatter", "all_to_all"};
  return f < sizeof n / sizeof n[0] ? n[f] : "?";
}

static tc_tp_op_t fp_top(cpu_ctx_t *ctx) {
  tc_tp_op_t t = {.opname = ctx->opname, .deadline = ctx->deadline,
                  .timeout_s = ctx->timeout_s, .msg = ctx->msg, .msglen = sizeof ctx->msg,
                  .coll = ctx->fp.seq};
  return t;
}

/* Waits until rank q's flag (q < 0: every rank's) >= v. spin >= 0 (on the
 * caller's thread): spin that long (inside an operation at least
 * CPU_SHM_ROUND_SPIN), then return 1 (not yet). spin < 0 (the thread): spin
 * the transport's time (inside an operation, whose peers are busy with the
 * same rounds: CPU_SHM_ROUND_SPIN), then sleep until the deadline. */
static int fp_wait_any(cpu_comm_t *c, int q, uint64_t v, double spin, int inop,
                       const tc_tp_op_t *top);
/* The common case (every flag known to be that far: a compare) inline,
 * the rest in fp_wait_any (about 30 instructions per small operation). */
static inline int fp_wait(cpu_comm_t *c, int q, uint64_t v, double spin, int inop,
                          const tc_tp_op_t *top) {
  if (q < 0 && c->known_all >= v) return TC_OK;
  return fp_wait_any(c, q, v, spin, inop, top);
}
static int fp_wait_any(cpu_comm_t *c, int q, uint64_t v, double spin, int inop,
                       const tc_tp_op_t *top) {
  double sp = spin >= 0 ? spin : tc__shm_spin_s(c->shm);
  if (inop && sp < CPU_SHM_ROUND_SPIN) sp = CPU_SHM_ROUND_SPIN;
  int sleep = spin < 0;
  if (q >= 0) return tc__shm_wait_flag(c->shm, q, v, sp, sleep, top);
  if (c->known_all >= v) return TC_OK;
  /* what the flags were seen at, not only v: a broadcast root, which asks
   * for a point some way behind, then looks at its receivers' flags (whose
   * lines they post next) once per several broadcasts, not once per one */
  uint64_t lo = UINT64_MAX;
  for (int p = 0; p < c->size; p++) {
    if (p == c->rank) continue;
    int rc = tc__shm_wait_flag(c->shm, p, v, sp, sleep, top);
    if (rc != TC_OK) return rc;
    uint64_t f = tc__shm_flag(c->shm, p);
    if (f < lo) lo = f;
  }
  c->known_all = lo == UINT64_MAX ? v : lo;
  return TC_OK;
}

static int fp_lazy_check(cpu_ctx_t *ctx, uint64_t upto);

/* The next sync point, once every peer is done with what this rank wrote
 * two sync points ago (every peer's flag >= the previous one); the
 * broadcasts this rank rooted without waiting are checked up to there. */
static int fp_begin(cpu_ctx_t *ctx, double spin, int inop, const tc_tp_op_t *top,
                    uint64_t *s) {
  cpu_comm_t *c = ctx->c;
  int rc = fp_wait(c, -1, c->sync, spin, inop, top);
  if (rc != TC_OK) return rc;
  if (c->lazy_lo) TC_CHECK(fp_lazy_check(ctx, c->sync));
  *s = ++c->sync;
  return TC_OK;
}

/* The next sync point u for the root of a small broadcast, which writes
 * only its own slot (or header line) u % k, k the depth of its ring
 * (fp_ring), and waits for no receiver: once every peer is done with that
 * place's last use (flag >= u - k + 1), and no peer still has to check its
 * header there (a peer with a check pending that far back, aux <= u - k,
 * does it before it posts u - 1: that flag is awaited instead). So a root
 * runs up to k - 1 broadcasts ahead of its receivers: TC_SHM_LINES - 1 of
 * data that fits in a header line, TC_SHM_SLOTS - 1 of more. */
static int fp_begin_root(cpu_ctx_t *ctx, double spin, const tc_tp_op_t *top, uint64_t *s) {
  cpu_comm_t *c = ctx->c;
  const uint64_t u = c->sync + 1, k = fp_ring(ctx->line);
  const uint64_t need = u >= k ? u - k + 1 : 0;
  /* the checks of the receivers' headers of sync point t, in a ring of
   * depth K, are due before this rank posts t + K - 1 (a receiver may then
   * write its header of t + K there): at u, those of the slots up to u -
   * TC_SHM_SLOTS + 1, those of the lines up to u - TC_SHM_LINES + 1 */
  const uint64_t ks = TC_SHM_SLOTS, kl = TC_SHM_LINES;
  uint64_t due = 0;
  if (c->lazy_slot_lo && u >= ks && c->lazy_slot_lo <= u - ks + 1) due = u - ks + 1;
  else if (c->lazy_lo && u >= kl && c->lazy_lo <= u - kl + 1) due = u - kl + 1;
  int rc = fp_wait(c, -1, need > due ? need : due, spin, 0, top);
  if (rc != TC_OK) return rc;
  /* at 2 ranks the slot written at u held the peer's header of u - k
   * (fp_seg), which only this rank checks (a root checks its receivers'
   * headers), and this rank's own header of u - k is overwritten by the
   * peer itself: no peer's pending check to wait for (nor its flag line
   * to read, which it posts next, once per broadcast) */
  if (c->size > 2 && c->known_all < u - 1 && u > k)
    for (int p = 0; p < c->size; p++) {
      if (p == c->rank || tc__shm_flag(c->shm, p) >= u - 1) continue;
      uint64_t lp = atomic_load_explicit(tc__shm_aux(c->shm, p), memory_order_acquire);
      if (lp && lp <= u - k) {
        rc = fp_wait(c, p, u - 1, spin, 0, top);
        if (rc != TC_OK) return rc;
      }
    }
  /* when some are due, every header there is is checked, at once (its
   * loads overlap), not one per broadcast */
  if (due) TC_CHECK(fp_lazy_check(ctx, c->known_all > due ? c->known_all : due));
  if (c->check_fp && c->size > 1) { /* checked later, by fp_lazy_check */
    c->lazy[u % kl].s = u;
    c->lazy[u % kl].fp = ctx->fp;
    c->lazy[u % kl].line = (uint8_t)ctx->line;
    if (!ctx->line) {
      if (!c->lazy_slot_lo) c->lazy_slot_lo = u;
      c->lazy_slot_hi = u;
    }
    if (!c->lazy_lo) {
      c->lazy_lo = u;
      atomic_store_explicit(tc__shm_aux(c->shm, c->rank), u, memory_order_release);
    }
  }
  *s = ++c->sync;
  return TC_OK;
}

/* Checks the peers' headers of the broadcasts this rank rooted without
 * waiting, through sync point `upto` (every peer's flag is >= upto, so
 * their headers of those points are written, and kept until this rank
 * posts a flag past them: see fp_begin_root). A mismatch is reported by the
 * operation that finds it, naming the broadcast. */
static int fp_lazy_check(cpu_ctx_t *ctx, uint64_t upto) {
  cpu_comm_t *c = ctx->c;
  const uint64_t k = TC_SHM_LINES;
  uint64_t t = c->lazy_lo;
  for (; t <= upto && t <= c->sync; t++) {
    if (c->lazy[t % k].s != t) continue;
    const int line = c->lazy[t % k].line;
    for (int q = 0; q < c->size; q++) {
      if (q == c->rank) continue;
      int other; /* older points: no memo */
      const fp_hdr_t *h = fp_hdr_at(c, (const fp_hdr_t *)fp_slot_of(c, q, t, line), q, t,
                                    line, &other);
      uint64_t hs = atomic_load_explicit(&h->sync, memory_order_acquire);
      char why[400];
      if (hs != t)
        return tc__cpu_fail(ctx, TC_ERR_INTERNAL,
                            "internal error: peer %d's header of sync point %llu was "
                            "overwritten (%llu) before this rank checked it",
                            q, (unsigned long long)t, (unsigned long long)hs);
      /* the common case: the same fingerprint to the byte (fp_mismatch's) */
      if (!other && fp_same(&c->lazy[t % k].fp, &h->fp)) continue;
      if (tc__opfp_mismatch(&c->lazy[t % k].fp, c->rank, &h->fp, q, why, sizeof why) ||
          (other && fp_other_size(q, h, why, sizeof why)))
        return tc__cpu_fail(ctx, TC_ERR_PROTOCOL, "%s" TC_FOUND_LATER, why);
    }
  }
  uint64_t lo = 0;
  c->lazy_slot_lo = 0;
  /* the lowest pending point, and the lowest in the slots: the search
   * stops at the first pending one when no slot's is recorded from there on
   * (lazy_slot_hi), not at the end of the ring (a root of 8-byte
   * broadcasts checks one header per broadcast once its ring is full, and
   * scanned up to 31 entries each time: ~180 instructions a broadcast) */
  for (; t <= c->sync; t++)
    if (c->lazy[t % k].s == t) {
      if (!lo) lo = t;
      if (!c->lazy[t % k].line) {
        c->lazy_slot_lo = t;
        break;
      }
      if (t >= c->lazy_slot_hi) break;
    }
  c->lazy_lo = lo;
  atomic_store_explicit(tc__shm_aux(c->shm, c->rank), lo, memory_order_release);
  return TC_OK;
}

/* Finalize: the broadcasts this rank rooted are checked before it leaves
 * (every peer reached them), so a mismatch is never left unreported. */
int tc__cpu_fast_settle(cpu_ctx_t *ctx) {
  cpu_comm_t *c = ctx->c;
  if (!c->shm || !c->lazy_lo) return TC_OK;
  tc_tp_op_t top = fp_top(ctx);
  TC_CHECK(fp_wait(c, -1, c->sync, -1, 0, &top));
  return fp_lazy_check(ctx, c->sync);
}

/* A wait that may give up (inline): CPU_PENDING; errors as they are. */
#define FP_TRY(call)                                                           \
  do {                                                                         \
    int fp_rc_ = (call);                                                       \
    if (fp_rc_ == 1) return CPU_PENDING;                                       \
    if (fp_rc_ != TC_OK) return fp_rc_;                                        \
  } while (0)

/* ------------------------------------------------------------------------ */
/* Eligibility                                                               */
/* ------------------------------------------------------------------------ */

/* Bytes one rank puts through its slot or halves: the largest contribution
 * of any rank (the same on every rank), or SIZE_MAX when the operation has
 * no shared-memory path. */
static size_t fp_bytes(const cpu_comm_t *c, const tc_backend_op_t *op, int fam) {
  size_t es = tc__dtype_size(op->dtype), n = (size_t)c->size, m = 0;
  switch (fam) {
  case FAM_AR:
  case FAM_BCAST: return op->count * es;
  case FAM_BARRIER: return 0;
  case FAM_AG:
    for (size_t i = 0; i < n; i++)
      if (op->recv[i].count > m) m = op->recv[i].count;
    return m * es;
  case FAM_RS:
    for (size_t i = 0; i < n; i++) m += op->send[i].count;
    return m * es;
  case FAM_A2A: return n * op->count * es;
  default: return SIZE_MAX;
  }
}

/* The part of a half each destination gets: whole elements, 64-byte aligned
 * when possible. */
static size_t part_bytes(size_t half, int n, size_t es) {
  size_t p = half / (size_t)n;
  size_t a = p & ~(size_t)63;
  if (a >= es && a % es == 0) return a;
  return p / es * es;
}

/* A broadcast at 2 ranks with single copy is copied by both ranks, half
 * each, at any size (bcast_split_run). */
static inline int bcast_split(const cpu_comm_t *c, int fam) {
  return fam == FAM_BCAST && c->size == 2;
}

static int fast_kind(const cpu_comm_t *c, const tc_backend_op_t *op, int fam, size_t b) {
  size_t es = tc__dtype_size(op->dtype);
  if (!c->shm || c->size < 2) return 0;
  if (b == SIZE_MAX || (b == 0 && op->kind != TC_KIND_BARRIER)) return 0;
  size_t bcast_max = c->size > 2 ? CPU_CMA_MAX_BCAST_MANY : SIZE_MAX;
  size_t blk = fam == FAM_A2A ? op->count * es : b; /* what one peer reads of one rank */
  size_t cma_min = fam == FAM_A2A ? c->cma_min_a2a : c->cma_min;
  if ((fam == FAM_AG || fam == FAM_A2A || (fam == FAM_BCAST && b <= bcast_max)) &&
      b >= cma_min && (blk < CPU_CMA_MAX_BLOCK || bcast_split(c, fam)))
    return CPU_FAST_CMA;
  if (b + FP_HDR <= c->areas.slot_bytes && (fam != FAM_AR || b <= c->small_ar) &&
      (fam != FAM_BCAST ||
       b < (c->size > 2 ? CPU_SHM_BCAST_HALVES_MANY : CPU_SHM_BCAST_HALVES)))
    return CPU_FAST_SMALL;
  if (fam == FAM_AR && op->count < (size_t)c->size) return 0;
  if ((fam == FAM_RS || fam == FAM_A2A) &&
      part_bytes(c->areas.half_bytes, c->size, fam == FAM_A2A ? 1 : es) == 0)
    return 0;
  return CPU_FAST_BIG;
}

int tc__cpu_fast_kind(const cpu_comm_t *c, const tc_backend_op_t *op, cpu_fast_t *st) {
  st->fam = fam_of(op->type);
  st->bytes = st->fam && c->shm && c->size > 1 ? fp_bytes(c, op, st->fam) : SIZE_MAX;
  st->kind = fast_kind(c, op, st->fam, st->bytes);
  if (!st->kind) st->bytes = 0;
  return st->kind;
}

/* ------------------------------------------------------------------------ */
/* Headers: what every rank is doing, checked at an operation's first sync   */
/* ------------------------------------------------------------------------ */

static inline void fp_put_hdr(cpu_ctx_t *ctx, uint64_t s, size_t bytes) {
  fp_hdr_t *h = (fp_hdr_t *)fp_slot(ctx->c, ctx->rank, s, ctx->line);
  h->fp = ctx->fp; /* set for every collective, the check on or off */
  h->bytes = bytes;
  atomic_store_explicit(&h->sync, s, memory_order_release);
}

/* Small operations: waits on the peers' slot headers (sync, header and
 * data share the slot's first cache lines: one transfer instead of three)
 * rather than on their flags; q < 0: every peer. Seeing header s of a peer
 * means it began the operation of sync s, i.e. its flag is (or is about to
 * be) >= s, which is what known_all records. */
static int fp_wait_hdr(cpu_comm_t *c, int q, uint64_t v, int line, double spin,
                       const tc_tp_op_t *top) {
  double sp = spin >= 0 ? spin : tc__shm_spin_s(c->shm);
  int sleep = spin < 0;
  for (int p = q < 0 ? 0 : q; p < (q < 0 ? c->size : q + 1); p++) {
    if (p == c->rank) continue;
    const fp_hdr_t *h = (const fp_hdr_t *)fp_slot(c, p, v, line);
    /* there already (a broadcast's receiver, its root ahead): no call */
    if (atomic_load_explicit(&h->sync, memory_order_acquire) >= v) continue;
    /* or its flag: a peer of the other class (mismatched counts) wrote its
     * header in the other ring, where the check then finds it */
    int rc = tc__shm_wait_word(c->shm, p, &h->sync, v, sp, sleep, 1, top);
    if (rc != TC_OK) return rc;
  }
  if (q < 0 && c->known_all < v) c->known_all = v;
  return TC_OK;
}

static int fp_mismatch(cpu_ctx_t *ctx, int q, const fp_hdr_t *h, uint32_t fam, size_t bytes) {
  /* the common case in a few compares: the peer's fingerprint is this
   * rank's to the byte (the same operation, dtype, reduction, root and
   * counts: every check below passes) and its bytes are the expected */
  if (fp_same(&h->fp, &ctx->fp) && h->bytes == bytes) return TC_OK;
  const tc_backend_op_t *op = ctx->op;
  char why[400];
  if (ctx->c->check_fp && tc__opfp_mismatch(&ctx->fp, ctx->rank, &h->fp, q, why, sizeof why))
    return tc__cpu_fail(ctx, TC_ERR_PROTOCOL, "%s", why);
  /* the same operation type as this rank's: the same family */
  uint32_t hfam = h->fp.op == ctx->fp.op ? fam : (uint32_t)fam_of((tc_op_type_t)h->fp.op);
  if (hfam != fam)
    return tc__cpu_fail(ctx, TC_ERR_PROTOCOL,
                        "peer %d is in %s while this rank is in %s (mismatched "
                        "operations between ranks?)", q, fam_name(hfam), ctx->opname);
  if (fam == FAM_BCAST && h->fp.root != op->root)
    return tc__cpu_fail(ctx, TC_ERR_PROTOCOL,
                        "peer %d broadcasts from root %d but this rank expects root %d "
                        "(mismatched roots between ranks?)", q, (int)h->fp.root, op->root);
  if (h->bytes != bytes)
    return tc__cpu_fail(ctx, TC_ERR_PROTOCOL,
                        "peer %d sent %llu bytes but %zu were expected (mismatched "
                        "count or dtype between ranks?)",
                        q, (unsigned long long)h->bytes, bytes);
  if (fam != FAM_BARRIER && h->fp.dtype != (uint8_t)op->dtype)
    return tc__cpu_fail(ctx, TC_ERR_PROTOCOL,
                        "peer %d sent %s data but this rank expects %s (mismatched "
                        "dtypes between ranks?)", q, tc_dtype_name((tc_dtype_t)h->fp.dtype),
                        tc_dtype_name(op->dtype));
  return TC_OK;
}

/* The bytes peer q's header must say it put in (all_gather: its own
 * block; else the same for every rank). */
static inline size_t fp_want(const cpu_ctx_t *ctx, int q) {
  return ctx->fam == FAM_AG ? ctx->op->recv[q].count * ctx->es : ctx->fbytes;
}

/* Checks the headers of sync s: of rank `only`, or of every peer (-1). */
static int fp_check_hdrs(cpu_ctx_t *ctx, uint64_t s, int only) {
  cpu_comm_t *c = ctx->c;
  int fam = ctx->fam;
  for (int q = 0; q < ctx->size; q++) {
    if (q == ctx->rank || (only >= 0 && q != only)) continue;
    int other;
    const fp_hdr_t *h =
        fp_hdr_at(c, (const fp_hdr_t *)fp_slot(c, q, s, ctx->line), q, s, ctx->line, &other);
    TC_CHECK(fp_mismatch(ctx, q, h, (uint32_t)fam, fp_want(ctx, q)));
    char why[400];
    if (other && fp_other_size(q, h, why, sizeof why))
      return tc__cpu_fail(ctx, TC_ERR_PROTOCOL, "%s", why);
  }
  return TC_OK;
}

/* 1 if, at 2 ranks, the peer's header of sync point s lies in this rank's
 * ring and is this rank's to the byte (fp_mismatch's common case), checked
 * inline; 0: fp_check_hdrs decides (about 70 instructions fewer per small
 * operation on a receiver, or on each rank of all_reduce). */
static inline int fp_hdr2_same(const cpu_ctx_t *ctx, uint64_t s) {
  if (ctx->size != 2) return 0;
  const int q = ctx->rank ^ 1;
  const fp_hdr_t *h = (const fp_hdr_t *)fp_slot(ctx->c, q, s, ctx->line);
  return atomic_load_explicit(&h->sync, memory_order_acquire) == s && h->bytes == fp_want(ctx, q) &&
         fp_same(&h->fp, &ctx->fp);
}

/* ------------------------------------------------------------------------ */
/* Small: one sync through the slots                                         */
/* ------------------------------------------------------------------------ */

/* memcpy for the small path's copies, which do not overlap: up to 16
 * bytes (an operation whose data shares its header's line) in two loads
 * and two stores instead of the library's call (about 20 instructions of
 * an 8-byte broadcast's copy, on each side). */
static inline void fp_move(void *d, const void *s, size_t n) {
  char *dc = d;
  const char *sc = s;
  if (n >= 8 && n <= 16) {
    uint64_t a, b;
    memcpy(&a, sc, 8);
    memcpy(&b, sc + n - 8, 8);
    memcpy(dc, &a, 8);
    memcpy(dc + n - 8, &b, 8);
  } else if (n >= 4 && n < 8) {
    uint32_t a, b;
    memcpy(&a, sc, 4);
    memcpy(&b, sc + n - 4, 4);
    memcpy(dc, &a, 4);
    memcpy(dc + n - 4, &b, 4);
  } else {
    memcpy(d, s, n);
  }
}

/* Writes this rank's contribution into its slot (after the header). */
static size_t fp_write(cpu_ctx_t *ctx, char *d) {
  const tc_backend_op_t *op = ctx->op;
  int r = ctx->rank, n = ctx->size;
  size_t es = ctx->es, b = 0;
  int premul = op->redop.type == TC_PREMUL_SUM;
  switch (ctx->fam) {
  case FAM_AR:
    b = op->count * es;
    if (premul) tc__scale(d, op->recvbuf, op->count, op->dtype, op->redop.factor);
    else fp_move(d, op->recvbuf, b);
    break;
  case FAM_BCAST:
    b = op->count * es;
    if (r == op->root) fp_move(d, op->recvbuf, b);
    break;
  case FAM_AG:
    b = op->recv[r].count * es;
    if (b) fp_move(d, op->sendbuf, b);
    break;
  case FAM_RS:
    for (int i = 0; i < n; i++) {
      size_t cnt = op->send[i].count;
      const char *in = op->send[i].buf;
      if (!cnt) continue;
      if (premul) tc__scale(d + b, in, cnt, op->dtype, op->redop.factor);
      else memcpy(d + b, in, cnt * es);
      b += cnt * es;
    }
    break;
  case FAM_A2A:
    b = (size_t)n * op->count * es;
    fp_move(d, op->sendbuf, b);
    break;
  default: break;
  }
  return b;
}

/* Reads what the operation needs from the slots of sync s. */
static int fp_read(cpu_ctx_t *ctx, uint64_t s) {
  cpu_comm_t *c = ctx->c;
  const tc_backend_op_t *op = ctx->op;
  int r = ctx->rank, n = ctx->size, fam = ctx->fam;
  size_t es = ctx->es;
  tc_redop_type_t kop = cpu_kop(op);
  /* headers first: nothing is written on a mismatch */
  if (fam == FAM_BCAST && r == op->root) return TC_OK; /* checked later (fp_lazy_check) */
  if (!fp_hdr2_same(ctx, s))
    TC_CHECK(fp_check_hdrs(ctx, s, fam == FAM_BCAST && !c->check_fp ? op->root : -1));
  const size_t doff = fp_data_off(ctx->fbytes);
  /* A rank reads its own contribution from its own buffers where it can,
   * not back from its slot: the lines a peer read are then left to that
   * peer, which writes them next (fp_seg). Reductions keep rank order (the
   * same bits everywhere): the own input stands in for the own slot only
   * as the first or second operand, and not when scaled (premul). */
#define SLOT(q) (fp_slot(c, (q), s, ctx->line) + doff)
  const int own_in = r < 2 && op->redop.type != TC_PREMUL_SUM;
  switch (fam) {
  case FAM_AR: {
    char *out = op->recvbuf; /* in place: the input too */
    const char *a = own_in && r == 0 ? out : SLOT(0), *b = own_in && r == 1 ? out : SLOT(1);
    tc__reduce3(out, a, b, op->count, op->dtype, kop);
    for (int q = 2; q < n; q++) tc__reduce(out, SLOT(q), op->count, op->dtype, kop);
    if (op->redop.type == TC_AVG) tc__divide(out, op->count, op->dtype, (uint64_t)n);
    break;
  }
  case FAM_BCAST:
    if (r != op->root) fp_move(op->recvbuf, SLOT(op->root), op->count * es);
    break;
  case FAM_AG: {
    /* the own block first, from the send buffer (which may lie anywhere in
     * the output: the other blocks then overwrite it), or from the own slot
     * when the send buffer overlaps the own block's place in part */
    char *mine = op->recv[r].buf;
    const char *in = op->sendbuf;
    size_t mylen = op->recv[r].count * es;
    if (mylen && mine != in)
      memcpy(mine, cpu_overlaps(mine, mylen, in, mylen) ? SLOT(r) : in, mylen);
    for (int q = 0; q < n; q++) {
      size_t len = op->recv[q].count * es;
      if (q != r && len) fp_move(op->recv[q].buf, SLOT(q), len);
    }
    break;
  }
  case FAM_RS: {
    size_t mycnt = op->send[r].count, off = 0;
    for (int i = 0; i < r; i++) off += op->send[i].count * es;
    if (!mycnt) break;
    char *out = op->recvbuf;
    const char *in = op->send[r].buf;
    /* the own block as an operand: exactly the output (in place) or apart */
    int use_in = own_in && (in == out || !cpu_overlaps(in, mycnt * es, out, mycnt * es));
    const char *a = use_in && r == 0 ? in : SLOT(0) + off;
    const char *b = use_in && r == 1 ? in : SLOT(1) + off;
    tc__reduce3(out, a, b, mycnt, op->dtype, kop);
    for (int q = 2; q < n; q++) tc__reduce(out, SLOT(q) + off, mycnt, op->dtype, kop);
    if (op->redop.type == TC_AVG) tc__divide(out, mycnt, op->dtype, (uint64_t)n);
    break;
  }
  case FAM_A2A: {
    size_t bb = op->count * es;
    char *recv = op->recvbuf;
    const char *send = op->sendbuf;
    /* the own block from the send buffer unless the buffers overlap (in
     * place: other blocks overwrite it) */
    int self_in = !cpu_overlaps(send, (size_t)n * bb, recv, (size_t)n * bb);
    for (int q = 0; q < n; q++)
      fp_move(recv + (size_t)q * bb,
              q == r && self_in ? send + (size_t)r * bb : SLOT(q) + (size_t)r * bb, bb);
    break;
  }
  default: break;
  }
#undef SLOT
  return TC_OK;
}

static int small_run(cpu_ctx_t *ctx, cpu_fast_t *st, double spin) {
  cpu_comm_t *c = ctx->c;
  const tc_backend_op_t *op = ctx->op;
  tc_tp_op_t top = fp_top(ctx);
  const int root = ctx->fam == FAM_BCAST && ctx->rank == op->root;
  if (st->stage == 0) {
    uint64_t s;
    if (root) FP_TRY(fp_begin_root(ctx, spin, &top, &s));
    else FP_TRY(fp_begin(ctx, spin, 0, &top, &s));
    st->s = s;
    size_t b = fp_write(ctx, fp_slot(c, ctx->rank, s, ctx->line) +
                                 fp_data_off(ctx->fbytes));
    fp_put_hdr(ctx, s, b);
    /* a broadcast posts without a fence on every rank (transport/shm.c,
     * "Posts without a fence"): the root does not wait for its receivers,
     * and a receiver's fence waited for its header line, which the root
     * read a lap before (2 ranks, 8 B, medians of 12-16 alternating
     * launches: 0.20 -> 0.17-0.18 us; 32 B - 8 KiB the same either way) */
    if (ctx->fam == FAM_BCAST) tc__shm_post_light(c->shm, s);
    else tc__shm_post(c->shm, s);
    st->stage = 1;
  }
  /* the root's receivers are checked later (fp_lazy_check); a receiver
   * waits for every header when the check is on, so that a mismatch among
   * receivers fails all of them at once */
  if (root) return TC_OK;
  if (ctx->fam == FAM_BCAST && !c->check_fp)
    FP_TRY(fp_wait_hdr(c, op->root, st->s, ctx->line, spin, &top));
  else FP_TRY(fp_wait_hdr(c, -1, st->s, ctx->line, spin, &top));
  st->stage = 2;
  /* the receiver of a broadcast of a few bytes fetches the root's next
   * line now: a root that runs ahead has written it, and the transfer
   * overlaps with this operation's end instead of opening the next one
   * (2 ranks, 8 B: 0.26 -> 0.19 us per broadcast; docs/benchmarks.md) */
  if (ctx->fam == FAM_BCAST && ctx->line)
    __builtin_prefetch(fp_slot_of(c, op->root, st->s + 1, 1), 0, 3);
  return fp_read(ctx, st->s);
}

int tc__cpu_fast_fpsync(cpu_ctx_t *ctx) {
  cpu_comm_t *c = ctx->c;
  tc_tp_op_t top = fp_top(ctx);
  uint64_t s;
  ctx->line = fp_line_class(0); /* a header, no data */
  TC_CHECK(fp_begin(ctx, -1, 0, &top, &s));
  fp_put_hdr(ctx, s, 0);
  tc__shm_post(c->shm, s);
  TC_CHECK(fp_wait_hdr(c, -1, s, ctx->line, -1, &top));
  for (int q = 0; q < ctx->size; q++) {
    if (q == ctx->rank) continue;
    int other;
    const fp_hdr_t *h =
        fp_hdr_at(c, (const fp_hdr_t *)fp_slot(c, q, s, ctx->line), q, s, ctx->line, &other);
    char why[400];
    if (tc__opfp_mismatch(&ctx->fp, ctx->rank, &h->fp, q, why, sizeof why) ||
        (other && fp_other_size(q, h, why, sizeof why)))
      return tc__cpu_fail(ctx, TC_ERR_PROTOCOL, "%s", why);
  }
  return TC_OK;
}

/* ------------------------------------------------------------------------ */
/* Large: rounds through the big halves, resumable at every wait             */
/* ------------------------------------------------------------------------ */

/* dir/indexK/name's first line into buf; 0 if it cannot be read. */
static int cache_attr(const char *dir, int k, const char *name, char *buf, int len) {
  char path[512];
  snprintf(path, sizeof path, "%s/index%d/%s", dir, k, name);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  const int ok = fgets(buf, len, f) != NULL;
  fclose(f);
  return ok;
}

size_t tc__cpu_llc_bytes(const char *dir) {
  size_t best = 0;
  char buf[64];
  /* index0, index1, ...: one per cache, up to the first missing one */
  for (int k = 0; k < 16 && cache_attr(dir, k, "level", buf, sizeof buf); k++) {
    if (atoi(buf) != 3 || !cache_attr(dir, k, "size", buf, sizeof buf)) continue;
    char *end;
    const size_t v = (size_t)strtoull(buf, &end, 10);
    const size_t mul = *end == 'K' ? (size_t)1 << 10 : *end == 'M' ? (size_t)1 << 20
                       : *end == 'G' ? (size_t)1 << 30 : 1;
    if (v * mul > best) best = v * mul;
  }
  return best;
}

size_t tc__cpu_stream_min(size_t llc, int nranks) {
  size_t m = llc / (CPU_STREAM_LLC_PER_RANK * (size_t)(nranks > 1 ? nranks : 1));
  return m > CPU_STREAM_COPY_BYTES ? m : CPU_STREAM_COPY_BYTES;
}

/* A copy of the big halves' paths: with streaming stores when the block it
 * belongs to is large (c->stream_min, cpu.h), else memcpy. */
static void fp_copy(const cpu_comm_t *c, void *dst, const void *src, size_t len, size_t block) {
  if (block >= c->stream_min) tc__copy_stream(dst, src, len);
  else memcpy(dst, src, len);
}

/* The own slice of a big all_reduce is reduced and copied out by chunks of
 * this many bytes (a multiple of every element size). */
#define CPU_AR_CHUNK 8192u

static int big_all_reduce(cpu_ctx_t *ctx, cpu_fast_t *st, double spin) {
  cpu_comm_t *c = ctx->c;
  tc_shm_t *s = c->shm;
  const tc_backend_op_t *op = ctx->op;
  tc_tp_op_t top = fp_top(ctx);
  int r = ctx->rank, n = ctx->size, premul = op->redop.type == TC_PREMUL_SUM;
  size_t es = ctx->es, count = op->count;
  size_t per = c->areas.half_bytes / es; /* elements per round */
  tc_redop_type_t kop = cpu_kop(op);
  char *buf = op->recvbuf, *own = NULL;
  /* the own slice, scaled (premul), kept in scratch from stage 0 to 1 */
  if (premul) TC_CHECK(tc__cpu_scratch(ctx, cpu_blk_cnt(per, n, 0) * es, (void **)&own));
  for (;;) {
    size_t base = st->off, cnt = count - base < per ? count - base : per;
    char *ub = buf + base * es, *mine = fp_half(c, r, st->round);
    size_t moff = cpu_blk_off(cnt, n, r), mcnt = cpu_blk_cnt(cnt, n, r);
    switch (st->stage) {
    case 0: { /* copy in everything but the own slice (nobody else reads it) */
      if (base >= count) return TC_OK;
      uint64_t s1;
      FP_TRY(fp_begin(ctx, spin, base > 0, &top, &s1));
      st->s = s1;
      st->round = c->big_round++;
      mine = fp_half(c, r, st->round);
      if (base == 0) fp_put_hdr(ctx, s1, count * es);
      if (premul) {
        tc__scale(mine, ub, moff, op->dtype, op->redop.factor);
        tc__scale(mine + (moff + mcnt) * es, ub + (moff + mcnt) * es, cnt - moff - mcnt,
                  op->dtype, op->redop.factor);
        tc__scale(own, ub + moff * es, mcnt, op->dtype, op->redop.factor);
      } else {
        memcpy(mine, ub, moff * es);
        memcpy(mine + (moff + mcnt) * es, ub + (moff + mcnt) * es,
               (cnt - moff - mcnt) * es);
      }
      tc__shm_post(s, s1);
      st->stage = 1;
    } /* fall through */
    case 1: { /* reduce the own slice, rank order, into the own half */
      FP_TRY(fp_wait(c, -1, st->s, spin, 1, &top));
      if (base == 0) TC_CHECK(fp_check_hdrs(ctx, st->s, -1));
      /* by chunks of CPU_AR_CHUNK bytes, each copied to the output while
       * it is in L1 (2 ranks, alternating launches, 8 rounds, us: 64 KiB
       * 8.62 -> 8.07, 256 KiB 26.4 -> 25.8, 1 MiB 123 -> 120, 4 MiB 615 ->
       * 588; 4 ranks 256 KiB 75.3 -> 71.8; the whole slice, then the whole
       * copy, read the slice back from L2; docs/benchmarks.md, "all_reduce:
       * the own slice out by chunks") */
      const size_t step = CPU_AR_CHUNK / es;
      for (size_t i0 = 0; i0 < mcnt; i0 += step) {
        const size_t m = mcnt - i0 < step ? mcnt - i0 : step, o = (moff + i0) * es;
        const char *in = premul ? own + i0 * es : ub + o; /* this rank's input */
        char *dst = mine + o;
        tc__reduce3(dst, r == 0 ? in : fp_half(c, 0, st->round) + o,
                    r == 1 ? in : fp_half(c, 1, st->round) + o, m, op->dtype, kop);
        for (int q = 2; q < n; q++)
          tc__reduce(dst, q == r ? in : fp_half(c, q, st->round) + o, m, op->dtype, kop);
        if (op->redop.type == TC_AVG) tc__divide(dst, m, op->dtype, (uint64_t)n);
        memcpy(ub + o, dst, m * es);
      }
      st->s = ++c->sync; /* every flag >= the previous one is known */
      tc__shm_post(s, st->s);
      st->stage = 2;
    } /* fall through */
    case 2: /* every reduced slice out */
      FP_TRY(fp_wait(c, -1, st->s, spin, 1, &top));
      for (int q = 0; q < n; q++) {
        if (q == r) continue;
        size_t qo = cpu_blk_off(cnt, n, q), qc = cpu_blk_cnt(cnt, n, q);
        if (qc) memcpy(ub + qo * es, fp_half(c, q, st->round) + qo * es, qc * es);
      }
      st->off += per;
      st->stage = 0;
      break;
    }
  }
}

/* Where in its half the root of a broadcast of this many bytes writes in
 * round t. A broadcast moves one way: the root writes, the receivers only
 * read, so the lines the root writes are the ones a receiver read a few
 * rounds before, each a miss that takes the line back from the receiver's
 * cache. One of at most half the half's size moves on through the half
 * instead, one place per epoch, so a line comes back only after the
 * receivers have read about two halves' worth since (1 MiB by default, as
 * much as a core's L2 here; at 2 ranks the segments alternate by epoch
 * too, so each segment sees every other place): by then it has left their
 * caches and the root's store no longer waits on them. Measured at 2 ranks, medians of
 * 6 interleaved runs (with the 8 KiB switch in cpu.h): 16 KiB 2.17 ->
 * 1.54 us, 64 KiB 7.72 -> 5.66 us, 128 KiB 15.8 -> 10.6 us, 256 KiB the
 * same (docs/benchmarks.md). Offset 0 for larger ones. */
static size_t bcast_off(const cpu_comm_t *c, uint64_t t, size_t bytes) {
  size_t per = c->areas.half_bytes, l = (bytes + 4095) & ~(size_t)4095;
  if (l > per / 2) return 0;
  return (size_t)((t >> 1) % (per / l)) * l;
}

static int big_broadcast(cpu_ctx_t *ctx, cpu_fast_t *st, double spin) {
  cpu_comm_t *c = ctx->c;
  tc_shm_t *s = c->shm;
  const tc_backend_op_t *op = ctx->op;
  tc_tp_op_t top = fp_top(ctx);
  int r = ctx->rank, root = op->root;
  size_t bytes = op->count * ctx->es, per = c->areas.half_bytes;
  char *buf = op->recvbuf;
  for (;;) {
    size_t off = st->off, len = bytes - off < per ? bytes - off : per;
    if (st->stage == 0) {
      if (off >= bytes) {
        /* the root learns of a mismatch too: every receiver's header of
         * the first sync (already checked at the second round's start) */
        if (r == root && c->check_fp && !st->init) {
          FP_TRY(fp_wait(c, -1, st->s, spin, 1, &top));
          TC_CHECK(fp_check_hdrs(ctx, st->s, -1));
          st->init = 1;
        }
        return TC_OK;
      }
      if (r == root) {
        uint64_t k;
        FP_TRY(fp_begin(ctx, spin, off > 0, &top, &k));
        if (c->check_fp && off > 0 && !st->init) { /* every flag >= k - 1 is known */
          TC_CHECK(fp_check_hdrs(ctx, k - 1, -1));
          st->init = 1;
        }
        st->s = k;
        st->round = c->big_round++;
        if (off == 0) fp_put_hdr(ctx, k, bytes);
        memcpy(fp_half(c, r, st->round) + bcast_off(c, st->round, bytes), buf + off, len);
        tc__shm_post(s, k);
        st->off += per;
        continue;
      }
      /* a receiver writes nothing but its header: it need not wait for
       * the others in later rounds */
      if (off == 0 && c->check_fp) {
        uint64_t k;
        FP_TRY(fp_begin(ctx, spin, 0, &top, &k));
        st->s = k;
        fp_put_hdr(ctx, k, bytes);
      } else {
        st->s = ++c->sync;
      }
      st->round = c->big_round++;
      tc__shm_post(s, st->s);
      st->stage = 1;
    }
    int chk = off == 0 && c->check_fp ? -1 : root;
    FP_TRY(fp_wait(c, chk, st->s, spin, off > 0, &top));
    if (off == 0) TC_CHECK(fp_check_hdrs(ctx, st->s, chk));
    fp_copy(c, buf + off, fp_half(c, root, st->round) + bcast_off(c, st->round, bytes), len, bytes);
    st->off += per;
    st->stage = 0;
  }
}

static int big_all_gather(cpu_ctx_t *ctx, cpu_fast_t *st, double spin) {
  cpu_comm_t *c = ctx->c;
  tc_shm_t *s = c->shm;
  const tc_backend_op_t *op = ctx->op;
  tc_tp_op_t top = fp_top(ctx);
  int r = ctx->rank, n = ctx->size;
  size_t es = ctx->es, per = c->areas.half_bytes, most = fp_bytes(c, op, ctx->fam);
  char *mydst = op->recv[r].buf;
  size_t mylen = op->recv[r].count * es;
  /* the own block first, and into the halves from its place in the
   * output, where the copy left it in the cache (the send buffer may be
   * part of the output); a block too large for the cache is copied with
   * streaming stores instead, when the send buffer lies apart from the
   * output, and goes into the halves from the send buffer */
  const char *mysrc = mydst;
  if (mylen >= c->stream_min) {
    mysrc = op->sendbuf;
    for (int q = 0; q < n && mysrc != mydst; q++)
      if (cpu_overlaps(op->sendbuf, mylen, op->recv[q].buf, op->recv[q].count * es)) mysrc = mydst;
  }
  if (!st->init) {
    if (mysrc != mydst) tc__copy_stream(mydst, op->sendbuf, mylen);
    else if (mylen && mydst != (const char *)op->sendbuf) memmove(mydst, op->sendbuf, mylen);
    st->init = 1;
  }
  for (;;) {
    size_t off = st->off;
    if (st->stage == 0) {
      if (off >= most) return TC_OK;
      uint64_t k;
      FP_TRY(fp_begin(ctx, spin, off > 0, &top, &k));
      st->s = k;
      st->round = c->big_round++;
      if (off == 0) fp_put_hdr(ctx, k, mylen);
      if (off < mylen)
        memcpy(fp_half(c, r, st->round), mysrc + off, mylen - off < per ? mylen - off : per);
      tc__shm_post(s, k);
      st->stage = 1;
    }
    FP_TRY(fp_wait(c, -1, st->s, spin, 1, &top));
    if (off == 0) TC_CHECK(fp_check_hdrs(ctx, st->s, -1));
    for (int q = 0; q < n; q++) {
      char *dst = op->recv[q].buf;
      size_t len = op->recv[q].count * es;
      if (q == r || off >= len) continue;
      fp_copy(c, dst + off, fp_half(c, q, st->round), len - off < per ? len - off : per, len);
    }
    st->off += per;
    st->stage = 0;
  }
}

static int big_reduce_scatter(cpu_ctx_t *ctx, cpu_fast_t *st, double spin) {
  cpu_comm_t *c = ctx->c;
  tc_shm_t *s = c->shm;
  const tc_backend_op_t *op = ctx->op;
  tc_tp_op_t top = fp_top(ctx);
  int r = ctx->rank, n = ctx->size, premul = op->redop.type == TC_PREMUL_SUM;
  size_t es = ctx->es, part = part_bytes(c->areas.half_bytes, n, es), pe = part / es;
  tc_redop_type_t kop = cpu_kop(op);
  size_t maxcnt = 0, mycnt;
  for (int i = 0; i < n; i++)
    if (op->send[i].count > maxcnt) maxcnt = op->send[i].count;
  const char *myin = op->send[r].buf;
  mycnt = op->send[r].count;
  char *out = op->recvbuf, *own = NULL;
  /* the own chunk goes through scratch when scaled or when the output
   * overlaps the input */
  int stage_own = premul || cpu_overlaps(out, mycnt * es, myin, mycnt * es);
  if (stage_own) TC_CHECK(tc__cpu_scratch(ctx, part, (void **)&own));
  for (;;) {
    size_t off = st->off;
    if (st->stage == 0) {
      if (off >= maxcnt) {
        if (op->redop.type == TC_AVG && mycnt) tc__divide(out, mycnt, op->dtype, (uint64_t)n);
        return TC_OK;
      }
      uint64_t k;
      FP_TRY(fp_begin(ctx, spin, off > 0, &top, &k));
      st->s = k;
      st->round = c->big_round++;
      if (off == 0) fp_put_hdr(ctx, k, fp_bytes(c, op, ctx->fam));
      for (int q = 0; q < n; q++) {
        size_t cnt = op->send[q].count;
        const char *in = op->send[q].buf;
        if (off >= cnt || (q == r && !stage_own)) continue;
        size_t len = cnt - off < pe ? cnt - off : pe;
        char *d = q == r ? own : fp_part(c, r, q, st->round, part);
        if (premul) tc__scale(d, in + off * es, len, op->dtype, op->redop.factor);
        else memcpy(d, in + off * es, len * es);
      }
      tc__shm_post(s, k);
      st->stage = 1;
    }
    FP_TRY(fp_wait(c, -1, st->s, spin, 1, &top));
    if (off == 0) TC_CHECK(fp_check_hdrs(ctx, st->s, -1));
    if (off < mycnt) {
      size_t len = mycnt - off < pe ? mycnt - off : pe;
      const char *src[2];
      for (int q = 0; q < 2; q++)
        src[q] = q == r ? (stage_own ? own : myin + off * es)
                        : fp_part(c, q, r, st->round, part);
      char *dst = out + off * es;
      tc__reduce3(dst, src[0], src[1], len, op->dtype, kop);
      for (int q = 2; q < n; q++) {
        const char *sq = q == r ? (stage_own ? own : myin + off * es)
                                : fp_part(c, q, r, st->round, part);
        tc__reduce(dst, sq, len, op->dtype, kop);
      }
    }
    st->off += pe;
    st->stage = 0;
  }
}

static int big_all_to_all(cpu_ctx_t *ctx, cpu_fast_t *st, double spin) {
  cpu_comm_t *c = ctx->c;
  tc_shm_t *s = c->shm;
  const tc_backend_op_t *op = ctx->op;
  tc_tp_op_t top = fp_top(ctx);
  int r = ctx->rank, n = ctx->size;
  size_t es = ctx->es, bb = op->count * es, part = part_bytes(c->areas.half_bytes, n, 1);
  const char *send = op->sendbuf;
  char *recv = op->recvbuf;
  if (cpu_overlaps(send, (size_t)n * bb, recv, (size_t)n * bb)) { /* in place: staged */
    char *sc;
    TC_CHECK(tc__cpu_scratch(ctx, (size_t)n * bb, (void **)&sc));
    if (!st->init) memcpy(sc, send, (size_t)n * bb);
    send = sc;
  }
  if (!st->init) { /* send and recv lie apart (in place: staged above) */
    fp_copy(c, recv + (size_t)r * bb, send + (size_t)r * bb, bb, bb);
    st->init = 1;
  }
  for (;;) {
    size_t off = st->off, len = bb - off < part ? bb - off : part;
    if (st->stage == 0) {
      if (off >= bb) return TC_OK;
      uint64_t k;
      FP_TRY(fp_begin(ctx, spin, off > 0, &top, &k));
      st->s = k;
      st->round = c->big_round++;
      if (off == 0) fp_put_hdr(ctx, k, (size_t)n * bb);
      for (int q = 0; q < n; q++)
        if (q != r) memcpy(fp_part(c, r, q, st->round, part), send + (size_t)q * bb + off, len);
      tc__shm_post(s, k);
      st->stage = 1;
    }
    FP_TRY(fp_wait(c, -1, st->s, spin, 1, &top));
    if (off == 0) TC_CHECK(fp_check_hdrs(ctx, st->s, -1));
    for (int q = 0; q < n; q++)
      if (q != r) fp_copy(c, recv + (size_t)q * bb + off, fp_part(c, q, r, st->round, part), len, bb);
    st->off += part;
    st->stage = 0;
  }
}

/* ------------------------------------------------------------------------ */
/* Single copy: straight from the peers' buffers (process_vm_readv)          */
/* ------------------------------------------------------------------------ */

/* broadcast, all_gather, all_gather_single, all_to_all_single. At sync k
 * every rank publishes where its data lies in its own address space (the
 * root's buffer; the own block of the output; the send buffer); each reader
 * copies what it needs from there into its output; sync k+1 says "done
 * reading": only after every peer posted it may a rank return, because
 * until then its buffers are being read. Taken from c->cma_min bytes,
 * broadcasts of any size at 2 ranks (bcast_split) and up to
 * CPU_CMA_MAX_BCAST_MANY at more, all_gather / all_to_all blocks below
 * CPU_CMA_MAX_BLOCK (fast_kind). */

/* A broadcast at 2 ranks is copied by both: the receiver reads the first
 * half of the root's buffer (process_vm_readv) while the root writes the
 * second half into the receiver's output (process_vm_writev). 2 ranks,
 * Intel Xeon guest, 3 alternating launches, us, one reader against both:
 * 64 KiB 3.4 -> 2.8-3.1, 256 KiB 10.1-11.3 -> 6.2-7.0, 1 MiB 60-62 ->
 * 20-22, 4 MiB 381-394 -> 195-222 (docs/benchmarks.md, "Broadcast at 2
 * ranks: both copy"). From 16 MiB too, where it went through the halves
 * before (the same guest, 2026-12-07, alternating launches, medians, us,
 * halves -> split): 16 MiB 1578 -> 1039, 32 MiB 3488 -> 1740, 64 MiB 7138
 * -> 4480, 128 MiB 14341 -> 14335, 256 MiB 33042 -> 29054 (Intel MPI 64
 * MiB: 5822); each core copies half the bytes, and two cores copy twice
 * what one does on that guest (docs/benchmarks.md, "The 2-rank broadcast
 * split at every size").
 *
 * The root may write into the receiver's output only while the receiver
 * is still in the operation. The gate, a word beside the receiver's header
 * of sync k (its slot's data area, unused by single copy), says so: the
 * receiver sets it to BG_OPEN before it posts k; the root moves it from
 * BG_OPEN to BG_WRITING before it writes and to BG_DONE after; a receiver
 * whose operation fails (its timeout, an abort) moves it from BG_OPEN to
 * BG_CLOSED, after which the root writes nothing and fails too, and when
 * the root is already writing it waits for BG_DONE or the root's exit
 * (bcast_abandon) before it returns, so that no write lands in a buffer
 * given back to the caller. Each value carries k (bg(k, state)): a gate
 * left from an earlier broadcast, or a peer that is no receiver of this
 * one (two roots, with TORCHCOMMS_CHECK_MISMATCH=0), never opens. */
enum { BG_OPEN = 0, BG_WRITING = 1, BG_DONE = 2, BG_CLOSED = 3 };
static inline uint64_t bg(uint64_t k, int state) { return k << 2 | (uint64_t)state; }
/* Where the receiver's half ends: half of the bytes, rounded down to a
 * multiple of 4 KiB (below 8 KiB the root writes everything). */
static inline size_t bcast_split_at(size_t bytes) { return bytes / 2 & ~(size_t)4095; }
static inline _Atomic uint64_t *bcast_gate(cpu_comm_t *c, int recv, uint64_t k) {
  return (_Atomic uint64_t *)(void *)(fp_slot(c, recv, k, 0) + FP_HDR);
}
typedef struct { _Atomic uint64_t *g; uint64_t writing; } gate_arg_t;
static int gate_writing(void *arg) {
  const gate_arg_t *a = arg;
  return atomic_load(a->g) == a->writing;
}
static int bcast_abandon(cpu_ctx_t *ctx, uint64_t k, int rc) {
  cpu_comm_t *c = ctx->c;
  _Atomic uint64_t *g = bcast_gate(c, ctx->rank, k);
  uint64_t v = bg(k, BG_OPEN);
  if (atomic_compare_exchange_strong(g, &v, bg(k, BG_CLOSED)) || v != bg(k, BG_WRITING)) return rc;
  /* the root is inside its write: wait for its end (or the root's exit),
   * at most one more timeout */
  const int root = ctx->op->root;
  gate_arg_t a = {g, bg(k, BG_WRITING)};
  if (tc__shm_wait_write_end(c->shm, root, gate_writing, &a, ctx->op->timeout_s)) {
    size_t l = strlen(ctx->msg);
    snprintf(ctx->msg + l, sizeof ctx->msg - l,
             "; the root (rank %d) was still writing into this rank's output when this rank "
             "gave up, and may still change it",
             root);
  }
  return rc;
}

/* Stages 1 and 2 of a split broadcast (above), after stage 0 posted k. */
static int bcast_split_run(cpu_ctx_t *ctx, cpu_fast_t *st, double spin, tc_tp_op_t *top) {
  cpu_comm_t *c = ctx->c;
  tc_shm_t *s = c->shm;
  const tc_backend_op_t *op = ctx->op;
  const int r = ctx->rank, peer = 1 - r, root = op->root;
  const size_t bb = op->count * ctx->es, h = bcast_split_at(bb);
  if (st->stage == 1) {
    const uint64_t k = st->s;
    FP_TRY(fp_wait(c, peer, k, spin, 0, top));
    TC_CHECK(fp_check_hdrs(ctx, k, -1));
    const uint64_t a = ((const fp_hdr_t *)fp_slot(c, peer, k, ctx->line))->addr;
    if (r == root) {
      _Atomic uint64_t *g = bcast_gate(c, peer, k);
      uint64_t v = bg(k, BG_OPEN);
      if (!atomic_compare_exchange_strong(g, &v, bg(k, BG_WRITING))) {
        if (v == bg(k, BG_CLOSED))
          return tc__cpu_fail(ctx, TC_ERR_REMOTE,
                              "peer %d gave up on this broadcast before its output was written "
                              "(its timeout, or an abort there); nothing was written",
                              peer);
        return tc__cpu_fail(ctx, TC_ERR_PROTOCOL,
                            "peer %d is not a receiver of this broadcast (it called another "
                            "root?); nothing was written",
                            peer);
      }
      char why[256];
      int rc = tc__shm_write_peer(s, peer, a + h, (const char *)op->recvbuf + h, bb - h, why,
                                  sizeof why);
      atomic_store(g, bg(k, BG_DONE));
      if (rc != TC_OK) return tc__cpu_fail(ctx, rc, "%s", why);
    } else {
      TC_CHECK(tc__shm_read_peer(s, root, op->recvbuf, a, h, top));
    }
    st->s = ++c->sync;
    tc__shm_post(s, st->s);
    st->stage = 2;
  }
  /* the receiver's output is whole once the root posted; the root's buffer
   * is free once the receiver did */
  FP_TRY(fp_wait(c, peer, st->s, spin, 1, top));
  return TC_OK;
}

static int cma_run(cpu_ctx_t *ctx, cpu_fast_t *st, double spin) {
  cpu_comm_t *c = ctx->c;
  tc_shm_t *s = c->shm;
  const tc_backend_op_t *op = ctx->op;
  tc_tp_op_t top = fp_top(ctx);
  int r = ctx->rank, n = ctx->size, fam = fam_of(op->type);
  size_t es = ctx->es, bb = op->count * es;
  if (st->stage == 0) {
    uint64_t k;
    FP_TRY(fp_begin(ctx, spin, 0, &top, &k));
    const char *src = op->recvbuf;
    size_t mine = bb;
    if (fam == FAM_AG) {
      char *d = op->recv[r].buf;
      mine = op->recv[r].count * es;
      /* peers read the send buffer (clean lines read faster than the ones
       * this core just wrote), unless it lies where peers' blocks go */
      src = op->sendbuf;
      for (int q = 0; q < n && src != d; q++) {
        if (q != r && cpu_overlaps(src, mine, op->recv[q].buf, op->recv[q].count * es)) src = d;
      }
      if (mine && d != (const char *)op->sendbuf) memmove(d, op->sendbuf, mine);
    } else if (fam == FAM_A2A) {
      const char *send = op->sendbuf;
      char *recv = op->recvbuf;
      mine = (size_t)n * bb;
      if (cpu_overlaps(send, mine, recv, mine)) { /* in place: peers read a copy */
        char *sc;
        TC_CHECK(tc__cpu_scratch(ctx, mine, (void **)&sc));
        memcpy(sc, send, mine);
        send = sc;
      }
      memmove(recv + (size_t)r * bb, send + (size_t)r * bb, bb);
      src = send;
    }
    fp_put_hdr(ctx, k, mine);
    ((fp_hdr_t *)fp_slot(c, r, k, ctx->line))->addr = (uint64_t)(uintptr_t)src;
    if (bcast_split(c, fam) && r != op->root) atomic_store(bcast_gate(c, r, k), bg(k, BG_OPEN));
    tc__shm_post(s, k);
    st->s = k;
    st->stage = 1;
  }
  if (bcast_split(c, fam)) {
    int rc = bcast_split_run(ctx, st, spin, &top);
    /* k: stage 2 waits on the sync point stage 1 took right after it */
    if (rc != TC_OK && rc != CPU_PENDING && r != op->root)
      rc = bcast_abandon(ctx, st->stage == 2 ? st->s - 1 : st->s, rc);
    return rc;
  }
  if (st->stage == 1) {
    uint64_t k = st->s;
    int only = fam == FAM_BCAST ? op->root : -1;
    int chk = c->check_fp ? -1 : only; /* with the check, the root checks too */
    if (c->check_fp || !(fam == FAM_BCAST && r == op->root)) {
      FP_TRY(fp_wait(c, chk, k, spin, 0, &top));
      TC_CHECK(fp_check_hdrs(ctx, k, chk));
    }
    /* rank r reads from peer r+1 on, so that the readers do not all start
     * on the same peer (whose pages they would then pin at once): 4 ranks
     * on 2 cores, all_to_all, medians of 5 alternating launches: 256 KiB
     * 40.7 -> 33.7 us, 1 MiB 263 -> 225, 4 MiB 1049 -> 915 (reading each
     * peer as soon as it has published, instead of after every header is
     * checked, measured the same; docs/benchmarks.md, runs 31 and 32) */
    for (int j = 1; j < n; j++) {
      int q = r + j < n ? r + j : r + j - n;
      if ((only >= 0 && q != only) || (fam == FAM_BCAST && r == op->root)) continue;
      uint64_t a = ((const fp_hdr_t *)fp_slot(c, q, k, ctx->line))->addr;
      char *dst;
      size_t len = bb;
      if (fam == FAM_AG) dst = op->recv[q].buf, len = op->recv[q].count * es;
      else if (fam == FAM_A2A) dst = (char *)op->recvbuf + (size_t)q * bb, a += (uint64_t)r * bb;
      else dst = op->recvbuf;
      TC_CHECK(tc__shm_read_peer(s, q, dst, a, len, &top));
    }
    st->s = ++c->sync;
    tc__shm_post(s, st->s);
    st->stage = 2;
  }
  /* done reading everywhere: the own buffers are free again */
  FP_TRY(fp_wait(c, -1, st->s, spin, 1, &top));
  return TC_OK;
}

int tc__cpu_fast_run(cpu_ctx_t *ctx, cpu_fast_t *st, double spin) {
  ctx->fam = st->fam;
  ctx->fbytes = st->bytes;
  ctx->line = fp_line_class(st->bytes);
  if (st->kind == CPU_FAST_SMALL) return small_run(ctx, st, spin);
  if (st->kind == CPU_FAST_CMA) return cma_run(ctx, st, spin);
  switch (st->fam) {
  case FAM_AR: return big_all_reduce(ctx, st, spin);
  case FAM_BCAST: return big_broadcast(ctx, st, spin);
  case FAM_AG: return big_all_gather(ctx, st, spin);
  case FAM_RS: return big_reduce_scatter(ctx, st, spin);
  case FAM_A2A: return big_all_to_all(ctx, st, spin);
  default:
    return tc__cpu_fail(ctx, TC_ERR_INTERNAL, "internal error: no shared-memory path");
  }
}

/* ------------------------------------------------------------------------ */
/* Single copy or the shared segments: measured per host at creation         */
/* ------------------------------------------------------------------------ */

/* CPU_CMA_CAL_OPS all_gathers (a2a 0) or all_to_all_singles (a2a 1) of
 * `bytes` per rank back to back (cma 1: single copy; 0: the shared
 * segments), or, with vals, one all_reduce MAX of nvals doubles through the
 * slots; *us: this rank's time per operation. Several operations, not one:
 * with more ranks than cores one operation's time is mostly the time
 * slices that bring every rank in, and the paths' order came out at
 * random (see CPU_CMA_CAL_OPS).
 * Run like a step of the hierarchy (hier.c): synchronously, fingerprinted,
 * under the creation's deadline; a failure's text goes to err. */
static int cal_op(cpu_comm_t *c, int a2a, int cma, const char *send, char *recv,
                  tc_block_t *blk, size_t bytes, double *vals, size_t nvals, double deadline,
                  double *us, char *err, size_t errlen) {
  tc_backend_op_t op;
  memset(&op, 0, sizeof op);
  op.size = sizeof op;
  op.root = -1;
  op.type = vals ? TC_OP_ALL_REDUCE : a2a ? TC_OP_ALL_TO_ALL_SINGLE : TC_OP_ALL_GATHER_SINGLE;
  op.kind = tc_backend_op_kind(op.type);
  op.flags = tc_op_flags(op.type);
  op.dtype = vals ? TC_FLOAT64 : TC_UINT8;
  op.redop = TC_OP(TC_MAX);
  op.count = vals ? nvals : a2a ? bytes / (size_t)c->size : bytes;
  op.sendbuf = vals ? (const void *)vals : send;
  op.recvbuf = vals ? (void *)vals : recv;
  op.recv = vals || a2a ? NULL : blk;
  cpu_ctx_t ctx;
  tc__cpu_ctx_init(&ctx, c, "tc_comm_create");
  ctx.op = &op;
  ctx.es = tc__dtype_size(op.dtype);
  ctx.timeout_s = c->timeout_s;
  ctx.deadline = deadline;
  /* numbered apart from the user's collectives (messages name those by
   * number): 0, the same on every rank */
  tc__cpu_fingerprint(c, &op, 0, &ctx.fp);
  if (!vals) { /* the path fast_kind picks */
    if (a2a) c->cma_min_a2a = cma ? 1 : SIZE_MAX;
    else c->cma_min = cma ? 1 : SIZE_MAX;
  }
  cpu_fast_t st;
  memset(&st, 0, sizeof st);
  /* the shared segments: the small slots or the big halves, by the size */
  const int want = vals ? CPU_FAST_SMALL : cma ? CPU_FAST_CMA : 0;
  const int times = vals ? 1 : CPU_CMA_CAL_OPS;
  double t0 = tc__now();
  int rc = TC_OK;
  for (int j = 0; j < times && rc == TC_OK; j++) {
    memset(&st, 0, sizeof st);
    const int kind = tc__cpu_fast_kind(c, &op, &st);
    const int ok = want ? kind == want : kind && kind != CPU_FAST_CMA;
    rc = ok ? tc__cpu_fast_run(&ctx, &st, -1.0)
            : tc__cpu_fail(&ctx, TC_ERR_INTERNAL, "internal error: path %d instead of %d",
                           kind, want);
  }
  *us = (tc__now() - t0) * 1e6 / times;
  if (rc != TC_OK) { /* the caller words the start ("tc_comm_create on ...") */
    const char *t = strncmp(ctx.msg, "torchcomms: ", 12) ? NULL : strstr(ctx.msg, "): ");
    snprintf(err, errlen, "timing single copy at creation: %s%s", t ? t + 3 : ctx.msg,
             rc == TC_ERR_PROTOCOL ? " (TORCHCOMMS_CPU_CMA_BYTES set on some ranks only? "
                                     "unset, every rank times it here)"
                                   : "");
  }
  return rc;
}

/* 1 if every block of an all_gather (a2a 0) or all_to_all (a2a 1) of the
 * calibration arrived as sent: rank q's bytes are q + 1, rank q's block for
 * rank r (all_to_all) (q + 1) * 16 + r + 1. */
static int cal_check(const cpu_comm_t *c, int a2a, const unsigned char *recv, size_t b) {
  const int n = c->size;
  const size_t per = a2a ? b / (size_t)n : b;
  for (int q = 0; q < n; q++) {
    const unsigned char v = (unsigned char)(a2a ? (q + 1) * 16 + c->rank + 1 : q + 1);
    if (recv[(size_t)q * per] != v || recv[(size_t)q * per + per - 1] != v) return 0;
  }
  return 1;
}

int tc__cpu_cma_calibrate(cpu_comm_t *c, char *err, size_t errlen) {
  const int n = c->size;
  const double deadline = tc__now() + c->timeout_s;
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  double us, vote[2] = {n > CPU_CMA_CAL_OVERSUB * cores, n > cores};
  /* too many ranks per core on any rank's count (the same host: the same
   * count, unless a container shows each its own): nobody measures; more
   * ranks than cores: not the small size (vote[1]) */
  TC_CHECK(cal_op(c, 0, 0, NULL, NULL, NULL, 0, vote, 2, deadline, &us, err, errlen));
  if (vote[0] > 0) return TC_OK; /* both stay off */
  const int nsz = vote[1] > 0 ? 1 : 2;
  /* per size: all_gather b per rank; all_to_all ba per rank, n blocks of
   * ba / n; the large size (at least b, so that neither fits the small
   * slots) and the small one (through the small slots) */
  size_t b[2], ba[2];
  b[0] = n <= 4 ? CPU_CMA_CAL_BYTES : CPU_CMA_CAL_BYTES / 4;
  b[1] = CPU_CMA_CAL_SMALL_BYTES;
  for (int z = 0; z < 2; z++) ba[z] = (b[z] + (size_t)n - 1) / (size_t)n * (size_t)n;
  /* aligned_alloc's size: a multiple of the alignment (C11) */
#define CAL_PAGES(x) (((x) + 4095) & ~(size_t)4095)
  /* all_to_all's send buffers, one per size, written once: a buffer
   * written just before each operation would be read from this core's
   * cache by the peers, and slow single copy down */
  char *send = aligned_alloc(4096, CAL_PAGES(b[0])), *sa[2],
       *recv = aligned_alloc(4096, CAL_PAGES((size_t)n * b[0]));
  for (int z = 0; z < 2; z++) sa[z] = aligned_alloc(4096, CAL_PAGES(ba[z]));
#undef CAL_PAGES
  tc_block_t *blk = malloc((size_t)n * sizeof *blk);
  int rc = TC_OK;
  if (!send || !sa[0] || !sa[1] || !recv || !blk) {
    snprintf(err, errlen, "out of memory");
    rc = TC_ERR_NOMEM;
  }
  if (rc == TC_OK) memset(send, c->rank + 1, b[0]);
  for (int z = 0; z < 2 && rc == TC_OK; z++)
    for (int q = 0; q < n; q++)
      memset(sa[z] + (size_t)q * (ba[z] / (size_t)n), (c->rank + 1) * 16 + q + 1, ba[z] / (size_t)n);
  /* best[z * 4 + a2a * 2 + cma]: the large and the small size, all_gather /
   * all_to_all, segments / single copy */
  double best[8];
  for (int k = 0; k < 8; k++) best[k] = 1e30;
  /* interleaved, so that a slow stretch of the machine hits every way */
  for (int i = 0; i <= CPU_CMA_CAL_REPS && rc == TC_OK; i++)
    for (int k = 0; k < 4 * nsz && rc == TC_OK; k++) {
      const int z = k / 4, a2a = k / 2 % 2, cma = k % 2;
      const size_t sz = a2a ? ba[z] : b[z];
      for (int q = 0; q < n; q++) blk[q] = (tc_block_t){recv + (size_t)q * sz, sz};
      rc = cal_op(c, a2a, cma, a2a ? sa[z] : send, recv, blk, sz, NULL, 0, deadline, &us, err,
                  errlen);
      /* a wrong copy here would be a broken path: say so rather than choose it */
      if (rc == TC_OK && !cal_check(c, a2a, (const unsigned char *)recv, sz)) {
        snprintf(err, errlen, "internal error: timing single copy: a block of %s arrived wrong",
                 a2a ? "all_to_all" : "all_gather");
        rc = TC_ERR_INTERNAL;
      }
      if (rc == TC_OK && i > 0 && us < best[k]) best[k] = us;
    }
  if (rc == TC_OK)
    rc = cal_op(c, 0, 0, NULL, NULL, NULL, 0, best, 4 * (size_t)nsz, deadline, &us, err, errlen);
  free(send);
  free(sa[0]);
  free(sa[1]);
  free(recv);
  free(blk);
  c->cma_min = c->cma_min_a2a = SIZE_MAX;
  if (rc != TC_OK) return rc;
  for (int k = 4 * nsz; k < 8; k++) best[k] = 0; /* not measured */
  c->cma_cal_bytes = b[0];
  c->cma_cal_small = nsz > 1 ? b[1] : 0;
  memcpy(c->cma_cal_us, best, sizeof c->cma_cal_us);
#define CAL_WINS(k) (best[(k) + 1] < CPU_CMA_CAL_MARGIN * best[k])
  if (CAL_WINS(0)) c->cma_min = nsz > 1 && CAL_WINS(4) ? b[1] : CPU_CMA_AUTO_BYTES;
  if (CAL_WINS(2))
    c->cma_min_a2a = nsz > 1 && CAL_WINS(6) ? ba[1] : (size_t)CPU_CMA_AUTO_A2A_BLOCK * (size_t)n;
#undef CAL_WINS
  return TC_OK;
}

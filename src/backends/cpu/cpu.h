/* cpu.h -- internals of the native `cpu` backend: the per-communicator state
 * (progress thread, op queue, scratch, transport) and the algorithms. */
#ifndef TC_BACKENDS_CPU_H
#define TC_BACKENDS_CPU_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "core/internal.h"
#include "transport/shm.h"
#include "transport/tcp.h"
#include "backends/builtin.h" /* tc__cpu_backend */

/* Algorithm thresholds (bytes). */
#define CPU_SMALL_BYTES (64u * 1024u)        /* tree/doubling below, ring above */
#define CPU_BCAST_SEG (512u * 1024u)         /* pipelined chain broadcast */
#define CPU_REDUCE_SEG (1024u * 1024u)       /* ring and tree reduction segments */
#define CPU_DIRECT_GATHER_BYTES (64u * 1024u) /* all_gather: one round below */
#define CPU_DIRECT_GATHER_RANKS 8 /* ... on at most this many ranks (else Bruck) */
#define CPU_DIRECT_A2A_BYTES (1024u * 1024u)  /* all_to_all: one round below */
#define CPU_SCRATCH_KEEP (64u * 1024u * 1024u) /* larger scratch is freed after the op */
/* An express send, recv or batch of at most this many bytes that no wait
 * read the clock for ends "promptly" (tc_backend_express_t.end_prompt). */
#define CPU_EXPRESS_P2P_PROMPT_MAX 4096u

/* Shared memory: all_reduce through the small slots up to this many bytes
 * (TORCHCOMMS_CPU_SHM_SMALL_BYTES overrides; it must be the same on every
 * rank), through the big halves above.
 * Default 8 KiB (TC_SETTINGS_MAP in src/core/settings.h): since the halves
 * rotate (fp_seg), a 16 KiB all_reduce is faster through them, where each
 * rank reduces half, than through the slots, where each reduces all (2
 * ranks, medians of 5 interleaved launches: float32 1.16 -> 1.09 us,
 * bfloat16 1.45 -> 1.16, float16 1.68 -> 1.35; 8 KiB the same). */

/* Waits inside a large shared-memory operation spin this long (seconds)
 * before sleeping, unless the machine is oversubscribed. */
#define CPU_SHM_ROUND_SPIN 1e-3

/* After an inline attempt handed its operation to the thread, the next
 * CPU_INLINE_BOOST_OPS attempts spin CPU_INLINE_BOOST times longer. */
#define CPU_INLINE_BOOST 5.0
#define CPU_INLINE_BOOST_OPS 64

/* Return codes of the shared-memory paths besides TC_OK and errors. */
#define CPU_PENDING 1 /* not finished: resume later */

/* Broadcasts of at least this many bytes go through the big halves, where
 * the root's writes move on through the half (shm_algos.c, bcast_off);
 * smaller ones through the small slots, where the root runs ahead of its
 * receivers. Measured at 2 ranks (medians of 6 interleaved runs): 8 KiB
 * 1.08 us through the halves vs 1.13 through the slots, 16 KiB 1.54 vs
 * 2.17, 32 KiB 2.76 vs 4.00. */
#define CPU_SHM_BCAST_HALVES (8u * 1024u)
/* ...and from this many with more than two ranks, where the root running
 * ahead counted for more (4 ranks on 2 cores, medians of 4 interleaved
 * runs: 8 KiB 5.57 us through the halves vs 4.51 through the slots,
 * 16 KiB 6.02 vs 5.57, 32 KiB 7.18 vs 7.22, 64 KiB 10.2 vs 10.9). */
#define CPU_SHM_BCAST_HALVES_MANY (32u * 1024u)

/* Operations on the shared segments (shm_algos.c): kinds. */
#define CPU_FAST_SMALL 1 /* one sync through the slots */
#define CPU_FAST_BIG 2   /* rounds through the big halves */
#define CPU_FAST_CMA 3   /* single copy from the peers' buffers (process_vm_readv) */

/* Shared memory with single copy: broadcast, all_gather* and
 * all_to_all_single of at least this many bytes (per rank for all_gather)
 * read the peers' buffers directly (TORCHCOMMS_CPU_CMA_BYTES overrides; the
 * same on every rank). At 2 ranks a broadcast of any size from there is
 * copied by both ranks, half each (shm_algos.c, bcast_split_run). (With
 * one reader copying everything, broadcasts above 1 MiB measured faster
 * through the halves on a 2-core machine.) */
/* Where single copy measured faster at creation (tc__cpu_cma_calibrate):
 * from this many bytes. On the Intel Xeon host of 2026-12-02 single copy
 * won from 64 KiB for all_gather and all_to_all and from 64 KiB to 256 KiB
 * for broadcast (docs/benchmarks.md, "Single copy chosen per host"). */
#define CPU_CMA_AUTO_BYTES (64u * 1024u)
/* ...and all_to_all_single from blocks of this many bytes per peer (64 KiB
 * per rank at 2 ranks, 128 KiB at 4): smaller blocks are one system call
 * each for little data. 4 ranks on 2 cores, 3 launches alternating, us:
 * 64 KiB per rank (16 KiB blocks) 20.5-34.9 single copy against 20.9-23.6
 * through the segments, 128 KiB 29.4-53.5 against 28.7-39.8, 256 KiB
 * 49.7-114 against 61.6-71.5 (docs/benchmarks.md, "Single copy chosen per
 * host"). */
#define CPU_CMA_AUTO_A2A_BLOCK (32u * 1024u)
/* ...measured with an all_gather of this many bytes per rank (up to 4 ranks;
 * a quarter of it above), the best of CPU_CMA_CAL_REPS each way after one
 * warm-up each; single copy is taken when it is below CPU_CMA_CAL_MARGIN of
 * the shared segments' time, so that two paths within the noise keep the
 * shared segments (the faster one on the AMD host, measured) */
#define CPU_CMA_CAL_BYTES (256u * 1024u)
/* ...and, where single copy won there and no rank counts more ranks than
 * cores, again at this many bytes per rank (through the small slots):
 * where single copy wins there too it starts from this size (all_gather
 * and broadcast from CPU_CMA_CAL_SMALL_BYTES, all_to_all from that many
 * bytes per rank) instead of CPU_CMA_AUTO_BYTES and CPU_CMA_AUTO_A2A_BLOCK.
 * A system call against a few cache lines: time slices of more ranks than
 * cores would drown the difference. 2 ranks on the Intel Xeon guest
 * (2026-12-05), medians of 7 alternating launches, us, through the slots
 * against single copy: all_gather of 16 KiB per rank 2.17 against 2.03,
 * 32 KiB 3.36 against 2.87, 64 KiB 5.01 against 4.50; all_to_all of 16
 * KiB per rank 3.09 against 2.03; broadcast of 32 KiB 2.22 against 1.93
 * (docs/benchmarks.md, "Single copy from 32 KiB"). */
#define CPU_CMA_CAL_SMALL_BYTES (32u * 1024u)
#define CPU_CMA_CAL_REPS 3
/* ...each sample the time per operation of this many back to back. One
 * operation per sample chose single copy for all_to_all at 4 ranks on the
 * 2-core AMD host of 2026-12-07 in some launches and the segments in
 * others, where the segments are twice as fast in steady state (256 KiB
 * per rank 32-40 us against 58-94): the one operation's time was the time
 * slices that brought the four ranks in, not the copies
 * (docs/benchmarks.md, "Single copy chosen per host: samples of several
 * operations"). */
#define CPU_CMA_CAL_OPS 4
#define CPU_CMA_CAL_MARGIN 0.9
/* ...unless some rank counts more than this many ranks per core: beyond
 * it the timings are mostly time slices. Up to it they still tell the two
 * ways apart where it matters: 4 ranks on the 2-core Intel Xeon host,
 * 3 launches each way, us: all_to_all 256 KiB 54-94 single copy against
 * 88-110, 4 MiB 1323-1345 against 1546-1641, 16 MiB 7310-8246 against
 * 9089-9929 (one block per reader); all_gather 256 KiB 106-520 against
 * 54-62 (three readers pin the same pages of one block at once). */
#define CPU_CMA_CAL_OVERSUB 2
/* ...and above this with more than two ranks: several readers pulling the
 * root's buffer at once lost to the halves' pipeline (4 ranks, 2 cores:
 * 256 KiB 55 vs 30 us, 1 MiB 290 vs 170 us). */
#define CPU_CMA_MAX_BCAST_MANY (64u * 1024u)
/* ...and all_gather* and all_to_all_single only while what one rank reads
 * of one peer is below this: larger blocks go through the halves, whose
 * copies out use streaming stores from c->stream_min (the kernel's
 * copy for process_vm_readv reads every line it writes). 2 ranks, Intel
 * Xeon, 3 interleaved launches each, us: all_gather of 64 MiB 15457-18153
 * single copy -> 12453-13422 halves, all_to_all 16113-17802 -> 12357-13408
 * (2026-12-02, with 8 MiB blocks the same both ways); on an Intel Xeon with
 * a 480 MiB L3 (2026-12-04) single copy won up to 12 MiB blocks (all_gather
 * of 16 MiB 1353-1367 against 1829-1900 through the halves, 24 MiB
 * 2018-2105 against 2645-2711) and not from 16 MiB (32 MiB: 3630-4399
 * against 3608-3623; 64 MiB: 10064-10675 against 7739-7951)
 * (docs/benchmarks.md, "Single copy chosen per host"). Not for a broadcast
 * at 2 ranks, which both ranks copy (half each) at every size: 64 MiB 7138
 * us through the halves -> 4480 (2026-12-07; shm_algos.c, bcast_split). */
#define CPU_CMA_MAX_BLOCK (16u * 1024u * 1024u)

/* The big halves' all_gather, all_to_all and broadcast copy blocks of at
 * least c->stream_min bytes with non-temporal stores (tc__copy_stream,
 * shm_algos.c's fp_copy): the operation's buffers then no longer fit in
 * the L3 cache, and a plain copy first reads every line it writes.
 * c->stream_min is TORCHCOMMS_CPU_STREAM_BYTES, else the larger of
 * CPU_STREAM_COPY_BYTES and the L3's size / (CPU_STREAM_LLC_PER_RANK x the
 * ranks sharing the segments) (tc__cpu_stream_min): an operation's buffers
 * grow with its blocks times its ranks.
 *  - An AMD host with a 32 MiB L3, 2 ranks, medians of 6 launches in
 *    alternating order, all_gather from 1 MiB blocks: 16 MiB 1954 -> 1615
 *    us, 64 MiB 9735 -> 7593, but 4 MiB 174 -> 376 (its buffers fit in the
 *    cache, where plain stores are faster); from 4 MiB blocks, 8 MiB 751 ->
 *    825. So 8 MiB there.
 *  - An Intel Xeon guest whose L3 reads 480 MiB (2 vCPUs; the socket's
 *    cache, shared with other guests), 2 ranks, alternating launches,
 *    medians, us, streaming from 8 MiB against never: broadcast 16 MiB
 *    1570 against 1468 (8 launches), 32 MiB 3170 against 2958 (6), 64 MiB
 *    6408 against 6419 (4); all_gather 32 MiB (16 MiB blocks) 4038
 *    against 3942, 64 MiB 8278 against 9193; all_to_all 32 MiB 3895
 *    against 3842, 64 MiB 8863 against 10704. Streaming pays from 32 MiB
 *    blocks there: a sixteenth of the L3 (30 MiB) keeps both hosts' best.
 *    At 4 ranks (2 cores) the 64 MiB all_gather (16 MiB blocks) took
 *    15809 us streaming and 20757 without, all_to_all 24797 and 29088
 *    (3 launches each): a 32nd of the L3 there. */
#define CPU_STREAM_COPY_BYTES (8u * 1024u * 1024u)
#define CPU_STREAM_LLC_PER_RANK 8
/* The streaming threshold for an L3 cache of llc bytes (0: unknown) shared
 * by nranks ranks. */
size_t tc__cpu_stream_min(size_t llc, int nranks);
/* The L3's size in bytes as the kernel describes the caches under dir
 * (/sys/devices/system/cpu/cpuN/cache: indexK/level "3", indexK/size
 * "32768K"); 0 if none is described there. Not sysconf's
 * _SC_LEVEL3_CACHE_SIZE: glibc read 320 MiB on the AMD EPYC guest of
 * 2026-12-07 whose L3 is 32 MiB (sysfs, lscpu), which put the streaming
 * threshold at 20 MiB blocks instead of 8 (docs/benchmarks.md, "The L3's
 * size from sysfs"). */
size_t tc__cpu_llc_bytes(const char *dir);

/* The progress of a resumable shared-memory operation. */
typedef struct cpu_fast {
  int kind;   /* 0 (none), CPU_FAST_SMALL, CPU_FAST_BIG */
  int stage;  /* where to resume */
  int init;   /* one-time preparation done */
  uint64_t round; /* the current big round (shm_algos.c: fp_half) */
  uint64_t s; /* the current sync point */
  size_t off; /* the current round's offset */
  int fam;      /* the shared-memory family (shm_algos.c), set with kind */
  size_t bytes; /* bytes one rank puts through its slot or halves, set with kind */
} cpu_fast_t;

typedef struct cpu_qent {
  const tc_backend_op_t *op;
  tc_work_t *work;
  uint64_t seq;      /* collective sequence number, set once begun (0: p2p) */
  cpu_fast_t fst;    /* a shared-memory operation (kind != 0): its progress */
  double deadline, timeout_s; /* set once begun */
} cpu_qent_t;

typedef struct cpu_comm {
  const tc_backend_host_t *host;
  char name[128];
  int rank, size;
  double timeout_s; /* bootstrap / finalize deadline */

  char advertise[128]; /* the address peers reach this rank at ("" = default) */
  const tc_transport_ops_t *tp_ops; /* NULL for world size 1; tcp or shm */
  void *tp;
  int wake_fd;       /* eventfd, written once on abort, never drained */
  atomic_int aborted;

  /* op queue: a ring of entries, grown on demand (never shrinks) */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  cpu_qent_t *q;
  size_t qcap, qhead;
  atomic_size_t qlen; /* changed under mu; read without it by an inline post */
  int draining;  /* finalize: run what is queued, then exit */
  atomic_int accepting; /* 0 once finalize or abort began: posts are refused */

  /* an operation is executing (thread or inline): the "lane". The thread
   * takes it under mu; an inline post takes it without mu (a compare and
   * swap), then checks accepting and qlen again, so that it never runs
   * beside the thread, behind queued posts, or after finalize and abort
   * began; it gives it back without mu unless someone waits (idle_waiters,
   * or a queue to hand to the thread) */
  atomic_int running;
  atomic_int idle_waiters; /* threads waiting on idle_cv (counted under mu) */
  atomic_int reporting;  /* the thread is reporting an op it finished */
  int inline_boost;      /* inline attempts left with a longer spin (inline only) */
  pthread_cond_t idle_cv; /* signalled when running drops to 0 */

  pthread_t thread;
  int thread_started, thread_joined;
  pthread_mutex_t life_mu; /* serializes finalize / abort / destroy */
  pthread_mutex_t tp_mu;   /* transport close vs abort's interrupt */
  int closed;              /* transport closed */
  int leave_clean; /* abort found nothing in flight and nothing failed: the
                    * transport tells the peers before closing (->leave) */

  /* set by the progress thread after the first failed op */
  int broken_rc;
  char broken_msg[768];

  /* shared memory (NULL over TCP): sync points and big-half rounds, the
   * same sequence on every rank; touched by the executing thread only */
  tc_shm_t *shm;
  tc_shm_areas_t areas; /* the segments' slots and halves (shm_algos.c) */
  /* fp_slot's memo: the last sync point asked + 1 (0: none; cleared with
   * the areas), its epoch's rotation and its slot's offset in a segment */
  uint64_t slot_k1;
  size_t slot_off;
  uint32_t slot_rot;
  uint64_t sync;      /* the last sync point this rank posted */
  uint64_t known_all; /* every rank's flag is known to be >= this */
  /* small broadcasts this rank rooted without waiting for its receivers:
   * their fingerprints, checked against the receivers' headers at a later
   * sync point (shm_algos.c, fp_lazy_check); lazy_lo is the lowest one not
   * yet checked (0: none), published in the transport's aux word */
  struct { uint64_t s; tc_opfp_t fp; uint8_t line; } lazy[TC_SHM_LINES];
  uint64_t lazy_lo;
  uint64_t lazy_slot_lo; /* the lowest of those in the slots (not the lines), 0: none */
  uint64_t lazy_slot_hi; /* the highest of those ever recorded in the slots, 0: none */
  uint64_t big_round;
  size_t small_ar;    /* TORCHCOMMS_CPU_SHM_SMALL_BYTES */
  size_t stream_min;  /* TORCHCOMMS_CPU_STREAM_BYTES, else tc__cpu_stream_min */
  /* TORCHCOMMS_CPU_INLINE_BYTES (1 MiB; it may differ between ranks): on
   * an idle communicator, shared-memory operations up to this size run on
   * the caller's thread, synchronous ones at any size (larger asynchronous
   * ones are handed to the thread at once, so that the call returns at
   * once); 0: none */
  size_t inline_max;
  size_t cma_min;     /* TORCHCOMMS_CPU_CMA_BYTES; SIZE_MAX: off */
  size_t cma_min_a2a; /* the same for all_to_all_single (measured apart) */
  /* the measurements that chose them when that setting is unset
   * (tc__cpu_cma_calibrate): all_gather and all_to_all_single of
   * cma_cal_bytes per rank, and of cma_cal_small, the slowest rank's best
   * times in us through the shared segments and with single copy;
   * cma_cal_bytes 0: not measured */
  size_t cma_cal_bytes;
  size_t cma_cal_small; /* the small size, 0: not measured */
  double cma_cal_us[8]; /* [size * 4 + all_to_all * 2 + single copy] */

  /* mismatch detection (TORCHCOMMS_CHECK_MISMATCH, default on): every
   * collective's fingerprint is compared with every peer's before a result
   * is delivered; coll_seq counts collectives (executing thread only) */
  int check_fp;
  uint64_t coll_seq;
  tc_opfp_t *peer_fp; /* [size] fingerprints received over TCP */
  uint64_t *fp_seq;   /* [size]: the collective whose fingerprints were
                       * exchanged with that peer last (TCP) */
  tc_xfer_t *fpx;     /* fingerprint transfers + the first exchange's */
  size_t fpx_cap;
  /* TCP: the fingerprints that peers owe the root of a broadcast, which
   * sends its own and does not wait for theirs (cpu_xchg_fp); [size], each
   * NULL until used; owed_n: their total, owed_touch: the peers of the
   * current exchange with some to read ([size]) */
  struct cpu_owed **owed;
  size_t owed_n;
  int *owed_touch;
  int owed_ntouch;

  /* scratch, grown on demand, reused (executing thread only) */
  void *scratch;
  size_t scratch_cap;
  tc_xfer_t *xf;
  size_t xf_cap;

  /* the hierarchy across hosts (hier.c), or NULL: flat */
  struct cpu_hier *hier;

  /* the express entry's last classification (cpu_express, under the
   * core's lock, before its begin): an operation of the same type, dtype, count, reduction
   * and root, without per-rank counts or with one for every rank
   * (TC_OPF_UNIFORM), takes the same path with the same fingerprint but
   * its number (xc_valid 0: none) */
  int xc_valid;
  tc_op_type_t xc_type;
  tc_dtype_t xc_dtype;
  int xc_redop, xc_root;
  size_t xc_count;
  cpu_fast_t xc_st;
  tc_opfp_t xc_fp;
} cpu_comm_t;

/* The context of one running operation (every field set by
 * tc__cpu_ctx_init, which asserts the layout: no hole before msg, so that
 * any field added moves msg). */
typedef struct cpu_ctx {
  cpu_comm_t *c;
  const tc_backend_op_t *op;
  const char *opname;
  int rank, size;
  size_t es; /* element size of op->dtype */
  double deadline, timeout_s;
  tc_opfp_t fp; /* this rank's fingerprint of the op (collectives) */
  int fp_todo;  /* 1: a collective checked over TCP (its fingerprints go
                 * to each peer it exchanges with) or not yet checked
                 * through the slots */
  int fp_any;   /* some fingerprint was exchanged (TCP) */
  int fam;       /* a shared-memory operation: its family and bytes per rank */
  int line;      /* its headers are in the ring of header lines (shm_algos.c) */
  size_t fbytes; /* (cpu_fast_t's, copied here by tc__cpu_fast_run) */
  char msg[1024]; /* the error text when the op fails */
} cpu_ctx_t;

/* One-sided windows (window.c): the backend table's window entries. */
TC_INTERNAL int tc__cpu_win_create(void *bcomm, void *buf, size_t bytes, void **bwin,
                                   void **base, void *info, size_t *info_len, char *err,
                                   size_t errlen);
TC_INTERNAL int tc__cpu_win_attach(void *bwin, const void *infos, size_t info_len, char *err,
                                   size_t errlen);
TC_INTERNAL void tc__cpu_win_ready(void *bwin);
TC_INTERNAL int tc__cpu_win_op(void *bwin, const tc_backend_win_op_t *op, char *err,
                               size_t errlen);
TC_INTERNAL void *tc__cpu_win_map(void *bwin, int peer);
TC_INTERNAL void tc__cpu_win_free(void *bwin);

/* The name of an operation in messages ("all_reduce"). */
/* Runs one operation to completion (progress thread). On failure fills
 * ctx->msg and returns the code. */
TC_INTERNAL int tc__cpu_run(cpu_ctx_t *ctx);

/* ---- helpers shared by the algorithm files ---- */

/* Writes "torchcomms: <op> on '<comm>' (rank r of n): <text>" into ctx->msg
 * and returns rc. */
TC_INTERNAL int tc__cpu_fail(cpu_ctx_t *ctx, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Scratch of at least `bytes` (contents not preserved across calls). */
TC_INTERNAL int tc__cpu_scratch(cpu_ctx_t *ctx, size_t bytes, void **out);
/* A transfer array of at least n entries. */
TC_INTERNAL int tc__cpu_xfers(cpu_ctx_t *ctx, size_t n, tc_xfer_t **out);
/* Runs one exchange of the transport. */
TC_INTERNAL int tc__cpu_xchg(cpu_ctx_t *ctx, tc_xfer_t *x, size_t n);

/* a mod n in [0, n) for any sign of a. */
static inline int cpu_mod(int a, int n) { return ((a % n) + n) % n; }
/* Part i of count elements split in n: count/n, one more for i < count%n;
 * and where it starts. */
static inline size_t cpu_blk_cnt(size_t count, int n, int i) {
  return count / (size_t)n + ((size_t)i < count % (size_t)n);
}
static inline size_t cpu_blk_off(size_t count, int n, int i) {
  size_t q = count / (size_t)n, r = count % (size_t)n;
  return q * (size_t)i + ((size_t)i < r ? (size_t)i : r);
}
/* Do [a, a+al) and [b, b+bl) share a byte? */
static inline int cpu_overlaps(const char *a, size_t al, const char *b, size_t bl) {
  return al && bl && a < b + bl && b < a + al;
}

/* Elements of a segment of at most seg elements starting at off in cnt. */
static inline size_t cpu_seg_len(size_t cnt, size_t off, size_t seg) {
  if (off >= cnt) return 0;
  return cnt - off < seg ? cnt - off : seg;
}

/* The binomial tree of relative rank vr in n: parent (or -1) and children
 * (relative ranks, largest subtree last). Returns the number of children. */
static inline int cpu_tree(int vr, int n, int *parent, int *child) {
  int nc = 0;
  *parent = -1;
  for (int mask = 1; mask < n; mask <<= 1) {
    if (vr & mask) {
      *parent = vr - mask;
      break;
    }
    if (vr + mask < n) child[nc++] = vr + mask;
  }
  return nc;
}

/* The reduction the kernels apply (AVG and PREMUL_SUM reduce as SUM). */
static inline tc_redop_type_t cpu_kop(const tc_backend_op_t *op) {
  tc_redop_type_t t = op->redop.type;
  return (t == TC_AVG || t == TC_PREMUL_SUM) ? TC_SUM : t;
}

/* shm_algos.c: collectives on the shared segments. */
/* The kind of shared-memory path op takes (0: none: the algorithms over the
 * exchange), and the bytes one rank contributes. */
/* Finalize: checks what small broadcasts this rank rooted left unchecked
 * (shm_algos.c). */
TC_INTERNAL int tc__cpu_fast_settle(cpu_ctx_t *ctx);
/* Finalize: every check the broadcasts this rank rooted left to later,
 * over shared memory (tc__cpu_fast_settle) and over TCP (the fingerprints
 * their receivers sent, backend.c); TC_OK when there is none. */
TC_INTERNAL int tc__cpu_settle(cpu_ctx_t *ctx);
TC_INTERNAL int tc__cpu_fast_kind(const cpu_comm_t *c, const tc_backend_op_t *op,
                                  cpu_fast_t *st);
/* Shared memory, an operation without a shared-memory path (the exchange
 * algorithms): one sync point whose slot headers carry every rank's
 * fingerprint, checked before the algorithm runs. */
TC_INTERNAL int tc__cpu_fast_fpsync(cpu_ctx_t *ctx);
/* TORCHCOMMS_CPU_CMA_BYTES unset, single copy possible: unless some rank
 * counts more than CPU_CMA_CAL_OVERSUB ranks per core (a vote, the first
 * operation), times all_gather and all_to_all_single both ways on every
 * rank (creation, before the progress thread starts) and sets c->cma_min
 * (all_gather, broadcast) to CPU_CMA_AUTO_BYTES and c->cma_min_a2a to n
 * blocks of CPU_CMA_AUTO_A2A_BLOCK where single copy is clearly faster,
 * else leaves them off; the same choices on every rank (the slowest rank's
 * times decide). */
TC_INTERNAL int tc__cpu_cma_calibrate(cpu_comm_t *c, char *err, size_t errlen);
/* Runs or resumes a shared-memory operation (st->kind set). spin >= 0:
 * never sleep; give up with CPU_PENDING at a wait that spun that long;
 * spin < 0: wait until done. */
TC_INTERNAL int tc__cpu_fast_run(cpu_ctx_t *ctx, cpu_fast_t *st, double spin);

/* backend.c: creates the state of a communicator (init's work): its
 * transport (choice), and, for a top-level one (child 0), its hierarchy
 * and progress thread; a child (a group of a hierarchy, hier.c) has
 * neither: its parent's executing thread runs its operations. */
TC_INTERNAL int tc__cpu_open(const tc_backend_init_args_t *a, tc_tp_choice_t choice,
                             int child, cpu_comm_t **out, char *err, size_t errlen);
/* Frees a communicator's state (its transport closed). */
TC_INTERNAL void tc__cpu_free(cpu_comm_t *c);
/* A context for c: everything zeroed but the message (cleared). */
TC_INTERNAL void tc__cpu_ctx_init(cpu_ctx_t *ctx, cpu_comm_t *c, const char *opname);
/* The fingerprint of collective number seq of c (transport.h). */
TC_INTERNAL void tc__cpu_fingerprint(const cpu_comm_t *c, const tc_backend_op_t *op,
                                     uint64_t seq, tc_opfp_t *f);

/* hier.c: hierarchical algorithms when a communicator spans several hosts
 * (TORCHCOMMS_CPU_HIER): a group of the ranks of each host (shared memory)
 * and one of the hosts' leaders (TCP), each a child communicator. */
/* TORCHCOMMS_CPU_HIER_FAKE_HOSTS (tests only) when the hierarchy is not
 * turned off, else 0. */
TC_INTERNAL int tc__cpu_hier_fake_hosts(void);
/* Sets up c->hier when c's ranks are on several hosts and the setting
 * allows (collective over c); TC_OK without one otherwise. */
TC_INTERNAL int tc__cpu_hier_setup(cpu_comm_t *c, const tc_backend_init_args_t *a,
                                   tc_tp_choice_t choice, char *err, size_t errlen);
/* Does op run hierarchically on c? */
TC_INTERNAL int tc__cpu_hier_takes(const cpu_comm_t *c, const tc_backend_op_t *op);
/* Runs ctx->op hierarchically (on the executing thread). */
TC_INTERNAL int tc__cpu_hier_run(cpu_ctx_t *ctx);
/* Finalize: the groups' orderly goodbyes (before the parent's). */
TC_INTERNAL int tc__cpu_hier_finalize(cpu_comm_t *c, char *err, size_t errlen);
/* Abort: wakes the groups' waits. */
TC_INTERNAL void tc__cpu_hier_abort(cpu_comm_t *c);
/* Closes the groups' transports (leave: tell the peers first). */
TC_INTERNAL void tc__cpu_hier_close(cpu_comm_t *c, int leave);
/* Frees c->hier (transports closed). */
TC_INTERNAL void tc__cpu_hier_free(cpu_comm_t *c);
/* One line on the hierarchy for the init summary ("" when flat). */
TC_INTERNAL void tc__cpu_hier_describe(const cpu_comm_t *c, char *buf, size_t len);

/* algo_reduce.c: the reducing algorithms over the exchange */
TC_INTERNAL int tc__cpu_all_reduce(cpu_ctx_t *ctx);
TC_INTERNAL int tc__cpu_reduce(cpu_ctx_t *ctx);
TC_INTERNAL int tc__cpu_reduce_scatter(cpu_ctx_t *ctx);
/* algo_move.c: the data-movement algorithms over the exchange */
TC_INTERNAL int tc__cpu_broadcast(cpu_ctx_t *ctx);
TC_INTERNAL int tc__cpu_p2p(cpu_ctx_t *ctx);
TC_INTERNAL int tc__cpu_batch(cpu_ctx_t *ctx);
TC_INTERNAL int tc__cpu_all_gather(cpu_ctx_t *ctx);
TC_INTERNAL int tc__cpu_all_to_all(cpu_ctx_t *ctx);
TC_INTERNAL int tc__cpu_barrier(cpu_ctx_t *ctx);
TC_INTERNAL int tc__cpu_scatter(cpu_ctx_t *ctx);
TC_INTERNAL int tc__cpu_gather(cpu_ctx_t *ctx);

#endif /* TC_BACKENDS_CPU_H */

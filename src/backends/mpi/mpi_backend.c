/* mpi_backend.c -- the `mpi` backend: torchcomms over the MPI library a
 * cluster already has (libtorchcomms-mpi.so, a plugin through
 * include/torchcomms_backend.h; docs/backends.md, "The mpi backend").
 *
 * Built with the MPI's compiler wrapper (mpicc, or TORCHCOMMS_MPICC), once
 * per MPI: it links the MPI it was built with (docs/backends.md says why
 * not a run-time loader). src/reduce/reduce.c is compiled into the plugin
 * for the reductions MPI lacks; only tc_backend_table is exported.
 *
 * Every operation maps onto one non-blocking MPI call (MPI_Ireduce,
 * MPI_Ibcast, MPI_Iallgather(v), MPI_Ireduce_scatter(_block),
 * MPI_Ialltoall(v), MPI_Iscatter(v), MPI_Igather(v), MPI_Ibarrier) or, for
 * point-to-point and batches, MPI_Isend/MPI_Irecv; all_reduce runs
 * recursive doubling or a ring over MPI_Isend/MPI_Irecv, else
 * MPI_Iallreduce (mp_sched_step says why). Per-rank blocks that do not lie
 * back to back are staged through one contiguous buffer. float16,
 * bfloat16, the float8 types and bool reduce through MPI_Op_create'd
 * operations running the library's own kernels; AVG is a SUM divided
 * afterwards, PREMUL_SUM multiplies the inputs first.
 *
 * Threads: MPI is initialised with MPI_THREAD_SERIALIZED and every MPI call
 * of the backend is made under one lock (g_mpi); a program that initialised
 * MPI itself must have MPI_THREAD_MULTIPLE. A synchronous
 * operation posted on a communicator with nothing queued is started and
 * polled (MPI_Test) on the caller's thread, inside the post, as the cpu
 * backend does: two thread hand-offs cost more than a small operation.
 * Everything else goes to one progress thread per process, which starts
 * the operations in post order and polls them all with MPI_Testall. No
 * thread ever blocks in MPI without a deadline during an operation: a
 * deadline that passes fails the operation with TC_ERR_TIMEOUT. MPI cannot
 * cancel a collective, so after one is given up (timeout, abort) the
 * ranks are out of step: the communicator refuses further operations, and
 * buffers MPI may still use are never freed. A receive is cancelled
 * (MPI_Cancel).
 *
 * Launch: under mpirun/mpiexec, rank and size come from MPI's environment
 * (the core reads OMPI_COMM_WORLD_RANK, PMI_RANK ...) and the backend
 * needs no store (TC_BACKEND_CAP_BOOTSTRAP). Launched by torchrun or tcrun
 * (every process an MPI singleton), the processes join through the store:
 * rank 0 opens an MPI port, every other rank connects to it in turn, and
 * the merged communicator is ordered by torchcomms rank. This needs an MPI
 * that can join singletons: neither wheel's can (Open MPI 5 wants a running
 * prte DVM, MPICH 5's singletons have no port name), and creation then
 * fails at once saying to launch with mpirun. MPI is finalised at process exit if the backend
 * initialised it (also with a given-up collective still pending: Open MPI
 * 5 and MPICH 5 both finalise then, test-mpi's Cnb run shows it). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <mpi.h>

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <torchcomms_backend.h>

#include "core/internal.h" /* tc__reduce, tc__scale, tc__divide (reduce.c) */

#define MP_VERSION "0.1.0"
#define MP_TAG 0x7c0    /* the user's point-to-point messages */
/* The steps of a schedule (all_reduce, small broadcast and all_gather;
 * MP_RD_*): one tag per collective, MP_TAG_STEPS
 * + its number on the communicator modulo MP_TAG_SPAN, so that the steps
 * of operations in flight together never match each other's messages
 * between the same two ranks (MPI matches by source, tag and
 * communicator, in posting order; two operations post their steps in an
 * order that differs from rank to rank). MPI guarantees tags up to 32767. */
#define MP_TAG_STEPS 0x1000
#define MP_TAG_SPAN 0x4000

/* ------------------------------------------------------------------------ */
/* Small things                                                              */
/* ------------------------------------------------------------------------ */

/* reduce.c's tc__reduce asks the core for element sizes: compiled into the
 * plugin with -Dtc_dtype_size=tc_mpi_dtype_size, this is it. */
size_t tc_mpi_dtype_size(tc_dtype_t dt) {
  switch (dt) {
#define MP_DTYPE_SIZE(name, val, ctype, size, isf)                            \
  case TC_##name:                                                             \
    return size;
    TC_DTYPE_MAP(MP_DTYPE_SIZE)
#undef MP_DTYPE_SIZE
  default:
    return 0;
  }
}
#define ES(dt) tc_mpi_dtype_size(dt)

static double mp_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Writes "mpi: <what>" into msg; returns rc. */
static int mp_err(char *msg, size_t len, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int mp_err(char *msg, size_t len, int rc, const char *fmt, ...) {
  if (!msg || !len) return rc;
  int n = snprintf(msg, len, "mpi: ");
  if (n >= 0 && (size_t)n < len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + n, len - (size_t)n, fmt, ap);
    va_end(ap);
  }
  return rc;
}

/* Before MPI_Init in a process no MPI launcher started (torchrun, tcrun:
 * an MPI singleton, which mp_join connects to the others): MPICH's default
 * network module, UCX, writes port names longer than MPI_MAX_PORT_NAME, so
 * MPI_Open_port fails ("no space for port_name tag"); its OFI module's
 * fit. Set only when the user chose none, and never under a launcher (the
 * launcher's environment names the ranks), where no port is opened. */
static void mp_singleton_env(void) {
  static const char *const launched[] = {"PMI_RANK", "PMI_FD", "PMI_PORT", "PMIX_RANK",
                                         "OMPI_COMM_WORLD_SIZE", "MPI_LOCALRANKID"};
  for (size_t i = 0; i < sizeof launched / sizeof launched[0]; i++)
    if (getenv(launched[i])) return;
  setenv("MPIR_CVAR_CH4_NETMOD", "ofi", 0);
}

/* An MPI error code as text. */
static void mp_mpi_text(int code, char *buf, size_t len) {
  char s[MPI_MAX_ERROR_STRING];
  int n = 0;
  if (MPI_Error_string(code, s, &n) != MPI_SUCCESS) n = 0;
  s[n < MPI_MAX_ERROR_STRING ? n : MPI_MAX_ERROR_STRING - 1] = 0;
  snprintf(buf, len, "%s", n ? s : "unknown MPI error");
}

static int mp_mpi_fail(char *msg, size_t len, const char *call, int code) {
  char t[MPI_MAX_ERROR_STRING + 1];
  mp_mpi_text(code, t, sizeof t);
  return mp_err(msg, len, TC_ERR_BACKEND, "%s failed: %s", call, t);
}

/* Back-off of a polling loop: spin (each turn an MPI_Test, ~50-100 ns),
 * then yield (more ranks than cores), then sleep 20 us (an idle wait must
 * not take a core). */
#define MP_SPIN 2048
static void mp_pause(unsigned *spins) {
  unsigned s = ++*spins;
  if (s < MP_SPIN) return;
  if (s < 8 * MP_SPIN) {
    sched_yield();
    return;
  }
  struct timespec ts = {0, 20000};
  nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------------------ */
/* MPI, once per process                                                     */
/* ------------------------------------------------------------------------ */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
/* Every MPI call of the backend is made under g_mpi (taken after g_mu when
 * both are held): MPI runs at MPI_THREAD_SERIALIZED when the backend
 * initialises it, which spares MPI's own locking (MPICH's 8-byte allreduce:
 * 2.9 us with MPI_THREAD_MULTIPLE, 0.3 us serialised, on this machine). */
static pthread_mutex_t g_mpi = PTHREAD_MUTEX_INITIALIZER;
#define MPI_LOCK() pthread_mutex_lock(&g_mpi)
#define MPI_UNLOCK() pthread_mutex_unlock(&g_mpi)
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;      /* the engine's wake */
static pthread_cond_t g_done_cv = PTHREAD_COND_INITIALIZER; /* a completion */
static int g_up;       /* MPI usable: 1 */
static int g_ours;     /* we called MPI_Init_thread (we finalise) */
static char g_lib[160];
static int g_level; /* the thread level MPI provides */
static size_t g_small_bytes = 32768; /* TORCHCOMMS_MPI_SMALL_BYTES */
static size_t g_ring_bytes = 32768;  /* TORCHCOMMS_MPI_RING_BYTES */
static MPI_Datatype g_red_type[TC_DTYPE_COUNT]; /* derived types of user-op reductions */
static MPI_Op g_user_op[TC_REDOP_COUNT];

/* The reduction kernels MPI lacks, as MPI user functions: the datatype says
 * which dtype (one derived type per dtype), the function which reduction. */
static tc_dtype_t mp_red_dtype(MPI_Datatype t) {
  for (int d = 0; d < TC_DTYPE_COUNT; d++)
    if (g_red_type[d] != MPI_DATATYPE_NULL && g_red_type[d] == t) return (tc_dtype_t)d;
  return TC_DTYPE_COUNT;
}
#define MP_USER_FN(OP)                                                         \
  static void mp_user_##OP(void *in, void *inout, int *len, MPI_Datatype *t) { \
    tc_dtype_t d = mp_red_dtype(*t);                                           \
    if (d != TC_DTYPE_COUNT && *len > 0) tc__reduce(inout, in, (size_t)*len, d, TC_##OP); \
  }
MP_USER_FN(SUM)
MP_USER_FN(PRODUCT)
MP_USER_FN(MIN)
MP_USER_FN(MAX)
MP_USER_FN(BAND)
MP_USER_FN(BOR)
MP_USER_FN(BXOR)

static void mp_atexit(void) {
  pthread_mutex_lock(&g_mu);
  int fin = g_up && g_ours;
  g_up = 0;
  pthread_mutex_unlock(&g_mu);
  int done = 0;
  MPI_LOCK();
  if (fin && MPI_Finalized(&done) == MPI_SUCCESS && !done) MPI_Finalize();
  MPI_UNLOCK();
}

/* Initialises MPI and the user reductions, once: thread level SERIALIZED
 * when the backend initialises MPI (its calls are serialised by g_mpi);
 * MULTIPLE when the program did (its own calls may run beside ours). */
static int mp_mpi_up(char *err, size_t errlen) {
  pthread_mutex_lock(&g_mu);
  MPI_LOCK();
  int rc = TC_OK;
  if (g_up) goto out;
  int inited = 0, finalized = 0, prov = 0;
  MPI_Finalized(&finalized);
  if (finalized) {
    rc = mp_err(err, errlen, TC_ERR_INVALID_USAGE,
                "MPI has already been finalised in this process (MPI_Finalize was "
                "called); create every mpi communicator before that");
    goto out;
  }
  MPI_Initialized(&inited);
  if (!inited) {
    mp_singleton_env();
    int code = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &prov);
    if (code != MPI_SUCCESS) {
      rc = mp_mpi_fail(err, errlen, "MPI_Init_thread", code);
      goto out;
    }
    g_ours = 1;
    atexit(mp_atexit);
  } else {
    MPI_Query_thread(&prov);
  }
  int need = g_ours ? MPI_THREAD_SERIALIZED : MPI_THREAD_MULTIPLE;
  if (prov < need) {
    rc = mp_err(err, errlen, TC_ERR_NOT_SUPPORTED,
                "MPI provides thread level %d, below %s (%d): the backend calls MPI "
                "from more than one thread. %s", prov,
                g_ours ? "MPI_THREAD_SERIALIZED" : "MPI_THREAD_MULTIPLE", need,
                g_ours ? "Use an MPI built with thread support (Open MPI, MPICH "
                         "and Intel MPI are by default)"
                       : "Initialise MPI with MPI_Init_thread(MPI_THREAD_MULTIPLE) "
                         "(mpi4py does by default), or let torchcomms initialise it");
    goto out;
  }
  g_level = prov;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  /* the plugin cannot link the core's settings table; the core checked the
   * value (a whole number) when the communicator was created */
  const char *sb = getenv("TORCHCOMMS_MPI_SMALL_BYTES");
  if (sb && *sb) g_small_bytes = (size_t)strtoull(sb, NULL, 10);
  const char *rb = getenv("TORCHCOMMS_MPI_RING_BYTES");
  if (rb && *rb) g_ring_bytes = (size_t)strtoull(rb, NULL, 10);
  for (int d = 0; d < TC_DTYPE_COUNT; d++) g_red_type[d] = MPI_DATATYPE_NULL;
  static const tc_dtype_t own[] = {TC_FLOAT16, TC_BFLOAT16, TC_BOOL, TC_FLOAT8_E4M3FN,
                                   TC_FLOAT8_E5M2};
  for (size_t i = 0; i < sizeof own / sizeof own[0]; i++) {
    MPI_Datatype t;
    MPI_Type_contiguous((int)ES(own[i]), MPI_BYTE, &t);
    MPI_Type_commit(&t);
    g_red_type[own[i]] = t;
  }
  for (int o = 0; o < TC_REDOP_COUNT; o++) g_user_op[o] = MPI_OP_NULL;
  MPI_Op_create(mp_user_SUM, 1, &g_user_op[TC_SUM]);
  MPI_Op_create(mp_user_PRODUCT, 1, &g_user_op[TC_PRODUCT]);
  MPI_Op_create(mp_user_MIN, 1, &g_user_op[TC_MIN]);
  MPI_Op_create(mp_user_MAX, 1, &g_user_op[TC_MAX]);
  MPI_Op_create(mp_user_BAND, 1, &g_user_op[TC_BAND]);
  MPI_Op_create(mp_user_BOR, 1, &g_user_op[TC_BOR]);
  MPI_Op_create(mp_user_BXOR, 1, &g_user_op[TC_BXOR]);
  g_user_op[TC_AVG] = g_user_op[TC_PREMUL_SUM] = g_user_op[TC_SUM];
  char lib[MPI_MAX_LIBRARY_VERSION_STRING];
  int n = 0;
  if (MPI_Get_library_version(lib, &n) != MPI_SUCCESS) n = 0;
  lib[n < MPI_MAX_LIBRARY_VERSION_STRING ? n : MPI_MAX_LIBRARY_VERSION_STRING - 1] = 0;
  char *nl = strpbrk(lib, "\n,");
  if (nl) *nl = 0;
  snprintf(g_lib, sizeof g_lib, "%s", n ? lib : "unknown MPI");
  g_up = 1;
out:
  MPI_UNLOCK();
  pthread_mutex_unlock(&g_mu);
  return rc;
}

/* The MPI type that moves a dtype (the bits; reductions pick their own). */
static MPI_Datatype mp_move_type(tc_dtype_t dt) {
  switch (ES(dt)) {
  case 1: return MPI_UINT8_T;
  case 2: return MPI_UINT16_T;
  case 4: return dt == TC_FLOAT32 ? MPI_FLOAT : MPI_UINT32_T;
  default: return dt == TC_FLOAT64 ? MPI_DOUBLE : MPI_UINT64_T;
  }
}

/* The MPI type and operation of a reduction. */
static void mp_red(tc_dtype_t dt, tc_redop_type_t op, MPI_Datatype *t, MPI_Op *o) {
  MPI_Datatype native = MPI_DATATYPE_NULL;
  switch (dt) {
  case TC_FLOAT32: native = MPI_FLOAT; break;
  case TC_FLOAT64: native = MPI_DOUBLE; break;
  case TC_INT8: native = MPI_INT8_T; break;
  case TC_UINT8: native = MPI_UINT8_T; break;
  case TC_INT16: native = MPI_INT16_T; break;
  case TC_INT32: native = MPI_INT32_T; break;
  case TC_INT64: native = MPI_INT64_T; break;
  default: break;
  }
  if (native == MPI_DATATYPE_NULL) {
    *t = g_red_type[dt];
    *o = g_user_op[op];
    return;
  }
  *t = native;
  switch (op) {
  case TC_PRODUCT: *o = MPI_PROD; break;
  case TC_MIN: *o = MPI_MIN; break;
  case TC_MAX: *o = MPI_MAX; break;
  case TC_BAND: *o = MPI_BAND; break;
  case TC_BOR: *o = MPI_BOR; break;
  case TC_BXOR: *o = MPI_BXOR; break;
  default: *o = MPI_SUM; break; /* SUM, AVG (then divided), PREMUL_SUM (scaled first) */
  }
}

/* ------------------------------------------------------------------------ */
/* Communicators and queued operations                                       */
/* ------------------------------------------------------------------------ */

typedef struct mp_comm {
  const tc_backend_host_t *host;
  MPI_Comm comm;
  int rank, size;
  double timeout_s;
  char name[128];
  atomic_int aborted;
  /* under g_mu: */
  int queued;   /* posted to the engine, not started */
  int inflight; /* posted, not completed */
  int poisoned; /* an operation MPI cannot cancel was given up */
  uint64_t colls; /* collectives posted (the same count on every rank) */
  void *scratch;         /* the small all_reduce's receive buffer (g_small_bytes), */
  atomic_int scratch_busy; /* lent to one operation at a time */
  char poison[256];
} mp_comm_t;

/* One step: send sbuf (scount elements) to `to`, receive rcount into rbuf
 * from `from` (-1: none), then reduce rbuf into red (NULL: received in
 * place). */
typedef struct mp_step {
  int to, from;
  const void *sbuf;
  size_t scount;
  void *rbuf;
  size_t rcount;
  void *red;
} mp_step_t;

/* Operations run as a schedule of steps over MPI_Isend/MPI_Irecv (e->rd) */
enum { MP_RD_NONE, MP_RD_AR_SMALL, MP_RD_AR_RING, MP_RD_BCAST, MP_RD_AG };

#define MP_SMALL_REQ 4
typedef struct mp_ent {
  struct mp_ent *next;
  mp_comm_t *c;
  tc_backend_op_t op; /* the core's descriptor: its pointers stay valid until completion */
  tc_work_t *work;
  MPI_Request small[MP_SMALL_REQ];
  MPI_Request *req;
  int nreq;
  const char *call; /* the MPI call, for messages */
  void *stage;      /* contiguous receive staging, copied out at the end */
  void *tmp;        /* send staging / scaled inputs */
  int *iv;          /* counts and displacements */
  double deadline;
  int on_stack;     /* the caller's (a synchronous operation run in the post) */
  int scratch;      /* tmp is the communicator's scratch */
  int rd, rd_step;  /* by steps (MP_RD_*): the step */
  char *base;       /* MP_RD_BCAST, MP_RD_AG: the buffer the steps move (not owned) */
  int tag;          /* its steps' tag (MP_TAG_STEPS + ...) */
  mp_step_t st;     /* the step running */
  int frc;          /* the engine could not start it: the status and why */
  char *fmsg;
} mp_ent_t;

static void mp_ent_free(mp_ent_t *e) {
  if (e->req != e->small) free(e->req);
  free(e->stage);
  if (e->scratch) atomic_store(&e->c->scratch_busy, 0);
  else free(e->tmp);
  free(e->iv);
  if (!e->on_stack) free(e);
}

/* malloc that never returns NULL for 0 bytes. */
static void *mp_alloc(size_t bytes) { return malloc(bytes ? bytes : 1); }

/* Fits a count into MPI's int. */
static int mp_int(size_t v, int *out) {
  if (v > (size_t)INT_MAX) return -1;
  *out = (int)v;
  return 0;
}

/* Per-rank blocks as MPI counts and displacements (elements) in one
 * contiguous buffer: iv[0..n) counts, iv[n..2n) displacements; *total. */
static int mp_layout(const tc_block_t *b, int n, int *iv, size_t *total) {
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    if (mp_int(b[i].count, &iv[i]) || mp_int(off, &iv[n + i])) return -1;
    off += b[i].count;
  }
  if (off > (size_t)INT_MAX) return -1;
  *total = off;
  return 0;
}

static void mp_pack(void *dst, const tc_block_t *b, int n, size_t es) {
  char *p = dst;
  for (int i = 0; i < n; i++) {
    if (b[i].count) memcpy(p, b[i].buf, b[i].count * es);
    p += b[i].count * es;
  }
}
static void mp_unpack(const tc_block_t *b, int n, const void *src, size_t es) {
  const char *p = src;
  for (int i = 0; i < n; i++) {
    if (b[i].count && b[i].buf != p) memmove(b[i].buf, p, b[i].count * es);
    p += b[i].count * es;
  }
}

/* 1 when [a, a+al) and [b, b+bl) overlap. */
static int mp_overlap(const void *a, size_t al, const void *b, size_t bl) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return al && bl && x < y + bl && y < x + al;
}

/* The inputs of a rank as one contiguous (possibly scaled) buffer: the
 * user's when contiguous and not scaled and not overlapping `avoid`, else a
 * copy in e->tmp. */
static const void *mp_send_side(mp_ent_t *e, const tc_block_t *blocks, int n, size_t total,
                                const void *avoid, size_t avoid_bytes) {
  const tc_backend_op_t *op = &e->op;
  size_t es = ES(op->dtype);
  int scale = op->redop.type == TC_PREMUL_SUM && tc_backend_op_reduces(op);
  if ((op->flags & TC_OPF_SEND_CONTIG) && op->sendbuf && !scale &&
      !mp_overlap(op->sendbuf, total * es, avoid, avoid_bytes))
    return op->sendbuf;
  e->tmp = mp_alloc(total * es);
  if (!e->tmp) return NULL;
  mp_pack(e->tmp, blocks, n, es);
  if (scale) tc__scale(e->tmp, e->tmp, total, op->dtype, op->redop.factor);
  return e->tmp;
}

static int mp_reqs(mp_ent_t *e, int n) {
  e->req = n <= MP_SMALL_REQ ? e->small : malloc((size_t)n * sizeof(MPI_Request));
  if (!e->req) return -1;
  for (int i = 0; i < n; i++) e->req[i] = MPI_REQUEST_NULL;
  e->nreq = n;
  return 0;
}

#define MP_TOO_BIG(what)                                                       \
  mp_err(msg, len, TC_ERR_NOT_SUPPORTED,                                       \
         "%s exceeds MPI's int count (%d elements); split the tensor", what, INT_MAX)
#define MP_NOMEM() mp_err(msg, len, TC_ERR_NOMEM, "out of memory staging the operation")
#define MP_CALL(name, ...)                                                     \
  do {                                                                         \
    e->call = name;                                                            \
    int code_ = __VA_ARGS__;                                                   \
    if (code_ != MPI_SUCCESS) return mp_mpi_fail(msg, len, name, code_);       \
  } while (0)

/* all_reduce over MPI_Isend/MPI_Irecv, as a schedule of steps (e->rd: MP_RD_AR_SMALL
 * recursive doubling, MP_RD_AR_RING ring), because MPI's non-blocking MPI_Iallreduce
 * is much slower than its blocking MPI_Allreduce: about 1 us more at 8
 * bytes (the schedule machinery), and up to 4x at 512 KiB (Open MPI 5's
 * libnbc), on this machine (docs/backends.md, section 9).
 *
 * Recursive doubling (at most TORCHCOMMS_MPI_SMALL_BYTES): with p the
 * largest power of two <= n and x = n - p, rank r >= p sends its data to
 * r - p and receives the result from it; r < x first receives and reduces
 * the data of r + p, then takes part in the log2(p) exchanges, then sends
 * the result to r + p. Every exchange is a+b on one side and b+a on the
 * other, so every rank ends with the same bits.
 *
 * Ring (at least TORCHCOMMS_MPI_RING_BYTES, above the former): the buffer in n chunks; n - 1
 * steps of reduce-scatter (send chunk r-k to r+1, receive chunk r-k-1 from
 * r-1 and reduce it), after which rank r holds the result of chunk r+1,
 * then n - 1 steps of all-gather (send chunk r+1-k, receive chunk r-k in
 * place). Each chunk is reduced on one rank only: the same bits everywhere.
 *
 * Both settings at 0 give MPI_Iallreduce for every size (an MPI whose
 * collectives are offloaded to the network may do better). The choice
 * depends on the kind, size and settings only (the same on every rank),
 * never on the rank or on sync/async. */


/* Chunk i of the ring: its offset and length in elements. */
static void mp_chunk(size_t count, int n, int i, size_t *off, size_t *len) {
  size_t base = count / (size_t)n, rem = count % (size_t)n, ui = (size_t)i;
  *off = ui * base + (ui < rem ? ui : rem);
  *len = base + (ui < rem);
}

/* Step `step` of e's schedule into *st; 0 when there is none left. */
static int mp_sched_step(const mp_ent_t *e, int step, mp_step_t *st) {
  const tc_backend_op_t *op = &e->op;
  int r = e->c->rank, n = e->c->size;
  char *buf = op->recvbuf;
  size_t es = ES(op->dtype);
  memset(st, 0, sizeof *st);
  st->to = st->from = -1;
  if (e->rd == MP_RD_BCAST) { /* binomial tree from the root, by relative rank */
    int vr = (r - op->root + n) % n, mask = 1 << step;
    if (mask >= n) return 0;
    if (vr < mask && vr + mask < n) st->to = (vr + mask + op->root) % n;
    else if (vr >= mask && vr < 2 * mask) st->from = (vr - mask + op->root) % n;
    st->sbuf = st->rbuf = e->base;
    st->scount = st->rcount = op->count;
    return 1;
  }
  if (e->rd == MP_RD_AG) { /* ring: step k sends block r-k on, receives r-k-1 */
    if (step >= n - 1) return 0;
    size_t bb = op->count * es;
    st->to = (r + 1) % n;
    st->from = (r - 1 + n) % n;
    st->sbuf = e->base + (size_t)((r - step + n) % n) * bb;
    st->rbuf = e->base + (size_t)((r - step - 1 + 2 * n) % n) * bb;
    st->scount = st->rcount = op->count;
    return 1;
  }
  if (e->rd == MP_RD_AR_RING) { /* ring */
    int prev = (r - 1 + n) % n, next = (r + 1) % n;
    size_t so, sl, ro, rl;
    if (step >= 2 * (n - 1)) return 0;
    if (step < n - 1) {
      mp_chunk(op->count, n, ((r - step) % n + n) % n, &so, &sl);
      mp_chunk(op->count, n, ((r - step - 1) % n + n) % n, &ro, &rl);
      st->rbuf = e->tmp;
      st->red = buf + ro * es;
    } else {
      int k = step - (n - 1);
      mp_chunk(op->count, n, ((r + 1 - k) % n + n) % n, &so, &sl);
      mp_chunk(op->count, n, ((r - k) % n + n) % n, &ro, &rl);
      st->rbuf = buf + ro * es;
    }
    st->to = next;
    st->sbuf = buf + so * es;
    st->scount = sl;
    st->from = prev;
    st->rcount = rl;
    return 1;
  }
  int p = 1, lg = 0; /* recursive doubling */
  while (p * 2 <= n) {
    p *= 2;
    lg++;
  }
  int x = n - p, peer_to = -1, peer_from = -1, reduce = 0;
  if (r >= p) { /* folded in: send, then get the result */
    if (step == 0) peer_to = r - p;
    else if (step == 1) peer_from = r - p;
    else return 0;
  } else if (r < x && step == 0) {
    peer_from = r + p;
    reduce = 1;
  } else {
    int k = r < x ? step - 1 : step;
    if (r < x && k == lg) peer_to = r + p;
    else if (k >= lg) return 0;
    else {
      peer_to = peer_from = r ^ (1 << k);
      reduce = 1;
    }
  }
  st->to = peer_to;
  st->from = peer_from;
  st->sbuf = buf;
  st->scount = st->rcount = op->count;
  st->rbuf = reduce ? e->tmp : buf;
  st->red = reduce ? buf : NULL;
  return 1;
}

/* Posts the requests of e's current step (g_mpi held); *more = 0 when the
 * schedule is over. */
static int mp_rd_post(mp_ent_t *e, char *msg, size_t len, int *more) {
  const tc_backend_op_t *op = &e->op;
  MPI_Datatype mt = mp_move_type(op->dtype);
  *more = mp_sched_step(e, e->rd_step, &e->st);
  if (!*more) return TC_OK;
  e->nreq = 0;
  e->req = e->small;
  const mp_step_t *st = &e->st;
  if (st->from >= 0) {
    e->call = "MPI_Irecv";
    int code = MPI_Irecv(st->rbuf, (int)st->rcount, mt, st->from, e->tag, e->c->comm,
                         &e->req[e->nreq++]);
    if (code != MPI_SUCCESS) return mp_mpi_fail(msg, len, "MPI_Irecv", code);
  }
  if (st->to >= 0) {
    e->call = "MPI_Isend";
    int code = MPI_Isend(st->sbuf, (int)st->scount, mt, st->to, e->tag, e->c->comm,
                         &e->req[e->nreq++]);
    if (code != MPI_SUCCESS) return mp_mpi_fail(msg, len, "MPI_Isend", code);
  }
  static const char *const calls[] = {
      "", "the small all_reduce's MPI_Isend/MPI_Irecv",
      "the ring all_reduce's MPI_Isend/MPI_Irecv",
      "the broadcast tree's MPI_Isend/MPI_Irecv", "the ring all_gather's MPI_Isend/MPI_Irecv"};
  e->call = calls[e->rd];
  return TC_OK;
}

/* Starts the MPI call(s) of one operation (non-blocking). */
static int mp_start(mp_ent_t *e, char *msg, size_t len) {
  mp_comm_t *c = e->c;
  tc_backend_op_t *op = &e->op;
  MPI_Comm comm = c->comm;
  int n = c->size, cnt = 0;
  size_t es = ES(op->dtype);
  MPI_Datatype mt = mp_move_type(op->dtype), rt;
  MPI_Op mo;
  mp_red(op->dtype, op->redop.type, &rt, &mo);
  int scale = op->redop.type == TC_PREMUL_SUM;
  if (op->kind != TC_KIND_BATCH && op->kind != TC_KIND_BARRIER && mp_int(op->count, &cnt))
    return MP_TOO_BIG("the count");
  if (op->kind == TC_KIND_BATCH) {
    if (mp_reqs(e, op->num_p2p ? (int)op->num_p2p : 1)) return MP_NOMEM();
  } else if (mp_reqs(e, 1)) {
    return MP_NOMEM();
  }
  MPI_Request *r = e->req;
  switch (op->kind) {
  case TC_KIND_SEND:
    MP_CALL("MPI_Isend", MPI_Isend(op->sendbuf, cnt, mt, op->root, MP_TAG, comm, r));
    return TC_OK;
  case TC_KIND_RECV:
    MP_CALL("MPI_Irecv", MPI_Irecv(op->recvbuf, cnt, mt, op->root, MP_TAG, comm, r));
    return TC_OK;
  case TC_KIND_BATCH:
    for (size_t i = 0; i < op->num_p2p; i++) {
      const tc_p2p_t *p = &op->p2p[i];
      int pc;
      if (mp_int(p->count, &pc)) return MP_TOO_BIG("a send or receive of the batch");
      MPI_Datatype pt = mp_move_type(p->dtype);
      if (p->is_send)
        MP_CALL("MPI_Isend", MPI_Isend(p->buf, pc, pt, p->peer, MP_TAG, comm, &r[i]));
      else
        MP_CALL("MPI_Irecv", MPI_Irecv(p->buf, pc, pt, p->peer, MP_TAG, comm, &r[i]));
    }
    e->call = "MPI_Isend/MPI_Irecv";
    if (!op->num_p2p) e->nreq = 0;
    return TC_OK;
  case TC_KIND_BARRIER:
    MP_CALL("MPI_Ibarrier", MPI_Ibarrier(comm, r));
    return TC_OK;
  case TC_KIND_BROADCAST:
    if (n > 1 && op->count * es <= g_small_bytes) { /* as all_reduce: see above */
      int more;
      e->rd = MP_RD_BCAST;
      e->base = op->recvbuf;
      return mp_rd_post(e, msg, len, &more);
    }
    MP_CALL("MPI_Ibcast", MPI_Ibcast(op->recvbuf, cnt, mt, op->root, comm, r));
    return TC_OK;
  case TC_KIND_ALL_REDUCE:
    if (scale) tc__scale(op->recvbuf, op->recvbuf, op->count, op->dtype, op->redop.factor);
    if (n > 1 && (op->count * es <= g_small_bytes ||
                  (g_ring_bytes && op->count * es >= g_ring_bytes))) {
      int more, idle = 0;
      e->rd = op->count * es <= g_small_bytes ? MP_RD_AR_SMALL : MP_RD_AR_RING;
      size_t tmp_bytes =
          e->rd == MP_RD_AR_SMALL ? op->count * es : (op->count / (size_t)n + 1) * es;
      if (tmp_bytes <= g_small_bytes && c->scratch &&
          atomic_compare_exchange_strong(&c->scratch_busy, &idle, 1)) {
        e->tmp = c->scratch; /* returned by mp_ent_free */
        e->scratch = 1;
      } else if (!(e->tmp = mp_alloc(tmp_bytes))) {
        return MP_NOMEM();
      }
      return mp_rd_post(e, msg, len, &more);
    }
    MP_CALL("MPI_Iallreduce",
            MPI_Iallreduce(MPI_IN_PLACE, op->recvbuf, cnt, rt, mo, comm, r));
    return TC_OK;
  case TC_KIND_REDUCE: {
    if (scale) {
      if (c->rank == op->root) {
        tc__scale(op->recvbuf, op->recvbuf, op->count, op->dtype, op->redop.factor);
      } else {
        if (!(e->tmp = mp_alloc(op->count * es))) return MP_NOMEM();
        tc__scale(e->tmp, op->recvbuf, op->count, op->dtype, op->redop.factor);
      }
    }
    if (c->rank == op->root)
      MP_CALL("MPI_Ireduce", MPI_Ireduce(MPI_IN_PLACE, op->recvbuf, cnt, rt, mo, op->root,
                                         comm, r));
    else
      MP_CALL("MPI_Ireduce", MPI_Ireduce(e->tmp ? e->tmp : op->recvbuf, NULL, cnt, rt, mo,
                                         op->root, comm, r));
    return TC_OK;
  }
  case TC_KIND_ALL_GATHER: {
    if (!(e->iv = malloc(2 * (size_t)n * sizeof(int)))) return MP_NOMEM();
    size_t total;
    if (mp_layout(op->recv, n, e->iv, &total)) return MP_TOO_BIG("the gathered result");
    char *base = op->recvbuf;
    if (!(op->flags & TC_OPF_RECV_CONTIG) || !base) {
      if (!(e->stage = mp_alloc(total * es))) return MP_NOMEM();
      base = e->stage;
    }
    const void *src = op->sendbuf;
    if (base == (char *)op->recvbuf && src == base + (size_t)e->iv[n + c->rank] * es)
      src = MPI_IN_PLACE;
    else if (mp_overlap(src, op->count * es, base, total * es))
      return mp_err(msg, len, TC_ERR_INVALID_ARGUMENT,
                    "the input overlaps the output other than as this rank's block");
    if ((op->flags & TC_OPF_UNIFORM) && n > 1 && total * es <= g_small_bytes) {
      /* a ring over MPI_Isend/MPI_Irecv, as the small all_reduce: at 8
       * bytes MPI_Iallgather's schedule costs 0.3-0.5 us more (Open MPI 5,
       * MPICH 5); larger, Open MPI's point-to-point is slower than its
       * collective (32 KiB blocks: 8.2 against 6.9 us), so MPI's own */
      int more;
      if (src != MPI_IN_PLACE)
        memcpy(base + (size_t)c->rank * op->count * es, src, op->count * es);
      e->rd = MP_RD_AG;
      e->base = base;
      return mp_rd_post(e, msg, len, &more);
    }
    if (op->flags & TC_OPF_UNIFORM)
      MP_CALL("MPI_Iallgather", MPI_Iallgather(src, cnt, mt, base, cnt, mt, comm, r));
    else
      MP_CALL("MPI_Iallgatherv", MPI_Iallgatherv(src, cnt, mt, base, e->iv, e->iv + n, mt,
                                                 comm, r));
    return TC_OK;
  }
  case TC_KIND_REDUCE_SCATTER: {
    if (!(e->iv = malloc(2 * (size_t)n * sizeof(int)))) return MP_NOMEM();
    size_t total;
    if (mp_layout(op->send, n, e->iv, &total)) return MP_TOO_BIG("the input");
    const void *src = mp_send_side(e, op->send, n, total, op->recvbuf, op->count * es);
    if (!src) return MP_NOMEM();
    if (op->flags & TC_OPF_UNIFORM)
      MP_CALL("MPI_Ireduce_scatter_block",
              MPI_Ireduce_scatter_block(src, op->recvbuf, cnt, rt, mo, comm, r));
    else
      MP_CALL("MPI_Ireduce_scatter",
              MPI_Ireduce_scatter(src, op->recvbuf, e->iv, rt, mo, comm, r));
    return TC_OK;
  }
  case TC_KIND_ALL_TO_ALL: {
    if (!(e->iv = malloc(4 * (size_t)n * sizeof(int)))) return MP_NOMEM();
    size_t stot, rtot;
    if (mp_layout(op->send, n, e->iv, &stot) || mp_layout(op->recv, n, e->iv + 2 * n, &rtot))
      return MP_TOO_BIG("the input or output");
    char *base = op->recvbuf;
    if (!(op->flags & TC_OPF_RECV_CONTIG) || !base) {
      if (!(e->stage = mp_alloc(rtot * es))) return MP_NOMEM();
      base = e->stage;
    }
    const void *src = mp_send_side(e, op->send, n, stot, base, rtot * es);
    if (!src) return MP_NOMEM();
    if ((op->flags & TC_OPF_UNIFORM) && n > 0)
      MP_CALL("MPI_Ialltoall", MPI_Ialltoall(src, cnt, mt, base, cnt, mt, comm, r));
    else
      MP_CALL("MPI_Ialltoallv", MPI_Ialltoallv(src, e->iv, e->iv + n, mt, base, e->iv + 2 * n,
                                               e->iv + 3 * n, mt, comm, r));
    return TC_OK;
  }
  case TC_KIND_SCATTER: {
    int root = op->root, me = c->rank == root;
    const void *src = NULL;
    void *dst = op->recvbuf;
    if (!(e->iv = malloc(2 * (size_t)n * sizeof(int)))) return MP_NOMEM();
    if (me) {
      size_t total;
      if (mp_layout(op->send, n, e->iv, &total)) return MP_TOO_BIG("the input");
      src = (op->flags & TC_OPF_SEND_CONTIG) && op->sendbuf ? op->sendbuf : NULL;
      if (src && dst == (const char *)src + (size_t)e->iv[n + root] * es)
        dst = MPI_IN_PLACE;
      else if (!src || mp_overlap(src, total * es, dst, op->count * es))
        src = mp_send_side(e, op->send, n, total, dst, op->count * es);
      if (!src) return MP_NOMEM();
    }
    if (op->flags & TC_OPF_UNIFORM)
      MP_CALL("MPI_Iscatter", MPI_Iscatter(src, cnt, mt, dst, cnt, mt, root, comm, r));
    else
      MP_CALL("MPI_Iscatterv", MPI_Iscatterv(src, e->iv, e->iv + n, mt, dst, cnt, mt, root,
                                             comm, r));
    return TC_OK;
  }
  case TC_KIND_GATHER: {
    int root = op->root, me = c->rank == root;
    const void *src = op->sendbuf;
    char *base = NULL;
    if (!(e->iv = malloc(2 * (size_t)n * sizeof(int)))) return MP_NOMEM();
    if (me) {
      size_t total;
      if (mp_layout(op->recv, n, e->iv, &total)) return MP_TOO_BIG("the gathered result");
      base = op->recvbuf;
      if (!(op->flags & TC_OPF_RECV_CONTIG) || !base) {
        if (!(e->stage = mp_alloc(total * es))) return MP_NOMEM();
        base = e->stage;
      }
      if (base == (char *)op->recvbuf && src == base + (size_t)e->iv[n + root] * es)
        src = MPI_IN_PLACE;
      else if (mp_overlap(src, op->count * es, base, total * es))
        return mp_err(msg, len, TC_ERR_INVALID_ARGUMENT,
                      "the input overlaps the output other than as the root's block");
    }
    if (op->flags & TC_OPF_UNIFORM)
      MP_CALL("MPI_Igather", MPI_Igather(src, cnt, mt, base, cnt, mt, root, comm, r));
    else
      MP_CALL("MPI_Igatherv", MPI_Igatherv(src, cnt, mt, base, e->iv, e->iv + n, mt, root,
                                           comm, r));
    return TC_OK;
  }
  default:
    return mp_err(msg, len, TC_ERR_NOT_SUPPORTED, "operation kind %d is not supported",
                  (int)op->kind);
  }
}

/* After the MPI call(s) completed: copies out of staging, AVG's division. */
static void mp_finish(mp_ent_t *e) {
  tc_backend_op_t *op = &e->op;
  mp_comm_t *c = e->c;
  size_t es = ES(op->dtype);
  switch (op->kind) {
  case TC_KIND_ALL_GATHER:
  case TC_KIND_ALL_TO_ALL:
    if (e->stage) mp_unpack(op->recv, c->size, e->stage, es);
    break;
  case TC_KIND_GATHER:
    if (e->stage && c->rank == op->root) mp_unpack(op->recv, c->size, e->stage, es);
    break;
  default:
    break;
  }
  if (op->redop.type == TC_AVG && tc_backend_op_reduces(op) &&
      (op->kind != TC_KIND_REDUCE || c->rank == op->root))
    tc__divide(op->recvbuf, op->count, op->dtype, (uint64_t)c->size);
}

/* ------------------------------------------------------------------------ */
/* Completion, deadlines, abort                                              */
/* ------------------------------------------------------------------------ */

/* Completes e (no lock held) and frees it, or leaves its buffers to MPI
 * (given up while MPI may still use them). */
static void mp_complete(mp_ent_t *e, int rc, const char *msg, int given_up) {
  mp_comm_t *c = e->c;
  tc_work_t *w = e->work;
  const tc_backend_host_t *host = c->host;
  if (given_up) {
    /* receives are cancelled; a send or collective still running is left
     * to MPI with its buffers (leaked: MPI may still read or write them) */
    int leak = 0;
    MPI_LOCK();
    for (int i = 0; i < e->nreq; i++) {
      if (e->req[i] == MPI_REQUEST_NULL) continue;
      int recv = e->op.kind == TC_KIND_RECV ||
                 (e->op.kind == TC_KIND_BATCH && !e->op.p2p[i].is_send) ||
                 (e->rd && i == 0 && e->st.from >= 0);
      int done = 0;
      if (recv) MPI_Cancel(&e->req[i]);
      MPI_Test(&e->req[i], &done, MPI_STATUS_IGNORE); /* a cancelled receive ends at once */
      if (!done) leak = 1;
    }
    MPI_UNLOCK();
    pthread_mutex_lock(&g_mu);
    /* a collective given up on this rank leaves the ranks out of step
     * (some may have finished it, some not begun): nothing more runs */
    if ((leak || tc_backend_op_is_collective(&e->op)) && !c->poisoned) {
      c->poisoned = 1;
      snprintf(c->poison, sizeof c->poison,
               "an earlier %s (#%llu) on this communicator was given up before every "
               "rank had finished it, so the ranks are out of step; abort this "
               "communicator and create a new one",
               tc_backend_op_name(e->op.type), (unsigned long long)e->op.seq);
    }
    c->inflight--;
    pthread_cond_broadcast(&g_done_cv);
    pthread_mutex_unlock(&g_mu);
    /* leaked: the staging buffers stay (MPI holds the request handles and
     * the buffers, not the entry, which may be the caller's stack) */
    if (!leak) mp_ent_free(e);
  } else {
    pthread_mutex_lock(&g_mu);
    c->inflight--;
    if (c->inflight == 0) pthread_cond_broadcast(&g_done_cv);
    pthread_mutex_unlock(&g_mu);
    mp_ent_free(e);
  }
  host->work_complete(w, rc, rc == TC_OK ? NULL : msg);
}

/* Polls e once: 1 when it ended (and was completed), 0 otherwise. */
static int mp_poll(mp_ent_t *e, double now) {
  char msg[512];
  if (atomic_load(&e->c->aborted)) {
    mp_err(msg, sizeof msg, TC_ERR_ABORTED, "communicator was aborted");
    mp_complete(e, TC_ERR_ABORTED, msg, 1);
    return 1;
  }
  int done = 1;
  if (e->nreq) {
    MPI_LOCK();
    int code = e->nreq == 1 ? MPI_Test(e->req, &done, MPI_STATUS_IGNORE)
                            : MPI_Testall(e->nreq, e->req, &done, MPI_STATUSES_IGNORE);
    MPI_UNLOCK();
    if (code != MPI_SUCCESS) {
      int rc = mp_mpi_fail(msg, sizeof msg, e->call, code);
      mp_complete(e, rc, msg, 1);
      return 1;
    }
  }
  while (done && e->rd) { /* the small all_reduce: on to its next step */
    const tc_backend_op_t *op = &e->op;
    if (e->st.red) tc__reduce(e->st.red, e->st.rbuf, e->st.rcount, op->dtype, op->redop.type);
    e->rd_step++;
    int more = 0;
    MPI_LOCK();
    int rc = mp_rd_post(e, msg, sizeof msg, &more);
    done = 0;
    if (rc == TC_OK && more) {
      int code = MPI_Testall(e->nreq, e->req, &done, MPI_STATUSES_IGNORE);
      if (code != MPI_SUCCESS) rc = mp_mpi_fail(msg, sizeof msg, e->call, code);
    }
    MPI_UNLOCK();
    if (rc != TC_OK) {
      mp_complete(e, rc, msg, 1);
      return 1;
    }
    if (!more) {
      e->nreq = 0;
      done = 1;
      break;
    }
  }
  if (done) {
    mp_finish(e);
    mp_complete(e, TC_OK, NULL, 0);
    return 1;
  }
  if (e->deadline == 0) { /* on the caller's thread: the first look at the clock */
    if (now == 0) return 0;
    e->deadline = now + e->op.timeout_s;
  }
  if (now >= e->deadline) {
    mp_err(msg, sizeof msg, TC_ERR_TIMEOUT,
           "timed out after %.3f s waiting for %s (a peer has not called the matching "
           "operation, or is stuck or gone)", e->op.timeout_s, e->call);
    mp_complete(e, TC_ERR_TIMEOUT, msg, 1);
    return 1;
  }
  return 0;
}

/* Starts e (g_mu held; takes g_mpi): TC_OK, or the error with msg (e not started). */
static int mp_start_locked(mp_ent_t *e, char *msg, size_t len) {
  mp_comm_t *c = e->c;
  if (atomic_load(&c->aborted))
    return mp_err(msg, len, TC_ERR_ABORTED, "communicator was aborted");
  if (c->poisoned) return mp_err(msg, len, TC_ERR_INVALID_USAGE, "%s", c->poison);
  MPI_LOCK();
  int rc = mp_start(e, msg, len);
  MPI_UNLOCK();
  /* the engine's deadline starts now; the caller's on its first clock
   * read (mp_post), so that an operation done in a few polls reads none */
  if (rc == TC_OK) e->deadline = e->on_stack ? 0 : mp_now() + e->op.timeout_s;
  return rc;
}

/* ------------------------------------------------------------------------ */
/* The progress thread (one per process)                                     */
/* ------------------------------------------------------------------------ */

static mp_ent_t *g_qhead, *g_qtail; /* to start, in post order (g_mu) */
static int g_thread_up;

static void *mp_engine(void *arg) {
  (void)arg;
  mp_ent_t *active = NULL, **atail = &active;
  unsigned spins = 0;
  for (;;) {
    pthread_mutex_lock(&g_mu);
    while (!g_qhead && !active) {
      spins = 0;
      pthread_cond_wait(&g_cv, &g_mu);
    }
    mp_ent_t *q = g_qhead, *failed = NULL;
    g_qhead = g_qtail = NULL;
    while (q) {
      mp_ent_t *e = q;
      q = q->next;
      e->next = NULL;
      e->c->queued--;
      char msg[512];
      int rc = mp_start_locked(e, msg, sizeof msg);
      if (rc != TC_OK) { /* completed below, without the lock */
        e->frc = rc;
        e->fmsg = strdup(msg);
        e->next = failed;
        failed = e;
        continue;
      }
      e->c->host->work_started(e->work);
      *atail = e;
      atail = &e->next;
    }
    pthread_mutex_unlock(&g_mu);
    while (failed) {
      mp_ent_t *e = failed;
      failed = e->next;
      char *m = e->fmsg;
      e->nreq = 0;
      mp_complete(e, e->frc, m ? m : "mpi: out of memory", 0);
      free(m);
    }
    int progressed = 0;
    double now = mp_now();
    for (mp_ent_t **pp = &active; *pp;) {
      mp_ent_t *e = *pp;
      mp_ent_t *next = e->next;
      if (mp_poll(e, now)) {
        *pp = next;
        progressed = 1;
      } else {
        pp = &e->next;
      }
    }
    atail = &active;
    while (*atail) atail = &(*atail)->next;
    if (progressed) spins = 0;
    else if (active) mp_pause(&spins);
  }
  return NULL;
}

static int mp_engine_up(char *err, size_t errlen) {
  /* g_mu held */
  if (g_thread_up) return TC_OK;
  pthread_t t;
  pthread_attr_t a;
  pthread_attr_init(&a);
  pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
  int e = pthread_create(&t, &a, mp_engine, NULL);
  pthread_attr_destroy(&a);
  if (e)
    return mp_err(err, errlen, TC_ERR_SYSTEM, "could not start the progress thread: %s",
                  strerror(e));
  g_thread_up = 1;
  return TC_OK;
}

/* ------------------------------------------------------------------------ */
/* The backend table                                                         */
/* ------------------------------------------------------------------------ */

static void mp_ent_init(mp_ent_t *e, mp_comm_t *c, const tc_backend_op_t *op,
                        tc_work_t *work) {
  memcpy(&e->op, op, op->size < sizeof e->op ? op->size : sizeof e->op);
  e->op.hints = NULL;
  e->op.num_hints = 0;
  e->c = c;
  e->work = work;
  /* g_mu held: posts are numbered in the order the core issues them */
  if (tc_backend_op_is_collective(op))
    e->tag = MP_TAG_STEPS + (int)(c->colls++ % MP_TAG_SPAN);
}

static int mp_post(void *bc, const tc_backend_op_t *op, tc_work_t *work, char *err,
                   size_t errlen) {
  mp_comm_t *c = bc;
  pthread_mutex_lock(&g_mu);
  if (atomic_load(&c->aborted)) {
    pthread_mutex_unlock(&g_mu);
    return mp_err(err, errlen, TC_ERR_ABORTED, "communicator was aborted");
  }
  if (!(op->flags & TC_BACKEND_OP_ASYNC) && c->queued == 0) {
    /* synchronous on an idle queue: start and poll it here, the entry on
     * this stack (its caller waits for it anyway) */
    mp_ent_t e = {.on_stack = 1};
    mp_ent_init(&e, c, op, work);
    c->inflight++;
    char msg[512];
    int rc = mp_start_locked(&e, msg, sizeof msg);
    pthread_mutex_unlock(&g_mu);
    if (rc != TC_OK) {
      e.nreq = 0;
      mp_complete(&e, rc, msg, 0);
      return TC_OK;
    }
    c->host->work_started(work);
    unsigned spins = 0;
    double now = 0; /* the clock is read every 64 turns from the 64th: the
                     * deadline is late by a few microseconds at most */
    while (!mp_poll(&e, (spins & 63) || !spins ? now : (now = mp_now()))) mp_pause(&spins);
    return TC_OK;
  }
  mp_ent_t *e = calloc(1, sizeof *e);
  int rc = e ? mp_engine_up(err, errlen)
             : mp_err(err, errlen, TC_ERR_NOMEM, "out of memory queueing the operation");
  if (rc != TC_OK) {
    pthread_mutex_unlock(&g_mu);
    free(e);
    return rc;
  }
  mp_ent_init(e, c, op, work);
  c->inflight++;
  c->queued++;
  if (g_qtail) g_qtail->next = e;
  else g_qhead = e;
  g_qtail = e;
  pthread_cond_signal(&g_cv);
  pthread_mutex_unlock(&g_mu);
  return TC_OK;
}

static mp_comm_t *mp_comm_new(const tc_backend_init_args_t *a, MPI_Comm comm) {
  mp_comm_t *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->host = a->host;
  c->comm = comm;
  c->rank = a->rank;
  c->size = a->world_size;
  c->timeout_s = a->timeout_s > 0 ? a->timeout_s : 600;
  snprintf(c->name, sizeof c->name, "%s", a->comm_name ? a->comm_name : "");
  c->scratch = g_small_bytes ? malloc(g_small_bytes) : NULL; /* none: malloc per op */
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  return c;
}

/* Why the join of singletons failed, and what to do. */
static int mp_join_fail(const tc_backend_init_args_t *a, char *err, size_t errlen,
                        const char *call, int code) {
  char t[MPI_MAX_ERROR_STRING + 1];
  mp_mpi_text(code, t, sizeof t);
  /* MPICH's text is a stack, "class, error stack:\nframe: ...\n...": its
   * last non-empty line says why; Open MPI's is one line */
  char *why = t, *end = t + strlen(t);
  while (end > t && (end[-1] == '\n' || end[-1] == ' ')) *--end = 0;
  char *nl = strrchr(t, '\n');
  if (nl) why = nl + 1;
  return mp_err(err, errlen, TC_ERR_NOT_SUPPORTED,
                "the processes were not started by mpirun (MPI sees a world of 1; torchcomms "
                "was given rank %d of %d by the launcher) and this MPI cannot join them "
                "(%s failed: %s). Launch with `mpirun -np %d ...` (or mpiexec/srun), which "
                "gives MPI its ranks", a->rank, a->world_size, call, why, a->world_size);
}

/* Joins MPI singletons (processes launched without mpirun) into one
 * communicator through the store: rank 0 opens a port; the group built so
 * far accepts the next rank, which connects, and the two merge; at the end
 * the communicator is ordered by torchcomms rank. */
static int mp_join(const tc_backend_init_args_t *a, MPI_Comm *out, char *err, size_t errlen) {
  const tc_backend_host_t *h = a->host;
  char port[MPI_MAX_PORT_NAME + 1];
  int code;
  if (a->rank == 0) {
    if ((code = MPI_Open_port(MPI_INFO_NULL, port)) != MPI_SUCCESS)
      return mp_join_fail(a, err, errlen, "MPI_Open_port", code);
    if (h->store_set(a->store, "mpi/port", port, strlen(port)) != TC_OK) {
      MPI_Close_port(port);
      return mp_err(err, errlen, TC_ERR_BACKEND, "could not publish the MPI port in the store");
    }
  } else {
    void *v = NULL;
    size_t len = 0;
    if (h->store_get(a->store, "mpi/port", &v, &len, a->timeout_s) != TC_OK)
      return mp_err(err, errlen, TC_ERR_TIMEOUT,
                    "rank 0 did not publish its MPI port within %.1f s", a->timeout_s);
    snprintf(port, sizeof port, "%.*s", (int)(len < MPI_MAX_PORT_NAME ? len : MPI_MAX_PORT_NAME),
             (const char *)v);
    h->free(v);
  }
  MPI_Comm group = MPI_COMM_NULL;
  int gsize = 1;
  if (a->rank == 0) {
    MPI_Comm_dup(MPI_COMM_SELF, &group);
  } else {
    MPI_Comm inter;
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    if ((code = MPI_Comm_connect(port, MPI_INFO_NULL, 0, MPI_COMM_SELF, &inter)) != MPI_SUCCESS)
      return mp_join_fail(a, err, errlen, "MPI_Comm_connect", code);
    MPI_Intercomm_merge(inter, 1, &group);
    MPI_Comm_free(&inter);
    MPI_Comm_size(group, &gsize);
  }
  MPI_Comm_set_errhandler(group, MPI_ERRORS_RETURN);
  while (gsize < a->world_size) {
    MPI_Comm inter, merged;
    if ((code = MPI_Comm_accept(port, MPI_INFO_NULL, 0, group, &inter)) != MPI_SUCCESS) {
      MPI_Comm_free(&group);
      return mp_join_fail(a, err, errlen, "MPI_Comm_accept", code);
    }
    MPI_Intercomm_merge(inter, 0, &merged);
    MPI_Comm_free(&inter);
    MPI_Comm_free(&group);
    group = merged;
    MPI_Comm_size(group, &gsize);
  }
  if (a->rank == 0) MPI_Close_port(port);
  MPI_Comm ordered;
  code = MPI_Comm_split(group, 0, a->rank, &ordered);
  MPI_Comm_free(&group);
  if (code != MPI_SUCCESS) return mp_mpi_fail(err, errlen, "MPI_Comm_split", code);
  *out = ordered;
  return TC_OK;
}

/* init's MPI part (g_mpi held). */
static int mp_init_locked(const tc_backend_init_args_t *a, void **out, char *err,
                          size_t errlen) {
  int rc, wr = 0, ws = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  MPI_Comm_size(MPI_COMM_WORLD, &ws);
  MPI_Comm comm = MPI_COMM_NULL;
  int code;
  if (ws == a->world_size && wr == a->rank) {
    if ((code = MPI_Comm_dup(MPI_COMM_WORLD, &comm)) != MPI_SUCCESS)
      return mp_mpi_fail(err, errlen, "MPI_Comm_dup", code);
  } else if (ws == 1 && a->world_size > 1) {
    rc = mp_join(a, &comm, err, errlen);
    if (rc != TC_OK) return rc;
  } else {
    return mp_err(err, errlen, TC_ERR_INVALID_ARGUMENT,
                  "MPI says this process is rank %d of %d, but torchcomms was given rank "
                  "%d of %d (from the options or RANK/WORLD_SIZE): under mpirun leave rank "
                  "and world size to MPI", wr, ws, a->rank, a->world_size);
  }
  mp_comm_t *c = mp_comm_new(a, comm);
  if (!c) {
    MPI_Comm_free(&comm);
    return mp_err(err, errlen, TC_ERR_NOMEM, "out of memory");
  }
  *out = c;
  return TC_OK;
}

static int mp_init(const tc_backend_init_args_t *a, void **out, char *err, size_t errlen) {
  if (a->device && strcmp(a->device, "cpu") != 0)
    return mp_err(err, errlen, TC_ERR_NOT_SUPPORTED,
                  "device '%s': the mpi backend moves host memory only; use device "
                  "'cpu' (or backend 'nccl' for CUDA tensors)", a->device);
  int rc = mp_mpi_up(err, errlen);
  if (rc != TC_OK) return rc;
  MPI_LOCK();
  rc = mp_init_locked(a, out, err, errlen);
  MPI_UNLOCK();
  return rc;
}

/* split's MPI part (g_mpi held). */
static int mp_split_locked(void *parent, const int *ranks, size_t nranks,
                           const tc_backend_init_args_t *child_args, void **child, char *err,
                           size_t errlen) {
  mp_comm_t *p = parent;
  *child = NULL;
  int color = MPI_UNDEFINED, key = 0;
  if (nranks) {
    color = ranks[0];
    for (size_t i = 0; i < nranks; i++)
      if (ranks[i] == p->rank) key = (int)i;
  }
  MPI_Comm nc = MPI_COMM_NULL;
  int code = MPI_Comm_split(p->comm, color, key, &nc);
  if (code != MPI_SUCCESS) return mp_mpi_fail(err, errlen, "MPI_Comm_split", code);
  if (!nranks) {
    if (nc != MPI_COMM_NULL) MPI_Comm_free(&nc);
    return TC_OK;
  }
  int r = -1, s = 0;
  MPI_Comm_rank(nc, &r);
  MPI_Comm_size(nc, &s);
  if (r != child_args->rank || s != child_args->world_size) {
    MPI_Comm_free(&nc);
    return mp_err(err, errlen, TC_ERR_INTERNAL,
                  "MPI_Comm_split made rank %d of %d where rank %d of %d was expected", r, s,
                  child_args->rank, child_args->world_size);
  }
  mp_comm_t *c = mp_comm_new(child_args, nc);
  if (!c) {
    MPI_Comm_free(&nc);
    return mp_err(err, errlen, TC_ERR_NOMEM, "out of memory");
  }
  *child = c;
  return TC_OK;
}

static int mp_split(void *parent, const int *ranks, size_t nranks,
                    const tc_backend_init_args_t *child_args, void **child, char *err,
                    size_t errlen) {
  MPI_LOCK();
  int rc = mp_split_locked(parent, ranks, nranks, child_args, child, err, errlen);
  MPI_UNLOCK();
  return rc;
}

/* Waits until c has nothing in flight, at most until `until`: 0, or -1. */
static int mp_drain(mp_comm_t *c, double until) {
  pthread_mutex_lock(&g_mu);
  while (c->inflight > 0) {
    double now = mp_now();
    if (now >= until) break;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double t = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + (until - now < 0.05 ? until - now : 0.05);
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    pthread_cond_timedwait(&g_done_cv, &g_mu, &ts);
  }
  int left = c->inflight;
  pthread_mutex_unlock(&g_mu);
  return left ? -1 : 0;
}

static int mp_finalize(void *bc, char *err, size_t errlen) {
  mp_comm_t *c = bc;
  if (mp_drain(c, mp_now() + c->timeout_s))
    return mp_err(err, errlen, TC_ERR_TIMEOUT,
                  "operations were still running %.1f s into finalize", c->timeout_s);
  pthread_mutex_lock(&g_mu);
  int free_it = !c->poisoned && c->comm != MPI_COMM_NULL;
  pthread_mutex_unlock(&g_mu);
  MPI_LOCK();
  if (free_it) MPI_Comm_free(&c->comm);
  MPI_UNLOCK();
  c->comm = MPI_COMM_NULL;
  return TC_OK;
}

static int mp_abort(void *bc) {
  mp_comm_t *c = bc;
  atomic_store(&c->aborted, 1);
  pthread_mutex_lock(&g_mu);
  pthread_cond_broadcast(&g_cv);
  pthread_mutex_unlock(&g_mu);
  return TC_OK;
}

static void mp_destroy(void *bc) {
  mp_comm_t *c = bc;
  if (!c) return;
  if (mp_drain(c, mp_now() + 30) == 0) {
    pthread_mutex_lock(&g_mu);
    int poisoned = c->poisoned;
    int free_it = !poisoned && c->comm != MPI_COMM_NULL && g_up;
    pthread_mutex_unlock(&g_mu);
    MPI_LOCK();
    if (free_it) MPI_Comm_free(&c->comm);
    MPI_UNLOCK();
    if (!poisoned) free(c->scratch); /* else a given-up operation may still own it */
    free(c);
  } /* else: the engine still holds operations of c; leave it */
}

static void mp_describe(void *bc, char *buf, size_t len) {
  mp_comm_t *c = bc;
  snprintf(buf, len,
           "library: %s\n"
           "thread level: %s (the backend's MPI calls serialised)\n"
           "communicator: rank %d of %d\n"
           "synchronous operations on an idle communicator: polled on the caller's thread",
           g_lib, g_level >= MPI_THREAD_MULTIPLE ? "MPI_THREAD_MULTIPLE" : "MPI_THREAD_SERIALIZED",
           c->rank, c->size);
}

/* The core ends the process (abort_process_on_timeout_or_error): end the
 * job through MPI, so that mpirun stops every rank at once and says why;
 * the only MPI_Abort of the backend. */
static void mp_abort_process(void *bc, int status, const char *reason) {
  (void)status;
  (void)reason; /* printed by the core */
  mp_comm_t *c = bc;
  fprintf(stderr, "torchcomms: mpi: rank %d of '%s' ends the MPI job with MPI_Abort\n", c->rank,
          c->name);
  fflush(stderr);
  /* the launcher forwards this process's output through a pipe and stops
   * reading when the job is aborted: give it a moment to pass on the
   * failure's lines (MPICH's hydra lost them otherwise, 1 run in ~10) */
  struct timespec pause = {0, 300 * 1000 * 1000};
  nanosleep(&pause, NULL);
  /* no lock: another thread of the backend may be inside MPI, stuck */
  MPI_Abort(MPI_COMM_WORLD, 134); /* the job: a sub-communicator may end only its ranks */
}

TC_API const tc_backend_ops_t tc_backend_table = {
    .abi_version = TC_BACKEND_ABI_VERSION,
    .size = sizeof(tc_backend_ops_t),
    .name = "mpi",
    .version = MP_VERSION,
    .init = mp_init,
    .finalize = mp_finalize,
    .abort = mp_abort,
    .destroy = mp_destroy,
    .post = mp_post,
    .supports = NULL,
    .split = mp_split,
    .describe = mp_describe,
    .caps = TC_BACKEND_CAP_BOOTSTRAP,
    .abort_process = mp_abort_process,
};

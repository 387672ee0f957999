/* cpu.h -- internals of the native `cpu` backend: the per-communicator state
 * (progress thread, op queue, scratch, transport) and the algorithms. */
#ifndef TC_BACKENDS_CPU_H
#define TC_BACKENDS_CPU_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "core/internal.h"
#include "transport/tcp.h"

/* The table the core registers as the built-in "cpu" backend. */
TC_INTERNAL extern const tc_backend_ops_t tc__cpu_backend;

/* Algorithm thresholds (bytes). */
#define CPU_SMALL_BYTES (64u * 1024u)        /* tree/doubling below, ring above */
#define CPU_BCAST_SEG (512u * 1024u)         /* pipelined chain broadcast */
#define CPU_REDUCE_SEG (1024u * 1024u)       /* ring and tree reduction segments */
#define CPU_DIRECT_GATHER_BYTES (64u * 1024u) /* all_gather: one round below */
#define CPU_DIRECT_A2A_BYTES (1024u * 1024u)  /* all_to_all: one round below */
#define CPU_SCRATCH_KEEP (64u * 1024u * 1024u) /* larger scratch is freed after the op */

typedef struct cpu_qent {
  const tc_backend_op_t *op;
  tc_work_t *work;
} cpu_qent_t;

typedef struct cpu_comm {
  const tc_backend_host_t *host;
  char name[128];
  int rank, size;
  double timeout_s; /* bootstrap / finalize deadline */

  const tc_transport_ops_t *tp_ops; /* NULL for world size 1 */
  void *tp;
  int wake_fd;       /* eventfd, written once on abort, never drained */
  atomic_int aborted;

  /* op queue: a ring of entries, grown on demand (never shrinks) */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  cpu_qent_t *q;
  size_t qcap, qhead, qlen;
  int draining;  /* finalize: run what is queued, then exit */
  int accepting; /* 0 once finalize or abort began: posts are refused */

  pthread_t thread;
  int thread_started, thread_joined;
  pthread_mutex_t life_mu; /* serializes finalize / abort / destroy */
  int closed;              /* transport closed */

  /* set by the progress thread after the first failed op */
  int broken_rc;
  char broken_msg[768];

  /* scratch, grown on demand, reused (progress thread only) */
  void *scratch;
  size_t scratch_cap;
  tc_xfer_t *xf;
  size_t xf_cap;
} cpu_comm_t;

/* The context of one running operation. */
typedef struct cpu_ctx {
  cpu_comm_t *c;
  const tc_backend_op_t *op;
  const char *opname;
  int rank, size;
  size_t es; /* element size of op->dtype */
  double deadline, timeout_s;
  char msg[1024]; /* the error text when the op fails */
} cpu_ctx_t;

/* The name of an operation in messages ("all_reduce"). */
TC_INTERNAL const char *tc__cpu_opname(tc_op_type_t type);
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

/* The reduction the kernels apply (AVG and PREMUL_SUM reduce as SUM). */
static inline tc_redop_type_t cpu_kop(const tc_backend_op_t *op) {
  tc_redop_type_t t = op->redop.type;
  return (t == TC_AVG || t == TC_PREMUL_SUM) ? TC_SUM : t;
}

/* algos.c: reductions and broadcast */
TC_INTERNAL int tc__cpu_all_reduce(cpu_ctx_t *ctx);
TC_INTERNAL int tc__cpu_reduce(cpu_ctx_t *ctx);
TC_INTERNAL int tc__cpu_broadcast(cpu_ctx_t *ctx);
TC_INTERNAL int tc__cpu_reduce_scatter(cpu_ctx_t *ctx);
/* algos2.c: data movement */
TC_INTERNAL int tc__cpu_p2p(cpu_ctx_t *ctx);
TC_INTERNAL int tc__cpu_batch(cpu_ctx_t *ctx);
TC_INTERNAL int tc__cpu_all_gather(cpu_ctx_t *ctx);
TC_INTERNAL int tc__cpu_all_to_all(cpu_ctx_t *ctx);
TC_INTERNAL int tc__cpu_barrier(cpu_ctx_t *ctx);
TC_INTERNAL int tc__cpu_scatter(cpu_ctx_t *ctx);
TC_INTERNAL int tc__cpu_gather(cpu_ctx_t *ctx);

#endif /* TC_BACKENDS_CPU_H */

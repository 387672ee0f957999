/* fake_nccl_ops.c -- the fake NCCL's collectives, sends, receives and
 * groups: each call (or each ncclGroupStart/End group) becomes one task on
 * the caller's stream of the fake CUDA runtime, run with the communicator's
 * cpu communicator. See fake_nccl.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fake_nccl.h"

enum { FK_ALLREDUCE, FK_BCAST, FK_REDUCE, FK_ALLGATHER, FK_REDSCAT, FK_SEND,
       FK_RECV };

typedef struct fk_op {
  int kind;
  const void *sb;
  void *rb;
  size_t count;
  tc_dtype_t dt;
  tc_redop_t op;
  int peer; /* root for collectives */
} fk_op_t;

typedef struct fk_group {
  struct ncclComm *c;
  cudaStream_t s;
  size_t n, cap;
  fk_op_t *ops;
} fk_group_t;

/* The calling thread's open group. */
static __thread int fk_depth;
static __thread fk_group_t *fk_open;
static __thread ncclResult_t fk_group_err;

static int fk_dtype(ncclDataType_t d, tc_dtype_t *out) {
  switch (d) {
  case ncclInt8: *out = TC_INT8; return 1;
  case ncclUint8: *out = TC_UINT8; return 1;
  case ncclInt32: *out = TC_INT32; return 1;
  case ncclInt64: *out = TC_INT64; return 1;
  case ncclFloat16: *out = TC_FLOAT16; return 1;
  case ncclFloat32: *out = TC_FLOAT32; return 1;
  case ncclFloat64: *out = TC_FLOAT64; return 1;
  case ncclBfloat16: *out = TC_BFLOAT16; return 1;
  case ncclFloat8e4m3: /* NCCL >= 2.24 */
    *out = TC_FLOAT8_E4M3FN;
    return fk_version() >= 22400;
  case ncclFloat8e5m2:
    *out = TC_FLOAT8_E5M2;
    return fk_version() >= 22400;
  default: return 0; /* unsigned 32/64-bit: no tc dtype */
  }
}

static int fk_redop(struct ncclComm *c, ncclRedOp_t op, tc_redop_t *out) {
  switch (op) {
  case ncclSum: *out = TC_OP(TC_SUM); return 1;
  case ncclProd: *out = TC_OP(TC_PRODUCT); return 1;
  case ncclMax: *out = TC_OP(TC_MAX); return 1;
  case ncclMin: *out = TC_OP(TC_MIN); return 1;
  case ncclAvg: *out = TC_OP(TC_AVG); return 1;
  default: break;
  }
  int i = (int)op - ncclNumOps;
  if (i < 0 || i >= FK_MAX_PREMUL) return 0;
  pthread_mutex_lock(&c->mu);
  int ok = c->premul_used[i];
  double f = c->premul[i];
  pthread_mutex_unlock(&c->mu);
  if (ok) *out = TC_OP_PREMUL_SUM(f); /* captured now, as NCCL does */
  return ok;
}

static void fk_hang(struct ncclComm *c) {
  struct timespec ts = {0, 1000 * 1000};
  while (!atomic_load(&c->aborted)) nanosleep(&ts, NULL);
}

/* Runs ops[i..j) (sends and receives) as one batch. */
static int fk_batch(struct ncclComm *c, const fk_op_t *ops, size_t n) {
  tc_batch_t *b = NULL;
  int rc = tc_batch_create(c->cpu, &b);
  for (size_t i = 0; i < n && rc == TC_OK; i++)
    rc = ops[i].kind == FK_SEND
             ? tc_batch_send(b, ops[i].sb, ops[i].count, ops[i].dt, ops[i].peer)
             : tc_batch_recv(b, ops[i].rb, ops[i].count, ops[i].dt, ops[i].peer);
  if (rc == TC_OK) rc = tc_batch_issue(b, NULL, NULL);
  if (b) tc_batch_free(b);
  return rc;
}

static int fk_collective(struct ncclComm *c, const fk_op_t *o) {
  size_t bytes = o->count * tc_dtype_size(o->dt);
  int me = c->rank;
  switch (o->kind) {
  case FK_ALLREDUCE:
    if (o->sb != o->rb && bytes) memcpy(o->rb, o->sb, bytes);
    return tc_all_reduce(c->cpu, o->rb, o->count, o->dt, o->op, NULL, NULL);
  case FK_BCAST:
    if (me == o->peer && o->sb != o->rb && bytes) memcpy(o->rb, o->sb, bytes);
    return tc_broadcast(c->cpu, o->rb, o->count, o->dt, o->peer, NULL, NULL);
  case FK_REDUCE:
    if (me != o->peer) /* the input is left unchanged */
      return tc_reduce(c->cpu, (void *)(uintptr_t)o->sb, o->count, o->dt,
                       o->op, o->peer, NULL, NULL);
    if (o->sb != o->rb && bytes) memcpy(o->rb, o->sb, bytes);
    return tc_reduce(c->cpu, o->rb, o->count, o->dt, o->op, o->peer, NULL,
                     NULL);
  case FK_ALLGATHER:
    return tc_all_gather_single(c->cpu, o->rb, o->sb, o->count, o->dt, NULL,
                                NULL);
  case FK_REDSCAT:
    return tc_reduce_scatter_single(c->cpu, o->rb, o->sb, o->count, o->dt,
                                    o->op, NULL, NULL);
  }
  return TC_ERR_INTERNAL;
}

/* The task: one group on the stream's thread. */
static void fk_run(void *arg) {
  fk_group_t *g = arg;
  struct ncclComm *c = g->c;
  int task = atomic_fetch_add(&c->tasks, 1) + 1;
  if (atomic_load(&c->aborted)) goto out;
  if (c->fault_kind && task == c->fault_at) {
    if (c->fault_kind == 2) {
      snprintf(c->last_error, sizeof c->last_error,
               "fake NCCL: injected remote error in task %d", task);
      atomic_store(&c->state, ncclRemoteError);
    }
    fk_hang(c);
    goto out;
  }
  for (size_t i = 0; i < g->n;) {
    int rc;
    size_t j = i;
    if (g->ops[i].kind == FK_SEND || g->ops[i].kind == FK_RECV) {
      while (j < g->n && (g->ops[j].kind == FK_SEND || g->ops[j].kind == FK_RECV))
        j++;
      rc = fk_batch(c, g->ops + i, j - i);
    } else {
      rc = fk_collective(c, &g->ops[i]);
      j = i + 1;
    }
    if (rc != TC_OK) {
      if (atomic_load(&c->aborted)) goto out;
      fk_err(c, "a collective failed", rc);
      atomic_store(&c->state, rc == TC_ERR_REMOTE ? ncclRemoteError
                                                  : ncclSystemError);
      fk_hang(c); /* like a kernel stuck after a peer failed */
      goto out;
    }
    i = j;
  }
out:
  pthread_mutex_lock(&c->mu);
  c->inflight--;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  free(g->ops);
  free(g);
}

static ncclResult_t fk_submit(fk_group_t *g) {
  struct ncclComm *c = g->c;
  pthread_mutex_lock(&c->mu);
  c->inflight++;
  pthread_mutex_unlock(&c->mu);
  if (tcfake_stream_enqueue(g->s, fk_run, g) != cudaSuccess) {
    pthread_mutex_lock(&c->mu);
    c->inflight--;
    pthread_mutex_unlock(&c->mu);
    free(g->ops);
    free(g);
    return ncclUnhandledCudaError;
  }
  if (c->inprogress_knob && !c->blocking) {
    atomic_store(&c->busy_polls, 2);
    return ncclInProgress;
  }
  return ncclSuccess;
}

static fk_group_t *fk_group_new(struct ncclComm *c, cudaStream_t s) {
  fk_group_t *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->c = c;
  g->s = s;
  return g;
}

static int fk_group_add(fk_group_t *g, const fk_op_t *op) {
  if (g->n == g->cap) {
    size_t cap = g->cap ? 2 * g->cap : 8;
    fk_op_t *o = realloc(g->ops, cap * sizeof *o);
    if (!o) return 0;
    g->ops = o;
    g->cap = cap;
  }
  g->ops[g->n++] = *op;
  return 1;
}

/* Which buffers NCCL reads on this rank: a broadcast's send buffer only at
 * the root, a reduce's receive buffer only at the root. */
static int fk_needs_send(const fk_op_t *o, int me) {
  return o->kind != FK_RECV && (o->kind != FK_BCAST || me == o->peer);
}
static int fk_needs_recv(const fk_op_t *o, int me) {
  return o->kind != FK_SEND && (o->kind != FK_REDUCE || me == o->peer);
}

/* Validates and queues one call (alone, or in the open group). */
static ncclResult_t fk_add(struct ncclComm *c, cudaStream_t s, fk_op_t *op,
                           ncclDataType_t ndt, ncclRedOp_t nop, int reducing) {
  ncclResult_t bad = ncclSuccess;
  if (!c) return ncclInvalidArgument;
  if (!c->cpu || atomic_load(&c->state) == ncclInProgress) bad = ncclInvalidUsage;
  else if (atomic_load(&c->aborted)) bad = ncclInvalidUsage;
  else if (!fk_dtype(ndt, &op->dt)) bad = ncclInvalidArgument;
  else if (reducing && !fk_redop(c, nop, &op->op)) bad = ncclInvalidArgument;
  /* NCCL's ncclAvg has no float8 case (seen on an H200, nvidia-nccl-cu13) */
  else if (reducing && nop == ncclAvg && (ndt == ncclFloat8e4m3 || ndt == ncclFloat8e5m2))
    bad = ncclInvalidArgument;
  else if (op->peer < 0 || op->peer >= c->size) bad = ncclInvalidArgument;
  else if (op->count > 0 && ((fk_needs_send(op, c->rank) && !op->sb) ||
                             (fk_needs_recv(op, c->rank) && !op->rb)))
    bad = ncclInvalidArgument;
  if (bad != ncclSuccess) {
    snprintf(c->last_error, sizeof c->last_error,
             "fake NCCL: invalid call (dtype %d, op %d, peer/root %d of %d, "
             "count %zu)", (int)ndt, (int)nop, op->peer, c->size, op->count);
    if (fk_depth > 0) fk_group_err = bad;
    return bad;
  }
  if (fk_depth > 0) {
    if (!fk_open) fk_open = fk_group_new(c, s);
    if (!fk_open) return ncclSystemError;
    if (fk_open->c != c || fk_open->s != s) { /* not needed by the backend */
      fk_group_err = ncclInvalidUsage;
      return ncclInvalidUsage;
    }
    return fk_group_add(fk_open, op) ? ncclSuccess : ncclSystemError;
  }
  fk_group_t *g = fk_group_new(c, s);
  if (!g || !fk_group_add(g, op)) {
    if (g) free(g->ops);
    free(g);
    return ncclSystemError;
  }
  return fk_submit(g);
}

FK_API ncclResult_t ncclGroupStart(void) {
  if (fk_depth++ == 0) fk_group_err = ncclSuccess;
  return ncclSuccess;
}

FK_API ncclResult_t ncclGroupEnd(void) {
  if (fk_depth <= 0) return ncclInvalidUsage;
  if (--fk_depth > 0) return ncclSuccess;
  fk_group_t *g = fk_open;
  fk_open = NULL;
  if (fk_group_err != ncclSuccess || !g) {
    if (g) free(g->ops);
    free(g);
    return fk_group_err;
  }
  return fk_submit(g);
}

FK_API ncclResult_t ncclAllReduce(const void *sb, void *rb, size_t count,
                                  ncclDataType_t dt, ncclRedOp_t op,
                                  ncclComm_t c, cudaStream_t s) {
  fk_op_t o = {.kind = FK_ALLREDUCE, .sb = sb, .rb = rb, .count = count};
  return fk_add(c, s, &o, dt, op, 1);
}

FK_API ncclResult_t ncclBroadcast(const void *sb, void *rb, size_t count,
                                  ncclDataType_t dt, int root, ncclComm_t c,
                                  cudaStream_t s) {
  fk_op_t o = {.kind = FK_BCAST, .sb = sb, .rb = rb, .count = count,
               .peer = root};
  return fk_add(c, s, &o, dt, ncclSum, 0);
}

FK_API ncclResult_t ncclReduce(const void *sb, void *rb, size_t count,
                               ncclDataType_t dt, ncclRedOp_t op, int root,
                               ncclComm_t c, cudaStream_t s) {
  fk_op_t o = {.kind = FK_REDUCE, .sb = sb, .rb = rb, .count = count,
               .peer = root};
  return fk_add(c, s, &o, dt, op, 1);
}

FK_API ncclResult_t ncclAllGather(const void *sb, void *rb, size_t count,
                                  ncclDataType_t dt, ncclComm_t c,
                                  cudaStream_t s) {
  fk_op_t o = {.kind = FK_ALLGATHER, .sb = sb, .rb = rb, .count = count};
  return fk_add(c, s, &o, dt, ncclSum, 0);
}

FK_API ncclResult_t ncclReduceScatter(const void *sb, void *rb, size_t count,
                                      ncclDataType_t dt, ncclRedOp_t op,
                                      ncclComm_t c, cudaStream_t s) {
  fk_op_t o = {.kind = FK_REDSCAT, .sb = sb, .rb = rb, .count = count};
  return fk_add(c, s, &o, dt, op, 1);
}

FK_API ncclResult_t ncclSend(const void *sb, size_t count, ncclDataType_t dt,
                             int peer, ncclComm_t c, cudaStream_t s) {
  fk_op_t o = {.kind = FK_SEND, .sb = sb, .count = count, .peer = peer};
  return fk_add(c, s, &o, dt, ncclSum, 0);
}

FK_API ncclResult_t ncclRecv(void *rb, size_t count, ncclDataType_t dt,
                             int peer, ncclComm_t c, cudaStream_t s) {
  fk_op_t o = {.kind = FK_RECV, .rb = rb, .count = count, .peer = peer};
  return fk_add(c, s, &o, dt, ncclSum, 0);
}

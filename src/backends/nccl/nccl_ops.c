/* nccl_ops.c -- every operation of the backend table mapped to NCCL calls
 * on the communicator's internal stream, ordered after the caller's stream,
 * and the exported table tc_backend_table.
 *
 * Mapping:
 * Mapping, by the descriptor's kind (whatever form the user called):
 *   all_reduce, broadcast, reduce     ncclAllReduce / ncclBroadcast /
 *                                     ncclReduce, in place
 *   all_gather                        ncclAllGather when the blocks are one
 *                                     count, back to back (TC_OPF_UNIFORM |
 *                                     TC_OPF_RECV_CONTIG); else one
 *                                     ncclBroadcast per rank, grouped
 *   reduce_scatter                    ncclReduceScatter likewise (SEND_CONTIG);
 *                                     else one ncclReduce per rank, grouped
 *   all_to_all                        ncclSend + ncclRecv per peer, grouped
 *   scatter, gather                   ncclSend / ncclRecv, grouped
 *   send, recv, batch                 ncclSend / ncclRecv (batch grouped)
 *   barrier                           ncclAllReduce (MAX) of one byte of an
 *                                     internal device buffer
 * Data movement runs on bytes (ncclInt8), so every dtype moves. Reductions:
 * float32, float64, float16, bfloat16 (NCCL >= 2.10), float8_e4m3fn and
 * float8_e5m2 (ncclFloat8e4m3 / ncclFloat8e5m2, NCCL >= 2.24), int8, uint8,
 * int32, int64, and bool as uint8 (SUM, MAX, BOR -> ncclMax; PRODUCT, MIN,
 * BAND -> ncclMin); AVG is ncclAvg; PREMUL_SUM is
 * ncclRedOpCreatePreMulSum with the factor in the dtype (host immediate),
 * destroyed once enqueued. NCCL has no int16
 * reductions, no bitwise ones, and no AVG on float8 (nor PREMUL_SUM there,
 * as in torchcomms' NCCL backend): those are refused with
 * TC_ERR_NOT_SUPPORTED before anything is enqueued.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_backend.h"

const char *tcn_op_name(tc_op_type_t t) { return tc_backend_op_name(t); }


/* ---- reductions ---- */

/* float -> IEEE half / bfloat16, round to nearest even (for the
 * PREMUL_SUM scalar, which NCCL reads in the operation's dtype). */
static uint16_t tcn_f2h(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  uint32_t sign = (x >> 16) & 0x8000u, mant = x & 0x7fffffu;
  int exp = (int)((x >> 23) & 0xff);
  if (exp == 0xff) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
  int e = exp - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return (uint16_t)sign;
    mant |= 0x800000u;
    int shift = 14 - e;
    uint32_t h = mant >> shift, rem = mant & ((1u << shift) - 1),
             half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((uint32_t)e << 10) | (mant >> 13), rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
  return (uint16_t)(sign | h);
}

static uint16_t tcn_f2bf(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

typedef struct tcn_red {
  ncclDataType_t dt;
  ncclRedOp_t op;
  int premul;       /* op must be created (and destroyed) per call */
  double scalar[1]; /* the PREMUL_SUM factor in the dtype, 8 bytes */
} tcn_red_t;

/* The NCCL dtype and reduction of op; TC_ERR_NOT_SUPPORTED with a message
 * for what NCCL cannot do. */
static int tcn_map_red(tcn_comm_t *c, const tc_backend_op_t *op, tcn_red_t *m,
                       char *msg, size_t msglen) {
  const tcn_api_t *a = c->api;
  const char *opn = tcn_op_name(op->type);
  tc_redop_type_t rt = op->redop.type;
  int is_bool = op->dtype == TC_BOOL;
  switch (op->dtype) {
  case TC_FLOAT32: m->dt = ncclFloat32; break;
  case TC_FLOAT64: m->dt = ncclFloat64; break;
  case TC_FLOAT16: m->dt = ncclFloat16; break;
  case TC_BFLOAT16:
    if (a->nccl_version < TCN_NCCL_VERSION(2, 10, 0)) goto no_dtype;
    m->dt = ncclBfloat16;
    break;
  case TC_INT8: m->dt = ncclInt8; break;
  case TC_UINT8: m->dt = ncclUint8; break;
  case TC_INT32: m->dt = ncclInt32; break;
  case TC_INT64: m->dt = ncclInt64; break;
  case TC_BOOL: m->dt = ncclUint8; break;
  case TC_FLOAT8_E4M3FN:
  case TC_FLOAT8_E5M2:
    if (a->nccl_version < TCN_NCCL_VERSION(2, 24, 0)) {
      int e4 = op->dtype == TC_FLOAT8_E4M3FN;
      tcn_msg(c, opn, msg, msglen, "NCCL cannot reduce dtype %s: %s needs "
              "NCCL >= 2.24 (this is NCCL %d); convert to bfloat16 first",
              e4 ? "float8_e4m3fn" : "float8_e5m2",
              e4 ? "ncclFloat8e4m3" : "ncclFloat8e5m2", a->nccl_version);
      return TC_ERR_NOT_SUPPORTED;
    }
    m->dt = op->dtype == TC_FLOAT8_E4M3FN ? ncclFloat8e4m3 : ncclFloat8e5m2;
    break;
  default: goto no_dtype;
  }
  m->premul = 0;
  /* the float8 dtype's name; NULL for every other dtype */
  const char *f8 = op->dtype == TC_FLOAT8_E4M3FN ? "float8_e4m3fn"
                   : op->dtype == TC_FLOAT8_E5M2  ? "float8_e5m2"
                                                  : NULL;
  switch (rt) {
  case TC_SUM: m->op = is_bool ? ncclMax : ncclSum; return TC_OK;
  case TC_PRODUCT: m->op = is_bool ? ncclMin : ncclProd; return TC_OK;
  case TC_MIN: m->op = ncclMin; return TC_OK;
  case TC_MAX: m->op = ncclMax; return TC_OK;
  case TC_AVG:
    if (f8) {
      /* ncclAvg has no float8 case: ncclInvalidArgument (seen on an H200
       * with nvidia-nccl-cu13, the NCCL of torch 2.11+cu130) */
      tcn_msg(c, opn, msg, msglen, "NCCL has no AVG on %s (ncclAvg takes integers, "
              "float16, bfloat16, float32 and float64): reduce with SUM and divide, or "
              "convert to bfloat16 first",
              f8);
      return TC_ERR_NOT_SUPPORTED;
    }
    if (a->nccl_version < TCN_NCCL_VERSION(2, 10, 0)) {
      tcn_msg(c, opn, msg, msglen, "AVG needs ncclAvg (NCCL >= 2.10; this "
              "is NCCL %d): reduce with SUM and divide", a->nccl_version);
      return TC_ERR_NOT_SUPPORTED;
    }
    m->op = ncclAvg;
    return TC_OK;
  case TC_BAND:
  case TC_BOR:
    if (!is_bool) break;
    m->op = rt == TC_BAND ? ncclMin : ncclMax;
    return TC_OK;
  case TC_PREMUL_SUM: {
    if (f8) {
      /* as torchcomms' NCCL backend: "PreMulSum Data type must be half,
       * float, bfloat16 or double" */
      tcn_msg(c, opn, msg, msglen, "NCCL's PREMUL_SUM takes float16, bfloat16, float32 "
              "and float64, not %s: convert to bfloat16 first",
              f8);
      return TC_ERR_NOT_SUPPORTED;
    }
    if (!a->nccl.RedOpCreatePreMulSum) {
      tcn_msg(c, opn, msg, msglen, "PREMUL_SUM needs "
              "ncclRedOpCreatePreMulSum (NCCL >= 2.11; this is NCCL %d)",
              a->nccl_version);
      return TC_ERR_NOT_SUPPORTED;
    }
    double f = op->redop.factor;
    memset(m->scalar, 0, sizeof m->scalar);
    switch (op->dtype) {
    case TC_FLOAT32: { float v = (float)f; memcpy(m->scalar, &v, sizeof v); break; }
    case TC_FLOAT64: memcpy(m->scalar, &f, sizeof f); break;
    case TC_FLOAT16: { uint16_t v = tcn_f2h((float)f); memcpy(m->scalar, &v, 2); break; }
    case TC_BFLOAT16: { uint16_t v = tcn_f2bf((float)f); memcpy(m->scalar, &v, 2); break; }
    default: break; /* the core allows PREMUL_SUM on floats only */
    }
    m->premul = 1;
    return TC_OK;
  }
  default: break;
  }
  static const char *const rnames[] = {"SUM", "PRODUCT", "MIN", "MAX", "BAND",
                                       "BOR", "BXOR", "AVG", "PREMUL_SUM"};
  const char *rn = (unsigned)rt < sizeof rnames / sizeof rnames[0]
                       ? rnames[rt] : "?";
  if (is_bool)
    tcn_msg(c, opn, msg, msglen, "NCCL has no %s reduction on bool", rn);
  else
    tcn_msg(c, opn, msg, msglen, "NCCL has no bitwise reductions (%s): use "
            "the cpu backend for them", rn);
  return TC_ERR_NOT_SUPPORTED;
no_dtype:
  tcn_msg(c, opn, msg, msglen, "NCCL cannot reduce dtype %s (%s): convert "
          "to %s first", op->dtype == TC_INT16 ? "int16" : "bfloat16",
          op->dtype == TC_INT16 ? "it has no NCCL type"
                                : "NCCL older than 2.10",
          op->dtype == TC_INT16 ? "int32" : "float32");
  return TC_ERR_NOT_SUPPORTED;
}

/* ---- enqueue ---- */

typedef struct tcn_enq {
  const tcn_api_t *a;
  ncclComm_t nc;
  cudaStream_t s;
  ncclResult_t first; /* first failure */
  const char *what;   /* the call that failed */
} tcn_enq_t;

/* Records the first failing call (ncclInProgress is not a failure). */
static void tcn_note(tcn_enq_t *q, ncclResult_t r, const char *what) {
  if (r != ncclSuccess && r != ncclInProgress && q->first == ncclSuccess) {
    q->first = r;
    q->what = what;
  } else if (r == ncclInProgress && q->first == ncclSuccess) {
    q->first = ncclInProgress; /* remembered for the wait; may be replaced */
    q->what = what;
  }
}

#define SEND(buf, bytes, peer)                                                 \
  tcn_note(&q, q.a->nccl.Send((buf), (bytes), ncclInt8, (peer), q.nc, q.s),    \
           "ncclSend")
#define RECV(buf, bytes, peer)                                                 \
  tcn_note(&q, q.a->nccl.Recv((buf), (bytes), ncclInt8, (peer), q.nc, q.s),    \
           "ncclRecv")
#define GROUP_START() tcn_note(&q, q.a->nccl.GroupStart(), "ncclGroupStart")
#define GROUP_END() tcn_note(&q, q.a->nccl.GroupEnd(), "ncclGroupEnd")

/* Enqueues op's NCCL calls; returns the first failure (or ncclInProgress /
 * ncclSuccess) and the call in *what. */
static ncclResult_t tcn_enqueue(tcn_comm_t *c, const tc_backend_op_t *op,
                                const tcn_red_t *m, const char **what) {
  tcn_enq_t q = {.a = c->api, .nc = c->nccl, .s = c->stream,
                 .first = ncclSuccess, .what = ""};
  const size_t es = tcn_dtype_size(op->dtype), cnt = op->count;
  const size_t bytes = cnt * es;
  const int n = c->size, me = c->rank;
  char *sb = (char *)(uintptr_t)op->sendbuf;
  char *rb = op->recvbuf;
  const uint32_t ag_one = TC_OPF_UNIFORM | TC_OPF_RECV_CONTIG;
  const uint32_t rs_one = TC_OPF_UNIFORM | TC_OPF_SEND_CONTIG;
  switch (op->kind) {
  case TC_KIND_SEND: SEND(sb, bytes, op->root); break;
  case TC_KIND_RECV: RECV(rb, bytes, op->root); break;
  case TC_KIND_BROADCAST:
    tcn_note(&q, q.a->nccl.Broadcast(rb, rb, bytes, ncclInt8, op->root, q.nc,
                                     q.s), "ncclBroadcast");
    break;
  case TC_KIND_ALL_REDUCE:
    tcn_note(&q, q.a->nccl.AllReduce(rb, rb, cnt, m->dt, m->op, q.nc, q.s),
             "ncclAllReduce");
    break;
  case TC_KIND_REDUCE:
    tcn_note(&q, q.a->nccl.Reduce(rb, rb, cnt, m->dt, m->op, op->root, q.nc,
                                  q.s), "ncclReduce");
    break;
  case TC_KIND_BARRIER:
    tcn_note(&q, q.a->nccl.AllReduce(c->barrier_buf, c->barrier_buf, 1,
                                     ncclUint8, ncclMax, q.nc, q.s),
             "ncclAllReduce");
    break;
  case TC_KIND_ALL_GATHER:
    if ((op->flags & ag_one) == ag_one) {
      tcn_note(&q, q.a->nccl.AllGather(sb, rb, bytes, ncclInt8, q.nc, q.s),
               "ncclAllGather");
      break;
    }
    GROUP_START();
    for (int i = 0; i < n; i++)
      tcn_note(&q, q.a->nccl.Broadcast(sb, op->recv[i].buf, op->recv[i].count * es,
                                       ncclInt8, i, q.nc, q.s), "ncclBroadcast");
    GROUP_END();
    break;
  case TC_KIND_REDUCE_SCATTER:
    if ((op->flags & rs_one) == rs_one) {
      tcn_note(&q, q.a->nccl.ReduceScatter(sb, rb, cnt, m->dt, m->op, q.nc, q.s),
               "ncclReduceScatter");
      break;
    }
    GROUP_START();
    for (int i = 0; i < n; i++)
      tcn_note(&q, q.a->nccl.Reduce(op->send[i].buf, i == me ? rb : NULL,
                                    op->send[i].count, m->dt, m->op, i, q.nc, q.s),
               "ncclReduce");
    GROUP_END();
    break;
  case TC_KIND_ALL_TO_ALL:
    GROUP_START();
    for (int i = 0; i < n; i++) {
      SEND(op->send[i].buf, op->send[i].count * es, i);
      RECV(op->recv[i].buf, op->recv[i].count * es, i);
    }
    GROUP_END();
    break;
  case TC_KIND_SCATTER:
    GROUP_START();
    if (me == op->root)
      for (int i = 0; i < n; i++) SEND(op->send[i].buf, bytes, i);
    RECV(rb, bytes, op->root);
    GROUP_END();
    break;
  case TC_KIND_GATHER:
    GROUP_START();
    SEND(sb, bytes, op->root);
    if (me == op->root)
      for (int i = 0; i < n; i++) RECV(op->recv[i].buf, bytes, i);
    GROUP_END();
    break;
  case TC_KIND_BATCH:
    GROUP_START();
    for (size_t i = 0; i < op->num_p2p; i++) {
      const tc_p2p_t *p = &op->p2p[i];
      size_t b = p->count * tcn_dtype_size(p->dtype);
      if (p->is_send) SEND(p->buf, b, p->peer);
      else RECV(p->buf, b, p->peer);
    }
    GROUP_END();
    break;
  default:
    q.first = ncclInvalidUsage;
    q.what = "an unknown operation";
    break;
  }
  *what = q.what;
  return q.first;
}

/* ---- posting ---- */

/* Refuses an operation before anything was enqueued: the caller gets rc
 * and the message. */
#define tcn_refuse(c, rc, msg) tcn_put_reason(err, errlen, (rc), (msg))

int tcn_post(void *bcomm, const tc_backend_op_t *op, tc_work_t *work, char *err,
             size_t errlen) {
  tcn_comm_t *c = bcomm;
  const tcn_api_t *a = c->api;
  const char *opn = tcn_op_name(op->type);
  char msg[1536];
  tcn_red_t m = {.dt = ncclInt8, .op = ncclSum, .premul = 0};
  if (tc_backend_op_reduces(op)) {
    int rc = tcn_map_red(c, op, &m, msg, sizeof msg);
    if (rc != TC_OK) return tcn_refuse(c, rc, msg);
  }
  pthread_mutex_lock(&c->mu);
  if (c->state != TCN_ACTIVE || !c->nccl) {
    int rc = c->state == TCN_BROKEN ? c->broken_rc : TC_ERR_ABORTED;
    if (c->state == TCN_BROKEN)
      tcn_msg(c, opn, msg, sizeof msg, "the NCCL communicator was aborted "
              "after an earlier failure (create a new communicator): %s",
              c->broken_msg);
    else
      tcn_msg(c, opn, msg, sizeof msg, "the communicator was %s",
              c->state == TCN_FINALIZED ? "finalized" : "aborted");
    pthread_mutex_unlock(&c->mu);
    return tcn_refuse(c, rc, msg);
  }
  char why[512];
  tcn_rec_t *r = tcn_rec_get(c, why, sizeof why);
  if (!r) {
    pthread_mutex_unlock(&c->mu);
    tcn_msg(c, opn, msg, sizeof msg, "%s", why);
    return tcn_refuse(c, TC_ERR_NOMEM, msg);
  }
  int prev = tcn_device_enter(c);
  cudaStream_t caller = op->stream; /* NULL: the legacy default stream */
  const char *what = "cudaEventRecord";
  cudaError_t ce = a->cuda.EventRecord(c->dep, caller);
  if (ce == cudaSuccess) {
    what = "cudaStreamWaitEvent";
    ce = a->cuda.StreamWaitEvent(c->stream, c->dep, 0);
  }
  if (ce == cudaSuccess) {
    what = "cudaEventRecord";
    ce = a->cuda.EventRecord(r->start, c->stream);
  }
  if (ce != cudaSuccess) {
    tcn_device_leave(c, prev);
    tcn_rec_put(c, r);
    pthread_mutex_unlock(&c->mu);
    tcn_msg(c, opn, msg, sizeof msg, "%s failed: %s (is the stream "
            "argument a CUDA stream of device %d?)", what,
            a->cuda.GetErrorString(ce), c->device);
    return tcn_refuse(c, TC_ERR_BACKEND, msg);
  }
  ncclResult_t nr = ncclSuccess;
  if (m.premul) {
    what = "ncclRedOpCreatePreMulSum";
    nr = a->nccl.RedOpCreatePreMulSum(&m.op, m.scalar, m.dt,
                                      ncclScalarHostImmediate, c->nccl);
  }
  if (nr == ncclSuccess) nr = tcn_enqueue(c, op, &m, &what);
  if (nr == ncclInProgress) /* non-blocking: wait until enqueued */
    nr = tcn_wait_ready(c, c->nccl, tcn_now() + op->timeout_s);
  if (m.premul && m.op >= ncclNumOps) a->nccl.RedOpDestroy(m.op, c->nccl);
  if (nr != ncclSuccess) {
    tcn_device_leave(c, prev);
    tcn_rec_put(c, r);
    int rc = nr == ncclInvalidArgument || nr == ncclInvalidUsage
                 ? TC_ERR_INVALID_ARGUMENT
             : nr == ncclTimeout     ? TC_ERR_TIMEOUT
             : nr == ncclRemoteError ? TC_ERR_REMOTE
                                     : TC_ERR_BACKEND;
    tcn_msg(c, opn, msg, sizeof msg, "%s failed: %s (%s)%s%s", what,
            tcn_result_name(nr), a->nccl.GetErrorString(nr),
            *tcn_last_error(c) ? ": " : "", tcn_last_error(c));
    if (rc != TC_ERR_INVALID_ARGUMENT) { /* the communicator is unusable */
      c->state = TCN_BROKEN;
      c->broken_rc = rc;
      snprintf(c->broken_msg, sizeof c->broken_msg, "%.1000s", msg);
    }
    pthread_mutex_unlock(&c->mu);
    return tcn_refuse(c, rc, msg);
  }
  ce = a->cuda.EventRecord(r->end, c->stream);
  if (ce == cudaSuccess && !(op->flags & TC_BACKEND_OP_ASYNC))
    ce = a->cuda.StreamWaitEvent(caller, r->end, 0); /* caller after us */
  tcn_device_leave(c, prev);
  if (ce != cudaSuccess) { /* enqueued but not trackable: give up on it */
    tcn_msg(c, opn, msg, sizeof msg, "cudaEventRecord/cudaStreamWaitEvent "
            "after the NCCL call failed: %s", a->cuda.GetErrorString(ce));
    c->state = TCN_BROKEN;
    c->broken_rc = TC_ERR_BACKEND;
    snprintf(c->broken_msg, sizeof c->broken_msg, "%.1000s", msg);
    tcn_rec_put(c, r);
    pthread_mutex_unlock(&c->mu);
    return tcn_refuse(c, TC_ERR_BACKEND, msg);
  }
  r->work = work;
  r->type = op->type;
  r->post_time = tcn_now();
  r->timeout_s = op->timeout_s > 0 ? op->timeout_s : c->timeout_s;
  tcn_rec_push(c, r);
  pthread_mutex_unlock(&c->mu);
  return TC_OK;
}

/* ---- the table ---- */

TC_API const tc_backend_ops_t tc_backend_table = {
    .abi_version = TC_BACKEND_ABI_VERSION,
    .size = sizeof(tc_backend_ops_t),
    .name = "nccl",
    .version = "0.1.0",
    .init = tcn_init,
    .finalize = tcn_finalize,
    .abort = tcn_abort,
    .destroy = tcn_destroy,
    .post = tcn_post,
    .supports = tcn_supports,
    .split = tcn_split,
    .window_create = tcn_window_create,
    .window_attach = tcn_window_attach,
    .window_op = tcn_window_op,
    .window_map = tcn_window_map,
    .window_free = tcn_window_free,
};

/* nccl_window.c -- one-sided windows (tc_window_*) on NCCL, by version:
 *
 *   NCCL < 2.27   no windows: window_create refuses (TC_ERR_NOT_SUPPORTED,
 *                 naming the version loaded and the one needed).
 *   NCCL >= 2.27  the window is symmetric memory: every rank's buffer
 *                 (ncclMemAlloc when buf is NULL) is registered with
 *                 ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC), all of the
 *                 same size (the largest rank's: a caller's own buffer must
 *                 already have it). window_map gives a peer's memory where
 *                 ncclGetPeerDevicePointer does (same NVLink domain), else NULL.
 *   NCCL >= 2.29  put, signal and wait_signal through the host-initiated
 *                 one-sided calls ncclPutSignal and ncclWaitSignal.
 *   always        get and flush are refused: NCCL has neither.
 *
 * Signals. ncclPutSignal always adds one to the target's signal count of the
 * origin (NCCL's counts are per communicator and peer, not per window), so
 * a count of NCCL signals is not a count of tc signals. The backend keeps
 * tc's semantics exactly: every rank registers a second, internal window
 * (ctl: one 32-byte slot per origin, one outgoing slot per target and a
 * staging area). A tc signal is an ncclPutSignal of {seq, ops, check} into
 * the target's slot for this rank: seq counts this rank's tc signals to the
 * target, ops the NCCL operations it issued to the target so far (puts and
 * signals, every window). To wait for the k-th signal of peer the target
 * reads its slot and, while seq < k, waits for one more NCCL signal of peer
 * (ncclWaitSignal, opCnt 1: one must still come, the k-th signal's own);
 * once seq >= k it waits until it has taken `ops` signals of peer in all, so
 * that every put issued before the signal is complete. The check word
 * (seq ^ ops ^ magic) rejects a slot read while it is being written.
 *
 * Sources. ncclPutSignal reads its source from a registered window; a source
 * outside this rank's window is copied to the staging area first
 * (cudaMemcpyAsync), in chunks.
 *
 * Streams and completion. Puts and signals run on the communicator's
 * one-sided stream (ordered after the caller's stream), waits on a second
 * one (so that a wait does not hold back this rank's puts); each operation
 * returns once its work on the stream ran (tc's contract: the source may be
 * reused), polled against the operation's deadline.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nccl_backend.h"

#define TCNW_SLOT 32u                    /* bytes of one signal slot */
#define TCNW_STAGE ((size_t)1 << 20)     /* staging bytes per window */
#define TCNW_MAGIC 0x7463776e646f7721ull /* the slot's check word */
#define TCNW_INFO_MAGIC 0x54434e57u      /* "TCNW" */

/* The one-sided state of a communicator (c->rma): NCCL's signal counts are
 * per communicator and peer, so are these. Guarded by mu; c->mu is taken
 * inside it, around NCCL calls. */
typedef struct tcn_rma {
  pthread_mutex_t mu;
  cudaStream_t put_stream, wait_stream;
  cudaEvent_t put_ev, wait_ev, dep;
  uint64_t *sent;  /* per peer: NCCL signal operations issued to it */
  uint64_t *taken; /* per peer: its NCCL signals waited for */
  int inflight;    /* an ncclWaitSignal step is on wait_stream */
  int inflight_peer;
  uint64_t inflight_n;
} tcn_rma_t;

typedef struct tcn_win {
  tcn_comm_t *c;
  size_t bytes;     /* this rank's window */
  size_t reg_bytes; /* registered: the largest rank's */
  void *data;       /* the caller's buffer or ncclMemAlloc's */
  int owns_data;
  ncclWindow_t dwin; /* NULL when every rank's window is empty */
  void *ctl;         /* in slots [n], out slots [n], staging */
  size_t ctl_bytes;
  ncclWindow_t cwin;
  int rma; /* NCCL has ncclPutSignal and ncclWaitSignal */
  uint64_t *sigs_sent; /* per peer: tc signals sent on this window */
  uint64_t *out_host;  /* per peer: the slot being sent (4 words) */
  void **peer_ptr;     /* window_map's answers */
  int broken;
  char broken_msg[512];
} tcn_win_t;

/* ---- helpers ---- */

static void tcnw_version(int v, char *out, size_t len) {
  snprintf(out, len, "%d.%d.%d", v / 10000, (v / 100) % 100, v % 100);
}

static int tcnw_has_windows(const tcn_api_t *a) {
  return a->nccl_version >= TCN_NCCL_VERSION(2, 27, 0) && a->nccl.MemAlloc &&
         a->nccl.MemFree && a->nccl.CommWindowRegister && a->nccl.CommWindowDeregister;
}

static int tcnw_has_rma(const tcn_api_t *a) {
  return tcnw_has_windows(a) && a->nccl_version >= TCN_NCCL_VERSION(2, 29, 0) &&
         a->nccl.PutSignal && a->nccl.WaitSignal && a->cuda.MemcpyAsync;
}

static int tcnw_ncclrc(ncclResult_t r) {
  return r == ncclInvalidArgument || r == ncclInvalidUsage ? TC_ERR_INVALID_ARGUMENT
         : r == ncclTimeout                                 ? TC_ERR_TIMEOUT
         : r == ncclRemoteError                             ? TC_ERR_REMOTE
                                                            : TC_ERR_BACKEND;
}

/* With c->mu held: finishes a non-blocking NCCL call (ncclInProgress). */
static ncclResult_t tcnw_settle(tcn_comm_t *c, ncclResult_t r, double deadline) {
  if (r == ncclInProgress || (r == ncclSuccess && !c->blocking))
    r = tcn_wait_ready(c, c->nccl, deadline);
  return r;
}

static int tcnw_nccl_fail(tcn_comm_t *c, ncclResult_t r, const char *call, char *err,
                          size_t errlen) {
  const char *le = tcn_last_error(c);
  snprintf(err, errlen, "%s failed: %s (%s)%s%s", call, tcn_result_name(r),
           c->api->nccl.GetErrorString(r), *le ? ": " : "", le);
  return tcnw_ncclrc(r);
}

/* Waits, without c->mu, until ev ran, the deadline passed, NCCL reported an
 * error or the communicator is aborted. */
static int tcnw_sync(tcn_comm_t *c, cudaEvent_t ev, double deadline, const char *opname,
                     double timeout_s, char *err, size_t errlen) {
  const tcn_api_t *a = c->api;
  long us = 0;
  for (;;) {
    cudaError_t e = a->cuda.EventQuery(ev);
    if (e == cudaSuccess) return TC_OK;
    if (e != cudaErrorNotReady) {
      snprintf(err, errlen, "cudaEventQuery failed: %s", a->cuda.GetErrorString(e));
      return TC_ERR_BACKEND;
    }
    if (atomic_load(&c->aborting)) {
      snprintf(err, errlen, "the communicator was aborted during %s", opname);
      return TC_ERR_ABORTED;
    }
    pthread_mutex_lock(&c->mu);
    ncclResult_t st = ncclSuccess;
    if (c->nccl && a->nccl.CommGetAsyncError(c->nccl, &st) != ncclSuccess) st = ncclSuccess;
    int state = c->state;
    pthread_mutex_unlock(&c->mu);
    if (st != ncclSuccess && st != ncclInProgress) {
      snprintf(err, errlen, "NCCL reported %s (%s) during %s", tcn_result_name(st),
               a->nccl.GetErrorString(st), opname);
      return tcnw_ncclrc(st);
    }
    if (state != TCN_ACTIVE) {
      snprintf(err, errlen, "the NCCL communicator was %s during %s",
               state == TCN_FINALIZED ? "finalized" : "aborted", opname);
      return TC_ERR_ABORTED;
    }
    if (tcn_now() > deadline) {
      snprintf(err, errlen, "%s did not finish within %.1f s", opname, timeout_s);
      return TC_ERR_TIMEOUT;
    }
    if (us == 0) {
      sched_yield();
      us = 1;
      continue;
    }
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
    if (us < 1000) us *= 2;
  }
}

/* ---- the communicator's one-sided state ---- */

void tcn_rma_destroy(tcn_comm_t *c) {
  tcn_rma_t *r = c->rma;
  if (!r) return;
  const tcn_api_t *a = c->api;
  if (r->put_ev) a->cuda.EventDestroy(r->put_ev);
  if (r->wait_ev) a->cuda.EventDestroy(r->wait_ev);
  if (r->dep) a->cuda.EventDestroy(r->dep);
  if (r->put_stream) a->cuda.StreamDestroy(r->put_stream);
  if (r->wait_stream) a->cuda.StreamDestroy(r->wait_stream);
  pthread_mutex_destroy(&r->mu);
  free(r->sent);
  free(r->taken);
  free(r);
  c->rma = NULL;
}

/* With c->mu held and the device entered: c->rma, created once. */
static int tcnw_rma_get(tcn_comm_t *c, char *err, size_t errlen) {
  if (c->rma) return TC_OK;
  const tcn_api_t *a = c->api;
  tcn_rma_t *r = calloc(1, sizeof *r);
  if (!r) goto nomem;
  r->sent = calloc((size_t)c->size, sizeof *r->sent);
  r->taken = calloc((size_t)c->size, sizeof *r->taken);
  pthread_mutex_init(&r->mu, NULL);
  c->rma = r;
  if (!r->sent || !r->taken) goto nomem;
  cudaError_t e = a->cuda.StreamCreateWithFlags(&r->put_stream, cudaStreamNonBlocking);
  if (e == cudaSuccess)
    e = a->cuda.StreamCreateWithFlags(&r->wait_stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = a->cuda.EventCreateWithFlags(&r->put_ev, cudaEventDisableTiming);
  if (e == cudaSuccess) e = a->cuda.EventCreateWithFlags(&r->wait_ev, cudaEventDisableTiming);
  if (e == cudaSuccess) e = a->cuda.EventCreateWithFlags(&r->dep, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    snprintf(err, errlen, "creating the one-sided streams on CUDA device %d failed: %s",
             c->device, a->cuda.GetErrorString(e));
    tcn_rma_destroy(c);
    return TC_ERR_BACKEND;
  }
  return TC_OK;
nomem:
  if (r && !c->rma) free(r);
  tcn_rma_destroy(c);
  snprintf(err, errlen, "out of memory");
  return TC_ERR_NOMEM;
}

/* ---- create, attach, free ---- */

/* With c->mu held: max over the ranks of v[0..n) (int64), through an
 * ncclAllReduce on the communicator's stream (ordered with its other
 * collectives), synchronously. */
static int tcnw_allmax(tcn_comm_t *c, int64_t *v, size_t n, double deadline, char *err,
                       size_t errlen) {
  const tcn_api_t *a = c->api;
  void *dev = NULL;
  cudaEvent_t ev = NULL;
  int rc = TC_OK;
  cudaError_t e = a->cuda.Malloc(&dev, n * sizeof *v);
  if (e == cudaSuccess) e = a->cuda.EventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e == cudaSuccess) e = a->cuda.MemcpyAsync(dev, v, n * sizeof *v, cudaMemcpyDefault, c->stream);
  if (e != cudaSuccess) {
    snprintf(err, errlen, "preparing the window's size exchange failed: %s",
             a->cuda.GetErrorString(e));
    rc = TC_ERR_BACKEND;
    goto out;
  }
  ncclResult_t r = a->nccl.AllReduce(dev, dev, n, ncclInt64, ncclMax, c->nccl, c->stream);
  r = tcnw_settle(c, r, deadline);
  if (r != ncclSuccess) {
    rc = tcnw_nccl_fail(c, r, "ncclAllReduce (the window sizes)", err, errlen);
    goto out;
  }
  e = a->cuda.MemcpyAsync(v, dev, n * sizeof *v, cudaMemcpyDefault, c->stream);
  if (e == cudaSuccess) e = a->cuda.EventRecord(ev, c->stream);
  if (e != cudaSuccess) {
    snprintf(err, errlen, "reading the window sizes failed: %s", a->cuda.GetErrorString(e));
    rc = TC_ERR_BACKEND;
    goto out;
  }
  pthread_mutex_unlock(&c->mu);
  rc = tcnw_sync(c, ev, deadline, "the window's size exchange", c->timeout_s, err, errlen);
  pthread_mutex_lock(&c->mu);
out:
  if (ev) a->cuda.EventDestroy(ev);
  if (dev) a->cuda.Free(dev);
  return rc;
}

/* With c->mu held: ncclCommWindowRegister (collective). */
static int tcnw_register(tcn_comm_t *c, void *p, size_t bytes, ncclWindow_t *win,
                         double deadline, const char *what, char *err, size_t errlen) {
  ncclResult_t r = c->api->nccl.CommWindowRegister(c->nccl, p, bytes, win,
                                                   NCCL_WIN_COLL_SYMMETRIC);
  r = tcnw_settle(c, r, deadline);
  if (r == ncclSuccess) return TC_OK;
  char call[160];
  snprintf(call, sizeof call, "ncclCommWindowRegister of %s (%zu bytes)", what, bytes);
  int rc = tcnw_nccl_fail(c, r, call, err, errlen);
  if (r == ncclInvalidArgument || r == ncclInvalidUsage) {
    size_t l = strlen(err);
    snprintf(err + l, errlen - l, " (a window over the caller's buffer needs memory from "
             "ncclMemAlloc, of the same size on every rank; or pass buf = NULL)");
  }
  *win = NULL;
  return rc;
}

static void tcnw_release(tcn_win_t *w, int deregister) {
  tcn_comm_t *c = w->c;
  const tcn_api_t *a = c->api;
  int prev = tcn_device_enter(c);
  pthread_mutex_lock(&c->mu);
  if (deregister && c->nccl && c->state == TCN_ACTIVE) {
    if (w->cwin) a->nccl.CommWindowDeregister(c->nccl, w->cwin);
    if (w->dwin) a->nccl.CommWindowDeregister(c->nccl, w->dwin);
  }
  pthread_mutex_unlock(&c->mu);
  if (w->ctl) a->nccl.MemFree(w->ctl);
  if (w->owns_data && w->data) a->nccl.MemFree(w->data);
  tcn_device_leave(c, prev);
  free(w->sigs_sent);
  free(w->out_host);
  free(w->peer_ptr);
  free(w);
}

int tcn_window_create(void *bcomm, void *buf, size_t bytes, void **bwin, void **base,
                      void *info, size_t *info_len, char *err, size_t errlen) {
  tcn_comm_t *c = bcomm;
  const tcn_api_t *a = c->api;
  char have[32];
  *bwin = NULL;
  *base = NULL;
  *info_len = 0;
  tcnw_version(a->nccl_version, have, sizeof have);
  if (!tcnw_has_windows(a) || !a->cuda.MemcpyAsync) {
    snprintf(err, errlen,
             "windows need NCCL >= 2.27 (ncclCommWindowRegister%s); this process loaded "
             "NCCL %s from %s: install a newer NCCL (for example pip install -U "
             "nvidia-nccl-cu12) or use the cpu backend",
             a->cuda.MemcpyAsync ? "" : ", and cudaMemcpyAsync in the CUDA runtime", have,
             a->nccl_path);
    return TC_ERR_NOT_SUPPORTED;
  }
  const int n = c->size;
  tcn_win_t *w = calloc(1, sizeof *w);
  if (w) {
    w->sigs_sent = calloc((size_t)n, sizeof *w->sigs_sent);
    w->out_host = calloc((size_t)n * 4, sizeof *w->out_host);
    w->peer_ptr = calloc((size_t)n, sizeof *w->peer_ptr);
  }
  if (!w || !w->sigs_sent || !w->out_host || !w->peer_ptr) {
    if (w) {
      free(w->sigs_sent);
      free(w->out_host);
      free(w->peer_ptr);
      free(w);
    }
    snprintf(err, errlen, "out of memory");
    return TC_ERR_NOMEM;
  }
  w->c = c;
  w->bytes = bytes;
  w->rma = tcnw_has_rma(a);
  double deadline = tcn_now() + c->timeout_s;
  int rc = TC_OK;
  int prev = tcn_device_enter(c);
  pthread_mutex_lock(&c->mu);
  if (c->state != TCN_ACTIVE || !c->nccl) {
    snprintf(err, errlen, "the NCCL communicator was %s",
             c->state == TCN_BROKEN ? "aborted after an earlier failure" : "aborted");
    rc = c->state == TCN_BROKEN ? c->broken_rc : TC_ERR_ABORTED;
    goto fail_locked;
  }
  if (w->rma && (rc = tcnw_rma_get(c, err, errlen)) != TC_OK) goto fail_locked;
  /* every rank's size: symmetric windows have one size */
  int64_t v[2] = {(int64_t)bytes, buf ? -(int64_t)bytes : INT64_MIN};
  rc = tcnw_allmax(c, v, 2, deadline, err, errlen);
  if (rc != TC_OK) goto fail_locked;
  w->reg_bytes = (size_t)v[0];
  if (v[1] != INT64_MIN && (size_t)(-v[1]) != w->reg_bytes) {
    snprintf(err, errlen,
             "NCCL windows have one size on every rank, and a window over a caller's "
             "buffer cannot grow: the smallest such buffer has %lld bytes, the largest "
             "window %zu (this rank: %zu): give every rank the same size, or pass "
             "buf = NULL", (long long)-v[1], w->reg_bytes, bytes);
    rc = TC_ERR_INVALID_ARGUMENT;
    goto fail_locked;
  }
  /* memory, then whether every rank has it, then the registrations */
  ncclResult_t r = ncclSuccess;
  const char *what = "ncclMemAlloc";
  size_t want = 0;
  if (buf) {
    w->data = buf;
  } else if (w->reg_bytes) {
    want = w->reg_bytes;
    r = a->nccl.MemAlloc(&w->data, want);
    w->owns_data = r == ncclSuccess;
  }
  if (r == ncclSuccess && w->data && !buf && a->cuda.Memset(w->data, 0, w->reg_bytes) != cudaSuccess)
    r = ncclUnhandledCudaError, what = "cudaMemset";
  if (r == ncclSuccess && w->rma) {
    w->ctl_bytes = 2 * (size_t)n * TCNW_SLOT + TCNW_STAGE;
    want = w->ctl_bytes;
    r = a->nccl.MemAlloc(&w->ctl, w->ctl_bytes);
    if (r == ncclSuccess && a->cuda.Memset(w->ctl, 0, w->ctl_bytes) != cudaSuccess)
      r = ncclUnhandledCudaError, what = "cudaMemset";
  }
  int64_t failed[1] = {r != ncclSuccess};
  if (r != ncclSuccess)
    snprintf(err, errlen, "%s of %zu bytes failed: %s (%s)", what, want, tcn_result_name(r),
             a->nccl.GetErrorString(r));
  char other[256];
  rc = tcnw_allmax(c, failed, 1, deadline, other, sizeof other);
  if (rc != TC_OK) {
    if (r == ncclSuccess) snprintf(err, errlen, "%s", other);
    goto fail_locked;
  }
  if (r != ncclSuccess) {
    rc = TC_ERR_NOMEM;
    goto fail_locked;
  }
  if (failed[0]) {
    snprintf(err, errlen, "another rank could not allocate its window memory (see its "
             "error)");
    rc = TC_ERR_REMOTE;
    goto fail_locked;
  }
  if (w->reg_bytes &&
      (rc = tcnw_register(c, w->data, w->reg_bytes, &w->dwin, deadline, "the window", err,
                          errlen)) != TC_OK)
    goto fail_locked;
  if (w->rma && (rc = tcnw_register(c, w->ctl, w->ctl_bytes, &w->cwin, deadline,
                                    "the signal slots", err, errlen)) != TC_OK)
    goto fail_locked;
  pthread_mutex_unlock(&c->mu);
  tcn_device_leave(c, prev);
  /* peers' memory, where NCCL maps it here */
  for (int p = 0; p < n; p++) {
    if (p == c->rank) w->peer_ptr[p] = w->data;
    else if (w->dwin && a->nccl.GetPeerDevicePointer &&
             a->nccl.GetPeerDevicePointer(w->dwin, 0, p, &w->peer_ptr[p]) != ncclSuccess)
      w->peer_ptr[p] = NULL;
  }
  uint32_t hdr[4] = {TCNW_INFO_MAGIC, (uint32_t)w->rma, (uint32_t)(bytes >> 32),
                     (uint32_t)bytes};
  memcpy(info, hdr, sizeof hdr);
  *info_len = sizeof hdr;
  *bwin = w;
  *base = w->data;
  TC_BACKEND_LOGS(c->host, TC_LOG_INFO, TC_LOG_INIT,
                  "nccl backend: window of %zu bytes (registered %zu) on '%s'; one-sided "
                  "put/signal %s (NCCL %s)", bytes, w->reg_bytes, c->name,
                  w->rma ? "through ncclPutSignal" : "refused: NCCL < 2.29", have);
  return TC_OK;
fail_locked:
  pthread_mutex_unlock(&c->mu);
  tcn_device_leave(c, prev);
  tcnw_release(w, 1);
  return rc;
}

int tcn_window_attach(void *bwin, const void *infos, size_t info_len, char *err,
                      size_t errlen) {
  tcn_win_t *w = bwin;
  for (int p = 0; p < w->c->size; p++) {
    uint32_t hdr[4];
    if (info_len < sizeof hdr) goto bad;
    memcpy(hdr, (const char *)infos + (size_t)p * info_len, sizeof hdr);
    if (hdr[0] != TCNW_INFO_MAGIC) goto bad;
    if ((int)hdr[1] != w->rma) {
      snprintf(err, errlen, "rank %d %s one-sided put/signal and this rank %s: every "
               "rank must load the same NCCL", p, hdr[1] ? "has" : "lacks",
               w->rma ? "has" : "lacks");
      return TC_ERR_INVALID_ARGUMENT;
    }
    continue;
  bad:
    snprintf(err, errlen, "rank %d's window description is not the nccl backend's "
             "(does every rank use the nccl backend?)", p);
    return TC_ERR_PROTOCOL;
  }
  return TC_OK;
}

void tcn_window_free(void *bwin) {
  tcn_win_t *w = bwin;
  if (!w) return;
  tcn_comm_t *c = w->c;
  tcn_rma_t *r = c->rma;
  int idle = 1;
  if (r) { /* the streams' work on this window has run (a wait step may not) */
    char why[256];
    pthread_mutex_lock(&r->mu);
    idle = !r->inflight;
    if (c->api->cuda.EventRecord(r->put_ev, r->put_stream) == cudaSuccess)
      tcnw_sync(c, r->put_ev, tcn_now() + c->timeout_s, "window_free", c->timeout_s, why,
                sizeof why);
    pthread_mutex_unlock(&r->mu);
  }
  /* a wait step still on the stream may reach this memory: keep it */
  if (!idle) return;
  tcnw_release(w, 1);
}

void *tcn_window_map(void *bwin, int peer) {
  tcn_win_t *w = bwin;
  if (peer < 0 || peer >= w->c->size) return NULL;
  return w->peer_ptr[peer];
}

/* ---- operations ---- */

/* With r->mu and c->mu held: orders `stream` after the caller's stream. */
static cudaError_t tcnw_after_caller(tcn_comm_t *c, cudaStream_t stream, void *caller) {
  cudaError_t e = c->api->cuda.EventRecord(c->rma->dep, (cudaStream_t)caller);
  if (e == cudaSuccess) e = c->api->cuda.StreamWaitEvent(stream, c->rma->dep, 0);
  return e;
}

/* With c->mu held: NULL if the communicator can run an operation, else the
 * reason (and *rc). */
static const char *tcnw_inactive(tcn_comm_t *c, int *rc) {
  if (c->state == TCN_ACTIVE && c->nccl) return NULL;
  *rc = c->state == TCN_BROKEN ? c->broken_rc : TC_ERR_ABORTED;
  return c->state == TCN_BROKEN    ? c->broken_msg
         : c->state == TCN_FINALIZED ? "the communicator was finalized"
                                     : "the communicator was aborted";
}

static int tcnw_put(tcn_win_t *w, const tc_backend_win_op_t *op, char *err, size_t errlen) {
  tcn_comm_t *c = w->c;
  tcn_rma_t *r = c->rma;
  const tcn_api_t *a = c->api;
  if (op->bytes == 0) return TC_OK;
  const char *src = op->buf;
  char *data = w->data;
  const int direct = data && src >= data && src + op->bytes <= data + w->bytes;
  char *stage = (char *)w->ctl + 2 * (size_t)c->size * TCNW_SLOT;
  int rc = TC_OK;
  pthread_mutex_lock(&r->mu);
  pthread_mutex_lock(&c->mu);
  const char *why = tcnw_inactive(c, &rc);
  if (why) {
    snprintf(err, errlen, "%s", why);
    goto out_locked;
  }
  cudaError_t e = tcnw_after_caller(c, r->put_stream, op->stream);
  for (size_t done = 0; e == cudaSuccess && done < op->bytes;) {
    size_t chunk = direct ? op->bytes : op->bytes - done;
    if (chunk > TCNW_STAGE && !direct) chunk = TCNW_STAGE;
    const void *from = src + done;
    if (op->peer == c->rank) { /* this rank's own window: a copy */
      e = a->cuda.MemcpyAsync(data + op->offset + done, from, chunk, cudaMemcpyDefault,
                              r->put_stream);
      done += chunk;
      continue;
    }
    if (!direct) {
      e = a->cuda.MemcpyAsync(stage, from, chunk, cudaMemcpyDefault, r->put_stream);
      if (e != cudaSuccess) break;
      from = stage;
    }
    ncclResult_t nr = a->nccl.PutSignal(from, chunk, ncclInt8, op->peer, w->dwin,
                                        op->offset + done, 0, 0, 0, c->nccl, r->put_stream);
    nr = tcnw_settle(c, nr, op->deadline);
    if (nr != ncclSuccess) {
      rc = tcnw_nccl_fail(c, nr, "ncclPutSignal", err, errlen);
      goto out_locked;
    }
    r->sent[op->peer]++;
    done += chunk;
  }
  if (e == cudaSuccess) e = a->cuda.EventRecord(r->put_ev, r->put_stream);
  if (e != cudaSuccess) {
    snprintf(err, errlen, "queueing the put's copies failed: %s (is the stream argument "
             "a CUDA stream of device %d?)", a->cuda.GetErrorString(e), c->device);
    rc = TC_ERR_BACKEND;
    goto out_locked;
  }
  pthread_mutex_unlock(&c->mu);
  rc = tcnw_sync(c, r->put_ev, op->deadline, op->opname, op->timeout_s, err, errlen);
  pthread_mutex_unlock(&r->mu);
  return rc;
out_locked:
  pthread_mutex_unlock(&c->mu);
  pthread_mutex_unlock(&r->mu);
  return rc;
}

static int tcnw_signal(tcn_win_t *w, const tc_backend_win_op_t *op, char *err,
                       size_t errlen) {
  tcn_comm_t *c = w->c;
  tcn_rma_t *r = c->rma;
  const tcn_api_t *a = c->api;
  const int me = c->rank, p = op->peer;
  char *in_me = (char *)w->ctl + (size_t)me * TCNW_SLOT; /* at the target */
  char *out = (char *)w->ctl + ((size_t)c->size + (size_t)p) * TCNW_SLOT;
  int rc = TC_OK;
  pthread_mutex_lock(&r->mu);
  pthread_mutex_lock(&c->mu);
  const char *why = tcnw_inactive(c, &rc);
  if (why) {
    snprintf(err, errlen, "%s", why);
    goto out_locked;
  }
  uint64_t *slot = &w->out_host[4 * (size_t)p];
  slot[0] = w->sigs_sent[p] + 1;
  /* to itself: no NCCL operation, the slot carries what this rank took */
  slot[1] = p == me ? r->taken[me] : r->sent[p] + 1;
  slot[2] = slot[0] ^ slot[1] ^ TCNW_MAGIC;
  slot[3] = 0;
  cudaError_t e = tcnw_after_caller(c, r->put_stream, op->stream);
  if (e == cudaSuccess)
    e = a->cuda.MemcpyAsync(p == me ? in_me : out, slot, TCNW_SLOT, cudaMemcpyDefault,
                            r->put_stream);
  if (e == cudaSuccess && p != me) {
    ncclResult_t nr = a->nccl.PutSignal(out, TCNW_SLOT, ncclInt8, p, w->cwin,
                                        (size_t)me * TCNW_SLOT, 0, 0, 0, c->nccl,
                                        r->put_stream);
    nr = tcnw_settle(c, nr, op->deadline);
    if (nr != ncclSuccess) {
      rc = tcnw_nccl_fail(c, nr, "ncclPutSignal (the signal)", err, errlen);
      goto out_locked;
    }
    r->sent[p]++;
  }
  if (e == cudaSuccess) e = a->cuda.EventRecord(r->put_ev, r->put_stream);
  if (e != cudaSuccess) {
    snprintf(err, errlen, "queueing the signal failed: %s", a->cuda.GetErrorString(e));
    rc = TC_ERR_BACKEND;
    goto out_locked;
  }
  w->sigs_sent[p]++;
  pthread_mutex_unlock(&c->mu);
  rc = tcnw_sync(c, r->put_ev, op->deadline, op->opname, op->timeout_s, err, errlen);
  pthread_mutex_unlock(&r->mu);
  return rc;
out_locked:
  pthread_mutex_unlock(&c->mu);
  pthread_mutex_unlock(&r->mu);
  return rc;
}

/* With r->mu held: reads this rank's slot for origin p; 1 with *seq, *ops
 * when it is whole, 0 while it is being written. */
static int tcnw_read_slot(tcn_win_t *w, int p, uint64_t *seq, uint64_t *ops,
                          const tc_backend_win_op_t *op, int *rc, char *err, size_t errlen) {
  tcn_comm_t *c = w->c;
  tcn_rma_t *r = c->rma;
  uint64_t s[4];
  cudaError_t e = c->api->cuda.MemcpyAsync(s, (char *)w->ctl + (size_t)p * TCNW_SLOT,
                                           sizeof s, cudaMemcpyDefault, r->wait_stream);
  if (e == cudaSuccess) e = c->api->cuda.EventRecord(r->wait_ev, r->wait_stream);
  if (e != cudaSuccess) {
    snprintf(err, errlen, "reading the signal slot failed: %s",
             c->api->cuda.GetErrorString(e));
    *rc = TC_ERR_BACKEND;
    return 0;
  }
  *rc = tcnw_sync(c, r->wait_ev, op->deadline, op->opname, op->timeout_s, err, errlen);
  if (*rc != TC_OK) return 0;
  if ((s[0] ^ s[1] ^ TCNW_MAGIC) != s[2]) return 0;
  *seq = s[0];
  *ops = s[1];
  return 1;
}

static int tcnw_wait(tcn_win_t *w, const tc_backend_win_op_t *op, char *err, size_t errlen) {
  tcn_comm_t *c = w->c;
  tcn_rma_t *r = c->rma;
  const tcn_api_t *a = c->api;
  const int p = op->peer;
  int rc = TC_OK;
  pthread_mutex_lock(&r->mu);
  for (;;) {
    if (r->inflight) { /* a step of an earlier look: has it run? */
      if (op->block) {
        rc = tcnw_sync(c, r->wait_ev, op->deadline, op->opname, op->timeout_s, err, errlen);
        if (rc != TC_OK) break;
      } else {
        cudaError_t e = a->cuda.EventQuery(r->wait_ev);
        if (e == cudaErrorNotReady) {
          rc = TC_BACKEND_WIN_PENDING;
          break;
        }
        if (e != cudaSuccess) {
          snprintf(err, errlen, "cudaEventQuery failed: %s", a->cuda.GetErrorString(e));
          rc = TC_ERR_BACKEND;
          break;
        }
      }
      r->taken[r->inflight_peer] += r->inflight_n;
      r->inflight = 0;
    }
    uint64_t seq = 0, ops = 0;
    int whole = tcnw_read_slot(w, p, &seq, &ops, op, &rc, err, errlen);
    if (rc != TC_OK) break;
    if (whole && seq >= op->target && (p == c->rank || r->taken[p] >= ops)) break;
    if (p == c->rank) { /* only another thread of this rank can signal */
      if (!op->block) {
        rc = TC_BACKEND_WIN_PENDING;
        break;
      }
      if (tcn_now() > op->deadline) {
        snprintf(err, errlen, "%s did not finish within %.1f s", op->opname, op->timeout_s);
        rc = TC_ERR_TIMEOUT;
        break;
      }
      sched_yield();
      continue;
    }
    /* one more NCCL signal of p (the awaited signal's own is still to come),
     * or all of them up to the signal's */
    uint64_t nsig = whole && seq >= op->target ? ops - r->taken[p] : 1;
    if (nsig > 1u << 30) nsig = 1u << 30;
    ncclWaitSignalDesc_t d = {.opCnt = (int)nsig, .peer = p, .sigIdx = 0, .ctx = 0};
    pthread_mutex_lock(&c->mu);
    const char *why = tcnw_inactive(c, &rc);
    if (why) {
      snprintf(err, errlen, "%s", why);
      pthread_mutex_unlock(&c->mu);
      break;
    }
    ncclResult_t nr = a->nccl.WaitSignal(1, &d, c->nccl, r->wait_stream);
    nr = tcnw_settle(c, nr, op->deadline);
    cudaError_t e = cudaSuccess;
    if (nr == ncclSuccess) e = a->cuda.EventRecord(r->wait_ev, r->wait_stream);
    pthread_mutex_unlock(&c->mu);
    if (nr != ncclSuccess) {
      rc = tcnw_nccl_fail(c, nr, "ncclWaitSignal", err, errlen);
      break;
    }
    if (e != cudaSuccess) {
      snprintf(err, errlen, "cudaEventRecord after ncclWaitSignal failed: %s",
               a->cuda.GetErrorString(e));
      rc = TC_ERR_BACKEND;
      break;
    }
    r->inflight = 1;
    r->inflight_peer = p;
    r->inflight_n = nsig;
  }
  if (rc != TC_OK && rc != TC_BACKEND_WIN_PENDING && r->inflight) {
    /* a wait step that may never run holds the stream: no more windows ops */
    w->broken = 1;
    snprintf(w->broken_msg, sizeof w->broken_msg, "an earlier wait_signal failed (%.400s): "
             "free the window", err);
  }
  pthread_mutex_unlock(&r->mu);
  return rc;
}

int tcn_window_op(void *bwin, const tc_backend_win_op_t *op, char *err, size_t errlen) {
  tcn_win_t *w = bwin;
  tcn_comm_t *c = w->c;
  const tcn_api_t *a = c->api;
  char have[32];
  tcnw_version(a->nccl_version, have, sizeof have);
  switch (op->kind) {
  case TC_WIN_GET:
    snprintf(err, errlen, "NCCL has no one-sided get (NCCL %s; NCCL 2.29 adds put and "
             "signal only): have rank %d put the data into this rank's window and signal, "
             "or use the cpu backend", have, op->peer);
    return TC_ERR_NOT_SUPPORTED;
  case TC_WIN_FLUSH:
    snprintf(err, errlen, "NCCL has no flush of one-sided puts: signal the peer after "
             "the puts (they are visible there once its wait_signal for that signal "
             "returns)");
    return TC_ERR_NOT_SUPPORTED;
  default:
    break;
  }
  if (!w->rma) {
    snprintf(err, errlen, "%s needs NCCL >= 2.29 (ncclPutSignal and ncclWaitSignal, "
             "host-initiated one-sided operations); this process loaded NCCL %s from %s: "
             "install a newer NCCL (for example pip install -U nvidia-nccl-cu12), use "
             "tc_window_map where it gives a pointer, or use the cpu backend",
             op->opname ? op->opname : "this window operation", have, a->nccl_path);
    return TC_ERR_NOT_SUPPORTED;
  }
  if (w->broken) {
    snprintf(err, errlen, "%s", w->broken_msg);
    return TC_ERR_ABORTED;
  }
  int prev = tcn_device_enter(c);
  int rc;
  switch (op->kind) {
  case TC_WIN_PUT: rc = tcnw_put(w, op, err, errlen); break;
  case TC_WIN_SIGNAL: rc = tcnw_signal(w, op, err, errlen); break;
  case TC_WIN_WAIT_SIGNAL: rc = tcnw_wait(w, op, err, errlen); break;
  default:
    snprintf(err, errlen, "unknown window operation %d", (int)op->kind);
    rc = TC_ERR_INVALID_ARGUMENT;
    break;
  }
  tcn_device_leave(c, prev);
  return rc;
}

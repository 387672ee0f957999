/* nccl_comm.c -- the nccl backend's communicators: init (the ncclUniqueId of
 * rank 0 published through the communicator's store, then
 * ncclCommInitRankConfig with blocking = 0, polled against the bootstrap
 * deadline), split (ncclCommSplit), finalize, abort, destroy, and the
 * poller thread that turns CUDA events into work completions.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nccl_backend.h"

/* ---- small helpers ---- */

double tcn_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void tcn_sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

size_t tcn_dtype_size(tc_dtype_t dt) {
  switch (dt) {
#define TCN_SIZE(name, val, ctype, size, isf)                                  \
  case TC_##name:                                                              \
    return size;
    TC_DTYPE_MAP(TCN_SIZE)
#undef TCN_SIZE
  default:
    return 0;
  }
}

void tcn_msg(const tcn_comm_t *c, const char *op, char *out, size_t outlen,
             const char *fmt, ...) {
  (void)c; /* the core adds "torchcomms: <op> on '<comm>' (rank r of n): " */
  (void)op;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(out, outlen, fmt, ap);
  va_end(ap);
}

int tcn_put_reason(char *err, size_t errlen, int rc, const char *text) {
  if (err && errlen) snprintf(err, errlen, "%s", text);
  return rc;
}

const char *tcn_last_error(const tcn_comm_t *c) {
  const char *e = c->api->nccl.GetLastError
                      ? c->api->nccl.GetLastError(c->nccl)
                      : NULL;
  return e ? e : "";
}

int tcn_device_enter(const tcn_comm_t *c) {
  int prev = -1;
  if (c->api->cuda.GetDevice(&prev) != cudaSuccess) prev = -1;
  if (prev != c->device) c->api->cuda.SetDevice(c->device);
  return prev;
}

void tcn_device_leave(const tcn_comm_t *c, int prev) {
  if (prev >= 0 && prev != c->device) c->api->cuda.SetDevice(prev);
}

ncclResult_t tcn_wait_ready(tcn_comm_t *c, ncclComm_t comm, double deadline) {
  long us = 1;
  for (;;) {
    ncclResult_t st = ncclSuccess;
    ncclResult_t r = c->api->nccl.CommGetAsyncError(comm, &st);
    if (r != ncclSuccess) return r;
    if (st != ncclInProgress) return st;
    if (atomic_load(&c->aborting)) return ncclInvalidUsage;
    if (tcn_now() > deadline) return ncclTimeout;
    tcn_sleep_us(us);
    if (us < 1000) us *= 2;
  }
}

/* ---- the pool of records ---- */

tcn_rec_t *tcn_rec_get(tcn_comm_t *c, char *err, size_t errlen) {
  tcn_rec_t *r = c->free_recs;
  if (r) {
    c->free_recs = r->next;
  } else {
    r = calloc(1, sizeof *r);
    if (!r) {
      snprintf(err, errlen, "out of memory");
      return NULL;
    }
    cudaError_t e = c->api->cuda.EventCreateWithFlags(&r->start,
                                                      cudaEventDisableTiming);
    if (e == cudaSuccess)
      e = c->api->cuda.EventCreateWithFlags(&r->end, cudaEventDisableTiming);
    if (e != cudaSuccess) {
      snprintf(err, errlen, "cudaEventCreateWithFlags failed: %s",
               c->api->cuda.GetErrorString(e));
      if (r->start) c->api->cuda.EventDestroy(r->start);
      free(r);
      return NULL;
    }
  }
  r->next = NULL;
  r->work = NULL;
  r->started = 0;
  r->rc = TC_OK;
  r->msg = NULL;
  return r;
}

void tcn_rec_put(tcn_comm_t *c, tcn_rec_t *r) {
  free(r->msg);
  r->msg = NULL;
  r->work = NULL;
  r->next = c->free_recs;
  c->free_recs = r;
}

void tcn_rec_push(tcn_comm_t *c, tcn_rec_t *r) {
  r->next = NULL;
  if (c->tail) c->tail->next = r;
  else c->head = r;
  c->tail = r;
  pthread_cond_signal(&c->cv);
}

/* Moves the head of the pending list to *done (in order). */
static void tcn_pop_to(tcn_comm_t *c, tcn_rec_t ***done_tail) {
  tcn_rec_t *r = c->head;
  c->head = r->next;
  if (!c->head) c->tail = NULL;
  r->next = NULL;
  **done_tail = r;
  *done_tail = &r->next;
}

/* With c->mu held: aborts the NCCL communicator after a failure of the
 * oldest pending operation (rc, msg) and fails every pending operation;
 * they go to *done. The communicator refuses every later operation. */
static void tcn_break(tcn_comm_t *c, int rc, const char *msg,
                      tcn_rec_t ***done_tail) {
  if (c->state == TCN_ACTIVE) {
    c->state = TCN_BROKEN;
    c->broken_rc = rc;
    snprintf(c->broken_msg, sizeof c->broken_msg, "%s", msg);
  }
  if (c->nccl) {
    c->api->nccl.CommAbort(c->nccl);
    c->nccl = NULL;
  }
  int first = 1;
  while (c->head) {
    tcn_rec_t *r = c->head;
    char buf[1024];
    if (first) {
      r->rc = rc;
      snprintf(buf, sizeof buf, "%s", msg);
    } else {
      r->rc = TC_ERR_ABORTED;
      tcn_msg(c, tcn_op_name(r->type), buf, sizeof buf,
              "not run: an earlier operation failed and the NCCL "
              "communicator was aborted (create a new communicator)");
    }
    r->msg = strdup(buf);
    first = 0;
    tcn_pop_to(c, done_tail);
  }
  pthread_cond_broadcast(&c->idle_cv);
}

/* Completion callbacks for the records of `done`, outside c->mu, then the
 * records go back to the pool. */
static void tcn_deliver(tcn_comm_t *c, tcn_rec_t *done) {
  for (tcn_rec_t *r = done; r; r = r->next)
    c->host->work_complete(r->work, r->rc,
                           r->rc == TC_OK ? NULL : r->msg ? r->msg : "");
  if (!done) return;
  pthread_mutex_lock(&c->mu);
  while (done) {
    tcn_rec_t *n = done->next;
    tcn_rec_put(c, done);
    done = n;
  }
  pthread_mutex_unlock(&c->mu);
}

/* ---- the poller ---- */

/* One pass over the pending operations, with c->mu held: completions go to
 * *done. Returns 1 if anything moved. */
static int tcn_poll_once(tcn_comm_t *c, tcn_rec_t ***done_tail) {
  const tcn_api_t *a = c->api;
  char msg[1024];
  if (!c->head) return 0;
  if (c->nccl) {
    ncclResult_t st = ncclSuccess;
    ncclResult_t r = a->nccl.CommGetAsyncError(c->nccl, &st);
    if (r != ncclSuccess) st = r;
    if (st != ncclSuccess && st != ncclInProgress) {
      tcn_msg(c, tcn_op_name(c->head->type), msg, sizeof msg,
              "NCCL reported %s (%s)%s%s; the NCCL communicator was aborted "
              "(create a new communicator)",
              tcn_result_name(st), a->nccl.GetErrorString(st),
              *tcn_last_error(c) ? ": " : "", tcn_last_error(c));
      tcn_break(c, st == ncclRemoteError ? TC_ERR_REMOTE : TC_ERR_BACKEND, msg,
                done_tail);
      return 1;
    }
  }
  int moved = 0;
  while (c->head) {
    tcn_rec_t *r = c->head;
    double now = tcn_now();
    cudaError_t e;
    if (!r->started) {
      e = a->cuda.EventQuery(r->start);
      if (e == cudaSuccess) {
        r->started = 1;
        r->start_time = now;
        c->host->work_started(r->work);
        moved = 1;
      } else if (e != cudaErrorNotReady) {
        goto cuda_error;
      }
    }
    if (r->started) {
      e = a->cuda.EventQuery(r->end);
      if (e == cudaSuccess) {
        tcn_pop_to(c, done_tail);
        moved = 1;
        continue;
      }
      if (e != cudaErrorNotReady) goto cuda_error;
    }
    double t0 = r->started ? r->start_time : r->post_time;
    if (now - t0 > r->timeout_s) {
      tcn_msg(c, tcn_op_name(r->type), msg, sizeof msg,
              "timed out after %.1f s %s; the NCCL communicator was aborted "
              "(create a new communicator; is every rank issuing the same "
              "operations?)",
              r->timeout_s,
              r->started ? "waiting for the NCCL kernel to finish"
                         : "before it started (the caller's stream or an "
                           "earlier operation did not finish)");
      tcn_break(c, TC_ERR_TIMEOUT, msg, done_tail);
      return 1;
    }
    break;
  cuda_error:
    tcn_msg(c, tcn_op_name(r->type), msg, sizeof msg,
            "cudaEventQuery failed: %s; the NCCL communicator was aborted",
            a->cuda.GetErrorString(e));
    tcn_break(c, TC_ERR_BACKEND, msg, done_tail);
    return 1;
  }
  if (!c->head) pthread_cond_broadcast(&c->idle_cv);
  return moved;
}

static void *tcn_poller_main(void *arg) {
  tcn_comm_t *c = arg;
  c->api->cuda.SetDevice(c->device);
  long wait_us = 0;
  pthread_mutex_lock(&c->mu);
  for (;;) {
    if (!c->head) {
      if (c->stop) break;
      wait_us = 0;
      pthread_cond_wait(&c->cv, &c->mu);
      continue;
    }
    tcn_rec_t *done = NULL, **done_tail = &done;
    int moved = tcn_poll_once(c, &done_tail);
    if (done) {
      pthread_mutex_unlock(&c->mu);
      tcn_deliver(c, done);
      pthread_mutex_lock(&c->mu);
    }
    if (moved) {
      wait_us = 0;
      continue;
    }
    /* nothing finished: back off from a yield to 1 ms (latency vs CPU) */
    if (wait_us == 0) {
      wait_us = 1;
      pthread_mutex_unlock(&c->mu);
      sched_yield();
      pthread_mutex_lock(&c->mu);
      continue;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += wait_us * 1000;
    while (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    if (wait_us < 1000) wait_us *= 2;
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

/* Stops and joins the poller (the pending list must be empty). */
static void tcn_stop_poller(tcn_comm_t *c) {
  if (!c->poller_started) return;
  pthread_mutex_lock(&c->mu);
  c->stop = 1;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  pthread_join(c->poller, NULL);
  c->poller_started = 0;
}

/* ---- creation ---- */

static int tcn_fake_host(void) {
  const char *v = getenv("TORCHCOMMS_NCCL_FAKE_HOST");
  return v && !strcmp(v, "1");
}

/* Everything but the NCCL communicator: device (force_device >= 0, else
 * the init argument, else the caller's current device), stream, events,
 * barrier buffer. */
static int tcn_comm_new(const tc_backend_init_args_t *a, const tcn_api_t *api,
                        int force_device, tcn_comm_t **out, char *err,
                        size_t errlen) {
  *out = NULL;
  const char *dev = a->device ? a->device : "cuda";
  if (strcmp(dev, "cuda") != 0 && !tcn_fake_host()) {
    snprintf(err, errlen,
             "the nccl backend runs on CUDA devices: create the communicator "
             "on device 'cuda' (got '%s')", dev);
    return TC_ERR_INVALID_ARGUMENT;
  }
  int ndev = 0;
  cudaError_t e = api->cuda.GetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev <= 0) {
    snprintf(err, errlen,
             "no CUDA device is usable (cudaGetDeviceCount: %s, %d devices; "
             "runtime %s)", e == cudaSuccess ? "ok" : api->cuda.GetErrorString(e),
             ndev, api->cudart_path);
    return TC_ERR_BACKEND_NOT_FOUND;
  }
  int device = force_device >= 0 ? force_device : a->device_index;
  if (device < 0 && api->cuda.GetDevice(&device) != cudaSuccess) device = 0;
  if (device >= ndev) {
    snprintf(err, errlen,
             "device index %d is out of range: this process sees %d CUDA "
             "device%s (check CUDA_VISIBLE_DEVICES and LOCAL_RANK)",
             device, ndev, ndev == 1 ? "" : "s");
    return TC_ERR_INVALID_ARGUMENT;
  }
  tcn_comm_t *c = calloc(1, sizeof *c);
  if (!c) {
    snprintf(err, errlen, "out of memory");
    return TC_ERR_NOMEM;
  }
  c->host = a->host;
  c->api = api;
  snprintf(c->name, sizeof c->name, "%s", a->comm_name ? a->comm_name : "?");
  c->rank = a->rank;
  c->size = a->world_size;
  c->device = device;
  c->timeout_s = a->timeout_s > 0 ? a->timeout_s : TC_DEFAULT_TIMEOUT_S;
  c->blocking = api->nccl.CommInitRankConfig == NULL;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  pthread_cond_init(&c->idle_cv, NULL);
  atomic_init(&c->aborting, 0);
  int prev = tcn_device_enter(c);
  const char *what = "cudaSetDevice";
  e = api->cuda.SetDevice(device);
  if (e == cudaSuccess) {
    what = "cudaStreamCreateWithFlags";
    e = api->cuda.StreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
  }
  if (e == cudaSuccess) {
    what = "cudaEventCreateWithFlags";
    e = api->cuda.EventCreateWithFlags(&c->dep, cudaEventDisableTiming);
  }
  if (e == cudaSuccess) {
    what = "cudaMalloc";
    e = api->cuda.Malloc(&c->barrier_buf, 16);
  }
  if (e == cudaSuccess) {
    what = "cudaMemset";
    e = api->cuda.Memset(c->barrier_buf, 0, 16);
  }
  tcn_device_leave(c, prev);
  if (e != cudaSuccess) {
    snprintf(err, errlen, "%s on CUDA device %d failed: %s", what, device,
             api->cuda.GetErrorString(e));
    tcn_destroy(c);
    return TC_ERR_BACKEND;
  }
  *out = c;
  return TC_OK;
}

/* Waits for a freshly created or split NCCL communicator, then checks it
 * and starts the poller. With c->mu not held. */
static int tcn_comm_ready(tcn_comm_t *c, ncclResult_t r, const char *call,
                          double deadline, char *err, size_t errlen) {
  const tcn_api_t *api = c->api;
  if (r == ncclInProgress || (r == ncclSuccess && !c->blocking)) {
    pthread_mutex_lock(&c->mu);
    r = tcn_wait_ready(c, c->nccl, deadline);
    pthread_mutex_unlock(&c->mu);
  }
  if (r == ncclTimeout) {
    snprintf(err, errlen,
             "%s did not finish within %.1f s (NCCL connecting the %d ranks: "
             "is every rank creating this communicator?)",
             call, c->timeout_s, c->size);
    return TC_ERR_TIMEOUT;
  }
  if (r != ncclSuccess) {
    snprintf(err, errlen, "%s failed: %s (%s)%s%s", call, tcn_result_name(r),
             api->nccl.GetErrorString(r), *tcn_last_error(c) ? ": " : "",
             tcn_last_error(c));
    return r == ncclRemoteError ? TC_ERR_REMOTE : TC_ERR_BACKEND;
  }
  int n = -1, me = -1;
  api->nccl.CommCount(c->nccl, &n);
  api->nccl.CommUserRank(c->nccl, &me);
  if (n != c->size || me != c->rank) {
    snprintf(err, errlen,
             "%s made a communicator of %d ranks where this is rank %d, but "
             "torchcomms expected rank %d of %d", call, n, me, c->rank,
             c->size);
    return TC_ERR_INTERNAL;
  }
  int e = pthread_create(&c->poller, NULL, tcn_poller_main, c);
  if (e != 0) {
    snprintf(err, errlen, "could not start the completion poller thread: %s",
             strerror(e));
    return TC_ERR_SYSTEM;
  }
  c->poller_started = 1;
  TC_BACKEND_LOGS(c->host, TC_LOG_INFO, TC_LOG_INIT,
                  "nccl backend: communicator '%s' rank %d of %d on CUDA device %d "
                  "(NCCL %d from %s)", c->name, c->rank, c->size, c->device,
                  api->nccl_version, api->nccl_path);
  return TC_OK;
}

#define TCN_UID_KEY "nccl/unique_id"

int tcn_init(const tc_backend_init_args_t *a, void **bcomm, char *err,
             size_t errlen) {
  const tcn_api_t *api;
  *bcomm = NULL;
  int rc = tcn_load(&api, err, errlen);
  if (rc != TC_OK) return rc;
  tcn_comm_t *c;
  rc = tcn_comm_new(a, api, -1, &c, err, errlen);
  if (rc != TC_OK) return rc;
  double deadline = tcn_now() + c->timeout_s;
  /* rank 0's unique id, through the store (keys are per communicator) */
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (c->rank == 0) {
    ncclResult_t r = api->nccl.GetUniqueId(&id);
    if (r != ncclSuccess) {
      snprintf(err, errlen, "ncclGetUniqueId failed: %s (%s)",
               tcn_result_name(r), api->nccl.GetErrorString(r));
      rc = TC_ERR_BACKEND;
      goto fail;
    }
    rc = a->host->store_set(a->store, TCN_UID_KEY, &id, sizeof id);
    if (rc != TC_OK) {
      snprintf(err, errlen, "could not publish the NCCL unique id in the "
               "store (is the store reachable?)");
      goto fail;
    }
  } else {
    void *v = NULL;
    size_t len = 0;
    rc = a->host->store_get(a->store, TCN_UID_KEY, &v, &len, c->timeout_s);
    if (rc != TC_OK) {
      snprintf(err, errlen,
               "did not receive the NCCL unique id of rank 0 from the store "
               "within %.1f s (is rank 0 creating this communicator?)",
               c->timeout_s);
      goto fail;
    }
    if (len != sizeof id) {
      a->host->free(v);
      snprintf(err, errlen, "the NCCL unique id in the store has %zu bytes, "
               "not %zu (another program's key?)", len, sizeof id);
      rc = TC_ERR_PROTOCOL;
      goto fail;
    }
    memcpy(&id, v, sizeof id);
    a->host->free(v);
  }
  int prev = tcn_device_enter(c);
  ncclResult_t r;
  const char *call;
  if (api->nccl.CommInitRankConfig) {
    tcn_config_t cfg = TCN_CONFIG_INIT;
    cfg.blocking = 0; /* polled against the deadline below */
    call = "ncclCommInitRankConfig";
    r = api->nccl.CommInitRankConfig(&c->nccl, c->size, id, c->rank, &cfg);
  } else {
    call = "ncclCommInitRank";
    r = api->nccl.CommInitRank(&c->nccl, c->size, id, c->rank);
  }
  tcn_device_leave(c, prev);
  rc = tcn_comm_ready(c, r, call, deadline, err, errlen);
  if (rc != TC_OK) goto fail;
  *bcomm = c;
  return TC_OK;
fail:
  tcn_destroy(c);
  return rc;
}

/* ---- split ---- */

int tcn_split(void *parent, const int *ranks, size_t nranks,
              const tc_backend_init_args_t *ca, void **child, char *err,
              size_t errlen) {
  tcn_comm_t *p = parent;
  const tcn_api_t *api = p->api;
  *child = NULL;
  if (!api->nccl.CommSplit) {
    /* NCCL < 2.18: a new communicator from a new unique id, exchanged
     * through the child's own store */
    return nranks ? tcn_init(ca, child, err, errlen) : TC_OK;
  }
  int color = NCCL_SPLIT_NOCOLOR, key = 0;
  for (size_t i = 0; i < nranks; i++) {
    if (color == NCCL_SPLIT_NOCOLOR || ranks[i] < color) color = ranks[i];
    if (ranks[i] == p->rank) key = (int)i;
  }
  tcn_comm_t *c = NULL;
  int rc;
  if (nranks) {
    rc = tcn_comm_new(ca, api, p->device, &c, err, errlen);
    if (rc != TC_OK) return rc;
    c->blocking = p->blocking;
  }
  double timeout = ca && ca->timeout_s > 0 ? ca->timeout_s : p->timeout_s;
  double deadline = tcn_now() + timeout;
  pthread_mutex_lock(&p->mu);
  if (p->state != TCN_ACTIVE || !p->nccl) {
    pthread_mutex_unlock(&p->mu);
    snprintf(err, errlen, "the parent's NCCL communicator was aborted after "
             "an error (%s)", p->broken_msg[0] ? p->broken_msg : "aborted");
    tcn_destroy(c);
    return TC_ERR_ABORTED;
  }
  int prev = tcn_device_enter(p);
  ncclComm_t nc = NULL;
  /* config NULL: the child inherits the parent's (non-blocking) config */
  ncclResult_t r = api->nccl.CommSplit(p->nccl, color, key, &nc, NULL);
  if (r == ncclInProgress || (r == ncclSuccess && !p->blocking))
    r = tcn_wait_ready(p, p->nccl, deadline);
  tcn_device_leave(p, prev);
  pthread_mutex_unlock(&p->mu);
  if (!c) { /* this rank joins no group */
    if (nc) api->nccl.CommDestroy(nc);
    if (r == ncclSuccess) return TC_OK;
  } else {
    c->nccl = nc;
  }
  if (r != ncclSuccess && r != ncclInProgress) {
    if (r == ncclTimeout)
      snprintf(err, errlen, "ncclCommSplit did not finish within %.1f s (is "
               "every rank of the parent splitting?)", timeout);
    else
      snprintf(err, errlen, "ncclCommSplit failed: %s (%s)",
               tcn_result_name(r), api->nccl.GetErrorString(r));
    tcn_destroy(c);
    return r == ncclTimeout ? TC_ERR_TIMEOUT : TC_ERR_BACKEND;
  }
  if (!nc) {
    snprintf(err, errlen, "ncclCommSplit returned no communicator for color "
             "%d", color);
    tcn_destroy(c);
    return TC_ERR_INTERNAL;
  }
  rc = tcn_comm_ready(c, ncclInProgress, "ncclCommSplit", deadline, err,
                      errlen);
  if (rc != TC_OK) {
    tcn_destroy(c);
    return rc;
  }
  *child = c;
  return TC_OK;
}

/* ---- finalize, abort, destroy ---- */

int tcn_finalize(void *bcomm, char *err, size_t errlen) {
  tcn_comm_t *c = bcomm;
  const tcn_api_t *api = c->api;
  char msg[1536];
  pthread_mutex_lock(&c->mu);
  while (c->head) pthread_cond_wait(&c->idle_cv, &c->mu); /* poller bounds it */
  int state = c->state;
  if (state == TCN_ACTIVE) c->state = TCN_FINALIZED;
  pthread_mutex_unlock(&c->mu);
  tcn_stop_poller(c);
  if (state == TCN_BROKEN) {
    tcn_msg(c, "finalize", msg, sizeof msg, "an earlier operation failed and "
            "the NCCL communicator was aborted (%s)", c->broken_msg);
    return tcn_put_reason(err, errlen, c->broken_rc, msg);
  }
  if (state != TCN_ACTIVE) return TC_OK;
  int rc = TC_OK;
  pthread_mutex_lock(&c->mu);
  int prev = tcn_device_enter(c);
  if (c->nccl && api->nccl.CommFinalize) {
    ncclResult_t r = api->nccl.CommFinalize(c->nccl);
    if (r == ncclInProgress || (r == ncclSuccess && !c->blocking))
      r = tcn_wait_ready(c, c->nccl, tcn_now() + c->timeout_s);
    if (r != ncclSuccess) {
      tcn_msg(c, "finalize", msg, sizeof msg, "ncclCommFinalize %s (%s); the "
              "NCCL communicator was aborted",
              r == ncclTimeout ? "did not finish in time" : "failed",
              tcn_result_name(r));
      api->nccl.CommAbort(c->nccl);
      c->nccl = NULL;
      rc = tcn_put_reason(err, errlen, r == ncclTimeout ? TC_ERR_TIMEOUT : TC_ERR_BACKEND,
                         msg);
    }
  }
  if (c->nccl) api->nccl.CommDestroy(c->nccl);
  c->nccl = NULL;
  tcn_device_leave(c, prev);
  pthread_mutex_unlock(&c->mu);
  return rc;
}

int tcn_abort(void *bcomm) {
  tcn_comm_t *c = bcomm;
  atomic_store(&c->aborting, 1);
  tcn_rec_t *done = NULL, **tail = &done;
  pthread_mutex_lock(&c->mu);
  if (c->state == TCN_ACTIVE) c->state = TCN_ABORTED;
  if (c->nccl) {
    int prev = tcn_device_enter(c);
    c->api->nccl.CommAbort(c->nccl);
    c->nccl = NULL;
    tcn_device_leave(c, prev);
  }
  while (c->head) {
    tcn_rec_t *r = c->head;
    char buf[512];
    tcn_msg(c, tcn_op_name(r->type), buf, sizeof buf,
            "the communicator was aborted before the operation finished");
    r->rc = TC_ERR_ABORTED;
    r->msg = strdup(buf);
    tcn_pop_to(c, &tail);
  }
  pthread_cond_broadcast(&c->idle_cv);
  pthread_mutex_unlock(&c->mu);
  tcn_deliver(c, done);
  tcn_stop_poller(c);
  return TC_OK;
}

void tcn_destroy(void *bcomm) {
  tcn_comm_t *c = bcomm;
  if (!c) return;
  if (c->poller_started || c->head) tcn_abort(c); /* neither finalized nor aborted */
  const tcn_api_t *api = c->api;
  int prev = tcn_device_enter(c);
  if (c->nccl) api->nccl.CommAbort(c->nccl); /* a failed init */
  c->nccl = NULL;
  while (c->free_recs) {
    tcn_rec_t *r = c->free_recs;
    c->free_recs = r->next;
    api->cuda.EventDestroy(r->start);
    api->cuda.EventDestroy(r->end);
    free(r->msg);
    free(r);
  }
  if (c->dep) api->cuda.EventDestroy(c->dep);
  if (c->stream) api->cuda.StreamDestroy(c->stream);
  if (c->barrier_buf) api->cuda.Free(c->barrier_buf);
  tcn_rma_destroy(c);
  tcn_device_leave(c, prev);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  pthread_cond_destroy(&c->idle_cv);
  free(c);
}

/* Every operation; a dtype NCCL has (reductions are checked when posted,
 * with a sentence naming what NCCL lacks). */
int tcn_supports(void *bcomm, tc_op_type_t type, tc_dtype_t dt, int redop) {
  (void)bcomm;
  (void)redop;
  return (unsigned)type < TC_OP_TYPE_COUNT && (dt == TC_DTYPE_COUNT || tcn_dtype_size(dt) != 0);
}

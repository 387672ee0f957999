/* fake_nccl.c -- a fake NCCL for the nccl backend's tests (no GPU): the
 * entry points the backend loads, moving host memory between processes
 * through a communicator of our own `cpu` backend (it links
 * libtorchcomms.so, a second copy of the library in the process, which only
 * this fake uses).
 *
 *  - ncclGetUniqueId starts (once per process) a TCPStore server; the id
 *    carries its address and a random nonce. ncclCommInitRank(Config)
 *    connects to it and creates a cpu communicator under the prefix
 *    "fakenccl/<nonce>". With config.blocking = 0 that runs on a thread and
 *    the call returns ncclInProgress (ncclCommGetAsyncError tells when done).
 *  - ncclCommSplit publishes (color, key) in that store, reads everyone's
 *    and creates the child's cpu communicator, ordered by (key, rank).
 *  - Every collective, send and receive is a task on the caller's stream of
 *    the fake CUDA runtime (fake_cudart.c): group calls (ncclGroupStart/End)
 *    become one task; inside it consecutive sends and receives run as one
 *    batch, collectives in call order.
 *  - ncclCommAbort makes running and queued tasks of the communicator
 *    return at once (the cpu communicator is aborted).
 *
 * Fault injection, read when a communicator is created:
 *   TCFAKE_NCCL_FAULT=hang:N    the N-th task (1-based) of each communicator
 *                               never finishes (until ncclCommAbort)
 *   TCFAKE_NCCL_FAULT=remote:N  the N-th task reports ncclRemoteError
 *                               through ncclCommGetAsyncError, then hangs
 *   TCFAKE_NCCL_INPROGRESS=1    every group end / collective returns
 *                               ncclInProgress; the state reads
 *                               ncclInProgress for the next two polls
 *   TCFAKE_NCCL_VERSION=22703   what ncclGetVersion reports (the default;
 *                               ncclFloat8e4m3 / ncclFloat8e5m2 are
 *                               refused below 22400, as by NCCL < 2.24)
 *   TCFAKE_NCCL_TIMEOUT=120     seconds, the cpu communicators' timeout
 *                               (and how long ncclWaitSignal waits)
 * Windows and one-sided operations: fake_nccl_win.c (TCFAKE_NCCL_VERSION
 * below 22700 makes the backend refuse windows, below 22900 put/signal).
 * Built as build/fake_nccl/libtcfake_nccl.so (tests/c/test_nccl.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fake_nccl.h"

static char fk_global_error[512];

static double fk_timeout(void) {
  const char *v = getenv("TCFAKE_NCCL_TIMEOUT");
  double t = v && *v ? atof(v) : 120.0;
  return t > 0 ? t : 120.0;
}

void fk_err(struct ncclComm *c, const char *what, int rc) {
  char *buf = c ? c->last_error : fk_global_error;
  snprintf(buf, sizeof c->last_error, "fake NCCL: %s: %s (%s)", what,
           tc_last_error(), tc_status_name(rc));
}

/* ---- versions, errors ---- */

int fk_version(void) {
  const char *e = getenv("TCFAKE_NCCL_VERSION");
  return e && *e ? atoi(e) : 22703;
}

FK_API ncclResult_t ncclGetVersion(int *v) {
  *v = fk_version();
  return ncclSuccess;
}

FK_API const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclUnhandledCudaError: return "unhandled cuda error";
  case ncclSystemError: return "unhandled system error";
  case ncclInternalError: return "internal error";
  case ncclInvalidArgument: return "invalid argument";
  case ncclInvalidUsage: return "invalid usage";
  case ncclRemoteError: return "remote process exited or there was a network error";
  case ncclInProgress: return "NCCL operation in progress";
  default: return "unknown result code";
  }
}

FK_API const char *ncclGetLastError(ncclComm_t c) {
  return c && c->last_error[0] ? c->last_error : fk_global_error;
}

/* ---- unique id and creation ---- */

static pthread_mutex_t fk_server_mu = PTHREAD_MUTEX_INITIALIZER;
static tc_store_server_t *fk_server;

FK_API ncclResult_t ncclGetUniqueId(ncclUniqueId *out) {
  pthread_mutex_lock(&fk_server_mu);
  if (!fk_server && tc_store_server_start("127.0.0.1", 0, &fk_server) != TC_OK) {
    fk_err(NULL, "ncclGetUniqueId: starting the store", TC_ERR_SYSTEM);
    pthread_mutex_unlock(&fk_server_mu);
    return ncclSystemError;
  }
  int port = tc_store_server_port(fk_server);
  pthread_mutex_unlock(&fk_server_mu);
  static atomic_uint counter;
  fk_id_t id;
  memset(&id, 0, sizeof id);
  memcpy(id.magic, "TCFAKE01", 8);
  snprintf(id.host, sizeof id.host, "127.0.0.1");
  id.port = port;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  id.nonce = ((uint64_t)getpid() << 32) ^ (uint64_t)ts.tv_nsec ^
             ((uint64_t)atomic_fetch_add(&counter, 1) << 20);
  memset(out, 0, sizeof *out);
  memcpy(out->internal, &id, sizeof id);
  return ncclSuccess;
}

static void fk_knobs(struct ncclComm *c) {
  const char *f = getenv("TCFAKE_NCCL_FAULT");
  if (f && !strncmp(f, "hang:", 5)) {
    c->fault_kind = 1;
    c->fault_at = atoi(f + 5);
  } else if (f && !strncmp(f, "remote:", 7)) {
    c->fault_kind = 2;
    c->fault_at = atoi(f + 7);
  }
  const char *p = getenv("TCFAKE_NCCL_INPROGRESS");
  c->inprogress_knob = p && !strcmp(p, "1");
}

static struct ncclComm *fk_comm_new(int rank, int size, int blocking) {
  struct ncclComm *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->rank = rank;
  c->size = size;
  c->blocking = blocking;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  atomic_init(&c->state, ncclSuccess);
  fk_knobs(c);
  return c;
}

/* Connects c (rank, size, id, prefix set) and creates its cpu
 * communicator; sets c->state. */
static ncclResult_t fk_connect(struct ncclComm *c) {
  tc_store_t *root = NULL;
  int rc = tc_store_tcp_connect(c->id.host, c->id.port, fk_timeout(), &root);
  if (rc == TC_OK) {
    rc = tc_store_prefix(root, c->prefix, &c->store);
    tc_store_release(root);
  }
  if (rc == TC_OK) {
    tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
    o.name = "fakenccl";
    o.rank = c->rank;
    o.world_size = c->size;
    o.store = c->store;
    o.timeout_s = fk_timeout();
    o.abort_process_on_timeout_or_error = 0;
    rc = tc_comm_create("cpu", "cpu", &o, &c->cpu);
  }
  if (rc != TC_OK) {
    fk_err(c, "connecting the ranks", rc);
    atomic_store(&c->state, ncclSystemError);
    return ncclSystemError;
  }
  atomic_store(&c->state, ncclSuccess);
  return ncclSuccess;
}

static void *fk_connect_main(void *arg) {
  fk_connect(arg);
  return NULL;
}

static int fk_parse_blocking(const tcn_config_t *cfg, int dflt) {
  if (!cfg) return dflt;
  if (cfg->magic != NCCL_API_MAGIC) return -1;
  if (cfg->version < TCN_NCCL_VERSION(2, 14, 0) ||
      cfg->blocking == NCCL_CONFIG_UNDEF_INT)
    return 1;
  return cfg->blocking != 0;
}

/* Starts fk_connect on a thread (non-blocking) or runs it. */
static ncclResult_t fk_start(struct ncclComm *c) {
  if (c->blocking) return fk_connect(c);
  atomic_store(&c->state, ncclInProgress);
  if (pthread_create(&c->bg, NULL, fk_connect_main, c) != 0) {
    atomic_store(&c->state, ncclSystemError);
    return ncclSystemError;
  }
  c->bg_started = 1;
  return ncclInProgress;
}

FK_API ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks,
                                           ncclUniqueId id, int rank,
                                           tcn_config_t *cfg) {
  fk_id_t fid;
  memcpy(&fid, id.internal, sizeof fid);
  int blocking = fk_parse_blocking(cfg, 1);
  if (!out || nranks <= 0 || rank < 0 || rank >= nranks || blocking < 0 ||
      memcmp(fid.magic, "TCFAKE01", 8)) {
    snprintf(fk_global_error, sizeof fk_global_error,
             "fake NCCL: ncclCommInitRankConfig: invalid argument");
    return ncclInvalidArgument;
  }
  struct ncclComm *c = fk_comm_new(rank, nranks, blocking);
  if (!c) return ncclSystemError;
  c->id = fid;
  snprintf(c->prefix, sizeof c->prefix, "fakenccl/%016llx",
           (unsigned long long)fid.nonce);
  *out = c;
  ncclResult_t r = fk_start(c);
  return r;
}

FK_API ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks,
                                     ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(out, nranks, id, rank, NULL);
}

/* ---- split ---- */

/* The child's side of a split (on bg for a non-blocking one). */
static ncclResult_t fk_split_connect(struct ncclComm *c, tc_store_t *pstore) {
  int n = c->psize, members = 0, me = -1;
  int *colors = calloc((size_t)n, sizeof *colors),
      *keys = calloc((size_t)n, sizeof *keys);
  int rc = colors && keys ? TC_OK : TC_ERR_NOMEM;
  for (int r = 0; r < n && rc == TC_OK; r++) {
    char k[96];
    snprintf(k, sizeof k, "split/%d/%d", c->split_no, r);
    void *v = NULL;
    size_t len = 0;
    rc = tc_store_get(pstore, k, &v, &len, fk_timeout());
    if (rc == TC_OK && len == 2 * sizeof(int)) {
      memcpy(&colors[r], v, sizeof(int));
      memcpy(&keys[r], (char *)v + sizeof(int), sizeof(int));
    }
    tc_free(v);
  }
  if (rc == TC_OK) { /* new rank: order by (key, parent rank) */
    int myr = c->prank;
    for (int r = 0; r < n; r++) {
      if (colors[r] != c->color) continue;
      members++;
      if (keys[r] < c->key || (keys[r] == c->key && r < myr)) me++;
    }
    me++;
  }
  free(colors);
  free(keys);
  if (rc != TC_OK) {
    fk_err(c, "ncclCommSplit: reading the colors", rc);
    atomic_store(&c->state, ncclSystemError);
    return ncclSystemError;
  }
  c->rank = me;
  c->size = members;
  return fk_connect(c);
}

typedef struct fk_split_arg {
  struct ncclComm *c;
  tc_store_t *pstore;
} fk_split_arg_t;

static void *fk_split_main(void *arg) {
  fk_split_arg_t *a = arg;
  fk_split_connect(a->c, a->pstore);
  tc_store_release(a->pstore);
  free(a);
  return NULL;
}

FK_API ncclResult_t ncclCommSplit(ncclComm_t p, int color, int key,
                                  ncclComm_t *out, tcn_config_t *cfg) {
  if (!p || !out || !p->cpu) return ncclInvalidArgument;
  int blocking = fk_parse_blocking(cfg, p->blocking);
  if (blocking < 0) return ncclInvalidArgument;
  int no = ++p->splits;
  char k[96];
  int v[2] = {color, key};
  snprintf(k, sizeof k, "split/%d/%d", no, p->rank);
  int rc = tc_store_set(p->store, k, v, sizeof v);
  if (rc != TC_OK) {
    fk_err(p, "ncclCommSplit: publishing the color", rc);
    return ncclSystemError;
  }
  *out = NULL;
  if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
  struct ncclComm *c = fk_comm_new(-1, -1, blocking);
  if (!c) return ncclSystemError;
  c->id = p->id;
  c->prank = p->rank;
  c->psize = p->size;
  c->split_no = no;
  c->color = color;
  c->key = key;
  snprintf(c->prefix, sizeof c->prefix, "%.200s/s%d/c%d", p->prefix, no, color);
  /* rank and size are known once every color was read */
  *out = c;
  if (blocking) return fk_split_connect(c, p->store);
  fk_split_arg_t *a = malloc(sizeof *a);
  if (!a) return ncclSystemError;
  a->c = c;
  a->pstore = p->store;
  tc_store_retain(p->store);
  atomic_store(&c->state, ncclInProgress);
  if (pthread_create(&c->bg, NULL, fk_split_main, a) != 0) {
    tc_store_release(a->pstore);
    free(a);
    atomic_store(&c->state, ncclSystemError);
    return ncclSystemError;
  }
  c->bg_started = 1;
  return ncclInProgress;
}

/* ---- state ---- */

FK_API ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *st) {
  if (!c || !st) return ncclInvalidArgument;
  int busy = atomic_load(&c->busy_polls);
  if (busy > 0 && atomic_load(&c->state) == ncclSuccess) {
    atomic_fetch_sub(&c->busy_polls, 1);
    *st = ncclInProgress;
    return ncclSuccess;
  }
  *st = (ncclResult_t)atomic_load(&c->state);
  return ncclSuccess;
}

FK_API ncclResult_t ncclCommCount(const ncclComm_t c, int *n) {
  if (!c || atomic_load(&c->state) == ncclInProgress) return ncclInvalidUsage;
  *n = c->size;
  return ncclSuccess;
}

FK_API ncclResult_t ncclCommUserRank(const ncclComm_t c, int *r) {
  if (!c || atomic_load(&c->state) == ncclInProgress) return ncclInvalidUsage;
  *r = c->rank;
  return ncclSuccess;
}

FK_API ncclResult_t ncclCommCuDevice(const ncclComm_t c, int *d) {
  (void)c;
  return cudaGetDevice(d) == cudaSuccess ? ncclSuccess : ncclInvalidUsage;
}

/* ---- premultiplied sums ---- */

static double fk_half_to_double(uint16_t h) {
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v = e == 0 ? m / 1024.0 / 16384.0
                    : (1.0 + m / 1024.0) * (double)(1u << e) / 32768.0;
  return (h & 0x8000) ? -v : v;
}

/* float8_e4m3fn -> double (finite values: a factor is finite). */
static double fk_e4m3_to_double(uint8_t x) {
  int e = (x >> 3) & 0xf, m = x & 7;
  double v = e == 0 ? m / 512.0 : (1.0 + m / 8.0) * (double)(1u << e) / 128.0;
  return (x & 0x80) ? -v : v;
}

FK_API ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar,
                                             ncclDataType_t dt,
                                             ncclScalarResidence_t where,
                                             ncclComm_t c) {
  if (!c || !op || !scalar || where != ncclScalarHostImmediate)
    return ncclInvalidArgument;
  double f;
  switch (dt) {
  case ncclFloat32: { float x; memcpy(&x, scalar, sizeof x); f = x; break; }
  case ncclFloat64: memcpy(&f, scalar, sizeof f); break;
  case ncclFloat16: { uint16_t h; memcpy(&h, scalar, 2); f = fk_half_to_double(h); break; }
  case ncclBfloat16: {
    uint16_t h;
    memcpy(&h, scalar, 2);
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    f = x;
    break;
  }
  case ncclFloat8e4m3:
  case ncclFloat8e5m2: {
    uint8_t b;
    memcpy(&b, scalar, 1);
    if (fk_version() < 22400) return ncclInvalidArgument;
    f = dt == ncclFloat8e4m3 ? fk_e4m3_to_double(b)
                             : fk_half_to_double((uint16_t)(b << 8));
    break;
  }
  default: return ncclInvalidArgument;
  }
  pthread_mutex_lock(&c->mu);
  int i = 0;
  while (i < FK_MAX_PREMUL && c->premul_used[i]) i++;
  if (i == FK_MAX_PREMUL) {
    pthread_mutex_unlock(&c->mu);
    return ncclInternalError;
  }
  c->premul_used[i] = 1;
  c->premul[i] = f;
  pthread_mutex_unlock(&c->mu);
  *op = (ncclRedOp_t)(ncclNumOps + i);
  return ncclSuccess;
}

FK_API ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t c) {
  int i = (int)op - ncclNumOps;
  if (!c || i < 0 || i >= FK_MAX_PREMUL || !c->premul_used[i])
    return ncclInvalidArgument;
  pthread_mutex_lock(&c->mu);
  c->premul_used[i] = 0;
  pthread_mutex_unlock(&c->mu);
  return ncclSuccess;
}

/* ---- finalize, destroy, abort ---- */

void fk_drain(struct ncclComm *c) {
  pthread_mutex_lock(&c->mu);
  while (c->inflight > 0) pthread_cond_wait(&c->cv, &c->mu);
  pthread_mutex_unlock(&c->mu);
}

/* Waits for the creating thread, if any. */
static void fk_join_bg(struct ncclComm *c) {
  if (c->bg_started) pthread_join(c->bg, NULL);
  c->bg_started = 0;
}

static void fk_free(struct ncclComm *c) {
  if (c->cpu) tc_comm_destroy(c->cpu); /* aborts it unless finalized */
  fk_rma_free(c);
  if (c->store) tc_store_release(c->store);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  free(c);
}

FK_API ncclResult_t ncclCommFinalize(ncclComm_t c) {
  if (!c) return ncclInvalidArgument;
  fk_join_bg(c);
  fk_drain(c);
  if (c->cpu) {
    int rc = tc_comm_finalize(c->cpu);
    if (rc != TC_OK) {
      fk_err(c, "ncclCommFinalize", rc);
      atomic_store(&c->state, ncclSystemError);
      return ncclSystemError;
    }
  }
  if (c->blocking) return ncclSuccess;
  atomic_store(&c->busy_polls, 1); /* "in progress" for one more poll */
  return ncclInProgress;
}

FK_API ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (!c) return ncclInvalidArgument;
  fk_join_bg(c);
  fk_drain(c);
  fk_free(c);
  return ncclSuccess;
}

FK_API ncclResult_t ncclCommAbort(ncclComm_t c) {
  if (!c) return ncclSuccess;
  atomic_store(&c->aborted, 1);
  if (c->bg_started && atomic_load(&c->state) == ncclInProgress) {
    /* still connecting (bounded by TCFAKE_NCCL_TIMEOUT): let it finish on
     * its own and leak it, as a real abort cannot wait either */
    pthread_detach(c->bg);
    return ncclSuccess;
  }
  fk_join_bg(c);
  if (c->cpu) tc_comm_abort(c->cpu); /* running tasks fail at once */
  fk_drain(c);
  fk_free(c);
  return ncclSuccess;
}

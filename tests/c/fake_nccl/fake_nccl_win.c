/* fake_nccl_win.c -- the fake NCCL's windows and host-initiated one-sided
 * operations (NCCL 2.27 / 2.29 API), with real semantics on host memory
 * shared between the test's processes:
 *
 *  - ncclMemAlloc: a memfd mapped MAP_SHARED (zeroed); ncclMemFree unmaps it.
 *  - ncclCommWindowRegister (collective): the buffer must lie in memory of
 *    ncclMemAlloc and have the same size on every rank (NCCL's symmetric
 *    windows); each rank publishes (pid, fd, offset, size) in the
 *    communicator's store and maps every peer's memory through
 *    /proc/<pid>/fd/<fd>. The first registration also creates and maps the
 *    communicator's signal counters: one uint64 per (target, origin), in the
 *    target's memfd.
 *  - ncclGetPeerDevicePointer: the peer's memory mapped here
 *    (TCFAKE_NCCL_PEER_PTR=0: refused, as for a peer outside the NVLink
 *    domain).
 *  - ncclPutSignal: a task on the stream: memcpy into the peer's mapping,
 *    then the peer's counter for this rank += 1 (release order). The source
 *    must lie in a window registered on the communicator, as in NCCL.
 *  - ncclWaitSignal: a task on the stream that waits until this rank's
 *    counter of each peer reaches the signals waited for so far (polled,
 *    until ncclCommAbort or TCFAKE_NCCL_TIMEOUT).
 * What ncclGetVersion reports (TCFAKE_NCCL_VERSION) decides what the
 * backend uses: below 22700 no windows, below 22900 no put/signal.
 */
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "fake_nccl.h"

/* ---- ncclMemAlloc ---- */

typedef struct fk_alloc {
  char *p;
  size_t size;
  int fd;
  struct fk_alloc *next;
} fk_alloc_t;

static pthread_mutex_t fk_alloc_mu = PTHREAD_MUTEX_INITIALIZER;
static fk_alloc_t *fk_allocs;

/* A shared mapping of a new memfd of `size` bytes. */
static char *fk_shared(size_t size, int *fd) {
  *fd = memfd_create("tcfake-nccl", MFD_CLOEXEC);
  if (*fd < 0) return NULL;
  if (ftruncate(*fd, (off_t)size) != 0) {
    close(*fd);
    return NULL;
  }
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
  if (p == MAP_FAILED) {
    close(*fd);
    return NULL;
  }
  return p;
}

FK_API ncclResult_t ncclMemAlloc(void **ptr, size_t size) {
  if (!ptr) return ncclInvalidArgument;
  fk_alloc_t *a = calloc(1, sizeof *a);
  if (!a) return ncclSystemError;
  a->size = size ? size : 1;
  a->p = fk_shared(a->size, &a->fd);
  if (!a->p) {
    free(a);
    return ncclSystemError;
  }
  pthread_mutex_lock(&fk_alloc_mu);
  a->next = fk_allocs;
  fk_allocs = a;
  pthread_mutex_unlock(&fk_alloc_mu);
  *ptr = a->p;
  return ncclSuccess;
}

FK_API ncclResult_t ncclMemFree(void *ptr) {
  pthread_mutex_lock(&fk_alloc_mu);
  fk_alloc_t **pp = &fk_allocs;
  while (*pp && (*pp)->p != ptr) pp = &(*pp)->next;
  fk_alloc_t *a = *pp;
  if (a) *pp = a->next;
  pthread_mutex_unlock(&fk_alloc_mu);
  if (!a) return ncclInvalidArgument;
  munmap(a->p, a->size);
  close(a->fd);
  free(a);
  return ncclSuccess;
}

/* The allocation holding [p, p + n), copied into *out. */
static int fk_alloc_find(const void *p, size_t n, fk_alloc_t *out) {
  int found = 0;
  pthread_mutex_lock(&fk_alloc_mu);
  for (fk_alloc_t *a = fk_allocs; a; a = a->next)
    if ((const char *)p >= a->p && (const char *)p + n <= a->p + a->size) {
      *out = *a;
      found = 1;
      break;
    }
  pthread_mutex_unlock(&fk_alloc_mu);
  return found;
}

/* ---- windows ---- */

struct ncclWindow_vidmem {
  struct ncclComm *c;
  char *base;
  size_t size;
  char **peer_base; /* [n] */
  char **peer_map;  /* [n] the mappings to unmap (NULL for this rank) */
  size_t *peer_map_len;
  struct ncclWindow_vidmem *next;
};

typedef struct fk_rma {
  int regs; /* registrations so far: the store keys */
  int sig_fd;
  uint64_t *sig;       /* [n] this rank's counters, by origin */
  uint64_t **peer_sig; /* [n] each target's counters */
  size_t sig_bytes;
  uint64_t *expected; /* [n] signals waited for, by origin */
  struct ncclWindow_vidmem *wins;
} fk_rma_t;

typedef struct fk_rec {
  int pid, fd, sig_fd, pad;
  uint64_t alloc_size, offset, size, sig_bytes;
} fk_rec_t;

static char *fk_map_peer(int pid, int fd, size_t len) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, fd);
  int f = open(path, O_RDWR | O_CLOEXEC);
  if (f < 0) return NULL;
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
  close(f);
  return p == MAP_FAILED ? NULL : p;
}

static void fk_win_free(struct ncclWindow_vidmem *w) {
  for (int p = 0; w->peer_map && p < w->c->size; p++)
    if (w->peer_map[p]) munmap(w->peer_map[p], w->peer_map_len[p]);
  free(w->peer_base);
  free(w->peer_map);
  free(w->peer_map_len);
  free(w);
}

void fk_rma_free(struct ncclComm *c) {
  fk_rma_t *r = c->rma;
  if (!r) return;
  while (r->wins) {
    struct ncclWindow_vidmem *w = r->wins;
    r->wins = w->next;
    fk_win_free(w);
  }
  for (int p = 0; r->peer_sig && p < c->size; p++)
    if (r->peer_sig[p] && r->peer_sig[p] != r->sig) munmap(r->peer_sig[p], r->sig_bytes);
  if (r->sig) {
    munmap(r->sig, r->sig_bytes);
    close(r->sig_fd);
  }
  free(r->peer_sig);
  free(r->expected);
  free(r);
  c->rma = NULL;
}

static ncclResult_t fk_bad(struct ncclComm *c, ncclResult_t r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ncclResult_t fk_bad(struct ncclComm *c, ncclResult_t r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int l = snprintf(c->last_error, sizeof c->last_error, "fake NCCL: ");
  vsnprintf(c->last_error + l, sizeof c->last_error - (size_t)l, fmt, ap);
  va_end(ap);
  return r;
}

static int fk_usable(struct ncclComm *c) {
  return c && c->cpu && atomic_load(&c->state) == ncclSuccess && !atomic_load(&c->aborted);
}

FK_API ncclResult_t ncclCommWindowRegister(ncclComm_t c, void *buff, size_t size,
                                           ncclWindow_t *win, int flags) {
  (void)flags;
  if (!c || !win) return ncclInvalidArgument;
  if (!fk_usable(c)) return fk_bad(c, ncclInvalidUsage, "ncclCommWindowRegister: the "
                                   "communicator is not ready");
  fk_alloc_t a;
  if (!buff || !fk_alloc_find(buff, size, &a))
    return fk_bad(c, ncclInvalidArgument, "ncclCommWindowRegister: the buffer %p (%zu "
                  "bytes) is not memory of ncclMemAlloc", buff, size);
  const int n = c->size, me = c->rank;
  fk_rma_t *r = c->rma;
  if (!r) {
    r = calloc(1, sizeof *r);
    if (!r) return ncclSystemError;
    c->rma = r;
    r->peer_sig = calloc((size_t)n, sizeof *r->peer_sig);
    r->expected = calloc((size_t)n, sizeof *r->expected);
    r->sig_bytes = (size_t)n * sizeof(uint64_t);
    r->sig = (uint64_t *)fk_shared(r->sig_bytes, &r->sig_fd);
    if (!r->peer_sig || !r->expected || !r->sig) {
      if (!r->sig) r->sig_bytes = 0;
      fk_rma_free(c);
      return ncclSystemError;
    }
  }
  int first = r->regs == 0;
  int no = r->regs++;
  struct ncclWindow_vidmem *w = calloc(1, sizeof *w);
  if (w) {
    w->c = c;
    w->base = buff;
    w->size = size;
    w->peer_base = calloc((size_t)n, sizeof *w->peer_base);
    w->peer_map = calloc((size_t)n, sizeof *w->peer_map);
    w->peer_map_len = calloc((size_t)n, sizeof *w->peer_map_len);
  }
  if (!w || !w->peer_base || !w->peer_map || !w->peer_map_len) {
    if (w) fk_win_free(w);
    return ncclSystemError;
  }
  fk_rec_t mine = {.pid = getpid(), .fd = a.fd, .sig_fd = r->sig_fd,
                   .alloc_size = a.size, .offset = (uint64_t)((char *)buff - a.p),
                   .size = size, .sig_bytes = r->sig_bytes};
  char key[64];
  snprintf(key, sizeof key, "win/%d/%d", no, me);
  int rc = tc_store_set(c->store, key, &mine, sizeof mine);
  ncclResult_t res = ncclSuccess;
  for (int p = 0; p < n && rc == TC_OK && res == ncclSuccess; p++) {
    fk_rec_t rec;
    if (p == me) {
      rec = mine;
    } else {
      void *v = NULL;
      size_t len = 0;
      snprintf(key, sizeof key, "win/%d/%d", no, p);
      rc = tc_store_get(c->store, key, &v, &len, 120.0);
      if (rc != TC_OK) break;
      if (len != sizeof rec) res = ncclInternalError;
      else memcpy(&rec, v, sizeof rec);
      tc_free(v);
      if (res != ncclSuccess) break;
    }
    if (rec.size != size) {
      res = fk_bad(c, ncclInvalidArgument, "ncclCommWindowRegister: rank %d registers "
                   "%llu bytes and rank %d %zu: a symmetric window has one size", p,
                   (unsigned long long)rec.size, me, size);
      break;
    }
    if (p == me) {
      w->peer_base[p] = buff;
      if (first) r->peer_sig[p] = r->sig;
      continue;
    }
    w->peer_map[p] = fk_map_peer(rec.pid, rec.fd, rec.alloc_size);
    w->peer_map_len[p] = rec.alloc_size;
    if (first) r->peer_sig[p] = (uint64_t *)fk_map_peer(rec.pid, rec.sig_fd, rec.sig_bytes);
    if (!w->peer_map[p] || !r->peer_sig[p]) {
      res = fk_bad(c, ncclSystemError, "ncclCommWindowRegister: cannot map rank %d's "
                   "memory (pid %d)", p, rec.pid);
      break;
    }
    w->peer_base[p] = w->peer_map[p] + rec.offset;
  }
  if (rc != TC_OK) {
    fk_err(c, "ncclCommWindowRegister: exchanging the windows", rc);
    res = ncclSystemError;
  }
  if (res != ncclSuccess) {
    fk_win_free(w);
    return res;
  }
  w->next = r->wins;
  r->wins = w;
  *win = w;
  return ncclSuccess;
}

FK_API ncclResult_t ncclCommWindowDeregister(ncclComm_t c, ncclWindow_t win) {
  if (!c || !win || !c->rma) return ncclInvalidArgument;
  fk_drain(c); /* nothing queued still reaches it */
  struct ncclWindow_vidmem **pp = &c->rma->wins;
  while (*pp && *pp != win) pp = &(*pp)->next;
  if (!*pp) return fk_bad(c, ncclInvalidArgument, "ncclCommWindowDeregister: unknown window");
  *pp = win->next;
  fk_win_free(win);
  return ncclSuccess;
}

FK_API ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t win, size_t offset, int peer,
                                             void **out) {
  const char *k = getenv("TCFAKE_NCCL_PEER_PTR");
  if (!win || !out || peer < 0 || peer >= win->c->size || offset > win->size)
    return ncclInvalidArgument;
  if (k && !strcmp(k, "0") && peer != win->c->rank) return ncclInvalidArgument;
  *out = win->peer_base[peer] + offset;
  return ncclSuccess;
}

/* ---- one-sided operations ---- */

typedef struct fk_rma_task {
  struct ncclComm *c;
  int kind; /* 0 put+signal, 1 wait */
  char *dst;
  const char *src;
  size_t bytes;
  uint64_t *counter; /* put: the target's counter of this rank */
  int nwait;
  int *peers;
  uint64_t *targets;
} fk_rma_task_t;

static void fk_task_done(fk_rma_task_t *t) {
  struct ncclComm *c = t->c;
  pthread_mutex_lock(&c->mu);
  c->inflight--;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  free(t->peers);
  free(t->targets);
  free(t);
}

static double fk_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void fk_rma_run(void *arg) {
  fk_rma_task_t *t = arg;
  struct ncclComm *c = t->c;
  if (atomic_load(&c->aborted)) goto out;
  if (t->kind == 0) {
    if (t->bytes) memcpy(t->dst, t->src, t->bytes);
    __atomic_fetch_add(t->counter, 1, __ATOMIC_RELEASE);
    goto out;
  }
  const char *tv = getenv("TCFAKE_NCCL_TIMEOUT");
  double limit = fk_now() + (tv && *tv ? atof(tv) : 120.0);
  for (int i = 0; i < t->nwait; i++) {
    long us = 1;
    while (__atomic_load_n(&c->rma->sig[t->peers[i]], __ATOMIC_ACQUIRE) < t->targets[i]) {
      if (atomic_load(&c->aborted)) goto out;
      if (fk_now() > limit) {
        snprintf(c->last_error, sizeof c->last_error, "fake NCCL: ncclWaitSignal: no "
                 "signal of rank %d within TCFAKE_NCCL_TIMEOUT", t->peers[i]);
        atomic_store(&c->state, ncclSystemError);
        goto out;
      }
      struct timespec ts = {0, us * 1000};
      nanosleep(&ts, NULL);
      if (us < 1000) us *= 2;
    }
  }
out:
  fk_task_done(t);
}

static ncclResult_t fk_rma_submit(fk_rma_task_t *t, cudaStream_t s) {
  struct ncclComm *c = t->c;
  pthread_mutex_lock(&c->mu);
  c->inflight++;
  pthread_mutex_unlock(&c->mu);
  if (tcfake_stream_enqueue(s, fk_rma_run, t) != cudaSuccess) {
    fk_task_done(t);
    return ncclUnhandledCudaError;
  }
  return ncclSuccess;
}

/* The registered window of c holding [p, p + n), or NULL. */
static struct ncclWindow_vidmem *fk_win_of(struct ncclComm *c, const void *p, size_t n) {
  for (struct ncclWindow_vidmem *w = c->rma ? c->rma->wins : NULL; w; w = w->next)
    if ((const char *)p >= w->base && (const char *)p + n <= w->base + w->size) return w;
  return NULL;
}

static size_t fk_type_size(ncclDataType_t d) {
  switch (d) {
  case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
  case ncclFloat16: case ncclBfloat16: return 2;
  case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
  case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
  default: return 0;
  }
}

FK_API ncclResult_t ncclPutSignal(const void *src, size_t count, ncclDataType_t dt, int peer,
                                  ncclWindow_t peer_win, size_t peer_off, int sig_idx, int ctx,
                                  unsigned int flags, ncclComm_t c, cudaStream_t s) {
  if (!c) return ncclInvalidArgument;
  if (!fk_usable(c) || !c->rma) return fk_bad(c, ncclInvalidUsage, "ncclPutSignal: no window "
                                              "was registered, or the communicator is not ready");
  size_t es = fk_type_size(dt), bytes = count * es;
  struct ncclWindow_vidmem *w = c->rma->wins;
  while (w && w != peer_win) w = w->next;
  if (!w || !es || peer < 0 || peer >= c->size || sig_idx || ctx || flags ||
      peer_off > w->size || bytes > w->size - peer_off)
    return fk_bad(c, ncclInvalidArgument, "ncclPutSignal: invalid argument (peer %d, "
                  "offset %zu, %zu bytes, window %p)", peer, peer_off, bytes, (void *)peer_win);
  if (bytes && !fk_win_of(c, src, bytes))
    return fk_bad(c, ncclInvalidArgument, "ncclPutSignal: the source %p (%zu bytes) is not "
                  "in a window registered on this communicator", src, bytes);
  fk_rma_task_t *t = calloc(1, sizeof *t);
  if (!t) return ncclSystemError;
  t->c = c;
  t->kind = 0;
  t->dst = w->peer_base[peer] + peer_off;
  t->src = src;
  t->bytes = bytes;
  t->counter = &c->rma->peer_sig[peer][c->rank];
  return fk_rma_submit(t, s);
}

FK_API ncclResult_t ncclSignal(int peer, int sig_idx, int ctx, unsigned int flags,
                               ncclComm_t c, cudaStream_t s) {
  if (!c) return ncclInvalidArgument;
  if (!fk_usable(c) || !c->rma || peer < 0 || peer >= c->size || sig_idx || ctx || flags)
    return fk_bad(c, ncclInvalidArgument, "ncclSignal: invalid argument or no window");
  fk_rma_task_t *t = calloc(1, sizeof *t);
  if (!t) return ncclSystemError;
  t->c = c;
  t->counter = &c->rma->peer_sig[peer][c->rank];
  return fk_rma_submit(t, s);
}

FK_API ncclResult_t ncclWaitSignal(int ndesc, ncclWaitSignalDesc_t *d, ncclComm_t c,
                                   cudaStream_t s) {
  if (!c) return ncclInvalidArgument;
  if (!fk_usable(c) || !c->rma || ndesc <= 0 || !d)
    return fk_bad(c, ncclInvalidArgument, "ncclWaitSignal: invalid argument or no window");
  for (int i = 0; i < ndesc; i++)
    if (d[i].peer < 0 || d[i].peer >= c->size || d[i].opCnt < 0 || d[i].sigIdx || d[i].ctx)
      return fk_bad(c, ncclInvalidArgument, "ncclWaitSignal: invalid descriptor %d (peer "
                    "%d, opCnt %d)", i, d[i].peer, d[i].opCnt);
  fk_rma_task_t *t = calloc(1, sizeof *t);
  if (t) {
    t->peers = calloc((size_t)ndesc, sizeof *t->peers);
    t->targets = calloc((size_t)ndesc, sizeof *t->targets);
  }
  if (!t || !t->peers || !t->targets) {
    if (t) {
      free(t->peers);
      free(t->targets);
    }
    free(t);
    return ncclSystemError;
  }
  t->c = c;
  t->kind = 1;
  t->nwait = ndesc;
  for (int i = 0; i < ndesc; i++) { /* counted when called, as NCCL does */
    c->rma->expected[d[i].peer] += (uint64_t)d[i].opCnt;
    t->peers[i] = d[i].peer;
    t->targets[i] = c->rma->expected[d[i].peer];
  }
  return fk_rma_submit(t, s);
}

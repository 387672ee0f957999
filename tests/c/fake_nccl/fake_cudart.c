/* fake_cudart.c -- a fake CUDA runtime for the nccl backend's tests (no
 * GPU): "device memory" is host memory, a stream is a FIFO of tasks run in
 * order by the stream's own thread, an event is a pair of counters (how
 * many records were queued, how many have run). The default stream (NULL,
 * cudaStreamLegacy, cudaStreamPerThread) is one process-wide stream.
 *
 * Semantics kept from CUDA: cudaEventRecord captures the work queued on the
 * stream so far (a later record supersedes it); cudaStreamWaitEvent makes the
 * stream wait for the record current at the call; cudaEventQuery is
 * cudaErrorNotReady until that record ran (cudaSuccess if never recorded);
 * cudaStreamDestroy returns once the queued work ran.
 *
 * Settings: TCFAKE_CUDA_DEVICES (default 8) devices; TCFAKE_CUDA_DEVICES=0
 * makes cudaGetDeviceCount fail with cudaErrorNoDevice.
 * Built as build/fake_nccl/libtcfake_cudart.so (tests/c/test_nccl.c).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cuda.h"

#define cudaErrorInvalidValue 1
#define cudaErrorMemoryAllocation 2
#define cudaErrorNoDevice 100
#define cudaErrorInvalidDevice 101
#define cudaErrorInvalidResourceHandle 400

typedef struct fk_task {
  void (*fn)(void *);
  void *arg;
  struct fk_task *next;
} fk_task_t;

struct CUstream_st {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  fk_task_t *head, *tail;
  int stop;
  pthread_t thread;
};

struct CUevent_st {
  uint64_t recorded;  /* records queued */
  uint64_t completed; /* highest record that ran */
};

/* Every event change: one lock and one condition for all waits. */
static pthread_mutex_t fk_ev_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fk_ev_cv = PTHREAD_COND_INITIALIZER;
static __thread int fk_device;
static struct CUstream_st *fk_default;
static pthread_once_t fk_default_once = PTHREAD_ONCE_INIT;

static void *fk_stream_main(void *arg) {
  struct CUstream_st *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    fk_task_t *t = s->head;
    if (!t) {
      if (s->stop) break;
      pthread_cond_wait(&s->cv, &s->mu);
      continue;
    }
    pthread_mutex_unlock(&s->mu);
    t->fn(t->arg);
    pthread_mutex_lock(&s->mu);
    s->head = t->next; /* popped after it ran: an empty queue means idle */
    if (!s->head) s->tail = NULL;
    free(t);
    pthread_cond_broadcast(&s->cv);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

static struct CUstream_st *fk_stream_new(void) {
  struct CUstream_st *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  if (pthread_create(&s->thread, NULL, fk_stream_main, s) != 0) {
    free(s);
    return NULL;
  }
  return s;
}

static void fk_default_init(void) { fk_default = fk_stream_new(); }

static struct CUstream_st *fk_stream(cudaStream_t s) {
  if ((uintptr_t)s <= 2) { /* NULL, cudaStreamLegacy, cudaStreamPerThread */
    pthread_once(&fk_default_once, fk_default_init);
    return fk_default;
  }
  return s;
}

cudaError_t tcfake_stream_enqueue(cudaStream_t stream, void (*fn)(void *),
                                  void *arg) {
  struct CUstream_st *s = fk_stream(stream);
  if (!s) return cudaErrorInvalidResourceHandle;
  fk_task_t *t = malloc(sizeof *t);
  if (!t) return cudaErrorMemoryAllocation;
  t->fn = fn;
  t->arg = arg;
  t->next = NULL;
  pthread_mutex_lock(&s->mu);
  if (s->tail) s->tail->next = t;
  else s->head = t;
  s->tail = t;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return cudaSuccess;
}

/* ---- devices and memory ---- */

static int fk_ndev(void) {
  const char *v = getenv("TCFAKE_CUDA_DEVICES");
  return v && *v ? atoi(v) : 8;
}

TCFAKE_API cudaError_t cudaGetDeviceCount(int *n) {
  *n = fk_ndev();
  return *n > 0 ? cudaSuccess : cudaErrorNoDevice;
}

cudaError_t cudaSetDevice(int d) {
  if (d < 0 || d >= fk_ndev()) return cudaErrorInvalidDevice;
  fk_device = d;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *d) {
  *d = fk_device;
  return cudaSuccess;
}

TCFAKE_API cudaError_t cudaMalloc(void **p, size_t n) {
  *p = calloc(1, n ? n : 1);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

TCFAKE_API cudaError_t cudaFree(void *p) {
  free(p);
  return cudaSuccess;
}

/* Managed memory is host memory too. */
TCFAKE_API cudaError_t cudaMallocManaged(void **p, size_t n, unsigned flags) {
  (void)flags;
  return cudaMalloc(p, n);
}

TCFAKE_API cudaError_t cudaMemset(void *p, int v, size_t n) {
  memset(p, v, n);
  return cudaSuccess;
}

TCFAKE_API const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorNoDevice: return "no CUDA-capable device is detected";
  case cudaErrorInvalidDevice: return "invalid device ordinal";
  case cudaErrorInvalidResourceHandle: return "invalid resource handle";
  case cudaErrorNotReady: return "device not ready";
  default: return "unknown error";
  }
}

/* ---- streams ---- */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned int flags) {
  (void)flags;
  *out = fk_stream_new();
  return *out ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if ((uintptr_t)stream <= 2) return cudaErrorInvalidResourceHandle;
  struct CUstream_st *s = stream;
  pthread_mutex_lock(&s->mu);
  s->stop = 1;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL); /* after the queued work ran */
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  struct CUstream_st *s = fk_stream(stream);
  if (!s) return cudaErrorInvalidResourceHandle;
  pthread_mutex_lock(&s->mu);
  while (s->head) pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  return cudaSuccess;
}

/* ---- events ---- */

TCFAKE_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *out,
                                                unsigned int flags) {
  (void)flags;
  *out = calloc(1, sizeof **out);
  return *out ? cudaSuccess : cudaErrorMemoryAllocation;
}

TCFAKE_API cudaError_t cudaEventDestroy(cudaEvent_t ev) {
  /* CUDA releases a pending event once its record ran; here a queued record
   * task would touch freed memory, so wait for it (tests are small) */
  pthread_mutex_lock(&fk_ev_mu);
  while (ev->completed < ev->recorded) pthread_cond_wait(&fk_ev_cv, &fk_ev_mu);
  pthread_mutex_unlock(&fk_ev_mu);
  free(ev);
  return cudaSuccess;
}

typedef struct fk_evarg {
  cudaEvent_t ev;
  uint64_t seq;
} fk_evarg_t;

static void fk_record_task(void *arg) {
  fk_evarg_t *a = arg;
  pthread_mutex_lock(&fk_ev_mu);
  if (a->ev->completed < a->seq) a->ev->completed = a->seq;
  pthread_cond_broadcast(&fk_ev_cv);
  pthread_mutex_unlock(&fk_ev_mu);
  free(a);
}

static void fk_wait_task(void *arg) {
  fk_evarg_t *a = arg;
  pthread_mutex_lock(&fk_ev_mu);
  while (a->ev->completed < a->seq) pthread_cond_wait(&fk_ev_cv, &fk_ev_mu);
  pthread_mutex_unlock(&fk_ev_mu);
  free(a);
}

TCFAKE_API cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s) {
  fk_evarg_t *a = malloc(sizeof *a);
  if (!a) return cudaErrorMemoryAllocation;
  pthread_mutex_lock(&fk_ev_mu);
  a->ev = ev;
  a->seq = ++ev->recorded;
  pthread_mutex_unlock(&fk_ev_mu);
  cudaError_t e = tcfake_stream_enqueue(s, fk_record_task, a);
  if (e != cudaSuccess) { /* never runs: mark it done */
    fk_record_task(a);
  }
  return e;
}

TCFAKE_API cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev,
                                           unsigned int flags) {
  (void)flags;
  fk_evarg_t *a = malloc(sizeof *a);
  if (!a) return cudaErrorMemoryAllocation;
  pthread_mutex_lock(&fk_ev_mu);
  a->ev = ev;
  a->seq = ev->recorded; /* the record current now */
  pthread_mutex_unlock(&fk_ev_mu);
  cudaError_t e = tcfake_stream_enqueue(s, fk_wait_task, a);
  if (e != cudaSuccess) free(a);
  return e;
}

TCFAKE_API cudaError_t cudaEventQuery(cudaEvent_t ev) {
  pthread_mutex_lock(&fk_ev_mu);
  int done = ev->completed >= ev->recorded;
  pthread_mutex_unlock(&fk_ev_mu);
  return done ? cudaSuccess : cudaErrorNotReady;
}

TCFAKE_API cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
  pthread_mutex_lock(&fk_ev_mu);
  uint64_t target = ev->recorded;
  while (ev->completed < target) pthread_cond_wait(&fk_ev_cv, &fk_ev_mu);
  pthread_mutex_unlock(&fk_ev_mu);
  return cudaSuccess;
}

/* Like CUDA's (legacy default stream): after the default stream's work. */
TCFAKE_API cudaError_t cudaMemcpy(void *dst, const void *src, size_t n,
                                  int kind) {
  (void)kind;
  cudaStreamSynchronize(NULL);
  memcpy(dst, src, n);
  return cudaSuccess;
}

typedef struct fk_copy {
  void *dst;
  const void *src;
  size_t n;
} fk_copy_t;

static void fk_copy_task(void *arg) {
  fk_copy_t *c = arg;
  memcpy(c->dst, c->src, c->n);
  free(c);
}

/* On the stream, in order (the caller keeps a host source valid until it
 * ran, as for pinned memory). */
TCFAKE_API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind,
                                       cudaStream_t s) {
  (void)kind;
  if (n == 0) return cudaSuccess;
  if (!dst || !src) return cudaErrorInvalidValue;
  fk_copy_t *c = malloc(sizeof *c);
  if (!c) return cudaErrorMemoryAllocation;
  c->dst = dst;
  c->src = src;
  c->n = n;
  cudaError_t e = tcfake_stream_enqueue(s, fk_copy_task, c);
  if (e != cudaSuccess) free(c);
  return e;
}

TCFAKE_API cudaError_t cudaStreamCreate(cudaStream_t *s) {
  return cudaStreamCreateWithFlags(s, 0);
}

TCFAKE_API cudaError_t cudaDeviceSynchronize(void) {
  return cudaStreamSynchronize(NULL);
}

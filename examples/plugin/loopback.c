/* loopback.c -- "loopback", a complete out-of-tree torchcomms backend for a
 * world of one rank. It is the template to copy when writing a new backend
 * (docs/backends.md explains every rule it follows).
 *
 * What it shows:
 *  - the one exported symbol, tc_backend_table, a table with designated
 *    initializers; everything else is static (and the build hides symbols);
 *  - init refusing what the backend cannot do (world size > 1, a device
 *    other than "cpu") with one sentence, the core adding the communicator
 *    and rank;
 *  - one post entry that never blocks: it copies the operation's descriptor
 *    into a FIFO queue and returns; one progress thread per communicator
 *    runs the queue in post order and reports through host->work_started /
 *    work_complete;
 *  - every kind of operation implemented for one rank, on the descriptor's
 *    per-rank blocks whatever form the user called (a collective over one
 *    rank is a local copy; PREMUL_SUM scales by its factor), and failures
 *    reported with a reason, to which the core adds the operation, the
 *    communicator and the rank;
 *  - per-operation deadlines, finalize (drains the queue), abort (fails
 *    pending operations at once), destroy (joins the thread);
 *  - no call into libtorchcomms: the plugin is linked against libc and
 *    pthreads only, and reaches the core through the host table.
 *
 * Test hook: the operation hint "loopback.delay_ms" = "<ms>" makes the
 * progress thread wait that long before running the operation (bounded by
 * the operation's deadline and woken by abort), so that tests can observe
 * asynchronous completion, issue order, timeouts and abort.
 *
 * Build: by the project's CMake (build/plugins/libtorchcomms-loopback.so),
 * or standalone against an installed torchcomms with the Makefile here.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <torchcomms_backend.h>

#define LB_NAME "loopback"
#define LB_VERSION "1.0.0"
#define LB_HINT_DELAY "loopback.delay_ms"

/* Element size from the header's dtype list (a plugin does not call
 * tc_dtype_size: it does not link libtorchcomms). */
static size_t lb_esize(tc_dtype_t dt) {
  switch (dt) {
#define LB_DTYPE_SIZE(name, val, ctype, size, isf)                             \
  case TC_##name:                                                              \
    return size;
    TC_DTYPE_MAP(LB_DTYPE_SIZE)
#undef LB_DTYPE_SIZE
  default:
    return 0;
  }
}

/* One queued operation: a copy of the core's description (its pointers stay
 * valid until work_complete) and what was read from the hints, which are
 * borrowed for the duration of the op entry only. */
typedef struct lb_entry {
  struct lb_entry *next;
  tc_backend_op_t op;
  tc_work_t *work;
  double delay_s;
  char hint_error[160]; /* non-empty: fail with this when its turn comes */
} lb_entry_t;

typedef struct lb_comm {
  const tc_backend_host_t *host;
  char name[128];
  pthread_mutex_t mu;
  pthread_cond_t cv; /* new entry, finalize, abort (CLOCK_MONOTONIC) */
  lb_entry_t *head, *tail;
  int stopping; /* finalize: run what is queued, then exit */
  int aborted;
  pthread_t thread;
  int joined;
} lb_comm_t;

static double lb_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The reason "loopback: <what>"; the core makes it "torchcomms: <op> on
 * '<comm>' (rank 0 of 1): loopback: <what>". */
static int lb_fail(const lb_comm_t *c, const tc_backend_op_t *op, char *msg,
                   size_t len, int rc, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static int lb_fail(const lb_comm_t *c, const tc_backend_op_t *op, char *msg,
                   size_t len, int rc, const char *fmt, ...) {
  (void)c;
  (void)op;
  int n = snprintf(msg, len, LB_NAME ": ");
  if (n >= 0 && (size_t)n < len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + n, len - (size_t)n, fmt, ap);
    va_end(ap);
  }
  return rc;
}

/* ------------------------------------------------------------------------ */
/* The operations, for one rank                                              */
/* ------------------------------------------------------------------------ */

static void lb_copy(void *dst, const void *src, size_t count, tc_dtype_t dt) {
  if (count && dst != src) memmove(dst, src, count * lb_esize(dt));
}

/* The reduction of a single contribution is the contribution itself, except
 * that PREMUL_SUM multiplies it by its factor (AVG divides by 1). */
static int lb_reduce_one(const lb_comm_t *c, const tc_backend_op_t *op,
                         void *buf, size_t count, char *msg, size_t len) {
  if (op->redop.type != TC_PREMUL_SUM) return TC_OK;
  double f = op->redop.factor;
  switch (op->dtype) {
  case TC_FLOAT32:
    for (size_t i = 0; i < count; i++) ((float *)buf)[i] *= (float)f;
    return TC_OK;
  case TC_FLOAT64:
    for (size_t i = 0; i < count; i++) ((double *)buf)[i] *= f;
    return TC_OK;
  default: /* the core allows PREMUL_SUM on the float types only */
    return lb_fail(c, op, msg, len, TC_ERR_NOT_SUPPORTED,
                   "PREMUL_SUM on %s is not implemented (float32 and float64 "
                   "are)",
                   op->dtype == TC_FLOAT16           ? "float16"
                   : op->dtype == TC_BFLOAT16        ? "bfloat16"
                   : op->dtype == TC_FLOAT8_E4M3FN   ? "float8_e4m3fn"
                                                     : "float8_e5m2");
  }
}

/* Self sends and receives of a batch pair up in order: the k-th self send
 * feeds the k-th self receive (the core checked that they pair up). */
static int lb_batch(const lb_comm_t *c, const tc_backend_op_t *op, char *msg,
                    size_t len) {
  size_t r = 0;
  for (size_t s = 0; s < op->num_p2p; s++) {
    const tc_p2p_t *send = &op->p2p[s];
    if (!send->is_send) continue;
    while (r < op->num_p2p && op->p2p[r].is_send) r++;
    if (r == op->num_p2p)
      return lb_fail(c, op, msg, len, TC_ERR_INTERNAL,
                     "self send #%zu has no matching receive", s);
    const tc_p2p_t *recv = &op->p2p[r++];
    if (send->count && send->buf != recv->buf)
      memmove(recv->buf, send->buf, send->count * lb_esize(send->dtype));
  }
  return TC_OK;
}

/* Runs one operation; TC_OK, or an error code with msg filled in. With one
 * rank every per-rank list has one block: block 0, the own one. */
static int lb_execute(const lb_comm_t *c, const tc_backend_op_t *op, char *msg,
                      size_t len) {
  switch (op->kind) {
  case TC_KIND_BARRIER:
  case TC_KIND_BROADCAST: /* the root's buffer is already the result */
    return TC_OK;
  case TC_KIND_ALL_REDUCE:
  case TC_KIND_REDUCE:
    return lb_reduce_one(c, op, op->recvbuf, op->count, msg, len);
  case TC_KIND_ALL_GATHER:
  case TC_KIND_GATHER: /* count == recv[0].count */
    lb_copy(op->recv[0].buf, op->sendbuf, op->count, op->dtype);
    return TC_OK;
  case TC_KIND_SCATTER:
    lb_copy(op->recvbuf, op->send[0].buf, op->count, op->dtype);
    return TC_OK;
  case TC_KIND_REDUCE_SCATTER: /* count == send[0].count */
    lb_copy(op->recvbuf, op->send[0].buf, op->count, op->dtype);
    return lb_reduce_one(c, op, op->recvbuf, op->count, msg, len);
  case TC_KIND_ALL_TO_ALL: {
    /* what rank 0 sends to itself must fit what it receives from itself:
     * the core cannot check this across ranks, the backend does */
    size_t sc = op->send[0].count, rc = op->recv[0].count;
    if (sc != rc)
      return lb_fail(c, op, msg, len, TC_ERR_INVALID_ARGUMENT,
                     "rank 0 sends %zu elements to itself but expects to "
                     "receive %zu", sc, rc);
    lb_copy(op->recv[0].buf, op->send[0].buf, sc, op->dtype);
    return TC_OK;
  }
  case TC_KIND_BATCH:
    return lb_batch(c, op, msg, len);
  case TC_KIND_SEND: /* unreachable: the core refuses a peer equal to self */
  case TC_KIND_RECV:
  default:
    return lb_fail(c, op, msg, len, TC_ERR_NOT_SUPPORTED,
                   "operation type %d is not supported", (int)op->type);
  }
}

/* ------------------------------------------------------------------------ */
/* The progress thread                                                       */
/* ------------------------------------------------------------------------ */

/* Waits out the test delay of e (with mu held): TC_OK, or TC_ERR_ABORTED /
 * TC_ERR_TIMEOUT when abort or the operation's deadline comes first. */
static int lb_delay(lb_comm_t *c, const lb_entry_t *e, double start,
                    char *msg, size_t len) {
  double until = start + e->delay_s, deadline = start + e->op.timeout_s;
  for (;;) {
    if (c->aborted)
      return lb_fail(c, &e->op, msg, len, TC_ERR_ABORTED,
                     "communicator was aborted");
    double now = lb_now();
    if (now >= deadline && e->op.timeout_s < e->delay_s)
      return lb_fail(c, &e->op, msg, len, TC_ERR_TIMEOUT,
                     "timed out after %.3f s (the operation was delayed by "
                     "%.3f s with the hint " LB_HINT_DELAY ")",
                     e->op.timeout_s, e->delay_s);
    if (now >= until) return TC_OK;
    double t = until < deadline ? until : deadline;
    struct timespec ts = {.tv_sec = (time_t)t};
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_nsec = 999999999L;
    pthread_cond_timedwait(&c->cv, &c->mu, &ts);
  }
}

/* Runs one entry and reports it; frees the entry. */
static void lb_run(lb_comm_t *c, lb_entry_t *e, int aborted) {
  char msg[1024] = "";
  int rc;
  if (aborted) {
    rc = lb_fail(c, &e->op, msg, sizeof msg, TC_ERR_ABORTED,
                 "communicator was aborted");
  } else {
    c->host->work_started(e->work); /* the operation's deadline starts now */
    double start = lb_now();
    rc = TC_OK;
    if (e->hint_error[0]) {
      rc = lb_fail(c, &e->op, msg, sizeof msg, TC_ERR_INVALID_ARGUMENT, "%s",
                   e->hint_error);
    } else if (e->delay_s > 0) {
      pthread_mutex_lock(&c->mu);
      rc = lb_delay(c, e, start, msg, sizeof msg);
      pthread_mutex_unlock(&c->mu);
    }
    if (rc == TC_OK) rc = lb_execute(c, &e->op, msg, sizeof msg);
  }
  /* The last touch of the work (the core may recycle it at once); no lock
   * of ours is held, so a waiter woken here may post again at once. */
  c->host->work_complete(e->work, rc, rc == TC_OK ? NULL : msg);
  free(e);
}

static void *lb_thread(void *arg) {
  lb_comm_t *c = arg;
  for (;;) {
    pthread_mutex_lock(&c->mu);
    while (!c->head && !c->stopping && !c->aborted)
      pthread_cond_wait(&c->cv, &c->mu);
    lb_entry_t *e = c->head;
    if (e) {
      c->head = e->next;
      if (!c->head) c->tail = NULL;
    }
    int aborted = c->aborted;
    pthread_mutex_unlock(&c->mu);
    if (!e) return NULL; /* finalize or abort, and nothing left to run */
    lb_run(c, e, aborted);
  }
}

/* Reads this backend's hints; hints are borrowed for the op entry only. */
static void lb_read_hints(const tc_backend_op_t *op, lb_entry_t *e) {
  for (size_t i = 0; i < op->num_hints; i++) {
    if (strcmp(op->hints[i].key, LB_HINT_DELAY) != 0) continue;
    char *end = NULL;
    errno = 0;
    double ms = strtod(op->hints[i].value, &end);
    if (end == op->hints[i].value || *end || errno || !isfinite(ms) || ms < 0 ||
        ms > 1e9)
      snprintf(e->hint_error, sizeof e->hint_error,
               "hint " LB_HINT_DELAY "='%.40s' is not a number of "
               "milliseconds >= 0", op->hints[i].value);
    else
      e->delay_s = ms / 1000.0;
  }
}

/* The post entry, for every operation: queue it and return at once. */
static int lb_post(void *bcomm, const tc_backend_op_t *op, tc_work_t *work,
                   char *err, size_t errlen) {
  lb_comm_t *c = bcomm;
  lb_entry_t *e = calloc(1, sizeof *e);
  if (!e) /* an error return refuses the work (never complete it then); it
           * is only for a failure to queue */
    return lb_fail(c, op, err, errlen, TC_ERR_NOMEM,
                   "out of memory queueing the operation");
  /* A core built against a newer header may pass a larger op; read only
   * the members this plugin knows. */
  memcpy(&e->op, op, op->size < sizeof e->op ? op->size : sizeof e->op);
  lb_read_hints(op, e);
  e->op.hints = NULL;
  e->op.num_hints = 0;
  e->work = work;
  pthread_mutex_lock(&c->mu);
  if (c->tail) c->tail->next = e;
  else c->head = e;
  c->tail = e;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  return TC_OK;
}

/* ------------------------------------------------------------------------ */
/* Lifecycle                                                                 */
/* ------------------------------------------------------------------------ */

static void lb_free(lb_comm_t *c) {
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

static int lb_init(const tc_backend_init_args_t *args, void **bcomm, char *err,
                   size_t errlen) {
  *bcomm = NULL;
  if (args->world_size != 1) {
    snprintf(err, errlen,
             "the " LB_NAME " backend runs a world of one rank only (got "
             "world size %d); use the cpu backend for more",
             args->world_size);
    return TC_ERR_NOT_SUPPORTED;
  }
  if (args->device && strcmp(args->device, "cpu") != 0) {
    snprintf(err, errlen,
             "the " LB_NAME " backend works on host memory (device 'cpu'), "
             "not on device '%s'", args->device);
    return TC_ERR_NOT_SUPPORTED;
  }
  lb_comm_t *c = calloc(1, sizeof *c);
  if (!c) {
    snprintf(err, errlen, LB_NAME ": out of memory");
    return TC_ERR_NOMEM;
  }
  c->host = args->host;
  snprintf(c->name, sizeof c->name, "%s", args->comm_name);
  pthread_mutex_init(&c->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&c->cv, &ca);
  pthread_condattr_destroy(&ca);
  /* the progress thread takes no asynchronous signals: they belong to the
   * application's threads */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int e = pthread_create(&c->thread, NULL, lb_thread, c);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (e != 0) {
    snprintf(err, errlen, LB_NAME ": could not start the progress thread: %s",
             strerror(e));
    lb_free(c);
    return TC_ERR_SYSTEM;
  }
  /* the host's logs (subsystem init) when the core has it, else its log */
  TC_BACKEND_LOGS(c->host, TC_LOG_DEBUG, TC_LOG_INIT, LB_NAME " backend: communicator '%s' ready",
                  c->name);
  *bcomm = c;
  return TC_OK;
}

static void lb_join(lb_comm_t *c) {
  if (!c->joined) {
    pthread_join(c->thread, NULL);
    c->joined = 1;
  }
}

/* Runs every queued operation (each ends by its own deadline), then stops
 * the thread. No operation is posted once finalize has begun. */
static int lb_finalize(void *bcomm, char *err, size_t errlen) {
  lb_comm_t *c = bcomm;
  (void)err; /* finalize cannot fail here: each operation ends by its deadline */
  (void)errlen;
  pthread_mutex_lock(&c->mu);
  c->stopping = 1;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  lb_join(c);
  return TC_OK;
}

/* Fails every queued operation with TC_ERR_ABORTED now and wakes the
 * running one, which fails as soon as it notices. */
static int lb_abort(void *bcomm) {
  lb_comm_t *c = bcomm;
  pthread_mutex_lock(&c->mu);
  c->aborted = 1;
  lb_entry_t *e = c->head;
  c->head = c->tail = NULL;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  while (e) {
    lb_entry_t *next = e->next;
    char msg[256];
    lb_fail(c, &e->op, msg, sizeof msg, TC_ERR_ABORTED,
            "communicator was aborted");
    c->host->work_complete(e->work, TC_ERR_ABORTED, msg);
    free(e);
    e = next;
  }
  lb_join(c);
  return TC_OK;
}

/* Called once, after finalize or abort. */
static void lb_destroy(void *bcomm) {
  lb_comm_t *c = bcomm;
  if (!c) return;
  if (!c->joined) lb_abort(c);
  lb_free(c);
}

/* Every operation, every dtype of TC_DTYPE_MAP, every reduction (PREMUL_SUM
 * on the narrow float types is refused when it runs, with a reason). */
static int lb_supports(void *bcomm, tc_op_type_t type, tc_dtype_t dtype, int redop) {
  (void)bcomm;
  (void)redop;
  return (unsigned)type < TC_OP_TYPE_COUNT &&
         (dtype == TC_DTYPE_COUNT || lb_esize(dtype) != 0);
}

/* The only exported symbol. */
TC_API const tc_backend_ops_t tc_backend_table = {
    .abi_version = TC_BACKEND_ABI_VERSION,
    .size = sizeof(tc_backend_ops_t),
    .name = LB_NAME,
    .version = LB_VERSION,
    .init = lb_init,
    .finalize = lb_finalize,
    .abort = lb_abort,
    .destroy = lb_destroy,
    .post = lb_post,
    .supports = lb_supports,
    .split = NULL, /* the core splits with init */
};

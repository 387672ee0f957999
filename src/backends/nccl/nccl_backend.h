/* nccl_backend.h -- the nccl backend's state, shared by its files:
 *   nccl_load.c  dlopen of NCCL and the CUDA runtime (nccl_api.h)
 *   nccl_comm.c  init (unique id through the store), split, finalize,
 *                abort, destroy, the completion poller
 *   nccl_ops.c   every operation mapped to NCCL calls, and the table
 *   nccl_window.c  one-sided windows (ncclCommWindowRegister, ncclPutSignal,
 *                ncclWaitSignal), by NCCL version
 *
 * Execution model (torchcomms' TorchCommNCCL): each communicator owns an
 * internal non-blocking CUDA stream. Posting an operation records an event
 * on the caller's stream (tc_op_options_t.stream; NULL is the legacy default
 * stream) and makes the internal stream wait for it, records a start event,
 * enqueues the NCCL calls on the internal stream, records an end event and,
 * for a synchronous operation, makes the caller's stream wait for the end
 * event. A poller thread per communicator queries the events of the oldest
 * operation (cudaEventQuery): start -> host->work_started, end ->
 * host->work_complete; it also polls ncclCommGetAsyncError and the
 * operation's deadline, and on an error or a timeout aborts the NCCL
 * communicator (ncclCommAbort) and fails every pending operation.
 *
 * The module links neither libtorchcomms nor CUDA: it uses only the host
 * callbacks (tc_backend_host_t) and the dlopen'd table.
 */
#ifndef TC_NCCL_BACKEND_H
#define TC_NCCL_BACKEND_H

#include <pthread.h>
#include <stdatomic.h>

#include "nccl_api.h"
#include "torchcomms_backend.h"

/* One posted operation, pooled per communicator (its events are created
 * once and reused). */
typedef struct tcn_rec {
  tc_work_t *work;
  tc_op_type_t type;
  cudaEvent_t start, end;
  double post_time, start_time, timeout_s;
  int started;
  int rc;    /* completion status, set when it leaves the pending list */
  char *msg; /* malloc'ed failure message, or NULL */
  struct tcn_rec *next;
} tcn_rec_t;

enum { TCN_ACTIVE = 0, TCN_BROKEN, TCN_ABORTED, TCN_FINALIZED };

struct tcn_rma; /* the one-sided state of a communicator (nccl_window.c) */

typedef struct tcn_comm {
  const tc_backend_host_t *host;
  const tcn_api_t *api;
  char name[128];
  int rank, size, device;
  double timeout_s; /* bootstrap and finalize deadline */
  ncclComm_t nccl;  /* NULL once aborted or destroyed */
  int blocking;     /* 1 if NCCL calls block (no ncclCommInitRankConfig) */
  cudaStream_t stream;
  cudaEvent_t dep; /* recorded on the caller's stream at each post */
  void *barrier_buf;
  pthread_mutex_t mu; /* everything below, and every use of `nccl` */
  pthread_cond_t cv;  /* the poller's wake-up */
  pthread_cond_t idle_cv; /* the pending list became empty */
  tcn_rec_t *head, *tail, *free_recs;
  pthread_t poller;
  int poller_started;
  int stop;
  atomic_int aborting; /* tc abort requested: stop waiting for NCCL */
  int state;           /* TCN_* */
  int broken_rc;
  char broken_msg[1024];
  struct tcn_rma *rma; /* created with the first window, or NULL */
} tcn_comm_t;

/* Monotonic clock, seconds. */
double tcn_now(void);
/* Size in bytes of one element of a tc dtype (0 if invalid). */
size_t tcn_dtype_size(tc_dtype_t dt);
/* Formats the reason <detail> into out (the core adds "torchcomms: <op> on
 * '<name>' (rank r of n): "; op and c are kept for the call sites' sake). */
void tcn_msg(const tcn_comm_t *c, const char *op, char *out, size_t outlen,
             const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Copies the reason into a refusing entry's err buffer; returns rc. */
int tcn_put_reason(char *err, size_t errlen, int rc, const char *text);
/* NCCL's own text for the last error of comm (may be ""). */
const char *tcn_last_error(const tcn_comm_t *c);

/* Makes c->device the calling thread's current device; returns the
 * previous one to restore with tcn_device_leave. */
int tcn_device_enter(const tcn_comm_t *c);
void tcn_device_leave(const tcn_comm_t *c, int prev);

/* Waits, with c->mu held, until the NCCL communicator leaves ncclInProgress
 * (non-blocking communicators) or `deadline` passes (ncclTimeout) or an
 * abort is requested (ncclInvalidUsage). Returns its state. */
ncclResult_t tcn_wait_ready(tcn_comm_t *c, ncclComm_t comm, double deadline);

/* With c->mu held: a record from the pool (NULL: out of memory / CUDA
 * error, message in err), and its return. */
tcn_rec_t *tcn_rec_get(tcn_comm_t *c, char *err, size_t errlen);
void tcn_rec_put(tcn_comm_t *c, tcn_rec_t *r);
/* With c->mu held: appends r to the pending list and wakes the poller. */
void tcn_rec_push(tcn_comm_t *c, tcn_rec_t *r);

/* Op entries (nccl_ops.c). */
int tcn_post(void *bcomm, const tc_backend_op_t *op, tc_work_t *work, char *err,
             size_t errlen);
/* Name of an operation type, for messages. */
const char *tcn_op_name(tc_op_type_t t);

/* Lifecycle entries (nccl_comm.c). */
int tcn_init(const tc_backend_init_args_t *args, void **bcomm, char *err,
             size_t errlen);
int tcn_split(void *parent, const int *ranks, size_t nranks,
              const tc_backend_init_args_t *child_args, void **child,
              char *err, size_t errlen);
int tcn_finalize(void *bcomm, char *err, size_t errlen);
int tcn_abort(void *bcomm);
void tcn_destroy(void *bcomm);
int tcn_supports(void *bcomm, tc_op_type_t type, tc_dtype_t dt, int redop);

/* Window entries (nccl_window.c). */
int tcn_window_create(void *bcomm, void *buf, size_t bytes, void **bwin, void **base,
                      void *info, size_t *info_len, char *err, size_t errlen);
int tcn_window_attach(void *bwin, const void *infos, size_t info_len, char *err,
                      size_t errlen);
int tcn_window_op(void *bwin, const tc_backend_win_op_t *op, char *err, size_t errlen);
void *tcn_window_map(void *bwin, int peer);
void tcn_window_free(void *bwin);
/* Releases the communicator's one-sided state (tcn_destroy). */
void tcn_rma_destroy(tcn_comm_t *c);

#endif /* TC_NCCL_BACKEND_H */

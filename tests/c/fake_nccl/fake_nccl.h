/* fake_nccl.h -- the fake NCCL's communicator, shared by fake_nccl.c
 * (creation, split, state, premultiplied sums, finalize, abort),
 * fake_nccl_ops.c (collectives, point to point, groups) and fake_nccl_win.c
 * (ncclMemAlloc, windows, ncclPutSignal / ncclWaitSignal). See fake_nccl.c. */
#ifndef TC_FAKE_NCCL_H
#define TC_FAKE_NCCL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "fake_cuda.h"
#include "torchcomms.h"

#define FK_API TCFAKE_API
#define FK_MAX_PREMUL 64

typedef struct fk_id {
  char magic[8];
  char host[64];
  int port;
  uint64_t nonce;
} fk_id_t;
_Static_assert(sizeof(fk_id_t) <= NCCL_UNIQUE_ID_BYTES, "id fits");

struct ncclComm {
  int rank, size, blocking;
  char prefix[256];
  fk_id_t id;
  tc_store_t *store; /* own connection, prefixed with `prefix` */
  tc_comm_t *cpu;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int inflight; /* tasks queued or running */
  atomic_int aborted;
  atomic_int state;       /* ncclResult_t: ncclInProgress while connecting */
  atomic_int busy_polls;  /* TCFAKE_NCCL_INPROGRESS */
  int inprogress_knob;
  int fault_kind; /* 0 none, 1 hang, 2 remote */
  int fault_at;
  atomic_int tasks;
  int splits;
  pthread_t bg;
  int bg_started;
  /* a split child being created: the parent's rank and size, its split */
  int prank, psize;
  int split_no, color, key;
  double premul[FK_MAX_PREMUL];
  unsigned char premul_used[FK_MAX_PREMUL];
  char last_error[512];
  struct fk_rma *rma; /* windows and signals (fake_nccl_win.c), or NULL */
};

/* Records tc_last_error() of a failed library call in c's last error
 * (the process-wide one when c is NULL). */
void fk_err(struct ncclComm *c, const char *what, int rc);
/* Waits until no task of c is queued or running. */
void fk_drain(struct ncclComm *c);
/* Releases c's windows and signal counters (fake_nccl_win.c). */
void fk_rma_free(struct ncclComm *c);
/* What ncclGetVersion reports: TCFAKE_NCCL_VERSION, by default 22703. */
int fk_version(void);

#endif

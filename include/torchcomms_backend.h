/*
 * torchcomms_backend.h -- the backend ABI of libtorchcomms (versioned,
 * append-only).
 *
 * A backend is a table of functions, tc_backend_ops_t. Built-in backends are
 * registered by the core; an out-of-tree backend is a shared object
 * `libtorchcomms-<name>.so` that exports one symbol:
 *
 *     const tc_backend_ops_t tc_backend_v1 = { .abi_version = ..., ... };
 *
 * The loader looks in $TORCHCOMMS_BACKEND_LIB_PATH_<NAME> (a file or a
 * directory), then beside libtorchcomms, then the built-ins; it checks
 * abi_version and size before using the table.
 *
 * The core validates every argument before calling the backend, so a backend
 * may trust the tc_backend_op_t it is given. Op entries must not block: they
 * queue the operation and return; the backend reports progress with
 * host->work_started(work) and host->work_complete(work, status, message).
 * Operations must run in the order they were posted on one communicator.
 * An op entry may be NULL: the core then reports TC_ERR_NOT_SUPPORTED.
 *
 * Append-only: new members go at the end; the core reads a member only when
 * the table's `size` covers it.
 */
#ifndef TORCHCOMMS_BACKEND_H
#define TORCHCOMMS_BACKEND_H

#include "torchcomms.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TC_BACKEND_ABI_VERSION 1u

typedef enum tc_op_type {
  TC_OP_SEND = 0,
  TC_OP_RECV,
  TC_OP_BROADCAST,
  TC_OP_ALL_REDUCE,
  TC_OP_REDUCE,
  TC_OP_ALL_GATHER,
  TC_OP_ALL_GATHER_V,
  TC_OP_ALL_GATHER_SINGLE,
  TC_OP_REDUCE_SCATTER,
  TC_OP_REDUCE_SCATTER_V,
  TC_OP_REDUCE_SCATTER_SINGLE,
  TC_OP_ALL_TO_ALL_SINGLE,
  TC_OP_ALL_TO_ALL_V_SINGLE,
  TC_OP_ALL_TO_ALL,
  TC_OP_BARRIER,
  TC_OP_SCATTER,
  TC_OP_GATHER,
  TC_OP_GATHER_SINGLE,
  TC_OP_BATCH,
  TC_OP_TYPE_COUNT
} tc_op_type_t;

/* The operation's name as error messages show it ("all_reduce", ...);
 * "unknown" outside the enum. Inline, so backends need not link the core. */
static inline const char *tc_backend_op_name(tc_op_type_t t) {
  static const char *const names[TC_OP_TYPE_COUNT] = {
      [TC_OP_SEND] = "send",
      [TC_OP_RECV] = "recv",
      [TC_OP_BROADCAST] = "broadcast",
      [TC_OP_ALL_REDUCE] = "all_reduce",
      [TC_OP_REDUCE] = "reduce",
      [TC_OP_ALL_GATHER] = "all_gather",
      [TC_OP_ALL_GATHER_V] = "all_gather_v",
      [TC_OP_ALL_GATHER_SINGLE] = "all_gather_single",
      [TC_OP_REDUCE_SCATTER] = "reduce_scatter",
      [TC_OP_REDUCE_SCATTER_V] = "reduce_scatter_v",
      [TC_OP_REDUCE_SCATTER_SINGLE] = "reduce_scatter_single",
      [TC_OP_ALL_TO_ALL_SINGLE] = "all_to_all_single",
      [TC_OP_ALL_TO_ALL_V_SINGLE] = "all_to_all_v_single",
      [TC_OP_ALL_TO_ALL] = "all_to_all",
      [TC_OP_BARRIER] = "barrier",
      [TC_OP_SCATTER] = "scatter",
      [TC_OP_GATHER] = "gather",
      [TC_OP_GATHER_SINGLE] = "gather_single",
      [TC_OP_BATCH] = "batch_op_issue",
  };
  return (unsigned)t < TC_OP_TYPE_COUNT && names[t] ? names[t] : "unknown";
}

/* One send or receive of a batch. */
typedef struct tc_p2p {
  int is_send;
  int peer;
  void *buf; /* const for sends */
  size_t count;
  tc_dtype_t dtype;
} tc_p2p_t;

/* Everything an operation needs, already validated by the core. Which fields
 * are used depends on `type`:
 *  send/recv:            recvbuf|sendbuf, count, root = peer
 *  broadcast:            recvbuf (in/out), count, root
 *  all_reduce:           recvbuf (in/out), count, redop
 *  reduce:               recvbuf (in/out at root, input elsewhere), root
 *  all_gather:           sendbuf, count, recvbufs[size]
 *  all_gather_v:         sendbuf, count (= recvcounts[rank]), recvbufs,
 *                        recvcounts
 *  all_gather_single:    sendbuf, count (per rank), recvbuf
 *  reduce_scatter:       sendbufs[size], count, recvbuf
 *  reduce_scatter_v:     sendbufs, sendcounts, recvbuf, count (= own count)
 *  reduce_scatter_single sendbuf (size*count), recvbuf, count (per rank)
 *  all_to_all_single:    sendbuf, recvbuf, count (per rank)
 *  all_to_all_v_single:  sendbuf, sendcounts, recvbuf, recvcounts
 *  all_to_all:           sendbufs, sendcounts, recvbufs, recvcounts
 *  barrier:              -
 *  scatter:              sendbufs (root), recvbuf, count, root
 *  gather:               sendbuf, recvbufs (root), count, root
 *  gather_single:        sendbuf, recvbuf (root, size*count), count, root
 *  batch:                p2p[num_p2p]
 * For AVG and PREMUL_SUM, `redop` carries the type and the factor; the
 * backend applies them. */
typedef struct tc_backend_op {
  uint32_t size; /* sizeof(tc_backend_op_t) */
  tc_op_type_t type;
  tc_dtype_t dtype;
  tc_redop_t redop;
  int root;
  size_t count;
  const void *sendbuf;
  void *recvbuf;
  const void *const *sendbufs;
  void *const *recvbufs;
  const size_t *sendcounts;
  const size_t *recvcounts;
  const tc_p2p_t *p2p;
  size_t num_p2p;
  double timeout_s; /* effective deadline: start of execution + timeout_s */
  const tc_hint_t *hints; /* valid during the op entry's call only: copy */
  size_t num_hints;       /* what the backend needs before returning */
  void *stream; /* device stream, or NULL */
  uint64_t seq; /* 1, 2, ... in issue order on this communicator */
  /* Appended (read only when `size` covers it): TC_BACKEND_OP_* bits. */
  uint32_t flags;
} tc_backend_op_t;

/* The caller holds a work object (asynchronous call); without it the core
 * waits for the operation before returning. A device backend may use it to
 * order the caller's stream after a synchronous operation only. */
#define TC_BACKEND_OP_ASYNC 0x1u

/* Opaque to backends: the core's work object. */
typedef struct tc_work tc_work_t;

/* Services the core gives a backend. */
typedef struct tc_backend_host {
  uint32_t size;
  /* The operation began executing (its deadline starts now). */
  void (*work_started)(tc_work_t *work);
  /* The operation finished: status TC_OK, or an error with a message that
   * names the operation, the communicator, the rank and the peer. */
  void (*work_complete)(tc_work_t *work, int status, const char *message);
  /* Store functions (see torchcomms.h) on the communicator's own prefix. */
  int (*store_set)(tc_store_t *s, const char *key, const void *v, size_t len);
  int (*store_get)(tc_store_t *s, const char *key, void **v, size_t *len,
                   double timeout_s);
  int (*store_add)(tc_store_t *s, const char *key, int64_t delta,
                   int64_t *result);
  void (*free)(void *ptr);
  /* Logs a line at level 0 (error) .. 3 (debug), gated by TORCHCOMMS_LOG. */
  void (*log)(int level, const char *fmt, ...);
  /* Appended (check `size` before use): sets the calling thread's last
   * error (tc_last_error) to `message` and returns status; for an op entry,
   * finalize or split that returns an error, so that the caller sees the
   * backend's own sentence. */
  int (*set_error)(int status, const char *message);
} tc_backend_host_t;

/* What a backend's init receives. */
typedef struct tc_backend_init_args {
  uint32_t size;
  const tc_backend_host_t *host;
  const char *comm_name;
  const char *device;
  int device_index;
  int rank;
  int world_size;
  double timeout_s; /* bootstrap deadline */
  tc_store_t *store; /* prefixed for this communicator; borrowed */
  const char *advertise_addr; /* address peers should connect to */
  const tc_hint_t *hints;
  size_t num_hints;
} tc_backend_init_args_t;

typedef int (*tc_backend_op_fn)(void *bcomm, const tc_backend_op_t *op,
                                tc_work_t *work);

typedef struct tc_backend_ops {
  uint32_t abi_version; /* TC_BACKEND_ABI_VERSION */
  uint32_t size;        /* sizeof(tc_backend_ops_t) at build time */
  const char *name;
  const char *version;
  /* Creates the backend state of one communicator (collective). On failure
   * writes one sentence into err. */
  int (*init)(const tc_backend_init_args_t *args, void **bcomm, char *err,
              size_t errlen);
  /* Completes pending operations and closes (collective). */
  int (*finalize)(void *bcomm);
  /* Fails every pending operation with TC_ERR_ABORTED at once. */
  int (*abort)(void *bcomm);
  /* Frees the state (after finalize or abort). */
  void (*destroy)(void *bcomm);
  /* One entry per operation, indexed like tc_op_type_t (may be NULL). */
  tc_backend_op_fn send;
  tc_backend_op_fn recv;
  tc_backend_op_fn broadcast;
  tc_backend_op_fn all_reduce;
  tc_backend_op_fn reduce;
  tc_backend_op_fn all_gather;
  tc_backend_op_fn all_gather_v;
  tc_backend_op_fn all_gather_single;
  tc_backend_op_fn reduce_scatter;
  tc_backend_op_fn reduce_scatter_v;
  tc_backend_op_fn reduce_scatter_single;
  tc_backend_op_fn all_to_all_single;
  tc_backend_op_fn all_to_all_v_single;
  tc_backend_op_fn all_to_all;
  tc_backend_op_fn barrier;
  tc_backend_op_fn scatter;
  tc_backend_op_fn gather;
  tc_backend_op_fn gather_single;
  tc_backend_op_fn batch;
  /* Optional native split; NULL: the core splits with init on a child store.
   * ranks: the new group in parent ranks (caller included). Collective over
   * the parent: the core calls it on every rank of the parent, after the
   * ranks agreed on the groups; a rank joining no group gets ranks == NULL,
   * nranks == 0 and child_args == NULL and must set *child = NULL. */
  int (*split)(void *parent, const int *ranks, size_t nranks,
               const tc_backend_init_args_t *child_args, void **child,
               char *err, size_t errlen);
  /* Which dtypes the backend supports; NULL: all of TC_DTYPE_MAP. */
  int (*supports_dtype)(tc_dtype_t dtype);
} tc_backend_ops_t;

/* The symbol a plugin exports. */
#define TC_BACKEND_SYMBOL "tc_backend_v1"

#ifdef __cplusplus
}
#endif
#endif /* TORCHCOMMS_BACKEND_H */

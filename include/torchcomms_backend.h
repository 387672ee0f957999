/*
 * torchcomms_backend.h -- the backend ABI of libtorchcomms (versioned,
 * append-only).
 *
 * A backend is a table of functions, tc_backend_ops_t. Built-in backends are
 * registered by the core; an out-of-tree backend is a shared object
 * `libtorchcomms-<name>.so` that exports one symbol:
 *
 *     const tc_backend_ops_t tc_backend_table = { .abi_version = ..., ... };
 *
 * The loader looks in $TORCHCOMMS_BACKEND_LIB_PATH_<NAME> (a file or a
 * directory), then beside libtorchcomms, then the built-ins; it checks
 * abi_version and size before using the table.
 *
 * Every operation reaches the backend through one entry, post(), as one
 * normalised descriptor (tc_backend_op_t); supports() says beforehand which
 * (operation, dtype, reduction) the backend runs (docs/backends.md says why
 * one entry rather than one member per operation). The core validates every
 * argument before calling the backend, so a backend may trust the
 * descriptor. post() must not block: it queues the operation and returns;
 * the backend reports progress with host->work_started(work) and
 * host->work_complete(work, status, reason). Operations must run in the
 * order they were posted on one communicator.
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

#define TC_BACKEND_ABI_VERSION 2u

/* What an operation does, whatever form it was called in: algorithms
 * switch on the kind, never on the type (generated from TC_OP_MAP). */
typedef enum tc_op_kind {
  TC_KIND_SEND = 0,
  TC_KIND_RECV,
  TC_KIND_BROADCAST,
  TC_KIND_ALL_REDUCE,
  TC_KIND_REDUCE,
  TC_KIND_ALL_GATHER,
  TC_KIND_REDUCE_SCATTER,
  TC_KIND_ALL_TO_ALL,
  TC_KIND_BARRIER,
  TC_KIND_SCATTER,
  TC_KIND_GATHER,
  TC_KIND_BATCH,
  TC_KIND_COUNT
} tc_op_kind_t;

/* The kind of an operation type (TC_KIND_COUNT outside the enum). Inline,
 * like the names below, so that backends need not link the core. */
static inline tc_op_kind_t tc_backend_op_kind(tc_op_type_t t) {
  static const tc_op_kind_t kinds[TC_OP_TYPE_COUNT] = {
#define TC__OP_KIND(id, name, kind, flags) [TC_OP_##id] = TC_KIND_##kind,
      TC_OP_MAP(TC__OP_KIND)
#undef TC__OP_KIND
  };
  return (unsigned)t < TC_OP_TYPE_COUNT ? kinds[t] : TC_KIND_COUNT;
}

/* The operation's TC_OPF_* flags (tc_op_flags). */
static inline uint32_t tc_backend_op_flags(tc_op_type_t t) {
  static const uint32_t flags[TC_OP_TYPE_COUNT] = {
#define TC__OP_FLAGS(id, name, kind, f) [TC_OP_##id] = (f),
      TC_OP_MAP(TC__OP_FLAGS)
#undef TC__OP_FLAGS
  };
  return (unsigned)t < TC_OP_TYPE_COUNT ? flags[t] : 0;
}

/* The operation's name as error messages show it ("all_reduce", ...);
 * "unknown" outside the enum. */
static inline const char *tc_backend_op_name(tc_op_type_t t) {
  static const char *const names[TC_OP_TYPE_COUNT] = {
#define TC__OP_NAME(id, name, kind, flags) [TC_OP_##id] = #name,
      TC_OP_MAP(TC__OP_NAME)
#undef TC__OP_NAME
  };
  return (unsigned)t < TC_OP_TYPE_COUNT ? names[t] : "unknown";
}

/* One send or receive of a batch. */
typedef struct tc_p2p {
  int is_send;
  int peer;
  void *buf; /* const for sends */
  size_t count;
  tc_dtype_t dtype;
} tc_p2p_t;

/* One rank's block of a per-rank operation: where it lies and how many
 * elements it has (const for input blocks). */
typedef struct tc_block {
  void *buf;
  size_t count;
} tc_block_t;

/* The one descriptor of an operation, validated and normalised by the core:
 * whichever form was called (one buffer, a list of buffers, counts per
 * rank), the per-rank blocks are resolved into `send` / `recv`, so a
 * backend switches on `kind` and never looks at the form. By kind:
 *  SEND / RECV      sendbuf | recvbuf, count, root = the peer
 *  BROADCAST        recvbuf (in/out), count, root
 *  ALL_REDUCE       recvbuf (in/out), count, redop
 *  REDUCE           recvbuf (in/out at root, input elsewhere), count, redop,
 *                   root
 *  ALL_GATHER       sendbuf, count (this rank's block = recv[rank].count),
 *                   recv[size]
 *  REDUCE_SCATTER   send[size], recvbuf, count (= send[rank].count), redop
 *  ALL_TO_ALL       send[size] (to rank i), recv[size] (from rank i)
 *  BARRIER          -
 *  SCATTER          send[size] at root (NULL elsewhere), recvbuf, count, root
 *  GATHER           sendbuf, count, recv[size] at root (NULL elsewhere), root
 *  BATCH            p2p[num_p2p]
 * `flags` carry the type's TC_OPF_* (tc_op_flags): TC_OPF_UNIFORM says every
 * block on every rank has `count` elements (for ALL_TO_ALL too: `count` is
 * then the per-rank count), so a backend may pick a path by it that every
 * rank picks alike; TC_OPF_SEND_CONTIG / TC_OPF_RECV_CONTIG say the blocks
 * lie back to back from sendbuf / recvbuf (which are then set). For AVG and
 * PREMUL_SUM, `redop` carries the type and the factor; the backend applies
 * them. */
typedef struct tc_backend_op {
  uint32_t size; /* sizeof(tc_backend_op_t) */
  tc_op_type_t type; /* the call (names, fingerprints) */
  tc_op_kind_t kind; /* what it does (algorithms) */
  uint32_t flags;    /* TC_OPF_* of the type, plus TC_BACKEND_OP_* */
  tc_dtype_t dtype;
  tc_redop_t redop;
  int root; /* root or peer; -1 when none */
  size_t count;
  const void *sendbuf;
  void *recvbuf;
  const tc_block_t *send; /* [world size], or NULL */
  const tc_block_t *recv; /* [world size], or NULL */
  const tc_p2p_t *p2p;
  size_t num_p2p;
  double timeout_s; /* effective deadline: start of execution + timeout_s */
  const tc_hint_t *hints; /* valid during the post call only: copy */
  size_t num_hints;       /* what the backend needs before returning */
  void *stream; /* device stream, or NULL */
  uint64_t seq; /* 1, 2, ... in issue order on this communicator */
  /* Appended (read it when `size` covers it): the caller's
   * tc_op_options_t.backend_arg, or NULL (always NULL for the operations
   * the core issues itself, such as split's all_gather_single). */
  const void *backend_arg;
  /* Appended (read it when `size` covers it): when the core issued the
   * operation, in seconds of CLOCK_MONOTONIC (0: not known). A backend
   * that starts the operation inside its post call may take it as the
   * start of execution instead of reading the clock again. */
  double issue_time;
} tc_backend_op_t;

/* The caller holds a work object (asynchronous call); without it the core
 * waits for the operation before returning. A device backend may use it to
 * order the caller's stream after a synchronous operation only. */
#define TC_BACKEND_OP_ASYNC 0x80000000u
/* The caller keeps a lock over the call (tc_op_options_t.wait_release): a
 * backend with TC_BACKEND_CAP_BLOCKING_REPORTED calls host->work_blocking
 * before blocking inside post. Without the flag it need not (nothing to
 * let go). */
#define TC_BACKEND_OP_REPORT_BLOCKING 0x40000000u

/* Shorthands of the descriptor, for backends: */
static inline int tc_backend_op_reduces(const tc_backend_op_t *op) {
  return (op->flags & TC_OPF_REDUCE) != 0;
}
static inline int tc_backend_op_is_collective(const tc_backend_op_t *op) {
  return op->kind != TC_KIND_SEND && op->kind != TC_KIND_RECV &&
         op->kind != TC_KIND_BATCH;
}

/* Opaque to backends: the core's work object. */
typedef struct tc_work tc_work_t;

/* Errors, one way everywhere: an entry that fails returns its status and
 * writes one sentence into its `err` buffer (init, split, finalize, post),
 * and an operation that fails later passes it to work_complete. The
 * sentence says what went wrong and what to do; it does NOT start with
 * "torchcomms: <op> on '<comm>' (rank r of n): ", which the core adds, so
 * every message of the library has one format. */

/* Log levels (TORCHCOMMS_LOG) and subsystems (TORCHCOMMS_LOG_SUBSYS, one
 * bit each, in the order of that setting's names) of the host's log
 * functions; docs/logging.md. A line of level error or warn is written
 * whatever the subsystem filter says (as NCCL's WARN). */
enum {
  TC_LOG_ERROR = 0,
  TC_LOG_WARN = 1,
  TC_LOG_INFO = 2,
  TC_LOG_DEBUG = 3,
  TC_LOG_TRACE = 4
};
enum {
  TC_LOG_INIT = 0x01,  /* creation, setup, the init summary */
  TC_LOG_COLL = 0x02,  /* collectives */
  TC_LOG_P2P = 0x04,   /* send, recv, batches */
  TC_LOG_SHM = 0x08,   /* the shared-memory transport */
  TC_LOG_TCP = 0x10,   /* the TCP transport and mesh */
  TC_LOG_STORE = 0x20, /* stores and the store server */
  TC_LOG_MISC = 0x40,  /* lines of no subsystem (the host's `log`, tcrun) */
  TC_LOG_ALL = 0x7f
};

#if defined(__GNUC__)
#define TC_BACKEND_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define TC_BACKEND_PRINTF(f, a)
#endif

/* Services the core gives a backend. */
typedef struct tc_backend_host {
  uint32_t size;
  /* The operation began executing (its deadline starts now). */
  void (*work_started)(tc_work_t *work);
  /* The operation finished: status TC_OK (reason NULL), or an error and
   * its sentence (see above). */
  void (*work_complete)(tc_work_t *work, int status, const char *reason);
  /* Store functions (see torchcomms.h) on the communicator's own prefix. */
  int (*store_set)(tc_store_t *s, const char *key, const void *v, size_t len);
  int (*store_get)(tc_store_t *s, const char *key, void **v, size_t *len,
                   double timeout_s);
  int (*store_add)(tc_store_t *s, const char *key, int64_t delta,
                   int64_t *result);
  void (*free)(void *ptr);
  /* Logs a line at level 0 (error) .. 4 (trace), gated by TORCHCOMMS_LOG;
   * its subsystem is "misc". */
  void (*log)(int level, const char *fmt, ...);
  /* Appended; read them only when `size` covers them (TC_BACKEND_LOGS and
   * TC_BACKEND_LOG_ON below do). Logs a line of subsystem `subsys` (one
   * TC_LOG_INIT ... bit) at `level` (TC_LOG_ERROR ... TC_LOG_TRACE), gated
   * by TORCHCOMMS_LOG and TORCHCOMMS_LOG_SUBSYS. */
  void (*logs)(int level, int subsys, const char *fmt, ...) TC_BACKEND_PRINTF(3, 4);
  /* 1 when a line of this level and subsystem would be written: check it
   * before formatting anything costly (a load and a compare). */
  int (*log_on)(int level, int subsys);
  /* Appended. The backend is about to block the calling thread inside
   * post, on `work` (an operation it runs there whose peers may keep it
   * waiting, past a spin of about a millisecond): the caller's lock is let
   * go (tc_op_options_t.wait_release) until the call returns. A backend
   * with TC_BACKEND_CAP_BLOCKING_REPORTED calls it before every such wait
   * of an operation whose flags have TC_BACKEND_OP_REPORT_BLOCKING. */
  void (*work_blocking)(tc_work_t *work);
} tc_backend_host_t;

/* 1 when the host table h has `member` (its size covers it) and it is set. */
#define TC_BACKEND_HOST_HAS(h, member)                                        \
  ((h)->size >= offsetof(tc_backend_host_t, member) + sizeof((h)->member) && \
   (h)->member != NULL)
/* Logs through h->logs, or h->log (no subsystem) with an older core. */
#define TC_BACKEND_LOGS(h, level, subsys, ...)                                \
  (TC_BACKEND_HOST_HAS(h, logs) ? (h)->logs((level), (subsys), __VA_ARGS__)  \
                                : (h)->log((level), __VA_ARGS__))
/* h->log_on, or 1 (format and let the host decide) with an older core. */
#define TC_BACKEND_LOG_ON(h, level, subsys)                                   \
  (TC_BACKEND_HOST_HAS(h, log_on) ? (h)->log_on((level), (subsys)) : 1)

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
  /* Appended; read only when `size` covers it. The configuration of the
   * communicator this init builds: 0 for one made by tc_comm_create or a
   * split, a value every member shares (derived from the uuid and the
   * member list) for one made by tc_comm_reconfigure. A backend with
   * TC_BACKEND_CAP_RECONFIGURE puts it in every message header and
   * connection greeting and drops what carries another epoch. */
  uint32_t epoch;
} tc_backend_init_args_t;

struct tc_backend_win_op;
struct tc_backend_express;

typedef struct tc_backend_ops {
  uint32_t abi_version; /* TC_BACKEND_ABI_VERSION */
  uint32_t size;        /* sizeof(tc_backend_ops_t) at build time */
  const char *name;
  const char *version;
  /* Creates the backend state of one communicator (collective). */
  int (*init)(const tc_backend_init_args_t *args, void **bcomm, char *err,
              size_t errlen);
  /* Completes pending operations and closes (collective). */
  int (*finalize)(void *bcomm, char *err, size_t errlen);
  /* Fails every pending operation with TC_ERR_ABORTED at once. */
  int (*abort)(void *bcomm);
  /* Frees the state (after finalize or abort). */
  void (*destroy)(void *bcomm);
  /* Queues one operation (every operation, whatever its kind) and returns
   * without blocking; completion through host->work_started/work_complete.
   * A refusal (nothing queued) returns the status with the reason in err. */
  int (*post)(void *bcomm, const tc_backend_op_t *op, tc_work_t *work,
              char *err, size_t errlen);
  /* Whether the backend runs `type` on `dtype` with reduction `redop`
   * (a tc_redop_type_t, or -1 for an operation that does not reduce): 1
   * yes, 0 no (the core then fails the call with TC_ERR_NOT_SUPPORTED
   * before anything is posted). NULL: everything. */
  int (*supports)(void *bcomm, tc_op_type_t type, tc_dtype_t dtype, int redop);
  /* Optional native split; NULL: the core splits with init on a child store.
   * ranks: the new group in parent ranks (caller included). Collective over
   * the parent: the core calls it on every rank of the parent, after the
   * ranks agreed on the groups; a rank joining no group gets ranks == NULL,
   * nranks == 0 and child_args == NULL and must set *child = NULL. */
  int (*split)(void *parent, const int *ranks, size_t nranks,
               const tc_backend_init_args_t *child_args, void **child,
               char *err, size_t errlen);
  /* Appended, optional (NULL, or past the table's `size`: none). Writes
   * what this communicator chose at setup into buf (NUL-terminated, one
   * fact per line, no trailing newline): the transport per peer, the
   * algorithm thresholds, the waiting policy. The core logs it in the
   * init summary of tc_comm_create (TORCHCOMMS_LOG=info, subsystem init). */
  void (*describe)(void *bcomm, char *buf, size_t len);
  /* Appended, optional (0, or past the table's `size`: none): what the
   * backend can do beyond the required entries, TC_BACKEND_CAP_* bits. */
  uint64_t caps;
  /* Appended, optional: one-sided windows (tc_window_*; all five set, or
   * the core refuses windows with TC_ERR_NOT_SUPPORTED). The core checks
   * every argument first (peer, offset + bytes within the peer's window).
   *
   * window_create (local, in the caller's thread): sets up this rank's
   * side of a new window over buf (bytes), or over `bytes` of memory the
   * backend allocates when buf is NULL (zeroed, 64-byte aligned; *base gets
   * it; with buf set *base = buf). Writes what its peers need to reach it
   * (at most TC_BACKEND_WIN_INFO_MAX bytes) into info and its length into
   * *info_len. The core then all-gathers every rank's info over the
   * communicator and calls window_attach with all of them (size *
   * info_len bytes, rank r's at r * info_len), then a barrier, then
   * window_ready (optional: the peers have attached). window_op runs one
   * operation in the caller's thread and may block until op->deadline.
   * window_map gives peer's memory mapped in this process, or NULL.
   * window_free (after a barrier, or without one when the communicator
   * was aborted) releases everything; the core never calls window_op
   * after it has begun. */
  int (*window_create)(void *bcomm, void *buf, size_t bytes, void **bwin, void **base,
                       void *info, size_t *info_len, char *err, size_t errlen);
  int (*window_attach)(void *bwin, const void *infos, size_t info_len, char *err,
                       size_t errlen);
  void (*window_ready)(void *bwin);
  int (*window_op)(void *bwin, const struct tc_backend_win_op *op, char *err,
                   size_t errlen);
  void *(*window_map)(void *bwin, int peer);
  void (*window_free)(void *bwin);
  /* Appended, optional (NULL, or past the table's `size`: none). The core
   * is about to end the process because an operation failed and the
   * communicator has abort_process_on_timeout_or_error: the flight
   * recorder is dumped and the failure (`reason`, in the library's one
   * format) printed. A backend whose launcher must hear of it ends the
   * process its own way here (the mpi backend: MPI_Abort, so that mpirun
   * ends every rank of the job); if it returns, the core calls abort().
   * Called from whichever thread saw the failure. */
  void (*abort_process)(void *bcomm, int status, const char *reason);
  /* Appended, optional (NULL, or past the table's `size`: none): runs a
   * synchronous collective to its end on the caller's thread, now, when
   * the backend can (for instance: nothing queued or running, a small
   * message), without a work object; the core offers it the synchronous
   * collectives when no hook would see them, and the synchronous send,
   * recv and batch operations too when the table has
   * TC_BACKEND_CAP_EXPRESS_P2P (numbered and recorded as point-to-point
   * operations, as the work path does). When it cannot, it returns
   * TC_BACKEND_DECLINED having done nothing, and the core posts the
   * operation as usual. Otherwise it calls x->begin(x->arg) exactly once
   * before anything moves (the core numbers and records the operation, so
   * that a hang shows it, and lets go of its communicator lock: other
   * threads may issue, abort or finalize meanwhile, and an abort must end
   * the operation's waits as for any operation), runs it, then calls
   * x->end(x->arg, status, reason) exactly once, before it lets go of
   * anything an abort or a destroy waits for (TC_OK, or the error with its
   * text, as work_complete's), and returns status. With
   * TC_BACKEND_OP_REPORT_BLOCKING in op->flags it calls
   * x->blocking(x->arg) before it could block (a sleep, a long wait: the
   * caller's lock goes), as host->work_blocking. Called from the issuing
   * thread, which the callbacks run on; op and x are valid for the call
   * only; op->timeout_s is the operation's, and op->issue_time, set by
   * begin, the start of its deadline. The core offers a communicator one
   * express operation at a time: while one runs, another thread's
   * synchronous operation is posted instead. An operation that succeeded
   * promptly may end with x->end_prompt(x->arg) instead of x->end(x->arg,
   * TC_OK, NULL) (see there). */
  int (*express)(void *bcomm, const tc_backend_op_t *op, const struct tc_backend_express *x);
} tc_backend_ops_t;

/* The core's side of an express operation (tc_backend_ops_t.express). */
typedef struct tc_backend_express {
  void *arg;
  void (*begin)(void *arg);
  void (*blocking)(void *arg);
  void (*end)(void *arg, int status, const char *reason);
  /* Instead of end(arg, TC_OK, NULL), for an operation that succeeded
   * without waiting: none of its waits lasted more than about a
   * microsecond (the backend did not read the clock for any). The core
   * then records the operation's end at its begin (op->issue_time: the
   * flight recorder's completion, the last progress) instead of reading
   * the clock again, which costs about a twentieth of an 8-byte operation
   * in a virtual machine. A backend may always call end instead. */
  void (*end_prompt)(void *arg);
} tc_backend_express_t;

/* express's answer when it did nothing (the core posts the operation). */
#define TC_BACKEND_DECLINED 1
/* 1 when the table t has an express entry. */
#define TC_BACKEND_HAS_EXPRESS(t)                                             \
  ((t)->size >= offsetof(tc_backend_ops_t, express) + sizeof((t)->express) && (t)->express)

#define TC_BACKEND_WIN_INFO_MAX 512u

/* A window operation (tc_backend_ops_t.window_op). */
typedef enum tc_win_kind {
  TC_WIN_PUT = 0,     /* buf (read) -> peer's window at offset, bytes */
  TC_WIN_GET,         /* peer's window at offset, bytes -> buf */
  TC_WIN_SIGNAL,      /* peer's counter for this rank += 1, after the puts */
  TC_WIN_WAIT_SIGNAL, /* until peer's signals to this rank >= target */
  TC_WIN_FLUSH        /* until the puts to peer (-1: every peer) are visible */
} tc_win_kind_t;

typedef struct tc_backend_win_op {
  uint32_t size; /* sizeof(tc_backend_win_op_t) */
  tc_win_kind_t kind;
  int peer;
  void *buf; /* read-only for PUT */
  size_t bytes;
  size_t offset;
  uint64_t target; /* WAIT_SIGNAL: the count of peer's signals to reach */
  int block;       /* WAIT_SIGNAL: 0 = look once, return TC_BACKEND_WIN_PENDING if not yet */
  double deadline; /* absolute, seconds of CLOCK_MONOTONIC */
  double timeout_s; /* for messages */
  const char *opname; /* "put", "wait_signal", ... for messages */
  void *stream;     /* device stream, or NULL */
} tc_backend_win_op_t;

/* window_op's answer for a WAIT_SIGNAL with block == 0 that is not there yet. */
#define TC_BACKEND_WIN_PENDING 1
/* 1 when the table t has every window entry. */
#define TC_BACKEND_HAS_WINDOWS(t)                                             \
  ((t)->size >= offsetof(tc_backend_ops_t, window_free) + sizeof((t)->window_free) && \
   (t)->window_create && (t)->window_attach && (t)->window_op && (t)->window_map && \
   (t)->window_free)

/* init may build the same communicator again, after its previous state
 * was aborted and destroyed, for a new membership and epoch
 * (tc_comm_reconfigure); the backend keeps nothing per process that two
 * configurations of one communicator would share. */
#define TC_BACKEND_CAP_RECONFIGURE 0x1u
/* The backend finds its peers without the store (an MPI launched by
 * mpirun): when the caller gives no store and MASTER_ADDR / MASTER_PORT
 * are not set, the core gives init an in-process store (its keys reach
 * no other rank) instead of failing for want of one, and leaves out what
 * needs a shared store (the hang-report board). */
#define TC_BACKEND_CAP_BOOTSTRAP 0x2u
/* post blocks the calling thread only after calling host->work_blocking
 * (spins of up to about a millisecond apart): the core then lets a caller
 * keep its lock (tc_op_options_t.wait_release) over a post that does not
 * block. Without it, a caller's wait hooks run around the whole call. */
#define TC_BACKEND_CAP_BLOCKING_REPORTED 0x4u
/* express (tc_backend_ops_t) also takes synchronous point-to-point
 * operations (TC_KIND_SEND, TC_KIND_RECV, TC_KIND_BATCH), declining those
 * it cannot run as it declines collectives. Without it the core offers
 * express the collectives only. */
#define TC_BACKEND_CAP_EXPRESS_P2P 0x8u
/* 1 when the table t has the capability bit cap. */
#define TC_BACKEND_HAS_CAP(t, cap)                                            \
  ((t)->size >= offsetof(tc_backend_ops_t, caps) + sizeof((t)->caps) &&       \
   ((t)->caps & (cap)) != 0)

/* Registers an in-process backend: tc_comm_create(ops->name, ...) then
 * uses `ops` before looking for a plugin file or a built-in backend of that
 * name (and before the c10d aliases "gloo" / "torchcomms" on CPU). The
 * table is checked as a plugin's is (abi_version, size, the required
 * entries) and must stay valid for the life of the process; the name must
 * be lower-case letters, digits, '_' or '-'. Registering the same table
 * again is harmless; another table under a name already registered is
 * refused with TC_ERR_INVALID_USAGE (the first registration stays). Used
 * by the Python extension for torchcomms.register_backend (a backend
 * written in Python) and by C programs that bring their own backend
 * without a shared object. */
TC_API int tc_backend_register(const tc_backend_ops_t *ops);

/* The symbol a plugin exports. */
#define TC_BACKEND_SYMBOL "tc_backend_table"
/* The symbol of ABI version 1 (one member per operation), which the loader
 * recognises only to say that the plugin must be rebuilt. */
#define TC_BACKEND_SYMBOL_V1 "tc_backend_v1"

#ifdef __cplusplus
}
#endif
#endif /* TORCHCOMMS_BACKEND_H */

/*
 * torchcomms.h -- the public C API of libtorchcomms.
 *
 * libtorchcomms is a communications library for distributed PyTorch: eagerly
 * initialised communicators with collectives, point-to-point, batch P2P,
 * split and asynchronous work objects, over pluggable backends (the native
 * `cpu` backend, `nccl`, out-of-tree plugins).
 *
 * Conventions
 *  - Every function returns a status code: TC_OK (0) or a negative TC_ERR_*.
 *    tc_strerror() names a code; tc_last_error() gives the full text of the
 *    calling thread's last failure, naming the operation, the communicator,
 *    the rank and the peer; tc_comm_last_error() the last failure of one
 *    communicator.
 *  - Handles are opaque. A released, finalized, destroyed or foreign handle
 *    is reported as an error (TC_ERR_INVALID_USAGE), never a crash, also once
 *    the library reuses the memory behind it for a new object.
 *  - Option structs begin with `size` and `version`; initialise them with
 *    their TC_*_OPTIONS_INIT macro so that they can grow.
 *  - Counts are element counts, not bytes. Buffers are host pointers for the
 *    `cpu` backend.
 *  - Operations: pass `work == NULL` for a synchronous call (returns when the
 *    operation is complete, failed or timed out); pass a `tc_work_t **` for an
 *    asynchronous call (returns once the operation is queued; wait on, test
 *    and release the work object). Operations on one communicator run in the
 *    order they were issued.
 */
#ifndef TORCHCOMMS_H
#define TORCHCOMMS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define TC_API __attribute__((visibility("default")))
#else
#define TC_API
#endif

#define TC_VERSION_MAJOR 0
#define TC_VERSION_MINOR 1
#define TC_VERSION_PATCH 0
#define TC_VERSION_STRING "0.1.0"

/* The default deadline of every operation and of a communicator's
 * creation, seconds, when neither the options nor TORCHCOMM_TIMEOUT_SECONDS
 * give one. The one definition: the backends, the transports and the Python
 * extension (torchcomms._comms.DEFAULT_TIMEOUT_SECONDS) use it. */
#define TC_DEFAULT_TIMEOUT_S 600.0

/* ------------------------------------------------------------------------ */
/* Status codes                                                              */
/* ------------------------------------------------------------------------ */

/* X(NAME, value, message): the one list that generates the enum, the names
 * and the messages. */
#define TC_STATUS_MAP(X)                                                       \
  X(OK, 0, "success")                                                          \
  X(ERR_INVALID_ARGUMENT, -1, "invalid argument")                              \
  X(ERR_INVALID_USAGE, -2, "invalid usage")                                    \
  X(ERR_TIMEOUT, -3, "operation timed out")                                    \
  X(ERR_REMOTE, -4, "a peer failed or closed its connection")                  \
  X(ERR_SYSTEM, -5, "system call failed")                                      \
  X(ERR_NOMEM, -6, "out of memory")                                            \
  X(ERR_ABORTED, -7, "communicator was aborted")                               \
  X(ERR_NOT_SUPPORTED, -8, "operation not supported by this backend")          \
  X(ERR_BACKEND, -9, "backend error")                                          \
  X(ERR_BACKEND_NOT_FOUND, -10, "backend not found")                           \
  X(ERR_STORE, -11, "store error")                                             \
  X(ERR_PROTOCOL, -12, "protocol error (mismatched operations between ranks?)") \
  X(ERR_INTERNAL, -13, "internal error")

typedef enum tc_status {
#define TC__STATUS_ENUM(name, val, msg) TC_##name = val,
  TC_STATUS_MAP(TC__STATUS_ENUM)
#undef TC__STATUS_ENUM
} tc_status_t;

/* The message for a status code ("invalid argument"); never NULL. */
TC_API const char *tc_strerror(int status);
/* The symbolic name of a status code ("TC_ERR_INVALID_ARGUMENT"). */
TC_API const char *tc_status_name(int status);
/* Full text of the calling thread's last error ("" if none). The pointer
 * stays valid until the thread's next failing call. */
TC_API const char *tc_last_error(void);
/* Library version string, e.g. "0.1.0". */
TC_API const char *tc_version(void);
/* Frees memory returned by the library (tc_store_get values). */
TC_API void tc_free(void *ptr);

/* ------------------------------------------------------------------------ */
/* Data types and reductions                                                 */
/* ------------------------------------------------------------------------ */

/* X(NAME, enum value, C type or storage type, size in bytes, is_float).
 * Append-only: a new dtype takes the next value, so that existing values
 * (and plugins built against them) keep their meaning.
 *  - FLOAT16 is IEEE binary16, BFLOAT16 the upper half of a float32; both
 *    reduce in float32 and round to nearest even.
 *  - FLOAT8_E4M3FN and FLOAT8_E5M2 are the OCP 8-bit floats (torch's
 *    float8_e4m3fn and float8_e5m2; NCCL's ncclFloat8e4m3 / ncclFloat8e5m2,
 *    NCCL >= 2.24). e4m3fn: 4 exponent bits (bias 7), 3 mantissa bits, no
 *    infinities, largest 448, NaN is S.1111.111. e5m2: 5 exponent bits
 *    (bias 15), 2 mantissa bits, IEEE-like with infinities, largest 57344.
 *    They reduce in float32 and round to nearest even as torch converts:
 *    e4m3fn saturates (overflow and infinities give +-448), e5m2 overflows
 *    to infinity; NaN stays NaN. */
#define TC_DTYPE_MAP(X)                                                        \
  X(FLOAT32, 0, float, 4, 1)                                                   \
  X(FLOAT64, 1, double, 8, 1)                                                  \
  X(FLOAT16, 2, uint16_t, 2, 1)                                                \
  X(BFLOAT16, 3, uint16_t, 2, 1)                                               \
  X(INT8, 4, int8_t, 1, 0)                                                     \
  X(UINT8, 5, uint8_t, 1, 0)                                                   \
  X(INT16, 6, int16_t, 2, 0)                                                   \
  X(INT32, 7, int32_t, 4, 0)                                                   \
  X(INT64, 8, int64_t, 8, 0)                                                   \
  X(BOOL, 9, uint8_t, 1, 0)                                                    \
  X(FLOAT8_E4M3FN, 10, uint8_t, 1, 1)                                          \
  X(FLOAT8_E5M2, 11, uint8_t, 1, 1)

typedef enum tc_dtype {
#define TC__DTYPE_ENUM(name, val, ctype, size, isf) TC_##name = val,
  TC_DTYPE_MAP(TC__DTYPE_ENUM)
#undef TC__DTYPE_ENUM
  TC_DTYPE_COUNT
} tc_dtype_t;

/* Size in bytes of one element (0 for an invalid dtype). */
TC_API size_t tc_dtype_size(tc_dtype_t dtype);
/* Lower-case name ("float32"), or "invalid". */
TC_API const char *tc_dtype_name(tc_dtype_t dtype);

typedef enum tc_redop_type {
  TC_SUM = 0,
  TC_PRODUCT = 1,
  TC_MIN = 2,
  TC_MAX = 3,
  TC_BAND = 4, /* integers and bool only */
  TC_BOR = 5,  /* integers and bool only */
  TC_BXOR = 6, /* integers and bool only */
  TC_AVG = 7,  /* sum divided by the communicator size (integer: truncated) */
  TC_PREMUL_SUM = 8, /* every input multiplied by `factor`, then summed */
  TC_REDOP_COUNT
} tc_redop_type_t;

/* A reduction: its type and, for TC_PREMUL_SUM, the scalar factor. */
typedef struct tc_redop {
  tc_redop_type_t type;
  double factor;
} tc_redop_t;

/* Convenience constructors. */
#define TC_OP(t) ((tc_redop_t){.type = (t), .factor = 1.0})
#define TC_OP_PREMUL_SUM(f) ((tc_redop_t){.type = TC_PREMUL_SUM, .factor = (f)})

/* Upper-case name ("SUM"), or "invalid". */
TC_API const char *tc_redop_name(tc_redop_type_t op);
/* 1 if reduction `op` is defined on `dtype`, else 0 (also for an invalid
 * dtype or op), as torch defines them: SUM, PRODUCT, MIN and MAX on every
 * dtype; BAND, BOR and BXOR on integers and bool only; AVG on every dtype
 * but bool; PREMUL_SUM on floating-point dtypes only. Every reducing
 * operation refuses other pairs with TC_ERR_INVALID_ARGUMENT before any
 * byte moves; a backend may still refuse a defined pair it does not
 * implement (TC_ERR_NOT_SUPPORTED). */
TC_API int tc_redop_supported(tc_dtype_t dtype, tc_redop_type_t op);

/* ------------------------------------------------------------------------ */
/* Hints, stores                                                             */
/* ------------------------------------------------------------------------ */

/* A key/value hint passed to the backend (unknown keys are ignored). */
typedef struct tc_hint {
  const char *key;
  const char *value;
} tc_hint_t;

/* A key/value store used to bootstrap communicators. Refcounted. */
typedef struct tc_store tc_store_t;

/* Functions of a custom store (for example an adapter around a Python
 * torch.distributed.Store). All return TC_OK or a TC_ERR_* code. */
typedef struct tc_store_vtable {
  uint32_t size;    /* sizeof(tc_store_vtable_t) */
  uint32_t version; /* 1 */
  /* Sets key to value. */
  int (*set)(void *ctx, const char *key, const void *value, size_t len);
  /* Waits up to timeout_s for key, then returns a malloc()ed copy of its
   * value (released by the library with free()). TC_ERR_TIMEOUT if absent. */
  int (*get)(void *ctx, const char *key, void **value, size_t *len,
             double timeout_s);
  /* Atomically adds delta to the integer stored at key (created as 0) and
   * returns the new value. */
  int (*add)(void *ctx, const char *key, int64_t delta, int64_t *result);
  /* *ready = 1 when all keys exist, else 0; does not wait. */
  int (*check)(void *ctx, const char *const *keys, size_t nkeys, int *ready);
  /* Deletes key; *deleted = 1 if it existed. */
  int (*delete_key)(void *ctx, const char *key, int *deleted);
  /* Called when the last reference to the store is released. May be NULL. */
  void (*destroy)(void *ctx);
} tc_store_vtable_t;

/* Wraps a custom store. The store takes ownership of ctx (destroy). */
TC_API int tc_store_create(const tc_store_vtable_t *vtable, void *ctx,
                           tc_store_t **out);
/* Connects to a TCPStore server (ours or torch's) at host:port, retrying
 * until timeout_s. */
TC_API int tc_store_tcp_connect(const char *host, int port, double timeout_s,
                                tc_store_t **out);
/* A store whose keys are all prefixed with "<prefix>/" in `base`. Takes a
 * reference on base. */
TC_API int tc_store_prefix(tc_store_t *base, const char *prefix,
                           tc_store_t **out);
/* An in-process store (for world size 1 and tests). */
TC_API int tc_store_memory(tc_store_t **out);
/* Takes / drops a reference. */
TC_API void tc_store_retain(tc_store_t *store);
TC_API void tc_store_release(tc_store_t *store);

TC_API int tc_store_set(tc_store_t *store, const char *key, const void *value,
                        size_t len);
/* Waits up to timeout_s for key; *value is malloc()ed: free with tc_free. */
TC_API int tc_store_get(tc_store_t *store, const char *key, void **value,
                        size_t *len, double timeout_s);
TC_API int tc_store_add(tc_store_t *store, const char *key, int64_t delta,
                        int64_t *result);
TC_API int tc_store_check(tc_store_t *store, const char *const *keys,
                          size_t nkeys, int *ready);
/* Waits up to timeout_s until all keys exist. */
TC_API int tc_store_wait(tc_store_t *store, const char *const *keys,
                         size_t nkeys, double timeout_s);
TC_API int tc_store_delete(tc_store_t *store, const char *key, int *deleted);
/* The local IP address (text) this store's connection uses, or NULL. Used
 * to choose the address peers connect to. */
TC_API const char *tc_store_local_addr(tc_store_t *store);

/* A TCPStore server speaking torch's TCPStore wire protocol, served by a
 * background thread. port 0 picks a free port (see tc_store_server_port). */
typedef struct tc_store_server tc_store_server_t;
TC_API int tc_store_server_start(const char *bind_host, int port,
                                 tc_store_server_t **out);
TC_API int tc_store_server_port(const tc_store_server_t *server);
/* Stops the server thread and closes every connection. */
TC_API void tc_store_server_stop(tc_store_server_t *server);

/* ------------------------------------------------------------------------ */
/* Communicators                                                             */
/* ------------------------------------------------------------------------ */

typedef struct tc_comm tc_comm_t;
typedef struct tc_work tc_work_t;

#define TC_COMM_OPTIONS_VERSION 2
typedef struct tc_comm_options {
  uint32_t size;    /* sizeof(tc_comm_options_t) */
  uint32_t version; /* TC_COMM_OPTIONS_VERSION */
  /* Communicator name ("main" if NULL); store keys are prefixed with it. */
  const char *name;
  /* Default deadline of every operation, seconds; <= 0: from
   * TORCHCOMM_TIMEOUT_SECONDS, else TC_DEFAULT_TIMEOUT_S (600). */
  double timeout_s;
  /* 1: exit the process with the error message on any timeout or error;
   * 0: report it; -1: from TORCHCOMM_ABORT_ON_ERROR, else 0. */
  int abort_process_on_timeout_or_error;
  /* Backend hints. Copied. */
  const tc_hint_t *hints;
  size_t num_hints;
  /* Store to bootstrap through (NULL: from the environment, see README). */
  tc_store_t *store;
  /* Rank and size; -1: discovered from the environment (TORCHCOMM_RANK /
   * TORCHCOMM_SIZE, Open MPI, PMI, Slurm, torchrun's RANK / WORLD_SIZE). */
  int rank;
  int world_size;
  /* Device index for device backends (-1: none / the default). */
  int device_index;
  /* Version 2. 1: a reconfigurable communicator (fault tolerance, see
   * tc_comm_reconfigure): created without members (rank and world_size are
   * ignored, nothing is connected) and configured by reconfigure. Only
   * backends that can run it accept it (cpu; not nccl). 0: an ordinary one. */
  int enable_reconfigure;
} tc_comm_options_t;

#define TC_COMM_OPTIONS_INIT                                                   \
  {                                                                            \
    .size = sizeof(tc_comm_options_t), .version = TC_COMM_OPTIONS_VERSION,     \
    .name = NULL, .timeout_s = 0.0, .abort_process_on_timeout_or_error = -1,   \
    .hints = NULL, .num_hints = 0, .store = NULL, .rank = -1,                  \
    .world_size = -1, .device_index = -1, .enable_reconfigure = 0              \
  }

/* Creates a communicator (collective over all ranks): loads `backend`
 * ("cpu", "nccl", or a plugin name), on `device` ("cpu", "cuda", ...),
 * connects the ranks and returns when it is ready to use. opts may be NULL.
 * On device "cpu", torch's c10d names "gloo" and "torchcomms" load "cpu"
 * (unless TORCHCOMMS_BACKEND_LIB_PATH_GLOO names a gloo plugin).
 * All or nothing (cpu backend): it returns on no rank before every rank's
 * setup is complete, and a rank that drops the communicator (or dies) after
 * its creation returned never fails another rank's creation. */
TC_API int tc_comm_create(const char *backend, const char *device,
                          const tc_comm_options_t *opts, tc_comm_t **out);
/* Completes every pending operation, then closes the connections (collective).
 * The handle stays valid (getters work, operations fail) until destroy. A
 * second finalize is harmless. */
TC_API int tc_comm_finalize(tc_comm_t *comm);
/* Aborts: every pending and future operation fails with TC_ERR_ABORTED and
 * waits on them return at once. Local, not collective. */
TC_API int tc_comm_abort(tc_comm_t *comm);
/* 1 if the communicator was aborted. */
TC_API int tc_comm_is_aborted(const tc_comm_t *comm);
/* Releases the handle (aborting first if neither finalized nor aborted).
 * Without finalize, peers still running operations this rank completed are
 * not disturbed (cpu backend: the rank tells them it left); a peer waiting
 * for an operation this rank never ran fails at once, naming it. */
TC_API int tc_comm_destroy(tc_comm_t *comm);

TC_API int tc_comm_rank(const tc_comm_t *comm);       /* -1 on a bad handle */
TC_API int tc_comm_size(const tc_comm_t *comm);       /* -1 on a bad handle */
TC_API const char *tc_comm_name(const tc_comm_t *comm);     /* NULL if bad */
TC_API const char *tc_comm_backend(const tc_comm_t *comm);  /* NULL if bad */
TC_API const char *tc_comm_backend_version(const tc_comm_t *comm);
TC_API const char *tc_comm_device(const tc_comm_t *comm);   /* NULL if bad */
/* The options the communicator runs with (timeout, abort flag, hints...).
 * Pointers inside stay valid while the handle lives. */
TC_API int tc_comm_get_options(const tc_comm_t *comm, tc_comm_options_t *out);
/* Changes the default timeout of later operations. */
TC_API int tc_comm_set_timeout(tc_comm_t *comm, double timeout_s);
/* Sets the communicator's hints (as given to tc_comm_init): each given key
 * is added or takes the given value (the last one when a key repeats);
 * the other keys keep theirs. tc_comm_get_options reports them and later
 * splits without hints of their own inherit them. The cpu backend reads no
 * hint after init. Pointers an earlier tc_comm_get_options returned stay
 * valid. Copied; thread-safe. */
TC_API int tc_comm_set_hints(tc_comm_t *comm, const tc_hint_t *hints,
                             size_t num_hints);
/* Full text of this communicator's last error ("" if none). */
TC_API const char *tc_comm_last_error(const tc_comm_t *comm);

/* ---- Fault tolerance: reconfigurable communicators ----
 *
 * A communicator created with enable_reconfigure = 1 has no members until
 * tc_comm_reconfigure gives it some: rank -1, size 0, and every operation
 * fails ("not configured yet") until then. Each such communicator listens
 * on its own endpoint (TORCHCOMMS_SOCKET_ADDR, else the address it reaches
 * its store from, else 127.0.0.1; any free port) and its init handle names
 * it. The application gathers the handles of the processes that should
 * form the group (its own coordination: a store, a lighthouse) and every
 * one of them calls tc_comm_reconfigure with the same uuid and the same
 * list; the list's order gives the ranks. Reconfigure drops whatever the
 * communicator was connected to before (pending operations fail as
 * aborted), so survivors of a failure call it after tc_comm_abort, and it
 * may be called again and again with new uuids (shrink, grow, replace). */

/* Writes this communicator's init handle (a NUL-terminated string of at
 * most TC_INIT_HANDLE_MAX bytes with the NUL) into buf. TC_ERR_INVALID_USAGE
 * unless created with enable_reconfigure. */
#define TC_INIT_HANDLE_MAX 256
TC_API int tc_comm_get_init_handle(const tc_comm_t *comm, char *buf, size_t len);

#define TC_RECONFIGURE_OPTIONS_VERSION 1
typedef struct tc_reconfigure_options {
  uint32_t size;    /* sizeof(tc_reconfigure_options_t) */
  uint32_t version; /* TC_RECONFIGURE_OPTIONS_VERSION */
  /* Identifies this reconfiguration: every member passes the same value,
   * and a value is used for one reconfiguration only. */
  int64_t uuid;
  /* The members' init handles; rank i is init_handles[i]. Must contain the
   * caller's own handle exactly once, and no handle twice. */
  const char *const *init_handles;
  size_t num_handles;
  /* Deadline of the whole reconfiguration, seconds; <= 0: the
   * communicator's timeout. */
  double timeout_s;
  const tc_hint_t *hints; /* none are read by the cpu backend today */
  size_t num_hints;
} tc_reconfigure_options_t;
#define TC_RECONFIGURE_OPTIONS_INIT                                            \
  {                                                                            \
    .size = sizeof(tc_reconfigure_options_t),                                  \
    .version = TC_RECONFIGURE_OPTIONS_VERSION, .uuid = 0,                      \
    .init_handles = NULL, .num_handles = 0, .timeout_s = 0.0, .hints = NULL,  \
    .num_hints = 0                                                             \
  }

/* Makes the communicator the group of opts->init_handles (collective over
 * those processes, which all call it with the same uuid and list; blocks
 * until every member is connected or the deadline passes). Afterwards it
 * has the new rank and size, a new epoch (nothing of an earlier
 * configuration can reach it), operation numbers start again at 1, and
 * every operation works. Members that pass a different uuid or a different
 * list never form a group with this one: each reports which member
 * disagrees, or which handles it could not reach by the deadline (a dead
 * process). On failure the communicator is left unconfigured and
 * reconfigure may be tried again with a new uuid. work (may be NULL)
 * receives a completed work, as torchcomms returns one. Errors:
 * TC_ERR_NOT_SUPPORTED for a backend that cannot reconfigure ("reconfigure
 * not implemented"), TC_ERR_INVALID_USAGE without enable_reconfigure or
 * after finalize, TC_ERR_INVALID_ARGUMENT for a bad list, TC_ERR_TIMEOUT,
 * TC_ERR_PROTOCOL (disagreeing members). */
TC_API int tc_comm_reconfigure(tc_comm_t *comm, const tc_reconfigure_options_t *opts,
                               tc_work_t **work);
/* 1 if tc_comm_abort can stop this communicator's operations at once and
 * leave the process usable (true for cpu and nccl), 0 if not, -1 for a bad
 * handle. */
TC_API int tc_comm_is_abort_supported(const tc_comm_t *comm);

/* Splits (collective over every rank of `comm`): each rank passes the ranks
 * (in `comm`) of its own new group; the new communicator's ranks follow that
 * list's order. A rank passing nranks == 0 joins none: *out = NULL. Members
 * of one group must pass identical lists; duplicates or a non-empty list
 * without the caller are errors. opts may be NULL (timeout, hints). */
typedef struct tc_op_options tc_op_options_t;
TC_API int tc_comm_split(tc_comm_t *comm, const int *ranks, size_t nranks,
                         const char *name, const tc_op_options_t *opts,
                         tc_comm_t **out);

/* ------------------------------------------------------------------------ */
/* Per-operation options and work objects                                    */
/* ------------------------------------------------------------------------ */

#define TC_OP_OPTIONS_VERSION 1
struct tc_op_options {
  uint32_t size;    /* sizeof(tc_op_options_t) */
  uint32_t version; /* TC_OP_OPTIONS_VERSION */
  double timeout_s; /* <= 0: the communicator's timeout */
  const tc_hint_t *hints;
  size_t num_hints;
  /* Device stream for device backends (cudaStream_t), NULL: default. */
  void *stream;
  /* Appended. An opaque pointer handed unchanged to the backend's post in
   * tc_backend_op_t.backend_arg, for an in-process backend registered with
   * tc_backend_register (torchcomms_backend.h) that needs more than the
   * buffers (the Python extension passes the call's Python arguments to a
   * Python backend this way). The caller keeps what it points to alive
   * until the operation completes. NULL: none. */
  const void *backend_arg;
  /* Appended. For a caller that holds a lock other threads of the process
   * need (the Python extension: the GIL) and would rather keep it over a
   * call that does not block than let it go and take it back every time.
   * When both are set, the call runs wait_release(wait_arg) on the calling
   * thread before it could block: before it waits for the operation (a
   * synchronous one that did not end inside the call), for another
   * thread's use of the communicator, or for a backend that blocks in its
   * post (any backend without TC_BACKEND_CAP_BLOCKING_REPORTED, which then
   * runs without the lock from the start); and wait_reacquire(wait_arg)
   * once, just before the call returns, with no lock of the library held.
   * At most one release per call, always followed by the reacquire. While
   * the lock is kept the call may still spin briefly (the cpu backend: at
   * most its spin, TORCHCOMMS_CPU_SPIN_US, five times). Neither may call
   * into the library. Both NULL: none (the default). */
  void (*wait_release)(void *wait_arg);
  void (*wait_reacquire)(void *wait_arg);
  void *wait_arg;
};
#define TC_OP_OPTIONS_INIT                                                     \
  {                                                                            \
    .size = sizeof(tc_op_options_t), .version = TC_OP_OPTIONS_VERSION,         \
    .timeout_s = 0.0, .hints = NULL, .num_hints = 0, .stream = NULL,           \
    .backend_arg = NULL, .wait_release = NULL, .wait_reacquire = NULL,         \
    .wait_arg = NULL                                                           \
  }

typedef enum tc_work_status {
  TC_WORK_NOT_STARTED = 0,
  TC_WORK_INPROGRESS = 1,
  TC_WORK_COMPLETED = 2,
  TC_WORK_TIMEDOUT = 3,
  TC_WORK_ERROR = 4
} tc_work_status_t;

/* Waits until the operation completes, fails, or passes its deadline
 * (operation start + timeout). Returns TC_OK, TC_ERR_TIMEOUT or the error. */
TC_API int tc_work_wait(tc_work_t *work);
/* Like tc_work_wait but gives up after timeout_s (TC_ERR_TIMEOUT) without
 * failing the operation. */
TC_API int tc_work_wait_for(tc_work_t *work, double timeout_s);
/* *done = 1 once the operation finished (completed, failed or timed out).
 * Never blocks. Returns the operation's status code when done. */
TC_API int tc_work_test(tc_work_t *work, int *done);
/* The current status (TC_WORK_*), or -1 for a bad handle. */
TC_API int tc_work_status(const tc_work_t *work);
/* The error text of a failed operation ("" when none). Valid until release. */
TC_API const char *tc_work_error(const tc_work_t *work);
/* Releases the handle; an operation still running completes on its own. */
TC_API int tc_work_release(tc_work_t *work);
/* Lower-case name of a work status ("completed"). */
TC_API const char *tc_work_status_name(int status);

/* ------------------------------------------------------------------------ */
/* Operations. opts may be NULL; work == NULL makes the call synchronous.    */
/* ------------------------------------------------------------------------ */

/* The one list of operations: X(ID, name, kind, flags) generates the enum
 * tc_op_type_t (TC_OP_<ID>), the names (tc_op_name), the flags (tc_op_flags),
 * the backends' operation kinds (torchcomms_backend.h) and the Python method
 * table. `name` is the function's suffix (tc_<name>) and the name messages
 * show; `kind` is what the operation does (several call forms share one:
 * all_gather, all_gather_v and all_gather_single are all ALL_GATHER);
 * `flags` are TC_OPF_* below. Append-only: a new operation takes the next
 * value. TC_COMM_OP_MAP holds the operations called on a communicator,
 * TC_OP_MAP adds the batch (issued through tc_batch_issue). */
#define TC_OPF_REDUCE 0x1u      /* takes a reduction (argument 'op') */
#define TC_OPF_ROOT 0x2u        /* takes a root (broadcast, scatter, ...) */
#define TC_OPF_PEER 0x4u        /* point to point with one peer */
#define TC_OPF_UNIFORM 0x8u     /* one count for every rank's block, the same
                                 * on every rank */
#define TC_OPF_SEND_CONTIG 0x10u /* the per-rank input blocks lie back to
                                  * back in one buffer */
#define TC_OPF_RECV_CONTIG 0x20u /* the per-rank output blocks lie back to
                                  * back in one buffer */
#define TC_COMM_OP_MAP(X)                                                      \
  X(SEND, send, SEND, TC_OPF_PEER)                                             \
  X(RECV, recv, RECV, TC_OPF_PEER)                                             \
  X(BROADCAST, broadcast, BROADCAST, TC_OPF_ROOT)                              \
  X(ALL_REDUCE, all_reduce, ALL_REDUCE, TC_OPF_REDUCE)                         \
  X(REDUCE, reduce, REDUCE, TC_OPF_REDUCE | TC_OPF_ROOT)                       \
  X(ALL_GATHER, all_gather, ALL_GATHER, TC_OPF_UNIFORM)                        \
  X(ALL_GATHER_V, all_gather_v, ALL_GATHER, 0)                                 \
  X(ALL_GATHER_SINGLE, all_gather_single, ALL_GATHER,                          \
    TC_OPF_UNIFORM | TC_OPF_RECV_CONTIG)                                       \
  X(REDUCE_SCATTER, reduce_scatter, REDUCE_SCATTER,                            \
    TC_OPF_REDUCE | TC_OPF_UNIFORM)                                            \
  X(REDUCE_SCATTER_V, reduce_scatter_v, REDUCE_SCATTER, TC_OPF_REDUCE)         \
  X(REDUCE_SCATTER_SINGLE, reduce_scatter_single, REDUCE_SCATTER,              \
    TC_OPF_REDUCE | TC_OPF_UNIFORM | TC_OPF_SEND_CONTIG)                       \
  X(ALL_TO_ALL_SINGLE, all_to_all_single, ALL_TO_ALL,                          \
    TC_OPF_UNIFORM | TC_OPF_SEND_CONTIG | TC_OPF_RECV_CONTIG)                  \
  X(ALL_TO_ALL_V_SINGLE, all_to_all_v_single, ALL_TO_ALL,                      \
    TC_OPF_SEND_CONTIG | TC_OPF_RECV_CONTIG)                                   \
  X(ALL_TO_ALL, all_to_all, ALL_TO_ALL, 0)                                     \
  X(BARRIER, barrier, BARRIER, 0)                                              \
  X(SCATTER, scatter, SCATTER, TC_OPF_ROOT | TC_OPF_UNIFORM)                   \
  X(GATHER, gather, GATHER, TC_OPF_ROOT | TC_OPF_UNIFORM)                      \
  X(GATHER_SINGLE, gather_single, GATHER,                                      \
    TC_OPF_ROOT | TC_OPF_UNIFORM | TC_OPF_RECV_CONTIG)
#define TC_OP_MAP(X)                                                           \
  TC_COMM_OP_MAP(X)                                                            \
  X(BATCH, batch_op_issue, BATCH, 0)

typedef enum tc_op_type {
#define TC__OP_ENUM(id, name, kind, flags) TC_OP_##id,
  TC_OP_MAP(TC__OP_ENUM)
#undef TC__OP_ENUM
  TC_OP_TYPE_COUNT
} tc_op_type_t;

/* The operation's name ("all_reduce"; "batch_op_issue" for a batch), or
 * "unknown" outside the enum. */
TC_API const char *tc_op_name(tc_op_type_t type);
/* The operation's TC_OPF_* flags (0 outside the enum). */
TC_API uint32_t tc_op_flags(tc_op_type_t type);

/* Point to point. peer is a rank of comm other than the caller. */
TC_API int tc_send(tc_comm_t *comm, const void *buf, size_t count,
                   tc_dtype_t dtype, int peer, const tc_op_options_t *opts,
                   tc_work_t **work);
TC_API int tc_recv(tc_comm_t *comm, void *buf, size_t count, tc_dtype_t dtype,
                   int peer, const tc_op_options_t *opts, tc_work_t **work);

/* In place: root's buf is copied to every rank's buf. */
TC_API int tc_broadcast(tc_comm_t *comm, void *buf, size_t count,
                        tc_dtype_t dtype, int root, const tc_op_options_t *opts,
                        tc_work_t **work);
/* In place: every rank's buf becomes the reduction over all ranks. */
TC_API int tc_all_reduce(tc_comm_t *comm, void *buf, size_t count,
                         tc_dtype_t dtype, tc_redop_t op,
                         const tc_op_options_t *opts, tc_work_t **work);
/* In place at root; other ranks' buf is left unchanged. */
TC_API int tc_reduce(tc_comm_t *comm, void *buf, size_t count,
                     tc_dtype_t dtype, tc_redop_t op, int root,
                     const tc_op_options_t *opts, tc_work_t **work);

/* recvbufs[i] (size entries, count elements each) receives rank i's sendbuf. */
TC_API int tc_all_gather(tc_comm_t *comm, void *const *recvbufs,
                         const void *sendbuf, size_t count, tc_dtype_t dtype,
                         const tc_op_options_t *opts, tc_work_t **work);
/* recvbufs[i] has recvcounts[i] elements; the caller's sendcount must equal
 * recvcounts[rank]. */
TC_API int tc_all_gather_v(tc_comm_t *comm, void *const *recvbufs,
                           const size_t *recvcounts, const void *sendbuf,
                           size_t sendcount, tc_dtype_t dtype,
                           const tc_op_options_t *opts, tc_work_t **work);
/* recvbuf holds size * count elements; rank i's block at i * count.
 * In place when sendbuf == recvbuf + rank * count elements. */
TC_API int tc_all_gather_single(tc_comm_t *comm, void *recvbuf,
                                const void *sendbuf, size_t count,
                                tc_dtype_t dtype, const tc_op_options_t *opts,
                                tc_work_t **work);

/* recvbuf (count elements) = reduction over ranks of their sendbufs[rank]. */
TC_API int tc_reduce_scatter(tc_comm_t *comm, void *recvbuf,
                             const void *const *sendbufs, size_t count,
                             tc_dtype_t dtype, tc_redop_t op,
                             const tc_op_options_t *opts, tc_work_t **work);
/* sendbufs[i] has sendcounts[i] elements; recvcount == sendcounts[rank]. */
TC_API int tc_reduce_scatter_v(tc_comm_t *comm, void *recvbuf,
                               size_t recvcount, const void *const *sendbufs,
                               const size_t *sendcounts, tc_dtype_t dtype,
                               tc_redop_t op, const tc_op_options_t *opts,
                               tc_work_t **work);
/* sendbuf holds size * count elements. In place when
 * recvbuf == sendbuf + rank * count elements. */
TC_API int tc_reduce_scatter_single(tc_comm_t *comm, void *recvbuf,
                                    const void *sendbuf, size_t count,
                                    tc_dtype_t dtype, tc_redop_t op,
                                    const tc_op_options_t *opts,
                                    tc_work_t **work);

/* Block i (count elements) of sendbuf goes to rank i; block j of recvbuf
 * comes from rank j. */
TC_API int tc_all_to_all_single(tc_comm_t *comm, void *recvbuf,
                                const void *sendbuf, size_t count,
                                tc_dtype_t dtype, const tc_op_options_t *opts,
                                tc_work_t **work);
/* Split sizes: sendcounts[i] elements go to rank i (blocks contiguous in
 * order), recvcounts[j] elements come from rank j. */
TC_API int tc_all_to_all_v_single(tc_comm_t *comm, void *recvbuf,
                                  const size_t *recvcounts, const void *sendbuf,
                                  const size_t *sendcounts, tc_dtype_t dtype,
                                  const tc_op_options_t *opts,
                                  tc_work_t **work);
/* Lists: sendbufs[i] (sendcounts[i]) to rank i, recvbufs[j] (recvcounts[j])
 * from rank j. */
TC_API int tc_all_to_all(tc_comm_t *comm, void *const *recvbufs,
                         const size_t *recvcounts, const void *const *sendbufs,
                         const size_t *sendcounts, tc_dtype_t dtype,
                         const tc_op_options_t *opts, tc_work_t **work);

TC_API int tc_barrier(tc_comm_t *comm, const tc_op_options_t *opts,
                      tc_work_t **work);

/* root's sendbufs[i] (count each; ignored elsewhere) goes to rank i's recvbuf. */
TC_API int tc_scatter(tc_comm_t *comm, void *recvbuf,
                      const void *const *sendbufs, size_t count,
                      tc_dtype_t dtype, int root, const tc_op_options_t *opts,
                      tc_work_t **work);
/* rank i's sendbuf goes to root's recvbufs[i] (ignored elsewhere). */
TC_API int tc_gather(tc_comm_t *comm, void *const *recvbufs,
                     const void *sendbuf, size_t count, tc_dtype_t dtype,
                     int root, const tc_op_options_t *opts, tc_work_t **work);
/* Like tc_gather into one buffer of size * count elements at root. */
TC_API int tc_gather_single(tc_comm_t *comm, void *recvbuf,
                            const void *sendbuf, size_t count, tc_dtype_t dtype,
                            int root, const tc_op_options_t *opts,
                            tc_work_t **work);

/* ------------------------------------------------------------------------ */
/* Batch send/recv: sends and receives issued together, completing in any   */
/* order without deadlock. Messages between one pair match in posted order. */
/* ------------------------------------------------------------------------ */

typedef struct tc_batch tc_batch_t;

TC_API int tc_batch_create(tc_comm_t *comm, tc_batch_t **out);
/* peer may be the caller's own rank (matched with its own recv). */
TC_API int tc_batch_send(tc_batch_t *batch, const void *buf, size_t count,
                         tc_dtype_t dtype, int peer);
TC_API int tc_batch_recv(tc_batch_t *batch, void *buf, size_t count,
                         tc_dtype_t dtype, int peer);
/* Issues every posted op as one operation. The batch may be issued again. */
TC_API int tc_batch_issue(tc_batch_t *batch, const tc_op_options_t *opts,
                          tc_work_t **work);
TC_API int tc_batch_free(tc_batch_t *batch);

/* ------------------------------------------------------------------------ */
/* Hooks: callbacks around every operation of a communicator                 */
/* ------------------------------------------------------------------------ */

typedef enum tc_hook_kind {
  TC_HOOK_PRE = 0,  /* before the operation is posted (issuing thread) */
  TC_HOOK_POST = 1, /* when it completed, failed or timed out */
  TC_HOOK_ABORT = 2 /* tc_comm_abort, or before the process aborts on error */
} tc_hook_kind_t;

/* What a hook is told about an operation. Valid during the call only. */
typedef struct tc_op_info {
  uint32_t size;         /* sizeof(tc_op_info_t): fields may be appended */
  tc_comm_t *comm;       /* the communicator's handle */
  const char *comm_name;
  int rank, comm_size;
  tc_op_type_t type;     /* TC_OP_TYPE_COUNT for an abort hook */
  const char *name;      /* "all_reduce" ("abort" for an abort hook) */
  uint64_t op_id;        /* the operation's number on this communicator, from 1 */
  uint64_t coll_seq;     /* collectives only: the same on every rank, from 1 (else 0) */
  uint64_t p2p_seq;      /* send, recv, batch: this rank's p2p number (else 0) */
  tc_dtype_t dtype;
  int redop;             /* tc_redop_type_t, -1 when the op takes none */
  int root;              /* root or peer, -1 when none */
  size_t count;          /* the call's count argument (per rank) */
  size_t in_bytes;       /* bytes this rank contributes */
  size_t out_bytes;      /* bytes this rank receives */
  int async_op;          /* 1: issued with a work handle */
  double timeout_s;
  /* POST only */
  int status;            /* TC_OK or the error */
  int work_status;       /* TC_WORK_COMPLETED / TIMEDOUT / ERROR */
  double duration_s;     /* from start (issue when never started) to the end */
  const char *error;     /* the error text, "" when status is TC_OK */
} tc_op_info_t;

/* A hook. PRE hooks run on the issuing thread, in issue order, right before
 * the operation is posted (the communicator's lock is held: a hook must not
 * call operations of the same communicator); returning non-zero refuses the
 * operation: it fails with TC_ERR_INVALID_USAGE and the text the hook put
 * with tc_hook_refuse (or "refused by a pre-hook"), and is not posted
 * (every rank keeps its numbering). POST hooks run once per operation, on
 * whichever thread saw it end (the backend's progress thread or a waiter):
 * they must not block. ABORT hooks run before tc_comm_abort aborts, and
 * before the process ends on an error (abort_process_on_timeout_or_error).
 * The return value of POST and ABORT hooks is ignored. */
typedef int (*tc_hook_fn)(tc_hook_kind_t kind, const tc_op_info_t *info, void *user);

/* Registers fn on comm; *id (may be NULL) identifies it for unregistering.
 * Hooks of one kind run in registration order. With no hook registered an
 * operation pays one load. */
TC_API int tc_comm_register_hook(tc_comm_t *comm, tc_hook_kind_t kind, tc_hook_fn fn,
                                 void *user, uint64_t *id);
/* Removes the hook `id`; TC_ERR_INVALID_ARGUMENT if comm has no such hook.
 * Once it returns, the hook is not running and never runs again. */
TC_API int tc_comm_unregister_hook(tc_comm_t *comm, uint64_t id);
/* From a PRE hook: the reason its refusal gives (copied). */
TC_API void tc_hook_refuse(const char *reason);
/* The number the next operation on comm will get (tc_op_info_t.op_id);
 * 0 on a bad handle. */
TC_API uint64_t tc_comm_next_op_id(const tc_comm_t *comm);

/* ------------------------------------------------------------------------ */
/* Flight recorder: the last operations of every communicator                */
/* ------------------------------------------------------------------------ */

/* Each communicator keeps its last N operations (TORCH_FR_BUFFER_SIZE,
 * default 2000; 0 turns it off) with their state (scheduled, started,
 * completed, failed, timed_out), sizes, dtypes and times. On a timeout, a
 * lost peer and an abort, every rank writes its trace to <prefix><rank>
 * when a prefix is set (TORCHCOMM_FR_DUMP_TEMP_FILE, else
 * TORCH_FR_DUMP_TEMP_FILE), before the failure is returned. The file is torch's
 * Flight Recorder dump (a pickle, version "2.10"), which its analyser reads:
 *     python -m torch.distributed.flight_recorder.fr_trace <folder>
 * (the cpu backend's operations are named "gloo:<op>" there, the names the
 * analyser knows). */

/* The trace of comm (or of every live communicator of the process when
 * comm is NULL) as JSON in torch's Flight Recorder format; *out is released
 * with tc_free. include_completed = 0 leaves completed entries out. */
TC_API int tc_fr_dump_json(const tc_comm_t *comm, int include_completed, char **out);
/* Writes the trace of every live communicator (tc_fr_dump_json(NULL, 1)) as
 * torch's pickled dump to `path` (NULL: <TORCH_FR_DUMP_TEMP_FILE><global
 * rank>, or TORCHCOMM_FR_DUMP_TEMP_FILE's); the path written goes to
 * *written when not NULL (tc_free). */
TC_API int tc_fr_dump_file(const char *path, char **written);
/* Entries recorded on comm (at most its capacity). */
TC_API size_t tc_fr_size(const tc_comm_t *comm);
/* Forgets comm's entries (NULL: every communicator's). */
TC_API int tc_fr_reset(const tc_comm_t *comm);
/* Makes comm keep at least `entries` operations from now on (a larger ring;
 * never shrinks). */
TC_API int tc_fr_reserve(tc_comm_t *comm, size_t entries);

/* ------------------------------------------------------------------------ */
/* One-sided windows (docs/windows.md)                                       */
/* ------------------------------------------------------------------------ */

/* A window is memory of every rank of a communicator that the other ranks
 * write (put) and read (get) without the owner posting anything, plus one
 * signal counter per (origin, target) pair. torchcomms' TorchCommWindow;
 * MPI's RMA windows with passive-target synchronisation.
 *
 * Completion and visibility: a put or get is complete when it returns (or
 * when its work completes): the source may be reused, the destination of a
 * get holds the data. A put is visible at the target once the target's
 * tc_window_wait_signal for a signal the origin sent after the put returns,
 * or once the origin's tc_window_flush(peer) returns. Signals from one
 * origin to one target are counted: each tc_window_wait_signal(peer) takes
 * one signal of `peer` that no earlier wait took.
 *
 * Asynchronous calls (work != NULL): put, get, signal and flush run at once
 * and return a work already complete (or failed); an asynchronous
 * wait_signal returns at once and its work completes when the signal is
 * there: tc_work_wait waits for it (with the operation's deadline),
 * tc_work_test looks without waiting. Every wait has the deadline of the
 * operation (opts->timeout_s, else the communicator's timeout), fails at
 * once on tc_comm_abort, and fails with TC_ERR_REMOTE naming the peer when
 * the peer dies. Window calls are not collectives: they do not take a
 * collective sequence number, fire no hooks and are not in the flight
 * recorder (as in torchcomms). */
typedef struct tc_window tc_window_t;

/* How a rank's window memory is reached from this process
 * (torchcomms' TorchCommWinAccessType): UNIFIED: mapped here, tc_window_map
 * gives a pointer (load/store access, a put is a memcpy); SEPARATE: only
 * through put and get. */
typedef enum tc_win_access {
  TC_WIN_ACCESS_UNIFIED = 0,
  TC_WIN_ACCESS_SEPARATE = 1
} tc_win_access_t;

/* Creates a window over comm: collective, every rank calls it in the same
 * order as its other collectives on comm. buf != NULL: the window is the
 * caller's `bytes` bytes at buf (kept valid until tc_window_free); on one
 * host peers reach it with single-copy reads and writes (process_vm_*),
 * else through this rank's window service. buf == NULL: the library
 * allocates `bytes` zeroed bytes (64-byte aligned; tc_window_base gives
 * them), in shared memory that the peers on this host map, so that puts and
 * gets are copies and tc_window_map works. bytes may differ between ranks,
 * and may be 0 (a rank nobody targets). opts: timeout and hints (may be
 * NULL). */
TC_API int tc_window_create(tc_comm_t *comm, void *buf, size_t bytes,
                            const tc_op_options_t *opts, tc_window_t **win);
/* Frees the window: collective (a barrier first, so that no peer still
 * reaches this rank's memory), then releases its memory, mappings and
 * service. Library-allocated memory is unmapped here unless a pointer of
 * tc_window_map is still held by tc_window_map_ref (below). A window whose
 * communicator was finalized, aborted or reconfigured is released without
 * the barrier. */
TC_API int tc_window_free(tc_window_t *win);
/* The caller's window memory (buf, or the library's allocation). */
TC_API void *tc_window_base(const tc_window_t *win);
/* The communicator of the window (a borrowed handle). */
TC_API tc_comm_t *tc_window_comm(const tc_window_t *win);
/* The size in bytes of rank `rank`'s window. */
TC_API int tc_window_size(const tc_window_t *win, int rank, size_t *bytes);
/* How `rank`'s window is reached from here (the caller's own: UNIFIED). */
TC_API int tc_window_access(const tc_window_t *win, int rank, tc_win_access_t *access);
/* A pointer to `rank`'s window memory mapped in this process (zero copy),
 * valid until tc_window_free; TC_ERR_NOT_SUPPORTED with the reason when it
 * cannot be mapped (another host, or a peer's user buffer). */
TC_API int tc_window_map(tc_window_t *win, int rank, void **ptr);
/* Like tc_window_map, and keeps that memory mapped after tc_window_free
 * until tc_window_map_release(ptr) (a torch tensor over a peer's window
 * outliving the window). The caller's own library-allocated memory
 * (rank == its rank, buf == NULL at creation) can be held the same way. */
TC_API int tc_window_map_ref(tc_window_t *win, int rank, void **ptr);
/* Drops a hold of tc_window_map_ref (ptr as it returned it). */
TC_API int tc_window_map_release(void *ptr);

/* Writes `bytes` bytes from src into peer's window at byte `offset`.
 * offset + bytes beyond the peer's window is TC_ERR_INVALID_ARGUMENT before
 * any byte moves. peer may be the caller. */
TC_API int tc_window_put(tc_window_t *win, const void *src, size_t bytes, int peer,
                         size_t offset, const tc_op_options_t *opts, tc_work_t **work);
/* Reads `bytes` bytes of peer's window at byte `offset` into dst. */
TC_API int tc_window_get(tc_window_t *win, void *dst, size_t bytes, int peer,
                         size_t offset, const tc_op_options_t *opts, tc_work_t **work);
/* Adds one to peer's signal counter for this rank, after every put this
 * rank issued to peer before (they are visible when peer's wait returns). */
TC_API int tc_window_signal(tc_window_t *win, int peer, const tc_op_options_t *opts,
                            tc_work_t **work);
/* Waits for one signal from peer that no earlier wait took. */
TC_API int tc_window_wait_signal(tc_window_t *win, int peer,
                                 const tc_op_options_t *opts, tc_work_t **work);
/* Returns once every put this rank issued to peer (-1: to every peer) is
 * visible in the peer's memory. */
TC_API int tc_window_flush(tc_window_t *win, int peer, const tc_op_options_t *opts,
                           tc_work_t **work);
/* Collective (MPI_Win_fence): every rank's puts before it, to any rank, are
 * visible everywhere when it returns on any rank (a flush to every peer,
 * then a barrier of the communicator). */
TC_API int tc_window_fence(tc_window_t *win, const tc_op_options_t *opts);

/* ------------------------------------------------------------------------ */
/* Environment (for launchers and tests)                                     */
/* ------------------------------------------------------------------------ */

/* Rank and world size from the environment, in the order TORCHCOMM_RANK /
 * TORCHCOMM_SIZE, OMPI_COMM_WORLD_RANK / _SIZE, PMI_RANK / PMI_SIZE,
 * SLURM_PROCID / SLURM_NTASKS, RANK / WORLD_SIZE; under an elastic agent
 * (TORCHELASTIC_RUN_ID set: torchrun, tcrun) RANK / WORLD_SIZE come right
 * after TORCHCOMM_*. *source names the pair used ("none" -> rank 0 of 1). */
TC_API int tc_env_rank_size(int *rank, int *size, const char **source);

#ifdef __cplusplus
}
#endif
#endif /* TORCHCOMMS_H */

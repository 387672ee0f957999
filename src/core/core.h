/* core.h -- the core's internal types: communicators, work objects, batches,
 * the backend loader and the op path shared by every operation. */
#ifndef TC_CORE_H
#define TC_CORE_H

#include <pthread.h>
#include <stdatomic.h>

#include "handles.h"
#include "internal.h"
#include "bootstrap/bootstrap.h" /* tc__default_store */

#define TC_COMM_MAGIC 0x74636f6du  /* 'tcom' */
#define TC_COMM_DEAD 0x64656164u   /* destroyed */
#define TC_WORK_MAGIC 0x7477726bu  /* 'twrk' */
#define TC_WORK_FREED 0x66726565u  /* released to the pool */
#define TC_BATCH_MAGIC 0x74626174u /* 'tbat' */
#define TC_BATCH_FREED 0x62667265u

/* UNCONFIGURED: a reconfigurable communicator without members (before its
 * first reconfigure, or after one failed); RECONFIGURING: while
 * tc_comm_reconfigure replaces its backend state. */
enum {
  TC_STATE_ACTIVE = 0,
  TC_STATE_FINALIZED,
  TC_STATE_ABORTED,
  TC_STATE_UNCONFIGURED,
  TC_STATE_RECONFIGURING
};

/* The communicator's lock (tc_comm_t.mu): a compare-and-swap to take it, a
 * release store to give it back, with no locked instruction (glibc's
 * unlock is an exchange, which waits for every store of the operation
 * before it: about 5 % of a small operation, docs/benchmarks.md). A thread
 * that finds it taken spins briefly, then sleeps on a futex; the unlocker
 * wakes it when it sees a sleeper, and as that look has no fence before
 * it, a sleeper also looks again every millisecond, so a missed wake-up
 * costs at most that. No condition variable waits on it. */
typedef struct {
  _Atomic int state;    /* 0 free, 1 taken */
  _Atomic int sleepers; /* threads in (or about to enter) the futex wait */
} tc__lock_t;
TC_INTERNAL void tc__lock_slow(tc__lock_t *l);
TC_INTERNAL void tc__lock_wake(tc__lock_t *l);
static inline void tc__lock_init(tc__lock_t *l) {
  atomic_store(&l->state, 0);
  atomic_store(&l->sleepers, 0);
}
static inline void tc__lock(tc__lock_t *l) {
  int z = 0;
  if (__builtin_expect(atomic_compare_exchange_strong_explicit(
                           &l->state, &z, 1, memory_order_acquire, memory_order_relaxed),
                       1))
    return;
  tc__lock_slow(l);
}
/* 1 if taken without waiting, else 0 (not taken). */
static inline int tc__trylock(tc__lock_t *l) {
  int z = 0;
  return atomic_compare_exchange_strong_explicit(&l->state, &z, 1, memory_order_acquire,
                                                 memory_order_relaxed);
}
static inline void tc__unlock(tc__lock_t *l) {
  atomic_store_explicit(&l->state, 0, memory_order_release);
  if (__builtin_expect(atomic_load_explicit(&l->sleepers, memory_order_relaxed) != 0, 0))
    tc__lock_wake(l);
}

/* A communicator lives in a slot of the communicator table (comm.c): users
 * hold the slot's handle (handles.h), the core and the backends' callbacks
 * the struct. The struct is reused by the slot's next communicator once it
 * was destroyed and no work refers to it any more (refs). */
struct tc_comm {
  uint32_t magic;
  uint32_t slot;   /* index in the communicator table */
  _Atomic int refs; /* the user's handle until destroyed, + one per work */
  /* a work kept for the next synchronous operation (no table, no handle);
   * stays with the struct when it is reused */
  _Atomic(tc_work_t *) spare_work;
  _Atomic int spare_made; /* the spare exists (made once per struct) */
  tc_comm_t *handle; /* the handle users hold (slot + generation) */
  char name[128];
  char backend_name[64];
  char device[32];
  int device_index;
  int rank;
  int size;
  double timeout_s;
  int abort_process;
  tc_hint_t *hints; /* owned copies; read and replaced under hints_mu */
  size_t num_hints;
  /* hint arrays tc_comm_set_hints replaced, kept until the communicator is
   * released (tc_comm_get_options hands out pointers into them) */
  struct tc_old_hints *old_hints;
  pthread_mutex_t hints_mu;
  tc_store_t *root_store; /* the job's store (a reference) */
  tc_store_t *store;      /* prefixed for this communicator */
  char prefix[256];
  const tc_backend_ops_t *ops;
  void *bcomm;
  tc__lock_t mu; /* state, seq, last_error; held while posting */
  int state;
  uint64_t seq;
  uint64_t split_seq;
  _Atomic int64_t last_progress_ns; /* last start/completion, monotonic (relaxed: a
                                     * time for deadlines, no data behind it) */
  pthread_mutex_t err_mu; /* last_error only: taken inside backend callbacks */
  char last_error[1024];
  /* collectives / p2p issued (under mu); coll_seq is stored with
   * tc__comm_set_coll_seq, since a dump reads it without mu (flight.c) */
  uint64_t coll_seq, p2p_seq;
  /* synchronous collectives may take the backend's express entry (ops.c:
   * the backend has one and TORCHCOMMS_EXPRESS is on), and synchronous
   * send, recv and batch operations too when express_p2p (the backend has
   * TC_BACKEND_CAP_EXPRESS_P2P); express_ops: how many did (under mu) */
  int express, express_p2p;
  uint64_t express_ops;
  /* an express operation runs (between its begin and its end): set under
   * mu, cleared by its end without it; another thread's synchronous
   * operation meanwhile takes the work path, so that express operations
   * on one communicator never overlap (flight.c relies on it) */
  _Atomic int express_busy;
  /* the last (type, dtype, reduction) the backend's supports() accepted
   * (tc__v_supports), 0: none */
  _Atomic uint32_t supported;
  int *granks; /* [size]: the job-wide rank of each rank (NULL: the identity) */
  /* hooks (hooks.c): counts per kind, read without a lock (0: none) */
  _Atomic int nhooks[3];
  pthread_rwlock_t hooks_lock; /* the list: read while calling, written by (un)register */
  struct tc__hook *hooks;
  size_t hooks_n, hooks_cap;
  /* flight recorder (flight.c) */
  _Atomic int fr_lock; /* flight.c's spin lock */
  struct tc__fr_entry *fr; /* ring of fr_cap entries */
  size_t fr_cap;
  uint64_t fr_count; /* entries ever recorded (record ids 0 .. fr_count-1) */
  size_t fr_next;    /* fr_count % fr_cap, kept without a division */
  uint64_t fr_base;  /* ids below were reset: not dumped */
  void **fr_stacks;  /* [fr_cap][TC_FR_FRAMES] return addresses (TORCH_FR_CPP_STACK), or NULL */
  _Atomic int fr_dumped; /* an automatic dump was written for this communicator */
  /* the last express operation's completion, written without fr_lock
   * (tc__fr_end_express) and moved into its entry by whoever takes
   * fr_lock next: fr_pend_id is its id + 1 (0: none), stored last */
  _Atomic uint64_t fr_pend_id;
  size_t fr_pend_slot;
  double fr_pend_started, fr_pend_end;
  /* status board (hang.c): every rank's progress, in shared memory */
  struct tc__board_slot *board; /* [size], or NULL */
  size_t board_bytes;
  char board_name[128]; /* while rank 0 still has to unlink it */
  _Atomic int hang_reported;
  _Atomic uint64_t done_coll; /* the last collective completed (with or without a board) */
  _Atomic int done_type;
  /* fault tolerance (reconfig.c) */
  int reconfigurable;           /* created with enable_reconfigure */
  int private_store;            /* an in-process store: the backend bootstraps itself */
  struct tc_store_server *rc_server; /* the endpoint its init handle names */
  char init_handle[256];        /* TC_INIT_HANDLE_MAX */
  uint32_t epoch;               /* of the current configuration (0: none) */
  _Atomic int rc_cancel;        /* abort() while reconfiguring: give up */
  /* one-sided windows (window.c) */
  pthread_mutex_t win_mu;
  struct tc_window *wins; /* live windows of this communicator */
  uint64_t win_seq; /* windows created (the store keys of a device communicator) */
};

/* A work lives in a slot of the work table (work.c), reused after its last
 * reference is dropped; users hold the slot's handle, which is stale from
 * tc_work_release on, also once the slot serves a later operation. */
struct tc_work {
  uint32_t magic;
  uint32_t slot;     /* index in the work table */
  tc_work_t *handle; /* the handle given to the user (slot + generation) */
  _Atomic int refs;
  tc_comm_t *comm; /* holds a reference (refs) until the work is reused, if comm_ref */
  int comm_ref;    /* 1: the work holds a reference to comm (a synchronous
                    * operation's work that ends inside its post never
                    * takes one: the issuing thread holds comm->mu meanwhile,
                    * which destroy waits for, comm_abort) */
  const char *opname;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  _Atomic int status; /* tc_work_status_t */
  int rc;
  double issue_time;
  double start_time;
  double end_time;
  double timeout_s;
  tc_backend_op_t op;
  uint64_t coll_seq, p2p_seq; /* see tc_op_info_t */
  uint64_t fr_id;  /* flight-recorder record id + 1 (0: not recorded) */
  size_t fr_slot;  /* its place in the ring when recorded (fr_id - 1) % fr_cap */
  void *arrays; /* owned copies of the op's lists, reused across uses */
  size_t arrays_cap;
  /* a work that finishes when it is looked at (an asynchronous
   * wait_signal, window.c): tc_work_wait / test / status call drive (block
   * 0: look once; 1: wait until limit, 0 = the work's deadline), which
   * finishes it with tc__work_fail_local; NULL for every other work */
  void (*drive)(tc_work_t *w, int block, double limit);
  _Atomic int posting; /* inside the backend's post call (tc__op_issue): a start
                * reported now is the issue time (no second clock read), and no
                * one can be waiting on the work yet */
  _Atomic int fr_start_due; /* started while posting: the recorder's "started"
                * is written after the post (or with the end, if sooner) */
  _Atomic int finishing; /* the first caller of work_finish set it */
  pthread_t post_thread; /* the thread in the post call, while posting */
  int inline_done; /* ended inside its post, on the posting thread (work_inline):
                * the backend's reference was kept for the caller to drop with
                * its own, no other thread having seen the work (tc__op_issue) */
  /* the posting call's wait hooks (tc_op_options_t.wait_release), set
   * for the post only (tc__op_issue sets it before every post and clears it
   * after): host->work_blocking lets the caller's lock go */
  struct tc__waith *waith;
  _Atomic int waiters;   /* threads in a wait on cv (under mu): a finisher
                * with none to wake takes no lock */
  int spare;       /* a communicator's spare work (tc_comm_t.spare_work), outside
                    * the work table: synchronous operations only, no handle */
  uintptr_t win_h; /* the window's handle */
  int win_peer;
  uint64_t win_target;
  char msg[1024];
};

/* A batch lives in a slot of the batch table (batch.c); the handle users hold
 * is the slot's index and generation, never a pointer, so a freed or stale
 * handle is an error and never touches memory, and the table's size is
 * bounded by the most batches alive at once. */
struct tc_batch {
  uint32_t magic;
  uint32_t slot; /* index in the batch table */
  tc_comm_t *comm; /* the communicator's handle (not the struct): checked at every use */
  tc_p2p_t *ops; /* kept (emptied) when freed, reused by the slot's next batch */
  size_t n, cap;
};


/* One-sided windows (window.c). Releases the backend's side of every
 * window of c (before the backend state goes: finalize, abort, destroy,
 * reconfigure); their handles stay, their operations fail with `why`. */
TC_INTERNAL void tc__windows_drop(tc_comm_t *c, const char *why);

/* A call's wait hooks (tc_op_options_t.wait_release, wait_reacquire,
 * wait_arg) and whether they let the caller's lock go (tc__op_issue): at
 * most once per call, taken back once when it returns. */
typedef struct tc__waith {
  void (*release)(void *arg);
  void (*reacquire)(void *arg);
  void *arg;
  int released;
} tc__waith_t;
static inline void tc__waith_release(tc__waith_t *h) {
  if (h && !h->released) {
    h->released = 1;
    h->release(h->arg);
  }
}

/* Work objects (work.c). */
/* A work for a synchronous operation: the communicator's spare when free
 * (no handle table, no handle), else tc__work_alloc's. With comm->mu held. */
TC_INTERNAL tc_work_t *tc__work_alloc_sync(tc_comm_t *comm, const char *opname,
                                           double timeout_s);
/* A work of tc__work_alloc_sync that outlives its post (with comm->mu
 * held, before it is unlocked): it takes its reference to the
 * communicator. */
TC_INTERNAL void tc__work_hold_comm(tc_work_t *w);
/* Drops the caller's reference to a work that ended inline (inline_done),
 * which no other thread holds: both references at once, no locked
 * instruction. */
TC_INTERNAL void tc__work_unref_inline(tc_work_t *w);
TC_INTERNAL tc_work_t *tc__work_alloc(tc_comm_t *comm, const char *opname,
                                      double timeout_s);
/* Reserves `bytes` of owned array space in the work (aligned 16). */
TC_INTERNAL void *tc__work_arrays(tc_work_t *w, size_t bytes);
TC_INTERNAL void tc__work_unref(tc_work_t *w);
/* Resolves the user's work handle *w to its live work in place; an error
 * ("already released", "not a work handle", NULL) otherwise. */
TC_INTERNAL int tc__work_enter(tc_work_t **w, const char *fn);
/* The handle given to the user for w. */
TC_INTERNAL tc_work_t *tc__work_handle(const tc_work_t *w);
/* Waits for w until its deadline (tc_work_wait on the struct). */
TC_INTERNAL int tc__work_wait(tc_work_t *w);
/* Called once the backend's post returned: records a start reported inside
 * the post (host_work_started defers it so that an operation run inline
 * updates the flight recorder once). */
TC_INTERNAL void tc__work_posted(tc_work_t *w);
/* A synchronous operation the backend ran in its express entry
 * (tc_backend_ops_t.express; ops.c) failed with status and the backend's
 * reason: reported as the work path reports a failure (the library's one
 * message format, the hang report, the flight recorder's entry fr_id /
 * fr_slot, the status board, the communicator's last error, the process
 * abort when configured), through the communicator's spare work. op: the
 * operation (issue_time, timeout_s set), coll_seq its number as a
 * collective, else p2p_seq as a point-to-point operation (the other 0).
 * Returns the failure's code, its text set as the thread's last error.
 * Under c->mu. */
TC_INTERNAL int tc__work_express_failed(tc_comm_t *c, const tc_backend_op_t *op,
                                        uint64_t coll_seq, uint64_t p2p_seq, uint64_t fr_id,
                                        size_t fr_slot, int status, const char *reason);
/* Completes a work that never reached the backend (validation failure). */
TC_INTERNAL void tc__work_fail_local(tc_work_t *w, int rc, const char *msg);
TC_INTERNAL extern const tc_backend_host_t tc__host;

/* Communicator helpers (comm.c). */
/* The one check of a user's communicator handle: resolves *c to the live
 * communicator in place, or fails ("argument 'comm' is NULL", "the
 * communicator handle was destroyed", "argument 'comm' is not a communicator
 * handle") without reading anything but the handle table. */
TC_INTERNAL int tc__comm_enter(tc_comm_t **c, const char *fn);
/* References held by works on a communicator's struct (not its handle). */
TC_INTERNAL void tc__comm_ref(tc_comm_t *c);
/* Every live communicator, each with a reference (tc__comm_unref each, free
 * the array); returns the count. */
TC_INTERNAL size_t tc__comm_all(tc_comm_t ***out);
TC_INTERNAL void tc__comm_unref(tc_comm_t *c);
/* Formats "torchcomms: <fn> on '<name>' (rank r of n): " + message into the
 * thread's error and the communicator's last error; returns rc. */
/* The library's one message format, "torchcomms: <fn> on '<name>' (rank r
 * of n): <detail>", into out (c may be NULL). */
TC_INTERNAL void tc__comm_message(const tc_comm_t *c, const char *fn, const char *detail,
                                  char *out, size_t len);
TC_INTERNAL int tc__comm_error(tc_comm_t *c, int rc, const char *fn,
                               const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
TC_INTERNAL void tc__comm_record_error(tc_comm_t *c, const char *text);
/* The address peers should connect to: TORCHCOMMS_SOCKET_ADDR, else the
 * local address of store's connection (store may be NULL), else 127.0.0.1. */
TC_INTERNAL const char *tc__comm_advertise_addr(tc_store_t *store);
/* Backend init (or native split) for c->rank of c->size on c->root_store
 * + c->prefix, then the status board; fn names the caller in messages. */
TC_INTERNAL int tc__comm_start(tc_comm_t *c, const tc_comm_t *parent, const int *ranks,
                               size_t nranks, const char *fn, double timeout_s);
/* reconfig.c: a reconfigurable communicator's endpoint and handle, made at
 * creation (TC_OK or the error set); stopped at finalize and release. */
TC_INTERNAL int tc__reconfig_open(tc_comm_t *c, const char *fn);
TC_INTERNAL void tc__reconfig_close(tc_comm_t *c);
/* The text of a state that refuses operations, for messages. */
/* c->state, read atomically: it is written (atomically, under c->mu) by
 * abort, finalize and reconfigure, also from other threads. */
TC_INTERNAL int tc__comm_state(tc_comm_t *c);
/* Why c's state refuses operations (c->state != ACTIVE), for messages;
 * *rc receives the error code (TC_ERR_ABORTED for an aborted one). */
TC_INTERNAL const char *tc__comm_state_refusal(const tc_comm_t *c, int state, int *rc);

/* An operation as the user called it (one of its forms: one buffer, a list
 * of buffers, counts per rank), validated but not yet normalised. */
typedef struct tc__op_args {
  tc_op_type_t type;
  tc_dtype_t dtype;
  tc_redop_t redop;
  int root; /* root or peer; -1 */
  size_t count;
  const void *sendbuf;
  void *recvbuf;
  const void *const *sendbufs;
  void *const *recvbufs;
  const size_t *sendcounts;
  const size_t *recvcounts;
  const tc_p2p_t *p2p;
  size_t num_p2p;
} tc__op_args_t;

/* The normalised descriptor of a call on rank `rank` of `size`: per-rank
 * blocks resolved from the call's form (tc_backend_op_t), its arrays (blocks,
 * a copy of the batch's list) in `arrays` of tc__op_arrays_size() bytes
 * (16-byte aligned). */
TC_INTERNAL size_t tc__op_arrays_size(const tc__op_args_t *a, int rank, int size);
TC_INTERNAL void tc__op_describe(const tc__op_args_t *a, int rank, int size, void *arrays,
                                 tc_backend_op_t *op);

/* Issues a validated call: asks the backend whether it runs it
 * (supports), normalises it into the work's descriptor (tc_backend_op_t:
 * per-rank blocks resolved, lists copied), posts it in issue order, and
 * either returns the work (async) or waits for it. */
TC_INTERNAL int tc__op_issue(tc_comm_t *c, const char *fn, const tc__op_args_t *a,
                             const tc_op_options_t *opts, tc_work_t **work);
/* How many operations of comm (a user's handle) took the express path
 * (tests, docs/benchmarks.md); 0 for an invalid handle. */
TC_INTERNAL uint64_t tc__comm_express_ops(const tc_comm_t *comm);
/* TC_ERR_NOT_SUPPORTED with a message unless the backend runs type on dt
 * with reduction redop (-1: none; dt TC_DTYPE_COUNT: any). */
TC_INTERNAL int tc__v_supports(tc_comm_t *c, const char *fn, tc_op_type_t type,
                               tc_dtype_t dt, int redop);

/* Argument checks shared by every operation (ops.c): each returns TC_OK or
 * sets the full message ("torchcomms: <fn> on '<comm>' (rank r of n): argument
 * ...") and returns the error. */
/* Resolves the user's handle *c in place (tc__comm_enter), then checks the
 * communicator's state and the options. */
TC_INTERNAL int tc__v_comm(tc_comm_t **c, const char *fn, const tc_op_options_t *o);
TC_INTERNAL int tc__v_dtype(tc_comm_t *c, const char *fn, tc_dtype_t dt);
/* count elements of dt, times mult, must fit in the addressable size. */
TC_INTERNAL int tc__v_count(tc_comm_t *c, const char *fn, const char *arg,
                            size_t count, tc_dtype_t dt, size_t mult);
TC_INTERNAL int tc__v_buf(tc_comm_t *c, const char *fn, const char *arg,
                          const void *p, size_t count);
TC_INTERNAL int tc__v_rank(tc_comm_t *c, const char *fn, const char *arg, int r);

/* Creation keys (comm_keys.c): the attempt-scoped prefix "tc/<job>/<attempt>/
 * <name>/<n>"; the arrival ticket that detects keys left by an earlier job
 * (fails with a message that says so); recording of the keys the backend
 * writes during init (the calling thread's host store calls between begin
 * and end), deleted at end when delete_keys. */
TC_INTERNAL void tc__comm_scope_prefix(char *buf, size_t len, const char *name,
                                       uint64_t generation);
TC_INTERNAL int tc__comm_arrive(tc_comm_t *c, const char *fn);
TC_INTERNAL void tc__comm_record_begin(tc_comm_t *c, void **token);
TC_INTERNAL void tc__comm_record_end(tc_comm_t *c, void *token, int delete_keys);
TC_INTERNAL int tc__host_store_set(tc_store_t *s, const char *key, const void *v,
                                   size_t len);
TC_INTERNAL int tc__host_store_add(tc_store_t *s, const char *key, int64_t delta,
                                   int64_t *result);

/* Hooks (hooks.c). */
/* Bytes this rank contributes (in) and receives (out) in op. */
TC_INTERNAL void tc__op_bytes(const tc_backend_op_t *op, int rank, int size, size_t *in,
                              size_t *out);
/* The description of w's operation for hooks and the logger (post fields
 * when the work finished). */
TC_INTERNAL void tc__op_info(const tc_work_t *w, tc_op_info_t *info);
/* Runs c's PRE hooks for w (under c->mu, before post): TC_OK, or the
 * refusal (message in why). */
TC_INTERNAL int tc__hooks_pre(tc_comm_t *c, const tc_work_t *w, char *why, size_t len);
TC_INTERNAL void tc__hooks_post(tc_comm_t *c, const tc_work_t *w);
TC_INTERNAL void tc__hooks_abort(tc_comm_t *c);
TC_INTERNAL void tc__hooks_init(tc_comm_t *c);
TC_INTERNAL void tc__hooks_free(tc_comm_t *c);

/* Flight recorder (flight.c). */
#define TC_FR_FRAMES 16
enum { TC_FR_SCHEDULED = 0, TC_FR_STARTED, TC_FR_COMPLETED, TC_FR_FAILED, TC_FR_TIMED_OUT };
TC_INTERNAL void tc__fr_init(tc_comm_t *c);
TC_INTERNAL void tc__fr_free(tc_comm_t *c);
/* Records w's operation (issue: under c->mu, right before post). */
TC_INTERNAL void tc__fr_issue(tc_comm_t *c, tc_work_t *w);
/* w's entry moves to state (TC_FR_*). */
TC_INTERNAL void tc__fr_update(tc_work_t *w, int state);
/* The same two for an operation without a work (ops.c, the express path):
 * records op (collective number coll_seq, or point-to-point number
 * p2p_seq, the other 0), started at `created` (no stack frames: the
 * express path is not taken when they are kept); returns its id + 1 (0:
 * not recorded) and its place in *slot; then moves that entry to state
 * with the operation's times. */
TC_INTERNAL uint64_t tc__fr_record_started(tc_comm_t *c, const tc_backend_op_t *op,
                                           uint64_t coll_seq, uint64_t p2p_seq, double created,
                                           double timeout_s, size_t *slot);
TC_INTERNAL void tc__fr_set(tc_comm_t *c, uint64_t fr_id, size_t slot, int state, double issued,
                            double started, double ended);
/* An express operation's completion (TC_FR_COMPLETED, started at `started`,
 * ended at `ended`), without taking fr_lock: kept aside in c and moved into
 * the entry by the next taker of the lock (the next operation's record, a
 * dump, any reader), so that no locked instruction waits on the
 * operation's stores at its end. Only from the express path's end: express
 * operations on c never overlap (express_busy), and each one's record took
 * the lock, so nothing kept aside is overwritten unread. */
TC_INTERNAL void tc__fr_end_express(tc_comm_t *c, uint64_t fr_id, size_t slot, double started,
                                    double ended);
/* The automatic dump on a failure or abort: once per communicator, to
 * <TORCH_FR_DUMP_TEMP_FILE><rank> when that prefix is set. */
TC_INTERNAL void tc__fr_auto_dump(tc_comm_t *c, const char *why);
/* The job-wide rank files are named after (the first communicator's). */
TC_INTERNAL int tc__fr_global_rank(void);
TC_INTERNAL void tc__fr_set_global_rank(int rank);

/* Status board and hang report (hang.c). */
/* At the end of creation, once the backend's init returned: rank 0 makes
 * the board, the others map it. Never fails the creation. */
TC_INTERNAL void tc__board_setup(tc_comm_t *c);
TC_INTERNAL void tc__board_free(tc_comm_t *c);
TC_INTERNAL void tc__board_issue(tc_comm_t *c, const tc_work_t *w);
TC_INTERNAL void tc__board_done(tc_comm_t *c, const tc_work_t *w, int rc);
/* c->coll_seq = v (under c->mu): a relaxed atomic store, a plain move on
 * x86, because the flight recorder's dump reads the count from any thread
 * without c->mu (flight.c, dump_pg_status: a data race that TSan found). */
static inline void tc__comm_set_coll_seq(tc_comm_t *c, uint64_t v) {
  __atomic_store_n(&c->coll_seq, v, __ATOMIC_RELAXED);
}
/* The same for an operation of `type` (peer: its root or peer) without a
 * work: coll_seq its collective number, or 0 and p2p_seq its p2p number. */
TC_INTERNAL void tc__board_issue_op(tc_comm_t *c, tc_op_type_t type, int peer, uint64_t coll_seq,
                                    uint64_t p2p_seq);
TC_INTERNAL void tc__board_done_op(tc_comm_t *c, tc_op_type_t type, uint64_t coll_seq,
                                   uint64_t p2p_seq, int rc);
TC_INTERNAL void tc__board_state(tc_comm_t *c, int state);
/* For a failed (timed out, peer lost) collective w: who is behind, in
 * words ("ranks 3 and 5 never entered it (...)"); "" when nothing useful is
 * known. Bounded: reads shared memory, then the store for ranks elsewhere
 * for at most TORCHCOMMS_HANG_REPORT_S. */
TC_INTERNAL void tc__hang_report(tc_comm_t *c, const tc_work_t *w, char *out, size_t len);

/* Backend loader (loader.c). */
TC_INTERNAL int tc__backend_find(const char *name, const tc_backend_ops_t **out);
/* The backend name to load for `name` on `device`: "cpu" for torch's c10d
 * names "gloo" (unless TORCHCOMMS_BACKEND_LIB_PATH_GLOO names a gloo plugin)
 * and "torchcomms" on device "cpu"; otherwise name itself. */
TC_INTERNAL const char *tc__backend_alias(const char *name, const char *device);

#endif

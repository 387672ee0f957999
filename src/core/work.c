/* work.c -- work objects: a pool (no allocation per operation once warm),
 * status transitions, deadlines, and the host services backends call. */
#include "core.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A work whose backend never reports is given up on this long after its own
 * deadline (the backend normally reports the timeout itself). */
#define TC_WORK_GRACE_S 5.0

/* The work table: works are pooled in its slots (no allocation per
 * operation once warm) and users hold handles, never pointers. */
static tc__htable_t work_table = TC__HTABLE_INIT(TC__HANDLE_WORK);


/* A new work's lock and condition (monotonic clock: deadlines are). */
static tc_work_t *work_new(void) {
  tc_work_t *w = calloc(1, sizeof *w);
  if (!w) return NULL;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&w->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&w->mu, NULL);
  return w;
}

static void work_init(tc_work_t *w, tc_comm_t *comm, const char *opname, double timeout_s,
                      int comm_ref) {
  w->magic = TC_WORK_MAGIC;
  atomic_store_explicit(&w->refs, 1, memory_order_relaxed);
  w->comm_ref = comm && comm_ref;
  if (w->comm_ref) tc__comm_ref(comm);
  w->comm = comm;
  w->opname = opname;
  atomic_store_explicit(&w->status, TC_WORK_NOT_STARTED, memory_order_relaxed);
  w->rc = TC_OK;
  w->issue_time = tc__now();
  w->start_time = 0;
  w->end_time = 0;
  w->fr_id = 0;
  w->coll_seq = w->p2p_seq = 0;
  w->timeout_s = timeout_s;
  w->drive = NULL;
  atomic_store_explicit(&w->posting, 0, memory_order_relaxed);
  atomic_store_explicit(&w->fr_start_due, 0, memory_order_relaxed);
  atomic_store_explicit(&w->finishing, 0, memory_order_relaxed);
  w->win_h = 0;
  w->msg[0] = 0;
}

tc_work_t *tc__work_alloc(tc_comm_t *comm, const char *opname,
                          double timeout_s) {
  uint32_t idx;
  void *obj;
  if (tc__htable_take(&work_table, &idx, &obj)) return NULL;
  tc_work_t *w = obj;
  if (!w) { /* a new slot: its work is kept for every later use */
    w = work_new();
    if (!w) {
      tc__htable_put(&work_table, idx);
      return NULL;
    }
    w->slot = idx;
    tc__htable_set(&work_table, idx, w);
  }
  work_init(w, comm, opname, timeout_s, 1);
  memset(&w->op, 0, sizeof w->op);
  w->handle = (tc_work_t *)tc__htable_open(&work_table, idx);
  return w;
}

tc_work_t *tc__work_alloc_sync(tc_comm_t *comm, const char *opname, double timeout_s) {
  /* comm->mu is held: no other taker; and no one gives the spare back
   * while it is there to take (there is one), so a load and a store do
   * what an exchange would */
  tc_work_t *w = atomic_load_explicit(&comm->spare_work, memory_order_acquire);
  if (w) atomic_store_explicit(&comm->spare_work, NULL, memory_order_relaxed);
  if (!w) {
    /* in use (another thread's operation, or the backend has not yet let
     * go of the previous one): the table's pool; the communicator struct
     * gets exactly one spare, made the first time */
    if (atomic_exchange(&comm->spare_made, 1)) return tc__work_alloc(comm, opname, timeout_s);
    w = work_new();
    if (!w) return tc__work_alloc(comm, opname, timeout_s);
    w->spare = 1;
  }
  /* no reference to comm yet: tc__op_issue holds comm->mu until the work
   * ended inline, or takes one (tc__work_hold_comm) when it did not */
  work_init(w, comm, opname, timeout_s, 0);
  w->handle = NULL; /* synchronous: never given out; tc__op_describe sets op */
  return w;
}

void *tc__work_arrays(tc_work_t *w, size_t bytes) {
  if (bytes > w->arrays_cap) {
    void *p = realloc(w->arrays, bytes);
    if (!p) return NULL;
    w->arrays = p;
    w->arrays_cap = bytes;
  }
  return w->arrays;
}

static void work_last_unref(tc_work_t *w);

/* The last reference: the handle goes stale (if tc_work_release did not
 * already end it), the communicator is let go, the slot is free again. */
void tc__work_unref(tc_work_t *w) {
  if (atomic_fetch_sub(&w->refs, 1) != 1) return;
  work_last_unref(w);
}

void tc__work_unref_inline(tc_work_t *w) {
  atomic_store_explicit(&w->refs, 0, memory_order_relaxed);
  work_last_unref(w);
}

static void work_last_unref(tc_work_t *w) {
  w->magic = TC_WORK_FREED;
  tc_comm_t *c = w->comm;
  w->comm = NULL;
  /* read before the work goes back: from then on its next user's
   * work_init may rewrite comm_ref (ThreadSanitizer, test_threads) */
  const int unref = c && w->comm_ref;
  if (w->spare) {
    /* back to its communicator (its only spare) for the next synchronous
     * operation */
    atomic_store_explicit(&c->spare_work, w, memory_order_release);
  } else {
    tc__htable_close_slot(&work_table, w->slot);
    tc__htable_put(&work_table, w->slot);
  }
  if (unref) tc__comm_unref(c);
}

void tc__work_hold_comm(tc_work_t *w) {
  if (w->comm && !w->comm_ref) {
    tc__comm_ref(w->comm);
    w->comm_ref = 1;
  }
}

tc_work_t *tc__work_handle(const tc_work_t *w) { return w->handle; }

int tc__work_enter(tc_work_t **w, const char *fn) {
  if (!*w)
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: %s: argument 'work' is NULL", fn);
  int stale;
  tc_work_t *p = tc__htable_get(&work_table, *w, &stale);
  if (!p && stale)
    return tc__set_error(TC_ERR_INVALID_USAGE,
                         "torchcomms: %s: the work handle was already released",
                         fn);
  if (!p)
    return tc__set_error(TC_ERR_INVALID_USAGE,
                         "torchcomms: %s: argument 'work' is not a work handle", fn);
  *w = p;
  return TC_OK;
}

static int status_terminal(int s) {
  return s == TC_WORK_COMPLETED || s == TC_WORK_TIMEDOUT || s == TC_WORK_ERROR;
}

/* 1 while w's backend reports to the thread that is posting it (an
 * operation run inline, on the caller's thread, inside tc__op_issue's post
 * call): no other thread has seen the work (its handle is not out; the
 * backend ran it here), so no other thread can finish it, wait on it or
 * drop a reference, and its status, finishing flag and references need no
 * locked instruction (five per operation: about a tenth of a small
 * operation's time, docs/benchmarks.md). A backend's own thread reporting
 * during the post reads `posting` possibly stale, but is never the
 * posting thread. */
static inline int work_inline(const tc_work_t *w) {
  return atomic_load_explicit(&w->posting, memory_order_relaxed) &&
         pthread_equal(w->post_thread, pthread_self());
}

/* 1 for the failures a hang report explains: a deadline, a lost peer. */
static int explainable(int rc) { return rc == TC_ERR_TIMEOUT || rc == TC_ERR_REMOTE; }

/* Moves w to a terminal state (first caller wins). Returns 1 if it did.
 * A timeout or a lost peer of a collective is explained first (who is
 * behind: hang.c), before any waiter can see the failure; then the flight
 * recorder is dumped (when a dump file is set) and the post hooks run. */
static int work_finish(tc_work_t *w, int rc, const char *msg) {
  tc_comm_t *c = w->comm;
  char report[1024];
  report[0] = 0; /* not zero-filled: this runs for every operation */
  /* a window operation (win_h set) is between two ranks and outside the
   * operation sequence: no report of who is behind */
  if (rc != TC_OK && c && explainable(rc) && !w->win_h &&
      !status_terminal(atomic_load(&w->status)))
    tc__hang_report(c, w, report, sizeof report);
  const int inl = work_inline(w);
  if (inl) { /* alone with it */
    if (atomic_load_explicit(&w->finishing, memory_order_relaxed)) return 0;
    atomic_store_explicit(&w->finishing, 1, memory_order_relaxed);
  } else if (atomic_exchange(&w->finishing, 1)) {
    return 0; /* another caller finishes it */
  }
  w->rc = rc;
  w->end_time = tc__now();
  if (rc == TC_OK)
    w->msg[0] = 0;
  else if (report[0])
    snprintf(w->msg, sizeof w->msg, "%.560s [hang report: %.440s]", msg ? msg : tc_strerror(rc),
             report);
  else
    snprintf(w->msg, sizeof w->msg, "%s", msg ? msg : tc_strerror(rc));
  if (rc == TC_OK && (!c || !atomic_load_explicit(&c->nhooks[TC_HOOK_POST],
                                                  memory_order_relaxed))) {
    /* the common case: nothing runs between the end and the waiters but
     * the recorder's and the board's few stores; the lock is taken only
     * when someone waits (work_wait_until counts itself in under it
     * before it looks at the status: either it sees the end or it is
     * counted here) */
    if (c) {
      atomic_store_explicit(&w->fr_start_due, 0, memory_order_relaxed);
      tc__fr_update(w, TC_FR_COMPLETED);
      tc__board_done(c, w, rc);
    }
    if (inl) { /* no waiter can exist: nobody else has the work */
      atomic_store_explicit(&w->status, TC_WORK_COMPLETED, memory_order_release);
    } else {
      atomic_store(&w->status, TC_WORK_COMPLETED);
      if (atomic_load(&w->waiters)) {
        pthread_mutex_lock(&w->mu);
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
      }
    }
    if (c) {
      if (tc__log_on(TC_LOG_TRACE, TC_LOG_COLL | TC_LOG_P2P)) {
        tc_op_info_t info;
        tc__op_info(w, &info);
        tc__log_op("done", &info);
      }
      atomic_store_explicit(&c->last_progress_ns, (int64_t)(w->end_time * 1e9), memory_order_relaxed);
    }
    return 1;
  }
  if (c) {
    if (rc != TC_OK) tc__comm_record_error(c, w->msg);
    atomic_store_explicit(&w->fr_start_due, 0, memory_order_relaxed);
    tc__fr_update(w, rc == TC_OK ? TC_FR_COMPLETED
                     : rc == TC_ERR_TIMEOUT ? TC_FR_TIMED_OUT : TC_FR_FAILED);
    tc__board_done(c, w, rc);
    if (rc != TC_OK && c->abort_process) {
      /* before anyone can see the failure and carry on */
      tc__fr_auto_dump(c, "the process aborts on this error");
      tc__hooks_abort(c);
      fprintf(stderr, "%s\ntorchcomms: aborting the process "
                      "(abort_process_on_timeout_or_error is set)\n", w->msg);
      fflush(stderr);
      const tc_backend_ops_t *ops = c->ops;
      if (ops && ops->size >= offsetof(tc_backend_ops_t, abort_process) +
                                 sizeof ops->abort_process &&
          ops->abort_process && c->bcomm)
        ops->abort_process(c->bcomm, rc, w->msg); /* MPI_Abort: the launcher ends the job */
      abort();
    }
    if (rc != TC_OK && explainable(rc))
      tc__fr_auto_dump(c, rc == TC_ERR_TIMEOUT ? "an operation timed out" : "a peer was lost");
    tc__hooks_post(c, w);
    if (tc__log_on(TC_LOG_TRACE, TC_LOG_COLL | TC_LOG_P2P)) {
      tc_op_info_t info;
      tc__op_info(w, &info);
      tc__log_op("done", &info);
    }
  }
  /* waiters see the end only now: the trace and the hooks' effects are
   * complete when they do */
  atomic_store(&w->status, rc == TC_OK            ? TC_WORK_COMPLETED
                           : rc == TC_ERR_TIMEOUT ? TC_WORK_TIMEDOUT
                                                  : TC_WORK_ERROR);
  pthread_mutex_lock(&w->mu);
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  if (c) atomic_store_explicit(&c->last_progress_ns, (int64_t)(w->end_time * 1e9), memory_order_relaxed);
  return 1;
}

void tc__work_fail_local(tc_work_t *w, int rc, const char *msg) {
  work_finish(w, rc, msg);
}

/* ---- host services given to backends ---- */

static void host_work_started(tc_work_t *w) {
  if (atomic_load_explicit(&w->posting, memory_order_relaxed)) {
    /* inside the post: no one can wait on the work yet (the handle is not
     * out), so no lock and no wake-up; the start is the issue time, and the
     * recorder learns of it after the post, or with the end when that is
     * sooner (an operation run inline: one recorder update, not two) */
    w->start_time = w->issue_time;
    int ns = TC_WORK_NOT_STARTED;
    if (work_inline(w)) { /* the only writer of the status (work_inline) */
      if (atomic_load_explicit(&w->status, memory_order_relaxed) == ns)
        atomic_store_explicit(&w->status, TC_WORK_INPROGRESS, memory_order_relaxed);
    } else {
      atomic_compare_exchange_strong(&w->status, &ns, TC_WORK_INPROGRESS);
    }
    atomic_store_explicit(&w->fr_start_due, 1, memory_order_release);
    if (w->comm)
      atomic_store_explicit(&w->comm->last_progress_ns, (int64_t)(w->start_time * 1e9),
                            memory_order_relaxed);
    return;
  }
  pthread_mutex_lock(&w->mu);
  w->start_time = tc__now();
  int ns = TC_WORK_NOT_STARTED;
  atomic_compare_exchange_strong(&w->status, &ns, TC_WORK_INPROGRESS);
  double t = w->start_time;
  if (atomic_load(&w->waiters)) pthread_cond_broadcast(&w->cv); /* a deadline to re-read */
  pthread_mutex_unlock(&w->mu);
  tc__fr_update(w, TC_FR_STARTED);
  if (w->comm)
    atomic_store_explicit(&w->comm->last_progress_ns, (int64_t)(t * 1e9), memory_order_relaxed);
}

/* After the post: a start reported inside it reaches the recorder now
 * (unless the end already did). */
void tc__work_posted(tc_work_t *w) {
  /* an operation that ended inside its post has cleared the flag: a load,
   * not a locked exchange, on that path */
  if (atomic_load_explicit(&w->fr_start_due, memory_order_acquire) &&
      atomic_exchange_explicit(&w->fr_start_due, 0, memory_order_acquire))
    tc__fr_update(w, TC_FR_STARTED);
}

/* The backend's reason becomes the library's one message format. */
static void host_work_complete(tc_work_t *w, int status, const char *reason) {
  char msg[1024];
  if (status != TC_OK)
    tc__comm_message(w->comm, w->opname, reason && reason[0] ? reason : tc_strerror(status),
                     msg, sizeof msg);
  work_finish(w, status, status != TC_OK ? msg : NULL);
  if (work_inline(w)) {
    w->inline_done = 1; /* the caller drops this reference with its own */
    return;
  }
  tc__work_unref(w); /* the backend's reference */
}

int tc__work_express_failed(tc_comm_t *c, const tc_backend_op_t *op, uint64_t coll_seq,
                            uint64_t p2p_seq, uint64_t fr_id, size_t fr_slot, int status,
                            const char *reason) {
  char msg[1024];
  const char *opname = tc__op_name(op->type);
  tc__comm_message(c, opname, reason && reason[0] ? reason : tc_strerror(status), msg,
                   sizeof msg);
  tc_work_t *w = tc__work_alloc_sync(c, opname, op->timeout_s);
  if (!w) { /* no memory for the work: the failure all the same */
    tc__fr_set(c, fr_id, fr_slot, TC_FR_FAILED, op->issue_time, op->issue_time, tc__now());
    tc__board_done_op(c, op->type, coll_seq, p2p_seq, status);
    tc__comm_record_error(c, msg);
    return tc__set_error(status, "%s", msg);
  }
  /* the work it would have had: issued and started at the issue, recorded,
   * on this thread alone (work_inline) */
  w->op = *op; /* its lists are the caller's, valid during this call */
  w->coll_seq = coll_seq;
  w->p2p_seq = p2p_seq;
  w->fr_id = fr_id;
  w->fr_slot = fr_slot;
  w->issue_time = w->start_time = op->issue_time;
  atomic_store_explicit(&w->status, TC_WORK_INPROGRESS, memory_order_relaxed);
  w->post_thread = pthread_self();
  atomic_store_explicit(&w->posting, 1, memory_order_relaxed);
  work_finish(w, status, msg);
  atomic_store_explicit(&w->posting, 0, memory_order_relaxed);
  const int rc = w->rc;
  tc__set_error_text(rc, w->msg);
  tc__work_unref_inline(w);
  return rc;
}

/* The backend is about to block the posting thread on w: the caller's
 * lock goes (once; taken back when tc__op_issue returns, with no lock of
 * ours held). From any other thread, or outside the post: nothing. */
static void host_work_blocking(tc_work_t *w) {
  if (w->waith && work_inline(w)) tc__waith_release(w->waith);
}

static void host_log(int level, const char *fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  tc__log(level, "%s", line);
}

static void host_free(void *p) { free(p); }

const tc_backend_host_t tc__host = {
    .size = sizeof(tc_backend_host_t),
    .work_started = host_work_started,
    .work_complete = host_work_complete,
    .store_set = tc__host_store_set,
    .store_get = tc_store_get,
    .store_add = tc__host_store_add,
    .free = host_free,
    .log = host_log,
    .logs = tc__logs,      /* log.c */
    .log_on = tc__log_check,
    .work_blocking = host_work_blocking,
};

/* ---- public work API ---- */

static void deadline_ts(double deadline, struct timespec *ts) {
  double d = deadline > 0 ? deadline : 0;
  ts->tv_sec = (time_t)d;
  ts->tv_nsec = (long)((d - (double)ts->tv_sec) * 1e9);
  if (ts->tv_nsec >= 1000000000L) { ts->tv_sec++; ts->tv_nsec -= 1000000000L; }
}

/* The moment past which waiting on w is given up: start + timeout once
 * started; before that, the comm must keep making progress. */
static double work_deadline(tc_work_t *w) {
  double base;
  if (w->start_time > 0) {
    base = w->start_time;
  } else {
    double last = w->comm ? (double)atomic_load(&w->comm->last_progress_ns) * 1e-9 : 0;
    base = last > w->issue_time ? last : w->issue_time;
  }
  return base + w->timeout_s + TC_WORK_GRACE_S;
}

/* Waits for w until `limit` (absolute, 0 = the work's own deadline). */
static int work_wait_until(tc_work_t *w, double limit, const char *fn) {
  if (w->drive && !status_terminal(atomic_load(&w->status))) w->drive(w, 1, limit);
  /* done well already (an operation run inside its post): no lock */
  if (status_terminal(atomic_load(&w->status)) && w->rc == TC_OK) return TC_OK;
  double gave_up = 0; /* > 0: when to stop waiting for another finisher's end */
  char timeout_msg[512] = "";
  pthread_mutex_lock(&w->mu);
  atomic_fetch_add(&w->waiters, 1);
  for (;;) {
    int st = atomic_load(&w->status);
    if (status_terminal(st)) break;
    double dl = work_deadline(w);
    double now = tc__now();
    if (limit > 0 && now >= limit) {
      atomic_fetch_sub(&w->waiters, 1);
      pthread_mutex_unlock(&w->mu);
      return tc__set_error(TC_ERR_TIMEOUT,
                           "torchcomms: %s: %s did not finish within the "
                           "given wait time (it is still %s)",
                           fn, w->opname, tc_work_status_name(st));
    }
    if (limit <= 0 && now >= dl && gave_up == 0) {
      /* The backend missed its own deadline: fail the work ourselves. */
      atomic_fetch_sub(&w->waiters, 1);
      pthread_mutex_unlock(&w->mu);
      char why[256], msg[512];
      snprintf(why, sizeof why, "timed out after %.1f s (%s); the communicator must be aborted",
               w->timeout_s,
               st == TC_WORK_NOT_STARTED ? "never started: an earlier operation is stuck"
                                         : "the backend did not report");
      tc__comm_message(w->comm, w->opname, why, msg, sizeof msg);
      if (!work_finish(w, TC_ERR_TIMEOUT, msg)) {
        /* the backend's report won meanwhile: wait (bounded) for its end to
         * be published; it may be running post hooks or a recorder dump */
        snprintf(timeout_msg, sizeof timeout_msg, "%s", msg);
        gave_up = now + TC_WORK_GRACE_S;
      }
      pthread_mutex_lock(&w->mu);
      atomic_fetch_add(&w->waiters, 1);
      continue;
    }
    if (gave_up > 0 && now >= gave_up) { /* that end never came */
      atomic_fetch_sub(&w->waiters, 1);
      pthread_mutex_unlock(&w->mu);
      return tc__set_error(TC_ERR_TIMEOUT, "%s", timeout_msg);
    }
    double until = limit > 0 && limit < dl ? limit : gave_up > 0 ? gave_up : dl;
    if (until > now + 0.25) until = now + 0.25; /* re-read the deadline */
    struct timespec ts;
    deadline_ts(until, &ts);
    pthread_cond_timedwait(&w->cv, &w->mu, &ts);
  }
  atomic_fetch_sub(&w->waiters, 1);
  int rc = w->rc;
  if (rc != TC_OK) tc__set_error_text(rc, w->msg);
  pthread_mutex_unlock(&w->mu);
  return rc;
}

int tc__work_wait(tc_work_t *w) { return work_wait_until(w, 0, "tc_work_wait"); }

int tc_work_wait(tc_work_t *w) {
  TC_CHECK(tc__work_enter(&w, "tc_work_wait"));
  return work_wait_until(w, 0, "tc_work_wait");
}

int tc_work_wait_for(tc_work_t *w, double timeout_s) {
  TC_CHECK(tc__work_enter(&w, "tc_work_wait_for"));
  if (!(timeout_s >= 0))
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: tc_work_wait_for: argument 'timeout_s' "
                         "must be >= 0");
  return work_wait_until(w, tc__now() + (timeout_s > 0 ? timeout_s : 1e-9),
                             "tc_work_wait_for");
}

int tc_work_test(tc_work_t *w, int *done) {
  TC_CHECK(tc__work_enter(&w, "tc_work_test"));
  if (!done)
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: tc_work_test: argument 'done' is NULL");
  if (w->drive && !status_terminal(atomic_load(&w->status))) w->drive(w, 0, 0);
  int st = atomic_load(&w->status);
  *done = status_terminal(st);
  if (!*done) return TC_OK;
  pthread_mutex_lock(&w->mu);
  int rc = w->rc;
  if (rc != TC_OK) tc__set_error_text(rc, w->msg);
  pthread_mutex_unlock(&w->mu);
  return rc;
}

int tc_work_status(const tc_work_t *h) {
  tc_work_t *w = (tc_work_t *)h;
  if (tc__work_enter(&w, "tc_work_status") != TC_OK) return -1;
  if (w->drive && !status_terminal(atomic_load(&w->status))) w->drive(w, 0, 0);
  return atomic_load(&w->status);
}

const char *tc_work_error(const tc_work_t *h) {
  tc_work_t *w = (tc_work_t *)h;
  if (tc__work_enter(&w, "tc_work_error") != TC_OK) return "";
  return w->msg;
}

int tc_work_release(tc_work_t *h) {
  tc_work_t *w = h;
  TC_CHECK(tc__work_enter(&w, "tc_work_release"));
  if (!tc__htable_close(&work_table, h)) /* another thread released it */
    return tc__set_error(TC_ERR_INVALID_USAGE,
                         "torchcomms: tc_work_release: the work handle was "
                         "already released");
  tc__work_unref(w);
  return TC_OK;
}

const char *tc_work_status_name(int s) {
  switch (s) {
  case TC_WORK_NOT_STARTED: return "not_started";
  case TC_WORK_INPROGRESS: return "inprogress";
  case TC_WORK_COMPLETED: return "completed";
  case TC_WORK_TIMEDOUT: return "timedout";
  case TC_WORK_ERROR: return "error";
  }
  return "invalid";
}

/* _comms_pybackend.c -- backends written in Python.
 *
 * torchcomms.register_backend(name, cls) registers, for a subclass of
 * TorchCommBackend (_backend_base.py), a backend table of the C core
 * (tc_backend_register) whose entries run the class's methods: a Python
 * backend goes through the real core -- validation, work objects,
 * deadlines, hooks, the flight recorder -- and its communicators are
 * ordinary TorchComm objects.
 *
 *  - new_comm creates the instance, calls init(device, name, options) and
 *    asks get_rank() / get_size() (the core's rank and size), then creates
 *    the communicator; the table's init, run by tc_comm_create on this same
 *    thread, takes the instance from a thread-local hand-off.
 *  - each operation of TorchComm hands the call's Python arguments to post
 *    through tc_op_options_t.backend_arg (a list [method, args, exception]);
 *    post queues it and returns; the communicator's own thread takes the
 *    GIL, calls the method, waits on the work object it may return, and
 *    completes the core's work. An exception fails the operation; a
 *    synchronous call re-raises it (the list's third slot).
 *  - split: the core agrees on the groups with an all_gather_single (no
 *    Python arguments: the buffers are wrapped as tensors), then the
 *    table's split calls the parent instance's split(ranks, name, options).
 *  - deadlines: a watchdog thread fails the running operation with
 *    TC_ERR_TIMEOUT once it passes start + timeout, as a backend must (the
 *    Python call cannot be interrupted: it goes on, and later operations
 *    wait behind it until the communicator is aborted).
 *  - abort fails every queued operation at once; finalize waits for the
 *    queue, then calls finalize(); destroy stops the threads (the worker is
 *    left to finish on its own when a Python call never returns).
 *
 * The thread never calls the core's host functions while it holds the
 * GIL, and post / abort never take it: the core calls them under its own
 * locks. */
#include "_comms.h"

#include "torchcomms_backend.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

PyObject *tcpy_TorchCommBackend, *tcpy_NativeBackend, *tcpy_BackendNotFound;

/* name -> class (register_backend); the first registration of a name
 * stays. */
static PyObject *tcpy_pyb_registry;

/* new_comm -> the table's init (same thread), and the table's split -> the
 * extension's split wrapper: a strong reference each. */
static __thread PyObject *tcpy_pyb_handoff;
static __thread PyObject *tcpy_pyb_made;

/* ---- the communicator's queue and thread ---- */

typedef struct pyb_item {
  struct pyb_item *next;
  const tc_backend_op_t *op;
  tc_work_t *work;
  int holding; /* the thread holds the call's arguments: abort may complete it */
  int done;    /* completed (work_complete called once, by whoever set this) */
  double deadline; /* CLOCK_MONOTONIC seconds, once started */
  double timeout_s;
} pyb_item_t;

typedef struct pyb_state {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* queue changed, or the thread went idle / exited */
  pyb_item_t *head, *tail, *running;
  int stop, aborted, orphan;
  pthread_t thread, watch;
  PyObject *obj; /* the instance (touched with the GIL only) */
  const tc_backend_host_t *host;
  char comm_name[128];
  double timeout_s;
} pyb_state_t;

static void pyb_deadline(struct timespec *ts, double secs) {
  clock_gettime(CLOCK_MONOTONIC, ts);
  double whole = (double)(long)secs;
  ts->tv_sec += (time_t)whole;
  ts->tv_nsec += (long)((secs - whole) * 1e9);
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

static double pyb_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void pyb_free(pyb_state_t *s) {
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s);
}

/* "<Type>: <message>" of the current exception into buf; the exception is
 * returned (new reference, normalised, with its traceback) and cleared. */
static PyObject *pyb_take_exception(char *buf, size_t len) {
  PyObject *t, *v, *tb;
  PyErr_Fetch(&t, &v, &tb);
  PyErr_NormalizeException(&t, &v, &tb);
  if (!v) {
    snprintf(buf, len, "unknown error");
    Py_XDECREF(t);
    Py_XDECREF(tb);
    return NULL;
  }
  if (tb) PyException_SetTraceback(v, tb);
  PyObject *s = PyObject_Str(v);
  const char *msg = s ? PyUnicode_AsUTF8(s) : NULL;
  if (!msg) PyErr_Clear();
  snprintf(buf, len, "%s: %s", Py_TYPE(v)->tp_name, msg ? msg : "?");
  Py_XDECREF(s);
  Py_XDECREF(t);
  Py_XDECREF(tb);
  return v;
}

/* A tensor over n elements of dtype at p (CPU memory of the core). */
static PyObject *pyb_wrap(PyObject *torch, PyObject *dtype, void *p, size_t n,
                          size_t es) {
  if (n == 0) return PyObject_CallMethod(torch, "empty", "(i)", 0);
  PyObject *mv = PyMemoryView_FromMemory(p, (Py_ssize_t)(n * es), PyBUF_WRITE);
  if (!mv) return NULL;
  PyObject *kw = Py_BuildValue("{sO}", "dtype", dtype), *r = NULL;
  PyObject *f = PyObject_GetAttrString(torch, "frombuffer");
  if (kw && f) {
    PyObject *args = PyTuple_Pack(1, mv);
    if (args) r = PyObject_Call(f, args, kw);
    Py_XDECREF(args);
  }
  Py_XDECREF(f);
  Py_XDECREF(kw);
  Py_DECREF(mv);
  return r;
}

/* An operation the core issued itself (no Python arguments): only split's
 * all_gather_single, whose buffers are wrapped as tensors. */
static PyObject *pyb_call_raw(pyb_state_t *s, PyObject *obj,
                              const tc_backend_op_t *op, int size, char *err,
                              size_t len) {
  if (op->type != TC_OP_ALL_GATHER_SINGLE) {
    snprintf(err, len, "%s reached the Python backend without its Python "
             "arguments (issued through the C API?): only TorchComm's methods "
             "can run operations on a backend written in Python",
             tc_op_name(op->type));
    return NULL;
  }
  PyObject *torch = PyImport_ImportModule("torch"), *dtype = NULL, *in = NULL,
           *out = NULL, *r = NULL;
  if (!torch) return NULL;
  size_t es = tc_dtype_size(op->dtype);
  if ((dtype = PyObject_GetAttrString(torch, tc_dtype_name(op->dtype))) &&
      (out = pyb_wrap(torch, dtype, op->recvbuf, op->count * (size_t)size, es)) &&
      (in = pyb_wrap(torch, dtype, (void *)op->sendbuf, op->count, es)))
    r = PyObject_CallMethod(obj, "all_gather_single", "(OOO)", out, in, Py_False);
  Py_XDECREF(in);
  Py_XDECREF(out);
  Py_XDECREF(dtype);
  Py_DECREF(torch);
  return r;
}

/* Runs one operation (GIL taken here); TC_OK or the status with reason. */
static int pyb_run(pyb_state_t *s, pyb_item_t *it, int size, char *reason,
                   size_t len) {
  const tc_backend_op_t *op = it->op;
  if (TCPY_FINALIZING()) {
    snprintf(reason, len, "the Python interpreter is shutting down");
    return TC_ERR_ABORTED;
  }
  PyGILState_STATE g = PyGILState_Ensure();
  PyObject *payload = op->size >= offsetof(tc_backend_op_t, backend_arg) + sizeof(void *)
                          ? (PyObject *)op->backend_arg : NULL;
  Py_XINCREF(payload);
  PyObject *obj = Py_XNewRef(s->obj);
  pthread_mutex_lock(&s->mu);
  it->holding = 1;
  it->timeout_s = op->timeout_s;
  it->deadline = pyb_now() + op->timeout_s;
  int aborted = s->aborted || !obj;
  pthread_cond_broadcast(&s->cv); /* the watchdog's new deadline */
  pthread_mutex_unlock(&s->mu);
  int rc = TC_OK;
  const char *name = tc_op_name(op->type);
  if (aborted) {
    snprintf(reason, len, "the communicator was aborted");
    rc = TC_ERR_ABORTED;
    goto out;
  }
  char err[512] = "";
  PyObject *res;
  if (payload) {
    PyObject *meth = PyObject_GetAttr(obj, PyList_GET_ITEM(payload, 0));
    res = meth ? PyObject_Call(meth, PyList_GET_ITEM(payload, 1), NULL) : NULL;
    Py_XDECREF(meth);
    name = PyUnicode_AsUTF8(PyList_GET_ITEM(payload, 0));
  } else {
    res = pyb_call_raw(s, obj, op, size, err, sizeof err);
    if (!res && err[0]) {
      snprintf(reason, len, "%s", err);
      rc = TC_ERR_NOT_SUPPORTED;
      goto out;
    }
  }
  if (res && res != Py_None) { /* a work object: complete it here */
    PyObject *w = PyObject_GetAttrString(res, "wait");
    if (!w) {
      PyErr_Clear();
      snprintf(reason, len, "the Python backend's %s returned %.100s, which is "
               "neither None nor a work object with a wait() method", name,
               Py_TYPE(res)->tp_name);
      rc = TC_ERR_BACKEND;
      Py_CLEAR(res);
      goto out;
    }
    PyObject *r2 = PyObject_CallNoArgs(w);
    Py_DECREF(w);
    Py_DECREF(res);
    res = r2;
  }
  if (!res) {
    char text[768];
    PyObject *exc = pyb_take_exception(text, sizeof text);
    snprintf(reason, len, "the Python backend's %s raised %s", name, text);
    if (payload && exc) PyList_SetItem(payload, 2, Py_NewRef(exc));
    Py_XDECREF(exc);
    rc = TC_ERR_BACKEND;
  }
  Py_XDECREF(res);
out:
  Py_XDECREF(obj);
  Py_XDECREF(payload);
  PyGILState_Release(g);
  return rc;
}

typedef struct pyb_start_args {
  pyb_state_t *s;
  int size;
} pyb_start_args_t;

static void *pyb_thread(void *arg) {
  pyb_start_args_t *a = arg;
  pyb_state_t *s = a->s;
  int size = a->size;
  free(a);
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->head && !s->stop) {
      struct timespec ts; /* idle: re-checked every second */
      pyb_deadline(&ts, 1.0);
      pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    if (!s->head) break; /* stopped */
    pyb_item_t *it = s->head;
    s->head = it->next;
    if (!s->head) s->tail = NULL;
    s->running = it;
    pthread_mutex_unlock(&s->mu);
    s->host->work_started(it->work);
    char reason[1024] = "";
    int rc = pyb_run(s, it, size, reason, sizeof reason);
    pthread_mutex_lock(&s->mu);
    s->running = NULL;
    int mine = !it->done;
    it->done = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (mine) s->host->work_complete(it->work, rc, rc == TC_OK ? NULL : reason);
    free(it);
    pthread_mutex_lock(&s->mu);
  }
  int orphan = s->orphan;
  pthread_mutex_unlock(&s->mu);
  if (orphan) pyb_free(s);
  return NULL;
}

/* The watchdog: fails the running operation at its deadline. */
static void *pyb_watch(void *arg) {
  pyb_state_t *s = arg;
  pthread_mutex_lock(&s->mu);
  while (!s->stop) {
    pyb_item_t *it = s->running;
    struct timespec ts;
    if (it && it->holding && !it->done) {
      double left = it->deadline - pyb_now();
      if (left <= 0) {
        it->done = 1;
        char why[256];
        snprintf(why, sizeof why, "the Python backend did not return within the "
                 "timeout of %.1f s (its call goes on; later operations wait "
                 "behind it: abort the communicator)", it->timeout_s);
        tc_work_t *work = it->work;
        pthread_mutex_unlock(&s->mu);
        s->host->work_complete(work, TC_ERR_TIMEOUT, why);
        pthread_mutex_lock(&s->mu);
        continue;
      }
      pyb_deadline(&ts, left < 1.0 ? left : 1.0);
    } else {
      pyb_deadline(&ts, 1.0);
    }
    pthread_cond_timedwait(&s->cv, &s->mu, &ts);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* A communicator's state around obj (a reference the state takes over,
 * GIL not held) and its thread. */
static int pyb_start(PyObject *obj, const tc_backend_init_args_t *a,
                     void **out, char *err, size_t len) {
  pyb_state_t *s = calloc(1, sizeof *s);
  pyb_start_args_t *sa = malloc(sizeof *sa);
  pthread_condattr_t ca;
  if (!s || !sa) goto nomem;
  pthread_mutex_init(&s->mu, NULL);
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s->cv, &ca);
  pthread_condattr_destroy(&ca);
  s->obj = obj;
  s->host = a->host;
  s->timeout_s = a->timeout_s;
  snprintf(s->comm_name, sizeof s->comm_name, "%s", a->comm_name);
  sa->s = s;
  sa->size = a->world_size;
  int rc = pthread_create(&s->watch, NULL, pyb_watch, s);
  if (rc == 0) {
    rc = pthread_create(&s->thread, NULL, pyb_thread, sa);
    if (rc != 0) {
      pthread_mutex_lock(&s->mu);
      s->stop = 1;
      pthread_cond_broadcast(&s->cv);
      pthread_mutex_unlock(&s->mu);
      pthread_join(s->watch, NULL);
    }
  }
  if (rc != 0) {
    snprintf(err, len, "cannot start the communicator's threads: %s", strerror(rc));
    s->obj = NULL;
    pyb_free(s);
    free(sa);
    goto drop;
  }
  *out = s;
  return TC_OK;
nomem:
  free(s);
  free(sa);
  snprintf(err, len, "out of memory");
drop:
  if (!TCPY_FINALIZING()) {
    PyGILState_STATE g = PyGILState_Ensure();
    Py_DECREF(obj);
    PyGILState_Release(g);
  }
  return TC_ERR_NOMEM;
}

/* ---- the table's entries ---- */

static int pyb_init(const tc_backend_init_args_t *a, void **out, char *err,
                    size_t len) {
  PyObject *obj = tcpy_pyb_handoff;
  tcpy_pyb_handoff = NULL;
  if (!obj) {
    snprintf(err, len, "the backend is written in Python: create its "
             "communicators with torchcomms.new_comm (the C API has no "
             "Python object to give it)");
    return TC_ERR_INVALID_USAGE;
  }
  return pyb_start(obj, a, out, err, len);
}

static int pyb_post(void *b, const tc_backend_op_t *op, tc_work_t *w, char *err,
                    size_t len) {
  pyb_state_t *s = b;
  pyb_item_t *it = calloc(1, sizeof *it);
  if (!it) {
    snprintf(err, len, "out of memory");
    return TC_ERR_NOMEM;
  }
  it->op = op;
  it->work = w;
  pthread_mutex_lock(&s->mu);
  if (s->aborted) {
    pthread_mutex_unlock(&s->mu);
    free(it);
    snprintf(err, len, "the communicator was aborted");
    return TC_ERR_ABORTED;
  }
  if (s->tail) s->tail->next = it;
  else s->head = it;
  s->tail = it;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return TC_OK;
}

static int pyb_abort(void *b) {
  pyb_state_t *s = b;
  pthread_mutex_lock(&s->mu);
  s->aborted = 1;
  pyb_item_t *queued = s->head, *run = NULL;
  s->head = s->tail = NULL;
  for (pyb_item_t *it = queued; it; it = it->next) it->done = 1;
  if (s->running && s->running->holding && !s->running->done) {
    run = s->running;
    run->done = 1; /* the thread frees it when its call returns */
  }
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  while (queued) {
    pyb_item_t *next = queued->next;
    s->host->work_complete(queued->work, TC_ERR_ABORTED, "the communicator was aborted");
    free(queued);
    queued = next;
  }
  if (run) s->host->work_complete(run->work, TC_ERR_ABORTED, "the communicator was aborted");
  return TC_OK;
}

static int pyb_finalize(void *b, char *err, size_t len) {
  pyb_state_t *s = b;
  double limit = s->timeout_s > 0 ? s->timeout_s : TC_DEFAULT_TIMEOUT_S;
  struct timespec ts;
  pyb_deadline(&ts, limit);
  pthread_mutex_lock(&s->mu);
  while ((s->head || s->running) &&
         pthread_cond_timedwait(&s->cv, &s->mu, &ts) != ETIMEDOUT) {
  }
  int busy = s->head || s->running;
  pthread_mutex_unlock(&s->mu);
  if (busy) {
    snprintf(err, len, "operations of the Python backend were still running "
             "after %.0f s; abort the communicator instead", limit);
    return TC_ERR_TIMEOUT;
  }
  if (TCPY_FINALIZING()) return TC_OK;
  PyGILState_STATE g = PyGILState_Ensure();
  int rc = TC_OK;
  PyObject *r = s->obj ? PyObject_CallMethod(s->obj, "finalize", NULL) : Py_NewRef(Py_None);
  if (!r) {
    char text[768];
    Py_XDECREF(pyb_take_exception(text, sizeof text));
    snprintf(err, len, "the Python backend's finalize raised %s", text);
    rc = TC_ERR_BACKEND;
  }
  Py_XDECREF(r);
  PyGILState_Release(g);
  return rc;
}

static void pyb_destroy(void *b) {
  pyb_state_t *s = b;
  /* the instance goes first: once the thread is detached it may free s */
  if (!TCPY_FINALIZING()) {
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *o = s->obj;
    s->obj = NULL;
    Py_XDECREF(o);
    PyGILState_Release(g);
  }
  pthread_mutex_lock(&s->mu);
  s->stop = 1;
  int busy = s->running != NULL || s->head != NULL;
  if (busy) s->orphan = 1; /* a call that has not returned: the thread frees s */
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->watch, NULL); /* it never waits long */
  if (busy) {
    pthread_detach(s->thread);
  } else {
    pthread_join(s->thread, NULL); /* idle: it exits at once */
    pyb_free(s);
  }
}

static int pyb_supports(void *b, tc_op_type_t type, tc_dtype_t dt, int redop) {
  return type != TC_OP_BATCH; /* torchcomms' Python backends have no batches */
}

/* Child options of a split: CommOptions(timeout=..., hints=...). */
static PyObject *pyb_child_options(const tc_backend_init_args_t *a) {
  PyObject *hints = PyDict_New(), *td = NULL, *r = NULL;
  if (!hints) return NULL;
  for (size_t i = 0; i < a->num_hints; i++) {
    PyObject *v = PyUnicode_FromString(a->hints[i].value);
    int bad = !v || PyDict_SetItemString(hints, a->hints[i].key, v) < 0;
    Py_XDECREF(v);
    if (bad) goto out;
  }
  if ((td = PyObject_CallFunction(tcpy_timedelta, "(id)", 0, a->timeout_s))) {
    PyObject *args = PyTuple_New(0);
    PyObject *kw = Py_BuildValue("{sOsO}", "timeout", td, "hints", hints);
    if (args && kw) r = PyObject_Call(tcpy_CommOptions, args, kw);
    Py_XDECREF(args);
    Py_XDECREF(kw);
  }
out:
  Py_XDECREF(td);
  Py_DECREF(hints);
  return r;
}

/* rank() / size() of a backend instance; -1 with reason on error. */
static int pyb_rank_size(PyObject *obj, int *rank, int *size, char *err,
                         size_t len) {
  const char *which[2] = {"get_rank", "get_size"};
  long v[2];
  for (int i = 0; i < 2; i++) {
    PyObject *r = PyObject_CallMethod(obj, which[i], NULL);
    v[i] = r && PyLong_Check(r) && !PyBool_Check(r) ? PyLong_AsLong(r) : -2;
    if (!r || PyErr_Occurred()) {
      char text[300];
      Py_XDECREF(pyb_take_exception(text, sizeof text));
      snprintf(err, len, "%s() raised %s", which[i], text);
      Py_XDECREF(r);
      return -1;
    }
    if (v[i] == -2) {
      snprintf(err, len, "%s() returned %.100s, not an int", which[i],
               Py_TYPE(r)->tp_name);
      Py_DECREF(r);
      return -1;
    }
    Py_DECREF(r);
  }
  if (v[1] < 1 || v[1] > 1 << 24 || v[0] < 0 || v[0] >= v[1]) {
    snprintf(err, len, "get_rank() / get_size() returned %ld / %ld (want 0 <= "
             "rank < size)", v[0], v[1]);
    return -1;
  }
  *rank = (int)v[0];
  *size = (int)v[1];
  return 0;
}

static int pyb_split(void *parent, const int *ranks, size_t nranks,
                     const tc_backend_init_args_t *a, void **child, char *err,
                     size_t len) {
  pyb_state_t *p = parent;
  *child = NULL;
  if (TCPY_FINALIZING()) {
    snprintf(err, len, "the Python interpreter is shutting down");
    return TC_ERR_ABORTED;
  }
  PyGILState_STATE g = PyGILState_Ensure();
  int rc = TC_ERR_BACKEND, r, n;
  PyObject *list = PyList_New((Py_ssize_t)nranks), *opts = NULL, *res = NULL;
  for (size_t i = 0; list && i < nranks; i++) {
    PyObject *v = PyLong_FromLong(ranks[i]);
    if (!v) Py_CLEAR(list);
    else PyList_SET_ITEM(list, (Py_ssize_t)i, v);
  }
  /* every rank of the parent calls it (a backend's split may be collective
   * over its own transport): ranks == [] for a rank in no group, which
   * gets no communicator whatever it returns */
  const char *cname = a ? a->comm_name : "";
  if (list && (opts = a ? pyb_child_options(a) : Py_NewRef(Py_None)) && p->obj)
    res = PyObject_CallMethod(p->obj, "split", "(OsO)", list, cname, opts);
  if (!res) {
    char text[768];
    Py_XDECREF(pyb_take_exception(text, sizeof text));
    snprintf(err, len, "the Python backend's split raised %s", text);
    goto out;
  }
  if (nranks == 0) {
    rc = TC_OK;
    Py_CLEAR(res);
    goto out;
  }
  int ok = PyObject_IsInstance(res, tcpy_TorchCommBackend);
  if (ok <= 0) {
    PyErr_Clear();
    snprintf(err, len, "the Python backend's split returned %.100s, not a "
             "TorchCommBackend", Py_TYPE(res)->tp_name);
    goto out;
  }
  char why[400];
  if (pyb_rank_size(res, &r, &n, why, sizeof why) < 0) {
    snprintf(err, len, "the new backend of split: %s", why);
    goto out;
  }
  if (r != a->rank || n != a->world_size) {
    snprintf(err, len, "the new backend of split says rank %d of %d but this "
             "rank is %d of %d in the group it asked for", r, n, a->rank,
             a->world_size);
    goto out;
  }
  Py_XSETREF(tcpy_pyb_made, Py_NewRef(res));
  rc = TC_OK;
out:
  Py_XDECREF(list);
  Py_XDECREF(opts);
  PyGILState_Release(g);
  if (rc != TC_OK || !res) {
    if (res) {
      g = PyGILState_Ensure();
      Py_DECREF(res);
      PyGILState_Release(g);
    }
    return rc;
  }
  return pyb_start(res, a, child, err, len);
}

/* The table of a registered name (kept for the life of the process). */
static tc_backend_ops_t *pyb_table(const char *name) {
  tc_backend_ops_t *t = calloc(1, sizeof *t);
  char *n = strdup(name);
  if (!t || !n) {
    free(t);
    free(n);
    return NULL;
  }
  *t = (tc_backend_ops_t){.abi_version = TC_BACKEND_ABI_VERSION,
                          .size = sizeof *t,
                          .name = n,
                          .version = "python",
                          .init = pyb_init,
                          .finalize = pyb_finalize,
                          .abort = pyb_abort,
                          .destroy = pyb_destroy,
                          .post = pyb_post,
                          .supports = pyb_supports,
                          .split = pyb_split};
  return t;
}

/* ---- module functions ---- */

PyObject *tcpy_register_backend(PyObject *m, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"name", "backend_class", NULL};
  PyObject *name, *cls;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:register_backend", kwlist,
                                   &name, &cls))
    return NULL;
  if (!PyUnicode_Check(name)) {
    PyErr_Format(PyExc_TypeError, "register_backend: argument 'name' must be a "
                 "str, not %.100s", Py_TYPE(name)->tp_name);
    return NULL;
  }
  int sub = PyType_Check(cls) ? PyObject_IsSubclass(cls, tcpy_TorchCommBackend) : 0;
  if (sub < 0) return NULL;
  if (!sub) {
    PyErr_Format(PyExc_TypeError, "register_backend: argument 'backend_class' "
                 "must be a subclass of torchcomms.TorchCommBackend (the class, "
                 "not an instance), not %R", cls);
    return NULL;
  }
  PyObject *old = PyDict_GetItemWithError(tcpy_pyb_registry, name);
  if (old) {
    if (old != cls &&
        PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "register_backend: backend "
                         "'%U' is already registered with %R; the first "
                         "registration stays (as in torchcomms) and %R is "
                         "ignored", name, old, cls) < 0)
      return NULL;
    Py_RETURN_NONE;
  }
  if (PyErr_Occurred()) return NULL;
  const char *cname = PyUnicode_AsUTF8(name);
  if (!cname) return NULL;
  tc_backend_ops_t *t = pyb_table(cname);
  if (!t) return PyErr_NoMemory();
  int rc = tc_backend_register(t);
  if (rc != TC_OK) {
    char text[1024];
    snprintf(text, sizeof text, "%s", tc_last_error());
    free((void *)t->name);
    free(t);
    return tcpy_raise(rc, text);
  }
  if (PyDict_SetItem(tcpy_pyb_registry, name, cls) < 0) return NULL;
  Py_RETURN_NONE;
}

PyObject *tcpy_is_backend_registered(PyObject *m, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"name", NULL};
  PyObject *name;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O:_is_backend_registered", kwlist,
                                   &name))
    return NULL;
  int has = PyDict_Contains(tcpy_pyb_registry, name);
  if (has < 0) return NULL;
  return PyBool_FromLong(has);
}

PyObject *tcpy_registered_backend(PyObject *m, PyObject *name) {
  PyObject *cls = PyDict_GetItemWithError(tcpy_pyb_registry, name);
  if (!cls && PyErr_Occurred()) return NULL;
  return Py_NewRef(cls ? cls : Py_None);
}

int tcpy_pyb_init(PyObject *module) {
  if (!(tcpy_pyb_registry = PyDict_New())) return -1;
  tcpy_TorchCommBackend = PyObject_GetAttrString(module, "TorchCommBackend");
  tcpy_NativeBackend = PyObject_GetAttrString(module, "_NativeBackend");
  tcpy_BackendNotFound = PyObject_GetAttrString(module, "_BackendNotFoundError");
  return tcpy_TorchCommBackend && tcpy_NativeBackend && tcpy_BackendNotFound ? 0 : -1;
}

/* ---- new_comm, split, the issue path ---- */

int tcpy_pyb_lookup(PyObject *backend, PyObject **cls) {
  *cls = PyDict_GetItemWithError(tcpy_pyb_registry, backend);
  if (*cls) {
    Py_INCREF(*cls);
    return 0;
  }
  if (PyErr_Occurred()) return -1;
  PyObject *mod = PyImport_ImportModule("torchcomms._backends");
  if (!mod) return -1;
  PyObject *r = PyObject_CallMethod(mod, "_resolve", "(O)", backend);
  Py_DECREF(mod);
  if (!r) return -1;
  if (r == Py_None) Py_DECREF(r);
  else *cls = r;
  return 0;
}

PyObject *tcpy_pyb_prepare(PyObject *cls, PyObject *device, const char *name,
                           PyObject *options, tc_comm_options_t *o) {
  PyObject *obj = PyObject_CallNoArgs(cls);
  if (!obj) return NULL;
  PyObject *r = PyObject_CallMethod(obj, "init", "(OsO)", device, name, options);
  if (!r) {
    Py_DECREF(obj);
    return NULL;
  }
  Py_DECREF(r);
  char why[512];
  int rank, size;
  if (pyb_rank_size(obj, &rank, &size, why, sizeof why) < 0) {
    PyErr_Format(PyExc_RuntimeError, "new_comm: the Python backend %R: %s", cls, why);
    Py_DECREF(obj);
    return NULL;
  }
  o->rank = rank;
  o->world_size = size;
  return obj;
}

void tcpy_pyb_handoff_set(PyObject *obj) { Py_XSETREF(tcpy_pyb_handoff, Py_XNewRef(obj)); }

void tcpy_pyb_handoff_clear(void) { Py_CLEAR(tcpy_pyb_handoff); }

PyObject *tcpy_pyb_take_made(void) {
  PyObject *r = tcpy_pyb_made;
  tcpy_pyb_made = NULL;
  return r;
}

PyObject *tcpy_pyb_payload(const char *method, PyObject *args, int async_op) {
  Py_ssize_t n = PyTuple_GET_SIZE(args);
  PyObject *full = PyTuple_New(n + 1), *l = NULL;
  if (!full) return NULL;
  for (Py_ssize_t i = 0; i < n; i++)
    PyTuple_SET_ITEM(full, i, Py_NewRef(PyTuple_GET_ITEM(args, i)));
  PyTuple_SET_ITEM(full, n, PyBool_FromLong(async_op));
  l = Py_BuildValue("[sOO]", method, full, Py_None);
  Py_DECREF(full);
  return l;
}

/* ---- TorchComm.get_backend_impl / unsafe_get_backend ---- */

static PyObject *tcpy_comm_get_backend_impl(TorchCommObject *self, PyObject *u) {
  if (self->backend_impl) return Py_NewRef(self->backend_impl);
  if (tcpy_comm_live(self, "get_backend_impl") < 0) return NULL;
  tc_comm_t *c = self->comm;
  self->backend_impl = PyObject_CallFunction(
      tcpy_NativeBackend, "(sssii)", tc_comm_backend(c), tc_comm_backend_version(c),
      tc_comm_name(c), tc_comm_rank(c), tc_comm_size(c));
  return Py_XNewRef(self->backend_impl);
}

static PyObject *tcpy_comm_unsafe_get_backend(TorchCommObject *self, PyObject *u) {
  if (PyErr_WarnEx(PyExc_DeprecationWarning, "unsafe_get_backend() is deprecated, "
                   "use get_backend_impl() instead.", 1) < 0)
    return NULL;
  return tcpy_comm_get_backend_impl(self, NULL);
}

PyMethodDef tcpy_comm_backend_methods[] = {
    {"get_backend_impl", (PyCFunction)tcpy_comm_get_backend_impl, METH_NOARGS,
     "The backend object: the TorchCommBackend instance of a backend written "
     "in Python (the one new_comm created), or a description of a C backend "
     "(name, version, rank, size). The same object on every call."},
    {"unsafe_get_backend", (PyCFunction)tcpy_comm_unsafe_get_backend,
     METH_NOARGS, "Deprecated: get_backend_impl() (warns DeprecationWarning)."},
    {NULL, NULL, 0, NULL},
};

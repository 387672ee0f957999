/* _comms_comm.c -- TorchComm: new_comm, lifecycle (finalize, abort,
 * destroy), getters, split, and the issue path every operation shares.
 *
 * Lifetimes: an asynchronous operation's TorchWork holds references to every
 * tensor involved until the operation finishes, and the communicator keeps
 * every in-flight TorchWork in its `pending` list (reaped on each issue, on
 * finalize and abort), so dropping the TorchWork right after issuing is
 * safe. Deallocating a communicator that was not finalized aborts it first
 * (tc_comm_destroy), which finishes every pending operation before their
 * buffers are released. */
#include "_comms.h"

#include "private_api.h" /* tc__fr_stacks_wanted, tc__fr_set_caller_frames */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TCPY_ERRBUF 1024

/* Copies the thread's last error (call right after the failing C call,
 * before the GIL is taken back). */
#define TCPY_SAVE_ERROR(buf, rc)                                               \
  do {                                                                         \
    if ((rc) != TC_OK) snprintf((buf), TCPY_ERRBUF, "%s", tc_last_error());   \
  } while (0)

int tcpy_comm_live(TorchCommObject *self, const char *op) {
  if (self->comm) return 0;
  PyErr_Format(PyExc_RuntimeError, "%s: the communicator was destroyed", op);
  return -1;
}

void tcpy_comm_reap(TorchCommObject *self) {
  PyObject *l = self->pending;
  Py_ssize_t n = PyList_GET_SIZE(l), k = 0;
  while (k < n && tcpy_work_done((TorchWorkObject *)PyList_GET_ITEM(l, k))) k++;
  if (k > 0 && PyList_SetSlice(l, 0, k, NULL) < 0) PyErr_Clear();
  /* Operations finish in issue order, except batches: an occasional full
   * pass keeps a long list from growing without bound. */
  n = PyList_GET_SIZE(l);
  if (n < 64) return;
  PyObject *keep = PyList_New(0);
  if (!keep) {
    PyErr_Clear();
    return;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *w = PyList_GET_ITEM(l, i);
    if (!tcpy_work_done((TorchWorkObject *)w) && PyList_Append(keep, w) < 0) {
      PyErr_Clear();
      Py_DECREF(keep);
      return;
    }
  }
  Py_SETREF(self->pending, keep);
}

/* Appends s as a JSON string to buf (len bytes, at *n). */
static void json_str(char *buf, size_t len, size_t *n, const char *s) {
  if (*n < len) buf[(*n)++] = '"';
  for (; *s && *n + 8 < len; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') {
      buf[(*n)++] = '\\';
      buf[(*n)++] = (char)ch;
    } else if (ch < 0x20) {
      *n += (size_t)snprintf(buf + *n, len - *n, "\\u%04x", ch);
    } else {
      buf[(*n)++] = (char)ch;
    }
  }
  if (*n < len) buf[(*n)++] = '"';
}

/* The caller's Python frames, innermost first (at most 32), as the items
 * of a JSON list, for the flight recorder (TORCHCOMMS_FR_STACK). */
static void python_frames(char *buf, size_t len) {
  size_t n = 0;
  buf[0] = 0;
  PyFrameObject *f = PyEval_GetFrame(); /* borrowed */
  Py_XINCREF(f);
  for (int depth = 0; f && depth < 32 && n + 256 < len; depth++) {
    PyCodeObject *code = PyFrame_GetCode(f);
    const char *name = PyUnicode_AsUTF8(code->co_name);
    const char *file = PyUnicode_AsUTF8(code->co_filename);
    if (!name || !file) PyErr_Clear();
    n += (size_t)snprintf(buf + n, len - n, "%s{\"name\": ", depth ? ", " : "");
    json_str(buf, len, &n, name ? name : "?");
    if (n < len) n += (size_t)snprintf(buf + n, len - n, ", \"filename\": ");
    json_str(buf, len, &n, file ? file : "?");
    if (n < len) n += (size_t)snprintf(buf + n, len - n, ", \"line\": %d}", PyFrame_GetLineNumber(f));
    Py_DECREF(code);
    PyFrameObject *back = PyFrame_GetBack(f);
    Py_DECREF(f);
    f = back;
  }
  Py_XDECREF(f);
  if (n >= len) n = len - 1;
  buf[n] = 0;
}

/* The operation's wait hooks (tc_op_options_t.wait_release): the GIL is
 * kept over a call that does not block (an operation the cpu backend runs
 * on this thread within its spin) and let go before anything could block
 * (the library calls the release first); taken back once, as the call
 * returns. Taking and giving back the GIL cost 0.2-0.25 us of a 0.9 us
 * 8-byte all_reduce from Python (docs/benchmarks.md). */
static void tcpy_wait_release(void *arg) { *(PyThreadState **)arg = PyEval_SaveThread(); }
static void tcpy_wait_reacquire(void *arg) { PyEval_RestoreThread(*(PyThreadState **)arg); }

/* 1 when this is the interpreter's only Python thread: nobody else can be
 * waiting for the GIL, so keeping it over a call costs nobody anything.
 * With other Python threads (ranks as threads of one process, a helper
 * thread, an autograd thread running a hook) the GIL is let go before the
 * call, as it always was: a peer rank in another thread could otherwise not
 * enter its side of the operation until our spin gave up (2 ranks as
 * threads, 8-byte all_reduce: 10 us an operation, 640 us with the GIL kept
 * over the spin). The list is read without its lock: a thread state
 * appearing meanwhile waits at most the backend's spin. */
static int tcpy_only_thread(void) {
  PyThreadState *ts = PyThreadState_Get();
  PyThreadState *head = PyInterpreterState_ThreadHead(PyThreadState_GetInterpreter(ts));
  return head == ts && PyThreadState_Next(head) == NULL;
}

PyObject *tcpy_issue_opts(TorchCommObject *self, const char *op,
                          tcpy_call_t *call, int async_op, tcpy_opts_t *opts,
                          PyObject *refs, PyObject *pre) {
  if (tcpy_comm_live(self, op) < 0) return NULL;
  /* CUDA tensors: the operation is ordered after torch's current stream */
  if (!opts->o.stream && self->dev.is_cuda &&
      tcpy_cuda_stream(self->dev.index, &opts->o.stream) < 0)
    return NULL;
  tcpy_comm_reap(self);
  tc_comm_t *c = self->comm;
  /* hooks (_comms_hooks.c): the op_id is the number the C core gives this
   * operation; a pre hook's exception stops it here */
  uint64_t op_id = 0;
  int hooked = self->hooked;
  if (hooked) {
    op_id = tc_comm_next_op_id(c);
    if (pre && tcpy_hooks_run_pre(self, (int)call->type, op_id, pre) < 0)
      return NULL;
  }
  /* a Python backend gets the call's Python arguments (_comms_pybackend.c);
   * an async operation's TorchWork keeps them alive with the tensors */
  PyObject *payload = NULL, *keep = NULL;
  if (call->pyargs) {
    if (!(payload = tcpy_pyb_payload(op, call->pyargs, async_op))) return NULL;
    opts->o.backend_arg = payload;
    if (async_op && !(keep = PyTuple_Pack(2, refs ? refs : Py_None, payload))) {
      Py_DECREF(payload);
      return NULL;
    }
    if (keep) refs = keep;
  }
  tc_work_t *work = NULL;
  char text[TCPY_ERRBUF];
  char frames[8192];
  int rc;
  if (self->fr_stack) {
    python_frames(frames, sizeof frames);
    tc__fr_set_caller_frames(frames);
  }
  /* alone: the library lets the GIL go only if it must wait (the hooks);
   * with other Python threads: before the call, as always */
  const int keep_gil = tcpy_only_thread();
  PyThreadState *saved = NULL;
  if (keep_gil) {
    opts->o.wait_release = tcpy_wait_release;
    opts->o.wait_reacquire = tcpy_wait_reacquire;
    opts->o.wait_arg = &saved;
  } else {
    saved = PyEval_SaveThread();
  }
  rc = tcpy_call_run(c, call, &opts->o, async_op ? &work : NULL);
  TCPY_SAVE_ERROR(text, rc);
  if (!keep_gil) PyEval_RestoreThread(saved);
  if (self->fr_stack) tc__fr_set_caller_frames(NULL);
  if (rc != TC_OK) {
    /* a synchronous call re-raises what the Python backend raised */
    PyObject *exc = payload ? PyList_GET_ITEM(payload, 2) : NULL;
    if (exc && exc != Py_None) PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    else tcpy_raise(rc, text);
    Py_XDECREF(payload);
    Py_XDECREF(keep);
    return NULL;
  }
  PyObject *w = tcpy_work_new(work, refs);
  Py_XDECREF(payload);
  Py_XDECREF(keep);
  if (!w) return NULL;
  if (work && !tcpy_work_done((TorchWorkObject *)w) &&
      PyList_Append(self->pending, w) < 0) {
    Py_DECREF(w); /* dealloc waits for the operation */
    return NULL;
  }
  if (hooked) tcpy_hooks_run_post(self, (int)call->type, op_id);
  return w;
}

PyObject *tcpy_issue(TorchCommObject *self, const char *op, tcpy_call_t *call,
                     int async_op, PyObject *hints, PyObject *timeout,
                     PyObject *refs, PyObject *pre) {
  tcpy_opts_t opts;
  if (tcpy_opts_init(&opts, op, hints, timeout) < 0) return NULL;
  PyObject *r = tcpy_issue_opts(self, op, call, async_op, &opts, refs, pre);
  tcpy_opts_free(&opts);
  return r;
}

/* ---- creation ---- */

static PyObject *tcpy_comm_wrap(tc_comm_t *comm, const tcpy_device_t *dev,
                                PyObject *store, PyObject *device_obj,
                                int high_priority_stream,
                                int enable_reconfigure) {
  TorchCommObject *self = PyObject_GC_New(TorchCommObject, &TcPy_TorchComm_Type);
  if (!self) {
    Py_BEGIN_ALLOW_THREADS
    tc_comm_destroy(comm);
    Py_END_ALLOW_THREADS
    return NULL;
  }
  self->comm = comm;
  self->dev = *dev;
  self->store = Py_NewRef(store ? store : Py_None);
  self->device_obj = Py_XNewRef(device_obj);
  self->high_priority_stream = high_priority_stream;
  self->enable_reconfigure = enable_reconfigure;
  self->registered = NULL;
  self->backend_impl = NULL;
  self->pyb = 0;
  self->weakreflist = NULL;
  self->hooked = 0;
  self->fr_stack = tc__fr_stacks_wanted(comm);
  for (int k = 0; k < TCPY_HOOK_KINDS; k++) self->hooks[k] = NULL;
  self->next_hook_id = 0;
  self->c_abort_hook = 0;
  self->pending = PyList_New(0);
  if (!self->pending) {
    Py_DECREF(self);
    return NULL;
  }
  PyObject_GC_Track(self);
  return (PyObject *)self;
}

/* Sets dev's is_cpu / is_cuda from its type. */
static void tcpy_device_kind(tcpy_device_t *dev) {
  dev->is_cpu = !strcmp(dev->type, "cpu");
  dev->is_cuda = !strcmp(dev->type, "cuda");
}

/* device: torch.device, "cpu", "cuda:1", ... */
static int tcpy_parse_device(PyObject *device, tcpy_device_t *dev,
                             PyObject **device_obj) {
  *device_obj = NULL;
  dev->index = -1;
  if (PyUnicode_Check(device)) {
    const char *s = PyUnicode_AsUTF8(device);
    if (!s) return -1;
    const char *colon = strchr(s, ':');
    size_t n = colon ? (size_t)(colon - s) : strlen(s);
    if (n == 0 || n >= sizeof dev->type) goto bad;
    memcpy(dev->type, s, n);
    dev->type[n] = 0;
    if (colon) {
      char *end;
      long i = strtol(colon + 1, &end, 10);
      if (*end || end == colon + 1 || i < 0 || i > 1 << 20) goto bad;
      dev->index = (int)i;
    }
    tcpy_device_kind(dev);
    return 0;
  bad:
    PyErr_Format(PyExc_ValueError, "new_comm: argument 'device' = '%s' is not "
                 "a device ('cpu', 'cuda:0', ...)", s);
    return -1;
  }
  PyObject *type = PyObject_GetAttr(device, tcpy_str.type);
  if (!type) {
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "new_comm: argument 'device' must be a "
                 "torch.device or a str, not %.100s", Py_TYPE(device)->tp_name);
    return -1;
  }
  const char *t = PyUnicode_Check(type) ? PyUnicode_AsUTF8(type) : NULL;
  if (!t || !*t || strlen(t) >= sizeof dev->type) {
    Py_DECREF(type);
    PyErr_Clear();
    PyErr_SetString(PyExc_ValueError, "new_comm: argument 'device' has an "
                    "invalid type");
    return -1;
  }
  snprintf(dev->type, sizeof dev->type, "%s", t);
  Py_DECREF(type);
  PyObject *index = PyObject_GetAttr(device, tcpy_str.index);
  if (!index) return -1;
  if (index != Py_None) {
    long i = PyLong_AsLong(index);
    if (i == -1 && PyErr_Occurred()) {
      Py_DECREF(index);
      return -1;
    }
    dev->index = (int)i;
  }
  Py_DECREF(index);
  tcpy_device_kind(dev);
  *device_obj = Py_NewRef(device);
  return 0;
}

PyObject *tcpy_new_comm(PyObject *module, PyObject *args, PyObject *kw) {
  static const char *fn = "new_comm";
  /* torchcomms' signature: new_comm(backend, device, name, ...) */
  static char *kwlist[] = {"backend", "device", "name",
                           "abort_process_on_timeout_or_error", "timeout",
                           "high_priority_stream", "store",
                           "enable_reconfigure", "hints", "rank", "size",
                           NULL};
  /* its earlier one, name after store: taken when the third positional
   * argument is not a str */
  static char *kwlist_old[] = {"backend", "device",
                               "abort_process_on_timeout_or_error", "timeout",
                               "store", "name", "enable_reconfigure", "hints",
                               "high_priority_stream", "rank", "size", NULL};
  PyObject *backend, *device, *abort_obj = Py_None, *timeout = Py_None,
                              *store = Py_None, *name = Py_None,
                              *reconf = Py_False, *hints = Py_None,
                              *hps = Py_None, *rank_obj = Py_None,
                              *size_obj = Py_None;
  /* rank / size (keyword-only, ours): explicit rank and world size instead of
   * the environment's, for communicators over a subset of the job's
   * processes (torch.distributed.new_group over our c10d backend). */
  int positional_name = PyTuple_GET_SIZE(args) >= 3 &&
                        (PyUnicode_Check(PyTuple_GET_ITEM(args, 2)) ||
                         PyTuple_GET_ITEM(args, 2) == Py_None);
  if (positional_name || PyTuple_GET_SIZE(args) < 3) {
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|OOOOOOO$OO:new_comm", kwlist,
                                     &backend, &device, &name, &abort_obj,
                                     &timeout, &hps, &store, &reconf, &hints,
                                     &rank_obj, &size_obj))
      return NULL;
  } else if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|OOOOOOO$OO:new_comm",
                                          kwlist_old, &backend, &device,
                                          &abort_obj, &timeout, &store, &name,
                                          &reconf, &hints, &hps, &rank_obj,
                                          &size_obj)) {
    return NULL;
  }
  if (!PyUnicode_Check(backend)) {
    PyErr_Format(PyExc_TypeError, "new_comm: argument 'backend' must be a "
                 "str, not %.100s", Py_TYPE(backend)->tp_name);
    return NULL;
  }
  if (name != Py_None && !PyUnicode_Check(name)) {
    PyErr_Format(PyExc_TypeError, "new_comm: argument 'name' must be a str, "
                 "not %.100s", Py_TYPE(name)->tp_name);
    return NULL;
  }
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  if ((rank_obj == Py_None) != (size_obj == Py_None)) {
    PyErr_SetString(PyExc_ValueError, "new_comm: 'rank' and 'size' must be "
                    "given together");
    return NULL;
  }
  if (rank_obj != Py_None) {
    if (!PyLong_Check(rank_obj) || !PyLong_Check(size_obj) ||
        PyBool_Check(rank_obj) || PyBool_Check(size_obj)) {
      PyErr_SetString(PyExc_TypeError, "new_comm: 'rank' and 'size' must be "
                      "ints");
      return NULL;
    }
    long r = PyLong_AsLong(rank_obj), n = PyLong_AsLong(size_obj);
    if ((r == -1 || n == -1) && PyErr_Occurred()) return NULL;
    if (n < 1 || n > INT_MAX || r < 0 || r >= n) {
      PyErr_Format(PyExc_ValueError, "new_comm: rank %ld out of range for "
                   "size %ld", r, n);
      return NULL;
    }
    o.rank = (int)r;
    o.world_size = (int)n;
  }
  if (abort_obj != Py_None) {
    if (!PyBool_Check(abort_obj) && !PyLong_Check(abort_obj)) {
      PyErr_Format(PyExc_TypeError, "new_comm: argument "
                   "'abort_process_on_timeout_or_error' must be a bool or "
                   "None, not %.100s", Py_TYPE(abort_obj)->tp_name);
      return NULL;
    }
    o.abort_process_on_timeout_or_error = PyObject_IsTrue(abort_obj);
  }
  int enable_reconfigure = PyObject_IsTrue(reconf);
  int high_priority = hps == Py_None ? 0 : PyObject_IsTrue(hps);
  if (enable_reconfigure < 0 || high_priority < 0) return NULL;
  o.enable_reconfigure = enable_reconfigure;
  if (tcpy_seconds(timeout, fn, "timeout", 0.0, &o.timeout_s) < 0) return NULL;
  const char *cbackend = PyUnicode_AsUTF8(backend);
  if (!cbackend) return NULL;
  if (name != Py_None && !(o.name = PyUnicode_AsUTF8(name))) return NULL;
  tcpy_device_t dev;
  PyObject *device_obj = NULL, *hint_keep = NULL, *result = NULL, *cls = NULL,
           *pyobj = NULL;
  tc_hint_t small[8], *h = NULL;
  size_t nh = 0;
  tc_store_t *cstore = NULL;
  if (tcpy_parse_device(device, &dev, &device_obj) < 0) return NULL;
  o.device_index = dev.index;
  /* torch's c10d names ("gloo", "torchcomms") are mapped to "cpu" on CPU by
   * the library's loader (tc__backend_alias, src/core/loader.c). */
  if (tcpy_hints(hints, fn, small, 8, &h, &nh, &hint_keep) < 0) goto out;
  o.hints = h;
  o.num_hints = nh;
  if (store != Py_None) {
    if (tcpy_store_wrap(store, &cstore) < 0) goto out;
    o.store = cstore;
  }
  /* a backend written in Python (registered, or from an entry point):
   * its instance is made and initialised here (_comms_pybackend.c) */
  if (tcpy_pyb_lookup(backend, &cls) < 0) goto out;
  if (cls) {
    if (!device_obj && !(device_obj = tcpy_torch_device(dev.type, dev.index)))
      goto out;
    PyObject *ckw = Py_BuildValue(
        "{sOsOsOsOsOsO}", "abort_process_on_timeout_or_error",
        o.abort_process_on_timeout_or_error > 0 ? Py_True : Py_False, "timeout",
        timeout, "high_priority_stream", high_priority ? Py_True : Py_False,
        "store", store, "enable_reconfigure",
        enable_reconfigure ? Py_True : Py_False, "hints",
        hints == Py_None ? Py_None : hints);
    PyObject *cargs = PyTuple_New(0), *copts = NULL;
    if (ckw && cargs) copts = PyObject_Call(tcpy_CommOptions, cargs, ckw);
    Py_XDECREF(ckw);
    Py_XDECREF(cargs);
    if (!copts) goto out;
    pyobj = tcpy_pyb_prepare(cls, device_obj, o.name ? o.name : "main", copts, &o);
    Py_DECREF(copts);
    if (!pyobj) goto out;
    /* the core's own bookkeeping needs a store; the backend does its own
     * rendezvous, so without one an in-process store serves, marked as
     * reaching this rank only (the core then waits for nothing a peer
     * would publish in a shared store: the hang board) */
    if (!cstore) {
      int src = tc__store_memory_private(&cstore);
      if (src != TC_OK) {
        tcpy_raise(src, tc_last_error());
        goto out;
      }
      o.store = cstore;
    }
    tcpy_pyb_handoff_set(pyobj);
  }
  tc_comm_t *comm = NULL;
  char text[TCPY_ERRBUF];
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = tc_comm_create(cbackend, dev.type, &o, &comm);
  TCPY_SAVE_ERROR(text, rc);
  Py_END_ALLOW_THREADS
  tcpy_pyb_handoff_clear();
  if (rc == TC_ERR_BACKEND_NOT_FOUND && !cls) {
    /* torchcomms raises ModuleNotFoundError; ours is also a RuntimeError */
    PyErr_Format(tcpy_BackendNotFound,
                 "%s; or install a package declaring it in the "
                 "'torchcomms.backends' entry points, or register a "
                 "TorchCommBackend subclass with torchcomms.register_backend "
                 "(failed to find backend %s, is it registered via "
                 "entry_points.txt?)", text, cbackend);
    goto out;
  }
  if (rc != TC_OK) {
    tcpy_raise(rc, text);
    goto out;
  }
  result = tcpy_comm_wrap(comm, &dev, store, device_obj, high_priority,
                          enable_reconfigure);
  if (result && pyobj) {
    ((TorchCommObject *)result)->backend_impl = Py_NewRef(pyobj);
    ((TorchCommObject *)result)->pyb = 1;
  }
out:
  Py_XDECREF(cls);
  Py_XDECREF(pyobj);
  if (cstore) tc_store_release(cstore); /* the communicator holds its own */
  if (h && h != small) PyMem_Free(h);
  Py_XDECREF(hint_keep);
  Py_XDECREF(device_obj);
  return result;
}

/* ---- methods ---- */

static PyObject *tcpy_comm_finalize(TorchCommObject *self, PyObject *u) {
  if (tcpy_comm_live(self, "finalize") < 0) return NULL;
  tc_comm_t *c = self->comm;
  /* hooks: finalize has torchcomms' kFinalizeOpId (it takes no number) */
  int hooked = self->hooked;
  if (hooked && self->hooks[TCPY_HOOK_PRE]) {
    PyObject *pre = tcpy_hook_args(TCPY_HOOK_OP_FINALIZE, -1, "");
    if (!pre) return NULL;
    int bad = tcpy_hooks_run_pre(self, TCPY_HOOK_OP_FINALIZE,
                                 TCPY_FINALIZE_OP_ID, pre);
    Py_DECREF(pre);
    if (bad) return NULL;
  }
  char text[TCPY_ERRBUF];
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = tc_comm_finalize(c);
  TCPY_SAVE_ERROR(text, rc);
  Py_END_ALLOW_THREADS
  tcpy_comm_reap(self);
  tcpy_win_release_orphans(c);
  if (rc != TC_OK) {
    PyErr_Format(PyExc_RuntimeError, "%s", text[0] ? text : tc_strerror(rc));
    return NULL;
  }
  Py_CLEAR(self->registered); /* registrations end with the communicator */
  if (hooked) tcpy_hooks_run_post(self, TCPY_HOOK_OP_FINALIZE,
                                  TCPY_FINALIZE_OP_ID);
  Py_RETURN_NONE;
}

static PyObject *tcpy_comm_abort(TorchCommObject *self, PyObject *u) {
  if (tcpy_comm_live(self, "abort") < 0) return NULL;
  tc_comm_t *c = self->comm;
  char text[TCPY_ERRBUF];
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = tc_comm_abort(c);
  TCPY_SAVE_ERROR(text, rc);
  Py_END_ALLOW_THREADS
  tcpy_comm_reap(self);
  tcpy_win_release_orphans(c);
  Py_CLEAR(self->registered);
  if (rc != TC_OK) {
    PyErr_Format(PyExc_RuntimeError, "%s", text[0] ? text : tc_strerror(rc));
    return NULL;
  }
  Py_RETURN_NONE;
}

static PyObject *tcpy_comm_is_aborted(TorchCommObject *self, PyObject *u) {
  if (tcpy_comm_live(self, "is_aborted") < 0) return NULL;
  return PyBool_FromLong(tc_comm_is_aborted(self->comm));
}

static PyObject *tcpy_comm_set_timeout(TorchCommObject *self, PyObject *args,
                                       PyObject *kw) {
  static char *kwlist[] = {"timeout", NULL};
  PyObject *timeout;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O:set_timeout", kwlist, &timeout))
    return NULL;
  if (tcpy_comm_live(self, "set_timeout") < 0) return NULL;
  if (timeout == Py_None) {
    PyErr_SetString(PyExc_TypeError, "set_timeout: argument 'timeout' must be "
                    "a datetime.timedelta, not None");
    return NULL;
  }
  double s;
  if (tcpy_seconds(timeout, "set_timeout", "timeout", 0, &s) < 0) return NULL;
  int rc = tc_comm_set_timeout(self->comm, s);
  if (rc != TC_OK) return tcpy_raise(rc, tc_last_error());
  if (self->pyb) /* a Python backend hears of it too (torchcomms' setTimeout) */
    return PyObject_CallMethod(self->backend_impl, "set_timeout", "(O)", timeout);
  Py_RETURN_NONE;
}

static PyObject *tcpy_comm_set_hints(TorchCommObject *self, PyObject *args,
                                     PyObject *kw) {
  static char *kwlist[] = {"hints", NULL};
  PyObject *hints, *keep = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O:set_hints", kwlist, &hints))
    return NULL;
  if (tcpy_comm_live(self, "set_hints") < 0) return NULL;
  if (hints == Py_None) {
    PyErr_SetString(PyExc_TypeError, "set_hints: argument 'hints' must be a "
                    "dict[str, str], not None");
    return NULL;
  }
  tc_hint_t small[8], *h;
  size_t nh;
  if (tcpy_hints(hints, "set_hints", small, 8, &h, &nh, &keep) < 0)
    return NULL;
  int rc = tc_comm_set_hints(self->comm, h, nh);
  if (h && h != small) PyMem_Free(h);
  Py_XDECREF(keep);
  if (rc != TC_OK) return tcpy_raise(rc, tc_last_error());
  Py_RETURN_NONE;
}

static PyObject *tcpy_comm_get_rank(TorchCommObject *self, PyObject *u) {
  if (tcpy_comm_live(self, "get_rank") < 0) return NULL;
  return PyLong_FromLong(tc_comm_rank(self->comm));
}

static PyObject *tcpy_comm_get_size(TorchCommObject *self, PyObject *u) {
  if (tcpy_comm_live(self, "get_size") < 0) return NULL;
  return PyLong_FromLong(tc_comm_size(self->comm));
}

static PyObject *tcpy_comm_str(TorchCommObject *self, const char *op,
                               const char *v) {
  if (tcpy_comm_live(self, op) < 0) return NULL;
  return PyUnicode_FromString(v ? v : "");
}

static PyObject *tcpy_comm_get_name(TorchCommObject *self, PyObject *u) {
  return tcpy_comm_str(self, "get_name",
                       self->comm ? tc_comm_name(self->comm) : NULL);
}

static PyObject *tcpy_comm_get_backend(TorchCommObject *self, PyObject *u) {
  return tcpy_comm_str(self, "get_backend",
                       self->comm ? tc_comm_backend(self->comm) : NULL);
}

static PyObject *tcpy_comm_get_backend_version(TorchCommObject *self,
                                               PyObject *u) {
  return tcpy_comm_str(self, "get_backend_version",
                       self->comm ? tc_comm_backend_version(self->comm) : NULL);
}

static PyObject *tcpy_comm_get_device(TorchCommObject *self, PyObject *u) {
  if (!self->device_obj) {
    self->device_obj = tcpy_torch_device(self->dev.type, self->dev.index);
    if (!self->device_obj) return NULL;
  }
  return Py_NewRef(self->device_obj);
}

static PyObject *tcpy_comm_get_options(TorchCommObject *self, PyObject *u) {
  if (tcpy_comm_live(self, "get_options") < 0) return NULL;
  tc_comm_options_t o;
  int rc = tc_comm_get_options(self->comm, &o);
  if (rc != TC_OK) return tcpy_raise(rc, tc_last_error());
  PyObject *hints = PyDict_New(), *td = NULL, *kw = NULL, *args = NULL,
           *res = NULL;
  if (!hints) return NULL;
  for (size_t i = 0; i < o.num_hints; i++) {
    PyObject *v = PyUnicode_FromString(o.hints[i].value);
    if (!v || PyDict_SetItemString(hints, o.hints[i].key, v) < 0) {
      Py_XDECREF(v);
      goto out;
    }
    Py_DECREF(v);
  }
  if (!(td = PyObject_CallFunction(tcpy_timedelta, "(id)", 0, o.timeout_s)))
    goto out;
  if (!(args = PyTuple_New(0))) goto out;
  kw = Py_BuildValue("{sOsOsOsOsOsOss}", "abort_process_on_timeout_or_error",
                     o.abort_process_on_timeout_or_error > 0 ? Py_True : Py_False,
                     "timeout", td, "high_priority_stream",
                     self->high_priority_stream ? Py_True : Py_False, "store",
                     self->store, "enable_reconfigure",
                     self->enable_reconfigure ? Py_True : Py_False, "hints",
                     hints, "name", tc_comm_name(self->comm));
  if (kw) res = PyObject_Call(tcpy_CommOptions, args, kw);
out:
  Py_XDECREF(kw);
  Py_XDECREF(args);
  Py_XDECREF(td);
  Py_DECREF(hints);
  return res;
}

static PyObject *tcpy_comm_split(TorchCommObject *self, PyObject *args,
                                 PyObject *kw) {
  static const char *fn = "split";
  static char *kwlist[] = {"ranks", "name", "hints", "timeout", NULL};
  PyObject *ranks, *name, *hints = Py_None, *timeout = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|OO:split", kwlist, &ranks,
                                   &name, &hints, &timeout))
    return NULL;
  if (tcpy_comm_live(self, fn) < 0) return NULL;
  if (!PyUnicode_Check(name)) {
    PyErr_Format(PyExc_TypeError, "split: argument 'name' must be a str, not "
                 "%.100s", Py_TYPE(name)->tp_name);
    return NULL;
  }
  const char *cname = PyUnicode_AsUTF8(name);
  if (!cname) return NULL;
  if (!PyList_Check(ranks) && !PyTuple_Check(ranks)) {
    PyErr_Format(PyExc_TypeError, "split: argument 'ranks' must be a list of "
                 "ints, not %.100s", Py_TYPE(ranks)->tp_name);
    return NULL;
  }
  PyObject *t = PySequence_Tuple(ranks);
  if (!t) return NULL;
  Py_ssize_t n = PyTuple_GET_SIZE(t);
  int *r = PyMem_New(int, (size_t)(n ? n : 1));
  PyObject *result = NULL;
  tcpy_opts_t opts;
  int opts_ok = 0;
  if (!r) {
    PyErr_NoMemory();
    goto out;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    char an[32];
    snprintf(an, sizeof an, "ranks[%zd]", i);
    if (tcpy_int(PyTuple_GET_ITEM(t, i), fn, an, &r[i]) < 0) goto out;
  }
  if (tcpy_opts_init(&opts, fn, hints, timeout) < 0) goto out;
  opts_ok = 1;
  /* hooks: the split's op_id is that of the all_gather_single it runs to
   * agree on the groups (its first operation on this communicator) */
  uint64_t op_id = 0;
  int hooked = self->hooked;
  if (hooked) {
    op_id = tc_comm_next_op_id(self->comm);
    if (self->hooks[TCPY_HOOK_PRE]) {
      PyObject *l = PyList_New(n), *pre;
      if (!l) goto out;
      for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyLong_FromLong(r[i]);
        if (!v) {
          Py_DECREF(l);
          goto out;
        }
        PyList_SET_ITEM(l, i, v);
      }
      pre = tcpy_hook_args(TCPY_HOOK_OP_SPLIT, -1, "OO", l, name);
      Py_DECREF(l);
      if (!pre) goto out;
      int bad = tcpy_hooks_run_pre(self, TCPY_HOOK_OP_SPLIT, op_id, pre);
      Py_DECREF(pre);
      if (bad) goto out;
    }
  }
  tc_comm_t *c = self->comm, *child = NULL;
  char text[TCPY_ERRBUF];
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = tc_comm_split(c, r, (size_t)n, cname, &opts.o, &child);
  TCPY_SAVE_ERROR(text, rc);
  Py_END_ALLOW_THREADS
  PyObject *made = tcpy_pyb_take_made(); /* a Python backend's child */
  if (rc != TC_OK) {
    Py_XDECREF(made);
    /* torchcomms' split raises RuntimeError for every refusal (duplicate
     * ranks, the caller missing from a non-empty list, ...); the library
     * has already failed it on every rank together */
    if (rc == TC_ERR_NOMEM) tcpy_raise(rc, text);
    else PyErr_Format(PyExc_RuntimeError, "%s", text[0] ? text : tc_strerror(rc));
    goto out;
  }
  if (!child) {
    Py_XDECREF(made);
    result = Py_NewRef(Py_None);
    goto out;
  }
  result = tcpy_comm_wrap(child, &self->dev, self->store, self->device_obj,
                          self->high_priority_stream, self->enable_reconfigure);
  if (result && made) {
    ((TorchCommObject *)result)->backend_impl = made;
    ((TorchCommObject *)result)->pyb = 1;
  } else {
    Py_XDECREF(made);
  }
  if (result && hooked) tcpy_hooks_run_post(self, TCPY_HOOK_OP_SPLIT, op_id);
  if (result) tcpy_hooks_run_split(self, result);
out:
  if (opts_ok) tcpy_opts_free(&opts);
  PyMem_Free(r);
  Py_DECREF(t);
  return result;
}

static PyObject *tcpy_comm_batch_op_create(TorchCommObject *self, PyObject *u) {
  if (tcpy_comm_live(self, "batch_op_create") < 0) return NULL;
  return tcpy_batch_new(self);
}

static PyObject *tcpy_comm_repr(TorchCommObject *self) {
  if (!self->comm) return PyUnicode_FromString("<TorchComm (destroyed)>");
  const char *state = tc_comm_is_aborted(self->comm) ? " aborted" : "";
  if (self->dev.index >= 0)
    return PyUnicode_FromFormat(
        "<TorchComm name='%s' backend='%s' device='%s:%d' rank=%d size=%d%s>",
        tc_comm_name(self->comm), tc_comm_backend(self->comm), self->dev.type,
        self->dev.index, tc_comm_rank(self->comm), tc_comm_size(self->comm),
        state);
  return PyUnicode_FromFormat(
      "<TorchComm name='%s' backend='%s' device='%s' rank=%d size=%d%s>",
      tc_comm_name(self->comm), tc_comm_backend(self->comm), self->dev.type,
      tc_comm_rank(self->comm), tc_comm_size(self->comm), state);
}

static int tcpy_comm_traverse(TorchCommObject *self, visitproc visit,
                              void *arg) {
  Py_VISIT(self->pending);
  Py_VISIT(self->store);
  Py_VISIT(self->device_obj);
  Py_VISIT(self->registered);
  Py_VISIT(self->backend_impl);
  for (int k = 0; k < TCPY_HOOK_KINDS; k++) Py_VISIT(self->hooks[k]);
  return 0;
}

/* tp_clear drops the hooks only (a hook holding its communicator is a
 * cycle): pending works guard buffers of running operations; the
 * communicator is destroyed (aborted if still active) before they go. */
static int tcpy_comm_clear(TorchCommObject *self) {
  tcpy_hooks_clear(self, 0);
  return 0;
}

static void tcpy_comm_dealloc(TorchCommObject *self) {
  PyObject_GC_UnTrack(self);
  if (self->weakreflist) PyObject_ClearWeakRefs((PyObject *)self);
  tcpy_hooks_clear(self, 1); /* the C abort hook goes before the handle */
  if (self->comm) {
    tc_comm_t *c = self->comm;
    self->comm = NULL;
    Py_BEGIN_ALLOW_THREADS
    tc_comm_destroy(c);
    Py_END_ALLOW_THREADS
    tcpy_win_release_orphans(c); /* the windows outlive it: no barrier */
  }
  Py_CLEAR(self->pending);
  Py_CLEAR(self->store);
  Py_CLEAR(self->device_obj);
  Py_CLEAR(self->registered);
  Py_CLEAR(self->backend_impl);
  PyObject_GC_Del(self);
}

static PyObject *tcpy_comm_prop_rank(TorchCommObject *self, void *c) {
  return tcpy_comm_get_rank(self, NULL);
}
static PyObject *tcpy_comm_prop_size(TorchCommObject *self, void *c) {
  return tcpy_comm_get_size(self, NULL);
}
static PyObject *tcpy_comm_prop_name(TorchCommObject *self, void *c) {
  return tcpy_comm_get_name(self, NULL);
}

static PyGetSetDef tcpy_comm_getset[] = {
    {"rank", (getter)tcpy_comm_prop_rank, NULL, "this process's rank", NULL},
    {"size", (getter)tcpy_comm_prop_size, NULL, "the number of ranks", NULL},
    {"name", (getter)tcpy_comm_prop_name, NULL, "the communicator's name", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

#define TCPY_NOARGS(name, fn, doc) {name, (PyCFunction)fn, METH_NOARGS, doc}
#define TCPY_KWARGS(name, fn, doc)                                             \
  {name, (PyCFunction)(void (*)(void))fn, METH_VARARGS | METH_KEYWORDS, doc}

static PyMethodDef tcpy_comm_methods[] = {
    TCPY_NOARGS("finalize", tcpy_comm_finalize,
                "Completes pending operations and closes the communicator "
                "(collective). A second call is harmless."),
    TCPY_NOARGS("abort", tcpy_comm_abort,
                "Aborts: pending and later operations fail at once (local)."),
    TCPY_NOARGS("is_aborted", tcpy_comm_is_aborted, "True once aborted."),
    TCPY_NOARGS("is_abort_supported", tcpy_comm_is_abort_supported,
                "True when abort() stops the communicator's operations at once "
                "and leaves the process usable (cpu: yes)."),
    TCPY_NOARGS("get_init_handle", tcpy_comm_get_init_handle,
                "get_init_handle() -> InitHandle (str): this communicator's "
                "endpoint, for reconfigure. Only a communicator created with "
                "enable_reconfigure=True has one (RuntimeError otherwise)."),
    TCPY_KWARGS("reconfigure", tcpy_comm_reconfigure,
                "reconfigure(uuid, init_handles, timeout=None, hints=None) -> "
                "TorchWork: makes this communicator the group of init_handles "
                "(a list: rank i = the i-th handle; a set: sorted; a dict "
                "{handle: rank}). Every member calls it with the same uuid and "
                "handles; it blocks until the group is connected (or raises "
                "RuntimeError naming the member that disagrees or could not be "
                "reached) and returns a completed work. Pending operations of "
                "the previous configuration fail as aborted. Requires "
                "enable_reconfigure=True."),
    TCPY_KWARGS("set_timeout", tcpy_comm_set_timeout,
                "set_timeout(timeout): default timeout of later operations."),
    TCPY_KWARGS("set_hints", tcpy_comm_set_hints,
                "set_hints(hints): adds or replaces the communicator's hints "
                "(dict[str, str]; other keys kept): get_options().hints and "
                "later splits see them."),
    TCPY_NOARGS("get_rank", tcpy_comm_get_rank, "This process's rank."),
    TCPY_NOARGS("get_size", tcpy_comm_get_size, "The number of ranks."),
    TCPY_NOARGS("get_name", tcpy_comm_get_name, "The communicator's name."),
    TCPY_NOARGS("get_options", tcpy_comm_get_options,
                "The CommOptions the communicator runs with."),
    TCPY_NOARGS("get_device", tcpy_comm_get_device, "The torch.device."),
    TCPY_NOARGS("get_backend", tcpy_comm_get_backend, "The backend's name."),
    TCPY_NOARGS("get_backend_version", tcpy_comm_get_backend_version,
                "The backend's version string."),
    TCPY_KWARGS("split", tcpy_comm_split,
                "split(ranks, name, hints=None, timeout=None) -> TorchComm | "
                "None: a communicator over `ranks` (collective over every "
                "rank; ranks == [] joins none and returns None). A refused "
                "list (duplicate ranks, a rank out of range, the caller "
                "missing from a non-empty list, members passing different "
                "lists) raises RuntimeError on every rank."),
    TCPY_NOARGS("batch_op_create", tcpy_comm_batch_op_create,
                "A new BatchSendRecv."),
    {NULL, NULL, 0, NULL},
};

PyTypeObject TcPy_TorchComm_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "torchcomms._comms.TorchComm",
    .tp_basicsize = sizeof(TorchCommObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A communicator (created by new_comm or TorchComm.split).",
    .tp_dealloc = (destructor)tcpy_comm_dealloc,
    .tp_traverse = (traverseproc)tcpy_comm_traverse,
    .tp_clear = (inquiry)tcpy_comm_clear,
    .tp_repr = (reprfunc)tcpy_comm_repr,
    .tp_methods = tcpy_comm_methods,
    .tp_getset = tcpy_comm_getset,
    .tp_weaklistoffset = offsetof(TorchCommObject, weakreflist),
};

/* _comms_hooks.c -- torchcomms' Python hooks on a TorchComm (newest
 * generation of upstream's API) and the flight recorder's methods.
 *
 *   register_pre_hook(callback)    callback(name: OpName, op_id: int, args)
 *   register_post_hook(callback)   callback(op_id: int, args)
 *   register_abort_hook(callback)  callback()
 *
 * each returning a RemovableHandle (remove() is idempotent; dropping the
 * handle does not unregister; removing after the communicator is gone does
 * nothing).
 *
 * Cost: with no pre or post hook the operation path tests one int
 * (TorchCommObject.hooked) and builds nothing. With hooks, the op_id is the C
 * core's number of the operation (tc_comm_next_op_id, read under the GIL
 * right before the call), so it is the op_id the C flight recorder and the
 * C hooks see, provided no other thread issues on the same communicator in
 * between. Pre hooks run on the calling thread after the arguments were
 * validated and before the C call; the first exception propagates and the
 * operation is not issued (no number is consumed). Post hooks run right
 * after the operation was issued (synchronous: after it finished); their
 * exceptions go to sys.unraisablehook and the operation's result stands.
 *
 * Abort hooks run from a C abort hook (tc_comm_register_hook, registered
 * while at least one Python abort hook exists) that takes the GIL: so they
 * run both on TorchComm.abort() (before the communicator aborts) and before
 * the process aborts on a failed operation
 * (abort_process_on_timeout_or_error), from whichever thread saw it. */
#include "_comms.h"

#include <stdio.h>
#include <string.h>

#define TCPY_HOOK_TYPES ((int)TC_OP_TYPE_COUNT + 3)

/* OpName members and *PreHookArgs classes by TC_OP_* (+ split, finalize,
 * new_window) */
static PyObject *opname_of[TCPY_HOOK_TYPES];
static PyObject *pre_cls_of[TCPY_HOOK_TYPES];
/* post-hook argument objects (attribute-less: one instance each) */
/* one post-hook argument instance per operation type (immutable, shared) */
static PyObject *post_of[TCPY_HOOK_TYPES];

static const char *kind_names[TCPY_HOOK_KINDS] = {"pre", "post", "abort",
                                                   "split"};

static const char *type_name(int type) {
  if (type == TCPY_HOOK_OP_SPLIT) return "split";
  if (type == TCPY_HOOK_OP_FINALIZE) return "finalize";
  if (type == TCPY_HOOK_OP_NEW_WINDOW) return "new_window";
  return tc_op_name((tc_op_type_t)type);
}

int tcpy_hooks_init(PyObject *g) {
  PyObject *opname = PyDict_GetItemString(g, "OpName");
  PyObject *by_op = PyDict_GetItemString(g, "PRE_HOOK_ARGS_BY_OP");
  if (!opname || !by_op || !PyDict_Check(by_op)) {
    PyErr_SetString(PyExc_ImportError, "torchcomms._comms_classes lacks "
                    "OpName or PRE_HOOK_ARGS_BY_OP");
    return -1;
  }
  for (int t = 0; t < TCPY_HOOK_TYPES; t++) {
    const char *n = type_name(t);
    PyObject *cls = PyDict_GetItemString(by_op, n);
    if (!cls) {
      PyErr_Format(PyExc_ImportError, "torchcomms._comms_classes: no pre-hook "
                   "argument class for '%s'", n);
      return -1;
    }
    if (!PyType_Check(cls) ||
        !PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type)) {
      PyErr_Format(PyExc_ImportError, "torchcomms._comms_classes: the "
                   "pre-hook argument class of '%s' is not a named tuple", n);
      return -1;
    }
    pre_cls_of[t] = Py_NewRef(cls);
    if (!(opname_of[t] = PyObject_GetAttrString(opname, n))) return -1;
  }
  PyObject *post_by_op = PyDict_GetItemString(g, "POST_HOOK_ARGS_BY_OP");
  if (!post_by_op || !PyDict_Check(post_by_op)) {
    PyErr_SetString(PyExc_ImportError, "torchcomms._comms_classes lacks "
                    "POST_HOOK_ARGS_BY_OP");
    return -1;
  }
  for (int t = 0; t < TCPY_HOOK_TYPES; t++) {
    const char *n = type_name(t);
    PyObject *cls = PyDict_GetItemString(post_by_op, n);
    if (!cls) {
      PyErr_Format(PyExc_ImportError, "torchcomms._comms_classes: no "
                   "post-hook argument class for '%s'", n);
      return -1;
    }
    if (!(post_of[t] = PyObject_CallNoArgs(cls))) return -1;
  }
  return 0;
}

/* ---- argument objects ---- */

PyObject *tcpy_hook_args_v(int type, int async_op, const char *fmt,
                           va_list ap) {
  Py_ssize_t n = (Py_ssize_t)strlen(fmt) + (async_op >= 0);
  PyTypeObject *cls = (PyTypeObject *)pre_cls_of[type];
  /* a tuple subclass, allocated as tuple.__new__ does for subclasses */
  PyObject *o = cls->tp_alloc(cls, n);
  if (!o) return NULL;
  for (Py_ssize_t i = 0; fmt[i]; i++) {
    PyObject *v;
    if (fmt[i] == 'i') {
      v = PyLong_FromLong(va_arg(ap, int));
    } else {
      PyObject *x = va_arg(ap, PyObject *);
      if (!x) x = Py_None;
      v = fmt[i] == 'L' && (PyList_Check(x) || PyTuple_Check(x))
              ? PySequence_List(x)
              : Py_NewRef(x);
    }
    if (!v) {
      Py_DECREF(o);
      return NULL;
    }
    PyTuple_SET_ITEM(o, i, v);
  }
  if (async_op >= 0)
    PyTuple_SET_ITEM(o, n - 1, Py_NewRef(async_op ? Py_True : Py_False));
  return o;
}

PyObject *tcpy_hook_args(int type, int async_op, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  PyObject *o = tcpy_hook_args_v(type, async_op, fmt, ap);
  va_end(ap);
  return o;
}

/* ---- calling hooks ---- */

/* Reports the pending exception of a hook as unraisable, naming the hook's
 * kind, the callable and the operation. */
static void report(const char *kind, PyObject *fn, const char *op,
                   uint64_t op_id, int with_id) {
  char msg[200];
  if (with_id)
    snprintf(msg, sizeof msg, "in %s hook of '%s' (op_id %llu)", kind, op,
             (unsigned long long)op_id);
  else
    snprintf(msg, sizeof msg, "in %s hook of '%s'", kind, op);
#if PY_VERSION_HEX >= 0x030D0000
  PyErr_FormatUnraisable("Exception ignored %s: %R", msg, fn);
#else
  _PyErr_WriteUnraisableMsg(msg, fn);
#endif
}

int tcpy_hooks_run_pre(TorchCommObject *self, int type, uint64_t op_id,
                       PyObject *args) {
  PyObject *hooks = self->hooks[TCPY_HOOK_PRE];
  if (!hooks) return 0;
  Py_INCREF(hooks); /* a hook may (un)register hooks meanwhile */
  PyObject *id = PyLong_FromUnsignedLongLong(op_id);
  int rc = id ? 0 : -1;
  for (Py_ssize_t i = 0; rc == 0 && i < PyTuple_GET_SIZE(hooks); i++) {
    PyObject *fn = PyTuple_GET_ITEM(PyTuple_GET_ITEM(hooks, i), 1);
    PyObject *argv[3] = {opname_of[type], id, args};
    PyObject *r = PyObject_Vectorcall(fn, argv, 3, NULL);
    if (!r) rc = -1;
    Py_XDECREF(r);
  }
  Py_XDECREF(id);
  Py_DECREF(hooks);
  return rc;
}

void tcpy_hooks_run_post(TorchCommObject *self, int type, uint64_t op_id) {
  PyObject *hooks = self->hooks[TCPY_HOOK_POST];
  if (!hooks) return;
  PyObject *args = post_of[type];
  Py_INCREF(hooks);
  PyObject *id = PyLong_FromUnsignedLongLong(op_id);
  if (!id) {
    PyErr_WriteUnraisable(NULL);
    Py_DECREF(hooks);
    return;
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(hooks); i++) {
    PyObject *fn = PyTuple_GET_ITEM(PyTuple_GET_ITEM(hooks, i), 1);
    PyObject *argv[2] = {id, args};
    PyObject *r = PyObject_Vectorcall(fn, argv, 2, NULL);
    if (r) Py_DECREF(r);
    else report("post", fn, type_name(type), op_id, 1);
  }
  Py_DECREF(id);
  Py_DECREF(hooks);
}

void tcpy_hooks_run_split(TorchCommObject *self, PyObject *child) {
  PyObject *hooks = self->hooks[TCPY_HOOK_SPLIT];
  if (!hooks) return;
  Py_INCREF(hooks);
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(hooks); i++) {
    PyObject *fn = PyTuple_GET_ITEM(PyTuple_GET_ITEM(hooks, i), 1);
    PyObject *r = PyObject_CallOneArg(fn, child);
    if (r) Py_DECREF(r);
    else report("split", fn, "split", 0, 0);
  }
  Py_DECREF(hooks);
}

/* The C abort hook: the Python abort hooks, with the GIL. */
static int c_abort_hook(tc_hook_kind_t kind, const tc_op_info_t *info,
                        void *user) {
  TorchCommObject *self = user;
  if (TCPY_FINALIZING()) return 0;
  PyGILState_STATE g = PyGILState_Ensure();
  PyObject *hooks = Py_XNewRef(self->hooks[TCPY_HOOK_ABORT]);
  for (Py_ssize_t i = 0; hooks && i < PyTuple_GET_SIZE(hooks); i++) {
    PyObject *fn = PyTuple_GET_ITEM(PyTuple_GET_ITEM(hooks, i), 1);
    PyObject *r = PyObject_CallNoArgs(fn);
    if (r) Py_DECREF(r);
    else report("abort", fn, "abort", 0, 0);
  }
  Py_XDECREF(hooks);
  PyGILState_Release(g);
  return 0;
}

/* Unregisters the C abort hook, with the GIL released (it may be running,
 * waiting for the GIL, on another thread). */
static void c_abort_unregister(TorchCommObject *self) {
  uint64_t id = self->c_abort_hook;
  tc_comm_t *c = self->comm;
  self->c_abort_hook = 0;
  if (!id || !c) return;
  Py_BEGIN_ALLOW_THREADS
  tc_comm_unregister_hook(c, id);
  Py_END_ALLOW_THREADS
}

static void update_hooked(TorchCommObject *self) {
  self->hooked = self->hooks[TCPY_HOOK_PRE] || self->hooks[TCPY_HOOK_POST];
}

void tcpy_hooks_clear(TorchCommObject *self, int clear_c) {
  if (clear_c) c_abort_unregister(self);
  for (int k = 0; k < TCPY_HOOK_KINDS; k++) Py_CLEAR(self->hooks[k]);
  self->hooked = 0;
}

/* ---- registration ---- */

static int hooks_add(TorchCommObject *self, int kind, PyObject *fn,
                     uint64_t *out) {
  if (kind == TCPY_HOOK_ABORT && !self->c_abort_hook) {
    /* without the GIL: registering waits for a running C abort hook, which
     * may be waiting for the GIL */
    uint64_t cid = 0;
    tc_comm_t *c = self->comm;
    char text[512] = "";
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = tc_comm_register_hook(c, TC_HOOK_ABORT, c_abort_hook, self, &cid);
    if (rc != TC_OK) snprintf(text, sizeof text, "%s", tc_last_error());
    Py_END_ALLOW_THREADS
    if (rc != TC_OK) {
      tcpy_raise(rc, text);
      return -1;
    }
    if (self->c_abort_hook) { /* another thread registered one meanwhile */
      Py_BEGIN_ALLOW_THREADS
      tc_comm_unregister_hook(c, cid);
      Py_END_ALLOW_THREADS
    } else {
      self->c_abort_hook = cid;
    }
  }
  /* (with the GIL from here on: the tuple is replaced atomically) */
  uint64_t id = ++self->next_hook_id;
  PyObject *old = self->hooks[kind];
  Py_ssize_t n = old ? PyTuple_GET_SIZE(old) : 0;
  PyObject *t = PyTuple_New(n + 1);
  if (!t) return -1;
  for (Py_ssize_t i = 0; i < n; i++)
    PyTuple_SET_ITEM(t, i, Py_NewRef(PyTuple_GET_ITEM(old, i)));
  PyObject *pair = Py_BuildValue("(KO)", (unsigned long long)id, fn);
  if (!pair) {
    Py_DECREF(t);
    return -1;
  }
  PyTuple_SET_ITEM(t, n, pair);
  Py_XSETREF(self->hooks[kind], t);
  update_hooked(self);
  *out = id;
  return 0;
}

/* Removes hook `id` of `kind` (nothing if it is not there). */
static void hooks_remove(TorchCommObject *self, int kind, uint64_t id) {
  PyObject *old = self->hooks[kind];
  if (!old) return;
  Py_ssize_t n = PyTuple_GET_SIZE(old), at = -1;
  for (Py_ssize_t i = 0; i < n && at < 0; i++)
    if (PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(PyTuple_GET_ITEM(old, i),
                                                   0)) == id)
      at = i;
  if (at < 0) return;
  PyObject *t = NULL;
  if (n > 1) {
    if (!(t = PyTuple_New(n - 1))) {
      PyErr_WriteUnraisable(NULL);
      return;
    }
    for (Py_ssize_t i = 0, j = 0; i < n; i++)
      if (i != at) PyTuple_SET_ITEM(t, j++, Py_NewRef(PyTuple_GET_ITEM(old, i)));
  }
  Py_XSETREF(self->hooks[kind], t);
  update_hooked(self);
  if (kind == TCPY_HOOK_ABORT && !t) c_abort_unregister(self);
}

/* ---- RemovableHandle ---- */

typedef struct {
  PyObject_HEAD
  PyObject *comm_ref; /* weakref to the TorchComm; NULL once removed */
  int kind;
  uint64_t id;
} RemovableHandleObject;

static PyObject *handle_remove(RemovableHandleObject *self, PyObject *u) {
  PyObject *ref = self->comm_ref;
  if (!ref) Py_RETURN_NONE;
  self->comm_ref = NULL;
  PyObject *comm;
#if PY_VERSION_HEX >= 0x030D0000
  if (PyWeakref_GetRef(ref, &comm) < 0) {
    Py_DECREF(ref);
    return NULL;
  }
#else
  comm = Py_XNewRef(PyWeakref_GetObject(ref));
  if (comm == Py_None) Py_CLEAR(comm);
#endif
  if (comm) {
    hooks_remove((TorchCommObject *)comm, self->kind, self->id);
    Py_DECREF(comm);
  }
  Py_DECREF(ref);
  Py_RETURN_NONE;
}

static void handle_dealloc(RemovableHandleObject *self) {
  Py_XDECREF(self->comm_ref);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *handle_repr(RemovableHandleObject *self) {
  return PyUnicode_FromFormat("<RemovableHandle %s hook %llu%s>",
                              kind_names[self->kind],
                              (unsigned long long)self->id,
                              self->comm_ref ? "" : " (removed)");
}

static PyMethodDef handle_methods[] = {
    {"remove", (PyCFunction)handle_remove, METH_NOARGS,
     "remove(): unregisters the hook (idempotent; nothing once the "
     "communicator is gone)."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject TcPy_RemovableHandle_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "torchcomms._comms.RemovableHandle",
    .tp_basicsize = sizeof(RemovableHandleObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Returned by TorchComm.register_*_hook. Dropping it does not "
              "unregister the hook: the hook stays until remove() or until "
              "the communicator is destroyed.",
    .tp_dealloc = (destructor)handle_dealloc,
    .tp_repr = (reprfunc)handle_repr,
    .tp_methods = handle_methods,
};

static PyObject *register_hook(TorchCommObject *self, PyObject *args,
                               PyObject *kw, int kind, const char *fn) {
  static char *kwlist[] = {"callback", NULL};
  PyObject *cb;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O", kwlist, &cb)) return NULL;
  if (tcpy_comm_live(self, fn) < 0) return NULL;
  if (!PyCallable_Check(cb)) {
    PyErr_Format(PyExc_TypeError, "%s: argument 'callback' must be callable, "
                 "not %.100s", fn, Py_TYPE(cb)->tp_name);
    return NULL;
  }
  RemovableHandleObject *h =
      PyObject_New(RemovableHandleObject, &TcPy_RemovableHandle_Type);
  if (!h) return NULL;
  h->kind = kind;
  h->comm_ref = PyWeakref_NewRef((PyObject *)self, NULL);
  if (!h->comm_ref || hooks_add(self, kind, cb, &h->id) < 0) {
    Py_DECREF(h);
    return NULL;
  }
  return (PyObject *)h;
}

static PyObject *register_pre(TorchCommObject *s, PyObject *a, PyObject *k) {
  return register_hook(s, a, k, TCPY_HOOK_PRE, "register_pre_hook");
}
static PyObject *register_post(TorchCommObject *s, PyObject *a, PyObject *k) {
  return register_hook(s, a, k, TCPY_HOOK_POST, "register_post_hook");
}
static PyObject *register_abort(TorchCommObject *s, PyObject *a, PyObject *k) {
  return register_hook(s, a, k, TCPY_HOOK_ABORT, "register_abort_hook");
}
static PyObject *register_split(TorchCommObject *s, PyObject *a, PyObject *k) {
  return register_hook(s, a, k, TCPY_HOOK_SPLIT, "_register_split_hook");
}

/* ---- the flight recorder (C rings, one per communicator) ---- */

static PyObject *fr_reserve(TorchCommObject *self, PyObject *arg) {
  if (tcpy_comm_live(self, "_fr_reserve") < 0) return NULL;
  Py_ssize_t n = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
  if (n == -1 && PyErr_Occurred()) return NULL;
  if (n <= 0) Py_RETURN_NONE; /* keep the ring as it is */
  int rc = tc_fr_reserve(self->comm, (size_t)n);
  if (rc != TC_OK) return tcpy_raise(rc, tc_last_error());
  Py_RETURN_NONE;
}

static PyObject *fr_dump_json(TorchCommObject *self, PyObject *args,
                              PyObject *kw) {
  static char *kwlist[] = {"include_completed", NULL};
  int include_completed = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|p:_fr_dump_json", kwlist,
                                   &include_completed))
    return NULL;
  if (tcpy_comm_live(self, "_fr_dump_json") < 0) return NULL;
  char *out = NULL;
  int rc = tc_fr_dump_json(self->comm, include_completed, &out);
  if (rc != TC_OK) return tcpy_raise(rc, tc_last_error());
  PyObject *s = PyUnicode_FromString(out);
  tc_free(out);
  return s;
}

static PyObject *fr_size(TorchCommObject *self, PyObject *u) {
  if (tcpy_comm_live(self, "_fr_size") < 0) return NULL;
  return PyLong_FromSize_t(tc_fr_size(self->comm));
}

static PyObject *fr_reset(TorchCommObject *self, PyObject *u) {
  if (tcpy_comm_live(self, "_fr_reset") < 0) return NULL;
  int rc = tc_fr_reset(self->comm);
  if (rc != TC_OK) return tcpy_raise(rc, tc_last_error());
  Py_RETURN_NONE;
}

static PyObject *next_op_id(TorchCommObject *self, PyObject *u) {
  if (tcpy_comm_live(self, "_next_op_id") < 0) return NULL;
  return PyLong_FromUnsignedLongLong(tc_comm_next_op_id(self->comm));
}

PyObject *tcpy_fr_dump_file(PyObject *module, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"path", NULL};
  PyObject *path = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:_fr_dump_file", kwlist, &path))
    return NULL;
  PyObject *bytes = NULL;
  if (path != Py_None && !PyUnicode_FSConverter(path, &bytes)) return NULL;
  const char *p = bytes ? PyBytes_AS_STRING(bytes) : NULL;
  char *written = NULL, text[1024] = "";
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = tc_fr_dump_file(p, &written);
  if (rc != TC_OK) snprintf(text, sizeof text, "%s", tc_last_error());
  Py_END_ALLOW_THREADS
  Py_XDECREF(bytes);
  if (rc != TC_OK) return tcpy_raise(rc, text);
  PyObject *s = PyUnicode_DecodeFSDefault(written ? written : "");
  tc_free(written);
  return s;
}

#define TCPY_HK(name, fn, doc)                                                 \
  {name, (PyCFunction)(void (*)(void))fn, METH_VARARGS | METH_KEYWORDS, doc}

PyMethodDef tcpy_comm_hook_methods[] = {
    TCPY_HK("register_pre_hook", register_pre,
            "register_pre_hook(callback) -> RemovableHandle: "
            "callback(name: OpName, op_id: int, args) before every operation "
            "(after its arguments were checked); an exception it raises "
            "propagates and the operation is not issued."),
    TCPY_HK("register_post_hook", register_post,
            "register_post_hook(callback) -> RemovableHandle: "
            "callback(op_id: int, args) right after every operation was "
            "issued (synchronous ones: finished); exceptions are reported "
            "and ignored."),
    TCPY_HK("register_abort_hook", register_abort,
            "register_abort_hook(callback) -> RemovableHandle: callback() "
            "before the communicator aborts (abort(), or before the process "
            "aborts on a failed operation); exceptions are reported and "
            "ignored."),
    TCPY_HK("_register_split_hook", register_split,
            "_register_split_hook(callback) -> RemovableHandle: "
            "callback(new_comm) after a split that made a communicator "
            "(private: the flight recorder registers split children)."),
    {"_fr_reserve", (PyCFunction)fr_reserve, METH_O,
     "_fr_reserve(n): the flight recorder keeps at least the last n "
     "operations of this communicator (n <= 0: unchanged)."},
    TCPY_HK("_fr_dump_json", fr_dump_json,
            "_fr_dump_json(include_completed=True) -> str: this "
            "communicator's flight recorder trace (torch's JSON format)."),
    {"_fr_size", (PyCFunction)fr_size, METH_NOARGS,
     "_fr_size() -> int: entries in the flight recorder since its reset."},
    {"_fr_reset", (PyCFunction)fr_reset, METH_NOARGS,
     "_fr_reset(): forgets the flight recorder's entries."},
    {"_next_op_id", (PyCFunction)next_op_id, METH_NOARGS,
     "_next_op_id() -> int: the op_id the next operation will get."},
    {NULL, NULL, 0, NULL},
};
#undef TCPY_HK

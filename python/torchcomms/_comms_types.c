/* _comms_types.c -- ReduceOp, TorchWork, P2POp and BatchSendRecv. */
#include "_comms.h"

#include <math.h>
#include <string.h>


/* ======================================================================== */
/* ReduceOp                                                                  */
/* ======================================================================== */

static const char *const tcpy_redop_names[TC_REDOP_COUNT] = {
    [TC_SUM] = "SUM",   [TC_PRODUCT] = "PRODUCT", [TC_MIN] = "MIN",
    [TC_MAX] = "MAX",   [TC_BAND] = "BAND",       [TC_BOR] = "BOR",
    [TC_BXOR] = "BXOR", [TC_AVG] = "AVG",         [TC_PREMUL_SUM] = "PREMUL_SUM",
};

PyObject *tcpy_redop_make(tc_redop_t op) {
  ReduceOpObject *r = PyObject_New(ReduceOpObject, &TcPy_ReduceOp_Type);
  if (r) r->op = op;
  return (PyObject *)r;
}

/* RedOpType member -> C type, or -1 (no exception) if obj is not one. */
static int tcpy_redop_from_enum(PyObject *obj) {
  for (int i = 0; i < TC_REDOP_COUNT; i++)
    if (obj == tcpy_redop_members[i]) return i;
  return -1;
}

int tcpy_redop(PyObject *obj, const char *op, tc_redop_t *out) {
  if (!obj || obj == Py_None) {
    *out = TC_OP(TC_SUM);
    return 0;
  }
  if (PyObject_TypeCheck(obj, &TcPy_ReduceOp_Type)) {
    *out = ((ReduceOpObject *)obj)->op;
    return 0;
  }
  int t = tcpy_redop_from_enum(obj);
  if (t >= 0 && t != TC_PREMUL_SUM) {
    *out = TC_OP((tc_redop_type_t)t);
    return 0;
  }
  if (t == TC_PREMUL_SUM)
    PyErr_Format(PyExc_ValueError, "%s: argument 'op' RedOpType.PREMUL_SUM "
                 "needs a factor: use ReduceOp.PREMUL_SUM(factor)", op);
  else
    PyErr_Format(PyExc_TypeError, "%s: argument 'op' must be a "
                 "torchcomms.ReduceOp, not %.100s", op, Py_TYPE(obj)->tp_name);
  return -1;
}

static PyObject *tcpy_redop_new(PyTypeObject *type, PyObject *args,
                                PyObject *kw) {
  static char *kwlist[] = {"type", NULL};
  PyObject *t;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O:ReduceOp", kwlist, &t))
    return NULL;
  tc_redop_t op;
  if (tcpy_redop(t, "ReduceOp", &op) < 0) return NULL;
  ReduceOpObject *r = (ReduceOpObject *)type->tp_alloc(type, 0);
  if (r) r->op = op;
  return (PyObject *)r;
}

static PyObject *tcpy_redop_premul_sum(PyObject *unused, PyObject *factor) {
  PyObject *num = NULL;
  if (PyFloat_Check(factor) || PyLong_Check(factor)) {
    num = Py_NewRef(factor);
  } else if (PyObject_HasAttr(factor, tcpy_str.numel) &&
             PyObject_HasAttr(factor, tcpy_str.item)) {
    PyObject *n = PyObject_CallMethodNoArgs(factor, tcpy_str.numel);
    if (!n) return NULL;
    long ne = PyLong_AsLong(n);
    Py_DECREF(n);
    if (ne == -1 && PyErr_Occurred()) return NULL;
    if (ne != 1) {
      PyErr_Format(PyExc_ValueError, "ReduceOp.PREMUL_SUM: argument 'factor' "
                   "must be a float or a one-element tensor (it has %ld "
                   "elements)", ne);
      return NULL;
    }
    num = PyObject_CallMethodNoArgs(factor, tcpy_str.item);
    if (!num) return NULL;
  } else {
    PyErr_Format(PyExc_TypeError, "ReduceOp.PREMUL_SUM: argument 'factor' "
                 "must be a float or a one-element tensor, not %.100s",
                 Py_TYPE(factor)->tp_name);
    return NULL;
  }
  double f = PyFloat_AsDouble(num);
  Py_DECREF(num);
  if (f == -1.0 && PyErr_Occurred()) {
    if (PyErr_ExceptionMatches(PyExc_TypeError)) {
      PyErr_Clear();
      PyErr_SetString(PyExc_TypeError, "ReduceOp.PREMUL_SUM: argument "
                      "'factor' must be a real number");
    }
    return NULL;
  }
  if (!isfinite(f)) {
    PyErr_SetString(PyExc_ValueError,
                    "ReduceOp.PREMUL_SUM: argument 'factor' must be finite");
    return NULL;
  }
  return tcpy_redop_make(TC_OP_PREMUL_SUM(f));
}

static PyObject *tcpy_redop_type_get(ReduceOpObject *self, void *c) {
  return Py_NewRef(tcpy_redop_members[self->op.type]);
}

static PyObject *tcpy_redop_repr(ReduceOpObject *self) {
  if (self->op.type == TC_PREMUL_SUM) {
    PyObject *f = PyFloat_FromDouble(self->op.factor);
    if (!f) return NULL;
    PyObject *r = PyUnicode_FromFormat("ReduceOp.PREMUL_SUM(%R)", f);
    Py_DECREF(f);
    return r;
  }
  return PyUnicode_FromFormat("ReduceOp.%s", tcpy_redop_names[self->op.type]);
}

static PyObject *tcpy_redop_richcompare(PyObject *a, PyObject *b, int cmp) {
  if (cmp != Py_EQ && cmp != Py_NE) Py_RETURN_NOTIMPLEMENTED;
  if (!PyObject_TypeCheck(b, &TcPy_ReduceOp_Type)) Py_RETURN_NOTIMPLEMENTED;
  tc_redop_t x = ((ReduceOpObject *)a)->op, y = ((ReduceOpObject *)b)->op;
  int eq = x.type == y.type && (x.type != TC_PREMUL_SUM || x.factor == y.factor);
  return PyBool_FromLong(cmp == Py_EQ ? eq : !eq);
}

static Py_hash_t tcpy_redop_hash(ReduceOpObject *self) {
  uint64_t h = (uint64_t)self->op.type * 1000003u;
  if (self->op.type == TC_PREMUL_SUM) {
    double f = self->op.factor == 0.0 ? 0.0 : self->op.factor; /* -0.0 */
    uint64_t bits;
    memcpy(&bits, &f, sizeof bits);
    h ^= bits * 0x9E3779B97F4A7C15ull;
  }
  Py_hash_t r = (Py_hash_t)(h >> 1);
  return r == -1 ? -2 : r;
}

static PyMethodDef tcpy_redop_methods[] = {
    {"PREMUL_SUM", (PyCFunction)tcpy_redop_premul_sum, METH_O | METH_STATIC,
     "PREMUL_SUM(factor) -> ReduceOp: every input multiplied by factor (a "
     "float or a one-element tensor), then summed."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef tcpy_redop_getset[] = {
    {"type", (getter)tcpy_redop_type_get, NULL, "the RedOpType", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject TcPy_ReduceOp_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "torchcomms._comms.ReduceOp",
    .tp_basicsize = sizeof(ReduceOpObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A reduction: ReduceOp.SUM, PRODUCT, MIN, MAX, BAND, BOR, BXOR, "
              "AVG, or ReduceOp.PREMUL_SUM(factor).",
    .tp_new = tcpy_redop_new,
    .tp_repr = (reprfunc)tcpy_redop_repr,
    .tp_richcompare = tcpy_redop_richcompare,
    .tp_hash = (hashfunc)tcpy_redop_hash,
    .tp_methods = tcpy_redop_methods,
    .tp_getset = tcpy_redop_getset,
};

/* ======================================================================== */
/* TorchWork                                                                 */
/* ======================================================================== */

/* Every synchronous operation returns this one completed TorchWork (no
 * allocation on the synchronous path). */
static PyObject *tcpy_done_work;

PyObject *tcpy_work_new(tc_work_t *work, PyObject *refs) {
  if (!work && tcpy_done_work) return Py_NewRef(tcpy_done_work);
  TorchWorkObject *w = PyObject_GC_New(TorchWorkObject, &TcPy_TorchWork_Type);
  if (!w) {
    if (work) {
      /* cannot track it: wait so the buffers are not freed under the op */
      Py_BEGIN_ALLOW_THREADS
      tc_work_wait(work);
      tc_work_release(work);
      Py_END_ALLOW_THREADS
    }
    return NULL;
  }
  w->work = work;
  w->refs = work ? Py_XNewRef(refs) : NULL;
  w->weakreflist = NULL;
  PyObject_GC_Track(w);
  return (PyObject *)w;
}

int tcpy_work_done(TorchWorkObject *w) {
  if (!w->work) return 1;
  int done = 0;
  tc_work_test(w->work, &done);
  if (done) Py_CLEAR(w->refs);
  return done;
}

static PyObject *tcpy_work_wait(TorchWorkObject *self, PyObject *unused) {
  if (!self->work) Py_RETURN_NONE;
  int rc;
  char text[1024];
  Py_BEGIN_ALLOW_THREADS
  rc = tc_work_wait(self->work);
  if (rc != TC_OK) {
    const char *e = tc_work_error(self->work);
    snprintf(text, sizeof text, "%s", e && *e ? e : tc_last_error());
  }
  Py_END_ALLOW_THREADS
  if (rc != TC_OK) {
    tcpy_work_done(self);
    PyErr_Format(PyExc_RuntimeError, "%s", text[0] ? text : tc_strerror(rc));
    return NULL;
  }
  Py_CLEAR(self->refs);
  Py_RETURN_NONE;
}

/* torchcomms' TorchWork::waitBlocking, which only its mccl backend
 * implements (its gloo backend, like ours, raises; WaitBlockingTest): not
 * implemented. The work is untouched (wait() still works). */
static PyObject *tcpy_work_wait_blocking(TorchWorkObject *self, PyObject *u) {
  PyErr_SetString(PyExc_RuntimeError,
                  "[TorchWork]: waitBlocking not implemented for this work "
                  "type (as in torchcomms' gloo backend; wait() blocks the "
                  "calling thread until the operation finishes)");
  return NULL;
}

/* torchcomms accepts _set_status only on works a Python backend created;
 * every TorchWork here comes from the library. */
static PyObject *tcpy_work_set_status(TorchWorkObject *self, PyObject *args,
                                      PyObject *kw) {
  static char *kwlist[] = {"status", NULL};
  PyObject *status;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O:_set_status", kwlist, &status))
    return NULL;
  int ok = PyObject_IsInstance(status, tcpy_WorkStatus);
  if (ok < 0) return NULL;
  if (!ok) {
    PyErr_Format(PyExc_TypeError, "_set_status: argument 'status' must be a "
                 "WorkStatus, not %.100s", Py_TYPE(status)->tp_name);
    return NULL;
  }
  PyErr_SetString(PyExc_RuntimeError, "_set_status is only supported on "
                  "Python-created work objects (this TorchWork belongs to an "
                  "operation of the library; its status follows the "
                  "operation)");
  return NULL;
}

static PyObject *tcpy_work_is_completed(TorchWorkObject *self, PyObject *u) {
  return PyBool_FromLong(tcpy_work_done(self));
}

static PyObject *tcpy_work_status(TorchWorkObject *self, PyObject *u) {
  int s = self->work ? tc_work_status(self->work) : TC_WORK_COMPLETED;
  if (s < 0 || s > 4) {
    PyErr_SetString(PyExc_RuntimeError, "TorchWork.status: invalid work handle");
    return NULL;
  }
  return Py_NewRef(tcpy_status_members[s]);
}

static PyObject *tcpy_work_repr(TorchWorkObject *self) {
  int s = self->work ? tc_work_status(self->work) : TC_WORK_COMPLETED;
  return PyUnicode_FromFormat("<TorchWork %s>", tc_work_status_name(s));
}

static int tcpy_work_traverse(TorchWorkObject *self, visitproc visit,
                              void *arg) {
  Py_VISIT(self->refs);
  return 0;
}

/* No tp_clear: the references protect buffers the library may still be
 * writing; cycles through them break at the other objects. */
static void tcpy_work_dealloc(TorchWorkObject *self) {
  PyObject_GC_UnTrack(self);
  if (self->weakreflist) PyObject_ClearWeakRefs((PyObject *)self);
  if (self->work) {
    tc_work_t *w = self->work;
    int done = 0;
    tc_work_test(w, &done);
    if (!done && self->refs) {
      /* Only reachable if the communicator's pending list lost it: never
       * free the buffers under a running operation. */
      Py_BEGIN_ALLOW_THREADS
      tc_work_wait(w);
      Py_END_ALLOW_THREADS
    }
    tc_work_release(w);
    self->work = NULL;
  }
  Py_CLEAR(self->refs);
  PyObject_GC_Del(self);
}

static PyMethodDef tcpy_work_methods[] = {
    {"wait", (PyCFunction)tcpy_work_wait, METH_NOARGS,
     "Blocks (GIL released) until the operation finishes; raises "
     "RuntimeError if it failed or timed out."},
    {"wait_blocking", (PyCFunction)tcpy_work_wait_blocking, METH_NOARGS,
     "torchcomms' mccl-only blocking wait: RuntimeError ('waitBlocking not "
     "implemented'), as for torchcomms' gloo backend; use wait(), which "
     "blocks the calling thread here."},
    {"_set_status", (PyCFunction)(void (*)(void))tcpy_work_set_status,
     METH_VARARGS | METH_KEYWORDS,
     "_set_status(status: WorkStatus): for works a Python backend created; "
     "RuntimeError on this library's works (TypeError for a non-WorkStatus)."},
    {"is_completed", (PyCFunction)tcpy_work_is_completed, METH_NOARGS,
     "True once the operation finished (successfully or not; wait() "
     "raises for a failure). Never blocks."},
    {"status", (PyCFunction)tcpy_work_status, METH_NOARGS,
     "The WorkStatus of the operation."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject TcPy_TorchWork_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "torchcomms._comms.TorchWork",
    .tp_basicsize = sizeof(TorchWorkObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "An issued operation: wait(), is_completed(), status().",
    .tp_dealloc = (destructor)tcpy_work_dealloc,
    .tp_traverse = (traverseproc)tcpy_work_traverse,
    .tp_repr = (reprfunc)tcpy_work_repr,
    .tp_methods = tcpy_work_methods,
    .tp_weaklistoffset = offsetof(TorchWorkObject, weakreflist),
};

/* ======================================================================== */
/* P2POp                                                                     */
/* ======================================================================== */

static int tcpy_p2p_index(PyObject *type) {
  if (type == tcpy_p2p_members[0]) return 0;
  if (type == tcpy_p2p_members[1]) return 1;
  return -1;
}

static PyObject *tcpy_p2p_make(PyTypeObject *cls, PyObject *type,
                               PyObject *tensor, int peer) {
  P2POpObject *p = (P2POpObject *)cls->tp_alloc(cls, 0);
  if (!p) return NULL;
  p->type = Py_NewRef(type);
  p->tensor = Py_NewRef(tensor);
  p->peer = peer;
  return (PyObject *)p;
}

static PyObject *tcpy_p2p_new(PyTypeObject *cls, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"type", "tensor", "peer", NULL};
  PyObject *type, *tensor, *peer;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO:P2POp", kwlist, &type,
                                   &tensor, &peer))
    return NULL;
  if (tcpy_p2p_index(type) < 0) {
    PyErr_Format(PyExc_TypeError, "P2POp: argument 'type' must be a "
                 "P2POpType, not %.100s", Py_TYPE(type)->tp_name);
    return NULL;
  }
  int p;
  if (tcpy_int(peer, "P2POp", "peer", &p) < 0) return NULL;
  return tcpy_p2p_make(cls, type, tensor, p);
}

static int tcpy_p2p_traverse(P2POpObject *self, visitproc visit, void *arg) {
  Py_VISIT(self->type);
  Py_VISIT(self->tensor);
  return 0;
}

static int tcpy_p2p_clear(P2POpObject *self) {
  Py_CLEAR(self->type);
  Py_CLEAR(self->tensor);
  return 0;
}

static void tcpy_p2p_dealloc(P2POpObject *self) {
  PyObject_GC_UnTrack(self);
  tcpy_p2p_clear(self);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *tcpy_p2p_repr(P2POpObject *self) {
  return PyUnicode_FromFormat("P2POp(%R, <tensor>, peer=%d)", self->type,
                              self->peer);
}

static PyObject *tcpy_p2p_get_type(P2POpObject *self, void *c) {
  return Py_NewRef(self->type);
}
static int tcpy_p2p_set_type(P2POpObject *self, PyObject *v, void *c) {
  if (!v || tcpy_p2p_index(v) < 0) {
    PyErr_SetString(PyExc_TypeError, "P2POp.type must be a P2POpType");
    return -1;
  }
  Py_SETREF(self->type, Py_NewRef(v));
  return 0;
}
static PyObject *tcpy_p2p_get_tensor(P2POpObject *self, void *c) {
  return Py_NewRef(self->tensor);
}
static int tcpy_p2p_set_tensor(P2POpObject *self, PyObject *v, void *c) {
  if (!v) {
    PyErr_SetString(PyExc_TypeError, "P2POp.tensor cannot be deleted");
    return -1;
  }
  Py_SETREF(self->tensor, Py_NewRef(v));
  return 0;
}
static PyObject *tcpy_p2p_get_peer(P2POpObject *self, void *c) {
  return PyLong_FromLong(self->peer);
}
static int tcpy_p2p_set_peer(P2POpObject *self, PyObject *v, void *c) {
  if (!v) {
    PyErr_SetString(PyExc_TypeError, "P2POp.peer cannot be deleted");
    return -1;
  }
  return tcpy_int(v, "P2POp", "peer", &self->peer);
}

static PyGetSetDef tcpy_p2p_getset[] = {
    {"type", (getter)tcpy_p2p_get_type, (setter)tcpy_p2p_set_type,
     "P2POpType.SEND or RECV", NULL},
    {"tensor", (getter)tcpy_p2p_get_tensor, (setter)tcpy_p2p_set_tensor,
     "the tensor sent or received into", NULL},
    {"peer", (getter)tcpy_p2p_get_peer, (setter)tcpy_p2p_set_peer,
     "the other rank", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject TcPy_P2POp_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "torchcomms._comms.P2POp",
    .tp_basicsize = sizeof(P2POpObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "P2POp(type: P2POpType, tensor, peer: int)",
    .tp_new = tcpy_p2p_new,
    .tp_dealloc = (destructor)tcpy_p2p_dealloc,
    .tp_traverse = (traverseproc)tcpy_p2p_traverse,
    .tp_clear = (inquiry)tcpy_p2p_clear,
    .tp_repr = (reprfunc)tcpy_p2p_repr,
    .tp_getset = tcpy_p2p_getset,
};

/* ======================================================================== */
/* BatchSendRecv                                                             */
/* ======================================================================== */

static PyObject *tcpy_batch_post(BatchSendRecvObject *self, PyObject *args,
                                 PyObject *kw, int send) {
  static char *kws[] = {"tensor", "dst", NULL}, *kwr[] = {"tensor", "src", NULL};
  PyObject *tensor, *peer;
  if (!PyArg_ParseTupleAndKeywords(args, kw, send ? "OO:send" : "OO:recv",
                                   send ? kws : kwr, &tensor, &peer))
    return NULL;
  int p;
  if (tcpy_int(peer, send ? "BatchSendRecv.send" : "BatchSendRecv.recv",
               send ? "dst" : "src", &p) < 0)
    return NULL;
  PyObject *op = tcpy_p2p_make(&TcPy_P2POp_Type, tcpy_p2p_members[send ? 0 : 1],
                               tensor, p);
  if (!op) return NULL;
  int rc = PyList_Append(self->ops, op);
  Py_DECREF(op);
  if (rc < 0) return NULL;
  Py_RETURN_NONE;
}

static PyObject *tcpy_batch_send(BatchSendRecvObject *self, PyObject *args,
                                 PyObject *kw) {
  return tcpy_batch_post(self, args, kw, 1);
}

static PyObject *tcpy_batch_recv(BatchSendRecvObject *self, PyObject *args,
                                 PyObject *kw) {
  return tcpy_batch_post(self, args, kw, 0);
}

static PyObject *tcpy_batch_issue(BatchSendRecvObject *self,
                                  PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames) {
  static const char *fn = "batch_op_issue";
  static const char *const kwlist[] = {"async_op", "options", "hints",
                                       "timeout", NULL};
  static tcpy_params_t P = TCPY_PARAMS("issue", kwlist, 0);
  PyObject *a[4];
  int async_op;
  if (tcpy_parse(&P, args, nargs, kwnames, a) < 0 ||
      tcpy_flag(a[0], 0, &async_op) < 0)
    return NULL;
  PyObject *options = a[1] ? a[1] : Py_None, *hints = a[2] ? a[2] : Py_None,
           *timeout = a[3] ? a[3] : Py_None;
  TorchCommObject *comm = self->comm;
  if (tcpy_comm_live(comm, fn) < 0) return NULL;
  PyObject *hints_ref = NULL, *timeout_ref = NULL, *result = NULL;
  if (options != Py_None) {
    if (!(timeout_ref = PyObject_GetAttr(options, tcpy_str.timeout)) ||
        !(hints_ref = PyObject_GetAttr(options, tcpy_str.hints))) {
      Py_XDECREF(timeout_ref);
      return NULL;
    }
    if (hints == Py_None) hints = hints_ref;
    if (timeout == Py_None) timeout = timeout_ref;
  }
  PyObject *ops = PySequence_Tuple(self->ops);
  tc_batch_t *batch = NULL;
  tcpy_batch_ent_t few[8], *ent = few;
  if (!ops) goto out;
  tcpy_opts_t opts;
  if (tcpy_opts_init(&opts, fn, hints, timeout) < 0) goto out;
  int rc;
  Py_ssize_t n = PyTuple_GET_SIZE(ops);
  if (n > 8 && !(ent = PyMem_Calloc((size_t)n, sizeof *ent))) {
    PyErr_NoMemory();
    goto out_opts;
  }
  /* an asynchronous issue keeps the tensors alive with its TorchWork (a
   * P2POp's tensor may be replaced meanwhile); a synchronous one is over
   * when it returns */
  PyObject *refs = async_op ? PyTuple_New(n) : NULL;
  if (async_op && !refs) goto out_opts;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *o = PyTuple_GET_ITEM(ops, i);
    if (!PyObject_TypeCheck(o, &TcPy_P2POp_Type)) {
      PyErr_Format(PyExc_TypeError, "%s: ops[%zd] must be a P2POp, not "
                   "%.100s", fn, i, Py_TYPE(o)->tp_name);
      goto out_refs;
    }
    P2POpObject *p = (P2POpObject *)o;
    tcpy_tensor_t t;
    if (tcpy_tensor(&comm->dev, fn, "ops", i, p->tensor, &t) < 0)
      goto out_refs;
    if (refs) PyTuple_SET_ITEM(refs, i, Py_NewRef(p->tensor));
    /* compared with memcmp: the struct has no implicit padding */
    ent[i] = (tcpy_batch_ent_t){.ptr = t.ptr, .numel = t.numel, .dtype = (int32_t)t.dtype,
                                .peer = p->peer, .send = p->type == tcpy_p2p_members[0]};
  }
  /* the kept C batch when every op is as it was (an issue on another
   * thread holds it meanwhile: this one then makes its own) */
  if (self->cbatch && self->cn == n &&
      !memcmp(self->cent, ent, (size_t)n * sizeof *ent)) {
    batch = self->cbatch;
    self->cbatch = NULL;
  } else {
    rc = tc_batch_create(comm->comm, &batch);
    if (rc != TC_OK) {
      tcpy_raise(rc, tc_last_error());
      goto out_refs;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
      tcpy_batch_ent_t *e = &ent[i];
      rc = e->send ? tc_batch_send(batch, e->ptr, e->numel, (tc_dtype_t)e->dtype, e->peer)
                   : tc_batch_recv(batch, e->ptr, e->numel, (tc_dtype_t)e->dtype, e->peer);
      if (rc != TC_OK) {
        tcpy_raise(rc, tc_last_error());
        goto out_refs;
      }
    }
  }
  tcpy_call_t call = {.type = TC_OP_BATCH, .batch = batch};
  PyObject *pre = NULL;
  if (comm->hooked && comm->hooks[TCPY_HOOK_PRE] &&
      !(pre = tcpy_hook_args(TC_OP_BATCH, async_op, "i", (int)n)))
    goto out_refs;
  result = tcpy_issue_opts(comm, fn, &call, async_op, &opts, refs, pre);
  Py_XDECREF(pre);
  if (result && !self->cbatch) { /* keep it for the next issue */
    tcpy_batch_ent_t *keep = self->cent && self->cn == n
                                 ? self->cent
                                 : PyMem_Realloc(self->cent, (size_t)(n ? n : 1) * sizeof *keep);
    if (keep) {
      memcpy(keep, ent, (size_t)n * sizeof *keep);
      self->cent = keep;
      self->cn = n;
      self->cbatch = batch;
      batch = NULL;
    }
  }
out_refs:
  Py_XDECREF(refs);
out_opts:
  tcpy_opts_free(&opts);
out:
  if (ent != few) PyMem_Free(ent);
  if (batch) tc_batch_free(batch);
  Py_XDECREF(ops);
  Py_XDECREF(hints_ref);
  Py_XDECREF(timeout_ref);
  return result;
}

static PyObject *tcpy_batch_get_ops(BatchSendRecvObject *self, void *c) {
  return Py_NewRef(self->ops);
}

static int tcpy_batch_set_ops(BatchSendRecvObject *self, PyObject *v,
                              void *c) {
  if (!v || !PyList_Check(v)) {
    PyErr_SetString(PyExc_TypeError, "BatchSendRecv.ops must be a list");
    return -1;
  }
  Py_SETREF(self->ops, Py_NewRef(v));
  return 0;
}

static int tcpy_batch_traverse(BatchSendRecvObject *self, visitproc visit,
                               void *arg) {
  Py_VISIT(self->comm);
  Py_VISIT(self->ops);
  return 0;
}

static int tcpy_batch_clear(BatchSendRecvObject *self) {
  if (self->cbatch) tc_batch_free(self->cbatch); /* a handle: safe after its comm */
  self->cbatch = NULL;
  PyMem_Free(self->cent);
  self->cent = NULL;
  self->cn = 0;
  Py_CLEAR(self->comm);
  Py_CLEAR(self->ops);
  return 0;
}

static void tcpy_batch_dealloc(BatchSendRecvObject *self) {
  PyObject_GC_UnTrack(self);
  tcpy_batch_clear(self);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef tcpy_batch_methods[] = {
    {"send", (PyCFunction)(void (*)(void))tcpy_batch_send,
     METH_VARARGS | METH_KEYWORDS, "send(tensor, dst): posts a send."},
    {"recv", (PyCFunction)(void (*)(void))tcpy_batch_recv,
     METH_VARARGS | METH_KEYWORDS, "recv(tensor, src): posts a receive."},
    {"issue", (PyCFunction)(void (*)(void))tcpy_batch_issue,
     METH_FASTCALL | METH_KEYWORDS,
     "issue(async_op=False, options=None) -> TorchWork: issues every posted "
     "op as one operation (they complete in any order, without deadlock)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef tcpy_batch_getset[] = {
    {"ops", (getter)tcpy_batch_get_ops, (setter)tcpy_batch_set_ops,
     "the posted P2POps", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject TcPy_BatchSendRecv_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "torchcomms._comms.BatchSendRecv",
    .tp_basicsize = sizeof(BatchSendRecvObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Batched sends and receives (TorchComm.batch_op_create()).",
    .tp_dealloc = (destructor)tcpy_batch_dealloc,
    .tp_traverse = (traverseproc)tcpy_batch_traverse,
    .tp_clear = (inquiry)tcpy_batch_clear,
    .tp_methods = tcpy_batch_methods,
    .tp_getset = tcpy_batch_getset,
};

PyObject *tcpy_batch_new(TorchCommObject *comm) {
  BatchSendRecvObject *b =
      PyObject_GC_New(BatchSendRecvObject, &TcPy_BatchSendRecv_Type);
  if (!b) return NULL;
  b->cbatch = NULL;
  b->cent = NULL;
  b->cn = 0;
  b->comm = (TorchCommObject *)Py_NewRef((PyObject *)comm);
  b->ops = PyList_New(0);
  if (!b->ops) {
    Py_DECREF(b);
    return NULL;
  }
  PyObject_GC_Track(b);
  return (PyObject *)b;
}

/* ======================================================================== */

int tcpy_types_ready(PyObject *m) {
  PyTypeObject *types[] = {&TcPy_ReduceOp_Type, &TcPy_TorchWork_Type,
                           &TcPy_P2POp_Type, &TcPy_BatchSendRecv_Type,
                           &TcPy_TorchComm_Type, &TcPy_RemovableHandle_Type};
  const char *names[] = {"ReduceOp", "TorchWork", "P2POp", "BatchSendRecv",
                         "TorchComm", "RemovableHandle"};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    if (PyType_Ready(types[i]) < 0) return -1;
    if (PyModule_AddObjectRef(m, names[i], (PyObject *)types[i]) < 0) return -1;
  }
  if (!(tcpy_done_work = tcpy_work_new(NULL, NULL))) return -1;
  /* TorchComm's operations (_comms_ops.c) and hook methods
   * (_comms_hooks.c) join its own methods */
  PyMethodDef *tables[] = {tcpy_comm_op_methods, tcpy_comm_hook_methods,
                           tcpy_comm_mem_methods, tcpy_comm_backend_methods,
                           tcpy_comm_win_methods};
  for (size_t k = 0; k < sizeof tables / sizeof tables[0]; k++)
    for (PyMethodDef *d = tables[k]; d->ml_name; d++) {
      PyObject *descr = PyDescr_NewMethod(&TcPy_TorchComm_Type, d);
      if (!descr) return -1;
      int rc = PyDict_SetItemString(TcPy_TorchComm_Type.tp_dict, d->ml_name,
                                    descr);
      Py_DECREF(descr);
      if (rc < 0) return -1;
    }
  for (PyGetSetDef *g = tcpy_comm_mem_getset; g->name; g++) {
    PyObject *descr = PyDescr_NewGetSet(&TcPy_TorchComm_Type, g);
    if (!descr) return -1;
    int rc = PyDict_SetItemString(TcPy_TorchComm_Type.tp_dict, g->name, descr);
    Py_DECREF(descr);
    if (rc < 0) return -1;
  }
  PyType_Modified(&TcPy_TorchComm_Type);
  if (tcpy_mem_ready(m) < 0 || tcpy_win_ready_types(m) < 0) return -1;
  /* ReduceOp.SUM ... as class attributes */
  static const tc_redop_type_t plain[] = {TC_SUM,  TC_PRODUCT, TC_MIN,
                                          TC_MAX,  TC_BAND,    TC_BOR,
                                          TC_BXOR, TC_AVG};
  for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
    PyObject *op = tcpy_redop_make(TC_OP(plain[i]));
    if (!op) return -1;
    int rc = PyDict_SetItemString(TcPy_ReduceOp_Type.tp_dict,
                                  tcpy_redop_names[plain[i]], op);
    Py_DECREF(op);
    if (rc < 0) return -1;
  }
  PyType_Modified(&TcPy_ReduceOp_Type);
  return 0;
}

/* _comms_ops.c -- TorchComm's operations: argument parsing (torchcomms'
 * names, order and defaults), checks that name the operation and the
 * argument, then one tcpy_issue call. Counts passed to the library are in
 * elements; all_to_all_v_single's split sizes are rows of dim 0. */
#include "_comms.h"

#include <stdio.h>

/* A tuple of the objects an async operation must keep alive, or NULL (no
 * error) for a synchronous one. Returns -1 on error. */
static int tcpy_refs(int async_op, PyObject **out, Py_ssize_t n, ...) {
  *out = NULL;
  if (!async_op) return 0;
  PyObject *t = PyTuple_New(n);
  if (!t) return -1;
  va_list ap;
  va_start(ap, n);
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *o = va_arg(ap, PyObject *);
    PyTuple_SET_ITEM(t, i, Py_NewRef(o ? o : Py_None));
  }
  va_end(ap);
  *out = t;
  return 0;
}

static int tcpy_same_dtype(const char *fn, const char *a, tc_dtype_t da,
                           const char *b, tc_dtype_t db) {
  if (da == db) return 0;
  PyErr_Format(PyExc_ValueError, "%s: argument '%s' has dtype %s but argument "
               "'%s' has dtype %s (they must match)", fn, a,
               tcpy_dtype_name(da), b, tcpy_dtype_name(db));
  return -1;
}

static int tcpy_check_redop(const char *fn, tc_dtype_t dt, tc_redop_t op) {
  if (tc_redop_supported(dt, op.type)) return 0;
  int bitwise = op.type == TC_BAND || op.type == TC_BOR || op.type == TC_BXOR;
  PyErr_Format(PyExc_TypeError, "%s: reduction %s (argument 'op') is not "
               "defined for dtype %s%s", fn, tc_redop_name(op.type),
               tcpy_dtype_name(dt),
               bitwise ? " (bitwise reductions take integer or bool tensors)"
               : op.type == TC_PREMUL_SUM ? " (PREMUL_SUM takes floating point "
                                            "tensors)" : "");
  return -1;
}

static int tcpy_numel_is(const char *fn, const char *a, Py_ssize_t ai,
                         size_t na, const char *b, size_t nb,
                         const char *what) {
  if (na == nb) return 0;
  char an[96];
  if (ai >= 0) snprintf(an, sizeof an, "%s[%zd]", a, ai);
  else snprintf(an, sizeof an, "%s", a);
  PyErr_Format(PyExc_ValueError, "%s: argument '%s' has %zu elements but %s "
               "%zu (%s)", fn, an, na, b, nb, what);
  return -1;
}

#define TCPY_SIZE(self) ((size_t)tc_comm_size((self)->comm))
#define TCPY_RANK(self) (tc_comm_rank((self)->comm))

/* Every operation is METH_FASTCALL | METH_KEYWORDS (tcpy_parse): no argument
 * tuple, no format string to interpret on the per-call path. */
#define TCPY_ARGS PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames
#define TCPY_FWD args, nargs, kwnames

/* Parses an operation's arguments into a[]; its last three parameters are
 * async_op, hints and timeout (defaults False, None, None). 0 or -1. */
static int tcpy_op_args(tcpy_params_t *p, TCPY_ARGS, PyObject **a,
                        int *async_op, PyObject **hints, PyObject **timeout) {
  if (tcpy_parse(p, args, nargs, kwnames, a) < 0) return -1;
  int i = p->n - 3;
  *hints = a[i + 1] ? a[i + 1] : Py_None;
  *timeout = a[i + 2] ? a[i + 2] : Py_None;
  return tcpy_flag(a[i], 0, async_op);
}

/* The tail of every operation: issue, drop our temporaries. `fmt` and what
 * follows are the fields of the pre hooks' argument object before async_op
 * (tcpy_hook_args: 'O' object, 'L' list, 'i' int), read only while a pre
 * hook is registered. */
static PyObject *tcpy_finish(TorchCommObject *self, const char *fn,
                             tcpy_call_t *c, int async_op, PyObject *hints,
                             PyObject *timeout, PyObject *refs,
                             const char *fmt, ...) {
  PyObject *pre = NULL, *r = NULL;
  if (self->hooked && self->hooks[TCPY_HOOK_PRE]) {
    va_list ap;
    va_start(ap, fmt);
    pre = tcpy_hook_args_v((int)c->type, async_op, fmt, ap);
    va_end(ap);
    if (!pre) goto out;
  }
  r = tcpy_issue(self, fn, c, async_op, hints, timeout, refs, pre);
out:
  Py_XDECREF(pre);
  Py_XDECREF(refs);
  Py_CLEAR(c->pyargs);
  return r;
}

/* A Python backend's arguments (Py_BuildValue format and values) into
 * c.pyargs; true on failure (an exception is set). */
#define TCPY_PYARGS(self, c, ...)                                              \
  ((self)->pyb && !((c).pyargs = Py_BuildValue(__VA_ARGS__)))

/* ---- point to point, broadcast, reductions ---- */

static PyObject *tcpy_p2p(TorchCommObject *self, TCPY_ARGS, int send) {
  const char *fn = send ? "send" : "recv";
  static const char *const kws[] = {"tensor", "dst", "async_op", "hints",
                                    "timeout", NULL};
  static const char *const kwr[] = {"tensor", "src", "async_op", "hints",
                                    "timeout", NULL};
  static tcpy_params_t ps = TCPY_PARAMS("send", kws, 2), pr = TCPY_PARAMS("recv", kwr, 2);
  PyObject *a[5], *hints, *timeout, *refs;
  int async_op, p;
  if (tcpy_op_args(send ? &ps : &pr, TCPY_FWD, a, &async_op, &hints,
                   &timeout) < 0)
    return NULL;
  PyObject *tensor = a[0], *peer = a[1];
  tcpy_tensor_t t;
  if (tcpy_comm_live(self, fn) < 0 ||
      tcpy_tensor(&self->dev, fn, "tensor", -1, tensor, &t) < 0 ||
      tcpy_int(peer, fn, send ? "dst" : "src", &p) < 0 ||
      tcpy_refs(async_op, &refs, 1, tensor) < 0)
    return NULL;
  tcpy_call_t c = {.type = send ? TC_OP_SEND : TC_OP_RECV, .count = t.numel,
                   .dtype = t.dtype, .root = p};
  if (send) c.sendbuf = t.ptr;
  else c.recvbuf = t.ptr;
  if (TCPY_PYARGS(self, c, "(Oi)", tensor, p)) {
    Py_XDECREF(refs);
    return NULL;
  }
  return tcpy_finish(self, fn, &c, async_op, hints, timeout, refs, "Oi", tensor,
                     p);
}

static PyObject *tcpy_op_send(TorchCommObject *self, TCPY_ARGS) {
  return tcpy_p2p(self, TCPY_FWD, 1);
}

static PyObject *tcpy_op_recv(TorchCommObject *self, TCPY_ARGS) {
  return tcpy_p2p(self, TCPY_FWD, 0);
}

static PyObject *tcpy_op_broadcast(TorchCommObject *self, TCPY_ARGS) {
  static const char *fn = "broadcast";
  static const char *const kwlist[] = {"tensor", "root", "async_op", "hints",
                                       "timeout", NULL};
  static tcpy_params_t P = TCPY_PARAMS("broadcast", kwlist, 2);
  PyObject *a[5], *hints, *timeout, *refs;
  int async_op, r;
  if (tcpy_op_args(&P, TCPY_FWD, a, &async_op, &hints, &timeout) < 0)
    return NULL;
  PyObject *tensor = a[0], *root = a[1];
  tcpy_tensor_t t;
  if (tcpy_comm_live(self, fn) < 0 ||
      tcpy_tensor(&self->dev, fn, "tensor", -1, tensor, &t) < 0 ||
      tcpy_int(root, fn, "root", &r) < 0 ||
      tcpy_refs(async_op, &refs, 1, tensor) < 0)
    return NULL;
  tcpy_call_t c = {.type = TC_OP_BROADCAST, .recvbuf = t.ptr, .count = t.numel,
                   .dtype = t.dtype, .root = r};
  if (TCPY_PYARGS(self, c, "(Oi)", tensor, r)) {
    Py_XDECREF(refs);
    return NULL;
  }
  return tcpy_finish(self, fn, &c, async_op, hints, timeout, refs, "Oi", tensor,
                     r);
}

static PyObject *tcpy_op_all_reduce(TorchCommObject *self, TCPY_ARGS) {
  static const char *fn = "all_reduce";
  static const char *const kwlist[] = {"tensor", "op", "async_op", "hints",
                                       "timeout", NULL};
  static tcpy_params_t P = TCPY_PARAMS("all_reduce", kwlist, 1);
  PyObject *a[5], *hints, *timeout, *refs;
  int async_op;
  if (tcpy_op_args(&P, TCPY_FWD, a, &async_op, &hints, &timeout) < 0)
    return NULL;
  PyObject *tensor = a[0], *op = a[1] ? a[1] : Py_None;
  tcpy_tensor_t t;
  tc_redop_t rop;
  if (tcpy_comm_live(self, fn) < 0 ||
      tcpy_tensor(&self->dev, fn, "tensor", -1, tensor, &t) < 0 ||
      tcpy_redop(op, fn, &rop) < 0 || tcpy_check_redop(fn, t.dtype, rop) < 0 ||
      tcpy_refs(async_op, &refs, 1, tensor) < 0)
    return NULL;
  tcpy_call_t c = {.type = TC_OP_ALL_REDUCE, .recvbuf = t.ptr, .count = t.numel,
                   .dtype = t.dtype, .op = rop};
  if (TCPY_PYARGS(self, c, "(ON)", tensor, tcpy_redop_make(rop))) {
    Py_XDECREF(refs);
    return NULL;
  }
  return tcpy_finish(self, fn, &c, async_op, hints, timeout, refs, "O", tensor);
}

static PyObject *tcpy_op_reduce(TorchCommObject *self, TCPY_ARGS) {
  static const char *fn = "reduce";
  static const char *const kwlist[] = {"tensor", "root", "op", "async_op",
                                       "hints", "timeout", NULL};
  static tcpy_params_t P = TCPY_PARAMS("reduce", kwlist, 2);
  PyObject *a[6], *hints, *timeout, *refs;
  int async_op, r;
  if (tcpy_op_args(&P, TCPY_FWD, a, &async_op, &hints, &timeout) < 0)
    return NULL;
  PyObject *tensor = a[0], *root = a[1], *op = a[2] ? a[2] : Py_None;
  tcpy_tensor_t t;
  tc_redop_t rop;
  if (tcpy_comm_live(self, fn) < 0 ||
      tcpy_tensor(&self->dev, fn, "tensor", -1, tensor, &t) < 0 ||
      tcpy_int(root, fn, "root", &r) < 0 || tcpy_redop(op, fn, &rop) < 0 ||
      tcpy_check_redop(fn, t.dtype, rop) < 0 ||
      tcpy_refs(async_op, &refs, 1, tensor) < 0)
    return NULL;
  tcpy_call_t c = {.type = TC_OP_REDUCE, .recvbuf = t.ptr, .count = t.numel,
                   .dtype = t.dtype, .op = rop, .root = r};
  if (TCPY_PYARGS(self, c, "(OiN)", tensor, r, tcpy_redop_make(rop))) {
    Py_XDECREF(refs);
    return NULL;
  }
  return tcpy_finish(self, fn, &c, async_op, hints, timeout, refs, "Oi", tensor,
                     r);
}

/* ---- gathers ---- */

/* all_gather (v = 0) and all_gather_v (v = 1). */
static PyObject *tcpy_gather_list(TorchCommObject *self, TCPY_ARGS, int v) {
  const char *fn = v ? "all_gather_v" : "all_gather";
  static const char *const kwlist[] = {"tensor_list", "tensor", "async_op",
                                       "hints", "timeout", NULL};
  static tcpy_params_t P0 = TCPY_PARAMS("all_gather", kwlist, 2),
                       P1 = TCPY_PARAMS("all_gather_v", kwlist, 2);
  PyObject *a[5], *hints, *timeout, *seq = NULL, *refs = NULL, *res = NULL;
  int async_op;
  if (tcpy_op_args(v ? &P1 : &P0, TCPY_FWD, a, &async_op, &hints,
                   &timeout) < 0)
    return NULL;
  PyObject *list = a[0], *tensor = a[1];
  tcpy_tensor_t t;
  if (tcpy_comm_live(self, fn) < 0 ||
      tcpy_tensor(&self->dev, fn, "tensor", -1, tensor, &t) < 0)
    return NULL;
  void **ptrs;
  size_t *counts, n = TCPY_SIZE(self);
  tc_dtype_t dt = t.dtype;
  if (tcpy_tensor_list(&self->dev, fn, "tensor_list", list, (Py_ssize_t)n,
                       &ptrs, &counts, &dt, &seq) < 0)
    return NULL;
  if (tcpy_same_dtype(fn, "tensor_list", dt, "tensor", t.dtype) < 0) goto out;
  for (size_t i = 0; i < n; i++) {
    if (v && i != (size_t)TCPY_RANK(self)) continue;
    if (tcpy_numel_is(fn, "tensor_list", (Py_ssize_t)i, counts[i],
                      "argument 'tensor' has", t.numel,
                      v ? "this rank's entry must match its input"
                        : "every entry must match the input") < 0)
      goto out;
  }
  if (tcpy_refs(async_op, &refs, 2, seq, tensor) < 0) goto out;
  tcpy_call_t c = {.type = v ? TC_OP_ALL_GATHER_V : TC_OP_ALL_GATHER,
                   .recvbufs = ptrs, .recvcounts = v ? counts : NULL,
                   .sendbuf = t.ptr, .count = t.numel, .dtype = t.dtype};
  if (TCPY_PYARGS(self, c, "(OO)", list, tensor)) {
    Py_XDECREF(refs);
    goto out;
  }
  res = tcpy_finish(self, fn, &c, async_op, hints, timeout, refs, "OL", tensor,
                    list);
out:
  PyMem_Free(ptrs);
  PyMem_Free(counts);
  Py_XDECREF(seq);
  return res;
}

static PyObject *tcpy_op_all_gather(TorchCommObject *s, TCPY_ARGS) {
  return tcpy_gather_list(s, TCPY_FWD, 0);
}

static PyObject *tcpy_op_all_gather_v(TorchCommObject *s, TCPY_ARGS) {
  return tcpy_gather_list(s, TCPY_FWD, 1);
}

/* Two-tensor operations: output, input (+ op). */
static PyObject *tcpy_pair(TorchCommObject *self, TCPY_ARGS,
                           tc_op_type_t kind) {
  const char *fn;
  switch (kind) {
  case TC_OP_ALL_GATHER_SINGLE: fn = "all_gather_single"; break;
  case TC_OP_REDUCE_SCATTER_SINGLE: fn = "reduce_scatter_single"; break;
  default: fn = "all_to_all_single"; break;
  }
  int with_op = kind == TC_OP_REDUCE_SCATTER_SINGLE;
  static const char *const kw2[] = {"output", "input", "async_op", "hints",
                                    "timeout", NULL};
  static const char *const kw3[] = {"output", "input", "op", "async_op",
                                    "hints", "timeout", NULL};
  static tcpy_params_t pag = TCPY_PARAMS("all_gather_single", kw2, 2),
                       prs = TCPY_PARAMS("reduce_scatter_single", kw3, 2),
                       pa2a = TCPY_PARAMS("all_to_all_single", kw2, 2);
  PyObject *a[6], *hints, *timeout, *refs;
  int async_op;
  if (tcpy_op_args(with_op ? &prs
                   : kind == TC_OP_ALL_GATHER_SINGLE ? &pag : &pa2a,
                   TCPY_FWD, a, &async_op, &hints, &timeout) < 0)
    return NULL;
  PyObject *out = a[0], *in = a[1],
           *op = with_op && a[2] ? a[2] : Py_None;
  tcpy_tensor_t o, i;
  tc_redop_t rop = TC_OP(TC_SUM);
  if (tcpy_comm_live(self, fn) < 0 ||
      tcpy_tensor(&self->dev, fn, "output", -1, out, &o) < 0 ||
      tcpy_tensor(&self->dev, fn, "input", -1, in, &i) < 0 ||
      tcpy_same_dtype(fn, "output", o.dtype, "input", i.dtype) < 0)
    return NULL;
  if (with_op && (tcpy_redop(op, fn, &rop) < 0 ||
                  tcpy_check_redop(fn, o.dtype, rop) < 0))
    return NULL;
  size_t n = TCPY_SIZE(self), count;
  if (kind == TC_OP_ALL_GATHER_SINGLE) {
    if (tcpy_numel_is(fn, "output", -1, o.numel, "world size x input has",
                      n * i.numel, "output holds one input per rank") < 0)
      return NULL;
    count = i.numel;
  } else if (kind == TC_OP_REDUCE_SCATTER_SINGLE) {
    if (tcpy_numel_is(fn, "input", -1, i.numel, "world size x output has",
                      n * o.numel, "input holds one output per rank") < 0)
      return NULL;
    count = o.numel;
  } else {
    if (tcpy_numel_is(fn, "output", -1, o.numel, "argument 'input' has",
                      i.numel, "they must match") < 0)
      return NULL;
    if (i.numel % n) {
      PyErr_Format(PyExc_ValueError, "%s: argument 'input' has %zu elements, "
                   "not a multiple of the world size %zu", fn, i.numel, n);
      return NULL;
    }
    count = i.numel / n;
  }
  if (tcpy_refs(async_op, &refs, 2, out, in) < 0) return NULL;
  tcpy_call_t c = {.type = kind, .recvbuf = o.ptr, .sendbuf = i.ptr,
                   .count = count, .dtype = o.dtype, .op = rop};
  if (with_op ? TCPY_PYARGS(self, c, "(OON)", out, in, tcpy_redop_make(rop))
              : TCPY_PYARGS(self, c, "(OO)", out, in)) {
    Py_XDECREF(refs);
    return NULL;
  }
  return tcpy_finish(self, fn, &c, async_op, hints, timeout, refs, "OO", in,
                     out);
}

static PyObject *tcpy_op_all_gather_single(TorchCommObject *s, TCPY_ARGS) {
  return tcpy_pair(s, TCPY_FWD, TC_OP_ALL_GATHER_SINGLE);
}

static PyObject *tcpy_op_reduce_scatter_single(TorchCommObject *s, TCPY_ARGS) {
  return tcpy_pair(s, TCPY_FWD, TC_OP_REDUCE_SCATTER_SINGLE);
}

static PyObject *tcpy_op_all_to_all_single(TorchCommObject *s, TCPY_ARGS) {
  return tcpy_pair(s, TCPY_FWD, TC_OP_ALL_TO_ALL_SINGLE);
}

/* reduce_scatter (v = 0) and reduce_scatter_v (v = 1). */
static PyObject *tcpy_scatter_list(TorchCommObject *self, TCPY_ARGS, int v) {
  const char *fn = v ? "reduce_scatter_v" : "reduce_scatter";
  static const char *const kwlist[] = {"output", "input_list", "op",
                                       "async_op", "hints", "timeout", NULL};
  static tcpy_params_t P0 = TCPY_PARAMS("reduce_scatter", kwlist, 2),
                       P1 = TCPY_PARAMS("reduce_scatter_v", kwlist, 2);
  PyObject *a[6], *hints, *timeout, *seq = NULL, *refs = NULL, *res = NULL;
  int async_op;
  if (tcpy_op_args(v ? &P1 : &P0, TCPY_FWD, a, &async_op, &hints,
                   &timeout) < 0)
    return NULL;
  PyObject *out = a[0], *list = a[1], *op = a[2] ? a[2] : Py_None;
  tcpy_tensor_t o;
  tc_redop_t rop;
  if (tcpy_comm_live(self, fn) < 0 ||
      tcpy_tensor(&self->dev, fn, "output", -1, out, &o) < 0 ||
      tcpy_redop(op, fn, &rop) < 0 || tcpy_check_redop(fn, o.dtype, rop) < 0)
    return NULL;
  void **ptrs;
  size_t *counts, n = TCPY_SIZE(self);
  tc_dtype_t dt = o.dtype;
  if (tcpy_tensor_list(&self->dev, fn, "input_list", list, (Py_ssize_t)n,
                       &ptrs, &counts, &dt, &seq) < 0)
    return NULL;
  if (tcpy_same_dtype(fn, "input_list", dt, "output", o.dtype) < 0) goto out;
  for (size_t i = 0; i < n; i++) {
    if (v && i != (size_t)TCPY_RANK(self)) continue;
    if (tcpy_numel_is(fn, "input_list", (Py_ssize_t)i, counts[i],
                      "argument 'output' has", o.numel,
                      v ? "this rank's entry must match its output"
                        : "every entry must match the output") < 0)
      goto out;
  }
  if (tcpy_refs(async_op, &refs, 2, out, seq) < 0) goto out;
  tcpy_call_t c = {.type = v ? TC_OP_REDUCE_SCATTER_V : TC_OP_REDUCE_SCATTER,
                   .recvbuf = o.ptr, .sendbufs = ptrs,
                   .sendcounts = v ? counts : NULL, .count = o.numel,
                   .recvcount = o.numel, .dtype = o.dtype, .op = rop};
  if (TCPY_PYARGS(self, c, "(OON)", out, list, tcpy_redop_make(rop))) {
    Py_XDECREF(refs);
    goto out;
  }
  res = tcpy_finish(self, fn, &c, async_op, hints, timeout, refs, "LO", list,
                    out);
out:
  PyMem_Free(ptrs);
  PyMem_Free(counts);
  Py_XDECREF(seq);
  return res;
}

static PyObject *tcpy_op_reduce_scatter(TorchCommObject *s, TCPY_ARGS) {
  return tcpy_scatter_list(s, TCPY_FWD, 0);
}

static PyObject *tcpy_op_reduce_scatter_v(TorchCommObject *s, TCPY_ARGS) {
  return tcpy_scatter_list(s, TCPY_FWD, 1);
}

/* ---- all to all ---- */

/* Split sizes (rows) -> element counts; [] means equal splits. */
static int tcpy_splits(const char *fn, const char *arg, PyObject *obj,
                       size_t n, size_t rows, size_t row, size_t *counts) {
  if (!PyList_Check(obj) && !PyTuple_Check(obj)) {
    PyErr_Format(PyExc_TypeError, "%s: argument '%s' must be a list of ints, "
                 "not %.100s", fn, arg, Py_TYPE(obj)->tp_name);
    return -1;
  }
  Py_ssize_t m = PySequence_Size(obj);
  if (m < 0) return -1;
  if (m == 0) {
    if (rows % n) {
      PyErr_Format(PyExc_ValueError, "%s: argument '%s' is empty (equal "
                   "splits) but %zu rows do not divide among %zu ranks", fn,
                   arg, rows, n);
      return -1;
    }
    for (size_t i = 0; i < n; i++) counts[i] = rows / n * row;
    return 0;
  }
  if ((size_t)m != n) {
    PyErr_Format(PyExc_ValueError, "%s: argument '%s' has %zd entries but the "
                 "communicator has %zu ranks", fn, arg, m, n);
    return -1;
  }
  size_t total = 0;
  for (Py_ssize_t i = 0; i < m; i++) {
    PyObject *it = PySequence_GetItem(obj, i);
    if (!it) return -1;
    Py_ssize_t s = -2;
    if (PyLong_Check(it) || PyIndex_Check(it)) s = PyNumber_AsSsize_t(it, NULL);
    Py_DECREF(it);
    if (s == -1 && PyErr_Occurred()) return -1;
    if (s < 0) {
      PyErr_Format(PyExc_ValueError, "%s: argument '%s[%zd]' must be a "
                   "non-negative int", fn, arg, i);
      return -1;
    }
    if ((size_t)s > rows) {
      PyErr_Format(PyExc_ValueError, "%s: argument '%s[%zd]' = %zd exceeds the "
                   "tensor's %zu rows (dim 0)", fn, arg, i, s, rows);
      return -1;
    }
    counts[i] = (size_t)s * row;
    total += (size_t)s;
  }
  if (total != rows) {
    PyErr_Format(PyExc_ValueError, "%s: argument '%s' sums to %zu rows but the "
                 "tensor has %zu rows (dim 0)", fn, arg, total, rows);
    return -1;
  }
  return 0;
}

static PyObject *tcpy_op_all_to_all_v_single(TorchCommObject *self,
                                             TCPY_ARGS) {
  static const char *fn = "all_to_all_v_single";
  static const char *const kwlist[] = {"output", "input", "output_split_sizes",
                                       "input_split_sizes", "async_op",
                                       "hints", "timeout", NULL};
  static tcpy_params_t P = TCPY_PARAMS("all_to_all_v_single", kwlist, 4);
  PyObject *a[7], *hints, *timeout, *refs;
  int async_op;
  if (tcpy_op_args(&P, TCPY_FWD, a, &async_op, &hints, &timeout) < 0)
    return NULL;
  PyObject *out = a[0], *in = a[1], *osp = a[2], *isp = a[3];
  tcpy_tensor_t o, i;
  size_t orows, orow, irows, irow;
  if (tcpy_comm_live(self, fn) < 0 ||
      tcpy_tensor(&self->dev, fn, "output", -1, out, &o) < 0 ||
      tcpy_tensor(&self->dev, fn, "input", -1, in, &i) < 0 ||
      tcpy_same_dtype(fn, "output", o.dtype, "input", i.dtype) < 0 ||
      tcpy_row_elems(fn, "output", out, &orows, &orow) < 0 ||
      tcpy_row_elems(fn, "input", in, &irows, &irow) < 0)
    return NULL;
  if (orow != irow) {
    PyErr_Format(PyExc_ValueError, "%s: rows of argument 'output' have %zu "
                 "elements but rows of argument 'input' have %zu (dims after "
                 "the first must match)", fn, orow, irow);
    return NULL;
  }
  size_t n = TCPY_SIZE(self);
  size_t *rc = PyMem_New(size_t, 2 * n);
  if (!rc) return PyErr_NoMemory();
  PyObject *res = NULL;
  if (tcpy_splits(fn, "output_split_sizes", osp, n, orows, orow, rc) < 0 ||
      tcpy_splits(fn, "input_split_sizes", isp, n, irows, irow, rc + n) < 0 ||
      tcpy_refs(async_op, &refs, 2, out, in) < 0)
    goto out;
  tcpy_call_t c = {.type = TC_OP_ALL_TO_ALL_V_SINGLE, .recvbuf = o.ptr,
                   .recvcounts = rc, .sendbuf = i.ptr, .sendcounts = rc + n,
                   .dtype = o.dtype};
  if (TCPY_PYARGS(self, c, "(OOOO)", out, in, osp, isp)) {
    Py_XDECREF(refs);
    goto out;
  }
  res = tcpy_finish(self, fn, &c, async_op, hints, timeout, refs, "OOLL", in,
                    out, isp, osp);
out:
  PyMem_Free(rc);
  return res;
}

static PyObject *tcpy_op_all_to_all(TorchCommObject *self, TCPY_ARGS) {
  static const char *fn = "all_to_all";
  static const char *const kwlist[] = {"output_tensor_list",
                                       "input_tensor_list", "async_op",
                                       "hints", "timeout", NULL};
  static tcpy_params_t P = TCPY_PARAMS("all_to_all", kwlist, 2);
  PyObject *a[5], *hints, *timeout, *oseq = NULL, *iseq = NULL, *refs = NULL,
                  *res = NULL;
  int async_op;
  if (tcpy_op_args(&P, TCPY_FWD, a, &async_op, &hints, &timeout) < 0)
    return NULL;
  PyObject *ol = a[0], *il = a[1];
  if (tcpy_comm_live(self, fn) < 0) return NULL;
  void **optr = NULL, **iptr = NULL;
  size_t *ocnt = NULL, *icnt = NULL, n = TCPY_SIZE(self);
  tc_dtype_t odt = TC_FLOAT32, idt = TC_FLOAT32;
  if (tcpy_tensor_list(&self->dev, fn, "output_tensor_list", ol, (Py_ssize_t)n,
                       &optr, &ocnt, &odt, &oseq) < 0 ||
      tcpy_tensor_list(&self->dev, fn, "input_tensor_list", il, (Py_ssize_t)n,
                       &iptr, &icnt, &idt, &iseq) < 0 ||
      tcpy_same_dtype(fn, "output_tensor_list", odt, "input_tensor_list",
                      idt) < 0 ||
      tcpy_refs(async_op, &refs, 2, oseq, iseq) < 0)
    goto out;
  tcpy_call_t c = {.type = TC_OP_ALL_TO_ALL, .recvbufs = optr,
                   .recvcounts = ocnt, .sendbufs = iptr, .sendcounts = icnt,
                   .dtype = odt};
  if (TCPY_PYARGS(self, c, "(OO)", ol, il)) {
    Py_XDECREF(refs);
    goto out;
  }
  res = tcpy_finish(self, fn, &c, async_op, hints, timeout, refs, "LL", il, ol);
out:
  PyMem_Free(optr);
  PyMem_Free(ocnt);
  PyMem_Free(iptr);
  PyMem_Free(icnt);
  Py_XDECREF(oseq);
  Py_XDECREF(iseq);
  return res;
}

static PyObject *tcpy_op_barrier(TorchCommObject *self, TCPY_ARGS) {
  static const char *const kwlist[] = {"async_op", "hints", "timeout", NULL};
  static tcpy_params_t P = TCPY_PARAMS("barrier", kwlist, 0);
  PyObject *a[3], *hints, *timeout;
  int async_op;
  if (tcpy_op_args(&P, TCPY_FWD, a, &async_op, &hints, &timeout) < 0)
    return NULL;
  tcpy_call_t c = {.type = TC_OP_BARRIER};
  if (TCPY_PYARGS(self, c, "()")) return NULL;
  return tcpy_finish(self, "barrier", &c, async_op, hints, timeout, NULL, "");
}

/* ---- rooted scatter / gather ---- */

/* scatter (gather = 0) and gather (gather = 1): the list matters at root. */
static PyObject *tcpy_rooted_list(TorchCommObject *self, TCPY_ARGS,
                                  int gather) {
  const char *fn = gather ? "gather" : "scatter";
  const char *larg = gather ? "output_tensor_list" : "input_tensor_list";
  const char *targ = gather ? "input_tensor" : "output_tensor";
  static const char *const kws[] = {"output_tensor", "input_tensor_list",
                                    "root", "async_op", "hints", "timeout",
                                    NULL};
  static const char *const kwg[] = {"output_tensor_list", "input_tensor",
                                    "root", "async_op", "hints", "timeout",
                                    NULL};
  static tcpy_params_t ps = TCPY_PARAMS("scatter", kws, 3), pg = TCPY_PARAMS("gather", kwg, 3);
  PyObject *a[6], *hints, *timeout, *seq = NULL, *refs = NULL, *res = NULL;
  int async_op, r;
  if (tcpy_op_args(gather ? &pg : &ps, TCPY_FWD, a, &async_op, &hints,
                   &timeout) < 0)
    return NULL;
  PyObject *a0 = a[0], *a1 = a[1], *root = a[2];
  PyObject *tensor = gather ? a1 : a0, *list = gather ? a0 : a1;
  tcpy_tensor_t t;
  if (tcpy_comm_live(self, fn) < 0 ||
      tcpy_tensor(&self->dev, fn, targ, -1, tensor, &t) < 0 ||
      tcpy_int(root, fn, "root", &r) < 0)
    return NULL;
  void **ptrs = NULL;
  size_t *counts = NULL, n = TCPY_SIZE(self);
  if (r == TCPY_RANK(self)) {
    tc_dtype_t dt = t.dtype;
    if (tcpy_tensor_list(&self->dev, fn, larg, list, (Py_ssize_t)n, &ptrs,
                         &counts, &dt, &seq) < 0 ||
        tcpy_same_dtype(fn, larg, dt, targ, t.dtype) < 0)
      goto out;
    char what[64];
    snprintf(what, sizeof what, "argument '%s' has", targ);
    for (size_t i = 0; i < n; i++)
      if (tcpy_numel_is(fn, larg, (Py_ssize_t)i, counts[i], what, t.numel,
                        "every entry must match") < 0)
        goto out;
  }
  if (tcpy_refs(async_op, &refs, 2, tensor, seq) < 0) goto out;
  tcpy_call_t c = {.type = gather ? TC_OP_GATHER : TC_OP_SCATTER,
                   .count = t.numel, .dtype = t.dtype, .root = r};
  if (gather) {
    c.sendbuf = t.ptr;
    c.recvbufs = ptrs;
  } else {
    c.recvbuf = t.ptr;
    c.sendbufs = ptrs;
  }
  /* torchcomms' order: scatter(output_tensor, input_tensor_list, root),
   * gather(output_tensor_list, input_tensor, root) */
  if (TCPY_PYARGS(self, c, "(OOi)", a0, a1, r)) {
    Py_XDECREF(refs);
    goto out;
  }
  /* gather: input tensor, output list; scatter: output tensor, input list */
  res = tcpy_finish(self, fn, &c, async_op, hints, timeout, refs, "OLi", tensor,
                    list, r);
out:
  PyMem_Free(ptrs);
  PyMem_Free(counts);
  Py_XDECREF(seq);
  return res;
}

static PyObject *tcpy_op_scatter(TorchCommObject *s, TCPY_ARGS) {
  return tcpy_rooted_list(s, TCPY_FWD, 0);
}

static PyObject *tcpy_op_gather(TorchCommObject *s, TCPY_ARGS) {
  return tcpy_rooted_list(s, TCPY_FWD, 1);
}

static PyObject *tcpy_op_gather_single(TorchCommObject *self, TCPY_ARGS) {
  static const char *fn = "gather_single";
  static const char *const kwlist[] = {"output", "input", "root", "async_op",
                                       "hints", "timeout", NULL};
  static tcpy_params_t P = TCPY_PARAMS("gather_single", kwlist, 3);
  PyObject *a[6], *hints, *timeout, *refs;
  int async_op, r;
  if (tcpy_op_args(&P, TCPY_FWD, a, &async_op, &hints, &timeout) < 0)
    return NULL;
  PyObject *out = a[0], *in = a[1], *root = a[2];
  tcpy_tensor_t i, o = {0};
  if (tcpy_comm_live(self, fn) < 0 ||
      tcpy_tensor(&self->dev, fn, "input", -1, in, &i) < 0 ||
      tcpy_int(root, fn, "root", &r) < 0)
    return NULL;
  size_t n = TCPY_SIZE(self);
  if (r == TCPY_RANK(self) &&
      (tcpy_tensor(&self->dev, fn, "output", -1, out, &o) < 0 ||
       tcpy_same_dtype(fn, "output", o.dtype, "input", i.dtype) < 0 ||
       tcpy_numel_is(fn, "output", -1, o.numel, "world size x input has",
                     n * i.numel, "root's output holds one input per rank") < 0))
    return NULL;
  if (tcpy_refs(async_op, &refs, 2, out, in) < 0) return NULL;
  tcpy_call_t c = {.type = TC_OP_GATHER_SINGLE, .recvbuf = o.ptr,
                   .sendbuf = i.ptr, .count = i.numel, .dtype = i.dtype,
                   .root = r};
  if (TCPY_PYARGS(self, c, "(OOi)", out, in, r)) {
    Py_XDECREF(refs);
    return NULL;
  }
  return tcpy_finish(self, fn, &c, async_op, hints, timeout, refs, "OOi", in,
                     out, r);
}

/* ---- the library call, run without the GIL ---- */

int tcpy_call_run(tc_comm_t *c, const tcpy_call_t *a, const tc_op_options_t *o,
                  tc_work_t **w) {
  switch (a->type) {
  case TC_OP_SEND:
    return tc_send(c, a->sendbuf, a->count, a->dtype, a->root, o, w);
  case TC_OP_RECV:
    return tc_recv(c, a->recvbuf, a->count, a->dtype, a->root, o, w);
  case TC_OP_BROADCAST:
    return tc_broadcast(c, a->recvbuf, a->count, a->dtype, a->root, o, w);
  case TC_OP_ALL_REDUCE:
    return tc_all_reduce(c, a->recvbuf, a->count, a->dtype, a->op, o, w);
  case TC_OP_REDUCE:
    return tc_reduce(c, a->recvbuf, a->count, a->dtype, a->op, a->root, o, w);
  case TC_OP_ALL_GATHER:
    return tc_all_gather(c, a->recvbufs, a->sendbuf, a->count, a->dtype, o, w);
  case TC_OP_ALL_GATHER_V:
    return tc_all_gather_v(c, a->recvbufs, a->recvcounts, a->sendbuf,
                           a->count, a->dtype, o, w);
  case TC_OP_ALL_GATHER_SINGLE:
    return tc_all_gather_single(c, a->recvbuf, a->sendbuf, a->count, a->dtype,
                                o, w);
  case TC_OP_REDUCE_SCATTER:
    return tc_reduce_scatter(c, a->recvbuf, (const void *const *)a->sendbufs,
                             a->count, a->dtype, a->op, o, w);
  case TC_OP_REDUCE_SCATTER_V:
    return tc_reduce_scatter_v(c, a->recvbuf, a->recvcount,
                               (const void *const *)a->sendbufs, a->sendcounts,
                               a->dtype, a->op, o, w);
  case TC_OP_REDUCE_SCATTER_SINGLE:
    return tc_reduce_scatter_single(c, a->recvbuf, a->sendbuf, a->count,
                                    a->dtype, a->op, o, w);
  case TC_OP_ALL_TO_ALL_SINGLE:
    return tc_all_to_all_single(c, a->recvbuf, a->sendbuf, a->count, a->dtype,
                                o, w);
  case TC_OP_ALL_TO_ALL_V_SINGLE:
    return tc_all_to_all_v_single(c, a->recvbuf, a->recvcounts, a->sendbuf,
                                  a->sendcounts, a->dtype, o, w);
  case TC_OP_ALL_TO_ALL:
    return tc_all_to_all(c, a->recvbufs, a->recvcounts,
                         (const void *const *)a->sendbufs, a->sendcounts,
                         a->dtype, o, w);
  case TC_OP_BARRIER:
    return tc_barrier(c, o, w);
  case TC_OP_SCATTER:
    return tc_scatter(c, a->recvbuf, (const void *const *)a->sendbufs,
                      a->count, a->dtype, a->root, o, w);
  case TC_OP_GATHER:
    return tc_gather(c, a->recvbufs, a->sendbuf, a->count, a->dtype, a->root,
                     o, w);
  case TC_OP_GATHER_SINGLE:
    return tc_gather_single(c, a->recvbuf, a->sendbuf, a->count, a->dtype,
                            a->root, o, w);
  case TC_OP_BATCH:
    return tc_batch_issue(a->batch, o, w);
  case TC_OP_TYPE_COUNT:
    break;
  }
  return TC_ERR_INTERNAL;
}

/* ---- the table (TorchComm's operations and their aliases) ---- */

static const char tcpy_doc_send[] =
    "send(tensor, dst, async_op=False, hints=None, timeout=None)";
static const char tcpy_doc_recv[] =
    "recv(tensor, src, async_op=False, hints=None, timeout=None)";
static const char tcpy_doc_broadcast[] =
    "broadcast(tensor, root, async_op=False, hints=None, timeout=None)";
static const char tcpy_doc_all_reduce[] =
    "all_reduce(tensor, op=ReduceOp.SUM, async_op=False, hints=None, "
    "timeout=None): in place over every rank.";
static const char tcpy_doc_reduce[] =
    "reduce(tensor, root, op=ReduceOp.SUM, async_op=False, ...): the "
    "result lands in root's tensor.";
static const char tcpy_doc_all_gather[] =
    "all_gather(tensor_list, tensor, async_op=False, ...)";
static const char tcpy_doc_all_gather_v[] =
    "all_gather_v(tensor_list, tensor, async_op=False, ...): entries "
    "may differ in size.";
static const char tcpy_doc_all_gather_single[] =
    "all_gather_single(output, input, async_op=False, ...)";
static const char tcpy_doc_reduce_scatter[] =
    "reduce_scatter(output, input_list, op=ReduceOp.SUM, "
    "async_op=False, ...)";
static const char tcpy_doc_reduce_scatter_v[] =
    "reduce_scatter_v(output, input_list, op=ReduceOp.SUM, "
    "async_op=False, ...): entries may differ in size.";
static const char tcpy_doc_reduce_scatter_single[] =
    "reduce_scatter_single(output, input, op=ReduceOp.SUM, "
    "async_op=False, ...)";
static const char tcpy_doc_all_to_all_single[] =
    "all_to_all_single(output, input, async_op=False, ...)";
static const char tcpy_doc_all_to_all_v_single[] =
    "all_to_all_v_single(output, input, output_split_sizes, "
    "input_split_sizes, async_op=False, ...): split sizes count rows "
    "of dim 0 ([] = equal splits).";
static const char tcpy_doc_all_to_all[] =
    "all_to_all(output_tensor_list, input_tensor_list, "
    "async_op=False, ...)";
static const char tcpy_doc_barrier[] =
    "barrier(async_op=False, hints=None, timeout=None)";
static const char tcpy_doc_scatter[] =
    "scatter(output_tensor, input_tensor_list, root, async_op=False, "
    "...): the list is read at root only.";
static const char tcpy_doc_gather[] =
    "gather(output_tensor_list, input_tensor, root, async_op=False, "
    "...): the list is written at root only.";
static const char tcpy_doc_gather_single[] =
    "gather_single(output, input, root, async_op=False, ...): output "
    "is used at root only.";

#define TCPY_OP(name, fn, doc)                                                 \
  {name, (PyCFunction)(void (*)(void))fn, METH_FASTCALL | METH_KEYWORDS, doc}
/* One method per operation of TC_COMM_OP_MAP: tcpy_op_<name> with its
 * tcpy_doc_<name> (a missing binding does not compile). */
#define TCPY_OP_METHOD(id, name, kind, flags) TCPY_OP(#name, tcpy_op_##name, tcpy_doc_##name),

PyMethodDef tcpy_comm_op_methods[] = {
    TC_COMM_OP_MAP(TCPY_OP_METHOD)
    /* aliases */
    TCPY_OP("allreduce", tcpy_op_all_reduce,
            "Alias of all_reduce."),
    TCPY_OP("allgather", tcpy_op_all_gather,
            "Alias of all_gather."),
    TCPY_OP("allgather_v", tcpy_op_all_gather_v,
            "Alias of all_gather_v."),
    TCPY_OP("allgather_single", tcpy_op_all_gather_single,
            "Alias of all_gather_single."),
    TCPY_OP("reducescatter", tcpy_op_reduce_scatter,
            "Alias of reduce_scatter."),
    TCPY_OP("reducescatter_v", tcpy_op_reduce_scatter_v,
            "Alias of reduce_scatter_v."),
    TCPY_OP("reducescatter_single", tcpy_op_reduce_scatter_single,
            "Alias of reduce_scatter_single."),
    TCPY_OP("alltoall", tcpy_op_all_to_all,
            "Alias of all_to_all."),
    TCPY_OP("alltoall_single", tcpy_op_all_to_all_single,
            "Alias of all_to_all_single."),
    TCPY_OP("alltoallv_single", tcpy_op_all_to_all_v_single,
            "Alias of all_to_all_v_single."),
    {NULL, NULL, 0, NULL},
};
#undef TCPY_OP_METHOD

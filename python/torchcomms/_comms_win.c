/* _comms_win.c -- one-sided windows from Python: TorchComm.new_window and
 * TorchCommWindow (torchcomms' API) over the C windows (tc_window_*).
 *
 *   win = comm.new_window()          (pre/post hooks: OpName.new_window)
 *   win.tensor_register(t)           collective
 *   win.put(src, dst_rank, target_offset_nelems, async_op, hints, timeout)
 *   win.signal(dst_rank, async_op, ...) / win.wait_signal(peer_rank, ...)
 *   win.map_remote_tensor(rank), win.get_attr(peer_rank)
 *   win.tensor_deregister()          collective
 * and ours (not in torchcomms): win.get(dst, src_rank,
 * source_offset_nelems, async_op, ...), win.flush(peer_rank=-1, ...).
 *
 * Memory: tensor_register(t) creates a C window whose memory the library
 * allocates (t.nbytes bytes; on one host shared memory the peers map),
 * copies t's values in, then re-homes t onto that memory
 * (t.set_(storage over the window, 0, t.size(), t.stride()) with autograd
 * off), so that the caller's own tensor object reads what peers put, as
 * with torchcomms' registered buffers. A barrier follows the copy, so no
 * peer's put can land before it. Tensors over window memory are made with
 * torch.frombuffer over a small buffer object (_WindowMemory) that holds
 * the mapping with tc_window_map_ref and drops it (tc_window_map_release)
 * when torch frees the storage: they stay valid after tensor_deregister
 * and after the communicator is gone.
 *
 * (_comms_winmem.c: that memory object, re-homing, and the windows dropped
 * while registered.)
 *
 * Errors are RuntimeError (as torchcomms' window raises), TypeError for an
 * argument of the wrong Python type, MemoryError when memory runs out. */
#include "_comms.h"

#include <stdio.h>
#include <string.h>

#define TCPY_WIN_ERRBUF 1024

/* ======================================================================== */
/* TorchCommWindow                                                           */
/* ======================================================================== */

typedef struct WindowObject {
  PyObject_HEAD
  TorchCommObject *comm; /* strong */
  tc_window_t *win;      /* NULL while no tensor is registered */
  PyObject *tensor;      /* the registered tensor (owning=True), or NULL */
  PyObject *dtype;       /* torch.dtype of the registered tensor, or NULL */
  PyObject *shape;       /* list of ints, or NULL */
  PyObject *device;      /* torch.device, or NULL */
  tc_dtype_t cdtype;
  size_t itemsize;
  size_t bytes; /* this rank's window size (get_size) */
  int busy;     /* calls running with the GIL released (other threads) */
  PyObject *weakreflist;
} WindowObject;

/* Sets RuntimeError (or `exc`) "TorchCommWindow.<op> on '<comm>' (rank r of
 * n): <message>"; returns NULL. */
static PyObject *tcpy_win_fail(WindowObject *self, PyObject *exc,
                               const char *op, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  PyObject *msg = PyUnicode_FromFormatV(fmt, ap);
  va_end(ap);
  if (!msg) return NULL;
  tc_comm_t *c = self->comm->comm;
  if (c)
    PyErr_Format(exc ? exc : PyExc_RuntimeError,
                 "TorchCommWindow.%s on '%s' (rank %d of %d): %U", op,
                 tc_comm_name(c), tc_comm_rank(c), tc_comm_size(c), msg);
  else
    PyErr_Format(exc ? exc : PyExc_RuntimeError, "TorchCommWindow.%s: %U", op,
                 msg);
  Py_DECREF(msg);
  return NULL;
}

/* A failed C call: RuntimeError with the library's text (MemoryError for
 * TC_ERR_NOMEM). */
static PyObject *tcpy_win_raise(int rc, const char *text) {
  if (!text || !*text) text = tc_strerror(rc);
  PyErr_Format(rc == TC_ERR_NOMEM ? PyExc_MemoryError : PyExc_RuntimeError,
               "%s", text);
  return NULL;
}

/* The communicator is up and a tensor is registered; -1 with an error. */
static int tcpy_win_ready(WindowObject *self, const char *op) {
  if (tcpy_comm_live(self->comm, op) < 0) return -1;
  if (!self->win) {
    tcpy_win_fail(self, NULL, op, "no tensor is registered with this window "
                  "(call tensor_register(tensor) first, on every rank)");
    return -1;
  }
  return 0;
}

/* A rank argument: an int naming a rank of the communicator. */
static int tcpy_win_rank(WindowObject *self, const char *op, const char *arg,
                         PyObject *obj, int *out) {
  if (tcpy_int(obj, op, arg, out) < 0) return -1;
  int n = tc_comm_size(self->comm->comm);
  if (*out < 0 || *out >= n) {
    tcpy_win_fail(self, NULL, op, "argument '%s' = %d is not a rank of the "
                  "communicator (ranks 0 to %d)", arg, *out, n - 1);
    return -1;
  }
  return 0;
}

/* An element offset argument (>= 0). */
static int tcpy_win_offset(WindowObject *self, const char *op, const char *arg,
                           PyObject *obj, size_t *out) {
  if (!PyLong_Check(obj)) {
    PyErr_Format(PyExc_TypeError, "TorchCommWindow.%s: argument '%s' must be "
                 "an int, not %.100s", op, arg, Py_TYPE(obj)->tp_name);
    return -1;
  }
  long long v = PyLong_AsLongLong(obj);
  if (v == -1 && PyErr_Occurred()) return -1;
  if (v < 0) {
    tcpy_win_fail(self, NULL, op, "argument '%s' = %lld is negative", arg, v);
    return -1;
  }
  *out = (size_t)v;
  return 0;
}

/* A tensor argument of put/get: the communicator's device, contiguous,
 * the window's dtype. */
static int tcpy_win_tensor_arg(WindowObject *self, const char *op,
                               const char *arg, PyObject *obj,
                               tcpy_tensor_t *t) {
  char what[96];
  snprintf(what, sizeof what, "TorchCommWindow.%s", op);
  if (tcpy_tensor(&self->comm->dev, what, arg, -1, obj, t) < 0) {
    /* torchcomms' window raises RuntimeError for a tensor it refuses */
    if (PyErr_ExceptionMatches(PyExc_ValueError)) {
      PyObject *type, *value, *tb;
      PyErr_Fetch(&type, &value, &tb);
      PyObject *s = value ? PyObject_Str(value) : NULL;
      Py_XDECREF(type);
      Py_XDECREF(value);
      Py_XDECREF(tb);
      if (s) {
        PyErr_SetObject(PyExc_RuntimeError, s);
        Py_DECREF(s);
      }
    }
    return -1;
  }
  if (t->dtype != self->cdtype) {
    tcpy_win_fail(self, NULL, op, "argument '%s' has dtype %s but the window "
                  "holds %s (offsets count elements of the window's dtype): "
                  "convert it with .to(%R) first", arg,
                  tcpy_dtype_name(t->dtype), tcpy_dtype_name(self->cdtype),
                  self->dtype);
    return -1;
  }
  return 0;
}

/* Checks offset + count elements against rank `peer`'s window. */
static int tcpy_win_bounds(WindowObject *self, const char *op, int peer,
                           size_t off, size_t count, size_t *byte_off) {
  size_t peer_bytes = 0;
  tc_window_size(self->win, peer, &peer_bytes);
  size_t isz = self->itemsize;
  if (off > SIZE_MAX / isz || count > SIZE_MAX / isz ||
      off * isz > SIZE_MAX - count * isz ||
      off * isz + count * isz > peer_bytes) {
    tcpy_win_fail(self, NULL, op, "Requested size (elements %zu to %zu of %s, "
                  "bytes %zu to %zu) exceeds the window size of rank %d "
                  "(%zu bytes); nothing was transferred", off, off + count,
                  tcpy_dtype_name(self->cdtype), off * isz,
                  off * isz + count * isz, peer, peer_bytes);
    return -1;
  }
  *byte_off = off * isz;
  return 0;
}

/* The window's calls, run with the GIL released. */
enum { TCPY_WIN_PUT, TCPY_WIN_GET, TCPY_WIN_SIGNAL, TCPY_WIN_WAIT,
       TCPY_WIN_FLUSH, TCPY_WIN_FENCE };

/* Runs one window call and returns its TorchWork (holding `refs` while it
 * runs) or NULL with an exception. */
static PyObject *tcpy_win_call(WindowObject *self, int kind, void *buf,
                               size_t bytes, int peer, size_t off,
                               int async_op, PyObject *hints,
                               PyObject *timeout, PyObject *refs,
                               const char *op) {
  char what[96];
  snprintf(what, sizeof what, "TorchCommWindow.%s", op);
  tcpy_opts_t o;
  if (tcpy_opts_init(&o, what, hints, timeout) < 0) return NULL;
  tc_window_t *w = self->win;
  tc_work_t *work = NULL, **wp = async_op ? &work : NULL;
  char text[TCPY_WIN_ERRBUF];
  int rc = TC_OK;
  self->busy++;
  Py_BEGIN_ALLOW_THREADS
  switch (kind) {
  case TCPY_WIN_PUT: rc = tc_window_put(w, buf, bytes, peer, off, &o.o, wp); break;
  case TCPY_WIN_GET: rc = tc_window_get(w, buf, bytes, peer, off, &o.o, wp); break;
  case TCPY_WIN_SIGNAL: rc = tc_window_signal(w, peer, &o.o, wp); break;
  case TCPY_WIN_WAIT: rc = tc_window_wait_signal(w, peer, &o.o, wp); break;
  case TCPY_WIN_FLUSH: rc = tc_window_flush(w, peer, &o.o, wp); break;
  default: rc = tc_window_fence(w, &o.o); break;
  }
  if (rc != TC_OK) snprintf(text, sizeof text, "%s", tc_last_error());
  Py_END_ALLOW_THREADS
  self->busy--;
  tcpy_opts_free(&o);
  if (rc != TC_OK) return tcpy_win_raise(rc, text);
  return tcpy_work_new(work, refs);
}

/* ---- registration ---- */

static int tcpy_win_register(WindowObject *self, PyObject *tensor, int owning,
                             PyObject *hints, PyObject *timeout) {
  const char *op = "tensor_register";
  if (tcpy_comm_live(self->comm, op) < 0) return -1;
  if (self->win) {
    tcpy_win_fail(self, NULL, op, "Double registration error: a tensor is "
                  "already registered with this window (call "
                  "tensor_deregister() first, or make another window with "
                  "new_window())");
    return -1;
  }
  if (!self->comm->dev.is_cpu) {
    /* the window's memory is host memory copied into and re-homed onto:
     * a device tensor cannot be (no segfault on a device pointer) */
    tcpy_win_fail(self, NULL, op, "windows from Python need a communicator "
                  "on the cpu device; this one is on '%s' (backend '%s'). "
                  "Use the C API there (tc_window_create with a buffer from "
                  "ncclMemAlloc: docs/windows.md), or a cpu communicator",
                  self->comm->dev.type, tc_comm_backend(self->comm->comm));
    return -1;
  }
  tcpy_tensor_t t;
  char what[96];
  snprintf(what, sizeof what, "TorchCommWindow.%s", op);
  if (tcpy_tensor(&self->comm->dev, what, "tensor", -1, tensor, &t) < 0) {
    if (PyErr_ExceptionMatches(PyExc_ValueError)) {
      PyObject *et, *ev, *etb;
      PyErr_Fetch(&et, &ev, &etb);
      PyObject *s = ev ? PyObject_Str(ev) : NULL;
      Py_XDECREF(et);
      Py_XDECREF(ev);
      Py_XDECREF(etb);
      if (s) {
        PyErr_SetObject(PyExc_RuntimeError, s);
        Py_DECREF(s);
      }
    }
    return -1;
  }
  size_t isz = tc_dtype_size(t.dtype);
  size_t nbytes = t.numel * isz;
  PyObject *dtype = PyObject_GetAttr(tensor, tcpy_str.dtype);
  PyObject *shp = dtype ? PyObject_GetAttr(tensor, tcpy_str.shape) : NULL;
  PyObject *shape = shp ? PySequence_List(shp) : NULL;
  PyObject *device = shape ? PyObject_GetAttr(tensor, tcpy_str.device) : NULL;
  Py_XDECREF(shp);
  tcpy_opts_t o;
  if (!device || tcpy_opts_init(&o, what, hints, timeout) < 0) goto fail;
  tc_comm_t *c = self->comm->comm;
  tc_window_t *w = NULL;
  void *mem = NULL;
  char text[TCPY_WIN_ERRBUF];
  int rc, backend_mem = 0;
  Py_BEGIN_ALLOW_THREADS
  rc = tc_window_create(c, NULL, nbytes, &o.o, &w);
  if (rc == TC_OK && nbytes) {
    rc = tc_window_map_ref(w, tc_comm_rank(c), &mem);
    if (rc == TC_OK) memcpy(mem, t.ptr, nbytes);
    backend_mem = rc == TC_ERR_NOT_SUPPORTED;
  }
  /* no peer may put before the values are in */
  if (rc == TC_OK) rc = tc_barrier(c, &o.o, NULL);
  if (backend_mem) /* the backend keeps the window's memory itself (nccl) */
    snprintf(text, sizeof text, "torchcomms: tensor_register on '%s': backend '%s' keeps "
             "its window memory itself, and windows from Python need host memory the "
             "library allocates (the cpu backend); use the C API there (tc_window_create, "
             "docs/windows.md)", tc_comm_name(c), tc_comm_backend(c));
  else if (rc != TC_OK)
    snprintf(text, sizeof text, "%s", tc_last_error());
  Py_END_ALLOW_THREADS
  tcpy_opts_free(&o);
  if (rc != TC_OK) {
    if (mem) tc_window_map_release(mem);
    if (w) {
      Py_BEGIN_ALLOW_THREADS
      tc_window_free(w);
      Py_END_ALLOW_THREADS
    }
    tcpy_win_raise(rc, text);
    goto fail;
  }
  if (nbytes) {
    PyObject *flat = tcpy_win_tensor_over(mem, t.numel, isz, dtype, shape);
    if (!flat || tcpy_win_rehome(tensor, flat) < 0) {
      Py_XDECREF(flat);
      Py_BEGIN_ALLOW_THREADS
      tc_window_free(w);
      Py_END_ALLOW_THREADS
      goto fail;
    }
    Py_DECREF(flat);
  }
  self->win = w;
  self->tensor = owning ? Py_NewRef(tensor) : NULL;
  Py_XSETREF(self->dtype, dtype);
  Py_XSETREF(self->shape, shape);
  Py_XSETREF(self->device, device);
  self->cdtype = t.dtype;
  self->itemsize = isz;
  self->bytes = nbytes;
  return 0;
fail:
  Py_XDECREF(dtype);
  Py_XDECREF(shape);
  Py_XDECREF(device);
  return -1;
}

static PyObject *tcpy_win_tensor_register(WindowObject *self, PyObject *args,
                                          PyObject *kw) {
  static char *kwlist[] = {"tensor", "owning", "hints", "timeout", NULL};
  PyObject *tensor, *hints = Py_None, *timeout = Py_None;
  int owning = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|p$OO:tensor_register", kwlist,
                                   &tensor, &owning, &hints, &timeout))
    return NULL;
  if (tcpy_win_register(self, tensor, owning, hints, timeout) < 0) return NULL;
  Py_RETURN_NONE;
}

/* Frees the C window (collective unless the communicator is down) and
 * forgets the registration. */
static int tcpy_win_unregister(WindowObject *self) {
  tc_window_t *w = self->win;
  char text[TCPY_WIN_ERRBUF];
  int rc;
  self->win = NULL;
  Py_CLEAR(self->tensor);
  self->bytes = 0;
  Py_BEGIN_ALLOW_THREADS
  rc = tc_window_free(w);
  if (rc != TC_OK) snprintf(text, sizeof text, "%s", tc_last_error());
  Py_END_ALLOW_THREADS
  if (rc != TC_OK) {
    tcpy_win_raise(rc, text);
    return -1;
  }
  return 0;
}

static PyObject *tcpy_win_tensor_deregister(WindowObject *self,
                                            PyObject *unused) {
  const char *op = "tensor_deregister";
  if (!self->win)
    return tcpy_win_fail(self, NULL, op, "Double deregistration error: no "
                         "tensor is registered with this window (register "
                         "one with tensor_register first; each registration "
                         "is deregistered once)");
  if (self->busy)
    return tcpy_win_fail(self, NULL, op, "%d call(s) of this window are "
                         "still running on other threads (a wait_signal?): "
                         "let them return first", self->busy);
  if (tcpy_win_unregister(self) < 0) return NULL;
  Py_RETURN_NONE;
}

/* ---- one-sided operations ---- */

static PyObject *tcpy_win_put(WindowObject *self, PyObject *args,
                              PyObject *kw) {
  static char *kwlist[] = {"tensor", "dst_rank", "target_offset_nelems",
                           "async_op", "hints", "timeout", NULL};
  PyObject *tensor, *rank_o, *off_o, *hints = Py_None, *timeout = Py_None;
  int async_op;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOp|OO:put", kwlist, &tensor,
                                   &rank_o, &off_o, &async_op, &hints,
                                   &timeout))
    return NULL;
  const char *op = "put";
  tcpy_tensor_t t;
  int peer;
  size_t off, boff;
  if (tcpy_win_ready(self, op) < 0 ||
      tcpy_win_rank(self, op, "dst_rank", rank_o, &peer) < 0 ||
      tcpy_win_offset(self, op, "target_offset_nelems", off_o, &off) < 0 ||
      tcpy_win_tensor_arg(self, op, "tensor", tensor, &t) < 0 ||
      tcpy_win_bounds(self, op, peer, off, t.numel, &boff) < 0)
    return NULL;
  return tcpy_win_call(self, TCPY_WIN_PUT, t.ptr, t.numel * self->itemsize,
                       peer, boff, async_op, hints, timeout, tensor, op);
}

static PyObject *tcpy_win_get(WindowObject *self, PyObject *args,
                              PyObject *kw) {
  static char *kwlist[] = {"tensor", "src_rank", "source_offset_nelems",
                           "async_op", "hints", "timeout", NULL};
  PyObject *tensor, *rank_o, *off_o, *hints = Py_None, *timeout = Py_None;
  int async_op;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOp|OO:get", kwlist, &tensor,
                                   &rank_o, &off_o, &async_op, &hints,
                                   &timeout))
    return NULL;
  const char *op = "get";
  tcpy_tensor_t t;
  int peer;
  size_t off, boff;
  if (tcpy_win_ready(self, op) < 0 ||
      tcpy_win_rank(self, op, "src_rank", rank_o, &peer) < 0 ||
      tcpy_win_offset(self, op, "source_offset_nelems", off_o, &off) < 0 ||
      tcpy_win_tensor_arg(self, op, "tensor", tensor, &t) < 0 ||
      tcpy_win_bounds(self, op, peer, off, t.numel, &boff) < 0)
    return NULL;
  return tcpy_win_call(self, TCPY_WIN_GET, t.ptr, t.numel * self->itemsize,
                       peer, boff, async_op, hints, timeout, tensor, op);
}

/* signal(dst_rank, async_op, ...) and wait_signal(peer_rank, async_op, ...)
 * (torchcomms' binding has named signal's rank both dst_rank and
 * peer_rank: either keyword is taken). */
static PyObject *tcpy_win_sig(WindowObject *self, PyObject *args, PyObject *kw,
                              int kind) {
  static char *kwlist_s[] = {"dst_rank", "async_op", "hints", "timeout",
                             "peer_rank", NULL};
  static char *kwlist_w[] = {"peer_rank", "async_op", "hints", "timeout",
                             "src_rank", NULL};
  const char *op = kind == TCPY_WIN_SIGNAL ? "signal" : "wait_signal";
  char **kwlist = kind == TCPY_WIN_SIGNAL ? kwlist_s : kwlist_w;
  PyObject *rank_o = NULL, *alias = NULL, *async_o = NULL, *hints = Py_None,
           *timeout = Py_None;
  char fmt[32];
  snprintf(fmt, sizeof fmt, "|OOOO$O:%s", op);
  if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, kwlist, &rank_o, &async_o,
                                   &hints, &timeout, &alias))
    return NULL;
  if (rank_o && alias) {
    PyErr_Format(PyExc_TypeError, "TorchCommWindow.%s: got the rank twice "
                 "('%s' and '%s')", op, kwlist[0], kwlist[4]);
    return NULL;
  }
  if (!rank_o) rank_o = alias;
  if (!rank_o || !async_o) {
    PyErr_Format(PyExc_TypeError, "TorchCommWindow.%s() missing required "
                 "argument '%s'", op, rank_o ? "async_op" : kwlist[0]);
    return NULL;
  }
  int async_op = PyObject_IsTrue(async_o);
  if (async_op < 0) return NULL;
  int peer;
  if (tcpy_win_ready(self, op) < 0 ||
      tcpy_win_rank(self, op, kwlist[0], rank_o, &peer) < 0)
    return NULL;
  return tcpy_win_call(self, kind, NULL, 0, peer, 0, async_op, hints, timeout,
                       NULL, op);
}

static PyObject *tcpy_win_signal(WindowObject *self, PyObject *args,
                                 PyObject *kw) {
  return tcpy_win_sig(self, args, kw, TCPY_WIN_SIGNAL);
}

static PyObject *tcpy_win_wait_signal(WindowObject *self, PyObject *args,
                                      PyObject *kw) {
  return tcpy_win_sig(self, args, kw, TCPY_WIN_WAIT);
}

static PyObject *tcpy_win_flush(WindowObject *self, PyObject *args,
                                PyObject *kw) {
  static char *kwlist[] = {"peer_rank", "async_op", "hints", "timeout", NULL};
  PyObject *rank_o = NULL, *hints = Py_None, *timeout = Py_None;
  int async_op = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|OpOO:flush", kwlist, &rank_o,
                                   &async_op, &hints, &timeout))
    return NULL;
  const char *op = "flush";
  int peer = -1;
  if (tcpy_win_ready(self, op) < 0) return NULL;
  if (rank_o && rank_o != Py_None) {
    if (tcpy_int(rank_o, op, "peer_rank", &peer) < 0) return NULL;
    if (peer != -1 && tcpy_win_rank(self, op, "peer_rank", rank_o, &peer) < 0)
      return NULL;
  }
  return tcpy_win_call(self, TCPY_WIN_FLUSH, NULL, 0, peer, 0, async_op, hints,
                       timeout, NULL, op);
}

static PyObject *tcpy_win_fence(WindowObject *self, PyObject *args,
                                PyObject *kw) {
  static char *kwlist[] = {"hints", "timeout", NULL};
  PyObject *hints = Py_None, *timeout = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO:fence", kwlist, &hints,
                                   &timeout))
    return NULL;
  if (tcpy_win_ready(self, "fence") < 0) return NULL;
  PyObject *w = tcpy_win_call(self, TCPY_WIN_FENCE, NULL, 0, -1, 0, 0, hints,
                              timeout, NULL, "fence");
  if (!w) return NULL;
  Py_DECREF(w);
  Py_RETURN_NONE;
}

/* ---- mapping and attributes ---- */

static PyObject *tcpy_win_map_remote_tensor(WindowObject *self, PyObject *args,
                                            PyObject *kw) {
  static char *kwlist[] = {"rank", NULL};
  PyObject *rank_o;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O:map_remote_tensor", kwlist,
                                   &rank_o))
    return NULL;
  const char *op = "map_remote_tensor";
  int peer;
  if (tcpy_win_ready(self, op) < 0 ||
      tcpy_win_rank(self, op, "rank", rank_o, &peer) < 0)
    return NULL;
  size_t bytes = 0;
  tc_window_size(self->win, peer, &bytes);
  void *p = NULL;
  char text[TCPY_WIN_ERRBUF];
  int rc;
  tc_window_t *w = self->win;
  self->busy++;
  Py_BEGIN_ALLOW_THREADS
  rc = tc_window_map_ref(w, peer, &p);
  if (rc != TC_OK) snprintf(text, sizeof text, "%s", tc_last_error());
  Py_END_ALLOW_THREADS
  self->busy--;
  if (rc == TC_ERR_NOT_SUPPORTED)
    return tcpy_win_fail(self, NULL, op, "rank %d's window cannot be mapped "
                         "into this process (get_attr(%d).access_type is "
                         "WIN_ACCESS_TYPE_SEPARATE): %s; read and write it "
                         "with get() and put() instead", peer, peer, text);
  if (rc != TC_OK) return tcpy_win_raise(rc, text);
  /* the window's shape when the peer's window has this rank's size, else
   * a 1-D tensor of the peer's whole elements */
  size_t numel = bytes / self->itemsize;
  PyObject *shape = NULL;
  if (bytes == self->bytes) shape = Py_NewRef(self->shape);
  else shape = Py_BuildValue("[n]", (Py_ssize_t)numel);
  if (!shape) {
    tc_window_map_release(p);
    return NULL;
  }
  PyObject *r = tcpy_win_tensor_over(p, numel, self->itemsize, self->dtype,
                                     shape);
  Py_DECREF(shape);
  return r;
}

static PyObject *tcpy_win_get_attr(WindowObject *self, PyObject *args,
                                   PyObject *kw) {
  static char *kwlist[] = {"peer_rank", NULL};
  PyObject *rank_o;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O:get_attr", kwlist, &rank_o))
    return NULL;
  const char *op = "get_attr";
  int peer;
  if (tcpy_win_ready(self, op) < 0 ||
      tcpy_win_rank(self, op, "peer_rank", rank_o, &peer) < 0)
    return NULL;
  tc_win_access_t a = TC_WIN_ACCESS_SEPARATE;
  int rc = tc_window_access(self->win, peer, &a);
  if (rc != TC_OK) return tcpy_win_raise(rc, tc_last_error());
  PyObject *cls = PyObject_GetAttrString(tcpy_module, "TorchCommWindowAttr");
  PyObject *enm = cls ? PyObject_GetAttrString(tcpy_module,
                                               "TorchCommWinAccessType")
                      : NULL;
  PyObject *member = enm ? PyObject_GetAttrString(
                               enm, a == TC_WIN_ACCESS_UNIFIED
                                        ? "WIN_ACCESS_TYPE_UNIFIED"
                                        : "WIN_ACCESS_TYPE_SEPARATE")
                         : NULL;
  PyObject *attr = member ? PyObject_CallNoArgs(cls) : NULL;
  if (attr && PyObject_SetAttrString(attr, "access_type", member) < 0)
    Py_CLEAR(attr);
  Py_XDECREF(member);
  Py_XDECREF(enm);
  Py_XDECREF(cls);
  return attr;
}

/* ---- getters ---- */

static PyObject *tcpy_win_get_size(WindowObject *self, PyObject *u) {
  return PyLong_FromSize_t(self->win ? self->bytes : 0);
}

static PyObject *tcpy_win_get_tensor(WindowObject *self, PyObject *u) {
  if (!self->win) Py_RETURN_NONE;
  if (self->tensor) return Py_NewRef(self->tensor);
  /* owning=False: a tensor over this rank's window memory */
  PyObject *a = Py_BuildValue("(i)", tc_comm_rank(self->comm->comm));
  if (!a) return NULL;
  PyObject *r = tcpy_win_map_remote_tensor(self, a, NULL);
  Py_DECREF(a);
  return r;
}

static PyObject *tcpy_win_prop_dtype(WindowObject *self, void *c) {
  if (self->dtype) return Py_NewRef(self->dtype);
  PyObject *torch = tcpy_win_torch_mod(); /* torchcomms' default: float */
  return torch ? PyObject_GetAttrString(torch, "float32") : NULL;
}

static PyObject *tcpy_win_prop_shape(WindowObject *self, void *c) {
  return self->shape ? PySequence_List(self->shape) : PyList_New(0);
}

static PyObject *tcpy_win_prop_device(WindowObject *self, void *c) {
  if (self->device) return Py_NewRef(self->device);
  return tcpy_torch_device(self->comm->dev.type, self->comm->dev.index);
}

static PyObject *tcpy_win_prop_comm(WindowObject *self, void *c) {
  return Py_NewRef((PyObject *)self->comm);
}

/* ---- GPU-only methods of torchcomms' NCCLX windows ---- */

static PyObject *tcpy_win_gpu_only(WindowObject *self, const char *op) {
  return tcpy_win_fail(self, NULL, op, "device windows are GPU-only (NCCLX's "
                       "device API); the '%s' backend has none: use put, "
                       "get, signal and wait_signal from the host",
                       self->comm->comm ? tc_comm_backend(self->comm->comm)
                                        : "cpu");
}

static PyObject *tcpy_win_get_device_window(WindowObject *self, PyObject *args,
                                            PyObject *kw) {
  static char *kwlist[] = {"signal_count", "counter_count", "barrier_count",
                           NULL};
  int a = -1, b = -1, c = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|iii:get_device_window", kwlist,
                                   &a, &b, &c))
    return NULL;
  return tcpy_win_gpu_only(self, "get_device_window");
}

static PyObject *tcpy_win_register_local_buffer(WindowObject *self,
                                                PyObject *tensor) {
  return tcpy_win_gpu_only(self, "register_local_buffer");
}

static PyObject *tcpy_win_deregister_local_buffer(WindowObject *self,
                                                  PyObject *handle) {
  return tcpy_win_gpu_only(self, "deregister_local_buffer");
}

/* ---- copy ---- */

static PyObject *tcpy_win_new(TorchCommObject *comm);

static PyObject *tcpy_win_copy(WindowObject *self, PyObject *u) {
  return Py_NewRef((PyObject *)self);
}

/* torchcomms' deepcopy: a new window on the same communicator, with a
 * clone of the registered tensor registered (collective when one is). */
static PyObject *tcpy_win_deepcopy(WindowObject *self, PyObject *memo) {
  PyObject *id = PyLong_FromVoidPtr(self);
  if (!id) return NULL;
  PyObject *seen = PyDict_Check(memo) ? PyDict_GetItemWithError(memo, id)
                                      : NULL;
  if (seen || PyErr_Occurred()) {
    Py_DECREF(id);
    return seen ? Py_NewRef(seen) : NULL;
  }
  WindowObject *n = (WindowObject *)tcpy_win_new(self->comm);
  PyObject *src = NULL, *clone = NULL;
  if (!n) goto fail;
  if (self->win) {
    if (!(src = tcpy_win_get_tensor(self, NULL)) ||
        !(clone = PyObject_CallMethod(src, "clone", NULL)) ||
        tcpy_win_register(n, clone, self->tensor != NULL, Py_None, Py_None) < 0)
      goto fail;
    if (self->tensor && PyDict_Check(memo)) {
      PyObject *tid = PyLong_FromVoidPtr(self->tensor);
      int bad = !tid || PyDict_SetItem(memo, tid, clone) < 0;
      Py_XDECREF(tid);
      if (bad) goto fail;
    }
  }
  if (PyDict_Check(memo) && PyDict_SetItem(memo, id, (PyObject *)n) < 0)
    goto fail;
  Py_DECREF(id);
  Py_XDECREF(src);
  Py_XDECREF(clone);
  return (PyObject *)n;
fail:
  Py_DECREF(id);
  Py_XDECREF(src);
  Py_XDECREF(clone);
  Py_XDECREF(n);
  return NULL;
}

static PyObject *tcpy_win_repr(WindowObject *self) {
  if (!self->win)
    return PyUnicode_FromFormat("<TorchCommWindow (no tensor registered)>");
  return PyUnicode_FromFormat("<TorchCommWindow %s %R, %zu bytes>",
                              tcpy_dtype_name(self->cdtype), self->shape,
                              self->bytes);
}

static int tcpy_win_traverse(WindowObject *self, visitproc visit, void *arg) {
  Py_VISIT(self->comm);
  Py_VISIT(self->tensor);
  return 0;
}

static void tcpy_win_dealloc(WindowObject *self) {
  PyObject_GC_UnTrack(self);
  if (self->weakreflist) PyObject_ClearWeakRefs((PyObject *)self);
  if (self->win) {
    /* freeing is collective: at the communicator's finalize, abort or end
     * (tcpy_win_release_orphans) */
    tcpy_win_orphan_add(self->comm ? self->comm->comm : NULL, self->win);
    self->win = NULL;
  }
  Py_CLEAR(self->tensor);
  Py_CLEAR(self->dtype);
  Py_CLEAR(self->shape);
  Py_CLEAR(self->device);
  Py_CLEAR(self->comm);
  PyObject_GC_Del(self);
}

static PyMethodDef tcpy_win_methods[] = {
    {"tensor_register", (PyCFunction)(void (*)(void))tcpy_win_tensor_register,
     METH_VARARGS | METH_KEYWORDS,
     "tensor_register(tensor, owning=True, *, hints=None, timeout=None): "
     "collective. Registers a contiguous tensor on the communicator's device "
     "as this rank's window: the library allocates the window's memory "
     "(shared memory on one host), copies the tensor's values in and points "
     "the tensor at it, so that the tensor reads what peers put. "
     "owning=False: the window keeps no reference to the tensor object. "
     "RuntimeError if a tensor is already registered."},
    {"tensor_deregister", (PyCFunction)tcpy_win_tensor_deregister, METH_NOARGS,
     "tensor_deregister(): collective (a barrier first). Frees the window; "
     "tensors over its memory stay valid (the registered tensor keeps its "
     "values). RuntimeError if no tensor is registered."},
    {"put", (PyCFunction)(void (*)(void))tcpy_win_put,
     METH_VARARGS | METH_KEYWORDS,
     "put(tensor, dst_rank, target_offset_nelems, async_op, hints=None, "
     "timeout=None) -> TorchWork: writes the contiguous tensor (the window's "
     "dtype) into dst_rank's window at element target_offset_nelems. "
     "Visible at dst_rank once its wait_signal for a later signal returns. "
     "RuntimeError before any byte moves if it does not fit."},
    {"get", (PyCFunction)(void (*)(void))tcpy_win_get,
     METH_VARARGS | METH_KEYWORDS,
     "get(tensor, src_rank, source_offset_nelems, async_op, hints=None, "
     "timeout=None) -> TorchWork: reads src_rank's window from element "
     "source_offset_nelems into the contiguous tensor (the window's dtype). "
     "Not in torchcomms (an extension of this implementation)."},
    {"signal", (PyCFunction)(void (*)(void))tcpy_win_signal,
     METH_VARARGS | METH_KEYWORDS,
     "signal(dst_rank, async_op, hints=None, timeout=None) -> TorchWork: "
     "adds one to dst_rank's signal counter for this rank, after the puts "
     "this rank issued to it before."},
    {"wait_signal", (PyCFunction)(void (*)(void))tcpy_win_wait_signal,
     METH_VARARGS | METH_KEYWORDS,
     "wait_signal(peer_rank, async_op, hints=None, timeout=None) -> "
     "TorchWork: waits for one signal of peer_rank that no earlier wait "
     "took (async_op=True: the TorchWork completes when it is there). "
     "RuntimeError on timeout or when the peer dies."},
    {"flush", (PyCFunction)(void (*)(void))tcpy_win_flush,
     METH_VARARGS | METH_KEYWORDS,
     "flush(peer_rank=-1, async_op=False, hints=None, timeout=None) -> "
     "TorchWork: returns once every put this rank issued to peer_rank (-1: "
     "to every rank) is in the peer's memory. Not in torchcomms."},
    {"fence", (PyCFunction)(void (*)(void))tcpy_win_fence,
     METH_VARARGS | METH_KEYWORDS,
     "fence(hints=None, timeout=None): collective (MPI_Win_fence): every "
     "rank's puts before it are in place everywhere when it returns. Not in "
     "torchcomms."},
    {"map_remote_tensor",
     (PyCFunction)(void (*)(void))tcpy_win_map_remote_tensor,
     METH_VARARGS | METH_KEYWORDS,
     "map_remote_tensor(rank) -> torch.Tensor: a zero-copy tensor over "
     "rank's window memory (the window's dtype; its shape when rank's "
     "window has this rank's size, else 1-D). RuntimeError where it cannot "
     "be mapped (get_attr(rank).access_type is WIN_ACCESS_TYPE_SEPARATE: "
     "another host, or TCP)."},
    {"get_attr", (PyCFunction)(void (*)(void))tcpy_win_get_attr,
     METH_VARARGS | METH_KEYWORDS,
     "get_attr(peer_rank) -> TorchCommWindowAttr: access_type "
     "WIN_ACCESS_TYPE_UNIFIED (mapped here: map_remote_tensor works) or "
     "WIN_ACCESS_TYPE_SEPARATE (only put and get)."},
    {"get_size", (PyCFunction)tcpy_win_get_size, METH_NOARGS,
     "get_size() -> int: this rank's window size in bytes (0 while no "
     "tensor is registered)."},
    {"get_tensor", (PyCFunction)tcpy_win_get_tensor, METH_NOARGS,
     "get_tensor() -> torch.Tensor | None: the registered tensor."},
    {"get_device_window",
     (PyCFunction)(void (*)(void))tcpy_win_get_device_window,
     METH_VARARGS | METH_KEYWORDS,
     "GPU-only in torchcomms (NCCLX device API): RuntimeError here."},
    {"register_local_buffer", (PyCFunction)tcpy_win_register_local_buffer,
     METH_O, "GPU-only in torchcomms (NCCLX device API): RuntimeError here."},
    {"deregister_local_buffer", (PyCFunction)tcpy_win_deregister_local_buffer,
     METH_O, "GPU-only in torchcomms (NCCLX device API): RuntimeError here."},
    {"__copy__", (PyCFunction)tcpy_win_copy, METH_NOARGS,
     "The same window (as torchcomms)."},
    {"__deepcopy__", (PyCFunction)tcpy_win_deepcopy, METH_O,
     "A new window on the same communicator with a clone of the registered "
     "tensor registered (collective when one is registered)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef tcpy_win_getset[] = {
    {"dtype", (getter)tcpy_win_prop_dtype, NULL,
     "torch.dtype of the registered tensor (torch.float32 before any)", NULL},
    {"shape", (getter)tcpy_win_prop_shape, NULL,
     "shape of the registered tensor, a list of ints ([] before any)", NULL},
    {"device", (getter)tcpy_win_prop_device, NULL,
     "torch.device of the registered tensor (the communicator's before any)",
     NULL},
    {"comm", (getter)tcpy_win_prop_comm, NULL,
     "the TorchComm of the window (ours)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject TcPy_TorchCommWindow_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "torchcomms._comms.TorchCommWindow",
    .tp_basicsize = sizeof(WindowObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A one-sided window of a TorchComm (TorchComm.new_window()): "
              "register a tensor (collective), then put into and get from "
              "peers' windows, signal and wait, map peers' windows as "
              "tensors on one host.",
    .tp_dealloc = (destructor)tcpy_win_dealloc,
    .tp_traverse = (traverseproc)tcpy_win_traverse,
    .tp_repr = (reprfunc)tcpy_win_repr,
    .tp_methods = tcpy_win_methods,
    .tp_getset = tcpy_win_getset,
    .tp_weaklistoffset = offsetof(WindowObject, weakreflist),
};

static PyObject *tcpy_win_new(TorchCommObject *comm) {
  WindowObject *w = PyObject_GC_New(WindowObject, &TcPy_TorchCommWindow_Type);
  if (!w) return NULL;
  w->comm = (TorchCommObject *)Py_NewRef((PyObject *)comm);
  w->win = NULL;
  w->tensor = w->dtype = w->shape = w->device = NULL;
  w->cdtype = TC_FLOAT32;
  w->itemsize = 4;
  w->bytes = 0;
  w->busy = 0;
  w->weakreflist = NULL;
  PyObject_GC_Track(w);
  return (PyObject *)w;
}

/* ======================================================================== */
/* TorchComm.new_window                                                      */
/* ======================================================================== */

static PyObject *tcpy_comm_new_window(TorchCommObject *self, PyObject *args,
                                      PyObject *kw) {
  static char *kwlist[] = {"tensor", NULL};
  PyObject *tensor = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:new_window", kwlist, &tensor))
    return NULL;
  if (tcpy_comm_live(self, "new_window") < 0) return NULL;
  uint64_t op_id = 0;
  int hooked = self->hooked;
  if (hooked) {
    op_id = tc_comm_next_op_id(self->comm);
    if (self->hooks[TCPY_HOOK_PRE]) {
      PyObject *pre = tcpy_hook_args(TCPY_HOOK_OP_NEW_WINDOW, -1, "");
      if (!pre) return NULL;
      int bad = tcpy_hooks_run_pre(self, TCPY_HOOK_OP_NEW_WINDOW, op_id, pre);
      Py_DECREF(pre);
      if (bad) return NULL;
    }
  }
  PyObject *w = tcpy_win_new(self);
  if (!w) return NULL;
  if (tensor != Py_None &&
      tcpy_win_register((WindowObject *)w, tensor, 1, Py_None, Py_None) < 0) {
    Py_DECREF(w);
    return NULL;
  }
  if (hooked) tcpy_hooks_run_post(self, TCPY_HOOK_OP_NEW_WINDOW, op_id);
  return w;
}

PyMethodDef tcpy_comm_win_methods[] = {
    {"new_window", (PyCFunction)(void (*)(void))tcpy_comm_new_window,
     METH_VARARGS | METH_KEYWORDS,
     "new_window(tensor=None) -> TorchCommWindow: a one-sided window on this "
     "communicator; with a tensor, tensor_register(tensor) right away "
     "(collective). Runs the pre and post hooks (OpName.new_window)."},
    {NULL, NULL, 0, NULL},
};

int tcpy_win_ready_types(PyObject *m) {
  if (tcpy_winmem_ready() < 0 ||
      PyType_Ready(&TcPy_TorchCommWindow_Type) < 0)
    return -1;
  return PyModule_AddObjectRef(m, "TorchCommWindow",
                               (PyObject *)&TcPy_TorchCommWindow_Type);
}

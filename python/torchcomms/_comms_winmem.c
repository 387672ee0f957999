/* _comms_winmem.c -- the memory side of TorchCommWindow (_comms_win.c):
 * torch tensors over window memory, re-homing a registered tensor onto it,
 * and the C windows of TorchCommWindows dropped while registered.
 *
 * A tensor over window memory is torch.frombuffer over a _WindowMemory, a
 * small buffer-protocol object (as MemAllocator's blocks, _comms_mem.c)
 * holding the mapping with tc_window_map_ref; torch keeps it with the
 * tensor's storage and drops it when the storage goes, which releases the
 * mapping (tc_window_map_release). So the tensor stays valid after
 * tensor_deregister and after its communicator is gone. */
#include "_comms.h"

#include <string.h>

/* ======================================================================== */
/* _WindowMemory: window memory held by tc_window_map_ref                   */
/* ======================================================================== */

typedef struct WinMemObject {
  PyObject_HEAD
  void *ptr; /* as tc_window_map_ref returned it; NULL: nothing held */
  size_t len;
} WinMemObject;

static int tcpy_winmem_getbuffer(WinMemObject *self, Py_buffer *view,
                                 int flags) {
  return PyBuffer_FillInfo(view, (PyObject *)self, self->ptr,
                           (Py_ssize_t)self->len, 0, flags);
}

static PyBufferProcs tcpy_winmem_as_buffer = {
    .bf_getbuffer = (getbufferproc)tcpy_winmem_getbuffer,
};

static void tcpy_winmem_dealloc(WinMemObject *self) {
  if (self->ptr) tc_window_map_release(self->ptr);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject TcPy_WinMem_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "torchcomms._comms._WindowMemory",
    .tp_basicsize = sizeof(WinMemObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Window memory mapped in this process, held until the last "
              "tensor over it goes.",
    .tp_dealloc = (destructor)tcpy_winmem_dealloc,
    .tp_as_buffer = &tcpy_winmem_as_buffer,
};

/* torch, imported on first use (never at import of torchcomms) */
static PyObject *tcpy_win_torch;

PyObject *tcpy_win_torch_mod(void) {
  if (!tcpy_win_torch) tcpy_win_torch = PyImport_ImportModule("torch");
  return tcpy_win_torch;
}

/* A tensor of dtype and shape (a list or tuple of ints, numel elements of
 * itemsize bytes) over `ptr`, a hold of tc_window_map_ref that the tensor's
 * storage takes over (released here on failure). */
PyObject *tcpy_win_tensor_over(void *ptr, size_t numel, size_t itemsize,
                                      PyObject *dtype, PyObject *shape) {
  PyObject *torch = tcpy_win_torch_mod();
  if (!torch) {
    tc_window_map_release(ptr);
    return NULL;
  }
  if (numel == 0) {
    /* torch.frombuffer refuses empty buffers: an ordinary empty tensor */
    tc_window_map_release(ptr);
    PyObject *args = PyTuple_Pack(1, shape);
    PyObject *kw = args ? Py_BuildValue("{sO}", "dtype", dtype) : NULL;
    PyObject *empty = kw ? PyObject_GetAttrString(torch, "empty") : NULL;
    PyObject *r = empty ? PyObject_Call(empty, args, kw) : NULL;
    Py_XDECREF(empty);
    Py_XDECREF(kw);
    Py_XDECREF(args);
    return r;
  }
  WinMemObject *m = PyObject_New(WinMemObject, &TcPy_WinMem_Type);
  if (!m) {
    tc_window_map_release(ptr);
    return NULL;
  }
  m->ptr = ptr;
  m->len = numel * itemsize;
  PyObject *flat = NULL, *res = NULL;
  PyObject *fb = PyObject_GetAttrString(torch, "frombuffer");
  PyObject *fargs = fb ? PyTuple_Pack(1, (PyObject *)m) : NULL;
  PyObject *fkw = fargs ? Py_BuildValue("{sOsn}", "dtype", dtype, "count",
                                        (Py_ssize_t)numel)
                        : NULL;
  if (fkw) flat = PyObject_Call(fb, fargs, fkw);
  Py_XDECREF(fkw);
  Py_XDECREF(fargs);
  Py_XDECREF(fb);
  Py_DECREF(m); /* the storage holds it now (or nobody: released) */
  if (flat) res = PyObject_CallMethod(flat, "view", "O", shape);
  Py_XDECREF(flat);
  return res;
}

/* Windows dropped while registered on a communicator that is still up:
 * freeing one is collective (a barrier), which a garbage collector must
 * not start; they are freed when their communicator finalizes, aborts or
 * goes (tcpy_win_release_orphans). The GIL guards the list. */
typedef struct tcpy_orphan {
  tc_comm_t *comm;
  tc_window_t *win;
  struct tcpy_orphan *next;
} tcpy_orphan_t;
static tcpy_orphan_t *tcpy_orphans;

void tcpy_win_orphan_add(tc_comm_t *comm, tc_window_t *win) {
  tcpy_orphan_t *o = comm ? PyMem_RawMalloc(sizeof *o) : NULL;
  if (!o) {
    tc_window_free(win); /* no communicator (or no memory): at once */
    return;
  }
  o->comm = comm;
  o->win = win;
  o->next = tcpy_orphans;
  tcpy_orphans = o;
}

void tcpy_win_release_orphans(tc_comm_t *comm) {
  tcpy_orphan_t **pp = &tcpy_orphans;
  while (*pp) {
    tcpy_orphan_t *o = *pp;
    if (o->comm != comm) {
      pp = &o->next;
      continue;
    }
    *pp = o->next;
    tc_window_free(o->win); /* the communicator is down: no barrier */
    PyMem_RawFree(o);
  }
}

static int tcpy_win_set_grad(PyObject *torch, int on, int *was) {
  if (was) {
    PyObject *r = PyObject_CallMethod(torch, "is_grad_enabled", NULL);
    if (!r) return -1;
    *was = PyObject_IsTrue(r);
    Py_DECREF(r);
  }
  PyObject *r = PyObject_CallMethod(torch, "set_grad_enabled", "O",
                                    on ? Py_True : Py_False);
  Py_XDECREF(r);
  return r ? 0 : -1;
}

/* Points `tensor` at `flat`'s storage (same size and strides) with autograd
 * off. */
int tcpy_win_rehome(PyObject *tensor, PyObject *flat) {
  PyObject *torch = tcpy_win_torch_mod();
  if (!torch) return -1;
  int was = 1;
  if (tcpy_win_set_grad(torch, 0, &was) < 0) return -1;
  PyObject *storage = PyObject_CallMethod(flat, "untyped_storage", NULL);
  PyObject *size = storage ? PyObject_CallMethod(tensor, "size", NULL) : NULL;
  PyObject *stride = size ? PyObject_CallMethod(tensor, "stride", NULL) : NULL;
  PyObject *r = stride ? PyObject_CallMethod(tensor, "set_", "OiOO", storage,
                                             0, size, stride)
                       : NULL;
  Py_XDECREF(stride);
  Py_XDECREF(size);
  Py_XDECREF(storage);
  Py_XDECREF(r);
  PyObject *et, *ev, *etb;
  PyErr_Fetch(&et, &ev, &etb);
  int rc = tcpy_win_set_grad(torch, was, NULL);
  if (et) {
    PyErr_Restore(et, ev, etb);
    return -1;
  }
  return r && rc == 0 ? 0 : -1;
}

int tcpy_winmem_ready(void) { return PyType_Ready(&TcPy_WinMem_Type); }

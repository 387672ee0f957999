/* _comms_mem.c -- memory: TorchComm.tensor_register / tensor_deregister, the
 * memory allocator (torchcomms.get_mem_allocator(backend),
 * TorchComm.get_mem_allocator(), TorchComm.mem_allocator).
 *
 * torchcomms' allocator is a per-backend c10::Allocator meant for
 * torch.cuda.MemPool (CUDA only). On CPU there is no MemPool, so the cpu
 * backend's allocator is our own small object: MemAllocator.empty(size,
 * dtype=None) returns a tensor over page-aligned, zero-filled memory mapped
 * for it alone (munmap'd when the last tensor using it goes). Registration
 * on the cpu backend pins nothing (the transports copy through their own
 * buffers): tensor_register validates and records the memory range, and
 * tensor_deregister checks it was registered, so that code written for
 * backends that need registration runs unchanged and its mistakes are
 * reported. */
#include "_comms.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

/* ======================================================================== */
/* _MemBlock: one mapping, exported through the buffer protocol             */
/* ======================================================================== */

typedef struct MemBlockObject {
  PyObject_HEAD
  void *ptr;
  size_t len;
} MemBlockObject;

static int tcpy_block_getbuffer(MemBlockObject *self, Py_buffer *view,
                                int flags) {
  return PyBuffer_FillInfo(view, (PyObject *)self, self->ptr,
                           (Py_ssize_t)self->len, 0, flags);
}

static PyBufferProcs tcpy_block_as_buffer = {
    .bf_getbuffer = (getbufferproc)tcpy_block_getbuffer,
};

static void tcpy_block_dealloc(MemBlockObject *self) {
  if (self->ptr) munmap(self->ptr, self->len);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject TcPy_MemBlock_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "torchcomms._comms._MemBlock",
    .tp_basicsize = sizeof(MemBlockObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Memory of MemAllocator.empty (page-aligned, zero-filled).",
    .tp_dealloc = (destructor)tcpy_block_dealloc,
    .tp_as_buffer = &tcpy_block_as_buffer,
};

/* A new block of nbytes (> 0), or NULL with MemoryError. */
static PyObject *tcpy_block_new(size_t nbytes) {
  void *p = mmap(NULL, nbytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    PyErr_Format(PyExc_MemoryError, "MemAllocator.empty: cannot map %zu "
                 "bytes: %s", nbytes, strerror(errno));
    return NULL;
  }
  MemBlockObject *b = PyObject_New(MemBlockObject, &TcPy_MemBlock_Type);
  if (!b) {
    munmap(p, nbytes);
    return NULL;
  }
  b->ptr = p;
  b->len = nbytes;
  return (PyObject *)b;
}

/* ======================================================================== */
/* MemAllocator                                                              */
/* ======================================================================== */

typedef struct MemAllocatorObject {
  PyObject_HEAD
  PyObject *backend; /* str */
} MemAllocatorObject;

/* size: an int or a sequence of ints -> a new tuple of non-negative ints
 * and their product in *numel. */
static PyObject *tcpy_shape(PyObject *size, size_t *numel) {
  PyObject *t = PyLong_Check(size) ? PyTuple_Pack(1, size)
                                   : PySequence_Tuple(size);
  if (!t) {
    if (PyErr_ExceptionMatches(PyExc_TypeError)) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError, "MemAllocator.empty: argument 'size' "
                   "must be an int or a sequence of ints, not %.100s",
                   Py_TYPE(size)->tp_name);
    }
    return NULL;
  }
  size_t n = 1;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(t); i++) {
    char an[32];
    int d;
    snprintf(an, sizeof an, "size[%zd]", i);
    if (tcpy_int(PyTuple_GET_ITEM(t, i), "MemAllocator.empty", an, &d) < 0) {
      Py_DECREF(t);
      return NULL;
    }
    if (d < 0) {
      PyErr_Format(PyExc_ValueError, "MemAllocator.empty: argument '%s' = %d "
                   "is negative", an, d);
      Py_DECREF(t);
      return NULL;
    }
    if (d && n > SIZE_MAX / (size_t)d) {
      PyErr_SetString(PyExc_ValueError, "MemAllocator.empty: the size is too "
                      "large");
      Py_DECREF(t);
      return NULL;
    }
    n *= (size_t)d;
  }
  *numel = n;
  return t;
}

static PyObject *tcpy_alloc_empty(MemAllocatorObject *self, PyObject *args,
                                  PyObject *kw) {
  static char *kwlist[] = {"size", "dtype", NULL};
  PyObject *size, *dtype = Py_None, *torch = NULL, *shape = NULL,
           *block = NULL, *flat = NULL, *res = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:empty", kwlist, &size,
                                   &dtype))
    return NULL;
  size_t numel;
  if (!(shape = tcpy_shape(size, &numel))) return NULL;
  if (!(torch = PyImport_ImportModule("torch"))) goto out;
  if (dtype == Py_None) {
    dtype = PyObject_CallMethod(torch, "get_default_dtype", NULL);
  } else {
    PyObject *dtype_cls = PyObject_GetAttrString(torch, "dtype");
    int ok = dtype_cls ? PyObject_IsInstance(dtype, dtype_cls) : -1;
    Py_XDECREF(dtype_cls);
    if (ok < 0) goto out;
    if (!ok) {
      PyErr_Format(PyExc_TypeError, "MemAllocator.empty: argument 'dtype' "
                   "must be a torch.dtype, not %.100s", Py_TYPE(dtype)->tp_name);
      goto out;
    }
    Py_INCREF(dtype);
  }
  if (!dtype) goto out;
  if (numel == 0) {
    /* nothing to map: an ordinary empty tensor of that shape */
    res = PyObject_CallMethod(torch, "empty", "O", shape);
    if (res) {
      PyObject *r2 = PyObject_CallMethod(res, "to", "O", dtype);
      Py_SETREF(res, r2);
    }
    Py_DECREF(dtype);
    goto out;
  }
  PyObject *isz = PyObject_GetAttrString(dtype, "itemsize");
  size_t itemsize = isz ? PyLong_AsSize_t(isz) : (size_t)-1;
  Py_XDECREF(isz);
  if (itemsize == (size_t)-1 || itemsize == 0) {
    if (!PyErr_Occurred())
      PyErr_Format(PyExc_ValueError, "MemAllocator.empty: dtype %R has no "
                   "item size", dtype);
    Py_DECREF(dtype);
    goto out;
  }
  if (numel > SIZE_MAX / itemsize) {
    PyErr_SetString(PyExc_ValueError, "MemAllocator.empty: the size is too "
                    "large");
    Py_DECREF(dtype);
    goto out;
  }
  if (!(block = tcpy_block_new(numel * itemsize))) {
    Py_DECREF(dtype);
    goto out;
  }
  /* torch.frombuffer keeps the block alive as long as the tensor's storage */
  PyObject *fb = PyObject_GetAttrString(torch, "frombuffer");
  PyObject *fargs = fb ? PyTuple_Pack(1, block) : NULL;
  PyObject *fkw = fargs ? Py_BuildValue("{sOsn}", "dtype", dtype, "count",
                                        (Py_ssize_t)numel)
                        : NULL;
  if (fkw) flat = PyObject_Call(fb, fargs, fkw);
  Py_XDECREF(fkw);
  Py_XDECREF(fargs);
  Py_XDECREF(fb);
  Py_DECREF(dtype);
  if (flat) res = PyObject_CallMethod(flat, "view", "O", shape);
out:
  Py_XDECREF(flat);
  Py_XDECREF(block);
  Py_XDECREF(shape);
  Py_XDECREF(torch);
  return res;
}

static PyObject *tcpy_alloc_get_backend(MemAllocatorObject *self, void *c) {
  return Py_NewRef(self->backend);
}

static PyObject *tcpy_alloc_get_device(MemAllocatorObject *self, void *c) {
  return tcpy_torch_device("cpu", -1);
}

static PyObject *tcpy_alloc_repr(MemAllocatorObject *self) {
  return PyUnicode_FromFormat("<torchcomms MemAllocator backend=%R device='cpu'>",
                              self->backend);
}

static void tcpy_alloc_dealloc(MemAllocatorObject *self) {
  Py_CLEAR(self->backend);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef tcpy_alloc_methods[] = {
    {"empty", (PyCFunction)(void (*)(void))tcpy_alloc_empty,
     METH_VARARGS | METH_KEYWORDS,
     "empty(size, dtype=None) -> torch.Tensor: a CPU tensor of that shape "
     "(an int or a sequence of ints) and dtype (None: torch's default) over "
     "page-aligned, zero-filled memory of its own, released with the "
     "tensor's storage."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef tcpy_alloc_getset[] = {
    {"backend", (getter)tcpy_alloc_get_backend, NULL,
     "the backend the allocator serves", NULL},
    {"device", (getter)tcpy_alloc_get_device, NULL,
     "torch.device('cpu')", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject TcPy_MemAllocator_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "torchcomms._comms.MemAllocator",
    .tp_basicsize = sizeof(MemAllocatorObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The cpu backend's memory allocator (get_mem_allocator): "
              "empty(size, dtype=None) makes tensors over page-aligned, "
              "zero-filled memory. torch.cuda.MemPool does not take it (CPU "
              "has no memory pools).",
    .tp_dealloc = (destructor)tcpy_alloc_dealloc,
    .tp_repr = (reprfunc)tcpy_alloc_repr,
    .tp_methods = tcpy_alloc_methods,
    .tp_getset = tcpy_alloc_getset,
};

/* The one cpu allocator (like torchcomms' global static per backend). */
static PyObject *tcpy_cpu_allocator;

/* The allocator of backend `name`, or NULL with RuntimeError. */
static PyObject *tcpy_allocator_for(const char *name, const char *op) {
  /* on CPU, torch's c10d names select the native cpu backend (new_comm) */
  if (strcmp(name, "cpu") && strcmp(name, "gloo") && strcmp(name, "torchcomms")) {
    PyErr_Format(PyExc_RuntimeError, "%s: No allocator factory registered "
                 "for backend: %s (this build provides a memory allocator "
                 "for the cpu backend only; on a GPU use that backend's own "
                 "allocator)", op, name);
    return NULL;
  }
  if (!tcpy_cpu_allocator) {
    MemAllocatorObject *a =
        PyObject_New(MemAllocatorObject, &TcPy_MemAllocator_Type);
    if (!a) return NULL;
    if (!(a->backend = PyUnicode_FromString("cpu"))) {
      a->backend = NULL;
      Py_DECREF(a);
      return NULL;
    }
    tcpy_cpu_allocator = (PyObject *)a;
  }
  return Py_NewRef(tcpy_cpu_allocator);
}

PyObject *tcpy_get_mem_allocator(PyObject *module, PyObject *args,
                                 PyObject *kw) {
  static char *kwlist[] = {"backend", NULL};
  const char *backend;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "s:get_mem_allocator", kwlist,
                                   &backend))
    return NULL;
  return tcpy_allocator_for(backend, "get_mem_allocator");
}

/* ======================================================================== */
/* TorchComm methods                                                         */
/* ======================================================================== */

static PyObject *tcpy_comm_get_mem_allocator(TorchCommObject *self,
                                             PyObject *u) {
  if (tcpy_comm_live(self, "get_mem_allocator") < 0) return NULL;
  return tcpy_allocator_for(tc_comm_backend(self->comm), "get_mem_allocator");
}

static PyObject *tcpy_comm_prop_mem_allocator(TorchCommObject *self, void *c) {
  return tcpy_comm_get_mem_allocator(self, NULL);
}

/* The registry key (the data pointer) and byte length of a tensor argument;
 * NULL with an exception. */
static PyObject *tcpy_reg_key(TorchCommObject *self, const char *op,
                              PyObject *tensor, size_t *nbytes) {
  if (tcpy_comm_live(self, op) < 0) return NULL;
  tcpy_tensor_t t;
  if (tcpy_tensor(&self->dev, op, "tensor", -1, tensor, &t) < 0) return NULL;
  *nbytes = t.numel * tc_dtype_size(t.dtype);
  return PyLong_FromVoidPtr(t.ptr);
}

static PyObject *tcpy_comm_tensor_register(TorchCommObject *self,
                                           PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"tensor", NULL};
  PyObject *tensor;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O:tensor_register", kwlist,
                                   &tensor))
    return NULL;
  size_t nbytes;
  PyObject *key = tcpy_reg_key(self, "tensor_register", tensor, &nbytes);
  if (!key) return NULL;
  if (!self->registered && !(self->registered = PyDict_New())) goto fail;
  /* value: [nbytes, how many times registered] */
  PyObject *v = PyDict_GetItemWithError(self->registered, key); /* borrowed */
  if (!v && PyErr_Occurred()) goto fail;
  if (v) {
    size_t had = PyLong_AsSize_t(PyList_GET_ITEM(v, 0));
    long n = PyLong_AsLong(PyList_GET_ITEM(v, 1));
    PyObject *len = PyLong_FromSize_t(nbytes > had ? nbytes : had);
    PyObject *cnt = PyLong_FromLong(n + 1);
    if (!len || !cnt) {
      Py_XDECREF(len);
      Py_XDECREF(cnt);
      goto fail;
    }
    PyList_SetItem(v, 0, len);
    PyList_SetItem(v, 1, cnt);
  } else {
    PyObject *entry = Py_BuildValue("[nl]", (Py_ssize_t)nbytes, 1L);
    if (!entry) goto fail;
    int rc = PyDict_SetItem(self->registered, key, entry);
    Py_DECREF(entry);
    if (rc < 0) goto fail;
  }
  Py_DECREF(key);
  Py_RETURN_NONE;
fail:
  Py_DECREF(key);
  return NULL;
}

static PyObject *tcpy_comm_tensor_deregister(TorchCommObject *self,
                                             PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"tensor", NULL};
  PyObject *tensor;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O:tensor_deregister", kwlist,
                                   &tensor))
    return NULL;
  size_t nbytes;
  PyObject *key = tcpy_reg_key(self, "tensor_deregister", tensor, &nbytes);
  if (!key) return NULL;
  PyObject *v = self->registered ? PyDict_GetItemWithError(self->registered, key)
                                 : NULL;
  if (!v) {
    if (!PyErr_Occurred())
      PyErr_Format(PyExc_RuntimeError,
                   "tensor_deregister on '%s' (rank %d of %d): the tensor's "
                   "memory (%zu bytes at %p) was not registered with "
                   "tensor_register on this communicator (or was already "
                   "deregistered); register it first, and deregister it once "
                   "per registration", tc_comm_name(self->comm),
                   tc_comm_rank(self->comm), tc_comm_size(self->comm), nbytes,
                   PyLong_AsVoidPtr(key));
    Py_DECREF(key);
    return NULL;
  }
  long n = PyLong_AsLong(PyList_GET_ITEM(v, 1));
  int rc;
  if (n > 1) {
    PyObject *cnt = PyLong_FromLong(n - 1);
    rc = cnt ? PyList_SetItem(v, 1, cnt) : -1;
  } else {
    rc = PyDict_DelItem(self->registered, key);
  }
  Py_DECREF(key);
  if (rc < 0) return NULL;
  Py_RETURN_NONE;
}

static PyObject *tcpy_comm_registered(TorchCommObject *self, PyObject *u) {
  PyObject *d = PyDict_New();
  if (!d || !self->registered) return d;
  PyObject *k, *v;
  Py_ssize_t pos = 0;
  while (PyDict_Next(self->registered, &pos, &k, &v)) {
    PyObject *t = PyTuple_Pack(2, PyList_GET_ITEM(v, 0), PyList_GET_ITEM(v, 1));
    if (!t || PyDict_SetItem(d, k, t) < 0) {
      Py_XDECREF(t);
      Py_DECREF(d);
      return NULL;
    }
    Py_DECREF(t);
  }
  return d;
}

PyMethodDef tcpy_comm_mem_methods[] = {
    {"tensor_register", (PyCFunction)(void (*)(void))tcpy_comm_tensor_register,
     METH_VARARGS | METH_KEYWORDS,
     "tensor_register(tensor): registers the tensor's memory with the "
     "communicator (local). On the cpu backend nothing is pinned (transports "
     "copy through their own buffers): the tensor is validated like an "
     "operation's argument and its memory range recorded, until "
     "tensor_deregister or finalize. Registering the same memory again "
     "counts; each registration needs one deregistration."},
    {"tensor_deregister",
     (PyCFunction)(void (*)(void))tcpy_comm_tensor_deregister,
     METH_VARARGS | METH_KEYWORDS,
     "tensor_deregister(tensor): undoes one tensor_register of the tensor's "
     "memory; RuntimeError if it is not registered."},
    {"_registered", (PyCFunction)tcpy_comm_registered, METH_NOARGS,
     "_registered() -> {data_ptr: (nbytes, count)}: the registered memory "
     "(for tests)."},
    {"get_mem_allocator", (PyCFunction)tcpy_comm_get_mem_allocator,
     METH_NOARGS,
     "get_mem_allocator() -> MemAllocator: the allocator of this "
     "communicator's backend (torchcomms.get_mem_allocator(backend))."},
    {NULL, NULL, 0, NULL},
};

PyGetSetDef tcpy_comm_mem_getset[] = {
    {"mem_allocator", (getter)tcpy_comm_prop_mem_allocator, NULL,
     "Deprecated alias of get_mem_allocator() (torchcomms keeps it for "
     "older callers).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

int tcpy_mem_ready(PyObject *m) {
  if (PyType_Ready(&TcPy_MemBlock_Type) < 0 ||
      PyType_Ready(&TcPy_MemAllocator_Type) < 0)
    return -1;
  return PyModule_AddObjectRef(m, "MemAllocator",
                               (PyObject *)&TcPy_MemAllocator_Type);
}

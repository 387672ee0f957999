/* _comms_tensor.c -- torch tensors as (pointer, element count, dtype), read
 * through Python attributes with interned names: no PyTorch headers. The
 * torch module, torch.Tensor and the dtypes are looked up on first use and
 * cached (never at import: torch may still be importing us). */
#include "_comms.h"

#include <stdio.h>
#include <string.h>

static PyObject *tcpy_torch;           /* the torch module */
static PyTypeObject *tcpy_Tensor;      /* torch.Tensor */
static PyObject *tcpy_device_cls;      /* torch.device */
static PyObject *tcpy_dtypes[TC_DTYPE_COUNT];

static const char *const tcpy_dtype_attr[TC_DTYPE_COUNT] = {
    [TC_FLOAT32] = "float32", [TC_FLOAT64] = "float64",
    [TC_FLOAT16] = "float16", [TC_BFLOAT16] = "bfloat16",
    [TC_INT8] = "int8",       [TC_UINT8] = "uint8",
    [TC_INT16] = "int16",     [TC_INT32] = "int32",
    [TC_INT64] = "int64",     [TC_BOOL] = "bool",
    [TC_FLOAT8_E4M3FN] = "float8_e4m3fn",
    [TC_FLOAT8_E5M2] = "float8_e5m2",
};
_Static_assert(sizeof tcpy_dtype_attr / sizeof tcpy_dtype_attr[0] ==
                   TC_DTYPE_COUNT, "a torch name for every dtype");

const char *tcpy_dtype_name(tc_dtype_t dt) {
  return (unsigned)dt < TC_DTYPE_COUNT ? tcpy_dtype_attr[dt] : "invalid";
}

/* Imports torch (normally already imported: the caller has tensors). */
static int tcpy_torch_load(void) {
  if (tcpy_Tensor) return 0;
  PyObject *torch = PyImport_ImportModule("torch");
  if (!torch) return -1;
  PyObject *tensor = PyObject_GetAttrString(torch, "Tensor");
  PyObject *device = tensor ? PyObject_GetAttrString(torch, "device") : NULL;
  if (!device) goto fail;
  if (!PyType_Check(tensor)) {
    PyErr_SetString(PyExc_ImportError, "torchcomms: torch.Tensor is not a type");
    goto fail;
  }
  PyObject *dts[TC_DTYPE_COUNT] = {0};
  for (int i = 0; i < TC_DTYPE_COUNT; i++) {
    dts[i] = PyObject_GetAttrString(torch, tcpy_dtype_attr[i]);
    if (!dts[i] && (i == TC_FLOAT8_E4M3FN || i == TC_FLOAT8_E5M2) &&
        PyErr_ExceptionMatches(PyExc_AttributeError)) {
      PyErr_Clear(); /* a torch without float8 types: never matched */
      continue;
    }
    if (!dts[i]) {
      for (int j = 0; j < i; j++) Py_XDECREF(dts[j]);
      goto fail;
    }
  }
  memcpy(tcpy_dtypes, dts, sizeof dts);
  tcpy_torch = torch;
  tcpy_device_cls = device;
  tcpy_Tensor = (PyTypeObject *)tensor; /* last: marks the cache complete */
  return 0;
fail:
  Py_XDECREF(device);
  Py_XDECREF(tensor);
  Py_DECREF(torch);
  return -1;
}

int tcpy_cuda_stream(int index, void **out) {
  static PyObject *current_stream; /* torch.cuda.current_stream */
  *out = NULL;
  if (!current_stream) {
    PyObject *cuda = PyImport_ImportModule("torch.cuda");
    if (!cuda) return -1;
    current_stream = PyObject_GetAttrString(cuda, "current_stream");
    Py_DECREF(cuda);
    if (!current_stream) return -1;
  }
  PyObject *s = index >= 0 ? PyObject_CallFunction(current_stream, "i", index)
                           : PyObject_CallNoArgs(current_stream);
  if (!s) return -1;
  PyObject *handle = PyObject_GetAttrString(s, "cuda_stream");
  Py_DECREF(s);
  if (!handle) return -1;
  void *p = PyLong_AsVoidPtr(handle);
  Py_DECREF(handle);
  if (!p && PyErr_Occurred()) return -1;
  *out = p; /* 0: the legacy default stream */
  return 0;
}

PyObject *tcpy_torch_device(const char *type, int index) {
  if (tcpy_torch_load() < 0) return NULL;
  if (index >= 0) return PyObject_CallFunction(tcpy_device_cls, "si", type, index);
  return PyObject_CallFunction(tcpy_device_cls, "s", type);
}

/* "arg" or "arg[idx]" */
static const char *tcpy_argname(char *buf, size_t n, const char *arg,
                                Py_ssize_t idx) {
  if (idx < 0) return arg;
  snprintf(buf, n, "%s[%zd]", arg, idx);
  return buf;
}

/* Calls a no-argument method returning bool; -1 on error. */
static int tcpy_call_bool(PyObject *obj, PyObject *name) {
  PyObject *r = PyObject_CallMethodNoArgs(obj, name);
  if (!r) return -1;
  int v = PyObject_IsTrue(r);
  Py_DECREF(r);
  return v;
}

/* Checks the tensor's device against the communicator's. */
static int tcpy_check_device(const tcpy_device_t *dev, const char *op,
                             const char *arg, PyObject *obj) {
  if (dev->type[0] == 'c' && !strcmp(dev->type, "cpu")) {
    /* fast path: one attribute instead of device + type */
    PyObject *is_cpu = PyObject_GetAttr(obj, tcpy_str.is_cpu);
    if (!is_cpu) return -1;
    int yes = is_cpu == Py_True;
    Py_DECREF(is_cpu);
    if (yes) return 0;
  }
  PyObject *d = PyObject_GetAttr(obj, tcpy_str.device);
  if (!d) return -1;
  int rc = -1;
  PyObject *type = PyObject_GetAttr(d, tcpy_str.type);
  if (!type) goto out;
  if (!PyUnicode_Check(type)) {
    PyErr_Format(PyExc_TypeError, "%s: argument '%s' has a device whose type "
                 "is not a str", op, arg);
    goto out;
  }
  int same = PyUnicode_CompareWithASCIIString(type, dev->type) == 0;
  if (same && dev->index >= 0 && strcmp(dev->type, "cpu") != 0) {
    PyObject *index = PyObject_GetAttr(d, tcpy_str.index);
    if (!index) goto out;
    long i = index == Py_None ? -1 : PyLong_AsLong(index);
    Py_DECREF(index);
    if (i == -1 && PyErr_Occurred()) goto out;
    same = i == dev->index;
  }
  if (!same) {
    if (dev->index >= 0)
      PyErr_Format(PyExc_ValueError,
                   "%s: argument '%s' is on device '%S' but the communicator's "
                   "device is '%s:%d'", op, arg, d, dev->type, dev->index);
    else
      PyErr_Format(PyExc_ValueError,
                   "%s: argument '%s' is on device '%S' but the communicator's "
                   "device is '%s'", op, arg, d, dev->type);
    goto out;
  }
  rc = 0;
out:
  Py_XDECREF(type);
  Py_DECREF(d);
  return rc;
}

int tcpy_tensor(const tcpy_device_t *dev, const char *op, const char *arg,
                Py_ssize_t idx, PyObject *obj, tcpy_tensor_t *out) {
  char nbuf[128];
  arg = tcpy_argname(nbuf, sizeof nbuf, arg, idx);
  if (tcpy_torch_load() < 0) return -1;
  if (!PyObject_TypeCheck(obj, tcpy_Tensor)) {
    PyErr_Format(PyExc_TypeError, "%s: argument '%s' must be a torch.Tensor, "
                 "not %.100s", op, arg, Py_TYPE(obj)->tp_name);
    return -1;
  }
  /* dtype */
  PyObject *dt = PyObject_GetAttr(obj, tcpy_str.dtype);
  if (!dt) return -1;
  int dtype = -1;
  for (int i = 0; i < TC_DTYPE_COUNT; i++)
    if (tcpy_dtypes[i] && dt == tcpy_dtypes[i]) {
      dtype = i;
      break;
    }
  if (dtype < 0) {
    PyErr_Format(PyExc_TypeError,
                 "%s: argument '%s' has dtype %S, which torchcomms does not "
                 "support (float32, float64, float16, bfloat16, "
                 "float8_e4m3fn, float8_e5m2, int8, uint8, int16, int32, "
                 "int64, bool)", op, arg, dt);
    Py_DECREF(dt);
    return -1;
  }
  Py_DECREF(dt);
  /* device, layout */
  if (tcpy_check_device(dev, op, arg, obj) < 0) return -1;
  int v = tcpy_call_bool(obj, tcpy_str.is_contiguous);
  if (v < 0) return -1;
  if (!v) {
    PyErr_Format(PyExc_ValueError, "%s: argument '%s' must be contiguous "
                 "(call .contiguous() first)", op, arg);
    return -1;
  }
  if ((v = tcpy_call_bool(obj, tcpy_str.is_conj)) < 0) return -1;
  if (v) {
    PyErr_Format(PyExc_ValueError, "%s: argument '%s' is a conjugate view "
                 "(call .resolve_conj() first)", op, arg);
    return -1;
  }
  if ((v = tcpy_call_bool(obj, tcpy_str.is_neg)) < 0) return -1;
  if (v) {
    PyErr_Format(PyExc_ValueError, "%s: argument '%s' is a negative view "
                 "(call .resolve_neg() first)", op, arg);
    return -1;
  }
  /* numel, data_ptr */
  PyObject *r = PyObject_CallMethodNoArgs(obj, tcpy_str.numel);
  if (!r) return -1;
  Py_ssize_t numel = PyLong_AsSsize_t(r);
  Py_DECREF(r);
  if (numel < 0) {
    if (!PyErr_Occurred())
      PyErr_Format(PyExc_ValueError, "%s: argument '%s' has a negative numel",
                   op, arg);
    return -1;
  }
  r = PyObject_CallMethodNoArgs(obj, tcpy_str.data_ptr);
  if (!r) return -1;
  void *ptr = PyLong_AsVoidPtr(r);
  Py_DECREF(r);
  if (!ptr && PyErr_Occurred()) return -1;
  if (!ptr && numel > 0) {
    PyErr_Format(PyExc_ValueError, "%s: argument '%s' has no storage "
                 "(data_ptr() is 0)", op, arg);
    return -1;
  }
  out->obj = obj;
  out->ptr = ptr;
  out->numel = (size_t)numel;
  out->dtype = (tc_dtype_t)dtype;
  return 0;
}

int tcpy_tensor_list(const tcpy_device_t *dev, const char *op, const char *arg,
                     PyObject *obj, Py_ssize_t expect, void ***ptrs,
                     size_t **counts, tc_dtype_t *dtype, PyObject **seq) {
  *ptrs = NULL;
  *counts = NULL;
  *seq = NULL;
  if (!PyList_Check(obj) && !PyTuple_Check(obj)) {
    PyErr_Format(PyExc_TypeError, "%s: argument '%s' must be a list of "
                 "tensors, not %.100s", op, arg, Py_TYPE(obj)->tp_name);
    return -1;
  }
  PyObject *t = PySequence_Tuple(obj);
  if (!t) return -1;
  Py_ssize_t n = PyTuple_GET_SIZE(t);
  if (expect >= 0 && n != expect) {
    PyErr_Format(PyExc_ValueError, "%s: argument '%s' has %zd tensors but the "
                 "communicator has %zd ranks", op, arg, n, expect);
    Py_DECREF(t);
    return -1;
  }
  void **p = PyMem_New(void *, (size_t)(n ? n : 1));
  size_t *c = PyMem_New(size_t, (size_t)(n ? n : 1));
  if (!p || !c) {
    PyErr_NoMemory();
    goto fail;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    tcpy_tensor_t x;
    if (tcpy_tensor(dev, op, arg, i, PyTuple_GET_ITEM(t, i), &x) < 0) goto fail;
    if (i == 0) {
      *dtype = x.dtype;
    } else if (x.dtype != *dtype) {
      PyErr_Format(PyExc_ValueError, "%s: argument '%s[%zd]' has dtype %s but "
                   "'%s[0]' has dtype %s (all must match)", op, arg, i,
                   tcpy_dtype_name(x.dtype), arg, tcpy_dtype_name(*dtype));
      goto fail;
    }
    p[i] = x.ptr;
    c[i] = x.numel;
  }
  *ptrs = p;
  *counts = c;
  *seq = t;
  return 0;
fail:
  PyMem_Free(p);
  PyMem_Free(c);
  Py_DECREF(t);
  return -1;
}

int tcpy_row_elems(const char *op, const char *arg, PyObject *obj,
                   size_t *rows, size_t *row) {
  PyObject *shape = PyObject_GetAttr(obj, tcpy_str.shape);
  if (!shape) return -1;
  PyObject *t = PySequence_Tuple(shape);
  Py_DECREF(shape);
  if (!t) return -1;
  Py_ssize_t nd = PyTuple_GET_SIZE(t);
  if (nd == 0) {
    PyErr_Format(PyExc_ValueError, "%s: argument '%s' must have at least one "
                 "dimension (split sizes count rows of dim 0)", op, arg);
    Py_DECREF(t);
    return -1;
  }
  size_t r = 1;
  for (Py_ssize_t i = 0; i < nd; i++) {
    Py_ssize_t d = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, i));
    if (d < 0) {
      Py_DECREF(t);
      if (!PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "%s: argument '%s' has a negative "
                     "dimension", op, arg);
      return -1;
    }
    if (i == 0) *rows = (size_t)d;
    else r *= (size_t)d;
  }
  Py_DECREF(t);
  *row = r;
  return 0;
}

/* _comms_tensor.c -- torch tensors as (pointer, element count, dtype), read
 * through Python attributes with interned names: no PyTorch headers. The
 * torch module, torch.Tensor and the dtypes are looked up on first use and
 * cached (never at import: torch may still be importing us).
 *
 * The per-operation path: a tensor whose type resolves dtype, is_cpu,
 * is_contiguous, is_neg, numel and data_ptr to torch._C.TensorBase's own
 * descriptors (torch.Tensor, nn.Parameter, any subclass that overrides none
 * of them) has them read by calling the descriptors' C functions directly,
 * the functions the attribute lookups would reach: the same reads, without
 * a method lookup and a bound call each (one 8-byte all_reduce spent half
 * of its Python-side time there). Which types qualify is checked once per
 * type and remembered with the type's version tag, which CPython changes on
 * any assignment to the type's or a base's attributes (a monkeypatched
 * torch.Tensor.data_ptr is seen). Other objects take the generic path.
 *
 * Faster still, for torch.Tensor and nn.Parameter objects on a CPU
 * communicator: torch's DLPack exchange table (DLPack 1.3's
 * `__dlpack_c_exchange_api__` capsule on torch.Tensor, a C ABI meant for
 * this) fills a DLTensor (data, device, dtype, shape, strides) in one C call
 * without Python objects; numel and contiguity (torch's rule: size-1 dims
 * ignored, empty tensors contiguous) are computed from shape and strides.
 * Fastest, on the torch releases checked (see "torch's C shim" below):
 * six of torch's own C functions of the tensor's at::Tensor (device,
 * layout, dtype, contiguity, numel, data pointer), about 120 instructions a
 * tensor against DLPack's 553, most of which is pybind11 taking the GIL the
 * caller already holds and a reference count taken and dropped. Neither
 * carries torch's negative bit, so is_neg() is still asked, once per
 * tensor object: see "Tensors known not to be negative views". Like
 * upstream torchcomms (pybind11's tensor caster), this read does not pass
 * through __torch_function__ modes. Whatever these cannot describe (other
 * devices, layouts, dtypes, errors) and every refusal go through the
 * generic path, which words the error. */
#include "_comms.h"
#include "private_api.h" /* tc__setting_bool_named, tc__log */

#include <dlfcn.h>
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

/* ---- DLPack exchange (see the top of the file) ---- */

/* The DLPack 1.3 structures used (dlpack.h; ABI-stable within major 1). */
typedef struct { int32_t device_type, device_id; } tcpy_dl_device_t;
typedef struct { uint8_t code, bits; uint16_t lanes; } tcpy_dl_dtype_t;
typedef struct {
  void *data;
  tcpy_dl_device_t device;
  int32_t ndim;
  tcpy_dl_dtype_t dtype;
  int64_t *shape, *strides;
  uint64_t byte_offset;
} tcpy_dl_tensor_t;
typedef struct tcpy_dl_api_header {
  uint32_t major, minor;
  struct tcpy_dl_api_header *prev_api;
} tcpy_dl_api_header_t;
typedef struct {
  tcpy_dl_api_header_t header;
  void *managed_tensor_allocator, *managed_tensor_from_py_object_no_sync,
      *managed_tensor_to_py_object_no_sync;
  int (*dltensor_from_py_object_no_sync)(void *py_object,
                                         tcpy_dl_tensor_t *out);
  void *current_work_stream;
} tcpy_dl_api_t;
_Static_assert(sizeof(tcpy_dl_tensor_t) == 48, "DLTensor is 48 bytes");
enum { TCPY_KDLCPU = 1 };

static PyObject *tcpy_dl_capsule;      /* keeps the table's owner alive */
static int (*tcpy_dl_read)(void *, tcpy_dl_tensor_t *); /* NULL: none */
static PyTypeObject *tcpy_Parameter;   /* torch.nn.Parameter or NULL */

/* Finds the table (DLPack major 1, minor >= 3, with the non-owning
 * export); leaves tcpy_dl_read NULL otherwise. Never fails. */
static void tcpy_dl_init(void) {
  PyObject *cap = PyObject_GetAttrString((PyObject *)tcpy_Tensor,
                                         "__dlpack_c_exchange_api__");
  const tcpy_dl_api_t *api =
      cap && PyCapsule_CheckExact(cap)
          ? PyCapsule_GetPointer(cap, "dlpack_exchange_api") : NULL;
  if (api && api->header.major == 1 && api->header.minor >= 3 &&
      api->dltensor_from_py_object_no_sync) {
    tcpy_dl_capsule = cap;
    tcpy_dl_read = api->dltensor_from_py_object_no_sync;
  } else {
    Py_XDECREF(cap);
  }
  PyObject *nn = PyObject_GetAttrString(tcpy_torch, "nn");
  PyObject *param = nn ? PyObject_GetAttrString(nn, "Parameter") : NULL;
  Py_XDECREF(nn);
  if (param && PyType_Check(param)) tcpy_Parameter = (PyTypeObject *)param;
  else Py_XDECREF(param);
  PyErr_Clear();
}

/* DLPack (code, bits) -> our dtype, or -1. */
static int tcpy_dl_dtype(tcpy_dl_dtype_t t) {
  if (t.lanes != 1) return -1;
  switch (t.code) {
  case 0: /* kDLInt */
    return t.bits == 8 ? TC_INT8 : t.bits == 16 ? TC_INT16
         : t.bits == 32 ? TC_INT32 : t.bits == 64 ? TC_INT64 : -1;
  case 1: return t.bits == 8 ? TC_UINT8 : -1;             /* kDLUInt */
  case 2: /* kDLFloat */
    return t.bits == 32 ? TC_FLOAT32 : t.bits == 64 ? TC_FLOAT64
         : t.bits == 16 ? TC_FLOAT16 : -1;
  case 4: return t.bits == 16 ? TC_BFLOAT16 : -1;         /* kDLBfloat */
  case 6: return t.bits == 8 ? TC_BOOL : -1;              /* kDLBool */
  case 10: return t.bits == 8 ? TC_FLOAT8_E4M3FN : -1;    /* kDLFloat8_e4m3fn */
  case 12: return t.bits == 8 ? TC_FLOAT8_E5M2 : -1;      /* kDLFloat8_e5m2 */
  default: return -1;
  }
}

/* DLPack's reading of obj: 1 with the data address, element count and our
 * dtype of a contiguous CPU tensor of a supported dtype, 0 for anything
 * else (the generic path decides and words the error). Never fails. */
static int tcpy_read_dl(PyObject *obj, void **ptr, int64_t *numel_out,
                        int *dt_out) {
  tcpy_dl_tensor_t d;
  int dt;
  if (!tcpy_dl_read) return 0;
  if (tcpy_dl_read(obj, &d) < 0) {
    PyErr_Clear();
    return 0;
  }
  if (d.device.device_type != TCPY_KDLCPU || d.ndim < 0 ||
      (dt = tcpy_dl_dtype(d.dtype)) < 0)
    return 0;
  /* numel, and torch's contiguity rule */
  int64_t numel = 1, expect = 1;
  int contiguous = 1;
  for (int32_t k = d.ndim - 1; k >= 0; k--) {
    int64_t size = d.shape[k];
    numel *= size;
    if (size != 1) {
      if (d.strides[k] != expect) contiguous = 0;
      expect *= size;
    }
  }
  if (numel == 0) contiguous = 1;
  if (!contiguous || numel < 0 || (numel && !d.data)) return 0;
  *ptr = numel ? (char *)d.data + d.byte_offset : d.data;
  *numel_out = numel;
  *dt_out = dt;
  return 1;
}

/* ---- torch's C shim (see the top of the file) ----
 * AOTInductor's C ABI (torch/csrc/inductor/aoti_torch/c/shim.h, exported
 * by libtorch_cpu.so): functions of an AtenTensorHandle, each returning 0
 * on success; behind the handle is an at::Tensor. A torch.Tensor object
 * (THPVariable, torch/csrc/autograd/python_variable.h) holds its at::Tensor
 * right after the object header: the handle is that field's address
 * (THPVariable_Unpack in C). Neither is part of torch's promises, so this
 * reading is used only on the torch releases whose headers were checked
 * (TCPY_AT_TORCH) and only after it read a set of probe tensors exactly
 * as DLPack does (tcpy_at_init); otherwise DLPack is the fast path. */
#define TCPY_AT_TORCH "2.13."
#define TCPY_AT_CODES 64 /* torch's ScalarType codes mapped (< 64) */
static struct {
  int state; /* 0 unset, 1 in use, -1 not */
  int32_t (*device_type)(void *, int32_t *);
  int32_t (*layout)(void *, int32_t *);
  int32_t (*dtype)(void *, int32_t *);
  int32_t (*is_contiguous)(void *, _Bool *);
  int32_t (*numel)(void *, int64_t *);
  int32_t (*data_ptr)(void *, void **);
  int32_t cpu, strided;
  int8_t ours[TCPY_AT_CODES]; /* torch's dtype code -> our dtype, or -1 */
} tcpy_at;

/* tcpy_read_dl through the shim. */
static int tcpy_read_at(PyObject *obj, void **ptr, int64_t *numel, int *dt) {
  void *h = (char *)obj + sizeof(PyObject); /* &THPVariable::cdata */
  int32_t v;
  _Bool contiguous;
  int64_t n;
  void *p;
  if (tcpy_at.device_type(h, &v) || v != tcpy_at.cpu ||
      tcpy_at.layout(h, &v) || v != tcpy_at.strided || tcpy_at.dtype(h, &v) ||
      (uint32_t)v >= TCPY_AT_CODES || tcpy_at.ours[v] < 0 ||
      tcpy_at.is_contiguous(h, &contiguous) || !contiguous ||
      tcpy_at.numel(h, &n) || n < 0 || tcpy_at.data_ptr(h, &p) || (n && !p))
    return 0;
  *ptr = p;
  *numel = n;
  *dt = tcpy_at.ours[v];
  return 1;
}

/* The shim's and DLPack's readings of probe tensor t agree (the address
 * where there are elements) and say `expect` (1: read, 0: refused). */
static int tcpy_at_probe(PyObject *t, int expect) {
  void *p1 = NULL, *p2 = NULL;
  int64_t n1 = -1, n2 = -1;
  int d1 = -1, d2 = -1;
  if (!t || (!Py_IS_TYPE(t, tcpy_Tensor) && !Py_IS_TYPE(t, tcpy_Parameter)))
    return 0;
  int a = tcpy_read_at(t, &p1, &n1, &d1), b = tcpy_read_dl(t, &p2, &n2, &d2);
  return a == expect && b == expect && (p1 == p2 || !n1) && n1 == n2 &&
         d1 == d2;
}

/* Decides whether tcpy_read_c uses the shim. Never fails. */
static void tcpy_at_init(void) {
  static const struct { const char *fn; int dt; } codes[] = {
      {"aoti_torch_dtype_float32", TC_FLOAT32},
      {"aoti_torch_dtype_float64", TC_FLOAT64},
      {"aoti_torch_dtype_float16", TC_FLOAT16},
      {"aoti_torch_dtype_bfloat16", TC_BFLOAT16},
      {"aoti_torch_dtype_int8", TC_INT8},
      {"aoti_torch_dtype_uint8", TC_UINT8},
      {"aoti_torch_dtype_int16", TC_INT16},
      {"aoti_torch_dtype_int32", TC_INT32},
      {"aoti_torch_dtype_int64", TC_INT64},
      {"aoti_torch_dtype_bool", TC_BOOL},
      {"aoti_torch_dtype_float8_e4m3fn", TC_FLOAT8_E4M3FN},
      {"aoti_torch_dtype_float8_e5m2", TC_FLOAT8_E5M2},
  };
  tcpy_at.state = -1;
  const char *why = NULL; /* why not, for TORCHCOMMS_LOG=info */
  void *lib = NULL;
  PyObject *ver = NULL;
  if (tc__setting_bool_named("TORCHCOMMS_PY_TENSOR_SHIM") != 1) {
    why = "TORCHCOMMS_PY_TENSOR_SHIM=0";
  } else if (!tcpy_dl_read) {
    why = "no DLPack exchange table to check the shim against";
  } else if (tcpy_Tensor->tp_basicsize <
             (Py_ssize_t)(sizeof(PyObject) + sizeof(void *))) {
    why = "torch.Tensor objects have no room for an at::Tensor";
  } else {
    ver = PyObject_GetAttrString(tcpy_torch, "__version__");
    const char *v = ver && PyUnicode_Check(ver) ? PyUnicode_AsUTF8(ver) : NULL;
    if (!v || strncmp(v, TCPY_AT_TORCH, strlen(TCPY_AT_TORCH)))
      why = "a torch release whose headers were not checked";
    /* held for the process's life: the functions are called until exit */
    else if (!(lib = dlopen("libtorch_cpu.so", RTLD_NOLOAD | RTLD_LAZY)))
      why = "libtorch_cpu.so is not loaded under that name";
  }
  Py_XDECREF(ver);
  PyErr_Clear();
  if (why) goto out;
#define TCPY_AT_SYM(field, name)                                               \
  (*(void **)&tcpy_at.field = dlsym(lib, name))
  int32_t (*cpu)(void) = NULL, (*strided)(void) = NULL;
  if (!TCPY_AT_SYM(device_type, "aoti_torch_get_device_type") ||
      !TCPY_AT_SYM(layout, "aoti_torch_get_layout") ||
      !TCPY_AT_SYM(dtype, "aoti_torch_get_dtype") ||
      !TCPY_AT_SYM(is_contiguous, "aoti_torch_is_contiguous") ||
      !TCPY_AT_SYM(numel, "aoti_torch_get_numel") ||
      !TCPY_AT_SYM(data_ptr, "aoti_torch_get_data_ptr") ||
      !(*(void **)&cpu = dlsym(lib, "aoti_torch_device_type_cpu")) ||
      !(*(void **)&strided = dlsym(lib, "aoti_torch_layout_strided"))) {
    why = "a shim function is missing";
    goto out;
  }
#undef TCPY_AT_SYM
  tcpy_at.cpu = cpu();
  tcpy_at.strided = strided();
  memset(tcpy_at.ours, -1, sizeof tcpy_at.ours);
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
    int32_t (*f)(void) = NULL;
    *(void **)&f = dlsym(lib, codes[i].fn);
    int32_t c = f ? f() : -1;
    if (c >= 0 && c < TCPY_AT_CODES) tcpy_at.ours[c] = (int8_t)codes[i].dt;
  }
  /* the probes: a view at an offset, a 2-d view, its transpose (refused),
   * an empty tensor, bfloat16, int64, a Parameter */
  PyObject *base = PyObject_CallMethod(tcpy_torch, "arange", "i", 24);
  PyObject *f32 = base ? PyObject_CallMethod(base, "float", NULL) : NULL;
  PyObject *sl = f32 ? PySequence_GetSlice(f32, 5, 17) : NULL;
  PyObject *m = sl ? PyObject_CallMethod(sl, "view", "ii", 3, 4) : NULL;
  PyObject *mt = m ? PyObject_CallMethod(m, "t", NULL) : NULL;
  PyObject *e = base ? PySequence_GetSlice(base, 3, 3) : NULL;
  PyObject *bf = PyObject_GetAttrString(tcpy_torch, "bfloat16");
  PyObject *b16 = bf && sl ? PyObject_CallMethod(sl, "to", "O", bf) : NULL;
  PyObject *par = tcpy_Parameter && f32
                      ? PyObject_CallFunctionObjArgs((PyObject *)tcpy_Parameter,
                                                     f32, NULL)
                      : NULL;
  int ok = tcpy_at_probe(base, 1) && tcpy_at_probe(sl, 1) &&
           tcpy_at_probe(m, 1) && tcpy_at_probe(mt, 0) &&
           tcpy_at_probe(e, 1) && tcpy_at_probe(b16, 1) &&
           tcpy_at_probe(par, 1);
  if (ok) tcpy_at.state = 1;
  else why = "a probe tensor read otherwise than through DLPack";
  Py_XDECREF(base);
  Py_XDECREF(f32);
  Py_XDECREF(sl);
  Py_XDECREF(m);
  Py_XDECREF(mt);
  Py_XDECREF(e);
  Py_XDECREF(bf);
  Py_XDECREF(b16);
  Py_XDECREF(par);
  PyErr_Clear();
out:
  if (why)
    tc__log(2, "python: torch tensors read through %s, not torch's C shim: %s",
            tcpy_dl_read ? "DLPack" : "their attributes", why);
  else
    tc__log(2, "python: torch tensors read through torch's C shim");
}

/* A torch.Tensor or nn.Parameter read in C: the shim where it is in use,
 * else DLPack (tcpy_read_dl). */
static int tcpy_read_c(PyObject *obj, void **ptr, int64_t *numel, int *dt) {
  if (tcpy_at.state > 0) return tcpy_read_at(obj, ptr, numel, dt);
  return tcpy_read_dl(obj, ptr, numel, dt);
}

/* ---- direct accessors (see the top of the file) ---- */

enum { TCPY_F_DTYPE, TCPY_F_IS_CPU, TCPY_F_IS_CONTIGUOUS, TCPY_F_IS_NEG,
       TCPY_F_NUMEL, TCPY_F_DATA_PTR, TCPY_F_COUNT };
static const char *const tcpy_fast_names[TCPY_F_COUNT] = {
    "dtype", "is_cpu", "is_contiguous", "is_neg", "numel", "data_ptr"};
/* getset descriptor (0) or the METH_* flags the method must have */
static const int tcpy_fast_flags[TCPY_F_COUNT] = {
    0, 0, METH_VARARGS | METH_KEYWORDS, METH_NOARGS, METH_NOARGS,
    METH_NOARGS};
#define TCPY_FAST_TYPES 4

static struct {
  int state;                        /* 0 unset, 1 ready, -1 unavailable */
  PyObject *descr[TCPY_F_COUNT];    /* torch.Tensor's, strong references */
  PyGetSetDef *dtype, *is_cpu;
  PyCFunction is_neg, numel, data_ptr;
  PyCFunctionWithKeywords is_contiguous;
  PyObject *noargs;                 /* () */
  /* types seen to resolve every name to descr[], with their version tag
   * then (strong references) */
  PyTypeObject *types[TCPY_FAST_TYPES];
  unsigned int tags[TCPY_FAST_TYPES];
  int next;                         /* the slot the next type replaces */
} tcpy_fast;

/* Takes torch.Tensor's descriptors; leaves state -1 (generic path only)
 * when one is not of the expected kind. Never fails. */
static void tcpy_fast_init(void) {
  tcpy_fast.state = -1;
  PyObject *d[TCPY_F_COUNT] = {0};
  for (int i = 0; i < TCPY_F_COUNT; i++) {
    d[i] = PyObject_GetAttrString((PyObject *)tcpy_Tensor, tcpy_fast_names[i]);
    int ok = d[i] != NULL;
    if (ok && tcpy_fast_flags[i] == 0)
      ok = Py_IS_TYPE(d[i], &PyGetSetDescr_Type) &&
           ((PyGetSetDescrObject *)d[i])->d_getset->get;
    else if (ok)
      ok = Py_IS_TYPE(d[i], &PyMethodDescr_Type) &&
           (((PyMethodDescrObject *)d[i])->d_method->ml_flags &
            (METH_VARARGS | METH_KEYWORDS | METH_NOARGS | METH_O |
             METH_FASTCALL)) == tcpy_fast_flags[i];
    if (!ok) {
      PyErr_Clear();
      for (int j = 0; j <= i; j++) Py_XDECREF(d[j]);
      return;
    }
  }
  PyObject *noargs = PyTuple_New(0);
  if (!noargs) {
    PyErr_Clear();
    for (int j = 0; j < TCPY_F_COUNT; j++) Py_DECREF(d[j]);
    return;
  }
  memcpy(tcpy_fast.descr, d, sizeof d);
  tcpy_fast.noargs = noargs;
  tcpy_fast.dtype = ((PyGetSetDescrObject *)d[TCPY_F_DTYPE])->d_getset;
  tcpy_fast.is_cpu = ((PyGetSetDescrObject *)d[TCPY_F_IS_CPU])->d_getset;
#define TCPY_METH(i) (((PyMethodDescrObject *)d[i])->d_method->ml_meth)
  tcpy_fast.is_contiguous =
      (PyCFunctionWithKeywords)(void (*)(void))TCPY_METH(TCPY_F_IS_CONTIGUOUS);
  tcpy_fast.is_neg = TCPY_METH(TCPY_F_IS_NEG);
  tcpy_fast.numel = TCPY_METH(TCPY_F_NUMEL);
  tcpy_fast.data_ptr = TCPY_METH(TCPY_F_DATA_PTR);
#undef TCPY_METH
  tcpy_fast.state = 1;
  tcpy_dl_init();
  tcpy_at_init();
}

const char *tcpy_tensor_reader(void) {
  if (tcpy_fast.state == 0) return "unset";
  return tcpy_at.state > 0 ? "shim" : tcpy_dl_read ? "dlpack" : "attributes";
}

/* 1 if obj's type resolves every accessor to torch.Tensor's descriptors
 * (remembered per type and version tag), else 0. Never fails. */
static int tcpy_fast_ok(PyObject *obj) {
  PyTypeObject *t = Py_TYPE(obj);
  if (tcpy_fast.state <= 0) {
    if (tcpy_fast.state < 0) return 0;
    tcpy_fast_init();
    if (tcpy_fast.state < 0) return 0;
  }
  for (int i = 0; i < TCPY_FAST_TYPES; i++)
    if (tcpy_fast.types[i] == t) {
      if ((t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) &&
          t->tp_version_tag == tcpy_fast.tags[i])
        return 1;
      Py_CLEAR(tcpy_fast.types[i]); /* changed since: look again below */
      break;
    }
  /* a new type, or one whose tag changed: resolve the names on it */
  for (int i = 0; i < TCPY_F_COUNT; i++) {
    PyObject *d = PyObject_GetAttrString((PyObject *)t, tcpy_fast_names[i]);
    int same = d == tcpy_fast.descr[i];
    Py_XDECREF(d);
    if (!same) {
      PyErr_Clear();
      return 0;
    }
  }
  /* the lookups gave t a version tag; without one, nothing is remembered */
  if (!(t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) || !t->tp_version_tag)
    return 1;
  int k = tcpy_fast.next;
  tcpy_fast.next = (k + 1) % TCPY_FAST_TYPES;
  Py_XSETREF(tcpy_fast.types[k], (PyTypeObject *)Py_NewRef(t));
  tcpy_fast.tags[k] = t->tp_version_tag;
  return 1;
}

/* The accessors, direct (fast) or through the attributes. */
static PyObject *tcpy_get_dtype(PyObject *obj, int fast) {
  return fast ? tcpy_fast.dtype->get(obj, tcpy_fast.dtype->closure)
              : PyObject_GetAttr(obj, tcpy_str.dtype);
}

static PyObject *tcpy_get_is_cpu(PyObject *obj, int fast) {
  return fast ? tcpy_fast.is_cpu->get(obj, tcpy_fast.is_cpu->closure)
              : PyObject_GetAttr(obj, tcpy_str.is_cpu);
}

static PyObject *tcpy_call_noargs(PyObject *obj, int fast, PyCFunction f,
                                  PyObject *name) {
  return fast ? f(obj, NULL) : PyObject_CallMethodNoArgs(obj, name);
}

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

/* A returned bool (NULL: the call failed) -> 1, 0 or -1. */
static int tcpy_bool_result(PyObject *r) {
  if (!r) return -1;
  int v = PyObject_IsTrue(r);
  Py_DECREF(r);
  return v;
}

/* Calls a no-argument method returning bool; -1 on error. */
static int tcpy_call_bool(PyObject *obj, PyObject *name) {
  return tcpy_bool_result(PyObject_CallMethodNoArgs(obj, name));
}

/* Checks the tensor's device against the communicator's. */
static int tcpy_check_device(const tcpy_device_t *dev, const char *op,
                             const char *arg, PyObject *obj, int fast) {
  if (dev->is_cpu) {
    /* fast path: one attribute instead of device + type */
    PyObject *is_cpu = tcpy_get_is_cpu(obj, fast);
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
  if (same && dev->index >= 0 && !dev->is_cpu) {
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

/* ---- Tensors known not to be negative views ----
 * torch's is_neg() drops and retakes the GIL around its C++ call: about
 * half of what reading a tensor costs here (1 rank, all_to_all_single of
 * 8 B, two tensors a call: 0.48-0.69 us a call asking each time, 0.34-0.38
 * without asking; docs/python_api.md, "Reading tensors"). So a tensor seen
 * not to be a negative view is remembered in a small table: a weak
 * reference to the object, and the data address, element count and dtype
 * DLPack gave then. A later call with the same object, still alive, with
 * the same address, count and dtype is taken to be no negative view
 * without asking. The negative bit of a live tensor changes only when its
 * metadata is replaced in place: `.data = v` or `set_(v)` with v a negative
 * view (torch.conj(...).imag of a complex tensor, or torch._neg_view), or
 * torch._C._set_neg. Such a v over the same memory, the same count and the
 * same dtype as before is the one case not seen; any other replacement
 * moves the address, count or dtype and is asked again. The table is
 * touched with the GIL held. */
#define TCPY_NOTNEG 8
static struct {
  PyObject *ref;   /* weak reference to the tensor (owned) */
  PyObject *obj;   /* the tensor's address, for a quick compare */
  void *data;
  int64_t numel;
  int dtype;       /* tc_dtype_t */
} tcpy_notneg[TCPY_NOTNEG];
static int tcpy_notneg_next; /* the entry replaced next */

/* 1 if entry i's object is obj and alive. */
static int tcpy_notneg_alive(int i, PyObject *obj) {
  if (tcpy_notneg[i].obj != obj || !tcpy_notneg[i].ref) return 0;
#if PY_VERSION_HEX >= 0x030D0000
  PyObject *o = NULL;
  if (PyWeakref_GetRef(tcpy_notneg[i].ref, &o) < 0) PyErr_Clear();
  Py_XDECREF(o); /* obj itself is held by the caller */
  return o == obj;
#else
  return PyWeakref_GET_OBJECT(tcpy_notneg[i].ref) == obj;
#endif
}

/* The entry of the object at address obj, or -1. At most one entry has a
 * given address (tcpy_notneg_add), alive or dead: a dead one is a freed
 * tensor whose address a new object now has. */
static int tcpy_notneg_find(PyObject *obj) {
  for (int i = 0; i < TCPY_NOTNEG; i++)
    if (tcpy_notneg[i].obj == obj) return i;
  return -1;
}

/* 1 if obj was seen with this data, count and dtype and was no negative
 * view then. */
static int tcpy_notneg_known(PyObject *obj, void *data, int64_t numel, int dt) {
  const int i = tcpy_notneg_find(obj);
  return i >= 0 && tcpy_notneg[i].data == data && tcpy_notneg[i].numel == numel &&
         tcpy_notneg[i].dtype == dt && tcpy_notneg_alive(i, obj);
}

/* Remembers obj (just asked: no negative view): in its own entry if it has
 * one, in the entry of a freed tensor that had its address (a view made
 * anew each call often lands where the last one was: it then takes one
 * entry, not one after another, and the live tensors keep theirs), else in
 * the next one. Never fails (a tensor that cannot be weakly referenced is asked
 * every time). */
static void tcpy_notneg_add(PyObject *obj, void *data, int64_t numel, int dt) {
  int i = tcpy_notneg_find(obj);
  if (i < 0 || !tcpy_notneg_alive(i, obj)) {
    PyObject *ref = PyWeakref_NewRef(obj, NULL);
    if (!ref) {
      PyErr_Clear();
      return;
    }
    if (i < 0) {
      i = tcpy_notneg_next;
      tcpy_notneg_next = (i + 1) % TCPY_NOTNEG;
    }
    Py_XSETREF(tcpy_notneg[i].ref, ref);
    tcpy_notneg[i].obj = obj;
  }
  tcpy_notneg[i].data = data;
  tcpy_notneg[i].numel = numel;
  tcpy_notneg[i].dtype = dt;
}

int tcpy_tensor(const tcpy_device_t *dev, const char *op, const char *arg,
                Py_ssize_t idx, PyObject *obj, tcpy_tensor_t *out) {
  char nbuf[128]; /* the argument's name, formatted only where it is used */
  if (tcpy_torch_load() < 0) return -1;
  if (!PyObject_TypeCheck(obj, tcpy_Tensor)) {
    arg = tcpy_argname(nbuf, sizeof nbuf, arg, idx);
    PyErr_Format(PyExc_TypeError, "%s: argument '%s' must be a torch.Tensor, "
                 "not %.100s", op, arg, Py_TYPE(obj)->tp_name);
    return -1;
  }
  int fast = tcpy_fast_ok(obj);
  if (fast && dev->is_cpu &&
      (Py_IS_TYPE(obj, tcpy_Tensor) || Py_IS_TYPE(obj, tcpy_Parameter))) {
    void *ptr;
    int64_t numel;
    int dt, neg = 0;
    if (tcpy_read_c(obj, &ptr, &numel, &dt)) {
      if (!tcpy_notneg_known(obj, ptr, numel, dt)) {
        neg = tcpy_bool_result(tcpy_fast.is_neg(obj, NULL));
        if (neg < 0) return -1;
        if (!neg) tcpy_notneg_add(obj, ptr, numel, dt);
      }
      if (!neg) {
        out->obj = obj;
        out->ptr = ptr;
        out->numel = (size_t)numel;
        out->dtype = (tc_dtype_t)dt;
        return 0;
      }
    }
    /* refused, or a negative view: the generic path below words it */
  }
  arg = tcpy_argname(nbuf, sizeof nbuf, arg, idx); /* for the errors below */
  /* dtype */
  PyObject *dt = tcpy_get_dtype(obj, fast);
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
  if (tcpy_check_device(dev, op, arg, obj, fast) < 0) return -1;
  int v = fast ? tcpy_bool_result(tcpy_fast.is_contiguous(
                     obj, tcpy_fast.noargs, NULL))
               : tcpy_call_bool(obj, tcpy_str.is_contiguous);
  if (v < 0) return -1;
  if (!v) {
    PyErr_Format(PyExc_ValueError, "%s: argument '%s' must be contiguous "
                 "(call .contiguous() first)", op, arg);
    return -1;
  }
  /* Only complex tensors carry the conjugate bit (TensorImpl::_set_conj
   * asserts it; torch refuses a dtype view of a conjugate one), and complex
   * dtypes were refused above: torch's own accessors skip the question. */
  if (!fast && (v = tcpy_call_bool(obj, tcpy_str.is_conj)) < 0) return -1;
  if (!fast && v) {
    PyErr_Format(PyExc_ValueError, "%s: argument '%s' is a conjugate view "
                 "(call .resolve_conj() first)", op, arg);
    return -1;
  }
  v = tcpy_bool_result(
      tcpy_call_noargs(obj, fast, tcpy_fast.is_neg, tcpy_str.is_neg));
  if (v < 0) return -1;
  if (v) {
    PyErr_Format(PyExc_ValueError, "%s: argument '%s' is a negative view "
                 "(call .resolve_neg() first)", op, arg);
    return -1;
  }
  /* numel, data_ptr */
  PyObject *r = tcpy_call_noargs(obj, fast, tcpy_fast.numel, tcpy_str.numel);
  if (!r) return -1;
  Py_ssize_t numel = PyLong_AsSsize_t(r);
  Py_DECREF(r);
  if (numel < 0) {
    if (!PyErr_Occurred())
      PyErr_Format(PyExc_ValueError, "%s: argument '%s' has a negative numel",
                   op, arg);
    return -1;
  }
  r = tcpy_call_noargs(obj, fast, tcpy_fast.data_ptr, tcpy_str.data_ptr);
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

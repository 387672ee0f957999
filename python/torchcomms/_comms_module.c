/* _comms_module.c -- the torchcomms._comms module: init, interned names, the
 * enums and option classes (imported from _comms_classes.py at init), error
 * mapping and the argument helpers shared by every operation.
 *
 * Import must be fast and side-effect free: torch.distributed imports this
 * package while torch itself is still being imported, so nothing here
 * touches `torch` (it is looked up on first use, see _comms_tensor.c). */
#include "_comms.h"

#include <string.h>

tcpy_names_t tcpy_str;
PyObject *tcpy_module;
PyObject *tcpy_RedOpType, *tcpy_WorkStatus, *tcpy_P2POpType;
PyObject *tcpy_CommOptions, *tcpy_timedelta;
PyObject *tcpy_redop_members[TC_REDOP_COUNT];
PyObject *tcpy_status_members[5];
PyObject *tcpy_p2p_members[2];

/* ---- errors ---- */

PyObject *tcpy_raise(int rc, const char *text) {
  PyObject *exc = PyExc_RuntimeError;
  if (rc == TC_ERR_INVALID_ARGUMENT) exc = PyExc_ValueError;
  else if (rc == TC_ERR_NOMEM) exc = PyExc_MemoryError;
  if (!text || !*text) text = tc_strerror(rc);
  PyErr_Format(exc, "%s", text);
  return NULL;
}

/* ---- argument helpers ---- */

int tcpy_seconds(PyObject *obj, const char *op, const char *arg, double dflt,
                 double *out) {
  if (!obj || obj == Py_None) {
    *out = dflt;
    return 0;
  }
  double s;
  if (PyFloat_Check(obj) || PyLong_Check(obj)) {
    s = PyFloat_AsDouble(obj);
    if (s == -1.0 && PyErr_Occurred()) return -1;
  } else if (PyObject_HasAttr(obj, tcpy_str.total_seconds)) {
    PyObject *v = PyObject_CallMethodNoArgs(obj, tcpy_str.total_seconds);
    if (!v) return -1;
    s = PyFloat_AsDouble(v);
    Py_DECREF(v);
    if (s == -1.0 && PyErr_Occurred()) return -1;
  } else {
    PyErr_Format(PyExc_TypeError,
                 "%s: argument '%s' must be a datetime.timedelta or a number "
                 "of seconds, not %.100s",
                 op, arg, Py_TYPE(obj)->tp_name);
    return -1;
  }
  if (!(s >= 0) || s > 1e12) {
    PyErr_Format(PyExc_ValueError,
                 "%s: argument '%s' must be a non-negative, finite duration "
                 "(got %R)", op, arg, obj);
    return -1;
  }
  *out = s;
  return 0;
}

int tcpy_hints(PyObject *hints, const char *op, tc_hint_t *small,
               size_t nsmall, tc_hint_t **out, size_t *n, PyObject **keep) {
  *out = NULL;
  *n = 0;
  *keep = NULL;
  if (!hints || hints == Py_None) return 0;
  if (!PyDict_Check(hints)) {
    PyErr_Format(PyExc_TypeError,
                 "%s: argument 'hints' must be a dict[str, str], not %.100s",
                 op, Py_TYPE(hints)->tp_name);
    return -1;
  }
  /* A snapshot: another thread may change the dict while we run. */
  PyObject *items = PyDict_Items(hints);
  if (!items) return -1;
  Py_ssize_t m = PyList_GET_SIZE(items);
  if (m == 0) {
    Py_DECREF(items);
    return 0;
  }
  tc_hint_t *h = (size_t)m <= nsmall ? small : PyMem_New(tc_hint_t, (size_t)m);
  if (!h) {
    Py_DECREF(items);
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t i = 0; i < m; i++) {
    PyObject *kv = PyList_GET_ITEM(items, i);
    PyObject *k = PyTuple_GET_ITEM(kv, 0), *v = PyTuple_GET_ITEM(kv, 1);
    if (!PyUnicode_Check(k) || !PyUnicode_Check(v)) {
      PyErr_Format(PyExc_TypeError,
                   "%s: argument 'hints' must map str to str (got %.100s: "
                   "%.100s)", op, Py_TYPE(k)->tp_name, Py_TYPE(v)->tp_name);
      goto fail;
    }
    h[i].key = PyUnicode_AsUTF8(k);
    h[i].value = PyUnicode_AsUTF8(v);
    if (!h[i].key || !h[i].value) goto fail;
  }
  *out = h;
  *n = (size_t)m;
  *keep = items;
  return 0;
fail:
  if (h != small) PyMem_Free(h);
  Py_DECREF(items);
  return -1;
}

int tcpy_opts_init(tcpy_opts_t *o, const char *op, PyObject *hints,
                   PyObject *timeout) {
  tc_op_options_t init = TC_OP_OPTIONS_INIT;
  o->o = init;
  o->hints = NULL;
  o->keep = NULL;
  if (tcpy_seconds(timeout, op, "timeout", 0.0, &o->o.timeout_s) < 0)
    return -1;
  size_t n = 0;
  if (tcpy_hints(hints, op, o->small, sizeof o->small / sizeof o->small[0],
                 &o->hints, &n, &o->keep) < 0)
    return -1;
  o->o.hints = o->hints;
  o->o.num_hints = n;
  return 0;
}

void tcpy_opts_free(tcpy_opts_t *o) {
  if (o->hints && o->hints != o->small) PyMem_Free(o->hints);
  o->hints = NULL;
  Py_CLEAR(o->keep);
}

/* Interns p's names; -1 on error. */
static int tcpy_params_init(tcpy_params_t *p) {
  int n = 0;
  while (p->names[n]) n++;
  if (n > TCPY_MAX_PARAMS) {
    PyErr_Format(PyExc_SystemError, "%s: too many parameters", p->fn);
    return -1;
  }
  for (int i = 0; i < n; i++)
    if (!p->kw[i] && !(p->kw[i] = PyUnicode_InternFromString(p->names[i])))
      return -1;
  p->n = n;
  return 0;
}

int tcpy_parse(tcpy_params_t *p, PyObject *const *args, Py_ssize_t nargs,
               PyObject *kwnames, PyObject **out) {
  if (!p->n && tcpy_params_init(p) < 0) return -1;
  int n = p->n;
  nargs = PyVectorcall_NARGS(nargs);
  Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  if (nargs + nkw > n) {
    PyErr_Format(PyExc_TypeError, "%s() takes at most %d argument%s (%zd "
                 "given)", p->fn, n, n == 1 ? "" : "s", nargs + nkw);
    return -1;
  }
  Py_ssize_t i = 0;
  for (; i < nargs; i++) out[i] = args[i];
  for (; i < n; i++) out[i] = NULL;
  for (Py_ssize_t k = 0; k < nkw; k++) {
    PyObject *name = PyTuple_GET_ITEM(kwnames, k);
    int j = 0;
    while (j < n && p->kw[j] != name) j++;
    if (j == n) {
      if (!PyUnicode_Check(name)) {
        PyErr_SetString(PyExc_TypeError, "keywords must be strings");
        return -1;
      }
      for (j = 0; j < n; j++) {
        int eq = PyUnicode_Compare(name, p->kw[j]);
        if (eq == -1 && PyErr_Occurred()) return -1;
        if (eq == 0) break;
      }
    }
    if (j == n) {
      PyErr_Format(PyExc_TypeError, "'%U' is an invalid keyword argument for "
                   "%s()", name, p->fn);
      return -1;
    }
    if (j < nargs) {
      PyErr_Format(PyExc_TypeError, "argument for %s() given by name ('%s') "
                   "and position (%d)", p->fn, p->names[j], j + 1);
      return -1;
    }
    out[j] = args[nargs + k];
  }
  for (int r = 0; r < p->required; r++)
    if (!out[r]) {
      PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s' "
                   "(pos %d)", p->fn, p->names[r], r + 1);
      return -1;
    }
  return 0;
}

int tcpy_flag(PyObject *obj, int dflt, int *out) {
  if (!obj) {
    *out = dflt;
    return 0;
  }
  int v = obj == Py_False ? 0 : obj == Py_True ? 1 : PyObject_IsTrue(obj);
  if (v < 0) return -1;
  *out = v;
  return 0;
}

int tcpy_int(PyObject *obj, const char *op, const char *arg, int *out) {
  if (!PyLong_Check(obj) && !PyIndex_Check(obj)) {
    PyErr_Format(PyExc_TypeError, "%s: argument '%s' must be an int, not %.100s",
                 op, arg, Py_TYPE(obj)->tp_name);
    return -1;
  }
  int overflow = 0;
  long v;
  if (PyLong_CheckExact(obj)) { /* the usual case (a root, a peer): no new reference */
    v = PyLong_AsLongAndOverflow(obj, &overflow);
  } else {
    PyObject *idx = PyNumber_Index(obj);
    if (!idx) return -1;
    v = PyLong_AsLongAndOverflow(idx, &overflow);
    Py_DECREF(idx);
  }
  if (v == -1 && PyErr_Occurred()) return -1;
  if (overflow || v < -2147483647L || v > 2147483647L) {
    PyErr_Format(PyExc_ValueError, "%s: argument '%s' = %R is out of range",
                 op, arg, obj);
    return -1;
  }
  *out = (int)v;
  return 0;
}

/* ---- the Python part: enums, option classes, Timeout ---- */

/* Imports torchcomms._comms_classes (the classes written in Python), hands
 * it the default timeout and exports its classes as this module's. */
static int tcpy_import_classes(PyObject *module) {
  int rc = -1;
  PyObject *g = NULL, *dflt = NULL, *secs = NULL, *names = NULL;
  PyObject *cls = PyImport_ImportModule("torchcomms._comms_classes");
  if (!cls) return -1;
  g = PyModule_GetDict(cls); /* borrowed */
  PyObject *td = PyDict_GetItemString(g, "Timeout");
  if (!td) {
    PyErr_SetString(PyExc_ImportError, "torchcomms._comms_classes has no Timeout");
    goto out;
  }
  if (!(secs = PyFloat_FromDouble(TC_DEFAULT_TIMEOUT_S)) ||
      !(dflt = PyObject_CallFunction(td, "(id)", 0, TC_DEFAULT_TIMEOUT_S)) ||
      PyObject_SetAttrString(cls, "DEFAULT_TIMEOUT", dflt) < 0 ||
      PyModule_AddObjectRef(module, "DEFAULT_TIMEOUT_SECONDS", secs) < 0)
    goto out;
  /* every name of its __all__ becomes this module's */
  PyObject *all = PyDict_GetItemString(g, "__all__");
  if (!(names = PySequence_Fast(all ? all : Py_None,
                                "torchcomms._comms_classes.__all__ must be a list")))
    goto out;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(names); i++) {
    PyObject *n = PySequence_Fast_GET_ITEM(names, i);
    PyObject *v = PyObject_GetAttr(cls, n);
    if (!v) goto out;
    int bad = PyObject_SetAttr(module, n, v);
    Py_DECREF(v);
    if (bad < 0) goto out;
  }
  tcpy_RedOpType = Py_NewRef(PyDict_GetItemString(g, "RedOpType"));
  tcpy_WorkStatus = Py_NewRef(PyDict_GetItemString(g, "WorkStatus"));
  tcpy_P2POpType = Py_NewRef(PyDict_GetItemString(g, "P2POpType"));
  tcpy_CommOptions = Py_NewRef(PyDict_GetItemString(g, "CommOptions"));
  tcpy_timedelta = Py_NewRef(PyDict_GetItemString(g, "Timeout"));
  /* Members by C value. RedOpType values follow the pyi's auto() order. */
  static const struct { int c; const char *name; } redops[] = {
      {TC_SUM, "SUM"}, {TC_PRODUCT, "PRODUCT"}, {TC_MIN, "MIN"},
      {TC_MAX, "MAX"}, {TC_BAND, "BAND"}, {TC_BOR, "BOR"}, {TC_BXOR, "BXOR"},
      {TC_AVG, "AVG"}, {TC_PREMUL_SUM, "PREMUL_SUM"}};
  for (size_t i = 0; i < sizeof redops / sizeof redops[0]; i++) {
    tcpy_redop_members[redops[i].c] =
        PyObject_GetAttrString(tcpy_RedOpType, redops[i].name);
    if (!tcpy_redop_members[redops[i].c]) goto out;
  }
  static const char *statuses[] = {"NOT_STARTED", "INPROGRESS", "COMPLETED",
                                   "TIMEDOUT", "ERROR"};
  for (int i = 0; i < 5; i++)
    if (!(tcpy_status_members[i] =
              PyObject_GetAttrString(tcpy_WorkStatus, statuses[i])))
      goto out;
  if (!(tcpy_p2p_members[0] = PyObject_GetAttrString(tcpy_P2POpType, "SEND")) ||
      !(tcpy_p2p_members[1] = PyObject_GetAttrString(tcpy_P2POpType, "RECV")))
    goto out;
  if (tcpy_hooks_init(g) < 0) goto out; /* OpName, the hook argument classes */
  rc = 0;
out:
  Py_XDECREF(names);
  Py_XDECREF(secs);
  Py_XDECREF(dflt);
  Py_DECREF(cls);
  return rc;
}

static int tcpy_intern_names(void) {
#define TCPY_INTERN(f)                                                         \
  if (!(tcpy_str.f = PyUnicode_InternFromString(#f))) return -1;
  TCPY_INTERN(data_ptr)
  TCPY_INTERN(numel)
  TCPY_INTERN(element_size)
  TCPY_INTERN(dtype)
  TCPY_INTERN(is_contiguous)
  TCPY_INTERN(is_conj)
  TCPY_INTERN(is_neg)
  TCPY_INTERN(device)
  TCPY_INTERN(type)
  TCPY_INTERN(index)
  TCPY_INTERN(shape)
  TCPY_INTERN(item)
  TCPY_INTERN(total_seconds)
  TCPY_INTERN(set)
  TCPY_INTERN(get)
  TCPY_INTERN(wait)
  TCPY_INTERN(add)
  TCPY_INTERN(check)
  TCPY_INTERN(delete_key)
  TCPY_INTERN(timeout)
  TCPY_INTERN(hints)
  TCPY_INTERN(is_cpu)
#undef TCPY_INTERN
  return 0;
}

/* ---- module ---- */

PyDoc_STRVAR(tcpy_new_comm_doc,
"new_comm(backend, device, name=None, abort_process_on_timeout_or_error=None,\n"
"         timeout=None, high_priority_stream=None, store=None,\n"
"         enable_reconfigure=False, hints=None, *, rank=None, size=None)\n"
"         -> TorchComm\n\n"
"torchcomms' argument order (name third). Its earlier order, name after\n"
"store (new_comm(backend, device, abort, timeout, store, name, ...)), is\n"
"taken when the third positional argument is not a str.\n"
"Creates a communicator over every rank of the job (collective). Rank and\n"
"world size come from the environment (TORCHCOMM_RANK/TORCHCOMM_SIZE,\n"
"torchrun's RANK/WORLD_SIZE, ...) unless `rank` and `size` are given\n"
"(together; for a communicator over some of the job's processes). `store`\n"
"may be any torch.distributed.Store; None bootstraps from\n"
"MASTER_ADDR/MASTER_PORT (or in-process for world size 1). On device cpu the\n"
"c10d backend names \"gloo\" and \"torchcomms\" select the native \"cpu\"\n"
"backend (torch.distributed's use_torchcomms path passes them).");

static PyObject *tcpy_tensor_reader_py(PyObject *m, PyObject *u) {
  return PyUnicode_FromString(tcpy_tensor_reader());
}

static PyMethodDef tcpy_module_methods[] = {
    {"new_comm", (PyCFunction)(void (*)(void))tcpy_new_comm,
     METH_VARARGS | METH_KEYWORDS, tcpy_new_comm_doc},
    {"get_mem_allocator", (PyCFunction)(void (*)(void))tcpy_get_mem_allocator,
     METH_VARARGS | METH_KEYWORDS,
     "get_mem_allocator(backend) -> MemAllocator: the memory allocator of "
     "`backend` (one per backend). cpu (and its c10d names gloo, "
     "torchcomms): a MemAllocator; other backends: RuntimeError."},
    {"_store_call", tcpy_store_call, METH_VARARGS,
     "_store_call(store, op, key_or_keys, arg=None, timeout=1.0): one call "
     "of the C store API (set/get/add/check/wait/delete) on a Python store "
     "through the adapter. For tests."},
    {"register_backend", (PyCFunction)(void (*)(void))tcpy_register_backend,
     METH_VARARGS | METH_KEYWORDS,
     "register_backend(name, backend_class): new_comm(name, ...) then creates "
     "communicators whose operations run backend_class's methods (a subclass "
     "of TorchCommBackend, instantiated with no arguments for each "
     "communicator). The first registration of a name stays: registering "
     "the same class again does nothing, another class warns "
     "(RuntimeWarning) and is ignored. A registration wins over an entry "
     "point and a C plugin of the same name (docs/backends.md)."},
    {"_is_backend_registered", (PyCFunction)(void (*)(void))tcpy_is_backend_registered,
     METH_VARARGS | METH_KEYWORDS,
     "_is_backend_registered(name) -> bool: True once a class is registered "
     "under name in this process (register_backend, or an entry point "
     "loaded by new_comm)."},
    {"_registered_backend", tcpy_registered_backend, METH_O,
     "_registered_backend(name) -> the class registered under name, or None."},
    {"_fr_dump_file", (PyCFunction)(void (*)(void))tcpy_fr_dump_file,
     METH_VARARGS | METH_KEYWORDS,
     "_fr_dump_file(path=None) -> str: writes the flight recorder trace of "
     "every live communicator of the process (torch's pickled dump) to path "
     "(None: <TORCH_FR_DUMP_TEMP_FILE><global rank>); returns the path "
     "written."},
    {"_tensor_reader", tcpy_tensor_reader_py, METH_NOARGS,
     "_tensor_reader() -> str: how torch.Tensor and nn.Parameter arguments "
     "of CPU communicators are read: 'shim' (torch's C shim functions), "
     "'dlpack' (torch's DLPack exchange table), 'attributes', or 'unset' "
     "before the first tensor (docs/python_api.md, \"Reading tensors\")."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef tcpy_moduledef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "torchcomms._comms",
    .m_doc = "torchcomms' C extension: communicators over libtorchcomms.",
    .m_size = -1,
    .m_methods = tcpy_module_methods,
};

static const char *tcpy_all_names[] = {
    "new_comm", "TorchComm", "TorchWork", "ReduceOp", "RedOpType",
    "WorkStatus", "P2POpType", "P2POp", "BatchSendRecv", "CommOptions",
    "SendOptions", "RecvOptions", "BatchP2POptions", "BroadcastOptions",
    "AllReduceOptions", "ReduceOptions", "AllGatherOptions",
    "AllGatherSingleOptions", "ReduceScatterOptions",
    "ReduceScatterSingleOptions", "AllToAllOptions", "AllToAllSingleOptions",
    "AllToAllvSingleOptions", "BarrierOptions", "ScatterOptions",
    "GatherOptions", "Timeout", "OpName", "RemovableHandle",
    "get_mem_allocator", "MemAllocator", "TorchCommBackend", "register_backend",
    "InitHandle", "ReconfigureOptions", "TorchCommWindow",
    "TorchCommWindowAttr", "TorchCommWinAccessType", "TorchCommlWinAccessType",
    NULL};

PyMODINIT_FUNC PyInit__comms(void) {
  PyObject *m = PyModule_Create(&tcpy_moduledef);
  if (!m) return NULL;
  tcpy_module = m;
  if (tcpy_intern_names() < 0 || tcpy_import_classes(m) < 0 ||
      tcpy_types_ready(m) < 0 || tcpy_pyb_init(m) < 0)
    goto fail;
  if (PyModule_AddStringConstant(m, "__version__", tc_version()) < 0)
    goto fail;
  PyObject *all = PyList_New(0);
  if (!all) goto fail;
  for (const char **n = tcpy_all_names; *n; n++) {
    PyObject *s = PyUnicode_FromString(*n);
    if (!s || PyList_Append(all, s) < 0) {
      Py_XDECREF(s);
      Py_DECREF(all);
      goto fail;
    }
    Py_DECREF(s);
  }
  /* and the hook argument classes (_comms_classes.py: *HookArgs) */
  PyObject *keys = PyObject_Dir(m);
  for (Py_ssize_t i = 0; keys && i < PyList_GET_SIZE(keys); i++) {
    PyObject *k = PyList_GET_ITEM(keys, i);
    const char *ks = PyUnicode_AsUTF8(k);
    size_t kl = ks ? strlen(ks) : 0;
    if (kl > 8 && !strcmp(ks + kl - 8, "HookArgs") && PyList_Append(all, k) < 0)
      Py_CLEAR(keys);
  }
  if (!keys) {
    Py_DECREF(all);
    goto fail;
  }
  Py_DECREF(keys);
  int rc = PyModule_AddObjectRef(m, "__all__", all);
  Py_DECREF(all);
  if (rc < 0) goto fail;
  return m;
fail:
  Py_DECREF(m);
  return NULL;
}

/* _comms_ft.c -- fault tolerance on TorchComm: get_init_handle,
 * reconfigure, is_abort_supported (tc_comm_reconfigure, torchcomms.h).
 *
 * torchcomms' reconfigure(uuid, init_handles, timeout=None, hints=None)
 * takes the handles as a list (rank i = the i-th handle) or a set (ranks
 * assigned: ours sorts the handles, so every member assigns the same
 * ranks); ours also takes a dict {handle: rank} (ranks 0..n-1, each once).
 * It blocks until the group is formed and returns a completed TorchWork. */
#include "_comms.h"

#include <stdlib.h>
#include <string.h>

#define FN "reconfigure"

PyObject *tcpy_comm_get_init_handle(TorchCommObject *self, PyObject *u) {
  (void)u;
  if (tcpy_comm_live(self, "get_init_handle") < 0) return NULL;
  char buf[TC_INIT_HANDLE_MAX];
  int rc = tc_comm_get_init_handle(self->comm, buf, sizeof buf);
  if (rc != TC_OK) return tcpy_raise(rc == TC_ERR_INVALID_ARGUMENT ? TC_ERR_INTERNAL : rc,
                                     tc_last_error());
  return PyUnicode_FromString(buf);
}

PyObject *tcpy_comm_is_abort_supported(TorchCommObject *self, PyObject *u) {
  (void)u;
  if (tcpy_comm_live(self, "is_abort_supported") < 0) return NULL;
  return PyBool_FromLong(tc_comm_is_abort_supported(self->comm) == 1);
}

/* One handle: a str (bytes are decoded). New reference in *out. */
static int handle_str(PyObject *h, Py_ssize_t i, PyObject **out) {
  if (PyUnicode_Check(h)) {
    *out = Py_NewRef(h);
    return 0;
  }
  if (PyBytes_Check(h)) {
    *out = PyUnicode_FromEncodedObject(h, "utf-8", "strict");
    return *out ? 0 : -1;
  }
  PyErr_Format(PyExc_TypeError,
               FN ": init_handles[%zd] must be a str (an InitHandle from "
               "get_init_handle()), not %.100s", i, Py_TYPE(h)->tp_name);
  return -1;
}

/* init_handles (list/tuple, set/frozenset, or dict handle -> rank) as a
 * list of str in rank order (new reference). */
static PyObject *ordered_handles(PyObject *obj) {
  PyObject *list = NULL;
  if (PyDict_Check(obj)) {
    Py_ssize_t n = PyDict_Size(obj), pos = 0;
    list = PyList_New(n);
    if (!list) return NULL;
    PyObject *k, *v;
    while (PyDict_Next(obj, &pos, &k, &v)) {
      long r = PyLong_Check(v) ? PyLong_AsLong(v) : -2;
      if (r == -1 && PyErr_Occurred()) goto fail;
      if (r < 0 || r >= n) {
        PyErr_Format(PyExc_ValueError,
                     FN ": init_handles maps a handle to rank %R; the ranks of a "
                     "dict must be the ints 0..%zd, each once", v, n - 1);
        goto fail;
      }
      if (PyList_GET_ITEM(list, r)) {
        PyErr_Format(PyExc_ValueError,
                     FN ": init_handles maps two handles to rank %ld; the ranks "
                     "of a dict must be 0..%zd, each once", r, n - 1);
        goto fail;
      }
      PyObject *s;
      if (handle_str(k, r, &s) < 0) goto fail;
      PyList_SET_ITEM(list, r, s);
    }
    return list;
  }
  int is_set = PyAnySet_Check(obj);
  if (is_set || PyList_Check(obj) || PyTuple_Check(obj)) {
    PyObject *items = PySequence_Fast(obj, FN ": init_handles");
    if (!items) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    list = PyList_New(n);
    if (!list) {
      Py_DECREF(items);
      return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
      PyObject *s;
      if (handle_str(PySequence_Fast_GET_ITEM(items, i), i, &s) < 0) {
        Py_DECREF(items);
        goto fail;
      }
      PyList_SET_ITEM(list, i, s);
    }
    Py_DECREF(items);
    /* a set: every member assigns the same ranks, in sorted order */
    if (is_set && PyList_Sort(list) < 0) goto fail;
    return list;
  }
  PyErr_Format(PyExc_TypeError,
               FN ": init_handles must be a list (rank i = the i-th handle), a "
               "set, or a dict {handle: rank}, not %.100s", Py_TYPE(obj)->tp_name);
  return NULL;
fail:
  Py_XDECREF(list);
  return NULL;
}

PyObject *tcpy_comm_reconfigure(TorchCommObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"uuid", "init_handles", "timeout", "hints", NULL};
  PyObject *uuid_obj, *handles_obj, *timeout = Py_None, *hints = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|OO:reconfigure", kwlist, &uuid_obj,
                                   &handles_obj, &timeout, &hints))
    return NULL;
  if (tcpy_comm_live(self, FN) < 0) return NULL;
  if (!PyLong_Check(uuid_obj) || PyBool_Check(uuid_obj)) {
    PyErr_Format(PyExc_TypeError, FN ": argument 'uuid' must be an int, not %.100s",
                 Py_TYPE(uuid_obj)->tp_name);
    return NULL;
  }
  long long uuid = PyLong_AsLongLong(uuid_obj);
  if (uuid == -1 && PyErr_Occurred()) return NULL;
  tc_reconfigure_options_t o = TC_RECONFIGURE_OPTIONS_INIT;
  o.uuid = (int64_t)uuid;
  if (tcpy_seconds(timeout, FN, "timeout", 0.0, &o.timeout_s) < 0) return NULL;
  PyObject *list = ordered_handles(handles_obj), *keep = NULL, *result = NULL;
  if (!list) return NULL;
  Py_ssize_t n = PyList_GET_SIZE(list);
  const char **cs = PyMem_Calloc(n ? (size_t)n : 1, sizeof *cs);
  tc_hint_t small[8], *h = NULL;
  size_t nh = 0;
  if (!cs) {
    PyErr_NoMemory();
    goto out;
  }
  for (Py_ssize_t i = 0; i < n; i++)
    if (!(cs[i] = PyUnicode_AsUTF8(PyList_GET_ITEM(list, i)))) goto out;
  if (tcpy_hints(hints, FN, small, 8, &h, &nh, &keep) < 0) goto out;
  o.init_handles = cs;
  o.num_handles = (size_t)n;
  o.hints = h;
  o.num_hints = nh;
  tc_work_t *work = NULL;
  char text[1024] = "";
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = tc_comm_reconfigure(self->comm, &o, &work);
  if (rc != TC_OK) snprintf(text, sizeof text, "%s", tc_last_error());
  Py_END_ALLOW_THREADS
  tcpy_comm_reap(self); /* works of the dropped configuration */
  if (rc != TC_OK) {
    /* torchcomms raises RuntimeError for every reconfigure failure (a bad
     * list included) */
    PyErr_SetString(PyExc_RuntimeError, text[0] ? text : tc_strerror(rc));
    goto out;
  }
  result = tcpy_work_new(work, NULL);
out:
  if (h && h != small) PyMem_Free(h);
  Py_XDECREF(keep);
  PyMem_Free(cs);
  Py_DECREF(list);
  return result;
}

/* _comms_store.c -- any Python torch.distributed.Store (TCPStore,
 * PrefixStore, FileStore, HashStore, or a duck-typed object) as a C store.
 *
 * The library calls the vtable from whatever thread needs the store (the
 * thread creating a communicator, with the GIL released, or a backend
 * thread): every callback takes the GIL with PyGILState_Ensure. A Python
 * exception becomes a C error whose text carries the exception (a timeout in
 * wait -> TC_ERR_TIMEOUT). The context holds a strong reference to the store
 * object, dropped (with the GIL) when the C store's last reference goes.
 *
 * Waiting (get and wait with a timeout) polls store.check and sleeps between
 * polls without the GIL, and calls store.wait only once the keys are there
 * or the time is up (for the store's own timeout error). It never blocks in
 * store.wait while the keys are missing: torch's TCPStore client holds a
 * per-object mutex across a whole wait/get, and several ranks of one
 * communicator running as threads of one process share that object (through
 * their PrefixStores), so a rank blocked there waiting for a key would keep
 * the rank that sets the key out of the store until its timeout. */
#include "_comms.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "private_api.h" /* tc__set_error_text, tc__store_create_ext */

typedef struct tcpy_store_ctx {
  PyObject *store;
} tcpy_store_ctx_t;

/* Turns the pending Python exception into the thread's C error. GIL held. */
static int tcpy_store_fail(const char *op, const char *key) {
#if PY_VERSION_HEX >= 0x030C0000
  PyObject *value = PyErr_GetRaisedException();
#else
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  Py_XDECREF(type);
  Py_XDECREF(tb);
#endif
  PyObject *etype = value ? (PyObject *)Py_TYPE(value) : NULL;
  const char *tname = etype ? ((PyTypeObject *)etype)->tp_name : "error";
  PyObject *s = value ? PyObject_Str(value) : NULL;
  const char *msg = s ? PyUnicode_AsUTF8(s) : NULL;
  if (!msg) {
    PyErr_Clear();
    msg = "(no message)";
  }
  int rc = TC_ERR_STORE;
  if (etype && PyErr_GivenExceptionMatches(etype, PyExc_TimeoutError))
    rc = TC_ERR_TIMEOUT;
  if (rc != TC_ERR_TIMEOUT) {
    /* torch's stores raise DistStoreError("... timeout ...") on timeouts */
    char low[256];
    size_t n = strlen(msg) < sizeof low - 1 ? strlen(msg) : sizeof low - 1;
    for (size_t i = 0; i < n; i++)
      low[i] = (char)(msg[i] >= 'A' && msg[i] <= 'Z' ? msg[i] + 32 : msg[i]);
    low[n] = 0;
    if (strstr(low, "timeout") || strstr(low, "timed out") ||
        strstr(tname, "Timeout"))
      rc = TC_ERR_TIMEOUT;
  }
  char text[1024];
  snprintf(text, sizeof text,
           "torchcomms: store %s('%s') failed in the Python store: %s: %s", op,
           key, tname, msg);
  Py_XDECREF(s);
  Py_XDECREF(value);
  return tc__set_error_text(rc, text);
}

/* Reports a store used while the interpreter shuts down. */
static int tcpy_store_gone(const char *op, const char *key) {
  char text[256];
  snprintf(text, sizeof text,
           "torchcomms: store %s('%s'): the Python interpreter is shutting "
           "down", op, key);
  return tc__set_error_text(TC_ERR_STORE, text);
}

#define TCPY_STORE_ENTER(op, key)                                              \
  if (TCPY_FINALIZING()) return tcpy_store_gone(op, key);                      \
  PyGILState_STATE gil = PyGILState_Ensure();                                  \
  tcpy_store_ctx_t *c = ctx;                                                   \
  int rc = TC_OK

#define TCPY_STORE_LEAVE()                                                     \
  PyGILState_Release(gil);                                                     \
  return rc

static PyObject *tcpy_keylist(const char *const *keys, size_t n) {
  PyObject *l = PyList_New((Py_ssize_t)n);
  if (!l) return NULL;
  for (size_t i = 0; i < n; i++) {
    PyObject *k = PyUnicode_DecodeUTF8(keys[i], (Py_ssize_t)strlen(keys[i]),
                                       "surrogateescape");
    if (!k) {
      Py_DECREF(l);
      return NULL;
    }
    PyList_SET_ITEM(l, (Py_ssize_t)i, k);
  }
  return l;
}

static PyObject *tcpy_key(const char *key) {
  return PyUnicode_DecodeUTF8(key, (Py_ssize_t)strlen(key), "surrogateescape");
}

static int tcpy_store_set(void *ctx, const char *key, const void *value,
                          size_t len) {
  TCPY_STORE_ENTER("set", key);
  PyObject *k = tcpy_key(key);
  PyObject *v = k ? PyBytes_FromStringAndSize(value, (Py_ssize_t)len) : NULL;
  PyObject *r = v ? PyObject_CallMethodObjArgs(c->store, tcpy_str.set, k, v,
                                               NULL)
                  : NULL;
  if (!r) rc = tcpy_store_fail("set", key);
  Py_XDECREF(r);
  Py_XDECREF(v);
  Py_XDECREF(k);
  TCPY_STORE_LEAVE();
}

/* store.wait(keys, timedelta(seconds=timeout_s)); a zero timeout checks
 * (torch treats a zero wait timeout as "no timeout"). GIL held. */
static int tcpy_store_wait_locked(tcpy_store_ctx_t *c, const char *const *keys,
                                  size_t nkeys, double timeout_s);

/* Waits up to timeout_s for keys without blocking in the store (see the top
 * of the file): polls store.check, the GIL taken for each check only,
 * sleeping 50 us doubling to 10 ms between polls; then store.wait with the
 * time left (at least 1 ms), which returns at once when the keys are there
 * and otherwise raises the store's own timeout error. GIL held (released
 * while sleeping). */
static int tcpy_store_poll_locked(tcpy_store_ctx_t *c, const char *const *keys,
                                  size_t nkeys, double timeout_s) {
  if (timeout_s <= 0) return tcpy_store_wait_locked(c, keys, nkeys, 0);
  double deadline = tc__now() + timeout_s, nap = 50e-6;
  PyObject *l = tcpy_keylist(keys, nkeys);
  if (!l) return tcpy_store_fail("wait", keys[0]);
  for (;;) {
    PyObject *r = PyObject_CallMethodOneArg(c->store, tcpy_str.check, l);
    int ready = r ? PyObject_IsTrue(r) : -1;
    Py_XDECREF(r);
    if (ready < 0) {
      Py_DECREF(l);
      return tcpy_store_fail("wait", keys[0]);
    }
    double left = deadline - tc__now();
    if (ready || left <= 0) break;
    double t = nap < left ? nap : left;
    struct timespec ts = {(time_t)t, (long)((t - (double)(time_t)t) * 1e9)};
    Py_BEGIN_ALLOW_THREADS /* other threads run, and may set the keys */
    nanosleep(&ts, NULL);
    Py_END_ALLOW_THREADS
    nap = nap * 2 < 10e-3 ? nap * 2 : 10e-3;
  }
  Py_DECREF(l);
  double left = deadline - tc__now();
  return tcpy_store_wait_locked(c, keys, nkeys, left > 1e-3 ? left : 1e-3);
}

static int tcpy_store_wait_locked(tcpy_store_ctx_t *c, const char *const *keys,
                                  size_t nkeys, double timeout_s) {
  PyObject *l = tcpy_keylist(keys, nkeys);
  if (!l) return tcpy_store_fail("wait", keys[0]);
  PyObject *r;
  if (timeout_s <= 0) {
    r = PyObject_CallMethodOneArg(c->store, tcpy_str.check, l);
    if (r) {
      int ready = PyObject_IsTrue(r);
      Py_DECREF(r);
      Py_DECREF(l);
      if (ready < 0) return tcpy_store_fail("wait", keys[0]);
      if (!ready) {
        char text[512];
        snprintf(text, sizeof text,
                 "torchcomms: store wait('%s'): the key is not set (no time "
                 "left to wait)", keys[0]);
        return tc__set_error_text(TC_ERR_TIMEOUT, text);
      }
      return TC_OK;
    }
  } else {
    PyObject *td = PyObject_CallFunction(tcpy_timedelta, "(id)", 0, timeout_s);
    r = td ? PyObject_CallMethodObjArgs(c->store, tcpy_str.wait, l, td, NULL)
           : NULL;
    Py_XDECREF(td);
  }
  Py_DECREF(l);
  if (!r) return tcpy_store_fail("wait", keys[0]);
  Py_DECREF(r);
  return TC_OK;
}

static int tcpy_store_get(void *ctx, const char *key, void **value,
                          size_t *len, double timeout_s) {
  TCPY_STORE_ENTER("get", key);
  *value = NULL;
  *len = 0;
  rc = tcpy_store_poll_locked(c, &key, 1, timeout_s);
  if (rc == TC_OK) {
    PyObject *k = tcpy_key(key);
    PyObject *r = k ? PyObject_CallMethodOneArg(c->store, tcpy_str.get, k)
                    : NULL;
    Py_XDECREF(k);
    char *buf = NULL;
    Py_ssize_t n = 0;
    if (!r) {
      rc = tcpy_store_fail("get", key);
    } else if (PyBytes_AsStringAndSize(r, &buf, &n) < 0) {
      rc = tcpy_store_fail("get", key);
    } else {
      void *copy = malloc(n ? (size_t)n : 1);
      if (!copy) {
        rc = tc__set_error_text(TC_ERR_NOMEM,
                                "torchcomms: store get: out of memory");
      } else {
        memcpy(copy, buf, (size_t)n);
        *value = copy;
        *len = (size_t)n;
      }
    }
    Py_XDECREF(r);
  }
  TCPY_STORE_LEAVE();
}

static int tcpy_store_add(void *ctx, const char *key, int64_t delta,
                          int64_t *result) {
  TCPY_STORE_ENTER("add", key);
  PyObject *k = tcpy_key(key);
  PyObject *d = k ? PyLong_FromLongLong((long long)delta) : NULL;
  PyObject *r = d ? PyObject_CallMethodObjArgs(c->store, tcpy_str.add, k, d,
                                               NULL)
                  : NULL;
  if (r) {
    long long v = PyLong_AsLongLong(r);
    if (v == -1 && PyErr_Occurred()) rc = tcpy_store_fail("add", key);
    else *result = (int64_t)v;
  } else {
    rc = tcpy_store_fail("add", key);
  }
  Py_XDECREF(r);
  Py_XDECREF(d);
  Py_XDECREF(k);
  TCPY_STORE_LEAVE();
}

static int tcpy_store_check(void *ctx, const char *const *keys, size_t nkeys,
                            int *ready) {
  TCPY_STORE_ENTER("check", keys[0]);
  *ready = 0;
  PyObject *l = tcpy_keylist(keys, nkeys);
  PyObject *r = l ? PyObject_CallMethodOneArg(c->store, tcpy_str.check, l)
                  : NULL;
  int v = r ? PyObject_IsTrue(r) : -1;
  if (v < 0) rc = tcpy_store_fail("check", keys[0]);
  else *ready = v;
  Py_XDECREF(r);
  Py_XDECREF(l);
  TCPY_STORE_LEAVE();
}

static int tcpy_store_delete(void *ctx, const char *key, int *deleted) {
  TCPY_STORE_ENTER("delete_key", key);
  *deleted = 0;
  PyObject *k = tcpy_key(key);
  PyObject *r = k ? PyObject_CallMethodOneArg(c->store, tcpy_str.delete_key, k)
                  : NULL;
  int v = r ? PyObject_IsTrue(r) : -1;
  if (v < 0) rc = tcpy_store_fail("delete_key", key);
  else *deleted = v;
  Py_XDECREF(r);
  Py_XDECREF(k);
  TCPY_STORE_LEAVE();
}

static int tcpy_store_wait(void *ctx, const char *const *keys, size_t nkeys,
                           double timeout_s) {
  TCPY_STORE_ENTER("wait", keys[0]);
  rc = tcpy_store_poll_locked(c, keys, nkeys, timeout_s);
  TCPY_STORE_LEAVE();
}

static void tcpy_store_destroy(void *ctx) {
  tcpy_store_ctx_t *c = ctx;
  if (!TCPY_FINALIZING()) { /* else leak: Python objects are going away */
    PyGILState_STATE gil = PyGILState_Ensure();
    Py_CLEAR(c->store);
    PyGILState_Release(gil);
  }
  free(c);
}

static const tc_store_vtable_t tcpy_store_vtable = {
    .size = sizeof(tc_store_vtable_t),
    .version = 1,
    .set = tcpy_store_set,
    .get = tcpy_store_get,
    .add = tcpy_store_add,
    .check = tcpy_store_check,
    .delete_key = tcpy_store_delete,
    .destroy = tcpy_store_destroy,
};

static const tc__store_ext_t tcpy_store_ext = {
    .wait = tcpy_store_wait,
    .local_addr = NULL,
    .kind = "python",
};

int tcpy_store_wrap(PyObject *store, tc_store_t **out) {
  static const char *methods[] = {"set", "get", "wait", "add", "check",
                                  "delete_key", NULL};
  for (const char **m = methods; *m; m++)
    if (!PyObject_HasAttrString(store, *m)) {
      PyErr_Format(PyExc_TypeError,
                   "new_comm: argument 'store' must be a "
                   "torch.distributed.Store (%.100s has no method '%s')",
                   Py_TYPE(store)->tp_name, *m);
      return -1;
    }
  tcpy_store_ctx_t *c = malloc(sizeof *c);
  if (!c) {
    PyErr_NoMemory();
    return -1;
  }
  c->store = Py_NewRef(store);
  int rc = tc__store_create_ext(&tcpy_store_vtable, &tcpy_store_ext, c, out);
  if (rc != TC_OK) {
    Py_DECREF(c->store);
    free(c);
    tcpy_raise(rc, tc_last_error());
    return -1;
  }
  return 0;
}

/* ---- _store_call: drives the adapter through the C store API (tests) ---- */

PyObject *tcpy_store_call(PyObject *module, PyObject *args) {
  PyObject *store, *a1, *a2 = Py_None;
  const char *op;
  double timeout = 1.0;
  if (!PyArg_ParseTuple(args, "OsO|Od:_store_call", &store, &op, &a1, &a2,
                        &timeout))
    return NULL;
  tc_store_t *s;
  if (tcpy_store_wrap(store, &s) < 0) return NULL;
  PyObject *keys = NULL, *res = NULL;
  const char *key = NULL, *kv[16];
  size_t nk = 0;
  if (PyUnicode_Check(a1)) {
    if (!(key = PyUnicode_AsUTF8(a1))) goto out;
  } else {
    if (!(keys = PySequence_Tuple(a1))) goto out;
    nk = (size_t)PyTuple_GET_SIZE(keys);
    if (nk > 16) {
      PyErr_SetString(PyExc_ValueError, "_store_call: at most 16 keys");
      goto out;
    }
    for (size_t i = 0; i < nk; i++)
      if (!(kv[i] = PyUnicode_AsUTF8(PyTuple_GET_ITEM(keys, (Py_ssize_t)i))))
        goto out;
    key = nk ? kv[0] : "";
  }
  char text[1024];
  int rc = TC_ERR_INVALID_ARGUMENT, flag = 0;
  int64_t num = 0;
  void *val = NULL;
  size_t len = 0;
  const char *bytes = NULL;
  Py_ssize_t blen = 0;
  if (!strcmp(op, "set")) {
    char *b;
    if (PyBytes_AsStringAndSize(a2, &b, &blen) < 0) goto out;
    bytes = b;
  } else if (!strcmp(op, "add")) {
    if ((num = PyLong_AsLongLong(a2)) == -1 && PyErr_Occurred()) goto out;
  }
  static const char *ops[] = {"set", "get", "add", "check", "wait", "delete",
                              NULL};
  int which = 0;
  while (ops[which] && strcmp(ops[which], op)) which++;
  if (!ops[which]) {
    PyErr_Format(PyExc_ValueError, "_store_call: unknown op '%s'", op);
    goto out;
  }
  const char *const *klist = keys ? kv : &key;
  size_t nlist = keys ? nk : 1;
  Py_BEGIN_ALLOW_THREADS
  switch (which) {
  case 0: rc = tc_store_set(s, key, bytes, (size_t)blen); break;
  case 1: rc = tc_store_get(s, key, &val, &len, timeout); break;
  case 2: rc = tc_store_add(s, key, num, &num); break;
  case 3: rc = tc_store_check(s, klist, nlist, &flag); break;
  case 4: rc = tc_store_wait(s, klist, nlist, timeout); break;
  default: rc = tc_store_delete(s, key, &flag); break;
  }
  if (rc != TC_OK)
    snprintf(text, sizeof text, "%s: %s", tc_status_name(rc), tc_last_error());
  Py_END_ALLOW_THREADS
  if (rc != TC_OK) {
    PyErr_SetString(rc == TC_ERR_INVALID_ARGUMENT ? PyExc_ValueError
                                                  : PyExc_RuntimeError, text);
    goto out;
  }
  if (!strcmp(op, "get")) res = PyBytes_FromStringAndSize(val, (Py_ssize_t)len);
  else if (!strcmp(op, "add")) res = PyLong_FromLongLong((long long)num);
  else if (!strcmp(op, "check") || !strcmp(op, "delete")) res = PyBool_FromLong(flag);
  else res = Py_NewRef(Py_None);
  tc_free(val);
out:
  Py_XDECREF(keys);
  tc_store_release(s);
  return res;
}

/* _comms.h -- private header of the torchcomms._comms extension module.
 *
 * The extension is plain C against the CPython C API: no C++, no PyTorch
 * headers. Tensors are read through Python attributes (data_ptr(), numel(),
 * dtype, ...), and the library (libtorchcomms, compiled into the module) is
 * called with the GIL released.
 *
 * Files:
 *   _comms_module.c  module init, interned names, error mapping,
 *                    timeout/hints helpers, new_comm; it imports
 *   _comms_classes.py  the enums, option classes and Timeout (Python)
 *   _comms_tensor.c  torch tensors -> (pointer, count, dtype), validation
 *   _comms_store.c   Python torch.distributed.Store -> tc_store_t adapter
 *   _comms_types.c   ReduceOp, TorchWork, P2POp, BatchSendRecv
 *   _comms_comm.c    TorchComm: lifecycle, getters, split, the issue path
 *   _comms_ops.c     TorchComm's operations (argument parsing, checks)
 *   _comms_hooks.c   pre/post/abort hooks (RemovableHandle, the hook
 *                    argument objects) and the flight recorder's methods
 *   _comms_pybackend.c  backends written in Python (register_backend, the
 *                    backend table that runs them, get_backend_impl)
 *   _comms_win.c     one-sided windows: TorchComm.new_window,
 *                    TorchCommWindow (over tc_window_*)
 *   _comms_winmem.c  tensors over window memory, re-homing, dropped windows
 */
#ifndef TORCHCOMMS_PY_COMMS_H
#define TORCHCOMMS_PY_COMMS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdarg.h>
#include <stdint.h>

#include "torchcomms.h"

#define TCPY_HIDDEN __attribute__((visibility("hidden")))

#if PY_VERSION_HEX >= 0x030D0000
#define TCPY_FINALIZING() Py_IsFinalizing()
#else
#define TCPY_FINALIZING() _Py_IsFinalizing()
#endif

/* ---- interned attribute and method names (_comms_module.c) ---- */
typedef struct tcpy_names {
  PyObject *data_ptr, *numel, *element_size, *dtype, *is_contiguous, *is_conj,
      *is_neg, *device, *type, *index, *shape, *item, *total_seconds, *set,
      *get, *wait, *add, *check, *delete_key, *timeout, *hints, *is_cpu;
} tcpy_names_t;
TCPY_HIDDEN extern tcpy_names_t tcpy_str;

/* ---- objects created at module init (_comms_module.c) ---- */
TCPY_HIDDEN extern PyObject *tcpy_module;     /* borrowed */
TCPY_HIDDEN extern PyObject *tcpy_RedOpType;  /* enum.Enum subclasses */
TCPY_HIDDEN extern PyObject *tcpy_WorkStatus;
TCPY_HIDDEN extern PyObject *tcpy_P2POpType;
TCPY_HIDDEN extern PyObject *tcpy_CommOptions;
TCPY_HIDDEN extern PyObject *tcpy_timedelta; /* datetime.timedelta */
/* Enum members by C value: RedOpType by tc_redop_type_t, WorkStatus by
 * tc_work_status_t, P2POpType [0] SEND [1] RECV. */
TCPY_HIDDEN extern PyObject *tcpy_redop_members[TC_REDOP_COUNT];
TCPY_HIDDEN extern PyObject *tcpy_status_members[5];
TCPY_HIDDEN extern PyObject *tcpy_p2p_members[2];

/* ---- types ---- */
TCPY_HIDDEN extern PyTypeObject TcPy_TorchComm_Type;
TCPY_HIDDEN extern PyTypeObject TcPy_TorchWork_Type;
TCPY_HIDDEN extern PyTypeObject TcPy_ReduceOp_Type;
TCPY_HIDDEN extern PyTypeObject TcPy_P2POp_Type;
TCPY_HIDDEN extern PyTypeObject TcPy_BatchSendRecv_Type;

/* The communicator's device: what tensors must live on. */
typedef struct tcpy_device {
  char type[32]; /* "cpu", "cuda", ... */
  int index;     /* -1: none */
  int is_cpu;    /* type is "cpu" (read on every operation: no strcmp) */
  int is_cuda;   /* type is "cuda" */
} tcpy_device_t;

/* Kinds of Python hooks a TorchComm holds (TCPY_HOOK_SPLIT is private: the
 * flight recorder's registration of split children). */
enum { TCPY_HOOK_PRE, TCPY_HOOK_POST, TCPY_HOOK_ABORT, TCPY_HOOK_SPLIT,
       TCPY_HOOK_KINDS };

typedef struct TorchCommObject {
  PyObject_HEAD
  tc_comm_t *comm;      /* NULL once destroyed */
  /* 1 while a pre or post hook is registered: the one test the operation
   * path makes (no hook: no argument object is built). */
  int hooked;
  /* 1 when the flight recorder keeps stacks (TORCHCOMMS_FR_STACK): each
   * operation hands it the caller's Python frames (_comms_comm.c). */
  int fr_stack;
  /* per kind: a tuple of (id, callable) pairs in registration order, NULL
   * when none (replaced, never mutated: a running hook may remove itself) */
  PyObject *hooks[TCPY_HOOK_KINDS];
  uint64_t next_hook_id;
  uint64_t c_abort_hook; /* the C abort hook calling the Python ones; 0: none */
  PyObject *pending;    /* list of TorchWork still in flight */
  PyObject *store;      /* the Python store given to new_comm, or None */
  PyObject *device_obj; /* torch.device given, or NULL (made lazily) */
  tcpy_device_t dev;
  int high_priority_stream;
  int enable_reconfigure;
  /* tensor_register's records: {data_ptr: [nbytes, count]}, or NULL when
   * none yet (_comms_mem.c); dropped at finalize and abort */
  PyObject *registered;
  /* get_backend_impl(): the TorchCommBackend instance of a backend written
   * in Python (pyb = 1: its operations carry their Python arguments), or
   * the description of a C backend, made on first use (pyb = 0). */
  PyObject *backend_impl;
  int pyb;
  PyObject *weakreflist;
} TorchCommObject;

typedef struct TorchWorkObject {
  PyObject_HEAD
  tc_work_t *work; /* NULL: completed synchronously */
  PyObject *refs;  /* objects kept alive while in flight; NULL once done */
  PyObject *weakreflist;
} TorchWorkObject;

typedef struct ReduceOpObject {
  PyObject_HEAD
  tc_redop_t op;
} ReduceOpObject;

typedef struct P2POpObject {
  PyObject_HEAD
  PyObject *type; /* P2POpType member */
  PyObject *tensor;
  int peer;
} P2POpObject;

/* What one posted op of a batch was made of (BatchSendRecv's kept C batch). */
typedef struct tcpy_batch_ent {
  void *ptr;
  size_t numel;
  int32_t dtype, peer, send, pad; /* no implicit padding: compared with memcmp */
} tcpy_batch_ent_t;
_Static_assert(sizeof(tcpy_batch_ent_t) == 32, "tcpy_batch_ent_t has no padding");

typedef struct BatchSendRecvObject {
  PyObject_HEAD
  TorchCommObject *comm; /* strong */
  PyObject *ops;         /* list of P2POp */
  /* the C batch of the last issue, kept while no op changes (an issue
   * re-reads every tensor and compares); NULL while an issue uses it */
  tc_batch_t *cbatch;      /* made on comm->comm, which never changes */
  tcpy_batch_ent_t *cent;  /* its ops (PyMem) */
  Py_ssize_t cn;
} BatchSendRecvObject;

/* ---- errors (_comms_module.c) ---- */
/* Raises the Python exception for a failed C call: ValueError for
 * TC_ERR_INVALID_ARGUMENT, MemoryError for TC_ERR_NOMEM, else RuntimeError,
 * with `text` (tc_last_error() captured right after the call) or the code's
 * message. Returns NULL. */
TCPY_HIDDEN PyObject *tcpy_raise(int rc, const char *text);

/* ---- argument helpers (_comms_module.c) ---- */
/* timedelta, int/float seconds or None -> seconds (None -> dflt). Raises
 * TypeError/ValueError naming op and arg; returns -1 on error. */
TCPY_HIDDEN int tcpy_seconds(PyObject *obj, const char *op, const char *arg,
                             double dflt, double *out);
/* Per-operation options from hints (dict or None) and timeout. The hint
 * strings stay valid while *keep (a new reference, possibly NULL) lives. */
typedef struct tcpy_opts {
  tc_op_options_t o;
  tc_hint_t small[8];
  tc_hint_t *hints; /* small or PyMem */
  PyObject *keep;
} tcpy_opts_t;
TCPY_HIDDEN int tcpy_opts_init(tcpy_opts_t *o, const char *op, PyObject *hints,
                               PyObject *timeout);
TCPY_HIDDEN void tcpy_opts_free(tcpy_opts_t *o);
/* hints dict -> array of tc_hint_t (strings borrowed from *keep). */
TCPY_HIDDEN int tcpy_hints(PyObject *hints, const char *op, tc_hint_t *small,
                           size_t nsmall, tc_hint_t **out, size_t *n,
                           PyObject **keep);
/* The parameters of a METH_FASTCALL | METH_KEYWORDS method: its name for
 * messages ("all_reduce"), its parameter names in order (NULL-terminated,
 * at most TCPY_MAX_PARAMS) and how many lead ones are required. The names
 * are interned on first use (`kw`, `n`: zero-initialise the rest). */
#define TCPY_MAX_PARAMS 8
typedef struct tcpy_params {
  const char *fn;
  const char *const *names;
  int required;
  int n;                          /* filled on first use */
  PyObject *kw[TCPY_MAX_PARAMS];  /* interned names, filled on first use */
} tcpy_params_t;
#define TCPY_PARAMS(fn_, names_, required_)                                     \
  { .fn = (fn_), .names = (names_), .required = (required_) }
/* Binds a vectorcall's arguments to p's parameters: out[i] is the argument
 * of parameter i (borrowed) or NULL where an optional one was not passed.
 * TypeError, as PyArg_ParseTupleAndKeywords words them, for too many
 * arguments, a missing required one, an unknown keyword or one given twice;
 * returns 0 or -1. A keyword matches by identity first (names written in
 * the caller's source are interned), then by value. */
TCPY_HIDDEN int tcpy_parse(tcpy_params_t *p, PyObject *const *args,
                           Py_ssize_t nargs, PyObject *kwnames,
                           PyObject **out);
/* A bool argument (NULL: not passed -> dflt) as PyArg's "p" reads it:
 * truth value; returns 0 or -1. */
TCPY_HIDDEN int tcpy_flag(PyObject *obj, int dflt, int *out);
/* An int argument -> C int; ValueError naming op and arg if out of range. */
TCPY_HIDDEN int tcpy_int(PyObject *obj, const char *op, const char *arg,
                         int *out);

/* ---- tensors (_comms_tensor.c) ---- */
typedef struct tcpy_tensor {
  PyObject *obj; /* borrowed */
  void *ptr;
  size_t numel;
  tc_dtype_t dtype;
} tcpy_tensor_t;

/* How torch.Tensor / nn.Parameter objects on a CPU communicator are read:
 * "shim" (torch's C shim), "dlpack" (its DLPack exchange table),
 * "attributes" (their accessors), or "unset" before the first tensor. */
TCPY_HIDDEN const char *tcpy_tensor_reader(void);

/* Reads and validates a tensor argument; arg names it in messages, idx >= 0
 * appends "[idx]". Returns 0 or -1 with an exception set. */
TCPY_HIDDEN int tcpy_tensor(const tcpy_device_t *dev, const char *op,
                            const char *arg, Py_ssize_t idx, PyObject *obj,
                            tcpy_tensor_t *out);
/* A list/tuple of tensors; expect >= 0 requires that length. All share one
 * dtype (returned in *dtype; unchanged if the list is empty). On success
 * *ptrs and *counts are PyMem arrays (free with PyMem_Free) and *seq a new
 * reference to a tuple holding the tensors. */
TCPY_HIDDEN int tcpy_tensor_list(const tcpy_device_t *dev, const char *op,
                                 const char *arg, PyObject *obj,
                                 Py_ssize_t expect, void ***ptrs,
                                 size_t **counts, tc_dtype_t *dtype,
                                 PyObject **seq);
/* Elements per row of dim 0 (product of shape[1:]); dim-0 tensors: error. */
TCPY_HIDDEN int tcpy_row_elems(const char *op, const char *arg, PyObject *obj,
                               size_t *rows, size_t *row);
/* "float32" style name of a C dtype for messages. */
TCPY_HIDDEN const char *tcpy_dtype_name(tc_dtype_t dt);
/* A new torch.device(type[, index]). */
TCPY_HIDDEN PyObject *tcpy_torch_device(const char *type, int index);
/* torch.cuda.current_stream(index).cuda_stream (index < 0: the current
 * device) as a cudaStream_t; 0 on success, -1 with an exception set. */
TCPY_HIDDEN int tcpy_cuda_stream(int index, void **out);

/* ---- store adapter (_comms_store.c) ---- */
/* Wraps a Python store object; the tc store holds a reference to it. */
TCPY_HIDDEN int tcpy_store_wrap(PyObject *store, tc_store_t **out);
/* _store_call(store, op, key_or_keys, arg=None, timeout=1.0): one C store
 * call through the adapter (for tests); errors name the TC_ status. */
TCPY_HIDDEN PyObject *tcpy_store_call(PyObject *module, PyObject *args);

/* ---- types (_comms_types.c) ---- */
TCPY_HIDDEN int tcpy_types_ready(PyObject *module);
/* A new TorchWork: for an in-flight work (owning `work` and a reference to
 * `refs`), or completed (work == NULL, refs == NULL). */
TCPY_HIDDEN PyObject *tcpy_work_new(tc_work_t *work, PyObject *refs);
/* 1 if the work finished (drops its refs then), else 0. */
TCPY_HIDDEN int tcpy_work_done(TorchWorkObject *w);
/* A new BatchSendRecv on comm. */
TCPY_HIDDEN PyObject *tcpy_batch_new(TorchCommObject *comm);
/* A new ReduceOp of op. */
TCPY_HIDDEN PyObject *tcpy_redop_make(tc_redop_t op);
/* op argument: ReduceOp, RedOpType member or None (-> SUM). */
TCPY_HIDDEN int tcpy_redop(PyObject *obj, const char *op, tc_redop_t *out);

/* ---- communicator (_comms_comm.c) ---- */
TCPY_HIDDEN PyObject *tcpy_new_comm(PyObject *self, PyObject *args,
                                    PyObject *kw);
/* Raises RuntimeError if the communicator was destroyed; returns -1. */
TCPY_HIDDEN int tcpy_comm_live(TorchCommObject *self, const char *op);
/* Drops finished works from the pending list. */
TCPY_HIDDEN void tcpy_comm_reap(TorchCommObject *self);
/* ---- fault tolerance (_comms_ft.c) ---- */
TCPY_HIDDEN PyObject *tcpy_comm_get_init_handle(TorchCommObject *self, PyObject *u);
TCPY_HIDDEN PyObject *tcpy_comm_is_abort_supported(TorchCommObject *self, PyObject *u);
TCPY_HIDDEN PyObject *tcpy_comm_reconfigure(TorchCommObject *self, PyObject *args,
                                            PyObject *kw);

/* One call into the library, described by value so that it can run with the
 * GIL released; `type` is the operation (TC_OP_MAP, torchcomms.h). */
typedef struct tcpy_call {
  tc_op_type_t type;
  void *recvbuf;
  const void *sendbuf;
  void **recvbufs;
  void **sendbufs;
  size_t count;     /* the single count (send side for *_v gathers) */
  size_t recvcount; /* reduce_scatter_v */
  size_t *recvcounts;
  size_t *sendcounts;
  tc_dtype_t dtype;
  tc_redop_t op;
  int root; /* root or peer */
  tc_batch_t *batch;
  /* Python backends only (TorchCommObject.pyb): the method's arguments in
   * torchcomms' order, before async_op (a new reference the operation's
   * tcpy_finish drops), NULL otherwise. */
  PyObject *pyargs;
} tcpy_call_t;

/* Runs `call` on the communicator: reaps finished works, releases the GIL,
 * calls the library synchronously (async_op false) or asynchronously, and
 * returns a TorchWork (holding `refs` while in flight) or NULL with an
 * exception. */
TCPY_HIDDEN PyObject *tcpy_issue(TorchCommObject *self, const char *op,
                                 tcpy_call_t *call, int async_op,
                                 PyObject *hints, PyObject *timeout,
                                 PyObject *refs, PyObject *pre);
/* pre: the pre-hook argument object (borrowed; NULL when no pre hook is
 * registered). */
TCPY_HIDDEN PyObject *tcpy_issue_opts(TorchCommObject *self, const char *op,
                                      tcpy_call_t *call, int async_op,
                                      tcpy_opts_t *opts, PyObject *refs,
                                      PyObject *pre);

/* ---- operations (_comms_ops.c) ---- */
/* TorchComm's operation methods, generated from TC_COMM_OP_MAP, and their
 * aliases. */
TCPY_HIDDEN extern PyMethodDef tcpy_comm_op_methods[];
/* Calls the library function of call->type (no Python API: the GIL may be
 * released). */
TCPY_HIDDEN int tcpy_call_run(tc_comm_t *c, const tcpy_call_t *call,
                              const tc_op_options_t *o, tc_work_t **w);

/* ---- backends written in Python (_comms_pybackend.c) ---- */
/* _backend_base.py's TorchCommBackend, _NativeBackend, _BackendNotFoundError */
TCPY_HIDDEN extern PyObject *tcpy_TorchCommBackend, *tcpy_NativeBackend,
    *tcpy_BackendNotFound;
/* Module init: the registry and the classes above (after the classes were
 * imported); 0 or -1 with an exception. */
TCPY_HIDDEN int tcpy_pyb_init(PyObject *module);
/* register_backend(name, backend_class), _is_backend_registered(name),
 * _registered_backend(name) -> class or None. */
TCPY_HIDDEN PyObject *tcpy_register_backend(PyObject *m, PyObject *args,
                                            PyObject *kw);
TCPY_HIDDEN PyObject *tcpy_is_backend_registered(PyObject *m, PyObject *args,
                                                 PyObject *kw);
TCPY_HIDDEN PyObject *tcpy_registered_backend(PyObject *m, PyObject *name);
/* new_comm: *cls = the class registered for backend (a str), after loading
 * its entry point if it has one (new reference), or NULL when the C loader
 * is to find it. 0, or -1 with an exception. */
TCPY_HIDDEN int tcpy_pyb_lookup(PyObject *backend, PyObject **cls);
/* new_comm: cls(), init(device, name, options), rank and size into o. The
 * instance (new reference) or NULL with an exception. */
TCPY_HIDDEN PyObject *tcpy_pyb_prepare(PyObject *cls, PyObject *device,
                                       const char *name, PyObject *options,
                                       tc_comm_options_t *o);
/* The instance the table's init takes on this thread (set right before
 * tc_comm_create; cleared after it, whatever happened). */
TCPY_HIDDEN void tcpy_pyb_handoff_set(PyObject *obj);
TCPY_HIDDEN void tcpy_pyb_handoff_clear(void);
/* After a split of a Python-backed communicator on this thread: the child's
 * instance (new reference) or NULL. */
TCPY_HIDDEN PyObject *tcpy_pyb_take_made(void);
/* The backend_arg of an operation: [method, args + (async_op,), None]; the
 * third slot receives the exception the method raised. */
TCPY_HIDDEN PyObject *tcpy_pyb_payload(const char *method, PyObject *args,
                                       int async_op);
/* TorchComm.get_backend_impl and unsafe_get_backend. */
TCPY_HIDDEN extern PyMethodDef tcpy_comm_backend_methods[];

/* ---- hooks (_comms_hooks.c) ---- */
TCPY_HIDDEN extern PyTypeObject TcPy_RemovableHandle_Type;
/* TorchComm's hook and flight recorder methods (register_pre_hook, ...,
 * _fr_dump_json, ...), added to the type by tcpy_types_ready. */
TCPY_HIDDEN extern PyMethodDef tcpy_comm_hook_methods[];
/* Module functions: _fr_dump_file. */
TCPY_HIDDEN PyObject *tcpy_fr_dump_file(PyObject *module, PyObject *args,
                                        PyObject *kw);
/* Looks up OpName and the hook argument classes in _comms_classes (g: its
 * dict); 0 or -1 with an exception. */
TCPY_HIDDEN int tcpy_hooks_init(PyObject *g);
/* The finalize's op_id (torchcomms' kFinalizeOpId = SIZE_MAX). */
#define TCPY_FINALIZE_OP_ID UINT64_MAX
/* Pre-hook arguments of operation `type` (a TC_OP_* or the two below): an
 * instance of its *PreHookArgs class built from fmt, one character per
 * field: 'O' an object as is, 'L' a new list from a sequence (other objects
 * as is), 'i' an int; then async_op as a bool when async_op >= 0. NULL with
 * an exception on error. */
#define TCPY_HOOK_OP_SPLIT ((int)TC_OP_TYPE_COUNT)
#define TCPY_HOOK_OP_FINALIZE ((int)TC_OP_TYPE_COUNT + 1)
#define TCPY_HOOK_OP_NEW_WINDOW ((int)TC_OP_TYPE_COUNT + 2)
TCPY_HIDDEN PyObject *tcpy_hook_args(int type, int async_op, const char *fmt,
                                     ...);
TCPY_HIDDEN PyObject *tcpy_hook_args_v(int type, int async_op, const char *fmt,
                                       va_list ap);
/* Runs the pre hooks: callback(OpName member of type, op_id, args). -1 with
 * the first hook's exception set (the operation must not be issued). */
TCPY_HIDDEN int tcpy_hooks_run_pre(TorchCommObject *self, int type,
                                   uint64_t op_id, PyObject *args);
/* Runs the post hooks: callback(op_id, post args of type). A hook's
 * exception is reported (sys.unraisablehook) and ignored. */
TCPY_HIDDEN void tcpy_hooks_run_post(TorchCommObject *self, int type,
                                     uint64_t op_id);
/* After a split that made `child`: the private split hooks, child as the
 * argument (exceptions reported and ignored). */
TCPY_HIDDEN void tcpy_hooks_run_split(TorchCommObject *self, PyObject *child);
/* Dealloc / GC: drops every hook (clear_c: unregisters the C abort hook
 * too, releasing the GIL meanwhile). */
TCPY_HIDDEN void tcpy_hooks_clear(TorchCommObject *self, int clear_c);

/* ---- memory (_comms_mem.c) ---- */
/* TorchComm's tensor_register, tensor_deregister, get_mem_allocator (and
 * the mem_allocator property), added to the type by tcpy_types_ready. */
TCPY_HIDDEN extern PyMethodDef tcpy_comm_mem_methods[];
TCPY_HIDDEN extern PyGetSetDef tcpy_comm_mem_getset[];
/* get_mem_allocator(backend): the module function. */
TCPY_HIDDEN PyObject *tcpy_get_mem_allocator(PyObject *module, PyObject *args,
                                             PyObject *kw);
/* Readies MemAllocator and adds it to the module; 0 or -1. */
TCPY_HIDDEN int tcpy_mem_ready(PyObject *module);

/* ---- one-sided windows (_comms_win.c) ---- */
TCPY_HIDDEN extern PyTypeObject TcPy_TorchCommWindow_Type;
/* TorchComm.new_window, added to the type by tcpy_types_ready. */
TCPY_HIDDEN extern PyMethodDef tcpy_comm_win_methods[];
/* Readies TorchCommWindow (and its memory type) and adds it to the module;
 * 0 or -1. */
TCPY_HIDDEN int tcpy_win_ready_types(PyObject *module);
/* ---- window memory (_comms_winmem.c) ---- */
/* Frees the C windows of comm whose TorchCommWindow was dropped while
 * registered (freeing is collective, so dealloc defers it): call once comm
 * is finalized, aborted or destroyed. */
TCPY_HIDDEN void tcpy_win_release_orphans(tc_comm_t *comm);
/* Keeps win (registered, dropped) until tcpy_win_release_orphans(comm);
 * comm NULL (the communicator is gone): frees it at once. */
TCPY_HIDDEN void tcpy_win_orphan_add(tc_comm_t *comm, tc_window_t *win);
/* The torch module (imported on first use; borrowed), or NULL with an
 * exception. */
TCPY_HIDDEN PyObject *tcpy_win_torch_mod(void);
/* A tensor of dtype and shape (numel elements of itemsize bytes) over ptr,
 * a hold of tc_window_map_ref that the tensor's storage takes over (released
 * on failure too). */
TCPY_HIDDEN PyObject *tcpy_win_tensor_over(void *ptr, size_t numel,
                                           size_t itemsize, PyObject *dtype,
                                           PyObject *shape);
/* Points `tensor` at `flat`'s storage (same size and strides) with autograd
 * off; 0 or -1 with an exception. */
TCPY_HIDDEN int tcpy_win_rehome(PyObject *tensor, PyObject *flat);
/* Readies the memory object's type; 0 or -1. */
TCPY_HIDDEN int tcpy_winmem_ready(void);

#endif /* TORCHCOMMS_PY_COMMS_H */

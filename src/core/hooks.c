/* hooks.c -- callbacks around every operation of a communicator
 * (tc_comm_register_hook), and the description of an operation they get.
 *
 * Cost with no hook: tc__op_issue and work_finish read one counter per
 * kind (c->nhooks) and go on. With hooks, callers of a kind hold the
 * communicator's read lock while calling them; (un)registering takes the
 * write lock, so once tc_comm_unregister_hook returns the hook is not
 * running and never runs again. */
#include "core.h"

#include <stdlib.h>
#include <string.h>

struct tc__hook {
  uint64_t id;
  tc_hook_kind_t kind;
  tc_hook_fn fn;
  void *user;
};

static _Atomic uint64_t next_hook_id = 1;
static _Thread_local char refusal[512];

void tc__hooks_init(tc_comm_t *c) { pthread_rwlock_init(&c->hooks_lock, NULL); }

void tc__hooks_free(tc_comm_t *c) {
  free(c->hooks);
  c->hooks = NULL;
  c->hooks_n = c->hooks_cap = 0;
  for (int k = 0; k < 3; k++) atomic_store(&c->nhooks[k], 0);
  pthread_rwlock_destroy(&c->hooks_lock);
}

int tc_comm_register_hook(tc_comm_t *c, tc_hook_kind_t kind, tc_hook_fn fn, void *user,
                          uint64_t *id) {
  static const char *fn_name = "tc_comm_register_hook";
  TC_CHECK(tc__comm_enter(&c, fn_name));
  if ((unsigned)kind > TC_HOOK_ABORT)
    return tc__comm_error(c, TC_ERR_INVALID_ARGUMENT, fn_name,
                          "argument 'kind' = %d is not a tc_hook_kind_t", (int)kind);
  if (!fn)
    return tc__comm_error(c, TC_ERR_INVALID_ARGUMENT, fn_name, "argument 'fn' is NULL");
  pthread_rwlock_wrlock(&c->hooks_lock);
  if (c->hooks_n == c->hooks_cap) {
    size_t cap = c->hooks_cap ? 2 * c->hooks_cap : 4;
    struct tc__hook *h = realloc(c->hooks, cap * sizeof *h);
    if (!h) {
      pthread_rwlock_unlock(&c->hooks_lock);
      return tc__comm_error(c, TC_ERR_NOMEM, fn_name, "out of memory");
    }
    c->hooks = h;
    c->hooks_cap = cap;
  }
  uint64_t hid = atomic_fetch_add(&next_hook_id, 1);
  c->hooks[c->hooks_n++] = (struct tc__hook){hid, kind, fn, user};
  atomic_fetch_add(&c->nhooks[kind], 1);
  pthread_rwlock_unlock(&c->hooks_lock);
  if (id) *id = hid;
  return TC_OK;
}

int tc_comm_unregister_hook(tc_comm_t *c, uint64_t id) {
  static const char *fn_name = "tc_comm_unregister_hook";
  TC_CHECK(tc__comm_enter(&c, fn_name));
  pthread_rwlock_wrlock(&c->hooks_lock);
  for (size_t i = 0; i < c->hooks_n; i++) {
    if (c->hooks[i].id != id) continue;
    atomic_fetch_sub(&c->nhooks[c->hooks[i].kind], 1);
    memmove(&c->hooks[i], &c->hooks[i + 1], (c->hooks_n - i - 1) * sizeof *c->hooks);
    c->hooks_n--;
    pthread_rwlock_unlock(&c->hooks_lock);
    return TC_OK;
  }
  pthread_rwlock_unlock(&c->hooks_lock);
  return tc__comm_error(c, TC_ERR_INVALID_ARGUMENT, fn_name,
                        "no hook %llu is registered on this communicator (removed twice?)",
                        (unsigned long long)id);
}

void tc_hook_refuse(const char *reason) {
  snprintf(refusal, sizeof refusal, "%s", reason ? reason : "");
}

uint64_t tc_comm_next_op_id(const tc_comm_t *h) {
  tc_comm_t *c = (tc_comm_t *)h;
  if (tc__comm_enter(&c, "tc_comm_next_op_id") != TC_OK) return 0;
  tc__lock(&c->mu);
  uint64_t id = c->seq + 1;
  tc__unlock(&c->mu);
  return id;
}

void tc__op_bytes(const tc_backend_op_t *op, int rank, int size, size_t *in, size_t *out) {
  size_t es = tc__dtype_size(op->dtype), i_n = 0, o_n = 0;
  switch (op->kind) {
  case TC_KIND_SEND: i_n = op->count; break;
  case TC_KIND_RECV: o_n = op->count; break;
  case TC_KIND_BROADCAST: i_n = rank == op->root ? op->count : 0; o_n = op->count; break;
  case TC_KIND_ALL_REDUCE:
  case TC_KIND_REDUCE: i_n = o_n = op->count; break;
  case TC_KIND_ALL_GATHER:
  case TC_KIND_GATHER:
    i_n = op->count;
    for (int r = 0; op->recv && r < size; r++) o_n += op->recv[r].count;
    break;
  case TC_KIND_REDUCE_SCATTER:
  case TC_KIND_SCATTER:
    o_n = op->count;
    for (int r = 0; op->send && r < size; r++) i_n += op->send[r].count;
    break;
  case TC_KIND_ALL_TO_ALL:
    for (int r = 0; r < size; r++) {
      i_n += op->send ? op->send[r].count : 0;
      o_n += op->recv ? op->recv[r].count : 0;
    }
    break;
  case TC_KIND_BATCH: {
    size_t ib = 0, ob = 0;
    for (size_t k = 0; k < op->num_p2p; k++) {
      size_t b = op->p2p[k].count * tc__dtype_size(op->p2p[k].dtype);
      if (op->p2p[k].is_send) ib += b;
      else ob += b;
    }
    *in = ib;
    *out = ob;
    return;
  }
  default: break;
  }
  *in = i_n * es;
  *out = o_n * es;
}

void tc__op_info(const tc_work_t *w, tc_op_info_t *info) {
  const tc_comm_t *c = w->comm;
  const tc_backend_op_t *op = &w->op;
  memset(info, 0, sizeof *info);
  info->size = sizeof *info;
  info->comm = c->handle;
  info->comm_name = c->name;
  info->rank = c->rank;
  info->comm_size = c->size;
  info->type = op->type;
  info->name = w->opname;
  info->op_id = op->seq;
  info->coll_seq = w->coll_seq;
  info->p2p_seq = w->p2p_seq;
  info->dtype = op->dtype;
  info->redop = (op->flags & TC_OPF_REDUCE) ? (int)op->redop.type : -1;
  info->root = op->root;
  info->count = op->count;
  tc__op_bytes(op, c->rank, c->size, &info->in_bytes, &info->out_bytes);
  info->async_op = (op->flags & TC_BACKEND_OP_ASYNC) != 0;
  info->timeout_s = w->timeout_s;
  if (w->end_time > 0) { /* finished (work_finish sets it first) */
    info->status = w->rc;
    info->work_status = w->rc == TC_OK            ? TC_WORK_COMPLETED
                        : w->rc == TC_ERR_TIMEOUT ? TC_WORK_TIMEDOUT
                                                  : TC_WORK_ERROR;
    double t0 = w->start_time > 0 ? w->start_time : w->issue_time;
    info->duration_s = w->end_time > t0 ? w->end_time - t0 : 0;
    info->error = w->msg;
  } else {
    info->error = "";
  }
}

/* Calls every hook of `kind` with info; for PRE, stops at the first refusal
 * and returns it. */
static int run_hooks(tc_comm_t *c, tc_hook_kind_t kind, const tc_op_info_t *info) {
  int rc = 0;
  pthread_rwlock_rdlock(&c->hooks_lock);
  for (size_t i = 0; i < c->hooks_n && !rc; i++) {
    if (c->hooks[i].kind != kind) continue;
    int r = c->hooks[i].fn(kind, info, c->hooks[i].user);
    if (kind == TC_HOOK_PRE) rc = r;
  }
  pthread_rwlock_unlock(&c->hooks_lock);
  return rc;
}

int tc__hooks_pre(tc_comm_t *c, const tc_work_t *w, char *why, size_t len) {
  if (!atomic_load_explicit(&c->nhooks[TC_HOOK_PRE], memory_order_relaxed)) return TC_OK;
  tc_op_info_t info;
  tc__op_info(w, &info);
  refusal[0] = 0;
  if (!run_hooks(c, TC_HOOK_PRE, &info)) return TC_OK;
  snprintf(why, len, "%s", refusal[0] ? refusal : "refused by a pre-hook");
  refusal[0] = 0;
  return TC_ERR_INVALID_USAGE;
}

void tc__hooks_post(tc_comm_t *c, const tc_work_t *w) {
  if (!atomic_load_explicit(&c->nhooks[TC_HOOK_POST], memory_order_relaxed)) return;
  tc_op_info_t info;
  tc__op_info(w, &info);
  run_hooks(c, TC_HOOK_POST, &info);
}

void tc__hooks_abort(tc_comm_t *c) {
  if (!atomic_load_explicit(&c->nhooks[TC_HOOK_ABORT], memory_order_relaxed)) return;
  tc_op_info_t info;
  memset(&info, 0, sizeof info);
  info.size = sizeof info;
  info.comm = c->handle;
  info.comm_name = c->name;
  info.rank = c->rank;
  info.comm_size = c->size;
  info.type = TC_OP_TYPE_COUNT;
  info.name = "abort";
  info.op_id = c->seq;
  info.redop = -1;
  info.root = -1;
  info.error = c->last_error;
  run_hooks(c, TC_HOOK_ABORT, &info);
}

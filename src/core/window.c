/* window.c -- one-sided windows (tc_window_*; docs/windows.md): handles,
 * argument checks, the collective creation and release, the deferred work of
 * an asynchronous wait_signal, and the registry of window memory that a
 * caller may keep mapped after the window is freed (tc_window_map_ref).
 *
 * The backend moves the bytes (tc_backend_ops_t.window_*); everything a
 * backend would otherwise repeat lives here: every argument is checked
 * before the backend sees it (a put beyond the peer's window fails before
 * any byte moves), the ranks' window sizes are known to every rank, and the
 * signal counts each wait_signal waits for are numbered here, so that a
 * backend only compares a counter with a target.
 *
 * Lifetime: a window belongs to its communicator's list. When the
 * communicator is finalized, aborted, destroyed or reconfigured, the core
 * releases the backend's side of every window first (tc__windows_drop); the
 * handle stays valid, its operations fail, and tc_window_free only closes
 * it. Operations in flight are counted (busy) so that the release waits for
 * them (after an abort they fail at once). */
#include "core.h"
#include "handles.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TC_WINDOW_MAGIC 0x574e4457u /* "WDNW" */
/* Puts and gets below this size into a window mapped here are copied by
 * the core itself; larger ones go through the backend, which also checks
 * that the peer is still alive after the copy. */
#define TC_WIN_FAST_BYTES (64u * 1024u)

struct tc_window {
  uint32_t magic;
  uint32_t slot;
  tc_window_t *handle;
  tc_comm_t *comm; /* holds a reference */
  void *bwin;
  void *base;
  int rank, size;
  size_t *sizes;               /* [size] every rank's window bytes */
  _Atomic uint64_t *expected;  /* [size] signals of each peer waited for so far */
  char **map;                  /* [size] every window mapped here, or NULL */
  _Atomic int busy;            /* operations inside the backend */
  _Atomic int dead;            /* the backend's side was released */
  char dead_why[160];
  struct tc_window *next;      /* the communicator's list (comm->win_mu) */
};

static tc__htable_t windows = TC__HTABLE_INIT(TC__HANDLE_WINDOW);

/* ------------------------------------------------------------------------ */
/* Memory that outlives a window (tc_window_map_ref)                          */
/* ------------------------------------------------------------------------ */

typedef struct winmem {
  char *ptr;
  size_t len;
  int refs;
  void (*release)(void *ptr, size_t len);
  struct winmem *next;
} winmem_t;

static pthread_mutex_t winmem_mu = PTHREAD_MUTEX_INITIALIZER;
static winmem_t *winmem_list;

int tc__winmem_add(void *ptr, size_t len, void (*release)(void *, size_t)) {
  winmem_t *m = calloc(1, sizeof *m);
  if (!m) return TC_ERR_NOMEM;
  m->ptr = ptr;
  m->len = len;
  m->refs = 1;
  m->release = release;
  pthread_mutex_lock(&winmem_mu);
  m->next = winmem_list;
  winmem_list = m;
  pthread_mutex_unlock(&winmem_mu);
  return TC_OK;
}

/* The registered area containing p (winmem_mu held), with its link. */
static winmem_t **winmem_find(const void *p) {
  const char *q = p;
  for (winmem_t **m = &winmem_list; *m; m = &(*m)->next)
    if (q >= (*m)->ptr && (q < (*m)->ptr + (*m)->len || q == (*m)->ptr)) return m;
  return NULL;
}

static int winmem_ref(const void *p) {
  pthread_mutex_lock(&winmem_mu);
  winmem_t **m = winmem_find(p);
  if (m) (*m)->refs++;
  pthread_mutex_unlock(&winmem_mu);
  return m ? TC_OK : TC_ERR_NOT_SUPPORTED;
}

int tc__winmem_unref(void *p) {
  pthread_mutex_lock(&winmem_mu);
  winmem_t **link = winmem_find(p), *m = link ? *link : NULL;
  if (m && --m->refs == 0) *link = m->next;
  else m = m && m->refs == 0 ? m : NULL;
  pthread_mutex_unlock(&winmem_mu);
  if (!link) return TC_ERR_INVALID_ARGUMENT;
  if (m) { /* the last hold: outside the lock (munmap may take a while) */
    m->release(m->ptr, m->len);
    free(m);
  }
  return TC_OK;
}

int tc_window_map_release(void *ptr) {
  if (tc__winmem_unref(ptr) != TC_OK)
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: tc_window_map_release: %p is not memory held with "
                         "tc_window_map_ref (released twice?)", ptr);
  return TC_OK;
}

/* ------------------------------------------------------------------------ */
/* Handles and checks                                                        */
/* ------------------------------------------------------------------------ */

/* The window of a live handle, or an error naming fn. */
static int win_enter(tc_window_t **wp, const char *fn) {
  int stale = 0;
  tc_window_t *w = *wp ? tc__htable_get(&windows, *wp, &stale) : NULL;
  if (!w || w->magic != TC_WINDOW_MAGIC)
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: %s: %s", fn,
                         !*wp ? "argument 'win' is NULL"
                         : stale ? "the window was already freed (tc_window_free)"
                                 : "argument 'win' is not a window handle");
  *wp = w;
  return TC_OK;
}

/* Enters an operation: the window is live on an active communicator. The
 * caller leaves with win_leave. */
static int win_op_enter(tc_window_t **wp, const char *fn, const tc_op_options_t *o) {
  TC_CHECK(win_enter(wp, fn));
  tc_window_t *w = *wp;
  tc_comm_t *c = w->comm;
  atomic_fetch_add(&w->busy, 1);
  if (atomic_load(&w->dead)) {
    atomic_fetch_sub(&w->busy, 1);
    return tc__comm_error(c, TC_ERR_INVALID_USAGE, fn, "the window can no longer be used: %s",
                          w->dead_why);
  }
  if (!o && tc__comm_state(c) == TC_STATE_ACTIVE) return TC_OK; /* the common case */
  tc_comm_t *h = c->handle;
  int rc = tc__v_comm(&h, fn, o);
  if (rc != TC_OK) atomic_fetch_sub(&w->busy, 1);
  return rc;
}

static void win_leave(tc_window_t *w) { atomic_fetch_sub(&w->busy, 1); }

static int win_peer(tc_window_t *w, const char *fn, int peer, int any) {
  if (any && peer == -1) return TC_OK;
  if (peer < 0 || peer >= w->size)
    return tc__comm_error(w->comm, TC_ERR_INVALID_ARGUMENT, fn,
                          "argument 'peer' = %d is out of range [%s0, %d)", peer,
                          any ? "-1 (every peer) or " : "", w->size);
  return TC_OK;
}

static double win_timeout(const tc_window_t *w, const tc_op_options_t *o) {
  return o && o->timeout_s > 0 ? o->timeout_s : w->comm->timeout_s;
}

/* ------------------------------------------------------------------------ */
/* Creation and release                                                      */
/* ------------------------------------------------------------------------ */

/* What every rank tells the others at creation. */
typedef struct win_blob {
  int32_t status; /* TC_OK, or this rank's failure */
  uint32_t info_len;
  uint64_t bytes;
  char why[240];
  unsigned char info[TC_BACKEND_WIN_INFO_MAX];
} win_blob_t;

/* 1 on a host communicator (device "cpu"): its window memory is host
 * memory, which the core may copy and all-gather. */
static int win_host(const tc_comm_t *c) {
  return !strncmp(c->device, "cpu", 3) && (!c->device[3] || c->device[3] == ':');
}

/* Every rank's `len` bytes of mine into all (rank r's at r * len), after
 * step `step` of creation number `no`: an all-gather on a host
 * communicator; through the communicator's store on a device one, whose
 * collectives read device memory only (nccl). A rank deletes its key of
 * the previous step once it read everyone's of this one (they all read
 * that one before they wrote this). */
static int win_gather(tc_comm_t *c, uint64_t no, int step, const void *mine, size_t len,
                      void *all, const tc_op_options_t *opts) {
  if (win_host(c))
    return tc_all_gather_single(c->handle, all, mine, len, TC_UINT8, opts, NULL);
  double timeout = opts && opts->timeout_s > 0 ? opts->timeout_s : c->timeout_s;
  char key[96];
  snprintf(key, sizeof key, "window/%llu/%d/%d", (unsigned long long)no, step, c->rank);
  int rc = tc_store_set(c->store, key, mine, len);
  for (int r = 0; r < c->size && rc == TC_OK; r++) {
    void *v = NULL;
    size_t got = 0;
    snprintf(key, sizeof key, "window/%llu/%d/%d", (unsigned long long)no, step, r);
    rc = tc_store_get(c->store, key, &v, &got, timeout);
    if (rc == TC_OK && got != len) rc = TC_ERR_PROTOCOL;
    if (rc == TC_OK) memcpy((char *)all + (size_t)r * len, v, len);
    tc_free(v);
    if (rc != TC_OK)
      return tc__comm_error(c, rc, "new_window", "rank %d's window description did not "
                            "arrive through the store within %.1f s (is every rank creating "
                            "this window?)", r, timeout);
  }
  if (rc != TC_OK)
    return tc__comm_error(c, rc, "new_window", "publishing the window description in the "
                          "store failed (is the store reachable?)");
  /* step 0 follows step 1 of the previous creation */
  uint64_t pno = step ? no : no - 1;
  if (step || no > 0) {
    snprintf(key, sizeof key, "window/%llu/%d/%d", (unsigned long long)pno, !step, c->rank);
    tc_store_delete(c->store, key, NULL);
  }
  return TC_OK;
}

/* Every rank's status after a step: TC_OK, or the first failure with the
 * rank and its reason in why. */
static int all_ok(tc_comm_t *c, uint64_t no, int mine, const char *my_why,
                  const tc_op_options_t *opts, char *why, size_t wl) {
  struct { int32_t rc; char why[236]; } me = {mine, ""}, *all = calloc((size_t)c->size, sizeof me);
  if (!all) return TC_ERR_NOMEM;
  snprintf(me.why, sizeof me.why, "%s", my_why ? my_why : "");
  int rc = win_gather(c, no, 1, &me, sizeof me, all, opts);
  if (rc != TC_OK) {
    snprintf(why, wl, "%s", tc_last_error());
    free(all);
    return rc;
  }
  for (int r = 0; r < c->size; r++)
    if (all[r].rc != TC_OK) {
      snprintf(why, wl, "rank %d could not set up its side of the window: %s", r, all[r].why);
      rc = all[r].rc;
      break;
    }
  free(all);
  return rc;
}

int tc_window_create(tc_comm_t *c, void *buf, size_t bytes, const tc_op_options_t *opts,
                     tc_window_t **out) {
  static const char *fn = "new_window";
  TC_CHECK(tc__v_comm(&c, fn, opts));
  if (!out)
    return tc__comm_error(c, TC_ERR_INVALID_ARGUMENT, fn, "argument 'win' is NULL");
  *out = NULL;
  if (!TC_BACKEND_HAS_WINDOWS(c->ops))
    return tc__comm_error(c, TC_ERR_NOT_SUPPORTED, fn,
                          "backend '%s' has no one-sided windows (use the cpu backend, or "
                          "send/recv)", c->backend_name);
  if (bytes > SIZE_MAX / 4)
    return tc__comm_error(c, TC_ERR_INVALID_ARGUMENT, fn,
                          "argument 'bytes' = %zu is not a size of memory", bytes);
  if (buf && bytes == 0) buf = NULL;

  uint32_t idx;
  void *obj;
  if (tc__htable_take(&windows, &idx, &obj))
    return tc__comm_error(c, TC_ERR_NOMEM, fn, "out of memory (window handles)");
  tc_window_t *w = obj;
  if (!w) {
    if (!(w = calloc(1, sizeof *w))) {
      tc__htable_put(&windows, idx);
      return tc__comm_error(c, TC_ERR_NOMEM, fn, "out of memory");
    }
    tc__htable_set(&windows, idx, w);
  }
  memset(w, 0, sizeof *w);
  w->slot = idx;
  w->rank = c->rank;
  w->size = c->size;
  w->sizes = calloc((size_t)c->size, sizeof *w->sizes);
  w->expected = calloc((size_t)c->size, sizeof *w->expected);
  w->map = calloc((size_t)c->size, sizeof *w->map);
  win_blob_t *mine = calloc(1, sizeof *mine), *all = calloc((size_t)c->size, sizeof *all);
  int rc = TC_OK;
  char why[768] = "";
  if (!w->sizes || !w->expected || !w->map || !mine || !all) {
    rc = tc__comm_error(c, TC_ERR_NOMEM, fn, "out of memory");
    goto fail;
  }
  /* this rank's side; a failure is still told to the others (they would
   * wait for this rank in the all-gather otherwise) */
  size_t info_len = 0;
  char err[512] = "";
  mine->status = c->ops->window_create(c->bcomm, buf, bytes, &w->bwin, &w->base, mine->info,
                                       &info_len, err, sizeof err);
  if (mine->status == TC_OK && info_len > TC_BACKEND_WIN_INFO_MAX) {
    mine->status = TC_ERR_INTERNAL;
    snprintf(err, sizeof err, "backend '%s' wrote %zu bytes of window info (at most %u)",
             c->backend_name, info_len, TC_BACKEND_WIN_INFO_MAX);
  }
  mine->info_len = (uint32_t)info_len;
  mine->bytes = bytes;
  snprintf(mine->why, sizeof mine->why, "%.230s", err[0] ? err : tc_strerror(mine->status));
  pthread_mutex_lock(&c->win_mu);
  const uint64_t no = c->win_seq++; /* every rank creates its windows in one order */
  pthread_mutex_unlock(&c->win_mu);
  rc = win_gather(c, no, 0, mine, sizeof *mine, all, opts);
  if (rc != TC_OK) goto fail_backend; /* the message is the all-gather's */
  for (int r = 0; r < c->size; r++) {
    if (all[r].status != TC_OK) {
      rc = tc__comm_error(c, all[r].status, fn, "rank %d could not create its side of the window: %s",
                          r, all[r].why);
      goto fail_backend;
    }
    w->sizes[r] = (size_t)all[r].bytes;
  }
  /* the peers' infos, back to back with a stride of TC_BACKEND_WIN_INFO_MAX */
  unsigned char *infos = (unsigned char *)all; /* compacted in place */
  for (int r = 0; r < c->size; r++)
    memmove(infos + (size_t)r * TC_BACKEND_WIN_INFO_MAX, all[r].info, TC_BACKEND_WIN_INFO_MAX);
  err[0] = 0;
  int arc = c->ops->window_attach(w->bwin, infos, TC_BACKEND_WIN_INFO_MAX, err, sizeof err);
  rc = all_ok(c, no, arc, err, opts, why, sizeof why);
  if (rc != TC_OK) {
    rc = tc__comm_error(c, rc, fn, "%s", why);
    goto fail_backend;
  }
  if (c->ops->window_ready) c->ops->window_ready(w->bwin);
  /* the core's own copies (memmove) need host memory: on a device
   * communicator ("cuda": the nccl backend) window memory is device memory,
   * and every operation goes through the backend */
  for (int r = 0; r < c->size && win_host(c); r++) {
    w->map[r] = r == c->rank ? (w->sizes[r] ? w->base : NULL) : c->ops->window_map(w->bwin, r);
    /* the core's own hold on a peer's mapping: it stays mapped until
     * tc_window_free even when an abort releases the backend's side */
    if (w->map[r] && r != c->rank && winmem_ref(w->map[r]) != TC_OK) w->map[r] = NULL;
  }
  free(mine);
  free(all);

  tc__comm_ref(c);
  w->comm = c;
  w->magic = TC_WINDOW_MAGIC;
  pthread_mutex_lock(&c->win_mu);
  w->next = c->wins;
  c->wins = w;
  pthread_mutex_unlock(&c->win_mu);
  w->handle = (tc_window_t *)tc__htable_open(&windows, idx);
  *out = w->handle;
  tc__log(3, "communicator '%s': window of %zu bytes created (rank %d of %d, %s memory)",
          c->name, bytes, c->rank, c->size, buf ? "the caller's" : "library");
  return TC_OK;

fail_backend:
  if (w->bwin) c->ops->window_free(w->bwin);
  w->bwin = NULL;
fail:
  free(mine);
  free(all);
  free(w->sizes);
  free((void *)w->expected);
  free(w->map);
  w->sizes = NULL;
  w->expected = NULL;
  w->map = NULL;
  tc__htable_put(&windows, idx);
  return rc;
}

/* Releases the backend's side of w (its communicator's win_mu held, or w
 * not in a list). Waits for the operations inside the backend to leave. */
static void win_release_backend(tc_window_t *w, const char *why) {
  snprintf(w->dead_why, sizeof w->dead_why, "%s", why);
  atomic_store(&w->dead, 1);
  while (atomic_load(&w->busy) > 0) sched_yield();
  if (w->bwin) w->comm->ops->window_free(w->bwin);
  w->bwin = NULL;
}

void tc__windows_drop(tc_comm_t *c, const char *why) {
  pthread_mutex_lock(&c->win_mu);
  for (tc_window_t *w = c->wins; w; w = w->next)
    if (!atomic_load(&w->dead)) win_release_backend(w, why);
  pthread_mutex_unlock(&c->win_mu);
}

int tc_window_free(tc_window_t *win) {
  static const char *fn = "window_free";
  tc_window_t *h = win;
  TC_CHECK(win_enter(&win, fn));
  tc_comm_t *c = win->comm;
  int rc = TC_OK;
  char saved[1024] = "";
  if (!atomic_load(&win->dead) && tc__comm_state(c) == TC_STATE_ACTIVE) {
    /* nobody reaches this rank's memory after the barrier */
    rc = tc_barrier(c->handle, NULL, NULL);
    if (rc != TC_OK) snprintf(saved, sizeof saved, "%s", tc_last_error());
  }
  if (!tc__htable_close(&windows, h))
    return tc__set_error(TC_ERR_INVALID_USAGE,
                         "torchcomms: %s: the window was already freed (by another thread)", fn);
  pthread_mutex_lock(&c->win_mu);
  for (tc_window_t **p = &c->wins; *p; p = &(*p)->next)
    if (*p == win) {
      *p = win->next;
      break;
    }
  if (!atomic_load(&win->dead)) win_release_backend(win, "the window was freed");
  pthread_mutex_unlock(&c->win_mu);
  for (int r = 0; r < win->size && win->map; r++)
    if (win->map[r] && r != win->rank) tc__winmem_unref(win->map[r]);
  free(win->sizes);
  free((void *)win->expected);
  free(win->map);
  win->sizes = NULL;
  win->expected = NULL;
  win->map = NULL;
  win->magic = 0;
  tc__htable_put(&windows, win->slot);
  tc__comm_unref(c);
  if (rc != TC_OK) return tc__set_error_text(rc, saved);
  return TC_OK;
}

/* ------------------------------------------------------------------------ */
/* Queries                                                                   */
/* ------------------------------------------------------------------------ */

void *tc_window_base(const tc_window_t *h) {
  tc_window_t *w = (tc_window_t *)h;
  return win_enter(&w, "tc_window_base") == TC_OK ? w->base : NULL;
}

tc_comm_t *tc_window_comm(const tc_window_t *h) {
  tc_window_t *w = (tc_window_t *)h;
  return win_enter(&w, "tc_window_comm") == TC_OK ? w->comm->handle : NULL;
}

int tc_window_size(const tc_window_t *h, int rank, size_t *bytes) {
  tc_window_t *w = (tc_window_t *)h;
  TC_CHECK(win_enter(&w, "window_size"));
  TC_CHECK(win_peer(w, "window_size", rank, 0));
  if (!bytes)
    return tc__comm_error(w->comm, TC_ERR_INVALID_ARGUMENT, "window_size", "argument 'bytes' is NULL");
  *bytes = w->sizes[rank];
  return TC_OK;
}

/* peer's memory mapped here (NULL: not mappable, why says so). */
static void *win_mapped(tc_window_t *w, int rank, char *why, size_t wl) {
  if (atomic_load(&w->dead)) {
    snprintf(why, wl, "the window can no longer be used: %s", w->dead_why);
    return NULL;
  }
  if (rank == w->rank && w->base) return w->base;
  void *p = w->bwin ? w->comm->ops->window_map(w->bwin, rank) : NULL;
  if (!p)
    snprintf(why, wl, "rank %d's window is not mapped in this process (%s); reach it with "
             "put and get", rank,
             w->sizes[rank] == 0 ? "it is empty"
             : rank == w->rank   ? "it has no memory"
                                 : "another host, or the peer's own buffer");
  return p;
}

int tc_window_access(const tc_window_t *h, int rank, tc_win_access_t *access) {
  tc_window_t *w = (tc_window_t *)h;
  TC_CHECK(win_enter(&w, "get_attr"));
  TC_CHECK(win_peer(w, "get_attr", rank, 0));
  if (!access)
    return tc__comm_error(w->comm, TC_ERR_INVALID_ARGUMENT, "get_attr", "argument 'access' is NULL");
  char why[256];
  atomic_fetch_add(&w->busy, 1);
  *access = win_mapped(w, rank, why, sizeof why) || rank == w->rank ? TC_WIN_ACCESS_UNIFIED
                                                                     : TC_WIN_ACCESS_SEPARATE;
  win_leave(w);
  return TC_OK;
}

static int win_map(tc_window_t *h, int rank, void **ptr, int hold) {
  static const char *fn = "map_remote_tensor";
  tc_window_t *w = h;
  TC_CHECK(win_enter(&w, fn));
  TC_CHECK(win_peer(w, fn, rank, 0));
  if (!ptr) return tc__comm_error(w->comm, TC_ERR_INVALID_ARGUMENT, fn, "argument 'ptr' is NULL");
  *ptr = NULL;
  char why[256];
  atomic_fetch_add(&w->busy, 1);
  void *p = win_mapped(w, rank, why, sizeof why);
  int rc = p ? TC_OK : TC_ERR_NOT_SUPPORTED;
  if (p && hold && winmem_ref(p) != TC_OK) {
    snprintf(why, sizeof why, "rank %d's window is the caller's own buffer, which the library "
             "cannot hold", rank);
    rc = TC_ERR_NOT_SUPPORTED;
  }
  win_leave(w);
  if (rc != TC_OK) return tc__comm_error(w->comm, rc, fn, "%s", why);
  *ptr = p;
  return TC_OK;
}

int tc_window_map(tc_window_t *win, int rank, void **ptr) { return win_map(win, rank, ptr, 0); }
int tc_window_map_ref(tc_window_t *win, int rank, void **ptr) { return win_map(win, rank, ptr, 1); }

/* ------------------------------------------------------------------------ */
/* Operations                                                                */
/* ------------------------------------------------------------------------ */

/* A work already finished with rc (the failure's text is the thread's last
 * error), for an asynchronous call. */
static void win_done_work(tc_window_t *w, const char *opname, double timeout, int rc,
                          tc_work_t **work) {
  tc_work_t *wk = tc__work_alloc(w->comm, opname, timeout);
  if (!wk) return;
  wk->win_h = (uintptr_t)w->handle; /* a window operation (no hang report) */
  wk->start_time = wk->issue_time;
  tc__work_fail_local(wk, rc, rc == TC_OK ? NULL : tc_last_error());
  *work = tc__work_handle(wk);
}

/* Runs one backend operation in the caller's thread; the failure's text
 * gets the prefix naming the operation, communicator and rank. */
static int win_run(tc_window_t *w, tc_backend_win_op_t *op, const char *fn) {
  char err[768] = "";
  int rc = w->comm->ops->window_op(w->bwin, op, err, sizeof err);
  if (rc == TC_OK || rc == TC_BACKEND_WIN_PENDING) return rc;
  return tc__comm_error(w->comm, rc, fn, "%s", err[0] ? err : tc_strerror(rc));
}

static void win_op_init(tc_backend_win_op_t *op, tc_window_t *w, tc_win_kind_t kind,
                        const char *fn, int peer, const tc_op_options_t *o) {
  memset(op, 0, sizeof *op);
  op->size = sizeof *op;
  op->kind = kind;
  op->peer = peer;
  op->block = 1;
  op->timeout_s = win_timeout(w, o);
  op->deadline = tc__now() + op->timeout_s;
  op->opname = fn;
  if (o && o->size >= offsetof(tc_op_options_t, stream) + sizeof(void *)) op->stream = o->stream;
}

/* put, get, signal, flush: run now; an asynchronous call gets a finished work. */
static int win_now(tc_window_t *h, tc_win_kind_t kind, const char *fn, void *buf, size_t bytes,
                   int peer, size_t offset, const tc_op_options_t *o, tc_work_t **work) {
  tc_window_t *w = h;
  if (work) *work = NULL;
  TC_CHECK(win_enter(&w, fn));
  if (!o && !work && kind != TC_WIN_SIGNAL && peer >= 0 && peer < w->size && w->map &&
      w->map[peer] && bytes < TC_WIN_FAST_BYTES &&
      !atomic_load_explicit(&w->dead, memory_order_relaxed) &&
      __atomic_load_n(&w->comm->state, __ATOMIC_ACQUIRE) == TC_STATE_ACTIVE) {
    /* the common case, without the in-flight count: a window mapped here
     * (the core holds the mapping until tc_window_free, so a concurrent
     * abort cannot unmap it under the copy): a small put or get is a copy
     * and a flush has nothing to wait for. Anything wrong takes the full
     * path below, which says what. */
    if (kind == TC_WIN_FLUSH) return TC_OK;
    size_t have = w->sizes[peer];
    if ((buf || !bytes) && offset <= have && bytes <= have - offset) {
      if (kind == TC_WIN_PUT) memmove(w->map[peer] + offset, buf, bytes);
      else memmove(buf, w->map[peer] + offset, bytes);
      return TC_OK;
    }
  }
  w = h;
  TC_CHECK(win_op_enter(&w, fn, o));
  int rc = win_peer(w, fn, peer, kind == TC_WIN_FLUSH);
  if (rc == TC_OK && (kind == TC_WIN_PUT || kind == TC_WIN_GET)) {
    size_t have = w->sizes[peer];
    if (!buf && bytes > 0)
      rc = tc__comm_error(w->comm, TC_ERR_INVALID_ARGUMENT, fn,
                          "argument '%s' is NULL but bytes is %zu",
                          kind == TC_WIN_PUT ? "src" : "dst", bytes);
    else if (offset > have || bytes > have - offset)
      rc = tc__comm_error(w->comm, TC_ERR_INVALID_ARGUMENT, fn,
                          "%zu bytes at offset %zu go beyond rank %d's window of %zu bytes "
                          "(nothing was %s)", bytes, offset, peer, have,
                          kind == TC_WIN_PUT ? "written" : "read");
  }
  tc_backend_win_op_t op;
  if (rc == TC_OK && peer >= 0 && w->map[peer] &&
      ((kind != TC_WIN_SIGNAL && bytes < TC_WIN_FAST_BYTES) || kind == TC_WIN_FLUSH)) {
    /* a window mapped here: a small put or get is a copy, and a flush has
     * nothing to wait for (copies are visible when they return); no clock,
     * no call into the backend. A peer's death shows at the next signal,
     * wait_signal or large put. */
    if (kind == TC_WIN_PUT) memmove(w->map[peer] + offset, buf, bytes);
    else if (kind == TC_WIN_GET) memmove(buf, w->map[peer] + offset, bytes);
    win_leave(w);
    if (work) win_done_work(w, fn, win_timeout(w, o), TC_OK, work);
    return TC_OK;
  }
  if (rc == TC_OK) {
    win_op_init(&op, w, kind, fn, peer, o);
    op.buf = buf;
    op.bytes = bytes;
    op.offset = offset;
    rc = (kind == TC_WIN_PUT || kind == TC_WIN_GET) && bytes == 0 ? TC_OK : win_run(w, &op, fn);
  }
  win_leave(w);
  if (work && (rc == TC_OK || rc == TC_ERR_TIMEOUT || rc == TC_ERR_REMOTE ||
               rc == TC_ERR_ABORTED || rc == TC_ERR_SYSTEM)) {
    /* an asynchronous call that ran reports through its work, as
     * collectives do; an argument error is the call's own */
    win_done_work(w, fn, win_timeout(w, o), rc, work);
    if (*work) return TC_OK;
  }
  return rc;
}

int tc_window_put(tc_window_t *win, const void *src, size_t bytes, int peer, size_t offset,
                  const tc_op_options_t *opts, tc_work_t **work) {
  return win_now(win, TC_WIN_PUT, "put", (void *)(uintptr_t)src, bytes, peer, offset, opts, work);
}

int tc_window_get(tc_window_t *win, void *dst, size_t bytes, int peer, size_t offset,
                  const tc_op_options_t *opts, tc_work_t **work) {
  return win_now(win, TC_WIN_GET, "get", dst, bytes, peer, offset, opts, work);
}

int tc_window_signal(tc_window_t *win, int peer, const tc_op_options_t *opts, tc_work_t **work) {
  return win_now(win, TC_WIN_SIGNAL, "signal", NULL, 0, peer, 0, opts, work);
}

int tc_window_flush(tc_window_t *win, int peer, const tc_op_options_t *opts, tc_work_t **work) {
  return win_now(win, TC_WIN_FLUSH, "flush", NULL, 0, peer, 0, opts, work);
}

/* The deferred part of an asynchronous wait_signal (tc_work_t.drive): looks
 * once (block == 0) or waits until `limit` (0: the work's deadline). */
static void win_drive(tc_work_t *wk, int block, double limit) {
  tc_window_t *w = (tc_window_t *)wk->win_h, *h = w;
  if (win_enter(&w, "wait_signal") != TC_OK) {
    tc__work_fail_local(wk, TC_ERR_INVALID_USAGE,
                        "torchcomms: wait_signal: the window was freed before this "
                        "asynchronous wait_signal completed");
    return;
  }
  (void)h;
  atomic_fetch_add(&w->busy, 1);
  if (atomic_load(&w->dead)) {
    char msg[512];
    snprintf(msg, sizeof msg, "torchcomms: wait_signal on '%s' (rank %d of %d): the window "
             "can no longer be used: %s", w->comm->name, w->rank, w->size, w->dead_why);
    win_leave(w);
    tc__work_fail_local(wk, TC_ERR_ABORTED, msg);
    return;
  }
  tc_backend_win_op_t op;
  win_op_init(&op, w, TC_WIN_WAIT_SIGNAL, "wait_signal", wk->win_peer, NULL);
  op.timeout_s = wk->timeout_s;
  double deadline = wk->issue_time + wk->timeout_s;
  op.deadline = block && limit > 0 && limit < deadline ? limit : deadline;
  op.target = wk->win_target;
  op.block = block;
  char err[768] = "";
  int rc = w->comm->ops->window_op(w->bwin, &op, err, sizeof err);
  win_leave(w);
  if (rc == TC_BACKEND_WIN_PENDING) return;
  if (rc == TC_ERR_TIMEOUT && tc__now() < deadline) return; /* the caller's limit, not ours */
  if (rc == TC_OK) {
    tc__work_fail_local(wk, TC_OK, NULL);
    return;
  }
  char msg[1024];
  tc__comm_message(w->comm, "wait_signal", err[0] ? err : tc_strerror(rc), msg, sizeof msg);
  tc__comm_record_error(w->comm, msg);
  tc__work_fail_local(wk, rc, msg);
}

int tc_window_wait_signal(tc_window_t *h, int peer, const tc_op_options_t *o, tc_work_t **work) {
  static const char *fn = "wait_signal";
  tc_window_t *w = h;
  if (work) *work = NULL;
  TC_CHECK(win_op_enter(&w, fn, o));
  int rc = win_peer(w, fn, peer, 0);
  if (rc != TC_OK) {
    win_leave(w);
    return rc;
  }
  uint64_t target = atomic_fetch_add(&w->expected[peer], 1) + 1;
  if (work) {
    tc_work_t *wk = tc__work_alloc(w->comm, fn, win_timeout(w, o));
    if (!wk) {
      atomic_fetch_sub(&w->expected[peer], 1);
      win_leave(w);
      return tc__comm_error(w->comm, TC_ERR_NOMEM, fn, "out of memory");
    }
    wk->start_time = wk->issue_time;
    atomic_store(&wk->status, TC_WORK_INPROGRESS);
    wk->win_h = (uintptr_t)h;
    wk->win_peer = peer;
    wk->win_target = target;
    win_leave(w);
    wk->drive = win_drive;
    win_drive(wk, 0, 0); /* already there? */
    *work = tc__work_handle(wk);
    return TC_OK;
  }
  tc_backend_win_op_t op;
  win_op_init(&op, w, TC_WIN_WAIT_SIGNAL, fn, peer, o);
  op.target = target;
  rc = win_run(w, &op, fn);
  win_leave(w);
  return rc;
}

int tc_window_fence(tc_window_t *h, const tc_op_options_t *opts) {
  tc_window_t *w = h;
  TC_CHECK(win_enter(&w, "fence"));
  TC_CHECK(tc_window_flush(h, -1, opts, NULL));
  return tc_barrier(w->comm->handle, opts, NULL);
}

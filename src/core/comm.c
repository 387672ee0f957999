/* comm.c -- communicator lifecycle: create, finalize, abort, destroy,
 * getters, split, and error recording. */
#include "core.h"
#include "comm_log.h"

#include <linux/futex.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* The communicator table: users hold handles (slot + generation, see
 * handles.h), so a destroyed communicator's handle stays an error ("was
 * destroyed") after its slot and struct were reused, and the memory is
 * bounded by the most communicators alive (or still referred to by a work)
 * at once. */
static tc__htable_t comms = TC__HTABLE_INIT(TC__HANDLE_COMM);

/* Per-process count of communicators created with each name: the store
 * prefix "tc/<job>/<attempt>/<name>/<n>" (comm_keys.c) is unique even when a
 * name is reused. Every rank creates communicators in the same order
 * (creation is collective). A hash table (open addressing, grown at half
 * full) without a limit: one entry per distinct name ever used, so no name
 * ever shares another's generation.
 *
 * Several ranks of one communicator may be threads of one process (torchft's
 * and torch's threaded tests): each thread creates its own rank of the same
 * communicator at the same time. Counting every creation would give them
 * different generations, hence different store prefixes, and each would wait
 * for the others' keys until the timeout. So a creation that is still
 * running keeps its generation open, and a creation of another rank of the
 * same name and size joins the lowest open generation that does not have
 * that rank yet; a generation closes (nobody else joins it) as soon as one of
 * its creations ends, successfully or not: creation is collective, so by
 * then every rank of it has taken its generation. One rank per process (one
 * creation at a time) still counts 0, 1, 2, ... as before. */
typedef struct tc__gen_open {
  struct tc__gen_open *next;
  uint64_t gen;
  int rank, size;
  int closed; /* one of the creations of gen ended: nobody joins it */
} tc__gen_open_t;
typedef struct {
  char *name;
  uint64_t count;       /* the next fresh generation */
  tc__gen_open_t *open; /* this name's creations still running */
} tc__name_t;
static tc__name_t *names;
static size_t names_cap, names_n;
static pthread_mutex_t names_mu = PTHREAD_MUTEX_INITIALIZER;

static uint64_t name_hash(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
  return h;
}

/* The slot of name in a table of cap (a power of 2) entries: its entry, or
 * the empty one where it goes. */
static tc__name_t *name_find(tc__name_t *t, size_t cap, const char *name) {
  size_t i = (size_t)name_hash(name) & (cap - 1);
  while (t[i].name && strcmp(t[i].name, name)) i = (i + 1) & (cap - 1);
  return &t[i];
}

/* The generation for a new communicator named name whose rank of size this
 * process creates (see above), in *gen; *open is the creation's entry, to
 * give to name_generation_end when the creation ends. -1 when out of
 * memory. The lock is never held across anything that waits. */
static int name_generation(const char *name, int rank, int size, uint64_t *gen,
                           tc__gen_open_t **open) {
  int rc = -1;
  *open = NULL;
  tc__gen_open_t *o = calloc(1, sizeof *o);
  if (!o) return -1;
  pthread_mutex_lock(&names_mu);
  if (2 * (names_n + 1) > names_cap) {
    size_t cap = names_cap ? 2 * names_cap : 64;
    tc__name_t *t = calloc(cap, sizeof *t);
    if (!t) goto out;
    for (size_t i = 0; i < names_cap; i++)
      if (names[i].name) *name_find(t, cap, names[i].name) = names[i];
    free(names);
    names = t;
    names_cap = cap;
  }
  tc__name_t *e = name_find(names, names_cap, name);
  if (!e->name) {
    if (!(e->name = strdup(name))) goto out;
    names_n++;
  }
  /* the lowest open generation of this size without this rank, else a
   * fresh one */
  int found = 0;
  uint64_t g = 0;
  for (tc__gen_open_t *a = e->open; a; a = a->next) {
    if (a->closed || a->size != size || (found && a->gen >= g)) continue;
    int taken = 0;
    for (tc__gen_open_t *b = e->open; b && !taken; b = b->next)
      taken = b->gen == a->gen && b->rank == rank;
    if (!taken) {
      found = 1;
      g = a->gen;
    }
  }
  if (!found) g = e->count++;
  o->gen = g;
  o->rank = rank;
  o->size = size;
  o->next = e->open;
  e->open = o;
  *gen = g;
  *open = o;
  o = NULL;
  rc = 0;
out:
  pthread_mutex_unlock(&names_mu);
  free(o);
  return rc;
}

/* The creation of open (named name) ended: its generation closes. */
static void name_generation_end(const char *name, tc__gen_open_t *open) {
  if (!open) return;
  pthread_mutex_lock(&names_mu);
  tc__name_t *e = name_find(names, names_cap, name);
  for (tc__gen_open_t **p = &e->open; *p;) {
    if (*p == open) {
      *p = open->next;
      continue;
    }
    if ((*p)->gen == open->gen) (*p)->closed = 1;
    p = &(*p)->next;
  }
  pthread_mutex_unlock(&names_mu);
  free(open);
}

int tc__comm_enter(tc_comm_t **c, const char *fn) {
  if (!*c)
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: %s: argument 'comm' is NULL", fn);
  int stale;
  tc_comm_t *p = tc__htable_get(&comms, *c, &stale);
  if (!p && stale)
    return tc__set_error(TC_ERR_INVALID_USAGE,
                         "torchcomms: %s: the communicator handle was "
                         "destroyed", fn);
  if (!p) /* some other pointer, a work or a batch handle: never read */
    return tc__set_error(TC_ERR_INVALID_USAGE,
                         "torchcomms: %s: argument 'comm' is not a "
                         "communicator handle", fn);
  *c = p;
  return TC_OK;
}

/* The live communicator of a handle for the getters (NULL otherwise). */
static tc_comm_t *comm_live(const tc_comm_t *h, const char *fn) {
  tc_comm_t *c = (tc_comm_t *)h;
  return tc__comm_enter(&c, fn) == TC_OK ? c : NULL;
}

void tc__comm_ref(tc_comm_t *c) { atomic_fetch_add(&c->refs, 1); }

/* tc__lock_t (core.h): taken by someone else. */
void tc__lock_slow(tc__lock_t *l) {
  for (int i = 0; i < 100; i++) {
    int z = 0;
    if (atomic_load_explicit(&l->state, memory_order_relaxed) == 0 &&
        atomic_compare_exchange_strong_explicit(&l->state, &z, 1, memory_order_acquire,
                                                memory_order_relaxed))
      return;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  for (;;) {
    atomic_fetch_add(&l->sleepers, 1);
    int z = 0;
    if (atomic_compare_exchange_strong_explicit(&l->state, &z, 1, memory_order_acquire,
                                                memory_order_relaxed)) {
      atomic_fetch_sub(&l->sleepers, 1);
      return;
    }
    struct timespec ts = {0, 1000000}; /* 1 ms: a wake-up missed costs no more */
    syscall(SYS_futex, (int *)&l->state, FUTEX_WAIT_PRIVATE, 1, &ts, NULL, 0);
    atomic_fetch_sub(&l->sleepers, 1);
  }
}

void tc__lock_wake(tc__lock_t *l) {
  syscall(SYS_futex, (int *)&l->state, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

/* Held while a handle is made live or closed, and while tc__comm_all takes
 * its references: a communicator it finds live cannot be released under it. */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;

size_t tc__comm_all(tc_comm_t ***out) {
  *out = NULL;
  size_t n = 0, cap = 0;
  pthread_mutex_lock(&live_mu);
  uint32_t used = tc__htable_used(&comms);
  for (uint32_t i = 0; i < used; i++) {
    tc_comm_t *c = tc__htable_live(&comms, i);
    if (!c || c->magic != TC_COMM_MAGIC) continue;
    if (n == cap) {
      size_t ncap = cap ? 2 * cap : 8;
      tc_comm_t **p = realloc(*out, ncap * sizeof *p);
      if (!p) break;
      *out = p;
      cap = ncap;
    }
    tc__comm_ref(c);
    (*out)[n++] = c;
  }
  pthread_mutex_unlock(&live_mu);
  return n;
}

/* The last reference gone (destroyed, no work left): the slot is reused. */
void tc__comm_unref(tc_comm_t *c) {
  if (atomic_fetch_sub(&c->refs, 1) != 1) return;
  /* no work refers to it any more: what only works could still touch goes */
  tc__hooks_free(c);
  tc__fr_free(c);
  tc__board_free(c);
  free(c->granks);
  c->granks = NULL;
  tc__htable_put(&comms, c->slot);
}

void tc__comm_record_error(tc_comm_t *c, const char *text) {
  pthread_mutex_lock(&c->err_mu);
  snprintf(c->last_error, sizeof c->last_error, "%s", text);
  pthread_mutex_unlock(&c->err_mu);
}

void tc__comm_message(const tc_comm_t *c, const char *fn, const char *detail, char *out,
                      size_t len) {
  snprintf(out, len, "torchcomms: %s on '%s' (rank %d of %d): %s", fn, c ? c->name : "?",
           c ? c->rank : -1, c ? c->size : 0, detail);
}

const char *tc__comm_state_refusal(const tc_comm_t *c, int state, int *rc) {
  *rc = TC_ERR_INVALID_USAGE;
  switch (state) {
  case TC_STATE_FINALIZED:
    return "the communicator was finalized (create a new one)";
  case TC_STATE_ABORTED:
    *rc = TC_ERR_ABORTED;
    return c->reconfigurable
               ? "the communicator was aborted (reconfigure it into a new group, or "
                 "create a new one)"
               : "the communicator was aborted (create a new one)";
  case TC_STATE_UNCONFIGURED:
    return "the communicator has no members: it was created with "
           "enable_reconfigure=True and is configured by reconfigure(uuid, "
           "init_handles), which has not succeeded yet";
  case TC_STATE_RECONFIGURING:
    return "the communicator is being reconfigured (by another thread); wait for "
           "reconfigure to return";
  default:
    return "the communicator is not usable";
  }
}

int tc__comm_error(tc_comm_t *c, int rc, const char *fn, const char *fmt, ...) {
  char detail[768], full[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  tc__comm_message(c, fn, detail, full, sizeof full);
  tc__comm_record_error(c, full);
  return tc__set_error_text(rc, full);
}

static int copy_hints(const tc_hint_t *hints, size_t n, tc_hint_t **out,
                          const char *fn) {
  *out = NULL;
  if (n == 0) return TC_OK;
  if (!hints)
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: %s: 'hints' is NULL but num_hints is %zu",
                         fn, n);
  tc_hint_t *h = calloc(n, sizeof *h);
  if (!h) return tc__set_error(TC_ERR_NOMEM, "torchcomms: %s: out of memory", fn);
  for (size_t i = 0; i < n; i++) {
    if (!hints[i].key || !hints[i].value) {
      for (size_t j = 0; j < i; j++) {
        free((void *)h[j].key);
        free((void *)h[j].value);
      }
      free(h);
      return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                           "torchcomms: %s: hint %zu has a NULL key or value",
                           fn, i);
    }
    h[i].key = strdup(hints[i].key);
    h[i].value = strdup(hints[i].value);
  }
  *out = h;
  return TC_OK;
}

static void free_hints(tc_hint_t *h, size_t n) {
  if (!h) return;
  for (size_t i = 0; i < n; i++) {
    free((void *)h[i].key);
    free((void *)h[i].value);
  }
  free(h);
}

struct tc_old_hints {
  struct tc_old_hints *next;
  tc_hint_t *hints;
  size_t n;
};

static void free_old_hints(struct tc_old_hints *o) {
  while (o) {
    struct tc_old_hints *next = o->next;
    free_hints(o->hints, o->n);
    free(o);
    o = next;
  }
}

/* 1 if the backend has a native split (and its table is that long). */
static int has_split(const tc_backend_ops_t *ops) {
  return ops->size >= offsetof(tc_backend_ops_t, split) + sizeof ops->split &&
         ops->split != NULL;
}

const char *tc__comm_advertise_addr(tc_store_t *store) {
  const char *addr = tc__setting_str(TC_SET_SOCKET_ADDR);
  if (!addr && store) addr = tc_store_local_addr(store);
  return addr ? addr : "127.0.0.1";
}

/* Common tail of create, split and reconfigure: backend init on a prefixed
 * store (c->root_store + c->prefix), for c->rank of c->size. */
int tc__comm_start(tc_comm_t *c, const tc_comm_t *parent, const int *ranks,
                   size_t nranks, const char *fn, double timeout_s) {
  if (c->store) tc_store_release(c->store);
  c->store = NULL;
  int rc = tc_store_prefix(c->root_store, c->prefix, &c->store);
  if (rc != TC_OK) return rc;
  TC_CHECK(tc__comm_arrive(c, fn));
  tc_backend_init_args_t args = {
      .size = sizeof args, .host = &tc__host, .comm_name = c->name,
      .device = c->device, .device_index = c->device_index, .rank = c->rank,
      .world_size = c->size, .timeout_s = timeout_s, .store = c->store,
      .advertise_addr = tc__comm_advertise_addr(c->root_store), .hints = c->hints,
      .num_hints = c->num_hints, .epoch = c->epoch};
  char err[512] = "";
  void *keys;
  tc__comm_record_begin(c, &keys);
  if (parent && has_split(c->ops))
    rc = c->ops->split(parent->bcomm, ranks, nranks, &args, &c->bcomm, err,
                       sizeof err);
  else
    rc = c->ops->init(&args, &c->bcomm, err, sizeof err);
  /* init returned on this rank only once every rank finished its setup:
   * the keys written for it are no longer needed by anyone */
  tc__comm_record_end(c, keys, rc == TC_OK);
  if (rc != TC_OK)
    return tc__comm_error(c, rc, fn, "backend '%s' failed to start: %s",
                          c->backend_name, err[0] ? err : tc_strerror(rc));
  tc__board_setup(c); /* every rank is alive and connected */
  return TC_OK;
}

/* A communicator in a free slot (its struct reused, or a new one), not yet
 * live: its handle is made by comm_publish once it works. */
static tc_comm_t *comm_new(void) {
  uint32_t idx;
  void *obj;
  if (tc__htable_take(&comms, &idx, &obj)) return NULL;
  tc_comm_t *c = obj;
  if (c) { /* the slot's earlier communicator is gone: nothing refers to it */
    pthread_mutex_destroy(&c->err_mu);
    pthread_mutex_destroy(&c->hints_mu);
    pthread_mutex_destroy(&c->win_mu);
    /* the spare work stays with the struct for its next life */
    tc_work_t *spare = atomic_load(&c->spare_work);
    int made = atomic_load(&c->spare_made);
    memset(c, 0, sizeof *c);
    atomic_store(&c->spare_work, spare);
    atomic_store(&c->spare_made, made);
  } else if ((c = calloc(1, sizeof *c))) {
    tc__htable_set(&comms, idx, c); /* kept for the slot's later lives */
  } else {
    tc__htable_put(&comms, idx);
    return NULL;
  }
  tc__lock_init(&c->mu);
  pthread_mutex_init(&c->err_mu, NULL);
  pthread_mutex_init(&c->hints_mu, NULL);
  pthread_mutex_init(&c->win_mu, NULL);
  tc__hooks_init(c);
  tc__fr_init(c);
  atomic_store(&c->last_progress_ns, (int64_t)(tc__now() * 1e9));
  atomic_store(&c->refs, 1); /* the creator's, then the user's handle */
  c->slot = idx;
  c->magic = TC_COMM_MAGIC;
  return c;
}

/* Makes c's handle live and returns it. */
static tc_comm_t *comm_publish(tc_comm_t *c) {
  pthread_mutex_lock(&live_mu);
  c->handle = (tc_comm_t *)tc__htable_open(&comms, c->slot);
  pthread_mutex_unlock(&live_mu);
  return c->handle;
}

/* Releases everything c holds and its handle's reference (its handle, if it
 * had one, must be closed already); the struct and its slot are reused once
 * no work refers to them any more. */
static void comm_release(tc_comm_t *c) {
  tc__reconfig_close(c);
  if (c->bcomm) tc__windows_drop(c, "its communicator was destroyed");
  if (c->bcomm) c->ops->destroy(c->bcomm);
  c->bcomm = NULL;
  if (c->store) tc_store_release(c->store);
  if (c->root_store) tc_store_release(c->root_store);
  c->store = c->root_store = NULL;
  free_hints(c->hints, c->num_hints);
  c->hints = NULL;
  c->num_hints = 0;
  free_old_hints(c->old_hints);
  c->old_hints = NULL;
  c->magic = TC_COMM_DEAD;
  tc__comm_unref(c);
}

static double default_timeout(void) {
  return tc__setting_double(TC_SET_TIMEOUT_SECONDS); /* > 0 */
}

int tc_comm_create(const char *backend, const char *device,
                   const tc_comm_options_t *opts, tc_comm_t **out) {
  static const char *fn = "tc_comm_create";
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  if (!out)
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: %s: argument 'out' is NULL", fn);
  *out = NULL;
  if (opts) {
    if (opts->size < offsetof(tc_comm_options_t, device_index) ||
        opts->version < 1 || opts->version > TC_COMM_OPTIONS_VERSION)
      return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                           "torchcomms: %s: options have size %u version %u; "
                           "initialise them with TC_COMM_OPTIONS_INIT",
                           fn, opts->size, opts->version);
    memcpy(&o, opts, opts->size < sizeof o ? opts->size : sizeof o);
  }
  if (!device) device = "cpu";
  char bad[512];
  if (tc__settings_reload(bad, sizeof bad) != TC_OK) /* the snapshot of this creation */
    return tc__set_error(TC_ERR_INVALID_ARGUMENT, "torchcomms: %s: %s", fn, bad);
  if (isnan(o.timeout_s) || o.timeout_s < 0)
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: %s: option 'timeout_s' must be >= 0 "
                         "(0 = default)", fn);
  const char *name = o.name ? o.name : "main";
  if (!*name || strlen(name) >= sizeof(((tc_comm_t *)0)->name) ||
      strchr(name, '/'))
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: %s: option 'name' must be 1..127 "
                         "characters without '/'", fn);
  int rank = o.rank, size = o.world_size;
  if (o.enable_reconfigure) { /* no members until reconfigure */
    rank = -1;
    size = 0;
  } else if (rank < 0 || size <= 0) {
    const char *src;
    TC_CHECK(tc_env_rank_size(&rank, &size, &src));
  } else if (rank >= size) {
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: %s: option 'rank' %d is out of range for "
                         "world_size %d", fn, rank, size);
  }
  const tc_backend_ops_t *ops;
  backend = tc__backend_alias(backend, device); /* "gloo" -> "cpu" */
  TC_CHECK(tc__backend_find(backend, &ops));
  if (o.enable_reconfigure && !TC_BACKEND_HAS_CAP(ops, TC_BACKEND_CAP_RECONFIGURE))
    return tc__set_error(TC_ERR_NOT_SUPPORTED,
                         "torchcomms: %s: backend '%s' does not support "
                         "enable_reconfigure=True (reconfigure not implemented); "
                         "create the communicator without it, or use backend 'cpu'",
                         fn, backend);
  tc_comm_t *c = comm_new();
  if (!c) return tc__set_error(TC_ERR_NOMEM, "torchcomms: %s: out of memory", fn);
  snprintf(c->name, sizeof c->name, "%s", name);
  snprintf(c->backend_name, sizeof c->backend_name, "%s", backend);
  snprintf(c->device, sizeof c->device, "%s", device);
  c->device_index = o.device_index;
  c->rank = rank;
  c->size = size;
  c->ops = ops;
  c->express = TC_BACKEND_HAS_EXPRESS(ops) && tc__setting_bool(TC_SET_EXPRESS);
  c->express_p2p = c->express && TC_BACKEND_HAS_CAP(ops, TC_BACKEND_CAP_EXPRESS_P2P);
  c->timeout_s = o.timeout_s > 0 ? o.timeout_s : default_timeout();
  c->abort_process = o.abort_process_on_timeout_or_error >= 0
                         ? o.abort_process_on_timeout_or_error != 0
                         : tc__setting_bool(TC_SET_ABORT_ON_ERROR);
  int rc = copy_hints(o.hints, o.num_hints, &c->hints, fn);
  if (rc != TC_OK) goto fail;
  c->num_hints = o.num_hints;
  if (o.store) {
    tc_store_retain(o.store);
    c->root_store = o.store;
    c->private_store = tc__store_is_private(o.store);
  } else if (!o.enable_reconfigure && TC_BACKEND_HAS_CAP(ops, TC_BACKEND_CAP_BOOTSTRAP) &&
             (!tc__env_str("MASTER_ADDR") || !tc__env_str("MASTER_PORT"))) {
    /* the backend finds its peers itself (mpirun): the core's bookkeeping
     * gets an in-process store, and nothing that needs a shared one */
    rc = tc_store_memory(&c->root_store);
    if (rc != TC_OK) goto fail;
    c->private_store = 1;
  } else if (!o.enable_reconfigure) {
    rc = tc__default_store(rank, size, c->timeout_s, &c->root_store);
    if (rc != TC_OK) goto fail;
  }
  if (o.enable_reconfigure) {
    c->reconfigurable = 1;
    __atomic_store_n(&c->state, TC_STATE_UNCONFIGURED, __ATOMIC_RELEASE);
    rc = tc__reconfig_open(c, fn);
    if (rc != TC_OK) goto fail;
    *out = comm_publish(c);
    return TC_OK;
  }
  uint64_t gen;
  tc__gen_open_t *open;
  if (name_generation(c->name, rank, size, &gen, &open)) {
    rc = tc__set_error(TC_ERR_NOMEM, "torchcomms: %s: out of memory", fn);
    goto fail;
  }
  tc__comm_scope_prefix(c->prefix, sizeof c->prefix, c->name, gen);
  rc = tc__comm_start(c, NULL, NULL, 0, fn, c->timeout_s);
  name_generation_end(c->name, open);
  if (rc != TC_OK) goto fail;
  tc__fr_set_global_rank(c->rank); /* the first communicator's: the job's ranks */
  *out = comm_publish(c);
  tc__comm_log_created(c);
  return TC_OK;
fail:;
  char saved[1024];
  snprintf(saved, sizeof saved, "%s", tc_last_error());
  comm_release(c);
  return tc__set_error_text(rc, saved);
}

int tc_comm_finalize(tc_comm_t *c) {
  TC_CHECK(tc__comm_enter(&c, "tc_comm_finalize"));
  tc__lock(&c->mu);
  int state = c->state;
  if (state == TC_STATE_ACTIVE || state == TC_STATE_UNCONFIGURED ||
      (state == TC_STATE_ABORTED && c->reconfigurable))
    __atomic_store_n(&c->state, TC_STATE_FINALIZED, __ATOMIC_RELEASE);
  tc__unlock(&c->mu);
  if (state == TC_STATE_RECONFIGURING)
    return tc__comm_error(c, TC_ERR_INVALID_USAGE, "finalize",
                          "the communicator is being reconfigured by another thread; "
                          "finalize it after reconfigure returned");
  if (c->reconfigurable && state != TC_STATE_FINALIZED)
    tc__reconfig_close(c); /* its endpoint: no reconfigure after finalize */
  if (state != TC_STATE_ACTIVE) return TC_OK; /* twice is harmless */
  tc__board_state(c, TC_STATE_FINALIZED);
  char why[768] = "";
  tc__windows_drop(c, "its communicator was finalized");
  int rc = c->ops->finalize(c->bcomm, why, sizeof why);
  c->ops->destroy(c->bcomm);
  c->bcomm = NULL;
  if (rc != TC_OK)
    return tc__comm_error(c, rc, "finalize", "%s", why[0] ? why : tc_strerror(rc));
  return TC_OK;
}

static void comm_abort(tc_comm_t *c) {
  tc__lock(&c->mu);
  int state = c->state;
  if (state == TC_STATE_ACTIVE || state == TC_STATE_UNCONFIGURED)
    __atomic_store_n(&c->state, TC_STATE_ABORTED, __ATOMIC_RELEASE);
  else if (state == TC_STATE_RECONFIGURING) /* that thread gives up (reconfig.c) */
    atomic_store(&c->rc_cancel, 1);
  tc__unlock(&c->mu);
  if (state != TC_STATE_ACTIVE) return;
  c->ops->abort(c->bcomm);
  tc__windows_drop(c, "its communicator was aborted");
  c->ops->destroy(c->bcomm);
  c->bcomm = NULL;
}

int tc__comm_state(tc_comm_t *c) { return __atomic_load_n(&c->state, __ATOMIC_ACQUIRE); }

int tc_comm_abort(tc_comm_t *c) {
  TC_CHECK(tc__comm_enter(&c, "tc_comm_abort"));
  if (tc__comm_state(c) == TC_STATE_ACTIVE) {
    tc__hooks_abort(c);
    tc__board_state(c, TC_STATE_ABORTED);
    tc__fr_auto_dump(c, "the communicator was aborted");
  }
  comm_abort(c);
  return TC_OK;
}

int tc_comm_is_aborted(const tc_comm_t *h) {
  tc_comm_t *c = comm_live(h, "tc_comm_is_aborted");
  return c && tc__comm_state(c) == TC_STATE_ABORTED;
}

/* The handle goes stale first (a second destroy, also from another thread,
 * is "destroyed"), then the backend is torn down: works it completes during
 * that still reach the struct, which lives on while they refer to it. */
int tc_comm_destroy(tc_comm_t *h) {
  tc_comm_t *c = h;
  TC_CHECK(tc__comm_enter(&c, "tc_comm_destroy"));
  pthread_mutex_lock(&live_mu);
  int closed = tc__htable_close(&comms, h);
  pthread_mutex_unlock(&live_mu);
  if (!closed)
    return tc__set_error(TC_ERR_INVALID_USAGE,
                         "torchcomms: tc_comm_destroy: the communicator handle "
                         "was destroyed");
  comm_abort(c);
  comm_release(c);
  return TC_OK;
}

int tc_comm_rank(const tc_comm_t *h) {
  tc_comm_t *c = comm_live(h, "tc_comm_rank");
  return c ? c->rank : -1;
}
int tc_comm_size(const tc_comm_t *h) {
  tc_comm_t *c = comm_live(h, "tc_comm_size");
  return c ? c->size : -1;
}
const char *tc_comm_name(const tc_comm_t *h) {
  tc_comm_t *c = comm_live(h, "tc_comm_name");
  return c ? c->name : NULL;
}
const char *tc_comm_backend(const tc_comm_t *h) {
  tc_comm_t *c = comm_live(h, "tc_comm_backend");
  return c ? c->backend_name : NULL;
}
const char *tc_comm_backend_version(const tc_comm_t *h) {
  tc_comm_t *c = comm_live(h, "tc_comm_backend_version");
  if (!c) return NULL;
  return c->ops->version ? c->ops->version : "unknown";
}
const char *tc_comm_device(const tc_comm_t *h) {
  tc_comm_t *c = comm_live(h, "tc_comm_device");
  return c ? c->device : NULL;
}
const char *tc_comm_last_error(const tc_comm_t *h) {
  tc_comm_t *c = comm_live(h, "tc_comm_last_error");
  return c ? c->last_error : "";
}

int tc_comm_get_options(const tc_comm_t *h, tc_comm_options_t *out) {
  tc_comm_t *c = (tc_comm_t *)h;
  TC_CHECK(tc__comm_enter(&c, "tc_comm_get_options"));
  if (!out)
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: tc_comm_get_options: argument 'out' is "
                         "NULL");
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.name = c->name;
  o.timeout_s = c->timeout_s;
  o.abort_process_on_timeout_or_error = c->abort_process;
  pthread_mutex_lock(&c->hints_mu);
  o.hints = c->hints;
  o.num_hints = c->num_hints;
  pthread_mutex_unlock(&c->hints_mu);
  o.store = c->root_store;
  o.rank = c->rank;
  o.world_size = c->size;
  o.device_index = c->device_index;
  o.enable_reconfigure = c->reconfigurable;
  *out = o;
  return TC_OK;
}

int tc_comm_set_timeout(tc_comm_t *c, double timeout_s) {
  TC_CHECK(tc__comm_enter(&c, "tc_comm_set_timeout"));
  if (!(timeout_s > 0) || isinf(timeout_s))
    return tc__comm_error(c, TC_ERR_INVALID_ARGUMENT, "tc_comm_set_timeout",
                          "argument 'timeout_s' must be a positive number of "
                          "seconds");
  c->timeout_s = timeout_s;
  return TC_OK;
}

int tc_comm_set_hints(tc_comm_t *c, const tc_hint_t *hints, size_t num_hints) {
  static const char *fn = "tc_comm_set_hints";
  TC_CHECK(tc__comm_enter(&c, fn));
  tc_hint_t *add;
  int rc = copy_hints(hints, num_hints, &add, fn);
  if (rc != TC_OK) return rc;
  struct tc_old_hints *old = calloc(1, sizeof *old);
  pthread_mutex_lock(&c->hints_mu);
  size_t n = c->num_hints + num_hints;
  tc_hint_t *h = n && old ? calloc(n, sizeof *h) : NULL;
  if (n && !h) {
    pthread_mutex_unlock(&c->hints_mu);
    free(old);
    free_hints(add, num_hints);
    return tc__comm_error(c, TC_ERR_NOMEM, fn, "out of memory");
  }
  /* the kept hints (keys not given again, first occurrence), then the given
   * ones (a key given twice: the last value wins) */
  size_t k = 0;
  for (size_t i = 0; i < c->num_hints; i++) {
    int given = 0;
    for (size_t j = 0; j < num_hints && !given; j++)
      given = strcmp(c->hints[i].key, add[j].key) == 0;
    if (!given) {
      h[k].key = strdup(c->hints[i].key);
      h[k++].value = strdup(c->hints[i].value);
    }
  }
  for (size_t j = 0; j < num_hints; j++) {
    size_t i = 0;
    while (i < k && strcmp(h[i].key, add[j].key) != 0) i++;
    if (i < k) { /* repeated within `hints` */
      free((void *)h[i].value);
      h[i].value = add[j].value;
      free((void *)add[j].key);
    } else {
      h[k++] = add[j];
    }
  }
  free(add);
  if (old) {
    old->hints = c->hints;
    old->n = c->num_hints;
    old->next = c->old_hints;
    c->old_hints = old;
  }
  c->hints = h;
  c->num_hints = k;
  pthread_mutex_unlock(&c->hints_mu);
  return TC_OK;
}

/* ---- split ---- */

static uint64_t hash_ranks(const int *ranks, size_t n) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (size_t i = 0; i < n; i++) {
    uint32_t v = (uint32_t)ranks[i];
    for (int b = 0; b < 4; b++) {
      h ^= (v >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return h;
}

/* Why a rank's 'ranks' list is refused: published in the split's exchange
 * (as -reason) so that every rank fails together. */
enum {
  SPLIT_OK = 0,
  SPLIT_NOMEM = 1,
  SPLIT_BAD_NAME = 2,
  SPLIT_OUT_OF_RANGE = 3,
  SPLIT_DUPLICATE = 4,
  SPLIT_NOT_MEMBER = 5
};

/* Checks the caller's list and name, in torchcomms' order (each entry in
 * range, no duplicates, then the caller present): SPLIT_OK (and *me, the
 * caller's index in the list, or -1 for an empty list) or the reason, with
 * the text of the caller's own error in msg and the offending value in
 * *detail. A list longer than the communicator stops at its first repeated
 * or out-of-range entry, within size + 1 entries. */
static int split_check(const tc_comm_t *c, const int *ranks, size_t nranks,
                       const char *name, int *me, int64_t *detail, char *msg,
                       size_t len) {
  *me = -1;
  if (nranks > 0 && (!name || !*name || strlen(name) >= sizeof c->name ||
                     strchr(name, '/'))) {
    snprintf(msg, len, "argument 'name' must be 1..127 characters without "
             "'/'");
    return SPLIT_BAD_NAME;
  }
  unsigned char *seen = nranks ? calloc((size_t)c->size, 1) : NULL;
  if (nranks && !seen) {
    snprintf(msg, len, "out of memory");
    return SPLIT_NOMEM;
  }
  for (size_t i = 0; i < nranks; i++) {
    *detail = ranks[i];
    if (ranks[i] < 0 || ranks[i] >= c->size) {
      free(seen);
      snprintf(msg, len, "ranks[%zu] = %d is out of range [0, %d) (invalid "
               "rank in ranks)", i, ranks[i], c->size);
      return SPLIT_OUT_OF_RANGE;
    }
    if (seen[ranks[i]]) {
      free(seen);
      snprintf(msg, len, "rank %d appears twice in 'ranks' (duplicate ranks "
               "found in ranks list)", ranks[i]);
      return SPLIT_DUPLICATE;
    }
    seen[ranks[i]] = 1;
    if (ranks[i] == c->rank) *me = (int)i;
  }
  free(seen);
  if (nranks > 0 && *me < 0) {
    *detail = c->rank;
    snprintf(msg, len, "'ranks' does not contain the caller's rank %d (pass "
             "an empty list to join no group)", c->rank);
    return SPLIT_NOT_MEMBER;
  }
  return SPLIT_OK;
}

/* A peer's refused list, in a few words (see split_check). */
static void split_reason(int why, int64_t detail, char *out, size_t len) {
  long long d = (long long)detail;
  switch (why) {
  case SPLIT_NOMEM: snprintf(out, len, "it ran out of memory checking it"); break;
  case SPLIT_BAD_NAME: snprintf(out, len, "an invalid 'name'"); break;
  case SPLIT_OUT_OF_RANGE: snprintf(out, len, "rank %lld is out of range", d); break;
  case SPLIT_DUPLICATE: snprintf(out, len, "rank %lld appears twice", d); break;
  case SPLIT_NOT_MEMBER:
    snprintf(out, len, "it does not contain rank %lld itself", d);
    break;
  default: snprintf(out, len, "reason %d", why); break;
  }
}

int tc_comm_split(tc_comm_t *c, const int *ranks, size_t nranks,
                  const char *name, const tc_op_options_t *opts,
                  tc_comm_t **out) {
  static const char *fn = "tc_comm_split";
  tc_comm_t *handle = c; /* for the public all_gather below */
  TC_CHECK(tc__comm_enter(&c, fn));
  if (!out)
    return tc__comm_error(c, TC_ERR_INVALID_ARGUMENT, fn,
                          "argument 'out' is NULL");
  *out = NULL;
  if (nranks > 0 && !ranks)
    return tc__comm_error(c, TC_ERR_INVALID_ARGUMENT, fn,
                          "argument 'ranks' is NULL but nranks is %zu", nranks);
  /* Every rank takes part in the exchange below even when its own list is
   * refused, so that a refused list fails the split on every rank at once
   * instead of leaving the others waiting for it. */
  char why[256] = "";
  int64_t detail = 0;
  int me = -1;
  int bad = split_check(c, ranks, nranks, name, &me, &detail, why, sizeof why);
  /* Agree on the groups: every rank publishes (nranks, hash of its list),
   * or (-reason, detail) for a refused list. */
  int64_t mine[2] = {(int64_t)nranks, (int64_t)hash_ranks(ranks, nranks)};
  if (bad) {
    mine[0] = -(int64_t)bad;
    mine[1] = detail;
  }
  int64_t *all = calloc((size_t)c->size * 2, sizeof *all);
  if (!all) return tc__comm_error(c, TC_ERR_NOMEM, fn, "out of memory");
  int rc = tc_all_gather_single(handle, all, mine, 2, TC_INT64, opts, NULL);
  if (rc != TC_OK) {
    free(all);
    return rc;
  }
  /* every rank counts this split, refused or not */
  uint64_t seq = c->split_seq++;
  if (bad) {
    free(all);
    return tc__comm_error(c, bad == SPLIT_NOMEM ? TC_ERR_NOMEM
                                               : TC_ERR_INVALID_ARGUMENT,
                          fn, "%s", why);
  }
  for (int r = 0; r < c->size; r++) {
    if (all[2 * r] >= 0) continue;
    char theirs[128];
    split_reason((int)-all[2 * r], all[2 * r + 1], theirs, sizeof theirs);
    free(all);
    return tc__comm_error(c, TC_ERR_INVALID_ARGUMENT, fn,
                          "rank %d passed an invalid 'ranks' list (%s), so "
                          "the split fails on every rank; fix that rank's "
                          "list", r, theirs);
  }
  /* Members of one group must pass the same list. A rank only sees the
   * lists of its own group's members, so a second exchange tells every
   * rank whether any rank found a mismatch. */
  int64_t mismatch[2] = {-1, 0};
  for (size_t i = 0; i < nranks; i++) {
    int r = ranks[i];
    if (all[2 * r] != mine[0] || all[2 * r + 1] != mine[1]) {
      mismatch[0] = r;
      mismatch[1] = all[2 * r];
      break;
    }
  }
  rc = tc_all_gather_single(handle, all, mismatch, 2, TC_INT64, opts, NULL);
  if (rc != TC_OK) {
    free(all);
    return rc;
  }
  for (int r = 0; r < c->size; r++) {
    if (all[2 * r] < 0) continue;
    int peer = (int)all[2 * r];
    long long count = (long long)all[2 * r + 1];
    free(all);
    if (r == c->rank)
      return tc__comm_error(c, TC_ERR_INVALID_ARGUMENT, fn,
                            "rank %d passed a different rank list (%lld "
                            "ranks) for this group; every member must pass "
                            "the same list in the same order", peer, count);
    return tc__comm_error(c, TC_ERR_INVALID_ARGUMENT, fn,
                          "rank %d found that rank %d passed a different "
                          "rank list for their group, so the split fails on "
                          "every rank; every member must pass the same list "
                          "in the same order", r, peer);
  }
  free(all);
  if (nranks == 0) {
    /* a native split is collective over the parent (ncclCommSplit): the
     * ranks joining no group take part too */
    if (!has_split(c->ops)) return TC_OK;
    char err[512] = "";
    void *none = NULL;
    rc = c->ops->split(c->bcomm, NULL, 0, NULL, &none, err, sizeof err);
    if (rc != TC_OK)
      return tc__comm_error(c, rc, fn, "backend '%s' failed to split: %s",
                            c->backend_name, err[0] ? err : tc_strerror(rc));
    return TC_OK;
  }

  tc_comm_t *child = comm_new();
  if (!child) return tc__comm_error(c, TC_ERR_NOMEM, fn, "out of memory");
  snprintf(child->name, sizeof child->name, "%s", name);
  memcpy(child->backend_name, c->backend_name, sizeof c->backend_name);
  memcpy(child->device, c->device, sizeof c->device);
  child->device_index = c->device_index;
  child->rank = me;
  child->size = (int)nranks;
  child->ops = c->ops;
  child->express = c->express;
  child->express_p2p = c->express_p2p;
  child->granks = malloc(nranks * sizeof *child->granks);
  if (!child->granks) {
    comm_release(child);
    return tc__comm_error(c, TC_ERR_NOMEM, fn, "out of memory");
  }
  for (size_t i = 0; i < nranks; i++)
    child->granks[i] = c->granks ? c->granks[ranks[i]] : ranks[i];
  child->timeout_s = c->timeout_s;
  child->abort_process = c->abort_process;
  if (opts && opts->num_hints) { /* per-split hints replace the parent's */
    rc = copy_hints(opts->hints, opts->num_hints, &child->hints, fn);
    child->num_hints = rc == TC_OK ? opts->num_hints : 0;
  } else {
    pthread_mutex_lock(&c->hints_mu);
    rc = copy_hints(c->hints, c->num_hints, &child->hints, fn);
    child->num_hints = rc == TC_OK ? c->num_hints : 0;
    pthread_mutex_unlock(&c->hints_mu);
  }
  if (rc != TC_OK) {
    comm_release(child);
    return rc;
  }
  tc_store_retain(c->root_store);
  child->root_store = c->root_store;
  child->private_store = c->private_store;
  /* Flat, bounded key prefix whatever the nesting depth of splits. */
  uint64_t ph = 1469598103934665603ull;
  for (const char *p = c->prefix; *p; p++) ph = (ph ^ (uint8_t)*p) * 1099511628211ull;
  snprintf(child->prefix, sizeof child->prefix, "tc/split/%016llx/%llu/%016llx",
           (unsigned long long)ph, (unsigned long long)seq,
           (unsigned long long)mine[1]);
  rc = tc__comm_start(child, c, ranks, nranks, "tc_comm_split", child->timeout_s);
  if (rc != TC_OK) {
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", tc_last_error());
    comm_release(child);
    return tc__set_error_text(rc, saved);
  }
  *out = comm_publish(child);
  return TC_OK;
}

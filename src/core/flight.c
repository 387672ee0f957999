/* flight.c -- the flight recorder: a ring of the last operations of every
 * communicator, dumped as torch's Flight Recorder trace (JSON).
 *
 * An entry is written at issue (under the communicator's lock, right before
 * the backend gets the operation) and updated when it starts and ends; all
 * under fr_lock, a lock no one holds for long. The ring's size is
 * TORCH_FR_BUFFER_SIZE (default 2000; 0 records nothing) and grows with
 * tc_fr_reserve (FlightRecorderHook(max_entries)).
 *
 * The dump follows torch.distributed's Flight Recorder (version "2.10"):
 * {"version", "comm_lib_version", "pg_config", "pg_status", "entries"}, one
 * entry per operation with torch's field names, process groups named by
 * communicator, so `python -m torch.distributed.flight_recorder.fr_trace -j`
 * reads a folder of per-rank dumps. */
#include "core.h"

#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sched.h>
#include <unistd.h>

typedef struct tc__fr_entry {
  uint64_t record_id;
  uint64_t op_id, coll_seq, p2p_seq;
  tc_op_type_t type;
  tc_dtype_t dtype;
  int peer; /* root or peer, -1 */
  int state;
  int async_op;
  size_t in_elems, out_elems;
  double created, started, done; /* monotonic seconds (tc__now); 0: not yet */
  double timeout_s;
  double duration_s;
  int nframes;
  char *caller_frames; /* the caller's own frames (JSON list text), owned, or NULL */
} tc__fr_entry_t;

static _Thread_local const char *caller_frames;

void tc__fr_set_caller_frames(const char *json) { caller_frames = json; }

int tc__fr_stacks_wanted(const tc_comm_t *h) {
  tc_comm_t *c = (tc_comm_t *)h;
  if (tc__comm_enter(&c, "tc__fr_stacks_wanted") != TC_OK) return 0;
  return c->fr_stacks != NULL;
}

static int stacks_setting(void) {
  return tc__setting_bool(TC_SET_FR_STACK) || tc__setting_bool(TC_SET_FR_CPP_STACK);
}

static int64_t wall_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static _Atomic int global_rank = -1;

int tc__fr_global_rank(void) {
  int r = atomic_load(&global_rank);
  if (r >= 0) return r;
  int size;
  const char *src;
  if (tc_env_rank_size(&r, &size, &src) != TC_OK) r = 0;
  return r;
}

void tc__fr_set_global_rank(int rank) {
  int expect = -1;
  atomic_compare_exchange_strong(&global_rank, &expect, rank);
}

static void fr_set_locked(tc_comm_t *c, uint64_t fr_id, size_t slot, int state, double issued,
                          double started, const double *ended);

/* Under fr_lock: the express operation's completion kept aside
 * (tc__fr_end_express) goes into its entry. */
static inline void fr_take_pending(tc_comm_t *c) {
  const uint64_t fr_id = atomic_load_explicit(&c->fr_pend_id, memory_order_acquire);
  if (!fr_id) return;
  atomic_store_explicit(&c->fr_pend_id, 0, memory_order_relaxed);
  fr_set_locked(c, fr_id, c->fr_pend_slot, TC_FR_COMPLETED, c->fr_pend_started,
                c->fr_pend_started, &c->fr_pend_end);
}

/* The recorder's lock: a few stores per operation are done under it, so a
 * spin lock (yielding when held: a dump copies the ring under it, some
 * tens of microseconds) costs less than a mutex on the hot path. Whoever
 * takes it first moves an express operation's completion into the ring,
 * so every reader under it sees the ring as it is. */
static inline void fr_lock(tc_comm_t *c) {
  while (atomic_exchange_explicit(&c->fr_lock, 1, memory_order_acquire)) sched_yield();
  fr_take_pending(c);
}
static void fr_unlock(tc_comm_t *c) { atomic_store_explicit(&c->fr_lock, 0, memory_order_release); }

/* The oldest record id still in c's ring (under fr_lock). */
static uint64_t fr_lo(const tc_comm_t *c) {
  uint64_t lo = c->fr_count > c->fr_cap ? c->fr_count - c->fr_cap : 0;
  return lo > c->fr_base ? lo : c->fr_base;
}

/* Touches every page of a fresh calloc'd block now. A large calloc is fresh
 * mmap'd memory whose pages fault in on first write: in the ring, a fault
 * every 32 operations (3-8 us each in a VM) for the first TORCH_FR_BUFFER_SIZE
 * operations, which is where a latency benchmark's first size runs. */
static void *prefault(void *p, size_t bytes) {
  for (size_t i = 0; p && i < bytes; i += 4096) ((volatile char *)p)[i] = 0;
  return p;
}

/* The ring: zeroed, every page touched, each entry on its own two cache
 * lines (128-byte entries at a 128-byte boundary; calloc's 16 would spread
 * one over three), so the prefetch of the next entry at issue covers it. */
static tc__fr_entry_t *ring_alloc(size_t n) {
  _Static_assert(sizeof(tc__fr_entry_t) == 128, "an entry is two cache lines");
  size_t bytes;
  if (__builtin_mul_overflow(n, sizeof(tc__fr_entry_t), &bytes)) return NULL; /* as calloc */
  tc__fr_entry_t *r = aligned_alloc(128, bytes);
  if (r) memset(r, 0, bytes);
  return r;
}

void tc__fr_init(tc_comm_t *c) {
  atomic_store(&c->fr_lock, 0);
  atomic_store(&c->fr_pend_id, 0);
  size_t n = (size_t)tc__setting_double(TC_SET_FR_BUFFER_SIZE);
  c->fr = n ? ring_alloc(n) : NULL;
  c->fr_cap = c->fr ? n : 0;
  c->fr_stacks = c->fr_cap && stacks_setting()
                     ? prefault(calloc(c->fr_cap * TC_FR_FRAMES, sizeof(void *)),
                                c->fr_cap * TC_FR_FRAMES * sizeof(void *))
                     : NULL;
  c->fr_count = c->fr_base = 0;
  c->fr_next = 0;
  atomic_store(&c->fr_dumped, 0);
}

void tc__fr_free(tc_comm_t *c) {
  for (size_t i = 0; i < c->fr_cap; i++) free(c->fr[i].caller_frames);
  free(c->fr);
  free(c->fr_stacks);
  c->fr_stacks = NULL;
  c->fr = NULL;
  c->fr_cap = 0;
  c->fr_next = 0;
}

/* How many entries ahead fr_record asks for the lines it writes next (see
 * there). */
#define FR_AHEAD 3

/* Records op (coll_seq / p2p_seq as tc_op_info_t's), issued at `created`,
 * in state `state` (TC_FR_STARTED: started at `created`); stack frames
 * from our caller's caller when they are kept. Returns the record id + 1
 * (0: not recorded) and its place in *slot. */
static inline __attribute__((always_inline)) uint64_t
fr_record(tc_comm_t *c, const tc_backend_op_t *op, uint64_t coll_seq, uint64_t p2p_seq,
          double created, double timeout_s, int state, size_t *slot_out) {
  if (!c->fr_cap) return 0;
  size_t in, out; /* elements */
  switch (op->kind) {
  /* torch records a broadcast's tensor as input on every rank: its
   * analyser compares input sizes across ranks */
  case TC_KIND_BROADCAST:
  case TC_KIND_ALL_REDUCE:
  case TC_KIND_REDUCE: in = out = op->count; break; /* without a call (~35 instructions) */
  default: {
    /* element sizes are powers of two: shifts, not divisions (a 64-bit
     * division costs tens of cycles, several per operation added up) */
    const size_t es = tc__dtype_size(op->dtype);
    const int sh = es ? __builtin_ctzll(es) : 0;
    tc__op_bytes(op, c->rank, c->size, &in, &out);
    in = es ? in >> sh : 0;
    out = es ? out >> sh : 0;
  }
  }
  void *frames[TC_FR_FRAMES + 1];
  int nf = c->fr_stacks ? backtrace(frames, TC_FR_FRAMES + 1) - 1 : 0; /* from our caller */
  if (nf < 0) nf = 0;
  char *mine = c->fr_stacks && caller_frames && caller_frames[0] ? strdup(caller_frames) : NULL;
  char *old = NULL;
  uint64_t rid = 0;
  fr_lock(c);
  if (c->fr_cap) {
    uint64_t id = c->fr_count++;
    const size_t slot = c->fr_next;
    c->fr_next = slot + 1 == c->fr_cap ? 0 : slot + 1;
    tc__fr_entry_t *e = &c->fr[slot];
    /* the two lines of the entry FR_AHEAD on, for writing: a ring of 2000
     * does not stay in L1, and the lock's exchange would wait for their
     * misses (8 B broadcast at 2 ranks, bench form, with the alignment: 0.25
     * -> 0.20 us). The next entry alone was too late in the ring's first
     * lap, whose lines are then not in this core's caches: with it, the
     * first 2 000 8-byte broadcasts took 0.01-0.02 us more each than the
     * next 2 000 in each of 6 launches (not so with a ring of 16); three
     * ahead, in 2 of 6 (docs/benchmarks.md, "The first laps"). */
    size_t pf = c->fr_next + FR_AHEAD;
    while (pf >= c->fr_cap) pf -= c->fr_cap;
    __builtin_prefetch(&c->fr[pf], 1);
    __builtin_prefetch((char *)&c->fr[pf] + 64, 1);
    old = e->caller_frames;
    *e = (tc__fr_entry_t){.record_id = id, .op_id = op->seq, .coll_seq = coll_seq,
                          .p2p_seq = p2p_seq, .type = op->type, .dtype = op->dtype,
                          .peer = op->root, .state = state,
                          .async_op = (op->flags & TC_BACKEND_OP_ASYNC) != 0,
                          .in_elems = in, .out_elems = out,
                          .created = created, .timeout_s = timeout_s,
                          .started = state == TC_FR_STARTED ? created : 0};
    if (c->fr_stacks) {
      memcpy(&c->fr_stacks[slot * TC_FR_FRAMES], frames + 1,
             (size_t)nf * sizeof(void *));
      e->nframes = nf;
      e->caller_frames = mine;
      mine = NULL;
    }
    rid = id + 1;
    *slot_out = slot;
  }
  fr_unlock(c);
  if (old) free(old);
  if (mine) free(mine);
  return rid;
}

void tc__fr_issue(tc_comm_t *c, tc_work_t *w) {
  w->fr_id = fr_record(c, &w->op, w->coll_seq, w->p2p_seq, w->issue_time, w->timeout_s,
                       TC_FR_SCHEDULED, &w->fr_slot);
}

uint64_t tc__fr_record_started(tc_comm_t *c, const tc_backend_op_t *op, uint64_t coll_seq,
                               uint64_t p2p_seq, double created, double timeout_s, size_t *slot) {
  return fr_record(c, op, coll_seq, p2p_seq, created, timeout_s, TC_FR_STARTED, slot);
}

/* Under fr_lock: entry fr_id (id + 1) moves to state with the operation's
 * times (monotonic, taken anyway: no clock is read here; the dump turns
 * them into wall-clock nanoseconds); `ended` read only for an end. */
static void fr_set_locked(tc_comm_t *c, uint64_t fr_id, size_t slot, int state, double issued,
                          double started, const double *ended) {
  uint64_t id = fr_id - 1;
  if (!c->fr_cap || id < fr_lo(c)) return; /* overwritten or reset since */
  /* where it was put, unless tc_fr_reserve moved it since */
  if (slot >= c->fr_cap || c->fr[slot].record_id != id) slot = id % c->fr_cap;
  tc__fr_entry_t *e = &c->fr[slot];
  if (e->record_id != id || e->state >= TC_FR_COMPLETED) return;
  e->state = state;
  e->started = started;
  if (state != TC_FR_STARTED) {
    e->done = *ended;
    double t0 = started > 0 ? started : issued;
    e->duration_s = *ended > t0 ? *ended - t0 : 0;
  }
}

void tc__fr_set(tc_comm_t *c, uint64_t fr_id, size_t slot, int state, double issued,
                double started, double ended) {
  if (!c || !fr_id) return;
  fr_lock(c);
  fr_set_locked(c, fr_id, slot, state, issued, started, &ended);
  fr_unlock(c);
}

/* The end of an express operation, without fr_lock: its exchange, right
 * after the operation's last stores to a line its peer reads, waited for
 * that line to come back from the peer's core (8 B broadcast at 2 ranks,
 * Intel Xeon guest, alternating launches: 0.205 -> 0.19 us). What was kept aside before was
 * taken by this operation's record (under the lock); a second one kept
 * aside anyway (not expected) goes in under the lock as before. */
void tc__fr_end_express(tc_comm_t *c, uint64_t fr_id, size_t slot, double started,
                        double ended) {
  if (!fr_id) return;
  if (atomic_load_explicit(&c->fr_pend_id, memory_order_relaxed)) {
    tc__fr_set(c, fr_id, slot, TC_FR_COMPLETED, started, started, ended);
    return;
  }
  c->fr_pend_slot = slot;
  c->fr_pend_started = started;
  c->fr_pend_end = ended;
  atomic_store_explicit(&c->fr_pend_id, fr_id, memory_order_release);
}

/* The work's times are read under the lock: a start recorded after the
 * post (tc__work_posted) may meet the backend's thread ending the work. */
void tc__fr_update(tc_work_t *w, int state) {
  tc_comm_t *c = w->comm;
  if (!c || !w->fr_id) return;
  fr_lock(c);
  fr_set_locked(c, w->fr_id, w->fr_slot, state, w->issue_time, w->start_time, &w->end_time);
  fr_unlock(c);
}

/* ---- the dump ---- */

typedef struct {
  char *buf;
  size_t n, cap;
  int oom;
  int64_t mono_to_wall; /* wall-clock ns minus monotonic ns at the dump */
} sbuf_t;

static void sb_add(sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(sbuf_t *b, const char *fmt, ...) {
  if (b->oom) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->buf ? b->buf + b->n : NULL, b->buf ? b->cap - b->n : 0, fmt, ap);
    va_end(ap);
    if (k < 0) {
      b->oom = 1;
      return;
    }
    if (b->buf && b->n + (size_t)k < b->cap) {
      b->n += (size_t)k;
      return;
    }
    size_t cap = b->cap ? 2 * b->cap : 4096;
    while (cap < b->n + (size_t)k + 1) cap *= 2;
    char *p = realloc(b->buf, cap);
    if (!p) {
      b->oom = 1;
      return;
    }
    b->buf = p;
    b->cap = cap;
  }
}

/* s as a JSON string (names are ours: no control characters expected,
 * quotes and backslashes escaped all the same). */
static void sb_str(sbuf_t *b, const char *s) {
  sb_add(b, "\"");
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') sb_add(b, "\\%c", ch);
    else if (ch < 0x20) sb_add(b, "\\u%04x", ch);
    else sb_add(b, "%c", ch);
  }
  sb_add(b, "\"");
}

static const char *state_name(int s) {
  switch (s) {
  case TC_FR_SCHEDULED: return "scheduled";
  case TC_FR_STARTED: return "started";
  case TC_FR_COMPLETED: return "completed";
  case TC_FR_FAILED: return "failed";
  case TC_FR_TIMED_OUT: return "timed_out";
  }
  return "unknown";
}

/* torch's dtype names ("Float", "BFloat16"), as the analyser prints them. */
static const char *torch_dtype(tc_dtype_t dt) {
  static const char *n[] = {"Float", "Double", "Half", "BFloat16", "Char", "Byte",
                            "Short", "Int", "Long", "Bool", "Float8_e4m3fn", "Float8_e5m2"};
  return (unsigned)dt < sizeof n / sizeof *n ? n[dt] : "Float";
}

static int comm_grank(const tc_comm_t *c, int r) { return c->granks ? c->granks[r] : r; }

/* torch's analyser knows a fixed set of backends and operations: our cpu
 * backend (and plugins) are named "gloo" there, gather_single "gather", a
 * batch "coalesced"; send and recv carry "src->dst" / "dst<-src". */
static void profiling_name(char *buf, size_t len, const tc_comm_t *c, const tc__fr_entry_t *e) {
  static const char *known[] = {"nccl", "ncclx", "xccl", "gloo", "rccl", "rcclx", "mccl", "hccl"};
  const char *be = "gloo";
  for (size_t i = 0; i < sizeof known / sizeof *known; i++)
    if (!strcmp(c->backend_name, known[i])) be = known[i];
  const char *op = e->type == TC_OP_GATHER_SINGLE ? "gather"
                   : e->type == TC_OP_BATCH       ? "coalesced"
                                                  : tc_op_name(e->type);
  if (e->type == TC_OP_SEND)
    snprintf(buf, len, "%s:send %d->%d", be, c->rank, e->peer);
  else if (e->type == TC_OP_RECV)
    snprintf(buf, len, "%s:recv %d<-%d", be, c->rank, e->peer);
  else
    snprintf(buf, len, "%s:%s", be, op);
}

static void dump_pg_config(sbuf_t *b, const tc_comm_t *c) {
  sb_str(b, c->name);
  sb_add(b, ": {\"name\": ");
  sb_str(b, c->name);
  sb_add(b, ", \"desc\": ");
  sb_str(b, c->backend_name);
  sb_add(b, ", \"ranks\": \"[");
  for (int r = 0; r < c->size; r++) sb_add(b, "%s%d", r ? ", " : "", comm_grank(c, r));
  sb_add(b, "]\"}");
}

static void dump_pg_status(sbuf_t *b, tc_comm_t *c) {
  uint64_t last_started = 0, last_completed = 0;
  fr_lock(c);
  for (uint64_t id = fr_lo(c); id < c->fr_count; id++) {
    const tc__fr_entry_t *e = &c->fr[id % c->fr_cap];
    if (e->record_id != id || !e->coll_seq) continue;
    if (e->state >= TC_FR_STARTED && e->coll_seq > last_started) last_started = e->coll_seq;
    if (e->state == TC_FR_COMPLETED && e->coll_seq > last_completed)
      last_completed = e->coll_seq;
  }
  fr_unlock(c);
  sb_str(b, c->name);
  sb_add(b, ": {\"last_enqueued_collective\": %llu, \"last_started_collective\": %llu, "
            "\"last_completed_collective\": %llu}",
         (unsigned long long)__atomic_load_n(&c->coll_seq, __ATOMIC_RELAXED),
         (unsigned long long)last_started,
         (unsigned long long)last_completed);
}

/* Wall-clock nanoseconds minus monotonic ones, now: turns the entries'
 * monotonic times into torch's wall-clock *_ns fields. */
#define wall_of(mono) ((int64_t)((mono) * 1e9) + b->mono_to_wall)

static void dump_entry(sbuf_t *b, const tc_comm_t *c, const tc__fr_entry_t *e,
                       void *const *pcs, int first, int pg_index) {
  int p2p = e->coll_seq == 0;
  const char *dt = torch_dtype(e->dtype);
  int has_in = e->in_elems > 0 || e->type == TC_OP_BARRIER;
  int has_out = e->out_elems > 0;
  sb_add(b, "%s\n  {\"record_id\": %llu, \"pg_id\": %d, \"process_group\": [", first ? "" : ",",
         (unsigned long long)e->record_id, pg_index);
  sb_str(b, c->name);
  sb_add(b, ", ");
  sb_str(b, c->backend_name);
  char pname[96];
  profiling_name(pname, sizeof pname, c, e);
  sb_add(b, "], \"collective_seq_id\": %llu, \"p2p_seq_id\": %llu, \"op_id\": %llu, "
            "\"profiling_name\": \"%s\", \"time_created_ns\": %lld, ",
         (unsigned long long)e->coll_seq, (unsigned long long)e->p2p_seq,
         (unsigned long long)e->op_id, pname, (long long)wall_of(e->created));
  if (has_in) sb_add(b, "\"input_sizes\": [[%zu]], \"input_dtypes\": [\"%s\"], ", e->in_elems, dt);
  else sb_add(b, "\"input_sizes\": [], \"input_dtypes\": [], ");
  if (has_out)
    sb_add(b, "\"output_sizes\": [[%zu]], \"output_dtypes\": [\"%s\"], ", e->out_elems, dt);
  else sb_add(b, "\"output_sizes\": [], \"output_dtypes\": [], ");
  sb_add(b, "\"state\": \"%s\", ", state_name(e->state));
  if (e->started > 0)
    sb_add(b, "\"time_discovered_started_ns\": %lld, ", (long long)wall_of(e->started));
  else sb_add(b, "\"time_discovered_started_ns\": null, ");
  if (e->done > 0)
    sb_add(b, "\"time_discovered_completed_ns\": %lld, \"duration_ms\": %.6f, ",
           (long long)wall_of(e->done), e->duration_s * 1e3);
  else sb_add(b, "\"time_discovered_completed_ns\": null, \"duration_ms\": null, ");
  sb_add(b, "\"retired\": %s, \"timeout_ms\": %lld, \"is_p2p\": %s, \"async_op\": %s, "
            "\"frames\": [",
         e->state >= TC_FR_COMPLETED ? "true" : "false", (long long)(e->timeout_s * 1e3),
         p2p ? "true" : "false", e->async_op ? "true" : "false");
  /* the caller's own frames (Python's), then the C ones from the public
   * entry (tc_all_reduce, ...) on: the frames above it are the library's */
  if (e->caller_frames) sb_add(b, "%s", e->caller_frames);
  int top = 0;
  for (int i = 0; i < e->nframes; i++) {
    Dl_info di;
    if (dladdr(pcs[i], &di) && di.dli_sname && !strncmp(di.dli_sname, "tc_", 3) &&
        strncmp(di.dli_sname, "tc__", 4)) {
      top = i;
      break;
    }
  }
  for (int i = top; i < e->nframes; i++) {
    void *pc = pcs[i];
    Dl_info di;
    char name[64];
    const char *fname = "??", *file = "??";
    if (dladdr(pc, &di)) {
      if (di.dli_sname) fname = di.dli_sname;
      if (di.dli_fname) file = di.dli_fname;
    }
    if (!strcmp(fname, "??")) {
      snprintf(name, sizeof name, "%p", pc);
      fname = name;
    }
    sb_add(b, "%s{\"name\": ", i > top || e->caller_frames ? ", " : "");
    sb_str(b, fname);
    sb_add(b, ", \"filename\": ");
    sb_str(b, file);
    sb_add(b, ", \"line\": 0}");
  }
  sb_add(b, "]}");
}

/* The communicators to dump: comm alone, or every live one. */
static size_t dump_comms(tc_comm_t *one, tc_comm_t ***out) {
  if (one) {
    *out = malloc(sizeof **out);
    if (!*out) return 0;
    (*out)[0] = one;
    tc__comm_ref(one);
    return 1;
  }
  return tc__comm_all(out);
}

static int dump_json(tc_comm_t *one, int include_completed, char **out) {
  tc_comm_t **cs = NULL;
  size_t n = dump_comms(one, &cs);
  sbuf_t b = {.mono_to_wall = wall_ns() - (int64_t)(tc__now() * 1e9)};
  sb_add(&b, "{\"version\": \"2.10\", \"comm_lib_version\": \"torchcomms-c %s\", "
             "\"rank\": %d, \"pg_config\": {", tc_version(), tc__fr_global_rank());
  for (size_t i = 0; i < n; i++) {
    if (i) sb_add(&b, ", ");
    dump_pg_config(&b, cs[i]);
  }
  sb_add(&b, "}, \"pg_status\": {");
  for (size_t i = 0; i < n; i++) {
    if (i) sb_add(&b, ", ");
    dump_pg_status(&b, cs[i]);
  }
  sb_add(&b, "}, \"entries\": [");
  int first = 1;
  for (size_t i = 0; i < n && !b.oom; i++) {
    /* copy the ring under the lock, format outside it */
    tc_comm_t *c = cs[i];
    fr_lock(c);
    size_t cap = c->fr_cap, k = 0;
    tc__fr_entry_t *es = cap ? malloc(cap * sizeof *es) : NULL;
    void **st = es && c->fr_stacks ? malloc(cap * TC_FR_FRAMES * sizeof *st) : NULL;
    if (es && (st || !c->fr_stacks)) {
      for (uint64_t id = fr_lo(c); id < c->fr_count; id++) {
        const tc__fr_entry_t *e = &c->fr[id % cap];
        if (e->record_id != id) continue;
        if (!include_completed && e->state == TC_FR_COMPLETED) continue;
        if (st)
          memcpy(&st[k * TC_FR_FRAMES], &c->fr_stacks[(id % cap) * TC_FR_FRAMES],
                 TC_FR_FRAMES * sizeof *st);
        es[k] = *e;
        es[k].caller_frames = e->caller_frames ? strdup(e->caller_frames) : NULL;
        k++;
      }
    } else if (cap) {
      b.oom = 1;
    }
    fr_unlock(c);
    for (size_t j = 0; j < k; j++) {
      dump_entry(&b, c, &es[j], st ? &st[j * TC_FR_FRAMES] : NULL, first, (int)i);
      free(es[j].caller_frames);
      first = 0;
    }
    free(es);
    free(st);
  }
  sb_add(&b, "\n]}\n");
  for (size_t i = 0; i < n; i++) tc__comm_unref(cs[i]);
  free(cs);
  if (b.oom) {
    free(b.buf);
    return tc__set_error(TC_ERR_NOMEM, "torchcomms: tc_fr_dump_json: out of memory");
  }
  *out = b.buf;
  return TC_OK;
}

int tc_fr_dump_json(const tc_comm_t *h, int include_completed, char **out) {
  if (!out)
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: tc_fr_dump_json: argument 'out' is NULL");
  *out = NULL;
  tc_comm_t *c = (tc_comm_t *)h;
  if (c) TC_CHECK(tc__comm_enter(&c, "tc_fr_dump_json"));
  return dump_json(c, include_completed, out);
}

/* Writes len bytes to path through a temporary name, so a reader never
 * sees half a trace. The temporary name is unique per call, not only per
 * process: ranks running as threads of one process may dump at once. */
static int write_file(const char *path, const char *text, size_t len) {
  static _Atomic unsigned seq;
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp%d.%u", path, (int)getpid(),
           atomic_fetch_add(&seq, 1));
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) goto fail;
  size_t done = 0;
  while (done < len) {
    ssize_t k = write(fd, text + done, len - done);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      close(fd);
      unlink(tmp);
      goto fail;
    }
    done += (size_t)k;
  }
  if (close(fd) != 0 || rename(tmp, path) != 0) {
    unlink(tmp);
    goto fail;
  }
  return TC_OK;
fail:
  return tc__set_error(TC_ERR_SYSTEM, "torchcomms: tc_fr_dump_file: cannot write '%s': %s",
                       path, strerror(errno));
}

static int dump_path(char *buf, size_t len, const char *path) {
  if (path) {
    snprintf(buf, len, "%s", path);
    return TC_OK;
  }
  /* torchcomms' own name first, as torchcomms.hooks.FlightRecorderHook */
  const char *prefix = tc__setting_str(TC_SET_FR_DUMP_TEMP_FILE_TC);
  if (!prefix) prefix = tc__setting_str(TC_SET_FR_DUMP_TEMP_FILE);
  if (!prefix)
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: tc_fr_dump_file: no path given and "
                         "TORCH_FR_DUMP_TEMP_FILE is not set");
  snprintf(buf, len, "%s%d", prefix, tc__fr_global_rank());
  return TC_OK;
}

int tc_fr_dump_file(const char *path, char **written) {
  char p[4096];
  if (written) *written = NULL;
  TC_CHECK(dump_path(p, sizeof p, path));
  char *json, *pk;
  size_t len;
  TC_CHECK(dump_json(NULL, 1, &json));
  int rc = tc__json_to_pickle(json, &pk, &len);
  free(json);
  if (rc != TC_OK)
    return tc__set_error(TC_ERR_INTERNAL, "torchcomms: tc_fr_dump_file: the trace is not "
                                          "well-formed JSON (a bug: please report it)");
  rc = write_file(p, pk, len);
  free(pk);
  if (rc == TC_OK && written) *written = strdup(p);
  return rc;
}

void tc__fr_auto_dump(tc_comm_t *c, const char *why) {
  if (!c->fr_cap) return;
  if (!tc__setting_str(TC_SET_FR_DUMP_TEMP_FILE) && !tc__setting_str(TC_SET_FR_DUMP_TEMP_FILE_TC))
    return;
  int expect = 0;
  if (!atomic_compare_exchange_strong(&c->fr_dumped, &expect, 1)) return;
  char *written = NULL;
  if (tc_fr_dump_file(NULL, &written) == TC_OK)
    tc__logs(TC_LOG_WARN, TC_LOG_COLL, "communicator '%s' (rank %d of %d): %s; flight recorder trace written to %s",
            c->name, c->rank, c->size, why, written);
  else
    tc__log(1, "communicator '%s': %s; the flight recorder trace could not be written: %s",
            c->name, why, tc_last_error());
  free(written);
}

size_t tc_fr_size(const tc_comm_t *h) {
  tc_comm_t *c = (tc_comm_t *)h;
  if (tc__comm_enter(&c, "tc_fr_size") != TC_OK) return 0;
  fr_lock(c);
  size_t n = (size_t)(c->fr_count - fr_lo(c));
  fr_unlock(c);
  return n;
}

static void fr_reset(tc_comm_t *c) {
  fr_lock(c);
  c->fr_base = c->fr_count; /* works still in flight find no entry */
  fr_unlock(c);
}

int tc_fr_reset(const tc_comm_t *h) {
  tc_comm_t *c = (tc_comm_t *)h;
  if (c) {
    TC_CHECK(tc__comm_enter(&c, "tc_fr_reset"));
    fr_reset(c);
    return TC_OK;
  }
  tc_comm_t **cs;
  size_t n = tc__comm_all(&cs);
  for (size_t i = 0; i < n; i++) {
    fr_reset(cs[i]);
    tc__comm_unref(cs[i]);
  }
  free(cs);
  return TC_OK;
}

int tc_fr_reserve(tc_comm_t *c, size_t entries) {
  TC_CHECK(tc__comm_enter(&c, "tc_fr_reserve"));
  if (entries > (1u << 24))
    return tc__comm_error(c, TC_ERR_INVALID_ARGUMENT, "tc_fr_reserve",
                          "argument 'entries' = %zu is above 16777216", entries);
  fr_lock(c);
  if (entries <= c->fr_cap) {
    fr_unlock(c);
    return TC_OK;
  }
  tc__fr_entry_t *n = ring_alloc(entries);
  if (!n) {
    fr_unlock(c);
    return tc__comm_error(c, TC_ERR_NOMEM, "tc_fr_reserve", "out of memory");
  }
  /* keep the recorded entries at their record ids' places in the new ring */
  void **st = NULL;
  int stacks = c->fr_stacks || stacks_setting();
  if (stacks && !(st = prefault(calloc(entries * TC_FR_FRAMES, sizeof(void *)),
                                entries * TC_FR_FRAMES * sizeof(void *)))) {
    free(n);
    fr_unlock(c);
    return tc__comm_error(c, TC_ERR_NOMEM, "tc_fr_reserve", "out of memory");
  }
  uint64_t lo = fr_lo(c);
  for (size_t i = 0; i < c->fr_cap; i++) { /* what is not moved below is dropped */
    uint64_t id = c->fr[i].record_id;
    if (!(id >= lo && id < c->fr_count && id % c->fr_cap == i)) {
      free(c->fr[i].caller_frames);
      c->fr[i].caller_frames = NULL;
    }
  }
  for (uint64_t id = lo; id < c->fr_count; id++) {
    n[id % entries] = c->fr[id % c->fr_cap];
    if (st && c->fr_stacks)
      memcpy(&st[(id % entries) * TC_FR_FRAMES], &c->fr_stacks[(id % c->fr_cap) * TC_FR_FRAMES],
             TC_FR_FRAMES * sizeof(void *));
  }
  free(c->fr_stacks);
  c->fr_stacks = st;
  c->fr_base = lo; /* older ids were overwritten: never dumped */
  free(c->fr);
  c->fr = n;
  c->fr_cap = entries;
  c->fr_next = c->fr_count % entries;
  fr_unlock(c);
  return TC_OK;
}

/* hang.c -- the status board and the cross-rank hang report.
 *
 * The board. Every communicator has, in shared memory made by its rank 0
 * (transport/shm.h's areas), one 64-byte slot per rank: the last collective
 * it issued and the last it completed (number and operation), its p2p
 * counters, its pid and state. A rank writes only its own slot, with plain
 * atomic stores at issue and completion (a few nanoseconds); it reads the
 * others' only when an operation of its own failed. Because the slots live
 * in memory, a peer that is stopped (SIGSTOP), busy in Python, or killed is
 * still described exactly as it last was.
 *
 * The report. When a collective times out or loses a peer, the rank reads
 * every slot and says who is behind: "ranks 3 and 5 never entered it (rank
 * 3 is in broadcast #1041, rank 5's last completed op is all_gather
 * #1039)". Ranks whose slot it cannot see (another host: the board is per
 * host) are asked through the store: each failing rank publishes its own
 * summary there, and the reader waits at most TORCHCOMMS_HANG_REPORT_S
 * (default 2 s) for the missing ones, once per communicator. The report
 * is appended to the failure's message; it never replaces it, and a store
 * that does not answer only shortens it. */
#include "core.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "transport/shm.h"

enum { SLOT_NONE = 0, SLOT_RUNNING, SLOT_FAILED, SLOT_FINALIZED, SLOT_ABORTED };

typedef struct tc__board_slot {
  _Atomic uint64_t issued;    /* coll_seq of the last collective issued */
  _Atomic uint64_t completed; /* ... and of the last one completed */
  _Atomic uint64_t p2p_issued, p2p_completed;
  _Atomic uint32_t issued_type, completed_type;
  _Atomic int32_t pid;
  _Atomic int32_t state; /* SLOT_* (NONE: the rank never mapped the board) */
  _Atomic uint64_t failed; /* coll_seq of a collective that failed on it */
  _Atomic uint32_t p2p_type; /* the last p2p operation issued, and its peer */
  _Atomic int32_t p2p_peer;
} board_slot_t;
_Static_assert(sizeof(board_slot_t) == 64, "one cache line per rank");

/* ---- the board ---- */

/* After the backend's init returned on every rank (all are alive and
 * connected): rank 0 makes the board and publishes its name; the others
 * map it; the last to map it unlinks the name and deletes the keys. A
 * rank that cannot map it (another host) reports through the store. */
void tc__board_setup(tc_comm_t *c) {
  c->board = NULL;
  c->board_name[0] = 0;
  if (c->size < 2 || c->private_store || !tc__setting_bool(TC_SET_HANG_REPORT) ||
      !tc__setting_bool(TC_SET_HANG_REPORT_BOARD))
    return;
  size_t bytes = (size_t)c->size * sizeof(board_slot_t);
  void *mem = NULL;
  char name[128];
  if (c->rank == 0) {
    if (tc__shm_area_create("fr-board", bytes, name, sizeof name, &mem) != TC_OK) {
      tc__log(3, "communicator '%s': no status board (%s); hang reports use the store",
              c->name, strerror(errno));
      snprintf(name, sizeof name, "-"); /* tells the others there is none */
    }
    if (tc_store_set(c->store, "frboard", name, strlen(name)) != TC_OK && mem) {
      tc__shm_area_unlink(name);
      tc__shm_area_unmap(mem, bytes);
      return;
    }
    if (mem) snprintf(c->board_name, sizeof c->board_name, "%s", name);
  } else {
    /* rank 0 sets it right after its init returned: a short wait, bounded
     * in case it died just then */
    double wait = c->timeout_s < 10 ? c->timeout_s : 10;
    void *v = NULL;
    size_t len = 0;
    if (tc_store_get(c->store, "frboard", &v, &len, wait) != TC_OK) return;
    snprintf(name, sizeof name, "%.*s", (int)(len < sizeof name ? len : sizeof name - 1),
             (const char *)v);
    free(v);
    if (strcmp(name, "-") && tc__shm_area_open(name, bytes, &mem) != TC_OK)
      mem = NULL; /* another host */
    int64_t readers = 0;
    if (tc_store_add(c->store, "frboard_read", 1, &readers) == TC_OK &&
        readers == c->size - 1) { /* the last: nobody needs the name any more */
      int del;
      if (strcmp(name, "-")) tc__shm_area_unlink(name);
      tc_store_delete(c->store, "frboard", &del);
      tc_store_delete(c->store, "frboard_read", &del);
    }
    if (!mem) return;
  }
  board_slot_t *s = &((board_slot_t *)mem)[c->rank];
  atomic_store(&s->pid, (int32_t)getpid());
  atomic_store(&s->state, SLOT_RUNNING);
  c->board = mem;
  c->board_bytes = bytes;
}

void tc__board_free(tc_comm_t *c) {
  if (c->board_name[0]) tc__shm_area_unlink(c->board_name); /* if a reader died */
  c->board_name[0] = 0;
  tc__shm_area_unmap(c->board, c->board_bytes);
  c->board = NULL;
}

static board_slot_t *my_slot(tc_comm_t *c) {
  return c->board ? &((board_slot_t *)c->board)[c->rank] : NULL;
}

void tc__board_issue_op(tc_comm_t *c, tc_op_type_t type, int peer, uint64_t coll_seq,
                        uint64_t p2p_seq) {
  board_slot_t *s = my_slot(c);
  if (!s) return;
  if (coll_seq) {
    atomic_store_explicit(&s->issued_type, (uint32_t)type, memory_order_relaxed);
    atomic_store_explicit(&s->issued, coll_seq, memory_order_release);
  } else {
    atomic_store_explicit(&s->p2p_type, (uint32_t)type, memory_order_relaxed);
    atomic_store_explicit(&s->p2p_peer, peer, memory_order_relaxed);
    atomic_store_explicit(&s->p2p_issued, p2p_seq, memory_order_release);
  }
}

void tc__board_issue(tc_comm_t *c, const tc_work_t *w) {
  tc__board_issue_op(c, w->op.type, w->op.root, w->coll_seq, w->p2p_seq);
}

void tc__board_done_op(tc_comm_t *c, tc_op_type_t type, uint64_t coll_seq, uint64_t p2p_seq,
                       int rc) {
  if (coll_seq && rc == TC_OK) {
    /* release, not seq_cst (two locked instructions per collective): the
     * report reads done_coll, then done_type */
    atomic_store_explicit(&c->done_type, (int)type, memory_order_relaxed);
    atomic_store_explicit(&c->done_coll, coll_seq, memory_order_release);
  }
  board_slot_t *s = my_slot(c);
  if (!s) return;
  if (!coll_seq) { /* ended, well or not: the rank is no longer in it */
    atomic_store_explicit(&s->p2p_completed, p2p_seq, memory_order_release);
    return;
  }
  if (rc != TC_OK) {
    atomic_store(&s->failed, coll_seq);
    return;
  }
  /* collectives complete in issue order on a communicator */
  atomic_store_explicit(&s->completed_type, (uint32_t)type, memory_order_relaxed);
  atomic_store_explicit(&s->completed, coll_seq, memory_order_release);
}

void tc__board_done(tc_comm_t *c, const tc_work_t *w, int rc) {
  tc__board_done_op(c, w->op.type, w->coll_seq, w->p2p_seq, rc);
}

void tc__board_state(tc_comm_t *c, int state) {
  board_slot_t *s = my_slot(c);
  if (s) atomic_store(&s->state, state == TC_STATE_ABORTED ? SLOT_ABORTED : SLOT_FINALIZED);
}

/* ---- the report ---- */

/* What one rank was doing, from its slot or from the store. */
typedef struct {
  int known;
  uint64_t issued, completed, failed;
  tc_op_type_t issued_type, completed_type;
  uint64_t p2p_issued, p2p_completed;
  tc_op_type_t p2p_type;
  int p2p_peer;
  int state;
  int gone; /* its process no longer exists */
} peer_t;

static const char *op_of(tc_op_type_t t) { return tc_op_name(t); }

static void read_slot(const board_slot_t *s, peer_t *p) {
  memset(p, 0, sizeof *p);
  p->state = atomic_load(&s->state);
  if (p->state == SLOT_NONE) return;
  p->known = 1;
  p->issued = atomic_load_explicit(&s->issued, memory_order_acquire);
  p->completed = atomic_load_explicit(&s->completed, memory_order_acquire);
  p->failed = atomic_load(&s->failed);
  p->issued_type = (tc_op_type_t)atomic_load(&s->issued_type);
  p->completed_type = (tc_op_type_t)atomic_load(&s->completed_type);
  p->p2p_issued = atomic_load_explicit(&s->p2p_issued, memory_order_acquire);
  p->p2p_completed = atomic_load_explicit(&s->p2p_completed, memory_order_acquire);
  p->p2p_type = (tc_op_type_t)atomic_load(&s->p2p_type);
  p->p2p_peer = atomic_load(&s->p2p_peer);
  pid_t pid = atomic_load(&s->pid);
  p->gone = pid > 0 && kill(pid, 0) != 0 && errno == ESRCH;
}

/* "<issued> <issued type> <completed> <completed type> <failed> <state>" */
static void publish(tc_comm_t *c, const peer_t *me) {
  char key[32], val[128];
  snprintf(key, sizeof key, "frstatus/%d", c->rank);
  int n = snprintf(val, sizeof val, "%llu %d %llu %d %llu %d", (unsigned long long)me->issued,
                   (int)me->issued_type, (unsigned long long)me->completed,
                   (int)me->completed_type, (unsigned long long)me->failed, me->state);
  tc_store_set(c->store, key, val, (size_t)n);
}

static int parse(const char *v, size_t len, peer_t *p) {
  char buf[128];
  snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf ? len : sizeof buf - 1), v);
  unsigned long long is, co, fa;
  int it, ct, st;
  if (sscanf(buf, "%llu %d %llu %d %llu %d", &is, &it, &co, &ct, &fa, &st) != 6) return -1;
  memset(p, 0, sizeof *p);
  p->known = 1;
  p->issued = is;
  p->completed = co;
  p->failed = fa;
  p->issued_type = (tc_op_type_t)it;
  p->completed_type = (tc_op_type_t)ct;
  p->state = st;
  return 0;
}

/* Fills the unknown peers from the store (at most budget_s in all). */
static void ask_store(tc_comm_t *c, peer_t *peers, double budget_s) {
  double end = tc__now() + budget_s;
  for (int r = 0; r < c->size; r++) {
    if (peers[r].known || r == c->rank) continue;
    double left = end - tc__now();
    if (left <= 0) break;
    char key[32];
    snprintf(key, sizeof key, "frstatus/%d", r);
    void *v = NULL;
    size_t len = 0;
    if (tc_store_get(c->store, key, &v, &len, left) == TC_OK) parse(v, len, &peers[r]);
    free(v);
  }
}

typedef struct {
  char *buf;
  size_t len, n;
} out_t;

static void put(out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(out_t *o, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  tc__vappendf(o->buf, o->len, &o->n, fmt, ap);
  va_end(ap);
}

/* "rank 3", "ranks 3 and 5", "ranks 1, 3 and 5" (at most 8 named). */
static void put_ranks(out_t *o, const int *rs, int n) {
  put(o, "rank%s ", n > 1 ? "s" : "");
  int shown = n > 8 ? 8 : n;
  for (int i = 0; i < shown; i++)
    put(o, "%s%d", i == 0 ? "" : (i == n - 1 ? " and " : ", "), rs[i]);
  if (n > shown) put(o, " and %d more", n - shown);
}

/* Where rank r is: "rank 3 is in broadcast #41", "rank 5's last completed
 * op is all_gather #39", "rank 2 has completed no collective". */
static void put_where(out_t *o, int r, const peer_t *p) {
  int in_coll = p->issued > p->completed && p->failed != p->issued;
  if (p->p2p_issued > p->p2p_completed) { /* waiting in a send, recv or batch */
    if (p->p2p_type == TC_OP_SEND || p->p2p_type == TC_OP_RECV)
      put(o, "rank %d is in %s %s rank %d (p2p #%llu)", r, op_of(p->p2p_type),
          p->p2p_type == TC_OP_SEND ? "to" : "from", p->p2p_peer,
          (unsigned long long)p->p2p_issued);
    else
      put(o, "rank %d is in %s (p2p #%llu)", r, op_of(p->p2p_type),
          (unsigned long long)p->p2p_issued);
    if (in_coll)
      put(o, " and %s #%llu", op_of(p->issued_type), (unsigned long long)p->issued);
    else if (p->completed)
      put(o, ", its last completed collective is %s #%llu", op_of(p->completed_type),
          (unsigned long long)p->completed);
  } else if (in_coll) {
    put(o, "rank %d is in %s #%llu", r, op_of(p->issued_type), (unsigned long long)p->issued);
  } else if (p->completed) {
    put(o, "rank %d's last completed op is %s #%llu", r, op_of(p->completed_type),
        (unsigned long long)p->completed);
  } else {
    put(o, "rank %d has completed no collective", r);
  }
  if (p->gone) put(o, " and its process is gone");
  else if (p->state == SLOT_ABORTED) put(o, " and it aborted the communicator");
  else if (p->state == SLOT_FINALIZED) put(o, " and it finalized the communicator");
}

/* A send or recv that failed: where its peer is (shared memory only). */
static void p2p_report(tc_comm_t *c, const tc_work_t *w, char *buf, size_t len) {
  int q = w->op.root;
  if (!c->board || q < 0 || q >= c->size) return;
  peer_t p;
  read_slot(&((board_slot_t *)c->board)[q], &p);
  if (!p.known) return;
  out_t o = {buf, len, 0};
  put(&o, "%s %s rank %d (p2p #%llu): ", w->opname, w->op.type == TC_OP_SEND ? "to" : "from", q,
      (unsigned long long)w->p2p_seq);
  put_where(&o, q, &p);
}

void tc__hang_report(tc_comm_t *c, const tc_work_t *w, char *buf, size_t len) {
  buf[0] = 0;
  if (c->size < 2 || !tc__setting_bool(TC_SET_HANG_REPORT)) return;
  if (!w->coll_seq) {
    if (w->op.type == TC_OP_SEND || w->op.type == TC_OP_RECV) p2p_report(c, w, buf, len);
    return;
  }
  peer_t *peers = calloc((size_t)c->size, sizeof *peers);
  int *behind = calloc((size_t)c->size, sizeof *behind);
  int *other = calloc((size_t)c->size, sizeof *other);
  int *unknown = calloc((size_t)c->size, sizeof *unknown);
  if (!peers || !behind || !other || !unknown) goto out;
  const uint64_t S = w->coll_seq;
  int nunknown = 0;
  for (int r = 0; r < c->size; r++) {
    if (c->board) read_slot(&((board_slot_t *)c->board)[r], &peers[r]);
    if (!peers[r].known && r != c->rank) nunknown++;
  }
  peer_t me = {.known = 1, .issued = S, .issued_type = w->op.type, .failed = S,
               .completed = atomic_load(&c->done_coll),
               .completed_type = (tc_op_type_t)atomic_load(&c->done_type),
               .state = SLOT_FAILED};
  peers[c->rank] = me;
  if (nunknown && !c->private_store) { /* an in-process store reaches no peer */
    int expect = 0; /* the store is asked once per communicator */
    publish(c, &me);
    if (atomic_compare_exchange_strong(&c->hang_reported, &expect, 1))
      ask_store(c, peers, tc__setting_double(TC_SET_HANG_REPORT_S));
  }
  int nb = 0, no = 0, nu = 0;
  for (int r = 0; r < c->size; r++) {
    if (r == c->rank) continue;
    const peer_t *p = &peers[r];
    if (!p->known) unknown[nu++] = r;
    else if (p->issued < S) behind[nb++] = r;
    else if ((p->issued == S && p->issued_type != w->op.type && p->completed < S) ||
             (p->completed == S && p->completed_type != w->op.type))
      other[no++] = r;
  }
  out_t o = {buf, len, 0};
  put(&o, "%s #%llu", w->opname, (unsigned long long)S);
  size_t head = o.n;
  if (nb) {
    put(&o, ": ");
    put_ranks(&o, behind, nb);
    put(&o, " never entered it (");
    for (int i = 0; i < nb && i < 8; i++) {
      if (i) put(&o, ", ");
      put_where(&o, behind[i], &peers[behind[i]]);
    }
    put(&o, ")");
  }
  if (no) {
    put(&o, "%s", o.n > head ? "; " : ": ");
    put_ranks(&o, other, no);
    put(&o, " called another operation as #%llu (", (unsigned long long)S);
    for (int i = 0; i < no && i < 8; i++)
      put(&o, "%srank %d: %s", i ? ", " : "", other[i], op_of(peers[other[i]].issued_type));
    put(&o, ")");
  }
  if (nu) {
    put(&o, "%s", o.n > head ? "; " : ": ");
    put_ranks(&o, unknown, nu);
    put(&o, " did not report (stopped or on another host without a reachable store)");
  }
  if (o.n == head) {
    /* everyone entered it: who gave up on it, who is still in it, whose
     * process is gone */
    int fl[64], nfl = 0, in[64], nin = 0, gone[64], ngone = 0;
    for (int r = 0; r < c->size; r++) {
      if (r == c->rank) continue;
      const peer_t *p = &peers[r];
      if (p->failed == S && nfl < 64) fl[nfl++] = r;
      else if (p->completed < S && nin < 64) in[nin++] = r;
      if (p->gone && ngone < 64) gone[ngone++] = r;
    }
    put(&o, ": every rank entered it");
    if (nfl) {
      put(&o, "; ");
      put_ranks(&o, fl, nfl);
      put(&o, " failed it too");
    }
    if (nin) {
      put(&o, "; still in it: ");
      put_ranks(&o, in, nin);
    }
    if (ngone) {
      put(&o, "; process gone: ");
      put_ranks(&o, gone, ngone);
    }
  }
out:
  free(peers);
  free(behind);
  free(other);
  free(unknown);
}

/* shm_setup.c -- the choice of transport and the shared-memory segments.
 *
 * tc__transport_open builds the TCP mesh first (tcp_connect.c: it also
 * counts the ranks per machine, keyed by host name and boot id, and carries
 * the communicator's random token). When every rank of the communicator is
 * on this machine (and TORCHCOMMS_CPU_TRANSPORT is not "tcp"), each rank
 * creates its segment "/torchcomms-<comm hash>-<token>-<rank>-..." (shm_open,
 * ftruncate, posix_fallocate so that a full /dev/shm fails here and not
 * with SIGBUS later, mmap), having first removed what dead processes left in
 * /dev/shm (shm_sweep.c, where the full name, which also names the creating
 * process, is described); an all-to-all over the mesh tells every rank that
 * every segment exists and its name; each maps all the others and checks
 * their geometry and token; a second all-to-all says all are mapped; then
 * each rank unlinks its own name at once. From then on nothing of the
 * communicator is left in /dev/shm, whatever happens to its processes.
 * Any failure is seen by every rank in the all-to-alls, so all of them fall
 * back to TCP together (or fail together, when shm was forced).
 *
 * Creation is all or nothing: on every path its last exchange is an
 * all-to-all (the single-copy probe's, or tc__mesh_final_barrier), so it returns
 * on no rank before every rank got there; in it a peer done with its part
 * may close (tc_tp_op_t.hangup_ok), so a rank that drops the communicator
 * (or dies) right after its creation returned fails no other's.
 *
 * A communicator on several machines uses the TCP transport; the cpu
 * backend then builds its hierarchy on top (src/backends/cpu/hier.c: shared
 * memory inside each machine, TCP between the machines' leaders). */
#include "transport/shm_internal.h"
#include "transport/tcp.h" /* tc__tcp_transport: the mesh as the transport */

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

static size_t pow2_floor(size_t v) {
  size_t p = 1;
  while (p <= v / 2) p *= 2;
  return p;
}

static size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* Segment geometry from TORCHCOMMS_SHM_BYTES (per rank) and the size. */
static void shm_geometry(struct tc_shm *s, size_t budget) {
  int n = s->size;
  if (budget < SHM_MIN_BYTES) budget = SHM_MIN_BYTES;
  if (budget > ((size_t)1 << 34)) budget = (size_t)1 << 34;
  s->slot_bytes = SHM_SLOT_BYTES;
  /* halves beyond a few hundred KiB only leave the caches (measured) */
  s->half_bytes = pow2_floor(budget / 8);
  if (s->half_bytes > SHM_HALF_MAX) s->half_bytes = SHM_HALF_MAX;
  if (s->half_bytes < SHM_HALF_MIN) s->half_bytes = SHM_HALF_MIN;
  size_t used = 2 * s->half_bytes + TC_SHM_SLOTS * s->slot_bytes;
  size_t rings = budget > used ? budget - used : 0;
  size_t ring = n > 1 ? pow2_floor(rings / (size_t)(n - 1) + 1) : 0;
  if (ring < 16 * 1024) ring = 16 * 1024;
  if (ring > ((size_t)1 << 30)) ring = (size_t)1 << 30;
  s->ring_bytes = ring;
  s->off_rctl = SHM_PAGE;
  s->off_line = s->off_rctl + round_up((size_t)n * sizeof(shm_ring_ctl_t), SHM_PAGE);
  s->off_ring = s->off_line + round_up((size_t)TC_SHM_LINES * TC_SHM_LINE_STRIDE, SHM_PAGE);
  s->off_slot = s->off_ring + (size_t)(n - 1) * ring;
  s->off_half = s->off_slot + TC_SHM_SLOTS * s->slot_bytes;
  s->total = s->off_half + 2 * s->half_bytes;
}

static void shm_segname(const struct tc_shm *s, int r, char *buf, size_t len) {
  tc__shm_name(buf, len, s->name, tc__mesh_token(s->mesh), r, &s->owners[r]);
}

/* Maps the pages of a segment's header lines into this process now (a
 * read of each: a shared mapping of /dev/shm then has them writable too),
 * so that the first laps of the ring do not take a page fault per line,
 * per rank and per segment (64 at 2 ranks: 0.3 us more per operation over
 * the first 1000 8-byte operations). */
static void shm_touch_lines(const struct tc_shm *s, const char *base) {
  for (size_t i = 0; i < TC_SHM_LINES; i++)
    (void)*(const volatile char *)(base + s->off_line + i * TC_SHM_LINE_STRIDE);
}

/* Maps the pages of a ring into this process now, for writing, so that
 * its first lap does not take a page fault every 4 KiB: a message ring
 * advances through all of its pages (2 MiB at 2 ranks) before it comes
 * back, and a write fault maps one page (a read fault maps 16 around it).
 * 2 ranks, send_recv as the bench measures it (5 + 1000 operations a
 * size), us: 512 B 1.24-1.57 -> 0.72-0.78, 8 B 0.50-0.64 -> 0.38-0.49
 * (docs/benchmarks.md, "The rings' first lap"). At most SHM_POPULATE_MAX
 * bytes of each ring: beyond, pages are faulted as they come. */
#define SHM_POPULATE_MAX (8u << 20)
static void shm_populate_ring(char *ring, size_t bytes) {
  if (bytes > SHM_POPULATE_MAX) bytes = SHM_POPULATE_MAX;
#ifdef MADV_POPULATE_WRITE
  if (madvise(ring, bytes, MADV_POPULATE_WRITE) == 0) return;
#endif
  /* an older kernel: a read of each page (a shared mapping of /dev/shm
   * then has it writable too) */
  for (size_t o = 0; o < bytes; o += SHM_PAGE) (void)*(const volatile char *)(ring + o);
}

static int setup_fail(struct tc_shm *s, char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int setup_fail(struct tc_shm *s, char *err, size_t errlen, int rc, const char *fmt, ...) {
  if (!err || !errlen) return rc;
  (void)s; /* the core adds the communicator, the rank and the size */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return rc;
}

/* Creates and maps the own segment; why[] gets the reason on failure. */
static int shm_create_own(struct tc_shm *s, char *why, size_t wl) {
  shm_segname(s, s->rank, s->segname, sizeof s->segname);
  int fd = shm_open(s->segname, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    snprintf(why, wl, "shm_open(%s) failed: %s", s->segname, strerror(errno));
    return -1;
  }
  s->created = 1;
  int e = 0;
  if (ftruncate(fd, (off_t)s->total) < 0) e = errno;
  if (!e) {
    int fe = posix_fallocate(fd, 0, (off_t)s->total);
    if (fe && fe != EOPNOTSUPP && fe != EINVAL) e = fe;
  }
  void *p = MAP_FAILED;
  if (!e && (p = mmap(NULL, s->total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED)
    e = errno;
  close(fd);
  if (e) {
    snprintf(why, wl, "could not allocate its %zu-byte segment in /dev/shm: %s "
             "(TORCHCOMMS_SHM_BYTES sets the size)", s->total, strerror(e));
    return -1;
  }
  s->base[s->rank] = p;
  shm_ctl_t *c = p;
  c->magic = SHM_MAGIC;
  c->version = SHM_VERSION;
  c->rank = (uint32_t)s->rank;
  c->size = (uint32_t)s->size;
  c->total = s->total;
  c->ring_bytes = s->ring_bytes;
  c->slot_bytes = s->slot_bytes;
  c->half_bytes = s->half_bytes;
  memcpy(c->token, tc__mesh_token(s->mesh), sizeof c->token);
  c->self_addr = (uint64_t)(uintptr_t)p;
  c->pid = (int32_t)getpid();
  s->me = c;
  shm_touch_lines(s, p);
  for (int q = 0; q < s->size; q++) /* the rings into this segment */
    if (q != s->rank) shm_populate_ring(shm_rdata(s, q, s->rank), s->ring_bytes);
  return 0;
}

/* Single copy between processes: can this rank read every peer's memory with
 * process_vm_readv? Each peer allowed it (PR_SET_PTRACER where Yama asks for
 * it) before the mapping barrier; the probe reads each peer's segment header
 * through the peer's own address and compares it with the mapped copy.
 * TORCHCOMMS_CPU_CMA=0 turns it off. Returns 1 if every peer can be read. */
static int shm_probe_cma(struct tc_shm *s) {
  if (!tc__setting_bool(TC_SET_CPU_CMA)) return 0;
  for (int p = 0; p < s->size; p++) {
    const shm_ctl_t *c = shm_ctl(s, p);
    s->pids[p] = c->pid;
    if (p == s->rank) continue;
    uint64_t got[2] = {0, 0};
    struct iovec l = {got, sizeof got}, r = {(void *)(uintptr_t)c->self_addr, sizeof got};
    if (process_vm_readv(c->pid, &l, 1, &r, 1, 0) != (ssize_t)sizeof got ||
        memcmp(got, c, sizeof got) != 0)
      return 0;
  }
  return 1;
}

/* Maps peer r's segment and checks it. */
static int shm_map_peer(struct tc_shm *s, int r, char *why, size_t wl) {
  char name[200];
  shm_segname(s, r, name, sizeof name);
  int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    snprintf(why, wl, "could not open rank %d's segment %s: %s", r, name, strerror(errno));
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) < 0 || (size_t)st.st_size != s->total) {
    close(fd);
    snprintf(why, wl, "rank %d's segment has %lld bytes instead of %zu "
             "(TORCHCOMMS_SHM_BYTES must be the same on every rank)", r,
             (long long)st.st_size, s->total);
    return -1;
  }
  void *p = mmap(NULL, s->total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (p == MAP_FAILED) {
    snprintf(why, wl, "could not map rank %d's segment: %s", r, strerror(e));
    return -1;
  }
  s->base[r] = p;
  shm_ctl_t *c = p;
  if (c->magic != SHM_MAGIC || c->version != SHM_VERSION || c->rank != (uint32_t)r ||
      c->size != (uint32_t)s->size || c->ring_bytes != s->ring_bytes ||
      c->slot_bytes != s->slot_bytes || c->half_bytes != s->half_bytes ||
      memcmp(c->token, tc__mesh_token(s->mesh), sizeof c->token) != 0) {
    snprintf(why, wl, "rank %d's segment does not match this rank's (another job, or "
             "TORCHCOMMS_SHM_BYTES differs between ranks)", r);
    return -1;
  }
  shm_touch_lines(s, p);
  shm_populate_ring(shm_rdata(s, s->rank, r), s->ring_bytes); /* this rank's ring to r */
  return 0;
}

static int shm_all_status(struct tc_shm *s, unsigned char mine, unsigned char *all,
                          int final, double deadline, char *err, size_t errlen) {
  return tc__mesh_all_gather(s->mesh, &mine, 1, all, final, deadline, err, errlen);
}

static void shm_unlink_own(struct tc_shm *s) {
  if (s->created && !s->unlinked) {
    shm_unlink(s->segname);
    s->unlinked = 1;
  }
}

void tc__shm_close(void *tp) {
  struct tc_shm *s = tp;
  if (!s) return;
  shm_unlink_own(s);
  if (s->base)
    for (int r = 0; r < s->size; r++)
      if (s->base[r]) munmap(s->base[r], s->total);
  tc__mesh_close(s->mesh);
  free(s->base);
  free(s->out_head);
  free(s->out_tail);
  free(s->in_tail);
  free(s->out_msgs);
  free(s->rtr_wait);
  free(s->send_head);
  free(s->send_tail);
  free(s->recv_head);
  free(s->recv_tail);
  free(s->bye);
  free(s->pids);
  free(s->owners);
  free(s);
}

/* Unmaps and frees everything but the TCP mesh, which it returns. */
static tc_mesh_t *shm_dismantle(struct tc_shm *s) {
  tc_mesh_t *t = s->mesh;
  s->mesh = NULL;
  tc__shm_close(s);
  return t;
}

static const char *status_text(unsigned char st) {
  switch (st) {
  case 0: return "is not on this machine (or TORCHCOMMS_CPU_TRANSPORT=tcp there)";
  case 2: return "could not create its shared-memory segment";
  case 3: return "could not map every segment";
  default: return "failed";
  }
}

int tc__transport_open(const tc_tp_args_t *a, tc_tp_choice_t choice,
                       const tc_transport_ops_t **ops, void **tp, char *err,
                       size_t errlen) {
  *tp = NULL;
  *ops = &tc__tcp_transport;
  tc_mesh_t *t = NULL;
  int rc = tc__mesh_create(a, &t, err, errlen);
  if (rc != TC_OK) return rc;
  double deadline = tc__now() + (a->timeout_s > 0 ? a->timeout_s : TC_DEFAULT_TIMEOUT_S);
  int here = tc__mesh_local(t) == a->size;
  if (choice == TC_TP_TCP || (!here && choice == TC_TP_AUTO)) {
    if (choice == TC_TP_AUTO)
      TC_BACKEND_LOGS(a->host, TC_LOG_DEBUG, TC_LOG_TCP,
                      "cpu backend '%s' rank %d: %d of %d ranks on this machine: TCP "
                      "between the machines (the backend's hierarchy uses shm inside each)",
                      a->comm_name, a->rank, tc__mesh_local(t), a->size);
    rc = tc__mesh_final_barrier(t, deadline, err, errlen);
    if (rc == TC_OK) *tp = t;
    return rc;
  }

  /* the mesh is the liveness channel of shared memory (a dead peer's
   * socket closes): every pair is connected */
  rc = tc__mesh_connect_all(t, deadline, err, errlen);
  if (rc != TC_OK) {
    tc__mesh_close(t);
    return rc;
  }
  struct tc_shm *s = calloc(1, sizeof *s);
  size_t n = (size_t)a->size;
  if (s) {
    s->base = calloc(n, sizeof *s->base);
    s->out_head = calloc(n, sizeof *s->out_head);
    s->out_tail = calloc(n, sizeof *s->out_tail);
    s->in_tail = calloc(n, sizeof *s->in_tail);
    s->out_msgs = calloc(3 * n, sizeof *s->out_msgs);
    s->rtr_wait = calloc(n, sizeof *s->rtr_wait);
    if (s->out_msgs) {
      s->in_msgs = s->out_msgs + n;
      s->rtr_posted = s->out_msgs + 2 * n;
    }
    s->send_head = malloc(n * sizeof(int));
    s->send_tail = malloc(n * sizeof(int));
    s->recv_head = malloc(n * sizeof(int));
    s->recv_tail = malloc(n * sizeof(int));
    s->bye = malloc(2 * n * sizeof *s->bye);
    s->pids = calloc(n, sizeof *s->pids);
    s->owners = calloc(n, sizeof *s->owners);
  }
  unsigned char *all = malloc(n);
  if (!s || !s->base || !s->out_head || !s->out_tail || !s->in_tail || !s->out_msgs ||
      !s->rtr_wait ||
      !s->send_head ||
      !s->send_tail || !s->recv_head || !s->recv_tail || !s->bye || !s->pids || !s->owners ||
      !all) {
    if (s) {
      s->mesh = t;
      tc__shm_close(s);
    } else {
      tc__mesh_close(t);
    }
    free(all);
    snprintf(err, errlen, "out of memory");
    return TC_ERR_NOMEM;
  }
  s->mesh = t;
  s->host = a->host;
  snprintf(s->name, sizeof s->name, "%s", a->comm_name ? a->comm_name : "");
  s->rank = a->rank;
  s->size = a->size;
  s->epoch = a->epoch;
  /* the stamps' key: the communicator's random token and the epoch, so
   * that no payload, and no unit of another configuration, reads as a
   * fresh header (FNV-1a) */
  s->stamp_key = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < 16; i++)
    s->stamp_key = (s->stamp_key ^ tc__mesh_token(t)[i]) * 0x100000001b3ull;
  s->stamp_key = (s->stamp_key ^ s->epoch) * 0x100000001b3ull;
  s->aborted = a->aborted;
  s->spin_s = tc__mesh_spin_s(t);
  s->light_post = tc__setting_bool(TC_SET_SHM_MEMBARRIER) && tc__shm_light_setup();
  double yield_s = tc__mesh_yield_policy(s->spin_s); /* more ranks than cores */
  if (yield_s > 0) {
    s->spin_s = yield_s;
    s->yield_poll = 1;
  }
  shm_geometry(s, (size_t)tc__setting_double(TC_SET_SHM_BYTES)); /* > 0 */

  /* 1. every rank creates its segment (if it is on this machine), named
   * after its creator, first removing what dead creators left behind
   * (shm_sweep.c); the names go round with the statuses */
  char why[512] = "";
  struct { unsigned char st, pad[7]; tc_shm_owner_t owner; } rec, *recs = NULL;
  memset(&rec, 0, sizeof rec);
  tc__shm_owner_self(&rec.owner);
  s->owners[s->rank] = rec.owner;
  if (here && tc__setting_bool(TC_SET_SHM_SWEEP)) {
    int swept = tc__shm_sweep();
    if (swept > 0)
      TC_BACKEND_LOGS(a->host, TC_LOG_INFO, TC_LOG_SHM,
                      "cpu backend '%s' rank %d: removed %d shared-memory segment%s left "
                      "in /dev/shm by processes that died", a->comm_name, a->rank, swept,
                      swept == 1 ? "" : "s");
  }
  if (here) rec.st = shm_create_own(s, why, sizeof why) == 0 ? 1 : 2;
#ifdef PR_SET_PTRACER
  if (rec.st == 1 && tc__setting_bool(TC_SET_CPU_CMA))
    (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0); /* EINVAL without Yama */
#endif
  recs = malloc(n * sizeof *recs);
  rc = recs ? tc__mesh_all_gather(t, &rec, sizeof rec, recs, 0, deadline, err, errlen)
            : setup_fail(s, err, errlen, TC_ERR_NOMEM, "out of memory");
  for (int p = 0; p < a->size && rc == TC_OK; p++) {
    all[p] = recs[p].st;
    s->owners[p] = recs[p].owner;
  }
  free(recs);
  unsigned char st;
  int bad = -1;
  for (int p = 0; p < a->size && rc == TC_OK; p++)
    if (all[p] != 1 && bad < 0) bad = p;
  /* 2. everyone maps everyone; 3. all mapped: unlink the own name */
  if (rc == TC_OK && bad < 0) {
    st = 1;
    for (int p = 0; p < a->size && st == 1; p++)
      if (p != s->rank && shm_map_peer(s, p, why, sizeof why) != 0) st = 3;
    rc = shm_all_status(s, st, all, 0, deadline, err, errlen);
    for (int p = 0; p < a->size && rc == TC_OK; p++)
      if (all[p] != 1 && bad < 0) bad = p;
  }
  shm_unlink_own(s);
  if (rc == TC_OK && bad < 0) { /* 4. single copy only if every rank can (final) */
    rc = shm_all_status(s, (unsigned char)(shm_probe_cma(s) ? 1 : 4), all, 1, deadline,
                        err, errlen);
    s->cma = rc == TC_OK;
    for (int p = 0; p < a->size && rc == TC_OK; p++)
      if (all[p] != 1) s->cma = 0;
  }
  if (rc != TC_OK) { /* the mesh failed: a peer died or the deadline passed */
    free(all);
    tc__shm_close(s);
    return rc;
  }
  if (bad >= 0) {
    char what[768];
    if (bad == s->rank)
      snprintf(what, sizeof what, "%s", why);
    else
      snprintf(what, sizeof what, "rank %d %s", bad, status_text(all[bad]));
    unsigned char bst = all[bad];
    free(all);
    tc_mesh_t *mesh = shm_dismantle(s);
    if (choice == TC_TP_SHM) {
      struct tc_shm tmp = {.rank = a->rank, .size = a->size};
      snprintf(tmp.name, sizeof tmp.name, "%s", a->comm_name ? a->comm_name : "");
      tc__mesh_close(mesh);
      return setup_fail(&tmp, err, errlen, bst == 0 ? TC_ERR_INVALID_ARGUMENT : TC_ERR_SYSTEM,
                        "TORCHCOMMS_CPU_TRANSPORT=shm but %s%s", what,
                        bst == 0 ? " (shared memory needs every rank on one machine)" : "");
    }
    TC_BACKEND_LOGS(a->host, TC_LOG_WARN, TC_LOG_SHM,
                    "cpu backend '%s' rank %d: shared memory unavailable (%s); using TCP",
                    a->comm_name, a->rank, what);
    rc = tc__mesh_final_barrier(mesh, deadline, err, errlen);
    if (rc == TC_OK) *tp = mesh;
    return rc;
  }
  free(all);
  TC_BACKEND_LOGS(a->host, TC_LOG_DEBUG, TC_LOG_SHM,
                  "cpu backend '%s' rank %d: shared memory, %zu-byte segments "
                  "(rings %zu, slots %zu, halves %zu), %s %g us, single copy %s",
                  a->comm_name, a->rank, s->total, s->ring_bytes, s->slot_bytes,
                  s->half_bytes, s->yield_poll ? "yield-poll" : "spin", s->spin_s * 1e6,
                  s->cma ? "on" : "off");
  *ops = &tc__shm_transport;
  *tp = s;
  return TC_OK;
}

/* tc_transport_ops_t.leave: the peers learn over the mesh (mesh.h). */
static void shm_leave(void *tp) {
  struct tc_shm *s = tp;
  if (s) tc__mesh_leave(s->mesh);
}

static int shm_create_forced(const tc_tp_args_t *a, void **tp, char *err, size_t errlen) {
  const tc_transport_ops_t *ops;
  return tc__transport_open(a, TC_TP_SHM, &ops, tp, err, errlen);
}

tc_shm_t *tc__shm_of(const tc_transport_ops_t *ops, void *tp) {
  return ops == &tc__shm_transport ? tp : NULL;
}

/* tc_transport_ops_t.describe */
static void shm_describe(void *tp, char *buf, size_t len) {
  const struct tc_shm *s = tp;
  snprintf(buf, len, "shm: %zu-byte segments (rings %zu, slots %zu, halves %zu B); "
           "%s %g us, then sleep on a futex; posts %s; single copy (process_vm_readv) %s; "
           "liveness over TCP", s->total, s->ring_bytes, s->slot_bytes, s->half_bytes,
           s->yield_poll ? "yield-poll" : "spin", s->spin_s * 1e6,
           s->light_post ? "with a fence, a small broadcast's without (membarrier)" : "with a fence",
           s->cma ? "on" : "off");
}

const tc_transport_ops_t tc__shm_transport = {
    .name = "shm",
    .create = shm_create_forced,
    .exchange = tc__shm_exchange,
    .goodbye = tc__shm_goodbye,
    .close = tc__shm_close,
    .interrupt = tc__shm_interrupt,
    .leave = shm_leave,
    .describe = shm_describe,
};

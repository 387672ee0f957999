/* mesh.c -- the TCP mesh as the other transports use it (mesh.h): the
 * accessors the shared-memory transport needs, the mesh's all-gather and
 * the final barrier of creation (used whichever transport carries the
 * data), and the machine-locality helpers both transports share. The one
 * file besides tcp*.c that sees the mesh's inside (tcp_internal.h). */
#include "transport/mesh.h"
#include "transport/tcp_internal.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int tc__mesh_create(const tc_tp_args_t *a, tc_mesh_t **out, char *err, size_t errlen) {
  void *t = NULL;
  int rc = tc__tcp_create(a, &t, err, errlen);
  *out = t;
  return rc;
}

void tc__mesh_close(tc_mesh_t *m) {
  if (m) tc__tcp_close(m);
}

int tc__mesh_check_alive(tc_mesh_t *m, const tc_tp_op_t *op) {
  return tc__tcp_check_alive(m, op);
}

void tc__mesh_leave(tc_mesh_t *m) { tc__tcp_leave(m); }

int tc__mesh_gone(const tc_mesh_t *m, int p) { return m->gone[p] != 0; }

void tc__mesh_mark_gone(tc_mesh_t *m, int p) { m->gone[p] = 1; }

int tc__mesh_left(const tc_mesh_t *m, int p) { return tc__tcp_left(m, p); }

const unsigned char *tc__mesh_token(const tc_mesh_t *m) { return m->token; }

int tc__mesh_local(const tc_mesh_t *m) { return m->local; }

double tc__mesh_spin_s(const tc_mesh_t *m) { return m->spin_s; }

int tc__mesh_all_gather_as(tc_mesh_t *t, const char *what, const void *mine, size_t len,
                           void *all, int final, double deadline, char *err,
                           size_t errlen) {
  /* Bruck's all-gather: in step k (d = 2^k) each rank sends the blocks it
   * holds, its own and the next d - 1 ranks', to rank - d and receives those
   * of rank + d .. rank + 2d - 1 from rank + d; ceil(log2 n) steps, and a
   * rank talks to at most 2 log2(n) peers, so a lazy mesh connects only
   * those. Blocks are kept in rotated order (held[i] is rank + i's) and put
   * in place at the end. Each step completes only once the partner sent
   * what it held, so the last step completes on a rank only when every rank
   * has started the all-gather (a barrier). */
  int n = t->size, r = t->rank;
  char *held = malloc((size_t)n * len);
  if (!held) {
    if (err && errlen) snprintf(err, errlen, "out of memory");
    return TC_ERR_NOMEM;
  }
  memcpy(held, mine, len);
  char msg[768] = "";
  tc_tp_op_t op = {.opname = final ? "init (final barrier)" : "init (setup)",
                   .deadline = deadline, .msg = msg, .msglen = sizeof msg,
                   .hangup_ok = final};
  int rc = TC_OK;
  for (int d = 1; d < n && rc == TC_OK; d *= 2) {
    int cnt = d < n - d ? d : n - d;
    tc_xfer_t x[2] = {tc__xfer_send((r - d + n) % n, held, (size_t)cnt * len),
                      tc__xfer_recv((r + d) % n, held + (size_t)d * len, (size_t)cnt * len)};
    op.timeout_s = t->timeout_s;
    rc = tc__tcp_transport.exchange(t, x, 2, &op);
  }
  if (rc == TC_OK)
    for (int i = 0; i < n; i++)
      memcpy((char *)all + (size_t)((r + i) % n) * len, held + (size_t)i * len, len);
  free(held);
  if (rc != TC_OK && err && errlen) snprintf(err, errlen, "%s: %s", what, msg);
  return rc;
}

int tc__mesh_all_gather(tc_mesh_t *t, const void *mine, size_t len, void *all, int final,
                        double deadline, char *err, size_t errlen) {
  return tc__mesh_all_gather_as(t, final ? "the final barrier of creation"
                                         : "the shared-memory setup",
                                mine, len, all, final, deadline, err, errlen);
}

int tc__mesh_connect_all(tc_mesh_t *t, double deadline, char *err, size_t errlen) {
  int rc = tc__tcp_connect_all(t, deadline, err, errlen);
  if (rc == TC_OK) tc__tcp_cx_free(t); /* nobody connects to this rank any more */
  return rc;
}

int tc__mesh_final_barrier(tc_mesh_t *t, double deadline, char *err, size_t errlen) {
  unsigned char one = 1, *all = malloc((size_t)t->size);
  int rc = all ? tc__mesh_all_gather(t, &one, 1, all, 1, deadline, err, errlen) : TC_ERR_NOMEM;
  if (!all)
    snprintf(err, errlen, "out of memory");
  free(all);
  if (rc != TC_OK) tc__tcp_close(t);
  else tc__tcp_cx_created(t);
  return rc;
}

void tc__mesh_host_key(char *key, size_t len) {
  char host[256] = "", boot[64] = "";
  gethostname(host, sizeof host - 1);
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    if (!fgets(boot, sizeof boot, f)) boot[0] = 0;
    fclose(f);
  }
  boot[strcspn(boot, "\n")] = 0;
  snprintf(key, len, "cpu/host/%s/%s", host, boot);
}

void tc__mesh_own_cpus(uint64_t cpus[TC_MESH_CPU_WORDS]) {
  cpu_set_t set;
  memset(cpus, 0, TC_MESH_CPU_WORDS * sizeof *cpus);
  int ok = sched_getaffinity(0, sizeof set, &set) == 0;
  long online = ok ? 0 : sysconf(_SC_NPROCESSORS_ONLN);
  for (int k = 0; k < TC_MESH_CPU_WORDS * 64 && k < CPU_SETSIZE; k++)
    if (ok ? CPU_ISSET(k, &set) : k < online) cpus[k / 64] |= 1ull << (k % 64);
}

int tc__mesh_cpu_count(const uint64_t cpus[TC_MESH_CPU_WORDS]) {
  int n = 0;
  for (int w = 0; w < TC_MESH_CPU_WORDS; w++) n += __builtin_popcountll(cpus[w]);
  return n;
}

double tc__mesh_spin_policy(const tc_tp_args_t *a, int local, int ncpu) {
  if (tc__setting_is_set(TC_SET_CPU_SPIN_US)) {
    double us = tc__setting_double(TC_SET_CPU_SPIN_US);
    return us > 0 ? us * 1e-6 : 0;
  }
  /* 200 us: on a VM a peer's wake-up or a short preemption often takes
   * 50-100 us; with a 50 us budget the ranks fell, one run in three, into
   * a sleep / wake ping-pong of 3-75 us per 8 B operation (issue 16,
   * docs/benchmarks.md); a wait that lasts longer costs 200 us of CPU once */
  double spin = local > 0 && local <= ncpu ? 200e-6 : 0;
  TC_BACKEND_LOGS(a->host, TC_LOG_DEBUG, TC_LOG_INIT,
                  "cpu backend '%s' rank %d: %d ranks on this machine, %d cores: "
                  "busy-poll %g us", a->comm_name, a->rank, local, ncpu, spin * 1e6);
  return spin;
}

/* A waiter that sleeps at once costs a wake-up and a context switch per
 * wait; polling with sched_yield hands the core straight to the ranks it
 * waits for (shared memory: shm_setup.c; TCP: 4 ranks on 2 cores, 8
 * bytes, us per operation, sleeping at once -> yielding for 200 us:
 * all_reduce 66.6 -> 34.6, send_recv 31.6 -> 10.3, docs/benchmarks.md,
 * "TCP with more ranks than cores"); a wait that lasts longer costs the
 * budget's CPU once. */
double tc__mesh_yield_policy(double spin_s) {
  if (spin_s > 0 || tc__setting_is_set(TC_SET_CPU_SPIN_US)) return 0;
  double us = tc__setting_double(TC_SET_CPU_YIELD_US);
  return us > 0 ? us * 1e-6 : 0;
}

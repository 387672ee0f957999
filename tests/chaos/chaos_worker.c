/* chaos_worker.c -- one rank of a chaos trial (tests/chaos/chaos_driver.c
 * starts them): creates a `cpu` communicator, then runs a seeded random mix
 * of every operation (chaos_ops.c) at random sizes, synchronous or
 * asynchronous (up to 4 in flight), checking every result exactly, until an
 * operation fails (a peer was killed or stopped) or --ops operations are
 * done.
 *
 *   chaos_worker --rank R --size N --port P --name NAME --seed S
 *                [--timeout T] [--ops K] [--max-count C] [--max-seconds M]
 *                [--create-timeout T2] [--selftest 1]
 * --selftest 1 also corrupts every result after its check passed and
 * expects the check to fail then (chaos_op_selftest): the checks can fail.
 *
 * It reports to the driver on stdout, one line per event, each written with
 * one write(2) (atomic on a pipe), times on CLOCK_MONOTONIC (the driver's
 * clock too):
 *   CHAOS ready <t>                    the communicator is created
 *   CHAOS error <t> <step> <op> <STATUS> <message>   an operation failed
 *   CHAOS wrong <t> <step> <op> <what>               a result was wrong
 *   CHAOS done <ops>                   --ops operations completed, finalized
 *   CHAOS noerror <ops>                --max-seconds passed without an error
 * Exit status: 0 done, 3 error, 4 wrong result, 5 no error, 2 usage/setup. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "chaos_ops.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One line to stdout with a single write; newlines in the text become
 * spaces so that one event stays one line. */
static void report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void report(const char *fmt, ...) {
  char line[3000];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line - 1, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n > sizeof line - 2) n = (int)sizeof line - 2;
  for (int i = 0; i < n; i++)
    if (line[i] == '\n') line[i] = ' ';
  line[n++] = '\n';
  for (ssize_t off = 0; off < n;) {
    ssize_t w = write(1, line + off, (size_t)(n - off));
    if (w <= 0) return;
    off += w;
  }
}

/* Checks a completed operation (and with selftest that the check can
 * fail); reports a wrong result. Returns 0 when right. */
static int verify(chaos_op_t *op, int selftest) {
  char why[512];
  const char *what = "wrong";
  int bad = chaos_op_check(op, why, sizeof why) != 0;
  if (!bad && selftest) {
    bad = chaos_op_selftest(op, why, sizeof why) != 0;
    what = "wrong (selftest)";
  }
  if (bad)
    report("CHAOS %s %.6f %llu %s %s %s count %zu: %s", what, now(),
           (unsigned long long)op->step, chaos_op_name(op->kind), tc_dtype_name(op->dt),
           tc_redop_name(op->red.type), op->count, why);
  return bad;
}

static void usage(void) {
  fprintf(stderr, "usage: chaos_worker --rank R --size N --port P --name NAME "
                  "--seed S [--timeout T] [--ops K] [--max-count C] "
                  "[--max-seconds M] [--create-timeout T2] [--selftest 1]\n");
  exit(2);
}

int main(int argc, char **argv) {
  int rank = -1, size = -1, port = -1;
  const char *name = NULL;
  unsigned long long seed = 1, ops = 0;
  double timeout = 5, max_seconds = 120, create_timeout = 30;
  size_t max_count = 1 << 15;
  int selftest = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const char *k = argv[i], *v = argv[i + 1];
    if (!strcmp(k, "--rank")) rank = atoi(v);
    else if (!strcmp(k, "--size")) size = atoi(v);
    else if (!strcmp(k, "--port")) port = atoi(v);
    else if (!strcmp(k, "--name")) name = v;
    else if (!strcmp(k, "--seed")) seed = strtoull(v, NULL, 0);
    else if (!strcmp(k, "--timeout")) timeout = atof(v);
    else if (!strcmp(k, "--ops")) ops = strtoull(v, NULL, 0);
    else if (!strcmp(k, "--max-count")) max_count = strtoull(v, NULL, 0);
    else if (!strcmp(k, "--max-seconds")) max_seconds = atof(v);
    else if (!strcmp(k, "--create-timeout")) create_timeout = atof(v);
    else if (!strcmp(k, "--selftest")) selftest = atoi(v);
    else usage();
  }
  if (rank < 0 || size < 1 || size > CHAOS_MAX_RANKS || rank >= size || port <= 0 ||
      !name || max_count < 1)
    usage();

  tc_store_t *store;
  if (tc_store_tcp_connect("127.0.0.1", port, 30, &store) != TC_OK) {
    report("CHAOS error %.6f 0 create %s %s", now(), "store", tc_last_error());
    return 2;
  }
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.name = name;
  o.rank = rank;
  o.world_size = size;
  o.store = store;
  /* creation under load (8 ranks on 2 cores) gets more time than the ops */
  o.timeout_s = create_timeout;
  tc_comm_t *comm;
  int rc = tc_comm_create("cpu", "cpu", &o, &comm);
  if (rc != TC_OK) {
    report("CHAOS error %.6f 0 create %s %s", now(), tc_status_name(rc), tc_last_error());
    tc_store_release(store);
    return 3;
  }
  tc_store_release(store);
  tc_comm_set_timeout(comm, timeout);
  report("CHAOS ready %.6f", now());

  /* async grouping: per-rank randomness (ranks may differ; issue order,
   * which is what must match, does not) */
  uint64_t local = seed * 1000003u + (uint64_t)rank * 7919u + 1;
  enum { MAXQ = 4 };
  static chaos_op_t q[MAXQ];
  int nq = 0;
  double t_end = now() + max_seconds;
  const char *msg;
  for (uint64_t step = 0; ops == 0 || step < ops; step++) {
    local = local * 6364136223846793005ull + 1442695040888963407ull;
    int async = (local >> 33) % 3 == 0;
    chaos_op_t *op = &q[nq];
    chaos_op_draw(op, seed, step, rank, size, max_count);
    if (chaos_op_prepare(op)) {
      report("CHAOS wrong %.6f %llu %s out of memory", now(), (unsigned long long)step,
             chaos_op_name(op->kind));
      return 4;
    }
    rc = chaos_op_issue(op, comm, async, &msg);
    int failed_at = -1;
    if (rc != TC_OK) failed_at = nq;
    if (rc == TC_OK && async) nq++;
    /* retire everything queued when full, at a sync op, or now and then */
    int drain = rc != TC_OK || !async || nq == MAXQ || ((local >> 40) & 3) == 0;
    if (rc == TC_OK && !async) {
      if (verify(op, selftest)) return 4;
      chaos_op_free(op);
    }
    for (int i = 0; drain && i < nq && rc == TC_OK; i++) {
      rc = chaos_op_wait(&q[i], &msg);
      if (rc != TC_OK) {
        failed_at = i;
        break;
      }
      if (verify(&q[i], selftest)) return 4;
      chaos_op_free(&q[i]);
    }
    if (rc != TC_OK) {
      chaos_op_t *f = &q[failed_at];
      report("CHAOS error %.6f %llu %s %s %s", now(), (unsigned long long)f->step,
             chaos_op_name(f->kind), tc_status_name(rc), msg && *msg ? msg : "(no text)");
      /* no buffer is freed: operations may still be in flight until the
       * communicator is destroyed (which aborts it); the process exits */
      double t0 = now();
      tc_comm_destroy(comm);
      report("CHAOS destroyed %.6f %.3f", now(), now() - t0);
      return 3;
    }
    if (drain) nq = 0;
    if ((step & 63) == 0 && now() > t_end) {
      report("CHAOS noerror %llu", (unsigned long long)step);
      return 5;
    }
  }
  for (int i = 0; i < nq; i++) { /* --ops reached with work in flight */
    rc = chaos_op_wait(&q[i], &msg);
    if (rc != TC_OK) {
      report("CHAOS error %.6f %llu %s %s %s", now(), (unsigned long long)q[i].step,
             chaos_op_name(q[i].kind), tc_status_name(rc), msg);
      return 3;
    }
    if (verify(&q[i], selftest)) return 4;
    chaos_op_free(&q[i]);
  }
  rc = tc_comm_finalize(comm);
  if (rc != TC_OK) {
    report("CHAOS error %.6f %llu finalize %s %s", now(), ops, tc_status_name(rc),
           tc_last_error());
    return 3;
  }
  tc_comm_destroy(comm);
  report("CHAOS done %llu", ops);
  return 0;
}

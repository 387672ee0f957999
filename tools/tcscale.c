/* tcscale.c -- the bootstrap cost of a communicator, per rank: store
 * requests and wall time of tc_comm_create and tc_comm_split, and the
 * sockets a rank holds after its first operation (issue 17, point 2).
 *
 * usage: tcrun -n N tcscale [--csv FILE] [--label TEXT] [--backend NAME]
 *                          [--trace PREFIX]
 *
 * --trace PREFIX: rank r writes every store request of its creation, first
 * all_reduce and split (phase, kind, key count, first key) to PREFIX.r, one
 * per line, through a store that forwards to the client (and is not
 * counted itself), for finding which keys grow with N.
 *
 * Every rank:
 *  1. connects its own client to the job's store (MASTER_ADDR:MASTER_PORT,
 *     hosted by tcrun) and passes it to tc_comm_create, so that the store
 *     connection exists before anything is measured and is known: it is
 *     the socket (or sockets: the client opens a spare connection when two
 *     threads use it at once) whose peer is MASTER_PORT;
 *  2. waits at a barrier made of store requests (one add, then one wait),
 *     so that every rank starts creating at about the same moment;
 *  3. resets the store request counter (tc__store_counts, private_api.h),
 *     creates a communicator "scale" on backend cpu (the transport is what
 *     TORCHCOMMS_CPU_TRANSPORT says: unset = shared memory on one host) and
 *     records the requests by kind and the wall time of the call;
 *  4. resets, runs one 8-byte all_reduce (an int64 sum, checked), records
 *     its requests, then counts this process's sockets (the /proc/self/fd
 *     entries that are sockets, classified with getsockopt SO_DOMAIN and
 *     SO_ACCEPTCONN and getpeername): `sockets` is every socket minus the
 *     store client's connections (TCP sockets whose peer port is
 *     MASTER_PORT; `store_conns`) minus any
 *     socket that was already open before the creation and is not one of
 *     them (inherited; normally none);
 *  5. resets, splits into two halves (color = rank % 2, tc_comm_split with
 *     the list of the ranks of its colour), records requests and time, runs
 *     one 8-byte all_reduce on the half (requests recorded) and counts the
 *     sockets again (both communicators open);
 *  6. all-gathers every rank's figures through the communicator itself;
 *     rank 0 prints min / median / max over ranks (the median of an even
 *     count is the lower middle value) as one line, and appends a CSV row
 *     to FILE (writing the header first when FILE is empty or new).
 *
 * Timeouts: the communicator's come from TORCHCOMM_TIMEOUT_SECONDS (the
 * usual default 600 s); the store barrier waits as long. Exit status 0, 1
 * on a failure (the error is printed naming the step and rank), 2 on bad
 * usage. Uses the public API and private_api.h (the counter), so it is
 * linked statically with libtorchcomms like tcrun.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "private_api.h"
#include "torchcomms.h"

/* ---- the figures of one rank ---- */

enum {
  /* creation */
  F_CREATE_REQ, F_CREATE_KEYS, F_CREATE_SET, F_CREATE_GET, F_CREATE_ADD,
  F_CREATE_CHECK, F_CREATE_WAIT, F_CREATE_DELETE, F_CREATE_CONNECT,
  F_CREATE_S,
  /* first all_reduce and the sockets after it */
  F_AR_REQ, F_AR_S, F_SOCK, F_SOCK_TCP, F_SOCK_LISTEN, F_SOCK_UNIX,
  F_SOCK_OTHER, F_STORE_CONNS,
  /* split, its first all_reduce and the sockets after it */
  F_SPLIT_REQ, F_SPLIT_KEYS, F_SPLIT_SET, F_SPLIT_GET, F_SPLIT_ADD,
  F_SPLIT_CHECK, F_SPLIT_WAIT, F_SPLIT_DELETE, F_SPLIT_S, F_SPLIT_AR_REQ,
  F_SPLIT_SOCK,
  F_COUNT
};

static const char *const f_names[F_COUNT] = {
    "create_req", "create_keys", "create_set", "create_get", "create_add",
    "create_check", "create_wait", "create_delete", "create_connect",
    "create_s",
    "ar_req", "ar_s", "sockets", "sock_tcp", "sock_listen", "sock_unix",
    "sock_other", "store_conns",
    "split_req", "split_keys", "split_set", "split_get", "split_add",
    "split_check", "split_wait", "split_delete", "split_s", "split_ar_req",
    "split_sockets"};

/* ---- sockets ---- */

typedef struct sockets {
  int total;   /* every socket descriptor */
  int store;   /* TCP, remote port == the store's port */
  int listen;  /* TCP in state LISTEN */
  int tcp;     /* other TCP (connected peers) */
  int unix_;   /* AF_UNIX */
  int other;   /* any other family, or not found in the tables */
} sockets_t;

/* Classifies socket descriptor fd: 'S' a TCP connection whose peer port is
 * store_port, 'L' listening, 'T' other TCP/IP, 'U' AF_UNIX, 'O' else. */
static char sock_kind(int fd, int store_port) {
  int domain = 0, listening = 0;
  socklen_t len = sizeof domain;
  if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0) return 'O';
  if (domain == AF_UNIX) return 'U';
  if (domain != AF_INET && domain != AF_INET6) return 'O';
  len = sizeof listening;
  if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 &&
      listening)
    return 'L';
  struct sockaddr_storage peer;
  len = sizeof peer;
  if (getpeername(fd, (struct sockaddr *)&peer, &len) == 0) {
    int port = peer.ss_family == AF_INET
                   ? ntohs(((struct sockaddr_in *)&peer)->sin_port)
                   : ntohs(((struct sockaddr_in6 *)&peer)->sin6_port);
    if (port == store_port) return 'S';
  }
  return 'T';
}

/* Counts and classifies this process's socket descriptors (the entries of
 * /proc/self/fd that are sockets). */
static int count_sockets(int store_port, sockets_t *s) {
  memset(s, 0, sizeof *s);
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  int self = dirfd(d);
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    int fd = atoi(e->d_name);
    struct stat st;
    if (fd == self || fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    s->total++;
    switch (sock_kind(fd, store_port)) {
      case 'S': s->store++; break;
      case 'L': s->listen++; break;
      case 'T': s->tcp++; break;
      case 'U': s->unix_++; break;
      default: s->other++; break;
    }
  }
  closedir(d);
  return 0;
}

/* ---- helpers ---- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int g_rank = -1;
static int g_verbose; /* TCSCALE_VERBOSE=1: rank 0 prints each step */
static double g_start;

/* With TCSCALE_VERBOSE=1, rank 0 prints "tcscale: +T s: what" to stderr. */
static void step(const char *what) {
  if (g_verbose && g_rank == 0)
    fprintf(stderr, "tcscale: +%.3f s: %s\n", now_s() - g_start, what);
}

/* Prints the failed step with the library's error and exits 1. */
static void die(const char *step, int rc) {
  fprintf(stderr, "tcscale: rank %d: %s failed: %s: %s\n", g_rank, step,
          tc_status_name(rc), tc_last_error());
  exit(1);
}

#define CHECK(step, call)                                                      \
  do {                                                                         \
    int rc_ = (call);                                                          \
    if (rc_ != TC_OK) die(step, rc_);                                          \
  } while (0)

/* Copies the counter into figures [first .. first+7): requests, keys, then
 * set get add check wait delete. */
static void take_counts(double *fig, int first) {
  tc__store_counts_t c;
  tc__store_counts(&c);
  fig[first] = (double)c.requests;
  fig[first + 1] = (double)c.keys;
  for (int k = 0; k <= TC__SREQ_DELETE; k++)
    fig[first + 2 + k] = (double)c.n[k];
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* One 8-byte all_reduce (int64 sum of rank+1), checked. */
static void one_all_reduce(tc_comm_t *comm, const char *what) {
  int64_t v = tc_comm_rank(comm) + 1, n = tc_comm_size(comm);
  CHECK(what, tc_all_reduce(comm, &v, 1, TC_INT64, TC_OP(TC_SUM), NULL, NULL));
  if (v != n * (n + 1) / 2) {
    fprintf(stderr, "tcscale: rank %d: %s gave %" PRId64 ", expected %" PRId64
            "\n", g_rank, what, v, n * (n + 1) / 2);
    exit(1);
  }
}

/* ---- --trace: a forwarding store that logs each request ---- */

typedef struct trace_store {
  tc_store_t *base;
  FILE *f;
} trace_store_t;

static const char *g_phase = "before";

static void trace_line(trace_store_t *t, const char *kind, size_t nkeys,
                       const char *key) {
  fprintf(t->f, "%s %s %zu %s\n", g_phase, kind, nkeys, key);
}
static int tr_set(void *ctx, const char *key, const void *v, size_t n) {
  trace_line(ctx, "set", 1, key);
  return tc_store_set(((trace_store_t *)ctx)->base, key, v, n);
}
static int tr_get(void *ctx, const char *key, void **v, size_t *n,
                  double timeout_s) {
  trace_line(ctx, "get", 1, key);
  return tc_store_get(((trace_store_t *)ctx)->base, key, v, n, timeout_s);
}
static int tr_add(void *ctx, const char *key, int64_t d, int64_t *r) {
  trace_line(ctx, "add", 1, key);
  return tc_store_add(((trace_store_t *)ctx)->base, key, d, r);
}
static int tr_check(void *ctx, const char *const *keys, size_t nkeys,
                    int *ready) {
  trace_line(ctx, "check", nkeys, keys[0]);
  return tc_store_check(((trace_store_t *)ctx)->base, keys, nkeys, ready);
}
static int tr_wait(void *ctx, const char *const *keys, size_t nkeys,
                   double timeout_s) {
  trace_line(ctx, "wait", nkeys, keys[0]);
  return tc_store_wait(((trace_store_t *)ctx)->base, keys, nkeys, timeout_s);
}
static int tr_delete(void *ctx, const char *key, int *deleted) {
  trace_line(ctx, "delete", 1, key);
  return tc_store_delete(((trace_store_t *)ctx)->base, key, deleted);
}
static const char *tr_local_addr(void *ctx) {
  return tc_store_local_addr(((trace_store_t *)ctx)->base);
}
static void tr_destroy(void *ctx) {
  trace_store_t *t = ctx;
  tc_store_release(t->base);
  fclose(t->f);
  free(t);
}

/* A store over base (whose reference it takes) logging to PREFIX.rank. */
static tc_store_t *trace_store(tc_store_t *base, const char *prefix,
                               int rank) {
  char path[4096];
  snprintf(path, sizeof path, "%s.%d", prefix, rank);
  trace_store_t *t = calloc(1, sizeof *t);
  if (!t || !(t->f = fopen(path, "w"))) {
    fprintf(stderr, "tcscale: rank %d: cannot write %s: %s\n", rank, path,
            strerror(errno));
    exit(1);
  }
  t->base = base;
  static const tc_store_vtable_t vt = {
      .size = sizeof(tc_store_vtable_t), .version = 1, .set = tr_set,
      .get = tr_get, .add = tr_add, .check = tr_check,
      .delete_key = tr_delete, .destroy = tr_destroy};
  static const tc__store_ext_t ext = {.wait = tr_wait,
                                      .local_addr = tr_local_addr,
                                      .kind = "trace", .forwards = 1};
  tc_store_t *s = NULL;
  if (tc__store_create_ext(&vt, &ext, t, &s) != TC_OK) die("trace store", 1);
  return s;
}

static void usage(int code) {
  fprintf(code ? stderr : stdout,
          "usage: tcrun -n N tcscale [--csv FILE] [--label TEXT] "
          "[--backend NAME] [--trace PREFIX]\n"
          "  per-rank store requests and time of tc_comm_create and\n"
          "  tc_comm_split, and sockets after one all_reduce; rank 0 prints\n"
          "  min/median/max over ranks (see the comment in tools/tcscale.c)\n");
  exit(code);
}

int main(int argc, char **argv) {
  const char *csv = NULL, *backend = "cpu", *trace = NULL;
  const char *label = "default"; /* bench/scaling.py passes the transport */
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--csv") && i + 1 < argc) csv = argv[++i];
    else if (!strcmp(argv[i], "--label") && i + 1 < argc) label = argv[++i];
    else if (!strcmp(argv[i], "--backend") && i + 1 < argc) backend = argv[++i];
    else if (!strcmp(argv[i], "--trace") && i + 1 < argc) trace = argv[++i];
    else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) usage(0);
    else usage(2);
  }
  const char *addr = getenv("MASTER_ADDR"), *port_s = getenv("MASTER_PORT");
  const char *rank_s = getenv("RANK"), *size_s = getenv("WORLD_SIZE");
  if (!addr || !port_s || !rank_s || !size_s) {
    fprintf(stderr, "tcscale: MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE "
            "must be set: run it under tcrun (tcrun -n N tcscale)\n");
    return 2;
  }
  int port = atoi(port_s), rank = atoi(rank_s), size = atoi(size_s);
  g_rank = rank;
  g_start = now_s();
  g_verbose = getenv("TCSCALE_VERBOSE") && atoi(getenv("TCSCALE_VERBOSE"));
  step("started");
  double timeout = 600; /* the store's; the communicator's: TORCHCOMM_TIMEOUT_SECONDS */

  /* 1. the store connection, before anything is measured */
  tc_store_t *store = NULL;
  CHECK("connecting to the store", tc_store_tcp_connect(addr, port, timeout,
                                                        &store));
  /* 2. a barrier: one add, the last rank sets "go", everyone waits */
  int64_t arrived = 0;
  CHECK("barrier add", tc_store_add(store, "tcscale/arrived", 1, &arrived));
  if (arrived == size) CHECK("barrier set", tc_store_set(store, "tcscale/go", "1", 1));
  const char *go = "tcscale/go";
  CHECK("barrier wait", tc_store_wait(store, &go, 1, timeout));

  step("past the barrier");
  if (trace) store = trace_store(store, trace, rank);
  sockets_t before, after, after_split;
  if (count_sockets(port, &before) != 0) {
    fprintf(stderr, "tcscale: rank %d: cannot read /proc/self/fd: %s\n", rank,
            strerror(errno));
    return 1;
  }
  double fig[F_COUNT] = {0};

  /* 3. creation */
  tc_comm_options_t opts = TC_COMM_OPTIONS_INIT;
  opts.name = "scale";
  opts.store = store;
  opts.rank = rank;
  opts.world_size = size;
  tc_comm_t *comm = NULL;
  g_phase = "create";
  tc__store_counts_reset();
  double t0 = now_s();
  CHECK("tc_comm_create", tc_comm_create(backend, "cpu", &opts, &comm));
  fig[F_CREATE_S] = now_s() - t0;
  take_counts(fig, F_CREATE_REQ);
  {
    tc__store_counts_t c;
    tc__store_counts(&c);
    fig[F_CREATE_CONNECT] = (double)c.n[TC__SREQ_CONNECT];
  }

  step("created");
  /* 4. the first all_reduce, then the sockets */
  g_phase = "all_reduce";
  tc__store_counts_reset();
  t0 = now_s();
  one_all_reduce(comm, "first all_reduce");
  fig[F_AR_S] = now_s() - t0;
  {
    tc__store_counts_t c;
    tc__store_counts(&c);
    fig[F_AR_REQ] = (double)c.requests;
  }
  count_sockets(port, &after);
  int inherited = before.total - before.store;
  fig[F_SOCK] = after.total - after.store - inherited;
  fig[F_SOCK_TCP] = after.tcp;
  fig[F_SOCK_LISTEN] = after.listen;
  fig[F_SOCK_UNIX] = after.unix_;
  fig[F_SOCK_OTHER] = after.other;
  fig[F_STORE_CONNS] = after.store;

  step("all_reduce done, sockets counted");
  /* 5. the split into halves, its first all_reduce, the sockets */
  int *ranks = malloc(sizeof *ranks * (size_t)(size / 2 + 1));
  if (!ranks) die("malloc", TC_ERR_NOMEM);
  size_t nr = 0;
  for (int r = rank % 2; r < size; r += 2) ranks[nr++] = r;
  tc_comm_t *half = NULL;
  g_phase = "split";
  tc__store_counts_reset();
  t0 = now_s();
  CHECK("tc_comm_split", tc_comm_split(comm, ranks, nr,
                                       rank % 2 ? "odd" : "even", NULL,
                                       &half));
  fig[F_SPLIT_S] = now_s() - t0;
  take_counts(fig, F_SPLIT_REQ);
  g_phase = "split_all_reduce";
  tc__store_counts_reset();
  one_all_reduce(half, "the half's first all_reduce");
  {
    tc__store_counts_t c;
    tc__store_counts(&c);
    fig[F_SPLIT_AR_REQ] = (double)c.requests;
  }
  count_sockets(port, &after_split);
  fig[F_SPLIT_SOCK] = after_split.total - after_split.store - inherited;
  free(ranks);

  step("split done");
  /* 6. gather and report */
  g_phase = "after";
  double *all = malloc(sizeof *all * F_COUNT * (size_t)size);
  if (!all) die("malloc", TC_ERR_NOMEM);
  CHECK("gathering the figures",
        tc_all_gather_single(comm, all, fig, F_COUNT, TC_FLOAT64, NULL, NULL));
  int status = 0;
  if (rank == 0) {
    double mn[F_COUNT], md[F_COUNT], mx[F_COUNT];
    double *col = malloc(sizeof *col * (size_t)size);
    if (!col) die("malloc", TC_ERR_NOMEM);
    for (int f = 0; f < F_COUNT; f++) {
      for (int r = 0; r < size; r++) col[r] = all[(size_t)r * F_COUNT + f];
      qsort(col, (size_t)size, sizeof *col, cmp_double);
      mn[f] = col[0];
      md[f] = col[(size - 1) / 2];
      mx[f] = col[size - 1];
    }
    free(col);
    printf("n=%d transport=%s create_req=%g/%g/%g (set %g get %g add %g "
           "check %g wait %g delete %g, keys %g) create_s=%.4f/%.4f/%.4f "
           "ar_req=%g sockets=%g/%g/%g (tcp %g listen %g unix %g; store "
           "conns %g not counted) split_req=%g/%g/%g split_s=%.4f/%.4f/%.4f "
           "split_sockets=%g\n",
           size, label, mn[F_CREATE_REQ], md[F_CREATE_REQ], mx[F_CREATE_REQ],
           md[F_CREATE_SET], md[F_CREATE_GET], md[F_CREATE_ADD],
           md[F_CREATE_CHECK], md[F_CREATE_WAIT], md[F_CREATE_DELETE],
           md[F_CREATE_KEYS], mn[F_CREATE_S], md[F_CREATE_S], mx[F_CREATE_S],
           mx[F_AR_REQ], mn[F_SOCK], md[F_SOCK], mx[F_SOCK], md[F_SOCK_TCP],
           md[F_SOCK_LISTEN], md[F_SOCK_UNIX], mx[F_STORE_CONNS],
           mn[F_SPLIT_REQ], md[F_SPLIT_REQ], mx[F_SPLIT_REQ], mn[F_SPLIT_S],
           md[F_SPLIT_S], mx[F_SPLIT_S], md[F_SPLIT_SOCK]);
    fflush(stdout);
    if (csv) {
      struct stat st;
      int fresh = stat(csv, &st) != 0 || st.st_size == 0;
      FILE *f = fopen(csv, "a");
      if (!f) {
        fprintf(stderr, "tcscale: cannot open %s: %s\n", csv, strerror(errno));
        status = 1;
      } else {
        if (fresh) {
          fprintf(f, "n,transport");
          for (int k = 0; k < F_COUNT; k++)
            fprintf(f, ",%s_min,%s_med,%s_max", f_names[k], f_names[k],
                    f_names[k]);
          fprintf(f, "\n");
        }
        fprintf(f, "%d,%s", size, label);
        for (int k = 0; k < F_COUNT; k++)
          fprintf(f, ",%.6g,%.6g,%.6g", mn[k], md[k], mx[k]);
        fprintf(f, "\n");
        fclose(f);
      }
    }
  }
  free(all);
  step("reported");
  CHECK("finalizing the half", tc_comm_finalize(half));
  CHECK("destroying the half", tc_comm_destroy(half));
  CHECK("tc_comm_finalize", tc_comm_finalize(comm));
  CHECK("tc_comm_destroy", tc_comm_destroy(comm));
  step("finalized and destroyed");
  tc_store_release(store);
  return status;
}

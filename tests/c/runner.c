/* runner.c -- test registration, forked execution with deadlines, and the
 * multi-rank spawner. Usage: tc_test [--list] [substring ...] */
#include "runner.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"

typedef struct {
  const char *name;
  tc_test_fn fn;
  const char *file;
} tc_test_entry_t;

static tc_test_entry_t tc_tests[1024];
static int tc_ntests;

void tc_test_register(const char *name, tc_test_fn fn, const char *file) {
  if (tc_ntests < (int)(sizeof tc_tests / sizeof tc_tests[0]))
    tc_tests[tc_ntests++] = (tc_test_entry_t){name, fn, file};
}

void tc_test_fail(const char *file, int line, const char *fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "  FAIL %s:%d [pid %d]: %s\n", file, line, (int)getpid(),
          msg);
  fflush(stderr);
  _exit(1);
}

/* Waits for pid until deadline; kills it (SIGKILL) past the deadline.
 * Returns the wait status, or -1 when it had to be killed. */
static int tc_wait_deadline(pid_t pid, double deadline) {
  int status = 0;
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) return -1;
    if (tc__now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    struct timespec ts = {0, 2 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

static int tc_cmp_tests(const void *a, const void *b) {
  const tc_test_entry_t *x = a, *y = b;
  int c = strcmp(x->file, y->file);
  return c ? c : strcmp(x->name, y->name);
}

int main(int argc, char **argv) {
  int list = 0;
  const char *filters[1024];
  int nfilters = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--list")) list = 1;
    else if (nfilters < (int)(sizeof filters / sizeof filters[0]))
      filters[nfilters++] = argv[i];
    else {
      fprintf(stderr, "tc_test: more than %d filters\n", nfilters);
      return 2;
    }
  }
  qsort(tc_tests, (size_t)tc_ntests, sizeof tc_tests[0], tc_cmp_tests);
  /* the runner's own variable, not a library setting */
  const char *tt = getenv("TC_TEST_TIMEOUT");
  char *tt_end = NULL;
  double timeout = tt && *tt ? strtod(tt, &tt_end) : 120.0;
  if (tt && *tt && (tt_end == tt || !(timeout > 0) || timeout > 1e9)) timeout = 120.0;
  int passed = 0, failed = 0;
  char failures[8192] = "";
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGPIPE, SIG_IGN);
  for (int t = 0; t < tc_ntests; t++) {
    int match = nfilters == 0;
    for (int f = 0; f < nfilters; f++)
      if (strstr(tc_tests[t].name, filters[f])) match = 1;
    if (!match) continue;
    if (list) {
      printf("%s\n", tc_tests[t].name);
      continue;
    }
    double t0 = tc__now();
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
      setpgid(0, 0);
      tc_tests[t].fn();
      fflush(stdout);
      _exit(0);
    }
    int st = tc_wait_deadline(pid, t0 + timeout);
    kill(-pid, SIGKILL); /* leftovers of the test's process group */
    double dt = tc__now() - t0;
    if (st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0) {
      passed++;
      printf("ok %d - %s (%.2fs)\n", passed + failed, tc_tests[t].name, dt);
    } else {
      failed++;
      const char *why = st == -1 ? "timed out" : "failed";
      printf("not ok %d - %s %s (%.2fs)", passed + failed, tc_tests[t].name,
             why, dt);
      if (st != -1 && WIFSIGNALED(st)) printf(" [signal %d]", WTERMSIG(st));
      printf("\n");
      size_t l = strlen(failures);
      snprintf(failures + l, sizeof failures - l, "  %s\n", tc_tests[t].name);
    }
  }
  if (list) return 0;
  if (failed) printf("failed tests:\n%s", failures);
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : (passed ? 0 : 1);
}

/* ---- multi-rank ---- */

/* Runs the store server in its own process, so that the test process has no
 * extra thread when it forks the ranks (a fork while another thread holds an
 * allocator lock can hang the child, e.g. under ASan). The server stops when
 * *ctl_fd is closed. Returns the server's pid and its port in *port. */
static pid_t tc_store_process(int *port, int *ctl_fd) {
  int pfd[2], ctl[2];
  if (pipe(pfd) || pipe(ctl)) tc_test_fail(__FILE__, __LINE__, "pipe failed");
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) tc_test_fail(__FILE__, __LINE__, "fork failed");
  if (pid == 0) {
    close(pfd[0]);
    close(ctl[1]);
    tc_store_server_t *server = NULL;
    int p = -1;
    if (tc_store_server_start("127.0.0.1", 0, &server) == TC_OK)
      p = tc_store_server_port(server);
    else
      fprintf(stderr, "store server: %s\n", tc_last_error());
    if (write(pfd[1], &p, sizeof p) != (ssize_t)sizeof p) _exit(1);
    char c;
    while (read(ctl[0], &c, 1) > 0) {
    }
    if (server) tc_store_server_stop(server);
    _exit(0);
  }
  close(pfd[1]);
  close(ctl[0]);
  int p = -1;
  if (read(pfd[0], &p, sizeof p) != (ssize_t)sizeof p || p <= 0)
    tc_test_fail(__FILE__, __LINE__, "the store server did not start");
  close(pfd[0]);
  *port = p;
  *ctl_fd = ctl[1];
  return pid;
}

void tc_spawn_status(int n, tc_rank_fn fn, void *arg, double timeout_s,
                     int *statuses) {
  int port, ctl;
  pid_t server = tc_store_process(&port, &ctl);
  pid_t pids[64];
  TC_ASSERT(n > 0 && n <= 64);
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    if (pids[r] < 0) tc_test_fail(__FILE__, __LINE__, "fork failed");
    if (pids[r] == 0) {
      close(ctl);
      tc_ctx_t ctx = {.rank = r, .size = n, .store_host = "127.0.0.1",
                      .store_port = port, .arg = arg};
      fn(&ctx);
      fflush(stdout);
      fflush(stderr);
      _exit(0);
    }
  }
  double deadline = tc__now() + timeout_s;
  int timed_out = -1;
  for (int r = 0; r < n; r++) {
    statuses[r] = tc_wait_deadline(pids[r], deadline);
    if (statuses[r] == -1 && timed_out < 0) timed_out = r;
  }
  close(ctl);
  if (tc_wait_deadline(server, tc__now() + 10) == -1)
    tc_test_fail(__FILE__, __LINE__, "the store server did not stop");
  if (timed_out >= 0)
    tc_test_fail(__FILE__, __LINE__,
                 "rank %d of %d did not finish within %.0f s (hang?)",
                 timed_out, n, timeout_s);
}

void tc_spawn(int n, tc_rank_fn fn, void *arg, double timeout_s) {
  int st[64];
  tc_spawn_status(n, fn, arg, timeout_s, st);
  for (int r = 0; r < n; r++) {
    if (!WIFEXITED(st[r]) || WEXITSTATUS(st[r]) != 0)
      tc_test_fail(__FILE__, __LINE__, "rank %d of %d %s %d", r, n,
                   WIFSIGNALED(st[r]) ? "killed by signal" : "exited with",
                   WIFSIGNALED(st[r]) ? WTERMSIG(st[r]) : WEXITSTATUS(st[r]));
  }
}

tc_store_t *tc_ctx_store(tc_ctx_t *ctx) {
  tc_store_t *s = NULL;
  TC_ASSERT_OK(tc_store_tcp_connect(ctx->store_host, ctx->store_port, 30.0, &s));
  return s;
}

int tc_world1_create(const char *name, const char *device, tc_comm_t **out) {
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.rank = 0;
  o.world_size = 1;
  o.name = name;
  tc_store_t *s = NULL;
  TC_ASSERT_OK(tc_store_memory(&s));
  o.store = s;
  *out = NULL;
  int rc = tc_comm_create("cpu", device, &o, out);
  tc_store_release(s); /* the communicator holds its own reference */
  return rc;
}

tc_comm_t *tc_ctx_comm(tc_ctx_t *ctx, const char *name,
                       tc_comm_options_t *opts) {
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  if (opts) o = *opts;
  o.rank = ctx->rank;
  o.world_size = ctx->size;
  o.name = name;
  tc_store_t *s = o.store ? NULL : tc_ctx_store(ctx);
  if (s) o.store = s;
  if (o.timeout_s <= 0) o.timeout_s = 60.0;
  tc_comm_t *c = NULL;
  TC_ASSERT_OK(tc_comm_create("cpu", "cpu", &o, &c));
  if (s) tc_store_release(s); /* the communicator holds its own reference */
  return c;
}

int tc_free_port(void) {
  int lo = 32768; /* the range's first port; Linux's default */
  FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  if (f) {
    if (fscanf(f, "%d", &lo) != 1) lo = 32768;
    fclose(f);
  }
  const int base = 10000;
  unsigned seed = (unsigned)getpid() * 2654435761u ^ (unsigned)(tc__now() * 1e6);
  for (int i = 0; i < 1000; i++) {
    int port = 0;
    if (lo - base >= 1000) {
      seed = seed * 1103515245u + 12345u;
      port = base + (int)((seed >> 8) % (unsigned)(lo - base));
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    TC_ASSERT(fd >= 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t al = sizeof a;
    int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
             getsockname(fd, (struct sockaddr *)&a, &al) == 0;
    close(fd);
    if (ok) return ntohs(a.sin_port); /* port 0 (no room below the range): the kernel's */
  }
  tc_test_fail(__FILE__, __LINE__, "no free TCP port found below %d", lo);
  return -1;
}

/* ---- data ---- */

void tc_set(void *buf, size_t i, tc_dtype_t dt, double v) {
  switch (dt) {
  case TC_FLOAT32: ((float *)buf)[i] = (float)v; break;
  case TC_FLOAT64: ((double *)buf)[i] = v; break;
  case TC_FLOAT16: ((uint16_t *)buf)[i] = tc__float_to_half((float)v); break;
  case TC_BFLOAT16: ((uint16_t *)buf)[i] = tc__float_to_bf16((float)v); break;
  case TC_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
  case TC_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
  case TC_INT16: ((int16_t *)buf)[i] = (int16_t)v; break;
  case TC_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
  case TC_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
  case TC_BOOL: ((uint8_t *)buf)[i] = v != 0; break;
  case TC_FLOAT8_E4M3FN:
    ((uint8_t *)buf)[i] = tc__float_to_fp8e4m3fn((float)v);
    break;
  case TC_FLOAT8_E5M2: ((uint8_t *)buf)[i] = tc__float_to_fp8e5m2((float)v); break;
  default: break;
  }
}

double tc_get(const void *buf, size_t i, tc_dtype_t dt) {
  switch (dt) {
  case TC_FLOAT32: return ((const float *)buf)[i];
  case TC_FLOAT64: return ((const double *)buf)[i];
  case TC_FLOAT16: return tc__half_to_float(((const uint16_t *)buf)[i]);
  case TC_BFLOAT16: return tc__bf16_to_float(((const uint16_t *)buf)[i]);
  case TC_INT8: return ((const int8_t *)buf)[i];
  case TC_UINT8: return ((const uint8_t *)buf)[i];
  case TC_INT16: return ((const int16_t *)buf)[i];
  case TC_INT32: return ((const int32_t *)buf)[i];
  case TC_INT64: return (double)((const int64_t *)buf)[i];
  case TC_BOOL: return ((const uint8_t *)buf)[i];
  case TC_FLOAT8_E4M3FN:
    return tc__fp8e4m3fn_to_float(((const uint8_t *)buf)[i]);
  case TC_FLOAT8_E5M2: return tc__fp8e5m2_to_float(((const uint8_t *)buf)[i]);
  default: return 0;
  }
}

void tc_fill(void *buf, size_t count, tc_dtype_t dt, int rank, int seed) {
  for (size_t i = 0; i < count; i++) {
    /* small values: 1..4 for products, mixed signs for signed types */
    unsigned h = (unsigned)(i * 2654435761u) ^ (unsigned)(rank * 40503 + seed * 977);
    int v = (int)(h % 4) + 1;
    /* the 8-bit floats: sums of 8 ranks stay exact in any order (e4m3fn:
     * |sum| <= 16; e5m2, 3 significant bits: |sum| <= 8), as do the
     * products (powers of two) and the sums of halves of PREMUL_SUM(0.5) */
    if (dt == TC_FLOAT8_E4M3FN) v = (int)(h % 2) + 1;
    else if (dt == TC_FLOAT8_E5M2) v = 1;
    if (dt == TC_BOOL) v = (int)((h >> 3) & 1);
    else if (dt != TC_UINT8 && ((h >> 5) & 1)) v = -v;
    tc_set(buf, i, dt, v);
  }
}

long tc_rss_kib(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  long pages = 0, res = 0;
  TC_ASSERT(f && fscanf(f, "%ld %ld", &pages, &res) == 2);
  fclose(f);
  return res * (sysconf(_SC_PAGESIZE) / 1024);
}

void tc_read_text(const char *path, char *buf, size_t len) {
  buf[0] = 0;
  int fd = open(path, O_RDONLY);
  TC_ASSERT(fd >= 0);
  size_t at = 0;
  ssize_t n;
  while (at + 1 < len && (n = read(fd, buf + at, len - 1 - at)) > 0) at += (size_t)n;
  buf[at] = 0;
  close(fd);
}

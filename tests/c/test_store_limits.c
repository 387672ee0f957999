/* test_store_limits.c -- the store server against hostile clients: values
 * over TORCHCOMMS_STORE_MAX_VALUE_BYTES are refused with a clear error and
 * the others are still served, clients that never read their answers do not
 * grow the server past TORCHCOMMS_STORE_MAX_BYTES (its own accounting and
 * its resident memory), and its log is rate-limited. The server runs in a
 * child process (its memory measured from /proc, its log captured). */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bootstrap/store_server.h"
#include "runner.h"

/* ---- a server in a child process ---- */

typedef struct srv_proc {
  pid_t pid;
  int port;
  int ctl;   /* closing it stops the server */
  int stats; /* then the child writes its memory accounting here */
} srv_proc_t;

typedef struct srv_stats {
  size_t used, peak, budget;
} srv_stats_t;

/* Starts a server in a child with env[] ("NAME=value", NULL-terminated)
 * set and its stderr sent to log_path (NULL: inherited). */
static srv_proc_t srv_start(const char *const *env, const char *log_path) {
  int pfd[2], ctl[2], st[2];
  TC_ASSERT(pipe(pfd) == 0 && pipe(ctl) == 0 && pipe(st) == 0);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  TC_ASSERT(pid >= 0);
  if (pid == 0) {
    close(pfd[0]);
    close(ctl[1]);
    close(st[0]);
    for (int i = 0; env && env[i]; i++) putenv((char *)env[i]);
    if (log_path) {
      int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (fd < 0 || dup2(fd, 2) < 0) _exit(2);
      close(fd);
    }
    tc_store_server_t *server = NULL;
    int p = -1;
    if (tc_store_server_start("127.0.0.1", 0, &server) == TC_OK)
      p = tc_store_server_port(server);
    if (write(pfd[1], &p, sizeof p) != (ssize_t)sizeof p) _exit(1);
    char c;
    while (read(ctl[0], &c, 1) > 0) {
    }
    srv_stats_t s = {0};
    if (server) tc__store_server_memory(server, &s.used, &s.peak, &s.budget);
    if (server) tc_store_server_stop(server);
    if (write(st[1], &s, sizeof s) != (ssize_t)sizeof s) _exit(1);
    _exit(0);
  }
  close(pfd[1]);
  close(ctl[0]);
  close(st[1]);
  srv_proc_t sp = {.pid = pid, .ctl = ctl[1], .stats = st[0], .port = -1};
  TC_ASSERT_EQ(read(pfd[0], &sp.port, sizeof sp.port), sizeof sp.port);
  TC_ASSERT(sp.port > 0);
  close(pfd[0]);
  return sp;
}

/* Stops the server; returns its accounting at that moment. */
static srv_stats_t srv_stop(srv_proc_t *sp) {
  close(sp->ctl);
  srv_stats_t s = {0};
  struct pollfd p = {.fd = sp->stats, .events = POLLIN};
  TC_ASSERT(poll(&p, 1, 30000) == 1);
  TC_ASSERT_EQ(read(sp->stats, &s, sizeof s), sizeof s);
  close(sp->stats);
  int status = 0;
  TC_ASSERT_EQ(waitpid(sp->pid, &status, 0), sp->pid);
  TC_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  return s;
}

/* A line "<field>: N kB" of /proc/<pid>/status, in bytes. */
static size_t proc_kb(pid_t pid, const char *field) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  TC_ASSERT(f != NULL);
  size_t v = 0, fl = strlen(field);
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, field, fl) && line[fl] == ':')
      v = (size_t)strtoull(line + fl + 1, NULL, 10) * 1024;
  fclose(f);
  return v;
}

/* ---- raw clients ---- */

static int raw_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  TC_ASSERT(fd >= 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  TC_ASSERT(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
  return fd;
}

/* Sends b whole (blocking). */
static void raw_send(int fd, const tc__buf_t *b) {
  size_t off = 0;
  while (off < b->len) {
    ssize_t n = send(fd, b->p + off, b->len - off, MSG_NOSIGNAL);
    TC_ASSERT(n > 0);
    off += (size_t)n;
  }
}

/* Reads until EOF within timeout_s; returns the bytes read, -1 on timeout. */
static long long raw_until_eof(int fd, double timeout_s) {
  char buf[65536];
  long long total = 0;
  double deadline = tc__now() + timeout_s;
  for (;;) {
    double left = deadline - tc__now();
    if (left <= 0) return -1;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, (int)(left * 1000) + 1) <= 0) continue;
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return total;
    total += n;
  }
}

static void expect_value(tc_store_t *s, const char *key, const void *want,
                         size_t n) {
  void *v = NULL;
  size_t got = 0;
  TC_ASSERT_OK(tc_store_get(s, key, &v, &got, 10.0));
  TC_ASSERT_EQ(got, n);
  TC_ASSERT(memcmp(v, want, n) == 0);
  tc_free(v);
}

/* ---- tests ---- */

TC_TEST(store_limits_oversized_value_refused_clearly) {
  static const char *const env[] = {"TORCHCOMMS_STORE_MAX_VALUE_BYTES=1M",
                                    NULL};
  srv_proc_t sp = srv_start(env, NULL);
  tc_store_t *a = NULL, *b = NULL;
  TC_ASSERT_OK(tc_store_tcp_connect("127.0.0.1", sp.port, 10, &a));
  TC_ASSERT_OK(tc_store_tcp_connect("127.0.0.1", sp.port, 10, &b));
  size_t big = (2u << 20) + 3;
  char *v = malloc(big);
  for (size_t i = 0; i < big; i++) v[i] = (char)(i * 7);
  /* exactly the limit is fine */
  TC_ASSERT_OK(tc_store_set(a, "max", v, 1u << 20));
  expect_value(b, "max", v, 1u << 20);
  /* one byte more: refused, the client says why */
  TC_ASSERT_ERR(tc_store_set(a, "huge", v, big), TC_ERR_STORE,
                "store set('huge'): the store server at 127.0.0.1:");
  TC_ASSERT_CONTAINS(tc_last_error(),
                     "refused the request: a value of 2097155 bytes exceeds "
                     "its limit of 1048576 (TORCHCOMMS_STORE_MAX_VALUE_BYTES) "
                     "(SET request)");
  /* the connection is gone; later requests repeat the reason */
  TC_ASSERT_ERR(tc_store_add(a, "n", 1, NULL), TC_ERR_REMOTE,
                "was lost earlier (the store server refused a request: a "
                "value of 2097155 bytes");
  /* a raw client announcing a 1 TiB value is closed at once: the server
   * reads nothing more than the length */
  int fd = raw_connect(sp.port);
  tc__buf_t r = {0};
  tc__buf_u8(&r, TC__Q_VALIDATE);
  tc__buf_u32(&r, TC__TCP_VALIDATION_MAGIC);
  tc__buf_u8(&r, TC__Q_SET);
  tc__buf_str(&r, "/x", 2);
  tc__buf_u64(&r, (uint64_t)1 << 40);
  raw_send(fd, &r);
  TC_ASSERT_EQ(raw_until_eof(fd, 10.0), 0);
  close(fd);
  tc__buf_free(&r);
  /* everyone else is still served, and nothing of "huge" was stored */
  int64_t n = 0;
  TC_ASSERT_OK(tc_store_add(b, "n", 5, &n));
  TC_ASSERT_EQ(n, 5);
  const char *keys[] = {"huge"};
  int ready = -1;
  TC_ASSERT_OK(tc_store_check(b, keys, 1, &ready));
  TC_ASSERT_EQ(ready, 0);
  TC_ASSERT_OK(tc_store_set(b, "after", "ok", 2));
  expect_value(b, "after", "ok", 2);
  tc_store_release(a);
  tc_store_release(b);
  free(v);
  srv_stop(&sp);
}

#define NREADERS 16
#define BUDGET ((size_t)16 << 20)

TC_TEST(store_limits_non_reading_clients_stay_within_budget) {
  static const char *const env[] = {"TORCHCOMMS_STORE_MAX_BYTES=16M",
                                    "TORCHCOMMS_STORE_MAX_UNSENT_BYTES=1M",
                                    "TORCHCOMMS_STORE_MAX_VALUE_BYTES=4M", NULL};
  char log[] = "/tmp/tc_store_limits_XXXXXX";
  int lfd = mkstemp(log);
  TC_ASSERT(lfd >= 0);
  close(lfd);
  srv_proc_t sp = srv_start(env, log);
  size_t rss0 = proc_kb(sp.pid, "VmRSS");
  tc_store_t *s = NULL;
  TC_ASSERT_OK(tc_store_tcp_connect("127.0.0.1", sp.port, 10, &s));
  size_t vlen = 1u << 20;
  char *v = malloc(vlen);
  memset(v, 'v', vlen);
  TC_ASSERT_OK(tc_store_set(s, "v", v, vlen));
  /* NREADERS clients ask for 64 x 1 MiB each (1 GiB in all) and never read
   * an answer */
  tc__buf_t b = {0};
  tc__buf_u8(&b, TC__Q_VALIDATE);
  tc__buf_u32(&b, TC__TCP_VALIDATION_MAGIC);
  for (int i = 0; i < 64; i++) {
    tc__buf_u8(&b, TC__Q_GET);
    tc__buf_str(&b, "/v", 2);
  }
  int fds[NREADERS];
  for (int i = 0; i < NREADERS; i++) {
    fds[i] = raw_connect(sp.port);
    raw_send(fds[i], &b);
  }
  tc__buf_free(&b);
  /* a well-behaved client is still served, within a bounded time */
  double t0 = tc__now();
  for (int i = 0; i < 20; i++) {
    char key[32], val[32];
    snprintf(key, sizeof key, "k%d", i);
    snprintf(val, sizeof val, "value %d", i);
    TC_ASSERT_OK(tc_store_set(s, key, val, strlen(val)));
    expect_value(s, key, val, strlen(val));
  }
  expect_value(s, "v", v, vlen);
  double took = tc__now() - t0;
  TC_ASSERT(took < 20.0);
  /* at least one non-reader was evicted for the others: its socket ends */
  int evicted = 0;
  for (int i = 0; i < NREADERS; i++) {
    long long got = raw_until_eof(fds[i], 0.2); /* -1: still open */
    evicted += got >= 0;
  }
  size_t hwm = proc_kb(sp.pid, "VmHWM");
  for (int i = 0; i < NREADERS; i++) close(fds[i]);
  tc_store_release(s);
  srv_stats_t st = srv_stop(&sp);
  printf("  budget %zu, peak accounted %zu, resident %zu -> peak %zu, "
         "evicted %d of %d, served in %.2f s\n",
         st.budget, st.peak, rss0, hwm, evicted, NREADERS, took);
  TC_ASSERT_EQ(st.budget, BUDGET);
  TC_ASSERT(st.peak <= BUDGET);
  TC_ASSERT(st.peak >= BUDGET / 2); /* the readers did push it */
  TC_ASSERT(evicted >= 1);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__) /* shadow memory */
  /* resident memory grew by the budget at most, plus allocator slack (the
   * unbounded server grew by hundreds of MB here) */
  TC_ASSERT(hwm - rss0 <= BUDGET + ((size_t)8 << 20));
#endif
  FILE *f = fopen(log, "r");
  TC_ASSERT(f != NULL);
  char line[1024];
  int evict_lines = 0;
  while (fgets(line, sizeof line, f))
    evict_lines += strstr(line, "evicted: it left") != NULL;
  fclose(f);
  unlink(log);
  TC_ASSERT(evict_lines >= 1);
  free(v);
}

TC_TEST(store_limits_log_is_rate_limited) {
  char log[] = "/tmp/tc_store_log_XXXXXX";
  int lfd = mkstemp(log);
  TC_ASSERT(lfd >= 0);
  close(lfd);
  srv_proc_t sp = srv_start(NULL, log);
  double t0 = tc__now();
  /* 200 connections that are not TCPStore clients, each closed by the
   * server (we wait for that, so all were handled before the stop) */
  for (int i = 0; i < 200; i++) {
    int fd = raw_connect(sp.port);
    TC_ASSERT_EQ(send(fd, "GET / HTTP/1.0\r\n\r\n", 18, MSG_NOSIGNAL), 18);
    TC_ASSERT_EQ(raw_until_eof(fd, 10.0), 0);
    close(fd);
  }
  double elapsed = tc__now() - t0;
  tc_store_t *s = NULL; /* still serving */
  TC_ASSERT_OK(tc_store_tcp_connect("127.0.0.1", sp.port, 10, &s));
  TC_ASSERT_OK(tc_store_set(s, "k", "v", 1));
  tc_store_release(s);
  srv_stop(&sp);
  FILE *f = fopen(log, "r");
  TC_ASSERT(f != NULL);
  char line[1024];
  int detailed = 0, lines = 0;
  unsigned long suppressed = 0;
  while (fgets(line, sizeof line, f)) {
    lines++;
    if (strstr(line, "closing the connection from 127.0.0.1:") &&
        strstr(line, "first request is 71, not VALIDATE"))
      detailed++;
    const char *m = strstr(line, "store server: ");
    unsigned long n = 0;
    if (m && sscanf(m, "store server: %lu more log lines suppressed", &n) == 1)
      suppressed += n;
  }
  fclose(f);
  unlink(log);
  int windows = 1 + (int)(elapsed / TC__STORE_LOG_WINDOW_S);
  printf("  %d log lines: %d detailed, %lu suppressed (%.2f s)\n", lines,
         detailed, suppressed, elapsed);
  TC_ASSERT(detailed >= 1);
  TC_ASSERT(detailed <= TC__STORE_LOG_BURST * windows);
  TC_ASSERT_EQ(detailed + (long long)suppressed, 200);
  TC_ASSERT(lines <= detailed + windows + 1);
}

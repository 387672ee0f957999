/* test_store.c -- the store layer: our TCPStore client against our server,
 * the raw wire protocol, the memory, prefix and custom stores, argument
 * checking, timeouts and server shutdown. */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bootstrap/store_internal.h"
#include "runner.h"

/* ---- helpers ---- */

/* Starts a server on 127.0.0.1 and connects one client to it. */
static tc_store_t *connect_new(tc_store_server_t **srv) {
  TC_ASSERT_OK(tc_store_server_start("127.0.0.1", 0, srv));
  tc_store_t *s = NULL;
  TC_ASSERT_OK(
      tc_store_tcp_connect("127.0.0.1", tc_store_server_port(*srv), 10, &s));
  return s;
}

/* get must return exactly `want`. */
static void expect_value(tc_store_t *s, const char *key, const char *want) {
  void *v = NULL;
  size_t n = 0;
  TC_ASSERT_OK(tc_store_get(s, key, &v, &n, 10.0));
  TC_ASSERT_EQ(n, strlen(want));
  TC_ASSERT(memcmp(v, want, n) == 0);
  TC_ASSERT_EQ(((char *)v)[n], 0); /* NUL-terminated for convenience */
  tc_free(v);
}

/* The common contract of every store kind. */
static void store_contract(tc_store_t *s) {
  TC_ASSERT_OK(tc_store_set(s, "a", "hello", 5));
  expect_value(s, "a", "hello");
  TC_ASSERT_OK(tc_store_set(s, "a", "bye", 3)); /* overwrite */
  expect_value(s, "a", "bye");
  TC_ASSERT_OK(tc_store_set(s, "empty", NULL, 0));
  expect_value(s, "empty", "");
  const char bin[4] = {0, 1, 0, 2};
  TC_ASSERT_OK(tc_store_set(s, "bin", bin, 4));
  void *v = NULL;
  size_t n = 0;
  TC_ASSERT_OK(tc_store_get(s, "bin", &v, &n, 1.0));
  TC_ASSERT_EQ(n, 4);
  TC_ASSERT(memcmp(v, bin, 4) == 0);
  tc_free(v);

  int64_t r = 0;
  TC_ASSERT_OK(tc_store_add(s, "cnt", 5, &r));
  TC_ASSERT_EQ(r, 5);
  TC_ASSERT_OK(tc_store_add(s, "cnt", -7, &r));
  TC_ASSERT_EQ(r, -2);
  TC_ASSERT_OK(tc_store_add(s, "cnt", 0, NULL));
  expect_value(s, "cnt", "-2"); /* torch stores counters as decimal text */
  TC_ASSERT_OK(tc_store_add(s, "big", INT64_MAX - 1, &r));
  TC_ASSERT_OK(tc_store_add(s, "big", 1, &r));
  TC_ASSERT_EQ(r, INT64_MAX);

  int ready = -1;
  const char *both[] = {"a", "cnt"}, *some[] = {"a", "nope"};
  TC_ASSERT_OK(tc_store_check(s, both, 2, &ready));
  TC_ASSERT_EQ(ready, 1);
  TC_ASSERT_OK(tc_store_check(s, some, 2, &ready));
  TC_ASSERT_EQ(ready, 0);
  TC_ASSERT_OK(tc_store_check(s, NULL, 0, &ready));
  TC_ASSERT_EQ(ready, 1);
  TC_ASSERT_OK(tc_store_wait(s, both, 2, 5.0));
  TC_ASSERT_OK(tc_store_wait(s, NULL, 0, 0.0));

  int deleted = -1;
  TC_ASSERT_OK(tc_store_delete(s, "a", &deleted));
  TC_ASSERT_EQ(deleted, 1);
  TC_ASSERT_OK(tc_store_delete(s, "a", &deleted));
  TC_ASSERT_EQ(deleted, 0);
  TC_ASSERT_OK(tc_store_check(s, both, 2, &ready));
  TC_ASSERT_EQ(ready, 0);

  /* a get with timeout 0 still finds an existing key */
  TC_ASSERT_OK(tc_store_get(s, "cnt", &v, &n, 0.0));
  tc_free(v);

  /* timeouts are fast and say what and where */
  double t0 = tc__now();
  TC_ASSERT_ERR(tc_store_get(s, "job/addr/3", &v, &n, 0.2), TC_ERR_TIMEOUT,
                "job/addr/3') timed out after 0.2 s");
  TC_ASSERT_CONTAINS(tc_last_error(), "store get('");
  TC_ASSERT_CONTAINS(tc_last_error(), "rank 3");
  TC_ASSERT(v == NULL && n == 0);
  const char *w[] = {"cnt", "job/x/1", "job/y/2"};
  TC_ASSERT_ERR(tc_store_wait(s, w, 3, 0.2), TC_ERR_TIMEOUT, "timed out");
  /* names the keys still missing (with any prefix), not the present one */
  const char *miss = strstr(tc_last_error(), "still missing: '");
  TC_ASSERT(miss != NULL);
  TC_ASSERT(strstr(miss, "job/x/1'") && strstr(miss, "job/y/2'"));
  TC_ASSERT(!strstr(miss, "cnt'"));
  TC_ASSERT_CONTAINS(tc_last_error(), "is rank 1 running");
  TC_ASSERT(tc__now() - t0 < 3.0);
  /* and leave the store usable */
  TC_ASSERT_OK(tc_store_set(s, "after", "1", 1));
  expect_value(s, "after", "1");
}

/* ---- our client against our server ---- */

TC_TEST(store_tcp_basic) {
  tc_store_server_t *srv = NULL;
  tc_store_t *s = connect_new(&srv);
  store_contract(s);
  TC_ASSERT_STR_EQ(tc_store_local_addr(s), "127.0.0.1");
  /* "localhost" resolves too; a second client sees the first one's keys */
  tc_store_t *s2 = NULL;
  TC_ASSERT_OK(tc_store_tcp_connect("localhost", tc_store_server_port(srv), 5,
                                    &s2));
  expect_value(s2, "after", "1");
  /* a large value */
  size_t big = 8u << 20;
  char *buf = malloc(big);
  for (size_t i = 0; i < big; i++) buf[i] = (char)(i * 7 + 3);
  TC_ASSERT_OK(tc_store_set(s, "large", buf, big));
  void *v = NULL;
  size_t n = 0;
  TC_ASSERT_OK(tc_store_get(s2, "large", &v, &n, 5));
  TC_ASSERT_EQ(n, big);
  TC_ASSERT(memcmp(v, buf, big) == 0);
  tc_free(v);
  free(buf);
  tc_store_release(s2);
  tc_store_release(s);
  tc_store_server_stop(srv);
}

typedef struct getter_arg {
  int port;
  const char *key;
  double timeout;
  int rc;
  char value[64];
  char err[512];
  double took;
} getter_arg_t;

/* Connects, announces itself under "getter/ready", then gets g->key. */
static void *getter_main(void *p) {
  getter_arg_t *g = p;
  tc_store_t *s = NULL;
  g->rc = tc_store_tcp_connect("127.0.0.1", g->port, 10, &s);
  if (g->rc != TC_OK) return NULL;
  g->rc = tc_store_set(s, "getter/ready", "1", 1);
  void *v = NULL;
  size_t n = 0;
  double t0 = tc__now();
  if (g->rc == TC_OK) g->rc = tc_store_get(s, g->key, &v, &n, g->timeout);
  g->took = tc__now() - t0;
  if (g->rc == TC_OK) snprintf(g->value, sizeof g->value, "%.*s", (int)n,
                               (char *)v);
  snprintf(g->err, sizeof g->err, "%s", tc_last_error());
  tc_free(v);
  tc_store_release(s);
  return NULL;
}

TC_TEST(store_tcp_waiting_get_satisfied_by_later_set) {
  tc_store_server_t *srv = NULL;
  tc_store_t *s = connect_new(&srv);
  getter_arg_t g = {.port = tc_store_server_port(srv), .key = "late",
                    .timeout = 30.0};
  pthread_t th;
  TC_ASSERT(pthread_create(&th, NULL, getter_main, &g) == 0);
  const char *ready[] = {"getter/ready"};
  TC_ASSERT_OK(tc_store_wait(s, ready, 1, 30.0));
  TC_ASSERT_OK(tc_store_set(s, "late", "value!", 6));
  pthread_join(th, NULL);
  if (g.rc != TC_OK) tc_test_fail(__FILE__, __LINE__, "getter: %s", g.err);
  TC_ASSERT_STR_EQ(g.value, "value!");
  TC_ASSERT(g.took < 10.0);
  tc_store_release(s);
  tc_store_server_stop(srv);
}

/* Ranks of the multi-process test: counter, per-rank keys, all-gather. */
static void many_rank(tc_ctx_t *ctx) {
  tc_store_t *s = tc_ctx_store(ctx);
  char key[64], val[64];
  snprintf(key, sizeof key, "rank/%d", ctx->rank);
  snprintf(val, sizeof val, "value-of-%d", ctx->rank);
  TC_ASSERT_OK(tc_store_set(s, key, val, strlen(val)));
  int64_t r = 0;
  TC_ASSERT_OK(tc_store_add(s, "counter", 1, &r));
  TC_ASSERT(r >= 1 && r <= ctx->size);
  const char *keys[64];
  char names[64][32];
  for (int i = 0; i < ctx->size; i++) {
    snprintf(names[i], sizeof names[i], "rank/%d", i);
    keys[i] = names[i];
  }
  TC_ASSERT_OK(tc_store_wait(s, keys, (size_t)ctx->size, 60));
  for (int i = 0; i < ctx->size; i++) {
    snprintf(val, sizeof val, "value-of-%d", i);
    expect_value(s, names[i], val);
  }
  TC_ASSERT_OK(tc_store_add(s, "counter", 0, &r));
  TC_ASSERT_EQ(r, ctx->size);
  tc_store_release(s);
}

/* Like tc_spawn, but the server runs in a forked process of its own: this
 * process has no thread when it forks the ranks (a fork while another
 * thread holds the ASan allocator lock would deadlock the child). */
static void spawn_with_server_process(int n, tc_rank_fn fn, double timeout) {
  int portpipe[2], stoppipe[2];
  TC_ASSERT(pipe(portpipe) == 0 && pipe(stoppipe) == 0);
  fflush(stdout);
  fflush(stderr);
  pid_t server = fork();
  TC_ASSERT(server >= 0);
  if (server == 0) {
    close(portpipe[0]);
    close(stoppipe[1]);
    tc_store_server_t *srv = NULL;
    int port = -1;
    if (tc_store_server_start("127.0.0.1", 0, &srv) == TC_OK)
      port = tc_store_server_port(srv);
    if (write(portpipe[1], &port, sizeof port) != sizeof port) _exit(1);
    char c;
    while (read(stoppipe[0], &c, 1) < 0 && errno == EINTR) {
    }
    tc_store_server_stop(srv);
    _exit(port > 0 ? 0 : 1);
  }
  close(portpipe[1]);
  close(stoppipe[0]);
  int port = -1;
  TC_ASSERT_EQ(read(portpipe[0], &port, sizeof port), sizeof port);
  close(portpipe[0]);
  TC_ASSERT(port > 0);
  pid_t pids[64];
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    TC_ASSERT(pids[r] >= 0);
    if (pids[r] == 0) {
      tc_ctx_t ctx = {.rank = r, .size = n, .store_host = "127.0.0.1",
                      .store_port = port};
      fn(&ctx);
      _exit(0);
    }
  }
  double deadline = tc__now() + timeout;
  for (int r = 0; r < n; r++) {
    int st = 0;
    while (waitpid(pids[r], &st, WNOHANG) == 0) {
      TC_ASSERT(tc__now() < deadline); /* the runner kills the group */
      usleep(2000);
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
      tc_test_fail(__FILE__, __LINE__, "rank %d of %d failed (status %d)", r,
                   n, st);
  }
  close(stoppipe[1]); /* the server process stops its server and exits */
  int st = 0;
  TC_ASSERT_EQ(waitpid(server, &st, 0), server);
  TC_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

TC_TEST(store_tcp_many_processes) {
  spawn_with_server_process(32, many_rank, 60);
}

typedef struct adder_arg {
  tc_store_t *shared;
  int port;
  int rc;
  char err[512];
} adder_arg_t;

/* 200 adds on a shared store, 50 on an own connection. */
static void *adder_main(void *p) {
  adder_arg_t *a = p;
  int64_t r;
  for (int i = 0; i < 200 && a->rc == TC_OK; i++)
    a->rc = tc_store_add(a->shared, "shared", 1, &r);
  tc_store_t *own = NULL;
  if (a->rc == TC_OK)
    a->rc = tc_store_tcp_connect("127.0.0.1", a->port, 10, &own);
  for (int i = 0; i < 50 && a->rc == TC_OK; i++)
    a->rc = tc_store_add(own, "own", 1, &r);
  if (a->rc != TC_OK) snprintf(a->err, sizeof a->err, "%s", tc_last_error());
  tc_store_release(own);
  return NULL;
}

TC_TEST(store_tcp_threads_share_a_connection) {
  tc_store_server_t *srv = NULL;
  tc_store_t *s = connect_new(&srv);
  enum { N = 16 };
  pthread_t th[N];
  adder_arg_t a[N];
  for (int i = 0; i < N; i++) {
    a[i] = (adder_arg_t){.shared = s, .port = tc_store_server_port(srv)};
    TC_ASSERT(pthread_create(&th[i], NULL, adder_main, &a[i]) == 0);
  }
  for (int i = 0; i < N; i++) {
    pthread_join(th[i], NULL);
    if (a[i].rc != TC_OK) tc_test_fail(__FILE__, __LINE__, "%s", a[i].err);
  }
  expect_value(s, "shared", "3200");
  expect_value(s, "own", "800");
  tc_store_release(s);
  tc_store_server_stop(srv);
}

/* ---- the raw wire protocol against our server ---- */

/* A raw TCP connection to 127.0.0.1:port. */
static int raw_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  TC_ASSERT(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
  return fd;
}

static void raw_send(int fd, const tc__buf_t *b) {
  TC_ASSERT_EQ(send(fd, b->p, b->len, MSG_NOSIGNAL), (ssize_t)b->len);
}

/* Reads n bytes within 10 s; returns how many arrived before EOF. */
static size_t raw_recv(int fd, void *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    TC_ASSERT(poll(&p, 1, 10000) == 1);
    ssize_t r = recv(fd, (char *)buf + got, n - got, 0);
    if (r <= 0) break;
    got += (size_t)r;
  }
  return got;
}

static void raw_handshake(tc__buf_t *b) {
  tc__buf_u8(b, TC__Q_VALIDATE);
  tc__buf_u32(b, TC__TCP_VALIDATION_MAGIC);
}

TC_TEST(store_server_raw_protocol) {
  tc_store_server_t *srv = NULL;
  tc_store_t *s = connect_new(&srv);
  int port = tc_store_server_port(srv);
  uint8_t x[16];

  /* a wait is answered only when its key appears: WAIT then PING; the
   * PING's echo coming first proves the WAIT is pending */
  int fd = raw_connect(port);
  tc__buf_t b = {0};
  raw_handshake(&b);
  tc__buf_u8(&b, TC__Q_WAIT);
  tc__buf_u64(&b, 2);
  tc__buf_str(&b, "/w1", 3);
  tc__buf_str(&b, "/w2", 3);
  tc__buf_u8(&b, TC__Q_PING);
  tc__buf_u32(&b, 0xA1B2C3D4u);
  raw_send(fd, &b);
  TC_ASSERT_EQ(raw_recv(fd, x, 4), 4);
  TC_ASSERT_EQ(tc__rd_u32(x), 0xA1B2C3D4u);
  TC_ASSERT_OK(tc_store_set(s, "w1", "1", 1));
  /* still pending (w2 missing): another PING is answered first */
  b.len = 0;
  tc__buf_u8(&b, TC__Q_PING);
  tc__buf_u32(&b, 7);
  raw_send(fd, &b);
  TC_ASSERT_EQ(raw_recv(fd, x, 4), 4);
  TC_ASSERT_EQ(tc__rd_u32(x), 7);
  int64_t r;
  TC_ASSERT_OK(tc_store_add(s, "w2", 1, &r));
  TC_ASSERT_EQ(raw_recv(fd, x, 1), 1);
  TC_ASSERT_EQ(x[0], TC__WAIT_STOP_WAITING);

  /* a request split into single bytes; GET of a missing key is empty */
  b.len = 0;
  tc__buf_u8(&b, TC__Q_SET);
  tc__buf_str(&b, "/split", 6);
  tc__buf_str(&b, "abc", 3);
  tc__buf_u8(&b, TC__Q_GET);
  tc__buf_str(&b, "/missing", 8);
  for (size_t i = 0; i < b.len; i++)
    TC_ASSERT_EQ(send(fd, b.p + i, 1, MSG_NOSIGNAL), 1);
  TC_ASSERT_EQ(raw_recv(fd, x, 8), 8);
  TC_ASSERT_EQ(tc__rd_u64(x), 0);
  expect_value(s, "split", "abc");

  /* CANCEL_WAIT answers WAIT_CANCELED */
  b.len = 0;
  tc__buf_u8(&b, TC__Q_WAIT);
  tc__buf_u64(&b, 1);
  tc__buf_str(&b, "/never", 6);
  tc__buf_u8(&b, TC__Q_CANCEL_WAIT);
  raw_send(fd, &b);
  TC_ASSERT_EQ(raw_recv(fd, x, 1), 1);
  TC_ASSERT_EQ(x[0], TC__WAIT_CANCELED);
  /* a client that disconnects while waiting is forgotten */
  b.len = 0;
  tc__buf_u8(&b, TC__Q_WAIT);
  tc__buf_u64(&b, 1);
  tc__buf_str(&b, "/gone", 5);
  raw_send(fd, &b);
  close(fd);

  /* no VALIDATE first, a wrong magic, an unknown request: dropped */
  fd = raw_connect(port);
  b.len = 0;
  tc__buf_u8(&b, TC__Q_PING);
  tc__buf_u32(&b, 1);
  raw_send(fd, &b);
  TC_ASSERT_EQ(raw_recv(fd, x, 4), 0);
  close(fd);
  fd = raw_connect(port);
  b.len = 0;
  tc__buf_u8(&b, TC__Q_VALIDATE);
  tc__buf_u32(&b, 0x12345678u);
  tc__buf_u8(&b, TC__Q_PING);
  tc__buf_u32(&b, 1);
  raw_send(fd, &b);
  TC_ASSERT_EQ(raw_recv(fd, x, 4), 0);
  close(fd);
  fd = raw_connect(port);
  b.len = 0;
  raw_handshake(&b);
  tc__buf_u8(&b, 200);
  raw_send(fd, &b);
  TC_ASSERT_EQ(raw_recv(fd, x, 4), 0);
  close(fd);
  tc__buf_free(&b);

  /* the server still serves everyone else */
  TC_ASSERT_OK(tc_store_set(s, "gone", "1", 1));
  expect_value(s, "gone", "1");
  tc_store_release(s);
  tc_store_server_stop(srv);
}

/* ---- failures ---- */

typedef struct blocked_arg {
  tc_store_t *s;
  int rc;
  double took;
} blocked_arg_t;

static void *blocked_get(void *p) {
  blocked_arg_t *a = p;
  void *v = NULL;
  size_t n = 0;
  double t0 = tc__now();
  tc_store_set(a->s, "blocked/ready", "1", 1);
  a->rc = tc_store_get(a->s, "never", &v, &n, 60.0);
  a->took = tc__now() - t0;
  tc_free(v);
  return NULL;
}

TC_TEST(store_server_stop_with_connected_clients) {
  tc_store_server_t *srv = NULL;
  tc_store_t *s = connect_new(&srv);
  tc_store_t *blocked = NULL, *idle = NULL;
  int port = tc_store_server_port(srv);
  TC_ASSERT_OK(tc_store_tcp_connect("127.0.0.1", port, 5, &blocked));
  TC_ASSERT_OK(tc_store_tcp_connect("127.0.0.1", port, 5, &idle));
  blocked_arg_t a = {.s = blocked};
  pthread_t th;
  TC_ASSERT(pthread_create(&th, NULL, blocked_get, &a) == 0);
  const char *ready[] = {"blocked/ready"};
  TC_ASSERT_OK(tc_store_wait(s, ready, 1, 30.0));
  tc_store_server_stop(srv);
  pthread_join(th, NULL);
  TC_ASSERT_EQ(a.rc, TC_ERR_REMOTE);
  TC_ASSERT(a.took < 20.0);
  TC_ASSERT_ERR(tc_store_add(idle, "k", 1, NULL), TC_ERR_REMOTE,
                "store add('k')");
  TC_ASSERT_ERR(tc_store_set(idle, "k", "v", 1), TC_ERR_REMOTE,
                "was lost earlier");
  tc_store_release(idle);
  tc_store_release(blocked);
  tc_store_release(s);
}

TC_TEST(store_tcp_connect_timeout_and_retry) {
  int port = tc_free_port();
  tc_store_t *s = NULL;
  double t0 = tc__now();
  TC_ASSERT_ERR(tc_store_tcp_connect("127.0.0.1", port, 0.5, &s),
                TC_ERR_TIMEOUT, "could not connect to the store at 127.0.0.1:");
  TC_ASSERT(s == NULL);
  TC_ASSERT(tc__now() - t0 < 5.0);
  TC_ASSERT_ERR(tc_store_tcp_connect("no-such-host.invalid", port, 0.5, &s),
                TC_ERR_INVALID_ARGUMENT, "cannot resolve");
  /* a server that starts after the client began retrying */
  getter_arg_t g = {.port = port, .key = "k", .timeout = 10.0};
  pthread_t th;
  TC_ASSERT(pthread_create(&th, NULL, getter_main, &g) == 0);
  tc_store_server_t *srv = NULL;
  TC_ASSERT_OK(tc_store_server_start("127.0.0.1", port, &srv));
  TC_ASSERT_EQ(tc_store_server_port(srv), port);
  TC_ASSERT_OK(tc_store_tcp_connect("127.0.0.1", port, 10, &s));
  TC_ASSERT_OK(tc_store_set(s, "k", "v", 1));
  pthread_join(th, NULL);
  if (g.rc != TC_OK) tc_test_fail(__FILE__, __LINE__, "getter: %s", g.err);
  TC_ASSERT_STR_EQ(g.value, "v");
  /* the port is taken now */
  tc_store_server_t *srv2 = NULL;
  TC_ASSERT_ERR(tc_store_server_start("127.0.0.1", port, &srv2), TC_ERR_SYSTEM,
                "cannot listen");
  tc_store_release(s);
  tc_store_server_stop(srv);
}

/* ---- memory, prefix and custom stores ---- */

typedef struct mem_setter {
  tc_store_t *s;
} mem_setter_t;

static void *mem_setter_main(void *p) {
  tc_store_t *s = ((mem_setter_t *)p)->s;
  const char *ready[] = {"getter/ready"};
  if (tc_store_wait(s, ready, 1, 30.0) == TC_OK) tc_store_set(s, "late", "x", 1);
  return NULL;
}

TC_TEST(store_memory) {
  tc_store_t *s = NULL;
  TC_ASSERT_OK(tc_store_memory(&s));
  store_contract(s);
  TC_ASSERT(tc_store_local_addr(s) == NULL);
  TC_ASSERT_OK(tc_store_set(s, "text", "abc", 3));
  TC_ASSERT_ERR(tc_store_add(s, "text", 1, NULL), TC_ERR_STORE,
                "not a decimal integer");
  /* a get waiting in this thread is satisfied by another thread */
  mem_setter_t m = {s};
  pthread_t th;
  TC_ASSERT(pthread_create(&th, NULL, mem_setter_main, &m) == 0);
  TC_ASSERT_OK(tc_store_set(s, "getter/ready", "1", 1));
  expect_value(s, "late", "x");
  pthread_join(th, NULL);
  tc_store_release(s);
}

TC_TEST(store_prefix) {
  tc_store_server_t *srv = NULL;
  tc_store_t *base = connect_new(&srv);
  tc_store_t *p = NULL, *pp = NULL;
  TC_ASSERT_OK(tc_store_prefix(base, "main", &p));
  TC_ASSERT_OK(tc_store_prefix(p, "0", &pp));
  store_contract(pp);
  TC_ASSERT_OK(tc_store_set(pp, "addr/1", "10.0.0.1", 8));
  expect_value(base, "main/0/addr/1", "10.0.0.1");
  expect_value(p, "0/addr/1", "10.0.0.1");
  TC_ASSERT_STR_EQ(tc_store_local_addr(pp), "127.0.0.1");
  /* timeouts name the full key */
  void *v;
  size_t n;
  TC_ASSERT_ERR(tc_store_get(pp, "addr/3", &v, &n, 0.1), TC_ERR_TIMEOUT,
                "get('main/0/addr/3') timed out");
  /* the prefix stores keep their base alive */
  tc_store_release(base);
  tc_store_release(p);
  expect_value(pp, "addr/1", "10.0.0.1");
  tc_store_release(pp);
  tc_store_server_stop(srv);

  tc_store_t *m = NULL;
  TC_ASSERT_OK(tc_store_memory(&m));
  TC_ASSERT_OK(tc_store_prefix(m, "", &p));
  TC_ASSERT_OK(tc_store_set(p, "k", "v", 1));
  expect_value(m, "/k", "v");
  tc_store_release(p);
  tc_store_release(m);
}

/* A custom store (over a memory store) that counts calls; `quiet` makes
 * get fail without setting an error text. */
typedef struct custom {
  tc_store_t *mem;
  int checks, destroyed, quiet;
} custom_t;

static int c_set(void *c, const char *k, const void *v, size_t n) {
  return tc_store_set(((custom_t *)c)->mem, k, v, n);
}
static int c_get(void *c, const char *k, void **v, size_t *n, double t) {
  if (((custom_t *)c)->quiet) return TC_ERR_BACKEND;
  return tc_store_get(((custom_t *)c)->mem, k, v, n, t);
}
static int c_add(void *c, const char *k, int64_t d, int64_t *r) {
  return tc_store_add(((custom_t *)c)->mem, k, d, r);
}
static int c_check(void *c, const char *const *k, size_t n, int *ready) {
  ((custom_t *)c)->checks++;
  return tc_store_check(((custom_t *)c)->mem, k, n, ready);
}
static int c_delete(void *c, const char *k, int *d) {
  return tc_store_delete(((custom_t *)c)->mem, k, d);
}
static void c_destroy(void *c) {
  ((custom_t *)c)->destroyed++;
  tc_store_release(((custom_t *)c)->mem);
}

TC_TEST(store_custom_vtable) {
  static const tc_store_vtable_t vt = {
      .size = sizeof(tc_store_vtable_t), .version = 1, .set = c_set,
      .get = c_get, .add = c_add, .check = c_check, .delete_key = c_delete,
      .destroy = c_destroy};
  custom_t c = {0};
  TC_ASSERT_OK(tc_store_memory(&c.mem));
  tc_store_t *s = NULL;
  TC_ASSERT_OK(tc_store_create(&vt, &c, &s));
  store_contract(s);
  TC_ASSERT(c.checks > 0); /* wait polls check */
  TC_ASSERT(tc_store_local_addr(s) == NULL);
  c.quiet = 1;
  void *v;
  size_t n;
  TC_ASSERT_ERR(tc_store_get(s, "cnt", &v, &n, 1), TC_ERR_BACKEND,
                "store get('cnt') failed on the custom store");
  tc_store_retain(s);
  tc_store_release(s);
  TC_ASSERT_EQ(c.destroyed, 0);
  tc_store_release(s);
  TC_ASSERT_EQ(c.destroyed, 1);
}

TC_TEST(store_bad_arguments) {
  tc_store_t *s = NULL, *m = NULL;
  void *v = NULL;
  size_t n = 0;
  int ready, d;
  TC_ASSERT_ERR(tc_store_set(NULL, "k", "v", 1), TC_ERR_INVALID_ARGUMENT,
                "tc_store_set: store is NULL");
  TC_ASSERT_ERR(tc_store_get(NULL, "k", &v, &n, 1), TC_ERR_INVALID_ARGUMENT,
                "tc_store_get: store is NULL");
  TC_ASSERT_OK(tc_store_memory(&m));
  TC_ASSERT_ERR(tc_store_set(m, NULL, "v", 1), TC_ERR_INVALID_ARGUMENT,
                "tc_store_set: key is NULL");
  TC_ASSERT_ERR(tc_store_set(m, "k", NULL, 3), TC_ERR_INVALID_ARGUMENT,
                "value is NULL");
  TC_ASSERT_ERR(tc_store_get(m, "k", NULL, &n, 1), TC_ERR_INVALID_ARGUMENT,
                "tc_store_get: value and len");
  TC_ASSERT_ERR(tc_store_get(m, "k", &v, &n, -1), TC_ERR_INVALID_ARGUMENT,
                "timeout_s must be >= 0");
  TC_ASSERT_ERR(tc_store_get(m, "k", &v, &n, NAN),
                TC_ERR_INVALID_ARGUMENT, "timeout_s");
  TC_ASSERT_ERR(tc_store_add(m, NULL, 1, NULL), TC_ERR_INVALID_ARGUMENT,
                "tc_store_add: key is NULL");
  TC_ASSERT_ERR(tc_store_check(m, NULL, 2, &ready), TC_ERR_INVALID_ARGUMENT,
                "tc_store_check: keys is NULL");
  const char *withnull[] = {"a", NULL};
  TC_ASSERT_ERR(tc_store_wait(m, withnull, 2, 1), TC_ERR_INVALID_ARGUMENT,
                "tc_store_wait: a key is NULL");
  TC_ASSERT_ERR(tc_store_check(m, withnull, 1, NULL), TC_ERR_INVALID_ARGUMENT,
                "ready is NULL");
  TC_ASSERT_ERR(tc_store_delete(m, NULL, &d), TC_ERR_INVALID_ARGUMENT,
                "tc_store_delete: key is NULL");
  TC_ASSERT_ERR(tc_store_prefix(m, NULL, &s), TC_ERR_INVALID_ARGUMENT,
                "prefix is NULL");
  TC_ASSERT_ERR(tc_store_prefix(NULL, "p", &s), TC_ERR_INVALID_ARGUMENT,
                "store is NULL");
  /* released and foreign handles are errors, not crashes */
  tc_store_release(m);
  TC_ASSERT_ERR(tc_store_set(m, "k", "v", 1), TC_ERR_INVALID_USAGE,
                "not a live store");
  tc_store_release(m); /* logged, ignored */
  tc_store_retain(m);
  long fake[16] = {0};
  TC_ASSERT_ERR(tc_store_add((tc_store_t *)fake, "k", 1, NULL),
                TC_ERR_INVALID_USAGE, "tc_store_add");
  TC_ASSERT(tc_store_local_addr((tc_store_t *)fake) == NULL);
  /* vtables */
  TC_ASSERT_ERR(tc_store_create(NULL, NULL, &s), TC_ERR_INVALID_ARGUMENT,
                "vtable is NULL");
  tc_store_vtable_t vt = {.size = 8, .version = 1};
  TC_ASSERT_ERR(tc_store_create(&vt, NULL, &s), TC_ERR_INVALID_ARGUMENT,
                "not supported");
  vt.size = sizeof vt;
  TC_ASSERT_ERR(tc_store_create(&vt, NULL, &s), TC_ERR_INVALID_ARGUMENT,
                "must provide set");
  TC_ASSERT_ERR(tc_store_memory(NULL), TC_ERR_INVALID_ARGUMENT, "out is NULL");
  /* connect and server */
  TC_ASSERT_ERR(tc_store_tcp_connect(NULL, 1, 1, &s), TC_ERR_INVALID_ARGUMENT,
                "host is NULL");
  TC_ASSERT_ERR(tc_store_tcp_connect("127.0.0.1", 0, 1, &s),
                TC_ERR_INVALID_ARGUMENT, "port 0 out of range");
  TC_ASSERT_ERR(tc_store_tcp_connect("127.0.0.1", 70000, 1, &s),
                TC_ERR_INVALID_ARGUMENT, "port 70000");
  TC_ASSERT_ERR(tc_store_tcp_connect("127.0.0.1", 1, -2, &s),
                TC_ERR_INVALID_ARGUMENT, "timeout_s");
  TC_ASSERT_ERR(tc_store_tcp_connect("127.0.0.1", 1, 1, NULL),
                TC_ERR_INVALID_ARGUMENT, "out is NULL");
  tc_store_server_t *srv = NULL;
  TC_ASSERT_ERR(tc_store_server_start(NULL, -1, &srv), TC_ERR_INVALID_ARGUMENT,
                "port -1");
  TC_ASSERT_ERR(tc_store_server_start("no-such-host.invalid", 0, &srv),
                TC_ERR_INVALID_ARGUMENT, "cannot resolve");
  TC_ASSERT_EQ(tc_store_server_port(NULL), -1);
  tc_store_server_stop(NULL);
}

TC_TEST(store_server_all_interfaces) {
  tc_store_server_t *srv = NULL;
  TC_ASSERT_OK(tc_store_server_start(NULL, 0, &srv));
  int port = tc_store_server_port(srv);
  TC_ASSERT(port > 0);
  tc_store_t *a = NULL, *b = NULL;
  TC_ASSERT_OK(tc_store_tcp_connect("127.0.0.1", port, 5, &a));
  TC_ASSERT_OK(tc_store_tcp_connect("localhost", port, 5, &b));
  TC_ASSERT_OK(tc_store_set(a, "k", "v", 1));
  expect_value(b, "k", "v");
  tc_store_release(a);
  tc_store_release(b);
  tc_store_server_stop(srv);
  TC_ASSERT_OK(tc_store_server_start("0.0.0.0", 0, &srv));
  TC_ASSERT_OK(tc_store_tcp_connect("127.0.0.1", tc_store_server_port(srv), 5,
                                    &a));
  store_contract(a);
  tc_store_release(a);
  tc_store_server_stop(srv);
}

TC_TEST(store_server_slow_reader_does_not_block_others) {
  tc_store_server_t *srv = NULL;
  tc_store_t *s = connect_new(&srv);
  size_t big = 4u << 20;
  char *buf = calloc(1, big);
  TC_ASSERT_OK(tc_store_set(s, "big", buf, big));
  free(buf);
  /* a raw client asks for 40 x 4 MiB and never reads the answers */
  int fd = raw_connect(tc_store_server_port(srv));
  tc__buf_t b = {0};
  raw_handshake(&b);
  for (int i = 0; i < 40; i++) {
    tc__buf_u8(&b, TC__Q_GET);
    tc__buf_str(&b, "/big", 4);
  }
  raw_send(fd, &b);
  tc__buf_free(&b);
  /* everyone else is still served */
  tc_store_t *other = NULL;
  TC_ASSERT_OK(tc_store_tcp_connect("127.0.0.1", tc_store_server_port(srv), 5,
                                    &other));
  for (int i = 0; i < 50; i++) {
    int64_t r = 0;
    TC_ASSERT_OK(tc_store_add(other, "n", 1, &r));
    TC_ASSERT_EQ(r, i + 1);
  }
  /* the held-back requests are all answered once the reader reads */
  char *ans = malloc(big);
  for (int i = 0; i < 40; i++) {
    uint8_t len[8];
    TC_ASSERT_EQ(raw_recv(fd, len, 8), 8);
    TC_ASSERT_EQ(tc__rd_u64(len), big);
    TC_ASSERT_EQ(raw_recv(fd, ans, big), big);
  }
  free(ans);
  close(fd);
  expect_value(s, "n", "50");
  tc_store_release(other);
  tc_store_release(s);
  tc_store_server_stop(srv);
}

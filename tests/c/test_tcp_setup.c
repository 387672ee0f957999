/* test_tcp_setup.c -- the TCP mesh setup against strangers on its ports:
 * while 4 ranks create a communicator (TCP forced), an attacker process
 * opens 200 idle connections, 50 connect-and-close scans and 5 bogus
 * hellos to every listening rank (the ports read from the store, where the
 * ranks publish them); creation still succeeds in bounded time, an
 * all_reduce is exact, every idle connection is closed, and each rank logs
 * the refusals once per source plus one count; a lone idle connection is
 * closed at the hello deadline. Also: the listener is bound
 * to the published address only, and TORCHCOMMS_CPU_IFNAME picks it. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "coll_util.h"
#include "transport/tcp_listen.h"

#define WORLD 4
#define IDLE 200
#define SCANS 50
#define BOGUS 5

/* "host:port" from the store key cpu/addr/<r> of communicator `name`. */
static void published(tc_store_t *s, const char *name, int r, char *host,
                      size_t hl, int *port) {
  char key[128];
  /* the communicator's keys: tc/<job>/<attempt>/<name>/<n>/ (comm_keys.c),
   * present while its creation runs (they are deleted once it completed) */
  snprintf(key, sizeof key, "tc/tcpsetup/0/%s/0/cpu/addr/%d", name, r);
  void *v = NULL;
  size_t n = 0;
  TC_ASSERT_OK(tc_store_get(s, key, &v, &n, 60));
  char val[200];
  snprintf(val, sizeof val, "%.*s", (int)n, (char *)v);
  tc_free(v);
  /* "<token hex>|host:port" */
  char *bar = strchr(val, '|'), *addr = bar ? bar + 1 : val;
  TC_ASSERT(bar != NULL && bar - val == 32);
  char *colon = strrchr(addr, ':');
  TC_ASSERT(colon != NULL);
  *colon = 0;
  snprintf(host, hl, "%s", addr);
  *port = atoi(colon + 1);
}

/* A connection to ip:port (blocking connect); -errno on failure. */
static int dial(const char *ip, int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  TC_ASSERT(fd >= 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  TC_ASSERT_EQ(inet_pton(AF_INET, ip, &a.sin_addr), 1);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  return fd;
}

/* 1 when the peer closed fd (EOF or reset) within timeout_s. */
static int closed_by_peer(int fd, double timeout_s) {
  double dl = tc__now() + timeout_s;
  char buf[64];
  for (;;) {
    double left = dl - tc__now();
    if (left <= 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, (int)(left * 1000) + 1) <= 0) continue;
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return 1;
  }
}

static void set_job(void) {
  setenv("TORCHCOMMS_JOB_ID", "tcpsetup", 1);
  unsetenv("TORCHELASTIC_RESTART_COUNT");
}

static void attacker(tc_ctx_t *ctx) {
  set_job();
  tc_store_t *s = tc_ctx_store(ctx);
  static int idle[WORLD - 1][IDLE];
  unsigned char zero[16] = {0}, hello[TC__TCP_HELLO_BYTES];
  tc__tcp_put_hello(hello, 1, WORLD, 0, zero); /* right shape, wrong token */
  for (int r = 0; r < WORLD - 1; r++) {
    char host[128];
    int port = 0;
    published(s, "atk", r, host, sizeof host, &port);
    TC_ASSERT_STR_EQ(host, "127.0.0.1");
    /* bound to the published address only: another loopback address of
     * this host is refused */
    TC_ASSERT_EQ(dial("127.0.0.2", port), -ECONNREFUSED);
    if (r == 0) { /* one idle connection alone: closed at the hello deadline */
      int fd = dial(host, port);
      TC_ASSERT(fd >= 0);
      double t0 = tc__now();
      TC_ASSERT(closed_by_peer(fd, 20));
      double dt = tc__now() - t0;
      printf("  an idle connection was closed after %.2f s\n", dt);
      TC_ASSERT(dt >= TC__TCP_HELLO_TIMEOUT_S - 0.5);
      TC_ASSERT(dt <= TC__TCP_HELLO_TIMEOUT_S + 3.0);
      close(fd);
    }
    for (int i = 0; i < IDLE; i++) {
      idle[r][i] = dial(host, port);
      TC_ASSERT(idle[r][i] >= 0);
    }
    for (int i = 0; i < SCANS; i++) {
      int fd = dial(host, port);
      TC_ASSERT(fd >= 0);
      close(fd);
    }
    for (int i = 0; i < BOGUS; i++) {
      int fd = dial(host, port);
      TC_ASSERT(fd >= 0);
      TC_ASSERT_EQ(send(fd, hello, sizeof hello, MSG_NOSIGNAL), (ssize_t)sizeof hello);
      TC_ASSERT(closed_by_peer(fd, 20));
      close(fd);
    }
  }
  TC_ASSERT_OK(tc_store_set(s, "atk_test/done", "1", 1));
  /* the ranks finish; every idle connection was closed by then */
  for (int r = 0; r < WORLD; r++) {
    char key[64];
    snprintf(key, sizeof key, "atk_test/created/%d", r);
    void *v = NULL;
    size_t n = 0;
    TC_ASSERT_OK(tc_store_get(s, key, &v, &n, 60));
    tc_free(v);
  }
  for (int r = 0; r < WORLD - 1; r++)
    for (int i = 0; i < IDLE; i++) {
      TC_ASSERT(closed_by_peer(idle[r][i], 10));
      close(idle[r][i]);
    }
  tc_store_release(s);
}

/* Counts the lines of path containing `a` (and `b` when not NULL); the
 * number after "refused " on the last such line in *count. */
static int count_lines(const char *path, const char *a, const char *b,
                       unsigned long *count) {
  FILE *f = fopen(path, "r");
  TC_ASSERT(f != NULL);
  char line[2048];
  int n = 0;
  while (fgets(line, sizeof line, f)) {
    const char *p = strstr(line, a);
    if (!p || (b && !strstr(line, b))) continue;
    n++;
    if (count) *count = strtoul(p + strlen("refused "), NULL, 10);
  }
  fclose(f);
  return n;
}

static void atk_rank(tc_ctx_t *ctx) {
  if (ctx->rank == WORLD) {
    attacker(ctx);
    return;
  }
  char log[128];
  snprintf(log, sizeof log, "%s.%d", (const char *)ctx->arg, ctx->rank);
  int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  TC_ASSERT(fd >= 0 && dup2(fd, 2) == 2);
  close(fd);
  setenv("TORCHCOMMS_CPU_TRANSPORT", "tcp", 1);
  set_job();
  tc_ctx_t me = *ctx;
  me.size = WORLD;
  tc_store_t *s = tc_ctx_store(ctx);
  double t0 = tc__now();
  if (ctx->rank == WORLD - 1) { /* joins while the others are attacked */
    void *v = NULL;
    size_t n = 0;
    TC_ASSERT_OK(tc_store_get(s, "atk_test/done", &v, &n, 60));
    tc_free(v);
    t0 = tc__now();
  }
  tc_comm_t *c = tc_ctx_comm(&me, "atk", NULL);
  double took = tc__now() - t0;
  size_t count = 1000;
  float *buf = tc_xmalloc(count * sizeof *buf);
  for (size_t i = 0; i < count; i++) buf[i] = (float)(ctx->rank + 1) * (float)(i % 7);
  TC_ASSERT_OK(tc_all_reduce(c, buf, count, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL));
  for (size_t i = 0; i < count; i++)
    TC_ASSERT_EQ(buf[i], (float)(1 + 2 + 3 + 4) * (float)(i % 7));
  free(buf);
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
  char key[64];
  snprintf(key, sizeof key, "atk_test/created/%d", ctx->rank);
  TC_ASSERT_OK(tc_store_set(s, key, "1", 1));
  tc_store_release(s);
  fflush(stderr);
  unsigned long refused = 0;
  int first = count_lines(log, "refused a connection from 127.0.0.1", NULL, NULL);
  int summary = count_lines(log, "refused ", "connections from 127.0.0.1", &refused);
  int all = count_lines(log, "refused", NULL, NULL);
  printf("  rank %d: created in %.2f s; %d refusal log lines, %lu refused\n",
         ctx->rank, took, all, refused);
  TC_ASSERT(took < 15.0);
  if (ctx->rank < WORLD - 1) {
    TC_ASSERT_EQ(first, 1);
    TC_ASSERT_EQ(summary, 1);
    TC_ASSERT_EQ(all, 2);
    /* every stranger counted; a peer's own connection may have been pushed
     * out by the flood once and retried */
    unsigned long strangers = IDLE + SCANS + BOGUS + (ctx->rank == 0);
    TC_ASSERT(refused >= strangers);
    TC_ASSERT(refused <= strangers + 2 * WORLD);
  } else {
    TC_ASSERT_EQ(all, 0); /* it listens nowhere */
  }
  unlink(log);
}

TC_TEST(tcp_setup_survives_idle_connections_and_scans) {
  char base[64];
  snprintf(base, sizeof base, "/tmp/tc_atk_%d", (int)getpid());
  tc_spawn(WORLD + 1, atk_rank, base, 90);
}

/* ---- which address is bound and published ---- */

static void addr_rank(tc_ctx_t *ctx) {
  const char *mode = ctx->arg;
  setenv("TORCHCOMMS_CPU_TRANSPORT", "tcp", 1);
  setenv("TORCHCOMMS_SOCKET_ADDR", "127.0.0.3", 1);
  if (!strcmp(mode, "ifname")) setenv("TORCHCOMMS_CPU_IFNAME", "lo", 1);
  if (!strcmp(mode, "bad")) {
    setenv("TORCHCOMMS_CPU_IFNAME", "nosuch0", 1);
    tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
    o.rank = ctx->rank;
    o.world_size = ctx->size;
    o.name = "addr";
    o.timeout_s = 3;
    o.store = tc_ctx_store(ctx);
    tc_comm_t *c = NULL;
    int rc = tc_comm_create("cpu", "cpu", &o, &c);
    printf("  rank %d: %s\n", ctx->rank, tc_last_error());
    if (ctx->rank == 0) { /* the rank that listens says why */
      TC_ASSERT_EQ(rc, TC_ERR_INVALID_ARGUMENT);
      TC_ASSERT_CONTAINS(tc_last_error(), "TORCHCOMMS_CPU_IFNAME=nosuch0 names no "
                         "interface with an IPv4 or a global IPv6 address");
      TC_ASSERT_CONTAINS(tc_last_error(), "lo");
    } else {
      TC_ASSERT(rc != TC_OK);
    }
    tc_store_release(o.store);
    return;
  }
  set_job();
  if (ctx->rank == 1) {
    /* rank 0's address, read before this rank joins (so while its key is
     * still there): IFNAME wins over the advertise address */
    tc_store_t *s = tc_ctx_store(ctx);
    char host[128];
    int port = 0;
    published(s, "addr", 0, host, sizeof host, &port);
    TC_ASSERT_STR_EQ(host, !strcmp(mode, "ifname") ? "127.0.0.1" : "127.0.0.3");
    tc_store_release(s);
  }
  tc_comm_t *c = tc_ctx_comm(ctx, "addr", NULL);
  TC_ASSERT_OK(tc_barrier(c, NULL, NULL));
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(tcp_setup_publishes_socket_addr) { tc_spawn(2, addr_rank, "addr", 60); }
TC_TEST(tcp_setup_ifname_picks_the_interface) { tc_spawn(2, addr_rank, "ifname", 60); }
TC_TEST(tcp_setup_ifname_unknown_is_a_clear_error) { tc_spawn(2, addr_rank, "bad", 60); }

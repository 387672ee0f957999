/* test_reconfig.c -- fault tolerance: reconfigurable communicators
 * (tc_comm_get_init_handle, tc_comm_reconfigure, tc_comm_is_abort_supported).
 *
 * Real processes over the real transports (the suite runs once on shared
 * memory and once forced onto TCP): a group formed from init handles, a
 * member SIGKILLed mid-operation, the survivors abort and shrink, a
 * replacement joins and the group grows back; split brain (two subsets with
 * different lists or uuids never form one group); a handle of a dead
 * process fails the reconfigure within its timeout, naming it; abort and
 * reconfigure leave no thread, socket or segment behind. Processes
 * coordinate through the test's store (handles) and an anonymous shared
 * mapping (flags with deadlines). */
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coll_util.h"
#include "transport/tcp_listen.h"
#include "transport/transport.h"

/* ---- helpers ---- */

typedef struct {
  _Atomic int shrunk;  /* survivors that finished the shrink */
  _Atomic int joined;  /* the replacement published its handle */
  _Atomic int done;
  _Atomic double kill_time;
  _Atomic double resume_max; /* kill -> first operation of the new group */
  _Atomic int named_victim;  /* survivors whose error named the victim */
} rc_shared_t;

static rc_shared_t *rc_shared_new(void) { return tc_shared_zalloc(sizeof(rc_shared_t)); }

static tc_comm_t *rc_comm(const char *name, double timeout_s) {
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.name = name;
  o.enable_reconfigure = 1;
  o.timeout_s = timeout_s;
  tc_comm_t *c = NULL;
  TC_ASSERT_OK(tc_comm_create("cpu", "cpu", &o, &c));
  return c;
}

/* Publishes this process's handle under "<gen>/<slot>" and reads n handles
 * "<gen>/0" .. "<gen>/<n-1>" (in that order) into hs[n][TC_INIT_HANDLE_MAX]. */
static void exchange(tc_store_t *s, tc_comm_t *c, const char *gen, int slot, int n,
                     char (*hs)[TC_INIT_HANDLE_MAX]) {
  char mine[TC_INIT_HANDLE_MAX], key[64];
  TC_ASSERT_OK(tc_comm_get_init_handle(c, mine, sizeof mine));
  snprintf(key, sizeof key, "%s/%d", gen, slot);
  TC_ASSERT_OK(tc_store_set(s, key, mine, strlen(mine)));
  for (int i = 0; i < n; i++) {
    void *v;
    size_t len;
    snprintf(key, sizeof key, "%s/%d", gen, i);
    TC_ASSERT_OK(tc_store_get(s, key, &v, &len, 30));
    TC_ASSERT(len < TC_INIT_HANDLE_MAX);
    memcpy(hs[i], v, len);
    hs[i][len] = 0;
    free(v);
  }
}

static int reconfigure(tc_comm_t *c, int64_t uuid, char (*hs)[TC_INIT_HANDLE_MAX], int n,
                       double timeout_s) {
  const char *list[16];
  for (int i = 0; i < n; i++) list[i] = hs[i];
  tc_reconfigure_options_t o = TC_RECONFIGURE_OPTIONS_INIT;
  o.uuid = uuid;
  o.init_handles = list;
  o.num_handles = (size_t)n;
  o.timeout_s = timeout_s;
  return tc_comm_reconfigure(c, &o, NULL);
}

/* An all_reduce of rank+1 over the group, checked exactly. */
static void check_sum(tc_comm_t *c) {
  int n = tc_comm_size(c), r = tc_comm_rank(c);
  double x[5];
  for (int i = 0; i < 5; i++) x[i] = r + 1 + i;
  TC_ASSERT_OK(tc_all_reduce(c, x, 5, TC_FLOAT64, TC_OP(TC_SUM), NULL, NULL));
  for (int i = 0; i < 5; i++) TC_ASSERT_DBL_NEAR(x[i], n * (n + 1) / 2.0 + (double)n * i, 0);
}

/* Returns once all n processes called gate with this name (bounded). */
static void gate(tc_store_t *s, const char *name, int n) {
  char key[64], done[64];
  snprintf(key, sizeof key, "gate/%s", name);
  snprintf(done, sizeof done, "gate/%s/all", name);
  int64_t arrived;
  TC_ASSERT_OK(tc_store_add(s, key, 1, &arrived));
  if (arrived == n) TC_ASSERT_OK(tc_store_set(s, done, "1", 1));
  const char *keys[1] = {done};
  TC_ASSERT_OK(tc_store_wait(s, keys, 1, 30));
}

static int count_dir(const char *path, const char *prefix) {
  DIR *d = opendir(path);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.' && (!prefix || strncmp(e->d_name, prefix, strlen(prefix)) == 0))
      n++;
  closedir(d);
  return n;
}

/* ---- the API on one process ---- */

TC_TEST(reconfig_api) {
  /* an ordinary communicator has no handle and cannot be reconfigured */
  tc_comm_t *plain;
  TC_ASSERT_OK(tc_world1_create("plain", "cpu", &plain));
  char h[TC_INIT_HANDLE_MAX];
  TC_ASSERT_ERR(tc_comm_get_init_handle(plain, h, sizeof h), TC_ERR_INVALID_USAGE,
                "not created with enable_reconfigure=True");
  tc_reconfigure_options_t o = TC_RECONFIGURE_OPTIONS_INIT;
  const char *one[1] = {"x"};
  o.init_handles = one;
  o.num_handles = 1;
  TC_ASSERT_ERR(tc_comm_reconfigure(plain, &o, NULL), TC_ERR_INVALID_USAGE,
                "reconfigure on 'plain' (rank 0 of 1): the communicator was not created "
                "with enable_reconfigure=True");
  TC_ASSERT_EQ(tc_comm_is_abort_supported(plain), 1);
  TC_ASSERT_OK(tc_comm_destroy(plain));

  /* a reconfigurable one: no members until reconfigured */
  tc_comm_t *c = rc_comm("ft", 10);
  TC_ASSERT_EQ(tc_comm_rank(c), -1);
  TC_ASSERT_EQ(tc_comm_size(c), 0);
  tc_comm_options_t got;
  TC_ASSERT_OK(tc_comm_get_options(c, &got));
  TC_ASSERT_EQ(got.enable_reconfigure, 1);
  float x = 1;
  TC_ASSERT_ERR(tc_all_reduce(c, &x, 1, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL),
                TC_ERR_INVALID_USAGE, "has no members: it was created with "
                "enable_reconfigure=True and is configured by reconfigure");
  TC_ASSERT_OK(tc_comm_get_init_handle(c, h, sizeof h));
  TC_ASSERT(strncmp(h, "torchcomms:cpu:", 15) == 0);
  char small[8];
  TC_ASSERT_ERR(tc_comm_get_init_handle(c, small, sizeof small), TC_ERR_INVALID_ARGUMENT,
                "the buffer has 8 bytes");
  /* bad lists */
  TC_ASSERT_ERR(tc_comm_reconfigure(c, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                "argument 'opts' is NULL");
  o.num_handles = 0;
  TC_ASSERT_ERR(tc_comm_reconfigure(c, &o, NULL), TC_ERR_INVALID_ARGUMENT,
                "'init_handles' is empty");
  o.num_handles = 1;
  TC_ASSERT_ERR(tc_comm_reconfigure(c, &o, NULL), TC_ERR_INVALID_ARGUMENT,
                "init_handles[0] ('x') is not an init handle");
  const char *other[1] = {"torchcomms:cpu:0123456789abcdef:127.0.0.1:9"};
  o.init_handles = other;
  TC_ASSERT_ERR(tc_comm_reconfigure(c, &o, NULL), TC_ERR_INVALID_ARGUMENT,
                "init_handles does not contain this communicator's handle");
  const char *twice[2] = {h, h};
  o.init_handles = twice;
  o.num_handles = 2;
  TC_ASSERT_ERR(tc_comm_reconfigure(c, &o, NULL), TC_ERR_INVALID_ARGUMENT,
                "lists this communicator's handle twice (entries 0 and 1)");
  const char *dup[3] = {h, other[0], other[0]};
  o.init_handles = dup;
  o.num_handles = 3;
  TC_ASSERT_ERR(tc_comm_reconfigure(c, &o, NULL), TC_ERR_INVALID_ARGUMENT,
                "twice (entries 1 and 2)");
  /* still unconfigured after refusals */
  TC_ASSERT_EQ(tc_comm_size(c), 0);
  /* a group of one, twice (a new epoch each time) */
  const char *me[1] = {h};
  o.init_handles = me;
  o.num_handles = 1;
  for (int k = 0; k < 2; k++) {
    o.uuid = 7 + k;
    tc_work_t *w = NULL;
    TC_ASSERT_OK(tc_comm_reconfigure(c, &o, &w));
    TC_ASSERT(w != NULL);
    TC_ASSERT_EQ(tc_work_status(w), TC_WORK_COMPLETED);
    TC_ASSERT_OK(tc_work_wait(w));
    TC_ASSERT_OK(tc_work_release(w));
    TC_ASSERT_EQ(tc_comm_rank(c), 0);
    TC_ASSERT_EQ(tc_comm_size(c), 1);
    check_sum(c);
  }
  /* abort, then reconfigure revives it */
  TC_ASSERT_OK(tc_comm_abort(c));
  TC_ASSERT_ERR(tc_all_reduce(c, &x, 1, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL),
                TC_ERR_ABORTED, "aborted (reconfigure it into a new group, or create a new one)");
  o.uuid = 9;
  TC_ASSERT_OK(tc_comm_reconfigure(c, &o, NULL));
  check_sum(c);
  /* finalize ends it: no endpoint, no reconfigure */
  TC_ASSERT_OK(tc_comm_finalize(c));
  o.uuid = 10;
  TC_ASSERT_ERR(tc_comm_reconfigure(c, &o, NULL), TC_ERR_INVALID_USAGE, "finalized");
  TC_ASSERT_ERR(tc_comm_get_init_handle(c, h, sizeof h), TC_ERR_INVALID_USAGE,
                "no endpoint any more");
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(reconfig_epoch_checks) {
  /* a message header of another epoch is reported, never taken as data */
  unsigned char h[16];
  uint32_t magic = 0x314d4354u, word = TC_XFER_WORD(TC_XFER_DATA, 0x1234);
  uint64_t len = 8;
  memcpy(h, &magic, 4);
  memcpy(h + 4, &word, 4);
  memcpy(h + 8, &len, 8);
  tc_xfer_t x = tc__xfer_recv(3, NULL, 8);
  char why[256];
  TC_ASSERT_EQ(tc__xfer_hdr_problem((const char *)h, magic, 0x1234, &x, "all_reduce", why,
                                    sizeof why), 0);
  TC_ASSERT_EQ(tc__xfer_hdr_problem((const char *)h, magic, 0x99991235, &x, "all_reduce",
                                    why, sizeof why), 1);
  TC_ASSERT_CONTAINS(why, "peer 3 sent a message of another configuration of this "
                          "communicator (epoch 001234, this one is 991235): a late message "
                          "of a dead epoch, dropped unread");
  /* a hello of another epoch is refused */
  unsigned char tok[16] = "0123456789abcde", hello[TC__TCP_HELLO_BYTES];
  tc__tcp_put_hello(hello, 1, 4, 77, tok);
  const char *reason = NULL;
  TC_ASSERT_EQ(tc__tcp_parse_hello(hello, sizeof hello, 4, 77, tok, &reason), 1);
  TC_ASSERT_EQ(tc__tcp_parse_hello(hello, sizeof hello, 4, 78, tok, &reason), -1);
  TC_ASSERT_CONTAINS(reason, "another configuration (epoch)");
}

/* ---- abort from another thread stops a reconfigure ---- */

typedef struct {
  tc_comm_t *c;
  char hs[2][TC_INIT_HANDLE_MAX];
  int rc;
  double took;
  _Atomic int done;
} abort_arg_t;

static void *reconfigure_thread(void *p) {
  abort_arg_t *a = p;
  double t0 = tc__now();
  a->rc = reconfigure(a->c, 21, a->hs, 2, 30); /* the other member never comes */
  a->took = tc__now() - t0;
  a->done = 1;
  return NULL;
}

TC_TEST(reconfig_abort_from_another_thread) {
  abort_arg_t a = {.c = rc_comm("ftabort", 30)};
  tc_comm_t *absent = rc_comm("absent", 30); /* alive, but never reconfigures */
  TC_ASSERT_OK(tc_comm_get_init_handle(a.c, a.hs[0], sizeof a.hs[0]));
  TC_ASSERT_OK(tc_comm_get_init_handle(absent, a.hs[1], sizeof a.hs[1]));
  pthread_t t;
  TC_ASSERT(pthread_create(&t, NULL, reconfigure_thread, &a) == 0);
  double dl = tc__now() + 20;
  while (!a.done && tc__now() < dl) { /* abort (idempotent) until it gives up */
    TC_ASSERT_OK(tc_comm_abort(a.c));
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  pthread_join(t, NULL);
  TC_ASSERT_EQ(a.rc, TC_ERR_ABORTED);
  TC_ASSERT(a.took < 5);
  TC_ASSERT_EQ(tc_comm_is_aborted(a.c), 1);
  /* and it can be reconfigured afterwards */
  TC_ASSERT_OK(reconfigure(a.c, 22, a.hs, 1, 10));
  check_sum(a.c);
  TC_ASSERT_OK(tc_comm_destroy(a.c));
  TC_ASSERT_OK(tc_comm_destroy(absent));
}

/* ---- kill, shrink, grow ---- */

#define KILL_N 4 /* members; process KILL_N is the replacement */
#define VICTIM 2

static void kill_rank(tc_ctx_t *ctx) {
  rc_shared_t *sh = ctx->arg;
  int threads0 = count_dir("/proc/self/task", NULL), fds0 = count_dir("/proc/self/fd", NULL);
  tc_store_t *s = tc_ctx_store(ctx);
  char hs[KILL_N][TC_INIT_HANDLE_MAX];
  if (ctx->rank == KILL_N) { /* the replacement: joins once the survivors shrank */
    tc_wait_flag(&sh->shrunk, KILL_N - 1, 60);
    tc_comm_t *c = rc_comm("ft", 30);
    exchange(s, c, "g3", KILL_N - 1, KILL_N, hs);
    TC_ASSERT_OK(reconfigure(c, 3, hs, KILL_N, 30));
    TC_ASSERT_EQ(tc_comm_rank(c), KILL_N - 1);
    check_sum(c);
    TC_ASSERT_OK(tc_comm_finalize(c));
    TC_ASSERT_OK(tc_comm_destroy(c));
    tc_store_release(s);
    return;
  }
  tc_comm_t *c = rc_comm("ft", 30);
  exchange(s, c, "g1", ctx->rank, KILL_N, hs);
  TC_ASSERT_OK(reconfigure(c, 1, hs, KILL_N, 30));
  TC_ASSERT_EQ(tc_comm_rank(c), ctx->rank);
  TC_ASSERT_EQ(tc_comm_size(c), KILL_N);
  check_sum(c);
  /* the victim dies in the middle of a loop of large all_reduces */
  size_t count = 1 << 18;
  float *buf = tc_xmalloc(count * sizeof *buf);
  int rc = TC_OK;
  for (int it = 0; rc == TC_OK; it++) {
    if (ctx->rank == VICTIM && it == 5) {
      sh->kill_time = tc__now();
      raise(SIGKILL);
    }
    for (size_t i = 0; i < count; i++) buf[i] = 1.0f;
    rc = tc_all_reduce(c, buf, count, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL);
    if (rc == TC_OK) TC_ASSERT_DBL_NEAR(buf[count - 1], KILL_N, 0);
    TC_ASSERT(it < 100000);
  }
  TC_ASSERT_EQ(rc, TC_ERR_REMOTE);
  /* the first survivor to fail names the victim; one failing after a faster
   * survivor aborted may name that one (checked: some survivor names it) */
  if (strstr(tc_last_error(), "peer 2")) sh->named_victim++;
  TC_ASSERT_OK(tc_comm_abort(c));
  /* survivors shrink: the list of the three, in their old order */
  int slot = ctx->rank < VICTIM ? ctx->rank : ctx->rank - 1;
  exchange(s, c, "g2", slot, KILL_N - 1, hs);
  TC_ASSERT_OK(reconfigure(c, 2, hs, KILL_N - 1, 30));
  TC_ASSERT_EQ(tc_comm_rank(c), slot);
  TC_ASSERT_EQ(tc_comm_size(c), KILL_N - 1);
  check_sum(c);
  double resumed = tc__now() - sh->kill_time;
  if (resumed > sh->resume_max) sh->resume_max = resumed;
  for (int it = 0; it < 3; it++) { /* large ones too, over the new connections */
    for (size_t i = 0; i < count; i++) buf[i] = 2.0f;
    TC_ASSERT_OK(tc_all_reduce(c, buf, count, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL));
    TC_ASSERT_DBL_NEAR(buf[0], 2.0 * (KILL_N - 1), 0);
    TC_ASSERT_DBL_NEAR(buf[count - 1], 2.0 * (KILL_N - 1), 0);
  }
  sh->shrunk++;
  /* grow back: the survivors keep their slots, the replacement takes the last */
  exchange(s, c, "g3", slot, KILL_N, hs);
  TC_ASSERT_OK(reconfigure(c, 3, hs, KILL_N, 30));
  TC_ASSERT_EQ(tc_comm_rank(c), slot);
  TC_ASSERT_EQ(tc_comm_size(c), KILL_N);
  check_sum(c);
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
  free(buf);
  tc_store_release(s);
  /* nothing left: the progress threads joined, the sockets closed */
#ifndef __SANITIZE_THREAD__ /* TSan starts a thread of its own on the way */
  TC_ASSERT_EQ(count_dir("/proc/self/task", NULL), threads0);
#else
  (void)threads0;
#endif
  TC_ASSERT_EQ(count_dir("/proc/self/fd", NULL), fds0);
}

TC_TEST(reconfig_kill_shrink_grow) {
  rc_shared_t *sh = rc_shared_new();
  int shm0 = count_dir("/dev/shm", "torchcomms");
  int st[KILL_N + 1];
  tc_spawn_status(KILL_N + 1, kill_rank, sh, 120, st);
  for (int r = 0; r <= KILL_N; r++) {
    if (r == VICTIM) {
      TC_ASSERT(WIFSIGNALED(st[r]) && WTERMSIG(st[r]) == SIGKILL);
    } else {
      if (!WIFEXITED(st[r]) || WEXITSTATUS(st[r]) != 0)
        tc_test_fail(__FILE__, __LINE__, "process %d failed (status 0x%x)", r, st[r]);
    }
  }
  printf("kill -> first all_reduce of the shrunk group: %.3f s (slowest survivor)\n",
         sh->resume_max);
  TC_ASSERT(sh->resume_max > 0 && sh->resume_max < 10);
  TC_ASSERT(sh->named_victim >= 1);
  /* nothing of any configuration is left in /dev/shm (segments are
   * unlinked once every rank mapped them; the victim's too) */
  TC_ASSERT_EQ(count_dir("/dev/shm", "torchcomms"), shm0);
}

/* ---- split brain ---- */

static void brain_rank(tc_ctx_t *ctx) {
  tc_store_t *s = tc_ctx_store(ctx);
  tc_comm_t *c = rc_comm("ft", 30);
  char hs[4][TC_INIT_HANDLE_MAX];
  exchange(s, c, "b", ctx->rank, 4, hs);
  /* 1: the same uuid, different lists. {0, 1} want [h0, h1, h2]; {2, 3}
   * want [h2, h3]. Rank 2 is in both lists but calls with the second: the
   * first group sees that and fails; the second forms. */
  int rc;
  double t0 = tc__now();
  if (ctx->rank < 2) {
    rc = reconfigure(c, 5, hs, 3, 5);
    TC_ASSERT_EQ(rc, TC_ERR_PROTOCOL);
    TC_ASSERT_CONTAINS(tc_last_error(), "reconfigures with uuid 5 into a different group");
    TC_ASSERT_CONTAINS(tc_last_error(), hs[2]);
    TC_ASSERT_EQ(tc_comm_size(c), 0); /* left unconfigured */
  } else {
    TC_ASSERT_OK(reconfigure(c, 5, hs + 2, 2, 10));
    TC_ASSERT_EQ(tc_comm_size(c), 2);
    check_sum(c);
    TC_ASSERT_OK(tc_comm_abort(c));
  }
  TC_ASSERT(tc__now() - t0 < 10);
  /* 2: the same list, different uuids: never one group; each side names the
   * members it could not meet (reconfiguring with the other uuid, or, for a
   * side that gave up a moment later, no longer reconfiguring) */
  gate(s, "two", 4);
  int64_t uuid = ctx->rank < 2 ? 6 : 7;
  t0 = tc__now();
  rc = reconfigure(c, uuid, hs, 4, 1.0);
  double dt = tc__now() - t0;
  TC_ASSERT_EQ(rc, TC_ERR_TIMEOUT);
  TC_ASSERT_CONTAINS(tc_last_error(), "waiting for 2 of 4 members: ");
  TC_ASSERT_CONTAINS(tc_last_error(), ") alive, but ");
  TC_ASSERT(dt < 4.0);
  /* 3: then all four agree and form one group */
  gate(s, "three", 4);
  TC_ASSERT_OK(reconfigure(c, 8, hs, 4, 30));
  TC_ASSERT_EQ(tc_comm_rank(c), ctx->rank);
  check_sum(c);
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
  tc_store_release(s);
}

TC_TEST(reconfig_split_brain) { tc_spawn(4, brain_rank, NULL, 120); }

/* ---- a handle of a dead process ---- */

static void dead_rank(tc_ctx_t *ctx) {
  rc_shared_t *sh = ctx->arg;
  tc_store_t *s = tc_ctx_store(ctx);
  tc_comm_t *c = rc_comm("ft", 30);
  char hs[3][TC_INIT_HANDLE_MAX];
  exchange(s, c, "d", ctx->rank, 3, hs);
  if (ctx->rank == 2) { /* publishes its handle, then dies */
    sh->done = 1;
    raise(SIGKILL);
  }
  tc_wait_flag(&sh->done, 1, 30);
  double t0 = tc__now();
  int rc = reconfigure(c, 11, hs, 3, 1.5);
  double dt = tc__now() - t0;
  TC_ASSERT_EQ(rc, TC_ERR_TIMEOUT);
  TC_ASSERT_CONTAINS(tc_last_error(), "waiting for 1 of 3 members: ");
  TC_ASSERT_CONTAINS(tc_last_error(), hs[2]);
  TC_ASSERT_CONTAINS(tc_last_error(), "(rank 2) unreachable (its endpoint does not answer");
  TC_ASSERT(dt >= 1.4 && dt < 4.0);
  /* a dead rank 0 (the meeting point): named as unreachable too */
  char rev[3][TC_INIT_HANDLE_MAX];
  memcpy(rev[0], hs[2], sizeof rev[0]);
  memcpy(rev[1], hs[0], sizeof rev[1]);
  memcpy(rev[2], hs[1], sizeof rev[2]);
  t0 = tc__now();
  rc = reconfigure(c, 12, rev, 3, 1.5);
  dt = tc__now() - t0;
  TC_ASSERT(rc != TC_OK);
  TC_ASSERT_CONTAINS(tc_last_error(), "could not reach rank 0's endpoint");
  TC_ASSERT_CONTAINS(tc_last_error(), hs[2]);
  TC_ASSERT(dt < 4.0);
  /* then the two form a group without it */
  TC_ASSERT_OK(reconfigure(c, 13, hs, 2, 30));
  check_sum(c);
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
  tc_store_release(s);
}

TC_TEST(reconfig_dead_handle) {
  rc_shared_t *sh = rc_shared_new();
  int st[3];
  tc_spawn_status(3, dead_rank, sh, 60, st);
  TC_ASSERT(WIFSIGNALED(st[2]));
  for (int r = 0; r < 2; r++)
    if (!WIFEXITED(st[r]) || WEXITSTATUS(st[r]) != 0)
      tc_test_fail(__FILE__, __LINE__, "process %d failed (status 0x%x)", r, st[r]);
}

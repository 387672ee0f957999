/* test_window.c -- one-sided windows (tc_window_*), over the real transports
 * (the suite runs once on shared memory and once forced onto TCP) with real
 * processes: every rank puts into every other rank's window at random
 * offsets and sizes, signals, waits, reads back with get and through the
 * mapping; library memory and the caller's own buffer; asynchronous waits;
 * misuse refused before any byte moves; a dead peer fails the waits on it
 * at once; nothing is left in /dev/shm. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include "coll_util.h"
#include "transport/shm_internal.h"

#define WIN_CHUNK 4096u

/* Names in /dev/shm of this transport whose creator is dead: what a test's
 * ranks (all exited when it is called) left behind. Other jobs' live
 * segments on a shared machine do not count. */
static int shm_names(void) {
  DIR *d = opendir("/dev/shm");
  int n = 0;
  struct dirent *e;
  while (d && (e = readdir(d))) {
    tc_shm_owner_t o;
    if (strncmp(e->d_name, "torchcomms", 10) || tc__shm_name_owner(e->d_name, &o) != 0) continue;
    if (kill(o.pid, 0) != 0 && errno == ESRCH) n++;
  }
  if (d) closedir(d);
  return n;
}

static unsigned char pat(int origin, int target, size_t i, int round) {
  return (unsigned char)(origin * 31 + target * 7 + (int)i * 13 + round * 101 + 1);
}

/* A region [off, off + len) of origin r's chunk in target q's window,
 * random but the same on every rank. */
static void region(int r, int q, int round, size_t *off, size_t *len) {
  unsigned s = (unsigned)(r * 7919 + q * 104729 + round * 1299709) * 2654435761u;
  *off = (s >> 8) % (WIN_CHUNK / 2);
  *len = 1 + (s >> 20) % (WIN_CHUNK / 2);
}

typedef struct { int user; int rounds; } all_pairs_arg_t;

static void all_pairs_rank(tc_ctx_t *ctx) {
  all_pairs_arg_t *a = ctx->arg;
  tc_comm_t *c = tc_ctx_comm(ctx, "win", NULL);
  int n = ctx->size, me = ctx->rank;
  size_t bytes = (size_t)n * WIN_CHUNK;
  unsigned char *ubuf = a->user ? tc_xmalloc(bytes) : NULL;
  if (ubuf) memset(ubuf, 0, bytes);
  tc_window_t *w = NULL;
  TC_ASSERT_OK(tc_window_create(c, ubuf, bytes, NULL, &w));
  unsigned char *mem = tc_window_base(w);
  TC_ASSERT(mem != NULL);
  if (ubuf) TC_ASSERT(mem == ubuf);
  for (int q = 0; q < n; q++) {
    size_t sz = 0;
    TC_ASSERT_OK(tc_window_size(w, q, &sz));
    TC_ASSERT_EQ(sz, bytes);
  }
  unsigned char src[WIN_CHUNK], got[WIN_CHUNK];
  for (int round = 0; round < a->rounds; round++) {
    for (int q = 0; q < n; q++) { /* every rank into every rank, itself included */
      size_t off, len;
      region(me, q, round, &off, &len);
      for (size_t i = 0; i < len; i++) src[i] = pat(me, q, i, round);
      tc_work_t *wk = NULL;
      TC_ASSERT_OK(tc_window_put(w, src, len, q, (size_t)me * WIN_CHUNK + off, NULL,
                                 round % 2 ? &wk : NULL));
      if (wk) {
        TC_ASSERT_OK(tc_work_wait(wk));
        tc_work_release(wk);
      }
      TC_ASSERT_OK(tc_window_signal(w, q, NULL, NULL));
    }
    for (int p = 0; p < n; p++) TC_ASSERT_OK(tc_window_wait_signal(w, p, NULL, NULL));
    for (int p = 0; p < n; p++) { /* what each origin put here is here */
      size_t off, len;
      region(p, me, round, &off, &len);
      for (size_t i = 0; i < len; i++)
        if (mem[(size_t)p * WIN_CHUNK + off + i] != pat(p, me, i, round))
          TC_ASSERT_EQ(mem[(size_t)p * WIN_CHUNK + off + i], pat(p, me, i, round));
    }
    for (int q = 0; q < n; q++) { /* and get reads back what this rank put there */
      size_t off, len;
      region(me, q, round, &off, &len);
      TC_ASSERT_OK(tc_window_get(w, got, len, q, (size_t)me * WIN_CHUNK + off, NULL, NULL));
      for (size_t i = 0; i < len; i++)
        if (got[i] != pat(me, q, i, round)) TC_ASSERT_EQ(got[i], pat(me, q, i, round));
    }
    TC_ASSERT_OK(tc_barrier(c, NULL, NULL)); /* nobody overwrites before all checked */
  }
  /* the mapping: on shared memory with library memory every window is
   * mapped here; otherwise only the own one */
  int shm = !getenv("TORCHCOMMS_CPU_TRANSPORT") || strcmp(getenv("TORCHCOMMS_CPU_TRANSPORT"), "tcp");
  for (int q = 0; q < n; q++) {
    void *p = NULL;
    tc_win_access_t acc;
    TC_ASSERT_OK(tc_window_access(w, q, &acc));
    int mapped = q == me ? !a->user : (shm && !a->user);
    if (q == me) TC_ASSERT_EQ(acc, TC_WIN_ACCESS_UNIFIED);
    else TC_ASSERT_EQ(acc, mapped ? TC_WIN_ACCESS_UNIFIED : TC_WIN_ACCESS_SEPARATE);
    int rc = tc_window_map(w, q, &p);
    if (mapped || q == me) {
      if (q == me && a->user) {
        TC_ASSERT_EQ(rc, TC_OK); /* own memory: the caller's buffer */
        TC_ASSERT(p == ubuf);
        continue;
      }
      TC_ASSERT_EQ(rc, TC_OK);
      size_t off, len;
      region(me, q, a->rounds - 1, &off, &len);
      for (size_t i = 0; i < len; i++)
        TC_ASSERT_EQ(((unsigned char *)p)[(size_t)me * WIN_CHUNK + off + i],
                     pat(me, q, i, a->rounds - 1));
    } else {
      TC_ASSERT_ERR(rc, TC_ERR_NOT_SUPPORTED, "put and get");
    }
  }
  TC_ASSERT_OK(tc_window_flush(w, -1, NULL, NULL));
  /* fence: a put before it is visible everywhere after it, no signal */
  int64_t v = 5000 + me;
  TC_ASSERT_OK(tc_window_put(w, &v, sizeof v, (me + 1) % n, (size_t)me * WIN_CHUNK, NULL, NULL));
  TC_ASSERT_OK(tc_window_fence(w, NULL));
  int prev = (me - 1 + n) % n;
  int64_t got64;
  memcpy(&got64, mem + (size_t)prev * WIN_CHUNK, sizeof got64);
  TC_ASSERT_EQ(got64, 5000 + prev);
  TC_ASSERT_OK(tc_window_free(w));
  TC_ASSERT_OK(tc_comm_finalize(c));
  tc_comm_destroy(c);
  free(ubuf);
}

static void all_pairs(int n, int user) {
  int before = shm_names();
  all_pairs_arg_t a = {user, 4};
  tc_spawn(n, all_pairs_rank, &a, 120);
  TC_ASSERT_EQ(shm_names(), before);
}

TC_TEST(window_all_pairs_2) { all_pairs(2, 0); }
TC_TEST(window_all_pairs_3) { all_pairs(3, 0); }
TC_TEST(window_all_pairs_4) { all_pairs(4, 0); }
TC_TEST(window_all_pairs_8) { all_pairs(8, 0); }
TC_TEST(window_all_pairs_user_buffer_3) { all_pairs(3, 1); }

/* An asynchronous wait_signal returns at once; its work completes when the
 * signal arrives; is_completed looks without waiting. */
static void async_rank(tc_ctx_t *ctx) {
  tc_comm_t *c = tc_ctx_comm(ctx, "win", NULL);
  int peer = 1 - ctx->rank;
  tc_window_t *w = NULL;
  TC_ASSERT_OK(tc_window_create(c, NULL, 64, NULL, &w));
  for (int i = 0; i < 50; i++) {
    tc_work_t *wk = NULL;
    TC_ASSERT_OK(tc_window_wait_signal(w, peer, NULL, &wk));
    int64_t v = 1000 * ctx->rank + i;
    TC_ASSERT_OK(tc_window_put(w, &v, sizeof v, peer, 0, NULL, NULL));
    TC_ASSERT_OK(tc_window_signal(w, peer, NULL, NULL));
    TC_ASSERT_OK(tc_work_wait(wk));
    TC_ASSERT_EQ(tc_work_status(wk), TC_WORK_COMPLETED);
    tc_work_release(wk);
    int64_t got;
    memcpy(&got, tc_window_base(w), sizeof got);
    TC_ASSERT_EQ(got, 1000 * peer + i);
    TC_ASSERT_OK(tc_barrier(c, NULL, NULL));
  }
  /* a wait with nothing coming: not done, then times out with its reason */
  tc_op_options_t o = TC_OP_OPTIONS_INIT;
  o.timeout_s = 0.3;
  tc_work_t *wk = NULL;
  TC_ASSERT_OK(tc_window_wait_signal(w, peer, &o, &wk));
  int done = 1;
  TC_ASSERT_OK(tc_work_test(wk, &done));
  TC_ASSERT_EQ(done, 0);
  TC_ASSERT_ERR(tc_work_wait(wk), TC_ERR_TIMEOUT, "waiting for a signal from peer");
  tc_work_release(wk);
  TC_ASSERT_ERR(tc_window_wait_signal(w, peer, &o, NULL), TC_ERR_TIMEOUT, "wait_signal on 'win'");
  TC_ASSERT_OK(tc_window_free(w));
  TC_ASSERT_OK(tc_comm_finalize(c));
  tc_comm_destroy(c);
}

TC_TEST(window_async_wait_and_timeout) { tc_spawn(2, async_rank, NULL, 60); }

/* Misuse is refused before any byte moves, with the argument named. */
static void misuse_rank(tc_ctx_t *ctx) {
  tc_comm_t *c = tc_ctx_comm(ctx, "win", NULL);
  int peer = 1 - ctx->rank;
  tc_window_t *w = NULL;
  TC_ASSERT_ERR(tc_window_create(c, NULL, 64, NULL, NULL), TC_ERR_INVALID_ARGUMENT, "'win' is NULL");
  size_t mine = ctx->rank == 0 ? 128 : 256; /* sizes may differ */
  TC_ASSERT_OK(tc_window_create(c, NULL, mine, NULL, &w));
  size_t theirs = 0;
  TC_ASSERT_OK(tc_window_size(w, peer, &theirs));
  TC_ASSERT_EQ(theirs, ctx->rank == 0 ? 256u : 128u);
  char buf[512] = {0};
  TC_ASSERT_ERR(tc_window_put(w, buf, theirs + 1, peer, 0, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                "go beyond rank");
  TC_ASSERT_ERR(tc_window_put(w, buf, 8, peer, theirs - 7, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                "nothing was written");
  TC_ASSERT_ERR(tc_window_get(w, buf, 1, peer, SIZE_MAX, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                "nothing was read");
  TC_ASSERT_ERR(tc_window_put(w, NULL, 8, peer, 0, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                "'src' is NULL");
  TC_ASSERT_ERR(tc_window_put(w, buf, 8, 2, 0, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                "argument 'peer' = 2 is out of range [0, 2)");
  TC_ASSERT_ERR(tc_window_signal(w, -1, NULL, NULL), TC_ERR_INVALID_ARGUMENT, "'peer' = -1");
  TC_ASSERT_ERR(tc_window_flush(w, 5, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                "[-1 (every peer) or 0, 2)");
  /* nothing moved: the peer's window is still zero */
  TC_ASSERT_OK(tc_barrier(c, NULL, NULL));
  const unsigned char *m = tc_window_base(w);
  for (size_t i = 0; i < mine; i++) TC_ASSERT_EQ(m[i], 0);
  TC_ASSERT_OK(tc_window_free(w));
  TC_ASSERT_ERR(tc_window_put(w, buf, 1, peer, 0, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                "already freed");
  TC_ASSERT_ERR(tc_window_free(w), TC_ERR_INVALID_ARGUMENT, "already freed");
  /* windows of an aborted communicator fail their operations clearly */
  TC_ASSERT_OK(tc_window_create(c, NULL, 64, NULL, &w));
  TC_ASSERT_OK(tc_comm_abort(c));
  TC_ASSERT_ERR(tc_window_signal(w, peer, NULL, NULL), TC_ERR_INVALID_USAGE,
                "its communicator was aborted");
  TC_ASSERT_OK(tc_window_free(w));
  tc_comm_destroy(c);
}

TC_TEST(window_misuse) { tc_spawn(2, misuse_rank, NULL, 60); }

/* A peer killed while the others wait for its signal: they fail at once
 * (not at the timeout) with the dead-peer error naming it; puts to it fail
 * too; nothing is left in /dev/shm. */
static void dead_rank(tc_ctx_t *ctx) {
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.timeout_s = 30;
  tc_comm_t *c = tc_ctx_comm(ctx, "win", &o);
  tc_window_t *w = NULL;
  TC_ASSERT_OK(tc_window_create(c, NULL, 1 << 20, NULL, &w));
  /* rank 2 dies only once the others have passed the barrier and are at
   * the calls under test (each tells it so with a signal): the test does
   * not depend on how far the barrier got when it died */
  TC_ASSERT_OK(tc_barrier(c, NULL, NULL));
  if (ctx->rank == 2) {
    TC_ASSERT_OK(tc_window_wait_signal(w, 0, NULL, NULL));
    TC_ASSERT_OK(tc_window_wait_signal(w, 1, NULL, NULL));
    raise(SIGKILL);
  }
  TC_ASSERT_OK(tc_window_signal(w, 2, NULL, NULL));
  double t0 = tc__now();
  TC_ASSERT_ERR(tc_window_wait_signal(w, 2, NULL, NULL), TC_ERR_REMOTE, "peer 2");
  TC_ASSERT(tc__now() - t0 < 5.0);
  TC_ASSERT_CONTAINS(tc_last_error(), "wait_signal on 'win'");
  static char big[1 << 20];
  TC_ASSERT_ERR(tc_window_put(w, big, sizeof big, 2, 0, NULL, NULL), TC_ERR_REMOTE, "peer 2");
  TC_ASSERT_OK(tc_comm_abort(c));
  TC_ASSERT_OK(tc_window_free(w));
  tc_comm_destroy(c);
}

TC_TEST(window_dead_peer) {
  int before = shm_names();
  int st[3];
  tc_spawn_status(3, dead_rank, NULL, 60, st);
  TC_ASSERT(WIFSIGNALED(st[2]) && WTERMSIG(st[2]) == SIGKILL);
  TC_ASSERT(WIFEXITED(st[0]) && WEXITSTATUS(st[0]) == 0);
  TC_ASSERT(WIFEXITED(st[1]) && WEXITSTATUS(st[1]) == 0);
  TC_ASSERT_EQ(shm_names(), before);
}

/* Memory held with tc_window_map_ref outlives the window. */
static void hold_rank(tc_ctx_t *ctx) {
  tc_comm_t *c = tc_ctx_comm(ctx, "win", NULL);
  tc_window_t *w = NULL;
  TC_ASSERT_OK(tc_window_create(c, NULL, 4096, NULL, &w));
  int64_t v = 77 + ctx->rank;
  TC_ASSERT_OK(tc_window_put(w, &v, sizeof v, ctx->rank, 8, NULL, NULL));
  void *own = NULL;
  TC_ASSERT_OK(tc_window_map_ref(w, ctx->rank, &own));
  TC_ASSERT_OK(tc_window_free(w));
  int64_t got;
  memcpy(&got, (char *)own + 8, sizeof got);
  TC_ASSERT_EQ(got, 77 + ctx->rank);
  TC_ASSERT_OK(tc_window_map_release(own));
  TC_ASSERT_ERR(tc_window_map_release(own), TC_ERR_INVALID_ARGUMENT, "released twice");
  TC_ASSERT_OK(tc_comm_finalize(c));
  tc_comm_destroy(c);
}

TC_TEST(window_map_ref_outlives_free) { tc_spawn(2, hold_rank, NULL, 60); }

/* Large puts and gets (split between the caller and the window's copy
 * helper above 8 MiB): every byte where it belongs, both directions. */
static void large_rank(tc_ctx_t *ctx) {
  tc_comm_t *c = tc_ctx_comm(ctx, "win", NULL);
  int peer = 1 - ctx->rank;
  size_t n = ((size_t)24 << 20) + 4099; /* not a multiple of the pieces */
  tc_window_t *w = NULL;
  TC_ASSERT_OK(tc_window_create(c, NULL, n + 64, NULL, &w));
  unsigned char *src = tc_xmalloc(n), *got = tc_xmalloc(n);
  for (size_t i = 0; i < n; i++) src[i] = (unsigned char)(i * 7 + ctx->rank * 3 + (i >> 20));
  TC_ASSERT_OK(tc_window_put(w, src, n, peer, 64, NULL, NULL));
  TC_ASSERT_OK(tc_window_signal(w, peer, NULL, NULL));
  TC_ASSERT_OK(tc_window_wait_signal(w, peer, NULL, NULL));
  const unsigned char *mem = tc_window_base(w);
  for (size_t i = 0; i < n; i++)
    if (mem[64 + i] != (unsigned char)(i * 7 + peer * 3 + (i >> 20)))
      TC_ASSERT_EQ(mem[64 + i], (unsigned char)(i * 7 + peer * 3 + (i >> 20)));
  TC_ASSERT_OK(tc_window_get(w, got, n, peer, 64, NULL, NULL));
  TC_ASSERT(memcmp(got, src, n) == 0);
  TC_ASSERT_OK(tc_window_free(w));
  free(src);
  free(got);
  TC_ASSERT_OK(tc_comm_finalize(c));
  tc_comm_destroy(c);
}

TC_TEST(window_large_put_get) { tc_spawn(2, large_rank, NULL, 120); }

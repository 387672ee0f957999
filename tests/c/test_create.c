/* test_create.c -- creation is all-or-nothing, and dropping a communicator
 * without finalize never fails another rank's creation or an operation the
 * dropping rank had completed (issue 10, point 4).
 *
 * Every rank loops: create, (optionally) one all_reduce, destroy without
 * finalize, as fast as it can, so one rank routinely drops the communicator
 * while the others are still inside creation (or the operation). Failures are
 * counted per rank in a shared mapping and must be zero. TC_CREATE_ROUNDS
 * sets the number of rounds (default 200). The transport comes from the test
 * name (shm, tcp), set before any communicator exists. */
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <sys/mman.h>

#include "coll_util.h"

typedef struct {
  const char *transport; /* "shm" or "tcp" */
  int with_op;           /* one all_reduce between create and drop: 1 small, 2 1 MiB */
  int rounds;
  _Atomic int failures;
  _Atomic int completed; /* rounds completed, all ranks */
  char first[1024];      /* the first failure's message */
  _Atomic int first_set;
} create_shared_t;

static create_shared_t *create_shared(const char *tp, int with_op) {
  create_shared_t *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE,
                            MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  TC_ASSERT(s != MAP_FAILED);
  memset(s, 0, sizeof *s);
  s->transport = tp;
  s->with_op = with_op;
  const char *v = getenv("TC_CREATE_ROUNDS");
  s->rounds = v && atoi(v) > 0 ? atoi(v) : 200;
  if (with_op == 2) s->rounds = s->rounds / 4 > 0 ? s->rounds / 4 : 1;
  return s;
}

static void create_note(create_shared_t *sh, int rank, int round, const char *what) {
  sh->failures++;
  if (atomic_exchange(&sh->first_set, 1) == 0)
    snprintf(sh->first, sizeof sh->first, "rank %d round %d: %s: %s", rank, round,
             what, tc_last_error());
}

static void create_drop_rank(tc_ctx_t *ctx) {
  create_shared_t *sh = ctx->arg;
  setenv("TORCHCOMMS_CPU_TRANSPORT", sh->transport, 1);
  tc_store_t *store = tc_ctx_store(ctx);
  int32_t *v = tc_xmalloc(256 * 1024 * sizeof *v);
  for (int round = 0; round < sh->rounds; round++) {
    tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
    o.rank = ctx->rank;
    o.world_size = ctx->size;
    o.name = "drop";
    o.store = store;
    o.timeout_s = 20;
    tc_comm_t *c = NULL;
    if (tc_comm_create("cpu", "cpu", &o, &c) != TC_OK) {
      create_note(sh, ctx->rank, round, "create");
      continue; /* the next round uses a fresh store prefix: go on */
    }
    if (sh->with_op) { /* 1 element, or 1 MiB (TCP: data still in flight at the drop) */
      size_t count = sh->with_op == 1 ? 1 : 256 * 1024;
      for (size_t i = 0; i < count; i++) v[i] = ctx->rank + 1 + (int32_t)(i % 7);
      if (tc_all_reduce(c, v, count, TC_INT32, TC_OP(TC_SUM), NULL, NULL) != TC_OK)
        create_note(sh, ctx->rank, round, "all_reduce");
      else
        for (size_t i = 0; i < count; i++)
          if (v[i] != ctx->size * (ctx->size + 1) / 2 + ctx->size * (int32_t)(i % 7)) {
            create_note(sh, ctx->rank, round, "all_reduce result");
            break;
          }
    }
    TC_ASSERT_OK(tc_comm_destroy(c)); /* no finalize: the peers may still be busy */
    sh->completed++;
  }
  free(v);
  tc_store_release(store);
}

static void create_drop(int n, const char *tp, int with_op) {
  create_shared_t *sh = create_shared(tp, with_op);
  tc_spawn(n, create_drop_rank, sh, 110);
  if (sh->failures)
    tc_test_fail(__FILE__, __LINE__, "%d of %d creations%s failed at %d ranks over %s; "
                 "first: %s", (int)sh->failures, n * sh->rounds,
                 with_op ? " (+ all_reduce)" : "", n, tp, sh->first);
  TC_ASSERT_EQ(sh->completed, n * sh->rounds);
  munmap(sh, sizeof *sh);
}

TC_TEST(create_drop_shm_w2) { create_drop(2, "shm", 0); }
TC_TEST(create_drop_shm_w3) { create_drop(3, "shm", 0); }
TC_TEST(create_drop_shm_w4) { create_drop(4, "shm", 0); }
TC_TEST(create_drop_tcp_w2) { create_drop(2, "tcp", 0); }
TC_TEST(create_drop_tcp_w3) { create_drop(3, "tcp", 0); }
TC_TEST(create_drop_tcp_w4) { create_drop(4, "tcp", 0); }
TC_TEST(create_op_drop_shm_w4) { create_drop(4, "shm", 1); }
TC_TEST(create_op_drop_tcp_w4) { create_drop(4, "tcp", 1); }
TC_TEST(create_bigop_drop_shm_w4) { create_drop(4, "shm", 2); }
TC_TEST(create_bigop_drop_tcp_w4) { create_drop(4, "tcp", 2); }

/* ---- split: the same for communicators made by tc_comm_split ---- */

static void split_drop_rank(tc_ctx_t *ctx) {
  create_shared_t *sh = ctx->arg;
  setenv("TORCHCOMMS_CPU_TRANSPORT", sh->transport, 1);
  tc_comm_t *parent = tc_ctx_comm(ctx, "splitparent", NULL);
  int all[4] = {0, 1, 2, 3};
  for (int round = 0; round < sh->rounds; round++) {
    tc_comm_t *c = NULL;
    if (tc_comm_split(parent, all, (size_t)ctx->size, "splitchild", NULL, &c) != TC_OK) {
      create_note(sh, ctx->rank, round, "split");
      continue;
    }
    TC_ASSERT_OK(tc_comm_destroy(c)); /* no finalize */
    sh->completed++;
  }
  TC_ASSERT_OK(tc_comm_finalize(parent));
  TC_ASSERT_OK(tc_comm_destroy(parent));
}

static void split_drop(const char *tp) {
  create_shared_t *sh = create_shared(tp, 0);
  sh->rounds = sh->rounds / 2 > 0 ? sh->rounds / 2 : 1;
  tc_spawn(4, split_drop_rank, sh, 110);
  if (sh->failures)
    tc_test_fail(__FILE__, __LINE__, "%d of %d splits failed at 4 ranks over %s; first: %s",
                 (int)sh->failures, 4 * sh->rounds, tp, sh->first);
  TC_ASSERT_EQ(sh->completed, 4 * sh->rounds);
  munmap(sh, sizeof *sh);
}

TC_TEST(create_split_drop_shm_w4) { split_drop("shm"); }
TC_TEST(create_split_drop_tcp_w4) { split_drop("tcp"); }

/* ---- a peer that completed its part and left, while this rank waits on a
 * third: no failure; a peer that left before its part: a prompt failure ---- */

typedef struct {
  const char *transport;
  _Atomic int dropped; /* rank 0 destroyed its communicator */
  _Atomic int result;  /* rank 1's verdict: 1 ok, -1 failed */
  char msg[1024];
} leave_shared_t;

static leave_shared_t *leave_shared(const char *tp) {
  leave_shared_t *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE,
                           MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  TC_ASSERT(s != MAP_FAILED);
  memset(s, 0, sizeof *s);
  s->transport = tp;
  return s;
}

static void wait_int(_Atomic int *v, int want, double timeout_s) {
  double dl = tc__now() + timeout_s;
  while (*v < want) {
    if (tc__now() > dl) tc_test_fail(__FILE__, __LINE__, "condition not reached in %g s", timeout_s);
    struct timespec ts = {0, 200 * 1000};
    nanosleep(&ts, NULL);
  }
}

/* Rank 0 sends to rank 1 and drops the communicator; rank 1, having
 * received, waits on rank 2, which sends only after rank 0 dropped (and a
 * pause that lets rank 1's liveness checks see the hang-up: coverage, not
 * synchronisation; the test passes whatever its length). */
static void drop_after_send_rank(tc_ctx_t *ctx) {
  leave_shared_t *sh = ctx->arg;
  setenv("TORCHCOMMS_CPU_TRANSPORT", sh->transport, 1);
  tc_comm_t *c = tc_ctx_comm(ctx, "dropsend", NULL);
  int32_t v = 0;
  if (ctx->rank == 0) {
    v = 41;
    TC_ASSERT_OK(tc_send(c, &v, 1, TC_INT32, 1, NULL, NULL));
    TC_ASSERT_OK(tc_comm_destroy(c));
    sh->dropped = 1;
    return;
  }
  if (ctx->rank == 2) {
    wait_int(&sh->dropped, 1, 30);
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
    v = 42;
    TC_ASSERT_OK(tc_send(c, &v, 1, TC_INT32, 1, NULL, NULL));
  } else {
    TC_ASSERT_OK(tc_recv(c, &v, 1, TC_INT32, 0, NULL, NULL));
    TC_ASSERT_EQ(v, 41);
    TC_ASSERT_OK(tc_recv(c, &v, 1, TC_INT32, 2, NULL, NULL));
    TC_ASSERT_EQ(v, 42);
  }
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(create_peer_left_after_its_part_shm) {
  tc_spawn(3, drop_after_send_rank, leave_shared("shm"), 60);
}
TC_TEST(create_peer_left_after_its_part_tcp) {
  tc_spawn(3, drop_after_send_rank, leave_shared("tcp"), 60);
}

/* Rank 0 drops the communicator right after creation; rank 1's receive
 * from it fails at once (not at the timeout), naming the peer and why, and
 * so does a finalize. */
static void left_before_part_rank(tc_ctx_t *ctx) {
  leave_shared_t *sh = ctx->arg;
  setenv("TORCHCOMMS_CPU_TRANSPORT", sh->transport, 1);
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.timeout_s = 30;
  tc_comm_t *c = tc_ctx_comm(ctx, "leftearly", &o);
  if (ctx->rank == 0) {
    TC_ASSERT_OK(tc_comm_destroy(c));
    return;
  }
  int32_t v = 0;
  double t0 = tc__now();
  TC_ASSERT_ERR(tc_recv(c, &v, 1, TC_INT32, 0, NULL, NULL), TC_ERR_REMOTE,
                "peer 0 left the communicator (destroyed or aborted it without finalize)");
  TC_ASSERT_CONTAINS(tc_last_error(), "recv on 'leftearly' (rank 1 of 2)");
  TC_ASSERT(tc__now() - t0 < 5);
  TC_ASSERT(tc_comm_finalize(c) != TC_OK);
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(create_peer_left_before_its_part_shm) {
  tc_spawn(2, left_before_part_rank, leave_shared("shm"), 60);
}
TC_TEST(create_peer_left_before_its_part_tcp) {
  tc_spawn(2, left_before_part_rank, leave_shared("tcp"), 60);
}

/* Rank 0 is killed right after its creation returned: creation still
 * succeeds on every other rank (all-or-nothing), and their first operation
 * with it fails promptly. */
static void killed_after_create_rank(tc_ctx_t *ctx) {
  leave_shared_t *sh = ctx->arg;
  setenv("TORCHCOMMS_CPU_TRANSPORT", sh->transport, 1);
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.timeout_s = 30;
  tc_comm_t *c = tc_ctx_comm(ctx, "killedafter", &o); /* asserts success */
  if (ctx->rank == 0) raise(SIGKILL);
  int32_t v = 1;
  double t0 = tc__now();
  int rc = tc_all_reduce(c, &v, 1, TC_INT32, TC_OP(TC_SUM), NULL, NULL);
  TC_ASSERT_EQ(rc, TC_ERR_REMOTE);
  TC_ASSERT_CONTAINS(tc_last_error(), "peer 0");
  TC_ASSERT(tc__now() - t0 < 5);
  TC_ASSERT_OK(tc_comm_destroy(c));
}

static void killed_after_create(const char *tp) {
  int st[3];
  tc_spawn_status(3, killed_after_create_rank, leave_shared(tp), 60, st);
  TC_ASSERT(WIFSIGNALED(st[0]) && WTERMSIG(st[0]) == SIGKILL);
  for (int r = 1; r < 3; r++) {
    TC_ASSERT(WIFEXITED(st[r]));
    TC_ASSERT_EQ(WEXITSTATUS(st[r]), 0);
  }
}

TC_TEST(create_peer_killed_after_create_shm) { killed_after_create("shm"); }
TC_TEST(create_peer_killed_after_create_tcp) { killed_after_create("tcp"); }

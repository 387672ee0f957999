/* test_wait_hooks.c -- tc_op_options_t.wait_release / wait_reacquire (the
 * Python extension keeps the GIL over an operation that does not block,
 * and lets it go before one that does):
 *  - a synchronous all_reduce whose peer is not there yet releases the
 *    caller's lock: rank 1 joins only once rank 0's release hook ran (it
 *    writes to a pipe rank 1 reads), so without the release rank 0 would
 *    wait until its timeout and fail; once released, reacquired once, as
 *    the call returns. Over shared memory (the inline attempt hands the
 *    operation to the backend's thread, the call waits) and over TCP (the
 *    cpu backend runs it inside its post: host->work_blocking);
 *  - an operation that ends inside its call (a world of one) runs neither;
 *  - with a backend that does not report its blocking (no
 *    TC_BACKEND_CAP_BLOCKING_REPORTED), the lock goes for the whole call,
 *    even one that ends at once;
 *  - one hook without the other is TC_ERR_INVALID_ARGUMENT.
 * Run: build/tc_test wait_hooks
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runner.h"
#include "torchcomms_backend.h"

typedef struct {
  int held;     /* the caller's "lock": 1 while held */
  int released; /* calls of each hook */
  int reacquired;
  int signal_fd; /* >= 0: the release writes a byte there */
} lock_t;

static void hook_release(void *arg) {
  lock_t *l = arg;
  if (!l->held) _exit(3); /* released twice: fails the rank */
  l->held = 0;
  l->released++;
  if (l->signal_fd >= 0 && write(l->signal_fd, "r", 1) != 1) _exit(4);
}

static void hook_reacquire(void *arg) {
  lock_t *l = arg;
  if (l->held) _exit(5); /* reacquired without a release */
  l->held = 1;
  l->reacquired++;
}

static tc_op_options_t hooked(lock_t *l) {
  tc_op_options_t o = TC_OP_OPTIONS_INIT;
  o.wait_release = hook_release;
  o.wait_reacquire = hook_reacquire;
  o.wait_arg = l;
  return o;
}

typedef struct {
  int fds[2];
  const char *transport;
} blocked_arg_t;

static void blocked_rank(tc_ctx_t *ctx) {
  blocked_arg_t *a = ctx->arg;
  setenv("TORCHCOMMS_CPU_TRANSPORT", a->transport, 1);
  tc_comm_options_t co = TC_COMM_OPTIONS_INIT;
  co.timeout_s = 20;
  tc_comm_t *c = tc_ctx_comm(ctx, "waithooks", &co);
  float x[4] = {1, 2, 3, (float)ctx->rank};
  if (ctx->rank == 0) {
    lock_t l = {.held = 1, .signal_fd = a->fds[1]};
    tc_op_options_t o = hooked(&l);
    TC_ASSERT_OK(tc_all_reduce(c, x, 4, TC_FLOAT32, TC_OP(TC_SUM), &o, NULL));
    TC_ASSERT_EQ(l.released, 1);
    TC_ASSERT_EQ(l.reacquired, 1);
    TC_ASSERT_EQ(l.held, 1);
  } else {
    /* joins only once rank 0 released its lock inside the call */
    struct pollfd p = {.fd = a->fds[0], .events = POLLIN};
    TC_ASSERT_EQ(poll(&p, 1, 15000), 1);
    char b;
    TC_ASSERT_EQ(read(a->fds[0], &b, 1), 1);
    TC_ASSERT_OK(tc_all_reduce(c, x, 4, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL));
  }
  TC_ASSERT_DBL_NEAR(x[0], 2, 0);
  TC_ASSERT_DBL_NEAR(x[3], 1, 0);
  /* in step now: the same hooks on both ranks, every call in pairs */
  lock_t l = {.held = 1, .signal_fd = -1};
  tc_op_options_t o = hooked(&l);
  for (int i = 0; i < 200; i++)
    TC_ASSERT_OK(tc_all_reduce(c, x, 4, TC_FLOAT32, TC_OP(TC_MAX), &o, NULL));
  TC_ASSERT_EQ(l.released, l.reacquired);
  TC_ASSERT_EQ(l.held, 1);
  TC_ASSERT_DBL_NEAR(x[0], 2, 0);
  TC_ASSERT_DBL_NEAR(x[3], 1, 0);
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

static void blocked(const char *transport) {
  blocked_arg_t a = {.transport = transport};
  TC_ASSERT_EQ(pipe(a.fds), 0);
  tc_spawn(2, blocked_rank, &a, 60);
  close(a.fds[0]);
  close(a.fds[1]);
}

/* A synchronous operation above TORCHCOMMS_CPU_INLINE_BYTES over shared
 * memory runs inside its post too (when the communicator is idle and the
 * peer in step), and copying 4 MiB takes longer than the spin a kept lock
 * allows: every call lets the lock go once, whether it ran there or went
 * on to the backend's thread, and takes it back once. */
static void large_rank(tc_ctx_t *ctx) {
  setenv("TORCHCOMMS_CPU_TRANSPORT", "shm", 1);
  tc_comm_t *c = tc_ctx_comm(ctx, "waithooks-large", NULL);
  enum { N = 1 << 20, CALLS = 20 };
  float *x = malloc(N * sizeof *x);
  TC_ASSERT(x);
  for (int i = 0; i < N; i++) x[i] = (float)(i % 5) * (float)(ctx->rank + 1);
  lock_t l = {.held = 1, .signal_fd = -1};
  tc_op_options_t o = hooked(&l);
  for (int k = 0; k < CALLS; k++) {
    TC_ASSERT_OK(tc_barrier(c, NULL, NULL));
    TC_ASSERT_OK(tc_all_reduce(c, x, N, TC_FLOAT32, TC_OP(TC_MAX), &o, NULL));
    TC_ASSERT_EQ(l.released, k + 1);
    TC_ASSERT_EQ(l.reacquired, k + 1);
    TC_ASSERT_EQ(l.held, 1);
  }
  for (int i = 0; i < N; i++) TC_ASSERT(x[i] == (float)(i % 5) * 2);
  free(x);
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(wait_hooks_release_before_a_large_copy_shm) { tc_spawn(2, large_rank, NULL, 60); }

TC_TEST(wait_hooks_release_before_a_wait_shm) { blocked("shm"); }
TC_TEST(wait_hooks_release_before_a_wait_tcp) { blocked("tcp"); }

TC_TEST(wait_hooks_kept_when_nothing_blocks) {
  tc_comm_t *c = NULL;
  TC_ASSERT_OK(tc_world1_create("waithooks1", "cpu", &c));
  lock_t l = {.held = 1, .signal_fd = -1};
  tc_op_options_t o = hooked(&l);
  float x[3] = {1, 2, 3};
  for (int i = 0; i < 10; i++)
    TC_ASSERT_OK(tc_all_reduce(c, x, 3, TC_FLOAT32, TC_OP(TC_SUM), &o, NULL));
  TC_ASSERT_OK(tc_broadcast(c, x, 3, TC_FLOAT32, 0, &o, NULL));
  tc_work_t *w = NULL;
  TC_ASSERT_OK(tc_all_reduce(c, x, 3, TC_FLOAT32, TC_OP(TC_SUM), &o, &w));
  TC_ASSERT_OK(tc_work_wait(w));
  TC_ASSERT_OK(tc_work_release(w));
  TC_ASSERT_EQ(l.released, 0);
  TC_ASSERT_EQ(l.reacquired, 0);
  TC_ASSERT_DBL_NEAR(x[2], 3, 0);
  /* one without the other: refused before anything runs */
  o.wait_reacquire = NULL;
  TC_ASSERT_ERR(tc_all_reduce(c, x, 3, TC_FLOAT32, TC_OP(TC_SUM), &o, NULL),
                TC_ERR_INVALID_ARGUMENT,
                "all_reduce on 'waithooks1' (rank 0 of 1): options 'wait_release' and "
                "'wait_reacquire' must be set together (one is NULL)");
  TC_ASSERT_EQ(l.released, 0);
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

/* A backend that completes every operation inside its post, and does not
 * say whether it blocks there. */
static const tc_backend_host_t *nb_host;
static int nb_init(const tc_backend_init_args_t *a, void **out, char *err, size_t len) {
  nb_host = a->host;
  *out = &nb_host;
  return TC_OK;
}
static int nb_finalize(void *b, char *err, size_t len) { return TC_OK; }
static int nb_abort(void *b) { return TC_OK; }
static void nb_destroy(void *b) {}
static int nb_post(void *b, const tc_backend_op_t *op, tc_work_t *w, char *err, size_t len) {
  nb_host->work_started(w);
  nb_host->work_complete(w, TC_OK, NULL);
  return TC_OK;
}
static const tc_backend_ops_t nb_table = {
    .abi_version = TC_BACKEND_ABI_VERSION, .size = sizeof(tc_backend_ops_t),
    .name = "noreport", .version = "nb-1", .init = nb_init, .finalize = nb_finalize,
    .abort = nb_abort, .destroy = nb_destroy, .post = nb_post};

TC_TEST(wait_hooks_whole_call_without_the_capability) {
  TC_ASSERT_OK(tc_backend_register(&nb_table));
  unsetenv("MASTER_ADDR");
  unsetenv("MASTER_PORT");
  tc_comm_options_t co = TC_COMM_OPTIONS_INIT;
  co.rank = 0;
  co.world_size = 1;
  tc_comm_t *c = NULL;
  TC_ASSERT_OK(tc_comm_create("noreport", "cpu", &co, &c));
  lock_t l = {.held = 1, .signal_fd = -1};
  tc_op_options_t o = hooked(&l);
  float x[2] = {1, 2};
  TC_ASSERT_OK(tc_all_reduce(c, x, 2, TC_FLOAT32, TC_OP(TC_SUM), &o, NULL));
  TC_ASSERT_EQ(l.released, 1);
  TC_ASSERT_EQ(l.reacquired, 1);
  TC_ASSERT_OK(tc_barrier(c, &o, NULL));
  TC_ASSERT_EQ(l.released, 2);
  TC_ASSERT_EQ(l.reacquired, 2);
  TC_ASSERT_EQ(l.held, 1);
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

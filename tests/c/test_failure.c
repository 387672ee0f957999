/* test_failure.c -- failures are first-class: a peer killed with SIGKILL, a
 * timeout, abort releasing a pending wait, abort_process_on_timeout_or_error.
 * Ranks coordinate through an anonymous shared mapping created before fork
 * (conditions with deadlines, never sleeps standing in for synchronisation). */
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coll_util.h"

typedef struct {
  _Atomic double kill_time;
  _Atomic int iterations;
  _Atomic int detected;
  _Atomic int done;
  char stderr_path[128];
} tc_shared_t;

static tc_shared_t *tc_shared_new(void) { return tc_shared_zalloc(sizeof(tc_shared_t)); }

/* ---- a peer killed with SIGKILL during a loop of all_reduce ---- */

#define VICTIM 2

static void kill_rank(tc_ctx_t *ctx) {
  tc_shared_t *sh = ctx->arg;
  tc_comm_t *c = tc_ctx_comm(ctx, "killtest", NULL);
  size_t count = 4096;
  float *buf = tc_xmalloc(count * sizeof *buf);
  for (int it = 0;; it++) {
    if (ctx->rank == VICTIM && it == 50) {
      sh->kill_time = tc__now();
      raise(SIGKILL);
    }
    for (size_t i = 0; i < count; i++) buf[i] = 1.0f;
    int rc = tc_all_reduce(c, buf, count, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL);
    if (rc != TC_OK) {
      double dt = tc__now() - sh->kill_time;
      const char *msg = tc_last_error();
      printf("rank %d detected after %.3f s: %s\n", ctx->rank, dt, msg);
      TC_ASSERT(ctx->rank != VICTIM);
      TC_ASSERT(sh->kill_time > 0);
      TC_ASSERT(dt < 2.0);
      TC_ASSERT_EQ(rc, TC_ERR_REMOTE);
      TC_ASSERT_CONTAINS(msg, "all_reduce on 'killtest'");
      TC_ASSERT_CONTAINS(msg, "peer 2");
      /* later operations fail at once too */
      rc = tc_all_reduce(c, buf, count, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL);
      TC_ASSERT(rc != TC_OK);
      sh->detected++;
      tc_wait_flag(&sh->detected, ctx->size - 1, 10);
      break;
    }
    TC_ASSERT_DBL_NEAR(buf[0], (double)ctx->size, 0);
    TC_ASSERT(it < 100000);
  }
  TC_ASSERT_OK(tc_comm_destroy(c));
  free(buf);
}

static void kill_test(int n) {
  tc_shared_t *sh = tc_shared_new();
  int st[8];
  tc_spawn_status(n, kill_rank, sh, 60, st);
  for (int r = 0; r < n; r++) {
    if (r == VICTIM) {
      TC_ASSERT(WIFSIGNALED(st[r]) && WTERMSIG(st[r]) == SIGKILL);
    } else {
      TC_ASSERT(WIFEXITED(st[r]));
      TC_ASSERT_EQ(WEXITSTATUS(st[r]), 0);
    }
  }
  TC_ASSERT_EQ(sh->detected, n - 1);
}

TC_TEST(failure_peer_killed_w3) { kill_test(3); }
TC_TEST(failure_peer_killed_w4) { kill_test(4); }
TC_TEST(failure_peer_killed_w8) { kill_test(8); }

/* ---- a timeout ---- */

static void timeout_rank(tc_ctx_t *ctx) {
  tc_shared_t *sh = ctx->arg;
  tc_comm_t *c = tc_ctx_comm(ctx, "timeouttest", NULL);
  if (ctx->rank == 0) {
    float x = 1;
    tc_op_options_t o = TC_OP_OPTIONS_INIT;
    o.timeout_s = 0.5;
    tc_work_t *w;
    double t0 = tc__now();
    TC_ASSERT_OK(tc_all_reduce(c, &x, 1, TC_FLOAT32, TC_OP(TC_SUM), &o, &w));
    int rc = tc_work_wait(w);
    double dt = tc__now() - t0;
    TC_ASSERT_EQ(rc, TC_ERR_TIMEOUT);
    TC_ASSERT_EQ(tc_work_status(w), TC_WORK_TIMEDOUT);
    TC_ASSERT_CONTAINS(tc_work_error(w), "timed out");
    TC_ASSERT_CONTAINS(tc_work_error(w), "all_reduce on 'timeouttest' (rank 0 of 2)");
    TC_ASSERT_CONTAINS(tc_comm_last_error(c), "timed out");
    TC_ASSERT(dt >= 0.45 && dt < 2.5);
    TC_ASSERT_OK(tc_work_release(w));
    sh->done = 1;
  } else {
    tc_wait_flag(&sh->done, 1, 30); /* never joins the all_reduce */
  }
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(failure_timeout) { tc_spawn(2, timeout_rank, tc_shared_new(), 60); }

/* ---- abort releases a pending wait ---- */

static void *abort_thread(void *arg) {
  tc_work_t *w = ((void **)arg)[0];
  tc_comm_t *c = ((void **)arg)[1];
  double dl = tc__now() + 10;
  while (tc_work_status(w) == TC_WORK_NOT_STARTED && tc__now() < dl) {
    struct timespec ts = {0, 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  tc_comm_abort(c);
  return NULL;
}

static void abort_rank(tc_ctx_t *ctx) {
  tc_shared_t *sh = ctx->arg;
  tc_comm_t *c = tc_ctx_comm(ctx, "aborttest", NULL);
  if (ctx->rank == 0) {
    float x = 1;
    tc_work_t *w, *w2;
    TC_ASSERT_OK(tc_all_reduce(c, &x, 1, TC_FLOAT32, TC_OP(TC_SUM), NULL, &w));
    TC_ASSERT_OK(tc_barrier(c, NULL, &w2)); /* queued behind it */
    void *args[2] = {w, c};
    pthread_t th;
    pthread_create(&th, NULL, abort_thread, args);
    double t0 = tc__now();
    int rc = tc_work_wait(w);
    double dt = tc__now() - t0;
    pthread_join(th, NULL);
    TC_ASSERT_EQ(rc, TC_ERR_ABORTED);
    TC_ASSERT_EQ(tc_work_status(w), TC_WORK_ERROR);
    TC_ASSERT_CONTAINS(tc_work_error(w), "aborted");
    TC_ASSERT_EQ(tc_work_wait(w2), TC_ERR_ABORTED);
    TC_ASSERT(dt < 5.0);
    TC_ASSERT(tc_comm_is_aborted(c));
    TC_ASSERT_ERR(tc_barrier(c, NULL, NULL), TC_ERR_ABORTED, "aborted");
    TC_ASSERT_OK(tc_work_release(w));
    TC_ASSERT_OK(tc_work_release(w2));
    sh->done = 1;
  } else {
    tc_wait_flag(&sh->done, 1, 30);
  }
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(failure_abort_releases_wait) {
  tc_spawn(2, abort_rank, tc_shared_new(), 60);
}

/* ---- abort_process_on_timeout_or_error ---- */

static void abort_process_rank(tc_ctx_t *ctx) {
  tc_shared_t *sh = ctx->arg;
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.abort_process_on_timeout_or_error = ctx->rank == 0;
  o.timeout_s = 0.5;
  tc_comm_t *c = tc_ctx_comm(ctx, "abortproc", &o);
  if (ctx->rank == 0) {
    TC_ASSERT(freopen(sh->stderr_path, "w", stderr) != NULL);
    float x = 1;
    tc_all_reduce(c, &x, 1, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL);
    tc_test_fail(__FILE__, __LINE__, "the process should have exited");
  }
  tc_wait_flag(&sh->done, 1, 30);
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(failure_abort_process_on_timeout) {
  tc_shared_t *sh = tc_shared_new();
  snprintf(sh->stderr_path, sizeof sh->stderr_path, "/tmp/tc_abortproc_%d.txt",
           (int)getpid());
  int st[2];
  /* rank 1 waits on `done`, which the parent sets once rank 0 is gone */
  pid_t helper = fork();
  if (helper == 0) {
    tc_spawn_status(2, abort_process_rank, sh, 60, st);
    TC_ASSERT(WIFSIGNALED(st[0]) && WTERMSIG(st[0]) == SIGABRT);
    TC_ASSERT(WIFEXITED(st[1]) && WEXITSTATUS(st[1]) == 0);
    _exit(0);
  }
  /* the file appears when rank 0 dies with the message */
  double dl = tc__now() + 30;
  for (;;) {
    FILE *f = fopen(sh->stderr_path, "r");
    char text[2048] = "";
    if (f) {
      size_t n = fread(text, 1, sizeof text - 1, f);
      text[n] = 0;
      fclose(f);
    }
    if (strstr(text, "aborting the process")) {
      TC_ASSERT_CONTAINS(text, "all_reduce on 'abortproc' (rank 0 of 2)");
      TC_ASSERT_CONTAINS(text, "timed out");
      break;
    }
    if (tc__now() > dl)
      tc_test_fail(__FILE__, __LINE__, "rank 0 did not abort with the "
                   "message; its stderr: \"%s\"", text);
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  sh->done = 1;
  int hs;
  waitpid(helper, &hs, 0);
  unlink(sh->stderr_path);
  TC_ASSERT(WIFEXITED(hs) && WEXITSTATUS(hs) == 0);
}

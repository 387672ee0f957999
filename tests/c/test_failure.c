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

/* ---- a peer that finished its part of a collective and exited ----
 * Over TCP, a rank that received from a peer during a collective knows it
 * took part: the peer's exit with nothing pending does not fail that
 * collective (a script's last barrier, then exit without destroy); the next
 * collective needing it does. 8 ranks scatter from rank 1; rank 0 receives
 * its block and exits while rank 3 (not among rank 0's fingerprint peers,
 * rank 0 +-1, 2, 4) has not yet entered: rank 1 (the root) and rank 4 have
 * heard rank 0 in this scatter and still wait on rank 3. */

#define EXITER 0
#define LATE 3

typedef struct {
  _Atomic int exiter_pid;
} exit_shared_t;

/* 1 once pid is a zombie: it exited and its sockets are closed */
static int exited(int pid) {
  char path[64], text[256] = "";
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return 1;
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = 0;
  const char *close = strrchr(text, ')'); /* "pid (comm) S ..." */
  return close && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X');
}

static void exit_part_rank(tc_ctx_t *ctx) {
  exit_shared_t *sh = ctx->arg;
  setenv("TORCHCOMMS_CPU_TRANSPORT", "tcp", 1); /* shared memory syncs every rank */
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.timeout_s = 20;
  tc_comm_t *c = tc_ctx_comm(ctx, "exitpart", &o);
  enum { N = 4096 };
  int32_t *all = tc_xmalloc((size_t)ctx->size * N * sizeof *all), mine[N];
  for (int i = 0; i < ctx->size * N; i++) all[i] = 7 * i + 1;
  if (ctx->rank == EXITER) sh->exiter_pid = (int)getpid();
  if (ctx->rank == LATE) {
    tc_wait_flag(&sh->exiter_pid, 1, 30);
    double dl = tc__now() + 30;
    while (!exited(sh->exiter_pid)) {
      TC_ASSERT(tc__now() < dl);
      struct timespec ts = {0, 1000 * 1000};
      nanosleep(&ts, NULL);
    }
  }
  const void *bufs[8];
  for (int r = 0; r < ctx->size; r++) bufs[r] = all + (size_t)r * N;
  TC_ASSERT_OK(tc_scatter(c, mine, bufs, N, TC_INT32, 1, NULL, NULL));
  for (int i = 0; i < N; i++) TC_ASSERT_EQ(mine[i], 7 * (ctx->rank * N + i) + 1);
  free(all);
  if (ctx->rank == EXITER) _exit(0); /* without destroy, as a script ends */
  /* the next collective needs rank 0: it fails, naming it where it is seen */
  int rc = tc_barrier(c, NULL, NULL);
  TC_ASSERT(rc != TC_OK);
  if (ctx->rank == 1) { /* receives from rank 0 in the first round */
    TC_ASSERT_EQ(rc, TC_ERR_REMOTE);
    TC_ASSERT_CONTAINS(tc_last_error(), "peer 0");
  }
  TC_ASSERT_OK(tc_comm_abort(c));
  tc_comm_destroy(c);
}

TC_TEST(failure_peer_exits_after_its_part) {
  exit_shared_t *sh = tc_shared_zalloc(sizeof *sh);
  int st[8];
  tc_spawn_status(8, exit_part_rank, sh, 60, st);
  for (int r = 0; r < 8; r++) {
    TC_ASSERT(WIFEXITED(st[r]));
    TC_ASSERT_EQ(WEXITSTATUS(st[r]), 0);
  }
}

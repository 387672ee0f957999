#define _GNU_SOURCE
/* test_hooks.c -- hooks around every operation, the flight recorder and the
 * cross-rank hang report, with real processes over the cpu backend. */
#include <signal.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runner.h"

typedef struct {
  int calls[3];
  char log[4096];
  size_t n;
  uint64_t last_op_id;
  int refuse_at; /* refuse the PRE call with this op_id (0: none) */
} rec_t;

static int record(tc_hook_kind_t kind, const tc_op_info_t *in, void *user) {
  rec_t *r = user;
  r->calls[kind]++;
  int k = snprintf(r->log + r->n, sizeof r->log - r->n,
                   "%s %s #%llu c%llu p%llu dt%d red%d root%d n%zu in%zu out%zu a%d st%d|",
                   kind == TC_HOOK_PRE ? "pre" : kind == TC_HOOK_POST ? "post" : "abort",
                   in->name, (unsigned long long)in->op_id, (unsigned long long)in->coll_seq,
                   (unsigned long long)in->p2p_seq, (int)in->dtype, in->redop, in->root,
                   in->count, in->in_bytes, in->out_bytes, in->async_op, in->status);
  if (k > 0 && (size_t)k < sizeof r->log - r->n) r->n += (size_t)k;
  if (kind == TC_HOOK_POST) {
    TC_ASSERT(in->duration_s >= 0 && in->duration_s < 60);
    TC_ASSERT_EQ(in->work_status, in->status == TC_OK ? TC_WORK_COMPLETED : TC_WORK_ERROR);
  }
  r->last_op_id = in->op_id;
  if (kind == TC_HOOK_PRE && in->op_id == (uint64_t)r->refuse_at) {
    tc_hook_refuse("NaN found in the input (test)");
    r->refuse_at = 0; /* once */
    return 1;
  }
  return 0;
}

/* Hooks see every operation with its arguments, in order; a refusal fails
 * the operation on that rank only and keeps the numbering; unregistering
 * stops the calls. */
static void hooks_rank(tc_ctx_t *ctx) {
  tc_comm_t *c = tc_ctx_comm(ctx, "hooks", NULL);
  rec_t r = {.refuse_at = 0};
  uint64_t pre, post;
  TC_ASSERT_OK(tc_comm_register_hook(c, TC_HOOK_PRE, record, &r, &pre));
  TC_ASSERT_OK(tc_comm_register_hook(c, TC_HOOK_POST, record, &r, &post));
  TC_ASSERT_EQ(tc_comm_next_op_id(c), 1);
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  TC_ASSERT_OK(tc_all_reduce(c, x, 8, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT_EQ(x[7], 16);
  int64_t g[4] = {ctx->rank, 0, 0, 0};
  tc_work_t *w;
  TC_ASSERT_OK(tc_all_gather_single(c, g + 2, g, 1, TC_INT64, NULL, &w));
  TC_ASSERT_OK(tc_work_wait(w));
  TC_ASSERT_OK(tc_work_release(w));
  if (ctx->rank == 0) TC_ASSERT_OK(tc_send(c, x, 3, TC_FLOAT32, 1, NULL, NULL));
  else TC_ASSERT_OK(tc_recv(c, x, 3, TC_FLOAT32, 0, NULL, NULL));
  TC_ASSERT_OK(tc_broadcast(c, x, 2, TC_FLOAT32, 1, NULL, NULL));
  /* rank 1 refuses its next op (#5): it fails there, unposted */
  r.refuse_at = ctx->rank == 1 ? 5 : 0;
  if (ctx->rank == 1)
    TC_ASSERT_ERR(tc_barrier(c, NULL, NULL), TC_ERR_INVALID_USAGE,
                  "barrier on 'hooks' (rank 1 of 2): NaN found in the input (test)");
  /* numbering kept: the next collective is #5 on both ranks */
  TC_ASSERT_EQ(tc_comm_next_op_id(c), 5);
  TC_ASSERT_OK(tc_barrier(c, NULL, NULL));
  char want[2048];
  const char *p2p = ctx->rank == 0 ? "send #3 c0 p1 dt0 red-1 root1 n3 in12 out0"
                                   : "recv #3 c0 p1 dt0 red-1 root0 n3 in0 out12";
  snprintf(want, sizeof want,
           "pre all_reduce #1 c1 p0 dt0 red0 root-1 n8 in32 out32 a0 st0|"
           "post all_reduce #1 c1 p0 dt0 red0 root-1 n8 in32 out32 a0 st0|"
           "pre all_gather_single #2 c2 p0 dt8 red-1 root-1 n1 in8 out16 a1 st0|"
           "post all_gather_single #2 c2 p0 dt8 red-1 root-1 n1 in8 out16 a1 st0|"
           "pre %s a0 st0|post %s a0 st0|"
           "pre broadcast #4 c3 p0 dt0 red-1 root1 n2 in%d out8 a0 st0|"
           "post broadcast #4 c3 p0 dt0 red-1 root1 n2 in%d out8 a0 st0|"
           "%s"
           "pre barrier #5 c4 p0 dt0 red-1 root-1 n0 in0 out0 a0 st0|"
           "post barrier #5 c4 p0 dt0 red-1 root-1 n0 in0 out0 a0 st0|",
           p2p, p2p, ctx->rank == 1 ? 8 : 0, ctx->rank == 1 ? 8 : 0,
           ctx->rank == 1 ? "pre barrier #5 c4 p0 dt0 red-1 root-1 n0 in0 out0 a0 st0|" : "");
  TC_ASSERT_STR_EQ(r.log, want);
  TC_ASSERT_OK(tc_comm_unregister_hook(c, pre));
  TC_ASSERT_OK(tc_comm_unregister_hook(c, post));
  TC_ASSERT_ERR(tc_comm_unregister_hook(c, post), TC_ERR_INVALID_ARGUMENT,
                "no hook");
  int before = r.calls[0] + r.calls[1];
  TC_ASSERT_OK(tc_barrier(c, NULL, NULL));
  TC_ASSERT_EQ(r.calls[0] + r.calls[1], before);
  TC_ASSERT_ERR(tc_comm_register_hook(c, (tc_hook_kind_t)7, record, &r, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'kind' = 7");
  TC_ASSERT_ERR(tc_comm_register_hook(c, TC_HOOK_PRE, NULL, &r, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'fn' is NULL");
  /* the abort hook runs once, before the abort */
  rec_t a = {0};
  TC_ASSERT_OK(tc_comm_register_hook(c, TC_HOOK_ABORT, record, &a, NULL));
  TC_ASSERT_OK(tc_comm_abort(c));
  TC_ASSERT_OK(tc_comm_abort(c));
  TC_ASSERT_EQ(a.calls[TC_HOOK_ABORT], 1);
  TC_ASSERT_CONTAINS(a.log, "abort abort #6");
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(hooks_called_in_order_with_their_arguments) { tc_spawn(2, hooks_rank, NULL, 60); }

/* ---- flight recorder ---- */

static void fr_rank(tc_ctx_t *ctx) {
  tc_comm_t *c = tc_ctx_comm(ctx, "frc", NULL);
  float x[16] = {0};
  for (int i = 0; i < 5; i++)
    TC_ASSERT_OK(tc_all_reduce(c, x, 16, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT_OK(tc_barrier(c, NULL, NULL));
  TC_ASSERT_EQ(tc_fr_size(c), 6);
  char *j;
  TC_ASSERT_OK(tc_fr_dump_json(c, 1, &j));
  TC_ASSERT_CONTAINS(j, "\"version\": \"2.10\"");
  TC_ASSERT_CONTAINS(j, "\"frc\": {\"name\": \"frc\", \"desc\": \"cpu\", \"ranks\": \"[0, 1]\"}");
  TC_ASSERT_CONTAINS(j, "\"record_id\": 4, \"pg_id\": 0, \"process_group\": [\"frc\", \"cpu\"], "
                        "\"collective_seq_id\": 5, \"p2p_seq_id\": 0, \"op_id\": 5, "
                        "\"profiling_name\": \"gloo:all_reduce\"");
  TC_ASSERT_CONTAINS(j, "\"input_sizes\": [[16]], \"input_dtypes\": [\"Float\"], "
                        "\"output_sizes\": [[16]], \"output_dtypes\": [\"Float\"], "
                        "\"state\": \"completed\"");
  TC_ASSERT_CONTAINS(j, "\"last_completed_collective\": 6");
  tc_free(j);
  TC_ASSERT_OK(tc_fr_dump_json(c, 0, &j)); /* completed left out */
  TC_ASSERT(!strstr(j, "record_id"));
  tc_free(j);
  TC_ASSERT_OK(tc_fr_reset(c));
  TC_ASSERT_EQ(tc_fr_size(c), 0);
  TC_ASSERT_OK(tc_barrier(c, NULL, NULL));
  TC_ASSERT_EQ(tc_fr_size(c), 1);
  /* the ring keeps the last TORCH_FR_BUFFER_SIZE (8 here) */
  for (int i = 0; i < 10; i++) TC_ASSERT_OK(tc_barrier(c, NULL, NULL));
  TC_ASSERT_EQ(tc_fr_size(c), 8);
  TC_ASSERT_OK(tc_fr_dump_json(c, 1, &j));
  TC_ASSERT_CONTAINS(j, "\"collective_seq_id\": 17,");
  TC_ASSERT_CONTAINS(j, "\"collective_seq_id\": 10,");
  TC_ASSERT(!strstr(j, "\"collective_seq_id\": 9,"));
  tc_free(j);
  TC_ASSERT_OK(tc_fr_reserve(c, 16)); /* grows, keeping the eight */
  TC_ASSERT_EQ(tc_fr_size(c), 8);
  TC_ASSERT_OK(tc_fr_dump_json(c, 1, &j));
  TC_ASSERT_CONTAINS(j, "\"collective_seq_id\": 10,");
  tc_free(j);
  for (int i = 0; i < 10; i++) TC_ASSERT_OK(tc_barrier(c, NULL, NULL));
  TC_ASSERT_EQ(tc_fr_size(c), 16);
  /* the whole process: every communicator, to the file of this rank */
  char path[256], *written;
  snprintf(path, sizeof path, "%s/explicit_%d", (char *)ctx->arg, ctx->rank);
  TC_ASSERT_OK(tc_fr_dump_file(path, &written));
  TC_ASSERT_STR_EQ(written, path);
  tc_free(written);
  struct stat st;
  TC_ASSERT(stat(path, &st) == 0 && st.st_size > 100);
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

/* a function of this program, so that its name is in the stack frames */
__attribute__((noinline)) int fr_stack_caller_marker(tc_comm_t *c);
__attribute__((noinline)) int fr_stack_caller_marker(tc_comm_t *c) {
  int rc = tc_barrier(c, NULL, NULL);
  return rc == 12345 ? -1 : rc; /* work after the call: not a tail call */
}

static void fr_stack_rank(tc_ctx_t *ctx) {
  tc_comm_t *c = tc_ctx_comm(ctx, "frs", NULL);
  TC_ASSERT_OK(fr_stack_caller_marker(c));
  char *j;
  TC_ASSERT_OK(tc_fr_dump_json(c, 1, &j));
  TC_ASSERT_CONTAINS(j, "\"frames\": [{\"name\": \"tc_barrier\", \"filename\": ");
  TC_ASSERT_CONTAINS(j, "{\"name\": \"fr_stack_caller_marker\", \"filename\": ");
  tc_free(j);
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(flight_recorder_stack_frames_on_request) {
  setenv("TORCH_FR_CPP_STACK", "1", 1);
  tc_spawn(2, fr_stack_rank, NULL, 60);
  unsetenv("TORCH_FR_CPP_STACK");
}

TC_TEST(flight_recorder_ring_dump_reset_reserve) {
  char dir[] = "/tmp/tc_fr_XXXXXX";
  TC_ASSERT(mkdtemp(dir));
  setenv("TORCH_FR_BUFFER_SIZE", "8", 1);
  tc_spawn(2, fr_rank, dir, 60);
  unsetenv("TORCH_FR_BUFFER_SIZE");
}

/* ---- the hang report ---- */

typedef struct {
  const int *late; /* late[r]: rank r does not enter the third collective */
  const char *dir; /* TORCH_FR_DUMP_TEMP_FILE prefix's folder */
  const char *want; /* what every punctual rank's error must contain */
} hang_t;

static void hang_rank(tc_ctx_t *ctx) {
  const hang_t *h = ctx->arg;
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.timeout_s = 1.0;
  tc_comm_t *c = tc_ctx_comm(ctx, "main", &o);
  float x[4] = {1, 1, 1, 1};
  TC_ASSERT_OK(tc_all_reduce(c, x, 4, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL)); /* #1 */
  float g[4 * 8];
  TC_ASSERT_OK(tc_all_gather_single(c, g, x, 4, TC_FLOAT32, NULL, NULL)); /* #2 */
  tc_store_t *s = tc_ctx_store(ctx);
  if (!h->late[ctx->rank]) { /* a late rank stays out of #3 (waits below) */
    int rc = tc_all_reduce(c, x, 4, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL); /* #3 */
    TC_ASSERT(rc == TC_ERR_TIMEOUT || rc == TC_ERR_REMOTE);
    TC_ASSERT_CONTAINS(tc_last_error(), h->want);
    /* the trace was written before the error was returned */
    char path[256];
    snprintf(path, sizeof path, "%s/trace_%d", h->dir, ctx->rank);
    FILE *f = fopen(path, "r");
    TC_ASSERT(f != NULL);
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    /* torch's pickled dump (protocol 2), with the timed-out entry */
    TC_ASSERT(n > 2 && (unsigned char)buf[0] == 0x80 && buf[1] == 2);
    TC_ASSERT(memmem(buf, n, "timed_out", 9) != NULL);
    TC_ASSERT(memmem(buf, n, "gloo:all_reduce", 15) != NULL);
    char key[16];
    snprintf(key, sizeof key, "done/%d", ctx->rank);
    TC_ASSERT_OK(tc_store_set(s, key, "1", 1));
  }
  /* nobody leaves before every punctual rank has read its error (a rank
   * that left would turn a slower rank's timeout into a lost peer); the
   * late ranks never enter #3 */
  char keys[8][16];
  const char *kp[8];
  size_t nk = 0;
  for (int r = 0; r < ctx->size; r++)
    if (!h->late[r]) {
      snprintf(keys[nk], sizeof keys[nk], "done/%d", r);
      kp[nk] = keys[nk];
      nk++;
    }
  TC_ASSERT_OK(tc_store_wait(s, kp, nk, 60));
  tc_store_release(s);
  tc_comm_destroy(c);
}

static void run_hang(int n, const int *late, const char *want) {
  char dir[] = "/tmp/tc_hang_XXXXXX";
  TC_ASSERT(mkdtemp(dir));
  char prefix[64];
  snprintf(prefix, sizeof prefix, "%s/trace_", dir);
  setenv("TORCH_FR_DUMP_TEMP_FILE", prefix, 1);
  hang_t h = {late, dir, want};
  tc_spawn(n, hang_rank, &h, 90);
  unsetenv("TORCH_FR_DUMP_TEMP_FILE");
}

TC_TEST(hang_report_names_the_late_rank_w4) {
  static const int late[4] = {0, 0, 0, 1};
  run_hang(4, late,
           "[hang report: all_reduce #3: rank 3 never entered it (rank 3's last completed "
           "op is all_gather_single #2)]");
}

TC_TEST(hang_report_names_the_late_ranks_w8) {
  static const int late[8] = {0, 0, 0, 1, 0, 1, 0, 0};
  run_hang(8, late,
           "[hang report: all_reduce #3: ranks 3 and 5 never entered it (rank 3's last "
           "completed op is all_gather_single #2, rank 5's last completed op is "
           "all_gather_single #2)]");
}

/* Without the board (as across hosts) the failing ranks publish their
 * state to the store and wait a bounded time for the others': the stopped
 * rank is named as not reporting, and the error still comes back within
 * the operation's timeout + TORCHCOMMS_HANG_REPORT_S. */
TC_TEST(hang_report_through_the_store_is_bounded_w4) {
  static const int late[4] = {0, 0, 0, 1};
  setenv("TORCHCOMMS_HANG_REPORT_BOARD", "0", 1);
  setenv("TORCHCOMMS_HANG_REPORT_S", "1", 1);
  run_hang(4, late,
           "[hang report: all_reduce #3: rank 3 did not report (stopped or on another host "
           "without a reachable store)]");
  unsetenv("TORCHCOMMS_HANG_REPORT_BOARD");
  unsetenv("TORCHCOMMS_HANG_REPORT_S");
}

/* Ranks that called another collective at the same place (the mismatch
 * check off) are named with what they called. */
static void other_op_rank(tc_ctx_t *ctx) {
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.timeout_s = 1.0;
  tc_comm_t *c = tc_ctx_comm(ctx, "main", &o);
  tc_store_t *s = tc_ctx_store(ctx);
  float x[4] = {1, 1, 1, 1};
  TC_ASSERT_OK(tc_all_reduce(c, x, 4, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL)); /* #1 */
  if (ctx->rank == 1) {
    /* #2 is a reduce here (an all_reduce elsewhere): whatever it returns,
     * this rank stays until the others have read their errors */
    tc_reduce(c, x, 4, TC_FLOAT32, TC_OP(TC_SUM), 0, NULL, NULL);
    const char *keys[2] = {"done/0", "done/2"};
    TC_ASSERT_OK(tc_store_wait(s, keys, 2, 60));
  } else {
    int rc = tc_all_reduce(c, x, 4, TC_FLOAT32, TC_OP(TC_MAX), NULL, NULL);
    TC_ASSERT_EQ(rc, TC_ERR_TIMEOUT);
    TC_ASSERT_CONTAINS(tc_last_error(),
                       "[hang report: all_reduce #2: rank 1 called another operation as #2 "
                       "(rank 1: reduce)");
    TC_ASSERT_OK(tc_store_set(s, ctx->rank ? "done/2" : "done/0", "1", 1));
    /* stays until the other has read its error too (leaving earlier would
     * turn its timeout into a lost peer) */
    const char *keys[2] = {"done/0", "done/2"};
    TC_ASSERT_OK(tc_store_wait(s, keys, 2, 60));
  }
  tc_store_release(s);
  tc_comm_destroy(c);
}

/* With the mismatch check off, what mismatched operations do depends on the
 * algorithms: over shared memory this pair waits for each other until the
 * deadline (over TCP it may complete with garbage), so the test runs on
 * shared memory whatever transport the suite forces. */
TC_TEST(hang_report_names_a_rank_in_another_collective_w3) {
  const char *tp = getenv("TORCHCOMMS_CPU_TRANSPORT");
  char saved[32] = "";
  if (tp) snprintf(saved, sizeof saved, "%s", tp);
  setenv("TORCHCOMMS_CPU_TRANSPORT", "shm", 1);
  setenv("TORCHCOMMS_CHECK_MISMATCH", "0", 1);
  tc_spawn(3, other_op_rank, NULL, 60);
  unsetenv("TORCHCOMMS_CHECK_MISMATCH");
  if (saved[0]) setenv("TORCHCOMMS_CPU_TRANSPORT", saved, 1);
  else unsetenv("TORCHCOMMS_CPU_TRANSPORT");
}

/* Two ranks each waiting to receive from the other (a pipeline's classic
 * deadlock): each timeout names where the peer is. */
static void in_recv_rank(tc_ctx_t *ctx) {
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.timeout_s = 1.0;
  tc_comm_t *c = tc_ctx_comm(ctx, "main", &o);
  float x[4] = {1, 1, 1, 1};
  TC_ASSERT_OK(tc_broadcast(c, x, 4, TC_FLOAT32, 0, NULL, NULL)); /* #1 */
  int peer = 1 - ctx->rank;
  tc_op_options_t oo = TC_OP_OPTIONS_INIT;
  oo.timeout_s = ctx->rank == 0 ? 1.0 : 60.0; /* rank 0 gives up first */
  int rc = tc_recv(c, x, 4, TC_FLOAT32, peer, &oo, NULL);
  if (ctx->rank == 0) {
    TC_ASSERT_EQ(rc, TC_ERR_TIMEOUT);
    TC_ASSERT_CONTAINS(tc_last_error(),
                       "[hang report: recv from rank 1 (p2p #1): rank 1 is in recv from rank 0 "
                       "(p2p #1), its last completed collective is broadcast #1]");
  } else { /* rank 0 left: this recv ends at once, saying where rank 0 was */
    TC_ASSERT_EQ(rc, TC_ERR_REMOTE);
    TC_ASSERT_CONTAINS(tc_last_error(), "[hang report: recv from rank 0 (p2p #1): rank 0's "
                                        "last completed op is broadcast #1");
  }
  tc_comm_destroy(c);
}

TC_TEST(hang_report_names_where_the_peer_of_a_recv_is) { tc_spawn(2, in_recv_rank, NULL, 60); }

/* An abort writes the trace (once), after the abort hooks ran. */
TC_TEST(flight_recorder_dumped_on_abort) {
  char dir[] = "/tmp/tc_fra_XXXXXX";
  TC_ASSERT(mkdtemp(dir));
  char prefix[64], path[80];
  snprintf(prefix, sizeof prefix, "%s/fr_", dir);
  snprintf(path, sizeof path, "%s/fr_0", dir);
  setenv("TORCH_FR_DUMP_TEMP_FILE", prefix, 1);
  tc_comm_t *c;
  TC_ASSERT_OK(tc_world1_create("frabort", "cpu", &c));
  float x[3] = {1, 2, 3};
  TC_ASSERT_OK(tc_all_reduce(c, x, 3, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL));
  struct stat st;
  TC_ASSERT(stat(path, &st) != 0); /* nothing failed yet */
  TC_ASSERT_OK(tc_comm_abort(c));
  TC_ASSERT(stat(path, &st) == 0 && st.st_size > 100);
  FILE *f = fopen(path, "rb");
  char buf[8192];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  TC_ASSERT(memmem(buf, n, "gloo:all_reduce", 15) != NULL);
  TC_ASSERT(memmem(buf, n, "frabort", 7) != NULL);
  TC_ASSERT_OK(tc_comm_destroy(c));
  unsetenv("TORCH_FR_DUMP_TEMP_FILE");
}

/* TORCHCOMMS_LOG=trace: one line per operation issued and one when it
 * ends, from the op path itself, in each rank's file. */
static void trace_rank(tc_ctx_t *ctx) {
  tc_comm_t *c = tc_ctx_comm(ctx, "tr", NULL);
  int32_t v[4] = {1, 2, 3, 4};
  TC_ASSERT_OK(tc_all_reduce(c, v, 4, TC_INT32, TC_OP(TC_MAX), NULL, NULL));
  if (ctx->rank == 0) TC_ASSERT_OK(tc_send(c, v, 2, TC_INT32, 1, NULL, NULL));
  else TC_ASSERT_OK(tc_recv(c, v, 2, TC_INT32, 0, NULL, NULL));
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = 0;
  fclose(f);
  return buf;
}

TC_TEST(trace_log_one_line_per_operation_from_the_op_path) {
  char dir[] = "/tmp/tc_trace_XXXXXX";
  TC_ASSERT(mkdtemp(dir));
  char pattern[80], path[80];
  snprintf(pattern, sizeof pattern, "%s/tc.%%r.log", dir);
  setenv("TORCHCOMMS_LOG", "trace", 1);
  setenv("TORCHCOMMS_LOG_SUBSYS", "coll,p2p", 1);
  setenv("TORCHCOMMS_LOG_FILE", pattern, 1);
  tc_spawn(2, trace_rank, NULL, 60);
  unsetenv("TORCHCOMMS_LOG");
  unsetenv("TORCHCOMMS_LOG_SUBSYS");
  unsetenv("TORCHCOMMS_LOG_FILE");
  snprintf(path, sizeof path, "%s/tc.0.log", dir);
  char *t = slurp(path);
  TC_ASSERT(t != NULL);
  TC_ASSERT_CONTAINS(t, "coll: all_reduce #1 on 'tr' (rank 0 of 2) int32 x4 (16 B) max issued");
  TC_ASSERT_CONTAINS(t, "coll: all_reduce #1 on 'tr' (rank 0 of 2) int32 x4 (16 B) max done ok in");
  TC_ASSERT_CONTAINS(t, "p2p: send #2 on 'tr' (rank 0 of 2)");
  TC_ASSERT(!strstr(t, " init: ")); /* the init subsystem is filtered out */
  snprintf(path, sizeof path, "%s/tc.1.log", dir);
  t = slurp(path);
  TC_ASSERT(t != NULL);
  TC_ASSERT_CONTAINS(t, "p2p: recv #2 on 'tr' (rank 1 of 2)");
}

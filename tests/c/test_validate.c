/* test_validate.c -- the misuse test: every way of calling the public API
 * wrongly must fail with the documented status code and a message that names
 * the operation and the argument, before any byte moves -- never crash.
 *
 * Covered: NULL buffers with non-zero counts, overflowing counts, roots and
 * peers out of range, send/recv to self, NULL lists and NULL list entries,
 * _v count mismatches, reductions not defined for a dtype (bitwise on
 * floats, PREMUL_SUM on integers or with a non-finite factor), invalid
 * dtype/redop enum values, bad op and communicator options, every call on a
 * finalized, aborted, destroyed, NULL and foreign communicator handle,
 * released / NULL / foreign work handles, foreign batch handles, unknown and
 * invalid backend names, bad splits, unmatched batch self-sends, rank >=
 * world_size, a missing MASTER_ADDR, the status-code tables, and the exact
 * format of an error message and tc_comm_last_error.
 *
 * Most tests use a world-size-1 "cpu" communicator on the in-process store
 * (no MASTER_ADDR needed); validate_split_and_p2p_two_ranks uses 2 ranks.
 * Run: build/tc_test validate
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "runner.h"

/* The launcher's variables would send a world-size-1 communicator to a TCP
 * store; every test runs in its own forked process, so clearing is local. */
static void clear_env(void) {
  static const char *vars[] = {
      "MASTER_ADDR",     "MASTER_PORT",          "TORCHELASTIC_USE_AGENT_STORE",
      "TORCHCOMM_RANK",  "TORCHCOMM_SIZE",       "OMPI_COMM_WORLD_RANK",
      "OMPI_COMM_WORLD_SIZE", "PMI_RANK",        "PMI_SIZE",
      "SLURM_PROCID",    "SLURM_NTASKS",         "RANK",
      "WORLD_SIZE",      "TORCHCOMM_TIMEOUT_SECONDS",
      "TORCHCOMM_ABORT_ON_ERROR", "TORCHCOMMS_BACKEND_LIB_PATH_NOSUCH",
      "TORCHCOMMS_BACKEND_LIB_PATH_NO_SUCH_BACKEND"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

/* A world-size-1 "cpu" communicator named `name` ("main" if NULL). */
static tc_comm_t *comm1(const char *name) {
  clear_env();
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.rank = 0;
  o.world_size = 1;
  o.name = name;
  tc_comm_t *c = NULL;
  TC_ASSERT_OK(tc_comm_create("cpu", "cpu", &o, &c));
  TC_ASSERT(c != NULL);
  return c;
}

/* Every operation (and batch create, split), with otherwise valid arguments
 * for a world-size-1 communicator, must fail with code and text. */
static void check_every_call(tc_comm_t *c, int code, const char *text) {
  float in[4] = {1, 2, 3, 4}, out[4] = {0};
  void *rl[1] = {out};
  const void *sl[1] = {in};
  size_t cnt[1] = {4};
  tc_work_t *w = NULL;
  TC_ASSERT_ERR(tc_send(c, in, 4, TC_FLOAT32, 0, NULL, NULL), code, text);
  TC_ASSERT_ERR(tc_recv(c, out, 4, TC_FLOAT32, 0, NULL, NULL), code, text);
  TC_ASSERT_ERR(tc_broadcast(c, out, 4, TC_FLOAT32, 0, NULL, NULL), code, text);
  TC_ASSERT_ERR(tc_all_reduce(c, out, 4, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL),
                code, text);
  TC_ASSERT_ERR(tc_all_reduce(c, out, 4, TC_FLOAT32, TC_OP(TC_SUM), NULL, &w),
                code, text);
  TC_ASSERT(w == NULL);
  TC_ASSERT_ERR(tc_reduce(c, out, 4, TC_FLOAT32, TC_OP(TC_MAX), 0, NULL, NULL),
                code, text);
  TC_ASSERT_ERR(tc_all_gather(c, rl, in, 4, TC_FLOAT32, NULL, NULL), code,
                text);
  TC_ASSERT_ERR(tc_all_gather_v(c, rl, cnt, in, 4, TC_FLOAT32, NULL, NULL),
                code, text);
  TC_ASSERT_ERR(tc_all_gather_single(c, out, in, 4, TC_FLOAT32, NULL, NULL),
                code, text);
  TC_ASSERT_ERR(tc_reduce_scatter(c, out, sl, 4, TC_FLOAT32, TC_OP(TC_SUM),
                                  NULL, NULL),
                code, text);
  TC_ASSERT_ERR(tc_reduce_scatter_v(c, out, 4, sl, cnt, TC_FLOAT32,
                                    TC_OP(TC_SUM), NULL, NULL),
                code, text);
  TC_ASSERT_ERR(tc_reduce_scatter_single(c, out, in, 4, TC_FLOAT32,
                                         TC_OP(TC_SUM), NULL, NULL),
                code, text);
  TC_ASSERT_ERR(tc_all_to_all_single(c, out, in, 4, TC_FLOAT32, NULL, NULL),
                code, text);
  TC_ASSERT_ERR(tc_all_to_all_v_single(c, out, cnt, in, cnt, TC_FLOAT32, NULL,
                                       NULL),
                code, text);
  TC_ASSERT_ERR(tc_all_to_all(c, rl, cnt, sl, cnt, TC_FLOAT32, NULL, NULL),
                code, text);
  TC_ASSERT_ERR(tc_barrier(c, NULL, NULL), code, text);
  TC_ASSERT_ERR(tc_barrier(c, NULL, &w), code, text);
  TC_ASSERT(w == NULL);
  TC_ASSERT_ERR(tc_scatter(c, out, sl, 4, TC_FLOAT32, 0, NULL, NULL), code,
                text);
  TC_ASSERT_ERR(tc_gather(c, rl, in, 4, TC_FLOAT32, 0, NULL, NULL), code, text);
  TC_ASSERT_ERR(tc_gather_single(c, out, in, 4, TC_FLOAT32, 0, NULL, NULL),
                code, text);
  tc_batch_t *b = NULL;
  TC_ASSERT_ERR(tc_batch_create(c, &b), code, text);
  TC_ASSERT(b == NULL);
  int me = 0;
  tc_comm_t *child = NULL;
  TC_ASSERT_ERR(tc_comm_split(c, &me, 1, "child", NULL, &child), code, text);
  TC_ASSERT(child == NULL);
}

/* ---- status codes and names ---- */

TC_TEST(validate_status_names_and_messages) {
  int seen = 0;
#define CHECK_STATUS(name, val, msg)                                           \
  TC_ASSERT_STR_EQ(tc_strerror(val), msg);                                     \
  TC_ASSERT_STR_EQ(tc_status_name(val), "TC_" #name);                          \
  TC_ASSERT_EQ(TC_##name, val);                                                \
  seen++;
  TC_STATUS_MAP(CHECK_STATUS)
#undef CHECK_STATUS
  TC_ASSERT_EQ(seen, 14);
  TC_ASSERT_STR_EQ(tc_strerror(TC_OK), "success");
  TC_ASSERT_STR_EQ(tc_status_name(TC_ERR_TIMEOUT), "TC_ERR_TIMEOUT");
  TC_ASSERT_STR_EQ(tc_strerror(1), "unknown status code");
  TC_ASSERT_STR_EQ(tc_strerror(-14), "unknown status code");
  TC_ASSERT_STR_EQ(tc_strerror(-999), "unknown status code");
  TC_ASSERT_STR_EQ(tc_status_name(-999), "TC_UNKNOWN");
  TC_ASSERT_STR_EQ(tc_status_name(7), "TC_UNKNOWN");
  /* dtype / redop / work-status tables and their invalid values */
  TC_ASSERT_EQ(tc_dtype_size(TC_FLOAT16), 2);
  TC_ASSERT_EQ(tc_dtype_size(TC_INT64), 8);
  TC_ASSERT_EQ(tc_dtype_size((tc_dtype_t)TC_DTYPE_COUNT), 0);
  TC_ASSERT_EQ(tc_dtype_size((tc_dtype_t)-1), 0);
  TC_ASSERT_STR_EQ(tc_dtype_name(TC_BFLOAT16), "bfloat16");
  TC_ASSERT_STR_EQ(tc_dtype_name((tc_dtype_t)99), "invalid");
  TC_ASSERT_STR_EQ(tc_redop_name(TC_PREMUL_SUM), "PREMUL_SUM");
  TC_ASSERT_STR_EQ(tc_redop_name((tc_redop_type_t)TC_REDOP_COUNT), "invalid");
  TC_ASSERT_STR_EQ(tc_work_status_name(TC_WORK_COMPLETED), "completed");
  TC_ASSERT_STR_EQ(tc_work_status_name(TC_WORK_TIMEDOUT), "timedout");
  TC_ASSERT_STR_EQ(tc_work_status_name(42), "invalid");
  TC_ASSERT_STR_EQ(tc_version(), TC_VERSION_STRING);
}

/* ---- NULL buffers ---- */

TC_TEST(validate_null_buffers) {
  tc_comm_t *c = comm1(NULL);
  float f[8] = {0};
  void *rl[1] = {f};
  const void *sl[1] = {f};
  size_t cnt[1] = {5};
  TC_ASSERT_ERR(tc_all_reduce(c, NULL, 7, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'buf' is NULL but the count is 7");
  TC_ASSERT_ERR(tc_broadcast(c, NULL, 3, TC_FLOAT32, 0, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "broadcast on 'main' (rank 0 of 1): argument 'buf' is NULL");
  TC_ASSERT_ERR(tc_reduce(c, NULL, 3, TC_INT32, TC_OP(TC_SUM), 0, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "reduce on 'main' (rank 0 of 1): argument 'buf' is NULL");
  /* the buffer is checked before the peer (0 is the caller itself) */
  TC_ASSERT_ERR(tc_send(c, NULL, 3, TC_FLOAT32, 0, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "send on 'main' (rank 0 of 1): argument 'buf' is NULL");
  TC_ASSERT_ERR(tc_recv(c, NULL, 3, TC_FLOAT32, 0, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "recv on 'main' (rank 0 of 1): argument 'buf' is NULL");
  TC_ASSERT_ERR(tc_all_gather(c, rl, NULL, 2, TC_FLOAT32, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "all_gather on 'main' (rank 0 of 1): argument 'sendbuf' is NULL");
  TC_ASSERT_ERR(tc_all_gather_v(c, rl, cnt, NULL, 5, TC_FLOAT32, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "all_gather_v on 'main' (rank 0 of 1): argument 'sendbuf' is NULL");
  TC_ASSERT_ERR(tc_all_gather_single(c, f, NULL, 2, TC_FLOAT32, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'sendbuf' is NULL but the count is 2");
  TC_ASSERT_ERR(tc_all_gather_single(c, NULL, f, 2, TC_FLOAT32, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'recvbuf' is NULL but the count is 2");
  TC_ASSERT_ERR(tc_reduce_scatter(c, NULL, sl, 2, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "reduce_scatter on 'main' (rank 0 of 1): argument 'recvbuf' is NULL");
  TC_ASSERT_ERR(tc_reduce_scatter_v(c, NULL, 5, sl, cnt, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "reduce_scatter_v on 'main' (rank 0 of 1): argument 'recvbuf' is NULL");
  TC_ASSERT_ERR(tc_reduce_scatter_single(c, f, NULL, 2, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "reduce_scatter_single on 'main' (rank 0 of 1): argument 'sendbuf' is NULL");
  TC_ASSERT_ERR(tc_reduce_scatter_single(c, NULL, f, 2, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'recvbuf' is NULL");
  TC_ASSERT_ERR(tc_all_to_all_single(c, f, NULL, 2, TC_FLOAT32, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "all_to_all_single on 'main' (rank 0 of 1): argument 'sendbuf' is NULL");
  TC_ASSERT_ERR(tc_all_to_all_single(c, NULL, f, 2, TC_FLOAT32, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'recvbuf' is NULL");
  TC_ASSERT_ERR(tc_all_to_all_v_single(c, NULL, cnt, f, cnt, TC_FLOAT32, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "all_to_all_v_single on 'main' (rank 0 of 1): argument 'recvbuf' is NULL but the count is 5");
  TC_ASSERT_ERR(tc_all_to_all_v_single(c, f, cnt, NULL, cnt, TC_FLOAT32, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'sendbuf' is NULL but the count is 5");
  TC_ASSERT_ERR(tc_scatter(c, NULL, sl, 2, TC_FLOAT32, 0, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "scatter on 'main' (rank 0 of 1): argument 'recvbuf' is NULL");
  TC_ASSERT_ERR(tc_gather(c, rl, NULL, 2, TC_FLOAT32, 0, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "gather on 'main' (rank 0 of 1): argument 'sendbuf' is NULL");
  TC_ASSERT_ERR(tc_gather_single(c, f, NULL, 2, TC_FLOAT32, 0, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "gather_single on 'main' (rank 0 of 1): argument 'sendbuf' is NULL");
  TC_ASSERT_ERR(tc_gather_single(c, NULL, f, 2, TC_FLOAT32, 0, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'recvbuf' is NULL");
  tc_batch_t *b = NULL;
  TC_ASSERT_OK(tc_batch_create(c, &b));
  TC_ASSERT_ERR(tc_batch_send(b, NULL, 2, TC_FLOAT32, 0), TC_ERR_INVALID_ARGUMENT,
                "batch.send on 'main' (rank 0 of 1): argument 'buf' is NULL");
  TC_ASSERT_ERR(tc_batch_recv(b, NULL, 2, TC_FLOAT32, 0), TC_ERR_INVALID_ARGUMENT,
                "batch.recv on 'main' (rank 0 of 1): argument 'buf' is NULL");
  TC_ASSERT_OK(tc_batch_free(b));
  /* NULL with a zero count is fine */
  TC_ASSERT_OK(tc_all_reduce(c, NULL, 0, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT_OK(tc_broadcast(c, NULL, 0, TC_INT8, 0, NULL, NULL));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

/* ---- counts that overflow ---- */

TC_TEST(validate_count_overflow) {
  tc_comm_t *c = comm1(NULL);
  float f[4] = {0};
  void *rl[1] = {f};
  const void *sl[1] = {f};
  size_t big[1] = {SIZE_MAX}, four[1] = {4};
  TC_ASSERT_ERR(tc_all_reduce(c, f, SIZE_MAX, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'count' = ");
  TC_ASSERT_CONTAINS(tc_last_error(), "elements of float32 overflows the addressable size");
  TC_ASSERT_ERR(tc_broadcast(c, f, SIZE_MAX / 4, TC_FLOAT64, 0, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "elements of float64 overflows");
  TC_ASSERT_ERR(tc_send(c, f, SIZE_MAX, TC_INT8, 0, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "send on 'main' (rank 0 of 1): argument 'count' = ");
  TC_ASSERT_ERR(tc_all_gather_single(c, f, f, SIZE_MAX, TC_INT16, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "overflows the addressable size");
  TC_ASSERT_ERR(tc_all_gather_v(c, rl, big, f, 4, TC_FLOAT32, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'recvcounts[0]' = ");
  TC_ASSERT_ERR(tc_reduce_scatter_v(c, f, SIZE_MAX, sl, big, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'recvcount' = ");
  TC_ASSERT_ERR(tc_all_to_all_v_single(c, f, big, f, four, TC_FLOAT32, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'recvcounts[0]' = ");
  TC_ASSERT_ERR(tc_all_to_all_v_single(c, f, four, f, big, TC_FLOAT32, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'sendcounts[0]' = ");
  TC_ASSERT_ERR(tc_all_to_all(c, rl, big, sl, four, TC_FLOAT32, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'recvcounts[0]' = ");
  TC_ASSERT_ERR(tc_scatter(c, f, sl, SIZE_MAX, TC_FLOAT32, 0, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "overflows");
  tc_batch_t *b = NULL;
  TC_ASSERT_OK(tc_batch_create(c, &b));
  TC_ASSERT_ERR(tc_batch_send(b, f, SIZE_MAX, TC_FLOAT32, 0),
                TC_ERR_INVALID_ARGUMENT, "batch.send on 'main' (rank 0 of 1): argument 'count' = ");
  TC_ASSERT_OK(tc_batch_free(b));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

/* ---- roots and peers out of range, self send/recv ---- */

TC_TEST(validate_root_and_peer_range) {
  tc_comm_t *c = comm1(NULL);
  float f[4] = {0};
  void *rl[1] = {f};
  const void *sl[1] = {f};
  TC_ASSERT_ERR(tc_broadcast(c, f, 4, TC_FLOAT32, -1, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'root' = -1 is out of range [0, 1)");
  TC_ASSERT_ERR(tc_broadcast(c, f, 4, TC_FLOAT32, 1, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'root' = 1 is out of range [0, 1)");
  TC_ASSERT_ERR(tc_reduce(c, f, 4, TC_FLOAT32, TC_OP(TC_SUM), 1, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "reduce on 'main' (rank 0 of 1): argument 'root' = 1");
  TC_ASSERT_ERR(tc_scatter(c, f, sl, 4, TC_FLOAT32, 5, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'root' = 5 is out of range");
  TC_ASSERT_ERR(tc_gather(c, rl, f, 4, TC_FLOAT32, -1, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "gather on 'main' (rank 0 of 1): argument 'root' = -1");
  TC_ASSERT_ERR(tc_gather_single(c, f, f, 4, TC_FLOAT32, 1, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'root' = 1 is out of range");
  TC_ASSERT_ERR(tc_send(c, f, 4, TC_FLOAT32, 1, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'peer' = 1 is out of range [0, 1)");
  TC_ASSERT_ERR(tc_recv(c, f, 4, TC_FLOAT32, -1, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'peer' = -1 is out of range [0, 1)");
  TC_ASSERT_ERR(tc_send(c, f, 4, TC_FLOAT32, 0, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                "argument 'peer' is the caller's own rank 0 (use a batch for self send/recv)");
  TC_ASSERT_ERR(tc_recv(c, f, 4, TC_FLOAT32, 0, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                "recv on 'main' (rank 0 of 1): argument 'peer' is the caller's own rank 0");
  tc_batch_t *b = NULL;
  TC_ASSERT_OK(tc_batch_create(c, &b));
  TC_ASSERT_ERR(tc_batch_send(b, f, 4, TC_FLOAT32, 1), TC_ERR_INVALID_ARGUMENT,
                "batch.send on 'main' (rank 0 of 1): argument 'peer' = 1 is out of range [0, 1)");
  TC_ASSERT_ERR(tc_batch_recv(b, f, 4, TC_FLOAT32, -3), TC_ERR_INVALID_ARGUMENT,
                "argument 'peer' = -3 is out of range");
  TC_ASSERT_OK(tc_batch_free(b));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

/* ---- lists ---- */

TC_TEST(validate_lists) {
  tc_comm_t *c = comm1(NULL);
  float f[4] = {0};
  void *rl[1] = {f}, *rnull[1] = {NULL};
  const void *sl[1] = {f}, *snull[1] = {NULL};
  size_t cnt[1] = {3}, zero[1] = {0};
  TC_ASSERT_ERR(tc_all_gather(c, NULL, f, 3, TC_FLOAT32, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                "all_gather on 'main' (rank 0 of 1): argument 'recvbufs' is NULL (a list of 1 buffers is required)");
  TC_ASSERT_ERR(tc_all_gather(c, rnull, f, 3, TC_FLOAT32, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                "argument 'recvbufs[0]' is NULL but its count is 3");
  TC_ASSERT_ERR(tc_all_gather_v(c, NULL, cnt, f, 3, TC_FLOAT32, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'recvbufs' is NULL");
  TC_ASSERT_ERR(tc_all_gather_v(c, rl, NULL, f, 3, TC_FLOAT32, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                "all_gather_v on 'main' (rank 0 of 1): argument 'recvcounts' is NULL (a list of 1 counts is required)");
  TC_ASSERT_ERR(tc_all_gather_v(c, rnull, cnt, f, 3, TC_FLOAT32, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'recvbufs[0]' is NULL but its count is 3");
  TC_ASSERT_ERR(tc_reduce_scatter(c, f, NULL, 3, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "reduce_scatter on 'main' (rank 0 of 1): argument 'sendbufs' is NULL");
  TC_ASSERT_ERR(tc_reduce_scatter(c, f, snull, 3, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'sendbufs[0]' is NULL but its count is 3");
  TC_ASSERT_ERR(tc_reduce_scatter_v(c, f, 3, sl, NULL, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'sendcounts' is NULL (a list of 1 counts is required)");
  TC_ASSERT_ERR(tc_reduce_scatter_v(c, f, 3, snull, cnt, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'sendbufs[0]' is NULL but its count is 3");
  TC_ASSERT_ERR(tc_all_to_all(c, NULL, cnt, sl, cnt, TC_FLOAT32, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "all_to_all on 'main' (rank 0 of 1): argument 'recvbufs' is NULL");
  TC_ASSERT_ERR(tc_all_to_all(c, rl, cnt, sl, NULL, TC_FLOAT32, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'sendcounts' is NULL");
  TC_ASSERT_ERR(tc_all_to_all(c, rl, cnt, snull, cnt, TC_FLOAT32, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'sendbufs[0]' is NULL but its count is 3");
  TC_ASSERT_ERR(tc_all_to_all_v_single(c, f, NULL, f, cnt, TC_FLOAT32, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'recvcounts' is NULL (a list of 1 counts is required)");
  TC_ASSERT_ERR(tc_all_to_all_v_single(c, f, cnt, f, NULL, TC_FLOAT32, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'sendcounts' is NULL");
  TC_ASSERT_ERR(tc_scatter(c, f, NULL, 3, TC_FLOAT32, 0, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "scatter on 'main' (rank 0 of 1): argument 'sendbufs' is NULL");
  TC_ASSERT_ERR(tc_scatter(c, f, snull, 3, TC_FLOAT32, 0, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'sendbufs[0]' is NULL");
  TC_ASSERT_ERR(tc_gather(c, NULL, f, 3, TC_FLOAT32, 0, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "gather on 'main' (rank 0 of 1): argument 'recvbufs' is NULL");
  TC_ASSERT_ERR(tc_gather(c, rnull, f, 3, TC_FLOAT32, 0, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'recvbufs[0]' is NULL but its count is 3");
  /* NULL entries with zero counts are fine */
  TC_ASSERT_OK(tc_all_gather(c, rnull, NULL, 0, TC_FLOAT32, NULL, NULL));
  TC_ASSERT_OK(tc_all_to_all(c, rnull, zero, snull, zero, TC_FLOAT32, NULL, NULL));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(validate_v_count_mismatch) {
  tc_comm_t *c = comm1(NULL);
  float f[8] = {0};
  void *rl[1] = {f};
  const void *sl[1] = {f};
  size_t four[1] = {4};
  TC_ASSERT_ERR(tc_all_gather_v(c, rl, four, f, 3, TC_FLOAT32, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                "all_gather_v on 'main' (rank 0 of 1): argument 'sendcount' = 3 differs from recvcounts[0] = 4");
  TC_ASSERT_ERR(tc_reduce_scatter_v(c, f, 3, sl, four, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL),
                TC_ERR_INVALID_ARGUMENT,
                "reduce_scatter_v on 'main' (rank 0 of 1): argument 'recvcount' = 3 differs from sendcounts[0] = 4");
  TC_ASSERT_ERR(tc_reduce_scatter_v(c, f, 5, sl, four, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'recvcount' = 5 differs from sendcounts[0] = 4");
  TC_ASSERT_OK(tc_comm_destroy(c));
}

/* ---- reductions and dtypes ---- */

TC_TEST(validate_redop_dtype) {
  tc_comm_t *c = comm1(NULL);
  double d[4] = {1, 2, 3, 4};
  const void *sl[1] = {d};
  static const tc_redop_type_t bitwise[] = {TC_BAND, TC_BOR, TC_BXOR};
  static const tc_dtype_t floats[] = {TC_FLOAT32, TC_FLOAT16, TC_BFLOAT16, TC_FLOAT64,
                                      TC_FLOAT8_E4M3FN, TC_FLOAT8_E5M2};
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 6; j++) {
      char want[256];
      snprintf(want, sizeof want,
               "all_reduce on 'main' (rank 0 of 1): reduction %s (argument "
               "'op') is not defined for dtype %s (bitwise reductions take "
               "integer or bool types)",
               tc_redop_name(bitwise[i]), tc_dtype_name(floats[j]));
      TC_ASSERT_ERR(tc_all_reduce(c, d, 2, floats[j], TC_OP(bitwise[i]), NULL, NULL),
                    TC_ERR_INVALID_ARGUMENT, want);
      snprintf(want, sizeof want, "reduction %s (argument 'op') is not defined for dtype %s",
               tc_redop_name(bitwise[i]), tc_dtype_name(floats[j]));
      TC_ASSERT_ERR(tc_reduce(c, d, 2, floats[j], TC_OP(bitwise[i]), 0, NULL, NULL),
                    TC_ERR_INVALID_ARGUMENT, want);
      TC_ASSERT_ERR(tc_reduce_scatter_single(c, d, d, 1, floats[j], TC_OP(bitwise[i]), NULL, NULL),
                    TC_ERR_INVALID_ARGUMENT, want);
      TC_ASSERT_ERR(tc_reduce_scatter(c, d, sl, 1, floats[j], TC_OP(bitwise[i]), NULL, NULL),
                    TC_ERR_INVALID_ARGUMENT, want);
    }
  /* the buffer is untouched by a refused operation */
  TC_ASSERT_DBL_NEAR(d[0], 1.0, 0);
  TC_ASSERT_DBL_NEAR(d[3], 4.0, 0);
  /* PREMUL_SUM: floating types only, finite factor */
  int32_t iv[2] = {3, 4};
  TC_ASSERT_ERR(tc_all_reduce(c, iv, 2, TC_INT32, TC_OP_PREMUL_SUM(2.0), NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "reduction PREMUL_SUM (argument 'op') is not defined for dtype int32");
  TC_ASSERT_ERR(tc_all_reduce(c, iv, 2, TC_INT64, TC_OP_PREMUL_SUM(2.0), NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "reduction PREMUL_SUM (argument 'op') is not defined for dtype int64");
  TC_ASSERT_EQ(iv[0], 3);
  uint8_t bv[2] = {1, 0};
  TC_ASSERT_ERR(tc_all_reduce(c, bv, 2, TC_BOOL, TC_OP_PREMUL_SUM(2.0), NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "reduction PREMUL_SUM (argument 'op') is not defined for dtype bool");
  /* AVG is not defined for bool either */
  TC_ASSERT_ERR(tc_all_reduce(c, bv, 2, TC_BOOL, TC_OP(TC_AVG), NULL, NULL),
                TC_ERR_INVALID_ARGUMENT,
                "all_reduce on 'main' (rank 0 of 1): reduction AVG (argument 'op') is not defined for dtype bool");
  TC_ASSERT_ERR(tc_all_reduce(c, d, 2, TC_FLOAT32, TC_OP_PREMUL_SUM(NAN), NULL, NULL),
                TC_ERR_INVALID_ARGUMENT,
                "all_reduce on 'main' (rank 0 of 1): PREMUL_SUM factor (argument 'op') is not finite");
  TC_ASSERT_ERR(tc_all_reduce(c, d, 2, TC_FLOAT64, TC_OP_PREMUL_SUM(INFINITY), NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "PREMUL_SUM factor (argument 'op') is not finite");
  TC_ASSERT_ERR(tc_reduce_scatter_single(c, d, d, 1, TC_FLOAT64, TC_OP_PREMUL_SUM(-INFINITY), NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "reduce_scatter_single on 'main' (rank 0 of 1): PREMUL_SUM factor");
  /* invalid enum values */
  tc_redop_t bad = {.type = (tc_redop_type_t)42, .factor = 1.0};
  TC_ASSERT_ERR(tc_all_reduce(c, d, 2, TC_FLOAT32, bad, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                "all_reduce on 'main' (rank 0 of 1): argument 'op' = 42 is not a tc_redop_type_t");
  bad.type = TC_REDOP_COUNT;
  TC_ASSERT_ERR(tc_reduce(c, d, 2, TC_FLOAT32, bad, 0, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                "is not a tc_redop_type_t");
  bad.type = (tc_redop_type_t)-1;
  TC_ASSERT_ERR(tc_reduce_scatter_single(c, d, d, 1, TC_FLOAT32, bad, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "is not a tc_redop_type_t");
  TC_ASSERT_ERR(tc_all_reduce(c, d, 2, (tc_dtype_t)99, TC_OP(TC_SUM), NULL, NULL),
                TC_ERR_INVALID_ARGUMENT,
                "all_reduce on 'main' (rank 0 of 1): argument 'dtype' = 99 is not a tc_dtype_t");
  TC_ASSERT_ERR(tc_broadcast(c, d, 2, (tc_dtype_t)TC_DTYPE_COUNT, 0, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "is not a tc_dtype_t");
  TC_ASSERT_ERR(tc_send(c, d, 2, (tc_dtype_t)-1, 0, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                "send on 'main' (rank 0 of 1): argument 'dtype' = -1 is not a tc_dtype_t");
  void *rl[1] = {d};
  TC_ASSERT_ERR(tc_all_gather(c, rl, d, 1, (tc_dtype_t)1000, NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'dtype' = 1000 is not a tc_dtype_t");
  tc_batch_t *b = NULL;
  TC_ASSERT_OK(tc_batch_create(c, &b));
  TC_ASSERT_ERR(tc_batch_recv(b, d, 1, (tc_dtype_t)77, 0), TC_ERR_INVALID_ARGUMENT,
                "batch.recv on 'main' (rank 0 of 1): argument 'dtype' = 77 is not a tc_dtype_t");
  TC_ASSERT_OK(tc_batch_free(b));
  /* allowed combinations pass: bitwise on integers and bool */
  int32_t x[3] = {5, 6, 7};
  TC_ASSERT_OK(tc_all_reduce(c, x, 3, TC_INT32, TC_OP(TC_BXOR), NULL, NULL));
  TC_ASSERT_EQ(x[2], 7);
  uint8_t bl[2] = {1, 0};
  TC_ASSERT_OK(tc_all_reduce(c, bl, 2, TC_BOOL, TC_OP(TC_BAND), NULL, NULL));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

/* ---- options ---- */

TC_TEST(validate_op_options) {
  tc_comm_t *c = comm1(NULL);
  float f[2] = {1, 2};
  tc_op_options_t o = TC_OP_OPTIONS_INIT;
  o.size = 0;
  TC_ASSERT_ERR(tc_all_reduce(c, f, 2, TC_FLOAT32, TC_OP(TC_SUM), &o, NULL), TC_ERR_INVALID_ARGUMENT,
                "all_reduce on 'main' (rank 0 of 1): argument 'opts' has size 0 version 1 (initialise it with TC_OP_OPTIONS_INIT)");
  o = (tc_op_options_t)TC_OP_OPTIONS_INIT;
  o.version = 0;
  TC_ASSERT_ERR(tc_barrier(c, &o, NULL), TC_ERR_INVALID_ARGUMENT, "argument 'opts' has size");
  o.version = TC_OP_OPTIONS_VERSION + 1;
  TC_ASSERT_ERR(tc_broadcast(c, f, 2, TC_FLOAT32, 0, &o, NULL), TC_ERR_INVALID_ARGUMENT,
                "(initialise it with TC_OP_OPTIONS_INIT)");
  o = (tc_op_options_t)TC_OP_OPTIONS_INIT;
  o.timeout_s = NAN;
  TC_ASSERT_ERR(tc_all_reduce(c, f, 2, TC_FLOAT32, TC_OP(TC_SUM), &o, NULL), TC_ERR_INVALID_ARGUMENT,
                "all_reduce on 'main' (rank 0 of 1): option 'timeout_s' is not a finite number");
  o.timeout_s = INFINITY;
  TC_ASSERT_ERR(tc_barrier(c, &o, NULL), TC_ERR_INVALID_ARGUMENT, "option 'timeout_s' is not a finite number");
  o = (tc_op_options_t)TC_OP_OPTIONS_INIT;
  o.num_hints = 2;
  TC_ASSERT_ERR(tc_all_reduce(c, f, 2, TC_FLOAT32, TC_OP(TC_SUM), &o, NULL), TC_ERR_INVALID_ARGUMENT,
                "option 'hints' is NULL but num_hints is 2");
  tc_hint_t hints[2] = {{"k", "v"}, {NULL, "v"}};
  o.hints = hints;
  TC_ASSERT_ERR(tc_all_reduce(c, f, 2, TC_FLOAT32, TC_OP(TC_SUM), &o, NULL), TC_ERR_INVALID_ARGUMENT,
                "option hint 1 has a NULL key or value");
  hints[1] = (tc_hint_t){"k2", NULL};
  tc_batch_t *b = NULL;
  TC_ASSERT_OK(tc_batch_create(c, &b));
  TC_ASSERT_ERR(tc_batch_issue(b, &o, NULL), TC_ERR_INVALID_ARGUMENT,
                "batch_op_issue on 'main' (rank 0 of 1): option hint 1 has a NULL key or value");
  TC_ASSERT_OK(tc_batch_free(b));
  int me = 0;
  tc_comm_t *child = (tc_comm_t *)&me;
  TC_ASSERT_ERR(tc_comm_split(c, &me, 1, "child", &o, &child), TC_ERR_INVALID_ARGUMENT,
                "option hint 1 has a NULL key or value");
  TC_ASSERT(child == NULL);
  /* valid options pass: hints, a negative timeout (= the communicator's) */
  hints[1] = (tc_hint_t){"k2", "v2"};
  o.timeout_s = -1;
  TC_ASSERT_OK(tc_all_reduce(c, f, 2, TC_FLOAT32, TC_OP(TC_SUM), &o, NULL));
  o.timeout_s = 5;
  TC_ASSERT_OK(tc_barrier(c, &o, NULL));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(validate_comm_options) {
  clear_env();
  tc_comm_t *c = (tc_comm_t *)&c; /* must be reset to NULL on failure */
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.rank = 0;
  o.world_size = 1;
  TC_ASSERT_ERR(tc_comm_create("cpu", "cpu", &o, NULL), TC_ERR_INVALID_ARGUMENT,
                "torchcomms: tc_comm_create: argument 'out' is NULL");
  o.size = 0;
  TC_ASSERT_ERR(tc_comm_create("cpu", "cpu", &o, &c), TC_ERR_INVALID_ARGUMENT,
                "tc_comm_create: options have size 0 version 2; initialise them with TC_COMM_OPTIONS_INIT");
  TC_ASSERT(c == NULL);
  o.size = sizeof o;
  o.version = 99;
  TC_ASSERT_ERR(tc_comm_create("cpu", "cpu", &o, &c), TC_ERR_INVALID_ARGUMENT, "version 99");
  o.version = TC_COMM_OPTIONS_VERSION;
  o.timeout_s = NAN;
  TC_ASSERT_ERR(tc_comm_create("cpu", "cpu", &o, &c), TC_ERR_INVALID_ARGUMENT,
                "option 'timeout_s' must be >= 0 (0 = default)");
  o.timeout_s = -2;
  TC_ASSERT_ERR(tc_comm_create("cpu", "cpu", &o, &c), TC_ERR_INVALID_ARGUMENT,
                "option 'timeout_s' must be >= 0");
  o.timeout_s = 0;
  o.num_hints = 3;
  TC_ASSERT_ERR(tc_comm_create("cpu", "cpu", &o, &c), TC_ERR_INVALID_ARGUMENT,
                "tc_comm_create: 'hints' is NULL but num_hints is 3");
  TC_ASSERT(c == NULL);
  tc_hint_t hints[1] = {{"key", NULL}};
  o.hints = hints;
  o.num_hints = 1;
  TC_ASSERT_ERR(tc_comm_create("cpu", "cpu", &o, &c), TC_ERR_INVALID_ARGUMENT,
                "hint 0 has a NULL key or value");
  o.hints = NULL;
  o.num_hints = 0;
  o.name = "";
  TC_ASSERT_ERR(tc_comm_create("cpu", "cpu", &o, &c), TC_ERR_INVALID_ARGUMENT,
                "option 'name' must be 1..127 characters without '/'");
  o.name = "a/b";
  TC_ASSERT_ERR(tc_comm_create("cpu", "cpu", &o, &c), TC_ERR_INVALID_ARGUMENT,
                "option 'name' must be");
  char longname[200];
  memset(longname, 'x', sizeof longname - 1);
  longname[sizeof longname - 1] = 0;
  o.name = longname;
  TC_ASSERT_ERR(tc_comm_create("cpu", "cpu", &o, &c), TC_ERR_INVALID_ARGUMENT,
                "option 'name' must be");
  o.name = NULL;
  /* rank >= world_size */
  o.rank = 1;
  TC_ASSERT_ERR(tc_comm_create("cpu", "cpu", &o, &c), TC_ERR_INVALID_ARGUMENT,
                "tc_comm_create: option 'rank' 1 is out of range for world_size 1");
  o.rank = 7;
  o.world_size = 4;
  TC_ASSERT_ERR(tc_comm_create("cpu", "cpu", &o, &c), TC_ERR_INVALID_ARGUMENT,
                "option 'rank' 7 is out of range for world_size 4");
  TC_ASSERT(c == NULL);
  /* a working communicator: set_timeout and get_options misuse */
  o.rank = 0;
  o.world_size = 1;
  TC_ASSERT_OK(tc_comm_create("cpu", "cpu", &o, &c));
  TC_ASSERT_ERR(tc_comm_set_timeout(c, NAN), TC_ERR_INVALID_ARGUMENT,
                "tc_comm_set_timeout on 'main' (rank 0 of 1): argument 'timeout_s' must be a positive number of seconds");
  TC_ASSERT_ERR(tc_comm_set_timeout(c, 0), TC_ERR_INVALID_ARGUMENT, "must be a positive number");
  TC_ASSERT_ERR(tc_comm_set_timeout(c, -5), TC_ERR_INVALID_ARGUMENT, "must be a positive number");
  TC_ASSERT_ERR(tc_comm_set_timeout(c, INFINITY), TC_ERR_INVALID_ARGUMENT, "must be a positive number");
  TC_ASSERT_ERR(tc_comm_get_options(c, NULL), TC_ERR_INVALID_ARGUMENT,
                "tc_comm_get_options: argument 'out' is NULL");
  TC_ASSERT_ERR(tc_batch_create(c, NULL), TC_ERR_INVALID_ARGUMENT,
                "batch_op_create on 'main' (rank 0 of 1): argument 'out' is NULL");
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(validate_backend_names) {
  clear_env();
  tc_comm_t *c = NULL;
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.rank = 0;
  o.world_size = 1;
  TC_ASSERT_ERR(tc_comm_create("nosuch", "cpu", &o, &c), TC_ERR_BACKEND_NOT_FOUND,
                "torchcomms: backend 'nosuch' not found: tried ");
  TC_ASSERT_CONTAINS(tc_last_error(), "$TORCHCOMMS_BACKEND_LIB_PATH_NOSUCH (unset)");
  TC_ASSERT_CONTAINS(tc_last_error(), "set TORCHCOMMS_BACKEND_LIB_PATH_NOSUCH to the path of libtorchcomms-nosuch.so");
  TC_ASSERT_CONTAINS(tc_last_error(), "the built-in backends (cpu");
  TC_ASSERT(c == NULL);
  /* '-' becomes '_' in the variable's name */
  TC_ASSERT_ERR(tc_comm_create("no-such-backend", "cpu", &o, &c), TC_ERR_BACKEND_NOT_FOUND,
                "TORCHCOMMS_BACKEND_LIB_PATH_NO_SUCH_BACKEND");
  TC_ASSERT_ERR(tc_comm_create(NULL, "cpu", &o, &c), TC_ERR_INVALID_ARGUMENT,
                "tc_comm_create: argument 'backend' is NULL");
  TC_ASSERT_ERR(tc_comm_create("CPU", "cpu", &o, &c), TC_ERR_INVALID_ARGUMENT,
                "tc_comm_create: backend name 'CPU' is invalid (lower-case letters, digits, '_' and '-')");
  TC_ASSERT_ERR(tc_comm_create("../cpu", "cpu", &o, &c), TC_ERR_INVALID_ARGUMENT,
                "backend name '../cpu' is invalid");
  TC_ASSERT_ERR(tc_comm_create("", "cpu", &o, &c), TC_ERR_INVALID_ARGUMENT,
                "backend name '' is invalid");
  TC_ASSERT_ERR(tc_comm_create("a b", "cpu", &o, &c), TC_ERR_INVALID_ARGUMENT,
                "is invalid");
  TC_ASSERT(c == NULL);
}

/* ---- no store ---- */

TC_TEST(validate_master_addr_unset) {
  clear_env();
  tc_comm_t *c = NULL;
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.rank = 0;
  o.world_size = 2;
  TC_ASSERT_ERR(tc_comm_create("cpu", "cpu", &o, &c), TC_ERR_INVALID_USAGE,
                "MASTER_ADDR and MASTER_PORT are not set");
  TC_ASSERT_CONTAINS(tc_last_error(), "tc_comm_create (rank 0 of 2): no store");
  TC_ASSERT(c == NULL);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "notaport", 1);
  TC_ASSERT_ERR(tc_comm_create("cpu", "cpu", &o, &c), TC_ERR_INVALID_ARGUMENT,
                "MASTER_PORT='notaport' is not a port number");
  setenv("MASTER_PORT", "70000", 1);
  TC_ASSERT_ERR(tc_comm_create("cpu", "cpu", &o, &c), TC_ERR_INVALID_ARGUMENT,
                "MASTER_PORT='70000' is not a port number");
  TC_ASSERT(c == NULL);
}

/* ---- lifecycle ---- */

TC_TEST(validate_finalized_comm) {
  tc_comm_t *c = comm1(NULL);
  tc_batch_t *b = NULL;
  TC_ASSERT_OK(tc_batch_create(c, &b));
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_finalize(c)); /* twice is harmless */
  check_every_call(c, TC_ERR_INVALID_USAGE, "finalized");
  TC_ASSERT_ERR(tc_all_reduce(c, NULL, 0, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL),
                TC_ERR_INVALID_USAGE,
                "all_reduce on 'main' (rank 0 of 1): the communicator was finalized (create a new one)");
  int32_t x = 1;
  TC_ASSERT_OK(tc_batch_send(b, &x, 1, TC_INT32, 0)); /* posting is local */
  TC_ASSERT_ERR(tc_batch_issue(b, NULL, NULL), TC_ERR_INVALID_USAGE,
                "batch_op_issue on 'main' (rank 0 of 1): the communicator was finalized");
  TC_ASSERT_OK(tc_batch_free(b));
  /* the handle stays valid: getters work */
  TC_ASSERT_EQ(tc_comm_rank(c), 0);
  TC_ASSERT_EQ(tc_comm_size(c), 1);
  TC_ASSERT_STR_EQ(tc_comm_name(c), "main");
  TC_ASSERT_STR_EQ(tc_comm_backend(c), "cpu");
  TC_ASSERT_EQ(tc_comm_is_aborted(c), 0);
  TC_ASSERT_CONTAINS(tc_comm_last_error(c), "finalized");
  TC_ASSERT_OK(tc_comm_abort(c)); /* no effect after finalize */
  TC_ASSERT_EQ(tc_comm_is_aborted(c), 0);
  TC_ASSERT_ERR(tc_barrier(c, NULL, NULL), TC_ERR_INVALID_USAGE, "finalized");
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(validate_aborted_comm) {
  tc_comm_t *c = comm1(NULL);
  tc_batch_t *b = NULL;
  TC_ASSERT_OK(tc_batch_create(c, &b));
  TC_ASSERT_EQ(tc_comm_is_aborted(c), 0);
  TC_ASSERT_OK(tc_comm_abort(c));
  TC_ASSERT_EQ(tc_comm_is_aborted(c), 1);
  TC_ASSERT_OK(tc_comm_abort(c)); /* abort is idempotent */
  check_every_call(c, TC_ERR_ABORTED, "aborted");
  TC_ASSERT_ERR(tc_barrier(c, NULL, NULL), TC_ERR_ABORTED,
                "barrier on 'main' (rank 0 of 1): the communicator was aborted (create a new one)");
  TC_ASSERT_ERR(tc_batch_issue(b, NULL, NULL), TC_ERR_ABORTED,
                "batch_op_issue on 'main' (rank 0 of 1): the communicator was aborted");
  TC_ASSERT_OK(tc_batch_free(b));
  TC_ASSERT_OK(tc_comm_finalize(c)); /* nothing left to finalize */
  TC_ASSERT_EQ(tc_comm_is_aborted(c), 1);
  TC_ASSERT_ERR(tc_barrier(c, NULL, NULL), TC_ERR_ABORTED, "aborted");
  TC_ASSERT_EQ(tc_comm_rank(c), 0);
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(validate_destroyed_comm) {
  tc_comm_t *c = comm1(NULL);
  TC_ASSERT_OK(tc_comm_destroy(c));
  check_every_call(c, TC_ERR_INVALID_USAGE, "the communicator handle was destroyed");
  TC_ASSERT_ERR(tc_all_reduce(c, NULL, 0, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL),
                TC_ERR_INVALID_USAGE, "torchcomms: all_reduce: the communicator handle was destroyed");
  TC_ASSERT_ERR(tc_comm_destroy(c), TC_ERR_INVALID_USAGE,
                "torchcomms: tc_comm_destroy: the communicator handle was destroyed");
  TC_ASSERT_ERR(tc_comm_finalize(c), TC_ERR_INVALID_USAGE, "destroyed");
  TC_ASSERT_ERR(tc_comm_abort(c), TC_ERR_INVALID_USAGE, "destroyed");
  TC_ASSERT_ERR(tc_comm_set_timeout(c, 1.0), TC_ERR_INVALID_USAGE, "destroyed");
  tc_comm_options_t o;
  TC_ASSERT_ERR(tc_comm_get_options(c, &o), TC_ERR_INVALID_USAGE, "destroyed");
  TC_ASSERT_EQ(tc_comm_rank(c), -1);
  TC_ASSERT_EQ(tc_comm_size(c), -1);
  TC_ASSERT(tc_comm_name(c) == NULL);
  TC_ASSERT(tc_comm_backend(c) == NULL);
  TC_ASSERT(tc_comm_backend_version(c) == NULL);
  TC_ASSERT(tc_comm_device(c) == NULL);
  TC_ASSERT_STR_EQ(tc_comm_last_error(c), "");
  TC_ASSERT_EQ(tc_comm_is_aborted(c), 0);
  /* a new communicator works after a destroyed one */
  tc_comm_t *c2 = comm1(NULL);
  TC_ASSERT_OK(tc_barrier(c2, NULL, NULL));
  TC_ASSERT_OK(tc_comm_destroy(c2));
}

TC_TEST(validate_null_and_foreign_comm) {
  check_every_call(NULL, TC_ERR_INVALID_ARGUMENT, "argument 'comm' is NULL");
  TC_ASSERT_ERR(tc_comm_finalize(NULL), TC_ERR_INVALID_ARGUMENT,
                "torchcomms: tc_comm_finalize: argument 'comm' is NULL");
  TC_ASSERT_ERR(tc_comm_abort(NULL), TC_ERR_INVALID_ARGUMENT, "argument 'comm' is NULL");
  TC_ASSERT_ERR(tc_comm_destroy(NULL), TC_ERR_INVALID_ARGUMENT, "argument 'comm' is NULL");
  TC_ASSERT_EQ(tc_comm_rank(NULL), -1);
  TC_ASSERT(tc_comm_name(NULL) == NULL);
  TC_ASSERT_STR_EQ(tc_comm_last_error(NULL), "");

  /* some other struct, zeroed or not, cast to a handle */
  struct {
    uint64_t words[256];
  } junk;
  memset(&junk, 0x5a, sizeof junk);
  tc_comm_t *fc = (tc_comm_t *)&junk;
  check_every_call(fc, TC_ERR_INVALID_USAGE, "argument 'comm' is not a communicator handle");
  TC_ASSERT_ERR(tc_barrier(fc, NULL, NULL), TC_ERR_INVALID_USAGE,
                "torchcomms: barrier: argument 'comm' is not a communicator handle");
  TC_ASSERT_ERR(tc_comm_destroy(fc), TC_ERR_INVALID_USAGE, "not a communicator handle");
  TC_ASSERT_ERR(tc_comm_finalize(fc), TC_ERR_INVALID_USAGE, "not a communicator handle");
  TC_ASSERT_EQ(tc_comm_size(fc), -1);
  memset(&junk, 0, sizeof junk);
  TC_ASSERT_ERR(tc_comm_abort(fc), TC_ERR_INVALID_USAGE, "not a communicator handle");

  tc_work_t *fw = (tc_work_t *)&junk;
  int done = 0;
  TC_ASSERT_ERR(tc_work_wait(fw), TC_ERR_INVALID_USAGE,
                "torchcomms: tc_work_wait: argument 'work' is not a work handle");
  TC_ASSERT_ERR(tc_work_wait_for(fw, 1.0), TC_ERR_INVALID_USAGE, "not a work handle");
  TC_ASSERT_ERR(tc_work_test(fw, &done), TC_ERR_INVALID_USAGE, "not a work handle");
  TC_ASSERT_ERR(tc_work_release(fw), TC_ERR_INVALID_USAGE, "not a work handle");
  TC_ASSERT_EQ(tc_work_status(fw), -1);
  TC_ASSERT_STR_EQ(tc_work_error(fw), "");

  tc_batch_t *fb = (tc_batch_t *)&junk;
  int32_t x = 0;
  TC_ASSERT_ERR(tc_batch_send(fb, &x, 1, TC_INT32, 0), TC_ERR_INVALID_USAGE,
                "torchcomms: batch.send: argument 'batch' is not a live batch handle");
  TC_ASSERT_ERR(tc_batch_issue(fb, NULL, NULL), TC_ERR_INVALID_USAGE, "not a live batch handle");
  TC_ASSERT_ERR(tc_batch_free(fb), TC_ERR_INVALID_USAGE, "not a live batch handle");
  TC_ASSERT_ERR(tc_batch_recv(NULL, &x, 1, TC_INT32, 0), TC_ERR_INVALID_ARGUMENT,
                "torchcomms: batch.recv: argument 'batch' is NULL");
  TC_ASSERT_ERR(tc_batch_free(NULL), TC_ERR_INVALID_ARGUMENT, "argument 'batch' is NULL");

  /* real handles of the wrong kind */
  tc_comm_t *c = comm1(NULL);
  tc_work_t *w = NULL;
  TC_ASSERT_OK(tc_barrier(c, NULL, &w));
  TC_ASSERT_ERR(tc_barrier((tc_comm_t *)w, NULL, NULL), TC_ERR_INVALID_USAGE,
                "not a communicator handle");
  TC_ASSERT_ERR(tc_work_wait((tc_work_t *)c), TC_ERR_INVALID_USAGE, "not a work handle");
  tc_batch_t *b = NULL;
  TC_ASSERT_OK(tc_batch_create(c, &b));
  TC_ASSERT_ERR(tc_batch_issue((tc_batch_t *)c, NULL, NULL), TC_ERR_INVALID_USAGE,
                "not a live batch handle");
  TC_ASSERT_ERR(tc_work_wait((tc_work_t *)b), TC_ERR_INVALID_USAGE, "not a work handle");
  TC_ASSERT_OK(tc_batch_free(b));
  TC_ASSERT_OK(tc_work_wait(w));
  TC_ASSERT_OK(tc_work_release(w));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(validate_work_handles) {
  tc_comm_t *c = comm1(NULL);
  int done = -1;
  TC_ASSERT_ERR(tc_work_wait(NULL), TC_ERR_INVALID_ARGUMENT,
                "torchcomms: tc_work_wait: argument 'work' is NULL");
  TC_ASSERT_ERR(tc_work_wait_for(NULL, 1), TC_ERR_INVALID_ARGUMENT, "argument 'work' is NULL");
  TC_ASSERT_ERR(tc_work_test(NULL, &done), TC_ERR_INVALID_ARGUMENT, "argument 'work' is NULL");
  TC_ASSERT_ERR(tc_work_release(NULL), TC_ERR_INVALID_ARGUMENT,
                "tc_work_release: argument 'work' is NULL");
  TC_ASSERT_EQ(tc_work_status(NULL), -1);
  TC_ASSERT_STR_EQ(tc_work_error(NULL), "");

  float f[3] = {1, 2, 3};
  tc_work_t *w = NULL;
  TC_ASSERT_OK(tc_all_reduce(c, f, 3, TC_FLOAT32, TC_OP(TC_SUM), NULL, &w));
  TC_ASSERT(w != NULL);
  TC_ASSERT_ERR(tc_work_test(w, NULL), TC_ERR_INVALID_ARGUMENT,
                "tc_work_test: argument 'done' is NULL");
  TC_ASSERT_ERR(tc_work_wait_for(w, -1), TC_ERR_INVALID_ARGUMENT,
                "tc_work_wait_for: argument 'timeout_s' must be >= 0");
  TC_ASSERT_ERR(tc_work_wait_for(w, NAN), TC_ERR_INVALID_ARGUMENT, "must be >= 0");
  TC_ASSERT_OK(tc_work_wait(w));
  TC_ASSERT_OK(tc_work_wait(w)); /* waiting again is fine */
  TC_ASSERT_EQ(tc_work_status(w), TC_WORK_COMPLETED);
  TC_ASSERT_OK(tc_work_release(w));
  /* released: every call reports it (no operation issued in between, so the
   * pooled object is not reused yet) */
  TC_ASSERT_ERR(tc_work_wait(w), TC_ERR_INVALID_USAGE,
                "torchcomms: tc_work_wait: the work handle was already released");
  TC_ASSERT_ERR(tc_work_release(w), TC_ERR_INVALID_USAGE,
                "tc_work_release: the work handle was already released");
  TC_ASSERT_ERR(tc_work_test(w, &done), TC_ERR_INVALID_USAGE, "already released");
  TC_ASSERT_ERR(tc_work_wait_for(w, 0.1), TC_ERR_INVALID_USAGE, "already released");
  TC_ASSERT_EQ(tc_work_status(w), -1);
  TC_ASSERT_STR_EQ(tc_work_error(w), "");
  TC_ASSERT_OK(tc_comm_destroy(c));
}

/* ---- split ---- */

TC_TEST(validate_split_world1) {
  tc_comm_t *c = comm1(NULL);
  tc_comm_t *child = (tc_comm_t *)&child;
  int r[2] = {1, 0};
  TC_ASSERT_ERR(tc_comm_split(c, r, 1, "g", NULL, &child), TC_ERR_INVALID_ARGUMENT,
                "tc_comm_split on 'main' (rank 0 of 1): ranks[0] = 1 is out of range [0, 1)");
  TC_ASSERT(child == NULL);
  r[0] = -1;
  TC_ASSERT_ERR(tc_comm_split(c, r, 1, "g", NULL, &child), TC_ERR_INVALID_ARGUMENT,
                "ranks[0] = -1 is out of range [0, 1)");
  r[0] = 0;
  TC_ASSERT_ERR(tc_comm_split(c, r, 2, "g", NULL, &child), TC_ERR_INVALID_ARGUMENT,
                "rank 0 appears twice in 'ranks' (duplicate ranks found in ranks list)");
  TC_ASSERT_ERR(tc_comm_split(c, NULL, 1, "g", NULL, &child), TC_ERR_INVALID_ARGUMENT,
                "argument 'ranks' is NULL but nranks is 1");
  TC_ASSERT_ERR(tc_comm_split(c, r, 1, NULL, NULL, &child), TC_ERR_INVALID_ARGUMENT,
                "argument 'name' must be 1..127 characters without '/'");
  TC_ASSERT_ERR(tc_comm_split(c, r, 1, "", NULL, &child), TC_ERR_INVALID_ARGUMENT,
                "argument 'name' must be");
  TC_ASSERT_ERR(tc_comm_split(c, r, 1, "x/y", NULL, &child), TC_ERR_INVALID_ARGUMENT,
                "argument 'name' must be");
  TC_ASSERT_ERR(tc_comm_split(c, r, 1, "g", NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                "tc_comm_split on 'main' (rank 0 of 1): argument 'out' is NULL");
  tc_op_options_t o = TC_OP_OPTIONS_INIT;
  o.size = 3;
  TC_ASSERT_ERR(tc_comm_split(c, r, 1, "g", &o, &child), TC_ERR_INVALID_ARGUMENT,
                "argument 'opts' has size 3");
  TC_ASSERT(child == NULL);
  /* the communicator is still usable after the refused splits */
  TC_ASSERT_OK(tc_comm_split(c, r, 1, "g", NULL, &child));
  TC_ASSERT(child != NULL);
  TC_ASSERT_OK(tc_barrier(child, NULL, NULL));
  TC_ASSERT_OK(tc_comm_destroy(child));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

static void split_p2p_rank(tc_ctx_t *ctx) {
  tc_comm_t *c = tc_ctx_comm(ctx, "main", NULL);
  int me = ctx->rank, other = 1 - me;
  tc_comm_t *child = NULL;
  char want[256];
  int dup[2] = {me, me};
  snprintf(want, sizeof want,
           "tc_comm_split on 'main' (rank %d of 2): rank %d appears twice in 'ranks'", me, me);
  TC_ASSERT_ERR(tc_comm_split(c, dup, 2, "g", NULL, &child), TC_ERR_INVALID_ARGUMENT, want);
  snprintf(want, sizeof want,
           "'ranks' does not contain the caller's rank %d (pass an empty list to join no group)", me);
  TC_ASSERT_ERR(tc_comm_split(c, &other, 1, "g", NULL, &child), TC_ERR_INVALID_ARGUMENT, want);
  int oor[2] = {me, 2};
  TC_ASSERT_ERR(tc_comm_split(c, oor, 2, "g", NULL, &child), TC_ERR_INVALID_ARGUMENT,
                "ranks[1] = 2 is out of range [0, 2)");
  TC_ASSERT(child == NULL);
  /* self send/recv in a real 2-rank communicator */
  int32_t x[2] = {1, 2};
  snprintf(want, sizeof want, "send on 'main' (rank %d of 2): argument 'peer' is the caller's own rank %d", me, me);
  TC_ASSERT_ERR(tc_send(c, x, 2, TC_INT32, me, NULL, NULL), TC_ERR_INVALID_ARGUMENT, want);
  TC_ASSERT_ERR(tc_recv(c, x, 2, TC_INT32, me, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                "is the caller's own rank");
  TC_ASSERT_ERR(tc_send(c, x, 2, TC_INT32, 2, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                "argument 'peer' = 2 is out of range [0, 2)");
  tc_batch_t *b = NULL;
  TC_ASSERT_OK(tc_batch_create(c, &b));
  TC_ASSERT_OK(tc_batch_send(b, x, 2, TC_INT32, me));
  TC_ASSERT_ERR(tc_batch_issue(b, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                "self send #0 has no matching self recv in the batch");
  TC_ASSERT_OK(tc_batch_free(b));
  /* two ranks passing different lists for one group: both are told */
  int mine[2] = {me, other};
  TC_ASSERT_ERR(tc_comm_split(c, mine, 2, "g", NULL, &child), TC_ERR_INVALID_ARGUMENT,
                "passed a different rank list");
  TC_ASSERT(child == NULL);
  /* a valid split afterwards still works */
  int both[2] = {0, 1};
  TC_ASSERT_OK(tc_comm_split(c, both, 2, "g", NULL, &child));
  TC_ASSERT_EQ(tc_comm_rank(child), me);
  TC_ASSERT_EQ(tc_comm_size(child), 2);
  int64_t v = me + 1;
  TC_ASSERT_OK(tc_all_reduce(child, &v, 1, TC_INT64, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT_EQ(v, 3);
  TC_ASSERT_OK(tc_comm_finalize(child));
  TC_ASSERT_OK(tc_comm_destroy(child));
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(validate_split_and_p2p_two_ranks) { tc_spawn(2, split_p2p_rank, NULL, 60); }

/* ---- batch self send/recv ---- */

TC_TEST(validate_batch_self_matching) {
  tc_comm_t *c = comm1(NULL);
  int32_t a[4] = {1, 2, 3, 4}, r[4] = {0};
  tc_batch_t *b = NULL;
  TC_ASSERT_OK(tc_batch_create(c, &b));
  TC_ASSERT_OK(tc_batch_send(b, a, 4, TC_INT32, 0));
  TC_ASSERT_ERR(tc_batch_issue(b, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                "batch_op_issue on 'main' (rank 0 of 1): self send #0 has no matching self recv in the batch");
  TC_ASSERT_OK(tc_batch_free(b));

  TC_ASSERT_OK(tc_batch_create(c, &b));
  TC_ASSERT_OK(tc_batch_recv(b, r, 4, TC_INT32, 0));
  TC_ASSERT_ERR(tc_batch_issue(b, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                "self recv #0 has no matching self send in the batch");
  TC_ASSERT_OK(tc_batch_free(b));

  TC_ASSERT_OK(tc_batch_create(c, &b));
  TC_ASSERT_OK(tc_batch_send(b, a, 4, TC_INT32, 0));
  TC_ASSERT_OK(tc_batch_recv(b, r, 3, TC_INT32, 0));
  TC_ASSERT_ERR(tc_batch_issue(b, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                "self send #0 has 16 bytes but its matching recv has 12");
  TC_ASSERT_OK(tc_batch_free(b));

  /* two sends, one recv: the second send is unmatched */
  TC_ASSERT_OK(tc_batch_create(c, &b));
  TC_ASSERT_OK(tc_batch_send(b, a, 2, TC_INT32, 0));
  TC_ASSERT_OK(tc_batch_send(b, a + 2, 2, TC_INT32, 0));
  TC_ASSERT_OK(tc_batch_recv(b, r, 2, TC_INT32, 0));
  TC_ASSERT_ERR(tc_batch_issue(b, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                "self send #1 has no matching self recv");
  TC_ASSERT_OK(tc_batch_free(b));
  TC_ASSERT_EQ(r[0], 0); /* nothing moved */

  /* equal byte sizes of different dtypes match */
  TC_ASSERT_OK(tc_batch_create(c, &b));
  TC_ASSERT_OK(tc_batch_send(b, a, 4, TC_INT32, 0));
  TC_ASSERT_OK(tc_batch_recv(b, r, 2, TC_INT64, 0));
  TC_ASSERT_OK(tc_batch_issue(b, NULL, NULL));
  TC_ASSERT_OK(tc_batch_free(b));
  TC_ASSERT_EQ(r[3], 4);
  TC_ASSERT_OK(tc_comm_destroy(c));
}

/* ---- error text ---- */

static void *thread_last_error(void *arg) {
  (void)arg;
  return (void *)(tc_last_error()[0] == 0 ? (void *)1 : NULL);
}

TC_TEST(validate_error_text_and_comm_last_error) {
  tc_comm_t *c = comm1(NULL);
  tc_comm_t *other = comm1("other");
  TC_ASSERT_STR_EQ(tc_comm_last_error(c), "");
  TC_ASSERT_ERR(tc_all_reduce(c, NULL, 7, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'buf' is NULL");
  /* the exact format */
  TC_ASSERT_STR_EQ(tc_last_error(),
                   "torchcomms: all_reduce on 'main' (rank 0 of 1): argument "
                   "'buf' is NULL but the count is 7");
  TC_ASSERT_STR_EQ(tc_comm_last_error(c), tc_last_error());
  TC_ASSERT_STR_EQ(tc_comm_last_error(other), "");
  /* a success changes neither */
  float f[2] = {1, 2};
  TC_ASSERT_OK(tc_all_reduce(c, f, 2, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT_STR_EQ(tc_comm_last_error(c),
                   "torchcomms: all_reduce on 'main' (rank 0 of 1): argument "
                   "'buf' is NULL but the count is 7");
  TC_ASSERT_CONTAINS(tc_last_error(), "'buf' is NULL but the count is 7");
  /* a failure on another communicator is recorded there only */
  TC_ASSERT_ERR(tc_broadcast(other, f, 2, TC_FLOAT32, 3, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                "torchcomms: broadcast on 'other' (rank 0 of 1): argument 'root' = 3 is out of range [0, 1)");
  TC_ASSERT_STR_EQ(tc_comm_last_error(other), tc_last_error());
  TC_ASSERT_CONTAINS(tc_comm_last_error(c), "all_reduce on 'main'");
  /* the next failure on c replaces its record */
  TC_ASSERT_ERR(tc_send(c, f, 2, TC_FLOAT32, 0, NULL, NULL), TC_ERR_INVALID_ARGUMENT, "own rank");
  TC_ASSERT_STR_EQ(tc_comm_last_error(c),
                   "torchcomms: send on 'main' (rank 0 of 1): argument 'peer' "
                   "is the caller's own rank 0 (use a batch for self send/recv)");
  /* the thread's last error is per thread */
  pthread_t t;
  void *empty = NULL;
  TC_ASSERT_EQ(pthread_create(&t, NULL, thread_last_error, NULL), 0);
  TC_ASSERT_EQ(pthread_join(t, &empty), 0);
  TC_ASSERT(empty == (void *)1);
  TC_ASSERT_OK(tc_comm_destroy(other));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

/* runner.h -- a small test runner in the libuv style.
 *
 * TC_TEST(name) { ... } defines and registers a test. Every test runs in a
 * forked child with a deadline (TC_TEST_TIMEOUT seconds, default 120), so a
 * crash or hang fails that test only. Asserts print both values.
 *
 * Multi-rank tests: tc_spawn(n, fn, arg) starts a TCPStore server in the test
 * process, forks n real processes, each calling fn(ctx) with its rank, and
 * fails unless all exit 0 within the deadline. tc_ctx_comm() creates a
 * communicator for the rank over that store.
 */
#ifndef TC_TEST_RUNNER_H
#define TC_TEST_RUNNER_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "torchcomms.h"

typedef void (*tc_test_fn)(void);
void tc_test_register(const char *name, tc_test_fn fn, const char *file);

#define TC_TEST(name)                                                          \
  static void tc_test_##name(void);                                            \
  __attribute__((constructor)) static void tc_test_reg_##name(void) {          \
    tc_test_register(#name, tc_test_##name, __FILE__);                         \
  }                                                                            \
  static void tc_test_##name(void)

/* Failing an assert prints where and why, then exits the process with 1. */
void tc_test_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));

#define TC_ASSERT(cond)                                                        \
  do {                                                                         \
    if (!(cond)) tc_test_fail(__FILE__, __LINE__, "assert failed: %s", #cond); \
  } while (0)

#define TC_ASSERT_EQ(a, b)                                                     \
  do {                                                                         \
    long long tc_a_ = (long long)(a), tc_b_ = (long long)(b);                  \
    if (tc_a_ != tc_b_)                                                        \
      tc_test_fail(__FILE__, __LINE__, "%s == %s: %lld != %lld", #a, #b, tc_a_, \
                   tc_b_);                                                     \
  } while (0)

#define TC_ASSERT_DBL_NEAR(a, b, tol)                                          \
  do {                                                                         \
    double tc_a_ = (double)(a), tc_b_ = (double)(b);                           \
    double tc_d_ = tc_a_ - tc_b_;                                              \
    if (!(tc_d_ <= (tol) && tc_d_ >= -(tol)))                                  \
      tc_test_fail(__FILE__, __LINE__, "%s ~= %s: %.17g vs %.17g (tol %g)",    \
                   #a, #b, tc_a_, tc_b_, (double)(tol));                       \
  } while (0)

#define TC_ASSERT_STR_EQ(a, b)                                                 \
  do {                                                                         \
    const char *tc_a_ = (a), *tc_b_ = (b);                                     \
    if (!tc_a_ || !tc_b_ || strcmp(tc_a_, tc_b_))                              \
      tc_test_fail(__FILE__, __LINE__, "%s == %s: \"%s\" != \"%s\"", #a, #b,    \
                   tc_a_ ? tc_a_ : "(null)", tc_b_ ? tc_b_ : "(null)");        \
  } while (0)

#define TC_ASSERT_CONTAINS(hay, needle)                                        \
  do {                                                                         \
    const char *tc_h_ = (hay), *tc_n_ = (needle);                              \
    if (!tc_h_ || !strstr(tc_h_, tc_n_))                                       \
      tc_test_fail(__FILE__, __LINE__, "\"%s\" does not contain \"%s\"",        \
                   tc_h_ ? tc_h_ : "(null)", tc_n_);                           \
  } while (0)

/* call must return TC_OK; on failure prints the code and tc_last_error(). */
#define TC_ASSERT_OK(call)                                                     \
  do {                                                                         \
    int tc_rc_ = (call);                                                       \
    if (tc_rc_ != TC_OK)                                                       \
      tc_test_fail(__FILE__, __LINE__, "%s returned %s: %s", #call,            \
                   tc_status_name(tc_rc_), tc_last_error());                   \
  } while (0)

/* call must return code and tc_last_error() must contain text. */
#define TC_ASSERT_ERR(call, code, text)                                        \
  do {                                                                         \
    int tc_rc_ = (call);                                                       \
    if (tc_rc_ != (code))                                                      \
      tc_test_fail(__FILE__, __LINE__, "%s returned %s, expected %s (%s)",     \
                   #call, tc_status_name(tc_rc_), tc_status_name(code),        \
                   tc_last_error());                                           \
    TC_ASSERT_CONTAINS(tc_last_error(), text);                                 \
  } while (0)

/* ---- multi-rank ---- */

typedef struct tc_ctx {
  int rank;
  int size;
  const char *store_host;
  int store_port;
  void *arg;
} tc_ctx_t;

typedef void (*tc_rank_fn)(tc_ctx_t *ctx);

/* Runs fn in n forked processes; returns when all exited. Fails the test
 * unless every rank exits 0 within timeout_s. */
void tc_spawn(int n, tc_rank_fn fn, void *arg, double timeout_s);
/* Like tc_spawn but returns each rank's wait status in statuses[n] (from
 * waitpid) instead of failing on non-zero exits; kills all at timeout_s and
 * then fails. */
void tc_spawn_status(int n, tc_rank_fn fn, void *arg, double timeout_s,
                     int *statuses);
/* A store client for this rank (connected to the test's server). */
tc_store_t *tc_ctx_store(tc_ctx_t *ctx);
/* A TCP port nothing listens on or is bound to, for a test's store server
 * (MASTER_PORT, tcrun --port): below the kernel's ephemeral range
 * (ip_local_port_range), where no outgoing connection takes its local
 * port between this call and the server's listen, as one did with a port
 * read back from bind(0) ("Address already in use"); checked free on
 * 0.0.0.0 (the default store listens there). */
int tc_free_port(void);
/* A communicator on backend "cpu" named `name` for this rank; opts may be
 * NULL (its rank, world_size and store are filled in). Asserts success. */
tc_comm_t *tc_ctx_comm(tc_ctx_t *ctx, const char *name, tc_comm_options_t *opts);

/* The text of file `path` (at most len - 1 bytes, NUL-terminated);
 * asserts that it opens. */
void tc_read_text(const char *path, char *buf, size_t len);

/* A world-of-one communicator of backend "cpu" on `device` over an
 * in-process store (no other rank needed); returns tc_comm_create's code. */
int tc_world1_create(const char *name, const char *device, tc_comm_t **out);

/* Deterministic test data: element i of rank r for a given seed, converted
 * to dtype (small integers, so sums and products stay exact: 1..4 with
 * signs; float8_e4m3fn +-1, +-2; float8_e5m2 +-1). */
void tc_fill(void *buf, size_t count, tc_dtype_t dtype, int rank, int seed);
/* Reads element i of buf as a double. */
double tc_get(const void *buf, size_t i, tc_dtype_t dtype);
/* Writes v into element i of buf. */
void tc_set(void *buf, size_t i, tc_dtype_t dtype, double v);

/* This process's resident set size, KiB (/proc/self/statm). */
long tc_rss_kib(void);

#endif

/* test_backend_register.c -- tc_backend_register: a backend table given
 * in-process (what torchcomms.register_backend uses for Python backends):
 *  - tc_comm_create finds it by name; its post receives the caller's
 *    tc_op_options_t.backend_arg (NULL without one);
 *  - a registration wins over a plugin file named by the environment and
 *    over the c10d alias "gloo";
 *  - the same table again is harmless, another table under the name is
 *    TC_ERR_INVALID_USAGE, a bad name TC_ERR_INVALID_ARGUMENT, a table
 *    lacking post TC_ERR_BACKEND.
 * Each test runs in its own forked process (registrations are for life).
 * Run: build/tc_test backend_register
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdlib.h>
#include <string.h>

#include "runner.h"
#include "torchcomms_backend.h"

typedef struct rb_state {
  const tc_backend_host_t *host;
  const void *last_arg;
  int posts;
} rb_state_t;

static rb_state_t *rb_last; /* the test's view of the last communicator */

static int rb_init(const tc_backend_init_args_t *a, void **out, char *err, size_t len) {
  rb_state_t *s = calloc(1, sizeof *s);
  if (!s) return TC_ERR_NOMEM;
  s->host = a->host;
  rb_last = s;
  *out = s;
  return TC_OK;
}
static int rb_finalize(void *b, char *err, size_t len) { return TC_OK; }
static int rb_abort(void *b) { return TC_OK; }
static void rb_destroy(void *b) { free(b); }
/* Completes at once (world of one: all_reduce adds 1 to show it ran). */
static int rb_post(void *b, const tc_backend_op_t *op, tc_work_t *w, char *err, size_t len) {
  rb_state_t *s = b;
  s->posts++;
  s->last_arg = op->size >= offsetof(tc_backend_op_t, backend_arg) + sizeof(void *)
                    ? op->backend_arg : (const void *)-1;
  if (op->kind == TC_KIND_ALL_REDUCE && op->dtype == TC_FLOAT32)
    for (size_t i = 0; i < op->count; i++) ((float *)op->recvbuf)[i] += 1;
  s->host->work_started(w);
  s->host->work_complete(w, TC_OK, NULL);
  return TC_OK;
}

#define RB_TABLE(nm)                                                           \
  {.abi_version = TC_BACKEND_ABI_VERSION, .size = sizeof(tc_backend_ops_t),    \
   .name = nm, .version = "rb-1", .init = rb_init, .finalize = rb_finalize,    \
   .abort = rb_abort, .destroy = rb_destroy, .post = rb_post}
static const tc_backend_ops_t rb_table = RB_TABLE("inproc");
static const tc_backend_ops_t rb_other = RB_TABLE("inproc");
static const tc_backend_ops_t rb_gloo = RB_TABLE("gloo");
static const tc_backend_ops_t rb_testplugin = RB_TABLE("testplugin");

static int create1(const char *backend, tc_comm_t **out) {
  unsetenv("MASTER_ADDR");
  unsetenv("MASTER_PORT");
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.rank = 0;
  o.world_size = 1;
  *out = NULL;
  return tc_comm_create(backend, "cpu", &o, out);
}

TC_TEST(backend_register_create_and_arg) {
  tc_comm_t *c = NULL;
  TC_ASSERT_ERR(create1("inproc", &c), TC_ERR_BACKEND_NOT_FOUND, "backend 'inproc' not found");
  TC_ASSERT_OK(tc_backend_register(&rb_table));
  TC_ASSERT_OK(tc_backend_register(&rb_table)); /* again: harmless */
  TC_ASSERT_OK(create1("inproc", &c));
  TC_ASSERT_STR_EQ(tc_comm_backend(c), "inproc");
  TC_ASSERT_STR_EQ(tc_comm_backend_version(c), "rb-1");
  float f[3] = {1, 2, 3};
  int token = 42;
  tc_op_options_t o = TC_OP_OPTIONS_INIT;
  o.backend_arg = &token;
  TC_ASSERT_OK(tc_all_reduce(c, f, 3, TC_FLOAT32, TC_OP(TC_SUM), &o, NULL));
  TC_ASSERT(rb_last->last_arg == &token);
  TC_ASSERT_DBL_NEAR(f[2], 4.0, 0);
  TC_ASSERT_OK(tc_all_reduce(c, f, 3, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL));
  TC_ASSERT(rb_last->last_arg == NULL);
  TC_ASSERT_EQ(rb_last->posts, 2);
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(backend_register_refusals) {
  TC_ASSERT_OK(tc_backend_register(&rb_table));
  TC_ASSERT_ERR(tc_backend_register(&rb_other), TC_ERR_INVALID_USAGE,
                "torchcomms: tc_backend_register: backend 'inproc' is already registered "
                "with another table (the first registration stays; choose another name)");
  tc_backend_ops_t bad = RB_TABLE("Bad Name");
  TC_ASSERT_ERR(tc_backend_register(&bad), TC_ERR_INVALID_ARGUMENT,
                "backend name 'Bad Name' is invalid");
  tc_backend_ops_t nopost = RB_TABLE("nopost");
  nopost.post = NULL;
  TC_ASSERT_ERR(tc_backend_register(&nopost), TC_ERR_BACKEND,
                "lacks init, finalize, abort, destroy or post");
  TC_ASSERT_ERR(tc_backend_register(NULL), TC_ERR_INVALID_ARGUMENT, "argument 'ops' is NULL");
}

TC_TEST(backend_register_wins_over_plugin_and_alias) {
  tc_comm_t *c = NULL;
  TC_ASSERT_EQ(setenv("TORCHCOMMS_BACKEND_LIB_PATH_TESTPLUGIN", TC_BUILD_DIR "/plugins", 1), 0);
  TC_ASSERT_OK(create1("testplugin", &c)); /* the plugin file */
  TC_ASSERT_STR_EQ(tc_comm_backend_version(c), "1.0-test");
  TC_ASSERT_OK(tc_comm_destroy(c));
  TC_ASSERT_OK(tc_backend_register(&rb_testplugin));
  TC_ASSERT_OK(create1("testplugin", &c)); /* the registration, though loaded */
  TC_ASSERT_STR_EQ(tc_comm_backend_version(c), "rb-1");
  TC_ASSERT_OK(tc_comm_destroy(c));
  unsetenv("TORCHCOMMS_BACKEND_LIB_PATH_TESTPLUGIN");
  TC_ASSERT_OK(create1("gloo", &c));
  TC_ASSERT_STR_EQ(tc_comm_backend(c), "cpu");
  TC_ASSERT_OK(tc_comm_destroy(c));
  TC_ASSERT_OK(tc_backend_register(&rb_gloo));
  TC_ASSERT_OK(create1("gloo", &c));
  TC_ASSERT_STR_EQ(tc_comm_backend(c), "gloo");
  TC_ASSERT_STR_EQ(tc_comm_backend_version(c), "rb-1");
  TC_ASSERT_OK(tc_comm_destroy(c));
}

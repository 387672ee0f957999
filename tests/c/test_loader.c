/* test_loader.c -- the backend loader with an out-of-tree plugin
 * (tests/c/plugin_test.c, built as build/plugins/libtorchcomms-testplugin.so):
 *  - TORCHCOMMS_BACKEND_LIB_PATH_TESTPLUGIN naming the plugin's directory, or
 *    the file itself: a communicator on backend "testplugin" runs all_reduce
 *    and barrier, reports the plugin's version, refuses the operations and
 *    dtypes the plugin lacks (TC_ERR_NOT_SUPPORTED), and the plugin's init
 *    error reaches the caller;
 *  - the variable naming a missing file or a directory without the plugin:
 *    TC_ERR_BACKEND_NOT_FOUND naming that path;
 *  - a file that is not a shared object (an executable, a text file):
 *    TC_ERR_BACKEND "cannot load";
 *  - a shared object without the symbol tc_backend_table (the system's libm):
 *    TC_ERR_BACKEND "does not export the symbol".
 * (An ABI-version mismatch is not covered: the plugin's table is const data,
 * and CMakeLists.txt builds one plugin only.)
 * Every test runs in its own forked process, so the loader's per-process
 * cache of plugins starts empty in each.
 * Run: build/tc_test loader
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>

#include "runner.h"

#define PLUGIN_ENV "TORCHCOMMS_BACKEND_LIB_PATH_TESTPLUGIN"
#define PLUGIN_DIR TC_BUILD_DIR "/plugins"
#define PLUGIN_FILE PLUGIN_DIR "/libtorchcomms-testplugin.so"

static void clear_env(void) {
  static const char *vars[] = {"MASTER_ADDR", "MASTER_PORT", "RANK",
                               "WORLD_SIZE", "TORCHCOMM_RANK", "TORCHCOMM_SIZE",
                               PLUGIN_ENV};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

static int create1(const char *backend, tc_comm_t **out) {
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.rank = 0;
  o.world_size = 1;
  *out = NULL;
  return tc_comm_create(backend, "cpu", &o, out);
}

/* Everything a communicator on the plugin can and cannot do. */
static void use_plugin(void) {
  tc_comm_t *c = NULL;
  TC_ASSERT_OK(create1("testplugin", &c));
  TC_ASSERT_STR_EQ(tc_comm_backend(c), "testplugin");
  TC_ASSERT_STR_EQ(tc_comm_backend_version(c), "1.0-test");
  TC_ASSERT_EQ(tc_comm_size(c), 1);

  float f[5] = {1, 2, 3, 4, 5};
  TC_ASSERT_OK(tc_all_reduce(c, f, 5, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL));
  for (int i = 0; i < 5; i++) TC_ASSERT_DBL_NEAR(f[i], i + 1, 0);
  TC_ASSERT_OK(tc_all_reduce(c, f, 5, TC_FLOAT32, TC_OP_PREMUL_SUM(2.0), NULL, NULL));
  TC_ASSERT_DBL_NEAR(f[4], 10.0, 0);
  int64_t x = 7;
  tc_work_t *w = NULL;
  TC_ASSERT_OK(tc_all_reduce(c, &x, 1, TC_INT64, TC_OP(TC_MAX), NULL, &w));
  TC_ASSERT_OK(tc_work_wait(w));
  TC_ASSERT_EQ(tc_work_status(w), TC_WORK_COMPLETED);
  TC_ASSERT_OK(tc_work_release(w));
  TC_ASSERT_EQ(x, 7);
  TC_ASSERT_OK(tc_barrier(c, NULL, NULL));

  /* the core validates before the plugin sees anything */
  TC_ASSERT_ERR(tc_all_reduce(c, NULL, 3, TC_FLOAT32, TC_OP(TC_SUM), NULL, NULL),
                TC_ERR_INVALID_ARGUMENT, "argument 'buf' is NULL");
  /* ops the plugin leaves NULL */
  TC_ASSERT_ERR(tc_broadcast(c, f, 5, TC_FLOAT32, 0, NULL, NULL), TC_ERR_NOT_SUPPORTED,
                "broadcast on 'main' (rank 0 of 1): backend 'testplugin' does not implement broadcast");
  w = (tc_work_t *)&w;
  TC_ASSERT_ERR(tc_all_gather_single(c, f, f, 5, TC_FLOAT32, NULL, &w), TC_ERR_NOT_SUPPORTED,
                "backend 'testplugin' does not implement all_gather_single");
  TC_ASSERT_ERR(tc_all_to_all_single(c, f, f, 5, TC_FLOAT32, NULL, NULL), TC_ERR_NOT_SUPPORTED,
                "does not implement all_to_all_single");
  tc_batch_t *b = NULL;
  TC_ASSERT_OK(tc_batch_create(c, &b));
  TC_ASSERT_ERR(tc_batch_issue(b, NULL, NULL), TC_ERR_NOT_SUPPORTED,
                "does not implement batch_op_issue");
  TC_ASSERT_OK(tc_batch_free(b));
  /* dtypes the plugin does not support */
  uint16_t h[2] = {0, 0};
  TC_ASSERT_ERR(tc_all_reduce(c, h, 2, TC_FLOAT16, TC_OP(TC_SUM), NULL, NULL), TC_ERR_NOT_SUPPORTED,
                "all_reduce on 'main' (rank 0 of 1): backend 'testplugin' does not support dtype float16");
  TC_ASSERT_ERR(tc_all_reduce(c, h, 2, TC_INT8, TC_OP(TC_SUM), NULL, NULL), TC_ERR_NOT_SUPPORTED,
                "does not support dtype int8");
  /* a refused op leaves the communicator usable */
  TC_ASSERT_OK(tc_all_reduce(c, f, 5, TC_FLOAT32, TC_OP(TC_MIN), NULL, NULL));
  TC_ASSERT_OK(tc_comm_finalize(c));
  TC_ASSERT_ERR(tc_barrier(c, NULL, NULL), TC_ERR_INVALID_USAGE, "finalized");
  TC_ASSERT_OK(tc_comm_destroy(c));

  /* a second communicator comes from the loader's cache */
  TC_ASSERT_OK(create1("testplugin", &c));
  TC_ASSERT_OK(tc_barrier(c, NULL, NULL));
  TC_ASSERT_OK(tc_comm_abort(c));
  TC_ASSERT_ERR(tc_barrier(c, NULL, NULL), TC_ERR_ABORTED, "aborted");
  TC_ASSERT_OK(tc_comm_destroy(c));

  /* the plugin's own init error reaches the caller (world size 2) */
  tc_store_t *s = NULL;
  TC_ASSERT_OK(tc_store_memory(&s));
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.rank = 0;
  o.world_size = 2;
  o.store = s;
  TC_ASSERT_ERR(tc_comm_create("testplugin", "cpu", &o, &c), TC_ERR_NOT_SUPPORTED,
                "tc_comm_create on 'main' (rank 0 of 2): backend 'testplugin' failed to start: "
                "the testplugin backend supports world size 1 only (got world size 2)");
  TC_ASSERT(c == NULL);
  tc_store_release(s);
}

TC_TEST(loader_plugin_from_directory) {
  clear_env();
  TC_ASSERT_EQ(setenv(PLUGIN_ENV, PLUGIN_DIR, 1), 0);
  use_plugin();
}

TC_TEST(loader_plugin_from_file) {
  clear_env();
  TC_ASSERT_EQ(setenv(PLUGIN_ENV, PLUGIN_FILE, 1), 0);
  use_plugin();
}

TC_TEST(loader_missing_file) {
  clear_env();
  tc_comm_t *c = NULL;
  const char *missing = TC_BUILD_DIR "/plugins/no-such-dir/libtorchcomms-testplugin.so";
  TC_ASSERT_EQ(setenv(PLUGIN_ENV, missing, 1), 0);
  TC_ASSERT_ERR(create1("testplugin", &c), TC_ERR_BACKEND_NOT_FOUND,
                "torchcomms: backend 'testplugin' not found: tried ");
  TC_ASSERT_CONTAINS(tc_last_error(), missing);
  TC_ASSERT_CONTAINS(tc_last_error(), "No such file or directory");
  TC_ASSERT_CONTAINS(tc_last_error(), "set " PLUGIN_ENV " to the path of libtorchcomms-testplugin.so");
  TC_ASSERT(c == NULL);
  /* a directory that does not hold the plugin */
  TC_ASSERT_EQ(setenv(PLUGIN_ENV, TC_SOURCE_DIR "/include", 1), 0);
  TC_ASSERT_ERR(create1("testplugin", &c), TC_ERR_BACKEND_NOT_FOUND,
                TC_SOURCE_DIR "/include/libtorchcomms-testplugin.so (No such file or directory)");
  /* unset: the variable is named as unset */
  unsetenv(PLUGIN_ENV);
  TC_ASSERT_ERR(create1("testplugin", &c), TC_ERR_BACKEND_NOT_FOUND,
                "$" PLUGIN_ENV " (unset)");
  TC_ASSERT(c == NULL);
}

TC_TEST(loader_not_a_shared_object) {
  clear_env();
  tc_comm_t *c = NULL;
  /* an executable (this test program) */
  TC_ASSERT_EQ(setenv(PLUGIN_ENV, TC_BUILD_DIR "/tc_test", 1), 0);
  TC_ASSERT_ERR(create1("testplugin", &c), TC_ERR_BACKEND,
                "torchcomms: backend 'testplugin': cannot load " TC_BUILD_DIR "/tc_test: ");
  TC_ASSERT(c == NULL);
  /* a text file */
  TC_ASSERT_EQ(setenv(PLUGIN_ENV, TC_SOURCE_DIR "/CMakeLists.txt", 1), 0);
  TC_ASSERT_ERR(create1("testplugin", &c), TC_ERR_BACKEND,
                "cannot load " TC_SOURCE_DIR "/CMakeLists.txt");
  TC_ASSERT(c == NULL);
  /* a failed load is not cached: the real plugin loads afterwards */
  TC_ASSERT_EQ(setenv(PLUGIN_ENV, PLUGIN_FILE, 1), 0);
  TC_ASSERT_OK(create1("testplugin", &c));
  TC_ASSERT_OK(tc_comm_destroy(c));
}

TC_TEST(loader_missing_symbol) {
  clear_env();
  /* The system's libm: a real shared object without tc_backend_table. Its path
   * comes from the address of cos inside the loaded libm. */
  void *h = dlopen("libm.so.6", RTLD_NOW);
  TC_ASSERT(h != NULL);
  void *cos_addr = dlsym(h, "cos");
  TC_ASSERT(cos_addr != NULL);
  Dl_info info;
  TC_ASSERT(dladdr(cos_addr, &info) != 0 && info.dli_fname != NULL);
  char path[4096];
  snprintf(path, sizeof path, "%s", info.dli_fname);
  TC_ASSERT(strstr(path, "libm") != NULL);
  TC_ASSERT_EQ(setenv(PLUGIN_ENV, path, 1), 0);
  tc_comm_t *c = NULL;
  char want[4300];
  snprintf(want, sizeof want,
           "torchcomms: backend 'testplugin': %s does not export the symbol "
           "'tc_backend_table' (is it a torchcomms backend?)", path);
  TC_ASSERT_ERR(create1("testplugin", &c), TC_ERR_BACKEND, want);
  TC_ASSERT(c == NULL);
  dlclose(h);
}

/* A backend that reports a failure from inside its op entry (synchronously,
 * as this trivial plugin does) must see it returned to the caller (this once
 * deadlocked on the communicator's mutex). */
TC_TEST(loader_plugin_sync_error) {
  clear_env();
  TC_ASSERT_EQ(setenv(PLUGIN_ENV, PLUGIN_FILE, 1), 0);
  tc_comm_t *c = NULL;
  TC_ASSERT_OK(create1("testplugin", &c));
  tc_hint_t fail[1] = {{"testplugin.fail", "1"}};
  tc_op_options_t o = TC_OP_OPTIONS_INIT;
  o.hints = fail;
  o.num_hints = 1;
  float f[3] = {1, 2, 3};
  TC_ASSERT_ERR(tc_all_reduce(c, f, 3, TC_FLOAT32, TC_OP(TC_SUM), &o, NULL), TC_ERR_BACKEND,
                "torchcomms: all_reduce on 'main' (rank 0 of 1): testplugin: injected failure");
  TC_ASSERT_CONTAINS(tc_comm_last_error(c), "testplugin: injected failure");
  tc_work_t *w = NULL;
  TC_ASSERT_OK(tc_barrier(c, &o, &w));
  TC_ASSERT_ERR(tc_work_wait(w), TC_ERR_BACKEND, "barrier on 'main' (rank 0 of 1): testplugin: injected failure");
  TC_ASSERT_EQ(tc_work_status(w), TC_WORK_ERROR);
  TC_ASSERT_CONTAINS(tc_work_error(w), "injected failure");
  TC_ASSERT_OK(tc_work_release(w));
  TC_ASSERT_OK(tc_barrier(c, NULL, NULL)); /* still usable */
  TC_ASSERT_OK(tc_comm_destroy(c));
}

/* A plugin built for another ABI version is refused with one sentence. */
TC_TEST(loader_abi_mismatch) {
  clear_env();
  TC_ASSERT_EQ(setenv("TORCHCOMMS_BACKEND_LIB_PATH_BADABI", PLUGIN_DIR, 1), 0);
  tc_comm_t *c = NULL;
  TC_ASSERT_ERR(create1("badabi", &c), TC_ERR_BACKEND,
                "libtorchcomms-badabi.so has ABI version 3 but this "
                "libtorchcomms speaks version 2 (rebuild the backend");
  TC_ASSERT(c == NULL);
}

/* A plugin of ABI version 1 (one member per operation, exported as
 * tc_backend_v1) is recognised and refused with the same advice. */
TC_TEST(loader_abi_v1_symbol) {
  clear_env();
  TC_ASSERT_EQ(setenv("TORCHCOMMS_BACKEND_LIB_PATH_OLDABI", PLUGIN_DIR, 1), 0);
  tc_comm_t *c = NULL;
  TC_ASSERT_ERR(create1("oldabi", &c), TC_ERR_BACKEND,
                "libtorchcomms-oldabi.so has ABI version 1 (symbol 'tc_backend_v1') "
                "but this libtorchcomms speaks version 2 (rebuild the backend");
  TC_ASSERT(c == NULL);
}

/* torch's c10d names reach the loader (tc__backend_alias): on device cpu,
 * "gloo" and "torchcomms" load the native "cpu" backend, unless
 * TORCHCOMMS_BACKEND_LIB_PATH_GLOO names a gloo plugin, which then wins
 * (here the test plugin, loaded under the name "gloo"); a missing gloo
 * plugin is an error naming the path, never a silent fallback. */
#define GLOO_ENV "TORCHCOMMS_BACKEND_LIB_PATH_GLOO"
TC_TEST(loader_gloo_alias) {
  clear_env();
  unsetenv(GLOO_ENV);
  tc_comm_t *c = NULL;
  TC_ASSERT_OK(create1("gloo", &c));
  TC_ASSERT_STR_EQ(tc_comm_backend(c), "cpu");
  TC_ASSERT_OK(tc_barrier(c, NULL, NULL));
  TC_ASSERT_OK(tc_comm_destroy(c));
  TC_ASSERT_OK(create1("torchcomms", &c));
  TC_ASSERT_STR_EQ(tc_comm_backend(c), "cpu");
  TC_ASSERT_OK(tc_comm_destroy(c));
  /* only on device cpu */
  tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
  o.rank = 0;
  o.world_size = 1;
  TC_ASSERT_ERR(tc_comm_create("gloo", "cuda", &o, &c), TC_ERR_BACKEND_NOT_FOUND,
                "backend 'gloo' not found");
  /* a gloo plugin named explicitly wins */
  TC_ASSERT_EQ(setenv(GLOO_ENV, PLUGIN_FILE, 1), 0);
  TC_ASSERT_OK(create1("gloo", &c));
  TC_ASSERT_STR_EQ(tc_comm_backend(c), "gloo");
  TC_ASSERT_STR_EQ(tc_comm_backend_version(c), "1.0-test");
  TC_ASSERT_OK(tc_comm_destroy(c));
  /* "torchcomms" stays the native backend */
  TC_ASSERT_OK(create1("torchcomms", &c));
  TC_ASSERT_STR_EQ(tc_comm_backend(c), "cpu");
  TC_ASSERT_OK(tc_comm_destroy(c));
  unsetenv(GLOO_ENV);
}

TC_TEST(loader_gloo_plugin_missing) {
  clear_env();
  const char *missing = TC_BUILD_DIR "/plugins/no-such-dir/libtorchcomms-gloo.so";
  TC_ASSERT_EQ(setenv(GLOO_ENV, missing, 1), 0);
  tc_comm_t *c = NULL;
  TC_ASSERT_ERR(create1("gloo", &c), TC_ERR_BACKEND_NOT_FOUND, missing);
  TC_ASSERT(c == NULL);
  unsetenv(GLOO_ENV);
}

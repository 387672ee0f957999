/* test_settings.c -- a bad value of any setting is an error at creation
 * naming the setting and what it accepts (src/core/settings.c); a device the
 * backend cannot serve is refused; the README lists every setting. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "core/core.h" /* the settings table */
#include "runner.h"

static int create1(const char *device, tc_comm_t **c) {
  return tc_world1_create("settings", device, c);
}

typedef struct { const char *name, *value, *want; } bad_t;

TC_TEST(settings_bad_values_refused) {
  static const bad_t bad[] = {
      {"TORCHCOMM_TIMEOUT_SECONDS", "abc", "expected a number > 0"},
      {"TORCHCOMM_TIMEOUT_SECONDS", "nan", "expected a number > 0"},
      {"TORCHCOMM_TIMEOUT_SECONDS", "-5", "expected a number > 0"},
      {"TORCHCOMM_TIMEOUT_SECONDS", "0", "expected a number > 0"},
      {"TORCHCOMM_TIMEOUT_SECONDS", "10s", "expected a number > 0"},
      {"TORCHCOMMS_CPU_TRANSPORT", "bogus", "expected one of auto|shm|tcp"},
      {"TORCHCOMM_ABORT_ON_ERROR", "maybe", "expected 1, 0, true, false"},
      {"TORCHCOMMS_CHECK_MISMATCH", "2", "expected 1, 0, true, false"},
      {"TORCHCOMMS_LOG", "loud", "expected one of error|warn|info|debug"},
      {"TORCHCOMMS_SHM_BYTES", "-1", "expected a number > 0"},
      {"TORCHCOMMS_CPU_SPIN_US", "fast", "expected a number >= 0"},
      {"TORCHCOMMS_SOCKET_ADDR", "my-host", "expected a numeric IPv4 or IPv6 address"},
      {"TORCHELASTIC_RESTART_COUNT", "1.5", "expected an integer from 0"},
      {"TORCHCOMMS_STORE_MAX_BYTES", "lots", "expected a byte count"},
      {"TORCHCOMMS_SHM_SWEEP", "sometimes", "expected 1, 0, true, false"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv(bad[i].name, bad[i].value, 1);
    tc_comm_t *c = NULL;
    int rc = create1("cpu", &c);
    char want[160];
    snprintf(want, sizeof want, "tc_comm_create: %s='%s' is not valid: ", bad[i].name,
             bad[i].value);
    if (rc != TC_ERR_INVALID_ARGUMENT)
      tc_test_fail(__FILE__, __LINE__, "%s=%s: got %s (%s)", bad[i].name, bad[i].value,
                   tc_status_name(rc), tc_last_error());
    TC_ASSERT(c == NULL);
    TC_ASSERT_CONTAINS(tc_last_error(), want);
    TC_ASSERT_CONTAINS(tc_last_error(), bad[i].want);
    unsetenv(bad[i].name);
  }
  /* good values of the same settings are accepted */
  setenv("TORCHCOMM_TIMEOUT_SECONDS", " 12.5 ", 1);
  setenv("TORCHCOMMS_CPU_TRANSPORT", "TCP", 1);
  setenv("TORCHCOMM_ABORT_ON_ERROR", "off", 1);
  setenv("TORCHCOMMS_SOCKET_ADDR", "::1", 1);
  tc_comm_t *c = NULL;
  TC_ASSERT_OK(create1("cpu", &c));
  tc_comm_options_t o;
  TC_ASSERT_OK(tc_comm_get_options(c, &o));
  TC_ASSERT_DBL_NEAR(o.timeout_s, 12.5, 1e-9);
  TC_ASSERT_OK(tc_comm_finalize(c));
  tc_comm_destroy(c);
}

TC_TEST(settings_device_refused_by_cpu_backend) {
  static const char *const bad[] = {"cuda:0", "cuda", "meta", "cpux"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    tc_comm_t *c = NULL;
    TC_ASSERT_ERR(create1(bad[i], &c), TC_ERR_INVALID_ARGUMENT, "is not served by this backend");
    TC_ASSERT_CONTAINS(tc_last_error(), bad[i]);
    TC_ASSERT(c == NULL);
  }
  tc_comm_t *c = NULL;
  TC_ASSERT_OK(create1("cpu:0", &c));
  TC_ASSERT_OK(tc_comm_finalize(c));
  tc_comm_destroy(c);
}

/* Every TORCHCOMMS_* / TORCHCOMM_* setting the library reads is declared in
 * settings.c and listed in README.md. */
TC_TEST(settings_readme_lists_every_setting) {
  char path[512];
  snprintf(path, sizeof path, "%s/README.md", TC_SOURCE_DIR);
  FILE *f = fopen(path, "r");
  TC_ASSERT(f != NULL);
  static char readme[1 << 20];
  size_t n = fread(readme, 1, sizeof readme - 1, f);
  readme[n] = 0;
  fclose(f);
  /* from the table itself: a setting added there must be documented */
  TC_ASSERT(tc__settings_count() >= 20);
  for (size_t i = 0; i < tc__settings_count(); i++) {
    const char *name = tc__settings_name(i, NULL);
    if (!strncmp(name, "TORCHELASTIC_", 13)) continue; /* torchrun's, documented there */
    if (!strstr(readme, name))
      tc_test_fail(__FILE__, __LINE__, "README.md does not document %s", name);
  }
}

/* tcrun --help-env prints every setting of the table, with values set. */
TC_TEST(settings_tcrun_help_env_lists_the_table) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "TORCHCOMMS_CPU_SPIN_US=7 %s/tcrun --help-env", TC_BUILD_DIR);
  FILE *p = popen(cmd, "r");
  TC_ASSERT(p != NULL);
  static char out[1 << 16];
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = 0;
  TC_ASSERT_EQ(pclose(p), 0);
  for (size_t i = 0; i < tc__settings_count(); i++) TC_ASSERT_CONTAINS(out, tc__settings_name(i, NULL));
  TC_ASSERT_CONTAINS(out, "TORCHCOMMS_CPU_SPIN_US");
  TC_ASSERT_CONTAINS(out, "[set: 7]");
}


/* Settings are read once into a snapshot: a value changed in the
 * environment is not seen until the next reload (tc_comm_create takes one);
 * a text handed out stays valid after a reload. */
TC_TEST(settings_read_once_until_reload) {
  setenv("TORCHCOMMS_CPU_YIELD_US", "123", 1);
  TC_ASSERT_OK(tc__settings_reload(NULL, 0));
  TC_ASSERT_DBL_NEAR(tc__setting_double(TC_SET_CPU_YIELD_US), 123, 0);
  const char *held = tc__setting_str(TC_SET_CPU_YIELD_US);
  TC_ASSERT_STR_EQ(held, "123");
  setenv("TORCHCOMMS_CPU_YIELD_US", "456", 1);
  /* cached: the environment is not read again */
  TC_ASSERT_DBL_NEAR(tc__setting_double(TC_SET_CPU_YIELD_US), 123, 0);
  TC_ASSERT_STR_EQ(tc__setting_str(TC_SET_CPU_YIELD_US), "123");
  TC_ASSERT_OK(tc__settings_reload(NULL, 0));
  TC_ASSERT_DBL_NEAR(tc__setting_double(TC_SET_CPU_YIELD_US), 456, 0);
  TC_ASSERT_STR_EQ(held, "123"); /* the old text was not freed */
  /* unset: the table's default, and not set */
  unsetenv("TORCHCOMMS_CPU_YIELD_US");
  TC_ASSERT(tc__setting_is_set(TC_SET_CPU_YIELD_US));
  TC_ASSERT_OK(tc__settings_reload(NULL, 0));
  TC_ASSERT(!tc__setting_is_set(TC_SET_CPU_YIELD_US));
  TC_ASSERT_DBL_NEAR(tc__setting_double(TC_SET_CPU_YIELD_US), 200, 0);
  /* creating a communicator takes a new snapshot */
  setenv("TORCHCOMMS_CPU_INLINE_BYTES", "4096", 1);
  TC_ASSERT_DBL_NEAR(tc__setting_double(TC_SET_CPU_INLINE_BYTES), 1 << 20, 0);
  tc_comm_t *c = NULL;
  TC_ASSERT_OK(create1("cpu", &c));
  TC_ASSERT_DBL_NEAR(tc__setting_double(TC_SET_CPU_INLINE_BYTES), 4096, 0);
  TC_ASSERT_OK(tc_comm_finalize(c));
  tc_comm_destroy(c);
  /* typed readers: a bool, a choice by its index, bytes with a suffix */
  setenv("TORCHCOMMS_CHECK_MISMATCH", "off", 1);
  setenv("TORCHCOMMS_CPU_TRANSPORT", "TCP", 1);
  setenv("TORCHCOMMS_STORE_MAX_BYTES", "64M", 1);
  TC_ASSERT_OK(tc__settings_reload(NULL, 0));
  TC_ASSERT_EQ(tc__setting_bool(TC_SET_CHECK_MISMATCH), 0);
  TC_ASSERT_EQ(tc__setting_choice(TC_SET_CPU_TRANSPORT), 2); /* auto|shm|tcp */
  TC_ASSERT_EQ(tc__setting_bytes(TC_SET_STORE_MAX_BYTES), 64ull << 20);
  /* the cpu backend's sizes take suffixes too (docs write
   * TORCHCOMMS_CPU_CMA_BYTES=64K), and 0 stays 0 (never / always) */
  setenv("TORCHCOMMS_CPU_CMA_BYTES", "64K", 1);
  setenv("TORCHCOMMS_CPU_INLINE_BYTES", "0", 1);
  setenv("TORCHCOMMS_CPU_SHM_SMALL_BYTES", "16384", 1);
  setenv("TORCHCOMMS_CPU_STREAM_BYTES", "12M", 1);
  char err[512] = "";
  TC_ASSERT_OK(tc__settings_reload(err, sizeof err));
  TC_ASSERT_EQ(tc__setting_bytes(TC_SET_CPU_CMA_BYTES), 65536);
  TC_ASSERT_DBL_NEAR(tc__setting_double(TC_SET_CPU_CMA_BYTES), 65536, 0);
  TC_ASSERT_DBL_NEAR(tc__setting_double(TC_SET_CPU_INLINE_BYTES), 0, 0);
  TC_ASSERT_DBL_NEAR(tc__setting_double(TC_SET_CPU_SHM_SMALL_BYTES), 16384, 0);
  TC_ASSERT_EQ(tc__setting_bytes(TC_SET_CPU_STREAM_BYTES), 12ull << 20);
  TC_ASSERT(tc__setting_is_set(TC_SET_CPU_STREAM_BYTES));
  setenv("TORCHCOMMS_CPU_CMA_BYTES", "-1", 1);
  TC_ASSERT_EQ(tc__settings_reload(err, sizeof err), TC_ERR_INVALID_ARGUMENT);
  TC_ASSERT_CONTAINS(err, "TORCHCOMMS_CPU_CMA_BYTES='-1' is not valid: expected a byte count");
  TC_ASSERT_DBL_NEAR(tc__setting_double(TC_SET_CPU_CMA_BYTES), 0, 0);
  unsetenv("TORCHCOMMS_CPU_CMA_BYTES");
  unsetenv("TORCHCOMMS_CPU_INLINE_BYTES");
  unsetenv("TORCHCOMMS_CPU_SHM_SMALL_BYTES");
  unsetenv("TORCHCOMMS_CPU_STREAM_BYTES");
  TC_ASSERT_OK(tc__settings_reload(err, sizeof err));
  TC_ASSERT_DBL_NEAR(tc__setting_double(TC_SET_CPU_INLINE_BYTES), 1 << 20, 0);
}

/* A malformed value is reported, naming the setting, and reads as the
 * default; a byte count below the least useful value is raised to it. */
TC_TEST(settings_malformed_value_reported_and_defaulted) {
  setenv("TORCHCOMMS_STORE_MAX_BYTES", "lots", 1);
  setenv("TORCHCOMMS_STORE_MAX_VALUE_BYTES", "100", 1);
  char err[512] = "";
  TC_ASSERT_EQ(tc__settings_reload(err, sizeof err), TC_ERR_INVALID_ARGUMENT);
  TC_ASSERT_CONTAINS(err, "TORCHCOMMS_STORE_MAX_BYTES='lots' is not valid: expected a byte count");
  TC_ASSERT(tc__setting_malformed(TC_SET_STORE_MAX_BYTES));
  TC_ASSERT_EQ(tc__setting_bytes(TC_SET_STORE_MAX_BYTES), 1ull << 30);
  TC_ASSERT_EQ(tc__setting_bytes(TC_SET_STORE_MAX_VALUE_BYTES), 1024);
  /* without an error buffer (a store server starting): logged, not failed */
  TC_ASSERT_EQ(tc__settings_reload(NULL, 0), TC_OK);
  TC_ASSERT_EQ(tc__setting_bytes(TC_SET_STORE_MAX_BYTES), 1ull << 30);
  unsetenv("TORCHCOMMS_STORE_MAX_BYTES");
  TC_ASSERT_OK(tc__settings_reload(err, sizeof err));
  TC_ASSERT(!tc__setting_malformed(TC_SET_STORE_MAX_BYTES));
}

/* Readers on other threads while the snapshot is reloaded see one of the
 * two values, never a torn or freed one (run under TSan by make tsan). */
typedef struct { _Atomic int stop; int bad; } reload_race_t;

static void *reload_reader(void *arg) {
  reload_race_t *r = arg;
  while (!atomic_load(&r->stop)) {
    double d = tc__setting_double(TC_SET_CPU_SPIN_US);
    const char *s = tc__setting_str(TC_SET_CPU_SPIN_US);
    if ((d != 1 && d != 2) || !s || (strcmp(s, "1") && strcmp(s, "2"))) r->bad = 1;
  }
  return NULL;
}

TC_TEST(settings_reload_while_read) {
  setenv("TORCHCOMMS_CPU_SPIN_US", "1", 1);
  TC_ASSERT_OK(tc__settings_reload(NULL, 0));
  reload_race_t r = {0};
  pthread_t t[2];
  for (int i = 0; i < 2; i++) TC_ASSERT_EQ(pthread_create(&t[i], NULL, reload_reader, &r), 0);
  for (int i = 0; i < 2000; i++) {
    setenv("TORCHCOMMS_CPU_SPIN_US", i % 2 ? "1" : "2", 1);
    TC_ASSERT_OK(tc__settings_reload(NULL, 0));
  }
  atomic_store(&r.stop, 1);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  TC_ASSERT_EQ(r.bad, 0);
}

/* The default timeout is one constant: the table's default, the effective
 * default of a communicator, tcrun --help-env and the README all give
 * TC_DEFAULT_TIMEOUT_S. */
TC_TEST(settings_default_timeout_is_one_constant) {
  unsetenv("TORCHCOMM_TIMEOUT_SECONDS");
  char text[64];
  tc__settings_default_text(TC_SET_TIMEOUT_SECONDS, text, sizeof text);
  char want[64];
  snprintf(want, sizeof want, "%g", TC_DEFAULT_TIMEOUT_S);
  TC_ASSERT_STR_EQ(text, want);
  tc_comm_t *c = NULL;
  TC_ASSERT_OK(create1("cpu", &c));
  tc_comm_options_t o;
  TC_ASSERT_OK(tc_comm_get_options(c, &o));
  TC_ASSERT_DBL_NEAR(o.timeout_s, TC_DEFAULT_TIMEOUT_S, 0);
  TC_ASSERT_OK(tc_comm_finalize(c));
  tc_comm_destroy(c);
  char path[512];
  snprintf(path, sizeof path, "%s/README.md", TC_SOURCE_DIR);
  FILE *f = fopen(path, "r");
  TC_ASSERT(f != NULL);
  static char readme[1 << 20];
  size_t n = fread(readme, 1, sizeof readme - 1, f);
  readme[n] = 0;
  fclose(f);
  snprintf(want, sizeof want, "`TORCHCOMM_TIMEOUT_SECONDS`,\ndefault %g s", TC_DEFAULT_TIMEOUT_S);
  TC_ASSERT_CONTAINS(readme, want);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "%s/tcrun --help-env", TC_BUILD_DIR);
  FILE *p = popen(cmd, "r");
  TC_ASSERT(p != NULL);
  static char out[1 << 16];
  n = fread(out, 1, sizeof out - 1, p);
  out[n] = 0;
  TC_ASSERT_EQ(pclose(p), 0);
  snprintf(want, sizeof want, "seconds (default %g)", TC_DEFAULT_TIMEOUT_S);
  TC_ASSERT_CONTAINS(out, want);
}

/* Every table default is a value its own setting accepts. */
TC_TEST(settings_defaults_are_valid) {
  for (size_t i = 0; i < tc__settings_count(); i++) unsetenv(tc__settings_name(i, NULL));
  TC_ASSERT_OK(tc__settings_reload(NULL, 0));
  int checked = 0;
  for (size_t i = 0; i < tc__settings_count(); i++) {
    char text[64];
    tc__settings_default_text(i, text, sizeof text);
    if (!*text) continue; /* no default: unset */
    char *end = NULL;
    (void)strtod(text, &end);
    if (*end && end != text) /* "16 KiB": the value in bytes */
      snprintf(text, sizeof text, "%.0f", tc__setting_double((tc_setting_id_t)i));
    const char *name = tc__settings_name(i, NULL);
    setenv(name, text, 1);
    char err[512] = "";
    int rc = tc__settings_reload(err, sizeof err);
    unsetenv(name);
    if (rc != TC_OK) tc_test_fail(__FILE__, __LINE__, "%s default '%s': %s", name, text, err);
    checked++;
  }
  TC_ASSERT(checked >= 15);
}

/* Nothing in the library reads a setting of ours around the table: no
 * getenv outside settings.c (the nccl and mpi plugins, which cannot link
 * the core, excepted) and no raw read of a TORCHCOMM(S)_ name. */
TC_TEST(settings_read_only_through_the_table) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "cd %s && grep -rnE 'getenv\\(|tc__env_str\\(\"TORCHCOMM' src tools "
           "python/torchcomms/*.c | grep -v '^src/core/settings.c:' "
           "| grep -v '^src/backends/nccl/' | grep -v '^src/backends/mpi/' | grep -v '^tools/tcrun.c:.*OMP_NUM_THREADS' "
           "| grep -vE '^tools/tcscale.c:.*getenv\\(\"(MASTER_|RANK|WORLD_SIZE|TCSCALE_)' "
           "| grep -v 'TORCHCOMMS_BACKEND_LIB_PATH_GLOO'",
           TC_SOURCE_DIR);
  FILE *p = popen(cmd, "r");
  TC_ASSERT(p != NULL);
  static char out[1 << 14];
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = 0;
  pclose(p);
  if (n) tc_test_fail(__FILE__, __LINE__, "read around the settings table:\n%s", out);
}

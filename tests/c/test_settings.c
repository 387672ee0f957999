/* test_settings.c -- a bad value of any setting is an error at creation
 * naming the setting and what it accepts (src/core/settings.c); a device the
 * backend cannot serve is refused; the README lists every setting. */
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


/* test_clock.c -- tc__now (src/core/clock.c) against CLOCK_MONOTONIC: after
 * its calibration it extrapolates from the time-stamp counter where that is
 * safe, and must stay within 2 us of CLOCK_MONOTONIC on every call, from
 * several threads at once (more than this machine's cores), across its
 * 10 ms renewals, and never step back by more than that. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/internal.h"
#include "core/settings.h"
#include "runner.h"

#define TOL_S 2e-6

static double mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct {
  double seconds;  /* how long to check */
  long calls;      /* out */
  double worst;    /* out: the largest distance outside [before, after] */
  double back;     /* out: the largest step back between two calls */
} run_t;

/* Calls tc__now between two CLOCK_MONOTONIC readings for r->seconds. */
static void *check_run(void *arg) {
  run_t *r = arg;
  const double end = mono() + r->seconds;
  double last = 0;
  for (;;) {
    const double a = mono(), t = tc__now(), b = mono();
    const double off = t < a ? a - t : t > b ? t - b : 0;
    if (off > r->worst) r->worst = off;
    if (last - t > r->back) r->back = last - t;
    last = t;
    r->calls++;
    if (b >= end) break;
  }
  return NULL;
}

TC_TEST(clock_follows_monotonic) {
  /* past the 20 ms calibration, then 300 ms: 30 renewals */
  run_t warm = {.seconds = 0.05};
  check_run(&warm);
  run_t r = {.seconds = 0.3};
  check_run(&r);
  printf("# %s: %ld calls, worst distance %.0f ns, worst step back %.0f ns\n",
         tc__clock_name(), r.calls, r.worst * 1e9, r.back * 1e9);
#if defined(__x86_64__)
  /* where the kernel's clock runs on the counter, so does ours (not a test
   * of clock_gettime against itself) */
  FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
  char src[32] = {0};
  if (f && fgets(src, sizeof src, f) && !strcmp(src, "tsc\n") && !getenv("TORCHCOMMS_CLOCK"))
    TC_ASSERT_STR_EQ(tc__clock_name(), "tsc");
  if (f) fclose(f);
#endif
  if (warm.worst > TOL_S || r.worst > TOL_S)
    tc_test_fail(__FILE__, __LINE__, "tc__now was %.0f ns away from CLOCK_MONOTONIC",
                 (warm.worst > r.worst ? warm.worst : r.worst) * 1e9);
  if (r.back > TOL_S)
    tc_test_fail(__FILE__, __LINE__, "tc__now stepped back by %.0f ns", r.back * 1e9);
}

TC_TEST(clock_follows_monotonic_from_threads) {
  enum { N = 6 };
  pthread_t th[N];
  run_t r[N];
  for (int i = 0; i < N; i++) {
    r[i] = (run_t){.seconds = 0.25};
    TC_ASSERT_EQ(pthread_create(&th[i], NULL, check_run, &r[i]), 0);
  }
  for (int i = 0; i < N; i++) {
    TC_ASSERT_EQ(pthread_join(th[i], NULL), 0);
    if (r[i].worst > TOL_S || r[i].back > TOL_S)
      tc_test_fail(__FILE__, __LINE__,
                   "thread %d: tc__now %.0f ns away from CLOCK_MONOTONIC, stepped back %.0f ns",
                   i, r[i].worst * 1e9, r[i].back * 1e9);
    TC_ASSERT(r[i].calls > 1000);
  }
}

/* TORCHCOMMS_CLOCK=os (read when the clock decides, at its first call):
 * every call reads CLOCK_MONOTONIC, so it lies between its neighbours
 * exactly. */
TC_TEST(clock_os_setting_reads_monotonic) {
  setenv("TORCHCOMMS_CLOCK", "os", 1);
  char err[256];
  TC_ASSERT_EQ(tc__settings_reload(err, sizeof err), 0);
  tc__clock_reset();
  const double end = mono() + 0.06; /* past the calibration's 20 ms */
  for (long i = 0;; i++) {
    const double a = mono(), t = tc__now(), b = mono();
    if (t < a || t > b)
      tc_test_fail(__FILE__, __LINE__, "call %ld: %.9f outside [%.9f, %.9f]", i, t, a, b);
    if (b > end) break;
  }
  TC_ASSERT_STR_EQ(tc__clock_name(), "clock_gettime");
  unsetenv("TORCHCOMMS_CLOCK");
  TC_ASSERT_EQ(tc__settings_reload(err, sizeof err), 0);
  tc__clock_reset(); /* and back: calibrates again, then the counter */
  run_t r = {.seconds = 0.08};
  check_run(&r);
  TC_ASSERT(r.worst <= TOL_S);
}

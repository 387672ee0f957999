/* clock.c -- the monotonic clock every deadline is measured on.
 *
 * tc__now is CLOCK_MONOTONIC in seconds. Every operation reads it twice
 * (issue and end, for the flight recorder and the deadlines), and through
 * the vDSO one read costs about 24 ns here, a tenth of an 8-byte
 * operation. Where the time-stamp counter is invariant and the kernel keeps
 * its own clock on it (clocksource "tsc"), tc__now instead extrapolates
 * from an anchor (a CLOCK_MONOTONIC reading and the counter at that moment)
 * with the counter's measured rate: about 12 ns. The anchor is renewed from
 * CLOCK_MONOTONIC every 10 ms by whichever thread finds it old (that call
 * returns the CLOCK_MONOTONIC reading), and the rate measured over the last
 * interval, so the result follows
 * CLOCK_MONOTONIC (NTP's slewing included) to within the rate's error over
 * 10 ms: tens of nanoseconds (tests/c/test_clock.c checks 2 us). At a
 * renewal the result may step back by that much; every user takes
 * differences of seconds or clamps them at 0 (durations). The first 20 ms
 * after the first call measure the rate and read CLOCK_MONOTONIC directly.
 *
 * The anchor is a sequence lock: readers retry while a renewal writes it;
 * a renewal takes a try-lock and never waits (a thread that loses it reads
 * CLOCK_MONOTONIC this once), so an anchor that cannot be renewed (a lock
 * left held across a fork) only makes every call read CLOCK_MONOTONIC.
 * TORCHCOMMS_CLOCK=os reads CLOCK_MONOTONIC every time. */
#include "internal.h"
#include "settings.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static double mono_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double tc__now_coarse(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(TC_NO_TSC_CLOCK)
#include <cpuid.h>
#include <x86intrin.h>

enum { TSC_UNKNOWN, TSC_OFF, TSC_CALIBRATING, TSC_ON };
#define TSC_CALIBRATE_S 0.02 /* the first rate: over this long */
#define TSC_RENEW_S 0.01     /* the anchor's age at which it is renewed */

static _Atomic int tsc_state = TSC_UNKNOWN;
static _Atomic int tsc_lock;          /* renewals and the calibration */
static _Atomic uint64_t tsc_seq;      /* odd while the anchor is written */
static _Atomic uint64_t anc_tsc;      /* the counter at the anchor */
static _Atomic double anc_t;          /* CLOCK_MONOTONIC at the anchor, s */
static _Atomic double anc_rate;       /* seconds per tick */
static _Atomic uint64_t renew_ticks;  /* TSC_RENEW_S in ticks */

/* The counter and CLOCK_MONOTONIC read together: the counter halfway
 * across the clock read, of the tightest of a few tries (a try the host
 * or the kernel interrupted would skew the rate). */
static void read_pair(uint64_t *tsc, double *t) {
  uint64_t best = UINT64_MAX;
  *tsc = 0;
  *t = 0;
  for (int i = 0; i < 4; i++) {
    uint64_t a = __rdtsc();
    double m = mono_now();
    uint64_t b = __rdtsc();
    if (b - a < best) {
      best = b - a;
      *t = m;
      *tsc = a + (b - a) / 2;
    }
  }
}

/* An invariant counter (CPUID 0x80000007 EDX bit 8) that the kernel's clock
 * runs on, and TORCHCOMMS_CLOCK not "os". */
static int tsc_usable(void) {
  if (tc__setting_choice(TC_SET_CLOCK) == 1) return 0;
  unsigned a, b, c, d;
  if (!__get_cpuid(0x80000000u, &a, &b, &c, &d) || a < 0x80000007u) return 0;
  __cpuid(0x80000007u, a, b, c, d);
  if (!(d & (1u << 8))) return 0;
  FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
  if (!f) return 0;
  char src[32] = {0};
  int ok = fgets(src, sizeof src, f) != NULL && strncmp(src, "tsc", 3) == 0 &&
           (src[3] == '\n' || src[3] == 0);
  fclose(f);
  return ok;
}

static int try_lock(void) {
  return !atomic_load_explicit(&tsc_lock, memory_order_relaxed) &&
         !atomic_exchange_explicit(&tsc_lock, 1, memory_order_acquire);
}

static void unlock(void) { atomic_store_explicit(&tsc_lock, 0, memory_order_release); }

/* Writes the anchor (under tsc_lock). */
static void publish(uint64_t tsc, double t, double rate) {
  uint64_t s = atomic_load_explicit(&tsc_seq, memory_order_relaxed);
  atomic_store_explicit(&tsc_seq, s + 1, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
  atomic_store_explicit(&anc_tsc, tsc, memory_order_relaxed);
  atomic_store_explicit(&anc_t, t, memory_order_relaxed);
  atomic_store_explicit(&anc_rate, rate, memory_order_relaxed);
  atomic_store_explicit(&renew_ticks, (uint64_t)(TSC_RENEW_S / rate), memory_order_relaxed);
  atomic_store_explicit(&tsc_seq, s + 2, memory_order_release);
}

/* Before TSC_ON: decides, calibrates, and reads CLOCK_MONOTONIC. */
__attribute__((noinline, cold)) static double now_slow(int state) {
  if (state == TSC_UNKNOWN && try_lock()) {
    if (atomic_load(&tsc_state) == TSC_UNKNOWN) {
      if (tsc_usable()) {
        uint64_t tsc;
        double t;
        read_pair(&tsc, &t);
        atomic_store_explicit(&anc_tsc, tsc, memory_order_relaxed);
        atomic_store_explicit(&anc_t, t, memory_order_relaxed);
        atomic_store(&tsc_state, TSC_CALIBRATING);
      } else {
        atomic_store(&tsc_state, TSC_OFF);
      }
    }
    unlock();
  }
  double t = mono_now();
  if (atomic_load(&tsc_state) != TSC_CALIBRATING ||
      t - atomic_load_explicit(&anc_t, memory_order_relaxed) < TSC_CALIBRATE_S || !try_lock())
    return t;
  if (atomic_load(&tsc_state) == TSC_CALIBRATING) {
    uint64_t tsc, t0 = atomic_load_explicit(&anc_tsc, memory_order_relaxed);
    double s0 = atomic_load_explicit(&anc_t, memory_order_relaxed);
    read_pair(&tsc, &t);
    if (tsc > t0) {
      publish(tsc, t, (t - s0) / (double)(tsc - t0));
      atomic_store(&tsc_state, TSC_ON);
    }
  }
  unlock();
  return t;
}

/* A renewal: CLOCK_MONOTONIC now, the rate over the anchor's life. */
__attribute__((noinline)) static double renew(void) {
  uint64_t tsc;
  double t;
  read_pair(&tsc, &t);
  if (try_lock()) {
    uint64_t t0 = atomic_load_explicit(&anc_tsc, memory_order_relaxed);
    double s0 = atomic_load_explicit(&anc_t, memory_order_relaxed);
    double rate = atomic_load_explicit(&anc_rate, memory_order_relaxed);
    /* over at least half the renewal interval: a steady rate, not jitter */
    if (tsc > t0 && t - s0 >= TSC_RENEW_S / 2) {
      double r = (t - s0) / (double)(tsc - t0);
      if (r > rate * 0.5 && r < rate * 2) rate = r; /* else a suspended VM: keep */
    }
    publish(tsc, t, rate);
    unlock();
  }
  return t;
}

double tc__now(void) {
  int state = atomic_load_explicit(&tsc_state, memory_order_relaxed);
  if (__builtin_expect(state != TSC_ON, 0)) return now_slow(state);
  for (;;) {
    uint64_t s = atomic_load_explicit(&tsc_seq, memory_order_acquire);
    uint64_t t0 = atomic_load_explicit(&anc_tsc, memory_order_relaxed);
    double base = atomic_load_explicit(&anc_t, memory_order_relaxed);
    double rate = atomic_load_explicit(&anc_rate, memory_order_relaxed);
    uint64_t renew_at = atomic_load_explicit(&renew_ticks, memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire);
    if ((s & 1) || atomic_load_explicit(&tsc_seq, memory_order_relaxed) != s) continue;
    uint64_t d = __rdtsc() - t0; /* a counter behind the anchor: huge, renewed */
    if (__builtin_expect(d >= renew_at, 0)) return renew();
    return base + (double)(int64_t)d * rate; /* d < renew_at: a signed conversion,
                                                * one instruction */
  }
}

void tc__clock_reset(void) { atomic_store(&tsc_state, TSC_UNKNOWN); }

const char *tc__clock_name(void) {
  switch (atomic_load(&tsc_state)) {
  case TSC_ON: return "tsc";
  case TSC_CALIBRATING: return "calibrating";
  default: return "clock_gettime";
  }
}

#else
double tc__now(void) { return mono_now(); }
const char *tc__clock_name(void) { return "clock_gettime"; }
void tc__clock_reset(void) {}
#endif

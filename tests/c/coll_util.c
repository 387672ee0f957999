/* coll_util.c -- see coll_util.h. */
#include "coll_util.h"

#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <math.h>

char tc_case[256];

void *tc_xmalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) tc_test_fail(__FILE__, __LINE__, "out of memory (%zu bytes)", bytes);
  return p;
}

void *tc_shared_zalloc(size_t bytes) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) tc_test_fail(__FILE__, __LINE__, "mmap of %zu bytes failed", bytes);
  memset(p, 0, bytes);
  return p;
}

void tc_wait_flag(_Atomic int *flag, int value, double timeout_s) {
  double dl = tc__now() + timeout_s;
  while (*flag < value) {
    if (tc__now() > dl)
      tc_test_fail(__FILE__, __LINE__, "condition not reached in %.0f s", timeout_s);
    struct timespec ts = {0, 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

static int tc_is_float(tc_dtype_t dt) {
  return dt == TC_FLOAT32 || dt == TC_FLOAT64 || dt == TC_FLOAT16 ||
         dt == TC_BFLOAT16 || dt == TC_FLOAT8_E4M3FN || dt == TC_FLOAT8_E5M2;
}

void tc_check_equal(const void *got, const void *ref, size_t count,
                    tc_dtype_t dt, tc_redop_type_t op, const char *what) {
  size_t es = tc_dtype_size(dt);
  int approx = tc_is_float(dt) && op == TC_PRODUCT;
  if (!approx) {
    if (count && memcmp(got, ref, count * es) == 0) return;
  }
  double tol = dt == TC_FLOAT8_E4M3FN || dt == TC_FLOAT8_E5M2 ? 0.25
               : dt == TC_FLOAT16 || dt == TC_BFLOAT16 ? 0.05
               : dt == TC_FLOAT32                    ? 1e-5
                                                     : 1e-12;
  for (size_t i = 0; i < count; i++) {
    double g = tc_get(got, i, dt), r = tc_get(ref, i, dt);
    int ok;
    if (!approx)
      ok = !memcmp((const char *)got + i * es, (const char *)ref + i * es, es);
    else
      ok = (isinf(r) && g == r) || fabs(g - r) <= tol * fmax(1.0, fabs(r));
    if (!ok)
      tc_test_fail(__FILE__, __LINE__, "%s: %s[%zu] = %.9g, expected %.9g",
                   tc_case, what, i, g, r);
  }
}

void tc_reference(void *ref, size_t count, tc_dtype_t dt, tc_redop_t op,
                  int n, int seed) {
  size_t bytes = count * tc_dtype_size(dt);
  void *tmp = tc_xmalloc(bytes);
  for (int r = 0; r < n; r++) {
    tc_fill(r == 0 ? ref : tmp, count, dt, r, seed);
    if (op.type == TC_PREMUL_SUM)
      tc__scale(r == 0 ? ref : tmp, r == 0 ? ref : tmp, count, dt, op.factor);
    if (r > 0) tc__reduce(ref, tmp, count, dt, op.type);
  }
  if (op.type == TC_AVG) tc__divide(ref, count, dt, (uint64_t)n);
  free(tmp);
}

/* coll_util.h -- shared helpers of the multi-rank collective tests: data
 * generation, local reference reductions and exact comparisons. */
#ifndef TC_COLL_UTIL_H
#define TC_COLL_UTIL_H

#include "core/internal.h"
#include "runner.h"

/* What the current case is, printed with any mismatch. */
extern char tc_case[256];

/* Fails unless got[0..count) equals ref (a tolerance only for floating-point
 * PRODUCT, whose rounding depends on the order of multiplication). */
void tc_check_equal(const void *got, const void *ref, size_t count,
                    tc_dtype_t dt, tc_redop_type_t op, const char *what);
/* ref = reduction over ranks 0..n-1 of tc_fill(count, dt, r, seed), applying
 * AVG and PREMUL_SUM as the library defines them. */
void tc_reference(void *ref, size_t count, tc_dtype_t dt, tc_redop_t op,
                  int n, int seed);
/* malloc that never returns NULL for 0 bytes and fails the test on OOM. */
void *tc_xmalloc(size_t bytes);
/* Zeroed memory shared with processes forked later (an anonymous shared
 * mapping): flags between the ranks of a test. */
void *tc_shared_zalloc(size_t bytes);
/* Waits (polling every millisecond, bounded) until *flag >= value; fails
 * the test after timeout_s. */
void tc_wait_flag(_Atomic int *flag, int value, double timeout_s);

#define TC_BIG_COUNT ((size_t)1024 * 1024 + 3)

#endif

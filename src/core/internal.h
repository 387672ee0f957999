/* internal.h -- helpers shared by every part of libtorchcomms (not public). */
#ifndef TC_INTERNAL_H
#define TC_INTERNAL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "torchcomms.h"
#include "torchcomms_backend.h"
/* Repeats some declarations below for tcrun and the extension; included
 * so that the compiler checks both agree. */
#include "private_api.h"

#define TC_INTERNAL __attribute__((visibility("hidden")))

/* Sets the calling thread's last error text and returns rc. */
TC_INTERNAL int tc__set_error(int rc, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
TC_INTERNAL int tc__set_error_v(int rc, const char *fmt, va_list ap);
/* Copies text into the thread's last error verbatim and returns rc. */
TC_INTERNAL int tc__set_error_text(int rc, const char *text);

/* Monotonic clock, seconds (clock.c): CLOCK_MONOTONIC, extrapolated from
 * the time-stamp counter where that is safe (within tens of ns of it). */
TC_INTERNAL double tc__now(void);
/* What tc__now reads now: "tsc", "calibrating" (its first 20 ms) or
 * "clock_gettime". */
TC_INTERNAL const char *tc__clock_name(void);
/* For tests, in a process with one thread: decides again at the next call
 * (TORCHCOMMS_CLOCK, the counter) and calibrates again. */
TC_INTERNAL void tc__clock_reset(void);
/* CLOCK_MONOTONIC at the kernel tick's resolution (a few ms behind): for
 * deadlines of seconds, computed once per operation (about 6 ns). */
TC_INTERNAL double tc__now_coarse(void);

/* ---- logging (log.c, log_op.c; docs/logging.md) ----
 * Levels TC_LOG_ERROR (0) .. TC_LOG_TRACE (4) (TORCHCOMMS_LOG, default
 * warn) and subsystem bits TC_LOG_INIT, TC_LOG_COLL, TC_LOG_P2P,
 * TC_LOG_SHM, TC_LOG_TCP, TC_LOG_STORE, TC_LOG_MISC (TORCHCOMMS_LOG_SUBSYS,
 * default all) come from torchcomms_backend.h: backends pass them to the
 * host's `logs`. Errors and warnings are written whatever the subsystem
 * filter says. Every line is "torchcomms LEVEL [rank R pid P] subsys: text",
 * written with one write() to stderr or TORCHCOMMS_LOG_FILE. */

/* The gate: byte `level` holds the subsystem bits written at that level;
 * TC__LOG_GATE_UNSET until the first settings snapshot. */
#define TC__LOG_GATE_UNSET UINT64_MAX
TC_INTERNAL extern _Atomic uint64_t tc__log_gate;
TC_INTERNAL uint64_t tc__log_gate_init(void);
/* 1 when a line of `level` and subsystem `subsys` would be written: one
 * relaxed load and a compare, for hot paths (check before formatting). */
static inline int tc__log_on(int level, int subsys) {
  uint64_t g = atomic_load_explicit(&tc__log_gate, memory_order_relaxed);
  if (__builtin_expect(g == TC__LOG_GATE_UNSET, 0)) g = tc__log_gate_init();
  unsigned l = level < 0 ? 0u : level > 7 ? 7u : (unsigned)level; /* folds for constants */
  return ((g >> (8 * l)) & (unsigned)subsys & 0xffu) != 0;
}
/* tc__log_on as a function (the host table's log_on). */
TC_INTERNAL int tc__log_check(int level, int subsys);
/* Logs a line of subsystem `subsys` at `level` (the host table's logs). */
TC_INTERNAL void tc__logs(int level, int subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
TC_INTERNAL void tc__logv(int level, int subsys, const char *fmt, va_list ap);
/* A line of no particular subsystem ("misc"). */
TC_INTERNAL void tc__log(int level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* 1 when a line of this level and any subsystem would be written. */
TC_INTERNAL int tc__log_enabled(int level);
/* Sets the gate from a settings snapshot (settings.c): TORCHCOMMS_LOG's
 * level and TORCHCOMMS_LOG_SUBSYS's mask. */
TC_INTERNAL void tc__log_configure(int level, uint32_t subsys);
/* The process's rank in the tags: the first call wins (tc_comm_create,
 * from its first communicator); until then the launcher's rank
 * (tc__env_rank_size), else "-". */
TC_INTERNAL void tc__log_set_rank(int rank);
/* The rank tags show now, -1 when unknown. */
TC_INTERNAL int tc__log_rank(void);
/* One line per operation at trace level (log_op.c), subsystem p2p for
 * send, recv and batches, coll otherwise; event "issue" or "done" (done
 * reads the POST fields: status, duration_s, error). Costs one load when
 * trace is off. */
TC_INTERNAL void tc__log_op(const char *event, const tc_op_info_t *info);

/* Window memory that may outlive its window (tc_window_map_ref; defined in
 * core/window.c, used by the built-in backends): a backend registers each
 * area it maps with one hold (the window's) and drops that hold when the
 * window is freed; release(ptr, len) runs at the last hold's end. */
TC_INTERNAL int tc__winmem_add(void *ptr, size_t len, void (*release)(void *, size_t));
TC_INTERNAL int tc__winmem_unref(void *ptr);

/* Rank and size from the launcher's environment (env.c): tc_env_rank_size
 * without the thread error; why (may be NULL) gets the reason. */
TC_INTERNAL int tc__env_rank_size(int *rank, int *size, const char **source, char *why,
                                  size_t wl);

/* Environment settings: declared once, read through typed accessors from
 * a cached snapshot (settings.h). */
#include "settings.h"

#define TC_CHECK(call)                                                         \
  do {                                                                         \
    int tc__rc = (call);                                                       \
    if (tc__rc != TC_OK) return tc__rc;                                        \
  } while (0)

#define TC_CHECK_GOTO(call, rc, label)                                         \
  do {                                                                         \
    (rc) = (call);                                                             \
    if ((rc) != TC_OK) goto label;                                             \
  } while (0)

/* Name of an operation type ("all_reduce"), for messages: from the one op
 * list (TC_OP_MAP, generated inline in torchcomms_backend.h). */
static inline const char *tc__op_name(tc_op_type_t type) { return tc_backend_op_name(type); }

/* Appends printf-style text to buf (len bytes) at *at, truncating at the
 * end (*at stays below len, buf stays terminated). */
static inline void tc__vappendf(char *buf, size_t len, size_t *at, const char *fmt, va_list ap) {
  if (*at + 1 >= len) return;
  int n = vsnprintf(buf + *at, len - *at, fmt, ap);
  if (n > 0) *at += (size_t)n < len - *at ? (size_t)n : len - *at - 1;
}
static inline void tc__appendf(char *buf, size_t len, size_t *at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static inline void tc__appendf(char *buf, size_t len, size_t *at, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  tc__vappendf(buf, len, at, fmt, ap);
  va_end(ap);
}

/* JSON text (well-formed) to a Python pickle, protocol 2 (pickle.c): *out
 * is malloc()ed. TC_ERR_INVALID_ARGUMENT when json is not well-formed. */
TC_INTERNAL int tc__json_to_pickle(const char *json, char **out, size_t *len);

/* ---- reduction kernels (src/reduce/) ---- */

/* 1 if `op` is allowed on `dtype` (bitwise ops: integers and bool only). */
TC_INTERNAL int tc__redop_allowed(tc_dtype_t dtype, tc_redop_type_t op);
/* tc_dtype_size for the per-operation paths: inlined (a table, where the
 * public function is a call into dtype.c). */
static inline size_t tc__dtype_size(tc_dtype_t dtype) {
  switch (dtype) {
#define TC__DTYPE_SIZE_I(name, val, ctype, size, isf)                          \
  case TC_##name:                                                              \
    return size;
    TC_DTYPE_MAP(TC__DTYPE_SIZE_I)
#undef TC__DTYPE_SIZE_I
  default:
    return 0;
  }
}
/* dst[i] = dst[i] (op) src[i] for i < n. op is SUM, PRODUCT, MIN, MAX, BAND,
 * BOR or BXOR (AVG and PREMUL_SUM reduce as SUM). dst and src may be equal.
 * float16/bfloat16 compute in float32 and round to nearest even. */
TC_INTERNAL void tc__reduce(void *dst, const void *src, size_t n,
                            tc_dtype_t dtype, tc_redop_type_t op);
/* out[i] = a[i] (op) b[i]; out may alias a or b. */
TC_INTERNAL void tc__reduce3(void *out, const void *a, const void *b, size_t n,
                             tc_dtype_t dtype, tc_redop_type_t op);
/* dst[i] = src[i] * factor (dst may equal src); integers: rounded toward
 * zero after the multiply in double; bool: nonzero -> 1. */
TC_INTERNAL void tc__scale(void *dst, const void *src, size_t n,
                           tc_dtype_t dtype, double factor);
/* memcpy for copies larger than the caches whose destination is not read
 * again soon: on x86-64, non-temporal stores, which skip reading each
 * destination line before writing it (half the memory traffic of a plain
 * copy); elsewhere memcpy. dst and src must not overlap. */
TC_INTERNAL void tc__copy_stream(void *dst, const void *src, size_t n);
/* buf[i] /= divisor (integers: truncated toward zero, like torch's
 * integer AVG in NCCL). */
TC_INTERNAL void tc__divide(void *buf, size_t n, tc_dtype_t dtype,
                            uint64_t divisor);
/* The highest tier of bfloat16/float16 kernels (reduce, reduce3, scale,
 * divide) that may run where the CPU has it: 0 the generic code, 1 the
 * AVX2/F16C kernels, 2 also the AVX-512 ones (reduce and reduce3; scale
 * and divide have AVX2 kernels only), 3 (the default) also the
 * AVX512-FP16 float16 ones (reduce and reduce3). Returns the tier in use
 * before the call (0 to 3). For tests and benchmarks. */
TC_INTERNAL int tc__reduce_set_simd(int level);
/* The vector width of the AVX-512 (tier 2) float16 reduce and reduce3
 * kernels: 256 or 512 bits, or 0 for the CPU's choice (512 but on AMD
 * family 19h, Zen 4). Returns the width in use before the call, 0 where
 * those kernels are not in use (no AVX-512, a tier set below 2, or the
 * AVX512-FP16 ones in use). For tests and benchmarks. */
TC_INTERNAL int tc__reduce_set_f16_width(int bits);
/* Whether the AVX2 (tier 1) and AVX-512 (tier 2) bfloat16 and float16
 * reduce and reduce3 kernels make software prefetches: 1 yes, 0 no, -1 the
 * CPU's choice (none on AMD family 19h and later: Zen 3, Zen 4, Zen 5),
 * the float16 ones at either width (tc__reduce_set_f16_width). Returns the
 * setting in use before the call (1 or 0), -1 where no such kernel is in
 * use. For tests and benchmarks. */
TC_INTERNAL int tc__reduce_set_prefetch16(int on);
/* 1 where the compiler builds tier 3, the AVX512-FP16 kernels (GCC 12 and
 * clang 14 have the intrinsics). */
#if (defined(__clang__) && __clang_major__ >= 14) ||                           \
    (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 12)
#define TC__CC_AVX512FP16 1
#else
#define TC__CC_AVX512FP16 0
#endif
/* float16 / bfloat16 <-> float32, round to nearest even. */
TC_INTERNAL float tc__half_to_float(uint16_t h);
TC_INTERNAL uint16_t tc__float_to_half(float f);
TC_INTERNAL float tc__bf16_to_float(uint16_t h);
TC_INTERNAL uint16_t tc__float_to_bf16(float f);
/* float8_e4m3fn / float8_e5m2 <-> float32, as torch converts: decoding is
 * exact; encoding rounds to nearest even, e4m3fn saturates to +-448
 * (infinities included), e5m2 overflows to infinity, NaN gives 0x7F with
 * the input's sign. */
TC_INTERNAL float tc__fp8e4m3fn_to_float(uint8_t x);
TC_INTERNAL uint8_t tc__float_to_fp8e4m3fn(float f);
TC_INTERNAL float tc__fp8e5m2_to_float(uint8_t x);
TC_INTERNAL uint8_t tc__float_to_fp8e5m2(float f);

#endif /* TC_INTERNAL_H */

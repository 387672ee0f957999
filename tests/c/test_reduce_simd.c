/* test_reduce_simd.c -- the AVX512-FP16, AVX-512 and AVX2/F16C bfloat16 and float16
 * kernels (src/reduce/reduce.c) against the generic ones and against an element by
 * element reference built from the scalar conversions, bit for bit: random
 * bits (NaN of both signs, quiet and signalling, infinities, subnormals),
 * results that overflow or fall into the subnormal range, every length
 * 1..67 and a few large ones, every start misaligned against the vector
 * width, and every exact aliasing the backend uses. */
#include <math.h>

#include "core/internal.h"
#include "runner.h"

static uint64_t rs = 0x2545F4914F6CDD1Dull;

static uint64_t rnd(void) {
  rs ^= rs >> 12;
  rs ^= rs << 25;
  rs ^= rs >> 27;
  return rs * 0x2545F4914F6CDD1Dull;
}

/* 1: rnd16 gives moderate values only (no NaN, no infinity: the vector
 * kernels' common case, a whole step without a special lane, which the
 * mix below almost never produces at 64 elements a step); 2: the same with
 * one NaN in the middle of a (one step takes the special path among steps
 * that do not). */
static int clean;

/* A random 16-bit float: a quarter any bits, a quarter specials (zeros,
 * infinities, NaN of both signs and kinds, the largest and smallest
 * normals, subnormals), half moderate values (meaningful sums and
 * products, some of which round into the subnormal range or overflow). */
static uint16_t rnd16(tc_dtype_t dt) {
  uint64_t r = rnd();
  if (clean) r = (r & ~(uint64_t)3) | 2; /* the moderate branch below */
  const uint16_t sign = (uint16_t)((r >> 20) & 0x8000);
  static const uint16_t bf_sp[] = {0x0000, 0x7F80, 0x7FC0, 0x7F81, 0x7FFF, 0x7F7F,
                                   0x0080, 0x0001, 0x007F, 0x3F80, 0x0040, 0x7F00};
  static const uint16_t h_sp[] = {0x0000, 0x7C00, 0x7E00, 0x7C01, 0x7FFF, 0x7BFF,
                                  0x0400, 0x0001, 0x03FF, 0x3C00, 0x0200, 0x7800};
  switch (r % 4) {
  case 0: return (uint16_t)(r >> 24);
  case 1: return sign | (dt == TC_BFLOAT16 ? bf_sp : h_sp)[(r >> 8) % 12];
  default:
    if (dt == TC_BFLOAT16) /* exponents 2^-133 .. 2^+127 and small ones */
      return sign | (uint16_t)((((r >> 8) % 2 ? 120 + (r >> 9) % 16 : (r >> 9) % 255) << 7) |
                               ((r >> 32) & 0x7F));
    return sign | (uint16_t)((((r >> 8) % 2 ? 12 + (r >> 9) % 8 : (r >> 9) % 31) << 10) |
                             ((r >> 32) & 0x3FF));
  }
}

static float to_f(tc_dtype_t dt, uint16_t h) {
  return dt == TC_BFLOAT16 ? tc__bf16_to_float(h) : tc__half_to_float(h);
}

static uint16_t from_f(tc_dtype_t dt, float f) {
  return dt == TC_BFLOAT16 ? tc__float_to_bf16(f) : tc__float_to_half(f);
}

/* The reference of one element: the scalar conversions around the float32
 * operation; for float16 SUM/PRODUCT a NaN first operand is the result
 * (whichever operand the compiler puts first in a + b, see
 * tc__nanfirst in reduce.c); bfloat16's NaN is always 0x7FC0. */
static uint16_t ref(tc_dtype_t dt, tc_redop_type_t op, uint16_t a, uint16_t b) {
  const float x = to_f(dt, a), y = to_f(dt, b);
  float r;
  switch (op) {
  case TC_PRODUCT: r = x != x ? x : x * y; break;
  case TC_MIN: r = (x < y || x != x) ? x : y; break;
  case TC_MAX: r = (x > y || x != x) ? x : y; break;
  default: r = x != x ? x : x + y; break;
  }
  return from_f(dt, r);
}

/* A buffer of n elements at `off` elements past a 64-byte boundary, with
 * 16 guard elements of 0xA5 bytes on both sides. */
static uint16_t *buf_new(size_t n, size_t off) {
  uint16_t *base = aligned_alloc(64, ((n + off + 32) * 2 + 63) / 64 * 64);
  TC_ASSERT(base);
  memset(base, 0xA5, (n + off + 32) * 2);
  return base + 16 + off;
}

static void buf_free(uint16_t *p, size_t off) { free(p - 16 - off); }

static void guards(const uint16_t *p, size_t n, const char *what) {
  for (int i = 1; i <= 16; i++) {
    if (p[-i] != 0xA5A5) tc_test_fail(__FILE__, __LINE__, "%s: wrote before the buffer", what);
    if (p[n + (size_t)i - 1] != 0xA5A5)
      tc_test_fail(__FILE__, __LINE__, "%s: wrote past the end (n=%zu)", what, n);
  }
}

/* The highest kernel tier the CPU has (0 generic, 1 AVX2, 2 AVX-512, 3
 * AVX512-FP16 for float16). */
static int simd_present(void) {
  tc__reduce_set_simd(3);
  return tc__reduce_set_simd(3);
}

static const char *const tier_name[] = {"generic", "AVX2", "AVX-512", "AVX512-FP16"};

/* The test data and every call shape for dt x op at n elements, the three
 * buffers at offsets oa, ob, oo; checks the vector kernels (when the CPU
 * has them) and the generic ones. */
static void check(tc_dtype_t dt, tc_redop_type_t op, size_t n, size_t oa, size_t ob, size_t oo) {
  uint16_t *a = buf_new(n, oa), *b = buf_new(n, ob), *o = buf_new(n, oo);
  uint16_t *w = malloc(n * 2 + 2), *ww = malloc(n * 2 + 2);
  TC_ASSERT(w && ww);
  for (size_t i = 0; i < n; i++) {
    a[i] = rnd16(dt);
    b[i] = rnd16(dt);
    w[i] = ref(dt, op, a[i], b[i]);
    ww[i] = ref(dt, op, a[i], a[i]);
  }
  if (clean == 2) {
    const size_t m = n / 2;
    a[m] = dt == TC_BFLOAT16 ? 0xFFC1 : 0xFE01; /* a negative NaN with a payload */
    w[m] = ref(dt, op, a[m], b[m]);
    ww[m] = ref(dt, op, a[m], a[m]);
  }
  /* every tier, the AVX2 and AVX-512 kernels with and without prefetches, the
   * float16 ones at both widths */
  static const struct { int simd, width, prefetch; } pass[] = {
      {3, 0, -1}, {2, 512, 1}, {2, 512, 0}, {2, 256, 1}, {2, 256, 0},
      {1, 0, 1},  {1, 0, 0},   {0, 0, -1}};
  for (size_t ps = 0; ps < sizeof pass / sizeof pass[0]; ps++) {
    const int simd = pass[ps].simd, width = pass[ps].width;
    if (width == 256 && dt != TC_FLOAT16) continue;
    tc__reduce_set_simd(simd);
    tc__reduce_set_f16_width(width);
    tc__reduce_set_prefetch16(pass[ps].prefetch);
    char path[64];
    snprintf(path, sizeof path, "%s%s%s", tier_name[simd],
             simd == 2 && dt == TC_FLOAT16 ? (width == 256 ? " 256-bit" : " 512-bit") : "",
             simd == 1 || simd == 2 ? (pass[ps].prefetch ? " prefetching" : " without prefetches")
                                    : "");
    char what[160];
#define CHECK_OUT(label, x, y, want)                                                     \
  do {                                                                                   \
    snprintf(what, sizeof what, "%s %s %s %s n=%zu offsets %zu/%zu/%zu", path, label,    \
             tc_dtype_name(dt), tc_redop_name(op), n, oa, ob, oo);                       \
    for (size_t i = 0; i < n; i++)                                                       \
      if (o[i] != (want)[i])                                                             \
        tc_test_fail(__FILE__, __LINE__, "%s: element %zu: 0x%04x op 0x%04x = 0x%04x, "  \
                     "expected 0x%04x", what, i, (x)[i], (y)[i], o[i], (want)[i]);       \
    guards(o, n, what);                                                                  \
  } while (0)
    memcpy(o, a, n * 2);
    tc__reduce(o, b, n, dt, op);
    CHECK_OUT("reduce(o=a, b)", a, b, w);
    memset(o, 0x5A, n * 2);
    tc__reduce3(o, a, b, n, dt, op);
    CHECK_OUT("reduce3(o, a, b)", a, b, w);
    memcpy(o, b, n * 2);
    tc__reduce3(o, a, o, n, dt, op);
    CHECK_OUT("reduce3(o, a, o=b)", a, b, w);
    memcpy(o, a, n * 2);
    tc__reduce(o, o, n, dt, op);
    CHECK_OUT("reduce(o=a, o=a)", a, a, ww);
    guards(a, n, "input a");
    guards(b, n, "input b");
#undef CHECK_OUT
  }
  tc__reduce_set_f16_width(0);
  tc__reduce_set_prefetch16(-1);
  /* every tier agrees with the generic code bit for bit, NaN signs included */
  tc__reduce_set_simd(0);
  memset(o, 0, n * 2);
  tc__reduce3(o, a, b, n, dt, op);
  memcpy(w, o, n * 2);
  for (int simd = 3; simd >= 1; simd--) {
    tc__reduce_set_simd(simd);
    tc__reduce3(o, a, b, n, dt, op);
    for (size_t i = 0; i < n; i++)
      if (w[i] != o[i])
        tc_test_fail(__FILE__, __LINE__,
                     "%s %s n=%zu: element %zu: 0x%04x op 0x%04x is 0x%04x (%s) but 0x%04x "
                     "(generic)",
                     tc_dtype_name(dt), tc_redop_name(op), n, i, a[i], b[i], o[i],
                     tier_name[simd], w[i]);
  }
  tc__reduce_set_simd(3);
  free(w);
  free(ww);
  buf_free(a, oa);
  buf_free(b, ob);
  buf_free(o, oo);
}

static const size_t big[] = {255, 256, 257, 1000, 4099, 65536 + 3};

static void check_dtype(tc_dtype_t dt) {
  static const tc_redop_type_t ops[] = {TC_SUM, TC_PRODUCT, TC_MIN, TC_MAX, TC_AVG,
                                        TC_PREMUL_SUM};
  rs = 0x2545F4914F6CDD1Dull + (uint64_t)dt;
  for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
    for (size_t n = 1; n <= 67; n++) check(dt, ops[k], n, n % 16, (n * 7) % 16, (n * 3) % 16);
    for (size_t j = 0; j < sizeof big / sizeof big[0]; j++)
      for (size_t off = 0; off < 3; off++) check(dt, ops[k], big[j], off, 2 * off, 15 - off);
    for (clean = 1; clean <= 2; clean++)
      for (size_t j = 0; j < sizeof big / sizeof big[0]; j++) check(dt, ops[k], big[j], 1, 2, 3);
    clean = 0;
  }
}

/* The vector kernels are present where the CPU has AVX2 (and F16C), the
 * AVX-512 ones where it has AVX512F/BW/DQ/VL: on such a machine this test
 * must not compare the generic code with itself. */
TC_TEST(reduce_simd_present) {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  const int avx2 = __builtin_cpu_supports("avx2") != 0;
  const int z = avx2 && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx512f") &&
                __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                __builtin_cpu_supports("avx512vl");
  const int fp16 = z && TC__CC_AVX512FP16 && __builtin_cpu_supports("avx512fp16");
  const int want = fp16 ? 3 : z ? 2 : avx2;
  TC_ASSERT_EQ(simd_present(), want);
  printf("# 16-bit kernels: %s%s\n", tier_name[want],
         z && !__builtin_cpu_supports("avx512bf16") ? " (bfloat16: AVX2, no AVX512_BF16)" : "");
#else
  const int want = 0;
  TC_ASSERT_EQ(simd_present(), 0);
#endif
  TC_ASSERT_EQ(tc__reduce_set_simd(0), want); /* off: reports what was in use */
  TC_ASSERT_EQ(tc__reduce_set_simd(0), 0);
  TC_ASSERT_EQ(tc__reduce_set_simd(1), 0);
  TC_ASSERT_EQ(tc__reduce_set_simd(2), want ? 1 : 0);
  TC_ASSERT_EQ(tc__reduce_set_simd(3), want < 2 ? want : 2);
  TC_ASSERT_EQ(tc__reduce_set_simd(3), want);
  /* the AVX-512 float16 kernels' width: the CPU's, or the one set */
  if (want == 2) {
    const int w = tc__reduce_set_f16_width(256);
    TC_ASSERT(w == 256 || w == 512);
    TC_ASSERT_EQ(tc__reduce_set_f16_width(512), 256);
    TC_ASSERT_EQ(tc__reduce_set_f16_width(0), 512);
    TC_ASSERT_EQ(tc__reduce_set_f16_width(0), w);
    const int pf = tc__reduce_set_prefetch16(0);
    TC_ASSERT(pf == 0 || pf == 1);
    TC_ASSERT_EQ(tc__reduce_set_prefetch16(1), 0);
    TC_ASSERT_EQ(tc__reduce_set_prefetch16(-1), 1);
    TC_ASSERT_EQ(tc__reduce_set_prefetch16(-1), pf);
    printf("# float16 AVX-512 kernels: %d-bit vectors; AVX-512 16-bit kernels %s\n", w,
           pf ? "prefetching" : "without prefetches");
  } else {
    TC_ASSERT_EQ(tc__reduce_set_f16_width(0), 0);
    if (want == 0) TC_ASSERT_EQ(tc__reduce_set_prefetch16(-1), -1);
  }
  /* the AVX2 kernels (tier 1) prefetch or not as the AVX-512 ones */
  if (want == 1) {
    const int pf = tc__reduce_set_prefetch16(0);
    TC_ASSERT(pf == 0 || pf == 1);
    TC_ASSERT_EQ(tc__reduce_set_prefetch16(1), 0);
    TC_ASSERT_EQ(tc__reduce_set_prefetch16(-1), 1);
    TC_ASSERT_EQ(tc__reduce_set_prefetch16(-1), pf);
    printf("# AVX2 16-bit kernels %s\n", pf ? "prefetching" : "without prefetches");
  }
}

TC_TEST(reduce_simd_bfloat16) { check_dtype(TC_BFLOAT16); }
TC_TEST(reduce_simd_float16) { check_dtype(TC_FLOAT16); }

/* scale (PREMUL_SUM) and divide (AVG): both paths against the scalar
 * reference, factors including 0, -0, Inf, NaN, subnormal and huge ones. */
static void check_scale_divide(tc_dtype_t dt) {
  static const float factors[] = {1.0f, 0.5f, -3.0f, 0.0f, -0.0f, 1e-30f, 1e30f,
                                  (float)INFINITY, (float)NAN, 0.1f, 65504.0f, 1e-40f};
  static const uint64_t divisors[] = {1, 2, 3, 7, 8, 1000, 65537, 1ull << 40};
  rs = 0x9E3779B97F4A7C15ull + (uint64_t)dt;
  const size_t ns[] = {1, 2, 15, 16, 17, 31, 33, 67, 1000, 4099};
  for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
    const size_t n = ns[k];
    for (size_t off = 0; off < 2; off++) {
      uint16_t *s = buf_new(n, off + 3), *d = buf_new(n, off);
      for (size_t i = 0; i < n; i++) s[i] = rnd16(dt);
      for (int simd = 3; simd >= 0; simd--) {
        tc__reduce_set_simd(simd);
        for (size_t f = 0; f < sizeof factors / sizeof factors[0]; f++) {
          tc__scale(d, s, n, dt, factors[f]);
          for (size_t i = 0; i < n; i++) {
            const float x = to_f(dt, s[i]);
            const uint16_t want = from_f(dt, x != x ? x : x * factors[f]);
            if (d[i] != want)
              tc_test_fail(__FILE__, __LINE__,
                           "%s scale %s n=%zu factor %g: element %zu: 0x%04x -> 0x%04x, "
                           "expected 0x%04x",
                           tier_name[simd], tc_dtype_name(dt), n,
                           (double)factors[f], i, s[i], d[i], want);
          }
          guards(d, n, "scale");
          memcpy(d, s, n * 2);
          tc__scale(d, d, n, dt, factors[f]); /* in place */
          for (size_t i = 0; i < n; i++)
            TC_ASSERT_EQ(d[i], from_f(dt, to_f(dt, s[i]) != to_f(dt, s[i]) ? to_f(dt, s[i]) : to_f(dt, s[i]) * factors[f]));
        }
        for (size_t v = 0; v < sizeof divisors / sizeof divisors[0]; v++) {
          memcpy(d, s, n * 2);
          tc__divide(d, n, dt, divisors[v]);
          for (size_t i = 0; i < n; i++) {
            const uint16_t want = from_f(dt, to_f(dt, s[i]) / (float)divisors[v]);
            if (d[i] != want)
              tc_test_fail(__FILE__, __LINE__,
                           "%s divide %s n=%zu by %llu: element %zu: 0x%04x -> 0x%04x, "
                           "expected 0x%04x",
                           tier_name[simd], tc_dtype_name(dt), n,
                           (unsigned long long)divisors[v], i, s[i], d[i], want);
          }
          guards(d, n, "divide");
        }
      }
      tc__reduce_set_simd(3);
      buf_free(s, off + 3);
      buf_free(d, off);
    }
  }
}

TC_TEST(reduce_simd_scale_divide_bfloat16) { check_scale_divide(TC_BFLOAT16); }
TC_TEST(reduce_simd_scale_divide_float16) { check_scale_divide(TC_FLOAT16); }

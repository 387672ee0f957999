/* test_fp8.c -- the 8-bit float dtypes, float8_e4m3fn and float8_e5m2:
 * their conversions (src/reduce/reduce.c) checked against a reference
 * written here by arithmetic on doubles, and against bytes produced by
 * torch; a few reductions by hand. test_reduce.c runs the full dtype x op
 * kernel checks with the references below.
 *
 * The semantics are torch's (2.13, c10/util/Float8_e4m3fn.h and
 * Float8_e5m2.h): decoding is exact; encoding rounds to nearest even;
 * e4m3fn has no infinities and saturates (|x| > 448, infinities included,
 * give +-448, 0x7E), e5m2 overflows to infinity (0x7C); NaN gives 0x7F with
 * the sign of the input. */
#include <float.h>
#include <math.h>

#include "core/internal.h"
#include "runner.h"

double tc_ref_fp8_decode(uint8_t x, tc_dtype_t dt);
uint8_t tc_ref_fp8_encode(float f, tc_dtype_t dt);

static float bits_f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint32_t f_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* ---- reference, by arithmetic on doubles ---- */

/* Mantissa bits, exponent bias and largest finite value of dt. */
static void fp8_format(tc_dtype_t dt, int *mbits, int *bias, double *maxv) {
  if (dt == TC_FLOAT8_E4M3FN) {
    *mbits = 3, *bias = 7, *maxv = 448.0;
  } else {
    *mbits = 2, *bias = 15, *maxv = 57344.0;
  }
}

/* The exact value of x. */
double tc_ref_fp8_decode(uint8_t x, tc_dtype_t dt) {
  int mbits, bias;
  double maxv, v;
  fp8_format(dt, &mbits, &bias, &maxv);
  const int e = (x & 0x7F) >> mbits, m = x & ((1 << mbits) - 1);
  if (dt == TC_FLOAT8_E4M3FN && (x & 0x7F) == 0x7F) v = NAN;
  else if (dt == TC_FLOAT8_E5M2 && e == 31) v = m ? NAN : INFINITY;
  else if (e == 0) v = ldexp(m, 1 - bias - mbits);
  else v = ldexp(m + (1 << mbits), e - bias - mbits);
  return (x & 0x80) ? -v : v;
}

/* f rounded to nearest even; beyond the largest finite value e4m3fn
 * saturates and e5m2 gives infinity; NaN gives 0x7F with f's sign. */
uint8_t tc_ref_fp8_encode(float f, tc_dtype_t dt) {
  int mbits, bias;
  double maxv;
  fp8_format(dt, &mbits, &bias, &maxv);
  const uint8_t sign = signbit(f) ? 0x80 : 0;
  const uint8_t over = dt == TC_FLOAT8_E4M3FN ? 0x7E : 0x7C;
  if (isnan(f)) return sign | 0x7F;
  const double a = fabs((double)f);
  if (isinf(a)) return sign | over;
  if (a == 0) return sign;
  int e2;
  frexp(a, &e2); /* a = g * 2^e2, g in [0.5, 1) */
  int E = e2 - 1;
  if (E < 1 - bias) E = 1 - bias; /* subnormal range */
  const double r = ldexp(rint(ldexp(a, mbits - E)), E - mbits);
  if (r > maxv) return sign | over;
  if (r < ldexp(1.0, 1 - bias)) /* subnormal or zero */
    return sign | (uint8_t)ldexp(r, bias - 1 + mbits);
  frexp(r, &e2);
  E = e2 - 1;
  const int m = (int)ldexp(r, mbits - E) - (1 << mbits);
  return sign | (uint8_t)(((E + bias) << mbits) | m);
}

/* ---- the library's conversions ---- */

static const tc_dtype_t fp8s[2] = {TC_FLOAT8_E4M3FN, TC_FLOAT8_E5M2};

static float dec(uint8_t x, tc_dtype_t dt) {
  return dt == TC_FLOAT8_E4M3FN ? tc__fp8e4m3fn_to_float(x)
                                : tc__fp8e5m2_to_float(x);
}

static uint8_t enc(float f, tc_dtype_t dt) {
  return dt == TC_FLOAT8_E4M3FN ? tc__float_to_fp8e4m3fn(f)
                                : tc__float_to_fp8e5m2(f);
}

/* Fails unless the library and the reference both encode f as want. */
static void check_enc(float f, tc_dtype_t dt, uint8_t want, int line) {
  const uint8_t got = enc(f, dt), ref = tc_ref_fp8_encode(f, dt);
  if (got != want || ref != want)
    tc_test_fail(__FILE__, line, "%s(%a = 0x%08x): library 0x%02x, reference "
                 "0x%02x, expected 0x%02x", tc_dtype_name(dt), (double)f,
                 f_bits(f), got, ref, want);
}

TC_TEST(fp8_decode_and_round_trip) {
  for (int k = 0; k < 2; k++) {
    const tc_dtype_t dt = fp8s[k];
    int nans = 0, infs = 0;
    for (uint32_t x = 0; x < 256; x++) {
      const float f = dec((uint8_t)x, dt);
      const double want = tc_ref_fp8_decode((uint8_t)x, dt);
      if (isnan(want)) { /* NaN: sign kept, re-encodes as 0x7F */
        nans++;
        TC_ASSERT(isnan(f));
        TC_ASSERT_EQ(signbit(f) != 0, (x & 0x80) != 0);
        TC_ASSERT_EQ(enc(f, dt), (x & 0x80) | 0x7F);
        continue;
      }
      infs += isinf(want) != 0;
      TC_ASSERT_EQ(f_bits(f), f_bits((float)want)); /* exact, -0 included */
      TC_ASSERT_EQ(enc(f, dt), x);
      TC_ASSERT_EQ(tc_ref_fp8_encode(f, dt), x);
    }
    TC_ASSERT_EQ(nans, dt == TC_FLOAT8_E4M3FN ? 2 : 6);
    TC_ASSERT_EQ(infs, dt == TC_FLOAT8_E4M3FN ? 0 : 2);
  }
  /* the NaN bits torch's decoder gives */
  TC_ASSERT_EQ(f_bits(tc__fp8e4m3fn_to_float(0x7F)), 0x7FF00000u);
  TC_ASSERT_EQ(f_bits(tc__fp8e4m3fn_to_float(0xFF)), 0xFFF00000u);
  TC_ASSERT_EQ(f_bits(tc__fp8e4m3fn_to_float(0x7E)), f_bits(448.0f));
  TC_ASSERT_EQ(f_bits(tc__fp8e4m3fn_to_float(0x01)), f_bits(0x1p-9f));
  TC_ASSERT_EQ(f_bits(tc__fp8e5m2_to_float(0x7B)), f_bits(57344.0f));
  TC_ASSERT_EQ(f_bits(tc__fp8e5m2_to_float(0x7C)), f_bits(INFINITY));
  TC_ASSERT_EQ(f_bits(tc__fp8e5m2_to_float(0x01)), f_bits(0x1p-16f));
}

/* Expected bytes produced by torch 2.13.0+cpu from the float32 bits in the
 * first column:
 *   f = torch.from_numpy(numpy.array(BITS, dtype=numpy.uint32)
 *                        .view(numpy.float32))
 *   f.to(torch.float8_e4m3fn).view(torch.uint8)   (second column)
 *   f.to(torch.float8_e5m2).view(torch.uint8)     (third column) */
static const struct {
  uint32_t f;
  uint8_t e4m3fn, e5m2;
} torch_table[] = {
    {0x00000000u, 0x00, 0x00}, /* 0 */
    {0x80000000u, 0x80, 0x80}, /* -0 */
    {0x3F800000u, 0x38, 0x3C}, /* 1 */
    {0xBF800000u, 0xB8, 0xBC}, /* -1 */
    {0x3F880000u, 0x38, 0x3C}, /* 1 + 2^-4: e4m3fn tie -> even (1) */
    {0x3F980000u, 0x3A, 0x3D}, /* 1 + 3 * 2^-4: e4m3fn tie -> even (1.25) */
    {0x3F880001u, 0x39, 0x3C}, /* just above the e4m3fn tie */
    {0x3F87FFFFu, 0x38, 0x3C}, /* just below the e4m3fn tie */
    {0x3F900000u, 0x39, 0x3C}, /* 1 + 2^-3: e5m2 tie -> even (1) */
    {0x3FB00000u, 0x3B, 0x3E}, /* 1 + 3 * 2^-3: e5m2 tie -> even (1.5) */
    {0x3F900001u, 0x39, 0x3D}, /* just above the e5m2 tie */
    {0x3DCCCCCDu, 0x1D, 0x2E}, /* 0.1 */
    {0xC0200000u, 0xC2, 0xC1}, /* -2.5 */
    {0x40490FDBu, 0x45, 0x42}, /* pi */
    {0x41880000u, 0x58, 0x4C}, /* 17: e4m3fn tie -> 16 */
    {0x41980000u, 0x5A, 0x4D}, /* 19: e4m3fn tie -> 20 */
    {0x43700000u, 0x77, 0x5C}, /* 240 */
    {0x43880000u, 0x78, 0x5C}, /* 272: e4m3fn tie -> 256 */
    {0x43E00000u, 0x7E, 0x5F}, /* 448: e4m3fn max */
    {0x43E08000u, 0x7E, 0x5F}, /* 449 */
    {0xC3E60000u, 0xFE, 0xDF}, /* -460 */
    {0x43E80000u, 0x7E, 0x5F}, /* 464: e4m3fn tie 448/480 -> saturates */
    {0x43EFFEB8u, 0x7E, 0x5F}, /* 479.99 */
    {0x43F00000u, 0x7E, 0x60}, /* 480: first e4m3fn overflow */
    {0x461C4000u, 0x7E, 0x71}, /* 1e4 */
    {0x47600000u, 0x7E, 0x7B}, /* 57344: e5m2 max */
    {0x476FFF00u, 0x7E, 0x7B}, /* 61439 */
    {0x47700000u, 0x7E, 0x7C}, /* 61440: e5m2 tie 57344/65536 -> Inf */
    {0x47800000u, 0x7E, 0x7C}, /* 65536 */
    {0xC9742400u, 0xFE, 0xFC}, /* -1e6 */
    {0x7F7FFFFFu, 0x7E, 0x7C}, /* FLT_MAX */
    {0x7F800000u, 0x7E, 0x7C}, /* Inf: e4m3fn saturates */
    {0xFF800000u, 0xFE, 0xFC}, /* -Inf */
    {0x3C800000u, 0x08, 0x24}, /* 2^-6: e4m3fn smallest normal */
    {0x3C600000u, 0x07, 0x23}, /* 7 * 2^-9: largest e4m3fn subnormal */
    {0x3C700000u, 0x08, 0x24}, /* 7.5 * 2^-9: tie -> 2^-6 */
    {0x3B000000u, 0x01, 0x18}, /* 2^-9: smallest e4m3fn subnormal */
    {0x3A800000u, 0x00, 0x14}, /* 2^-10: tie -> 0 */
    {0x3B400000u, 0x02, 0x1A}, /* 3 * 2^-10: tie -> 2 * 2^-9 */
    {0x3A800001u, 0x01, 0x14}, /* just above 2^-10 */
    {0xBBA00000u, 0x82, 0x9D}, /* -5 * 2^-10: tie -> -2 * 2^-9 */
    {0x38800000u, 0x00, 0x04}, /* 2^-14: e5m2 smallest normal */
    {0x37800000u, 0x00, 0x01}, /* 2^-16: smallest e5m2 subnormal */
    {0x37000000u, 0x00, 0x00}, /* 2^-17: tie -> 0 */
    {0x37C00000u, 0x00, 0x02}, /* 3 * 2^-17: tie -> 2 * 2^-16 */
    {0x38600000u, 0x00, 0x04}, /* 3.5 * 2^-16: tie -> 2^-14 */
    {0x37000001u, 0x00, 0x01}, /* just above 2^-17 */
    {0x2EDBE6FFu, 0x00, 0x00}, /* 1e-10 */
    {0xAEDBE6FFu, 0x80, 0x80}, /* -1e-10 */
    {0x00000001u, 0x00, 0x00}, /* float32 subnormal */
    {0x7FC00000u, 0x7F, 0x7F}, /* NaN */
    {0xFFC00000u, 0xFF, 0xFF}, /* -NaN */
    {0x7F800001u, 0x7F, 0x7F}, /* signalling NaN */
    {0x7FFFFFFFu, 0x7F, 0x7F}, /* NaN, all ones */
};

TC_TEST(fp8_encode_matches_torch) {
  for (size_t i = 0; i < sizeof torch_table / sizeof torch_table[0]; i++) {
    const float f = bits_f(torch_table[i].f);
    check_enc(f, TC_FLOAT8_E4M3FN, torch_table[i].e4m3fn, __LINE__);
    check_enc(f, TC_FLOAT8_E5M2, torch_table[i].e5m2, __LINE__);
  }
}

TC_TEST(fp8_encode_matches_reference) {
  uint64_t s = 0x2545F4914F6CDD1Dull;
  for (int k = 0; k < 2; k++) {
    const tc_dtype_t dt = fp8s[k];
    /* every tie between neighbouring magnitudes and the floats around it */
    for (uint8_t x = 0; x < (dt == TC_FLOAT8_E4M3FN ? 0x7E : 0x7B); x++) {
      const float mid = (float)((tc_ref_fp8_decode(x, dt) +
                                 tc_ref_fp8_decode((uint8_t)(x + 1), dt)) / 2);
      const float fs[] = {mid, nextafterf(mid, 0), nextafterf(mid, INFINITY)};
      for (int j = 0; j < 3; j++) {
        check_enc(fs[j], dt, tc_ref_fp8_encode(fs[j], dt), __LINE__);
        check_enc(-fs[j], dt, tc_ref_fp8_encode(-fs[j], dt), __LINE__);
      }
    }
    /* random bit patterns; every other one within the format's range */
    for (int i = 0; i < 1000000; i++) {
      s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
      uint32_t u = (uint32_t)((s * 0x2545F4914F6CDD1Dull) >> 32);
      if (i & 1) /* exponent 2^-20 .. 2^17 */
        u = (u & 0x807FFFFFu) | ((107u + (u >> 23) % 38) << 23);
      const float f = bits_f(u);
      const uint8_t got = enc(f, dt), want = tc_ref_fp8_encode(f, dt);
      if (got != want)
        tc_test_fail(__FILE__, __LINE__, "%s(0x%08x): 0x%02x, expected 0x%02x",
                     tc_dtype_name(dt), u, got, want);
    }
  }
}

/* Reductions through the kernels: saturation, infinities, ties, NaN, and
 * the scale / divide paths (PREMUL_SUM, AVG). Expected bytes from torch:
 * (a.float() op b.float()).to(dtype). */
TC_TEST(reduce_fp8_hand_picked) {
  /* e4m3fn: 448 + 448 saturates; 16 + 1 and 16 + 3 are ties (to 16, 20) */
  uint8_t a[5] = {0x7E, 0xFE, 0x58, 0x58, 0x7F};
  uint8_t b[5] = {0x7E, 0xFE, 0x38, 0x44, 0x38}; /* 448, -448, 1, 3, 1 */
  tc__reduce(a, b, 5, TC_FLOAT8_E4M3FN, TC_SUM);
  TC_ASSERT(a[0] == 0x7E && a[1] == 0xFE && a[2] == 0x58 && a[3] == 0x5A);
  TC_ASSERT_EQ(a[4], 0x7F); /* NaN + 1 */
  uint8_t p = 0x7E, q = 0x40; /* 448 * 2 saturates */
  tc__reduce(&p, &q, 1, TC_FLOAT8_E4M3FN, TC_PRODUCT);
  TC_ASSERT_EQ(p, 0x7E);
  uint8_t mx[2] = {0x7F, 0x38}, my[2] = {0x38, 0x7F}; /* MAX propagates NaN */
  tc__reduce(mx, my, 2, TC_FLOAT8_E4M3FN, TC_MAX);
  TC_ASSERT(mx[0] == 0x7F && mx[1] == 0x7F);
  /* e5m2: 57344 + 57344 overflows to Inf; 8 + 1 and 8 + 3 are ties */
  uint8_t c[4] = {0x7B, 0x48, 0x48, 0x7C}, d[4] = {0x7B, 0x3C, 0x42, 0xFC};
  tc__reduce(c, d, 4, TC_FLOAT8_E5M2, TC_SUM);
  TC_ASSERT(c[0] == 0x7C && c[1] == 0x48 && c[2] == 0x4A);
  TC_ASSERT((c[3] & 0x7F) > 0x7C); /* Inf - Inf is NaN */
  uint8_t mn[2] = {0xFC, 0x7C}, mm[2] = {0x3C, 0x3C};
  tc__reduce(mn, mm, 2, TC_FLOAT8_E5M2, TC_MIN);
  TC_ASSERT(mn[0] == 0xFC && mn[1] == 0x3C);
  /* AVG divides in float32 and rounds once: 448 / 3, 57344 / 3 */
  uint8_t e4 = 0x7E, e5 = 0x7B;
  tc__divide(&e4, 1, TC_FLOAT8_E4M3FN, 3);
  tc__divide(&e5, 1, TC_FLOAT8_E5M2, 3);
  TC_ASSERT_EQ(e4, 0x71);
  TC_ASSERT_EQ(e5, 0x75);
  /* PREMUL_SUM scales in float32: 3 * 0.5 = 1.5; 448 * 4 saturates;
   * 57344 * 2 is Inf */
  uint8_t s4[2] = {0x44, 0x7E}, s5 = 0x7B;
  tc__scale(s4, s4, 1, TC_FLOAT8_E4M3FN, 0.5);
  tc__scale(s4 + 1, s4 + 1, 1, TC_FLOAT8_E4M3FN, 4.0);
  tc__scale(&s5, &s5, 1, TC_FLOAT8_E5M2, 2.0);
  TC_ASSERT(s4[0] == 0x3C && s4[1] == 0x7E && s5 == 0x7C);
  /* bitwise reductions are not defined on the float8 types */
  TC_ASSERT(!tc__redop_allowed(TC_FLOAT8_E4M3FN, TC_BAND));
  TC_ASSERT(!tc__redop_allowed(TC_FLOAT8_E5M2, TC_BXOR));
  TC_ASSERT(tc__redop_allowed(TC_FLOAT8_E5M2, TC_PREMUL_SUM));
  TC_ASSERT(tc__redop_allowed(TC_FLOAT8_E4M3FN, TC_AVG));
}

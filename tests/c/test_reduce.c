/* test_reduce.c -- the reduction kernels (src/reduce/reduce.c), the 16-bit
 * float conversions and the dtype / redop names, checked against scalar
 * references written independently here (bit for bit). The 8-bit float
 * references and conversion tests are in test_fp8.c. */
#include <float.h>
#include <math.h>

#include "core/internal.h"
#include "runner.h"

/* ---- deterministic random numbers (xorshift64*) ---- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static void rng_seed(uint64_t s) { rng_state = s * 0x9E3779B97F4A7C15ull + 1; }

static uint64_t rnd(void) {
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545F4914F6CDD1Dull;
}

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

/* ---- reference 16-bit float conversions (binary16: 10/5, bfloat16: 7/8),
 * by arithmetic on doubles rather than bit tricks ---- */

/* The exact value of a 16-bit float with mbits mantissa and ebits exponent
 * bits. */
static double ref_decode(uint16_t h, int mbits, int ebits) {
  const int bias = (1 << (ebits - 1)) - 1;
  const int e = (h >> mbits) & ((1 << ebits) - 1);
  const int m = h & ((1 << mbits) - 1);
  double v;
  if (e == (1 << ebits) - 1) v = m ? NAN : INFINITY;
  else if (e == 0) v = ldexp(m, 1 - bias - mbits);
  else v = ldexp(m + (1 << mbits), e - bias - mbits);
  return (h & 0x8000) ? -v : v;
}

/* x rounded to nearest even in the format; NaN gives `nan_bits` (with the
 * sign of x when keep_nan_sign). */
static uint16_t ref_encode(double x, int mbits, int ebits, uint16_t nan_bits,
                           int keep_nan_sign) {
  const uint16_t sign = signbit(x) ? 0x8000 : 0;
  const int bias = (1 << (ebits - 1)) - 1;
  const uint16_t inf = (uint16_t)(((1 << ebits) - 1) << mbits);
  if (isnan(x)) return (uint16_t)(nan_bits | (keep_nan_sign ? sign : 0));
  double a = fabs(x);
  if (isinf(a)) return sign | inf;
  int e2;
  frexp(a, &e2); /* a = f * 2^e2, f in [0.5, 1) */
  int E = e2 - 1;
  if (E < 1 - bias) E = 1 - bias; /* subnormal range */
  const double ulp = ldexp(1.0, E - mbits);
  double r = rint(a / ulp); /* default rounding mode: nearest even */
  if (r >= ldexp(1.0, mbits + 1)) { /* carried into the next binade */
    r /= 2;
    E++;
  }
  if (r < ldexp(1.0, mbits)) return sign | (uint16_t)r; /* subnormal / 0 */
  const int field = E + bias;
  if (field >= (1 << ebits) - 1) return sign | inf;
  return sign | (uint16_t)(field << mbits) |
         (uint16_t)((int)r - (1 << mbits));
}

static double ref_h2d(uint16_t h) { return ref_decode(h, 10, 5); }
static double ref_bf2d(uint16_t h) { return ref_decode(h, 7, 8); }
static uint16_t ref_f2h(float f) { return ref_encode(f, 10, 5, 0x7E00, 1); }
static uint16_t ref_f2bf(float f) { return ref_encode(f, 7, 8, 0x7FC0, 0); }

/* float8_e4m3fn / float8_e5m2 references (test_fp8.c). */
double tc_ref_fp8_decode(uint8_t x, tc_dtype_t dt);
uint8_t tc_ref_fp8_encode(float f, tc_dtype_t dt);

/* ---- reference reductions ---- */

static int is_fp8(tc_dtype_t dt) {
  return dt == TC_FLOAT8_E4M3FN || dt == TC_FLOAT8_E5M2;
}

static int is_float(tc_dtype_t dt) {
  return dt == TC_FLOAT32 || dt == TC_FLOAT64 || dt == TC_FLOAT16 ||
         dt == TC_BFLOAT16 || is_fp8(dt);
}

/* float op in the precision of T (NaN-propagating MIN/MAX). */
#define REF_FOP(T, op, x, y, out)                                              \
  do {                                                                         \
    T x_ = (x), y_ = (y), r_;                                                  \
    switch (op) {                                                              \
    case TC_PRODUCT: r_ = x_ * y_; break;                                      \
    case TC_MIN: r_ = isnan(x_) || isnan(y_) ? (T)NAN : (y_ < x_ ? y_ : x_);   \
      break;                                                                   \
    case TC_MAX: r_ = isnan(x_) || isnan(y_) ? (T)NAN : (y_ > x_ ? y_ : x_);   \
      break;                                                                   \
    default: r_ = x_ + y_; break;                                              \
    }                                                                          \
    (out) = r_;                                                                \
  } while (0)

/* Sign-extends the low `bytes` bytes of v (signed dtypes) or not. */
static int64_t ext(uint64_t v, size_t bytes, int is_signed) {
  if (bytes == 8) return (int64_t)v;
  const uint64_t m = (1ull << (8 * bytes)) - 1, top = 1ull << (8 * bytes - 1);
  v &= m;
  if (is_signed && (v & top)) return (int64_t)v - (int64_t)(m + 1);
  return (int64_t)v;
}

/* out[i] = ref(a[i] op b[i]) for one element, as raw bits. */
static uint64_t ref_elem(tc_dtype_t dt, tc_redop_type_t op, uint64_t a,
                         uint64_t b) {
  const size_t es = tc_dtype_size(dt);
  const uint64_t mask = es == 8 ? ~0ull : (1ull << (8 * es)) - 1;
  if (op == TC_AVG || op == TC_PREMUL_SUM) op = TC_SUM;
  switch (dt) {
  case TC_FLOAT32: {
    float r;
    REF_FOP(float, op, bits_f((uint32_t)a), bits_f((uint32_t)b), r);
    return f_bits(r);
  }
  case TC_FLOAT64: {
    double x, y, r;
    memcpy(&x, &a, 8);
    memcpy(&y, &b, 8);
    REF_FOP(double, op, x, y, r);
    uint64_t u;
    memcpy(&u, &r, 8);
    return u;
  }
  case TC_FLOAT16: {
    float r;
    REF_FOP(float, op, (float)ref_h2d((uint16_t)a), (float)ref_h2d((uint16_t)b),
            r);
    return ref_f2h(r);
  }
  case TC_BFLOAT16: {
    float r;
    REF_FOP(float, op, (float)ref_bf2d((uint16_t)a),
            (float)ref_bf2d((uint16_t)b), r);
    return ref_f2bf(r);
  }
  case TC_FLOAT8_E4M3FN:
  case TC_FLOAT8_E5M2: {
    float r;
    REF_FOP(float, op, (float)tc_ref_fp8_decode((uint8_t)a, dt),
            (float)tc_ref_fp8_decode((uint8_t)b, dt), r);
    return tc_ref_fp8_encode(r, dt);
  }
  case TC_BOOL: {
    int x = (a & 0xFF) != 0, y = (b & 0xFF) != 0;
    switch (op) {
    case TC_PRODUCT: case TC_MIN: case TC_BAND: return (uint64_t)(x && y);
    case TC_BXOR: return (uint64_t)(x != y);
    default: return (uint64_t)(x || y);
    }
  }
  default: { /* integers, in arithmetic modulo 2^(8*es) */
    const int sgn = dt != TC_UINT8;
    const int64_t x = ext(a, es, sgn), y = ext(b, es, sgn);
    switch (op) {
    case TC_SUM: return (a + b) & mask;
    case TC_PRODUCT: return (a * b) & mask;
    case TC_MIN: return (uint64_t)(x < y ? x : y) & mask;
    case TC_MAX: return (uint64_t)(x > y ? x : y) & mask;
    case TC_BAND: return a & b & mask;
    case TC_BOR: return (a | b) & mask;
    case TC_BXOR: return (a ^ b) & mask;
    default: return 0;
    }
  }
  }
}

/* 1 if the raw bits `got` match `want` for dt: equal bits, or both NaN, or
 * (MIN/MAX only) both zeros of either sign. */
static int same(tc_dtype_t dt, tc_redop_type_t op, uint64_t got,
                uint64_t want) {
  if (got == want) return 1;
  if (!is_float(dt)) return 0;
  double g, w;
  switch (dt) {
  case TC_FLOAT32: g = bits_f((uint32_t)got); w = bits_f((uint32_t)want); break;
  case TC_FLOAT64: memcpy(&g, &got, 8); memcpy(&w, &want, 8); break;
  case TC_FLOAT16: g = ref_h2d((uint16_t)got); w = ref_h2d((uint16_t)want); break;
  case TC_BFLOAT16: g = ref_bf2d((uint16_t)got); w = ref_bf2d((uint16_t)want); break;
  default:
    g = tc_ref_fp8_decode((uint8_t)got, dt);
    w = tc_ref_fp8_decode((uint8_t)want, dt);
    break;
  }
  if (isnan(g) && isnan(w)) return 1;
  return (op == TC_MIN || op == TC_MAX) && g == 0 && w == 0;
}

/* ---- test data ---- */

/* A random element of dt as raw bits: specials, full-range bit patterns and
 * moderate values (so that sums and products are meaningful). */
static uint64_t rnd_elem_any(tc_dtype_t dt) {
  const uint64_t r = rnd();
  const int kind = (int)(r % 16);
  switch (dt) {
  case TC_FLOAT32: {
    static const float sp[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN,
                               FLT_MAX, -FLT_MIN, 1e-40f, 1.0f, -1.0f};
    if (kind == 0) return f_bits(sp[(r >> 8) % 10]);
    if (kind == 1) return (uint32_t)(r >> 16);
    return f_bits(ldexpf((float)((int64_t)(r >> 40) - (1 << 23)) / (1 << 23),
                         (int)((r >> 8) % 41) - 20));
  }
  case TC_FLOAT64: {
    static const double sp[] = {0.0, -0.0, INFINITY, -INFINITY, NAN,
                                DBL_MAX, -DBL_MIN, 1e-310, 1.0, -1.0};
    double d;
    if (kind == 0) d = sp[(r >> 8) % 10];
    else if (kind == 1) return rnd();
    else d = ldexp((double)((int64_t)(r >> 11) - (1ll << 52)) / (1ll << 52),
                   (int)((r >> 8) % 41) - 20);
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
  }
  case TC_FLOAT16:
  case TC_BFLOAT16: {
    if (kind < 4) return (r >> 16) & 0xFFFF; /* any bits, NaN included */
    /* moderate: exponent near the bias */
    const uint16_t sign = (uint16_t)((r >> 20) & 0x8000);
    if (dt == TC_FLOAT16)
      return sign | (uint16_t)(((12 + (r >> 8) % 8) << 10) | ((r >> 32) & 0x3FF));
    return sign | (uint16_t)(((123 + (r >> 8) % 8) << 7) | ((r >> 32) & 0x7F));
  }
  case TC_FLOAT8_E4M3FN:
  case TC_FLOAT8_E5M2: {
    if (kind < 6) return (r >> 16) & 0xFF; /* any bits: NaN, saturation */
    const uint64_t sign = (r >> 20) & 0x80; /* moderate: exponent near bias */
    if (dt == TC_FLOAT8_E4M3FN)
      return sign | ((5 + (r >> 8) % 5) << 3) | ((r >> 32) & 0x7);
    return sign | ((13 + (r >> 8) % 5) << 2) | ((r >> 32) & 0x3);
  }
  case TC_BOOL:
    if (kind == 0) return (r >> 8) & 0xFF; /* any nonzero byte is true */
    return (r >> 8) & 1;
  default:
    if (kind < 8) return rnd(); /* full range: wraps */
    return (uint64_t)((int64_t)((r >> 8) % 9) - 4);
  }
}

/* rnd_elem_any cut to the element's size. */
static uint64_t rnd_elem(tc_dtype_t dt) {
  const size_t es = tc_dtype_size(dt);
  const uint64_t v = rnd_elem_any(dt);
  return es == 8 ? v : v & ((1ull << (8 * es)) - 1);
}

/* Element i of buf as raw bits / set from raw bits. */
static uint64_t get_raw(const void *buf, size_t i, size_t es) {
  uint64_t v = 0;
  memcpy(&v, (const char *)buf + i * es, es);
  return v;
}

static void set_raw(void *buf, size_t i, size_t es, uint64_t v) {
  memcpy((char *)buf + i * es, &v, es);
}

enum { GUARD = 8 }; /* guard elements before and after every buffer */

/* A buffer of n elements at byte offset `off` elements after a guard area,
 * the guards filled with 0xA5. Free with free_buf. */
static void *new_buf(size_t n, size_t es, size_t off) {
  char *base = malloc((n + off + 2 * GUARD) * es);
  TC_ASSERT(base);
  memset(base, 0xA5, (n + off + 2 * GUARD) * es);
  return base + (GUARD + off) * es;
}

static void free_buf(void *p, size_t es, size_t off) {
  free((char *)p - (GUARD + off) * es);
}

/* Fails unless the guards around buf are intact. */
static void check_guards(const void *p, size_t n, size_t es, size_t off,
                         const char *what) {
  const unsigned char *before = (const unsigned char *)p - (GUARD + off) * es;
  const unsigned char *after = (const unsigned char *)p + n * es;
  for (size_t i = 0; i < (GUARD + off) * es; i++)
    if (before[i] != 0xA5)
      tc_test_fail(__FILE__, __LINE__, "%s: wrote before the buffer", what);
  for (size_t i = 0; i < GUARD * es; i++)
    if (after[i] != 0xA5)
      tc_test_fail(__FILE__, __LINE__, "%s: wrote %zu bytes past the end", what,
                   i);
}

/* Compares buf with ref element by element. */
static void check_result(tc_dtype_t dt, tc_redop_type_t op, const void *got,
                         const uint64_t *want, size_t n, const char *what,
                         size_t off) {
  const size_t es = tc_dtype_size(dt);
  for (size_t i = 0; i < n; i++) {
    const uint64_t g = get_raw(got, i, es);
    if (!same(dt, op, g, want[i]))
      tc_test_fail(__FILE__, __LINE__,
                   "%s %s %s n=%zu offset=%zu: element %zu is 0x%llx, "
                   "expected 0x%llx",
                   what, tc_dtype_name(dt), tc_redop_name(op), n, off, i,
                   (unsigned long long)g, (unsigned long long)want[i]);
  }
  check_guards(got, n, es, off, what);
}

/* Every call shape of tc__reduce / tc__reduce3 (distinct buffers and each
 * exact aliasing) for dt x op at n elements, buffers offset by off. */
static void check_case(tc_dtype_t dt, tc_redop_type_t op, size_t n,
                       size_t off) {
  const size_t es = tc_dtype_size(dt);
  void *a = new_buf(n, es, off), *b = new_buf(n, es, off);
  void *o = new_buf(n, es, off);
  uint64_t *ab = malloc((n + 1) * 8), *aa = malloc((n + 1) * 8);
  uint64_t *araw = malloc((n + 1) * 8), *braw = malloc((n + 1) * 8);
  TC_ASSERT(ab && aa && araw && braw);
  for (size_t i = 0; i < n; i++) {
    araw[i] = rnd_elem(dt);
    braw[i] = rnd_elem(dt);
    set_raw(a, i, es, araw[i]);
    set_raw(b, i, es, braw[i]);
    ab[i] = ref_elem(dt, op, araw[i], braw[i]);
    aa[i] = ref_elem(dt, op, araw[i], araw[i]);
  }
  /* tc__reduce(o, b) with o = a */
  memcpy(o, a, n * es);
  tc__reduce(o, b, n, dt, op);
  check_result(dt, op, o, ab, n, "reduce(dst, src)", off);
  /* tc__reduce3(o, a, b) into a fresh buffer */
  memset(o, 0x5A, n * es);
  tc__reduce3(o, a, b, n, dt, op);
  check_result(dt, op, o, ab, n, "reduce3(out, a, b)", off);
  /* inputs untouched */
  for (size_t i = 0; i < n; i++) {
    TC_ASSERT_EQ(get_raw(a, i, es), araw[i]);
    TC_ASSERT_EQ(get_raw(b, i, es), braw[i]);
  }
  /* out == a */
  memcpy(o, a, n * es);
  tc__reduce3(o, o, b, n, dt, op);
  check_result(dt, op, o, ab, n, "reduce3(out, out, b)", off);
  /* out == b: out = a op out */
  memcpy(o, b, n * es);
  tc__reduce3(o, a, o, n, dt, op);
  check_result(dt, op, o, ab, n, "reduce3(out, a, out)", off);
  /* dst == src */
  memcpy(o, a, n * es);
  tc__reduce(o, o, n, dt, op);
  check_result(dt, op, o, aa, n, "reduce(dst, dst)", off);
  /* out == a == b */
  memcpy(o, a, n * es);
  tc__reduce3(o, o, o, n, dt, op);
  check_result(dt, op, o, aa, n, "reduce3(out, out, out)", off);
  /* a == b, out distinct */
  tc__reduce3(o, a, a, n, dt, op);
  check_result(dt, op, o, aa, n, "reduce3(out, a, a)", off);
  free(ab);
  free(aa);
  free(araw);
  free(braw);
  free_buf(a, es, off);
  free_buf(b, es, off);
  free_buf(o, es, off);
}

/* Every allowed op of dt, for n = 0-5 (the inline sums of up to 4
 * elements, reduce.c's reduce_tiny, and past them), 7, 1000, 4099,
 * aligned and offset by one element. Returns how many (op, n, offset) cases ran. */
static int check_dtype(tc_dtype_t dt) {
  static const size_t ns[] = {0, 1, 2, 3, 4, 5, 7, 1000, 4099};
  int cases = 0;
  rng_seed((uint64_t)dt + 1);
  for (int op = 0; op < TC_REDOP_COUNT; op++) {
    if (!tc__redop_allowed(dt, (tc_redop_type_t)op)) continue;
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
      for (size_t off = 0; off < 2; off++, cases++)
        check_case(dt, (tc_redop_type_t)op, ns[k], off);
  }
  TC_ASSERT(cases > 0);
  return cases;
}

TC_TEST(reduce_float32) { check_dtype(TC_FLOAT32); }
TC_TEST(reduce_float64) { check_dtype(TC_FLOAT64); }
TC_TEST(reduce_float16) { check_dtype(TC_FLOAT16); }
TC_TEST(reduce_bfloat16) { check_dtype(TC_BFLOAT16); }
TC_TEST(reduce_int8) { check_dtype(TC_INT8); }
TC_TEST(reduce_uint8) { check_dtype(TC_UINT8); }
TC_TEST(reduce_int16) { check_dtype(TC_INT16); }
TC_TEST(reduce_int32) { check_dtype(TC_INT32); }
TC_TEST(reduce_int64) { check_dtype(TC_INT64); }
TC_TEST(reduce_bool) { check_dtype(TC_BOOL); }
TC_TEST(reduce_float8_e4m3fn) { check_dtype(TC_FLOAT8_E4M3FN); }
TC_TEST(reduce_float8_e5m2) { check_dtype(TC_FLOAT8_E5M2); }

/* A large buffer crosses many vector blocks and staging steps. */
TC_TEST(reduce_large_aliased) {
  rng_seed(77);
  check_case(TC_FLOAT32, TC_SUM, 100003, 1);
  check_case(TC_BFLOAT16, TC_MAX, 100003, 1);
  check_case(TC_INT8, TC_PRODUCT, 100003, 0);
}

TC_TEST(reduce_hand_picked) {
  /* integer wrap-around */
  int32_t i32[2] = {INT32_MAX, INT32_MIN}, j32[2] = {1, -1};
  tc__reduce(i32, j32, 2, TC_INT32, TC_SUM);
  TC_ASSERT_EQ(i32[0], INT32_MIN);
  TC_ASSERT_EQ(i32[1], INT32_MAX);
  int64_t i64 = INT64_MAX, j64 = 2;
  tc__reduce(&i64, &j64, 1, TC_INT64, TC_PRODUCT);
  TC_ASSERT_EQ(i64, -2);
  uint8_t u8 = 200, v8 = 100;
  tc__reduce(&u8, &v8, 1, TC_UINT8, TC_SUM);
  TC_ASSERT_EQ(u8, 44);
  int8_t s8 = -128, t8 = -1;
  tc__reduce(&s8, &t8, 1, TC_INT8, TC_PRODUCT);
  TC_ASSERT_EQ(s8, -128);
  /* bool stays 0/1 with any nonzero input */
  uint8_t bo[4] = {0, 2, 255, 0}, bi[4] = {7, 0, 1, 0};
  tc__reduce(bo, bi, 4, TC_BOOL, TC_SUM);
  TC_ASSERT(bo[0] == 1 && bo[1] == 1 && bo[2] == 1 && bo[3] == 0);
  uint8_t bx[2] = {3, 3}, by[2] = {5, 0};
  tc__reduce(bx, by, 2, TC_BOOL, TC_BXOR);
  TC_ASSERT(bx[0] == 0 && bx[1] == 1);
  /* NaN propagates through MIN and MAX from either side */
  float fa[2] = {NAN, 1.0f}, fb[2] = {1.0f, NAN};
  float fo[2];
  tc__reduce3(fo, fa, fb, 2, TC_FLOAT32, TC_MIN);
  TC_ASSERT(isnan(fo[0]) && isnan(fo[1]));
  tc__reduce3(fo, fa, fb, 2, TC_FLOAT32, TC_MAX);
  TC_ASSERT(isnan(fo[0]) && isnan(fo[1]));
  /* fp16: 2048 + 1 is a tie, to even (2048); 2048 + 3 -> 2052 */
  uint16_t h[2] = {tc__float_to_half(2048), tc__float_to_half(2048)};
  uint16_t g[2] = {tc__float_to_half(1), tc__float_to_half(3)};
  tc__reduce(h, g, 2, TC_FLOAT16, TC_SUM);
  TC_ASSERT_EQ(h[0], 0x6800);
  TC_ASSERT_EQ(h[1], 0x6802);
  /* fp16 overflow to Inf */
  uint16_t m = 0x7BFF, m2 = 0x7BFF;
  tc__reduce(&m, &m2, 1, TC_FLOAT16, TC_SUM);
  TC_ASSERT_EQ(m, 0x7C00);
  /* bf16: 256 + 1 is a tie, to even (256); 256 + 3 -> 260 */
  uint16_t bh[2] = {0x4380, 0x4380}, bg[2] = {0x3F80, 0x4040};
  tc__reduce(bh, bg, 2, TC_BFLOAT16, TC_SUM);
  TC_ASSERT_EQ(bh[0], 0x4380);
  TC_ASSERT_EQ(bh[1], 0x4382);
  /* AVG and PREMUL_SUM reduce as SUM */
  float x = 1.5f, y = 2.0f;
  tc__reduce(&x, &y, 1, TC_FLOAT32, TC_AVG);
  TC_ASSERT_DBL_NEAR(x, 3.5, 0);
  tc__reduce(&x, &y, 1, TC_FLOAT32, TC_PREMUL_SUM);
  TC_ASSERT_DBL_NEAR(x, 5.5, 0);
  /* an invalid dtype or op leaves the buffer alone */
  tc__reduce(&x, &y, 1, (tc_dtype_t)99, TC_SUM);
  tc__reduce(&x, &y, 1, TC_FLOAT32, (tc_redop_type_t)99);
  tc__reduce(&x, &y, 1, TC_FLOAT32, TC_BAND);
  TC_ASSERT_DBL_NEAR(x, 5.5, 0);
}

TC_TEST(reduce_redop_allowed) {
  /* rows: dtypes in enum order; columns: SUM PRODUCT MIN MAX BAND BOR BXOR
   * AVG PREMUL_SUM */
  static const char *const expect[TC_DTYPE_COUNT] = {
      "111100011", "111100011", "111100011", "111100011", "111111110",
      "111111110", "111111110", "111111110", "111111110", "111111100",
      "111100011", "111100011"};
  for (int dt = 0; dt < TC_DTYPE_COUNT; dt++)
    for (int op = 0; op < TC_REDOP_COUNT; op++) {
      const int want = expect[dt][op] == '1';
      const int got = tc__redop_allowed((tc_dtype_t)dt, (tc_redop_type_t)op);
      if (got != want)
        tc_test_fail(__FILE__, __LINE__, "tc__redop_allowed(%s, %s) = %d, "
                     "expected %d", tc_dtype_name((tc_dtype_t)dt),
                     tc_redop_name((tc_redop_type_t)op), got, want);
      /* the public query (torchcomms.h) answers the same */
      if (tc_redop_supported((tc_dtype_t)dt, (tc_redop_type_t)op) != want)
        tc_test_fail(__FILE__, __LINE__, "tc_redop_supported(%s, %s) != %d",
                     tc_dtype_name((tc_dtype_t)dt),
                     tc_redop_name((tc_redop_type_t)op), want);
    }
  TC_ASSERT_EQ(tc_redop_supported((tc_dtype_t)-1, TC_SUM), 0);
  TC_ASSERT_EQ(tc_redop_supported(TC_INT32, (tc_redop_type_t)TC_REDOP_COUNT), 0);
  TC_ASSERT_EQ(tc__redop_allowed((tc_dtype_t)TC_DTYPE_COUNT, TC_SUM), 0);
  TC_ASSERT_EQ(tc__redop_allowed((tc_dtype_t)-1, TC_SUM), 0);
  TC_ASSERT_EQ(tc__redop_allowed(TC_INT32, (tc_redop_type_t)TC_REDOP_COUNT), 0);
}

/* ---- 16-bit float conversions ---- */

TC_TEST(half_reference_matches_Float16) {
  /* the test's own reference, checked against the compiler's _Float16 */
#ifdef __FLT16_MAX__
  for (uint32_t h = 0; h < 65536; h++) {
    _Float16 v;
    uint16_t hb = (uint16_t)h;
    memcpy(&v, &hb, 2);
    double d = ref_h2d(hb);
    if (!(isnan(d) && isnan((double)v))) TC_ASSERT(d == (double)v);
  }
  rng_seed(5);
  for (int i = 0; i < 200000; i++) {
    float f = bits_f((uint32_t)rnd());
    if (isnan(f)) continue;
    _Float16 v = (_Float16)f;
    uint16_t hb;
    memcpy(&hb, &v, 2);
    TC_ASSERT_EQ(ref_f2h(f), hb);
  }
#endif
}

TC_TEST(half_conversions) {
  /* every binary16 value decodes exactly and round-trips */
  for (uint32_t h = 0; h < 65536; h++) {
    const float f = tc__half_to_float((uint16_t)h);
    const double want = ref_h2d((uint16_t)h);
    if (isnan(want)) {
      TC_ASSERT(isnan(f));
      TC_ASSERT_EQ(signbit(f) != 0, (h & 0x8000) != 0);
      TC_ASSERT_EQ(tc__float_to_half(f), (h & 0x8000) | 0x7E00);
    } else {
      TC_ASSERT_EQ(f_bits(f), f_bits((float)want));
      TC_ASSERT_EQ(tc__float_to_half(f), h);
    }
  }
  /* random floats round to nearest even */
  rng_seed(11);
  for (int i = 0; i < 1000000; i++) {
    uint32_t u = (uint32_t)rnd();
    if (i & 1) u = (u & 0x80000000u) | ((u & 0x0FFFFFFFu) + 0x38000000u);
    TC_ASSERT_EQ(tc__float_to_half(bits_f(u)), ref_f2h(bits_f(u)));
  }
  /* hand-picked: ties to even, overflow, subnormals, NaN */
  static const struct { float f; uint16_t h; } cases[] = {
      {1.0f, 0x3C00},
      {1.0f + 0x1p-11f, 0x3C00},              /* tie -> even (down) */
      {1.0f + 3 * 0x1p-11f, 0x3C02},          /* tie -> even (up) */
      {1.0f + 0x1p-11f + 0x1p-20f, 0x3C01},   /* above the tie */
      {-2.0f, 0xC000},
      {65504.0f, 0x7BFF},                     /* largest finite */
      {65519.0f, 0x7BFF},
      {65520.0f, 0x7C00},                     /* tie -> Inf */
      {1e10f, 0x7C00},
      {-1e10f, 0xFC00},
      {INFINITY, 0x7C00},
      {-INFINITY, 0xFC00},
      {0x1p-24f, 0x0001},                     /* smallest subnormal */
      {0x1p-25f, 0x0000},                     /* tie -> even (0) */
      {0x1p-25f + 0x1p-35f, 0x0001},
      {3 * 0x1p-25f, 0x0002},                 /* tie -> even (2) */
      {1023 * 0x1p-24f, 0x03FF},              /* largest subnormal */
      {1023.5f * 0x1p-24f, 0x0400},           /* tie -> smallest normal */
      {0x1p-14f, 0x0400},
      {1e-10f, 0x0000},
      {-1e-10f, 0x8000},
      {-0.0f, 0x8000},
      {0x1p-149f, 0x0000},                    /* float32 subnormal */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    TC_ASSERT_EQ(tc__float_to_half(cases[i].f), cases[i].h);
    TC_ASSERT_EQ(ref_f2h(cases[i].f), cases[i].h);
  }
  TC_ASSERT_EQ(tc__float_to_half(NAN), 0x7E00);
  TC_ASSERT_EQ(tc__float_to_half(-NAN), 0xFE00);
  TC_ASSERT_EQ(tc__float_to_half(bits_f(0x7F800001u)), 0x7E00); /* sNaN */
  TC_ASSERT(isinf(tc__half_to_float(0x7C00)));
  TC_ASSERT(isnan(tc__half_to_float(0x7C01)));
  TC_ASSERT_EQ(f_bits(tc__half_to_float(0x0001)), f_bits(0x1p-24f));
  TC_ASSERT_EQ(f_bits(tc__half_to_float(0x8000)), 0x80000000u);
}

TC_TEST(bf16_conversions) {
  for (uint32_t h = 0; h < 65536; h++) {
    const float f = tc__bf16_to_float((uint16_t)h);
    const double want = ref_bf2d((uint16_t)h);
    TC_ASSERT_EQ(f_bits(f), h << 16); /* exact: the upper half */
    if (isnan(want)) {
      TC_ASSERT(isnan(f));
      TC_ASSERT_EQ(tc__float_to_bf16(f), 0x7FC0);
    } else {
      TC_ASSERT(f == (float)want);
      TC_ASSERT_EQ(tc__float_to_bf16(f), h);
    }
  }
  rng_seed(13);
  for (int i = 0; i < 1000000; i++) {
    const float f = bits_f((uint32_t)rnd());
    TC_ASSERT_EQ(tc__float_to_bf16(f), ref_f2bf(f));
  }
  static const struct { uint32_t f; uint16_t h; } cases[] = {
      {0x3F808000u, 0x3F80}, /* 1 + 2^-8: tie -> even (down) */
      {0x3F818000u, 0x3F82}, /* 1 + 3 * 2^-8: tie -> even (up) */
      {0x3F808001u, 0x3F81}, /* above the tie */
      {0x3F807FFFu, 0x3F80}, /* below the tie */
      {0x7F7FFFFFu, 0x7F80}, /* FLT_MAX rounds to Inf */
      {0x7F7F7FFFu, 0x7F7F}, /* largest finite stays */
      {0x7F800000u, 0x7F80}, /* Inf */
      {0xFF800000u, 0xFF80}, /* -Inf */
      {0x00008000u, 0x0000}, /* subnormal tie -> even (0) */
      {0x00018000u, 0x0002}, /* subnormal tie -> even (2) */
      {0x00008001u, 0x0001},
      {0x00000001u, 0x0000},
      {0x80000000u, 0x8000}, /* -0 */
      {0x7FC00000u, 0x7FC0}, /* NaN */
      {0xFFC00000u, 0x7FC0}, /* -NaN: canonical, as in torch */
      {0x7F800001u, 0x7FC0}, /* signalling NaN must not become Inf */
      {0x7FFFFFFFu, 0x7FC0}, /* NaN must not carry into the sign */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    TC_ASSERT_EQ(tc__float_to_bf16(bits_f(cases[i].f)), cases[i].h);
    TC_ASSERT_EQ(ref_f2bf(bits_f(cases[i].f)), cases[i].h);
  }
}

/* ---- scale and divide ---- */

/* Reference of x * f as tc__scale defines it, raw bits in and out. */
static uint64_t ref_scale(tc_dtype_t dt, uint64_t x, double f) {
  const size_t es = tc_dtype_size(dt);
  const uint64_t mask = es == 8 ? ~0ull : (1ull << (8 * es)) - 1;
  switch (dt) {
  case TC_FLOAT32: return f_bits(bits_f((uint32_t)x) * (float)f);
  case TC_FLOAT64: {
    double d;
    memcpy(&d, &x, 8);
    d *= f;
    memcpy(&x, &d, 8);
    return x;
  }
  case TC_FLOAT16: return ref_f2h((float)ref_h2d((uint16_t)x) * (float)f);
  case TC_BFLOAT16: return ref_f2bf((float)ref_bf2d((uint16_t)x) * (float)f);
  case TC_FLOAT8_E4M3FN:
  case TC_FLOAT8_E5M2:
    return tc_ref_fp8_encode((float)tc_ref_fp8_decode((uint8_t)x, dt) * (float)f, dt);
  case TC_BOOL: return (x & 0xFF) != 0 && f != 0;
  default: {
    const double v = trunc((double)ext(x, es, dt != TC_UINT8) * f);
    return (uint64_t)(int64_t)v & mask;
  }
  }
}

/* Reference of x / d as tc__divide defines it. */
static uint64_t ref_divide(tc_dtype_t dt, uint64_t x, uint64_t d) {
  const size_t es = tc_dtype_size(dt);
  const uint64_t mask = es == 8 ? ~0ull : (1ull << (8 * es)) - 1;
  switch (dt) {
  case TC_FLOAT32: return f_bits(bits_f((uint32_t)x) / (float)d);
  case TC_FLOAT64: {
    double v;
    memcpy(&v, &x, 8);
    v /= (double)d;
    memcpy(&x, &v, 8);
    return x;
  }
  case TC_FLOAT16: return ref_f2h((float)ref_h2d((uint16_t)x) / (float)d);
  case TC_BFLOAT16: return ref_f2bf((float)ref_bf2d((uint16_t)x) / (float)d);
  case TC_FLOAT8_E4M3FN:
  case TC_FLOAT8_E5M2:
    return tc_ref_fp8_encode((float)tc_ref_fp8_decode((uint8_t)x, dt) / (float)d, dt);
  case TC_BOOL: return ((x & 0xFF) != 0) / d;
  case TC_UINT8: return (x & 0xFF) / d;
  default: {
    const int64_t v = ext(x, es, 1);
    if (d > (uint64_t)INT64_MAX) return 0; /* |v| < d for the data used */
    const int64_t q = v / (int64_t)d;        /* C truncates toward zero */
    return (uint64_t)q & mask;
  }
  }
}

TC_TEST(reduce_scale) {
  static const double factors[] = {0.5, -3.0, 1.0 / 3.0, 0.0, 1.0, 1e-3};
  const size_t n = 1000;
  rng_seed(21);
  for (int dt = 0; dt < TC_DTYPE_COUNT; dt++) {
    const size_t es = tc_dtype_size((tc_dtype_t)dt);
    for (size_t fi = 0; fi < sizeof factors / sizeof factors[0]; fi++) {
      for (size_t off = 0; off < 2; off++) {
        void *src = new_buf(n, es, off), *dst = new_buf(n, es, off);
        uint64_t *want = malloc(n * 8);
        for (size_t i = 0; i < n; i++) {
          uint64_t v = rnd_elem((tc_dtype_t)dt);
          if (!is_float((tc_dtype_t)dt) && dt != TC_BOOL)
            v = (uint64_t)((int64_t)(rnd() % 201) - 100); /* no saturation */
          if (dt == TC_UINT8) v &= 0x7F;
          set_raw(src, i, es, v);
          want[i] = ref_scale((tc_dtype_t)dt, v, factors[fi]);
        }
        tc__scale(dst, src, n, (tc_dtype_t)dt, factors[fi]);
        check_result((tc_dtype_t)dt, TC_SUM, dst, want, n, "scale", off);
        tc__scale(src, src, n, (tc_dtype_t)dt, factors[fi]);
        check_result((tc_dtype_t)dt, TC_SUM, src, want, n, "scale in place",
                     off);
        free(want);
        free_buf(src, es, off);
        free_buf(dst, es, off);
      }
    }
  }
  /* integers: truncated toward zero; saturating before the cast */
  int32_t i32[4] = {7, -7, 5, -5};
  tc__scale(i32, i32, 4, TC_INT32, 0.5);
  TC_ASSERT(i32[0] == 3 && i32[1] == -3 && i32[2] == 2 && i32[3] == -2);
  int64_t i64[3] = {5, -5, 5};
  tc__scale(i64, i64, 2, TC_INT64, 1e30);
  TC_ASSERT_EQ(i64[0], INT64_MAX);
  TC_ASSERT_EQ(i64[1], INT64_MIN);
  tc__scale(i64 + 2, i64 + 2, 1, TC_INT64, NAN);
  TC_ASSERT_EQ(i64[2], 0);
  uint8_t b[3] = {0, 1, 9};
  tc__scale(b, b, 3, TC_BOOL, 0.25);
  TC_ASSERT(b[0] == 0 && b[1] == 1 && b[2] == 1);
  tc__scale(b, b, 3, TC_BOOL, 0.0);
  TC_ASSERT(b[0] == 0 && b[1] == 0 && b[2] == 0);
  /* fp16 in float32 precision, rounded once */
  uint16_t h = tc__float_to_half(3.0f);
  tc__scale(&h, &h, 1, TC_FLOAT16, 1.0 / 3.0);
  TC_ASSERT_EQ(h, ref_f2h(3.0f * (float)(1.0 / 3.0)));
}

TC_TEST(reduce_divide) {
  static const uint64_t divisors[] = {1, 2, 3, 7, 1000, 1ull << 40};
  const size_t n = 1000;
  rng_seed(31);
  for (int dt = 0; dt < TC_DTYPE_COUNT; dt++) {
    const size_t es = tc_dtype_size((tc_dtype_t)dt);
    for (size_t di = 0; di < sizeof divisors / sizeof divisors[0]; di++) {
      void *buf = new_buf(n, es, 1);
      uint64_t *want = malloc(n * 8);
      for (size_t i = 0; i < n; i++) {
        uint64_t v = rnd_elem((tc_dtype_t)dt);
        if (dt == TC_INT64) v = (uint64_t)((int64_t)v >> 1); /* not MIN */
        set_raw(buf, i, es, v);
        want[i] = ref_divide((tc_dtype_t)dt, v, divisors[di]);
      }
      tc__divide(buf, n, (tc_dtype_t)dt, divisors[di]);
      check_result((tc_dtype_t)dt, TC_SUM, buf, want, n, "divide", 1);
      free(want);
      free_buf(buf, es, 1);
    }
  }
  int32_t i32[4] = {-7, 7, -1, INT32_MIN};
  tc__divide(i32, 4, TC_INT32, 2);
  TC_ASSERT(i32[0] == -3 && i32[1] == 3 && i32[2] == 0 &&
            i32[3] == INT32_MIN / 2);
  int64_t i64[3] = {INT64_MIN, INT64_MAX, -5};
  tc__divide(i64, 3, TC_INT64, 1ull << 63);
  TC_ASSERT(i64[0] == -1 && i64[1] == 0 && i64[2] == 0);
  uint8_t u8[2] = {255, 3};
  tc__divide(u8, 2, TC_UINT8, 2);
  TC_ASSERT(u8[0] == 127 && u8[1] == 1);
  float f[2] = {1.0f, -3.0f};
  tc__divide(f, 2, TC_FLOAT32, 0); /* 0: left unchanged */
  TC_ASSERT(f[0] == 1.0f && f[1] == -3.0f);
  tc__divide(f, 2, TC_FLOAT32, 4);
  TC_ASSERT(f[0] == 0.25f && f[1] == -0.75f);
  uint16_t bf = tc__float_to_bf16(3.0f);
  tc__divide(&bf, 1, TC_BFLOAT16, 3);
  TC_ASSERT_EQ(bf, 0x3F80);
}

/* ---- names and sizes (src/core/dtype.c) ---- */

TC_TEST(dtype_names_and_sizes) {
  static const char *const names[] = {"float32", "float64", "float16",
                                      "bfloat16", "int8", "uint8", "int16",
                                      "int32", "int64", "bool",
                                      "float8_e4m3fn", "float8_e5m2"};
  static const size_t sizes[] = {4, 8, 2, 2, 1, 1, 2, 4, 8, 1, 1, 1};
  _Static_assert(sizeof sizes / sizeof sizes[0] == TC_DTYPE_COUNT, "sizes");
  for (int dt = 0; dt < TC_DTYPE_COUNT; dt++) {
    TC_ASSERT_STR_EQ(tc_dtype_name((tc_dtype_t)dt), names[dt]);
    TC_ASSERT_EQ(tc_dtype_size((tc_dtype_t)dt), sizes[dt]);
  }
  TC_ASSERT_STR_EQ(tc_dtype_name(TC_DTYPE_COUNT), "invalid");
  TC_ASSERT_STR_EQ(tc_dtype_name((tc_dtype_t)-1), "invalid");
  TC_ASSERT_EQ(tc_dtype_size(TC_DTYPE_COUNT), 0);
  TC_ASSERT_EQ(tc_dtype_size((tc_dtype_t)-3), 0);
  static const char *const ops[] = {"SUM", "PRODUCT", "MIN", "MAX", "BAND",
                                    "BOR", "BXOR", "AVG", "PREMUL_SUM"};
  for (int op = 0; op < TC_REDOP_COUNT; op++)
    TC_ASSERT_STR_EQ(tc_redop_name((tc_redop_type_t)op), ops[op]);
  TC_ASSERT_STR_EQ(tc_redop_name(TC_REDOP_COUNT), "invalid");
  TC_ASSERT_STR_EQ(tc_redop_name((tc_redop_type_t)-1), "invalid");
}

/* tc__copy_stream: every size around its thresholds (the 256-byte minimum,
 * the 64-byte steps, the head that aligns the destination) at every
 * alignment of both sides equals memcpy, and writes nothing outside. */
TC_TEST(copy_stream_equals_memcpy) {
  const size_t sizes[] = {0, 1, 63, 64, 65, 255, 256, 257, 319, 320, 383, 4096 + 13,
                          (1u << 20) + 5};
  const size_t offs[] = {0, 1, 17, 63};
  const size_t pad = 128, cap = (1u << 20) + 5 + 2 * pad + 64;
  unsigned char *src = malloc(cap), *dst = malloc(cap), *ref = malloc(cap);
  TC_ASSERT(src && dst && ref);
  rng_seed(11);
  for (size_t i = 0; i < cap; i++) src[i] = (unsigned char)rnd();
  for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
    for (size_t a = 0; a < 4; a++)
      for (size_t b = 0; b < 4; b++) {
        size_t n = sizes[si];
        memset(dst, 0xA5, cap);
        memset(ref, 0xA5, cap);
        tc__copy_stream(dst + pad + offs[a], src + offs[b], n);
        memcpy(ref + pad + offs[a], src + offs[b], n);
        if (memcmp(dst, ref, cap) != 0)
          tc_test_fail(__FILE__, __LINE__, "size %zu, destination offset %zu, source offset %zu: "
                       "differs from memcpy", n, offs[a], offs[b]);
      }
  free(src);
  free(dst);
  free(ref);
}

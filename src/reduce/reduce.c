/* reduce.c -- elementwise reduction kernels for every dtype x op.
 *
 * One X-macro (TC__REDUCE_KERNELS) lists every allowed (dtype, op) pair; it
 * generates, per pair, a two-operand kernel (dst op= src) and a
 * three-operand kernel (out = a op b), both over `restrict` pointers, and the
 * table the dispatchers pick one kernel from, once per call.
 *
 * Vectorisation. GCC at -O2 only vectorises loops whose trip count is known
 * to be a multiple of the vector width (the "very cheap" cost model), so the
 * kernels run fixed-size inner blocks (TC__BLK elements) and a short scalar
 * tail. The hot loops are compiled for AVX-512, AVX2 and the baseline with
 * target_clones (an ifunc picks one at load time); they are not used
 * outside GCC on x86-64 with glibc, under -fsanitize=thread (the ifunc resolvers run
 * before TSan is initialised and crash the program at load) and with
 * -DTC_NO_TARGET_CLONES. GCC 12 handles it under -fsanitize=address,undefined
 * in executables and shared libraries, so ASan builds run the same clones.
 *
 * float16 / bfloat16 and the 8-bit floats (float8_e4m3fn, float8_e5m2)
 * convert blocks of TC__HBLK elements to float32 on the stack, compute there
 * and round back to nearest even, with branch-free conversions (the same
 * bits as torch's c10::Half / c10::BFloat16 / c10::Float8_e4m3fn /
 * c10::Float8_e5m2) so that the blocks vectorise too. As in torch (2.13),
 * float8_e4m3fn saturates: values beyond its range, infinities included,
 * become +-448; float8_e5m2 overflows to infinity.
 *
 * Semantics:
 *  - floats: SUM, PRODUCT in the type's precision (float32 for the 16- and
 *    8-bit floats, rounded once per operation); MIN/MAX propagate NaN
 *    (like torch.minimum/maximum); between -0 and +0 either may be returned.
 *  - integers: SUM/PRODUCT wrap (computed in unsigned arithmetic), MIN, MAX,
 *    BAND, BOR, BXOR.
 *  - bool: SUM/MAX/BOR are logical or, PRODUCT/MIN/BAND logical and, BXOR
 *    xor; any nonzero input byte counts as true and outputs are 0 or 1.
 *  - AVG and PREMUL_SUM reduce as SUM (the caller scales / divides).
 *
 * Aliasing: the restrict kernels never see aliased pointers. The dispatchers
 * route exact aliasing (dst == src, out == a, out == b) to an equivalent
 * restrict-clean call, staging the aliased operand through a stack buffer
 * where needed. Partially overlapping buffers are not supported.
 */
#include <math.h>
#include <string.h>

#include "core/internal.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) &&        \
    defined(__GLIBC__) && !defined(__SANITIZE_THREAD__) &&                    \
    !defined(TC_NO_TARGET_CLONES)
#ifndef TC_TARGET_CLONES /* overridable, e.g. to test the AVX2 clones */
#define TC_TARGET_CLONES "avx512f", "avx2", "default"
#endif
#define TC__HOT __attribute__((target_clones(TC_TARGET_CLONES)))
#else
#define TC__HOT
#endif

#define TC__INLINE static inline __attribute__((always_inline))

enum {
  TC__BLK = 64,    /* inner block of the native kernels, elements */
  TC__HBLK = 256,  /* float32 staging block of the 16/8-bit float kernels */
  TC__STAGE = 4096 /* bytes staged per step for aliased operands */
};

/* ------------------------------------------------------------------------ */
/* 16-bit float conversions                                                  */
/* ------------------------------------------------------------------------ */

/* The bits of a float, and the float of some bits. */
TC__INLINE uint32_t tc__fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
TC__INLINE float tc__bitsf(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* c ? a : b for c in {0, 1}, with masks: a ?: on values computed with
 * floating-point operations would be turned into branches (the operations
 * may trap), which stops the block loops from vectorising. */
TC__INLINE uint32_t tc__select(uint32_t c, uint32_t a, uint32_t b) {
  const uint32_t m = 0u - c;
  return (a & m) | (b & ~m);
}

/* IEEE binary16 -> float32, exact (Maratyszcza's FP16 method, as in torch):
 * normals and Inf/NaN by rebiasing the exponent with one multiply,
 * subnormals through a magic-number subtraction. */
TC__INLINE float tc__h2f(uint16_t h) {
  const uint32_t w = (uint32_t)h << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const float normalized = tc__bitsf((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float denormalized = tc__bitsf((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t r = tc__select(two_w < (1u << 27), tc__fbits(denormalized),
                                tc__fbits(normalized));
  return tc__bitsf(sign | r);
}

/* float32 -> IEEE binary16, round to nearest even; overflow gives Inf, NaN
 * gives the quiet NaN 0x7E00 with the input's sign. The float additions do
 * the rounding: `base` (|f| scaled so that too-large values become Inf) is
 * added to a power of two whose ulp is the binary16 ulp of f. */
TC__INLINE uint16_t tc__f2h(float f) {
  float base = (fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = tc__fbits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  bias = bias < 0x71000000u ? 0x71000000u : bias;
  base = tc__bitsf((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = tc__fbits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return (uint16_t)((sign >> 16) |
                    tc__select(shl1_w > 0xFF000000u, 0x7E00u, nonsign));
}

/* bfloat16 -> float32: the upper half of the float's bits. */
TC__INLINE float tc__bf2f(uint16_t h) { return tc__bitsf((uint32_t)h << 16); }

/* float32 -> bfloat16, round to nearest even (subnormals and overflow to Inf
 * fall out of the integer rounding); NaN gives 0x7FC0 as in torch. */
TC__INLINE uint16_t tc__f2bf(float f) {
  const uint32_t u = tc__fbits(f);
  const uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return (uint16_t)(f != f ? 0x7FC0u : r);
}

/* ------------------------------------------------------------------------ */
/* 8-bit float conversions (OCP float8_e4m3fn and float8_e5m2)               */
/* ------------------------------------------------------------------------ */

/* float8_e4m3fn -> float32, exact (bias 7, no infinities, NaN S.1111.111).
 * Normals: the seven value bits placed as a float's exponent and mantissa,
 * rebiased with one multiply; subnormals (m * 2^-9) by a magic-number
 * subtraction, so that no float subnormal is ever an operand (slow on x86).
 * NaN decodes to 0x7FF00000 with the sign, the bits torch gives. */
TC__INLINE float tc__e4m3f(uint8_t x) {
  const uint32_t v = x & 0x7Fu;
  const uint32_t sign = (uint32_t)(x & 0x80u) << 24;
  const uint32_t vn = tc__select(v < 8u, 8u, v); /* no subnormal operand */
  const float normalized = tc__bitsf(vn << 20) * 0x1.0p+120f;
  const float denormalized = tc__bitsf((141u << 23) | v) - 0x1.0p+14f;
  const uint32_t r = tc__select(v < 8u, tc__fbits(denormalized),
                                tc__fbits(normalized));
  return tc__bitsf(sign | tc__select(v == 0x7Fu, 0x7FF00000u, r));
}

/* float32 -> float8_e4m3fn, round to nearest even, torch's algorithm made
 * branch-free: below 2^-6 the float addition of 2^14 rounds |f| to a
 * multiple of 2^-9; above, the mantissa is rounded with integer additions.
 * |f| >= 480, infinities and what rounds up to 480 saturate to 448 (0x7E);
 * NaN gives 0x7F; the sign is kept. */
TC__INLINE uint8_t tc__f2e4m3(float f) {
  const uint32_t w = tc__fbits(f);
  const uint32_t sign = w & 0x80000000u;
  const uint32_t a = w ^ sign;
  const uint32_t den = tc__fbits(tc__bitsf(a) + 0x1.0p+14f) - (141u << 23);
  const uint32_t nrm =
      (a + ((uint32_t)(7 - 127) << 23) + 0x7FFFFu + ((a >> 20) & 1u)) >> 20;
  uint32_t r = tc__select(a < (121u << 23), den, nrm);
  r = tc__select(r == 0x7Fu || a >= (1087u << 20), 0x7Eu, r);
  r = tc__select(a > 0x7F800000u, 0x7Fu, r);
  return (uint8_t)((sign >> 24) | r);
}

/* float8_e5m2 -> float32, exact: the upper byte of a binary16. */
TC__INLINE float tc__e5m2f(uint8_t x) { return tc__h2f((uint16_t)(x << 8)); }

/* float32 -> float8_e5m2, round to nearest even (torch's algorithm,
 * branch-free, as for e4m3fn with 2^7 for the subnormals); |f| >= 65536 and
 * what rounds up past 57344 give infinity (0x7C); NaN gives 0x7F. */
TC__INLINE uint8_t tc__f2e5m2(float f) {
  const uint32_t w = tc__fbits(f);
  const uint32_t sign = w & 0x80000000u;
  const uint32_t a = w ^ sign;
  const uint32_t den = tc__fbits(tc__bitsf(a) + 0x1.0p+7f) - (134u << 23);
  const uint32_t nrm =
      (a + ((uint32_t)(15 - 127) << 23) + 0xFFFFFu + ((a >> 21) & 1u)) >> 21;
  uint32_t r = tc__select(a < (113u << 23), den, nrm);
  r = tc__select(a >= (143u << 23), 0x7Cu, r);
  r = tc__select(a > 0x7F800000u, 0x7Fu, r);
  return (uint8_t)((sign >> 24) | r);
}

/* Exported (internal) versions of the conversions. */
float tc__half_to_float(uint16_t h) { return tc__h2f(h); }
uint16_t tc__float_to_half(float f) { return tc__f2h(f); }
float tc__bf16_to_float(uint16_t h) { return tc__bf2f(h); }
uint16_t tc__float_to_bf16(float f) { return tc__f2bf(f); }
float tc__fp8e4m3fn_to_float(uint8_t x) { return tc__e4m3f(x); }
uint8_t tc__float_to_fp8e4m3fn(float f) { return tc__f2e4m3(f); }
float tc__fp8e5m2_to_float(uint8_t x) { return tc__e5m2f(x); }
uint8_t tc__float_to_fp8e5m2(float f) { return tc__f2e5m2(f); }

/* ------------------------------------------------------------------------ */
/* Element operations, per kind: OP(T, U, a, b) with T the storage type and  */
/* U the type the arithmetic is done in.                                     */
/* ------------------------------------------------------------------------ */

#define TC__OP_FLT_SUM(T, U, a, b) ((a) + (b))
#define TC__OP_FLT_PRODUCT(T, U, a, b) ((a) * (b))
#define TC__OP_FLT_MIN(T, U, a, b) (((a) < (b) || (a) != (a)) ? (a) : (b))
#define TC__OP_FLT_MAX(T, U, a, b) (((a) > (b) || (a) != (a)) ? (a) : (b))

#define TC__OP_INT_SUM(T, U, a, b) ((T)((U)(a) + (U)(b)))
#define TC__OP_INT_PRODUCT(T, U, a, b) ((T)((U)(a) * (U)(b)))
#define TC__OP_INT_MIN(T, U, a, b) ((T)((a) < (b) ? (a) : (b)))
#define TC__OP_INT_MAX(T, U, a, b) ((T)((a) > (b) ? (a) : (b)))
#define TC__OP_INT_BAND(T, U, a, b) ((T)((a) & (b)))
#define TC__OP_INT_BOR(T, U, a, b) ((T)((a) | (b)))
#define TC__OP_INT_BXOR(T, U, a, b) ((T)((a) ^ (b)))

#define TC__OP_BOOL_OR(a, b) ((uint8_t)(((a) | (b)) != 0))
#define TC__OP_BOOL_AND(a, b) ((uint8_t)(((a) != 0) & ((b) != 0)))
#define TC__OP_BOOL_SUM(T, U, a, b) TC__OP_BOOL_OR(a, b)
#define TC__OP_BOOL_PRODUCT(T, U, a, b) TC__OP_BOOL_AND(a, b)
#define TC__OP_BOOL_MIN(T, U, a, b) TC__OP_BOOL_AND(a, b)
#define TC__OP_BOOL_MAX(T, U, a, b) TC__OP_BOOL_OR(a, b)
#define TC__OP_BOOL_BAND(T, U, a, b) TC__OP_BOOL_AND(a, b)
#define TC__OP_BOOL_BOR(T, U, a, b) TC__OP_BOOL_OR(a, b)
#define TC__OP_BOOL_BXOR(T, U, a, b) ((uint8_t)(((a) != 0) ^ ((b) != 0)))

/* r, or a where a is NaN. x86 returns the first operand's NaN when both
 * are NaN, but which operand of a + b comes first is the compiler's choice:
 * float16 keeps the NaN's sign (tc__f2h), so its SUM/PRODUCT (and scale)
 * name it: a NaN a wins, the same in the generic and the vector kernels. */
TC__INLINE float tc__nanfirst(float a, float r) {
  return tc__bitsf(tc__select(a != a, tc__fbits(a), tc__fbits(r)));
}

/* The 16- and 8-bit floats compute with the float32 operations. */
#define TC__OP_F16_SUM(T, U, a, b) tc__nanfirst(a, (a) + (b))
#define TC__OP_F16_PRODUCT(T, U, a, b) tc__nanfirst(a, (a) * (b))
#define TC__OP_F16_MIN TC__OP_FLT_MIN
#define TC__OP_F16_MAX TC__OP_FLT_MAX
#define TC__OP_BF16_SUM TC__OP_FLT_SUM
#define TC__OP_BF16_PRODUCT TC__OP_FLT_PRODUCT
#define TC__OP_BF16_MIN TC__OP_FLT_MIN
#define TC__OP_BF16_MAX TC__OP_FLT_MAX
#define TC__OP_F8E4M3_SUM TC__OP_FLT_SUM
#define TC__OP_F8E4M3_PRODUCT TC__OP_FLT_PRODUCT
#define TC__OP_F8E4M3_MIN TC__OP_FLT_MIN
#define TC__OP_F8E4M3_MAX TC__OP_FLT_MAX
#define TC__OP_F8E5M2_SUM TC__OP_FLT_SUM
#define TC__OP_F8E5M2_PRODUCT TC__OP_FLT_PRODUCT
#define TC__OP_F8E5M2_MIN TC__OP_FLT_MIN
#define TC__OP_F8E5M2_MAX TC__OP_FLT_MAX

/* Operations per kind, each as Y(OP, DTYPE, T, U, KIND). */
#define TC__OPS_ARITH(Y, D, T, U, K)                                           \
  Y(SUM, D, T, U, K) Y(PRODUCT, D, T, U, K) Y(MIN, D, T, U, K)                 \
  Y(MAX, D, T, U, K)
#define TC__OPS_BITWISE(Y, D, T, U, K)                                         \
  TC__OPS_ARITH(Y, D, T, U, K)                                                 \
  Y(BAND, D, T, U, K) Y(BOR, D, T, U, K) Y(BXOR, D, T, U, K)

/* THE list: every allowed dtype x op, as X(OP, DTYPE, T, U, KIND). */
#define TC__REDUCE_KERNELS(X)                                                  \
  TC__OPS_ARITH(X, FLOAT32, float, float, FLT)                                 \
  TC__OPS_ARITH(X, FLOAT64, double, double, FLT)                               \
  TC__OPS_ARITH(X, FLOAT16, uint16_t, float, F16)                              \
  TC__OPS_ARITH(X, BFLOAT16, uint16_t, float, BF16)                            \
  TC__OPS_BITWISE(X, INT8, int8_t, unsigned, INT)                              \
  TC__OPS_BITWISE(X, UINT8, uint8_t, unsigned, INT)                            \
  TC__OPS_BITWISE(X, INT16, int16_t, unsigned, INT)                            \
  TC__OPS_BITWISE(X, INT32, int32_t, uint32_t, INT)                            \
  TC__OPS_BITWISE(X, INT64, int64_t, uint64_t, INT)                            \
  TC__OPS_BITWISE(X, BOOL, uint8_t, unsigned, BOOL)                            \
  TC__OPS_ARITH(X, FLOAT8_E4M3FN, uint8_t, float, F8E4M3)                      \
  TC__OPS_ARITH(X, FLOAT8_E5M2, uint8_t, float, F8E5M2)

/* ------------------------------------------------------------------------ */
/* Kernel generators                                                         */
/* ------------------------------------------------------------------------ */

/* One element of a native kernel: dst[i] = x[i] op y[i]. */
#define TC__ELEM(OP, T, U, K, dst, x, y, i)                                    \
  do {                                                                         \
    const T a = (x)[i], b = (y)[i];                                            \
    (dst)[i] = TC__OP_##K##_##OP(T, U, a, b);                                  \
  } while (0)

/* Native types (float, double, integers, bool): k2 is d[i] = d[i] op s[i],
 * k3 is o[i] = a[i] op b[i]. No pointer may alias another that is written.
 * Fixed-size inner blocks (vectorised even at -O2), then a scalar tail. The
 * typed kernels (k2t, k3t) take restrict parameters (GCC ignores restrict on
 * local pointers); k2 and k3 adapt them to the table's void signatures. */
#define TC__GEN_NATIVE(OP, D, T, U, K)                                         \
  static TC__HOT void tc__k2t_##D##_##OP(T *restrict d, const T *restrict s,   \
                                         size_t n) {                           \
    size_t i = 0;                                                              \
    for (; i + TC__BLK <= n; i += TC__BLK)                                     \
      for (size_t j = 0; j < TC__BLK; j++)                                     \
        TC__ELEM(OP, T, U, K, d, d, s, i + j);                                 \
    for (; i < n; i++) TC__ELEM(OP, T, U, K, d, d, s, i);                      \
  }                                                                            \
  static TC__HOT void tc__k3t_##D##_##OP(T *restrict o, const T *restrict pa,  \
                                         const T *restrict pb, size_t n) {     \
    size_t i = 0;                                                              \
    for (; i + TC__BLK <= n; i += TC__BLK)                                     \
      for (size_t j = 0; j < TC__BLK; j++)                                     \
        TC__ELEM(OP, T, U, K, o, pa, pb, i + j);                               \
    for (; i < n; i++) TC__ELEM(OP, T, U, K, o, pa, pb, i);                    \
  }                                                                            \
  static void tc__k2_##D##_##OP(void *d, const void *s, size_t n) {            \
    tc__k2t_##D##_##OP((T *)d, (const T *)s, n);                               \
  }                                                                            \
  static void tc__k3_##D##_##OP(void *o, const void *a, const void *b,         \
                                size_t n) {                                    \
    tc__k3t_##D##_##OP((T *)o, (const T *)a, (const T *)b, n);                 \
  }

/* 16- and 8-bit floats (storage type T): a block of TC__HBLK elements is
 * converted and combined into a float32 buffer, then rounded back; every
 * input of the block is read before any output is written, so o may even
 * alias pa or pb. The tail goes through zero-padded copies so that it takes
 * the same vector code. */
#define TC__GEN_HALF(OP, D, T, U, K, TOF, FROMF)                               \
  TC__INLINE void tc__hb_##D##_##OP(T *o, const T *pa, const T *pb) {         \
    float f[TC__HBLK];                                                         \
    for (size_t j = 0; j < TC__HBLK; j++) {                                    \
      const float a = TOF(pa[j]), b = TOF(pb[j]);                              \
      f[j] = TC__OP_##K##_##OP(float, float, a, b);                            \
    }                                                                          \
    for (size_t j = 0; j < TC__HBLK; j++) o[j] = FROMF(f[j]);                  \
  }                                                                            \
  static TC__HOT void tc__k3_##D##_##OP(void *ov, const void *av,              \
                                        const void *bv, size_t n) {            \
    T *o = (T *)ov;                                                            \
    const T *pa = (const T *)av, *pb = (const T *)bv;                          \
    size_t i = 0;                                                              \
    for (; i + TC__HBLK <= n; i += TC__HBLK)                                   \
      tc__hb_##D##_##OP(o + i, pa + i, pb + i);                                \
    if (i < n) {                                                               \
      T ta[TC__HBLK], tb[TC__HBLK];                                            \
      memset(ta, 0, sizeof ta);                                                \
      memset(tb, 0, sizeof tb);                                                \
      memcpy(ta, pa + i, (n - i) * sizeof(T));                                 \
      memcpy(tb, pb + i, (n - i) * sizeof(T));                                 \
      tc__hb_##D##_##OP(ta, ta, tb);                                           \
      memcpy(o + i, ta, (n - i) * sizeof(T));                                  \
    }                                                                          \
  }                                                                            \
  static void tc__k2_##D##_##OP(void *dv, const void *sv, size_t n) {          \
    tc__k3_##D##_##OP(dv, dv, sv, n);                                          \
  }

#define TC__GEN_FLT(OP, D, T, U, K) TC__GEN_NATIVE(OP, D, T, U, K)
#define TC__GEN_INT(OP, D, T, U, K) TC__GEN_NATIVE(OP, D, T, U, K)
#define TC__GEN_BOOL(OP, D, T, U, K) TC__GEN_NATIVE(OP, D, T, U, K)
#define TC__GEN_F16(OP, D, T, U, K)                                            \
  TC__GEN_HALF(OP, D, T, U, K, tc__h2f, tc__f2h)
#define TC__GEN_BF16(OP, D, T, U, K)                                           \
  TC__GEN_HALF(OP, D, T, U, K, tc__bf2f, tc__f2bf)
#define TC__GEN_F8E4M3(OP, D, T, U, K)                                         \
  TC__GEN_HALF(OP, D, T, U, K, tc__e4m3f, tc__f2e4m3)
#define TC__GEN_F8E5M2(OP, D, T, U, K)                                         \
  TC__GEN_HALF(OP, D, T, U, K, tc__e5m2f, tc__f2e5m2)
#define TC__GEN(OP, D, T, U, K) TC__GEN_##K(OP, D, T, U, K)

TC__REDUCE_KERNELS(TC__GEN)

/* ------------------------------------------------------------------------ */
/* AVX2 (+F16C) kernels for bfloat16 and float16                             */
/* ------------------------------------------------------------------------ */

/* The generic 16-bit kernels above convert element by element (GCC does
 * not vectorise tc__h2f / tc__f2h well, and F16C is not part of the avx2
 * clone): 1-5 GB/s where float32 runs at 10-40. These explicit AVX2
 * kernels, picked at run time when the CPU has AVX2 (and F16C for float16),
 * give the SAME BITS as the generic ones (tests/c/test_reduce_simd.c checks
 * it): the operation is the same float32 instruction, and
 *  - bfloat16 -> float32 is a shift (exact); float32 -> bfloat16 is
 *    tc__f2bf's integer round to nearest even, NaN -> 0x7FC0;
 *  - float16 <-> float32 is F16C's vcvtph2ps (exact) and vcvtps2ph with
 *    round to nearest even, which equal tc__h2f / tc__f2h on every float32
 *    except NaN, where tc__f2h gives the quiet NaN 0x7E00 with the sign:
 *    NaN lanes are first replaced by the float32 quiet NaN 0x7FC00000 with
 *    their sign, which converts to exactly that.
 *  - MIN/MAX: vminps/vmaxps return the second operand when either is NaN
 *    or both are zeros, i.e. (a < b ? a : b); blending in a where a is NaN
 *    gives TC__OP_FLT_MIN's ((a < b || a != a) ? a : b), and MAX alike.
 * Not used: AVX512_BF16's vcvtneps2bf16 (it flushes float32 subnormals to
 * zero and keeps NaN payloads: other bits than tc__f2bf). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(TC_NO_SIMD16)
#include <immintrin.h>
#define TC__SIMD16 1
#define TC__AVX2 __attribute__((target("avx2,f16c")))
#define TC__AVX2_INLINE static inline __attribute__((always_inline, target("avx2,f16c")))

/* r, or a in the lanes where a is NaN (tc__nanfirst, TC__OP_FLT_MIN). */
#define TC__V_NANFIRST(a, r)                                                   \
  _mm256_blendv_ps(r, a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q))
#define TC__V_SUM(a, b) _mm256_add_ps(a, b)
#define TC__V_PRODUCT(a, b) _mm256_mul_ps(a, b)
#define TC__V_MIN(a, b) TC__V_NANFIRST(a, _mm256_min_ps(a, b))
#define TC__V_MAX(a, b) TC__V_NANFIRST(a, _mm256_max_ps(a, b))
/* float16 keeps NaN signs: its SUM/PRODUCT/scale name the NaN
 * (tc__nanfirst: TC__AH_SLOW, TC__VH_MUL); bfloat16's NaN is always
 * 0x7FC0. */
#define TC__VH_MUL(x, f) TC__V_NANFIRST(x, _mm256_mul_ps(x, f))

/* 16 bfloat16 as two float32 vectors: the even elements (shifted up) and
 * the odd ones (upper halves kept), no shuffles. */
TC__AVX2_INLINE void tc__bf_load(const uint16_t *p, __m256 *ev, __m256 *od) {
  const __m256i x = _mm256_loadu_si256((const __m256i *)p);
  *ev = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
  *od = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32((int)0xFFFF0000u)));
}

/* The upper halves of the float32 bits of the even (ev) and odd (od)
 * elements of 16, in order: the truncated bfloat16. */
TC__AVX2_INLINE __m256i tc__bf_high(__m256 ev, __m256 od) {
  return _mm256_blend_epi16(_mm256_srli_epi32(_mm256_castps_si256(ev), 16),
                            _mm256_castps_si256(od), 0xAA);
}

/* tc__f2bf of the even (ev) and odd (od) elements of 16 without the NaN
 * rule (infinities and overflow to them come out right). In 16-bit lanes:
 * h, the upper halves of the float32 bits (tc__bf_high), and l, the lower
 * halves; h + 1 where l + 0x7FFF + (h & 1) carries, i.e. where avg(l,
 * 0x7FFE + (h & 1)) = (l + 0x7FFF + (h & 1)) >> 1 has its top bit. */
TC__AVX2_INLINE __m256i tc__bf_round(__m256 ev, __m256 od) {
  const __m256i h = tc__bf_high(ev, od);
  const __m256i l = _mm256_blend_epi16(_mm256_castps_si256(ev),
                                       _mm256_slli_epi32(_mm256_castps_si256(od), 16), 0xAA);
  const __m256i t = _mm256_add_epi16(_mm256_and_si256(h, _mm256_set1_epi16(1)),
                                     _mm256_set1_epi16(0x7FFE));
  return _mm256_add_epi16(h, _mm256_srli_epi16(_mm256_avg_epu16(l, t), 15));
}

/* tc__f2bf of the even (ev) and odd (od) elements of 16, stored: rounded
 * by tc__bf_round; NaN (0x7FC0) only where an exponent is all ones, which
 * is rare: one test per 16, the blend only then. */
TC__AVX2_INLINE void tc__bf_store(uint16_t *p, __m256 ev, __m256 od) {
  const __m256i h = tc__bf_high(ev, od);
  __m256i r = tc__bf_round(ev, od);
  const __m256i ex = _mm256_set1_epi16(0x7F80);
  const __m256i special = _mm256_cmpeq_epi16(_mm256_and_si256(h, ex), ex);
  if (__builtin_expect(!_mm256_testz_si256(special, special), 0)) { /* Inf or NaN */
    const __m256i nan = _mm256_blend_epi16(
        _mm256_castps_si256(_mm256_cmp_ps(ev, ev, _CMP_UNORD_Q)),
        _mm256_castps_si256(_mm256_cmp_ps(od, od, _CMP_UNORD_Q)), 0xAA);
    r = _mm256_blendv_epi8(r, _mm256_set1_epi16(0x7FC0), nan);
  }
  _mm256_storeu_si256((__m256i *)p, r);
}

TC__AVX2_INLINE __m256 tc__h_load(const uint16_t *p) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* tc__f2h on 8 lanes (see above for NaN). */
TC__AVX2_INLINE void tc__h_store(uint16_t *p, __m256 f) {
  const __m256 nan = _mm256_cmp_ps(f, f, _CMP_UNORD_Q);
  const __m256 q = _mm256_or_ps(_mm256_and_ps(f, _mm256_set1_ps(-0.0f)),
                                _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)));
  f = _mm256_blendv_ps(f, q, nan);
  _mm_storeu_si128((__m128i *)p,
                   _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* k3 (o = a op b, PFX##3) and k2 (d op= s, PFX##2) per op for a vector
 * step V of W elements, compiled with ATTR: two steps at a time (V2, 2W
 * elements), then single steps; the last n % W elements go through
 * zero-padded stack copies and the same vector code.
 *
 * Each double step prefetches every line of the step (the AVX-512 step
 * spans two lines per input) twice: TC__PF_L1 bytes ahead into L1 and
 * TC__PF_L2 bytes ahead into L2, never past the inputs' end. These kernels
 * are bound by their conversions (about 25 GB/s of one input on one core
 * where float32 adds at 37-120), so they cannot also wait for misses: in a
 * collective one input was just written by the peer's core, and each line
 * comes from that core's cache. Measured at 2 ranks, bfloat16 against
 * float32 busbw of the same launches (tcperf -d float32,bfloat16 -R 5),
 * medians of 3, on a Xeon (Sapphire Rapids, 2 vCPUs):
 *  - reduce_scatter 64 KiB: x0.74 with 512 bytes ahead into L1 only;
 *    x0.83 with 1-4 KiB; x0.94 with 2 KiB into L1 and 8 KiB into L2
 *    (16 KiB into L2: x0.89). 16 KiB-4 MiB x0.95-1.02.
 *  - all_reduce 16 KiB-4 MiB x0.94-1.02 (before x0.90-0.99).
 *  - Prefetching past the end cost all_reduce 16 KiB x0.90 -> x0.69: the
 *    lines after a peer's chunk are the ones that peer writes next.
 *  - The float32 kernels gained nothing from the same prefetches (64 KiB
 *    reduce_scatter 3.98 against 3.91 us), so they have none.
 * Before (512 bytes ahead into L1, one line per step before that), on
 * Zen 4: bfloat16 all_reduce 16 MiB x0.85 -> x1.02, 64 MiB x0.93 -> x1.03
 * from prefetching every line of the step.
 * PF: which prefetches a kernel makes (1: into L1, 2: into L2, 3: both).
 * The AVX512-FP16 kernels (below) run at float32's rate and make none: the
 * prefetch instructions took load slots they need (tcreduce_bench, hot, f16
 * reduce3 33 GB/s with them, 40 without, float32 40; 2-operand 51 and 70,
 * float32 63), and in the collectives float16 against float32 went, 2
 * ranks, medians of 7 launches: reduce_scatter 64 KiB x0.91 -> x0.93,
 * 256 KiB x0.89 -> x0.95; all_reduce 64 KiB x0.96 -> x0.99, 256 KiB x0.98
 * -> x1.00 (docs/benchmarks.md, "float16 without prefetches"). The
 * AVX-512 16-bit kernels also come without them (tc__zn, tc__wn, tc__yn),
 * picked on AMD family 1Ah (Zen 5), where a 2-rank reduce_scatter of
 * bfloat16 went from x0.87 to x0.95 of float32 at 128 KiB without them
 * (docs/benchmarks.md, "The 16-bit kernels without prefetches on Zen 5"),
 * and on family 19h (Zen 4), where it went from x0.89 to x1.03 at 2 MiB
 * and float16's from x0.83 to x0.97 at 8 MiB (the same, "... on Zen 4
 * too"). */
enum { TC__PF_L1 = 2048, TC__PF_L2 = 8192 };
#define TC__GEN_VEC(PFX, ATTR, W, OP, D, V, V2, PF)                            \
  static ATTR void PFX##3_##D##_##OP(void *ov, const void *av, const void *bv, \
                                     size_t n) {                               \
    uint16_t *o = (uint16_t *)ov;                                              \
    const uint16_t *a = (const uint16_t *)av, *b = (const uint16_t *)bv;       \
    const char *ca = (const char *)av, *cb = (const char *)bv;                 \
    size_t i = 0;                                                              \
    for (; i + 2 * (W) <= n; i += 2 * (W)) {                                   \
      for (size_t l = 2 * i; l < 2 * i + 4 * (W); l += 64) { /* the step */    \
        if (((PF) & 1) && l + TC__PF_L1 < 2 * n) {                             \
          _mm_prefetch(ca + l + TC__PF_L1, _MM_HINT_T0);                       \
          _mm_prefetch(cb + l + TC__PF_L1, _MM_HINT_T0);                       \
        }                                                                      \
        if (((PF) & 2) && l + TC__PF_L2 < 2 * n) {                             \
          _mm_prefetch(ca + l + TC__PF_L2, _MM_HINT_T1);                       \
          _mm_prefetch(cb + l + TC__PF_L2, _MM_HINT_T1);                       \
        }                                                                      \
      }                                                                        \
      V2(OP, o + i, a + i, b + i);                                             \
    }                                                                          \
    for (; i + (W) <= n; i += (W)) V(OP, o + i, a + i, b + i);                 \
    if (i < n) {                                                               \
      uint16_t ta[W] = {0}, tb[W] = {0};                                       \
      memcpy(ta, a + i, (n - i) * 2);                                          \
      memcpy(tb, b + i, (n - i) * 2);                                          \
      V(OP, ta, ta, tb);                                                       \
      memcpy(o + i, ta, (n - i) * 2);                                          \
    }                                                                          \
  }                                                                            \
  static void PFX##2_##D##_##OP(void *dv, const void *sv, size_t n) {          \
    PFX##3_##D##_##OP(dv, dv, sv, n);                                          \
  }
#define TC__GEN_VEC_OPS_PF(PFX, ATTR, W, D, V, V2, PF)                         \
  TC__GEN_VEC(PFX, ATTR, W, SUM, D, V, V2, PF)                                 \
  TC__GEN_VEC(PFX, ATTR, W, PRODUCT, D, V, V2, PF)                             \
  TC__GEN_VEC(PFX, ATTR, W, MIN, D, V, V2, PF)                                 \
  TC__GEN_VEC(PFX, ATTR, W, MAX, D, V, V2, PF)
#define TC__GEN_VEC_OPS(PFX, ATTR, W, D, V, V2) TC__GEN_VEC_OPS_PF(PFX, ATTR, W, D, V, V2, 3)
/* Two steps V of W elements: the double step of the kernels without one
 * of their own. */
#define TC__TWO(V, W, OP, o, a, b)                                             \
  do {                                                                         \
    V(OP, o, a, b);                                                            \
    V(OP, (o) + (W), (a) + (W), (b) + (W));                                    \
  } while (0)
/* The AVX2 tier's step: 32 results, with one NaN test for 64 of them.
 * TC__A32_BF / TC__A32_H compute 32 results into registers named with
 * prefix X (bfloat16: the even and odd lanes X##e0, X##o0, X##e1, X##o1;
 * float16: X##0..X##3 and the first input's values X##a0..X##a3) and a
 * vector X##nan with a lane set where a result is NaN (one vcmpps per 16
 * results: unordered is true where either operand is NaN). TC__A64_* runs
 * two of them, tests both masks with one vmovmskps and one branch, and
 * stores the results rounded and packed without any NaN rule; a step with
 * a NaN result is done again as two single steps TC__A1_* (nothing is
 * stored before), which apply tc__bf_store's and tc__h_store's rules to
 * the 32 results of their own step. Keeping the first input's values for
 * those rules in the double step would take more than AVX2's 16 vector
 * registers. All loads come before the stores (o may be a or b). */
#define TC__A32_BF(OP, X, a, b)                                                \
  __m256 X##ae0, X##ao0, X##be0, X##bo0, X##ae1, X##ao1, X##be1, X##bo1;       \
  tc__bf_load(a, &X##ae0, &X##ao0);                                            \
  tc__bf_load((a) + 16, &X##ae1, &X##ao1);                                     \
  tc__bf_load(b, &X##be0, &X##bo0);                                            \
  tc__bf_load((b) + 16, &X##be1, &X##bo1);                                     \
  const __m256 X##e0 = TC__V_##OP(X##ae0, X##be0), X##o0 = TC__V_##OP(X##ao0, X##bo0); \
  const __m256 X##e1 = TC__V_##OP(X##ae1, X##be1), X##o1 = TC__V_##OP(X##ao1, X##bo1); \
  const __m256 X##nan = _mm256_or_ps(_mm256_cmp_ps(X##e0, X##o0, _CMP_UNORD_Q),  \
                                     _mm256_cmp_ps(X##e1, X##o1, _CMP_UNORD_Q))
#define TC__A32_BF_STORE(o, X, STORE)                                          \
  do {                                                                         \
    STORE(o, X##e0, X##o0);                                                    \
    STORE((o) + 16, X##e1, X##o1);                                             \
  } while (0)
#define TC__ABF_FAST(p, e, od) _mm256_storeu_si256((__m256i *)(void *)(p), tc__bf_round(e, od))
#define TC__ABF_SLOW(p, e, od) tc__bf_store(p, e, od)
#define TC__AH_PACK(r) _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define TC__A32_H(OP, X, a, b)                                                 \
  const __m256 X##a0 = tc__h_load(a), X##a1 = tc__h_load((a) + 8);             \
  const __m256 X##a2 = tc__h_load((a) + 16), X##a3 = tc__h_load((a) + 24);     \
  const __m256 X##0 = TC__V_##OP(X##a0, tc__h_load(b));                        \
  const __m256 X##1 = TC__V_##OP(X##a1, tc__h_load((b) + 8));                  \
  const __m256 X##2 = TC__V_##OP(X##a2, tc__h_load((b) + 16));                 \
  const __m256 X##3 = TC__V_##OP(X##a3, tc__h_load((b) + 24));                 \
  const __m256 X##nan = _mm256_or_ps(_mm256_cmp_ps(X##0, X##1, _CMP_UNORD_Q),   \
                                     _mm256_cmp_ps(X##2, X##3, _CMP_UNORD_Q))
#define TC__AH_FAST(p, r, x) _mm_storeu_si128((__m128i *)(void *)(p), TC__AH_PACK(r))
#define TC__AH_SLOW(p, r, x) tc__h_store(p, TC__V_NANFIRST(x, r))
#define TC__A32_H_STORE(o, X, STORE)                                           \
  do {                                                                         \
    STORE(o, X##0, X##a0);                                                     \
    STORE((o) + 8, X##1, X##a1);                                               \
    STORE((o) + 16, X##2, X##a2);                                              \
    STORE((o) + 24, X##3, X##a3);                                              \
  } while (0)
/* K: BF or H. The double step of 64 results, and the single step of 32
 * (the tail's, one test per 32). */
#define TC__A64(K, OP, o, a, b)                                                \
  do {                                                                         \
    TC__A32_##K(OP, p, a, b);                                                  \
    TC__A32_##K(OP, q, (a) + 32, (b) + 32);                                    \
    if (__builtin_expect(_mm256_movemask_ps(_mm256_or_ps(pnan, qnan)) == 0, 1)) { \
      TC__A32_##K##_STORE(o, p, TC__A##K##_FAST);                              \
      TC__A32_##K##_STORE((o) + 32, q, TC__A##K##_FAST);                       \
    } else {                                                                   \
      TC__A1(K, OP, o, a, b);                                                  \
      TC__A1(K, OP, (o) + 32, (a) + 32, (b) + 32);                             \
    }                                                                          \
  } while (0)
#define TC__A1(K, OP, o, a, b)                                                 \
  do {                                                                         \
    TC__A32_##K(OP, p, a, b);                                                  \
    if (__builtin_expect(_mm256_movemask_ps(pnan) == 0, 1))                    \
      TC__A32_##K##_STORE(o, p, TC__A##K##_FAST);                              \
    else                                                                       \
      TC__A32_##K##_STORE(o, p, TC__A##K##_SLOW);                              \
  } while (0)
#define TC__A64_BF(OP, o, a, b) TC__A64(BF, OP, o, a, b)
#define TC__A64_H(OP, o, a, b) TC__A64(H, OP, o, a, b)
#define TC__A1_BF(OP, o, a, b) TC__A1(BF, OP, o, a, b)
#define TC__A1_H(OP, o, a, b) TC__A1(H, OP, o, a, b)
TC__GEN_VEC_OPS(tc__v, TC__AVX2, 32, BFLOAT16, TC__A1_BF, TC__A64_BF)
TC__GEN_VEC_OPS(tc__v, TC__AVX2, 32, FLOAT16, TC__A1_H, TC__A64_H)
/* Without prefetches, picked on AMD family 19h and later as the AVX-512
 * ones (simd16): on Zen 3 (family 19h, AVX2 only) bfloat16 and float16
 * all_reduce at 2 ranks against float32 went, medians of 6 rotated
 * launches, 8 KiB x0.59 -> x0.63 and x0.66 -> x0.71, 128 KiB x0.72 ->
 * x0.75 and x0.79 -> x0.82, 2 MiB x0.81 -> x0.91 and x0.88 -> x0.94
 * (docs/benchmarks.md, "The AVX2 16-bit kernels on Zen 3"). */
TC__GEN_VEC_OPS_PF(tc__vn, TC__AVX2, 32, BFLOAT16, TC__A1_BF, TC__A64_BF, 0)
TC__GEN_VEC_OPS_PF(tc__vn, TC__AVX2, 32, FLOAT16, TC__A1_H, TC__A64_H, 0)

/* Scale (x * f) and divide (x / f) of n elements, s -> d (d may equal s). */
#define TC__GEN_VMAP(NAME, D, V, VOP)                                          \
  static TC__AVX2 void tc__v##NAME##_##D(uint16_t *d, const uint16_t *s,       \
                                         size_t n, float fv) {                 \
    const __m256 f = _mm256_set1_ps(fv);                                       \
    size_t i = 0;                                                              \
    for (; i + 16 <= n; i += 16) V(d + i, s + i, f, VOP);                      \
    if (i < n) {                                                               \
      uint16_t t[16] = {0};                                                    \
      memcpy(t, s + i, (n - i) * 2);                                           \
      V(t, t, f, VOP);                                                         \
      memcpy(d + i, t, (n - i) * 2);                                           \
    }                                                                          \
  }
#define TC__VMAP_BF(d, s, f, VOP)                                              \
  do {                                                                         \
    __m256 e, o;                                                               \
    tc__bf_load(s, &e, &o);                                                    \
    tc__bf_store(d, VOP(e, f), VOP(o, f));                                     \
  } while (0)
#define TC__VMAP_H(d, s, f, VOP)                                               \
  do {                                                                         \
    const __m256 x0 = tc__h_load(s), x1 = tc__h_load((s) + 8);                 \
    tc__h_store(d, VOP(x0, f));                                                \
    tc__h_store((d) + 8, VOP(x1, f));                                          \
  } while (0)
TC__GEN_VMAP(scale, BFLOAT16, TC__VMAP_BF, _mm256_mul_ps)
TC__GEN_VMAP(divide, BFLOAT16, TC__VMAP_BF, _mm256_div_ps)
TC__GEN_VMAP(scale, FLOAT16, TC__VMAP_H, TC__VH_MUL)
TC__GEN_VMAP(divide, FLOAT16, TC__VMAP_H, _mm256_div_ps)

/* AVX-512 kernels for bfloat16 and float16, picked over the AVX2 ones when
 * the CPU has AVX512F/BW/DQ (and AVX512_BF16 for bfloat16). Same bits
 * again, with a third of the instructions: 32 elements per step,
 *  - bfloat16 -> float32: zero-extend and shift (exact); float32 ->
 *    bfloat16: AVX512_BF16's vcvtne2ps2bf16, round to nearest even, which
 *    equals tc__f2bf on every float32 but NaN (it keeps the payload, where
 *    tc__f2bf gives 0x7FC0) and subnormals (it flushes them to zero). One
 *    vfpclassps per 16 results finds those lanes; a step that has one goes
 *    through tc__f2bf element by element. They are rare in real data.
 *  - float16: vcvtph2ps / vcvtps2ph as in the AVX2 kernels; a step whose
 *    results have a NaN takes the AVX2 kernels' NaN rules (a NaN first
 *    operand is the result, quiet NaN 0x7E00 with its sign). */
#define TC__AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,f16c")))
#define TC__AVX512_INLINE                                                      \
  static inline __attribute__((always_inline,                                  \
                               target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,f16c")))

enum { TC__FPC_NAN = 0x81, TC__FPC_NAN_DENORM = 0xA1 }; /* vfpclassps classes */

/* r, or a in the lanes where a is NaN. */
#define TC__Z_NANFIRST(a, r) _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), r, a)
#define TC__Z_SUM(a, b) _mm512_add_ps(a, b)
#define TC__Z_PRODUCT(a, b) _mm512_mul_ps(a, b)
#define TC__Z_MIN(a, b) TC__Z_NANFIRST(a, _mm512_min_ps(a, b))
#define TC__Z_MAX(a, b) TC__Z_NANFIRST(a, _mm512_max_ps(a, b))

/* 32 bfloat16 results rounded by vcvtne2ps2bf16, in element order (ev the
 * even elements, od the odd ones: vpermw interleaves the two halves). */
TC__AVX512_INLINE __m512i tc__zbf_pack(__m512 ev, __m512 od) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                       8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(od, ev));
}

/* 32 bfloat16 results, ev the even elements and od the odd ones. */
TC__AVX512_INLINE void tc__zbf_store2(uint16_t *p, __m512 ev, __m512 od) {
  const __mmask16 s0 = _mm512_fpclass_ps_mask(ev, TC__FPC_NAN_DENORM);
  const __mmask16 s1 = _mm512_fpclass_ps_mask(od, TC__FPC_NAN_DENORM);
  if (__builtin_expect(_kortestz_mask16_u8(s0, s1), 1)) {
    _mm512_storeu_si512((void *)p, tc__zbf_pack(ev, od));
    return;
  }
  float e[16], o[16];
  _mm512_storeu_ps(e, ev);
  _mm512_storeu_ps(o, od);
  for (int i = 0; i < 16; i++) {
    p[2 * i] = tc__f2bf(e[i]);
    p[2 * i + 1] = tc__f2bf(o[i]);
  }
}

/* OP of the even (EV) and odd (OD) bfloat16 elements of 32-element
 * vectors xa and xb, widened to float32 exactly. */
#define TC__ZBF_EV(OP, xa, xb)                                                 \
  TC__Z_##OP(_mm512_castsi512_ps(_mm512_slli_epi32(xa, 16)),                   \
             _mm512_castsi512_ps(_mm512_slli_epi32(xb, 16)))
#define TC__ZBF_OD(OP, xa, xb)                                                 \
  TC__Z_##OP(_mm512_castsi512_ps(_mm512_and_si512(xa, _mm512_set1_epi32((int)0xFFFF0000u))), \
             _mm512_castsi512_ps(_mm512_and_si512(xb, _mm512_set1_epi32((int)0xFFFF0000u))))

#define TC__Z32_BF(OP, o, a, b)                                                \
  do {                                                                         \
    const __m512i xa = _mm512_loadu_si512((const void *)(a));                  \
    const __m512i xb = _mm512_loadu_si512((const void *)(b));                  \
    tc__zbf_store2(o, TC__ZBF_EV(OP, xa, xb), TC__ZBF_OD(OP, xa, xb));         \
  } while (0)

/* 64 bfloat16 results in one step: the four vfpclassps masks are tested
 * with one branch, not one per 32 results (tcreduce_bench reduce3, Zen 4:
 * 31.9 -> 33.7 GB/s at 64 KiB, 30.2 -> 33.1 at 256 KiB); a step with a
 * lane to fix goes through tc__zbf_store2 per 32. All loads come before
 * the stores (o may be a). */
#define TC__Z64_BF(OP, o, a, b)                                                \
  do {                                                                         \
    const __m512i xa = _mm512_loadu_si512((const void *)(a));                  \
    const __m512i xb = _mm512_loadu_si512((const void *)(b));                  \
    const __m512i ya = _mm512_loadu_si512((const void *)((a) + 32));           \
    const __m512i yb = _mm512_loadu_si512((const void *)((b) + 32));           \
    const __m512 e0 = TC__ZBF_EV(OP, xa, xb), d0 = TC__ZBF_OD(OP, xa, xb);     \
    const __m512 e1 = TC__ZBF_EV(OP, ya, yb), d1 = TC__ZBF_OD(OP, ya, yb);     \
    const __mmask16 f = (__mmask16)(_mm512_fpclass_ps_mask(e0, TC__FPC_NAN_DENORM) | \
                                    _mm512_fpclass_ps_mask(d0, TC__FPC_NAN_DENORM) | \
                                    _mm512_fpclass_ps_mask(e1, TC__FPC_NAN_DENORM) | \
                                    _mm512_fpclass_ps_mask(d1, TC__FPC_NAN_DENORM)); \
    if (__builtin_expect(f == 0, 1)) {                                         \
      _mm512_storeu_si512((void *)(o), tc__zbf_pack(e0, d0));                  \
      _mm512_storeu_si512((void *)((o) + 32), tc__zbf_pack(e1, d1));           \
    } else {                                                                   \
      tc__zbf_store2(o, e0, d0);                                               \
      tc__zbf_store2((o) + 32, e1, d1);                                        \
    }                                                                          \
  } while (0)

/* The float16 kernels of this tier come in two widths, both bound by the
 * conversions (vcvtph2ps twice and vcvtps2ph once per result), picked by
 * the CPU (simd16, amd_family):
 *  - 256-bit vectors (AVX-512VL) on Zen 4, which runs those conversions
 *    about 12 % faster per element on 256-bit vectors than on 512-bit ones
 *    (bench/f16_bound_probe.c: ymm-bare 25.9 against zmm-bare 23.2 GB/s at
 *    64 KiB). tcreduce_bench reduce3, 64 KiB-1 MiB: 20.4-21.2 GB/s on
 *    512-bit vectors (one NaN test per 64 results), 22.0-23.5 on these;
 *    float16 all_reduce at 2 ranks against float32, medians of 6
 *    interleaved launches: 64 KiB x0.83 -> x0.87, 256 KiB x0.89 -> x0.92,
 *    1 MiB x0.92 -> x0.97, 16 KiB x0.81 both.
 *  - 512-bit vectors everywhere else: on Zen 5 (AMD family 1Ah, full-width
 *    512-bit units) f16_bound_probe gives zmm-bare 42.7 against ymm-bare
 *    30.5 GB/s at 64 KiB; with the data in the peer's cache, as in a
 *    reduce_scatter, 15 against 10 bytes per cycle; in the collectives at
 *    2 ranks, float16 against float32 (medians of 10 interleaved launches,
 *    8 KiB-2 MiB): all_reduce x0.76-0.87 -> x0.81-0.94, reduce_scatter
 *    x0.70-0.79 -> x0.79-0.83 (docs/benchmarks.md, "float16 on 512-bit
 *    vectors on Zen 5"). */
#define TC__YH_PACK(r) _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

/* 32 float16 results in one step, with the AVX2 tier's loads, element
 * operations and NaN rules (tc__h_load, TC__V_*, tc__h_store): the four
 * NaN masks are tested with one branch (as the bfloat16 kernel,
 * TC__Z64_BF), and only a step with a NaN result gives its NaN lanes
 * tc__nanfirst's operand and the quiet NaN with its sign (tc__h_store).
 * All loads come before the stores (o may be a or b). */
#define TC__Y32_H(OP, o, a, b)                                                 \
  do {                                                                         \
    const __m256 a0 = tc__h_load(a), a1 = tc__h_load((a) + 8);                 \
    const __m256 a2 = tc__h_load((a) + 16), a3 = tc__h_load((a) + 24);         \
    const __m256 r0 = TC__V_##OP(a0, tc__h_load(b));                           \
    const __m256 r1 = TC__V_##OP(a1, tc__h_load((b) + 8));                     \
    const __m256 r2 = TC__V_##OP(a2, tc__h_load((b) + 16));                    \
    const __m256 r3 = TC__V_##OP(a3, tc__h_load((b) + 24));                    \
    const __mmask8 f = (__mmask8)(_mm256_fpclass_ps_mask(r0, TC__FPC_NAN) |    \
                                  _mm256_fpclass_ps_mask(r1, TC__FPC_NAN) |    \
                                  _mm256_fpclass_ps_mask(r2, TC__FPC_NAN) |    \
                                  _mm256_fpclass_ps_mask(r3, TC__FPC_NAN));    \
    if (__builtin_expect(f == 0, 1)) {                                         \
      _mm_storeu_si128((__m128i *)(o), TC__YH_PACK(r0));                       \
      _mm_storeu_si128((__m128i *)((o) + 8), TC__YH_PACK(r1));                 \
      _mm_storeu_si128((__m128i *)((o) + 16), TC__YH_PACK(r2));                \
      _mm_storeu_si128((__m128i *)((o) + 24), TC__YH_PACK(r3));                \
    } else {                                                                   \
      tc__h_store(o, TC__V_NANFIRST(a0, r0));                                  \
      tc__h_store((o) + 8, TC__V_NANFIRST(a1, r1));                            \
      tc__h_store((o) + 16, TC__V_NANFIRST(a2, r2));                           \
      tc__h_store((o) + 24, TC__V_NANFIRST(a3, r3));                           \
    }                                                                          \
  } while (0)
#define TC__Y64_H(OP, o, a, b) TC__TWO(TC__Y32_H, 32, OP, o, a, b)
/* 32 float16 results on 512-bit vectors, the NaN masks tested with one
 * branch; a step with a NaN result is done again by TC__Y32_H, which has
 * the NaN rules (nothing is stored before, so o may be a or b). */
#define TC__ZH_LOAD(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p)))
#define TC__ZH_PACK(r) _mm512_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define TC__Z32_H(OP, o, a, b)                                                 \
  do {                                                                         \
    const __m512 r0 = TC__Z_##OP(TC__ZH_LOAD(a), TC__ZH_LOAD(b));              \
    const __m512 r1 = TC__Z_##OP(TC__ZH_LOAD((a) + 16), TC__ZH_LOAD((b) + 16)); \
    const __mmask16 f = (__mmask16)(_mm512_fpclass_ps_mask(r0, TC__FPC_NAN) |  \
                                    _mm512_fpclass_ps_mask(r1, TC__FPC_NAN));  \
    if (__builtin_expect(f == 0, 1)) {                                         \
      _mm256_storeu_si256((__m256i *)(void *)(o), TC__ZH_PACK(r0));            \
      _mm256_storeu_si256((__m256i *)(void *)((o) + 16), TC__ZH_PACK(r1));     \
    } else {                                                                   \
      TC__Y32_H(OP, o, a, b);                                                  \
    }                                                                          \
  } while (0)
#define TC__Z64_H(OP, o, a, b) TC__TWO(TC__Z32_H, 32, OP, o, a, b)
TC__GEN_VEC_OPS(tc__z, TC__AVX512, 32, BFLOAT16, TC__Z32_BF, TC__Z64_BF)
TC__GEN_VEC_OPS(tc__z, TC__AVX512, 32, FLOAT16, TC__Y32_H, TC__Y64_H)
TC__GEN_VEC_OPS(tc__w, TC__AVX512, 32, FLOAT16, TC__Z32_H, TC__Z64_H)
/* the same without prefetches (AMD family 19h and later: amd_family) */
TC__GEN_VEC_OPS_PF(tc__zn, TC__AVX512, 32, BFLOAT16, TC__Z32_BF, TC__Z64_BF, 0)
TC__GEN_VEC_OPS_PF(tc__wn, TC__AVX512, 32, FLOAT16, TC__Z32_H, TC__Z64_H, 0)
TC__GEN_VEC_OPS_PF(tc__yn, TC__AVX512, 32, FLOAT16, TC__Y32_H, TC__Y64_H, 0)

/* AVX512-FP16 kernels for float16 (Intel Sapphire Rapids and later), picked
 * over the AVX-512 ones when the CPU has AVX512_FP16: vaddph / vmulph /
 * vminph / vmaxph on 32 float16 at a time, no conversions. Same bits: the
 * float32 sum or product of two float16 rounded to float16 equals the
 * float16 operation rounded once (float32's 24-bit significand is at least
 * 2 x 11 + 2 bits, so rounding twice is innocuous for + and *; a product
 * of two 11-bit significands is exact in float32), subnormals included
 * (the FP16 instructions ignore MXCSR's DAZ and FTZ, as the float32 path
 * never meets a float16 subnormal as a float32 one); MIN/MAX compare
 * exactly either way. NaN: a step whose result (SUM, PRODUCT) or first
 * operand or result (MIN, MAX: vminph returns the second operand when the
 * first is NaN) has a NaN lane is recomputed by the AVX-512 step above
 * (TC__Y32_H), whose NaN rules are tc__f2h's. tcreduce_bench f16 reduce3 at
 * 8 KiB on a Xeon with AVX512_FP16 (2 vCPUs, noisy): 8.5-15.4 GB/s on the
 * AVX-512 float16 step, 41-63 on this one (the bare vaddph loop,
 * tcf16_probe ph-add, about float32's rate). */
#if TC__CC_AVX512FP16
#define TC__SIMD16_FP16 1
#define TC__AVX512FP16                                                         \
  __attribute__((target("avx512fp16,avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,f16c")))
#define TC__P_SUM(a, b) _mm512_add_ph(a, b)
#define TC__P_PRODUCT(a, b) _mm512_mul_ph(a, b)
#define TC__P_MIN(a, b) _mm512_min_ph(a, b)
#define TC__P_MAX(a, b) _mm512_max_ph(a, b)
/* The lanes of a step the NaN rules concern, for x OP y = r (see above).
 * vcmpph, not vfpclassph: GCC 12's _mm512_fpclass_ph_mask macro (the form
 * used without optimisation, as in the sanitizer builds) passes an 8-bit
 * all-ones mask and so tests only 8 of the 32 lanes. */
#define TC__P_NAN(r) _mm512_cmp_ph_mask(r, r, _CMP_UNORD_Q)
#define TC__P_NAN_SUM(x, r) TC__P_NAN(r)
#define TC__P_NAN_PRODUCT(x, r) TC__P_NAN(r)
#define TC__P_NAN_MIN(x, r) (TC__P_NAN(x) | TC__P_NAN(r))
#define TC__P_NAN_MAX(x, r) (TC__P_NAN(x) | TC__P_NAN(r))
/* 32 float16 results; all loads before the stores (o may be a or b). */
#define TC__P32_H(OP, o, a, b)                                                 \
  do {                                                                         \
    const __m512h x = _mm512_loadu_ph((const void *)(a));                      \
    const __m512h r = TC__P_##OP(x, _mm512_loadu_ph((const void *)(b)));       \
    if (__builtin_expect(TC__P_NAN_##OP(x, r) == 0, 1))                        \
      _mm512_storeu_ph((void *)(o), r);                                        \
    else                                                                       \
      TC__Y32_H(OP, o, a, b);                                                  \
  } while (0)
/* 64 results, the NaN masks tested with one branch. */
#define TC__P64_H(OP, o, a, b)                                                 \
  do {                                                                         \
    const __m512h x0 = _mm512_loadu_ph((const void *)(a));                     \
    const __m512h x1 = _mm512_loadu_ph((const void *)((a) + 32));              \
    const __m512h r0 = TC__P_##OP(x0, _mm512_loadu_ph((const void *)(b)));     \
    const __m512h r1 = TC__P_##OP(x1, _mm512_loadu_ph((const void *)((b) + 32))); \
    if (__builtin_expect((TC__P_NAN_##OP(x0, r0) | TC__P_NAN_##OP(x1, r1)) == 0, 1)) { \
      _mm512_storeu_ph((void *)(o), r0);                                       \
      _mm512_storeu_ph((void *)((o) + 32), r1);                                \
    } else {                                                                   \
      TC__Y64_H(OP, o, a, b);                                                  \
    }                                                                          \
  } while (0)
/* no prefetches (PF 0): see TC__GEN_VEC */
TC__GEN_VEC_OPS_PF(tc__p, TC__AVX512FP16, 32, FLOAT16, TC__P32_H, TC__P64_H, 0)
#endif /* AVX512-FP16 */
#endif /* AVX2 16-bit kernels */

/* Which 16-bit kernels the CPU has: bit 0 the bfloat16 AVX2 ones, bit 1
 * the float16 AVX2+F16C ones, bit 2 the bfloat16 AVX-512 ones, bit 3 the
 * float16 AVX-512 ones, bit 4 the float16 AVX512-FP16 ones; by default
 * (amd_family) bit 5: the AVX-512 float16 ones on 512-bit vectors, bit 6:
 * the AVX2 and AVX-512 ones without prefetches; -1 until the CPU is asked
 * (first call). */
static int simd16_mask = -1;
/* The highest tier tc__reduce_set_simd allows: 0 generic, 1 AVX2, 2
 * AVX-512, 3 AVX512-FP16. */
static int simd16_level = 3;

/* The width of the AVX-512 float16 kernels: 0 the CPU's (mask bit 5),
 * 256 or 512 (tc__reduce_set_f16_width). */
static int simd16_f16_width = 0;
/* Whether the AVX2 and AVX-512 16-bit kernels prefetch: -1 the CPU's
 * (mask bit 6), 0 or 1 (tc__reduce_set_prefetch16). */
static int simd16_prefetch = -1;

#ifdef TC__SIMD16
#include <cpuid.h>
/* AMD's CPU family (19h Zen 4, 1Ah Zen 5), 0 on other vendors' CPUs. It
 * picks two shapes of the AVX-512 16-bit kernels (simd16):
 *  - float16 on 256-bit vectors on family 19h only, whose conversions are
 *    faster on them; 512-bit vectors elsewhere (see TC__Z32_H);
 *  - no software prefetch on family 19h and later: those prefetches,
 *    tuned on an Intel Xeon (TC__GEN_VEC), cost Zen 5 time and Zen 4 time
 *    (docs/benchmarks.md, "The 16-bit kernels without prefetches on Zen
 *    5" and "... on Zen 4 too"), and Zen 3's AVX2 kernels time (tc__vn). */
static unsigned amd_family(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return 0;
  const int amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u; /* AuthenticAMD */
  if (!amd || !__get_cpuid(1, &a, &b, &c, &d)) return 0;
  unsigned family = (a >> 8) & 0xF;
  if (family == 0xF) family += (a >> 20) & 0xFF;
  return family;
}
#endif

/* The kernels in use: simd16_mask less the tiers above simd16_level, with
 * bits 5 and 6 as tc__reduce_set_f16_width / tc__reduce_set_prefetch16
 * set them. */
static int simd16(void) {
#ifdef TC__SIMD16
  int m = __atomic_load_n(&simd16_mask, __ATOMIC_RELAXED);
  if (m < 0) {
    __builtin_cpu_init();
    const int avx2 = __builtin_cpu_supports("avx2") != 0;
    const int z = avx2 && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx512f") &&
                  __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                  __builtin_cpu_supports("avx512vl");
    const unsigned fam = amd_family();
    m = avx2 | ((avx2 && __builtin_cpu_supports("f16c")) << 1) |
        ((z && __builtin_cpu_supports("avx512bf16")) << 2) | (z << 3) |
        ((z && fam != 0x19) << 5) | ((avx2 && fam >= 0x19) << 6);
#ifdef TC__SIMD16_FP16
    m |= (z && __builtin_cpu_supports("avx512fp16")) << 4;
#endif
    __atomic_store_n(&simd16_mask, m, __ATOMIC_RELAXED);
  }
  const int level = __atomic_load_n(&simd16_level, __ATOMIC_RELAXED);
  const int w = __atomic_load_n(&simd16_f16_width, __ATOMIC_RELAXED);
  const int p = __atomic_load_n(&simd16_prefetch, __ATOMIC_RELAXED);
  if (w) m = (m & ~32) | (w == 512 ? 32 : 0);
  if (p >= 0) m = (m & ~64) | (p ? 0 : 64);
  return level >= 3 ? m : level == 2 ? (m & 111) : level == 1 ? (m & 67) : 0;
#else
  return 0;
#endif
}

/* The tier of a kernel mask: 3 if the AVX512-FP16 kernels, 2 if any
 * AVX-512 kernel, 1 if any AVX2 one. */
static int simd16_tier(int m) { return (m & 16) ? 3 : (m & 12) ? 2 : (m & 3) ? 1 : 0; }

int tc__reduce_set_f16_width(int bits) {
  const int m = simd16();
  const int was = !(m & 8) || (m & 16) ? 0 : (m & 32) ? 512 : 256;
  __atomic_store_n(&simd16_f16_width, bits == 256 || bits == 512 ? bits : 0, __ATOMIC_RELAXED);
  return was;
}

int tc__reduce_set_prefetch16(int on) {
  const int m = simd16();
  const int was = !(m & 15) ? -1 : !(m & 64);
  __atomic_store_n(&simd16_prefetch, on == 0 || on == 1 ? on : -1, __ATOMIC_RELAXED);
  return was;
}

int tc__reduce_set_simd(int level) {
  const int was = simd16_tier(simd16());
  __atomic_store_n(&simd16_level, level < 0 ? 0 : level > 3 ? 3 : level, __ATOMIC_RELAXED);
  return was;
}

/* ------------------------------------------------------------------------ */
/* Kernel table and dispatch                                                 */
/* ------------------------------------------------------------------------ */

typedef void (*tc__k2_fn)(void *dst, const void *src, size_t n);
typedef void (*tc__k3_fn)(void *out, const void *a, const void *b, size_t n);
typedef struct kernel_of {
  tc__k2_fn k2; /* dst op= src, no aliasing */
  tc__k3_fn k3; /* out = a op b, out aliases neither */
} tc__kernel_t;

/* [dtype][op] for op < TC_AVG; an empty entry is a disallowed pair. */
static const tc__kernel_t kernel_table[TC_DTYPE_COUNT][TC_AVG] = {
#define TC__ENTRY(OP, D, T, U, K)                                              \
  [TC_##D][TC_##OP] = {.k2 = tc__k2_##D##_##OP, .k3 = tc__k3_##D##_##OP},
    TC__REDUCE_KERNELS(TC__ENTRY)
#undef TC__ENTRY
};

#ifdef TC__SIMD16
/* One row of a SIMD kernel table: the kernels P##2 / P##3 of dtype D, by
 * op SUM..MAX. */
#define TC__KENTRY(P, D, OP) [TC_##OP] = {.k2 = P##2_##D##_##OP, .k3 = P##3_##D##_##OP}
#define TC__KROW(P, D)                                                         \
  {TC__KENTRY(P, D, SUM), TC__KENTRY(P, D, PRODUCT), TC__KENTRY(P, D, MIN),   \
   TC__KENTRY(P, D, MAX)}
/* The AVX2 16-bit kernels: [0] bfloat16, [1] float16; [2] and [3] the
 * same without prefetches. */
static const tc__kernel_t simd16_table[4][TC_MAX + 1] = {
    TC__KROW(tc__v, BFLOAT16), TC__KROW(tc__v, FLOAT16),
    TC__KROW(tc__vn, BFLOAT16), TC__KROW(tc__vn, FLOAT16)};
/* The AVX-512 ones, the same way. */
static const tc__kernel_t simd16z_table[2][TC_MAX + 1] = {TC__KROW(tc__z, BFLOAT16),
                                                          TC__KROW(tc__z, FLOAT16)};
/* Without prefetches: [0] bfloat16, [1] float16 on 512-bit vectors, [2]
 * float16 on 256-bit vectors. */
static const tc__kernel_t simd16zn_table[3][TC_MAX + 1] = {
    TC__KROW(tc__zn, BFLOAT16), TC__KROW(tc__wn, FLOAT16), TC__KROW(tc__yn, FLOAT16)};
/* The AVX-512 float16 ones on 512-bit vectors. */
static const tc__kernel_t simd16w_table[TC_MAX + 1] = TC__KROW(tc__w, FLOAT16);
#ifdef TC__SIMD16_FP16
/* The AVX512-FP16 float16 ones. */
static const tc__kernel_t simd16p_table[TC_MAX + 1] = TC__KROW(tc__p, FLOAT16);
#endif
#undef TC__KROW
#undef TC__KENTRY
#endif

/* The kernel of dtype x op (AVG and PREMUL_SUM as SUM), or NULL when the
 * pair is invalid or not allowed. */
static const tc__kernel_t *kernel_of(tc_dtype_t dtype, tc_redop_type_t op) {
  if ((unsigned)dtype >= TC_DTYPE_COUNT || (unsigned)op >= TC_REDOP_COUNT)
    return NULL;
  if (op == TC_AVG || op == TC_PREMUL_SUM) op = TC_SUM;
#ifdef TC__SIMD16
  if ((dtype == TC_BFLOAT16 || dtype == TC_FLOAT16) && op <= TC_MAX) {
    const int m = simd16();
#ifdef TC__SIMD16_FP16
    if (dtype == TC_FLOAT16 && (m & 16)) return &simd16p_table[op];
#endif
    const int pf = !(m & 64);
    if (dtype == TC_BFLOAT16 && (m & 4))
      return pf ? &simd16z_table[0][op] : &simd16zn_table[0][op];
    if (dtype == TC_FLOAT16 && (m & 8)) {
      if (m & 32) return pf ? &simd16w_table[op] : &simd16zn_table[1][op];
      return pf ? &simd16z_table[1][op] : &simd16zn_table[2][op];
    }
    if (dtype == TC_BFLOAT16 && (m & 1)) return &simd16_table[pf ? 0 : 2][op];
    if (dtype == TC_FLOAT16 && (m & 2)) return &simd16_table[pf ? 1 : 3][op];
  }
#endif
  const tc__kernel_t *k = &kernel_table[dtype][op];
  return k->k2 ? k : NULL;
}

/* 1 for the float dtypes. */
static int is_float(tc_dtype_t dtype) {
  switch (dtype) {
#define TC__ISF(name, val, ctype, size, isf)                                   \
  case TC_##name:                                                              \
    return isf;
    TC_DTYPE_MAP(TC__ISF)
#undef TC__ISF
  default:
    return 0;
  }
}

/* 1 if op may be applied to dtype: the kernel table for SUM..BXOR (bitwise
 * ops on integers and bool only), AVG on all but bool, PREMUL_SUM on the
 * float types only (as torch allows); 0 for an invalid dtype or op. */
int tc__redop_allowed(tc_dtype_t dtype, tc_redop_type_t op) {
  if ((unsigned)dtype >= TC_DTYPE_COUNT || (unsigned)op >= TC_REDOP_COUNT)
    return 0;
  if (op == TC_AVG) return dtype != TC_BOOL;
  if (op == TC_PREMUL_SUM) return is_float(dtype);
  return kernel_table[dtype][op].k2 != NULL;
}

int tc_redop_supported(tc_dtype_t dtype, tc_redop_type_t op) {
  return tc__redop_allowed(dtype, op);
}

/* Aliased operand staged through the stack, TC__STAGE bytes per step:
 * a != NULL: out = a op copy(out) (the call had b == out, a != out);
 * a == NULL: out = out op copy(out) (every operand was out). */
static void reduce_staged(const tc__kernel_t *k, char *out, const char *a,
                              size_t n, size_t esize) {
  uint64_t tmp[TC__STAGE / sizeof(uint64_t)];
  const size_t step = TC__STAGE / esize;
  for (size_t i = 0; i < n; i += step) {
    const size_t m = n - i < step ? n - i : step;
    memcpy(tmp, out + i * esize, m * esize);
    if (a) k->k3(out + i * esize, a + i * esize, tmp, m);
    else k->k2(out + i * esize, tmp, m);
  }
}

/* out[i] = a[i] + b[i] for a few elements of the common sums, inline: an
 * 8-byte all_reduce or reduce_scatter otherwise pays the kernel's lookup,
 * its indirect call and its loop set-up for two floats (and, with out ==
 * b, the staging copy). The same element operations as the kernels'
 * scalar tails, so the same bits; out may be a or b (each element is read
 * before it is written). 1 if done. */
#define TC__TINY_MAX 4
static inline int reduce_tiny(void *out, const void *a, const void *b, size_t n,
                              tc_dtype_t dtype, tc_redop_type_t op) {
  if (op != TC_SUM || n > TC__TINY_MAX) return 0;
  switch (dtype) {
#define TC__TINY(D, T, U, K)                                                   \
  case TC_##D: {                                                               \
    T *o = (T *)out;                                                           \
    const T *x = (const T *)a, *y = (const T *)b;                              \
    for (size_t i = 0; i < n; i++) {                                           \
      const T xi = x[i], yi = y[i];                                            \
      o[i] = TC__OP_##K##_SUM(T, U, xi, yi);                                   \
    }                                                                          \
    return 1;                                                                  \
  }
    TC__TINY(FLOAT32, float, float, FLT)
    TC__TINY(FLOAT64, double, double, FLT)
    TC__TINY(INT32, int32_t, uint32_t, INT)
    TC__TINY(INT64, int64_t, uint64_t, INT)
#undef TC__TINY
  default:
    return 0;
  }
}

/* dst[i] = dst[i] op src[i] (see internal.h); dst == src is staged. An
 * invalid or disallowed dtype x op leaves dst unchanged. */
void tc__reduce(void *dst, const void *src, size_t n, tc_dtype_t dtype,
                tc_redop_type_t op) {
  if (reduce_tiny(dst, dst, src, n, dtype, op)) return;
  const tc__kernel_t *k = kernel_of(dtype, op);
  if (!k || n == 0) return;
  if (dst != src) k->k2(dst, src, n);
  else reduce_staged(k, dst, NULL, n, tc_dtype_size(dtype));
}

/* out[i] = a[i] op b[i] (see internal.h). out == a becomes out op= b;
 * out == b stages b; out == a == b is tc__reduce(out, out). */
void tc__reduce3(void *out, const void *a, const void *b, size_t n,
                 tc_dtype_t dtype, tc_redop_type_t op) {
  if (reduce_tiny(out, a, b, n, dtype, op)) return;
  const tc__kernel_t *k = kernel_of(dtype, op);
  if (!k || n == 0) return;
  if (out != a && out != b) k->k3(out, a, b, n);
  else if (out != b) k->k2(out, b, n); /* out == a: out op= b */
  else if (out != a) reduce_staged(k, out, a, n, tc_dtype_size(dtype));
  else reduce_staged(k, out, NULL, n, tc_dtype_size(dtype));
}

/* ------------------------------------------------------------------------ */
/* Scale and divide                                                          */
/* ------------------------------------------------------------------------ */

/* double -> int64, truncated toward zero; NaN gives 0 and out-of-range
 * values saturate (a plain cast would be undefined). */
static inline int64_t d2i64(double r) {
  if (!(r == r)) return 0;
  if (r >= 9223372036854775808.0) return INT64_MAX;
  if (r < -9223372036854775808.0) return INT64_MIN;
  return (int64_t)r;
}

/* Signed integer x / d truncated toward zero, for any unsigned 64-bit d > 0
 * (|x| < d gives 0, except INT64_MIN / 2^63 = -1). */
static inline int64_t sdiv(int64_t x, uint64_t d) {
  if (d <= (uint64_t)INT64_MAX) return x / (int64_t)d;
  return (x == INT64_MIN && d == (uint64_t)INT64_MAX + 1) ? -1 : 0;
}

/* Scale of one value x, per dtype, from the locals ff = (float)factor,
 * fd = factor, nz = (factor != 0). */
#define TC__SCALE_FLOAT32(x) ((x) * ff)
#define TC__SCALE_FLOAT64(x) ((x) * fd)
#define TC__SCALE_FLOAT16(x) tc__f2h(tc__nanfirst(tc__h2f(x), tc__h2f(x) * ff))
#define TC__SCALE_BFLOAT16(x) tc__f2bf(tc__bf2f(x) * ff)
#define TC__SCALE_INT8(x) ((int8_t)d2i64((double)(x) * fd))
#define TC__SCALE_UINT8(x) ((uint8_t)d2i64((double)(x) * fd))
#define TC__SCALE_INT16(x) ((int16_t)d2i64((double)(x) * fd))
#define TC__SCALE_INT32(x) ((int32_t)d2i64((double)(x) * fd))
#define TC__SCALE_INT64(x) ((int64_t)d2i64((double)(x) * fd))
#define TC__SCALE_BOOL(x) ((uint8_t)(((x) != 0) & nz))
#define TC__SCALE_FLOAT8_E4M3FN(x) tc__f2e4m3(tc__e4m3f(x) * ff)
#define TC__SCALE_FLOAT8_E5M2(x) tc__f2e5m2(tc__e5m2f(x) * ff)

/* Division of one value x by the locals fdiv = (float)divisor,
 * ddiv = (double)divisor, udiv = divisor. */
#define TC__DIV_FLOAT32(x) ((x) / fdiv)
#define TC__DIV_FLOAT64(x) ((x) / ddiv)
#define TC__DIV_FLOAT16(x) tc__f2h(tc__h2f(x) / fdiv)
#define TC__DIV_BFLOAT16(x) tc__f2bf(tc__bf2f(x) / fdiv)
#define TC__DIV_INT8(x) ((int8_t)sdiv(x, udiv))
#define TC__DIV_UINT8(x) ((uint8_t)((x) / udiv))
#define TC__DIV_INT16(x) ((int16_t)sdiv(x, udiv))
#define TC__DIV_INT32(x) ((int32_t)sdiv(x, udiv))
#define TC__DIV_INT64(x) ((int64_t)sdiv(x, udiv))
#define TC__DIV_BOOL(x) ((uint8_t)(((x) != 0) / udiv))
#define TC__DIV_FLOAT8_E4M3FN(x) tc__f2e4m3(tc__e4m3f(x) / fdiv)
#define TC__DIV_FLOAT8_E5M2(x) tc__f2e5m2(tc__e5m2f(x) / fdiv)

/* d[i] = F(s[i]) for i < n, in fixed-size blocks plus a tail. */
#define TC__MAP(T, d, s, n, F)                                                 \
  do {                                                                         \
    size_t i = 0;                                                              \
    for (; i + TC__BLK <= (n); i += TC__BLK)                                   \
      for (size_t j = 0; j < TC__BLK; j++) {                                   \
        const T x = (s)[i + j];                                                \
        (d)[i + j] = F(x);                                                     \
      }                                                                        \
    for (; i < (n); i++) {                                                     \
      const T x = (s)[i];                                                      \
      (d)[i] = F(x);                                                           \
    }                                                                          \
  } while (0)

/* Per dtype (from TC_DTYPE_MAP): tc__scale_<D> (src -> dst, no aliasing),
 * tc__scalei_<D> (in place) and tc__divide_<D> (in place). */
#define TC__GEN_SCALE_DIVIDE(D, val, T, size, isf)                             \
  static TC__HOT void tc__scale_##D(T *restrict d, const T *restrict s,        \
                                    size_t n, double fd) {                     \
    const float ff = (float)fd;                                                \
    const uint8_t nz = fd != 0;                                                \
    (void)ff;                                                                  \
    (void)nz;                                                                  \
    TC__MAP(T, d, s, n, TC__SCALE_##D);                                        \
  }                                                                            \
  static TC__HOT void tc__scalei_##D(T *d, size_t n, double fd) {              \
    const float ff = (float)fd;                                                \
    const uint8_t nz = fd != 0;                                                \
    (void)ff;                                                                  \
    (void)nz;                                                                  \
    TC__MAP(T, d, d, n, TC__SCALE_##D);                                        \
  }                                                                            \
  static TC__HOT void tc__divide_##D(T *d, size_t n, uint64_t udiv) {          \
    const float fdiv = (float)udiv;                                            \
    const double ddiv = (double)udiv;                                          \
    (void)fdiv;                                                                \
    (void)ddiv;                                                                \
    TC__MAP(T, d, d, n, TC__DIV_##D);                                          \
  }

TC_DTYPE_MAP(TC__GEN_SCALE_DIVIDE)

/* Streaming stores: see internal.h. */
#if defined(__x86_64__)
#include <emmintrin.h>
void tc__copy_stream(void *dst, const void *src, size_t n) {
  char *d = dst;
  const char *s = src;
  size_t head = (size_t)(-(uintptr_t)d & 63); /* to a cache line */
  if (n < head + 256) {
    memcpy(d, s, n);
    return;
  }
  memcpy(d, s, head);
  d += head, s += head, n -= head;
  for (; n >= 64; d += 64, s += 64, n -= 64) {
    const __m128i a = _mm_loadu_si128((const __m128i *)s);
    const __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
    const __m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
    const __m128i e = _mm_loadu_si128((const __m128i *)(s + 48));
    _mm_stream_si128((__m128i *)d, a);
    _mm_stream_si128((__m128i *)(d + 16), b);
    _mm_stream_si128((__m128i *)(d + 32), c);
    _mm_stream_si128((__m128i *)(d + 48), e);
  }
  _mm_sfence(); /* the stores are visible before anything the caller posts */
  memcpy(d, s, n);
}
#else
void tc__copy_stream(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
#endif

/* dst[i] = src[i] * factor: float32 in float32 (factor rounded to float),
 * float64 in double, the 16- and 8-bit floats through float32 rounded once;
 * integers: the double product truncated toward zero, saturated to int64,
 * then wrapped to the type; bool: (src[i] != 0 && factor != 0). dst may
 * equal src (the in-place kernel runs then). */
void tc__scale(void *dst, const void *src, size_t n, tc_dtype_t dtype,
               double factor) {
  if (n == 0) return;
#ifdef TC__SIMD16
  const int m = simd16();
  if ((dtype == TC_BFLOAT16 && (m & 1)) || (dtype == TC_FLOAT16 && (m & 2))) {
    if (dtype == TC_BFLOAT16) tc__vscale_BFLOAT16(dst, src, n, (float)factor);
    else tc__vscale_FLOAT16(dst, src, n, (float)factor);
    return;
  }
#endif
  switch (dtype) {
#define TC__SCALE_CASE(D, val, T, size, isf)                                   \
  case TC_##D:                                                                 \
    if (dst == src) tc__scalei_##D((T *)dst, n, factor);                       \
    else tc__scale_##D((T *)dst, (const T *)src, n, factor);                   \
    break;
    TC_DTYPE_MAP(TC__SCALE_CASE)
#undef TC__SCALE_CASE
  default:
    break;
  }
}

/* buf[i] /= divisor: floats divide by the divisor converted to the type's
 * precision (float32 for the 16- and 8-bit floats, rounded once); signed integers
 * truncate toward zero, unsigned integers and bool divide as unsigned. A
 * divisor of 0 leaves buf unchanged. */
void tc__divide(void *buf, size_t n, tc_dtype_t dtype, uint64_t divisor) {
  if (n == 0 || divisor == 0) return; /* divisor 0: left unchanged */
#ifdef TC__SIMD16
  const int m = simd16();
  if ((dtype == TC_BFLOAT16 && (m & 1)) || (dtype == TC_FLOAT16 && (m & 2))) {
    if (dtype == TC_BFLOAT16) tc__vdivide_BFLOAT16(buf, buf, n, (float)divisor);
    else tc__vdivide_FLOAT16(buf, buf, n, (float)divisor);
    return;
  }
#endif
  switch (dtype) {
#define TC__DIVIDE_CASE(D, val, T, size, isf)                                  \
  case TC_##D:                                                                 \
    tc__divide_##D((T *)buf, n, divisor);                                      \
    break;
    TC_DTYPE_MAP(TC__DIVIDE_CASE)
#undef TC__DIVIDE_CASE
  default:
    break;
  }
}

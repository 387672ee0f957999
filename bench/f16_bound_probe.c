/* f16_bound_probe.c -- how fast this CPU can add two float16 (and
 * bfloat16) arrays at all, whatever the NaN rules: the bound behind issue
 * 16's point 5 (docs/benchmarks.md, "16-bit floats and the reduction
 * kernels").
 *
 * Loops of out = a + b over 16-bit arrays, none of them the
 * library's (src/reduce/reduce.c has the real kernels, with their NaN
 * rules; tcreduce_bench measures those):
 *
 *   zmm-bare   vcvtph2ps (512 bits) on both inputs, vaddps, vcvtps2ph; no
 *              NaN test at all: the conversions alone;
 *   ymm-bare   the same on 256-bit vectors;
 *   zmm-int    the inputs widened without vcvtph2ps (integer shifts and a
 *              multiply by 2^112, exact for finite inputs without DAZ),
 *              vcvtps2ph for the result: whether moving the widening off
 *              the conversion unit pays;
 *   ymm-mix    ymm-bare with one input widened by integer operations (as
 *              zmm-int, on 256-bit vectors), the other by vcvtph2ps:
 *              whether sharing the widening between the conversion unit
 *              and the integer units pays;
 *   ymm-pint   ymm-bare with the result packed by integer operations
 *              (round to nearest even by an add, exact for results in
 *              float16's normal range), not vcvtps2ph;
 *   f32        out = a + b on float32 arrays of the same byte size: the
 *              rate float16 is compared with;
 *   ph-add     vaddph on 512-bit vectors, where the CPU has AVX512-FP16:
 *              float16 without conversions (the library's tier 3 kernel
 *              without its NaN test);
 *   bf16-full, bf16-nofpc, bf16-noperm, bf16-bare
 *              bfloat16 out = a + b as the library's AVX-512 step, and
 *              without its vfpclassps NaN/subnormal test, without its
 *              vpermw reordering, without both (where the CPU has
 *              AVX512_BF16): what bounds bfloat16 on a given CPU.
 *   bf16-intrnd, bf16-widen, bf16-ymm, bf16-ochk, bf16-acc
 *              the same bits as bf16-full by other instructions (integer
 *              rounding; in-order widening without vpermw; 256-bit
 *              vectors; the special-lane test on the packed results, per
 *              step or per block), each checked against it: whether
 *              another step would be faster.
 *
 * On every CPU with AVX2 and F16C (the library's tier 1, the only 16-bit
 * tier on CPUs without AVX-512 such as Zen 3), with 256-bit AVX2 code:
 *
 *   a2-f16-bare    vcvtph2ps x2, vaddps, vcvtps2ph: the conversions alone;
 *   a2-f16-step    the library's AVX2 float16 step on data without NaN
 *                  (TC__A64_H: 64 results, one vcmpps per 16, one branch);
 *   a2-bf16-step   the library's AVX2 bfloat16 step likewise (TC__A64_BF:
 *                  widen by shift/mask, vaddps, round to nearest even by
 *                  integer operations, one NaN test per 64);
 *   a2-bf16-nonan  a2-bf16-step without its NaN test;
 *   a2-bf16-trunc  a2-bf16-nonan without the rounding (truncated: other
 *                  bits, said on its line): what the rounding costs;
 *   a2-f32         out = a + b on float32 arrays of the same byte size.
 * The steps' bits are checked against the library's rules on this data
 * (finite, no NaN): a2-f16-step against a2-f16-bare, a2-bf16-nonan
 * against a2-bf16-step.
 *
 * GB/s of one input's bytes (as tcreduce_bench), median of 5 timings of
 * >= 20 ms each, one thread, hot buffers.
 *
 * Output, one line per loop and size: "loop BYTES GB/s".
 * Usage: tcf16_probe [BYTES ...]   (default 16384 65536 1048576; each
 * rounded down to a multiple of 128)
 * Prints "SKIP: ..." and exits 0 where the CPU lacks AVX2 or F16C (the
 * AVX-512 loops: where it lacks AVX-512 F/BW/DQ/VL) or the compiler is not
 * GCC/Clang on x86-64. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define Z __attribute__((noinline, target("avx512f,avx512bw,avx512dq,avx512vl,f16c")))
#define ZI static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512dq,avx512vl,f16c")))
#define RND (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

static Z void zmm_bare(void *ov, const void *av, const void *bv, size_t n) {
  uint16_t *o = ov;
  const uint16_t *a = av, *b = bv;
  for (size_t i = 0; i + 16 <= n; i += 16) {
    __m512 x = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(a + i)));
    __m512 y = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b + i)));
    _mm256_storeu_si256((__m256i *)(o + i), _mm512_cvtps_ph(_mm512_add_ps(x, y), RND));
  }
}

static Z void ymm_bare(void *ov, const void *av, const void *bv, size_t n) {
  uint16_t *o = ov;
  const uint16_t *a = av, *b = bv;
  for (size_t i = 0; i + 8 <= n; i += 8) {
    __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i)));
    __m256 y = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + i)));
    _mm_storeu_si128((__m128i *)(o + i), _mm256_cvtps_ph(_mm256_add_ps(x, y), RND));
  }
}

/* 16 float16 widened with integer operations: sign and exponent/mantissa
 * moved into place, then scaled by 2^112 (exponent bias 127 - 15). */
ZI __m512 widen_int(const uint16_t *p) {
  __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
  __m512i t = _mm512_and_si512(_mm512_srai_epi32(_mm512_slli_epi32(w, 16), 3),
                               _mm512_set1_epi32((int)0x8FFFE000u));
  return _mm512_mul_ps(_mm512_castsi512_ps(t), _mm512_castsi512_ps(_mm512_set1_epi32(0x77800000)));
}

static Z void zmm_int(void *ov, const void *av, const void *bv, size_t n) {
  uint16_t *o = ov;
  const uint16_t *a = av, *b = bv;
  for (size_t i = 0; i + 16 <= n; i += 16)
    _mm256_storeu_si256((__m256i *)(o + i),
                        _mm512_cvtps_ph(_mm512_add_ps(widen_int(a + i), widen_int(b + i)), RND));
}

/* zmm-int's widening on 256-bit vectors */
ZI __m256 widen_int_y(const uint16_t *p) {
  __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
  __m256i t = _mm256_and_si256(_mm256_srai_epi32(_mm256_slli_epi32(w, 16), 3),
                               _mm256_set1_epi32((int)0x8FFFE000u));
  return _mm256_mul_ps(_mm256_castsi256_ps(t), _mm256_castsi256_ps(_mm256_set1_epi32(0x77800000)));
}

static Z void ymm_mix(void *ov, const void *av, const void *bv, size_t n) {
  uint16_t *o = ov;
  const uint16_t *a = av, *b = bv;
  for (size_t i = 0; i + 8 <= n; i += 8) {
    __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i)));
    _mm_storeu_si128((__m128i *)(o + i), _mm256_cvtps_ph(_mm256_add_ps(x, widen_int_y(b + i)), RND));
  }
}

/* 8 float32 in float16's normal range to float16, rounded to nearest even
 * by integer operations: the 13 dropped bits rounded by an add, the
 * exponent rebiased (127 - 15), the sign put back, packed with vpackusdw. */
ZI __m128i pack_int_y(__m256 r) {
  const __m256i x = _mm256_castps_si256(r);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 13), _mm256_set1_epi32(1));
  __m256i y = _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0xFFF)), odd);
  y = _mm256_sub_epi32(_mm256_srli_epi32(y, 13), _mm256_set1_epi32(112 << 10));
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x8000));
  y = _mm256_or_si256(_mm256_and_si256(y, _mm256_set1_epi32(0x7FFF)), sign);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(y, y), 0x08));
}

static Z void ymm_pint(void *ov, const void *av, const void *bv, size_t n) {
  uint16_t *o = ov;
  const uint16_t *a = av, *b = bv;
  for (size_t i = 0; i + 8 <= n; i += 8) {
    __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i)));
    __m256 y = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + i)));
    _mm_storeu_si128((__m128i *)(o + i), pack_int_y(_mm256_add_ps(x, y)));
  }
}

static Z void f32_add(void *ov, const void *av, const void *bv, size_t n) {
  float *o = ov;
  const float *a = av, *b = bv;
  for (size_t i = 0; i + 16 <= n; i += 16)
    _mm512_storeu_ps(o + i, _mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
}

/* bfloat16 out = a + b (issue 16, point 5 on Intel CPUs), the library's
 * AVX-512 step (src/reduce/reduce.c, TC__Z64_BF) taken apart: the even
 * and odd elements widened by a shift and a mask, vaddps, vcvtne2ps2bf16;
 * V 0 as the library (vfpclassps per 16 results, vpermw to put the
 * elements back in order; a step with a special lane only marks it here),
 * 1 without the vfpclassps, 2 without the vpermw (wrong order), 3 without
 * either: the widening and the conversion alone. */
#define BF __attribute__((noinline, target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))
#define BFI static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))
#define BF_EV(x) _mm512_castsi512_ps(_mm512_slli_epi32(x, 16))
#define BF_OD(x) _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xFFFF0000u)))
/* The ways bf_loop joins 32 results into bfloat16 (see bf16-intrnd below
 * for BF_INTRND). */
enum { BF_CVT, BF_CVT_PERM, BF_INTRND };
BFI __m512i bf_round(__m512 r) {
  const __m512i u = _mm512_castps_si512(r);
  const __m512i t = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  return _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), t);
}
BFI __m512i bf_pack(__m512 ev, __m512 od, int pack) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                       8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  if (pack == BF_INTRND)
    return _mm512_ternarylogic_epi32(bf_round(od), _mm512_srli_epi32(bf_round(ev), 16),
                                     _mm512_set1_epi32((int)0xFFFF0000u), 0xE4);
  const __m512i r = (__m512i)_mm512_cvtne2ps_pbh(od, ev);
  return pack == BF_CVT_PERM ? _mm512_permutexvar_epi16(idx, r) : r;
}
/* The float32 sums of 64 bfloat16 pairs from element i on: even and odd
 * elements of the first 32 (s[0], s[1]), then of the next 32 (s[2], s[3]). */
BFI void bf_sums(const uint16_t *a, const uint16_t *b, size_t i, __m512 s[4]) {
  for (int h = 0; h < 2; h++) {
    const __m512i x = _mm512_loadu_si512(a + i + 32 * h), y = _mm512_loadu_si512(b + i + 32 * h);
    s[2 * h] = _mm512_add_ps(BF_EV(x), BF_EV(y));
    s[2 * h + 1] = _mm512_add_ps(BF_OD(x), BF_OD(y));
  }
}
/* fpc: the vfpclassps classes a step tests: 0xA1 or 0x81 (0: no test) */
BFI void bf_loop(uint16_t *o, const uint16_t *a, const uint16_t *b, size_t n, int fpc, int pack) {
  for (size_t i = 0; i + 64 <= n; i += 64) {
    __m512 r[4];
    bf_sums(a, b, i, r);
    const __m512 e0 = r[0], d0 = r[1], e1 = r[2], d1 = r[3];
    __mmask16 f = 0;
    /* the classes as immediates (an unoptimised build does not fold a
     * parameter into one): 0xA1 NaN or subnormal, 0x81 NaN only */
#define BF_FPC4(k)                                                                      \
  (__mmask16)(_mm512_fpclass_ps_mask(e0, k) | _mm512_fpclass_ps_mask(d0, k) |            \
              _mm512_fpclass_ps_mask(e1, k) | _mm512_fpclass_ps_mask(d1, k))
    if (fpc == 0xA1)
      f = BF_FPC4(0xA1);
    else if (fpc == 0x81)
      f = BF_FPC4(0x81);
#undef BF_FPC4
    if (__builtin_expect(f == 0, 1)) {
      _mm512_storeu_si512(o + i, bf_pack(e0, d0, pack));
      _mm512_storeu_si512(o + i + 32, bf_pack(e1, d1, pack));
    } else {
      o[i] = 0x7FC0;
    }
  }
}
static BF void bf_full(void *o, const void *a, const void *b, size_t n) { bf_loop(o, a, b, n, 0xA1, BF_CVT_PERM); }
static BF void bf_nofpc(void *o, const void *a, const void *b, size_t n) { bf_loop(o, a, b, n, 0, BF_CVT_PERM); }
static BF void bf_noperm(void *o, const void *a, const void *b, size_t n) { bf_loop(o, a, b, n, 0xA1, BF_CVT); }
static BF void bf_bare(void *o, const void *a, const void *b, size_t n) { bf_loop(o, a, b, n, 0, BF_CVT); }

/* Three other ways to the same bits, each a whole step with its special
 * lane test (what a kernel would need), checked against bf16-full:
 *   bf16-intrnd  tc__f2bf's integer rounding (x + 0x7FFF + bit 16) on
 *                the vectors, the halves joined by one vpternlogd: no
 *                vcvtne2ps2bf16 and no vpermw; only NaN needs the test
 *                (the rounding is exact on subnormals);
 *   bf16-widen   16 elements at a time widened in order (vpmovzxwd and a
 *                shift), vcvtneps2bf16 of 16 results: no vpermw, two
 *                widenings more;
 *   bf16-ymm     bf16-full on 256-bit vectors (three vector ports on
 *                Intel instead of two). */
static BF void bf_intrnd(void *o, const void *a, const void *b, size_t n) {
  bf_loop(o, a, b, n, 0x81, BF_INTRND); /* NaN only: the rounding is exact on subnormals */
}
#define BF_WIDE(p) \
  _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(p))), 16))
static BF void bf_widen(void *ov, const void *av, const void *bv, size_t n) {
  uint16_t *o = ov;
  const uint16_t *a = av, *b = bv;
  for (size_t i = 0; i + 32 <= n; i += 32) {
    const __m512 r0 = _mm512_add_ps(BF_WIDE(a + i), BF_WIDE(b + i));
    const __m512 r1 = _mm512_add_ps(BF_WIDE(a + i + 16), BF_WIDE(b + i + 16));
    const __mmask16 f = (__mmask16)(_mm512_fpclass_ps_mask(r0, 0xA1) | _mm512_fpclass_ps_mask(r1, 0xA1));
    if (__builtin_expect(f == 0, 1)) {
      _mm256_storeu_si256((__m256i *)(void *)(o + i), (__m256i)_mm512_cvtneps_pbh(r0));
      _mm256_storeu_si256((__m256i *)(void *)(o + i + 16), (__m256i)_mm512_cvtneps_pbh(r1));
    } else {
      o[i] = 0x7FC0;
    }
  }
}
/* Two more tests for the lanes tc__f2bf must redo, on the packed results
 * instead of the float32 sums (a flushed subnormal comes out as a zero, a
 * NaN with exponent 0xFF, so a result whose exponent is 0 or 0xFF marks
 * its step; true zeros too, which a kernel would then recheck with
 * vfpclassps): per 32 results a rotate that puts each exponent in the top
 * byte of its 16 bits, an add and one vpcmpuw (bf16-ochk); or the same
 * kept as a running minimum and tested once per 1 024 results (bf16-acc,
 * whose kernel would redo a marked block from its inputs). Both have no
 * vfpclassps and no per-step mask work; same bits as bf16-full. */
BFI __m512i bf_exp_key(__m512i p) { /* < 0x0200 where the exponent is 0 or 0xFF */
  return _mm512_add_epi16(_mm512_rol_epi32(p, 1), _mm512_set1_epi16(0x0100));
}
static BF void bf_ochk(void *ov, const void *av, const void *bv, size_t n) {
  uint16_t *o = ov;
  const uint16_t *a = av, *b = bv;
  const __m512i lim = _mm512_set1_epi16(0x0200);
  for (size_t i = 0; i + 64 <= n; i += 64) {
    __m512 r[4];
    bf_sums(a, b, i, r);
    const __m512i p0 = bf_pack(r[0], r[1], BF_CVT_PERM), p1 = bf_pack(r[2], r[3], BF_CVT_PERM);
    if (__builtin_expect(_kortestz_mask32_u8(_mm512_cmplt_epu16_mask(bf_exp_key(p0), lim),
                                             _mm512_cmplt_epu16_mask(bf_exp_key(p1), lim)), 1)) {
      _mm512_storeu_si512(o + i, p0);
      _mm512_storeu_si512(o + i + 32, p1);
    } else {
      o[i] = 0x7FC0;
    }
  }
}
static BF void bf_acc(void *ov, const void *av, const void *bv, size_t n) {
  uint16_t *o = ov;
  const uint16_t *a = av, *b = bv;
  for (size_t j = 0; j + 64 <= n; j += 1024) {
    const size_t end = j + 1024 < n ? j + 1024 : n;
    __m512i acc = _mm512_set1_epi16(-1);
    for (size_t i = j; i + 64 <= end; i += 64) {
      __m512 r[4];
      bf_sums(a, b, i, r);
      const __m512i p0 = bf_pack(r[0], r[1], BF_CVT_PERM), p1 = bf_pack(r[2], r[3], BF_CVT_PERM);
      acc = _mm512_min_epu16(acc, _mm512_min_epu16(bf_exp_key(p0), bf_exp_key(p1)));
      _mm512_storeu_si512(o + i, p0);
      _mm512_storeu_si512(o + i + 32, p1);
    }
    if (_mm512_cmplt_epu16_mask(acc, _mm512_set1_epi16(0x0200))) o[j] = 0x7FC0;
  }
}
#define BF_EVY(x) _mm256_castsi256_ps(_mm256_slli_epi32(x, 16))
#define BF_ODY(x) _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32((int)0xFFFF0000u)))
BFI __m256i bf_pack_y(__m256 ev, __m256 od) {
  const __m256i idx = _mm256_set_epi16(15, 7, 14, 6, 13, 5, 12, 4, 11, 3, 10, 2, 9, 1, 8, 0);
  return _mm256_permutexvar_epi16(idx, (__m256i)_mm256_cvtne2ps_pbh(od, ev));
}
static BF void bf_ymm(void *ov, const void *av, const void *bv, size_t n) {
  uint16_t *o = ov;
  const uint16_t *a = av, *b = bv;
  for (size_t i = 0; i + 32 <= n; i += 32) {
    const __m256i xa = _mm256_loadu_si256((const __m256i *)(const void *)(a + i));
    const __m256i xb = _mm256_loadu_si256((const __m256i *)(const void *)(b + i));
    const __m256i ya = _mm256_loadu_si256((const __m256i *)(const void *)(a + i + 16));
    const __m256i yb = _mm256_loadu_si256((const __m256i *)(const void *)(b + i + 16));
    const __m256 e0 = _mm256_add_ps(BF_EVY(xa), BF_EVY(xb)), d0 = _mm256_add_ps(BF_ODY(xa), BF_ODY(xb));
    const __m256 e1 = _mm256_add_ps(BF_EVY(ya), BF_EVY(yb)), d1 = _mm256_add_ps(BF_ODY(ya), BF_ODY(yb));
    const __mmask8 f = (__mmask8)(_mm256_fpclass_ps_mask(e0, 0xA1) | _mm256_fpclass_ps_mask(d0, 0xA1) |
                                  _mm256_fpclass_ps_mask(e1, 0xA1) | _mm256_fpclass_ps_mask(d1, 0xA1));
    if (__builtin_expect(f == 0, 1)) {
      _mm256_storeu_si256((__m256i *)(void *)(o + i), bf_pack_y(e0, d0));
      _mm256_storeu_si256((__m256i *)(void *)(o + i + 16), bf_pack_y(e1, d1));
    } else {
      o[i] = 0x7FC0;
    }
  }
}

#if (defined(__clang__) && __clang_major__ >= 14) || (!defined(__clang__) && __GNUC__ >= 12)
#define HAVE_PH 1
/* float16 out = a + b with AVX512-FP16's vaddph (the library's tier 3
 * without its NaN test). */
static __attribute__((noinline, target("avx512fp16,avx512f,avx512bw,avx512vl"))) void
ph_add(void *ov, const void *av, const void *bv, size_t n) {
  uint16_t *o = ov;
  const uint16_t *a = av, *b = bv;
  for (size_t i = 0; i + 32 <= n; i += 32)
    _mm512_storeu_ph(o + i, _mm512_add_ph(_mm512_loadu_ph(a + i), _mm512_loadu_ph(b + i)));
}
#endif

/* The AVX2 loops (a2-*): plain AVX2 + F16C code, no EVEX encodings. */
#define A2 __attribute__((noinline, target("avx2,f16c")))
#define A2I static inline __attribute__((always_inline, target("avx2,f16c")))
#define A2_HL(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p)))
#define A2_HS(p, r) _mm_storeu_si128((__m128i *)(void *)(p), _mm256_cvtps_ph(r, RND))

static A2 void a2_f16_bare(void *ov, const void *av, const void *bv, size_t n) {
  uint16_t *o = ov;
  const uint16_t *a = av, *b = bv;
  for (size_t i = 0; i + 8 <= n; i += 8) A2_HS(o + i, _mm256_add_ps(A2_HL(a + i), A2_HL(b + i)));
}

static A2 void a2_f16_step(void *ov, const void *av, const void *bv, size_t n) {
  uint16_t *o = ov;
  const uint16_t *a = av, *b = bv;
  for (size_t i = 0; i + 64 <= n; i += 64) { /* written out: GCC keeps arrays in memory */
    const __m256 r0 = _mm256_add_ps(A2_HL(a + i), A2_HL(b + i));
    const __m256 r1 = _mm256_add_ps(A2_HL(a + i + 8), A2_HL(b + i + 8));
    const __m256 r2 = _mm256_add_ps(A2_HL(a + i + 16), A2_HL(b + i + 16));
    const __m256 r3 = _mm256_add_ps(A2_HL(a + i + 24), A2_HL(b + i + 24));
    const __m256 r4 = _mm256_add_ps(A2_HL(a + i + 32), A2_HL(b + i + 32));
    const __m256 r5 = _mm256_add_ps(A2_HL(a + i + 40), A2_HL(b + i + 40));
    const __m256 r6 = _mm256_add_ps(A2_HL(a + i + 48), A2_HL(b + i + 48));
    const __m256 r7 = _mm256_add_ps(A2_HL(a + i + 56), A2_HL(b + i + 56));
    const __m256 nan =
        _mm256_or_ps(_mm256_or_ps(_mm256_cmp_ps(r0, r1, _CMP_UNORD_Q), _mm256_cmp_ps(r2, r3, _CMP_UNORD_Q)),
                     _mm256_or_ps(_mm256_cmp_ps(r4, r5, _CMP_UNORD_Q), _mm256_cmp_ps(r6, r7, _CMP_UNORD_Q)));
    if (__builtin_expect(_mm256_movemask_ps(nan) == 0, 1)) {
      A2_HS(o + i, r0);
      A2_HS(o + i + 8, r1);
      A2_HS(o + i + 16, r2);
      A2_HS(o + i + 24, r3);
      A2_HS(o + i + 32, r4);
      A2_HS(o + i + 40, r5);
      A2_HS(o + i + 48, r6);
      A2_HS(o + i + 56, r7);
    } else {
      o[i] = 0x7E00; /* not on this data */
    }
  }
}

/* bfloat16 as the library's tier 1: even lanes shifted up, odd lanes
 * masked; packed back with the rounding by vpavgw (tc__bf_round) or
 * truncated. */
A2I void a2_bf_load(const uint16_t *p, __m256 *ev, __m256 *od) {
  const __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)p);
  *ev = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
  *od = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32((int)0xFFFF0000u)));
}
A2I __m256i a2_bf_round(__m256 ev, __m256 od) {
  const __m256i e = _mm256_castps_si256(ev), o = _mm256_castps_si256(od);
  const __m256i h = _mm256_blend_epi16(_mm256_srli_epi32(e, 16), o, 0xAA);
  const __m256i l = _mm256_blend_epi16(e, _mm256_slli_epi32(o, 16), 0xAA);
  const __m256i t = _mm256_add_epi16(_mm256_and_si256(h, _mm256_set1_epi16(1)), _mm256_set1_epi16(0x7FFE));
  return _mm256_add_epi16(h, _mm256_srli_epi16(_mm256_avg_epu16(l, t), 15));
}
A2I __m256i a2_bf_trunc(__m256 ev, __m256 od) {
  return _mm256_blend_epi16(_mm256_srli_epi32(_mm256_castps_si256(ev), 16), _mm256_castps_si256(od), 0xAA);
}
/* mode 0: the step (NaN test, rounding); 1: no NaN test; 2: neither.
 * Written out: GCC keeps arrays of vectors in memory. */
#define A2_BF_SUM(k, e, d)                                                     \
  __m256 e, d;                                                                 \
  do {                                                                         \
    __m256 ae_, ad_, be_, bd_;                                                 \
    a2_bf_load(a + i + 16 * (k), &ae_, &ad_);                                  \
    a2_bf_load(b + i + 16 * (k), &be_, &bd_);                                  \
    e = _mm256_add_ps(ae_, be_);                                               \
    d = _mm256_add_ps(ad_, bd_);                                               \
  } while (0)
#define A2_BF_PUT(k, e, d)                                                     \
  _mm256_storeu_si256((__m256i *)(void *)(o + i + 16 * (k)),                   \
                      mode == 2 ? a2_bf_trunc(e, d) : a2_bf_round(e, d))
A2I void a2_bf_loop(uint16_t *o, const uint16_t *a, const uint16_t *b, size_t n, int mode) {
  for (size_t i = 0; i + 64 <= n; i += 64) {
    A2_BF_SUM(0, e0, d0);
    A2_BF_SUM(1, e1, d1);
    A2_BF_SUM(2, e2, d2);
    A2_BF_SUM(3, e3, d3);
    if (mode == 0) {
      const __m256 nan = _mm256_or_ps(
          _mm256_or_ps(_mm256_cmp_ps(e0, d0, _CMP_UNORD_Q), _mm256_cmp_ps(e1, d1, _CMP_UNORD_Q)),
          _mm256_or_ps(_mm256_cmp_ps(e2, d2, _CMP_UNORD_Q), _mm256_cmp_ps(e3, d3, _CMP_UNORD_Q)));
      if (__builtin_expect(_mm256_movemask_ps(nan) != 0, 0)) {
        o[i] = 0x7FC0; /* not on this data */
        continue;
      }
    }
    A2_BF_PUT(0, e0, d0);
    A2_BF_PUT(1, e1, d1);
    A2_BF_PUT(2, e2, d2);
    A2_BF_PUT(3, e3, d3);
  }
}
static A2 void a2_bf16_step(void *o, const void *a, const void *b, size_t n) { a2_bf_loop(o, a, b, n, 0); }
static A2 void a2_bf16_nonan(void *o, const void *a, const void *b, size_t n) { a2_bf_loop(o, a, b, n, 1); }
static A2 void a2_bf16_trunc(void *o, const void *a, const void *b, size_t n) { a2_bf_loop(o, a, b, n, 2); }

static A2 void a2_f32(void *ov, const void *av, const void *bv, size_t n) {
  float *o = ov;
  const float *a = av, *b = bv;
  for (size_t i = 0; i + 8 <= n; i += 8)
    _mm256_storeu_ps(o + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
}

static double cpu_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_d(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

/* every loop: out, a, b, element count */
typedef void (*loop_fn)(void *, const void *, const void *, size_t);

/* GB/s of one input's `bytes`: median of 5 timings of >= 20 ms. */
static double rate(loop_fn f, void *o, const void *a, const void *b, size_t n, size_t bytes) {
  double r[5];
  for (int k = 0; k < 5; k++) {
    long reps = 0;
    double t0 = cpu_now(), t;
    do {
      for (int j = 0; j < 64; j++) f(o, a, b, n);
      reps += 64;
      t = cpu_now() - t0;
    } while (t < 0.02);
    r[k] = (double)bytes * (double)reps / t / 1e9;
  }
  qsort(r, 5, sizeof r[0], cmp_d);
  return r[2];
}

/* Two a2-* loops on the same data: a line each (none for the first where
 * n1 is NULL), the second's saying `differ` where its bits are not the
 * first's. */
static void a2_pair(const char *n1, loop_fn f1, const char *n2, loop_fn f2, const char *differ,
                    uint16_t *o, const uint16_t *a, const uint16_t *b, size_t n, size_t bytes) {
  uint16_t *want = malloc(bytes), *got = malloc(bytes);
  if (!want || !got) exit(1);
  f1(want, a, b, n);
  f2(got, a, b, n);
  if (n1) printf("%s %zu %.1f\n", n1, bytes, rate(f1, o, a, b, n, bytes));
  printf("%s %zu %.1f%s\n", n2, bytes, rate(f2, o, a, b, n, bytes), memcmp(want, got, bytes) ? differ : "");
  free(want);
  free(got);
}

/* The a2-* loops at one size, over m (3 x bytes). */
static void avx2_loops(char *m, size_t bytes) {
  uint16_t *a = (uint16_t *)m, *b = (uint16_t *)(m + bytes), *o = (uint16_t *)(m + 2 * bytes);
  const size_t n = bytes / 2;
  for (size_t i = 0; i < n; i++) { /* float16 1.0 .. about 2.0, 0.5 .. 1.0 */
    a[i] = (uint16_t)(0x3C00 + (i * 7) % 1000);
    b[i] = (uint16_t)(0x3800 + (i * 13) % 1000);
  }
  a2_pair("a2-f16-bare", a2_f16_bare, "a2-f16-step", a2_f16_step, " (WRONG BITS)", o, a, b, n, bytes);
  for (size_t i = 0; i < n; i++) { /* bfloat16 1.0 .. 2.0 and 0.5 .. 1.0 */
    a[i] = (uint16_t)(0x3F80 + (i * 7) % 128);
    b[i] = (uint16_t)(0x3F00 + (i * 13) % 128);
  }
  a2_pair("a2-bf16-step", a2_bf16_step, "a2-bf16-nonan", a2_bf16_nonan, " (WRONG BITS)", o, a, b, n,
          bytes);
  a2_pair(NULL, a2_bf16_step, "a2-bf16-trunc", a2_bf16_trunc, " (truncated: other bits)", o,
          a, b, n, bytes);
  memset(m, 0, 3 * bytes); /* float32 zeros */
  printf("a2-f32 %zu %.1f\n", bytes, rate(a2_f32, o, a, b, bytes / 4, bytes));
}

int main(int argc, char **argv) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("f16c")) {
    printf("SKIP: this CPU lacks AVX2 or F16C\n");
    return 0;
  }
  const int z = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  static const size_t dflt[] = {16384, 65536, 1048576};
  int nsz = argc > 1 ? argc - 1 : 3;
  printf("# loop BYTES GB/s (of one input; one thread, hot; median of 5 x 20 ms)\n");
  for (int s = 0; s < nsz; s++) {
    size_t bytes = argc > 1 ? strtoull(argv[s + 1], NULL, 0) : dflt[s];
    bytes = bytes / 128 * 128;
    if (bytes == 0) {
      fprintf(stderr, "tcf16_probe: BYTES must be at least 128\n");
      return 2;
    }
    char *m = aligned_alloc(64, 3 * bytes);
    if (!m) return 1;
    avx2_loops(m, bytes);
    if (!z) { /* the AVX-512 loops need AVX-512 */
      free(m);
      continue;
    }
    uint16_t *a = (uint16_t *)m, *b = (uint16_t *)(m + bytes), *o = (uint16_t *)(m + 2 * bytes);
    size_t n = bytes / 2;
    for (size_t i = 0; i < n; i++) { /* finite values: 1.0 .. about 2.0 */
      a[i] = (uint16_t)(0x3C00 + (i * 7) % 1000);
      b[i] = (uint16_t)(0x3800 + (i * 13) % 1000);
    }
    /* the integer widening and packing give the same sums on this data */
    uint16_t *want = malloc(bytes);
    if (!want) return 1;
    zmm_bare(want, a, b, n);
    static const struct { const char *name; loop_fn f; } f16[] = {
        {"zmm-bare", zmm_bare}, {"ymm-bare", ymm_bare}, {"zmm-int", zmm_int},
        {"ymm-mix", ymm_mix}, {"ymm-pint", ymm_pint}};
    for (size_t k = 0; k < sizeof f16 / sizeof f16[0]; k++) {
      memset(o, 0, bytes);
      f16[k].f(o, a, b, n);
      printf("%s %zu %.1f%s\n", f16[k].name, bytes, rate(f16[k].f, o, a, b, n, bytes),
             memcmp(want, o, bytes) ? " (WRONG BITS)" : "");
    }
    free(want);
#ifdef HAVE_PH
    if (__builtin_cpu_supports("avx512fp16"))
      printf("ph-add %zu %.1f\n", bytes, rate(ph_add, o, a, b, n, bytes));
#endif
    if (__builtin_cpu_supports("avx512bf16")) {
      for (size_t i = 0; i < n; i++) { /* bfloat16 1.0 .. 2.0 and 0.5 .. 1.0 */
        a[i] = (uint16_t)(0x3F80 + (i * 7) % 128);
        b[i] = (uint16_t)(0x3F00 + (i * 13) % 128);
      }
      printf("bf16-full %zu %.1f\n", bytes, rate(bf_full, o, a, b, n, bytes));
      printf("bf16-nofpc %zu %.1f\n", bytes, rate(bf_nofpc, o, a, b, n, bytes));
      printf("bf16-noperm %zu %.1f\n", bytes, rate(bf_noperm, o, a, b, n, bytes));
      printf("bf16-bare %zu %.1f\n", bytes, rate(bf_bare, o, a, b, n, bytes));
      /* the three other ways give bf16-full's bits (else the line says so) */
      uint16_t *ref = malloc(bytes), *got = malloc(bytes);
      if (!ref || !got) return 1;
      bf_full(ref, a, b, n);
      static const struct { const char *name; loop_fn f; } alt[] = {
          {"bf16-intrnd", bf_intrnd}, {"bf16-widen", bf_widen}, {"bf16-ymm", bf_ymm},
          {"bf16-ochk", bf_ochk}, {"bf16-acc", bf_acc}};
      for (size_t k = 0; k < sizeof alt / sizeof alt[0]; k++) {
        memset(got, 0, bytes);
        alt[k].f(got, a, b, n);
        printf("%s %zu %.1f%s\n", alt[k].name, bytes, rate(alt[k].f, o, a, b, n, bytes),
               memcmp(got, ref, (n & ~(size_t)63) * 2) ? " (WRONG BITS)" : "");
      }
      free(ref);
      free(got);
    }
    memset(m, 0, 3 * bytes); /* float32 zeros */
    printf("f32 %zu %.1f\n", bytes, rate(f32_add, o, a, b, bytes / 4, bytes));
    free(m);
  }
  return 0;
}
#else
int main(void) {
  printf("SKIP: the probe needs GCC or Clang on x86-64\n");
  return 0;
}
#endif

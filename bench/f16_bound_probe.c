/* f16_bound_probe.c -- how fast this CPU can add two float16 arrays at
 * all, whatever the NaN rules: the bound behind issue 16's point 5 for
 * float16 (docs/benchmarks.md, "16-bit floats and the reduction kernels").
 *
 * Four loops of out = a + b over float16 arrays, none of them the
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
 *   f32        out = a + b on float32 arrays of the same byte size: the
 *              rate float16 is compared with.
 *
 * GB/s of one input's bytes (as tcreduce_bench), median of 5 timings of
 * >= 20 ms each, one thread, hot buffers.
 *
 * Output, one line per loop and size: "loop BYTES GB/s".
 * Usage: tcf16_probe [BYTES ...]   (default 16384 65536 1048576)
 * Prints "SKIP: ..." and exits 0 where the CPU lacks AVX-512 (F/BW/DQ/VL)
 * or the compiler is not GCC/Clang on x86-64. */
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

static Z void f32_add(void *ov, const void *av, const void *bv, size_t n) {
  float *o = ov;
  const float *a = av, *b = bv;
  for (size_t i = 0; i + 16 <= n; i += 16)
    _mm512_storeu_ps(o + i, _mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
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

int main(int argc, char **argv) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512dq") || !__builtin_cpu_supports("avx512vl") ||
      !__builtin_cpu_supports("f16c")) {
    printf("SKIP: this CPU lacks AVX-512 F/BW/DQ/VL or F16C\n");
    return 0;
  }
  static const size_t dflt[] = {16384, 65536, 1048576};
  int nsz = argc > 1 ? argc - 1 : 3;
  printf("# loop BYTES GB/s (of one input; one thread, hot; median of 5 x 20 ms)\n");
  for (int s = 0; s < nsz; s++) {
    size_t bytes = argc > 1 ? strtoull(argv[s + 1], NULL, 0) : dflt[s];
    bytes = bytes / 64 * 64;
    if (bytes == 0) {
      fprintf(stderr, "tcf16_probe: BYTES must be at least 64\n");
      return 2;
    }
    char *m = aligned_alloc(64, 3 * bytes);
    if (!m) return 1;
    uint16_t *a = (uint16_t *)m, *b = (uint16_t *)(m + bytes), *o = (uint16_t *)(m + 2 * bytes);
    size_t n = bytes / 2;
    for (size_t i = 0; i < n; i++) { /* finite values: 1.0 .. about 2.0 */
      a[i] = (uint16_t)(0x3C00 + (i * 7) % 1000);
      b[i] = (uint16_t)(0x3800 + (i * 13) % 1000);
    }
    /* the integer widening gives the same sums on this data */
    uint16_t *want = malloc(bytes);
    if (!want) return 1;
    zmm_bare(want, a, b, n);
    zmm_int(o, a, b, n);
    if (memcmp(want, o, bytes)) printf("# zmm-int differs from zmm-bare at %zu bytes\n", bytes);
    free(want);
    printf("zmm-bare %zu %.1f\n", bytes, rate(zmm_bare, o, a, b, n, bytes));
    printf("ymm-bare %zu %.1f\n", bytes, rate(ymm_bare, o, a, b, n, bytes));
    printf("zmm-int %zu %.1f\n", bytes, rate(zmm_int, o, a, b, n, bytes));
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

/* reduce_bench.c -- single-core throughput of the reduction kernels
 * (src/reduce/reduce.c) next to memcpy, in GB/s.
 *
 * GB/s is bytes of ONE input per second: n elements of the dtype, n * size
 * bytes, whatever the kernel reads and writes besides (reduce: dst op= src
 * reads 2 and writes 1 such arrays; reduce3: out = a op b likewise; memcpy
 * reads 1 and writes 1). So a float32 and a bfloat16 kernel at the same
 * byte size move the same bytes, and "bf16 / f32" is the ratio a collective
 * sees at the same byte size.
 *
 * Hot (default): the same buffers every call, so 8 KiB and 64 KiB sit in
 * L1/L2, 1 MiB in L2/L3. Cold (--cold): each call takes the next buffers of
 * a 3 x 96 MiB pool (more than the last-level cache), so the data comes
 * from memory.
 *
 * Usage: tcreduce_bench [--cold] [--all] [--csv] [--ms N] [--reps N]
 *                       [--sizes 8K,64K,1M,16M] [--match SUBSTRING] [--simd 0|1|2|3]
 *                       [--f16-width 256|512] [--prefetch16 0|1]
 *   default: memcpy and SUM reduce/reduce3 for float32, bfloat16, float16;
 *   --all: also PRODUCT, MIN, MAX, scale (PREMUL_SUM) and divide (AVG);
 *   --match: only the kernels whose name contains SUBSTRING;
 *   --simd: the highest tier of 16-bit kernels (0 generic, 1 AVX2, 2
 *   AVX-512, 3 the default, AVX512-FP16 for float16, each where the CPU
 *   has it), to compare them; --f16-width: the AVX-512 float16 kernels on
 *   256- or 512-bit vectors, --prefetch16: the AVX2 and AVX-512 16-bit kernels with
 *   (1) or without (0) software prefetches (default: the CPU's choice of
 *   each, src/reduce/reduce.c).
 * Each figure is the median of --reps (5) timings of >= --ms (20) ms of the
 * thread's CPU time each.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/internal.h"

/* The thread's CPU time: on a shared machine, the time other processes hold
 * the core is not counted (their cache pollution still is). */
static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

enum kind { K_MEMCPY, K_REDUCE, K_REDUCE3, K_SCALE, K_DIVIDE };

typedef struct {
  const char *name;
  enum kind kind;
  tc_dtype_t dtype;
  tc_redop_type_t op;
} bench_t;

static size_t g_pool = 96u << 20; /* bytes per operand pool when cold */
static char *g_a, *g_b, *g_o;

/* Random but well-behaved values (no NaN/Inf/denormals: those are the
 * tests' business): SUM/MIN/MAX in [-1, 1]; PRODUCT sources are 1.0 so
 * that dst op= src neither overflows nor underflows over the iterations. */
static void fill(char *p, size_t bytes, tc_dtype_t dt, int ones) {
  uint64_t s = 0x9E3779B97F4A7C15ull ^ (uint64_t)(uintptr_t)p;
  for (size_t i = 0; i < bytes / tc_dtype_size(dt); i++) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    float f = ones ? 1.0f : (float)((double)(s >> 11) / 9007199254740992.0 * 2 - 1);
    if (dt == TC_FLOAT32) memcpy(p + 4 * i, &f, 4);
    else {
      uint16_t h = dt == TC_BFLOAT16 ? tc__float_to_bf16(f) : tc__float_to_half(f);
      memcpy(p + 2 * i, &h, 2);
    }
  }
}

static void run_once(const bench_t *b, size_t bytes, size_t off) {
  const size_t n = bytes / (b->kind == K_MEMCPY ? 1 : tc_dtype_size(b->dtype));
  char *a = g_a + off, *s = g_b + off, *o = g_o + off;
  switch (b->kind) {
  case K_MEMCPY: memcpy(o, a, n); break;
  case K_REDUCE: tc__reduce(a, s, n, b->dtype, b->op); break;
  case K_REDUCE3: tc__reduce3(o, a, s, n, b->dtype, b->op); break;
  case K_SCALE: tc__scale(o, a, n, b->dtype, 1.0); break;
  case K_DIVIDE: tc__divide(o, n, b->dtype, 1); break;
  }
  __asm__ volatile("" ::"r"(o), "r"(a) : "memory");
}

static int cmp_d(const void *x, const void *y) {
  const double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

/* Median GB/s (bytes of one input) of `reps` timings of >= ms each. */
static double measure(const bench_t *b, size_t bytes, int cold, int reps, double ms) {
  const size_t slots = cold ? g_pool / bytes : 1;
  size_t k = 0;
  double r[64];
  for (int w = 0; w < 3; w++) run_once(b, bytes, 0); /* warm */
  for (int rep = 0; rep < reps; rep++) {
    long it = 0;
    const double t0 = now_s();
    double t;
    do {
      for (int j = 0; j < 16; j++, it++) {
        run_once(b, bytes, (k % slots) * bytes);
        k++;
      }
      t = now_s() - t0;
    } while (t < ms * 1e-3);
    r[rep] = (double)bytes * (double)it / t / 1e9;
  }
  qsort(r, (size_t)reps, sizeof r[0], cmp_d);
  return r[reps / 2];
}

static size_t parse_size(const char *s) {
  char *e;
  size_t v = strtoull(s, &e, 10);
  if (*e == 'K' || *e == 'k') v <<= 10;
  else if (*e == 'M' || *e == 'm') v <<= 20;
  return v;
}

int main(int argc, char **argv) {
  int cold = 0, all = 0, csv = 0, reps = 5;
  const char *match = NULL;
  double ms = 20;
  size_t sizes[16] = {8u << 10, 64u << 10, 1u << 20, 16u << 20};
  int nsizes = 4;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--cold")) cold = 1;
    else if (!strcmp(argv[i], "--all")) all = 1;
    else if (!strcmp(argv[i], "--csv")) csv = 1;
    else if (!strcmp(argv[i], "--ms") && i + 1 < argc) ms = atof(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--match") && i + 1 < argc) match = argv[++i];
    else if (!strcmp(argv[i], "--simd") && i + 1 < argc) tc__reduce_set_simd(atoi(argv[++i]));
    else if (!strcmp(argv[i], "--f16-width") && i + 1 < argc) tc__reduce_set_f16_width(atoi(argv[++i]));
    else if (!strcmp(argv[i], "--prefetch16") && i + 1 < argc) tc__reduce_set_prefetch16(atoi(argv[++i]));
    else if (!strcmp(argv[i], "--sizes") && i + 1 < argc) {
      nsizes = 0;
      for (char *t = strtok(argv[++i], ","); t && nsizes < 16; t = strtok(NULL, ","))
        sizes[nsizes++] = parse_size(t);
    } else {
      fprintf(stderr,
              "usage: %s [--cold] [--all] [--csv] [--ms N] [--reps N] [--sizes 8K,64K,1M,16M] [--match SUBSTRING] [--simd 0|1|2|3] [--f16-width 256|512] [--prefetch16 0|1]\n",
              argv[0]);
      return 2;
    }
  }
  if (reps < 1) reps = 1;
  if (reps > 64) reps = 64;
  size_t maxb = 0;
  for (int i = 0; i < nsizes; i++) {
    if (sizes[i] == 0 || sizes[i] % 4) {
      fprintf(stderr, "tcreduce_bench: sizes must be positive multiples of 4 bytes\n");
      return 2;
    }
    if (sizes[i] > maxb) maxb = sizes[i];
  }
  if (!cold) g_pool = maxb;
  else if (g_pool < 2 * maxb) g_pool = 2 * maxb;
  g_a = aligned_alloc(64, g_pool), g_b = aligned_alloc(64, g_pool), g_o = aligned_alloc(64, g_pool);
  if (!g_a || !g_b || !g_o) {
    fprintf(stderr, "tcreduce_bench: out of memory (3 x %zu bytes)\n", g_pool);
    return 1;
  }
  memset(g_o, 0, g_pool);

  static const struct { const char *n; tc_dtype_t d; } dts[] = {
      {"f32", TC_FLOAT32}, {"bf16", TC_BFLOAT16}, {"f16", TC_FLOAT16}};
  static const struct { const char *n; tc_redop_type_t o; } ops[] = {
      {"sum", TC_SUM}, {"prod", TC_PRODUCT}, {"min", TC_MIN}, {"max", TC_MAX}};
  bench_t list[64];
  char names[64][32];
  int nb = 0;
  list[nb++] = (bench_t){"memcpy", K_MEMCPY, TC_UINT8, TC_SUM};
  for (int o = 0; o < (all ? 4 : 1); o++)
    for (int k = 0; k < 2; k++)
      for (int d = 0; d < 3; d++) {
        snprintf(names[nb], sizeof names[nb], "%s_%s_%s", dts[d].n, ops[o].n,
                 k ? "reduce3" : "reduce");
        list[nb] = (bench_t){names[nb], k ? K_REDUCE3 : K_REDUCE, dts[d].d, ops[o].o};
        nb++;
      }
  if (all)
    for (int k = 0; k < 2; k++)
      for (int d = 0; d < 3; d++) {
        snprintf(names[nb], sizeof names[nb], "%s_%s", dts[d].n, k ? "divide" : "scale");
        list[nb] = (bench_t){names[nb], k ? K_DIVIDE : K_SCALE, dts[d].d, TC_SUM};
        nb++;
      }

  if (csv) {
    printf("kernel");
    for (int i = 0; i < nsizes; i++) printf(",%zu", sizes[i]);
    printf("\n");
  } else {
    printf("# reduction kernels, one core, GB/s of one input's bytes (%s; median of %d x %g ms CPU time)\n",
           cold ? "cold: from memory" : "hot: same buffers", reps, ms);
    printf("%-20s", "kernel");
    for (int i = 0; i < nsizes; i++) {
      char s[32];
      if (sizes[i] % (1u << 20) == 0) snprintf(s, sizeof s, "%zuM", sizes[i] >> 20);
      else if (sizes[i] % 1024 == 0) snprintf(s, sizeof s, "%zuK", sizes[i] >> 10);
      else snprintf(s, sizeof s, "%zu", sizes[i]);
      printf(" %9s", s);
    }
    printf("\n");
  }
  for (int b = 0; b < nb; b++) {
    const bench_t *bp = &list[b];
    if (match && !strstr(bp->name, match)) continue;
    const int ones = bp->kind != K_MEMCPY && bp->op == TC_PRODUCT;
    const tc_dtype_t fd = bp->kind == K_MEMCPY ? TC_FLOAT32 : bp->dtype;
    fill(g_a, g_pool, fd, 0);
    fill(g_b, g_pool, fd, ones);
    printf(csv ? "%s" : "%-20s", bp->name);
    for (int i = 0; i < nsizes; i++) {
      printf(csv ? ",%.2f" : " %9.2f", measure(bp, sizes[i], cold, reps, ms));
      fflush(stdout);
    }
    printf("\n");
  }
  return 0;
}

/* tcperf.c -- an nccl-tests-style benchmark of libtorchcomms collectives.
 *
 * usage: tcrun -n N tcperf -c COLL [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS]
 *                          [-w WARMUP] [-d DTYPE[,DTYPE...]] [-R ROUNDS]
 *                          [-o OP] [-r ROOT] [-z] [-m avg|median]
 *                          [-t TIMEOUT_S] [-B BACKEND] [--csv FILE] [--hooks]
 *
 *   -c  all_reduce | all_gather | reduce_scatter | broadcast | reduce |
 *       all_to_all | send_recv | put | get                      (required)
 *   -b, -e  smallest / largest size in bytes (suffixes K, M, G: 1024-based;
 *       default 8 and 64M); -f  multiply the size by FACTOR (default 4).
 *       Sizes are those of the whole array, as in nccl-tests: for
 *       all_gather, reduce_scatter and all_to_all the per-rank count is
 *       size / (element size * N); the size column shows the bytes moved
 *       after rounding down to whole elements (at least one per rank).
 *   -n  timed iterations (default 20; 0: by size, as the anchor benchmarks
 *       in bench/ do: 1000 below 64 KiB, 100 below 4 MiB, 10 from 4 MiB);
 *   -w  warm-up iterations (default 5)
 *   -d  float32 (default) float64 float16 bfloat16 float8_e4m3fn
 *       float8_e5m2 int8 uint8 int16 int32 int64 bool; several, comma
 *       separated (-d float32,bfloat16,float16), are measured side by side
 *       in this one launch: at each size, ROUNDS rounds (-R, default 3)
 *       each time every dtype in turn (the order rotated from round to
 *       round), and each row reports its dtype's median over the rounds.
 *       What the dtypes are compared on then does not move between them
 *       (on a VM the placement of the virtual CPUs changes from launch to
 *       launch and can change a time 2-3x);
 *   -o  sum (default) prod min max avg band bor bxor
 *       premul_sum (factor 0.5);  -r  root of broadcast / reduce (default 0)
 *   -z  check the results: after the timed loop, inputs are refilled with a
 *       per-rank pattern, the operation runs once more and every output
 *       element is compared exactly with a locally computed reference; the
 *       #wrong column sums the wrong elements over all ranks (N/A without -z)
 *   -m  avg (default, nccl-tests): barrier, ITERS back-to-back iterations
 *       timed as a whole, divided by ITERS; median: each iteration timed on
 *       its own, the median taken. Either way the reported time is the
 *       maximum over ranks.
 *   -t  operation timeout in seconds;  -B  backend name (default cpu; the
 *       buffers are host memory);  --csv FILE  rank 0 also writes the rows
 *       as CSV;  --hooks  registers a no-op pre and post hook on the
 *       communicator (what a hook costs an operation).
 *
 * Output (rank 0 only): '#' header lines naming the collective, the ranks,
 * the dtype and the op, then one row per size with the columns
 *   size count type redop root time(us) algbw(GB/s) busbw(GB/s) #wrong
 * algbw = size / time (GB/s = 1e9 B/s); busbw = algbw x 2(n-1)/n for
 * all_reduce, x (n-1)/n for all_gather, reduce_scatter, all_to_all, x 1 for
 * broadcast, reduce and send_recv (rank r sends to r+1 and receives from r-1
 * in one tc_batch). redop is "none" and root -1 where they do not apply.
 *
 * put and get (one-sided windows; 2 ranks or more): every rank creates a
 * library-allocated window (buf NULL) of the largest size; rank 0 is the
 * origin, rank 1 the target, the others only take part in the barriers and
 * the timing all_reduce. One put iteration is tc_window_put(size bytes to
 * rank 1 at offset 0) + tc_window_flush(win, 1) (the completion MPI_Put +
 * MPI_Win_flush gives); one get iteration is tc_window_get (complete on
 * return). algbw = busbw = size / time; the time is rank 0's (the maximum
 * over ranks, where the others time an empty loop). -z: put checks rank
 * 1's window against rank 0's pattern after a put, a flush and a barrier;
 * get checks what rank 0 read of rank 1's window, which rank 1 filled by
 * local stores before a barrier.
 *
 * Exit status: 0; 1 on a failed operation or when -z found wrong elements;
 * 2 on bad usage. Only the public API (torchcomms.h) is used.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "torchcomms.h"

typedef enum {
  C_ALL_REDUCE, C_ALL_GATHER, C_REDUCE_SCATTER, C_BROADCAST, C_REDUCE,
  C_ALL_TO_ALL, C_SEND_RECV, C_PUT, C_GET, C_COUNT
} coll_t;

static const char *const coll_names[C_COUNT] = {
    "all_reduce", "all_gather", "reduce_scatter", "broadcast",
    "reduce",     "all_to_all", "send_recv", "put", "get"};

static const struct { const char *name; tc_redop_type_t op; } op_names[] = {
    {"sum", TC_SUM},   {"prod", TC_PRODUCT}, {"min", TC_MIN},
    {"max", TC_MAX},   {"avg", TC_AVG},      {"band", TC_BAND},
    {"bor", TC_BOR},   {"bxor", TC_BXOR},    {"premul_sum", TC_PREMUL_SUM},
    {"product", TC_PRODUCT}};

#define PREMUL_FACTOR 0.5 /* exact in every float type */

typedef struct {
  coll_t coll;
  size_t minb, maxb, factor;
  int iters, warmup, check, root, median;
  tc_dtype_t dtype;  /* the one being measured (dtypes[i]) */
  tc_dtype_t dtypes[TC_DTYPE_COUNT];
  int ndtypes, rounds;
  tc_redop_type_t op;
  double timeout_s;
  const char *backend, *csv;
  int hooks;
} args_t;

/* The running benchmark: communicator, buffers and per-size layout. */
typedef struct {
  const args_t *a;
  tc_comm_t *comm;
  int rank, n;
  size_t es;          /* element size */
  size_t count;       /* the API's count argument */
  size_t in_elems;    /* elements of `in` used */
  size_t out_elems;   /* elements of `out` used (0: in place) */
  char *in, *out;
  tc_batch_t *batch;  /* send_recv */
  tc_window_t *win;   /* put, get */
  size_t bytes;       /* put, get: the bytes of one operation */
} bench_t;

static const char *prog = "tcperf";

static void usage(FILE *f) {
  fprintf(f,
          "usage: tcrun -n N %s -c COLL [-b MIN] [-e MAX] [-f FACTOR] "
          "[-n ITERS] [-w WARMUP]\n"
          "          [-d DTYPE[,DTYPE...]] [-R ROUNDS] [-o OP] [-r ROOT] [-z] [-m avg|median] "
          "[-t TIMEOUT_S] [-B BACKEND] [--csv FILE] [--hooks]\n"
          "  COLL: all_reduce all_gather reduce_scatter broadcast reduce "
          "all_to_all send_recv put get\n"
          "  DTYPE: float32 float64 float16 bfloat16 float8_e4m3fn float8_e5m2 "
          "int8 uint8\n         int16 int32 int64 bool\n"
          "  OP: sum prod min max avg band bor bxor premul_sum\n"
          "  sizes in bytes with optional K, M, G suffix (defaults -b 8 -e "
          "64M -f 4 -n 20 -w 5)\n",
          prog);
}

static void die_usage(const char *fmt, const char *arg) {
  fprintf(stderr, "%s: ", prog);
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n");
  usage(stderr);
  exit(2);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* "64M" -> 67108864; 0 on a malformed size. */
static size_t parse_size(const char *s) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || *s == '-') return 0;
  unsigned long long mul = 1;
  switch (*end) {
  case 'k': case 'K': mul = 1ull << 10; end++; break;
  case 'm': case 'M': mul = 1ull << 20; end++; break;
  case 'g': case 'G': mul = 1ull << 30; end++; break;
  default: break;
  }
  if (*end == 'B' || *end == 'b') end++;
  if (*end || v > SIZE_MAX / mul) return 0;
  return (size_t)(v * mul);
}

static int parse_int(const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

static int parse_dtype(const char *s, tc_dtype_t *out) {
  static const struct { const char *alias, *name; } aliases[] = {
      {"float", "float32"}, {"double", "float64"}, {"half", "float16"},
      {"bf16", "bfloat16"}, {"int", "int32"},      {"long", "int64"}};
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
    if (!strcmp(s, aliases[i].alias)) s = aliases[i].name;
  for (int d = 0; d < TC_DTYPE_COUNT; d++)
    if (!strcmp(s, tc_dtype_name((tc_dtype_t)d))) {
      *out = (tc_dtype_t)d;
      return 0;
    }
  return -1;
}

static int is_fp8(tc_dtype_t d) {
  return d == TC_FLOAT8_E4M3FN || d == TC_FLOAT8_E5M2;
}

static int is_float(tc_dtype_t d) {
  return d == TC_FLOAT32 || d == TC_FLOAT64 || d == TC_FLOAT16 ||
         d == TC_BFLOAT16 || is_fp8(d);
}

static int is_window(coll_t c) { return c == C_PUT || c == C_GET; }

static int is_reduction(coll_t c) {
  return c == C_ALL_REDUCE || c == C_REDUCE_SCATTER || c == C_REDUCE;
}

static const char *op_name(tc_redop_type_t op) {
  for (size_t i = 0; i < sizeof op_names / sizeof op_names[0]; i++)
    if (op_names[i].op == op) return op_names[i].name;
  return "?";
}

/* --hooks: what an operation pays for a registered hook that does nothing. */
static int noop_hook(tc_hook_kind_t kind, const tc_op_info_t *info, void *user) {
  (void)kind;
  (void)info;
  (void)user;
  return 0;
}

static void parse_args(int argc, char **argv, args_t *a) {
  *a = (args_t){.coll = C_COUNT, .minb = 8, .maxb = 64u << 20, .factor = 4,
                .iters = 20, .warmup = 5, .dtype = TC_FLOAT32, .dtypes = {TC_FLOAT32},
                .ndtypes = 1, .rounds = 3, .op = TC_SUM, .backend = "cpu"};
  static const struct option longopts[] = {{"csv", required_argument, 0, 1},
                                           {"hooks", no_argument, 0, 2},
                                           {"help", no_argument, 0, 'h'},
                                           {0, 0, 0, 0}};
  int opt, have_b = 0, have_e = 0;
  long v;
  opterr = 0;
  while ((opt = getopt_long(argc, argv, ":c:b:e:f:n:w:d:R:o:zr:t:m:B:h",
                            longopts, NULL)) != -1) {
    switch (opt) {
    case 'c':
      for (a->coll = 0; a->coll < C_COUNT; a->coll++)
        if (!strcmp(optarg, coll_names[a->coll])) break;
      if (a->coll == C_COUNT) die_usage("unknown collective '%s'", optarg);
      break;
    case 'b':
    case 'e':
      if (!(*(opt == 'b' ? &a->minb : &a->maxb) = parse_size(optarg)))
        die_usage("bad size '%s' (a positive number of bytes, e.g. 8, 1K, "
                  "64M)", optarg);
      *(opt == 'b' ? &have_b : &have_e) = 1;
      break;
    case 'f':
      if (parse_int(optarg, 2, 1 << 20, &v))
        die_usage("bad factor '%s' (an integer >= 2)", optarg);
      a->factor = (size_t)v;
      break;
    case 'n':
    case 'w':
      if (parse_int(optarg, 0, 1000000000, &v))
        die_usage(opt == 'n' ? "bad iteration count '%s' (>= 0; 0: by size)"
                             : "bad warm-up count '%s' (>= 0)", optarg);
      *(opt == 'n' ? &a->iters : &a->warmup) = (int)v;
      break;
    case 'd': {
      char list[256], *save = NULL;
      snprintf(list, sizeof list, "%s", optarg);
      a->ndtypes = 0;
      for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        tc_dtype_t d;
        if (parse_dtype(t, &d)) die_usage("unknown dtype '%s'", t);
        for (int i = 0; i < a->ndtypes; i++)
          if (a->dtypes[i] == d) die_usage("dtype '%s' is listed twice", t);
        a->dtypes[a->ndtypes++] = d;
      }
      if (!a->ndtypes) die_usage("bad dtype list '%s'", optarg);
      a->dtype = a->dtypes[0];
      break;
    }
    case 'R':
      if (parse_int(optarg, 1, 1000, &v)) die_usage("bad round count '%s' (1 to 1000)", optarg);
      a->rounds = (int)v;
      break;
    case 'o': {
      size_t i, k = sizeof op_names / sizeof op_names[0];
      for (i = 0; i < k && strcmp(optarg, op_names[i].name); i++) {
      }
      if (i == k) die_usage("unknown reduction op '%s'", optarg);
      a->op = op_names[i].op;
      break;
    }
    case 'z': a->check = 1; break;
    case 'r':
      if (parse_int(optarg, 0, 1 << 30, &v)) die_usage("bad root '%s'", optarg);
      a->root = (int)v;
      break;
    case 't': {
      char *end;
      a->timeout_s = strtod(optarg, &end);
      if (end == optarg || *end || !(a->timeout_s > 0))
        die_usage("bad timeout '%s' (seconds > 0)", optarg);
      break;
    }
    case 'm':
      if (!strcmp(optarg, "median")) a->median = 1;
      else if (!strcmp(optarg, "avg")) a->median = 0;
      else die_usage("bad timing mode '%s' (avg or median)", optarg);
      break;
    case 'B': a->backend = optarg; break;
    case 1: a->csv = optarg; break;
    case 2: a->hooks = 1; break;
    case 'h': usage(stdout); exit(0);
    case ':': die_usage("option '%s' needs a value", argv[optind - 1]); break;
    default: die_usage("unknown option '%s'", argv[optind - 1]); break;
    }
  }
  if (optind < argc) die_usage("unexpected argument '%s'", argv[optind]);
  if (a->coll == C_COUNT) die_usage("%s", "-c COLLECTIVE is required");
  if (have_b && !have_e) a->maxb = a->minb;
  if (!have_b && have_e && a->maxb < a->minb) a->minb = a->maxb;
  if (a->maxb < a->minb) die_usage("%s", "-e MAX is smaller than -b MIN");
  if (is_reduction(a->coll)) {
    tc_redop_type_t op = a->op;
    for (int i = 0; i < a->ndtypes; i++) {
      tc_dtype_t d = a->dtypes[i];
      if ((op == TC_BAND || op == TC_BOR || op == TC_BXOR) && is_float(d))
        die_usage("op %s needs an integer or bool dtype", op_name(op));
      if (op == TC_PREMUL_SUM && !is_float(d))
        die_usage("op %s needs a floating-point dtype", op_name(op));
      if (op == TC_AVG && d == TC_BOOL) die_usage("op %s is not defined on bool", op_name(op));
    }
  }
  if (a->ndtypes > 1 && is_window(a->coll))
    die_usage("%s", "put and get take one dtype");
}

/* ---- values: small integers, exact in every dtype ---- */

static uint16_t f2h(float f) { /* round to nearest even; finite or Inf */
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, mant = x & 0x7FFFFFu;
  int e = (int)((x >> 23) & 0xFF) - 127 + 15;
  if (((x >> 23) & 0xFF) == 0xFF) return (uint16_t)(sign | 0x7C00u | (mant ? 0x200u : 0));
  if (e >= 31) return (uint16_t)(sign | 0x7C00u);
  if (e <= 0) { /* subnormal half (or zero) */
    if (e < -10) return (uint16_t)sign;
    mant |= 0x800000u;
    int shift = 14 - e;
    uint32_t h = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((uint32_t)e << 10) | (mant >> 13), rem = mant & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++; /* may carry to Inf */
  return (uint16_t)(sign | h);
}

static uint16_t f2bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* float -> float8_e4m3fn (e4m3) or float8_e5m2, round to nearest even;
 * e4m3fn saturates at 448, e5m2 overflows to Inf (as torch converts). */
static uint8_t f2f8(float f, int e4m3) {
  uint32_t x, a, r;
  memcpy(&x, &f, 4);
  a = x & 0x7FFFFFFFu;
  const int sh = e4m3 ? 20 : 21;                        /* 23 - mantissa bits */
  const float magic = e4m3 ? 16384.0f : 128.0f;         /* ulp: a subnormal */
  if (a > 0x7F800000u) r = 0x7F;
  else if (a >= (e4m3 ? (1087u << 20) : (143u << 23))) r = e4m3 ? 0x7E : 0x7C;
  else if (a < ((e4m3 ? 121u : 113u) << 23)) { /* subnormal: the add rounds */
    float t, m = magic;
    uint32_t tb, mb;
    memcpy(&t, &a, 4);
    t += m;
    memcpy(&tb, &t, 4);
    memcpy(&mb, &m, 4);
    r = tb - mb;
  } else {
    r = (a - ((e4m3 ? 120u : 112u) << 23) + ((1u << (sh - 1)) - 1) + ((a >> sh) & 1u)) >> sh;
    if (e4m3 && r == 0x7F) r = 0x7E;
  }
  return (uint8_t)(((x >> 24) & 0x80u) | r);
}

/* Writes v (an integer value or a float) into element i of buf. Integers
 * wrap like the library's arithmetic. */
static void put(void *buf, size_t i, tc_dtype_t dt, double v) {
  uint64_t u = (uint64_t)(int64_t)v;
  switch (dt) {
  case TC_FLOAT32: ((float *)buf)[i] = (float)v; break;
  case TC_FLOAT64: ((double *)buf)[i] = v; break;
  case TC_FLOAT16: ((uint16_t *)buf)[i] = f2h((float)v); break;
  case TC_BFLOAT16: ((uint16_t *)buf)[i] = f2bf((float)v); break;
  case TC_INT8: ((int8_t *)buf)[i] = (int8_t)u; break;
  case TC_UINT8: ((uint8_t *)buf)[i] = (uint8_t)u; break;
  case TC_INT16: ((int16_t *)buf)[i] = (int16_t)u; break;
  case TC_INT32: ((int32_t *)buf)[i] = (int32_t)u; break;
  case TC_INT64: ((int64_t *)buf)[i] = (int64_t)u; break;
  case TC_BOOL: ((uint8_t *)buf)[i] = v != 0; break;
  case TC_FLOAT8_E4M3FN: ((uint8_t *)buf)[i] = f2f8((float)v, 1); break;
  case TC_FLOAT8_E5M2: ((uint8_t *)buf)[i] = f2f8((float)v, 0); break;
  default: break;
  }
}

/* An integer element read back as int64 (after wrapping into the type). */
static int64_t get_int(const void *buf, size_t i, tc_dtype_t dt) {
  switch (dt) {
  case TC_INT8: return ((const int8_t *)buf)[i];
  case TC_UINT8: case TC_BOOL: return ((const uint8_t *)buf)[i];
  case TC_INT16: return ((const int16_t *)buf)[i];
  case TC_INT32: return ((const int32_t *)buf)[i];
  default: return ((const int64_t *)buf)[i];
  }
}

/* Element i of rank r's input: for copies distinct per rank; for
 * reductions chosen so that results stay exact (sums of 0..3 -- of 0..1 for
 * the float8 types, exact up to 8 ranks --, products of 1 and 2, bit
 * patterns below 64; MIN/MAX commute with rounding). */
static double pattern(const args_t *a, int r, size_t i) {
  size_t ri = (size_t)r;
  int b = a->dtype == TC_BOOL;
  if (!is_reduction(a->coll))
    return b ? (double)((i + ri) & 1) : (double)((i * 13 + ri * 7 + 1) % 61);
  switch (a->op) {
  case TC_PRODUCT:
    return b ? (double)((i + ri) % 5 != 0) : ((i + ri) % 4 == 0 ? 2.0 : 1.0);
  case TC_MIN: case TC_MAX:
    return b ? (double)((i + ri) & 1) : (double)((i * 7 + ri * 3) % 16);
  case TC_BAND: case TC_BOR: case TC_BXOR:
    return b ? (double)((i + ri) & 1) : (double)((i * 5 + ri * 11) % 64);
  default: /* SUM, AVG, PREMUL_SUM */
    if (is_fp8(a->dtype)) return (double)((i * 3 + ri * 5) % 2);
    return b ? (double)((i + ri) % 3 == 0) : (double)((i * 3 + ri * 5) % 4);
  }
}

static void fill(const bench_t *B, void *buf, size_t n_elems, int r) {
  for (size_t i = 0; i < n_elems; i++) put(buf, i, B->a->dtype, pattern(B->a, r, i));
}

/* The reduction over all ranks of pattern(r, i), into element 0 of dst,
 * computed the way the library defines each op and dtype. */
static void reference(const bench_t *B, size_t i, void *dst) {
  const args_t *a = B->a;
  tc_dtype_t dt = a->dtype;
  tc_redop_type_t op = a->op;
  if (dt == TC_BOOL) {
    int acc = pattern(a, 0, i) != 0;
    for (int r = 1; r < B->n; r++) {
      int v = pattern(a, r, i) != 0;
      if (op == TC_SUM || op == TC_MAX || op == TC_BOR) acc |= v;
      else if (op == TC_BXOR) acc ^= v;
      else acc &= v;
    }
    put(dst, 0, dt, acc);
  } else if (is_float(dt)) {
    double acc = pattern(a, 0, i) * (op == TC_PREMUL_SUM ? PREMUL_FACTOR : 1);
    for (int r = 1; r < B->n; r++) {
      double v = pattern(a, r, i);
      if (op == TC_PRODUCT) acc *= v;
      else if (op == TC_MIN) acc = v < acc ? v : acc;
      else if (op == TC_MAX) acc = v > acc ? v : acc;
      else if (op == TC_PREMUL_SUM) acc += v * PREMUL_FACTOR;
      else acc += v;
    }
    if (op == TC_AVG) {
      if (dt == TC_FLOAT64) acc /= B->n;
      else acc = (double)((float)acc / (float)B->n); /* in float32, once */
    }
    put(dst, 0, dt, acc);
  } else {
    uint64_t acc = (uint64_t)(int64_t)pattern(a, 0, i);
    for (int r = 1; r < B->n; r++) {
      int64_t v = (int64_t)pattern(a, r, i);
      uint64_t u = (uint64_t)v;
      switch (op) {
      case TC_PRODUCT: acc *= u; break;
      case TC_MIN: acc = v < (int64_t)acc ? u : acc; break;
      case TC_MAX: acc = v > (int64_t)acc ? u : acc; break;
      case TC_BAND: acc &= u; break;
      case TC_BOR: acc |= u; break;
      case TC_BXOR: acc ^= u; break;
      default: acc += u; break;
      }
    }
    put(dst, 0, dt, (double)(int64_t)acc);
    if (op == TC_AVG) { /* the wrapped sum, divided truncating toward zero */
      int64_t s = get_int(dst, 0, dt);
      put(dst, 0, dt, (double)(s / B->n));
    }
  }
}

/* ---- the operations ---- */

static void fail_op(const bench_t *B, const char *what, int rc) {
  fprintf(stderr, "%s: rank %d: %s failed: %s (%s)\n", prog, B->rank, what,
          tc_status_name(rc), tc_last_error());
  exit(1);
}

static tc_redop_t redop(const args_t *a) {
  return a->op == TC_PREMUL_SUM ? TC_OP_PREMUL_SUM(PREMUL_FACTOR) : TC_OP(a->op);
}

/* Sets the per-size layout for `bytes` requested; returns the bytes moved. */
static size_t layout(bench_t *B, size_t bytes) {
  size_t es = B->es, n = (size_t)B->n;
  switch (B->a->coll) {
  case C_ALL_GATHER: case C_REDUCE_SCATTER: case C_ALL_TO_ALL:
    B->count = bytes / (es * n) ? bytes / (es * n) : 1;
    B->in_elems = B->a->coll == C_ALL_GATHER ? B->count : B->count * n;
    B->out_elems = B->a->coll == C_REDUCE_SCATTER ? B->count : B->count * n;
    return B->count * n * es;
  case C_SEND_RECV: case C_PUT: case C_GET:
    B->count = bytes / es ? bytes / es : 1;
    B->in_elems = B->out_elems = B->count;
    B->bytes = B->count * es;
    return B->count * es;
  default: /* in place: all_reduce, broadcast, reduce */
    B->count = bytes / es ? bytes / es : 1;
    B->in_elems = B->count;
    B->out_elems = 0;
    return B->count * es;
  }
}

static int run_once(bench_t *B) {
  const args_t *a = B->a;
  tc_comm_t *c = B->comm;
  tc_dtype_t dt = a->dtype;
  switch (a->coll) {
  case C_ALL_REDUCE: return tc_all_reduce(c, B->in, B->count, dt, redop(a), NULL, NULL);
  case C_BROADCAST: return tc_broadcast(c, B->in, B->count, dt, a->root, NULL, NULL);
  case C_REDUCE: return tc_reduce(c, B->in, B->count, dt, redop(a), a->root, NULL, NULL);
  case C_ALL_GATHER: return tc_all_gather_single(c, B->out, B->in, B->count, dt, NULL, NULL);
  case C_REDUCE_SCATTER:
    return tc_reduce_scatter_single(c, B->out, B->in, B->count, dt, redop(a), NULL, NULL);
  case C_ALL_TO_ALL: return tc_all_to_all_single(c, B->out, B->in, B->count, dt, NULL, NULL);
  case C_PUT: {
    if (B->rank != 0) return TC_OK; /* the target and the others idle */
    int rc = tc_window_put(B->win, B->in, B->bytes, 1, 0, NULL, NULL);
    return rc ? rc : tc_window_flush(B->win, 1, NULL, NULL);
  }
  case C_GET:
    if (B->rank != 0) return TC_OK;
    return tc_window_get(B->win, B->out, B->bytes, 1, 0, NULL, NULL);
  default: return tc_batch_issue(B->batch, NULL, NULL);
  }
}

static void setup_batch(bench_t *B) {
  int rc;
  if (B->batch) tc_batch_free(B->batch);
  B->batch = NULL;
  if ((rc = tc_batch_create(B->comm, &B->batch)) ||
      (rc = tc_batch_send(B->batch, B->in, B->count, B->a->dtype, (B->rank + 1) % B->n)) ||
      (rc = tc_batch_recv(B->batch, B->out, B->count, B->a->dtype, (B->rank + B->n - 1) % B->n)))
    fail_op(B, "tc_batch_*", rc);
}

/* -z for put and get: rank 0 puts its pattern into rank 1's window (put),
 * or reads rank 1's pattern out of it (get); the reader compares. */
static int64_t verify_window(bench_t *B) {
  const args_t *a = B->a;
  size_t es = B->es;
  char *base = tc_window_base(B->win);
  int rc;
  if (a->coll == C_PUT) {
    if (B->rank == 1) memset(base, 0xFF, B->bytes);
    if ((rc = tc_barrier(B->comm, NULL, NULL))) fail_op(B, "tc_barrier", rc);
    fill(B, B->in, B->in_elems, 0);
    if ((rc = run_once(B))) fail_op(B, "the checked put", rc);
  } else {
    if (B->rank == 1) fill(B, base, B->count, 1);
    memset(B->out, 0xFF, B->out_elems * es);
    if ((rc = tc_barrier(B->comm, NULL, NULL))) fail_op(B, "tc_barrier", rc);
    if ((rc = run_once(B))) fail_op(B, "the checked get", rc);
  }
  if ((rc = tc_barrier(B->comm, NULL, NULL))) fail_op(B, "tc_barrier", rc);
  int reader = a->coll == C_PUT ? 1 : 0, writer = a->coll == C_PUT ? 0 : 1;
  if (B->rank != reader) return 0;
  const char *got = a->coll == C_PUT ? base : B->out;
  int64_t wrong = 0;
  unsigned char exp[16];
  for (size_t j = 0; j < B->count; j++) {
    put(exp, 0, a->dtype, pattern(a, writer, j));
    if (memcmp(exp, got + j * es, es)) wrong++;
  }
  return wrong;
}

/* Fresh inputs, one run, exact comparison; returns this rank's wrong count. */
static int64_t verify(bench_t *B) {
  if (is_window(B->a->coll)) return verify_window(B);
  const args_t *a = B->a;
  tc_dtype_t dt = a->dtype;
  size_t es = B->es, n = (size_t)B->n, cnt = B->count;
  fill(B, B->in, B->in_elems, B->rank);
  if (a->coll == C_BROADCAST && B->rank != a->root) memset(B->in, 0xFF, B->in_elems * es);
  if (B->out_elems) memset(B->out, 0xFF, B->out_elems * es);
  int rc = run_once(B);
  if (rc) fail_op(B, "the checked run", rc);
  int64_t wrong = 0;
  unsigned char exp[16];
  const char *got = B->out_elems ? B->out : B->in;
  size_t total = B->out_elems ? B->out_elems : B->in_elems;
  for (size_t j = 0; j < total; j++) {
    switch (a->coll) {
    case C_ALL_REDUCE: reference(B, j, exp); break;
    case C_REDUCE:
      if (B->rank == a->root) reference(B, j, exp);
      else put(exp, 0, dt, pattern(a, B->rank, j));
      break;
    case C_REDUCE_SCATTER: reference(B, (size_t)B->rank * cnt + j, exp); break;
    case C_BROADCAST: put(exp, 0, dt, pattern(a, a->root, j)); break;
    case C_ALL_GATHER: put(exp, 0, dt, pattern(a, (int)(j / cnt), j % cnt)); break;
    case C_ALL_TO_ALL:
      put(exp, 0, dt, pattern(a, (int)(j / cnt), (size_t)B->rank * cnt + j % cnt));
      break;
    default: put(exp, 0, dt, pattern(a, (int)(((size_t)B->rank + n - 1) % n), j)); break;
    }
    if (memcmp(exp, got + j * es, es)) wrong++;
  }
  return wrong;
}

static double max_over_ranks(bench_t *B, double v) {
  int rc = tc_all_reduce(B->comm, &v, 1, TC_FLOAT64, TC_OP(TC_MAX), NULL, NULL);
  if (rc) fail_op(B, "the timing all_reduce", rc);
  return v;
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

/* Timed iterations at `bytes`: -n, or by size when -n 0. */
static int iters_for(const args_t *a, size_t bytes) {
  if (a->iters) return a->iters;
  return bytes < ((size_t)64 << 10) ? 1000 : bytes < ((size_t)4 << 20) ? 100 : 10;
}

/* The median of v[0..n-1] (n >= 1), which it sorts. */
static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Seconds per iteration on this rank. */
static double time_size(bench_t *B, double *samples, size_t bytes) {
  const args_t *a = B->a;
  const int iters = iters_for(a, bytes);
  int rc;
  for (int i = 0; i < a->warmup; i++)
    if ((rc = run_once(B))) fail_op(B, "a warm-up iteration", rc);
  if ((rc = tc_barrier(B->comm, NULL, NULL))) fail_op(B, "tc_barrier", rc);
  if (!a->median) {
    double t0 = now_s();
    for (int i = 0; i < iters; i++)
      if ((rc = run_once(B))) fail_op(B, "a timed iteration", rc);
    return (now_s() - t0) / iters;
  }
  for (int i = 0; i < iters; i++) {
    double t0 = now_s();
    if ((rc = run_once(B))) fail_op(B, "a timed iteration", rc);
    samples[i] = now_s() - t0;
  }
  return median(samples, iters);
}

/* Measures dtype a->dtypes[d] from now on. */
static void use_dtype(bench_t *B, args_t *a, int d) {
  a->dtype = a->dtypes[d];
  B->es = tc_dtype_size(a->dtype);
}

static void *xalloc(size_t bytes) {
  void *p = NULL;
  if (posix_memalign(&p, 64, bytes ? bytes : 64)) {
    fprintf(stderr, "%s: out of memory (%zu bytes)\n", prog, bytes);
    exit(1);
  }
  memset(p, 0, bytes ? bytes : 64); /* touch every page before timing */
  return p;
}

int main(int argc, char **argv) {
  args_t a;
  parse_args(argc, argv, &a);
  bench_t B = {.a = &a, .es = tc_dtype_size(a.dtype)};
  tc_comm_options_t copts = TC_COMM_OPTIONS_INIT;
  copts.name = "tcperf";
  copts.timeout_s = a.timeout_s;
  int rc = tc_comm_create(a.backend, "cpu", &copts, &B.comm);
  if (rc) {
    fprintf(stderr, "%s: tc_comm_create(\"%s\") failed: %s (%s)\n", prog,
            a.backend, tc_status_name(rc), tc_last_error());
    return 1;
  }
  if (a.hooks &&
      (tc_comm_register_hook(B.comm, TC_HOOK_PRE, noop_hook, NULL, NULL) != TC_OK ||
       tc_comm_register_hook(B.comm, TC_HOOK_POST, noop_hook, NULL, NULL) != TC_OK)) {
    fprintf(stderr, "%s: %s\n", prog, tc_last_error());
    return 1;
  }
  B.rank = tc_comm_rank(B.comm);
  B.n = tc_comm_size(B.comm);
  if (is_window(a.coll) && B.n < 2) {
    if (B.rank == 0) fprintf(stderr, "%s: %s needs 2 ranks or more (rank 0 origin, rank 1 target)\n",
                             prog, coll_names[a.coll]);
    tc_comm_finalize(B.comm);
    tc_comm_destroy(B.comm);
    return 2;
  }
  if (a.root >= B.n) {
    if (B.rank == 0) fprintf(stderr, "%s: root %d is not a rank (size %d)\n", prog, a.root, B.n);
    tc_comm_finalize(B.comm);
    tc_comm_destroy(B.comm);
    return 2;
  }
  size_t maxin = 0, maxout = 0, maxbytes = 0; /* bytes */
  for (int d = 0; d < a.ndtypes; d++) {
    use_dtype(&B, &a, d);
    for (size_t b = a.minb; b <= a.maxb; b = b > SIZE_MAX / a.factor ? SIZE_MAX : b * a.factor) {
      size_t moved = layout(&B, b);
      if (moved > maxbytes) maxbytes = moved;
      if (B.in_elems * B.es > maxin) maxin = B.in_elems * B.es;
      if (B.out_elems * B.es > maxout) maxout = B.out_elems * B.es;
      if (b == SIZE_MAX) break;
    }
  }
  use_dtype(&B, &a, 0);
  B.in = xalloc(maxin);
  B.out = xalloc(maxout);
  if (is_window(a.coll)) {
    tc_op_options_t wopts = TC_OP_OPTIONS_INIT;
    wopts.timeout_s = a.timeout_s;
    if ((rc = tc_window_create(B.comm, NULL, maxbytes, &wopts, &B.win)))
      fail_op(&B, "tc_window_create", rc);
    memset(tc_window_base(B.win), 0, maxbytes); /* touch every page before timing */
    if ((rc = tc_barrier(B.comm, NULL, NULL))) fail_op(&B, "tc_barrier", rc);
  }
  double *samples = calloc((size_t)(a.iters ? a.iters : 1000), sizeof *samples);
  FILE *csv = NULL;
  int rooted = a.coll == C_BROADCAST || a.coll == C_REDUCE;
  const char *opname = is_reduction(a.coll) ? op_name(a.op) : "none";
  double n = B.n, bw_factor = a.coll == C_ALL_REDUCE ? 2 * (n - 1) / n
                              : (a.coll == C_ALL_GATHER || a.coll == C_REDUCE_SCATTER ||
                                 a.coll == C_ALL_TO_ALL) ? (n - 1) / n : 1.0;
  if (B.rank == 0) {
    if (a.csv && !(csv = fopen(a.csv, "w")))
      fprintf(stderr, "%s: cannot write %s: %s\n", prog, a.csv, strerror(errno));
    if (csv)
      fprintf(csv, "collective,ranks,size,count,type,redop,root,time_us,"
                   "algbw_GBps,busbw_GBps,wrong\n");
    char dts[256] = "";
    for (int d = 0; d < a.ndtypes; d++)
      snprintf(dts + strlen(dts), sizeof dts - strlen(dts), "%s%s", d ? "," : "",
               tc_dtype_name(a.dtypes[d]));
    printf("# tcperf: collective %s, ranks %d, dtype %s, op %s, backend %s "
           "(%s)\n", coll_names[a.coll], B.n, dts, opname,
           a.backend, tc_comm_backend_version(B.comm));
    if (a.ndtypes > 1)
      printf("# dtypes side by side: %d rounds per size, every dtype in each (order rotated), "
             "each row its dtype's median over the rounds\n", a.rounds);
    char itbuf[24];
    if (a.iters) snprintf(itbuf, sizeof itbuf, "%d", a.iters);
    else snprintf(itbuf, sizeof itbuf, "by size");
    printf("# iters %s, warmup %d, timing %s (max over ranks), check %s, "
           "libtorchcomms %s\n", itbuf, a.warmup,
           a.median ? "median per iteration" : "average of back-to-back loop",
           a.check ? "on" : "off", tc_version());
    printf("#\n# %10s %12s %9s %6s %5s %12s %12s %12s %7s\n", "size", "count",
           "type", "redop", "root", "time(us)", "algbw(GB/s)", "busbw(GB/s)",
           "#wrong");
    fflush(stdout);
  }
  double bus_sum = 0;
  int rows = 0;
  int64_t wrong_total = 0;
  const int nd = a.ndtypes, rounds = nd > 1 ? a.rounds : 1;
  double *dt_t = xalloc((size_t)nd * (size_t)rounds * sizeof *dt_t); /* [dtype][round] */
  for (size_t b = a.minb; b <= a.maxb; b = b > SIZE_MAX / a.factor ? SIZE_MAX : b * a.factor) {
    for (int r = 0; r < rounds; r++)
      for (int k = 0; k < nd; k++) {
        int d = (k + r) % nd;
        use_dtype(&B, &a, d);
        layout(&B, b);
        if (a.coll == C_SEND_RECV) setup_batch(&B);
        fill(&B, B.in, B.in_elems, B.rank);
        dt_t[d * rounds + r] = max_over_ranks(&B, time_size(&B, samples, b));
      }
    for (int d = 0; d < nd; d++) {
      use_dtype(&B, &a, d);
      size_t bytes = layout(&B, b);
      if (a.check && a.coll == C_SEND_RECV) setup_batch(&B); /* verify's batch */
      double t = median(dt_t + d * rounds, rounds);
      int64_t wrong = 0;
      if (a.check) {
        wrong = verify(&B);
        if ((rc = tc_all_reduce(B.comm, &wrong, 1, TC_INT64, TC_OP(TC_SUM), NULL, NULL)))
          fail_op(&B, "the check all_reduce", rc);
        wrong_total += wrong;
      }
      double algbw = (double)bytes / t / 1e9, busbw = algbw * bw_factor;
      bus_sum += busbw;
      rows++;
      if (B.rank == 0) {
        char wbuf[32];
        if (a.check) snprintf(wbuf, sizeof wbuf, "%" PRId64, wrong);
        else snprintf(wbuf, sizeof wbuf, "N/A");
        printf("  %10zu %12zu %9s %6s %5d %12.2f %12.3f %12.3f %7s\n", bytes,
               B.count, tc_dtype_name(a.dtype), opname, rooted ? a.root : -1,
               t * 1e6, algbw, busbw, wbuf);
        fflush(stdout);
        if (csv)
          fprintf(csv, "%s,%d,%zu,%zu,%s,%s,%d,%.3f,%.4f,%.4f,%s\n",
                  coll_names[a.coll], B.n, bytes, B.count, tc_dtype_name(a.dtype),
                  opname, rooted ? a.root : -1, t * 1e6, algbw, busbw, wbuf);
      }
    }
    if (b == SIZE_MAX) break;
  }
  free(dt_t);
  if (B.rank == 0) {
    printf("# Avg bus bandwidth: %.3f GB/s\n", rows ? bus_sum / rows : 0.0);
    if (a.check) printf("# Wrong elements: %" PRId64 " %s\n", wrong_total, wrong_total ? "FAILED" : "OK");
    fflush(stdout);
  }
  if (csv) fclose(csv);
  if (B.batch) tc_batch_free(B.batch);
  if (B.win && (rc = tc_window_free(B.win))) fail_op(&B, "tc_window_free", rc);
  rc = tc_comm_finalize(B.comm);
  tc_comm_destroy(B.comm);
  free(B.in);
  free(B.out);
  free(samples);
  if (rc) {
    fprintf(stderr, "%s: rank %d: tc_comm_finalize failed: %s\n", prog, B.rank, tc_last_error());
    return 1;
  }
  return wrong_total ? 1 : 0;
}

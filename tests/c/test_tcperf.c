/* test_tcperf.c -- tests of the benchmark tools/tcperf.c, run as a real
 * program under tcrun through popen():
 *
 *   tcrun -n 2 tcperf -c <each collective> -b 8 -e 64K -f 8 -n 5 -w 1 -z
 *
 * must print a '#' header naming the collective, the ranks, the dtype and
 * the op, the column line, then one row per size (8, 64, 512, 4K, 32K) of 9
 * columns with #wrong 0. Also: other dtypes / ops / rank counts with -z,
 * --csv, -m median, and bad arguments exiting 2 with a usage message. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "runner.h"

#include <sys/wait.h>
#include <unistd.h>

#define TCPERF_BIN TC_BUILD_DIR "/tcperf"
#define TCPERF_TCRUN TC_BUILD_DIR "/tcrun"

/* Runs `cmd` (with stderr merged into stdout) and returns its output
 * (malloc()ed); *code gets the exit code (1000 + signal when killed). */
static char *tcperf_popen(const char *cmd, int *code) {
  char full[2048];
  snprintf(full, sizeof full, "%s 2>&1", cmd);
  fflush(stdout);
  fflush(stderr);
  FILE *p = popen(full, "r");
  TC_ASSERT(p != NULL);
  size_t len = 0, cap = 4096;
  char *out = malloc(cap);
  TC_ASSERT(out != NULL);
  size_t n;
  while ((n = fread(out + len, 1, cap - len - 1, p)) > 0) {
    len += n;
    if (cap - len < 1024) {
      cap *= 2;
      out = realloc(out, cap);
      TC_ASSERT(out != NULL);
    }
  }
  out[len] = '\0';
  int st = pclose(p);
  TC_ASSERT(st != -1);
  *code = WIFEXITED(st) ? WEXITSTATUS(st) : 1000 + WTERMSIG(st);
  return out;
}

/* Runs tcperf under tcrun with n ranks and `args`; returns the output. */
static char *tcperf_run(int n, const char *args, int *code) {
  char cmd[1536];
  snprintf(cmd, sizeof cmd, "%s -n %d --timeout 90 %s %s", TCPERF_TCRUN, n,
           TCPERF_BIN, args);
  return tcperf_popen(cmd, code);
}

/* Splits line into whitespace-separated tokens (modifies it). */
static int tcperf_split(char *line, char **tok, int max) {
  int k = 0;
  char *save = NULL;
  for (char *t = strtok_r(line, " \t", &save); t && k < max;
       t = strtok_r(NULL, " \t", &save))
    tok[k++] = t;
  return k;
}

/* Checks tcperf's output: the header names coll, nranks, dtype and op; the
 * column line; then exactly nsizes rows whose size column is sizes[i], with
 * 9 columns, the dtype, a positive time and #wrong 0. */
static void tcperf_check(const char *out, const char *coll, int nranks,
                         const char *dtype, const char *op,
                         const size_t *sizes, int nsizes) {
  char want[256];
  snprintf(want, sizeof want, "# tcperf: collective %s, ranks %d, dtype %s, op %s,",
           coll, nranks, dtype, op);
  TC_ASSERT_CONTAINS(out, want);
  char *copy = strdup(out), *save = NULL;
  TC_ASSERT(copy != NULL);
  int header = 0, rows = 0;
  for (char *l = strtok_r(copy, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
    char *tok[16];
    if (l[0] == '#') {
      int k = tcperf_split(l + 1, tok, 16);
      if (k == 9 && !strcmp(tok[0], "size") && !strcmp(tok[1], "count") &&
          !strcmp(tok[2], "type") && !strcmp(tok[3], "redop") &&
          !strcmp(tok[4], "root") && !strcmp(tok[5], "time(us)") &&
          !strcmp(tok[6], "algbw(GB/s)") && !strcmp(tok[7], "busbw(GB/s)") &&
          !strcmp(tok[8], "#wrong"))
        header++;
      continue;
    }
    if (!strncmp(l, "tcrun:", 6)) continue;
    int k = tcperf_split(l, tok, 16);
    if (k != 9)
      tc_test_fail(__FILE__, __LINE__, "row with %d columns in:\n%s", k, out);
    if (rows >= nsizes)
      tc_test_fail(__FILE__, __LINE__, "more than %d rows in:\n%s", nsizes, out);
    TC_ASSERT_EQ(strtoull(tok[0], NULL, 10), sizes[rows]);
    TC_ASSERT(strtoull(tok[1], NULL, 10) > 0);
    TC_ASSERT_STR_EQ(tok[2], dtype);
    TC_ASSERT_STR_EQ(tok[3], op);
    TC_ASSERT(strtod(tok[5], NULL) > 0);
    TC_ASSERT(strtod(tok[6], NULL) >= 0 && strtod(tok[7], NULL) >= 0);
    if (strcmp(tok[8], "0"))
      tc_test_fail(__FILE__, __LINE__, "#wrong is %s in:\n%s", tok[8], out);
    rows++;
  }
  free(copy);
  TC_ASSERT_EQ(header, 1);
  if (rows != nsizes)
    tc_test_fail(__FILE__, __LINE__, "%d rows, expected %d, in:\n%s", rows,
                 nsizes, out);
}

static const size_t tcperf_sizes[] = {8, 64, 512, 4096, 32768};

/* The standard run of the brief for one collective on 2 ranks. */
static void tcperf_standard(const char *coll) {
  char args[256];
  snprintf(args, sizeof args, "-c %s -b 8 -e 64K -f 8 -n 5 -w 1 -z", coll);
  int code;
  char *out = tcperf_run(2, args, &code);
  if (code != 0) tc_test_fail(__FILE__, __LINE__, "exit %d:\n%s", code, out);
  int reduction = !strcmp(coll, "all_reduce") || !strcmp(coll, "reduce") ||
                  !strcmp(coll, "reduce_scatter");
  tcperf_check(out, coll, 2, "float32", reduction ? "sum" : "none",
               tcperf_sizes, 5);
  free(out);
}

TC_TEST(tcperf_all_reduce) { tcperf_standard("all_reduce"); }
TC_TEST(tcperf_all_gather) { tcperf_standard("all_gather"); }
TC_TEST(tcperf_reduce_scatter) { tcperf_standard("reduce_scatter"); }
TC_TEST(tcperf_broadcast) { tcperf_standard("broadcast"); }
TC_TEST(tcperf_reduce) { tcperf_standard("reduce"); }
TC_TEST(tcperf_all_to_all) { tcperf_standard("all_to_all"); }
TC_TEST(tcperf_send_recv) { tcperf_standard("send_recv"); }

/* Other dtypes, ops, roots and rank counts verify too (sizes round down to
 * whole elements per rank: 3 ranks x 2 bytes). */
TC_TEST(tcperf_dtypes_ops_ranks) {
  static const struct {
    int n;
    const char *coll, *dtype, *op, *extra;
    size_t sizes[2];
  } cases[] = {
      {3, "all_reduce", "bfloat16", "avg", "", {64, 4096}},
      {3, "all_reduce", "float16", "premul_sum", "", {64, 4096}},
      {3, "reduce_scatter", "int8", "bxor", "", {63, 4095}},
      {3, "reduce", "int64", "prod", "-r 2", {64, 4096}},
      {3, "all_gather", "bool", "none", "", {63, 4095}},
      {4, "all_reduce", "uint8", "max", "-m median", {64, 4096}},
      {1, "all_to_all", "float64", "none", "", {64, 4096}},
      {3, "send_recv", "int16", "none", "", {64, 4096}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char args[256];
    snprintf(args, sizeof args, "-c %s -d %s %s%s -b 64 -e 4K -f 64 -n 3 -w 1 -z %s",
             cases[i].coll, cases[i].dtype,
             strcmp(cases[i].op, "none") ? "-o " : "",
             strcmp(cases[i].op, "none") ? cases[i].op : "", cases[i].extra);
    int code;
    char *out = tcperf_run(cases[i].n, args, &code);
    if (code != 0) tc_test_fail(__FILE__, __LINE__, "%s: exit %d:\n%s", args, code, out);
    tcperf_check(out, cases[i].coll, cases[i].n, cases[i].dtype, cases[i].op,
                 cases[i].sizes, 2);
    free(out);
  }
}

/* -d with several dtypes: rows per size in the listed order, each checked
 * (-z), the header names the list and the rounds. */
TC_TEST(tcperf_dtypes_side_by_side) {
  int code;
  char *out = tcperf_run(2, "-c all_reduce -d float32,bfloat16,float16 -R 3 -b 1K -e 16K "
                            "-f 16 -n 3 -w 1 -z", &code);
  if (code != 0) tc_test_fail(__FILE__, __LINE__, "exit %d:\n%s", code, out);
  TC_ASSERT_CONTAINS(out, "# tcperf: collective all_reduce, ranks 2, dtype "
                          "float32,bfloat16,float16, op sum,");
  TC_ASSERT_CONTAINS(out, "# dtypes side by side: 3 rounds per size");
  static const char *const want[][3] = {{"1024", "256", "float32"},  {"1024", "512", "bfloat16"},
                                        {"1024", "512", "float16"},  {"16384", "4096", "float32"},
                                        {"16384", "8192", "bfloat16"}, {"16384", "8192", "float16"}};
  char *copy = strdup(out), *save = NULL;
  TC_ASSERT(copy != NULL);
  int rows = 0;
  for (char *l = strtok_r(copy, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
    if (l[0] == '#' || !strncmp(l, "tcrun:", 6)) continue;
    char *tok[16];
    int k = tcperf_split(l, tok, 16);
    if (k != 9 || rows >= 6) tc_test_fail(__FILE__, __LINE__, "unexpected row in:\n%s", out);
    TC_ASSERT_STR_EQ(tok[0], want[rows][0]);
    TC_ASSERT_STR_EQ(tok[1], want[rows][1]);
    TC_ASSERT_STR_EQ(tok[2], want[rows][2]);
    TC_ASSERT(strtod(tok[5], NULL) > 0);
    TC_ASSERT_STR_EQ(tok[8], "0");
    rows++;
  }
  free(copy);
  TC_ASSERT_EQ(rows, 6);
  free(out);
}

TC_TEST(tcperf_csv) {
  char path[] = "/tmp/tcperf_csv_XXXXXX";
  int fd = mkstemp(path);
  TC_ASSERT(fd >= 0);
  close(fd);
  char args[256];
  snprintf(args, sizeof args, "-c all_reduce -b 8 -e 64 -f 8 -n 2 -w 0 -z --csv %s", path);
  int code;
  char *out = tcperf_run(2, args, &code);
  TC_ASSERT_EQ(code, 0);
  free(out);
  FILE *f = fopen(path, "r");
  TC_ASSERT(f != NULL);
  char line[512];
  TC_ASSERT(fgets(line, sizeof line, f) != NULL);
  TC_ASSERT_CONTAINS(line, "collective,ranks,size,count,type,redop,root,time_us,");
  TC_ASSERT(fgets(line, sizeof line, f) != NULL);
  TC_ASSERT_CONTAINS(line, "all_reduce,2,8,2,float32,sum,-1,");
  TC_ASSERT(fgets(line, sizeof line, f) != NULL);
  TC_ASSERT_CONTAINS(line, "all_reduce,2,64,16,float32,sum,-1,");
  TC_ASSERT(fgets(line, sizeof line, f) == NULL);
  fclose(f);
  unlink(path);
}

TC_TEST(tcperf_bad_args_exit_2) {
  static const char *const bad[] = {
      "",                                  /* -c missing */
      "-c bogus",                          /* unknown collective */
      "-c all_reduce -b 1X",               /* bad size */
      "-c all_reduce -b 0",                /* zero size */
      "-c all_reduce -b 1K -e 8",          /* max < min */
      "-c all_reduce -f 1",                /* factor < 2 */
      "-c all_reduce -n -1",               /* negative iterations */
      "-c all_reduce -d float128",         /* unknown dtype */
      "-c all_reduce -d float32,float128", /* unknown dtype in a list */
      "-c all_reduce -d float32,float32",  /* listed twice */
      "-c all_reduce -d float32, -R 0",    /* no rounds */
      "-c all_reduce -d int32,float32 -o band", /* bitwise op on one of them */
      "-c put -d float32,bfloat16",        /* windows take one dtype */
      "-c all_reduce -o nope",             /* unknown op */
      "-c all_reduce -o band",             /* bitwise op on float32 */
      "-c all_reduce -d int32 -o premul_sum",
      "-c all_reduce -d bool -o avg",
      "-c all_reduce -m mean",
      "-c all_reduce -t -1",
      "-c all_reduce --bogus",
      "-c all_reduce -n",                  /* missing value */
      "-c all_reduce stray",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s %s", TCPERF_BIN, bad[i]);
    int code;
    char *out = tcperf_popen(cmd, &code);
    if (code != 2) tc_test_fail(__FILE__, __LINE__, "'%s': exit %d, want 2:\n%s", cmd, code, out);
    TC_ASSERT_CONTAINS(out, "usage: ");
    free(out);
  }
  /* Under tcrun every rank rejects the arguments; a root outside the
   * communicator is found once it exists. */
  int code;
  char *out = tcperf_run(2, "-c all_reduce -o bxor", &code);
  TC_ASSERT_EQ(code, 2);
  TC_ASSERT_CONTAINS(out, "op bxor needs an integer or bool dtype");
  free(out);
  out = tcperf_run(2, "-c broadcast -r 2 -b 8 -e 8", &code);
  TC_ASSERT_EQ(code, 2);
  TC_ASSERT_CONTAINS(out, "root 2 is not a rank");
  free(out);
  out = tcperf_popen(TCPERF_BIN " --help", &code);
  TC_ASSERT_EQ(code, 0);
  TC_ASSERT_CONTAINS(out, "usage: ");
  free(out);
}

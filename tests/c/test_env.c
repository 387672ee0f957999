/* test_env.c -- tc_env_rank_size: every source in order, precedence, and
 * the error cases. Tests run in forked children, so setenv/unsetenv stay
 * local to each test. */
#include <limits.h>
#include <stdlib.h>

#include "core/internal.h"
#include "runner.h"

/* Every variable tc_env_rank_size reads, in its order. */
static const char *const env_vars[][2] = {
    {"TORCHCOMM_RANK", "TORCHCOMM_SIZE"},
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
    {"PMI_RANK", "PMI_SIZE"},
    {"SLURM_PROCID", "SLURM_NTASKS"},
    {"RANK", "WORLD_SIZE"},
};
enum { NPAIRS = sizeof env_vars / sizeof env_vars[0] };

/* Unsets every variable, so that the test starts from a clean slate even
 * under a launcher that set some. */
static void clear_env(void) {
  for (int i = 0; i < NPAIRS; i++) {
    unsetenv(env_vars[i][0]);
    unsetenv(env_vars[i][1]);
  }
}

static void set_pair(int i, const char *rank, const char *size) {
  if (rank) setenv(env_vars[i][0], rank, 1);
  else unsetenv(env_vars[i][0]);
  if (size) setenv(env_vars[i][1], size, 1);
  else unsetenv(env_vars[i][1]);
}

/* tc_env_rank_size must succeed with rank, size and source. */
static void expect_ok(int want_rank, int want_size, const char *want_source) {
  int rank = -7, size = -7;
  const char *source = NULL;
  TC_ASSERT_OK(tc_env_rank_size(&rank, &size, &source));
  TC_ASSERT_EQ(rank, want_rank);
  TC_ASSERT_EQ(size, want_size);
  TC_ASSERT_STR_EQ(source, want_source);
}

/* tc_env_rank_size must fail with TC_ERR_INVALID_ARGUMENT, leave rank and
 * size alone, and name both variables and their values. */
static void expect_err(int pair, const char *rank_text, const char *size_text) {
  int rank = -7, size = -7;
  const char *source = NULL;
  TC_ASSERT_ERR(tc_env_rank_size(&rank, &size, &source),
                TC_ERR_INVALID_ARGUMENT, env_vars[pair][0]);
  TC_ASSERT_CONTAINS(tc_last_error(), env_vars[pair][1]);
  TC_ASSERT_CONTAINS(tc_last_error(), rank_text);
  TC_ASSERT_CONTAINS(tc_last_error(), size_text);
  TC_ASSERT_EQ(rank, -7);
  TC_ASSERT_EQ(size, -7);
}

TC_TEST(env_none) {
  clear_env();
  expect_ok(0, 1, "none");
  /* source may be NULL */
  int rank = -1, size = -1;
  TC_ASSERT_OK(tc_env_rank_size(&rank, &size, NULL));
  TC_ASSERT(rank == 0 && size == 1);
  /* empty values count as unset */
  set_pair(0, "", "");
  expect_ok(0, 1, "none");
}

TC_TEST(env_each_source) {
  static const char *const sources[NPAIRS] = {
      "TORCHCOMM_RANK/TORCHCOMM_SIZE",
      "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE", "PMI_RANK/PMI_SIZE",
      "SLURM_PROCID/SLURM_NTASKS", "RANK/WORLD_SIZE"};
  for (int i = 0; i < NPAIRS; i++) {
    clear_env();
    char r[16], s[16];
    snprintf(r, sizeof r, "%d", i + 1);
    snprintf(s, sizeof s, "%d", 2 * i + 3);
    set_pair(i, r, s);
    expect_ok(i + 1, 2 * i + 3, sources[i]);
  }
}

TC_TEST(env_precedence) {
  /* with every pair set, each earlier pair wins over all later ones */
  clear_env();
  for (int i = 0; i < NPAIRS; i++) {
    char r[16], s[16];
    snprintf(r, sizeof r, "%d", i);
    snprintf(s, sizeof s, "%d", 10 + i);
    set_pair(i, r, s);
  }
  expect_ok(0, 10, "TORCHCOMM_RANK/TORCHCOMM_SIZE");
  set_pair(0, NULL, NULL);
  expect_ok(1, 11, "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE");
  set_pair(1, NULL, NULL);
  expect_ok(2, 12, "PMI_RANK/PMI_SIZE");
  set_pair(2, NULL, NULL);
  expect_ok(3, 13, "SLURM_PROCID/SLURM_NTASKS");
  set_pair(3, NULL, NULL);
  expect_ok(4, 14, "RANK/WORLD_SIZE");
  set_pair(4, NULL, NULL);
  expect_ok(0, 1, "none");
  /* torchrun's pair loses to an explicit TORCHCOMM pair */
  set_pair(4, "3", "4");
  set_pair(0, "1", "2");
  expect_ok(1, 2, "TORCHCOMM_RANK/TORCHCOMM_SIZE");
}

TC_TEST(env_values) {
  clear_env();
  set_pair(4, "0", "1");
  expect_ok(0, 1, "RANK/WORLD_SIZE");
  set_pair(4, "  5", "6 ");
  expect_ok(5, 6, "RANK/WORLD_SIZE");
  set_pair(4, "2147483646", "2147483647");
  expect_ok(INT_MAX - 1, INT_MAX, "RANK/WORLD_SIZE");
}

TC_TEST(env_half_set_pair) {
  for (int i = 0; i < NPAIRS; i++) {
    clear_env();
    set_pair(i, "1", NULL);
    expect_err(i, "\"1\"", "(unset)");
    set_pair(i, NULL, "4");
    expect_err(i, "(unset)", "\"4\"");
  }
  /* a half-set pair is an error even when a later pair is complete */
  clear_env();
  set_pair(4, "0", "2");
  set_pair(1, "3", NULL);
  expect_err(1, "\"3\"", "(unset)");
}

TC_TEST(env_bad_values) {
  static const char *const bad[][2] = {
      {"abc", "4"}, {"1", "four"}, {"1x", "4"}, {"1", "4.0"}, {"-1", "4"},
      {"0", "0"},   {"0", "-2"},   {"1", "99999999999"},      {"", "4"},
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    clear_env();
    set_pair(3, bad[k][0], bad[k][1]);
    if (!*bad[k][0]) { /* empty counts as unset */
      expect_err(3, "(unset)", bad[k][1]);
      continue;
    }
    expect_err(3, bad[k][0], bad[k][1]);
  }
}

TC_TEST(env_rank_out_of_range) {
  clear_env();
  set_pair(2, "4", "4");
  expect_err(2, "\"4\"", "\"4\"");
  set_pair(2, "7", "4");
  expect_err(2, "\"7\"", "\"4\"");
  TC_ASSERT_CONTAINS(tc_last_error(), "below the size");
}

TC_TEST(env_null_arguments) {
  clear_env();
  int v = 0;
  TC_ASSERT_ERR(tc_env_rank_size(NULL, &v, NULL), TC_ERR_INVALID_ARGUMENT,
                "tc_env_rank_size");
  TC_ASSERT_ERR(tc_env_rank_size(&v, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
                "NULL");
}

/* tc__bytes_value: the byte counts of TORCHCOMMS_STORE_* and friends (the
 * table's BYTES settings parse with it). */
static uint64_t bytes_of(const char *text, uint64_t dflt, uint64_t least) {
  return tc__bytes_value("TC_TEST_BYTES", text, dflt, least);
}

TC_TEST(env_byte_counts) {
  TC_ASSERT_EQ(bytes_of(NULL, 77, 0), 77);
  TC_ASSERT_EQ(bytes_of("4096", 77, 0), 4096);
  TC_ASSERT_EQ(bytes_of("4096B", 77, 0), 4096);
  TC_ASSERT_EQ(bytes_of("4k", 77, 0), 4096);
  TC_ASSERT_EQ(bytes_of("16MiB", 77, 0), 16ull << 20);
  TC_ASSERT_EQ(bytes_of("16MB", 77, 0), 16ull << 20);
  TC_ASSERT_EQ(bytes_of("2G", 77, 0), 2ull << 30);
  TC_ASSERT_EQ(bytes_of("1t", 77, 0), 1ull << 40);
  /* malformed: the default (and a warning) */
  TC_ASSERT_EQ(bytes_of("12x", 77, 0), 77);
  TC_ASSERT_EQ(bytes_of("-5", 77, 0), 77);
  TC_ASSERT_EQ(bytes_of("M", 77, 0), 77);
  TC_ASSERT_EQ(bytes_of("99999999999T", 77, 0), 77); /* overflows */
  /* below the least useful value: raised to it */
  TC_ASSERT_EQ(bytes_of("100", 77, 1024), 1024);
}

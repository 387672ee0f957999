/* env.c -- rank and world size from the launcher's environment (util: the
 * logger tags its lines with the rank before any communicator exists). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

/* The (rank, size) variable pairs, in the order they are tried; `source`
 * is what tc_env_rank_size reports for the pair. */
#define TC__ENV_PAIRS(X)                                                       \
  X("TORCHCOMM_RANK", "TORCHCOMM_SIZE")                                        \
  X("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")                            \
  X("PMI_RANK", "PMI_SIZE")                                                    \
  X("SLURM_PROCID", "SLURM_NTASKS")                                            \
  X("RANK", "WORLD_SIZE")

typedef struct tc__env_pair {
  const char *rank_var;
  const char *size_var;
  const char *source; /* "RANK_VAR/SIZE_VAR" */
} tc__env_pair_t;

static const tc__env_pair_t env_pairs[] = {
#define TC__ENV_PAIR(r, s) {r, s, r "/" s},
    TC__ENV_PAIRS(TC__ENV_PAIR)
#undef TC__ENV_PAIR
};

/* Parses a whole decimal integer in [min, INT_MAX] (surrounding blanks
 * allowed). Returns 0 and sets *out, or -1. */
static int env_parse_int(const char *text, long min, int *out) {
  char *end = NULL;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (end == text || errno == ERANGE) return -1;
  while (*end == ' ' || *end == '\t' || *end == '\n') end++;
  if (*end != '\0' || v < min || v > INT_MAX) return -1;
  *out = (int)v;
  return 0;
}

/* Rank and size from the first pair of variables that is set (see
 * torchcomms.h for the order). A pair with only one variable set, a value
 * that is not a number, a negative rank, a size below 1, or a rank not
 * below the size is TC_ERR_INVALID_ARGUMENT, with a message naming both
 * variables and their values in why (when not NULL). No pair set: rank 0
 * of 1, source "none". `source` may be NULL; on error *rank and *size are
 * left unchanged. Sets no thread error (the logger asks it for its tag). */
int tc__env_rank_size(int *rank, int *size, const char **source, char *why, size_t wl) {
  char dummy[1];
  if (!why) why = dummy, wl = sizeof dummy;
  /* Under an elastic agent (torchrun, tcrun: TORCHELASTIC_RUN_ID is set)
   * RANK/WORLD_SIZE are authoritative even inside an Open MPI, PMI or Slurm
   * allocation, whose variables then describe the agents, not the ranks. */
  static const int plain[] = {0, 1, 2, 3, 4}, agent[] = {0, 4, 1, 2, 3};
  const int *order = tc__env_str("TORCHELASTIC_RUN_ID") ? agent : plain;
  _Static_assert(sizeof env_pairs / sizeof env_pairs[0] == 5,
                 "update the orders above");
  for (size_t k = 0; k < 5; k++) {
    const tc__env_pair_t *p = &env_pairs[order[k]];
    const char *rv = tc__env_str(p->rank_var);
    const char *sv = tc__env_str(p->size_var);
    if (!rv && !sv) continue;
    if (source) *source = p->source;
    if (!rv || !sv) {
      snprintf(why, wl, "%s=%s%s%s but %s=%s%s%s: set both or neither", p->rank_var,
               rv ? "\"" : "", rv ? rv : "(unset)", rv ? "\"" : "", p->size_var,
               sv ? "\"" : "", sv ? sv : "(unset)", sv ? "\"" : "");
      return TC_ERR_INVALID_ARGUMENT;
    }
    int r, s;
    if (env_parse_int(rv, 0, &r) != 0 || env_parse_int(sv, 1, &s) != 0) {
      snprintf(why, wl, "%s=\"%s\" and %s=\"%s\" must be integers, the rank >= 0 and "
               "the size >= 1", p->rank_var, rv, p->size_var, sv);
      return TC_ERR_INVALID_ARGUMENT;
    }
    if (r >= s) {
      snprintf(why, wl, "%s=\"%s\" is out of range for %s=\"%s\" (the rank must be "
               "below the size)", p->rank_var, rv, p->size_var, sv);
      return TC_ERR_INVALID_ARGUMENT;
    }
    *rank = r;
    *size = s;
    return TC_OK;
  }
  *rank = 0;
  *size = 1;
  if (source) *source = "none";
  return TC_OK;
}

int tc_env_rank_size(int *rank, int *size, const char **source) {
  if (!rank || !size)
    return tc__set_error(TC_ERR_INVALID_ARGUMENT,
                         "torchcomms: tc_env_rank_size: 'rank' and 'size' "
                         "must not be NULL");
  char why[512];
  int rc = tc__env_rank_size(rank, size, source, why, sizeof why);
  if (rc != TC_OK)
    return tc__set_error(rc, "torchcomms: tc_env_rank_size: %s", why);
  return TC_OK;
}

/* chaos_stats.c -- tallies and the summary of a chaos run. */
#include "chaos_stats.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void chaos_stats_init(chaos_stats_t *s) { memset(s, 0, sizeof *s); }

void chaos_stats_add(chaos_stats_t *s, int cls, double seconds) {
  if (s->n[cls] == s->cap[cls]) {
    s->cap[cls] = s->cap[cls] ? 2 * s->cap[cls] : 64;
    double *p = realloc(s->t[cls], s->cap[cls] * sizeof *p);
    if (!p) abort();
    s->t[cls] = p;
  }
  s->t[cls][s->n[cls]++] = seconds;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

void chaos_stats_print(const chaos_stats_t *s, int trials, int failed, double wall) {
  static const char *names[CHAOS_CLASSES] = {"SIGKILL", "SIGSTOP", "kill in creation"};
  printf("chaos summary: %d trials, %d failed (%.0f s)\n", trials, failed, wall);
  printf("  survivors erring correctly: %d of %d (named the victim itself: %d)\n",
         s->survivors_erred, s->survivors, s->named_victim);
  for (int c = 0; c < CHAOS_CLASSES; c++) {
    if (!s->n[c]) continue;
    double *v = malloc(s->n[c] * sizeof *v);
    if (!v) abort();
    memcpy(v, s->t[c], s->n[c] * sizeof *v);
    qsort(v, s->n[c], sizeof *v, cmp);
    size_t n = s->n[c];
    double med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    printf("  detection after %-16s: %zu survivors, median %.3f s, max %.3f s\n",
           names[c], n, med, v[n - 1]);
    free(v);
  }
  if (s->create_trials)
    printf("  killed while creation was still going on: %d of %d trials\n",
           s->create_before_ready, s->create_trials);
  printf("  leftovers: %d /dev/shm segments, %d trials with processes left\n",
         s->leftover_shm, s->leftover_procs);
}

void chaos_stats_free(chaos_stats_t *s) {
  for (int c = 0; c < CHAOS_CLASSES; c++) free(s->t[c]);
}

/* chaos_stats.h -- the chaos driver's tallies: survivors, detection times
 * (per class: SIGKILL, SIGSTOP, kill during creation), leftovers. */
#ifndef TC_CHAOS_STATS_H
#define TC_CHAOS_STATS_H

#include <stddef.h>

enum { CHAOS_CLASSES = 3 };

typedef struct {
  double *t[CHAOS_CLASSES]; /* detection times, seconds */
  size_t n[CHAOS_CLASSES], cap[CHAOS_CLASSES];
  int survivors, survivors_erred, named_victim;
  int leftover_shm, leftover_procs;
  int create_trials, create_before_ready; /* --create: killed before all were ready */
} chaos_stats_t;

void chaos_stats_init(chaos_stats_t *s);
void chaos_stats_add(chaos_stats_t *s, int cls, double seconds);
void chaos_stats_print(const chaos_stats_t *s, int trials, int failed, double wall);
void chaos_stats_free(chaos_stats_t *s);

#endif

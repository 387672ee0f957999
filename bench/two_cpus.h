/* two_cpus.h -- the first two CPUs of the process's affinity mask, for the
 * two-thread probes (placement_probe.c, line_owner_probe.c). */
#ifndef TC_BENCH_TWO_CPUS_H
#define TC_BENCH_TWO_CPUS_H

#include <sched.h>

/* Fills cpu[0..1]; returns how many were found (0 on error, 1 when the
 * process may run on one CPU only: cpu[0] is then that one). */
static int first_two_cpus(int cpu[2]) {
  cpu_set_t mask;
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) return 0;
  int k = 0;
  for (int c = 0; c < CPU_SETSIZE && k < 2; c++)
    if (CPU_ISSET(c, &mask)) cpu[k++] = c;
  return k;
}

#endif

/* line_owner_probe.c -- which shared-memory layout moves data fastest
 * between two CPUs of this machine: the measurement behind the cpu
 * backend's rotating slots (src/backends/cpu/shm_algos.c, fp_seg; see
 * docs/benchmarks.md, "Whose lines a rank writes").
 *
 * Two threads, pinned to the first two CPUs of the process's mask, run a
 * 2-rank all_gather of BYTES each, many times: each copies its input into a
 * shared area, raises its flag, waits for the other's, and copies the
 * other's area out (then a second flag, so that nobody rewrites an area
 * still being read). Three layouts:
 *
 *   own     each rank always writes its own area (the peer read it last);
 *   swap    the areas change hands every round: a rank writes the area it
 *           read in the round before (the peer wrote it last);
 *   swap+rb as swap, but each rank also reads its own area back after the
 *           exchange (as a reduction over every rank's area in rank order
 *           would).
 *
 * On the Zen 4 virtual machine this project is measured on, "swap" is
 * 2-2.8x faster than "own" from 4 KiB up, and "swap+rb" loses it all: a line
 * moves to the core that reads it, so writing the lines this core read last
 * is a hit, and writing lines the peer read is a miss per line.
 *
 * Output, one line per layout: "layout BYTES us_per_round".
 * Usage: tcline_owner_probe [BYTES ...]   (default 4096 32768)
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "two_cpus.h"

enum { ROUNDS = 20000, WARM = 1000 };

typedef struct {
  _Alignas(64) _Atomic uint64_t posted;
  _Alignas(64) _Atomic uint64_t done;
} flags_t;

static size_t bytes;
static int layout; /* 0 own, 1 swap, 2 swap + read back */
static char *area[2];
static flags_t flag[2];
static int cpu[2];
static double result_us;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void wait_ge(_Atomic uint64_t *w, uint64_t v) {
  while (atomic_load_explicit(w, memory_order_acquire) < v) {
  }
}

static void *side(void *arg) {
  int me = (int)(intptr_t)arg, peer = 1 - me;
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu[me], &s);
  pthread_setaffinity_np(pthread_self(), sizeof s, &s);
  char *in = aligned_alloc(64, bytes), *out = aligned_alloc(64, 2 * bytes);
  if (!in || !out) abort();
  memset(in, me + 1, bytes);
  memset(out, 0, 2 * bytes);
  double t0 = 0;
  for (uint64_t i = 0; i < ROUNDS + WARM; i++) {
    if (i == WARM) t0 = now_s();
    int w = layout == 0 ? me : (int)((i + (uint64_t)me) & 1); /* the area written */
    memcpy(area[w], in, bytes);
    atomic_store_explicit(&flag[me].posted, i + 1, memory_order_release);
    wait_ge(&flag[peer].posted, i + 1);
    memcpy(out + (size_t)peer * bytes, area[1 - w], bytes);
    if (layout == 2) memcpy(out + (size_t)me * bytes, area[w], bytes);
    atomic_store_explicit(&flag[me].done, i + 1, memory_order_release);
    wait_ge(&flag[peer].done, i + 1);
  }
  if (me == 0) result_us = (now_s() - t0) / ROUNDS * 1e6;
  free(in);
  free(out);
  return NULL;
}

int main(int argc, char **argv) {
  static const char *const names[] = {"own", "swap", "swap+rb"};
  int k = first_two_cpus(cpu);
  if (k == 0) return 1;
  if (k < 2) {
    printf("line_owner: one CPU only: nothing to measure\n");
    return 0;
  }
  size_t sizes[16] = {4096, 32768};
  int nsizes = 2;
  if (argc > 1) {
    nsizes = 0;
    for (int a = 1; a < argc && nsizes < 16; a++) sizes[nsizes++] = strtoull(argv[a], NULL, 0);
  }
  for (int z = 0; z < nsizes; z++) {
    bytes = sizes[z] ? sizes[z] : 64;
    for (layout = 0; layout < 3; layout++) {
      for (int r = 0; r < 2; r++) {
        area[r] = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
        if (!area[r]) return 1;
        memset(area[r], 0, bytes);
        atomic_store(&flag[r].posted, 0);
        atomic_store(&flag[r].done, 0);
      }
      pthread_t t;
      if (pthread_create(&t, NULL, side, (void *)(intptr_t)1) != 0) return 1;
      side((void *)(intptr_t)0);
      pthread_join(t, NULL);
      printf("%-8s %8zu %8.2f\n", names[layout], bytes, result_us);
      free(area[0]);
      free(area[1]);
    }
  }
  return 0;
}
